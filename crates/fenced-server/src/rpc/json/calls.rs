//! Every call the JSON API serves, declared once: its gRPC method, the
//! service that answers it, the bound on its message and whether it
//! streams. The path, the dispatch and the OpenAPI document all come from
//! this list, and a test checks it against every method in `proto/`.

/// A call's path: `fenced.v1.Lock/AcquireInSession` is served at
/// `/v1/lock/acquire_in_session`.
pub fn path_of(method: &str) -> Option<String> {
    let (service, name) = method.split_once('/')?;
    let service = service.strip_prefix("fenced.v1.")?;
    let mut snake = String::with_capacity(name.len() + 4);
    for (i, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                snake.push('_');
            }
            snake.push(c.to_ascii_lowercase());
        } else {
            snake.push(c);
        }
    }
    Some(format!("/v1/{}/{snake}", service.to_ascii_lowercase()))
}

/// The bound a call's message has over gRPC (the server's decoding limit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bound {
    /// A Lock call (a full RenewMany is the largest).
    Lock,
    /// A Kv call (a value of up to 64 KiB).
    Kv,
    /// Any other call.
    Client,
}

macro_rules! calls {
    ($($variant:ident = $method:literal, $service:ident :: $function:ident, $bound:ident, $kind:ident;)*) => {
        /// One served call.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum Call { $($variant),* }

        impl Call {
            pub const ALL: &'static [Call] = &[$(Call::$variant),*];

            /// `package.Service/Method`, as in [`fenced_proto::METHODS`].
            pub fn method(self) -> &'static str {
                match self { $(Call::$variant => $method),* }
            }

            pub fn bound(self) -> Bound {
                match self { $(Call::$variant => Bound::$bound),* }
            }

            /// Answered as server-sent events.
            pub fn streams(self) -> bool {
                match self { $(Call::$variant => calls!(@streams $kind)),* }
            }
        }

        impl super::JsonApi {
            /// Hands `call` to the service that answers it over gRPC.
            pub(super) async fn dispatch(
                &self,
                call: Call,
                parts: http::request::Parts,
                body: bytes::Bytes,
            ) -> http::Response<axum::body::Body> {
                #[allow(unused_imports)]
                use fenced_proto::v1::{
                    cluster_server::Cluster, kv_server::Kv, lock_server::Lock,
                };
                let max = self.bound(call.bound());
                match call {
                    $(Call::$variant => {
                        let service = &self.$service;
                        super::$kind(parts, &body, max, |r| service.$function(r)).await
                    })*
                }
            }
        }
    };
    (@streams unary) => { false };
    (@streams stream) => { true };
}

calls! {
    Acquire = "fenced.v1.Lock/Acquire", lock::acquire, Lock, unary;
    Renew = "fenced.v1.Lock/Renew", lock::renew, Lock, unary;
    RenewMany = "fenced.v1.Lock/RenewMany", lock::renew_many, Lock, unary;
    Release = "fenced.v1.Lock/Release", lock::release, Lock, unary;
    OpenSession = "fenced.v1.Lock/OpenSession", lock::open_session, Lock, unary;
    AcquireInSession = "fenced.v1.Lock/AcquireInSession", lock::acquire_in_session, Lock, unary;
    KeepAlive = "fenced.v1.Lock/KeepAlive", lock::keep_alive, Lock, unary;
    CloseSession = "fenced.v1.Lock/CloseSession", lock::close_session, Lock, unary;
    Describe = "fenced.v1.Lock/Describe", lock::describe, Lock, unary;
    ValidateToken = "fenced.v1.Lock/ValidateToken", lock::validate_token, Lock, unary;
    ValidateTokens = "fenced.v1.Lock/ValidateTokens", lock::validate_tokens, Lock, unary;
    Watch = "fenced.v1.Lock/Watch", lock::watch, Lock, stream;
    History = "fenced.v1.Lock/History", lock::history, Lock, unary;
    KvPut = "fenced.v1.Kv/Put", kv::put, Kv, unary;
    KvGet = "fenced.v1.Kv/Get", kv::get, Kv, unary;
    KvDelete = "fenced.v1.Kv/Delete", kv::delete, Kv, unary;
    Status = "fenced.v1.Cluster/Status", cluster::status, Client, unary;
    AddLearner = "fenced.v1.Cluster/AddLearner", cluster::add_learner, Client, unary;
    ChangeMembership = "fenced.v1.Cluster/ChangeMembership", cluster::change_membership, Client, unary;
    RemoveNode = "fenced.v1.Cluster/RemoveNode", cluster::remove_node, Client, unary;
    PromoteLearner = "fenced.v1.Cluster/PromoteLearner", cluster::promote_learner, Client, unary;
    ListMembers = "fenced.v1.Cluster/ListMembers", cluster::list_members, Client, unary;
}

impl Call {
    /// Where the call is served.
    pub fn path(self) -> String {
        path_of(self.method()).unwrap_or_default()
    }

    /// The call served at `path`.
    pub fn at(path: &str) -> Option<Call> {
        Call::ALL.iter().copied().find(|c| c.path() == path)
    }
}

/// The services whose calls are not served as JSON, and why: a snapshot is
/// a binary stream for an operator's tool (`fencectl backup`), and
/// FencedResource is fenced-resource's contract, not a node's.
pub const NOT_SERVED: &[&str] = &["fenced.v1.Maintenance/", "fenced.v1.FencedResource/"];

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn paths_are_the_method_in_snake_case_under_its_service() {
        assert_eq!(
            path_of("fenced.v1.Lock/AcquireInSession").unwrap(),
            "/v1/lock/acquire_in_session"
        );
        assert_eq!(path_of("fenced.v1.Kv/Put").unwrap(), "/v1/kv/put");
        assert_eq!(path_of("other.Service/X"), None);
        assert_eq!(
            Call::at("/v1/cluster/list_members"),
            Some(Call::ListMembers)
        );
        assert_eq!(Call::at("/v1/lock/nope"), None);
    }

    /// A method added to proto/ is either served or named as not served.
    #[test]
    fn every_method_in_proto_is_served_or_excluded() {
        let served: Vec<&str> = Call::ALL.iter().map(|c| c.method()).collect();
        for method in fenced_proto::METHODS {
            let excluded = NOT_SERVED.iter().any(|p| method.starts_with(p));
            assert!(
                served.contains(method) != excluded,
                "{method}: served {}, excluded {excluded}",
                served.contains(method)
            );
        }
        assert_eq!(served.len(), Call::ALL.len());
        for call in Call::ALL {
            assert!(fenced_proto::METHODS.contains(&call.method()), "{call:?}");
            assert!(call.path().starts_with("/v1/"), "{call:?}");
        }
    }
}
