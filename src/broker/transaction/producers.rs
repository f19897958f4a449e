//! The producers of each transaction producer group that checks are pushed to: registered
//! by heartbeats on the group's coordinator shard, dropped with their connection.

use std::collections::{BTreeMap, HashMap};

use std::rc::Rc;

use crate::broker::{err, ShardCtx};
use crate::protocol::{ErrorBody, ErrorCode, ProducerHeartbeat};

/// Most producers registered per producer group.
const PRODUCERS_PER_GROUP_MAX: usize = 1024;

/// Producers of each group with a live connection, kept by the group's coordinator shard:
/// connection id → client id.
#[derive(Default)]
pub struct ProducerGroups {
    groups: HashMap<String, BTreeMap<u64, String>>,
}

impl ShardCtx {
    /// On the group's coordinator: pushes a check to one live producer of the group (the
    /// `turn`-th, so that repeated checks go round the producers). False when the group
    /// has no live producer, or the check could not be queued on its connection.
    pub(in crate::broker) async fn ask_producer(
        self: &Rc<Self>,
        group: &str,
        turn: usize,
        frame: Vec<u8>,
    ) -> bool {
        let conn = {
            let producers = self.producers.borrow();
            let Some(conns) = producers.groups.get(group).filter(|c| !c.is_empty()) else {
                return false;
            };
            match conns.keys().nth(turn % conns.len()) {
                Some(&c) => c,
                None => return false,
            }
        };
        self.push_to(conn, frame).await
    }

    /// Whether `group` has a producer connected here (on its coordinator: one to check).
    pub(in crate::broker) fn has_producer(&self, group: &str) -> bool {
        (self.producers.borrow().groups.get(group)).is_some_and(|c| !c.is_empty())
    }

    /// `ProducerHeartbeat`, on the group's coordinator.
    pub(in crate::broker) fn producer_heartbeat(
        &self,
        h: ProducerHeartbeat,
        conn: u64,
    ) -> Result<crate::protocol::Empty, ErrorBody> {
        let mut producers = self.producers.borrow_mut();
        if !producers.groups.contains_key(&h.group) && producers.groups.len() >= self.cfg.groups_max
        {
            return Err(err(
                ErrorCode::LimitReached,
                format!(
                    "shard {} keeps {} producer groups, its limit (--groups-max)",
                    self.id, self.cfg.groups_max
                ),
            ));
        }
        let group = producers.groups.entry(h.group.clone()).or_default();
        if !group.contains_key(&conn) && group.len() >= PRODUCERS_PER_GROUP_MAX {
            return Err(err(
                ErrorCode::LimitReached,
                format!(
                    "producer group {} has {PRODUCERS_PER_GROUP_MAX} producers",
                    h.group
                ),
            ));
        }
        group.insert(conn, h.client_id);
        Ok(crate::protocol::Empty {})
    }

    /// A connection carrying producers of `group` closed (on the coordinator).
    pub(in crate::broker) fn producer_connection_closed(&self, group: &str, conn: u64) {
        let mut producers = self.producers.borrow_mut();
        if let Some(g) = producers.groups.get_mut(group) {
            g.remove(&conn);
            if g.is_empty() {
                producers.groups.remove(group);
            }
        }
    }
}
