//! `redcount serve`: the HTTP API and the demo page, natively.
//!
//! The same `redcount_api` functions as the worker; this module only does I/O:
//! HTTP in (axum), one call out per step (REST or RESP), static files.

use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use rand::SeedableRng;
use redcount_api::{self as api, ApiRequest, ApiResponse, Config, Local, Step};

use redcount::{Direct, Error, Rest};

/// Where the API's Redis calls go.
#[derive(Debug, Clone)]
pub enum Backend {
    /// An Upstash-compatible REST front (the worker's path).
    Rest(Rest),
    /// Redis itself, over RESP.
    Direct(Direct),
}

struct Server {
    config: Config,
    backend: Backend,
    www: PathBuf,
    /// Longest a request body may take to arrive.
    body_timeout: std::time::Duration,
    /// The process's local decisions (denials repeated from memory, budget leases).
    local: std::sync::Mutex<Local>,
    /// Woken whenever a call's answer is learnt: a take told to wait for a borrow asks again.
    settled: tokio::sync::Notify,
    /// The local state's clock: ms since the server started (monotonic).
    started: std::time::Instant,
}

/// Cached denials one process keeps at most (each a few hundred bytes).
const DENIALS: usize = 16_384;
/// Leases one process holds at most.
const LEASES: usize = 1_024;
/// Longest a take waits for a borrow of the same subject under way before asking Redis itself.
pub const MOST_WAIT: std::time::Duration = std::time::Duration::from_secs(2);
/// Longest a graceful shutdown waits for the answers of its give-backs (each call is bounded
/// by `--timeout-ms` too); those unanswered by then may still run once Redis reads them.
pub const GIVE_BACK_WAIT: std::time::Duration = std::time::Duration::from_secs(5);
/// How often leases that ended while the server was idle are looked for.
const LEASE_TICK: std::time::Duration = std::time::Duration::from_millis(100);

impl Server {
    fn now(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    fn local(&self) -> std::sync::MutexGuard<'_, Local> {
        // A panic while holding it leaves a state that is only ever bounded and checked.
        self.local.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Learns from a step, waking the takes that wait for a borrow or refresh if one settled.
    fn after(&self, step: Step) -> Step {
        self.learn(|local, now| local.after(step, now))
    }

    fn answered(&self, r: ApiResponse) -> ApiResponse {
        self.learn(|local, now| local.answered(r, now))
    }

    fn learn<T>(&self, f: impl FnOnce(&mut Local, u64) -> T) -> T {
        let (out, woke) = {
            let mut local = self.local();
            let before = local.settled();
            let out = f(&mut local, self.now());
            (out, local.settled() != before)
        };
        if woke {
            self.settled.notify_waiters();
        }
        out
    }
}

/// The server as a router: the API under `/api/`, the demo page from `www` otherwise; a
/// request body must arrive within `body_timeout`. [`serve`] runs it within connection
/// bounds; a test can call it in-process:
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use tower::ServiceExt; // oneshot
/// use redcount_cli::serve::{Backend, app};
///
/// let policies = r#"{"per-day": {"kind": "quota", "algorithm": "fixed", "limit": 100, "window_ms": 86400000}}"#;
/// let config = redcount_api::Config::from_env(|name| (name == "REDCOUNT_POLICIES").then(|| policies.to_string()))?;
/// // A REST client connects on first use; listing the policies calls no backend.
/// let backend = Backend::Rest(redcount::Rest::new("http://127.0.0.1:8079", "token", std::time::Duration::from_secs(5))?);
/// let app = app(config, backend, "www".into(), std::time::Duration::from_secs(5));
/// let request = axum::http::Request::get("/api/policies").body(axum::body::Body::empty())?;
/// let response = app.oneshot(request).await?;
/// assert_eq!(response.status(), 200);
/// # Ok(()) }
/// ```
pub fn app(config: Config, backend: Backend, www: PathBuf, body_timeout: std::time::Duration) -> axum::Router {
    router(server(config, backend, www, body_timeout))
}

fn server(config: Config, backend: Backend, www: PathBuf, body_timeout: std::time::Duration) -> Arc<Server> {
    Arc::new(Server {
        config,
        backend,
        www,
        body_timeout,
        local: std::sync::Mutex::new(Local::new(DENIALS, LEASES, rand::random())),
        settled: tokio::sync::Notify::new(),
        started: std::time::Instant::now(),
    })
}

fn router(state: Arc<Server>) -> axum::Router {
    axum::Router::new().fallback(handle).with_state(state)
}

/// Serves [`app`] until the future `shutdown` completes, holding clients within `limits`
/// (connection cap, eviction at the cap, header/idle and stall timeouts); over HTTPS when
/// `tls` is given.
#[allow(clippy::too_many_arguments)]
pub async fn serve(
    listener: tokio::net::TcpListener,
    config: Config,
    backend: Backend,
    www: PathBuf,
    limits: redcount_http::Limits,
    body_timeout: std::time::Duration,
    tls: Option<redcount_http::Tls>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let s = server(config, backend, www, body_timeout);
    // Leases that end while no request comes are given back all the same.
    let ticker = tokio::spawn({
        let s = s.clone();
        async move {
            let mut tick = tokio::time::interval(LEASE_TICK);
            loop {
                tick.tick().await;
                background(&s);
            }
        }
    });
    let served = redcount_http::serve_tls(listener, router(s.clone()), limits, tls, shutdown).await;
    ticker.abort();
    give_back(&s).await;
    served
}

/// Sends the calls the local state has due (units of ended leases given back), in tasks of
/// their own.
fn background(s: &Arc<Server>) {
    let due = s.local().due(s.now());
    for ex in due {
        let s = s.clone();
        tokio::spawn(async move { drive(&s, Step::Send(ex)).await });
    }
}

/// A graceful shutdown: every unused unit of every lease given back (within [`GIVE_BACK_WAIT`]), and those
/// of borrows and renewals answered meanwhile. The give-backs go out at once, each in a task
/// of its own: one round trip for all of them, and every one sent before the bound even while
/// Redis does not answer (it runs them when it does).
async fn give_back(s: &Arc<Server>) {
    let returns = s.local().drain();
    let n = returns.len();
    let mut sent = tokio::task::JoinSet::new();
    let send = |sent: &mut tokio::task::JoinSet<bool>, ex| {
        let s = s.clone();
        sent.spawn(async move { drive(&s, Step::Send(ex)).await.status < 300 });
    };
    for ex in returns {
        send(&mut sent, ex);
    }
    let mut answered = 0;
    let all = async {
        while let Some(done) = sent.join_next().await {
            answered += usize::from(done.unwrap_or(false));
        }
        // Renewals in flight (background tasks): their units, lent to a closed state, are
        // given back below.
        loop {
            let settled = s.settled.notified();
            tokio::pin!(settled);
            settled.as_mut().enable();
            if s.local().renewing() == 0 {
                break;
            }
            settled.await;
        }
        // (Taken out first: the lock must not be held while they are driven, which locks it.)
        let late = s.local().due(s.now());
        for ex in late {
            send(&mut sent, ex);
        }
        while sent.join_next().await.is_some() {}
    };
    if tokio::time::timeout(GIVE_BACK_WAIT, all).await.is_err() {
        tracing::warn!("shutdown: not every lease's give-back was answered within {GIVE_BACK_WAIT:?}");
    }
    // Unanswered ones may have run (or run later, once Redis reads them), or not: their units
    // then stay charged.
    tracing::info!("shutdown: {answered} of {n} leases given back, the rest unanswered");
}

async fn handle(State(s): State<Arc<Server>>, method: Method, uri: Uri, headers: HeaderMap, body: Body) -> Response {
    if !uri.path().starts_with("/api/") {
        return static_file(&s.www, &method, uri.path()).await;
    }
    let header = |name: header::HeaderName| headers.get(name).and_then(|v| v.to_str().ok());
    let own = |r: ApiResponse| to_response(api::with_cors(&s.config, header(header::ORIGIN), r));
    // A declared body over the bound is refused before reading it (and before any
    // `100 Continue`).
    let declared = header(header::CONTENT_LENGTH).and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > api::MAX_BODY as u64) {
        return own(api::too_large());
    }
    let bytes = match tokio::time::timeout(s.body_timeout, axum::body::to_bytes(body, api::MAX_BODY)).await {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(e)) if redcount_http::body_framing_error(&e) => {
            return own(ApiResponse::error(400, format!("malformed request body: {e}"), None));
        }
        Ok(Err(_)) => return own(api::too_large()),
        Err(_) => return own(api::body_timeout(s.body_timeout.as_millis() as u64)),
    };
    // Two keys would let a proxy that keeps the other one apply a retry twice.
    if headers.get_all("idempotency-key").iter().count() > 1 {
        let why = "give one Idempotency-Key header, not several";
        return own(ApiResponse::error(400, why, Some("Idempotency-Key")));
    }
    let idem_key = headers.get("idempotency-key").map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let request = ApiRequest {
        method: method.as_str(),
        path: uri.path(),
        query: uri.query().unwrap_or(""),
        authorization: header(header::AUTHORIZATION),
        origin: header(header::ORIGIN),
        // Lossy, not dropped: a key with a non-ASCII byte must be refused (400), not ignored.
        idempotency_key: idem_key.as_deref(),
        body: &bytes,
    };
    let started = std::time::Instant::now();
    let mut rng = rand::rngs::StdRng::from_os_rng();
    let wait_until = tokio::time::Instant::now() + MOST_WAIT;
    let step = loop {
        // Registered before asking, so an answer learnt in between is not missed.
        let settled = s.settled.notified();
        tokio::pin!(settled);
        settled.as_mut().enable();
        let may_wait = tokio::time::Instant::now() < wait_until;
        let asked = s.local().handle(&s.config, &request, s.now(), may_wait, &mut rng);
        match asked {
            Ok(step) => break step,
            Err(api::Wait) => {
                let _ = tokio::time::timeout_at(wait_until, settled).await;
            }
        }
    };
    let response = match step {
        // A borrow's units are lost to every shell if its answer is dropped unread (a client
        // that went away): such a call is driven to its end in a task of its own.
        Step::Send(ex) if ex.must_finish() => {
            let task = tokio::spawn({
                let s = s.clone();
                async move { drive(&s, Step::Send(ex)).await }
            });
            task.await.unwrap_or_else(|_| ApiResponse::error(500, "internal error", None))
        }
        step => drive(&s, step).await,
    };
    background(&s);
    // From the route table: a fixed word per route family, and a configured policy's name only.
    let (route, policy) = api::route::labels(&s.config, method.as_str(), uri.path());
    let (status, policy) = (response.status.to_string(), policy.to_owned());
    metrics::counter!("redcount_requests_total", "route" => route, "policy" => policy, "status" => status).increment(1);
    metrics::histogram!("redcount_request_duration_seconds", "route" => route).record(started.elapsed().as_secs_f64());
    tracing::debug!(method = %method, route, status = response.status, "request");
    to_response(response)
}

/// Makes the calls a step asks for, one after the other, until the response.
async fn drive(s: &Server, mut step: Step) -> ApiResponse {
    let mut calls = 0u32;
    loop {
        match step {
            Step::Respond(r) => return r,
            Step::Script(exchange) => step = s.after(exchange.give_compiled_script()),
            Step::Send(exchange) => {
                calls += 1;
                if calls == 2 {
                    // The one fallback a call makes: EVAL after NOSCRIPT.
                    metrics::counter!("redcount_noscript_fallbacks_total").increment(1);
                }
                // The policy's own bound, if it declares one (`timeout_ms`): past it the call
                // is answered as its failure mode says.
                let limit = exchange.timeout_ms();
                let budget = limit.map(|ms| std::time::Duration::from_millis(ms.into()));
                let within = move |what: &'static str| {
                    format!("{what} did not answer within the policy's timeout_ms ({} ms)", limit.unwrap_or(0))
                };
                step = match &s.backend {
                    Backend::Rest(rest) => match bounded(budget, rest.post(exchange.body().to_string())).await {
                        // The front's --wait-replicas: the call ran, but is not known durable.
                        Some(Ok((503, body))) if not_durable(&body) => {
                            metrics::counter!("redcount_backend_errors_total", "kind" => "not_durable").increment(1);
                            let why = format!("the REST front says: {}", String::from_utf8_lossy(&body));
                            Step::Respond(s.answered(exchange.not_durable(&why)))
                        }
                        Some(Ok((status, body))) => s.after(exchange.receive(status, &body)),
                        Some(Err(e)) => {
                            report_backend_error(&e);
                            Step::Respond(s.answered(exchange.fail(&e.to_string())))
                        }
                        None => {
                            let why = within("the REST front");
                            Step::Respond(s.answered(exchange.fail(&why)))
                        }
                    },
                    Backend::Direct(d) => match bounded(budget, d.send(exchange.command())).await {
                        Some(Ok(v)) => s.after(exchange.receive_value(Ok(v))),
                        Some(Err(Error::Redis(e))) => s.after(exchange.receive_value(Err(e))),
                        Some(Err(Error::NotDurable(why))) => {
                            metrics::counter!("redcount_backend_errors_total", "kind" => "not_durable").increment(1);
                            tracing::warn!("backend: not known durable: {why}");
                            Step::Respond(s.answered(exchange.not_durable(&format!("Redis: {why}"))))
                        }
                        Some(Err(e)) => {
                            report_backend_error(&e);
                            Step::Respond(s.answered(exchange.fail_at("Redis", &e.to_string())))
                        }
                        None => {
                            let why = within("Redis");
                            Step::Respond(s.answered(exchange.fail_at("Redis", &why)))
                        }
                    },
                };
            }
        }
    }
}

/// Whether a REST front's 503 says a call ran but is not known durable (`"durable": false`).
fn not_durable(body: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(body).is_ok_and(|v| v["durable"] == serde_json::Value::Bool(false))
}

/// `call`, given up after `budget` when there is one (`None` then).
async fn bounded<T>(budget: Option<std::time::Duration>, call: impl std::future::Future<Output = T>) -> Option<T> {
    match budget {
        Some(b) => tokio::time::timeout(b, call).await.ok(),
        None => Some(call.await),
    }
}

/// Counts and logs a call that did not reach the backend or got no answer, by what happened.
fn report_backend_error(e: &Error) {
    tracing::warn!("backend: {e}");
    let kind = match e {
        Error::Transport(t) if t.timed_out => "timeout",
        Error::Transport(t) if t.may_have_run => "lost",
        Error::Transport(_) => "unreachable",
        Error::Unauthorized(_) => "unauthorized",
        _ => "other",
    };
    metrics::counter!("redcount_backend_errors_total", "kind" => kind).increment(1);
}

fn to_response(r: ApiResponse) -> Response {
    let status = StatusCode::from_u16(r.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut headers = HeaderMap::new();
    for (k, v) in r.header_list() {
        if let Ok(v) = header::HeaderValue::from_str(v) {
            headers.append(k, v);
        }
    }
    // No body at all for 204 (an empty String would make axum add a text Content-Type).
    let body = if r.status == 204 { Body::empty() } else { Body::from(r.body) };
    (status, headers, body).into_response()
}

/// The demo page's files; nothing outside `www` is reachable.
async fn static_file(www: &Path, method: &Method, path: &str) -> Response {
    // Outside /api/ only the demo page's files: say so in JSON, as the API's errors do.
    let not_found = || to_response(ApiResponse::error(404, "no such file (the API is under /api/)", None));
    if method != Method::GET && method != Method::HEAD {
        let why = format!(
            "method {} not allowed here: outside /api/ only the demo page's files are served (GET, HEAD)",
            method.as_str().escape_default()
        );
        let mut r = ApiResponse::error(405, why, None);
        r.headers.push(("Allow", "GET, HEAD".to_string()));
        return to_response(r);
    }
    let rel = path.trim_start_matches('/');
    let rel = if rel.is_empty() { "index.html" } else { rel };
    let rel = Path::new(rel);
    if !rel.components().all(|c| matches!(c, Component::Normal(_))) {
        return not_found();
    }
    let file = www.join(rel);
    let kind = match file.extension().and_then(|e| e.to_str()) {
        Some("html") => "text/html; charset=utf-8",
        Some("js" | "mjs") => "text/javascript; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("svg") => "image/svg+xml",
        Some("png") => "image/png",
        Some("json") => "application/json",
        _ => "application/octet-stream",
    };
    match tokio::fs::read(&file).await {
        Ok(bytes) => ([(header::CONTENT_TYPE, kind)], bytes).into_response(),
        Err(_) => not_found(),
    }
}
