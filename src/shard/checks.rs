//! Checks made before a broker starts: option durations, the shard count a data directory
//! was created with, the data directory's lock, the kernel's map limit, the tail caches
//! fitted to the machine's memory.

use std::path::Path;

use super::{BrokerConfig, BrokerError};

/// The longest duration any option may name: a century. Past it, clock arithmetic breaks (a
/// deadline past the end of `Instant` panics; a retention past `i64` milliseconds reads as
/// negative, and every segment would be old enough to delete).
const DURATION_MS_MAX: u64 = 100 * 365 * 24 * 3_600_000;

pub(super) fn check_durations(cfg: &BrokerConfig) -> Result<(), BrokerError> {
    for (name, ms) in [
        (
            "retention-hours",
            cfg.retention_hours.saturating_mul(3_600_000),
        ),
        ("flush-interval-ms", cfg.flush_interval_ms),
        ("conn-timeout-ms", cfg.conn_timeout_ms),
        (
            "retention-check-interval-ms",
            cfg.retention_check_interval_ms,
        ),
        ("schedule-park-max-ms", cfg.schedule_park_max_ms),
        ("index-idle-close-ms", cfg.index_idle_close_ms),
        ("transaction-timeout-ms", cfg.transaction_timeout_ms),
        (
            "transaction-check-interval-ms",
            cfg.transaction_check_interval_ms,
        ),
        ("send-wait-max-ms", cfg.send_wait_max_ms),
        ("delay-max-ms", cfg.delay_max_ms),
        ("spin-before-park-us", cfg.spin_before_park_us / 1000),
        ("testing-write-delay-us", cfg.testing_write_delay_us / 1000),
    ] {
        if ms > DURATION_MS_MAX {
            return Err(BrokerError::Config(format!(
                "{name} names more than a century ({} days); at most {} days",
                ms / 86_400_000,
                DURATION_MS_MAX / 86_400_000
            )));
        }
    }
    Ok(())
}

/// The shards' tail caches are sized to at most half of the memory the broker may use
/// together (`mem_total`: see [`mem_total_bytes`]; unchecked when unknown): a larger
/// `tail-cache-mb` (the default too, on a small machine with many cores) is lowered, with a
/// line saying so. (A cache always keeps its newest write, and a pull answer keeps the
/// write it reads from alive until sent: the bound is on what the cache itself keeps.)
pub(super) fn fit_tail_cache(cfg: &mut BrokerConfig, shards: usize, mem_total: Option<u64>) {
    let Some(mem_total) = mem_total else {
        return;
    };
    let fit_mb = (mem_total / 2 / (shards.max(1) as u64)) >> 20;
    if cfg.tail_cache_mb > fit_mb {
        crate::warn!(
            "ringmq-broker: tail-cache-mb {} for each of {shards} shards is more than half of the {} MiB of memory the broker may use (the machine's, or its cgroup's limit): {fit_mb} MiB each",
            cfg.tail_cache_mb,
            mem_total >> 20
        );
        cfg.tail_cache_mb = fit_mb;
    }
}

/// The memory the broker may use: the machine's (`MemTotal` of /proc/meminfo), or the
/// process's cgroup limit (`memory.max` of cgroup v2, `memory.limit_in_bytes` of v1) when
/// that is lower; `None` when neither can be read.
pub(super) fn mem_total_bytes() -> Option<u64> {
    let machine = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
            let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kib.saturating_mul(1024))
        });
    // "N:memory:/PATH" (v1) or "0::/PATH" (v2) names the process's cgroup; v2's "max" (no
    // limit) does not parse, v1 says no limit with a huge number.
    let cgroup = std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|text| {
            text.lines().find_map(|line| {
                let file = match (line.split_once(":memory:"), line.strip_prefix("0::")) {
                    (Some((_, path)), _) => format!(
                        "/sys/fs/cgroup/memory{}/memory.limit_in_bytes",
                        path.trim_end_matches('/')
                    ),
                    (None, Some(path)) => {
                        format!("/sys/fs/cgroup{}/memory.max", path.trim_end_matches('/'))
                    }
                    (None, None) => return None,
                };
                std::fs::read_to_string(file)
                    .ok()?
                    .trim()
                    .parse::<u64>()
                    .ok()
            })
        });
    match (machine, cgroup) {
        (Some(m), Some(c)) => Some(m.min(c)),
        (m, c) => m.or(c),
    }
}

/// The shard count `data_dir` was created with: its `shards` file, or, with that gone, its
/// `shard-N` directories; `None` for a new directory (and for a damaged record, which
/// [`check_shard_count`] then reports).
pub(super) fn recorded_shard_count(data_dir: &Path) -> Option<usize> {
    match std::fs::read_to_string(data_dir.join("shards")) {
        Ok(s) => s.trim().parse().ok().filter(|&n| n > 0),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            shard_dirs(data_dir).ok().filter(|&n| n > 0)
        }
        Err(_) => None,
    }
}

pub(super) fn check_shard_count(data_dir: &Path, shards: usize) -> Result<(), BrokerError> {
    let dd = |reason: String| BrokerError::DataDir {
        path: data_dir.to_owned(),
        reason,
    };
    let path = data_dir.join("shards");
    match std::fs::read_to_string(&path) {
        Ok(s) => {
            let recorded: usize = s
                .trim()
                .parse()
                .map_err(|_| dd(format!("{} is damaged: {s:?}", path.display())))?;
            if recorded != shards {
                return Err(dd(format!(
                    "it was created with {recorded} shards and this broker was started with {shards}; \
                     start with --shards {recorded} (queue ownership depends on the shard count), or use a new data directory"
                )));
            }
            Ok(())
        }
        // Written whole or not at all (a crash leaves no damaged record). Gone while the
        // shards' directories are there (removed by hand, or a copy without it): their
        // count is the record, not the flag.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let found = shard_dirs(data_dir).map_err(|e| dd(format!("read: {e}")))?;
            if found > 0 && found != shards {
                return Err(dd(format!(
                    "{} is missing, and the directory holds shard-0 to shard-{} ({found} shards) while this broker was started with {shards}; \
                     start with --shards {found} (queue ownership depends on the shard count), or use a new data directory",
                    path.display(),
                    found - 1
                )));
            }
            crate::io::replace_file(&path, format!("{shards}\n").as_bytes())
                .map_err(|e| dd(e.to_string()))
        }
        Err(e) => Err(dd(format!("read {}: {e}", path.display()))),
    }
}

/// One past the highest `shard-N` directory in `data_dir` (0: none).
fn shard_dirs(data_dir: &Path) -> std::io::Result<usize> {
    let mut found = 0;
    for entry in std::fs::read_dir(data_dir)? {
        let name = entry?.file_name();
        let n = name.to_str().and_then(|n| n.strip_prefix("shard-"));
        if let Some(n) = n.and_then(|n| n.parse::<usize>().ok()) {
            found = found.max(n.saturating_add(1));
        }
    }
    Ok(found)
}

/// Takes an exclusive lock on the data directory (created if missing) for the life of the
/// broker: two brokers on one directory would corrupt each other's logs.
pub(super) fn lock_data_dir(data_dir: &Path) -> Result<std::fs::File, BrokerError> {
    use std::os::fd::AsRawFd;
    let path = data_dir.join("lock");
    let dd = |reason: String| BrokerError::DataDir {
        path: data_dir.to_owned(),
        reason,
    };
    std::fs::create_dir_all(data_dir).map_err(|e| dd(format!("create: {e}")))?;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| dd(format!("open {}: {e}", path.display())))?;
    // SAFETY: flock on a file descriptor we own; no memory is involved.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        return Err(dd(
            "it is in use by another broker (its lock file is held)".into()
        ));
    }
    Ok(file)
}

/// The kernel's limit on memory maps per process, if it can be read.
pub(super) fn max_map_count() -> Option<usize> {
    std::fs::read_to_string("/proc/sys/vm/max_map_count")
        .ok()?
        .trim()
        .parse()
        .ok()
}
