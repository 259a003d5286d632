//! Key namespaces (`--namespace` / `REDCOUNT_NAMESPACE`): two deployments on one Redis do not
//! meet, every key of one lives under its namespace, and `drain --namespace` finds its packets.

use std::process::Command;

use redcount_tests::{NativeServer, RedisServer, TEST_POLICIES, bin, scratch_dir, secret};
use serde_json::Value;

async fn post(http: &reqwest::Client, base: &str, path: &str, body: &str) -> (u16, Value) {
    let r = http
        .post(format!("{base}{path}"))
        .header("Content-Type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, serde_json::from_str(&r.text().await.unwrap()).unwrap())
}

fn keys(redis: &RedisServer) -> Vec<String> {
    let mut keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut redis.conn()).unwrap();
    keys.sort();
    keys
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_namespaces_on_one_redis_never_meet() {
    let redis = RedisServer::start();
    let backend = [("REDIS_URL", redis.url())];
    let backend: Vec<(&str, &str)> = backend.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let admin = secret("admin");
    let a = NativeServer::start(&backend, &admin, TEST_POLICIES);
    let b = NativeServer::start_with(&backend, &admin, TEST_POLICIES, &["--namespace", "app2"]);
    let http = redcount_tests::http();

    // The same policy and subject in both: each has its own quota (daily-prize: 2 a day).
    for n in 1..=2 {
        let (s, j) = post(&http, &a.url(), "/api/quotas/daily-prize/alice", "{}").await;
        assert_eq!((s, j["remaining"].as_i64()), (200, Some(2 - n)), "{j}");
    }
    let (s, j) = post(&http, &a.url(), "/api/quotas/daily-prize/alice", "{}").await;
    assert_eq!((s, j["allowed"].as_bool()), (200, Some(false)), "a's third take is denied: {j}");
    let (s, j) = post(&http, &b.url(), "/api/quotas/daily-prize/alice", "{}").await;
    assert_eq!((s, j["remaining"].as_i64()), (200, Some(1)), "b counts alone: {j}");
    // A claim taken in one is still free in the other.
    for base in [a.url(), b.url()] {
        let (s, j) = post(&http, &base, "/api/claims/signup-bonus/alice", "{}").await;
        assert_eq!((s, j["claimed"].as_bool()), (200, Some(true)), "{base}: {j}");
    }
    // A red packet made in b is unknown to a.
    let (s, j) = post(&http, &b.url(), "/api/redpackets", r#"{"total_cents": 1000, "count": 4}"#).await;
    assert_eq!(s, 201, "{j}");
    let id = j["id"].as_str().unwrap().to_string();
    for user in ["u1", "u2", "u3"] {
        let (s, j) =
            post(&http, &b.url(), &format!("/api/redpackets/{id}/grab"), &format!(r#"{{"user":"{user}"}}"#)).await;
        assert_eq!((s, j["outcome"].as_str()), (200, Some("won")), "{j}");
    }
    let (s, j) = post(&http, &a.url(), &format!("/api/redpackets/{id}/grab"), r#"{"user":"u9"}"#).await;
    assert_eq!(s, 404, "a does not see b's packet: {j}");

    // Every key is in exactly one of the two namespaces, and b wrote under its own.
    let all = keys(&redis);
    assert!(all.iter().all(|k| k.starts_with("rc:") || k.starts_with("app2:")), "{all:?}");
    let in_b: Vec<&String> = all.iter().filter(|k| k.starts_with("app2:")).collect();
    assert!(in_b.iter().any(|k| k.contains(&format!("{{rp:{id}}}"))), "b's packet keys are under app2: {all:?}");
    assert!(in_b.iter().any(|k| k.contains("{u:alice}:q:daily-prize")), "{all:?}");
    assert!(!all.iter().any(|k| k.starts_with("rc:") && k.contains(&id)), "nothing of b's packet under rc: {all:?}");

    // drain finds b's packet only in b's namespace.
    let drain = |ns: &str, db: &std::path::Path| {
        let out = Command::new(bin("redcount"))
            .args(["drain", "--redis", &redis.url(), "--namespace", ns, "--db"])
            .arg(db)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let conn = rusqlite::Connection::open(db).unwrap();
        let n: i64 = conn.query_row("SELECT COUNT(*) FROM claims WHERE packet = ?1", [&id], |r| r.get(0)).unwrap_or(0);
        n
    };
    let dir = scratch_dir("namespace");
    assert_eq!(drain("rc", &dir.join("rc.sqlite")), 0, "the default namespace holds no claim of b's packet");
    assert_eq!(drain("app2", &dir.join("app2.sqlite")), 3, "drain --namespace app2 copies b's three claims");
    // A database remembers its namespace: draining another into it is refused, not silently
    // mixed (packet ids are unique only within a namespace).
    let out = Command::new(bin("redcount"))
        .args(["drain", "--redis", &redis.url(), "--namespace", "rc", "--db"])
        .arg(dir.join("app2.sqlite"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("database of its own"), "{err}");

    // A namespace that is not an id is refused at start, naming the setting.
    let out = Command::new(bin("redcount"))
        .args(["serve", "--listen", "127.0.0.1:0", "--redis", &redis.url(), "--namespace", "a*b"])
        .env("REDCOUNT_POLICIES", TEST_POLICIES)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("REDCOUNT_NAMESPACE"), "{err}");
}
