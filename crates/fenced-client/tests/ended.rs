//! A server's `Ended` answer to an acquire reaches the caller typed:
//! `AcquireOutcome::Ended` from `acquire_once`, `ClientError::AttemptEnded`
//! from `acquire` (nothing is held, so no lease is returned).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use fenced_client::{AcquireOutcome, Client, ClientError, LostReason};
use fenced_core::OwnerId;
use fenced_proto::v1::{self, acquire_response, lock_server};
use tonic::{
    transport::{server::TcpIncoming, Server},
    Request, Response, Status,
};

/// Answers every acquire `Ended { released }`.
struct Spent;

#[tonic::async_trait]
impl lock_server::Lock for Spent {
    async fn acquire(
        &self,
        _: Request<v1::AcquireRequest>,
    ) -> Result<Response<v1::AcquireResponse>, Status> {
        Ok(Response::new(v1::AcquireResponse {
            outcome: Some(acquire_response::Outcome::Ended(v1::Ended {
                reason: v1::LostReason::Released as i32,
                current_token: 0,
            })),
            cluster_time_ms: 1,
            wall_time_unix_ms: 0,
        }))
    }
    async fn renew(
        &self,
        _: Request<v1::RenewRequest>,
    ) -> Result<Response<v1::RenewResponse>, Status> {
        Err(Status::unimplemented("not in this test"))
    }
    async fn renew_many(
        &self,
        _: Request<v1::RenewManyRequest>,
    ) -> Result<Response<v1::RenewManyResponse>, Status> {
        Err(Status::unimplemented("not in this test"))
    }
    async fn release(
        &self,
        _: Request<v1::ReleaseRequest>,
    ) -> Result<Response<v1::ReleaseResponse>, Status> {
        Err(Status::unimplemented("not in this test"))
    }
    async fn open_session(
        &self,
        _: Request<v1::OpenSessionRequest>,
    ) -> Result<Response<v1::SessionResponse>, Status> {
        Err(Status::unimplemented("not in this test"))
    }
    async fn acquire_in_session(
        &self,
        _: Request<v1::AcquireInSessionRequest>,
    ) -> Result<Response<v1::AcquireResponse>, Status> {
        Err(Status::unimplemented("not in this test"))
    }
    async fn keep_alive(
        &self,
        _: Request<v1::KeepAliveRequest>,
    ) -> Result<Response<v1::SessionResponse>, Status> {
        Err(Status::unimplemented("not in this test"))
    }
    async fn close_session(
        &self,
        _: Request<v1::CloseSessionRequest>,
    ) -> Result<Response<v1::CloseSessionResponse>, Status> {
        Err(Status::unimplemented("not in this test"))
    }
    async fn describe(
        &self,
        _: Request<v1::DescribeRequest>,
    ) -> Result<Response<v1::DescribeResponse>, Status> {
        Err(Status::unimplemented("not in this test"))
    }
    async fn validate_token(
        &self,
        _: Request<v1::ValidateTokenRequest>,
    ) -> Result<Response<v1::ValidateTokenResponse>, Status> {
        Err(Status::unimplemented("not in this test"))
    }
    async fn validate_tokens(
        &self,
        _: Request<v1::ValidateTokensRequest>,
    ) -> Result<Response<v1::ValidateTokensResponse>, Status> {
        Err(Status::unimplemented("not in this test"))
    }
    type WatchStream = tonic::codegen::BoxStream<v1::WatchResponse>;
    async fn watch(
        &self,
        _: Request<v1::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        Err(Status::unimplemented("not in this test"))
    }
    async fn history(
        &self,
        _: Request<v1::HistoryRequest>,
    ) -> Result<Response<v1::HistoryResponse>, Status> {
        Err(Status::unimplemented("not in this test"))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ended_attempt_is_a_typed_answer_and_holds_nothing() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        Server::builder()
            .add_service(lock_server::LockServer::new(Spent))
            .serve_with_incoming(TcpIncoming::from(listener)),
    );
    let client = Client::new([addr.to_string()]).unwrap();
    let ttl = Duration::from_secs(5);

    let outcome = client
        .acquire_once("billing:run", OwnerId::random(), ttl, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(
        outcome,
        AcquireOutcome::Ended {
            reason: LostReason::Released
        }
    );
    let Err(err) = client.acquire("billing:run", ttl).await else {
        panic!("an ended attempt must not come back as a lease or a refusal");
    };
    assert!(
        matches!(&err, ClientError::AttemptEnded { resource, reason }
            if resource == "billing:run" && reason == "released"),
        "{err}"
    );
}
