//! A lock server that plays one scene, for the client's tests.

#![allow(dead_code)]

use std::{
    collections::HashSet,
    net::SocketAddr,
    sync::{Arc, Mutex},
};

use fenced_proto::v1::{self, acquire_response, lock_server, release_response, session_response};
use tonic::{
    transport::{server::TcpIncoming, Server},
    Request, Response, Status,
};

/// What the server does with an acquire.
#[derive(Clone, Copy)]
pub enum Scene {
    /// Every acquire: `Ended { released }`.
    Spent,
    /// An owner id's first acquire is granted (`GRANTED_TOKEN`) but never
    /// answered, as if the reply were lost; asked again, the same grant.
    FirstAnswerLost,
}

pub const GRANTED_TOKEN: u64 = 7;

/// (owner id, token) of a release received.
pub type ReleaseSeen = (Vec<u8>, u64);

#[derive(Clone)]
pub struct FakeLock {
    scene: Scene,
    /// Owner ids of every acquire received.
    pub asked: Arc<Mutex<HashSet<Vec<u8>>>>,
    /// (owner id, token) of every release received.
    pub releases: Arc<Mutex<Vec<ReleaseSeen>>>,
}

impl FakeLock {
    /// Serves the scene on a loopback port.
    pub async fn serve(scene: Scene) -> (FakeLock, SocketAddr) {
        let fake = FakeLock {
            scene,
            asked: Arc::default(),
            releases: Arc::default(),
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(
            Server::builder()
                .add_service(lock_server::LockServer::new(fake.clone()))
                .serve_with_incoming(TcpIncoming::from(listener)),
        );
        (fake, addr)
    }

    async fn answer(&self, owner_id: Vec<u8>) -> Result<Response<v1::AcquireResponse>, Status> {
        let outcome = match self.scene {
            Scene::Spent => acquire_response::Outcome::Ended(v1::Ended {
                reason: v1::LostReason::Released as i32,
                current_token: 0,
            }),
            Scene::FirstAnswerLost => {
                let first = self.asked.lock().unwrap().insert(owner_id);
                if first {
                    std::future::pending::<()>().await;
                }
                acquire_response::Outcome::Granted(v1::Granted {
                    token: GRANTED_TOKEN,
                    expires_at_ms: 60_000,
                    ttl_ms: 60_000,
                })
            }
        };
        Ok(Response::new(v1::AcquireResponse {
            outcome: Some(outcome),
            cluster_time_ms: 1,
            wall_time_unix_ms: 0,
        }))
    }

    fn session_alive() -> Result<Response<v1::SessionResponse>, Status> {
        Ok(Response::new(v1::SessionResponse {
            outcome: Some(session_response::Outcome::Alive(v1::SessionAlive {
                expires_at_ms: 60_000,
                ttl_ms: 60_000,
                leases: 0,
            })),
            cluster_time_ms: 1,
            wall_time_unix_ms: 0,
        }))
    }
}

fn not_here() -> Status {
    Status::unimplemented("not in this test")
}

#[tonic::async_trait]
impl lock_server::Lock for FakeLock {
    async fn acquire(
        &self,
        req: Request<v1::AcquireRequest>,
    ) -> Result<Response<v1::AcquireResponse>, Status> {
        self.answer(req.into_inner().owner_id).await
    }
    async fn renew(
        &self,
        _: Request<v1::RenewRequest>,
    ) -> Result<Response<v1::RenewResponse>, Status> {
        Err(not_here())
    }
    async fn renew_many(
        &self,
        _: Request<v1::RenewManyRequest>,
    ) -> Result<Response<v1::RenewManyResponse>, Status> {
        Err(not_here())
    }
    async fn release(
        &self,
        req: Request<v1::ReleaseRequest>,
    ) -> Result<Response<v1::ReleaseResponse>, Status> {
        let req = req.into_inner();
        self.releases
            .lock()
            .unwrap()
            .push((req.owner_id, req.token));
        Ok(Response::new(v1::ReleaseResponse {
            outcome: Some(release_response::Outcome::Released(v1::Released {})),
            cluster_time_ms: 1,
            wall_time_unix_ms: 0,
        }))
    }
    async fn open_session(
        &self,
        _: Request<v1::OpenSessionRequest>,
    ) -> Result<Response<v1::SessionResponse>, Status> {
        match self.scene {
            Scene::Spent => Err(not_here()),
            Scene::FirstAnswerLost => FakeLock::session_alive(),
        }
    }
    async fn acquire_in_session(
        &self,
        req: Request<v1::AcquireInSessionRequest>,
    ) -> Result<Response<v1::AcquireResponse>, Status> {
        self.answer(req.into_inner().owner_id).await
    }
    async fn keep_alive(
        &self,
        _: Request<v1::KeepAliveRequest>,
    ) -> Result<Response<v1::SessionResponse>, Status> {
        FakeLock::session_alive()
    }
    async fn close_session(
        &self,
        _: Request<v1::CloseSessionRequest>,
    ) -> Result<Response<v1::CloseSessionResponse>, Status> {
        Err(not_here())
    }
    async fn describe(
        &self,
        _: Request<v1::DescribeRequest>,
    ) -> Result<Response<v1::DescribeResponse>, Status> {
        Err(not_here())
    }
    async fn validate_token(
        &self,
        _: Request<v1::ValidateTokenRequest>,
    ) -> Result<Response<v1::ValidateTokenResponse>, Status> {
        Err(not_here())
    }
    async fn validate_tokens(
        &self,
        _: Request<v1::ValidateTokensRequest>,
    ) -> Result<Response<v1::ValidateTokensResponse>, Status> {
        Err(not_here())
    }
    type WatchStream = tonic::codegen::BoxStream<v1::WatchResponse>;
    async fn watch(
        &self,
        _: Request<v1::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        Err(not_here())
    }
    async fn history(
        &self,
        _: Request<v1::HistoryRequest>,
    ) -> Result<Response<v1::HistoryResponse>, Status> {
        Err(not_here())
    }
}
