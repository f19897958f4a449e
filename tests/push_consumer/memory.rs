//! What a push consumer's kept messages hold: a message received shares the read buffer its
//! pull answer landed in (with the other records of the answer, and other answers), so one
//! kept past its answer (the orderly cache, a local retry) is copied out of it. Otherwise
//! a few kept messages could hold many times what flow control counts. Helpers are the
//! parent module's.

use super::*;

/// Where each delivery of a body found its record: (body, attempt) -> (address, length).
type Places = Arc<Mutex<HashMap<(String, u32), (usize, usize)>>>;

fn note(places: &Places, messages: &[Message]) -> Vec<(String, u32)> {
    let mut places = places.lock().unwrap();
    let mut noted = Vec::new();
    for m in messages {
        let body = String::from_utf8_lossy(m.body()).into_owned();
        let attempt = (1..)
            .find(|n| !places.contains_key(&(body.clone(), *n)))
            .unwrap();
        let bytes = m.as_bytes();
        places.insert(
            (body.clone(), attempt),
            (bytes.as_ptr() as usize, bytes.len()),
        );
        noted.push((body, attempt));
    }
    noted
}

/// True when `b`'s record starts where `a`'s ends: both still in the answer they came in.
fn adjacent(places: &Places, a: (&str, u32), b: (&str, u32)) -> bool {
    let places = places.lock().unwrap();
    let (a_at, a_len) = places[&(a.0.to_owned(), a.1)];
    places[&(b.0.to_owned(), b.1)].0 == a_at + a_len
}

async fn one_answer_of(addr: &str, topic: &str) -> Producer {
    let producer = Producer::connect(ClientConfig::new(addr)).await.unwrap();
    producer.client().create_topic(topic, 1).await.unwrap();
    let batch = ["a", "b", "c"].map(OutgoingMessage::new).to_vec();
    producer.send_batch(topic, batch).await.unwrap();
    producer
}

/// A concurrent listener call gets the records where the answer put them; a message that
/// failed and is kept for a local retry (broadcasting: there is no retry topic) comes
/// back in a copy of its own.
#[test]
fn a_message_kept_for_a_local_retry_is_a_copy_out_of_its_answer() {
    with_broker(|addr| async move {
        let _producer = one_answer_of(&addr, "kept-retry").await;
        let offsets_dir = tempfile::tempdir().unwrap();
        let options = PushConsumerOptions {
            message_model: MessageModel::Broadcasting,
            offsets_dir: Some(offsets_dir.path().to_owned()),
            consume_from: ConsumeFrom::FirstOffset,
            consume_batch_max: 3,
            reconsume_delay_ms: 50,
            ..options()
        };
        let consumer = PushConsumer::new(ClientConfig::new(&addr), "g-kept", options).unwrap();
        consumer.subscribe("kept-retry", "*").unwrap();
        let places: Places = Arc::default();
        {
            let places = places.clone();
            consumer
                .register_concurrent(move |messages| match note(&places, messages)[0].1 {
                    1 => ConsumeStatus::ReconsumeLater,
                    _ => ConsumeStatus::Success,
                })
                .unwrap();
        }
        consumer.start().await.unwrap();
        eventually("the retry", || places.lock().unwrap().len() == 6).await;
        assert!(adjacent(&places, ("a", 1), ("b", 1)), "one answer");
        assert!(adjacent(&places, ("b", 1), ("c", 1)), "one answer");
        assert!(
            !adjacent(&places, ("a", 2), ("b", 2)),
            "copies of their own"
        );
        let first = places.lock().unwrap()[&("a".to_owned(), 1)];
        let again = places.lock().unwrap()[&("a".to_owned(), 2)];
        assert_ne!(first.0, again.0);
        consumer.shutdown().await.unwrap();
    });
}

/// An orderly queue's cached messages (taken by its task one batch at a time, perhaps
/// long after their answer) are copies of their own.
#[test]
fn an_orderly_queues_cached_messages_are_copies_out_of_their_answer() {
    with_broker(|addr| async move {
        let _producer = one_answer_of(&addr, "kept-orderly").await;
        let options = PushConsumerOptions {
            consume_from: ConsumeFrom::FirstOffset,
            consume_batch_max: 3,
            ..options()
        };
        let consumer = PushConsumer::new(ClientConfig::new(&addr), "g-kept-o", options).unwrap();
        consumer.subscribe("kept-orderly", "*").unwrap();
        let places: Places = Arc::default();
        {
            let places = places.clone();
            consumer
                .register_orderly(move |messages| {
                    note(&places, messages);
                    OrderlyStatus::Success
                })
                .unwrap();
        }
        consumer.start().await.unwrap();
        eventually("the three", || places.lock().unwrap().len() == 3).await;
        assert!(
            !adjacent(&places, ("a", 1), ("b", 1)),
            "copies of their own"
        );
        assert!(
            !adjacent(&places, ("b", 1), ("c", 1)),
            "copies of their own"
        );
        consumer.shutdown().await.unwrap();
    });
}
