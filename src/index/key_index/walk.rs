//! A lookup's walk down the key index's chains, a slice at a time: a key that many
//! messages share can have millions of entries newer than the time range asked for, and a
//! walk in one go held its shard for the whole of it (a store's lookup yields between
//! slices).

use std::collections::HashSet;

use super::{IndexFile, KeyHash, KeyIndex};

/// Where a lookup by key stands ([`KeyIndex::walk_start`], [`KeyIndex::walk`]).
pub struct KeyWalk {
    hash: KeyHash,
    begin_ms: i64,
    end_ms: i64,
    max: usize,
    seen: HashSet<u64>,
    out: Vec<u64>,
    /// The file (by its sequence number), the 1-based entry of it to look at next, and the
    /// file's count of cuts then; `None` before the first slice.
    at: Option<(u64, u32, u64)>,
    done: bool,
}

impl KeyWalk {
    /// Whether the walk has found all it will: `max` candidates, or every chain walked.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// The candidates found so far (physical offsets, newest first, deduplicated).
    pub fn into_found(self) -> Vec<u64> {
        self.out
    }
}

impl KeyIndex {
    /// A walk for the candidate physical offsets of messages with `key` stored in
    /// `[begin_ms, end_ms]`, newest first, deduplicated, at most `max`. Candidates match
    /// the key's hash: the caller verifies the real key by reading the message.
    pub fn walk_start(&self, key: &str, begin_ms: i64, end_ms: i64, max: usize) -> KeyWalk {
        KeyWalk {
            hash: KeyHash::of(key),
            begin_ms,
            end_ms,
            max,
            seen: HashSet::new(),
            out: Vec::new(),
            at: None,
            done: max == 0 || begin_ms > end_ms,
        }
    }

    /// Looks at up to `steps` more entries of `walk` (at least one); true once it is done.
    /// The files may change between slices: a file retention deleted ends the walk (the
    /// older ones went before it), and a file cut since (entries forgotten after a cut of
    /// the log) is walked again from its slot's head, which may add candidates put since
    /// (each is verified by reading its record).
    pub fn walk(&self, walk: &mut KeyWalk, steps: usize) -> bool {
        let mut steps = steps.max(1);
        for file in self.files.iter().rev() {
            if walk.done {
                break;
            }
            let resume = match walk.at {
                Some((seq, ..)) if file.seq > seq => continue,
                // A cut since the last slice: the place may be gone or hold another key's
                // entry (whose links lead down another chain), so the chain starts again
                // (the candidates seen are not pushed twice).
                Some((seq, index, cuts)) if file.seq == seq && file.cuts == cuts => Some(index),
                _ => None,
            };
            if file.entry_count() == 0
                || file.end_timestamp_ms() < walk.begin_ms
                || file.begin_timestamp_ms() > walk.end_ms
            {
                walk.at = Some((file.seq, 0, file.cuts));
                continue;
            }
            let from = resume.unwrap_or_else(|| file.live_head(file.slot_at(&walk.hash)));
            match file.collect(walk, from, &mut steps) {
                Some(next) => {
                    walk.at = Some((file.seq, next, file.cuts));
                    return false;
                }
                None => walk.at = Some((file.seq, 0, file.cuts)),
            }
        }
        walk.done = true;
        true
    }
}

impl IndexFile {
    /// Pushes onto `walk`'s candidates the physical offsets of its hash's entries stored in
    /// its time range, from the entry `index` down the chain, skipping those seen, until it
    /// holds `max`, or `steps` entries were looked at (`Some` of the entry to go on from).
    ///
    /// The walk stops at the first entry older than `begin_ms`: store timestamps are
    /// assigned at append by one shard's clock, so a chain's timestamps do not increase going
    /// back. (After a clock step backward, older entries beyond such a point are missed,
    /// as upstream.)
    fn collect(&self, walk: &mut KeyWalk, mut index: u32, steps: &mut usize) -> Option<u32> {
        let entry_count = self.entry_count();
        // Each step goes to a strictly smaller index, so the walk is bounded by entry_count
        // even on a corrupt chain.
        while index != 0 && index <= entry_count {
            if walk.out.len() >= walk.max {
                walk.done = true;
                return None;
            }
            if *steps == 0 {
                return Some(index);
            }
            *steps -= 1;
            let entry = self.entry(index);
            if entry.store_timestamp_ms < walk.begin_ms {
                break;
            }
            if entry.key_hash == walk.hash.stored
                && entry.store_timestamp_ms <= walk.end_ms
                && walk.seen.insert(entry.physical_offset)
            {
                walk.out.push(entry.physical_offset);
            }
            if entry.prev >= index {
                break;
            }
            index = entry.prev;
        }
        if walk.out.len() >= walk.max {
            walk.done = true;
        }
        None
    }
}
