//! Queue locks for ordered consumption, kept by the shard that owns the queue: per (group,
//! topic, queue) the client id holding it, on which connection, and when the lock lapses
//! unless renewed. Only requests of that client id on that connection renew or give it up.
//!
//! A lock is held while `now_ms < expires_ms`; locking or renewing sets
//! `expires_ms = now_ms + lock_expiry_ms` (never moving it backwards). Expired entries stay
//! until [`LockTable::purge_expired`] or until someone takes the queue, so callers purge
//! periodically to keep memory bounded by the live locks.
//!
//! Requests reach the owning shard by different ways (a member's own connection, forwarded
//! between shards; a coordinator's release), so they may arrive out of the order they were
//! made in. Each carries a *stamp*: when it was made, in nanoseconds of the process's
//! monotonic clock (one clock for every shard). A lock remembers the stamp of the request
//! that last took or renewed it, and a request older than what it would undo is not
//! applied: a release of a member that left does not drop the lock its client took again
//! after rejoining; an unlock does not drop a lock the client took again after it; a lock
//! request made before the client's release, or before its unlock of that queue, does not
//! take the queue for a client that has given it up (it would sit there, held by nobody
//! consuming, until it lapsed). For that, an unlock leaves a given-up entry (with its
//! stamp) on a queue with none, room permitting, and raises the stamp of another's
//! given-up entry; a given-up entry refuses every lock request made before its stamp.

use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;

/// How long a lock lasts without renewal (RocketMQ's default; clients renew every 20 s).
pub const LOCK_EXPIRY_MS_DEFAULT: u64 = 60_000;

#[derive(Debug, Clone, PartialEq, Eq)]
struct Lock {
    /// Shared by every lock one request took: a client id is stored once per request, not
    /// once per queue.
    holder: Rc<str>,
    /// The connection of the request that took it: requests of the same client id from
    /// another connection are another holder's (a process whose member expired, replaced
    /// by one with the same id, renewed and gave up the new one's locks: two consumers of
    /// one orderly queue). A member that reconnects has its locks released with it (the
    /// connection's close) and takes them again on the new one; a client that locks
    /// without being a member (`Client::lock_batch` takes any group) keeps its locks of a
    /// closed connection until they lapse, and cannot renew them from a new one.
    conn: u64,
    /// 0: given up by its holder (kept, with the unlock's stamp, for the lock expiry).
    expires_ms: u64,
    /// The stamp of the latest request that took, renewed or gave it up.
    stamp: u64,
}

impl Lock {
    fn is_live(&self, now_ms: u64) -> bool {
        now_ms < self.expires_ms
    }

    fn is_held_by(&self, client_id: &str, conn: u64) -> bool {
        &*self.holder == client_id && self.conn == conn
    }
}

/// Most releases remembered per shard (their stamps refuse older lock requests of their
/// clients for `lock_expiry_ms`); past it the oldest is forgotten, which can leave one late
/// lock held by nobody until it lapses, never two holders.
const RELEASES_MAX: usize = 65_536;

const NANOS_PER_MS: u64 = 1_000_000;

type QueueLocks = BTreeMap<u32, Lock>;

/// The queue locks of one shard.
#[derive(Debug, Clone)]
pub struct LockTable {
    lock_expiry_ms: u64,
    /// group -> topic -> queue -> lock. No inner map is ever left empty.
    locks: BTreeMap<String, BTreeMap<String, QueueLocks>>,
    /// group -> client id -> the stamp of the latest release of that member's locks here.
    released: BTreeMap<String, BTreeMap<String, u64>>,
    /// The same releases by stamp, oldest first (what is forgotten first).
    release_order: BTreeSet<(u64, String, String)>,
    /// Entries in `locks` (what [`len`](Self::len) counts), kept as they change.
    entries: usize,
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
            released: BTreeMap::new(),
            release_order: BTreeSet::new(),
            entries: 0,
        }
    }

    pub fn lock_expiry_ms(&self) -> u64 {
        self.lock_expiry_ms
    }

    /// Locks (or renews) each queue for `client_id` on connection `conn` if it is free,
    /// expired, or already held by that client on that connection. Returns the queues it
    /// now holds among those asked for, ascending and distinct. A request made (`stamp`)
    /// before the client's locks here were released, or before a queue was given up (by
    /// it, or by another whose give-up an unlock of its met), takes nothing, or not that
    /// queue.
    #[allow(clippy::too_many_arguments)]
    pub fn lock_batch(
        &mut self,
        group: &str,
        topic: &str,
        queues: &[u32],
        client_id: &str,
        conn: u64,
        now_ms: u64,
        stamp: u64,
    ) -> Vec<u32> {
        let mut asked = queues.to_vec();
        asked.sort_unstable();
        asked.dedup();
        let released = self
            .released
            .get(group)
            .and_then(|clients| clients.get(client_id))
            .is_some_and(|&r| stamp < r);
        if asked.is_empty() || released {
            return Vec::new();
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
                Some(lock) if lock.is_held_by(client_id, conn) => {
                    if lock.expires_ms == 0 && stamp < lock.stamp {
                        // Given up by a later request of the client.
                        continue;
                    }
                    lock.expires_ms = lock.expires_ms.max(expires_ms);
                    lock.stamp = lock.stamp.max(stamp);
                }
                Some(lock) if lock.is_live(now_ms) => continue,
                // Given up by a request made after this one (its holder's unlock, or
                // another's that met it): made before the give-up and arriving after it,
                // in order it would have found the queue held.
                Some(lock) if lock.expires_ms == 0 && stamp < lock.stamp => continue,
                Some(lock) => {
                    *lock = Lock {
                        holder: holder.clone(),
                        conn,
                        expires_ms,
                        stamp,
                    }
                }
                None => {
                    self.entries += 1;
                    table.insert(
                        q,
                        Lock {
                            holder: holder.clone(),
                            conn,
                            expires_ms,
                            stamp,
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

    /// Whether [`lock_batch`](Self::lock_batch) of `queues` keeps at most `max` entries:
    /// those the request would add (queues of `group` and `topic` with no entry yet) count,
    /// renewals do not. Lapsed entries count until the next [`purge_expired`]
    /// (Self::purge_expired), which the shard runs every 500 ms: not here, where a table
    /// kept full of live locks would have every refused request walk all of it.
    pub fn has_room(&self, group: &str, topic: &str, queues: &[u32], max: usize) -> bool {
        let table = self.locks.get(group).and_then(|topics| topics.get(topic));
        let mut asked = queues.to_vec();
        asked.sort_unstable();
        asked.dedup();
        let added = (asked.iter())
            .filter(|q| table.is_none_or(|t| !t.contains_key(q)))
            .count();
        self.entries + added <= max
    }

    /// Unlocks the queues `client_id` holds on connection `conn` among `queues` unless it
    /// locked them again after this request was made (`stamp`); queues held by others are
    /// left alone. A given-up lock stays, free, until taken or its lock expiry: a lock
    /// request of the client made before this one does not take the queue again. With
    /// `remember_absent` (room for the entries: see `has_room`), a queue with no entry
    /// gets a given-up one too: a lock request made before the unlock and arriving after
    /// it (by another way between shards) took the queue for a client that had given it
    /// up, held by nobody consuming until it lapsed.
    #[allow(clippy::too_many_arguments)]
    pub fn unlock_batch(
        &mut self,
        group: &str,
        topic: &str,
        queues: &[u32],
        client_id: &str,
        conn: u64,
        stamp: u64,
        remember_absent: bool,
    ) {
        let table = if remember_absent {
            let topics = self.locks.entry(group.to_owned()).or_default();
            topics.entry(topic.to_owned()).or_default()
        } else {
            match self.locks.get_mut(group).and_then(|t| t.get_mut(topic)) {
                Some(table) => table,
                None => return,
            }
        };
        let mut added = 0;
        let mut holder: Option<Rc<str>> = None;
        for q in queues {
            match table.get_mut(q) {
                Some(lock) if lock.is_held_by(client_id, conn) && lock.stamp <= stamp => {
                    lock.expires_ms = 0;
                    lock.stamp = stamp;
                }
                // Another's given-up entry (the queue's last owner gave it up just before,
                // as after a rebalance): it takes this unlock's stamp, so a lock request
                // this client made before it takes nothing either.
                Some(lock) if lock.expires_ms == 0 => lock.stamp = lock.stamp.max(stamp),
                Some(_) => {}
                None if remember_absent => {
                    added += 1;
                    let given_up = Lock {
                        holder: holder.get_or_insert_with(|| Rc::from(client_id)).clone(),
                        conn,
                        expires_ms: 0,
                        stamp,
                    };
                    table.insert(*q, given_up);
                }
                None => {}
            }
        }
        self.entries += added;
        self.drop_empty(group, topic);
    }

    /// A member left the group (decided at `stamp`): drops every lock it holds in it, live
    /// or expired, at once (so its queues can be taken without waiting for expiry), except
    /// those its client took again after `stamp`; lock requests of the client made before
    /// `stamp` are refused from now on. Returns how many it dropped.
    pub fn release_client(&mut self, group: &str, client_id: &str, stamp: u64) -> usize {
        self.remember_release(group, client_id, stamp);
        let Some(topics) = self.locks.get_mut(group) else {
            return 0;
        };
        let mut released = 0;
        for table in topics.values_mut() {
            let before = table.len();
            table.retain(|_, l| &*l.holder != client_id || l.stamp >= stamp);
            released += before - table.len();
        }
        topics.retain(|_, t| !t.is_empty());
        if topics.is_empty() {
            self.locks.remove(group);
        }
        self.entries -= released;
        released
    }

    /// A deleted group: every lock in it goes.
    pub fn forget_group(&mut self, group: &str) {
        if let Some(topics) = self.locks.remove(group) {
            self.entries -= topics.values().map(BTreeMap::len).sum::<usize>();
        }
    }

    /// Releases remembered (until `lock_expiry_ms` past their stamps, or [`RELEASES_MAX`]).
    pub fn releases_len(&self) -> usize {
        self.release_order.len()
    }

    fn remember_release(&mut self, group: &str, client_id: &str, stamp: u64) {
        let clients = self.released.entry(group.to_owned()).or_default();
        let latest = match clients.get_mut(client_id) {
            Some(r) if *r >= stamp => return,
            Some(r) => {
                let older = std::mem::replace(r, stamp);
                self.release_order
                    .remove(&(older, group.to_owned(), client_id.to_owned()));
                stamp
            }
            None => {
                clients.insert(client_id.to_owned(), stamp);
                stamp
            }
        };
        self.release_order
            .insert((latest, group.to_owned(), client_id.to_owned()));
        while self.release_order.len() > RELEASES_MAX {
            self.forget_oldest_release();
        }
    }

    fn forget_oldest_release(&mut self) {
        let Some((_, group, client_id)) = self.release_order.pop_first() else {
            return;
        };
        if let Some(clients) = self.released.get_mut(&group) {
            clients.remove(&client_id);
            if clients.is_empty() {
                self.released.remove(&group);
            }
        }
    }

    /// Locks held now (given-up entries, kept for the lock expiry, and expired ones kept
    /// until purged are not counted).
    pub fn live_len(&self, now_ms: u64) -> usize {
        self.locks
            .values()
            .flat_map(|topics| topics.values())
            .flat_map(BTreeMap::values)
            .filter(|l| l.is_live(now_ms))
            .count()
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

    /// Forgets expired locks, so memory is bounded by the live ones (and the queues given
    /// up within the lock expiry), and releases and unlocks older than the lock expiry (a
    /// lock request that late has been given up on). Until then an unlock's stamp is kept:
    /// a lock request of its client made before it, however late it arrives, takes nothing.
    pub fn purge_expired(&mut self, now_ms: u64) {
        let expiry = self.lock_expiry_ms;
        let remembered = |stamp: u64| (stamp / NANOS_PER_MS).saturating_add(expiry) > now_ms;
        while (self.release_order.first()).is_some_and(|&(r, _, _)| !remembered(r)) {
            self.forget_oldest_release();
        }
        self.retain_locks(|l| l.is_live(now_ms) || l.expires_ms == 0 && remembered(l.stamp));
    }

    /// Forgets the groups whose locks were all given up (or lapsed), before their lock
    /// expiry: room for another group's locks at the `--groups-max` cap. A lock request of
    /// a client made before its unlock of one of them and arriving after this can then take
    /// the queue again (held by nobody consuming until it lapses; never two holders).
    /// Groups holding a live lock keep their given-up ones.
    pub fn forget_given_up(&mut self, now_ms: u64) {
        let mut forgotten = 0;
        self.locks.retain(|_, topics| {
            let live = (topics.values())
                .flat_map(BTreeMap::values)
                .any(|l| l.is_live(now_ms));
            if !live {
                forgotten += topics.values().map(BTreeMap::len).sum::<usize>();
            }
            live
        });
        self.entries -= forgotten;
    }

    fn retain_locks(&mut self, keep: impl Fn(&Lock) -> bool) {
        let mut kept = 0;
        self.locks.retain(|_, topics| {
            topics.retain(|_, table| {
                table.retain(|_, l| keep(l));
                kept += table.len();
                !table.is_empty()
            });
            !topics.is_empty()
        });
        self.entries = kept;
    }

    /// Whether `group` holds a lock here (or held one: given up within the lock expiry, or
    /// lapsed and not purged yet).
    pub fn has_group(&self, group: &str) -> bool {
        self.locks.contains_key(group)
    }

    /// Groups with locks here, given-up and expired ones included as in
    /// [`has_group`](Self::has_group).
    pub fn group_count(&self) -> usize {
        self.locks.len()
    }

    /// Entries kept, given-up and expired ones included as in [`has_group`](Self::has_group).
    pub fn len(&self) -> usize {
        debug_assert_eq!(
            self.entries,
            (self.locks.values())
                .flat_map(|topics| topics.values())
                .map(BTreeMap::len)
                .sum::<usize>()
        );
        self.entries
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

    /// A request's stamp made at `ms` on the lock table's clock.
    fn at(ms: u64) -> u64 {
        ms.saturating_mul(NANOS_PER_MS)
    }

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
        assert_eq!(
            t.lock_batch("g", "t", &[2, 0, 1, 1], "a", 1, 0, at(0)),
            vec![0, 1, 2]
        );
        assert_eq!(
            t.lock_batch("g", "t", &[1, 2, 3], "b", 1, 10, at(10)),
            vec![3]
        );
        check(&t, 1, 10, Some("a"));
        check(&t, 3, 10, Some("b"));
        assert!(!t.is_locked_by("g", "t", 1, "b", 10));
        // Other groups and topics are independent.
        assert_eq!(t.lock_batch("g2", "t", &[1], "b", 1, 10, at(10)), vec![1]);
        assert_eq!(t.lock_batch("g", "t2", &[1], "b", 1, 10, at(10)), vec![1]);
    }

    #[test]
    fn expiry_lets_another_take_it() {
        let mut t = LockTable::new(EXPIRY);
        t.lock_batch("g", "t", &[0], "a", 1, 0, at(0));
        check(&t, 0, EXPIRY - 1, Some("a"));
        assert!(t
            .lock_batch("g", "t", &[0], "b", 1, EXPIRY - 1, at(EXPIRY - 1))
            .is_empty());
        check(&t, 0, EXPIRY, None);
        assert_eq!(
            t.lock_batch("g", "t", &[0], "b", 1, EXPIRY, at(EXPIRY)),
            vec![0]
        );
        check(&t, 0, EXPIRY, Some("b"));
    }

    #[test]
    fn renewal_extends() {
        let mut t = LockTable::new(EXPIRY);
        t.lock_batch("g", "t", &[0], "a", 1, 0, at(0));
        assert_eq!(t.lock_batch("g", "t", &[0], "a", 1, 900, at(900)), vec![0]);
        check(&t, 0, 1_500, Some("a"));
        assert!(t
            .lock_batch("g", "t", &[0], "b", 1, 1_500, at(1_500))
            .is_empty());
        // A renewal with an older clock never shortens the lock.
        t.lock_batch("g", "t", &[0], "a", 1, 100, at(100));
        check(&t, 0, 1_899, Some("a"));
        check(&t, 0, 1_900, None);
    }

    #[test]
    fn release_client_frees_at_once() {
        let mut t = LockTable::new(EXPIRY);
        t.lock_batch("g", "t", &[0, 1], "a", 1, 0, at(0));
        t.lock_batch("g", "t2", &[5], "a", 1, 0, at(0));
        t.lock_batch("g", "t", &[2], "b", 1, 0, at(0));
        t.lock_batch("other", "t", &[0], "a", 1, 0, at(0));
        assert_eq!(t.release_client("g", "a", at(1)), 3);
        assert_eq!(t.release_client("g", "a", at(1)), 0);
        assert_eq!(
            t.lock_batch("g", "t", &[0, 1, 2], "b", 1, 1, at(1)),
            vec![0, 1, 2]
        );
        assert_eq!(t.holder("other", "t", 0, 1), Some("a"));
    }

    #[test]
    fn unlock_only_by_holder() {
        let mut t = LockTable::new(EXPIRY);
        t.lock_batch("g", "t", &[0, 1], "a", 1, 0, at(0));
        t.unlock_batch("g", "t", &[0, 1, 7], "b", 1, at(1), false);
        t.unlock_batch("nope", "t", &[0], "a", 1, at(1), false);
        check(&t, 0, 1, Some("a"));
        check(&t, 1, 1, Some("a"));
        t.unlock_batch("g", "t", &[0], "a", 1, at(1), false);
        check(&t, 0, 1, None);
        check(&t, 1, 1, Some("a"));
        assert_eq!((t.len(), t.live_len(1)), (2, 1));
        t.unlock_batch("g", "t", &[1], "a", 1, at(1), false);
        check(&t, 1, 1, None);
        // Given-up locks are kept (with their unlocks' stamps) for the lock expiry.
        t.purge_expired(1);
        assert_eq!((t.len(), t.live_len(1)), (2, 0));
        t.purge_expired(1 + EXPIRY);
        assert!(t.is_empty());
    }

    /// A member's release that arrives after its client rejoined and locked again (the
    /// release was decided before that) leaves the new lock alone: the client consumes
    /// under it, and another member must not be able to take the queue.
    #[test]
    fn a_late_release_keeps_what_the_client_locked_after_it() {
        let mut t = LockTable::new(EXPIRY);
        t.lock_batch("g", "t", &[0, 1], "a", 1, 0, at(0));
        // Rejoined: queue 0 locked again after the release was decided (at 20); a renewal
        // made before that arrives after it and does not make the lock older.
        assert_eq!(t.lock_batch("g", "t", &[0], "a", 1, 30, at(30)), vec![0]);
        assert_eq!(t.lock_batch("g", "t", &[0], "a", 1, 30, at(10)), vec![0]);
        assert_eq!(t.release_client("g", "a", at(20)), 1);
        check(&t, 0, 40, Some("a"));
        check(&t, 1, 40, None);
        assert_eq!(t.lock_batch("g", "t", &[0, 1], "b", 1, 40, at(40)), vec![1]);
        assert_eq!(t.live_len(40), 2);
        assert_eq!(t.live_len(30 + EXPIRY), 1, "a's lapsed, b's (from 40) held");
    }

    /// A lock request made before its client's release but arriving after it takes
    /// nothing (it would hold queues for a member that left); one made after is served.
    #[test]
    fn a_lock_request_made_before_a_release_takes_nothing() {
        let mut t = LockTable::new(EXPIRY);
        assert_eq!(t.release_client("g", "a", at(20)), 0);
        assert!(t.lock_batch("g", "t", &[0], "a", 1, 25, at(10)).is_empty());
        assert!(t.is_empty());
        check(&t, 0, 25, None);
        // Another client, or this one's later requests, are not affected.
        assert_eq!(t.lock_batch("g", "t", &[1], "b", 1, 25, at(10)), vec![1]);
        assert_eq!(t.lock_batch("g", "t", &[0], "a", 1, 30, at(30)), vec![0]);
        // A release is remembered for as long as a lock lasts, then forgotten.
        assert_eq!(t.releases_len(), 1);
        t.purge_expired(20 + EXPIRY - 1);
        assert_eq!(t.releases_len(), 1);
        t.purge_expired(20 + EXPIRY);
        assert_eq!(t.releases_len(), 0);
    }

    /// An unlock does not drop a lock its client took again after making it, and a lock
    /// request made before an unlock does not take the queue back once it has come.
    #[test]
    fn lock_and_unlock_of_one_client_apply_in_the_order_they_were_made() {
        let mut t = LockTable::new(EXPIRY);
        t.lock_batch("g", "t", &[0], "a", 1, 0, at(10));
        t.lock_batch("g", "t", &[0], "a", 1, 0, at(30));
        t.unlock_batch("g", "t", &[0], "a", 1, at(20), false);
        check(&t, 0, 1, Some("a"));
        t.unlock_batch("g", "t", &[0], "a", 1, at(40), false);
        check(&t, 0, 1, None);
        assert!(t.lock_batch("g", "t", &[0], "a", 1, 1, at(35)).is_empty());
        check(&t, 0, 1, None);
        assert_eq!(t.lock_batch("g", "t", &[0], "a", 1, 1, at(50)), vec![0]);
        t.unlock_batch("g", "t", &[0], "a", 1, at(60), false);
        // A given-up lock is free at once for anyone else's request made after the unlock;
        // one made before it, arriving after it, takes nothing (in order, it would have
        // found the queue held).
        assert!(t.lock_batch("g", "t", &[0], "b", 1, 1, at(55)).is_empty());
        assert_eq!(t.lock_batch("g", "t", &[0], "b", 1, 1, at(65)), vec![0]);
        check(&t, 0, 1, Some("b"));
    }

    /// An unlock is remembered for the lock expiry, purges or not: a lock request of its
    /// client made before it and arriving later takes nothing. Before, a purge (every
    /// second) forgot it, and the late request took the queue for a client that had given
    /// it up.
    #[test]
    fn an_unlock_is_remembered_across_purges_for_the_lock_expiry() {
        let mut t = LockTable::new(EXPIRY);
        assert_eq!(t.lock_batch("g", "t", &[0], "a", 1, 0, at(0)), vec![0]);
        t.unlock_batch("g", "t", &[0], "a", 1, at(20), false);
        t.purge_expired(500);
        assert!(t.lock_batch("g", "t", &[0], "a", 1, 600, at(10)).is_empty());
        check(&t, 0, 600, None);
        assert_eq!(t.live_len(600), 0);
        t.purge_expired(20 + EXPIRY);
        assert!(t.is_empty(), "forgotten past the lock expiry");
        // Forgotten at once when another group's locks need the room, unless the group
        // holds a live lock (its place is not freed anyway).
        t.lock_batch("g", "t", &[0], "a", 1, 0, at(0));
        t.unlock_batch("g", "t", &[0], "a", 1, at(20), false);
        t.lock_batch("h", "t", &[0, 1], "b", 1, 0, at(0));
        t.unlock_batch("h", "t", &[0], "b", 1, at(20), false);
        t.forget_given_up(30);
        assert_eq!((t.group_count(), t.len()), (1, 2));
        assert!(t.lock_batch("h", "t", &[0], "b", 1, 40, at(10)).is_empty());
    }

    /// An unlock that arrives before a lock request its client made ahead of it (the two
    /// came to the queue's shard by different ways) leaves a given-up entry: the late
    /// request takes nothing. Before, the unlock found no entry and recorded nothing, and
    /// the late request took the queue for a client that had given it up.
    #[test]
    fn an_unlock_ahead_of_an_earlier_lock_request_is_remembered() {
        let mut t = LockTable::new(EXPIRY);
        t.unlock_batch("g", "t", &[0, 0], "a", 1, at(20), true);
        assert_eq!((t.len(), t.live_len(25)), (1, 0));
        assert!(t.lock_batch("g", "t", &[0], "a", 1, 25, at(10)).is_empty());
        check(&t, 0, 25, None);
        // A later request of its client takes it, as would anyone else.
        assert_eq!(t.lock_batch("g", "t", &[0], "a", 1, 30, at(30)), vec![0]);
        // The queue's last owner (b) gave it up, then a's unlock came ahead of a's lock
        // request made before it: the request takes nothing (it found b's entry, and took
        // the queue).
        assert_eq!(t.lock_batch("g", "t", &[3], "b", 1, 30, at(30)), vec![3]);
        t.unlock_batch("g", "t", &[3], "b", 1, at(32), true);
        t.unlock_batch("g", "t", &[3], "a", 1, at(36), true);
        assert!(t.lock_batch("g", "t", &[3], "a", 1, 37, at(34)).is_empty());
        assert_eq!(t.lock_batch("g", "t", &[3], "a", 1, 37, at(37)), vec![3]);
        t.unlock_batch("g", "t", &[3], "a", 1, at(38), false);
        // Without room for it, nothing is recorded.
        t.unlock_batch("g", "t", &[5], "a", 1, at(40), false);
        t.unlock_batch("h", "t", &[5], "a", 1, at(40), false);
        assert_eq!((t.len(), t.group_count()), (2, 1));
        // Forgotten past the lock expiry, as any given-up lock.
        t.unlock_batch("h", "t", &[1], "b", 1, at(50), true);
        assert_eq!((t.len(), t.group_count()), (3, 2));
        t.purge_expired(50 + EXPIRY);
        assert_eq!((t.len(), t.group_count()), (0, 0));
    }

    #[test]
    fn releases_remembered_are_bounded() {
        let mut t = LockTable::new(u64::MAX);
        for i in 0..=RELEASES_MAX as u64 {
            t.release_client("g", &format!("c{i}"), at(i + 1));
        }
        assert_eq!(t.releases_len(), RELEASES_MAX);
        // The oldest went: its late lock requests are served again.
        assert_eq!(t.lock_batch("g", "t", &[0], "c0", 1, 0, at(0)), vec![0]);
        assert!(t.lock_batch("g", "t", &[1], "c1", 1, 0, at(0)).is_empty());
    }

    #[test]
    fn purge_bounds_memory() {
        let mut t = LockTable::new(EXPIRY);
        for i in 0..100u32 {
            t.lock_batch(
                &format!("g{i}"),
                "t",
                &[0, 1, 2],
                "a",
                1,
                u64::from(i),
                at(u64::from(i)),
            );
        }
        t.lock_batch("g", "t", &[0], "b", 1, 5_000, at(5_000));
        assert_eq!(t.len(), 301);
        t.purge_expired(5_000);
        assert_eq!(t.len(), 1);
        check(&t, 0, 5_000, Some("b"));
        t.purge_expired(u64::MAX);
        assert!(t.is_empty());
    }

    /// Entries past a bound are refused; renewals and queues already held are not counted;
    /// lapsed entries make room once purged.
    #[test]
    fn entries_are_bounded_and_renewals_need_no_room() {
        let mut t = LockTable::new(EXPIRY);
        assert!(t.has_room("g", "t", &[0, 1, 2, 2], 3));
        assert_eq!(
            t.lock_batch("g", "t", &[0, 1, 2], "a", 1, 0, at(0)),
            [0, 1, 2]
        );
        assert!(!t.has_room("g", "t", &[3], 3));
        assert!(!t.has_room("h", "t", &[0], 3));
        assert!(t.has_room("g", "t", &[0, 1, 2], 3), "a renewal");
        assert!(t.has_room("g", "t", &[2, 3], 4));
        assert_eq!(t.len(), 3);
        t.release_client("g", "a", at(20));
        assert_eq!(t.len(), 0);
        assert!(t.has_room("h", "t", &[0, 1, 2], 3));
        assert_eq!(
            t.lock_batch("h", "t", &[0, 1, 2], "b", 1, 30, at(30)),
            [0, 1, 2]
        );
        // Lapsed, they make room once purged.
        assert!(!t.has_room("g", "t", &[5], 3));
        t.purge_expired(30 + EXPIRY);
        assert!(t.has_room("g", "t", &[5], 3));
        assert_eq!(t.len(), 0);
        t.lock_batch("h", "u", &[0, 1], "b", 1, 40 + EXPIRY, at(40 + EXPIRY));
        t.forget_group("h");
        assert_eq!(t.len(), 0);
    }

    #[test]
    fn failed_lock_leaves_no_empty_entries() {
        let mut t = LockTable::new(EXPIRY);
        assert!(t.lock_batch("g", "t", &[], "a", 1, 0, at(0)).is_empty());
        assert!(t.is_empty());
    }

    #[test]
    fn expiry_saturates() {
        let mut t = LockTable::new(u64::MAX);
        assert_eq!(t.lock_batch("g", "t", &[0], "a", 1, 10, at(10)), vec![0]);
        check(&t, 0, u64::MAX - 1, Some("a"));
    }
}
