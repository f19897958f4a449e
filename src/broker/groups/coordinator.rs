//! The membership of one consumer group, kept by the group's coordinator shard
//! ([`coordinator_shard`]): who is in the group, what each member subscribes to, and the
//! queue assignment that follows from it.
//!
//! Group-wide settings (allocation strategy, message model) are those of the member that
//! declared them most recently: the one that joined, or changed its strategy or model,
//! last. A plain refresh heartbeat declares nothing, so members that disagree do not make
//! the assignment flip back and forth on every heartbeat; when the declaring member leaves,
//! the settings of the next most recent declarer apply.

use std::collections::{BTreeMap, BTreeSet};

use super::allocate::{allocate, Strategy, VIRTUAL_NODES_MAX};
use super::TagFilter;
use crate::broker::topics::QUEUES_PER_TOPIC_MAX;

/// A member that has not sent a heartbeat for this long leaves the group (the default of
/// `--session-timeout-ms`). Upstream waits 120 s (30 s heartbeats), which stalls ordered
/// queues for minutes after a crash; clients of ringmq are expected to heartbeat at least
/// three times per timeout.
pub const SESSION_TIMEOUT_MS_DEFAULT: u64 = 10_000;
/// Most members of one group.
pub const MEMBERS_PER_GROUP_MAX: usize = 1024;
/// Most subscriptions of one member.
pub const SUBSCRIPTIONS_PER_MEMBER_MAX: usize = 256;
/// Longest client id, in bytes.
pub const CLIENT_ID_BYTES_MAX: usize = 255;
/// Most queue names in a by-config strategy, over all its clients.
pub const CONFIG_QUEUES_MAX: usize = 65_536;

/// One topic a member consumes, with its tag expression (`*` or `A || B`) or SQL92 filter.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Subscription {
    pub topic: String,
    pub expression: String,
    /// `expression` is an SQL92 filter (`protocol::sql`), not tags.
    pub sql: bool,
}

impl Subscription {
    /// Whether the expression parses; the reason (with its column, for SQL) if not.
    pub fn check(&self) -> Result<(), String> {
        if self.sql {
            crate::protocol::sql::SqlFilter::parse(&self.expression)
                .map(|_| ())
                .map_err(|e| e.to_string())
        } else {
            TagFilter::parse(&self.expression).map(|_| ())
        }
    }
}

/// How a member consumes a queue it is given. Does not change the assignment: it tells the
/// broker whether the member takes queue locks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ConsumeMode {
    #[default]
    Concurrent,
    /// One thread per queue, in offset order, under the queue's lock.
    Orderly,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MessageModel {
    /// Each message goes to one member: the queues are divided among the members.
    #[default]
    Clustering,
    /// Each message goes to every member: every member gets every queue it subscribes to.
    Broadcasting,
}

/// What a member says in each heartbeat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberInfo {
    pub client_id: String,
    pub subscriptions: Vec<Subscription>,
    pub mode: ConsumeMode,
    pub model: MessageModel,
    pub strategy: Strategy,
    /// Opaque id of the connection the member is on: when it closes, the member leaves.
    pub connection: u64,
}

/// What one entry of a `BTreeMap` costs beyond its key and value, about: the coordinator's
/// member table and a by-config strategy's client table ([`MemberInfo::held_bytes`]).
const MAP_ENTRY_BYTES: usize = 32;

impl MemberInfo {
    /// Its subscriptions as the coordinator keeps them: sorted by topic, one per topic (the
    /// last one given wins).
    pub fn normalize(&mut self) {
        self.subscriptions = normalize(std::mem::take(&mut self.subscriptions));
    }

    /// About the memory the coordinator holds for this member once it has joined: its
    /// entry in the member table (the id twice, as key and in the info), its
    /// subscriptions and a by-config strategy's table. What `--group-members-mb` counts.
    /// Measured as kept: subscriptions sorted by topic, one per topic ([`Self::normalize`]).
    pub fn held_bytes(&self) -> usize {
        let subscriptions: usize = self
            .subscriptions
            .iter()
            .map(|s| std::mem::size_of::<Subscription>() + s.topic.len() + s.expression.len())
            .sum();
        let strategy: usize = match &self.strategy {
            Strategy::ByConfig(config) => config
                .iter()
                .map(|(client, queues)| {
                    MAP_ENTRY_BYTES
                        + std::mem::size_of::<(String, Vec<u32>)>()
                        + client.len()
                        + std::mem::size_of_val(queues.as_slice())
                })
                .sum(),
            _ => 0,
        };
        MAP_ENTRY_BYTES
            + std::mem::size_of::<(String, Member)>()
            + 2 * self.client_id.len()
            + subscriptions
            + strategy
    }
}

/// Why a heartbeat ([`GroupState::check_heartbeat`]) or an unregister
/// ([`GroupState::unregister`]) is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GroupError {
    #[error("invalid client id {client_id:?}: {reason}")]
    InvalidClientId { client_id: String, reason: String },
    #[error("group {group} is full: at most {max} members")]
    GroupFull { group: String, max: usize },
    #[error("{count} subscriptions; at most {max} are allowed")]
    TooManySubscriptions { count: usize, max: usize },
    #[error("subscription to {topic:?}: {reason}")]
    InvalidSubscription { topic: String, reason: String },
    #[error("allocation strategy {strategy}: {reason}")]
    InvalidStrategy { strategy: String, reason: String },
    #[error("client id {client_id:?} is in use by another live connection in group {group}; give each member its own id")]
    ClientIdInUse { group: String, client_id: String },
    #[error(
        "member {client_id:?} of group {group} is on another connection; only that connection's \
         unregister takes it out (it leaves when that connection closes or its session expires)"
    )]
    MemberOnOtherConnection { group: String, client_id: String },
}

#[derive(Debug, Clone)]
struct Member {
    /// Subscriptions sorted by topic, one per topic.
    info: MemberInfo,
    last_heartbeat_ms: u64,
    /// When this member last declared its strategy and model (joined or changed them);
    /// the largest one sets the group's.
    declared: u64,
}

/// The state of one consumer group on its coordinator shard.
#[derive(Debug, Clone)]
pub struct GroupState {
    group: String,
    session_timeout_ms: u64,
    members: BTreeMap<String, Member>,
    generation: u64,
    declarations: u64,
    /// [`MemberInfo::held_bytes`] of all members.
    held_bytes: usize,
}

static STRATEGY_WITHOUT_MEMBERS: Strategy = Strategy::Averagely;

impl GroupState {
    pub fn new(group: String, session_timeout_ms: u64) -> Self {
        GroupState {
            group,
            session_timeout_ms,
            members: BTreeMap::new(),
            generation: 0,
            declarations: 0,
            held_bytes: 0,
        }
    }

    pub fn group(&self) -> &str {
        &self.group
    }

    pub fn session_timeout_ms(&self) -> u64 {
        self.session_timeout_ms
    }

    /// Checks a heartbeat before [`Self::heartbeat`] applies it: client id, subscriptions
    /// (non-empty topics, valid tag expressions, bounded count), strategy bounds, and room
    /// in the group for a new member. Topic names are the caller's to validate.
    /// `heartbeat` itself checks nothing, so the bounds hold only if callers check first.
    pub fn check_heartbeat(&self, m: &MemberInfo) -> Result<(), GroupError> {
        let bad_id = |reason: &str| {
            Err(GroupError::InvalidClientId {
                client_id: m.client_id.chars().take(CLIENT_ID_BYTES_MAX).collect(),
                reason: reason.to_owned(),
            })
        };
        if m.client_id.is_empty() {
            return bad_id("empty");
        }
        if m.client_id.len() > CLIENT_ID_BYTES_MAX {
            return bad_id(&format!("longer than {CLIENT_ID_BYTES_MAX} bytes"));
        }
        if m.subscriptions.len() > SUBSCRIPTIONS_PER_MEMBER_MAX {
            return Err(GroupError::TooManySubscriptions {
                count: m.subscriptions.len(),
                max: SUBSCRIPTIONS_PER_MEMBER_MAX,
            });
        }
        for s in &m.subscriptions {
            if s.topic.is_empty() {
                return Err(GroupError::InvalidSubscription {
                    topic: String::new(),
                    reason: "empty topic".to_owned(),
                });
            }
            if let Err(reason) = s.check() {
                return Err(GroupError::InvalidSubscription {
                    topic: s.topic.clone(),
                    reason,
                });
            }
        }
        let bad_strategy = |reason: String| {
            Err(GroupError::InvalidStrategy {
                strategy: m.strategy.name().to_owned(),
                reason,
            })
        };
        match &m.strategy {
            Strategy::ConsistentHash { virtual_nodes }
                if !(1..=VIRTUAL_NODES_MAX).contains(virtual_nodes) =>
            {
                return bad_strategy(format!(
                    "{virtual_nodes} virtual nodes; 1..={VIRTUAL_NODES_MAX} are allowed"
                ));
            }
            Strategy::ByConfig(config) => {
                let named: usize = config.values().map(Vec::len).sum();
                if config.len() > MEMBERS_PER_GROUP_MAX || named > CONFIG_QUEUES_MAX {
                    return bad_strategy(format!(
                        "{} clients and {named} queues named; at most {MEMBERS_PER_GROUP_MAX} \
                         and {CONFIG_QUEUES_MAX} are allowed",
                        config.len()
                    ));
                }
            }
            _ => {}
        }
        // Two live connections claiming one id would be merged into one member (and get
        // one queue's lock both): the second is refused until the first is gone.
        if let Some(member) = self.members.get(&m.client_id) {
            if member.info.connection != m.connection {
                return Err(GroupError::ClientIdInUse {
                    group: self.group.clone(),
                    client_id: m.client_id.clone(),
                });
            }
        }
        if !self.members.contains_key(&m.client_id) && self.members.len() >= MEMBERS_PER_GROUP_MAX {
            return Err(GroupError::GroupFull {
                group: self.group.clone(),
                max: MEMBERS_PER_GROUP_MAX,
            });
        }
        Ok(())
    }

    /// A heartbeat: joins or refreshes a member (check it with [`Self::check_heartbeat`]
    /// first). Returns true, and bumps the generation, if the assignment may change: the
    /// member joined, its subscriptions changed, or the group's strategy or message model
    /// changed (see the module doc). A new connection id or consume mode is recorded
    /// without a bump. Subscriptions are kept sorted by topic, one per topic (the last
    /// one given wins), so their order in the heartbeat does not matter.
    pub fn heartbeat(&mut self, mut m: MemberInfo, now_ms: u64) -> bool {
        m.normalize();
        // Compared by reference before anything moves: a by-config strategy can be large.
        let declares = match self.members.get(&m.client_id) {
            Some(old) => old.info.strategy != m.strategy || old.info.model != m.model,
            None => true,
        };
        let settings_changed =
            declares && (self.strategy() != &m.strategy || self.model() != m.model);
        if declares {
            self.declarations += 1;
        }
        self.held_bytes += m.held_bytes();
        let changed = match self.members.get_mut(&m.client_id) {
            Some(member) => {
                self.held_bytes -= member.info.held_bytes();
                let subscriptions_changed = member.info.subscriptions != m.subscriptions;
                if declares {
                    member.declared = self.declarations;
                }
                member.last_heartbeat_ms = member.last_heartbeat_ms.max(now_ms);
                member.info = m;
                subscriptions_changed
            }
            None => {
                let member = Member {
                    info: m,
                    last_heartbeat_ms: now_ms,
                    declared: self.declarations,
                };
                self.members.insert(member.info.client_id.clone(), member);
                true
            }
        };
        let changed = changed || settings_changed;
        if changed {
            self.bump();
        }
        changed
    }

    /// Member `client_id` leaves, if it is the one on `connection`: an id is one member
    /// per live connection (`ClientIdInUse`), and an unregister from another connection
    /// (a process that was expired and replaced by one with the same id, shutting down
    /// late) took the live member away, its queue locks with it, while it went on
    /// consuming; that unregister is refused (`MemberOnOtherConnection`), not answered as
    /// done, so a client whose old connection the broker still sees does not think it
    /// left. Returns whether it left (false: no such member).
    pub fn unregister(&mut self, client_id: &str, connection: u64) -> Result<bool, GroupError> {
        match self.members.get(client_id) {
            None => return Ok(false),
            Some(m) if m.info.connection != connection => {
                return Err(GroupError::MemberOnOtherConnection {
                    group: self.group.clone(),
                    client_id: client_id.to_owned(),
                })
            }
            Some(_) => {}
        }
        let left = self.remove(client_id);
        if left {
            self.bump();
        }
        Ok(left)
    }

    /// A connection closed: the members on it leave. Returns them, sorted.
    pub fn connection_closed(&mut self, connection: u64) -> Vec<String> {
        self.remove_where(|m| m.info.connection == connection)
    }

    /// Members whose last heartbeat is more than the session timeout before `now_ms`
    /// leave. Returns them, sorted.
    pub fn expire(&mut self, now_ms: u64) -> Vec<String> {
        let timeout_ms = self.session_timeout_ms;
        self.remove_where(|m| now_ms.saturating_sub(m.last_heartbeat_ms) > timeout_ms)
    }

    /// The first time at which [`Self::expire`] would remove someone, if nobody heartbeats.
    pub fn next_expiry_ms(&self) -> Option<u64> {
        self.members
            .values()
            .map(|m| {
                m.last_heartbeat_ms
                    .saturating_add(self.session_timeout_ms)
                    .saturating_add(1)
            })
            .min()
    }

    /// Client ids, sorted.
    pub fn members(&self) -> Vec<String> {
        self.members.keys().cloned().collect()
    }

    /// A member's last heartbeat, with subscriptions sorted by topic and one per topic.
    pub fn member(&self, client_id: &str) -> Option<&MemberInfo> {
        self.members.get(client_id).map(|m| &m.info)
    }

    pub fn last_heartbeat_ms(&self, client_id: &str) -> Option<u64> {
        self.members.get(client_id).map(|m| m.last_heartbeat_ms)
    }

    pub fn len(&self) -> usize {
        self.members.len()
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// [`MemberInfo::held_bytes`] of all members: what the group counts against its
    /// coordinator's `--group-members-mb`.
    pub fn held_bytes(&self) -> usize {
        self.held_bytes
    }

    /// Where member `client_id` subscribes to a topic with another expression than another
    /// member does: one line per topic, naming both. In clustering, each queue is filtered
    /// by its owner's expression, so a message only the other expression matches is skipped
    /// on the queues this member owns (RocketMQ's rule: a group's members subscribe alike).
    /// Broadcasting members each take every queue: nothing to say.
    pub fn differing_subscriptions(&self, client_id: &str) -> Vec<String> {
        let Some(me) = self.members.get(client_id) else {
            return Vec::new();
        };
        if self.model() == MessageModel::Broadcasting {
            return Vec::new();
        }
        let mut lines = Vec::new();
        for mine in &me.info.subscriptions {
            let other = self.members.values().find_map(|m| {
                let theirs = m
                    .info
                    .subscriptions
                    .iter()
                    .find(|s| s.topic == mine.topic)?;
                (m.info.client_id != client_id
                    && (theirs.expression != mine.expression || theirs.sql != mine.sql))
                    .then_some((&m.info.client_id, theirs))
            });
            if let Some((id, theirs)) = other {
                lines.push(format!(
                    "topic {}: {:?} by {client_id}, {:?} by {id}",
                    mine.topic, mine.expression, theirs.expression
                ));
            }
        }
        lines
    }

    /// The topics subscribed by any member.
    /// The topics members subscribe to, borrowed (each once).
    pub fn topic_names(&self) -> BTreeSet<&str> {
        (self.members.values())
            .flat_map(|m| m.info.subscriptions.iter().map(|s| s.topic.as_str()))
            .collect()
    }

    /// [`topic_names`](Self::topic_names), owned: what the tests compare assignments with.
    #[cfg(test)]
    pub fn topics(&self) -> BTreeSet<String> {
        self.members
            .values()
            .flat_map(|m| m.info.subscriptions.iter().map(|s| s.topic.clone()))
            .collect()
    }

    /// Whether a member subscribes to `topic` (a lookup per member, nothing copied).
    pub fn subscribed(&self, topic: &str) -> bool {
        (self.members.values()).any(|m| subscribes(&m.info, topic))
    }

    /// Whether a member consumes `topic` with offsets kept by the broker (clustering).
    pub fn consumes(&self, topic: &str) -> bool {
        (self.members.values())
            .any(|m| m.info.model == MessageModel::Clustering && subscribes(&m.info, topic))
    }

    /// The members subscribed to `topic`, sorted: the tests' reference for the one pass
    /// [`assign`](Self::assign) makes.
    #[cfg(test)]
    pub fn subscribers(&self, topic: &str) -> Vec<String> {
        self.members
            .values()
            .filter(|m| subscribes(&m.info, topic))
            .map(|m| m.info.client_id.clone())
            .collect()
    }

    /// The group's allocation strategy: that of the most recent declarer (module doc);
    /// averagely while the group is empty.
    pub fn strategy(&self) -> &Strategy {
        self.declarer()
            .map_or(&STRATEGY_WITHOUT_MEMBERS, |m| &m.info.strategy)
    }

    /// The group's message model, chosen like [`Self::strategy`].
    pub fn model(&self) -> MessageModel {
        self.declarer()
            .map_or(MessageModel::default(), |m| m.info.model)
    }

    /// The assignment: topic -> member -> queues (ascending), for every subscribed topic and
    /// every member subscribed to it. Only subscribers of a topic get its queues; in
    /// clustering each queue goes to exactly one of them, in broadcasting every subscriber
    /// gets every queue. A topic missing from `queue_counts` has no queues (its
    /// subscribers get empty lists); counts are capped at `QUEUES_PER_TOPIC_MAX`.
    pub fn assign(
        &self,
        queue_counts: &BTreeMap<String, u32>,
    ) -> BTreeMap<String, BTreeMap<String, Vec<u32>>> {
        let strategy = self.strategy();
        let model = self.model();
        // Each topic's subscribers in one pass over the members, in the order
        // [`subscribers`](Self::subscribers) gives them: not a pass over every member for
        // each topic (1,024 members of 256 subscriptions each would make that hundreds of
        // millions of lookups on the coordinator's thread).
        let mut by_topic: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        for m in self.members.values() {
            for s in &m.info.subscriptions {
                (by_topic.entry(s.topic.as_str()).or_default()).push(m.info.client_id.clone());
            }
        }
        by_topic
            .into_iter()
            .map(|(topic, subscribers)| {
                let count = queue_counts.get(topic).copied().unwrap_or(0);
                debug_assert!(count <= QUEUES_PER_TOPIC_MAX, "{topic}: {count} queues");
                let queues: Vec<u32> = (0..count.min(QUEUES_PER_TOPIC_MAX)).collect();
                let topic = topic.to_owned();
                let assignment = match model {
                    MessageModel::Clustering => allocate(strategy, &queues, &subscribers),
                    MessageModel::Broadcasting => subscribers
                        .into_iter()
                        .map(|m| (m, queues.clone()))
                        .collect(),
                };
                (topic, assignment)
            })
            .collect()
    }

    /// Changes whenever the assignment may change, never goes back, so a member can tell a
    /// stale assignment from the current one.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Bumps the generation: for changes the group cannot see itself, such as a topic's
    /// queue count.
    pub fn bump(&mut self) {
        self.generation = self.generation.saturating_add(1);
    }

    fn declarer(&self) -> Option<&Member> {
        self.members.values().max_by_key(|m| m.declared)
    }

    fn remove(&mut self, client_id: &str) -> bool {
        match self.members.remove(client_id) {
            Some(m) => {
                self.held_bytes -= m.info.held_bytes();
                true
            }
            None => false,
        }
    }

    fn remove_where(&mut self, leaves: impl Fn(&Member) -> bool) -> Vec<String> {
        let gone: Vec<String> = self
            .members
            .values()
            .filter(|m| leaves(m))
            .map(|m| m.info.client_id.clone())
            .collect();
        for id in &gone {
            self.remove(id);
        }
        if !gone.is_empty() {
            self.bump();
        }
        gone
    }
}

fn subscribes(m: &MemberInfo, topic: &str) -> bool {
    m.subscriptions
        .binary_search_by(|s| s.topic.as_str().cmp(topic))
        .is_ok()
}

/// Sorted by topic, one per topic: the last one given for a topic wins.
fn normalize(subscriptions: Vec<Subscription>) -> Vec<Subscription> {
    let by_topic: BTreeMap<String, (String, bool)> = subscriptions
        .into_iter()
        .map(|s| (s.topic, (s.expression, s.sql)))
        .collect();
    by_topic
        .into_iter()
        .map(|(topic, (expression, sql))| Subscription {
            topic,
            expression,
            sql,
        })
        .collect()
}

/// The shard that coordinates a group: part of routing, so it lives with `owner`.
pub use crate::protocol::route::coordinator_shard;

#[cfg(test)]
mod tests {
    use super::*;

    const TIMEOUT: u64 = 1_000;

    fn member(id: &str, topics: &[&str]) -> MemberInfo {
        MemberInfo {
            client_id: id.to_owned(),
            subscriptions: topics
                .iter()
                .map(|t| Subscription {
                    topic: t.to_string(),
                    expression: "*".to_owned(),
                    sql: false,
                })
                .collect(),
            mode: ConsumeMode::Concurrent,
            model: MessageModel::Clustering,
            strategy: Strategy::Averagely,
            connection: 1,
        }
    }

    fn on(mut m: MemberInfo, connection: u64) -> MemberInfo {
        m.connection = connection;
        m
    }

    fn join(g: &mut GroupState, m: MemberInfo, now_ms: u64) -> bool {
        assert_eq!(g.check_heartbeat(&m), Ok(()));
        g.heartbeat(m, now_ms)
    }

    fn counts(c: &[(&str, u32)]) -> BTreeMap<String, u32> {
        c.iter().map(|(t, n)| (t.to_string(), *n)).collect()
    }

    /// Asserts each topic's queues are assigned exactly once (clustering) across its
    /// subscribers, and that non-subscribers get nothing.
    fn check_assignment(g: &GroupState, queue_counts: &BTreeMap<String, u32>) {
        let a = g.assign(queue_counts);
        assert_eq!(a.keys().cloned().collect::<BTreeSet<_>>(), g.topics());
        for (topic, by_member) in &a {
            let subscribers: Vec<String> = by_member.keys().cloned().collect();
            assert_eq!(subscribers, g.subscribers(topic));
            let mut all: Vec<u32> = by_member.values().flatten().copied().collect();
            all.sort_unstable();
            let expected: Vec<u32> = (0..queue_counts.get(topic).copied().unwrap_or(0)).collect();
            assert_eq!(all, expected, "{topic}: {by_member:?}");
        }
    }

    #[test]
    fn members_subscribing_alike_or_not_are_told_apart() {
        let mut g = GroupState::new("g".into(), TIMEOUT);
        join(&mut g, member("a", &["t", "u"]), 0);
        join(&mut g, member("b", &["t"]), 0);
        assert!(
            g.differing_subscriptions("a").is_empty(),
            "both take all of t"
        );
        let mut narrower = member("c", &["t", "v"]);
        narrower.subscriptions[0].expression = "TagA".into();
        join(&mut g, narrower, 0);
        let said = g.differing_subscriptions("c");
        assert_eq!(said.len(), 1, "{said:?}");
        assert!(
            said[0].starts_with("topic t: \"TagA\" by c, \"*\" by "),
            "{said:?}"
        );
        assert_eq!(g.differing_subscriptions("a").len(), 1, "seen from a too");
        assert!(g.differing_subscriptions("nobody").is_empty());
        // An SQL filter is another filter than tags.
        let mut sql = member("d", &["u"]);
        sql.subscriptions[0].sql = true;
        sql.subscriptions[0].expression = "TRUE".into();
        join(&mut g, sql, 0);
        assert_eq!(g.differing_subscriptions("d").len(), 1);
    }

    #[test]
    fn join_refresh_and_leave() {
        let mut g = GroupState::new("g".into(), TIMEOUT);
        assert_eq!(g.generation(), 0);
        assert!(join(&mut g, on(member("b", &["t"]), 2), 0));
        assert!(join(&mut g, member("a", &["t"]), 0));
        let gen = g.generation();
        assert_eq!(g.members(), vec!["a", "b"]);
        // A plain refresh changes nothing.
        assert!(!join(&mut g, member("a", &["t"]), 10));
        assert_eq!(g.generation(), gen);
        assert_eq!(g.last_heartbeat_ms("a"), Some(10));
        // Subscription order and duplicates do not count as a change.
        assert!(!join(&mut g, member("a", &["t", "t"]), 10));
        // A new mode is recorded without a change.
        let mut orderly = member("a", &["t"]);
        orderly.mode = ConsumeMode::Orderly;
        assert!(!join(&mut g, orderly, 10));
        assert_eq!(
            g.member("a").map(|m| (m.connection, m.mode)),
            Some((1, ConsumeMode::Orderly))
        );
        assert_eq!(g.generation(), gen);
        // Another live connection with the same id is refused (two members would merge).
        let twin = on(member("a", &["t"]), 9);
        assert_eq!(
            g.check_heartbeat(&twin),
            Err(GroupError::ClientIdInUse {
                group: "g".into(),
                client_id: "a".into()
            })
        );
        // Once the first connection closes, the id is free again.
        assert_eq!(g.connection_closed(1), vec!["a".to_owned()]);
        assert!(join(&mut g, twin, 10));
        assert_eq!(g.member("a").map(|m| m.connection), Some(9));
        let gen = g.generation();
        // New subscriptions are a change.
        assert!(join(&mut g, on(member("a", &["u", "t"]), 9), 20));
        assert!(g.generation() > gen);
        assert_eq!(
            g.topics(),
            ["t", "u"].iter().map(|s| s.to_string()).collect()
        );
        let gen = g.generation();
        // Only from the member's own connection: one with the same id elsewhere (a process
        // it replaced, shutting down late) does not take it away.
        assert!(matches!(
            g.unregister("a", 1),
            Err(GroupError::MemberOnOtherConnection { .. })
        ));
        assert_eq!(g.member("a").map(|m| m.connection), Some(9));
        assert_eq!(g.generation(), gen);
        assert_eq!(g.unregister("a", 9), Ok(true));
        assert_eq!(g.unregister("a", 9), Ok(false));
        assert!(g.generation() > gen);
        assert_eq!(g.members(), vec!["b"]);
        assert!(g.member("a").is_none());
    }

    #[test]
    fn expiry_after_session_timeout() {
        let mut g = GroupState::new("g".into(), TIMEOUT);
        join(&mut g, member("a", &["t"]), 0);
        join(&mut g, member("b", &["t"]), 500);
        assert_eq!(g.next_expiry_ms(), Some(TIMEOUT + 1));
        assert!(g.expire(TIMEOUT).is_empty());
        let gen = g.generation();
        assert_eq!(g.expire(TIMEOUT + 1), vec!["a"]);
        assert!(g.generation() > gen);
        // A heartbeat keeps b alive; a clock going back never shortens its session.
        join(&mut g, member("b", &["t"]), 1_400);
        join(&mut g, member("b", &["t"]), 100);
        assert!(g.expire(2_400).is_empty());
        assert_eq!(g.expire(2_401), vec!["b"]);
        assert!(g.is_empty() && g.next_expiry_ms().is_none());
    }

    #[test]
    fn connection_close_removes_its_members() {
        let mut g = GroupState::new("g".into(), TIMEOUT);
        join(&mut g, on(member("a", &["t"]), 1), 0);
        join(&mut g, on(member("b", &["t"]), 2), 0);
        join(&mut g, on(member("c", &["t"]), 1), 0);
        let gen = g.generation();
        assert!(g.connection_closed(3).is_empty());
        assert_eq!(g.generation(), gen);
        assert_eq!(g.connection_closed(1), vec!["a", "c"]);
        assert_eq!(g.members(), vec!["b"]);
        assert!(g.generation() > gen);
    }

    #[test]
    fn assignment_covers_each_topic_among_its_subscribers() {
        let mut g = GroupState::new("g".into(), TIMEOUT);
        join(&mut g, member("a", &["t", "u"]), 0);
        join(&mut g, member("b", &["t"]), 0);
        join(&mut g, member("c", &["u", "v"]), 0);
        let qc = counts(&[("t", 8), ("u", 3), ("v", 1)]);
        check_assignment(&g, &qc);
        let a = g.assign(&qc);
        assert_eq!(a["t"]["a"], vec![0, 1, 2, 3]);
        assert_eq!(a["t"]["b"], vec![4, 5, 6, 7]);
        assert_eq!(a["v"].keys().collect::<Vec<_>>(), vec!["c"]);
        // A topic with no known queue count gives its subscribers nothing.
        let a = g.assign(&counts(&[("t", 8)]));
        assert_eq!(a["u"]["c"], Vec::<u32>::new());
        check_assignment(&g, &counts(&[("t", 8)]));
    }

    #[test]
    fn broadcasting_gives_everyone_every_queue() {
        let mut g = GroupState::new("g".into(), TIMEOUT);
        let mut a = member("a", &["t"]);
        a.model = MessageModel::Broadcasting;
        join(&mut g, a.clone(), 0);
        a.client_id = "b".into();
        join(&mut g, a, 0);
        join(&mut g, member("c", &["u"]), 0);
        // c declared last, with clustering.
        assert_eq!(g.model(), MessageModel::Clustering);
        let mut c = member("c", &["u"]);
        c.model = MessageModel::Broadcasting;
        assert!(join(&mut g, c, 1));
        assert_eq!(g.model(), MessageModel::Broadcasting);
        let assignment = g.assign(&counts(&[("t", 3), ("u", 2)]));
        assert_eq!(assignment["t"]["a"], vec![0, 1, 2]);
        assert_eq!(assignment["t"]["b"], vec![0, 1, 2]);
        assert_eq!(assignment["u"]["c"], vec![0, 1]);
        assert!(!assignment["u"].contains_key("a"));
    }

    #[test]
    fn strategy_is_the_latest_declared_and_does_not_flap() {
        let mut g = GroupState::new("g".into(), TIMEOUT);
        assert_eq!(g.strategy(), &Strategy::Averagely);
        let mut a = member("a", &["t"]);
        a.strategy = Strategy::AveragelyByCircle;
        join(&mut g, a.clone(), 0);
        join(&mut g, member("b", &["t"]), 0);
        assert_eq!(g.strategy(), &Strategy::Averagely);
        let gen = g.generation();
        // Refreshes of members that disagree change nothing.
        assert!(!join(&mut g, a.clone(), 1));
        assert!(!join(&mut g, member("b", &["t"]), 1));
        assert_eq!((g.strategy(), g.generation()), (&Strategy::Averagely, gen));
        // b leaves: a's declaration applies again.
        g.unregister("b", 1).unwrap();
        assert_eq!(g.strategy(), &Strategy::AveragelyByCircle);
        // a changes its strategy: a change.
        a.strategy = Strategy::ConsistentHash { virtual_nodes: 8 };
        let gen = g.generation();
        assert!(join(&mut g, a, 2));
        assert!(g.generation() > gen);
        assert_eq!(g.strategy(), &Strategy::ConsistentHash { virtual_nodes: 8 });
        check_assignment(&g, &counts(&[("t", 16)]));
    }

    #[test]
    fn bump_and_checks() {
        let mut g = GroupState::new("g".into(), TIMEOUT);
        g.bump();
        assert_eq!(g.generation(), 1);
        let ok = member("a", &["t"]);
        assert_eq!(g.check_heartbeat(&ok), Ok(()));
        let mut bad = ok.clone();
        bad.client_id.clear();
        assert!(matches!(
            g.check_heartbeat(&bad),
            Err(GroupError::InvalidClientId { .. })
        ));
        let mut bad = ok.clone();
        bad.subscriptions[0].expression = "A ||".into();
        let e = g.check_heartbeat(&bad).unwrap_err();
        assert!(e.to_string().contains("\"t\""), "{e}");
        let mut bad = ok.clone();
        bad.strategy = Strategy::ConsistentHash { virtual_nodes: 0 };
        assert!(matches!(
            g.check_heartbeat(&bad),
            Err(GroupError::InvalidStrategy { .. })
        ));
        let mut bad = ok.clone();
        bad.subscriptions = (0..=SUBSCRIPTIONS_PER_MEMBER_MAX)
            .map(|i| Subscription {
                topic: format!("t{i}"),
                expression: "*".into(),
                sql: false,
            })
            .collect();
        assert!(matches!(
            g.check_heartbeat(&bad),
            Err(GroupError::TooManySubscriptions { .. })
        ));
        for i in 0..MEMBERS_PER_GROUP_MAX {
            g.heartbeat(member(&format!("m{i}"), &["t"]), 0);
        }
        assert!(matches!(
            g.check_heartbeat(&ok),
            Err(GroupError::GroupFull { .. })
        ));
        assert_eq!(g.check_heartbeat(&member("m0", &["t"])), Ok(()));
    }

    /// The bytes a group counts against `--group-members-mb` follow its members: a join
    /// adds, a changed heartbeat replaces, and every way of leaving takes its share back.
    #[test]
    fn a_groups_held_bytes_follow_its_members() {
        let mut g = GroupState::new("g".into(), TIMEOUT);
        assert_eq!(g.held_bytes(), 0);
        let small = member("a", &["t"]);
        let mut large = member("a", &["t", "u", "v"]);
        large.subscriptions[0].expression = "x".repeat(4000);
        large.strategy = Strategy::ByConfig([("a".to_owned(), (0..1000).collect())].into());
        assert!(large.held_bytes() > small.held_bytes() + 4000 + 4000);
        join(&mut g, small.clone(), 0);
        assert_eq!(g.held_bytes(), small.held_bytes());
        join(&mut g, large.clone(), 1);
        assert_eq!(g.held_bytes(), large.held_bytes(), "replaced, not added");
        // The same topic twice counts once, as it is kept once.
        let mut twice = member("b", &["t", "t"]);
        twice.connection = 2;
        join(&mut g, twice, 1);
        let b = member("b", &["t"]).held_bytes();
        assert_eq!(g.held_bytes(), large.held_bytes() + b);
        assert_eq!(g.unregister("a", 1), Ok(true));
        assert_eq!(g.held_bytes(), b);
        join(&mut g, member("c", &["t"]), 1);
        assert_eq!(g.connection_closed(2), vec!["b".to_owned()]);
        assert_eq!(g.held_bytes(), member("c", &["t"]).held_bytes());
        assert_eq!(g.expire(1 + TIMEOUT + 1), vec!["c".to_owned()]);
        assert_eq!(g.held_bytes(), 0);
    }

    #[test]
    fn coordinator_shard_is_stable_and_in_range() {
        assert_eq!(coordinator_shard("g", 1), 0);
        // FNV-1a 64 of "a" is 0xaf63dc4c8601ec8c.
        assert_eq!(
            coordinator_shard("a", 7),
            (0xaf63_dc4c_8601_ec8c_u64 % 7) as u32
        );
        for shards in 1..=8 {
            for i in 0..100 {
                let g = format!("group-{i}");
                assert!(coordinator_shard(&g, shards) < shards);
                assert_eq!(coordinator_shard(&g, shards), coordinator_shard(&g, shards));
            }
        }
    }
}
