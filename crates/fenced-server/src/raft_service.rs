//! The receiving side of the Raft transport (peer port only).

use fenced_proto::v1::{raft_server, RaftMessage};
use serde::{de::DeserializeOwned, Serialize};
use tonic::{Request, Response, Status};

use crate::{codec, types::Raft};

pub struct RaftService {
    raft: Raft,
}

impl RaftService {
    pub fn new(raft: Raft) -> Self {
        Self { raft }
    }
}

fn decode<T: DeserializeOwned>(what: &'static str, req: Request<RaftMessage>) -> Result<T, Status> {
    codec::decode(what, &req.into_inner().payload)
        .map_err(|e| Status::invalid_argument(format!("payload: {e}")))
}

fn reply<T: Serialize>(what: &'static str, value: &T) -> Result<Response<RaftMessage>, Status> {
    let payload = codec::encode(what, value).map_err(|e| Status::internal(e.to_string()))?;
    Ok(Response::new(RaftMessage { payload }))
}

#[tonic::async_trait]
impl raft_server::Raft for RaftService {
    async fn append_entries(
        &self,
        req: Request<RaftMessage>,
    ) -> Result<Response<RaftMessage>, Status> {
        let req = decode("append_entries", req)?;
        let res = self.raft.append_entries(req).await;
        reply("append_entries", &res)
    }

    async fn vote(&self, req: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        let req = decode("vote", req)?;
        let res = self.raft.vote(req).await;
        reply("vote", &res)
    }

    async fn install_snapshot(
        &self,
        req: Request<RaftMessage>,
    ) -> Result<Response<RaftMessage>, Status> {
        let req = decode("install_snapshot", req)?;
        let res = self.raft.install_snapshot(req).await;
        reply("install_snapshot", &res)
    }
}
