//! The one upstream the gateway owns access to: what of a caller's request
//! goes to it, and the client that sends it.

use std::{path::Path, sync::Arc, time::Duration};

use bytes::Bytes;
use http::{header, HeaderMap, HeaderName, HeaderValue, Method, Request, Uri};
use http_body_util::Full;
use hyper_util::client::legacy::{connect::HttpConnector, Client};

use crate::key::IDEMPOTENCY_HEADER;

/// Headers never passed on: hop-by-hop ones, the caller's credentials (the
/// gateway, not the caller, is the upstream's client), the owner id, and a
/// caller's own idempotency key (the gateway's derived one replaces it).
const DROPPED: [&str; 13] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    "authorization",
    "proxy-authorization",
    "content-length",
    fenced_http::OWNER_HEADER,
    IDEMPOTENCY_HEADER,
];

/// The upstream's request: the caller's method, path, query, headers (less
/// [`DROPPED`] and whatever `connection` names) and body, the derived
/// idempotency key, and the gateway's own credential if it has one.
pub fn upstream_request(
    base: &Uri,
    method: Method,
    path_and_query: &str,
    caller: &HeaderMap,
    body: Bytes,
    idempotency_key: &str,
    authorization: Option<&HeaderValue>,
) -> Result<Request<Full<Bytes>>, String> {
    if has_dot_segment(path_and_query) {
        return Err(format!(
            "path: must not hold a `.` or `..` segment (plain or percent-encoded), got {:?}",
            path_and_query.chars().take(200).collect::<String>()
        ));
    }
    let base_path = base.path().trim_end_matches('/');
    let uri = format!(
        "{}://{}{}{}",
        base.scheme_str().unwrap_or("http"),
        base.authority().map(|a| a.as_str()).unwrap_or_default(),
        base_path,
        path_and_query
    );
    let uri: Uri = uri
        .parse()
        .map_err(|e| format!("the upstream address {uri:?} is not a URI: {e}"))?;
    let named_by_connection = named_by_connection(caller);
    let mut req = Request::new(Full::new(body));
    *req.method_mut() = method;
    *req.uri_mut() = uri;
    let headers = req.headers_mut();
    for (name, value) in caller {
        let n = name.as_str();
        if DROPPED.contains(&n) || named_by_connection.iter().any(|c| c == n) {
            continue;
        }
        headers.append(name.clone(), value.clone());
    }
    let key = HeaderValue::from_str(idempotency_key)
        .map_err(|_| "the idempotency key is not a header value".to_string())?;
    headers.insert(HeaderName::from_static(IDEMPOTENCY_HEADER), key);
    if let Some(auth) = authorization {
        headers.insert(header::AUTHORIZATION, auth.clone());
    }
    Ok(req)
}

/// Whether the path (before its query) has a `.` or `..` segment, plain or
/// percent-encoded: the upstream could resolve it out of `--upstream`'s
/// base path.
fn has_dot_segment(path_and_query: &str) -> bool {
    let path = path_and_query.split('?').next().unwrap_or_default();
    path.split('/').any(|segment| {
        let decoded = segment.replace("%2e", ".").replace("%2E", ".");
        decoded == "." || decoded == ".."
    })
}

/// The headers a `connection` header names: hop-by-hop for this hop only.
fn named_by_connection(headers: &HeaderMap) -> Vec<String> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|v| v.trim().to_ascii_lowercase())
        .collect()
}

/// Hop-by-hop headers of an upstream answer, never passed back.
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// The upstream's answer as the caller gets it: its status, its headers
/// less the hop-by-hop ones (and those `connection` names), its body.
pub fn answer_to_caller(
    mut head: http::response::Parts,
    body: Bytes,
) -> http::Response<Full<Bytes>> {
    let named = named_by_connection(&head.headers);
    for name in HOP_BY_HOP.iter().map(|n| n.to_string()).chain(named) {
        head.headers.remove(name.as_str());
    }
    head.headers.remove(header::CONTENT_LENGTH);
    http::Response::from_parts(head, Full::new(body))
}

/// The client to the upstream: plain HTTP or HTTPS (rustls, ring), with
/// the CA of `ca` or the system's roots, and a client certificate if set.
pub type UpstreamClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>;

/// Builds the upstream client. `identity` is (certificate, key) PEM paths.
pub fn client(
    ca: Option<&Path>,
    identity: Option<(&Path, &Path)>,
    connect_timeout: Duration,
) -> Result<UpstreamClient, String> {
    use rustls_pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer};
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    match ca {
        Some(path) => {
            for cert in CertificateDer::pem_file_iter(path)
                .map_err(|e| format!("upstream_ca: {}: {e}", path.display()))?
            {
                let cert = cert.map_err(|e| format!("upstream_ca: {}: {e}", path.display()))?;
                roots
                    .add(cert)
                    .map_err(|e| format!("upstream_ca: {}: {e}", path.display()))?;
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            for cert in found.certs {
                // A system certificate rustls cannot use is skipped, as
                // every TLS client does.
                let _ = roots.add(cert);
            }
        }
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("upstream TLS: {e}"))?
        .with_root_certificates(roots);
    let config = match identity {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let chain = CertificateDer::pem_file_iter(cert)
                .map_err(|e| format!("upstream_cert: {}: {e}", cert.display()))?
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| format!("upstream_cert: {}: {e}", cert.display()))?;
            let key = PrivateKeyDer::from_pem_file(key)
                .map_err(|e| format!("upstream_key: {}: {e}", key.display()))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| format!("upstream_cert: {e}"))?
        }
    };
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(Some(connect_timeout));
    http.set_nodelay(true);
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config)
        .https_or_http()
        .enable_http1()
        .wrap_connector(http);
    Ok(Client::builder(hyper_util::rt::TokioExecutor::new()).build(https))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_owner_and_hop_headers_stay_behind() {
        let mut caller = HeaderMap::new();
        for (k, v) in [
            ("authorization", "Bearer caller-secret"),
            ("x-fencing-owner", "5b2f0c7e-6a43-4c09-9a8e-1d0f6f3b7a21"),
            ("x-fencing-token", "7"),
            ("idempotency-key", "caller-chosen"),
            ("connection", "close, x-private"),
            ("x-private", "hop"),
            ("content-type", "application/json"),
        ] {
            caller.append(k, HeaderValue::from_static(v));
        }
        let base: Uri = "https://api.example:8443/v2/".parse().unwrap_or_default();
        let gateway_auth = HeaderValue::from_static("Bearer gateway");
        let req = upstream_request(
            &base,
            Method::POST,
            "/charges?x=1",
            &caller,
            Bytes::from_static(b"{}"),
            "fenced-abc",
            Some(&gateway_auth),
        );
        let req = req.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            req.uri().to_string(),
            "https://api.example:8443/v2/charges?x=1"
        );
        let h = req.headers();
        assert_eq!(h.get("authorization"), Some(&gateway_auth));
        assert_eq!(
            h.get("idempotency-key").map(|v| v.as_bytes()),
            Some(&b"fenced-abc"[..])
        );
        assert!(h.get("x-fencing-owner").is_none());
        assert!(h.get("x-private").is_none());
        assert!(h.get("connection").is_none());
        assert_eq!(
            h.get("x-fencing-token").map(|v| v.as_bytes()),
            Some(&b"7"[..])
        );
        assert_eq!(h.get_all("idempotency-key").iter().count(), 1);
    }

    #[test]
    fn dot_segments_cannot_leave_the_base_path() {
        let base: Uri = "http://api.example/v2".parse().unwrap_or_default();
        let caller = HeaderMap::new();
        for bad in ["/../admin", "/a/./b", "/%2e%2e/admin", "/a/%2E/b", "/.."] {
            let r = upstream_request(&base, Method::POST, bad, &caller, Bytes::new(), "k", None);
            assert!(r.as_ref().is_err_and(|e| e.starts_with("path: ")), "{bad}");
        }
        for good in ["/a..b/c", "/.well-known/x", "/a?q=..", "/"] {
            let r = upstream_request(&base, Method::POST, good, &caller, Bytes::new(), "k", None);
            assert!(r.is_ok(), "{good}");
        }
    }

    #[test]
    fn hop_by_hop_headers_of_the_answer_stay_behind() {
        let mut answer = http::Response::new(());
        for (k, v) in [
            ("connection", "x-secret"),
            ("x-secret", "1"),
            ("transfer-encoding", "chunked"),
            ("keep-alive", "timeout=5"),
            ("x-request-id", "abc"),
        ] {
            answer.headers_mut().append(k, HeaderValue::from_static(v));
        }
        let (head, ()) = answer.into_parts();
        let out = answer_to_caller(head, Bytes::from_static(b"ok"));
        let names: Vec<_> = out
            .headers()
            .keys()
            .map(|k| k.as_str().to_string())
            .collect();
        assert_eq!(names, ["x-request-id"]);
    }
}
