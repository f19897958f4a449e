//! Opening a store: the checkpoint, the consume queues and key index as they were flushed,
//! and the records of the log past the checkpoint indexed again.

use super::append::{cq_tag_slot, index_keys};
use super::*;
use crate::log::RecoveryReport;
use crate::protocol::record::RecordView;

/// What recovery did.
#[derive(Debug, Clone, Default)]
pub struct StoreRecovery {
    pub log: RecoveryReport,
    pub clean_shutdown: bool,
    /// Where the replay started: the checkpoint's log offset (0 with a re-index).
    pub checkpoint_offset: u64,
    pub records_dispatched: u64,
    pub queues: usize,
    /// Bytes the checkpoint found durable that the log no longer holds (it ends below the
    /// checkpoint: damaged on the disk, or a disk that lost what it synced).
    pub durable_bytes_lost: u64,
}

impl StoreRecovery {
    /// One line for the log: how the store was left, what recovery read, rebuilt and cut,
    /// and how long it took.
    pub fn summary(&self, took: Duration) -> String {
        let mut line = format!(
            "store opened in {} ms after a {} stop: {} records verified ({} bytes), {} re-indexed from log offset {}",
            took.as_millis(),
            if self.clean_shutdown { "clean" } else { "crash or unclean" },
            self.log.records_verified,
            self.log.bytes_verified,
            self.records_dispatched,
            self.checkpoint_offset,
        );
        if self.durable_bytes_lost > 0 {
            line.push_str(&format!(
                "; {} bytes the checkpoint found durable are lost (the log ends below it)",
                self.durable_bytes_lost
            ));
        }
        if let Some(at) = self.log.cut_at {
            line.push_str(&format!(
                "; the log was cut at offset {at} ({}): {} bytes moved to {}",
                self.log.cut_reason.as_deref().unwrap_or("torn tail"),
                self.log.truncated_bytes,
                self.log
                    .quarantined
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        line
    }
}

impl MessageStore {
    /// Opens the store in `dir`, recovering from the last checkpoint.
    pub async fn open(
        dir: &Path,
        cfg: StoreConfig,
    ) -> Result<(MessageStore, StoreRecovery), StoreError> {
        std::fs::create_dir_all(dir).map_err(|e| io_err("create", dir, e))?;
        let abort_path = dir.join("abort");
        let clean_shutdown = !abort_path.exists();
        let found = Checkpoint::read_found(dir)?;
        let checkpoint = found.unwrap_or_default();
        let checkpoint_offset = checkpoint.log_offset;
        // The checkpoint records the log's durable end when it was written: a bad record
        // before it is rot, one after it is what a crash leaves in writes in flight.
        // Without one (removed to re-index, or damaged), a clean stop left nothing in
        // flight: every bad record followed by a good one is rot, and refuses the start
        // (before, the log was cut at it and every later segment moved out).
        // An operator's request to index the log again (an empty file named `reindex` in
        // the store's directory, as a damaged index's error says): the replay starts at
        // the log's start, and the checkpoint's durable point still tells rot from a
        // crash's torn tail (removing the checkpoint instead loses it).
        let reindex_path = dir.join("reindex");
        let reindex = reindex_path.exists();
        let replay_from = if reindex { 0 } else { checkpoint_offset };
        let mut cfg = cfg;
        cfg.log.known_durable = match found {
            Some(c) => c.log_offset,
            None if clean_shutdown => u64::MAX,
            None => 0,
        };
        // Consume queues and key index as they were flushed.
        // A re-index rebuilds what cannot be opened (a damaged file refused the start
        // before the request was read): each consume queue whose files do not open, from
        // the log's records; and the key index whole (it skips records below what it
        // holds, so damage in it would stay).
        let mut queues = open_queues(&dir.join("consumequeue"), &cfg.consume_queue, reindex)?;
        let keys_dir = dir.join("index");
        if reindex {
            match std::fs::remove_dir_all(&keys_dir) {
                Ok(()) => crate::io::sync_parent(&keys_dir).map_err(StoreError::Io)?,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err("remove", &keys_dir, e)),
            }
        }
        // After an unclean stop, only what the checkpoint found synced: pages written since
        // may have reached the disk in any order (a power loss).
        let mut keys = if clean_shutdown || reindex {
            KeyIndex::open(&keys_dir, cfg.key_index)
        } else {
            KeyIndex::open_after_crash(&keys_dir, cfg.key_index, checkpoint.keys)
        }
        .map_err(with_reindex_hint)?;
        let keys_last = keys.last_physical_offset();
        let mut dispatched = 0u64;
        let mut failure: Option<StoreError> = None;
        let (log, log_report) = {
            let dispatch = |view: RecordView<'_>| {
                if failure.is_some() {
                    return;
                }
                dispatched += 1;
                if let Err(e) = dispatch_record(&mut queues, &mut keys, keys_last, dir, &cfg, view)
                {
                    failure = Some(e);
                }
            };
            CommitLog::open(
                &dir.join("commitlog"),
                cfg.log.clone(),
                replay_from,
                dispatch,
            )
            .await?
        };
        if let Some(e) = failure {
            return Err(e);
        }
        // Drop index entries past the recovered end of the log, and below its start. (The
        // log can end below the checkpoint: a torn tail it may have when nothing valid
        // follows. Key entries kept past the end would break the order of offsets that
        // cuts and checkpoints look back through.)
        let end = log.write_offset();
        keys.forget_from_physical(end);
        // Where the replay started to write, for the queues it wrote nothing to: the
        // checkpoint, or with a re-index the log's start (entries of records retention
        // deleted keep their queue offsets).
        let replayed_from = if reindex {
            log.min_offset()
        } else {
            checkpoint_offset
        };
        for q in queues.values_mut() {
            // The replay wrote the entry of every record in the log from where it started,
            // in queue order: entries past the last it wrote, or past where the queue ended
            // when it started (`end_within_durable`, before any cut: an empty entry judged
            // by the next one that is not), have no record. Those a power loss kept past
            // entries it lost are cut with them (the search below counts empty entries as
            // below the end: before the checkpoint they are damage).
            let replayed_end = match q.replayed_end.take() {
                Some(end) => end,
                None => q.cq.end_within_durable(replayed_from)?,
            };
            q.cq.truncate_after_log_end(end)?;
            q.cq.truncate_to(replayed_end)?;
            q.cq.delete_before_physical(log.min_offset())?;
        }
        let mut checkpointed = checkpoint_offset;
        if end < checkpoint_offset {
            crate::warn!(
                "ringmq: {}: the commit log ends at {end}, below the {checkpoint_offset} its checkpoint found durable: {} bytes of acknowledged messages are lost (damaged on the disk, or a power loss on a disk that did not keep what it synced); the indexes are cut to the log's end",
                dir.display(),
                checkpoint_offset - end
            );
        }
        if end < checkpoint_offset || reindex {
            // The indexes cut back to that end are synced and the checkpoint moved down to
            // it before anything is appended: else a power loss would bring back, with the
            // checkpoint's synced entries, entries of records this start cut. Indexed
            // again, they are synced before the request to is removed (the durable point
            // stays where it was).
            for q in queues.values_mut() {
                q.cq.flush()?;
            }
            keys.flush()?;
            // The replay may have made queue directories and files: their names are
            // durable before the checkpoint counts on them.
            sync_dirs_under(&dir.join("consumequeue"))?;
            sync_dirs_under(&dir.join("index"))?;
            let durable = end.min(checkpoint_offset);
            let checkpoint = Checkpoint {
                log_offset: durable,
                timestamp_ms: crate::log::now_ms(),
                keys: keys.entries_below(durable),
            };
            checkpoint.write(dir)?;
            checkpointed = durable;
            if reindex {
                std::fs::remove_file(&reindex_path)
                    .map_err(|e| io_err("remove", &reindex_path, e))?;
            }
        }
        let now_nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
            .max(cfg.incarnation_after.saturating_add(1));
        let runs = runs::Runs::start(dir, log.readable_end(), now_nanos).map_err(StoreError::Io)?;
        let trimmed_to = log.min_offset();
        // Durable before anything is appended: a marker a power loss took would have the
        // next start taken for one after a clean stop, trusting index pages as it finds them.
        crate::io::replace_file(&abort_path, b"ringmq store open\n")
            .map_err(|e| io_err("create", &abort_path, e))?;
        let report = StoreRecovery {
            log: log_report,
            clean_shutdown,
            checkpoint_offset: replay_from,
            records_dispatched: dispatched,
            queues: queues.len(),
            durable_bytes_lost: checkpoint_offset.saturating_sub(end),
        };
        let store = MessageStore {
            inner: Rc::new(Inner {
                dir: dir.to_owned(),
                cfg,
                log,
                runs,
                queues: RefCell::new(queues),
                opening: RefCell::default(),
                opened: tokio::sync::Notify::new(),
                inline_opens: std::cell::Cell::new(0),
                keys: RefCell::new(keys),
                stopped: std::cell::Cell::new(false),
                retention_floors: std::array::from_fn(|_| std::cell::Cell::new(u64::MAX)),
                checkpointed: std::cell::Cell::new(checkpointed),
                index_sync_failed: RefCell::new(None),
                checkpointing: tokio::sync::Mutex::new(()),
                retention_held: std::cell::Cell::new(false),
                trimmed_to: std::cell::Cell::new(trimmed_to),
                seen_epoch: std::cell::Cell::new(0),
                space_low: RefCell::new(None),
                disk_free: std::cell::Cell::new(0),
            }),
        };
        store.spawn_housekeeping();
        // The key index's next file, if its last one is near its end.
        store.keys_ahead();
        Ok((store, report))
    }
}

/// A damaged index file's error, saying how to rebuild the index from the log.
fn with_reindex_hint(e: IndexError) -> IndexError {
    match e {
        IndexError::Corrupt { path, reason } => IndexError::Corrupt {
            path,
            reason: format!(
                "{reason}; to rebuild the indexes from the log, create an empty file named `reindex` in the shard's directory (beside its `checkpoint`) and start again"
            ),
        },
        other => other,
    }
}

fn open_queues(
    root: &Path,
    cfg: &ConsumeQueueConfig,
    reindex: bool,
) -> Result<HashMap<(String, u32), QueueState>, StoreError> {
    let mut out = HashMap::new();
    if !root.exists() {
        return Ok(out);
    }
    // Queues whose files do not open, with a re-index asked: (topic, queue, its topic's
    // directory, why).
    let mut damaged = Vec::new();
    for topic in std::fs::read_dir(root).map_err(|e| io_err("read_dir", root, e))? {
        let topic = topic.map_err(|e| io_err("read_dir", root, e))?;
        let Some(name) = topic.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        if name.starts_with(DELETED_PREFIX) {
            // A deleted topic's indexes a crash left before they were removed.
            let _ = std::fs::remove_dir_all(topic.path());
            continue;
        }
        if validate_topic(&name).is_err() {
            continue;
        }
        for q in
            std::fs::read_dir(topic.path()).map_err(|e| io_err("read_dir", &topic.path(), e))?
        {
            let q = q.map_err(|e| io_err("read_dir", &topic.path(), e))?;
            let Some(qid) = q.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            let cq = match ConsumeQueue::open(&q.path(), *cfg) {
                Ok(cq) => cq,
                Err(e @ IndexError::Corrupt { .. }) if reindex => {
                    // Set aside after this listing of the directory.
                    damaged.push((name.clone(), qid, topic.path(), e));
                    continue;
                }
                Err(e) => return Err(with_reindex_hint(e).into()),
            };
            let state = QueueState {
                cq,
                replayed_end: None,
            };
            out.insert((name.clone(), qid), state);
        }
    }
    // Set aside (removed at the next start, as a deleted topic's) and opened empty: the
    // replay from the log's start fills them again.
    for (name, qid, topic_dir, e) in damaged {
        let path = topic_dir.join(qid.to_string());
        let aside = root.join(format!(
            "{DELETED_PREFIX}reindex-{}-{name}-{qid}",
            crate::log::now_ms()
        ));
        std::fs::rename(&path, &aside).map_err(|e| io_err("rename", &path, e))?;
        crate::io::sync_dir(&topic_dir).map_err(StoreError::Io)?;
        crate::io::sync_dir(root).map_err(StoreError::Io)?;
        crate::warn!(
            "ringmq: the consume queue {name}:{qid} could not be opened ({e}); rebuilt from the log's records (reindex), its files set aside as {}",
            aside.display()
        );
        let state = QueueState {
            cq: ConsumeQueue::open(&path, *cfg)?,
            replayed_end: None,
        };
        out.insert((name, qid), state);
    }
    Ok(out)
}

/// Re-indexes one record found by recovery. Consume queue puts are positional (idempotent);
/// key index puts are skipped below what the key index already holds.
fn dispatch_record(
    queues: &mut HashMap<(String, u32), QueueState>,
    keys: &mut KeyIndex,
    keys_last: Option<u64>,
    dir: &Path,
    cfg: &StoreConfig,
    view: RecordView<'_>,
) -> Result<(), StoreError> {
    let none_opening = HashSet::new();
    let not_counted = std::cell::Cell::new(0);
    let q = queue_state(
        queues,
        &none_opening,
        &not_counted,
        dir,
        cfg,
        view.topic(),
        view.queue_id(),
    )?;
    let entry = CqEntry {
        physical_offset: view.physical_offset(),
        size: view.total_len(),
        tag_hash: cq_tag_slot(view.topic(), view.properties()),
    };
    let qo = view.queue_offset();
    if qo > q.cq.max_offset() && q.cq.max_offset() > q.cq.min_offset() {
        return Err(StoreError::Recovery(format!(
            "record at log offset {} has queue offset {qo} of {}:{}, but the consume queue ends at {}",
            view.physical_offset(),
            view.topic(),
            view.queue_id(),
            q.cq.max_offset()
        )));
    }
    if qo >= q.cq.min_offset() {
        // The last written, not the highest: records of a topic deleted since and made
        // again come before those of the new one, which start again at 0.
        q.replayed_end = Some(qo + 1);
    }
    q.cq.put(qo, entry)?;
    if keys_last.is_none_or(|last| view.physical_offset() > last) {
        index_keys(
            keys,
            view.topic(),
            view.properties(),
            view.physical_offset(),
            view.store_timestamp_ms(),
        )?;
    }
    Ok(())
}

/// fsyncs `dir` and every directory under it (names made by a replay). Blocks; at a start
/// only, on the rare path that re-indexes or cuts below the checkpoint.
fn sync_dirs_under(dir: &Path) -> Result<(), StoreError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_err("read_dir", dir, e)),
    };
    for entry in entries {
        let entry = entry.map_err(|e| io_err("read_dir", dir, e))?;
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            sync_dirs_under(&entry.path())?;
        }
    }
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io_err("sync", dir, e))
}
