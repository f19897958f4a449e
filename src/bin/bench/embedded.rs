//! The broker `ringmq-bench` starts in this process when no `--broker` is given: on
//! 127.0.0.1 (any port), in `--data-dir` or a new temporary directory that it removes
//! afterwards.

use std::path::PathBuf;

use tokio::time::Instant;

use crate::{epoch_ns, Cli};

/// A broker started in this process, and the directory it owns.
pub(crate) struct Embedded {
    pub(crate) broker: ringmq::shard::Broker,
    /// Removed at the end when the bench created it.
    temp_dir: Option<PathBuf>,
}

pub(crate) fn start_embedded(cli: &Cli) -> Result<Embedded, String> {
    let (data_dir, temp_dir) = match &cli.data_dir {
        Some(dir) => (dir.clone(), None),
        None => {
            let nanos = epoch_ns(Instant::now());
            let dir =
                std::env::temp_dir().join(format!("ringmq-bench-{}-{nanos}", std::process::id()));
            (dir.clone(), Some(dir))
        }
    };
    let config = ringmq::shard::BrokerConfig {
        listen: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
        data_dir: data_dir.clone(),
        shards: cli.shards.unwrap_or(0),
        flush: cli.flush.unwrap_or(ringmq::log::FlushMode::Async),
        auto_create_topics: true,
        ..Default::default()
    };
    match ringmq::shard::Broker::start(config) {
        Ok(broker) => Ok(Embedded { broker, temp_dir }),
        Err(e) => {
            if let Some(dir) = &temp_dir {
                let _ = std::fs::remove_dir_all(dir);
            }
            Err(format!("embedded broker in {}: {e}", data_dir.display()))
        }
    }
}

pub(crate) fn stop_embedded(embedded: Embedded) {
    if let Err(e) = embedded.broker.shutdown() {
        eprintln!("ringmq-bench: embedded broker stopped with an error: {e}");
    }
    if let Some(dir) = embedded.temp_dir {
        if let Err(e) = std::fs::remove_dir_all(&dir) {
            eprintln!("ringmq-bench: removing {}: {e}", dir.display());
        }
    }
}
