//! Retention: sealed segments deleted past the age or size limit, oldest first, never past
//! what a caller holds back.

use super::*;
use std::time::Instant;

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
            // While the active segment has no file yet (made at the first append into it,
            // or at open when it could be), the newest sealed one stays: the log's files
            // must reach its end, or the next start refuses them as missing.
            let active_made = (st.segments.get(&active)).is_some_and(|s| s.file.is_some());
            let newest_kept = if active_made {
                active
            } else {
                active.saturating_sub(seg)
            };
            st.segments
                .values()
                .filter(|s| s.base < newest_kept && s.base + seg <= readable)
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
        let mut open = Vec::new();
        {
            let seg = self.inner.cfg.segment_bytes;
            let mut st = self.inner.st.borrow_mut();
            for (base, path, _) in aged.into_iter().take(cut) {
                // Still there (nothing else deletes segments, but stay safe).
                if let Some(removed) = st.segments.remove(&base) {
                    open.extend(removed.file);
                    st.min_offset = st.min_offset.max(base + seg);
                    doomed.push(path);
                    self.inner
                        .stats
                        .segments_deleted
                        .set(self.inner.stats.segments_deleted.get() + 1);
                }
            }
        }
        let deadline = Instant::now() + CLOSE_WAIT;
        for file in open {
            close_before_unlink(file, deadline).await;
        }
        if !doomed.is_empty() {
            // Oldest first, stopping at one that cannot be deleted: a later one deleted
            // past it would leave a gap a start refuses. It and those after it are tried
            // again by the next pass (a start finds them contiguous meanwhile). The
            // directory is synced after each removal, so a crash cannot keep an older
            // segment whose younger neighbour's removal reached the disk first.
            let mut left = crate::io::blocking(move || {
                for i in 0..doomed.len() {
                    // Gone already (an earlier try removed it and failed to sync): synced.
                    let removed = match std::fs::remove_file(&doomed[i]) {
                        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(("delete", e)),
                        _ => crate::io::sync_parent(&doomed[i])
                            .map_err(|e| ("sync the removal of", e)),
                    };
                    if let Err((what, e)) = removed {
                        crate::warn!(
                            "ringmq: retention could not {what} {} (tried again at its next pass, with the {} after it): {e}",
                            doomed[i].display(),
                            doomed.len() - i - 1
                        );
                        return doomed.split_off(i);
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

/// How long a retention pass waits for the last other holders of its deleted segments'
/// files (reads in flight, the list of files to sync) before it unlinks them anyway. (Long
/// in unit tests, which hold a file on purpose while a loaded machine may stall them.)
const CLOSE_WAIT: Duration = Duration::from_secs(if cfg!(test) { 60 } else { 2 });

/// Closes a segment's file before retention unlinks it. The last close of a file with no
/// name left frees its blocks, work for the filesystem that must not run on the shard's
/// thread: closed first, the file is freed by the unlink, off the shard's thread. Other
/// holders are waited for until `deadline`; past it, the last of them closes it.
async fn close_before_unlink(mut file: Rc<LogFile>, deadline: Instant) {
    loop {
        match Rc::try_unwrap(file) {
            // A failed close of a file about to be deleted loses nothing.
            Ok(f) => return drop(f.close().await),
            Err(shared) if Instant::now() < deadline => {
                file = shared;
                crate::io::sleep(Duration::from_millis(5)).await;
            }
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::record::RecordDraft;

    #[test]
    fn a_deleted_segment_held_by_a_reader_is_unlinked_once_closed() {
        crate::io::run_local(|| async {
            let dir = tempfile::tempdir().unwrap();
            let cfg = LogConfig {
                segment_bytes: 16 * 1024,
                flush: FlushMode::Async,
                flush_interval_ms: 20,
                retention_bytes_max: 32 * 1024,
                ..LogConfig::default()
            };
            let (log, _) = CommitLog::open(dir.path(), cfg, 0, |_| {}).await.unwrap();
            let body = [7u8; 1000];
            let mut end = 0;
            for n in 0..100 {
                end = log
                    .append(&RecordDraft::plain("t", 0, &[], &body), n)
                    .unwrap()
                    .end();
            }
            log.wait_acked(end).await.unwrap();
            let first = dir.path().join(segment_name(0));
            assert!(first.exists());
            // A read in flight holds the first segment's file.
            let (reader, _) = log.file_for(0, 100).unwrap();
            let pass = {
                let log = log.clone();
                crate::io::spawn_joinable(
                    async move { log.apply_retention(now_ms(), u64::MAX).await },
                )
            };
            let deadline = Instant::now() + Duration::from_secs(10);
            while log.min_offset() == 0 {
                assert!(Instant::now() < deadline, "retention deleted nothing");
                crate::io::sleep(Duration::from_millis(5)).await;
            }
            crate::io::sleep(Duration::from_millis(100)).await;
            assert!(first.exists(), "unlinked while a reader still had it open");
            drop(reader);
            let min = pass.await.unwrap();
            assert!(min > 0);
            assert!(!first.exists(), "the segment was not deleted once closed");
            assert!(!dir.path().join(segment_name(min - 16 * 1024)).exists());
            assert!(dir.path().join(segment_name(min)).exists());
        });
    }
}
