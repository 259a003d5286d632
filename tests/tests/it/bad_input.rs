//! The bad-input table: every hostile value is refused by the core, naming the field,
//! before anything reaches Redis; and the scripts refuse it again if a caller skips the core.

use redcount_core::ops::claim::Claim;
use redcount_core::ops::counter::{AddCounter, Bounds, Storage};
use redcount_core::ops::inbox::{Append, Read, Trim};
use redcount_core::ops::quota::{Algorithm, TakeQuota};
use redcount_core::ops::redpacket::{Create, Grab, ReadGrabs, ReadStatus};
use redcount_core::ops::semaphore::{Action, UpdateLease};
use redcount_core::validate::{self, MAX_SAFE};
use redcount_core::{ErrorKind, InputError, Operation, keys};
use redcount_tests::RedisServer;
use serde_json::json;

const BAD_NUMBERS: &[&str] = &[
    "NaN",
    "nan",
    "inf",
    "-inf",
    "Infinity",
    "1e3",
    "0x10",
    " 5 ",
    " 5",
    "5 ",
    "2.5",
    "+5",
    "007",
    "-0",
    "",
    "-",
    "9007199254740993",
    "99999999999999999999999",
    "5a",
    "١٢",
];

const BAD_IDS: &[&str] = &["", "a{b", "a}b", "a:b", "{rp:x}", "a b", "a/b", "../x", "a\nb", "ünïcødé", "a\0b", "%2F"];

/// A named input check: the case's name and the constructor it feeds.
type Case = (&'static str, Box<dyn Fn(&str) -> Result<(), InputError>>);

/// Parses a numeric field the way the HTTP layer does, then builds the operation.
fn numeric_cases() -> Vec<Case> {
    let mut rng = rand::rng();
    let _ = &mut rng;
    vec![
        (
            "delta",
            Box::new(|s| {
                let n = validate::int_str("delta", s, -MAX_SAFE, MAX_SAFE)?;
                AddCounter::new("p", "s", Storage::Key, n, Bounds::default()).map(drop)
            }),
        ),
        (
            "window_ms",
            Box::new(|s| {
                let n = validate::int_str("window_ms", s, 1, MAX_SAFE)?;
                Claim::new("p", "s", n).map(drop)
            }),
        ),
        (
            "cost",
            Box::new(|s| {
                let n = validate::int_str("cost", s, 1, MAX_SAFE)?;
                TakeQuota::take("p", "s", Algorithm::FixedWindow { limit: 10, window_ms: 1000 }, n).map(drop)
            }),
        ),
        (
            "lease_ms",
            Box::new(|s| {
                let n = validate::int_str("lease_ms", s, 1, MAX_SAFE)?;
                UpdateLease::new("p", "n", Action::Acquire, "h", 5, n).map(drop)
            }),
        ),
        (
            "id",
            Box::new(|s| {
                let n = validate::int_str("id", s, 0, MAX_SAFE)?;
                Append::new("u", n, "body", 1000, 10).map(drop)
            }),
        ),
        (
            "after",
            Box::new(|s| {
                let n = validate::int_str("after", s, 0, MAX_SAFE)?;
                Read::new("u", Some(n), 10).map(drop)
            }),
        ),
        (
            "max_age_s",
            Box::new(|s| {
                let n = validate::int_str("max_age_s", s, 1, MAX_SAFE)?;
                Trim::new("u", n, 10, 10).map(drop)
            }),
        ),
        (
            "total_cents",
            Box::new(|s| {
                let n = validate::int_str("total_cents", s, 1, MAX_SAFE)?;
                Create::new("pk", n, 10, 1, 1000, &mut rand::rng()).map(drop)
            }),
        ),
        (
            "count",
            Box::new(|s| {
                let n = validate::int_str("count", s, 1, MAX_SAFE)?;
                Create::new("pk", 10_000, n, 1, 1000, &mut rand::rng()).map(drop)
            }),
        ),
        (
            "offset",
            Box::new(|s| {
                let n = validate::int_str("offset", s, 0, MAX_SAFE)?;
                ReadGrabs::new("pk", n, 10).map(drop)
            }),
        ),
    ]
}

fn id_cases() -> Vec<Case> {
    let fw = Algorithm::FixedWindow { limit: 10, window_ms: 1000 };
    vec![
        ("policy", Box::new(move |s| TakeQuota::take(s, "s", fw, 1).map(drop))),
        ("subject", Box::new(move |s| TakeQuota::take("p", s, fw, 1).map(drop))),
        ("subject", Box::new(|s| Claim::new("p", s, 1000).map(drop))),
        ("subject", Box::new(|s| AddCounter::new("p", s, Storage::HashField, 1, Bounds::default()).map(drop))),
        ("name", Box::new(|s| UpdateLease::new("p", s, Action::Acquire, "h", 5, 1000).map(drop))),
        ("holder", Box::new(|s| UpdateLease::new("p", "n", Action::Release, s, 5, 1000).map(drop))),
        ("user", Box::new(|s| Append::new(s, 1, "b", 1000, 10).map(drop))),
        ("user", Box::new(|s| Trim::new(s, 10, 10, 10).map(drop))),
        ("id", Box::new(|s| Grab::new(s, "u").map(drop))),
        ("user", Box::new(|s| Grab::new("pk", s).map(drop))),
        ("id", Box::new(|s| ReadStatus::new(s).map(drop))),
        ("id", Box::new(|s| Create::new(s, 100, 2, 1, 1000, &mut rand::rng()).map(drop))),
    ]
}

/// Every row is refused by its constructor, naming the field: a refused input leaves no
/// operation to send, so it cannot reach Redis (the HTTP side of that claim, with Redis's
/// own call counts, is the hostile-input part of `worker::route_contract_*`).
#[test]
fn the_table_is_refused_by_the_constructors() {
    let mut rows = 0;
    for (field, case) in numeric_cases() {
        for bad in BAD_NUMBERS {
            let err = case(bad).expect_err(&format!("{field}={bad:?} must be refused"));
            assert_eq!(err.field, field, "{bad:?}");
            assert!(err.to_string().starts_with(field), "message names the field: {err}");
            rows += 1;
        }
    }
    let long = "x".repeat(10 * 1024);
    for (field, case) in id_cases() {
        for bad in BAD_IDS.iter().copied().chain([long.as_str(), &"a".repeat(65)]) {
            let err = case(bad).expect_err(&format!("{field}={bad:?} must be refused"));
            assert_eq!(err.field, field, "{bad:?}");
            rows += 1;
        }
        assert!(case(&"a".repeat(64)).is_ok(), "64 characters are fine");
    }
    // Values that parse but break a rule.
    let checks: Vec<(&str, Result<(), InputError>)> = vec![
        ("delta", AddCounter::new("p", "s", Storage::Key, -1_000_000_000_000_001, Bounds::default()).map(drop)),
        (
            "max",
            AddCounter::new("p", "s", Storage::Key, 1, Bounds { min: 5, max: Some(4), ..Bounds::default() }).map(drop),
        ),
        ("cost", TakeQuota::take("p", "s", Algorithm::FixedWindow { limit: 10, window_ms: 1000 }, 11).map(drop)),
        ("limit", TakeQuota::take("p", "s", Algorithm::SlidingWindow { limit: 10_001, window_ms: 1000 }, 1).map(drop)),
        (
            "refill",
            TakeQuota::take("p", "s", Algorithm::TokenBucket { capacity: 5, refill: 6, interval_ms: 1 }, 1).map(drop),
        ),
        ("total_cents", Create::new("pk", 9, 10, 1, 1000, &mut rand::rng()).map(drop)),
        ("count", Create::new("pk", 100_000, 10_001, 1, 1000, &mut rand::rng()).map(drop)),
        ("body", Append::new("u", 1, &"b".repeat(8193), 1000, 10).map(drop)),
        ("limit", Read::new("u", None, 0).map(drop)),
        ("limit", UpdateLease::new("p", "n", Action::Acquire, "h", 0, 1000).map(drop)),
    ];
    for (field, r) in checks {
        assert_eq!(r.expect_err(field).field, field);
        rows += 1;
    }
    assert!(rows > 300, "{rows} rows");
}

#[test]
fn json_numbers_are_integers_or_refused() {
    for bad in [
        json!(2.5),
        json!(1e3),
        json!(9007199254740993u64),
        json!(-1),
        json!(true),
        json!("0x10"),
        json!([1]),
        json!({}),
    ] {
        let err = validate::int_json("count", &bad, 0, MAX_SAFE);
        if bad == json!(-1) {
            assert!(err.is_err());
        } else {
            assert_eq!(err.expect_err(&bad.to_string()).field, "count");
        }
    }
    assert_eq!(validate::int_json("count", &json!(-1), -5, 5), Ok(-1));
    assert_eq!(validate::int_json("count", &json!("42"), 0, 100), Ok(42));
    assert_eq!(validate::int_json("count", &json!(null), 0, 100).unwrap_err().problem, redcount_core::Problem::Missing);
}

/// A caller that skips the core and sends hostile arguments straight to the scripts:
/// every one is refused by the script, and nothing is written.
#[tokio::test]
async fn scripts_refuse_hostile_arguments_without_writing() {
    let redis = RedisServer::start();
    let d = redis.direct().await;
    let op = AddCounter::new("p", "victim", Storage::Key, 1, Bounds::default()).unwrap();
    let redcount_core::Request::Script(inv) = op.request() else { unreachable!() };
    for bad in ["nan", "inf", "-inf", "1e3", "0x10", " 5 ", "2.5", "9007199254740993", "", "1e309"] {
        let mut raw = inv.clone();
        raw.args[1] = bad.to_string(); // delta
        match d.send(&raw.eval()).await {
            Err(redcount::Error::Redis(e)) => assert_eq!(e.kind, ErrorKind::Rejected, "{bad:?}: {e}"),
            other => panic!("{bad:?} was not refused: {other:?}"),
        }
    }
    let exists: i64 = redis::cmd("EXISTS").arg(keys::counter("p", "victim")).query(&mut redis.conn()).unwrap();
    assert_eq!(exists, 0);

    // Shares that do not add up: refused before any of the packet's keys is written.
    let create = Create::new("pk", 100, 3, 1, 60_000, &mut rand::rng()).unwrap();
    let redcount_core::Request::Script(mut inv) = create.request() else { unreachable!() };
    inv.args[2] = "1000".into();
    assert!(matches!(d.send(&inv.eval()).await, Err(redcount::Error::Redis(e)) if e.kind == ErrorKind::Rejected));
    let n: i64 = redis::cmd("EXISTS").arg(&keys::redpacket("pk")).query(&mut redis.conn()).unwrap();
    assert_eq!(n, 0);

    // Ids stored inside records (a grab's user, a semaphore's holder): the scripts accept
    // exactly what the core's validate::id accepts, so a caller that skips the core cannot
    // store a `:` the drain would then fail to read back.
    let create = Create::new("pk2", 100, 3, 1, 60_000, &mut rand::rng()).unwrap();
    d.run(&create).await.unwrap();
    let long = "a".repeat(64);
    let longer = "a".repeat(65);
    for candidate in ["a", "A-b_9", long.as_str(), longer.as_str(), "a:b", "a{b}", "a b", "é", "", "a\nb", "a|b"] {
        let rust = validate::id("user", candidate).is_ok();
        let grab = Grab::new("pk2", "u").unwrap();
        let redcount_core::Request::Script(mut g) = grab.request() else { unreachable!() };
        g.args[0] = candidate.to_string();
        let sem = UpdateLease::new("p", "n", Action::Acquire, "h", 5, 60_000).unwrap();
        let redcount_core::Request::Script(mut h) = sem.request() else { unreachable!() };
        h.args[1] = candidate.to_string();
        for (what, inv) in [("grab user", g), ("semaphore holder", h)] {
            let lua = match d.send(&inv.eval()).await {
                Ok(_) => true,
                Err(redcount::Error::Redis(e)) if e.kind == ErrorKind::Rejected => false,
                Err(e) => panic!("{what} {candidate:?}: {e:?}"),
            };
            assert_eq!(lua, rust, "{what} {candidate:?}: Lua accepts {lua}, the core {rust}");
        }
    }
    let claims: i64 = redis::cmd("HLEN").arg(&keys::redpacket("pk2")[2]).query(&mut redis.conn()).unwrap();
    assert_eq!(claims, 3, "three valid users won (a, A-b_9, 64 a's), nothing else was stored");
}
