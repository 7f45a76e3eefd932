//! `fenced certs`: a CA, node and client certificates for tests and small
//! deployments. Keys are ECDSA P-256; files are written 0600, the
//! directory 0700. Names follow [`crate::security::tls`]: `fenced://node/<id>` and
//! `fenced://client/<name>` as SAN URIs.

use std::{
    fs,
    io::Write,
    net::IpAddr,
    os::unix::fs::{DirBuilderExt, OpenOptionsExt},
    path::{Path, PathBuf},
};

use clap::Subcommand;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use time::{Duration, OffsetDateTime};

use crate::security::tls::{CLIENT_URI, NODE_URI, SERVER_URI};

/// The CA's file names in the directory.
pub const CA_CERT: &str = "ca.pem";
pub const CA_KEY: &str = "ca-key.pem";

#[derive(Debug, Subcommand)]
pub enum CertsCommand {
    /// Make a CA: DIR/ca.pem and DIR/ca-key.pem (ECDSA P-256, valid 10
    /// years). Refuses to overwrite an existing CA.
    #[command(after_help = "Examples:
  fenced certs ca --dir ./pki")]
    Ca {
        #[arg(long)]
        dir: PathBuf,
    },
    /// Make node ID's certificate, signed by DIR's CA: DIR/node-ID.pem and
    /// DIR/node-ID-key.pem (ECDSA P-256, valid --days). It names
    /// fenced://node/ID and every --host (DNS name or IP address) the node
    /// is reached by; it serves both ports and connects to peers.
    #[command(after_help = "Examples:
  fenced certs node --dir ./pki --id 1
  fenced certs node --dir ./pki --id 2 --host node2.internal --host 10.0.0.2 --days 90")]
    Node {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long)]
        id: u64,
        /// A DNS name or IP address of the node (repeat); 127.0.0.1 and
        /// localhost when none is given.
        #[arg(long = "host")]
        hosts: Vec<String>,
        #[arg(long, default_value_t = 365)]
        days: i64,
    },
    /// Make service NAME's server certificate (e.g. for fenced-resource),
    /// signed by DIR's CA: DIR/server-NAME.pem and DIR/server-NAME-key.pem
    /// (ECDSA P-256, valid --days), naming fenced://server/NAME and every
    /// --host. It serves TLS only: a node's peer port refuses it.
    #[command(after_help = "Examples:
  fenced certs server --dir ./pki --name resource --host resource.internal")]
    Server {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long)]
        name: String,
        /// A DNS name or IP address of the service (repeat); 127.0.0.1 and
        /// localhost when none is given.
        #[arg(long = "host")]
        hosts: Vec<String>,
        #[arg(long, default_value_t = 365)]
        days: i64,
    },
    /// Make client NAME's certificate, signed by DIR's CA: DIR/client-NAME.pem
    /// and DIR/client-NAME-key.pem (ECDSA P-256, valid --days), naming
    /// fenced://client/NAME. It is refused on the peer port.
    #[command(after_help = "Examples:
  fenced certs client --dir ./pki --name billing")]
    Client {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long)]
        name: String,
        #[arg(long, default_value_t = 365)]
        days: i64,
    },
}

/// Runs a `fenced certs` command; returns the files written.
pub fn run(cmd: &CertsCommand) -> Result<Vec<PathBuf>, String> {
    match cmd {
        CertsCommand::Ca { dir } => make_ca(dir),
        CertsCommand::Node {
            dir,
            id,
            hosts,
            days,
        } => {
            if *id == 0 {
                return Err("--id: must be at least 1".into());
            }
            let mut sans = vec![uri(&format!("{NODE_URI}{id}"))?];
            sans.extend(host_names(hosts)?);
            let eku = vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ];
            let cn = format!("fenced node {id}");
            make_leaf(dir, &format!("node-{id}"), &cn, sans, eku, *days)
        }
        CertsCommand::Server {
            dir,
            name,
            hosts,
            days,
        } => {
            check_name(name)?;
            let mut sans = vec![uri(&format!("{SERVER_URI}{name}"))?];
            sans.extend(host_names(hosts)?);
            let eku = vec![ExtendedKeyUsagePurpose::ServerAuth];
            make_leaf(dir, &format!("server-{name}"), name, sans, eku, *days)
        }
        CertsCommand::Client { dir, name, days } => {
            check_name(name)?;
            let sans = vec![uri(&format!("{CLIENT_URI}{name}"))?];
            let eku = vec![ExtendedKeyUsagePurpose::ClientAuth];
            make_leaf(dir, &format!("client-{name}"), name, sans, eku, *days)
        }
    }
}

fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    {
        return Err(format!(
            "--name {name:?}: letters, digits, '-', '_' and '.' only"
        ));
    }
    Ok(())
}

/// The SANs for `hosts`: IP addresses and DNS names; loopback when empty.
fn host_names(hosts: &[String]) -> Result<Vec<SanType>, String> {
    let defaults = ["127.0.0.1".to_string(), "localhost".to_string()];
    let hosts = if hosts.is_empty() {
        &defaults[..]
    } else {
        hosts
    };
    hosts
        .iter()
        .map(|h| match h.parse::<IpAddr>() {
            Ok(ip) => Ok(SanType::IpAddress(ip)),
            Err(_) => Ok(SanType::DnsName(
                h.clone()
                    .try_into()
                    .map_err(|e| format!("--host {h}: {e}"))?,
            )),
        })
        .collect()
}

fn uri(u: &str) -> Result<SanType, String> {
    Ok(SanType::URI(
        u.to_string().try_into().map_err(|e| format!("{u}: {e}"))?,
    ))
}

fn make_ca(dir: &Path) -> Result<Vec<PathBuf>, String> {
    make_dir(dir)?;
    if dir.join(CA_KEY).exists() {
        return Err(format!(
            "{} exists: refusing to replace a CA (every certificate it signed would stop working)",
            dir.join(CA_KEY).display()
        ));
    }
    let key = KeyPair::generate().map_err(|e| format!("CA key: {e}"))?;
    let mut params = CertificateParams::default();
    // Two CAs of one name are told apart only by a failed signature:
    // each gets a name of its own.
    let serial = OffsetDateTime::now_utc().unix_timestamp_nanos();
    params.distinguished_name = dn(&format!("fenced CA {:x}", serial as u64));
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    validity(&mut params, 3650);
    let cert = params.self_signed(&key).map_err(|e| format!("CA: {e}"))?;
    write(dir, CA_KEY, &key.serialize_pem())?;
    write(dir, CA_CERT, &cert.pem())?;
    Ok(vec![dir.join(CA_CERT), dir.join(CA_KEY)])
}

fn make_leaf(
    dir: &Path,
    file: &str,
    common_name: &str,
    sans: Vec<SanType>,
    eku: Vec<ExtendedKeyUsagePurpose>,
    days: i64,
) -> Result<Vec<PathBuf>, String> {
    if !(1..=3650).contains(&days) {
        return Err(format!("--days: must be between 1 and 3650, got {days}"));
    }
    let read = |name: &str| {
        fs::read_to_string(dir.join(name)).map_err(|e| {
            format!(
                "{}: {e} (make a CA first: fenced certs ca --dir {})",
                dir.join(name).display(),
                dir.display()
            )
        })
    };
    let ca_key = KeyPair::from_pem(&read(CA_KEY)?).map_err(|e| format!("{CA_KEY}: {e}"))?;
    let issuer =
        Issuer::from_ca_cert_pem(&read(CA_CERT)?, ca_key).map_err(|e| format!("{CA_CERT}: {e}"))?;
    let key = KeyPair::generate().map_err(|e| format!("key: {e}"))?;
    let mut params = CertificateParams::default();
    params.distinguished_name = dn(common_name);
    params.subject_alt_names = sans;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = eku;
    params.use_authority_key_identifier_extension = true;
    validity(&mut params, days);
    let cert = params
        .signed_by(&key, &issuer)
        .map_err(|e| format!("{file}: {e}"))?;
    let (cert_file, key_file) = (format!("{file}.pem"), format!("{file}-key.pem"));
    make_dir(dir)?;
    write(dir, &key_file, &key.serialize_pem())?;
    write(dir, &cert_file, &cert.pem())?;
    Ok(vec![dir.join(cert_file), dir.join(key_file)])
}

fn dn(common_name: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    dn
}

fn validity(params: &mut CertificateParams, days: i64) {
    // A little slack for clocks behind this one.
    let now = OffsetDateTime::now_utc();
    params.not_before = now - Duration::hours(1);
    params.not_after = now + Duration::days(days);
}

/// Creates the directory (0700) if it is missing. Unlike a data
/// directory's (`data_format::private_dir`), an existing one keeps its
/// mode: `--dir` may name a directory the operator uses for other things.
fn make_dir(dir: &Path) -> Result<(), String> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))
}

/// Writes a file readable by its owner only (keys and certificates alike).
fn write(dir: &Path, name: &str, text: &str) -> Result<(), String> {
    let path = dir.join(name);
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    f.write_all(text.as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(|e| format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::os::unix::fs::PermissionsExt;

    use super::*;
    use crate::security::tls::{node_id_of, san_uris};

    fn mode(p: &Path) -> u32 {
        fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    fn der(path: &Path) -> Vec<u8> {
        use rustls_pki_types::{pem::PemObject, CertificateDer};
        CertificateDer::from_pem_file(path).unwrap().to_vec()
    }

    #[test]
    fn certificates_carry_their_names_and_private_modes() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("pki");
        run(&CertsCommand::Ca { dir: dir.clone() }).unwrap();
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&dir.join(CA_KEY)), 0o600);
        let node = run(&CertsCommand::Node {
            dir: dir.clone(),
            id: 3,
            hosts: vec!["127.0.0.1".into(), "node3".into()],
            days: 30,
        })
        .unwrap();
        assert_eq!(mode(&node[1]), 0o600);
        assert_eq!(node_id_of(&der(&node[0])), Some(3));
        let client = run(&CertsCommand::Client {
            dir: dir.clone(),
            name: "alice".into(),
            days: 30,
        })
        .unwrap();
        let c = der(&client[0]);
        assert_eq!(node_id_of(&c), None);
        assert_eq!(san_uris(&c), vec!["fenced://client/alice".to_string()]);
        // A second CA would orphan every certificate of the first.
        let again = run(&CertsCommand::Ca { dir }).unwrap_err();
        assert!(again.contains("refusing to replace"), "{again}");
    }
}
