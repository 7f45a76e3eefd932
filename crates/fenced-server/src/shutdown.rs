//! The signals that ask a process of the workspace to stop: Ctrl-C
//! (SIGINT) or SIGTERM, whichever comes first.

/// Returns on SIGINT or, on Unix, SIGTERM. Where SIGTERM cannot be
/// listened for, only SIGINT ends it.
pub async fn signal() {
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
