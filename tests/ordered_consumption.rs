//! Consumer groups made of real processes: the `ringmq-broker` binary (2 shards, 3 s session
//! timeout, loopback, ephemeral ports) and `ringmq consume --group` processes, whose output
//! lines (`START`/`MSG`, with wall-clock processing intervals) are the record checked here.
//!
//! - Ordered consumption: 3 orderly consumer processes on an 8-queue topic, 40 keys x 50
//!   messages sent with sharding keys; one consumer is SIGKILLed mid-stream. Checked: per
//!   key order (no gap, no reordering, re-deliveries only as described at
//!   [`check_key_order`]), queue exclusion (no two processing intervals of one queue
//!   overlap, the killed consumer's unfinished message counting up to its death), and how
//!   long the killed consumer's queues took to be consumed again (printed).
//! - Clustering: 3 concurrent consumer processes on 16 queues, a 4th joins and one leaves
//!   (SIGTERM, clean) mid-stream: nothing is lost; duplicates happen only around the
//!   membership changes (see [`check_duplicates`]); counted and printed.
//!
//! Timeouts are upper bounds for a slow machine, never the behaviour under test.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::broker::BrokerProcess;
use ringmq::client::{Client, ClientConfig, OutgoingMessage, Producer};

/// Bound on every wait for something the consumers must do.
const PATIENCE: Duration = Duration::from_secs(60);
/// The broker's session timeout in these tests, given to the consumers too.
const SESSION_TIMEOUT_MS: &str = "3000";

/// One test at a time: each runs a broker and 3 or 4 consumer processes, a lot for a small
/// machine, and the timings printed would be meaningless under a second test's load.
static SERIAL: Mutex<()> = Mutex::new(());

fn wall_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

/// One output line of a consumer process.
#[derive(Debug, Clone)]
struct Event {
    client: String,
    /// A `START` line (processing began); otherwise a `MSG` line (processing finished).
    start_only: bool,
    queue: u32,
    offset: u64,
    start_ns: u64,
    /// `MSG` lines only.
    end_ns: Option<u64>,
    key: String,
    body: String,
}

/// Parses `MSG client=.. queue=.. offset=.. start_ns=.. end_ns=.. key=.. body=..` or
/// `START client=.. queue=.. offset=.. start_ns=.. key=..`.
fn parse_line(line: &str) -> Event {
    fn bad<T>(line: &str) -> T {
        panic!("unexpected consumer output line: {line:?}")
    }
    let (kind, rest) = line.split_once(' ').unwrap_or_else(|| bad(line));
    let (fields, body) = match rest.split_once(" body=") {
        Some((fields, body)) => (fields, body.to_owned()),
        None => (rest, String::new()),
    };
    let fields: BTreeMap<&str, &str> = fields
        .split(' ')
        .map(|f| f.split_once('=').unwrap_or_else(|| bad(line)))
        .collect();
    let get = |name: &str| *fields.get(name).unwrap_or_else(|| bad(line));
    let number = |name: &str| get(name).parse::<u64>().unwrap_or_else(|_| bad(line));
    let start_only = match kind {
        "MSG" => false,
        "START" => true,
        _ => bad(line),
    };
    Event {
        client: get("client").to_owned(),
        start_only,
        queue: number("queue") as u32,
        offset: number("offset"),
        start_ns: number("start_ns"),
        end_ns: if start_only {
            None
        } else {
            Some(number("end_ns"))
        },
        key: get("key").to_owned(),
        body,
    }
}

type Events = Arc<Mutex<Vec<Event>>>;

/// A `ringmq consume --group` process; a thread turns its stdout lines into events.
struct ConsumerProcess {
    id: String,
    child: Option<Child>,
    reader: Option<JoinHandle<()>>,
    stderr_log: PathBuf,
}

impl ConsumerProcess {
    fn spawn(
        addr: &str,
        topic: &str,
        group: &str,
        id: &str,
        extra: &[&str],
        events: &Events,
        dir: &Path,
    ) -> ConsumerProcess {
        let stderr_log = dir.join(format!("{id}.stderr.log"));
        let mut child = Command::new(env!("CARGO_BIN_EXE_ringmq"))
            .args(["--broker", addr, "consume", topic, "--group", group])
            .args(["--client-id", id, "--from", "first"])
            .args(["--session-timeout-ms", SESSION_TIMEOUT_MS])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr_log).unwrap())
            .spawn()
            .expect("spawn ringmq consume");
        let stdout = child.stdout.take().unwrap();
        let events = events.clone();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let event = parse_line(&line);
                events.lock().unwrap().push(event);
            }
        });
        ConsumerProcess {
            id: id.to_owned(),
            child: Some(child),
            reader: Some(reader),
            stderr_log,
        }
    }

    fn pid(&self) -> i32 {
        self.child.as_ref().expect("running").id() as i32
    }

    /// SIGKILL; answers the wall-clock times just before the signal and once the process is
    /// gone (reaped).
    fn kill(&mut self) -> (u64, u64) {
        let before = wall_ns();
        unsafe {
            libc::kill(self.pid(), libc::SIGKILL);
        }
        self.child.take().unwrap().wait().unwrap();
        let gone = wall_ns();
        self.join_reader();
        (before, gone)
    }

    /// SIGTERM, then waits (bounded) for the clean exit.
    async fn terminate(&mut self) -> ExitStatus {
        unsafe {
            libc::kill(self.pid(), libc::SIGTERM);
        }
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                self.child = None;
                self.join_reader();
                return status;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{} did not stop after SIGTERM; stderr:\n{}",
                self.id,
                self.stderr()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Asserts a clean stop on SIGTERM: exit 0, nothing on stderr.
    async fn terminate_cleanly(&mut self) {
        let status = self.terminate().await;
        assert!(
            status.success(),
            "{} exited with {status} on SIGTERM; stderr:\n{}",
            self.id,
            self.stderr()
        );
        let stderr = self.stderr();
        assert!(stderr.is_empty(), "{} stderr:\n{stderr}", self.id);
    }

    fn join_reader(&mut self) {
        if let Some(reader) = self.reader.take() {
            reader.join().expect("output reader");
        }
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_log).unwrap_or_default()
    }
}

impl Drop for ConsumerProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

async fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !done() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "gave up waiting: {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Client id → assigned queues of `topic`, as the broker has it.
async fn assignment(client: &Client, group: &str) -> BTreeMap<String, Vec<u32>> {
    let info = client.group_members(group).await.unwrap();
    info.members
        .into_iter()
        .map(|m| {
            let queues = m.topics.into_iter().flat_map(|t| t.queues).collect();
            (m.client_id, queues)
        })
        .collect()
}

/// Waits until the group has `members` members that share all `queues` queues.
async fn settled(client: &Client, group: &str, members: usize, queues: usize) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let a = assignment(client, group).await;
        let assigned: BTreeSet<u32> = a.values().flatten().copied().collect();
        if a.len() == members && assigned.len() == queues {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{group} did not settle to {members} members: {a:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until `group` has committed the end of every queue of `topic`.
async fn caught_up(client: &Client, group: &str, topic: &str) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let progress = client.consumer_progress(group, topic).await.unwrap();
        if !progress.is_empty()
            && progress
                .iter()
                .all(|q| q.lag == 0 && q.committed_offset == Some(q.max_offset))
        {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{group} never caught up on {topic}: {progress:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Distinct bodies processed (finished) so far.
fn distinct(events: &Events) -> usize {
    events
        .lock()
        .unwrap()
        .iter()
        .filter(|e| !e.start_only)
        .map(|e| e.body.as_str())
        .collect::<BTreeSet<_>>()
        .len()
}

// ---- ordered consumption ----

const KEYS: u32 = 40;
const SEQS: u32 = 50;
/// Pause between rounds (one message per key): spreads the sends over a few seconds, so
/// that the kill lands mid-stream.
const ROUND_PAUSE: Duration = Duration::from_millis(50);

/// Body → wall-clock time its send was acknowledged (it was stored before).
type Acks = Arc<Mutex<BTreeMap<String, u64>>>;

/// Sends `seq` 0..SEQS of every key, round by round; a key's messages are sent one after
/// the other (each acknowledged before the next), with the key as sharding key and key.
async fn produce_keyed(producer: Producer, topic: &'static str, acks: Acks) {
    for seq in 0..SEQS {
        for k in 0..KEYS {
            let key = format!("k{k}");
            let body = format!("{key}:{seq}");
            let message = OutgoingMessage::new(body.clone())
                .with_key(key.clone())
                .with_sharding_key(key);
            producer.send(topic, message).await.unwrap();
            acks.lock().unwrap().insert(body, wall_ns());
        }
        tokio::time::sleep(ROUND_PAUSE).await;
    }
}

/// What the order check found.
#[derive(Debug, Default)]
struct OrderSummary {
    /// Messages processed (finished) more than once.
    repeats: usize,
    /// Keys with a re-delivery.
    keys_replayed: usize,
}

/// Per key, the `MSG` events of every consumer in processing order (by `start_ns`) must
/// read `0, 1, 2, ..., SEQS-1` with at most one step back: a re-delivery. Precisely, every
/// event is its predecessor's seq + 1 (the first is 0), except at most one event per key
/// whose seq `s` is at or below its predecessor's `h` (a jump back); that event must start
/// after the kill, and every seq `s..=h` it goes back over must have been processed last
/// by the killed consumer (what it did without committing). After the jump the rule
/// "predecessor + 1" applies again, so the replay is `s, s+1, ..., h` exactly, followed by
/// `h+1, ...`. It follows that the distinct first processings are `0..SEQS` in order, with
/// no gap.
fn check_key_order(events: &[Event], victim: &str, kill_ns: u64) -> OrderSummary {
    let mut by_key: BTreeMap<&str, Vec<&Event>> = BTreeMap::new();
    for e in events.iter().filter(|e| !e.start_only) {
        by_key.entry(e.key.as_str()).or_default().push(e);
    }
    assert_eq!(
        by_key.len(),
        KEYS as usize,
        "keys seen: {:?}",
        by_key.keys()
    );
    let mut summary = OrderSummary::default();
    for (key, mut list) in by_key {
        list.sort_by_key(|e| e.start_ns);
        let seqs: Vec<u32> = list
            .iter()
            .map(|e| {
                let (k, seq) = e.body.split_once(':').unwrap();
                assert_eq!(k, key, "{e:?}");
                seq.parse().unwrap()
            })
            .collect();
        let describe = || {
            list.iter()
                .zip(&seqs)
                .map(|(e, s)| format!("{s}@{}", e.client))
                .collect::<Vec<_>>()
                .join(" ")
        };
        assert_eq!(seqs[0], 0, "key {key}: {}", describe());
        // seq → who processed it last, so far.
        let mut last_by: BTreeMap<u32, &str> = BTreeMap::from([(0, list[0].client.as_str())]);
        let mut jumped = false;
        for i in 1..seqs.len() {
            let (prev, seq, e) = (seqs[i - 1], seqs[i], list[i]);
            if seq != prev + 1 {
                assert!(
                    seq <= prev,
                    "key {key}: gap or reordering ({prev} then {seq}): {}",
                    describe()
                );
                assert!(!jumped, "key {key}: re-delivered twice: {}", describe());
                assert!(
                    e.start_ns >= kill_ns,
                    "key {key}: re-delivery of {seq} before the kill: {}",
                    describe()
                );
                for s in seq..=prev {
                    assert_eq!(
                        last_by.get(&s).copied(),
                        Some(victim),
                        "key {key}: {s} re-delivered but last processed by someone other \
                         than the killed consumer: {}",
                        describe()
                    );
                }
                jumped = true;
                summary.keys_replayed += 1;
                summary.repeats += (prev - seq + 1) as usize;
            }
            last_by.insert(seq, e.client.as_str());
        }
        assert_eq!(
            *seqs.last().unwrap(),
            SEQS - 1,
            "key {key} incomplete: {}",
            describe()
        );
    }
    summary
}

/// Processing intervals of one queue never overlap, whoever runs them. `MSG` lines give
/// `[start_ns, end_ns]`; the killed consumer's last `START` without a `MSG` (a message it
/// was processing when it died) counts as `[start_ns, kill_ns]`. It really ended at the
/// victim's death, somewhere between `kill_ns` (the `kill` call) and its reaping; but the
/// reaping is seen only once this test's thread runs again, which on a loaded machine can
/// be after the broker saw the victim's connection close and another consumer began the
/// same message (seen once: 80 µs after it). The death itself comes before the close, and
/// so before any release of its locks by the broker; a consumer beginning in the few
/// microseconds between the `kill` call and the death would need the broker to release a
/// live member's locks just then, which this check misses (a cause that does it, such as
/// a session expiring, would mostly show before the kill).
/// Survivors stop cleanly, so none of theirs may be left unfinished.
fn check_queue_exclusion(events: &[Event], victim: &str, kill_ns: u64) {
    // (client, queue, offset) of every finished message.
    let finished: BTreeSet<(&str, u32, u64)> = events
        .iter()
        .filter(|e| !e.start_only)
        .map(|e| (e.client.as_str(), e.queue, e.offset))
        .collect();
    // (start, end, client, offset, finished or not) by queue.
    type Interval<'a> = (u64, u64, &'a str, u64, &'static str);
    let mut by_queue: BTreeMap<u32, Vec<Interval>> = BTreeMap::new();
    let mut unfinished = 0;
    for e in events {
        let (end, how) = match (e.start_only, e.end_ns) {
            (false, Some(end)) => (end, "finished"),
            (true, _) if finished.contains(&(e.client.as_str(), e.queue, e.offset)) => continue,
            (true, _) => {
                assert_eq!(e.client, victim, "a survivor left {e:?} unfinished");
                unfinished += 1;
                // It may have begun in those microseconds itself.
                (kill_ns.max(e.start_ns), "unfinished, up to the kill")
            }
            (false, None) => unreachable!(),
        };
        assert!(end >= e.start_ns, "{e:?}");
        by_queue.entry(e.queue).or_default().push((
            e.start_ns,
            end,
            e.client.as_str(),
            e.offset,
            how,
        ));
    }
    eprintln!("the killed consumer left {unfinished} message(s) unfinished");
    for (queue, mut intervals) in by_queue {
        intervals.sort();
        for pair in intervals.windows(2) {
            let ((s0, e0, c0, o0, h0), (s1, e1, c1, o1, h1)) = (pair[0], pair[1]);
            assert!(
                s1 >= e0,
                "queue {queue}: {c0} processed offset {o0} in [{s0}, {e0}] ({h0}) and {c1} \
                 offset {o1} in [{s1}, {e1}] ({h1}): they overlap"
            );
        }
    }
}

#[test]
fn orderly_consumer_processes_keep_key_order_and_queue_exclusion_when_one_is_killed() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    const TOPIC: &str = "ordered";
    const GROUP: &str = "g-ordered";
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::start(
        &dir.path().join("data"),
        2,
        &["--session-timeout-ms", SESSION_TIMEOUT_MS],
    );
    let addr = broker.addr_string();
    runtime().block_on(async {
        let producer = Producer::connect(ClientConfig::new(&addr)).await.unwrap();
        let client = producer.client().clone();
        client.create_topic(TOPIC, 8).await.unwrap();
        let events: Events = Arc::default();
        let flags = ["--orderly", "--process-ms", "2", "--print-start"];
        let mut consumers: Vec<ConsumerProcess> = (0..3)
            .map(|i| {
                let id = format!("c{i}");
                ConsumerProcess::spawn(&addr, TOPIC, GROUP, &id, &flags, &events, dir.path())
            })
            .collect();
        settled(&client, GROUP, 3, 8).await;

        let acks: Acks = Arc::default();
        let sending = tokio::spawn(produce_keyed(producer.clone(), TOPIC, acks.clone()));
        eventually("500 messages processed", || distinct(&events) >= 500).await;
        let victim = 1;
        let victim_id = consumers[victim].id.clone();
        let victim_queues = assignment(&client, GROUP)
            .await
            .remove(&victim_id)
            .unwrap_or_default();
        assert!(!victim_queues.is_empty(), "{victim_id} holds no queue");
        assert!(!sending.is_finished(), "the kill must land mid-stream");
        let (kill_ns, gone_ns) = consumers[victim].kill();
        eprintln!(
            "killed {victim_id} (queues {victim_queues:?}) after {} messages processed; \
             reaped {:.3} ms after the kill",
            distinct(&events),
            ms(gone_ns - kill_ns)
        );

        sending.await.unwrap();
        let total = (KEYS * SEQS) as usize;
        eventually("every message processed", || distinct(&events) == total).await;
        caught_up(&client, GROUP, TOPIC).await;
        for (i, consumer) in consumers.iter_mut().enumerate() {
            if i != victim {
                consumer.terminate_cleanly().await;
            }
        }
        let events = events.lock().unwrap().clone();

        // Each key lives in one queue.
        let mut queue_of: BTreeMap<&str, BTreeSet<u32>> = BTreeMap::new();
        for e in &events {
            queue_of.entry(e.key.as_str()).or_default().insert(e.queue);
        }
        assert!(queue_of.values().all(|q| q.len() == 1), "{queue_of:?}");

        let summary = check_key_order(&events, &victim_id, kill_ns);
        check_queue_exclusion(&events, &victim_id, kill_ns);
        // Orderly consumption commits after every message: at most the one message per
        // queue finished but not yet committed when the consumer died comes again.
        assert!(
            summary.repeats <= victim_queues.len(),
            "{summary:?} for {} queues",
            victim_queues.len()
        );

        // Resumption: from the kill to the first processing of each of the killed
        // consumer's queues by another consumer; and from when that queue had a message
        // to consume again (the kill, or the acknowledgement of the first message
        // processed there, if it was sent after the kill: an idle queue waits for traffic).
        let acks = acks.lock().unwrap().clone();
        // START lines carry no body.
        let body_at: BTreeMap<(u32, u64), &str> = events
            .iter()
            .filter(|e| !e.start_only)
            .map(|e| ((e.queue, e.offset), e.body.as_str()))
            .collect();
        let mut resumed = Vec::new();
        for q in &victim_queues {
            let first = events
                .iter()
                .filter(|e| e.queue == *q && e.client != victim_id && e.start_ns >= kill_ns)
                .min_by_key(|e| e.start_ns);
            match first {
                Some(e) => {
                    let available = acks[body_at[&(e.queue, e.offset)]].max(kill_ns);
                    resumed.push((
                        *q,
                        e.start_ns - kill_ns,
                        e.start_ns.saturating_sub(available),
                    ))
                }
                // Only possible for a queue no key maps to.
                None => assert!(
                    !events.iter().any(|e| e.queue == *q),
                    "queue {q} was never resumed"
                ),
            }
        }
        let max = resumed.iter().map(|r| r.1).max().unwrap_or(0);
        let max_available = resumed.iter().map(|r| r.2).max().unwrap_or(0);
        eprintln!(
            "killed consumer's queues resumed after (ms from the kill / from a message being \
             there): {}; max {:.1} / {:.1} ms",
            resumed
                .iter()
                .map(|(q, d, a)| format!("q{q} {:.1} / {:.1}", ms(*d), ms(*a)))
                .collect::<Vec<_>>()
                .join(", "),
            ms(max),
            ms(max_available)
        );
        eprintln!(
            "re-delivered after the kill: {} message(s) over {} key(s); {} processing events",
            summary.repeats,
            summary.keys_replayed,
            events.len()
        );
    });
}

// ---- clustering ----

const MESSAGES: usize = 3000;
/// Messages per round of sends, and the pause between rounds.
const ROUND: usize = 30;

/// Sends `m0..m{MESSAGES}` round-robin over the queues, paced.
async fn produce_plain(producer: Producer, topic: &'static str) {
    for round in 0..MESSAGES / ROUND {
        for i in round * ROUND..(round + 1) * ROUND {
            producer
                .send(topic, OutgoingMessage::new(format!("m{i}")))
                .await
                .unwrap();
        }
        tokio::time::sleep(ROUND_PAUSE).await;
    }
}

/// Bodies processed more than once must be: processed by different consumers each time
/// (a consumer never processes a message twice), and re-processed only while a membership
/// change (the 4th joining, a member leaving: from when it began to when the group settled)
/// was under way or within `window_ns` after, never before the first change. What the member that left cleanly (`leaver`, from `left_ns` on)
/// processed is never processed again after it began to leave: it committed everything
/// before unregistering. Prints how many re-processings fell in each change's window and
/// who re-did whose work; returns (bodies processed more than once, extra processings).
fn check_duplicates(
    events: &[Event],
    changes: &[(&str, u64, u64)],
    window_ns: u64,
    (leaver, left_ns): (&str, u64),
) -> (usize, usize) {
    let mut by_body: BTreeMap<&str, Vec<&Event>> = BTreeMap::new();
    for e in events.iter().filter(|e| !e.start_only) {
        by_body.entry(e.body.as_str()).or_default().push(e);
    }
    let mut per_change = vec![0usize; changes.len()];
    let mut redone: BTreeMap<(String, String), usize> = BTreeMap::new();
    let (mut bodies, mut extra) = (0, 0);
    for (body, mut list) in by_body {
        if list.len() < 2 {
            continue;
        }
        list.sort_by_key(|e| e.start_ns);
        bodies += 1;
        extra += list.len() - 1;
        let clients: BTreeSet<&str> = list.iter().map(|e| e.client.as_str()).collect();
        assert_eq!(
            clients.len(),
            list.len(),
            "{body} processed twice by one consumer: {list:?}"
        );
        assert!(
            list[0].client != leaver || list[1].start_ns < left_ns,
            "{body}, processed by {leaver} before it left cleanly, was processed again after: \
             {list:?}"
        );
        for pair in list.windows(2) {
            *redone
                .entry((pair[0].client.clone(), pair[1].client.clone()))
                .or_default() += 1;
        }
        for again in &list[1..] {
            let change = changes
                .iter()
                .rposition(|(_, from, to)| (*from..=to + window_ns).contains(&again.start_ns));
            match change {
                Some(c) => per_change[c] += 1,
                None => panic!(
                    "{body} re-processed away from any membership change {changes:?}: {list:?}"
                ),
            }
        }
    }
    for ((what, ..), n) in changes.iter().zip(&per_change) {
        eprintln!("re-processings within the window after {what}: {n}");
    }
    eprintln!(
        "work re-done (first consumer -> second): {}",
        redone
            .iter()
            .map(|((a, b), n)| format!("{a}->{b} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    (bodies, extra)
}

#[test]
fn concurrent_consumer_processes_lose_nothing_when_one_joins_and_one_leaves() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    const TOPIC: &str = "clustered";
    const GROUP: &str = "g-clustered";
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::start(
        &dir.path().join("data"),
        2,
        &["--session-timeout-ms", SESSION_TIMEOUT_MS],
    );
    let addr = broker.addr_string();
    runtime().block_on(async {
        let producer = Producer::connect(ClientConfig::new(&addr)).await.unwrap();
        let client = producer.client().clone();
        client.create_topic(TOPIC, 16).await.unwrap();
        let events: Events = Arc::default();
        let flags = ["--process-ms", "1"];
        let spawn = |i: usize| {
            let id = format!("c{i}");
            ConsumerProcess::spawn(&addr, TOPIC, GROUP, &id, &flags, &events, dir.path())
        };
        let mut consumers: Vec<ConsumerProcess> = (0..3).map(spawn).collect();
        settled(&client, GROUP, 3, 16).await;
        // Let every member apply the final assignment before anything is sent.
        tokio::time::sleep(Duration::from_millis(500)).await;

        let sending = tokio::spawn(produce_plain(producer.clone(), TOPIC));
        eventually("1000 messages processed", || distinct(&events) >= 1000).await;
        assert!(!sending.is_finished(), "the join must land mid-stream");
        let join_ns = wall_ns();
        consumers.push(spawn(3));
        settled(&client, GROUP, 4, 16).await;
        let joined_ns = wall_ns();

        eventually("2000 messages processed", || distinct(&events) >= 2000).await;
        assert!(!sending.is_finished(), "the leave must land mid-stream");
        let leave_ns = wall_ns();
        consumers[0].terminate_cleanly().await;
        let left_ns = wall_ns();
        eprintln!(
            "c0 left cleanly in {:.1} ms",
            ms(left_ns.saturating_sub(leave_ns))
        );

        sending.await.unwrap();
        eventually("every message processed", || distinct(&events) == MESSAGES).await;
        caught_up(&client, GROUP, TOPIC).await;
        for consumer in consumers.iter_mut().skip(1) {
            consumer.terminate_cleanly().await;
        }
        let events = events.lock().unwrap().clone();

        let want: BTreeSet<String> = (0..MESSAGES).map(|i| format!("m{i}")).collect();
        let got: BTreeSet<String> = events.iter().map(|e| e.body.clone()).collect();
        assert_eq!(got, want, "lost or unexpected messages");
        let per_client = |id: &str| events.iter().filter(|e| e.client == id).count();
        for id in ["c0", "c1", "c2", "c3"] {
            assert!(per_client(id) > 0, "{id} processed nothing");
        }
        let changes = [
            ("c3 joined", join_ns, joined_ns),
            ("c0 left", leave_ns, left_ns),
        ];
        let (bodies, extra) = check_duplicates(&events, &changes, 5_000_000_000, ("c0", leave_ns));
        eprintln!(
            "{} processings of {MESSAGES} messages: {bodies} message(s) processed more than \
             once ({extra} extra processing(s)); per consumer: {}",
            events.len(),
            ["c0", "c1", "c2", "c3"]
                .map(|id| format!("{id} {}", per_client(id)))
                .join(", ")
        );
    });
}
