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
    /// ([`take_back`](Self::take_back)): they all sit in the active segment's chunk, which no
    /// write has taken yet (true only within the tick that appended them).
    pub fn can_take_back(&self, from: u64) -> bool {
        let st = self.inner.st.borrow();
        st.poisoned.is_none()
            && from >= st.active_base
            && from >= st.active.start
            && from <= st.write_pos
    }

    /// Takes back the records appended from `from` on, as if never appended: the caller
    /// checked [`can_take_back`](Self::can_take_back) in the same tick (a batch whose
    /// indexing failed half-way is answered with an error and stores none of its records).
    pub fn take_back(&self, from: u64) {
        let mut st = self.inner.st.borrow_mut();
        debug_assert!(from >= st.active.start && from >= st.active_base && from <= st.write_pos);
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
