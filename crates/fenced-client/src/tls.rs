//! TLS for `https://` endpoints (rustls, ring provider), inside the
//! client's own connector so plaintext keeps its one-write path and a
//! failure says it was TLS, and what to check.

use std::{
    io,
    path::{Path, PathBuf},
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use rustls::{
    pki_types::{CertificateDer, PrivateKeyDer, ServerName},
    AlertDescription, CertificateError, ClientConfig, RootCertStore,
};
use rustls_pki_types::pem::PemObject;
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::TcpStream,
};
use tokio_rustls::{client::TlsStream, TlsConnector};

/// Whether `endpoint` (`host:port`, `http://host:port`, `[v6]:port`) names
/// a loopback host: 127.0.0.0/8, ::1 or `localhost`. Names are not looked
/// up: only these spellings count, so a name that merely resolves to
/// loopback is treated as remote.
pub(crate) fn is_loopback(endpoint: &str) -> bool {
    let rest = endpoint.split_once("://").map_or(endpoint, |(_, r)| r);
    let authority = rest.split('/').next().unwrap_or_default();
    if let Ok(ip) = authority.parse::<std::net::IpAddr>() {
        return ip.is_loopback();
    }
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => authority.rsplit_once(':').map_or(authority, |(h, _)| h),
    };
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Why a bearer token must not go to `endpoint` without TLS, if it must
/// not: anyone on the path could read it and act as its identity.
pub(crate) fn plaintext_token_refusal(endpoint: &str) -> Option<String> {
    (!is_loopback(endpoint)).then(|| {
        "refusing to send a bearer token in plaintext to an address that is not \
         loopback: use https:// endpoints with TLS (TlsOptions; fencectl --cacert), \
         or a loopback address (127.0.0.1, ::1, localhost)"
            .to_string()
    })
}

/// What a client trusts and, for mutual TLS, shows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsOptions {
    /// The CA (PEM) that signed the nodes' certificates.
    pub ca: Option<PathBuf>,
    /// This client's certificate (PEM), for a cluster that requires one.
    pub cert: Option<PathBuf>,
    /// Its private key (PEM).
    pub key: Option<PathBuf>,
}

impl TlsOptions {
    pub fn new() -> Self {
        Self::default()
    }

    /// Trust the nodes whose certificates `ca` signed.
    pub fn ca(self, ca: impl Into<PathBuf>) -> Self {
        Self {
            ca: Some(ca.into()),
            ..self
        }
    }

    /// Show this certificate and key to the nodes.
    pub fn identity(self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        Self {
            cert: Some(cert.into()),
            key: Some(key.into()),
            ..self
        }
    }

    /// The rustls connector these options describe.
    pub(crate) fn connector(&self) -> Result<TlsConnector, String> {
        let ca = self.ca.as_ref().ok_or(
            "https:// endpoints need the CA that signed the nodes' certificates (--cacert)",
        )?;
        let mut roots = RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(ca).map_err(|e| file_error("CA", ca, &e))? {
            let cert = cert.map_err(|e| file_error("CA", ca, &e))?;
            roots.add(cert).map_err(|e| file_error("CA", ca, &e))?;
        }
        if roots.is_empty() {
            return Err(format!("CA {}: no certificate in it", ca.display()));
        }
        let builder =
            ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .map_err(|e| e.to_string())?
                .with_root_certificates(roots);
        let mut config = match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => {
                let chain = CertificateDer::pem_file_iter(cert)
                    .and_then(|i| i.collect::<Result<Vec<_>, _>>())
                    .map_err(|e| file_error("certificate", cert, &e))?;
                let key_der =
                    PrivateKeyDer::from_pem_file(key).map_err(|e| file_error("key", key, &e))?;
                builder
                    .with_client_auth_cert(chain, key_der)
                    .map_err(|e| format!("certificate {} and key: {e}", cert.display()))?
            }
            (None, None) => builder.with_no_client_auth(),
            _ => return Err(
                "a client certificate needs its key, and a key its certificate (--cert and --key)"
                    .into(),
            ),
        };
        // gRPC runs on HTTP/2; the node's TLS requires it by ALPN.
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(TlsConnector::from(Arc::new(config)))
    }
}

fn file_error(what: &str, path: &Path, e: &dyn std::fmt::Display) -> String {
    format!("{what} {}: {e}", path.display())
}

/// What to check after a TLS failure.
fn hint(e: &rustls::Error) -> &'static str {
    use rustls::Error as E;
    match e {
        // A bad signature on a chain that otherwise leads to a trusted CA:
        // another CA of the same name signed it.
        E::InvalidCertificate(CertificateError::UnknownIssuer | CertificateError::BadSignature) => {
            "certificate signed by an unknown authority; check --cacert"
        }
        E::InvalidCertificate(
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
        ) => "the node's certificate does not name this host; connect by a name it carries",
        E::InvalidCertificate(
            CertificateError::Expired
            | CertificateError::ExpiredContext { .. }
            | CertificateError::NotValidYet
            | CertificateError::NotValidYetContext { .. },
        ) => "a certificate is outside its validity; check the clocks and renew it",
        E::AlertReceived(
            AlertDescription::CertificateRequired
            | AlertDescription::BadCertificate
            | AlertDescription::UnknownCA
            | AlertDescription::CertificateUnknown
            | AlertDescription::AccessDenied
            | AlertDescription::DecryptError,
        ) => "the node refused this client's certificate (or its absence); check --cert and --key",
        // The first bytes back were not TLS at all.
        E::InvalidMessage(_) => "the node does not speak TLS on this port; is TLS on there?",
        _ => "check --cacert, --cert and --key",
    }
}

/// Rewords an error from a TLS stream to say it was TLS; other errors pass.
fn tls_error(addr: &str, during: &str, e: io::Error) -> io::Error {
    let text = match e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
        Some(r) => format!("TLS {during} with {addr} failed: {r}; {}", hint(r)),
        None => return e,
    };
    io::Error::new(io::ErrorKind::PermissionDenied, text)
}

/// The TLS handshake over `tcp` to `host` (`addr` names it in errors).
pub(crate) async fn handshake(
    connector: &TlsConnector,
    host: &str,
    addr: String,
    tcp: TcpStream,
) -> io::Result<ClientStream> {
    let name = ServerName::try_from(host.to_string()).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{host}: not a TLS server name: {e}"),
        )
    })?;
    let tls = connector
        .connect(name, tcp)
        .await
        .map_err(|e| tls_error(&addr, "handshake", e))?;
    Ok(ClientStream::Tls(Box::new(tls), addr))
}

/// A connection to a node, plain or TLS.
pub(crate) enum ClientStream {
    /// With the address until the first bytes from the node were checked
    /// for TLS (see [`answered_in_tls`]).
    Plain(TcpStream, Option<String>),
    /// With the address, for errors.
    Tls(Box<TlsStream<TcpStream>>, String),
}

impl AsyncRead for ClientStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ClientStream::Plain(s, unchecked) => {
                let start = buf.filled().len();
                let read = Pin::new(s).poll_read(cx, buf);
                if let (Poll::Ready(Ok(())), Some(addr)) = (&read, unchecked.as_ref()) {
                    let first = &buf.filled()[start..];
                    if !first.is_empty() {
                        if answered_in_tls(first) {
                            return Poll::Ready(Err(io::Error::new(
                                io::ErrorKind::PermissionDenied,
                                format!(
                                    "TLS needed: the node at {addr} answered in TLS; pass \
                                     --cacert (FENCED_CACERT) with the CA that signed its \
                                     certificate"
                                ),
                            )));
                        }
                        *unchecked = None;
                    }
                }
                read
            }
            // In TLS 1.3 the node refuses a client certificate after the
            // client's side of the handshake is done: the first read says so.
            ClientStream::Tls(s, addr) => Pin::new(&mut **s)
                .poll_read(cx, buf)
                .map_err(|e| tls_error(addr, "session", e)),
        }
    }
}

impl AsyncWrite for ClientStream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, b: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            ClientStream::Plain(s, _) => Pin::new(s).poll_write(cx, b),
            ClientStream::Tls(s, _) => Pin::new(&mut **s).poll_write(cx, b),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ClientStream::Plain(s, _) => Pin::new(s).poll_flush(cx),
            ClientStream::Tls(s, _) => Pin::new(&mut **s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ClientStream::Plain(s, _) => Pin::new(s).poll_shutdown(cx),
            ClientStream::Tls(s, _) => Pin::new(&mut **s).poll_shutdown(cx),
        }
    }
}

/// Whether the first bytes a node sent on a plaintext connection are a TLS
/// record (an alert or a handshake, version 3.x): the node serves TLS. An
/// HTTP/2 server starts with a SETTINGS frame, whose length's first byte is
/// 0 for any frame a server sends first.
pub(crate) fn answered_in_tls(first: &[u8]) -> bool {
    matches!(first, [0x15 | 0x16] | [0x15 | 0x16, 0x03, ..])
}

/// The TLS part of a failed call's causes, if TLS is what failed.
pub(crate) fn failure(status: &tonic::Status) -> Option<String> {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(status);
    while let Some(c) = cause {
        let text = c.to_string();
        if text.starts_with("TLS ") {
            return Some(text);
        }
        cause = c.source();
    }
    None
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn a_tls_record_is_told_from_an_http2_preface() {
        // A TLS alert (decode_error) and a ServerHello.
        assert!(answered_in_tls(&[0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x32]));
        assert!(answered_in_tls(&[0x16, 0x03, 0x01, 0x00, 0x40]));
        assert!(answered_in_tls(&[0x15]));
        // An HTTP/2 SETTINGS frame, and HTTP/1.
        assert!(!answered_in_tls(&[0x00, 0x00, 0x12, 0x04, 0x00]));
        assert!(!answered_in_tls(b"HTTP/1.1 400 Bad Request"));
        assert!(!answered_in_tls(&[0x15, 0x00]));
    }

    #[test]
    fn options_without_a_usable_ca_are_refused_by_name() {
        let none = TlsOptions::new().connector().err().unwrap();
        assert!(none.contains("--cacert"), "{none}");
        let dir = std::env::temp_dir();
        let missing = TlsOptions::new().ca(dir.join("missing-ca.pem"));
        let err = missing.connector().err().unwrap();
        assert!(err.contains("missing-ca.pem"), "{err}");
    }

    #[tokio::test]
    async fn a_plaintext_answer_is_named_as_such() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 512];
            let _ = s.read(&mut buf).await;
            let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").await;
        });
        let config =
            ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(RootCertStore::empty())
                .with_no_client_auth();
        let tcp = TcpStream::connect(addr).await.unwrap();
        let err = handshake(
            &TlsConnector::from(Arc::new(config)),
            "127.0.0.1",
            addr.to_string(),
            tcp,
        )
        .await
        .err()
        .unwrap()
        .to_string();
        assert!(
            err.starts_with(&format!("TLS handshake with {addr} failed"))
                && err.contains("does not speak TLS"),
            "{err}"
        );
    }
}
