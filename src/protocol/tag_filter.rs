//! Tag expressions of subscriptions: `*` (or empty) for every message, or `A || B || C`.
//!
//! The broker filters with the tag hashes stored in consume-queue entries
//! ([`TagFilter::matches_hash`]); hashes can collide, so the client re-checks the tag string
//! ([`TagFilter::matches`]).

use std::fmt;

use crate::protocol::route::tag_hash;

/// Longest tag expression, in bytes.
pub const TAG_EXPRESSION_BYTES_MAX: usize = 4096;
/// Most tags in one expression.
pub const TAGS_PER_EXPRESSION_MAX: usize = 64;

/// A parsed tag expression. Tags are kept sorted and deduplicated, so two expressions with
/// the same tags compare equal whatever their order.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TagFilter {
    /// Empty: every message matches (`*`). Otherwise sorted, distinct, non-empty.
    tags: Vec<String>,
    /// `tag_hash` of each tag, sorted and distinct (two tags may share one).
    hashes: Vec<u64>,
}

impl TagFilter {
    /// The filter that lets every message through.
    pub fn all() -> TagFilter {
        TagFilter {
            tags: Vec::new(),
            hashes: Vec::new(),
        }
    }

    /// Parses `*`, an empty expression, or tags joined by `||` (spaces around tags are
    /// trimmed). An empty tag (`A ||`, `|| B`, `A |||| B`), a single `|`, a `*` among tags,
    /// more than [`TAGS_PER_EXPRESSION_MAX`] tags or more than
    /// [`TAG_EXPRESSION_BYTES_MAX`] bytes are errors.
    pub fn parse(expression: &str) -> Result<TagFilter, String> {
        if expression.len() > TAG_EXPRESSION_BYTES_MAX {
            return Err(format!(
                "tag expression is {} bytes; at most {TAG_EXPRESSION_BYTES_MAX} are allowed",
                expression.len()
            ));
        }
        let trimmed = expression.trim();
        if trimmed.is_empty() || trimmed == "*" {
            return Ok(TagFilter::all());
        }
        let mut tags = Vec::new();
        for (i, part) in trimmed.split("||").enumerate() {
            let tag = part.trim();
            let bad = |why: &str| {
                Err(format!(
                    "tag expression {expression:?}: tag {}: {why}",
                    i + 1
                ))
            };
            if tag.is_empty() {
                return bad("empty; write `*` for all tags or `A || B` for some");
            }
            if tag.contains('|') {
                return bad("contains `|`; tags are joined with `||`");
            }
            if tag == "*" {
                return bad("`*` must be the whole expression");
            }
            tags.push(tag.to_string());
        }
        tags.sort_unstable();
        tags.dedup();
        if tags.len() > TAGS_PER_EXPRESSION_MAX {
            return Err(format!(
                "tag expression has {} tags; at most {TAGS_PER_EXPRESSION_MAX} are allowed",
                tags.len()
            ));
        }
        let mut hashes: Vec<u64> = tags.iter().map(|t| tag_hash(t)).collect();
        hashes.sort_unstable();
        hashes.dedup();
        Ok(TagFilter { tags, hashes })
    }

    /// True for `*`: every message matches, with or without a tag.
    pub fn matches_all(&self) -> bool {
        self.tags.is_empty()
    }

    /// The tags, sorted and distinct; empty for `*`.
    pub fn tags(&self) -> &[String] {
        &self.tags
    }

    /// The tag hashes to compare with consume-queue entries, sorted and distinct; empty for
    /// `*`.
    pub fn hashes(&self) -> &[u64] {
        &self.hashes
    }

    /// The broker-side check on a consume-queue entry's tag hash (may let a colliding tag
    /// through; never drops a matching one).
    pub fn matches_hash(&self, hash: u64) -> bool {
        self.matches_all() || self.hashes.binary_search(&hash).is_ok()
    }

    /// The exact check on a message's tag (client side, and after a hash collision). A
    /// message without a tag matches only `*`.
    pub fn matches(&self, tag: Option<&str>) -> bool {
        if self.matches_all() {
            return true;
        }
        match tag {
            Some(tag) => self.tags.binary_search_by(|t| t.as_str().cmp(tag)).is_ok(),
            None => false,
        }
    }
}

impl fmt::Display for TagFilter {
    /// The canonical expression: `*`, or the sorted tags joined by ` || `.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.matches_all() {
            return f.write_str("*");
        }
        f.write_str(&self.tags.join(" || "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::route::TAG_HASH_NONE;

    fn check(expression: &str, expected_tags: Option<&[&str]>) {
        let f = TagFilter::parse(expression);
        match expected_tags {
            None => {
                let e = f.expect_err(expression);
                assert!(e.contains("tag"), "{expression:?}: unclear error {e:?}");
            }
            Some(tags) => {
                let f = f.unwrap_or_else(|e| panic!("{expression:?}: {e}"));
                assert_eq!(f.tags(), tags, "{expression:?}");
                assert_eq!(f.matches_all(), tags.is_empty());
                // The canonical form parses back to the same filter.
                assert_eq!(TagFilter::parse(&f.to_string()), Ok(f.clone()));
            }
        }
    }

    proptest::proptest! {
        /// Any expression parses to a filter whose canonical form parses back to it, or
        /// to an error; never a panic.
        #[test]
        fn fuzz_tag_expressions_never_panic(expression in "[ A-Za-z0-9|*_\\-\\u{80}-\\u{10ffff}]{0,80}") {
            if let Ok(f) = TagFilter::parse(&expression) {
                proptest::prop_assert_eq!(TagFilter::parse(&f.to_string()), Ok(f.clone()));
            }
        }
    }

    #[test]
    fn parses_all_and_tag_lists() {
        check("*", Some(&[]));
        check("", Some(&[]));
        check("  * ", Some(&[]));
        check("TagA", Some(&["TagA"]));
        check(" B ||A||  C ", Some(&["A", "B", "C"]));
        check("A || A", Some(&["A"]));
    }

    #[test]
    fn bad_expressions_are_errors() {
        for bad in [
            "A ||", "|| B", "A | B", "A |||| B", "||", "A || * ", "A ||| B", "|",
        ] {
            check(bad, None);
        }
        let e = TagFilter::parse("A | B").unwrap_err();
        assert!(e.contains("`||`"), "{e}");
        let e = TagFilter::parse("A ||").unwrap_err();
        assert!(e.contains("tag 2") && e.contains("empty"), "{e}");
    }

    #[test]
    fn limits() {
        let many: Vec<String> = (0..=TAGS_PER_EXPRESSION_MAX)
            .map(|i| format!("t{i}"))
            .collect();
        assert!(TagFilter::parse(&many.join("||")).is_err());
        assert!(TagFilter::parse(&many[1..].join("||")).is_ok());
        assert!(TagFilter::parse(&"x".repeat(TAG_EXPRESSION_BYTES_MAX + 1)).is_err());
    }

    #[test]
    fn matching_by_string_and_hash() {
        let all = TagFilter::parse("*").unwrap();
        assert!(all.matches(None) && all.matches(Some("x")));
        assert!(all.matches_hash(TAG_HASH_NONE) && all.hashes().is_empty());

        let f = TagFilter::parse("A || B").unwrap();
        assert!(f.matches(Some("A")) && f.matches(Some("B")));
        assert!(!f.matches(Some("C")) && !f.matches(None) && !f.matches(Some("a")));
        let mut expected = vec![tag_hash("A"), tag_hash("B")];
        expected.sort_unstable();
        assert_eq!(f.hashes(), expected);
        assert!(f.matches_hash(tag_hash("A")) && f.matches_hash(tag_hash("B")));
        assert!(!f.matches_hash(tag_hash("C")) && !f.matches_hash(TAG_HASH_NONE));
    }
}
