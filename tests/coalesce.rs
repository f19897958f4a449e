//! Coalesced single sends (`ProducerOptions::coalesce`) against the real broker binary: many
//! concurrent sends to few queues go out as batches while a send is in flight, and every
//! send still gets its own result (message id, queue, offset) that names exactly its message;
//! keyed sends keep their order; delayed messages still go alone.

mod common;

use std::collections::BTreeMap;
use std::future::Future;

use common::broker::BrokerProcess;
use common::runtime;
use ringmq::client::{ClientConfig, OutgoingMessage, Producer, ProducerOptions};

#[test]
fn coalesced_single_sends_each_get_the_result_of_their_own_message() {
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::start(&dir.path().join("data"), 2, &[]);
    let addr = broker.addr_string();
    runtime().block_on(async {
        let options = ProducerOptions {
            coalesce: true,
            ..Default::default()
        };
        let producer = Producer::connect_with(ClientConfig::new(&addr), options)
            .await
            .unwrap();
        let client = producer.client().clone();
        client.create_topic("co", 4).await.unwrap();
        // The producer learns the topic's queues first (sends made before that wait for
        // it and may go in any order).
        producer
            .send("co", OutgoingMessage::new("first"))
            .await
            .unwrap();
        const N: usize = 4000;
        // All at once, issued in order: every send is polled, in send order, before any
        // answer comes, so sends to a queue pile up while one to it is in flight.
        let mut sends: Vec<_> = (0..N)
            .map(|i| {
                let m = OutgoingMessage::new(format!("m{i}"));
                // A quarter keyed: their order in their queue must hold.
                let m = if i % 4 == 0 {
                    m.with_sharding_key("k")
                } else {
                    m
                };
                Some(Box::pin(producer.send_async("co", m)))
            })
            .collect();
        let mut done: Vec<Option<_>> = (0..N).map(|_| None).collect();
        std::future::poll_fn(|cx| {
            for (send, out) in sends.iter_mut().zip(done.iter_mut()) {
                if let Some(f) = send {
                    if let std::task::Poll::Ready(r) = f.as_mut().poll(cx) {
                        *out = Some(r);
                        *send = None;
                    }
                }
            }
            if sends.iter().all(Option::is_none) {
                std::task::Poll::Ready(())
            } else {
                std::task::Poll::Pending
            }
        })
        .await;
        let results: Vec<_> = done
            .into_iter()
            .enumerate()
            .map(|(i, r)| (i, r.unwrap().unwrap()))
            .collect();
        // Every result names its own message, at a distinct place.
        let mut places = BTreeMap::new();
        for (i, r) in &results {
            assert!(
                places.insert((r.queue_id, r.queue_offset), *i).is_none(),
                "{r:?}"
            );
            let by_id = client.message_by_id(&r.msg_id).await.unwrap().unwrap();
            assert_eq!(by_id.body(), format!("m{i}").as_bytes());
            assert_eq!(
                (by_id.queue_id(), by_id.queue_offset()),
                (r.queue_id, r.queue_offset)
            );
        }
        // Keyed sends: one queue, in send order.
        let keyed: Vec<_> = results.iter().filter(|(i, _)| i % 4 == 0).collect();
        let q = keyed[0].1.queue_id;
        assert!(keyed.iter().all(|(_, r)| r.queue_id == q));
        assert!(keyed
            .windows(2)
            .all(|w| w[0].1.queue_offset < w[1].1.queue_offset));
        // Batches carried most of them.
        let batches = producer.coalesced_batches();
        assert!(batches > 0 && batches < N as u64 / 4, "{batches} batches");
        let info = client.describe_topic("co").await.unwrap();
        assert_eq!(
            info.queues.iter().map(|q| q.max_offset).sum::<u64>(),
            N as u64 + 1
        );
        // A delayed message still goes alone and is scheduled.
        let r = producer
            .send("co", OutgoingMessage::new("later").with_delay_ms(50))
            .await
            .unwrap();
        assert_eq!(r.queue_offset, ringmq::client::QUEUE_OFFSET_SCHEDULED);
    });
}
