//! `fencectl lock` and `fencectl run`: hold a lease for as long as a person
//! or a command needs it, and stop the command the moment the lease is lost.

use std::{process::ExitStatus, time::Duration};

use fenced_client::{Client, ClientError, Lease, LeaseOptions, LossReason};
use nix::{
    sys::signal::{kill, Signal},
    unistd::Pid,
};
use serde_json::json;
use tokio::process::Command;

/// Exit code when the lease was lost while held.
pub const EXIT_LEASE_LOST: u8 = 4;

/// The margin and grace `run` uses: the child must be gone before the
/// cluster could grant the lease to anyone else, so SIGKILL comes at the
/// latest `grace` after the local deadline, and `grace` is half the margin.
pub fn run_options(ttl: Duration) -> (LeaseOptions, Duration) {
    let margin = (ttl / 5).max(Duration::from_millis(400)).min(ttl / 2);
    (
        LeaseOptions {
            margin: Some(margin),
            ..LeaseOptions::default()
        },
        margin / 2,
    )
}

async fn interrupted() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

fn granted_line(lease: &Lease, json_out: bool) {
    if json_out {
        println!(
            "{}",
            json!({"status": "granted", "resource": lease.resource(), "token": lease.token(),
                "owner_id": lease.owner().to_string(), "ttl_ms": lease.ttl().as_millis() as u64})
        );
    } else {
        println!(
            "granted {}: token {}, owner {}; holding (Ctrl-C releases)",
            lease.resource(),
            lease.token(),
            lease.owner()
        );
    }
}

fn lost_line(lease_resource: &str, token: u64, reason: &LossReason, json_out: bool) {
    if json_out {
        println!(
            "{}",
            json!({"status": "lost", "resource": lease_resource, "token": token, "reason": reason.to_string()})
        );
    }
    eprintln!("fencectl: lease on {lease_resource} (token {token}) lost: {reason}");
}

/// `fencectl lock`: take the lease, hold it until interrupted or lost.
pub async fn lock(
    client: &Client,
    resource: &str,
    ttl: Duration,
    wait: Duration,
    json_out: bool,
) -> Result<u8, ClientError> {
    let lease = client.lock(resource, ttl, wait).await?;
    granted_line(&lease, json_out);
    tokio::select! {
        reason = lease.lost() => {
            lost_line(resource, lease.token(), &reason, json_out);
            Ok(EXIT_LEASE_LOST)
        }
        _ = interrupted() => {
            let token = lease.token();
            lease.release().await?;
            if json_out {
                println!("{}", json!({"status": "released", "resource": resource, "token": token}));
            } else {
                println!("released {resource}: token {token}");
            }
            Ok(0)
        }
    }
}

fn signal_child(pid: Option<u32>, signal: Signal) {
    if let Some(pid) = pid.and_then(|p| i32::try_from(p).ok()) {
        let _ = kill(Pid::from_raw(pid), signal);
    }
}

fn exit_code(status: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => u8::try_from(c).unwrap_or(1),
        (None, Some(sig)) => u8::try_from(128 + sig).unwrap_or(1),
        _ => 1,
    }
}

/// `fencectl run`: hold the lease while `command` runs; if the lease is lost,
/// SIGTERM the command, then SIGKILL it after `grace`.
///
/// Exit code: the command's own when it finished while the lease was held;
/// 4 when the lease was lost (the command was stopped); 3 when the lease was
/// not granted within the wait.
pub async fn run(
    client: &Client,
    resource: &str,
    ttl: Duration,
    wait: Duration,
    grace: Option<Duration>,
    command: &[String],
    json_out: bool,
) -> Result<u8, ClientError> {
    let (options, default_grace) = run_options(ttl);
    let grace = grace.unwrap_or(default_grace);
    let client = client.clone().with_lease_options(options);
    let lease = client.lock(resource, ttl, wait).await?;
    let Some((program, args)) = command.split_first() else {
        return Err(ClientError::InvalidArgument(
            "command: nothing to run after --".into(),
        ));
    };
    let mut child = match Command::new(program)
        .args(args)
        .env("FENCED_RESOURCE", resource)
        .env("FENCED_TOKEN", lease.token().to_string())
        .env("FENCED_OWNER_ID", lease.owner().to_string())
        .env("FENCED_ENDPOINTS", client.endpoints().join(","))
        .kill_on_drop(true)
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            let _ = lease.release().await;
            return Err(ClientError::InvalidArgument(format!(
                "command: cannot start {program}: {e}"
            )));
        }
    };
    let pid = child.id();
    if json_out {
        println!(
            "{}",
            json!({"status": "running", "resource": resource, "token": lease.token(),
                "owner_id": lease.owner().to_string(), "pid": pid})
        );
    }
    tokio::select! {
        status = child.wait() => {
            let code = status.map(exit_code).unwrap_or(1);
            let token = lease.token();
            lease.release().await?;
            if json_out {
                println!("{}", json!({"status": "finished", "resource": resource, "token": token, "exit_code": code}));
            }
            Ok(code)
        }
        reason = lease.lost() => {
            signal_child(pid, Signal::SIGTERM);
            if tokio::time::timeout(grace, child.wait()).await.is_err() {
                signal_child(pid, Signal::SIGKILL);
                let _ = child.wait().await;
            }
            lost_line(resource, lease.token(), &reason, json_out);
            Ok(EXIT_LEASE_LOST)
        }
        _ = interrupted() => {
            signal_child(pid, Signal::SIGTERM);
            if tokio::time::timeout(grace, child.wait()).await.is_err() {
                signal_child(pid, Signal::SIGKILL);
                let _ = child.wait().await;
            }
            lease.release().await?;
            Ok(130)
        }
    }
}
