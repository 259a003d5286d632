//! Fencing tokens: a semaphore grant carries a token minted in the same script, strictly
//! increasing per semaphore and kept by renewals; a check tells a live lease from an ended
//! one, so a holder whose lease expired never has its token called live after a newer one
//! was issued.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use redcount_core::ops::semaphore::{Action, SemaphoreResult, UpdateLease};
use redcount_tests::RedisServer;

#[derive(Debug, Clone, Copy)]
struct Grant {
    token: i64,
    sent: Instant,
    received: Instant,
}

#[derive(Debug, Clone, Copy)]
struct Check {
    token: i64,
    sent: Instant,
    received: Instant,
    result: SemaphoreResult,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn expired_holders_never_see_their_token_live_after_a_newer_one() {
    let redis = RedisServer::start();
    let d = redcount::Direct::connect(&redis.url()).await.unwrap();
    // One slot, 40 ms leases: holders that sleep past theirs lose them mid-storm.
    let (limit, lease) = (1, 40);
    let grants = Arc::new(Mutex::new(Vec::<Grant>::new()));
    let checks = Arc::new(Mutex::new(Vec::<Check>::new()));
    let seed: u64 = rand::rng().random();
    println!("seed {seed}");
    let tasks: Vec<_> = (0..12)
        .map(|i| {
            let (d, grants, checks) = (d.clone(), grants.clone(), checks.clone());
            tokio::spawn(async move {
                let mut rng = rand::rngs::StdRng::seed_from_u64(seed + i);
                let holder = format!("h{i}");
                let op = |action| UpdateLease::new("fence", "lock", action, &holder, limit, lease).unwrap();
                let until = Instant::now() + Duration::from_millis(2500);
                while Instant::now() < until {
                    let sent = Instant::now();
                    let got = d.run(&op(Action::Acquire)).await.unwrap();
                    let received = Instant::now();
                    if got.result != SemaphoreResult::Acquired {
                        tokio::time::sleep(Duration::from_millis(rng.random_range(0..10))).await;
                        continue;
                    }
                    let token = got.fencing_token.expect("a grant carries a token");
                    grants.lock().unwrap().push(Grant { token, sent, received });
                    if rng.random_bool(0.3) {
                        let renewed = d.run(&op(Action::Renew)).await.unwrap();
                        if renewed.result == SemaphoreResult::Renewed {
                            assert_eq!(renewed.fencing_token, Some(token), "a renewal keeps the token");
                        }
                    }
                    // Half of them work past their lease.
                    tokio::time::sleep(Duration::from_millis(rng.random_range(0..2 * lease as u64))).await;
                    let sent = Instant::now();
                    let c = d.run(&op(Action::Check { fencing_token: token })).await.unwrap();
                    let received = Instant::now();
                    checks.lock().unwrap().push(Check { token, sent, received, result: c.result });
                    let _ = d.run(&op(Action::Release)).await.unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let grants = grants.lock().unwrap().clone();
    let checks = checks.lock().unwrap().clone();
    // Strictly increasing: a grant answered before another was asked has the smaller token.
    let mut tokens: Vec<i64> = grants.iter().map(|g| g.token).collect();
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), grants.len(), "a token was issued twice");
    for a in &grants {
        for b in grants.iter().filter(|b| a.received < b.sent) {
            assert!(a.token < b.token, "seed {seed}: token {} granted after {} but smaller", b.token, a.token);
        }
    }
    // A check that says "held" was not sent after a newer token had been granted.
    let (mut held, mut ended, mut forgotten) = (0, 0, 0);
    for c in &checks {
        match c.result {
            SemaphoreResult::Held => {
                held += 1;
                let newer = grants.iter().find(|g| g.token > c.token && g.received < c.sent);
                assert!(newer.is_none(), "seed {seed}: token {} called live after {newer:?} was granted", c.token);
            }
            SemaphoreResult::Ended => ended += 1,
            // The tokens are kept one lease past the semaphore's last lease (or release), so
            // a token is known as issued at least one lease after it was minted; later, with
            // the semaphore idle, its record may be gone (CI under load: a holder's check
            // came after that). Never sooner.
            SemaphoreResult::NeverHeld => {
                forgotten += 1;
                let g = grants.iter().find(|g| g.token == c.token).expect("checks are of granted tokens");
                assert!(
                    c.received.duration_since(g.sent) >= Duration::from_millis(lease as u64 - 1),
                    "seed {seed}: token {} answered never held {:?} after it was asked for",
                    c.token,
                    c.received.duration_since(g.sent)
                );
            }
            other => panic!("seed {seed}: a check of an issued token answered {other:?}"),
        }
    }
    println!("{} grants, {held} checks live, {ended} ended, {forgotten} forgotten", grants.len());
    assert!(held > 5 && ended > 5, "both sides reached (seed {seed}): {held} live, {ended} ended");
}

/// A semaphore with 2,500 leases over at once: a call reclaims at most 1,000 (its Redis time
/// stays bounded), and every call counts only live leases, so the leftovers never hold a slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_of_ended_leases_is_reclaimed_in_bounded_steps() {
    use redcount_core::keys;
    let redis = RedisServer::start();
    let d = redcount::Direct::connect(&redis.url()).await.unwrap();
    let set = keys::semaphore("bulk", "pool");
    // 2,500 leases that ended a minute ago, written as the script writes them, and one live.
    let mut conn = redis.conn();
    let ended = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64 - 60_000;
    let mut zadd = redis::cmd("ZADD");
    zadd.arg(&set);
    for i in 0..2_500 {
        zadd.arg(ended).arg(format!("old{i}"));
    }
    zadd.query::<()>(&mut conn).unwrap();
    let acquire = |h: &str| UpdateLease::new("bulk", "pool", Action::Acquire, h, 2, 600_000).unwrap();
    let card = |conn: &mut redis::Connection| -> i64 { redis::cmd("ZCARD").arg(&set).query(conn).unwrap() };
    let first = d.run(&acquire("a")).await.unwrap();
    assert_eq!((first.result, first.in_use), (SemaphoreResult::Acquired, 1), "ended leases hold no slot: {first:?}");
    assert_eq!(card(&mut conn), 1 + 2_250, "one call reclaimed 250 ended leases, not all 2,500");
    // A check changes nothing, not even the backlog (byte for byte).
    let dump = |conn: &mut redis::Connection| -> Vec<u8> { redis::cmd("DUMP").arg(&set).query(conn).unwrap() };
    let before = dump(&mut conn);
    let token = first.fencing_token.unwrap();
    let check = UpdateLease::new("bulk", "pool", Action::Check { fencing_token: token }, "a", 2, 600_000).unwrap();
    assert_eq!(d.run(&check).await.unwrap().result, SemaphoreResult::Held);
    assert_eq!(dump(&mut conn), before, "a check wrote");
    let second = d.run(&acquire("b")).await.unwrap();
    assert_eq!((second.result, second.in_use), (SemaphoreResult::Acquired, 2), "{second:?}");
    assert_eq!(d.run(&acquire("c")).await.unwrap().result, SemaphoreResult::Full);
    // Each renewal takes at most 250 more; the backlog is gone after ten calls in all.
    let renew = UpdateLease::new("bulk", "pool", Action::Renew, "a", 2, 600_000).unwrap();
    let mut left = card(&mut conn);
    while left > 2 {
        assert_eq!(d.run(&renew).await.unwrap().result, SemaphoreResult::Renewed);
        let now = card(&mut conn);
        assert_eq!(now, (left - 250).max(2), "at most 250 per call");
        left = now;
    }
}
