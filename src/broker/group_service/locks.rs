//! Queue locks: kept by the shards that own the queues, a lock request split by owner.

use super::*;

impl ShardCtx {
    /// Lock or unlock queues on this shard (the queues must be owned here) for `client_id`
    /// on connection `conn` (see `LockTable::lock_batch`).
    #[allow(clippy::too_many_arguments)]
    pub(in crate::broker) fn local_locks(
        &self,
        op: LockOp,
        group: &str,
        client_id: &str,
        conn: u64,
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
                if !locks.has_room(group, topic, queues, LOCKS_PER_SHARD_MAX) {
                    return Err(err(
                        ErrorCode::LimitReached,
                        format!(
                            "shard {} keeps {} queue locks, its limit ({LOCKS_PER_SHARD_MAX}); locks are given up by their holders, or lapse",
                            self.id,
                            locks.len()
                        ),
                    ));
                }
                Ok(locks.lock_batch(group, topic, queues, client_id, conn, now, stamp))
            }
            LockOp::Unlock => {
                // Queues with no entry get a given-up one while there is room under the
                // same bounds as locks, and only in half of the entries' room: given-up
                // entries stay for the lock expiry, and a table they filled would refuse
                // lock requests until then.
                let remember = (locks.has_group(group)
                    || locks.group_count() < self.cfg.groups_max)
                    && locks.has_room(group, topic, queues, LOCKS_PER_SHARD_MAX / 2);
                locks.unlock_batch(group, topic, queues, client_id, conn, stamp, remember);
                Ok(Vec::new())
            }
        }
    }

    /// Splits a lock request by owning shard and gathers the answers.
    pub(in crate::broker) fn locks(
        self: &Rc<Self>,
        op: LockOp,
        group: String,
        client_id: String,
        conn: u64,
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
                    ctx.local_locks(op, &group, &client_id, conn, &topic, &qs, stamp)
                } else {
                    let req = MeshRequest::Locks {
                        op,
                        group: group.clone(),
                        client_id: client_id.clone(),
                        conn,
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

    pub(in crate::broker) fn lock_batch(
        self: &Rc<Self>,
        l: LockBatch,
        conn: u64,
    ) -> LocalBoxFuture<'static, Result<Response<'static>, ErrorBody>> {
        self.locks(LockOp::Lock, l.group, l.client_id, conn, l.topic, l.queues)
    }

    pub(in crate::broker) fn unlock_batch(
        self: &Rc<Self>,
        u: UnlockBatch,
        conn: u64,
    ) -> LocalBoxFuture<'static, Result<Response<'static>, ErrorBody>> {
        self.locks(
            LockOp::Unlock,
            u.group,
            u.client_id,
            conn,
            u.topic,
            u.queues,
        )
    }
}
