//! The broker binary's stop signals: the first SIGTERM once it serves is a clean stop
//! (tests/metrics.rs checks its log); one while it starts, or a second one while a clean
//! stop runs, ends the process at once, so that a start or a stop that hangs can be ended
//! without SIGKILL. Both hangs are staged with a named pipe nobody opens from the other
//! side: a file the broker reads at its start, or the file its clean stop writes.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

/// How long a test waits for what it expects before it fails.
const PATIENCE: Duration = Duration::from_secs(30);

fn make_fifo(path: &Path) {
    let c = CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: mkfifo(3) reads the NUL-terminated path we own.
    let rc = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
    assert_eq!(rc, 0, "mkfifo {}", path.display());
}

/// A broker on `data` with one shard; stdout and stderr to `log` (read while it runs).
fn spawn_broker(data: &Path, log: &Path) -> Child {
    let out = std::fs::File::create(log).unwrap();
    Command::new(env!("CARGO_BIN_EXE_ringmq-broker"))
        .args(["--listen", "127.0.0.1:0", "--shards", "1", "--data-dir"])
        .arg(data)
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .unwrap()
}

fn sigterm(child: &Child) {
    // SAFETY: kill(2) with the pid of a child this test started and has not reaped.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
}

/// Polls until `done` holds, failing the test with `what` after [`PATIENCE`] or when the
/// broker exits first.
fn wait_until(child: &mut Child, what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !done() {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the broker exited ({status}) before {what}");
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            panic!("no {what} within {PATIENCE:?}");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The broker's exit status, or the test fails (the broker killed) after [`PATIENCE`].
fn exit_of(mut child: Child, what: &str, log: &Path) -> ExitStatus {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "the broker did not exit within {PATIENCE:?} of {what}; its output:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The broker exits after `what` with status 128 + SIGTERM, its output saying `says` and
/// no clean stop.
fn ends_at_once(child: Child, what: &str, log: &Path, says: &str) {
    let status = exit_of(child, what, log);
    let out = std::fs::read_to_string(log).unwrap();
    assert_eq!(status.code(), Some(128 + libc::SIGTERM), "{status}; {out}");
    assert!(out.contains(says), "{out}");
    assert!(!out.contains("stopped cleanly"), "{out}");
}

/// Whether process `pid` has SIGTERM blocked (its main thread's mask): from then on a
/// SIGTERM is the broker's to take; before, it would end the process outright.
fn blocks_sigterm(pid: u32) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigBlk:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .is_some_and(|mask| mask & (1 << (libc::SIGTERM - 1)) != 0)
}

fn paths() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let (data, log) = (dir.path().join("data"), dir.path().join("broker.log"));
    (dir, data, log)
}

#[test]
fn a_signal_while_the_broker_starts_ends_it_at_once() {
    let (_dir, data, log) = paths();
    std::fs::create_dir(&data).unwrap();
    // The topic table is a pipe: the start blocks reading it.
    make_fifo(&data.join("topics.json"));
    let mut child = spawn_broker(&data, &log);
    let pid = child.id();
    wait_until(&mut child, "SIGTERM blocked", || blocks_sigterm(pid));
    sigterm(&child);
    ends_at_once(
        child,
        "a SIGTERM during its start",
        &log,
        "while starting: exiting",
    );
}

#[test]
fn a_second_signal_ends_a_clean_stop_that_hangs() {
    let (_dir, data, log) = paths();
    let mut child = spawn_broker(&data, &log);
    wait_until(&mut child, "the broker ready", || {
        std::fs::read_to_string(&log).is_ok_and(|s| s.contains("ringmq-broker ready"))
    });
    // The clean stop writes the store's checkpoint through `checkpoint.tmp`: a pipe there
    // holds it (and any periodic checkpoint) forever.
    make_fifo(&data.join("shard-0").join("checkpoint.tmp"));
    sigterm(&child);
    wait_until(&mut child, "the clean stop starting", || {
        std::fs::read_to_string(&log).is_ok_and(|s| s.contains("stopping"))
    });
    sigterm(&child);
    ends_at_once(child, "a second SIGTERM", &log, "again: exiting");
}
