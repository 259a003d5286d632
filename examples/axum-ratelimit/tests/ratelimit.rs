//! The example service, driven in-process (`oneshot`) against a real redis-server (and, once,
//! a real REST front): the headers of every answer, exactness under concurrency in every
//! algorithm, the keys and costs, the declared failure mode with Redis stopped or gone, the
//! layer under plain tower with a service that must be polled ready, and a seeded random
//! sequence of requests with Redis restarts, checked against a model.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{Request, Response, StatusCode};
use axum_ratelimit::{POLICY, User, app, limit};
use rand::{Rng, SeedableRng};
use redcount::tower::{Algorithm, Config, Decision, OnUnavailable, QuotaPolicy, RateLimitLayer, subject};
use redcount_tests::{RedisServer, RestFront, Stopped, uid};
use sfv::{BareItem, List, ListEntry, Parser};
use tower::ServiceExt;

/// A configuration as the HTTP API reads it: `policies` as `REDCOUNT_POLICIES`, and `env`.
fn config(policies: &str, env: &[(&str, &str)]) -> Config {
    Config::from_env(|v| {
        if v == "REDCOUNT_POLICIES" {
            return Some(policies.to_owned());
        }
        env.iter().find(|(k, _)| *k == v).map(|(_, val)| (*val).to_owned())
    })
    .unwrap()
}

/// One policy called [`POLICY`] with `settings` (JSON members).
fn policy(settings: &str) -> Config {
    config(&format!(r#"{{"{POLICY}": {{"kind": "quota", {settings}}}}}"#), &[])
}

/// The example app over a Direct connection to `redis`, limited by `config`'s [`POLICY`].
async fn direct_app(redis: &RedisServer, config: &Config) -> Router {
    app(limit(redis.direct().await, config).unwrap())
}

/// `GET path` with `x-api-key: key`.
fn request(path: &str, key: &str) -> Request<Body> {
    Request::get(path).header("x-api-key", key).body(Body::empty()).unwrap()
}

async fn send(app: &Router, req: Request<Body>) -> Response<Body> {
    app.clone().oneshot(req).await.unwrap()
}

async fn body(r: Response<Body>) -> String {
    String::from_utf8(axum::body::to_bytes(r.into_body(), 1 << 16).await.unwrap().to_vec()).unwrap()
}

/// A RateLimit field, parsed as a Structured Field List: (name, parameters) per item.
fn field(r: &Response<Body>, name: &str) -> Vec<(String, Vec<(String, BareItem)>)> {
    let values: Vec<&str> = r.headers().get_all(name).iter().map(|v| v.to_str().unwrap()).collect();
    assert!(!values.is_empty(), "no {name} header in {:?}", r.headers());
    let text = values.join(", ");
    let list: List = Parser::new(&text).parse().unwrap_or_else(|e| panic!("{name}: {text} is not a List: {e}"));
    list.into_iter()
        .map(|entry| {
            let ListEntry::Item(item) = entry else { panic!("{name}: an inner list in {text}") };
            let item_name = item.bare_item.as_string().unwrap_or_else(|| panic!("{name}: not a String in {text}"));
            (item_name.as_str().to_owned(), item.params.into_iter().map(|(k, v)| (k.as_str().to_owned(), v)).collect())
        })
        .collect()
}

/// The one item's Integer parameter `key` of field `name`, checking the item names [`POLICY`].
fn param(r: &Response<Body>, name: &str, key: &str) -> Option<i64> {
    let items = field(r, name);
    assert_eq!(items.len(), 1, "{name}: {items:?}");
    assert_eq!(items[0].0, POLICY);
    items[0].1.iter().find(|(k, _)| k == key).map(|(_, v)| i64::from(v.as_integer().expect("an Integer")))
}

fn retry_after(r: &Response<Body>) -> Option<i64> {
    r.headers().get("retry-after").map(|v| v.to_str().unwrap().parse().expect("Retry-After in seconds"))
}

/// Every algorithm with a quota of `limit` that nothing refills while a test runs, as policy
/// JSON, with the seconds a whole quota takes to come back (`w`).
fn every_algorithm(limit: i64) -> Vec<(String, i64)> {
    let algorithms = [
        // Windows are aligned to the Unix epoch: the longest one is never crossed in a run.
        Algorithm::FixedWindow { limit, window_ms: 1_000_000_000_000 },
        Algorithm::SlidingWindow { limit, window_ms: 3_600_000 },
        Algorithm::TokenBucket { capacity: limit, refill: 1, interval_ms: 3_600_000 },
        Algorithm::Gcra { rate: 1, period_ms: 3_600_000, burst: limit },
    ];
    algorithms
        .into_iter()
        .map(|a| match a {
            Algorithm::FixedWindow { limit, window_ms } | Algorithm::SlidingWindow { limit, window_ms } => {
                let name = if matches!(a, Algorithm::FixedWindow { .. }) { "fixed" } else { "sliding" };
                (format!(r#""algorithm": "{name}", "limit": {limit}, "window_ms": {window_ms}"#), window_ms / 1000)
            }
            Algorithm::TokenBucket { capacity, refill, interval_ms } => (
                format!(
                    r#""algorithm": "bucket", "capacity": {capacity}, "refill": {refill}, "interval_ms": {interval_ms}"#
                ),
                (capacity + refill - 1) / refill * interval_ms / 1000,
            ),
            Algorithm::Gcra { rate, period_ms, burst } => (
                format!(r#""algorithm": "gcra", "rate": {rate}, "period_ms": {period_ms}, "burst": {burst}"#),
                (burst * period_ms + rate - 1) / rate / 1000,
            ),
        })
        .collect()
}

#[tokio::test]
async fn allowed_answers_carry_the_headers_and_the_one_past_the_limit_is_429() {
    let redis = RedisServer::start();
    for (settings, window_s) in every_algorithm(3) {
        let app = direct_app(&redis, &policy(&settings)).await;
        let key = uid("k");
        for i in 0..3 {
            let r = send(&app, request("/hello", &key)).await;
            assert_eq!(r.status(), StatusCode::OK, "{settings}: call {i}");
            assert_eq!(param(&r, "ratelimit-policy", "q"), Some(3), "{settings}");
            assert_eq!(param(&r, "ratelimit-policy", "w"), Some(window_s), "{settings}");
            assert_eq!(param(&r, "ratelimit", "r"), Some(2 - i), "{settings}: call {i}");
            let t = param(&r, "ratelimit", "t").unwrap();
            assert!((1..=window_s).contains(&t), "{settings}: t={t}");
            assert_eq!(retry_after(&r), None, "{settings}: an allowed answer has no Retry-After");
            assert_eq!(body(r).await, format!("hello ({} left)\n", 2 - i), "the handler saw the decision");
        }
        let r = send(&app, request("/hello", &key)).await;
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS, "{settings}");
        let wait = retry_after(&r).expect("Retry-After on a 429");
        assert!(wait >= 1, "{settings}: Retry-After {wait}");
        assert_eq!(param(&r, "ratelimit", "r"), Some(0), "{settings}");
        assert_eq!(param(&r, "ratelimit", "t"), Some(wait), "{settings}: t is the wait on a denial");
        assert_eq!(param(&r, "ratelimit-policy", "q"), Some(3), "{settings}");
        assert!(matches!(r.extensions().get::<Decision>(), Some(Decision::Counted(o)) if !o.allowed));
        assert_eq!(body(r).await, "", "{settings}: the handler did not run");
        // Another key has a quota of its own.
        assert_eq!(send(&app, request("/hello", &uid("other"))).await.status(), StatusCode::OK);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_hundred_concurrent_requests_against_a_limit_of_100_admit_exactly_100() {
    let redis = RedisServer::start();
    for (settings, _) in every_algorithm(100) {
        let app = direct_app(&redis, &policy(&settings)).await;
        let key = uid("storm");
        let calls: Vec<_> = (0..500).map(|_| tokio::spawn(send_owned(app.clone(), request("/hello", &key)))).collect();
        let mut by_status: HashMap<StatusCode, usize> = HashMap::new();
        let mut remaining = Vec::new();
        for call in calls {
            let r = call.await.unwrap();
            if r.status() == StatusCode::OK {
                remaining.push(param(&r, "ratelimit", "r").unwrap());
            }
            *by_status.entry(r.status()).or_default() += 1;
        }
        assert_eq!(by_status.get(&StatusCode::OK), Some(&100), "{settings}: {by_status:?}");
        assert_eq!(by_status.get(&StatusCode::TOO_MANY_REQUESTS), Some(&400), "{settings}: {by_status:?}");
        // Each admitted call saw its own remainder: 99 down to 0, once each.
        remaining.sort_unstable();
        assert_eq!(remaining, (0..100).collect::<Vec<i64>>(), "{settings}");
    }
}

async fn send_owned(app: Router, req: Request<Body>) -> Response<Body> {
    app.oneshot(req).await.unwrap()
}

#[tokio::test]
async fn keys_from_a_header_the_peer_address_and_a_signed_in_user_are_counted_apart() {
    let redis = RedisServer::start();
    let config = policy(r#""limit": 1, "window_ms": 1000000000000"#);
    let peer = |ip: &str| {
        let mut req = Request::get("/hello").body(Body::empty()).unwrap();
        req.extensions_mut().insert(ConnectInfo(SocketAddr::new(ip.parse().unwrap(), 40_000)));
        req
    };
    // The example's extractor: the API key, else the address.
    let app = direct_app(&redis, &config).await;
    let (ip, key) = ("203.0.113.7", uid("key"));
    assert_eq!(send(&app, peer(ip)).await.status(), StatusCode::OK);
    assert_eq!(send(&app, peer(ip)).await.status(), StatusCode::TOO_MANY_REQUESTS, "one address, one quota");
    assert_eq!(send(&app, peer("2001:db8::1")).await.status(), StatusCode::OK, "another address");
    let mut keyed = peer(ip);
    keyed.headers_mut().insert("x-api-key", key.parse().unwrap());
    assert_eq!(send(&app, keyed).await.status(), StatusCode::OK, "an API key counts apart from its address");
    assert_eq!(send(&app, request("/hello", &key)).await.status(), StatusCode::TOO_MANY_REQUESTS);
    // The address is counted under its hashed subject, in the key the HTTP API uses for it.
    let stored: bool =
        redis::cmd("EXISTS").arg(format!("rc:{{u:{}}}:q:{POLICY}:fw", subject(ip))).query(&mut redis.conn()).unwrap();
    assert!(stored, "the quota of {ip} is under `{}`", subject(ip));

    // A user left by an authentication layer outside the limit.
    let policy = QuotaPolicy::from_config(&config, POLICY).unwrap();
    let by_user = axum_ratelimit::app(RateLimitLayer::new(redis.direct().await, policy, axum_ratelimit::user));
    let signed_in = |name: &str| {
        let mut req = Request::get("/hello").header("x-api-key", &key).body(Body::empty()).unwrap();
        req.extensions_mut().insert(User(name.to_owned()));
        req
    };
    let (ann, bob) = (uid("ann"), uid("bob"));
    assert_eq!(send(&by_user, signed_in(&ann)).await.status(), StatusCode::OK, "the user, not the spent API key");
    assert_eq!(send(&by_user, signed_in(&ann)).await.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(send(&by_user, signed_in(&bob)).await.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_request_without_a_key_is_refused_and_not_counted() {
    let redis = RedisServer::start();
    let config = policy(r#""limit": 1, "window_ms": 1000000000000"#);
    let app = direct_app(&redis, &config).await;
    let r = send(&app, Request::get("/hello").body(Body::empty()).unwrap()).await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert_eq!(r.extensions().get::<Decision>(), Some(&Decision::NoKey));
    assert!(r.headers().get("ratelimit").is_none());
    assert_eq!(redis.calls("evalsha") + redis.calls("eval"), 0, "Redis was not asked");

    let policy = QuotaPolicy::from_config(&config, POLICY).unwrap();
    let app = axum_ratelimit::app(
        RateLimitLayer::new(redis.direct().await, policy, axum_ratelimit::user).missing_key(StatusCode::UNAUTHORIZED),
    );
    let r = send(&app, request("/hello", "some-key")).await;
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn each_request_costs_what_its_route_costs() {
    let redis = RedisServer::start();
    let app = direct_app(&redis, &policy(r#""limit": 12, "window_ms": 1000000000000"#)).await;
    let key = uid("cost");
    for left in [7, 2] {
        let r = send(&app, request("/search", &key)).await;
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(param(&r, "ratelimit", "r"), Some(left), "a search costs 5");
    }
    let r = send(&app, request("/search", &key)).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS, "5 more than the 2 left");
    assert_eq!(param(&r, "ratelimit", "r"), Some(2), "a denied call costs nothing");
    let r = send(&app, request("/hello", &key)).await;
    assert_eq!((r.status(), param(&r, "ratelimit", "r")), (StatusCode::OK, Some(1)), "a hello costs 1");

    // Free: passed without asking Redis, so without RateLimit headers.
    let before = redis.calls("evalsha");
    let r = send(&app, request("/health", &key)).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.extensions().get::<Decision>(), Some(&Decision::Free));
    assert!(r.headers().get("ratelimit").is_none());
    assert_eq!(redis.calls("evalsha"), before);

    // More than the whole quota: never admitted, so no Retry-After, but the quota's size.
    let small = direct_app(&redis, &policy(r#""limit": 4, "window_ms": 1000000000000"#)).await;
    let r = send(&small, request("/search", &uid("big"))).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(retry_after(&r), None);
    assert_eq!(param(&r, "ratelimit-policy", "q"), Some(4));
    assert_eq!(r.extensions().get::<Decision>(), Some(&Decision::TooCostly { cost: 5, limit: 4 }));
}

/// Redis paused (SIGSTOP): it accepts and never answers. The policy's time bound ends the
/// wait, and its failure mode answers.
#[tokio::test]
async fn redis_stopped_gets_the_declared_failure_mode_within_the_timeout() {
    let redis = RedisServer::start();
    let bound = Duration::from_millis(300);
    let deny = direct_app(&redis, &policy(r#""limit": 5, "window_ms": 60000, "timeout_ms": 300"#)).await;
    let allow =
        direct_app(&redis, &policy(r#""limit": 5, "window_ms": 60000, "timeout_ms": 300, "on_unavailable": "allow""#))
            .await;
    let key = uid("paused");
    assert_eq!(send(&deny, request("/hello", &key)).await.status(), StatusCode::OK, "connected first");
    assert_eq!(send(&allow, request("/hello", &key)).await.status(), StatusCode::OK);
    let _stopped = Stopped::stop(redis.pid());
    for (app, want) in [(&deny, StatusCode::SERVICE_UNAVAILABLE), (&allow, StatusCode::OK)] {
        let started = Instant::now();
        let r = send(app, request("/hello", &key)).await;
        let took = started.elapsed();
        assert_eq!(r.status(), want);
        assert!(took >= bound && took < bound + Duration::from_secs(1), "answered after {took:?}, bound {bound:?}");
        assert!(r.headers().get("ratelimit").is_none(), "no count is known");
        if want == StatusCode::OK {
            assert!(matches!(r.extensions().get::<Decision>(), Some(Decision::Unavailable { allowed: true, .. })));
            assert_eq!(body(r).await, "hello\n", "passed to the handler");
        } else {
            assert!(matches!(r.extensions().get::<Decision>(), Some(Decision::Unavailable { allowed: false, .. })));
            assert_eq!(body(r).await, "");
        }
    }
}

/// Redis gone (killed: connections refused): the same failure modes, with no wait.
#[tokio::test]
async fn redis_gone_gets_the_declared_failure_mode() {
    let mut redis = RedisServer::start();
    let deny = direct_app(&redis, &policy(r#""limit": 5, "window_ms": 60000"#)).await;
    let allow = direct_app(&redis, &policy(r#""limit": 5, "window_ms": 60000, "on_unavailable": "allow""#)).await;
    redis.kill();
    let key = uid("gone");
    for _ in 0..3 {
        let r = send(&deny, request("/hello", &key)).await;
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(matches!(r.extensions().get::<Decision>(), Some(Decision::Unavailable { allowed: false, .. })));
        let r = send(&allow, request("/hello", &key)).await;
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(body(r).await, "hello\n");
    }
}

#[tokio::test]
async fn the_policy_json_and_namespace_of_the_http_api_name_the_same_keys() {
    let redis = RedisServer::start();
    let policies =
        format!(r#"{{"{POLICY}": {{"kind": "quota", "algorithm": "sliding", "limit": 2, "window_ms": 60000}}}}"#);
    let app = direct_app(&redis, &config(&policies, &[("REDCOUNT_NAMESPACE", "app2")])).await;
    let key = uid("ns");
    assert_eq!(send(&app, request("/hello", &key)).await.status(), StatusCode::OK);
    let mut conn = redis.conn();
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut conn).unwrap();
    assert_eq!(keys, [format!("app2:{{u:{key}}}:q:{POLICY}:sw")]);
}

/// Through an Upstash-compatible REST front (`Rest`), as from a host with no RESP access.
#[tokio::test]
async fn over_the_rest_driver() {
    let redis = RedisServer::start();
    let front = RestFront::start(&redis.url(), false);
    let rest = redcount::Rest::new(&front.url(), &front.token, Duration::from_secs(5)).unwrap();
    let app = app(limit(rest, &policy(r#""algorithm": "gcra", "rate": 1, "period_ms": 3600000, "burst": 2"#)).unwrap());
    let key = uid("rest");
    for left in [1, 0] {
        let r = send(&app, request("/hello", &key)).await;
        assert_eq!((r.status(), param(&r, "ratelimit", "r")), (StatusCode::OK, Some(left)));
    }
    let r = send(&app, request("/hello", &key)).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(retry_after(&r).unwrap() > 1000, "one unit an hour");
}

/// Plain tower, a response body of another type (`String`), and an inner service that is
/// ready only when a slot is free: the layer is ready when it is, and calls the very service
/// that was polled ready (a clone would hold no slot and panic).
#[tokio::test]
async fn plain_tower_readiness_is_the_inner_services() {
    use tower::{Service, ServiceBuilder};
    let redis = RedisServer::start();
    let policy = QuotaPolicy::new("tower", Algorithm::FixedWindow { limit: 3, window_ms: 1_000_000_000_000 }).unwrap();
    let layer = RateLimitLayer::new(redis.direct().await, policy, |_| Some("one".to_owned()));
    let (release, held) = tokio::sync::watch::channel(false);
    let mut svc = ServiceBuilder::new().layer(layer).concurrency_limit(1).service_fn(move |req: Request<String>| {
        let mut held = held.clone();
        async move {
            if req.body() == "hold" {
                held.wait_for(|released| *released).await.unwrap();
            }
            Ok::<_, std::convert::Infallible>(Response::new(String::from("done")))
        }
    });
    let first = svc.ready().await.unwrap().call(Request::new("hold".to_owned()));
    let first = tokio::spawn(first);
    // The one slot is taken: not ready.
    assert!(tokio::time::timeout(Duration::from_millis(200), svc.ready()).await.is_err(), "ready with no slot");
    release.send(true).unwrap();
    let r = first.await.unwrap().unwrap();
    assert_eq!((r.status(), r.body().as_str()), (StatusCode::OK, "done"));
    assert!(r.headers()["ratelimit"].to_str().unwrap().starts_with(r#""tower";r=2;t="#), "{:?}", r.headers());
    let r = svc.ready().await.unwrap().call(Request::new(String::new())).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    svc.ready().await.unwrap().call(Request::new(String::new())).await.unwrap();
    let r = svc.ready().await.unwrap().call(Request::new(String::new())).await.unwrap();
    assert_eq!((r.status(), r.body().as_str()), (StatusCode::TOO_MANY_REQUESTS, ""));
    // The slot the denied call was polled ready with is free again.
    let r = tokio::time::timeout(Duration::from_secs(5), svc.ready()).await;
    assert!(r.is_ok(), "the denied call kept its slot");
}

/// A random sequence of requests (keys of any text, from a small pool so they repeat; costs
/// from 0 to past the limit; some with no key) with Redis killed and restarted empty now and
/// then, checked against a model: per key, what is used of a window that never ends. Any
/// panic, any answer other than the model's, any two keys that share a count fails it.
/// `REDCOUNT_SEED` replays a run.
#[tokio::test]
async fn random_requests_with_restarts_match_the_model() {
    const LIMIT: i64 = 20;
    let seed: u64 = std::env::var("REDCOUNT_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand::random);
    eprintln!("random_requests_with_restarts_match_the_model: REDCOUNT_SEED={seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut redis = RedisServer::start();
    let policy = QuotaPolicy::new(POLICY, Algorithm::FixedWindow { limit: LIMIT, window_ms: 1_000_000_000_000 })
        .unwrap()
        .timeout(Duration::from_millis(500))
        .on_unavailable(OnUnavailable::Deny);
    let layer = RateLimitLayer::new(redis.direct().await, policy, axum_ratelimit::user)
        .cost(|req| req.headers.get("x-cost").and_then(|v| v.to_str().ok()?.parse().ok()).unwrap_or(1));
    let app = app(layer);
    // Keys of every shape: ids, ids that start with `_`, text, long text, near-duplicates.
    let mut pool: Vec<String> = vec!["alice".into(), "_alice".into(), "Alice".into(), "a".repeat(64), "a".repeat(65)];
    for _ in 0..5 {
        let len = rng.random_range(1..80);
        pool.push((0..len).map(|_| rng.random::<char>()).collect());
    }
    pool.push(subject(&pool[pool.len() - 1]).into_owned()); // a key spelled as another's subject
    let mut used: HashMap<String, i64> = HashMap::new();
    for step in 0..400 {
        if rng.random_ratio(1, 100) {
            redis.kill();
            let r = send(&app, as_user(Some(&pool[0]), 1)).await;
            assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE, "step {step}: Redis is gone");
            redis.restart();
            used.clear();
            wait_until_answered(&app).await;
            continue;
        }
        let key = rng.random_ratio(9, 10).then(|| pool[rng.random_range(0..pool.len())].clone());
        let cost = rng.random_range(0..=LIMIT / 2 + 1) + if rng.random_ratio(1, 20) { LIMIT } else { 0 };
        let r = send(&app, as_user(key.as_deref(), cost)).await;
        let Some(key) = key else {
            assert_eq!(r.status(), StatusCode::BAD_REQUEST, "step {step}: no key");
            continue;
        };
        let spent = used.entry(key.clone()).or_default();
        let what = format!("step {step}: key {key:?} cost {cost}, {spent} used");
        if cost == 0 {
            assert_eq!(r.status(), StatusCode::OK, "{what}");
        } else if cost > LIMIT {
            assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS, "{what}");
            assert_eq!(retry_after(&r), None, "{what}");
        } else if *spent + cost <= LIMIT {
            *spent += cost;
            assert_eq!(r.status(), StatusCode::OK, "{what}");
            assert_eq!(param(&r, "ratelimit", "r"), Some(LIMIT - *spent), "{what}");
        } else {
            assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS, "{what}");
            assert_eq!(param(&r, "ratelimit", "r"), Some(LIMIT - *spent), "{what}");
            assert!(retry_after(&r).unwrap() >= 1, "{what}");
        }
    }
}

fn as_user(key: Option<&str>, cost: i64) -> Request<Body> {
    let mut req = Request::get("/hello").header("x-cost", cost.to_string()).body(Body::empty()).unwrap();
    if let Some(key) = key {
        req.extensions_mut().insert(User(key.to_owned()));
    }
    req
}

/// Waits until Redis answers the layer again (a key outside the model's pool).
async fn wait_until_answered(app: &Router) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while send(app, as_user(Some("probe-after-restart"), 1)).await.status() == StatusCode::SERVICE_UNAVAILABLE {
        assert!(Instant::now() < deadline, "Redis did not answer again after its restart");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The README's "From axum" snippet is `quick_start`'s body, which compiles.
#[test]
fn the_readme_quick_start_is_the_compiled_one() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let after = readme.split_once("### From axum").expect("README: a `### From axum` section").1;
    let snippet = after.split_once("```rust\n").unwrap().1.split_once("```").unwrap().0;
    let lib = std::fs::read_to_string(root.join("examples/axum-ratelimit/src/lib.rs")).unwrap();
    let body =
        lib.split_once("// README from axum: begin\n").unwrap().1.split_once("    // README from axum: end").unwrap().0;
    let body: String = body.lines().map(|l| format!("{}\n", l.strip_prefix("    ").unwrap_or(l))).collect();
    assert_eq!(
        snippet, body,
        "README.md's \"From axum\" and quick_start() in examples/axum-ratelimit/src/lib.rs differ"
    );
}
