//! Connections to one Redis: a pool whose connections each serve one request at a time (its
//! reply counted and bounded as it is read), and a few shared, pipelined ones for replies small
//! by construction.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Cmd, ConnectionAddr, RedisResult, Value};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::{Failed, Held};

/// A few connections that many requests share at once (commands pipelined by redis-rs):
/// fewer reads and writes for Redis, so more throughput, but no reply bound. Only for
/// requests whose replies are small by construction (redcount's own scripts).
pub(super) struct Shared {
    conns: Vec<tokio::sync::Mutex<Option<Conn>>>,
    next: AtomicUsize,
}

impl Shared {
    /// `n` shared connections, made on first use.
    pub(super) fn new(n: usize) -> Self {
        Shared { conns: (0..n).map(|_| tokio::sync::Mutex::new(None)).collect(), next: AtomicUsize::new(0) }
    }

    async fn get(&self, pool: &Pool) -> Result<(usize, MultiplexedConnection), Failed> {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.conns.len();
        let mut slot = self.conns[i].lock().await;
        if slot.as_ref().is_some_and(|c| c.closed.load(Ordering::Relaxed)) {
            *slot = None;
        }
        if slot.is_none() {
            // No timer of redis-rs's own per command: every request on these connections runs
            // under the request's timeout already.
            *slot = Some(Box::pin(pool.dial(usize::MAX, None)).await?);
        }
        Ok((i, slot.as_ref().expect("made above").conn.clone()))
    }

    /// Runs `call` on a shared connection; one that failed other than by an error reply is
    /// dropped, and made again by its next use.
    pub(super) async fn run<T>(
        &self,
        pool: &Pool,
        call: impl AsyncFnOnce(&mut MultiplexedConnection) -> RedisResult<T>,
    ) -> Result<T, Failed> {
        let (i, mut conn) = self.get(pool).await?;
        let result = call(&mut conn).await;
        if let Err(e) = &result
            && (e.code().is_none() || e.is_io_error())
        {
            *self.conns[i].lock().await = None;
        }
        result.map_err(Failed::Redis)
    }
}

/// Connections to one Redis, each used by one request at a time, so everything a connection
/// reads while a request holds it is that request's reply: counted as it arrives and cut off
/// past the reply bound, without harming another request. A connection that failed, was
/// abandoned mid-request (a timeout) or overran the bound is closed and made again on its
/// next use.
pub(super) struct Pool {
    slots: Vec<tokio::sync::Mutex<Option<Conn>>>,
    free: std::sync::Mutex<Vec<usize>>,
    permits: tokio::sync::Semaphore,
    pub(super) info: redis::ConnectionInfo,
    connect_timeout: Duration,
    response_timeout: Duration,
    max_reply: usize,
    /// Commands for every new connection's Redis (a restarted Redis has lost its runtime
    /// configuration, such as the front's busy-reply-threshold).
    pub(super) on_connect: std::sync::OnceLock<OnConnect>,
    /// The front's budget of large replies in flight, if it has one.
    pub(super) budget: std::sync::OnceLock<Arc<tokio::sync::Semaphore>>,
}

/// What a pool sends when it has made a new connection.
pub(super) enum OnConnect {
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

/// Why a counted stream stopped reading: carried, typed, inside the `io::Error` it hands
/// redis-rs, and told apart again where the call's result is received ([`overrun`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Overrun {
    /// The reply passed the request's bound.
    TooLarge,
    /// The budget of large replies in flight is spent.
    BudgetSpent,
}

impl std::fmt::Display for Overrun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Overrun::TooLarge => super::TOO_LARGE,
            Overrun::BudgetSpent => super::BUDGET_SPENT,
        })
    }
}

impl std::error::Error for Overrun {}

/// The [`Overrun`] a counted stream raised, if `e` carries one. redis-rs keeps the stream's
/// `io::Error` behind an `Arc` (its `source`); the test below pins that.
fn overrun(e: &redis::RedisError) -> Option<Overrun> {
    let source = std::error::Error::source(e)?;
    let io = match source.downcast_ref::<Arc<dyn std::error::Error + Send + Sync>>() {
        Some(shared) => shared.downcast_ref::<io::Error>()?,
        None => source.downcast_ref::<io::Error>()?,
    };
    io.get_ref()?.downcast_ref::<Overrun>().copied()
}

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
                    return Poll::Ready(Err(io::Error::other(Overrun::TooLarge)));
                }
                if n > 0 && !this.charge.lock().unwrap_or_else(|e| e.into_inner()).add(n) {
                    this.closed.store(true, Ordering::Relaxed);
                    return Poll::Ready(Err(io::Error::other(Overrun::BudgetSpent)));
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
    pub(super) fn new(
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

    /// A new connection whose reads fail past `limit` bytes (since its counter was reset),
    /// after the pool's on-connect commands.
    async fn dial(&self, limit: usize, response_timeout: Option<Duration>) -> Result<Conn, Failed> {
        let mut made =
            open(&self.info, limit, self.connect_timeout, response_timeout).await.map_err(Failed::connecting)?;
        match self.on_connect.get() {
            Some(OnConnect::Here(cmds)) => {
                for cmd in cmds {
                    let _ = cmd.query_async::<Value>(&mut made.conn).await;
                }
            }
            Some(OnConnect::Via(cmds, via)) => {
                // A connection of the URL's user for just this, closed after.
                if let Ok(mut other) = open(via, usize::MAX, self.connect_timeout, Some(self.response_timeout)).await {
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

    /// Runs `call` on a connection of its own, made first if needed. What its reply holds of
    /// the budget of large replies goes to `held`.
    pub(super) async fn run<T>(
        &self,
        held: &mut Held,
        call: impl AsyncFnOnce(&mut MultiplexedConnection) -> RedisResult<T>,
    ) -> Result<T, Failed> {
        let mut lease = self.lease().await;
        // A connection known to have ended is not sent on: Redis restarted or closed it.
        if lease.slot.as_ref().is_some_and(|c| c.closed.load(Ordering::Relaxed)) {
            *lease.slot = None;
        }
        if lease.slot.is_none() {
            *lease.slot = Some(Box::pin(self.dial(self.max_reply, Some(self.response_timeout))).await?);
        }
        let conn = lease.slot.as_mut().expect("made above");
        conn.read.store(0, Ordering::Relaxed);
        *conn.charge.lock().unwrap_or_else(|e| e.into_inner()) =
            Charge { budget: self.budget.get().cloned(), free: 16 * 1024, ..Charge::default() };
        let result = call(&mut conn.conn).await;
        let (permit, refused) = {
            let mut c = conn.charge.lock().unwrap_or_else(|e| e.into_inner());
            (c.held.take(), c.refused)
        };
        held.keep(permit);
        // Whatever redis-rs made of the cut-off stream, say what happened (and never "broken
        // pipe": the command did run, it must not be sent again).
        let stopped = result.as_ref().err().and_then(overrun);
        if refused || stopped == Some(Overrun::BudgetSpent) {
            return Err(Failed::BudgetSpent);
        }
        if conn.read.load(Ordering::Relaxed) > self.max_reply || stopped == Some(Overrun::TooLarge) {
            return Err(Failed::TooLarge { bound: self.max_reply });
        }
        // A Redis error reply leaves the connection usable; anything else closes it.
        lease.clean = match &result {
            Ok(_) => true,
            Err(e) => e.code().is_some() && !e.is_io_error(),
        };
        result.map_err(Failed::Redis)
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
    response_timeout: Option<Duration>,
) -> RedisResult<Conn> {
    let read = Arc::new(AtomicUsize::new(0));
    let closed = Arc::new(AtomicBool::new(false));
    let charge = Arc::new(Mutex::new(Charge::default()));
    let config = AsyncConnectionConfig::new().set_response_timeout(response_timeout);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_counted_streams_overrun_is_told_apart_by_type() {
        for why in [Overrun::TooLarge, Overrun::BudgetSpent] {
            let e = redis::RedisError::from(io::Error::other(why));
            assert_eq!(overrun(&e), Some(why), "redis-rs keeps the stream's error reachable");
        }
        let other = redis::RedisError::from(io::Error::other(super::super::TOO_LARGE));
        assert_eq!(overrun(&other), None, "the same words without the type are not an overrun");
        let reply = redis::RedisError::from((redis::ErrorKind::Io, "a reply", "reply larger than".to_string()));
        assert_eq!(overrun(&reply), None);
    }
}
