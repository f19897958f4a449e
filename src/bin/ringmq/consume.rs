//! `ringmq consume`: without `--group`, a plain pull loop over a topic's queues (no group,
//! nothing committed) that prints one line per message, stopping once the queues are
//! drained or, with `--follow`, long-polling every queue concurrently; with `--group`, a
//! member of a consumer group (`consume/member.rs`).
//!
//! `TestingArgs` holds the options that exist for tests only (`--process-ms`,
//! `--print-start`): they make a member's processing take time and show when it starts, so
//! tests and `perf/failover.sh` can check when each message was processed. `--help` lists
//! them under their own heading.

mod member;

use std::time::Duration;

use clap::{Args, ValueEnum};
use tokio::sync::mpsc;

use ringmq::client::{
    Client, ClientError, Message, MessageSelector, PullStatus, CONSUME_THREADS_MAX,
};

use crate::output::{emit, pulled_line};
use crate::{CmdResult, Ctx, Failure};

/// Messages asked for in one pull by `consume` (the broker's default batch).
const CONSUME_BATCH: u32 = 32;
/// The broker's longest long-polling wait.
const WAIT_MS_MAX: u64 = 60_000;
/// Long-polling wait of `consume --follow` when `--wait-ms` is not given.
const FOLLOW_WAIT_MS_DEFAULT: u64 = 5_000;
/// Pause after a retriable pull failure in `consume --follow`.
const FOLLOW_RETRY_MS: u64 = 1_000;
/// Longest `consume --process-ms`.
const PROCESS_MS_MAX: u64 = 3_600_000;

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
enum From {
    /// The first message each queue still keeps
    First,
    /// The end of each queue (only messages that arrive later; useful with --follow)
    Last,
}

/// The options that only go with `consume --group`.
const GROUP_ONLY: &str = "Consumer group options (with --group)";

#[derive(Args, Debug)]
pub(crate) struct ConsumeArgs {
    /// Topic name
    topic: String,
    /// Only this queue (default: every queue of the topic)
    #[arg(long, value_name = "Q")]
    queue: Option<u32>,
    /// Start every consumed queue at this queue offset (below a queue's first kept message:
    /// from that message; past its end: from its end, once messages come)
    #[arg(long, value_name = "N", conflicts_with = "from")]
    from_offset: Option<u64>,
    /// Where to start when --from-offset is not given; with --group, where a queue the
    /// group has no committed offset for starts (a committed offset always wins)
    #[arg(long, value_enum, default_value_t = From::First)]
    from: From,
    /// Stop after this many messages (with --group: after processing this many; the
    /// consumer then leaves the group cleanly, and the messages it had fetched past them
    /// stay on their queues, uncommitted, for the group's next member)
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    max: Option<u64>,
    /// Only messages with one of these tags: `*` (all) or `A || B`
    #[arg(long, value_name = "EXPR", conflicts_with = "sql")]
    tags: Option<String>,
    /// Only messages whose properties (and TAGS) match this SQL92 filter, evaluated by the
    /// broker: `region = 'eu' AND amount > 100`
    #[arg(long, value_name = "EXPR")]
    sql: Option<String>,
    /// Long-polling wait of each pull, in ms: how long a pull at a queue's end waits for new
    /// messages before that queue counts as drained (default 0; with --follow 5000)
    #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(0..=WAIT_MS_MAX))]
    wait_ms: Option<u64>,
    /// Keep waiting for new messages instead of stopping once the queues are drained
    /// (stop with Ctrl-C or --max); queues are pulled concurrently
    #[arg(long)]
    follow: bool,
    /// Show bodies as hex instead of UTF-8 text
    #[arg(long)]
    hex: bool,
    /// Consume as a member of this consumer group (a push consumer; see above). Runs until
    /// SIGTERM/SIGINT or --max
    #[arg(long, value_name = "GROUP", help_heading = GROUP_ONLY,
          conflicts_with_all = ["queue", "from_offset", "follow", "wait_ms"])]
    group: Option<String>,
    /// Orderly consumption: each queue one message at a time, in offset order, only while
    /// this member holds the queue's lock on the broker (default: concurrent)
    #[arg(long, requires = "group", help_heading = GROUP_ONLY)]
    orderly: bool,
    /// Broadcasting: every member of the group gets every message; offsets are kept in a
    /// local file per client id and group, under ~/.ringmq/offsets (default: clustering)
    #[arg(long, requires = "group", help_heading = GROUP_ONLY)]
    broadcast: bool,
    /// This member's client id (default: <host>-<pid>-<random>-0, new on each run); with
    /// --broadcast, a stable id resumes from the offsets of an earlier run
    #[arg(long, value_name = "ID", requires = "group", help_heading = GROUP_ONLY)]
    client_id: Option<String>,
    /// Heartbeat interval, in ms [default: 3000, or a third of --session-timeout-ms]
    #[arg(long, value_name = "MS", requires = "group", help_heading = GROUP_ONLY,
          value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    heartbeat_ms: Option<u64>,
    /// A session timeout, in ms, for the heartbeat interval's default (a third of it);
    /// 1000 to 600000, the broker's range [default: 10000]. The consumer takes the
    /// broker's own session timeout from its handshake (heartbeats at least three per
    /// session), whatever this says
    #[arg(long, value_name = "MS", requires = "group", help_heading = GROUP_ONLY,
          value_parser = clap::value_parser!(u64).range(1_000..=600_000))]
    session_timeout_ms: Option<u64>,
    /// Listener threads: messages processed at once over all queues [default: 20]
    #[arg(long, value_name = "N", requires = "group", help_heading = GROUP_ONLY,
          value_parser = clap::value_parser!(u64).range(1..=CONSUME_THREADS_MAX as u64))]
    threads: Option<u64>,
    /// Answer every message with ReconsumeLater (concurrent mode): each goes back to the
    /// broker, returns on the group's retry topic at growing delays and, after
    /// --max-reconsume-times retries, lands on the group's dead-letter topic. For trying
    /// the failure path by hand and in tests; each attempt prints its MSG line
    #[arg(long, requires = "group", conflicts_with = "orderly", help_heading = GROUP_ONLY)]
    reconsume_later: bool,
    /// Retries of a failing message before it goes to the dead-letter topic [default: 16]
    #[arg(long, value_name = "N", requires = "group", help_heading = GROUP_ONLY)]
    max_reconsume_times: Option<u32>,
    #[command(flatten)]
    testing: TestingArgs,
}

/// The help heading of the test-only options.
const TESTING: &str = "Testing (test-only options, with --group)";

/// Options of `consume --group` that exist for tests only: they make processing take time
/// and show when it starts, so a test can check when each message was processed.
#[derive(Args, Debug)]
struct TestingArgs {
    /// Test-only. Time spent processing each message (a sleep), in ms [default: 0]: makes
    /// processing intervals visible in the output
    #[arg(long, value_name = "MS", requires = "group", help_heading = TESTING,
          value_parser = clap::value_parser!(u64).range(0..=PROCESS_MS_MAX))]
    process_ms: Option<u64>,
    /// Test-only. Also print `START client=ID queue=Q offset=O start_ns=T0 key=KEY` when
    /// the processing of a message begins (before its MSG line)
    #[arg(long, requires = "group", help_heading = TESTING)]
    print_start: bool,
}

/// What `--tags` or `--sql` asks for (every message without either).
pub(crate) fn selector(args: &ConsumeArgs) -> Result<MessageSelector, ClientError> {
    match (&args.sql, &args.tags) {
        (Some(sql), _) => MessageSelector::by_sql(sql),
        (None, Some(tags)) => MessageSelector::by_tag(tags),
        (None, None) => MessageSelector::by_tag("*"),
    }
}

pub(crate) async fn run(ctx: &Ctx, args: ConsumeArgs) -> CmdResult {
    if args.group.is_some() {
        return member::run(ctx, args).await;
    }
    let selector = selector(&args).map_err(|e| ctx.fail(e))?;
    let client = ctx.client().await?;
    let info = client
        .describe_topic(&args.topic)
        .await
        .map_err(|e| ctx.fail(e))?;
    let queues: Vec<(u32, u64, u64)> = match args.queue {
        Some(q) => match info.queues.iter().find(|i| i.queue_id == q) {
            Some(i) => vec![(q, i.min_offset, i.max_offset)],
            None => {
                return Err(Failure::Failed(format!(
                    "topic {} has {} queues; no queue {q}",
                    args.topic,
                    info.queues.len()
                )))
            }
        },
        None => info
            .queues
            .iter()
            .map(|i| (i.queue_id, i.min_offset, i.max_offset))
            .collect(),
    };
    let starts: Vec<(u32, u64)> = queues
        .iter()
        .map(|&(q, min, max)| {
            let start = match (args.from_offset, args.from) {
                (Some(n), _) => n,
                (None, From::First) => min,
                (None, From::Last) => max,
            };
            (q, start)
        })
        .collect();
    let wait_ms_default = if args.follow {
        FOLLOW_WAIT_MS_DEFAULT
    } else {
        0
    };
    let pulls = Pulls {
        topic: args.topic,
        starts,
        selector,
        wait: Duration::from_millis(args.wait_ms.unwrap_or(wait_ms_default)),
        max: args.max.unwrap_or(u64::MAX),
        json: ctx.json,
        hex: args.hex,
    };
    if args.follow {
        follow(ctx, &client, pulls).await
    } else {
        drain(ctx, &client, pulls).await
    }
}

/// What the pull loop (`consume` without `--group`) pulls and how it prints it.
struct Pulls {
    topic: String,
    /// Each consumed queue and the offset it starts at.
    starts: Vec<(u32, u64)>,
    /// Tags or an SQL92 filter.
    selector: MessageSelector,
    /// Long-polling wait of each pull.
    wait: Duration,
    /// Messages to print at most.
    max: u64,
    json: bool,
    hex: bool,
}

impl Pulls {
    fn print(&self, m: &Message) {
        emit(&pulled_line(m, self.json, self.hex));
    }
}

/// What one pull means for the loop: keep going from `next`, or this queue is drained.
pub(crate) enum Step {
    Continue(u64),
    Drained,
}

pub(crate) fn step(status: PullStatus, from: u64, next: u64) -> Step {
    match status {
        PullStatus::Found | PullStatus::NoMatchedMessage | PullStatus::OffsetTooSmall
            if next > from =>
        {
            Step::Continue(next)
        }
        // OffsetTooSmall with next <= from cannot happen; treat any non-advance as the end.
        _ => Step::Drained,
    }
}

/// Pulls queue after queue, in queue order, until each is drained or `max` are printed.
async fn drain(ctx: &Ctx, client: &Client, pulls: Pulls) -> CmdResult {
    let max = pulls.max;
    let mut printed = 0u64;
    for &(queue, mut offset) in &pulls.starts {
        loop {
            if printed >= max {
                return Ok(());
            }
            let batch = CONSUME_BATCH.min(u32::try_from(max - printed).unwrap_or(u32::MAX));
            let pulled = client
                .pull_selected(
                    &pulls.topic,
                    queue,
                    offset,
                    batch,
                    pulls.wait,
                    &pulls.selector,
                )
                .await
                .map_err(|e| ctx.fail(e))?;
            for m in &pulled.messages {
                if printed >= max {
                    return Ok(());
                }
                pulls.print(m);
                printed += 1;
            }
            match step(pulled.status, offset, pulled.next_offset) {
                Step::Continue(next) => offset = next,
                Step::Drained => break,
            }
        }
    }
    Ok(())
}

/// Pulls every queue concurrently (long polling) and prints what arrives, until `max`.
async fn follow(ctx: &Ctx, client: &Client, pulls: Pulls) -> CmdResult {
    let (max, wait) = (pulls.max, pulls.wait);
    let (tx, mut rx) = mpsc::channel::<Result<Vec<Message>, ClientError>>(64);
    for &(queue, start) in &pulls.starts {
        let client = client.clone();
        let topic = pulls.topic.clone();
        let selector = pulls.selector.clone();
        let tx = tx.clone();
        tokio::spawn(async move {
            let mut offset = start;
            // The broker run the offset comes from (0: none yet): named in each pull, so a
            // position past where a crash ended the queue goes back to that end, not past
            // what was stored there since.
            let mut incarnation = 0;
            let tags: Vec<&str> = selector.tags().iter().map(String::as_str).collect();
            let mut warned = false;
            loop {
                match client
                    .pull_with(
                        &topic,
                        queue,
                        offset,
                        CONSUME_BATCH,
                        wait,
                        &tags,
                        selector.sql(),
                        incarnation,
                    )
                    .await
                {
                    Ok(pulled) => {
                        warned = false;
                        incarnation = pulled.incarnation;
                        if !pulled.messages.is_empty()
                            && tx.send(Ok(pulled.messages)).await.is_err()
                        {
                            return;
                        }
                        // At the end (or past it), keep the offset and poll again.
                        if let Step::Continue(next) =
                            step(pulled.status, offset, pulled.next_offset)
                        {
                            offset = next;
                        } else if pulled.status == PullStatus::OffsetTooBig {
                            offset = pulled.next_offset;
                        }
                    }
                    Err(e) if e.is_retriable() => {
                        if !warned {
                            eprintln!("ringmq: queue {queue}: {e}; retrying");
                            warned = true;
                        }
                        tokio::time::sleep(Duration::from_millis(FOLLOW_RETRY_MS)).await;
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e)).await;
                        return;
                    }
                }
            }
        });
    }
    drop(tx);
    let mut printed = 0u64;
    while printed < max {
        match rx.recv().await {
            Some(Ok(messages)) => {
                for m in &messages {
                    if printed >= max {
                        break;
                    }
                    pulls.print(m);
                    printed += 1;
                }
            }
            Some(Err(e)) => return Err(ctx.fail(e)),
            None => break,
        }
    }
    Ok(())
}
