//! The signals that ask a process to stop: Ctrl-C (SIGINT) or SIGTERM,
//! whichever comes first.

/// Returns on SIGINT or, on Unix, SIGTERM. Where SIGTERM cannot be
/// listened for, only SIGINT ends it.
pub async fn stop_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let term = async {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut s) => {
                    s.recv().await;
                }
                Err(_) => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = ctrl_c => {}
            () = term => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::time::Duration;

    use super::*;

    async fn ends_on(signal: nix::sys::signal::Signal) {
        let waiting = tokio::spawn(stop_signal());
        // The handlers are installed on the task's first poll.
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!waiting.is_finished(), "ended before any signal");
        nix::sys::signal::raise(signal).unwrap();
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("ends on the signal")
            .unwrap();
    }

    // One test for both: a process-wide signal must not reach another
    // test's listener by surprise.
    #[tokio::test(flavor = "current_thread")]
    async fn sigterm_and_sigint_each_end_the_wait() {
        ends_on(nix::sys::signal::Signal::SIGTERM).await;
        ends_on(nix::sys::signal::Signal::SIGINT).await;
    }
}
