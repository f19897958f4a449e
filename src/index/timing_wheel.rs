//! A hierarchical timing wheel: items due at a millisecond, inserted in O(1), taken out in
//! due order.
//!
//! Six levels of 64 slots; a slot of level `k` spans `64^k` ms, so the wheel covers
//! `64^6` ms (about 2.2 years) ahead of its current time; anything further waits in an
//! overflow list that is looked at when the top level wraps. An item goes to the lowest
//! level whose slot span still separates its due time from the wheel's time (the highest
//! 6-bit group in which they differ). When the wheel's time reaches a slot of level
//! `k > 0`, the slot's items move down (cascade); level-0 slots hold items of one exact
//! millisecond, so items come out in due order. Items already due when inserted (or when
//! they cascade) wait in a ready list kept in due order.
//!
//! Pure and deterministic: time is passed in. The broker's schedule (`broker::schedule`)
//! keeps one wheel per shard, rebuilt from the schedule's consume queue on start.

use std::collections::VecDeque;

const LEVELS: usize = 6;
const SLOTS: usize = 64;
const SLOT_BITS: u32 = 6;
/// The span of one turn of the top level: items in the levels share the wheel's turn.
const SPAN_MS: u64 = 1 << (SLOT_BITS as u64 * LEVELS as u64);

const _: () = assert!(SLOTS == 1 << SLOT_BITS);

struct Level<T> {
    /// Bit `i` set: slot `i` holds items.
    occupied: u64,
    slots: Vec<Vec<(u64, T)>>,
    /// The earliest due time in each slot (`u64::MAX` when empty).
    mins: [u64; SLOTS],
}

impl<T> Level<T> {
    fn new() -> Level<T> {
        Level {
            occupied: 0,
            slots: (0..SLOTS).map(|_| Vec::new()).collect(),
            mins: [u64::MAX; SLOTS],
        }
    }
}

/// Items of type `T`, each due at a time in ms.
pub struct TimingWheel<T> {
    /// The wheel's time: everything due at or before it is in `ready`.
    elapsed: u64,
    levels: Vec<Level<T>>,
    /// Items due beyond what the levels cover.
    overflow: Vec<(u64, T)>,
    /// The earliest due time in `overflow`.
    overflow_min: Option<u64>,
    /// Items already due, in due order.
    ready: VecDeque<(u64, T)>,
    len: usize,
}

/// The level and slot an item due at `due` goes to, relative to `elapsed` (`due > elapsed`,
/// `due - elapsed < SPAN_MS`).
fn level_and_slot(elapsed: u64, due: u64) -> (usize, usize) {
    let differing = (due ^ elapsed) | (SLOTS as u64 - 1);
    let top_bit = 63 - differing.leading_zeros();
    let level = (top_bit / SLOT_BITS) as usize;
    let slot = ((due >> (SLOT_BITS * level as u32)) as usize) & (SLOTS - 1);
    (level, slot)
}

/// The span of one slot of `level`, in ms.
fn slot_span(level: usize) -> u64 {
    1 << (SLOT_BITS * level as u32)
}

impl<T> TimingWheel<T> {
    /// An empty wheel whose time is `now_ms`.
    pub fn new(now_ms: u64) -> TimingWheel<T> {
        TimingWheel {
            elapsed: now_ms,
            levels: (0..LEVELS).map(|_| Level::new()).collect(),
            overflow: Vec::new(),
            overflow_min: None,
            ready: VecDeque::new(),
            len: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Adds an item due at `due_ms` (at or before the wheel's time: due at once).
    pub fn insert(&mut self, due_ms: u64, item: T) {
        self.len += 1;
        self.place(due_ms, item);
    }

    fn place(&mut self, due: u64, item: T) {
        if due <= self.elapsed {
            // Keep `ready` in due order: late items go before later ones.
            let at = self.ready.partition_point(|(d, _)| *d <= due);
            self.ready.insert(at, (due, item));
        } else if (due ^ self.elapsed) >= SPAN_MS {
            // Beyond the levels: further than they reach, or across a boundary of the top
            // level (a wrap, however near). Such items are all later than every item in
            // the levels; they move in once the wheel's time reaches their top-level turn.
            self.overflow_min = Some(self.overflow_min.map_or(due, |m| m.min(due)));
            self.overflow.push((due, item));
        } else {
            let (level, slot) = level_and_slot(self.elapsed, due);
            let l = &mut self.levels[level];
            l.slots[slot].push((due, item));
            l.mins[slot] = l.mins[slot].min(due);
            l.occupied |= 1 << slot;
        }
    }

    /// Moves overflow items whose turn has come into the levels (or `ready`).
    fn admit_overflow(&mut self) {
        let turn = |t: u64| t / SPAN_MS;
        let Some(min) = self.overflow_min else { return };
        if turn(min) != turn(self.elapsed) && min > self.elapsed {
            return;
        }
        self.overflow_min = None;
        for (due, item) in std::mem::take(&mut self.overflow) {
            self.place(due, item);
        }
    }

    /// The earliest occupied slot: (level, slot, the time it starts).
    fn next_slot(&self) -> Option<(usize, usize, u64)> {
        for (level, l) in self.levels.iter().enumerate() {
            if l.occupied == 0 {
                continue;
            }
            let span = slot_span(level);
            let level_span = span * SLOTS as u64;
            let now_slot = ((self.elapsed / span) % SLOTS as u64) as u32;
            let slot =
                (l.occupied.rotate_right(now_slot).trailing_zeros() + now_slot) as usize % SLOTS;
            let level_start = self.elapsed - self.elapsed % level_span;
            let mut start = level_start + slot as u64 * span;
            if start + span <= self.elapsed {
                // The slot lies in the level's next turn.
                start += level_span;
            }
            return Some((level, slot, start.max(self.elapsed)));
        }
        None
    }

    /// When the wheel next has something to do: the earliest ready item, else the start of
    /// the earliest occupied slot (an item is due there, or items must move down a level),
    /// else the earliest overflow item.
    pub fn next_wake_ms(&self) -> Option<u64> {
        if let Some((due, _)) = self.ready.front() {
            return Some(*due);
        }
        match self.next_slot() {
            Some((_, _, start)) => Some(start),
            None => self.overflow_min,
        }
    }

    /// Moves the wheel's time forward to `now_ms` (never back: a clock that steps back
    /// waits) and takes up to `max` items due at or before `now_ms`, in due order, into
    /// `out`. Items left over stay ready for the next call.
    pub fn poll(&mut self, now_ms: u64, max: usize, out: &mut Vec<(u64, T)>) {
        let taken_before = out.len();
        loop {
            while out.len() - taken_before < max {
                match self.ready.front() {
                    Some((due, _)) if *due <= now_ms => {}
                    _ => break,
                }
                if let Some(item) = self.ready.pop_front() {
                    self.len -= 1;
                    out.push(item);
                }
            }
            if out.len() - taken_before >= max
                || self.ready.front().is_some_and(|(due, _)| *due > now_ms)
            {
                return;
            }
            match self.next_slot() {
                Some((level, slot, start)) if start <= now_ms => {
                    self.elapsed = self.elapsed.max(start);
                    let l = &mut self.levels[level];
                    l.occupied &= !(1 << slot);
                    l.mins[slot] = u64::MAX;
                    let items = std::mem::take(&mut l.slots[slot]);
                    for (due, item) in items {
                        self.place(due, item);
                    }
                }
                _ => {
                    // Nothing in the levels is due: the time moves on, and overflow items
                    // whose turn came move in.
                    self.elapsed = self.elapsed.max(now_ms);
                    self.admit_overflow();
                    let due_now = self.ready.front().is_some_and(|(d, _)| *d <= now_ms)
                        || self.next_slot().is_some_and(|s| s.2 <= now_ms);
                    if !due_now {
                        return;
                    }
                }
            }
        }
    }

    /// Keeps only the items `keep` says yes to, each where it was.
    pub fn retain(&mut self, mut keep: impl FnMut(u64, &T) -> bool) {
        self.ready.retain(|(d, t)| keep(*d, t));
        let mut len = self.ready.len();
        for level in &mut self.levels {
            for (i, slot) in level.slots.iter_mut().enumerate() {
                slot.retain(|(d, t)| keep(*d, t));
                if slot.is_empty() {
                    level.occupied &= !(1 << i);
                }
                level.mins[i] = slot.iter().map(|(d, _)| *d).min().unwrap_or(u64::MAX);
                len += slot.len();
            }
        }
        self.overflow.retain(|(d, t)| keep(*d, t));
        self.overflow_min = self.overflow.iter().map(|(d, _)| *d).min();
        self.len = len + self.overflow.len();
    }

    /// The earliest due time, and how many items are due at or before `now_ms` (those
    /// `skip` names not counted), without a walk of every item: the earliest comes from
    /// the ready list's head and each slot's earliest, the count from the items that are
    /// due (the ready list's, and those of the slots and overflow that hold any).
    pub fn due_summary(&self, now_ms: u64, skip: impl Fn(&T) -> bool) -> (Option<u64>, usize) {
        let slots_min = self.levels.iter().flat_map(|l| l.mins).min();
        let earliest = [
            self.ready.front().map(|(d, _)| *d),
            slots_min.filter(|&m| m != u64::MAX),
            self.overflow_min,
        ]
        .into_iter()
        .flatten()
        .min();
        let due = |items: &mut dyn Iterator<Item = &(u64, T)>| {
            items.filter(|(d, t)| *d <= now_ms && !skip(t)).count()
        };
        let ready_due = self.ready.partition_point(|(d, _)| *d <= now_ms);
        let mut count = due(&mut self.ready.range(..ready_due));
        for l in &self.levels {
            for (slot, items) in l.slots.iter().enumerate() {
                if l.mins[slot] <= now_ms {
                    count += due(&mut items.iter());
                }
            }
        }
        if self.overflow_min.is_some_and(|m| m <= now_ms) {
            count += due(&mut self.overflow.iter());
        }
        (earliest, count)
    }

    /// Every item with its due time, in no particular order (snapshots, statistics).
    pub fn iter(&self) -> impl Iterator<Item = (u64, &T)> + '_ {
        self.ready
            .iter()
            .chain(self.levels.iter().flat_map(|l| l.slots.iter().flatten()))
            .chain(self.overflow.iter())
            .map(|(d, t)| (*d, t))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Inserts `items` (due, id) and polls at `steps`, `max` at a time; checks against a
    /// sorted reference that nothing is lost, nothing comes out early or twice, and that
    /// items come out in due order.
    fn check(start: u64, items: &[(u64, u32)], steps: &[u64], max: usize) {
        let mut wheel = TimingWheel::new(start);
        for &(due, id) in items {
            wheel.insert(due, id);
        }
        assert_eq!(wheel.len(), items.len());
        let mut out = Vec::new();
        let mut now = start;
        let mut last_due = 0;
        for &step in steps {
            now += step;
            let before = out.len();
            wheel.poll(now, max, &mut out);
            assert!(out.len() - before <= max);
            for &(due, _) in &out[before..] {
                assert!(due <= now, "due {due} taken at {now}");
                assert!(due >= last_due, "out of order: {due} after {last_due}");
                last_due = due;
            }
            // Whatever is due and was not taken must be because of `max`.
            if out.len() - before < max {
                assert!(
                    wheel.iter().all(|(d, _)| d > now),
                    "left a due item at {now}"
                );
            }
        }
        // Drain everything.
        wheel.poll(u64::MAX - 1, usize::MAX, &mut out);
        let mut got: Vec<u32> = out.iter().map(|(_, id)| *id).collect();
        got.sort_unstable();
        let mut want: Vec<u32> = items.iter().map(|(_, id)| *id).collect();
        want.sort_unstable();
        assert_eq!(got, want);
        assert!(wheel.is_empty());
    }

    /// Items taken out by `retain` never come out; the rest come out in due order, from
    /// every part of the wheel (ready list, levels, overflow).
    #[test]
    fn retain_drops_only_what_it_is_told_to() {
        let mut w = TimingWheel::new(1_000);
        let items = [(500, 1u32), (1_000, 2), (1_001, 3), (5_000, 4), (70_000, 5)];
        let far = 1_000 + SPAN_MS + 7;
        for (due, id) in items.into_iter().chain([(far, 6), (far + 1, 7)]) {
            w.insert(due, id);
        }
        w.retain(|_, id| id % 2 == 1);
        assert_eq!(w.len(), 4);
        let mut out = Vec::new();
        w.poll(u64::MAX, usize::MAX, &mut out);
        assert_eq!(out, [(500, 1), (1_001, 3), (70_000, 5), (far + 1, 7)]);
        assert!(w.is_empty());
        assert_eq!(w.next_wake_ms(), None);
    }

    #[test]
    fn simple_cases() {
        check(1000, &[(1005, 1), (1001, 2), (999, 3)], &[1, 1, 10], 10);
        check(0, &[(5, 1); 0], &[5], 1);
        // Many at the same millisecond, taken a few at a time.
        let same: Vec<(u64, u32)> = (0..100).map(|i| (50, i)).collect();
        check(0, &same, &[50, 0, 0, 0], 7);
        // Far future (overflow) and across level boundaries.
        check(
            7,
            &[(SPAN_MS * 3, 1), (4096, 2), (4095, 3), (262_144 + 1, 4)],
            &[4088, 1, 300_000],
            10,
        );
    }

    #[test]
    fn near_a_top_level_boundary_nothing_panics_or_is_late() {
        // 2028-10-17 20:04:31 UTC is 27 * 2^36 ms.
        let boundary = 27u64 << 36;
        check(
            boundary - 1,
            &[
                (boundary + 100, 1),
                (boundary - 1 + 3_600_000, 2),
                (boundary - 1, 3),
            ],
            &[0, 100, 1, 3_600_000],
            10,
        );
    }

    #[test]
    fn a_clock_that_steps_back_delivers_nothing_early() {
        let now = 10_000_000u64;
        let mut wheel = TimingWheel::new(now);
        let mut out = Vec::new();
        wheel.poll(now, 10, &mut out);
        // The clock steps back an hour; a message due in 1 s by that clock waits for it.
        let back = now - 3_600_000;
        wheel.insert(back + 1_000, 1u8);
        wheel.poll(back, 10, &mut out);
        assert!(out.is_empty());
        wheel.poll(back + 1_000, 10, &mut out);
        assert_eq!(out.len(), 1);
    }

    #[test]
    fn next_wake_is_never_after_the_earliest_item() {
        let mut wheel = TimingWheel::new(100);
        assert_eq!(wheel.next_wake_ms(), None);
        wheel.insert(100 + 70_000, 1u8);
        let wake = wheel.next_wake_ms().unwrap();
        assert!(wake <= 170_000);
        wheel.insert(90, 2);
        assert_eq!(wheel.next_wake_ms(), Some(90));
    }

    proptest! {
        #[test]
        fn matches_a_sorted_reference(
            start in 0u64..1_000_000_000,
            offsets in proptest::collection::vec(0u64..5_000_000, 0..200),
            steps in proptest::collection::vec(0u64..400_000, 1..40),
            max in 1usize..50,
        ) {
            let items: Vec<(u64, u32)> = offsets
                .iter()
                .enumerate()
                .map(|(i, &o)| ((start + o).saturating_sub(1000), i as u32))
                .collect();
            check(start, &items, &steps, max);
        }

        #[test]
        fn matches_a_sorted_reference_across_top_level_boundaries(
            turn in 1u64..100,
            before in 0u64..5_000_000,
            offsets in proptest::collection::vec(0u64..10_000_000, 0..200),
            steps in proptest::collection::vec(0u64..400_000, 1..60),
            max in 1usize..50,
        ) {
            let start = (turn << 36) - before;
            let items: Vec<(u64, u32)> = offsets
                .iter()
                .enumerate()
                .map(|(i, &o)| (start + o, i as u32))
                .collect();
            check(start, &items, &steps, max);
        }

        /// `due_summary` says what a walk of every item says, whatever inserts, polls
        /// (some cut short by `max`) and retains came before, at times before and after
        /// the wheel's.
        #[test]
        fn the_due_summary_matches_a_walk_of_every_item(
            start in 0u64..1_000_000_000,
            ops in proptest::collection::vec((0u64..5_000_000, 0u64..400_000, 0usize..20, 0u8..8), 1..120),
        ) {
            let mut wheel = TimingWheel::new(start);
            let mut now = start;
            let mut out = Vec::new();
            let skip = |id: &u32| id.is_multiple_of(5);
            for (i, (delay, step, max, op)) in ops.into_iter().enumerate() {
                match op {
                    0 => wheel.retain(|_, id| id % 3 != 0),
                    1 => wheel.insert(now.saturating_sub(delay % 10_000), i as u32),
                    2 => wheel.insert(now + delay * 1_000_000, i as u32),
                    _ => wheel.insert(now + delay, i as u32),
                }
                now += step;
                if op != 4 {
                    wheel.poll(now, max, &mut out);
                }
                for at in [now.saturating_sub(step), now, now + step, now + 10 * step] {
                    let earliest = wheel.iter().map(|(d, _)| d).min();
                    let due = wheel.iter().filter(|(d, id)| *d <= at && !skip(id)).count();
                    prop_assert_eq!(wheel.due_summary(at, skip), (earliest, due));
                }
            }
        }

        #[test]
        fn inserts_between_polls_keep_the_rules(
            ops in proptest::collection::vec((0u64..100_000, 0u64..3_000), 1..150),
        ) {
            let mut wheel = TimingWheel::new(0);
            let mut now = 0u64;
            let mut out = Vec::new();
            let mut inserted = 0u32;
            let mut last_due = 0;
            for (delay, step) in ops {
                wheel.insert(now + delay, inserted);
                inserted += 1;
                now += step;
                let before = out.len();
                wheel.poll(now, usize::MAX, &mut out);
                for &(due, _) in &out[before..] {
                    prop_assert!(due <= now);
                    prop_assert!(due >= last_due);
                    last_due = due;
                }
                prop_assert!(wheel.iter().all(|(d, _)| d > now));
            }
            wheel.poll(u64::MAX - 1, usize::MAX, &mut out);
            prop_assert_eq!(out.len() as u32, inserted);
        }
    }
}
