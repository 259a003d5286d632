//! The HTTP side: routes, auth, body limits, argument parsing, status codes.

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State as Extract;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use redcount_core::{ErrorKind, ErrorReply};
use redis::Value;
use serde_json::value::RawValue;
use serde_json::{Value as Json, json};

use crate::State;
use crate::auth::{self, Access};
use crate::backend::{BUDGET_SPENT, Backend, Failed, Held, Lane, TOO_LARGE};
use crate::commands;
use crate::reply;
use crate::scripts::{self, Rewritten};

/// The front's HTTP routes.
pub(crate) fn router(state: Arc<State>) -> Router {
    Router::new().fallback(handle).with_state(state)
}

/// One parsed command: name and arguments as bytes.
struct Cmd {
    name: String,
    args: Vec<Vec<u8>>,
}

/// A request's failure: the status and message the client gets, and why, classified once
/// where it happened (later decisions match on `cause`, never on the message's text).
struct Failure {
    status: StatusCode,
    message: String,
    cause: Cause,
}

/// Why a request failed, as far as later steps care.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cause {
    /// Redis answered with an error reply of this kind (the core's one classification: e.g.
    /// `Unavailable` for BUSY / LOADING / TRYAGAIN / CLUSTERDOWN / MASTERDOWN / NOREPLICAS, which ran
    /// nothing and will serve again soon; `Redirect` for a MOVED / ASK the client library's
    /// own redirect budget did not follow).
    Reply(redcount_core::ErrorKind),
    /// The connection ended after the command was sent, before its answer.
    Lost,
    /// A money call ran, but fewer replicas than `--wait-replicas` acknowledged its write.
    NotDurable,
    /// No answer within the request's time limit (it may have run).
    TimedOut,
    /// Redis discarded a transaction whole (EXECABORT): nothing of it ran.
    ExecAbort,
    /// Anything else (refused input, limits).
    Other,
}

/// How a request whose connection Redis closed before the answer fails.
const LOST: &str = "ERR the connection to Redis ended before its answer";

/// The run id of the Redis `backend` reaches (INFO server), if it answers within 500 ms.
pub(crate) async fn run_id(backend: &crate::backend::Backend) -> Option<String> {
    let info =
        tokio::time::timeout(std::time::Duration::from_millis(500), backend.query(redis::cmd("INFO").arg("server")))
            .await
            .ok()?
            .ok()?;
    let text = match info {
        Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
        Value::VerbatimString { text, .. } => text,
        _ => return None,
    };
    text.lines().find_map(|l| l.strip_prefix("run_id:")).map(|id| id.trim().to_string())
}

/// A connection Redis closed in the middle of a request while Redis itself stayed up (same
/// run id) was dropped on purpose, and with the front's output-buffer limit in force the
/// reason is most likely that the reply passed it: say so, as the client's error. Not for
/// `small` requests (redcount's own scripts, whose replies are a few integers): those lost
/// their connection some other way (a kill, the network) and stay a 503.
async fn explain_lost(st: &State, f: Failure, small: bool) -> Failure {
    if small || f.cause != Cause::Lost || st.output_limit == 0 {
        return f;
    }
    let Some(known) = st.run_id.lock().unwrap_or_else(|e| e.into_inner()).clone() else { return f };
    let now = run_id(&st.killer).await;
    if now.as_ref() != Some(&known) {
        // Redis restarted: this connection may have ended with it, so this answer stays a
        // 503; later ones are judged against the new Redis once the limit is seen there.
        if let Some(now) = now
            && limit_in_force(st).await
        {
            *st.run_id.lock().unwrap_or_else(|e| e.into_inner()) = Some(now);
        }
        return f;
    }
    error(
        StatusCode::BAD_REQUEST,
        format!(
            "ERR Redis closed the connection instead of answering: the reply passed its output-buffer limit for normal clients ({} bytes, --redis-output-limit-bytes); ask for less at once (a write in the same request may or may not have happened)",
            st.output_limit
        ),
    )
}

/// True when Redis's output-buffer limit for normal clients is the one the front sets.
async fn limit_in_force(st: &State) -> bool {
    let get = redis::cmd("CONFIG").arg("GET").arg("client-output-buffer-limit").clone();
    let reply = tokio::time::timeout(std::time::Duration::from_millis(500), st.killer.query(&get)).await;
    let Ok(Ok(Value::Array(items))) = reply else { return false };
    let want = format!("normal {} 0 0", st.output_limit);
    items.iter().any(|v| matches!(v, Value::BulkString(b) if String::from_utf8_lossy(b).contains(&want)))
}

fn error(status: StatusCode, msg: impl Into<String>) -> Failure {
    Failure { status, message: msg.into(), cause: Cause::Other }
}

/// A failure for Redis's error reply `text` (`CODE detail`), classified by the core.
fn reply_failure(text: String) -> Failure {
    let kind = redcount_core::ErrorReply::new(&text).kind;
    count_redis_error(kind_label(kind));
    let status = reply_status(text.split(' ').next().unwrap_or(""));
    Failure { status, message: text, cause: Cause::Reply(kind) }
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        let body = match self.cause {
            // Distinct from "not now": it ran, and the client must not take it as durable.
            Cause::NotDurable => json!({ "error": self.message, "durable": false, "may_have_run": true }),
            _ => json!({ "error": self.message }),
        };
        (self.status, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
    }
}

/// A 200 response. A body over 16 KiB holds its size of `--max-inflight-response-bytes` until
/// it has been sent or dropped (a client that does not read is cut off by the stall timeout),
/// so clients that stop reading cannot make the front hold gigabytes; when that budget is
/// spent, 503.
fn ok_response(st: &State, body: Vec<u8>, content_type: &'static str, read: Held) -> Result<Response, Failure> {
    let mut r = if body.len() <= 16 * 1024 {
        Response::new(Body::from(body))
    } else {
        let kib = u32::try_from(body.len().div_ceil(1024)).unwrap_or(u32::MAX);
        let Ok(permit) = st.response_budget.clone().try_acquire_many_owned(kib) else {
            return Err(error(
                StatusCode::SERVICE_UNAVAILABLE,
                "ERR too many large responses being sent (--max-inflight-response-bytes); retry shortly",
            ));
        };
        let all = Bytes::from(body);
        let chunks: Vec<Bytes> =
            (0..all.len()).step_by(64 * 1024).map(|i| all.slice(i..(i + 64 * 1024).min(all.len()))).collect();
        // The stream owns the permit and hands out 64 KiB at a time (hyper asks for more as it
        // writes), so the permit is given back once the body is as good as sent, or dropped.
        let stream = futures_util::StreamExt::map(futures_util::stream::iter(chunks), move |c| {
            let _held = (&permit, &read);
            Ok::<_, std::convert::Infallible>(c)
        });
        Response::new(Body::from_stream(stream))
    };
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    Ok(r)
}

/// A reply past `--max-response-bytes`: 400 naming the bound, then `how` to ask instead.
fn too_large(st: &State, how: &str) -> Failure {
    error(StatusCode::BAD_REQUEST, format!("ERR {TOO_LARGE} ({} bytes){how}", st.max_response))
}

/// Refuses a reply that would be larger than `--max-response-bytes` once encoded.
fn encodable(st: &State, value: &Value, encoding: reply::Encoding) -> Result<(), Failure> {
    let bound = reply::encoded_len_bound(value, encoding);
    if bound > st.max_response {
        return Err(too_large(
            st,
            &format!(
                " once encoded (up to {bound}): ask for less at once, or with Upstash-Encoding: base64 for binary values"
            ),
        ));
    }
    Ok(())
}

async fn handle(
    Extract(st): Extract<Arc<State>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    // Boxed: the request's future (every route inlined) is kilobytes, and the layers between
    // hyper and here move it by value several times per request: a third of the front's
    // instructions per request went to those copies (callgrind, BENCHMARKS.md).
    Box::pin(handle_boxed(st, method, uri, headers, body)).await
}

async fn handle_boxed(st: Arc<State>, method: Method, uri: Uri, headers: HeaderMap, body: Body) -> Response {
    let start = Instant::now();
    let path = uri.path().to_string();
    let (mut response, what) = match serve(&st, &method, &uri, &headers, body).await {
        Ok((r, what)) => (r, what),
        Err((f, what)) => (f.into_response(), what),
    };
    // Read-your-writes: the official clients echo this token on their next request. Every
    // read here goes to the primary that took the write, so any fresh token keeps the promise.
    static SYNC: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let token = SYNC.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    response.headers_mut().insert("upstash-sync-token", HeaderValue::from(token));
    let (route, status, elapsed) = (path_kind(&path), response.status().as_u16(), start.elapsed());
    // Labels from a fixed set only (route, status): never the client's command names.
    metrics::counter!("redcount_rest_requests_total", "route" => route, "status" => status.to_string()).increment(1);
    metrics::histogram!("redcount_rest_request_duration_seconds", "route" => route).record(elapsed.as_secs_f64());
    // The command name is the client's text: cut short in the log.
    let command: String = what
        .chars()
        .take(32)
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '|') { c } else { '?' })
        .collect();
    tracing::debug!(%method, route, %command, status, elapsed_ms = elapsed.as_secs_f64() * 1e3, "request");
    response
}

/// Counts a failure from Redis (or on the way to it) by kind, for `/metrics`.
fn count_redis_error(kind: &'static str) {
    metrics::counter!("redcount_rest_redis_errors_total", "kind" => kind).increment(1);
}

/// The metrics label of an error kind.
fn kind_label(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::NoScript => "noscript",
        ErrorKind::WrongType => "wrongtype",
        ErrorKind::Rejected => "rejected",
        ErrorKind::CrossSlot => "crossslot",
        ErrorKind::Redirect => "redirect",
        ErrorKind::Unavailable => "unavailable",
        ErrorKind::Denied => "denied",
        ErrorKind::OutOfMemory => "oom",
        ErrorKind::IdempotencyConflict => "idempotency_conflict",
        _ => "other",
    }
}

/// The route, without path-style arguments (they may be data).
fn path_kind(path: &str) -> &'static str {
    match path {
        "/" => "/",
        "/pipeline" => "/pipeline",
        "/multi-exec" => "/multi-exec",
        _ => "/<command>",
    }
}

type Served = Result<(Response, String), (Failure, String)>;

async fn serve(st: &State, method: &Method, uri: &Uri, headers: &HeaderMap, body: Body) -> Served {
    let none = || String::from("-");
    if !matches!(*method, Method::GET | Method::POST | Method::PUT | Method::HEAD) {
        return Err((error(StatusCode::METHOD_NOT_ALLOWED, format!("ERR method {method} is not allowed")), none()));
    }
    let authz = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    let scoped = st.scoped.read().unwrap_or_else(|e| e.into_inner()).clone();
    let Some(access) = auth::check(authz, &st.token, st.readonly_token.as_deref(), &scoped) else {
        return Err((
            error(StatusCode::UNAUTHORIZED, "Unauthorized: a valid `Authorization: Bearer <token>` header is required"),
            none(),
        ));
    };
    if let Access::Scoped { guarded, .. } = &access
        && !guarded.load(std::sync::atomic::Ordering::Relaxed)
    {
        return Err((
            error(
                StatusCode::SERVICE_UNAVAILABLE,
                "ERR the front cannot keep its rules on this token's Redis user (its scripts could reach beyond its app): refused until it can; the front's log says why",
            ),
            none(),
        ));
    }
    // Bodies being received count against --max-inflight-body-bytes (their declared length,
    // else the largest allowed) until the response: thousands of slow 1 MB bodies cannot add
    // up to gigabytes.
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<usize>().ok())
        .unwrap_or(st.max_body)
        .min(st.max_body);
    // Small bodies (most commands) are not counted, so large slow ones cannot starve them;
    // all of them together are bounded by the connection cap.
    let kib = if declared <= 16 * 1024 { 0 } else { u32::try_from(declared.div_ceil(1024)).unwrap_or(u32::MAX) };
    let Ok(_body_permit) = st.body_budget.try_acquire_many(kib) else {
        return Err((
            error(
                StatusCode::SERVICE_UNAVAILABLE,
                "ERR too many request bodies in flight (--max-inflight-body-bytes); retry shortly",
            ),
            none(),
        ));
    };
    // The body is read under the request timeout: a trickled body cannot hold a connection.
    let bytes = match tokio::time::timeout(st.timeout, axum::body::to_bytes(body, st.max_body)).await {
        Err(_) => {
            return Err((
                error(
                    StatusCode::REQUEST_TIMEOUT,
                    format!("ERR the request body did not arrive within {} ms", st.timeout.as_millis()),
                ),
                none(),
            ));
        }
        Ok(read) => read.map_err(|_| {
            (
                error(StatusCode::PAYLOAD_TOO_LARGE, format!("ERR request body larger than {} bytes", st.max_body)),
                none(),
            )
        })?,
    };
    if let Some((pattern, names)) = crate::subscribe::kind(uri.path()) {
        let names: Vec<Vec<u8>> = names
            .split('/')
            .filter(|s| !s.is_empty())
            .map(percent_decode)
            .collect::<Result<_, _>>()
            .map_err(|f| (f, none()))?;
        let what = String::from(if pattern { "PSUBSCRIBE" } else { "SUBSCRIBE" });
        return match Box::pin(crate::subscribe::serve(st, &access, pattern, names)).await {
            Ok(r) => Ok((r, what)),
            Err((status, msg)) => Err((error(status, msg), what)),
        };
    }
    let base64 = header_is(headers, "upstash-encoding", "base64");
    let resp2 = match headers.get("upstash-response-format").map(|v| v.to_str().map(str::trim)) {
        None => false,
        Some(Ok(f)) if f.eq_ignore_ascii_case("json") => false,
        Some(Ok(f)) if f.eq_ignore_ascii_case("resp2") => true,
        Some(_) => {
            let why = "ERR Upstash-Response-Format must be json or resp2";
            return Err((error(StatusCode::BAD_REQUEST, why), none()));
        }
    };
    if resp2 && base64 {
        let why = "ERR Upstash-Encoding: base64 applies to JSON answers; resp2 carries bytes as they are";
        return Err((error(StatusCode::BAD_REQUEST, why), none()));
    }
    let path = uri.path();
    match path {
        "/pipeline" | "/multi-exec" => {
            if *method != Method::POST && *method != Method::PUT {
                return Err((error(StatusCode::METHOD_NOT_ALLOWED, format!("ERR {path} takes POST")), none()));
            }
            let atomic = path == "/multi-exec";
            let entries: Vec<Result<Cmd, Failure>> = parse_many(&bytes)
                .map_err(|f| (f, none()))?
                .into_iter()
                .map(|e| e.and_then(|c| check(st, &c, &access).map(|()| c)))
                .collect();
            if atomic && entries.len() > st.max_transaction {
                let why = format!(
                    "ERR a transaction runs in Redis at once, with no stop after --timeout-ms: at most {} commands (--max-transaction-commands); send more as a /pipeline",
                    st.max_transaction
                );
                return Err((error(StatusCode::BAD_REQUEST, why), none()));
            }
            let first = entries.iter().find_map(|e| e.as_ref().ok()).map(|c| c.name.to_ascii_uppercase());
            let what = format!("{}x{}", entries.len(), first.unwrap_or_default());
            // A transaction is all or nothing: one refused entry refuses it whole.
            let entries = if atomic {
                match entries.into_iter().collect::<Result<Vec<Cmd>, Failure>>() {
                    Ok(cmds) => cmds.into_iter().map(Ok).collect(),
                    Err(f) => return Err((f, what)),
                }
            } else {
                entries
            };
            let small = entries.iter().all(|e| e.as_ref().is_ok_and(small_reply));
            let r = match Box::pin(run_many(st, &access, entries, atomic, base64, resp2)).await {
                Err(f) => Err(Box::pin(explain_lost(st, f, small)).await),
                ok => ok,
            };
            r.map(|r| (r, what.clone())).map_err(|f| (f, what))
        }
        "/" if *method == Method::POST || *method == Method::PUT => {
            let cmd = parse_one(&bytes).map_err(|f| (f, none()))?;
            one(st, &access, cmd, base64, resp2).await
        }
        _ => {
            // Path style: /set/foo/bar, with a POST body as the last argument.
            let mut parts: Vec<Vec<u8>> = path
                .split('/')
                .filter(|s| !s.is_empty())
                .map(percent_decode)
                .collect::<Result<_, _>>()
                .map_err(|f| (f, none()))?;
            if parts.is_empty() {
                parts.push(b"PING".to_vec());
            }
            if matches!(*method, Method::POST | Method::PUT) && !bytes.is_empty() {
                parts.push(bytes.to_vec());
            }
            // Query arguments follow: `POST /set/foo?EX=100` is `SET foo <body> EX 100`.
            parts.extend(query_args(uri.query().unwrap_or("")).map_err(|f| (f, none()))?);
            let name = String::from_utf8(parts.remove(0))
                .map_err(|_| (error(StatusCode::BAD_REQUEST, "ERR command name is not UTF-8"), none()))?;
            let cmd = Cmd { name, args: parts };
            one(st, &access, cmd, base64, resp2).await
        }
    }
}

/// One command, whichever way it came (a JSON array or a path): checked against the token's
/// access, run, and a lost connection explained; with its name for the log.
async fn one(
    st: &State,
    access: &Access,
    cmd: Cmd,
    base64: bool,
    resp2: bool,
) -> Result<(Response, String), (Failure, String)> {
    let what = cmd.name.to_ascii_uppercase();
    if let Err(f) = check(st, &cmd, access) {
        return Err((f, what));
    }
    let small = small_reply(&cmd);
    match run_one(st, access, cmd, base64, resp2).await {
        Ok(r) => Ok((r, what)),
        Err(f) => Err((Box::pin(explain_lost(st, f, small)).await, what)),
    }
}

/// A path-style command's query string as arguments, in order: `k=v` gives `k`, `v`; a bare
/// `k` gives `k` (a flag such as `NX`). `_token` is refused: a token in a URL ends up in logs.
fn query_args(query: &str) -> Result<Vec<Vec<u8>>, Failure> {
    let mut out = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = match pair.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (pair, None),
        };
        if k == "_token" {
            return Err(error(
                StatusCode::BAD_REQUEST,
                "ERR a token in the URL is not accepted (URLs get logged): send `Authorization: Bearer <token>`",
            ));
        }
        out.push(percent_decode(k)?);
        if let Some(v) = v {
            out.push(percent_decode(v)?);
        }
    }
    Ok(out)
}

fn header_is(headers: &HeaderMap, name: &str, want: &str) -> bool {
    headers.get(name).and_then(|v| v.to_str().ok()).is_some_and(|v| v.trim().eq_ignore_ascii_case(want))
}

fn percent_decode(seg: &str) -> Result<Vec<u8>, Failure> {
    redcount_core::text::percent_decode(seg)
        .ok_or_else(|| error(StatusCode::BAD_REQUEST, "ERR malformed percent-encoding in the path"))
}

/// One command from its JSON array. Arguments are sent as the official clients mean them:
/// strings as their text, numbers as their exact JSON text (no float round trip: `1E3` stays
/// `1E3`, 2^70 keeps every digit), booleans and null as `true`, `false`, `null` (the clients
/// send them, and Upstash stores the text).
fn command_from_json(v: &RawValue) -> Result<Cmd, Failure> {
    let items: Vec<&RawValue> = serde_json::from_str(v.get()).map_err(|_| {
        error(StatusCode::BAD_REQUEST, "ERR a command is a JSON array like [\"SET\", \"key\", \"value\"]")
    })?;
    command_from_items(&items)
}

/// [`command_from_json`] once the array is split into its items.
fn command_from_items(items: &[&RawValue]) -> Result<Cmd, Failure> {
    let mut args = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let text = item.get();
        args.push(match text.as_bytes().first() {
            // Without a backslash a JSON string's text is its value (the raw value is valid
            // JSON, so it holds no control character): no second parse.
            Some(b'"') if !text.contains('\\') => text.as_bytes()[1..text.len() - 1].to_vec(),
            Some(b'"') => serde_json::from_str::<String>(text)
                .map_err(|e| error(StatusCode::BAD_REQUEST, format!("ERR argument {i} is not a valid string: {e}")))?
                .into_bytes(),
            Some(b'-' | b'0'..=b'9' | b't' | b'f' | b'n') => text.as_bytes().to_vec(),
            _ => {
                let kind = if text.starts_with('[') { "an array" } else { "an object" };
                return Err(error(
                    StatusCode::BAD_REQUEST,
                    format!("ERR argument {i} is {kind}; every argument must be a string, a number, a boolean or null"),
                ));
            }
        });
    }
    if args.is_empty() {
        return Err(error(StatusCode::BAD_REQUEST, "ERR empty command"));
    }
    let name = String::from_utf8(args.remove(0))
        .map_err(|_| error(StatusCode::BAD_REQUEST, "ERR command name is not UTF-8"))?;
    if name.is_empty() {
        return Err(error(StatusCode::BAD_REQUEST, "ERR empty command name"));
    }
    Ok(Cmd { name, args })
}

fn parse_json(bytes: &Bytes) -> Result<&RawValue, Failure> {
    serde_json::from_slice(bytes)
        .map_err(|e| error(StatusCode::BAD_REQUEST, format!("ERR body is not valid JSON: {e}")))
}

fn parse_one(bytes: &Bytes) -> Result<Cmd, Failure> {
    // A well-formed array in one pass; anything else through the steps that name what is wrong.
    match serde_json::from_slice::<Vec<&RawValue>>(bytes) {
        Ok(items) => command_from_items(&items),
        Err(_) => command_from_json(parse_json(bytes)?),
    }
}

/// Whether the token's Redis user may run each of `cmds`: the full and read-only tokens' users
/// are the front's own (what they may not run is refused before sending); a `--tokens` user
/// is asked about with `ACL DRYRUN` (Redis 7), so that a transaction its ACL refused is not
/// taken for one whose slot was moving. Not known (no DRYRUN, no permission, no answer
/// `within`): false.
async fn may_run_all(st: &State, access: &Access, cmds: &[Cmd], within: std::time::Duration) -> bool {
    let Access::Scoped { .. } = access else { return true };
    let Some(login) = access.login() else { return false };
    let deadline = Instant::now() + within;
    for c in cmds {
        let mut dryrun = redis::cmd("ACL");
        dryrun.arg("DRYRUN").arg(&login.user).arg(&c.name);
        for a in &c.args {
            dryrun.arg(a.as_slice());
        }
        match timed_within(st, deadline.saturating_duration_since(Instant::now()), st.killer.query(&dryrun)).await {
            Ok(Value::Okay) => {}
            Ok(Value::SimpleString(s)) if s == "OK" => {}
            _ => return false,
        }
    }
    true
}

/// The commands of a `/pipeline` or `/multi-exec` body, each parsed on its own: one bad
/// entry is that entry's error, not the whole request's (with auto-pipelining, unrelated
/// calls share a body). The body itself must be a non-empty array.
fn parse_many(bytes: &Bytes) -> Result<Vec<Result<Cmd, Failure>>, Failure> {
    let items: Vec<&RawValue> = serde_json::from_str(parse_json(bytes)?.get())
        .map_err(|_| error(StatusCode::BAD_REQUEST, "ERR body must be a JSON array of commands"))?;
    if items.is_empty() {
        return Err(error(StatusCode::BAD_REQUEST, "ERR empty pipeline"));
    }
    Ok(items.into_iter().map(command_from_json).collect())
}

/// Refuses what cannot run over REST, administration unless allowed, and anything but
/// reads under the read-only token.
fn check(st: &State, cmd: &Cmd, access: &Access) -> Result<(), Failure> {
    if let Some(why) = commands::refusal(&cmd.name, &cmd.args) {
        return Err(error(StatusCode::BAD_REQUEST, why));
    }
    if let Some(why) = commands::oversized(&cmd.name, &cmd.args, st.max_response) {
        return Err(error(StatusCode::BAD_REQUEST, why));
    }
    if let Some(why) = commands::repeated_keys(&cmd.name, &cmd.args) {
        return Err(error(StatusCode::BAD_REQUEST, why));
    }
    // One look-up in the command table for every rule below.
    let flags = st.commands.flags(&cmd.name, &cmd.args);
    if !st.allow_admin && flags.admin {
        return Err(error(
            StatusCode::FORBIDDEN,
            format!(
                "NOPERM {} is an administrative command; redcount-rest refuses those unless started with --allow-admin-commands",
                display_name(cmd)
            ),
        ));
    }
    // After the administrative check: CLIENT KILL, PAUSE… keep saying what allows them.
    if flags.changes_connection {
        return Err(error(
            StatusCode::BAD_REQUEST,
            format!("ERR {} would change the shared connection and is not available over REST", display_name(cmd)),
        ));
    }
    // A token of one app among several: what reaches beyond the keys its ACL user names is
    // refused whatever that user may do (Redis refuses it inside scripts: the front denies it
    // to the user, see `Table::one_app_rules`).
    if matches!(access, Access::Scoped { .. }) && flags.beyond_one_app {
        return Err(error(
            StatusCode::FORBIDDEN,
            format!(
                "NOPERM {} reaches beyond one app's keys (every key, another database, every app's scripts, or the server); a --tokens token may not run it",
                display_name(cmd)
            ),
        ));
    }
    if !access.readonly() {
        return Ok(());
    }
    if let Some(why) = commands::readonly_refusal(&cmd.name) {
        return Err(error(StatusCode::FORBIDDEN, why));
    }
    let upper = cmd.name.to_ascii_uppercase();
    if st.readonly_backend.is_none() && matches!(upper.as_str(), "EVAL_RO" | "EVALSHA_RO" | "FCALL_RO") {
        return Err(error(
            StatusCode::FORBIDDEN,
            format!(
                "NOPERM this token is read-only and may not run {upper}: the front could not set up the Redis ACL user that makes scripts read-only (see its log)"
            ),
        ));
    }
    // PING and ECHO touch no data (Redis does not flag them read-only; clients probe with PING).
    let harmless = matches!(upper.as_str(), "PING" | "ECHO");
    if !harmless && !flags.readonly {
        let hint = match upper.as_str() {
            "EVAL" => " (use EVAL_RO)",
            "EVALSHA" => " (use EVALSHA_RO)",
            _ => "",
        };
        return Err(error(
            StatusCode::FORBIDDEN,
            format!("NOPERM this token is read-only and {} is not a read-only command{hint}", display_name(cmd)),
        ));
    }
    Ok(())
}

/// `CONFIG SET` rather than `CONFIG`, for messages.
fn display_name(cmd: &Cmd) -> String {
    let upper = cmd.name.to_ascii_uppercase();
    match (upper.as_str(), cmd.args.first()) {
        (
            "SCRIPT" | "CONFIG" | "CLIENT" | "OBJECT" | "MEMORY" | "XINFO" | "FUNCTION" | "ACL" | "CLUSTER" | "SLOWLOG"
            | "LATENCY" | "MODULE" | "COMMAND" | "PUBSUB" | "XGROUP",
            Some(sub),
        ) => format!("{upper} {}", String::from_utf8_lossy(sub).to_ascii_uppercase()),
        _ => upper,
    }
}

/// After-effects of script handling on one command.
enum Fixup {
    None,
    /// A rewritten script: remember it once Redis accepted it; after SCRIPT LOAD, reply with
    /// the client's SHA instead of Redis's.
    Learn {
        client_sha: String,
        rw: Rewritten,
        reply_sha: bool,
    },
    /// On NOSCRIPT, send this source again (Redis lost a rewritten script), with EVAL_RO when
    /// the client sent EVALSHA_RO: a fallback never widens what the client asked for.
    Reload {
        rw: Rewritten,
        readonly: bool,
    },
    /// SCRIPT FLUSH succeeded: forget the rewrites.
    Flushed,
    /// A read-only token's EVAL_RO, sent as EVALSHA_RO of this SHA: it may run only a script
    /// a full-token client has loaded, so it can neither fill Redis's script cache nor run
    /// Lua no one vetted (a pattern match or `string.rep` inside one C call cannot be killed).
    Vetted(String),
}

impl Fixup {
    /// Applies the after-effects to Redis's reply for the command.
    fn apply(self, st: &State, value: &mut Value) {
        let accepted = !matches!(value, Value::ServerError(_));
        match self {
            Fixup::Learn { client_sha, rw, reply_sha } if accepted => {
                if reply_sha {
                    *value = Value::BulkString(client_sha.clone().into_bytes());
                }
                st.scripts.learn(client_sha, rw);
            }
            Fixup::Flushed if accepted => st.scripts.clear(),
            _ => {}
        }
    }
}

fn prepare(st: &State, access: &Access, cmd: &mut Cmd) -> Fixup {
    let upper = cmd.name.to_ascii_uppercase();
    match upper.as_str() {
        "EVAL_RO" if access.readonly() && !cmd.args.is_empty() => {
            let _ = st.scripts.prepare_source(&mut cmd.args[0]);
            let sha = scripts::sha_hex(&cmd.args[0]);
            cmd.name = "EVALSHA_RO".into();
            cmd.args[0] = sha.clone().into_bytes();
            Fixup::Vetted(sha)
        }
        "EVAL" | "EVAL_RO" => match cmd.args.get_mut(0).and_then(|src| st.scripts.prepare_source(src)) {
            Some((client_sha, rw)) => Fixup::Learn { client_sha, rw, reply_sha: false },
            None => Fixup::None,
        },
        "EVALSHA" | "EVALSHA_RO" => match cmd.args.first().and_then(|sha| st.scripts.lookup(sha)) {
            Some(rw) => {
                cmd.args[0] = rw.sha.clone().into_bytes();
                // The read-only token never makes Redis load a script, not even one it lost.
                if access.readonly() { Fixup::None } else { Fixup::Reload { rw, readonly: upper == "EVALSHA_RO" } }
            }
            None => Fixup::None,
        },
        "SCRIPT" => {
            let sub = cmd.args.first().map(|s| s.to_ascii_uppercase());
            match sub.as_deref() {
                Some(b"LOAD") => match cmd.args.get_mut(1).and_then(|src| st.scripts.prepare_source(src)) {
                    Some((client_sha, rw)) => Fixup::Learn { client_sha, rw, reply_sha: true },
                    None => Fixup::None,
                },
                Some(b"EXISTS") => {
                    for sha in cmd.args.iter_mut().skip(1) {
                        if let Some(rw) = st.scripts.lookup(sha) {
                            *sha = rw.sha.into_bytes();
                        }
                    }
                    Fixup::None
                }
                Some(b"FLUSH") => Fixup::Flushed,
                _ => Fixup::None,
            }
        }
        _ => Fixup::None,
    }
}

/// The positions in `fixups` of a read-only token's EVAL_RO of a script Redis does not have
/// (so no full-token client loaded it): those are refused before anything of the request runs.
async fn unvetted(st: &State, fixups: &[Fixup]) -> Result<Vec<usize>, Failure> {
    let shas: Vec<(usize, &String)> = fixups
        .iter()
        .enumerate()
        .filter_map(|(i, f)| if let Fixup::Vetted(s) = f { Some((i, s)) } else { None })
        .collect();
    if shas.is_empty() {
        return Ok(Vec::new());
    }
    let mut exists = redis::cmd("SCRIPT");
    exists.arg("EXISTS");
    for (_, sha) in &shas {
        exists.arg(sha.as_str());
    }
    let found: Vec<bool> = match Box::pin(timed(st, backend(st, &Access::ReadOnly).query(&exists))).await? {
        Value::Array(items) => items.iter().map(|v| matches!(v, Value::Int(1))).collect(),
        Value::Int(n) => vec![n == 1],
        _ => vec![false],
    };
    Ok(shas
        .iter()
        .zip(found.iter().chain(std::iter::repeat(&false)))
        .filter(|(_, ok)| !**ok)
        .map(|((i, _), _)| *i)
        .collect())
}

/// The refusal of a read-only token's script no full-token client loaded.
fn unloaded(fixup: &Fixup) -> Failure {
    let sha = if let Fixup::Vetted(s) = fixup { s.as_str() } else { "" };
    error(
        StatusCode::FORBIDDEN,
        format!(
            "NOPERM this token is read-only and may run only scripts a full-token client has loaded: load script {sha} with SCRIPT LOAD (or run it once) with the full token"
        ),
    )
}

fn to_redis(cmd: &Cmd) -> redis::Cmd {
    let mut c = redis::cmd(&cmd.name);
    for a in &cmd.args {
        c.arg(&a[..]);
    }
    c
}

/// Maps a failed call to a status: Redis's error replies are 400, an unreachable Redis 503,
/// a timeout 504.
/// The status for a Redis error reply: 503 when Redis cannot serve now and ran nothing
/// (`LOADING` after a restart, `BUSY`, `MASTERDOWN`, `NOREPLICAS`, `CLUSTERDOWN`, `TRYAGAIN`), so clients
/// retry; 400 for the rest, as Upstash answers a command's error.
fn reply_status(code: &str) -> StatusCode {
    match redcount_core::ErrorReply::new(code).kind {
        redcount_core::ErrorKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::BAD_REQUEST,
    }
}

/// How a failed call is answered: the one place the backend's [`Failed`] becomes a status,
/// a message and a cause.
fn failure(st: &State, e: &Failed) -> Failure {
    match e {
        Failed::TimedOut => timed_out(st),
        Failed::Refused(r) | Failed::Login(r) | Failed::Redis(r) if r.is_timeout() => timed_out(st),
        Failed::BudgetSpent => error(StatusCode::SERVICE_UNAVAILABLE, format!("ERR {BUDGET_SPENT}")),
        Failed::TooLarge { .. } => error(
            StatusCode::BAD_REQUEST,
            format!(
                "ERR {e}: ask for less at once (GETRANGE, LRANGE/ZRANGE with a range, HSCAN, fewer commands per pipeline)"
            ),
        ),
        Failed::NotDurable(why) => {
            count_redis_error("not_durable");
            let message = format!("{NOT_DURABLE} not known durable: {why} (--wait-replicas)");
            Failure { status: StatusCode::SERVICE_UNAVAILABLE, message, cause: Cause::NotDurable }
        }
        Failed::Redirected(_) => {
            count_redis_error("redirect");
            error(StatusCode::SERVICE_UNAVAILABLE, format!("ERR {e}: nothing ran; retry"))
        }
        Failed::Unreachable(_) => {
            tracing::error!("redis unreachable: {e}");
            count_redis_error("unreachable");
            error(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("ERR Redis is unreachable (a write may or may not have happened): {e}"),
            )
        }
        Failed::Refused(r) | Failed::Login(r) | Failed::Redis(r) => redis_failure(r),
    }
}

/// A money call not known durable: the first word of its message.
const NOT_DURABLE: &str = "NOTDURABLE";

/// No answer within `--timeout-ms`.
fn timed_out(st: &State) -> Failure {
    count_redis_error("timeout");
    Failure {
        status: StatusCode::GATEWAY_TIMEOUT,
        message: format!(
            "ERR Redis did not answer within {} ms (a write may or may not have happened)",
            st.timeout.as_millis()
        ),
        cause: Cause::TimedOut,
    }
}

/// How a redis-rs error is answered: refused (nothing sent), lost (it may have run), Redis's
/// own error reply.
fn redis_failure(e: &redis::RedisError) -> Failure {
    if e.is_connection_refusal() {
        tracing::error!("redis unreachable: {e}");
        count_redis_error("unreachable");
        return error(StatusCode::SERVICE_UNAVAILABLE, format!("ERR Redis is unreachable: {e}"));
    }
    if e.is_io_error() || e.is_connection_dropped() || e.is_unrecoverable_error() {
        // Sent, but the connection ended before the answer: it may have run, so it is not
        // sent again.
        tracing::error!("redis connection lost: {e}");
        count_redis_error("lost");
        let message = format!("{LOST} (a write may or may not have happened): {e}");
        return Failure { status: StatusCode::SERVICE_UNAVAILABLE, message, cause: Cause::Lost };
    }
    match (e.code(), e.detail()) {
        (Some("EXECABORT"), _) => Failure {
            status: StatusCode::BAD_REQUEST,
            message: "EXECABORT Transaction discarded because of previous errors: Redis refused a queued command (unknown command, wrong number of arguments, or not allowed to this token's Redis user); nothing ran".into(),
            cause: Cause::ExecAbort,
        },
        (Some(code), Some(detail)) => reply_failure(format!("{code} {detail}")),
        (Some(code), None) => reply_failure(code.to_string()),
        _ => error(StatusCode::SERVICE_UNAVAILABLE, format!("ERR Redis request failed: {e}")),
    }
}

async fn timed<T>(st: &State, f: impl std::future::Future<Output = Result<T, Failed>>) -> Result<T, Failure> {
    timed_within(st, st.timeout, f).await
}

/// [`timed`] with `limit` instead of the whole request timeout (what is left of it).
async fn timed_within<T>(
    st: &State,
    limit: std::time::Duration,
    f: impl std::future::Future<Output = Result<T, Failed>>,
) -> Result<T, Failure> {
    match tokio::time::timeout(limit, f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(failure(st, &e)),
        Err(_) => Err(timed_out(st)),
    }
}

/// The shared connections for requests whose replies are small by construction (redcount's
/// own scripts, commands that answer an integer), a bounded connection of its own for
/// anything else.
fn lane(cmds: &[&Cmd]) -> Lane {
    if !cmds.is_empty() && cmds.iter().all(|c| small_reply(c)) { Lane::Small } else { Lane::Bounded }
}

/// True when `c`'s reply is a few integers whatever its arguments: one of redcount's own
/// scripts, or a command of [`crate::INTEGER_REPLY_COMMANDS`].
fn small_reply(c: &Cmd) -> bool {
    runs_our_script(c) || crate::INTEGER_REPLY_COMMANDS.iter().any(|n| c.name.eq_ignore_ascii_case(n))
}

/// True when `c` runs one of redcount's own scripts (EVALSHA of its SHA-1): those reply a few
/// integers by design.
fn runs_our_script(c: &Cmd) -> bool {
    static OURS: std::sync::LazyLock<std::collections::HashSet<&'static str>> =
        std::sync::LazyLock::new(|| redcount_core::script::ALL.iter().map(|s| s.sha1()).collect());
    (c.name.eq_ignore_ascii_case("EVALSHA") || c.name.eq_ignore_ascii_case("EVALSHA_RO"))
        && c.args.first().is_some_and(|sha| std::str::from_utf8(sha).is_ok_and(|s| OURS.contains(s)))
}

/// The connections a request runs on.
fn backend<'a>(st: &'a State, access: &'a Access) -> &'a Backend {
    match (access, &st.readonly_backend) {
        (Access::Scoped { backend, .. }, _) => backend,
        (Access::ReadOnly, Some(ro)) => ro,
        _ => &st.backend,
    }
}

async fn run_one(st: &State, access: &Access, mut cmd: Cmd, base64: bool, resp2: bool) -> Result<Response, Failure> {
    let fixup = prepare(st, access, &mut cmd);
    if !unvetted(st, std::slice::from_ref(&fixup)).await?.is_empty() {
        return Err(unloaded(&fixup));
    }
    let redis_cmd = to_redis(&cmd);
    let upper = cmd.name.to_ascii_uppercase();
    let args0 = cmd.args.first().map(|a| a.to_ascii_uppercase());
    // The client's own SCRIPT KILL / FUNCTION KILL must not queue behind the script.
    let be = match (upper.as_str(), args0.as_deref()) {
        ("SCRIPT" | "FUNCTION", Some(b"KILL")) => &st.killer,
        _ => backend(st, access),
    };
    let lane = lane(&[&cmd]);
    let started = Instant::now();
    let mut permits = Held::default();
    let mut first = timed(st, be.query_in(&redis_cmd, lane, &mut permits)).await;
    // A cluster slot in migration answers ASK/MOVED once the client's own redirect budget is
    // spent; the migration of one slot takes milliseconds, so follow a little (at most ~0.5 s
    // in all). Replies that ran nothing and clear by themselves (BUSY while the watchdog
    // kills a script, LOADING after a restart, TRYAGAIN while a multi-key call's keys are
    // split between two nodes) are waited out within the request's time (the last try may run
    // past it by up to one limit). Not on a Cluster: there each call follows redirections and
    // waits out CLUSTERDOWN / TRYAGAIN itself, up to the limit (tries here on top took three
    // times the limit and answered 504 where the Cluster had said why; second attacker pass).
    let mut attempt = 0u64;
    while !be.is_cluster() {
        let pause = match &first {
            Err(f) if f.cause == Cause::Reply(ErrorKind::Redirect) && attempt < 8 => {
                attempt += 1;
                std::time::Duration::from_millis(15 * attempt)
            }
            Err(f) if f.cause == Cause::Reply(ErrorKind::Unavailable) => std::time::Duration::from_millis(25),
            _ => break,
        };
        if started.elapsed() + pause >= st.timeout {
            break;
        }
        tokio::time::sleep(pause).await;
        // A whole limit for the try: a reply of a loading Redis can be slow, and a try cut
        // short would be a 504 "may have run" instead of Redis's own "not now".
        first = timed(st, be.query_in(&redis_cmd, lane, &mut permits)).await;
    }
    let mut value = match (first, &fixup) {
        (Err(f), Fixup::Reload { rw, readonly }) if f.cause == Cause::Reply(ErrorKind::NoScript) => {
            // Redis lost a script it knew under the rewritten SHA: send the source again.
            metrics::counter!("redcount_rest_noscript_reloads_total").increment(1);
            let name = if *readonly { "EVAL_RO" } else { "EVAL" };
            let mut eval = Cmd { name: name.into(), args: cmd.args.clone() };
            eval.args[0] = rw.source.clone();
            check(st, &eval, access)?;
            Box::pin(timed(st, be.query_in(&to_redis(&eval), Lane::Bounded, &mut permits))).await?
        }
        (r, _) => r?,
    };
    fixup.apply(st, &mut value);
    if let Value::ServerError(e) = &value {
        count_redis_error(kind_label(ErrorReply::new(e.code()).kind));
        return Err(error(reply_status(e.code()), reply::server_error_text(e)));
    }
    encodable(st, &value, reply::encoding(base64, resp2))?;
    if resp2 {
        let mut out = Vec::new();
        reply::to_resp2(&value, &mut out);
        return ok_response(st, out, "application/octet-stream", permits);
    }
    let mut body = String::with_capacity(64);
    reply::write_result(&value, base64, &mut body);
    ok_response(st, body.into_bytes(), "application/json", permits)
}

async fn run_many(
    st: &State,
    access: &Access,
    entries: Vec<Result<Cmd, Failure>>,
    atomic: bool,
    base64: bool,
    resp2: bool,
) -> Result<Response, Failure> {
    // Refused entries answer for themselves; the others are sent, in order.
    let mut refused: Vec<(usize, Failure)> = Vec::new();
    let mut cmds = Vec::with_capacity(entries.len());
    let mut at = Vec::with_capacity(entries.len());
    for (i, e) in entries.into_iter().enumerate() {
        match e {
            Ok(c) => {
                cmds.push(c);
                at.push(i);
            }
            Err(f) => refused.push((i, f)),
        }
    }
    let mut fixups = Vec::with_capacity(cmds.len());
    for c in &mut cmds {
        fixups.push(prepare(st, access, c));
    }
    // A pipeline refuses such a script in its entry; a transaction refuses it whole.
    let unvetted = unvetted(st, &fixups).await?;
    if let Some(&first) = unvetted.first()
        && atomic
    {
        return Err(unloaded(&fixups[first]));
    }
    for &i in unvetted.iter().rev() {
        refused.push((at[i], unloaded(&fixups[i])));
        cmds.remove(i);
        fixups.remove(i);
    }
    refused.sort_by_key(|(i, _)| *i);
    let lane = if atomic { Lane::Bounded } else { lane(&cmds.iter().collect::<Vec<_>>()) };
    let started = Instant::now();
    let mut items: Vec<Value> = Vec::with_capacity(cmds.len());
    // A transaction goes at once. A pipeline goes in chunks sized from what the previous one
    // cost, so that Redis stops receiving it once the request's time is spent: a pipeline of
    // slow reads (each cheap to send, costly to run) cannot hold Redis for hours.
    // The first chunk is one command: nothing is known yet of what they cost.
    let mut chunk = if atomic { cmds.len() } else { 1 };
    let mut dearest = std::time::Duration::ZERO;
    let mut held = 0usize;
    // Whether a discarded Cluster transaction may be sent again (asked at its first EXECABORT).
    let mut may_run: Option<bool> = None;
    let mut permits = Held::default();
    while items.len() < cmds.len() {
        let from = items.len();
        if from > 0 && started.elapsed() >= st.timeout {
            return Err(error(
                StatusCode::GATEWAY_TIMEOUT,
                format!(
                    "ERR the pipeline ran past --timeout-ms ({} ms): Redis answered its first {from} of {} commands (an error reply among them ran nothing), the rest were not sent",
                    st.timeout.as_millis(),
                    cmds.len()
                ),
            ));
        }
        let part = &cmds[from..(from + chunk).min(cmds.len())];
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        if atomic {
            pipe.atomic();
        }
        for c in part {
            pipe.add_command(to_redis(c));
        }
        let sent = Instant::now();
        // On a Cluster a pipeline's entries go one by one, each through the one sender that
        // resends only what Redis said it did not run (redis-rs resends a whole pipeline after
        // one entry's redirection). An error reply is that entry's answer.
        let be = backend(st, access);
        if be.is_cluster() && !atomic {
            let left = st.timeout.saturating_sub(started.elapsed()).max(std::time::Duration::from_millis(1));
            let one = to_redis(&part[0]);
            let answer = be.query_in(&one, lane, &mut permits);
            let value = timed_within(st, left, async {
                match answer.await {
                    // An error reply is this entry's answer.
                    Err(Failed::Redis(e)) => redis::ServerError::try_from(e).map(Value::ServerError).map_err(Failed::Redis),
                    other => other,
                }
            })
            .await
            .map_err(|f| {
                if f.cause != Cause::TimedOut {
                    return f;
                }
                error(
                    StatusCode::GATEWAY_TIMEOUT,
                    format!(
                        "ERR the pipeline ran past --timeout-ms ({} ms): Redis answered its first {from} of {} commands (an error reply among them ran nothing), the next may or may not have, the rest were not sent",
                        st.timeout.as_millis(),
                        cmds.len()
                    ),
                )
            })?;
            // The Cluster could not serve this entry (CLUSTERDOWN, TRYAGAIN) and it was waited
            // out to the limit: nothing is left for the rest. Said as such (503), not as a
            // timeout that "ran" the entries before (second Cluster attacker pass).
            if let Value::ServerError(e) = &value
                && ErrorReply::new(e.code()).kind == ErrorKind::Unavailable
            {
                count_redis_error("unavailable");
                return Err(error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!(
                        "{} (waited out to --timeout-ms): Redis answered the pipeline's first {from} of {} commands (an error reply among them ran nothing), did not run the next, and the rest were not sent",
                        reply::server_error_text(e),
                        cmds.len()
                    ),
                ));
            }
            held += reply::encoded_len_bound(&value, reply::Encoding::Resp2);
            if held > st.max_response {
                return Err(too_large(st, ": ask for less at once (fewer commands per pipeline)"));
            }
            items.push(value);
            continue;
        }
        let got = loop {
            let left = st.timeout.saturating_sub(started.elapsed()).max(std::time::Duration::from_millis(1));
            let value = timed_within(st, left, backend(st, access).pipeline(&pipe, lane, &mut permits)).await.map_err(|f| {
                if f.cause != Cause::TimedOut || atomic {
                    return f;
                }
                error(
                    StatusCode::GATEWAY_TIMEOUT,
                    format!(
                        "ERR the pipeline ran past --timeout-ms ({} ms): Redis answered its first {from} of {} commands (an error reply among them ran nothing), the {} sent after them may or may not have, the rest were not sent",
                        st.timeout.as_millis(),
                        cmds.len(),
                        part.len()
                    ),
                )
            });
            // Every entry refused BUSY (a script past its bound, about to be killed) or
            // LOADING (a restart): none ran, so the whole chunk may run again.
            let all_busy = match &value {
                Err(f) => f.cause == Cause::Reply(ErrorKind::Unavailable),
                Ok(Some(Value::Array(items))) => items.iter().all(
                    |v| matches!(v, Value::ServerError(e) if ErrorReply::new(e.code()).kind == ErrorKind::Unavailable),
                ),
                _ => false,
            };
            if all_busy && started.elapsed() < st.timeout {
                tokio::time::sleep(std::time::Duration::from_millis(25)).await;
                continue;
            }
            // A Cluster transaction discarded whole although Redis knows each command and its
            // argument count, and the token's ACL user may run each: its slot is moving between
            // masters or cannot be served now (the queued commands answered MOVED, ASK,
            // TRYAGAIN, CLUSTERDOWN, OOM). Nothing ran, so it is sent again within the time
            // limit, then 503 (second attacker pass: it was 400, "do not retry").
            let aborted = atomic && be.is_cluster() && matches!(&value, Err(f) if f.cause == Cause::ExecAbort);
            if aborted && may_run.is_none() {
                // Asked once per request (a scoped user's ACL DRYRUN is a round trip a command).
                let left = st.timeout.saturating_sub(started.elapsed());
                let valid = part.iter().all(|c| st.commands.is_well_formed(&c.name, &c.args));
                may_run = Some(valid && may_run_all(st, access, part, left).await);
            }
            if aborted && may_run == Some(true) {
                if started.elapsed() + std::time::Duration::from_millis(100) < st.timeout {
                    be.follow_slot_of(&to_redis(&part[0])).await;
                    tokio::time::sleep(std::time::Duration::from_millis(25)).await;
                    continue;
                }
                return Err(error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "ERR Redis discarded the transaction (EXECABORT) although each command is valid: its slot is moving between Cluster nodes or cannot be served now (MOVED, ASK, TRYAGAIN, CLUSTERDOWN or OOM); nothing ran, retry",
                ));
            }
            match value? {
                Some(Value::Array(got)) if got.len() == part.len() => break Some(got),
                // On a Cluster the chunk spans slots and was not sent: send less at once.
                None if part.len() > 1 && !atomic => break None,
                None => {
                    return Err(error(
                        StatusCode::BAD_REQUEST,
                        "CROSSSLOT a transaction's keys must hash to one slot on a Redis Cluster (use a {hash tag}); nothing ran",
                    ));
                }
                _ => return Err(error(StatusCode::BAD_GATEWAY, "ERR unexpected pipeline reply from Redis")),
            }
        };
        let Some(got) = got else {
            chunk = part.len() / 2;
            continue;
        };
        // The chunks' replies together stay within the reply bound, as one call's would.
        held += got.iter().map(|v| reply::encoded_len_bound(v, reply::Encoding::Resp2)).sum::<usize>();
        if held > st.max_response {
            return Err(too_large(st, ": ask for less at once (fewer commands per pipeline)"));
        }
        items.extend(got);
        // The next chunk fits what is left at the dearest rate seen so far, and at most doubles
        // (up to 32): cheap commands first cannot buy a large chunk of dear ones after them.
        let per_command = sent.elapsed() / u32::try_from(part.len()).unwrap_or(u32::MAX).max(1);
        dearest = dearest.max(per_command);
        let left = st.timeout.saturating_sub(started.elapsed());
        let fits = usize::try_from(left.as_nanos() / dearest.as_nanos().max(1)).unwrap_or(usize::MAX);
        chunk = fits.min(part.len().saturating_mul(2)).clamp(1, 32);
    }
    // A pipeline does not reload a lost script (its NOSCRIPT reaches the client, whose
    // own fallback sends the source).
    for (item, fix) in items.iter_mut().zip(fixups) {
        fix.apply(st, item);
    }
    let whole = Value::Array(items);
    // A RESP2 pipeline answer is raw RESP; otherwise JSON, base64 if asked.
    let raw = resp2 && !atomic;
    encodable(st, &whole, reply::encoding(base64, raw))?;
    let Value::Array(items) = whole else { unreachable!("built above") };
    // Back in request order, the refused entries in their places.
    let mut sent = items.iter();
    let mut refused = refused.into_iter().peekable();
    let mut answers: Vec<Result<&Value, Failure>> = Vec::with_capacity(items.len() + refused.len());
    while let Some(answer) = match refused.peek() {
        Some((i, _)) if *i == answers.len() => refused.next().map(|(_, f)| Err(f)),
        _ => sent.next().map(Ok),
    } {
        answers.push(answer);
    }
    if raw {
        let mut out = Vec::new();
        for answer in &answers {
            match answer {
                Ok(item) => reply::to_resp2(item, &mut out),
                // One line: the messages are built here, without line breaks.
                Err(f) => out.extend_from_slice(format!("-{}\r\n", f.message.replace(['\r', '\n'], " ")).as_bytes()),
            }
        }
        return ok_response(st, out, "application/octet-stream", permits);
    }
    let body = Json::Array(
        answers
            .iter()
            .map(|a| match a {
                Ok(item) => reply::entry(item, base64),
                Err(f) => json!({ "error": f.message }),
            })
            .collect(),
    )
    .to_string();
    ok_response(st, body.into_bytes(), "application/json", permits)
}

/// The request-parsing path of the front, on arbitrary input (for the fuzz target): path
/// segments, one JSON command, a JSON pipeline, the refusal rules and script rewriting.
pub(crate) fn fuzz_parse(path: &str, body: &[u8]) {
    let bytes = Bytes::copy_from_slice(body);
    for seg in path.split('/') {
        let _ = percent_decode(seg);
    }
    let mut cmds: Vec<Cmd> = parse_one(&bytes).into_iter().collect();
    if let Ok(many) = parse_many(&bytes) {
        cmds.extend(many.into_iter().flatten());
    }
    for c in &cmds {
        let _ = commands::refusal(&c.name, &c.args);
        if let Some(src) = c.args.first() {
            let _ = crate::scripts::rewrite(src);
        }
    }
    let _ = crate::scripts::rewrite(body);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The two-step parse `parse_one` takes a shortcut past: same command, or an error both ways.
    fn two_steps(bytes: &Bytes) -> Option<(String, Vec<Vec<u8>>)> {
        let v = parse_json(bytes).ok()?;
        let items: Vec<&RawValue> = serde_json::from_str(v.get()).ok()?;
        let mut args = Vec::new();
        for item in items {
            let text = item.get();
            args.push(match text.as_bytes().first() {
                Some(b'"') => serde_json::from_str::<String>(text).ok()?.into_bytes(),
                Some(b'-' | b'0'..=b'9' | b't' | b'f' | b'n') => text.as_bytes().to_vec(),
                _ => return None,
            });
        }
        if args.is_empty() {
            return None;
        }
        let name = String::from_utf8(args.remove(0)).ok()?;
        (!name.is_empty()).then_some((name, args))
    }

    #[test]
    fn the_one_pass_parse_reads_every_body_as_the_two_step_one() {
        // Bodies put together from pieces that matter to a JSON reader: escapes, non-ASCII,
        // numbers, literals, nesting, whitespace and broken syntax; from a fixed seed, so a
        // failure replays (its case number and body are printed).
        let pieces = [
            "\"SET\"",
            "\"k\"",
            "\"a\\\"b\"",
            "\"\\u00e9\"",
            "\"é\"",
            "\"\\\\\"",
            "\"\\n\"",
            "1",
            "-2.5e3",
            "1E3",
            "true",
            "null",
            "false",
            "[]",
            "{}",
            "[\"x\"]",
            "\"\"",
            " ",
            ",",
            "\"\\ud83d\\ude00\"",
            "\"\\x\"",
            "\"",
        ];
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        for case in 0..20_000 {
            let mut body = String::from(if case % 7 == 0 { " [" } else { "[" });
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            let n = (seed >> 60) as usize;
            for j in 0..n {
                seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                if j > 0 && !(seed >> 59).is_multiple_of(13) {
                    body.push(',');
                }
                body.push_str(pieces[(seed >> 33) as usize % pieces.len()]);
            }
            if case % 11 != 0 {
                body.push(']');
            }
            if case % 5 == 0 {
                body.push_str(" \n");
            }
            let bytes = Bytes::from(body.clone());
            let got = parse_one(&bytes).ok().map(|c| (c.name, c.args));
            assert_eq!(got, two_steps(&bytes), "case {case}: {body}");
        }
    }
}
