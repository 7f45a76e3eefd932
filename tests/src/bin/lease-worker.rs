//! A worker process for the pause tests: takes a lease with the client
//! library and reports, every 50 ms, whether it still holds it.
//!
//! Usage: lease-worker ENDPOINTS RESOURCE TTL_MS
//! Prints `granted TOKEN`, then `ok` lines while held, then `lost REASON`
//! once, then keeps printing `lost` so a test sees what happens after a pause.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{io::Write, time::Duration};

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let endpoints: Vec<&str> = args[1].split(',').collect();
    let resource = &args[2];
    let ttl = Duration::from_millis(args[3].parse().unwrap());
    let client = fenced_client::Client::new(endpoints).unwrap();
    let lease = client
        .lock(resource, ttl, Duration::from_secs(10))
        .await
        .unwrap();
    let mut out = std::io::stdout();
    writeln!(out, "granted {}", lease.token()).unwrap();
    let mut reported = false;
    loop {
        match lease.check() {
            Ok(()) => writeln!(out, "ok").unwrap(),
            Err(reason) if !reported => {
                writeln!(out, "lost {reason}").unwrap();
                reported = true;
            }
            Err(_) => writeln!(out, "lost").unwrap(),
        }
        out.flush().unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
