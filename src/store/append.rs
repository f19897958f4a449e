//! The write side of a store: appends (a record into the log, its consume-queue entry and
//! its keys), and the waits for them to be acknowledged or durable.

use super::*;
use crate::index::{tag_hash, TAG_HASH_NONE};
use crate::protocol::record::{prop, RecordDraft};

impl MessageStore {
    /// Assigns the next queue offset, appends the record and indexes it. The record becomes
    /// readable once the log's write completes: await [`acked`](Self::acked).
    pub fn append(&self, draft: &RecordDraft<'_>) -> Result<PutResult, StoreError> {
        let mut put = None;
        self.append_each(std::slice::from_ref(draft), |p| put = Some(p))?;
        put.ok_or_else(|| StoreError::Recovery("an append stored nothing".into()))
    }

    /// Appends `drafts` in order, as [`append`](Self::append) does each, pushing where each
    /// went onto `puts`. A run of drafts of one queue (a batch) shares one look-up of the
    /// queue and one store timestamp. Stops at the first error: the drafts before it are
    /// stored (and in `puts`), the rest are not.
    pub fn append_batch(
        &self,
        drafts: &[RecordDraft<'_>],
        puts: &mut Vec<PutResult>,
    ) -> Result<(), StoreError> {
        puts.reserve(drafts.len());
        self.append_each(drafts, |p| puts.push(p))
    }

    fn append_each(
        &self,
        drafts: &[RecordDraft<'_>],
        mut each: impl FnMut(PutResult),
    ) -> Result<(), StoreError> {
        let Some(first) = drafts.first() else {
            return Ok(());
        };
        if let Some(reason) = &*self.inner.space_low.borrow() {
            return Err(LogError::DiskFull {
                reason: reason.clone(),
            }
            .into());
        }
        if self.inner.log.epoch() != self.inner.seen_epoch.get() {
            self.forget_cut()?;
        }
        let store_timestamp_ms = crate::log::now_ms();
        let mut queues = self.inner.queues.borrow_mut();
        let mut keys = self.inner.keys.borrow_mut();
        let mut key = (String::new(), first.queue_id);
        let mut q: Option<&mut QueueState> = None;
        for draft in drafts {
            if q.is_none() || key.0 != draft.topic || key.1 != draft.queue_id {
                validate_topic(draft.topic)?;
                key = (draft.topic.to_owned(), draft.queue_id);
                q = None;
                if !queues.contains_key(&key) {
                    let qdir = queue_dir(
                        &self.inner.dir.join("consumequeue"),
                        draft.topic,
                        draft.queue_id,
                    );
                    let cq = ConsumeQueue::open(&qdir, self.inner.cfg.consume_queue)?;
                    queues.insert(key.clone(), QueueState { cq });
                }
            }
            let props = crate::protocol::record::Properties::new(draft.properties);
            keys.reserve(key_count(props))?;
            let state = match q.take() {
                Some(state) => state,
                None => queues
                    .get_mut(&key)
                    .ok_or_else(|| StoreError::Recovery("queue vanished".into()))?,
            };
            let queue_offset = state.cq.max_offset();
            // Index space first: a full disk fails before the record is in the log.
            state.cq.reserve_next()?;
            let appended = self
                .inner
                .log
                .append_at(draft, queue_offset, store_timestamp_ms)?;
            let entry = CqEntry {
                physical_offset: appended.physical_offset,
                size: appended.size,
                tag_hash: cq_tag_slot(draft.topic, props),
            };
            state.cq.put(queue_offset, entry)?;
            index_keys(
                &mut keys,
                draft.topic,
                props,
                appended.physical_offset,
                appended.store_timestamp_ms,
            )?;
            each(PutResult {
                queue_offset,
                physical_offset: appended.physical_offset,
                size: appended.size,
                store_timestamp_ms: appended.store_timestamp_ms,
                epoch: appended.epoch,
            });
            q = Some(state);
        }
        Ok(())
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
