//! The one harness every benchmark runs on: [`drive`] runs N operations over C concurrent
//! tasks and sums what they did into [`Totals`]; a [`Row`] is one measured line of a table,
//! its latencies read by [`percentile`]. Also the lean clients the load is sent with.

use std::future::Future;
use std::io::IsTerminal;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use redcount::Driver;

use crate::Error;
use redcount_core::Operation;

/// Load shape.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    /// Operations per row.
    pub ops: usize,
    /// Concurrent clients, each with its own connection.
    pub concurrency: usize,
}

/// What one operation did.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sample {
    /// It won / was allowed / applied.
    pub ok: bool,
    /// Round trips to Redis (or HTTP requests) it took.
    pub round_trips: u32,
    /// Optimistic-lock retries it took.
    pub retries: u32,
    /// Invariant breaks it saw on the way (e.g. a reader seeing a negative count).
    pub anomalies: u32,
}

impl Sample {
    /// One round trip, which succeeded or not: every scripted call and every API request.
    pub fn one(ok: bool) -> Self {
        Sample { ok, round_trips: 1, ..Sample::default() }
    }
}

/// What a whole run did: the [`Sample`]s summed, and every latency.
#[derive(Debug, Clone, Default)]
pub struct Totals {
    /// Operations run (failed ones included).
    pub ops: usize,
    /// Latency of each operation, sorted.
    pub lat: Vec<Duration>,
    /// Operations that won / were allowed / applied.
    pub ok: u64,
    /// Round trips in all.
    pub round_trips: u64,
    /// Retries in all.
    pub retries: u64,
    /// Anomalies in all.
    pub anomalies: u64,
    /// Operations that returned an error.
    pub errors: u64,
    /// Wall time of the whole run.
    pub elapsed: Duration,
}

impl Totals {
    fn record(&mut self, result: Result<Sample, Error>, lat: Duration) {
        match result {
            Ok(s) => {
                self.ok += s.ok as u64;
                self.round_trips += s.round_trips as u64;
                self.retries += s.retries as u64;
                self.anomalies += s.anomalies as u64;
            }
            Err(_) => self.errors += 1,
        }
        self.lat.push(lat);
    }

    fn merge(&mut self, other: Totals) {
        self.lat.extend(other.lat);
        self.ok += other.ok;
        self.round_trips += other.round_trips;
        self.retries += other.retries;
        self.anomalies += other.anomalies;
        self.errors += other.errors;
    }
}

/// Runs `ops` calls of `call(client, i)`, `i` in `0..ops`, from one task per client (so the
/// concurrency is `clients.len()`): each task takes the next `i` until none is left.
///
/// With a `label`, a progress bar shows on a terminal and one line per run is logged to
/// stderr; without one the run is silent.
///
/// ```
/// use redcount_bench::harness::{Sample, drive, percentile};
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// // Two clients share 10 operations; odd ones "win".
/// let totals = drive(None, vec![(), ()], 10, |_client, i| async move { Ok(Sample::one(i % 2 == 1)) }).await;
/// assert_eq!((totals.ops, totals.ok, totals.round_trips, totals.errors), (10, 5, 10, 0));
/// assert!(percentile(&totals.lat, 0.99) >= percentile(&totals.lat, 0.5));
/// # });
/// ```
pub async fn drive<D, F, Fut>(label: Option<&str>, clients: Vec<D>, ops: usize, call: F) -> Totals
where
    D: Send + Sync + 'static,
    F: Fn(Arc<D>, usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Sample, Error>> + Send,
{
    let next = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let call = Arc::new(call);
    let bar = label.map(|l| progress(l.to_string(), ops, done.clone()));
    let start = Instant::now();
    let tasks: Vec<_> = clients
        .into_iter()
        .map(|d| {
            let (next, done, call, d) = (next.clone(), done.clone(), call.clone(), Arc::new(d));
            tokio::spawn(async move {
                let mut t = Totals::default();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= ops {
                        break t;
                    }
                    let at = Instant::now();
                    let result = call(d.clone(), i).await;
                    t.record(result, at.elapsed());
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let mut all = Totals { ops, lat: Vec::with_capacity(ops), ..Totals::default() };
    for t in tasks {
        all.merge(t.await.expect("bench task"));
    }
    all.elapsed = start.elapsed();
    if let (Some(label), Some(bar)) = (label, bar) {
        bar.abort();
        if std::io::stderr().is_terminal() {
            eprint!("\r\x1b[2K");
        }
        eprintln!("  {label}: {ops} ops in {:.2} s", all.elapsed.as_secs_f64());
    }
    all.lat.sort_unstable();
    all
}

/// A progress bar on stderr (a terminal only; logs get one line per run instead).
fn progress(label: String, total: usize, done: Arc<AtomicU64>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        if !std::io::stderr().is_terminal() {
            return;
        }
        loop {
            let d = done.load(Ordering::Relaxed) as usize;
            let filled = d * 30 / total.max(1);
            eprint!("\r  {label:<44} [{}{}] {d}/{total}", "#".repeat(filled), ".".repeat(30 - filled));
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
    })
}

/// [`drive`] for one scripted operation per call: `make(i)` builds it, each client runs it
/// (one round trip), `ok` says whether its outcome counts as a success.
pub async fn run_ops<D, O, F>(
    label: Option<&str>,
    clients: Vec<D>,
    ops: usize,
    make: F,
    ok: fn(&O::Outcome) -> bool,
) -> Totals
where
    D: Driver + Send + Sync + 'static,
    O: Operation + Send + Sync + 'static,
    O::Outcome: Send,
    F: Fn(usize) -> Result<O, Error> + Send + Sync + 'static,
{
    let make = Arc::new(make);
    drive(label, clients, ops, move |d, i| {
        let make = make.clone();
        async move {
            let op = make(i)?;
            Ok(Sample::one(ok(&d.run(&op).await?)))
        }
    })
    .await
}

/// The `p` quantile (0.0 to 1.0) of `sorted` latencies, nearest rank; zero if none.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() { Duration::ZERO } else { sorted[((sorted.len() as f64 - 1.0) * p).round() as usize] }
}

/// One measured row of a table.
#[derive(Debug, Clone)]
pub struct Row {
    /// Scenario.
    pub scenario: &'static str,
    /// Variant (transport, or client-side way).
    pub variant: &'static str,
    /// Operations.
    pub ops: usize,
    /// Wall time.
    pub elapsed: Duration,
    /// Median latency.
    pub p50: Duration,
    /// 99th percentile latency.
    pub p99: Duration,
    /// 99.9th percentile latency.
    pub p999: Duration,
    /// Operations that took 20 ms or more (a pause of the server, not of one request's work).
    pub slow: usize,
    /// Round trips to Redis (or HTTP requests) in all.
    pub round_trips: u64,
    /// Optimistic-lock retries in all.
    pub retries: u64,
    /// Operations that returned an error.
    pub errors: u64,
    /// Invariant violations found (see [`Row::checked`]).
    pub violations: u64,
    /// What the violations are.
    pub note: String,
    /// Operations that won / were allowed / applied.
    pub successes: u64,
}

impl Row {
    /// The row of one run, no invariant checked yet.
    pub fn new(scenario: &'static str, variant: &'static str, t: &Totals) -> Row {
        Row {
            scenario,
            variant,
            ops: t.ops,
            elapsed: t.elapsed,
            p50: percentile(&t.lat, 0.5),
            p99: percentile(&t.lat, 0.99),
            p999: percentile(&t.lat, 0.999),
            slow: t.lat.iter().filter(|d| d.as_millis() >= 20).count(),
            round_trips: t.round_trips,
            retries: t.retries,
            errors: t.errors,
            violations: 0,
            note: String::new(),
            successes: t.ok,
        }
    }

    /// With the invariant check's verdict: `violations` described by `note`. An error counts
    /// as a violation too, since an operation that failed cannot be shown to have kept it.
    pub fn checked(self, violations: u64, note: String) -> Row {
        let note = if self.errors > 0 { format!("{note} {} errors", self.errors).trim().to_string() } else { note };
        Row { violations: violations + self.errors, note, ..self }
    }

    /// Operations per second.
    pub fn ops_per_sec(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64()
    }
}

/// Formats a duration in ms with 3 decimals.
pub fn ms(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1000.0)
}

/// `n` clients, each opened by `connect` (so each has its own connection).
pub async fn connect_all<D, E, F, Fut>(n: usize, connect: F) -> Result<Vec<D>, Error>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<D, E>>,
    E: Into<Error>,
{
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        v.push(connect().await.map_err(Into::into)?);
    }
    Ok(v)
}

/// A lean HTTP/1.1 client for load generation: one keep-alive connection of its own (as a
/// worker isolate's fetch would hold), no pool, no retries. It measures the server, not a
/// heavyweight client beside it on the same cores.
pub struct LeanHttp {
    conn: tokio::sync::Mutex<hyper::client::conn::http1::SendRequest<http_body_util::Full<bytes::Bytes>>>,
    authority: String,
}

impl std::fmt::Debug for LeanHttp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeanHttp").field("authority", &self.authority).finish_non_exhaustive()
    }
}

impl LeanHttp {
    /// Opens one connection to `url` (`http://host:port`).
    pub async fn connect(url: &str) -> Result<Self, Error> {
        let authority = url.trim_start_matches("http://").trim_end_matches('/').to_string();
        let stream = tokio::net::TcpStream::connect(&authority).await.map_err(|e| Error::Failed(e.to_string()))?;
        stream.set_nodelay(true).map_err(|e| Error::Failed(e.to_string()))?;
        let (send, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| Error::Failed(e.to_string()))?;
        tokio::spawn(conn);
        Ok(LeanHttp { conn: tokio::sync::Mutex::new(send), authority })
    }

    /// POSTs `body` to `path` with extra headers; returns status and body.
    pub async fn post(&self, path: &str, headers: &[(&str, &str)], body: String) -> Result<(u16, bytes::Bytes), Error> {
        use http_body_util::BodyExt;
        let mut req =
            hyper::Request::post(path).header("host", &self.authority).header("content-type", "application/json");
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req =
            req.body(http_body_util::Full::new(bytes::Bytes::from(body))).map_err(|e| Error::Failed(e.to_string()))?;
        let mut conn = self.conn.lock().await;
        conn.ready().await.map_err(|e| Error::Failed(e.to_string()))?;
        let resp = conn.send_request(req).await.map_err(|e| Error::Failed(e.to_string()))?;
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await.map_err(|e| Error::Failed(e.to_string()))?.to_bytes();
        Ok((status, body))
    }
}

/// A leaner HTTP/1.1 client for the fronts (redcount-rest, webdis), whose responses always
/// carry a `Content-Length`: one kept-alive connection of its own, each request written in
/// one `write` from bytes of which all but the body were made once, the response head parsed
/// with `httparse` in the task that sent it (no connection task to hand over to and back). On
/// a 2-core machine shared with the front and Redis, every microsecond the generator spends is
/// taken from the front.
pub struct KeptAlive {
    conn: tokio::sync::Mutex<(tokio::net::TcpStream, Vec<u8>)>,
    /// `Host` and `Content-Type`, then the caller's fixed headers, each line ending `\r\n`.
    fixed: String,
}

impl std::fmt::Debug for KeptAlive {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeptAlive").finish_non_exhaustive()
    }
}

impl KeptAlive {
    /// Opens one connection to `url` (`http://host:port`); `headers` go with every request.
    pub async fn connect(url: &str, headers: &[(&str, &str)]) -> Result<Self, Error> {
        let failed = |e: std::io::Error| Error::Failed(format!("{url}: {e}"));
        let authority = url.trim_start_matches("http://").trim_end_matches('/');
        let stream = tokio::net::TcpStream::connect(authority).await.map_err(failed)?;
        stream.set_nodelay(true).map_err(failed)?;
        let mut fixed = format!("host: {authority}\r\ncontent-type: application/json\r\n");
        for (k, v) in headers {
            fixed.push_str(&format!("{k}: {v}\r\n"));
        }
        Ok(KeptAlive { conn: tokio::sync::Mutex::new((stream, Vec::with_capacity(4096))), fixed })
    }

    /// POSTs `body` to `path`; returns status and body.
    pub async fn post(&self, path: &str, body: &str) -> Result<(u16, bytes::Bytes), Error> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let failed = |e: std::io::Error| Error::Failed(e.to_string());
        let mut conn = self.conn.lock().await;
        let (stream, buf) = &mut *conn;
        let mut request = Vec::with_capacity(self.fixed.len() + path.len() + body.len() + 64);
        request.extend_from_slice(b"POST ");
        request.extend_from_slice(path.as_bytes());
        request.extend_from_slice(b" HTTP/1.1\r\n");
        request.extend_from_slice(self.fixed.as_bytes());
        request.extend_from_slice(format!("content-length: {}\r\n\r\n", body.len()).as_bytes());
        request.extend_from_slice(body.as_bytes());
        stream.write_all(&request).await.map_err(failed)?;
        buf.clear();
        let (status, start, length) = loop {
            let mut headers = [httparse::EMPTY_HEADER; 32];
            let mut head = httparse::Response::new(&mut headers);
            if let httparse::Status::Complete(n) = head.parse(buf).map_err(|e| Error::Failed(e.to_string()))? {
                let length = head.headers.iter().find(|h| h.name.eq_ignore_ascii_case("content-length"));
                let length = length.and_then(|h| std::str::from_utf8(h.value).ok()?.trim().parse::<usize>().ok());
                let Some(length) = length else {
                    return Err(Error::Failed("a response without Content-Length".into()));
                };
                break (head.code.unwrap_or(0), n, length);
            }
            if buf.len() > 64 * 1024 || stream.read_buf(buf).await.map_err(failed)? == 0 {
                return Err(Error::Failed("the connection closed before a response".into()));
            }
        };
        while buf.len() < start + length {
            if stream.read_buf(buf).await.map_err(failed)? == 0 {
                return Err(Error::Failed("the connection closed within a response".into()));
            }
        }
        Ok((status, bytes::Bytes::copy_from_slice(&buf[start..start + length])))
    }
}

/// A lean REST driver: [`KeptAlive`] speaking the Upstash REST protocol.
#[derive(Debug)]
pub struct LeanRest {
    http: KeptAlive,
}

impl LeanRest {
    /// Opens one connection to `url` (`http://host:port`).
    pub async fn connect(url: &str, token: &str) -> Result<Self, Error> {
        let headers = [
            ("authorization", format!("Bearer {token}")),
            (redcount_core::rest::ENCODING_HEADER, redcount_core::rest::ENCODING_BASE64.to_string()),
        ];
        let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        Ok(LeanRest { http: KeptAlive::connect(url, &headers).await? })
    }
}

impl Driver for LeanRest {
    async fn send(&self, command: &redcount_core::Command) -> Result<redcount_core::Value, redcount::Error> {
        let (status, body) = self.http.post("/", &command.to_rest_body()).await.map_err(|e| {
            redcount::Error::Transport(redcount::Transport {
                may_have_run: true,
                timed_out: false,
                detail: e.to_string(),
            })
        })?;
        redcount_core::rest::decode_reply(status, &body, redcount_core::rest::Encoding::Base64).map_err(|e| match e {
            redcount_core::rest::RestError::Reply(r) => redcount::Error::Redis(r),
            other => redcount::Error::Protocol(other.to_string()),
        })
    }
}
