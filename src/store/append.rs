//! The write side of a store: appends (a record into the log, its consume-queue entry and
//! its keys), and the waits for them to be acknowledged or durable.

use super::*;
use crate::index::{tag_hash, AllocAhead, MadeSpare, SpareFile, TAG_HASH_NONE};
use crate::protocol::record::{prop, RecordDraft};

/// Whose index file an [`AllocAhead`] stretch or a spare file is for.
enum AheadFor {
    Queue(String, u32),
    Keys,
}

/// What a consume queue asks to be done ahead of its appends, in the blocking pool.
enum QueueAhead {
    /// A stretch of its last file to allocate.
    Stretch(AllocAhead),
    /// A spare file for its next roll to make.
    Spare(SpareFile),
}

/// What `q` asks ahead after appends that went through (no allocation: an append's path).
fn queue_aheads(q: &mut QueueState) -> [Option<QueueAhead>; 2] {
    [
        q.cq.allocate_ahead().map(QueueAhead::Stretch),
        q.cq.spare_ahead().map(QueueAhead::Spare),
    ]
}

/// Removes spare files no index took, in the blocking pool, in the background.
pub(super) fn remove_spares(paths: Vec<PathBuf>) {
    crate::io::spawn(remove_spare_files(paths));
}

/// Removes spare files in the blocking pool (each has a name of its own, so nothing else
/// is at its path; one already gone is fine, one that cannot be removed is logged: the
/// index's next opening removes it).
pub(super) async fn remove_spare_files(paths: Vec<PathBuf>) {
    crate::io::blocking(move || {
        for path in paths {
            if let Err(e) = crate::index::remove_file(&path) {
                crate::warn!("ringmq: removing a spare index file: {e}");
            }
        }
    })
    .await;
}

impl MessageStore {
    /// Assigns the next queue offset, appends the record and indexes it. The record becomes
    /// readable once the log's write completes: await [`acked`](Self::acked).
    /// On an error nothing is stored (see [`append_batch`](Self::append_batch)).
    pub fn append(&self, draft: &RecordDraft<'_>) -> Result<PutResult, StoreError> {
        let store_timestamp_ms = self.before_append()?;
        validate_topic(draft.topic)?;
        let log_from = self.inner.log.write_offset();
        let mut queues = self.inner.queues.borrow_mut();
        let q = queue_state(
            &mut queues,
            &self.inner.opening.borrow(),
            &self.inner.inline_opens,
            &self.inner.dir,
            &self.inner.cfg,
            draft.topic,
            draft.queue_id,
        )?;
        let run = [(draft.topic, draft.queue_id, q.cq.max_offset())];
        let put = self.append_one(
            q,
            &mut self.inner.keys.borrow_mut(),
            draft,
            store_timestamp_ms,
        );
        // Nothing asked ahead after a failure (a full disk among them).
        let aheads = match put {
            Ok(_) => queue_aheads(q),
            Err(_) => [None, None],
        };
        drop(queues);
        if put.is_err() {
            self.take_back(log_from, &run);
        }
        for ahead in aheads.into_iter().flatten() {
            self.queue_ahead(draft.topic, draft.queue_id, ahead);
        }
        if put.is_ok() {
            self.keys_ahead();
        }
        put
    }

    /// Allocates the next stretch of an index file (a queue's, or the key index's) in the
    /// blocking pool, so that appends rarely allocate (an `fallocate` that may read block
    /// bitmaps from the disk) on the shard's thread, and tells the index how it went.
    fn allocate_ahead(&self, of: AheadFor, ahead: AllocAhead) {
        let weak = Rc::downgrade(&self.inner);
        crate::io::spawn(async move {
            let (ahead, allocated) = crate::io::blocking(move || {
                let allocated = ahead.allocate().is_ok();
                (ahead, allocated)
            })
            .await;
            let Some(inner) = weak.upgrade() else { return };
            match of {
                AheadFor::Queue(topic, queue_id) => {
                    let mut queues = inner.queues.borrow_mut();
                    if let Some(q) = queues.get_mut(&(topic, queue_id)) {
                        q.cq.allocated_ahead(&ahead, allocated);
                    }
                }
                AheadFor::Keys => inner.keys.borrow_mut().allocated_ahead(&ahead, allocated),
            }
        });
    }

    /// Does what a queue asked ahead in the blocking pool and hands the result back to it.
    fn queue_ahead(&self, topic: &str, queue_id: u32, ahead: QueueAhead) {
        match ahead {
            QueueAhead::Stretch(ahead) => {
                self.allocate_ahead(AheadFor::Queue(topic.to_owned(), queue_id), ahead)
            }
            QueueAhead::Spare(spare) => {
                self.make_spare(AheadFor::Queue(topic.to_owned(), queue_id), spare)
            }
        }
    }

    /// Makes a spare file (a queue's, or the key index's) in the blocking pool; one no
    /// index takes (the queue went, or was opened again meanwhile) is removed there.
    fn make_spare(&self, of: AheadFor, spare: SpareFile) {
        let weak = Rc::downgrade(&self.inner);
        crate::io::spawn(async move {
            let made: MadeSpare = crate::io::blocking(move || spare.make()).await;
            if let Some(e) = made.failure() {
                // The roll creates its file itself; no spare is asked again until then.
                crate::warn!("ringmq: making a spare index file: {e}");
            }
            let Some(inner) = weak.upgrade() else {
                remove_spares(vec![made.into_path()]);
                return;
            };
            let refused = match of {
                AheadFor::Queue(topic, queue_id) => {
                    match inner.queues.borrow_mut().get_mut(&(topic, queue_id)) {
                        Some(q) => q.cq.spares().made(made),
                        None => Some(made.into_path()),
                    }
                }
                AheadFor::Keys => inner.keys.borrow_mut().spares().made(made),
            };
            if let Some(path) = refused {
                remove_spares(vec![path]);
            }
        });
    }

    /// After appends that went through: the key index's next stretch and its next file,
    /// if it asks for them.
    pub(super) fn keys_ahead(&self) {
        let mut keys = self.inner.keys.borrow_mut();
        let (ahead, spare) = (keys.allocate_ahead(), keys.spare_ahead());
        drop(keys);
        if let Some(ahead) = ahead {
            self.allocate_ahead(AheadFor::Keys, ahead);
        }
        if let Some(spare) = spare {
            self.make_spare(AheadFor::Keys, spare);
        }
    }

    /// Appends `drafts` in order, as [`append`](Self::append) does each, pushing where each
    /// went onto `puts`. A run of drafts of one queue (a batch) shares one look-up of the
    /// queue, and all share one store timestamp. All or nothing: at the first error (an
    /// index that cannot grow on a full disk) the records appended before it are taken back
    /// (log, consume queues, keys) and none is in `puts`, so a send retried after the error
    /// stores no duplicates (rolls of the log in between are undone too). Only if they
    /// cannot be (a consume queue fails to shrink, which poisons the log: nothing more is
    /// appended until a restart) do they stay, in `puts`, the rest not appended.
    pub fn append_batch<'a>(
        &self,
        drafts: impl IntoIterator<Item = RecordDraft<'a>>,
        puts: &mut Vec<PutResult>,
    ) -> Result<(), StoreError> {
        let store_timestamp_ms = self.before_append()?;
        let (log_from, puts_from) = (self.inner.log.write_offset(), puts.len());
        // Where each run of one queue started: what a failure takes back.
        let mut runs: Vec<(&'a str, u32, u64)> = Vec::new();
        let mut aheads = Vec::new();
        let appended = self.append_runs(drafts, puts, store_timestamp_ms, &mut runs, &mut aheads);
        if appended.is_err() && self.take_back(log_from, &runs) {
            puts.truncate(puts_from);
        }
        // Only runs appended whole asked (not the one that failed); each stretch asked for
        // must be answered, or its queue would not ask again.
        for (topic, queue_id, ahead) in aheads {
            self.queue_ahead(topic, queue_id, ahead);
        }
        if appended.is_ok() {
            self.keys_ahead();
        }
        appended
    }

    /// [`append_batch`](Self::append_batch)'s appends, noting in `runs` where each run of
    /// one queue started, and in `aheads` the index stretches its queues ask for once each
    /// run is appended.
    fn append_runs<'a>(
        &self,
        drafts: impl IntoIterator<Item = RecordDraft<'a>>,
        puts: &mut Vec<PutResult>,
        store_timestamp_ms: i64,
        runs: &mut Vec<(&'a str, u32, u64)>,
        aheads: &mut Vec<(&'a str, u32, QueueAhead)>,
    ) -> Result<(), StoreError> {
        let mut ask_ahead = |run: Option<(&'a str, u32, &mut QueueState)>| {
            if let Some((topic, queue_id, q)) = run {
                let asked = queue_aheads(q).into_iter().flatten();
                aheads.extend(asked.map(|ahead| (topic, queue_id, ahead)));
            }
        };
        let mut queues = self.inner.queues.borrow_mut();
        let mut keys = self.inner.keys.borrow_mut();
        let mut current: Option<(&'a str, u32, &mut QueueState)> = None;
        for draft in drafts {
            let q = match current.take() {
                Some((topic, queue_id, q))
                    if topic == draft.topic && queue_id == draft.queue_id =>
                {
                    q
                }
                finished => {
                    ask_ahead(finished);
                    validate_topic(draft.topic)?;
                    let q = queue_state(
                        &mut queues,
                        &self.inner.opening.borrow(),
                        &self.inner.inline_opens,
                        &self.inner.dir,
                        &self.inner.cfg,
                        draft.topic,
                        draft.queue_id,
                    )?;
                    runs.push((draft.topic, draft.queue_id, q.cq.max_offset()));
                    q
                }
            };
            puts.push(self.append_one(q, &mut keys, &draft, store_timestamp_ms)?);
            current = Some((draft.topic, draft.queue_id, q));
        }
        ask_ahead(current);
        Ok(())
    }

    /// Takes back what appends made since the log's write offset was `log_from`, in the
    /// queues of `runs` (each from the queue offset it had): true when done, false when it
    /// cannot be (the log keeps the records; if a consume queue was changed by then, the
    /// log is poisoned).
    fn take_back(&self, log_from: u64, runs: &[(&str, u32, u64)]) -> bool {
        if self.inner.log.write_offset() == log_from {
            return true;
        }
        if !self.inner.log.can_take_back(log_from) {
            return false;
        }
        let mut queues = self.inner.queues.borrow_mut();
        for &(topic, queue_id, from) in runs.iter().rev() {
            if let Some(q) = queues.get_mut(&(topic.to_owned(), queue_id)) {
                if let Err(e) = q.cq.truncate_to(from) {
                    // Queues taken back (this one perhaps in part) while the log keeps the
                    // records: the next append would reuse their queue offsets. No more
                    // appends until a restart, whose recovery indexes the log again (the
                    // records, never acknowledged, come back: a duplicate, never a loss).
                    self.inner.log.poison(format!(
                        "taking back a failed append from {topic}:{queue_id}: {e}"
                    ));
                    return false;
                }
            }
        }
        self.inner.keys.borrow_mut().forget_from_physical(log_from);
        self.inner.log.take_back(log_from);
        true
    }

    /// The queue offset the next message of a queue will get, counting every append so far
    /// (written or not) once a cut of the log is caught up with; `None` for a queue not open
    /// here. A queue offset at or past it names no message, stored or on its way.
    pub fn queue_next_offset(&self, topic: &str, queue_id: u32) -> Result<Option<u64>, StoreError> {
        if self.inner.log.epoch() != self.inner.seen_epoch.get() {
            self.forget_cut()?;
        }
        let queues = self.inner.queues.borrow();
        Ok(queues
            .get(&(topic.to_owned(), queue_id))
            .map(|q| q.cq.max_offset()))
    }

    /// What every append checks first (free space, a cut of the log to catch up with);
    /// returns the store timestamp of what it appends.
    fn before_append(&self) -> Result<i64, StoreError> {
        if let Some(reason) = &*self.inner.space_low.borrow() {
            return Err(LogError::DiskFull {
                reason: format!("disk full: {reason}"),
            }
            .into());
        }
        if self.inner.log.epoch() != self.inner.seen_epoch.get() {
            self.forget_cut()?;
        }
        Ok(crate::log::now_ms())
    }

    /// One record into the log, its entry into its queue `q`, its keys into the key index.
    fn append_one(
        &self,
        q: &mut QueueState,
        keys: &mut KeyIndex,
        draft: &RecordDraft<'_>,
        store_timestamp_ms: i64,
    ) -> Result<PutResult, StoreError> {
        let props = crate::protocol::record::Properties::new(draft.properties);
        keys.reserve(key_count(props))?;
        let queue_offset = q.cq.max_offset();
        // Index space first: a full disk fails before the record is in the log.
        q.cq.reserve_next()?;
        let appended = self
            .inner
            .log
            .append_at(draft, queue_offset, store_timestamp_ms)?;
        let entry = CqEntry {
            physical_offset: appended.physical_offset,
            size: appended.size,
            tag_hash: cq_tag_slot(draft.topic, props),
        };
        q.cq.put(queue_offset, entry)?;
        index_keys(
            keys,
            draft.topic,
            props,
            appended.physical_offset,
            appended.store_timestamp_ms,
        )?;
        Ok(PutResult {
            queue_offset,
            physical_offset: appended.physical_offset,
            size: appended.size,
            store_timestamp_ms: appended.store_timestamp_ms,
            epoch: appended.epoch,
        })
    }

    /// The log was cut (a write found the disk full): index entries of the dropped records
    /// go before anything else is appended.
    fn forget_cut(&self) -> Result<(), StoreError> {
        let epoch = self.inner.log.epoch();
        if let Some(at) = self.inner.log.last_cut() {
            for q in self.inner.queues.borrow_mut().values_mut() {
                q.cq.truncate_after_log_end(at)?;
            }
            self.inner.keys.borrow_mut().forget_from_physical(at);
        }
        self.inner.seen_epoch.set(epoch);
        Ok(())
    }

    /// Waits until the records are acknowledged under the flush mode.
    pub async fn acked(&self, w: Written) -> Result<(), StoreError> {
        Ok(self.inner.log.wait_acked_since(w.end, w.epoch).await?)
    }

    /// Waits until an fdatasync covers the records.
    pub async fn durable(&self, w: Written) -> Result<(), StoreError> {
        Ok(self.inner.log.wait_durable_since(w.end, w.epoch).await?)
    }

    /// Waits until the records are durable, syncing the log for them now in async mode
    /// rather than at the flusher's next pass: for a record whose being durable lets a
    /// client let go of one that was (a message sent back for retry, whose offset its
    /// group then commits past).
    pub async fn made_durable(&self, w: Written) -> Result<(), StoreError> {
        self.acked(w).await?;
        self.inner.log.sync_to(w.end).await?;
        self.durable(w).await
    }

    /// Waits until an fdatasync covers everything below `end`, which is readable already.
    pub async fn durable_readable(&self, end: u64) -> Result<(), StoreError> {
        Ok(self.inner.log.wait_durable(end).await?)
    }

    /// Appends and waits for the acknowledgement.
    pub async fn put(&self, draft: &RecordDraft<'_>) -> Result<PutResult, StoreError> {
        let r = self.append(draft)?;
        self.acked(r.written()).await?;
        Ok(r)
    }
}

/// What a consume-queue entry carries besides the record's place: the tag hash, or, for the
/// schedule, the due time.
pub(super) fn cq_tag_slot(topic: &str, props: crate::protocol::record::Properties<'_>) -> u64 {
    if topic == SCHEDULE_TOPIC {
        return props
            .get(prop::TIMER_OUT_MS)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
    }
    props.get(prop::TAGS).map(tag_hash).unwrap_or(TAG_HASH_NONE)
}

pub(super) fn index_key(topic: &str, key: &str) -> String {
    format!("{topic}#{key}")
}

/// Keys a record adds to the key index.
fn key_count(props: crate::protocol::record::Properties<'_>) -> u32 {
    let keys = props
        .get(prop::KEYS)
        .map_or(0, |k| k.split(' ').filter(|k| !k.is_empty()).count());
    (keys + usize::from(props.get(prop::UNIQ_KEY).is_some())) as u32
}

pub(super) fn index_keys(
    keys: &mut KeyIndex,
    topic: &str,
    props: crate::protocol::record::Properties<'_>,
    physical_offset: u64,
    store_timestamp_ms: i64,
) -> Result<(), StoreError> {
    if let Some(k) = props.get(prop::KEYS) {
        for key in k.split(' ').filter(|k| !k.is_empty()) {
            keys.put(&index_key(topic, key), physical_offset, store_timestamp_ms)?;
        }
    }
    if let Some(u) = props.get(prop::UNIQ_KEY) {
        keys.put(&index_key(topic, u), physical_offset, store_timestamp_ms)?;
    }
    Ok(())
}
