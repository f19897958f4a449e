//! Offset resets (each shard's part, the coordinator's epochs), group deletion and
//! consumer progress.

use super::*;

impl ShardCtx {
    /// This shard's part of a reset: every owned queue of the topic to the offset of the
    /// first message stored at or after the time. From when they are set on, the group's
    /// commits of positions read under an earlier offsets epoch than `epoch` are refused
    /// here (one on its way before is set over by the reset).
    pub(in crate::broker) async fn local_reset(
        &self,
        group: &str,
        topic: &str,
        timestamp_ms: i64,
        epoch: u64,
    ) -> Result<(), ErrorBody> {
        let queues = self.local_ranges(topic)?;
        let ids: Vec<u32> = queues.iter().map(|&(q, _, _)| q).collect();
        self.offsets_admit(group, topic, &ids)?;
        if queues.is_empty() {
            return Ok(());
        }
        let born = self.topics.borrow().born(topic);
        // Every queue's offset is looked up first (a lookup may wait for a read), then the
        // fence is checked and the offsets set with nothing awaited in between: a later
        // reset coming while this one waited would otherwise fence and set all the queues,
        // and this one then set the rest over it, mixing the two.
        let mut reset_to = Vec::with_capacity(queues.len());
        for (q, _, _) in queues {
            let offset = self.store.offset_by_timestamp(topic, q, timestamp_ms).await;
            reset_to.push((q, offset.map_err(store_error)?));
        }
        // The lookups waited: a topic deleted meanwhile (its offsets forgotten here), or
        // deleted and created again, must not get the old topic's offsets, which a new
        // topic of the name would take for its own and skip messages below.
        let gone = {
            let topics = self.topics.borrow();
            topics.get(topic).is_none() || topics.born(topic) != born
        };
        if gone {
            return Err(err(
                ErrorCode::TopicNotFound,
                format!(
                    "topic {topic} was deleted while group {group}'s reset looked up its offsets on shard {}; nothing was reset there",
                    self.id
                ),
            ));
        }
        // Admitted again: other groups' resets may have taken the last places meanwhile.
        self.offsets_admit(group, topic, &ids)?;
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

    pub(in crate::broker) fn local_progress(
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

    pub(in crate::broker) fn reset_offset(
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
    pub(in crate::broker) fn reserve_offsets_epoch(&self, group: &str) -> Result<u64, ErrorBody> {
        if self.deleting_groups.borrow().contains(group) {
            // Its offsets set now would be forgotten on the shards the deletion has not
            // reached yet, the reset answered as done.
            return Err(err(
                ErrorCode::Conflict,
                format!("group {group} is being deleted; reset its offsets once that is done"),
            ));
        }
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
        // Fences from here on are this reset's, to be published.
        self.deleted_groups.borrow_mut().retain(|g| g != group);
        let (_, extra) = groups
            .entry(group.to_owned())
            .or_insert_with(|| self.new_group(group));
        let epoch = now_ms().max(extra.reserved_epoch.max(extra.offsets_epoch) + 1);
        extra.reserved_epoch = epoch;
        Ok(epoch)
    }

    /// `DeleteGroup`, on the group's coordinator: refused while members are live, then
    /// every shard forgets the group's offsets and locks.
    pub(in crate::broker) async fn delete_group(
        self: Rc<Self>,
        m: DeleteGroup,
    ) -> Result<Empty, ErrorBody> {
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
        if !self.deleting_groups.borrow_mut().insert(m.group.clone()) {
            return Err(err(
                ErrorCode::Conflict,
                format!("group {} is being deleted already", m.group),
            ));
        }
        // Until every shard has forgotten it (however this ends): a member joining
        // meanwhile would read offsets about to go, and commit none past them.
        let _deleting = Deleting {
            ctx: self.clone(),
            group: m.group.clone(),
        };
        self.groups.borrow_mut().remove(&m.group);
        // Every shard is told, even past one that failed (the first failure is answered:
        // the deletion is then to be done again).
        let mut failed = None;
        for to in 0..self.shard_count {
            let done = if to == self.id {
                self.forget_group(&m.group).await
            } else {
                let req = MeshRequest::ForgetGroup {
                    group: m.group.clone(),
                };
                self.call(to, req).await.map(drop)
            };
            if let Err(e) = done {
                failed.get_or_insert(e);
            }
        }
        // A shard may have told of its fence before it forgot it, and the entry made for
        // that (`fence_seen`) would hold a place under --groups-max for a group that is gone;
        // its word may also come after this (`deleted_groups`).
        self.groups.borrow_mut().remove(&m.group);
        let mut deleted = self.deleted_groups.borrow_mut();
        deleted.retain(|g| *g != m.group);
        if deleted.len() == super::DELETED_GROUPS_KEPT {
            deleted.pop_front();
        }
        deleted.push_back(m.group.clone());
        failed.map_or(Ok(Empty {}), Err)
    }

    /// This shard's part of a group delete: offsets (written durably) and locks.
    pub(in crate::broker) async fn forget_group(&self, group: &str) -> Result<(), ErrorBody> {
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
    pub(in crate::broker) async fn tell_coordinator_of_reset(
        self: &Rc<Self>,
        group: &str,
        epoch: u64,
    ) {
        if !self.offsets.borrow().is_fenced(group) {
            // Forgotten since (the group was deleted): told, it would be made again.
            return;
        }
        let delay = self.cfg.testing_fence_tell_delay_ms;
        if delay > 0 {
            crate::io::sleep(std::time::Duration::from_millis(delay)).await;
        }
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
    pub(in crate::broker) async fn fence_seen(self: &Rc<Self>, group: &str, epoch: u64) {
        if self.deleting_groups.borrow().contains(group) {
            // Its shards are forgetting their fences: nothing to publish.
            return;
        }
        if !self.groups.borrow().contains_key(group)
            && self.deleted_groups.borrow().iter().any(|g| g == group)
        {
            // Told before its shard forgot the fence in the group's deletion, and heard
            // after it (a reset since would have taken the group off this list).
            return;
        }
        let reserved = (self.groups.borrow().get(group)).map_or(0, |(_, e)| e.reserved_epoch);
        if reserved < epoch {
            self.offsets_were_reset(group, epoch).await;
        }
    }

    /// On the group's coordinator: a reset at `epoch` is done; members re-read their
    /// offsets when they see it.
    /// Told again of an epoch already published, it changes nothing.
    pub(in crate::broker) async fn offsets_were_reset(self: &Rc<Self>, group: &str, epoch: u64) {
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

    pub(in crate::broker) fn consumer_progress(
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

/// A group's deletion under way on its coordinator (heartbeats refused), ended when dropped.
struct Deleting {
    ctx: Rc<ShardCtx>,
    group: String,
}

impl Drop for Deleting {
    fn drop(&mut self) {
        self.ctx.deleting_groups.borrow_mut().remove(&self.group);
    }
}
