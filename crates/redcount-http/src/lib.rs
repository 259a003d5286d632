//! Bounded HTTP/1 serving for redcount's servers (`redcount-rest`, `redcount serve`).
//!
//! `axum::serve` holds a connection for as long as the client likes: a client sending one
//! byte a second, or thousands of idle ones, could use up the open-file limit and lock
//! everyone out. [`serve`] bounds every connection instead:
//!
//! - at most [`Limits::max_connections`] at once, and [`Limits::max_per_ip`] from one client
//!   address; past either a connection gets `503` with a JSON error and is closed, so
//!   clients see why;
//! - a `401` response closes its connection: a client without a valid token cannot keep one
//!   open by sending requests;
//! - [`Limits::header_timeout`]: a connection must deliver a complete request head within
//!   this time of opening or of its previous response, so slow-header and idle keep-alive
//!   connections are closed alike;
//! - [`Limits::stall_timeout`]: a client that stops reading its response for this long is
//!   disconnected;
//! - the open-file limit is raised to the hard limit at start ([`raise_open_file_limit`]).
//!
//! Whole-request time (a body trickled byte by byte) is the handler's to bound: both
//! servers read bodies under their request timeout.
//!
//! ```no_run
//! # async fn run() -> std::io::Result<()> {
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! let app = axum::Router::new().fallback(|| async { "hello" });
//! redcount_http::serve(listener, app, redcount_http::Limits::default(), std::future::pending()).await
//! # }
//! ```

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::time::Sleep;

/// How much one server lets its clients hold.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections served at once; more are refused with 503.
    pub max_connections: usize,
    /// Connections served at once from one IP address (0: no such bound); more are refused
    /// with 503, so one client cannot take every slot.
    pub max_per_ip: usize,
    /// Longest wait for a complete request head, from the connection's start or its
    /// previous response (so also the idle keep-alive time).
    pub header_timeout: Duration,
    /// Longest a write to the client may make no progress.
    pub stall_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 10_000,
            max_per_ip: 1_000,
            header_timeout: Duration::from_secs(10),
            stall_timeout: Duration::from_secs(10),
        }
    }
}

/// Raises the soft open-file limit to the hard one where the system allows; returns the
/// soft limit in force afterwards.
pub fn raise_open_file_limit() -> u64 {
    let _ = rlimit::increase_nofile_limit(u64::MAX);
    rlimit::getrlimit(rlimit::Resource::NOFILE).map(|(soft, _)| soft).unwrap_or(1024)
}

/// The connection cap actually used: the asked one, lowered so that the open files left
/// for Redis connections, logs and refusals never run out.
pub fn effective_max_connections(asked: usize) -> usize {
    let files = raise_open_file_limit();
    let room = files.saturating_sub(256).max(16);
    asked.min(usize::try_from(room).unwrap_or(usize::MAX)).max(1)
}

/// Serves `app` on `listener` within `limits` until `shutdown` completes; then stops
/// accepting and gives open connections up to 5 s to finish.
pub async fn serve(
    listener: TcpListener,
    app: axum::Router,
    limits: Limits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let cap = effective_max_connections(limits.max_connections);
    let slots = Arc::new(Semaphore::new(cap));
    let per_ip = Arc::new(PerIp { limit: limits.max_per_ip, held: Mutex::new(HashMap::new()) });
    let app = app.layer(axum::middleware::map_response(close_after_unauthorized));
    // Refusals write a few hundred bytes; bound how many may be in flight too.
    let refusing = Arc::new(AtomicUsize::new(0));
    let waiting = Arc::new(Waiting::default());
    let graceful = Arc::new(hyper_util::server::graceful::GracefulShutdown::new());
    tokio::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(_) => {
                    // Out of file descriptors or similar: let connections close, then retry.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        // Small request/response exchanges: never let Nagle hold a reply back.
        let _ = tcp.set_nodelay(true);
        let Some(ip_slot) = per_ip.clone().enter(peer.ip()) else {
            let why = format!("this server holds at most {} connections from one address at once", per_ip.limit);
            refuse_bounded(&refusing, tcp, why);
            continue;
        };
        let conn = Conn { app: app.clone(), limits, waiting: waiting.clone(), graceful: graceful.clone() };
        match slots.clone().try_acquire_owned() {
            Ok(permit) => conn.start(tcp, permit, ip_slot),
            Err(_) => {
                // Full: make room by closing the oldest connection that has sent no request
                // in a second (a slow-header flood is made of those; a client that connects
                // to make a request sends it at once), then wait briefly for its place.
                waiting.evict_oldest(Duration::from_secs(1));
                let slots = slots.clone();
                let refusing = refusing.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(Duration::from_millis(300), slots.acquire_owned()).await {
                        Ok(Ok(permit)) => conn.start(tcp, permit, ip_slot),
                        _ => refuse_bounded(&refusing, tcp, format!("this server holds at most {cap} at once")),
                    }
                });
            }
        }
    }
    drop(listener);
    if let Ok(graceful) = Arc::try_unwrap(graceful) {
        let _ = tokio::time::timeout(Duration::from_secs(5), graceful.shutdown()).await;
    }
    Ok(())
}

/// Writes a refusal, unless 256 are being written already (then just closes).
fn refuse_bounded(refusing: &Arc<AtomicUsize>, tcp: TcpStream, why: String) {
    if refusing.fetch_add(1, Ordering::Relaxed) < 256 {
        let refusing = refusing.clone();
        tokio::spawn(async move {
            refuse(tcp, &why).await;
            refusing.fetch_sub(1, Ordering::Relaxed);
        });
    } else {
        refusing.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What starting a connection needs.
struct Conn {
    app: axum::Router,
    limits: Limits,
    waiting: Arc<Waiting>,
    graceful: Arc<hyper_util::server::graceful::GracefulShutdown>,
}

impl Conn {
    /// Serves `tcp` in a task holding its places; it is listed as waiting until its first
    /// request, and closed if evicted meanwhile.
    fn start(self, tcp: TcpStream, permit: tokio::sync::OwnedSemaphorePermit, ip_slot: IpSlot) {
        let entry = self.waiting.next_id();
        let seen = Seen { waiting: self.waiting.clone(), entry, done: Arc::new(AtomicBool::new(false)) };
        let app = self.app;
        let marker = seen.clone();
        let service = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
            marker.mark();
            let mut app = app.clone();
            async move { tower_service::Service::call(&mut app, req).await }
        });
        let io = TokioIo::new(Stalling::new(tcp, self.limits.stall_timeout));
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(self.limits.header_timeout)
            .max_buf_size(64 * 1024)
            .serve_connection(io, service);
        let conn = self.graceful.watch(conn);
        let task = tokio::spawn(async move {
            // Dropped when the connection ends or the task is aborted: gives back its places.
            let _held = (permit, ip_slot, seen);
            let _ = conn.await;
        });
        self.waiting.list(entry, task.abort_handle());
    }
}

/// Connections that have not sent a request yet, oldest first, so that at the cap the
/// oldest can be closed to make room.
#[derive(Default)]
struct Waiting {
    next: AtomicU64,
    entries: Mutex<WaitingList>,
}

#[derive(Default)]
struct WaitingList {
    open: std::collections::BTreeMap<u64, (std::time::Instant, tokio::task::AbortHandle)>,
    /// Ids that have sent a request (or ended) before they were listed.
    gone: std::collections::HashSet<u64>,
}

impl Waiting {
    fn next_id(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    fn list(&self, id: u64, task: tokio::task::AbortHandle) {
        let mut e = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if !e.gone.remove(&id) {
            e.open.insert(id, (std::time::Instant::now(), task));
        }
    }

    fn unlist(&self, id: u64) {
        let mut e = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if e.open.remove(&id).is_none() {
            e.gone.insert(id);
        }
    }

    /// Closes the oldest connection that has waited at least `age` without a request.
    fn evict_oldest(&self, age: Duration) {
        let mut e = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let oldest = e.open.iter().next().filter(|(_, (since, _))| since.elapsed() >= age).map(|(id, _)| *id);
        if let Some(id) = oldest
            && let Some((_, task)) = e.open.remove(&id)
        {
            task.abort();
        }
    }
}

/// Takes a connection off the waiting list at its first request (or its end).
#[derive(Clone)]
struct Seen {
    waiting: Arc<Waiting>,
    entry: u64,
    done: Arc<AtomicBool>,
}

impl Seen {
    fn mark(&self) {
        if !self.done.swap(true, Ordering::Relaxed) {
            self.waiting.unlist(self.entry);
        }
    }
}

impl Drop for Seen {
    fn drop(&mut self) {
        // The last of the connection's two handles: it ended.
        if Arc::strong_count(&self.done) == 1 {
            self.mark();
        }
    }
}

/// Connections held per client address.
struct PerIp {
    limit: usize,
    held: Mutex<HashMap<IpAddr, usize>>,
}

/// One connection's place in [`PerIp`], given back when dropped.
struct IpSlot {
    of: Arc<PerIp>,
    ip: IpAddr,
}

impl PerIp {
    /// A place for one more connection from `ip`, or `None` when it holds its limit.
    fn enter(self: Arc<Self>, ip: IpAddr) -> Option<IpSlot> {
        if self.limit == 0 {
            return Some(IpSlot { of: self, ip });
        }
        {
            let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
            let n = held.entry(ip).or_insert(0);
            if *n >= self.limit {
                return None;
            }
            *n += 1;
        }
        Some(IpSlot { of: self, ip })
    }
}

impl Drop for IpSlot {
    fn drop(&mut self) {
        if self.of.limit == 0 {
            return;
        }
        let mut held = self.of.held.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = held.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.ip);
            }
        }
    }
}

/// A client that is refused its token does not keep the connection.
async fn close_after_unauthorized(mut response: axum::response::Response) -> axum::response::Response {
    if response.status() == axum::http::StatusCode::UNAUTHORIZED {
        response.headers_mut().insert(axum::http::header::CONNECTION, axum::http::HeaderValue::from_static("close"));
    }
    response
}

async fn refuse(mut tcp: TcpStream, why: &str) {
    let body = format!("{{\"error\":\"ERR too many connections: {why}; retry shortly\"}}");
    let reply = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let _ = tcp.write_all(reply.as_bytes()).await;
        let _ = tcp.shutdown().await;
        // Read what the client sent (up to 64 KiB) before closing: closing with unread bytes
        // would reset the connection and the client might never see the reply.
        let mut sink = [0u8; 4096];
        let mut left = 64 * 1024usize;
        while left > 0 {
            match tokio::io::AsyncReadExt::read(&mut tcp, &mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    })
    .await;
}

/// A TCP stream whose writes fail once they have waited `limit` without progress (a client
/// that stopped reading). Reads are bounded elsewhere: heads by hyper's header timeout,
/// bodies by the handlers' request timeout.
struct Stalling {
    tcp: TcpStream,
    limit: Duration,
    write_stall: Option<Pin<Box<Sleep>>>,
}

impl Stalling {
    fn new(tcp: TcpStream, limit: Duration) -> Self {
        Stalling { tcp, limit, write_stall: None }
    }
}

impl AsyncRead for Stalling {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_read(cx, buf)
    }
}

impl Stalling {
    /// A write's result, or the stall error once `limit` passed with the write pending.
    fn guard<T>(&mut self, cx: &mut Context<'_>, polled: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        if polled.is_ready() {
            self.write_stall = None;
            return polled;
        }
        let limit = self.limit;
        let stall = self.write_stall.get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        ready!(stall.as_mut().poll(cx));
        Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, "client stopped reading its response")))
    }
}

impl AsyncWrite for Stalling {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.tcp).poll_write(cx, data);
        this.guard(cx, polled)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.tcp).poll_write_vectored(cx, bufs);
        this.guard(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }
}
