//! No acknowledged write lost: inbox ids never collide, expiries follow the last write,
//! counters stay within +-10^15, and at maxmemory every write route fails closed.

use std::time::Duration;

use redcount::Error;
use redcount_core::ErrorKind;
use redcount_core::keys;
use redcount_core::ops::claim::Claim;
use redcount_core::ops::counter::{AddCounter, Bounds, GetCounter, Mode, Storage};
use redcount_core::ops::inbox::{Append, Read, Trim};
use redcount_core::ops::quota::{Algorithm, ResetQuota, TakeQuota};
use redcount_core::ops::redpacket::{self, Create, Grab};
use redcount_core::ops::semaphore::{Action, UpdateLease};
use redcount_tests::{RedisServer, uid};

/// redpacket_grab.lua's refusal of a packet whose keys were partly evicted, as Redis answers it.
const INCOMPLETE: &str = "ERR red packet state is incomplete (were its keys evicted? redcount needs maxmemory-policy noeviction): no share issued";

/// A script's error as the script wrote it: without what Redis appends (` script: <sha>, on
/// @user_script:<line>.`).
fn scripts_own(message: &str) -> &str {
    message.split_once(" script: ").map_or(message, |(own, _)| own)
}

#[tokio::test]
async fn equal_bodies_in_one_second_are_two_messages() {
    let redis = RedisServer::start();
    let d = redis.direct().await;
    let user = uid("u");
    let week = 7 * 86_400_000;
    for id in [1, 2, 3] {
        let r = d.run(&Append::new(&user, id, "same body", week, 100).unwrap()).await.unwrap();
        assert!(r.stored, "id {id} stored");
    }
    // A retry of an id is idempotent and loses nothing.
    let again = d.run(&Append::new(&user, 1, "same body", week, 100).unwrap()).await.unwrap();
    assert!(!again.stored);
    let all = d.run(&Read::new(&user, None, 100).unwrap()).await.unwrap();
    assert_eq!(all.iter().map(|m| m.id).collect::<Vec<_>>(), vec![1, 2, 3], "every acknowledged id is kept");
    assert!(all.iter().all(|m| m.body == b"same body"));
}

#[tokio::test]
async fn expiries_follow_the_last_write() {
    let redis = RedisServer::start();
    let d = redis.direct().await;
    let mut c = redis.conn();
    let pttl = |c: &mut redis::Connection, k: &str| -> i64 { redis::cmd("PTTL").arg(k).query(c).unwrap() };

    // Inbox: a message appended shortly before the inbox would expire keeps it alive.
    let user = uid("u");
    d.run(&Append::new(&user, 1, "a", 1_500, 100).unwrap()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    d.run(&Append::new(&user, 2, "b", 1_500, 100).unwrap()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(800)).await;
    let left = d.run(&Read::new(&user, None, 10).unwrap()).await.unwrap();
    assert_eq!(left.iter().map(|m| m.id).collect::<Vec<_>>(), vec![1, 2], "the newest message keeps the inbox");
    assert!(pttl(&mut c, &keys::inbox(&user)) > 0);

    // Counters, as keys and as hash fields: each lives its TTL after its own last write.
    for storage in [Storage::Key, Storage::HashField] {
        let (a, b) = (uid("a"), uid("b"));
        let bounds = Bounds { min: 0, max: None, mode: Mode::Clamp, ttl_ms: 1_500 };
        d.run(&AddCounter::new("c", &a, storage, 1, bounds).unwrap()).await.unwrap();
        d.run(&AddCounter::new("c", &b, storage, 1, bounds).unwrap()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(1_000)).await;
        d.run(&AddCounter::new("c", &b, storage, 1, bounds).unwrap()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(800)).await;
        let got = d.run(&GetCounter::new("c", &b, storage).unwrap()).await.unwrap();
        assert_eq!(got, 2, "{storage:?}: written 0.8 s ago with a 1.5 s TTL, still there");
        if storage == Storage::Key {
            assert_eq!(d.run(&GetCounter::new("c", &a, storage).unwrap()).await.unwrap(), 0, "a's own TTL ended");
        }
    }
}

#[tokio::test]
async fn counters_stay_within_ten_to_the_fifteenth_both_ways() {
    let redis = RedisServer::start();
    let d = redis.direct().await;
    let lim = 1_000_000_000_000_000i64;
    for storage in [Storage::Key, Storage::HashField] {
        let s = uid("s");
        let open = Bounds { min: -lim, max: None, mode: Mode::Clamp, ttl_ms: 0 };
        for _ in 0..3 {
            d.run(&AddCounter::new("c", &s, storage, lim, open).unwrap()).await.unwrap();
        }
        assert_eq!(d.run(&GetCounter::new("c", &s, storage).unwrap()).await.unwrap(), lim, "clamped at 10^15");
        // Still writable both ways.
        d.run(&AddCounter::new("c", &s, storage, -5, open).unwrap()).await.unwrap();
        assert_eq!(d.run(&GetCounter::new("c", &s, storage).unwrap()).await.unwrap(), lim - 5);
        let reject = Bounds { mode: Mode::Reject, ..open };
        let r = d.run(&AddCounter::new("c", &s, storage, 10, reject).unwrap()).await.unwrap();
        assert_eq!(r.value, lim - 5, "past 10^15 is rejected, not stored");
        for _ in 0..5 {
            d.run(&AddCounter::new("c", &s, storage, -lim, open).unwrap()).await.unwrap();
        }
        assert_eq!(d.run(&GetCounter::new("c", &s, storage).unwrap()).await.unwrap(), -lim, "and at -10^15");
    }
}

#[tokio::test]
async fn every_write_route_fails_closed_at_maxmemory() {
    let redis = RedisServer::start_with(&["--maxmemory-policy", "noeviction", "--enable-debug-command", "local"]);
    let d = redis.direct().await;
    let mut c = redis.conn();
    // Existing state the writes below would touch.
    let packet = redpacket::new_id(&mut rand::rng());
    let mut rng = rand::rng();
    d.run(&Create::new(&packet, 10_000, 10, 1, 60_000, &mut rng).unwrap()).await.unwrap();
    let sliding = Algorithm::SlidingWindow { limit: 100, window_ms: 60_000 };
    d.run(&TakeQuota::take("q", "s", sliding, 1).unwrap()).await.unwrap();
    // Redis well past its maxmemory (set below what it uses, so freed buffers cannot make room).
    let blob = vec![b'x'; 64 * 1024];
    for i in 0..16 {
        let _: () = redis::cmd("SET").arg(format!("fill{i}")).arg(&blob).query(&mut c).unwrap();
    }
    let info: String = redis::cmd("INFO").arg("memory").query(&mut c).unwrap();
    let used: u64 = info.lines().find_map(|l| l.strip_prefix("used_memory:")).unwrap().trim().parse().unwrap();
    let _: () = redis::cmd("CONFIG").arg("SET").arg("maxmemory").arg(used / 2).query(&mut c).unwrap();
    let digest = |c: &mut redis::Connection| -> String { redis::cmd("DEBUG").arg("DIGEST").query(c).unwrap() };
    let before = digest(&mut c);
    let bounds = Bounds { min: 0, max: None, mode: Mode::Clamp, ttl_ms: 60_000 };
    let oom = |r: Result<(), Error>, what: &str| match r {
        Err(Error::Redis(e)) if e.kind == ErrorKind::OutOfMemory => {}
        other => panic!("{what}: expected a refusal at maxmemory, got {other:?}"),
    };
    let u = uid("u");
    oom(d.run(&AddCounter::new("c", &u, Storage::Key, 1, bounds).unwrap()).await.map(drop), "counter");
    oom(d.run(&AddCounter::new("c", &u, Storage::HashField, 1, bounds).unwrap()).await.map(drop), "hash counter");
    oom(d.run(&Claim::new("bonus", &u, 60_000).unwrap()).await.map(drop), "claim");
    for algo in [
        Algorithm::FixedWindow { limit: 10, window_ms: 60_000 },
        sliding,
        Algorithm::TokenBucket { capacity: 10, refill: 1, interval_ms: 1_000 },
    ] {
        oom(d.run(&TakeQuota::take("q", "s", algo, 1).unwrap()).await.map(drop), "quota take");
        oom(d.run(&ResetQuota::new("q", "s", algo).unwrap()).await.map(drop), "quota reset");
    }
    for action in [Action::Acquire, Action::Renew, Action::Release] {
        oom(d.run(&UpdateLease::new("sem", "n", action, &u, 3, 10_000).unwrap()).await.map(drop), "semaphore");
    }
    oom(d.run(&Append::new(&u, 1, "m", 60_000, 10).unwrap()).await.map(drop), "inbox append");
    oom(d.run(&Trim::new(&u, 60, 10, 10).unwrap()).await.map(drop), "inbox trim");
    let fresh = redpacket::new_id(&mut rng);
    oom(d.run(&Create::new(&fresh, 10_000, 10, 1, 60_000, &mut rng).unwrap()).await.map(drop), "red packet create");
    oom(d.run(&Grab::new(&packet, &u).unwrap()).await.map(drop), "red packet grab");
    assert_eq!(before, digest(&mut c), "nothing was written at maxmemory");
    // Reads still work.
    assert!(d.run(&redpacket::ReadStatus::new(&packet).unwrap()).await.unwrap().is_some());
}

#[tokio::test]
async fn packet_ids_from_idempotency_keys_depend_on_the_server_secret() {
    let redis = RedisServer::start();
    let create = |url: String| async move {
        let r = redcount_tests::http()
            .post(format!("{url}/api/redpackets"))
            .header("Idempotency-Key", "the-same-key")
            .body(r#"{"total_cents":500,"count":5}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 201);
        let v: serde_json::Value = serde_json::from_str(&r.text().await.unwrap()).unwrap();
        v["id"].as_str().unwrap().to_string()
    };
    let backend = [("REDIS_URL", redis.url())];
    let backend: Vec<(&str, &str)> = backend.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let one = redcount_tests::NativeServer::start(&backend, "admin-secret-one-0123", redcount_tests::TEST_POLICIES);
    let two = redcount_tests::NativeServer::start(&backend, "admin-secret-two-0123", redcount_tests::TEST_POLICIES);
    let (a, a_again, b) = (create(one.url()).await, create(one.url()).await, create(two.url()).await);
    assert_eq!(a, a_again, "a replay finds the same packet");
    assert_ne!(a, b, "another deployment's secret derives another id: ids are not predictable from keys");
}

#[tokio::test]
async fn redcount_serve_names_redis_when_redis_is_down() {
    let mut redis = RedisServer::start();
    let server = redcount_tests::NativeServer::start(
        &[("REDIS_URL", &redis.url())],
        "admin-secret-0123456",
        redcount_tests::TEST_POLICIES,
    );
    let http = redcount_tests::http();
    let add = || http.post(format!("{}/api/counters/running-jobs/x", server.url())).body(r#"{"delta":1}"#).send();
    redis.kill();
    let r = add().await.unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    assert_eq!(status, 503, "{text}");
    assert!(text.contains("Redis") && !text.contains("REST front"), "the message names Redis: {text}");
    // Back, and restarted once more while no request was made: the first request is served
    // (the connection that died with the old process is not used for it).
    redis.restart();
    for _ in 0..2 {
        let r = add().await.unwrap();
        assert_eq!(r.status().as_u16(), 200, "{}", r.text().await.unwrap());
        redis.restart();
    }
}

/// The REST front's pooled connections all died with the old Redis: the first requests
/// after it is back are served, by the full and the read-only token (whose Redis users the
/// new process has to be given again).
#[tokio::test]
async fn redcount_serve_through_the_front_survives_a_redis_restart() {
    let mut redis = RedisServer::start();
    let front = redcount_tests::RestFront::start(&redis.url(), false);
    let server = redcount_tests::NativeServer::start(
        &[("REDCOUNT_REST_URL", &front.url()), ("REDCOUNT_REST_TOKEN", &front.token)],
        "admin-secret-0123456",
        redcount_tests::TEST_POLICIES,
    );
    let http = redcount_tests::http();
    let add = || http.post(format!("{}/api/counters/running-jobs/x", server.url())).body(r#"{"delta":1}"#).send();
    // Enough calls that every connection the front shares for redcount's scripts is in use.
    for _ in 0..8 {
        assert_eq!(add().await.unwrap().status().as_u16(), 200);
    }
    redis.restart();
    for i in 0..6 {
        let r = add().await.unwrap();
        let status = r.status().as_u16();
        assert_eq!(status, 200, "request {i} after the restart: {}", r.text().await.unwrap());
    }
}

/// Redis run with an evicting `maxmemory-policy` (here `allkeys-random`, filled past its
/// bound) drops some of a packet's keys: a user whose claim record was evicted must not win a
/// second share. Each grab checks the packet's keys agree (claims recorded = shares claimed,
/// shares left + claimed = count) and otherwise refuses, issuing nothing.
#[tokio::test]
async fn a_packet_with_evicted_keys_issues_no_second_share() {
    use redcount_core::ops::redpacket::GrabOutcome;
    let redis = RedisServer::start();
    let d = redis.direct().await;
    let mut c = redis.conn();
    let mut rng = rand::rng();
    let ids: Vec<String> = (0..300).map(|_| redpacket::new_id(&mut rng)).collect();
    for id in &ids {
        d.run(&Create::new(id, 1_000, 10, 1, 600_000, &mut rng).unwrap()).await.unwrap();
        let first = d.run(&Grab::new(id, "alice").unwrap()).await.unwrap();
        assert!(matches!(first, GrabOutcome::Won { .. }), "{first:?}");
    }
    // Evict: a tight maxmemory, random eviction, and junk written until Redis has evicted
    // some 300 keys (about a quarter of the packets' 1,200).
    let stat = |c: &mut redis::Connection, section: &str, field: &str| -> i64 {
        let info: String = redis::cmd("INFO").arg(section).query(c).unwrap();
        info.lines().find_map(|l| l.strip_prefix(field)).unwrap().trim().parse().unwrap()
    };
    let used = stat(&mut c, "memory", "used_memory:");
    let _: () = redis::cmd("CONFIG").arg("SET").arg("maxmemory-policy").arg("allkeys-random").query(&mut c).unwrap();
    let _: () = redis::cmd("CONFIG").arg("SET").arg("maxmemory").arg(used + 100_000).query(&mut c).unwrap();
    let mut i = 0;
    while stat(&mut c, "stats", "evicted_keys:") < 300 {
        for _ in 0..20 {
            let _: () = redis::cmd("SET").arg(format!("junk{i}")).arg(vec![b'j'; 200]).query(&mut c).unwrap();
            i += 1;
        }
    }
    let evicted = stat(&mut c, "stats", "evicted_keys:");
    let _: () = redis::cmd("CONFIG").arg("SET").arg("maxmemory").arg(0).query(&mut c).unwrap();
    let (mut refused, mut gone) = (0, 0);
    for id in &ids {
        match d.run(&Grab::new(id, "alice").unwrap()).await {
            Ok(GrabOutcome::Won { .. }) => panic!("alice won a second share of {id}"),
            Ok(GrabOutcome::NotFound) => gone += 1,
            Ok(_) => {}
            Err(Error::Redis(e)) => {
                assert_eq!(scripts_own(&e.message), INCOMPLETE, "{e:?}");
                refused += 1;
            }
            Err(e) => panic!("{e:?}"),
        }
    }
    println!("{evicted} keys evicted: {gone} packets gone, {refused} grabs refused as incomplete");
    assert!(refused > 0, "some packets lost keys but not their meta");

    // Each key alone (the claim log too: the drain reads claims from it).
    let _: () = redis::cmd("CONFIG").arg("SET").arg("maxmemory-policy").arg("noeviction").query(&mut c).unwrap();
    for (which, name) in [(1, "shares"), (2, "claims"), (3, "log")] {
        let id = redpacket::new_id(&mut rng);
        d.run(&Create::new(&id, 1_000, 5, 1, 600_000, &mut rng).unwrap()).await.unwrap();
        d.run(&Grab::new(&id, "alice").unwrap()).await.unwrap();
        let _: () = redis::cmd("DEL").arg(&keys::redpacket(&id)[which]).query(&mut c).unwrap();
        match d.run(&Grab::new(&id, "bob").unwrap()).await {
            Err(Error::Redis(e)) => assert_eq!(scripts_own(&e.message), INCOMPLETE, "{name}: {e:?}"),
            other => panic!("the {name} key gone, bob's grab: {other:?}"),
        }
    }
}

/// A Redis that may evict keys breaks every promise (a claim, a quota window, an idempotency
/// record gone): `redcount serve --redis` refuses it unless told `--allow-eviction`, and the
/// REST front, which may serve a cache too, says so in its log.
#[test]
fn a_redis_that_may_evict_is_refused_or_named() {
    let redis = RedisServer::start_with(&["--maxmemory", "100mb", "--maxmemory-policy", "allkeys-lru"]);
    let out = std::process::Command::new(redcount_tests::bin("redcount"))
        .args(["serve", "--listen", &format!("127.0.0.1:{}", redcount_tests::free_port())])
        .env("REDIS_URL", redis.url())
        .env("REDCOUNT_POLICIES", redcount_tests::TEST_POLICIES)
        .env("REDCOUNT_WWW", redcount_tests::root().join("www"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("allkeys-lru") && err.contains("--allow-eviction") && err.contains("noeviction"), "{err}");
    // A user who may not read CONFIG (as on managed Redis) still finds the policy through
    // INFO memory; one who may read neither cannot tell, and is refused too (fail closed).
    let mut c = redis.conn();
    for rules in [
        vec!["noconf", "on", ">pw-noconf-0123", "~*", "+@all", "-@admin", "-config"],
        vec!["blind", "on", ">pw-blind-01234", "~*", "+@all", "-@admin", "-config", "-info"],
    ] {
        let _: () = redis::cmd("ACL").arg("SETUSER").arg(&rules).query(&mut c).unwrap();
    }
    for (user, want) in [("noconf:pw-noconf-0123", "allkeys-lru"), ("blind:pw-blind-01234", "cannot tell")] {
        let url = format!("redis://{user}@127.0.0.1:{}", redis.port());
        let out = std::process::Command::new(redcount_tests::bin("redcount"))
            .args(["serve", "--listen", &format!("127.0.0.1:{}", redcount_tests::free_port())])
            .env("REDIS_URL", &url)
            .env("REDCOUNT_POLICIES", redcount_tests::TEST_POLICIES)
            .env("REDCOUNT_WWW", redcount_tests::root().join("www"))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{user}: started on an evicting Redis: {err}");
        assert!(err.contains(want) && err.contains("--allow-eviction"), "{user}: {err}");
    }
    let server = redcount_tests::NativeServer::start_with(
        &[("REDIS_URL", &redis.url())],
        "admin-secret-0123456",
        redcount_tests::TEST_POLICIES,
        &["--allow-eviction"],
    );
    assert!(server.log().contains("may evict"), "{}", server.log());
    let front = redcount_tests::RestFront::start(&redis.url(), false);
    std::thread::sleep(Duration::from_millis(300));
    assert!(front.log().contains("may evict keys (maxmemory-policy allkeys-lru"), "{}", front.log());
}
