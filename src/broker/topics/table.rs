//! The topic table (`topics.json`): topic name to queue count, when each topic was created,
//! the topics sends created, and the tombstones of deletions not yet durable on every
//! shard. Shard 0 saves it (atomically); every shard loads it at start.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::QUEUES_PER_TOPIC_MAX;

#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TopicTable {
    topics: BTreeMap<String, u32>,
    /// Topics a send created (auto-create), counted against `--auto-create-topics-max`.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    auto: BTreeSet<String>,
    /// Topics deleted whose deletion not every shard has made durable yet (tombstones):
    /// saved with the deletion, forgotten once every shard has; the name cannot be created
    /// again meanwhile, and a start tells every shard of the deletion again.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    deleting: BTreeSet<String>,
    /// Each topic's creation stamp (see [`TopicTable::born`]); absent for topics created
    /// before stamps were kept.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    born: BTreeMap<String, u64>,
    /// The highest creation stamp ever given (deleted topics' too): stamps only grow, and
    /// every start of a shard's store is named by a later incarnation.
    #[serde(default, skip_serializing_if = "is_zero")]
    last_born: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl TopicTable {
    pub fn path(data_dir: &Path) -> PathBuf {
        data_dir.join("topics.json")
    }

    pub fn load(data_dir: &Path) -> std::io::Result<TopicTable> {
        let path = Self::path(data_dir);
        let invalid = |what: String| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{}: {what}", path.display()),
            )
        };
        match std::fs::read(&path) {
            Ok(bytes) => {
                let table: TopicTable =
                    serde_json::from_slice(&bytes).map_err(|e| invalid(e.to_string()))?;
                // Every entry obeys the rules a CreateTopic obeys, or the broker does not
                // start: a hand-edited or damaged table must not load.
                for (topic, &queues) in &table.topics {
                    crate::protocol::names::check_topic_name(topic)
                        .map_err(|e| invalid(format!("topic {topic:?}: {e}")))?;
                    if crate::protocol::names::is_system_topic(topic) {
                        return Err(invalid(format!(
                            "topic {topic:?} is reserved for the broker"
                        )));
                    }
                    if queues == 0 || queues > QUEUES_PER_TOPIC_MAX {
                        return Err(invalid(format!(
                            "topic {topic:?} has {queues} queues; a topic has 1 to {QUEUES_PER_TOPIC_MAX}"
                        )));
                    }
                }
                // A tombstone makes every shard delete the name's queues at start: a system
                // topic's, or a live topic's, must never be named by one.
                for topic in &table.deleting {
                    crate::protocol::names::check_topic_name(topic)
                        .map_err(|e| invalid(format!("deleted topic {topic:?}: {e}")))?;
                    if crate::protocol::names::is_system_topic(topic) {
                        return Err(invalid(format!(
                            "deleted topic {topic:?} is reserved for the broker"
                        )));
                    }
                    if table.topics.contains_key(topic) {
                        return Err(invalid(format!(
                            "topic {topic:?} is both in the table and deleted"
                        )));
                    }
                }
                for (topic, &born) in &table.born {
                    if !table.topics.contains_key(topic) || born > table.last_born {
                        return Err(invalid(format!(
                            "creation stamp {born} of topic {topic:?}: not a topic of the table, or past the last stamp given ({})",
                            table.last_born
                        )));
                    }
                }
                Ok(table)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(TopicTable::default()),
            Err(e) => Err(std::io::Error::new(
                e.kind(),
                format!("read {}: {e}", path.display()),
            )),
        }
    }

    pub fn save(&self, data_dir: &Path) -> std::io::Result<()> {
        let bytes = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
        crate::io::replace_file(&Self::path(data_dir), &bytes)
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
                self.auto.remove(topic);
                self.born.remove(topic);
            }
        }
    }

    /// The topic's creation stamp: a broker-wide incarnation (as a shard's run is named,
    /// `MessageStore::incarnation`) later than every run started before the creation and
    /// earlier than every run started after it; 0 for a topic created before stamps were
    /// kept, or unknown. A position (`PullResult::incarnation`) named by an earlier one was
    /// read in another topic of the name: one deleted before this one was created.
    pub fn born(&self, topic: &str) -> u64 {
        self.born.get(topic).copied().unwrap_or(0)
    }

    /// Stamps a topic's creation (0: unknown, forgets it). Stamps given here only grow.
    pub fn set_born(&mut self, topic: &str, born: u64) {
        if born == 0 {
            self.born.remove(topic);
        } else {
            self.born.insert(topic.to_owned(), born);
            self.last_born = self.last_born.max(born);
        }
    }

    /// The highest creation stamp ever given.
    pub fn last_born(&self) -> u64 {
        self.last_born
    }

    /// Topics whose deletion not every shard has made durable yet.
    pub fn deleting(&self) -> Vec<String> {
        self.deleting.iter().cloned().collect()
    }

    pub fn is_deleting(&self, topic: &str) -> bool {
        self.deleting.contains(topic)
    }

    /// Records the tombstone of a deleted topic.
    pub fn mark_deleting(&mut self, topic: &str) {
        self.deleting.insert(topic.to_owned());
    }

    /// Forgets a tombstone: every shard made the deletion durable.
    pub fn forget_deleting(&mut self, topic: &str) {
        self.deleting.remove(topic);
    }

    /// Marks a topic as created by auto-create.
    pub fn mark_auto(&mut self, topic: &str) {
        self.auto.insert(topic.to_owned());
    }

    /// Topics in the table.
    pub fn len(&self) -> usize {
        self.topics.len()
    }

    pub fn is_empty(&self) -> bool {
        self.topics.is_empty()
    }

    /// Queues of all topics together.
    pub fn queue_total(&self) -> u64 {
        self.topics.values().map(|&q| u64::from(q)).sum()
    }

    /// Topics that auto-create made.
    pub fn auto_created(&self) -> usize {
        self.auto.len()
    }

    pub fn names(&self) -> Vec<String> {
        self.topics.keys().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tombstones_are_saved_loaded_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let mut table = TopicTable::default();
        table.set("live", Some(4));
        table.set("gone", None);
        table.mark_deleting("gone");
        table.save(dir.path()).unwrap();
        let loaded = TopicTable::load(dir.path()).unwrap();
        assert_eq!(loaded, table);
        assert!(loaded.is_deleting("gone") && !loaded.is_deleting("live"));
        assert_eq!(loaded.deleting(), ["gone"]);

        // A file from before tombstones loads, with none.
        let path = TopicTable::path(dir.path());
        std::fs::write(&path, br#"{"topics":{"live":4}}"#).unwrap();
        let old = TopicTable::load(dir.path()).unwrap();
        assert_eq!((old.get("live"), old.deleting().len()), (Some(4), 0));

        // A tombstone of a system topic, or of a topic the table names, is refused.
        for bad in [
            r#"{"topics":{"live":4},"deleting":["%SYS_SCHEDULE%"]}"#,
            r#"{"topics":{"live":4},"deleting":["live"]}"#,
        ] {
            std::fs::write(&path, bad).unwrap();
            let e = TopicTable::load(dir.path()).unwrap_err();
            assert_eq!(e.kind(), std::io::ErrorKind::InvalidData, "{bad}: {e}");
        }
    }

    #[test]
    fn creation_stamps_are_saved_forgotten_with_their_topic_and_only_grow() {
        let dir = tempfile::tempdir().unwrap();
        let mut table = TopicTable::default();
        table.set("a", Some(2));
        table.set_born("a", 500);
        table.set("b", Some(1));
        table.set_born("b", 700);
        table.set("b", None);
        assert_eq!((table.born("a"), table.born("b")), (500, 0));
        assert_eq!(
            table.last_born(),
            700,
            "a deleted topic's stamp still counts"
        );
        table.save(dir.path()).unwrap();
        let loaded = TopicTable::load(dir.path()).unwrap();
        assert_eq!(loaded, table);
        assert_eq!((loaded.born("a"), loaded.last_born()), (500, 700));

        // A file from before stamps loads, with none.
        let path = TopicTable::path(dir.path());
        std::fs::write(&path, br#"{"topics":{"a":2}}"#).unwrap();
        let old = TopicTable::load(dir.path()).unwrap();
        assert_eq!((old.born("a"), old.last_born()), (0, 0));

        // A stamp of no topic of the table, or past the last one given, is refused.
        for bad in [
            r#"{"topics":{"a":2},"born":{"b":5},"last_born":9}"#,
            r#"{"topics":{"a":2},"born":{"a":10},"last_born":9}"#,
        ] {
            std::fs::write(&path, bad).unwrap();
            let e = TopicTable::load(dir.path()).unwrap_err();
            assert_eq!(e.kind(), std::io::ErrorKind::InvalidData, "{bad}: {e}");
        }
    }
}
