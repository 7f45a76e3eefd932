//! "Still current" on top of "not older": before a write to a key under one
//! of the configured prefixes is applied, the lock cluster is asked
//! (ValidateToken, a linearizable read) whether the write's token is still
//! the current lease of its resource. Anything but CURRENT refuses the
//! write; a cluster that cannot answer in time refuses it too (fail
//! closed). The number of checks in flight and their time are bounded.
//!
//! The answer holds at a point after the write arrived and before it is
//! applied; a lease that ends between the two is still caught by the token
//! order of the store as soon as a newer owner writes (docs/DECISIONS.md,
//! "fenced-resource --require-current").

use std::{sync::Arc, time::Duration};

use fenced_core::{ResourceName, Token};
use fenced_proto::v1::{self, lock_client::LockClient};
use tokio::sync::Semaphore;
use tonic::{
    metadata::{Ascii, MetadataValue},
    transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity},
    Code, Status,
};

/// How the service reaches the lock cluster.
#[derive(Debug, Clone, Default)]
pub struct ClusterOptions {
    /// `host:port` (or `http(s)://host:port`) of the cluster's nodes.
    pub endpoints: Vec<String>,
    /// PEM of the CA that signed the nodes' certificates: TLS on.
    pub ca_pem: Option<Vec<u8>>,
    /// PEM certificate and key of this service, for a cluster that
    /// requires client certificates.
    pub identity_pem: Option<(Vec<u8>, Vec<u8>)>,
    /// Bearer token with the `read` role on the resources.
    pub bearer: Option<String>,
    /// Checks of a write apply to keys starting with one of these (empty:
    /// every key).
    pub key_prefixes: Vec<String>,
    /// The time one check may take in all, retries on other nodes included.
    pub timeout: Duration,
    /// The most checks in flight; beyond, writes are refused at once.
    pub max_in_flight: usize,
}

/// Asks the cluster whether a token is current.
#[derive(Clone)]
pub struct CurrentCheck {
    channels: Vec<(String, Channel)>,
    bearer: Option<MetadataValue<Ascii>>,
    key_prefixes: Arc<Vec<String>>,
    timeout: Duration,
    in_flight: Arc<Semaphore>,
    max_in_flight: usize,
}

impl CurrentCheck {
    /// Connects lazily to the cluster (call it inside a tokio runtime).
    /// Errors name the option at fault.
    pub fn new(o: ClusterOptions) -> Result<Self, String> {
        if o.endpoints.is_empty() {
            return Err("cluster: --require-current needs --cluster endpoints".into());
        }
        if o.max_in_flight == 0 {
            return Err("current_checks_in_flight: must be at least 1".into());
        }
        let scheme = if o.ca_pem.is_some() { "https" } else { "http" };
        let mut channels = Vec::new();
        for e in &o.endpoints {
            let url = if e.contains("://") {
                e.clone()
            } else {
                format!("{scheme}://{e}")
            };
            let mut endpoint = Endpoint::from_shared(url.clone())
                .map_err(|err| format!("cluster: endpoint {e}: {err}"))?
                .connect_timeout(o.timeout)
                .tcp_nodelay(true);
            if let Some(ca) = &o.ca_pem {
                let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca));
                if let Some((cert, key)) = &o.identity_pem {
                    tls = tls.identity(Identity::from_pem(cert, key));
                }
                endpoint = endpoint
                    .tls_config(tls)
                    .map_err(|err| format!("cluster: TLS for {e}: {err}"))?;
            }
            channels.push((e.clone(), endpoint.connect_lazy()));
        }
        let bearer = o
            .bearer
            .map(|t| {
                MetadataValue::try_from(format!("Bearer {}", t.trim()))
                    .map_err(|_| "cluster_token: must be printable ASCII".to_string())
            })
            .transpose()?;
        Ok(Self {
            channels,
            bearer,
            key_prefixes: Arc::new(o.key_prefixes),
            timeout: o.timeout,
            in_flight: Arc::new(Semaphore::new(o.max_in_flight)),
            max_in_flight: o.max_in_flight,
        })
    }

    /// Whether writes to `key` are checked.
    pub fn applies_to(&self, key: &str) -> bool {
        self.key_prefixes.is_empty() || self.key_prefixes.iter().any(|p| key.starts_with(p))
    }

    /// `Ok` when `token` is the current lease of `resource`; else the status
    /// to refuse the write with (nothing was written).
    pub async fn require(&self, resource: &ResourceName, token: Token) -> Result<(), Status> {
        let _slot = self.in_flight.try_acquire().map_err(|_| {
            Status::resource_exhausted(format!(
                "current_checks_in_flight ({}) reached: the write was not applied; retry",
                self.max_in_flight
            ))
        })?;
        let answer = tokio::time::timeout(self.timeout, self.ask(resource, token))
            .await
            .map_err(|_| {
                Status::unavailable(format!(
                    "the lock cluster did not confirm token {token} on {resource} within {} ms; \
                     the write was not applied",
                    self.timeout.as_millis()
                ))
            })??;
        match v1::TokenState::try_from(answer.state) {
            Ok(v1::TokenState::Current) => Ok(()),
            state => {
                let name = state.map_or("UNSPECIFIED", |s| s.as_str_name());
                tracing::info!(%resource, token = token.get(), current_token = answer.current_token,
                    state = name, "write refused: the token is not current");
                Err(Status::failed_precondition(format!(
                    "token {token} on {resource} is not current ({name}, current token {}); \
                     the write was not applied",
                    answer.current_token
                )))
            }
        }
    }

    /// Tries the nodes in turn until one answers; errors that another node
    /// cannot fix (permission, bad request) end the check at once.
    async fn ask(
        &self,
        resource: &ResourceName,
        token: Token,
    ) -> Result<v1::ValidateTokenResponse, Status> {
        let mut last = String::new();
        let mut pause = Duration::from_millis(20);
        loop {
            for (name, ch) in &self.channels {
                let mut req = tonic::Request::new(v1::ValidateTokenRequest {
                    resource: resource.as_str().as_bytes().to_vec(),
                    token: token.get(),
                });
                req.set_timeout(self.timeout);
                if let Some(b) = &self.bearer {
                    req.metadata_mut().insert("authorization", b.clone());
                }
                match LockClient::new(ch.clone()).validate_token(req).await {
                    Ok(r) => return Ok(r.into_inner()),
                    Err(s)
                        if matches!(
                            s.code(),
                            Code::PermissionDenied | Code::Unauthenticated | Code::InvalidArgument
                        ) =>
                    {
                        return Err(Status::unavailable(format!(
                            "the lock cluster refused the check ({}): {}; the write was not \
                             applied",
                            name,
                            s.message()
                        )))
                    }
                    Err(s) => last = format!("{name}: {}", s.message()),
                }
            }
            tracing::debug!(error = %last, "no node confirmed the token yet");
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(200));
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn options(endpoints: &[&str]) -> ClusterOptions {
        ClusterOptions {
            endpoints: endpoints.iter().map(|s| s.to_string()).collect(),
            timeout: Duration::from_millis(300),
            max_in_flight: 1,
            ..ClusterOptions::default()
        }
    }

    #[tokio::test]
    async fn prefixes_choose_the_keys_checked() {
        let mut o = options(&["127.0.0.1:1"]);
        let all = CurrentCheck::new(o.clone()).unwrap();
        assert!(all.applies_to("anything"));
        o.key_prefixes = vec!["ledger/".into()];
        let some = CurrentCheck::new(o).unwrap();
        assert!(some.applies_to("ledger/1"));
        assert!(!some.applies_to("cache/1"));
        assert!(CurrentCheck::new(options(&[])).is_err());
    }

    #[tokio::test]
    async fn a_cluster_that_cannot_answer_refuses_the_write_in_bounded_time() {
        // Nothing listens there.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let check = CurrentCheck::new(options(&[&format!("127.0.0.1:{port}")])).unwrap();
        let resource = ResourceName::new("r").unwrap();
        let started = std::time::Instant::now();
        let e = check
            .require(&resource, Token::new(1).unwrap())
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::Unavailable);
        assert!(e.message().contains("not applied"), "{e:?}");
        assert!(started.elapsed() < Duration::from_secs(3));
        // The bound on checks in flight: the one place taken, the next is
        // refused at once.
        let held = check.in_flight.clone().try_acquire_owned().unwrap();
        let e = check
            .require(&resource, Token::new(1).unwrap())
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::ResourceExhausted);
        assert!(
            e.message().contains("current_checks_in_flight (1)"),
            "{e:?}"
        );
        drop(held);
    }
}
