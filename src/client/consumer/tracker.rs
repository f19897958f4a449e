//! The cache of one queue of a push consumer: messages pulled and not yet done, the next
//! offset to pull, and the flow-control check over them. Pure bookkeeping (no I/O, no
//! time), so the rules that decide what is committed are tested on their own.
//!
//! The commit rule: the offset a group may commit for a queue is the smallest offset still
//! cached (pulled but not finished: waiting, being consumed, or waiting for a local retry),
//! or the next offset to pull when nothing is cached. Everything below it is done, so a
//! crash after the commit re-delivers what was in flight and never skips a message.

use std::collections::VecDeque;

/// Pulled messages of one queue, by queue offset, with their total size.
#[derive(Debug, Clone)]
pub(crate) struct OffsetTracker<T> {
    /// Cached offsets in increasing order (pulls arrive in offset order, so an insert is
    /// almost always a push at the back). An offset whose messages are all done is `None`
    /// until it reaches either end, where it is trimmed: the ends are always cached.
    entries: VecDeque<(u64, Option<Entry<T>>)>,
    /// The `None` slots in `entries`.
    done_slots: usize,
    bytes: u64,
    messages: usize,
    /// Where the next pull starts; `None` until the start position is known.
    next_pull: Option<u64>,
    /// Raised each time the next pull moves back (the broker sent the position back over
    /// messages a crash lost): what is pulled from then on is consumed after everything
    /// pulled before, in orderly mode.
    era: u64,
    /// Cached messages per era, oldest era first (eras only grow, so new ones go last).
    per_era: VecDeque<(u64, usize)>,
}

#[derive(Debug, Clone)]
struct Entry<T> {
    first: Cached<T>,
    /// Messages pulled at this offset after `first`, oldest first: the broker moved the
    /// position back over cached messages (a crash lost them, and their offsets hold other
    /// messages now). Each is done after the ones before it.
    later: Vec<Cached<T>>,
}

#[derive(Debug, Clone)]
struct Cached<T> {
    item: T,
    bytes: u64,
    era: u64,
}

impl<T> Default for OffsetTracker<T> {
    fn default() -> Self {
        OffsetTracker {
            entries: VecDeque::new(),
            done_slots: 0,
            bytes: 0,
            messages: 0,
            next_pull: None,
            era: 0,
            per_era: VecDeque::new(),
        }
    }
}

impl<T: Clone> OffsetTracker<T> {
    pub(crate) fn next_pull(&self) -> Option<u64> {
        self.next_pull
    }

    pub(crate) fn set_next_pull(&mut self, offset: u64) {
        if self.next_pull.is_some_and(|next| offset < next) {
            self.era += 1;
        }
        self.next_pull = Some(offset);
    }

    /// Caches a pulled message. A second message at a cached offset comes after the broker
    /// moved the position back over messages still cached (a crash lost them, and their
    /// offsets hold others now): it is queued behind the first, and the offset stays cached
    /// (holding the commit point) until each message there is done, in the order pulled.
    pub(crate) fn insert(&mut self, offset: u64, bytes: u64, item: T) {
        let cached = Cached {
            item,
            bytes,
            era: self.era,
        };
        let fresh = |cached| {
            Some(Entry {
                first: cached,
                later: Vec::new(),
            })
        };
        if self.entries.back().is_none_or(|(last, _)| *last < offset) {
            self.entries.push_back((offset, fresh(cached)));
        } else {
            match self.position(offset) {
                Ok(at) => match &mut self.entries[at].1 {
                    Some(entry) => entry.later.push(cached),
                    slot @ None => {
                        *slot = fresh(cached);
                        self.done_slots -= 1;
                    }
                },
                Err(at) => self.entries.insert(at, (offset, fresh(cached))),
            }
        }
        self.bytes += bytes;
        self.messages += 1;
        match self.per_era.back_mut() {
            Some((era, count)) if *era == self.era => *count += 1,
            _ => self.per_era.push_back((self.era, 1)),
        }
    }

    /// Marks the first message cached at `offset` done (consumed, or given up); the next one
    /// there, if any, comes first now. False when nothing was cached there.
    pub(crate) fn remove(&mut self, offset: u64) -> bool {
        let Ok(at) = self.position(offset) else {
            return false;
        };
        let slot = &mut self.entries[at].1;
        let done = match slot {
            Some(entry) if !entry.later.is_empty() => {
                std::mem::replace(&mut entry.first, entry.later.remove(0))
            }
            _ => {
                let Some(entry) = slot.take() else {
                    return false;
                };
                self.done_slots += 1;
                entry.first
            }
        };
        self.trim();
        self.bytes -= done.bytes;
        self.messages -= 1;
        if let Some(at) = self.per_era.iter().position(|(era, _)| *era == done.era) {
            self.per_era[at].1 -= 1;
            if self.per_era[at].1 == 0 {
                self.per_era.remove(at);
            }
        }
        true
    }

    /// Where `offset` is in `entries` (`Err`: where it would go). Offsets pulled without
    /// gaps sit at their distance from the first, found without a search.
    fn position(&self, offset: u64) -> Result<usize, usize> {
        let guess = self
            .entries
            .front()
            .and_then(|(first, _)| usize::try_from(offset.checked_sub(*first)?).ok());
        match guess {
            Some(at) if self.entries.get(at).is_some_and(|(o, _)| *o == offset) => Ok(at),
            _ => self.entries.binary_search_by_key(&offset, |(o, _)| *o),
        }
    }

    /// Drops done slots at both ends, and every one past 1,024 of them when they are more
    /// than twice the cached offsets (a message held long at the front while later ones
    /// finish, in a queue whose span is not limited, would otherwise keep a slot per offset
    /// passed).
    fn trim(&mut self) {
        while let Some((_, None)) = self.entries.front() {
            self.entries.pop_front();
            self.done_slots -= 1;
        }
        while let Some((_, None)) = self.entries.back() {
            self.entries.pop_back();
            self.done_slots -= 1;
        }
        if self.done_slots > 1024 && self.done_slots > 2 * (self.entries.len() - self.done_slots) {
            self.entries.retain(|(_, slot)| slot.is_some());
            self.done_slots = 0;
        }
    }

    /// The offset the group may commit: the smallest offset still cached, else the next
    /// offset to pull; `None` before the start position is known.
    pub(crate) fn commit_point(&self) -> Option<u64> {
        let smallest = self.entries.front().map(|(offset, _)| *offset);
        match (smallest, self.next_pull) {
            // The next pull is normally past every cached offset; the minimum keeps the
            // rule safe even after the broker moved the pull position back (a queue whose
            // messages were deleted and written again).
            (Some(cached), Some(next)) => Some(cached.min(next)),
            (Some(cached), None) => Some(cached),
            (None, next) => next,
        }
    }

    /// Messages cached (two at one offset count twice).
    pub(crate) fn len(&self) -> usize {
        self.messages
    }

    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Largest cached offset minus the smallest (0 with fewer than two messages).
    pub(crate) fn span(&self) -> u64 {
        match (self.entries.front(), self.entries.back()) {
            (Some((first, _)), Some((last, _))) => last - first,
            _ => 0,
        }
    }

    /// What an orderly queue consumes next: the first `n` cached messages in pull order.
    /// That is offset order within the oldest era still cached; messages pulled after the
    /// position moved back wait until every one pulled before is done.
    pub(crate) fn first(&self, n: usize) -> Vec<(u64, T)> {
        let Some(&(oldest, _)) = self.per_era.front() else {
            return Vec::new();
        };
        self.entries
            .iter()
            .filter_map(|(offset, slot)| Some((offset, slot.as_ref()?)))
            .filter(|(_, e)| e.first.era == oldest)
            .take(n)
            .map(|(offset, e)| (*offset, e.first.item.clone()))
            .collect()
    }
}

/// Why a queue's pulls pause.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FlowBlock {
    Messages(usize),
    Bytes(u64),
    Span(u64),
}

/// The per-queue flow-control limits: a queue is not pulled while it caches more than
/// these (upstream's defaults: 1000 messages, 100 MiB, and a span of 2000 offsets between
/// the smallest and largest cached message in concurrent mode).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FlowLimits {
    pub messages_max: usize,
    pub bytes_max: u64,
    /// `None` in orderly mode: one message at a time keeps the span small anyway, and a
    /// queue stuck on a failing message must still fill its cache up to the count limit.
    pub span_max: Option<u64>,
}

impl FlowLimits {
    /// `None` when the queue may be pulled, else the first limit it is over.
    pub(crate) fn check<T: Clone>(&self, tracker: &OffsetTracker<T>) -> Option<FlowBlock> {
        if tracker.len() > self.messages_max {
            return Some(FlowBlock::Messages(tracker.len()));
        }
        if tracker.bytes() > self.bytes_max {
            return Some(FlowBlock::Bytes(tracker.bytes()));
        }
        match self.span_max {
            Some(max) if tracker.span() > max => Some(FlowBlock::Span(tracker.span())),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tracker(next: u64, offsets: &[u64]) -> OffsetTracker<u64> {
        let mut t = OffsetTracker::default();
        for &o in offsets {
            t.insert(o, 10, o);
        }
        t.set_next_pull(next);
        t
    }

    /// Applies `done` in order and checks the commit point after each step.
    fn check_commits(next: u64, offsets: &[u64], done: &[u64], expected: &[u64]) {
        let mut t = tracker(next, offsets);
        for (o, want) in done.iter().zip(expected) {
            assert!(t.remove(*o), "{o} was cached");
            assert_eq!(t.commit_point(), Some(*want), "after finishing {o}");
        }
    }

    #[test]
    fn commit_point_is_the_smallest_offset_in_flight() {
        // Finished out of order: the commit point waits for the slowest one.
        check_commits(
            105,
            &[100, 101, 102, 103, 104],
            &[101, 103, 100, 104, 102],
            &[100, 100, 102, 102, 105],
        );
        // Nothing cached: the next offset to pull.
        assert_eq!(tracker(42, &[]).commit_point(), Some(42));
        // Unknown start: nothing to commit yet.
        assert_eq!(OffsetTracker::<u64>::default().commit_point(), None);
        // A pull position moved back below cached messages never lets the commit pass it.
        assert_eq!(tracker(7, &[10, 11]).commit_point(), Some(7));
    }

    #[test]
    fn a_second_message_at_a_cached_offset_holds_the_commit_point_until_both_are_done() {
        let mut t = OffsetTracker::default();
        t.set_next_pull(15);
        t.insert(15, 10, "lost, still being consumed");
        t.set_next_pull(20);
        // The broker sends the position back to 15: another message is stored there now.
        t.set_next_pull(15);
        t.insert(15, 7, "new");
        t.set_next_pull(16);
        assert_eq!((t.len(), t.bytes()), (2, 17));
        assert!(t.remove(15), "the first of the two is done");
        assert_eq!(t.commit_point(), Some(15), "the other is still in flight");
        assert!(t.remove(15));
        assert_eq!(t.commit_point(), Some(16));
        assert_eq!((t.len(), t.bytes()), (0, 0));
        assert!(!t.remove(15));
    }

    /// Orderly: messages cached, not yet consumed, at offsets the broker then moved the
    /// position back over. The new messages pulled from there are consumed after them, in
    /// pull order (before, the new ones at cached offsets were dropped as duplicates and the
    /// queue moved past them; and a new one alone at its offset must not overtake them).
    #[test]
    fn messages_pulled_after_the_position_moved_back_are_consumed_after_the_cached_ones() {
        let mut t = OffsetTracker::default();
        t.set_next_pull(12);
        for o in 12..18 {
            t.insert(o, 10, format!("lost-{o}"));
        }
        t.set_next_pull(18);
        // The broker sends the position back to 15; new messages are stored at 15.. now.
        t.set_next_pull(15);
        for o in 15..20 {
            t.insert(o, 10, format!("new-{o}"));
        }
        t.set_next_pull(20);
        assert_eq!((t.len(), t.bytes()), (11, 110));
        let names = |batch: Vec<(u64, String)>| batch.into_iter().map(|(_, m)| m).collect();
        let firsts: Vec<String> = names(t.first(4));
        assert_eq!(firsts, ["lost-12", "lost-13", "lost-14", "lost-15"]);
        for o in 12..16 {
            assert!(t.remove(o));
        }
        // In pull order: new-18 and new-19 (alone at their offsets) wait for the lost ones.
        let firsts: Vec<String> = names(t.first(10));
        assert_eq!(firsts, ["lost-16", "lost-17"]);
        for o in 16..18 {
            assert!(t.remove(o));
        }
        assert_eq!(
            t.commit_point(),
            Some(15),
            "the new ones are not consumed yet"
        );
        let firsts: Vec<String> = names(t.first(10));
        assert_eq!(firsts, ["new-15", "new-16", "new-17", "new-18", "new-19"]);
        for o in 15..20 {
            assert!(t.remove(o));
        }
        assert_eq!((t.commit_point(), t.len(), t.bytes()), (Some(20), 0, 0));
    }

    #[test]
    fn a_retried_message_holds_the_commit_point_back() {
        let mut t = tracker(4, &[0, 1, 2, 3]);
        for o in [1, 2, 3] {
            t.remove(o);
        }
        // Offset 0 is waiting for a local retry: still cached, so not committed past.
        assert_eq!(t.commit_point(), Some(0));
        t.set_next_pull(1000);
        assert_eq!(t.commit_point(), Some(0));
        t.remove(0);
        assert_eq!(t.commit_point(), Some(1000));
    }

    #[test]
    fn size_and_span_follow_inserts_and_removals() {
        let mut t = tracker(0, &[5, 9, 2000]);
        assert_eq!((t.len(), t.bytes(), t.span()), (3, 30, 1995));
        assert!(!t.remove(6));
        t.remove(5);
        assert_eq!((t.len(), t.bytes(), t.span()), (2, 20, 1991));
        assert_eq!(t.first(1), vec![(9, 9)]);
        t.remove(2000);
        assert_eq!(t.span(), 0);
        assert_eq!(t.first(5), vec![(9, 9)]);
    }

    /// A queue held at its first message while thousands after it finish keeps a bounded
    /// number of slots, and still answers as if it held only what is cached.
    #[test]
    fn offsets_done_behind_a_held_message_do_not_pile_up() {
        let mut t = tracker(5000, &(0..5000).collect::<Vec<_>>());
        for o in 1..4999 {
            assert!(t.remove(o));
        }
        assert!(t.entries.len() <= 1100, "{} slots", t.entries.len());
        assert_eq!((t.len(), t.bytes(), t.span()), (2, 20, 4999));
        assert_eq!(t.commit_point(), Some(0));
        assert_eq!(t.first(5), vec![(0, 0), (4999, 4999)]);
        assert!(!t.remove(17), "done already");
        t.insert(17, 10, 17);
        assert_eq!(t.first(5), vec![(0, 0), (17, 17), (4999, 4999)]);
        for o in [0, 4999, 17] {
            assert!(t.remove(o));
        }
        assert_eq!(
            (t.len(), t.entries.len(), t.commit_point()),
            (0, 0, Some(5000))
        );
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u64),
        Remove(u64),
        NextPull(u64),
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        prop_oneof![
            4 => (0u64..48).prop_map(Op::Insert),
            4 => (0u64..48).prop_map(Op::Remove),
            1 => (0u64..48).prop_map(Op::NextPull),
        ]
    }

    proptest::proptest! {
        /// The tracker against a plain ordered map of every cached message (what it kept
        /// before it became a deque): same counts, span, commit point and orderly batch
        /// after each step of inserts, removals and pull positions, in any order.
        #[test]
        fn the_tracker_agrees_with_an_ordered_map(ops in proptest::collection::vec(op(), 1..300)) {
            use std::collections::BTreeMap;
            let mut t = OffsetTracker::default();
            // offset -> (item, bytes, era) in pull order
            let mut model: BTreeMap<u64, Vec<(u32, u64, u64)>> = BTreeMap::new();
            let (mut era, mut next, mut item) = (0u64, None::<u64>, 0u32);
            for op in ops {
                match op {
                    Op::Insert(o) => {
                        item += 1;
                        let bytes = u64::from(item % 7) + 1;
                        t.insert(o, bytes, item);
                        model.entry(o).or_default().push((item, bytes, era));
                    }
                    Op::Remove(o) => {
                        let want = model.get_mut(&o).is_some_and(|v| {
                            v.remove(0);
                            true
                        });
                        if model.get(&o).is_some_and(Vec::is_empty) {
                            model.remove(&o);
                        }
                        proptest::prop_assert_eq!(t.remove(o), want);
                    }
                    Op::NextPull(o) => {
                        if next.is_some_and(|n| o < n) {
                            era += 1;
                        }
                        next = Some(o);
                        t.set_next_pull(o);
                    }
                }
                let all = || model.values().flatten();
                proptest::prop_assert_eq!(t.len(), all().count());
                proptest::prop_assert_eq!(t.bytes(), all().map(|m| m.1).sum::<u64>());
                let (lo, hi) = (model.keys().next(), model.keys().next_back());
                proptest::prop_assert_eq!(t.span(), hi.zip(lo).map_or(0, |(h, l)| h - l));
                let commit = match (lo, next) {
                    (Some(&l), Some(n)) => Some(l.min(n)),
                    (Some(&l), None) => Some(l),
                    (None, n) => n,
                };
                proptest::prop_assert_eq!(t.commit_point(), commit);
                let oldest = all().map(|m| m.2).min();
                let firsts: Vec<(u64, u32)> = model
                    .iter()
                    .filter(|(_, v)| Some(v[0].2) == oldest)
                    .take(6)
                    .map(|(o, v)| (*o, v[0].0))
                    .collect();
                proptest::prop_assert_eq!(t.first(6), firsts);
            }
        }
    }

    fn check_flow(limits: FlowLimits, offsets: &[u64], bytes_each: u64, want: Option<FlowBlock>) {
        let mut t = OffsetTracker::default();
        for &o in offsets {
            t.insert(o, bytes_each, ());
        }
        assert_eq!(limits.check(&t), want, "{offsets:?}");
    }

    #[test]
    fn flow_control_pauses_past_each_limit() {
        let concurrent = FlowLimits {
            messages_max: 1000,
            bytes_max: 100 << 20,
            span_max: Some(2000),
        };
        let orderly = FlowLimits {
            span_max: None,
            ..concurrent
        };
        let n = |count: u64| (0..count).collect::<Vec<_>>();
        check_flow(concurrent, &n(1000), 1, None);
        check_flow(concurrent, &n(1001), 1, Some(FlowBlock::Messages(1001)));
        check_flow(concurrent, &n(100), 1 << 20, None);
        check_flow(
            concurrent,
            &n(101),
            1 << 20,
            Some(FlowBlock::Bytes(101 << 20)),
        );
        check_flow(concurrent, &[0, 2000], 1, None);
        check_flow(concurrent, &[0, 2001], 1, Some(FlowBlock::Span(2001)));
        check_flow(orderly, &[0, 2001], 1, None);
        check_flow(orderly, &n(1001), 1, Some(FlowBlock::Messages(1001)));
    }
}
