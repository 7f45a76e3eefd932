//! The `Maintenance` gRPC service: `SaveSnapshot` streams a backup file
//! (crate::tools::backup) of the leader's state after a linearizable read barrier.

use std::{pin::Pin, sync::Arc};

use fenced_proto::v1::{self, maintenance_server};
use tokio::sync::Semaphore;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use crate::{
    rpc::{not_leader, NodeContext},
    security::auth::Permission,
    tools::backup,
};

/// Bytes per streamed chunk (gRPC's default message limit is 4 MiB).
pub const CHUNK_BYTES: usize = 1 << 20;

pub struct MaintenanceService {
    ctx: NodeContext,
    /// Served on the peer port, where forwarded identities are trusted.
    peer: bool,
    /// One save at a time on this node: each holds a copy of the state.
    saving: Arc<Semaphore>,
}

impl MaintenanceService {
    /// `saving` is shared by the node's two ports.
    pub fn new(ctx: NodeContext, peer: bool, saving: Arc<Semaphore>) -> Self {
        Self { ctx, peer, saving }
    }
}

type ChunkStream = Pin<Box<dyn Stream<Item = Result<v1::SnapshotChunk, Status>> + Send>>;

#[tonic::async_trait]
impl maintenance_server::Maintenance for MaintenanceService {
    type SaveSnapshotStream = ChunkStream;

    async fn save_snapshot(
        &self,
        req: Request<v1::SaveSnapshotRequest>,
    ) -> Result<Response<ChunkStream>, Status> {
        self.ctx.policy.auth.authorize(
            &req,
            self.peer,
            Permission::Admin,
            "snapshot save",
            None,
        )?;
        if let Some(leader) = self.ctx.other_leader() {
            return Err(not_leader(Some(&leader)));
        }
        let permit = Arc::clone(&self.saving).try_acquire_owned().map_err(|_| {
            Status::resource_exhausted(
                "snapshot save: one is already running on this node; retry when it ends",
            )
        })?;
        // Read index: leadership confirmed by a quorum, and everything
        // committed before the call applied, before the state is read.
        self.ctx.confirm_leadership("snapshot save").await?;
        let shared = Arc::clone(&self.ctx.replica.shared);
        let id = self.ctx.replica.id;
        let (summary, bytes) = tokio::task::spawn_blocking(move || {
            let export = shared.export()?;
            let body = backup::from_export(export, id, backup::unix_now_ms());
            let bytes = backup::encode(&body)?;
            let summary = v1::SnapshotSummary {
                total_bytes: bytes.len() as u64,
                sha256: <sha2::Sha256 as sha2::Digest>::digest(&bytes).to_vec(),
                applied_index: body.last_applied.map_or(0, |l| l.index),
                last_token: body.last_token,
                live_leases: body.live_leases,
                cluster_time_ms: body.cluster_time_ms,
                format_version: backup::FORMAT_VERSION,
            };
            Ok::<_, crate::codec::CodecError>((summary, bytes))
        })
        .await
        .map_err(|e| Status::internal(format!("snapshot save: {e}")))?
        .map_err(|e| Status::internal(format!("snapshot save: {e}")))?;
        tracing::info!(
            applied_index = summary.applied_index,
            last_token = summary.last_token,
            live_leases = summary.live_leases,
            bytes = summary.total_bytes,
            "snapshot saved for a backup"
        );
        let mut chunks = vec![v1::SnapshotChunk {
            data: Vec::new(),
            summary: Some(summary),
        }];
        chunks.extend(bytes.chunks(CHUNK_BYTES).map(|c| v1::SnapshotChunk {
            data: c.to_vec(),
            summary: None,
        }));
        let stream = tokio_stream::StreamExt::map(tokio_stream::iter(chunks), move |c| {
            // The permit goes when the stream does.
            let _held = &permit;
            Ok(c)
        });
        Ok(Response::new(Box::pin(stream)))
    }
}
