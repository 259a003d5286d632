//! The connections to Redis: a pool of connections each used by one request at a time, or a cluster
//! connection that routes by slot and follows MOVED/ASK.
//!
//! Several connections, not one: a slow command (a long script) then holds up only the
//! requests that share its connection, and the front's own SCRIPT KILL has a way in.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use redcount_cluster::{ClusterLink, Lanes, ReplicaWait};
use redis::aio::ConnectionLike;
use redis::aio::MultiplexedConnection;
use redis::cluster::ClusterClientBuilder;
use redis::cluster_routing::SingleNodeRoutingInfo;
use redis::{AsyncConnectionConfig, ConnectionAddr};
use redis::{Cmd, ErrorKind, IntoConnectionInfo, Pipeline, RedisError, RedisResult, ServerErrorKind, Value};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

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
    /// For connections logged in as a front-made user: the ACL SETUSER that makes it, and
    /// the URL-user connections to send it on. A restarted Redis has forgotten the user
    /// (unless it saved its ACL), so a refused login is answered by making it again.
    restore: Option<(Cmd, Conns)>,
    /// `--wait-replicas`: money calls wait for replicas.
    waits: Option<Waits>,
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

/// A few connections that many requests share at once (commands pipelined by redis-rs):
/// fewer reads and writes for Redis, so more throughput, but no reply bound. Only for
/// requests whose replies are small by construction (redcount's own scripts).
struct Shared {
    conns: Vec<tokio::sync::Mutex<Option<Conn>>>,
    next: AtomicUsize,
}

impl Shared {
    async fn get(&self, pool: &Pool) -> RedisResult<(usize, MultiplexedConnection)> {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.conns.len();
        let mut slot = self.conns[i].lock().await;
        if slot.as_ref().is_some_and(|c| c.closed.load(Ordering::Relaxed)) {
            *slot = None;
        }
        if slot.is_none() {
            *slot = Some(Box::pin(pool.dial(usize::MAX)).await?);
        }
        Ok((i, slot.as_ref().expect("made above").conn.clone()))
    }

    /// Runs `call` on a shared connection; one that failed other than by an error reply is
    /// dropped, and made again by its next use.
    async fn run<T>(
        &self,
        pool: &Pool,
        call: impl AsyncFnOnce(&mut MultiplexedConnection) -> RedisResult<T>,
    ) -> RedisResult<T> {
        let (i, mut conn) = self.get(pool).await?;
        let result = call(&mut conn).await;
        if let Err(e) = &result
            && (e.code().is_none() || e.is_io_error())
        {
            *self.conns[i].lock().await = None;
        }
        result
    }
}

/// Connections to one Redis, each used by one request at a time, so everything a connection
/// reads while a request holds it is that request's reply: counted as it arrives and cut off
/// past the reply bound, without harming another request. A connection that failed, was
/// abandoned mid-request (a timeout) or overran the bound is closed and made again on its
/// next use.
struct Pool {
    slots: Vec<tokio::sync::Mutex<Option<Conn>>>,
    free: std::sync::Mutex<Vec<usize>>,
    permits: tokio::sync::Semaphore,
    info: redis::ConnectionInfo,
    connect_timeout: Duration,
    response_timeout: Duration,
    max_reply: usize,
    /// Commands for every new connection's Redis (a restarted Redis has lost its runtime
    /// configuration, such as the front's busy-reply-threshold).
    on_connect: std::sync::OnceLock<OnConnect>,
    /// The front's budget of large replies in flight, if it has one.
    budget: std::sync::OnceLock<Arc<tokio::sync::Semaphore>>,
}

/// What a pool sends when it has made a new connection.
enum OnConnect {
    /// On the new connection itself (its user may).
    Here(Vec<Cmd>),
    /// On a connection to this address as another user (the URL's): the new one's may not.
    Via(Vec<Cmd>, Box<redis::ConnectionInfo>),
}

struct Conn {
    conn: MultiplexedConnection,
    read: Arc<AtomicUsize>,
    charge: Arc<Mutex<Charge>>,
    /// Set once the stream has ended (Redis closed it, or restarted): never send on it again.
    closed: Arc<AtomicBool>,
}

/// Reading a reply larger than the bound: the request fails with this, naming the flag.
pub const TOO_LARGE: &str = "reply larger than --max-response-bytes";

/// A Redis stream that counts the bytes it reads and fails past `limit`, and says when it
/// has ended. (redis-rs's driver reads all the time, so an end is seen as it happens.)
struct Counted<S> {
    inner: S,
    read: Arc<AtomicUsize>,
    limit: usize,
    closed: Arc<AtomicBool>,
    charge: Arc<Mutex<Charge>>,
}

/// Replies being read count against the front's budget of large replies in flight, as they
/// arrive: many requests at once cannot each read their bound before anything says no.
#[derive(Default)]
struct Charge {
    budget: Option<Arc<tokio::sync::Semaphore>>,
    /// Bytes read free of charge (small replies), then bytes not yet charged (under 1 KiB).
    free: usize,
    owed: usize,
    held: Option<tokio::sync::OwnedSemaphorePermit>,
    refused: bool,
}

impl Charge {
    /// Charges `n` more bytes; false when the budget is spent.
    fn add(&mut self, n: usize) -> bool {
        let Some(budget) = &self.budget else { return true };
        let free = n.min(self.free);
        self.free -= free;
        self.owed += n - free;
        let kib = self.owed / 1024;
        if kib == 0 {
            return true;
        }
        match budget.clone().try_acquire_many_owned(u32::try_from(kib).unwrap_or(u32::MAX)) {
            Ok(p) => {
                self.owed -= kib * 1024;
                match &mut self.held {
                    Some(h) => h.merge(p),
                    None => self.held = Some(p),
                }
                true
            }
            Err(_) => {
                self.refused = true;
                false
            }
        }
    }
}

/// A Cluster call given up because its master does not accept connections (the text that
/// follows names it).
pub const NODE_DOWN: &str = "Redis Cluster node unreachable";

/// A Cluster call still redirected (MOVED, ASK) when its time ran out: it did not run.
pub const REDIRECTED: &str = "Redis Cluster: still redirected at the time limit";

/// A money call whose write fewer replicas than `--wait-replicas` acknowledged in time (the
/// text that follows says how many).
pub const NOT_DURABLE: &str = "NOTDURABLE";

/// A request refused because the budget of large replies in flight is spent.
pub const BUDGET_SPENT: &str = "too many large replies in flight (--max-inflight-response-bytes); retry shortly";

tokio::task_local! {
    /// What the replies a request has read hold of the budget; the response takes it over.
    pub static REPLY_PERMITS: std::cell::RefCell<Vec<tokio::sync::OwnedSemaphorePermit>>;
}

impl<S: AsyncRead + Unpin> AsyncRead for Counted<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let room = buf.remaining() > 0;
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        match &polled {
            Poll::Ready(Ok(())) => {
                let n = buf.filled().len() - before;
                if n == 0 && room {
                    this.closed.store(true, Ordering::Relaxed);
                }
                if this.read.fetch_add(n, Ordering::Relaxed) + n > this.limit {
                    this.closed.store(true, Ordering::Relaxed);
                    return Poll::Ready(Err(io::Error::other(TOO_LARGE)));
                }
                if n > 0 && !this.charge.lock().unwrap_or_else(|e| e.into_inner()).add(n) {
                    this.closed.store(true, Ordering::Relaxed);
                    return Poll::Ready(Err(io::Error::other(BUDGET_SPENT)));
                }
            }
            Poll::Ready(Err(_)) => this.closed.store(true, Ordering::Relaxed),
            Poll::Pending => {}
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Counted<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, data)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// A checked-out slot; gives it back on drop, closing its connection unless the request
/// finished cleanly (a reply may still be on its way, and would be charged to the next).
struct Lease<'a> {
    pool: &'a Pool,
    index: usize,
    slot: tokio::sync::MutexGuard<'a, Option<Conn>>,
    _permit: tokio::sync::SemaphorePermit<'a>,
    clean: bool,
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        if !self.clean {
            *self.slot = None;
        }
        self.pool.free.lock().unwrap_or_else(|e| e.into_inner()).push(self.index);
    }
}

impl Pool {
    fn new(
        info: redis::ConnectionInfo,
        size: usize,
        connect_timeout: Duration,
        response_timeout: Duration,
        max_reply: usize,
    ) -> Self {
        let size = size.max(1);
        Pool {
            slots: (0..size).map(|_| tokio::sync::Mutex::new(None)).collect(),
            free: std::sync::Mutex::new((0..size).rev().collect()),
            permits: tokio::sync::Semaphore::new(size),
            info,
            connect_timeout,
            response_timeout,
            max_reply,
            on_connect: std::sync::OnceLock::new(),
            budget: std::sync::OnceLock::new(),
        }
    }

    async fn lease(&self) -> Lease<'_> {
        let permit = self.permits.acquire().await.expect("the pool's semaphore is never closed");
        let index = self.free.lock().unwrap_or_else(|e| e.into_inner()).pop().expect("a permit means a free slot");
        let slot = self.slots[index].lock().await;
        Lease { pool: self, index, slot, _permit: permit, clean: false }
    }

    async fn connect(&self) -> RedisResult<Conn> {
        self.dial(self.max_reply).await
    }

    /// A new connection whose reads fail past `limit` bytes (since its counter was reset),
    /// after the pool's on-connect commands.
    async fn dial(&self, limit: usize) -> RedisResult<Conn> {
        let mut made = open(&self.info, limit, self.connect_timeout, self.response_timeout).await?;
        match self.on_connect.get() {
            Some(OnConnect::Here(cmds)) => {
                for cmd in cmds {
                    let _ = cmd.query_async::<Value>(&mut made.conn).await;
                }
            }
            Some(OnConnect::Via(cmds, via)) => {
                // A connection of the URL's user for just this, closed after.
                if let Ok(mut other) = open(via, usize::MAX, self.connect_timeout, self.response_timeout).await {
                    for cmd in cmds {
                        let _ = cmd.query_async::<Value>(&mut other.conn).await;
                    }
                }
            }
            None => {}
        }
        made.read.store(0, Ordering::Relaxed);
        Ok(made)
    }

    /// Runs `call` on a connection of its own, made first if needed.
    async fn run<T>(&self, call: impl AsyncFnOnce(&mut MultiplexedConnection) -> RedisResult<T>) -> RedisResult<T> {
        let mut lease = self.lease().await;
        // A connection known to have ended is not sent on: Redis restarted or closed it.
        if lease.slot.as_ref().is_some_and(|c| c.closed.load(Ordering::Relaxed)) {
            *lease.slot = None;
        }
        if lease.slot.is_none() {
            *lease.slot = Some(Box::pin(self.connect()).await?);
        }
        let conn = lease.slot.as_mut().expect("made above");
        conn.read.store(0, Ordering::Relaxed);
        *conn.charge.lock().unwrap_or_else(|e| e.into_inner()) =
            Charge { budget: self.budget.get().cloned(), free: 16 * 1024, ..Charge::default() };
        let result = call(&mut conn.conn).await;
        let (held, refused) = {
            let mut c = conn.charge.lock().unwrap_or_else(|e| e.into_inner());
            (c.held.take(), c.refused)
        };
        if let Some(p) = held {
            let _ = REPLY_PERMITS.try_with(|v| v.borrow_mut().push(p));
        }
        if refused {
            return Err(io::Error::other(BUDGET_SPENT).into());
        }
        if conn.read.load(Ordering::Relaxed) > self.max_reply {
            // Whatever redis-rs made of the cut-off stream, say what happened (and never
            // "broken pipe": the command did run, it must not be sent again).
            return Err(io::Error::other(format!("{TOO_LARGE} ({} bytes)", self.max_reply)).into());
        }
        // A Redis error reply leaves the connection usable; anything else closes it.
        lease.clean = match &result {
            Ok(_) => true,
            Err(e) => e.code().is_some() && !e.is_io_error(),
        };
        result
    }
}

/// The TLS client for `rediss://`: the system's roots (`SSL_CERT_FILE` names another bundle),
/// built once.
fn tls_connector() -> io::Result<tokio_rustls::TlsConnector> {
    static CONFIG: std::sync::OnceLock<Result<Arc<rustls::ClientConfig>, String>> = std::sync::OnceLock::new();
    let config = CONFIG.get_or_init(|| {
        let mut roots = rustls::RootCertStore::empty();
        let found = rustls_native_certs::load_native_certs();
        for cert in found.certs {
            let _ = roots.add(cert);
        }
        if roots.is_empty() {
            return Err(format!("no trusted root certificates found (SSL_CERT_FILE?): {:?}", found.errors));
        }
        Ok(Arc::new(rustls::ClientConfig::builder().with_root_certificates(roots).with_no_client_auth()))
    });
    match config {
        Ok(c) => Ok(tokio_rustls::TlsConnector::from(c.clone())),
        Err(e) => Err(io::Error::other(e.clone())),
    }
}

/// Connects to `info` with a stream that fails past `limit` bytes read.
async fn open(
    info: &redis::ConnectionInfo,
    limit: usize,
    connect_timeout: Duration,
    response_timeout: Duration,
) -> RedisResult<Conn> {
    let read = Arc::new(AtomicUsize::new(0));
    let closed = Arc::new(AtomicBool::new(false));
    let charge = Arc::new(Mutex::new(Charge::default()));
    let config = AsyncConnectionConfig::new().set_response_timeout(Some(response_timeout));
    let redis = info.redis_settings();
    let dial = async {
        match info.addr() {
            ConnectionAddr::Tcp(host, port) => {
                let tcp = tokio::net::TcpStream::connect((host.as_str(), *port)).await?;
                let _ = tcp.set_nodelay(true);
                let stream =
                    Counted { inner: tcp, read: read.clone(), limit, closed: closed.clone(), charge: charge.clone() };
                spawned(MultiplexedConnection::new_with_config(redis, stream, config).await?)
            }
            ConnectionAddr::TcpTls { host, port, insecure, .. } => {
                if *insecure {
                    return Err(redis::RedisError::from((
                        redis::ErrorKind::InvalidClientConfig,
                        "rediss:// with #insecure is refused: trust Redis's CA instead (SSL_CERT_FILE)",
                    )));
                }
                let tcp = tokio::net::TcpStream::connect((host.as_str(), *port)).await?;
                let _ = tcp.set_nodelay(true);
                let name = rustls::pki_types::ServerName::try_from(host.clone())
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("{host}: {e}")))?;
                let tls = tls_connector()?.connect(name, tcp).await?;
                let stream =
                    Counted { inner: tls, read: read.clone(), limit, closed: closed.clone(), charge: charge.clone() };
                spawned(MultiplexedConnection::new_with_config(redis, stream, config).await?)
            }
            ConnectionAddr::Unix(path) => {
                let unix = tokio::net::UnixStream::connect(path).await?;
                let stream =
                    Counted { inner: unix, read: read.clone(), limit, closed: closed.clone(), charge: charge.clone() };
                spawned(MultiplexedConnection::new_with_config(redis, stream, config).await?)
            }
            other => Err(redis::RedisError::from((
                redis::ErrorKind::InvalidClientConfig,
                "redcount-rest connects over TCP or a Unix socket",
                format!("{other}"),
            ))),
        }
    };
    match tokio::time::timeout(connect_timeout, dial).await {
        Ok(c) => Ok(Conn { conn: c?, read, charge, closed }),
        Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, "connecting to Redis timed out").into()),
    }
}

/// Starts the connection's driver task; the connection ends when its stream does.
fn spawned<F: std::future::Future<Output = ()> + Send + 'static>(
    made: (MultiplexedConnection, F),
) -> RedisResult<MultiplexedConnection> {
    tokio::spawn(made.1);
    Ok(made.0)
}

/// The command was never sent: the connection was refused. (Not "broken pipe": redis-rs
/// also says that of a command whose reply was lost after Redis ran it, and sending that
/// again would apply a write twice. Connections known to have ended are replaced before
/// sending instead.)
fn known_dead(e: &redis::RedisError) -> bool {
    e.is_connection_refusal()
}

fn login_refused(e: &redis::RedisError) -> bool {
    e.kind() == redis::ErrorKind::AuthenticationFailed
        || matches!(e.code(), Some("WRONGPASS" | "NOAUTH" | "NOPERM")) && e.to_string().contains("user")
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
    /// The user its connections log in as, when not the URL's.
    pub fn is_cluster(&self) -> bool {
        matches!(self.conns, Conns::Cluster(..))
    }

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
        self.restore = Some((setuser, setup.conns.clone()));
        self
    }

    pub async fn query(&self, cmd: &Cmd) -> RedisResult<Value> {
        self.query_in(cmd, Lane::Bounded).await
    }

    /// [`Backend::query`] on the connections of `lane` (a money call that waits for replicas
    /// on connections of its own whatever the lane).
    pub async fn query_in(&self, cmd: &Cmd, lane: Lane) -> RedisResult<Value> {
        if let Some(waits) = &self.waits
            && redcount_cluster::waits_for_replicas(cmd)
        {
            return retried!(self, self.conns.query_waited(cmd, waits));
        }
        retried!(self, self.conns.query(cmd, lane))
    }

    /// On a Cluster, reads whether `cmd`'s first key exists (found by
    /// [`redcount_cluster::getkeys`]): that read follows a MOVED, so redis-rs's slot map learns
    /// where the key's slot went. A transaction's own MOVED does not teach it: the transaction
    /// is discarded whole (EXECABORT) and redis-rs never sees the redirection.
    pub async fn follow_slot_of(&self, cmd: &Cmd) {
        let Some(getkeys) = redcount_cluster::getkeys(cmd).filter(|_| self.is_cluster()) else { return };
        let Ok(keys) = self.query_in(&getkeys, Lane::Bounded).await else { return };
        let Some(key) = redcount_cluster::first_key(keys) else { return };
        let _ = self.query_in(redis::cmd("EXISTS").arg(key), Lane::Bounded).await;
    }

    /// Runs a pipeline whose per-command errors come back inline (`ignore_errors`). `None`
    /// when nothing was sent because its commands' keys are in more than one slot: a Cluster
    /// client sends a pipeline to one node, and refuses one that spans slots before sending.
    pub async fn pipeline(&self, pipe: &Pipeline, lane: Lane) -> RedisResult<Option<Value>> {
        match retried!(self, self.conns.pipeline(pipe, lane)) {
            // With `ignore_errors` a CROSSSLOT reply from Redis is an entry, not the whole
            // result: this one is the client's refusal.
            Err(e)
                if matches!(self.conns, Conns::Cluster(..))
                    && e.kind() == ErrorKind::Server(ServerErrorKind::CrossSlot) =>
            {
                Ok(None)
            }
            other => other.map(Some),
        }
    }

    /// Whether a failed call may be sent again: it never reached Redis (a connection known
    /// dead; a login refused, once the user is made again). The failed connection is
    /// already closed, so the retry connects anew.
    async fn retry(&self, e: &redis::RedisError) -> bool {
        if known_dead(e) {
            return true;
        }
        match &self.restore {
            Some((setuser, via)) if login_refused(e) => {
                let made = match via.query(setuser, Lane::Bounded).await {
                    Err(e) if known_dead(&e) => via.query(setuser, Lane::Bounded).await,
                    r => r,
                };
                made.is_ok()
            }
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
    ) -> RedisResult<Self> {
        // A connection made for a request (the shared ones are made on first use) may take as
        // long as the request may: a short stall of Redis is waited out, not a failure.
        let connect_timeout = timeout.max(Duration::from_secs(2));
        let waits;
        let backend = if cluster {
            let seeds = url
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|s| s.into_connection_info().map(|info| logged_in(info, login)))
                .collect::<RedisResult<Vec<_>>>()?;
            // The login goes in the seeds' settings, so the link's own connections to one node
            // (its probe of a node that refuses the login) log in as its Cluster connection does.
            let builder = move |nodes: Vec<redis::ConnectionInfo>| {
                ClusterClientBuilder::new(nodes)
                    .connection_timeout(connect_timeout)
                    .response_timeout(timeout)
                    // No resending by redis-rs: it would send a command again after a lost reply
                    // (a write twice), and a whole pipeline again after one entry's ASK (the
                    // entries that had run, twice). Redirections are followed by `cluster_call`.
                    .retries(0)
            };
            let mut lanes = Vec::new();
            for _ in wait.iter().flat_map(|_| 0..redcount_cluster::WAIT_LANES) {
                lanes.push(ClusterLink::connect(seeds.clone(), builder).await?);
            }
            waits = wait.map(|wait| Waits { wait, lanes: Some(Arc::new(Lanes::new(lanes))) });
            Conns::Cluster(ClusterLink::connect(seeds, builder).await?, timeout)
        } else {
            waits = wait.map(|wait| Waits { wait, lanes: None });
            let info = logged_in(url.into_connection_info()?, login);
            let shared =
                Shared { conns: (0..4).map(|_| tokio::sync::Mutex::new(None)).collect(), next: AtomicUsize::new(0) };
            Conns::Single(Arc::new(Pool::new(info, connections, connect_timeout, timeout, max_reply)), Arc::new(shared))
        };
        backend.query(&redis::cmd("PING"), Lane::Bounded).await?;
        Ok(Backend { conns: backend, login: login.cloned(), restore: None, waits })
    }
}

impl Conns {
    async fn query(&self, cmd: &Cmd, lane: Lane) -> RedisResult<Value> {
        match (self, lane) {
            (Conns::Single(pool, _), Lane::Bounded) => pool.run(async |c| cmd.query_async(c).await).await,
            (Conns::Single(pool, shared), Lane::Small) => shared.run(pool, async |c| cmd.query_async(c).await).await,
            (Conns::Cluster(c, timeout), _) => Box::pin(cluster_call(c, cmd, *timeout)).await,
        }
    }

    /// A money call, then `WAIT` on the same connection: its reply when enough replicas have
    /// its write, else an error saying [`NOT_DURABLE`] (an error reply is the answer as is).
    async fn query_waited(&self, cmd: &Cmd, waits: &Waits) -> RedisResult<Value> {
        let not_durable = |why: String| RedisError::from(io::Error::other(format!("{NOT_DURABLE} {why}")));
        match (self, &waits.lanes) {
            (Conns::Cluster(_, timeout), Some(lanes)) => {
                let Ok(lane) = tokio::time::timeout(*timeout, lanes.lease()).await else {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "no connection for calls that wait for replicas came free in time",
                    )
                    .into());
                };
                match redcount_cluster::cluster_call_waited(&lane, cmd, &waits.wait, inside(*timeout)).await {
                    Err(redcount_cluster::Stop::NotDurable(why)) => Err(not_durable(why)),
                    other => stopped(other),
                }
            }
            (Conns::Single(pool, _), _) => {
                let pipe = waits.wait.pipeline(cmd);
                let replies = pool.run(async |c| pipe.query_async::<Value>(c).await).await?;
                let (reply, waited) = waits.wait.split(replies).map_err(|e| RedisError::from(io::Error::other(e)))?;
                if let Value::ServerError(e) = reply {
                    return Err(e.into());
                }
                waits.wait.check(&waited).map_err(not_durable)?;
                Ok(reply)
            }
            (Conns::Cluster(..), None) => self.query(cmd, Lane::Bounded).await,
        }
    }

    async fn pipeline(&self, pipe: &Pipeline, lane: Lane) -> RedisResult<Value> {
        match (self, lane) {
            (Conns::Single(pool, _), Lane::Bounded) => pool.run(async |c| pipe.query_async(c).await).await,
            (Conns::Single(pool, shared), Lane::Small) => shared.run(pool, async |c| pipe.query_async(c).await).await,
            // Only a transaction (MULTI/EXEC: all or nothing, so an aborted one ran nothing);
            // a pipeline's entries go one by one (`Backend::is_cluster`).
            (Conns::Cluster(c, _), _) => Box::pin(cluster_transaction(c, pipe)).await,
        }
    }
}

/// A transaction on a Cluster, to the master of its keys. Redis discards it whole (EXECABORT,
/// nothing ran) when its slot is being migrated and its keys have left for the importing node:
/// each queued command was answered ASK. Then it is sent once to that node, after ASKING, in
/// the same write (ASKING holds through MULTI … EXEC), where Redis runs it if it has every key
/// it names, and otherwise refuses it whole again (TRYAGAIN). When that second try ran nothing
/// either, the first EXECABORT is the answer (the caller sends it again within its limit).
async fn cluster_transaction(link: &ClusterLink, pipe: &Pipeline) -> RedisResult<Value> {
    let first = link.with(async |mut c| pipe.query_async::<Value>(&mut c).await).await;
    let Err(aborted) = &first else { return first };
    if aborted.code() != Some("EXECABORT") {
        return first;
    }
    // Where the first key is now: its master answers ASK with the importing node while the
    // key has left, a plain answer while it is still there.
    let Some(key) = async {
        let getkeys = redcount_cluster::getkeys(pipe.cmd_iter().next()?)?;
        let keys = link.with(async |mut c| c.req_packed_command(&getkeys).await).await.ok()?;
        redcount_cluster::first_key(keys)
    }
    .await
    else {
        return first;
    };
    let exists = redis::cmd("EXISTS").arg(&key).to_owned();
    let Err(asked) = link.with(async |mut c| c.req_packed_command(&exists).await).await else { return first };
    let Some((host, port)) = asked
        .redirect_node()
        .filter(|_| asked.kind() == ErrorKind::Server(ServerErrorKind::Ask))
        .and_then(|(addr, _)| addr.rsplit_once(':'))
        .and_then(|(h, p)| Some((h.to_string(), p.parse::<u16>().ok()?)))
    else {
        return first;
    };
    let mut there = redis::pipe();
    there.cmd("ASKING").cmd("MULTI");
    for c in pipe.cmd_iter() {
        there.add_command(c.clone());
    }
    there.cmd("EXEC");
    let n = pipe.cmd_iter().count();
    let route = SingleNodeRoutingInfo::ByAddress { host, port };
    let exec = link.with(async |mut c| c.route_pipeline(there, n + 2, 1, route).await).await;
    match exec.map(|mut v| v.pop()) {
        Ok(Some(Value::Array(items))) => Ok(Value::Array(items)),
        // Refused whole there too (a key still on the other node: TRYAGAIN; a command refused
        // when queued: EXECABORT): nothing ran.
        Ok(Some(Value::ServerError(_))) => first,
        Err(e) if e.code().is_some() => first,
        // The answer was lost: it may have run, so it is not sent again.
        Err(e) => Err(e),
        Ok(other) => {
            Err(RedisError::from((ErrorKind::UnexpectedReturnType, "unexpected EXEC reply", format!("{other:?}"))))
        }
    }
}

/// [`redcount_cluster::cluster_call`] with a redis-rs error: the front classifies those. It
/// ends a moment before the front's own limit, so a Cluster that answered only CLUSTERDOWN or
/// TRYAGAIN all along is answered as such (503), not as no answer (504).
async fn cluster_call(conn: &ClusterLink, cmd: &Cmd, timeout: Duration) -> RedisResult<Value> {
    stopped(redcount_cluster::cluster_call(conn, cmd, inside(timeout)).await)
}

/// A Cluster call's limit inside the front's own (see [`cluster_call`]).
fn inside(timeout: Duration) -> Duration {
    timeout.saturating_sub(Duration::from_millis(50)).max(timeout / 2)
}

/// A Cluster call's outcome as a redis-rs result.
fn stopped(outcome: Result<Value, redcount_cluster::Stop>) -> RedisResult<Value> {
    use redcount_cluster::Stop;
    match outcome {
        Ok(v) => Ok(v),
        Err(Stop::Failed(e)) => Err(e),
        // Not Redis's MOVED as the client's error (400): the Cluster could not serve it in time.
        Err(Stop::Redirected(e)) => Err(io::Error::other(format!("{REDIRECTED} ({e})")).into()),
        Err(Stop::TimedOut) => {
            Err(io::Error::new(io::ErrorKind::TimedOut, "Redis Cluster: no answer within the time limit").into())
        }
        // Not a refusal: that would be sent again (`known_dead`), and this one may have run.
        Err(Stop::Unreachable(why)) => Err(io::Error::other(format!("{NODE_DOWN}: {why}")).into()),
        Err(Stop::NotDurable(why)) => Err(io::Error::other(format!("{NOT_DURABLE} {why}")).into()),
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

#[cfg(test)]
mod tests {
    #[test]
    fn redacts_passwords() {
        assert_eq!(super::redact("redis://:secret@h:1/0"), "redis://***@h:1/0");
        assert_eq!(super::redact("redis://u:p@a:1,redis://b:2"), "redis://***@a:1,redis://b:2");
        assert_eq!(super::redact("redis://h:1"), "redis://h:1");
    }
}
