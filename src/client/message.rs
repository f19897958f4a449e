//! Messages as the client sees them: [`OutgoingMessage`], what a producer sends, and
//! [`Message`], a stored record received from the broker and read in place.
//!
//! A received message owns a reference-counted slice of the frame it came in: the records
//! of one pull answer share that frame's single buffer, nothing is copied per record, and
//! every field is read from the record's fixed header through [`RecordView`].

use bytes::Bytes;

use crate::protocol::record::{
    prop, Properties, PropertiesBuilder, RecordView, BODY_BYTES_MAX, CLIENT_PROPERTIES_BYTES_MAX,
    KEYS_PER_MESSAGE_MAX, PROPERTIES_BYTES_MAX, TOPIC_BYTES_MAX,
};
use crate::protocol::MessageId;

use super::error::{ClientError, Result};

/// A message to send. Build it with [`OutgoingMessage::new`] and the `with_*` methods.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OutgoingMessage {
    pub body: Vec<u8>,
    /// The tag consumers filter on (`TAGS`).
    pub tags: Option<String>,
    /// Keys for lookups by key (`KEYS`, stored space-separated; a key may not contain a
    /// space).
    pub keys: Vec<String>,
    /// User-defined flag, stored as is.
    pub flag: i32,
    /// User properties.
    pub properties: Vec<(String, String)>,
    /// Messages with the same sharding key go to the same queue (per-key order), as long as
    /// the topic's queue count does not change.
    pub sharding_key: Option<String>,
    /// Deliver later: the broker holds the message until then.
    pub delay: Option<Delay>,
}

/// When a delayed message is to be delivered (the broker holds it until then; consumers
/// see it only once it is due).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delay {
    /// A delay level of the broker, 1-based (`1s 5s 10s 30s 1m ... 2h` by default; the
    /// broker's `--delay-levels`). Property `DELAY`.
    Level(u32),
    /// A delay in ms from when the broker stores it. Property `TIMER_DELAY_MS`.
    Ms(u64),
    /// A time in ms since the UNIX epoch (a past time delivers at once). Property
    /// `TIMER_DELIVER_MS`.
    AtMs(u64),
}

impl OutgoingMessage {
    pub fn new(body: impl Into<Vec<u8>>) -> OutgoingMessage {
        OutgoingMessage {
            body: body.into(),
            ..OutgoingMessage::default()
        }
    }
    pub fn with_tags(mut self, tags: impl Into<String>) -> OutgoingMessage {
        self.tags = Some(tags.into());
        self
    }
    pub fn with_key(mut self, key: impl Into<String>) -> OutgoingMessage {
        self.keys.push(key.into());
        self
    }
    pub fn with_keys<I, S>(mut self, keys: I) -> OutgoingMessage
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.keys.extend(keys.into_iter().map(Into::into));
        self
    }
    pub fn with_flag(mut self, flag: i32) -> OutgoingMessage {
        self.flag = flag;
        self
    }
    pub fn with_property(
        mut self,
        name: impl Into<String>,
        value: impl Into<String>,
    ) -> OutgoingMessage {
        self.properties.push((name.into(), value.into()));
        self
    }
    pub fn with_sharding_key(mut self, key: impl Into<String>) -> OutgoingMessage {
        self.sharding_key = Some(key.into());
        self
    }
    /// Delivered after the broker's delay level `level` (1-based).
    pub fn with_delay_level(mut self, level: u32) -> OutgoingMessage {
        self.delay = Some(Delay::Level(level));
        self
    }
    /// Delivered `delay_ms` after it is stored.
    pub fn with_delay_ms(mut self, delay_ms: u64) -> OutgoingMessage {
        self.delay = Some(Delay::Ms(delay_ms));
        self
    }
    /// Delivered at `at_ms` (ms since the UNIX epoch).
    pub fn with_deliver_at_ms(mut self, at_ms: u64) -> OutgoingMessage {
        self.delay = Some(Delay::AtMs(at_ms));
        self
    }

    /// Checks the limits the broker would check, so a bad message fails before any I/O.
    pub fn validate(&self) -> Result<()> {
        self.checked_properties().map(|_| ())
    }

    /// [`validate`](Self::validate), returning the property block it encoded
    /// ([`encode_properties`](Self::encode_properties)): a send encodes it once.
    pub fn checked_properties(&self) -> Result<Vec<u8>> {
        if self.body.len() > BODY_BYTES_MAX {
            return Err(ClientError::BodyTooLarge {
                len: self.body.len(),
                max: BODY_BYTES_MAX,
            });
        }
        self.encode_properties()
    }

    /// The property block the record will carry: `TAGS`, `KEYS`, then user properties.
    pub fn encode_properties(&self) -> Result<Vec<u8>> {
        let invalid = |what: String| ClientError::InvalidArgument(what);
        let mut builder = PropertiesBuilder::new();
        if let Some(tags) = &self.tags {
            builder
                .put(prop::TAGS, tags)
                .map_err(|e| invalid(format!("tags {tags:?}: {e}")))?;
        }
        if !self.keys.is_empty() {
            if self.keys.len() > KEYS_PER_MESSAGE_MAX {
                return Err(invalid(format!(
                    "{} keys; a message has at most {KEYS_PER_MESSAGE_MAX}",
                    self.keys.len()
                )));
            }
            if let Some(bad) = self.keys.iter().find(|k| k.is_empty() || k.contains(' ')) {
                return Err(invalid(format!(
                    "key {bad:?}: keys are stored space-separated, so a key may be neither \
                     empty nor contain a space"
                )));
            }
            let keys = self.keys.join(" ");
            builder
                .put(prop::KEYS, &keys)
                .map_err(|e| invalid(format!("keys {keys:?}: {e}")))?;
        }
        if let Some(delay) = self.delay {
            let (name, value) = match delay {
                Delay::Level(level) => (prop::DELAY, level.to_string()),
                Delay::Ms(ms) => (prop::TIMER_DELAY_MS, ms.to_string()),
                Delay::AtMs(at) => (prop::TIMER_DELIVER_MS, at.to_string()),
            };
            if self.properties.iter().any(|(n, _)| {
                [prop::DELAY, prop::TIMER_DELAY_MS, prop::TIMER_DELIVER_MS].contains(&n.as_str())
            }) {
                return Err(invalid(format!(
                    "the message names a delay twice (its delay and property {name})"
                )));
            }
            builder
                .put(name, &value)
                .map_err(|e| invalid(format!("delay: {e}")))?;
        }
        for (name, value) in &self.properties {
            if prop::BROKER_SET.contains(&name.as_str()) {
                return Err(invalid(format!(
                    "property {name} is set by the broker only; a message may not carry it"
                )));
            }
            builder
                .put(name, value)
                .map_err(|e| invalid(format!("property {name:?}: {e}")))?;
        }
        let bytes = builder.into_bytes();
        if bytes.len() > CLIENT_PROPERTIES_BYTES_MAX {
            return Err(invalid(format!(
                "properties take {} bytes, more than the limit of {CLIENT_PROPERTIES_BYTES_MAX} (the broker keeps the rest of {PROPERTIES_BYTES_MAX} for its own)",
                bytes.len()
            )));
        }
        Ok(bytes)
    }
}

/// Checks a topic name against the record limits before it is sent.
pub(crate) fn check_topic(topic: &str) -> Result<()> {
    if topic.is_empty() || topic.len() > TOPIC_BYTES_MAX {
        return Err(ClientError::InvalidArgument(format!(
            "topic {topic:?}: a topic name is 1 to {TOPIC_BYTES_MAX} bytes"
        )));
    }
    Ok(())
}

/// A stored message received from the broker. Cheap to clone (it shares the frame buffer).
#[derive(Clone)]
pub struct Message {
    /// Exactly one record, already verified (length, magic, CRC) when it was received.
    record: Bytes,
    broker_id: u32,
    store_id: u32,
}

impl std::fmt::Debug for Message {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Message")
            .field("msg_id", &self.msg_id().encode())
            .field("topic", &self.topic())
            .field("queue_id", &self.queue_id())
            .field("queue_offset", &self.queue_offset())
            .field("tags", &self.tags())
            .field("body_len", &self.body().len())
            .finish()
    }
}

impl Message {
    /// `record` must hold exactly one record that `RecordView::parse` accepted.
    pub(crate) fn new(record: Bytes, broker_id: u32, store_id: u32) -> Message {
        debug_assert!(RecordView::parse(&record).is_ok_and(|v| v.as_bytes().len() == record.len()));
        Message {
            record,
            broker_id,
            store_id,
        }
    }

    /// The same message in an allocation of its own: a message received shares the buffer
    /// its answer was read into (a read chunk of 256 KiB or more, with other answers), and
    /// keeps all of it alive. One kept past its answer (a consumer's cache, a local retry)
    /// is detached, so that what it holds is what flow control counts.
    pub(crate) fn detached(&self) -> Message {
        Message {
            record: Bytes::copy_from_slice(&self.record),
            ..*self
        }
    }

    /// All fields at once, read in place (one header check; use it in hot loops rather
    /// than several accessors).
    pub fn view(&self) -> RecordView<'_> {
        // Verified whole on receipt (`new`'s contract), and `Bytes` are immutable.
        RecordView::verified(&self.record)
    }

    /// The record's bytes, exactly as stored by the broker.
    pub fn as_bytes(&self) -> &[u8] {
        &self.record
    }
    /// The topic the record is stored in (for a retried message: `%RETRY%<group>`; see
    /// [`origin_topic`](Self::origin_topic)).
    pub fn topic(&self) -> &str {
        self.view().topic()
    }
    /// The topic the message was sent to: for a retried or dead-lettered message the topic
    /// it was first consumed from (`RETRY_TOPIC`); for a message the broker holds for it
    /// (a transaction's half message as its checker sees it, a discarded or undeliverable
    /// copy) its destination (`REAL_TOPIC`); else [`topic`](Self::topic).
    pub fn origin_topic(&self) -> &str {
        let view = self.view();
        let props = view.properties();
        props
            .get(prop::RETRY_TOPIC)
            .or_else(|| props.get(prop::REAL_TOPIC))
            .unwrap_or(view.topic())
    }
    /// For a delayed, retried or dead-lettered message: the id it was first stored with.
    pub fn origin_msg_id(&self) -> Option<&str> {
        self.property(prop::ORIGIN_MESSAGE_ID)
    }
    pub fn queue_id(&self) -> u32 {
        self.view().queue_id()
    }
    pub fn queue_offset(&self) -> u64 {
        self.view().queue_offset()
    }
    pub fn physical_offset(&self) -> u64 {
        self.view().physical_offset()
    }
    /// The broker that stored it, the shard (store) whose log holds it, and where.
    pub fn msg_id(&self) -> MessageId {
        MessageId {
            broker_id: self.broker_id,
            store_id: self.store_id,
            physical_offset: self.physical_offset(),
        }
    }
    pub fn tags(&self) -> Option<&str> {
        self.view().tags()
    }
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.view().keys()
    }
    pub fn properties(&self) -> Properties<'_> {
        self.view().properties()
    }
    pub fn property(&self, name: &str) -> Option<&str> {
        self.view().properties().get(name)
    }
    pub fn body(&self) -> &[u8] {
        self.view().body()
    }
    pub fn born_timestamp_ms(&self) -> i64 {
        self.view().born_timestamp_ms()
    }
    pub fn store_timestamp_ms(&self) -> i64 {
        self.view().store_timestamp_ms()
    }
    pub fn flag(&self) -> i32 {
        self.view().flag()
    }
    pub fn reconsume_times(&self) -> u32 {
        self.view().reconsume_times()
    }
    pub fn born_host(&self) -> std::net::SocketAddr {
        self.view().born_host()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builder_sets_every_field() {
        let m = OutgoingMessage::new(b"x".to_vec())
            .with_tags("TagA")
            .with_key("k1")
            .with_keys(["k2", "k3"])
            .with_flag(7)
            .with_property("p", "v")
            .with_sharding_key("order-1");
        assert_eq!(m.keys, vec!["k1", "k2", "k3"]);
        let props = m.encode_properties().unwrap();
        let p = Properties::new(&props);
        assert_eq!(p.get(prop::TAGS), Some("TagA"));
        assert_eq!(p.get(prop::KEYS), Some("k1 k2 k3"));
        assert_eq!(p.get("p"), Some("v"));
        assert_eq!((m.flag, m.sharding_key.as_deref()), (7, Some("order-1")));
    }

    #[test]
    fn bad_messages_are_refused() {
        let too_big = OutgoingMessage::new(vec![0u8; BODY_BYTES_MAX + 1]);
        assert_eq!(
            too_big.validate(),
            Err(ClientError::BodyTooLarge {
                len: BODY_BYTES_MAX + 1,
                max: BODY_BYTES_MAX
            })
        );
        assert!(OutgoingMessage::new(vec![0u8; BODY_BYTES_MAX])
            .validate()
            .is_ok());
        for bad in [
            OutgoingMessage::new("b").with_key("has space"),
            OutgoingMessage::new("b").with_key(""),
            OutgoingMessage::new("b").with_property("a\u{1}", "v"),
            OutgoingMessage::new("b").with_tags("t\u{2}"),
            OutgoingMessage::new("b").with_property("big", "v".repeat(PROPERTIES_BYTES_MAX)),
            OutgoingMessage::new("b")
                .with_keys((0..=KEYS_PER_MESSAGE_MAX).map(|i| format!("k{i}"))),
        ] {
            assert!(
                matches!(bad.validate(), Err(ClientError::InvalidArgument(_))),
                "{bad:?}"
            );
        }
        let most =
            OutgoingMessage::new("b").with_keys((0..KEYS_PER_MESSAGE_MAX).map(|i| format!("k{i}")));
        assert!(most.validate().is_ok());
        assert!(check_topic("").is_err());
        assert!(check_topic(&"t".repeat(TOPIC_BYTES_MAX + 1)).is_err());
        assert!(check_topic("orders").is_ok());
    }
}
