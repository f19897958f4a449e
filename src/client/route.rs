//! Routing rules the client shares with the broker: which shard owns a queue, and the tag
//! hash a pull filter carries.
//!
//! Both are part of the wire contract. [`owner`] is the broker's own function (from
//! `protocol::route`), so a shard-aware client and the broker never disagree on where a
//! queue lives; the tag hash is likewise `protocol::route::tag_hash`, pinned to published test vectors.

/// Standard FNV-1a 64 (offset basis 0xcbf29ce484222325, prime 0x100000001b3), and the
/// queue ownership function `(fnv1a_64(topic) as u32).wrapping_add(queue_id) % shard_count`.
///
/// One definition serves both sides: the broker's is re-exported here rather than copied,
/// so a shard-aware client and the broker cannot drift apart. Consecutive queues of a topic
/// land on consecutive shards (an even spread); the topic hash staggers where each topic
/// starts. `owner` panics on a shard count of 0; the client checks the handshake first.
pub use crate::protocol::route::{fnv1a_64, owner, tag_hash, TAG_HASH_NONE};

/// The queue a sharding key pins its messages to: same key and queue count, same queue.
pub fn queue_for_key(key: &str, queue_count: u32) -> u32 {
    assert!(
        queue_count > 0,
        "queue_for_key: queue_count must be at least 1"
    );
    // Fold the high half in: topics often have a power-of-two queue count, and the low bits
    // of FNV-1a alone mix less well than the whole word.
    let hash = fnv1a_64(key.as_bytes());
    ((hash ^ (hash >> 32)) % u64::from(queue_count)) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_tag(tag: &str, expected: u64) {
        assert_eq!(tag_hash(tag), expected, "tag {tag:?}");
    }

    #[test]
    fn tag_hash_matches_the_broker_vectors() {
        // The same frozen vectors as the broker's index::tag tests.
        check_tag("", 0xcbf2_9ce4_8422_2325);
        check_tag("a", 0xaf63_dc4c_8601_ec8c);
        check_tag("foobar", 0x8594_4171_f739_67e8);
        for i in 0..10_000u32 {
            assert_ne!(tag_hash(&format!("tag-{i}")), TAG_HASH_NONE);
        }
    }

    #[test]
    fn owner_is_the_documented_formula() {
        for topic in ["", "a", "orders", "%RETRY%group"] {
            for shards in 1..=7u32 {
                for queue in [0u32, 1, 5, u32::MAX] {
                    let expected = (fnv1a_64(topic.as_bytes()) as u32).wrapping_add(queue) % shards;
                    assert_eq!(owner(topic, queue, shards), expected);
                }
            }
        }
        // A frozen value: changing the function moves queues between shards on disk.
        assert_eq!(
            owner("foobar", 0, 1_000_000_007),
            0xf739_67e8 % 1_000_000_007
        );
    }

    #[test]
    fn a_16_queue_topic_spreads_evenly_over_2_to_5_shards() {
        for shards in 2..=5u32 {
            for topic in ["bench", "orders", "a", "%RETRY%g", "TopicTest"] {
                let mut counts = vec![0u32; shards as usize];
                for queue in 0..16 {
                    counts[owner(topic, queue, shards) as usize] += 1;
                }
                let min = counts.iter().min().copied().unwrap_or(0);
                let max = counts.iter().max().copied().unwrap_or(0);
                assert!(max - min <= 1, "{topic} over {shards} shards: {counts:?}");
            }
        }
    }

    #[test]
    fn queue_for_key_is_stable_and_spreads() {
        for queue_count in [1u32, 4, 8, 16] {
            let mut used = vec![false; queue_count as usize];
            for i in 0..1000 {
                let key = format!("order-{i}");
                let queue = queue_for_key(&key, queue_count);
                assert!(queue < queue_count);
                assert_eq!(queue_for_key(&key, queue_count), queue);
                used[queue as usize] = true;
            }
            assert!(used.iter().all(|u| *u), "{queue_count}: {used:?}");
        }
    }
}
