//! `ringmq-bench` as a user runs it: an embedded broker, an open-loop rate, a warm-up whose
//! messages are sent, received and checked but left out of the latency histograms.

use std::process::Command;

#[test]
fn a_warm_up_is_sent_and_checked_but_left_out_of_the_latencies() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("run.json");
    let out = Command::new(env!("CARGO_BIN_EXE_ringmq-bench"))
        .current_dir(dir.path())
        .args([
            "--rate",
            "1000",
            "--duration",
            "1",
            "--warmup",
            "1",
            "--shards",
            "1",
        ])
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(text.contains("after a 1 s warm-up"), "{text}");
    let j: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let count = |key: &str| j[key].as_u64().unwrap();
    // Two seconds at 1,000 msg/s: the warm-up's second (all 1,000 of its sends are due
    // before the end) and the measured one (whose last few a loaded machine may not start
    // before the end: the bench stops on time; a stall of a loaded machine near the end
    // can leave out a few hundred, but never the measured second).
    let sent = count("messages_sent");
    assert!((1500..=2000).contains(&sent), "{sent} sent");
    assert_eq!(count("messages_received"), sent);
    assert_eq!(count("messages_missing"), 0);
    for histogram in ["send_latency_us", "e2e_latency_us"] {
        let samples = j[histogram]["samples"].as_u64().unwrap();
        assert_eq!(
            samples,
            sent - 1000,
            "{histogram}: the measured second's messages only"
        );
    }
    assert_eq!(j["config"]["warmup_s"].as_u64(), Some(1));
}

/// The open loop schedules all producers on one thread: quotas that differ by one (1,001
/// messages over 2 producers) are each sent in full, and every message arrives once.
#[test]
fn an_open_loop_sends_every_producers_quota() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("run.json");
    let out = Command::new(env!("CARGO_BIN_EXE_ringmq-bench"))
        .current_dir(dir.path())
        .args([
            "--rate",
            "4000",
            "--messages",
            "1001",
            "--producers",
            "2",
            "--shards",
            "1",
        ])
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    let j: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let count = |key: &str| j[key].as_u64().unwrap();
    assert_eq!(count("messages_sent"), 1001, "{text}");
    assert_eq!(count("messages_received"), 1001, "{text}");
    assert_eq!(count("messages_missing"), 0);
    assert_eq!(j["send_latency_us"]["samples"].as_u64(), Some(1001));
}

/// Options of the embedded broker are refused with `--broker` (a running broker's flush
/// mode is its own: `--flush sync` was taken and did nothing, and the run's JSON said no
/// mode), naming them; nothing is connected to.
#[test]
fn embedded_broker_options_are_refused_with_broker() {
    for extra in [&["--flush", "sync"][..], &["--shards", "1"][..]] {
        let out = Command::new(env!("CARGO_BIN_EXE_ringmq-bench"))
            .args(["--broker", "127.0.0.1:1", "--duration", "1"])
            .args(extra)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{extra:?} accepted");
        assert!(err.contains("do not go with --broker"), "{extra:?}: {err}");
    }
}
