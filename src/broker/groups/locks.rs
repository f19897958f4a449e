//! Queue locks for ordered consumption, kept by the shard that owns the queue: per (group,
//! topic, queue) the client id holding it and when the lock lapses unless renewed.
//!
//! A lock is held while `now_ms < expires_ms`; locking or renewing sets
//! `expires_ms = now_ms + lock_expiry_ms` (never moving it backwards). Expired entries stay
//! until [`LockTable::purge_expired`] or until someone takes the queue, so callers purge
//! periodically to keep memory bounded by the live locks.

use std::collections::BTreeMap;
use std::rc::Rc;

/// How long a lock lasts without renewal (RocketMQ's default; clients renew every 20 s).
pub const LOCK_EXPIRY_MS_DEFAULT: u64 = 60_000;

#[derive(Debug, Clone, PartialEq, Eq)]
struct Lock {
    /// Shared by every lock one request took: a client id is stored once per request, not
    /// once per queue.
    holder: Rc<str>,
    expires_ms: u64,
}

impl Lock {
    fn is_live(&self, now_ms: u64) -> bool {
        now_ms < self.expires_ms
    }
}

type QueueLocks = BTreeMap<u32, Lock>;

/// The queue locks of one shard.
#[derive(Debug, Clone)]
pub struct LockTable {
    lock_expiry_ms: u64,
    /// group -> topic -> queue -> lock. No inner map is ever left empty.
    locks: BTreeMap<String, BTreeMap<String, QueueLocks>>,
}

impl Default for LockTable {
    fn default() -> Self {
        LockTable::new(LOCK_EXPIRY_MS_DEFAULT)
    }
}

impl LockTable {
    pub fn new(lock_expiry_ms: u64) -> Self {
        LockTable {
            lock_expiry_ms,
            locks: BTreeMap::new(),
        }
    }

    pub fn lock_expiry_ms(&self) -> u64 {
        self.lock_expiry_ms
    }

    /// Locks (or renews) each queue for `client_id` if it is free, expired, or already held
    /// by that client. Returns the queues it now holds among those asked for, ascending and
    /// distinct.
    pub fn lock_batch(
        &mut self,
        group: &str,
        topic: &str,
        queues: &[u32],
        client_id: &str,
        now_ms: u64,
    ) -> Vec<u32> {
        let mut asked = queues.to_vec();
        asked.sort_unstable();
        asked.dedup();
        if asked.is_empty() {
            return asked;
        }
        let expires_ms = now_ms.saturating_add(self.lock_expiry_ms);
        let table = self
            .locks
            .entry(group.to_owned())
            .or_default()
            .entry(topic.to_owned())
            .or_default();
        let mut held = Vec::with_capacity(asked.len());
        let holder: Rc<str> = Rc::from(client_id);
        for q in asked {
            match table.get_mut(&q) {
                Some(lock) if &*lock.holder == client_id => {
                    lock.expires_ms = lock.expires_ms.max(expires_ms);
                }
                Some(lock) if lock.is_live(now_ms) => continue,
                Some(lock) => {
                    *lock = Lock {
                        holder: holder.clone(),
                        expires_ms,
                    }
                }
                None => {
                    table.insert(
                        q,
                        Lock {
                            holder: holder.clone(),
                            expires_ms,
                        },
                    );
                }
            }
            held.push(q);
        }
        if held.is_empty() {
            self.drop_empty(group, topic);
        }
        held
    }

    /// Unlocks the queues `client_id` holds among `queues`; queues held by others (or by
    /// nobody) are left alone.
    pub fn unlock_batch(&mut self, group: &str, topic: &str, queues: &[u32], client_id: &str) {
        let Some(table) = self.locks.get_mut(group).and_then(|t| t.get_mut(topic)) else {
            return;
        };
        for q in queues {
            if table.get(q).is_some_and(|l| &*l.holder == client_id) {
                table.remove(q);
            }
        }
        self.drop_empty(group, topic);
    }

    /// A member left the group: drops every lock it holds in it, live or expired, at once
    /// (so its queues can be taken without waiting for expiry). Returns how many.
    pub fn release_client(&mut self, group: &str, client_id: &str) -> usize {
        let Some(topics) = self.locks.get_mut(group) else {
            return 0;
        };
        let mut released = 0;
        for table in topics.values_mut() {
            let before = table.len();
            table.retain(|_, l| &*l.holder != client_id);
            released += before - table.len();
        }
        topics.retain(|_, t| !t.is_empty());
        if topics.is_empty() {
            self.locks.remove(group);
        }
        released
    }

    /// A deleted group: every lock in it goes.
    pub fn forget_group(&mut self, group: &str) {
        self.locks.remove(group);
    }

    /// The client holding the lock, `None` if free or expired.
    pub fn holder(&self, group: &str, topic: &str, queue: u32, now_ms: u64) -> Option<&str> {
        self.locks
            .get(group)?
            .get(topic)?
            .get(&queue)
            .filter(|l| l.is_live(now_ms))
            .map(|l| &*l.holder)
    }

    pub fn is_locked_by(
        &self,
        group: &str,
        topic: &str,
        queue: u32,
        client_id: &str,
        now_ms: u64,
    ) -> bool {
        self.holder(group, topic, queue, now_ms) == Some(client_id)
    }

    /// Forgets expired locks, so memory is bounded by the live ones.
    pub fn purge_expired(&mut self, now_ms: u64) {
        self.locks.retain(|_, topics| {
            topics.retain(|_, table| {
                table.retain(|_, l| l.is_live(now_ms));
                !table.is_empty()
            });
            !topics.is_empty()
        });
    }

    /// Whether `group` holds (or held, until purged) a lock here.
    pub fn has_group(&self, group: &str) -> bool {
        self.locks.contains_key(group)
    }

    /// Groups with locks here, expired ones included until purged.
    pub fn group_count(&self) -> usize {
        self.locks.len()
    }

    /// Entries kept, expired ones included until purged.
    pub fn len(&self) -> usize {
        self.locks
            .values()
            .flat_map(|topics| topics.values())
            .map(BTreeMap::len)
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.locks.is_empty()
    }

    fn drop_empty(&mut self, group: &str, topic: &str) {
        let Some(topics) = self.locks.get_mut(group) else {
            return;
        };
        if topics.get(topic).is_some_and(BTreeMap::is_empty) {
            topics.remove(topic);
        }
        if topics.is_empty() {
            self.locks.remove(group);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXPIRY: u64 = 1_000;

    fn check(table: &LockTable, queue: u32, now_ms: u64, expected: Option<&str>) {
        assert_eq!(
            table.holder("g", "t", queue, now_ms),
            expected,
            "queue {queue} at {now_ms}"
        );
        if let Some(c) = expected {
            assert!(table.is_locked_by("g", "t", queue, c, now_ms));
        }
    }

    #[test]
    fn lock_is_exclusive() {
        let mut t = LockTable::new(EXPIRY);
        assert_eq!(t.lock_batch("g", "t", &[2, 0, 1, 1], "a", 0), vec![0, 1, 2]);
        assert_eq!(t.lock_batch("g", "t", &[1, 2, 3], "b", 10), vec![3]);
        check(&t, 1, 10, Some("a"));
        check(&t, 3, 10, Some("b"));
        assert!(!t.is_locked_by("g", "t", 1, "b", 10));
        // Other groups and topics are independent.
        assert_eq!(t.lock_batch("g2", "t", &[1], "b", 10), vec![1]);
        assert_eq!(t.lock_batch("g", "t2", &[1], "b", 10), vec![1]);
    }

    #[test]
    fn expiry_lets_another_take_it() {
        let mut t = LockTable::new(EXPIRY);
        t.lock_batch("g", "t", &[0], "a", 0);
        check(&t, 0, EXPIRY - 1, Some("a"));
        assert!(t.lock_batch("g", "t", &[0], "b", EXPIRY - 1).is_empty());
        check(&t, 0, EXPIRY, None);
        assert_eq!(t.lock_batch("g", "t", &[0], "b", EXPIRY), vec![0]);
        check(&t, 0, EXPIRY, Some("b"));
    }

    #[test]
    fn renewal_extends() {
        let mut t = LockTable::new(EXPIRY);
        t.lock_batch("g", "t", &[0], "a", 0);
        assert_eq!(t.lock_batch("g", "t", &[0], "a", 900), vec![0]);
        check(&t, 0, 1_500, Some("a"));
        assert!(t.lock_batch("g", "t", &[0], "b", 1_500).is_empty());
        // A renewal with an older clock never shortens the lock.
        t.lock_batch("g", "t", &[0], "a", 100);
        check(&t, 0, 1_899, Some("a"));
        check(&t, 0, 1_900, None);
    }

    #[test]
    fn release_client_frees_at_once() {
        let mut t = LockTable::new(EXPIRY);
        t.lock_batch("g", "t", &[0, 1], "a", 0);
        t.lock_batch("g", "t2", &[5], "a", 0);
        t.lock_batch("g", "t", &[2], "b", 0);
        t.lock_batch("other", "t", &[0], "a", 0);
        assert_eq!(t.release_client("g", "a"), 3);
        assert_eq!(t.release_client("g", "a"), 0);
        assert_eq!(t.lock_batch("g", "t", &[0, 1, 2], "b", 1), vec![0, 1, 2]);
        assert_eq!(t.holder("other", "t", 0, 1), Some("a"));
    }

    #[test]
    fn unlock_only_by_holder() {
        let mut t = LockTable::new(EXPIRY);
        t.lock_batch("g", "t", &[0, 1], "a", 0);
        t.unlock_batch("g", "t", &[0, 1, 7], "b");
        t.unlock_batch("nope", "t", &[0], "a");
        check(&t, 0, 1, Some("a"));
        check(&t, 1, 1, Some("a"));
        t.unlock_batch("g", "t", &[0], "a");
        check(&t, 0, 1, None);
        check(&t, 1, 1, Some("a"));
        t.unlock_batch("g", "t", &[1], "a");
        assert!(t.is_empty());
    }

    #[test]
    fn purge_bounds_memory() {
        let mut t = LockTable::new(EXPIRY);
        for i in 0..100u32 {
            t.lock_batch(&format!("g{i}"), "t", &[0, 1, 2], "a", u64::from(i));
        }
        t.lock_batch("g", "t", &[0], "b", 5_000);
        assert_eq!(t.len(), 301);
        t.purge_expired(5_000);
        assert_eq!(t.len(), 1);
        check(&t, 0, 5_000, Some("b"));
        t.purge_expired(u64::MAX);
        assert!(t.is_empty());
    }

    #[test]
    fn failed_lock_leaves_no_empty_entries() {
        let mut t = LockTable::new(EXPIRY);
        assert!(t.lock_batch("g", "t", &[], "a", 0).is_empty());
        assert!(t.is_empty());
    }

    #[test]
    fn expiry_saturates() {
        let mut t = LockTable::new(u64::MAX);
        assert_eq!(t.lock_batch("g", "t", &[0], "a", 10), vec![0]);
        check(&t, 0, u64::MAX - 1, Some("a"));
    }
}
