//! The shard mesh's ends on a shard: messages to the other shards ([`MeshPeers`], the
//! broker's [`Peers`]) and the task that hands each one from a peer to the shard.

use std::rc::Rc;

use glommio::channels::channel_mesh::{Receivers, Senders};

use crate::broker::{LocalBoxFuture, MeshMsg, Peers, ShardCtx};

pub(super) struct MeshPeers {
    pub(super) senders: Senders<MeshMsg>,
    pub(super) peer_of_shard: Vec<usize>,
}

impl Peers for MeshPeers {
    fn send(&self, to: u32, msg: MeshMsg) -> LocalBoxFuture<'_, Result<(), String>> {
        Box::pin(async move {
            match self.peer_of_shard.get(to as usize) {
                Some(&peer) => self
                    .senders
                    .send_to(peer, msg)
                    .await
                    .map_err(|e| format!("shard {to}: {e}")),
                None => Err(format!("no shard {to}")),
            }
        })
    }
}

pub(super) fn spawn_mesh_receiver(
    ctx: Rc<ShardCtx>,
    receivers: Rc<Receivers<MeshMsg>>,
    peer: usize,
) {
    glommio::spawn_local(async move {
        while let Ok(Some(msg)) = receivers.recv_from(peer).await {
            ctx.on_mesh(msg);
        }
    })
    .detach();
}
