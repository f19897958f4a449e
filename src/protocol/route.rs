//! Queue ownership: which shard of a broker owns a (topic, queue). Part of the wire contract:
//! a shard-aware client computes it to send each request straight to the owner.

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

#[cfg(test)]
mod tests {
    use super::*;

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
