//! `ringmq consume --group`: a push consumer in a consumer group (concurrent or orderly,
//! clustering or broadcasting) whose listener processes each message (a sleep of
//! `--process-ms`, test-only) and prints one line per processed message with the wall-clock
//! processing interval, until SIGTERM, SIGINT or `--max`; it then leaves the group cleanly.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::Notify;

use ringmq::client::{
    ConsumeFrom, ConsumeStatus, Message, MessageModel, OrderlyStatus, PushConsumer,
    PushConsumerOptions, CONSUME_THREADS_MAX,
};
use ringmq::protocol::ErrorCode;

use super::{ConsumeArgs, From};
use crate::output::{emit, processed_line};
use crate::{CmdResult, Ctx, Failure};

/// Wall-clock nanoseconds since the UNIX epoch (comparable between processes of a host).
fn wall_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// The listener of `consume --group`: processes (sleeps) and prints each message, within
/// the --max budget.
struct GroupListener {
    client_id: String,
    json: bool,
    hex: bool,
    print_start: bool,
    process: Duration,
    /// Messages --max still allows (`u64::MAX`: no limit).
    budget: AtomicU64,
    /// Told when the budget is spent: the command then shuts the consumer down.
    spent: Notify,
    /// Set once the consumer has given up every queue (shutting down): calls past the
    /// budget wait for it before they answer, so that their messages stay on their queue.
    released: Mutex<bool>,
    queues_given_up: Condvar,
}

impl GroupListener {
    /// Processes a batch and answers true, or answers false without touching it when
    /// --max leaves no room for it. A call past the budget answers only once the consumer
    /// has given its queue up (shutting down): the consumer then drops the answer and the
    /// batch stays uncommitted on its queue, for the next owner. Answered at once, the
    /// failure would send the batch to the group's retry topic.
    fn process(&self, messages: &[Message]) -> bool {
        let n = messages.len() as u64;
        let taken = self
            .budget
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                left.checked_sub(n)
            })
            .is_ok();
        if !taken {
            self.spent.notify_one();
            let mut released = self.released.lock().unwrap_or_else(|e| e.into_inner());
            while !*released {
                released = self
                    .queues_given_up
                    .wait(released)
                    .unwrap_or_else(|e| e.into_inner());
            }
            return false;
        }
        for m in messages {
            let start_ns = wall_ns();
            if self.print_start {
                emit(&self.line(m, start_ns, None));
            }
            if !self.process.is_zero() {
                std::thread::sleep(self.process);
            }
            let end_ns = wall_ns();
            emit(&self.line(m, start_ns, Some(end_ns)));
        }
        if self.budget.load(Ordering::SeqCst) == 0 {
            self.spent.notify_one();
        }
        true
    }

    /// Lets the calls past the budget answer (the consumer has given up every queue).
    fn release(&self) {
        *self.released.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.queues_given_up.notify_all();
    }

    /// A `MSG` line (processed), or a `START` line (`end_ns` None: processing begins).
    fn line(&self, m: &Message, start_ns: u64, end_ns: Option<u64>) -> String {
        processed_line(&self.client_id, m, start_ns, end_ns, self.json, self.hex)
    }
}

/// `consume --group`: a push consumer that prints what it processes, until a signal or
/// --max, then leaves the group cleanly.
pub(super) async fn run(ctx: &Ctx, args: ConsumeArgs) -> CmdResult {
    let Some(group) = args.group.clone() else {
        return Err(Failure::Usage("consume_group needs --group".into()));
    };
    let mut config = ctx.config();
    if let Some(id) = &args.client_id {
        config.client_id = id.clone();
    }
    let mut options = PushConsumerOptions {
        message_model: if args.broadcast {
            MessageModel::Broadcasting
        } else {
            MessageModel::Clustering
        },
        consume_from: match args.from {
            From::First => ConsumeFrom::FirstOffset,
            From::Last => ConsumeFrom::LastOffset,
        },
        // One message per listener call: one interval per message.
        consume_batch_max: 1,
        ..PushConsumerOptions::default()
    };
    if let Some(ms) = args.session_timeout_ms {
        options.session_timeout_ms = ms;
        options.heartbeat_interval_ms = (ms / 3).max(1);
    }
    if let Some(ms) = args.heartbeat_ms {
        options.heartbeat_interval_ms = ms;
    }
    if let Some(n) = args.threads {
        options.consume_threads = usize::try_from(n).unwrap_or(CONSUME_THREADS_MAX);
    }
    if let Some(n) = args.max_reconsume_times {
        options.max_reconsume_times = n;
    }
    let fail_all = args.reconsume_later;
    let consumer =
        PushConsumer::new(config.clone(), group.as_str(), options).map_err(|e| ctx.fail(e))?;
    let selector = super::selector(&args).map_err(|e| ctx.fail(e))?;
    consumer
        .subscribe_with(&args.topic, selector)
        .map_err(|e| ctx.fail(e))?;
    let listener = Arc::new(GroupListener {
        client_id: config.client_id.clone(),
        json: ctx.json,
        hex: args.hex,
        print_start: args.testing.print_start,
        process: Duration::from_millis(args.testing.process_ms.unwrap_or(0)),
        budget: AtomicU64::new(args.max.unwrap_or(u64::MAX)),
        spent: Notify::new(),
        released: Mutex::new(false),
        queues_given_up: Condvar::new(),
    });
    let registered = if args.orderly {
        let listener = listener.clone();
        consumer.register_orderly(move |messages| {
            if listener.process(messages) {
                OrderlyStatus::Success
            } else {
                OrderlyStatus::SuspendCurrentQueueAMoment
            }
        })
    } else {
        let listener = listener.clone();
        consumer.register_concurrent(move |messages| {
            if listener.process(messages) && !fail_all {
                ConsumeStatus::Success
            } else {
                ConsumeStatus::ReconsumeLater
            }
        })
    };
    registered.map_err(|e| ctx.fail(e))?;
    // Installed before joining: a signal that arrives meanwhile still stops it cleanly.
    let handler = |kind: SignalKind, name: &str| {
        signal(kind).map_err(|e| Failure::Failed(format!("installing the {name} handler: {e}")))
    };
    let mut term = handler(SignalKind::terminate(), "SIGTERM")?;
    let mut interrupt = handler(SignalKind::interrupt(), "SIGINT")?;
    consumer.start().await.map_err(|e| ctx.fail(e))?;
    // Subscribing to a topic that does not exist (yet) is allowed, but likely a typo.
    if let Some(client) = consumer.client() {
        if let Err(e) = client.describe_topic(&args.topic).await {
            if e.code() == Some(ErrorCode::TopicNotFound) {
                eprintln!(
                    "ringmq: topic {} does not exist (yet); waiting for it",
                    args.topic
                );
            }
        }
    }
    tokio::select! {
        _ = term.recv() => {}
        _ = interrupt.recv() => {}
        _ = listener.spent.notified() => {}
    }
    let shutdown = consumer.shutdown();
    let mut shutdown = std::pin::pin!(shutdown);
    // The shutdown gives up every queue first, then waits for the listener calls: those
    // past the budget are let go once no queue is left here.
    let given_up = async {
        while !consumer.consuming_queues().is_empty() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        listener.release();
    };
    tokio::select! {
        done = &mut shutdown => {
            // Ended with queues left (its controller failed): nothing waits for a queue.
            listener.release();
            return done.map_err(|e| ctx.fail(e));
        }
        () = given_up => {}
    }
    shutdown.await.map_err(|e| ctx.fail(e))
}
