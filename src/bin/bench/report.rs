//! What `ringmq-bench` reports: HDR latency histograms (in µs), a progress line on stderr
//! every second, and the final report as text on stdout and as JSON (`--json`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hdrhistogram::Histogram;

use crate::{Cli, Run};

/// Histogram range: 1 µs to 1 hour, 3 significant digits.
const LATENCY_US_MAX: u64 = 3_600_000_000;

pub(crate) fn histogram() -> Histogram<u64> {
    match Histogram::new_with_bounds(1, LATENCY_US_MAX, 3) {
        Ok(h) => h,
        // Constant, valid bounds: failing here is a bug in this file.
        Err(e) => unreachable!("histogram bounds: {e}"),
    }
}

/// The latencies a consumer records: end to end (from the send time), and with
/// `--delay-ms` how late each message came after it was due (consumed time minus send time
/// minus the delay).
pub(crate) struct Latencies {
    pub(crate) e2e: Histogram<u64>,
    pub(crate) lateness: Histogram<u64>,
}

impl Latencies {
    pub(crate) fn new() -> Latencies {
        Latencies {
            e2e: histogram(),
            lateness: histogram(),
        }
    }

    pub(crate) fn add(&mut self, other: &Latencies) -> Result<(), String> {
        self.e2e
            .add(&other.e2e)
            .and_then(|_| self.lateness.add(&other.lateness))
            .map_err(|e| format!("merging histograms: {e}"))
    }
}

pub(crate) fn record_us(h: &mut Histogram<u64>, d: Duration) {
    let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
    h.saturating_record(us.max(1));
}

/// Prints a progress line to stderr every second until `done` is set.
pub(crate) async fn progress(run: Arc<Run>, done: Arc<AtomicBool>) {
    let mut last = (0u64, 0u64);
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.tick().await;
    while !done.load(Ordering::Relaxed) {
        tick.tick().await;
        let sent = run.stats.sent.load(Ordering::Relaxed);
        let received = run.stats.received.load(Ordering::Relaxed);
        let errors = run.stats.send_errors.load(Ordering::Relaxed)
            + run.stats.pull_errors.load(Ordering::Relaxed);
        eprintln!(
            "[{:>4.0}s] sent {sent} ({} msg/s, {:.1} MB/s)  received {received} ({} msg/s)  errors {errors}",
            run.start.elapsed().as_secs_f64(),
            sent - last.0,
            ((sent - last.0) as f64 * run.cli.size as f64) / 1e6,
            received.saturating_sub(last.1),
        );
        last = (sent, received);
    }
}

/// What a run measured.
pub(crate) struct Report {
    pub(crate) sent: u64,
    /// Of `sent`, what the consumers should receive (all, or what --sql keeps).
    pub(crate) expected: u64,
    pub(crate) received: u64,
    pub(crate) duplicates: u64,
    pub(crate) send_errors: u64,
    /// `BrokerBusy` answers, waited out and sent again.
    pub(crate) busy_answers: u64,
    pub(crate) pull_errors: u64,
    pub(crate) produce_s: f64,
    pub(crate) consume_s: f64,
    pub(crate) send_latency: Histogram<u64>,
    pub(crate) e2e_latency: Histogram<u64>,
    /// With `--delay-ms`: consumed time minus due time.
    pub(crate) lateness: Option<Histogram<u64>>,
    pub(crate) queue_count: u32,
    pub(crate) first_error: Option<String>,
}

fn percentiles(h: &Histogram<u64>) -> serde_json::Value {
    serde_json::json!({
        "p50": h.value_at_quantile(0.50),
        "p90": h.value_at_quantile(0.90),
        "p99": h.value_at_quantile(0.99),
        "p999": h.value_at_quantile(0.999),
        "p9999": h.value_at_quantile(0.9999),
        "max": h.max(),
        "samples": h.len(),
    })
}

fn per_sec(n: u64, secs: f64) -> f64 {
    if secs > 0.0 {
        n as f64 / secs
    } else {
        0.0
    }
}

pub(crate) fn to_json(cli: &Cli, broker: &str, embedded: bool, r: &Report) -> serde_json::Value {
    let mb = |n: u64, s: f64| per_sec(n, s) * cli.size as f64 / 1e6;
    serde_json::json!({
        "messages_sent": r.sent,
        "messages_received": r.received,
        "messages_expected": r.expected,
        "messages_missing": if cli.consumers > 0 { r.expected.saturating_sub(r.received) } else { 0 },
        "messages_duplicated": r.duplicates,
        "send_errors": r.send_errors,
        "busy_answers": r.busy_answers,
        "pull_errors": r.pull_errors,
        "first_error": r.first_error,
        "produce": {
            "msgs_per_sec": per_sec(r.sent, r.produce_s),
            "mb_per_sec": mb(r.sent, r.produce_s),
            "seconds": r.produce_s,
        },
        "consume": {
            "msgs_per_sec": per_sec(r.received, r.consume_s),
            "mb_per_sec": mb(r.received, r.consume_s),
            "seconds": r.consume_s,
        },
        "send_latency_us": percentiles(&r.send_latency),
        "e2e_latency_us": percentiles(&r.e2e_latency),
        "delivery_lateness_us": r.lateness.as_ref().map(percentiles),
        "config": {
            "broker": broker,
            "embedded_broker": embedded,
            "topic": cli.topic,
            "queues": r.queue_count,
            "producers": cli.producers,
            "consumers": cli.consumers,
            "group": cli.group,
            "consume_batch": cli.consume_batch,
            "consume_threads": cli.consume_threads,
            "client_threads": cli.client_threads,
            "pulls_in_flight": cli.pulls_in_flight,
            "non_blocking_listener": cli.non_blocking_listener,
            "consume_after_produce": cli.consume_after_produce,
            "keys": cli.keys,
            "size": cli.size,
            "batch": cli.batch,
            "messages": cli.messages,
            "duration_s": cli.duration().map(|d| d.as_secs()),
            "warmup_s": cli.warmup,
            "rate": cli.rate,
            "delay_ms": cli.delay_ms,
            "in_flight": cli.in_flight,
            "flush": if embedded { Some(format!("{:?}", cli.flush.unwrap_or(ringmq::log::FlushMode::Async)).to_lowercase()) } else { None },
            "shards": cli.shards,
            "pull_batch": cli.pull_batch,
            "shard_aware": cli.shard_aware,
            "request_timeout_ms": cli.request_timeout_ms,
            "mb": "10^6 bytes of message bodies",
        },
    })
}

pub(crate) fn print_report(cli: &Cli, r: &Report) {
    let mb = |n: u64, s: f64| per_sec(n, s) * cli.size as f64 / 1e6;
    println!(
        "produce: {} messages in {:.2} s: {:.0} msg/s, {:.1} MB/s ({} failed, {} busy answers waited out)",
        r.sent,
        r.produce_s,
        per_sec(r.sent, r.produce_s),
        mb(r.sent, r.produce_s),
        r.send_errors,
        r.busy_answers
    );
    if cli.consumers > 0 {
        println!(
            "consume: {} messages in {:.2} s: {:.0} msg/s, {:.1} MB/s ({} missing, {} duplicates)",
            r.received,
            r.consume_s,
            per_sec(r.received, r.consume_s),
            mb(r.received, r.consume_s),
            r.expected.saturating_sub(r.received),
            r.duplicates
        );
    }
    let line = |name: &str, h: &Histogram<u64>| {
        println!(
            "{name:<22} p50 {:>8}  p90 {:>8}  p99 {:>8}  p99.9 {:>8}  p99.99 {:>8}  max {:>8}",
            h.value_at_quantile(0.50),
            h.value_at_quantile(0.90),
            h.value_at_quantile(0.99),
            h.value_at_quantile(0.999),
            h.value_at_quantile(0.9999),
            h.max()
        );
    };
    let unit = if cli.batch > 1 { " (per batch)" } else { "" };
    line(&format!("send latency us{unit}"), &r.send_latency);
    if cli.consumers > 0 {
        line("end-to-end latency us", &r.e2e_latency);
        if let Some(lateness) = &r.lateness {
            line("delivery lateness us", lateness);
        }
    }
}

/// The line `main` prints before a run: what is measured, against which broker.
pub(crate) fn banner(cli: &Cli, broker: &str, embedded: bool) -> String {
    format!(
        "ringmq-bench: {} on {broker}{}: {} producers, {} consumers{}, {} B messages, batch {}, {}{}",
        cli.topic,
        if embedded { " (embedded)" } else { "" },
        cli.producers,
        cli.consumers,
        match &cli.group {
            Some(group) => format!(" (push, group {group})"),
            None => String::new(),
        },
        cli.size,
        cli.batch,
        match (cli.messages, cli.duration(), cli.rate) {
            (Some(n), _, 0) => format!("{n} messages, closed loop"),
            (Some(n), _, r) => format!("{n} messages at {r} msg/s"),
            (None, Some(d), 0) => format!("{} s, closed loop", d.as_secs()),
            (None, Some(d), r) => format!("{} s at {r} msg/s", d.as_secs()),
            (None, None, _) => String::new(),
        },
        if cli.warmup > 0 {
            format!(" after a {} s warm-up", cli.warmup)
        } else {
            String::new()
        }
    )
}
