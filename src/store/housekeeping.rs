//! What a store does on its own: checkpoints, retention, closing idle index files, the
//! free-space check, and the clean close.

use super::*;
use crate::index::DirtyFile;

/// What keeps records from retention ([`MessageStore::set_retention_floor`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Holder {
    /// Delayed messages not yet delivered, and the done records a recovery reads.
    Schedule,
    /// Half messages not yet resolved.
    Transactions,
}

impl Holder {
    pub(super) const COUNT: usize = 2;
    pub const ALL: [Holder; Holder::COUNT] = [Holder::Schedule, Holder::Transactions];
}

impl MessageStore {
    /// Flushes the indexes and advances the checkpoint to the log's durable end. The index
    /// files written since the last checkpoint are fdatasynced off the shard's thread (an
    /// fdatasync writes back what was written through their mappings).
    pub async fn checkpoint(&self) -> Result<u64, StoreError> {
        let _turn = self.inner.checkpointing.lock().await;
        if let Some(reason) = self.inner.index_sync_failed.borrow().clone() {
            return Err(StoreError::CheckpointHeld {
                checkpoint: self.inner.checkpointed.get(),
                reason,
            });
        }
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
        // What an unclean start keeps of the key index (see `KeyIndex::open_after_crash`):
        // those entries are in the mappings synced below, and never written again.
        let keys_synced = self.inner.keys.borrow().entries_below(durable);
        let (queues, keys, gone) = if queues.is_empty() && keys.is_empty() {
            (queues, keys, Vec::new())
        } else {
            // Each file named (a spare a roll took), fdatasynced, and its directory synced
            // for a new name. One gone meanwhile is left out.
            let done = crate::io::blocking(move || -> std::io::Result<_> {
                let (mut queues, mut gone) = (queues, Vec::new());
                for (key, files) in &mut queues {
                    let (kept, lost) = synced(std::mem::take(files))?;
                    *files = kept;
                    gone.extend(lost.into_iter().map(|f| (Some(key.clone()), f)));
                }
                let (keys, lost) = synced(keys)?;
                gone.extend(lost.into_iter().map(|f| (None, f)));
                Ok((queues, keys, gone))
            })
            .await;
            match done {
                Ok(synced) => synced,
                Err(e) => {
                    // Linux marks the pages of a failed writeback clean: a sync again would
                    // succeed without them, and a checkpoint past them would keep a restart
                    // from indexing their records again. (A file that could not be opened
                    // or linked is synced by the next checkpoint.)
                    if crate::index::is_writeback_failure(&e) {
                        *self.inner.index_sync_failed.borrow_mut() = Some(e.to_string());
                    }
                    return Err(StoreError::Io(e));
                }
            }
        };
        let mut unlinked = Vec::new();
        {
            let mut all = self.inner.queues.borrow_mut();
            for (key, files) in &queues {
                if let Some(q) = all.get_mut(key) {
                    unlinked.extend(q.cq.files_synced(files));
                }
            }
        }
        unlinked.extend(self.inner.keys.borrow_mut().files_synced(&keys));
        // Gone by the index's own doing (retention, a deleted topic, a cut) is nothing to
        // keep. A spare gone while the index still writes to it (removed from outside) is
        // lost with what was indexed in it: the checkpoint stays where it is, so that a
        // restart indexes those records again from the log.
        let lost = gone.iter().find(|(queue, f)| match queue {
            Some(key) => {
                (self.inner.queues.borrow().get(key)).is_some_and(|q| q.cq.still_unnamed(f))
            }
            None => self.inner.keys.borrow().still_unnamed(f),
        });
        let lost = lost.map(|(_, f)| {
            StoreError::Index(crate::index::IndexError::Io {
                op: "link",
                path: f.path.clone(),
                source: std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "an index file vanished before it was named; the checkpoint stays behind \
                     it, and a restart indexes its records again from the log",
                ),
            })
        });
        let cp = lost.is_none().then(|| Checkpoint {
            log_offset: durable,
            timestamp_ms: crate::log::now_ms(),
            keys: keys_synced,
        });
        let dir = self.inner.dir.clone();
        crate::io::blocking(move || {
            // The spares' names of files now linked at their numbered names, whatever
            // else happens (each would keep its file's blocks once the numbered name goes;
            // a crash before this leaves them for the index's next open to remove).
            for path in unlinked {
                if let Err(e) = crate::index::remove_file(&path) {
                    crate::warn!("ringmq: removing a spare's name: {e}");
                }
            }
            cp.map_or(Ok(()), |cp| cp.write(&dir))
        })
        .await?;
        if let Some(e) = lost {
            return Err(e);
        }
        self.inner.checkpointed.set(durable);
        Ok(durable)
    }

    /// Keeps every record at or after this log offset from retention, for `holder`
    /// (records the broker still needs, such as scheduled messages not yet delivered or
    /// half messages not yet resolved); `u64::MAX`: it holds nothing back. Each holder's
    /// floor is its own; retention stops at the lowest.
    pub fn set_retention_floor(&self, holder: Holder, log_offset: u64) {
        self.inner.retention_floors[holder as usize].set(log_offset);
    }

    /// Lowers `holder`'s retention floor to `log_offset` if it is above it.
    pub fn lower_retention_floor(&self, holder: Holder, log_offset: u64) {
        let floor = &self.inner.retention_floors[holder as usize];
        floor.set(floor.get().min(log_offset));
    }

    /// The lowest retention floor of all holders.
    pub fn retention_floor(&self) -> u64 {
        (self.inner.retention_floors.iter())
            .map(std::cell::Cell::get)
            .min()
            .unwrap_or(u64::MAX)
    }

    /// Runs retention on the log and trims the indexes to match. Work is proportional to
    /// what expired: nothing happens to the indexes when the log kept all its segments, a
    /// queue whose oldest entry is kept is skipped without reading it, and index files are
    /// removed off the shard's thread.
    ///
    /// Nothing at or after the checkpoint on disk is deleted: a recovery after a crash
    /// replays the log from there, and the index entries of records it cannot read again
    /// would be a hole in their queues that refuses the start. A pass that would delete
    /// past it syncs the log to where it would delete and writes a checkpoint first; one
    /// that fails holds retention back (sends are then refused once free space runs below
    /// the floor), and is returned.
    pub async fn apply_retention(&self, now_ms: i64) -> Result<u64, StoreError> {
        let floor = self.retention_floor();
        let mut held_by = None;
        if self.inner.checkpointed.get() < floor {
            let wanted = self.inner.log.retention_wanted_end(now_ms).await;
            if wanted > self.inner.checkpointed.get() {
                // A checkpoint goes as far as the log is durable (async mode: what the
                // flusher synced): synced to what retention wants first.
                held_by = match self.inner.log.sync_to(wanted).await {
                    Ok(()) => self.checkpoint().await.err(),
                    Err(e) => Some(e.into()),
                };
            }
        }
        // The floor read again: a held message appended while the pass waited (for the
        // sync, for the checkpoint) lowered it, and the checkpoint may have moved past it.
        let keep_from = self.retention_floor().min(self.inner.checkpointed.get());
        let min = (self.inner.log).apply_retention(now_ms, keep_from).await;
        self.inner.retention_held.set(held_by.is_some());
        let held_by = held_by.map(|e| StoreError::RetentionHeld {
            checkpoint: self.inner.checkpointed.get(),
            reason: e.to_string(),
        });
        if min == self.inner.trimmed_to.get() {
            return held_by.map_or(Ok(min), Err);
        }
        let mut doomed = Vec::new();
        let mut failed = None;
        for q in self.inner.queues.borrow_mut().values_mut() {
            // A queue that fails is trimmed next time; the files given up so far still go.
            if let Err(e) = q.cq.trim_before_physical(min, &mut doomed) {
                failed.get_or_insert(e);
            }
        }
        self.inner
            .keys
            .borrow_mut()
            .trim_before_physical(min, &mut doomed);
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
        if let Some(e) = failed {
            return Err(e.into());
        }
        self.inner.trimmed_to.set(min);
        held_by.map_or(Ok(min), Err)
    }

    /// Whether the last retention pass stopped at the checkpoint on disk because the
    /// checkpoint it wrote first failed (`ringmq_retention_held`).
    pub fn retention_held(&self) -> bool {
        self.inner.retention_held.get()
    }

    /// Whether an index file's fdatasync failed in this run, holding the checkpoint (and
    /// retention) where it was until a restart ([`StoreError::CheckpointHeld`],
    /// `ringmq_checkpoint_held`).
    pub fn checkpoint_held(&self) -> bool {
        self.inner.index_sync_failed.borrow().is_some()
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

/// Syncs `files` of one index, oldest first ([`DirtyFile::sync`]): those made durable, and
/// those gone. Past a spare gone before its name was made, no later spare of the index is
/// named (a crash would leave a gap below it): they count as gone too.
fn synced(files: Vec<DirtyFile>) -> std::io::Result<(Vec<DirtyFile>, Vec<DirtyFile>)> {
    let (mut kept, mut gone) = (Vec::with_capacity(files.len()), Vec::new());
    let mut unnamed_gone = false;
    for f in files {
        if !(unnamed_gone && f.link_to.is_some()) && f.sync()? {
            kept.push(f);
        } else {
            unnamed_gone |= f.link_to.is_some();
            gone.push(f);
        }
    }
    Ok((kept, gone))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::record::RecordDraft;

    fn draft(body: &[u8]) -> RecordDraft<'_> {
        RecordDraft::plain("t", 0, &[], body)
    }

    /// A message held (a delayed or half message lowering its holder's floor) while a
    /// retention pass waits for its checkpoint is kept, though the checkpoint moved past
    /// its segment: the pass read the floor before it waited, and deleted the segment of a
    /// message whose send was acknowledged.
    #[test]
    fn a_message_held_while_a_retention_pass_waits_for_its_checkpoint_is_kept() {
        crate::io::run_local(|| async {
            let dir = tempfile::tempdir().unwrap();
            let mut cfg = crate::store::StoreConfig::default();
            cfg.log.segment_bytes = 256 << 10;
            cfg.log.retention_bytes_max = 512 << 10;
            let (store, _) = MessageStore::open(dir.path(), cfg).await.unwrap();
            let body = vec![7u8; 3000];
            let fill = |store: &MessageStore| {
                let store = store.clone();
                let body = body.clone();
                async move {
                    for _ in 0..400 {
                        store.put(&draft(&body)).await.unwrap();
                    }
                    let log = store.log();
                    log.sync_to(log.write_offset()).await.unwrap();
                }
            };
            fill(&store).await;
            // The pass waits for the checkpoint, which another holds.
            let turn = store.inner.checkpointing.lock().await;
            let pass = crate::io::spawn_joinable({
                let store = store.clone();
                async move { store.apply_retention(crate::log::now_ms()).await }
            });
            // (A window for the pass to reach the checkpoint: it syncs nothing new first.)
            crate::io::sleep(Duration::from_millis(50)).await;
            let held = store.put(&draft(b"held")).await.unwrap().physical_offset;
            store.lower_retention_floor(Holder::Schedule, held);
            fill(&store).await;
            drop(turn);
            pass.await.unwrap().unwrap();
            assert!(
                store.log().min_offset() <= held,
                "{}",
                store.log().min_offset()
            );
            let record = store.log().read_record_at(held).await.unwrap();
            let view = crate::protocol::record::RecordView::parse(&record).unwrap();
            assert_eq!(view.body(), b"held");
            store.close().await.unwrap();
        });
    }
}
