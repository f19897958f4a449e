//! Retention: sealed segments deleted past the age or size limit, oldest first, never past
//! what a caller holds back.

use super::*;

impl CommitLog {
    /// The sealed segments (never the active one, nor one still being written), oldest
    /// first, with the age of their newest data in ms: the file times are read off the
    /// shard's thread.
    async fn sealed_segment_ages(&self, now_ms: i64) -> Vec<(u64, PathBuf, i64)> {
        let seg = self.inner.cfg.segment_bytes;
        let candidates: Vec<(u64, PathBuf)> = {
            let st = self.inner.st.borrow();
            let active = st.active_base;
            let readable = self.readable_end();
            st.segments
                .values()
                .filter(|s| s.base < active && s.base + seg <= readable)
                .map(|s| (s.base, s.path.clone()))
                .collect()
        };
        crate::io::blocking(move || {
            candidates
                .into_iter()
                .map(|(base, path)| {
                    let age_ms = std::fs::metadata(&path)
                        .and_then(|m| m.modified())
                        .ok()
                        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                        .map(|d| now_ms - d.as_millis() as i64)
                        .unwrap_or(0);
                    (base, path, age_ms)
                })
                .collect()
        })
        .await
    }

    /// How many of `aged` (oldest first) retention deletes: those past the age limit or
    /// beyond the size limit, stopping at the first that holds `keep_from` or later.
    fn retention_cut(&self, aged: &[(u64, PathBuf, i64)], keep_from: u64) -> usize {
        let cfg = &self.inner.cfg;
        let (write_pos, min) = {
            let st = self.inner.st.borrow();
            (st.write_pos, st.min_offset)
        };
        let mut remaining_bytes = write_pos - min;
        let mut cut = 0;
        for (base, _, age_ms) in aged {
            let too_big = cfg.retention_bytes_max > 0 && remaining_bytes > cfg.retention_bytes_max;
            // A retention past i64 milliseconds is "never" (the broker refuses one that
            // long; a log opened on its own must not read it as negative).
            let too_old = *age_ms > i64::try_from(cfg.retention_ms).unwrap_or(i64::MAX);
            if !(too_big || too_old) || base + cfg.segment_bytes > keep_from {
                break;
            }
            remaining_bytes = remaining_bytes.saturating_sub(cfg.segment_bytes);
            cut += 1;
        }
        cut
    }

    /// The log offset below which retention would delete now if nothing held it back (the
    /// log's minimum when it would delete nothing).
    pub async fn retention_wanted_end(&self, now_ms: i64) -> u64 {
        let aged = self.sealed_segment_ages(now_ms).await;
        match self.retention_cut(&aged, u64::MAX) {
            0 => self.min_offset(),
            n => aged[n - 1].0 + self.inner.cfg.segment_bytes,
        }
    }

    /// Deletes segments older than the retention age, or beyond the size limit, oldest
    /// first; never the active one. File times are read and files deleted off the shard's
    /// thread; readers of a deleted range get `OffsetTooSmall` at once. Returns the new
    /// minimum offset. `keep_from`: a log offset whose segment (and every later one) must
    /// stay, whatever its age or the size limit (`u64::MAX`: none).
    pub async fn apply_retention(&self, now_ms: i64, keep_from: u64) -> u64 {
        let aged = self.sealed_segment_ages(now_ms).await;
        let cut = self.retention_cut(&aged, keep_from);
        // Segments an earlier pass could not delete go first, oldest first.
        let mut doomed = std::mem::take(&mut self.inner.st.borrow_mut().undeleted);
        {
            let seg = self.inner.cfg.segment_bytes;
            let mut st = self.inner.st.borrow_mut();
            for (base, path, _) in aged.into_iter().take(cut) {
                // Still there (nothing else deletes segments, but stay safe).
                if st.segments.remove(&base).is_some() {
                    st.min_offset = st.min_offset.max(base + seg);
                    doomed.push(path);
                    self.inner
                        .stats
                        .segments_deleted
                        .set(self.inner.stats.segments_deleted.get() + 1);
                }
            }
        }
        if !doomed.is_empty() {
            // Oldest first, stopping at one that cannot be deleted: a later one deleted
            // past it would leave a gap a start refuses. It and those after it are tried
            // again by the next pass (a start finds them contiguous meanwhile).
            let mut left = crate::io::blocking(move || {
                for i in 0..doomed.len() {
                    match std::fs::remove_file(&doomed[i]) {
                        Ok(()) => {}
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                        Err(e) => {
                            crate::warn!(
                                "ringmq: retention could not delete {} (tried again at its next pass, with the {} after it): {e}",
                                doomed[i].display(),
                                doomed.len() - i - 1
                            );
                            return doomed.split_off(i);
                        }
                    }
                }
                Vec::new()
            })
            .await;
            let mut st = self.inner.st.borrow_mut();
            left.append(&mut st.undeleted);
            st.undeleted = left;
        }
        self.min_offset()
    }
}
