//! What a store does on its own: checkpoints, retention, closing idle index files, the
//! free-space check, and the clean close.

use super::*;
use crate::index::DirtyFile;

impl MessageStore {
    /// Flushes the indexes and advances the checkpoint to the log's durable end. The index
    /// files written since the last checkpoint are fdatasynced off the shard's thread (an
    /// fdatasync writes back what was written through their mappings).
    pub async fn checkpoint(&self) -> Result<u64, StoreError> {
        let durable = self.inner.log.durable_end();
        // Every index entry of a record below `durable` is in a mapping by now (entries are
        // put when records are appended).
        let queues: Vec<((String, u32), Vec<DirtyFile>)> = self
            .inner
            .queues
            .borrow()
            .iter()
            .map(|(k, q)| (k.clone(), q.cq.dirty_files()))
            .filter(|(_, files)| !files.is_empty())
            .collect();
        let keys = self.inner.keys.borrow().dirty_files();
        let paths: Vec<(PathBuf, bool)> = queues
            .iter()
            .flat_map(|(_, files)| files.iter())
            .chain(&keys)
            .map(|f| (f.path.clone(), f.name_unsynced))
            .collect();
        if !paths.is_empty() {
            crate::io::blocking(move || -> std::io::Result<()> {
                for (path, name_unsynced) in paths {
                    match std::fs::File::open(&path) {
                        Ok(f) => f.sync_data()?,
                        // Deleted meanwhile (retention, a deleted topic): nothing to keep.
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                        Err(e) => return Err(e),
                    }
                    // A file made since the last sync: its name too (syncing its data
                    // need not carry a create or a rename), and its queue's in the topic's
                    // directory (a queue's first file comes with its directory). Rare: a
                    // queue's first file, then one every 300,000 entries.
                    if !name_unsynced {
                        continue;
                    }
                    for dir in path.ancestors().skip(1).take(2) {
                        match std::fs::File::open(dir) {
                            Ok(d) => d.sync_all()?,
                            // Deleted meanwhile, as above.
                            Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                            Err(e) => return Err(e),
                        }
                    }
                }
                Ok(())
            })
            .await?;
        }
        {
            let mut all = self.inner.queues.borrow_mut();
            for (key, files) in &queues {
                if let Some(q) = all.get_mut(key) {
                    q.cq.files_synced(files);
                }
            }
        }
        self.inner.keys.borrow_mut().files_synced(&keys);
        let cp = Checkpoint {
            log_offset: durable,
            timestamp_ms: crate::log::now_ms(),
        };
        let dir = self.inner.dir.clone();
        crate::io::blocking(move || cp.write(&dir)).await?;
        Ok(durable)
    }

    /// Keeps every record at or after this log offset from retention (records the broker
    /// still needs, such as scheduled messages not yet delivered); `u64::MAX`: no floor.
    pub fn set_retention_floor(&self, log_offset: u64) {
        self.inner.retention_floor.set(log_offset);
    }

    /// Lowers the retention floor to `log_offset` if it is above it.
    pub fn lower_retention_floor(&self, log_offset: u64) {
        let floor = self.inner.retention_floor.get();
        self.inner.retention_floor.set(floor.min(log_offset));
    }

    /// Runs retention on the log and trims the indexes to match. Work is proportional to
    /// what expired: nothing happens to the indexes when the log kept all its segments, a
    /// queue whose oldest entry is kept is skipped without reading it, and index files are
    /// removed off the shard's thread.
    pub async fn apply_retention(&self, now_ms: i64) -> Result<u64, StoreError> {
        let floor = self.inner.retention_floor.get();
        let min = self.inner.log.apply_retention(now_ms, floor).await;
        if min == self.inner.trimmed_to.get() {
            return Ok(min);
        }
        let mut doomed = Vec::new();
        let mut failed = None;
        for q in self.inner.queues.borrow_mut().values_mut() {
            // A queue that fails is trimmed next time; the files given up so far still go.
            if let Err(e) = q.cq.trim_before_physical(min, &mut doomed) {
                failed.get_or_insert(e);
            }
        }
        let keys = self.inner.keys.borrow_mut().delete_before_physical(min);
        if !doomed.is_empty() {
            crate::io::blocking(move || {
                for path in doomed {
                    if let Err(e) = std::fs::remove_file(&path) {
                        if e.kind() != std::io::ErrorKind::NotFound {
                            crate::warn!(
                                "ringmq: retention could not delete {}: {e}",
                                path.display()
                            );
                        }
                    }
                }
            })
            .await;
        }
        keys?;
        if let Some(e) = failed {
            return Err(e.into());
        }
        self.inner.trimmed_to.set(min);
        Ok(min)
    }

    /// Unmaps the consume-queue files not used since the last call (a walk over the queues
    /// in memory; no file is read). Returns how many were closed. The spare files of queues
    /// gone idle are removed in the blocking pool.
    pub fn close_idle_index_files(&self) -> usize {
        let mut doomed = Vec::new();
        let closed = self
            .inner
            .queues
            .borrow_mut()
            .values_mut()
            .map(|q| q.cq.close_idle(&mut doomed))
            .sum();
        if !doomed.is_empty() {
            super::append::remove_spares(doomed);
        }
        closed
    }

    /// Consume-queue files mapped now.
    pub fn mapped_index_files(&self) -> usize {
        self.inner
            .queues
            .borrow()
            .values()
            .map(|q| q.cq.mapped_files())
            .sum()
    }

    /// Clean shutdown: write and sync everything, flush the indexes, write the checkpoint
    /// at the end of the log, remove the spare index files held and the abort marker.
    pub async fn close(&self) -> Result<(), StoreError> {
        self.inner.stopped.set(true);
        self.inner.log.close().await?;
        let end = self.checkpoint().await?;
        debug_assert_eq!(end, self.inner.log.write_offset());
        let mut spares = Vec::new();
        self.each_index_spares(|s| spares.extend(s.give_up()));
        super::append::remove_spare_files(spares).await;
        let abort = self.inner.dir.join("abort");
        std::fs::remove_file(&abort).map_err(|e| io_err("remove", &abort, e))?;
        Ok(())
    }

    pub(super) fn spawn_housekeeping(&self) {
        let ms = |v: u64| Duration::from_millis(v.max(10));
        let cfg = &self.inner.cfg;
        self.spawn_periodic(ms(cfg.checkpoint_interval_ms), false, |store| async move {
            if let Err(e) = store.checkpoint().await {
                crate::warn!("ringmq: checkpoint failed: {e}");
            }
        });
        self.spawn_periodic(DISK_CHECK_INTERVAL, true, |store| async move {
            store.check_disk_space().await;
        });
        self.spawn_periodic(ms(cfg.index_idle_close_ms), false, |store| async move {
            store.close_idle_index_files();
        });
        self.spawn_periodic(
            ms(cfg.retention_check_interval_ms),
            false,
            |store| async move {
                if let Err(e) = store.apply_retention(crate::log::now_ms()).await {
                    crate::warn!("ringmq: retention failed: {e}");
                }
            },
        );
    }

    /// Runs `job` every `every` (first at once when `now`) until the store stops or is
    /// dropped.
    fn spawn_periodic<F, Fut>(&self, every: Duration, now: bool, job: F)
    where
        F: Fn(MessageStore) -> Fut + 'static,
        Fut: std::future::Future<Output = ()> + 'static,
    {
        let weak = Rc::downgrade(&self.inner);
        crate::io::spawn(async move {
            if !now {
                crate::io::sleep(every).await;
            }
            loop {
                let Some(inner) = weak.upgrade() else { return };
                if inner.stopped.get() {
                    return;
                }
                job(MessageStore { inner }).await;
                crate::io::sleep(every).await;
            }
        });
    }
}
