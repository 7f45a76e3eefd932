//! A server stream (Watch) as server-sent events: one `data:` line of JSON
//! per message, an `error` event if the stream ends in a refusal, and a
//! comment line while nothing happens so that no proxy on the way closes a
//! quiet watch. (This node's own idle timeout counts what the caller sends:
//! over HTTP/1.1 a watch ends after `idle_timeout_ms` and the caller
//! resumes with `fromRevision`; docs/DECISIONS.md, "The HTTP/JSON API".)

use std::time::Duration;

use bytes::Bytes;
use serde::Serialize;
use tokio_stream::{Stream, StreamExt};
use tonic::Status;

/// The content type of a stream of events.
pub const EVENT_STREAM: &str = "text/event-stream";

/// How long a stream stays silent before a keep-alive comment: under the
/// 30 s or more that proxies commonly allow an idle response.
pub const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// One message as an event. JSON holds no raw newline, so one `data:` line
/// carries it whole.
pub fn event<M: Serialize>(message: &M) -> Bytes {
    match super::reply::to_json(message) {
        Ok(json) => Bytes::from(format!("data: {}\n\n", String::from_utf8_lossy(&json))),
        Err(e) => error_event(&Status::internal(format!("an event did not encode: {e}"))),
    }
}

/// The refusal that ends a stream, as an `error` event.
pub fn error_event(status: &Status) -> Bytes {
    let body = super::reply::error_body(status.code(), status.message());
    let json = String::from_utf8_lossy(&body);
    Bytes::from(format!("event: error\ndata: {json}\n\n"))
}

/// A comment line, which every reader of events skips.
pub const KEEP_ALIVE_LINE: &[u8] = b": keep-alive\n\n";

/// The events of `messages`, ending after the first refusal, with a
/// keep-alive after every [`KEEP_ALIVE`] of silence.
pub fn events<S, M>(messages: S) -> impl Stream<Item = Result<Bytes, std::convert::Infallible>>
where
    S: Stream<Item = Result<M, Status>> + Send + 'static,
    M: Serialize,
{
    let mut ended = false;
    let framed = messages.map_while(move |item| {
        if ended {
            return None;
        }
        Some(match item {
            Ok(message) => event(&message),
            Err(status) => {
                ended = true;
                error_event(&status)
            }
        })
    });
    let ticks = tokio_stream::wrappers::IntervalStream::new({
        let first = tokio::time::Instant::now() + KEEP_ALIVE;
        let mut every = tokio::time::interval_at(first, KEEP_ALIVE);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        every
    });
    // Keep-alives only while the watch lasts.
    KeepAlive {
        events: Box::pin(framed),
        ticks,
    }
    .map(Ok)
}

/// Interleaves keep-alive comments with the events, ending with them.
struct KeepAlive<E> {
    events: std::pin::Pin<Box<E>>,
    ticks: tokio_stream::wrappers::IntervalStream,
}

impl<E: Stream<Item = Bytes>> Stream for KeepAlive<E> {
    type Item = Bytes;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Bytes>> {
        use std::task::Poll;
        match self.events.as_mut().poll_next(cx) {
            Poll::Ready(next) => {
                if next.is_some() {
                    self.ticks.as_mut().reset();
                }
                Poll::Ready(next)
            }
            Poll::Pending => match std::pin::Pin::new(&mut self.ticks).poll_next(cx) {
                Poll::Ready(_) => Poll::Ready(Some(Bytes::from_static(KEEP_ALIVE_LINE))),
                Poll::Pending => Poll::Pending,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use fenced_proto::v1;

    use super::*;

    #[test]
    fn an_event_is_one_data_line_of_json() {
        let message = v1::WatchResponse::default();
        let text = event(&message);
        let text = std::str::from_utf8(&text).unwrap();
        assert!(text.starts_with("data: {"), "{text}");
        assert!(text.ends_with("}\n\n"), "{text}");
        assert_eq!(text.matches('\n').count(), 2, "{text}");
    }

    #[tokio::test]
    async fn a_refusal_ends_the_stream_as_an_error_event() {
        let messages = tokio_stream::iter(vec![
            Ok(v1::WatchResponse::default()),
            Err(Status::permission_denied("no read on billing/")),
            Ok(v1::WatchResponse::default()),
        ]);
        let all: Vec<Bytes> = events(messages).map(|r| r.unwrap()).collect().await;
        assert_eq!(all.len(), 2, "{all:?}");
        let last = std::str::from_utf8(&all[1]).unwrap();
        assert!(last.starts_with("event: error\ndata: {"), "{last}");
        assert!(last.contains("PERMISSION_DENIED"), "{last}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_quiet_stream_gets_keep_alives() {
        let silent = tokio_stream::pending::<Result<v1::WatchResponse, Status>>();
        let mut stream = Box::pin(events(silent));
        let first = stream.next().await.unwrap().unwrap();
        assert_eq!(&first[..], KEEP_ALIVE_LINE);
    }
}
