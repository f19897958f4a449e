//! Queries: committed offsets of consumer groups (commit, query) and message lookups by id
//! and by key (the key lookup asks every shard and merges, newest first).

use std::rc::Rc;

use super::answer::Answer;
use super::consume::with_records_frame;
use super::mesh::{MeshReply, MeshRequest};
use super::{err, store_error, ShardCtx};
use crate::io::ReadBuf;
use crate::log::{FlushMode, LogError};
use crate::protocol::record::RecordView;
use crate::protocol::{
    CommitOffset, Empty, ErrorBody, ErrorCode, MessageById, MessageId, MessagesByKey, Offset,
    QueryOffset, Records,
};
use crate::store::StoreError;

/// Most records one key lookup answers with.
pub const KEY_LOOKUP_MESSAGES_MAX: u32 = 1024;

impl ShardCtx {
    /// `CommitOffset`: kept in memory and appended to the offsets file; fdatasynced before
    /// the answer in sync flush mode.
    pub(super) async fn commit_offset(
        self: Rc<Self>,
        mut m: CommitOffset,
    ) -> Result<Empty, ErrorBody> {
        self.learn_queue(&m.topic, m.queue_id).await?;
        // A position from an earlier run, past where the queue ended at a later run's start:
        // what the committer read past that end, a crash lost, and the offsets hold other
        // messages now (see `pull`). Stored as that end, or the group would skip them. One
        // read in an older topic of the name is stored as the queue's start (offsets only
        // go forward: a group that consumed this topic keeps its offset).
        let born = self.topics.borrow().born(&m.topic);
        let lost_past = self
            .position_moved(&m.topic, m.queue_id, m.offset, m.incarnation, born)
            .map_err(store_error)?;
        if let Some(kept) = lost_past {
            m.offset = kept;
        }
        // Past the queue's end, a commit would make the group skip what is stored next.
        let (_, max) = self
            .store
            .queue_range(&m.topic, m.queue_id)
            .map_err(store_error)?;
        if m.offset > max {
            return Err(err(
                ErrorCode::OffsetTooBig,
                format!(
                    "offset {} of {}:{} is past the queue's end {max}; a reset by time moves offsets back",
                    m.offset, m.topic, m.queue_id
                ),
            ));
        }
        self.offsets_admit(&m.group, &m.topic, &[m.queue_id])?;
        // A member's position read before a reset of the group's offsets here would undo
        // the reset (offsets only go forward); the member re-reads them on the new epoch.
        let refused = self
            .offsets
            .borrow()
            .refuses(&m.group, &m.topic, m.offsets_epoch);
        if let (Some(reset), Some(read)) = (refused, m.offsets_epoch) {
            // The member re-reads once its coordinator publishes the epoch; it may not have
            // (a call that failed, a restart): told again, in the background, once at a
            // time (a client repeating stale commits does not start a task for each).
            if (self.telling_resets.borrow_mut()).insert((m.group.clone(), reset)) {
                let (ctx, group) = (self.clone(), m.group.clone());
                crate::io::spawn(async move {
                    ctx.tell_coordinator_of_reset(&group, reset).await;
                    ctx.telling_resets.borrow_mut().remove(&(group, reset));
                });
            }
            return Err(err(
                ErrorCode::OffsetsReset,
                format!(
                    "offsets of group {} were reset (epoch {reset}) after this position of {}:{} was read (epoch {read}): not stored; members re-read their committed offsets",
                    m.group, m.topic, m.queue_id
                ),
            ));
        }
        let kept = m.if_absent
            && (self.offsets.borrow())
                .get(&m.group, &m.topic, m.queue_id)
                .is_some();
        let (_, generation) = match kept {
            true => (0, 0),
            false => (self.offsets.borrow_mut()).commit(&m.group, &m.topic, m.queue_id, m.offset),
        };
        // An offset this commit leaves as it is may still be on its way to the disk, under
        // an earlier commit: this answer waits for it too.
        let generation = match generation {
            0 => self.offsets.borrow().changed_generation(),
            changed => changed,
        };
        let first = (self.offsets.borrow()).is_unsynced_first(&m.group, &m.topic, m.queue_id);
        if self.cfg.flush == FlushMode::Sync || first {
            // Durable before the answer (the write and fdatasync run off the shard). So is
            // a queue's first offset in async mode, until it is synced (this commit made it,
            // or a retry of the one that did): a member commits where it starts before
            // consuming, and a crash that lost that commit would have the queue's next
            // owner start from its own `consume_from`, past what came in between.
            while !self.offsets.borrow().is_synced(generation) {
                self.offsets_durable().await?;
            }
        } else {
            // Written before the answer (off the shard), so that a process kill loses no
            // commit and a failing disk is answered, not only logged; durable with the
            // periodic sync.
            while !self.offsets.borrow().is_written(generation) {
                (self.flush_offsets(false).await)
                    .map_err(|e| err(ErrorCode::StoreIo, format!("writing offsets: {e}")))?;
            }
        }
        Ok(Empty {})
    }

    /// Offsets at the start (0) of `queues` of `topic` (new queues a topic update is about
    /// to add, owned here) for each of `groups` (those with offsets of the topic when the
    /// update came), written and fdatasynced before it returns: a group that consumed the
    /// topic before the update starts the new queues at their first message, not at their
    /// end, even with no member running while they were added (under `LastOffset`, a
    /// member starting a queue with no offset starts at its end, and would skip what was
    /// sent to it meanwhile). Refused, nothing seeded here, when this shard has no room for
    /// one of the groups (`--groups-max`): the update is refused rather than leave that
    /// group to skip what the added queues take before it comes back.
    pub(super) async fn seed_offsets(
        &self,
        topic: &str,
        queues: &[u32],
        groups: &[String],
    ) -> Result<(), ErrorBody> {
        let new_here = {
            let offsets = self.offsets.borrow();
            groups.iter().filter(|g| !offsets.has_group(g)).count()
        };
        let kept = self.offsets.borrow().group_count();
        if kept + new_here > self.cfg.groups_max {
            return Err(err(
                ErrorCode::LimitReached,
                format!(
                    "shard {} keeps offsets of {kept} groups and would need {new_here} more, past its limit (--groups-max), to start the queues added to {topic} at their first message for every group consuming it; `ringmq group delete` forgets one",
                    self.id
                ),
            ));
        }
        let new: usize = {
            let offsets = self.offsets.borrow();
            (groups.iter())
                .map(|g| offsets.missing(g, topic, queues))
                .sum()
        };
        self.offsets_room(new).map_err(|mut e| {
            e.message = format!(
                "{} (the queues added to {topic} need a starting offset for each of the {} groups consuming it, so that they start at their first message)",
                e.message,
                groups.len()
            );
            e
        })?;
        for group in groups {
            for &queue_id in queues {
                self.offsets.borrow_mut().commit(group, topic, queue_id, 0);
            }
        }
        self.offsets_durable().await
    }

    /// Offsets of a group new to this shard are kept only below `--groups-max` groups, and
    /// offsets new to it only up to `--offsets-max` (`queues` of `topic`: those about to be
    /// set for the group).
    pub(super) fn offsets_admit(
        &self,
        group: &str,
        topic: &str,
        queues: &[u32],
    ) -> Result<(), ErrorBody> {
        let offsets = self.offsets.borrow();
        if !offsets.has_group(group) && offsets.group_count() >= self.cfg.groups_max {
            return Err(err(
                ErrorCode::LimitReached,
                format!(
                    "shard {} keeps offsets of {} groups, its limit (--groups-max); `ringmq group delete` forgets one",
                    self.id,
                    offsets.group_count()
                ),
            ));
        }
        self.offsets_room(offsets.missing(group, topic, queues))
    }

    /// Room for `new` more committed offsets on this shard (`--offsets-max`).
    fn offsets_room(&self, new: usize) -> Result<(), ErrorBody> {
        let kept = self.offsets.borrow().count();
        if new == 0 || kept + new <= self.cfg.offsets_max {
            return Ok(());
        }
        Err(err(
            ErrorCode::LimitReached,
            format!(
                "shard {} keeps {kept} committed offsets and {new} more would pass its limit (--offsets-max); `ringmq group delete` forgets a group's, deleting a topic forgets its",
                self.id
            ),
        ))
    }

    /// `QueryOffset`: [`ErrorCode::OffsetNotFound`] when the group never committed one. An
    /// offset whose first record waits for an fdatasync is answered once it is durable
    /// (the handler waits,
    /// [`is_unsynced_first`](super::offsets::OffsetStore::is_unsynced_first)): a member starting from it
    /// must not lose it to a power loss.
    pub(super) fn query_offset(&self, m: &QueryOffset) -> Result<Offset, ErrorBody> {
        self.known_queue(&m.topic, m.queue_id)?;
        let offset = self
            .offsets
            .borrow()
            .get(&m.group, &m.topic, m.queue_id)
            .ok_or_else(|| {
                err(
                    ErrorCode::OffsetNotFound,
                    format!(
                        "group {} has no offset for {}:{}",
                        m.group, m.topic, m.queue_id
                    ),
                )
            })?;
        Ok(Offset {
            offset,
            incarnation: self.position_incarnation(&m.topic),
        })
    }

    /// The stored record a message id names, on this shard.
    pub(super) async fn read_by_msg_id(&self, msg_id: &str) -> Result<ReadBuf, ErrorBody> {
        let at = self.msg_id_here(msg_id)?;
        let read = self.store.read_message_at(at).await;
        let buf = read.map_err(|e| msg_id_error(msg_id, e))?;
        // The broker's own records (held delayed messages, done records) are not messages;
        // discarded half messages are kept for inspection by id.
        match RecordView::parse_unchecked_crc(&buf) {
            Ok(view)
                if !crate::protocol::names::is_system_topic(view.topic())
                    || view.topic() == super::transaction::DISCARDED_TOPIC =>
            {
                Ok(buf)
            }
            _ => Err(no_message(msg_id)),
        }
    }

    /// The size of the record a message id names on this shard, from its header and
    /// topic, before it is read ([`read_by_msg_id`](Self::read_by_msg_id)).
    pub(super) async fn message_size_by_id(&self, msg_id: &str) -> Result<usize, ErrorBody> {
        let at = self.msg_id_here(msg_id)?;
        let size = self.store.message_size_at(at).await;
        Ok(size.map_err(|e| msg_id_error(msg_id, e))? as usize)
    }

    /// The physical offset a message id names, when it names this shard.
    pub(super) fn msg_id_here(&self, msg_id: &str) -> Result<u64, ErrorBody> {
        let id = MessageId::parse(msg_id).map_err(|e| {
            err(
                ErrorCode::InvalidMessage,
                format!("bad message id {msg_id:?}: {e}"),
            )
        })?;
        if id.store_id != self.id || id.broker_id != self.cfg.broker_id {
            return Err(err(
                ErrorCode::OffsetNotFound,
                format!("message id {msg_id} names another broker or shard"),
            ));
        }
        Ok(id.physical_offset)
    }

    /// `MessageById`: the record at the id's physical offset on this shard.
    pub(super) async fn message_by_id(
        self: Rc<Self>,
        request_id: u64,
        conn: u64,
        m: MessageById,
    ) -> Result<Answer, ErrorBody> {
        // Room for the answer first, then the read: a connection that reads no answers
        // would otherwise have up to 1,024 of these each hold a record (up to 4 MiB) in
        // memory while they wait for room. The read finds the record again (a cut of the
        // log's tail meanwhile can have put another one of another size there; the room
        // taken is then off by that difference, for this one answer).
        let size = self.message_size_by_id(&m.msg_id).await?;
        let hold = self.reserve_answer(conn, size).await?;
        let buf = self.read_by_msg_id(&m.msg_id).await?;
        Ok(Answer::held(records_frame(request_id, &[&buf[..]]), hold))
    }

    /// `MessagesByKey`: this shard's matches and every other shard's, newest first, as many
    /// as fit in one frame (the newest ones). Lookups run a few at a time per shard; one
    /// done gives its place up before it waits for room for its answer (a connection that
    /// reads no answers would otherwise keep the shard's few places for ever), and what it
    /// found is held meanwhile in the connection's share of
    /// [`HeldRequests`](super::answer::HeldRequests) (`BrokerBusy` past it).
    pub(super) async fn messages_by_key(
        self: Rc<Self>,
        request_id: u64,
        conn: u64,
        peer: std::net::SocketAddr,
        max_bytes: usize,
        m: MessagesByKey,
    ) -> Result<Answer, ErrorBody> {
        if crate::protocol::names::is_system_topic(&m.topic) {
            return Err(err(
                ErrorCode::InvalidTopic,
                format!("topic {} is reserved for the broker", m.topic),
            ));
        }
        // A closed connection's lookups give up their place in line (a client that sent
        // many and went would otherwise have them all run, ahead of other clients').
        let place = async {
            (self.key_lookups.acquire().await)
                .map_err(|_| err(ErrorCode::ShardUnavailable, "the broker is stopping"))
        };
        let ours = self.conn_is_ours(conn);
        let one_of_few = self.answers.unless_closed(conn, ours, place).await?;
        let max = m.max_messages.clamp(1, KEY_LOOKUP_MESSAGES_MAX);
        let mut found = self
            .local_by_key(&m.topic, &m.key, m.begin_ms, m.end_ms, max)
            .await?;
        for to in (0..self.shard_count).filter(|&s| s != self.id) {
            let req = MeshRequest::ByKey {
                topic: m.topic.clone(),
                key: m.key.clone(),
                begin_ms: m.begin_ms,
                end_ms: m.end_ms,
                max,
            };
            if let MeshReply::Records(r) = self.call(to, req).await? {
                found.extend(r);
            }
        }
        // Newest first, as one list, cut to what one frame holds.
        found.sort_by_key(|b| {
            std::cmp::Reverse(
                RecordView::parse_unchecked_crc(b)
                    .map(|v| v.store_timestamp_ms())
                    .unwrap_or(0),
            )
        });
        found.truncate(max as usize);
        keep_within(&mut found, max_bytes);
        let bytes: usize = found.iter().map(Vec::len).sum();
        let _held = self.held.hold(bytes, self.id, peer)?;
        drop(one_of_few);
        let hold = self.reserve_answer(conn, bytes).await?;
        let parts: Vec<&[u8]> = found.iter().map(|b| &b[..]).collect();
        Ok(Answer::held(records_frame(request_id, &parts), hold))
    }

    /// This shard's messages with the key (newest first), at most `max` and at most what one
    /// frame holds: no more are read ([`lookup_by_key`](crate::store::MessageStore::lookup_by_key)). A lookup from
    /// another shard takes no place in line here (its origin holds one there while it
    /// waits; taking one here too could have two shards wait for each other), so a shard
    /// runs at most its own few and that many from each other shard.
    pub(super) async fn local_by_key(
        &self,
        topic: &str,
        key: &str,
        begin_ms: i64,
        end_ms: i64,
        max: u32,
    ) -> Result<Vec<Vec<u8>>, ErrorBody> {
        let max_bytes = self.cfg.frame_limits.records_bytes_max() as usize;
        let found = self
            .store
            .lookup_by_key(topic, key, begin_ms, end_ms, max as usize, max_bytes)
            .await
            .map_err(store_error)?;
        Ok(found.iter().map(|b| b.to_vec()).collect())
    }
}

fn no_message(msg_id: &str) -> ErrorBody {
    err(
        ErrorCode::OffsetNotFound,
        format!("no message with id {msg_id}"),
    )
}

/// A failed look-up of a message id: no record starts there (a wrong id, one whose record
/// retention deleted, one past the log's end), or a storage error (a damaged record is
/// one). Before, an id outside the log was answered `OffsetTooSmall`/`OffsetTooBig`, which
/// the client's `message_by_id` returned as an error rather than "none".
fn msg_id_error(msg_id: &str, e: StoreError) -> ErrorBody {
    match e {
        StoreError::Log(
            LogError::NoRecord { .. }
            | LogError::OffsetTooSmall { .. }
            | LogError::OffsetTooBig { .. },
        ) => no_message(msg_id),
        other => store_error(other),
    }
}

/// Keeps the first records whose sizes add up to at most `max_bytes` (at least one).
fn keep_within(records: &mut Vec<Vec<u8>>, max_bytes: usize) {
    let mut total = 0usize;
    let keep = records
        .iter()
        .position(|r| {
            total += r.len();
            total > max_bytes
        })
        .unwrap_or(records.len())
        .max(1);
    records.truncate(keep);
}

fn records_frame(request_id: u64, parts: &[&[u8]]) -> Vec<u8> {
    with_records_frame(
        request_id,
        &Records {
            count: parts.len() as u32,
        },
        parts,
    )
}
