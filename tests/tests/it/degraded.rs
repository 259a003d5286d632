//! Declared failure modes: when Redis or the REST front does not answer (in the policy's
//! `timeout_ms`), a decision route answers what its policy declared, marked
//! `"degraded": true` with the reason; never a silent allow, and money and lease paths always
//! refuse. Through `redcount serve` (Redis paused; the front killed) and the worker.

use std::process::Command;
use std::time::{Duration, Instant};

use redcount_tests::{NativeServer, RedisServer, RestFront, Workerd, secret};
use serde_json::Value;

const POLICIES: &str = r#"{
  "q-open": {"kind": "quota", "algorithm": "fixed", "limit": 5, "window_ms": 3600000,
             "on_unavailable": "allow", "timeout_ms": 300},
  "q-shut": {"kind": "quota", "algorithm": "gcra", "rate": 5, "period_ms": 3600000, "burst": 5,
             "on_unavailable": "deny", "timeout_ms": 300},
  "c-open": {"kind": "claim", "window_ms": 3600000, "on_unavailable": "allow", "timeout_ms": 300},
  "slots":  {"kind": "semaphore", "limit": 2, "lease_ms": 60000, "timeout_ms": 300},
  "jobs":   {"kind": "counter", "min": 0, "timeout_ms": 300},
  "packets": {"kind": "redpackets", "max_shares": 10, "max_total_cents": 1000, "ttl_ms": 60000,
              "timeout_ms": 300}
}"#;

async fn post(base: &str, path: &str, body: &str) -> (u16, Value) {
    let r = redcount_tests::http().post(format!("{base}{path}")).body(body.to_string()).send().await.unwrap();
    let status = r.status().as_u16();
    (status, serde_json::from_str(&r.text().await.unwrap()).unwrap_or(Value::Null))
}

/// The answers of every kind of route while the backend does not answer.
async fn check_degraded(base: &str, log: impl Fn() -> String) {
    let (s, v) = post(base, "/api/quotas/q-open/u1", "").await;
    assert_eq!((s, &v["allowed"], &v["degraded"]), (200, &Value::Bool(true), &Value::Bool(true)), "{v}\n{}", log());
    assert!(v["reason"].as_str().is_some_and(|r| !r.is_empty()), "{v}");
    // The same route and policy with their names percent-encoded: routing decodes them, and
    // so does the choice of the declared answer.
    for path in ["/api/quot%61s/q-open/u1", "/api/quotas/q%2Dopen/u1"] {
        let (s, v) = post(base, path, "").await;
        assert_eq!((s, &v["allowed"], &v["degraded"]), (200, &Value::Bool(true), &Value::Bool(true)), "{path}: {v}");
    }
    let (s, v) = post(base, "/api/quotas/q-shut/u1", "").await;
    assert_eq!((s, &v["allowed"], &v["degraded"]), (503, &Value::Bool(false), &Value::Bool(true)), "{v}");
    // A denied answer is not "not charged": the call may still run when Redis answers.
    assert_eq!(v["may_have_run"], Value::Bool(true), "{v}");
    assert!(v["reason"].as_str().unwrap().contains("may still be applied"), "{v}");
    let (s, v) = post(base, "/api/claims/c-open/u1", "").await;
    assert_eq!((s, &v["claimed"], &v["degraded"]), (200, &Value::Bool(true), &Value::Bool(true)), "{v}");
    // A lease cannot be granted without Redis; a counter is money: both refuse.
    let (s, v) = post(base, "/api/semaphores/slots/s1/acquire", r#"{"holder":"h1"}"#).await;
    assert_eq!((s, &v["holding"], &v["degraded"]), (503, &Value::Bool(false), &Value::Bool(true)), "{v}");
    // A decision passes degraded only when every part declares allow (and none is a lease).
    let (s, v) = post(base, "/api/decisions/u1", r#"{"parts":[{"policy":"q-open"}]}"#).await;
    assert_eq!((s, &v["allowed"], &v["degraded"]), (200, &Value::Bool(true), &Value::Bool(true)), "{v}");
    let (s, v) = post(base, "/api/decisions/u1", r#"{"parts":[{"policy":"q-open"},{"policy":"q-shut"}]}"#).await;
    assert_eq!((s, &v["allowed"], &v["degraded"]), (503, &Value::Bool(false), &Value::Bool(true)), "{v}");
    let (s, v) =
        post(base, "/api/decisions/u1", r#"{"parts":[{"policy":"q-open"},{"policy":"slots","holder":"h1"}]}"#).await;
    assert_eq!((s, &v["allowed"], &v["degraded"]), (503, &Value::Bool(false), &Value::Bool(true)), "{v}");
    // Every call of a policy waits at most its timeout_ms (300 ms here; the servers' own bound is
    // seconds), decision or not: a counter, a red packet's create and a grab of a packet by id
    // (bounded by its kind's policies).
    let started = Instant::now();
    let (s, v) = post(base, "/api/counters/jobs/j1", r#"{"delta":1}"#).await;
    assert_eq!(s, 503, "{v}");
    assert!(v.get("degraded").is_none() && v.get("allowed").is_none(), "a counter is never degraded to a pass: {v}");
    let (s, v) = post(base, "/api/redpackets", r#"{"total_cents":100,"count":2}"#).await;
    assert_eq!(s, 503, "{v}");
    let (s, v) = post(base, "/api/redpackets/0123456789abcdef0123456789abcdef/grab", r#"{"user":"u1"}"#).await;
    assert_eq!(s, 503, "{v}");
    assert!(started.elapsed() < Duration::from_millis(2500), "{:?} for three calls of 300 ms", started.elapsed());
}

fn redis_pid(redis: &RedisServer) -> u32 {
    let info: String = redis::cmd("INFO").arg("server").query(&mut redis.conn()).unwrap();
    info.lines().find_map(|l| l.strip_prefix("process_id:")).unwrap().trim().parse().unwrap()
}

/// SIGCONT on drop, so a failed assertion leaves no Redis stopped.
struct Paused(u32);

impl Drop for Paused {
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["-CONT", &self.0.to_string()]).status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_redis_gets_each_policys_declared_answer_within_its_timeout() {
    let redis = RedisServer::start();
    let admin = secret("admin");
    let server = NativeServer::start(&[("REDIS_URL", &redis.url())], &admin, POLICIES);
    let base = server.url();
    // While Redis answers, nothing is degraded.
    let (s, v) = post(&base, "/api/quotas/q-open/u0", "").await;
    assert_eq!((s, v.get("degraded")), (200, None), "{v}");
    let (s, v) = post(&base, "/api/semaphores/slots/s0/acquire", r#"{"holder":"h0"}"#).await;
    assert_eq!((s, &v["result"]), (200, &Value::from("acquired")), "{v}");
    let pid = redis_pid(&redis);
    assert!(Command::new("kill").args(["-STOP", &pid.to_string()]).status().unwrap().success());
    let paused = Paused(pid);
    let t = Instant::now();
    let (s, v) = post(&base, "/api/quotas/q-open/u1", "").await;
    let took = t.elapsed();
    assert_eq!((s, &v["degraded"]), (200, &Value::Bool(true)), "{v}");
    assert!(v["reason"].as_str().unwrap().contains("timeout_ms (300 ms)"), "{v}");
    assert!(took < Duration::from_millis(1500), "answered after {took:?}, its policy says 300 ms");
    // The counter has no timeout_ms: it waits out the server's own bound.
    check_degraded(&base, || server.log()).await;
    drop(paused);
    // Redis back: real answers again.
    let (s, v) = post(&base, "/api/quotas/q-shut/u2", "").await;
    assert_eq!((s, &v["allowed"], v.get("degraded")), (200, &Value::Bool(true), None), "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_front_gets_each_policys_declared_answer_native_and_worker() {
    let redis = RedisServer::start();
    let mut front = RestFront::start(&redis.url(), false);
    let admin = secret("admin");
    let server = NativeServer::start(
        &[("REDCOUNT_REST_URL", &front.url()), ("REDCOUNT_REST_TOKEN", &front.token)],
        &admin,
        POLICIES,
    );
    let worker = Workerd::start(&[
        ("REDCOUNT_REST_URL", &front.url()),
        ("REDCOUNT_REST_TOKEN", &front.token),
        ("REDCOUNT_ADMIN_TOKEN", &admin),
        ("REDCOUNT_POLICIES", POLICIES),
    ]);
    for base in [server.url(), worker.url()] {
        let (s, v) = post(&base, "/api/quotas/q-open/u0", "").await;
        assert_eq!((s, v.get("degraded")), (200, None), "{base}: {v}");
    }
    front.kill();
    check_degraded(&server.url(), || server.log()).await;
    check_degraded(&worker.url(), || worker.log()).await;
}

/// A front that takes connections and then says nothing (`head`: nothing at all; else a
/// reply's head and first byte, the rest never sent), its sockets held open until dropped.
struct Silent {
    port: u16,
    _held: std::thread::JoinHandle<()>,
}

impl Silent {
    fn start(head: bool) -> Silent {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let held = std::thread::spawn(move || {
            let mut open = Vec::new();
            for mut s in listener.incoming().flatten() {
                if head {
                    use std::io::Write;
                    let _ = s
                        .write_all(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 64\r\n\r\n{");
                }
                open.push(s);
            }
        });
        Silent { port, _held: held }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_front_gets_the_workers_declared_answer_within_its_timeout() {
    // The worker's bound covers the REST call whole: no answer at all, and an answer whose body
    // stops after its head.
    for head in [false, true] {
        let silent = Silent::start(head);
        let worker = Workerd::start(&[
            ("REDCOUNT_REST_URL", &format!("http://127.0.0.1:{}", silent.port)),
            ("REDCOUNT_REST_TOKEN", &secret("rest")),
            ("REDCOUNT_ADMIN_TOKEN", &secret("admin")),
            ("REDCOUNT_POLICIES", POLICIES),
        ]);
        let base = worker.url();
        let t = Instant::now();
        let (s, v) = post(&base, "/api/quotas/q-open/u0", "").await;
        let took = t.elapsed();
        assert_eq!((s, &v["degraded"]), (200, &Value::Bool(true)), "head {head}: {v}\n{}", worker.log());
        assert!(v["reason"].as_str().unwrap().contains("timed out"), "head {head}: {v}");
        assert!(took < Duration::from_millis(1500), "head {head}: answered after {took:?}, its policy says 300 ms");
        check_degraded(&base, || worker.log()).await;
    }
}
