//! The answer's body keeps the resource's turn until it has been sent, and
//! for gRPC records the operation id when the trailers say the call
//! succeeded (a gRPC call's outcome is in its trailers, not its status).

use std::{
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};

use crate::{headers::Fenced, ledger::Ledger, serial::Turn};

/// What to record once a gRPC call's trailers say OK.
pub(crate) struct Completion {
    pub ledger: Arc<dyn Ledger>,
    pub fenced: Fenced,
}

impl Completion {
    /// Records the operation id, then lets the turn go.
    fn spawn(self, turn: Option<Turn>) {
        tokio::spawn(async move {
            let fence = self.fenced.as_fence(fenced_sql::Contract::AtLeast);
            if let Err(e) = self.ledger.complete(&fence).await {
                tracing::warn!(resource = fence.resource, token = fence.token, error = %e,
                    "fenced request: the operation id was not recorded");
            }
            drop(turn);
        });
    }
}

pin_project_lite::pin_project! {
    /// An inner body that holds the turn until its last frame.
    pub struct TurnBody<B> {
        #[pin]
        inner: B,
        turn: Option<Turn>,
        on_grpc_ok: Option<Completion>,
    }
}

impl<B> TurnBody<B> {
    pub(crate) fn new(inner: B, turn: Turn, on_grpc_ok: Option<Completion>) -> Self {
        TurnBody {
            inner,
            turn: Some(turn),
            on_grpc_ok,
        }
    }
}

/// Whether gRPC trailers (or a trailers-only head) say OK.
pub(crate) fn grpc_ok(headers: &HeaderMap) -> bool {
    headers
        .get("grpc-status")
        .is_some_and(|v| v.as_bytes() == b"0")
}

impl<B: Body> Body for TurnBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let polled = this.inner.poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(trailers) = frame.trailers_ref() {
                    if grpc_ok(trailers) {
                        if let Some(c) = this.on_grpc_ok.take() {
                            c.spawn(this.turn.take());
                        }
                    }
                }
            }
            Poll::Ready(None) | Poll::Ready(Some(Err(_))) => {
                *this.on_grpc_ok = None;
                *this.turn = None;
            }
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
