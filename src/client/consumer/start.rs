//! Where a queue the group has no committed offset for starts: the consumer's
//! `ConsumeFrom`, except for queues that hold only what was sent since this consumer
//! started (made since, or a retry topic's), which start at their first message.

use std::collections::BTreeMap;

use super::super::error::Result;
use super::{Client, ConsumeFrom, MessageQueue, MessageSelector};

/// How many queues each subscribed topic has now (0 for one that does not exist yet). A
/// queue past that count was created after this consumer subscribed (a topic made by its
/// first send, or grown): everything in it was sent since, so under
/// [`ConsumeFrom::LastOffset`] it starts at its first message, not at its end, when the
/// group has no committed offset there; starting at the end would skip the messages stored
/// in it before this member started it (for a topic a send created, its first sends').
pub(super) async fn queues_at_start(
    client: &Client,
    subscriptions: &BTreeMap<String, MessageSelector>,
) -> Result<BTreeMap<String, u32>> {
    let mut counts = BTreeMap::new();
    let retry = crate::protocol::names::RETRY_TOPIC_PREFIX;
    for topic in subscriptions.keys().filter(|t| !t.starts_with(retry)) {
        let count = client.queue_count(topic).await?;
        counts.insert(topic.clone(), count.unwrap_or(0));
    }
    Ok(counts)
}

/// Where a queue the group has no committed offset for starts, with `configured` the
/// consumer's [`ConsumeFrom`]. A retry topic always starts at its first message: what waits
/// there was sent back by this group and must not be skipped (RocketMQ does the same). So
/// does, under `LastOffset`, a queue made since this consumer started (past its topic's
/// count in `queues_at_start`): it holds only messages sent since.
pub(super) fn start_from(
    mq: &MessageQueue,
    configured: ConsumeFrom,
    queues_at_start: &BTreeMap<String, u32>,
) -> ConsumeFrom {
    if mq
        .topic
        .starts_with(crate::protocol::names::RETRY_TOPIC_PREFIX)
    {
        return ConsumeFrom::FirstOffset;
    }
    let made_since = queues_at_start
        .get(&mq.topic)
        .is_some_and(|&count| mq.queue_id >= count);
    match configured {
        ConsumeFrom::LastOffset if made_since => ConsumeFrom::FirstOffset,
        from => from,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_queue_made_since_the_consumer_started_starts_at_its_first_message() {
        let at_start: BTreeMap<String, u32> =
            [("old".to_owned(), 4), ("absent".to_owned(), 0)].into();
        let from = |topic: &str, queue_id, configured| {
            start_from(&MessageQueue::new(topic, queue_id), configured, &at_start)
        };
        let last = ConsumeFrom::LastOffset;
        assert_eq!(from("old", 3, last), last, "there at the start: its end");
        assert_eq!(
            from("old", 4, last),
            ConsumeFrom::FirstOffset,
            "added since"
        );
        assert_eq!(
            from("absent", 0, last),
            ConsumeFrom::FirstOffset,
            "made since"
        );
        assert_eq!(from("not-subscribed", 9, last), last);
        let at = ConsumeFrom::Timestamp(1_000);
        assert_eq!(from("old", 4, at), at, "a time is kept as given");
        assert_eq!(
            from("absent", 0, ConsumeFrom::FirstOffset),
            ConsumeFrom::FirstOffset
        );
        let retry = crate::protocol::names::retry_topic("g");
        assert_eq!(from(&retry, 0, last), ConsumeFrom::FirstOffset);
    }
}
