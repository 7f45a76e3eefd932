//! The Rust examples of docs/GUIDE.md, each inside a function that gives
//! it the context the page leaves out, so that the build compiles every
//! one of them: tests/tests/console_examples.rs checks that each ```rust
//! block of the page appears here line for line (this file is not
//! formatted, so that it stays as the page writes it). Nothing here is run.

use std::path::Path;

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

/// "Holding a lease from code or a shell".
pub async fn holding_a_lease() -> Result {
    use std::time::Duration;
    use fenced_client::Client;

    let client = Client::new(["127.0.0.1:7101", "127.0.0.1:7102", "127.0.0.1:7103"])?;
    // Wait on the server up to 10 s for the resource, first come first served.
    let lease = client.lock("statement:account-1842:2026-07", Duration::from_secs(30), Duration::from_secs(10)).await?;
    let token = lease.token();          // carry it with every protected write
    let stop = lease.cancellation();    // fires when the lease is lost
    // ... before each write: lease.check()? fails as soon as the local deadline passed ...
    lease.release().await?;
    Ok(())
}

/// "fenced-resource": a write through the store.
pub fn writing_through_fenced_resource(
    token: u64,
    owner: fenced_core::OwnerId,
    pdf_bytes: Vec<u8>,
) -> Result {
    use fenced_core::{OwnerId, ResourceName, Token};
    use fenced_resource::{FenceStore, Write, WriteOutcome};

    let store = FenceStore::open("/var/lib/statements")?;
    let resource = ResourceName::new("statement:account-1842:2026-07")?;
    // token and owner come from the grant of `resource`
    let write = Write::for_resource(resource, Token::new(token)?, owner, pdf_bytes);
    match store.write(&write)? {
        WriteOutcome::Accepted { version, .. } => println!("stored as version {version}"),
        WriteOutcome::AlreadyApplied { .. } => println!("already done by this acquisition"),
        WriteOutcome::Rejected(r) => eprintln!("{r}"), // a newer owner took over: stop
    }
    Ok(())
}

/// "fenced-resource" on PostgreSQL.
pub async fn the_same_write_on_postgres(write: fenced_resource::Write) -> Result {
    let mut store = fenced_resource::postgres::PgFenceStore::connect("host=127.0.0.1 user=app dbname=app").await?;
    let outcome = store.write(&write).await?; // same Write, same WriteOutcome
    Ok(())
}

/// "Your own SQL table".
pub async fn your_own_sql_table(
    client: &mut tokio_postgres::Client,
    lease: &fenced_client::Lease,
    pdf: Vec<u8>,
) -> Result {
    use fenced_sql::{Contract, Fence, Verdict};

    let tx = client.transaction().await?;
    let fence = Fence {
        resource: "statement:account-1842:2026-07", // the lease's resource
        token: lease.token().get(),                 // and its token
        owner_id: &lease.owner_id().to_string(),    // and owner id
        operation_id: Some("statement-1842-2026-07"),
        contract: Contract::AtLeast,
    };
    match fenced_sql::postgres::guard(&tx, &fence).await? {
        Verdict::Accepted => {
            tx.execute("UPDATE account_statements SET content = $1 WHERE account_id = $2 AND period = $3",
                       &[&pdf, &1842_i64, &"2026-07"]).await?;
            tx.commit().await?;
        }
        Verdict::Duplicate => {}           // this operation id was already applied
        Verdict::Stale { highest } => {    // a newer owner wrote with `highest`: stop
            eprintln!("stale: token {} < {highest}", fence.token);
        }
    }
    Ok(())
}

/// "Your own HTTP service".
pub fn your_own_http_service(endpoints: Vec<String>) -> Result {
    use axum::{routing::post, Extension, Router};
    fn store_statement(_: String) {}
    async fn read() -> &'static str {
        "statement"
    }
    use fenced_http::{FenceLayer, Fenced, SqliteLedger};
    use fenced_resource::current::{ClusterOptions, CurrentCheck};

    let ledger = SqliteLedger::open(Path::new("/var/lib/statements/fences.db"))?;
    let check = CurrentCheck::new(ClusterOptions { endpoints, ..ClusterOptions::default() })?;
    let layer = FenceLayer::builder(ledger).cluster_check(check).build()?; // once; clone it onto each route
    let app = Router::new().route("/statements/{account}", post(write).layer(layer).get(read));

    async fn write(Extension(fenced): Extension<Fenced>, body: String) -> &'static str {
        // fenced.resource, fenced.token, fenced.owner: the checked lease
        store_statement(body);
        "stored"
    }
    let _: Router = app;
    Ok(())
}

/// "A fenced outbox with one dispatcher".
pub async fn recording_an_outbox_operation(
    client: &mut tokio_postgres::Client,
    lease: &fenced_client::Lease,
) -> Result {
    use fenced_outbox::{Operation, Recorded};
    use fenced_sql::{Contract, Fence};

    let tx = client.transaction().await?;
    let fence = Fence {
        resource: "invoice:1842",
        token: lease.token().get(),
        owner_id: &lease.owner_id().to_string(),
        operation_id: None, // the idempotency key is used
        contract: Contract::AtLeast,
    };
    let op = Operation::post("https://api.example.com/v1/charges", br#"{"amount":1842}"#, "charge-1842");
    match fenced_outbox::postgres::record(&tx, &fence, &op).await? {
        Recorded::New { .. } => {
            tx.execute("UPDATE invoices SET state = 'charging' WHERE id = $1", &[&1842_i64]).await?;
            tx.commit().await?;
        }
        Recorded::Duplicate => {}                 // recorded before under this key
        Recorded::Stale { highest } => {          // superseded by `highest`: stop
            tx.rollback().await?;
        }
    }
    Ok(())
}
