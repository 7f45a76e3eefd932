//! TLS on both ports (rustls, ring provider).
//!
//! Names (docs/DECISIONS.md, "Certificates name nodes and clients by URI"):
//! a node's certificate carries the SAN URI `fenced://node/<id>` beside the
//! DNS names and addresses its ports are reached by; a client's carries
//! `fenced://client/<name>`. The client port takes any certificate the CA
//! signed (optional unless `--client-cert-auth`). The peer port requires
//! one, and its [`MemberVerifier`] refuses, during the handshake, any
//! certificate that does not name a node of the current membership.

use std::{
    collections::{BTreeMap, BTreeSet},
    io,
    net::SocketAddr,
    path::{Path, PathBuf},
    pin::Pin,
    sync::{Arc, Mutex, PoisonError, RwLock},
    task::{Context, Poll},
    time::{Duration, Instant},
};

use rustls::{
    client::danger::HandshakeSignatureValid,
    crypto::CryptoProvider,
    pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime},
    server::{
        danger::{ClientCertVerified, ClientCertVerifier},
        WebPkiClientVerifier,
    },
    ClientConfig, DigitallySignedStruct, DistinguishedName, RootCertStore, ServerConfig,
    SignatureScheme,
};
use rustls_pki_types::pem::PemObject;
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::{TcpListener, TcpStream},
    sync::{mpsc, Notify},
};
use tokio_rustls::{TlsAcceptor, TlsConnector};
use tokio_util::sync::CancellationToken;

use crate::{
    prefixed::Prefixed,
    security::admission::Admission,
    security::limits::{ConnectionLimit, Limited},
    security::revocation::Revocations,
    types::{NodeId, Raft},
};

/// The SAN URI prefix of a node's certificate; the node id follows.
pub const NODE_URI: &str = "fenced://node/";
/// The SAN URI prefix of a client's certificate; the client name follows.
pub const CLIENT_URI: &str = "fenced://client/";
/// The SAN URI prefix of another service's server certificate.
pub const SERVER_URI: &str = "fenced://server/";
/// How long a TLS handshake may take before the connection is dropped: a
/// real one takes a few round trips, a silent socket is cut off soon.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(3);

/// Where a node's TLS material lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSettings {
    /// This node's certificate chain (PEM), leaf first.
    pub cert: PathBuf,
    /// Its private key (PEM).
    pub key: PathBuf,
    /// The CA that signs every node's and client's certificate (PEM).
    pub ca: PathBuf,
    /// Require a client certificate on the client port.
    pub client_cert_auth: bool,
    /// The deny list of revoked certificates ([`crate::security::revocation`]).
    pub deny: Option<PathBuf>,
}

/// The node ids a peer's certificate may name: voters and learners of the
/// current membership, kept up to date from the Raft metrics, and the ids
/// vouched for by a member whose membership is newer than this node's
/// (docs/DECISIONS.md, "A lagging node admits a newer member it is vouched
/// for").
#[derive(Debug, Clone, Default)]
pub struct Members(Arc<MembersInner>);

#[derive(Debug, Default)]
struct MembersInner {
    view: RwLock<View>,
    probes: Mutex<Probes>,
    wake: Notify,
    /// The certificates revoked before they expire (none until set).
    revocations: std::sync::OnceLock<Arc<Revocations>>,
}

/// This node's membership view and the ids vouched for beyond it.
#[derive(Debug, Default)]
struct View {
    /// This node's own id, once known.
    me: Option<NodeId>,
    /// `None` while this node knows no membership yet.
    ids: Option<BTreeSet<NodeId>>,
    /// The voters among `ids`: the only nodes that may send votes, appends
    /// and snapshots ([`crate::replication::sender`]).
    voters: BTreeSet<NodeId>,
    /// The log index of the membership `ids` come from (0: none).
    index: u64,
    /// A joining node's view before any membership reaches its log: the
    /// members (and voters) of the cluster it joins, as their nodes
    /// answered ([`Members::seed`]).
    seeded: Option<(BTreeSet<NodeId>, BTreeSet<NodeId>)>,
    /// Ids outside `ids` admitted on the members' word: who vouched, the
    /// log index of the membership they named them in, and whether it
    /// named them voters.
    vouched: BTreeMap<NodeId, Vouched>,
    /// Node ids a committed membership change removed, as this node applied
    /// them: refused whatever the view, vouches and seeds say.
    retired: BTreeSet<NodeId>,
}

/// An id admitted beyond this node's view.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Vouched {
    by: BTreeSet<NodeId>,
    index: u64,
    voter: bool,
}

/// Ids refused since the last probe round, and when each was last asked
/// about (at most once per [`PROBE_INTERVAL`]).
#[derive(Debug, Default)]
struct Probes {
    pending: BTreeSet<NodeId>,
    asked: BTreeMap<NodeId, Instant>,
}

/// How often one refused id may be asked about, and the least time between
/// two probe rounds.
pub const PROBE_INTERVAL: Duration = Duration::from_secs(1);
/// At most this many refused ids are asked about per [`PROBE_INTERVAL`];
/// the others are refused without asking.
pub const MAX_PROBED_IDS: usize = 16;

impl Members {
    /// Replaces the view with `ids`, all voters, at membership index 0
    /// (tests).
    pub fn set(&self, ids: Option<BTreeSet<NodeId>>) {
        let voters = ids.clone().unwrap_or_default();
        self.set_view(ids, voters, 0);
    }

    /// Replaces the view with `ids` (of which `voters` vote), the
    /// membership at log `index`. A vouched id is dropped once the view is
    /// as new as the membership it was vouched from: from then on the view
    /// alone decides.
    pub fn set_view(&self, ids: Option<BTreeSet<NodeId>>, voters: BTreeSet<NodeId>, index: u64) {
        let mut view = self.0.view.write().unwrap_or_else(PoisonError::into_inner);
        view.vouched
            .retain(|id, v| v.index > index && !ids.as_ref().is_some_and(|ids| ids.contains(id)));
        view.ids = ids;
        view.voters = voters;
        view.index = index;
    }

    /// A node that joins and knows no membership yet admits the members of
    /// the cluster it joins (`ids`, of which `voters` vote) instead of any
    /// node certificate; once a membership reaches its log, that decides.
    pub fn seed(&self, ids: BTreeSet<NodeId>, voters: BTreeSet<NodeId>) {
        let mut view = self.0.view.write().unwrap_or_else(PoisonError::into_inner);
        if ids.is_empty() || view.index > 0 {
            return;
        }
        if view.ids.is_none() || view.seeded.is_some() {
            tracing::info!(members = ?ids, voters = ?voters, "joining: peer certificates admitted for the members of the cluster joined");
            view.ids = Some(ids.clone());
            view.voters = voters.clone();
        }
        view.seeded = Some((ids, voters));
    }

    /// Takes the retired node ids this node applied (they only grow; a
    /// smaller set, from an older snapshot, adds to what is known).
    pub fn set_retired(&self, ids: &BTreeSet<NodeId>) {
        let mut view = self.0.view.write().unwrap_or_else(PoisonError::into_inner);
        let new: Vec<NodeId> = ids.difference(&view.retired).copied().collect();
        if new.is_empty() {
            return;
        }
        tracing::info!(nodes = ?new, "peer certificates of retired node ids refused from now on");
        view.vouched.retain(|id, _| !ids.contains(id));
        view.retired.extend(new);
    }

    /// Whether node `id` was retired: removed from the membership for good.
    pub fn is_retired(&self, id: NodeId) -> bool {
        self.0
            .view
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .retired
            .contains(&id)
    }

    /// Tells the view this node's own id (it counts as one of the voters
    /// behind a vouch when it is a voter itself).
    pub fn set_own_id(&self, id: NodeId) {
        self.0
            .view
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .me = Some(id);
    }

    /// The log index of the membership this node's view comes from.
    pub fn view_index(&self) -> u64 {
        self.0
            .view
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .index
    }

    /// Whether node `id` is a voter of this node's membership (or vouched
    /// for as one); `false` while this node knows no membership.
    pub fn is_known_voter(&self, id: NodeId) -> bool {
        let known = self
            .0
            .view
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .ids
            .is_some();
        known && self.is_voter(id)
    }

    /// Whether node `id` may send votes, appends and snapshots: a voter of
    /// this node's view, or one its voters' majority vouched for as a voter
    /// of a newer membership. A node that knows no membership yet takes
    /// them from any node it admits (see [`Members::admits`]).
    pub fn is_voter(&self, id: NodeId) -> bool {
        let view = self.0.view.read().unwrap_or_else(PoisonError::into_inner);
        if view.retired.contains(&id) {
            return false;
        }
        match &view.ids {
            Some(_) => view.voters.contains(&id) || view.vouched.get(&id).is_some_and(|v| v.voter),
            None => true,
        }
    }

    /// Checks every certificate against `revocations` from now on (once;
    /// later calls change nothing).
    pub fn set_revocations(&self, revocations: Arc<Revocations>) {
        let _ = self.0.revocations.set(revocations);
    }

    /// Whether any certificate is revoked now (most nodes: none, and no
    /// certificate need be looked at).
    pub fn revokes_any(&self) -> bool {
        self.0
            .revocations
            .get()
            .is_some_and(|r| !r.current().is_empty())
    }

    /// `Err` with the reason when the certificate `der` is revoked.
    pub fn revoked(&self, der: &[u8]) -> Result<(), String> {
        match self.0.revocations.get() {
            Some(r) => revoked(r, der),
            None => Ok(()),
        }
    }

    /// Whether node `id` may connect. A node that has no membership yet (a
    /// learner that has never been contacted) admits any node certificate:
    /// it holds nothing, and the leader that adds it must be let in. A node
    /// whose certificates are revoked, or whose id is retired, never.
    pub fn admits(&self, id: NodeId) -> bool {
        if self
            .0
            .revocations
            .get()
            .is_some_and(|r| r.current().denies_node(id))
        {
            return false;
        }
        let view = self.0.view.read().unwrap_or_else(PoisonError::into_inner);
        if view.retired.contains(&id) {
            return false;
        }
        match &view.ids {
            Some(ids) => ids.contains(&id) || view.vouched.contains_key(&id),
            None => true,
        }
    }

    /// Admits `id` on the word of the voters in `by`, each of whose
    /// memberships, newer than this node's view, names it (`voter`: as a
    /// voter); `index` is the oldest of those memberships. Taken only from
    /// a majority of this node's voters: one member, whatever its
    /// certificate, cannot bring in a node by itself, and a majority that
    /// has seen a membership change is the majority that made it. Only
    /// newer memberships count, so members that have not seen a removal
    /// this node has seen cannot bring the removed node back. Returns
    /// whether it admitted `id` (or raised it to a voter).
    pub fn vouch(&self, id: NodeId, by: &BTreeSet<NodeId>, index: u64, voter: bool) -> bool {
        let mut view = self.0.view.write().unwrap_or_else(PoisonError::into_inner);
        let Some(ids) = &view.ids else {
            return false;
        };
        let known = if voter {
            view.voters.contains(&id)
        } else {
            ids.contains(&id)
        };
        // This node counts with its vouchers when it votes itself: a
        // majority of the voters then stands behind the claim, as in a
        // commit, and a lagging node follows a promoted leader with one
        // voter down, as Raft alone would.
        let me_too = usize::from(view.me.is_some_and(|me| view.voters.contains(&me)));
        let vouchers = by.intersection(&view.voters).count() + me_too;
        let majority = view.voters.len() / 2 + 1;
        let already = view.vouched.get(&id).is_some_and(|v| v.voter || !voter);
        let retired = view.retired.contains(&id);
        if known || retired || index <= view.index || vouchers < majority || already {
            return false;
        }
        let own_index = view.index;
        view.vouched.insert(
            id,
            Vouched {
                by: by.clone(),
                index,
                voter,
            },
        );
        tracing::info!(
            peer_node = id,
            vouched_by = ?by,
            membership_index = index,
            own_membership_index = own_index,
            voter,
            "peer certificate admitted: a majority of the voters name node {id} in a newer membership"
        );
        true
    }

    /// Notes that `id` was refused, for the next probe round: at most once
    /// per [`PROBE_INTERVAL`] per id, and [`MAX_PROBED_IDS`] ids at a time.
    pub fn refused(&self, id: NodeId, now: Instant) {
        let mut probes = self.0.probes.lock().unwrap_or_else(PoisonError::into_inner);
        probes
            .asked
            .retain(|_, at| now.saturating_duration_since(*at) < PROBE_INTERVAL);
        if probes.asked.contains_key(&id) || probes.asked.len() >= MAX_PROBED_IDS {
            return;
        }
        probes.asked.insert(id, now);
        probes.pending.insert(id);
        drop(probes);
        self.0.wake.notify_one();
    }

    /// Waits for refused ids to ask about, and takes them.
    pub async fn next_refused(&self) -> BTreeSet<NodeId> {
        loop {
            let taken = std::mem::take(
                &mut self
                    .0
                    .probes
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .pending,
            );
            if !taken.is_empty() {
                return taken;
            }
            self.0.wake.notified().await;
        }
    }

    /// Takes the membership `raft` knows now; while it knows none, the
    /// `initial` cluster's ids (empty: none, see [`Members::admits`]).
    pub fn refresh(&self, raft: &Raft, initial: &BTreeSet<NodeId>) {
        let (mut ids, mut voters, index) = {
            let m = raft.metrics();
            let m = m.borrow();
            self.set_own_id(m.id);
            let membership = m.membership_config.membership();
            let ids: BTreeSet<NodeId> = membership.nodes().map(|(id, _)| *id).collect();
            let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
            (
                ids,
                voters,
                m.membership_config.log_id().map_or(0, |l| l.index),
            )
        };
        if ids.is_empty() {
            // The cluster this node is initialised with: all voters; or, for
            // a node that joins, the cluster it joins.
            ids.clone_from(initial);
            voters.clone_from(initial);
            if ids.is_empty() {
                let view = self.0.view.read().unwrap_or_else(PoisonError::into_inner);
                if let Some((seeded, seeded_voters)) = &view.seeded {
                    ids.clone_from(seeded);
                    voters.clone_from(seeded_voters);
                }
            }
        }
        let ids = (!ids.is_empty()).then_some(ids);
        let (current, current_voters, current_index) = {
            let view = self.0.view.read().unwrap_or_else(PoisonError::into_inner);
            (view.ids.clone(), view.voters.clone(), view.index)
        };
        if ids != current || voters != current_voters || index != current_index {
            if ids != current || voters != current_voters {
                tracing::info!(members = ?ids, voters = ?voters, membership_index = index, "peer certificates admitted for these node ids");
            }
            self.set_view(ids, voters, index);
        }
    }

    /// Follows `raft`'s membership until `stop`.
    pub async fn follow(self, raft: Raft, initial: BTreeSet<NodeId>, stop: CancellationToken) {
        let mut metrics = raft.metrics();
        loop {
            metrics.borrow_and_update();
            self.refresh(&raft, &initial);
            tokio::select! {
                _ = stop.cancelled() => return,
                r = metrics.changed() => if r.is_err() { return },
            }
        }
    }
}

/// The SAN URIs of a DER certificate; empty when it has none or does not
/// parse (the chain was verified before this is asked).
pub fn san_uris(cert: &[u8]) -> Vec<String> {
    let Ok((_, parsed)) = x509_parser::parse_x509_certificate(cert) else {
        return Vec::new();
    };
    let Ok(Some(san)) = parsed.subject_alternative_name() else {
        return Vec::new();
    };
    san.value
        .general_names
        .iter()
        .filter_map(|n| match n {
            x509_parser::extensions::GeneralName::URI(u) => Some(u.to_string()),
            _ => None,
        })
        .collect()
}

/// The identity a verified client certificate names: the first URI SAN of
/// the form `fenced://client/<name>`, else the subject's common name.
pub fn certificate_name<'a>(
    uri_sans: impl IntoIterator<Item = &'a str>,
    common_name: Option<&str>,
) -> Option<String> {
    uri_sans
        .into_iter()
        .find_map(|san| san.strip_prefix(CLIENT_URI))
        .filter(|name| !name.is_empty())
        .or(common_name.filter(|cn| !cn.is_empty()))
        .map(str::to_string)
}

/// The identity a verified client certificate gives its caller
/// ([`certificate_name`]: the `fenced://client/<name>` URI, else the
/// subject's common name).
pub fn client_name(cert: &[u8]) -> Option<String> {
    let Ok((_, parsed)) = x509_parser::parse_x509_certificate(cert) else {
        return None;
    };
    let uris = san_uris(cert);
    let cn = parsed
        .subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok());
    certificate_name(uris.iter().map(String::as_str), cn)
}

/// `Err` with the reason when `revocations` lists the certificate `der`
/// (its serial, its node or its client name). Nothing is parsed while the
/// list is empty.
pub fn revoked(revocations: &Revocations, der: &[u8]) -> Result<(), String> {
    let list = revocations.current();
    if list.is_empty() {
        return Ok(());
    }
    let serial = x509_parser::parse_x509_certificate(der).ok().map(|(_, c)| {
        c.tbs_certificate
            .raw_serial()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    });
    match list.denies(
        serial.as_deref(),
        node_id_of(der),
        client_name(der).as_deref(),
    ) {
        Some(why) => Err(why),
        None => Ok(()),
    }
}

/// The node id a certificate names (`fenced://node/<id>`), if exactly one.
pub fn node_id_of(cert: &[u8]) -> Option<NodeId> {
    let ids: Vec<NodeId> = san_uris(cert)
        .iter()
        .filter_map(|u| u.strip_prefix(NODE_URI)?.parse().ok())
        .collect();
    match ids.as_slice() {
        [id] => Some(*id),
        _ => None,
    }
}

/// The peer port's client-certificate check: the chain must lead to the CA
/// (webpki) and the certificate must name a current member.
#[derive(Debug)]
pub struct MemberVerifier {
    chain: Arc<dyn ClientCertVerifier>,
    members: Members,
}

impl ClientCertVerifier for MemberVerifier {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.chain.root_hint_subjects()
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.chain
            .verify_client_cert(end_entity, intermediates, now)?;
        if let Err(why) = self.members.revoked(end_entity) {
            tracing::warn!(reason = %why, "peer certificate refused: revoked");
            return Err(rustls::Error::General(format!(
                "certificate revoked: {why}"
            )));
        }
        match node_id_of(end_entity) {
            Some(id) if self.members.is_retired(id) => {
                tracing::warn!(
                    peer_node = id,
                    "peer certificate refused: node {id} is retired (removed from the membership)"
                );
                Err(rustls::Error::General(format!(
                    "node {id} is retired: a removed node id never returns"
                )))
            }
            Some(id) if self.members.admits(id) => Ok(ClientCertVerified::assertion()),
            Some(id) => {
                tracing::warn!(
                    peer_node = id,
                    "peer certificate refused: node {id} is not a member"
                );
                // It may have joined after this node's view: ask the members.
                self.members.refused(id, Instant::now());
                Err(rustls::Error::General(format!("node {id} is not a member")))
            }
            None => {
                tracing::warn!(
                    uris = ?san_uris(end_entity),
                    "peer certificate refused: it names no node ({NODE_URI}<id>)"
                );
                Err(rustls::Error::General(
                    "the certificate names no node".into(),
                ))
            }
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.chain.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.chain.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.chain.supported_verify_schemes()
    }
}

/// The client and metrics ports' check: the chain (webpki), then the deny
/// list ([`crate::security::revocation`]).
#[derive(Debug)]
pub struct RevokingVerifier {
    chain: Arc<dyn ClientCertVerifier>,
    members: Members,
}

impl ClientCertVerifier for RevokingVerifier {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.chain.root_hint_subjects()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.chain.client_auth_mandatory()
    }

    fn offer_client_auth(&self) -> bool {
        self.chain.offer_client_auth()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .chain
            .verify_client_cert(end_entity, intermediates, now)?;
        self.members.revoked(end_entity).map_err(|why| {
            tracing::warn!(reason = %why, "client certificate refused: revoked");
            rustls::Error::General(format!("certificate revoked: {why}"))
        })?;
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.chain.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.chain.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.chain.supported_verify_schemes()
    }
}

/// A node's TLS: acceptors for its two ports, a connector to its peers.
#[derive(Clone)]
pub struct NodeTls {
    /// The client port.
    pub client: TlsAcceptor,
    /// The peer port: mutual TLS, members only.
    pub peer: TlsAcceptor,
    /// `/metrics` over HTTPS (HTTP/1.1), client certificates optional.
    pub metrics: TlsAcceptor,
    /// Raft connections to peers, with this node's certificate.
    pub connector: TlsConnector,
    pub members: Members,
    /// PEM, for the gRPC channels that forward to the leader.
    pub ca_pem: Vec<u8>,
    pub cert_pem: Vec<u8>,
    pub key_pem: Vec<u8>,
}

impl std::fmt::Debug for NodeTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeTls").finish_non_exhaustive()
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read(what: &str, path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("{what} {}: {e}", path.display()))
}

/// Every certificate in a PEM file.
pub fn certs_of(
    what: &str,
    path: &Path,
    pem: &[u8],
) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{what} {}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{what} {}: no certificate in it", path.display()));
    }
    Ok(certs)
}

/// Builds the acceptors and connector from the PEM files.
pub fn load(settings: &TlsSettings, members: Members) -> Result<NodeTls, String> {
    let ca_pem = read("tls_ca", &settings.ca)?;
    let cert_pem = read("tls_cert", &settings.cert)?;
    let key_pem = read("tls_key", &settings.key)?;
    let mut roots = RootCertStore::empty();
    for ca in certs_of("tls_ca", &settings.ca, &ca_pem)? {
        roots
            .add(ca)
            .map_err(|e| format!("tls_ca {}: {e}", settings.ca.display()))?;
    }
    let roots = Arc::new(roots);
    let chain = certs_of("tls_cert", &settings.cert, &cert_pem)?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem)
        .map_err(|e| format!("tls_key {}: {e}", settings.key.display()))?;
    let bad = |what: &str, e: &dyn std::fmt::Display| format!("{what}: {e}");

    let server =
        |verifier: Arc<dyn ClientCertVerifier>, alpn: &[&[u8]]| -> Result<TlsAcceptor, String> {
            let mut cfg = ServerConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .map_err(|e| bad("tls", &e))?
                .with_client_cert_verifier(verifier)
                .with_single_cert(chain.clone(), key.clone_key())
                .map_err(|e| bad("tls_cert/tls_key", &e))?;
            // gRPC clients require HTTP/2 by ALPN; Raft connections offer none;
            // JSON callers on the client port may speak HTTP/1.1.
            cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
            Ok(TlsAcceptor::from(Arc::new(cfg)))
        };
    let webpki = |optional: bool| {
        let b = WebPkiClientVerifier::builder_with_provider(Arc::clone(&roots), provider());
        if optional {
            b.allow_unauthenticated()
        } else {
            b
        }
        .build()
        .map_err(|e| bad("tls_ca", &e))
    };
    let verifier = |optional: bool| -> Result<Arc<dyn ClientCertVerifier>, String> {
        Ok(Arc::new(RevokingVerifier {
            chain: webpki(optional)?,
            members: members.clone(),
        }))
    };
    let member_verifier = Arc::new(MemberVerifier {
        chain: webpki(false)?,
        members: members.clone(),
    });
    let connector = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| bad("tls", &e))?
        .with_root_certificates(Arc::clone(&roots))
        .with_client_auth_cert(chain.clone(), key.clone_key())
        .map_err(|e| bad("tls_cert/tls_key", &e))?;
    Ok(NodeTls {
        client: server(verifier(!settings.client_cert_auth)?, &[b"h2", b"http/1.1"])?,
        peer: server(member_verifier, &[b"h2"])?,
        metrics: server(verifier(true)?, &[b"http/1.1"])?,
        connector: TlsConnector::from(Arc::new(connector)),
        members,
        ca_pem,
        cert_pem,
        key_pem,
    })
}

/// The server name to check a peer's certificate against: the host part
/// of its `host:port` address.
pub fn server_name(addr: &str) -> io::Result<ServerName<'static>> {
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    ServerName::try_from(host.to_string()).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{addr}: not a TLS server name: {e}"),
        )
    })
}

/// Accepts on `listener`, handshakes each connection on its own task, and
/// hands the finished ones to tonic (for the client port). Until its
/// handshake is done and it has sent the HTTP/2 preface (it speaks gRPC) a
/// connection holds only a pending slot of `admission` (the oldest is
/// closed to make room); then it takes a slot of `limit`, or is closed at
/// once when all are taken.
pub fn incoming(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    admission: Admission,
    limit: ConnectionLimit,
    stop: CancellationToken,
) -> tokio_stream::wrappers::ReceiverStream<
    io::Result<Limited<Prefixed<tokio_rustls::server::TlsStream<TcpStream>>>>,
> {
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        while let Some((stream, addr)) = accept_one(&listener, &stop, "client").await {
            let Some(pending) = admission.enter(addr.ip()) else {
                continue;
            };
            let (acceptor, tx, limit) = (acceptor.clone(), tx.clone(), limit.clone());
            tokio::spawn(async move {
                let spoken = tokio::select! {
                    _ = pending.evicted() => return,
                    s = handshake_and_preface(&acceptor, stream, addr) => s,
                };
                drop(pending);
                let Some(tls) = spoken else { return };
                let Some(permit) = limit.admit() else { return };
                let _ = tx.send(Ok(limit.wrap(tls, permit))).await;
            });
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

/// What every HTTP/2 client sends first.
const HTTP2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Whether the first bytes of a connection are a request's: the HTTP/2
/// preface (gRPC, or JSON over HTTP/2), or an HTTP/1.1 request line (JSON):
/// a method of 3 to 7 capitals, a space and a path.
pub(crate) fn opens_a_request(head: &[u8; 24]) -> bool {
    if head == HTTP2_PREFACE {
        return true;
    }
    let method = head.iter().take_while(|b| b.is_ascii_uppercase()).count();
    (3..=7).contains(&method) && head.get(method..method + 2) == Some(b" /")
}

/// The handshake, then the first bytes of a request within
/// [`HANDSHAKE_TIMEOUT`] more; `None` when either fails, takes too long or
/// is something else.
async fn handshake_and_preface(
    acceptor: &TlsAcceptor,
    stream: TcpStream,
    addr: SocketAddr,
) -> Option<Prefixed<tokio_rustls::server::TlsStream<TcpStream>>> {
    use tokio::io::AsyncReadExt;
    let mut tls = handshake(acceptor, stream, addr, "client").await?;
    let mut head = [0u8; HTTP2_PREFACE.len()];
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.read_exact(&mut head)).await {
        Ok(Ok(_)) if opens_a_request(&head) => Some(Prefixed::new(head.to_vec(), tls)),
        Ok(Ok(_)) => {
            tracing::debug!(remote = %addr, "not HTTP after the handshake; connection closed");
            None
        }
        Ok(Err(_)) | Err(_) => None,
    }
}

/// The next connection on `listener`, Nagle off; `None` once `stop` is
/// cancelled. Accept errors (out of descriptors and the like) are logged
/// and waited out.
pub async fn accept_one(
    listener: &TcpListener,
    stop: &CancellationToken,
    port: &str,
) -> Option<(TcpStream, SocketAddr)> {
    loop {
        let accepted = tokio::select! {
            _ = stop.cancelled() => return None,
            a = listener.accept() => a,
        };
        match accepted {
            Ok((stream, addr)) => {
                // Nagle's algorithm would hold small replies behind
                // unacknowledged ones and add latency to every call.
                let _ = stream.set_nodelay(true);
                return Some((stream, addr));
            }
            Err(e) => {
                tracing::warn!(port, error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// The server side of a handshake, bounded in time; a failure is logged
/// (a peer that tries a wrong certificate is worth a warning).
pub async fn handshake(
    acceptor: &TlsAcceptor,
    stream: TcpStream,
    addr: SocketAddr,
    port: &str,
) -> Option<tokio_rustls::server::TlsStream<TcpStream>> {
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
        Ok(Ok(tls)) => Some(tls),
        Ok(Err(e)) => {
            tracing::warn!(remote = %addr, port, error = %e, "TLS handshake refused");
            None
        }
        Err(_) => {
            tracing::debug!(remote = %addr, port, "TLS handshake timed out");
            None
        }
    }
}

/// A peer-port connection, plain or TLS, either side.
pub enum PeerStream {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::TlsStream<TcpStream>>),
}

impl PeerStream {
    /// The node id the other side's certificate names (TLS only).
    pub fn peer_node(&self) -> Option<NodeId> {
        node_id_of(self.certificates()?.first()?)
    }

    fn certificates(&self) -> Option<&[CertificateDer<'static>]> {
        let PeerStream::Tls(s) = self else {
            return None;
        };
        match &**s {
            tokio_rustls::TlsStream::Client(c) => c.get_ref().1.peer_certificates(),
            tokio_rustls::TlsStream::Server(c) => c.get_ref().1.peer_certificates(),
        }
    }

    fn tcp(&self) -> &TcpStream {
        match self {
            PeerStream::Plain(s) => s,
            PeerStream::Tls(s) => s.get_ref().0,
        }
    }

    /// The other side's certificates (TLS only).
    pub fn peer_certs(&self) -> Option<Arc<Vec<CertificateDer<'static>>>> {
        self.certificates().map(|c| Arc::new(c.to_vec()))
    }
}

macro_rules! both {
    ($self:ident, $s:ident => $e:expr) => {
        match $self.get_mut() {
            PeerStream::Plain($s) => {
                let $s = Pin::new($s);
                $e
            }
            PeerStream::Tls($s) => {
                let $s = Pin::new(&mut **$s);
                $e
            }
        }
    };
}

impl AsyncRead for PeerStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        both!(self, s => s.poll_read(cx, buf))
    }
}

impl AsyncWrite for PeerStream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, b: &[u8]) -> Poll<io::Result<usize>> {
        both!(self, s => s.poll_write(cx, b))
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        both!(self, s => s.poll_flush(cx))
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        both!(self, s => s.poll_shutdown(cx))
    }
}

/// A peer-port connection routed to gRPC, with the bytes read to route it
/// given back first.
pub type Routed = Prefixed<Limited<PeerStream>>;

/// What the gRPC services on the peer port learn of a connection.
#[derive(Debug, Clone)]
pub struct PeerConnectInfo {
    pub remote_addr: Option<SocketAddr>,
    /// The other node's certificates, with TLS.
    pub certs: Option<Arc<Vec<CertificateDer<'static>>>>,
}

impl tonic::transport::server::Connected for PeerStream {
    type ConnectInfo = PeerConnectInfo;

    fn connect_info(&self) -> PeerConnectInfo {
        PeerConnectInfo {
            remote_addr: self.tcp().peer_addr().ok(),
            certs: self.peer_certs(),
        }
    }
}

/// Connects to a peer at `addr` (node `target`): TCP, then TLS with this
/// node's certificate when `tls` is set. The answering certificate must
/// name `target`, so a node never takes another's answers for its peer's.
pub async fn connect_peer(
    tls: Option<&NodeTls>,
    target: NodeId,
    addr: &str,
    stream: TcpStream,
) -> io::Result<PeerStream> {
    connect_node(tls, Some(target), addr, stream).await
}

/// Like [`connect_peer`]; with no `target` (a joining node asking the
/// cluster it joins, whose ids it does not know yet) any node's
/// certificate answers. Either way the certificate must chain to the CA,
/// be valid for `addr`'s host, name a node and not be revoked.
pub async fn connect_node(
    tls: Option<&NodeTls>,
    target: Option<NodeId>,
    addr: &str,
    stream: TcpStream,
) -> io::Result<PeerStream> {
    let Some(tls) = tls else {
        return Ok(PeerStream::Plain(stream));
    };
    let expected = || target.map_or_else(|| "a node".to_string(), |t| format!("node {t}"));
    let name = server_name(addr)?;
    let s = tls.connector.connect(name, stream).await.map_err(|e| {
        io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("TLS handshake with {} at {addr} failed: {e}", expected()),
        )
    })?;
    let s = PeerStream::Tls(Box::new(tokio_rustls::TlsStream::Client(s)));
    if let Some(Err(why)) = s
        .certificates()
        .and_then(|c| c.first())
        .map(|c| tls.members.revoked(c))
    {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("{addr} answered with a revoked certificate: {why}"),
        ));
    }
    match (s.peer_node(), target) {
        (Some(id), Some(t)) if id == t => Ok(s),
        (Some(_), None) => Ok(s),
        (other, _) => Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{addr} answered with a certificate of node {other:?}, not {}",
                expected()
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::security::certs::{self, CertsCommand};

    fn der(path: &Path) -> CertificateDer<'static> {
        CertificateDer::from_pem_file(path).unwrap()
    }

    fn head(text: &[u8]) -> [u8; 24] {
        let mut head = [0u8; 24];
        head.copy_from_slice(&text[..24]);
        head
    }

    #[test]
    fn a_client_port_connection_must_open_with_a_request() {
        assert!(opens_a_request(HTTP2_PREFACE));
        assert!(opens_a_request(&head(
            b"POST /v1/lock/acquire HTTP/1.1\r\n"
        )));
        assert!(opens_a_request(&head(b"GET /v1/openapi.json HTTP/1.1\r\n")));
        assert!(opens_a_request(&head(b"OPTIONS / HTTP/1.1\r\nHost: x\r\n")));
        // Anything else holds a pending handshake slot only until read.
        assert!(!opens_a_request(&[0u8; 24]));
        assert!(!opens_a_request(&head(b"SSH-2.0-OpenSSH_9.2p1 Debian")));
        assert!(!opens_a_request(&head(b"get /v1/lock HTTP/1.1\r\n\r\nxx")));
        assert!(!opens_a_request(&head(b"CONNECTIONS /v1/ HTTP/1.1\r\n")));
        assert!(!opens_a_request(&head(b"GET http://x/ HTTP/1.1\r\n\r\n")));
    }

    /// A CA in `dir` and the peer port's verifier over it and `members`.
    fn ca_and_verifier(dir: &Path, members: &Members) -> MemberVerifier {
        certs::run(&CertsCommand::Ca {
            dir: dir.to_path_buf(),
        })
        .unwrap();
        let mut roots = RootCertStore::empty();
        roots.add(der(&dir.join(certs::CA_CERT))).unwrap();
        MemberVerifier {
            chain: WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
                .build()
                .unwrap(),
            members: members.clone(),
        }
    }

    /// Node `id`'s certificate chain, signed by the CA in `dir`.
    fn node_cert(dir: &Path, id: NodeId) -> Vec<PathBuf> {
        certs::run(&CertsCommand::Node {
            dir: dir.to_path_buf(),
            id,
            hosts: vec![],
            days: 1,
        })
        .unwrap()
    }

    #[test]
    fn the_peer_verifier_admits_current_members_only() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        let members = Members::default();
        let verifier = ca_and_verifier(&dir, &members);
        let (n1, n4) = (node_cert(&dir, 1), node_cert(&dir, 4));
        let client = certs::run(&CertsCommand::Client {
            dir: dir.clone(),
            name: "c".into(),
            days: 1,
        })
        .unwrap();
        let verify = |p: &PathBuf| verifier.verify_client_cert(&der(p), &[], UnixTime::now());
        // No membership yet: any node of the CA, never a client.
        assert!(verify(&n4[0]).is_ok());
        assert!(verify(&client[0]).is_err());
        members.set(Some([1, 2, 3].into()));
        assert!(verify(&n1[0]).is_ok());
        let refused = verify(&n4[0]).unwrap_err().to_string();
        assert!(refused.contains("node 4 is not a member"), "{refused}");
        assert!(verify(&client[0]).is_err());
        // Membership changes take effect on the next handshake.
        members.set(Some([2, 3, 4].into()));
        assert!(verify(&n1[0]).is_err());
        assert!(verify(&n4[0]).is_ok());
    }

    #[test]
    fn a_retired_id_is_refused_whatever_the_view_says() {
        let tmp = tempfile::tempdir().unwrap();
        let members = Members::default();
        let verifier = ca_and_verifier(tmp.path(), &members);
        let n4 = node_cert(tmp.path(), 4);
        let verify = |p: &PathBuf| verifier.verify_client_cert(&der(p), &[], UnixTime::now());
        members.set_retired(&[4].into());
        // No membership yet: any node of the CA, but not a retired one.
        let refused = verify(&n4[0]).unwrap_err().to_string();
        assert!(refused.contains("node 4 is retired"), "{refused}");
        // A view that names it (a stale one) changes nothing.
        members.set(Some([1, 2, 3, 4].into()));
        assert!(verify(&n4[0]).is_err());
        assert!(!members.admits(4) && !members.is_voter(4));
        // Nor does a seed, a vouch by every voter, or a smaller set later.
        members.seed([4].into(), [4].into());
        members.set_view(Some([1, 2, 3].into()), [1, 2, 3].into(), 10);
        assert!(!members.vouch(4, &[1, 2, 3].into(), 20, true));
        members.set_retired(&BTreeSet::new());
        assert!(verify(&n4[0]).is_err());
        assert!(members.admits(1));
    }

    #[test]
    fn a_node_admits_an_id_vouched_for_by_a_majority_of_its_voters_only() {
        let members = Members::default();
        let voters: BTreeSet<NodeId> = [1, 2, 3].into();
        members.set_view(Some(voters.clone()), voters.clone(), 10);
        let by = |ids: &[NodeId]| ids.iter().copied().collect::<BTreeSet<NodeId>>();
        assert!(!members.admits(4));
        // A view as old as this node's, or older, vouches for nothing: it
        // may not have seen a removal this node has.
        assert!(!members.vouch(4, &by(&[1, 2]), 10, false));
        assert!(!members.vouch(4, &by(&[1, 2]), 7, false));
        // One voter alone, or a voter and an unknown node, is no majority.
        assert!(!members.vouch(4, &by(&[2]), 12, true));
        assert!(!members.vouch(4, &by(&[2, 9]), 12, true));
        assert!(!members.admits(4));
        // A majority naming it a learner admits it, as a learner.
        assert!(members.vouch(4, &by(&[1, 2]), 12, false));
        assert!(members.admits(4));
        assert!(!members.is_voter(4));
        // Named a voter by a majority: it may send votes and appends.
        assert!(members.vouch(4, &by(&[2, 3]), 12, true));
        assert!(members.is_voter(4));
        assert!(!members.admits(9));
        // A known member needs no vouching.
        assert!(!members.vouch(1, &by(&[2, 3]), 12, true));
        // The view catches up with the vouchers': the view alone decides,
        // here without node 4 (removed meanwhile).
        members.set_view(Some(voters.clone()), voters.clone(), 12);
        assert!(!members.admits(4));
        assert!(!members.is_voter(4));
        // After the view passed it, old vouchers' word is not taken.
        assert!(!members.vouch(4, &by(&[1, 3]), 11, false));
        assert!(!members.admits(4));
        // A view that names the vouched id takes over from the vouch.
        assert!(members.vouch(5, &by(&[1, 2, 3]), 20, false));
        members.set_view(Some([1, 2, 3, 5].into()), voters.clone(), 15);
        assert!(members.admits(5));
        members.set_view(Some(voters.clone()), voters, 16);
        assert!(
            !members.admits(5),
            "the vouch was dropped when the view named 5"
        );
    }

    #[test]
    fn a_voter_counts_itself_with_its_vouchers() {
        let members = Members::default();
        let voters: BTreeSet<NodeId> = [1, 2, 3].into();
        members.set_view(Some(voters.clone()), voters, 10);
        // Node 3 itself, one voter down: node 2's word and its own are a
        // majority of three.
        members.set_own_id(3);
        assert!(members.vouch(4, &[2].into(), 12, true));
        assert!(members.is_voter(4));
        // A learner's own count does not make one voter a majority.
        let learner = Members::default();
        learner.set_view(Some([1, 2, 3, 7].into()), [1, 2, 3].into(), 10);
        learner.set_own_id(7);
        assert!(!learner.vouch(4, &[2].into(), 12, true));
    }

    #[test]
    fn a_learner_of_the_view_is_not_a_voter_and_a_joining_node_admits_its_cluster() {
        let members = Members::default();
        // No membership at all: a fresh node takes the leader that adds it.
        assert!(members.admits(7) && members.is_voter(7));
        assert!(
            !members.is_known_voter(7),
            "no forwarded identity before a view"
        );
        // Joining: only the cluster it joins.
        members.seed([1, 2, 3, 4].into(), [1, 2, 3].into());
        assert!(members.admits(4) && !members.is_voter(4));
        assert!(!members.admits(7));
        assert!(members.is_voter(1) && members.is_known_voter(1));
        // A membership in the log replaces the seed.
        members.set_view(Some([1, 2, 3, 4].into()), [1, 2, 4].into(), 30);
        assert!(members.is_voter(4) && !members.is_voter(3));
        members.seed([1, 2, 3].into(), [1, 2, 3].into());
        assert!(
            members.is_voter(4),
            "a seed never overrides the log's membership"
        );
    }

    #[test]
    fn refused_ids_are_probed_at_most_once_a_second_and_boundedly() {
        let members = Members::default();
        members.set(Some([1, 2, 3].into()));
        let t0 = Instant::now();
        members.refused(4, t0);
        members.refused(4, t0 + Duration::from_millis(500));
        let taken = members
            .0
            .probes
            .lock()
            .unwrap()
            .pending
            .iter()
            .copied()
            .collect::<Vec<_>>();
        assert_eq!(taken, [4]);
        // A flood of ids: at most MAX_PROBED_IDS asked about per interval.
        for id in 100..200 {
            members.refused(id, t0 + Duration::from_millis(600));
        }
        let pending = members.0.probes.lock().unwrap().pending.len();
        assert_eq!(pending, MAX_PROBED_IDS);
        // A second later, the same id may be asked about again.
        members.0.probes.lock().unwrap().pending.clear();
        members.refused(4, t0 + PROBE_INTERVAL + Duration::from_millis(1));
        assert!(members.0.probes.lock().unwrap().pending.contains(&4));
    }

    #[test]
    fn a_certificate_is_revoked_by_its_serial_node_or_client_name() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        certs::run(&CertsCommand::Ca { dir: dir.clone() }).unwrap();
        let node = |id| {
            let paths = certs::run(&CertsCommand::Node {
                dir: dir.clone(),
                id,
                hosts: vec![],
                days: 1,
            })
            .unwrap();
            der(&paths[0]).to_vec()
        };
        let client = |name: &str| {
            let paths = certs::run(&CertsCommand::Client {
                dir: dir.clone(),
                name: name.into(),
                days: 1,
            })
            .unwrap();
            der(&paths[0]).to_vec()
        };
        let (n2, n3, mallory, alice) = (node(2), node(3), client("mallory"), client("alice"));
        let (_, parsed) = x509_parser::parse_x509_certificate(&n3).unwrap();
        let serial: Vec<String> = parsed
            .tbs_certificate
            .raw_serial()
            .iter()
            .map(|b| format!("{b:02X}"))
            .collect();
        let deny = dir.join("deny.toml");
        std::fs::write(
            &deny,
            format!(
                "serials = [\"{}\"]\nnodes = [2]\nclients = [\"mallory\"]\n",
                serial.join(":")
            ),
        )
        .unwrap();
        let r = Revocations::load(Some(&deny)).unwrap();
        assert!(revoked(&r, &n2).unwrap_err().contains("node 2"));
        assert!(revoked(&r, &n3).unwrap_err().contains("serial"));
        assert!(revoked(&r, &mallory).unwrap_err().contains("mallory"));
        assert!(revoked(&r, &alice).is_ok());
        assert!(revoked(&Revocations::default(), &n2).is_ok());
        let members = Members::default();
        members.set(Some([1, 2, 3].into()));
        assert!(members.admits(2));
        members.set_revocations(Arc::new(r));
        assert!(!members.admits(2), "a revoked node is admitted by no view");
        assert!(members.revokes_any());
    }

    #[test]
    fn a_peer_address_gives_its_server_name() {
        assert!(matches!(
            server_name("127.0.0.1:7201").unwrap(),
            ServerName::IpAddress(_)
        ));
        assert!(matches!(
            server_name("[::1]:7201").unwrap(),
            ServerName::IpAddress(_)
        ));
        assert!(matches!(
            server_name("fenced-1.fenced-peer:7201").unwrap(),
            ServerName::DnsName(_)
        ));
    }
}
