//! The read side of a store: queue entries, pulls (plan the consume-queue entries, fetch
//! the records with one log read, verify them), reads by physical offset, offsets by time
//! and lookups by key.

use super::append::index_key;
use super::*;
use crate::io::ReadBuf;
use crate::protocol::record::{prop, RecordView, HEADER_BYTES, RECORD_BYTES_MAX};

/// How much a lookup by key answers, and whether only records their queue's index names.
struct KeyLookup {
    max: usize,
    max_bytes: usize,
    indexed_only: bool,
}

/// Entries of the key index a lookup looks at before it lets its shard's other tasks run
/// (each a read of the mapped file: well under a millisecond for a slice in memory).
const KEY_WALK_SLICE: usize = 1 << 14;

/// The records a queue read will take (see [`MessageStore::plan_queue_read`]).
pub struct QueuePlan {
    topic: String,
    queue_id: u32,
    picked: Vec<(u64, CqEntry)>,
    bytes: usize,
    /// The queue offset to read next.
    pub next_offset: u64,
    pub min_offset: u64,
    pub max_offset: u64,
}

impl QueuePlan {
    pub fn len(&self) -> usize {
        self.picked.len()
    }
    pub fn is_empty(&self) -> bool {
        self.picked.is_empty()
    }
    /// Bytes of the records it takes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

/// Records read for one pull: a few large reads, and the byte ranges of the records in them.
pub struct QueueRead {
    bufs: Vec<ReadBuf>,
    /// (buffer index, start, length) of each record, in queue order.
    slices: Vec<(u32, u32, u32)>,
    /// Queue offset of each record.
    offsets: Vec<u64>,
    /// The queue offset to read next.
    pub next_offset: u64,
    pub min_offset: u64,
    pub max_offset: u64,
}

impl QueueRead {
    pub fn len(&self) -> usize {
        self.slices.len()
    }
    pub fn is_empty(&self) -> bool {
        self.slices.is_empty()
    }
    pub fn bytes_len(&self) -> usize {
        self.slices.iter().map(|s| s.2 as usize).sum()
    }
    /// The stored bytes of each record, exactly as in the log.
    pub fn records(&self) -> impl Iterator<Item = &[u8]> + '_ {
        self.slices
            .iter()
            .map(|&(b, s, l)| &self.bufs[b as usize][s as usize..(s + l) as usize])
    }
    pub fn queue_offsets(&self) -> &[u64] {
        &self.offsets
    }
    /// Bytes of the records that share the buffers of the log's cache of its newest writes
    /// (read without a copy).
    pub fn shared_bytes(&self) -> usize {
        self.slices
            .iter()
            .filter(|s| matches!(self.bufs[s.0 as usize], ReadBuf::Shared { .. }))
            .map(|s| s.2 as usize)
            .sum()
    }
    /// Bytes of the cache buffers this read shares beyond its records' own bytes (each
    /// buffer counted once): what an answer carrying it holds in memory past its size.
    pub fn pinned_beyond(&self) -> usize {
        let mut last: Option<&crate::io::Written> = None;
        let mut held = 0;
        for b in &self.bufs {
            if let ReadBuf::Shared { bytes, .. } = b {
                // A read's records are in log order: buffers repeat only next to each other.
                if !last.is_some_and(|l| l.same(bytes)) {
                    held += bytes.capacity();
                    last = Some(bytes);
                }
            }
        }
        held.saturating_sub(self.shared_bytes())
    }
    /// Bytes of memory the read's buffers hold beyond its records' own bytes: the cache
    /// buffers it shares (each counted once), the bytes of other records a read took in
    /// passing (other queues' records between this queue's), a disk read's alignment (a
    /// block at each end at most). What an answer carrying it holds past its size.
    pub fn held_beyond(&self) -> usize {
        let mut held = self.pinned_beyond() + self.shared_bytes();
        for b in &self.bufs {
            held += match b {
                ReadBuf::Shared { .. } => 0,
                ReadBuf::Plain(v) => v.capacity(),
                ReadBuf::Dma(r) => crate::io::align_up(r.len()) + crate::io::IO_ALIGN,
            };
        }
        held.saturating_sub(self.bytes_len())
    }
    /// Copies the records into one buffer of their own size, so the read holds no other
    /// bytes ([`Self::held_beyond`] is 0 after it).
    pub fn compact(&mut self) {
        let mut out = Vec::with_capacity(self.bytes_len());
        let mut slices = Vec::with_capacity(self.slices.len());
        for r in self.records() {
            slices.push((0u32, out.len() as u32, r.len() as u32));
            out.extend_from_slice(r);
        }
        self.bufs = vec![ReadBuf::Plain(out)];
        self.slices = slices;
    }
    /// Keeps only the records `keep` says yes to (a filter evaluated over the bytes in
    /// place), in order. `keep` may stop the check (`None`): that record and those after
    /// it go unchecked, and the read ends before them (`next_offset` is the first of them),
    /// so the next read starts there.
    pub fn retain_checked(&mut self, mut keep: impl FnMut(&[u8]) -> Option<bool>) {
        let mut kept: Vec<bool> = Vec::with_capacity(self.len());
        for r in self.records() {
            match keep(r) {
                Some(k) => kept.push(k),
                None => break,
            }
        }
        debug_assert!(
            !kept.is_empty() || self.is_empty(),
            "a check that stops before the first record moves no read on"
        );
        if let Some(&first) = self.offsets.get(kept.len()) {
            self.next_offset = first;
            self.slices.truncate(kept.len());
            self.offsets.truncate(kept.len());
        }
        let mut i = 0;
        self.slices.retain(|_| {
            i += 1;
            kept[i - 1]
        });
        let mut i = 0;
        self.offsets.retain(|_| {
            i += 1;
            kept[i - 1]
        });
    }
    /// The records' bytes in order as runs: records that follow each other in one read
    /// buffer come as one run (what a vectored write sends, from where the store read it).
    pub fn runs(&self) -> Runs<'_> {
        Runs { read: self, at: 0 }
    }
}

/// The runs of [`QueueRead::runs`].
pub struct Runs<'a> {
    read: &'a QueueRead,
    at: usize,
}

impl<'a> Iterator for Runs<'a> {
    type Item = &'a [u8];
    fn next(&mut self) -> Option<&'a [u8]> {
        let slices = &self.read.slices;
        let &(buf, start, len) = slices.get(self.at)?;
        let mut end = start + len;
        self.at += 1;
        while let Some(&(b, s, l)) = slices.get(self.at) {
            if b != buf || s != end {
                break;
            }
            end += l;
            self.at += 1;
        }
        Some(&self.read.bufs[buf as usize][start as usize..end as usize])
    }
}

/// Whether `entry`'s size is one a record may have.
fn size_of_a_record(entry: &CqEntry) -> bool {
    (HEADER_BYTES..=RECORD_BYTES_MAX).contains(&(entry.size as usize))
}

/// Whether the bytes read for a consume-queue entry are the record it names, checked as
/// they come off the disk: their structure (not the CRC: it was computed when the record
/// was encoded and the consumer verifies it on receipt, the other end of this boundary;
/// checking it here too would double the pull path's CRC work), their place in the log and
/// the queue, and their length (an entry longer than its record would send the next
/// record's first bytes with it). What is wrong, if not.
fn record_of_entry(
    bytes: &[u8],
    topic: &str,
    queue_id: u32,
    queue_offset: u64,
    entry: &CqEntry,
) -> Result<(), String> {
    let view = RecordView::parse_unchecked_crc(bytes).map_err(|e| e.to_string())?;
    if view.physical_offset() != entry.physical_offset
        || view.queue_offset() != queue_offset
        || view.queue_id() != queue_id
        || view.topic() != topic
    {
        return Err("its consume-queue entry points at another record".into());
    }
    if view.total_len() != entry.size {
        return Err(format!(
            "its consume-queue entry says {} bytes, the record has {}",
            entry.size,
            view.total_len()
        ));
    }
    Ok(())
}

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

    /// The queue offsets, from the queue's start, whose records begin before the log offset
    /// `physical` (retention wants the log below it gone): a search of the index, as a
    /// queue's entries increase in log offset. Empty for an unknown queue. Fails when the
    /// index cannot be read.
    pub fn queue_offsets_before(
        &self,
        topic: &str,
        queue_id: u32,
        physical: u64,
    ) -> Result<std::ops::Range<u64>, StoreError> {
        let queues = self.inner.queues.borrow();
        let Some(q) = queues.get(&(topic.to_owned(), queue_id)) else {
            return Ok(0..0);
        };
        let start = self.kept_min(&q.cq)?;
        Ok(start..q.cq.first_at_or_past(physical)?.max(start))
    }

    /// The consume-queue entry at a queue offset, `None` if the queue does not hold it
    /// (outside its range, or a slot a cut send left empty). Fails when the index cannot
    /// be read (a file that cannot be mapped): a caller holding records from retention by
    /// it must hold, not take the failure for an absence.
    pub fn queue_entry(
        &self,
        topic: &str,
        queue_id: u32,
        offset: u64,
    ) -> Result<Option<CqEntry>, StoreError> {
        match self.entry(topic, queue_id, offset) {
            Ok(e) => Ok(Some(e)),
            Err(StoreError::OffsetTooSmall { .. } | StoreError::OffsetTooBig { .. }) => Ok(None),
            Err(e) => Err(e),
        }
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

    /// Reads the record at a physical offset the store itself knows a record starts at (for
    /// a message id, which a client chooses, see [`read_message_at`](Self::read_message_at)).
    pub async fn read_physical(&self, physical_offset: u64) -> Result<ReadBuf, StoreError> {
        Ok(self.inner.log.read_record_at(physical_offset).await?)
    }

    /// Reads the message stored at a physical offset (a message id's): a record there that
    /// its queue's index names. The bytes of a record can also lie inside another record's
    /// body (a client chooses its bodies); read as a message they would be a forgery with
    /// any topic and properties, and a damaged one would read as a damaged store. So the
    /// index is asked before anything is checked: its entry at the queue offset the header
    /// names must point back at this offset. [`LogError::NoRecord`] when not (also for a
    /// deleted topic's records, still in the log until retention); then the record is read
    /// and checked as any other.
    pub async fn read_message_at(&self, physical_offset: u64) -> Result<ReadBuf, StoreError> {
        let size = self.message_size_at(physical_offset).await?;
        Ok(self.inner.log.read_record(physical_offset, size).await?)
    }

    /// The size of the message stored at a physical offset, found as
    /// [`read_message_at`](Self::read_message_at) finds it (the header and the topic read,
    /// the index asked), without reading the rest of the record: a caller can make room for
    /// it first.
    pub async fn message_size_at(&self, physical_offset: u64) -> Result<u32, StoreError> {
        let no_record = || {
            StoreError::Log(LogError::NoRecord {
                offset: physical_offset,
            })
        };
        let head = self.inner.log.read(physical_offset, HEADER_BYTES).await?;
        let (queue_id, queue_offset, topic_len) =
            crate::protocol::record::peek_place(&head).ok_or_else(no_record)?;
        if topic_len == 0 || topic_len > crate::protocol::names::TOPIC_NAME_BYTES_MAX {
            return Err(no_record());
        }
        // The header was there: a topic that runs past the log's end or the segment's is
        // not a record's.
        let named = match self
            .inner
            .log
            .read(physical_offset, HEADER_BYTES + topic_len)
            .await
        {
            Ok(named) => named,
            Err(LogError::OffsetTooBig { .. }) => return Err(no_record()),
            Err(e) => return Err(e.into()),
        };
        let topic = std::str::from_utf8(&named[HEADER_BYTES..]).map_err(|_| no_record())?;
        match self.entry(topic, queue_id, queue_offset) {
            Ok(e) if e.physical_offset == physical_offset => Ok(e.size),
            Ok(_) | Err(StoreError::OffsetTooSmall { .. } | StoreError::OffsetTooBig { .. }) => {
                Err(no_record())
            }
            Err(e) => Err(e),
        }
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
                    // A tag filter decides by the entry alone, not reading the record: a
                    // damaged entry (its check fails) ends the read before it, what comes
                    // before is answered, and the read that starts at it fails, naming it.
                    // Its tag hash cannot be trusted to skip it. (Without a filter, each
                    // record read is checked against its entry.)
                    let got = if tag_hashes.is_empty() {
                        q.cq.get(next)
                    } else {
                        q.cq.get_checked(next)
                    };
                    let e = match got {
                        Ok(Some(e)) => e,
                        // Empty inside the queue (`next < max`): damage. What comes before
                        // is answered; the read that starts at it fails, naming it.
                        Ok(None) if next > offset => break,
                        Ok(None) => return Err(q.cq.hole(next).into()),
                        Err(_) if next > offset => break,
                        Err(e) => return Err(e.into()),
                    };
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
    /// than twice the bytes it carries, plus slack; the runs together take at most 256 KiB,
    /// or the records' own bytes if more, of other records in passing) and checks each.
    pub async fn fetch(&self, plan: QueuePlan) -> Result<QueueRead, StoreError> {
        let QueuePlan {
            topic,
            queue_id,
            picked,
            bytes: plan_bytes,
            next_offset: mut next,
            min_offset: min,
            max_offset: max,
        } = plan;
        let seg = self.inner.log.config().segment_bytes;
        let mut bufs = Vec::new();
        let mut slices = Vec::with_capacity(picked.len());
        let mut offsets = Vec::with_capacity(picked.len());
        let mut i = 0;
        // Where the records read so far end.
        let mut read_end = None;
        // Bytes of other records the reads may take in passing, all runs together (a run
        // takes them to save reads): a queue's few small records between other records
        // many times their size are read one at a time past it, so that an answer does not
        // hold hundreds of times its own bytes.
        let mut gap_budget = plan_bytes.max(256 << 10) as u64;
        while i < picked.len() {
            // A damaged entry (unfiltered reads take entries unchecked) is not read: one
            // whose size no record has (it would size the buffer), or one pointing back
            // before the records read before it (queues lie in log order). What comes
            // before it is answered; the read that starts at it fails, naming it.
            let (qo, e) = picked[i];
            let damaged_entry = if !size_of_a_record(&e) {
                Some(format!(
                    "it says {} bytes, and a record has {HEADER_BYTES} to {RECORD_BYTES_MAX}",
                    e.size
                ))
            } else if read_end.is_some_and(|end| e.physical_offset < end) {
                Some("it points back before the record of the entry before it".to_owned())
            } else {
                None
            };
            if let Some(why) = damaged_entry {
                if slices.is_empty() {
                    let why = format!(
                        "the consume-queue entry {topic}:{queue_id}:{qo} is damaged: {why}"
                    );
                    return Err(self.inner.log.corrupt_at(e.physical_offset, why).into());
                }
                next = qo;
                break;
            }
            let start = picked[i].1.physical_offset;
            let mut end = start + picked[i].1.size as u64;
            let mut carried = picked[i].1.size as u64;
            // Records in the cache of the newest writes are shared from the buffer that
            // wrote them: a run stays within one such buffer.
            let cached_until = self.inner.log.cached_until(start);
            let mut j = i + 1;
            while j < picked.len() {
                let e = picked[j].1;
                // A queue's records lie in log order: an entry pointing back (damaged) or
                // with a size no record has starts a run of its own, which checks it.
                if e.physical_offset < end || !size_of_a_record(&e) {
                    break;
                }
                let new_end = e.physical_offset + e.size as u64;
                let same_segment = e.physical_offset / seg == start / seg;
                let span = new_end - start;
                let gap = e.physical_offset - end;
                if !same_segment
                    || cached_until.is_some_and(|until| new_end > until)
                    || span > 2 * (carried + e.size as u64) + 64 * 1024
                    || span > 16 << 20
                    || gap > gap_budget
                {
                    break;
                }
                gap_budget -= gap;
                end = new_end;
                carried += e.size as u64;
                j += 1;
            }
            let buf = match self.inner.log.read(start, (end - start) as usize).await {
                Ok(buf) => buf,
                // What was read is answered; the read that starts here says what is wrong.
                Err(_) if !slices.is_empty() => {
                    next = qo;
                    break;
                }
                // Retention deleted the records since they were planned (the pull waited
                // for room, or for the read before): the queue starts later now, which the
                // consumer is told as for any position below its start; a cut of the log
                // since (a full disk) ended the queue before it, as before. An entry still
                // in the queue whose record is not in the log is damaged (told as a start,
                // it would send the consumer back there, to read it again).
                Err(e @ (LogError::OffsetTooSmall { .. } | LogError::OffsetTooBig { .. })) => {
                    let (min, max) = self.queue_range(&topic, queue_id)?;
                    if qo < min {
                        return Err(StoreError::OffsetTooSmall {
                            topic,
                            queue_id,
                            offset: qo,
                            min,
                        });
                    }
                    if qo >= max {
                        return Err(e.into());
                    }
                    let why = format!(
                        "the consume-queue entry {topic}:{queue_id}:{qo} is damaged: it points at log offset {start}, where the log holds no record of it"
                    );
                    return Err(self.inner.log.corrupt_at(start, why).into());
                }
                Err(e) => return Err(e.into()),
            };
            read_end = Some(end);
            let b = bufs.len() as u32;
            let mut damaged = None;
            for &(qo, e) in &picked[i..j] {
                let s = (e.physical_offset - start) as usize;
                let bytes = &buf[s..s + e.size as usize];
                if let Err(reason) = record_of_entry(bytes, &topic, queue_id, qo, &e) {
                    damaged = Some((qo, e.physical_offset, reason));
                    break;
                }
                slices.push((b, s as u32, e.size));
                offsets.push(qo);
            }
            if slices.last().is_some_and(|s| s.0 == b) {
                bufs.push(buf);
            }
            // A damaged record ends the read before it: what comes before is answered, and
            // the read that starts at it fails, naming its queue offset (nothing past it is
            // answered, so nothing is skipped unseen).
            if let Some((qo, physical, reason)) = damaged {
                if slices.is_empty() {
                    let why = format!("the record at {topic}:{queue_id}:{qo}: {reason}");
                    return Err(self.inner.log.corrupt_at(physical, why).into());
                }
                next = qo;
                break;
            }
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
    /// queue's max offset if none was). Records retention deletes while the search waits
    /// for a read count as earlier than `timestamp_ms` (the answer is never below the
    /// queue's first kept offset): before, the search failed with `OffsetTooSmall`. An
    /// entry that points at no record of its place, or is empty inside the queue, fails
    /// the search naming it (`Corrupt`): a time read from another record's bytes sent the
    /// search astray, and a group reset by time to a wrong offset could skip messages.
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
            let (e, read) = match self.entry(topic, queue_id, mid) {
                Ok(e) => (
                    e,
                    self.inner.log.read(e.physical_offset, HEADER_BYTES).await,
                ),
                Err(StoreError::OffsetTooSmall { min, .. }) => {
                    lo = min.max(mid + 1);
                    continue;
                }
                Err(StoreError::OffsetTooBig { .. })
                    if mid < self.queue_range(topic, queue_id)?.1 =>
                {
                    return Err(self.hole(topic, queue_id, mid));
                }
                Err(e) => return Err(e),
            };
            let head = match read {
                Ok(head) => head,
                Err(LogError::OffsetTooSmall { .. }) => {
                    lo = mid + 1;
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            let place = crate::protocol::record::peek_place(&head);
            if place != Some((queue_id, mid, topic.len())) {
                let why = format!(
                    "the record at {topic}:{queue_id}:{mid}: its consume-queue entry points at another record"
                );
                return Err(self.inner.log.corrupt_at(e.physical_offset, why).into());
            }
            let ts = store_timestamp_of_header(&head);
            if ts < timestamp_ms {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        // A probe read just before retention deleted its record can leave the answer below
        // the queue's new start.
        Ok(lo.max(self.queue_range(topic, queue_id)?.0))
    }

    /// Records of `topic` whose KEYS contain `key`, stored in [begin_ms, end_ms], newest
    /// first, at most `max`, without a bound on their bytes: every such record still in the
    /// log, a deleted topic's too (a start's search for a transaction's committed copy).
    /// See [`lookup_by_key`](Self::lookup_by_key) for a client's lookup.
    pub async fn messages_by_key(
        &self,
        topic: &str,
        key: &str,
        begin_ms: i64,
        end_ms: i64,
        max: usize,
    ) -> Result<Vec<ReadBuf>, StoreError> {
        let bounds = KeyLookup {
            max,
            max_bytes: usize::MAX,
            indexed_only: false,
        };
        self.by_key(topic, key, (begin_ms, end_ms), bounds).await
    }

    /// The messages of `topic` whose KEYS contain `key`, stored in [begin_ms, end_ms],
    /// newest first, at most `max`, and no more than `max_bytes` of them (at least one:
    /// records are read until the next would pass it; before, a broker's lookup read, and
    /// held, up to 1,024 whole records to answer one frame). Only records their queue's
    /// index names are the topic's messages: a deleted topic's records stay in the log
    /// (and the key index) until retention, and were answered as the topic's, even after
    /// it was made again.
    pub async fn lookup_by_key(
        &self,
        topic: &str,
        key: &str,
        begin_ms: i64,
        end_ms: i64,
        max: usize,
        max_bytes: usize,
    ) -> Result<Vec<ReadBuf>, StoreError> {
        let bounds = KeyLookup {
            max,
            max_bytes,
            indexed_only: true,
        };
        self.by_key(topic, key, (begin_ms, end_ms), bounds).await
    }

    /// The key index is walked a slice at a time, yielding between slices (a key many
    /// messages share can have millions of newer entries to pass). A candidate whose
    /// record is damaged (it fails its check, or no record starts where the index says) is
    /// passed, with a warning, so that it hides none of the others: it failed the whole
    /// lookup, and with it a start's search for a transaction's committed copy, which then
    /// had the transaction committed again. An I/O error fails the lookup.
    async fn by_key(
        &self,
        topic: &str,
        key: &str,
        (begin_ms, end_ms): (i64, i64),
        KeyLookup {
            max,
            max_bytes,
            indexed_only,
        }: KeyLookup,
    ) -> Result<Vec<ReadBuf>, StoreError> {
        // Ask for more candidates than needed: hash collisions are filtered out below.
        let index_key = index_key(topic, key);
        let wanted = max.saturating_mul(4).max(64);
        let mut walk = (self.inner.keys.borrow()).walk_start(&index_key, begin_ms, end_ms, wanted);
        while !self.inner.keys.borrow().walk(&mut walk, KEY_WALK_SLICE) {
            crate::io::yield_now().await;
        }
        let candidates = walk.into_found();
        let readable = self.inner.log.readable_end();
        let min = self.inner.log.min_offset();
        let mut out = Vec::new();
        let mut bytes = 0usize;
        let mut damaged: Option<(usize, LogError)> = None;
        for phys in candidates {
            if out.len() >= max || (!out.is_empty() && bytes >= max_bytes) {
                break;
            }
            if phys < min || phys >= readable {
                continue;
            }
            // The read checks the record (its CRC, its place), so it parses below.
            let buf = match self.inner.log.read_record_at(phys).await {
                Ok(b) => b,
                Err(LogError::OffsetTooSmall { .. }) | Err(LogError::OffsetTooBig { .. }) => {
                    continue
                }
                Err(
                    e @ (LogError::Corrupt { .. }
                    | LogError::NoRecord { .. }
                    | LogError::InvalidRecord(_)),
                ) => {
                    damaged.get_or_insert((0, e)).0 += 1;
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            let view = RecordView::parse(&buf).map_err(LogError::from)?;
            let ts = view.store_timestamp_ms();
            let matches = view.topic() == topic
                && (view.keys().any(|k| k == key)
                    || view.properties().get(prop::UNIQ_KEY) == Some(key))
                && ts >= begin_ms
                && ts <= end_ms
                && (!indexed_only
                    || (self.queue_entry(topic, view.queue_id(), view.queue_offset())?)
                        .is_some_and(|e| e.physical_offset == phys));
            if matches {
                if !out.is_empty() && bytes + buf.len() > max_bytes {
                    break;
                }
                bytes += buf.len();
                out.push(buf);
            }
        }
        if let Some((count, first)) = damaged {
            crate::warn!(
                "ringmq: looking up key {key:?} of {topic}: {count} damaged record(s) passed, the first: {first}"
            );
        }
        Ok(out)
    }
}

pub(super) fn store_timestamp_of_header(head: &[u8]) -> i64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&head[48..56]);
    i64::from_le_bytes(b)
}

/// Reads of runs of a queue that go one record at a time over a run whose read failed for
/// a damaged record, so that only the record whose own read fails is taken for damaged,
/// not its neighbours. (A read of several stops before a damaged record, answering those
/// before it, and fails only when it starts at one; it failed whole once.)
#[derive(Debug, Default)]
pub struct AloneAfterDamage {
    /// Offsets below this are read one at a time.
    until: u64,
}

impl AloneAfterDamage {
    /// How many of the `n` records from `from` to read at once.
    pub fn batch(&self, from: u64, n: u64) -> u64 {
        if from < self.until {
            1
        } else {
            n
        }
    }

    /// After a read of `n` records from `from` failed with `e`: whether to read them again
    /// one at a time (a damaged record's failure, in a read of several).
    pub fn again_alone(&mut self, from: u64, n: u64, e: &StoreError) -> bool {
        let again = n > 1 && is_damage(e);
        if again {
            self.until = from + n;
        }
        again
    }
}

/// Whether a read failed for a damaged record (its structure, or where it points), not for
/// I/O or an offset out of range.
pub fn is_damage(e: &StoreError) -> bool {
    matches!(e, StoreError::Log(l) if !matches!(l, LogError::Io { .. }))
}
