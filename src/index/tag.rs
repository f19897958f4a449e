//! The tag hash stored in every consume-queue entry.
//!
//! The broker filters by tag by comparing these hashes without reading the commit log, and
//! the client re-checks the tag string. The hash is stored on disk, so the function below is
//! a format: it must never change across versions.

/// The tag hash and its "no tag" value are part of the wire contract (pull filters carry
/// them), so they live in `protocol::route`; the index stores them.
pub use crate::protocol::route::{tag_hash, TAG_HASH_NONE};

/// FNV-1a, 64 bits, also used for key-index hashing: cheap, stable and good enough for
/// short strings; collisions are resolved by the caller reading the message.
pub(crate) use crate::protocol::route::fnv1a_64 as fnv1a64;

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
