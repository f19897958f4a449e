//! The client across a broker's stop and its replacement: a broker that stops closes its
//! connections (the client's requests fail at once, not by timeout), and a broker started
//! in another's place on the same address with other shards gets the sends of a client
//! that knew the first.
#![cfg(feature = "broker")]

mod common;

use common::broker::BrokerProcess;
use ringmq::client::{ClientConfig, ClientError, OutgoingMessage, Producer};
use ringmq::shard::{Broker, BrokerConfig};

/// A broker embedded in this process that shuts down ends its connections: the client's
/// next send fails with a connection error (connection refused once it dials again), not
/// with timeouts on connections the broker left open.
#[test]
fn a_stopped_broker_closes_its_connections() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(BrokerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: dir.path().join("data"),
        shards: 2,
        segment_bytes: 64 << 20,
        ..Default::default()
    })
    .unwrap();
    let addr = broker.addr().to_string();
    let runtime = common::runtime();
    let producer = runtime.block_on(async {
        let producer = Producer::connect(ClientConfig::new(addr)).await.unwrap();
        producer.client().create_topic("t", 4).await.unwrap();
        for i in 0..8 {
            let m = OutgoingMessage::new(format!("m-{i}"));
            producer.send("t", m).await.unwrap();
        }
        producer
    });
    broker.shutdown().unwrap();
    let sent = runtime.block_on(producer.send("t", OutgoingMessage::new("late")));
    match sent {
        Err(ClientError::Connection(said)) => assert!(said.contains("refused"), "{said}"),
        other => panic!("{other:?}"),
    }
}

/// A broker started in another's place on the same address, with other shards (a new data
/// directory, 2 shards where there were 4), gets the sends of a producer that knew the
/// first one: the producer takes the new broker's handshake before dialing a shard again,
/// and routes with it (the first broker's shards 2 and 3 no longer listen).
#[test]
fn a_producer_routes_again_when_another_broker_takes_the_address() {
    // A port whose four direct ports (port + 1 ..= port + 4) are free too.
    let port = loop {
        let p = common::free_port();
        if p < 60_000 && (1..=4).all(|i| std::net::TcpListener::bind(("127.0.0.1", p + i)).is_ok())
        {
            break p;
        }
    };
    let dir = tempfile::tempdir().unwrap();
    let listen = format!("127.0.0.1:{port}").parse().unwrap();
    let start =
        |name: &str, shards| BrokerProcess::start_on(listen, &dir.path().join(name), shards, &[]);
    let runtime = common::runtime();
    let mut first = start("first", 4);
    let addr = first.addr_string();
    let producer = runtime.block_on(async {
        let producer = Producer::connect(ClientConfig::new(addr.clone()))
            .await
            .unwrap();
        producer.client().create_topic("moved", 8).await.unwrap();
        for i in 0..16 {
            let m = OutgoingMessage::new(format!("first-{i}"));
            producer.send("moved", m).await.unwrap();
        }
        producer
    });
    assert_eq!(producer.client().broker_info().shard_count, 4);
    first.kill();
    let _second = start("second", 2);
    runtime.block_on(async {
        // Made by another client: the producer's own call would go through the bootstrap
        // connection, and the handshake it makes would route the sends before they try.
        let admin = ringmq::client::Client::connect(ClientConfig::new(addr.clone()))
            .await
            .unwrap();
        admin.create_topic("moved", 8).await.unwrap();
        let mut queues = std::collections::BTreeSet::new();
        for i in 0..16 {
            let m = OutgoingMessage::new(format!("second-{i}"));
            let sent = producer.send("moved", m).await;
            let sent = sent.unwrap_or_else(|e| panic!("send {i} to the second broker: {e}"));
            queues.insert(sent.queue_id);
        }
        assert_eq!(queues.len(), 8, "{queues:?}");
        assert_eq!(producer.client().broker_info().shard_count, 2);
        let info = admin.describe_topic("moved").await.unwrap();
        let stored: u64 = info.queues.iter().map(|q| q.max_offset).sum();
        assert_eq!(stored, 16, "{info:?}");
    });
}
