//! A broker's shards and its data directory, with the real binary: the shard count a
//! directory records (brokers started together, a restart without --shards), one broker
//! per directory and port, and the CPUs the shards run on.

mod common;

use std::time::Duration;

use common::broker::BrokerProcess;
use ringmq::client::{Client, ClientConfig, OutgoingMessage, Producer};

fn config(addr: &str) -> ClientConfig {
    let mut c = ClientConfig::new(addr.to_owned());
    c.request_timeout_ms = 10_000;
    c
}

/// Two brokers started at once on a new data directory with different shard counts: one
/// takes the directory, the other is refused, and the shard count recorded is the one of
/// the broker that runs (the record is written under the directory's lock).
#[test]
fn brokers_started_together_on_a_new_data_dir_record_the_count_of_the_one_that_runs() {
    use std::process::{Command, Stdio};
    for round in 0..4 {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let spawn = |shards: &str| {
            Command::new(env!("CARGO_BIN_EXE_ringmq-broker"))
                .args(["--listen", "127.0.0.1:0", "--shards", shards, "--data-dir"])
                .arg(&data)
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .unwrap()
        };
        let mut brokers = [("1", spawn("1")), ("3", spawn("3"))];
        // Each one's stdout until it says it is ready (true) or ends (false: refused).
        let readers: Vec<_> = brokers
            .iter_mut()
            .map(|(_, child)| {
                let out = std::io::BufReader::new(child.stdout.take().unwrap());
                std::thread::spawn(move || {
                    use std::io::BufRead;
                    out.lines()
                        .map_while(Result::ok)
                        .any(|line| line.contains("ready"))
                })
            })
            .collect();
        let ready: Vec<bool> = readers.into_iter().map(|r| r.join().unwrap()).collect();
        for (_, child) in &mut brokers {
            let _ = child.kill();
            let _ = child.wait();
        }
        let winner = match ready.as_slice() {
            [true, false] => 0,
            [false, true] => 1,
            other => panic!("round {round}: one runs and one is refused, not {other:?}"),
        };
        let recorded = std::fs::read_to_string(data.join("shards")).unwrap();
        assert_eq!(recorded.trim(), brokers[winner].0, "round {round}");
    }
}

#[test]
fn a_second_broker_on_the_same_data_dir_or_port_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::start(&dir.path().join("data"), 2, &[]);
    let run = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_ringmq-broker"))
            .args(args)
            .output()
            .unwrap()
    };
    let data = dir.path().join("data");
    let out = run(&[
        "--listen",
        "127.0.0.1:0",
        "--shards",
        "2",
        "--data-dir",
        data.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("in use by another broker"), "{err}");
    // Another data dir, the same port: refused (SO_REUSEPORT would otherwise split traffic).
    let other = dir.path().join("other");
    let out = run(&[
        "--listen",
        &broker.addr_string(),
        "--shards",
        "2",
        "--data-dir",
        other.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot listen on"), "{err}");
    // A different shard count on an existing data dir: refused with a clear message.
    drop(broker);
    let refused_with_3_shards = || {
        let out = run(&[
            "--listen",
            "127.0.0.1:0",
            "--shards",
            "3",
            "--data-dir",
            data.to_str().unwrap(),
        ]);
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = refused_with_3_shards();
    assert!(err.contains("created with 2 shards"), "{err}");
    // With the record of the count gone, the shards' directories still tell it.
    std::fs::remove_file(data.join("shards")).unwrap();
    let err = refused_with_3_shards();
    assert!(
        err.contains("(2 shards)") && err.contains("--shards 2"),
        "{err}"
    );
    assert!(
        !data.join("shards").exists(),
        "a count was recorded for a refused start"
    );
}

#[test]
fn a_data_directory_keeps_its_shard_count_when_none_is_asked() {
    // More shards than cores: a start with the default (one per core) would differ, as
    // after a move to a machine with fewer cores.
    let cores = std::thread::available_parallelism().unwrap().get();
    let shards = cores + 1;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    drop(BrokerProcess::start(&data, shards, &[]));
    let ready_line = || {
        use std::io::BufRead;
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_ringmq-broker"))
            .args(["--listen", "127.0.0.1:0", "--data-dir"])
            .arg(&data)
            .args(["--segment-bytes", common::broker::TEST_SEGMENT_BYTES])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let line = std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .find(|l| l.contains("ready"));
        let _ = child.kill();
        let out = child.wait_with_output().unwrap();
        line.unwrap_or_else(|| panic!("no ready line: {}", String::from_utf8_lossy(&out.stderr)))
    };
    let line = ready_line();
    assert!(line.contains(&format!("({shards} shards")), "{line}");
    // With the record of the count gone, the shards' directories tell it.
    std::fs::remove_file(data.join("shards")).unwrap();
    let line = ready_line();
    assert!(line.contains(&format!("({shards} shards")), "{line}");
}

/// The CPUs this test may run on, from /proc/self/status (`0-1`, `0,2-3`).
fn allowed_cpus() -> Vec<usize> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let list = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap()
        .trim()
        .to_owned();
    let mut cpus = Vec::new();
    for part in list.split(',') {
        match part.split_once('-') {
            Some((a, b)) => cpus.extend(a.parse::<usize>().unwrap()..=b.parse().unwrap()),
            None => cpus.push(part.parse().unwrap()),
        }
    }
    cpus
}

/// The CPU list each of a broker's shard threads may run on, by shard thread name.
fn shard_affinities(pid: u32) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let task = task.unwrap().path();
        let comm = std::fs::read_to_string(task.join("comm")).unwrap_or_default();
        if !comm.starts_with("ringmq-shard-") {
            continue;
        }
        let status = std::fs::read_to_string(task.join("status")).unwrap_or_default();
        if let Some(list) = status
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        {
            out.push((comm.trim().to_owned(), list.trim().to_owned()));
        }
    }
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shards_run_on_the_cpus_listed_and_bad_lists_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let allowed = allowed_cpus();
    // The CPU shard 0's threads may run on (all of them on the same one).
    let shard_cpu = |broker: &BrokerProcess| {
        let pinned = shard_affinities(broker.pid().unwrap());
        let lists: Vec<&String> = pinned
            .iter()
            .filter(|(name, _)| name.starts_with("ringmq-shard-0"))
            .map(|(_, list)| list)
            .collect();
        assert!(!lists.is_empty(), "no shard thread in {pinned:?}");
        assert!(lists.iter().all(|l| *l == lists[0]), "{pinned:?}");
        lists[0]
            .parse::<usize>()
            .unwrap_or_else(|_| panic!("shard 0 may run on {}, not on one CPU", lists[0]))
    };
    // By default one shard (fewer than the CPUs, on this 2-core machine) is pinned to one
    // CPU the process may use.
    let broker = BrokerProcess::start(&dir.path().join("default"), 1, &[]);
    let by_default = shard_cpu(&broker);
    assert!(
        allowed.contains(&by_default),
        "{by_default} not in {allowed:?}"
    );
    drop(broker);
    // Listed: another CPU than the default one, when there is one.
    let cpu = *allowed
        .iter()
        .find(|&&c| c != by_default)
        .unwrap_or(&by_default);
    let cpu_arg = cpu.to_string();
    let broker = BrokerProcess::start(&dir.path().join("data"), 1, &["--cpus", &cpu_arg]);
    assert_eq!(shard_cpu(&broker), cpu);
    // It serves on that CPU.
    let client = Client::connect(config(&broker.addr_string()))
        .await
        .unwrap();
    let producer = Producer::from_client(client.clone(), Default::default());
    let sent = producer
        .send("pinned", OutgoingMessage::new("on the listed cpu"))
        .await
        .unwrap();
    let r = client
        .pull(
            "pinned",
            sent.queue_id,
            sent.queue_offset,
            1,
            Duration::ZERO,
            &[],
        )
        .await
        .unwrap();
    assert_eq!(r.messages[0].body(), b"on the listed cpu");
    drop(broker);

    let run = |args: &[&str]| {
        let data = dir.path().join("refused");
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_ringmq-broker"))
            .args(["--listen", "127.0.0.1:0", "--data-dir"])
            .arg(&data)
            .args(args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?} started");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = run(&["--cpus", &cpu_arg, "--shards", "2"]);
    assert!(err.contains("cpus lists 1 CPU for 2 shards"), "{err}");
    let err = run(&["--cpus", "4000"]);
    assert!(
        err.contains("CPU 4000 is not one this process may run on"),
        "{err}"
    );
    let twice = format!("{0},{0}", allowed[0]);
    let err = run(&["--cpus", &twice]);
    assert!(
        err.contains(&format!("CPU {} is listed twice", allowed[0])),
        "{err}"
    );
    let err = run(&["--cpus", "one"]);
    assert!(err.contains("is not a CPU id"), "{err}");
}
