//! Consumer groups on the broker: membership on the group's coordinator shard, assignment
//! pushed to members at once on every change, queue locks kept by the owning shards and
//! released at once when a member leaves, offset resets and consumer progress.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::rc::Rc;

use super::groups::{
    coordinator_shard, ConsumeMode, GroupState, MemberInfo, MessageModel, Strategy, Subscription,
};
use super::topics::QUEUES_PER_TOPIC_MAX;
use super::{err, store_error, LocalBoxFuture, MeshReply, MeshRequest, ShardCtx};
use crate::protocol::{
    encode_frame, Assignment, ConsumerProgress, DeleteGroup, Empty, ErrorBody, ErrorCode, Flags,
    GroupHeartbeat, GroupMembers, GroupMembersInfo, LockBatch, Locked, MemberAssignment, Progress,
    QueryAssignment, QueueProgress, RebalanceNotify, ResetOffset, Response, TopicAssignment,
    UnlockBatch, Unregister, CONSUME_MODE_ORDERLY, MESSAGE_MODEL_BROADCASTING,
};

/// Bits of a connection id that hold the shard: `shard << CONN_SHARD_SHIFT | counter`.
pub const CONN_SHARD_SHIFT: u32 = 48;

/// Most consumer groups whose members one connection carries.
pub const GROUPS_PER_CONNECTION_MAX: usize = 64;

/// The wall clock's milliseconds: offsets epochs, which must pass those of earlier broker
/// runs.
pub fn now_ms() -> u64 {
    crate::log::now_ms().max(0) as u64
}

/// Milliseconds on the monotonic clock, from the process's first call (one origin for
/// every shard): members' sessions and queue locks' expiry. A step of the wall clock
/// (NTP setting it at boot, an operator) would otherwise expire every member at once, or
/// keep a dead one's queues for as long as it stepped back.
pub fn steady_ms() -> u64 {
    u64::try_from(steady().as_millis()).unwrap_or(u64::MAX)
}

/// Nanoseconds on the same clock, never the same twice: the stamps that order lock
/// requests and releases made on different shards (`groups::locks`). Strictly increasing
/// over the process (a coarse clock source could otherwise give two the same stamp).
pub fn steady_ns() -> u64 {
    static LAST: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let now = u64::try_from(steady().as_nanos()).unwrap_or(u64::MAX);
    let ordering = std::sync::atomic::Ordering::SeqCst;
    let mut last = LAST.load(ordering);
    loop {
        let next = now.max(last.saturating_add(1));
        match LAST.compare_exchange_weak(last, next, ordering, ordering) {
            Ok(_) => return next,
            Err(seen) => last = seen,
        }
    }
}

fn steady() -> std::time::Duration {
    static ORIGIN: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    ORIGIN.get_or_init(std::time::Instant::now).elapsed()
}

/// The coordinator's record of a group beyond membership.
#[derive(Default)]
pub struct GroupExtra {
    /// The offsets epoch members are told ([`Assignment::offsets_epoch`]): the latest
    /// reset's, published once the reset's shards are done.
    pub offsets_epoch: u64,
    /// The latest epoch handed to a reset (published when it ends).
    pub reserved_epoch: u64,
}

impl GroupExtra {
    /// Whether the group ever had a reset (its epoch must then be kept: members compare it).
    fn had_reset(&self) -> bool {
        self.offsets_epoch != 0 || self.reserved_epoch != 0
    }
}

/// Lock operations fanned out to the owning shards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockOp {
    Lock,
    Unlock,
}

impl ShardCtx {
    /// A group the coordinator starts to keep.
    fn new_group(&self, group: &str) -> (GroupState, GroupExtra) {
        let state = GroupState::new(group.to_owned(), self.cfg.session_timeout_ms);
        (state, GroupExtra::default())
    }

    pub(super) fn coordinator_of(&self, group: &str) -> u32 {
        coordinator_shard(group, self.shard_count)
    }

    fn queue_counts(&self, topics: impl IntoIterator<Item = String>) -> BTreeMap<String, u32> {
        let table = self.topics.borrow();
        topics
            .into_iter()
            .filter_map(|t| table.get(&t).map(|n| (t, n)))
            .collect()
    }

    fn assignment_of(&self, group: &str, client_id: &str) -> Result<Assignment, ErrorBody> {
        let groups = self.groups.borrow();
        let Some((state, extra)) = groups.get(group) else {
            return Err(err(
                ErrorCode::GroupNotFound,
                format!("group {group} has no members"),
            ));
        };
        if state.member(client_id).is_none() {
            return Err(err(
                ErrorCode::GroupNotFound,
                format!("{client_id} is not a member of group {group}"),
            ));
        }
        let counts = self.queue_counts(state.topics());
        let all = state.assign(&counts);
        let topics = all
            .into_iter()
            .filter_map(|(topic, members)| {
                members.get(client_id).map(|queues| TopicAssignment {
                    topic,
                    queues: queues.clone(),
                })
            })
            .collect();
        Ok(Assignment {
            generation: state.generation(),
            offsets_epoch: extra.offsets_epoch,
            topics,
        })
    }

    /// Sends a frame to a client connection, wherever it is (best effort: notifications are
    /// hints, members also re-check periodically).
    /// Whether the frame was queued on the connection (false: gone, or holding too much).
    pub(super) async fn push_to(self: &Rc<Self>, conn: u64, frame: Vec<u8>) -> bool {
        let shard = (conn >> CONN_SHARD_SHIFT) as u32;
        if shard == self.id {
            let push = self.conns.borrow().get(&conn).cloned();
            push.is_some_and(|push| push(frame))
        } else {
            self.call(shard, MeshRequest::Push { conn, frame })
                .await
                .is_ok()
        }
    }

    /// Tells every member of `group` that its assignment changed.
    async fn notify_members(self: &Rc<Self>, group: &str) {
        self.stats.rebalances.set(self.stats.rebalances.get() + 1);
        let (generation, conns) = {
            let groups = self.groups.borrow();
            let Some((state, _)) = groups.get(group) else {
                return;
            };
            let conns: HashSet<u64> = state
                .members()
                .iter()
                .filter_map(|m| state.member(m).map(|i| i.connection))
                .collect();
            (state.generation(), conns)
        };
        let mut frame = Vec::new();
        let note = RebalanceNotify {
            group: group.to_owned(),
            generation,
        };
        if encode_frame(0, Flags::NONE, &note, &[], &mut frame).is_err() {
            return;
        }
        for conn in conns {
            let _ = self.push_to(conn, frame.clone()).await;
        }
    }

    /// Members left (taken out of the group at `decided`, a [`steady_ns`] stamp): release
    /// their locks on every shard at once, then rebalance the rest. A shard keeps the locks
    /// a client took again after `decided` (it rejoined while the release was on its way).
    async fn members_left(self: &Rc<Self>, group: &str, left: Vec<String>, decided: u64) {
        if left.is_empty() {
            return;
        }
        for client_id in &left {
            for to in 0..self.shard_count {
                let req = MeshRequest::ReleaseClient {
                    group: group.to_owned(),
                    client_id: client_id.clone(),
                    stamp: decided,
                };
                if to == self.id {
                    self.locks
                        .borrow_mut()
                        .release_client(group, client_id, decided);
                } else {
                    let _ = self.call(to, req).await;
                }
            }
        }
        // A group whose offsets were reset keeps its epoch (members compare it), so only a
        // group that never had a reset is forgotten.
        let empty = self
            .groups
            .borrow()
            .get(group)
            .is_some_and(|(s, extra)| s.is_empty() && !extra.had_reset());
        if empty {
            // Bounded memory: a group without members is forgotten (a new member starts a
            // new generation; offsets live with the queues, not here).
            self.groups.borrow_mut().remove(group);
            return;
        }
        self.notify_members(group).await;
    }

    /// Every second: members that missed their heartbeats leave.
    pub async fn expire_members(self: &Rc<Self>) {
        let now = steady_ms();
        let expired: Vec<(String, Vec<String>)> = self
            .groups
            .borrow_mut()
            .iter_mut()
            .map(|(g, (s, _))| (g.clone(), s.expire(now)))
            .filter(|(_, left)| !left.is_empty())
            .collect();
        // Once they are out (nothing awaited since): a lock request they made before is
        // older, and one made after a rejoin is newer.
        let decided = steady_ns();
        for (group, left) in expired {
            self.members_left(&group, left, decided).await;
        }
        self.locks.borrow_mut().purge_expired(now);
    }

    /// A client connection closed on this shard: its members leave their groups.
    pub fn connection_closed(self: &Rc<Self>, conn: u64) {
        self.conns.borrow_mut().remove(&conn);
        self.answers.close(conn);
        self.conn_frame_max.borrow_mut().remove(&conn);
        let Some(groups) = self.conn_groups.borrow_mut().remove(&conn) else {
            return;
        };
        for group in groups {
            let ctx = self.clone();
            crate::io::spawn(async move {
                let coordinator = ctx.coordinator_of(&group);
                if coordinator == ctx.id {
                    ctx.on_connection_closed(&group, conn).await;
                } else {
                    let _ = ctx
                        .call(coordinator, MeshRequest::ConnectionClosed { group, conn })
                        .await;
                }
            });
        }
    }

    pub(super) async fn on_connection_closed(self: &Rc<Self>, group: &str, conn: u64) {
        self.producer_connection_closed(group, conn);
        let left = match self.groups.borrow_mut().get_mut(group) {
            Some((s, _)) => s.connection_closed(conn),
            None => Vec::new(),
        };
        self.members_left(group, left, steady_ns()).await;
    }

    /// A topic's queue count changed: groups subscribed to it rebalance.
    pub(super) async fn topic_changed_for_groups(self: &Rc<Self>, topic: &str) {
        let affected: Vec<String> = self
            .groups
            .borrow_mut()
            .iter_mut()
            .filter(|(_, (s, _))| s.topics().contains(topic))
            .map(|(g, (s, _))| {
                s.bump();
                g.clone()
            })
            .collect();
        for g in affected {
            self.notify_members(&g).await;
        }
    }

    /// Records that `conn` carries members of `group` (to tell the coordinator when it
    /// closes); at most [`GROUPS_PER_CONNECTION_MAX`] groups per connection.
    pub(super) fn note_group_connection(&self, group: &str, conn: u64) -> Result<(), ErrorBody> {
        let mut conns = self.conn_groups.borrow_mut();
        let groups = conns.entry(conn).or_default();
        if !groups.contains(group) && groups.len() >= GROUPS_PER_CONNECTION_MAX {
            return Err(err(
                ErrorCode::LimitReached,
                format!(
                    "a connection may carry members of at most {GROUPS_PER_CONNECTION_MAX} groups"
                ),
            ));
        }
        groups.insert(group.to_owned());
        Ok(())
    }

    pub(super) fn group_heartbeat(
        self: &Rc<Self>,
        h: GroupHeartbeat,
        conn: u64,
    ) -> LocalBoxFuture<'static, Result<Response<'static>, ErrorBody>> {
        let ctx = self.clone();
        Box::pin(async move {
            let strategy: Strategy = h
                .strategy
                .parse()
                .map_err(|e: String| err(ErrorCode::InvalidMessage, e))?;
            if let Some(s) = h
                .subscriptions
                .iter()
                .find(|s| s.expression_type > crate::protocol::messages::EXPRESSION_SQL92)
            {
                return Err(err(
                    ErrorCode::BadFilterExpression,
                    format!(
                        "subscription to {}: unknown expression type {} (0: tags, 1: SQL92)",
                        s.topic, s.expression_type
                    ),
                ));
            }
            let mut member = MemberInfo {
                client_id: h.client_id.clone(),
                subscriptions: h
                    .subscriptions
                    .iter()
                    .map(|s| Subscription {
                        topic: s.topic.clone(),
                        expression: s.expression.clone(),
                        sql: s.expression_type == crate::protocol::messages::EXPRESSION_SQL92,
                    })
                    .collect(),
                mode: if h.consume_mode == CONSUME_MODE_ORDERLY {
                    ConsumeMode::Orderly
                } else {
                    ConsumeMode::Concurrent
                },
                model: if h.message_model == MESSAGE_MODEL_BROADCASTING {
                    MessageModel::Broadcasting
                } else {
                    MessageModel::Clustering
                },
                strategy,
                connection: conn,
            };
            // Measured against --group-members-mb as it is kept.
            member.normalize();
            // The request's own copy of what `member` now holds is not kept across the
            // waits below.
            let h = GroupHeartbeat {
                subscriptions: Vec::new(),
                strategy: String::new(),
                ..h
            };
            for s in &member.subscriptions {
                crate::store::validate_topic(&s.topic).map_err(store_error)?;
                s.check()
                    .map_err(|e| err(ErrorCode::BadFilterExpression, e))?;
            }
            // Members subscribe to their group's retry topic; it exists from the first
            // heartbeat on, so the rebalance gives its queue to a member at once.
            let retry = crate::protocol::names::retry_topic(&h.group);
            if member.subscriptions.iter().any(|s| s.topic == retry) {
                ctx.ensure_system_topic(&retry).await?;
            }
            let changed = {
                let mut groups = ctx.groups.borrow_mut();
                if !groups.contains_key(&h.group) && groups.len() >= ctx.cfg.groups_max {
                    return Err(err(
                        ErrorCode::LimitReached,
                        format!(
                            "shard {} coordinates {} groups, its limit (--groups-max); group {} cannot join",
                            ctx.id,
                            groups.len(),
                            h.group
                        ),
                    ));
                }
                let over = ctx.members_over_budget(&groups, &h.group, &member);
                let (state, extra) = groups
                    .entry(h.group.clone())
                    .or_insert_with(|| ctx.new_group(&h.group));
                let refused = match state.check_heartbeat(&member) {
                    Err(e) => Some(err(
                        match e {
                            super::groups::GroupError::ClientIdInUse { .. } => {
                                ErrorCode::ClientIdInUse
                            }
                            super::groups::GroupError::GroupFull { .. } => ErrorCode::LimitReached,
                            _ => ErrorCode::InvalidMessage,
                        },
                        e.to_string(),
                    )),
                    Ok(()) => over,
                };
                if let Some(e) = refused {
                    // A refused first heartbeat must not leave an empty group behind (one
                    // whose offsets were reset stays: its epoch is the one members need).
                    if state.is_empty() && !extra.had_reset() {
                        groups.remove(&h.group);
                    }
                    return Err(e);
                }
                let changed = state.heartbeat(member, steady_ms());
                if changed {
                    for line in state.differing_subscriptions(&h.client_id) {
                        crate::warn!(
                            "ringmq: group {}: members subscribe differently, {line}: each \
                             queue is filtered by its owner's expression, so a message only the \
                             other one matches is skipped on the queues a member owns; give a \
                             group's members the same subscriptions",
                            h.group
                        );
                    }
                }
                changed
            };
            if changed {
                ctx.notify_members(&h.group).await;
            }
            Ok(Response::Assignment(
                ctx.assignment_of(&h.group, &h.client_id)?,
            ))
        })
    }

    /// The refusal of a heartbeat that would take this shard's group members past
    /// `--group-members-mb`, if it would: one that joins a member or makes one larger. A
    /// member that stays as large (its refreshes) always goes on.
    fn members_over_budget(
        &self,
        groups: &HashMap<String, (GroupState, GroupExtra)>,
        group: &str,
        member: &MemberInfo,
    ) -> Option<ErrorBody> {
        let before = groups
            .get(group)
            .and_then(|(s, _)| s.member(&member.client_id))
            .map_or(0, MemberInfo::held_bytes);
        let after = member.held_bytes();
        if after <= before {
            return None;
        }
        let held: usize = groups.values().map(|(s, _)| s.held_bytes()).sum();
        let max = self.cfg.group_members_bytes_max;
        (held - before + after > max).then(|| {
            err(
                ErrorCode::LimitReached,
                format!(
                    "shard {} holds {held} bytes of consumer-group members, its limit is {max} \
                     (--group-members-mb); member {} of group {group} ({after} bytes) cannot \
                     join or grow until members leave",
                    self.id, member.client_id
                ),
            )
        })
    }

    pub(super) fn unregister(
        self: &Rc<Self>,
        u: Unregister,
    ) -> LocalBoxFuture<'static, Result<Response<'static>, ErrorBody>> {
        let ctx = self.clone();
        Box::pin(async move {
            let removed = match ctx.groups.borrow_mut().get_mut(&u.group) {
                Some((s, _)) => s.unregister(&u.client_id),
                None => false,
            };
            let decided = steady_ns();
            let left = if removed {
                vec![u.client_id.clone()]
            } else {
                Vec::new()
            };
            ctx.members_left(&u.group, left, decided).await;
            Ok(Response::Empty(crate::protocol::Empty {}))
        })
    }

    pub(super) fn query_assignment(
        &self,
        q: &QueryAssignment,
    ) -> Result<Response<'static>, ErrorBody> {
        Ok(Response::Assignment(
            self.assignment_of(&q.group, &q.client_id)?,
        ))
    }

    pub(super) fn group_members(&self, g: &GroupMembers) -> Result<Response<'static>, ErrorBody> {
        let groups = self.groups.borrow();
        let Some((state, _)) = groups.get(&g.group) else {
            return Ok(Response::GroupMembersInfo(GroupMembersInfo {
                group: g.group.clone(),
                generation: 0,
                members: Vec::new(),
            }));
        };
        let all = state.assign(&self.queue_counts(state.topics()));
        let members = state
            .members()
            .into_iter()
            .map(|m| MemberAssignment {
                topics: all
                    .iter()
                    .filter_map(|(t, ms)| {
                        ms.get(&m).map(|q| TopicAssignment {
                            topic: t.clone(),
                            queues: q.clone(),
                        })
                    })
                    .collect(),
                client_id: m,
            })
            .collect();
        Ok(Response::GroupMembersInfo(GroupMembersInfo {
            group: g.group.clone(),
            generation: state.generation(),
            members,
        }))
    }

    /// Lock or unlock queues on this shard (the queues must be owned here).
    pub(super) fn local_locks(
        &self,
        op: LockOp,
        group: &str,
        client_id: &str,
        topic: &str,
        queues: &[u32],
        stamp: u64,
    ) -> Result<Vec<u32>, ErrorBody> {
        let mut locks = self.locks.borrow_mut();
        match op {
            LockOp::Lock => {
                // Bounded like offsets: locks of at most `--groups-max` groups (a client
                // may lock under any group name, member or not).
                let now = steady_ms();
                if !locks.has_group(group) && locks.group_count() >= self.cfg.groups_max {
                    locks.purge_expired(now);
                    // Given-up locks are kept to refuse late lock requests; a group's
                    // locks given up still free its place at once.
                    if locks.group_count() >= self.cfg.groups_max {
                        locks.forget_given_up(now);
                    }
                    if locks.group_count() >= self.cfg.groups_max {
                        return Err(err(
                            ErrorCode::LimitReached,
                            format!(
                                "shard {} holds queue locks of {} groups, its limit (--groups-max); locks are given up by their holders, or lapse",
                                self.id,
                                locks.group_count()
                            ),
                        ));
                    }
                }
                Ok(locks.lock_batch(group, topic, queues, client_id, now, stamp))
            }
            LockOp::Unlock => {
                locks.unlock_batch(group, topic, queues, client_id, stamp);
                Ok(Vec::new())
            }
        }
    }

    /// Splits a lock request by owning shard and gathers the answers.
    pub(super) fn locks(
        self: &Rc<Self>,
        op: LockOp,
        group: String,
        client_id: String,
        topic: String,
        queues: Vec<u32>,
    ) -> LocalBoxFuture<'static, Result<Response<'static>, ErrorBody>> {
        let ctx = self.clone();
        // When the request was made, before anything is awaited: requests of one
        // connection are stamped in the order they came (`groups::locks`).
        let stamp = steady_ns();
        Box::pin(async move {
            if queues.len() > QUEUES_PER_TOPIC_MAX as usize {
                return Err(err(
                    ErrorCode::InvalidMessage,
                    format!(
                        "a lock request names {} queues; a topic has at most {QUEUES_PER_TOPIC_MAX}",
                        queues.len()
                    ),
                ));
            }
            let count = ctx.learn_topic(&topic).await?;
            let mut by_shard: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
            for q in queues {
                if q < count {
                    by_shard.entry(ctx.owner_of(&topic, q)).or_default().push(q);
                }
            }
            // A shard that fails (no room for the group's locks, unreachable) holds none of
            // its queues for the client: the others' are answered, not left locked under
            // an error the client takes for none held. Only if none is held is the failure
            // the answer.
            let mut held = Vec::new();
            let mut failed = None;
            for (shard, qs) in by_shard {
                let here = if shard == ctx.id {
                    ctx.local_locks(op, &group, &client_id, &topic, &qs, stamp)
                } else {
                    let req = MeshRequest::Locks {
                        op,
                        group: group.clone(),
                        client_id: client_id.clone(),
                        topic: topic.clone(),
                        queues: qs,
                        stamp,
                    };
                    ctx.call(shard, req).await.map(|reply| match reply {
                        MeshReply::Queues(q) => q,
                        _ => Vec::new(),
                    })
                };
                match here {
                    Ok(q) => held.extend(q),
                    Err(e) => {
                        failed.get_or_insert(e);
                    }
                }
            }
            if let Some(e) = failed {
                if op == LockOp::Unlock || held.is_empty() {
                    return Err(e);
                }
            }
            held.sort_unstable();
            Ok(match op {
                LockOp::Lock => Response::Locked(Locked { queues: held }),
                LockOp::Unlock => Response::Empty(crate::protocol::Empty {}),
            })
        })
    }

    pub(super) fn lock_batch(
        self: &Rc<Self>,
        l: LockBatch,
    ) -> LocalBoxFuture<'static, Result<Response<'static>, ErrorBody>> {
        self.locks(LockOp::Lock, l.group, l.client_id, l.topic, l.queues)
    }

    pub(super) fn unlock_batch(
        self: &Rc<Self>,
        u: UnlockBatch,
    ) -> LocalBoxFuture<'static, Result<Response<'static>, ErrorBody>> {
        self.locks(LockOp::Unlock, u.group, u.client_id, u.topic, u.queues)
    }

    /// This shard's part of a reset: every owned queue of the topic to the offset of the
    /// first message stored at or after the time. From when they are set on, the group's
    /// commits of positions read under an earlier offsets epoch than `epoch` are refused
    /// here (one on its way before is set over by the reset).
    pub(super) async fn local_reset(
        &self,
        group: &str,
        topic: &str,
        timestamp_ms: i64,
        epoch: u64,
    ) -> Result<(), ErrorBody> {
        self.offsets_admit(group)?;
        let queues = self.local_ranges(topic)?;
        if queues.is_empty() {
            return Ok(());
        }
        // Every queue's offset is looked up first (a lookup may wait for a read), then the
        // fence is checked and the offsets set with nothing awaited in between: a later
        // reset coming while this one waited would otherwise fence and set all the queues,
        // and this one then set the rest over it, mixing the two.
        let mut reset_to = Vec::with_capacity(queues.len());
        for (q, _, _) in queues {
            let offset = self.store.offset_by_timestamp(topic, q, timestamp_ms).await;
            reset_to.push((q, offset.map_err(store_error)?));
        }
        let fenced = self.offsets.borrow_mut().fence(group, topic, epoch);
        if let Err(later) = fenced {
            // Members re-read this shard's offsets under the later reset's epoch: these
            // would be taken for its.
            return Err(err(
                ErrorCode::Conflict,
                format!(
                    "a later reset of group {group}'s offsets of {topic} (epoch {later}) came first on shard {}; this one (epoch {epoch}) was not applied there",
                    self.id
                ),
            ));
        }
        for (q, offset) in reset_to {
            self.offsets.borrow_mut().reset(group, topic, q, offset);
        }
        self.offsets_durable().await?;
        Ok(())
    }

    pub(super) fn local_progress(
        &self,
        group: &str,
        topic: &str,
    ) -> Result<Vec<QueueProgress>, ErrorBody> {
        let ranges = self.local_ranges(topic)?;
        let offsets = self.offsets.borrow();
        Ok(ranges
            .into_iter()
            .map(|(queue_id, _, max)| {
                let committed = offsets.get(group, topic, queue_id);
                QueueProgress {
                    queue_id,
                    committed_offset: committed.map(|c| c as i64).unwrap_or(-1),
                    max_offset: max,
                    lag: max.saturating_sub(committed.unwrap_or(0)),
                }
            })
            .collect())
    }

    pub(super) fn reset_offset(
        self: &Rc<Self>,
        r: ResetOffset,
    ) -> LocalBoxFuture<'static, Result<Response<'static>, ErrorBody>> {
        let ctx = self.clone();
        Box::pin(async move {
            ctx.learn_topic(&r.topic).await?;
            // The reset's epoch, from the coordinator: each shard refuses commits of
            // positions read under an earlier one before it resets its queues (a member's
            // commit on its way would undo the reset), and members learn it only once every
            // shard is done, so what they re-read then is the reset offsets.
            let coordinator = ctx.coordinator_of(&r.group);
            let epoch = if coordinator == ctx.id {
                ctx.reserve_offsets_epoch(&r.group)?
            } else {
                let req = MeshRequest::ReserveOffsetsEpoch {
                    group: r.group.clone(),
                };
                match ctx.call(coordinator, req).await? {
                    MeshReply::Epoch(epoch) => epoch,
                    other => {
                        return Err(err(
                            ErrorCode::Internal,
                            format!("shard {coordinator} answered an epoch with {other:?}"),
                        ))
                    }
                }
            };
            let mut failed = None;
            for to in 0..ctx.shard_count {
                let reset = if to == ctx.id {
                    ctx.local_reset(&r.group, &r.topic, r.timestamp_ms, epoch)
                        .await
                } else {
                    let req = MeshRequest::ResetOffsets {
                        group: r.group.clone(),
                        topic: r.topic.clone(),
                        timestamp_ms: r.timestamp_ms,
                        epoch,
                    };
                    ctx.call(to, req).await.map(|_| ())
                };
                if let Err(e) = reset {
                    failed.get_or_insert(e);
                }
            }
            // Published even when a shard failed: members re-read what is committed now
            // (their commits at the old epoch are refused where the fence went up).
            if coordinator == ctx.id {
                ctx.offsets_were_reset(&r.group, epoch).await;
            } else {
                let req = MeshRequest::OffsetsReset {
                    group: r.group.clone(),
                    epoch,
                };
                if let Err(e) = ctx.call(coordinator, req).await {
                    return Err(err(
                        e.error_code().unwrap_or(ErrorCode::Internal),
                        format!(
                            "group {}'s offsets of {} were reset, but its members could not be told ({}); they commit none of its queues until a reset succeeds: run it again",
                            r.group, r.topic, e.message
                        ),
                    ));
                }
            }
            match failed {
                Some(e) => Err(e),
                None => Ok(Response::Empty(crate::protocol::Empty {})),
            }
        })
    }

    /// On the group's coordinator: the epoch of a reset that starts (later than any
    /// before it, and not earlier than the clock's milliseconds, so a broker restarted with
    /// members still holding an epoch of its previous run gives a later one).
    pub(super) fn reserve_offsets_epoch(&self, group: &str) -> Result<u64, ErrorBody> {
        let mut groups = self.groups.borrow_mut();
        if !groups.contains_key(group) && groups.len() >= self.cfg.groups_max {
            return Err(err(
                ErrorCode::LimitReached,
                format!(
                    "shard {} coordinates {} groups, its limit (--groups-max); group {group}'s offsets cannot be reset",
                    self.id,
                    groups.len()
                ),
            ));
        }
        let (_, extra) = groups
            .entry(group.to_owned())
            .or_insert_with(|| self.new_group(group));
        let epoch = now_ms().max(extra.reserved_epoch.max(extra.offsets_epoch) + 1);
        extra.reserved_epoch = epoch;
        Ok(epoch)
    }

    /// `DeleteGroup`, on the group's coordinator: refused while members are live, then
    /// every shard forgets the group's offsets and locks.
    pub(super) async fn delete_group(self: Rc<Self>, m: DeleteGroup) -> Result<Empty, ErrorBody> {
        let live = self
            .groups
            .borrow()
            .get(&m.group)
            .map_or(0, |(s, _)| s.len());
        if live > 0 {
            return Err(err(
                ErrorCode::Conflict,
                format!(
                    "group {} has {live} live member{}; stop them first",
                    m.group,
                    if live == 1 { "" } else { "s" }
                ),
            ));
        }
        self.groups.borrow_mut().remove(&m.group);
        for to in 0..self.shard_count {
            if to == self.id {
                self.forget_group(&m.group).await?;
            } else {
                let req = MeshRequest::ForgetGroup {
                    group: m.group.clone(),
                };
                self.call(to, req).await?;
            }
        }
        Ok(Empty {})
    }

    /// This shard's part of a group delete: offsets (written durably) and locks.
    pub(super) async fn forget_group(&self, group: &str) -> Result<(), ErrorBody> {
        self.locks.borrow_mut().forget_group(group);
        if !self.offsets.borrow().has_group(group) {
            // A reset that failed before writing offsets may have left a fence.
            if self.offsets.borrow_mut().unfence(group) == 0 {
                return Ok(());
            }
        } else {
            self.offsets.borrow_mut().forget_group(group);
        }
        self.offsets_durable().await
    }

    /// At a start, before connections are taken: each group's coordinator is told the
    /// epoch of the latest reset of its offsets this shard keeps (fences outlive restarts),
    /// so a member holding a position read before that reset learns the epoch from its
    /// assignment and re-reads the reset offsets, instead of having each commit refused.
    /// A coordinator that cannot be told is logged; a commit this shard refuses for the
    /// fence tells it again ([`Self::tell_coordinator_of_reset`]).
    pub async fn publish_fences(self: &Rc<Self>) {
        let fences = self.offsets.borrow().fences();
        for (group, epoch) in fences {
            self.tell_coordinator_of_reset(&group, epoch).await;
        }
    }

    /// Has `group`'s coordinator publish offsets epoch `epoch` (a reset fenced here) if it
    /// does not know it ([`Self::fence_seen`]): a member whose commit this shard refused for
    /// the fence then learns it from its assignment and re-reads its offsets, even when the
    /// coordinator forgot the reset (a restart). A coordinator that cannot be told is
    /// logged (the next refused commit tells it again).
    pub(super) async fn tell_coordinator_of_reset(self: &Rc<Self>, group: &str, epoch: u64) {
        let coordinator = self.coordinator_of(group);
        if coordinator == self.id {
            self.fence_seen(group, epoch).await;
            return;
        }
        let told = MeshRequest::FenceSeen {
            group: group.to_owned(),
            epoch,
        };
        if let Err(e) = self.call(coordinator, told).await {
            crate::warn!(
                "ringmq: shard {}: telling group {group}'s coordinator of its reset (epoch {epoch}): {}",
                self.id,
                e.message
            );
        }
    }

    /// On the group's coordinator: a shard keeps a fence at `epoch`. Published unless this
    /// coordinator reserved that epoch (or a later one) itself: a reset still running
    /// publishes its epoch only once every shard is done, since a member re-reading before
    /// then would take a shard's offsets from before the reset for after it.
    pub(super) async fn fence_seen(self: &Rc<Self>, group: &str, epoch: u64) {
        let reserved = (self.groups.borrow().get(group)).map_or(0, |(_, e)| e.reserved_epoch);
        if reserved < epoch {
            self.offsets_were_reset(group, epoch).await;
        }
    }

    /// On the group's coordinator: a reset at `epoch` is done; members re-read their
    /// offsets when they see it.
    /// Told again of an epoch already published, it changes nothing.
    pub(super) async fn offsets_were_reset(self: &Rc<Self>, group: &str, epoch: u64) {
        {
            let mut groups = self.groups.borrow_mut();
            // Kept even when the group went meanwhile: its shards refuse earlier epochs.
            let (state, extra) = groups
                .entry(group.to_owned())
                .or_insert_with(|| self.new_group(group));
            extra.reserved_epoch = extra.reserved_epoch.max(epoch);
            if extra.offsets_epoch >= epoch {
                return;
            }
            extra.offsets_epoch = epoch;
            state.bump();
        }
        self.notify_members(group).await;
    }

    pub(super) fn consumer_progress(
        self: &Rc<Self>,
        p: ConsumerProgress,
    ) -> LocalBoxFuture<'static, Result<Response<'static>, ErrorBody>> {
        let ctx = self.clone();
        Box::pin(async move {
            ctx.learn_topic(&p.topic).await?;
            let mut queues = ctx.local_progress(&p.group, &p.topic)?;
            for to in (0..ctx.shard_count).filter(|&s| s != ctx.id) {
                if let MeshReply::Progress(q) = ctx
                    .call(
                        to,
                        MeshRequest::Progress {
                            group: p.group.clone(),
                            topic: p.topic.clone(),
                        },
                    )
                    .await?
                {
                    queues.extend(q);
                }
            }
            queues.sort_by_key(|q| q.queue_id);
            Ok(Response::Progress(Progress {
                group: p.group,
                topic: p.topic,
                queues,
            }))
        })
    }
}
