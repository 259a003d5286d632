//! Bounded HTTP/1 serving for redcount's servers (`redcount-rest`, `redcount serve`).
//!
//! `axum::serve` holds a connection for as long as the client likes: a client sending one
//! byte a second, or thousands of idle ones, could use up the open-file limit and lock
//! everyone out. [`serve`] bounds every connection instead:
//!
//! - at most [`Limits::max_connections`] at once, and [`Limits::max_per_ip`] from one client
//!   address; past either a connection gets `503` with a JSON error and is closed, so
//!   clients see why. At the per-address cap, the connection of that address that has had no
//!   request at work for longest (still shaking hands, sending its head, trickling its body, or
//!   parked between requests, however briefly) is closed to make room, so one user behind a
//!   shared address (a NAT, a proxy) cannot lock the others out, even with every connection
//!   busy with cheap requests. At the global cap, the one idle longest if that is a second or
//!   more (so clients do not take each other's places in turns), else the one idle longest of
//!   the address holding the most connections, when that is more than the newcomer's holds: a
//!   flood from a few addresses gives way to the others. A request at work is never cut off;
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
use std::convert::Infallible;
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
    /// Longest a shutdown waits for open connections to finish the requests they are serving;
    /// at least the longest a request may take, so none is cut off unanswered.
    pub drain_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 10_000,
            max_per_ip: 1_000,
            header_timeout: Duration::from_secs(10),
            stall_timeout: Duration::from_secs(10),
            drain_timeout: Duration::from_secs(5),
        }
    }
}

/// Whether reading a request's body failed on its HTTP framing (a chunk size that is not hex,
/// a chunk longer than its size, the connection ending mid-body) rather than on a length
/// limit: bad input (400), not a body too large (413).
pub fn body_framing_error(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut at = Some(e);
    while let Some(err) = at {
        if err.is::<hyper::Error>() {
            return true;
        }
        at = err.source();
    }
    false
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

/// What [`serve`] serves: an axum `Router`, or any service of the same requests and responses
/// that is ready at once (a front with one handler skips the router's dispatch).
pub trait App: Clone + Send + Sync + 'static {
    /// Starts answering `req`.
    fn start(&mut self, req: axum::extract::Request) -> Self::Answer;
    /// The answer being made.
    type Answer: Future<Output = Result<axum::response::Response, Infallible>> + Send + 'static;
}

impl<T> App for T
where
    T: tower_service::Service<axum::extract::Request, Response = axum::response::Response, Error = Infallible>
        + Clone
        + Send
        + Sync
        + 'static,
    T::Future: Send + 'static,
{
    type Answer = T::Future;

    fn start(&mut self, req: axum::extract::Request) -> T::Future {
        self.call(req)
    }
}

/// Serves `app` on `listener` within `limits` until `shutdown` completes; then stops
/// accepting and gives open connections up to [`Limits::drain_timeout`] to finish.
pub async fn serve(
    listener: TcpListener,
    app: impl App,
    limits: Limits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    serve_tls(listener, app, limits, None, shutdown).await
}

/// [`serve`], over TLS when `tls` is given (HTTPS; the handshake must finish within
/// [`Limits::header_timeout`], and a connection still shaking hands can be evicted at the cap
/// like an idle one).
pub async fn serve_tls<A: App>(
    listener: TcpListener,
    app: A,
    limits: Limits,
    tls: Option<Tls>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let cap = effective_max_connections(limits.max_connections);
    let caps = Arc::new(Caps {
        slots: Arc::new(Semaphore::new(cap)),
        cap,
        per_ip: Arc::new(PerIp::new(limits.max_per_ip)),
        refusing: AtomicUsize::new(0),
    });
    let idle = Arc::new(Idle::default());
    let serving = Arc::new(Serving::default());
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
        let conn = Conn {
            app: app.clone(),
            limits,
            idle: idle.clone(),
            serving: serving.clone(),
            tls: tls.as_ref().map(Tls::acceptor),
        };
        // Both places at once, or the slower way (a cap is full).
        let ip_slot = caps.per_ip.clone().enter(peer.ip());
        let permit = ip_slot.as_ref().and_then(|_| caps.slots.clone().try_acquire_owned().ok());
        match (ip_slot, permit) {
            (Some(ip_slot), Some(permit)) => conn.start(tcp, permit, ip_slot),
            (ip_slot, _) => {
                tokio::spawn(admit(conn, tcp, ip_slot, peer.ip(), caps.clone()));
            }
        }
    }
    drop(listener);
    serving.stop();
    let _ = tokio::time::timeout(limits.drain_timeout, serving.drained()).await;
    Ok(())
}

/// Finds `tcp` its places at a full cap: closes a connection that has no request at work (a
/// client at work is never cut off; an idle one simply reconnects), then waits briefly for the
/// place it gave back; refuses with 503 when none comes. At its address's cap, that address's
/// idle longest, however briefly: its own clients take turns, however busy one of them keeps
/// its connections. At the global cap, the one idle longest if a second or more, else the one
/// idle longest of the address holding the most connections when that holds more than this
/// one's (so equal shares never evict each other).
async fn admit<A: App>(conn: Conn<A>, tcp: TcpStream, ip_slot: Option<IpSlot>, ip: IpAddr, caps: Arc<Caps>) {
    let tls = conn.tls.is_some();
    let wait = Duration::from_millis(300);
    let ip_slot = match ip_slot {
        Some(s) => s,
        None => {
            // Waiting only for a place given back by an eviction: a flood past its address's
            // limit with nothing to evict is refused at once, holding nothing.
            let freed = conn.idle.evict_oldest(Duration::ZERO, Some(ip));
            let entered = match freed {
                true => tokio::time::timeout(wait, caps.per_ip.clone().enter_when_free(ip)).await.ok(),
                false => caps.per_ip.clone().enter(ip),
            };
            match entered {
                Some(s) => s,
                None => {
                    let limit = caps.per_ip.limit;
                    let why = format!("this server holds at most {limit} connections from one address at once");
                    return refuse_bounded(&caps.refusing, tcp, why, tls).await;
                }
            }
        }
    };
    let permit = match caps.slots.clone().try_acquire_owned() {
        Ok(p) => p,
        Err(_) => {
            if !conn.idle.evict_oldest(EVICTABLE, None)
                && let Some(largest) = caps.per_ip.larger_than(ip)
            {
                conn.idle.evict_oldest(Duration::ZERO, Some(largest));
            }
            match tokio::time::timeout(wait, caps.slots.clone().acquire_owned()).await {
                Ok(Ok(p)) => p,
                _ => {
                    let why = format!("this server holds at most {} at once", caps.cap);
                    return refuse_bounded(&caps.refusing, tcp, why, tls).await;
                }
            }
        }
    };
    conn.start(tcp, permit, ip_slot);
}

/// The server's connection caps.
struct Caps {
    slots: Arc<Semaphore>,
    cap: usize,
    per_ip: Arc<PerIp>,
    /// Refusals write a few hundred bytes; how many are in flight (bounded too).
    refusing: AtomicUsize,
}

/// How long a connection must have had no request at work before a newcomer at the global cap
/// may take its place whatever its address.
const EVICTABLE: Duration = Duration::from_secs(1);

/// Writes a refusal, unless 256 are being written already (then just closes). Over TLS it
/// only closes: a plain-text answer would mean nothing to a client expecting a handshake, and
/// a handshake is what the cap saves.
async fn refuse_bounded(refusing: &AtomicUsize, tcp: TcpStream, why: String, tls: bool) {
    metrics::counter!("redcount_http_refused_connections_total").increment(1);
    if tls {
        return;
    }
    if refusing.fetch_add(1, Ordering::Relaxed) < 256 {
        refuse(tcp, &why).await;
    }
    refusing.fetch_sub(1, Ordering::Relaxed);
}

/// What starting a connection needs.
struct Conn<A> {
    app: A,
    limits: Limits,
    idle: Arc<Idle>,
    serving: Arc<Serving>,
    /// The TLS acceptor in force when the connection arrived.
    tls: Option<tokio_rustls::TlsAcceptor>,
}

impl<A: App> Conn<A> {
    /// Serves `tcp` in a task holding its places. The connection is listed in [`Idle`]
    /// while it has no request at work (before its first request, between requests, and
    /// while a request's body is still arriving) and closed if evicted meanwhile.
    fn start(self, tcp: TcpStream, permit: tokio::sync::OwnedSemaphorePermit, ip_slot: IpSlot) {
        let slot = Arc::new(Slot::new(ip_slot.ip));
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
                let response = close_after_unauthorized(App::start(&mut app, req).await?);
                idle.unlist(&slot);
                // Idle again once the response has been written out (hyper drops its body).
                let watch = Watch { idle, slot, on_end: Idle::relist };
                Ok::<_, std::convert::Infallible>(response.map(|b| Watched { inner: b, watch: Some(watch) }))
            }
        });
        let stalling = Stalling::new(tcp, self.limits.stall_timeout);
        let (limits, serving, idle, tls) = (self.limits, self.serving, self.idle, self.tls);
        tokio::spawn(async move {
            // Dropped when the connection ends or is evicted: gives back its places.
            let _held = (permit, ip_slot, Open::new(), serving.enter(&slot));
            let builder = {
                let mut b = hyper::server::conn::http1::Builder::new();
                b.timer(TokioTimer::new()).header_read_timeout(limits.header_timeout).max_buf_size(64 * 1024);
                // A client that half-closes right after its request (one-shot clients do) still
                // gets the answer: without this hyper drops the request at the read side's end,
                // though its command may already have run.
                b.half_close(true);
                b
            };
            match tls {
                None => {
                    drive(builder.serve_connection(TokioIo::new(stalling), service), &slot).await;
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
                        () = slot.closed() => {
                            idle.unlist(&slot);
                            return;
                        }
                    };
                    drive(builder.serve_connection(TokioIo::new(stream), service), &slot).await;
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

/// Serves `conn` until it ends or is evicted (then dropped at once); once the server stops,
/// asks it to finish the request at work and close.
async fn drive<C: hyper_util::server::graceful::GracefulConnection>(conn: C, slot: &Slot) {
    let mut conn = std::pin::pin!(conn);
    let mut finishing = false;
    std::future::poll_fn(|cx| {
        // Registered before looking, so a signal in between wakes the task.
        slot.waker.register(cx.waker());
        if slot.evicted.load(Ordering::Acquire) {
            return Poll::Ready(());
        }
        if !finishing && slot.finish.load(Ordering::Acquire) {
            finishing = true;
            conn.as_mut().graceful_shutdown();
        }
        conn.as_mut().poll(cx).map(|_| ())
    })
    .await;
}

/// The connections being served, so that a stopping server can ask each to finish.
#[derive(Default)]
struct Serving {
    next: AtomicU64,
    slots: Mutex<HashMap<u64, Arc<Slot>>>,
    stopping: std::sync::atomic::AtomicBool,
    /// Told when the last connection ends.
    none_left: tokio::sync::Notify,
}

/// A connection's place in [`Serving`], given back when dropped.
struct Served {
    of: Arc<Serving>,
    id: u64,
}

impl Serving {
    fn enter(self: &Arc<Self>, slot: &Arc<Slot>) -> Served {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.slots.lock().unwrap_or_else(|e| e.into_inner()).insert(id, slot.clone());
        // Read after listing: a stop in between either sees this one or is seen here.
        if self.stopping.load(Ordering::SeqCst) {
            slot.finish();
        }
        Served { of: self.clone(), id }
    }

    /// Asks every connection to finish the request at work and close.
    fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        for slot in self.slots.lock().unwrap_or_else(|e| e.into_inner()).values() {
            slot.finish();
        }
    }

    /// Completes once no connection is left.
    async fn drained(&self) {
        loop {
            let none_left = self.none_left.notified();
            let mut none_left = std::pin::pin!(none_left);
            // Registered before looking, so the last one leaving in between is not missed.
            none_left.as_mut().enable();
            if self.slots.lock().unwrap_or_else(|e| e.into_inner()).is_empty() {
                return;
            }
            none_left.await;
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let mut slots = self.of.slots.lock().unwrap_or_else(|e| e.into_inner());
        slots.remove(&self.id);
        if slots.is_empty() {
            self.of.none_left.notify_waiters();
        }
    }
}

/// [`Slot::key`] of a connection that is not listed.
const UNLISTED: u64 = u64::MAX;

/// One connection as [`Idle`] sees it.
struct Slot {
    /// Its key in [`Idle::list`], or [`UNLISTED`]; changed only under that list's lock.
    key: AtomicU64,
    /// The client's address.
    ip: IpAddr,
    /// Set when the connection is evicted.
    evicted: std::sync::atomic::AtomicBool,
    /// Set when the server stops: the connection finishes its request at work and closes.
    finish: std::sync::atomic::AtomicBool,
    /// The connection's task, woken when it is evicted. Registering costs a few atomic
    /// operations where a `Notify` takes a lock: the task does it on every wake-up.
    waker: atomic_waker::AtomicWaker,
}

impl Slot {
    fn new(ip: IpAddr) -> Slot {
        Slot {
            key: AtomicU64::new(UNLISTED),
            ip,
            evicted: std::sync::atomic::AtomicBool::new(false),
            finish: std::sync::atomic::AtomicBool::new(false),
            waker: atomic_waker::AtomicWaker::new(),
        }
    }

    /// Tells the connection's task to close.
    fn evict(&self) {
        self.evicted.store(true, Ordering::Release);
        self.waker.wake();
    }

    /// Tells the connection's task to finish its request at work and close.
    fn finish(&self) {
        self.finish.store(true, Ordering::Release);
        self.waker.wake();
    }

    /// Completes once the connection is evicted.
    fn closed(&self) -> impl Future<Output = ()> + '_ {
        std::future::poll_fn(move |cx| {
            // Registered before looking, so an eviction in between wakes the task.
            self.waker.register(cx.waker());
            if self.evicted.load(Ordering::Acquire) { Poll::Ready(()) } else { Poll::Pending }
        })
    }
}

/// Connections with no request at work, oldest first, so that at the cap the oldest can be
/// closed to make room: the one most likely to be a flood (slow headers, bodies trickled,
/// keep-alive connections parked between requests), and the cheapest to lose (an idle
/// keep-alive client reconnects).
#[derive(Default)]
struct Idle {
    next: AtomicU64,
    list: Mutex<IdleList>,
}

/// Idle connections by listing order: when each was listed, and its slot.
type IdleList = std::collections::BTreeMap<u64, (std::time::Instant, Arc<Slot>)>;

impl Idle {
    fn list(&self, slot: &Arc<Slot>) {
        self.list_at(slot, std::time::Instant::now());
    }

    fn list_at(&self, slot: &Arc<Slot>, since: std::time::Instant) {
        let mut list = self.list.lock().unwrap_or_else(|e| e.into_inner());
        Self::insert(&mut list, &self.next, slot, since);
    }

    fn insert(list: &mut IdleList, next: &AtomicU64, slot: &Arc<Slot>, since: std::time::Instant) {
        if slot.key.load(Ordering::Relaxed) == UNLISTED {
            let key = next.fetch_add(1, Ordering::Relaxed);
            slot.key.store(key, Ordering::Relaxed);
            list.insert(key, (since, slot.clone()));
        }
    }

    /// Lists `slot` as idle from now (at the back of the line), under one lock.
    fn relist(&self, slot: &Arc<Slot>) {
        let now = std::time::Instant::now();
        let mut list = self.list.lock().unwrap_or_else(|e| e.into_inner());
        let key = slot.key.swap(UNLISTED, Ordering::Relaxed);
        if key != UNLISTED {
            list.remove(&key);
        }
        Self::insert(&mut list, &self.next, slot, now);
    }

    fn unlist(&self, slot: &Arc<Slot>) {
        // Only the connection's own task lists it, so one seen unlisted here stays so (an
        // eviction only unlists): no lock needed to leave it.
        if slot.key.load(Ordering::Relaxed) == UNLISTED {
            return;
        }
        let mut list = self.list.lock().unwrap_or_else(|e| e.into_inner());
        let key = slot.key.swap(UNLISTED, Ordering::Relaxed);
        if key != UNLISTED {
            list.remove(&key);
        }
    }

    /// Closes the connection idle longest (of address `of`, when given), if it has been idle at
    /// least `age`; true when one was.
    fn evict_oldest(&self, age: Duration, of: Option<IpAddr>) -> bool {
        let mut list = self.list.lock().unwrap_or_else(|e| e.into_inner());
        let Some(key) = oldest(&list, std::time::Instant::now(), age, of) else { return false };
        let Some((_, slot)) = list.remove(&key) else { return false };
        slot.key.store(UNLISTED, Ordering::Relaxed);
        metrics::counter!("redcount_http_evicted_connections_total").increment(1);
        // Seen when the task next looks, if it is not waiting yet.
        slot.evict();
        true
    }
}

/// The key of the connection listed longest (of address `of`, when given), if it has been
/// listed at least `age` at `now`. The list is in listing order, so the first one found is
/// the oldest; a scan at the per-address cap only, which few connections meet.
fn oldest(list: &IdleList, now: std::time::Instant, age: Duration, of: Option<IpAddr>) -> Option<u64> {
    let (key, (since, _)) = list.iter().find(|(_, (_, slot))| of.is_none_or(|ip| slot.ip == ip))?;
    (now.saturating_duration_since(*since) >= age).then_some(*key)
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
    /// Told when an address that held its limit gives a place back.
    freed: tokio::sync::Notify,
}

/// One connection's place in [`PerIp`], given back when dropped.
struct IpSlot {
    of: Arc<PerIp>,
    ip: IpAddr,
}

impl PerIp {
    fn new(limit: usize) -> Self {
        PerIp { limit, held: Mutex::new(HashMap::new()), freed: tokio::sync::Notify::new() }
    }

    /// A place for one more connection from `ip`, once it has one.
    async fn enter_when_free(self: Arc<Self>, ip: IpAddr) -> IpSlot {
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            // Registered before trying, so a place given back in between is not missed.
            freed.as_mut().enable();
            if let Some(slot) = self.clone().enter(ip) {
                return slot;
            }
            freed.await;
        }
    }

    /// The address holding the most connections, if it holds more than `ip` does (0 when the
    /// places per address are not counted).
    fn larger_than(&self, ip: IpAddr) -> Option<IpAddr> {
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let (largest, n) = held.iter().max_by_key(|(_, n)| **n)?;
        (*n > held.get(&ip).copied().unwrap_or(0)).then_some(*largest)
    }

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
            if *n == self.of.limit {
                self.of.freed.notify_waiters();
            }
            *n -= 1;
            if *n == 0 {
                held.remove(&self.ip);
            }
        }
    }
}

/// A client that is refused its token does not keep the connection.
fn close_after_unauthorized(mut response: axum::response::Response) -> axum::response::Response {
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

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;
    use std::time::Instant;

    use tokio::io::AsyncReadExt;

    use super::*;

    fn slot(ip: [u8; 4]) -> Arc<Slot> {
        Arc::new(Slot::new(IpAddr::from(ip)))
    }

    #[test]
    fn the_oldest_connection_of_the_address_is_chosen_once_a_second_old() {
        let idle = Idle::default();
        let t0 = Instant::now();
        let (a1, b1, a2) = (slot([10, 0, 0, 1]), slot([10, 0, 0, 2]), slot([10, 0, 0, 1]));
        idle.list_at(&a1, t0);
        idle.list_at(&b1, t0 + Duration::from_millis(200));
        idle.list_at(&a2, t0 + Duration::from_millis(500));
        let key = |s: &Arc<Slot>| Some(s.key.load(Ordering::Relaxed));
        let list = idle.list.lock().unwrap();
        let (a, b, c) = (Some(a1.ip), Some(b1.ip), Some(IpAddr::from([10, 0, 0, 3])));
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let second = Duration::from_secs(1);
        assert_eq!(oldest(&list, at(1_000), second, None), key(&a1), "the oldest of all");
        assert_eq!(oldest(&list, at(999), second, None), None, "none a second old yet");
        assert_eq!(oldest(&list, at(1_200), second, b), key(&b1), "the oldest of that address");
        assert_eq!(oldest(&list, at(1_100), second, b), None, "that address's own are younger");
        assert_eq!(oldest(&list, at(5_000), second, c), None, "an address with none listed");
        drop(list);
        // Evicted: unlisted and told to close; the next choice of that address is the next one.
        assert!(idle.evict_oldest(Duration::ZERO, a));
        assert_eq!(a1.key.load(Ordering::Relaxed), UNLISTED);
        let list = idle.list.lock().unwrap();
        assert_eq!(oldest(&list, Instant::now(), Duration::ZERO, a), key(&a2));
        drop(list);
        // A connection back at work is never chosen.
        idle.unlist(&a2);
        assert!(!idle.evict_oldest(Duration::ZERO, a));
        // Listed again (a new idle spell): at the back of the line.
        idle.relist(&b1);
        assert_eq!(oldest(&idle.list.lock().unwrap(), Instant::now(), Duration::ZERO, None), key(&b1));
    }

    #[tokio::test]
    async fn an_address_at_its_limit_gets_a_place_given_back() {
        let per_ip = Arc::new(PerIp::new(2));
        let ip = IpAddr::from(Ipv4Addr::new(10, 0, 0, 1));
        let held = [per_ip.clone().enter(ip).unwrap(), per_ip.clone().enter(ip).unwrap()];
        assert!(per_ip.clone().enter(ip).is_none(), "past the limit");
        assert!(per_ip.clone().enter(IpAddr::from([10, 0, 0, 2])).is_some(), "another address");
        let waiting = tokio::spawn(per_ip.clone().enter_when_free(ip));
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiting.is_finished());
        drop(held);
        let place = tokio::time::timeout(Duration::from_secs(1), waiting).await.expect("woken").unwrap();
        assert_eq!(place.ip, ip);
        assert_eq!(per_ip.held.lock().unwrap().get(&ip), Some(&1));
    }

    /// A request on a fresh connection from `from` (any loopback address) to `addr`: its answer.
    async fn ask_from(addr: std::net::SocketAddr, from: [u8; 4]) -> String {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind((IpAddr::from(from), 0).into()).unwrap();
        let mut c = socket.connect(addr).await.unwrap();
        c.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.unwrap();
        let mut answer = String::new();
        let _ = c.read_to_string(&mut answer).await;
        answer
    }

    /// A server on a free port with `limits`, answering "hello"; and the way to stop it.
    async fn hello_server(
        limits: Limits,
    ) -> (std::net::SocketAddr, tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<io::Result<()>>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = axum::Router::new().fallback(|| async { "hello" });
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, app, limits, async {
            let _ = stopped.await;
        }));
        (addr, stop, server)
    }

    /// Keep-alive connections from `from`, each sending a request every `every` until `stop`:
    /// busy, so never idle a second, but parked between requests.
    fn busy(
        addr: std::net::SocketAddr,
        from: [u8; 4],
        n: usize,
        every: Duration,
        stop: Arc<std::sync::atomic::AtomicBool>,
    ) -> Vec<tokio::task::JoinHandle<usize>> {
        (0..n)
            .map(|_| {
                let stop = stop.clone();
                tokio::spawn(async move {
                    let socket = tokio::net::TcpSocket::new_v4().unwrap();
                    socket.bind((IpAddr::from(from), 0).into()).unwrap();
                    let Ok(mut c) = socket.connect(addr).await else { return 0 };
                    let mut served = 0;
                    let mut buf = vec![0u8; 4096];
                    while !stop.load(Ordering::Relaxed) {
                        if c.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await.is_err() {
                            break;
                        }
                        match c.read(&mut buf).await {
                            Ok(n) if n > 0 && buf[..n].starts_with(b"HTTP/1.1 200") => served += 1,
                            _ => break,
                        }
                        tokio::time::sleep(every).await;
                    }
                    served
                })
            })
            .collect()
    }

    /// A server whose one address holds its limit in half-sent heads serves a newcomer of that
    /// address at once, closing the oldest head.
    #[tokio::test]
    async fn at_the_per_address_cap_a_newcomer_takes_the_oldest_heads_place() {
        let (addr, stop, server) = hello_server(Limits { max_per_ip: 3, ..Limits::default() }).await;
        let mut heads = Vec::new();
        for _ in 0..3 {
            let mut c = TcpStream::connect(addr).await.unwrap();
            c.write_all(b"GET / HT").await.unwrap();
            heads.push(c);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let answer = ask_from(addr, [127, 0, 0, 1]).await;
        assert!(answer.starts_with("HTTP/1.1 200") && answer.ends_with("hello"), "{answer}");
        let mut closed = Vec::new();
        for h in &mut heads {
            let mut b = [0u8; 1];
            closed.push(matches!(
                tokio::time::timeout(Duration::from_millis(100), h.read(&mut b)).await,
                Ok(Ok(0) | Err(_))
            ));
        }
        assert_eq!(closed, [true, false, false], "the oldest head made room");
        let _ = stop.send(());
        server.await.unwrap().unwrap();
    }

    /// One client of an address keeps every place of it with keep-alive connections each
    /// busy more often than once a second: a newcomer of that address still gets in, taking
    /// the place of one parked between its requests (which reconnects).
    #[tokio::test]
    async fn at_the_per_address_cap_busy_parked_connections_make_room() {
        let (addr, stop, server) = hello_server(Limits { max_per_ip: 8, ..Limits::default() }).await;
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flood = busy(addr, [127, 0, 0, 5], 8, Duration::from_millis(100), done.clone());
        tokio::time::sleep(Duration::from_millis(300)).await;
        for _ in 0..5 {
            let answer = ask_from(addr, [127, 0, 0, 5]).await;
            assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        }
        done.store(true, Ordering::Relaxed);
        let mut served = 0;
        for f in flood {
            served += f.await.unwrap();
        }
        assert!(served > 8, "the flood was served too ({served})");
        let _ = stop.send(());
        server.await.unwrap().unwrap();
    }

    /// An address whose every connection has a request at work still has its limit: a newcomer
    /// of it is refused with 503 at once, and no request at work is cut off.
    #[tokio::test]
    async fn at_the_per_address_cap_requests_at_work_are_never_cut_off() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = axum::Router::new().fallback(|| async {
            tokio::time::sleep(Duration::from_millis(800)).await;
            "slow"
        });
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let limits = Limits { max_per_ip: 3, ..Limits::default() };
        let server = tokio::spawn(serve(listener, app, limits, async {
            let _ = stopped.await;
        }));
        let at_work: Vec<_> = (0..3).map(|_| tokio::spawn(ask_from(addr, [127, 0, 0, 9]))).collect();
        tokio::time::sleep(Duration::from_millis(200)).await;
        let started = Instant::now();
        let refused = ask_from(addr, [127, 0, 0, 9]).await;
        assert!(refused.starts_with("HTTP/1.1 503") && refused.contains("from one address"), "{refused}");
        assert!(started.elapsed() < Duration::from_millis(500), "refused at once: {:?}", started.elapsed());
        for a in at_work {
            let answer = a.await.unwrap();
            assert!(answer.starts_with("HTTP/1.1 200") && answer.ends_with("slow"), "{answer}");
        }
        let _ = stop.send(());
        server.await.unwrap().unwrap();
    }

    /// At the global cap, held by two busy addresses, a third address's newcomer gets in: the
    /// largest address gives up a parked connection.
    #[tokio::test]
    async fn at_the_global_cap_the_largest_address_gives_way() {
        let limits = Limits { max_connections: 8, max_per_ip: 5, ..Limits::default() };
        let (addr, stop, server) = hello_server(limits).await;
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut flood = busy(addr, [127, 0, 0, 6], 4, Duration::from_millis(100), done.clone());
        flood.extend(busy(addr, [127, 0, 0, 7], 4, Duration::from_millis(100), done.clone()));
        tokio::time::sleep(Duration::from_millis(300)).await;
        let answer = ask_from(addr, [127, 0, 0, 8]).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "another address: {answer}");
        done.store(true, Ordering::Relaxed);
        for f in flood {
            f.await.unwrap();
        }
        let _ = stop.send(());
        server.await.unwrap().unwrap();
    }
}
