//! Start-up: finding the segments on disk, verifying the tail of the log, dispatching
//! records to the indexes, cutting a torn tail and refusing rot.

use super::*;

pub(super) fn list_segments(dir: &Path) -> Result<Vec<u64>, LogError> {
    let layout = |reason: String| LogError::Layout {
        path: dir.to_owned(),
        reason,
    };
    let mut bases = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| layout(format!("read_dir: {e}")))? {
        let entry = entry.map_err(|e| layout(format!("read_dir: {e}")))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.len() == 20 && name.bytes().all(|b| b.is_ascii_digit()) {
            let base: u64 = name
                .parse()
                .map_err(|_| layout(format!("bad segment name {name}")))?;
            bases.push(base);
        }
    }
    bases.sort_unstable();
    Ok(bases)
}

/// How a scan of one segment ended.
pub(super) enum SegmentEnd {
    /// A blank filler or zeros: the segment is complete.
    Sealed,
    /// Data ended before the segment's end (the last segment's tail), at this position.
    Open(u64),
}

/// The open file of a segment found on disk at start-up.
pub(super) fn opened(
    segments: &BTreeMap<u64, Segment>,
    base: u64,
) -> Result<Rc<LogFile>, LogError> {
    segments
        .get(&base)
        .and_then(|s| s.file.clone())
        .ok_or_else(|| LogError::Layout {
            path: PathBuf::from(segment_name(base)),
            reason: "segment was not opened".into(),
        })
}

/// Verifies the tail of the log, dispatches records from `dispatch_from`, truncates a torn
/// tail and refuses rot. Returns (end offset, bytes of the partial last block, active base).
pub(super) async fn recover(
    cfg: &LogConfig,
    segments: &mut BTreeMap<u64, Segment>,
    dispatch_from: u64,
    dispatch: &mut impl FnMut(RecordView<'_>),
    report: &mut RecoveryReport,
) -> Result<(u64, Vec<u8>, u64), LogError> {
    let bases: Vec<u64> = segments.keys().copied().collect();
    for pair in bases.windows(2) {
        if pair[1] != pair[0] + cfg.segment_bytes {
            return Err(LogError::Layout {
                path: segments[&pair[0]].path.clone(),
                reason: format!(
                    "segment {} is not followed by {} (segment_bytes {}); was segment_bytes changed?",
                    segment_name(pair[0]),
                    segment_name(pair[0] + cfg.segment_bytes),
                    cfg.segment_bytes
                ),
            });
        }
    }
    let n = bases.len();
    let verify_from_idx = if cfg.verify_segments_on_start == 0 {
        0
    } else {
        n.saturating_sub(cfg.verify_segments_on_start as usize)
    };
    let dispatch_idx = bases.iter().rposition(|&b| b <= dispatch_from).unwrap_or(0);
    let first = verify_from_idx.min(dispatch_idx);
    let mut end = bases[first];
    let mut last_idx = first;
    for idx in first..n {
        let base = bases[idx];
        last_idx = idx;
        let file = opened(segments, base)?;
        let path = segments[&base].path.clone();
        match scan_segment(cfg, &file, &path, base, dispatch_from, dispatch, report).await? {
            SegmentEnd::Sealed => {
                end = base + cfg.segment_bytes;
            }
            SegmentEnd::Open(pos) => {
                end = base + pos;
                // Anything in later segments means this was not the tail: rot before the
                // known-durable point; after it, writes a crash left out of order, which
                // go to quarantine with the rest of the cut.
                for &later in &bases[idx + 1..] {
                    let lf = opened(segments, later)?;
                    // The whole file, not its first block: a crash can lose a segment's
                    // first pages and keep later ones.
                    let size = lf.size().await?;
                    if holds_data(&lf, size).await? {
                        if end < cfg.known_durable {
                            return Err(LogError::Corrupt {
                                path,
                                file_offset: pos,
                                log_offset: base + pos,
                                reason: format!(
                                    "the segment ends early but a later segment {} holds data",
                                    segment_name(later)
                                ),
                            });
                        }
                        let kept = quarantine(&lf, 0, size).await?;
                        report.truncated_bytes += size;
                        report.quarantined.extend(kept);
                        report.cut_at.get_or_insert(end);
                        report
                            .cut_reason
                            .get_or_insert_with(|| "a later segment holds data".into());
                    }
                }
                break;
            }
        }
    }
    // Drop empty segments after the end (created but never written). One below the known
    // durable point (its data lost) stays on disk, holding nothing, until the checkpoint
    // comes down to the end: a crash before that would find the checkpoint past every
    // segment, which refuses the start as files missing.
    let later: Vec<u64> = bases[last_idx + 1..].to_vec();
    for b in later {
        if let Some(seg) = segments.remove(&b) {
            if cfg.known_durable != u64::MAX && b < cfg.known_durable {
                continue;
            }
            std::fs::remove_file(&seg.path).map_err(|e| LogError::Layout {
                path: seg.path.clone(),
                reason: format!("remove empty segment: {e}"),
            })?;
        }
    }
    let last_base = bases[last_idx];
    if end == last_base + cfg.segment_bytes {
        // The last segment is full: the next append starts a new one.
        return Ok((end, Vec::new(), end));
    }
    let file = opened(segments, last_base)?;
    let pos = end - last_base;
    let size = file.size().await?;
    if size > pos {
        // Cut the torn tail so that stale bytes can never be mistaken for records later;
        // what it held is kept in a quarantine file next to the log.
        let cut = tail_nonzero_bytes(&file, pos, size).await?;
        if cut > 0 {
            report.truncated_bytes += cut;
            report.cut_at.get_or_insert(end);
            report
                .quarantined
                .extend(quarantine(&file, pos, pos + cut).await?);
        }
        file.truncate(pos).await?;
        if cfg.preallocate {
            file.preallocate(cfg.segment_bytes).await?;
        }
        file.fdatasync().await?;
    }
    let block = align_down(pos);
    let tail = file.read_at(block, (pos - block) as usize).await?;
    if tail.len() as u64 != pos - block {
        return Err(LogError::Corrupt {
            path: file.path().to_owned(),
            file_offset: block,
            log_offset: last_base + block,
            reason: "short read of the last block".into(),
        });
    }
    Ok((end, tail.to_vec(), last_base))
}

/// Whether any byte of `file` below `size` is not zero (reading stops at the first).
async fn holds_data(file: &LogFile, size: u64) -> Result<bool, LogError> {
    let mut pos = 0;
    while pos < size {
        let len = ((size - pos) as usize).min(1 << 20);
        let buf = file.read_at(pos, len).await?;
        if buf.is_empty() {
            break;
        }
        if buf.iter().any(|&b| b != 0) {
            return Ok(true);
        }
        pos += buf.len() as u64;
    }
    Ok(false)
}

pub(super) async fn tail_nonzero_bytes(
    file: &LogFile,
    from: u64,
    size: u64,
) -> Result<u64, LogError> {
    // Counts bytes up to the last non-zero byte (what was really cut), reading in chunks.
    let mut last_nonzero = from;
    let mut pos = from;
    while pos < size {
        let len = ((size - pos) as usize).min(1 << 20);
        let buf = file.read_at(pos, len).await?;
        if buf.is_empty() {
            break;
        }
        if let Some(i) = buf.iter().rposition(|&b| b != 0) {
            last_nonzero = pos + i as u64 + 1;
        }
        pos += buf.len() as u64;
    }
    Ok(last_nonzero - from)
}

/// Scans one segment from its start: verifies each record, dispatches, and tells a torn
/// tail from rot.
pub(super) async fn scan_segment(
    cfg: &LogConfig,
    file: &LogFile,
    path: &Path,
    base: u64,
    dispatch_from: u64,
    dispatch: &mut impl FnMut(RecordView<'_>),
    report: &mut RecoveryReport,
) -> Result<SegmentEnd, LogError> {
    let seg_bytes = cfg.segment_bytes;
    let file_size = file.size().await?.min(seg_bytes);
    let mut pos: u64 = 0;
    while pos < file_size {
        let chunk_len = ((file_size - pos) as usize).min(cfg.read_chunk_bytes);
        let chunk = file.read_at(pos, chunk_len).await?;
        let chunk_full = chunk.len() == chunk_len;
        let mut at = 0usize;
        loop {
            let rest = &chunk[at..];
            let abs = base + pos + at as u64;
            let in_seg = pos + at as u64;
            if seg_bytes - in_seg < 8 {
                // Too small for anything: the end of a sealed segment.
                return Ok(SegmentEnd::Sealed);
            }
            let Some((len, magic)) = peek_frame(rest) else {
                break;
            };
            if magic == BLANK_MAGIC {
                if in_seg + len as u64 == seg_bytes {
                    return Ok(SegmentEnd::Sealed);
                }
                return torn_or_rot(
                    cfg,
                    report,
                    file,
                    path,
                    base,
                    in_seg,
                    file_size,
                    "bad blank filler length",
                )
                .await;
            }
            if len == 0 && magic == 0 {
                return torn_or_rot(cfg, report, file, path, base, in_seg, file_size, "zeros")
                    .await;
            }
            match RecordView::parse(rest) {
                Ok(view) => {
                    if view.physical_offset() != abs {
                        return torn_or_rot(
                            cfg,
                            report,
                            file,
                            path,
                            base,
                            in_seg,
                            file_size,
                            "record names another physical offset",
                        )
                        .await;
                    }
                    report.records_verified += 1;
                    report.bytes_verified += view.total_len() as u64;
                    if abs >= dispatch_from {
                        dispatch(view);
                    }
                    at += view.total_len() as usize;
                }
                Err(RecordError::Truncated { .. })
                    if chunk_full && pos + (chunk.len() as u64) < file_size =>
                {
                    // The record continues in the next chunk.
                    break;
                }
                Err(e) => {
                    return torn_or_rot(
                        cfg,
                        report,
                        file,
                        path,
                        base,
                        in_seg,
                        file_size,
                        &e.to_string(),
                    )
                    .await;
                }
            }
        }
        if at == 0 {
            // Nothing parsed in a whole chunk that is not the end: impossible with
            // read_chunk_bytes > RECORD_BYTES_MAX, so this is a short read.
            return torn_or_rot(cfg, report, file, path, base, pos, file_size, "short read").await;
        }
        pos += at as u64;
    }
    if pos >= seg_bytes {
        Ok(SegmentEnd::Sealed)
    } else {
        Ok(SegmentEnd::Open(pos))
    }
}

/// Copies `[from, to)` of `file` into `<log dir>/quarantine/<segment>.<from>` (off the
/// shard's thread) and returns that path, or nothing when the range is empty. A file of
/// that name from an earlier cut is kept: the copy takes the first free name of
/// `<segment>.<from>.1`, `.2`, ...
pub(super) async fn quarantine(
    file: &LogFile,
    from: u64,
    to: u64,
) -> Result<Option<PathBuf>, LogError> {
    if to <= from {
        return Ok(None);
    }
    let source = file.path().to_owned();
    let dir = source
        .parent()
        .map(|d| d.join("quarantine"))
        .unwrap_or_else(|| PathBuf::from("quarantine"));
    let name = format!(
        "{}.{from}",
        source
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("segment")
    );
    let first = dir.join(&name);
    let named = dir.clone();
    crate::io::blocking(move || -> std::io::Result<PathBuf> {
        use std::io::{Read, Seek, SeekFrom, Write};
        std::fs::create_dir_all(&dir)?;
        let mut src = std::fs::File::open(&source)?;
        src.seek(SeekFrom::Start(from))?;
        let (target, mut out) = (0u32..)
            .map(|n| match n {
                0 => dir.join(&name),
                n => dir.join(format!("{name}.{n}")),
            })
            .find_map(|path| {
                let opened = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(&path);
                match opened {
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => None,
                    opened => Some(opened.map(|f| (path, f))),
                }
            })
            .unwrap_or_else(|| Err(std::io::Error::other("no free quarantine file name")))?;
        let copied = std::io::copy(&mut src.take(to - from), &mut out)
            .and_then(|_| out.flush())
            .and_then(|()| out.sync_all());
        if let Err(e) = copied {
            // A partial copy (a full disk) would take the room freed for the next try,
            // under the next name.
            drop(out);
            let _ = std::fs::remove_file(&target);
            return Err(e);
        }
        crate::io::sync_dir(&named)?;
        Ok(target)
    })
    .await
    .map(Some)
    .map_err(|e| LogError::Layout {
        path: first,
        reason: format!("writing the quarantine file: {e}"),
    })
}

/// A record failed at `pos`. At or after the known-durable point it is damage a crash left
/// in writes that were in flight: the log ends there. Before it, if a valid record can be
/// found anywhere after it in this segment, the log is corrupt in the middle: refuse;
/// otherwise it is a torn tail.
#[allow(clippy::too_many_arguments)]
pub(super) async fn torn_or_rot(
    cfg: &LogConfig,
    report: &mut RecoveryReport,
    file: &LogFile,
    path: &Path,
    base: u64,
    pos: u64,
    file_size: u64,
    reason: &str,
) -> Result<SegmentEnd, LogError> {
    if base + pos >= cfg.known_durable {
        report.cut_reason.get_or_insert_with(|| reason.to_owned());
        return Ok(SegmentEnd::Open(pos));
    }
    // Zeros to the end of the file (where the log ends after a clean stop, read without a
    // checkpoint): nothing follows, and no search for a record at every byte.
    if tail_nonzero_bytes(file, pos, file_size).await? == 0 {
        return Ok(SegmentEnd::Open(pos));
    }
    let magic = RECORD_MAGIC_V1.to_le_bytes();
    let mut scan = pos + 1;
    let window = 8usize << 20;
    while scan + (HEADER_BYTES as u64) <= file_size {
        let len = ((file_size - scan) as usize).min(window + RECORD_BYTES_MAX);
        let buf = file.read_at(scan, len).await?;
        let limit = buf.len().min(window);
        let mut i = 0usize;
        // Every start in the window (the buffer reaches past it), so that none falls
        // between one window and the next.
        while i < limit && i + 8 <= buf.len() {
            // A record's magic sits 4 bytes into it, and its place in the log 32 bytes
            // into it: both are compared before the record's CRC is computed (bodies a
            // client filled with copies of a header would cost a CRC of up to 4 MiB at
            // each byte).
            let at = scan + i as u64;
            let placed = buf
                .get(i + 32..i + 40)
                .is_some_and(|b| b == (base + at).to_le_bytes());
            if buf[i + 4..i + 8] == magic && placed {
                if let Ok(view) = RecordView::parse(&buf[i..]) {
                    if view.physical_offset() == base + at {
                        return Err(LogError::Corrupt {
                            path: path.to_owned(),
                            file_offset: pos,
                            log_offset: base + pos,
                            reason: format!(
                                "{reason}; a valid record follows at file offset {at}, so this is not a torn tail"
                            ),
                        });
                    }
                }
            }
            i += 1;
        }
        if limit == 0 {
            break;
        }
        scan += limit as u64;
    }
    Ok(SegmentEnd::Open(pos))
}
