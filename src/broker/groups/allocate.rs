//! Queue allocation strategies: how the queues of one topic are divided among the live
//! members of a consumer group.
//!
//! Every strategy is a pure function of the *sets* of queues and members: both are sorted
//! and deduplicated first, so the answer never depends on the order they were given in, and
//! every broker computing it gets the same answer.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use crate::protocol::route::fnv1a_64;

/// Virtual nodes per member on the consistent-hash ring when none are named.
pub const VIRTUAL_NODES_DEFAULT: u32 = 128;
/// Most virtual nodes per member: the ring is rebuilt on every allocation and holds
/// `members × virtual_nodes` entries, so this bounds its size and cost.
pub const VIRTUAL_NODES_MAX: u32 = 256;
const _: () = assert!(VIRTUAL_NODES_DEFAULT >= 1 && VIRTUAL_NODES_DEFAULT <= VIRTUAL_NODES_MAX);

/// How a group divides a topic's queues among its members.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Strategy {
    /// RocketMQ `AllocateMessageQueueAveragely`: contiguous blocks in member order; the
    /// first `queues % members` members get one queue more.
    #[default]
    Averagely,
    /// RocketMQ `AllocateMessageQueueAveragelyByCircle`: queue `i` (in sorted order) goes to
    /// member `i % members`.
    AveragelyByCircle,
    /// A hash ring with `virtual_nodes` points per member (clamped to
    /// `1..=VIRTUAL_NODES_MAX`); a queue goes to the first point at or after its own hash.
    /// A joining member takes only the queues that now fall before its points, about
    /// `1/(N+1)` of them, and only from others; nothing else moves.
    ConsistentHash { virtual_nodes: u32 },
    /// Queues named per client id. Queues named for no live member are spread averagely
    /// over all members; a queue named for several live members goes to the first of them
    /// in sorted order; names of absent clients and unknown queues are ignored.
    ByConfig(BTreeMap<String, Vec<u32>>),
}

impl Strategy {
    /// The short name, as accepted by [`FromStr`] (`"averagely"`, `"circle"`,
    /// `"consistent-hash"`, `"config"`).
    pub fn name(&self) -> &'static str {
        match self {
            Strategy::Averagely => "averagely",
            Strategy::AveragelyByCircle => "circle",
            Strategy::ConsistentHash { .. } => "consistent-hash",
            Strategy::ByConfig(_) => "config",
        }
    }
}

impl fmt::Display for Strategy {
    /// The name; a consistent hash with a non-default node count is `consistent-hash:N`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Strategy::ConsistentHash { virtual_nodes }
                if *virtual_nodes != VIRTUAL_NODES_DEFAULT =>
            {
                write!(f, "consistent-hash:{virtual_nodes}")
            }
            other => f.write_str(other.name()),
        }
    }
}

impl FromStr for Strategy {
    type Err = String;

    /// Accepts the short names (case-insensitive, spaces trimmed), `consistent-hash:N` for
    /// `N` virtual nodes (`1..=VIRTUAL_NODES_MAX`), and the RocketMQ class names
    /// (`AllocateMessageQueueAveragely`, ...). `"config"` gives an empty configuration:
    /// the configuration itself cannot be written in a name.
    fn from_str(s: &str) -> Result<Strategy, String> {
        let name = s.trim().to_ascii_lowercase();
        let strategy = match name.as_str() {
            "averagely" | "allocatemessagequeueaveragely" => Strategy::Averagely,
            "circle" | "averagely-by-circle" | "allocatemessagequeueaveragelybycircle" => {
                Strategy::AveragelyByCircle
            }
            "consistent-hash" | "allocatemessagequeueconsistenthash" => Strategy::ConsistentHash {
                virtual_nodes: VIRTUAL_NODES_DEFAULT,
            },
            "config" | "allocatemessagequeuebyconfig" => Strategy::ByConfig(BTreeMap::new()),
            _ => {
                if let Some(count) = name.strip_prefix("consistent-hash:") {
                    let virtual_nodes = count
                        .trim()
                        .parse::<u32>()
                        .ok()
                        .filter(|n| (1..=VIRTUAL_NODES_MAX).contains(n))
                        .ok_or_else(|| {
                            format!(
                                "allocation strategy {s:?}: the virtual node count must be a \
                                 number in 1..={VIRTUAL_NODES_MAX}"
                            )
                        })?;
                    Strategy::ConsistentHash { virtual_nodes }
                } else {
                    return Err(format!(
                        "unknown allocation strategy {s:?}: expected averagely, circle, \
                         consistent-hash[:N] or config"
                    ));
                }
            }
        };
        Ok(strategy)
    }
}

/// Divides `queues` among `members`: member -> its queues (ascending). Every distinct queue
/// goes to exactly one member; every distinct member has an entry, empty if it gets
/// nothing; no members gives an empty map. The order of both slices does not matter and
/// duplicates in them are ignored.
pub fn allocate(
    strategy: &Strategy,
    queues: &[u32],
    members: &[String],
) -> BTreeMap<String, Vec<u32>> {
    let queues = sorted_unique(queues.to_vec());
    let members: Vec<&str> = sorted_unique(members.iter().map(String::as_str).collect());
    if members.is_empty() {
        return BTreeMap::new();
    }
    let mut out: Vec<Vec<u32>> = vec![Vec::new(); members.len()];
    match strategy {
        Strategy::Averagely => averagely(&queues, &mut out),
        Strategy::AveragelyByCircle => {
            for (i, &q) in queues.iter().enumerate() {
                out[i % members.len()].push(q);
            }
        }
        Strategy::ConsistentHash { virtual_nodes } => {
            consistent_hash(*virtual_nodes, &queues, &members, &mut out)
        }
        Strategy::ByConfig(config) => by_config(config, &queues, &members, &mut out),
    }
    members
        .iter()
        .zip(out)
        .map(|(m, mut qs)| {
            qs.sort_unstable();
            (m.to_string(), qs)
        })
        .collect()
}

fn sorted_unique<T: Ord>(mut v: Vec<T>) -> Vec<T> {
    v.sort_unstable();
    v.dedup();
    v
}

/// Contiguous blocks, as RocketMQ: with `q` queues and `n` members, member `i` gets
/// `q / n` queues plus one if `i < q % n`, starting where the previous block ended.
fn averagely(queues: &[u32], out: &mut [Vec<u32>]) {
    let n = out.len();
    let base = queues.len() / n;
    let extra = queues.len() % n;
    let mut start = 0;
    for (i, slot) in out.iter_mut().enumerate() {
        let len = base + usize::from(i < extra);
        slot.extend_from_slice(&queues[start..start + len]);
        start += len;
    }
    debug_assert_eq!(start, queues.len());
}

/// The ring hash: FNV-1a 64 followed by the MurmurHash3 64-bit finalizer. FNV-1a alone
/// leaves short keys that differ in one byte (`member#1`, `member#2`) close together on the
/// ring; the finalizer spreads them. Stable across versions: changing it would move queues
/// between members on upgrade.
fn ring_hash(bytes: &[u8]) -> u64 {
    let mut h = fnv1a_64(bytes);
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^= h >> 33;
    h
}

/// The ring key of virtual node `node` of `member`: `<member>#<node>`.
fn node_hash(member: &str, node: u32) -> u64 {
    ring_hash(format!("{member}#{node}").as_bytes())
}

/// The ring key of a queue: `queue#<id>`.
fn queue_hash(queue: u32) -> u64 {
    ring_hash(format!("queue#{queue}").as_bytes())
}

fn consistent_hash(virtual_nodes: u32, queues: &[u32], members: &[&str], out: &mut [Vec<u32>]) {
    let nodes_per_member = virtual_nodes.clamp(1, VIRTUAL_NODES_MAX);
    let mut ring: Vec<(u64, usize)> = Vec::with_capacity(members.len() * nodes_per_member as usize);
    for (i, m) in members.iter().enumerate() {
        for node in 0..nodes_per_member {
            ring.push((node_hash(m, node), i));
        }
    }
    // Members are sorted, so ties on a hash go to the smaller client id whatever the
    // input order was.
    ring.sort_unstable();
    for &q in queues {
        let h = queue_hash(q);
        let at = ring.partition_point(|&(node, _)| node < h);
        let (_, member) = ring[if at == ring.len() { 0 } else { at }];
        out[member].push(q);
    }
}

fn by_config(
    config: &BTreeMap<String, Vec<u32>>,
    queues: &[u32],
    members: &[&str],
    out: &mut [Vec<u32>],
) {
    let mut taken: Vec<bool> = vec![false; queues.len()];
    // Members in sorted order, so a queue named twice goes to the first of them.
    for (i, m) in members.iter().enumerate() {
        let Some(named) = config.get(*m) else {
            continue;
        };
        for q in named {
            if let Ok(at) = queues.binary_search(q) {
                if !taken[at] {
                    taken[at] = true;
                    out[i].push(*q);
                }
            }
        }
    }
    let rest: Vec<u32> = queues
        .iter()
        .zip(&taken)
        .filter(|(_, &t)| !t)
        .map(|(&q, _)| q)
        .collect();
    averagely(&rest, out);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::{any, prop_assert, prop_assert_eq, proptest};
    use std::collections::BTreeSet;

    fn ids(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    fn check(strategy: &Strategy, queues: &[u32], members: &[&str], expected: &[(&str, &[u32])]) {
        let got = allocate(strategy, queues, &ids(members));
        let expected: BTreeMap<String, Vec<u32>> = expected
            .iter()
            .map(|(m, qs)| (m.to_string(), qs.to_vec()))
            .collect();
        assert_eq!(got, expected, "{strategy} of {queues:?} over {members:?}");
    }

    /// Asserts every distinct queue is assigned exactly once and every member is present.
    fn assert_partition(a: &BTreeMap<String, Vec<u32>>, queues: &[u32], members: &[String]) {
        let members: BTreeSet<&String> = members.iter().collect();
        assert_eq!(a.keys().collect::<BTreeSet<_>>(), members);
        let mut all: Vec<u32> = a.values().flatten().copied().collect();
        all.sort_unstable();
        assert_eq!(all, sorted_unique(queues.to_vec()), "assignment {a:?}");
    }

    fn spread(a: &BTreeMap<String, Vec<u32>>) -> usize {
        let sizes = a.values().map(Vec::len);
        sizes.clone().max().unwrap_or(0) - sizes.min().unwrap_or(0)
    }

    fn all_strategies() -> Vec<Strategy> {
        let mut config = BTreeMap::new();
        config.insert("c1".to_string(), vec![0, 3, 99]);
        config.insert("c3".to_string(), vec![3, 5]);
        config.insert("gone".to_string(), vec![1]);
        vec![
            Strategy::Averagely,
            Strategy::AveragelyByCircle,
            Strategy::ConsistentHash { virtual_nodes: 16 },
            Strategy::ConsistentHash {
                virtual_nodes: VIRTUAL_NODES_DEFAULT,
            },
            Strategy::ByConfig(config),
        ]
    }

    #[test]
    fn averagely_is_rocketmq_blocks() {
        let s = Strategy::Averagely;
        check(
            &s,
            &[0, 1, 2, 3, 4, 5, 6, 7],
            &["c", "a", "b"],
            &[("a", &[0, 1, 2]), ("b", &[3, 4, 5]), ("c", &[6, 7])],
        );
        check(
            &s,
            &[0, 1],
            &["a", "b", "c"],
            &[("a", &[0]), ("b", &[1]), ("c", &[])],
        );
        check(&s, &[], &["a"], &[("a", &[])]);
        check(&s, &[0, 1], &[], &[]);
    }

    #[test]
    fn circle_is_round_robin() {
        check(
            &Strategy::AveragelyByCircle,
            &[7, 6, 5, 4, 3, 2, 1, 0],
            &["b", "a", "c"],
            &[("a", &[0, 3, 6]), ("b", &[1, 4, 7]), ("c", &[2, 5])],
        );
    }

    #[test]
    fn config_named_first_then_averagely() {
        let mut config = BTreeMap::new();
        config.insert("b".to_string(), vec![0, 1, 42]);
        config.insert("a".to_string(), vec![1]);
        config.insert("absent".to_string(), vec![2]);
        // "a" sorts first, so queue 1 named twice is a's; 42 is no queue of this topic;
        // 2, 3, 4 are spread averagely over a and b.
        check(
            &Strategy::ByConfig(config),
            &[0, 1, 2, 3, 4],
            &["b", "a"],
            &[("a", &[1, 2, 3]), ("b", &[0, 4])],
        );
    }

    #[test]
    fn duplicates_are_ignored() {
        check(
            &Strategy::Averagely,
            &[1, 1, 0],
            &["a", "a", "b"],
            &[("a", &[0]), ("b", &[1])],
        );
    }

    #[test]
    fn consistent_hash_with_zero_nodes_still_assigns() {
        let members = ids(&["a", "b"]);
        let a = allocate(
            &Strategy::ConsistentHash { virtual_nodes: 0 },
            &[0, 1, 2, 3],
            &members,
        );
        assert_partition(&a, &[0, 1, 2, 3], &members);
    }

    #[test]
    fn names_round_trip() {
        for s in all_strategies() {
            let parsed: Strategy = s.to_string().parse().unwrap();
            match s {
                Strategy::ByConfig(_) => assert_eq!(parsed, Strategy::ByConfig(BTreeMap::new())),
                s => assert_eq!(parsed, s),
            }
        }
        assert_eq!(
            " AllocateMessageQueueAveragelyByCircle ".parse::<Strategy>(),
            Ok(Strategy::AveragelyByCircle)
        );
        assert_eq!(
            "consistent-hash:10".parse::<Strategy>(),
            Ok(Strategy::ConsistentHash { virtual_nodes: 10 })
        );
        for bad in [
            "",
            "random",
            "consistent-hash:0",
            "consistent-hash:x",
            "consistent-hash:9999",
        ] {
            let e = bad.parse::<Strategy>().unwrap_err();
            assert!(e.contains("strategy"), "{bad:?}: {e}");
        }
    }

    // proptest's trait is also called Strategy; this one is proptest's.
    fn case() -> impl proptest::strategy::Strategy<Value = (Vec<u32>, Vec<String>)> {
        (
            proptest::collection::vec(0u32..64, 0..48),
            proptest::collection::vec("[a-e]{1,3}", 0..10),
        )
    }

    proptest! {
        #[test]
        fn every_queue_exactly_once_in_any_order((queues, members) in case(), seed in any::<u64>()) {
            for s in all_strategies() {
                let a = allocate(&s, &queues, &members);
                if sorted_unique(members.clone()).is_empty() {
                    prop_assert!(a.is_empty());
                    continue;
                }
                assert_partition(&a, &queues, &members);
                // Any permutation gives the same answer.
                use rand::{seq::SliceRandom, SeedableRng};
                let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
                let mut m2 = members.clone();
                let mut q2 = queues.clone();
                m2.shuffle(&mut rng);
                q2.shuffle(&mut rng);
                prop_assert_eq!(&allocate(&s, &q2, &m2), &a, "{}", s);
                if matches!(s, Strategy::Averagely | Strategy::AveragelyByCircle) {
                    prop_assert!(spread(&a) <= 1, "{} unbalanced: {:?}", s, a);
                }
            }
        }
    }

    /// Queues whose owner differs between two assignments of the same queues.
    fn moved(
        before: &BTreeMap<String, Vec<u32>>,
        after: &BTreeMap<String, Vec<u32>>,
    ) -> Vec<(u32, String, String)> {
        let owner = |a: &BTreeMap<String, Vec<u32>>| -> BTreeMap<u32, String> {
            a.iter()
                .flat_map(|(m, qs)| qs.iter().map(move |q| (*q, m.clone())))
                .collect()
        };
        let (b, a) = (owner(before), owner(after));
        b.iter()
            .filter(|(q, m)| a.get(q) != Some(m))
            .map(|(q, m)| (*q, m.clone(), a.get(q).cloned().unwrap_or_default()))
            .collect()
    }

    #[test]
    fn join_moves_few_queues_with_consistent_hash_and_keeps_blocks_with_averagely() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let hash = Strategy::ConsistentHash {
            virtual_nodes: VIRTUAL_NODES_DEFAULT,
        };
        let (mut hash_moved, mut avg_kept, mut expected_share, mut total) = (0.0, 0.0, 0.0, 0.0);
        let cases = 200;
        for _ in 0..cases {
            let n = rng.gen_range(1..=16usize);
            let queue_count = rng.gen_range(16..=256u32);
            let queues: Vec<u32> = (0..queue_count).collect();
            let members: Vec<String> = (0..n)
                .map(|_| format!("10.0.0.{}@{}", rng.gen_range(0..255), rng.gen::<u32>()))
                .collect();
            let mut joined = members.clone();
            let newcomer = format!("10.0.1.1@{}", rng.gen::<u32>());
            joined.push(newcomer.clone());
            let members_now = sorted_unique(joined.clone()).len() as f64;

            let before = allocate(&hash, &queues, &members);
            let after = allocate(&hash, &queues, &joined);
            let m = moved(&before, &after);
            // Only the newcomer takes queues; nobody else's queues move.
            assert!(m.iter().all(|(_, _, to)| *to == newcomer), "{m:?}");
            hash_moved += m.len() as f64;
            expected_share += f64::from(queue_count) / members_now;
            total += f64::from(queue_count);

            let before = allocate(&Strategy::Averagely, &queues, &members);
            let after = allocate(&Strategy::Averagely, &queues, &joined);
            avg_kept += f64::from(queue_count) - moved(&before, &after).len() as f64;
        }
        // On average the newcomer takes about its fair share 1/(N+1); allow twice that.
        assert!(
            hash_moved <= 2.0 * expected_share,
            "moved {hash_moved}, fair share {expected_share}"
        );
        // Averagely shifts block boundaries but keeps about half of the queues in place.
        assert!(avg_kept >= total / 3.0, "kept {avg_kept} of {total}");
    }
}
