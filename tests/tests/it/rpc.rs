//! A Worker of one's own (examples/caller-worker, with the `npm pack`ed @redcount/client)
//! calling the redcount worker through Service bindings, both under one workerd, before a real
//! REST front and Redis: every method over the binding, typed errors, the Hono middleware,
//! `ctx.props` scoping (checked on Redis's keys), admin rights only where props give them,
//! props on a binding to the default entrypoint read alike, oversized calls and bodies refused
//! with the isolate's memory flat, a storm that stays exact, cancelled calls that leave
//! nothing parked, and the declared failure mode with the front stopped. And the client's own tests (packages/client/test,
//! `node --test`) over HTTP against `redcount serve`.

use std::path::Path;
use std::time::{Duration, Instant};

use redcount_procs::workerd::{self, Binding, Worker};
use redcount_procs::{Proc, free_port, scratch_dir, wait_port};
use redcount_tests::{Api, NativeServer, RedisServer, Reply, RestFront, TEST_POLICIES, root, secret};
use serde_json::{Value, json};

/// The test suite's policies, and two of one take a day: `one-a-day` with the default
/// `cache_denials_ms`, `uncached` with 0 (its denials never repeated from memory).
fn policies() -> String {
    TEST_POLICIES.replacen(
        '{',
        r#"{
  "one-a-day": { "kind": "quota", "algorithm": "fixed", "limit": 1, "window_ms": 86400000 },
  "uncached": { "kind": "quota", "algorithm": "fixed", "limit": 1, "window_ms": 86400000, "cache_denials_ms": 0 },"#,
        1,
    )
}

/// The bindings the caller gets: name and props (all to the `Redcount` entrypoint).
const BINDINGS: &[(&str, Option<&str>)] = &[
    ("REDCOUNT", None),
    ("REDCOUNT_ADMIN", Some(r#"{"admin":true}"#)),
    ("ACME", Some(r#"{"namespace":"acme"}"#)),
    ("ACME_ADMIN", Some(r#"{"namespace":"acme","admin":true}"#)),
    ("GLOBEX", Some(r#"{"namespace":"globex"}"#)),
    ("WRONG_ADMIN", Some(r#"{"admin":"yes"}"#)),
    ("WRONG_PROP", Some(r#"{"namespace":"acme","role":"admin"}"#)),
];

/// The bindings to the default entrypoint (its `fetch`: HTTP requests), with their props.
const HTTP_BINDINGS: &[(&str, Option<&str>)] = &[
    ("REDCOUNT_HTTP", None),
    ("HTTP_ACME", Some(r#"{"namespace":"acme"}"#)),
    ("HTTP_ADMIN", Some(r#"{"admin":true}"#)),
    ("HTTP_WRONG", Some(r#"{"namespace":"acme","role":"admin"}"#)),
];

/// Redis, a REST front, and under one workerd the redcount worker (with `policies`) and a
/// worker of one's own (the module `main`, bundled from its own directory so that its imports
/// resolve as a user's would, `vars` as text bindings, `bindings` to the redcount worker or
/// itself), that one on a port: what the tests of one's own Workers start.
pub(crate) struct Stack {
    pub(crate) redis: RedisServer,
    pub(crate) front: RestFront,
    pub(crate) workerd: Proc,
    pub(crate) log: std::path::PathBuf,
    pub(crate) api: Api,
}

fn write(dir: &Path, toml: &str, dev_vars: &str) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("wrangler.toml"), toml).unwrap();
    std::fs::write(dir.join(".dev.vars"), dev_vars).unwrap();
}

pub(crate) fn own_worker(
    tag: &str,
    policies: &str,
    main: &Path,
    vars: &[(&str, String)],
    bindings: Vec<Binding>,
) -> Stack {
    let root = root();
    let worker = root.join("crates/redcount-worker/build/index.js");
    let example = main.ancestors().find(|d| d.join("package.json").exists()).expect("the example's directory");
    let client = example.join("node_modules/@redcount/client/dist/index.js");
    for (p, what) in [(&worker, "the worker"), (&client, "the packed client")] {
        assert!(
            p.exists(),
            "{} is missing ({what}): run `cargo xtask test` (or build-worker, build-client)",
            p.display()
        );
    }
    let redis = RedisServer::start();
    let front = RestFront::start(&redis.url(), false);
    let dir = scratch_dir(tag);
    // The one compatibility date, wrangler.toml's.
    let wrangler = std::fs::read_to_string(root.join("wrangler.toml")).unwrap();
    let date = wrangler.lines().find(|l| l.starts_with("compatibility_date")).expect("a compatibility_date");
    write(
        &dir.join("redcount"),
        &format!(
            "name = \"redcount\"\nmain = \"{}\"\n{date}\n[assets]\ndirectory = \"{}\"\nbinding = \"ASSETS\"\n[vars]\nREDCOUNT_POLICIES = '''\n{policies}\n'''\n",
            worker.display(),
            root.join("www").display()
        ),
        &format!(
            "REDCOUNT_REST_URL={}\nREDCOUNT_REST_TOKEN={}\nREDCOUNT_ADMIN_TOKEN={}\n",
            front.url(),
            front.token,
            secret("admin")
        ),
    );
    // Its compatibility flags, as its own wrangler.toml says.
    let own = std::fs::read_to_string(example.join("wrangler.toml")).unwrap_or_default();
    let flags = own.lines().find(|l| l.starts_with("compatibility_flags")).unwrap_or_default();
    write(&dir.join("caller"), &format!("name = \"caller\"\nmain = \"{}\"\n{date}\n{flags}\n", main.display()), "");
    let redcount = Worker::from_dir(&root, &dir.join("redcount"), &dir.join("redcount/bundle")).unwrap();
    let mut caller = Worker::from_dir(&root, &dir.join("caller"), &dir.join("caller/bundle")).unwrap();
    // What @redcount/client/engine reads in the caller, as the redcount worker does.
    let engine = [
        ("REDCOUNT_POLICIES", policies.to_string()),
        ("REDCOUNT_REST_URL", front.url()),
        ("REDCOUNT_REST_TOKEN", front.token.clone()),
    ];
    caller.bindings.extend(engine.into_iter().map(|(k, v)| Binding::Text(k.to_string(), v)));
    caller.bindings.extend(vars.iter().map(|(k, v)| Binding::Text(k.to_string(), v.clone())));
    caller.bindings.extend(bindings);
    let port = free_port();
    let config = workerd::write(&dir.join("config"), &[(&caller, Some(port)), (&redcount, None)]).unwrap();
    let log = dir.join("workerd.log");
    let mut workerd = Proc::spawn("workerd", &mut workerd::command(&root, &config, Some(&log)).unwrap()).unwrap();
    if let Err(e) = wait_port(port, Duration::from_secs(60), &mut workerd) {
        panic!("{e}\n{}", std::fs::read_to_string(&log).unwrap_or_default());
    }
    Stack { redis, front, workerd, log, api: Api::new(format!("http://127.0.0.1:{port}"), "") }
}

/// examples/caller-worker with the routes the test drives (test/harness.ts).
fn stack() -> Stack {
    let mut bindings: Vec<Binding> =
        BINDINGS.iter().map(|(name, props)| Binding::service(name, "redcount", Some("Redcount"), *props)).collect();
    bindings.extend(HTTP_BINDINGS.iter().map(|(name, props)| Binding::service(name, "redcount", None, *props)));
    bindings.push(Binding::service("SELF", "caller", None, None));
    own_worker("rpc", &policies(), &root().join("examples/caller-worker/test/harness.ts"), &[], bindings)
}

impl Stack {
    /// `method(...args)` through the binding `binding`: `Ok(value)` or `Err(the RedcountError's
    /// {status, message, field})`.
    async fn call(&self, binding: &str, method: &str, args: Value) -> Result<Value, Value> {
        let r = self.api.post(&format!("/test/call/{binding}/{method}"), &args.to_string()).await;
        assert_eq!(r.status, 200, "{binding}.{method}({args}): {}\n{}", r.json, self.log());
        match (r.json.get("value"), r.json.get("error")) {
            (Some(v), None) => Ok(v.clone()),
            (None, Some(e)) => Err(e.clone()),
            _ => panic!("{binding}.{method}({args}): not a value nor a RedcountError: {}", r.json),
        }
    }

    /// `method(...args)` through `binding` wrapped to count the calls that cross it (the
    /// client's denial cache in front, made per request): the answer, and the calls so far.
    async fn counted(&self, binding: &str, method: &str, args: &Value) -> (Result<Value, Value>, u64) {
        let r = self.api.post(&format!("/test/counted/{binding}/{method}"), &args.to_string()).await;
        assert_eq!(r.status, 200, "{binding}.{method}({args}): {}\n{}", r.json, self.log());
        let crossed = r.json["crossed"].as_u64().unwrap_or(0);
        match (r.json.get("value"), r.json.get("error")) {
            (Some(v), None) => (Ok(v.clone()), crossed),
            (None, Some(e)) => (Err(e.clone()), crossed),
            _ => panic!("{binding}.{method}({args}): not a value nor a RedcountError: {}", r.json),
        }
    }

    /// Script calls Redis has run (EVALSHA and EVAL round trips).
    fn script_calls(&self) -> u64 {
        self.redis.calls("evalsha") + self.redis.calls("eval")
    }

    fn keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut self.redis.conn()).unwrap();
        keys.sort();
        keys
    }

    /// The keys that `f` made (present after it, not before).
    async fn new_keys<F: std::future::Future<Output = ()>>(&self, f: F) -> Vec<String> {
        let before = self.keys();
        f.await;
        self.keys().into_iter().filter(|k| !before.contains(k)).collect()
    }

    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

fn refused(got: Result<Value, Value>, status: u16, field: Option<&str>) {
    let e = got.expect_err("a RedcountError");
    assert_eq!(e["status"], status, "{e}");
    assert_eq!(e["field"].as_str(), field, "{e}");
    assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{e}");
}

fn allowed(got: Result<Value, Value>) -> bool {
    got.unwrap()["allowed"].as_bool().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_of_ones_own_through_a_service_binding() {
    let mut s = stack();
    let run = &secret("run")[..8];

    // The client's contract (every method, the typed errors) over the binding: the same one
    // packages/client passes over HTTP.
    let c = s.api.post("/test/contract", "").await;
    assert_eq!(c.status, 200, "{}\n{}", c.json, s.log());
    assert!(c.json["calls"].as_u64().unwrap() > 40, "{}", c.json);

    // redcount's engine in the caller's own isolate (@redcount/client/engine, no binding, the
    // caller's REDCOUNT_* vars): the same contract and typed errors, the same state as the
    // binding's calls, the rights only its props give, and the scripts at hand when Redis has
    // lost them.
    let c = s.api.post("/test/contract-engine", "").await;
    assert_eq!(c.status, 200, "{}\n{}", c.json, s.log());
    assert!(c.json["calls"].as_u64().unwrap() > 40, "{}", c.json);
    refused(s.call("ENGINE", "take", json!(["daily-prize", "e", {"cost": 2.5}])).await, 400, Some("cost"));
    refused(s.call("ENGINE", "take", json!(["nope", "e"])).await, 404, Some("policy"));
    let shared = format!("shared-{run}");
    assert!(allowed(s.call("REDCOUNT", "take", json!(["one-a-day", shared])).await));
    assert!(!allowed(s.call("ENGINE", "take", json!(["one-a-day", shared])).await));
    // Props that give no rights are refused, never answered from the denial just cached.
    refused(s.call("ENGINE_BAD", "take", json!(["one-a-day", shared])).await, 500, None);
    // One configuration per isolate: another env object with the same REDCOUNT_* vars is the
    // same engine; one with others is refused (switching under calls in flight over-admitted).
    // (Another order of the same vars is the same; a getter answering the check one way and
    // the module another is read once.)
    for kind in ["same", "order", "getter"] {
        let same = s.api.post(&format!("/test/engine-env/{kind}/{shared}"), "").await;
        assert_eq!(same.json["value"]["allowed"], json!(false), "{kind}: {}", same.json);
    }
    // Props changed after the engine was made: the call is made with them as they were.
    let changed = s.api.post(&format!("/test/engine-props-changed/{shared}"), "").await;
    assert_eq!(changed.json["value"]["allowed"], json!(false), "{}", changed.json);
    let other = s.api.post(&format!("/test/engine-env/other/{shared}"), "").await;
    assert!(
        other.json["thrown"]
            .as_str()
            .is_some_and(|m| m.starts_with("TypeError") && m.contains("one redcount configuration")),
        "{}",
        other.json
    );
    refused(s.call("ENGINE", "reset", json!(["one-a-day", shared])).await, 401, None);
    s.call("ENGINE_ADMIN", "reset", json!(["one-a-day", shared])).await.unwrap();
    let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut s.redis.conn()).unwrap();
    assert!(allowed(s.call("ENGINE", "take", json!(["one-a-day", shared])).await));

    // Typed errors: status, message and field survive the binding.
    refused(s.call("REDCOUNT", "take", json!(["daily-prize", "e", {"cost": 2.5}])).await, 400, Some("cost"));
    refused(s.call("REDCOUNT", "take", json!(["daily-prize", {"a": 1}])).await, 400, Some("subject"));
    refused(s.call("REDCOUNT", "take", json!(["nope", "e"])).await, 404, Some("policy"));
    refused(s.call("REDCOUNT", "grab", json!(["0123456789abcdef", {"user": "u"}])).await, 404, Some("id"));
    // The example's own route turns one into its answer.
    let g = send(&s, "POST", "/packets/0123456789abcdef/grab", "u").await;
    assert_eq!((g.status, &g.json["field"]), (404, &json!("id")), "{}", g.json);

    // The Hono middleware (calls-per-minute: 10 a minute): the headers on allowed answers, 429
    // with Retry-After past the limit, each user apart.
    for i in 0..11 {
        let r = send(&s, "GET", "/hello/you", &format!("m-{run}")).await;
        assert_eq!(r.headers["ratelimit-policy"], "\"calls-per-minute\";q=10;w=60", "{:?}", r.headers);
        if i < 10 {
            assert_eq!((r.status, r.json.as_str()), (200, Some("hello, you")), "call {i}");
            assert!(r.headers["ratelimit"].to_str().unwrap().starts_with("\"calls-per-minute\";r="), "{:?}", r.headers);
        } else {
            assert_eq!(r.status, 429, "{}", r.json);
            assert!(r.headers["retry-after"].to_str().unwrap().parse::<u64>().unwrap() > 0);
            assert!(r.headers["ratelimit"].to_str().unwrap().starts_with("\"calls-per-minute\";r=0;"));
        }
    }
    assert_eq!(send(&s, "GET", "/hello/you", &format!("m2-{run}")).await.status, 200);

    client_denial_cache(&s, run).await;

    // Scopes: each tenant's keys under its own namespace, and a subject exhausted in one
    // scope untouched in the others.
    let subject = format!("s-{run}");
    let q = json!(["daily-prize", subject]);
    let acme = s
        .new_keys(async {
            assert!(allowed(s.call("ACME", "take", q.clone()).await));
            assert!(allowed(s.call("ACME", "take", q.clone()).await));
            assert!(!allowed(s.call("ACME", "take", q.clone()).await));
        })
        .await;
    assert!(!acme.is_empty() && acme.iter().all(|k| k.starts_with("rc.acme:")), "{acme:?}");
    // Denied again soon after: from the isolate's memory (the local state its HTTP requests
    // use too), for at most cache_denials_ms (1 s): a take that came later than that asked
    // Redis again, so the first of a few in a row is enough.
    let mut cached = None;
    for i in 0..5 {
        let again = s.call("ACME", "take", q.clone()).await.unwrap();
        assert_eq!(again["allowed"], false, "{again}");
        if again["cached"] == true {
            assert!(again["retry_after_ms"].as_u64().is_some_and(|ms| ms > 0), "{again}");
            cached = Some(i);
            break;
        }
    }
    assert!(cached.is_some(), "no denial over the binding was repeated from the isolate's cache");
    let globex = s.new_keys(async { assert!(allowed(s.call("GLOBEX", "take", q.clone()).await)) }).await;
    assert!(!globex.is_empty() && globex.iter().all(|k| k.starts_with("rc.globex:")), "{globex:?}");
    let public = s.new_keys(async { assert!(allowed(s.call("REDCOUNT", "take", q.clone()).await)) }).await;
    assert!(!public.is_empty() && public.iter().all(|k| k.starts_with("rc:")), "{public:?}");
    // A packet made in one scope is nowhere else.
    let made = s.call("ACME", "createPacket", json!([{"total_cents": 100, "count": 2}])).await.unwrap();
    let id = made["id"].as_str().unwrap();
    for other in ["GLOBEX", "REDCOUNT", "REDCOUNT_ADMIN"] {
        refused(s.call(other, "grab", json!([id, {"user": "u"}])).await, 404, Some("id"));
    }
    assert_eq!(s.call("ACME", "grab", json!([id, {"user": "u"}])).await.unwrap()["outcome"], "won");

    // Admin rights only from props: refused to the public and to a scoped binding without
    // admin; a scoped admin acts within its scope only.
    for b in ["REDCOUNT", "ACME", "GLOBEX"] {
        refused(s.call(b, "reset", json!(["daily-prize", subject])).await, 401, None);
        refused(
            s.call(b, "setOverride", json!(["daily-prize", subject, {"limit": 9, "ttl_ms": 60000}])).await,
            401,
            None,
        );
        refused(s.call(b, "appendInbox", json!([subject, {"id": 1, "body": "x"}])).await, 401, None);
        refused(s.call(b, "addCounter", json!(["running-jobs", subject, {"delta": 5}])).await, 403, Some("delta"));
        refused(s.call(b, "stats", json!([])).await, 401, None);
    }
    assert!(allowed(s.call("GLOBEX", "take", q.clone()).await));
    assert!(!allowed(s.call("GLOBEX", "take", q.clone()).await));
    let reset =
        s.new_keys(async { assert_eq!(s.call("ACME_ADMIN", "reset", q.clone()).await.unwrap()["reset"], true) });
    assert!(reset.await.iter().all(|k| k.starts_with("rc.acme:")));
    assert!(allowed(s.call("ACME", "take", q.clone()).await));
    assert!(!allowed(s.call("GLOBEX", "take", q.clone()).await), "acme's admin reset globex's quota");
    // Props that are not understood give no rights at all.
    for b in ["WRONG_ADMIN", "WRONG_PROP"] {
        refused(s.call(b, "take", q.clone()).await, 500, None);
        refused(s.call(b, "reset", q.clone()).await, 500, None);
    }

    // 1,000 grabs of a 500-share packet at once through the binding: exactly 500 won, the
    // whole amount paid out.
    let made = s.call("REDCOUNT", "createPacket", json!([{"total_cents": 100000, "count": 500}])).await.unwrap();
    let id = made["id"].as_str().unwrap();
    let storm = s.api.post("/test/storm/grab/1000", &json!([id, {"user": "u{i}"}]).to_string()).await;
    let answers = storm.json.as_array().unwrap_or_else(|| panic!("{}", storm.json));
    let won: Vec<i64> = answers
        .iter()
        .filter(|a| a["value"]["outcome"] == "won")
        .map(|a| a["value"]["amount_cents"].as_i64().unwrap())
        .collect();
    assert_eq!(answers.len(), 1000);
    assert!(
        answers.iter().all(|a| a.get("value").is_some()),
        "{:?}",
        answers.iter().find(|a| a.get("error").is_some())
    );
    assert_eq!((won.len(), won.iter().sum::<i64>()), (500, 100000));
    let status = s.call("REDCOUNT", "packetStatus", json!([id])).await.unwrap();
    assert_eq!(status["claimed"], 500, "{status}");

    // Oversized calls (a scoped public binding's too) are refused before the isolate copies
    // them into its wasm memory, which stays flat: an RPC input or subject of 8 M characters,
    // an 8 MB body whose Content-Length is not a number; each first at 20,000 (past the limit:
    // what the isolate does hold of such a call, the limit's worth, is then in place).
    let mut memory = Vec::new();
    for n in ["20000", "8000000"] {
        for (path, status) in [
            ("GLOBEX/{n}", 413),
            ("ACME/{n}?arg=subject", 400),
            ("REDCOUNT_HTTP/{n}?length=abc", 413),
            ("HTTP_ACME/{n}?length=0x10", 413),
        ] {
            let path = path.replace("{n}", n);
            let r = s.api.post(&format!("/test/oversize/{path}"), "").await;
            let e = match r.json["thrown"].as_str() {
                Some(thrown) => serde_json::from_str::<Value>(thrown).unwrap_or_else(|_| panic!("{path}: {thrown}")),
                None => json!({"status": r.json["status"], "error": r.json["json"]["error"]}),
            };
            assert_eq!(e["status"], status, "{path}: {e}");
            match status {
                413 => assert_eq!(e["error"], "body larger than 16384 bytes", "{path}: {e}"),
                _ => assert!(e["field"].is_string(), "the argument is named: {path}: {e}"),
            }
        }
        memory.push(s.api.get("/test/stats").await.json["memory_bytes"].as_u64().unwrap());
    }
    assert_eq!(memory[1], memory[0], "the oversized calls grew the isolate's wasm memory");

    // Props on a binding to the default entrypoint (HTTP requests) count as on Redcount's:
    // the namespace scopes the keys, `admin: true` gives the admin rights without a token,
    // props not understood refuse every request.
    let http = |b: &str, path: &str| format!("/test/http/{b}/api/{path}");
    let take = format!("quotas/daily-prize/h-{run}");
    let scoped = s.new_keys(async { assert_eq!(s.api.post(&http("HTTP_ACME", &take), "").await.json["status"], 200) });
    let scoped = scoped.await;
    assert!(!scoped.is_empty() && scoped.iter().all(|k| k.starts_with("rc.acme:")), "{scoped:?}");
    for (b, status) in [("REDCOUNT_HTTP", 401), ("HTTP_ACME", 401), ("HTTP_ADMIN", 200)] {
        let r = s.api.call("DELETE", &http(b, &take), None, false).await;
        assert_eq!(r.json["status"], status, "{b}: {}", r.json);
    }
    for path in [http("HTTP_WRONG", &take), http("HTTP_WRONG", "health")] {
        let r = s.api.call(if path.ends_with("health") { "GET" } else { "POST" }, &path, None, false).await;
        assert_eq!(r.json["status"], 500, "{path}: {}", r.json);
        assert!(r.json["json"]["error"].as_str().unwrap().contains("props"), "{}", r.json);
    }

    // HTTP requests through the `Redcount` entrypoint's own `fetch` read its props the same
    // way: the one HTTP path whose props survive the static-assets router in front of the
    // default export.
    let take = format!("quotas/daily-prize/e-{run}");
    let scoped = s.new_keys(async { assert_eq!(s.api.post(&http("ACME", &take), "").await.json["status"], 200) });
    let scoped = scoped.await;
    assert!(!scoped.is_empty() && scoped.iter().all(|k| k.starts_with("rc.acme:")), "{scoped:?}");
    for (b, status) in [("REDCOUNT", 401), ("ACME", 401), ("GLOBEX", 401), ("ACME_ADMIN", 200)] {
        let r = s.api.call("DELETE", &http(b, &take), None, false).await;
        assert_eq!(r.json["status"], status, "{b}: {}", r.json);
    }
    let r = s.api.post(&http("WRONG_PROP", &take), "").await;
    assert_eq!(r.json["status"], 500, "{}", r.json);

    // Calls cancelled while in flight (over HTTP and over RPC) leave no exchange parked.
    for path in ["/test/cancel/http/50/5", "/test/cancel/rpc/50/5"] {
        let r = s.api.post(path, "").await;
        assert_eq!(r.status, 200, "{path}: {}", r.json);
        assert!(r.json["cancelled"].as_u64().unwrap() > 0, "{path}: none cancelled: {}", r.json);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let stats = s.api.get("/test/stats").await;
        if stats.json["parked"] == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "exchanges still parked: {}", stats.json);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The front stopped: burst's failure mode (closed, the default) is a degraded denial, an
    // answer rather than an error (as over HTTP), which the middleware turns into a 503.
    s.front.kill();
    let degraded = s.call("REDCOUNT", "take", json!(["burst", subject])).await.unwrap();
    assert_eq!((&degraded["allowed"], &degraded["degraded"]), (&json!(false), &json!(true)), "{degraded}");
    assert_eq!(send(&s, "GET", "/hello/you", &format!("m3-{run}")).await.status, 503);
    drop(s.workerd);
}

/// The client's denial cache, in the caller's isolate in front of the binding: a flood of one
/// exhausted subject (as separate requests, each making its client, as a Worker does) crosses
/// the binding and reaches Redis a handful of times; never another subject or namespace, never
/// a policy with `cache_denials_ms` 0; a refund through the client drops the denial at once.
async fn client_denial_cache(s: &Stack, run: &str) {
    let q = json!(["one-a-day", format!("f-{run}")]);
    assert!(s.counted("REDCOUNT", "take", &q).await.0.unwrap()["allowed"] == true);
    let (first, mut crossed) = s.counted("REDCOUNT", "take", &q).await;
    let first = first.unwrap();
    assert_eq!((&first["allowed"], &first["cached"]), (&json!(false), &Value::Null), "{first}");
    assert!(first["cache_ms"].as_u64().is_some_and(|ms| (1..=1000).contains(&ms)), "{first}");
    let (scripts, started) = (s.script_calls(), Instant::now());
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..10 {
        let (api, body) = (Api::new(s.api.base.clone(), ""), q.to_string());
        tasks.spawn(async move {
            let mut answers = Vec::new();
            for _ in 0..40 {
                answers.push(api.post("/test/counted/REDCOUNT/take", &body).await.json);
            }
            answers
        });
    }
    let flood: Vec<Value> = tasks.join_all().await.into_iter().flatten().collect();
    let seconds = started.elapsed().as_secs_f64().ceil() as u64;
    let most = flood.iter().filter_map(|a| a["crossed"].as_u64()).max().unwrap();
    let (over, redis) = (most - crossed, s.script_calls() - scripts);
    eprintln!("a flood of 400 denied takes in {seconds} s: {over} calls across the binding, {redis} script calls");
    assert!(over <= 2 + 2 * seconds, "{over} calls across the binding for 400 takes in {seconds} s");
    assert!(redis <= 2 + 2 * seconds, "{redis} script calls for 400 takes in {seconds} s");
    for a in &flood {
        let v = &a["value"];
        assert_eq!(v["allowed"], false, "{a}");
        assert!(
            v["retry_after_ms"].as_i64().is_some_and(|ms| ms >= 1 && ms <= first["retry_after_ms"].as_i64().unwrap())
        );
        assert!(v["headers"]["Retry-After"].as_str().is_some_and(|h| h.parse::<u64>().unwrap() > 0), "{a}");
    }
    assert!(flood.iter().filter(|a| a["value"]["cached"] == true).count() as u64 >= 400 - over);
    crossed = most;

    // Another subject through the same binding, the same subject in another namespace: asked.
    let other = json!(["one-a-day", format!("f2-{run}")]);
    let (r, now) = s.counted("REDCOUNT", "take", &other).await;
    assert_eq!((r.unwrap()["allowed"].clone(), now), (json!(true), crossed + 1));
    crossed = now;
    let (r, _) = s.counted("GLOBEX", "take", &q).await;
    assert_eq!(r.unwrap()["allowed"], true, "a denial of the unscoped binding answered a scoped one");

    // A policy with cache_denials_ms 0: every call crosses, none is repeated.
    let z = json!(["uncached", format!("f-{run}")]);
    assert_eq!(s.counted("REDCOUNT", "take", &z).await.0.unwrap()["allowed"], true);
    crossed += 1;
    let scripts = s.script_calls();
    for _ in 0..10 {
        let (r, now) = s.counted("REDCOUNT", "take", &z).await;
        let r = r.unwrap();
        crossed += 1;
        assert_eq!(now, crossed, "a denial of cache_denials_ms 0 was repeated: {r}");
        assert!(r["allowed"] == false && r.get("cache_ms").is_none() && r.get("cached").is_none(), "{r}");
    }
    assert_eq!(s.script_calls() - scripts, 10);

    // A refund through the client (an admin binding's, another binding object) drops the
    // subject's denial at once: the next take crosses and is allowed.
    let refund = json!(["one-a-day", format!("f-{run}"), {"cost": 1}]);
    assert_eq!(s.counted("REDCOUNT_ADMIN", "refund", &refund).await.0.unwrap()["refunded"], 1);
    let (r, now) = s.counted("REDCOUNT", "take", &q).await;
    assert_eq!((r.unwrap()["allowed"].clone(), now), (json!(true), crossed + 1), "the refund did not drop the denial");
}

/// A request to the example's own routes as `user` (`x-user`).
async fn send(s: &Stack, method: &str, path: &str, user: &str) -> Reply {
    let url = format!("{}{path}", s.api.base);
    let resp =
        s.api.http.request(method.parse().unwrap(), url).header("x-user", user).send().await.expect("the caller");
    let (status, headers) = (resp.status().as_u16(), resp.headers().clone());
    let text = resp.text().await.unwrap();
    Reply { status, headers, json: serde_json::from_str(&text).unwrap_or(Value::String(text)) }
}

/// packages/client/test/client.test.mjs (the contract over HTTP, the typed error, the Hono
/// middleware's headers and 429, src/generated.ts against openapi.json) with `node --test`,
/// against `redcount serve` on a real Redis.
#[test]
fn the_clients_own_tests_over_http() {
    let root = root();
    let dist = root.join("packages/client/dist/index.js");
    assert!(dist.exists(), "{} is missing: run `cargo xtask test` (or build-client)", dist.display());
    let redis = RedisServer::start();
    let admin = secret("admin");
    let serve = NativeServer::start(&[("REDIS_URL", &redis.url())], &admin, &policies());
    let out = std::process::Command::new("node")
        .args(["--test", "--test-reporter=tap"])
        .arg(root.join("packages/client/test/client.test.mjs"))
        .current_dir(root.join("packages/client"))
        .env("REDCOUNT_URL", serve.url())
        .env("REDCOUNT_ADMIN_TOKEN", &admin)
        .output()
        .expect("node");
    let tap = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{tap}\n{}\n{}", String::from_utf8_lossy(&out.stderr), serve.log());
    // Every test ran (none skipped for want of a server).
    let file = std::fs::read_to_string(root.join("packages/client/test/client.test.mjs")).unwrap();
    let tests = file.lines().filter(|l| l.starts_with("test(")).count();
    assert!(
        tests >= 8 && tap.contains(&format!("# pass {tests}\n")) && tap.contains("# skipped 0"),
        "{tests} tests: {tap}"
    );
}

/// README.md's "From your Worker" is the example's code and binding.
#[test]
fn the_readme_quick_start_is_the_example() {
    let root = root();
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let section = readme.split_once("### From your Worker").expect("README: a `### From your Worker` section").1;
    let block = |lang: &str| section.split_once(&format!("```{lang}\n")).unwrap().1.split_once("```").unwrap().0;
    let example = std::fs::read_to_string(root.join("examples/caller-worker/src/index.ts")).unwrap();
    let code = example.split_once("// README from your Worker: begin\n").unwrap().1;
    let code = code.split_once("// README from your Worker: end").unwrap().0;
    assert_eq!(block("ts"), code, "README.md's \"From your Worker\" and examples/caller-worker/src/index.ts differ");
    let toml = std::fs::read_to_string(root.join("examples/caller-worker/wrangler.toml")).unwrap();
    let binding = block("toml").lines().filter(|l| !l.starts_with('#')).collect::<Vec<_>>().join("\n");
    assert!(toml.contains(&binding), "README.md's binding is not examples/caller-worker/wrangler.toml's:\n{binding}");
}
