//! The recorded history: one JSON line per invocation and per completion,
//! all stamped with one monotonic clock (nanoseconds since the run began).

use std::{
    fs::File,
    io::{BufRead, BufReader, BufWriter, Write as _},
    path::Path,
    sync::{Arc, Mutex, PoisonError},
    time::Instant,
};

use fenced_proto::v1::{self, acquire_response, release_response, renew_response};
use serde::{Deserialize, Serialize};

/// What an operation does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum F {
    Acquire,
    Renew,
    Release,
    Describe,
    Write,
    /// A fenced put into the cluster's key-value store (service Kv).
    KvPut,
    /// A linearizable read of one key of the key-value store.
    KvGet,
}

impl F {
    pub const ALL: [F; 7] = [
        F::Acquire,
        F::Renew,
        F::Release,
        F::Describe,
        F::Write,
        F::KvPut,
        F::KvGet,
    ];

    pub fn name(self) -> &'static str {
        match self {
            F::Acquire => "acquire",
            F::Renew => "renew",
            F::Release => "release",
            F::Describe => "describe",
            F::Write => "write",
            F::KvPut => "kv_put",
            F::KvGet => "kv_get",
        }
    }
}

/// Invocation, or how an operation completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Invoke,
    /// A definite answer (which may be a refusal: held, lost, rejected).
    Ok,
    /// No answer: the operation may or may not have taken effect.
    Info,
}

/// The answer of a completed operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Answer {
    Granted {
        token: u64,
        ttl_ms: u64,
    },
    Held {
        current_token: u64,
    },
    /// The owner id's lease on the resource already ended: nothing granted.
    Ended {
        reason: String,
        current_token: u64,
    },
    Renewed {
        ttl_ms: u64,
    },
    Lost {
        reason: String,
        current_token: u64,
    },
    Released,
    NotHolder {
        reason: String,
        current_token: u64,
    },
    Described {
        last_token: u64,
        held: bool,
        /// The cluster time the answer was computed at (DescribeResponse
        /// `cluster_time_ms`); 0 in histories recorded before it was kept.
        #[serde(default)]
        cluster_time_ms: u64,
    },
    Accepted {
        token: u64,
        version: u64,
    },
    AlreadyApplied {
        token: u64,
        version: u64,
    },
    Rejected {
        highest_token: u64,
        reason: String,
    },
    /// A kv put the cluster applied.
    KvApplied {
        revision: u64,
    },
    /// A kv put the cluster refused: `reason` is expired, released,
    /// superseded, unknown or key_has_newer_token.
    KvRefused {
        reason: String,
        current_token: u64,
    },
    /// What a kv get found: the value and the token it was written with
    /// (`found` false: no value, token 0).
    KvRead {
        found: bool,
        value: String,
        resource: String,
        token: u64,
        revision: u64,
    },
}

impl Answer {
    /// Whether the answer is the operation's success (as opposed to a refusal).
    pub fn is_success(&self) -> bool {
        matches!(
            self,
            Answer::Granted { .. }
                | Answer::Renewed { .. }
                | Answer::Released
                | Answer::Described { .. }
                | Answer::Accepted { .. }
                | Answer::AlreadyApplied { .. }
                | Answer::KvApplied { .. }
                | Answer::KvRead { .. }
        )
    }
}

/// How the history records a Lock call's answer: one place for the
/// fault-injection workload and the simulation's.
impl Answer {
    pub fn of_acquire(r: v1::AcquireResponse) -> Result<Answer, String> {
        match r.outcome {
            Some(acquire_response::Outcome::Granted(g)) => Ok(Answer::Granted {
                token: g.token,
                ttl_ms: g.ttl_ms,
            }),
            Some(acquire_response::Outcome::Held(h)) => Ok(Answer::Held {
                current_token: h.current_token,
            }),
            Some(acquire_response::Outcome::Ended(e)) => Ok(Answer::Ended {
                reason: format!("{:?}", e.reason()),
                current_token: e.current_token,
            }),
            Some(acquire_response::Outcome::SessionGone(_)) => {
                Err("a session's answer to an acquire without one".into())
            }
            None => Err("empty acquire answer".into()),
        }
    }

    pub fn of_renew(r: v1::RenewResponse) -> Result<Answer, String> {
        match r.outcome {
            Some(renew_response::Outcome::Renewed(x)) => Ok(Answer::Renewed { ttl_ms: x.ttl_ms }),
            Some(renew_response::Outcome::Lost(l)) => Ok(Answer::Lost {
                reason: lost_reason(l.reason),
                current_token: l.current_token,
            }),
            None => Err("empty renew answer".into()),
        }
    }

    pub fn of_release(r: v1::ReleaseResponse) -> Result<Answer, String> {
        match r.outcome {
            Some(release_response::Outcome::Released(_)) => Ok(Answer::Released),
            Some(release_response::Outcome::NotHolder(n)) => Ok(Answer::NotHolder {
                reason: lost_reason(n.reason),
                current_token: n.current_token,
            }),
            None => Err("empty release answer".into()),
        }
    }

    pub fn of_describe(d: v1::DescribeResponse) -> Answer {
        Answer::Described {
            last_token: d.last_token,
            held: d.held,
            cluster_time_ms: d.cluster_time_ms,
        }
    }
}

/// A loss reason as the history spells it (`expired`, `released`, ...).
pub fn lost_reason(code: i32) -> String {
    v1::LostReason::try_from(code)
        .map(|r| {
            r.as_str_name()
                .trim_start_matches("LOST_REASON_")
                .to_lowercase()
        })
        .unwrap_or_else(|_| format!("code {code}"))
}

/// One line of the history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// Operation id: the invocation and the completion share it.
    pub op: u64,
    pub phase: Phase,
    /// Nanoseconds since the run began, on the harness's monotonic clock.
    pub t_ns: u64,
    pub worker: u32,
    pub f: F,
    pub resource: String,
    /// Owner id (UUID text) of the acquisition the operation speaks for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// The token presented (renew, release, write).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<u64>,
    /// The TTL asked for (acquire, renew).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
    /// The key of a kv put or get.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The node the request went to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<u64>,
    /// Sent with a token the worker knew to be old, on purpose.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deliberate_stale: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer: Option<Answer>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Event {
    /// `self` as invoked: operation `op` at `t_ns`.
    pub fn invoked(mut self, op: u64, t_ns: u64) -> Event {
        self.op = op;
        self.phase = Phase::Invoke;
        self.t_ns = t_ns;
        self
    }

    /// The completion of this invocation at `t_ns`: a definite answer or,
    /// with `Err`, an unknown outcome.
    pub fn completed(&self, t_ns: u64, result: Result<Answer, String>) -> Event {
        let mut e = self.clone();
        e.t_ns = t_ns;
        match result {
            Ok(answer) => {
                e.phase = Phase::Ok;
                e.answer = Some(answer);
            }
            Err(error) => {
                e.phase = Phase::Info;
                e.error = Some(error);
            }
        }
        e
    }
}

/// An invocation paired with its completion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Op {
    pub id: u64,
    pub worker: u32,
    pub f: F,
    pub resource: String,
    pub owner: Option<String>,
    pub token: Option<u64>,
    pub ttl_ms: Option<u64>,
    /// The key of a kv put or get.
    pub key: Option<String>,
    pub deliberate_stale: bool,
    pub invoke_ns: u64,
    /// Completion time; `None` if the outcome is unknown.
    pub complete_ns: Option<u64>,
    /// The definite answer; `None` if the outcome is unknown.
    pub answer: Option<Answer>,
}

impl Op {
    pub fn is_unknown(&self) -> bool {
        self.answer.is_none()
    }

    pub fn succeeded(&self) -> bool {
        self.answer.as_ref().is_some_and(Answer::is_success)
    }

    pub fn granted_token(&self) -> Option<u64> {
        match self.answer {
            Some(Answer::Granted { token, .. }) => Some(token),
            _ => None,
        }
    }
}

/// Pairs invocations with completions. An invocation without a completion
/// (the run ended first) is an operation of unknown outcome.
pub fn pair(events: &[Event]) -> Vec<Op> {
    let mut ops: Vec<Op> = Vec::new();
    let mut index = std::collections::HashMap::new();
    for e in events {
        match e.phase {
            Phase::Invoke => {
                index.insert(e.op, ops.len());
                ops.push(Op {
                    id: e.op,
                    worker: e.worker,
                    f: e.f,
                    resource: e.resource.clone(),
                    owner: e.owner.clone(),
                    token: e.token,
                    ttl_ms: e.ttl_ms,
                    key: e.key.clone(),
                    deliberate_stale: e.deliberate_stale,
                    invoke_ns: e.t_ns,
                    complete_ns: None,
                    answer: None,
                });
            }
            Phase::Ok => {
                if let Some(op) = index.get(&e.op).and_then(|&i| ops.get_mut(i)) {
                    op.complete_ns = Some(e.t_ns);
                    op.answer = e.answer.clone();
                }
            }
            Phase::Info => {}
        }
    }
    ops
}

/// Records events in memory and as JSON lines in a file, as they happen.
#[derive(Clone)]
pub struct Recorder {
    inner: Arc<Mutex<RecorderInner>>,
    start: Instant,
}

struct RecorderInner {
    events: Vec<Event>,
    file: BufWriter<File>,
    next_op: u64,
    write_error: Option<String>,
}

impl Recorder {
    pub fn create(path: &Path, start: Instant) -> anyhow::Result<Self> {
        let file = File::create(path)
            .map_err(|e| anyhow::anyhow!("creating history file {}: {e}", path.display()))?;
        Ok(Self {
            inner: Arc::new(Mutex::new(RecorderInner {
                events: Vec::new(),
                file: BufWriter::new(file),
                next_op: 0,
                write_error: None,
            })),
            start,
        })
    }

    /// Nanoseconds since the run began.
    pub fn now_ns(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Records an invocation; returns the event to complete later.
    pub fn invoke(&self, e: Event) -> Event {
        let mut g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let e = e.invoked(g.next_op, self.now_ns());
        g.next_op += 1;
        g.push(e.clone());
        e
    }

    /// Records the completion of `invoked`: a definite answer or, with
    /// `Err`, an unknown outcome.
    pub fn complete(&self, invoked: &Event, result: Result<Answer, String>) {
        let e = invoked.completed(self.now_ns(), result);
        let mut g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        g.push(e);
    }

    /// Every event so far, and the first error writing the file, if any.
    pub fn finish(&self) -> (Vec<Event>, Option<String>) {
        let mut g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        if let Err(e) = g.file.flush() {
            g.write_error.get_or_insert(e.to_string());
        }
        (g.events.clone(), g.write_error.clone())
    }
}

impl crate::calls::Record for Recorder {
    fn invoke(&self, e: Event) -> Event {
        Recorder::invoke(self, e)
    }

    fn complete(&self, invoked: &Event, result: Result<Answer, String>) {
        Recorder::complete(self, invoked, result);
    }
}

impl RecorderInner {
    fn push(&mut self, e: Event) {
        let line = serde_json::to_string(&e).map_err(|e| e.to_string());
        let written = line.and_then(|l| writeln!(self.file, "{l}").map_err(|e| e.to_string()));
        if let Err(err) = written {
            self.write_error.get_or_insert(err);
        }
        self.events.push(e);
    }
}

/// Reads a history file written by [`Recorder`].
pub fn read(path: &Path) -> anyhow::Result<Vec<Event>> {
    let file = File::open(path).map_err(|e| anyhow::anyhow!("opening {}: {e}", path.display()))?;
    let mut out = Vec::new();
    for (i, line) in BufReader::new(file).lines().enumerate() {
        let line = line.map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        let e: Event = serde_json::from_str(&line)
            .map_err(|e| anyhow::anyhow!("{} line {}: {e}", path.display(), i + 1))?;
        out.push(e);
    }
    Ok(out)
}

/// A blank event for `f` on `resource`, to fill in before [`Recorder::invoke`].
pub fn event(worker: u32, f: F, resource: &str) -> Event {
    Event {
        op: 0,
        phase: Phase::Invoke,
        t_ns: 0,
        worker,
        f,
        resource: resource.to_string(),
        owner: None,
        token: None,
        ttl_ms: None,
        key: None,
        node: None,
        deliberate_stale: false,
        answer: None,
        error: None,
    }
}
