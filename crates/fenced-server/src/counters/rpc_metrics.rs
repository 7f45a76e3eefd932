//! Latency and status code per RPC, for `/metrics`: a tower layer on both
//! gRPC servers (the client port, and the peer port where followers forward
//! calls to the leader).
//!
//! The code is read from the response headers: a unary call that fails is
//! answered "trailers only", with `grpc-status` in the headers; a response
//! without one carries its status in the trailers, which for the unary calls
//! here means OK. A server stream is timed to its first headers. A call of
//! the HTTP/JSON API has no gRPC framing: its answer carries [`Answered`]
//! in its extensions instead, the method it called and the code it answered.

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
    histogram::{label_value, Histogram, LATENCY_US_BOUNDS},
    security::limits::Port,
};

/// The label of every call to a path no service routes: one series per
/// port, whatever the path, so a caller can neither write into the
/// exposition nor grow it, nor push a routed method out of it.
const UNKNOWN: &str = "unknown";
/// The health service's methods (tonic-health's, not in `proto/`).
const HEALTH_METHODS: [&str; 2] = ["grpc.health.v1.Health/Check", "grpc.health.v1.Health/Watch"];
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
    /// Keyed by port and a name from a fixed list ([`routed`]): at most two
    /// ports times the routed methods plus one.
    series: Mutex<BTreeMap<(&'static str, &'static str), Arc<MethodStats>>>,
}

/// The label a call to `path` is counted under: its method's name when a
/// service routes it, else [`UNKNOWN`]. Never text from the caller.
fn routed(path: &str) -> &'static str {
    path.strip_prefix('/').map_or(UNKNOWN, routed_method)
}

/// What a service that is not gRPC (the HTTP/JSON API) answered, put in
/// its response's extensions for this layer: the method it called, if the
/// path named one, and the gRPC code of its answer. The method still passes
/// [`routed_method`], so only the services' methods become labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Answered {
    pub method: Option<&'static str>,
    pub code: tonic::Code,
}

/// The label and code of a response: [`Answered`] when the service put one
/// in its extensions, else the path's method and the `grpc-status` header
/// (none: OK, in the trailers).
fn label_and_code<RB>(
    path_label: &'static str,
    resp: &http::Response<RB>,
) -> (&'static str, usize) {
    if let Some(answered) = resp.extensions().get::<Answered>() {
        return (
            answered.method.map_or(UNKNOWN, routed_method),
            answered.code as usize,
        );
    }
    let code = resp
        .headers()
        .get("grpc-status")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(0);
    (path_label, code)
}

/// `method` (`package.Service/Method`) when a service routes it, else
/// [`UNKNOWN`].
fn routed_method(method: &str) -> &'static str {
    fenced_proto::METHODS
        .binary_search(&method)
        .ok()
        .and_then(|i| fenced_proto::METHODS.get(i).copied())
        .or_else(|| HEALTH_METHODS.iter().find(|m| **m == method).copied())
        .unwrap_or(UNKNOWN)
}

impl RpcMetrics {
    #[cfg(test)]
    fn stats(&self, port: Port, path: &str) -> Arc<MethodStats> {
        self.series_of(port, routed(path))
    }

    /// The series of a label from [`routed`] or [`routed_method`].
    fn series_of(&self, port: Port, label: &'static str) -> Arc<MethodStats> {
        let mut series = self.series.lock().unwrap_or_else(PoisonError::into_inner);
        Arc::clone(
            series
                .entry((port.name(), label))
                .or_insert_with(|| Arc::new(MethodStats::new())),
        )
    }

    /// Counts one answered call: its code, and how long it took.
    fn count(&self, port: Port, label: &'static str, code: usize, took: std::time::Duration) {
        let stats = self.series_of(port, label);
        if let Some(n) = stats.codes.get(code.min(CODES - 1)) {
            n.fetch_add(1, Relaxed);
        }
        stats.latency.observe_duration(took);
    }

    /// Appends `fenced_rpc_requests_total` and `fenced_rpc_duration_seconds`.
    pub fn render(&self, out: &mut String) {
        let series: Vec<_> = self
            .series
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|(k, v)| (*k, Arc::clone(v)))
            .collect();
        let _ = writeln!(
            out,
            "# HELP fenced_rpc_requests_total Calls answered (gRPC, and HTTP/JSON under the method it calls), by port, method and status code.\n\
             # TYPE fenced_rpc_requests_total counter"
        );
        for ((port, method), stats) in &series {
            let (port, method) = (label_value(port), label_value(method));
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
            "# HELP fenced_rpc_duration_seconds Time from a call's arrival to its response headers, by port and method.\n\
             # TYPE fenced_rpc_duration_seconds histogram"
        );
        for ((port, method), stats) in &series {
            let (port, method) = (label_value(port), label_value(method));
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
        let (metrics, port) = (Arc::clone(&self.metrics), self.port);
        let path_label = routed(req.uri().path());
        let started = Instant::now();
        let call = self.inner.call(req);
        Box::pin(async move {
            let res = call.await;
            let (label, code) = match &res {
                Ok(resp) => label_and_code(path_label, resp),
                // The transport failed the call: UNKNOWN.
                Err(_) => (path_label, 2),
            };
            metrics.count(port, label, code, started.elapsed());
            res
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Paths a caller may send: quotes and a label of its own, newlines,
    /// backslashes, braces, a long one, and many invented method names of
    /// the real services.
    fn hostile_paths() -> Vec<String> {
        let mut paths: Vec<String> = [
            "/fenced.v1.x\",port=\"peer",
            "/fenced.v1.Lock/Acquire\"} 1\nfenced_grants_total 99\n#",
            "/fenced.v1.Lock/Acquire\\",
            "/fenced.v1.Lock/{Acquire}",
            "/fenced.v1.Lock/Acquire ",
            "/grpc.health.v1.Health/Check\n",
            "",
            "/",
            "fenced.v1.Lock/Acquire",
        ]
        .map(String::from)
        .to_vec();
        paths.push(format!("/fenced.v1.Lock/{}", "A".repeat(64 * 1024)));
        for i in 0..500 {
            paths.push(format!("/fenced.v1.Lock/Invented{i}"));
            paths.push(format!("/evil.Service/M{i}"));
        }
        paths
    }

    #[test]
    fn only_routed_methods_become_labels_and_the_rest_share_one_series() {
        let m = RpcMetrics::default();
        for path in hostile_paths() {
            m.stats(Port::Client, &path);
            m.stats(Port::Peer, &path);
        }
        // Every real method still gets its own series after the flood.
        for method in fenced_proto::METHODS.iter().chain(&HEALTH_METHODS) {
            m.stats(Port::Client, &format!("/{method}"));
        }
        let series = m.series.lock().unwrap_or_else(PoisonError::into_inner);
        for ((_, method), _) in series.iter() {
            assert!(
                *method == UNKNOWN
                    || fenced_proto::METHODS.contains(method)
                    || HEALTH_METHODS.contains(method),
                "{method:?} became a label"
            );
        }
        for method in fenced_proto::METHODS.iter().chain(&HEALTH_METHODS) {
            assert!(series.contains_key(&("client", *method)), "{method}");
        }
        assert!(series.contains_key(&("client", UNKNOWN)));
        assert!(series.contains_key(&("peer", UNKNOWN)));
        assert_eq!(
            series.len(),
            fenced_proto::METHODS.len() + HEALTH_METHODS.len() + 2
        );
    }

    #[test]
    fn hostile_paths_leave_a_well_formed_exposition() {
        let m = RpcMetrics::default();
        for path in hostile_paths() {
            let s = m.stats(Port::Peer, &path);
            s.codes[0].fetch_add(1, Relaxed);
            s.latency.observe(10);
        }
        let mut out = String::new();
        m.render(&mut out);
        assert_eq!(crate::observe::exposition::check(&out), Ok(()), "{out}");
        assert!(!out.contains("fenced.v1.x"), "{out}");
        assert!(
            out.contains(
                "fenced_rpc_requests_total{port=\"peer\",method=\"unknown\",code=\"OK\"} 1010\n"
            ),
            "{out}"
        );
    }

    #[test]
    fn the_routed_list_is_the_generated_services_methods() {
        assert!(fenced_proto::METHODS.windows(2).all(|w| w[0] < w[1]));
        for m in [
            "fenced.v1.Lock/Acquire",
            "fenced.v1.Cluster/Status",
            "fenced.v1.Kv/Put",
        ] {
            assert_eq!(routed(&format!("/{m}")), m);
        }
        assert_eq!(routed("/fenced.v1.x\",port=\"peer"), UNKNOWN);
        assert_eq!(routed("/fenced.v1.Lock/acquire"), UNKNOWN);
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

    fn answer(answered: Option<Answered>, grpc_status: Option<&'static str>) -> http::Response<()> {
        let mut resp = http::Response::new(());
        if let Some(a) = answered {
            resp.extensions_mut().insert(a);
        }
        if let Some(code) = grpc_status {
            resp.headers_mut()
                .insert("grpc-status", http::HeaderValue::from_static(code));
        }
        resp
    }

    /// A JSON call is counted under the method it called with the code it
    /// answered; before, every one was `unknown` and OK, refusals included.
    #[test]
    fn a_json_answer_is_counted_under_its_method_with_its_code() {
        let refused = Answered {
            method: Some("fenced.v1.Lock/Acquire"),
            code: tonic::Code::PermissionDenied,
        };
        assert_eq!(
            label_and_code(UNKNOWN, &answer(Some(refused), None)),
            ("fenced.v1.Lock/Acquire", 7)
        );
        let no_call = Answered {
            method: None,
            code: tonic::Code::NotFound,
        };
        assert_eq!(
            label_and_code(UNKNOWN, &answer(Some(no_call), None)),
            (UNKNOWN, 5)
        );
        // A gRPC answer: the path's label, the header's code, OK without one.
        let path = routed("/fenced.v1.Lock/Release");
        assert_eq!(label_and_code(path, &answer(None, Some("14"))), (path, 14));
        assert_eq!(label_and_code(path, &answer(None, None)), (path, 0));
    }

    /// The extension's method passes the same list as a path: a method no
    /// service has is `unknown`, never a label of its own.
    #[test]
    fn an_answered_method_outside_the_services_is_unknown() {
        for method in ["fenced.v1.Lock/Invented", "fenced.v1.x\",port=\"peer", ""] {
            let answered = Answered {
                method: Some(method),
                code: tonic::Code::Ok,
            };
            assert_eq!(
                label_and_code(UNKNOWN, &answer(Some(answered), None)),
                (UNKNOWN, 0),
                "{method:?}"
            );
        }
    }

    /// Through the layer: the extension decides the series and the code, and
    /// the exposition shows the refusal.
    #[tokio::test]
    async fn the_layer_counts_what_the_answer_says() {
        #[derive(Clone)]
        struct Fixed(Answered);
        impl tower::Service<http::Request<()>> for Fixed {
            type Response = http::Response<()>;
            type Error = std::convert::Infallible;
            type Future = std::future::Ready<Result<http::Response<()>, Self::Error>>;
            fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
                Poll::Ready(Ok(()))
            }
            fn call(&mut self, _: http::Request<()>) -> Self::Future {
                std::future::ready(Ok(answer(Some(self.0), None)))
            }
        }
        use tower::{Layer, Service};
        let metrics = Arc::new(RpcMetrics::default());
        let mut svc =
            RpcMetricsLayer::new(Arc::clone(&metrics), Port::Client).layer(Fixed(Answered {
                method: Some("fenced.v1.Lock/Renew"),
                code: tonic::Code::FailedPrecondition,
            }));
        let mut req = http::Request::new(());
        *req.uri_mut() = http::Uri::from_static("/v1/lock/renew");
        svc.call(req).await.unwrap();
        let mut out = String::new();
        metrics.render(&mut out);
        assert!(out.contains(
            "fenced_rpc_requests_total{port=\"client\",method=\"fenced.v1.Lock/Renew\",code=\"FAILED_PRECONDITION\"} 1\n"
        ), "{out}");
        assert!(!out.contains("method=\"unknown\""), "{out}");
    }
}
