//! A shard's unresolved half messages, counted per producer group (see the parent module).

use std::collections::{BTreeMap, HashMap};

/// One unresolved half message.
#[derive(Debug, Clone)]
pub struct Half {
    pub(super) topic: String,
    pub(super) queue_id: u32,
    /// Counted in [`PendingHalves`] by it: fixed once the half is listed.
    group: String,
    pub(super) msg_id: String,
    pub(super) stored_ms: u64,
    /// Checks its producers answered "unknown" (what `--transaction-check-max` counts): a
    /// check that no checker saw (dropped by a lagging client, or sent to a producer
    /// whose checker is gone) does not count, so a committed transaction is not
    /// discarded for checks it never heard.
    pub(super) checks: u32,
    /// A check was delivered since the last answer that counted: the next "unknown"
    /// answer counts (one per check delivered, however many a client sends).
    pub(super) awaiting_answer: bool,
    /// Checks tried, delivered or not: which of the group's producers the next one asks
    /// (one that could not take a check is not asked again and again).
    pub(super) attempts: u32,
    /// Not checked before this time (ms since the epoch).
    pub(super) next_check_ms: u64,
    /// Passes of retention in a row whose discard of it failed (`discard_halves_past_retention`).
    pub(super) discard_failures: u32,
}

impl Half {
    /// A half message not checked yet.
    pub(super) fn new(
        topic: String,
        queue_id: u32,
        group: String,
        msg_id: String,
        stored_ms: u64,
        next_check_ms: u64,
    ) -> Half {
        Half {
            topic,
            queue_id,
            group,
            msg_id,
            stored_ms,
            checks: 0,
            awaiting_answer: false,
            attempts: 0,
            next_check_ms,
            discard_failures: 0,
        }
    }

    /// The producer group the half message names.
    pub(super) fn group(&self) -> &str {
        &self.group
    }

    /// The id of its transaction, `half` being its offset in the halves' queue
    /// ([`super::transaction_id`]).
    pub(super) fn id(&self, half: u64) -> u64 {
        super::transaction_id(half, self.stored_ms)
    }
}

/// Unresolved half messages by their offset in the halves' queue, with how many each
/// producer group holds (so that one group cannot take a shard's whole allowance).
#[derive(Default)]
pub struct PendingHalves {
    halves: BTreeMap<u64, Half>,
    per_group: HashMap<String, usize>,
}

impl PendingHalves {
    pub(super) fn len(&self) -> usize {
        self.halves.len()
    }

    /// Unresolved half messages of `group`.
    pub(super) fn of_group(&self, group: &str) -> usize {
        self.per_group.get(group).copied().unwrap_or(0)
    }

    pub(super) fn get(&self, half: &u64) -> Option<&Half> {
        self.halves.get(half)
    }

    pub(super) fn get_mut(&mut self, half: &u64) -> Option<&mut Half> {
        self.halves.get_mut(half)
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (&u64, &Half)> {
        self.halves.iter()
    }

    /// Every half, from the first at `cursor` or past it on, then from the start up to it.
    pub(super) fn iter_from(&self, cursor: u64) -> impl Iterator<Item = (&u64, &Half)> {
        (self.halves.range(cursor..)).chain(self.halves.range(..cursor))
    }

    pub(super) fn keys(&self) -> impl Iterator<Item = &u64> {
        self.halves.keys()
    }

    pub(super) fn insert(&mut self, half: u64, h: Half) {
        *self.per_group.entry(h.group.clone()).or_default() += 1;
        if let Some(old) = self.halves.insert(half, h) {
            self.uncount(&old);
        }
    }

    pub(super) fn remove(&mut self, half: &u64) -> Option<Half> {
        let h = self.halves.remove(half)?;
        self.uncount(&h);
        Some(h)
    }

    /// Takes out the halves at `from` and past it.
    pub(super) fn split_off(&mut self, from: &u64) -> BTreeMap<u64, Half> {
        let cut = self.halves.split_off(from);
        for h in cut.values() {
            self.uncount(h);
        }
        cut
    }

    fn uncount(&mut self, h: &Half) {
        if let Some(n) = self.per_group.get_mut(&h.group) {
            *n -= 1;
            if *n == 0 {
                self.per_group.remove(&h.group);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn half(group: &str) -> Half {
        Half::new("t".into(), 0, group.into(), String::new(), 0, 0)
    }

    #[test]
    fn groups_are_counted_through_inserts_removals_and_cuts() {
        let mut p = PendingHalves::default();
        for (at, group) in [(1, "a"), (2, "a"), (3, "b"), (4, "a"), (5, "b")] {
            p.insert(at, half(group));
        }
        assert_eq!((p.len(), p.of_group("a"), p.of_group("b")), (5, 3, 2));
        // Listed again at the same offset (in another group): counted once, in its new one.
        p.insert(2, half("b"));
        assert_eq!((p.len(), p.of_group("a"), p.of_group("b")), (5, 2, 3));
        assert_eq!(p.remove(&1).map(|h| h.group), Some("a".to_owned()));
        assert!(p.remove(&1).is_none());
        assert_eq!((p.of_group("a"), p.of_group("b")), (1, 3));
        let cut = p.split_off(&4);
        assert_eq!(cut.keys().copied().collect::<Vec<_>>(), [4, 5]);
        assert_eq!((p.len(), p.of_group("a"), p.of_group("b")), (2, 0, 2));
        // A group with none left is forgotten.
        assert!(!p.per_group.contains_key("a"));
        p.remove(&2);
        p.remove(&3);
        assert!(p.per_group.is_empty() && p.len() == 0);
    }
}
