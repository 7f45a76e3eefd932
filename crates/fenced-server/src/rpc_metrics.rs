//! Latency and status code per RPC, for `/metrics`: a tower layer on both
//! gRPC servers (the client port, and the peer port where followers forward
//! calls to the leader).
//!
//! The code is read from the response headers: a unary call that fails is
//! answered "trailers only", with `grpc-status` in the headers; a response
//! without one carries its status in the trailers, which for the unary calls
//! here means OK. A server stream is timed to its first headers.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    future::Future,
    pin::Pin,
    sync::{
        atomic::{AtomicU64, Ordering::Relaxed},
        Arc, Mutex, PoisonError,
    },
    task::{Context, Poll},
    time::Instant,
};

use crate::{
    histogram::{Histogram, LATENCY_US_BOUNDS},
    limits::Port,
};

/// Distinct (port, method) series kept; calls to further methods count as
/// `other`, so a client inventing paths cannot grow the exposition.
const MAX_SERIES: usize = 64;
/// gRPC status codes are 0 (OK) to 16 (UNAUTHENTICATED).
const CODES: usize = 17;

#[derive(Debug)]
struct MethodStats {
    latency: Histogram,
    codes: [AtomicU64; CODES],
}

impl MethodStats {
    fn new() -> Self {
        Self {
            latency: Histogram::new(LATENCY_US_BOUNDS),
            codes: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

/// Every RPC's latency histogram and count by status code.
#[derive(Debug, Default)]
pub struct RpcMetrics {
    series: Mutex<BTreeMap<(&'static str, String), Arc<MethodStats>>>,
}

impl RpcMetrics {
    fn stats(&self, port: Port, path: &str) -> Arc<MethodStats> {
        let method = path.strip_prefix('/').unwrap_or(path);
        let known = method.starts_with("fenced.v1.") || method.starts_with("grpc.health.v1.");
        let mut series = self.series.lock().unwrap_or_else(PoisonError::into_inner);
        let key = (port.name(), method.to_string());
        if known {
            if let Some(s) = series.get(&key) {
                return Arc::clone(s);
            }
            // Room is kept for the two ports' `other` series.
            if series.len() < MAX_SERIES - 2 {
                let s = Arc::new(MethodStats::new());
                series.insert(key, Arc::clone(&s));
                return s;
            }
        }
        Arc::clone(
            series
                .entry((port.name(), "other".to_string()))
                .or_insert_with(|| Arc::new(MethodStats::new())),
        )
    }

    /// Appends `fenced_rpc_requests_total` and `fenced_rpc_duration_seconds`.
    pub fn render(&self, out: &mut String) {
        let series: Vec<_> = self
            .series
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|(k, v)| (k.clone(), Arc::clone(v)))
            .collect();
        let _ = writeln!(
            out,
            "# HELP fenced_rpc_requests_total gRPC calls answered, by port, method and status code.\n\
             # TYPE fenced_rpc_requests_total counter"
        );
        for ((port, method), stats) in &series {
            for (code, n) in stats.codes.iter().enumerate() {
                let n = n.load(Relaxed);
                if n > 0 {
                    let _ = writeln!(
                        out,
                        "fenced_rpc_requests_total{{port=\"{port}\",method=\"{method}\",code=\"{}\"}} {n}",
                        code_name(code)
                    );
                }
            }
        }
        let _ = writeln!(
            out,
            "# HELP fenced_rpc_duration_seconds Time from a gRPC call's arrival to its response headers, by port and method.\n\
             # TYPE fenced_rpc_duration_seconds histogram"
        );
        for ((port, method), stats) in &series {
            stats.latency.render_series(
                out,
                "fenced_rpc_duration_seconds",
                &format!("port=\"{port}\",method=\"{method}\""),
                1e-6,
            );
        }
    }
}

/// The status code's name as gRPC spells it.
fn code_name(code: usize) -> &'static str {
    const NAMES: [&str; CODES] = [
        "OK",
        "CANCELLED",
        "UNKNOWN",
        "INVALID_ARGUMENT",
        "DEADLINE_EXCEEDED",
        "NOT_FOUND",
        "ALREADY_EXISTS",
        "PERMISSION_DENIED",
        "RESOURCE_EXHAUSTED",
        "FAILED_PRECONDITION",
        "ABORTED",
        "OUT_OF_RANGE",
        "UNIMPLEMENTED",
        "INTERNAL",
        "UNAVAILABLE",
        "DATA_LOSS",
        "UNAUTHENTICATED",
    ];
    NAMES.get(code).copied().unwrap_or("UNKNOWN")
}

/// Measures every call of the service it wraps.
#[derive(Clone)]
pub struct RpcMetricsLayer {
    metrics: Arc<RpcMetrics>,
    port: Port,
}

impl RpcMetricsLayer {
    pub fn new(metrics: Arc<RpcMetrics>, port: Port) -> Self {
        Self { metrics, port }
    }
}

impl<S> tower::Layer<S> for RpcMetricsLayer {
    type Service = Measured<S>;
    fn layer(&self, inner: S) -> Measured<S> {
        Measured {
            inner,
            metrics: Arc::clone(&self.metrics),
            port: self.port,
        }
    }
}

#[derive(Clone)]
pub struct Measured<S> {
    inner: S,
    metrics: Arc<RpcMetrics>,
    port: Port,
}

impl<S, B, RB> tower::Service<http::Request<B>> for Measured<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<RB>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let stats = self.metrics.stats(self.port, req.uri().path());
        let started = Instant::now();
        let call = self.inner.call(req);
        Box::pin(async move {
            let res = call.await;
            let code = match &res {
                Ok(resp) => resp
                    .headers()
                    .get("grpc-status")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse::<usize>().ok())
                    .unwrap_or(0),
                // The transport failed the call: UNKNOWN.
                Err(_) => 2,
            };
            if let Some(n) = stats.codes.get(code.min(CODES - 1)) {
                n.fetch_add(1, Relaxed);
            }
            stats.latency.observe_duration(started.elapsed());
            res
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_paths_share_one_series_and_the_count_is_bounded() {
        let m = RpcMetrics::default();
        m.stats(Port::Client, "/fenced.v1.Lock/Acquire");
        for i in 0..200 {
            m.stats(Port::Client, &format!("/evil.Service/M{i}"));
            m.stats(Port::Peer, &format!("/fenced.v1.Lock/Invented{i}"));
        }
        let series = m.series.lock().unwrap_or_else(PoisonError::into_inner);
        assert!(series.len() <= MAX_SERIES, "{}", series.len());
        assert!(series.contains_key(&("client", "fenced.v1.Lock/Acquire".to_string())));
        assert!(series.contains_key(&("client", "other".to_string())));
        assert!(!series.keys().any(|(_, m)| m.starts_with("evil")));
    }

    #[test]
    fn codes_render_by_name_with_their_labels() {
        let m = RpcMetrics::default();
        let s = m.stats(Port::Client, "/fenced.v1.Lock/Acquire");
        s.codes[0].fetch_add(3, Relaxed);
        s.codes[14].fetch_add(1, Relaxed);
        s.latency.observe(1_000);
        let mut out = String::new();
        m.render(&mut out);
        assert!(out.contains(
            "fenced_rpc_requests_total{port=\"client\",method=\"fenced.v1.Lock/Acquire\",code=\"OK\"} 3\n"
        ), "{out}");
        assert!(out.contains("code=\"UNAVAILABLE\"} 1\n"), "{out}");
        assert!(out.contains(
            "fenced_rpc_duration_seconds_bucket{port=\"client\",method=\"fenced.v1.Lock/Acquire\",le=\"0.001\"} 1\n"
        ), "{out}");
        assert!(out.contains(
            "fenced_rpc_duration_seconds_count{port=\"client\",method=\"fenced.v1.Lock/Acquire\"} 1\n"
        ), "{out}");
    }
}
