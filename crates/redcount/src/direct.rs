//! Runs core operations on Redis directly (RESP, through redis-rs): one server, or a Redis
//! Cluster through its seed nodes.
//!
//! On a Cluster every redcount call names keys of one hash slot, so it goes to the one master
//! that serves it. redis-rs's own retries are off there: it would send a command again after a
//! lost connection or a timed-out reply, and a write may then run twice. [`Direct`] sends a
//! command again only when Redis itself answered that it did not run it: `MOVED` (after the
//! slot map is refreshed), `ASK` (`ASKING` and the command to the node named), `TRYAGAIN` and
//! `CLUSTERDOWN` (waited out with short pauses), all within the call's time limit.
//!
//! With a [`ReplicaWait`] ([`Direct::connect_waiting`]), a call of one of redcount's money
//! scripts is acknowledged only once that many replicas have its write (`WAIT` on the same
//! connection, in the same write), else it ends [`Error::NotDurable`].

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use redcount_cluster::{
    ClusterLink, Hop, Lanes, Node, Stop, cluster_call_via, cluster_call_waited, waits_for_replicas,
};
use redcount_core::{Command, ErrorReply, Operation, Value};
use redis::ErrorKind;

pub use redcount_cluster::{ReplicaWait, WAIT_LANES};

use crate::{Error, Transport};

/// A multiplexed connection to one Redis, or to a Redis Cluster, that reconnects by itself,
/// able to run any core operation.
#[derive(Clone)]
pub struct Direct {
    conn: Conn,
    /// The longest a call may take, redirections and waits included.
    timeout: Duration,
    /// Calls that wait for replicas, and the connections of their own they run on.
    waits: Option<Arc<Waits>>,
}

/// [`Direct`]'s replica wait and its lanes.
struct Waits {
    wait: ReplicaWait,
    lanes: Lanes<Conn>,
}

#[derive(Clone)]
enum Conn {
    One(redis::aio::ConnectionManager),
    Cluster(ClusterLink),
}

impl fmt::Debug for Direct {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.conn {
            Conn::One(_) => "Direct",
            Conn::Cluster(_) => "Direct(cluster)",
        })
    }
}

impl Direct {
    /// Connects to `url` (`redis://host:port/db`); a call waits at most 5 s for its reply.
    pub async fn connect(url: &str) -> Result<Self, Error> {
        Self::connect_with(url, Duration::from_secs(5)).await
    }

    /// Connects to `url`; a call waits at most `timeout` for its reply.
    pub async fn connect_with(url: &str, timeout: Duration) -> Result<Self, Error> {
        Ok(Direct { conn: Conn::One(manager(url, timeout).await?), timeout, waits: None })
    }

    /// Connects to a Redis Cluster through `seeds` (`redis://host:port` URLs of some of its
    /// nodes; the rest are found from them); a call takes at most `timeout`, redirections and
    /// waits for a slot in migration included.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), redcount::Error> {
    /// let seeds = ["redis://10.0.0.1:7000", "redis://10.0.0.2:7000"];
    /// let redis = redcount::Direct::connect_cluster(&seeds, std::time::Duration::from_secs(5)).await?;
    /// assert!(redis.is_cluster());
    /// # Ok(()) }
    /// ```
    pub async fn connect_cluster<S: AsRef<str>>(seeds: &[S], timeout: Duration) -> Result<Self, Error> {
        Ok(Direct { conn: Conn::Cluster(link(seeds, timeout).await?), timeout, waits: None })
    }

    /// Connects as `redcount serve --redis URLS [--cluster]` does: with `cluster`, `urls` is a
    /// comma-separated list of seed nodes ([`connect_cluster`](Self::connect_cluster));
    /// without, one URL ([`connect_with`](Self::connect_with)).
    pub async fn connect_to(urls: &str, cluster: bool, timeout: Duration) -> Result<Self, Error> {
        if cluster {
            Self::connect_cluster(&seeds(urls), timeout).await
        } else {
            Self::connect_with(urls, timeout).await
        }
    }

    /// Connects as [`connect_to`](Self::connect_to), with writes of money acknowledged only once
    /// `wait.replicas` replicas have them ([`ReplicaWait`]). Such calls run on [`WAIT_LANES`]
    /// connections of their own (Cluster connections on a Cluster), one call each at a time: a
    /// `WAIT` holds its connection until the replicas answer, and every call sent behind it on
    /// a shared one would wait as long. `wait.timeout` must be shorter than `timeout`, so the
    /// wait ends inside the call's time limit.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), redcount::Error> {
    /// use redcount::direct::ReplicaWait;
    /// let wait = ReplicaWait { replicas: 1, timeout: std::time::Duration::from_millis(250) };
    /// let redis = redcount::Direct::connect_waiting("redis://10.0.0.1:6379", false, std::time::Duration::from_secs(5), wait).await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect_waiting(
        urls: &str,
        cluster: bool,
        timeout: Duration,
        wait: ReplicaWait,
    ) -> Result<Self, Error> {
        if wait.replicas == 0 || wait.timeout.is_zero() || wait.timeout >= timeout {
            return Err(Error::Config(format!(
                "waiting for {} replicas up to {} ms: give at least one replica and a wait between 1 ms and the call's time limit ({} ms)",
                wait.replicas,
                wait.timeout.as_millis(),
                timeout.as_millis()
            )));
        }
        let mut direct = Self::connect_to(urls, cluster, timeout).await?;
        let mut lanes = Vec::with_capacity(WAIT_LANES);
        for _ in 0..WAIT_LANES {
            lanes.push(if cluster {
                Conn::Cluster(link(&seeds(urls), timeout).await?)
            } else {
                Conn::One(manager(urls, timeout).await?)
            });
        }
        direct.waits = Some(Arc::new(Waits { wait, lanes: Lanes::new(lanes) }));
        Ok(direct)
    }

    /// Whether this is a Redis Cluster connection ([`connect_cluster`](Self::connect_cluster)).
    pub fn is_cluster(&self) -> bool {
        matches!(self.conn, Conn::Cluster(_))
    }

    /// Sends one command and returns its reply, an error reply as `Err(Error::Redis)`. On a
    /// Cluster it goes to the master of its first key (any node when it has none), following
    /// redirections.
    pub async fn send(&self, command: &Command) -> Result<Value, Error> {
        let cmd = to_cmd(command);
        if let Some(waits) = &self.waits
            && waits_for_replicas(&cmd)
        {
            return self.send_waited(waits, &cmd).await;
        }
        match &self.conn {
            Conn::One(manager) => {
                let mut conn = manager.clone();
                let mut result = cmd.query_async::<redis::Value>(&mut conn).await;
                // Refused while Redis was down: nothing was sent and the manager is
                // reconnecting, so send it once more rather than fail the first request after
                // Redis is back. (Never on "broken pipe": redis-rs says that also of a command
                // whose reply was lost after it ran.)
                if let Err(e) = &result
                    && e.is_connection_refusal()
                {
                    result = cmd.query_async::<redis::Value>(&mut conn).await;
                }
                match result {
                    Ok(v) => from_redis(v).map_err(Error::Redis),
                    Err(e) => Err(match server_error(&e) {
                        Some(reply) => Error::Redis(reply),
                        None => Error::Transport(transport(&e)),
                    }),
                }
            }
            Conn::Cluster(conn) => self.send_cluster(conn, &cmd, Hop::Key).await,
        }
    }

    /// [`send`](Self::send) for a call that waits for replicas: on a lane of its own, the
    /// command and `WAIT` in one write.
    async fn send_waited(&self, waits: &Waits, cmd: &redis::Cmd) -> Result<Value, Error> {
        let Ok(lane) = tokio::time::timeout(self.timeout, waits.lanes.lease()).await else {
            return Err(Error::Transport(Transport {
                may_have_run: false,
                timed_out: true,
                detail: format!(
                    "Redis: no connection for calls that wait for replicas came free within {} ms",
                    self.timeout.as_millis()
                ),
            }));
        };
        match &*lane {
            Conn::Cluster(link) => self.finish_cluster(cluster_call_waited(link, cmd, &waits.wait, self.timeout).await),
            Conn::One(manager) => {
                let mut conn = manager.clone();
                let pipe = waits.wait.pipeline(cmd);
                let mut result = pipe.query_async::<redis::Value>(&mut conn).await;
                // As in `send`: refused, nothing was sent.
                if let Err(e) = &result
                    && e.is_connection_refusal()
                {
                    result = pipe.query_async::<redis::Value>(&mut conn).await;
                }
                let replies = result.map_err(|e| match server_error(&e) {
                    Some(reply) => Error::Redis(reply),
                    None => Error::Transport(transport(&e)),
                })?;
                let (reply, waited) = waits.wait.split(replies).map_err(Error::Protocol)?;
                let reply = from_redis(reply).map_err(Error::Redis)?;
                waits.wait.check(&waited).map_err(Error::NotDurable)?;
                Ok(reply)
            }
        }
    }

    /// One Cluster call: sent again only after a reply saying Redis did not run it (MOVED,
    /// ASK, TRYAGAIN, CLUSTERDOWN), within the time limit.
    async fn send_cluster(&self, conn: &ClusterLink, cmd: &redis::Cmd, first: Hop) -> Result<Value, Error> {
        self.finish_cluster(cluster_call_via(conn, cmd, first, self.timeout, None).await.map(|(v, _)| v))
    }

    /// A Cluster call's outcome as [`Direct`]'s.
    fn finish_cluster(&self, outcome: Result<redis::Value, Stop>) -> Result<Value, Error> {
        from_redis(self.finish_cluster_raw(outcome)?).map_err(Error::Redis)
    }

    /// A Cluster call's outcome as [`Direct`]'s, the reply as redis-rs's (an error reply as
    /// such is `Err(Error::Redis)`).
    fn finish_cluster_raw(&self, outcome: Result<redis::Value, Stop>) -> Result<redis::Value, Error> {
        match outcome {
            Ok(redis::Value::ServerError(e)) => Err(Error::Redis(server_reply(&e))),
            Ok(v) => Ok(v),
            Err(Stop::NotDurable(why)) => Err(Error::NotDurable(why)),
            Err(Stop::Failed(e)) => Err(final_error(&e)),
            Err(Stop::TimedOut) => Err(Error::Transport(Transport {
                may_have_run: true,
                timed_out: true,
                detail: format!("Redis Cluster: no answer within {} ms", self.timeout.as_millis()),
            })),
            Err(Stop::Redirected(e)) => Err(Error::Transport(Transport {
                may_have_run: false,
                timed_out: true,
                detail: format!("Redis Cluster: still redirected after {} ms ({e})", self.timeout.as_millis()),
            })),
            Err(Stop::Unreachable(why)) => Err(Error::Transport(Transport {
                may_have_run: true,
                timed_out: false,
                detail: format!("Redis Cluster: {why}"),
            })),
        }
    }

    /// The masters of the Cluster (`CLUSTER SLOTS`: the first node of each slot range).
    async fn masters(&self, conn: &ClusterLink) -> Result<Vec<Node>, Error> {
        let slots = redis::cmd("CLUSTER").arg("SLOTS").to_owned();
        let reply = self
            .finish_cluster_raw(cluster_call_via(conn, &slots, Hop::Key, self.timeout, None).await.map(|(v, _)| v))?;
        let ranges = redcount_cluster::slot_ranges(&reply)
            .ok_or_else(|| Error::Protocol("unexpected CLUSTER SLOTS reply".into()))?;
        let mut out: Vec<Node> = ranges.into_iter().map(|r| r.master).collect();
        out.sort();
        out.dedup();
        Ok(out)
    }

    /// Where per-node administration goes: the one server, or every master of the Cluster.
    async fn targets(&self) -> Result<Vec<Option<Node>>, Error> {
        match &self.conn {
            Conn::One(_) => Ok(vec![None]),
            Conn::Cluster(conn) => Ok(self.masters(conn).await?.into_iter().map(Some).collect()),
        }
    }

    /// Sends `command` to `node` (a master of the Cluster), or as [`send`](Self::send) does.
    async fn send_at(&self, node: Option<&Node>, command: &Command) -> Result<Value, Error> {
        match (&self.conn, node) {
            (Conn::Cluster(conn), Some(node)) => self.send_cluster(conn, &to_cmd(command), Hop::At(node.clone())).await,
            _ => self.send(command).await,
        }
    }

    /// Every key that matches `pattern` (`SCAN … MATCH pattern`), on every master of a
    /// Cluster, deduplicated and sorted. During a slot migration a key on its way from a
    /// master not yet scanned to one already scanned can be missed: scan again later.
    pub async fn scan(&self, pattern: &str) -> Result<Vec<Vec<u8>>, Error> {
        let mut keys = std::collections::BTreeSet::new();
        for node in self.targets().await? {
            let mut cursor = String::from("0");
            loop {
                let scan = Command::new("SCAN").arg(cursor.clone()).arg("MATCH").arg(pattern).arg("COUNT").arg("1000");
                let reply = self.send_at(node.as_ref(), &scan).await?;
                let mut parts = reply.into_array("scan").map_err(Error::Shape)?.into_iter();
                let (Some(next), Some(Value::Array(found))) = (parts.next(), parts.next()) else {
                    return Err(Error::Protocol("unexpected SCAN reply".into()));
                };
                for k in found {
                    match k {
                        Value::Bytes(k) => {
                            keys.insert(k);
                        }
                        _ => return Err(Error::Protocol("unexpected SCAN reply".into())),
                    }
                }
                cursor = next.into_string("scan").map_err(Error::Shape)?;
                if cursor == "0" {
                    break;
                }
            }
        }
        Ok(keys.into_iter().collect())
    }

    /// Runs `op` in one round trip (two when the script cache has lost the script).
    pub async fn run<O: Operation + Sync>(&self, op: &O) -> Result<O::Outcome, Error> {
        crate::Driver::run(self, op).await
    }
}

/// `urls` (comma-separated) as a list of seeds.
fn seeds(urls: &str) -> Vec<&str> {
    urls.split(',').map(str::trim).filter(|s| !s.is_empty()).collect()
}

/// A connection to one Redis that reconnects by itself; a call waits at most `timeout`.
async fn manager(url: &str, timeout: Duration) -> Result<redis::aio::ConnectionManager, Error> {
    // RESP3: the manager is told when its connection ends and reconnects at once, so a
    // command is never sent on a connection that died with an old Redis process.
    let mut info = redis::IntoConnectionInfo::into_connection_info(url)
        .map_err(|e| Error::Config(format!("Redis URL {url:?}: {e}")))?;
    let settings = info.redis_settings().clone().set_protocol(redis::ProtocolVersion::RESP3);
    info = info.set_redis_settings(settings);
    let client = redis::Client::open(info).map_err(|e| Error::Config(format!("Redis URL {url:?}: {e}")))?;
    let config = redis::aio::ConnectionManagerConfig::new()
        // A reconnect may take as long as a call may: a short stall is waited out.
        .set_connection_timeout(Some(timeout.max(Duration::from_secs(2))))
        .set_response_timeout(Some(timeout))
        .set_number_of_retries(1)
        .set_max_delay(Duration::from_millis(500));
    redis::aio::ConnectionManager::new_with_config(client, config).await.map_err(|e| Error::Transport(transport(&e)))
}

/// A Cluster connection through `seeds` (see [`Direct::connect_cluster`]).
async fn link<S: AsRef<str>>(seeds: &[S], timeout: Duration) -> Result<ClusterLink, Error> {
    let mut infos = Vec::new();
    for (i, seed) in seeds.iter().enumerate() {
        let seed = seed.as_ref().trim();
        let info = redis::IntoConnectionInfo::into_connection_info(seed)
            .map_err(|e| Error::Config(format!("Redis Cluster seed {} ({}): {e}", i + 1, redact(seed))))?;
        infos.push(info);
    }
    if infos.is_empty() {
        return Err(Error::Config("Redis Cluster: no seed node given".into()));
    }
    let builder = move |nodes: Vec<redis::ConnectionInfo>| {
        redis::cluster::ClusterClientBuilder::new(nodes)
            // RESP3: a node's connection that ends is replaced at once (as for one server).
            .use_protocol(redis::ProtocolVersion::RESP3)
            .connection_timeout(timeout.max(Duration::from_secs(2)))
            .response_timeout(timeout)
            // No resending by redis-rs: see the module's documentation.
            .retries(0)
    };
    ClusterLink::connect(infos, builder).await.map_err(|e| match server_error(&e) {
        Some(reply) => Error::Redis(reply),
        None if e.kind() == ErrorKind::InvalidClientConfig => Error::Config(format!("Redis Cluster seeds: {e}")),
        None => Error::Transport(transport(&e)),
    })
}

/// A core command as redis-rs's.
fn to_cmd(command: &Command) -> redis::Cmd {
    let parts = command.parts();
    let mut cmd = redis::cmd(&parts[0]);
    for a in &parts[1..] {
        cmd.arg(a.as_bytes());
    }
    cmd
}

/// A failed Cluster call that is not sent again: Redis's error reply, or a transport error
/// that may have run the command.
fn final_error(e: &redis::RedisError) -> Error {
    match server_error(e) {
        Some(reply) => Error::Redis(reply),
        None => Error::Transport(Transport {
            may_have_run: true,
            timed_out: e.is_timeout(),
            detail: format!("Redis Cluster: {e}"),
        }),
    }
}

/// A Redis URL with its password replaced, for messages.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => format!("{}://***@{}", &url[..s], &url[at + 1..]),
        _ => url.to_string(),
    }
}

impl crate::Driver for Direct {
    async fn send(&self, command: &Command) -> Result<Value, Error> {
        Direct::send(self, command).await
    }
}

/// What a failed redis-rs call says about the command: refused connections sent nothing;
/// anything else (a timeout, a connection that ended) may have run it.
fn transport(e: &redis::RedisError) -> Transport {
    Transport { may_have_run: !e.is_connection_refusal(), timed_out: e.is_timeout(), detail: format!("Redis: {e}") }
}

/// The error reply inside a redis-rs error, if it is one.
fn server_error(e: &redis::RedisError) -> Option<ErrorReply> {
    let code = e.code()?;
    let detail = e.detail().unwrap_or("");
    Some(ErrorReply::new(if detail.is_empty() { code.to_string() } else { format!("{code} {detail}") }))
}

/// An error reply as the core's.
fn server_reply(e: &redis::ServerError) -> ErrorReply {
    ErrorReply::new(match e.details() {
        Some(d) => format!("{} {}", e.code(), d),
        None => e.code().to_string(),
    })
}

/// Converts a redis-rs reply to the core's [`Value`]; a nested error reply becomes `Err`.
fn from_redis(v: redis::Value) -> Result<Value, ErrorReply> {
    Ok(match v {
        redis::Value::Nil => Value::Nil,
        redis::Value::Int(n) => Value::Int(n),
        redis::Value::BulkString(b) => Value::Bytes(b),
        redis::Value::SimpleString(s) => Value::Bytes(s.into_bytes()),
        redis::Value::Okay => Value::Bytes(b"OK".to_vec()),
        redis::Value::Array(items) | redis::Value::Set(items) => {
            Value::Array(items.into_iter().map(from_redis).collect::<Result<_, _>>()?)
        }
        redis::Value::Boolean(b) => Value::Int(b as i64),
        // RESP3 forms (the connection speaks RESP3), as RESP2 would have sent them.
        redis::Value::VerbatimString { text, .. } => Value::Bytes(text.into_bytes()),
        redis::Value::Double(d) => Value::Bytes(d.to_string().into_bytes()),
        redis::Value::Map(pairs) => {
            Value::Array(pairs.into_iter().flat_map(|(k, v)| [from_redis(k), from_redis(v)]).collect::<Result<_, _>>()?)
        }
        redis::Value::ServerError(e) => return Err(server_reply(&e)),
        other => Value::Bytes(format!("{other:?}").into_bytes()),
    })
}

impl Direct {
    /// Whether Redis may evict redcount's keys: `Some(why)` when `maxmemory` is set and
    /// `maxmemory-policy` is not `noeviction` (every redcount key has a TTL, so `volatile-*`
    /// policies evict them too) on the server, or on any master of a Cluster (named). An
    /// evicted claim, quota window or idempotency record breaks redcount's promises. Read with
    /// CONFIG GET, else INFO memory (managed Redis often refuses CONFIG); when neither answers
    /// it cannot be told, and that is reported as a risk too (fail closed).
    pub async fn eviction_risk(&self) -> Option<String> {
        let config = |node: Option<Node>, name: &'static str| async move {
            match self.send_at(node.as_ref(), &Command::new("CONFIG").arg("GET").arg(name)).await {
                Ok(Value::Array(pair)) => match pair.get(1) {
                    Some(Value::Bytes(b)) => Some(String::from_utf8_lossy(b).into_owned()),
                    _ => None,
                },
                _ => None,
            }
        };
        // Managed Redis often refuses CONFIG: INFO memory says the same to any user.
        let info = |node: Option<Node>| async move {
            let text = match self.send_at(node.as_ref(), &Command::new("INFO").arg("memory")).await {
                Ok(Value::Bytes(b)) => String::from_utf8_lossy(&b).into_owned(),
                _ => return None,
            };
            let field = |name: &str| {
                text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(':')).map(|v| v.trim().to_string())
            };
            Some((field("maxmemory_policy")?, field("maxmemory")?))
        };
        let Ok(targets) = self.targets().await else {
            return Some("cannot list the masters to check their eviction policy".into());
        };
        for node in targets {
            let on = node.as_ref().map(|n| format!(" on {n}")).unwrap_or_default();
            let read = match (config(node.clone(), "maxmemory-policy").await, config(node.clone(), "maxmemory").await) {
                (Some(policy), Some(max)) => Some((policy, max)),
                _ => info(node.clone()).await,
            };
            // Not knowing is a risk too: fail closed.
            let Some((policy, max)) = read else {
                return Some(format!(
                    "cannot tell whether Redis may evict keys{on} (CONFIG GET and INFO memory both refused)"
                ));
            };
            if max != "0" && policy != "noeviction" {
                return Some(format!(
                    "maxmemory-policy is {policy} with maxmemory {max}{on}: Redis may evict redcount's keys"
                ));
            }
        }
        None
    }
}
