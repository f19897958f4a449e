//! Consumer groups on the broker: membership on the group's coordinator shard, assignment
//! pushed to members at once on every change, queue locks kept by the owning shards and
//! released at once when a member leaves, offset resets and consumer progress. Here
//! membership and assignment; `locks` (queue locks split by owning shard) and `reset`
//! (offset resets, group deletion, consumer progress).

mod locks;
mod reset;

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

/// Most queue locks (entries of a group's queue, held, given up or lapsed) a shard keeps:
/// about 100 MiB. Past it, a request that would add entries is refused (`LimitReached`);
/// renewals of locks held are not.
pub const LOCKS_PER_SHARD_MAX: usize = 1 << 20;

/// Closed connections a coordinator remembers (the latest), for heartbeats that waited for
/// their group's retry topic while their connection closed: far more than can close during
/// one topic creation.
pub const CLOSED_CONNS_KEPT: usize = 4096;

/// How many times a shard tells a group's coordinator that a connection of the group
/// closed before it gives up (each call waits up to the mesh call timeout, a second apart).
const CLOSE_NOTICE_ATTEMPTS: u32 = 10;

/// Groups a coordinator remembers having deleted (`ShardCtx::deleted_groups`).
pub const DELETED_GROUPS_KEPT: usize = 1024;

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
    /// A clustering group's assignment as last computed, for every heartbeat and query
    /// until it changes.
    assigned: std::cell::RefCell<Option<Assigned>>,
}

/// A group's whole assignment (topic -> member -> queues, members given none left out),
/// kept while the group's generation and the queue counts it was computed from hold: each
/// heartbeat and assignment query asks for it, and computing it anew each time cost the
/// whole group's allocation (with consistent hashing, a ring of members × virtual nodes
/// per topic) for one member's part. The shard's caches together hold at most
/// [`ASSIGNMENTS_CACHED_BYTES_MAX`]; past it an assignment is computed for each call.
struct Assigned {
    generation: u64,
    counts: BTreeMap<String, u32>,
    all: BTreeMap<String, BTreeMap<String, Vec<u32>>>,
    /// What it holds, about, counted in `budget` (the shard's) until dropped.
    bytes: usize,
    budget: Rc<std::cell::Cell<usize>>,
}

impl Drop for Assigned {
    fn drop(&mut self) {
        self.budget.set(self.budget.get() - self.bytes);
    }
}

/// Most bytes of assignments a shard keeps computed ([`Assigned`]).
pub const ASSIGNMENTS_CACHED_BYTES_MAX: usize = 64 << 20;

/// About what `all` and `counts` hold in memory.
fn assigned_bytes(
    counts: &BTreeMap<String, u32>,
    all: &BTreeMap<String, BTreeMap<String, Vec<u32>>>,
) -> usize {
    let node = 64;
    let counts: usize = counts.keys().map(|t| t.len() + node).sum();
    let all: usize = (all.iter())
        .map(|(topic, members)| {
            let members: usize = (members.iter())
                .map(|(id, queues)| id.len() + node + 4 * queues.len())
                .sum();
            topic.len() + node + members
        })
        .sum();
    counts + all
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

    /// The queue counts of those of `topics` that exist: names copied only for those
    /// (members may subscribe to 256 topics each, existing or not).
    fn queue_counts<'a>(&self, topics: impl IntoIterator<Item = &'a str>) -> BTreeMap<String, u32> {
        let table = self.topics.borrow();
        let mut counts = BTreeMap::new();
        for topic in topics {
            if let Some(n) = table.get(topic) {
                counts.insert(topic.to_owned(), n);
            }
        }
        counts
    }

    fn assignment_of(&self, group: &str, client_id: &str) -> Result<Assignment, ErrorBody> {
        let groups = self.groups.borrow();
        let Some((state, extra)) = groups.get(group) else {
            return Err(err(
                ErrorCode::GroupNotFound,
                format!("group {group} has no members"),
            ));
        };
        let Some(member) = state.member(client_id) else {
            return Err(err(
                ErrorCode::GroupNotFound,
                format!("{client_id} is not a member of group {group}"),
            ));
        };
        let topics = if state.model() == MessageModel::Broadcasting {
            // Every queue of each topic it subscribes to: no other member's list is made
            // (nor kept: a clustering one kept from before goes).
            *extra.assigned.borrow_mut() = None;
            // (Subscriptions are kept sorted by topic, one per topic.)
            let counts = self.queue_counts(member.subscriptions.iter().map(|s| s.topic.as_str()));
            (member.subscriptions.iter())
                .map(|s| {
                    let count = counts.get(&s.topic).copied().unwrap_or(0);
                    TopicAssignment {
                        topic: s.topic.clone(),
                        queues: (0..count.min(QUEUES_PER_TOPIC_MAX)).collect(),
                    }
                })
                .collect()
        } else {
            let counts = self.queue_counts(state.topic_names());
            let mut assigned = extra.assigned.borrow_mut();
            let fresh = (assigned.as_ref())
                .is_some_and(|a| a.generation == state.generation() && a.counts == counts);
            // Computed for this call only when the shard keeps too many already.
            let mut computed = None;
            if !fresh {
                // The stale one's room first.
                *assigned = None;
                let mut all = state.assign(&counts);
                for members in all.values_mut() {
                    members.retain(|_, queues| !queues.is_empty());
                }
                let bytes = assigned_bytes(&counts, &all);
                let budget = &self.assigned_bytes;
                if budget.get() + bytes <= ASSIGNMENTS_CACHED_BYTES_MAX {
                    budget.set(budget.get() + bytes);
                    *assigned = Some(Assigned {
                        generation: state.generation(),
                        counts,
                        all,
                        bytes,
                        budget: budget.clone(),
                    });
                } else {
                    computed = Some(all);
                }
            }
            let all = computed.as_ref().or(assigned.as_ref().map(|a| &a.all));
            // Each topic it subscribes to, with the queues it was given (perhaps none).
            (member.subscriptions.iter())
                .map(|s| TopicAssignment {
                    topic: s.topic.clone(),
                    queues: (all.and_then(|all| all.get(&s.topic)))
                        .and_then(|members| members.get(client_id))
                        .cloned()
                        .unwrap_or_default(),
                })
                .collect()
        };
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
        // All at once: one after another, a member's connection on a busy shard held up
        // the others' notices, and the heartbeat answer that waits for them.
        let pushes = conns
            .into_iter()
            .map(|conn| self.push_to(conn, frame.clone()));
        futures_util::future::join_all(pushes).await;
    }

    /// Members left (taken out of the group at `decided`, a [`steady_ns`] stamp): release
    /// their locks on every shard at once, then rebalance the rest. A shard keeps the locks
    /// a client took again after `decided` (it rejoined while the release was on its way).
    async fn members_left(self: &Rc<Self>, group: &str, left: Vec<String>, decided: u64) {
        if left.is_empty() {
            return;
        }
        for client_id in &left {
            self.locks
                .borrow_mut()
                .release_client(group, client_id, decided);
        }
        // Every other shard at once (one slow shard held up the others' releases, one after
        // another), each told of every member that left in turn.
        let left = &left;
        let releases = (0..self.shard_count)
            .filter(|&to| to != self.id)
            .map(|to| async move {
                for client_id in left {
                    let req = MeshRequest::ReleaseClient {
                        group: group.to_owned(),
                        client_id: client_id.clone(),
                        stamp: decided,
                    };
                    let _ = self.call(to, req).await;
                }
            });
        futures_util::future::join_all(releases).await;
        // A group whose offsets were reset keeps its epoch (members compare it), so only a
        // group that never had a reset is forgotten.
        let empty = {
            let groups = self.groups.borrow();
            let empty = groups.get(group).filter(|(s, _)| s.is_empty());
            // Kept or not, its assignment has no one to ask for it.
            if let Some((_, extra)) = empty {
                *extra.assigned.borrow_mut() = None;
            }
            empty.is_some_and(|(_, extra)| !extra.had_reset())
        };
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
        // Before the waits below (mesh calls): lapsed locks stop counting against the
        // shard's bound every pass.
        self.locks.borrow_mut().purge_expired(now);
        for (group, left) in expired {
            self.members_left(&group, left, decided).await;
        }
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
                    return;
                }
                // Told until it is heard (it is idempotent; the coordinator acknowledges on
                // hearing it, before its members' departure runs): members would leave when
                // their sessions end anyway, but a transaction producer's registration has
                // no session, and stayed, checks sent to a connection that was gone.
                for attempt in 1..=CLOSE_NOTICE_ATTEMPTS {
                    let notice = MeshRequest::ConnectionClosed {
                        group: group.clone(),
                        conn,
                    };
                    match ctx.call(coordinator, notice).await {
                        Ok(_) => return,
                        Err(_) if ctx.is_stopping() => return,
                        Err(e) if attempt == CLOSE_NOTICE_ATTEMPTS => crate::warn!(
                            "ringmq: shard {}: telling shard {coordinator} that a connection of group {group} closed failed {attempt} times, the last: {}; its members leave when their sessions end, its producers stay registered",
                            ctx.id,
                            e.message
                        ),
                        Err(_) => crate::io::sleep(std::time::Duration::from_secs(1)).await,
                    }
                }
            });
        }
    }

    pub(super) async fn on_connection_closed(self: &Rc<Self>, group: &str, conn: u64) {
        {
            let mut closed = self.closed_conns.borrow_mut();
            if !closed.contains(&conn) {
                if closed.len() == CLOSED_CONNS_KEPT {
                    closed.pop_front();
                }
                closed.push_back(conn);
            }
        }
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
            .filter(|(_, (s, _))| s.subscribed(topic))
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
            // heartbeat on, so the rebalance gives its queue to a member at once. Made only
            // for a heartbeat that would be admitted: a refused one leaves no topic behind
            // (each is kept, and counts against --topics-max).
            let retry = crate::protocol::names::retry_topic(&h.group);
            if member.subscriptions.iter().any(|s| s.topic == retry)
                && ctx.topics.borrow().get(&retry).is_none()
            {
                {
                    let mut groups = ctx.groups.borrow_mut();
                    let new = !groups.contains_key(&h.group);
                    ctx.admit(&mut groups, &h.group, &member)?;
                    if new {
                        groups.remove(&h.group);
                    }
                }
                ctx.ensure_system_topic(&retry).await?;
                // Its connection's close, heard meanwhile, found no member to remove.
                if ctx.conn_closed(conn) || ctx.closed_conns.borrow().contains(&conn) {
                    return Err(super::answer::connection_closed());
                }
            }
            let changed = {
                let mut groups = ctx.groups.borrow_mut();
                ctx.admit(&mut groups, &h.group, &member)?;
                let Some((state, _)) = groups.get_mut(&h.group) else {
                    return Err(err(ErrorCode::ShardUnavailable, "the group vanished"));
                };
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
    /// Whether `member`'s heartbeat may join `group` (or stay in it): the shard's
    /// `--groups-max`, the group's own checks and the members' memory budget. The group is
    /// in `groups` after an `Ok` (perhaps made empty for it); a refused first heartbeat
    /// leaves no empty group behind (one whose offsets were reset stays: its epoch is the
    /// one members need).
    fn admit(
        &self,
        groups: &mut HashMap<String, (GroupState, GroupExtra)>,
        group: &str,
        member: &MemberInfo,
    ) -> Result<(), ErrorBody> {
        if self.deleting_groups.borrow().contains(group) {
            return Err(err(
                ErrorCode::Conflict,
                format!("group {group} is being deleted; join again once that is done"),
            ));
        }
        if !groups.contains_key(group) && groups.len() >= self.cfg.groups_max {
            return Err(err(
                ErrorCode::LimitReached,
                format!(
                    "shard {} coordinates {} groups, its limit (--groups-max); group {group} cannot join",
                    self.id,
                    groups.len(),
                ),
            ));
        }
        let over = self.members_over_budget(groups, group, member);
        let (state, extra) = groups
            .entry(group.to_owned())
            .or_insert_with(|| self.new_group(group));
        let refused = match state.check_heartbeat(member) {
            Err(e) => Some(err(
                match e {
                    super::groups::GroupError::ClientIdInUse { .. } => ErrorCode::ClientIdInUse,
                    super::groups::GroupError::GroupFull { .. } => ErrorCode::LimitReached,
                    _ => ErrorCode::InvalidMessage,
                },
                e.to_string(),
            )),
            Ok(()) => over,
        };
        if let Some(e) = refused {
            if state.is_empty() && !extra.had_reset() {
                groups.remove(group);
            }
            return Err(e);
        }
        Ok(())
    }

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

    /// Member `u.client_id` on connection `conn` leaves; one on another connection stays,
    /// and the request is refused with `ClientIdInUse` (see `GroupState::unregister`).
    pub(super) fn unregister(
        self: &Rc<Self>,
        u: Unregister,
        conn: u64,
    ) -> LocalBoxFuture<'static, Result<Response<'static>, ErrorBody>> {
        let ctx = self.clone();
        Box::pin(async move {
            let removed = match ctx.groups.borrow_mut().get_mut(&u.group) {
                Some((s, _)) => s
                    .unregister(&u.client_id, conn)
                    .map_err(|e| err(ErrorCode::ClientIdInUse, e.to_string()))?,
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
        let all = state.assign(&self.queue_counts(state.topic_names()));
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
}
