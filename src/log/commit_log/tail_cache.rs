//! The newest written bytes of the log, kept in memory so pulls near the tail never read
//! the file, and served without a copy.

use std::collections::VecDeque;

use crate::io::Written;

/// The newest written bytes of the log, as the buffers the writer wrote: each write's
/// buffer is moved in whole (not copied) and shared, by reference count, with the pull
/// answers that carry its records, so a record served from here is never copied on the
/// broker. A write may repeat the end of the one before (the partial last block, rewritten
/// with more after it); a write anywhere else starts over. Past the capacity the oldest
/// writes are dropped (their memory goes once no answer holds them).
#[derive(Default)]
pub(super) struct TailCache {
    /// (log offset, bytes) of each write kept, oldest first; starts and ends increase.
    writes: VecDeque<(u64, Written)>,
    /// Memory of the writes kept (their capacities).
    held: usize,
}

fn end_of((start, bytes): &(u64, Written)) -> u64 {
    start + bytes.len() as u64
}

impl TailCache {
    /// Forgets everything (the log was cut: cached bytes may be rewritten).
    pub(super) fn clear(&mut self) {
        self.writes.clear();
        self.held = 0;
    }

    /// Records that `bytes` were written at `start`, keeping the buffer itself.
    pub(super) fn push(&mut self, start: u64, bytes: Written, cap: usize) {
        if cap == 0 || bytes.is_empty() {
            return;
        }
        let end = start + bytes.len() as u64;
        if let Some(last) = self.writes.back() {
            if end <= end_of(last) && start >= last.0 {
                // Nothing new (a partial block written again as it was).
                return;
            }
            if start < last.0 || start > end_of(last) {
                self.clear();
            }
        }
        self.held += bytes.capacity();
        self.writes.push_back((start, bytes));
        while self.held > cap && self.writes.len() > 1 {
            if let Some((_, old)) = self.writes.pop_front() {
                self.held -= old.capacity();
            }
        }
    }

    /// The write that holds the byte at `offset`, if any: the newest one starting at or
    /// before it (starts and ends increase, so no other holds more after it).
    fn holding(&self, offset: u64) -> Option<usize> {
        let i = self
            .writes
            .partition_point(|(s, _)| *s <= offset)
            .checked_sub(1)?;
        (offset < end_of(&self.writes[i])).then_some(i)
    }

    /// The buffer holding all of `[offset, offset + len)` and where the range starts in it.
    pub(super) fn shared(&self, offset: u64, len: usize) -> Option<(Written, usize)> {
        let end = offset.checked_add(len as u64)?;
        let w = &self.writes[self.holding(offset)?];
        (end <= end_of(w)).then(|| (w.1.clone(), (offset - w.0) as usize))
    }

    /// Where the write holding `offset` ends: a read that stays below it is served from one
    /// buffer, without a copy.
    pub(super) fn write_end(&self, offset: u64) -> Option<u64> {
        Some(end_of(&self.writes[self.holding(offset)?]))
    }

    /// A copy of `[offset, offset + len)` gathered from the writes that follow each other
    /// across it; `None` unless all of it is here.
    pub(super) fn copy(&self, offset: u64, len: usize) -> Option<Vec<u8>> {
        let end = offset.checked_add(len as u64)?;
        let mut i = self.holding(offset)?;
        let mut out = Vec::with_capacity(len);
        let mut pos = offset;
        while pos < end {
            let w = self.writes.get(i)?;
            if pos < w.0 || pos >= end_of(w) {
                return None;
            }
            let upto = end.min(end_of(w));
            out.extend_from_slice(&w.1[(pos - w.0) as usize..(upto - w.0) as usize]);
            pos = upto;
            i += 1;
        }
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::TailCache;
    use crate::io::{WriteBuf, Written};

    /// `bytes` as the writer hands them over (at least one 4 KiB block of memory each).
    fn w(bytes: Vec<u8>) -> Written {
        WriteBuf::from_slice(&bytes, 0).into_written()
    }

    fn get(cache: &TailCache, offset: u64, len: usize) -> Option<Vec<u8>> {
        let one = cache
            .shared(offset, len)
            .map(|(b, at)| b[at..at + len].to_vec());
        let gathered = cache.copy(offset, len);
        if let Some(one) = &one {
            assert_eq!(
                Some(one),
                gathered.as_ref(),
                "one buffer or gathered: the same"
            );
        }
        gathered
    }

    /// Writes of `sizes` bytes one after another (byte i of the log is `i as u8`), each
    /// repeating up to `overlap` bytes of the one before; every range is then either served
    /// with the right bytes or missed, and the newest write is always served whole.
    fn check(cap: usize, sizes: &[usize], overlap: u64) {
        let mut cache = TailCache::default();
        let mut pos = 0u64;
        let mut largest = 0;
        for &n in sizes {
            let start = pos.saturating_sub(overlap);
            let bytes: Vec<u8> = (start..pos + n as u64).map(|i| i as u8).collect();
            let len = bytes.len();
            let bytes = w(bytes);
            largest = largest.max(bytes.capacity());
            cache.push(start, bytes, cap);
            pos += n as u64;
            if cap > 0 && len > 0 {
                assert!(
                    cache.shared(start, len).is_some(),
                    "the newest write is served from its buffer (cap {cap})"
                );
            }
        }
        for offset in 0..pos {
            for len in [1usize, 7, 64] {
                if let Some(got) = get(&cache, offset, len) {
                    let want: Vec<u8> = (offset..offset + len as u64).map(|i| i as u8).collect();
                    assert_eq!(got, want, "at {offset} len {len}");
                }
            }
        }
        assert!(get(&cache, pos, 1).is_none(), "nothing past the end");
        assert!(cache.held <= cap.max(largest), "{} bytes held", cache.held);
    }

    #[test]
    fn serves_recent_bytes_and_never_wrong_ones() {
        for overlap in [0, 3] {
            // Each write holds a 4 KiB block: caps in blocks.
            check(3 << 12, &[10; 100], overlap);
            check(3 << 12, &[100, 3, 200, 1, 57, 300, 5, 5000, 9000], overlap);
            check(1, &[4, 4, 4], overlap);
            check(10 << 12, &[10; 20], overlap);
            check(0, &[10; 3], overlap);
        }
    }

    #[test]
    fn a_repeated_partial_block_and_a_jump_are_handled() {
        let mut cache = TailCache::default();
        cache.push(0, w(vec![1, 2, 3, 4]), 1 << 16);
        // The partial last block is written again with more after it.
        cache.push(2, w(vec![3, 4, 5, 6]), 1 << 16);
        assert_eq!(cache.copy(0, 6), Some(vec![1, 2, 3, 4, 5, 6]));
        // Within one write: shared, not copied.
        let (buf, at) = cache.shared(3, 3).expect("in the second write");
        assert_eq!(&buf[at..at + 3], &[4, 5, 6]);
        assert!(cache.shared(1, 4).is_none(), "spans two writes");
        assert_eq!(cache.write_end(1), Some(4));
        assert_eq!(cache.write_end(4), Some(6));
        // A write elsewhere (a new segment after a gap) starts over.
        cache.push(100, w(vec![9, 9]), 1 << 16);
        assert_eq!(cache.copy(0, 1), None);
        assert_eq!(cache.copy(100, 2), Some(vec![9, 9]));
    }

    #[test]
    fn a_shared_buffer_outlives_its_eviction() {
        let mut cache = TailCache::default();
        cache.push(0, w(vec![7; 8]), 4096);
        let (held, _) = cache.shared(0, 8).expect("cached");
        cache.push(8, w(vec![8; 8]), 4096);
        assert!(cache.shared(0, 8).is_none(), "evicted");
        assert_eq!(
            &held[..],
            &[7; 8],
            "an answer still holding it keeps its bytes"
        );
    }
}
