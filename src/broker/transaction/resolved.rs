//! The outcomes of a shard's latest resolved transactions, remembered to answer an outcome
//! told again (a producer repeating its commit after a timeout, a checker's late answer).

use std::collections::{HashMap, VecDeque};

use super::RESOLVED_REMEMBERED;

/// Outcomes by half offset, with the half's time bits (`None`: not known, for outcomes read
/// at start). At most `max` are kept; past it the one resolved first is forgotten, whatever
/// its offset: a half resolved late (discarded after its checks, committed by a checker)
/// has a low offset, and forgetting the lowest first forgot it as soon as it was resolved.
pub struct Resolved {
    /// Outcome, time bits, and the stamp of its place in `order`.
    outcomes: HashMap<u64, (u8, Option<u16>, u64)>,
    /// (half, stamp) in the order they were resolved; an entry whose stamp is not its
    /// half's in `outcomes` was removed since (or resolved again, later in the line).
    order: VecDeque<(u64, u64)>,
    stamp: u64,
    max: usize,
}

impl Default for Resolved {
    fn default() -> Resolved {
        Resolved::with_max(RESOLVED_REMEMBERED)
    }
}

impl Resolved {
    pub(super) fn with_max(max: usize) -> Resolved {
        Resolved {
            outcomes: HashMap::new(),
            order: VecDeque::new(),
            stamp: 0,
            max: max.max(1),
        }
    }

    pub(super) fn get(&self, half: &u64) -> Option<(u8, Option<u16>)> {
        self.outcomes.get(half).map(|&(o, b, _)| (o, b))
    }

    /// Remembers `half`'s outcome; one remembered already keeps its place in the line.
    pub(super) fn insert(&mut self, half: u64, outcome: u8, bits: Option<u16>) {
        if let Some(known) = self.outcomes.get_mut(&half) {
            (known.0, known.1) = (outcome, bits);
            return;
        }
        self.stamp += 1;
        self.outcomes.insert(half, (outcome, bits, self.stamp));
        self.order.push_back((half, self.stamp));
        while self.outcomes.len() > self.max {
            let Some((first, stamp)) = self.order.pop_front() else {
                break;
            };
            if self.outcomes.get(&first).is_some_and(|k| k.2 == stamp) {
                self.outcomes.remove(&first);
            }
        }
        // Removals leave their places behind: the line is swept once it holds as many
        // again as are remembered.
        if self.order.len() > 2 * self.max {
            let outcomes = &self.outcomes;
            (self.order).retain(|(h, s)| outcomes.get(h).is_some_and(|k| k.2 == *s));
        }
    }

    pub(super) fn remove(&mut self, half: &u64) {
        self.outcomes.remove(half);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.outcomes.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_resolved_is_forgotten_first_whatever_its_offset() {
        let mut r = Resolved::with_max(3);
        for half in [10, 11, 12] {
            r.insert(half, 1, Some(7));
        }
        // A half resolved late (low offset) is kept; the first resolved goes.
        r.insert(5, 2, Some(9));
        assert_eq!(r.get(&5), Some((2, Some(9))));
        assert_eq!(r.get(&10), None);
        assert_eq!(
            (r.get(&11), r.get(&12)),
            (Some((1, Some(7))), Some((1, Some(7))))
        );
        assert_eq!(r.len(), 3);
        // Told again: the outcome changes, not its place.
        r.insert(11, 3, None);
        r.insert(20, 1, None);
        assert_eq!(r.get(&11), None);
        assert_eq!(r.get(&12), Some((1, Some(7))));
    }

    #[test]
    fn removed_ones_neither_count_nor_take_a_later_resolutions_place() {
        let mut r = Resolved::with_max(2);
        r.insert(1, 1, None);
        r.remove(&1);
        r.insert(2, 1, None);
        // Resolved again after its removal: its place is the new one, not the first.
        r.insert(1, 2, None);
        r.insert(3, 1, None);
        assert_eq!(
            (r.get(&1), r.get(&2), r.get(&3)),
            (Some((2, None)), None, Some((1, None)))
        );
        // Many resolve-and-remove rounds (none past the bound) leave the line bounded.
        let mut r = Resolved::with_max(4);
        r.insert(1, 1, None);
        r.insert(2, 2, None);
        for h in 100..1_000 {
            r.insert(h, 1, None);
            r.remove(&h);
        }
        assert!(r.order.len() <= 8, "{} places kept", r.order.len());
        assert_eq!((r.get(&1), r.get(&2)), (Some((1, None)), Some((2, None))));
    }
}
