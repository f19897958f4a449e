//! The broker's Prometheus endpoint, read by a real Prometheus text parser.

use prometheus_parse::{Scrape, Value};

/// The metrics published at `addr` now, which must have been published once.
pub fn scrape(addr: &str) -> Scrape {
    let body = super::http_get(addr, "/metrics");
    assert!(
        body.contains("# TYPE ringmq_send_ack_seconds histogram"),
        "{body}"
    );
    parse(&body)
}

/// The metrics published at `addr` now (none before the broker's first publication).
pub fn scrape_any(addr: &str) -> Scrape {
    parse(&super::http_get(addr, "/metrics"))
}

fn parse(body: &str) -> Scrape {
    Scrape::parse(body.lines().map(|l| Ok(l.to_owned()))).unwrap()
}

fn number(v: &Value) -> f64 {
    match v {
        Value::Counter(x) | Value::Gauge(x) | Value::Untyped(x) => *x,
        other => panic!("not a number: {other:?}"),
    }
}

/// The sum of `metric` over the samples whose labels include `want`.
pub fn sum(s: &Scrape, metric: &str, want: &[(&str, &str)]) -> f64 {
    s.samples
        .iter()
        .filter(|x| x.metric == metric)
        .filter(|x| want.iter().all(|(k, v)| x.labels.get(k) == Some(*v)))
        .map(|x| number(&x.value))
        .sum()
}
