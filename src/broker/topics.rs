//! The topic table: name -> queue count. Every shard holds a copy; shard 0 is its keeper:
//! it persists the table (`topics.json`, written atomically) and tells every other shard of
//! each change before answering.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Most queues a topic may have.
pub const QUEUES_PER_TOPIC_MAX: u32 = 1024;

#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TopicTable {
    topics: BTreeMap<String, u32>,
}

impl TopicTable {
    pub fn path(data_dir: &Path) -> PathBuf {
        data_dir.join("topics.json")
    }

    pub fn load(data_dir: &Path) -> std::io::Result<TopicTable> {
        let path = Self::path(data_dir);
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("{}: {e}", path.display()),
                )
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(TopicTable::default()),
            Err(e) => Err(std::io::Error::new(
                e.kind(),
                format!("read {}: {e}", path.display()),
            )),
        }
    }

    pub fn save(&self, data_dir: &Path) -> std::io::Result<()> {
        use std::io::Write;
        let path = Self::path(data_dir);
        let tmp = data_dir.join("topics.json.tmp");
        let bytes = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, &path)?;
        std::fs::File::open(data_dir)?.sync_all()
    }

    pub fn get(&self, topic: &str) -> Option<u32> {
        self.topics.get(topic).copied()
    }

    pub fn set(&mut self, topic: &str, queues: Option<u32>) {
        match queues {
            Some(q) => {
                self.topics.insert(topic.to_owned(), q);
            }
            None => {
                self.topics.remove(topic);
            }
        }
    }

    pub fn names(&self) -> Vec<String> {
        self.topics.keys().cloned().collect()
    }
}
