//! The HTTP API through its real shells: the worker under workerd and wrangler dev (REST front, Redis),
//! and `redcount serve` over the REST front or over RESP. The same route contract runs
//! against each: every route, every error status, admin vs public, policies enforced.

use std::collections::HashSet;
use std::time::Duration;

use redcount_tests::{
    Api, NativeServer, RedisCluster, RedisServer, Reply, RestFront, Store, TEST_POLICIES, Workerd, Wrangler, secret,
};
use serde_json::{Value, json};

fn assert_error(r: &Reply, status: u16, field: Option<&str>) {
    assert_eq!(r.status, status, "{}", r.json);
    assert!(r.json["error"].as_str().is_some_and(|e| !e.is_empty()), "{}", r.json);
    assert_eq!(r.json["field"].as_str(), field, "{}", r.json);
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    /// The worker under workerd, as uploaded (no proxy in front).
    Worker,
    /// The worker under `wrangler dev`, as `cargo xtask dev` runs it: its assets layer serves
    /// the static files (`/api/openapi.json`) before the worker.
    WorkerDev,
    NativeRest,
    NativeResp,
    /// The native server, through the REST front, before a 3-master Redis Cluster.
    NativeRestCluster,
}

enum Shell {
    Worker(Workerd),
    WorkerDev(Wrangler),
    Native(NativeServer),
}

impl Shell {
    fn log(&self) -> String {
        match self {
            Shell::Worker(w) => w.log(),
            Shell::WorkerDev(w) => w.log(),
            Shell::Native(n) => n.log(),
        }
    }
}

struct Stack {
    redis: Store,
    front: Option<RestFront>,
    shell: Shell,
    api: Api,
}

fn stack(kind: Kind) -> Stack {
    let redis = match kind {
        Kind::NativeRestCluster => Store::Cluster(RedisCluster::start(3)),
        _ => Store::One(RedisServer::start()),
    };
    let admin = secret("admin");
    let (front, shell) = match kind {
        Kind::Worker | Kind::WorkerDev => {
            let front = RestFront::start(&redis.url(), false);
            let vars = [
                ("REDCOUNT_REST_URL", front.url()),
                ("REDCOUNT_REST_TOKEN", front.token.clone()),
                ("REDCOUNT_ADMIN_TOKEN", admin.clone()),
                ("REDCOUNT_POLICIES", TEST_POLICIES.into()),
                ("REDCOUNT_CORS_ORIGINS", "http://allowed.example".into()),
            ];
            let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let shell = match kind {
                Kind::Worker => Shell::Worker(Workerd::start(&vars)),
                _ => Shell::WorkerDev(Wrangler::start(&vars)),
            };
            (Some(front), shell)
        }
        Kind::NativeRest | Kind::NativeRestCluster => {
            let front = RestFront::start(&redis.url(), matches!(kind, Kind::NativeRestCluster));
            let n = NativeServer::start(
                &[("REDCOUNT_REST_URL", &front.url()), ("REDCOUNT_REST_TOKEN", &front.token)],
                &admin,
                TEST_POLICIES,
            );
            (Some(front), Shell::Native(n))
        }
        Kind::NativeResp => {
            (None, Shell::Native(NativeServer::start(&[("REDIS_URL", &redis.url())], &admin, TEST_POLICIES)))
        }
    };
    let base = match &shell {
        Shell::Worker(w) => w.url(),
        Shell::WorkerDev(w) => w.url(),
        Shell::Native(n) => n.url(),
    };
    let http =
        redcount_tests::http_builder().pool_max_idle_per_host(64).timeout(Duration::from_secs(60)).build().unwrap();
    Stack { redis, front, shell, api: Api { http, base, admin } }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn route_contract_through_the_worker() {
    route_contract(Kind::WorkerDev).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn route_contract_through_the_native_server_over_rest() {
    route_contract(Kind::NativeRest).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn route_contract_through_the_native_server_over_resp() {
    route_contract(Kind::NativeResp).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn route_contract_through_the_front_on_a_redis_cluster() {
    route_contract(Kind::NativeRestCluster).await;
}

async fn route_contract(kind: Kind) {
    let Stack { mut redis, mut front, shell, api } = stack(kind);
    let secrets: Vec<String> = front.iter().map(|f| f.token.clone()).chain([api.admin.clone()]).collect();

    let h = api.get("/api/health").await;
    assert_eq!((h.status, &h.json["ok"]), (200, &json!(true)));
    let p = api.get("/api/policies").await;
    assert_eq!(p.status, 200);
    assert_eq!(p.json["policies"]["device-slots"], json!({"kind": "semaphore", "limit": 2, "lease_ms": 300000}));
    let text = p.json.to_string();
    assert!(secrets.iter().all(|s| !text.contains(s)), "no secret in a response");
    // The OpenAPI document: the committed text, from every shell (the worker serves it as a
    // static file, so its wasm carries none of it).
    let doc = api.http.get(format!("{}/api/openapi.json", api.base)).send().await.unwrap();
    assert_eq!(doc.status(), 200);
    assert!(doc.headers()["content-type"].to_str().unwrap().starts_with("application/json"), "{kind:?}");
    let committed = std::fs::read_to_string(redcount_tests::root().join("openapi.json")).unwrap();
    assert!(doc.text().await.unwrap() == committed, "{kind:?}: /api/openapi.json is not the committed openapi.json");

    // Counter: never below 0, public step limited, admin may exceed.
    let c = api.post("/api/counters/running-jobs/app-1", r#"{"delta":-1}"#).await;
    assert_eq!(c.json, json!({"value": 0, "applied": 0, "status": "clamped"}));
    assert_eq!(api.post("/api/counters/running-jobs/app-1", r#"{"delta":1}"#).await.json["value"], 1);
    assert_eq!(api.get("/api/counters/running-jobs/app-1").await.json, json!({"value": 1}));
    assert_error(&api.post("/api/counters/running-jobs/app-1", r#"{"delta":5}"#).await, 403, Some("delta"));
    let big = api.call("POST", "/api/counters/running-jobs/app-1", Some(r#"{"delta":5}"#), true).await;
    assert_eq!(big.json["value"], 6);
    assert_error(&api.post("/api/counters/running-jobs/app-1", r#"{"delta":"1e3"}"#).await, 400, Some("delta"));

    // Claim.
    let first = api.post("/api/claims/signup-bonus/alice", "").await;
    assert_eq!(first.json["claimed"], json!(true));
    let again = api.post("/api/claims/signup-bonus/alice", "").await;
    assert_eq!(again.json["claimed"], json!(false));
    assert!(again.json["retry_after_ms"].as_i64().unwrap() > 86_000_000);

    // Quota: 2 per day; peek; admin reset.
    for want in [true, true, false] {
        let q = api.post("/api/quotas/daily-prize/bob", r#"{"cost":1}"#).await;
        assert_eq!(q.json["allowed"], json!(want), "{}", q.json);
        if !want {
            assert!(q.headers.get("retry-after").is_some());
        }
        // The standard RateLimit headers, on every shell.
        assert_eq!(q.headers["ratelimit-policy"], r#""daily-prize";q=2;w=86400"#);
        assert!(q.headers["ratelimit"].to_str().unwrap().starts_with(r#""daily-prize";r="#), "{:?}", q.headers);
    }
    assert_eq!(api.get("/api/quotas/daily-prize/bob").await.json["remaining"], 0);
    assert_error(&api.call("DELETE", "/api/quotas/daily-prize/bob", None, false).await, 401, None);
    let reset = api.call("DELETE", "/api/quotas/daily-prize/bob", None, true).await;
    assert_eq!(reset.json, json!({"reset": true}));
    assert_eq!(api.post("/api/quotas/daily-prize/bob", "").await.json["allowed"], json!(true));
    assert_error(&api.post("/api/quotas/daily-prize/bob", r#"{"cost":2}"#).await, 403, Some("cost"));
    assert_error(&api.post("/api/quotas/device-slots/bob", "").await, 404, Some("policy"));

    // Semaphore: 2 slots.
    let sem = |h: &str, a: &str| (format!("/api/semaphores/device-slots/pool/{a}"), format!(r#"{{"holder":"{h}"}}"#));
    for (h, a, want) in [
        ("d1", "acquire", "acquired"),
        ("d2", "acquire", "acquired"),
        ("d3", "acquire", "full"),
        ("d1", "acquire", "renewed"),
        ("d1", "release", "released"),
        ("d3", "acquire", "acquired"),
        ("zz", "renew", "not_holder"),
        ("zz", "release", "not_holder"),
    ] {
        let (path, body) = sem(h, a);
        let r = api.post(&path, &body).await;
        assert_eq!(r.json["result"], json!(want), "{h} {a}: {}", r.json);
        assert!(r.json["in_use"].as_i64().unwrap() <= 2);
    }
    assert_eq!(api.post("/api/semaphores/device-slots/pool/steal", r#"{"holder":"x"}"#).await.status, 404);
    assert_error(
        &api.post("/api/semaphores/device-slots/pool/acquire", r#"{"holder":"a{b}"}"#).await,
        400,
        Some("holder"),
    );

    // Compound decision: daily-prize (2 a day) AND burst (5 per 10 s) AND a device-slots
    // lease on the subject's own semaphore, all or nothing, in one script (one slot on a
    // Cluster).
    let decide = |holder: &str| {
        format!(
            r#"{{"parts":[{{"policy":"daily-prize"}},{{"policy":"burst","cost":1}},{{"policy":"device-slots","holder":"{holder}"}}]}}"#
        )
    };
    let d = api.post("/api/decisions/dora", &decide("job-1")).await;
    assert_eq!((d.status, &d.json["allowed"], &d.json["denied_by"]), (200, &json!(true), &json!(null)), "{}", d.json);
    assert!(d.json["parts"][2]["fencing_token"].as_i64().is_some_and(|t| t > 0), "{}", d.json);
    assert_eq!(d.json["parts"][1]["remaining"], json!(4));
    api.post("/api/decisions/dora", &decide("job-2")).await;
    let denied = api.post("/api/decisions/dora", &decide("job-3")).await;
    // The semaphore is full and the daily quota spent: the first denying part is named,
    // and burst, which alone would admit, is not charged.
    assert_eq!(
        (&denied.json["allowed"], &denied.json["denied_by"]),
        (&json!(false), &json!("daily-prize")),
        "{}",
        denied.json
    );
    assert_eq!((&denied.json["parts"][1]["allowed"], &denied.json["parts"][1]["remaining"]), (&json!(true), &json!(3)));
    assert_eq!(denied.json["parts"][2]["result"], json!("full"));
    assert!(denied.headers.get("retry-after").is_some());
    let released = api.post("/api/semaphores/device-slots/dora/release", r#"{"holder":"job-1"}"#).await;
    assert_eq!(released.json["result"], json!("released"), "the decision's lease is the semaphore route's");
    assert_error(
        &api.post("/api/decisions/dora", r#"{"parts":[{"policy":"running-jobs"}]}"#).await,
        400,
        Some("parts[0].policy"),
    );

    // Inbox: admin only under this policy.
    assert_error(&api.post("/api/inbox/carol/messages", r#"{"id":1,"body":"hi"}"#).await, 401, None);
    let m = api.call("POST", "/api/inbox/carol/messages", Some(r#"{"id":1,"body":"hi ✓"}"#), true).await;
    assert_eq!((m.status, &m.json), (201, &json!({"stored": true, "length": 1})));
    let dup = api.call("POST", "/api/inbox/carol/messages", Some(r#"{"id":1,"body":"again"}"#), true).await;
    assert_eq!((dup.status, &dup.json["stored"]), (200, &json!(false)));
    api.call("POST", "/api/inbox/carol/messages", Some(r#"{"id":2,"body":"two"}"#), true).await;
    let read = api.call("GET", "/api/inbox/carol/messages?after=1&limit=10", None, true).await;
    assert_eq!(read.json["messages"].as_array().unwrap().len(), 1);
    assert_eq!(read.json["messages"][0]["body"], json!("two"));
    let trim = api.call("POST", "/api/inbox/carol/trim", None, true).await;
    assert_eq!(trim.json["deleted"], json!(0));

    // Red packets.
    let made = api.post("/api/redpackets", r#"{"total_cents":1000,"count":3}"#).await;
    assert_eq!(made.status, 201, "{}", made.json);
    let id = made.json["id"].as_str().unwrap().to_string();
    let g = api.post(&format!("/api/redpackets/{id}/grab"), r#"{"user":"u1"}"#).await;
    assert_eq!(g.json["outcome"], json!("won"));
    // Amounts are in cents and say so, as total_cents does (`amount` stays as an alias).
    assert!(g.json["amount_cents"].as_i64().is_some_and(|a| a > 0), "{}", g.json);
    assert_eq!(g.json["amount_cents"], g.json["amount"]);
    let again = api.post(&format!("/api/redpackets/{id}/grab"), r#"{"user":"u1"}"#).await;
    assert_eq!((&again.json["outcome"], &again.json["amount"]), (&json!("already"), &g.json["amount"]));
    let st = api.get(&format!("/api/redpackets/{id}")).await;
    assert_eq!((st.json["remaining"].as_i64(), st.json["claimed"].as_i64()), (Some(2), Some(1)));
    let claims = api.get(&format!("/api/redpackets/{id}/claims?offset=0&limit=10")).await;
    assert_eq!(claims.json["claims"][0]["user"], json!("u1"));
    assert_error(&api.post("/api/redpackets/0123456789abcdef/grab", r#"{"user":"u1"}"#).await, 404, Some("id"));
    assert_error(&api.get("/api/redpackets/0123456789abcdef").await, 404, Some("id"));
    assert_error(&api.post("/api/redpackets", r#"{"total_cents":1000,"count":501}"#).await, 403, Some("count"));
    assert_eq!(
        api.call("POST", "/api/redpackets", Some(r#"{"total_cents":1000,"count":501}"#), true).await.status,
        201
    );
    assert_error(&api.post("/api/redpackets", r#"{"total_cents":1000.5,"count":3}"#).await, 400, Some("total_cents"));
    assert_error(&api.post("/api/redpackets", r#"{"total_cents":1000,"count":3"#).await, 400, Some("body"));
    assert_error(&api.post("/api/redpackets", r#"{"total_cents":1000,"count":3,"x":1}"#).await, 400, Some("x"));
    let huge = format!(r#"{{"user":"{}"}}"#, "a".repeat(20_000));
    assert_error(&api.post(&format!("/api/redpackets/{id}/grab"), &huge).await, 413, None);
    assert_eq!(api.call("PUT", &format!("/api/redpackets/{id}/grab"), None, false).await.status, 405);
    assert_eq!(api.get("/api/nothing-here").await.status, 404);
    let wrong =
        api.http.get(format!("{}/api/policies", api.base)).bearer_auth("not-the-admin-token").send().await.unwrap();
    assert_eq!(wrong.status().as_u16(), 401);
    // CORS: configured origins only.
    let cors = |o: &str| api.http.get(format!("{}/api/policies", api.base)).header("Origin", o.to_string()).send();
    let allowed = cors("http://allowed.example").await.unwrap();
    assert_eq!(allowed.headers().get("access-control-allow-origin").unwrap(), "http://allowed.example");
    assert!(cors("http://evil.example").await.unwrap().headers().get("access-control-allow-origin").is_none());

    // One REST round trip per operation (the scripts are cached by now).
    let (sha0, eval0) = (redis.calls("evalsha"), redis.calls("eval"));
    api.post(&format!("/api/redpackets/{id}/grab"), r#"{"user":"u2"}"#).await;
    assert_eq!((redis.calls("evalsha") - sha0, redis.calls("eval") - eval0), (1, 0));

    // 502: a Redis error reply (the counter's hash holds another type).
    redis.on_key::<()>(redis::cmd("DEL").arg("rc:{c:running-jobs}"));
    redis.on_key::<()>(redis::cmd("SADD").arg("rc:{c:running-jobs}").arg("x"));
    assert_error(&api.post("/api/counters/running-jobs/app-1", r#"{"delta":1}"#).await, 502, None);

    // Hostile input: every one a 4xx naming the problem, none reaches Redis, nothing panics.
    let calls_before = redis.total_calls();
    let deep = format!("{}1{}", "[".repeat(5000), "]".repeat(5000));
    let long_segment = format!("/api/redpackets/{}/grab", "x".repeat(5000));
    let hostile: Vec<(&str, String, Vec<u8>, u16)> = vec![
        ("POST", "/api/redpackets".into(), br#"{"total_cents":"100","count":[3]}"#.to_vec(), 400),
        ("POST", "/api/redpackets".into(), br#"{"total_cents":true,"count":3}"#.to_vec(), 400),
        ("POST", "/api/redpackets".into(), br#"{"count":3}"#.to_vec(), 400),
        ("POST", "/api/redpackets".into(), br#"{"total_cents":1e308,"count":3}"#.to_vec(), 400),
        ("POST", "/api/redpackets".into(), br#"{"total_cents":-5,"count":3}"#.to_vec(), 400),
        ("POST", "/api/redpackets".into(), br#"{"total_cents":NaN,"count":3}"#.to_vec(), 400),
        ("POST", "/api/redpackets".into(), deep.clone().into_bytes(), 400),
        ("POST", "/api/redpackets".into(), b"{\"total_cents\":100,\"count\":3,\"policy\":\"\xff\xfe\"}".to_vec(), 400),
        ("POST", "/api/redpackets/abc/grab".into(), br#"{"user":null}"#.to_vec(), 400),
        ("POST", "/api/redpackets/abc/grab".into(), br#"{"user":"a","user":"b:c"}"#.to_vec(), 400),
        ("POST", "/api/redpackets/a%2Fb/grab".into(), br#"{"user":"u"}"#.to_vec(), 400),
        ("POST", "/api/redpackets/%7Brp%3Ax%7D/grab".into(), br#"{"user":"u"}"#.to_vec(), 400),
        ("POST", long_segment, br#"{"user":"u"}"#.to_vec(), 400),
        ("POST", "/api/counters/running-jobs/%E2%9C%93".into(), br#"{"delta":1}"#.to_vec(), 400),
        ("POST", "/api/counters/running-jobs/x".into(), br#"{"delta":9007199254740993}"#.to_vec(), 400),
        ("POST", "/api/quotas/daily-prize/x".into(), br#"{"cost":0}"#.to_vec(), 400),
        ("GET", "/api/quotas/daily-prize/x?cost=%20%35".into(), Vec::new(), 400),
        ("GET", "/api/quotas/daily-prize/x?cost=1&cost=2".into(), Vec::new(), 400),
        (
            "POST",
            "/api/semaphores/device-slots/p/acquire".into(),
            format!(r#"{{"holder":"{}"}}"#, "h".repeat(65)).into_bytes(),
            400,
        ),
        ("POST", "/api/decisions/x".into(), br#"{"parts":[]}"#.to_vec(), 400),
        ("POST", "/api/decisions/x".into(), br#"{"parts":[{"policy":"burst","cost":"1e0"}]}"#.to_vec(), 400),
        ("POST", "/api/decisions/x".into(), br#"{"parts":[{"policy":"burst"},{"policy":"burst"}]}"#.to_vec(), 400),
        ("POST", "/api/decisions/x".into(), br#"{"parts":[{"policy":"burst","policy":"daily-prize"}]}"#.to_vec(), 400),
        ("POST", "/api/decisions/x".into(), br#"{"parts":[{"policy":"device-slots","holder":"a:b"}]}"#.to_vec(), 400),
        ("POST", "/api/decisions/%7Bu%3Ax%7D".into(), br#"{"parts":[{"policy":"burst"}]}"#.to_vec(), 400),
        ("POST", "/api/inbox/u/messages".into(), br#"{"id":1,"body":"x"}"#.to_vec(), 401),
        ("DELETE", "/api/quotas/daily-prize/x".into(), Vec::new(), 401),
        ("POST", "/api/redpackets".into(), vec![b' '; 17 * 1024], 413),
    ];
    for (method, path, body, want) in hostile {
        let r =
            api.http.request(method.parse().unwrap(), format!("{}{path}", api.base)).body(body).send().await.unwrap();
        let status = r.status().as_u16();
        let text = r.text().await.unwrap();
        assert_eq!(status, want, "{kind:?} {method} {}: {text}", &path[..path.len().min(80)]);
        let j: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        assert!(j["error"].as_str().is_some_and(|e| !e.is_empty()), "{path}: {text}");
    }
    assert_eq!(redis.total_calls(), calls_before, "{kind:?}: hostile input reached Redis");

    // 503 while the backend (REST front, or Redis itself) is down; back by itself after.
    match front.as_mut() {
        Some(f) => f.kill(),
        None => redis.kill(),
    }
    let down = api.post(&format!("/api/redpackets/{id}/grab"), r#"{"user":"u3"}"#).await;
    assert_error(&down, 503, None);
    assert_eq!(api.get("/api/health").await.status, 503);
    match front.as_mut() {
        Some(f) => f.restart(),
        None => redis.restart(),
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while api.get("/api/health").await.status != 200 {
        assert!(std::time::Instant::now() < deadline, "{kind:?} did not recover");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let log = shell.log();
    assert!(secrets.iter().all(|s| !log.contains(s)), "no secret in the shell's output");
    assert!(!log.contains("panicked"), "no panic: {log}");
}

/// `n` concurrent grabs of a `shares`-share packet through the worker, with an optional
/// SCRIPT FLUSH in the middle.
async fn storm(api: &Api, redis: &Store, n: usize, shares: i64, flush: bool) {
    let total = 100_003;
    let made = api.post("/api/redpackets", &format!(r#"{{"total_cents":{total},"count":{shares}}}"#)).await;
    let id = made.json["id"].as_str().expect("packet id").to_string();
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(n + 1));
    let mut tasks = Vec::new();
    for i in 0..n {
        let (http, base, id, barrier) = (api.http.clone(), api.base.clone(), id.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            if flush && i % 2 == 1 {
                tokio::time::sleep(Duration::from_millis(20)).await; // half of them after the flush
            }
            let r = http
                .post(format!("{base}/api/redpackets/{id}/grab"))
                .body(format!(r#"{{"user":"crowd-{i}"}}"#))
                .send()
                .await
                .unwrap();
            let status = r.status().as_u16();
            let text = r.text().await.unwrap();
            assert_eq!(status, 200, "grab {i}: {text}");
            (i, serde_json::from_str::<Value>(&text).unwrap())
        }));
    }
    barrier.wait().await;
    if flush {
        redis.everywhere(redis::cmd("SCRIPT").arg("FLUSH"));
    }
    let (mut won, mut empty, mut sum, mut indexes) = (HashSet::new(), 0, 0, HashSet::new());
    for t in tasks {
        let (i, j) = t.await.unwrap();
        match j["outcome"].as_str() {
            Some("won") => {
                assert!(won.insert(i));
                assert!(indexes.insert(j["index"].as_i64().unwrap()), "a share handed out twice");
                sum += j["amount"].as_i64().unwrap();
            }
            Some("empty") => empty += 1,
            other => panic!("{other:?}: {j}"),
        }
    }
    assert_eq!((won.len(), empty), (shares as usize, n - shares as usize));
    assert_eq!(sum, total);
    let st = api.get(&format!("/api/redpackets/{id}")).await;
    assert_eq!((st.json["claimed"].as_i64(), st.json["claimed_cents"].as_i64()), (Some(shares), Some(total)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_hundred_grabs_through_the_worker_even_across_a_script_flush() {
    storms(Kind::Worker).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_hundred_grabs_through_the_native_server_even_across_a_script_flush() {
    storms(Kind::NativeResp).await;
}

async fn storms(kind: Kind) {
    let Stack { redis, front: _front, shell: _shell, api } = stack(kind);
    storm(&api, &redis, 300, 100, false).await;
    let evals = redis.calls("eval");
    storm(&api, &redis, 300, 100, true).await;
    assert!(redis.calls("eval") > evals, "the flush really cost the cache and EVAL refilled it");
}

#[tokio::test]
async fn a_bad_configuration_is_a_clear_500_and_logged() {
    let worker = Wrangler::start(&[
        ("REDCOUNT_REST_URL", "http://127.0.0.1:9"),
        ("REDCOUNT_REST_TOKEN", "t"),
        ("REDCOUNT_POLICIES", r#"{"daily-prize":{"kind":"quota","limit":0,"window_ms":1000}}"#),
    ]);
    // Through the suite's client, which installs the TLS crypto provider (`reqwest::get` alone
    // panics without one when this test runs first or alone).
    let http = redcount_tests::http();
    let r = http.get(format!("{}/api/policies", worker.url())).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 500);
    let j: Value = serde_json::from_str(&r.text().await.unwrap()).unwrap();
    assert!(j["error"].as_str().unwrap().contains("REDCOUNT_POLICIES.daily-prize.limit"), "{j}");
    assert!(worker.log().contains("server misconfigured: REDCOUNT_POLICIES.daily-prize.limit"), "{}", worker.log());
    // The page itself is still served.
    let page = http.get(format!("{}/", worker.url())).send().await.unwrap();
    assert_eq!(page.status().as_u16(), 200);
}

/// The test policies, and the reservation panel's `llm-*` policies as `wrangler.toml`
/// configures them for the deployed demo.
fn demo_policies() -> String {
    let toml = std::fs::read_to_string(redcount_tests::root().join("wrangler.toml")).unwrap();
    let deployed: Value = serde_json::from_str(toml.split("'''").nth(1).expect("REDCOUNT_POLICIES")).unwrap();
    let mut policies: Value = serde_json::from_str(TEST_POLICIES).unwrap();
    for (name, p) in deployed.as_object().unwrap().iter().filter(|(n, _)| n.starts_with("llm-")) {
        policies[name] = p.clone();
    }
    assert_eq!(policies.as_object().unwrap().keys().filter(|n| n.starts_with("llm-")).count(), 3);
    policies.to_string()
}

#[test]
fn demo_page_in_a_real_browser() {
    let redis = RedisServer::start();
    let front = RestFront::start(&redis.url(), false);
    let admin = secret("admin");
    let policies = demo_policies();
    let worker = Wrangler::start(&[
        ("REDCOUNT_REST_URL", &front.url()),
        ("REDCOUNT_REST_TOKEN", &front.token),
        ("REDCOUNT_ADMIN_TOKEN", &admin),
        ("REDCOUNT_POLICIES", &policies),
    ]);
    let artifacts = redcount_tests::root().join("target/artifacts");
    let out = std::process::Command::new("node")
        .arg(redcount_tests::root().join("tests/node/demo-browser.mjs"))
        .current_dir(redcount_tests::root())
        .env("BASE_URL", worker.url())
        .env("ARTIFACTS", &artifacts)
        .output()
        .expect("run node");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "browser test failed");
    for shot in ["demo-desktop.png", "demo-phone.png", "demo-reservations.png"] {
        assert!(artifacts.join(shot).exists(), "{shot}");
    }
    // The page and its files hold no secret.
    for file in ["index.html", "app.js", "style.css"] {
        let text = std::fs::read_to_string(redcount_tests::root().join("www").join(file)).unwrap();
        assert!(
            !text.contains(&front.token) && !text.contains(&admin) && !text.to_lowercase().contains("bearer"),
            "{file}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn idempotency_keys_through_the_worker() {
    idempotency(Kind::Worker).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn idempotency_keys_through_the_native_server() {
    idempotency(Kind::NativeResp).await;
}

async fn idempotency(kind: Kind) {
    let Stack { redis: _redis, front: _front, shell: _shell, api } = stack(kind);
    let run = format!("{:x}", rand::random::<u32>());
    let cases: Vec<(&str, String, &str, &str, bool)> = vec![
        ("POST", format!("/api/counters/running-jobs/i{run}"), r#"{"delta":1}"#, r#"{"delta":-1}"#, false),
        // A claim takes no fields: no body and `{}` are one request (a replay, not a clash).
        ("POST", format!("/api/claims/signup-bonus/i{run}"), "", "{}", false),
        ("POST", format!("/api/quotas/daily-prize/i{run}"), r#"{"cost":1}"#, r#"{}"#, false),
        (
            "POST",
            format!("/api/semaphores/device-slots/i{run}/acquire"),
            r#"{"holder":"h1"}"#,
            r#"{"holder":"h2"}"#,
            false,
        ),
        ("POST", format!("/api/inbox/i{run}/messages"), r#"{"id":1,"body":"hi"}"#, r#"{"id":1,"body":"other"}"#, true),
        (
            "POST",
            String::from("/api/redpackets"),
            r#"{"total_cents":900,"count":3}"#,
            r#"{"total_cents":901,"count":3}"#,
            false,
        ),
        ("DELETE", format!("/api/quotas/daily-prize/i{run}"), "", "{}", true),
    ];
    for (method, path, body, other, admin) in &cases {
        let key = format!("k-{run}-{}", path.len() + body.len());
        let (status, json, marked) = api.keyed_replayed(method, path, body, &key, *admin).await;
        let first = (status, json);
        assert!(first.0 < 300, "{kind:?} {method} {path}: {first:?}");
        assert!(!marked, "{kind:?} {method} {path}: a first request is not a replay");
        let (status, json, marked) = api.keyed_replayed(method, path, body, &key, *admin).await;
        assert!(marked, "{kind:?} {method} {path}: a replay says so (Idempotent-Replayed: true)");
        let mut replay = (status, json);
        if path.contains("/semaphores/") {
            // A replayed grant tells the lease left now, not the one first granted.
            for f in ["lease_ms", "earliest_end_ms"] {
                let (was, now) = (first.1[f].as_i64().unwrap(), replay.1[f].as_i64().unwrap());
                assert!(now <= was && now > was - 5_000, "{f}: {was} then {now}");
                replay.1[f] = first.1[f].clone();
            }
        }
        assert_eq!(replay, first, "{kind:?} {method} {path}: a replay answers the same");
        // The same route spelt with a percent-encoded letter is the same request.
        let respelt = format!("/api/%{:02X}{}", path.as_bytes()[5], &path[6..]);
        let (status, json, marked) = api.keyed_replayed(method, &respelt, body, &key, *admin).await;
        assert!(marked, "{kind:?} {method} {respelt}: {status} {json}");
        if !path.contains("/semaphores/") {
            assert_eq!((status, json), first, "{kind:?} {method} {respelt}: a replay answers the same");
        }
        if body.is_empty() && *other == "{}" {
            let (status, json, marked) = api.keyed_replayed(method, path, other, &key, *admin).await;
            assert!(marked && (status, json) == first, "{kind:?} {method} {path}: `{{}}` replays no body");
            continue;
        }
        let clash = api.keyed(method, path, other, &key, *admin).await;
        assert_eq!(clash.0, 422, "{kind:?} {method} {path}: same key, another request: {:?}", clash.1);
        assert_eq!(clash.1["field"], json!("Idempotency-Key"));
    }
    // A call that changed nothing (a trim of young messages) stored nothing: sent again
    // under its key it is a new call, not a replay.
    let trim = format!("/api/inbox/i{run}/trim");
    for _ in 0..2 {
        let (status, json, marked) = api.keyed_replayed("POST", &trim, "", &format!("t-{run}"), true).await;
        assert_eq!((status, &json["deleted"], marked), (200, &json!(0), false), "{kind:?}: {json}");
    }
    // The writes happened once: state shows a single application.
    assert_eq!(api.get(&format!("/api/counters/running-jobs/i{run}")).await.json["value"], 1);
    let fresh = api.post(&format!("/api/claims/signup-bonus/i{run}"), "").await;
    assert_eq!(fresh.json["claimed"], json!(false), "the claim was taken once, by the keyed call");
    let sem = api.post(&format!("/api/semaphores/device-slots/i{run}/acquire"), r#"{"holder":"h1"}"#).await;
    assert_eq!(sem.json["result"], json!("renewed"));
    assert_eq!(sem.json["in_use"], json!(1));

    // A response lost on the way: the client hangs up, then retries with the same key.
    let counter = format!("/api/counters/running-jobs/d{run}");
    api.keyed_and_dropped("POST", &counter, r#"{"delta":1}"#, &format!("drop-{run}")).await;
    let retry = api.keyed("POST", &counter, r#"{"delta":1}"#, &format!("drop-{run}"), false).await;
    let again = api.keyed("POST", &counter, r#"{"delta":1}"#, &format!("drop-{run}"), false).await;
    assert_eq!(retry, again);
    assert_eq!(retry.1["value"], json!(1), "applied exactly once: {retry:?}");
    assert_eq!(api.get(&counter).await.json["value"], 1);
    let create = r#"{"total_cents":500,"count":5}"#;
    api.keyed_and_dropped("POST", "/api/redpackets", create, &format!("drop-p-{run}")).await;
    let made = api.keyed("POST", "/api/redpackets", create, &format!("drop-p-{run}"), false).await;
    assert_eq!(made.0, 201, "{made:?}");
    let id = made.1["id"].as_str().unwrap();
    let st = api.get(&format!("/api/redpackets/{id}")).await;
    assert_eq!((st.json["count"].as_i64(), st.json["remaining"].as_i64()), (Some(5), Some(5)));
    assert_eq!(api.keyed("POST", "/api/redpackets", create, &format!("drop-p-{run}"), false).await, made);

    // The fingerprint is of the parsed request: spacing does not make it another request.
    let spaced = format!("/api/counters/running-jobs/f{run}");
    let a = api.keyed("POST", &spaced, r#"{"delta":1}"#, &format!("fp-{run}"), false).await;
    let b = api.keyed("POST", &spaced, r#"{ "delta" : 1 }"#, &format!("fp-{run}"), false).await;
    assert_eq!((a.0, &a), (200, &b), "{kind:?}: the same request, differently spaced, is a replay");
    // Repeated fields are refused, whichever would win.
    let dup = api.keyed("POST", &spaced, r#"{"delta":1,"delta":5}"#, &format!("dup-{run}"), false).await;
    assert_eq!(dup.0, 400, "{kind:?}: {dup:?}");
    assert!(dup.1["error"].as_str().unwrap().contains("more than once"), "{dup:?}");
    // A key that is not ASCII is refused, not ignored (each retry would apply again).
    let bad = reqwest::header::HeaderValue::from_bytes(&[b'k', 0xe9, b'y']).unwrap();
    let r = api.http.post(format!("{}{spaced}", api.base)).header("Idempotency-Key", bad).body(r#"{"delta":1}"#);
    let r = r.send().await.unwrap();
    assert_eq!(r.status().as_u16(), 400, "{kind:?}: {}", r.text().await.unwrap());
    assert_eq!(api.get(&spaced).await.json["value"], 1);

    // A replayed acquire after its lease ended tells the truth, never grants a slot.
    let slot = format!("/api/semaphores/short-slots/s{run}/acquire");
    let key = format!("sem-{run}");
    let got = api.keyed("POST", &slot, r#"{"holder":"h1"}"#, &key, false).await;
    assert_eq!(got.1["result"], json!("acquired"), "{got:?}");
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    let other = api.post(&slot, r#"{"holder":"h2"}"#).await;
    assert_eq!(other.json["result"], json!("acquired"), "the lease ended: the slot is free");
    let replay = api.keyed("POST", &slot, r#"{"holder":"h1"}"#, &key, false).await;
    assert_ne!(replay.1["result"], json!("acquired"), "{kind:?}: a 1-slot semaphore granted twice: {replay:?}");
    assert_ne!(replay.1["result"], json!("renewed"), "{replay:?}");
}
