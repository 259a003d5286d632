//! Exact concurrency checks: many clients on many connections at once, every count exact.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use redcount_core::keys;
use redcount_core::ops::counter::Storage;
use redcount_core::ops::counter::{AddCounter, Bounds, CounterStatus};
use redcount_core::ops::quota::{Algorithm, TakeQuota};
use redcount_core::ops::redpacket::{self, Create, Grab, GrabOutcome, ReadStatus};
use redcount_core::ops::semaphore::{Action, SemaphoreResult, UpdateLease};
use redcount_tests::{RedisServer, uid};
use tokio::sync::Barrier;

/// `n` connections of their own (not one multiplexed pipe), so calls really race.
async fn connections(redis: &RedisServer, n: usize) -> Vec<redcount::Direct> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(redis.direct().await);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_hundred_grabbers_of_fifty_shares() {
    let redis = RedisServer::start();
    let conns = connections(&redis, 200).await;
    let mut rng = rand::rng();
    let id = redpacket::new_id(&mut rng);
    let total = 123_457;
    conns[0].run(&Create::new(&id, total, 50, 1, 60_000, &mut rng).unwrap()).await.unwrap();
    let barrier = Arc::new(Barrier::new(200));
    let mut tasks = Vec::new();
    for (i, d) in conns.into_iter().enumerate() {
        let (id, barrier) = (id.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let user = format!("user{i}");
            (user.clone(), d.run(&Grab::new(&id, &user).unwrap()).await.unwrap())
        }));
    }
    let mut winners = HashSet::new();
    let (mut sum, mut empty, mut indexes) = (0, 0, HashSet::new());
    for t in tasks {
        match t.await.unwrap() {
            (user, GrabOutcome::Won { amount, index, .. }) => {
                assert!(winners.insert(user), "nobody wins twice");
                assert!(indexes.insert(index), "no share handed out twice");
                sum += amount;
            }
            (_, GrabOutcome::Empty) => empty += 1,
            (_, other) => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!((winners.len(), empty), (50, 150));
    assert_eq!(sum, total);
    let d = redis.direct().await;
    let st = d.run(&ReadStatus::new(&id).unwrap()).await.unwrap().unwrap();
    assert_eq!((st.remaining, st.grabbed, st.grabbed_sum), (0, 50, total));
    let claims: i64 = redis::cmd("HLEN").arg(&keys::redpacket(&id)[2]).query(&mut redis.conn()).unwrap();
    assert_eq!(claims, 50);
}

async fn thousand_quota_calls(algo: Algorithm) {
    let redis = RedisServer::start();
    let conns = connections(&redis, 50).await;
    let subject = uid("burst");
    let barrier = Arc::new(Barrier::new(1000));
    let mut tasks = Vec::new();
    for i in 0..1000 {
        let (d, barrier, subject) = (conns[i % 50].clone(), barrier.clone(), subject.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            d.run(&TakeQuota::take("burst", &subject, algo, 1).unwrap()).await.unwrap()
        }));
    }
    let mut allowed = 0;
    for t in tasks {
        let o = t.await.unwrap();
        if o.allowed {
            allowed += 1;
        } else {
            assert!(o.retry_after_ms > 0 && o.remaining == 0, "{o:?}");
        }
    }
    assert_eq!(allowed, 100, "{algo:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thousand_quota_calls_limit_100_fixed() {
    thousand_quota_calls(Algorithm::FixedWindow { limit: 100, window_ms: 3_600_000 }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thousand_quota_calls_limit_100_sliding() {
    thousand_quota_calls(Algorithm::SlidingWindow { limit: 100, window_ms: 3_600_000 }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thousand_quota_calls_limit_100_bucket() {
    thousand_quota_calls(Algorithm::TokenBucket { capacity: 100, refill: 1, interval_ms: 3_600_000 }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thousand_quota_calls_limit_100_gcra() {
    thousand_quota_calls(Algorithm::Gcra { rate: 1, period_ms: 3_600_000, burst: 100 }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_hundred_holders_on_sixty_slots() {
    let redis = RedisServer::start();
    let conns = connections(&redis, 200).await;
    let name = uid("devices");
    let key = keys::semaphore("slots", &name);
    let barrier = Arc::new(Barrier::new(200));
    let holding = Arc::new(AtomicI64::new(0));
    let peak = Arc::new(AtomicI64::new(0));
    let mut tasks = Vec::new();
    for (i, d) in conns.into_iter().enumerate() {
        let (name, barrier, holding, peak) = (name.clone(), barrier.clone(), holding.clone(), peak.clone());
        tasks.push(tokio::spawn(async move {
            let holder = format!("dev{i}");
            let op = |a| UpdateLease::new("slots", &name, a, &holder, 60, 300_000).unwrap();
            barrier.wait().await;
            let got = d.run(&op(Action::Acquire)).await.unwrap();
            assert!(got.in_use <= 60, "{got:?}");
            let acquired = got.result == SemaphoreResult::Acquired;
            if acquired {
                let now = holding.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(now, Ordering::SeqCst);
            }
            barrier.wait().await; // everyone has tried; winners still hold
            (d, acquired, op(Action::Release))
        }));
    }
    let mut results = Vec::new();
    for t in tasks {
        results.push(t.await.unwrap());
    }
    // Checked while they hold: the set itself and the clients' own count.
    let held: i64 = redis::cmd("ZCARD").arg(&key).query(&mut redis.conn()).unwrap();
    assert_eq!(held, 60);
    assert_eq!(results.iter().filter(|r| r.1).count(), 60);
    assert_eq!(peak.load(Ordering::SeqCst), 60);
    for (d, acquired, release) in results {
        let r = d.run(&release).await.unwrap();
        let want = if acquired { SemaphoreResult::Released } else { SemaphoreResult::NotHolder };
        assert_eq!(r.result, want);
    }
    let left: i64 = redis::cmd("ZCARD").arg(&key).query(&mut redis.conn()).unwrap();
    assert_eq!(left, 0, "never below zero, nothing leaked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thousand_decrements_of_a_counter_at_500() {
    let redis = RedisServer::start();
    let conns = connections(&redis, 50).await;
    let subject = uid("stock");
    let floor = Bounds::default();
    conns[0].run(&AddCounter::new("stock", &subject, Storage::Key, 500, floor).unwrap()).await.unwrap();
    let barrier = Arc::new(Barrier::new(1000));
    let mut tasks = Vec::new();
    for i in 0..1000 {
        let (d, barrier, subject) = (conns[i % 50].clone(), barrier.clone(), subject.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            d.run(&AddCounter::new("stock", &subject, Storage::Key, -1, floor).unwrap()).await.unwrap()
        }));
    }
    let (mut applied, mut clamped) = (0, 0);
    for t in tasks {
        let o = t.await.unwrap();
        assert!(o.value >= 0);
        match o.status {
            CounterStatus::Applied => applied += 1,
            CounterStatus::Clamped => {
                assert_eq!(o.applied, 0);
                clamped += 1
            }
            CounterStatus::Rejected => panic!("clamp mode never rejects"),
        }
    }
    assert_eq!((applied, clamped), (500, 500));
    let v: i64 = redis::cmd("GET").arg(keys::counter("stock", &subject)).query(&mut redis.conn()).unwrap();
    assert_eq!(v, 0);
}
