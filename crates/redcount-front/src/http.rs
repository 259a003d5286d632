//! The HTTP side: the one route, what every request goes through before its commands (method,
//! token, body budget and time), then its commands (checked, then run by the driver), and the
//! request's metrics and log line.

use std::sync::Arc;
use std::time::Instant;

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use futures_util::FutureExt;

use crate::State;
use crate::auth::{self, Access};
use crate::driver;
use crate::failure::{Failure, error};
use crate::request::{self, Cmd, Format, Request};

/// The front as an HTTP service: every request goes to one handler, which reads the route from
/// the path, so no router runs in between. Cloned per request (an `Arc`). Made by
/// [`crate::app`], served by [`crate::serve`].
#[derive(Clone)]
pub struct Front(Arc<State>);

impl std::fmt::Debug for Front {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Front").finish_non_exhaustive()
    }
}

impl Front {
    pub(crate) fn new(state: Arc<State>) -> Front {
        Front(state)
    }
}

impl tower_service::Service<axum::extract::Request> for Front {
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: axum::extract::Request) -> Self::Future {
        let (parts, body) = req.into_parts();
        // Boxed once, here: the request's future (every route inlined) is kilobytes, and
        // anything that moved it by value would copy it (BENCHMARKS.md).
        Box::pin(handle(self.0.clone(), parts.method, parts.uri, parts.headers, body).map(Ok))
    }
}

async fn handle(st: Arc<State>, method: Method, uri: Uri, headers: HeaderMap, body: Body) -> Response {
    let start = Instant::now();
    let (mut response, what) = match serve(&st, &method, &uri, &headers, body).await {
        Ok((r, what)) => (r, what),
        Err((f, what)) => (f.into_response(), what),
    };
    // Read-your-writes: the official clients echo this token on their next request. Every
    // read here goes to the primary that took the write, so any fresh token keeps the promise.
    static SYNC: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let token = SYNC.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    static SYNC_TOKEN: HeaderName = HeaderName::from_static("upstash-sync-token");
    response.headers_mut().insert(&SYNC_TOKEN, HeaderValue::from(token));
    let (route, status, elapsed) = (path_kind(uri.path()), response.status().as_u16(), start.elapsed());
    st.requests.count(route, status, elapsed);
    if tracing::enabled!(tracing::Level::DEBUG) {
        // A known command's name (see `Table::log_name`), cut short in the log.
        let command: String = what
            .chars()
            .take(32)
            .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '|') { c } else { '?' })
            .collect();
        tracing::debug!(%method, route = ROUTES[route], %command, status, elapsed_ms = elapsed.as_secs_f64() * 1e3, "request");
    }
    response
}

/// The routes, as metric labels.
const ROUTES: [&str; 4] = ["/", "/pipeline", "/multi-exec", "/<command>"];

/// The statuses most requests end with, registered ahead.
const STATUSES: [u16; 5] = [200, 400, 401, 403, 503];

/// The requests' metrics, by route and status: labels from a fixed set only, never the
/// client's command names. The common ones are registered once, when the front is made (after
/// `--metrics-listen` installed its recorder), so a request only adds to them.
pub(crate) struct Requests {
    counted: [[metrics::Counter; STATUSES.len()]; ROUTES.len()],
    durations: [metrics::Histogram; ROUTES.len()],
}

impl Requests {
    pub(crate) fn new() -> Requests {
        let counter = |route: &'static str, status: u16| metrics::counter!("redcount_rest_requests_total", "route" => route, "status" => status.to_string());
        Requests {
            counted: ROUTES.map(|r| STATUSES.map(|s| counter(r, s))),
            durations: ROUTES.map(|r| metrics::histogram!("redcount_rest_request_duration_seconds", "route" => r)),
        }
    }

    fn count(&self, route: usize, status: u16, elapsed: std::time::Duration) {
        match STATUSES.iter().position(|s| *s == status) {
            Some(i) => self.counted[route][i].increment(1),
            None => {
                let (route, status) = (ROUTES[route], status.to_string());
                metrics::counter!("redcount_rest_requests_total", "route" => route, "status" => status).increment(1);
            }
        }
        self.durations[route].record(elapsed.as_secs_f64());
    }
}

/// The route (its place in [`ROUTES`]), without path-style arguments (they may be data).
fn path_kind(path: &str) -> usize {
    match path {
        "/" => 0,
        "/pipeline" => 1,
        "/multi-exec" => 2,
        _ => 3,
    }
}

/// A response, or a failure; with what the request ran, for the log.
type Served = Result<(Response, String), (Failure, String)>;

/// What the log names a request by, made only when requests are logged.
fn logged(what: impl FnOnce() -> String) -> String {
    if tracing::enabled!(tracing::Level::DEBUG) { what() } else { String::new() }
}

/// What the log names a request by before its commands are known.
fn none() -> String {
    String::from("-")
}

async fn serve(st: &State, method: &Method, uri: &Uri, headers: &HeaderMap, body: Body) -> Served {
    if !request::method_allowed(method) {
        return Err((error(StatusCode::METHOD_NOT_ALLOWED, format!("ERR method {method} is not allowed")), none()));
    }
    let access = admit(st, headers).map_err(|f| (f, none()))?;
    // Bodies being received count against --max-inflight-body-bytes (their declared length,
    // else the largest allowed) until the response: thousands of slow 1 MB bodies cannot add
    // up to gigabytes.
    let declared =
        headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.trim().parse::<u64>().ok());
    // A body declared over the bound is refused before any of it is read, not after the
    // request timeout for a body that may never come.
    if declared.is_some_and(|n| n > st.max_body as u64) {
        return Err((too_large(st), none()));
    }
    let declared = declared.map_or(st.max_body, |n| n as usize);
    // Small bodies (most commands) are not counted, so large slow ones cannot starve them;
    // all of them together are bounded by the connection cap.
    let kib = if declared <= 16 * 1024 { 0 } else { u32::try_from(declared.div_ceil(1024)).unwrap_or(u32::MAX) };
    let Ok(_body_permit) = st.body_budget.try_acquire_many(kib) else {
        let why = "ERR too many request bodies in flight (--max-inflight-body-bytes); retry shortly";
        return Err((error(StatusCode::SERVICE_UNAVAILABLE, why), none()));
    };
    let bytes = read_body(st, body).await.map_err(|f| (f, none()))?;
    match request::parse(method, uri, headers, &bytes).map_err(|f| (f, none()))? {
        Request::Subscribe { pattern, names } => {
            let what = String::from(if pattern { "PSUBSCRIBE" } else { "SUBSCRIBE" });
            match Box::pin(crate::subscribe::serve(st, &access, pattern, names)).await {
                Ok(r) => Ok((r, what)),
                Err((status, msg)) => Err((error(status, msg), what)),
            }
        }
        Request::One(cmd, format) => one(st, &access, cmd, format).await,
        Request::Many { entries, atomic, format } => many(st, &access, entries, atomic, format).await,
    }
}

/// The request's token, and what it may do; refused without one, and while the front cannot
/// keep its rules on a `--tokens` token's Redis user.
fn admit(st: &State, headers: &HeaderMap) -> Result<Access, Failure> {
    let authz = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    let scoped = st.scoped.read().unwrap_or_else(|e| e.into_inner()).clone();
    let Some(access) = auth::check(authz, &st.token, st.readonly_token.as_deref(), &scoped) else {
        return Err(error(
            StatusCode::UNAUTHORIZED,
            "Unauthorized: a valid `Authorization: Bearer <token>` header is required",
        ));
    };
    if let Access::Scoped { guarded, .. } = &access
        && let Some(why) = guarded.refusal()
    {
        return Err(error(StatusCode::SERVICE_UNAVAILABLE, why));
    }
    Ok(access)
}

/// The request's body, read under the request timeout (a trickled body cannot hold a
/// connection) and within `--max-body-bytes`.
async fn read_body(st: &State, body: Body) -> Result<Bytes, Failure> {
    match tokio::time::timeout(st.timeout, axum::body::to_bytes(body, st.max_body)).await {
        Err(_) => Err(error(
            StatusCode::REQUEST_TIMEOUT,
            format!("ERR the request body did not arrive within {} ms", st.timeout.as_millis()),
        )),
        Ok(Err(e)) if redcount_http::body_framing_error(&e) => {
            Err(error(StatusCode::BAD_REQUEST, format!("ERR malformed request body: {e}")))
        }
        Ok(read) => read.map_err(|_| too_large(st)),
    }
}

fn too_large(st: &State) -> Failure {
    error(StatusCode::PAYLOAD_TOO_LARGE, format!("ERR request body larger than {} bytes", st.max_body))
}

/// One command, whichever way it came (a JSON array or a path): checked against the token's
/// access, run, and a lost connection explained; with its name for the log.
async fn one(st: &State, access: &Access, cmd: Cmd, format: Format) -> Served {
    let what = logged(|| st.commands.log_name(&cmd.name));
    if let Err(f) = st.rules().check(&cmd, access) {
        return Err((f, what));
    }
    let small = driver::small_reply(&cmd);
    match driver::run_one(st, access, cmd, format).await {
        Ok(r) => Ok((r, what)),
        Err(f) => Err((Box::pin(driver::explain_lost(st, f, small)).await, what)),
    }
}

/// A `/pipeline` or `/multi-exec`: each entry checked (a refused one answers for itself in a
/// pipeline, and refuses a transaction whole), a transaction's size bounded, then run.
async fn many(st: &State, access: &Access, entries: Vec<Result<Cmd, Failure>>, atomic: bool, format: Format) -> Served {
    let rules = st.rules();
    let entries: Vec<Result<Cmd, Failure>> =
        entries.into_iter().map(|e| e.and_then(|c| rules.check(&c, access).map(|()| c))).collect();
    if atomic && entries.len() > st.max_transaction {
        let why = format!(
            "ERR a transaction runs in Redis at once, with no stop after --timeout-ms: at most {} commands (--max-transaction-commands); send more as a /pipeline",
            st.max_transaction
        );
        return Err((error(StatusCode::BAD_REQUEST, why), none()));
    }
    let what = logged(|| {
        let first = entries.iter().find_map(|e| e.as_ref().ok()).map(|c| st.commands.log_name(&c.name));
        format!("{}x{}", entries.len(), first.unwrap_or_default())
    });
    // A transaction is all or nothing: one refused entry refuses it whole.
    let entries = if atomic {
        match entries.into_iter().collect::<Result<Vec<Cmd>, Failure>>() {
            Ok(cmds) => cmds.into_iter().map(Ok).collect(),
            Err(f) => return Err((f, what)),
        }
    } else {
        entries
    };
    let small = entries.iter().all(|e| e.as_ref().is_ok_and(driver::small_reply));
    match Box::pin(driver::run_many(st, access, entries, atomic, format)).await {
        Ok(r) => Ok((r, what)),
        Err(f) => Err((Box::pin(driver::explain_lost(st, f, small)).await, what)),
    }
}

/// The request-parsing path of the front, on arbitrary input (for the fuzz target): path
/// segments, one JSON command, a JSON pipeline, the refusal rules and script rewriting.
pub(crate) fn fuzz_parse(path: &str, body: &[u8]) {
    let bytes = Bytes::copy_from_slice(body);
    for seg in path.split('/') {
        let _ = request::percent_decode(seg);
    }
    let mut cmds: Vec<Cmd> = request::parse_one(&bytes).into_iter().collect();
    if let Ok(many) = request::parse_many(&bytes) {
        cmds.extend(many.into_iter().flatten());
    }
    for c in &cmds {
        let _ = crate::commands::refusal(&c.name, &c.args);
        if let Some(src) = c.args.first() {
            let _ = crate::scripts::rewrite(src);
        }
    }
    let _ = crate::scripts::rewrite(body);
}
