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
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant};

use redcount_core::{Command, ErrorReply, Operation, Value};
use redis::aio::ConnectionLike;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{ErrorKind, ServerErrorKind};

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

/// A Cluster node, as the Cluster names it (`CLUSTER SLOTS`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Node {
    host: String,
    port: u16,
}

impl Node {
    /// `host:port` (the last colon splits, so an IPv6 address keeps its own).
    fn parse(addr: &str) -> Option<Node> {
        let (host, port) = addr.rsplit_once(':')?;
        Some(Node { host: host.to_string(), port: port.parse().ok()? })
    }

    fn route(&self) -> SingleNodeRoutingInfo {
        SingleNodeRoutingInfo::ByAddress { host: self.host.clone(), port: self.port }
    }
}

impl fmt::Display for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

/// Where a Cluster call goes next.
enum Hop {
    /// To the master of the command's key (redis-rs's slot map).
    Key,
    /// `ASKING`, then the command, to this node (a slot in migration).
    Ask(Node),
    /// To this node, no redirection followed (per-node administration: SCAN, CONFIG GET).
    At(Node),
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
        self.finish_cluster(call(conn, cmd, first, self.timeout, None).await.map(|(v, _)| v))
    }

    /// A Cluster call's outcome as [`Direct`]'s.
    fn finish_cluster(&self, outcome: Result<redis::Value, Stop>) -> Result<Value, Error> {
        match outcome {
            Ok(v) => from_redis(v).map_err(Error::Redis),
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
        let reply = self.send_cluster(conn, &redis::cmd("CLUSTER").arg("SLOTS").to_owned(), Hop::Key).await?;
        let mut out: Vec<Node> = slot_ranges(reply)?.into_iter().map(|r| r.master).collect();
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

/// How a Cluster call ended without a reply.
#[derive(Debug)]
pub enum Stop {
    /// It failed in a way that does not prove it did not run (a lost connection, a timed-out
    /// reply), or Redis answered an error that retrying does not change; also TRYAGAIN or
    /// CLUSTERDOWN still answered when the time ran out.
    Failed(redis::RedisError),
    /// No answer within the time limit: it may have run.
    TimedOut,
    /// Still redirected (MOVED / ASK) when the time ran out: it did not run.
    Redirected(redis::RedisError),
    /// Still waiting while the master it goes to refuses connections (named here, with its
    /// slot): given up before the time limit. It may have run (sent before that master went
    /// down).
    Unreachable(String),
    /// It ran and Redis answered, but fewer replicas than asked acknowledged its write within
    /// the wait ([`cluster_call_waited`]; why, here): the write may be lost in a failover.
    NotDurable(String),
}

/// Sends `cmd` on a Cluster connection made with redis-rs's own retries off
/// (`ClusterClientBuilder::retries(0)`), to the master of its first key, and sends it again
/// only when Redis answered that it did not run it: `MOVED` (after the slot map is
/// refreshed), `ASK` (`ASKING` and the command to the node named), `TRYAGAIN` and
/// `CLUSTERDOWN` (waited out with short pauses), all within `timeout`. redis-rs's retries
/// would also resend after a lost reply, and a write would run twice. Shared by [`Direct`]
/// and the REST front.
pub async fn cluster_call(conn: &ClusterLink, cmd: &redis::Cmd, timeout: Duration) -> Result<redis::Value, Stop> {
    call(conn, cmd, Hop::Key, timeout, None).await.map(|(v, _)| v)
}

/// [`cluster_call`] for a write that must reach replicas: `WAIT` follows the command in the
/// same write to the node that runs it (so it counts the replicas that have that connection's
/// write), and a reply is returned only when `wait` is met; otherwise [`Stop::NotDurable`].
/// An error reply is returned as it is (a script that refuses writes nothing). `conn` should
/// carry no other traffic while this runs: its node connection waits with the `WAIT`.
pub async fn cluster_call_waited(
    conn: &ClusterLink,
    cmd: &redis::Cmd,
    wait: &ReplicaWait,
    timeout: Duration,
) -> Result<redis::Value, Stop> {
    let (reply, waited) = call(conn, cmd, Hop::Key, timeout, Some(&wait.command())).await?;
    // An error reply is the answer, as from `cluster_call` (a script that refuses writes
    // nothing: there is nothing to wait for).
    if let redis::Value::ServerError(e) = reply {
        return Err(Stop::Failed(e.into()));
    }
    wait.check(&waited.unwrap_or(redis::Value::Nil)).map_err(Stop::NotDurable)?;
    Ok(reply)
}

/// Calls of one of redcount's money scripts (counters, red packets: `EVALSHA` of their SHA,
/// or `EVAL` of their source) are the ones a [`ReplicaWait`] applies to.
pub fn waits_for_replicas(cmd: &redis::Cmd) -> bool {
    use redcount_core::script::{COUNTER, REDPACKET_CREATE, REDPACKET_GRAB};
    static SOURCES: std::sync::LazyLock<[String; 3]> =
        std::sync::LazyLock::new(|| [COUNTER.source(), REDPACKET_CREATE.source(), REDPACKET_GRAB.source()]);
    let mut args = cmd.args_iter();
    let (Some(redis::Arg::Simple(name)), Some(redis::Arg::Simple(first))) = (args.next(), args.next()) else {
        return false;
    };
    if name.eq_ignore_ascii_case(b"EVALSHA") {
        [&COUNTER, &REDPACKET_CREATE, &REDPACKET_GRAB].iter().any(|s| s.sha1().as_bytes().eq_ignore_ascii_case(first))
    } else if name.eq_ignore_ascii_case(b"EVAL") {
        SOURCES.iter().any(|s| s.as_bytes() == first)
    } else {
        false
    }
}

/// Writes acknowledged only once replicas have them (`redcount serve --wait-replicas`,
/// `redcount-rest --wait-replicas`). Redis acknowledges a write once its master has it and
/// replicates it afterwards, so a failover loses what the replica that took over had not
/// received: a master paused past its failover acknowledged writes queued for it when it went
/// on, then dropped them on learning it had been demoted (Cluster attacker pass). With a wait,
/// `WAIT replicas timeout` follows each money call on its connection, and a call that fewer
/// replicas acknowledged in time ends not durable: it happened on the master, and may be lost.
///
/// ```
/// use redcount::direct::ReplicaWait;
/// let wait = ReplicaWait { replicas: 1, timeout: std::time::Duration::from_millis(250) };
/// assert!(wait.check(&redis::Value::Int(1)).is_ok());
/// assert!(wait.check(&redis::Value::Int(0)).unwrap_err().contains("0 of 1 replica"));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicaWait {
    /// Replicas that must acknowledge the write.
    pub replicas: u32,
    /// The most a call waits for them (WAIT's timeout, at least 1 ms: 0 would wait forever).
    pub timeout: Duration,
}

impl ReplicaWait {
    /// `WAIT replicas timeout`.
    fn command(&self) -> redis::Cmd {
        let mut wait = redis::cmd("WAIT");
        wait.arg(self.replicas).arg(u64::try_from(self.timeout.as_millis()).unwrap_or(u64::MAX).max(1));
        wait
    }

    /// `cmd` then `WAIT`, as one pipeline whose error replies come back in place (one write,
    /// so nothing else runs on the connection between them).
    pub fn pipeline(&self, cmd: &redis::Cmd) -> redis::Pipeline {
        let mut pipe = redis::pipe();
        pipe.ignore_errors().add_command(cmd.clone()).add_command(self.command());
        pipe
    }

    /// The command's reply and WAIT's, from the reply of [`pipeline`](Self::pipeline).
    pub fn split(&self, replies: redis::Value) -> Result<(redis::Value, redis::Value), String> {
        match replies {
            redis::Value::Array(v) if v.len() == 2 => {
                let mut v = v.into_iter();
                Ok((v.next().unwrap_or(redis::Value::Nil), v.next().unwrap_or(redis::Value::Nil)))
            }
            other => Err(format!("unexpected reply to a call and its WAIT: {other:?}")),
        }
    }

    /// `Ok` when WAIT's reply says enough replicas acknowledged the write; otherwise why not.
    pub fn check(&self, waited: &redis::Value) -> Result<(), String> {
        let wanted = i64::from(self.replicas);
        let plural = if self.replicas == 1 { "replica" } else { "replicas" };
        let not = |what: String| {
            format!(
                "the write happened on the master, but {what} within {} ms: it may be lost if the master fails over",
                self.timeout.as_millis()
            )
        };
        match waited {
            redis::Value::Int(n) if *n >= wanted => Ok(()),
            redis::Value::Int(n) => Err(not(format!("{n} of {wanted} {plural} acknowledged it"))),
            redis::Value::ServerError(e) => Err(not(format!(
                "WAIT for {wanted} {plural} failed ({} {})",
                e.code(),
                e.details().unwrap_or_default()
            ))),
            other => Err(not(format!("WAIT for {wanted} {plural} answered {other:?}"))),
        }
    }
}

/// Connections for calls that wait for replicas, per [`Direct`] (and per Cluster backend of the
/// REST front).
pub const WAIT_LANES: usize = 8;

/// Connections (or connection handles) each lent to one call at a time.
#[derive(Debug)]
pub struct Lanes<T> {
    free: std::sync::Mutex<Vec<T>>,
    permits: tokio::sync::Semaphore,
}

impl<T> Lanes<T> {
    /// The lanes `items`.
    pub fn new(items: Vec<T>) -> Self {
        let permits = tokio::sync::Semaphore::new(items.len());
        Lanes { free: std::sync::Mutex::new(items), permits }
    }

    /// A lane of its own, waited for while all are lent; given back on drop.
    pub async fn lease(&self) -> Lent<'_, T> {
        let permit = self.permits.acquire().await.expect("the lanes' semaphore is never closed");
        let item = self.free.lock().unwrap_or_else(PoisonError::into_inner).pop();
        Lent { lanes: self, item, _permit: permit }
    }
}

/// A lane lent by [`Lanes::lease`].
#[derive(Debug)]
pub struct Lent<'a, T> {
    lanes: &'a Lanes<T>,
    item: Option<T>,
    _permit: tokio::sync::SemaphorePermit<'a>,
}

impl<T> std::ops::Deref for Lent<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.item.as_ref().expect("a permit means a free lane")
    }
}

impl<T> Drop for Lent<'_, T> {
    fn drop(&mut self) {
        if let Some(item) = self.item.take() {
            self.lanes.free.lock().unwrap_or_else(PoisonError::into_inner).push(item);
        }
    }
}

async fn call(
    conn: &ClusterLink,
    cmd: &redis::Cmd,
    first: Hop,
    timeout: Duration,
    wait: Option<&redis::Cmd>,
) -> Result<(redis::Value, Option<redis::Value>), Stop> {
    let deadline = Instant::now() + timeout;
    let fixed = matches!(first, Hop::At(_));
    let mut hop = first;
    let mut pause = Duration::from_millis(2);
    // A master that does not accept connections keeps a call for it waiting (redis-rs) or
    // redirected back and forth (it sends it to another master, which answers MOVED to the
    // one that is down) until the time limit: once a probe has seen the master down, the
    // call ends with it named. One watch for the whole call, across its tries.
    let aim = match &hop {
        Hop::At(node) => Some(node.clone()),
        _ => None,
    };
    let watch = conn.unreachable_target(cmd, aim.as_ref(), Instant::now());
    let mut watch = std::pin::pin!(watch);
    loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        let tried = tokio::time::timeout(remaining, conn.with(|c| attempt(c, cmd, &hop, wait)));
        let e = tokio::select! {
            out = tried => match out {
                Err(_) => return Err(Stop::TimedOut),
                Ok(Ok(v)) => return Ok(v),
                Ok(Err(e)) => e,
            },
            why = &mut watch => return Err(Stop::Unreachable(why)),
        };
        // Only a reply from Redis proves the command did not run. Any other failure may come
        // after it was sent (redis-rs also hands in-flight calls the error of a failed
        // slot-map refresh), so it is final and "may have run".
        let (next, wait) = match e.kind() {
            ErrorKind::Server(ServerErrorKind::Moved) if !fixed => (Hop::Key, true),
            ErrorKind::Server(ServerErrorKind::Ask) if !fixed => {
                match e.redirect_node().and_then(|(addr, _)| Node::parse(addr)) {
                    Some(node) => (Hop::Ask(node), false),
                    None => return Err(Stop::Failed(e)),
                }
            }
            ErrorKind::Server(ServerErrorKind::TryAgain | ServerErrorKind::ClusterDown) => {
                (if fixed { hop } else { Hop::Key }, true)
            }
            _ => return Err(Stop::Failed(e)),
        };
        // MOVED: redis-rs refreshes its slot map; a short pause lets it finish.
        let wait = if wait { pause } else { Duration::ZERO };
        if Instant::now() + wait >= deadline {
            return Err(match e.kind() {
                // Still unavailable: Redis's own answer.
                ErrorKind::Server(ServerErrorKind::TryAgain | ServerErrorKind::ClusterDown) => Stop::Failed(e),
                _ => Stop::Redirected(e),
            });
        }
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
            pause = (pause * 2).min(Duration::from_millis(50));
        }
        hop = next;
    }
}

/// One try of a Cluster call: its reply, and `wait`'s (sent right after it, on the same node
/// connection) when given. An error reply that is not a redirection comes back as a reply
/// (`Value::ServerError`) when the command goes in a pipeline (after ASKING, or with a WAIT).
async fn attempt(
    mut conn: ClusterConnection,
    cmd: &redis::Cmd,
    hop: &Hop,
    wait: Option<&redis::Cmd>,
) -> redis::RedisResult<(redis::Value, Option<redis::Value>)> {
    match (hop, wait) {
        (Hop::Key, None) => conn.req_packed_command(cmd).await.map(|v| (v, None)),
        (Hop::At(node), _) => {
            conn.route_command(cmd.clone(), RoutingInfo::SingleNode(node.route())).await.map(|v| (v, None))
        }
        (Hop::Key, Some(_)) => {
            // A money script's first key (EVALSHA sha numkeys key …) names its slot.
            let Some(redis::Arg::Simple(key)) = cmd.args_iter().nth(3) else {
                return Err(redis::RedisError::from((ErrorKind::Client, "a call that waits for replicas needs a key")));
            };
            let route = SingleNodeRoutingInfo::SpecificNode(Route::with_key(key, SlotAddr::Master));
            let mut pipe = redis::pipe();
            pipe.add_command(cmd.clone());
            on_one_node(conn, pipe, 0, wait, route).await
        }
        (Hop::Ask(node), _) => {
            let mut pipe = redis::pipe();
            pipe.cmd("ASKING").add_command(cmd.clone());
            on_one_node(conn, pipe, 1, wait, node.route()).await
        }
    }
}

/// `pipe` (then `wait`) in one write on one node's connection, so nothing else comes between
/// ASKING and the command, nor between the command and its WAIT; the replies from `offset` on.
async fn on_one_node(
    mut conn: ClusterConnection,
    mut pipe: redis::Pipeline,
    offset: usize,
    wait: Option<&redis::Cmd>,
    route: SingleNodeRoutingInfo,
) -> redis::RedisResult<(redis::Value, Option<redis::Value>)> {
    if let Some(w) = wait {
        pipe.add_command(w.clone());
    }
    let count = 1 + usize::from(wait.is_some());
    let mut replies = conn.route_pipeline(pipe, offset, count, route).await?.into_iter();
    let reply = replies.next().ok_or_else(|| redis::RedisError::from((ErrorKind::Client, "no reply")))?;
    Ok((reply, replies.next()))
}

/// A Redis Cluster connection that is replaced when it stops answering or stops following
/// the Cluster, and that gives up on calls for a master that is down.
///
/// redis-rs's Cluster connection can stop answering for good: under a slot migration with a
/// busy machine (about one run in three of `rest::a_slot_migrated_in_the_middle_of_a_storm`
/// with one core kept busy), every command through it waited until its time limit, for as
/// long as the process ran, and it sent nothing to any node while the nodes answered other
/// clients. So a call still waiting after [`SUSPECT_AFTER`] has the connection probed with a
/// `PING` to every node known (the seeds, and every node the Cluster listed when last asked),
/// all at once: any answer, an error reply too, shows it works (one node may just be paused);
/// no answer within [`PROBE_LIMIT`] while a new connection answers one puts the new connection
/// in its place (made from those nodes, those that answer). When a `PING` is answered, the
/// probe reads `CLUSTER SLOTS` from the first node to answer and looks at each master:
/// one that refuses a TCP connection is noted, and calls for its slots end with it named
/// ([`Stop::Unreachable`]) instead of waiting out their limit; one that answers while what
/// the connection routes to its slots does not means a failover the connection did not
/// follow, and it is replaced by one made from the masters that answer. One probe at a time,
/// and none within [`SUSPECT_AFTER`] of the last, so a Redis that is slow for everyone costs
/// about one probe a second, and nothing is replaced while no new connection answers either.
/// A master whose connection the link lacks and that refuses the link's login (its ACL user
/// missing, disabled or with another password there) is noted the same way, with that reason:
/// redis-rs would send its slots' calls to other masters, which redirect them back, until the
/// limit. The replaced connection is dropped once the calls still on it end, and redis-rs then
/// aborts its task and closes its node connections, a stuck one's too (a test freezes every
/// node connection several times over and counts tasks and sockets).
#[derive(Clone)]
pub struct ClusterLink(Arc<LinkInner>);

impl fmt::Debug for ClusterLink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ClusterLink")
    }
}

/// Makes the client of a Cluster connection from the nodes to start from (the same settings
/// whatever the nodes).
type Builder = dyn Fn(Vec<redis::ConnectionInfo>) -> redis::cluster::ClusterClientBuilder + Send + Sync;

struct LinkInner {
    /// The seeds, as given.
    seeds: Vec<redis::ConnectionInfo>,
    builder: Box<Builder>,
    conn: RwLock<ClusterConnection>,
    probing: AtomicBool,
    /// When the last probe ended (milliseconds since `born`).
    probed_at: std::sync::atomic::AtomicU64,
    born: Instant,
    /// Every node `CLUSTER SLOTS` listed when the probe last read it (masters and replicas),
    /// as the seeds' settings reach them.
    known: RwLock<Vec<redis::ConnectionInfo>>,
    /// What the last probe saw of the masters that do not accept connections (calls waiting
    /// on it are woken by each new finding).
    down: tokio::sync::watch::Sender<Option<Arc<Down>>>,
}

/// The masters a probe could not open a TCP connection to, with their slots.
struct Down {
    /// When the probe began to look.
    seen: Instant,
    ranges: Vec<SlotRange>,
    /// Why each master of `ranges` cannot be reached.
    why: Vec<(Node, String)>,
    /// The masters that accepted a connection, as the seeds' settings reach them.
    up: Vec<redis::ConnectionInfo>,
}

impl Down {
    /// Why `master` cannot be reached.
    fn why(&self, master: &Node) -> &str {
        self.why.iter().find(|(n, _)| n == master).map_or("cannot be reached", |(_, w)| w.as_str())
    }
}

/// What the probe found of a master.
enum Health {
    /// It does not accept a TCP connection.
    Closed,
    /// It accepts one, and refuses the link's login (why).
    RefusesLogin(String),
    /// It accepts one; `stale` when it answers while what the connection routes to its slots
    /// does not.
    Up { stale: bool },
}

/// Whether `e` is a login refused (an authentication failure, or an ACL user that may not log
/// in). redis-rs wraps a Cluster connection's failure in its own (an I/O error naming it).
fn login_refused(e: &redis::RedisError) -> bool {
    e.kind() == ErrorKind::AuthenticationFailed
        || matches!(e.code(), Some("WRONGPASS" | "NOAUTH"))
        || ["AuthenticationFailed", "WRONGPASS", "NOAUTH"].iter().any(|w| e.to_string().contains(w))
}

/// How long a Cluster call waits for its answer before its connection is probed.
pub const SUSPECT_AFTER: Duration = Duration::from_secs(1);
/// How long a probe waits for a `PING`'s answer (and for a new connection).
pub const PROBE_LIMIT: Duration = Duration::from_secs(2);

impl ClusterLink {
    /// Connects through `seeds` with the client `builder` makes (with redis-rs's retries off:
    /// see [`cluster_call`]). A replacement connection is made by `builder` too, from the
    /// seeds or from the masters that answer.
    pub async fn connect(
        seeds: Vec<redis::ConnectionInfo>,
        builder: impl Fn(Vec<redis::ConnectionInfo>) -> redis::cluster::ClusterClientBuilder + Send + Sync + 'static,
    ) -> redis::RedisResult<Self> {
        let conn = builder(seeds.clone()).build()?.get_async_connection().await?;
        let link = ClusterLink(Arc::new(LinkInner {
            seeds,
            builder: Box::new(builder),
            conn: RwLock::new(conn),
            probing: AtomicBool::new(false),
            probed_at: std::sync::atomic::AtomicU64::new(0),
            born: Instant::now(),
            known: RwLock::new(Vec::new()),
            down: tokio::sync::watch::Sender::new(None),
        }));
        // The nodes beyond the seeds, known from the start: a later probe may find the seeds
        // paused.
        link.read_slots(&link.0.seeds.iter().filter_map(node_of).collect::<Vec<_>>()).await;
        Ok(link)
    }

    /// The connection in use now (a handle: cheap to clone).
    pub fn current(&self) -> ClusterConnection {
        self.0.conn.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Runs `f` on the connection in use; still waiting after [`SUSPECT_AFTER`], it has the
    /// connection probed (and goes on waiting).
    pub async fn with<T, F: Future<Output = T>>(&self, f: impl FnOnce(ClusterConnection) -> F) -> T {
        let call = f(self.current());
        let mut call = std::pin::pin!(call);
        tokio::select! {
            out = &mut call => out,
            () = tokio::time::sleep(SUSPECT_AFTER) => {
                self.suspect();
                call.await
            }
        }
    }

    /// Probes the connection in the background, unless a probe runs or one ended less than
    /// [`SUSPECT_AFTER`] ago.
    pub fn suspect(&self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let now = self.0.born.elapsed().as_millis() as u64;
        if now < self.0.probed_at.load(Ordering::Acquire) + SUSPECT_AFTER.as_millis() as u64
            || self.0.probing.swap(true, Ordering::AcqRel)
        {
            return;
        }
        let link = self.clone();
        runtime.spawn(async move {
            link.probe().await;
            link.0.probed_at.store(link.0.born.elapsed().as_millis() as u64, Ordering::Release);
            link.0.probing.store(false, Ordering::Release);
        });
    }

    async fn probe(&self) {
        let nodes = self.candidates();
        let routes: Vec<Node> = nodes.iter().filter_map(node_of).collect();
        // Every node at once, not one at random: a paused node answers nothing, and the
        // connection is stuck only when no node answers through it.
        if self.first_answer(ping(), &routes, answered).await.is_none() {
            let why = format!("no node answered a PING through it within {} ms", PROBE_LIMIT.as_millis());
            self.replace(nodes, &why).await;
            return;
        }
        if let Some(why) = self.check_masters(&routes).await {
            // Seeded by the masters that answer: a paused seed would hold up the new
            // connection until its connect timeout.
            let masters = self.0.down.borrow().as_ref().map(|d| d.up.clone()).unwrap_or_default();
            self.replace(masters, &why).await;
        }
    }

    /// The seeds and every node the Cluster listed when last asked, once each: with the
    /// seeds paused, the others (a replica promoted since, say) can still answer.
    fn candidates(&self) -> Vec<redis::ConnectionInfo> {
        let mut nodes = self.0.seeds.clone();
        for n in self.0.known.read().unwrap_or_else(PoisonError::into_inner).iter() {
            if !nodes.iter().any(|s| s.addr() == n.addr()) {
                nodes.push(n.clone());
            }
        }
        nodes
    }

    /// The first of `nodes`' answers to `cmd` through the connection that `accept` takes,
    /// all asked at once, each within [`PROBE_LIMIT`]; `None` when none comes.
    async fn first_answer(&self, cmd: redis::Cmd, nodes: &[Node], accept: fn(&Answer) -> bool) -> Option<Answer> {
        let mut asks = tokio::task::JoinSet::new();
        for node in nodes {
            let (mut conn, cmd, to) = (self.current(), cmd.clone(), RoutingInfo::SingleNode(node.route()));
            asks.spawn(async move { tokio::time::timeout(PROBE_LIMIT, conn.route_command(cmd, to)).await });
        }
        while let Some(joined) = asks.join_next().await {
            if let Ok(answer) = joined
                && accept(&answer)
            {
                return Some(answer);
            }
        }
        None
    }

    /// Reads `CLUSTER SLOTS` (from whichever of `nodes` answers first) into the nodes known.
    async fn read_slots(&self, nodes: &[Node]) -> Option<Value> {
        let slots = redis::cmd("CLUSTER").arg("SLOTS").to_owned();
        let Ok(Ok(reply)) = self.first_answer(slots, nodes, |a| matches!(a, Ok(Ok(_)))).await? else { return None };
        let reply = from_redis(reply).ok()?;
        let listed = listed_nodes(&reply).iter().filter_map(|n| self.settings_for(n)).collect();
        *self.0.known.write().unwrap_or_else(PoisonError::into_inner) = listed;
        Some(reply)
    }

    /// The connection settings for `node`: the seeds', at its address.
    fn settings_for(&self, node: &Node) -> Option<redis::ConnectionInfo> {
        with_address(self.0.seeds.first()?, &node.to_string())
    }

    /// Puts a new connection in place of the current one, made from those of `nodes` that
    /// answer a PING of their own (when none does in time, a loaded machine, from all of them
    /// and the seeds), once it answers a PING too.
    async fn replace(&self, nodes: Vec<redis::ConnectionInfo>, why: &str) {
        let mut live = tokio::task::JoinSet::new();
        for node in nodes.clone() {
            live.spawn(async move {
                let config = redis::AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(PROBE_LIMIT / 2))
                    .set_response_timeout(Some(PROBE_LIMIT / 2));
                let client = redis::Client::open(node.clone()).ok()?;
                let mut conn = client.get_multiplexed_async_connection_with_config(&config).await.ok()?;
                ping().query_async::<redis::Value>(&mut conn).await.ok().map(|_| node)
            });
        }
        let mut seeds = Vec::new();
        while let Some(joined) = live.join_next().await {
            if let Ok(Some(node)) = joined {
                seeds.push(node);
            }
        }
        if seeds.is_empty() {
            seeds = self.0.seeds.clone();
            seeds.extend(nodes.into_iter().filter(|n| !self.0.seeds.iter().any(|s| s.addr() == n.addr())));
        }
        let Ok(client) = (self.0.builder)(seeds).build() else { return };
        let Ok(Ok(mut fresh)) = tokio::time::timeout(2 * PROBE_LIMIT, client.get_async_connection()).await else {
            tracing::debug!("the Redis Cluster connection needs replacing ({why}), but no new one could be made");
            return;
        };
        let any = RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random);
        if !matches!(tokio::time::timeout(PROBE_LIMIT, fresh.route_command(ping(), any)).await, Ok(Ok(_))) {
            return;
        }
        *self.0.conn.write().unwrap_or_else(PoisonError::into_inner) = fresh;
        tracing::warn!("replaced the Redis Cluster connection: {why}");
    }

    /// Reads the masters from the first of `nodes` to answer (`CLUSTER SLOTS`) and notes which
    /// do not accept a TCP connection now (killed, or their machine gone; a paused one still
    /// does: its kernel accepts for it): redis-rs keeps a call for such a master waiting until
    /// its time limit.
    /// Returns why the connection must be replaced when, for a master that answers, a command
    /// routed by the connection to one of its slots gets no answer: its slot map is stale (a
    /// failover while the old master was paused, which redis-rs does not notice: it hears no
    /// MOVED from a node that does not answer).
    async fn check_masters(&self, nodes: &[Node]) -> Option<String> {
        let seen = Instant::now();
        let Ok(ranges) = slot_ranges(self.read_slots(nodes).await?) else { return None };
        let mut masters: Vec<(Node, u16)> = Vec::new();
        for r in &ranges {
            if !masters.iter().any(|(m, _)| m == &r.master) {
                masters.push((r.master.clone(), r.first));
            }
        }
        let mut checks = tokio::task::JoinSet::new();
        for (node, slot) in masters {
            let (mut conn, link) = (self.current(), self.clone());
            checks.spawn(async move {
                let open = tokio::net::TcpStream::connect((node.host.as_str(), node.port));
                if !matches!(tokio::time::timeout(PROBE_LIMIT, open).await, Ok(Ok(_))) {
                    return (node, Health::Closed);
                }
                // The master answers, by its own connection (or has none here yet)...
                let to_node = RoutingInfo::SingleNode(node.route());
                let direct = tokio::time::timeout(PROBE_LIMIT, conn.route_command(ping(), to_node)).await;
                let unknown = matches!(&direct, Ok(Err(e)) if e.kind() == ErrorKind::ClusterConnectionNotFound);
                if !answered(&direct) && !unknown {
                    return (node, Health::Up { stale: false });
                }
                // No connection to it: redis-rs may be unable to log in there (the node
                // refuses the user), and then sends its slots' calls to other masters, which
                // redirect them back, until their limit.
                if unknown && let Some(why) = link.refused_login(&node).await {
                    return (node, Health::RefusesLogin(why));
                }
                // ... while what the connection routes to its slot does not.
                let route = Route::new(slot, SlotAddr::Master);
                let to_slot = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route));
                let myid = redis::cmd("CLUSTER").arg("MYID").to_owned();
                let stale = !answered(&tokio::time::timeout(PROBE_LIMIT, conn.route_command(myid, to_slot)).await);
                (node, Health::Up { stale })
            });
        }
        let (mut why, mut up, mut stale) = (Vec::new(), Vec::new(), Vec::new());
        while let Some(Ok((node, health))) = checks.join_next().await {
            match health {
                Health::Closed => why.push((node, String::from("does not accept connections"))),
                Health::RefusesLogin(e) => why.push((node, format!("refuses the login ({e})"))),
                Health::Up { stale: routed_nowhere } => {
                    if routed_nowhere {
                        stale.push(node.to_string());
                    }
                    if let Some(info) = self.settings_for(&node) {
                        up.push(info);
                    }
                }
            }
        }
        let ranges = ranges.into_iter().filter(|r| why.iter().any(|(n, _)| n == &r.master)).collect();
        self.0.down.send_replace(Some(Arc::new(Down { seen, ranges, why, up })));
        (!stale.is_empty()).then(|| {
            format!(
                "the Cluster says {} serve(s) slots the connection sent to a node that did not answer within {} ms (a failover it did not follow)",
                stale.join(", "),
                PROBE_LIMIT.as_millis()
            )
        })
    }

    /// Why `node` refuses a connection made as this link's are (its user, password, TLS), if it
    /// does: a login refused (an ACL user missing, disabled or with another password there).
    async fn refused_login(&self, node: &Node) -> Option<String> {
        let client = (self.0.builder)(vec![self.settings_for(node)?]).build().ok()?;
        match tokio::time::timeout(PROBE_LIMIT, client.get_async_connection()).await {
            Ok(Err(e)) if login_refused(&e) => Some(e.to_string()),
            _ => None,
        }
    }

    /// Resolves, naming it, once a probe begun after `began` has found that the master `cmd`
    /// goes to (`at`, else its first key's) does not accept connections; never otherwise (the
    /// caller's own time limit ends the wait). Looks only after [`SUSPECT_AFTER`], as the
    /// probe does.
    async fn unreachable_target(&self, cmd: &redis::Cmd, at: Option<&Node>, began: Instant) -> String {
        tokio::time::sleep(SUSPECT_AFTER.saturating_sub(began.elapsed())).await;
        let mut findings = self.0.down.subscribe();
        let mut slot = None;
        loop {
            let latest = findings.borrow_and_update().clone();
            // Only what a probe saw since the call began: the master may be back.
            if let Some(down) = latest.filter(|d| d.seen >= began && !d.ranges.is_empty()) {
                let hit = match at {
                    Some(node) => down
                        .ranges
                        .iter()
                        .find(|r| &r.master == node)
                        .map(|r| format!("{} {}", r.master, down.why(&r.master))),
                    None => {
                        if slot.is_none() {
                            slot = Some(self.slot_of(cmd).await);
                        }
                        slot.flatten().and_then(|s| {
                            down.ranges
                                .iter()
                                .find(|r| (r.first..=r.last).contains(&s))
                                .map(|r| format!("{}, the master of slot {s}, {}", r.master, down.why(&r.master)))
                        })
                    }
                };
                if let Some(why) = hit {
                    return why;
                }
            }
            // A probe (at most one a second), then its finding; asked again a second later
            // when none came (one was under way, or had just ended, when this call asked).
            self.suspect();
            let _ = tokio::time::timeout(SUSPECT_AFTER, findings.changed()).await;
        }
    }

    /// The slot of `cmd`'s first key, as the Cluster reckons it (`COMMAND GETKEYS`, then
    /// `CLUSTER KEYSLOT`: Redis's own key positions for any command); `None` without a key
    /// or an answer.
    async fn slot_of(&self, cmd: &redis::Cmd) -> Option<u16> {
        // Asked of every node known, the first answer taken: the one picked at random may be
        // the master that is down, or a paused one.
        let nodes: Vec<Node> = self.candidates().iter().filter_map(node_of).collect();
        let ok = |a: &Answer| matches!(a, Ok(Ok(_)));
        let keys = self.first_answer(getkeys(cmd)?, &nodes, ok).await?.ok()?.ok()?;
        let keyslot = redis::cmd("CLUSTER").arg("KEYSLOT").arg(first_key(keys)?).to_owned();
        match self.first_answer(keyslot, &nodes, ok).await?.ok()?.ok()? {
            redis::Value::Int(n) => u16::try_from(n).ok(),
            _ => None,
        }
    }
}

/// The probe's PING (named, so it can be told apart in MONITOR and the slow log).
fn ping() -> redis::Cmd {
    let mut c = redis::cmd("PING");
    c.arg("redcount-probe");
    c
}

/// A call's outcome within a time limit.
type Answer = Result<redis::RedisResult<redis::Value>, tokio::time::error::Elapsed>;

/// The address of a node's connection settings (TCP, with TLS or without).
fn node_of(info: &redis::ConnectionInfo) -> Option<Node> {
    match info.addr() {
        redis::ConnectionAddr::Tcp(host, port) | redis::ConnectionAddr::TcpTls { host, port, .. } => {
            Some(Node { host: host.clone(), port: *port })
        }
        _ => None,
    }
}

/// Whether Redis answered: a reply, an error reply too; redis-rs's own "timed out" (its
/// response timeout), a lost connection or no connection is not an answer.
fn answered(r: &Answer) -> bool {
    matches!(r, Ok(Ok(_))) || matches!(r, Ok(Err(e)) if e.code().is_some())
}

/// `template` (a seed, with its credentials, TLS and database as redis-rs read them) with its
/// address replaced by `addr` (`host:port`, as `CLUSTER NODES` and `CLUSTER SLOTS` give it).
pub fn with_address(template: &redis::ConnectionInfo, addr: &str) -> Option<redis::ConnectionInfo> {
    use redis::ConnectionAddr;
    let (host, port) = addr.rsplit_once(':')?;
    let (host, port) = (host.to_string(), port.parse().ok()?);
    let addr = match template.addr() {
        ConnectionAddr::Tcp(..) => ConnectionAddr::Tcp(host, port),
        ConnectionAddr::TcpTls { insecure, tls_params, .. } => {
            ConnectionAddr::TcpTls { host, port, insecure: *insecure, tls_params: tls_params.clone() }
        }
        _ => return None,
    };
    Some(template.clone().set_addr(addr))
}

/// A range of slots and the master that serves it, as `CLUSTER SLOTS` lists them.
#[derive(Debug, Clone, PartialEq, Eq)]
struct SlotRange {
    first: u16,
    last: u16,
    master: Node,
}

/// `COMMAND GETKEYS` for `cmd`: Redis's own key positions, for any command (`None` for a
/// command with a cursor argument, which has no fixed text).
pub fn getkeys(cmd: &redis::Cmd) -> Option<redis::Cmd> {
    let mut getkeys = redis::cmd("COMMAND");
    getkeys.arg("GETKEYS");
    for a in cmd.args_iter() {
        match a {
            redis::Arg::Simple(b) => getkeys.arg(b),
            _ => return None,
        };
    }
    Some(getkeys)
}

/// The first key of a `COMMAND GETKEYS` reply.
pub fn first_key(reply: redis::Value) -> Option<Vec<u8>> {
    match reply {
        redis::Value::Array(keys) => match keys.into_iter().next()? {
            redis::Value::BulkString(k) => Some(k),
            redis::Value::SimpleString(k) => Some(k.into_bytes()),
            _ => None,
        },
        _ => None,
    }
}

/// Every node a `CLUSTER SLOTS` reply lists, masters and replicas, once each.
fn listed_nodes(reply: &Value) -> Vec<Node> {
    let mut out: Vec<Node> = Vec::new();
    let Value::Array(ranges) = reply else { return out };
    for range in ranges {
        let Value::Array(parts) = range else { continue };
        for node in parts.iter().skip(2) {
            if let Value::Array(n) = node
                && let (Some(Value::Bytes(host)), Some(Value::Int(port))) = (n.first(), n.get(1))
                && let Ok(port) = u16::try_from(*port)
            {
                let node = Node { host: String::from_utf8_lossy(host).into_owned(), port };
                if !out.contains(&node) {
                    out.push(node);
                }
            }
        }
    }
    out
}

/// The ranges of a `CLUSTER SLOTS` reply (the first node of each is its master).
fn slot_ranges(reply: Value) -> Result<Vec<SlotRange>, Error> {
    let bad = || Error::Protocol("unexpected CLUSTER SLOTS reply".into());
    let slot = |v: Option<&Value>| match v {
        Some(Value::Int(n)) => u16::try_from(*n).map_err(|_| bad()),
        _ => Err(bad()),
    };
    let mut out = Vec::new();
    for range in reply.into_array("cluster slots").map_err(Error::Shape)? {
        let Value::Array(parts) = range else { return Err(bad()) };
        let Some(Value::Array(master)) = parts.get(2) else { return Err(bad()) };
        let (Some(Value::Bytes(host)), Some(Value::Int(port))) = (master.first(), master.get(1)) else {
            return Err(bad());
        };
        let master =
            Node { host: String::from_utf8_lossy(host).into_owned(), port: u16::try_from(*port).map_err(|_| bad())? };
        out.push(SlotRange { first: slot(parts.first())?, last: slot(parts.get(1))?, master });
    }
    Ok(out)
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
        redis::Value::ServerError(e) => {
            let msg = match e.details() {
                Some(d) => format!("{} {}", e.code(), d),
                None => e.code().to_string(),
            };
            return Err(ErrorReply::new(msg));
        }
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

#[cfg(test)]
mod tests {
    use redis::{ConnectionAddr, IntoConnectionInfo};

    use super::*;

    #[test]
    fn addresses_are_swapped_keeping_credentials_tls_and_database() {
        let template = "rediss://u:p%40x@a.example:7000/3".into_connection_info().unwrap();
        let node = with_address(&template, "::1:7001").unwrap();
        assert!(matches!(node.addr(), ConnectionAddr::TcpTls { host, port: 7001, .. } if host == "::1"));
        assert_eq!(node.redis_settings().db(), 3);
        assert_eq!(node.redis_settings().username(), Some("u"));
        assert_eq!(node.redis_settings().password(), Some("p@x"));
        let plain = with_address(&"redis://127.0.0.1:7000/".into_connection_info().unwrap(), "10.0.0.2:7002").unwrap();
        assert!(matches!(plain.addr(), ConnectionAddr::Tcp(h, 7002) if h == "10.0.0.2"));
        assert!(with_address(&template, "no-port").is_none());
    }

    #[test]
    fn only_calls_of_money_scripts_wait_for_replicas() {
        use redcount_core::script::ALL;
        let call = |verb: &str, first: &str| redis::cmd(verb).arg(first).arg(1).arg("rc:{c:x:y}").to_owned();
        let money = ["counter", "redpacket_create", "redpacket_grab"];
        for script in ALL {
            let waits = money.contains(&script.name());
            assert_eq!(waits_for_replicas(&call("EVALSHA", script.sha1())), waits, "EVALSHA {}", script.name());
            assert_eq!(waits_for_replicas(&call("evalsha", &script.sha1().to_uppercase())), waits, "{}", script.name());
            assert_eq!(waits_for_replicas(&call("EVAL", &script.source())), waits, "EVAL {}", script.name());
            assert!(!waits_for_replicas(&call("EVALSHA_RO", script.sha1())), "a read-only call never waits");
        }
        assert!(!waits_for_replicas(&redis::cmd("INCR").arg("k").to_owned()));
        assert!(!waits_for_replicas(&redis::cmd("EVAL").to_owned()));
    }

    #[test]
    fn a_wait_is_met_only_by_enough_replicas_answering() {
        let wait = ReplicaWait { replicas: 2, timeout: Duration::from_millis(100) };
        assert_eq!(wait.command().args_iter().count(), 3);
        assert!(wait.check(&redis::Value::Int(2)).is_ok() && wait.check(&redis::Value::Int(3)).is_ok());
        assert!(
            wait.check(&redis::Value::Int(1)).unwrap_err().contains("1 of 2 replicas acknowledged it within 100 ms")
        );
        let demoted = redis::parse_redis_value(b"-UNBLOCKED instance state changed (master -> replica?)\r\n").unwrap();
        assert!(matches!(demoted, redis::Value::ServerError(_)));
        assert!(wait.check(&demoted).is_err(), "a WAIT cut short by a demotion is not durable");
        assert!(wait.check(&redis::Value::Nil).is_err());
        let (reply, waited) =
            wait.split(redis::Value::Array(vec![redis::Value::Int(7), redis::Value::Int(2)])).unwrap();
        assert_eq!((reply, waited), (redis::Value::Int(7), redis::Value::Int(2)));
        assert!(wait.split(redis::Value::Int(7)).is_err());
        // Never `WAIT n 0`, which waits forever.
        let zero = ReplicaWait { replicas: 1, timeout: Duration::ZERO };
        let args: Vec<Vec<u8>> = zero
            .command()
            .args_iter()
            .map(|a| match a {
                redis::Arg::Simple(b) => b.to_vec(),
                _ => Vec::new(),
            })
            .collect();
        assert_eq!(args[2], b"1");
    }

    #[test]
    fn cluster_slots_are_read_with_each_master() {
        let node = |host: &str, port: i64, id: &str| {
            Value::Array(vec![Value::Bytes(host.into()), Value::Int(port), Value::Bytes(id.into())])
        };
        let reply = Value::Array(vec![
            Value::Array(vec![
                Value::Int(0),
                Value::Int(5460),
                node("10.0.0.1", 7000, "a"),
                node("10.0.0.4", 7003, "d"),
            ]),
            Value::Array(vec![Value::Int(5461), Value::Int(16383), node("10.0.0.2", 7001, "b")]),
        ]);
        let listed: Vec<String> = listed_nodes(&reply).iter().map(ToString::to_string).collect();
        assert_eq!(listed, ["10.0.0.1:7000", "10.0.0.4:7003", "10.0.0.2:7001"], "masters and replicas");
        let ranges = slot_ranges(reply).unwrap();
        assert_eq!(ranges.len(), 2);
        assert_eq!((ranges[0].first, ranges[0].last, ranges[0].master.to_string()), (0, 5460, "10.0.0.1:7000".into()));
        assert_eq!(ranges[1].master.to_string(), "10.0.0.2:7001");
        let bad = Value::Array(vec![Value::Array(vec![Value::Int(0), Value::Int(70_000), node("h", 1, "x")])]);
        assert!(slot_ranges(bad).is_err(), "a slot past 65535 is refused");
    }
}
