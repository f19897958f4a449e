//! The read side of a store: queue entries, pulls (plan the consume-queue entries, fetch
//! the records with one log read, verify them), reads by physical offset, offsets by time
//! and lookups by key.

use super::*;

impl MessageStore {
    /// Up to `max` consume-queue entries of a queue from `from` (recovery scans of the
    /// broker's own queues), with their queue offsets.
    pub fn queue_entries(
        &self,
        topic: &str,
        queue_id: u32,
        from: u64,
        max: usize,
    ) -> Result<Vec<(u64, CqEntry)>, StoreError> {
        let (min, end) = self.queue_range(topic, queue_id)?;
        let queues = self.inner.queues.borrow();
        let Some(q) = queues.get(&(topic.to_owned(), queue_id)) else {
            return Ok(Vec::new());
        };
        let mut entries = Vec::new();
        for o in (from.max(min)..end).take(max) {
            if let Some(e) = q.cq.get(o)? {
                entries.push((o, e));
            }
        }
        Ok(entries)
    }

    /// The consume-queue entry at a queue offset, if the queue holds it.
    pub fn queue_entry(&self, topic: &str, queue_id: u32, offset: u64) -> Option<CqEntry> {
        self.entry(topic, queue_id, offset).ok()
    }

    /// Reads the message at a queue offset.
    pub async fn read_at(
        &self,
        topic: &str,
        queue_id: u32,
        offset: u64,
    ) -> Result<ReadBuf, StoreError> {
        let e = self.entry(topic, queue_id, offset)?;
        Ok(self
            .inner
            .log
            .read_record(e.physical_offset, e.size)
            .await?)
    }

    /// Reads the message at a physical offset (message by id).
    pub async fn read_physical(&self, physical_offset: u64) -> Result<ReadBuf, StoreError> {
        Ok(self.inner.log.read_record_at(physical_offset).await?)
    }

    /// Reads up to `max_messages` (and about `max_bytes`) records of a queue from `offset`,
    /// skipping records whose tag hash is not in `tag_hashes` (empty: all). Records that lie
    /// close together in the log are fetched with one read.
    pub async fn read_queue(
        &self,
        topic: &str,
        queue_id: u32,
        offset: u64,
        max_messages: u32,
        max_bytes: usize,
        tag_hashes: &[u64],
    ) -> Result<QueueRead, StoreError> {
        let plan =
            self.plan_queue_read(topic, queue_id, offset, max_messages, max_bytes, tag_hashes)?;
        self.fetch(plan).await
    }

    /// The first step of [`read_queue`](Self::read_queue): which records it takes, chosen
    /// from the consume queue alone (no log read), so a caller can reserve room for them
    /// before they are read.
    pub fn plan_queue_read(
        &self,
        topic: &str,
        queue_id: u32,
        offset: u64,
        max_messages: u32,
        max_bytes: usize,
        tag_hashes: &[u64],
    ) -> Result<QueuePlan, StoreError> {
        const SCAN_ENTRIES_MAX: u64 = 4096;
        let (min, max) = self.queue_range(topic, queue_id)?;
        if offset < min {
            return Err(StoreError::OffsetTooSmall {
                topic: topic.into(),
                queue_id,
                offset,
                min,
            });
        }
        if offset > max {
            return Err(StoreError::OffsetTooBig {
                topic: topic.into(),
                queue_id,
                offset,
                max,
            });
        }
        let mut picked: Vec<(u64, CqEntry)> = Vec::new();
        let mut next = offset;
        let mut bytes = 0usize;
        {
            let queues = self.inner.queues.borrow();
            if let Some(q) = queues.get(&(topic.to_owned(), queue_id)) {
                let scan_end = max.min(offset + SCAN_ENTRIES_MAX);
                while next < scan_end && picked.len() < max_messages as usize {
                    let Some(e) = q.cq.get(next)? else { break };
                    if picked.is_empty() || bytes + e.size as usize <= max_bytes {
                        if tag_hashes.is_empty() || tag_hashes.contains(&e.tag_hash) {
                            bytes += e.size as usize;
                            picked.push((next, e));
                        }
                        next += 1;
                    } else {
                        break;
                    }
                }
            }
        }
        Ok(QueuePlan {
            topic: topic.to_owned(),
            queue_id,
            picked,
            bytes,
            next_offset: next,
            min_offset: min,
            max_offset: max,
        })
    }

    /// The second step of [`read_queue`](Self::read_queue): reads the planned records (a
    /// run of entries is one read while the span stays within one segment and no more
    /// than twice the bytes it carries, plus slack) and checks each.
    pub async fn fetch(&self, plan: QueuePlan) -> Result<QueueRead, StoreError> {
        let QueuePlan {
            topic,
            queue_id,
            picked,
            next_offset: next,
            min_offset: min,
            max_offset: max,
            ..
        } = plan;
        let seg = self.inner.log.config().segment_bytes;
        let mut bufs = Vec::new();
        let mut slices = Vec::with_capacity(picked.len());
        let mut offsets = Vec::with_capacity(picked.len());
        let mut i = 0;
        while i < picked.len() {
            let start = picked[i].1.physical_offset;
            let mut end = start + picked[i].1.size as u64;
            let mut carried = picked[i].1.size as u64;
            // Records in the cache of the newest writes are shared from the buffer that
            // wrote them: a run stays within one such buffer.
            let cached_until = self.inner.log.cached_until(start);
            let mut j = i + 1;
            while j < picked.len() {
                let e = picked[j].1;
                let new_end = e.physical_offset + e.size as u64;
                let same_segment = e.physical_offset / seg == start / seg;
                let span = new_end - start;
                if !same_segment
                    || cached_until.is_some_and(|until| new_end > until)
                    || span > 2 * (carried + e.size as u64) + 64 * 1024
                    || span > 16 << 20
                {
                    break;
                }
                end = new_end;
                carried += e.size as u64;
                j += 1;
            }
            let buf = self.inner.log.read(start, (end - start) as usize).await?;
            let b = bufs.len() as u32;
            for &(qo, e) in &picked[i..j] {
                let s = (e.physical_offset - start) as usize;
                let bytes = &buf[s..s + e.size as usize];
                // The other end of the boundary: what comes off the disk is checked.
                // Structure, not CRC: the CRC was computed when the record was encoded and
                // the consumer verifies it on receipt (the other end of this boundary);
                // checking it here too would double the pull path's CRC work.
                let view = RecordView::parse_unchecked_crc(bytes).map_err(|err| {
                    self.inner
                        .log
                        .corrupt_at(e.physical_offset, err.to_string())
                })?;
                if view.physical_offset() != e.physical_offset || view.queue_offset() != qo {
                    return Err(StoreError::Log(self.inner.log.corrupt_at(
                        e.physical_offset,
                        format!(
                            "consume queue entry {topic}:{queue_id}:{qo} points at another record"
                        ),
                    )));
                }
                slices.push((b, s as u32, e.size));
                offsets.push(qo);
            }
            bufs.push(buf);
            i = j;
        }
        Ok(QueueRead {
            bufs,
            slices,
            offsets,
            next_offset: next,
            min_offset: min,
            max_offset: max,
        })
    }

    /// The first queue offset whose message was stored at or after `timestamp_ms` (the
    /// queue's max offset if none was).
    pub async fn offset_by_timestamp(
        &self,
        topic: &str,
        queue_id: u32,
        timestamp_ms: i64,
    ) -> Result<u64, StoreError> {
        let (min, max) = self.queue_range(topic, queue_id)?;
        let (mut lo, mut hi) = (min, max);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let e = self.entry(topic, queue_id, mid)?;
            let head = self.inner.log.read(e.physical_offset, HEADER_BYTES).await?;
            let ts = store_timestamp_of_header(&head);
            if ts < timestamp_ms {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        Ok(lo)
    }

    /// Messages of `topic` whose KEYS contain `key`, stored in [begin_ms, end_ms], newest
    /// first, at most `max`.
    pub async fn messages_by_key(
        &self,
        topic: &str,
        key: &str,
        begin_ms: i64,
        end_ms: i64,
        max: usize,
    ) -> Result<Vec<ReadBuf>, StoreError> {
        // Ask for more candidates than needed: hash collisions are filtered out below.
        let candidates = self.inner.keys.borrow().query(
            &index_key(topic, key),
            begin_ms,
            end_ms,
            max.saturating_mul(4).max(64),
        );
        let readable = self.inner.log.readable_end();
        let min = self.inner.log.min_offset();
        let mut out = Vec::new();
        for phys in candidates {
            if out.len() >= max {
                break;
            }
            if phys < min || phys >= readable {
                continue;
            }
            let buf = match self.inner.log.read_record_at(phys).await {
                Ok(b) => b,
                Err(LogError::OffsetTooSmall { .. }) | Err(LogError::OffsetTooBig { .. }) => {
                    continue
                }
                Err(e) => return Err(e.into()),
            };
            let view = RecordView::parse(&buf).map_err(LogError::from)?;
            let ts = view.store_timestamp_ms();
            let matches = view.topic() == topic
                && (view.keys().any(|k| k == key)
                    || view.properties().get(prop::UNIQ_KEY) == Some(key))
                && ts >= begin_ms
                && ts <= end_ms;
            if matches {
                out.push(buf);
            }
        }
        Ok(out)
    }
}
