//! Queue ownership: which shard of a broker owns a (topic, queue), which coordinates a
//! group, and where each request goes ([`Route`]). Part of the wire contract: a shard-aware
//! client computes it to send each request straight to the owner.

use super::msg_id::MessageId;

/// Where a request is handled, as the registry declares it for each kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route<'a> {
    /// By the shard that read it (it may fan out to the others itself).
    Local,
    /// By the keeper of the topic table (shard 0).
    TopicKeeper,
    /// By the owner of the queue.
    Queue { topic: &'a str, queue_id: u32 },
    /// By the group's coordinator shard.
    Coordinator(&'a str),
    /// By the shard named in the message id (locally when the id names no shard here: the
    /// handler answers with the error the id deserves).
    MessageId(&'a str),
}

/// The shard that keeps the topic table.
pub const TOPIC_KEEPER_SHARD: u32 = 0;

impl<'a> Route<'a> {
    pub fn queue(topic: &'a str, queue_id: u32) -> Route<'a> {
        Route::Queue { topic, queue_id }
    }

    /// A queue when one is named; `QUEUE_ID_ANY` (negative) leaves it to the shard that
    /// reads the request.
    pub fn queue_or_local(topic: &'a str, queue_id: i32) -> Route<'a> {
        match u32::try_from(queue_id) {
            Ok(q) => Route::queue(topic, q),
            Err(_) => Route::Local,
        }
    }

    /// The shard that handles the request, or `None` for the one that read it.
    pub fn shard(&self, shard_count: u32) -> Option<u32> {
        match *self {
            Route::Local => None,
            Route::TopicKeeper => Some(TOPIC_KEEPER_SHARD),
            Route::Queue { topic, queue_id } => Some(owner(topic, queue_id, shard_count)),
            Route::Coordinator(group) => Some(coordinator_shard(group, shard_count)),
            Route::MessageId(id) => MessageId::parse(id)
                .ok()
                .map(|id| id.store_id)
                .filter(|&s| s < shard_count),
        }
    }
}

/// FNV-1a 64 of `bytes`.
pub fn fnv1a_64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The tag hash of a message without a tag; [`tag_hash`] never returns it.
pub const TAG_HASH_NONE: u64 = 0;

/// The hash of a tag as stored in consume-queue entries and sent in pull filters: FNV-1a 64;
/// a tag hashing to [`TAG_HASH_NONE`] is mapped to 1 so "no tag" stays distinct. Stored on
/// disk, so it must never change.
pub fn tag_hash(tag: &str) -> u64 {
    match fnv1a_64(tag.as_bytes()) {
        TAG_HASH_NONE => 1,
        hash => hash,
    }
}

/// The shard that owns queue `queue_id` of `topic`. Consecutive queues of one topic go to
/// consecutive shards, so a topic's queues spread evenly over all shards; the topic hash
/// staggers where each topic starts.
pub fn owner(topic: &str, queue_id: u32, shard_count: u32) -> u32 {
    assert!(shard_count > 0, "owner: shard_count must be at least 1");
    (fnv1a_64(topic.as_bytes()) as u32).wrapping_add(queue_id) % shard_count
}

/// The shard that coordinates `group`: FNV-1a 64 of the name modulo the shard count.
pub fn coordinator_shard(group: &str, shard_count: u32) -> u32 {
    assert!(
        shard_count > 0,
        "coordinator_shard: shard_count must be at least 1"
    );
    (fnv1a_64(group.as_bytes()) % u64::from(shard_count)) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_name_the_right_shard() {
        let shards = 3;
        assert_eq!(Route::Local.shard(shards), None);
        assert_eq!(Route::TopicKeeper.shard(shards), Some(0));
        assert_eq!(
            Route::queue("t", 5).shard(shards),
            Some(owner("t", 5, shards))
        );
        assert_eq!(Route::queue_or_local("t", -1), Route::Local);
        assert_eq!(Route::queue_or_local("t", 2), Route::queue("t", 2));
        assert_eq!(
            Route::Coordinator("g").shard(shards),
            Some(coordinator_shard("g", shards))
        );
        let id = MessageId {
            broker_id: 0,
            store_id: 2,
            physical_offset: 77,
        }
        .to_string();
        assert_eq!(Route::MessageId(&id).shard(shards), Some(2));
        assert_eq!(Route::MessageId(&id).shard(2), None, "no shard 2 of 2");
        assert_eq!(Route::MessageId("not an id").shard(shards), None);
    }

    #[test]
    fn queues_spread_evenly() {
        for shards in 1..=5u32 {
            for topic in ["a", "orders", "%RETRY%g"] {
                let mut counts = vec![0u32; shards as usize];
                for q in 0..16 {
                    counts[owner(topic, q, shards) as usize] += 1;
                }
                let (min, max) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
                assert!(max - min <= 1, "{topic} over {shards}: {counts:?}");
            }
        }
    }
}
