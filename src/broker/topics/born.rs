//! Creation stamps, and the positions they check. A topic deleted and created again under
//! its name starts its queues' offsets over, and a consumer that read the old topic holds
//! positions there (and commits them) that name offsets of the new queues: below their
//! end, the messages below the position would be skipped. Each creation is stamped
//! ([`TopicTable::born`]) with an incarnation later than every run of every shard started
//! before it and earlier than every run started after it, and a shard names the positions
//! it hands out in a topic created during its run by that stamp rather than by its run. A
//! position named by an incarnation earlier than its topic's stamp was read in an older
//! topic of the name.

use super::TopicTable;
use crate::broker::ShardCtx;
use crate::store::StoreError;

impl ShardCtx {
    /// At the start, once every shard's store is open: creation stamps this shard gives
    /// (shard 0 gives them) are later than `incarnation`, the latest of the shards' runs.
    pub fn stamp_creations_after(&self, incarnation: u64) {
        let last = self.topics.borrow().last_born();
        self.last_stamp.set(incarnation.max(last));
    }

    /// Shard 0: the stamp of a topic being created into `table`.
    pub(super) fn stamp_creation(&self, table: &mut TopicTable, topic: &str) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let stamp = now.max(self.last_stamp.get().saturating_add(1));
        self.last_stamp.set(stamp);
        table.set_born(topic, stamp);
    }

    /// What names a position read now in a queue of `topic` (`PullResult::incarnation`,
    /// `Offset::incarnation`): the topic's creation stamp if it was created during this
    /// run, else this run.
    pub(in crate::broker) fn position_incarnation(&self, topic: &str) -> u64 {
        self.incarnation_after(self.topics.borrow().born(topic))
    }

    /// [`Self::position_incarnation`] of a topic created at `born`.
    pub(in crate::broker) fn incarnation_after(&self, born: u64) -> u64 {
        self.incarnation.max(born)
    }

    /// Where a position `offset` in a queue of `topic` (created at `born`), named by
    /// `incarnation`, must go back to, if it must:
    /// - named before the topic was created (read in an older topic of the name): to the
    ///   queue's first kept message, when the position is past it; what the older topic's
    ///   offsets say of this one is nothing;
    /// - read under an earlier run past what a crash since kept: to that end
    ///   ([`MessageStore::lost_past`](crate::store::MessageStore::lost_past)).
    ///
    /// `None` when the position stands. Fails only when an index file cannot be mapped.
    pub(in crate::broker) fn position_moved(
        &self,
        topic: &str,
        queue_id: u32,
        offset: u64,
        incarnation: u64,
        born: u64,
    ) -> Result<Option<u64>, StoreError> {
        if incarnation != 0 && incarnation < born {
            let (min, _) = self.store.queue_range(topic, queue_id)?;
            return Ok((offset > min).then_some(min));
        }
        // Named by the stamp of a topic created during this run: read under this run.
        let run = if incarnation == born && born > self.incarnation {
            self.incarnation
        } else {
            incarnation
        };
        self.store.lost_past(topic, queue_id, offset, run)
    }
}
