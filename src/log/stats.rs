//! What the log counts for the metrics: fdatasync latency and segments deleted by
//! retention (shard-local cells: one shard owns a log).

use std::cell::{Cell, RefCell};
use std::time::Duration;

/// Upper bounds (seconds) of the latency histograms.
pub const LATENCY_BUCKETS: [f64; 14] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

/// A latency histogram: a count per bucket of [`LATENCY_BUCKETS`] (the last past every
/// bound), the sum and the count.
#[derive(Debug, Clone, Default)]
pub struct LatencyHistogram {
    counts: [u64; LATENCY_BUCKETS.len() + 1],
    sum_s: f64,
    count: u64,
}

impl LatencyHistogram {
    pub fn record(&mut self, d: Duration) {
        let s = d.as_secs_f64();
        let i = LATENCY_BUCKETS
            .iter()
            .position(|&b| s <= b)
            .unwrap_or(LATENCY_BUCKETS.len());
        self.counts[i] += 1;
        self.sum_s += s;
        self.count += 1;
    }

    /// (upper bound, count in that bucket alone); the last bound is `f64::MAX` (+Inf).
    pub fn buckets(&self) -> Vec<(f64, u64)> {
        LATENCY_BUCKETS
            .iter()
            .copied()
            .chain(std::iter::once(f64::MAX))
            .zip(self.counts.iter().copied())
            .collect()
    }

    pub fn sum_seconds(&self) -> f64 {
        self.sum_s
    }

    pub fn count(&self) -> u64 {
        self.count
    }
}

/// The log's counters.
#[derive(Debug, Default)]
pub struct LogStats {
    pub fdatasync: RefCell<LatencyHistogram>,
    pub segments_deleted: Cell<u64>,
    /// Writes of records to the log's files (a round of appends is one write per chunk).
    pub writes: Cell<u64>,
    /// Pre-zeroing of segment files: done by the writer before a write (on the
    /// acknowledgement path: sync mode only, at a segment's first write or after a failed
    /// background zeroing), and whole stretches zeroed in the background ahead of it (sync
    /// mode, and async mode while the log writes slowly).
    pub prezero_inline: Cell<u64>,
    pub prezero_background: Cell<u64>,
    /// Async mode: writes that caught up with a stretch being zeroed and waited for it.
    pub prezero_caught_up: Cell<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_buckets_count_each_observation_once() {
        let mut l = LatencyHistogram::default();
        for us in [50, 100, 300, 2_000, 3_000_000] {
            l.record(Duration::from_micros(us));
        }
        assert_eq!(l.count(), 5);
        let b = l.buckets();
        assert_eq!(b.len(), LATENCY_BUCKETS.len() + 1);
        assert_eq!(b.iter().map(|x| x.1).sum::<u64>(), 5);
        assert_eq!(b[0], (0.0001, 2), "50 µs and 100 µs");
        assert_eq!(b.last(), Some(&(f64::MAX, 1)), "3 s is past every bound");
    }
}
