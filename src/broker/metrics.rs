//! Metrics: each shard counts in its own cells (no sharing on the produce and pull paths)
//! and, when `--metrics-listen` is set, publishes a snapshot of its counters and gauges
//! every second into its slot of the [`MetricsHub`]; one HTTP thread serves `GET /metrics`
//! from the latest snapshots in the Prometheus text format (encoded by `prometheus-client`).
//!
//! Label cardinality is bounded: topic labels only for topics that exist, groups only for
//! groups the shard keeps, and at most [`SERIES_PER_FAMILY_MAX`] series per family and
//! shard (the rest are summed under `_other`).

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use super::ShardCtx;

/// Most series of one family from one shard.
pub const SERIES_PER_FAMILY_MAX: usize = 2000;
pub use crate::log::stats::LatencyHistogram as Latency;

/// What a shard counts as it works (shard-local: cells, no atomics, no locks).
#[derive(Default)]
pub struct ShardStats {
    /// Per topic: messages and bytes stored.
    pub stored: RefCell<HashMap<String, (u64, u64)>>,
    pub pulled_messages: Cell<u64>,
    pub pulled_bytes: Cell<u64>,
    pub send_ack: RefCell<Latency>,
    pub pull: RefCell<Latency>,
    /// Requests handled on this shard, by kind name.
    pub requests: RefCell<HashMap<&'static str, u64>>,
    /// Error answers, by code name.
    pub errors: RefCell<HashMap<String, u64>>,
    pub forwarded: Cell<u64>,
    pub rebalances: Cell<u64>,
    /// Messages sent back to a retry topic, and to a dead-letter topic.
    pub retries: Cell<u64>,
    pub dead_letters: Cell<u64>,
}

impl ShardStats {
    pub fn stored(&self, topic: &str, messages: u64, bytes: u64) {
        let mut stored = self.stored.borrow_mut();
        match stored.get_mut(topic) {
            Some(v) => {
                v.0 += messages;
                v.1 += bytes;
            }
            None => {
                stored.insert(topic.to_owned(), (messages, bytes));
            }
        }
    }

    pub fn request(&self, kind: &'static str) {
        *self.requests.borrow_mut().entry(kind).or_default() += 1;
    }

    pub fn error(&self, code: &str) {
        let mut errors = self.errors.borrow_mut();
        match errors.get_mut(code) {
            Some(n) => *n += 1,
            None => {
                errors.insert(code.to_owned(), 1);
            }
        }
    }
}

/// One sample: its label pairs and value.
type Series = (Vec<(&'static str, String)>, f64);

/// A shard's metrics at one moment.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// (name, help, is_counter) → samples.
    families: BTreeMap<&'static str, (&'static str, bool, Vec<Series>)>,
    histograms: Vec<(&'static str, &'static str, u32, Latency)>,
}

impl Snapshot {
    fn add(&mut self, name: &'static str, help: &'static str, counter: bool, s: Series) {
        let entry = self
            .families
            .entry(name)
            .or_insert_with(|| (help, counter, Vec::new()));
        entry.2.push(s);
    }
}

/// The latest snapshot of every shard; read by the HTTP thread.
#[derive(Debug)]
pub struct MetricsHub {
    shards: Vec<Mutex<Snapshot>>,
}

impl MetricsHub {
    pub fn new(shards: usize) -> Arc<MetricsHub> {
        Arc::new(MetricsHub {
            shards: (0..shards)
                .map(|_| Mutex::new(Snapshot::default()))
                .collect(),
        })
    }

    fn publish(&self, shard: u32, s: Snapshot) {
        if let Some(slot) = self.shards.get(shard as usize) {
            *slot.lock().unwrap_or_else(PoisonError::into_inner) = s;
        }
    }

    /// The exposition text of every shard's latest snapshot.
    pub fn render(self: &Arc<Self>) -> String {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(HubCollector(self.clone())));
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &registry).is_err() {
            out.clear();
        }
        out
    }

    /// Serves `GET /metrics` on `listener` from a thread of its own, until the process ends.
    pub fn serve(self: &Arc<Self>, listener: TcpListener) {
        let hub = self.clone();
        let spawned = std::thread::Builder::new()
            .name("ringmq-metrics".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    let Ok(mut conn) = conn else { continue };
                    let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
                    let _ = conn.set_write_timeout(Some(Duration::from_secs(5)));
                    let mut head = [0u8; 2048];
                    let n = conn.read(&mut head).unwrap_or(0);
                    let request = String::from_utf8_lossy(&head[..n]);
                    let answer = if request.starts_with("GET /metrics") {
                        let body = hub.render();
                        format!(
                            "HTTP/1.1 200 OK\r\nContent-Type: application/openmetrics-text; version=1.0.0; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                            body.len()
                        )
                    } else {
                        "HTTP/1.1 404 Not Found\r\nContent-Length: 23\r\nConnection: close\r\n\r\nonly GET /metrics here\n".to_owned()
                    };
                    let _ = conn.write_all(answer.as_bytes());
                }
            });
        if let Err(e) = spawned {
            crate::warn!("ringmq-broker: cannot start the metrics thread: {e}");
        }
    }
}

/// Binds the metrics listener (an error names the address).
pub fn bind(addr: SocketAddr) -> Result<TcpListener, String> {
    TcpListener::bind(addr).map_err(|e| format!("cannot listen for metrics on {addr}: {e}"))
}

#[derive(Debug)]
struct HubCollector(Arc<MetricsHub>);

/// A histogram's help and each shard's counts.
type HistogramFamily<'a> = (&'static str, Vec<(u32, &'a Latency)>);

impl Collector for HubCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let snaps: Vec<Snapshot> = self
            .0
            .shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(PoisonError::into_inner).clone())
            .collect();
        // Families in name order, the samples of every shard together.
        let mut families: BTreeMap<&'static str, (&'static str, bool, Vec<&Series>)> =
            BTreeMap::new();
        for s in &snaps {
            for (name, (help, counter, series)) in &s.families {
                let e = families
                    .entry(name)
                    .or_insert_with(|| (help, *counter, Vec::new()));
                e.2.extend(series.iter());
            }
        }
        for (name, (help, counter, series)) in families {
            let kind = if counter {
                MetricType::Counter
            } else {
                MetricType::Gauge
            };
            let mut m = encoder.encode_descriptor(name, help, None, kind)?;
            for (labels, value) in series {
                let mut f = m.encode_family(labels)?;
                if counter {
                    f.encode_counter::<NoLabelSet, _, f64>(value, None)?;
                } else {
                    f.encode_gauge(value)?;
                }
            }
        }
        let mut histograms: BTreeMap<&'static str, HistogramFamily<'_>> = BTreeMap::new();
        for s in &snaps {
            for (name, help, shard, h) in &s.histograms {
                histograms
                    .entry(name)
                    .or_insert_with(|| (help, Vec::new()))
                    .1
                    .push((*shard, h));
            }
        }
        for (name, (help, per_shard)) in histograms {
            let mut m = encoder.encode_descriptor(name, help, None, MetricType::Histogram)?;
            for (shard, h) in per_shard {
                let labels = [("shard", shard.to_string())];
                let mut f = m.encode_family(&labels)?;
                f.encode_histogram::<NoLabelSet>(h.sum_seconds(), h.count(), &h.buckets(), None)?;
            }
        }
        Ok(())
    }
}

/// Keeps at most [`SERIES_PER_FAMILY_MAX`] series, summing the rest under `_other`.
fn capped(series: Vec<Series>, label: &'static str) -> Vec<Series> {
    if series.len() <= SERIES_PER_FAMILY_MAX {
        return series;
    }
    let mut series = series;
    series.sort_by(|a, b| b.1.total_cmp(&a.1));
    let rest: f64 = series[SERIES_PER_FAMILY_MAX - 1..]
        .iter()
        .map(|s| s.1)
        .sum();
    series.truncate(SERIES_PER_FAMILY_MAX - 1);
    let mut labels = series[0].0.clone();
    for (k, v) in labels.iter_mut() {
        if *k == label {
            *v = "_other".into();
        }
    }
    series.push((labels, rest));
    series
}

/// The lag series of (lag, group, topic, queue), as [`capped`] would keep them, without
/// labels for those it sums under `_other`: a shard may keep a million offsets
/// (`--offsets-max`), walked at every scrape, and only the kept ones are allocated.
fn top_lags<'a>(lags: impl Iterator<Item = (u64, &'a str, &'a str, u32)>) -> Vec<Series> {
    use std::cmp::Reverse;
    let mut top = std::collections::BinaryHeap::new();
    let (mut seen, mut rest) = (0usize, 0u64);
    for lag in lags {
        seen += 1;
        top.push(Reverse(lag));
        if top.len() > SERIES_PER_FAMILY_MAX {
            rest += top.pop().map_or(0, |Reverse(l)| l.0);
        }
    }
    if seen > SERIES_PER_FAMILY_MAX {
        rest += top.pop().map_or(0, |Reverse(l)| l.0);
    }
    let labels = |(_, group, topic, _): (u64, &str, &str, u32), queue_label: String| {
        vec![
            ("group", group.to_owned()),
            ("topic", topic.to_owned()),
            ("queue", queue_label),
        ]
    };
    let mut kept: Vec<(u64, &str, &str, u32)> = top.into_iter().map(|Reverse(l)| l).collect();
    kept.sort_by_key(|l| std::cmp::Reverse(l.0));
    let mut series: Vec<Series> = (kept.iter())
        .map(|&l| (labels(l, l.3.to_string()), l.0 as f64))
        .collect();
    if seen > SERIES_PER_FAMILY_MAX {
        if let Some(&largest) = kept.first() {
            series.push((labels(largest, "_other".into()), rest as f64));
        }
    }
    series
}

impl ShardCtx {
    /// This shard's metrics now.
    /// `oldest_ms`: the store time of the log's oldest kept record, if known.
    pub(super) fn metrics_snapshot(&self, oldest_ms: Option<i64>) -> Snapshot {
        let shard = self.id.to_string();
        let sl = || vec![("shard", shard.clone())];
        let mut s = Snapshot::default();
        let topics = self.topics.borrow();
        let mut stored = Vec::new();
        let mut stored_bytes = Vec::new();
        for (topic, (n, b)) in self.stats.stored.borrow().iter() {
            let known =
                topics.get(topic).is_some() || crate::protocol::names::is_system_topic(topic);
            let t = if known {
                topic.clone()
            } else {
                "_other".into()
            };
            stored.push((
                vec![("shard", shard.clone()), ("topic", t.clone())],
                *n as f64,
            ));
            stored_bytes.push((vec![("shard", shard.clone()), ("topic", t)], *b as f64));
        }
        drop(topics);
        for x in capped(stored, "topic") {
            s.add(
                "ringmq_messages_stored",
                "Messages stored, per shard and topic.",
                true,
                x,
            );
        }
        for x in capped(stored_bytes, "topic") {
            s.add(
                "ringmq_bytes_stored",
                "Bytes of messages (records) stored, per shard and topic.",
                true,
                x,
            );
        }
        let st = &self.stats;
        s.add(
            "ringmq_pull_messages",
            "Messages served by pulls.",
            true,
            (sl(), st.pulled_messages.get() as f64),
        );
        s.add(
            "ringmq_pull_bytes",
            "Bytes of records served by pulls.",
            true,
            (sl(), st.pulled_bytes.get() as f64),
        );
        s.add(
            "ringmq_forwarded_requests",
            "Requests forwarded to the shard that handles them.",
            true,
            (sl(), st.forwarded.get() as f64),
        );
        s.add(
            "ringmq_busy_refusals",
            "Sends refused with BrokerBusy (flow control).",
            true,
            (sl(), self.busy_refusals.get() as f64),
        );
        s.add(
            "ringmq_rebalances",
            "Rebalances of the groups this shard coordinates.",
            true,
            (sl(), st.rebalances.get() as f64),
        );
        let mut by_kind: Vec<_> = st.requests.borrow().iter().map(|(k, n)| (*k, *n)).collect();
        by_kind.sort();
        for (kind, n) in by_kind {
            s.add(
                "ringmq_requests",
                "Requests handled, by kind.",
                true,
                (
                    vec![("shard", shard.clone()), ("kind", kind.to_owned())],
                    n as f64,
                ),
            );
        }
        let mut by_code: Vec<_> = st
            .errors
            .borrow()
            .iter()
            .map(|(k, n)| (k.clone(), *n))
            .collect();
        by_code.sort();
        for (code, n) in by_code {
            s.add(
                "ringmq_errors",
                "Error answers, by code.",
                true,
                (vec![("shard", shard.clone()), ("code", code)], n as f64),
            );
        }
        s.histograms.push((
            "ringmq_send_ack_seconds",
            "From a send's append to its acknowledgement (written, or durable with sync flush).",
            self.id,
            st.send_ack.borrow().clone(),
        ));
        let log = self.store.log();
        s.histograms.push((
            "ringmq_fdatasync_seconds",
            "Commit log fdatasyncs: in sync mode its O_DSYNC writes, each durable when it completes (a send waits for one); in async mode the background fdatasyncs.",
            self.id,
            log.stats().fdatasync.borrow().clone(),
        ));
        s.histograms.push((
            "ringmq_pull_seconds",
            "Pulls that answered with records, from the request to the answer (a pull forwarded from the shard of its connection: from the end of its wait).",
            self.id,
            st.pull.borrow().clone(),
        ));

        // Gauges.
        s.add(
            "ringmq_commitlog_bytes",
            "Bytes of the commit log kept (from its first kept record to its end).",
            false,
            (
                sl(),
                log.write_offset().saturating_sub(log.min_offset()) as f64,
            ),
        );
        s.add(
            "ringmq_commitlog_segments",
            "Segment files of the commit log.",
            false,
            (sl(), log.segment_count() as f64),
        );
        if let Some(ms) = oldest_ms {
            let age = (crate::log::now_ms() - ms).max(0) as f64 / 1000.0;
            s.add(
                "ringmq_commitlog_oldest_record_age_seconds",
                "Age of the commit log's oldest kept record (what retention deletes next).",
                false,
                (sl(), age),
            );
        }
        s.add(
            "ringmq_retries",
            "Messages a consumer sent back to its group's retry topic.",
            true,
            (sl(), self.stats.retries.get() as f64),
        );
        s.add(
            "ringmq_dead_letters",
            "Messages moved to a dead-letter topic after their last retry.",
            true,
            (sl(), self.stats.dead_letters.get() as f64),
        );
        s.add(
            "ringmq_retention_segments_deleted",
            "Commit-log segments deleted by retention.",
            true,
            (sl(), log.stats().segments_deleted.get() as f64),
        );
        s.add(
            "ringmq_commitlog_writes",
            "Writes of records to the commit log's files (appends share them).",
            true,
            (sl(), log.stats().writes.get() as f64),
        );
        s.add(
            "ringmq_queue_opens_inline",
            "Queues whose index a send opened on the shard's thread (file I/O there); queues are opened ahead when their topic is created or grown, and with each shard's system queues (schedule, transactions) at a start, so this stays 0 unless an opening ahead failed.",
            true,
            (sl(), self.store.inline_queue_opens() as f64),
        );
        s.add(
            "ringmq_index_rolls_inline",
            "Index rolls (a consume queue's next file, the key index's first or next file) that created their file instead of taking a spare made ahead in the blocking pool (file I/O on the shard's thread when appending; also counts rolls of recovery's replay); summed over the queues open now, each since it was opened, and the key index since the start.",
            false,
            (sl(), self.store.index_rolls_inline() as f64),
        );
        s.add(
            "ringmq_commitlog_backlog_bytes",
            "Bytes appended that wait for the disk.",
            false,
            (
                sl(),
                log.write_offset().saturating_sub(log.readable_end()) as f64,
            ),
        );
        s.add(
            "ringmq_group_assignments_bytes",
            "Bytes (about) of the consumer groups' assignments this shard keeps computed, \
             at most 64 MiB.",
            false,
            (sl(), self.assigned_bytes.get() as f64),
        );
        s.add(
            "ringmq_retention_held",
            "1 while retention stops at the last checkpoint because the checkpoint its last \
             pass wrote first failed (the log grows until one succeeds).",
            false,
            (sl(), f64::from(u8::from(self.store.retention_held()))),
        );
        s.add(
            "ringmq_checkpoint_held",
            "1 once an index file's fdatasync failed: the checkpoint (and retention with it) \
             stays where it was until a restart, which indexes the records past it again.",
            false,
            (sl(), f64::from(u8::from(self.store.checkpoint_held()))),
        );
        s.add(
            "ringmq_disk_free_bytes",
            "Free bytes of the data directory's filesystem.",
            false,
            (sl(), self.store.disk_free_bytes() as f64),
        );
        s.add(
            "ringmq_connections_open",
            "Client connections open on this shard.",
            false,
            (sl(), self.conns.borrow().len() as f64),
        );
        s.add(
            "ringmq_requests_in_flight",
            "Requests being handled on this shard, long polls included (a forwarded one counts on the shard that handles it).",
            false,
            (sl(), self.in_flight() as f64),
        );
        s.add(
            "ringmq_sends_in_line",
            "Sends naming a queue that wait to be appended in arrival order: one whose shard must first learn its topic or a queue of it (ask shard 0, or create the topic), and those naming the same topic's queues that arrived after it.",
            false,
            (sl(), self.send_lines.places() as f64),
        );
        s.add(
            "ringmq_locks_held",
            "Queue locks held.",
            false,
            (
                sl(),
                self.locks
                    .borrow()
                    .live_len(super::group_service::steady_ms()) as f64,
            ),
        );
        s.add(
            "ringmq_schedule_pending",
            "Delayed messages waiting in the schedule.",
            false,
            // The count alone: `local_schedule_info` also summarizes what is due.
            (sl(), self.schedule.borrow().pending() as f64),
        );
        s.add(
            "ringmq_schedule_delivered",
            "Delayed messages (and retry copies) delivered to their queues since start.",
            true,
            (sl(), self.schedule.borrow().delivered_total() as f64),
        );
        s.add(
            "ringmq_schedule_undeliverable",
            "Delayed messages not delivered since start: moved to %UNDELIVERABLE% after waiting --schedule-park-max-ms for a queue that does not exist, or unreadable (damaged on disk).",
            true,
            (sl(), self.schedule.borrow().undeliverable_total() as f64),
        );
        s.add(
            "ringmq_schedule_wheel_entries",
            "Entries in the schedule's timing wheel: the pending messages not being delivered, and old entries of messages moved forward (so that retention could go on) not yet taken out (taken out whenever a move leaves them over a quarter of the wheel).",
            false,
            (sl(), self.schedule.borrow().wheel_len() as f64),
        );
        s.add(
            "ringmq_transactions_unresolved",
            "Half messages waiting for an outcome.",
            false,
            (sl(), self.txn.borrow().pending_count() as f64),
        );
        s.add(
            "ringmq_transaction_checks_undelivered",
            "Transaction checks not delivered (no live producer of the group, or its connection holding too much not yet written); they do not count against --transaction-check-max.",
            true,
            (sl(), self.txn.borrow().checks_undelivered() as f64),
        );
        let mut members = Vec::new();
        for (group, (state, _)) in self.groups.borrow().iter() {
            members.push((vec![("group", group.clone())], state.members().len() as f64));
        }
        for x in capped(members, "group") {
            s.add(
                "ringmq_group_members",
                "Members of each consumer group (on its coordinator shard).",
                false,
                x,
            );
        }
        let lag = {
            let offsets = self.offsets.borrow();
            top_lags(
                offsets
                    .iter()
                    .filter_map(|(group, topic, queue, committed)| {
                        if self.owner_of(topic, queue) != self.id {
                            return None;
                        }
                        let (_, max) = self.store.queue_range(topic, queue).ok()?;
                        Some((max.saturating_sub(committed), group, topic, queue))
                    }),
            )
        };
        for x in lag {
            s.add(
                "ringmq_consumer_lag_messages",
                "Messages of a queue past a group's committed offset.",
                false,
                x,
            );
        }
        s
    }

    /// The store time of the log's oldest kept record (one read; `None` for an empty log).
    async fn oldest_record_ms(&self) -> Option<i64> {
        let log = self.store.log();
        if log.min_offset() >= log.readable_end() {
            return None;
        }
        let buf = self.store.read_physical(log.min_offset()).await.ok()?;
        let view = crate::protocol::record::RecordView::parse_unchecked_crc(&buf).ok()?;
        Some(view.store_timestamp_ms())
    }

    /// Publishes this shard's snapshot into the hub every second until the shard stops.
    pub async fn publish_metrics(self: std::rc::Rc<Self>, hub: Arc<MetricsHub>) {
        while !self.is_stopping() {
            let oldest = self.oldest_record_ms().await;
            hub.publish(self.id, self.metrics_snapshot(oldest));
            crate::io::sleep(Duration::from_secs(1)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_past_the_cap_are_summed_under_other() {
        let series: Vec<Series> = (0..SERIES_PER_FAMILY_MAX + 10)
            .map(|i| (vec![("topic", format!("t{i}"))], 1.0))
            .collect();
        let c = capped(series, "topic");
        assert_eq!(c.len(), SERIES_PER_FAMILY_MAX);
        let other = c.iter().find(|s| s.0[0].1 == "_other").unwrap();
        assert_eq!(other.1, 11.0);
        assert_eq!(
            c.iter().map(|s| s.1).sum::<f64>(),
            (SERIES_PER_FAMILY_MAX + 10) as f64
        );
    }

    #[test]
    fn lags_past_the_cap_keep_the_largest_as_capped_does() {
        for n in [
            3,
            SERIES_PER_FAMILY_MAX,
            SERIES_PER_FAMILY_MAX + 1,
            3 * SERIES_PER_FAMILY_MAX,
        ] {
            let lag = |i: usize| (i as u64 * 7919) % 10_007;
            let names: Vec<String> = (0..n).map(|i| format!("g{i}")).collect();
            let top = top_lags((0..n).map(|i| (lag(i), names[i].as_str(), "t", i as u32)));
            let all: Vec<Series> = (0..n)
                .map(|i| {
                    let labels = vec![
                        ("group", names[i].clone()),
                        ("topic", "t".to_owned()),
                        ("queue", i.to_string()),
                    ];
                    (labels, lag(i) as f64)
                })
                .collect();
            let mut want = capped(all, "queue");
            let mut got = top;
            let key = |s: &Series| (s.0[2].1 == "_other", s.1 as u64, s.0[0].1.clone());
            want.sort_by_key(key);
            got.sort_by_key(key);
            assert_eq!(got.len(), want.len(), "{n}");
            let values = |v: &[Series]| {
                v.iter()
                    .map(|s| (s.0[2].1 == "_other", s.1))
                    .collect::<Vec<_>>()
            };
            assert_eq!(values(&got), values(&want), "{n}");
        }
    }
}
