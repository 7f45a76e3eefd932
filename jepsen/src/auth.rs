//! The harness runs the cluster with authentication on: one token, whose
//! identity may lock, read and administer everything, sent on every call.
//! Auth then sits on every path the faults exercise (forwarding included).

use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
    sync::OnceLock,
};

use anyhow::{Context, Result};
use sha2::{Digest, Sha256};

/// This run's token: random, never written anywhere but the nodes' hashed file.
pub fn token() -> &'static str {
    static TOKEN: OnceLock<String> = OnceLock::new();
    TOKEN.get_or_init(|| {
        let mut rng = fastrand::Rng::new();
        (0..32).fold(String::new(), |mut s, _| {
            let _ = write!(s, "{:02x}", rng.u8(..));
            s
        })
    })
}

/// Adds the bearer token to a request.
pub fn authorize<T>(req: &mut tonic::Request<T>) {
    if let Ok(v) = format!("Bearer {}", token()).parse() {
        req.metadata_mut().insert("authorization", v);
    }
}

/// Writes the tokens and policy files into `dir`; returns their paths, the
/// nodes' `auth_tokens` and `auth_policy`.
pub fn write_files(dir: &Path) -> Result<(PathBuf, PathBuf)> {
    let hash = Sha256::digest(token().as_bytes())
        .iter()
        .fold(String::new(), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        });
    let tokens = dir.join("auth-tokens.toml");
    let policy = dir.join("auth-policy.toml");
    std::fs::write(
        &tokens,
        format!("[[token]]\nname = \"jepsen\"\nsha256 = \"{hash}\"\nroles = [\"harness\"]\n"),
    )
    .with_context(|| format!("writing {}", tokens.display()))?;
    std::fs::write(
        &policy,
        "[roles.harness]\nlock = [\"\"]\nread = [\"\"]\nadmin = true\n",
    )
    .with_context(|| format!("writing {}", policy.display()))?;
    Ok((tokens, policy))
}

/// Fails unless the node at `addr` refuses a call without the token: the
/// run is meant to exercise the cluster with authentication on. Over TLS:
/// without any credential the call is unauthenticated; with only the harness's
/// certificate, whose identity holds no grant, it is denied, so the token is
/// what authorizes every other call.
pub async fn check_enforced(addr: &str) -> Result<()> {
    for (with_certificate, expected) in [
        (false, tonic::Code::Unauthenticated),
        (true, tonic::Code::PermissionDenied),
    ] {
        let ch = crate::tls::channel(addr, with_certificate)?;
        let mut req = tonic::Request::new(fenced_proto::v1::DescribeRequest {
            resource: b"auth-check".to_vec(),
            allow_stale: false,
        });
        req.set_timeout(std::time::Duration::from_secs(2));
        let answer = fenced_proto::v1::lock_client::LockClient::new(ch)
            .describe(req)
            .await;
        match answer {
            Err(s) if s.code() == expected => {}
            other => anyhow::bail!(
                "{addr} answered a call without a token (client certificate: {with_certificate}) \
                 with {other:?}, not {expected:?}: authentication is off or the certificate is trusted"
            ),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_token_is_stable_within_a_run_and_sent_as_bearer() {
        assert_eq!(token(), token());
        assert_eq!(token().len(), 64);
        let mut req = tonic::Request::new(());
        authorize(&mut req);
        let sent = req
            .metadata()
            .get("authorization")
            .unwrap()
            .to_str()
            .unwrap();
        assert_eq!(sent, format!("Bearer {}", token()));
    }
}
