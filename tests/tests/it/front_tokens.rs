//! `redcount-rest --tokens FILE`: several apps on one front, each token logged in to Redis as
//! its own ACL user, so Redis itself enforces its key patterns; read-only tokens also get the
//! front's rules; unknown tokens 401; SIGHUP reloads the file (a bad file keeps the tokens in
//! force); no token reaches the log.

use std::process::Command;
use std::time::Duration;

use redcount_tests::{RedisServer, RestFront, scratch_dir, secret};
use serde_json::{Value, json};

async fn post(url: &str, token: &str, body: Value) -> (u16, Value) {
    let r =
        redcount_tests::http().post(format!("{url}/")).bearer_auth(token).body(body.to_string()).send().await.unwrap();
    let status = r.status().as_u16();
    (status, serde_json::from_str(&r.text().await.unwrap()).unwrap_or(Value::Null))
}

fn acl(redis: &RedisServer, rules: &[&str]) {
    let mut cmd = redis::cmd("ACL");
    cmd.arg("SETUSER");
    for r in rules {
        cmd.arg(*r);
    }
    let _: () = cmd.query(&mut redis.conn()).unwrap();
}

fn write_tokens(path: &std::path::Path, entries: &[(&str, &str, &str, bool)]) {
    let v: Vec<Value> = entries
        .iter()
        .map(|(token, user, password, readonly)| json!({"token": token, "user": user, "password": password, "readonly": readonly}))
        .collect();
    std::fs::write(path, serde_json::to_string_pretty(&v).unwrap()).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scoped_tokens_are_held_to_their_redis_users() {
    let redis = RedisServer::start();
    acl(&redis, &["app1", "on", ">pw-app1-0123456789", "~app1:*", "+@all", "-@admin"]);
    acl(&redis, &["app2", "on", ">pw-app2-0123456789", "~app2:*", "+@all", "-@admin"]);
    let (t1, t2, t3, t4) = (secret("t1"), secret("t2"), secret("t3"), secret("t4"));
    let dir = scratch_dir("tokens");
    let file = dir.join("tokens.json");
    write_tokens(
        &file,
        &[
            (&t1, "app1", "pw-app1-0123456789", false),
            (&t2, "app2", "pw-app2-0123456789", false),
            (&t3, "app1", "pw-app1-0123456789", true),
        ],
    );
    let front = RestFront::start_with(&redis.url(), false, &["--tokens", file.to_str().unwrap()]);
    let url = front.url();

    // Each token writes its own keys; Redis refuses the other app's (NOPERM, as a 4xx).
    assert_eq!(post(&url, &t1, json!(["SET", "app1:x", "1"])).await, (200, json!({"result": "OK"})));
    assert_eq!(post(&url, &t2, json!(["SET", "app2:x", "2"])).await, (200, json!({"result": "OK"})));
    for (token, cmd) in [
        (&t1, json!(["SET", "app2:x", "stolen"])),
        (&t2, json!(["GET", "app1:x"])),
        (&t1, json!(["EVAL", "return redis.call('GET', KEYS[1])", "1", "app2:x"])),
    ] {
        let (status, v) = post(&url, token, cmd.clone()).await;
        assert!((400..500).contains(&status), "{cmd}: {status} {v}");
        assert!(v["error"].as_str().is_some_and(|e| e.contains("NOPERM") || e.contains("permission")), "{cmd}: {v}");
    }
    // Commands that reach every app's keys at once are refused to a file token, whatever its
    // ACL user may do (the README's example user may run them).
    for cmd in [
        json!(["FLUSHALL"]),
        json!(["FLUSHDB"]),
        json!(["SCRIPT", "FLUSH"]),
        json!(["FUNCTION", "FLUSH"]),
        json!(["KEYS", "*"]),
        json!(["SCAN", "0"]),
        json!(["RANDOMKEY"]),
    ] {
        let (status, v) = post(&url, &t1, cmd.clone()).await;
        assert_eq!(status, 403, "{cmd}: {v}");
    }
    let got: String = redis::cmd("GET").arg("app2:x").query(&mut redis.conn()).unwrap();
    assert_eq!(got, "2", "app2's key is untouched");
    // A read-only token reads its user's keys and may not write them (the front's rule).
    assert_eq!(post(&url, &t3, json!(["GET", "app1:x"])).await, (200, json!({"result": "1"})));
    let (status, v) = post(&url, &t3, json!(["SET", "app1:y", "1"])).await;
    assert_eq!(status, 403, "{v}");
    // The simple tokens still work beside the file; an unknown token is 401.
    assert_eq!(post(&url, &front.token, json!(["GET", "app2:x"])).await, (200, json!({"result": "2"})));
    assert_eq!(post(&url, &t4, json!(["PING"])).await.0, 401);
    assert_eq!(post(&url, &format!("{t1}x"), json!(["PING"])).await.0, 401);

    // SIGHUP: t2 removed, t4 added; a token of a changed password logs in anew.
    write_tokens(&file, &[(&t1, "app1", "pw-app1-0123456789", false), (&t4, "app2", "pw-app2-0123456789", true)]);
    let hup = |pid: u32| assert!(Command::new("kill").args(["-HUP", &pid.to_string()]).status().unwrap().success());
    hup(front.pid());
    let mut reloaded = false;
    for _ in 0..50 {
        if post(&url, &t4, json!(["GET", "app2:x"])).await == (200, json!({"result": "2"})) {
            reloaded = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(reloaded, "t4 works after SIGHUP\n{}", front.log());
    assert_eq!(post(&url, &t2, json!(["PING"])).await.0, 401, "t2 was removed");
    assert_eq!(post(&url, &t1, json!(["GET", "app1:x"])).await, (200, json!({"result": "1"})));
    // A file naming a user that cannot log in is refused whole: the tokens in force stay.
    write_tokens(&file, &[(&t1, "app1", "wrong-password-0123", false)]);
    hup(front.pid());
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(post(&url, &t4, json!(["GET", "app2:x"])).await, (200, json!({"result": "2"})), "{}", front.log());
    assert!(front.log().contains("not reloaded"), "{}", front.log());
    // No token and no password in the log.
    let log = front.log();
    for s in [&t1, &t2, &t3, &t4, &"pw-app1-0123456789".to_string(), &"wrong-password-0123".to_string()] {
        assert!(!log.contains(s.as_str()), "a secret in the log:\n{log}");
    }

    // At start, a bad file stops the front with a message naming the entry, not the token.
    let main = secret("main");
    for (content, want) in [
        (json!([{"token": "short", "user": "app1", "password": "x"}]).to_string(), "at least 16"),
        (json!([{"token": t1, "user": "nobody", "password": "x"}]).to_string(), "cannot log in"),
        (json!([{"token": main, "user": "app1", "password": "pw-app1-0123456789"}]).to_string(), "used twice"),
        (json!([{"token": t1, "user": "app1", "password": "p", "extra": 1}]).to_string(), "unknown field"),
    ] {
        let bad = dir.join("bad.json");
        std::fs::write(&bad, &content).unwrap();
        let mut child = Command::new(redcount_tests::bin("redcount-rest"))
            .args(["--listen", "127.0.0.1:0", "--redis", &redis.url(), "--tokens", bad.to_str().unwrap()])
            .env("REDCOUNT_REST_TOKEN", &main)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // It must stop by itself; one that started is killed after 10 s (and fails below).
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while child.try_wait().unwrap().is_none() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{content}: started");
        assert!(err.contains(want), "{content}: {err}");
        assert!(!err.contains(&t1), "the token is printed: {err}");
    }
}

/// A token removed from the file by SIGHUP loses what it holds: its open subscriptions end
/// and its Redis connections close.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_token_loses_its_subscriptions_and_connections() {
    let redis = RedisServer::start();
    acl(&redis, &["app1", "on", ">pw-app1-0123456789", "~app1:*", "&app1:*", "+@all", "-@admin"]);
    acl(&redis, &["app2", "on", ">pw-app2-0123456789", "~app2:*", "&app2:*", "+@all", "-@admin"]);
    let (t1, t2) = (secret("t1"), secret("t2"));
    let file = scratch_dir("tokens-revoke").join("tokens.json");
    write_tokens(&file, &[(&t1, "app1", "pw-app1-0123456789", false), (&t2, "app2", "pw-app2-0123456789", false)]);
    let front = RestFront::start_with(&redis.url(), false, &["--tokens", file.to_str().unwrap()]);
    let url = front.url();
    let clients_of = |user: &str| -> usize {
        let list: String = redis::cmd("CLIENT").arg("LIST").query(&mut redis.conn()).unwrap();
        list.lines().filter(|l| l.contains(&format!(" user={user} "))).count()
    };
    assert_eq!(post(&url, &t2, json!(["SET", "app2:x", "1"])).await, (200, json!({"result": "OK"})));
    assert_eq!(post(&url, &t1, json!(["SET", "app1:x", "1"])).await, (200, json!({"result": "OK"})));
    let mut sub = redcount_tests::http()
        .post(format!("{url}/subscribe/app2:news"))
        .bearer_auth(&t2)
        .header("Accept", "text/event-stream")
        .send()
        .await
        .unwrap();
    assert_eq!(sub.status().as_u16(), 200);
    let first = tokio::time::timeout(Duration::from_secs(5), sub.chunk()).await.unwrap().unwrap().unwrap();
    assert!(String::from_utf8_lossy(&first).contains("subscribe,app2:news,1"));
    assert!(clients_of("app2") >= 2, "a pooled connection and the subscriber's");

    write_tokens(&file, &[(&t1, "app1", "pw-app1-0123456789", false)]);
    assert!(Command::new("kill").args(["-HUP", &front.pid().to_string()]).status().unwrap().success());
    let mut revoked = false;
    for _ in 0..50 {
        if post(&url, &t2, json!(["PING"])).await.0 == 401 {
            revoked = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(revoked, "t2 is refused after SIGHUP\n{}", front.log());
    // The stream ends (a comment may say why first).
    let ended =
        tokio::time::timeout(Duration::from_secs(5), async { while let Ok(Some(_)) = sub.chunk().await {} }).await;
    assert!(ended.is_ok(), "the removed token's subscription is still open");
    let mut gone = false;
    for _ in 0..50 {
        if clients_of("app2") == 0 {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(gone, "{} connections of the removed token's user remain", clients_of("app2"));
    assert!(clients_of("app1") >= 1, "the other token keeps its connections");
    assert_eq!(post(&url, &t1, json!(["GET", "app1:x"])).await, (200, json!({"result": "1"})));
}
