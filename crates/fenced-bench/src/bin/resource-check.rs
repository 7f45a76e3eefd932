//! What the protected resource's cluster check costs: the same writers put
//! through a `fenced-resource` service (in this process, on loopback, over a
//! fresh store) with the check on and off, against a running cluster.
//!
//! ```sh
//! cargo run --release --bin fenced -- dev &
//! cargo run --release -p fenced-bench --bin resource-check -- --writers 64 --duration-s 5
//! ```

use std::{sync::Arc, time::Duration};

use anyhow::{bail, Context, Result};
use clap::Parser;
use fenced_client::{Acquired, Client, Lease, DEV_ENDPOINTS};
use fenced_proto::v1::{fenced_resource_client::FencedResourceClient, put_response, PutRequest};
use fenced_resource::{
    current::{ClusterOptions, CurrentCheck},
    service::ResourceService,
    FenceStore,
};
use tokio::time::Instant;

#[derive(Parser)]
#[command(about = "writes/s and latency of fenced-resource with the cluster check on and off")]
struct Args {
    /// The cluster's client endpoints.
    #[arg(long, value_delimiter = ',', default_values_t = DEV_ENDPOINTS.map(String::from))]
    endpoints: Vec<String>,
    /// Concurrent writers, each with its own lease and key (1 to 1024).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=1024))]
    writers: u64,
    /// Seconds each run lasts (1 to 600).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=600))]
    duration_s: u64,
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let client = Client::new(args.endpoints.clone())?;
    let run = std::process::id();
    let mut leases = Vec::new();
    for i in 0..args.writers {
        let name = format!("bench/resource-check/{run}/{i}");
        match client.acquire(&name, Duration::from_secs(60)).await? {
            Acquired::Granted(lease) => leases.push(lease),
            Acquired::Held { .. } => bail!("{name} is held"),
        }
    }
    let leases = Arc::new(leases);
    let duration = Duration::from_secs(args.duration_s);
    println!(
        "{} writers, {} s each run, cluster {}",
        args.writers,
        args.duration_s,
        args.endpoints.join(",")
    );
    for check in [false, true] {
        let current = check
            .then(|| {
                CurrentCheck::new(ClusterOptions {
                    endpoints: args.endpoints.clone(),
                    ..ClusterOptions::default()
                })
            })
            .transpose()
            .map_err(anyhow::Error::msg)?;
        let (writes, refused, mut micros) = measure(&leases, current, duration).await?;
        micros.sort_unstable();
        let secs = duration.as_secs_f64();
        let ms = |q: f64| {
            let at = ((micros.len() as f64 - 1.0) * q).round() as usize;
            micros.get(at).copied().unwrap_or(0) as f64 / 1000.0
        };
        println!(
            "check {:3}: {:8.0} writes/s  p50 {:6.2} ms  p99 {:6.2} ms  ({writes} writes, {refused} refused)",
            if check { "on" } else { "off" },
            writes as f64 / secs,
            ms(0.5),
            ms(0.99),
        );
    }
    for lease in Arc::try_unwrap(leases).unwrap_or_default() {
        let _ = lease.release().await;
    }
    Ok(())
}

/// Runs the writers against a fresh service for `duration`.
async fn measure(
    leases: &Arc<Vec<Lease>>,
    current: Option<CurrentCheck>,
    duration: Duration,
) -> Result<(u64, u64, Vec<u64>)> {
    let dir = tempfile::tempdir()?;
    let store = Arc::new(FenceStore::open(dir.path())?);
    let mut service = ResourceService::new(store);
    if let Some(c) = current {
        service = service.with_current_check(c);
    }
    let addr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service.into_server())
            .serve(addr),
    );
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?.connect_lazy();
    // Wait for the listener.
    let ready = Instant::now() + Duration::from_secs(5);
    while tokio::net::TcpStream::connect(addr).await.is_err() {
        if Instant::now() > ready {
            bail!("the service did not listen on {addr}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let until = Instant::now() + duration;
    let mut tasks = Vec::new();
    for i in 0..leases.len() {
        let leases = leases.clone();
        let mut c = FencedResourceClient::new(channel.clone());
        tasks.push(tokio::spawn(async move {
            let lease = &leases[i];
            let mut micros = Vec::new();
            let (mut writes, mut refused) = (0u64, 0u64);
            while Instant::now() < until {
                let req = PutRequest {
                    key: format!("k{i}").into_bytes(),
                    resource: lease.resource().as_bytes().to_vec(),
                    token: Some(lease.token().get()),
                    owner_id: lease.owner_id().as_bytes().to_vec(),
                    value: b"v".to_vec(),
                    ..Default::default()
                };
                let start = Instant::now();
                let reply = c.put(req).await.context("put")?.into_inner();
                micros.push(u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX));
                match reply.outcome {
                    Some(put_response::Outcome::Accepted(_)) => writes += 1,
                    _ => refused += 1,
                }
            }
            anyhow::Ok((writes, refused, micros))
        }));
    }
    let mut total = (0, 0, Vec::new());
    for t in tasks {
        let (w, r, m) = t.await??;
        total.0 += w;
        total.1 += r;
        total.2.extend(m);
    }
    server.abort();
    Ok(total)
}
