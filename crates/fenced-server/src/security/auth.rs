//! Who is asking and what they may do: identities from bearer tokens (stored
//! hashed in a file) or from a client certificate, roles that grant `lock`,
//! `read` and `admin`, and the check every client call makes before it is
//! served or forwarded.
//!
//! With neither `auth_tokens` nor `auth_policy` set, auth is off and every
//! call is served as before. With either set, everything not granted is
//! denied.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    fmt,
    path::{Path, PathBuf},
    sync::{Arc, PoisonError, RwLock},
};

use serde::Deserialize;
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;
use tonic::{metadata::MetadataMap, Request, Status};

/// On a call a follower forwards over the peer port: the name of the
/// identity the follower authenticated and authorized.
pub const FORWARDED_IDENTITY: &str = "x-fenced-identity";

/// An identity the transport already established (the TLS layer inserts it
/// into the request's extensions from the verified client certificate, see
/// [`crate::security::tls::certificate_name`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal(pub String);

/// What a role grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permission {
    /// acquire, renew, release
    Lock,
    /// describe
    Read,
    /// membership, status with digest, snapshots
    Admin,
}

impl fmt::Display for Permission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Permission::Lock => "lock",
            Permission::Read => "read",
            Permission::Admin => "admin",
        })
    }
}

/// The file format shared by `auth_tokens` and `auth_policy`: either may
/// hold any section; the two are merged.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct AuthFile {
    #[serde(default)]
    token: Vec<TokenEntry>,
    #[serde(default)]
    roles: BTreeMap<String, RoleEntry>,
    #[serde(default)]
    identities: BTreeMap<String, Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenEntry {
    name: String,
    /// SHA-256 of the token, 64 hex digits.
    sha256: String,
    #[serde(default)]
    roles: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RoleEntry {
    #[serde(default)]
    lock: Vec<String>,
    #[serde(default)]
    read: Vec<String>,
    #[serde(default)]
    admin: bool,
}

/// What one identity may do: resource-name prefixes per permission.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Grants {
    pub lock: BTreeSet<String>,
    pub read: BTreeSet<String>,
    pub admin: bool,
}

impl Grants {
    fn prefixes(&self, permission: Permission) -> &BTreeSet<String> {
        match permission {
            Permission::Lock => &self.lock,
            // Admin has no resource; callers never ask for its prefixes.
            Permission::Read | Permission::Admin => &self.read,
        }
    }

    /// Whether `permission` is granted on `resource` (admin: cluster-wide).
    pub fn allows(&self, permission: Permission, resource: &str) -> bool {
        match permission {
            Permission::Admin => self.admin,
            p => self
                .prefixes(p)
                .iter()
                .any(|prefix| resource.starts_with(prefix.as_str())),
        }
    }
}

/// The tokens and the grants of every identity, as loaded.
#[derive(Debug, Default)]
pub struct Policy {
    /// Token hashes and the identity each names.
    tokens: Vec<([u8; 32], String)>,
    grants: HashMap<String, Grants>,
}

/// Compares in time independent of where the inputs differ.
pub fn constant_time_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let diff = a
        .iter()
        .zip(b.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// SHA-256 of `token`, as stored in the tokens file.
pub fn hash_token(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn from_hex(text: &str) -> Option<[u8; 32]> {
    let text = text.trim();
    if text.len() != 64 || !text.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

impl Policy {
    /// Reads and checks the files; the error names the file and the line or
    /// the field at fault.
    pub fn load(tokens: Option<&Path>, policy: Option<&Path>) -> Result<Policy, String> {
        let paths: Vec<&Path> = [tokens, policy].into_iter().flatten().collect();
        Self::load_all(&paths)
    }

    /// [`Policy::load`] of any number of files, merged.
    pub fn load_all<P: AsRef<Path>>(paths: &[P]) -> Result<Policy, String> {
        let mut files = Vec::new();
        for path in paths.iter().map(AsRef::as_ref) {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("auth file {}: {e}", path.display()))?;
            let file: AuthFile =
                toml::from_str(&text).map_err(|e| format!("auth file {}: {e}", path.display()))?;
            files.push((path.display().to_string(), file));
        }
        Self::from_files(files)
    }

    fn from_files(files: Vec<(String, AuthFile)>) -> Result<Policy, String> {
        let mut roles = BTreeMap::new();
        for (origin, file) in &files {
            for (name, role) in &file.roles {
                if roles.insert(name.clone(), role).is_some() {
                    return Err(format!("auth file {origin}: roles.{name}: defined twice"));
                }
            }
        }
        let mut policy = Policy::default();
        let mut grant = |origin: &str, field: &str, who: &str, role_names: &[String]| {
            let grants = policy.grants.entry(who.to_string()).or_default();
            for role_name in role_names {
                let role = roles.get(role_name).ok_or_else(|| {
                    format!("auth file {origin}: {field}: role {role_name:?} is not defined under [roles]")
                })?;
                grants.lock.extend(role.lock.iter().cloned());
                grants.read.extend(role.read.iter().cloned());
                grants.admin |= role.admin;
            }
            Ok::<_, String>(())
        };
        let mut hashes = Vec::new();
        for (origin, file) in &files {
            for (i, t) in file.token.iter().enumerate() {
                let field = format!("token[{i}]");
                // Names travel in metadata when a call is forwarded.
                if t.name.is_empty() || !t.name.bytes().all(|b| b.is_ascii_graphic()) {
                    return Err(format!(
                        "auth file {origin}: {field}.name: must be non-empty printable ASCII without spaces"
                    ));
                }
                let hash = from_hex(&t.sha256).ok_or_else(|| {
                    format!(
                        "auth file {origin}: {field}.sha256 (token {:?}): not 64 hex digits \
                         (`fenced auth hash-token` prints one)",
                        t.name
                    )
                })?;
                if hashes.iter().any(|(h, _)| *h == hash) {
                    return Err(format!(
                        "auth file {origin}: {field}.sha256 (token {:?}): the same token hash is listed twice",
                        t.name
                    ));
                }
                grant(origin, &format!("{field}.roles"), &t.name, &t.roles)?;
                hashes.push((hash, t.name.clone()));
            }
            for (who, role_names) in &file.identities {
                grant(origin, &format!("identities.{who}"), who, role_names)?;
            }
        }
        policy.tokens = hashes;
        Ok(policy)
    }

    /// The identity `token` names. Every stored hash is compared, each in
    /// constant time, so the answer's timing tells nothing about which
    /// entry (or how much of one) matched.
    pub fn token_identity(&self, token: &str) -> Option<&str> {
        let presented = hash_token(token);
        let mut found = None;
        for (hash, name) in &self.tokens {
            if constant_time_eq(hash, &presented) {
                found = Some(name.as_str());
            }
        }
        found
    }

    /// Every identity the files name and what it is granted, by name.
    pub fn identities(&self) -> BTreeMap<&str, &Grants> {
        self.grants.iter().map(|(k, v)| (k.as_str(), v)).collect()
    }

    pub fn grants(&self, identity: &str) -> Grants {
        self.grants.get(identity).cloned().unwrap_or_default()
    }

    /// Whether `identity` may do `operation` (needing `permission`) on
    /// `resource`; the refusal names what is granted.
    pub fn check(
        &self,
        identity: &str,
        permission: Permission,
        operation: &str,
        resource: Option<&str>,
    ) -> Result<(), Status> {
        let grants = self.grants.get(identity);
        // `lock` with no resource (a session's calls): granted on some prefix.
        let allowed = grants.is_some_and(|g| match (permission, resource) {
            (Permission::Lock, None) => !g.lock.is_empty(),
            (p, r) => g.allows(p, r.unwrap_or("")),
        });
        if allowed {
            return Ok(());
        }
        Err(Status::permission_denied(match (permission, resource) {
            (Permission::Admin, _) | (_, None) => format!(
                "permission denied: identity {identity:?} may not call {operation}: it needs \
                 {permission}, which is not granted to it"
            ),
            (p, Some(resource)) => {
                let prefixes: Vec<&String> = grants
                    .map(|g| g.prefixes(p).iter().collect())
                    .unwrap_or_default();
                format!(
                    "permission denied: identity {identity:?} may not {operation} resource \
                     {resource:?}: {p} is granted to it on prefixes {prefixes:?}"
                )
            }
        }))
    }
}

/// Where the auth files are; auth is on when either is set.
#[derive(Debug, Clone, Default)]
pub struct AuthConfig {
    pub tokens: Option<PathBuf>,
    pub policy: Option<PathBuf>,
}

impl AuthConfig {
    pub fn enabled(&self) -> bool {
        self.tokens.is_some() || self.policy.is_some()
    }
}

/// The node's auth state: the loaded policy, swapped whole on reload.
#[derive(Debug, Default)]
pub struct Auth {
    config: AuthConfig,
    /// `None` while auth is off.
    policy: RwLock<Option<Arc<Policy>>>,
    /// The membership view that says which nodes may forward a caller's
    /// identity: voters only. `None`: no node may.
    forwarders: Option<crate::security::tls::Members>,
    /// Revoked certificates: a connection opened before its certificate
    /// was revoked is refused at its next call.
    revocations: Option<Arc<crate::security::revocation::Revocations>>,
}

impl Auth {
    /// Auth off: every call is served.
    pub fn disabled() -> Self {
        Self::default()
    }

    /// Loads the files named in `config`.
    pub fn load(config: AuthConfig) -> Result<Self, String> {
        let policy = if config.enabled() {
            Some(Arc::new(Policy::load(
                config.tokens.as_deref(),
                config.policy.as_deref(),
            )?))
        } else {
            None
        };
        Ok(Self {
            config,
            policy: RwLock::new(policy),
            forwarders: None,
            revocations: None,
        })
    }

    /// Refuses calls over a connection whose certificate `revocations`
    /// lists, and rereads that list with the auth files.
    pub fn with_revocations(
        mut self,
        revocations: Arc<crate::security::revocation::Revocations>,
    ) -> Self {
        self.revocations = Some(revocations);
        self
    }

    /// Whether a deny list is set (SIGHUP rereads it).
    pub fn revokes(&self) -> bool {
        self.revocations.as_ref().is_some_and(|r| r.enabled())
    }

    /// Believes a forwarded identity from the voters of `members` (over the
    /// peer port's mutual TLS), and from no other node.
    pub fn with_forwarders(mut self, members: crate::security::tls::Members) -> Self {
        self.forwarders = Some(members);
        self
    }

    pub fn enabled(&self) -> bool {
        self.config.enabled()
    }

    fn current(&self) -> Option<Arc<Policy>> {
        self.policy
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Rereads the files; on an error the policy (or deny list) in force
    /// stays.
    pub fn reload(&self) -> Result<(), String> {
        if let Some(r) = &self.revocations {
            r.reload()?;
        }
        if !self.enabled() {
            return Ok(());
        }
        let policy = Policy::load(self.config.tokens.as_deref(), self.config.policy.as_deref())?;
        *self.policy.write().unwrap_or_else(PoisonError::into_inner) = Some(Arc::new(policy));
        Ok(())
    }

    /// Whether `identity`, as [`Auth::authorize`] returned it, is shown
    /// the owner ids of leases (watch, history): an admin, or anyone with
    /// auth off (every caller is then the one empty identity).
    pub fn shows_owner_ids(&self, identity: Option<&str>) -> bool {
        match (self.current(), identity) {
            (Some(policy), Some(id)) => policy.grants(id).allows(Permission::Admin, ""),
            (Some(_), None) => false,
            (None, _) => true,
        }
    }

    /// UNAUTHENTICATED when the deny list (as reloaded) revokes the
    /// certificate `der` a connection was opened with.
    pub fn certificate_in_force(&self, der: &[u8]) -> Result<(), Status> {
        self.revocations
            .as_ref()
            .map_or(Ok(()), |r| crate::security::tls::revoked(r, der))
            .map_err(|why| {
                Status::unauthenticated(format!(
                    "authentication failed: the connection's certificate is revoked ({why})"
                ))
            })
    }

    /// Authenticates the caller and checks that it may do `operation` on
    /// `resource`; returns its identity (`None` with auth off).
    pub fn authorize<T>(
        &self,
        req: &Request<T>,
        trusted_forward: bool,
        permission: Permission,
        operation: &str,
        resource: Option<&str>,
    ) -> Result<Option<String>, Status> {
        let Some((policy, identity)) = self.identify(req, trusted_forward)? else {
            return Ok(None);
        };
        Self::check_grant(&policy, identity, permission, operation, resource)
    }

    /// Authenticates the caller, whatever its roles (a call that reveals
    /// nothing of the leases, such as server reflection); returns its
    /// identity (`None` with auth off).
    pub fn authenticate<T>(&self, req: &Request<T>) -> Result<Option<String>, Status> {
        Ok(self.identify(req, false)?.map(|(_, identity)| identity))
    }

    /// The policy in force and the caller's identity; `None` with auth off.
    fn identify<T>(
        &self,
        req: &Request<T>,
        trusted_forward: bool,
    ) -> Result<Option<(Arc<Policy>, String)>, Status> {
        // A certificate revoked after its connection opened.
        if let Some(cert) = req.peer_certs().as_ref().and_then(|c| c.first().cloned()) {
            self.certificate_in_force(&cert)?;
        }
        if let Some(cert) = req
            .extensions()
            .get::<crate::security::tls::PeerConnectInfo>()
            .and_then(|info| info.certs.as_ref()?.first().cloned())
        {
            self.certificate_in_force(&cert)?;
        }
        let Some(policy) = self.current() else {
            return Ok(None);
        };
        // The verified client certificate's name (client port, with TLS).
        let from_certificate = req
            .peer_certs()
            .and_then(|certs| {
                certs
                    .first()
                    .and_then(|c| crate::security::tls::client_name(c))
            })
            .map(Principal);
        let principal = req
            .extensions()
            .get::<Principal>()
            .or(from_certificate.as_ref());
        // A forwarded identity is believed only from a voter: over the peer
        // port's mutual TLS, from a certificate naming a node this node's
        // membership lists as a voter. A learner, a spare or a removed
        // node's certificate forwards nobody.
        let trusted_forward = trusted_forward
            && req
                .extensions()
                .get::<crate::security::tls::PeerConnectInfo>()
                .and_then(|info| {
                    info.certs
                        .as_ref()?
                        .first()
                        .and_then(|c| crate::security::tls::node_id_of(c))
                })
                .is_some_and(|node| {
                    self.forwarders
                        .as_ref()
                        .is_some_and(|members| members.is_known_voter(node))
                });
        let identity = identify(&policy, req.metadata(), principal, trusted_forward)?;
        Ok(Some((policy, identity)))
    }

    /// [`Auth::authorize`] for an HTTP request (the status page): the
    /// `Authorization: Bearer` header, else the verified client
    /// certificate's name. A forwarded identity is never believed here.
    pub fn authorize_http(
        &self,
        headers: &hyper::HeaderMap,
        certificate: Option<&Principal>,
        permission: Permission,
        operation: &str,
    ) -> Result<Option<String>, Status> {
        self.authorize_http_on(headers, certificate, permission, operation, None)
    }

    /// [`Auth::authorize_http`] for `permission` on `resource` (a prefix
    /// grant must cover it), as the write gateway asks.
    pub fn authorize_http_on(
        &self,
        headers: &hyper::HeaderMap,
        certificate: Option<&Principal>,
        permission: Permission,
        operation: &str,
        resource: Option<&str>,
    ) -> Result<Option<String>, Status> {
        let Some(policy) = self.current() else {
            return Ok(None);
        };
        // Only the header `identify` reads, so nothing else can pose as one.
        let mut only_authorization = hyper::HeaderMap::new();
        if let Some(value) = headers.get(hyper::header::AUTHORIZATION) {
            only_authorization.insert(hyper::header::AUTHORIZATION, value.clone());
        }
        let metadata = MetadataMap::from_headers(only_authorization);
        let identity = identify(&policy, &metadata, certificate, false)?;
        Self::check_grant(&policy, identity, permission, operation, resource)
    }

    fn check_grant(
        policy: &Policy,
        identity: String,
        permission: Permission,
        operation: &str,
        resource: Option<&str>,
    ) -> Result<Option<String>, Status> {
        policy
            .check(&identity, permission, operation, resource)
            .inspect_err(|_| {
                tracing::info!(
                    identity = %identity,
                    permission = %permission,
                    operation,
                    resource = resource.unwrap_or(""),
                    "call refused: permission not granted"
                );
            })?;
        Ok(Some(identity))
    }
}

/// A bearer token, when present, decides; else a forwarded identity (peer
/// port only); else the certificate's.
fn identify(
    policy: &Policy,
    metadata: &MetadataMap,
    principal: Option<&Principal>,
    trusted_forward: bool,
) -> Result<String, Status> {
    if let Some(value) = metadata.get("authorization") {
        let token = value
            .to_str()
            .ok()
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .ok_or_else(|| {
                Status::unauthenticated(
                    "authentication failed: the authorization metadata is not `Bearer <token>`",
                )
            })?;
        return policy
            .token_identity(token)
            .map(str::to_string)
            .ok_or_else(|| {
                Status::unauthenticated("authentication failed: unknown or revoked token")
            });
    }
    if trusted_forward {
        if let Some(name) = metadata
            .get(FORWARDED_IDENTITY)
            .and_then(|v| v.to_str().ok())
        {
            return Ok(name.to_string());
        }
    }
    if let Some(Principal(name)) = principal {
        return Ok(name.clone());
    }
    Err(Status::unauthenticated(
        "authentication failed: no credentials (send `authorization: Bearer <token>` or a client certificate)",
    ))
}

/// Rereads the auth files on every SIGHUP until `stop`.
pub async fn reload_on_sighup(auth: Arc<Auth>, stop: CancellationToken) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut hup = match signal(SignalKind::hangup()) {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(error = %e, "cannot listen for SIGHUP: auth files are not reloaded");
                return;
            }
        };
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                got = hup.recv() => {
                    if got.is_none() {
                        return;
                    }
                    match auth.reload() {
                        Ok(()) => tracing::info!("auth files and deny list reloaded"),
                        Err(e) => tracing::error!(
                            error = %e,
                            "auth files not reloaded: the previous tokens, policy and deny list stay in force"
                        ),
                    }
                }
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = auth;
        stop.cancelled().await;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use tonic::metadata::MetadataValue;

    const POLICY: &str = r#"
        [roles.orders]
        lock = ["orders/"]
        read = ["orders/", "shared/"]
        [roles.ops]
        admin = true
        [identities]
        "ops-cert" = ["ops"]
    "#;

    fn tokens(alice_token: &str) -> String {
        format!(
            "[[token]]\nname = \"alice\"\nsha256 = \"{}\"\nroles = [\"orders\"]\n\
             [[token]]\nname = \"root\"\nsha256 = \"{}\"\nroles = [\"ops\"]\n",
            to_hex(&hash_token(alice_token)),
            to_hex(&hash_token("root-secret"))
        )
    }

    fn policy() -> Policy {
        Policy::from_files(vec![
            (
                "tokens".into(),
                toml::from_str(&tokens("alice-secret")).unwrap(),
            ),
            ("policy".into(), toml::from_str(POLICY).unwrap()),
        ])
        .unwrap()
    }

    fn request(token: Option<&str>) -> Request<()> {
        let mut req = Request::new(());
        if let Some(t) = token {
            req.metadata_mut().insert(
                "authorization",
                MetadataValue::try_from(format!("Bearer {t}")).unwrap(),
            );
        }
        req
    }

    #[test]
    fn prefixes_match_from_the_start_of_the_name() {
        let p = policy();
        assert!(p
            .check("alice", Permission::Lock, "acquire", Some("orders/1"))
            .is_ok());
        assert!(p
            .check("alice", Permission::Read, "describe", Some("shared/x"))
            .is_ok());
        let err = p
            .check("alice", Permission::Lock, "acquire", Some("jobs/orders/1"))
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::PermissionDenied);
        assert!(
            err.message().contains("\"jobs/orders/1\"") && err.message().contains("[\"orders/\"]"),
            "{}",
            err.message()
        );
        // Read on shared/ is not lock on shared/.
        assert!(p
            .check("alice", Permission::Lock, "acquire", Some("shared/x"))
            .is_err());
    }

    #[test]
    fn what_is_not_granted_is_denied() {
        let p = policy();
        // Known identity without that permission, unknown identity, no grant at all.
        assert!(p
            .check("root", Permission::Lock, "acquire", Some("orders/1"))
            .is_err());
        assert!(p
            .check("nobody", Permission::Read, "describe", Some(""))
            .is_err());
        let err = p
            .check("nobody", Permission::Read, "describe", Some("a"))
            .unwrap_err();
        assert!(err.message().contains("prefixes []"), "{}", err.message());
    }

    #[test]
    fn admin_is_only_for_admins() {
        let p = policy();
        let err = p
            .check("alice", Permission::Admin, "ChangeMembership", None)
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::PermissionDenied);
        assert!(err.message().contains("ChangeMembership") && err.message().contains("admin"));
        assert!(p
            .check("root", Permission::Admin, "ChangeMembership", None)
            .is_ok());
        // Certificate names map to roles through [identities].
        assert!(p
            .check("ops-cert", Permission::Admin, "AddLearner", None)
            .is_ok());
    }

    #[test]
    fn tokens_identify_and_unknown_ones_are_unauthenticated() {
        let p = policy();
        assert_eq!(p.token_identity("alice-secret"), Some("alice"));
        assert_eq!(p.token_identity("alice-secreT"), None);
        let id = identify(&p, request(Some("root-secret")).metadata(), None, false).unwrap();
        assert_eq!(id, "root");
        for req in [request(Some("wrong")), request(None)] {
            let err = identify(&p, req.metadata(), None, false).unwrap_err();
            assert_eq!(err.code(), tonic::Code::Unauthenticated);
        }
    }

    #[test]
    fn a_forwarded_identity_is_trusted_only_on_the_peer_port() {
        let p = policy();
        let mut req = request(None);
        req.metadata_mut()
            .insert(FORWARDED_IDENTITY, MetadataValue::from_static("alice"));
        assert!(identify(&p, req.metadata(), None, false).is_err());
        assert_eq!(identify(&p, req.metadata(), None, true).unwrap(), "alice");
        // A certificate's principal identifies when no token is sent.
        let cert = Principal("ops-cert".into());
        assert_eq!(
            identify(&p, request(None).metadata(), Some(&cert), false).unwrap(),
            "ops-cert"
        );
    }

    #[test]
    fn the_certificate_name_is_the_client_san_else_the_cn() {
        use crate::security::tls::certificate_name;
        assert_eq!(
            certificate_name(["spiffe://x", "fenced://client/app1"], Some("cn")),
            Some("app1".into())
        );
        assert_eq!(certificate_name([], Some("cn")), Some("cn".into()));
        assert_eq!(certificate_name(["fenced://client/"], None), None);
    }

    #[test]
    fn constant_time_eq_compares_every_byte() {
        let a = hash_token("a");
        let mut b = a;
        assert!(constant_time_eq(&a, &b));
        b[31] ^= 1;
        assert!(!constant_time_eq(&a, &b));
        b = a;
        b[0] ^= 0x80;
        assert!(!constant_time_eq(&a, &b));
    }

    #[test]
    fn bad_files_name_the_field_or_line() {
        for (text, needle) in [
            (
                "[[token]]\nname = \"a\"\nsha256 = \"zz\"\n",
                "token[0].sha256",
            ),
            (
                &format!(
                    "[[token]]\nname = \"a\"\nsha256 = \"{}\"\nroles = [\"nope\"]\n",
                    "0".repeat(64)
                ),
                "token[0].roles: role \"nope\"",
            ),
            ("[identities]\nx = [\"nope\"]\n", "identities.x"),
            ("[roles.a]\nlokc = [\"x\"]\n", "line 2"),
            ("[[token]]\nname = \"\"\nsha256 = \"\"\n", "token[0].name"),
        ] {
            let err = toml::from_str::<AuthFile>(text)
                .map_err(|e| e.to_string())
                .and_then(|f| Policy::from_files(vec![("f".into(), f)]));
            let err = err.unwrap_err();
            assert!(err.contains(needle), "{text}: {err}");
        }
    }

    #[test]
    fn a_bad_file_on_reload_keeps_the_policy_in_force() {
        let dir = tempfile::tempdir().unwrap();
        let tokens_path = dir.path().join("tokens.toml");
        let policy_path = dir.path().join("policy.toml");
        std::fs::write(&tokens_path, tokens("alice-secret")).unwrap();
        std::fs::write(&policy_path, POLICY).unwrap();
        let auth = Auth::load(AuthConfig {
            tokens: Some(tokens_path.clone()),
            policy: Some(policy_path),
        })
        .unwrap();
        let call = |auth: &Auth, token: &str| {
            auth.authorize(
                &request(Some(token)),
                false,
                Permission::Lock,
                "acquire",
                Some("orders/1"),
            )
        };
        assert_eq!(
            call(&auth, "alice-secret").unwrap().as_deref(),
            Some("alice")
        );
        std::fs::write(&tokens_path, "[[token]]\nname = 3\n").unwrap();
        assert!(auth.reload().is_err());
        assert!(call(&auth, "alice-secret").is_ok(), "the old policy stays");
        // A good file replaces it: the old token is revoked.
        std::fs::write(&tokens_path, tokens("alice-new")).unwrap();
        auth.reload().unwrap();
        let err = call(&auth, "alice-secret").unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unauthenticated);
        assert!(call(&auth, "alice-new").is_ok());
    }

    #[test]
    fn with_auth_off_every_call_passes() {
        let auth = Auth::disabled();
        assert_eq!(
            auth.authorize(&request(None), false, Permission::Admin, "AddLearner", None)
                .unwrap(),
            None
        );
    }
}
