//! The test network: one namespace per node, joined by a bridge that lives in
//! a hub namespace, plus a veth from the harness's own namespace to the same
//! bridge. Addresses come from a private range that exists only inside these
//! namespaces. Partitions are nftables rules in each node's namespace, with
//! counters, so the harness can prove a fault dropped packets.
//!
//! Everything is removed on drop, and stale leftovers of an earlier run are
//! removed before setting up.

use std::process::Command;

use anyhow::{bail, Context, Result};

/// Namespace and interface names all start with this.
const PREFIX: &str = "fj";
/// The harness's own address on the test network.
pub const HARNESS_ADDR: &str = "10.77.0.100";
const TABLE: &str = "fjepsen";

/// The address of node `id` (1-based).
pub fn node_addr(id: u64) -> String {
    format!("10.77.0.{id}")
}

/// The namespace of node `id`.
pub fn node_ns(id: u64) -> String {
    format!("{PREFIX}-n{id}")
}

fn hub_ns() -> String {
    format!("{PREFIX}-hub")
}

fn run(args: &[&str]) -> Result<String> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .with_context(|| format!("running {}", args.join(" ")))?;
    if !out.status.success() {
        bail!(
            "{} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn nft_in(ns: &str, script: &str) -> Result<String> {
    run(&["ip", "netns", "exec", ns, "nft", script])
}

/// The network of `nodes` nodes. Dropping it removes every namespace,
/// interface and rule it created.
pub struct Net {
    nodes: u64,
}

impl Net {
    pub fn create(nodes: u64) -> Result<Net> {
        teardown(nodes);
        let net = Net { nodes };
        let hub = hub_ns();
        run(&["ip", "netns", "add", &hub])?;
        run(&["ip", "-n", &hub, "link", "set", "lo", "up"])?;
        run(&["ip", "-n", &hub, "link", "add", "br0", "type", "bridge"])?;
        run(&["ip", "-n", &hub, "link", "set", "br0", "up"])?;
        for id in 1..=nodes {
            let ns = node_ns(id);
            let (a, b) = (format!("{PREFIX}n{id}a"), format!("{PREFIX}n{id}b"));
            run(&["ip", "netns", "add", &ns])?;
            run(&["ip", "-n", &ns, "link", "set", "lo", "up"])?;
            run(&["ip", "link", "add", &a, "type", "veth", "peer", "name", &b])?;
            run(&["ip", "link", "set", &a, "netns", &ns])?;
            run(&["ip", "link", "set", &b, "netns", &hub])?;
            run(&[
                "ip",
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{}/24", node_addr(id)),
                "dev",
                &a,
            ])?;
            run(&["ip", "-n", &ns, "link", "set", &a, "up"])?;
            run(&["ip", "-n", &hub, "link", "set", &b, "master", "br0", "up"])?;
            nft_in(
                &ns,
                &format!(
                    "add table inet {TABLE}; \
                     add chain inet {TABLE} input {{ type filter hook input priority 0; policy accept; }}"
                ),
            )?;
        }
        let (a, b) = (format!("{PREFIX}h0"), format!("{PREFIX}h0b"));
        run(&["ip", "link", "add", &a, "type", "veth", "peer", "name", &b])?;
        run(&["ip", "link", "set", &b, "netns", &hub])?;
        run(&[
            "ip",
            "addr",
            "add",
            &format!("{HARNESS_ADDR}/24"),
            "dev",
            &a,
        ])?;
        run(&["ip", "link", "set", &a, "up"])?;
        run(&["ip", "-n", &hub, "link", "set", &b, "master", "br0", "up"])?;
        Ok(net)
    }

    /// Drops packets arriving at `to` from `from` (a node id or the harness),
    /// with probability `percent` (100: always). Tagged with `tag` for
    /// counting and removal.
    pub fn drop_from(&self, to: u64, from: &str, percent: u32, tag: &str) -> Result<()> {
        let cond = if percent >= 100 {
            String::new()
        } else {
            format!("numgen random mod 100 < {percent} ")
        };
        nft_in(
            &node_ns(to),
            &format!(
                "add rule inet {TABLE} input ip saddr {from} {cond}counter drop comment \"{tag}\""
            ),
        )?;
        Ok(())
    }

    /// Packets dropped so far by the rules tagged `tag`, over all nodes.
    pub fn dropped(&self, tag: &str) -> Result<u64> {
        let mut total = 0;
        for id in 1..=self.nodes {
            let text = nft_in(&node_ns(id), &format!("list chain inet {TABLE} input"))?;
            for line in text.lines().filter(|l| l.contains(&format!("\"{tag}\""))) {
                let mut words = line.split_whitespace();
                while let Some(w) = words.next() {
                    if w == "packets" {
                        total += words
                            .next()
                            .and_then(|n| n.parse::<u64>().ok())
                            .unwrap_or(0);
                    }
                }
            }
        }
        Ok(total)
    }

    /// Removes every partition rule.
    pub fn heal(&self) -> Result<()> {
        for id in 1..=self.nodes {
            nft_in(&node_ns(id), &format!("flush chain inet {TABLE} input"))?;
        }
        Ok(())
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        teardown(self.nodes);
    }
}

/// Removes the namespaces and interfaces of a run (also a crashed earlier
/// one). Deleting a namespace removes its interfaces, rules and veth peers.
pub fn teardown(nodes: u64) {
    let _ = run(&["ip", "link", "del", &format!("{PREFIX}h0")]);
    for id in 1..=nodes.max(3) {
        let _ = run(&["ip", "netns", "del", &node_ns(id)]);
    }
    let _ = run(&["ip", "netns", "del", &hub_ns()]);
}
