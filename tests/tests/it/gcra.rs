//! GCRA quotas: the real script, driven over virtual time, admits exactly what the
//! definition admits (concurrent exactness: concurrency.rs).

use rand::{Rng, SeedableRng};
use redcount_core::ops::quota::{self, Algorithm};
use redcount_tests::RedisServer;

/// The GCRA script with Redis's clock replaced by a virtual one (a key the test sets), so
/// its admissions can be compared with the definition exactly. Its expiry would run on real
/// time (a key past its TAT is the same as no key), so it is left out here.
fn with_virtual_clock(source: &str) -> String {
    let (clock, expire) = ("redis.call('TIME')", "redis.call('PEXPIRE'");
    assert!(source.contains(clock) && source.contains(expire), "the script reads the server's clock and expires");
    let (shebang, rest) = source.split_once('\n').unwrap();
    let rest = rest.replace(clock, "redis.call('HMGET', 'vclock', 's', 'us')").replace(expire, "no_expiry('PEXPIRE'");
    format!("{shebang}\nlocal function no_expiry() end\n{rest}")
}

/// The definition, in exact integers: time in units of 1/rate µs, one unit of quota every
/// T = period_ms * 1000 of them; a call of `cost` passes when the theoretical arrival time,
/// moved on by cost * T, stays within burst * T of now.
struct Model {
    rate: i128,
    t: i128,
    burst: i128,
    tat: i128,
}

impl Model {
    /// (allowed, remaining, reset_ms, retry_after_ms) of a call at `now_us`.
    fn call(&mut self, now_us: i128, cost: i128, peek: bool) -> (bool, i128, i128, i128) {
        let now = now_us * self.rate;
        let window = self.burst * self.t;
        let ahead = (self.tat - now).clamp(0, window);
        let after = ahead + cost * self.t;
        let allowed = after <= window;
        let ahead = if allowed && !peek {
            self.tat = now + after;
            after
        } else {
            ahead
        };
        let ms = |u: i128| (u + self.rate * 1000 - 1) / (self.rate * 1000);
        let retry = if allowed { 0 } else { ms(after - window) };
        (allowed, (window - ahead) / self.t, ms(ahead), retry)
    }
}

#[test]
fn gcra_admits_exactly_what_the_definition_admits_over_virtual_time() {
    let redis = RedisServer::start();
    let mut conn = redis.conn();
    let script = redis::Script::new(&with_virtual_clock(&quota_gcra_source()));
    let seed: u64 = rand::rng().random();
    println!("seed {seed} (replay: set it in gcra_admits_exactly_what_the_definition_admits_over_virtual_time)");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    // Configurations from the extremes of the allowed ranges and in between.
    let mut configs = vec![
        (100_000, 1_000, 100_000),                          // 100,000 per second: T = 10 µs
        (quota::MAX_GCRA_RATE, 1_000, 1_000),               // T = 0.1 µs
        (3, 1_000, 2),                                      // T = 333,333.3 µs
        (1, quota::MAX_GCRA_PERIOD_MS, 142),                // one a year, near the span bound
        (7, 86_400_000, quota::MAX_GCRA_SPAN / 86_400_000), // a day, the largest burst
        (999_983, 31_536_000_000, 142),                     // a prime rate over a year
    ];
    for _ in 0..10 {
        let period = rng.random_range(1..=quota::MAX_GCRA_PERIOD_MS);
        let burst = rng.random_range(1..=(quota::MAX_GCRA_SPAN / period).clamp(1, 1_000));
        configs.push((rng.random_range(1..=quota::MAX_GCRA_RATE), period, burst));
    }
    let (mut allowed_n, mut denied_n) = (0, 0);
    for (i, &(rate, period_ms, burst)) in configs.iter().enumerate() {
        Algorithm::Gcra { rate, period_ms, burst }.validate().unwrap();
        let key = format!("gc{i}");
        let mut model = Model { rate: rate.into(), t: i128::from(period_ms) * 1000, burst: burst.into(), tat: 0 };
        // A 2026 start, in µs; steps from none to a few emission intervals.
        let mut now: i64 = 1_790_000_000_000_000 + rng.random_range(0..1_000_000);
        let interval_us = (period_ms * 1000 / rate).max(1);
        for step in 0..300 {
            now += match rng.random_range(0..5) {
                0 => 0,
                // The server's clock stepped back (NTP): admissions stay within the burst.
                4 if step % 50 == 49 => -rng.random_range(0..=(interval_us.saturating_mul(burst)).min(1 << 45)),
                1 => rng.random_range(0..=interval_us.min(1 << 40)),
                2 => rng.random_range(0..=(interval_us.saturating_mul(burst)).min(1 << 45)),
                _ => rng.random_range(0..3),
            };
            let most = if rng.random_range(0..3) == 0 { burst } else { burst.min(3) };
            let cost = rng.random_range(1..=most);
            let peek = rng.random_range(0..6) == 0;
            let _: () = redis::cmd("HSET")
                .arg("vclock")
                .arg("s")
                .arg(now / 1_000_000)
                .arg("us")
                .arg(now % 1_000_000)
                .query(&mut conn)
                .unwrap();
            let got: Vec<i64> = script
                .key(&key)
                .key(format!("{key}:ovr"))
                .arg(rate)
                .arg(period_ms)
                .arg(burst)
                .arg(cost)
                .arg(if peek { "1" } else { "0" })
                .invoke(&mut conn)
                .unwrap();
            let (allowed, remaining, reset, retry) = model.call(now.into(), cost.into(), peek);
            let want = vec![
                i64::from(allowed),
                burst,
                remaining.try_into().unwrap(),
                reset.try_into().unwrap(),
                retry.try_into().unwrap(),
            ];
            assert_eq!(
                got, want,
                "seed {seed}, config {i} (rate {rate} per {period_ms} ms, burst {burst}), step {step}: cost {cost}, peek {peek}"
            );
            if allowed { allowed_n += 1 } else { denied_n += 1 }
        }
    }
    println!("{allowed_n} admitted, {denied_n} denied, all as the definition says");
    assert!(allowed_n > 100 && denied_n > 100, "both sides reached");
}

fn quota_gcra_source() -> String {
    // The shebang line is for EVAL of the whole; redis::Script sends it as is.
    redcount_core::script::QUOTA_GCRA.source()
}

/// Every quota algorithm: a denied call costs nothing (the state is byte for byte what it
/// was), and a refund gives units back, never above the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn denied_calls_cost_nothing_and_refunds_never_pass_the_limit() {
    use redcount_core::ops::quota::{RefundQuota, TakeQuota};
    let redis = RedisServer::start();
    let d = redcount::Direct::connect(&redis.url()).await.unwrap();
    let mut conn = redis.conn();
    let algos = [
        // A window of 10^12 ms (aligned to the epoch) does not end during the test.
        Algorithm::FixedWindow { limit: 5, window_ms: 1_000_000_000_000 },
        Algorithm::SlidingWindow { limit: 5, window_ms: 3_600_000 },
        Algorithm::TokenBucket { capacity: 5, refill: 1, interval_ms: 3_600_000 },
        Algorithm::Gcra { rate: 1, period_ms: 3_600_000, burst: 5 },
    ];
    for (i, algo) in algos.into_iter().enumerate() {
        let (policy, subject) = (format!("dn{i}"), "s");
        let take = |cost| TakeQuota::take(&policy, subject, algo, cost).unwrap();
        let takes = |n: usize| {
            let d = d.clone();
            let op = take(1);
            async move {
                let mut allowed = 0;
                for _ in 0..n {
                    allowed += i64::from(d.run(&op).await.unwrap().allowed);
                }
                allowed
            }
        };
        assert_eq!(takes(8).await, 5, "{algo:?}: the limit");
        let key: String = redis::cmd("KEYS").arg(format!("*dn{i}*")).query::<Vec<String>>(&mut conn).unwrap().remove(0);
        let dump = |conn: &mut redis::Connection| -> Vec<u8> { redis::cmd("DUMP").arg(&key).query(conn).unwrap() };
        let before = dump(&mut conn);
        for cost in [1, 2, 5, 1, 3] {
            let o = d.run(&take(cost)).await.unwrap();
            assert!(!o.allowed && o.remaining == 0 && o.retry_after_ms > 0, "{algo:?}: {o:?}");
            let peek = d.run(&TakeQuota::peek(&policy, subject, algo, cost).unwrap()).await.unwrap();
            assert!(!peek.allowed, "{algo:?}: {peek:?}");
        }
        assert_eq!(dump(&mut conn), before, "{algo:?}: a denied call wrote");
        // Two back: exactly two more pass.
        assert_eq!(d.run(&RefundQuota::new(&policy, subject, algo, 2).unwrap()).await.unwrap(), 2, "{algo:?}");
        assert_eq!(takes(4).await, 2, "{algo:?}: after a refund of 2");
        // Everything back, then more: never above the limit.
        assert_eq!(d.run(&RefundQuota::new(&policy, subject, algo, 5).unwrap()).await.unwrap(), 5, "{algo:?}");
        assert_eq!(d.run(&RefundQuota::new(&policy, subject, algo, 3).unwrap()).await.unwrap(), 0, "{algo:?}");
        assert_eq!(takes(8).await, 5, "{algo:?}: whole again, and no more");
    }
}

/// A sliding window's refunds, at random against a model (seed printed): takes of random
/// costs and refunds of random sizes, each answered exactly (what was given back, what
/// remains), the log's running totals kept true through partial refunds (a later take sees
/// exactly the model's room). Refunds are O(log n): one search, one range removal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sliding_refunds_match_the_model() {
    use redcount_core::ops::quota::{RefundQuota, TakeQuota};
    let seed: u64 = rand::rng().random();
    println!("seed {seed} (replay: set it in sliding_refunds_match_the_model)");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let redis = RedisServer::start();
    let d = redcount::Direct::connect(&redis.url()).await.unwrap();
    let limit = rng.random_range(5..60);
    let algo = Algorithm::SlidingWindow { limit, window_ms: 3_600_000 };
    let mut used = 0;
    for step in 0..400 {
        if rng.random_bool(0.3) {
            let units = rng.random_range(1..=limit);
            let given = d.run(&RefundQuota::new("rf", "s", algo, units).unwrap()).await.unwrap();
            assert_eq!(given, units.min(used), "seed {seed}, step {step}: refund of {units} with {used} used");
            used -= given;
        } else {
            let cost = rng.random_range(1..=limit.min(7));
            let o = d.run(&TakeQuota::take("rf", "s", algo, cost).unwrap()).await.unwrap();
            assert_eq!(o.allowed, used + cost <= limit, "seed {seed}, step {step}: {o:?}");
            if o.allowed {
                used += cost;
            }
            assert_eq!(o.remaining, limit - used, "seed {seed}, step {step}: {o:?}");
        }
    }
    // One refund changes at most the newest 500 logged calls (its Redis time stays bounded):
    // 1,200 calls of one unit; refunds of all 1,200 give 500, 500, then the last 200.
    let big = Algorithm::SlidingWindow { limit: 10_000, window_ms: 3_600_000 };
    let take = TakeQuota::take("rf", "big", big, 1).unwrap();
    for _ in 0..1_200 {
        assert!(d.run(&take).await.unwrap().allowed);
    }
    let refund = RefundQuota::new("rf", "big", big, 1_200).unwrap();
    for (given, left) in [(500, 700), (500, 200), (200, 0)] {
        assert_eq!(d.run(&refund).await.unwrap(), given);
        assert_eq!(d.run(&TakeQuota::peek("rf", "big", big, 1).unwrap()).await.unwrap().remaining, 10_000 - left);
    }
}
