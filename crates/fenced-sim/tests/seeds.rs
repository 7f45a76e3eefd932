//! The deterministic simulation: a seed replays exactly, and many seeds of
//! faults pass every checker. `FENCED_SIM_SEEDS` sets how many (default 12,
//! 20 simulated seconds each).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use fenced_sim::SimConfig;

fn cfg(seconds: u64) -> SimConfig {
    SimConfig {
        duration: Duration::from_secs(seconds),
        ..SimConfig::default()
    }
}

#[test]
fn a_seed_replays_exactly() {
    let first = fenced_sim::run(4242, &cfg(10)).unwrap();
    let again = fenced_sim::run(4242, &cfg(10)).unwrap();
    assert!(first.events.len() > 200, "{}", first.summary());
    assert_eq!(first.faults, again.faults);
    assert_eq!(first.events.len(), again.events.len());
    for (a, b) in first.events.iter().zip(&again.events) {
        assert_eq!(a, b, "the same seed, a different history");
    }
    // Another seed, another history.
    let other = fenced_sim::run(4243, &cfg(10)).unwrap();
    assert_ne!(first.history_hash(), other.history_hash());
}

#[test]
fn seeds_of_faults_pass_every_checker() {
    let seeds: u64 = std::env::var("FENCED_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let mut faults = 0;
    let mut seen = Vec::new();
    for seed in 1..=seeds {
        let v = fenced_sim::run(seed, &cfg(20)).unwrap();
        eprintln!("{}", v.summary());
        assert!(v.failure().is_none(), "{}", v.summary());
        // A run that granted nothing or checked nothing proves nothing.
        assert!(v.grants > 100, "{}", v.summary());
        for name in [
            "a renew keeps its token",
            "cluster time never runs ahead of real time",
        ] {
            let f = v.findings.iter().find(|f| f.name == name).unwrap();
            assert!(f.checked > 0, "{name} checked nothing: {}", v.summary());
        }
        faults += v.faults.len();
        seen.extend(v.faults);
    }
    assert!(
        faults as u64 >= 3 * seeds,
        "{faults} faults in {seeds} seeds"
    );
    // Every class of disk fault was drawn, and did what it says.
    for class in [
        "refused its damaged data; fenced repair, then start",
        "lose its data dir",
        "disk answers Eio",
        "disk answers Full",
        "stopped on a storage error",
        "crashed mid-flush",
    ] {
        assert!(
            seen.iter().any(|f| f.contains(class)),
            "no \"{class}\" in {seeds} seeds: {seen:#?}"
        );
    }
}
