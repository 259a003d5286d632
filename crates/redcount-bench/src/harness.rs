//! Load generation: the same operations through different transports, side by side.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use redcount_core::ops::quota::{Algorithm, Quota};
use redcount_core::ops::redpacket::{self, Create, Grab, GrabOutcome};

use redcount::{Driver, Error};

/// What one run measured.
#[derive(Debug, Clone)]
pub struct Measurement {
    /// Scenario name.
    pub scenario: &'static str,
    /// Transport name.
    pub transport: String,
    /// Operations completed.
    pub ops: usize,
    /// Operations that failed.
    pub errors: usize,
    /// Wall time.
    pub elapsed: Duration,
    /// Median latency.
    pub p50: Duration,
    /// 99th percentile latency.
    pub p99: Duration,
    /// Shares won (grab scenario), or calls allowed (quota scenario).
    pub successes: usize,
}

impl Measurement {
    /// Operations per second.
    pub fn ops_per_sec(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64()
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// Runs `ops` calls of `call(i)` from `concurrency` tasks; each task uses its own driver.
async fn drive<D, F, Fut>(drivers: Vec<D>, ops: usize, call: F) -> (Vec<Duration>, usize, usize, Duration)
where
    D: Driver + Send + 'static,
    F: Fn(Arc<D>, usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<bool, Error>> + Send,
{
    let next = Arc::new(AtomicUsize::new(0));
    let call = Arc::new(call);
    let start = Instant::now();
    let tasks: Vec<_> = drivers
        .into_iter()
        .map(|d| {
            let (next, call, d) = (next.clone(), call.clone(), Arc::new(d));
            tokio::spawn(async move {
                let (mut lat, mut errors, mut ok) = (Vec::new(), 0, 0);
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= ops {
                        break;
                    }
                    let t = Instant::now();
                    match call(d.clone(), i).await {
                        Ok(true) => ok += 1,
                        Ok(false) => {}
                        Err(_) => errors += 1,
                    }
                    lat.push(t.elapsed());
                }
                (lat, errors, ok)
            })
        })
        .collect();
    let (mut all, mut errors, mut ok) = (Vec::with_capacity(ops), 0, 0);
    for t in tasks {
        let (lat, e, o) = t.await.expect("bench task");
        all.extend(lat);
        errors += e;
        ok += o;
    }
    let elapsed = start.elapsed();
    all.sort_unstable();
    (all, errors, ok, elapsed)
}

/// Red-packet storm: `ops` distinct users grab from packets of 10,000 shares (one per
/// 10,000 users), so every grab does the full winning path.
pub async fn grab_storm<D: Driver + Send + 'static>(
    transport: &str,
    drivers: Vec<D>,
    ops: usize,
) -> Result<Measurement, Error> {
    let mut rng = rand_seed();
    let packets: Vec<String> = (0..ops.div_ceil(10_000)).map(|_| redpacket::new_id(&mut rng)).collect();
    for id in &packets {
        drivers[0].run(&Create::new(id, 100_000_000, 10_000, 1, 3_600_000, &mut rng)?).await?;
    }
    let packets = Arc::new(packets);
    let run = format!("{:x}", rand::random::<u32>());
    let (lat, errors, won, elapsed) = drive(drivers, ops, move |d, i| {
        let (packets, run) = (packets.clone(), run.clone());
        async move {
            let op = Grab::new(&packets[i / 10_000], &format!("u{run}-{i}"))?;
            Ok(matches!(d.run(&op).await?, GrabOutcome::Won { .. }))
        }
    })
    .await;
    Ok(Measurement {
        scenario: "redpacket grab",
        transport: transport.into(),
        ops,
        errors,
        elapsed,
        p50: percentile(&lat, 0.5),
        p99: percentile(&lat, 0.99),
        successes: won,
    })
}

/// Quota burst: `ops` calls spread over 1,000 subjects, fixed window of 100 per hour.
pub async fn quota_burst<D: Driver + Send + 'static>(
    transport: &str,
    drivers: Vec<D>,
    ops: usize,
) -> Result<Measurement, Error> {
    let run = format!("{:x}", rand::random::<u32>());
    let algo = Algorithm::FixedWindow { limit: 100, window_ms: 3_600_000 };
    let (lat, errors, allowed, elapsed) = drive(drivers, ops, move |d, i| {
        let run = run.clone();
        async move {
            let op = Quota::take("bench", &format!("s{run}-{}", i % 1000), algo, 1)?;
            Ok(d.run(&op).await?.allowed)
        }
    })
    .await;
    Ok(Measurement {
        scenario: "quota take",
        transport: transport.into(),
        ops,
        errors,
        elapsed,
        p50: percentile(&lat, 0.5),
        p99: percentile(&lat, 0.99),
        successes: allowed,
    })
}

fn rand_seed() -> rand::rngs::StdRng {
    use rand::SeedableRng;
    rand::rngs::StdRng::from_os_rng()
}

/// Formats a duration in ms with 3 decimals.
pub fn ms(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1000.0)
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
        let stream = tokio::net::TcpStream::connect(&authority).await.map_err(|e| Error::Io(e.to_string()))?;
        stream.set_nodelay(true).map_err(|e| Error::Io(e.to_string()))?;
        let (send, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| Error::Io(e.to_string()))?;
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
        let req = req
            .body(http_body_util::Full::new(bytes::Bytes::from(body)))
            .map_err(|e| Error::Protocol(e.to_string()))?;
        let mut conn = self.conn.lock().await;
        conn.ready().await.map_err(|e| Error::Io(e.to_string()))?;
        let resp = conn.send_request(req).await.map_err(|e| Error::Io(e.to_string()))?;
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await.map_err(|e| Error::Io(e.to_string()))?.to_bytes();
        Ok((status, body))
    }
}

/// A lean REST driver: [`LeanHttp`] speaking the Upstash REST protocol.
#[derive(Debug)]
pub struct LeanRest {
    http: LeanHttp,
    auth: String,
}

impl LeanRest {
    /// Opens one connection to `url` (`http://host:port`).
    pub async fn connect(url: &str, token: &str) -> Result<Self, Error> {
        Ok(LeanRest { http: LeanHttp::connect(url).await?, auth: format!("Bearer {token}") })
    }
}

impl Driver for LeanRest {
    async fn send(&self, command: &redcount_core::Command) -> Result<redcount_core::Value, Error> {
        let headers = [
            ("authorization", self.auth.as_str()),
            (redcount_core::rest::ENCODING_HEADER, redcount_core::rest::ENCODING_BASE64),
        ];
        let (status, body) = self.http.post("/", &headers, command.to_rest_body()).await?;
        redcount_core::rest::decode_reply(status, &body, redcount_core::rest::Encoding::Base64).map_err(|e| match e {
            redcount_core::rest::RestError::Reply(r) => Error::Redis(r),
            other => Error::Protocol(other.to_string()),
        })
    }
}
