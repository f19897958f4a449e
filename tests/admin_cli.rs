//! The `ringmq` admin command line against the real broker binary (loopback, ephemeral
//! ports, temp data dirs): its output and its exit codes.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::broker::BrokerProcess;
use ringmq::client::{Client, ClientConfig, MemberSpec};

/// What one run of `ringmq` gave.
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    /// Asserts exit 0 and no error output; returns stdout.
    fn ok(self) -> String {
        assert_eq!(
            self.code, 0,
            "exit {}\nstdout:\n{}\nstderr:\n{}",
            self.code, self.stdout, self.stderr
        );
        assert!(self.stderr.is_empty(), "stderr:\n{}", self.stderr);
        self.stdout
    }

    /// Asserts exit `code` and a `ringmq: ` message on stderr; returns stderr.
    fn fails(self, code: i32) -> String {
        assert_eq!(
            self.code, code,
            "exit {}\nstdout:\n{}\nstderr:\n{}",
            self.code, self.stdout, self.stderr
        );
        assert!(
            self.stderr.starts_with("ringmq: "),
            "stderr:\n{}",
            self.stderr
        );
        self.stderr
    }

    fn json(self) -> serde_json::Value {
        let out = self.ok();
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("not JSON ({e}):\n{out}"))
    }
}

fn ringmq_env(args: &[&str], env: &[(&str, &str)]) -> Run {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ringmq"));
    cmd.args(args)
        .env_remove("RINGMQ_BROKER")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run ringmq");
    Run {
        code: out.status.code().expect("ringmq exited by a signal"),
        stdout: String::from_utf8(out.stdout).expect("stdout is UTF-8"),
        stderr: String::from_utf8(out.stderr).expect("stderr is UTF-8"),
    }
}

/// Runs `ringmq --broker ADDR args...`.
fn ringmq(addr: &str, args: &[&str]) -> Run {
    let mut all = vec!["--broker", addr];
    all.extend_from_slice(args);
    ringmq_env(&all, &[])
}

fn start_broker(dir: &tempfile::TempDir, extra: &[&str]) -> BrokerProcess {
    BrokerProcess::start(&dir.path().join("data"), 2, extra)
}

/// The value after `name=` in a `send` line.
fn field<'a>(line: &'a str, name: &str) -> &'a str {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(name).and_then(|w| w.strip_prefix('=')))
        .unwrap_or_else(|| panic!("no {name}= in {line:?}"))
}

/// Rows of a text table whose first cell is `first`.
fn row<'a>(out: &'a str, first: &str) -> Vec<&'a str> {
    out.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|cells| cells.first() == Some(&first))
        .unwrap_or_else(|| panic!("no row {first:?} in:\n{out}"))
}

#[test]
fn topic_create_list_describe_update_delete() {
    let dir = tempfile::tempdir().unwrap();
    let broker = start_broker(&dir, &[]);
    let addr = broker.addr_string();

    let out = ringmq(&addr, &["topic", "create", "orders", "--queues", "4"]).ok();
    assert_eq!(out.trim(), "created topic orders with 4 queues");
    // Default queue count, and the address from the environment instead of --broker.
    let out = ringmq_env(&["topic", "create", "audit"], &[("RINGMQ_BROKER", &addr)]).ok();
    assert_eq!(out.trim(), "created topic audit with 8 queues");

    let err = ringmq(&addr, &["topic", "create", "orders"]).fails(1);
    assert!(err.contains("TopicExists"), "{err}");

    let out = ringmq(&addr, &["topic", "list"]).ok();
    let listed: Vec<&str> = out.lines().collect();
    assert!(
        listed.contains(&"orders") && listed.contains(&"audit"),
        "{out}"
    );
    let json = ringmq(&addr, &["--json", "topic", "list"]).json();
    assert!(
        json.as_array().unwrap().contains(&"orders".into()),
        "{json}"
    );

    // Two messages in queue 1: describe counts them.
    for body in ["a", "b"] {
        ringmq(&addr, &["send", "orders", body, "--sharding-key", "k"]).ok();
    }
    let out = ringmq(&addr, &["topic", "describe", "orders"]).ok();
    assert!(
        out.starts_with("topic orders: 4 queues, 2 messages\n"),
        "{out}"
    );
    assert_eq!(row(&out, "QUEUE"), ["QUEUE", "MIN", "MAX", "MESSAGES"]);
    assert_eq!(row(&out, "total"), ["total", "2"]);
    let with_two: Vec<_> = (0..4)
        .map(|q| row(&out, &q.to_string()))
        .filter(|r| r[1..] == ["0", "2", "2"])
        .collect();
    assert_eq!(with_two.len(), 1, "{out}");
    let json = ringmq(&addr, &["--json", "topic", "describe", "orders"]).json();
    assert_eq!(json["queue_count"], 4);
    assert_eq!(json["total_messages"], 2);

    let out = ringmq(&addr, &["topic", "update", "orders", "--queues", "6"]).ok();
    assert_eq!(out.trim(), "updated topic orders: 6 queues");
    let json = ringmq(&addr, &["--json", "topic", "describe", "orders"]).json();
    assert_eq!(json["queues"].as_array().unwrap().len(), 6);
    assert_eq!(json["total_messages"], 2);
    // Queue counts only grow.
    let err = ringmq(&addr, &["topic", "update", "orders", "--queues", "2"]).fails(1);
    assert!(
        err.contains("InvalidMessage") && err.contains("only grow"),
        "{err}"
    );

    let out = ringmq(&addr, &["topic", "delete", "orders"]).ok();
    assert_eq!(out.trim(), "deleted topic orders");
    let out = ringmq(&addr, &["topic", "list"]).ok();
    assert!(!out.lines().any(|l| l == "orders"), "{out}");
    let err = ringmq(&addr, &["topic", "describe", "orders"]).fails(1);
    assert!(err.contains("TopicNotFound"), "{err}");
}

#[test]
fn send_then_look_up_by_id_key_and_offset() {
    let dir = tempfile::tempdir().unwrap();
    let broker = start_broker(&dir, &[]);
    let addr = broker.addr_string();
    ringmq(&addr, &["topic", "create", "pay", "--queues", "3"]).ok();

    let sent = ringmq(
        &addr,
        &[
            "send",
            "pay",
            "hello, ringmq",
            "--tags",
            "TagA",
            "--key",
            "order-7",
            "--key",
            "user-3",
            "--property",
            "region=eu",
        ],
    )
    .ok();
    let line = sent.trim();
    let (msg_id, queue, offset) = (
        field(line, "msg_id"),
        field(line, "queue"),
        field(line, "offset"),
    );
    assert_eq!(msg_id.len(), 32, "{line}");
    assert_eq!(offset, "0", "{line}");

    let check = |out: &str| {
        assert!(out.contains("topic:       pay\n"), "{out}");
        assert!(out.contains(&format!("queue:       {queue}\n")), "{out}");
        assert!(out.contains("offset:      0\n"), "{out}");
        assert!(out.contains(&format!("msg id:      {msg_id}\n")), "{out}");
        assert!(out.contains("tags:        TagA\n"), "{out}");
        assert!(out.contains("keys:        order-7 user-3\n"), "{out}");
        assert!(out.contains("properties:  region=eu\n"), "{out}");
        assert!(out.contains("body:        hello, ringmq\n"), "{out}");
    };
    check(&ringmq(&addr, &["message", "id", msg_id]).ok());
    check(&ringmq(&addr, &["message", "key", "pay", "order-7"]).ok());
    check(&ringmq(&addr, &["message", "offset", "pay", queue, "0"]).ok());

    let hex = ringmq(&addr, &["message", "offset", "pay", queue, "0", "--hex"]).ok();
    assert!(
        hex.contains("body:        68656c6c6f2c2072696e676d71\n"),
        "{hex}"
    );
    let json = ringmq(&addr, &["--json", "message", "id", msg_id]).json();
    assert_eq!(json["body"], "hello, ringmq");
    assert_eq!(json["msg_id"], msg_id);
    assert_eq!(json["properties"]["region"], "eu");
    assert_eq!(json["keys"], serde_json::json!(["order-7", "user-3"]));
    let json = ringmq(&addr, &["--json", "message", "key", "pay", "user-3"]).json();
    assert_eq!(json.as_array().unwrap().len(), 1, "{json}");

    // A key stored after --end-ms, a key nobody used, an offset past the end.
    let err = ringmq(
        &addr,
        &["message", "key", "pay", "order-7", "--end-ms", "1000"],
    )
    .fails(1);
    assert!(
        err.contains("no message of topic pay with key order-7"),
        "{err}"
    );
    let err = ringmq(&addr, &["message", "key", "pay", "nobody"]).fails(1);
    assert!(err.contains("no message"), "{err}");
    let err = ringmq(&addr, &["message", "offset", "pay", queue, "5"]).fails(1);
    assert!(err.contains("no message at offset 5"), "{err}");
    // A malformed id is a usage error.
    let err = ringmq(&addr, &["message", "id", "not-an-id"]).fails(2);
    assert!(err.contains("not-an-id"), "{err}");
}

#[test]
fn offset_commit_then_query() {
    let dir = tempfile::tempdir().unwrap();
    let broker = start_broker(&dir, &[]);
    let addr = broker.addr_string();
    ringmq(&addr, &["topic", "create", "jobs", "--queues", "2"]).ok();

    let out = ringmq(&addr, &["offset", "query", "workers", "jobs"]).ok();
    assert_eq!(row(&out, "0"), ["0", "-"]);
    assert_eq!(row(&out, "1"), ["1", "-"]);

    // Messages in both queues (sharding keys spread them); commit queue 1's end.
    for i in 0..8 {
        ringmq(
            &addr,
            &["send", "jobs", "m", "--sharding-key", &format!("k{i}")],
        )
        .ok();
    }
    let info = ringmq(&addr, &["--json", "topic", "describe", "jobs"]).json();
    let end = info["queues"][1]["max_offset"].as_u64().unwrap();
    assert!(end > 0, "{info}");
    let end_s = end.to_string();
    let out = ringmq(&addr, &["offset", "commit", "workers", "jobs", "1", &end_s]).ok();
    assert_eq!(
        out.trim(),
        format!("committed offset {end} for group workers on jobs queue 1")
    );
    let out = ringmq(&addr, &["offset", "query", "workers", "jobs"]).ok();
    assert!(out.starts_with("group workers, topic jobs\n"), "{out}");
    assert_eq!(row(&out, "0"), ["0", "-"]);
    assert_eq!(row(&out, "1"), ["1", &end_s]);
    let json = ringmq(&addr, &["--json", "offset", "query", "workers", "jobs"]).json();
    assert_eq!(
        json["queues"][0]["committed_offset"],
        serde_json::Value::Null
    );
    assert_eq!(json["queues"][1]["committed_offset"], end);
    // Below the committed offset a commit changes nothing, and fails saying so.
    let err = ringmq(&addr, &["offset", "commit", "workers", "jobs", "1", "0"]).fails(1);
    assert!(err.contains(&format!("keeps offset {end}")), "{err}");
    assert_eq!(
        row(
            &ringmq(&addr, &["offset", "query", "workers", "jobs"]).ok(),
            "1"
        ),
        ["1", &end_s]
    );
    // Past the queue's end a commit would make the group skip what comes next: refused.
    let err = ringmq(&addr, &["offset", "commit", "workers", "jobs", "1", "42"]).fails(1);
    assert!(err.contains("OffsetTooBig"), "{err}");

    let err = ringmq(&addr, &["offset", "commit", "workers", "jobs", "9", "1"]).fails(1);
    assert!(err.contains("QueueNotFound"), "{err}");
}

#[test]
fn consume_prints_the_sent_messages() {
    let dir = tempfile::tempdir().unwrap();
    let broker = start_broker(&dir, &[]);
    let addr = broker.addr_string();
    ringmq(&addr, &["topic", "create", "feed", "--queues", "2"]).ok();
    let mut sent = Vec::new();
    for i in 0..6 {
        let tag = if i % 2 == 0 { "Even" } else { "Odd" };
        let body = format!("msg {i}");
        let out = ringmq(&addr, &["send", "feed", &body, "--tags", tag]).ok();
        sent.push((
            field(out.trim(), "queue").to_owned(),
            field(out.trim(), "offset").to_owned(),
            tag,
            body,
        ));
    }
    let expected = |(q, o, t, b): &(String, String, &str, String)| {
        format!("queue={q} offset={o} tags={t} body={b}")
    };

    // Everything, drained: one line per message, nothing else.
    let out = ringmq(&addr, &["consume", "feed"]).ok();
    let mut lines: Vec<&str> = out.lines().collect();
    lines.sort();
    let mut want: Vec<String> = sent.iter().map(expected).collect();
    want.sort();
    assert_eq!(lines, want);

    // A tag filter, --max, one queue, from an offset, from the end.
    let out = ringmq(&addr, &["consume", "feed", "--tags", "Odd || Nope"]).ok();
    assert_eq!(out.lines().count(), 3, "{out}");
    assert!(out.lines().all(|l| l.contains("tags=Odd")), "{out}");
    let out = ringmq(&addr, &["consume", "feed", "--max", "4"]).ok();
    assert_eq!(out.lines().count(), 4, "{out}");
    let q0 = sent.iter().filter(|s| s.0 == "0").count();
    let out = ringmq(&addr, &["consume", "feed", "--queue", "0"]).ok();
    assert_eq!(out.lines().count(), q0, "{out}");
    assert!(out.lines().all(|l| l.starts_with("queue=0 ")), "{out}");
    let out = ringmq(
        &addr,
        &["consume", "feed", "--queue", "0", "--from-offset", "1"],
    )
    .ok();
    assert_eq!(out.lines().count(), q0.saturating_sub(1), "{out}");
    let out = ringmq(&addr, &["consume", "feed", "--from", "last"]).ok();
    assert_eq!(out, "");
    let out = ringmq(&addr, &["--json", "consume", "feed", "--max", "1"]).ok();
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert!(v["body"].as_str().unwrap().starts_with("msg "), "{v}");

    // --follow stops after --max, even when it must wait for the messages.
    let mut follow = Command::new(env!("CARGO_BIN_EXE_ringmq"))
        .args(["--broker", &addr, "consume", "feed", "--from", "last"])
        .args(["--follow", "--max", "2", "--wait-ms", "1000"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Whenever it starts following, it must pick up messages sent after that: keep
    // sending (numbered) until it has taken two and stopped, with a deadline.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let mut sent = 0;
    while follow.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = follow.kill();
            panic!("consume --follow --max 2 did not stop");
        }
        sent += 1;
        let body = format!("late {sent}");
        ringmq(&addr, &["send", "feed", &body, "--sharding-key", "late"]).ok();
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = follow.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    let bodies: Vec<&str> = text
        .lines()
        .map(|l| l.split_once(" body=").unwrap().1)
        .collect();
    // Two consecutive late messages of one queue (one sharding key), in order.
    assert_eq!(bodies.len(), 2, "{text}");
    let n: Vec<u32> = bodies
        .iter()
        .map(|b| b.strip_prefix("late ").unwrap().parse().unwrap())
        .collect();
    assert_eq!(n[1], n[0] + 1, "{text}");
}

#[test]
fn unknown_topics_and_bad_input_fail_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let broker = start_broker(&dir, &["--auto-create-topics", "false"]);
    let addr = broker.addr_string();

    for args in [
        &["topic", "describe", "ghost"][..],
        &["consume", "ghost"],
        &["offset", "query", "g", "ghost"],
        &["message", "offset", "ghost", "0", "0"],
        &["send", "ghost", "body"],
    ] {
        let err = ringmq(&addr, args).fails(1);
        assert!(
            err.contains("TopicNotFound") && err.contains("ghost"),
            "{args:?}: {err}"
        );
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
    }

    // Usage errors: exit 2, nothing sent.
    let err = ringmq(&addr, &["topic", "create"]).fails(2);
    assert!(err.contains("NAME"), "{err}");
    let err = ringmq(&addr, &["send", "t", "b", "--property", "novalue"]).fails(2);
    assert!(err.contains("name=value"), "{err}");
    let err = ringmq(&addr, &["send", "t", "b", "--key", "has space"]).fails(2);
    assert!(err.contains("has space"), "{err}");
    let err = ringmq(&addr, &["consume", "t", "--tags", "A ||"]).fails(2);
    assert!(err.contains("tag expression"), "{err}");
    let err = ringmq(&addr, &["topic", "create", "t", "--queues", "0"]).fails(2);
    assert!(err.contains("--queues"), "{err}");
    // Below the broker's range: the heartbeats would come every millisecond.
    let err = ringmq(
        &addr,
        &["consume", "t", "--group", "g", "--session-timeout-ms", "2"],
    )
    .fails(2);
    assert!(err.contains("--session-timeout-ms"), "{err}");
    let err = ringmq(&addr, &["group", "reset-offset", "g", "t"]).fails(2);
    assert!(
        err.contains("--timestamp-ms") || err.contains("--time"),
        "{err}"
    );
    let err = ringmq(
        &addr,
        &["group", "reset-offset", "g", "t", "--time", "yesterday"],
    )
    .fails(2);
    assert!(err.contains("RFC 3339"), "{err}");
    ringmq(&addr, &["frobnicate"]).fails(2);

    // No broker there: exit 1, naming the address.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let err = ringmq(&closed, &["--timeout-ms", "2000", "topic", "list"]).fails(1);
    assert!(err.contains(&closed), "{err}");

    // Help describes every subcommand and exits 0.
    let help = ringmq_env(&["--help"], &[]).ok();
    for sub in ["topic", "send", "message", "offset", "group", "consume"] {
        assert!(help.contains(sub), "{help}");
    }
    assert!(help.contains("RINGMQ_BROKER"), "{help}");
}

#[test]
fn group_members_progress_and_reset() {
    let dir = tempfile::tempdir().unwrap();
    let broker = start_broker(&dir, &[]);
    let addr = broker.addr_string();
    ringmq(&addr, &["topic", "create", "events", "--queues", "2"]).ok();
    for (i, key) in ["a", "b", "c", "d", "e"].iter().enumerate() {
        ringmq(
            &addr,
            &["send", "events", &format!("e{i}"), "--sharding-key", key],
        )
        .ok();
    }
    let described = ringmq(&addr, &["--json", "topic", "describe", "events"]).json();
    let max: Vec<u64> = (0..2)
        .map(|q| described["queues"][q]["max_offset"].as_u64().unwrap())
        .collect();
    assert_eq!(max.iter().sum::<u64>(), 5);

    // No commits yet: every message is lag.
    let out = ringmq(&addr, &["group", "progress", "billing", "events"]).ok();
    assert_eq!(row(&out, "QUEUE"), ["QUEUE", "COMMITTED", "MAX", "LAG"]);
    assert_eq!(row(&out, "total"), ["total", "5"], "{out}");
    assert!(
        out.starts_with("group billing, topic events: total lag 5\n"),
        "{out}"
    );

    // Queue 0 fully consumed: only queue 1's messages are lag.
    ringmq(
        &addr,
        &[
            "offset",
            "commit",
            "billing",
            "events",
            "0",
            &max[0].to_string(),
        ],
    )
    .ok();
    let out = ringmq(&addr, &["group", "progress", "billing", "events"]).ok();
    assert_eq!(
        row(&out, "0"),
        [
            "0".to_string(),
            max[0].to_string(),
            max[0].to_string(),
            "0".into()
        ]
    );
    assert_eq!(row(&out, "total")[1], max[1].to_string(), "{out}");
    let json = ringmq(&addr, &["--json", "group", "progress", "billing", "events"]).json();
    assert_eq!(json["total_lag"], max[1]);
    assert_eq!(json["queues"][0]["lag"], 0);

    // Reset to the future: nothing left; back to the epoch: everything again.
    let out = ringmq(
        &addr,
        &[
            "group",
            "reset-offset",
            "billing",
            "events",
            "--time",
            "2999-01-01T00:00:00Z",
        ],
    )
    .ok();
    assert!(
        out.starts_with("reset group billing on topic events to 2999-01-01T00:00:00.000Z"),
        "{out}"
    );
    assert_eq!(row(&out, "total"), ["total", "0"], "{out}");
    let out = ringmq(
        &addr,
        &[
            "group",
            "reset-offset",
            "billing",
            "events",
            "--timestamp-ms",
            "0",
        ],
    )
    .ok();
    assert_eq!(row(&out, "total"), ["total", "5"], "{out}");
    assert_eq!(row(&out, "0")[1], "0", "{out}");

    // Members: none (the coordinator keeps the group, its offsets reset twice), then one
    // live member with both queues.
    let out = ringmq(&addr, &["group", "members", "billing"]).ok();
    assert_eq!(out.trim(), "group billing: generation 2, 0 members");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let member = rt.block_on(async {
        let client = Client::connect(ClientConfig::new(addr.clone()))
            .await
            .unwrap();
        let spec = MemberSpec {
            subscriptions: vec![("events".into(), "*".into())],
            ..MemberSpec::default()
        };
        client.group_heartbeat("billing", &spec).await.unwrap();
        client
    });
    let client_id = member.config().client_id.clone();
    let out = ringmq(&addr, &["group", "members", "billing"]).ok();
    assert!(out.contains("1 member\n"), "{out}");
    assert!(
        out.contains(&format!("member {client_id}\n  events: queues 0 1")),
        "{out}"
    );
    let json = ringmq(&addr, &["--json", "group", "members", "billing"]).json();
    assert_eq!(json["members"][0]["client_id"], client_id.as_str());
    assert_eq!(
        json["members"][0]["topics"][0]["queues"],
        serde_json::json!([0, 1])
    );
    drop(member);
    drop(rt);
}

#[test]
fn delayed_sends_schedule_stats_and_dead_letters() {
    let dir = tempfile::tempdir().unwrap();
    let broker = start_broker(&dir, &["--delay-levels", "100ms 200ms"]);
    let addr = broker.addr_string();
    ringmq(&addr, &["topic", "create", "later", "--queues", "2"]).ok();
    // A delayed message has no queue offset until it is delivered.
    let line = ringmq(&addr, &["send", "later", "soon", "--delay-ms", "300"]).ok();
    assert_eq!(field(&line, "offset"), "scheduled", "{line}");
    // Its id names the record the broker holds: no message, with a word on why.
    let e = ringmq(&addr, &["message", "id", field(&line, "msg_id")]).fails(1);
    assert!(e.contains("a delayed or transactional send's id"), "{e}");
    let v = ringmq(
        &addr,
        &["--json", "send", "later", "lvl", "--delay-level", "2"],
    )
    .json();
    assert_eq!(v["scheduled"], true);
    assert!(v["offset"].is_null(), "{v}");
    let stats = ringmq(&addr, &["--json", "schedule", "stats"]).json();
    let shards = stats["shards"].as_array().unwrap();
    assert_eq!(shards.len(), 2);
    let pending: u64 = shards.iter().map(|s| s["pending"].as_u64().unwrap()).sum();
    assert!(pending <= 2, "{stats}");
    let text = ringmq(&addr, &["schedule", "stats"]).ok();
    assert!(text.starts_with("shard  pending"), "{text}");
    // Both arrive.
    let out = ringmq(
        &addr,
        &["consume", "later", "--wait-ms", "2000", "--max", "2"],
    )
    .ok();
    assert!(out.contains("soon") && out.contains("lvl"), "{out}");
    // Bad delays are usage errors or typed broker errors.
    ringmq(&addr, &["send", "later", "x", "--delay-level", "0"]).fails(2);
    ringmq(
        &addr,
        &[
            "send",
            "later",
            "x",
            "--delay-level",
            "1",
            "--delay-ms",
            "5",
        ],
    )
    .fails(2);
    let e = ringmq(&addr, &["send", "later", "x", "--delay-level", "3"]).fails(1);
    assert!(e.contains("InvalidDelay"), "{e}");
    // A group without dead letters.
    let out = ringmq(&addr, &["dlq", "list", "nobody"]).ok();
    assert!(out.contains("no dead letters"), "{out}");
    let v = ringmq(&addr, &["--json", "dlq", "list", "nobody"]).json();
    assert_eq!(v["messages"].as_array().unwrap().len(), 0);
}

/// `ringmq send --transaction`: commit, rollback, and unknown answered by its checker;
/// unresolved within its wait, a failure, and the half listed.
#[test]
fn the_cli_sends_in_transactions_answers_check_backs_and_lists_the_unresolved() {
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::start(&dir.path().join("data"), 2, common::FAST_CHECKS);
    let addr = broker.addr_string();
    let cli = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_ringmq"))
            .args(["--broker", &addr])
            .args(args)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, out, err) = cli(&["send", "txcli", "yes", "--transaction", "commit"]);
    assert!(
        ok && out.contains("outcome=commit resolved=true"),
        "{out}{err}"
    );
    let (ok, out, _) = cli(&["send", "txcli", "no", "--transaction", "rollback"]);
    assert!(ok && out.contains("outcome=rollback"), "{out}");
    // Unknown: the command stays up and answers the broker's check with commit.
    let (ok, out, err) = cli(&[
        "send",
        "txcli",
        "later",
        "--transaction",
        "unknown",
        "--check-answer",
        "commit",
        "--producer-group",
        "gcli",
    ]);
    assert!(ok && out.contains("resolved=true"), "{out}{err}");
    // Never answered within the wait: a failure, and the transaction is listed.
    let (ok, _, err) = cli(&[
        "send",
        "txcli",
        "pending",
        "--transaction",
        "unknown",
        "--producer-group",
        "gwait",
        "--wait-ms",
        "100",
    ]);
    assert!(!ok && err.contains("was not resolved"), "{err}");
    let (ok, out, _) = cli(&["transaction", "list"]);
    assert!(ok, "{out}");
    assert!(out.contains("txcli:") && out.contains("gwait"), "{out}");
    let (ok, out, _) = cli(&["consume", "txcli"]);
    assert!(ok);
    let mut bodies: Vec<&str> = out
        .lines()
        .filter_map(|l| l.split("body=").nth(1))
        .collect();
    bodies.sort();
    assert_eq!(bodies, ["later", "yes"], "{out}");
}

/// `ringmq send --transaction` fails, naming its transaction, when its half message is
/// discarded before its outcome lands (here its topic is deleted while it waits for the
/// check-back), instead of printing `resolved=true` and exiting 0: a script checking the
/// exit code took the message for delivered.
#[test]
fn the_cli_fails_when_its_half_is_discarded_before_its_outcome_lands() {
    let dir = tempfile::tempdir().unwrap();
    let slow_checks = ["--transaction-timeout-ms", "5000"];
    let broker = BrokerProcess::start(&dir.path().join("data"), 2, &slow_checks);
    let addr = broker.addr_string();
    common::runtime().block_on(async {
        let client = Client::connect(ClientConfig::new(&addr)).await.unwrap();
        client.create_topic("txgone", 2).await.unwrap();
        let cli = std::process::Command::new(env!("CARGO_BIN_EXE_ringmq"))
            .args([
                "--broker",
                &addr,
                "send",
                "txgone",
                "x",
                "--transaction",
                "unknown",
            ])
            .args(["--check-answer", "commit", "--wait-ms", "20000"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let list = client.list_transactions().await.unwrap();
            if list.halves.iter().any(|h| h.topic == "txgone") {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the half was never listed"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        client.delete_topic("txgone").await.unwrap();
        let out = tokio::task::spawn_blocking(|| cli.wait_with_output().unwrap());
        let out = out.await.unwrap();
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert!(!out.status.success(), "{stdout}{stderr}");
        assert!(stderr.contains("was discarded"), "{stdout}{stderr}");
        assert!(!stdout.contains("resolved=true"), "{stdout}");
    });
}
