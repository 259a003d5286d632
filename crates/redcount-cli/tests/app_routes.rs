//! The route contract as a table, run in-process against a real Redis: each row is one HTTP
//! request to `redcount serve`'s router (`app(...)`, driven with `oneshot` over
//! `Backend::Direct`) and the response it must give: its status, the JSON fields that
//! matter, and headers where they matter. A row that needs state makes it first through the
//! app itself (`given`); the request under test comes last. One `#[tokio::test]` per row,
//! named for its behaviour.
//!
//! The rows share one redis-server (a free port, no persistence, stopped when the last row
//! running ends); each names its own subjects (`{s}` in a path, a body or a header is the
//! row's name; `{id}` is the last red-packet id a `given` request answered).
//!
//! The routes are those of `redcount_api`'s router (crates/redcount-api/src/routes.rs):
//! health, policies, counters, claims, quotas (fixed / sliding / bucket / gcra: take, peek, reset),
//! semaphores (acquire / renew / release), compound decisions, inbox (messages, trim), red packets (create,
//! grab, status, claims); then what every route shares (admin token, idempotency, CORS,
//! errors, body limits) and the static files outside `/api/`.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderValue, Request};
use redcount_cli::serve::{Backend, app};
use serde_json::{Value, json};
use tower::ServiceExt;

const ADMIN: &str = "admin-token-of-app-routes-0123";
const ORIGIN: &str = "https://allowed.example";
const EVIL: &str = "https://evil.example";
const HOUR: i64 = 3_600_000;
/// Slack for values that count down with the clock (a row takes well under this).
const SLACK: i64 = 60_000;
/// The fixed-window quota's window (the longest allowed): windows are aligned to the Unix
/// epoch, so a run never crosses one.
const EPOCHAL: i64 = 1_000_000_000_000;

const POLICIES: &str = r#"{
  "steps":   {"kind": "counter", "min": 0, "max": 10, "max_step": 5},
  "seats":   {"kind": "counter", "min": 0, "max": 3, "mode": "reject", "storage": "hash", "max_step": 3},
  "bonus":   {"kind": "claim", "window_ms": 3600000},
  "fixed":   {"kind": "quota", "algorithm": "fixed", "limit": 3, "window_ms": 1000000000000, "max_cost": 2},
  "sliding": {"kind": "quota", "algorithm": "sliding", "limit": 3, "window_ms": 3600000, "max_cost": 2},
  "bucket":  {"kind": "quota", "algorithm": "bucket", "capacity": 3, "refill": 1, "interval_ms": 3600000,
              "max_cost": 2},
  "gcra":    {"kind": "quota", "algorithm": "gcra", "rate": 1, "period_ms": 3600000, "burst": 3, "max_cost": 2},
  "slots":   {"kind": "semaphore", "limit": 2, "lease_ms": 600000},
  "packets": {"kind": "redpackets", "max_shares": 10, "max_total_cents": 5000, "ttl_ms": 3600000},
  "mail":    {"kind": "inbox", "max_len": 3, "max_age_s": 1}
}"#;

const PUBLIC_INBOX: &str = r#"{"open": {"kind": "inbox", "public": true}}"#;

const INDEX: &str = "<!doctype html><title>redcount</title>\n";
const APP_JS: &str = "console.log('redcount');\n";
const STYLE: &str = "body { margin: 0 }\n";
const PAGE: &str = "<p>nested</p>\n";
const SECRET: &str = "top secret: outside www\n";

// ---------------------------------------------------------------------------------------
// Redis, the app, the demo files.

/// A redis-server of the test's own (`--save "" --appendonly no`), stopped on drop.
struct Redis {
    port: u16,
    dir: PathBuf,
    proc: redcount_procs::Proc,
}

impl Redis {
    fn start() -> Redis {
        let port = redcount_procs::free_port();
        let dir = redcount_procs::scratch_dir("app-routes-redis");
        // redis_command adds `--save ""` itself.
        let mut cmd = redcount_procs::redis_command(port, &dir, &["--appendonly", "no"]);
        let mut proc = redcount_procs::Proc::spawn("redis-server", &mut cmd)
            .unwrap_or_else(|e| panic!("{e} (`cargo xtask test` installs redis-server)"));
        redcount_procs::wait_port(port, Duration::from_secs(10), &mut proc).unwrap();
        let redis = Redis { port, dir, proc };
        // Accepting connections is not enough: wait until it answers PING.
        let client = redis::Client::open(redis.url()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(mut c) = client.get_connection()
                && redis::cmd("PING").query::<String>(&mut c).is_ok()
            {
                return redis;
            }
            assert!(Instant::now() < deadline, "redis-server on port {port} did not answer PING");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.proc.stop(Duration::from_secs(3));
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The Redis the rows share: started by the first row that needs it, stopped when the
/// last row holding it ends (a later row starts another; each row sets up its own state).
fn shared_redis() -> Arc<Redis> {
    static SHARED: Mutex<Weak<Redis>> = Mutex::new(Weak::new());
    let mut slot = SHARED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(redis) = slot.upgrade() {
        return redis;
    }
    let redis = Arc::new(Redis::start());
    *slot = Arc::downgrade(&redis);
    redis
}

/// A `www` directory with the demo's kinds of files, and a secret beside it (outside).
struct Www {
    root: PathBuf,
}

impl Www {
    fn new() -> Www {
        let root = redcount_procs::scratch_dir("app-routes-www");
        let www = root.join("www");
        std::fs::create_dir_all(www.join("sub")).unwrap();
        for (path, text) in [("index.html", INDEX), ("app.js", APP_JS), ("style.css", STYLE), ("sub/page.html", PAGE)] {
            std::fs::write(www.join(path), text).unwrap();
        }
        std::fs::write(root.join("secret.txt"), SECRET).unwrap();
        Www { root }
    }

    fn dir(&self) -> PathBuf {
        self.root.join("www")
    }
}

impl Drop for Www {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// Which server a row talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum On {
    /// [`POLICIES`], the admin token, CORS for [`ORIGIN`].
    Main,
    /// An inbox policy with `"public": true`.
    PublicInbox,
    /// [`POLICIES`] with no admin token configured.
    NoAdminToken,
    /// [`POLICIES`], over a connection to a Redis that has stopped.
    RedisDown,
    /// [`POLICIES`], keys in the namespace [`NAMESPACE`] instead of `rc`.
    Namespaced,
}

const NAMESPACE: &str = "app-routes-ns";

fn config(on: On) -> redcount_api::Config {
    let policies = if on == On::PublicInbox { PUBLIC_INBOX } else { POLICIES };
    let admin = on != On::NoAdminToken;
    let var = |name: &str| match name {
        "REDCOUNT_POLICIES" => Some(policies.to_string()),
        "REDCOUNT_ADMIN_TOKEN" if admin => Some(ADMIN.to_string()),
        "REDCOUNT_CORS_ORIGINS" => Some(ORIGIN.to_string()),
        "REDCOUNT_NAMESPACE" if on == On::Namespaced => Some(NAMESPACE.to_string()),
        _ => None,
    };
    redcount_api::Config::from_env(var).expect("the test configuration is valid")
}

async fn direct(redis: &Redis) -> redcount::Direct {
    redcount::Direct::connect(&redis.url()).await.expect("connect to the test redis")
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as i64
}

fn now_s() -> i64 {
    now_ms() / 1000
}

/// What is left of the current fixed window, as a range: at most what is left now.
fn window_left() -> (i64, i64) {
    let now = now_ms();
    let end = (now / EPOCHAL + 1) * EPOCHAL;
    (end - now - SLACK, end - now)
}

// ---------------------------------------------------------------------------------------
// Rows.

#[derive(Debug, Clone)]
enum Payload {
    Bytes(Vec<u8>),
    /// A body that never finishes arriving.
    Never,
}

/// One HTTP request.
#[derive(Debug, Clone)]
struct Req {
    method: &'static str,
    path: String,
    headers: Vec<(&'static str, Vec<u8>)>,
    body: Payload,
}

fn req(method: &'static str, path: impl Into<String>) -> Req {
    Req { method, path: path.into(), headers: Vec::new(), body: Payload::Bytes(Vec::new()) }
}

fn get(path: impl Into<String>) -> Req {
    req("GET", path)
}

fn post(path: impl Into<String>, body: impl Into<Vec<u8>>) -> Req {
    req("POST", path).body(body)
}

fn put(path: impl Into<String>, body: impl Into<Vec<u8>>) -> Req {
    req("PUT", path).body(body)
}

fn delete(path: impl Into<String>) -> Req {
    req("DELETE", path)
}

impl Req {
    fn body(mut self, body: impl Into<Vec<u8>>) -> Req {
        self.body = Payload::Bytes(body.into());
        self
    }

    fn never_ending(mut self) -> Req {
        self.body = Payload::Never;
        self
    }

    fn header(mut self, name: &'static str, value: impl Into<Vec<u8>>) -> Req {
        self.headers.push((name, value.into()));
        self
    }

    fn admin(self) -> Req {
        self.header("authorization", format!("Bearer {ADMIN}"))
    }

    fn key(self, key: &str) -> Req {
        self.header("idempotency-key", key)
    }

    fn origin(self, origin: &str) -> Req {
        self.header("origin", origin)
    }

    /// A set-up step: this request, which must answer `status`.
    fn ok(self, status: u16) -> Given {
        Given::Call(self, status)
    }

    /// The row's set-up (see [`Row::given`]); its status follows with [`Row::then`].
    fn given(self, steps: impl IntoIterator<Item = Given>) -> Row {
        self.then(0).given(steps)
    }

    fn on(self, on: On) -> Row {
        self.then(0).on(on)
    }

    fn body_timeout(self, t: Duration) -> Row {
        self.then(0).body_timeout(t)
    }

    /// The row: this request must answer `status` (and what the row adds).
    fn then(self, status: u16) -> Row {
        Row {
            on: On::Main,
            body_timeout: Duration::from_secs(5),
            given: Vec::new(),
            req: self,
            status,
            json: Vec::new(),
            headers: Vec::new(),
            raw: None,
            lacks: Vec::new(),
            checks: Vec::new(),
        }
    }
}

/// State a row needs, made before its request.
#[derive(Debug)]
enum Given {
    /// A request through the app, and the status it must answer.
    Call(Req, u16),
    /// Time passing.
    Sleep(Duration),
    /// A command sent to Redis itself (only to make a state the API cannot make).
    Redis(Vec<&'static str>),
}

/// What a value (a JSON field by pointer, or a header) must be.
#[derive(Debug, Clone)]
enum M {
    Eq(Value),
    Between(i64, i64),
    Absent,
    Len(usize),
    Contains(&'static str),
}

impl From<Value> for M {
    fn from(v: Value) -> M {
        M::Eq(v)
    }
}
impl From<i32> for M {
    fn from(v: i32) -> M {
        M::Eq(json!(v))
    }
}
impl From<i64> for M {
    fn from(v: i64) -> M {
        M::Eq(json!(v))
    }
}
impl From<bool> for M {
    fn from(v: bool) -> M {
        M::Eq(json!(v))
    }
}
impl From<&str> for M {
    fn from(v: &str) -> M {
        M::Eq(json!(v))
    }
}

fn between(lo: i64, hi: i64) -> M {
    M::Between(lo, hi)
}

fn absent() -> M {
    M::Absent
}

fn len(n: usize) -> M {
    M::Len(n)
}

fn contains(text: &'static str) -> M {
    M::Contains(text)
}

type Check = Box<dyn Fn(&Got)>;

struct Row {
    on: On,
    body_timeout: Duration,
    given: Vec<Given>,
    req: Req,
    status: u16,
    /// JSON pointer → what the value must be.
    json: Vec<(&'static str, M)>,
    /// Header (lower case) → what it must be.
    headers: Vec<(&'static str, M)>,
    /// The exact body.
    raw: Option<Vec<u8>>,
    /// Text the body must not contain.
    lacks: Vec<&'static str>,
    /// Relations between values of the response.
    checks: Vec<Check>,
}

impl Row {
    fn then(mut self, status: u16) -> Row {
        self.status = status;
        self
    }

    fn on(mut self, on: On) -> Row {
        self.on = on;
        self
    }

    fn body_timeout(mut self, t: Duration) -> Row {
        self.body_timeout = t;
        self
    }

    fn given(mut self, steps: impl IntoIterator<Item = Given>) -> Row {
        self.given.extend(steps);
        self
    }

    fn json(mut self, pointer: &'static str, m: impl Into<M>) -> Row {
        self.json.push((pointer, m.into()));
        self
    }

    fn header(mut self, name: &'static str, m: impl Into<M>) -> Row {
        self.headers.push((name, m.into()));
        self
    }

    fn raw(mut self, body: &str) -> Row {
        self.raw = Some(body.as_bytes().to_vec());
        self
    }

    fn lacks(mut self, text: &'static str) -> Row {
        self.lacks.push(text);
        self
    }

    fn check(mut self, f: impl Fn(&Got) + 'static) -> Row {
        self.checks.push(Box::new(f));
        self
    }
}

/// A response as the row sees it.
struct Got {
    status: u16,
    headers: HeaderMap,
    bytes: Vec<u8>,
    json: Value,
}

impl Got {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes).into_owned()
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().expect("a visible ASCII header value"))
    }

    fn int(&self, pointer: &str) -> i64 {
        self.json.pointer(pointer).and_then(Value::as_i64).unwrap_or_else(|| panic!("no integer at {pointer}"))
    }
}

/// The row's substitutions: `{s}` its subject, `{id}` the red packet made in `given`.
struct Ctx {
    s: String,
    id: Option<String>,
}

impl Ctx {
    fn subst(&self, text: &str) -> String {
        let text = text.replace("{s}", &self.s);
        if text.contains("{id}") {
            let id = self.id.as_deref().expect("`{id}` is used after a request that answered an id");
            return text.replace("{id}", id);
        }
        text
    }

    fn subst_value(&self, v: &Value) -> Value {
        match v {
            Value::String(s) => Value::String(self.subst(s)),
            Value::Array(a) => Value::Array(a.iter().map(|v| self.subst_value(v)).collect()),
            Value::Object(o) => Value::Object(o.iter().map(|(k, v)| (k.clone(), self.subst_value(v))).collect()),
            other => other.clone(),
        }
    }

    fn subst_bytes(&self, bytes: &[u8]) -> Vec<u8> {
        match std::str::from_utf8(bytes) {
            Ok(text) => self.subst(text).into_bytes(),
            Err(_) => bytes.to_vec(),
        }
    }
}

async fn send(app: &axum::Router, ctx: &Ctx, r: &Req) -> Got {
    let mut request = Request::builder().method(r.method).uri(ctx.subst(&r.path));
    for (name, value) in &r.headers {
        request = request.header(*name, HeaderValue::from_bytes(&ctx.subst_bytes(value)).unwrap());
    }
    let body = match &r.body {
        Payload::Bytes(b) => Body::from(ctx.subst_bytes(b)),
        Payload::Never => Body::from_stream(futures_util::stream::pending::<Result<Bytes, std::io::Error>>()),
    };
    let response = app.clone().oneshot(request.body(body).unwrap()).await.unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap().to_vec();
    let json = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    Got { status, headers, bytes, json }
}

fn matches(m: &M, got: Option<&Value>, ctx: &Ctx) -> bool {
    match (m, got) {
        (M::Eq(want), Some(v)) => *v == ctx.subst_value(want),
        (M::Between(lo, hi), Some(v)) => v.as_i64().is_some_and(|n| (*lo..=*hi).contains(&n)),
        (M::Absent, None) => true,
        (M::Len(n), Some(v)) => v.as_array().is_some_and(|a| a.len() == *n),
        (M::Contains(text), Some(v)) => v.as_str().is_some_and(|s| s.contains(text)),
        _ => false,
    }
}

fn header_matches(m: &M, got: Option<&str>, ctx: &Ctx) -> bool {
    match (m, got) {
        (M::Eq(Value::String(want)), Some(v)) => v == ctx.subst(want),
        (M::Between(lo, hi), Some(v)) => v.parse::<i64>().is_ok_and(|n| (*lo..=*hi).contains(&n)),
        (M::Absent, None) => true,
        (M::Contains(text), Some(v)) => v.contains(text),
        _ => false,
    }
}

async fn run(name: &str, row: Row) {
    assert!(name.len() <= 60, "{name}: a row's name is its subject: keep it short enough for an id");
    let www = Www::new();
    let (redis, direct) = if row.on == On::RedisDown {
        let own = Redis::start();
        let d = direct(&own).await;
        drop(own); // stopped: the connection is to a Redis that is gone
        (None, d)
    } else {
        let shared = shared_redis();
        let d = direct(&shared).await;
        (Some(shared), d)
    };
    let app = app(config(row.on), Backend::Direct(direct), www.dir(), row.body_timeout);
    let mut ctx = Ctx { s: name.to_string(), id: None };

    for (i, step) in row.given.iter().enumerate() {
        match step {
            Given::Call(r, status) => {
                let got = send(&app, &ctx, r).await;
                let what = format!("{name}: set-up step {i}: {} {}", r.method, ctx.subst(&r.path));
                assert_eq!(got.status, *status, "{what}: {}", got.text());
                if let Some(id) = got.json["id"].as_str() {
                    ctx.id = Some(id.to_string());
                }
            }
            Given::Sleep(d) => tokio::time::sleep(*d).await,
            Given::Redis(args) => {
                let redis = redis.as_ref().expect("a running Redis");
                let mut conn = redis::Client::open(redis.url()).unwrap().get_connection().unwrap();
                let mut cmd = redis::cmd(args[0]);
                for a in &args[1..] {
                    cmd.arg(ctx.subst(a));
                }
                cmd.query::<redis::Value>(&mut conn).unwrap_or_else(|e| panic!("{name}: set-up step {i}: {e}"));
            }
        }
    }

    let got = send(&app, &ctx, &row.req).await;
    let what = format!("{name}: {} {}", row.req.method, ctx.subst(&row.req.path));
    let text = got.text();
    assert_eq!(got.status, row.status, "{what}: status; body {text}");
    for (pointer, m) in &row.json {
        let value = got.json.pointer(pointer);
        assert!(matches(m, value, &ctx), "{what}: {pointer} must be {m:?}, is {value:?}; body {text}");
    }
    for (header, m) in &row.headers {
        let value = got.header(header);
        assert!(header_matches(m, value, &ctx), "{what}: header {header} must be {m:?}, is {value:?}");
    }
    if let Some(raw) = &row.raw {
        assert_eq!(got.bytes, *raw, "{what}: the body: {text}");
    }
    for needle in &row.lacks {
        assert!(!text.contains(needle), "{what}: the body contains {needle:?}: {text}");
    }
    for check in &row.checks {
        check(&got);
    }
    // What every answer of the API shares.
    if row.req.path.starts_with("/api/") {
        assert_eq!(got.header("cache-control"), Some("no-store"), "{what}: answers are live state");
        if got.status != 204 {
            assert_eq!(got.header("content-type"), Some("application/json"), "{what}");
        }
        if got.status != 204 && row.req.method != "HEAD" {
            assert!(!got.json.is_null(), "{what}: the body is JSON: {text}");
        }
    }
    if got.status >= 400 {
        assert!(got.json["error"].as_str().is_some_and(|e| !e.is_empty()), "{what}: an error says why: {text}");
    }
}

/// One `#[tokio::test]` per row.
macro_rules! rows {
    ($($(#[$meta:meta])* $name:ident => $row:expr,)+) => {
        $(
            $(#[$meta])*
            #[tokio::test]
            async fn $name() {
                run(stringify!($name), $row).await;
            }
        )+
    };
}

// ---------------------------------------------------------------------------------------
// Rows made from a pattern, for each quota algorithm.

fn quota(algo: &str) -> String {
    format!("/api/quotas/{algo}/{{s}}")
}

fn take(algo: &str, cost: i64) -> Given {
    post(quota(algo), format!(r#"{{"cost":{cost}}}"#)).ok(200)
}

/// `Retry-After` is `retry_after_ms` in whole seconds, rounded up, at least 1.
fn retry_after_is_ceil_seconds(g: &Got) {
    let ms = g.int("/retry_after_ms");
    let header: i64 = g.header("retry-after").expect("Retry-After").parse().unwrap();
    assert_eq!(header, ((ms + 999) / 1000).max(1), "Retry-After for retry_after_ms {ms}");
}

/// What is left of a wait of `full` ms that started during the row.
fn countdown(full: i64) -> M {
    between(full - SLACK, full)
}

fn seconds(m: &M) -> M {
    match *m {
        M::Between(lo, hi) => between((lo + 999) / 1000, (hi + 999) / 1000),
        _ => unreachable!(),
    }
}

/// Until the bucket or window lets a denied unit through, after a take at the row's start.
fn wait_after_take(algo: &str) -> M {
    match algo {
        "fixed" => {
            let (lo, hi) = window_left();
            between(lo, hi)
        }
        _ => countdown(HOUR),
    }
}

fn quota_take(algo: &str) -> Row {
    let reset = match algo {
        "fixed" => wait_after_take(algo),
        // The whole window, from this call.
        "sliding" => json!(HOUR).into(),
        // Two steps of one token refill the two taken.
        _ => json!(2 * HOUR).into(),
    };
    post(quota(algo), r#"{"cost":2}"#)
        .then(200)
        .json("/allowed", true)
        .json("/limit", 3)
        .json("/remaining", 3 - 2)
        .json("/retry_after_ms", 0)
        .json("/reset_ms", reset)
        .header("retry-after", absent())
}

fn quota_default_cost(algo: &str) -> Row {
    post(quota(algo), "").then(200).json("/allowed", true).json("/remaining", 3 - 1)
}

fn quota_denied(algo: &str) -> Row {
    let wait = wait_after_take(algo);
    let reset = match algo {
        "fixed" => wait.clone(),
        "sliding" => countdown(HOUR),
        _ => countdown(3 * HOUR),
    };
    post(quota(algo), r#"{"cost":1}"#)
        .given([take(algo, 2), take(algo, 1)])
        .then(200)
        .json("/allowed", false)
        .json("/limit", 3)
        .json("/remaining", 0)
        .json("/retry_after_ms", wait.clone())
        .json("/reset_ms", reset)
        .header("retry-after", seconds(&wait))
        .check(retry_after_is_ceil_seconds)
}

fn quota_peek(algo: &str) -> Row {
    get(format!("{}?cost=2", quota(algo)))
        .given([take(algo, 1)])
        .then(200)
        .json("/allowed", true)
        .json("/limit", 3)
        .json("/remaining", 3 - 1)
        .json("/retry_after_ms", 0)
        .header("retry-after", absent())
}

fn quota_peek_denied(algo: &str) -> Row {
    let wait = wait_after_take(algo);
    get(format!("{}?cost=2", quota(algo)))
        .given([take(algo, 2)])
        .then(200)
        .json("/allowed", false)
        .json("/remaining", 3 - 2)
        .json("/retry_after_ms", wait.clone())
        .header("retry-after", seconds(&wait))
        .check(retry_after_is_ceil_seconds)
}

fn quota_peek_consumes_nothing(algo: &str) -> Row {
    post(quota(algo), r#"{"cost":2}"#)
        .given([take(algo, 1), get(format!("{}?cost=2", quota(algo))).ok(200), get(quota(algo)).ok(200)])
        .then(200)
        .json("/allowed", true)
        // The limit, less the take before the peeks and this one: the peeks took nothing.
        .json("/remaining", 0)
}

fn quota_reset(algo: &str) -> Row {
    delete(quota(algo)).admin().given([take(algo, 2)]).then(200).json("", json!({"reset": true}))
}

fn quota_after_reset(algo: &str) -> Row {
    post(quota(algo), r#"{"cost":2}"#)
        .given([take(algo, 2), take(algo, 1), delete(quota(algo)).admin().ok(200)])
        .then(200)
        .json("/allowed", true)
        .json("/remaining", 3 - 2)
}

// ---------------------------------------------------------------------------------------
// Red packets, semaphores, inboxes: set-up steps.

fn create(total: i64, count: i64) -> Given {
    post("/api/redpackets", format!(r#"{{"total_cents":{total},"count":{count}}}"#)).ok(201)
}

fn grab(user: &str) -> Given {
    post("/api/redpackets/{id}/grab", format!(r#"{{"user":"{user}"}}"#)).ok(200)
}

/// The answer is `want` plus a fencing token: an integer, at least the server time in µs.
fn with_token(want: Value) -> impl Fn(&Got) + 'static {
    move |g: &Got| {
        let mut got = g.json.clone();
        let token = got.as_object_mut().and_then(|o| o.remove("fencing_token"));
        let token = token.and_then(|t| t.as_i64()).expect("a fencing token");
        assert!((1_700_000_000_000_000..1 << 53).contains(&token), "fencing token {token}");
        assert_eq!(got, want);
    }
}

/// `POST /api/decisions/{s}` with these parts.
fn decide(parts: &str) -> Req {
    post("/api/decisions/{s}", format!(r#"{{"parts":{parts}}}"#))
}

fn sem(action: &str, holder: &str) -> Req {
    post(format!("/api/semaphores/slots/{{s}}/{action}"), format!(r#"{{"holder":"{holder}"}}"#))
}

fn append(id: i64, body: &str) -> Given {
    post("/api/inbox/{s}/messages", json!({"id": id, "body": body}).to_string()).admin().ok(201)
}

const UNKNOWN_PACKET: &str = "0123456789abcdef0123456789abcdef";

fn is_packet_id(g: &Got) {
    let id = g.json["id"].as_str().expect("an id");
    assert!(id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()), "id {id}");
}

/// A body of exactly `n` bytes: `{"delta":1}` padded with spaces.
fn padded_delta(n: usize) -> Vec<u8> {
    let mut body = br#"{"delta":1}"#.to_vec();
    body.resize(n, b' ');
    body
}

// ---------------------------------------------------------------------------------------
// The table.

rows! {
    // --- health and policies ---
    health_reports_redis_reachable => get("/api/health").then(200)
        .json("", json!({"ok": true, "rest": "reachable", "redis": "reachable"})),
    health_post_is_405 => post("/api/health", "").then(405).header("allow", "GET, HEAD"),
    health_with_redis_down_is_503 => get("/api/health").on(On::RedisDown).then(503)
        .json("/error", contains("Redis is unreachable")).json("/field", absent()),
    write_with_redis_down_is_503 => post("/api/counters/steps/{s}", r#"{"delta":1}"#).on(On::RedisDown).then(503)
        .json("/error", contains("Redis is unreachable")),
    policies_lists_every_policy_as_configured => get("/api/policies").then(200)
        .json("/policies/steps", json!({
            "kind": "counter", "min": 0, "max": 10, "mode": "clamp", "storage": "key", "ttl_ms": 0, "max_step": 5
        }))
        .json("/policies/seats", json!({
            "kind": "counter", "min": 0, "max": 3, "mode": "reject", "storage": "hash", "ttl_ms": 0, "max_step": 3
        }))
        .json("/policies/bonus", json!({"kind": "claim", "window_ms": HOUR}))
        .json("/policies/fixed", json!({
            "kind": "quota", "algorithm": "fixed", "limit": 3, "window_ms": EPOCHAL, "max_cost": 2
        }))
        .json("/policies/sliding", json!({
            "kind": "quota", "algorithm": "sliding", "limit": 3, "window_ms": HOUR, "max_cost": 2
        }))
        .json("/policies/bucket", json!({
            "kind": "quota", "algorithm": "bucket", "capacity": 3, "refill": 1, "interval_ms": HOUR, "max_cost": 2
        }))
        .json("/policies/gcra", json!({
            "kind": "quota", "algorithm": "gcra", "rate": 1, "period_ms": HOUR, "burst": 3, "max_cost": 2
        }))
        .json("/policies/slots", json!({"kind": "semaphore", "limit": 2, "lease_ms": 600000}))
        .json("/policies/packets", json!({
            "kind": "redpackets", "max_shares": 10, "max_total_cents": 5000, "min_cents": 1, "ttl_ms": HOUR
        }))
        .json("/policies/mail", json!({
            "kind": "inbox", "ttl_ms": 7 * 86_400_000_i64, "max_len": 3, "max_age_s": 1, "public": false
        }))
        .check(|g| assert_eq!(g.json["policies"].as_object().unwrap().len(), 10, "ten policies, no more")),
    policies_hold_no_secret => get("/api/policies").admin().then(200).lacks(ADMIN),
    policies_head_is_200 => req("HEAD", "/api/policies").then(200),
    policies_post_is_405 => post("/api/policies", "{}").then(405).header("allow", "GET, HEAD"),

    // --- counters ---
    counter_add_applies_the_delta => post("/api/counters/steps/{s}", r#"{"delta":3}"#).then(200)
        .json("", json!({"value": 3, "applied": 3, "status": "applied"})),
    counter_get_reads_the_value => get("/api/counters/steps/{s}")
        .given([post("/api/counters/steps/{s}", r#"{"delta":4}"#).ok(200)]).then(200)
        .json("", json!({"value": 4})),
    counter_get_of_an_unwritten_subject_is_zero => get("/api/counters/steps/{s}").then(200)
        .json("", json!({"value": 0})),
    counter_clamps_at_its_maximum => post("/api/counters/steps/{s}", r#"{"delta":3}"#)
        .given([
            post("/api/counters/steps/{s}", r#"{"delta":5}"#).ok(200),
            post("/api/counters/steps/{s}", r#"{"delta":4}"#).ok(200),
        ])
        .then(200).json("", json!({"value": 10, "applied": 10 - 9, "status": "clamped"})),
    counter_clamps_at_its_minimum => post("/api/counters/steps/{s}", r#"{"delta":-5}"#)
        .given([post("/api/counters/steps/{s}", r#"{"delta":2}"#).ok(200)])
        .then(200).json("", json!({"value": 0, "applied": -2, "status": "clamped"})),
    counter_reject_mode_refuses_past_the_bound => post("/api/counters/seats/{s}", r#"{"delta":1}"#)
        .given([post("/api/counters/seats/{s}", r#"{"delta":3}"#).ok(200)])
        .then(200).json("", json!({"value": 3, "applied": 0, "status": "rejected"})),
    counter_hash_storage_keeps_subjects_apart => get("/api/counters/seats/{s}-a")
        .given([
            post("/api/counters/seats/{s}-a", r#"{"delta":2}"#).ok(200),
            post("/api/counters/seats/{s}-b", r#"{"delta":1}"#).ok(200),
        ])
        .then(200).json("", json!({"value": 2})),
    counter_public_delta_beyond_max_step_is_403 => post("/api/counters/steps/{s}", r#"{"delta":6}"#).then(403)
        .json("/field", "delta"),
    counter_admin_may_exceed_max_step => post("/api/counters/steps/{s}", r#"{"delta":8}"#).admin().then(200)
        .json("", json!({"value": 8, "applied": 8, "status": "applied"})),
    counter_delta_of_wrong_type_is_400 => post("/api/counters/steps/{s}", r#"{"delta":true}"#).then(400)
        .json("/field", "delta"),
    counter_delta_as_a_decimal_string_is_accepted => post("/api/counters/steps/{s}", r#"{"delta":"2"}"#).then(200)
        .json("", json!({"value": 2, "applied": 2, "status": "applied"})),
    counter_delta_string_not_canonical_is_400 => post("/api/counters/steps/{s}", r#"{"delta":"1e3"}"#).then(400)
        .json("/field", "delta"),
    counter_delta_fraction_is_400 => post("/api/counters/steps/{s}", r#"{"delta":1.5}"#).then(400)
        .json("/field", "delta"),
    counter_delta_missing_is_400 => post("/api/counters/steps/{s}", "{}").then(400).json("/field", "delta"),
    counter_bad_subject_is_400 => post("/api/counters/steps/a:b", r#"{"delta":1}"#).then(400).json("/field", "subject"),
    counter_unknown_policy_is_404 => post("/api/counters/nope/{s}", r#"{"delta":1}"#).then(404)
        .json("/field", "policy"),
    counter_policy_of_another_kind_is_404 => post("/api/counters/bonus/{s}", r#"{"delta":1}"#).then(404)
        .json("/field", "policy").json("/error", "policy bonus is a claim policy, not a counter policy"),
    counter_put_is_405_with_allow => req("PUT", "/api/counters/steps/{s}").body(r#"{"delta":1}"#).then(405)
        .header("allow", "GET, HEAD, POST").json("/field", absent()),
    counter_redis_error_reply_is_502 => post("/api/counters/steps/{s}", r#"{"delta":1}"#)
        .given([Given::Redis(vec!["HSET", "rc:{c:steps:{s}}", "f", "v"])])
        .then(502).json("/error", contains("WRONGTYPE")),
    namespace_keeps_keys_apart_from_rc => post("/api/counters/steps/{s}", r#"{"delta":1}"#).on(On::Namespaced)
        .given([Given::Redis(vec!["HSET", "rc:{c:steps:{s}}", "f", "v"])])
        .then(200).json("", json!({"value": 1, "applied": 1, "status": "applied"})),
    namespace_holds_the_keys => post("/api/counters/steps/{s}", r#"{"delta":1}"#).on(On::Namespaced)
        .given([Given::Redis(vec!["HSET", "app-routes-ns:{c:steps:{s}}", "f", "v"])])
        .then(502).json("/error", contains("WRONGTYPE")),

    // --- claims ---
    claim_first_takes_it => post("/api/claims/bonus/{s}", "").then(200)
        .json("", json!({"claimed": true, "retry_after_ms": HOUR})),
    claim_again_in_the_window_is_refused => post("/api/claims/bonus/{s}", "")
        .given([post("/api/claims/bonus/{s}", "").ok(200)]).then(200)
        .json("/claimed", false).json("/retry_after_ms", countdown(HOUR)),
    claim_subjects_are_independent => post("/api/claims/bonus/{s}-b", "")
        .given([post("/api/claims/bonus/{s}-a", "").ok(200)]).then(200).json("/claimed", true),
    claim_body_with_a_field_is_400_naming_it => post("/api/claims/bonus/{s}", r#"{"x":1}"#).then(400)
        .json("/field", "x"),
    claim_get_is_405 => get("/api/claims/bonus/{s}").then(405).header("allow", "POST"),

    // --- quotas, each algorithm ---
    quota_fixed_take_counts_the_cost => quota_take("fixed"),
    quota_sliding_take_counts_the_cost => quota_take("sliding"),
    quota_bucket_take_counts_the_cost => quota_take("bucket"),
    quota_gcra_take_counts_the_cost => quota_take("gcra"),
    quota_fixed_cost_defaults_to_one => quota_default_cost("fixed"),
    quota_sliding_cost_defaults_to_one => quota_default_cost("sliding"),
    quota_bucket_cost_defaults_to_one => quota_default_cost("bucket"),
    quota_gcra_cost_defaults_to_one => quota_default_cost("gcra"),
    quota_fixed_denies_past_the_limit => quota_denied("fixed"),
    quota_sliding_denies_past_the_limit => quota_denied("sliding"),
    quota_bucket_denies_past_the_limit => quota_denied("bucket"),
    quota_gcra_denies_past_the_limit => quota_denied("gcra"),
    quota_fixed_peek_tells_what_a_cost_would_get => quota_peek("fixed"),
    quota_sliding_peek_tells_what_a_cost_would_get => quota_peek("sliding"),
    quota_bucket_peek_tells_what_a_cost_would_get => quota_peek("bucket"),
    quota_gcra_peek_tells_what_a_cost_would_get => quota_peek("gcra"),
    quota_fixed_peek_denied_has_retry_after => quota_peek_denied("fixed"),
    quota_sliding_peek_denied_has_retry_after => quota_peek_denied("sliding"),
    quota_bucket_peek_denied_has_retry_after => quota_peek_denied("bucket"),
    quota_gcra_peek_denied_has_retry_after => quota_peek_denied("gcra"),
    quota_fixed_peek_consumes_nothing => quota_peek_consumes_nothing("fixed"),
    quota_sliding_peek_consumes_nothing => quota_peek_consumes_nothing("sliding"),
    quota_bucket_peek_consumes_nothing => quota_peek_consumes_nothing("bucket"),
    quota_gcra_peek_consumes_nothing => quota_peek_consumes_nothing("gcra"),
    quota_fixed_admin_reset_forgets_usage => quota_reset("fixed"),
    quota_sliding_admin_reset_forgets_usage => quota_reset("sliding"),
    quota_bucket_admin_reset_forgets_usage => quota_reset("bucket"),
    quota_gcra_admin_reset_forgets_usage => quota_reset("gcra"),
    quota_fixed_after_reset_is_full_again => quota_after_reset("fixed"),
    quota_sliding_after_reset_is_full_again => quota_after_reset("sliding"),
    quota_bucket_after_reset_is_full_again => quota_after_reset("bucket"),
    quota_gcra_after_reset_is_full_again => quota_after_reset("gcra"),
    quota_reset_of_unused_says_so => delete("/api/quotas/fixed/{s}").admin().then(200)
        .json("", json!({"reset": false})),
    quota_reset_without_token_is_401 => delete("/api/quotas/fixed/{s}").then(401).json("/field", absent()),
    quota_reset_with_wrong_token_is_401 => delete("/api/quotas/fixed/{s}")
        .header("authorization", "Bearer not-the-admin-token-000").then(401),
    quota_public_cost_beyond_max_cost_is_403 => post("/api/quotas/fixed/{s}", r#"{"cost":3}"#).then(403)
        .json("/field", "cost"),
    quota_admin_may_exceed_max_cost => post("/api/quotas/fixed/{s}", r#"{"cost":3}"#).admin().then(200)
        .json("/allowed", true).json("/remaining", 3 - 3),
    quota_cost_above_the_limit_is_400 => post("/api/quotas/fixed/{s}", r#"{"cost":4}"#).admin().then(400)
        .json("/field", "cost"),
    quota_cost_zero_is_400 => post("/api/quotas/fixed/{s}", r#"{"cost":0}"#).then(400).json("/field", "cost"),
    quota_peek_unknown_query_parameter_is_400 => get("/api/quotas/fixed/{s}?costs=1").then(400).json("/field", "costs"),
    quota_peek_cost_given_twice_is_400 => get("/api/quotas/fixed/{s}?cost=1&cost=2").then(400).json("/field", "cost"),
    quota_peek_cost_not_a_number_is_400 => get("/api/quotas/fixed/{s}?cost=x").then(400).json("/field", "cost"),
    quota_patch_is_405 => req("PATCH", "/api/quotas/fixed/{s}").then(405).header("allow", "GET, HEAD, POST, DELETE"),
    quota_on_a_semaphore_policy_is_404 => post("/api/quotas/slots/{s}", "").then(404).json("/field", "policy"),
    override_raises_a_subjects_limit => post(quota("fixed"), r#"{"cost":2}"#)
        .given([take("fixed", 2), take("fixed", 1),
            put("/api/overrides/fixed/{s}", r#"{"limit":6}"#).admin().ok(200)])
        .then(200).json("/allowed", true).json("/limit", 6).json("/remaining", 1),
    override_by_the_algorithms_own_name => post(quota("gcra"), r#"{"cost":2}"#)
        .given([put("/api/overrides/gcra/{s}", r#"{"burst":1}"#).admin().ok(200)])
        .then(200).json("/allowed", false).json("/limit", 1),
    override_lowers_a_bucket => post(quota("bucket"), "")
        .given([put("/api/overrides/bucket/{s}", r#"{"capacity":1,"ttl_ms":60000}"#).admin().ok(200), take("bucket", 1)])
        .then(200).json("/allowed", false).json("/limit", 1),
    override_answers_what_was_set => put("/api/overrides/sliding/{s}", r#"{"limit":7,"ttl_ms":60000}"#).admin()
        .then(200).json("", json!({"policy": "sliding", "subject": "{s}", "limit": 7, "ttl_ms": 60000, "replaced": false})),
    override_cleared_the_policy_applies_again => post(quota("fixed"), r#"{"cost":2}"#)
        .given([put("/api/overrides/fixed/{s}", r#"{"limit":1}"#).admin().ok(200),
            delete("/api/overrides/fixed/{s}").admin().ok(200)])
        .then(200).json("/allowed", true).json("/limit", 3),
    override_clear_says_whether_one_was_set => delete("/api/overrides/fixed/{s}").admin().then(200)
        .json("", json!({"cleared": false})),
    override_needs_the_admin_token => put("/api/overrides/fixed/{s}", r#"{"limit":1000}"#).then(401),
    override_above_the_algorithms_bound_is_400 => put("/api/overrides/sliding/{s}", r#"{"limit":10001}"#).admin()
        .then(400).json("/field", "limit"),
    override_both_names_is_400 => put("/api/overrides/bucket/{s}", r#"{"limit":2,"capacity":2}"#).admin()
        .then(400).json("/field", "limit"),
    override_unknown_field_is_400 => put("/api/overrides/fixed/{s}", r#"{"limit":2,"ttl":5}"#).admin()
        .then(400).json("/field", "ttl").json("/error", M::Contains("(known: limit, ttl_ms)")),
    override_ttl_zero_is_400 => put("/api/overrides/fixed/{s}", r#"{"limit":2,"ttl_ms":0}"#).admin()
        .then(400).json("/field", "ttl_ms"),
    override_on_a_counter_policy_is_404 => put("/api/overrides/steps/{s}", r#"{"limit":2}"#).admin()
        .then(404).json("/field", "policy"),
    override_raises_a_semaphores_limit => sem("acquire", "h3")
        .given([put("/api/overrides/slots/{s}", r#"{"limit":3}"#).admin().ok(200),
            sem("acquire", "h1").ok(200), sem("acquire", "h2").ok(200)])
        .then(200).json("/result", "acquired").json("/limit", 3).json("/in_use", 3),
    override_lowers_a_semaphores_limit => sem("acquire", "h2")
        .given([put("/api/overrides/slots/{s}", r#"{"limit":1,"ttl_ms":60000}"#).admin().ok(200),
            sem("acquire", "h1").ok(200)])
        .then(200).json("/result", "full").json("/limit", 1),
    override_of_a_semaphore_is_bounded => put("/api/overrides/slots/{s}", r#"{"limit":1000001}"#).admin()
        .then(400).json("/field", "limit"),
    override_post_is_405 => post("/api/overrides/fixed/{s}", r#"{"limit":2}"#).then(405).header("allow", "PUT, DELETE"),
    quota_refund_gives_units_back => post("/api/quotas/fixed/{s}/refund", r#"{"cost":2}"#).admin()
        .given([take("fixed", 2), take("fixed", 1)]).then(200).json("", json!({"refunded": 2})),
    quota_refund_never_passes_the_limit => post("/api/quotas/gcra/{s}/refund", r#"{"cost":3}"#).admin()
        .given([take("gcra", 1)]).then(200).json("", json!({"refunded": 1})),
    quota_refund_of_unused_gives_nothing => post("/api/quotas/bucket/{s}/refund", "").admin().then(200)
        .json("", json!({"refunded": 0})),
    quota_refund_then_take_passes_again => post(quota("sliding"), r#"{"cost":2}"#)
        .given([take("sliding", 2), take("sliding", 1), post("/api/quotas/sliding/{s}/refund", r#"{"cost":2}"#).admin().ok(200)])
        .then(200).json("/allowed", true).json("/remaining", 0),
    quota_refund_needs_the_admin_token => post("/api/quotas/fixed/{s}/refund", r#"{"cost":1}"#).then(401),
    quota_refund_cost_above_the_limit_is_400 => post("/api/quotas/fixed/{s}/refund", r#"{"cost":4}"#).admin()
        .then(400).json("/field", "cost"),
    quota_refund_unknown_field_is_400 => post("/api/quotas/fixed/{s}/refund", r#"{"units":1}"#).admin()
        .then(400).json("/field", "units"),
    quota_refund_get_is_405 => get("/api/quotas/fixed/{s}/refund").then(405).header("allow", "POST"),
    quota_refund_on_a_semaphore_policy_is_404 => post("/api/quotas/slots/{s}/refund", "").admin().then(404)
        .json("/field", "policy"),

    // --- the standard RateLimit headers (draft-ietf-httpapi-ratelimit-headers) ---
    ratelimit_headers_on_a_take => post(quota("fixed"), r#"{"cost":2}"#).then(200)
        .header("ratelimit-policy", r#""fixed";q=3;w=1000000000"#)
        .header("ratelimit", contains(r#""fixed";r=1;t="#)),
    ratelimit_headers_on_a_peek_of_a_bucket => get(quota("bucket")).then(200)
        .header("ratelimit-policy", r#""bucket";q=3;w=10800"#)
        .header("ratelimit", r#""bucket";r=3;t=0"#),
    ratelimit_reset_on_a_denial_is_the_retry_after => post(quota("sliding"), "")
        .given([take("sliding", 2), take("sliding", 1)]).then(200).json("/allowed", false)
        .header("ratelimit", contains(r#""sliding";r=0;t="#))
        .check(|g: &Got| {
            let t = g.header("ratelimit").and_then(|v| v.rsplit_once("t=")).map(|(_, t)| t.to_string());
            assert_eq!(t.as_deref(), g.header("retry-after"), "t is the Retry-After on a denial");
        }),
    ratelimit_headers_on_a_claim => post("/api/claims/bonus/{s}", "").then(200)
        .header("ratelimit-policy", r#""bonus";q=1;w=3600"#)
        .header("ratelimit", r#""bonus";r=0;t=3600"#).header("retry-after", absent()),
    ratelimit_headers_on_a_semaphore => sem("acquire", "h1").then(200)
        .header("ratelimit-policy", r#""slots";q=2;qu="concurrent-requests""#)
        .header("ratelimit", r#""slots";r=1"#),
    ratelimit_headers_on_a_decision_name_each_part => decide(r#"[{"policy":"fixed"},{"policy":"slots","holder":"h1"}]"#)
        .then(200).json("/allowed", true)
        .header("ratelimit-policy", r#""fixed";q=3;w=1000000000, "slots";q=2;qu="concurrent-requests""#)
        .header("ratelimit", contains(r#", "slots";r=1"#)),
    ratelimit_headers_not_on_a_counter => post("/api/counters/steps/{s}", r#"{"delta":1}"#).then(200)
        .header("ratelimit", absent()).header("ratelimit-policy", absent()),

    // --- compound decisions ---
    decision_admits_and_consumes_every_part => decide(r#"[{"policy":"fixed","cost":2},{"policy":"sliding"},{"policy":"slots","holder":"h1"}]"#)
        .then(200).json("/allowed", true).json("/denied_by", Value::Null).json("/retry_after_ms", 0)
        .json("/parts", M::Len(3)).json("/parts/0/policy", "fixed").json("/parts/0/remaining", 1)
        .json("/parts/1/remaining", 2).json("/parts/2/result", "acquired").json("/parts/2/in_use", 1)
        .json("/parts/2/lease_ms", 600_000).header("retry-after", absent()),
    decision_denied_names_the_part_and_costs_nothing => decide(r#"[{"policy":"fixed"},{"policy":"sliding"}]"#)
        .given([take("sliding", 2), take("sliding", 1)])
        .then(200).json("/allowed", false).json("/denied_by", "sliding").json("/parts/0/allowed", true)
        .json("/parts/0/remaining", 3).json("/parts/1/allowed", false).json("/retry_after_ms", countdown(HOUR))
        .check(retry_after_is_ceil_seconds),
    decision_denied_left_the_other_quota_whole => post(quota("fixed"), "")
        .given([take("sliding", 2), take("sliding", 1), decide(r#"[{"policy":"fixed","cost":2},{"policy":"sliding"}]"#).ok(200)])
        .then(200).json("/allowed", true).json("/remaining", 2),
    decision_full_semaphore_denies_and_takes_no_quota => decide(r#"[{"policy":"fixed"},{"policy":"slots","holder":"h3"}]"#)
        .given([sem("acquire", "h1").ok(200), sem("acquire", "h2").ok(200)])
        .then(200).json("/allowed", false).json("/denied_by", "slots").json("/parts/1/result", "full")
        .json("/parts/1/fencing_token", Value::Null).json("/parts/0/remaining", 3)
        .json("/retry_after_ms", countdown(600_000)),
    decision_renews_a_held_lease => decide(r#"[{"policy":"slots","holder":"h1"}]"#)
        .given([sem("acquire", "h1").ok(200), sem("acquire", "h2").ok(200)])
        .then(200).json("/allowed", true).json("/parts/0/result", "renewed").json("/parts/0/in_use", 2),
    decision_lease_is_released_by_the_semaphore_route => sem("release", "h1")
        .given([decide(r#"[{"policy":"slots","holder":"h1"}]"#).ok(200)])
        .then(200).json("/result", "released"),
    decision_peek_writes_nothing => get(quota("fixed"))
        .given([post("/api/decisions/{s}", r#"{"parts":[{"policy":"fixed","cost":2}],"peek":true}"#).ok(200)])
        .then(200).json("/remaining", 3),
    decision_peek_with_a_key_stores_nothing => get(quota("fixed"))
        .given([post("/api/decisions/{s}", r#"{"parts":[{"policy":"fixed","cost":2}],"peek":true}"#).key("p-{s}").ok(200),
            post("/api/decisions/{s}", r#"{"parts":[{"policy":"fixed","cost":2}]}"#).key("p-{s}").ok(200)])
        .then(200).json("/remaining", 1),
    decision_peek_answers_as_a_take_would => post("/api/decisions/{s}", r#"{"parts":[{"policy":"fixed","cost":2}],"peek":true}"#)
        .then(200).json("/allowed", true).json("/peek", true).json("/parts/0/remaining", 3),
    decision_reads_the_subjects_override => decide(r#"[{"policy":"fixed","cost":2}]"#)
        .given([put("/api/overrides/fixed/{s}", r#"{"limit":1}"#).admin().ok(200)])
        .then(200).json("/allowed", false).json("/parts/0/limit", 1),
    decision_replay_consumes_nothing_again => decide(r#"[{"policy":"fixed","cost":2}]"#).key("d-{s}")
        .given([decide(r#"[{"policy":"fixed","cost":2}]"#).key("d-{s}").ok(200)])
        .then(200).json("/parts/0/remaining", 1).header("idempotent-replayed", "true"),
    decision_replay_after_the_lease_ended_says_so => decide(r#"[{"policy":"fixed"},{"policy":"slots","holder":"h1"}]"#).key("l-{s}")
        .given([decide(r#"[{"policy":"fixed"},{"policy":"slots","holder":"h1"}]"#).key("l-{s}").ok(200), sem("release", "h1").ok(200)])
        .then(200).json("/allowed", false).json("/denied_by", "slots").json("/parts/1/result", "ended")
        .json("/parts/1/fencing_token", Value::Null).json("/parts/1/in_use", 0).json("/parts/0/remaining", 2)
        .header("idempotent-replayed", "true"),
    decision_replay_while_the_lease_lives_keeps_its_token => decide(r#"[{"policy":"slots","holder":"h1"}]"#).key("k-{s}")
        .given([decide(r#"[{"policy":"slots","holder":"h1"}]"#).key("k-{s}").ok(200), sem("acquire", "h2").ok(200)])
        .then(200).json("/allowed", true).json("/parts/0/result", "acquired").json("/parts/0/in_use", 2)
        .header("idempotent-replayed", "true"),
    decision_key_reused_with_parts_reordered_is_422 => decide(r#"[{"policy":"sliding"},{"policy":"fixed"}]"#).key("r-{s}")
        .given([decide(r#"[{"policy":"fixed"},{"policy":"sliding"}]"#).key("r-{s}").ok(200)])
        .then(422).json("/field", "Idempotency-Key"),
    decision_denied_stores_no_reply => decide(r#"[{"policy":"fixed"}]"#).key("n-{s}")
        .given([take("sliding", 2), take("sliding", 1), decide(r#"[{"policy":"fixed"},{"policy":"sliding"}]"#).key("n-{s}").ok(200)])
        .then(200).json("/allowed", true).header("idempotent-replayed", absent()),
    decision_without_parts_is_400 => post("/api/decisions/{s}", "{}").then(400).json("/field", "parts"),
    decision_parts_not_a_list_is_400 => post("/api/decisions/{s}", r#"{"parts":{"policy":"fixed"}}"#).then(400)
        .json("/field", "parts"),
    decision_no_part_is_400 => decide("[]").then(400).json("/field", "parts"),
    decision_nine_parts_is_400 => decide(&format!("[{}]", [r#"{"policy":"fixed"}"#; 9].join(","))).then(400)
        .json("/field", "parts"),
    decision_same_policy_twice_is_400 => decide(r#"[{"policy":"fixed"},{"policy":"fixed"}]"#).then(400)
        .json("/field", "parts"),
    decision_part_not_an_object_is_400 => decide(r#"["fixed"]"#).then(400).json("/field", "parts[0].part"),
    decision_unknown_policy_is_404 => decide(r#"[{"policy":"fixed"},{"policy":"nope"}]"#).then(404)
        .json("/field", "parts[1].policy"),
    decision_counter_policy_is_400 => decide(r#"[{"policy":"steps"}]"#).then(400).json("/field", "parts[0].policy"),
    decision_part_unknown_field_is_400 => decide(r#"[{"policy":"fixed","holder":"h1"}]"#).then(400)
        .json("/field", "parts[0].holder"),
    decision_part_field_given_twice_is_400 => decide(r#"[{"policy":"fixed","policy":"slots","holder":"h1"}]"#)
        .then(400).json("/field", "body"),
    decision_lease_without_holder_is_400 => decide(r#"[{"policy":"slots"}]"#).then(400).json("/field", "parts[0].holder"),
    decision_lease_bad_holder_is_400 => decide(r#"[{"policy":"slots","holder":"a b"}]"#).then(400)
        .json("/field", "parts[0].holder"),
    decision_cost_zero_is_400 => decide(r#"[{"policy":"sliding"},{"policy":"fixed","cost":0}]"#).then(400)
        .json("/field", "parts[1].cost"),
    decision_cost_not_an_integer_is_400 => decide(r#"[{"policy":"fixed","cost":1.5}]"#).then(400)
        .json("/field", "parts[0].cost"),
    decision_public_cost_beyond_max_cost_is_403 => decide(r#"[{"policy":"fixed","cost":3}]"#).then(403)
        .json("/field", "parts[0].cost"),
    decision_admin_may_exceed_max_cost => decide(r#"[{"policy":"fixed","cost":3}]"#).admin().then(200)
        .json("/allowed", true).json("/parts/0/remaining", 0),
    decision_peek_not_a_boolean_is_400 => post("/api/decisions/{s}", r#"{"parts":[{"policy":"fixed"}],"peek":1}"#)
        .then(400).json("/field", "peek"),
    decision_unknown_field_is_400 => post("/api/decisions/{s}", r#"{"parts":[{"policy":"fixed"}],"cost":1}"#)
        .then(400).json("/field", "cost"),
    decision_bad_subject_is_400 => post("/api/decisions/a%20b", r#"{"parts":[{"policy":"fixed"}]}"#).then(400)
        .json("/field", "subject"),
    decision_get_is_405 => get("/api/decisions/{s}").then(405).header("allow", "POST"),

    // --- semaphores ---
    semaphore_acquire_grants_a_lease => sem("acquire", "h1").then(200).check(with_token(json!({
        "result": "acquired", "holding": true, "in_use": 1, "limit": 2, "earliest_end_ms": 600000, "lease_ms": 600000
    }))),
    semaphore_acquire_again_renews => sem("acquire", "h1").given([sem("acquire", "h1").ok(200)]).then(200)
        .json("/result", "renewed").json("/holding", true).json("/in_use", 1).json("/lease_ms", 600000),
    semaphore_full_refuses_one_more => sem("acquire", "h3")
        .given([sem("acquire", "h1").ok(200), sem("acquire", "h2").ok(200)]).then(200)
        .json("/result", "full").json("/holding", false).json("/in_use", 2).json("/limit", 2)
        .json("/lease_ms", 0).json("/earliest_end_ms", countdown(600000)),
    semaphore_renew_extends_the_lease => sem("renew", "h1").given([sem("acquire", "h1").ok(200)]).then(200)
        .check(with_token(json!({
            "result": "renewed", "holding": true, "in_use": 1, "limit": 2, "earliest_end_ms": 600000, "lease_ms": 600000
        }))),
    semaphore_renew_without_a_lease_is_not_holder => sem("renew", "h9").then(200).json("", json!({
        "result": "not_holder", "holding": false, "in_use": 0, "limit": 2, "earliest_end_ms": null, "lease_ms": 0,
        "fencing_token": null
    })),
    semaphore_release_frees_the_slot => sem("release", "h1").given([sem("acquire", "h1").ok(200)]).then(200)
        .check(with_token(json!({
            "result": "released", "holding": false, "in_use": 0, "limit": 2, "earliest_end_ms": null, "lease_ms": 0
        }))),
    semaphore_check_of_an_unissued_token_is_never_held => post("/api/semaphores/slots/{s}/check",
        r#"{"holder":"h1","fencing_token":9007199254740991}"#).given([sem("acquire", "h1").ok(200)]).then(200)
        .json("/result", "never_held").json("/holding", false).json("/fencing_token", Value::Null),
    semaphore_check_of_an_old_token_is_ended => post("/api/semaphores/slots/{s}/check",
        r#"{"holder":"h1","fencing_token":1}"#).given([sem("acquire", "h1").ok(200)]).then(200)
        .json("/result", "ended").json("/holding", false).json("/in_use", 1),
    semaphore_check_needs_the_token => post("/api/semaphores/slots/{s}/check", r#"{"holder":"h1"}"#).then(400)
        .json("/field", "fencing_token"),
    semaphore_check_token_zero_is_400 => post("/api/semaphores/slots/{s}/check",
        r#"{"holder":"h1","fencing_token":0}"#).then(400).json("/field", "fencing_token"),
    semaphore_acquire_takes_no_token => post("/api/semaphores/slots/{s}/acquire",
        r#"{"holder":"h1","fencing_token":5}"#).then(400).json("/field", "fencing_token"),
    semaphore_release_by_a_stranger_is_not_holder => sem("release", "h2").given([sem("acquire", "h1").ok(200)])
        .then(200).json("/result", "not_holder").json("/in_use", 1),
    semaphore_released_slot_goes_to_the_next => sem("acquire", "h3")
        .given([sem("acquire", "h1").ok(200), sem("acquire", "h2").ok(200), sem("release", "h1").ok(200)])
        .then(200).json("/result", "acquired").json("/in_use", 2),
    semaphore_unknown_action_is_404 => sem("steal", "h1").then(404),
    semaphore_holder_missing_is_400 => post("/api/semaphores/slots/{s}/acquire", "{}").then(400)
        .json("/field", "holder"),
    semaphore_holder_not_a_string_is_400 => post("/api/semaphores/slots/{s}/acquire", r#"{"holder":5}"#).then(400)
        .json("/field", "holder"),
    semaphore_holder_with_bad_characters_is_400 => sem("acquire", "a:b").then(400).json("/field", "holder"),
    semaphore_get_is_405 => get("/api/semaphores/slots/{s}/acquire").then(405).header("allow", "POST"),
    semaphore_on_a_counter_policy_is_404 => post("/api/semaphores/steps/{s}/acquire", r#"{"holder":"h1"}"#).then(404)
        .json("/field", "policy"),

    // --- inbox (admin only under POLICIES) ---
    inbox_append_stores_the_message => post("/api/inbox/{s}/messages", r#"{"id":1,"body":"hi"}"#).admin().then(201)
        .json("", json!({"stored": true, "length": 1})),
    inbox_append_of_a_known_id_is_not_stored => post("/api/inbox/{s}/messages", r#"{"id":1,"body":"other"}"#).admin()
        .given([append(1, "hi")]).then(200).json("", json!({"stored": false, "length": 1})),
    inbox_append_keeps_max_len => post("/api/inbox/{s}/messages", r#"{"id":4,"body":"d"}"#).admin()
        .given([append(1, "a"), append(2, "b"), append(3, "c")]).then(201)
        .json("", json!({"stored": true, "length": 3})),
    inbox_list_returns_messages_in_id_order => get("/api/inbox/{s}/messages").admin()
        .given([append(3, "c"), append(1, "a"), append(2, "b ✓")]).then(200)
        .json("/messages", len(3))
        .json("/messages/0/id", 1).json("/messages/0/body", "a")
        .json("/messages/1/id", 2).json("/messages/1/body", "b ✓")
        .json("/messages/2/id", 3).json("/messages/2/body", "c")
        .json("/messages/0/time", between(now_s() - 60, now_s() + 60)),
    inbox_list_pages_with_after_and_limit => get("/api/inbox/{s}/messages?after=1&limit=1").admin()
        .given([append(1, "a"), append(2, "b"), append(3, "c")]).then(200)
        .json("/messages", len(1)).json("/messages/0/id", 2).json("/messages/0/body", "b"),
    inbox_list_drops_the_oldest_past_max_len => get("/api/inbox/{s}/messages").admin()
        .given([append(1, "a"), append(2, "b"), append(3, "c"), append(4, "d")]).then(200)
        .json("/messages", len(3)).json("/messages/0/id", 2).json("/messages/2/id", 4),
    inbox_list_of_an_empty_inbox_is_empty => get("/api/inbox/{s}/messages").admin().then(200)
        .json("", json!({"messages": []})),
    inbox_trim_keeps_fresh_messages => post("/api/inbox/{s}/trim", "").admin()
        .given([append(1, "a")]).then(200)
        .json("/deleted", 0).json("/newest_time", between(now_s() - 60, now_s() + 60)),
    inbox_trim_drops_messages_older_than_max_age => post("/api/inbox/{s}/trim", "").admin()
        .given([append(1, "a"), append(2, "b"), Given::Sleep(Duration::from_millis(2100))]).then(200)
        .json("", json!({"deleted": 2, "newest_time": null})),
    inbox_after_trim_by_age_is_empty => get("/api/inbox/{s}/messages").admin()
        .given([append(1, "a"), Given::Sleep(Duration::from_millis(2100)), post("/api/inbox/{s}/trim", "")
        .admin().ok(200)])
        .then(200).json("/messages", len(0)),
    inbox_append_without_token_is_401 => post("/api/inbox/{s}/messages", r#"{"id":1,"body":"hi"}"#).then(401)
        .json("/field", absent()),
    inbox_list_without_token_is_401 => get("/api/inbox/{s}/messages").then(401),
    inbox_trim_without_token_is_401 => post("/api/inbox/{s}/trim", "").then(401),
    inbox_append_id_missing_is_400 => post("/api/inbox/{s}/messages", r#"{"body":"hi"}"#).admin().then(400)
        .json("/field", "id"),
    inbox_append_negative_id_is_400 => post("/api/inbox/{s}/messages", r#"{"id":-1,"body":"hi"}"#).admin().then(400)
        .json("/field", "id"),
    inbox_append_body_not_a_string_is_400 => post("/api/inbox/{s}/messages", r#"{"id":1,"body":5}"#).admin().then(400)
        .json("/field", "body").json("/error", contains("string")),
    inbox_list_limit_zero_is_400 => get("/api/inbox/{s}/messages?limit=0").admin().then(400).json("/field", "limit"),
    inbox_trim_with_a_body_field_is_400 => post("/api/inbox/{s}/trim", r#"{"max_age_s":1}"#).admin().then(400)
        .json("/field", "max_age_s"),
    inbox_unknown_route_is_404 => get("/api/inbox/{s}/other").admin().then(404),
    inbox_messages_delete_is_405 => delete("/api/inbox/{s}/messages").admin().then(405)
        .header("allow", "GET, HEAD, POST"),
    inbox_public_policy_needs_no_token => post("/api/inbox/{s}/messages", r#"{"id":7,"body":"hi"}"#).on(On::PublicInbox)
        .then(201).json("", json!({"stored": true, "length": 1})),

    // --- red packets ---
    packet_create_is_201_with_its_id => post("/api/redpackets", r#"{"total_cents":1000,"count":3}"#).then(201)
        .json("/policy", "packets").json("/total_cents", 1000).json("/count", 3)
        .json("/expires_at_ms", between(now_ms() + HOUR - SLACK, now_ms() + HOUR + SLACK))
        .check(is_packet_id),
    packet_create_beyond_public_total_is_403 => post("/api/redpackets", r#"{"total_cents":5001,"count":3}"#).then(403)
        .json("/field", "total_cents"),
    packet_create_beyond_public_count_is_403 => post("/api/redpackets", r#"{"total_cents":1000,"count":11}"#).then(403)
        .json("/field", "count"),
    packet_create_with_another_min_cents_is_403 =>
        post("/api/redpackets", r#"{"total_cents":1000,"count":3,"min_cents":2}"#)
        .then(403).json("/field", "min_cents"),
    packet_admin_may_exceed_public_limits => post("/api/redpackets", r#"{"total_cents":100000,"count":20}"#).admin()
        .then(201).json("/total_cents", 100000).json("/count", 20),
    packet_create_total_below_count_is_400 => post("/api/redpackets", r#"{"total_cents":2,"count":3}"#).then(400)
        .json("/field", "total_cents"),
    packet_create_total_missing_is_400 => post("/api/redpackets", r#"{"count":3}"#).then(400)
        .json("/field", "total_cents"),
    packet_create_total_of_wrong_type_is_400 => post("/api/redpackets", r#"{"total_cents":[1000],"count":3}"#).then(400)
        .json("/field", "total_cents"),
    packet_create_unknown_policy_is_404 => post("/api/redpackets", r#"{"policy":"nope","total_cents":100,"count":1}"#)
        .then(404).json("/field", "policy"),
    packet_create_with_another_kinds_policy_is_404 =>
        post("/api/redpackets", r#"{"policy":"bonus","total_cents":100,"count":1}"#)
        .then(404).json("/field", "policy"),
    packet_create_get_is_405 => get("/api/redpackets").then(405).header("allow", "POST"),
    packet_grab_wins_the_only_share => post("/api/redpackets/{id}/grab", r#"{"user":"alice"}"#)
        .given([create(700, 1)]).then(200)
        .json("", json!({"outcome": "won", "amount_cents": 700, "amount": 700, "index": 1, "remaining": 0})),
    packet_grab_again_is_the_same_claim => post("/api/redpackets/{id}/grab", r#"{"user":"alice"}"#)
        .given([create(700, 1), grab("alice")]).then(200)
        .json("", json!({"outcome": "already", "amount_cents": 700, "amount": 700, "index": 1})),
    packet_grab_when_empty => post("/api/redpackets/{id}/grab", r#"{"user":"bob"}"#)
        .given([create(700, 1), grab("alice")]).then(200)
        .json("", json!({"outcome": "empty", "remaining": 0})),
    packet_grab_second_share_has_index_two => post("/api/redpackets/{id}/grab", r#"{"user":"bob"}"#)
        .given([create(1000, 2), grab("alice")]).then(200)
        .json("/outcome", "won").json("/index", 2).json("/remaining", 0).json("/amount_cents", between(1, 999))
        .check(|g| assert_eq!(g.json["amount"], g.json["amount_cents"])),
    packet_grab_unknown_is_404 => post(format!("/api/redpackets/{UNKNOWN_PACKET}/grab"), r#"{"user":"alice"}"#)
        .then(404)
        .json("/field", "id"),
    packet_grab_user_missing_is_400 => post("/api/redpackets/{id}/grab", "{}").given([create(700, 1)]).then(400)
        .json("/field", "user"),
    packet_grab_bad_id_is_400 => post("/api/redpackets/a:b/grab", r#"{"user":"alice"}"#).then(400).json("/field", "id"),
    packet_grab_get_is_405 => get("/api/redpackets/{id}/grab").given([create(700, 1)]).then(405)
        .header("allow", "POST"),
    packet_status_reports_counts => get("/api/redpackets/{id}")
        .given([create(1000, 3), grab("u1")]).then(200)
        .json("/id", "{id}").json("/total_cents", 1000).json("/count", 3).json("/remaining", 2).json("/claimed", 1)
        .json("/claimed_cents", between(1, 998))
        .check(|g| assert_eq!(g.int("/expires_ms") - g.int("/created_ms"), HOUR, "a packet lives its policy's ttl")),
    packet_status_after_every_grab_sums_to_the_total => get("/api/redpackets/{id}")
        .given([create(1000, 3), grab("u1"), grab("u2"), grab("u3")]).then(200)
        .json("/remaining", 0).json("/claimed", 3).json("/claimed_cents", 1000),
    packet_status_unknown_is_404 => get(format!("/api/redpackets/{UNKNOWN_PACKET}")).then(404).json("/field", "id"),
    packet_status_post_is_405 => post("/api/redpackets/{id}", "").given([create(700, 1)]).then(405)
        .header("allow", "GET, HEAD"),
    packet_claims_lists_each_claim => get("/api/redpackets/{id}/claims")
        .given([create(700, 1), grab("alice")]).then(200)
        .json("/claims", len(1)).json("/claims/0/user", "alice").json("/claims/0/amount_cents", 700)
        .json("/claims/0/amount", 700).json("/claims/0/index", 1)
        .json("/claims/0/at_ms", between(now_ms() - SLACK, now_ms() + SLACK)),
    packet_claims_pages_with_offset_and_limit => get("/api/redpackets/{id}/claims?offset=1&limit=1")
        .given([create(1000, 3), grab("u1"), grab("u2"), grab("u3")]).then(200)
        .json("/claims", len(1)).json("/claims/0/user", "u2").json("/claims/0/index", 2),
    packet_claims_limit_zero_is_400 => get("/api/redpackets/{id}/claims?limit=0").given([create(700, 1)]).then(400)
        .json("/field", "limit"),

    // --- the admin token ---
    wrong_admin_token_is_401_on_public_routes_too => get("/api/policies")
        .header("authorization", "Bearer not-the-admin-token-000").then(401).json("/field", absent()),
    authorization_of_another_scheme_is_401 => get("/api/policies").header("authorization", format!("Basic {ADMIN}"))
        .then(401),
    empty_bearer_token_is_401 => get("/api/policies").header("authorization", "Bearer ").then(401),
    admin_token_works_on_public_routes => get("/api/counters/steps/{s}").admin().then(200)
        .json("", json!({"value": 0})),
    admin_routes_refuse_when_no_admin_token_is_configured => delete("/api/quotas/fixed/{s}").admin()
        .on(On::NoAdminToken).then(401),
    // Auth schemes are case-insensitive (RFC 9110 11.1).
    admin_bearer_scheme_is_case_insensitive => get("/api/policies").header("authorization", format!("bearer {ADMIN}"))
        .then(200),

    // --- idempotency ---
    idempotent_first_request_is_not_marked => post("/api/counters/steps/{s}", r#"{"delta":2}"#).key("k-{s}").then(200)
        .json("/value", 2).header("idempotent-replayed", absent()),
    idempotent_replay_answers_the_first_response => post("/api/counters/steps/{s}", r#"{"delta":2}"#).key("k-{s}")
        .given([post("/api/counters/steps/{s}", r#"{"delta":2}"#).key("k-{s}").ok(200)]).then(200)
        .json("", json!({"value": 2, "applied": 2, "status": "applied"})).header("idempotent-replayed", "true"),
    idempotent_replay_applies_once => get("/api/counters/steps/{s}")
        .given([
            post("/api/counters/steps/{s}", r#"{"delta":2}"#).key("k-{s}").ok(200),
            post("/api/counters/steps/{s}", r#"{"delta":2}"#).key("k-{s}").ok(200),
        ])
        .then(200).json("", json!({"value": 2})),
    idempotent_respaced_body_is_a_replay => post("/api/counters/steps/{s}", r#"{ "delta" : 2 }"#).key("k-{s}")
        .given([post("/api/counters/steps/{s}", r#"{"delta":2}"#).key("k-{s}").ok(200)]).then(200)
        .json("/value", 2).header("idempotent-replayed", "true"),
    idempotent_key_with_another_body_is_422 => post("/api/counters/steps/{s}", r#"{"delta":3}"#).key("k-{s}")
        .given([post("/api/counters/steps/{s}", r#"{"delta":2}"#).key("k-{s}").ok(200)]).then(422)
        .json("/field", "Idempotency-Key"),
    idempotent_key_on_another_path_is_a_new_request => post("/api/counters/steps/{s}-b", r#"{"delta":2}"#).key("k-{s}")
        .given([post("/api/counters/steps/{s}-a", r#"{"delta":2}"#).key("k-{s}").ok(200)]).then(200)
        .json("/value", 2).header("idempotent-replayed", absent()),
    idempotent_percent_encoded_path_is_the_same_route => post("/api/%63ounters/steps/{s}", r#"{"delta":2}"#)
        .key("k-{s}")
        .given([post("/api/counters/steps/{s}", r#"{"delta":2}"#).key("k-{s}").ok(200)]).then(200)
        .json("/value", 2).header("idempotent-replayed", "true"),
    idempotency_key_not_ascii_is_400 => post("/api/counters/steps/{s}", r#"{"delta":1}"#)
        .header("idempotency-key", vec![b'k', 0xe9, b'y']).then(400).json("/field", "Idempotency-Key"),
    idempotency_key_empty_is_400 => post("/api/counters/steps/{s}", r#"{"delta":1}"#).key("").then(400)
        .json("/field", "Idempotency-Key"),
    idempotency_key_of_256_characters_is_400 => post("/api/counters/steps/{s}", r#"{"delta":1}"#).key(&"k".repeat(256))
        .then(400).json("/field", "Idempotency-Key"),
    idempotency_key_of_255_characters_is_accepted => post("/api/counters/steps/{s}", r#"{"delta":1}"#)
        .key(&"k".repeat(255))
        .then(200).json("/value", 1),
    idempotent_claim_replay_answers_claimed => post("/api/claims/bonus/{s}", "").key("k-{s}")
        .given([post("/api/claims/bonus/{s}", "").key("k-{s}").ok(200)]).then(200)
        .json("", json!({"claimed": true, "retry_after_ms": HOUR})).header("idempotent-replayed", "true"),
    idempotent_claim_empty_and_empty_object_are_one_request => post("/api/claims/bonus/{s}", "{}").key("k-{s}")
        .given([post("/api/claims/bonus/{s}", "").key("k-{s}").ok(200)]).then(200)
        .json("/claimed", true).header("idempotent-replayed", "true"),
    idempotent_quota_take_consumes_once => get("/api/quotas/fixed/{s}")
        .given([
            post("/api/quotas/fixed/{s}", r#"{"cost":2}"#).key("k-{s}").ok(200),
            post("/api/quotas/fixed/{s}", r#"{"cost":2}"#).key("k-{s}").ok(200),
        ])
        .then(200).json("/remaining", 3 - 2),
    idempotent_quota_reset_replays => delete("/api/quotas/fixed/{s}").admin().key("k-{s}")
        .given([take("fixed", 1), delete("/api/quotas/fixed/{s}").admin().key("k-{s}").ok(200)]).then(200)
        .json("", json!({"reset": true})).header("idempotent-replayed", "true"),
    idempotent_acquire_replay_while_held_tells_the_lease_left => sem("acquire", "h1").key("k-{s}")
        .given([sem("acquire", "h1").key("k-{s}").ok(200)]).then(200)
        .json("/result", "acquired").json("/in_use", 1).json("/lease_ms", countdown(600000))
        .header("idempotent-replayed", "true"),
    idempotent_acquire_replay_after_release_is_not_holder => sem("acquire", "h1").key("k-{s}")
        .given([sem("acquire", "h1").key("k-{s}").ok(200), sem("release", "h1").ok(200)]).then(200)
        .json("/result", "not_holder").json("/holding", false).json("/in_use", 0).json("/lease_ms", 0)
        .header("idempotent-replayed", "true"),
    // The holder's later lease is another grant (another fencing token), not the replayed one's.
    idempotent_acquire_replay_after_a_new_lease_is_not_holder => sem("acquire", "h1").key("k-{s}")
        .given([sem("acquire", "h1").key("k-{s}").ok(200), sem("release", "h1").ok(200), sem("acquire", "h1").ok(200)])
        .then(200).json("/result", "not_holder").json("/holding", false).json("/in_use", 1).json("/lease_ms", 0)
        .json("/fencing_token", Value::Null).header("idempotent-replayed", "true"),
    idempotent_renew_replay_after_a_new_lease_is_not_holder => sem("renew", "h1").key("r-{s}")
        .given([sem("acquire", "h1").ok(200), sem("renew", "h1").key("r-{s}").ok(200), sem("release", "h1").ok(200),
            sem("acquire", "h1").ok(200)])
        .then(200).json("/result", "not_holder").json("/holding", false).json("/in_use", 1)
        .header("idempotent-replayed", "true"),
    idempotent_inbox_append_replays => post("/api/inbox/{s}/messages", r#"{"id":1,"body":"hi"}"#).admin().key("k-{s}")
        .given([post("/api/inbox/{s}/messages", r#"{"id":1,"body":"hi"}"#).admin().key("k-{s}").ok(201)]).then(201)
        .json("", json!({"stored": true, "length": 1})).header("idempotent-replayed", "true"),
    // (`mail` keeps messages 1 s: stamps are whole seconds, so after 2.1 s this one is older.)
    idempotent_inbox_trim_replays => post("/api/inbox/{s}/trim", "").admin().key("k-{s}")
        .given([append(1, "a"), Given::Sleep(Duration::from_millis(2_100)),
            post("/api/inbox/{s}/trim", "").admin().key("k-{s}").ok(200), append(2, "b")]).then(200)
        .json("/deleted", 1).header("idempotent-replayed", "true"),
    idempotent_inbox_trim_of_nothing_is_a_new_call => post("/api/inbox/{s}/trim", "").admin().key("k-{s}")
        .given([append(1, "a"), post("/api/inbox/{s}/trim", "").admin().key("k-{s}").ok(200)]).then(200)
        .json("/deleted", 0).header("idempotent-replayed", absent()),
    idempotent_packet_create_replay_has_the_same_id => post("/api/redpackets", r#"{"total_cents":900,"count":3}"#)
        .key("k-{s}")
        .given([post("/api/redpackets", r#"{"total_cents":900,"count":3}"#).key("k-{s}").ok(201)]).then(201)
        .json("/id", "{id}").json("/total_cents", 900).json("/count", 3).header("idempotent-replayed", "true"),
    idempotent_packet_create_with_another_body_is_422 => post("/api/redpackets", r#"{"total_cents":901,"count":3}"#)
        .key("k-{s}")
        .given([post("/api/redpackets", r#"{"total_cents":900,"count":3}"#).key("k-{s}").ok(201)]).then(422)
        .json("/field", "Idempotency-Key"),

    // --- CORS ---
    cors_preflight_from_an_allowed_origin => req("OPTIONS", "/api/counters/steps/{s}").origin(ORIGIN).then(204)
        .header("access-control-allow-origin", ORIGIN)
        .header("access-control-allow-methods", "GET, POST, PUT, DELETE, OPTIONS")
        .header("access-control-allow-headers", "Content-Type, Authorization, Idempotency-Key")
        .header("access-control-max-age", "600")
        .header("vary", "Origin")
        .raw(""),
    // A 204 has no body, so no Content-Type (axum adds text/plain to an empty String body).
    cors_preflight_has_no_content_type => req("OPTIONS", "/api/counters/steps/{s}").origin(ORIGIN).then(204)
        .header("content-type", absent()),
    cors_preflight_from_another_origin_grants_nothing => req("OPTIONS", "/api/counters/steps/{s}").origin(EVIL)
        .then(204)
        .header("access-control-allow-origin", absent())
        .header("access-control-allow-methods", absent())
        .header("access-control-allow-headers", absent())
        .raw(""),
    cors_allowed_origin_may_read_the_answer => get("/api/policies").origin(ORIGIN).then(200)
        .header("access-control-allow-origin", ORIGIN)
        .header("access-control-expose-headers", "Idempotent-Replayed, Retry-After, RateLimit-Policy, RateLimit")
        .header("vary", "Origin"),
    cors_another_origin_gets_no_allow_origin => get("/api/policies").origin(EVIL).then(200)
        .header("access-control-allow-origin", absent()),
    cors_headers_on_answers_from_redis => post("/api/quotas/fixed/{s}", r#"{"cost":1}"#).origin(ORIGIN)
        .given([take("fixed", 2), take("fixed", 1)]).then(200)
        .json("/allowed", false).header("access-control-allow-origin", ORIGIN)
        .header("retry-after", between(1, EPOCHAL / 1000)),
    cors_headers_on_errors_too => get("/api/nothing-here").origin(ORIGIN).then(404)
        .header("access-control-allow-origin", ORIGIN),

    // --- routing errors ---
    unknown_api_route_is_404_json => get("/api/nothing-here").then(404).json("/field", absent()),
    api_root_is_404 => get("/api/").then(404),
    empty_path_segment_is_404 => get("/api/counters//x").then(404),
    malformed_percent_encoding_is_400 => get("/api/counters/steps/%zz").then(400).json("/field", "path"),
    overlong_path_segment_is_400 => get(format!("/api/counters/steps/{}", "x".repeat(800))).then(400)
        .json("/field", "path"),
    percent_encoded_route_is_the_same_route => post("/api/%63ounters/steps/{s}", r#"{"delta":1}"#).then(200)
        .json("/value", 1),
    every_api_answer_is_no_store_json => get("/api/counters/steps/{s}").then(200)
        .header("cache-control", "no-store").header("content-type", "application/json"),

    // --- bodies ---
    body_not_json_is_400 => post("/api/counters/steps/{s}", r#"{"delta":1"#).then(400).json("/field", "body"),
    body_not_an_object_is_400 => post("/api/counters/steps/{s}", "[1]").then(400).json("/field", "body"),
    body_with_a_repeated_field_is_400 => post("/api/counters/steps/{s}", r#"{"delta":1,"delta":5}"#).then(400)
        .json("/field", "body").json("/error", contains("more than once")),
    body_with_an_unknown_field_is_400_naming_it => post("/api/counters/steps/{s}", r#"{"delta":1,"x":2}"#).then(400)
        .json("/field", "x"),
    body_over_16_kib_is_413 => post("/api/counters/steps/{s}", padded_delta(16 * 1024 + 1)).then(413)
        .json("/error", "body larger than 16384 bytes").json("/field", absent()),
    body_over_16_kib_is_413_readable_by_an_allowed_origin => post("/api/counters/steps/{s}", padded_delta(16 * 1024 + 1))
        .origin(ORIGIN).then(413).header("access-control-allow-origin", ORIGIN),
    body_declared_over_16_kib_is_413_before_it_is_read => post("/api/counters/steps/{s}", "").never_ending()
        .header("content-length", "99999999").then(413).json("/error", "body larger than 16384 bytes"),
    body_that_never_arrives_is_408_readable_by_an_allowed_origin => post("/api/counters/steps/{s}", "").never_ending()
        .origin(ORIGIN).body_timeout(Duration::from_millis(300)).then(408)
        .header("access-control-allow-origin", ORIGIN),
    two_idempotency_keys_are_refused => post("/api/counters/steps/{s}", r#"{"delta":1}"#).key("k1-{s}").key("k2-{s}")
        .then(400).json("/field", "Idempotency-Key"),
    body_of_exactly_16_kib_is_served => post("/api/counters/steps/{s}", padded_delta(16 * 1024)).then(200)
        .json("/value", 1),
    body_that_never_arrives_is_408 => post("/api/counters/steps/{s}", "").never_ending()
        .body_timeout(Duration::from_millis(300)).then(408)
        .json("", json!({"error": "the request body did not arrive within 300 ms"})),

    // --- static files from `www` ---
    static_root_serves_index_html => get("/").then(200).raw(INDEX).header("content-type", "text/html; charset=utf-8"),
    static_script_has_its_type => get("/app.js").then(200).raw(APP_JS)
        .header("content-type", "text/javascript; charset=utf-8"),
    static_style_sheet_has_its_type => get("/style.css").then(200).raw(STYLE)
        .header("content-type", "text/css; charset=utf-8"),
    static_nested_file_is_served => get("/sub/page.html").then(200).raw(PAGE),
    static_head_is_200 => req("HEAD", "/index.html").then(200),
    static_missing_file_is_404_json => get("/missing.html").then(404)
        .json("", json!({"error": "no such file (the API is under /api/)"})).header("content-type", "application/json"),
    static_directory_is_404 => get("/sub").then(404),
    static_parent_traversal_is_refused => get("/../secret.txt").then(404).lacks("top secret"),
    static_nested_parent_traversal_is_refused => get("/sub/../../secret.txt").then(404).lacks("top secret"),
    static_encoded_parent_traversal_is_refused => get("/%2e%2e/secret.txt").then(404).lacks("top secret"),
    static_absolute_path_stays_inside_www => get("//etc/passwd").then(404).lacks("root:"),
    static_post_is_405 => post("/index.html", "").then(405).header("allow", "GET, HEAD")
        .header("cache-control", "no-store").header("content-type", "application/json"),
    static_post_to_a_mistyped_api_path_is_405_naming_the_api => post("/API/counters/c/x", "{}").then(405)
        .json("/error", contains("/api/")).header("content-type", "application/json"),
}

/// The README's tour, line by line: each `curl` of its first `sh` block after "## A five-minute
/// tour", sent to the router with the policies of wrangler.toml (what `cargo xtask dev`
/// serves), answers what the line's comment shows (`…` stands for fields not shown).
#[tokio::test]
async fn the_readme_tour_answers_as_written() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let wrangler = std::fs::read_to_string(root.join("wrangler.toml")).unwrap();
    let policies = wrangler.split("REDCOUNT_POLICIES = '''").nth(1).and_then(|p| p.split("'''").next()).unwrap();
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let tour = readme.split_once("## A five-minute tour").expect("README: a tour").1;
    let block = tour.split_once("```sh\n").unwrap().1.split_once("```").unwrap().0;
    let var = |name: &str| match name {
        "REDCOUNT_POLICIES" => Some(policies.to_string()),
        "REDCOUNT_NAMESPACE" => Some("readme-tour".to_string()),
        _ => None,
    };
    let config = redcount_api::Config::from_env(var).expect("wrangler.toml's policies are valid");
    let redis = shared_redis();
    let www = Www::new();
    let app = app(config, Backend::Direct(direct(&redis).await), www.dir(), Duration::from_secs(5));
    let ctx = Ctx { s: String::new(), id: None };
    let mut lines = 0;
    for line in block.lines() {
        let (command, shown) = line.split_once(" # ").expect("each line shows its answer");
        let words: Vec<&str> = command.split_whitespace().collect();
        assert_eq!(words[0], "curl", "{line}");
        let method = words.iter().position(|w| *w == "-X").map_or("GET", |i| words[i + 1]);
        let body = words.iter().position(|w| *w == "-d").map_or("", |i| words[i + 1].trim_matches('\''));
        let url = words.last().unwrap();
        let path = url.strip_prefix("http://127.0.0.1:8787").expect("the tour talks to cargo xtask dev");
        let method: &'static str = match method {
            "POST" => "POST",
            "GET" => "GET",
            other => panic!("{line}: method {other}"),
        };
        let got = send(&app, &ctx, &req(method, path).body(body)).await;
        assert_eq!(got.status, 200, "{line}: {}", got.text());
        let want: Value = serde_json::from_str(&shown.trim().replace(",…}", "}")).expect("the shown answer is JSON");
        for (field, value) in want.as_object().unwrap() {
            assert_eq!(&got.json[field], value, "{line}: {field}; got {}", got.text());
        }
        lines += 1;
    }
    assert!(lines >= 3, "the tour has {lines} lines");
}
