//! `ringmq`: the admin command line. It talks to a running broker through the native client
//! (`ringmq::client`) only, so it builds without the `broker` feature.
//!
//! Topics (create, update, delete, list, describe), sending one message, looking messages
//! up by id, key or queue offset, consumer-group offsets, members, progress (lag) and
//! reset by time, and `consume`: a simple pull loop, or with `--group` a member of a
//! consumer group (a push consumer: concurrent or orderly, clustering or broadcasting)
//! that prints one line per message it processed, with the processing interval.
//!
//! Output is plain text for people; `--json` prints JSON instead (one document per command,
//! or one object per line for `consume`). Errors go to stderr as `ringmq: <message>`, broker
//! error codes by name; the exit code is 2 for usage errors (bad flags, values the client
//! refuses before sending) and 1 for everything else (broker errors, unreachable broker,
//! nothing found).

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::{Args, Parser, Subcommand, ValueEnum};
use serde_json::{json, Value};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::{mpsc, Notify};

use ringmq::client::{
    Client, ClientConfig, ClientError, ConsumeFrom, ConsumeStatus, Message, MessageId,
    MessageModel, OrderlyStatus, OutgoingMessage, Producer, PullStatus, PushConsumer,
    PushConsumerOptions, TagExpression, CONSUME_THREADS_MAX,
};
use ringmq::protocol::ErrorCode;

/// The broker address when neither `--broker` nor `RINGMQ_BROKER` gives one.
const BROKER_DEFAULT: &str = "127.0.0.1:7800";
/// The environment variable that gives the broker address.
const BROKER_ENV: &str = "RINGMQ_BROKER";
/// Messages asked for in one pull by `consume` (the broker's default batch).
const CONSUME_BATCH: u32 = 32;
/// The broker's longest long-polling wait.
const WAIT_MS_MAX: u64 = 60_000;
/// Long-polling wait of `consume --follow` when `--wait-ms` is not given.
const FOLLOW_WAIT_MS_DEFAULT: u64 = 5_000;
/// Pause after a retriable pull failure in `consume --follow`.
const FOLLOW_RETRY_MS: u64 = 1_000;
/// Most messages a key lookup may ask for (the broker's limit).
const KEY_MAX_LIMIT: u32 = 1024;
/// Property names the record uses for tags and keys (shown on their own lines).
const PROP_TAGS: &str = "TAGS";
const PROP_KEYS: &str = "KEYS";
/// Help heading of the options every subcommand takes.
const GLOBAL: &str = "Global options";
/// Longest `consume --process-ms`.
const PROCESS_MS_MAX: u64 = 3_600_000;

#[derive(Parser, Debug)]
#[command(
    name = "ringmq",
    version,
    about = "Admin command line for a ringmq broker: topics, messages, offsets, consumer groups",
    long_about = "Admin command line for a ringmq broker: topics, messages, offsets, consumer \
                  groups.\n\nThe broker address comes from --broker, else the RINGMQ_BROKER \
                  environment variable, else 127.0.0.1:7800.\n\nErrors are printed to stderr as \
                  `ringmq: <message>` (broker error codes by name). Exit codes: 0 success, 1 \
                  broker error, unreachable broker or nothing found, 2 usage error."
)]
struct Cli {
    /// Broker address, host:port (else $RINGMQ_BROKER, else 127.0.0.1:7800)
    #[arg(long, global = true, value_name = "ADDR", help_heading = GLOBAL)]
    broker: Option<String>,
    /// Print JSON instead of text (consume: one JSON object per line)
    #[arg(long, global = true, help_heading = GLOBAL)]
    json: bool,
    /// Time one request (and connecting) may take, in ms
    #[arg(long, global = true, value_name = "MS", default_value_t = 3_000, help_heading = GLOBAL,
          value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    timeout_ms: u64,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Create, change, delete, list and describe topics
    #[command(subcommand)]
    Topic(TopicCommand),
    /// Send one message; prints its message id, queue and queue offset
    Send(SendArgs),
    /// Look messages up by message id, by key, or by queue offset
    #[command(subcommand)]
    Message(MessageCommand),
    /// A consumer group's committed offsets
    #[command(subcommand)]
    Offset(OffsetCommand),
    /// Consumer groups: members, progress (lag), offset reset by time
    #[command(subcommand)]
    Group(GroupCommand),
    /// Pull messages and print one line each (queue, offset, tags, body); with --group,
    /// consume as a member of a consumer group
    ///
    /// Without --group: a plain pull loop over the topic's queues (no group, nothing
    /// committed). Without --follow it stops once every queue is drained (or after --max
    /// messages); with --follow it keeps waiting for new ones.
    ///
    /// With --group GROUP: a push consumer in that group. The broker divides the topic's
    /// queues among the group's live members, and offsets are committed to the broker
    /// (clustering; with --broadcast every member gets every message and keeps its offsets
    /// in a local file); --orderly consumes each queue one message at a time, in offset
    /// order, under the queue's broker lock. It prints one line per processed message,
    /// flushed at once (with --json, one object per line with the same fields):
    ///
    ///   MSG client=ID queue=Q offset=O start_ns=T0 end_ns=T1 key=KEY body=BODY
    ///
    /// where T0 and T1 are wall-clock times (ns since the UNIX epoch) around the processing
    /// of the message (--process-ms of sleep), KEY is the message's first key (`-`: none).
    /// It runs until SIGTERM or SIGINT, or --max messages, then leaves the group cleanly
    /// (waits for messages in progress, commits, unlocks, unregisters) and exits 0.
    Consume(ConsumeArgs),
}

#[derive(Subcommand, Debug)]
enum TopicCommand {
    /// Create a topic (fails with TopicExists if it exists)
    Create {
        /// Topic name
        name: String,
        /// Number of queues
        #[arg(long, value_name = "N", default_value_t = 8,
              value_parser = clap::value_parser!(u32).range(1..))]
        queues: u32,
    },
    /// Change a topic's queue count (queue counts only grow)
    Update {
        /// Topic name
        name: String,
        /// New number of queues
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
        queues: u32,
    },
    /// Delete a topic
    Delete {
        /// Topic name
        name: String,
    },
    /// List the topics, one per line
    List,
    /// Show a topic's queues: min and max offset and message count per queue, and totals
    Describe {
        /// Topic name
        name: String,
    },
}

#[derive(Args, Debug)]
struct SendArgs {
    /// Topic to send to (created on first use if the broker auto-creates topics)
    topic: String,
    /// The message body (UTF-8 text); `-` reads the body from stdin
    body: String,
    /// The message's tag
    #[arg(long, value_name = "T")]
    tags: Option<String>,
    /// A key for lookups by key (repeat for several; no spaces)
    #[arg(long = "key", value_name = "K")]
    keys: Vec<String>,
    /// A user property, name=value (repeat for several)
    #[arg(long = "property", value_name = "K=V", value_parser = parse_property)]
    properties: Vec<(String, String)>,
    /// Messages with the same sharding key go to the same queue
    #[arg(long, value_name = "S")]
    sharding_key: Option<String>,
}

#[derive(Subcommand, Debug)]
enum MessageCommand {
    /// The message with this id (fails when there is none)
    Id {
        /// Message id (32 hex digits, as `send` prints it; case does not matter)
        msg_id: String,
        #[command(flatten)]
        show: ShowArgs,
    },
    /// Messages of TOPIC with key KEY, newest first (fails when there are none)
    Key {
        /// Topic name
        topic: String,
        /// One of the message's keys
        key: String,
        /// Only messages stored at or after this time (ms since the UNIX epoch)
        #[arg(long, value_name = "MS", default_value_t = 0)]
        begin_ms: i64,
        /// Only messages stored at or before this time (ms since the UNIX epoch; default: no
        /// limit)
        #[arg(long, value_name = "MS")]
        end_ms: Option<i64>,
        /// Most messages to show
        #[arg(long, value_name = "N", default_value_t = 32,
              value_parser = clap::value_parser!(u32).range(1..=KEY_MAX_LIMIT as i64))]
        max: u32,
        #[command(flatten)]
        show: ShowArgs,
    },
    /// The message at OFFSET of queue QUEUE of TOPIC (fails when there is none)
    Offset {
        /// Topic name
        topic: String,
        /// Queue id
        queue: u32,
        /// Queue offset of the message
        offset: u64,
        #[command(flatten)]
        show: ShowArgs,
    },
}

#[derive(Args, Debug, Clone, Copy)]
struct ShowArgs {
    /// Show bodies as hex instead of UTF-8 text (invalid UTF-8 is otherwise replaced)
    #[arg(long)]
    hex: bool,
}

#[derive(Subcommand, Debug)]
enum OffsetCommand {
    /// GROUP's committed offset in every queue of TOPIC (`-`: none committed)
    Query {
        /// Consumer group
        group: String,
        /// Topic name
        topic: String,
    },
    /// Set GROUP's committed offset of queue QUEUE of TOPIC to OFFSET
    Commit {
        /// Consumer group
        group: String,
        /// Topic name
        topic: String,
        /// Queue id
        queue: u32,
        /// The next offset the group will consume
        offset: u64,
    },
}

#[derive(Subcommand, Debug)]
enum GroupCommand {
    /// The group's live members and the queues assigned to each
    Members {
        /// Consumer group
        group: String,
    },
    /// Committed offset, max offset and lag per queue of TOPIC, and the total lag
    Progress {
        /// Consumer group
        group: String,
        /// Topic name
        topic: String,
    },
    /// Move the group's offsets in TOPIC to the first message stored at or after a time
    ///
    /// Every queue's committed offset moves (backwards too); running members re-read their
    /// offsets. Prints the resulting progress.
    ResetOffset(ResetArgs),
}

#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("when").required(true).args(["timestamp_ms", "time"])))]
struct ResetArgs {
    /// Consumer group
    group: String,
    /// Topic name
    topic: String,
    /// The time, in ms since the UNIX epoch
    #[arg(long, value_name = "MS")]
    timestamp_ms: Option<i64>,
    /// The time, RFC 3339 (e.g. 2024-05-01T12:00:00Z or 2024-05-01T14:00:00.5+02:00)
    #[arg(long, value_name = "RFC3339", value_parser = parse_rfc3339_ms)]
    time: Option<i64>,
}

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
struct ConsumeArgs {
    /// Topic name
    topic: String,
    /// Only this queue (default: every queue of the topic)
    #[arg(long, value_name = "Q")]
    queue: Option<u32>,
    /// Start every consumed queue at this queue offset (below a queue's first kept message:
    /// from that message; past its end: from its end)
    #[arg(long, value_name = "N", conflicts_with = "from")]
    from_offset: Option<u64>,
    /// Where to start when --from-offset is not given; with --group, where a queue the
    /// group has no committed offset for starts (a committed offset always wins)
    #[arg(long, value_enum, default_value_t = From::First)]
    from: From,
    /// Stop after this many messages (with --group: after processing this many; the
    /// consumer then leaves the group cleanly)
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    max: Option<u64>,
    /// Only messages with one of these tags: `*` (all) or `A || B`
    #[arg(long, value_name = "EXPR")]
    tags: Option<String>,
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
    /// This member's client id (default: ringmq-<pid>-0); with --broadcast, a stable id
    /// resumes from the offsets of an earlier run
    #[arg(long, value_name = "ID", requires = "group", help_heading = GROUP_ONLY)]
    client_id: Option<String>,
    /// Time spent processing each message (a sleep), in ms [default: 0]: makes processing
    /// intervals visible in the output
    #[arg(long, value_name = "MS", requires = "group", help_heading = GROUP_ONLY,
          value_parser = clap::value_parser!(u64).range(0..=PROCESS_MS_MAX))]
    process_ms: Option<u64>,
    /// Also print `START client=ID queue=Q offset=O start_ns=T0 key=KEY` when the
    /// processing of a message begins (before its MSG line)
    #[arg(long, requires = "group", help_heading = GROUP_ONLY)]
    print_start: bool,
    /// Heartbeat interval, in ms [default: 3000, or a third of --session-timeout-ms]
    #[arg(long, value_name = "MS", requires = "group", help_heading = GROUP_ONLY,
          value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    heartbeat_ms: Option<u64>,
    /// The broker's session timeout (its --session-timeout-ms), in ms [default: 10000]:
    /// orderly consumption pauses when no heartbeat was acknowledged for that long minus
    /// one heartbeat interval. Give the broker's value when it is not the default
    #[arg(long, value_name = "MS", requires = "group", help_heading = GROUP_ONLY,
          value_parser = clap::value_parser!(u64).range(2..=3_600_000))]
    session_timeout_ms: Option<u64>,
    /// Listener threads: messages processed at once over all queues [default: 20]
    #[arg(long, value_name = "N", requires = "group", help_heading = GROUP_ONLY,
          value_parser = clap::value_parser!(u64).range(1..=CONSUME_THREADS_MAX as u64))]
    threads: Option<u64>,
}

/// Why a command failed; it sets the exit code.
#[derive(Debug)]
enum Failure {
    /// Bad input (exit 2).
    Usage(String),
    /// The broker refused, could not be reached, or had nothing (exit 1).
    Failed(String),
}

impl Failure {
    fn exit_code(&self) -> u8 {
        match self {
            Failure::Usage(_) => 2,
            Failure::Failed(_) => 1,
        }
    }
    fn message(&self) -> &str {
        match self {
            Failure::Usage(m) | Failure::Failed(m) => m,
        }
    }
}

type CmdResult<T = ()> = std::result::Result<T, Failure>;

/// Turns a client error into a failure with a message that names the broker's error code.
fn client_failure(broker: &str, e: ClientError) -> Failure {
    match e {
        ClientError::Broker {
            code,
            raw_code,
            message,
        } => Failure::Failed(match code {
            Some(code) => format!("{code:?}: {message}"),
            None => format!("broker error {raw_code}: {message}"),
        }),
        ClientError::InvalidArgument(m) => Failure::Usage(m),
        e @ ClientError::BodyTooLarge { .. } => Failure::Usage(e.to_string()),
        // Local files, not the broker.
        e @ ClientError::OffsetStore(_) => Failure::Failed(e.to_string()),
        // Transport, timeouts, a peer that does not speak the protocol: name the address.
        e => Failure::Failed(format!("broker {broker}: {e}")),
    }
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(
                e.kind(),
                ErrorKind::DisplayHelp
                    | ErrorKind::DisplayVersion
                    | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            ) {
                // Help and version to stdout (the latter: usage to stderr, exit 2).
                e.exit();
            }
            let text = e.render().to_string();
            let text = text.strip_prefix("error: ").unwrap_or(&text);
            eprint!("ringmq: {text}");
            return ExitCode::from(2);
        }
    };
    let broker = cli
        .broker
        .clone()
        .or_else(|| std::env::var(BROKER_ENV).ok().filter(|s| !s.is_empty()))
        .unwrap_or_else(|| BROKER_DEFAULT.to_owned());
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("ringmq: cannot start the tokio runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let ctx = Ctx {
        broker,
        json: cli.json,
        timeout_ms: cli.timeout_ms,
    };
    match runtime.block_on(run(&ctx, cli.command)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            eprintln!("ringmq: {}", f.message());
            ExitCode::from(f.exit_code())
        }
    }
}

/// What every command needs.
struct Ctx {
    broker: String,
    json: bool,
    timeout_ms: u64,
}

impl Ctx {
    fn config(&self) -> ClientConfig {
        let mut config = ClientConfig::new(self.broker.clone());
        config.request_timeout_ms = self.timeout_ms;
        config.connect_timeout_ms = self.timeout_ms;
        config
    }

    async fn client(&self) -> CmdResult<Client> {
        Client::connect(self.config())
            .await
            .map_err(|e| self.fail(e))
    }

    fn fail(&self, e: ClientError) -> Failure {
        client_failure(&self.broker, e)
    }
}

/// Writes `text` to stdout (a newline is added). A closed pipe (`ringmq ... | head`) ends
/// the program quietly.
fn emit(text: &str) {
    let mut out = std::io::stdout().lock();
    let written = out
        .write_all(text.as_bytes())
        .and_then(|_| out.write_all(b"\n"))
        .and_then(|_| out.flush());
    if let Err(e) = written {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("ringmq: writing to stdout: {e}");
        std::process::exit(1);
    }
}

fn emit_json(value: &Value) {
    emit(&serde_json::to_string_pretty(value).unwrap_or_else(|_| "null".into()));
}

async fn run(ctx: &Ctx, command: Command) -> CmdResult {
    match command {
        Command::Topic(c) => topic(ctx, c).await,
        Command::Send(a) => send(ctx, a).await,
        Command::Message(c) => message(ctx, c).await,
        Command::Offset(c) => offset(ctx, c).await,
        Command::Group(c) => group(ctx, c).await,
        Command::Consume(a) => consume(ctx, a).await,
    }
}

// ---- topics ----

async fn topic(ctx: &Ctx, command: TopicCommand) -> CmdResult {
    let client = ctx.client().await?;
    match command {
        TopicCommand::Create { name, queues } => {
            client
                .create_topic(&name, queues)
                .await
                .map_err(|e| ctx.fail(e))?;
            if ctx.json {
                emit_json(&json!({"topic": name, "queues": queues, "created": true}));
            } else {
                emit(&format!("created topic {name} with {queues} queues"));
            }
        }
        TopicCommand::Update { name, queues } => {
            client
                .update_topic(&name, queues)
                .await
                .map_err(|e| ctx.fail(e))?;
            if ctx.json {
                emit_json(&json!({"topic": name, "queues": queues, "updated": true}));
            } else {
                emit(&format!("updated topic {name}: {queues} queues"));
            }
        }
        TopicCommand::Delete { name } => {
            client.delete_topic(&name).await.map_err(|e| ctx.fail(e))?;
            if ctx.json {
                emit_json(&json!({"topic": name, "deleted": true}));
            } else {
                emit(&format!("deleted topic {name}"));
            }
        }
        TopicCommand::List => {
            let mut topics = client.list_topics().await.map_err(|e| ctx.fail(e))?;
            topics.sort();
            if ctx.json {
                emit_json(&json!(topics));
            } else if !topics.is_empty() {
                emit(&topics.join("\n"));
            }
        }
        TopicCommand::Describe { name } => {
            let info = client
                .describe_topic(&name)
                .await
                .map_err(|e| ctx.fail(e))?;
            let total: u64 = info
                .queues
                .iter()
                .map(|q| q.max_offset.saturating_sub(q.min_offset))
                .sum();
            if ctx.json {
                let queues: Vec<Value> = info
                    .queues
                    .iter()
                    .map(|q| {
                        json!({
                            "queue": q.queue_id,
                            "min_offset": q.min_offset,
                            "max_offset": q.max_offset,
                            "messages": q.max_offset.saturating_sub(q.min_offset),
                        })
                    })
                    .collect();
                emit_json(&json!({
                    "topic": info.topic,
                    "queue_count": info.queues.len(),
                    "queues": queues,
                    "total_messages": total,
                }));
            } else {
                let mut rows: Vec<Vec<String>> = info
                    .queues
                    .iter()
                    .map(|q| {
                        vec![
                            q.queue_id.to_string(),
                            q.min_offset.to_string(),
                            q.max_offset.to_string(),
                            q.max_offset.saturating_sub(q.min_offset).to_string(),
                        ]
                    })
                    .collect();
                rows.push(vec![
                    "total".into(),
                    String::new(),
                    String::new(),
                    total.to_string(),
                ]);
                emit(&format!(
                    "topic {}: {} queues, {total} messages\n{}",
                    info.topic,
                    info.queues.len(),
                    table(&["QUEUE", "MIN", "MAX", "MESSAGES"], &rows)
                ));
            }
        }
    }
    Ok(())
}

// ---- send ----

async fn send(ctx: &Ctx, args: SendArgs) -> CmdResult {
    let body = if args.body == "-" {
        let mut body = Vec::new();
        std::io::stdin()
            .read_to_end(&mut body)
            .map_err(|e| Failure::Failed(format!("reading the body from stdin: {e}")))?;
        body
    } else {
        args.body.into_bytes()
    };
    let mut message = OutgoingMessage::new(body).with_keys(args.keys);
    if let Some(tags) = args.tags {
        message = message.with_tags(tags);
    }
    for (name, value) in args.properties {
        message = message.with_property(name, value);
    }
    if let Some(key) = args.sharding_key {
        message = message.with_sharding_key(key);
    }
    // Refuse a bad message before connecting: a usage error, not a broker one.
    message.validate().map_err(|e| ctx.fail(e))?;
    let producer = Producer::connect(ctx.config())
        .await
        .map_err(|e| ctx.fail(e))?;
    let sent = producer
        .send(&args.topic, message)
        .await
        .map_err(|e| ctx.fail(e))?;
    if ctx.json {
        emit_json(&json!({
            "topic": args.topic,
            "msg_id": sent.msg_id,
            "queue": sent.queue_id,
            "offset": sent.queue_offset,
        }));
    } else {
        emit(&format!(
            "msg_id={} queue={} offset={}",
            sent.msg_id, sent.queue_id, sent.queue_offset
        ));
    }
    Ok(())
}

fn parse_property(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((name, value)) if !name.is_empty() => Ok((name.to_owned(), value.to_owned())),
        _ => Err(format!("expected name=value, got {s:?}")),
    }
}

// ---- message lookups ----

async fn message(ctx: &Ctx, command: MessageCommand) -> CmdResult {
    let client = ctx.client().await?;
    match command {
        MessageCommand::Id { msg_id, show } => {
            // Ids are upper-case hex; accept a lower-case copy too (errors quote the input).
            let upper = msg_id.to_ascii_uppercase();
            let msg_id = if MessageId::parse(&upper).is_ok() {
                upper
            } else {
                msg_id
            };
            let found = client
                .message_by_id(&msg_id)
                .await
                .map_err(|e| ctx.fail(e))?;
            match found {
                Some(m) => print_messages(ctx, &[m], show, false),
                None => Err(Failure::Failed(format!("no message with id {msg_id}"))),
            }
        }
        MessageCommand::Key {
            topic,
            key,
            begin_ms,
            end_ms,
            max,
            show,
        } => {
            let end_ms = end_ms.unwrap_or(i64::MAX);
            if end_ms < begin_ms {
                return Err(Failure::Usage(format!(
                    "--end-ms {end_ms} is before --begin-ms {begin_ms}"
                )));
            }
            let found = client
                .messages_by_key(&topic, &key, begin_ms, end_ms, max)
                .await
                .map_err(|e| ctx.fail(e))?;
            if found.is_empty() {
                return Err(Failure::Failed(format!(
                    "no message of topic {topic} with key {key}"
                )));
            }
            print_messages(ctx, &found, show, true)
        }
        MessageCommand::Offset {
            topic,
            queue,
            offset,
            show,
        } => {
            let pulled = client
                .pull(&topic, queue, offset, 1, Duration::ZERO, &[])
                .await
                .map_err(|e| ctx.fail(e))?;
            match pulled.messages.into_iter().next() {
                Some(m) if pulled.status == PullStatus::Found && m.queue_offset() == offset => {
                    print_messages(ctx, &[m], show, false)
                }
                _ => Err(Failure::Failed(format!(
                    "no message at offset {offset} of {topic} queue {queue} (it holds offsets \
                     {}..{})",
                    pulled.min_offset, pulled.max_offset
                ))),
            }
        }
    }
}

/// Prints messages in full: text blocks separated by blank lines, or JSON (`as_list`: an
/// array even for one message).
fn print_messages(ctx: &Ctx, messages: &[Message], show: ShowArgs, as_list: bool) -> CmdResult {
    if ctx.json {
        let values: Vec<Value> = messages.iter().map(|m| message_json(m, show.hex)).collect();
        if as_list {
            emit_json(&Value::Array(values));
        } else if let Some(v) = values.into_iter().next() {
            emit_json(&v);
        }
        return Ok(());
    }
    let blocks: Vec<String> = messages.iter().map(|m| message_text(m, show.hex)).collect();
    emit(&blocks.join("\n\n"));
    Ok(())
}

fn message_text(m: &Message, hex: bool) -> String {
    let keys: Vec<&str> = m.keys().collect();
    let props = user_properties(m);
    let mut s = String::new();
    let _ = writeln!(s, "topic:       {}", m.topic());
    let _ = writeln!(s, "queue:       {}", m.queue_id());
    let _ = writeln!(s, "offset:      {}", m.queue_offset());
    let _ = writeln!(s, "msg id:      {}", m.msg_id().encode());
    let _ = writeln!(s, "tags:        {}", m.tags().unwrap_or("-"));
    let _ = writeln!(
        s,
        "keys:        {}",
        if keys.is_empty() {
            "-".to_owned()
        } else {
            keys.join(" ")
        }
    );
    let _ = writeln!(
        s,
        "properties:  {}",
        if props.is_empty() {
            "-".to_owned()
        } else {
            props
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(" ")
        }
    );
    let _ = writeln!(
        s,
        "born:        {} ({} ms) from {}",
        format_ms(m.born_timestamp_ms()),
        m.born_timestamp_ms(),
        m.born_host()
    );
    let _ = writeln!(
        s,
        "stored:      {} ({} ms)",
        format_ms(m.store_timestamp_ms()),
        m.store_timestamp_ms()
    );
    let _ = writeln!(s, "body bytes:  {}", m.body().len());
    let _ = write!(s, "body:        {}", body_text(m.body(), hex, false));
    s
}

fn message_json(m: &Message, hex: bool) -> Value {
    let props: serde_json::Map<String, Value> = user_properties(m)
        .into_iter()
        .map(|(k, v)| (k.to_owned(), Value::String(v.to_owned())))
        .collect();
    let mut v = json!({
        "topic": m.topic(),
        "queue": m.queue_id(),
        "offset": m.queue_offset(),
        "msg_id": m.msg_id().encode(),
        "tags": m.tags(),
        "keys": m.keys().collect::<Vec<_>>(),
        "properties": props,
        "born_timestamp_ms": m.born_timestamp_ms(),
        "store_timestamp_ms": m.store_timestamp_ms(),
        "born_host": m.born_host().to_string(),
        "reconsume_times": m.reconsume_times(),
    });
    if hex {
        v["body_hex"] = Value::String(to_hex(m.body()));
    } else {
        v["body"] = Value::String(String::from_utf8_lossy(m.body()).into_owned());
    }
    v
}

/// The message's properties other than tags and keys (shown on their own).
fn user_properties(m: &Message) -> Vec<(&str, &str)> {
    m.properties()
        .iter()
        .filter(|(k, _)| *k != PROP_TAGS && *k != PROP_KEYS)
        .collect()
}

/// A body as text: hex, or UTF-8 with invalid bytes replaced; `one_line` escapes control
/// characters (newlines, tabs, ...) so that a message takes one line.
fn body_text(body: &[u8], hex: bool, one_line: bool) -> String {
    if hex {
        return to_hex(body);
    }
    let text = String::from_utf8_lossy(body);
    if !one_line {
        return text.into_owned();
    }
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() || c == '\\' {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

fn to_hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

// ---- offsets ----

async fn offset(ctx: &Ctx, command: OffsetCommand) -> CmdResult {
    let client = ctx.client().await?;
    match command {
        OffsetCommand::Query { group, topic } => {
            let info = client
                .describe_topic(&topic)
                .await
                .map_err(|e| ctx.fail(e))?;
            let mut committed = Vec::with_capacity(info.queues.len());
            for q in &info.queues {
                let offset = client
                    .query_offset(&group, &topic, q.queue_id)
                    .await
                    .map_err(|e| ctx.fail(e))?;
                committed.push((q.queue_id, offset));
            }
            if ctx.json {
                let queues: Vec<Value> = committed
                    .iter()
                    .map(|(q, o)| json!({"queue": q, "committed_offset": o}))
                    .collect();
                emit_json(&json!({"group": group, "topic": topic, "queues": queues}));
            } else {
                let rows: Vec<Vec<String>> = committed
                    .iter()
                    .map(|(q, o)| vec![q.to_string(), opt_offset(*o)])
                    .collect();
                emit(&format!(
                    "group {group}, topic {topic}\n{}",
                    table(&["QUEUE", "COMMITTED"], &rows)
                ));
            }
        }
        OffsetCommand::Commit {
            group,
            topic,
            queue,
            offset,
        } => {
            client
                .commit_offset(&group, &topic, queue, offset)
                .await
                .map_err(|e| ctx.fail(e))?;
            if ctx.json {
                emit_json(&json!({
                    "group": group, "topic": topic, "queue": queue,
                    "committed_offset": offset,
                }));
            } else {
                emit(&format!(
                    "committed offset {offset} for group {group} on {topic} queue {queue}"
                ));
            }
        }
    }
    Ok(())
}

fn opt_offset(o: Option<u64>) -> String {
    o.map_or_else(|| "-".to_owned(), |o| o.to_string())
}

// ---- consumer groups ----

async fn group(ctx: &Ctx, command: GroupCommand) -> CmdResult {
    let client = ctx.client().await?;
    match command {
        GroupCommand::Members { group } => {
            let info = client
                .group_members(&group)
                .await
                .map_err(|e| ctx.fail(e))?;
            if ctx.json {
                let members: Vec<Value> = info
                    .members
                    .iter()
                    .map(|m| {
                        let topics: Vec<Value> = m
                            .topics
                            .iter()
                            .map(|t| json!({"topic": t.topic, "queues": t.queues}))
                            .collect();
                        json!({"client_id": m.client_id, "topics": topics})
                    })
                    .collect();
                emit_json(&json!({
                    "group": info.group,
                    "generation": info.generation,
                    "members": members,
                }));
            } else {
                let mut s = format!(
                    "group {}: generation {}, {} member{}",
                    info.group,
                    info.generation,
                    info.members.len(),
                    if info.members.len() == 1 { "" } else { "s" }
                );
                for m in &info.members {
                    let _ = write!(s, "\nmember {}", m.client_id);
                    if m.topics.is_empty() {
                        s.push_str("\n  (no queues)");
                    }
                    for t in &m.topics {
                        let queues: Vec<String> = t.queues.iter().map(u32::to_string).collect();
                        let _ = write!(
                            s,
                            "\n  {}: {}",
                            t.topic,
                            if queues.is_empty() {
                                "(no queues)".to_owned()
                            } else {
                                format!("queues {}", queues.join(" "))
                            }
                        );
                    }
                }
                emit(&s);
            }
        }
        GroupCommand::Progress { group, topic } => {
            print_progress(ctx, &client, &group, &topic, None).await?;
        }
        GroupCommand::ResetOffset(args) => {
            let Some(timestamp_ms) = args.timestamp_ms.or(args.time) else {
                return Err(Failure::Usage("give --timestamp-ms or --time".to_owned()));
            };
            client
                .reset_offset_by_time(&args.group, &args.topic, timestamp_ms)
                .await
                .map_err(|e| ctx.fail(e))?;
            print_progress(ctx, &client, &args.group, &args.topic, Some(timestamp_ms)).await?;
        }
    }
    Ok(())
}

/// Prints the group's progress in the topic; `reset_to`: after a reset to that time.
async fn print_progress(
    ctx: &Ctx,
    client: &Client,
    group: &str,
    topic: &str,
    reset_to: Option<i64>,
) -> CmdResult {
    let progress = client
        .consumer_progress(group, topic)
        .await
        .map_err(|e| ctx.fail(e))?;
    let total: u64 = progress.iter().map(|q| q.lag).sum();
    if ctx.json {
        let queues: Vec<Value> = progress
            .iter()
            .map(|q| {
                json!({
                    "queue": q.queue_id,
                    "committed_offset": q.committed_offset,
                    "max_offset": q.max_offset,
                    "lag": q.lag,
                })
            })
            .collect();
        let mut v = json!({"group": group, "topic": topic, "queues": queues, "total_lag": total});
        if let Some(ms) = reset_to {
            v["reset_to_ms"] = json!(ms);
        }
        emit_json(&v);
    } else {
        let mut rows: Vec<Vec<String>> = progress
            .iter()
            .map(|q| {
                vec![
                    q.queue_id.to_string(),
                    opt_offset(q.committed_offset),
                    q.max_offset.to_string(),
                    q.lag.to_string(),
                ]
            })
            .collect();
        rows.push(vec![
            "total".into(),
            String::new(),
            String::new(),
            total.to_string(),
        ]);
        let head = match reset_to {
            Some(ms) => format!(
                "reset group {group} on topic {topic} to {} ({ms} ms)",
                format_ms(ms)
            ),
            None => format!("group {group}, topic {topic}: total lag {total}"),
        };
        emit(&format!(
            "{head}\n{}",
            table(&["QUEUE", "COMMITTED", "MAX", "LAG"], &rows)
        ));
    }
    Ok(())
}

// ---- consume ----

async fn consume(ctx: &Ctx, args: ConsumeArgs) -> CmdResult {
    if args.group.is_some() {
        return consume_group(ctx, args).await;
    }
    let filter = match &args.tags {
        Some(expr) => TagExpression::parse(expr).map_err(|e| ctx.fail(e))?,
        None => TagExpression::parse("*").map_err(|e| ctx.fail(e))?,
    };
    let tags: Vec<String> = filter.tags().to_vec();
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
    let printer = Printer {
        json: ctx.json,
        hex: args.hex,
    };
    let max = args.max.unwrap_or(u64::MAX);
    if args.follow {
        let wait = Duration::from_millis(args.wait_ms.unwrap_or(FOLLOW_WAIT_MS_DEFAULT));
        follow(ctx, &client, &args.topic, starts, &tags, wait, max, printer).await
    } else {
        let wait = Duration::from_millis(args.wait_ms.unwrap_or(0));
        drain(ctx, &client, &args.topic, starts, &tags, wait, max, printer).await
    }
}

#[derive(Clone, Copy)]
struct Printer {
    json: bool,
    hex: bool,
}

impl Printer {
    fn print(&self, m: &Message) {
        if self.json {
            emit(&message_json(m, self.hex).to_string());
        } else {
            emit(&format!(
                "queue={} offset={} tags={} body={}",
                m.queue_id(),
                m.queue_offset(),
                m.tags().unwrap_or("-"),
                body_text(m.body(), self.hex, true)
            ));
        }
    }
}

/// What one pull means for the loop: keep going from `next`, or this queue is drained.
enum Step {
    Continue(u64),
    Drained,
}

fn step(status: PullStatus, from: u64, next: u64) -> Step {
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
#[allow(clippy::too_many_arguments)]
async fn drain(
    ctx: &Ctx,
    client: &Client,
    topic: &str,
    starts: Vec<(u32, u64)>,
    tags: &[String],
    wait: Duration,
    max: u64,
    printer: Printer,
) -> CmdResult {
    let tag_refs: Vec<&str> = tags.iter().map(String::as_str).collect();
    let mut printed = 0u64;
    for (queue, mut offset) in starts {
        loop {
            if printed >= max {
                return Ok(());
            }
            let batch = CONSUME_BATCH.min(u32::try_from(max - printed).unwrap_or(u32::MAX));
            let pulled = client
                .pull(topic, queue, offset, batch, wait, &tag_refs)
                .await
                .map_err(|e| ctx.fail(e))?;
            for m in &pulled.messages {
                if printed >= max {
                    return Ok(());
                }
                printer.print(m);
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
#[allow(clippy::too_many_arguments)]
async fn follow(
    ctx: &Ctx,
    client: &Client,
    topic: &str,
    starts: Vec<(u32, u64)>,
    tags: &[String],
    wait: Duration,
    max: u64,
    printer: Printer,
) -> CmdResult {
    let (tx, mut rx) = mpsc::channel::<Result<Vec<Message>, ClientError>>(64);
    for (queue, start) in starts {
        let client = client.clone();
        let topic = topic.to_owned();
        let tags = tags.to_vec();
        let tx = tx.clone();
        tokio::spawn(async move {
            let tag_refs: Vec<&str> = tags.iter().map(String::as_str).collect();
            let mut offset = start;
            let mut warned = false;
            loop {
                match client
                    .pull(&topic, queue, offset, CONSUME_BATCH, wait, &tag_refs)
                    .await
                {
                    Ok(pulled) => {
                        warned = false;
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
                    printer.print(m);
                    printed += 1;
                }
            }
            Some(Err(e)) => return Err(ctx.fail(e)),
            None => break,
        }
    }
    Ok(())
}

// ---- consume --group ----

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
}

impl GroupListener {
    /// Processes a batch and answers true, or answers false without touching it when
    /// --max leaves no room for it (the batch then stays uncommitted, for the next
    /// owner of its queue).
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

    /// A `MSG` line (processed), or a `START` line (`end_ns` None: processing begins).
    fn line(&self, m: &Message, start_ns: u64, end_ns: Option<u64>) -> String {
        let key = m.keys().next().unwrap_or("-");
        if self.json {
            let mut v = json!({
                "event": if end_ns.is_some() { "msg" } else { "start" },
                "client": self.client_id,
                "topic": m.topic(),
                "queue": m.queue_id(),
                "offset": m.queue_offset(),
                "start_ns": start_ns,
                "key": key,
            });
            if let Some(end_ns) = end_ns {
                v["end_ns"] = json!(end_ns);
                if self.hex {
                    v["body_hex"] = Value::String(to_hex(m.body()));
                } else {
                    v["body"] = Value::String(String::from_utf8_lossy(m.body()).into_owned());
                }
            }
            return v.to_string();
        }
        match end_ns {
            Some(end_ns) => format!(
                "MSG client={} queue={} offset={} start_ns={start_ns} end_ns={end_ns} key={key} \
                 body={}",
                self.client_id,
                m.queue_id(),
                m.queue_offset(),
                body_text(m.body(), self.hex, true)
            ),
            None => format!(
                "START client={} queue={} offset={} start_ns={start_ns} key={key}",
                self.client_id,
                m.queue_id(),
                m.queue_offset()
            ),
        }
    }
}

/// `consume --group`: a push consumer that prints what it processes, until a signal or
/// --max, then leaves the group cleanly.
async fn consume_group(ctx: &Ctx, args: ConsumeArgs) -> CmdResult {
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
    let consumer =
        PushConsumer::new(config.clone(), group.as_str(), options).map_err(|e| ctx.fail(e))?;
    consumer
        .subscribe(&args.topic, args.tags.as_deref().unwrap_or("*"))
        .map_err(|e| ctx.fail(e))?;
    let listener = Arc::new(GroupListener {
        client_id: config.client_id.clone(),
        json: ctx.json,
        hex: args.hex,
        print_start: args.print_start,
        process: Duration::from_millis(args.process_ms.unwrap_or(0)),
        budget: AtomicU64::new(args.max.unwrap_or(u64::MAX)),
        spent: Notify::new(),
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
            if listener.process(messages) {
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
    consumer.shutdown().await.map_err(|e| ctx.fail(e))
}

// ---- output helpers ----

/// A left-aligned text table with two spaces between columns (no trailing spaces).
fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if i < widths.len() {
                widths[i] = widths[i].max(cell.chars().count());
            }
        }
    }
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut s = String::new();
        for (i, cell) in cells.enumerate() {
            if i > 0 {
                s.push_str("  ");
            }
            let _ = write!(s, "{cell:<w$}", w = widths.get(i).copied().unwrap_or(0));
        }
        s.trim_end().to_owned()
    };
    let mut out = line(&mut headers.iter().copied());
    for row in rows {
        out.push('\n');
        out.push_str(&line(&mut row.iter().map(String::as_str)));
    }
    out
}

// ---- time ----

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = i64::from((m + 9) % 12);
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The date of a day number since 1970-01-01.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = if z >= 0 { z } else { z - 146_096 } / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// ms since the epoch as RFC 3339 UTC with milliseconds.
fn format_ms(ms: i64) -> String {
    let days = ms.div_euclid(86_400_000);
    let in_day = ms.rem_euclid(86_400_000);
    let (y, mo, d) = civil_from_days(days);
    let (h, mi, s, frac) = (
        in_day / 3_600_000,
        in_day / 60_000 % 60,
        in_day / 1000 % 60,
        in_day % 1000,
    );
    format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}.{frac:03}Z")
}

/// Parses RFC 3339 (`YYYY-MM-DDTHH:MM:SS[.frac](Z|+HH:MM|-HH:MM)`; `t` or a space may stand
/// for `T`, `z` for `Z`) to ms since the epoch; fractions below a millisecond are dropped.
fn parse_rfc3339_ms(s: &str) -> Result<i64, String> {
    let bad = || format!("{s:?} is not an RFC 3339 time such as 2024-05-01T12:00:00Z");
    let b = s.as_bytes();
    let num = |range: std::ops::Range<usize>| -> Result<u32, String> {
        let part = b.get(range).ok_or_else(bad)?;
        if part.is_empty() || !part.iter().all(u8::is_ascii_digit) {
            return Err(bad());
        }
        std::str::from_utf8(part)
            .map_err(|_| bad())?
            .parse()
            .map_err(|_| bad())
    };
    let sep = |at: usize, ok: &[u8]| -> Result<(), String> {
        match b.get(at) {
            Some(c) if ok.contains(c) => Ok(()),
            _ => Err(bad()),
        }
    };
    let year = num(0..4)?;
    sep(4, b"-")?;
    let month = num(5..7)?;
    sep(7, b"-")?;
    let day = num(8..10)?;
    sep(10, b"Tt ")?;
    let hour = num(11..13)?;
    sep(13, b":")?;
    let minute = num(14..16)?;
    sep(16, b":")?;
    let second = num(17..19)?;
    let mut at = 19;
    let mut millis = 0u32;
    if b.get(at) == Some(&b'.') {
        at += 1;
        let start = at;
        while b.get(at).is_some_and(u8::is_ascii_digit) {
            at += 1;
        }
        if at == start {
            return Err(bad());
        }
        for (i, &c) in b[start..at.min(start + 3)].iter().enumerate() {
            millis += u32::from(c - b'0') * 10u32.pow(2 - i as u32);
        }
    }
    let offset_min: i64 = match b.get(at) {
        Some(b'Z' | b'z') if at + 1 == b.len() => 0,
        Some(&c @ (b'+' | b'-')) if at + 6 == b.len() => {
            let h = num(at + 1..at + 3)?;
            sep(at + 3, b":")?;
            let m = num(at + 4..at + 6)?;
            if h > 23 || m > 59 {
                return Err(bad());
            }
            let off = i64::from(h * 60 + m);
            if c == b'-' {
                -off
            } else {
                off
            }
        }
        _ => return Err(bad()),
    };
    if !(1..=12).contains(&month) || hour > 23 || minute > 59 || second > 60 {
        return Err(bad());
    }
    let days = days_from_civil(i64::from(year), month, day);
    if day == 0 || civil_from_days(days) != (i64::from(year), month, day) {
        return Err(bad());
    }
    // A leap second (60) counts as the next second's start.
    let secs = days * 86_400 + i64::from(hour) * 3600 + i64::from(minute) * 60 + i64::from(second)
        - offset_min * 60;
    Ok(secs * 1000 + i64::from(millis))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_round_trips() {
        assert_eq!(parse_rfc3339_ms("1970-01-01T00:00:00Z"), Ok(0));
        assert_eq!(
            parse_rfc3339_ms("2024-05-01T12:00:00.123Z"),
            Ok(1_714_564_800_123)
        );
        assert_eq!(
            parse_rfc3339_ms("2024-05-01T14:00:00.1234+02:00"),
            Ok(1_714_564_800_123)
        );
        assert_eq!(
            parse_rfc3339_ms("2024-02-29 00:00:00-00:30"),
            Ok(1_709_166_600_000)
        );
        assert_eq!(format_ms(1_714_564_800_123), "2024-05-01T12:00:00.123Z");
        assert_eq!(format_ms(-1), "1969-12-31T23:59:59.999Z");
        for ms in [0, 1, 951_782_400_000, 4_102_444_799_999, -86_400_001] {
            assert_eq!(parse_rfc3339_ms(&format_ms(ms)), Ok(ms), "{ms}");
        }
        for bad in [
            "",
            "2024-05-01",
            "2024-05-01T12:00:00",
            "2024-02-30T00:00:00Z",
            "2023-02-29T00:00:00Z",
            "2024-13-01T00:00:00Z",
            "2024-05-01T24:00:00Z",
            "2024-05-01T12:00:00.Z",
            "2024-05-01T12:00:00+2:00",
            "2024-05-01T12:00:00Zx",
            "+024-05-01T12:00:00Z",
        ] {
            assert!(parse_rfc3339_ms(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn bodies_stay_on_one_line() {
        assert_eq!(body_text(b"a\nb\tc\\", false, true), "a\\nb\\tc\\\\");
        assert_eq!(body_text(b"a\nb", false, false), "a\nb");
        assert_eq!(body_text(&[0xff, b'a'], false, true), "\u{fffd}a");
        assert_eq!(body_text(&[0x00, 0xab], true, true), "00ab");
    }

    #[test]
    fn tables_align_and_properties_parse() {
        let t = table(
            &["QUEUE", "MAX"],
            &[
                vec!["0".into(), "12".into()],
                vec!["total".into(), String::new()],
            ],
        );
        assert_eq!(t, "QUEUE  MAX\n0      12\ntotal");
        assert_eq!(parse_property("a=b=c"), Ok(("a".into(), "b=c".into())));
        assert_eq!(parse_property("a="), Ok(("a".into(), String::new())));
        assert!(parse_property("=b").is_err());
        assert!(parse_property("ab").is_err());
    }

    #[test]
    fn cli_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
