//! The tag hash stored in every consume-queue entry.
//!
//! The broker filters by tag by comparing these hashes without reading the commit log, and
//! the client re-checks the tag string. The hash is stored on disk, so the function below is
//! a format: it must never change across versions.

/// The tag hash of a message without a tag. [`tag_hash`] never returns it.
pub const TAG_HASH_NONE: u64 = 0;

const FNV1A64_OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
const FNV1A64_PRIME: u64 = 0x0000_0100_0000_01b3;

/// FNV-1a, 64 bits. Also used for key-index hashing: cheap, stable and good enough for
/// short strings; collisions are resolved by the caller reading the message.
pub(crate) fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut hash = FNV1A64_OFFSET_BASIS;
    for &byte in bytes {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(FNV1A64_PRIME);
    }
    hash
}

/// The stable 64-bit hash of a tag, stored in consume-queue entries.
///
/// Never [`TAG_HASH_NONE`]: a real tag hashing to 0 is mapped to 1, so "no tag" stays
/// distinguishable (at the cost of one extra collision the client re-check resolves).
pub fn tag_hash(tag: &str) -> u64 {
    match fnv1a64(tag.as_bytes()) {
        TAG_HASH_NONE => 1,
        hash => hash,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(tag: &str, expected: u64) {
        assert_eq!(tag_hash(tag), expected, "tag {tag:?}");
    }

    #[test]
    fn known_values_never_change() {
        // Published FNV-1a 64 test vectors; these values are on disk, so they are frozen.
        check("", 0xcbf2_9ce4_8422_2325);
        check("a", 0xaf63_dc4c_8601_ec8c);
        check("foobar", 0x8594_4171_f739_67e8);
    }

    #[test]
    fn never_none() {
        for i in 0..10_000u32 {
            assert_ne!(tag_hash(&format!("tag-{i}")), TAG_HASH_NONE);
        }
    }

    #[test]
    fn distinct_tags_distinct_hashes() {
        assert_ne!(tag_hash("TagA"), tag_hash("TagB"));
        assert_eq!(tag_hash("TagA"), tag_hash("TagA"));
    }
}
