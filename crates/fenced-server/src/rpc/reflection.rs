//! gRPC server reflection on the client port (v1 and v1alpha), so grpcurl
//! and other generic tools call fenced without the .proto files. It tells
//! nothing about leases, only the public contract, but with auth on it
//! answers only a caller that authenticates (any role), like every other
//! call but health.

use std::sync::Arc;

use tonic::{service::interceptor::InterceptedService, service::Interceptor, Request, Status};
use tonic_reflection::{
    pb::{v1, v1alpha},
    server::Builder,
};

use crate::security::auth::Auth;

/// Lets through a caller that authenticates (anyone, with auth off).
#[derive(Clone)]
pub struct Authenticated(pub Arc<Auth>);

impl Interceptor for Authenticated {
    fn call(&mut self, req: Request<()>) -> Result<Request<()>, Status> {
        self.0.authenticate(&req)?;
        Ok(req)
    }
}

fn builder() -> Builder<'static> {
    Builder::configure().register_encoded_file_descriptor_set(fenced_proto::FILE_DESCRIPTOR_SET)
}

/// The reflection service, protocol v1.
pub fn v1(
    auth: Arc<Auth>,
) -> Result<
    InterceptedService<
        v1::server_reflection_server::ServerReflectionServer<
            impl v1::server_reflection_server::ServerReflection,
        >,
        Authenticated,
    >,
    String,
> {
    let service = builder()
        .build_v1()
        .map_err(|e| format!("reflection: {e}"))?;
    Ok(InterceptedService::new(service, Authenticated(auth)))
}

/// The reflection service, protocol v1alpha (older grpcurl and tools).
pub fn v1alpha(
    auth: Arc<Auth>,
) -> Result<
    InterceptedService<
        v1alpha::server_reflection_server::ServerReflectionServer<
            impl v1alpha::server_reflection_server::ServerReflection,
        >,
        Authenticated,
    >,
    String,
> {
    let service = builder()
        .build_v1alpha()
        .map_err(|e| format!("reflection: {e}"))?;
    Ok(InterceptedService::new(service, Authenticated(auth)))
}
