//! `fencectl __supervise`: the small process `fencectl run` puts between
//! itself and the command, so that nothing the command started outlives
//! fencectl (docs/DECISIONS.md, "fencectl run supervises the command's
//! process group").
//!
//! The command runs in its own process group. The supervisor stops that whole
//! group (SIGTERM, then SIGKILL after the grace) when it is asked to (SIGTERM,
//! SIGINT or SIGHUP), when its parent dies (the kernel then sends it SIGTERM:
//! `PR_SET_PDEATHSIG`), and when the command exits while others in its group
//! still run. It exits with the command's code.

use std::{io, process::ExitStatus, time::Duration};

use nix::{
    errno::Errno,
    sys::{
        prctl,
        signal::{killpg, Signal},
    },
    unistd::{getppid, Pid},
};
use tokio::{
    process::{Child, Command},
    signal::unix::{signal, SignalKind},
    time::Instant,
};

/// Exit code when the command could not be started (as `env` and `timeout`).
pub const EXIT_CANNOT_START: u8 = 127;
/// Exit code when the supervisor itself could not run or its parent was gone.
const EXIT_SUPERVISOR_FAILED: u8 = 1;

/// A command's exit code; 128 + N for a command ended by signal N.
pub fn exit_code(status: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => u8::try_from(c).unwrap_or(1),
        (None, Some(sig)) => u8::try_from(128 + sig).unwrap_or(1),
        _ => 1,
    }
}

/// Runs `command` under supervision; `parent` is the pid of the `fencectl run`
/// that started this process.
pub fn supervise(parent: u32, grace: Duration, command: &[String]) -> u8 {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("fencectl: supervisor: {e}");
            return EXIT_SUPERVISOR_FAILED;
        }
    };
    runtime.block_on(run(parent, grace, command))
}

/// The signals that ask the supervisor to stop the command's group.
struct StopRequests {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl StopRequests {
    fn listen() -> io::Result<StopRequests> {
        Ok(StopRequests {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
            hup: signal(SignalKind::hangup())?,
        })
    }

    async fn next(&mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
            _ = self.hup.recv() => {}
        }
    }
}

async fn run(parent: u32, grace: Duration, command: &[String]) -> u8 {
    // SIGTERM, not SIGKILL: the supervisor must live on to stop the group.
    if let Err(e) = prctl::set_pdeathsig(Signal::SIGTERM) {
        eprintln!("fencectl: supervisor: PR_SET_PDEATHSIG: {e}");
        return EXIT_SUPERVISOR_FAILED;
    }
    // Listen before starting the command, so no stop request is missed.
    let mut stops = match StopRequests::listen() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("fencectl: supervisor: cannot listen for signals: {e}");
            return EXIT_SUPERVISOR_FAILED;
        }
    };
    // A parent that died before the request above took effect sent nothing:
    // it shows as a changed parent pid. Then start nothing.
    if u32::try_from(getppid().as_raw()).ok() != Some(parent) {
        eprintln!("fencectl: supervisor: fencectl {parent} is gone; not starting the command");
        return EXIT_SUPERVISOR_FAILED;
    }
    let Some((program, args)) = command.split_first() else {
        eprintln!("fencectl: command: nothing to run after --");
        return EXIT_CANNOT_START;
    };
    let mut child = match Command::new(program).args(args).process_group(0).spawn() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("fencectl: command: cannot start {program}: {e}");
            return EXIT_CANNOT_START;
        }
    };
    // The command leads its own group: the group id is its pid.
    let Some(group) = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .map(Pid::from_raw)
    else {
        eprintln!("fencectl: supervisor: the command has no pid");
        return EXIT_SUPERVISOR_FAILED;
    };
    let status = tokio::select! {
        status = child.wait() => match status {
            // Whatever the command left running in its group goes too.
            Ok(_) => stop_group(group, grace, &mut child).await,
            Err(e) => Err(e),
        },
        _ = stops.next() => stop_group(group, grace, &mut child).await,
    };
    match status {
        Ok(s) => exit_code(s),
        Err(e) => {
            eprintln!("fencectl: supervisor: waiting for the command: {e}");
            EXIT_SUPERVISOR_FAILED
        }
    }
}

/// Whether any process (a zombie included) is still in `group`.
fn group_has_members(group: Pid) -> bool {
    !matches!(killpg(group, None), Err(Errno::ESRCH))
}

/// SIGTERM to every process in `group`, SIGKILL to those left after `grace`;
/// reaps the command (`child`, the group's leader) on the way.
async fn stop_group(group: Pid, grace: Duration, child: &mut Child) -> io::Result<ExitStatus> {
    let deadline = Instant::now() + grace;
    if !group_has_members(group) {
        return child.wait().await;
    }
    let _ = killpg(group, Signal::SIGTERM);
    let status = match tokio::time::timeout_at(deadline, child.wait()).await {
        Ok(status) => status,
        Err(_) => {
            let _ = killpg(group, Signal::SIGKILL);
            return child.wait().await;
        }
    };
    while group_has_members(group) {
        if Instant::now() >= deadline {
            let _ = killpg(group, Signal::SIGKILL);
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    status
}
