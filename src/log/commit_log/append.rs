//! The append side of the log: records encoded into the active segment's write buffer,
//! taken back within the tick that appended them, and the roll to the next segment.

use super::*;

impl CommitLog {
    /// Encodes a record into the write buffer and schedules its write. The record is not
    /// readable until [`wait_readable`](Self::wait_readable) (or `wait_durable`) returns for
    /// its end. All appends of one tick share one write.
    pub fn append(&self, draft: &RecordDraft<'_>, queue_offset: u64) -> Result<Appended, LogError> {
        self.append_at(draft, queue_offset, now_ms())
    }

    /// [`append`](Self::append) with the store timestamp given (one for a whole batch).
    pub fn append_at(
        &self,
        draft: &RecordDraft<'_>,
        queue_offset: u64,
        store_timestamp_ms: i64,
    ) -> Result<Appended, LogError> {
        draft.validate()?;
        let len = draft.encoded_len();
        let seg_bytes = self.inner.cfg.segment_bytes;
        if len as u64 > seg_bytes {
            return Err(LogError::RecordTooLarge {
                len,
                segment_bytes: seg_bytes,
            });
        }
        let mut st = self.inner.st.borrow_mut();
        if let Some(reason) = &st.poisoned {
            return Err(LogError::Poisoned {
                reason: reason.clone(),
            });
        }
        if st.closed {
            return Err(LogError::Poisoned {
                reason: "log is closed".into(),
            });
        }
        if let Some(reason) = &st.full {
            return Err(LogError::DiskFull {
                reason: reason.clone(),
            });
        }
        let seg_end = st.active_base + seg_bytes;
        if st.write_pos + len as u64 > seg_end {
            self.roll(&mut st);
        }
        let physical_offset = st.write_pos;
        let at = Placement {
            queue_offset,
            physical_offset,
            store_timestamp_ms,
        };
        let chunk = &mut st.active;
        debug_assert_eq!(chunk.start + chunk.bytes.len() as u64, physical_offset);
        draft.encode_into(at, chunk.bytes.extend(len));
        st.write_pos += len as u64;
        if !st.writer_running {
            st.writer_running = true;
            let weak = Rc::downgrade(&self.inner);
            crate::io::spawn(async move { writer(weak).await });
        }
        Ok(Appended {
            physical_offset,
            size: len as u32,
            store_timestamp_ms,
            epoch: st.epoch,
        })
    }

    /// Whether the records appended from log offset `from` on can still be taken back
    /// ([`take_back`](Self::take_back)): they all sit in chunks no write has taken yet (true
    /// only within the tick that appended them): the active segment's, and, when a roll
    /// came in between, the chunks of the segments it sealed, whose successors have no file
    /// yet.
    pub fn can_take_back(&self, from: u64) -> bool {
        let st = self.inner.st.borrow();
        if st.poisoned.is_some() || from > st.write_pos {
            return false;
        }
        let seg_bytes = self.inner.cfg.segment_bytes;
        let (mut base, mut start) = (st.active_base, st.active.start);
        let mut sealed = st.sealed.iter().rev();
        while from < start {
            if from >= base {
                return false; // in this segment, but already taken by a write
            }
            let Some(prev) = sealed.next() else {
                return false;
            };
            let untouched = st
                .segments
                .get(&base)
                .is_some_and(|s| s.file.is_none() && !s.zeroing);
            if prev.seg_base + seg_bytes != base || !untouched {
                return false;
            }
            (base, start) = (prev.seg_base, prev.start);
        }
        true
    }

    /// Takes back the records appended from `from` on, as if never appended (undoing the
    /// rolls in between): the caller checked [`can_take_back`](Self::can_take_back) in the
    /// same tick (a batch whose indexing failed half-way is answered with an error and
    /// stores none of its records).
    pub fn take_back(&self, from: u64) {
        if !self.can_take_back(from) {
            // A caller's bug: what it takes back is in a write already. Its indexes no
            // longer agree with the log.
            debug_assert!(false, "take_back({from}) past what can_take_back allows");
            self.poison(format!("records from {from} taken back after their write"));
            return;
        }
        let mut st = self.inner.st.borrow_mut();
        let st = &mut *st;
        while from < st.active_base {
            let Some(prev) = st.sealed.pop() else {
                break; // can_take_back saw a sealed chunk for every roll
            };
            st.segments.remove(&st.active_base);
            st.active_base = prev.seg_base;
            st.active = prev;
        }
        let keep = (from - st.active.start) as usize;
        st.active.bytes.truncate(keep);
        st.write_pos = from;
    }

    /// Closes the active segment with a blank filler and starts the next one.
    fn roll(&self, st: &mut State) {
        let seg_bytes = self.inner.cfg.segment_bytes;
        let seg_end = st.active_base + seg_bytes;
        let remaining = (seg_end - st.write_pos) as usize;
        let rest = st.active.bytes.extend(remaining);
        rest.fill(0);
        if remaining >= 8 {
            encode_blank(rest);
        }
        // else too small for a filler: zeros mark the end of a sealed segment.
        let next = seg_end;
        let fresh = st.new_chunk(next, next, &[]);
        let old = std::mem::replace(&mut st.active, fresh);
        st.sealed.push(old);
        st.active_base = next;
        st.write_pos = next;
        let path = self.inner.dir.join(segment_name(next));
        st.segments.insert(
            next,
            Segment {
                base: next,
                path,
                file: None,
                zeroed_to: 0,
                zeroing: false,
            },
        );
    }
}
