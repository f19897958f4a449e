//! The read side of the log: ranges and records read from the tail cache or the segment
//! files, checked, and located for error messages.

use super::*;

impl CommitLog {
    pub(super) fn file_for(&self, offset: u64, len: u64) -> Result<(Rc<LogFile>, u64), LogError> {
        let st = self.inner.st.borrow();
        if offset < st.min_offset {
            return Err(LogError::OffsetTooSmall {
                offset,
                min: st.min_offset,
            });
        }
        let end = self.readable_end();
        // Offsets come from clients (message ids): never let them overflow.
        let Some(last) = offset.checked_add(len) else {
            return Err(LogError::OffsetTooBig { offset, end });
        };
        if last > end {
            return Err(LogError::OffsetTooBig { offset, end });
        }
        let (base, seg) =
            st.segments
                .range(..=offset)
                .next_back()
                .ok_or(LogError::OffsetTooSmall {
                    offset,
                    min: st.min_offset,
                })?;
        if last > base + self.inner.cfg.segment_bytes {
            return Err(LogError::OffsetTooBig {
                offset,
                end: base + self.inner.cfg.segment_bytes,
            });
        }
        let file = seg
            .file
            .clone()
            .ok_or(LogError::OffsetTooBig { offset, end })?;
        Ok((file, offset - base))
    }

    /// Where the cached write holding `offset` ends, if it is cached: a read that stays
    /// below it shares the cache's buffer instead of copying.
    pub fn cached_until(&self, offset: u64) -> Option<u64> {
        self.inner.tail.borrow().write_end(offset)
    }

    /// Reads `len` bytes at `offset` (within one segment, below the readable end): from the
    /// cache of the newest writes when it holds them (shared when one write holds them all),
    /// else from the file.
    pub async fn read(&self, offset: u64, len: usize) -> Result<ReadBuf, LogError> {
        let (file, pos) = self.file_for(offset, len as u64)?;
        {
            let tail = self.inner.tail.borrow();
            if let Some((bytes, start)) = tail.shared(offset, len) {
                return Ok(ReadBuf::Shared { bytes, start, len });
            }
            if let Some(bytes) = tail.copy(offset, len) {
                return Ok(ReadBuf::Plain(bytes));
            }
        }
        let buf = file.read_at(pos, len).await?;
        if buf.len() != len {
            return Err(LogError::Corrupt {
                path: file.path().to_owned(),
                file_offset: pos,
                log_offset: offset,
                reason: format!("short read: {} of {len} bytes", buf.len()),
            });
        }
        Ok(buf)
    }

    /// Reads and verifies the record of `size` bytes at `offset`.
    pub async fn read_record(&self, offset: u64, size: u32) -> Result<ReadBuf, LogError> {
        let buf = self.read(offset, size as usize).await?;
        self.check_record(&buf, offset)?;
        Ok(buf)
    }

    /// Reads the record at `offset` without knowing its size (the key index's candidates, the
    /// oldest record's time; a message id, which a client chooses, goes through
    /// `MessageStore::read_message_at`): [`LogError::NoRecord`] when no record starts there, [`LogError::Corrupt`] when one
    /// does but is damaged.
    pub async fn read_record_at(&self, offset: u64) -> Result<ReadBuf, LogError> {
        let head = self.read(offset, HEADER_BYTES).await?;
        let (len, magic) = peek_frame(&head).unwrap_or((0, 0));
        if magic != RECORD_MAGIC_V1 {
            return Err(LogError::NoRecord { offset });
        }
        if (len as usize) < HEADER_BYTES || len as usize > RECORD_BYTES_MAX {
            return Err(self.corrupt_at(offset, format!("bad record length {len}")));
        }
        self.read_record(offset, len).await
    }

    /// A record read back fails its checks: the disk returned something else than what was
    /// written. Names the segment file and the offset in it.
    fn check_record(&self, bytes: &[u8], offset: u64) -> Result<(), LogError> {
        let view = RecordView::parse(bytes).map_err(|e| self.corrupt_at(offset, e.to_string()))?;
        if view.physical_offset() != offset || view.total_len() as usize != bytes.len() {
            return Err(self.corrupt_at(
                offset,
                format!(
                    "the record there names log offset {} and {} bytes",
                    view.physical_offset(),
                    view.total_len()
                ),
            ));
        }
        Ok(())
    }

    /// The segment file holding log offset `offset`, and the offset in that file.
    pub fn locate(&self, offset: u64) -> (PathBuf, u64) {
        let seg = self.inner.cfg.segment_bytes;
        let base = offset - offset % seg;
        let st = self.inner.st.borrow();
        let path = st
            .segments
            .get(&base)
            .map(|s| s.path.clone())
            .unwrap_or_else(|| self.inner.dir.join(segment_name(base)));
        (path, offset - base)
    }

    /// A corruption error at log offset `offset`, naming the segment file.
    pub fn corrupt_at(&self, offset: u64, reason: String) -> LogError {
        let (path, file_offset) = self.locate(offset);
        LogError::Corrupt {
            path,
            file_offset,
            log_offset: offset,
            reason,
        }
    }
}
