//! `ringmq-bench` as a user runs it: an embedded broker, an open-loop rate, a warm-up whose
//! messages are sent, received and checked but left out of the latency histograms; a
//! group an application consumes is not moved; Ctrl-C leaves no temporary directory.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use common::broker::BrokerProcess;
use common::runtime;
use ringmq::client::{
    Client, ClientConfig, ConsumeStatus, OutgoingMessage, Producer, PushConsumer,
    PushConsumerOptions,
};

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

/// `--group` names a group of the bench's own: one with members running, or one whose
/// committed offsets are below the queues' ends, is refused and left as it was (the bench
/// set its offsets to the ends: an application's group skipped its messages).
#[test]
fn a_group_in_use_or_behind_is_not_moved_by_the_bench() {
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::start(&dir.path().join("data"), 1, &[]);
    let addr = broker.addr_string();
    let bench = |extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_ringmq-bench"))
            .args(["--broker", &addr, "--topic", "app-t", "--queues", "1"])
            .args(["--group", "app", "--consumers", "1", "--messages", "10"])
            .args(extra)
            .output()
            .unwrap()
    };
    let rt = runtime();
    let (producer, member) = rt.block_on(async {
        let producer = Producer::connect(ClientConfig::new(&addr)).await.unwrap();
        producer.client().create_topic("app-t", 1).await.unwrap();
        let member = PushConsumer::new(
            ClientConfig::new(&addr),
            "app",
            PushConsumerOptions::default(),
        )
        .unwrap();
        member.subscribe("app-t", "*").unwrap();
        member
            .register_concurrent(|_| ConsumeStatus::Success)
            .unwrap();
        member.start().await.unwrap();
        (producer, member)
    });
    let out = bench(&[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("1 member(s) running"), "{err}");
    // The member gone, its group behind by 5 messages.
    let committed = rt.block_on(async {
        member.shutdown().await.unwrap();
        let client = producer.client();
        client.commit_offset("app", "app-t", 0, 0).await.unwrap();
        for i in 0..5 {
            let m = OutgoingMessage::new(format!("order {i}"));
            producer.send("app-t", m).await.unwrap();
        }
        client.query_offset("app", "app-t", 0).await.unwrap()
    });
    assert_eq!(committed, Some(0));
    let out = bench(&[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("5 message(s) of app-t not consumed"), "{err}");
    let committed = rt.block_on(producer.client().query_offset("app", "app-t", 0));
    assert_eq!(
        committed.unwrap(),
        Some(0),
        "the refused bench moved the group"
    );
    // Said to skip them: it does, and runs.
    let out = bench(&["--skip-group-backlog"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let committed = rt.block_on(producer.client().query_offset("app", "app-t", 0));
    assert!(committed.unwrap() >= Some(15));
}

/// Ctrl-C (SIGINT) or SIGTERM during a run with the embedded broker ends it without a
/// report, and the broker's temporary data directory goes with it (the signal ended the
/// process and left the directory).
#[test]
fn an_interrupted_run_removes_its_temporary_data_directory() {
    for signal in [libc::SIGINT, libc::SIGTERM] {
        let tmp = tempfile::tempdir().unwrap();
        let mut bench = Command::new(env!("CARGO_BIN_EXE_ringmq-bench"))
            .env("TMPDIR", tmp.path())
            .args(["--shards", "1", "--duration", "60", "--rate", "100"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(bench.stderr.take().unwrap()).lines();
        let banner = lines
            .by_ref()
            .map_while(Result::ok)
            .find(|l| l.contains("(embedded)"));
        assert!(banner.is_some(), "no banner");
        let made: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
        assert_eq!(made.len(), 1, "the embedded broker's directory");
        // SAFETY: a signal to the child this test started.
        unsafe {
            libc::kill(bench.id() as i32, signal);
        }
        let rest: Vec<String> = lines.map_while(Result::ok).collect();
        let status = bench.wait().unwrap();
        // As a shell reports a process the signal ended.
        assert_eq!(status.code(), Some(128 + signal), "{rest:?}");
        assert!(
            rest.iter().any(|l| l.contains("interrupted by")),
            "{rest:?}"
        );
        let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
        assert!(left.is_empty(), "left behind: {left:?}");
    }
}

/// SIGINT during a run with `--group` against a running broker: the bench's push
/// consumers leave the group cleanly before it ends, committing what they consumed (the
/// process ended with them, their members went with the connections, and the messages
/// consumed since the last commit, up to a second's, stayed behind the group: a rerun was
/// refused for them).
#[test]
fn an_interrupted_run_leaves_its_group_with_what_it_consumed_committed() {
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::start(&dir.path().join("data"), 1, &[]);
    let addr = broker.addr_string();
    let mut bench = Command::new(env!("CARGO_BIN_EXE_ringmq-bench"))
        .args(["--broker", &addr, "--topic", "left-t", "--queues", "2"])
        .args(["--group", "left", "--consumers", "2"])
        .args(["--duration", "60", "--rate", "2000"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // A progress line: "[   2s] sent N (...)  received R (...)  errors E".
    let mut lines = BufReader::new(bench.stderr.take().unwrap()).lines();
    let received: u64 = lines
        .by_ref()
        .map_while(Result::ok)
        .filter_map(|l| {
            let (_, after) = l.split_once("received ")?;
            after.split(' ').next()?.parse().ok()
        })
        .find(|&r| r >= 2000)
        .expect("no progress line");
    let signalled = std::time::Instant::now();
    // SAFETY: a signal to the child this test started.
    unsafe {
        libc::kill(bench.id() as i32, libc::SIGINT);
    }
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let status = bench.wait().unwrap();
    assert_eq!(status.code(), Some(128 + libc::SIGINT), "{rest:?}");
    // Not at the end of --duration (the open loop's scheduler went on sending to it, and
    // the runtime's drop waited for it).
    let took = signalled.elapsed();
    assert!(
        took < std::time::Duration::from_secs(30),
        "{took:?}: {rest:?}"
    );
    let rt = runtime();
    let client = rt
        .block_on(Client::connect(ClientConfig::new(&addr)))
        .unwrap();
    let members = rt.block_on(client.group_members("left")).unwrap();
    assert!(members.members.is_empty(), "left behind: {members:?}");
    let committed: u64 = (0..2)
        .map(|q| {
            let offset = rt.block_on(client.query_offset("left", "left-t", q));
            offset.unwrap().unwrap_or(0)
        })
        .sum();
    assert!(
        committed >= received,
        "{committed} committed of {received} received: {rest:?}"
    );
}
