//! Each primitive's semantics and TTLs against a real redis-server.

use std::time::Duration;

use redcount::Error;
use redcount_core::ErrorKind;
use redcount_core::keys;
use redcount_core::ops::claim::Claim;
use redcount_core::ops::counter::{AddCounter, Bounds, CounterStatus, GetCounter, Mode, Storage};
use redcount_core::ops::inbox::{Append, Read, Trim};
use redcount_core::ops::quota::{Algorithm, ResetQuota, TakeQuota};
use redcount_core::ops::redpacket::{self, Create, Grab, GrabOutcome, ReadGrabs, ReadStatus};
use redcount_core::ops::semaphore::{Action, SemaphoreResult, UpdateLease};
use redcount_tests::{RedisServer, uid};

fn pttl(redis: &RedisServer, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query(&mut redis.conn()).unwrap()
}

#[tokio::test]
async fn counter_never_goes_below_min_and_clamps_or_rejects() {
    let redis = RedisServer::start();
    let d = redis.direct().await;
    let s = uid("app");
    let floor = Bounds::default();
    let add = |delta, b| AddCounter::new("jobs", &s, Storage::HashField, delta, b).unwrap();

    let o = d.run(&add(-1, floor)).await.unwrap();
    assert_eq!((o.value, o.applied, o.status), (0, 0, CounterStatus::Clamped));
    assert_eq!(
        redis::cmd("EXISTS").arg(keys::counter_hash("jobs")).query::<i64>(&mut redis.conn()).unwrap(),
        0,
        "no write when nothing applies"
    );
    let o = d.run(&add(3, floor)).await.unwrap();
    assert_eq!((o.value, o.applied, o.status), (3, 3, CounterStatus::Applied));
    let o = d.run(&add(-5, floor)).await.unwrap();
    assert_eq!((o.value, o.applied, o.status), (0, -3, CounterStatus::Clamped));

    let capped = Bounds { min: 0, max: Some(10), mode: Mode::Reject, ttl_ms: 0 };
    assert_eq!(d.run(&add(8, capped)).await.unwrap().value, 8);
    let o = d.run(&add(3, capped)).await.unwrap();
    assert_eq!((o.value, o.applied, o.status), (8, 0, CounterStatus::Rejected));
    let o = d.run(&add(3, Bounds { mode: Mode::Clamp, ..capped })).await.unwrap();
    assert_eq!((o.value, o.applied, o.status), (10, 2, CounterStatus::Clamped));
    let o = d.run(&add(-11, capped)).await.unwrap();
    assert_eq!((o.value, o.status), (10, CounterStatus::Rejected));
    assert_eq!(d.run(&GetCounter::new("jobs", &s, Storage::HashField).unwrap()).await.unwrap(), 10);
    // The hash field is a plain HINCRBY counter other tools can read.
    let raw: i64 = redis::cmd("HGET").arg(keys::counter_hash("jobs")).arg(&s).query(&mut redis.conn()).unwrap();
    assert_eq!(raw, 10);
}

#[tokio::test]
async fn counter_ttl_is_renewed_by_every_write_and_wrong_type_is_typed() {
    let redis = RedisServer::start();
    let d = redis.direct().await;
    let s = uid("k");
    let b = Bounds { ttl_ms: 60_000, ..Bounds::default() };
    d.run(&AddCounter::new("c", &s, Storage::Key, 2, b).unwrap()).await.unwrap();
    let key = keys::counter("c", &s);
    let t = pttl(&redis, &key);
    assert!((59_000..=60_000).contains(&t), "ttl {t}");
    redis::cmd("PERSIST").arg(&key).query::<()>(&mut redis.conn()).unwrap();
    d.run(&AddCounter::new("c", &s, Storage::Key, 2, b).unwrap()).await.unwrap();
    let t = pttl(&redis, &key);
    assert!((59_000..=60_000).contains(&t), "every write renews the ttl: {t}");
    assert_eq!(d.run(&GetCounter::new("c", &s, Storage::Key).unwrap()).await.unwrap(), 4);

    redis::cmd("SADD").arg(keys::counter("c", "set")).arg("x").query::<()>(&mut redis.conn()).unwrap();
    match d.run(&AddCounter::new("c", "set", Storage::Key, 1, b).unwrap()).await {
        Err(Error::Redis(e)) => assert_eq!(e.kind, ErrorKind::WrongType),
        other => panic!("expected WRONGTYPE, got {other:?}"),
    }
    redis::cmd("SET").arg(keys::counter("c", "junk")).arg("abc").query::<()>(&mut redis.conn()).unwrap();
    match d.run(&AddCounter::new("c", "junk", Storage::Key, 1, b).unwrap()).await {
        Err(Error::Redis(e)) => assert_eq!(e.kind, ErrorKind::Rejected, "{e}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn claim_once_per_window() {
    let redis = RedisServer::start();
    let d = redis.direct().await;
    let s = uid("u");
    let c = Claim::new("bonus", &s, 300).unwrap();
    let first = d.run(&c).await.unwrap();
    assert!(first.claimed);
    assert_eq!(first.window_left_ms, Some(300));
    let again = d.run(&c).await.unwrap();
    assert!(!again.claimed);
    assert!(matches!(again.window_left_ms, Some(ms) if (1..=300).contains(&ms)), "{again:?}");
    tokio::time::sleep(Duration::from_millis(350)).await;
    assert!(d.run(&c).await.unwrap().claimed, "a new window opens");
    // Another subject is independent.
    assert!(d.run(&Claim::new("bonus", &uid("u"), 300).unwrap()).await.unwrap().claimed);
}

#[tokio::test]
async fn quota_fixed_window_with_cost_peek_and_reset() {
    let redis = RedisServer::start();
    let d = redis.direct().await;
    let s = uid("u");
    let algo = Algorithm::FixedWindow { limit: 5, window_ms: 3_600_000 };
    let peek = d.run(&TakeQuota::peek("daily", &s, algo, 1).unwrap()).await.unwrap();
    assert_eq!((peek.allowed, peek.remaining), (true, 5));
    let a = d.run(&TakeQuota::take("daily", &s, algo, 2).unwrap()).await.unwrap();
    assert_eq!((a.allowed, a.limit, a.remaining, a.retry_after_ms), (true, 5, 3, 0));
    assert!(a.reset_ms > 0 && a.reset_ms <= 3_600_000);
    assert_eq!(
        d.run(&TakeQuota::peek("daily", &s, algo, 1).unwrap()).await.unwrap().remaining,
        3,
        "peek consumes nothing"
    );
    assert!(d.run(&TakeQuota::take("daily", &s, algo, 3).unwrap()).await.unwrap().allowed);
    let denied = d.run(&TakeQuota::take("daily", &s, algo, 1).unwrap()).await.unwrap();
    assert_eq!((denied.allowed, denied.remaining), (false, 0));
    assert_eq!(denied.retry_after_ms, denied.reset_ms);
    assert!(d.run(&ResetQuota::new("daily", &s, algo).unwrap()).await.unwrap());
    assert_eq!(d.run(&TakeQuota::take("daily", &s, algo, 1).unwrap()).await.unwrap().remaining, 4);
}

/// The fixed window's state: the units used, a plain integer whose key expires exactly when
/// its window ends; a take in a running window reads no TIME; the layout before
/// ("<window>:<used>") is carried over while its window runs, by a take and by a refund.
#[tokio::test]
async fn quota_fixed_window_state_ends_with_its_window_and_reads_the_layout_before() {
    use redcount_core::ops::quota::RefundQuota;
    let redis = RedisServer::start();
    let d = redis.direct().await;
    // A window of 10^12 ms: the epoch's window 1 runs until 2001-09-09 + 31 years, so no
    // window boundary falls inside the test.
    let window_ms = 1_000_000_000_000;
    let algo = Algorithm::FixedWindow { limit: 100, window_ms };
    let take = |s: &str, cost| TakeQuota::take("fw", s, algo, cost).unwrap();
    let get = |key: &str| -> Option<String> { redis::cmd("GET").arg(key).query(&mut redis.conn()).unwrap() };
    let expires_at = |key: &str| -> i64 { redis::cmd("PEXPIRETIME").arg(key).query(&mut redis.conn()).unwrap() };
    let time_calls = || -> u64 {
        let info: String = redis::cmd("INFO").arg("commandstats").query(&mut redis.conn()).unwrap();
        info.lines()
            .find_map(|l| l.strip_prefix("cmdstat_time:calls="))
            .map_or(0, |rest| rest.split(',').next().unwrap().parse().unwrap())
    };
    let window_end = 2 * window_ms;

    let s = uid("u");
    let key = keys::quota("fw", &s, "fw");
    let first = d.run(&take(&s, 2)).await.unwrap();
    assert_eq!((first.allowed, first.remaining), (true, 98));
    assert_eq!(get(&key).as_deref(), Some("2"));
    assert_eq!(expires_at(&key), window_end, "the key ends with its window");
    let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query(&mut redis.conn()).unwrap();
    let second = d.run(&take(&s, 3)).await.unwrap();
    assert_eq!((second.allowed, second.remaining), (true, 95));
    assert!(second.reset_ms > 0 && second.reset_ms <= first.reset_ms, "{second:?} after {first:?}");
    assert_eq!(time_calls(), 0, "a take in a running window reads no TIME");
    assert_eq!((get(&key).as_deref(), expires_at(&key)), (Some("5"), window_end));
    // A refund gives units of the running window back and keeps the expiry.
    assert_eq!(d.run(&RefundQuota::new("fw", &s, algo, 4).unwrap()).await.unwrap(), 4);
    assert_eq!((get(&key).as_deref(), expires_at(&key)), (Some("1"), window_end));
    // A denial writes nothing.
    let denied = d.run(&take(&s, 100)).await.unwrap();
    assert_eq!((denied.allowed, denied.remaining, denied.retry_after_ms), (false, 99, denied.reset_ms));
    assert_eq!((get(&key).as_deref(), expires_at(&key)), (Some("1"), window_end));

    // The layout before, of the running window (window number 1): its count is kept.
    let s = uid("u");
    let key = keys::quota("fw", &s, "fw");
    let _: () = redis::cmd("SET").arg(&key).arg("1:7").arg("PXAT").arg(window_end).query(&mut redis.conn()).unwrap();
    assert_eq!(d.run(&RefundQuota::new("fw", &s, algo, 2).unwrap()).await.unwrap(), 2);
    assert_eq!((get(&key).as_deref(), expires_at(&key)), (Some("5"), window_end), "a refund writes the layout of now");
    assert_eq!(d.run(&take(&s, 1)).await.unwrap().remaining, 94);
    assert_eq!((get(&key).as_deref(), expires_at(&key)), (Some("6"), window_end));
    // Of an earlier window: nothing is carried over or refunded.
    let s = uid("u");
    let key = keys::quota("fw", &s, "fw");
    let _: () = redis::cmd("SET").arg(&key).arg("0:7").arg("PX").arg(60_000).query(&mut redis.conn()).unwrap();
    assert_eq!(d.run(&RefundQuota::new("fw", &s, algo, 2).unwrap()).await.unwrap(), 0);
    assert_eq!(d.run(&take(&s, 1)).await.unwrap().remaining, 99);
    assert_eq!((get(&key).as_deref(), expires_at(&key)), (Some("1"), window_end));
    // A count without an expiry, or one this script would never write, starts a new window.
    for (tampered, ttl) in [("50", None), ("-500", Some(60_000)), ("2.5", Some(60_000)), ("nan", Some(60_000))] {
        let s = uid("u");
        let key = keys::quota("fw", &s, "fw");
        let mut set = redis::cmd("SET");
        set.arg(&key).arg(tampered);
        if let Some(ms) = ttl {
            set.arg("PX").arg(ms);
        }
        let _: () = set.query(&mut redis.conn()).unwrap();
        assert_eq!(d.run(&take(&s, 1)).await.unwrap().remaining, 99, "{tampered}");
        assert_eq!((get(&key).as_deref(), expires_at(&key)), (Some("1"), window_end), "{tampered}");
    }

    // A count kept under a longer window (the policy's window_ms shortened since): it cannot be
    // the running window's, so the window restarts, ending where a 60 s window ends.
    let minute = Algorithm::FixedWindow { limit: 100, window_ms: 60_000 };
    let s = uid("u");
    let key = keys::quota("fw", &s, "fw");
    let _: () = redis::cmd("SET").arg(&key).arg("70").arg("PX").arg(3_600_000).query(&mut redis.conn()).unwrap();
    assert_eq!(d.run(&RefundQuota::new("fw", &s, minute, 5).unwrap()).await.unwrap(), 0, "not the window's units");
    let after = d.run(&TakeQuota::take("fw", &s, minute, 1).unwrap()).await.unwrap();
    assert_eq!(after.remaining, 99, "{after:?}");
    assert!(after.reset_ms <= 60_000, "{after:?}");
    assert_eq!((get(&key).as_deref(), expires_at(&key) % 60_000), (Some("1"), 0));
}

#[tokio::test]
async fn quota_sliding_window_is_exact() {
    let redis = RedisServer::start();
    let d = redis.direct().await;
    let s = uid("u");
    let algo = Algorithm::SlidingWindow { limit: 3, window_ms: 400 };
    let take = |cost| TakeQuota::take("sw", &s, algo, cost).unwrap();
    assert!(d.run(&take(1)).await.unwrap().allowed);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let b = d.run(&take(2)).await.unwrap();
    assert_eq!((b.allowed, b.remaining), (true, 0));
    let denied = d.run(&take(1)).await.unwrap();
    assert!(!denied.allowed);
    // One unit frees when the first call leaves the window, about 200 ms from now.
    assert!((100..=210).contains(&denied.retry_after_ms), "{denied:?}");
    assert!(denied.reset_ms > denied.retry_after_ms);
    tokio::time::sleep(Duration::from_millis(denied.retry_after_ms as u64 + 20)).await;
    let c = d.run(&take(1)).await.unwrap();
    assert_eq!((c.allowed, c.remaining), (true, 0), "exactly the first call's unit came back");
    let peek = d.run(&TakeQuota::peek("sw", &s, algo, 1).unwrap()).await.unwrap();
    assert!(!peek.allowed);
    let log: i64 = redis::cmd("ZCARD").arg(keys::quota("sw", &s, "sw")).query(&mut redis.conn()).unwrap();
    assert_eq!(log, 2, "expired entries are removed on the next admitted call");
}

/// The sliding log against a model: random takes and peeks with random costs on a log that
/// starts with entries of the earlier member layout (read by a scan until they leave the
/// window); then a long expired backlog is removed a bounded number of entries per call.
/// `REDCOUNT_SEED=<n>` replays a run.
#[tokio::test]
async fn quota_sliding_window_matches_a_model_across_layouts() {
    use rand::{Rng, SeedableRng};
    let seed: u64 = std::env::var("REDCOUNT_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
    });
    println!("quota_sliding_window_matches_a_model_across_layouts: REDCOUNT_SEED={seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let redis = RedisServer::start();
    let d = redis.direct().await;
    let s = uid("m");
    let limit: i64 = rng.random_range(5..=60);
    let window_ms = 600_000;
    let algo = Algorithm::SlidingWindow { limit, window_ms };
    let key = keys::quota("sm", &s, "sw");
    // Entries written by the earlier script: "<sec>.<usec>:<cost>[:n]".
    let (secs, usecs): (i64, i64) = redis::cmd("TIME").query(&mut redis.conn()).unwrap();
    let mut used = 0i64;
    for i in 0..rng.random_range(0..=3) {
        let cost = rng.random_range(1..=2);
        let member = if i == 1 { format!("{secs}.{usecs}:{cost}:1") } else { format!("{secs}.{}:{cost}", usecs + i) };
        let _: i64 =
            redis::cmd("ZADD").arg(&key).arg(secs * 1000 + usecs / 1000).arg(member).query(&mut redis.conn()).unwrap();
        used += cost;
    }
    let start = std::time::Instant::now();
    // Admitted entries of this run: when (since `start`) and what they cost.
    let mut log: Vec<(u128, i64)> = Vec::new();
    for step in 0..300 {
        let cost = rng.random_range(1..=limit.min(4));
        let peek = rng.random_bool(0.2);
        let op = if peek { TakeQuota::peek("sm", &s, algo, cost) } else { TakeQuota::take("sm", &s, algo, cost) };
        let before = start.elapsed().as_millis();
        let o = d.run(&op.unwrap()).await.unwrap();
        let at = start.elapsed().as_millis();
        let ctx = format!("seed {seed} step {step}: cost {cost} peek {peek} used {used} limit {limit}: {o:?}");
        assert_eq!(o.allowed, used + cost <= limit, "{ctx}");
        if o.allowed && !peek {
            used += cost;
            log.push((at, cost));
        }
        // A peek reports what is left now, as a denied call does.
        assert_eq!(o.remaining, (limit - used).max(0), "{ctx}");
        if !o.allowed && used > log.iter().map(|e| e.1).sum::<i64>() {
            // The earlier-layout entries free first; their time is the run's start.
            assert!(o.retry_after_ms <= window_ms && o.retry_after_ms > window_ms - 60_000, "{ctx}");
        } else if !o.allowed {
            let need = used + cost - limit;
            let mut freed = 0;
            let entry = log.iter().find(|e| {
                freed += e.1;
                freed >= need
            });
            let (t, _) = entry.expect("enough units are logged to free");
            // The entry leaves the window `window - (now - t)` from now, give or take the
            // time between the test's clock readings.
            let expected = window_ms as i128 - (before as i128 - *t as i128);
            let slack = (at - before) as i128 + 30;
            assert!((o.retry_after_ms as i128 - expected).abs() <= slack, "{ctx}: expected about {expected}");
        }
    }

    // A backlog of expired entries: a burst of 3,000 calls, one more call late in their
    // window (so the key lives on), then past the burst's window. A call removes at most 64
    // of them, and they count for nothing.
    let s2 = uid("b");
    let short = Algorithm::SlidingWindow { limit: 10_000, window_ms: 2_000 };
    let key2 = keys::quota("sb", &s2, "sw");
    for _ in 0..3_000 {
        assert!(d.run(&TakeQuota::take("sb", &s2, short, 1).unwrap()).await.unwrap().allowed);
    }
    tokio::time::sleep(Duration::from_millis(1_600)).await;
    assert!(d.run(&TakeQuota::take("sb", &s2, short, 1).unwrap()).await.unwrap().allowed);
    tokio::time::sleep(Duration::from_millis(600)).await;
    let mut c = redis.conn();
    let (size, expired): (i64, i64) = redis::pipe()
        .cmd("ZCARD")
        .arg(&key2)
        .cmd("ZCOUNT")
        .arg(&key2)
        .arg("-inf")
        .arg(format!("({}", {
            let (sec, usec): (i64, i64) = redis::cmd("TIME").query(&mut c).unwrap();
            sec * 1000 + usec / 1000 - 2_000
        }))
        .query(&mut c)
        .unwrap();
    assert!(expired >= 64, "the backlog was built: {expired} of {size} expired");
    let o = d.run(&TakeQuota::take("sb", &s2, short, 1).unwrap()).await.unwrap();
    assert!(o.allowed && o.remaining >= 10_000 - (size - expired) - 1, "expired entries count for nothing: {o:?}");
    let after: i64 = redis::cmd("ZCARD").arg(&key2).query(&mut c).unwrap();
    assert_eq!(after, size - 64 + 1, "a call removes at most 64 expired entries");
}

#[tokio::test]
async fn quota_token_bucket_refills_in_steps() {
    let redis = RedisServer::start();
    let d = redis.direct().await;
    let s = uid("u");
    let algo = Algorithm::TokenBucket { capacity: 3, refill: 1, interval_ms: 250 };
    let take = |cost| TakeQuota::take("tb", &s, algo, cost).unwrap();
    assert_eq!(d.run(&take(3)).await.unwrap().remaining, 0);
    let denied = d.run(&take(1)).await.unwrap();
    assert!(!denied.allowed);
    assert!((1..=250).contains(&denied.retry_after_ms), "{denied:?}");
    assert!((500..=750).contains(&denied.reset_ms), "{denied:?}");
    tokio::time::sleep(Duration::from_millis(denied.retry_after_ms as u64 + 20)).await;
    let one = d.run(&take(1)).await.unwrap();
    assert_eq!((one.allowed, one.remaining), (true, 0));
    assert!(!d.run(&take(1)).await.unwrap().allowed);
    assert!(!d.run(&take(2)).await.unwrap().allowed);
    let ttl = pttl(&redis, &keys::quota("tb", &s, "tb"));
    assert!(ttl > 0 && ttl <= 750, "the bucket key lives until it would be full: {ttl}");
}

#[tokio::test]
async fn semaphore_leases() {
    let redis = RedisServer::start();
    let d = redis.direct().await;
    let name = uid("pool");
    let op = |action, holder: &str, lease| UpdateLease::new("dev", &name, action, holder, 2, lease).unwrap();
    use SemaphoreResult::*;
    let r = d.run(&op(Action::Acquire, "a", 10_000)).await.unwrap();
    assert_eq!((r.result, r.in_use, r.limit, r.lease_ms), (Acquired, 1, 2, 10_000));
    assert_eq!(d.run(&op(Action::Acquire, "b", 200)).await.unwrap().result, Acquired);
    let full = d.run(&op(Action::Acquire, "c", 10_000)).await.unwrap();
    assert_eq!((full.result, full.in_use, full.lease_ms), (Full, 2, 0));
    assert!(matches!(full.earliest_end_ms, Some(ms) if ms <= 200), "{full:?}");
    assert_eq!(d.run(&op(Action::Acquire, "a", 10_000)).await.unwrap().result, Renewed, "acquire is idempotent");
    assert_eq!(d.run(&op(Action::Renew, "c", 10_000)).await.unwrap().result, NotHolder);
    assert_eq!(d.run(&op(Action::Release, "zz", 10_000)).await.unwrap().result, NotHolder);
    // b's short lease ends: its slot comes back without anyone releasing it.
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(d.run(&op(Action::Renew, "b", 10_000)).await.unwrap().result, NotHolder);
    assert_eq!(d.run(&op(Action::Acquire, "c", 10_000)).await.unwrap().result, Acquired);
    let rel = d.run(&op(Action::Release, "a", 10_000)).await.unwrap();
    assert_eq!((rel.result, rel.in_use), (Released, 1));
    assert_eq!(d.run(&op(Action::Release, "a", 10_000)).await.unwrap().result, NotHolder, "never below zero");
    let key = keys::semaphore("dev", &name);
    let t = pttl(&redis, &key);
    assert!(t > 9_000 && t <= 10_000, "the set lives as long as its longest lease: {t}");
    d.run(&op(Action::Release, "c", 10_000)).await.unwrap();
    assert_eq!(redis::cmd("EXISTS").arg(&key).query::<i64>(&mut redis.conn()).unwrap(), 0);
}

#[tokio::test]
async fn inbox_append_read_and_trim() {
    let redis = RedisServer::start();
    let d = redis.direct().await;
    let user = uid("u");
    let key = keys::inbox(&user);
    let week = 7 * 86_400_000;
    let first = d.run(&Append::new(&user, 100, "hello", week, 5).unwrap()).await.unwrap();
    assert_eq!((first.stored, first.length), (true, 1));
    let t = pttl(&redis, &key);
    assert!(t > week - 5_000 && t <= week, "ttl set on the first message: {t}");
    let dup = d.run(&Append::new(&user, 100, "again", week, 5).unwrap()).await.unwrap();
    assert_eq!((dup.stored, dup.length), (false, 1), "a retried append is stored once");
    for id in 101..=106 {
        d.run(&Append::new(&user, id, &format!("m{id} ünïcødé \"q\""), week, 5).unwrap()).await.unwrap();
    }
    let all = d.run(&Read::new(&user, None, 100).unwrap()).await.unwrap();
    assert_eq!(
        all.iter().map(|m| m.id).collect::<Vec<_>>(),
        vec![102, 103, 104, 105, 106],
        "capped at 5, oldest dropped"
    );
    assert_eq!(all[0].body, "m102 ünïcødé \"q\"".as_bytes());
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    assert!((all[0].time as i64 - now).abs() <= 5);
    let page = d.run(&Read::new(&user, Some(103), 2).unwrap()).await.unwrap();
    assert_eq!(page.iter().map(|m| m.id).collect::<Vec<_>>(), vec![104, 105]);

    // Messages written by another producer with old stamps (the original layout).
    let mut c = redis.conn();
    for (id, age) in [(1i64, 10 * 86_400i64), (2, 9 * 86_400), (3, 8 * 86_400)] {
        let mut m = ((now - age) as u32).to_le_bytes().to_vec();
        m.extend_from_slice(b"old");
        redis::cmd("ZADD").arg(&key).arg(id).arg(m).query::<()>(&mut c).unwrap();
    }
    let t = d.run(&Trim::new(&user, 7 * 86_400, 4, 100).unwrap()).await.unwrap();
    assert_eq!(t.deleted, 3 + 1, "three expired, then one over the length");
    assert!((t.newest_time.unwrap() - now).abs() <= 5);
    let left = d.run(&Read::new(&user, None, 100).unwrap()).await.unwrap();
    assert_eq!(left.iter().map(|m| m.id).collect::<Vec<_>>(), vec![103, 104, 105, 106]);

    // Everything expired: the inbox is deleted.
    let old = ((now - 100) as u32).to_le_bytes().to_vec();
    let other = uid("u");
    redis::cmd("ZADD").arg(keys::inbox(&other)).arg(1).arg(old).query::<()>(&mut c).unwrap();
    let t = d.run(&Trim::new(&other, 50, 10, 10).unwrap()).await.unwrap();
    assert_eq!((t.deleted, t.newest_time), (1, None));
    assert_eq!(redis::cmd("EXISTS").arg(keys::inbox(&other)).query::<i64>(&mut c).unwrap(), 0);
}

#[tokio::test]
async fn red_packet_lifecycle() {
    let redis = RedisServer::start();
    let d = redis.direct().await;
    let mut rng = rand::rng();
    let id = redpacket::new_id(&mut rng);
    let create = Create::new(&id, 10_000, 10, 1, 60_000, &mut rng).unwrap();
    assert_eq!(create.shares().iter().sum::<i64>(), 10_000);
    let made = d.run(&create).await.unwrap();
    assert!(made.created);
    let again = Create::new(&id, 500, 5, 1, 60_000, &mut rng).unwrap();
    assert!(!d.run(&again).await.unwrap().created, "an existing packet is never overwritten");

    let mut won = Vec::new();
    for i in 0..10 {
        match d.run(&Grab::new(&id, &format!("user{i}")).unwrap()).await.unwrap() {
            GrabOutcome::Won { amount, index, remaining } => {
                assert_eq!(index, i + 1);
                assert_eq!(remaining, 9 - i);
                won.push(amount);
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(won, create.shares(), "shares go out in the stored order");
    assert_eq!(d.run(&Grab::new(&id, "late").unwrap()).await.unwrap(), GrabOutcome::Empty);
    assert_eq!(
        d.run(&Grab::new(&id, "user3").unwrap()).await.unwrap(),
        GrabOutcome::Already { amount: won[3], index: 4 },
        "a winner who retries gets the same claim, even after the packet is empty"
    );
    let st = d.run(&ReadStatus::new(&id).unwrap()).await.unwrap().unwrap();
    assert_eq!((st.total, st.count, st.remaining, st.grabbed, st.grabbed_sum), (10_000, 10, 0, 10, 10_000));
    assert_eq!(st.expires_ms, made.expires_at_ms);
    let claims = d.run(&ReadGrabs::new(&id, 0, 100).unwrap()).await.unwrap();
    assert_eq!(claims.len(), 10);
    assert_eq!(claims.iter().map(|c| c.amount).sum::<i64>(), 10_000);
    assert_eq!(claims[3].user, "user3");
    let page = d.run(&ReadGrabs::new(&id, 8, 5).unwrap()).await.unwrap();
    assert_eq!(page.iter().map(|c| c.index).collect::<Vec<_>>(), vec![9, 10]);
    let [meta, shares, claims_key, log] = keys::redpacket(&id);
    for key in [meta, claims_key, log] {
        let t = pttl(&redis, &key);
        assert!(t > 0 && t <= 60_000, "{key} expires with the packet ({t})");
    }
    assert_eq!(pttl(&redis, &shares), -2, "the emptied share list is gone");

    let unknown = redpacket::new_id(&mut rng);
    assert_eq!(d.run(&Grab::new(&unknown, "a").unwrap()).await.unwrap(), GrabOutcome::NotFound);
    assert_eq!(d.run(&ReadStatus::new(&unknown).unwrap()).await.unwrap(), None);

    // Expiry: a short-lived packet becomes unknown.
    let short = redpacket::new_id(&mut rng);
    d.run(&Create::new(&short, 100, 2, 1, 100, &mut rng).unwrap()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(d.run(&Grab::new(&short, "a").unwrap()).await.unwrap(), GrabOutcome::NotFound);
}
