//! Faults on purpose: Redis SIGKILLed in the middle of a red-packet storm (AOF, fsync
//! always), the REST front killed under load, a Redis that stops answering.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redcount_core::keys;
use redcount_tests::{RedisServer, RestFront, TEST_POLICIES, Workerd, secret};
use serde_json::{Value, json};

fn worker_for(front: &RestFront, admin: &str) -> Workerd {
    Workerd::start(&[
        ("REDCOUNT_REST_URL", &front.url()),
        ("REDCOUNT_REST_TOKEN", &front.token),
        ("REDCOUNT_ADMIN_TOKEN", admin),
        ("REDCOUNT_POLICIES", TEST_POLICIES),
    ])
}

async fn post(http: &reqwest::Client, url: String, body: String) -> (u16, Value) {
    match http.post(url).body(body).send().await {
        Ok(r) => {
            let status = r.status().as_u16();
            let text = r.text().await.unwrap_or_default();
            // Not JSON: keep the text, so a failure shows what came back.
            (status, serde_json::from_str(&text).unwrap_or_else(|_| json!({ "not_json": text })))
        }
        // Status 0: no HTTP answer at all (the error says why).
        Err(e) => (0, Value::String(e.to_string())),
    }
}

/// Every user of a storm keeps grabbing until it gets an answer (grabs are idempotent per
/// user, so a retry after a 503 is safe). Returns what each user was told, and every
/// non-200 status seen on the way.
async fn storm_until_answered<T>(
    base: String,
    id: String,
    users: usize,
    fault: impl std::future::Future<Output = T>,
) -> (BTreeMap<usize, Value>, Vec<(u16, Value)>, T) {
    let http = redcount_tests::http_builder().timeout(Duration::from_secs(20)).build().unwrap();
    let failures = Arc::new(std::sync::Mutex::new(Vec::new()));
    let tasks: Vec<_> = (0..users)
        .map(|i| {
            let (http, base, id, failures) = (http.clone(), base.clone(), id.clone(), failures.clone());
            tokio::spawn(async move {
                // Spread the storm over about a second, so the fault lands in its middle.
                tokio::time::sleep(Duration::from_millis((i as u64 * 1000) / users as u64)).await;
                let deadline = Instant::now() + Duration::from_secs(60);
                loop {
                    let (status, j) =
                        post(&http, format!("{base}/api/redpackets/{id}/grab"), format!(r#"{{"user":"u{i}"}}"#)).await;
                    if status == 200 {
                        return (i, j);
                    }
                    failures.lock().unwrap().push((status, j));
                    assert!(Instant::now() < deadline, "user {i} never got an answer");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            })
        })
        .collect();
    let handed_back = fault.await;
    let mut told = BTreeMap::new();
    for t in tasks {
        let (i, j) = t.await.unwrap();
        told.insert(i, j);
    }
    let f = failures.lock().unwrap().clone();
    (told, f, handed_back)
}

/// What the clients were told against what Redis holds, after everything.
fn reconcile(redis: &RedisServer, id: &str, told: &BTreeMap<usize, Value>, shares: usize, total: i64) {
    let claims: BTreeMap<String, String> =
        redis::cmd("HGETALL").arg(&keys::redpacket(id)[2]).query(&mut redis.conn()).unwrap();
    let mut indexes = BTreeSet::new();
    let mut sum = 0;
    for v in claims.values() {
        let (amount, index) = v.split_once(':').unwrap();
        assert!(indexes.insert(index.to_string()), "share {index} issued twice");
        sum += amount.parse::<i64>().unwrap();
    }
    assert_eq!(claims.len(), shares, "every share claimed exactly once");
    assert_eq!(sum, total);
    for (i, j) in told {
        let user = format!("u{i}");
        match j["outcome"].as_str() {
            Some("won") | Some("already") => {
                let stored = claims.get(&user).unwrap_or_else(|| panic!("acknowledged claim of {user} was lost"));
                assert_eq!(
                    stored.split(':').next().unwrap(),
                    j["amount"].to_string(),
                    "{user} was told another amount"
                );
            }
            Some("empty") => assert!(!claims.contains_key(&user), "{user} was told empty but holds a share"),
            other => panic!("{user}: {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_killed_mid_storm_loses_no_acknowledged_claim() {
    let redis = RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    let front = RestFront::start_with(&redis.url(), false, &["--timeout-ms", "2000"]);
    let admin = secret("admin");
    let worker = worker_for(&front, &admin);
    let http = redcount_tests::http();
    let (_, made) =
        post(&http, format!("{}/api/redpackets", worker.url()), r#"{"total_cents":100000,"count":300}"#.into()).await;
    let id = made["id"].as_str().expect("packet").to_string();

    let fault = async move {
        let mut redis = redis;
        tokio::time::sleep(Duration::from_millis(400)).await;
        redis.kill(); // SIGKILL: nothing flushed beyond what fsync already wrote
        tokio::time::sleep(Duration::from_millis(700)).await;
        redis.restart(); // same port, same AOF
        redis
    };
    let (told, failures, redis) = storm_until_answered(worker.url(), id.clone(), 600, fault).await;
    assert!(failures.iter().any(|(s, _)| *s == 503), "the kill landed while requests were in flight");
    for (status, j) in &failures {
        assert_eq!(*status, 503, "while Redis was down: a clear 503, nothing else: {j}");
        assert!(j["error"].as_str().is_some_and(|e| e.contains("unavailable") || e.contains("unreachable")), "{j}");
    }
    reconcile(&redis, &id, &told, 300, 100_000);
    let won = told.values().filter(|j| j["outcome"] == "won" || j["outcome"] == "already").count();
    assert_eq!(won, 300);
    println!("{} grabs failed with 503 while Redis was down and succeeded on retry", failures.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rest_front_killed_under_load_then_back() {
    let redis = RedisServer::start();
    let front = RestFront::start(&redis.url(), false);
    let admin = secret("admin");
    let worker = worker_for(&front, &admin);
    let http = redcount_tests::http();
    let (_, made) =
        post(&http, format!("{}/api/redpackets", worker.url()), r#"{"total_cents":50000,"count":200}"#.into()).await;
    let id = made["id"].as_str().expect("packet").to_string();
    let fault = async move {
        let mut front = front;
        tokio::time::sleep(Duration::from_millis(400)).await;
        front.kill();
        tokio::time::sleep(Duration::from_millis(700)).await;
        front.restart();
        front
    };
    let (told, failures, _front) = storm_until_answered(worker.url(), id.clone(), 400, fault).await;
    assert!(!failures.is_empty(), "the front went down while requests were in flight");
    assert!(failures.iter().all(|(s, _)| *s == 503), "only 503s while the front was down: {failures:?}");
    reconcile(&redis, &id, &told, 200, 50_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_stops_answering_times_out_within_the_bound() {
    let redis = RedisServer::start_with(&["--enable-debug-command", "local"]);
    let front = RestFront::start_with(&redis.url(), false, &["--timeout-ms", "1000"]);
    let admin = secret("admin");
    let worker = worker_for(&front, &admin);
    let http = redcount_tests::http();
    let url = redis.url();
    let sleeper = std::thread::spawn(move || {
        let mut c = redis::Client::open(url).unwrap().get_connection().unwrap();
        redis::cmd("DEBUG").arg("SLEEP").arg("3").query::<()>(&mut c).unwrap();
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let t = Instant::now();
    let (status, j) = post(&http, format!("{}/api/quotas/daily-prize/slow", worker.url()), "{}".into()).await;
    let took = t.elapsed();
    assert_eq!(status, 503, "{j}");
    assert!(j["error"].as_str().unwrap().contains("did not answer within 1000 ms"), "{j}");
    assert!(took < Duration::from_millis(2500), "answered after {took:?}, not within the bound");
    sleeper.join().unwrap();
    // Redis answers again: so does everything else, without restarts.
    let (status, _) = post(&http, format!("{}/api/quotas/daily-prize/slow", worker.url()), "{}".into()).await;
    assert_eq!(status, 200);
}

/// The REST front and `redcount serve` before `redis`, each waiting at most 800 ms for it.
fn front_and_native(redis: &RedisServer) -> (RestFront, redcount_tests::NativeServer) {
    let front = RestFront::start_with(&redis.url(), false, &["--timeout-ms", "800"]);
    let native = redcount_tests::NativeServer::start_with(
        &[("REDIS_URL", &redis.url())],
        &secret("admin"),
        TEST_POLICIES,
        &["--timeout-ms", "800"],
    );
    (front, native)
}

/// A Redis restarting with a large dataset answers LOADING to everything while it loads: the
/// front waits for it within its timeout, then says 503 (try again), not 400 (your command
/// is wrong); the native server says 503 too. Once loaded, both serve again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_loading_its_data_is_unavailable_not_a_bad_request() {
    // Loading sleeps 1 ms per key: 5,000 keys take about 5 s, answering LOADING meanwhile
    // (Redis looks at its clients every 1 KiB of the file read here).
    let mut redis = RedisServer::start_with(&[
        "--key-load-delay",
        "1000",
        "--loading-process-events-interval-bytes",
        "1024",
        "--enable-debug-command",
        "local",
    ]);
    let mut c = redis.conn();
    let _: () = redis::cmd("DEBUG").arg("POPULATE").arg(5000).query(&mut c).unwrap();
    let _: () = redis::cmd("SAVE").query(&mut c).unwrap();
    let (front, native) = front_and_native(&redis);
    redis.restart_loading();
    let http = redcount_tests::http();
    let through_front = || async {
        let r = http.post(front.url()).bearer_auth(&front.token).body(r#"["INCR","n"]"#).send().await.unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    };
    let t = Instant::now();
    let (status, body) = through_front().await;
    assert_eq!(status, 503, "{body} {}", front.log());
    assert!(body.contains("LOADING"), "{body}");
    assert!(t.elapsed() >= Duration::from_millis(700), "it waited for the load within its timeout: {:?}", t.elapsed());
    let (status, j) = post(&http, format!("{}/api/quotas/daily-prize/loading", native.url()), "{}".into()).await;
    assert_eq!(status, 503, "{j}");
    // Loaded: both serve again, and nothing was counted by the refused calls.
    let deadline = Instant::now() + Duration::from_secs(20);
    while through_front().await.0 != 200 {
        assert!(Instant::now() < deadline, "the front never served again");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let n: i64 = redis::cmd("GET").arg("n").query(&mut redis.conn()).unwrap();
    assert_eq!(n, 1, "the call answered 503 did not run");
    let (status, j) = post(&http, format!("{}/api/quotas/daily-prize/loading", native.url()), "{}".into()).await;
    assert_eq!((status, j["remaining"].as_i64()), (200, Some(1)), "{j}");
}

/// A master given `min-replicas-to-write` (docs/self-hosting.md: what Redis keeps) that has lost its
/// replicas refuses every write with NOREPLICAS and runs nothing: that is "try again" (503),
/// as MASTERDOWN is, from the front and from the API, never 400 (the command is not wrong)
/// or 502, and nothing is written. Writes are served again once the replica is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_without_its_replicas_is_unavailable_not_a_bad_request() {
    let redis = RedisServer::start_with(&["--min-replicas-to-write", "1", "--min-replicas-max-lag", "10"]);
    let (front, native) = front_and_native(&redis);
    let http = redcount_tests::http();
    let through_front = || async {
        let r = http.post(front.url()).bearer_auth(&front.token).body(r#"["INCR","n"]"#).send().await.unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    };
    // Redis's own refusal, by its code; the front passes it on as it is, the API as the cause
    // of its 503.
    let refusal = redis::cmd("INCR").arg("n").query::<i64>(&mut redis.conn()).unwrap_err();
    assert_eq!(refusal.code(), Some("NOREPLICAS"), "{refusal}");
    let said = format!("NOREPLICAS {}", refusal.detail().unwrap_or_default());
    let (status, body) = through_front().await;
    assert_eq!((status, serde_json::from_str::<Value>(&body).unwrap()), (503, json!({ "error": said })), "{body}");
    let (status, j) = post(&http, format!("{}/api/quotas/daily-prize/lonely", native.url()), "{}".into()).await;
    let why = format!("Redis is unavailable for now: {said}; if the call reached Redis it may still be applied");
    // The policy degrades to a denial: its own fields, and the cause as both reason and error.
    let denied = json!({"allowed": false, "degraded": true, "reason": why, "may_have_run": true, "error": why});
    assert_eq!((status, j), (503, denied));
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut redis.conn()).unwrap();
    assert!(keys.is_empty(), "a refused write wrote {keys:?}");
    // A replica comes: writes are served again.
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &redis.port().to_string()]);
    let deadline = Instant::now() + Duration::from_secs(20);
    while through_front().await.0 != 200 {
        assert!(Instant::now() < deadline, "the front never served again");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (status, j) = post(&http, format!("{}/api/quotas/daily-prize/lonely", native.url()), "{}".into()).await;
    assert_eq!((status, j["remaining"].as_i64()), (200, Some(1)), "{j}");
    drop(replica);
}

/// A redcount script whose reply was lost on the way (the connection ended, Redis stayed
/// up) is a 503 "may or may not have happened", never a 4xx blaming the output-buffer limit:
/// its reply is a few integers.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_script_reply_is_unavailable_not_a_client_error() {
    use redcount::Error;
    use redcount_core::ops::claim::Claim;
    let redis = RedisServer::start();
    let (port, armed) = redcount_tests::reply_losing_proxy(redis.port()).await;
    let front = RestFront::start_with(&format!("redis://127.0.0.1:{port}"), false, &["--timeout-ms", "3000"]);
    let rest = redcount::Rest::new(&front.url(), &front.token, Duration::from_secs(10)).unwrap();
    assert!(rest.run(&Claim::new("lost", "first", 60_000).unwrap()).await.unwrap().claimed, "script loaded");
    armed.store(true, std::sync::atomic::Ordering::SeqCst);
    let lost = rest.run(&Claim::new("lost", "second", 60_000).unwrap()).await;
    match lost {
        Err(Error::Transport(t)) => assert!(t.may_have_run, "{t:?}"),
        other => panic!("a lost reply must be a 503 that may have run: {other:?}"),
    }
    let written: bool = redis::cmd("EXISTS").arg(keys::claim("lost", "second")).query(&mut redis.conn()).unwrap();
    assert!(written, "the proxy let the write through (the test tests a lost reply)");
}

/// A stall shorter than `--timeout-ms` is waited out, also by the first script call of a
/// fresh front (its shared connection is made then): the request's timeout is the bound, not
/// a fixed connect time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_stall_is_waited_out_within_the_timeout() {
    use redcount_core::ops::claim::Claim;
    let redis = RedisServer::start_with(&["--enable-debug-command", "local"]);
    let front = RestFront::start_with(&redis.url(), false, &["--timeout-ms", "8000"]);
    let url = redis.url();
    let sleeper = std::thread::spawn(move || {
        let mut c = redis::Client::open(url).unwrap().get_connection().unwrap();
        redis::cmd("DEBUG").arg("SLEEP").arg("3").query::<()>(&mut c).unwrap();
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let rest = redcount::Rest::new(&front.url(), &front.token, Duration::from_secs(20)).unwrap();
    let t = Instant::now();
    let claimed = rest.run(&Claim::new("stall", "a", 60_000).unwrap()).await;
    let took = t.elapsed();
    sleeper.join().unwrap();
    assert!(claimed.as_ref().is_ok_and(|c| c.claimed), "{claimed:?} after {took:?}\n{}", front.log());
    assert!(took >= Duration::from_millis(2500), "the stall was real ({took:?})");
}

/// A REST front that answers every request with 64 MiB of a reply and then nothing more (a
/// broken or hostile front, or tampered plain HTTP): announced as 1 GB, or chunked.
fn endless_front(chunked: bool) -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            std::thread::spawn(move || {
                use std::io::{Read, Write};
                let mut conn = conn;
                let mut head = [0u8; 4096];
                let _ = conn.read(&mut head);
                let length = if chunked { "Transfer-Encoding: chunked" } else { "Content-Length: 1000000000" };
                let head = format!("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n{length}\r\n\r\n");
                let _ = conn.write_all(head.as_bytes());
                let mut chunk = vec![b'A'; 64 * 1024];
                if chunked {
                    chunk.splice(0..0, b"10000\r\n".iter().copied());
                    chunk.extend_from_slice(b"\r\n");
                }
                for _ in 0..1024 {
                    if conn.write_all(&chunk).is_err() {
                        return;
                    }
                }
                std::thread::sleep(Duration::from_secs(60));
            });
        }
    });
    url
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_and_the_worker_read_a_bounded_reply_from_their_rest_front() {
    for chunked in [false, true] {
        let admin = secret("admin");
        let rest_token = secret("rest");
        let front = endless_front(chunked);
        let server = redcount_tests::NativeServer::start_with(
            &[("REDCOUNT_REST_URL", &front), ("REDCOUNT_REST_TOKEN", &rest_token)],
            &admin,
            TEST_POLICIES,
            &["--timeout-ms", "20000"],
        );
        let worker = Workerd::start(&[
            ("REDCOUNT_REST_URL", &front),
            ("REDCOUNT_REST_TOKEN", &rest_token),
            ("REDCOUNT_ADMIN_TOKEN", &admin),
            ("REDCOUNT_POLICIES", TEST_POLICIES),
        ]);
        let http = redcount_tests::http();
        for base in [server.url(), worker.url()] {
            let started = Instant::now();
            let (status, v) = post(&http, format!("{base}/api/claims/signup-bonus/a"), String::new()).await;
            // Refused once the bound is passed, not read to the end nor waited out (20 s for
            // serve here): the front failed, so the claim policy's failure mode (deny) answers.
            assert_eq!(status, 503, "{base}, chunked {chunked}: {v}");
            assert!(v["error"].as_str().is_some_and(|e| e.contains("larger than")), "{base}, chunked {chunked}: {v}");
            assert!(started.elapsed() < Duration::from_secs(15), "{base}, chunked {chunked}: {:?}", started.elapsed());
        }
    }
}
