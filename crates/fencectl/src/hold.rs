//! `fencectl lock` and `fencectl run`: hold a lease for as long as a person
//! or a command needs it, and stop the command the moment the lease is lost.

use std::time::Duration;

use fenced_client::{Client, ClientError, Lease, LeaseLoss, LeaseOptions, Token};
use nix::{
    sys::signal::{kill, Signal},
    unistd::Pid,
};
use serde_json::json;
use tokio::process::{Child, Command};

use crate::{supervise::exit_code, waiting::while_waiting, Output};

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

fn granted_line(lease: &Lease, json_out: bool) {
    if json_out {
        println!(
            "{}",
            json!({"status": "granted", "resource": lease.resource(), "token": lease.token(),
                "owner_id": lease.owner_id().to_string(), "ttl_ms": lease.ttl().as_millis() as u64})
        );
    } else {
        println!(
            "granted {}: token {}, owner_id {}; holding (Ctrl-C releases)",
            lease.resource(),
            lease.token(),
            lease.owner_id()
        );
    }
}

fn lost_line(lease_resource: &str, token: Token, reason: &LeaseLoss, json_out: bool) {
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
    out: Output,
) -> Result<u8, ClientError> {
    let json_out = out.json;
    let talk = out.talks_while(wait);
    let lease = while_waiting(client, resource, talk, client.lock(resource, ttl, wait)).await?;
    granted_line(&lease, json_out);
    tokio::select! {
        reason = lease.lost() => {
            lost_line(resource, lease.token(), &reason, json_out);
            Ok(EXIT_LEASE_LOST)
        }
        _ = fenced_os::stop_signal() => {
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

/// The running supervisor (`fencectl __supervise`) and, under it, the
/// command's process group. Dropping it asks the supervisor to stop the group,
/// so no way out of `run` leaves the command behind; were fencectl killed
/// outright, the supervisor's parent-death signal does the same.
struct Supervised {
    child: Child,
}

impl Supervised {
    /// SIGTERM to the supervisor: it stops the command's group (SIGTERM, then
    /// SIGKILL after the grace) and exits.
    fn ask_to_stop(&self) {
        // No pid once reaped, so a reused pid is never signalled.
        if let Some(pid) = self.child.id().and_then(|p| i32::try_from(p).ok()) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
        }
    }

    /// Stops the command's group and waits until the supervisor is done,
    /// which is at most the grace after the request.
    async fn stop(&mut self) -> u8 {
        self.ask_to_stop();
        self.wait().await
    }

    async fn wait(&mut self) -> u8 {
        self.child.wait().await.map(exit_code).unwrap_or(1)
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        self.ask_to_stop();
    }
}

/// `fencectl run`: hold the lease while `command` runs; if the lease is lost,
/// SIGTERM the command's process group, then SIGKILL it after `grace`.
///
/// The command runs under a supervisor, this same binary re-executed as
/// `fencectl __supervise`, which puts the command in its own process group
/// and stops that group when told to, when the command exits, or when this
/// process dies (docs/DECISIONS.md).
///
/// Exit code: the command's own when it finished while the lease was held
/// (127 if it could not be started); 4 when the lease was lost (the command
/// was stopped); 3 when the lease was not granted within the wait.
pub async fn run(
    client: &Client,
    resource: &str,
    ttl: Duration,
    wait: Duration,
    grace: Option<Duration>,
    command: &[String],
    out: Output,
) -> Result<u8, ClientError> {
    let json_out = out.json;
    let (options, default_grace) = run_options(ttl);
    let grace = grace.unwrap_or(default_grace);
    let client = client.clone().with_lease_options(options);
    if command.is_empty() {
        return Err(ClientError::InvalidArgument(
            "command: nothing to run after --".into(),
        ));
    }
    let talk = out.talks_while(wait);
    let lease = while_waiting(&client, resource, talk, client.lock(resource, ttl, wait)).await?;
    // /proc/self/exe: this very binary, even if its file was replaced since.
    // Spawned from the thread that lives as long as this process, as the
    // parent-death signal follows the spawning thread.
    let spawned = Command::new("/proc/self/exe")
        .arg0("fencectl")
        .arg("__supervise")
        .arg("--parent")
        .arg(std::process::id().to_string())
        .arg("--grace-ms")
        .arg(grace.as_millis().to_string())
        .arg("--")
        .args(command)
        .env("FENCED_RESOURCE", resource)
        .env("FENCED_FENCING_TOKEN", lease.token().to_string())
        .env("FENCED_OWNER_ID", lease.owner_id().to_string())
        .env("FENCED_ENDPOINTS", client.endpoints().join(","))
        .spawn();
    let mut supervised = match spawned {
        Ok(child) => Supervised { child },
        Err(e) => {
            let _ = lease.release().await;
            return Err(ClientError::InvalidArgument(format!(
                "command: cannot start the supervisor: {e}"
            )));
        }
    };
    if json_out {
        println!(
            "{}",
            json!({"status": "running", "resource": resource, "token": lease.token(),
                "owner_id": lease.owner_id().to_string(), "pid": supervised.child.id()})
        );
    }
    tokio::select! {
        code = supervised.wait() => {
            let token = lease.token();
            lease.release().await?;
            if json_out {
                println!("{}", json!({"status": "finished", "resource": resource, "token": token, "exit_code": code}));
            }
            Ok(code)
        }
        reason = lease.lost() => {
            supervised.stop().await;
            lost_line(resource, lease.token(), &reason, json_out);
            Ok(EXIT_LEASE_LOST)
        }
        _ = fenced_os::stop_signal() => {
            supervised.stop().await;
            lease.release().await?;
            Ok(130)
        }
    }
}
