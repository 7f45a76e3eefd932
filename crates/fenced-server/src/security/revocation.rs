//! Certificates the operator revoked before they expire (docs/DECISIONS.md,
//! "Certificates are revoked by a deny list"): a TOML file of serial
//! numbers, node ids and client names (`--tls-deny`), checked at every TLS
//! handshake on every port, at every Raft frame and every call of an open
//! connection, and reread on SIGHUP.
//!
//! ```toml
//! serials = ["3f:a1:07"]   # hex, colons and case free
//! nodes = [2]              # fenced://node/<id>
//! clients = ["mallory"]    # fenced://client/<name>, else the common name
//! ```

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    sync::{Arc, PoisonError, RwLock},
};

use serde::Deserialize;

use crate::types::NodeId;

/// At most this many entries in all; a longer file is refused.
pub const MAX_ENTRIES: usize = 100_000;

/// What the file lists, as parsed.
#[derive(Debug, Default, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DenyList {
    /// Serial numbers as lowercase hex without separators or leading zeros.
    #[serde(default)]
    serials: BTreeSet<String>,
    #[serde(default)]
    nodes: BTreeSet<NodeId>,
    #[serde(default)]
    clients: BTreeSet<String>,
}

/// A serial number as compared: lowercase hex digits, no separators, no
/// leading zeros (DER may pad a serial with a zero byte).
fn normal_serial(text: &str) -> Option<String> {
    let digits: String = text
        .chars()
        .filter(|c| *c != ':' && !c.is_whitespace())
        .map(|c| c.to_ascii_lowercase())
        .collect();
    if digits.is_empty() || digits.len() > 64 || !digits.chars().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    let trimmed = digits.trim_start_matches('0');
    Some(if trimmed.is_empty() { "0" } else { trimmed }.to_string())
}

impl DenyList {
    /// Parses a deny file; the error names the field at fault.
    pub fn parse(origin: &str, text: &str) -> Result<DenyList, String> {
        let mut list: DenyList =
            toml::from_str(text).map_err(|e| format!("tls_deny {origin}: {e}"))?;
        let total = list.serials.len() + list.nodes.len() + list.clients.len();
        if total > MAX_ENTRIES {
            return Err(format!(
                "tls_deny {origin}: {total} entries, at most {MAX_ENTRIES}"
            ));
        }
        let mut serials = BTreeSet::new();
        for s in &list.serials {
            serials.insert(normal_serial(s).ok_or_else(|| {
                format!("tls_deny {origin}: serials: {s:?} is not a hex serial number (at most 32 bytes)")
            })?);
        }
        list.serials = serials;
        Ok(list)
    }

    pub fn is_empty(&self) -> bool {
        self.serials.is_empty() && self.nodes.is_empty() && self.clients.is_empty()
    }

    /// Why a certificate is revoked, if it is, from what it carries: its
    /// serial (hex), the node and the client it names
    /// ([`crate::security::tls::revoked`] reads them from the certificate).
    pub fn denies(
        &self,
        serial_hex: Option<&str>,
        node: Option<NodeId>,
        client: Option<&str>,
    ) -> Option<String> {
        if let Some(serial) = serial_hex
            .and_then(normal_serial)
            .filter(|s| self.serials.contains(s))
        {
            return Some(format!("serial {serial} is revoked"));
        }
        if let Some(node) = node.filter(|n| self.nodes.contains(n)) {
            return Some(format!("node {node}'s certificates are revoked"));
        }
        client
            .filter(|name| self.clients.contains(*name))
            .map(|name| format!("client {name:?}'s certificates are revoked"))
    }

    pub fn denies_node(&self, id: NodeId) -> bool {
        self.nodes.contains(&id)
    }
}

/// The deny list in force, swapped whole on reload.
#[derive(Debug, Default)]
pub struct Revocations {
    path: Option<PathBuf>,
    list: RwLock<Arc<DenyList>>,
}

impl Revocations {
    /// Reads `path` (none: nothing is revoked).
    pub fn load(path: Option<&Path>) -> Result<Revocations, String> {
        let list = match path {
            Some(p) => read(p)?,
            None => DenyList::default(),
        };
        Ok(Revocations {
            path: path.map(Path::to_path_buf),
            list: RwLock::new(Arc::new(list)),
        })
    }

    /// Whether a deny file is set.
    pub fn enabled(&self) -> bool {
        self.path.is_some()
    }

    /// Rereads the file; on an error the list in force stays.
    pub fn reload(&self) -> Result<(), String> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        let list = read(path)?;
        *self.list.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(list);
        Ok(())
    }

    pub fn current(&self) -> Arc<DenyList> {
        Arc::clone(&self.list.read().unwrap_or_else(PoisonError::into_inner))
    }
}

fn read(path: &Path) -> Result<DenyList, String> {
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("tls_deny {}: {e}", path.display()))?;
    DenyList::parse(&path.display().to_string(), &text)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn serials_compare_without_separators_case_or_leading_zeros() {
        assert_eq!(normal_serial("00:3F:a1").as_deref(), Some("3fa1"));
        assert_eq!(normal_serial("3fa1").as_deref(), Some("3fa1"));
        assert_eq!(normal_serial("00").as_deref(), Some("0"));
        assert_eq!(normal_serial("xyz"), None);
        assert_eq!(normal_serial(""), None);
        assert_eq!(normal_serial(&"f".repeat(65)), None);
    }

    #[test]
    fn a_bad_file_names_the_field() {
        let err = DenyList::parse("f", "serials = [\"zz\"]").unwrap_err();
        assert!(err.contains("serials") && err.contains("\"zz\""), "{err}");
        let err = DenyList::parse("f", "node = [2]").unwrap_err();
        assert!(err.contains("unknown field"), "{err}");
        let err = DenyList::parse("f", "nodes = [-1]").unwrap_err();
        assert!(err.contains("nodes"), "{err}");
    }

    #[test]
    fn a_listed_serial_node_or_client_is_denied_and_nothing_else() {
        let list = DenyList::parse(
            "f",
            "serials = [\"00:3F:A1\"]\nnodes = [2]\nclients = [\"mallory\"]\n",
        )
        .unwrap();
        assert!(list
            .denies(Some("3fa1"), Some(3), None)
            .unwrap()
            .contains("serial 3fa1"));
        assert!(list
            .denies(Some("77"), Some(2), None)
            .unwrap()
            .contains("node 2"));
        assert!(list
            .denies(Some("77"), None, Some("mallory"))
            .unwrap()
            .contains("mallory"));
        assert_eq!(list.denies(Some("77"), Some(3), Some("alice")), None);
        assert_eq!(
            DenyList::default().denies(Some("3fa1"), Some(2), Some("mallory")),
            None
        );
        assert!(list.denies_node(2) && !list.denies_node(3));
        assert!(!list.is_empty() && DenyList::default().is_empty());
    }

    #[test]
    fn a_bad_file_on_reload_keeps_the_list_in_force() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("deny.toml");
        std::fs::write(&path, "nodes = [4]").unwrap();
        let r = Revocations::load(Some(&path)).unwrap();
        assert!(r.current().denies_node(4));
        std::fs::write(&path, "nodes = [\"four\"]").unwrap();
        assert!(r.reload().is_err());
        assert!(r.current().denies_node(4), "the old list stays");
        std::fs::write(&path, "nodes = [5]").unwrap();
        r.reload().unwrap();
        assert!(!r.current().denies_node(4) && r.current().denies_node(5));
    }
}
