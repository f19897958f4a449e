//! The broker binary's stop signals: the first SIGTERM once it serves is a clean stop
//! (tests/metrics.rs checks its log); one while it starts, or another one a second or more
//! after the first while a clean stop runs, ends the process at once by that signal, so
//! that a start or a stop that hangs can be ended without SIGKILL. Both hangs are staged
//! with a named pipe nobody opens from the other side: a file the broker reads at its
//! start, or the file its clean stop writes.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

/// How long a test waits for what it expects before it fails.
const PATIENCE: Duration = Duration::from_secs(30);

/// ringmq-broker's `REPEAT_GRACE`: a repeated signal sooner than this after the first does
/// not end a clean stop.
const REPEAT_GRACE: Duration = Duration::from_secs(1);

fn make_fifo(path: &Path) {
    let c = CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: mkfifo(3) reads the NUL-terminated path we own.
    let rc = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
    assert_eq!(rc, 0, "mkfifo {}", path.display());
}

/// A broker process, killed and reaped if the test ends before it does.
struct Broker {
    child: Option<Child>,
    log: PathBuf,
}

impl Drop for Broker {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Broker {
    /// A broker on `data` with one shard; stdout and stderr to `log`.
    fn spawn(data: &Path, log: &Path) -> Broker {
        let out = std::fs::File::create(log).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_ringmq-broker"))
            .args(["--listen", "127.0.0.1:0", "--shards", "1", "--data-dir"])
            .arg(data)
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap();
        Broker {
            child: Some(child),
            log: log.to_owned(),
        }
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().map(Child::id).unwrap()
    }

    fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn sigterm(&self) {
        // SAFETY: kill(2) with the pid of a child this test started and has not reaped.
        unsafe { libc::kill(self.pid() as i32, libc::SIGTERM) };
    }

    /// Polls until `done` holds (`None`) or the broker exits (its status, reaped); fails
    /// the test with `what` after [`PATIENCE`].
    fn wait_for(&mut self, what: &str, done: impl Fn(&Broker) -> bool) -> Option<ExitStatus> {
        let deadline = Instant::now() + PATIENCE;
        while !done(self) {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                self.child = None;
                return Some(status);
            }
            assert!(
                Instant::now() < deadline,
                "no {what} within {PATIENCE:?}; its output:\n{}",
                self.output()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        None
    }

    /// Waits until `done` holds; the test fails if the broker exits first.
    fn wait_until(&mut self, what: &str, done: impl Fn(&Broker) -> bool) {
        if let Some(status) = self.wait_for(what, done) {
            panic!(
                "the broker exited ({status}) before {what}:\n{}",
                self.output()
            );
        }
    }

    /// The broker ends after `what`, killed by SIGTERM, its output saying `says` and no
    /// clean stop; the test fails after [`PATIENCE`].
    fn ends_at_once(mut self, what: &str, says: &str) {
        let status = self.wait_for(&format!("exit after {what}"), |_| false);
        self.ended_by_sigterm(status, says);
    }

    fn ended_by_sigterm(&self, status: Option<ExitStatus>, says: &str) {
        let out = self.output();
        let status = status.expect("the broker exited");
        assert_eq!(status.signal(), Some(libc::SIGTERM), "{status}; {out}");
        assert!(out.contains(says), "{out}");
        assert!(!out.contains("stopped cleanly"), "{out}");
    }
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
    let mut broker = Broker::spawn(&data, &log);
    broker.wait_until("SIGTERM blocked", |b| blocks_sigterm(b.pid()));
    broker.sigterm();
    broker.ends_at_once("a SIGTERM during its start", "while starting: exiting");
}

#[test]
fn a_later_second_signal_ends_a_clean_stop_that_hangs() {
    let (_dir, data, log) = paths();
    let mut broker = Broker::spawn(&data, &log);
    broker.wait_until("the broker ready", |b| {
        b.output().contains("ringmq-broker ready")
    });
    // The clean stop writes the store's checkpoint through `checkpoint.tmp`: a pipe there
    // holds it (and any periodic checkpoint) forever.
    make_fifo(&data.join("shard-0").join("checkpoint.tmp"));
    broker.sigterm();
    let first = Instant::now();
    broker.wait_until("the clean stop starting", |b| {
        b.output().contains("stopping")
    });
    // A repeat right away (a supervisor's second SIGTERM) leaves the clean stop running.
    broker.sigterm();
    broker.wait_until("the repeat noted", |b| {
        b.output().contains("still stopping")
    });
    // Repeats, each waited for until noted, go on until one past the grace ends the broker.
    let notes = |b: &Broker| b.output().matches("still stopping").count();
    let status = loop {
        let noted = notes(&broker);
        broker.sigterm();
        if let Some(status) = broker.wait_for("a repeat noted", |b| notes(b) > noted) {
            break status;
        }
    };
    assert!(
        first.elapsed() >= REPEAT_GRACE,
        "a repeat {:?} after the first ended the stop",
        first.elapsed()
    );
    broker.ended_by_sigterm(Some(status), "again: exiting");
}
