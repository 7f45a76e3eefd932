//! The status page on the metrics port, against three real nodes with auth
//! on: who may see it, what it shows, and (in headless Chromium) that the
//! page a browser loads lists a lease and follows a leader change.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use fenced_client::{AcquireOutcome, Client};
use fenced_core::OwnerId;
use fenced_tests::{http_get_with as get, write_auth_files, Cluster};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const POLICY: &str = r#"
[roles.app]
lock = [""]
read = [""]

[roles.ops]
admin = true
"#;

/// A resource name a browser must show as text, never run.
const HOSTILE: &str = "page/<script>alert(1)</script>";

struct Secured {
    cluster: Cluster,
    /// Metrics addresses; index 0 is node 1.
    metrics: Vec<String>,
    _files: tempfile::TempDir,
}

/// Three nodes with a metrics listener each; `app-token` may lock and
/// read everything, `ops-token` is admin.
async fn secured() -> Secured {
    let files = tempfile::tempdir().unwrap();
    let (tokens, policy) = write_auth_files(
        files.path(),
        &[("app", "app-token", "app"), ("ops", "ops-token", "ops")],
        POLICY,
    );
    let (cluster, metrics) = Cluster::start_with_metrics(3, |s| {
        s.auth_tokens = Some(tokens.clone().into());
        s.auth_policy = Some(policy.clone().into());
    })
    .await;
    Secured {
        cluster,
        metrics,
        _files: files,
    }
}

async fn acquire(client: &Client, resource: &str) -> u64 {
    match client
        .acquire_once(
            resource,
            OwnerId::random(),
            Duration::from_secs(120),
            Duration::ZERO,
        )
        .await
    {
        Ok(AcquireOutcome::Granted { token, .. }) => token.get(),
        other => panic!("expected a grant of {resource}, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_view_is_for_admins_and_escapes_resource_names() {
    let s = secured().await;
    let app = s.cluster.client().with_token("app-token").unwrap();
    let token = acquire(&app, HOSTILE).await;
    acquire(&app, "page/plain").await;
    let leader = s.cluster.wait_for_leader(Duration::from_secs(10)).await;
    let addr = &s.metrics[(leader - 1) as usize];

    // No credential, an unknown token, a header that is not Bearer: 401.
    for headers in [
        &[][..],
        &["Authorization: Bearer mallory-token"][..],
        &["Authorization: Basic b3BzOm9wcw=="][..],
    ] {
        let (status, head, body) = get(addr, "/status", headers).await;
        assert_eq!(status, 401, "{headers:?}: {body}");
        assert!(head.contains("www-authenticate: bearer"), "{head}");
        assert!(body.contains("authentication failed"), "{body}");
        assert!(!body.contains("page/"), "{body}");
    }
    // A known identity without admin: 403, and no data.
    let (status, _, body) = get(addr, "/status", &["Authorization: Bearer app-token"]).await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("\"app\"") && body.contains("admin"), "{body}");
    assert!(!body.contains("page/"), "{body}");

    // The admin sees both leases, the hostile name as text.
    let ops = ["Authorization: Bearer ops-token"];
    let (status, head, body) = get(addr, "/status", &ops).await;
    assert_eq!(status, 200, "{body}");
    assert!(head.contains("content-type: text/html"), "{head}");
    assert!(
        head.contains("content-security-policy: default-src 'none'"),
        "{head}"
    );
    assert!(head.contains("x-content-type-options: nosniff"), "{head}");
    assert!(!body.contains("<script"), "{body}");
    assert!(
        body.contains("page/&lt;script&gt;alert(1)&lt;/script&gt;"),
        "{body}"
    );
    assert!(
        body.contains(&format!("<td class=\"n\">{token}</td>")),
        "{body}"
    );
    assert!(body.contains("page/plain"), "{body}");
    // Each lease names the identity holding it (never its owner id), its
    // job label (none here) and its grant date on the leader's clock.
    assert!(
        body.contains("<td><code>app</code></td><td>–</td><td>20") && body.contains(" UTC</td>"),
        "{body}"
    );
    assert!(
        body.contains(&format!("data-leader=\"{leader}\"")),
        "{body}"
    );
    assert!(
        body.contains(&format!("<h2>Node {leader}: leader, term")),
        "{body}"
    );

    // The filter and the row bound.
    let (_, _, body) = get(addr, "/status?prefix=page%2Fpl", &ops).await;
    assert!(
        body.contains("page/plain") && !body.contains("alert"),
        "{body}"
    );
    let (_, _, body) = get(addr, "/status?rows=1", &ops).await;
    assert!(
        body.contains("2 live, 1 shown") && body.contains("and 1 more"),
        "{body}"
    );
    // Bad parameters name the field and the bound.
    let (status, _, body) = get(addr, "/status?rows=100000", &ops).await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("rows") && body.contains("1000"), "{body}");
    let long = "x".repeat(201);
    let (status, _, body) = get(addr, &format!("/status?prefix={long}"), &ops).await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("prefix") && body.contains("200"), "{body}");

    // The shell holds no data, so it needs no credential; its policy admits
    // only its own script and style.
    let (status, head, body) = get(addr, "/", &[]).await;
    assert_eq!(status, 200, "{body}");
    assert!(head.contains("script-src 'sha256-"), "{head}");
    assert!(!head.contains("unsafe-inline"), "{head}");
    assert!(!body.contains("page/"), "{body}");
    // Writes are not served.
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(
            b"POST /status HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
        )
        .await
        .unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    assert!(String::from_utf8_lossy(&raw).starts_with("HTTP/1.1 405"));
}

/// With auth on, a plaintext metrics listener on an address other than
/// loopback serves no status page: a token would cross the network in
/// clear. The shell carries no script there, so a browser sends nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_status_page_where_a_token_would_travel_in_clear() {
    let files = tempfile::tempdir().unwrap();
    let (tokens, policy) = write_auth_files(files.path(), &[("ops", "ops-token", "ops")], POLICY);
    let port = fenced_tests::free_port();
    let _cluster = Cluster::start_with(1, |s| {
        s.auth_tokens = Some(tokens.clone().into());
        s.auth_policy = Some(policy.clone().into());
        s.metrics_listen = Some(format!("0.0.0.0:{port}"));
    })
    .await;
    let addr = format!("127.0.0.1:{port}");
    let (status, _, body) = get(&addr, "/status", &["Authorization: Bearer ops-token"]).await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("--metrics-tls"), "{body}");
    let (status, _, body) = get(&addr, "/", &[]).await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body.contains("--metrics-tls") && !body.contains("<script"),
        "{body}"
    );
    // Metrics are served as before.
    let (status, _, body) = get(&addr, "/metrics", &[]).await;
    assert_eq!(status, 200, "{body}");
}

/// Headless Chromium from the system, or `None` (a loud skip) when it is
/// not installed and this is not CI; under CI a missing browser fails.
fn chromium() -> Option<PathBuf> {
    fenced_tests::tool_on_path(
        &["chromium", "chromium-browser"],
        "the status page's browser test needs chromium (apt-get install chromium; .ci/run installs it)",
    )
}

/// The page's DOM after its script ran in headless Chromium; `url` carries
/// the token in its fragment.
async fn load_in_browser(chromium: &Path, url: &str) -> String {
    let profile = tempfile::tempdir().unwrap();
    let run = tokio::process::Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-dev-shm-usage",
            &format!("--user-data-dir={}", profile.path().display()),
            // Virtual time waits for the page's fetches; 5 s of it is two
            // refreshes after the first load.
            "--virtual-time-budget=5000",
            "--dump-dom",
            url,
        ])
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(90), run)
        .await
        .expect("chromium dumps the page within 90 s")
        .unwrap();
    assert!(
        out.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The leader a loaded page shows.
fn leader_shown(dom: &str) -> Option<String> {
    let at = dom.find("data-leader=\"")? + "data-leader=\"".len();
    dom.get(at..)?.split('"').next().map(str::to_string)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_sees_leases_and_the_new_leader_after_the_old_one_dies() {
    let Some(chromium) = chromium() else {
        return;
    };
    let mut s = secured().await;
    let app = s
        .cluster
        .client()
        .with_token("app-token")
        .unwrap()
        .with_job_label("nightly <job>")
        .unwrap();
    let token = acquire(&app, HOSTILE).await;
    let old = s.cluster.wait_for_leader(Duration::from_secs(10)).await;
    let follower = (1..=3).find(|id| *id != old).unwrap();
    let url = format!(
        "http://{}/#token=ops-token",
        s.metrics[(follower - 1) as usize]
    );

    let dom = load_in_browser(&chromium, &url).await;
    assert!(
        dom.contains("id=\"leases\""),
        "the view did not load:\n{dom}"
    );
    assert_eq!(leader_shown(&dom), Some(old.to_string()), "{dom}");
    // A follower's page points at the leader's, and lists every member's.
    let leaders_page = format!("http://{}/", s.metrics[(old - 1) as usize]);
    assert!(
        dom.contains(&format!("<a id=\"leader-page\" href=\"{leaders_page}\">")),
        "no link to the leader's page {leaders_page}:\n{dom}"
    );
    for (i, metrics) in s.metrics.iter().enumerate() {
        if i as u64 + 1 != follower {
            assert!(
                dom.contains(&format!("<a href=\"http://{metrics}/\">")),
                "{metrics}:\n{dom}"
            );
        }
    }
    // The lease, its name as text: no script element came from it.
    assert!(
        dom.contains("page/&lt;script&gt;alert(1)&lt;/script&gt;"),
        "{dom}"
    );
    assert_eq!(
        dom.matches("<script").count(),
        1,
        "only the shell's own script:\n{dom}"
    );
    assert!(dom.contains(&format!(">{token}</td>")), "{dom}");
    // The job label its acquire gave, as text.
    assert!(dom.contains("<td>nightly &lt;job&gt;</td>"), "{dom}");
    assert!(dom.contains("updated "), "{dom}");
    // Its grant is among the recent grants and ends.
    let recent = dom.split("id=\"recent\"").nth(1).unwrap_or_default();
    assert!(
        recent
            .contains("page/&lt;script&gt;alert(1)&lt;/script&gt;</code></a></td><td>granted</td>")
            && recent.contains(&format!("<td class=\"n\">{token}</td>")),
        "no recent grant of the lease:\n{dom}"
    );

    // The resource's link opens its history: the grant, live, dated.
    let link = dom
        .split("<a href=\"/?resource=")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap_or_else(|| panic!("no resource link:\n{dom}"))
        .replace("&amp;", "&");
    assert!(link.starts_with("page%2F%3Cscript%3E"), "{link}");
    let history_url = format!(
        "http://{}/?resource={link}#token=ops-token",
        s.metrics[(follower - 1) as usize]
    );
    let dom = load_in_browser(&chromium, &history_url).await;
    let history = dom
        .split("id=\"history\"")
        .nth(1)
        .unwrap_or_else(|| panic!("no history view at {history_url}:\n{dom}"));
    assert!(
        dom.contains("History of <code>page/&lt;script&gt;alert(1)&lt;/script&gt;</code>"),
        "{dom}"
    );
    assert!(
        history.contains(&format!("<td class=\"n\">{token}</td><td>20"))
            && history.contains("<td>live</td>"),
        "{history}"
    );
    assert_eq!(dom.matches("<script").count(), 1, "{dom}");

    // Without the token the browser is told what is missing.
    let bare = load_in_browser(&chromium, &format!("http://{}/", s.metrics[0])).await;
    assert!(bare.contains("401") && bare.contains("#token="), "{bare}");
    assert!(!bare.contains("page/"), "{bare}");

    s.cluster.kill(old);
    let deadline = Instant::now() + Duration::from_secs(30);
    let new = loop {
        let dom = load_in_browser(&chromium, &url).await;
        match leader_shown(&dom) {
            Some(l) if l != old.to_string() && l != "none" => break (l, dom),
            shown => assert!(
                Instant::now() < deadline,
                "the page still shows leader {shown:?} 30 s after node {old} was killed:\n{dom}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let elected = s.cluster.wait_for_leader(Duration::from_secs(10)).await;
    assert_eq!(new.0, elected.to_string(), "{}", new.1);
    // The lease outlived the leader.
    assert!(new.1.contains(&format!(">{token}</td>")), "{}", new.1);
}
