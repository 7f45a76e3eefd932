use std::time::Duration;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let client =
        fenced_client::Client::new(["127.0.0.1:7101", "127.0.0.1:7102", "127.0.0.1:7103"])?;
    let resource = "statement:account-1842:2026-07";
    let lease = client
        .lock(resource, Duration::from_secs(30), Duration::from_secs(10))
        .await?;
    for row in ["opening balance", "charges", "closing balance"] {
        lease.check()?; // fails as soon as the lease is lost or its local deadline passed
        println!("write {row:?} with fencing token {}", lease.token()); // your store refuses older tokens
    }
    lease.release().await?;
    Ok(())
}
