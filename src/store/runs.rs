//! The runs file: each start of the store (a run, named by its incarnation) with where the
//! log ended at that start. A consumer's position carries the run it was read under; a
//! crash since then may have lost the records past it (an async log's unsynced tail), and
//! a position past where the queue ended at any later start names offsets that hold other
//! messages now. Kept for the last [`RUNS_KEPT`] starts, so a consumer that stayed up (or
//! kept its position on its own disk) through several restarts is still checked against
//! each of them, not only the latest.
//!
//! Written whole (temp file, fsync, rename, fsync of the directory) with a CRC before the
//! store serves, so every run named in an answer is on disk. Every open of the store counts
//! as a start (a tool's recovery can cut the log too). The checks only ever move a
//! position back (messages delivered again, never skipped): a run not of this store is
//! checked against this start, one older than every start kept against all of them.

use std::path::Path;

const RUNS_MAGIC: u32 = u32::from_le_bytes(*b"RMQR");
const RUNS_VERSION: u32 = 1;
const HEADER_BYTES: usize = 8;
const RUN_BYTES: usize = 16;
const CRC_BYTES: usize = 4;
/// Starts remembered; a position read under an older run is checked against these.
pub(super) const RUNS_KEPT: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Run {
    incarnation: u64,
    /// The log's readable end when the run started (after recovery).
    log_end: u64,
}

/// The starts of the store, oldest first; the last one is this run.
#[derive(Debug)]
pub(super) struct Runs {
    runs: Vec<Run>,
}

fn encode(runs: &[Run]) -> Vec<u8> {
    let mut b = Vec::with_capacity(HEADER_BYTES + runs.len() * RUN_BYTES + CRC_BYTES);
    b.extend_from_slice(&RUNS_MAGIC.to_le_bytes());
    b.extend_from_slice(&RUNS_VERSION.to_le_bytes());
    for r in runs {
        b.extend_from_slice(&r.incarnation.to_le_bytes());
        b.extend_from_slice(&r.log_end.to_le_bytes());
    }
    let crc = crc32c::crc32c(&b);
    b.extend_from_slice(&crc.to_le_bytes());
    b
}

fn decode(b: &[u8]) -> Option<Vec<Run>> {
    let body_len = b.len().checked_sub(CRC_BYTES)?;
    let (body, crc) = b.split_at(body_len);
    if body.len() < HEADER_BYTES || !(body.len() - HEADER_BYTES).is_multiple_of(RUN_BYTES) {
        return None;
    }
    let u32_at = |i: usize| u32::from_le_bytes(body[i..i + 4].try_into().unwrap_or_default());
    let u64_at = |i: usize| u64::from_le_bytes(body[i..i + 8].try_into().unwrap_or_default());
    if u32_at(0) != RUNS_MAGIC
        || u32_at(4) != RUNS_VERSION
        || u32::from_le_bytes(crc.try_into().ok()?) != crc32c::crc32c(body)
    {
        return None;
    }
    let runs = (HEADER_BYTES..body.len())
        .step_by(RUN_BYTES)
        .map(|i| Run {
            incarnation: u64_at(i),
            log_end: u64_at(i + 8),
        })
        .collect();
    Some(runs)
}

impl Runs {
    /// Reads the runs file in `dir`, adds this run starting at `log_end` with an
    /// incarnation later than every earlier one (`now_nanos`, or one past the last run's if
    /// the clock went back), and writes the file back, synced. A damaged file is reported
    /// and started again: positions from before are then checked against this start only.
    pub(super) fn start(dir: &Path, log_end: u64, now_nanos: u64) -> std::io::Result<Runs> {
        let path = dir.join("runs");
        let mut runs = match std::fs::read(&path) {
            Ok(bytes) => decode(&bytes).unwrap_or_else(|| {
                crate::warn!(
                    "ringmq: {} is damaged; consumers' positions from before this start are checked against this start only",
                    path.display()
                );
                Vec::new()
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => {
                let why = format!("read {}: {e}", path.display());
                return Err(std::io::Error::new(e.kind(), why));
            }
        };
        let after = runs.last().map_or(0, |r| r.incarnation);
        let incarnation = now_nanos.max(after.saturating_add(1)).max(1);
        runs.push(Run {
            incarnation,
            log_end,
        });
        let drop = runs.len().saturating_sub(RUNS_KEPT);
        runs.drain(..drop);
        crate::io::replace_file(&path, &encode(&runs))?;
        Ok(Runs { runs })
    }

    /// This run's incarnation: never 0, later than every earlier run's.
    pub(super) fn current(&self) -> u64 {
        self.runs.last().map_or(1, |r| r.incarnation)
    }

    /// For a position read under run `incarnation`: the lowest log end any later run
    /// started at (what every crash since then kept, at least). `None` for this run's
    /// positions and for 0 (unknown). A run newer than this one (not from this store)
    /// is checked against this start; one older than every run kept, against all kept.
    pub(super) fn log_end_since(&self, incarnation: u64) -> Option<u64> {
        let current = self.runs.last()?;
        if incarnation == 0 || incarnation == current.incarnation {
            return None;
        }
        let since = self
            .runs
            .iter()
            .filter(|r| r.incarnation > incarnation)
            .map(|r| r.log_end)
            .min();
        Some(since.unwrap_or(current.log_end))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_start_is_kept_and_positions_are_checked_against_every_later_one() {
        let dir = tempfile::tempdir().unwrap();
        let first = Runs::start(dir.path(), 0, 100).unwrap();
        assert_eq!(first.current(), 100);
        assert_eq!(first.log_end_since(100), None);
        assert_eq!(first.log_end_since(0), None);
        // A crash kept the log up to 5,000; the clock went back: still a later run.
        let second = Runs::start(dir.path(), 5_000, 50).unwrap();
        assert_eq!(second.current(), 101);
        assert_eq!(second.log_end_since(100), Some(5_000));
        // A crash after the second start lost part of what the second recovered.
        let third = Runs::start(dir.path(), 4_000, 300).unwrap();
        assert_eq!(third.current(), 300);
        assert_eq!(third.log_end_since(100), Some(4_000));
        assert_eq!(third.log_end_since(101), Some(4_000));
        let fourth = Runs::start(dir.path(), 9_000, 400).unwrap();
        // From the first run: the lowest end of every start since.
        assert_eq!(fourth.log_end_since(100), Some(4_000));
        assert_eq!(fourth.log_end_since(300), Some(9_000));
        assert_eq!(fourth.log_end_since(400), None);
        // Not a run of this store: checked against this start.
        assert_eq!(fourth.log_end_since(u64::MAX), Some(9_000));
    }

    #[test]
    fn only_the_last_starts_are_kept_and_a_damaged_file_starts_again() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..RUNS_KEPT as u64 + 10 {
            Runs::start(dir.path(), 1_000 + i, 10 + i).unwrap();
        }
        let bytes = std::fs::read(dir.path().join("runs")).unwrap();
        assert_eq!(
            bytes.len(),
            HEADER_BYTES + RUNS_KEPT * RUN_BYTES + CRC_BYTES
        );
        let runs = Runs::start(dir.path(), 7, 1).unwrap();
        // The oldest kept start is the 11th (log end 1,010), then 7 for this one.
        assert_eq!(runs.log_end_since(5), Some(7));
        assert_eq!(runs.current(), 10 + RUNS_KEPT as u64 + 10);

        let mut bytes = std::fs::read(dir.path().join("runs")).unwrap();
        bytes[HEADER_BYTES + 3] ^= 1;
        std::fs::write(dir.path().join("runs"), &bytes).unwrap();
        let again = Runs::start(dir.path(), 8, 2).unwrap();
        assert_eq!(again.current(), 2, "nothing earlier is known");
        assert_eq!(again.log_end_since(1), Some(8));
    }
}
