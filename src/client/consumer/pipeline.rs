//! Pipelined pulls of one queue: while the broker has said that a queue holds more than
//! one pull's worth past the consumer's position, the next pulls are sent before the
//! earlier answers arrive, each starting where the one before it would end
//! (`offset + pull_batch_max`). Pure bookkeeping, tested on its own; the pull loop does
//! the I/O.
//!
//! The rule that keeps delivery gap-free: answers are taken in the order the pulls were
//! sent, and an answer is used only if its pull started at or below the queue's position
//! at that moment (an answer covers every matching message from where its pull started up
//! to its `next_offset`, so the union stays contiguous). When an earlier answer ended
//! short of where the next pull started (fewer messages than asked: the queue's end, a
//! size limit, a tag filter, an SQL filter's work running out), that next answer is
//! thrown away with every pull still in flight, and pulling starts again from the
//! position. Messages below the position (a tag filter's answer can reach past where the
//! next pull started) are dropped by the loop. After an answer that ended short, no pull
//! goes ahead until one comes back whole: the pulls ahead would each be thrown away again
//! (and the broker would have read them, and filtered them, for nothing).

use std::collections::VecDeque;

/// What to do with an answer, decided by [`PullPipeline::answered`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Use it: its pull started at the position.
    Use,
    /// Its pull started below the position (an earlier answer reached past where it
    /// started): its messages below the position were delivered already, and a status
    /// other than found (queue end, offset out of range) describes an older position, so
    /// only its messages may be used.
    Behind,
    /// Its pull started past the position (an earlier answer ended short): drop it and
    /// everything still in flight; pulling starts again from the position.
    Restart,
}

/// Whether a pull sent now, with `in_flight` pulls in flight, fits the cache's byte limit:
/// it and each pull in flight counted as `answer_bytes` (the most record bytes an answer
/// of the queue has had) within `room` (the limit less what the cache holds). With
/// nothing in flight a pull is always sent (the flow-control check before it stops a
/// queue over its limit), as [`PullPipeline::next_pull`] does for the message count.
pub(crate) fn ahead_fits_bytes(in_flight: usize, answer_bytes: u64, room: u64) -> bool {
    in_flight == 0
        || (in_flight as u64)
            .saturating_add(1)
            .saturating_mul(answer_bytes)
            <= room
}

#[derive(Debug, Clone)]
pub(crate) struct PullPipeline {
    /// Most pulls in flight at once (1: one pull at a time, as upstream).
    depth_max: usize,
    /// Messages asked for per pull.
    batch: u64,
    /// Start offsets of the pulls in flight, oldest first.
    in_flight: VecDeque<u64>,
    /// Where the next pull would start.
    ahead: u64,
    /// One past the queue's last message, as the latest answer said.
    known_end: u64,
    /// The most record bytes a recent answer had (halved at each smaller one: one large
    /// answer narrows the pulls ahead for a while, not for good).
    largest_answer: u64,
    /// Where the pull of the last answer taken started.
    last_start: u64,
    /// The last answer used ended short of its pull's batch: no pull goes ahead.
    short: bool,
}

impl PullPipeline {
    pub(crate) fn new(depth_max: usize, batch: u32, position: u64) -> PullPipeline {
        PullPipeline {
            depth_max: depth_max.max(1),
            batch: u64::from(batch.max(1)),
            in_flight: VecDeque::new(),
            ahead: position,
            known_end: 0,
            largest_answer: 0,
            last_start: position,
            short: false,
        }
    }

    #[cfg(test)]
    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// The start of the next pull to send now, if one should be: always when none is in
    /// flight; otherwise only while the pipeline has room, the last answer came back
    /// whole, the queue is known to hold messages where it would start, and the cache (`cached` messages, plus a full batch
    /// for each pull in flight and this one) stays within `cached_max`.
    pub(crate) fn next_pull(&self, cached: usize, cached_max: usize) -> Option<u64> {
        let n = self.in_flight.len() as u64;
        if n == 0 {
            return Some(self.ahead);
        }
        let room = (cached_max as u64).saturating_sub(cached as u64);
        let fits = (n + 1).saturating_mul(self.batch) <= room;
        let ahead = self.in_flight.len() < self.depth_max && !self.short;
        (ahead && self.ahead < self.known_end && fits).then_some(self.ahead)
    }

    /// Whether a pull sent now fits `room` bytes of the cache ([`ahead_fits_bytes`], each
    /// pull counted as the largest recent answer).
    pub(crate) fn fits_bytes(&self, room: u64) -> bool {
        ahead_fits_bytes(self.in_flight.len(), self.largest_answer, room)
    }

    /// An answer arrived with `bytes` of records.
    pub(crate) fn answer_bytes(&mut self, bytes: u64) {
        self.largest_answer = bytes.max(self.largest_answer / 2);
    }

    /// Records a pull sent at `offset` (the value `next_pull` gave).
    pub(crate) fn sent(&mut self, offset: u64) {
        self.in_flight.push_back(offset);
        self.ahead = offset.saturating_add(self.batch);
    }

    /// The oldest pull in flight was answered (or failed); `position` is the queue's
    /// position before that answer is used.
    pub(crate) fn answered(&mut self, position: u64) -> Verdict {
        let start = self.in_flight.pop_front();
        self.last_start = start.unwrap_or(position);
        match start {
            Some(start) if start > position => {
                self.restart(position);
                Verdict::Restart
            }
            Some(start) if start < position => Verdict::Behind,
            _ => Verdict::Use,
        }
    }

    /// An answer was used: the queue's new `position`, and its end as the answer said.
    pub(crate) fn used(&mut self, position: u64, max_offset: u64) {
        self.short = position < self.last_start.saturating_add(self.batch);
        self.known_end = max_offset;
        if self.in_flight.is_empty() || position > self.ahead {
            self.ahead = position;
        }
    }

    /// Forgets every pull in flight (the loop drops them); the next starts at `position`.
    pub(crate) fn restart(&mut self, position: u64) {
        self.in_flight.clear();
        self.ahead = position;
    }

    /// A pull failed: as [`restart`](Self::restart), and the queue's end is no longer
    /// known (the broker may have restarted with a shorter queue): one pull at a time
    /// until an answer says where the queue ends.
    pub(crate) fn restart_after_error(&mut self, position: u64) {
        self.restart(position);
        self.known_end = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pulls_ahead_count_as_the_largest_answer_against_the_byte_room() {
        // Nothing in flight: always (the flow-control check stops a full cache).
        assert!(ahead_fits_bytes(0, 5 << 20, 0));
        // No answer yet: nothing known to count.
        assert!(ahead_fits_bytes(3, 0, 0));
        // Two in flight and this one, at 1 MiB each, in 3 MiB of room; not in 3 MiB - 1.
        assert!(ahead_fits_bytes(2, 1 << 20, 3 << 20));
        assert!(!ahead_fits_bytes(2, 1 << 20, (3 << 20) - 1));
        assert!(!ahead_fits_bytes(usize::MAX, u64::MAX, u64::MAX - 1));
        // The pipeline counts its pulls in flight as its largest recent answer, halved
        // at each smaller one.
        let mut p = PullPipeline::new(4, 32, 0);
        p.sent(0);
        p.answer_bytes(1 << 20);
        assert!(p.fits_bytes(2 << 20) && !p.fits_bytes((2 << 20) - 1));
        p.answer_bytes(1000);
        assert!(p.fits_bytes(1 << 20) && !p.fits_bytes((1 << 20) - 1));
    }
    use proptest::prelude::*;

    #[test]
    fn pulls_ahead_only_into_known_messages_and_within_the_cache() {
        let mut p = PullPipeline::new(4, 32, 100);
        // Nothing known yet: one pull.
        assert_eq!(p.next_pull(0, 1000), Some(100));
        p.sent(100);
        assert_eq!(p.next_pull(0, 1000), None, "the queue's end is not known");
        assert_eq!(p.answered(100), Verdict::Use);
        // (An answer whose pull started below the position is "behind".)
        let mut b = PullPipeline::new(2, 32, 0);
        b.sent(0);
        assert_eq!(b.answered(5), Verdict::Behind);
        p.used(132, 1000);
        // 868 messages known past 132: up to 4 pulls.
        for start in [132, 164, 196, 228] {
            assert_eq!(p.next_pull(0, 1000), Some(start));
            p.sent(start);
        }
        assert_eq!(p.next_pull(0, 1000), None, "depth 4 reached");
        // After a failed pull, the end is unknown again: one pull at a time.
        let mut e = p.clone();
        e.restart_after_error(132);
        assert_eq!(e.next_pull(0, 1000), Some(132));
        e.sent(132);
        assert_eq!(
            e.next_pull(0, 1000),
            None,
            "pulled ahead past an end not known"
        );
        assert_eq!(p.in_flight(), 4);
        // Answers in order move the position; the next pulls follow.
        assert_eq!(p.answered(132), Verdict::Use);
        p.used(164, 1000);
        assert_eq!(p.next_pull(0, 1000), Some(260));
        // A full cache allows only the pull that must exist.
        let mut q = PullPipeline::new(4, 32, 0);
        q.sent(0);
        q.answered(0);
        q.used(32, 10_000);
        q.sent(32);
        assert_eq!(q.next_pull(940, 1000), None, "940 + 2 x 32 > 1000");
        assert_eq!(q.next_pull(936, 1000), Some(64));
        // Past the known end: no pull ahead.
        let mut r = PullPipeline::new(4, 32, 0);
        r.sent(0);
        r.answered(0);
        r.used(32, 40);
        r.sent(32);
        assert_eq!(r.next_pull(0, 1000), None, "64 is past the end (40)");
    }

    #[test]
    fn a_short_answer_restarts_from_the_position() {
        let mut p = PullPipeline::new(3, 32, 0);
        p.sent(0);
        p.answered(0);
        p.used(32, 1000);
        p.sent(32);
        p.sent(64);
        p.sent(96);
        // The answer of the pull at 32 held 10 messages (a size limit): position 42.
        assert_eq!(p.answered(32), Verdict::Use);
        p.used(42, 1000);
        // The pull at 64 would leave 42..64 out: thrown away with the pull at 96.
        assert_eq!(p.answered(42), Verdict::Restart);
        assert_eq!(p.in_flight(), 0);
        assert_eq!(p.next_pull(0, 1000), Some(42));
        // No pull goes ahead of the one at 42 while the last answer ended short ...
        p.sent(42);
        assert_eq!(
            p.next_pull(0, 1000),
            None,
            "pulled ahead after a short answer"
        );
        // ... nor after another short one (an SQL filter's work ran out after 5) ...
        assert_eq!(p.answered(42), Verdict::Use);
        p.used(47, 1000);
        p.sent(47);
        assert_eq!(p.next_pull(0, 1000), None);
        // ... until one comes back whole.
        assert_eq!(p.answered(47), Verdict::Use);
        p.used(79, 1000);
        p.sent(79);
        assert_eq!(p.next_pull(0, 1000), Some(111));
    }

    /// A model queue of `len` messages, all matching, answered with at most `batch`
    /// messages and at most `limit` at a time (a size limit the client does not know).
    fn answer(start: u64, batch: u64, limit: u64, len: u64) -> (Vec<u64>, u64) {
        let end = (start + batch.min(limit)).min(len.max(start));
        ((start..end).collect(), end)
    }

    proptest! {
        /// Whatever the answers' lengths, the messages used are every offset once, in
        /// order: no gap, no duplicate.
        #[test]
        fn delivery_is_contiguous_whatever_the_answer_sizes(
            depth in 1usize..6,
            batch in 1u32..40,
            limits in proptest::collection::vec(1u64..50, 1..200),
            len in 0u64..600,
        ) {
            let mut p = PullPipeline::new(depth, batch, 0);
            let mut position = 0u64;
            let mut delivered = Vec::new();
            let mut limits = limits.into_iter().cycle();
            let mut in_flight: VecDeque<u64> = VecDeque::new();
            let mut steps = 0;
            while position < len {
                steps += 1;
                prop_assert!(steps < 10_000, "no progress");
                while let Some(start) = p.next_pull(0, 1000) {
                    p.sent(start);
                    in_flight.push_back(start);
                }
                let start = in_flight.pop_front().expect("a pull is in flight");
                match p.answered(position) {
                    Verdict::Restart => {
                        in_flight.clear();
                        continue;
                    }
                    Verdict::Use | Verdict::Behind => {}
                }
                let (offsets, next) = answer(start, u64::from(batch), limits.next().unwrap(), len);
                delivered.extend(offsets.into_iter().filter(|o| *o >= position));
                position = position.max(next);
                p.used(position, len);
            }
            prop_assert_eq!(delivered, (0..len).collect::<Vec<_>>());
        }
    }
}
