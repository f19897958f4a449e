//! Subscription tag expressions on the client: `*` (or empty) for every message, or
//! `A || B || C`.
//!
//! The broker's parser (`protocol::tag_filter`), so both ends agree by construction: the
//! consumer checks an expression before it is sent, so a typo fails at `subscribe` with a
//! clear error rather than at the first heartbeat. Pulls carry the tags' hashes ([`tag_hash`](super::route::tag_hash)); the broker
//! compares hashes, which can collide, so the client re-checks the strings
//! ([`TagExpression::matches`]).

use std::fmt;

use super::error::{ClientError, Result};
use crate::protocol::tag_filter::TagFilter;

pub use crate::protocol::tag_filter::{TAGS_PER_EXPRESSION_MAX, TAG_EXPRESSION_BYTES_MAX};

/// A parsed tag expression: the broker's own parser (`protocol::tag_filter::TagFilter`),
/// with the client's error type. Tags are kept sorted and distinct.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TagExpression(TagFilter);

impl TagExpression {
    /// Parses `*`, an empty expression, or tags joined by `||` (spaces around tags are
    /// trimmed). An empty tag (`A ||`, `|| B`), a single `|`, a `*` among tags, more than
    /// [`TAGS_PER_EXPRESSION_MAX`] tags or more than [`TAG_EXPRESSION_BYTES_MAX`] bytes are
    /// refused with [`ClientError::InvalidArgument`] naming the problem.
    pub fn parse(expression: &str) -> Result<TagExpression> {
        TagFilter::parse(expression)
            .map(TagExpression)
            .map_err(ClientError::InvalidArgument)
    }

    /// True for `*`: every message matches, with or without a tag.
    pub fn matches_all(&self) -> bool {
        self.0.matches_all()
    }

    /// The tags, sorted and distinct; empty for `*`.
    pub fn tags(&self) -> &[String] {
        self.0.tags()
    }

    /// The exact check of a message's tag. A message without a tag matches only `*`.
    pub fn matches(&self, tag: Option<&str>) -> bool {
        self.0.matches(tag)
    }
}

impl fmt::Display for TagExpression {
    /// The canonical expression: `*`, or the sorted tags joined by ` || `.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// What a subscription keeps: messages with some tags, or messages whose properties match
/// an SQL92 filter (`region = 'eu' AND amount > 100`; the grammar is in
/// [`crate::protocol::sql`]). Both are checked when made, so a typo fails at `subscribe`.
#[derive(Debug, Clone, PartialEq)]
pub enum MessageSelector {
    Tags(TagExpression),
    Sql(SqlExpression),
}

/// A checked SQL92 filter expression.
#[derive(Debug, Clone, PartialEq)]
pub struct SqlExpression {
    text: String,
}

impl SqlExpression {
    /// Parses `expression`; a bad one is [`ClientError::InvalidArgument`] with the column
    /// of the problem.
    pub fn parse(expression: &str) -> Result<SqlExpression> {
        crate::protocol::sql::SqlFilter::parse(expression)
            .map_err(|e| ClientError::InvalidArgument(e.to_string()))?;
        Ok(SqlExpression {
            text: expression.to_owned(),
        })
    }

    /// The expression as given.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl MessageSelector {
    /// A tag expression: `*` or `A || B`.
    pub fn by_tag(expression: &str) -> Result<MessageSelector> {
        TagExpression::parse(expression).map(MessageSelector::Tags)
    }

    /// An SQL92 filter over the messages' properties and `TAGS`.
    pub fn by_sql(expression: &str) -> Result<MessageSelector> {
        SqlExpression::parse(expression).map(MessageSelector::Sql)
    }

    /// The tags a pull asks for (empty: all, or an SQL filter).
    pub fn tags(&self) -> &[String] {
        match self {
            MessageSelector::Tags(t) => t.tags(),
            MessageSelector::Sql(_) => &[],
        }
    }

    /// The SQL92 expression a pull carries; empty for tags.
    pub fn sql(&self) -> &str {
        match self {
            MessageSelector::Tags(_) => "",
            MessageSelector::Sql(s) => s.as_str(),
        }
    }
}

impl fmt::Display for MessageSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MessageSelector::Tags(t) => t.fmt(f),
            MessageSelector::Sql(s) => write!(f, "SQL92 {}", s.as_str()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(expression: &str, expected_tags: Option<&[&str]>) {
        let parsed = TagExpression::parse(expression);
        match expected_tags {
            None => match parsed {
                Err(ClientError::InvalidArgument(why)) => {
                    assert!(why.contains("tag"), "{expression:?}: unclear error {why:?}")
                }
                other => panic!("{expression:?}: expected a refusal, got {other:?}"),
            },
            Some(tags) => {
                let parsed = parsed.unwrap_or_else(|e| panic!("{expression:?}: {e}"));
                assert_eq!(parsed.tags(), tags, "{expression:?}");
                assert_eq!(parsed.matches_all(), tags.is_empty());
                assert_eq!(TagExpression::parse(&parsed.to_string()).ok(), Some(parsed));
            }
        }
    }

    const GOOD: &[(&str, &[&str])] = &[
        ("*", &[]),
        ("", &[]),
        ("  * ", &[]),
        ("TagA", &["TagA"]),
        (" B ||A||  C ", &["A", "B", "C"]),
        ("A || A", &["A"]),
    ];
    const BAD: &[&str] = &[
        "A ||", "|| B", "A | B", "A |||| B", "||", "A || * ", "A ||| B", "|",
    ];

    #[test]
    fn parses_all_and_tag_lists() {
        for (expression, tags) in GOOD {
            check(expression, Some(tags));
        }
        for expression in BAD {
            check(expression, None);
        }
        let why = TagExpression::parse("A | B").unwrap_err().to_string();
        assert!(why.contains("`||`"), "{why}");
        let why = TagExpression::parse("A ||").unwrap_err().to_string();
        assert!(why.contains("tag 2") && why.contains("empty"), "{why}");
    }

    #[test]
    fn limits() {
        let many: Vec<String> = (0..=TAGS_PER_EXPRESSION_MAX)
            .map(|i| format!("t{i}"))
            .collect();
        assert!(TagExpression::parse(&many.join("||")).is_err());
        assert!(TagExpression::parse(&many[1..].join("||")).is_ok());
        assert!(TagExpression::parse(&"x".repeat(TAG_EXPRESSION_BYTES_MAX + 1)).is_err());
    }

    #[test]
    fn matching_by_string() {
        let all = TagExpression::parse("*").unwrap();
        assert!(all.matches(None) && all.matches(Some("x")));
        let some = TagExpression::parse("A || B").unwrap();
        assert!(some.matches(Some("A")) && some.matches(Some("B")));
        assert!(!some.matches(Some("C")) && !some.matches(None) && !some.matches(Some("a")));
    }

    /// Both ends of the boundary agree: what the client accepts, the broker accepts, with
    /// the same tags and hashes.
    #[cfg(feature = "broker")]
    #[test]
    fn agrees_with_the_broker_parser() {
        use crate::broker::groups::TagFilter;
        let long = "x".repeat(TAG_EXPRESSION_BYTES_MAX + 1);
        let mut expressions: Vec<&str> = GOOD.iter().map(|(e, _)| *e).collect();
        expressions.extend_from_slice(BAD);
        expressions.extend(["a||b||c", " x ", "*||*", long.as_str()]);
        for expression in expressions {
            let ours = TagExpression::parse(expression);
            let theirs = TagFilter::parse(expression);
            assert_eq!(ours.is_ok(), theirs.is_ok(), "{expression:?}");
            if let (Ok(ours), Ok(theirs)) = (ours, theirs) {
                assert_eq!(ours.tags(), theirs.tags(), "{expression:?}");
                let mut hashes: Vec<u64> = ours
                    .tags()
                    .iter()
                    .map(|t| super::super::route::tag_hash(t))
                    .collect();
                hashes.sort_unstable();
                hashes.dedup();
                assert_eq!(hashes, theirs.hashes(), "{expression:?}");
            }
        }
    }
}
