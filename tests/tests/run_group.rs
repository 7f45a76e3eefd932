//! `fencectl run` leaves nothing behind: the command's whole process group,
//! grandchildren included, is stopped on lease loss, on SIGTERM, when the
//! command exits, and when fencectl itself is killed with SIGKILL.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus},
    time::{Duration, Instant},
};

use fenced_tests::{bin, pid_alive, Cluster};
use nix::{
    sys::signal::{kill, Signal},
    unistd::Pid,
};

/// A `fencectl run` whose command started a grandchild that ignores SIGTERM
/// and appends to a file every 50 ms.
struct Running {
    fencectl: Child,
    child: i32,
    grandchild: i32,
    grows: PathBuf,
}

fn read_pid(path: &Path) -> Option<i32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn file_len(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}

/// Starts `fencectl run` with `args` before `--`, the command given by
/// `tail` after the grandchild started (`wait` to keep running, `exit 5` to
/// leave the grandchild behind), and waits until the file grows.
// Running's Drop kills and waits for fencectl; the lint does not follow the move.
#[allow(clippy::zombie_processes)]
async fn start(cluster: &Cluster, dir: &Path, args: &[&str], tail: &str) -> Running {
    let child_pid = dir.join("child.pid");
    let grand_pid = dir.join("grand.pid");
    let grows = dir.join("grows.txt");
    let script = format!(
        "echo $$ > {child}; \
         ( trap '' TERM; while :; do echo x >> {grows}; sleep 0.05; done ) & \
         echo $! > {grand}; {tail}",
        child = child_pid.display(),
        grows = grows.display(),
        grand = grand_pid.display(),
    );
    let mut fencectl = Command::new(bin("fencectl"))
        .args(["--endpoints", &cluster.endpoints().join(","), "run"])
        .args(args)
        .args(["--", "sh", "-c", &script])
        .spawn()
        .expect("fencectl starts");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let (Some(child), Some(grandchild)) = (read_pid(&child_pid), read_pid(&grand_pid)) {
            if file_len(&grows) > 0 {
                return Running {
                    fencectl,
                    child,
                    grandchild,
                    grows,
                };
            }
        }
        if Instant::now() >= deadline {
            let _ = fencectl.kill();
            let _ = fencectl.wait();
            panic!("the command never started");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

impl Running {
    /// Waits until the child and the grandchild are gone; returns how long
    /// each took from `since`. Panics after `within`.
    async fn gone(&self, since: Instant, within: Duration) -> (Duration, Duration) {
        let (mut child_gone, mut grand_gone) = (None, None);
        loop {
            if child_gone.is_none() && !pid_alive(self.child) {
                child_gone = Some(since.elapsed());
            }
            if grand_gone.is_none() && !pid_alive(self.grandchild) {
                grand_gone = Some(since.elapsed());
            }
            if let (Some(c), Some(g)) = (child_gone, grand_gone) {
                return (c, g);
            }
            assert!(
                since.elapsed() < within,
                "still running after {within:?}: child {} {child_gone:?}, grandchild {} {grand_gone:?}",
                self.child,
                self.grandchild
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Nobody writes the file any more.
    async fn assert_file_stopped_growing(&self) {
        let before = file_len(&self.grows);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(
            file_len(&self.grows),
            before,
            "something still writes to the file"
        );
    }

    fn wait_fencectl(&mut self, within: Duration) -> ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.fencectl.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "fencectl did not exit");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.fencectl.kill();
        let _ = self.fencectl.wait();
        for pid in [self.child, self.grandchild] {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}

const GRACE: Duration = Duration::from_secs(1);
/// Time for signals to be delivered and noticed on a loaded machine.
const SLACK: Duration = Duration::from_millis(1_500);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_fencectl_takes_the_command_and_its_grandchild_with_it() {
    let cluster = Cluster::start(3).await;
    let dir = tempfile::tempdir().unwrap();
    let mut run = start(
        &cluster,
        dir.path(),
        &["run-kill9", "--ttl", "30s", "--grace", "1s"],
        "wait",
    )
    .await;
    run.fencectl.kill().unwrap(); // SIGKILL
    let killed = Instant::now();
    run.fencectl.wait().unwrap();
    let (child, grandchild) = run.gone(killed, GRACE + SLACK).await;
    // The child dies of the SIGTERM; the grandchild ignores it and dies of
    // the SIGKILL that comes after the grace.
    assert!(child < GRACE, "child took {child:?}");
    assert!(
        grandchild >= GRACE - Duration::from_millis(100),
        "grandchild gone after {grandchild:?}, before the grace: was it signalled at all?"
    );
    run.assert_file_stopped_growing().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_lease_loss_the_grandchild_is_gone_before_the_lease_could_be_granted_again() {
    let cluster = Cluster::start(3).await;
    let dir = tempfile::tempdir().unwrap();
    let ttl = Duration::from_secs(3);
    let mut run = start(&cluster, dir.path(), &["run-lost", "--ttl", "3s"], "wait").await;
    cluster.signal_all(Signal::SIGSTOP);
    let cut_off = Instant::now();
    let gone = run.gone(cut_off, ttl).await;
    let status = run.wait_fencectl(ttl);
    cluster.signal_all(Signal::SIGCONT);
    assert!(gone.1 < ttl, "grandchild gone after {:?}", gone.1);
    assert_eq!(status.code(), Some(4), "the lease was lost");
    run.assert_file_stopped_growing().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_to_fencectl_and_a_command_that_exits_leave_no_grandchild() {
    let cluster = Cluster::start(3).await;

    let dir = tempfile::tempdir().unwrap();
    let mut run = start(
        &cluster,
        dir.path(),
        &["run-term", "--ttl", "30s", "--grace", "1s"],
        "wait",
    )
    .await;
    kill(Pid::from_raw(run.fencectl.id() as i32), Signal::SIGTERM).unwrap();
    let sent = Instant::now();
    let status = run.wait_fencectl(GRACE + SLACK + Duration::from_secs(5));
    assert_eq!(status.code(), Some(130));
    // fencectl exits only once the group is stopped.
    assert!(!pid_alive(run.child) && !pid_alive(run.grandchild));
    assert!(sent.elapsed() >= GRACE - Duration::from_millis(100));
    run.assert_file_stopped_growing().await;

    // The command exits 5 and leaves its grandchild running: the grandchild
    // is stopped before fencectl releases the lease and exits with 5.
    let dir = tempfile::tempdir().unwrap();
    let mut run = start(
        &cluster,
        dir.path(),
        &["run-exit", "--ttl", "30s", "--grace", "1s"],
        // Exit only once the grandchild wrote, so it ignores SIGTERM by then
        // (a SIGTERM before its trap would end it at once).
        &format!(
            "while [ ! -s {} ]; do sleep 0.01; done; exit 5",
            dir.path().join("grows.txt").display()
        ),
    )
    .await;
    let status = run.wait_fencectl(GRACE + SLACK + Duration::from_secs(5));
    assert_eq!(status.code(), Some(5), "the command's own exit code");
    assert!(
        !pid_alive(run.grandchild),
        "the grandchild outlived fencectl"
    );
    run.assert_file_stopped_growing().await;
    let d = cluster.client().describe("run-exit").await.unwrap();
    assert!(!d.held, "the lease was released");
}
