//! Starts the real `ringmq-broker` binary on loopback (ephemeral ports, a temp data dir).
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// `--segment-bytes` of test brokers (64 MiB) unless a test passes its own.
pub const TEST_SEGMENT_BYTES: &str = "67108864";

pub struct BrokerProcess {
    child: Option<Child>,
    listen: SocketAddr,
    pub addr: SocketAddr,
    pub data_dir: PathBuf,
    pub shards: usize,
    extra: Vec<String>,
    stderr_log: PathBuf,
    /// The stderr log is a file of the test's (removed on drop), not a given path.
    own_stderr_log: bool,
    /// Every line the running broker wrote to stdout (the ready line and any later ones: a
    /// panic's report, why it stopped); stdout is a pipe, so it survives a full disk.
    stdout_lines: Arc<Mutex<Vec<String>>>,
    /// The thread reading the running broker's stdout (it ends at the broker's exit).
    stdout_reader: Option<std::thread::JoinHandle<()>>,
    /// The open-file limit (soft and hard) the broker runs with, if set.
    pub file_limit: Option<u64>,
}

impl BrokerProcess {
    /// Starts a broker with `shards` shards in `data_dir`, plus extra flags.
    pub fn start(data_dir: &Path, shards: usize, extra: &[&str]) -> BrokerProcess {
        Self::start_on("127.0.0.1:0".parse().unwrap(), data_dir, shards, extra)
    }

    /// Starts a broker listening on `listen` (port 0: any).
    pub fn start_on(
        listen: SocketAddr,
        data_dir: &Path,
        shards: usize,
        extra: &[&str],
    ) -> BrokerProcess {
        let mut b = Self::unstarted(listen, data_dir, shards, extra);
        b.spawn();
        b
    }

    /// Starts a broker whose stderr is `stderr` (opened for writing; for example
    /// `/dev/full`, where every write fails as on a full disk).
    pub fn start_with_stderr(
        data_dir: &Path,
        shards: usize,
        extra: &[&str],
        stderr: &Path,
    ) -> BrokerProcess {
        let mut b = Self::unstarted("127.0.0.1:0".parse().unwrap(), data_dir, shards, extra);
        b.stderr_log = stderr.to_owned();
        b.own_stderr_log = false;
        b.spawn();
        b
    }

    /// Starts a broker whose open-file limit (soft and hard) is `limit`.
    pub fn start_with_file_limit(
        data_dir: &Path,
        shards: usize,
        extra: &[&str],
        limit: u64,
    ) -> BrokerProcess {
        let mut b = Self::unstarted("127.0.0.1:0".parse().unwrap(), data_dir, shards, extra);
        b.file_limit = Some(limit);
        b.spawn();
        b
    }

    /// A broker to start on `listen`: stderr to a log file beside `data_dir`, no limits.
    fn unstarted(
        listen: SocketAddr,
        data_dir: &Path,
        shards: usize,
        extra: &[&str],
    ) -> BrokerProcess {
        BrokerProcess {
            child: None,
            listen,
            addr: listen,
            data_dir: data_dir.to_owned(),
            shards,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            stderr_log: data_dir.with_extension("stderr.log"),
            own_stderr_log: true,
            stdout_lines: Arc::default(),
            stdout_reader: None,
            file_limit: None,
        }
    }

    fn spawn(&mut self) {
        let stderr = if self.own_stderr_log {
            std::fs::File::create(&self.stderr_log).unwrap()
        } else {
            std::fs::OpenOptions::new()
                .write(true)
                .open(&self.stderr_log)
                .unwrap()
        };
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_ringmq-broker"));
        // Small segments unless a test sets its own: each segment file is preallocated, and
        // a 1 GiB default per shard of every broker running at once fills a small disk.
        if !self.extra.iter().any(|a| a == "--segment-bytes") {
            cmd.args(["--segment-bytes", TEST_SEGMENT_BYTES]);
        }
        cmd.args(["--listen", &self.listen.to_string(), "--data-dir"])
            .arg(&self.data_dir)
            .args(["--shards", &self.shards.to_string()])
            .args(&self.extra)
            .stdout(Stdio::piped())
            .stderr(stderr);
        if let Some(limit) = self.file_limit {
            use std::os::unix::process::CommandExt;
            // SAFETY: runs in the forked child before exec and only calls setrlimit, which
            // is async-signal-safe, on a struct on its own stack.
            unsafe {
                cmd.pre_exec(move || {
                    let lim = libc::rlimit {
                        rlim_cur: limit,
                        rlim_max: limit,
                    };
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let mut child = cmd.spawn().expect("spawn ringmq-broker");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        self.stdout_lines = Arc::default();
        let lines = self.stdout_lines.clone();
        self.stdout_reader = Some(std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                lines.lock().unwrap().push(line.clone());
                let _ = tx.send(line);
            }
        }));
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) if line.starts_with("ringmq-broker ready: listening on ") => {
                    let addr = line["ringmq-broker ready: listening on ".len()..]
                        .split(' ')
                        .next()
                        .unwrap();
                    self.addr = addr.parse().unwrap();
                    break;
                }
                Ok(_) => continue,
                Err(_) => {
                    let _ = child.kill();
                    panic!(
                        "broker did not become ready; stdout:\n{}\nstderr:\n{}",
                        self.stdout(),
                        self.stderr()
                    );
                }
            }
        }
        self.child = Some(child);
    }

    /// The broker's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The broker's resident memory now, in MiB (from /proc).
    pub fn rss_mib(&self) -> u64 {
        rss_mib_of(self.pid().expect("the broker runs"))
    }

    /// Bytes the broker read from the disk so far (`read_bytes` of /proc/PID/io: the log's
    /// reads are O_DIRECT, so each is counted); `None` without the kernel's I/O accounting.
    pub fn disk_read_bytes(&self) -> Option<u64> {
        let pid = self.pid().expect("the broker runs");
        let io = std::fs::read_to_string(format!("/proc/{pid}/io")).ok()?;
        let line = io.lines().find(|l| l.starts_with("read_bytes:"))?;
        line.split_whitespace().nth(1)?.parse().ok()
    }

    pub fn addr_string(&self) -> String {
        self.addr.to_string()
    }

    /// SIGTERM and wait: a clean stop. Returns the exit status success.
    pub fn stop(&mut self) -> bool {
        let Some(mut child) = self.child.take() else {
            return true;
        };
        unsafe {
            libc::kill(child.id() as i32, libc::SIGTERM);
        }
        child.wait().map(|s| s.success()).unwrap_or(false)
    }

    /// SIGTERM, then waits up to `timeout` for the exit: the exit status if it came.
    pub fn stop_within(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let pid = self.pid()?;
        unsafe {
            libc::kill(pid as i32, libc::SIGTERM);
        }
        self.wait_exit(timeout)
    }

    /// SIGKILL: a crash.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            unsafe {
                libc::kill(child.id() as i32, libc::SIGKILL);
            }
            let _ = child.wait();
        }
    }

    /// Starts again on the same data dir (new ports).
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "stop or kill first");
        self.spawn();
    }

    /// The broker's stderr log (not read when stderr is a given path such as `/dev/full`,
    /// which reads as endless zeros).
    pub fn stderr(&self) -> String {
        if !self.own_stderr_log {
            return format!("(stderr went to {})", self.stderr_log.display());
        }
        std::fs::read_to_string(&self.stderr_log).unwrap_or_default()
    }

    /// What the broker process wrote to stdout so far, one line per line.
    pub fn stdout(&self) -> String {
        self.stdout_lines.lock().unwrap().join("\n")
    }

    /// Waits up to `timeout` for the broker to exit on its own; its exit status if it did.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            let child = self.child.as_mut()?;
            if let Some(status) = child.try_wait().unwrap() {
                self.child = None;
                // Everything it wrote is read once the pipe ends.
                if let Some(reader) = self.stdout_reader.take() {
                    let _ = reader.join();
                }
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for BrokerProcess {
    fn drop(&mut self) {
        self.kill();
        if self.own_stderr_log {
            let _ = std::fs::remove_file(&self.stderr_log);
        }
    }
}

/// The resident memory of process `pid` now, in MiB (from /proc; for a sampler on another
/// thread, which cannot hold the `BrokerProcess`).
pub fn rss_mib_of(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap();
    kb / 1024
}
