//! The session's routes and connections: which connection a request takes (bootstrap or
//! a shard's, by the topology the handshakes tell), opening it with its handshake and
//! backoff, and checking what each handshake says.

use super::*;

impl Inner {
    /// The broker's id and shard count ((0, 1) before the first handshake), read in place:
    /// no count taken on the shared topology (once per coalesced send, once per pull).
    pub(super) fn ids(&self) -> (u32, u32) {
        self.topology
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map_or((0, 1), |t| (t.info.broker_id, t.info.shard_count))
    }

    pub(super) fn topology(&self) -> Option<Arc<Topology>> {
        self.topology
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The connection `route` leads to, opened (or reopened) as needed. Before a shard's
    /// connection is opened again, the bootstrap connection is made live: a broker that
    /// stopped broke it too, and the new handshake tells where queues are now (a broker
    /// started in its place may have other shards; `Route::Queue` is routed again with it).
    pub(super) async fn route(
        &self,
        route: Route<'_>,
        deadline: Instant,
    ) -> Result<Arc<Connection>> {
        let mut bootstrap_checked = false;
        loop {
            let topology = match self.topology() {
                Some(t) => t,
                None => {
                    self.connection(&self.bootstrap, None, deadline).await?;
                    self.topology().ok_or_else(|| {
                        ClientError::Connection(format!("no handshake with {}", self.config.broker))
                    })?
                }
            };
            let shard = match route {
                Route::Bootstrap => None,
                Route::Queue { topic, queue_id } => {
                    Some(owner(topic, queue_id, topology.info.shard_count))
                }
                Route::Shard(shard) => Some(shard),
            };
            let Some((shard, slot)) =
                shard.and_then(|s| Some((s, topology.shards.get(s as usize)?)))
            else {
                return self.connection(&self.bootstrap, None, deadline).await;
            };
            if let Some(c) = slot.live() {
                return Ok(c);
            }
            if !bootstrap_checked {
                bootstrap_checked = true;
                self.connection(&self.bootstrap, None, deadline).await?;
                if !self.topology().is_some_and(|t| Arc::ptr_eq(&t, &topology)) {
                    continue;
                }
            }
            let expected = Expected {
                info: &topology.info,
                shard,
            };
            return self.connection(slot, Some(expected), deadline).await;
        }
    }

    /// The live connection of `slot`, or a new one (connect and handshake). `shard` is
    /// `None` for the bootstrap slot, whose handshake sets the topology; a shard's
    /// handshake must match what the topology expects of it.
    pub(super) async fn connection(
        &self,
        slot: &Slot,
        shard: Option<Expected<'_>>,
        deadline: Instant,
    ) -> Result<Arc<Connection>> {
        let bootstrap = shard.is_none();
        if let Some(c) = slot.live() {
            return Ok(c);
        }
        let mut backoff = match timeout_at(deadline, slot.connecting.lock()).await {
            Ok(guard) => guard,
            Err(_) => {
                return Err(ClientError::Connection(format!(
                    "connecting to {} takes longer than the request may wait",
                    slot.addr
                )))
            }
        };
        // Another request may have connected while this one waited for the lock.
        if let Some(c) = slot.live() {
            return Ok(c);
        }
        if let Some(at) = backoff.next_attempt {
            if at > deadline {
                let last = backoff
                    .last_error
                    .as_ref()
                    .map(|e| e.to_string())
                    .unwrap_or_default();
                return Err(ClientError::Connection(format!(
                    "{} is unreachable ({last}); next attempt in {} ms",
                    slot.addr,
                    at.saturating_duration_since(Instant::now()).as_millis()
                )));
            }
            sleep_until(at).await;
        }
        let attempt_deadline = deadline.min(Instant::now() + self.config.connect_timeout());
        match self.open(&slot.addr, attempt_deadline).await {
            Ok((connection, ok)) => {
                match shard {
                    None => {
                        self.set_topology(&ok.ok, &ok.limits, connection.peer_addr());
                    }
                    Some(expected) if !expected.matches(&ok.ok) => {
                        // Another broker answers there (its handshake is as good as the
                        // bootstrap's): route with what it says, and send again.
                        let changed = self.set_topology(&ok.ok, &ok.limits, connection.peer_addr());
                        let said = format!(
                            "{} answered as shard {} of {} of broker {}, not shard {} of {} of broker {}",
                            slot.addr,
                            ok.ok.shard_id,
                            ok.ok.shard_count,
                            ok.ok.broker_id,
                            expected.shard,
                            expected.info.shard_count,
                            expected.info.broker_id
                        );
                        if changed {
                            return Err(ClientError::Connection(format!(
                                "{said}: the broker changed; routes are refreshed"
                            )));
                        }
                        // The same broker says the same addresses: they lead to another
                        // shard (a port mapping, a proxy). A failed attempt, backed off:
                        // it reconnected at once for every request.
                        let e = ClientError::Connection(format!(
                            "{said}, while the broker's shard addresses are unchanged: its advertised address for shard {} leads to another shard (a port mapping or proxy in between?)",
                            expected.shard
                        ));
                        backoff.failed(&e, &self.config);
                        return Err(e);
                    }
                    Some(_) => {}
                }
                *backoff = Backoff::default();
                let connection = Arc::new(connection);
                let mut live = slot.live.lock().unwrap_or_else(PoisonError::into_inner);
                if bootstrap {
                    // Bumped under the slot's lock, so `bootstrap_session` never pairs the
                    // new connection with the old number.
                    self.bootstrap_opens.fetch_add(1, Ordering::SeqCst);
                }
                *live = Some(connection.clone());
                Ok(connection)
            }
            Err(e) => {
                backoff.failed(&e, &self.config);
                Err(e)
            }
        }
    }

    /// Opens a connection to `addr` and performs the handshake on it: the client's frame
    /// limit goes to the broker, the broker's limits and timings come back.
    async fn open(&self, addr: &str, deadline: Instant) -> Result<(Connection, HandshakeOk2)> {
        let connection = Connection::open(addr, deadline, self.limits, self.pushes.clone()).await?;
        let request = Handshake2 {
            protocol_version: u32::from(PROTOCOL_VERSION),
            client_id: self.config.client_id.clone(),
            frame_bytes_max: self.config.frame_bytes_max,
        };
        let timeout_ms = self.config.connect_timeout_ms;
        let reply = connection.request(&request, deadline, timeout_ms).await?;
        let ok = match reply.response()? {
            Response::HandshakeOk2(ok) => ok,
            other => return Err(unexpected(Kind::HandshakeOk2, &other)),
        };
        check_handshake(&ok.ok)?;
        check_timings(&ok.limits)?;
        connection.lower_frame_limit(ok.limits.frame_bytes_max);
        Ok((connection, ok))
    }

    /// Records what a bootstrap handshake said. The shard slots (and their connections)
    /// are kept when the shard addresses did not change. Whether anything changed.
    fn set_topology(
        &self,
        ok: &HandshakeOk,
        limits: &BrokerLimits,
        bootstrap_peer: SocketAddr,
    ) -> bool {
        let info = BrokerInfo {
            broker_id: ok.broker_id,
            shard_count: ok.shard_count,
            shard_addrs: ok
                .shard_addrs
                .iter()
                .map(|a| dialable(a, bootstrap_peer))
                .collect(),
            frame_bytes_max: limits.frame_bytes_max,
            session_timeout_ms: limits.session_timeout_ms,
            lock_expiry_ms: limits.lock_expiry_ms,
        };
        let mut topology = self
            .topology
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        if topology.as_ref().is_some_and(|t| t.info == info) {
            return false;
        }
        let shards = if self.config.shard_aware {
            info.shard_addrs
                .iter()
                .map(|a| Arc::new(Slot::new(a.clone())))
                .collect()
        } else {
            Vec::new()
        };
        *topology = Some(Arc::new(Topology { info, shards }));
        true
    }
}

/// What a shard's handshake must say: the topology the client routed with.
#[derive(Clone, Copy)]
pub(super) struct Expected<'a> {
    info: &'a BrokerInfo,
    shard: u32,
}

impl Expected<'_> {
    pub(super) fn matches(&self, ok: &HandshakeOk) -> bool {
        ok.broker_id == self.info.broker_id
            && ok.shard_count == self.info.shard_count
            && ok.shard_id == self.shard
    }
}

/// Checks a handshake answer before anything is routed with it.
fn check_handshake(ok: &HandshakeOk) -> Result<()> {
    let bad = |why: String| Err(ClientError::BadHandshake(why));
    if ok.protocol_version != u32::from(PROTOCOL_VERSION) {
        return bad(format!(
            "broker speaks protocol version {}, this client {PROTOCOL_VERSION}",
            ok.protocol_version
        ));
    }
    if ok.shard_count == 0 || ok.shard_count > SHARD_COUNT_MAX {
        return bad(format!(
            "shard count {} is outside 1..={SHARD_COUNT_MAX}",
            ok.shard_count
        ));
    }
    if ok.shard_addrs.len() != ok.shard_count as usize {
        return bad(format!(
            "{} shard addresses for {} shards",
            ok.shard_addrs.len(),
            ok.shard_count
        ));
    }
    if ok.shard_id >= ok.shard_count {
        return bad(format!(
            "answering shard {} of {}",
            ok.shard_id, ok.shard_count
        ));
    }
    Ok(())
}

use crate::protocol::messages::SESSION_TIMEOUT_MS_MIN;

/// Checks the session and lock timings a handshake announces: consumers fit theirs to them
/// (`PushConsumerOptions::fitted_to`), and nonsense there (a session of 0 ms) would have
/// them heartbeat without pause and never trust an orderly lock.
fn check_timings(limits: &BrokerLimits) -> Result<()> {
    let (session, lock) = (limits.session_timeout_ms, limits.lock_expiry_ms);
    if session < SESSION_TIMEOUT_MS_MIN || lock <= session {
        return Err(ClientError::BadHandshake(format!(
            "broker announces a session timeout of {session} ms and a lock expiry of {lock} ms; a broker's session is at least {SESSION_TIMEOUT_MS_MIN} ms and its locks outlast it"
        )));
    }
    Ok(())
}

/// A shard address the client can dial: a broker listening on all interfaces announces
/// `0.0.0.0` or `[::]`, which means "the host you reached me on".
fn dialable(addr: &str, bootstrap_peer: SocketAddr) -> String {
    match addr.parse::<SocketAddr>() {
        Ok(a) if a.ip().is_unspecified() => {
            SocketAddr::new(bootstrap_peer.ip(), a.port()).to_string()
        }
        _ => addr.to_owned(),
    }
}
