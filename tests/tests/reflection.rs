//! gRPC server reflection: grpcurl and other tools discover every service
//! with no .proto files; with auth on, only a caller that authenticates
//! (any role) is answered.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use fenced_tests::{write_auth_files, Cluster};
use tonic::{metadata::MetadataValue, Code};
use tonic_reflection::pb::v1::{
    server_reflection_client::ServerReflectionClient, server_reflection_request::MessageRequest,
    server_reflection_response::MessageResponse, ServerReflectionRequest,
};

/// One reflection request on node 1, as `bearer` (if any).
async fn ask(
    cluster: &Cluster,
    bearer: Option<&str>,
    request: MessageRequest,
) -> Result<MessageResponse, tonic::Status> {
    let mut client = ServerReflectionClient::new(cluster.channel(1));
    let mut req = tonic::Request::new(tokio_stream::iter([ServerReflectionRequest {
        host: String::new(),
        message_request: Some(request),
    }]));
    if let Some(token) = bearer {
        let value = MetadataValue::try_from(format!("Bearer {token}")).unwrap();
        req.metadata_mut().insert("authorization", value);
    }
    let mut stream = client.server_reflection_info(req).await?.into_inner();
    let answer = stream.message().await?.expect("one answer");
    Ok(answer.message_response.expect("a response"))
}

fn services(response: MessageResponse) -> Vec<String> {
    match response {
        MessageResponse::ListServicesResponse(list) => {
            list.service.into_iter().map(|s| s.name).collect()
        }
        other => panic!("not a service list: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_service_is_listed_and_described_without_proto_files() {
    let cluster = Cluster::start(3).await;
    let listed = services(
        ask(&cluster, None, MessageRequest::ListServices(String::new()))
            .await
            .unwrap(),
    );
    for service in [
        "fenced.v1.Lock",
        "fenced.v1.Kv",
        "fenced.v1.Cluster",
        "fenced.v1.Maintenance",
    ] {
        assert!(
            listed.iter().any(|s| s == service),
            "{service} not in {listed:?}"
        );
    }
    match ask(
        &cluster,
        None,
        MessageRequest::FileContainingSymbol("fenced.v1.Lock".into()),
    )
    .await
    .unwrap()
    {
        MessageResponse::FileDescriptorResponse(files) => {
            assert!(!files.file_descriptor_proto.is_empty());
        }
        other => panic!("no descriptor for fenced.v1.Lock: {other:?}"),
    }
}

/// Attack: anyone who reaches the client port of a cluster with auth on
/// asks it for its schema. Refused without a valid credential; any
/// identity that authenticates, whatever its roles, is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_auth_on_only_an_authenticated_caller_is_answered() {
    let dir = tempfile::tempdir().unwrap();
    let (tokens, policy) = write_auth_files(
        dir.path(),
        &[("reader", "reader-token", "billing-reader")],
        "[roles.billing-reader]\nread = [\"billing/\"]\n",
    );
    let cluster = Cluster::start_with(3, |s| {
        s.auth_tokens = Some(tokens.as_str().into());
        s.auth_policy = Some(policy.as_str().into());
    })
    .await;
    let list = || MessageRequest::ListServices(String::new());
    for bearer in [None, Some("wrong-token")] {
        let refused = ask(&cluster, bearer, list()).await.unwrap_err();
        assert_eq!(
            refused.code(),
            Code::Unauthenticated,
            "{bearer:?}: {refused:?}"
        );
    }
    let listed = services(ask(&cluster, Some("reader-token"), list()).await.unwrap());
    assert!(listed.iter().any(|s| s == "fenced.v1.Lock"), "{listed:?}");
}
