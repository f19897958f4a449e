//! Transactional messages: [`TransactionProducer`] sends a half message (stored, invisible
//! to consumers), runs the application's local transaction, then commits or rolls back.
//! When it never says (a crash, `Unknown`), the broker asks a live producer of the same
//! group later: the registered checker answers.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::task::JoinHandle;

use super::error::{ClientError, Result};
use super::message::{check_topic, Message, OutgoingMessage};
use super::producer::{Producer, ProducerOptions, SendResult};
use super::session::{expect_empty, Client, Route};
use super::ClientConfig;
use crate::protocol::names::check_group_name;
use crate::protocol::record::prop;
use crate::protocol::{
    CheckTransaction, EndTransaction, Kind, ListTransactions, ProducerHeartbeat, Response,
    TransactionList, TRANSACTION_COMMIT, TRANSACTION_ROLLBACK, TRANSACTION_UNKNOWN,
};

/// How often a transaction producer tells the broker it is alive (it is also dropped at
/// once when its connection closes).
const PRODUCER_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(3);
/// Most check-backs a producer answers at once (each holds its half message, up to a
/// record's size, and a call of the checker). Past it the pushed checks wait in the
/// client's push buffer (`push_buffer_max`) until one ends; checks missed past it come
/// again. A check of a transaction being answered already is skipped. Only answers count
/// against the broker's `--transaction-check-max` (a checker's `Unknown` is answered).
pub const CHECKS_IN_PROGRESS_MAX: usize = 64;

/// A transaction by where its half is: the id alone is unique per shard only.
type TransactionKey = (String, u32, u64);

/// The transactions whose check-back is being answered, and a wake-up when one ends.
#[derive(Default)]
struct Answering {
    keys: std::sync::Mutex<std::collections::HashSet<TransactionKey>>,
    ended: tokio::sync::Notify,
}

impl Answering {
    fn keys(&self) -> std::sync::MutexGuard<'_, std::collections::HashSet<TransactionKey>> {
        self.keys
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Takes its transaction out of those being answered when the answer ends (however it
/// ends: answered, failed, panicked, or its task dropped).
struct Answered(Arc<Answering>, TransactionKey);

impl Drop for Answered {
    fn drop(&mut self) {
        self.0.keys().remove(&self.1);
        self.0.ended.notify_one();
    }
}

/// What became of a local transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransactionOutcome {
    /// Make the message visible to consumers.
    Commit,
    /// Discard the message.
    Rollback,
    /// Not known yet: the broker asks the group's checker later. A checker's `Unknown` (or
    /// a checker that panics) counts against the broker's `--transaction-check-max`, after
    /// which the message is discarded (kept in `%SYS_TXN_DISCARDED%`).
    Unknown,
}

impl TransactionOutcome {
    fn wire(self) -> u8 {
        match self {
            TransactionOutcome::Commit => TRANSACTION_COMMIT,
            TransactionOutcome::Rollback => TRANSACTION_ROLLBACK,
            TransactionOutcome::Unknown => TRANSACTION_UNKNOWN,
        }
    }
}

/// The answer to a check-back: what became of the transaction of this half message. The
/// message is the half as the broker stores it: its id is the one its send was answered
/// with, [`Message::origin_topic`] the topic it was sent to ([`Message::topic`] is the
/// broker's topic of halves), and its body and properties those sent.
pub type TransactionChecker = dyn Fn(&Message) -> TransactionOutcome + Send + Sync;

/// What [`TransactionProducer::send_in_transaction`] did.
#[derive(Debug, Clone)]
#[must_use = "end_error says whether the outcome reached the broker"]
pub struct TransactionSendResult {
    /// The half message's send: `transaction_id` names the transaction.
    pub send: SendResult,
    /// What the local transaction said.
    pub outcome: TransactionOutcome,
    /// Why the outcome could not be told to the broker, if it could not. After a
    /// retriable error (`is_retriable`: a timeout, a broken connection, a busy broker, a
    /// write that failed after the outcome's records were appended, `StoreUnsure`) the
    /// transaction's state is not known here: the broker may have applied the outcome
    /// before the error (a timeout; with `StoreUnsure` the half is pending again while the
    /// commit's copy may be stored, so a commit told again may deliver it twice), and then
    /// nothing asks again; if it did not, the
    /// transaction is still pending and the broker asks the group's checker later. Either
    /// way the outcome is not lost as long as the checker answers as the local
    /// transaction did. `TransactionNotFound`: the broker no longer knows the transaction
    /// (resolved long ago: each shard remembers its latest 200,000 outcomes; or its half
    /// message was lost to a crash in async flush mode). Any other is final: the
    /// transaction was resolved otherwise (`TransactionResolved`) or discarded (its topic
    /// deleted: `TopicNotFound`, `QueueNotFound`; listed by `Client::list_transactions`),
    /// and nothing asks again. `send_in_transaction` answers `Ok` with this set: look at
    /// it.
    pub end_error: Option<ClientError>,
}

/// A producer of transactional messages, member of a producer group whose checker answers
/// the broker's check-backs. Plain sends go through [`producer`](Self::producer).
pub struct TransactionProducer {
    producer: Producer,
    /// Sends the half messages: no retries (see `send_in_transaction`).
    halves: Producer,
    group: String,
    background: JoinHandle<()>,
}

impl TransactionProducer {
    /// Connects, joins producer group `group` (the broker asks one of its live producers
    /// about unresolved transactions), and answers check-backs with `checker` (called on
    /// the blocking pool).
    pub async fn start(
        config: ClientConfig,
        group: &str,
        checker: impl Fn(&Message) -> TransactionOutcome + Send + Sync + 'static,
    ) -> Result<TransactionProducer> {
        check_group_name(group).map_err(ClientError::InvalidArgument)?;
        let client = Client::connect(config).await?;
        let pushes = client.pushes();
        // Registered before the first send: a check may come as soon as one is stored.
        heartbeat(&client, group).await?;
        let checker: Arc<TransactionChecker> = Arc::new(checker);
        let background = tokio::spawn(serve(client.clone(), group.to_owned(), checker, pushes));
        let no_retries = ProducerOptions {
            retries: 0,
            ..ProducerOptions::default()
        };
        Ok(TransactionProducer {
            halves: Producer::from_client(client.clone(), no_retries),
            producer: Producer::from_client(client, ProducerOptions::default()),
            group: group.to_owned(),
            background,
        })
    }

    /// The producer underneath (plain sends, the client).
    pub fn producer(&self) -> &Producer {
        &self.producer
    }

    pub fn group(&self) -> &str {
        &self.group
    }

    /// Sends `message` as a half message, runs `local_tx` with where it was stored, and
    /// tells the broker its outcome. Fails only if the half message could not be stored
    /// as far as this producer knows; `local_tx` did not run then. The half is sent once,
    /// not retried: after a timeout, a broken connection or `StoreUnsure` (its write failed
    /// after it was appended) it may have been stored all the same, and the broker then
    /// asks the checker about it (which answers from the
    /// application's state: a transaction whose `local_tx` never ran is rolled back). A
    /// retried send would leave two halves of one call for the checker to commit. Failures
    /// that store nothing (a refused connection, a stale route) are not retried here either:
    /// they come back as retriable errors, and sending again is the caller's choice.
    pub async fn send_in_transaction(
        &self,
        topic: &str,
        message: OutgoingMessage,
        local_tx: impl FnOnce(&SendResult) -> TransactionOutcome,
    ) -> Result<TransactionSendResult> {
        check_topic(topic)?;
        let message = message
            .with_property(prop::TRAN_MSG, "true")
            .with_property(prop::PRODUCER_GROUP, self.group.clone());
        let send = self.halves.send(topic, message).await?;
        let outcome = local_tx(&send);
        let end_error = self
            .end(topic, send.queue_id, send.transaction_id, outcome, false)
            .await
            .err();
        Ok(TransactionSendResult {
            send,
            outcome,
            end_error,
        })
    }

    /// Tells the broker the outcome of a transaction.
    pub async fn end(
        &self,
        topic: &str,
        queue_id: u32,
        transaction_id: u64,
        outcome: TransactionOutcome,
        from_check: bool,
    ) -> Result<()> {
        end_transaction(
            self.producer.client(),
            &self.group,
            topic,
            queue_id,
            transaction_id,
            outcome,
            from_check,
        )
        .await
    }

    /// Stops answering checks: answers being made are abandoned (a checker already running
    /// runs to its end on its thread, its outcome not sent; the broker asks again). The
    /// connections close with the last handle on the client
    /// (the group then forgets this producer at once); a `Client` cloned from
    /// `producer().client()` and still held keeps them open, and the broker goes on sending
    /// this producer checks that nobody answers (delivered, so not sent to another of the
    /// group's producers that round): drop such clones too.
    pub async fn shutdown(mut self) {
        self.background.abort();
        let _ = (&mut self.background).await;
        // Dropping the last handle on the client closes its connections.
    }
}

impl Drop for TransactionProducer {
    fn drop(&mut self) {
        self.background.abort();
    }
}

async fn heartbeat(client: &Client, group: &str) -> Result<()> {
    let request = ProducerHeartbeat {
        group: group.to_owned(),
        client_id: client.config().client_id.clone(),
    };
    expect_empty(&client.call(Route::Bootstrap, &request).await?)
}

async fn end_transaction(
    client: &Client,
    group: &str,
    topic: &str,
    queue_id: u32,
    transaction_id: u64,
    outcome: TransactionOutcome,
    from_check: bool,
) -> Result<()> {
    let request = EndTransaction {
        topic: topic.to_owned(),
        queue_id,
        transaction_id,
        producer_group: group.to_owned(),
        outcome: outcome.wire(),
        from_check,
    };
    expect_empty(
        &client
            .call(Route::Queue { topic, queue_id }, &request)
            .await?,
    )
}

/// Heartbeats, and answers every check pushed to this producer.
async fn serve(
    client: Client,
    group: String,
    checker: Arc<TransactionChecker>,
    mut pushes: tokio::sync::broadcast::Receiver<super::PushFrame>,
) {
    let mut beat = tokio::time::interval(PRODUCER_HEARTBEAT_INTERVAL);
    beat.tick().await;
    let answering: Arc<Answering> = Arc::default();
    // The answers being made: aborted with this task (each holds a handle on the client,
    // which would keep its connections open, and this producer a live one to the broker,
    // after `shutdown`).
    let mut answers = tokio::task::JoinSet::new();
    // Whether a check could not be decoded (said once).
    let mut undecodable_said = false;
    // Whether the last heartbeat failed (said once, when it starts and when it ends).
    let mut failing = false;
    let mut skipped_said = false;
    loop {
        let full = answering.keys().len() >= CHECKS_IN_PROGRESS_MAX;
        tokio::select! {
            // Full: the pushes wait until an answer ends.
            _ = answering.ended.notified(), if full => {}
            Some(_) = answers.join_next(), if !answers.is_empty() => {}
            _ = beat.tick() => {
                // A failed heartbeat is tried again at the next tick (the connection may
                // be coming back); meanwhile the broker may not reach this producer with
                // its check-backs, which the application must hear.
                match heartbeat(&client, &group).await {
                    Err(e) if !failing => {
                        failing = true;
                        crate::warn!(
                            "ringmq transaction producer {group} ({}): registering with the broker failed ({e}); check-backs of its transactions may not reach it until it is registered again (tried every {} s)",
                            client.config().client_id,
                            PRODUCER_HEARTBEAT_INTERVAL.as_secs()
                        );
                    }
                    Ok(()) if failing => {
                        failing = false;
                        crate::warn!(
                            "ringmq transaction producer {group} ({}): registered with the broker again",
                            client.config().client_id
                        );
                    }
                    _ => {}
                }
                skipped_said = false;
            }
            push = pushes.recv(), if !full => match push {
                Ok(push) if push.kind() == Kind::CheckTransaction => {
                    let check = match push.frame().and_then(|f| f.decode_meta::<CheckTransaction>()) {
                        Ok(check) => check,
                        Err(e) => {
                            // Not answered: the broker asks again each check interval.
                            if !undecodable_said {
                                undecodable_said = true;
                                crate::warn!(
                                    "ringmq transaction producer {group} ({}): a check-back could not be read ({e}); not answered (said once)",
                                    client.config().client_id
                                );
                            }
                            continue;
                        }
                    };
                    if check.producer_group != group {
                        continue;
                    }
                    let key = (check.topic.clone(), check.queue_id, check.transaction_id);
                    if !answering.keys().insert(key.clone()) {
                        // Being answered: that answer resolves it. At most one warning a
                        // heartbeat interval.
                        if !skipped_said {
                            skipped_said = true;
                            crate::warn!(
                                "ringmq transaction producer {group} ({}): a check-back of transaction {} skipped: the last one asked about it is being answered",
                                client.config().client_id,
                                key.2
                            );
                        }
                        continue;
                    }
                    let answered = Answered(answering.clone(), key);
                    let (client, group, checker) = (client.clone(), group.clone(), checker.clone());
                    answers.spawn(async move {
                        let _answered = answered;
                        answer(client, group, checker, check).await
                    });
                }
                Ok(_) => {}
                // Checks among the missed frames are asked again within the broker's check
                // interval (not counted against its --transaction-check-max: only answers
                // are): said, not dropped unseen.
                Err(tokio::sync::broadcast::error::RecvError::Lagged(missed)) => {
                    crate::warn!(
                        "ringmq transaction producer {group} ({}): {missed} pushed frames were missed (more than push_buffer_max waited); their checks come again",
                        client.config().client_id
                    );
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            }
        }
    }
}

async fn answer(
    client: Client,
    group: String,
    checker: Arc<TransactionChecker>,
    mut check: CheckTransaction,
) {
    // What goes wrong here is said: the broker asks again unless it has resolved the
    // transaction meanwhile, and then the application must hear that its answer came late.
    let said = |what: std::fmt::Arguments<'_>| {
        crate::warn!(
            "ringmq transaction producer {group} ({}): transaction {} of {}[{}]: {what}",
            client.config().client_id,
            check.transaction_id,
            check.topic,
            check.queue_id
        )
    };
    // A check that cannot be decided is answered Unknown, which the broker counts against
    // its `--transaction-check-max` (it counts answers, not the checks it sent): a
    // checker that fails on a message does not keep it waiting for retention.
    const COUNTED: &str =
        "answered Unknown (it counts against the broker's --transaction-check-max)";
    let mut record = Bytes::from(std::mem::take(&mut check.record));
    let readable = crate::protocol::record::RecordView::parse(&record).map(|v| v.as_bytes().len());
    let outcome = match readable {
        Err(e) => {
            said(format_args!(
                "the check's record cannot be read ({e}); {COUNTED}"
            ));
            TransactionOutcome::Unknown
        }
        Ok(len) => {
            // Exactly the record, as `Message::new` requires (a check carries one record).
            record.truncate(len);
            // Its id names the shard that holds the half, the queue's owner, as its send's
            // did.
            let broker_id = client.broker_info().broker_id;
            let store =
                crate::protocol::route::owner(&check.topic, check.queue_id, client.shard_count());
            let message = Message::new(record, broker_id, store);
            match tokio::task::spawn_blocking(move || checker(&message)).await {
                Ok(outcome) => outcome,
                Err(e) => {
                    said(format_args!("the checker failed ({e}); {COUNTED}"));
                    TransactionOutcome::Unknown
                }
            }
        }
    };
    let ended = end_transaction(
        &client,
        &group,
        &check.topic,
        check.queue_id,
        check.transaction_id,
        outcome,
        true,
    )
    .await;
    match ended {
        Ok(()) => {}
        // Resolved meanwhile, or no longer there: nothing was waiting on this answer.
        Err(e)
            if outcome == TransactionOutcome::Unknown
                && matches!(
                    e.code(),
                    Some(
                        crate::protocol::ErrorCode::TransactionResolved
                            | crate::protocol::ErrorCode::TransactionNotFound
                    )
                ) => {}
        Err(e) if e.code() == Some(crate::protocol::ErrorCode::TransactionResolved) => said(format_args!(
            "the checker's {outcome:?} came after the broker resolved the transaction otherwise ({e}); see the broker's list of discarded transactions"
        )),
        Err(e) if e.code() == Some(crate::protocol::ErrorCode::TransactionNotFound) => said(format_args!(
            "the broker no longer knows the transaction the checker answered {outcome:?} for ({e}): resolved long ago, or its half message lost"
        )),
        Err(e) => said(format_args!(
            "telling the broker the checker's {outcome:?} failed ({e}); unless it was applied before the failure, the broker asks again"
        )),
    }
}

impl Client {
    /// The half messages waiting for an outcome on every shard, and the discards.
    pub async fn list_transactions(&self) -> Result<TransactionList> {
        let reply = self.call(Route::Bootstrap, &ListTransactions {}).await?;
        match reply.response()? {
            Response::TransactionList(list) => Ok(list),
            other => Err(super::session::unexpected(Kind::TransactionList, &other)),
        }
    }
}
