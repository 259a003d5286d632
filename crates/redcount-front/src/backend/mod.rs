//! The connections to Redis: a pool of connections each used by one request at a time, or a cluster
//! connection that routes by slot and follows MOVED/ASK.
//!
//! Several connections, not one: a slow command (a long script) then holds up only the
//! requests that share its connection, and the front's own SCRIPT KILL has a way in.
//!
//! A call that gives no reply fails with a [`Failed`], classified once where it was received:
//! the front's own conditions (a reply past its bound, the reply budget spent, a Cluster call
//! given up) are variants of their own, never text inside redis-rs's error.

mod cluster;
mod pool;

use std::fmt;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use redcount_cluster::{ClusterLink, Lanes, ReplicaWait};
use redis::{Cmd, ErrorKind, IntoConnectionInfo, Pipeline, RedisError, ServerErrorKind, Value};

use pool::{OnConnect, Pool, Shared};

/// Who a backend logs in as; `None` is the URL's own user.
#[derive(Clone)]
pub struct Login {
    pub user: String,
    pub password: String,
}

pub struct Backend {
    conns: Conns,
    /// The user its connections log in as, when not the URL's.
    login: Option<Login>,
    /// For connections logged in as a front-made user: how to make it again. A restarted
    /// Redis has forgotten the user (unless it saved its ACL), so a refused login is answered
    /// by making it again.
    restore: Option<Restore>,
    /// `--wait-replicas`: money calls wait for replicas.
    waits: Option<Waits>,
}

/// Makes a front-made user again; true once it is back.
pub type Remake = Arc<dyn Fn() -> Pin<Box<dyn std::future::Future<Output = bool> + Send>> + Send + Sync>;

/// How a backend's front-made user is made again.
enum Restore {
    /// This ACL SETUSER, sent on the URL-user connections given.
    Setuser(Cmd, Conns),
    /// This call (a token's user, derived from the operator's as it is now).
    Call(Remake),
}

/// How money calls wait for replicas, and on a Cluster the connections of their own they run
/// on (a WAIT holds its node connection until the replicas answer; elsewhere they run on the
/// pool, whose connections serve one request at a time).
struct Waits {
    wait: ReplicaWait,
    lanes: Option<Arc<Lanes<ClusterLink>>>,
}

#[derive(Clone)]
enum Conns {
    Single(Arc<Pool>, Arc<Shared>),
    /// With the time a call may take, redirections included.
    Cluster(ClusterLink, Duration),
}

/// Reading a reply larger than the bound: the request fails with this, naming the flag.
pub const TOO_LARGE: &str = "reply larger than --max-response-bytes";

/// A request refused because the budget of large replies in flight is spent.
pub const BUDGET_SPENT: &str = "too many large replies in flight (--max-inflight-response-bytes); retry shortly";

/// A call to Redis that gave no reply, classified once, where it was received.
#[derive(Debug)]
pub enum Failed {
    /// Connecting was refused: nothing was sent.
    Refused(RedisError),
    /// Redis refused a new connection's login: nothing was sent.
    Login(RedisError),
    /// redis-rs's error: Redis's error reply, or a connection that failed or ended after the
    /// command was sent (it may have run), or no answer within the response timeout.
    Redis(RedisError),
    /// The reply passed `bound` (`--max-response-bytes`) as it was read: the command ran, and
    /// its connection is closed.
    TooLarge {
        /// The bound, in bytes.
        bound: usize,
    },
    /// The budget of large replies in flight is spent (the command ran).
    BudgetSpent,
    /// No answer within the time limit: a Cluster call, or a call that waits for replicas
    /// that found no connection free for it.
    TimedOut,
    /// A Cluster call still redirected (MOVED, ASK) when its time ran out: it did not run.
    Redirected(RedisError),
    /// A Cluster call given up because its master cannot be reached (why, naming it); it may
    /// have run.
    Unreachable(String),
    /// A money call ran, but fewer replicas than `--wait-replicas` acknowledged its write in
    /// time (why).
    NotDurable(String),
}

impl Failed {
    /// A failure to open a connection: refused, a login refused (nothing sent either way), or
    /// anything else.
    fn connecting(e: RedisError) -> Failed {
        if e.is_connection_refusal() {
            Failed::Refused(e)
        } else if e.kind() == ErrorKind::AuthenticationFailed
            || matches!(e.code(), Some("WRONGPASS" | "NOAUTH" | "NOPERM"))
        {
            Failed::Login(e)
        } else {
            Failed::Redis(e)
        }
    }
}

impl fmt::Display for Failed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failed::Refused(e) | Failed::Login(e) | Failed::Redis(e) => e.fmt(f),
            Failed::TooLarge { bound } => write!(f, "{TOO_LARGE} ({bound} bytes)"),
            Failed::BudgetSpent => f.write_str(BUDGET_SPENT),
            Failed::TimedOut => f.write_str("no answer within the time limit"),
            Failed::Redirected(e) => write!(f, "Redis Cluster: still redirected at the time limit ({e})"),
            Failed::Unreachable(why) => write!(f, "Redis Cluster node unreachable: {why}"),
            Failed::NotDurable(why) => write!(f, "not known durable: {why}"),
        }
    }
}

/// What the replies a request has read hold of the front's budget of large replies in
/// flight; its response takes it over and gives it back once sent.
#[derive(Default)]
pub struct Held(Vec<tokio::sync::OwnedSemaphorePermit>);

impl Held {
    /// Keeps `permit`, if any.
    fn keep(&mut self, permit: Option<tokio::sync::OwnedSemaphorePermit>) {
        self.0.extend(permit);
    }
}

/// Which connections a request uses.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Lane {
    /// A connection of its own, reply bounded by `--max-response-bytes`.
    Bounded,
    /// A shared connection: only for replies small by construction.
    Small,
}

/// Awaits `$call` again (up to 3 times) while it fails in a way [`Backend::retry`] allows.
/// A macro, not a function taking an async closure: the futures must stay `Send`.
macro_rules! retried {
    ($backend:expr, $call:expr) => {{
        let mut tries = 0;
        loop {
            match $call.await {
                Err(e) if tries < 3 && Box::pin($backend.retry(&e)).await => tries += 1,
                other => break other,
            }
        }
    }};
}

/// Where a connection of its own (a subscriber's) goes: the first server of `url` (any node
/// of a Cluster hears every publication), as `login` when given.
pub fn pubsub_info(url: &str, login: Option<&Login>) -> Result<redis::ConnectionInfo, String> {
    let first = url.split(',').next().unwrap_or("").trim();
    let info = first.into_connection_info().map_err(|e| format!("ERR {e}"))?;
    Ok(logged_in(info, login))
}

/// `info` logging in as `login` when given (else as its URL says).
fn logged_in(info: redis::ConnectionInfo, login: Option<&Login>) -> redis::ConnectionInfo {
    match login {
        Some(l) => {
            let settings = info.redis_settings().clone().set_username(&l.user).set_password(&l.password);
            info.set_redis_settings(settings)
        }
        None => info,
    }
}

impl Backend {
    /// Whether this is a Redis Cluster's connection.
    pub fn is_cluster(&self) -> bool {
        matches!(self.conns, Conns::Cluster(..))
    }

    /// The user its connections log in as, when not the URL's.
    pub fn login(&self) -> Option<&Login> {
        self.login.as_ref()
    }

    /// Sends `cmds` to Redis whenever this backend makes a new connection: on that connection
    /// (`via` is `None`), or through `via`'s. Redis forgets its runtime configuration when it
    /// restarts; the front's connections then are new ones. (Not for `--cluster`.)
    pub fn on_connect(&self, cmds: Vec<Cmd>, via: Option<&Backend>) {
        if let Conns::Single(pool, _) = &self.conns {
            let made = match via.map(|b| &b.conns) {
                None => OnConnect::Here(cmds),
                Some(Conns::Single(other, _)) => OnConnect::Via(cmds, Box::new(other.info.clone())),
                Some(Conns::Cluster(..)) => return,
            };
            let _ = pool.on_connect.set(made);
        }
    }

    /// Charges replies read by this backend's own connections against `budget` (KiB).
    pub fn charge_replies(&self, budget: &Arc<tokio::sync::Semaphore>) {
        if let Conns::Single(pool, _) = &self.conns {
            let _ = pool.budget.set(budget.clone());
        }
    }

    /// Has the user made again by `setuser`, sent with `setup`'s connections, whenever Redis
    /// refuses this backend's login.
    pub fn restore_with(mut self, setuser: Cmd, setup: &Backend) -> Self {
        self.restore = Some(Restore::Setuser(setuser, setup.conns.clone()));
        self
    }

    /// Has the user made again by `remake` (true once it is back) whenever Redis refuses this
    /// backend's login.
    pub fn restore_by(mut self, remake: Remake) -> Self {
        self.restore = Some(Restore::Call(remake));
        self
    }

    /// Sends `cmd` for the front itself (set-up, checks): what its reply holds of the reply
    /// budget is given back at once.
    pub async fn query(&self, cmd: &Cmd) -> Result<Value, Failed> {
        self.query_in(cmd, Lane::Bounded, &mut Held::default()).await
    }

    /// Sends `cmd` on the connections of `lane`; what its reply holds of the reply budget goes
    /// to `held`.
    pub async fn query_in(&self, cmd: &Cmd, lane: Lane, held: &mut Held) -> Result<Value, Failed> {
        retried!(self, self.conns.query(cmd, lane, held))
    }

    /// How money calls wait for replicas (`--wait-replicas`), if they do.
    pub fn replica_wait(&self) -> Option<ReplicaWait> {
        self.waits.as_ref().map(|w| w.wait)
    }

    /// Whether `cmd` is sent with `WAIT` after it ([`Backend::query_waited`]): a call of one of
    /// redcount's money scripts, when money calls wait for replicas.
    pub fn waits_for(&self, cmd: &Cmd) -> bool {
        self.waits.is_some() && redcount_cluster::waits_for_replicas(cmd)
    }

    /// A money call, then `WAIT` on the same connection (on a Cluster, on connections of
    /// their own: a WAIT holds its node connection until the replicas answer): the call's reply
    /// and WAIT's, which says how many replicas have the write. An error reply of the call is
    /// its failure.
    pub async fn query_waited(&self, cmd: &Cmd, held: &mut Held) -> Result<(Value, Value), Failed> {
        let Some(waits) = &self.waits else { return Ok((self.query_in(cmd, Lane::Bounded, held).await?, Value::Nil)) };
        let (reply, waited) = retried!(self, self.conns.query_waited(cmd, waits, held))?;
        match reply {
            Value::ServerError(e) => Err(Failed::Redis(e.into())),
            reply => Ok((reply, waited)),
        }
    }

    /// On a Cluster, reads whether `cmd`'s first key exists (found by
    /// [`redcount_cluster::getkeys`]): that read follows a MOVED, so redis-rs's slot map learns
    /// where the key's slot went. A transaction's own MOVED does not teach it: the transaction
    /// is discarded whole (EXECABORT) and redis-rs never sees the redirection.
    pub async fn follow_slot_of(&self, cmd: &Cmd) {
        let Some(getkeys) = redcount_cluster::getkeys(cmd).filter(|_| self.is_cluster()) else { return };
        let Ok(keys) = self.query(&getkeys).await else { return };
        let Some(key) = redcount_cluster::first_key(keys) else { return };
        let _ = self.query(redis::cmd("EXISTS").arg(key)).await;
    }

    /// On a Cluster, the node the master of `cmd`'s first key names in an ASK: where the key
    /// went while its slot is migrated. `None` when it is still on its master, or anywhere else.
    pub async fn locate(&self, cmd: &Cmd) -> Option<redcount_cluster::Node> {
        let Conns::Cluster(link, _) = &self.conns else { return None };
        cluster::asked_node(link, cmd).await
    }

    /// On a Cluster, `pipe` as a transaction after ASKING, in one write, to `node`: its
    /// replies when it ran there, `None` when it was refused whole there too (nothing ran).
    pub async fn transaction_at(
        &self,
        pipe: &Pipeline,
        node: &redcount_cluster::Node,
    ) -> Result<Option<Vec<Value>>, Failed> {
        let Conns::Cluster(link, _) = &self.conns else { return Ok(None) };
        cluster::transaction_at(link, pipe, node).await
    }

    /// Runs a pipeline whose per-command errors come back inline (`ignore_errors`). `None`
    /// when nothing was sent because its commands' keys are in more than one slot: a Cluster
    /// client sends a pipeline to one node, and refuses one that spans slots before sending.
    pub async fn pipeline(&self, pipe: &Pipeline, lane: Lane, held: &mut Held) -> Result<Option<Value>, Failed> {
        match retried!(self, self.conns.pipeline(pipe, lane, held)) {
            // With `ignore_errors` a CROSSSLOT reply from Redis is an entry, not the whole
            // result: this one is the client's refusal.
            Err(Failed::Redis(e))
                if matches!(self.conns, Conns::Cluster(..))
                    && e.kind() == ErrorKind::Server(ServerErrorKind::CrossSlot) =>
            {
                Ok(None)
            }
            other => other.map(Some),
        }
    }

    /// Whether a failed call may be sent again: it never reached Redis (a connection refused;
    /// a login refused, once the user is made again). The failed connection is already
    /// closed, so the retry connects anew. (Not "broken pipe": redis-rs also says that of a
    /// command whose reply was lost after Redis ran it, and sending that again would apply a
    /// write twice. Connections known to have ended are replaced before sending instead.)
    async fn retry(&self, e: &Failed) -> bool {
        match (e, &self.restore) {
            (Failed::Refused(_), _) => true,
            (Failed::Login(_), Some(Restore::Setuser(setuser, via))) => {
                let mut held = Held::default();
                let made = match via.query(setuser, Lane::Bounded, &mut held).await {
                    Err(Failed::Refused(_)) => via.query(setuser, Lane::Bounded, &mut held).await,
                    r => r,
                };
                made.is_ok()
            }
            (Failed::Login(_), Some(Restore::Call(remake))) => remake().await,
            _ => false,
        }
    }

    /// Connects and checks with PING, so a wrong URL fails at start, not at the first request.
    pub async fn connect(
        url: &str,
        cluster: bool,
        timeout: Duration,
        login: Option<&Login>,
        connections: usize,
        max_reply: usize,
        wait: Option<ReplicaWait>,
    ) -> Result<Self, Failed> {
        // A connection made for a request (the shared ones are made on first use) may take as
        // long as the request may: a short stall of Redis is waited out, not a failure.
        let connect_timeout = timeout.max(Duration::from_secs(2));
        let (conns, waits) = if cluster {
            cluster::connect(url, login, connect_timeout, timeout, wait).await.map_err(Failed::connecting)?
        } else {
            let info = logged_in(url.into_connection_info().map_err(Failed::Redis)?, login);
            let pool = Pool::new(info, connections, connect_timeout, timeout, max_reply);
            let waits = wait.map(|wait| Waits { wait, lanes: None });
            (Conns::Single(Arc::new(pool), Arc::new(Shared::new(shared_connections()))), waits)
        };
        conns.query(&redis::cmd("PING"), Lane::Bounded, &mut Held::default()).await?;
        Ok(Backend { conns, login: login.cloned(), restore: None, waits })
    }
}

impl Conns {
    async fn query(&self, cmd: &Cmd, lane: Lane, held: &mut Held) -> Result<Value, Failed> {
        match (self, lane) {
            (Conns::Single(pool, _), Lane::Bounded) => pool.run(held, async |c| cmd.query_async(c).await).await,
            (Conns::Single(pool, shared), Lane::Small) => shared.run(pool, async |c| cmd.query_async(c).await).await,
            (Conns::Cluster(c, timeout), _) => Box::pin(cluster::call(c, cmd, *timeout)).await,
        }
    }

    /// A money call, then `WAIT` in the same write on the same connection: both replies (an
    /// error reply of the call as a value).
    async fn query_waited(&self, cmd: &Cmd, waits: &Waits, held: &mut Held) -> Result<(Value, Value), Failed> {
        match (self, &waits.lanes) {
            (Conns::Cluster(_, timeout), Some(lanes)) => {
                let Ok(lane) = tokio::time::timeout(*timeout, lanes.lease()).await else {
                    return Err(Failed::TimedOut);
                };
                Box::pin(cluster::call_waited(&lane, cmd, &waits.wait, *timeout)).await
            }
            (Conns::Single(pool, _), _) => {
                let pipe = waits.wait.pipeline(cmd);
                let replies = pool.run(held, async |c| pipe.query_async::<Value>(c).await).await?;
                waits.wait.split(replies).map_err(|e| Failed::Redis(RedisError::from(io::Error::other(e))))
            }
            (Conns::Cluster(..), None) => Ok((self.query(cmd, Lane::Bounded, held).await?, Value::Nil)),
        }
    }

    async fn pipeline(&self, pipe: &Pipeline, lane: Lane, held: &mut Held) -> Result<Value, Failed> {
        match (self, lane) {
            (Conns::Single(pool, _), Lane::Bounded) => pool.run(held, async |c| pipe.query_async(c).await).await,
            (Conns::Single(pool, shared), Lane::Small) => shared.run(pool, async |c| pipe.query_async(c).await).await,
            // Only a transaction (MULTI/EXEC: all or nothing, so an aborted one ran nothing);
            // a pipeline's entries go one by one (`Backend::is_cluster`).
            (Conns::Cluster(c, _), _) => {
                c.with(async |mut c| pipe.query_async::<Value>(&mut c).await).await.map_err(Failed::Redis)
            }
        }
    }
}

/// A Redis URL with any password replaced, for messages and logs.
pub fn redact(url: &str) -> String {
    url.split(',')
        .map(|u| match (u.find("://"), u.rfind('@')) {
            (Some(s), Some(at)) if at > s => format!("{}://***@{}", &u[..s], &u[at + 1..]),
            _ => u.to_string(),
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// How many pipelined connections the small-reply lane spreads over: one on a one-thread
/// runtime (`--threads 1`), where more only split each write to Redis, and each read of its
/// replies, into several syscalls (on the front and on Redis); four on a multi-thread runtime,
/// so that one connection's driver task does not carry every worker's commands.
fn shared_connections() -> usize {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::CurrentThread) => 1,
        _ => 4,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn redacts_passwords() {
        assert_eq!(super::redact("redis://:secret@h:1/0"), "redis://***@h:1/0");
        assert_eq!(super::redact("redis://u:p@a:1,redis://b:2"), "redis://***@a:1,redis://b:2");
        assert_eq!(super::redact("redis://h:1"), "redis://h:1");
    }
}
