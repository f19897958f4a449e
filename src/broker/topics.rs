//! Topics: the table (name -> queue count) and its administration. Every shard holds a copy
//! of the table; shard 0 is its keeper: it persists the table (`topics.json`, written
//! atomically) and tells every other shard of each change before answering. Auto-creation,
//! queue checks and the admin requests (create, update, delete, list, describe) live here.

use std::rc::Rc;

use super::mesh::{MeshReply, MeshRequest, MESH_CALL_TIMEOUT_MS};
use super::{err, store_error, LocalBoxFuture, ShardCtx};
use crate::protocol::{
    CreateTopic, DeleteTopic, Empty, ErrorBody, ErrorCode, QueueInfo, TopicInfo, UpdateTopic,
};
use crate::store::validate_topic;

mod born;
mod table;
pub use table::TopicTable;

/// Most queues a topic may have.
pub const QUEUES_PER_TOPIC_MAX: u32 = 1024;

/// A shard that failed to take a topic change is told again after this long, then at
/// doubling intervals up to [`TELL_AGAIN_MAX_MS`].
const TELL_AGAIN_FIRST_MS: u64 = 1_000;
const TELL_AGAIN_MAX_MS: u64 = 30_000;

/// How long a shard waits for shard 0 when it asks about a topic it may not create.
const REFRESH_TIMEOUT_MS: u64 = 5_000;

/// Topics every shard keeps a queue 0 of its own in, for itself: the schedule's held
/// messages and their deliveries, and the transactions' half messages, outcomes and
/// discarded halves.
const SHARD_SYSTEM_TOPICS: [&str; 5] = [
    crate::store::SCHEDULE_TOPIC,
    crate::store::SCHEDULE_DONE_TOPIC,
    super::transaction::HALF_TOPIC,
    super::transaction::OP_TOPIC,
    super::transaction::DISCARDED_TOPIC,
];

/// Testing: how the shards other than 0 mishandle the changes to one topic that shard 0
/// tells them of (`BrokerConfig::testing_topic_change_fault`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TopicChangeFault {
    /// The change of this number (0: the first the shard is told of) is answered with a
    /// failure and not applied, as if the call had failed on the way.
    Drop(u32),
    /// A creation or growth is acknowledged at once and applied in its turn once the next
    /// change arrives (or after this many ms), as if shard 0's call had timed out while the
    /// shard was still opening the queues.
    LateCreation(u64),
    /// Shard 0 answers another shard's creation of the topic (auto-create) this many ms
    /// after every shard has applied it, as if the answer were slow on its way: the shard
    /// that asked knows the topic before its send resumes.
    SlowCreationAnswer(u64),
}

/// Who creates a topic: limits differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum NewTopic {
    /// An admin request.
    Admin,
    /// A send to a topic that does not exist (auto-create).
    Auto,
    /// The broker, for a group's retry or dead-letter topic.
    System,
}

impl ShardCtx {
    /// Opens the indexes of this shard's queues of `topic` among its first `queues` off the
    /// shard's thread ([`MessageStore::open_queues`]): done before sends can name them (a
    /// topic created or grown, a start), so no send waits for an index file's creation.
    pub(super) async fn open_local_queues(
        &self,
        topic: &str,
        queues: u32,
    ) -> Result<usize, crate::store::StoreError> {
        let local: Vec<u32> = (0..queues)
            .filter(|&q| self.owner_of(topic, q) == self.id)
            .collect();
        self.store.open_queues(topic, local).await
    }

    /// At a start: the queues of every topic opened ahead (those recovery did not open: a
    /// topic's queues that never held a message), and this shard's own system queues (the
    /// schedule's and the transactions', which no table names), so that the first delayed
    /// or transactional send does not open one on the shard's thread. A failure is left to
    /// the first send to the queue, which opens it itself and answers with the error.
    pub async fn open_all_local_queues(&self) {
        let topics: Vec<(String, u32)> = {
            let table = self.topics.borrow();
            table
                .names()
                .into_iter()
                .filter_map(|t| table.get(&t).map(|q| (t, q)))
                .collect()
        };
        for (topic, queues) in topics {
            if let Err(e) = self.open_local_queues(&topic, queues).await {
                crate::warn!(
                    "ringmq: shard {}: opening the queues of {topic}: {e}",
                    self.id
                );
            }
        }
        for topic in SHARD_SYSTEM_TOPICS {
            if let Err(e) = self.store.open_queues(topic, [0]).await {
                crate::warn!(
                    "ringmq: shard {}: opening the queues of {topic}: {e}",
                    self.id
                );
            }
        }
    }

    /// Takes a change of `topic` on this shard. A deletion whose making durable failed (its
    /// indexes set aside, the group offsets forgotten, the log synced and checkpointed) is
    /// an `Err` naming each step that failed: the topic is gone here all the same, and the
    /// caller must say so and tell the shard again ([`Self::tell_again_later`]), since a
    /// crash before the steps succeed could bring back its queues or offsets, which a topic
    /// created again under the name would take for its own.
    pub(super) async fn apply_topic_change(
        self: &Rc<Self>,
        topic: &str,
        queues: Option<u32>,
        born: u64,
    ) -> Result<(), String> {
        if let Some(count) = queues {
            // Before the table names them: a send to a queue being opened is refused.
            if let Err(e) = self.open_local_queues(topic, count).await {
                crate::warn!(
                    "ringmq: shard {}: opening the queues of {topic}: {e} (the first send to each opens it)",
                    self.id
                );
            }
        }
        {
            let mut table = self.topics.borrow_mut();
            table.set(topic, queues);
            if queues.is_some() {
                table.set_born(topic, born);
            }
        }
        self.topic_changed_for_groups(topic).await;
        if queues.is_none() {
            // What the shard keeps per topic goes with it (topics created and deleted over
            // and over must not add up): its long polls answer now, its counters go.
            self.polls.borrow_mut().retain(|(t, _), n| {
                if t == topic {
                    n.notify_waiters();
                }
                t != topic
            });
            self.stats.stored.borrow_mut().remove(topic);
            return self.make_deletion_durable(topic).await;
        }
        Ok(())
    }

    /// Shard 0, at a start: every shard (itself too) is told again of each deletion the
    /// table holds a tombstone of, which not every shard had made durable before the last
    /// stop (a crash between the table's save and a shard's steps, or a step that failed).
    /// Each shard redoes what is left (sets the topic's queues aside, forgets its group
    /// offsets, syncs and checkpoints); once all have, the tombstone goes. Queues or
    /// offsets of a topic the table names in no way (a lost table) are left alone.
    pub fn finish_undone_deletions(self: &Rc<Self>) {
        let undone = self.topics.borrow().deleting();
        for topic in undone {
            crate::warn!(
                "ringmq: shard {}: the deletion of topic {topic} was not made durable on every shard before the last stop; finishing it",
                self.id
            );
            for to in 0..self.shard_count {
                self.tell_again_later(to, &topic);
            }
        }
    }

    /// The durable steps of deleting `topic` on this shard (its pending transactions
    /// discarded, its indexes set aside, the group offsets forgotten, the log synced and
    /// checkpointed), each tried even when one before failed; an `Err` names each that
    /// failed. Run again, they redo only what is left (indexes already set aside are not
    /// found, and that is success).
    async fn make_deletion_durable(self: &Rc<Self>, topic: &str) -> Result<(), String> {
        let mut failed = Vec::new();
        // First, so the log's sync below covers their op records too.
        if let Err(e) = self.discard_halves_of(topic).await {
            failed.push(e);
        }
        if let Err(e) = self.store.delete_topic(topic).await {
            failed.push(format!("setting its indexes aside: {e}"));
        }
        self.offsets.borrow_mut().forget_topic(topic);
        if let Err(e) = self.sync_offsets().await {
            failed.push(format!("forgetting its group offsets: {e}"));
        }
        // Replay after a crash must not bring the deleted queues back: the checkpoint
        // must cover every record of the topic, so make the log durable to its end
        // first (in async mode the durable end trails the written end).
        let end = self.store.log().write_offset();
        let synced = match self.store.log().wait_readable(end).await {
            Ok(()) => self.store.log().sync_all().await,
            Err(e) => Err(e),
        };
        if let Err(e) = synced {
            failed.push(format!("syncing the log: {e}"));
        }
        if let Err(e) = self.store.checkpoint().await {
            failed.push(format!("checkpointing: {e}"));
        }
        if !failed.is_empty() {
            let failed = failed.join("; ");
            crate::warn!(
                "ringmq: shard {}: topic {topic} is deleted, but not durably yet: {failed}",
                self.id
            );
            return Err(format!(
                "topic {topic} is deleted, but shard {} could not make that durable ({failed}); it is retried in the background (and at the next start), and the name cannot be created again until that succeeds",
                self.id
            ));
        }
        Ok(())
    }

    pub(super) fn local_ranges(&self, topic: &str) -> Result<Vec<(u32, u64, u64)>, ErrorBody> {
        let Some(count) = self.topics.borrow().get(topic) else {
            return Ok(Vec::new());
        };
        (0..count)
            .filter(|&q| self.owner_of(topic, q) == self.id)
            .map(|q| {
                let (min, max) = self.store.queue_range(topic, q).map_err(store_error)?;
                Ok((q, min, max))
            })
            .collect()
    }

    /// Creates, grows or deletes a topic. Runs on shard 0 (the keeper of the table), which
    /// persists the table and tells every other shard before answering.
    pub(super) async fn set_topic(
        self: &Rc<Self>,
        topic: &str,
        queues: Option<u32>,
        if_absent: bool,
        origin: NewTopic,
    ) -> Result<bool, ErrorBody> {
        debug_assert_eq!(self.id, 0);
        // One change at a time: each copies the table, saves it and tells every shard, and
        // an "exists" answer must mean the creation has reached every shard.
        let _one_at_a_time = self.topic_changes.lock().await;
        validate_topic(topic).map_err(store_error)?;
        if crate::protocol::names::is_system_topic(topic) {
            return Err(err(
                ErrorCode::InvalidTopic,
                format!("topic {topic} is reserved for the broker"),
            ));
        }
        let current = self.topics.borrow().get(topic);
        if let Some(q) = queues {
            if q == 0 || q > QUEUES_PER_TOPIC_MAX {
                return Err(err(
                    ErrorCode::InvalidMessage,
                    format!("queue count {q} must be 1..={QUEUES_PER_TOPIC_MAX}"),
                ));
            }
        }
        match (current, queues) {
            (Some(_), Some(_)) if if_absent => return Ok(false),
            (Some(cur), Some(q)) if q < cur => {
                return Err(err(
                    ErrorCode::InvalidMessage,
                    format!("topic {topic} has {cur} queues; queue counts only grow"),
                ));
            }
            (None, None) => {
                return Err(err(
                    ErrorCode::TopicNotFound,
                    format!("topic {topic} does not exist"),
                ))
            }
            // A shard not yet told of the deletion (or not yet durably done with it) keeps
            // the old queues or group offsets, which a creation now would take for the new
            // topic's.
            (None, Some(_)) if self.topics.borrow().is_deleting(topic) => {
                return Err(err(
                    ErrorCode::Conflict,
                    format!(
                        "topic {topic} is still being deleted (not every shard has made the deletion durable yet; it is retried in the background); try again later"
                    ),
                ));
            }
            _ => {}
        }
        let mut table = self.topics.borrow().clone();
        // The broker's own topic of delayed messages whose target is gone (one queue) is
        // made past the caps: else a broker at them would keep such messages in its
        // schedule for ever, and the shard's log with them.
        let capped = !(origin == NewTopic::System && topic == super::schedule::UNDELIVERABLE_TOPIC);
        if current.is_none() && capped {
            // Bounded: every topic holds queues, files and maps on every shard.
            if table.len() >= self.cfg.topics_max {
                return Err(err(
                    ErrorCode::LimitReached,
                    format!(
                        "the broker holds {} topics, its limit (--topics-max); delete some or raise it",
                        table.len()
                    ),
                ));
            }
            if origin == NewTopic::Auto {
                if table.auto_created() >= self.cfg.auto_create_topics_max {
                    return Err(err(
                        ErrorCode::LimitReached,
                        format!(
                            "sends created {} topics, the limit (--auto-create-topics-max); create topic {} explicitly",
                            table.auto_created(),
                            crate::protocol::names::shown(topic)
                        ),
                    ));
                }
                table.mark_auto(topic);
            }
        }
        // Bounded: each queue holds at least one mapped file on its shard.
        let before = table.queue_total();
        let after = before - u64::from(current.unwrap_or(0)) + u64::from(queues.unwrap_or(0));
        if after > before && after > self.cfg.queues_max as u64 && capped {
            return Err(err(
                ErrorCode::LimitReached,
                format!(
                    "topics would hold {after} queues, past the broker's limit of {} (--queues-max); delete topics or use fewer queues",
                    self.cfg.queues_max
                ),
            ));
        }
        // Queues added to a topic (or a topic created, again perhaps) start at their first
        // message for the groups consuming it, before any member can see them (a failure
        // refuses the change).
        if let Some(q) = queues {
            let cur = current.unwrap_or(0);
            if q > cur {
                self.seed_added_queues(topic, cur..q).await?;
            }
        }
        // What a refused creation removes: none of the topic's queues was here before (a
        // topic missing from the table can still have queues recovery found on disk, with
        // records: those stay).
        let undo = current.is_none() && !self.store.holds_topic(topic);
        table.set(topic, queues);
        match queues {
            None => table.mark_deleting(topic),
            Some(_) if current.is_none() => self.stamp_creation(&mut table, topic),
            Some(_) => {}
        }
        // This shard's queues first, then the table saved: a failure refuses the change.
        let made = async {
            if let Some(count) = queues {
                self.open_local_queues(topic, count).await.map_err(|e| {
                    err(
                        ErrorCode::StoreIo,
                        format!("opening the queues of topic {topic}: {e}"),
                    )
                })?;
            }
            let (dir, saved) = (self.cfg.data_dir.clone(), table.clone());
            crate::io::blocking(move || saved.save(&dir))
                .await
                .map_err(|e| err(ErrorCode::StoreIo, format!("saving topics: {e}")))
        };
        let mut not_durable = None;
        if let Err(e) = made.await {
            // The save can fail after its rename (at the directory's fsync): the file holds
            // the change then, and a restart would go by it (a deletion's tombstone would
            // be finished while sends to the topic were still taken here). So the change
            // is refused only if the file does not hold it; else it is made, and answered
            // with the error.
            let (dir, want) = (self.cfg.data_dir.clone(), table.clone());
            let on_disk = crate::io::blocking(move || TopicTable::load(&dir).map(|t| t == want))
                .await
                .unwrap_or(false);
            if !on_disk {
                if undo {
                    self.undo_creation(topic).await;
                }
                return Err(e);
            }
            not_durable = Some(e);
        }
        *self.topics.borrow_mut() = table;
        let born = self.topics.borrow().born(topic);
        let applied_here = self.apply_topic_change(topic, queues, born).await;
        // Every shard is told, all at once: one slow or unreachable shard must not keep the
        // change from the others (the first failure is the answer). A shard whose call
        // failed is told again in the background until it takes the change.
        let told = futures_util::future::join_all((1..self.shard_count).map(|to| {
            self.call(
                to,
                MeshRequest::TopicChanged {
                    topic: topic.to_owned(),
                    queues,
                    born,
                },
            )
        }))
        .await;
        let mut first_failure = not_durable;
        if let Err(message) = applied_here {
            self.tell_again_later(self.id, topic);
            first_failure = Some(err(ErrorCode::StoreIo, message));
        }
        for (to, result) in (1..self.shard_count).zip(told) {
            if let Err(mut e) = result {
                self.tell_again_later(to, topic);
                e.message = format!(
                    "{} (the change to topic {topic} is saved; shard {to} is told again in the background)",
                    e.message
                );
                first_failure.get_or_insert(e);
            }
        }
        if queues.is_none() && first_failure.is_none() {
            self.forget_tombstone(topic).await;
        }
        first_failure.map_or(Ok(true), Err)
    }

    /// Shard 0, before a topic's creation or an update adds `added` queues to it: every
    /// group with an offset of the topic on any shard, or a live clustering member
    /// subscribed to it, gets an offset at the start of each added queue, on the queue's
    /// shard ([`ShardCtx::seed_offsets`]), durable before this returns. A member of such a
    /// group starts the queue there, not at the end it has by the time the member hears
    /// of it (it counts the queues only when it starts: a topic deleted and created again
    /// under it has queues it took for old).
    async fn seed_added_queues(
        self: &Rc<Self>,
        topic: &str,
        added: std::ops::Range<u32>,
    ) -> Result<(), ErrorBody> {
        let mut groups: std::collections::BTreeSet<String> =
            self.groups_of_topic(topic).into_iter().collect();
        for to in 1..self.shard_count {
            let ask = MeshRequest::GroupsOfTopic {
                topic: topic.to_owned(),
            };
            if let MeshReply::Groups(more) = self.call(to, ask).await? {
                groups.extend(more);
            }
        }
        let groups: Vec<String> = groups.into_iter().collect();
        if groups.is_empty() {
            return Ok(());
        }
        for shard in 0..self.shard_count {
            let queues: Vec<u32> = (added.clone())
                .filter(|&q| self.owner_of(topic, q) == shard)
                .collect();
            if queues.is_empty() {
                continue;
            }
            if shard == self.id {
                self.seed_offsets(topic, &queues, &groups).await?;
            } else {
                let seed = MeshRequest::SeedOffsets {
                    topic: topic.to_owned(),
                    queues,
                    groups: groups.clone(),
                };
                self.call(shard, seed).await?;
            }
        }
        Ok(())
    }

    /// The groups with an offset of `topic` kept here, and those this shard coordinates
    /// with a live clustering member subscribed to it.
    pub(super) fn groups_of_topic(&self, topic: &str) -> Vec<String> {
        let offsets = self.offsets.borrow();
        let coordinated = self.groups.borrow();
        let consuming = (coordinated.iter()).filter(|(_, (state, _))| state.consumes(topic));
        let groups: std::collections::BTreeSet<&str> = (offsets.groups_of_topic(topic))
            .chain(consuming.map(|(group, _)| group.as_str()))
            .collect();
        groups.into_iter().map(str::to_owned).collect()
    }

    /// Tells shard `to` again what the table says of `topic` (its queue count, or that it
    /// is gone; if it is gone and `tell_absent` is false, nothing is told: `Ok(None)`), and
    /// returns what was told.
    /// Handed to the shard's FIFO under the lock of topic changes, so no later change can
    /// overtake it; the answer is awaited after, so a slow shard does not hold every topic
    /// change.
    async fn tell_again(
        self: &Rc<Self>,
        to: u32,
        topic: &str,
        tell_absent: bool,
    ) -> Result<Option<Option<u32>>, ErrorBody> {
        let (told, queues) = {
            let _one_at_a_time = self.topic_changes.lock().await;
            let (queues, born) = {
                let table = self.topics.borrow();
                (table.get(topic), table.born(topic))
            };
            if queues.is_none() && !tell_absent {
                return Ok(None);
            }
            if to == self.id {
                // This shard (0) applied the change itself, and only a deletion's durable
                // steps can have failed: they run again while the topic stays deleted
                // (under the lock, as at the deletion: no topic change waits on another
                // shard here).
                if queues.is_none() {
                    let again = self.make_deletion_durable(topic).await;
                    again.map_err(|m| err(ErrorCode::StoreIo, m))?;
                }
                return Ok(Some(queues));
            }
            let change = MeshRequest::TopicChanged {
                topic: topic.to_owned(),
                queues,
                born,
            };
            (
                self.request(to, change, MESH_CALL_TIMEOUT_MS).await?,
                queues,
            )
        };
        told.await?;
        Ok(Some(queues))
    }

    /// A shard whose call to take a change of `topic` failed is told the topic's state
    /// again after [`TELL_AGAIN_FIRST_MS`], then at doubling intervals up to
    /// [`TELL_AGAIN_MAX_MS`], until it answers or the broker stops (one task per shard
    /// and topic).
    fn tell_again_later(self: &Rc<Self>, to: u32, topic: &str) {
        let key = (to, topic.to_owned());
        if !self.telling_again.borrow_mut().insert(key.clone()) {
            return;
        }
        let ctx = self.clone();
        crate::io::spawn(async move {
            let mut wait_ms = TELL_AGAIN_FIRST_MS;
            let (mut at_once, mut told_deletion) = (false, false);
            while !ctx.is_stopping() {
                if !at_once {
                    crate::io::sleep(std::time::Duration::from_millis(wait_ms)).await;
                }
                at_once = false;
                match ctx.tell_again(to, &key.1, true).await {
                    // The table may have changed since (a deletion whose failed telling
                    // found this task running, as another was told): the shard is told
                    // again until it has what the table says now.
                    Ok(told) if told != Some(ctx.topics.borrow().get(&key.1)) => {
                        at_once = true;
                        continue;
                    }
                    Ok(told) => {
                        told_deletion = told == Some(None);
                        break;
                    }
                    Err(e) => crate::warn!(
                        "ringmq: shard {}: telling shard {to} of topic {} again: {}",
                        ctx.id,
                        key.1,
                        e.message
                    ),
                }
                wait_ms = (wait_ms * 2).min(TELL_AGAIN_MAX_MS);
            }
            ctx.telling_again.borrow_mut().remove(&key);
            if told_deletion {
                let _one_at_a_time = ctx.topic_changes.lock().await;
                let done = !ctx.telling_again.borrow().iter().any(|(_, t)| *t == key.1);
                if done && ctx.topics.borrow().get(&key.1).is_none() {
                    ctx.forget_tombstone(&key.1).await;
                }
            }
        });
    }

    /// Shard 0, under the lock of topic changes, once every shard has made the deletion of
    /// `topic` durable: its tombstone goes from the table, and the name may be created
    /// again. If the table cannot be saved, the tombstone stays in memory (the name is
    /// reserved until the next start), and a start tells every shard again of the
    /// deletions the file holds tombstones of.
    async fn forget_tombstone(self: &Rc<Self>, topic: &str) {
        if !self.topics.borrow().is_deleting(topic) {
            return;
        }
        let mut table = self.topics.borrow().clone();
        table.forget_deleting(topic);
        let (dir, saved) = (self.cfg.data_dir.clone(), table.clone());
        match crate::io::blocking(move || saved.save(&dir)).await {
            Ok(()) => *self.topics.borrow_mut() = table,
            Err(e) => crate::warn!(
                "ringmq: shard {}: the deletion of topic {topic} is durable, but saving the topic table failed: {e}; the name stays reserved until the next start",
                self.id
            ),
        }
    }

    /// A creation refused after this shard opened some of the new topic's queues: they go
    /// (directories and files), or they would hold files and maps outside every cap with no
    /// topic to delete them by. Only for a topic none of whose queues was here before; a
    /// grown topic keeps its new queues: empty, and the table names them once the growth is
    /// tried again.
    async fn undo_creation(&self, topic: &str) {
        if let Err(e) = self.store.delete_topic(topic).await {
            crate::warn!(
                "ringmq: shard {}: removing the queues of {topic}, whose creation failed: {e}",
                self.id
            );
        }
    }

    /// The topic's queue count, creating the topic if allowed. Another shard's table
    /// lacking the topic asks shard 0 even when it may not create it: the shard may have
    /// missed the creation (shard 0's call failed or timed out), and is told again.
    pub(super) async fn ensure_topic(self: &Rc<Self>, topic: &str) -> Result<u32, ErrorBody> {
        if let Some(q) = self.topics.borrow().get(topic) {
            return Ok(q);
        }
        let create = self.cfg.auto_create_topics;
        if !create {
            return self.refresh_topic(topic).await;
        }
        validate_topic(topic).map_err(store_error)?;
        let queues = self.cfg.default_queues;
        if self.id != 0 {
            self.call(
                0,
                MeshRequest::EnsureTopic {
                    topic: topic.to_owned(),
                    queues,
                    origin: NewTopic::Auto,
                    create: true,
                },
            )
            .await?;
        } else {
            self.set_topic(topic, Some(queues), true, NewTopic::Auto)
                .await?;
        }
        // Created, then deleted before this request could use it: a race with an admin,
        // which a retry settles.
        self.topics
            .borrow()
            .get(topic)
            .ok_or_else(|| deleted_while_created(topic))
    }

    /// The topic's queue count after asking shard 0 (from another shard) to tell this one
    /// again if the topic exists: for a topic this shard's table lacks, or a queue past its
    /// count (a creation or growth it missed). Not found if shard 0 does not know it either,
    /// or does not answer within [`REFRESH_TIMEOUT_MS`] (this shard's table is the answer
    /// then).
    /// Requests that need a topic this shard is asking about already wait for that ask's
    /// answer rather than ask again.
    pub(super) async fn refresh_topic(self: &Rc<Self>, topic: &str) -> Result<u32, ErrorBody> {
        if self.id != 0 {
            let in_flight = self.asking.borrow().get(topic).cloned();
            match in_flight {
                // Created before anything can wake it, so the answer cannot be missed.
                Some(answered) => answered.notified().await,
                None => {
                    let answered = Rc::new(tokio::sync::Notify::new());
                    self.asking.borrow_mut().insert(topic.to_owned(), answered);
                    let _wakes_the_others = Asking { ctx: self, topic };
                    let ask = MeshRequest::EnsureTopic {
                        topic: topic.to_owned(),
                        queues: 0,
                        origin: NewTopic::Auto,
                        create: false,
                    };
                    if let Err(e) = self.call_with_timeout(0, ask, REFRESH_TIMEOUT_MS).await {
                        let shard = self.id;
                        tracing::debug!(target: "ringmq", "shard {shard}: asking about {topic}: {}", e.message);
                    }
                }
            }
        }
        self.topics
            .borrow()
            .get(topic)
            .ok_or_else(|| not_found_no_auto_create(topic))
    }

    /// [`known_queue`](Self::known_queue), after asking shard 0 (from another shard) when
    /// this shard's table lacks the topic or the queue: it may have missed their creation
    /// or growth (shard 0's call to it failed). Pulls and offset requests heal as sends do.
    pub(super) async fn learn_queue(
        self: &Rc<Self>,
        topic: &str,
        queue_id: u32,
    ) -> Result<(), ErrorBody> {
        let known = self.known_queue(topic, queue_id);
        if known.is_err() && self.id != 0 {
            // Not found here either is the known_queue error below.
            let _ = self.refresh_topic(topic).await;
            return self.known_queue(topic, queue_id);
        }
        known
    }

    /// On shard 0: `EnsureTopic` from shard `asker`, whose table lacks `topic`. Creates it
    /// if `create` says so and it does not exist (every shard is told); if it existed, the
    /// asker missed a change and is told again. The telling happens under the lock of
    /// topic changes, so a deletion cannot reach the asker before it.
    pub(super) async fn ensure_topic_for(
        self: &Rc<Self>,
        asker: u32,
        topic: &str,
        create: Option<(u32, NewTopic)>,
    ) -> Result<(), ErrorBody> {
        if let Some((queues, origin)) = create {
            if self.set_topic(topic, Some(queues), true, origin).await? {
                if let Some((faulted, TopicChangeFault::SlowCreationAnswer(ms))) =
                    &self.cfg.testing_topic_change_fault
                {
                    if faulted == topic {
                        crate::io::sleep(std::time::Duration::from_millis(*ms)).await;
                    }
                }
                return Ok(());
            }
        } else if self.topics.borrow().get(topic).is_none() {
            // Most such asks are for names that do not exist (a typo, a deleted topic):
            // answered without waiting for the lock.
            return Err(not_found_no_auto_create(topic));
        }
        if self.tell_again(asker, topic, false).await?.is_some() {
            return Ok(());
        }
        Err(match create {
            None => not_found_no_auto_create(topic),
            // Deleted since it was found: a race with an admin, which a retry settles.
            Some(_) => deleted_while_created(topic),
        })
    }

    /// A topic change shard 0 tells this shard of. Applied in arrival order even though
    /// each awaits (opening queues, syncing): the turn is taken here, synchronously, so a
    /// creation whose call timed out on shard 0 cannot finish after the deletion sent next
    /// and bring the topic back here alone.
    pub(super) fn on_topic_changed(
        self: Rc<Self>,
        topic: String,
        queues: Option<u32>,
        born: u64,
    ) -> LocalBoxFuture<'static, MeshReply> {
        let turn = self.topic_turns.take();
        match self.testing_fault(&topic, queues) {
            None | Some(TopicChangeFault::SlowCreationAnswer(_)) => Box::pin(async move {
                turn.wait().await;
                // Told again what it already has (told again after asking while the first
                // telling was on its way): nothing to do, and no rebalance; but a deletion
                // told again may be one whose durable steps failed here: only those run.
                let (current, current_born) = {
                    let table = self.topics.borrow();
                    (table.get(&topic), table.born(&topic))
                };
                let applied = match (current, queues) {
                    (None, None) => self.make_deletion_durable(&topic).await,
                    _ if current == queues && current_born == born => Ok(()),
                    _ => self.apply_topic_change(&topic, queues, born).await,
                };
                match applied {
                    Ok(()) => MeshReply::Ack,
                    Err(message) => MeshReply::Failed(ErrorCode::StoreIo, message),
                }
            }),
            // The turn is dropped unused: the changes after it go on.
            Some(TopicChangeFault::Drop(_)) => Box::pin(async move {
                let message = format!("testing: the change to {topic} was dropped");
                MeshReply::Failed(ErrorCode::Internal, message)
            }),
            Some(TopicChangeFault::LateCreation(ms)) => {
                crate::io::spawn(async move {
                    turn.wait().await;
                    let since = std::time::Instant::now();
                    let late = std::time::Duration::from_millis(ms);
                    while !turn.later_taken() && since.elapsed() < late {
                        crate::io::sleep(std::time::Duration::from_millis(5)).await;
                    }
                    if let Err(message) = self.apply_topic_change(&topic, queues, born).await {
                        crate::warn!("ringmq: shard {}: {message}", self.id);
                    }
                });
                Box::pin(async { MeshReply::Ack })
            }
        }
    }

    /// Testing: how this shard mishandles a change to `topic` it is told of, if it does.
    fn testing_fault(&self, topic: &str, queues: Option<u32>) -> Option<TopicChangeFault> {
        let (faulted, fault) = self.cfg.testing_topic_change_fault.as_ref()?;
        if faulted != topic {
            return None;
        }
        match fault {
            TopicChangeFault::Drop(n) => {
                let seen = self.testing_changes_seen.get();
                self.testing_changes_seen.set(seen + 1);
                (seen == *n).then_some(*fault)
            }
            TopicChangeFault::LateCreation(_) => queues.is_some().then_some(*fault),
            // Shard 0's, in `ensure_topic_for`.
            TopicChangeFault::SlowCreationAnswer(_) => None,
        }
    }

    /// The topic's queue count, after asking shard 0 (from another shard) when this shard's
    /// table lacks it, as [`learn_queue`](Self::learn_queue) does.
    pub(super) async fn learn_topic(self: &Rc<Self>, topic: &str) -> Result<u32, ErrorBody> {
        let known = self.topics.borrow().get(topic);
        if let Some(count) = known {
            return Ok(count);
        }
        if self.id != 0 {
            if let Ok(count) = self.refresh_topic(topic).await {
                return Ok(count);
            }
        }
        Err(topic_not_found(topic))
    }

    /// Whether this shard's table lists the queue (see [`learn_queue`](Self::learn_queue)
    /// for requests that should first ask shard 0).
    pub(super) fn known_queue(&self, topic: &str, queue_id: u32) -> Result<(), ErrorBody> {
        match self.topics.borrow().get(topic) {
            None => Err(topic_not_found(topic)),
            Some(n) if queue_id >= n => Err(err(
                ErrorCode::QueueNotFound,
                format!("topic {topic} has {n} queues; no queue {queue_id}"),
            )),
            Some(_) => Ok(()),
        }
    }

    /// [`known_queue`](Self::known_queue) for a send that waited for its topic or its turn
    /// in the topic's line: a topic deleted meanwhile is `Conflict` when sends create topics
    /// (sent again, it creates the topic anew), as the send whose creation the deletion
    /// undid is told.
    pub(super) fn known_queue_after_wait(
        &self,
        topic: &str,
        queue_id: u32,
    ) -> Result<(), ErrorBody> {
        self.known_queue(topic, queue_id).map_err(|e| {
            if self.cfg.auto_create_topics && e.code == ErrorCode::TopicNotFound.as_u16() {
                deleted_while(topic, "this send waited")
            } else {
                e
            }
        })
    }

    /// `CreateTopic`: an existing topic is an error.
    pub(super) async fn create_topic(self: Rc<Self>, m: CreateTopic) -> Result<Empty, ErrorBody> {
        if self.cfg.testing_panic_topic.as_deref() == Some(m.topic.as_str()) {
            panic!(
                "testing: topic {} is --testing-panic-topic, shard {} panics",
                m.topic, self.id
            );
        }
        if !self
            .set_topic(&m.topic, Some(m.queue_count), true, NewTopic::Admin)
            .await?
        {
            return Err(err(
                ErrorCode::TopicExists,
                format!("topic {} exists", m.topic),
            ));
        }
        Ok(Empty {})
    }

    /// `UpdateTopic`: queue counts only grow.
    pub(super) async fn update_topic(self: Rc<Self>, m: UpdateTopic) -> Result<Empty, ErrorBody> {
        if self.topics.borrow().get(&m.topic).is_none() {
            return Err(err(
                ErrorCode::TopicNotFound,
                format!("topic {} does not exist", m.topic),
            ));
        }
        self.set_topic(&m.topic, Some(m.queue_count), false, NewTopic::Admin)
            .await?;
        Ok(Empty {})
    }

    pub(super) async fn delete_topic(self: Rc<Self>, m: DeleteTopic) -> Result<Empty, ErrorBody> {
        self.set_topic(&m.topic, None, false, NewTopic::Admin)
            .await?;
        Ok(Empty {})
    }

    /// `DescribeTopic`: the range of every queue, gathered from the shards that own them.
    /// A topic this shard's table lacks is asked of shard 0 first, as sends do (and, with
    /// `create`, created as a send would create it).
    pub(super) async fn describe_topic(
        self: Rc<Self>,
        topic: String,
        create: bool,
    ) -> Result<TopicInfo, ErrorBody> {
        if create {
            self.ensure_topic(&topic).await?;
        }
        self.learn_topic(&topic).await?;
        let mut ranges = self.local_ranges(&topic)?;
        for to in (0..self.shard_count).filter(|&s| s != self.id) {
            let req = MeshRequest::QueueRanges {
                topic: topic.clone(),
            };
            if let MeshReply::Ranges(r) = self.call(to, req).await? {
                ranges.extend(r);
            }
        }
        ranges.sort_unstable();
        let queues = ranges
            .into_iter()
            .map(|(queue_id, min_offset, max_offset)| QueueInfo {
                queue_id,
                min_offset,
                max_offset,
            })
            .collect();
        Ok(TopicInfo { topic, queues })
    }
}

fn topic_not_found(topic: &str) -> ErrorBody {
    err(
        ErrorCode::TopicNotFound,
        format!(
            "topic {} does not exist",
            crate::protocol::names::shown(topic)
        ),
    )
}

fn not_found_no_auto_create(topic: &str) -> ErrorBody {
    err(
        ErrorCode::TopicNotFound,
        format!("topic {topic} does not exist (auto-create is off)"),
    )
}

fn deleted_while_created(topic: &str) -> ErrorBody {
    deleted_while(topic, "it was being created")
}

/// `Conflict`: sent again, the request creates the topic anew.
fn deleted_while(topic: &str, what: &str) -> ErrorBody {
    err(
        ErrorCode::Conflict,
        format!("topic {topic} was deleted while {what}; try again"),
    )
}

/// An ask about a topic in flight (`refresh_topic`): once it is answered, or given up
/// when its request goes, the requests waiting on it look at the table again.
struct Asking<'a> {
    ctx: &'a ShardCtx,
    topic: &'a str,
}

impl Drop for Asking<'_> {
    fn drop(&mut self) {
        if let Some(answered) = self.ctx.asking.borrow_mut().remove(self.topic) {
            answered.notify_waiters();
        }
    }
}
