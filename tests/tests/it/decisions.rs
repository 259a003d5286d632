//! Compound decisions: all or nothing, exactly, under a crowd; a denied decision writes
//! nothing; a seeded model of random decisions with peeks, replays and releases.

use std::collections::BTreeSet;
use std::sync::Arc;

use rand::{Rng, SeedableRng};
use redcount_core::Operation;
use redcount_core::keys;
use redcount_core::ops::decision::{Decide, LeaseResult, Part, PartOutcome};
use redcount_core::ops::quota::{Algorithm, TakeQuota};
use redcount_core::ops::semaphore::{Action, UpdateLease};
use redcount_core::ops::{Idempotency, Idempotent};
use redcount_tests::{Api, NativeServer, RedisServer, secret, uid};
use tokio::sync::Barrier;

const MINUTE: i64 = 60_000;

/// Waits until the current minute (Redis runs on this machine's clock) has at least 15 s
/// left, so a storm on a fixed window of one minute, aligned to the epoch, stays in one
/// window.
async fn clear_of_minute_boundary() {
    loop {
        let ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
        let left = MINUTE - ms % MINUTE;
        if left >= 15_000 {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(left as u64 + 50)).await;
    }
}

/// What a quota of `algo` still has for `subject`, by a peek (which writes nothing).
async fn remaining(d: &redcount::Direct, policy: &str, subject: &str, algo: Algorithm) -> i64 {
    d.run(&TakeQuota::peek(policy, subject, algo, 1).unwrap()).await.unwrap().remaining
}

/// The issue's storm: 1,000 concurrent decisions of A (100 per minute) AND B (50 per
/// minute) on one subject admit exactly 50, and A has exactly 50 used afterwards.
async fn storm(a: Algorithm, b: Algorithm) {
    let redis = RedisServer::start();
    let mut conns = Vec::new();
    for _ in 0..50 {
        conns.push(redis.direct().await);
    }
    let subject = uid("crowd");
    clear_of_minute_boundary().await;
    let barrier = Arc::new(Barrier::new(1000));
    let mut tasks = Vec::new();
    for i in 0..1000 {
        let (d, barrier, subject) = (conns[i % 50].clone(), barrier.clone(), subject.clone());
        tasks.push(tokio::spawn(async move {
            let op =
                Decide::new(&subject, vec![Part::quota("a", a, 1).unwrap(), Part::quota("b", b, 1).unwrap()]).unwrap();
            barrier.wait().await;
            d.run(&op).await.unwrap()
        }));
    }
    let mut admitted = 0;
    for t in tasks {
        let d = t.await.unwrap();
        if d.allowed {
            admitted += 1;
        } else {
            // Only B can deny: A has room for all of B's.
            assert_eq!(d.denied_by, Some(1), "{d:?}");
            assert!(d.retry_after_ms > 0, "{d:?}");
        }
    }
    assert_eq!(admitted, 50, "{a:?} AND {b:?}");
    assert_eq!(remaining(&conns[0], "a", &subject, a).await, 50, "A's usage is exactly 50: {a:?}");
    assert_eq!(remaining(&conns[0], "b", &subject, b).await, 0, "{b:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thousand_decisions_a_fixed_b_sliding_admit_exactly_fifty() {
    storm(
        Algorithm::FixedWindow { limit: 100, window_ms: MINUTE },
        Algorithm::SlidingWindow { limit: 50, window_ms: MINUTE },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thousand_decisions_a_sliding_b_fixed_admit_exactly_fifty() {
    storm(
        Algorithm::SlidingWindow { limit: 100, window_ms: MINUTE },
        Algorithm::FixedWindow { limit: 50, window_ms: MINUTE },
    )
    .await;
}

/// GCRA and bucket at 100 and 50 per hour (per minute, a unit would come back within the
/// storm and "exactly" would not hold).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thousand_decisions_a_gcra_b_bucket_admit_exactly_fifty() {
    storm(
        Algorithm::Gcra { rate: 100, period_ms: 3_600_000, burst: 100 },
        Algorithm::TokenBucket { capacity: 50, refill: 50, interval_ms: 3_600_000 },
    )
    .await;
}

/// A quota AND a semaphore lease: 1,000 holders, 30 slots; exactly 30 admitted, the quota
/// charged exactly 30, and the 30 leases are the admitted holders' with distinct tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thousand_decisions_with_a_lease_admit_exactly_the_free_slots() {
    let redis = RedisServer::start();
    let mut conns = Vec::new();
    for _ in 0..50 {
        conns.push(redis.direct().await);
    }
    let subject = uid("jobs");
    let quota = Algorithm::SlidingWindow { limit: 100, window_ms: MINUTE };
    let barrier = Arc::new(Barrier::new(1000));
    let mut tasks = Vec::new();
    for i in 0..1000 {
        let (d, barrier, subject) = (conns[i % 50].clone(), barrier.clone(), subject.clone());
        tasks.push(tokio::spawn(async move {
            let holder = format!("job-{i}");
            let parts = vec![
                Part::quota("per-min", quota, 1).unwrap(),
                Part::lease("in-flight", &holder, 30, 600_000).unwrap(),
            ];
            barrier.wait().await;
            (holder, d.run(&Decide::new(&subject, parts).unwrap()).await.unwrap())
        }));
    }
    let (mut admitted, mut tokens) = (BTreeSet::new(), BTreeSet::new());
    for t in tasks {
        let (holder, d) = t.await.unwrap();
        match (d.allowed, d.parts[1]) {
            (true, PartOutcome::Lease { result: LeaseResult::Acquired, fencing_token: Some(t), .. }) => {
                admitted.insert(holder);
                assert!(tokens.insert(t), "a fencing token issued twice");
            }
            (false, PartOutcome::Lease { result: LeaseResult::Full, .. }) => assert_eq!(d.denied_by, Some(1)),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(admitted.len(), 30);
    assert_eq!(remaining(&conns[0], "per-min", &subject, quota).await, 70, "the quota paid for 30 only");
    let holders: Vec<String> = redis::cmd("ZRANGE")
        .arg(keys::semaphore("in-flight", &subject))
        .arg(0)
        .arg(-1)
        .query(&mut redis.conn())
        .unwrap();
    assert_eq!(holders.into_iter().collect::<BTreeSet<_>>(), admitted);
}

/// The storm through `redcount serve` over HTTP: 1,000 concurrent `POST /api/decisions/…`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thousand_http_decisions_admit_exactly_fifty() {
    let redis = RedisServer::start();
    let policies = r#"{
        "a": {"kind": "quota", "algorithm": "fixed", "limit": 100, "window_ms": 60000},
        "b": {"kind": "quota", "algorithm": "sliding", "limit": 50, "window_ms": 60000}
    }"#;
    let admin = secret("admin");
    let server = NativeServer::start(&[("REDIS_URL", &redis.url())], &admin, policies);
    let api = Arc::new(Api::new(server.url(), &admin));
    let subject = uid("web");
    clear_of_minute_boundary().await;
    let barrier = Arc::new(Barrier::new(1000));
    let mut tasks = Vec::new();
    for _ in 0..1000 {
        let (api, barrier, path) = (api.clone(), barrier.clone(), format!("/api/decisions/{subject}"));
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            api.post(&path, r#"{"parts": [{"policy": "a"}, {"policy": "b", "cost": 1}]}"#).await
        }));
    }
    let mut admitted = 0;
    for t in tasks {
        let r = t.await.unwrap();
        assert_eq!(r.status, 200, "{:?}", r.json);
        if r.json["allowed"] == true {
            admitted += 1;
        } else {
            assert_eq!(r.json["denied_by"], "b", "{}", r.json);
            assert_eq!(r.json["parts"][0]["allowed"], true, "A alone would admit: {}", r.json);
            assert!(r.headers.contains_key("retry-after"));
        }
    }
    assert_eq!(admitted, 50);
    let a = api.get(&format!("/api/quotas/a/{subject}")).await;
    assert_eq!(a.json["remaining"], 50, "A's usage is exactly 50: {}", a.json);
}

/// The state of every key a decision may touch, byte for byte (DUMP), to show what a
/// denied decision, or a peek, left unchanged.
fn dump(redis: &RedisServer, keys: &[String]) -> Vec<Option<Vec<u8>>> {
    let mut c = redis.conn();
    keys.iter().map(|k| redis::cmd("DUMP").arg(k).query::<Option<Vec<u8>>>(&mut c).unwrap()).collect()
}

/// One quota policy of the model: its algorithm, with a window so long that nothing comes
/// back during the test, so what remains is exactly the limit less what was admitted.
struct QuotaModel {
    name: &'static str,
    algo: Algorithm,
    used: i64,
}

/// Random decisions over four quotas (one per algorithm) and a semaphore, checked against a
/// model after every step: admission, `denied_by`, each part's remaining, nothing written
/// by a denied decision or a peek, a replay (same Idempotency-Key) consuming nothing again.
/// Releases through the semaphore route are mixed in. The seed is printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_decisions_match_the_model() {
    let seed: u64 =
        std::env::var("REDCOUNT_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| rand::rng().random());
    println!("seed {seed} (replay: REDCOUNT_SEED={seed} cargo test … random_decisions_match_the_model)");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let redis = RedisServer::start();
    let d = redis.direct().await;
    let long = 1_000_000_000_000;
    let mut quotas = vec![
        QuotaModel {
            name: "fw",
            algo: Algorithm::FixedWindow { limit: rng.random_range(3..30), window_ms: long },
            used: 0,
        },
        QuotaModel {
            name: "sw",
            algo: Algorithm::SlidingWindow { limit: rng.random_range(3..30), window_ms: long },
            used: 0,
        },
        QuotaModel {
            name: "tb",
            algo: Algorithm::TokenBucket { capacity: rng.random_range(3..30), refill: 1, interval_ms: long },
            used: 0,
        },
        QuotaModel {
            name: "gc",
            algo: Algorithm::Gcra { rate: 1, period_ms: 31_622_400_000, burst: rng.random_range(3..30) },
            used: 0,
        },
    ];
    let (sem_limit, lease) = (rng.random_range(1..4), 600_000_000);
    let mut held: BTreeSet<String> = BTreeSet::new();
    // Each holder's token of its current lease.
    let mut tokens: std::collections::BTreeMap<String, i64> = std::collections::BTreeMap::new();
    let subject = uid("model");
    let mut every_key: Vec<String> = quotas.iter().map(|q| keys::quota(q.name, &subject, tag(q.algo))).collect();
    every_key.extend(keys::semaphore_keys(&keys::semaphore("sem", &subject)));
    let mut replays: Vec<(Decide, Idempotency, redcount_core::ops::decision::Decision, String)> = Vec::new();
    let steps = std::env::var("REDCOUNT_MODEL_STEPS").ok().and_then(|s| s.parse().ok()).unwrap_or(300);
    for step in 0..steps {
        let ctx = format!("seed {seed}, step {step}");
        if rng.random_bool(0.1) && !held.is_empty() {
            let h = held.iter().nth(rng.random_range(0..held.len())).unwrap().clone();
            let op = UpdateLease::new("sem", &subject, Action::Release, &h, sem_limit, lease).unwrap();
            d.run(&op).await.unwrap();
            held.remove(&h);
            tokens.remove(&h);
            continue;
        }
        if rng.random_bool(0.1) && !replays.is_empty() {
            let (op, idem, first, holder) = &replays[rng.random_range(0..replays.len())];
            let before = dump(&redis, &every_key);
            let again = d.run(&Idempotent::new(op.clone(), Some(idem.clone()))).await.unwrap();
            assert_eq!(dump(&redis, &every_key), before, "{ctx}: a replay writes nothing");
            // Its quotas answer as the first call did; its lease is reported as it is now:
            // still this grant's (same token), or ended, and then the decision is not allowed.
            let mut still = true;
            for (a, b) in again.parts.iter().zip(&first.parts) {
                match (a, b) {
                    (PartOutcome::Quota(a), PartOutcome::Quota(b)) => assert_eq!(a, b, "{ctx}"),
                    (
                        PartOutcome::Lease { result, fencing_token, in_use, .. },
                        PartOutcome::Lease { fencing_token: Some(t), result: granted, .. },
                    ) => {
                        let live = tokens.get(holder).is_some_and(|now| now == t);
                        assert_eq!(*in_use, held.len() as i64, "{ctx}");
                        if live {
                            assert_eq!((*result, *fencing_token), (*granted, Some(*t)), "{ctx}");
                        } else {
                            assert_eq!((*result, *fencing_token), (LeaseResult::Ended, None), "{ctx}: {again:?}");
                            still = false;
                        }
                    }
                    other => panic!("{ctx}: {other:?}"),
                }
            }
            assert_eq!(again.allowed, still, "{ctx}: {again:?}");
            continue;
        }
        // A random subset of the parts, in random order, random costs.
        let mut order: Vec<usize> = (0..5).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.random_range(0..=i));
        }
        order.truncate(rng.random_range(1..=5));
        let holder = format!("h{}", rng.random_range(0..6));
        let mut parts = Vec::new();
        let mut costs = Vec::new();
        for &i in &order {
            if i == 4 {
                parts.push(Part::lease("sem", &holder, sem_limit, lease).unwrap());
                costs.push(0);
            } else {
                let q = &quotas[i];
                let cost = rng.random_range(1..=3.min(q.algo.limit()));
                parts.push(Part::quota(q.name, q.algo, cost).unwrap());
                costs.push(cost);
            }
        }
        let peek = rng.random_bool(0.15);
        let op = if peek { Decide::peek(&subject, parts).unwrap() } else { Decide::new(&subject, parts).unwrap() };
        // The model's answer.
        let admits: Vec<bool> = order
            .iter()
            .zip(&costs)
            .map(|(&i, &c)| {
                if i == 4 {
                    held.contains(&holder) || (held.len() as i64) < sem_limit
                } else {
                    quotas[i].used + c <= quotas[i].algo.limit()
                }
            })
            .collect();
        let allowed = admits.iter().all(|&a| a);
        let before = dump(&redis, &every_key);
        let idem = Idempotency::new(format!("{seed}-{step}").as_bytes(), b"{}");
        let got = d.run(&Idempotent::new(op.clone(), Some(idem.clone()))).await.unwrap();
        assert_eq!(got.allowed, allowed, "{ctx}: {got:?}");
        assert_eq!(got.denied_by, admits.iter().position(|a| !a), "{ctx}: {got:?}");
        if allowed && !peek {
            for (&i, &c) in order.iter().zip(&costs) {
                if i == 4 {
                    held.insert(holder.clone());
                    if let Some(PartOutcome::Lease { fencing_token: Some(t), .. }) =
                        order.iter().position(|&j| j == 4).map(|k| got.parts[k])
                    {
                        tokens.insert(holder.clone(), t);
                    }
                } else {
                    quotas[i].used += c;
                }
            }
        } else {
            assert_eq!(dump(&redis, &every_key), before, "{ctx}: a denied decision or a peek writes nothing");
        }
        for ((&i, part), admits) in order.iter().zip(&got.parts).zip(&admits) {
            assert_eq!(part.allowed(), *admits, "{ctx}: part {i}: {part:?}");
            match part {
                PartOutcome::Quota(q) => {
                    let m = &quotas[i];
                    assert_eq!(q.remaining, m.algo.limit() - m.used, "{ctx}: {}: {q:?}", m.name);
                    assert_eq!(q.limit, m.algo.limit());
                }
                PartOutcome::Lease { in_use, fencing_token, .. } => {
                    assert_eq!(*in_use, held.len() as i64, "{ctx}");
                    assert_eq!(fencing_token.is_some(), allowed && !peek, "{ctx}: a token only with a lease");
                }
            }
        }
        // Only an admitted decision is stored (a denied one changed nothing: its retry is new).
        if allowed && !peek {
            replays.push((op, idem, got, holder));
        }
    }
    // Every quota's state agrees with the model at the end (peeks, outside any decision).
    for q in &quotas {
        assert_eq!(remaining(&d, q.name, &subject, q.algo).await, q.algo.limit() - q.used, "seed {seed}: {}", q.name);
    }
    let live: i64 = redis::cmd("ZCARD").arg(keys::semaphore("sem", &subject)).query(&mut redis.conn()).unwrap();
    assert_eq!(live, held.len() as i64, "seed {seed}");
}

fn tag(a: Algorithm) -> &'static str {
    match a {
        Algorithm::FixedWindow { .. } => "fw",
        Algorithm::SlidingWindow { .. } => "sw",
        Algorithm::TokenBucket { .. } => "tb",
        Algorithm::Gcra { .. } => "gc",
    }
}

/// A decision's keys are all in one slot: it runs on a Cluster, where the subject's
/// quotas and semaphore live on one master.
#[test]
fn a_decisions_keys_share_one_slot() {
    let parts = vec![
        Part::quota("per-second", Algorithm::FixedWindow { limit: 2, window_ms: 1000 }, 1).unwrap(),
        Part::quota("per-day", Algorithm::Gcra { rate: 100, period_ms: 86_400_000, burst: 100 }, 1).unwrap(),
        Part::lease("in-flight", "job-7", 3, 30_000).unwrap(),
    ];
    let op = Decide::new("alice", parts).unwrap();
    let request = op.request();
    // Redis Cluster hashes only the text between the first `{` and the next `}`.
    let tag = |k: &str| {
        let open = k.find('{').unwrap();
        k[open + 1..open + 1 + k[open + 1..].find('}').unwrap()].to_string()
    };
    let tags: BTreeSet<String> = request.keys().iter().map(|k| tag(k)).collect();
    assert_eq!(tags.into_iter().collect::<Vec<_>>(), ["u:alice"], "{:?}", request.keys());
}
