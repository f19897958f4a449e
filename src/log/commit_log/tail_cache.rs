//! The newest written bytes of the log, kept in memory so pulls near the tail never read
//! the file.

/// The newest written bytes of the log, in two contiguous halves of up to half the cache
/// each: `newer` takes the writes; when it is full it becomes `older` and the old `older`
/// buffer (its memory kept) starts again as `newer`. Every written byte is copied in once,
/// never moved (a single buffer that dropped its oldest half moved half the cache each
/// time). A read spanning the two halves misses and goes to the file.
#[derive(Default)]
pub(super) struct TailCache {
    older: CacheHalf,
    newer: CacheHalf,
}

#[derive(Default)]
pub(super) struct CacheHalf {
    base: u64,
    bytes: Vec<u8>,
}

impl CacheHalf {
    fn end(&self) -> u64 {
        self.base + self.bytes.len() as u64
    }

    pub(super) fn get(&self, offset: u64, len: usize) -> Option<&[u8]> {
        let from = usize::try_from(offset.checked_sub(self.base)?).ok()?;
        self.bytes.get(from..from.checked_add(len)?)
    }
}

impl TailCache {
    /// Forgets everything (the log was cut: cached bytes may be rewritten).
    pub(super) fn clear(&mut self) {
        self.older.bytes.clear();
        self.newer.bytes.clear();
    }

    /// Records that `bytes` were written at `start`. Writes follow each other (a write may
    /// repeat the end of the one before, the partial block); anything else starts over.
    pub(super) fn extend(&mut self, start: u64, bytes: &[u8], cap: usize) {
        if cap == 0 {
            return;
        }
        let low = if self.older.bytes.is_empty() {
            self.newer.base
        } else {
            self.older.base
        };
        let cached = !self.older.bytes.is_empty() || !self.newer.bytes.is_empty();
        let contiguous = cached && start >= low && start <= self.newer.end();
        if !contiguous {
            self.older.bytes.clear();
            self.newer.bytes.clear();
            self.newer.base = start;
        }
        let end = start + bytes.len() as u64;
        let have_end = self.newer.end();
        if end > have_end {
            self.newer
                .bytes
                .extend_from_slice(&bytes[(have_end - start) as usize..]);
        }
        if self.newer.bytes.len() >= (cap / 2).max(1) {
            std::mem::swap(&mut self.older, &mut self.newer);
            self.newer.bytes.clear();
            self.newer.base = self.older.end();
        }
    }

    pub(super) fn get(&self, offset: u64, len: usize) -> Option<&[u8]> {
        if offset >= self.newer.base {
            self.newer.get(offset, len)
        } else {
            self.older.get(offset, len)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::TailCache;

    /// Writes of `sizes` bytes one after another (byte i of the log is `i as u8`); every
    /// range is then either served with the right bytes or missed, and the newest bytes
    /// are always served.
    fn check(cap: usize, sizes: &[usize]) {
        let mut cache = TailCache::default();
        let mut pos = 0u64;
        for &n in sizes {
            let bytes: Vec<u8> = (pos..pos + n as u64).map(|i| i as u8).collect();
            cache.extend(pos, &bytes, cap);
            pos += n as u64;
            let newest = n.min(cap / 2).max(1).min(n);
            if newest > 0 {
                let got = cache.get(pos - newest as u64, newest);
                assert!(
                    got.is_some(),
                    "the newest {newest} bytes are cached (cap {cap})"
                );
            }
        }
        for offset in 0..pos {
            for len in [1usize, 7, 64] {
                if let Some(got) = cache.get(offset, len) {
                    let want: Vec<u8> = (offset..offset + len as u64).map(|i| i as u8).collect();
                    assert_eq!(got, &want[..], "at {offset} len {len}");
                }
            }
        }
        assert!(cache.get(pos, 1).is_none(), "nothing past the end");
        let held = cache.older.bytes.len() + cache.newer.bytes.len();
        assert!(
            held <= cap + sizes.iter().max().copied().unwrap_or(0),
            "{held} bytes held"
        );
    }

    #[test]
    fn serves_recent_bytes_and_never_wrong_ones() {
        check(256, &[10; 100]);
        check(256, &[100, 3, 200, 1, 57, 300, 5]);
        check(1, &[4, 4, 4]);
        check(1000, &[10; 20]);
    }

    #[test]
    fn a_repeated_partial_block_and_a_jump_are_handled() {
        let mut cache = TailCache::default();
        cache.extend(0, &[1, 2, 3, 4], 64);
        // The partial last block is written again with more after it.
        cache.extend(2, &[3, 4, 5, 6], 64);
        assert_eq!(cache.get(0, 6), Some(&[1, 2, 3, 4, 5, 6][..]));
        // A write elsewhere (a new segment after a gap) starts over.
        cache.extend(100, &[9, 9], 64);
        assert_eq!(cache.get(0, 1), None);
        assert_eq!(cache.get(100, 2), Some(&[9, 9][..]));
    }
}
