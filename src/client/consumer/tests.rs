use super::*;

/// Leases and heartbeats are aged on CLOCK_BOOTTIME: it reads, and keeps pace with the
/// monotonic clock while the machine runs.
#[test]
fn the_boot_clock_reads_and_keeps_pace() {
    let from = boot_ms().expect("CLOCK_BOOTTIME reads on Linux");
    let started = std::time::Instant::now();
    while started.elapsed() < Duration::from_millis(30) {
        std::hint::spin_loop();
    }
    let passed = boot_ms().unwrap() - from;
    assert!((29..1_000).contains(&passed), "{passed} ms");
}

fn check_options(f: fn(&mut PushConsumerOptions), ok: bool) {
    let mut options = PushConsumerOptions::default();
    f(&mut options);
    assert_eq!(options.validate().is_ok(), ok, "{options:?}");
}

#[test]
fn default_options_are_upstream_numbers_and_valid() {
    let o = PushConsumerOptions::default();
    assert!(o.validate().is_ok());
    assert_eq!(o.message_model, MessageModel::Clustering);
    assert_eq!(o.strategy.name(), "averagely");
    assert_eq!(o.consume_from, ConsumeFrom::LastOffset);
    assert_eq!((o.pull_batch_max, o.pull_wait_ms), (32, 15_000));
    assert_eq!(o.consume_threads, 20);
    assert!(!o.listener_non_blocking, "listeners may block by default");
    assert_eq!(
        (o.cached_messages_max, o.cached_bytes_max, o.cached_span_max),
        (1000, 100 << 20, 2000)
    );
    assert_eq!(
        (
            o.heartbeat_interval_ms,
            o.rebalance_interval_ms,
            o.lock_renew_ms
        ),
        (3000, 20_000, 20_000)
    );
    assert_eq!((o.commit_interval_ms, o.max_reconsume_times), (1000, 16));
    assert_eq!((o.suspend_ms, o.reconsume_delay_ms), (1000, 1000));
    let concurrent = o.flow_limits(ConsumeMode::Concurrent);
    assert_eq!(concurrent.span_max, Some(2000));
    assert_eq!(o.flow_limits(ConsumeMode::Orderly).span_max, None);
}

#[test]
fn nonsense_options_are_refused() {
    check_options(|o| o.pull_batch_max = 0, false);
    check_options(|o| o.pull_batch_max = PULL_BATCH_MAX_LIMIT + 1, false);
    check_options(|o| o.consume_threads = 0, false);
    check_options(|o| o.pulls_in_flight_max = 0, false);
    check_options(
        |o| o.pulls_in_flight_max = PULLS_IN_FLIGHT_MAX_LIMIT + 1,
        false,
    );
    check_options(|o| o.pulls_in_flight_max = 1, true);
    check_options(|o| o.consume_batch_max = 0, false);
    check_options(|o| o.pull_wait_ms = 0, false);
    check_options(|o| o.pull_wait_ms = u64::from(u32::MAX) + 1, false);
    check_options(|o| o.cached_messages_max = 0, false);
    check_options(|o| o.lock_renew_ms = o.lock_valid_ms, false);
    check_options(|o| o.lock_valid_ms = BROKER_LOCK_EXPIRY_MS, false);
    check_options(|o| o.heartbeat_interval_ms = o.session_timeout_ms, false);
    check_options(|o| o.commit_interval_ms = 0, false);
    check_options(|o| o.pull_wait_ms = 200, true);
}

#[test]
fn subscriptions_and_listeners_are_checked_before_any_io() {
    let consumer =
        PushConsumer::new(ClientConfig::default(), "g", PushConsumerOptions::default()).unwrap();
    for bad in ["A ||", "A | B", "*|| A"] {
        match consumer.subscribe("t", bad) {
            Err(ClientError::InvalidArgument(why)) => assert!(why.contains("tag"), "{why}"),
            other => panic!("{bad:?}: {other:?}"),
        }
    }
    assert!(consumer.subscribe("", "*").is_err());
    consumer.subscribe("t", "A || B").unwrap();
    consumer.subscribe("t", "*").unwrap();
    assert!(
        PushConsumer::new(ClientConfig::default(), "", PushConsumerOptions::default()).is_err()
    );
    let long_id = ClientConfig {
        client_id: "x".repeat(CLIENT_ID_BYTES_MAX + 1),
        ..ClientConfig::default()
    };
    assert!(PushConsumer::new(long_id, "g", PushConsumerOptions::default()).is_err());
    assert!(consumer.assigned_queues().is_empty());
    assert_eq!(consumer.stats(), ConsumerStats::default());
}

/// Consumers are shared between tasks and their futures are spawned.
#[test]
fn consumers_and_their_futures_are_send() {
    fn send_sync<T: Send + Sync>() {}
    fn send<F: Send>(_: F) {}
    send_sync::<PushConsumer>();
    send_sync::<Client>();
    let consumer =
        PushConsumer::new(ClientConfig::default(), "g", PushConsumerOptions::default()).unwrap();
    send(consumer.start());
    send(consumer.shutdown());
}

#[tokio::test]
async fn start_needs_a_subscription_and_a_listener() {
    let consumer =
        PushConsumer::new(ClientConfig::default(), "g", PushConsumerOptions::default()).unwrap();
    let why = consumer.start().await.unwrap_err().to_string();
    assert!(why.contains("subscribe"), "{why}");
    consumer.subscribe("t", "*").unwrap();
    let why = consumer.start().await.unwrap_err().to_string();
    assert!(why.contains("listener"), "{why}");
    // Shutting down a consumer that never started is a no-op.
    consumer.shutdown().await.unwrap();
    let why = consumer.start().await.unwrap_err().to_string();
    assert!(why.contains("shut down"), "{why}");
}
