//! Bounded HTTP/1 serving for redcount's servers (`redcount-rest`, `redcount serve`).
//!
//! `axum::serve` holds a connection for as long as the client likes: a client sending one
//! byte a second, or thousands of idle ones, could use up the open-file limit and lock
//! everyone out. [`serve`] bounds every connection instead:
//!
//! - at most [`Limits::max_connections`] at once, and [`Limits::max_per_ip`] from one client
//!   address; past either a connection gets `503` with a JSON error and is closed, so
//!   clients see why. At the cap, the connection that has had no request at work for
//!   longest (a second at least: still sending its head, trickling its body, or parked
//!   between requests) is closed to make room, so a flood of such connections cannot keep
//!   a working client out; a request at work is never cut off;
//! - a `401` response closes its connection: a client without a valid token cannot keep one
//!   open by sending requests;
//! - [`Limits::header_timeout`]: a connection must deliver a complete request head within
//!   this time of opening or of its previous response, so slow-header and idle keep-alive
//!   connections are closed alike;
//! - [`Limits::stall_timeout`]: a client that stops reading its response for this long is
//!   disconnected;
//! - the open-file limit is raised to the hard limit at start, and the connection cap lowered
//!   to leave 256 files for everything else.
//!
//! Whole-request time (a body trickled byte by byte) is the handler's to bound: both
//! servers read bodies under their request timeout.
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! use tokio::io::{AsyncReadExt, AsyncWriteExt};
//!
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! let addr = listener.local_addr()?;
//! let app = axum::Router::new().fallback(|| async { "hello" });
//! let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
//! let server = tokio::spawn(redcount_http::serve(listener, app, redcount_http::Limits::default(), async {
//!     let _ = stopped.await;
//! }));
//! let mut client = tokio::net::TcpStream::connect(addr).await?;
//! client.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await?;
//! let mut answer = String::new();
//! client.read_to_string(&mut answer).await?;
//! assert!(answer.starts_with("HTTP/1.1 200") && answer.ends_with("hello"), "{answer}");
//! let _ = stop.send(());
//! server.await.unwrap()?;
//! # Ok::<(), std::io::Error>(()) }).unwrap();
//! ```

pub mod log;

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use hyper::body::Body as _;
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
fn raise_open_file_limit() -> u64 {
    let _ = rlimit::increase_nofile_limit(u64::MAX);
    rlimit::getrlimit(rlimit::Resource::NOFILE).map(|(soft, _)| soft).unwrap_or(1024)
}

/// The connection cap actually used: the asked one, lowered so that the open files left
/// for Redis connections, logs and refusals never run out.
fn effective_max_connections(asked: usize) -> usize {
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
    serve_tls(listener, app, limits, None, shutdown).await
}

/// [`serve`], over TLS when `tls` is given (HTTPS; the handshake must finish within
/// [`Limits::header_timeout`], and a connection still shaking hands can be evicted at the cap
/// like an idle one).
pub async fn serve_tls(
    listener: TcpListener,
    app: axum::Router,
    limits: Limits,
    tls: Option<Tls>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let cap = effective_max_connections(limits.max_connections);
    let slots = Arc::new(Semaphore::new(cap));
    let per_ip = Arc::new(PerIp { limit: limits.max_per_ip, held: Mutex::new(HashMap::new()) });
    let app = app.layer(axum::middleware::map_response(close_after_unauthorized));
    // Refusals write a few hundred bytes; bound how many may be in flight too.
    let refusing = Arc::new(AtomicUsize::new(0));
    let idle = Arc::new(Idle::default());
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
            refuse_bounded(&refusing, tcp, why, tls.is_some());
            continue;
        };
        let conn = Conn {
            app: app.clone(),
            limits,
            idle: idle.clone(),
            graceful: graceful.clone(),
            tls: tls.as_ref().map(Tls::acceptor),
        };
        match slots.clone().try_acquire_owned() {
            Ok(permit) => conn.start(tcp, permit, ip_slot),
            Err(_) => {
                // Full: make room by closing the connection that has had no request at work
                // for longest, if that is a second or more (a flood of slow headers, slow
                // bodies or parked keep-alive connections is made of those; a client at work
                // is never cut off), then wait briefly for its place.
                idle.evict_oldest(Duration::from_secs(1));
                let slots = slots.clone();
                let refusing = refusing.clone();
                let tls = tls.is_some();
                tokio::spawn(async move {
                    match tokio::time::timeout(Duration::from_millis(300), slots.acquire_owned()).await {
                        Ok(Ok(permit)) => conn.start(tcp, permit, ip_slot),
                        _ => refuse_bounded(&refusing, tcp, format!("this server holds at most {cap} at once"), tls),
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

/// Writes a refusal, unless 256 are being written already (then just closes). Over TLS it
/// only closes: a plain-text answer would mean nothing to a client expecting a handshake, and
/// a handshake is what the cap saves.
fn refuse_bounded(refusing: &Arc<AtomicUsize>, tcp: TcpStream, why: String, tls: bool) {
    metrics::counter!("redcount_http_refused_connections_total").increment(1);
    if tls {
        return;
    }
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
    idle: Arc<Idle>,
    graceful: Arc<hyper_util::server::graceful::GracefulShutdown>,
    /// The TLS acceptor in force when the connection arrived.
    tls: Option<tokio_rustls::TlsAcceptor>,
}

impl Conn {
    /// Serves `tcp` in a task holding its places. The connection is listed in [`Idle`]
    /// while it has no request at work (before its first request, between requests, and
    /// while a request's body is still arriving) and closed if evicted meanwhile.
    fn start(self, tcp: TcpStream, permit: tokio::sync::OwnedSemaphorePermit, ip_slot: IpSlot) {
        let slot = Arc::new(Slot { key: AtomicU64::new(UNLISTED), close: tokio::sync::Notify::new() });
        self.idle.list(&slot);
        let app = self.app;
        let (idle, watched) = (self.idle.clone(), slot.clone());
        let service = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
            let mut app = app.clone();
            let (idle, slot) = (idle.clone(), watched.clone());
            // A body still arriving keeps the connection evictable: no handler acts on a
            // request before its body is complete, so closing it then loses nothing.
            let req = if req.body().is_end_stream() {
                idle.unlist(&slot);
                req.map(axum::body::Body::new)
            } else {
                idle.relist(&slot);
                let watch = Watch { idle: idle.clone(), slot: slot.clone(), on_end: Idle::unlist };
                req.map(|b| axum::body::Body::new(Watched { inner: b, watch: Some(watch) }))
            };
            async move {
                let response = tower_service::Service::call(&mut app, req).await?;
                idle.unlist(&slot);
                // Idle again once the response has been written out (hyper drops its body).
                let watch = Watch { idle, slot, on_end: Idle::relist };
                Ok::<_, std::convert::Infallible>(response.map(|b| Watched { inner: b, watch: Some(watch) }))
            }
        });
        let stalling = Stalling::new(tcp, self.limits.stall_timeout);
        let (limits, graceful, idle, tls) = (self.limits, self.graceful, self.idle, self.tls);
        tokio::spawn(async move {
            // Dropped when the connection ends or is evicted: gives back its places.
            let _held = (permit, ip_slot, Open::new());
            let builder = {
                let mut b = hyper::server::conn::http1::Builder::new();
                b.timer(TokioTimer::new()).header_read_timeout(limits.header_timeout).max_buf_size(64 * 1024);
                b
            };
            match tls {
                None => {
                    let conn = graceful.watch(builder.serve_connection(TokioIo::new(stalling), service));
                    tokio::select! {
                        _ = conn => {}
                        () = slot.close.notified() => {}
                    }
                }
                Some(acceptor) => {
                    // The handshake counts as the wait for the first request head.
                    let handshake = tokio::time::timeout(limits.header_timeout, acceptor.accept(stalling));
                    let stream = tokio::select! {
                        done = handshake => match done {
                            Ok(Ok(stream)) => stream,
                            _ => {
                                idle.unlist(&slot);
                                return;
                            }
                        },
                        () = slot.close.notified() => {
                            idle.unlist(&slot);
                            return;
                        }
                    };
                    let conn = graceful.watch(builder.serve_connection(TokioIo::new(stream), service));
                    tokio::select! {
                        _ = conn => {}
                        () = slot.close.notified() => {}
                    }
                }
            }
            idle.unlist(&slot);
        });
    }
}

/// A server certificate and key from PEM files, reloadable while serving (e.g. on SIGHUP after
/// a renewal): connections arriving afterwards get the new certificate, open ones keep theirs.
#[derive(Clone)]
pub struct Tls {
    cert: std::path::PathBuf,
    key: std::path::PathBuf,
    config: Arc<std::sync::RwLock<Arc<rustls::ServerConfig>>>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls").field("cert", &self.cert).field("key", &self.key).finish_non_exhaustive()
    }
}

impl Tls {
    /// Reads the certificate chain and private key (PEM). The process's rustls provider must
    /// be installed (`ring`; see the servers' `main`).
    pub fn from_files(cert: &std::path::Path, key: &std::path::Path) -> io::Result<Tls> {
        let config = Self::load(cert, key)?;
        Ok(Tls { cert: cert.into(), key: key.into(), config: Arc::new(std::sync::RwLock::new(config)) })
    }

    /// Reads the files again; on error the certificate in use stays.
    pub fn reload(&self) -> io::Result<()> {
        let config = Self::load(&self.cert, &self.key)?;
        *self.config.write().unwrap_or_else(|e| e.into_inner()) = config;
        Ok(())
    }

    fn load(cert: &std::path::Path, key: &std::path::Path) -> io::Result<Arc<rustls::ServerConfig>> {
        use rustls_pki_types::pem::PemObject;
        use rustls_pki_types::{CertificateDer, PrivateKeyDer};
        let what = |path: &std::path::Path, e: &dyn std::fmt::Display| {
            io::Error::new(io::ErrorKind::InvalidInput, format!("{}: {e}", path.display()))
        };
        let chain = CertificateDer::pem_file_iter(cert)
            .map_err(|e| what(cert, &e))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| what(cert, &e))?;
        if chain.is_empty() {
            return Err(what(cert, &"no certificate in the file"));
        }
        let key_der = PrivateKeyDer::from_pem_file(key).map_err(|e| what(key, &e))?;
        let mut config = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(chain, key_der)
            .map_err(|e| what(cert, &e))?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }

    /// Reloads on every SIGHUP, for as long as the process runs; `report` hears each outcome
    /// (a failed reload keeps the certificate in use).
    pub fn reload_on_sighup(&self, report: impl Fn(io::Result<()>) + Send + 'static) -> io::Result<()> {
        let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
        let tls = self.clone();
        tokio::spawn(async move {
            while hup.recv().await.is_some() {
                report(tls.reload());
            }
        });
        Ok(())
    }

    /// The `--tls-cert` / `--tls-key` flags of a server: `None` for plain HTTP, else the
    /// certificate, reloaded on every SIGHUP with each outcome logged.
    pub fn from_flags(cert: Option<&std::path::Path>, key: Option<&std::path::Path>) -> Result<Option<Tls>, String> {
        let (Some(cert), Some(key)) = (cert, key) else { return Ok(None) };
        let tls = Tls::from_files(cert, key).map_err(|e| format!("--tls-cert/--tls-key: {e}"))?;
        tls.reload_on_sighup(|r| match r {
            Ok(()) => tracing::info!("SIGHUP: TLS certificate reloaded"),
            Err(e) => tracing::error!("SIGHUP: TLS certificate not reloaded, the old one stays: {e}"),
        })
        .map_err(|e| e.to_string())?;
        Ok(Some(tls))
    }

    fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.config.read().unwrap_or_else(|e| e.into_inner()).clone())
    }
}

/// Serves Prometheus text at `http://addr/metrics` (`--metrics-listen`), on its own address
/// so the metrics are never public by accident; nothing when `addr` is `None`.
pub fn serve_metrics(addr: Option<std::net::SocketAddr>) -> Result<(), String> {
    let Some(addr) = addr else { return Ok(()) };
    metrics_exporter_prometheus::PrometheusBuilder::new()
        .with_http_listener(addr)
        .install()
        .map_err(|e| format!("--metrics-listen {addr}: {e}"))?;
    tracing::info!("metrics at http://{addr}/metrics");
    Ok(())
}

/// Counts an open connection for `/metrics` while it lives.
struct Open;

impl Open {
    fn new() -> Open {
        metrics::gauge!("redcount_http_open_connections").increment(1.0);
        Open
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        metrics::gauge!("redcount_http_open_connections").decrement(1.0);
    }
}

/// [`Slot::key`] of a connection that is not listed.
const UNLISTED: u64 = u64::MAX;

/// One connection as [`Idle`] sees it.
struct Slot {
    /// Its key in [`Idle::list`], or [`UNLISTED`]; changed only under that list's lock.
    key: AtomicU64,
    /// Told when the connection is evicted.
    close: tokio::sync::Notify,
}

/// Connections with no request at work, oldest first, so that at the cap the oldest can be
/// closed to make room: the one most likely to be a flood (slow headers, bodies trickled,
/// keep-alive connections parked between requests), and the cheapest to lose (an idle
/// keep-alive client reconnects).
#[derive(Default)]
struct Idle {
    next: AtomicU64,
    list: Mutex<std::collections::BTreeMap<u64, (std::time::Instant, Arc<Slot>)>>,
}

impl Idle {
    fn list(&self, slot: &Arc<Slot>) {
        let mut list = self.list.lock().unwrap_or_else(|e| e.into_inner());
        if slot.key.load(Ordering::Relaxed) == UNLISTED {
            let key = self.next.fetch_add(1, Ordering::Relaxed);
            slot.key.store(key, Ordering::Relaxed);
            list.insert(key, (std::time::Instant::now(), slot.clone()));
        }
    }

    /// Lists `slot` as idle from now (at the back of the line).
    fn relist(&self, slot: &Arc<Slot>) {
        self.unlist(slot);
        self.list(slot);
    }

    fn unlist(&self, slot: &Arc<Slot>) {
        let mut list = self.list.lock().unwrap_or_else(|e| e.into_inner());
        let key = slot.key.swap(UNLISTED, Ordering::Relaxed);
        if key != UNLISTED {
            list.remove(&key);
        }
    }

    /// Closes the connection idle longest, if it has been idle at least `age`.
    fn evict_oldest(&self, age: Duration) {
        let mut list = self.list.lock().unwrap_or_else(|e| e.into_inner());
        let Some(entry) = list.first_entry() else { return };
        if entry.get().0.elapsed() < age {
            return;
        }
        let (_, slot) = entry.remove();
        slot.key.store(UNLISTED, Ordering::Relaxed);
        metrics::counter!("redcount_http_evicted_connections_total").increment(1);
        // Stores a permit if the task is not waiting yet: it closes when it next looks.
        slot.close.notify_one();
    }
}

/// What a [`Watched`] body does to its connection's listing when it ends.
struct Watch {
    idle: Arc<Idle>,
    slot: Arc<Slot>,
    on_end: fn(&Idle, &Arc<Slot>),
}

impl Watch {
    fn fire(self) {
        (self.on_end)(&self.idle, &self.slot);
    }
}

/// A body that updates its connection's listing once it has ended or is dropped.
struct Watched<B> {
    inner: B,
    watch: Option<Watch>,
}

impl<B> Watched<B> {
    fn end(&mut self) {
        if let Some(w) = self.watch.take() {
            w.fire();
        }
    }
}

impl<B: hyper::body::Body + Unpin> hyper::body::Body for Watched<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        let polled = ready!(Pin::new(&mut self.inner).poll_frame(cx));
        if polled.is_none() || self.inner.is_end_stream() {
            self.end();
        }
        Poll::Ready(polled)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

impl<B> Drop for Watched<B> {
    fn drop(&mut self) {
        self.end();
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
