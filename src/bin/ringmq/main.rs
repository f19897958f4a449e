//! `ringmq`: the admin command line. It talks to a running broker through the native client
//! (`ringmq::client`) only, so it builds without the `broker` feature.
//!
//! Topics (create, update, delete, list, describe), sending one message (delayed too),
//! looking messages up by id, key or queue offset, consumer-group offsets, members,
//! progress (lag) and reset by time, dead letters (list, resend), the schedules of delayed
//! messages, and `consume`: a simple pull loop, or with `--group` a member of a
//! consumer group (a push consumer: concurrent or orderly, clustering or broadcasting)
//! that prints one line per message it processed, with the processing interval.
//!
//! Output is plain text for people; `--json` prints JSON instead (one document per command,
//! or one object per line for `consume`). Errors go to stderr as `ringmq: <message>`, broker
//! error codes by name; the exit code is 2 for usage errors (bad flags, values the client
//! refuses before sending) and 1 for everything else (broker errors, unreachable broker,
//! nothing found).
//!
//! Files: `main.rs` (this one: the command tree's root, the context every command gets,
//! failures and exit codes, dispatch), one file per command family (`topic.rs`, `send.rs`,
//! `message.rs`, `offset.rs`, `group.rs`, `dlq.rs`, `schedule.rs`, `transaction.rs`, `consume.rs` with
//! `consume/member.rs` for `consume --group`), `output.rs` (everything that renders text or JSON) and
//! `datetime.rs` (RFC 3339 times, with the `time` crate).
//!
//! Test-only options: `consume --process-ms` and `consume --print-start` exist for tests
//! and the failover measurement (`tests/ordered_consumption.rs`, `perf/failover.sh`), which
//! need processing to take time and its start to be visible. They are listed under their
//! own "Testing" heading in `ringmq consume --help` (see `consume::TestingArgs`).

mod consume;
mod datetime;
mod dlq;
mod group;
mod message;
mod offset;
mod output;
mod schedule;
mod send;
mod topic;
mod transaction;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use ringmq::client::{Client, ClientConfig, ClientError};

use crate::consume::ConsumeArgs;
use crate::dlq::DlqCommand;
use crate::group::GroupCommand;
use crate::message::MessageCommand;
use crate::offset::OffsetCommand;
use crate::schedule::ScheduleCommand;
use crate::send::SendArgs;
use crate::topic::TopicCommand;
use crate::transaction::TransactionCommand;
/// The broker address when neither `--broker` nor `RINGMQ_BROKER` gives one.
const BROKER_DEFAULT: &str = "127.0.0.1:7800";
/// The environment variable that gives the broker address.
const BROKER_ENV: &str = "RINGMQ_BROKER";
/// Help heading of the options every subcommand takes.
const GLOBAL: &str = "Global options";

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
    /// Consumer groups: members, progress (lag), offset reset by time, delete
    #[command(subcommand)]
    Group(GroupCommand),
    /// A consumer group's dead-letter topic: list its messages, resend them
    #[command(subcommand)]
    Dlq(DlqCommand),
    /// The broker's schedules of delayed messages (per shard)
    #[command(subcommand)]
    Schedule(ScheduleCommand),
    /// Transactions waiting for an outcome, and discarded half messages
    #[command(subcommand)]
    Transaction(TransactionCommand),
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
    /// of the message (--process-ms of sleep, a test-only option), KEY is the message's
    /// first key (`-`: none).
    /// It runs until SIGTERM or SIGINT, or --max messages, then leaves the group cleanly
    /// (waits for messages in progress, commits, unlocks, unregisters) and exits 0.
    Consume(ConsumeArgs),
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
    match runtime.block_on(dispatch(&ctx, cli.command)) {
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

/// Runs one command.
async fn dispatch(ctx: &Ctx, command: Command) -> CmdResult {
    match command {
        Command::Topic(c) => topic::run(ctx, c).await,
        Command::Send(a) => send::run(ctx, a).await,
        Command::Message(c) => message::run(ctx, c).await,
        Command::Offset(c) => offset::run(ctx, c).await,
        Command::Group(c) => group::run(ctx, c).await,
        Command::Dlq(c) => dlq::run(ctx, c).await,
        Command::Schedule(c) => schedule::run(ctx, c).await,
        Command::Transaction(c) => transaction::run(ctx, c).await,
        Command::Consume(a) => consume::run(ctx, a).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
