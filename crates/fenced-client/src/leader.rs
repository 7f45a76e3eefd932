//! Following the leader: every fenced node names, on every answer, the node
//! that answered (`x-fenced-node: <id>`) and the leader it knows
//! (`x-fenced-leader: <id>,<client address>`). The client sends its next
//! call to the endpoint that is the leader, so a follower does not forward
//! every call, and keeps doing so across leader changes.
//!
//! Only endpoints the client was configured with are ever used: a hint is
//! matched to one of them (by the node id learned from its answers, else by
//! its address), never dialled as a new address, so TLS verifies the names
//! the caller chose and a hint cannot send calls anywhere else. An endpoint
//! that just failed is not followed for a while, so a stale hint to a dead
//! leader does not pull every call back to it.

use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, Instant},
};

use tonic::{metadata::MetadataMap, transport::Channel};

/// The leader as the answering node knows it.
pub(crate) const LEADER_HEADER: &str = "x-fenced-leader";
/// The id of the node that answered.
pub(crate) const NODE_HEADER: &str = "x-fenced-node";

/// How long an endpoint that failed is not followed on a hint. About an
/// election: by then the hints name the new leader, or the old one again.
pub(crate) const FAILED_HOLD_OFF: Duration = Duration::from_secs(2);

/// Longest address accepted in a hint (a DNS name and a port).
const MAX_HINT_ADDR: usize = 260;

/// A parsed `x-fenced-leader` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LeaderHint {
    pub(crate) id: u64,
    /// `host:port`, lowercase, as [`endpoint_key`] makes it.
    pub(crate) addr: String,
}

/// Parses `<id>,<host:port>`; anything else (a missing or zero id, an
/// empty, overlong or spaced address) is no hint at all.
pub(crate) fn parse_hint(value: &str) -> Option<LeaderHint> {
    let (id, addr) = value.split_once(',')?;
    let id: u64 = id.trim().parse().ok()?;
    let addr = addr.trim();
    if id == 0
        || addr.is_empty()
        || addr.len() > MAX_HINT_ADDR
        || addr.contains(|c: char| c.is_whitespace() || c.is_control() || c == ',')
    {
        return None;
    }
    Some(LeaderHint {
        id,
        addr: endpoint_key(addr),
    })
}

/// An endpoint as `host:port` in lowercase, without scheme or trailing
/// slash, for comparing a configured endpoint with a hint's address.
pub(crate) fn endpoint_key(endpoint: &str) -> String {
    let e = endpoint.trim();
    let e = e.split_once("://").map_or(e, |(_, rest)| rest);
    e.trim_end_matches('/').to_ascii_lowercase()
}

/// The node id an answer came from, if it said.
pub(crate) fn answering_node(md: &MetadataMap) -> Option<u64> {
    md.get(NODE_HEADER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
        .filter(|id| *id != 0)
}

/// What the switching rule knows of one configured endpoint.
#[derive(Debug, Clone, Copy)]
pub(crate) struct EndpointView<'a> {
    pub(crate) key: &'a str,
    /// The node that last answered on it, if any did.
    pub(crate) node: Option<u64>,
    /// It failed within [`FAILED_HOLD_OFF`].
    pub(crate) recently_failed: bool,
}

/// The configured endpoint a hint points to: the one known to be the
/// hinted node, else one at the hinted address that is not known to be
/// another node. `None` (stay on the list) for an address the client was
/// not given or an endpoint that just failed.
pub(crate) fn hinted_endpoint(endpoints: &[EndpointView<'_>], hint: &LeaderHint) -> Option<usize> {
    let by_id = endpoints.iter().position(|e| e.node == Some(hint.id));
    let by_addr = || {
        endpoints
            .iter()
            .position(|e| e.key == hint.addr && e.node.is_none_or(|n| n == hint.id))
    };
    let i = by_id.or_else(by_addr)?;
    (!endpoints[i].recently_failed).then_some(i)
}

/// One configured endpoint and what its answers taught.
pub(crate) struct Endpoint {
    /// As configured.
    pub(crate) name: String,
    key: String,
    pub(crate) channel: Channel,
    /// The node id that last answered here; 0 for none yet.
    node: AtomicU64,
    /// When it last failed, in ms since the client's start plus one; 0 for
    /// never.
    failed_at: AtomicU64,
}

impl Endpoint {
    pub(crate) fn new(name: String, channel: Channel) -> Self {
        Self {
            key: endpoint_key(&name),
            name,
            channel,
            node: AtomicU64::new(0),
            failed_at: AtomicU64::new(0),
        }
    }
}

/// The configured endpoints and the leader-following state they share.
pub(crate) struct Endpoints {
    list: Vec<Endpoint>,
    start: Instant,
}

impl Endpoints {
    pub(crate) fn new(list: Vec<Endpoint>) -> Self {
        Self {
            list,
            start: Instant::now(),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.list.len()
    }

    pub(crate) fn get(&self, i: usize) -> &Endpoint {
        &self.list[i % self.list.len()]
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &Endpoint> {
        self.list.iter()
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Records that endpoint `i` failed to answer.
    pub(crate) fn failed(&self, i: usize) {
        self.get(i)
            .failed_at
            .store(self.now_ms().saturating_add(1), Ordering::Relaxed);
    }

    /// Learns from an answer on endpoint `i` which node it is, and returns
    /// the endpoint its leader hint points to, if the rule accepts one.
    pub(crate) fn learn(&self, i: usize, md: &MetadataMap) -> Option<usize> {
        let node = answering_node(md);
        if let Some(node) = node {
            self.get(i).node.store(node, Ordering::Relaxed);
        }
        let hint = parse_hint(md.get(LEADER_HEADER)?.to_str().ok()?)?;
        if node == Some(hint.id) {
            // The leader answered: the common case, nothing to look up.
            return Some(i % self.list.len());
        }
        let now = self.now_ms();
        let hold_off = u64::try_from(FAILED_HOLD_OFF.as_millis()).unwrap_or(u64::MAX);
        let views: Vec<EndpointView<'_>> = self
            .list
            .iter()
            .map(|e| {
                let failed_at = e.failed_at.load(Ordering::Relaxed);
                EndpointView {
                    key: &e.key,
                    node: Some(e.node.load(Ordering::Relaxed)).filter(|n| *n != 0),
                    recently_failed: failed_at != 0 && now < failed_at.saturating_add(hold_off),
                }
            })
            .collect();
        let chosen = hinted_endpoint(&views, &hint);
        if chosen.is_none() {
            tracing::trace!(leader = hint.id, addr = %hint.addr, "leader hint not followed");
        }
        chosen
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hint(id: u64, addr: &str) -> LeaderHint {
        LeaderHint {
            id,
            addr: addr.into(),
        }
    }

    #[test]
    fn hints_parse_as_id_comma_address() {
        assert_eq!(
            parse_hint("2,127.0.0.1:7102"),
            Some(hint(2, "127.0.0.1:7102"))
        );
        assert_eq!(
            parse_hint(" 3 , Node-3.Example:7101 "),
            Some(hint(3, "node-3.example:7101"))
        );
        assert_eq!(parse_hint("4,[::1]:7101"), Some(hint(4, "[::1]:7101")));
        for bad in [
            "",
            "127.0.0.1:7102",
            "0,127.0.0.1:7102",
            "x,127.0.0.1:7102",
            "-1,127.0.0.1:7102",
            "2,",
            "2, ",
            "2,a b:1",
            "2,a:1,b:2",
            "18446744073709551616,a:1",
        ] {
            assert_eq!(parse_hint(bad), None, "{bad:?}");
        }
        let long = format!("2,{}:7101", "a".repeat(MAX_HINT_ADDR));
        assert_eq!(parse_hint(&long), None, "overlong address");
    }

    #[test]
    fn endpoint_keys_drop_scheme_case_and_slash() {
        assert_eq!(endpoint_key("http://127.0.0.1:7101/"), "127.0.0.1:7101");
        assert_eq!(
            endpoint_key("https://Node1.Example:7101"),
            "node1.example:7101"
        );
        assert_eq!(endpoint_key(" 127.0.0.1:7101 "), "127.0.0.1:7101");
    }

    fn view(key: &str, node: Option<u64>, recently_failed: bool) -> EndpointView<'_> {
        EndpointView {
            key,
            node,
            recently_failed,
        }
    }

    #[test]
    fn a_hint_to_a_configured_address_is_followed() {
        let list = [
            view("127.0.0.1:7102", None, false),
            view("127.0.0.1:7101", None, false),
        ];
        assert_eq!(hinted_endpoint(&list, &hint(1, "127.0.0.1:7101")), Some(1));
    }

    #[test]
    fn a_hint_naming_an_unknown_address_is_ignored() {
        let list = [
            view("127.0.0.1:7102", None, false),
            view("127.0.0.1:7101", None, false),
        ];
        assert_eq!(hint_of(&list, 3, "10.9.9.9:7101"), None);
        // Not even when the port matches.
        assert_eq!(hint_of(&list, 3, "127.0.0.1:7999"), None);
    }

    fn hint_of(list: &[EndpointView<'_>], id: u64, addr: &str) -> Option<usize> {
        hinted_endpoint(list, &hint(id, addr))
    }

    #[test]
    fn a_learned_node_id_beats_the_address() {
        // Configured by name, advertised by IP: the id learned from an
        // answer on the named endpoint matches it.
        let list = [
            view("node2.example:7101", Some(2), false),
            view("node1.example:7101", Some(1), false),
        ];
        assert_eq!(hint_of(&list, 1, "10.0.0.1:7101"), Some(1));
        // An address whose endpoint is known to be another node is not it.
        let list = [
            view("127.0.0.1:7101", Some(5), false),
            view("127.0.0.1:7102", None, false),
        ];
        assert_eq!(hint_of(&list, 1, "127.0.0.1:7101"), None);
    }

    #[test]
    fn an_endpoint_that_just_failed_is_not_followed() {
        let list = [
            view("127.0.0.1:7101", Some(1), true),
            view("127.0.0.1:7102", Some(2), false),
        ];
        assert_eq!(hint_of(&list, 1, "127.0.0.1:7101"), None);
        assert_eq!(hint_of(&list, 2, "127.0.0.1:7102"), Some(1));
    }

    #[test]
    fn the_answering_node_is_read_from_its_header() {
        let mut md = MetadataMap::new();
        assert_eq!(answering_node(&md), None);
        md.insert(NODE_HEADER, tonic::metadata::MetadataValue::from(3u64));
        assert_eq!(answering_node(&md), Some(3));
        md.insert(NODE_HEADER, tonic::metadata::MetadataValue::from(0u64));
        assert_eq!(answering_node(&md), None, "0 is no node");
    }
}
