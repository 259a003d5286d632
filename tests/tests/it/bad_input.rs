//! The bad-input table: every hostile value is refused by the core, naming the field,
//! before anything reaches Redis; and the scripts refuse it again if a caller skips the core.

use redcount_core::ops::claim::Claim;
use redcount_core::ops::counter::{AddCounter, Bounds, Storage};
use redcount_core::ops::inbox::{Append, Read, Trim};
use redcount_core::ops::quota::{Algorithm, TakeQuota};
use redcount_core::ops::redpacket::{Create, Grab, ReadGrabs, ReadStatus};
use redcount_core::ops::semaphore::{Action, UpdateLease};
use redcount_core::validate::{self, MAX_SAFE};
use redcount_core::{ErrorKind, InputError, Operation, Problem, keys};
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
/// What a subject may not be: a subject may be `TENANT/USER` (two ids), nothing else with `/`.
const BAD_SUBJECTS: &[&str] = &["a/b/c", "a/", "/b", "a/b{", "a b/c", "a//b"];

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
        (
            "subject",
            Box::new(move |s| {
                use redcount_core::ops::decision::{Decide, Part};
                Decide::new(s, vec![Part::quota("p", fw, 1).unwrap()]).map(drop)
            }),
        ),
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
            // The message is rendered from the field and the problem, field first (core's
            // `a_refusal_names_its_field_first`).
            assert!(matches!(err.problem, Problem::NotInteger | Problem::OutOfRange { .. }), "{bad:?}: {err}");
            rows += 1;
        }
    }
    let long = "x".repeat(10 * 1024);
    for (field, case) in id_cases() {
        // A subject (a quota's, a decision's, a semaphore's name) may be TENANT/USER.
        let subject = case("acme/alice").is_ok();
        for bad in BAD_IDS.iter().copied().chain([long.as_str(), &"a".repeat(65)]).chain(BAD_SUBJECTS.iter().copied()) {
            if subject && bad == "a/b" {
                continue;
            }
            let err = case(bad).expect_err(&format!("{field}={bad:?} must be refused"));
            assert_eq!(err.field, field, "{bad:?}");
            rows += 1;
        }
        assert!(case(&"a".repeat(64)).is_ok(), "64 characters are fine");
        if subject {
            assert!(case(&format!("{}/{}", "a".repeat(64), "b".repeat(64))).is_ok(), "two ids of 64");
            assert!(case(&format!("{}/{}", "a".repeat(65), "b")).is_err(), "each part an id");
        }
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
    let read = |v: &serde_json::Value| redcount_core::json::from_slice(v.to_string().as_bytes()).unwrap();
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
        let err = validate::int_json("count", &read(&bad), 0, MAX_SAFE);
        if bad == json!(-1) {
            assert!(err.is_err());
        } else {
            assert_eq!(err.expect_err(&bad.to_string()).field, "count");
        }
    }
    assert_eq!(validate::int_json("count", &read(&json!(-1)), -5, 5), Ok(-1));
    assert_eq!(validate::int_json("count", &read(&json!("42")), 0, 100), Ok(42));
    assert_eq!(
        validate::int_json("count", &read(&json!(null)), 0, 100).unwrap_err().problem,
        redcount_core::Problem::Missing
    );
}

/// A caller that skips the core and sends hostile arguments straight to the scripts:
/// every one is refused by the script, and nothing is written.
#[tokio::test]
async fn scripts_refuse_hostile_arguments_without_writing() {
    let redis = RedisServer::start();
    let d = redis.direct().await;
    let op = AddCounter::new("p", "victim", Storage::Key, 1, Bounds::default()).unwrap();
    let redcount_core::Request::Script(inv) = op.request() else { unreachable!() };
    for bad in ["nan", "inf", "-inf", "1e3", "0x10", " 5 ", "2.5", "9007199254740993", "", "1e309", "007", "-0", "+5"] {
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

/// The keys of one script call (its Invocation's).
fn keys_of(op: &impl Operation) -> Vec<String> {
    let redcount_core::Request::Script(inv) = op.request() else { unreachable!() };
    inv.keys
}

/// Stored numbers that Lua's `tonumber` reads but Redis's INCRBY and HINCRBY refuse (and
/// ones neither reads): a script that trusted such a value wrote part of its effect and then
/// failed on it. Every script now reads a stored number only in the text it writes itself.
const TAMPERED_NUMBERS: &[&str] = &[" 1", "1 ", "1e0", "0x1", "01", "1.0", "+1", "-0", "nan", "abc"];

/// A compound decision over a fixed window whose state was tampered with is still all or
/// nothing: it either admits and writes every part, or fails and writes none.
#[tokio::test]
async fn a_decision_over_tampered_state_writes_all_or_nothing() {
    use redcount_core::ops::decision::{Decide, Part};
    let redis = RedisServer::start();
    let d = redis.direct().await;
    let mut c = redis.conn();
    let fixed = |limit| Algorithm::FixedWindow { limit, window_ms: 60_000 };
    for (i, bad) in TAMPERED_NUMBERS.iter().enumerate() {
        let subject = format!("tampered{i}");
        let first = TakeQuota::take("a", &subject, fixed(5), 1).unwrap();
        d.run(&first).await.unwrap();
        let a_key = keys_of(&first)[0].clone();
        let b_key = keys_of(&TakeQuota::take("b", &subject, fixed(100), 1).unwrap())[0].clone();
        let _: () = redis::cmd("SET").arg(&b_key).arg(*bad).arg("PX").arg(30_000).query(&mut c).unwrap();
        let op = Decide::new(
            &subject,
            vec![
                Part::quota("a", fixed(5), 1).unwrap(),
                Part::lease("sem", "h", 2, 10_000).unwrap(),
                Part::quota("b", fixed(100), 1).unwrap(),
            ],
        )
        .unwrap();
        let sem_keys: Vec<String> = keys_of(&op)[2..5].to_vec();
        let out = d.run(&op).await;
        let a: String = redis::cmd("GET").arg(&a_key).query(&mut c).unwrap();
        let leases: i64 = redis::cmd("EXISTS").arg(&sem_keys[0]).arg(&sem_keys[1]).query(&mut c).unwrap();
        match out {
            Ok(dec) if dec.allowed => {
                assert_eq!((a.as_str(), leases), ("2", 2), "{bad:?}: admitted, so every part was taken");
                let b: String = redis::cmd("GET").arg(&b_key).query(&mut c).unwrap();
                assert_eq!(b, "1", "{bad:?}: the tampered window restarted");
            }
            other => assert_eq!((a.as_str(), leases), ("1", 0), "{bad:?}: {other:?}, yet something was written"),
        }
    }
}

/// A red packet whose stored share or counts were tampered with: a grab refuses it whole,
/// the share stays where it was and no record, count or log entry is written.
#[tokio::test]
async fn a_grab_over_tampered_state_writes_nothing() {
    let redis = RedisServer::start();
    let d = redis.direct().await;
    let mut c = redis.conn();
    for (i, bad) in TAMPERED_NUMBERS.iter().enumerate() {
        for target in ["share", "grabbed_n", "grabbed_sum"] {
            let id = format!("tp{i}{}", &target[..3]);
            d.run(&Create::new(&id, 1000, 5, 1, 60_000, &mut rand::rng()).unwrap()).await.unwrap();
            let grab = Grab::new(&id, "bob").unwrap();
            let k = keys_of(&grab);
            if target == "share" {
                let _: () = redis::cmd("LSET").arg(&k[1]).arg(0).arg(*bad).query(&mut c).unwrap();
            } else {
                let _: () = redis::cmd("HSET").arg(&k[0]).arg(target).arg(*bad).query(&mut c).unwrap();
            }
            let before: Vec<redis::Value> =
                k.iter().map(|key| redis::cmd("DUMP").arg(key).query(&mut c).unwrap()).collect();
            let out = d.run(&grab).await;
            let after: Vec<redis::Value> =
                k.iter().map(|key| redis::cmd("DUMP").arg(key).query(&mut c).unwrap()).collect();
            assert!(out.is_err(), "{target} = {bad:?}: the grab was answered: {out:?}");
            assert_eq!(before, after, "{target} = {bad:?}: the refused grab wrote");
        }
    }
}

/// A stored override, count or token that this project did not write (tampered, or written
/// by hand) is not read as a number Lua happens to parse: an override of "1e3" is no
/// override, a counter holding "007" is refused, not added to.
#[tokio::test]
async fn tampered_overrides_and_counters_are_not_read_as_numbers() {
    let redis = RedisServer::start();
    let d = redis.direct().await;
    let mut c = redis.conn();
    for (i, bad) in ["1e3", "0x10", " 7", "07", "7.0", "+7"].iter().enumerate() {
        let subject = format!("ovr{i}");
        let algo = Algorithm::FixedWindow { limit: 5, window_ms: 60_000 };
        let op = TakeQuota::take("q", &subject, algo, 1).unwrap();
        let _: () = redis::cmd("SET").arg(&keys_of(&op)[1]).arg(*bad).query(&mut c).unwrap();
        let mut admitted = 0;
        for _ in 0..10 {
            admitted += i32::from(d.run(&op).await.unwrap().allowed);
        }
        assert_eq!(admitted, 5, "override {bad:?}: the policy's limit holds");

        let add = AddCounter::new("p", &format!("c{i}"), Storage::Key, 1, Bounds::default()).unwrap();
        let key = keys::counter("p", &format!("c{i}"));
        let _: () = redis::cmd("SET").arg(&key).arg(*bad).query(&mut c).unwrap();
        assert!(d.run(&add).await.is_err(), "counter holding {bad:?} was added to");
        let v: String = redis::cmd("GET").arg(&key).query(&mut c).unwrap();
        assert_eq!(v, *bad);
    }
}

/// The peek flag of a take is "0" or "1": anything else is refused, not taken as a take.
#[tokio::test]
async fn a_take_with_a_bad_peek_flag_is_refused_and_writes_nothing() {
    let redis = RedisServer::start();
    let d = redis.direct().await;
    let mut c = redis.conn();
    let algos = [
        Algorithm::FixedWindow { limit: 5, window_ms: 60_000 },
        Algorithm::SlidingWindow { limit: 5, window_ms: 60_000 },
        Algorithm::TokenBucket { capacity: 5, refill: 1, interval_ms: 1000 },
    ];
    for (i, algo) in algos.into_iter().enumerate() {
        let op = TakeQuota::take("q", &format!("peek{i}"), algo, 1).unwrap();
        let redcount_core::Request::Script(inv) = op.request() else { unreachable!() };
        for bad in ["true", "2", "", "01", " 1"] {
            let mut raw = inv.clone();
            let last = raw.args.len() - 1;
            raw.args[last] = bad.to_string();
            match d.send(&raw.eval()).await {
                Err(redcount::Error::Redis(e)) => assert_eq!(e.kind, ErrorKind::Rejected, "{algo:?} peek {bad:?}: {e}"),
                other => panic!("{algo:?}: peek {bad:?} was not refused: {other:?}"),
            }
            let n: i64 = redis::cmd("EXISTS").arg(&inv.keys[0]).query(&mut c).unwrap();
            assert_eq!(n, 0, "{algo:?} peek {bad:?} wrote");
        }
    }
}

/// One small policy of each quota algorithm: fixed, sliding, bucket, GCRA.
fn small_algorithms() -> [Algorithm; 4] {
    [
        Algorithm::FixedWindow { limit: 5, window_ms: 60_000 },
        Algorithm::SlidingWindow { limit: 5, window_ms: 60_000 },
        Algorithm::TokenBucket { capacity: 5, refill: 1, interval_ms: 1000 },
        Algorithm::Gcra { rate: 5, period_ms: 60_000, burst: 5 },
    ]
}

/// The small policy of the algorithm tagged `fw`, `sw`, `tb` or `gc`.
fn algorithm(tag: &str) -> Algorithm {
    let [fw, sw, tb, gc] = small_algorithms();
    match tag {
        "fw" => fw,
        "sw" => sw,
        "tb" => tb,
        _ => gc,
    }
}

/// Every key of a compound decision (all four quota algorithms and a semaphore lease) and of
/// the single semaphore and quota calls, tampered in turn with each of a table of values a
/// script does not write (wrong types; numbers Lua reads but Redis refuses, or that are not
/// finite; lease ends and log times of inf and 1e300; a fencing token of nan, -1, 2^70):
/// a call that errors has written nothing (DUMPs of every key compared), and a call that
/// answers answers sane numbers (no NaN or infinity turned into i64::MIN).
#[tokio::test]
async fn tampered_state_never_leaves_a_partial_write() {
    use redcount_core::ops::decision::{Decide, Part};
    let redis = RedisServer::start();
    let d = redis.direct().await;
    let mut c = redis.conn();
    let [fw, sw, tb, gc] = small_algorithms();
    // (command, arguments after the key): each applied where Redis takes it.
    let tampers: &[(&str, &[&str])] = &[
        ("SET", &["junk"]),
        ("SET", &["1e0"]),
        ("HSET", &["junk", "1"]),
        ("HSET", &["#", "nan"]),
        ("HSET", &["#", "1180591620717411303424"]),
        ("HSET", &["h", "-1"]),
        ("HSET", &["t", "1e300"]),
        ("HSET", &["r", "nan"]),
        ("HSET", &["tokens", "inf"]),
        ("HSET", &["ts", " 1"]),
        ("ZADD", &["inf", "other"]),
        ("ZADD", &["1e300", "c0000000000000001:1"]),
        ("LPUSH", &["x"]),
    ];
    let mut tried = 0;
    for (t, (cmd, args)) in tampers.iter().enumerate() {
        let subject = format!("t{t}");
        let decide = Decide::new(
            &subject,
            vec![
                Part::quota("fw", fw, 1).unwrap(),
                Part::quota("sw", sw, 1).unwrap(),
                Part::quota("tb", tb, 1).unwrap(),
                Part::quota("gc", gc, 1).unwrap(),
                Part::lease("sem", "h", 3, 10_000).unwrap(),
            ],
        )
        .unwrap();
        let all = keys_of(&decide);
        for target in 0..all.len() {
            // A fresh subject state for each target: one earlier decision, so every key exists.
            for k in &all {
                let _: () = redis::cmd("DEL").arg(k).query(&mut c).unwrap();
            }
            d.run(&decide).await.unwrap();
            let mut tamper = redis::cmd(cmd);
            tamper.arg(&all[target]).arg(*args);
            if tamper.query::<redis::Value>(&mut c).is_err() {
                continue; // another type: this tamper does not apply to this key
            }
            tried += 1;
            for which in [
                "decision",
                "acquire",
                "renew",
                "release",
                "fw",
                "sw",
                "tb",
                "gc",
                "refund fw",
                "refund sw",
                "refund tb",
                "refund gc",
            ] {
                let dump = |c: &mut redis::Connection| -> Vec<redis::Value> {
                    all.iter().map(|k| redis::cmd("DUMP").arg(k).query(c).unwrap()).collect()
                };
                let before = dump(&mut c);
                let out: Result<String, String> = match which {
                    "decision" => d.run(&decide).await.map(|o| format!("{o:?}")).map_err(|e| e.to_string()),
                    "acquire" | "renew" | "release" => {
                        let action = match which {
                            "acquire" => Action::Acquire,
                            "renew" => Action::Renew,
                            _ => Action::Release,
                        };
                        let op = UpdateLease::new("sem", &subject, action, "h", 3, 10_000).unwrap();
                        d.run(&op).await.map(|o| format!("{o:?}")).map_err(|e| e.to_string())
                    }
                    r if r.starts_with("refund ") => {
                        let q = &r[7..];
                        let op = redcount_core::ops::quota::RefundQuota::new(q, &subject, algorithm(q), 1).unwrap();
                        d.run(&op).await.map(|o| format!("{o:?}")).map_err(|e| e.to_string())
                    }
                    q => {
                        let op = TakeQuota::take(q, &subject, algorithm(q), 1).unwrap();
                        d.run(&op).await.map(|o| format!("{o:?}")).map_err(|e| e.to_string())
                    }
                };
                let after = dump(&mut c);
                let case = format!("{cmd} {} {args:?}, then {which}", all[target]);
                match out {
                    Err(e) => assert_eq!(before, after, "{case}: refused ({e}) yet wrote"),
                    Ok(o) => assert!(!o.contains("9223372036854775808"), "{case}: answered {o}"),
                }
            }
        }
    }
    assert!(tried > 20, "only {tried} tampers applied");
}

/// Every writing script called straight with one argument more, or one fewer, than the core
/// sends (and with a key more): refused, nothing written. An ignored extra argument would
/// mean a caller's intent silently dropped.
#[tokio::test]
async fn scripts_refuse_a_call_of_another_shape() {
    use redcount_core::ops::quota::{OverrideQuota, RefundQuota, ResetQuota};
    let redis = RedisServer::start();
    let d = redis.direct().await;
    let mut c = redis.conn();
    let [fw, sw, tb, gc] = small_algorithms();
    let mut invs = vec![
        AddCounter::new("p", "shape", Storage::Key, 1, Bounds::default()).unwrap().request(),
        Claim::new("p", "shape", 60_000).unwrap().request(),
        UpdateLease::new("sem", "shape", Action::Acquire, "h", 3, 10_000).unwrap().request(),
        Append::new("shape", 1, "hi", 60_000, 10).unwrap().request(),
        Trim::new("shape", 60, 10, 100).unwrap().request(),
        Grab::new("shapepk", "bob").unwrap().request(),
        OverrideQuota::set("fw", "shape", fw, 9, 0).unwrap().request(),
        ResetQuota::new("fw", "shape", fw).unwrap().request(),
    ];
    for algo in [fw, sw, tb, gc] {
        invs.push(TakeQuota::take("q", "shape", algo, 1).unwrap().request());
        invs.push(RefundQuota::new("q", "shape", algo, 1).unwrap().request());
    }
    {
        use redcount_core::ops::reservation::{Mode, Part, Reserve};
        let parts = vec![
            Part::quota("q", fw, 1).unwrap(),
            Part::quota("r", tb, 1).unwrap(),
            Part::lease("sem", "h", 2).unwrap(),
        ];
        let r = Reserve::new("shape", "r1", parts.clone(), 60_000, Mode::All).unwrap();
        d.run(&Reserve::new("shape", "r0", parts, 60_000, Mode::All).unwrap()).await.unwrap();
        invs.push(r.request());
        let held = Reserve::new("shape", "r0", r.parts().to_vec(), 60_000, Mode::All).unwrap();
        invs.extend([
            held.settle(&[1, 1, 0]).unwrap().request(),
            held.extend(60_000, &[1, 1, 0]).unwrap().request(),
            held.release().unwrap().request(),
        ]);
    }
    d.run(&Create::new("shapepk", 100, 2, 1, 60_000, &mut rand::rng()).unwrap()).await.unwrap();
    for req in invs {
        let redcount_core::Request::Script(inv) = req else { unreachable!() };
        let dump = |c: &mut redis::Connection| -> Vec<redis::Value> {
            inv.keys.iter().map(|k| redis::cmd("DUMP").arg(k).query(c).unwrap()).collect()
        };
        let mut shapes = Vec::new();
        let mut more = inv.clone();
        more.args.push("1".into());
        shapes.push(("an argument more", more));
        if !inv.args.is_empty() {
            let mut fewer = inv.clone();
            fewer.args.pop();
            shapes.push(("an argument fewer", fewer));
        }
        let mut keys = inv.clone();
        keys.keys.push(format!("{}:x", inv.keys[0]));
        keys.keys.push(format!("{}:y", inv.keys[0]));
        shapes.push(("two keys more", keys));
        for (what, raw) in shapes {
            let before = dump(&mut c);
            match d.send(&raw.eval()).await {
                Err(redcount::Error::Redis(e)) => {
                    assert_eq!(e.kind, ErrorKind::Rejected, "{} with {what}: {e}", inv.script.name())
                }
                other => panic!("{} with {what} was not refused: {other:?}", inv.script.name()),
            }
            assert_eq!(before, dump(&mut c), "{} with {what} wrote", inv.script.name());
        }
    }
}

/// What a read hands back is checked as what a write builds on: a red packet's status, a
/// grab's replay and its claims list, an idempotent reply, a holder's fencing token and a
/// claim's expiry, each edited by hand, are refused, not answered as impossible numbers
/// (i64::MIN, a negative amount, a token above every token issued, a wait of null).
#[tokio::test]
async fn tampered_state_is_not_read_back_as_numbers() {
    use redcount_core::ops::{Idempotency, Idempotent};
    let redis = RedisServer::start();
    let d = redis.direct().await;
    let mut c = redis.conn();
    let set = |c: &mut redis::Connection, args: &[&str]| {
        let mut cmd = redis::cmd(args[0]);
        cmd.arg(&args[1..]);
        let _: redis::Value = cmd.query(c).unwrap();
    };

    // A packet's status field, and a grab record replayed.
    for (i, field) in ["total", "count", "created_ms", "expires_ms", "grabbed_n", "grabbed_sum"].iter().enumerate() {
        for bad in ["nan", "1e300", "-5", "99999999999999999999"] {
            let id = format!("st{i}{}", bad.len());
            d.run(&Create::new(&id, 100, 3, 1, 60_000, &mut rand::rng()).unwrap()).await.unwrap();
            let k = keys_of(&Grab::new(&id, "u1").unwrap());
            set(&mut c, &["HSET", &k[0], field, bad]);
            assert!(d.run(&ReadStatus::new(&id).unwrap()).await.is_err(), "status with {field} = {bad:?}");
        }
    }
    d.run(&Create::new("rp", 100, 3, 1, 60_000, &mut rand::rng()).unwrap()).await.unwrap();
    d.run(&Grab::new("rp", "u1").unwrap()).await.unwrap();
    let k = keys_of(&Grab::new("rp", "u1").unwrap());
    for bad in ["99999999999999999999:1", "0:1", "5:0", "05:1"] {
        set(&mut c, &["HSET", &k[2], "u1", bad]);
        assert!(d.run(&Grab::new("rp", "u1").unwrap()).await.is_err(), "grab replay of {bad:?}");
    }
    // The claims list.
    for bad in ["u1:-5:1:1", "u1:9223372036854775807:1:1", "u1:5:0:1", "u1:5:1:-1"] {
        set(&mut c, &["LSET", &k[3], "0", bad]);
        assert!(d.run(&ReadGrabs::new("rp", 0, 10).unwrap()).await.is_err(), "claims list with {bad:?}");
    }

    // An idempotent counter's stored reply.
    let add = AddCounter::new("p", "idem", Storage::Key, 1, Bounds::default()).unwrap();
    let idem = Idempotency::new(b"k1", b"{}");
    let op = Idempotent::new(add, Some(idem));
    d.run(&op).await.unwrap();
    let ik = keys_of(&op).last().unwrap().clone();
    let stored: String = redis::cmd("GET").arg(&ik).query(&mut c).unwrap();
    let fp = stored.split('|').next().unwrap().to_string();
    for bad in ["-9223372036854775808,1,0", "9007199254740993,1,0", "01,1,0", "1,,0"] {
        set(&mut c, &["SET", &ik, &format!("{fp}|{bad}"), "PX", "60000"]);
        assert!(d.run(&op).await.is_err(), "replay of {bad:?}");
    }

    // A holder's token above the last one issued: a renewal is refused, not granted.
    let lease = |a| UpdateLease::new("sem", "fence", a, "h0", 2, 10_000).unwrap();
    d.run(&lease(Action::Acquire)).await.unwrap();
    let tk = keys_of(&lease(Action::Renew))[1].clone();
    let last: i64 = redis::cmd("HGET").arg(&tk).arg("#").query(&mut c).unwrap();
    set(&mut c, &["HSET", &tk, "h0", &(last + 1_000_000_000).to_string()]);
    assert!(d.run(&lease(Action::Renew)).await.is_err(), "a token above the last issued was renewed");

    // A claim's key without an expiry.
    let claim = Claim::new("cl", "zz", 60_000).unwrap();
    set(&mut c, &["SET", &keys_of(&claim)[0], "1"]);
    assert!(d.run(&claim).await.is_err(), "a claim without an expiry answered");
}

/// A token bucket whose refill from empty would outlast 4.5 * 10^15 ms (its expiry and reset
/// are built on it; past 2^63 ms PEXPIRE refused it after the bucket was written, so a take
/// answered 502 yet charged, and a decision charged its other parts): refused as a policy, by
/// the script if a caller skips the core, and an override is held to the same bound. At the
/// bound a take answers and its expiry and reset stay exact.
#[tokio::test]
async fn a_bucket_never_refills_past_what_redis_can_expire() {
    use redcount_core::ops::quota::{MAX_BUCKET_SPAN, OverrideQuota};
    let slow = Algorithm::TokenBucket { capacity: 1_000_000_000, refill: 1, interval_ms: 31_622_400_000 };
    assert_eq!(slow.validate().unwrap_err().field, "interval_ms");
    assert!(TakeQuota::take("tb", "slow", slow, 1).is_err());

    let redis = RedisServer::start();
    let d = redis.direct().await;
    let mut c = redis.conn();
    // Straight to the script: refused, nothing written.
    let ok = Algorithm::TokenBucket { capacity: 10, refill: 1, interval_ms: 1_000_000_000_000 };
    let redcount_core::Request::Script(inv) = TakeQuota::take("tb", "slow", ok, 1).unwrap().request() else {
        unreachable!()
    };
    let mut raw = inv.clone();
    raw.args[0] = "1000000000".into(); // capacity 10^9 at one token per 10^12 ms
    match d.send(&raw.eval()).await {
        Err(redcount::Error::Redis(e)) => assert_eq!(e.kind, ErrorKind::Rejected, "{e}"),
        other => panic!("not refused: {other:?}"),
    }
    let n: i64 = redis::cmd("EXISTS").arg(&inv.keys[0]).query(&mut c).unwrap();
    assert_eq!(n, 0);

    // An override up to the bound (4,500 tokens at one per 10^12 ms), not past it.
    let most = MAX_BUCKET_SPAN / 1_000_000_000_000;
    assert_eq!(ok.max_size(), most);
    assert!(OverrideQuota::set("tb", "slow", ok, most + 1, 0).is_err());
    d.run(&OverrideQuota::set("tb", "slow", ok, most, 0).unwrap()).await.unwrap();
    // A caller that skips the core and stores a larger one: read as no override.
    let out = d.run(&TakeQuota::take("tb", "slow", ok, 5).unwrap()).await.unwrap();
    assert!(out.allowed && out.limit == most, "{out:?}");
    let pttl: i64 = redis::cmd("PTTL").arg(&inv.keys[0]).query(&mut c).unwrap();
    assert!(pttl > 0 && pttl <= MAX_BUCKET_SPAN, "{pttl}");
    assert!(out.reset_ms > 0 && out.reset_ms <= MAX_BUCKET_SPAN, "{out:?}");
    let _: () = redis::cmd("SET").arg(&inv.keys[1]).arg(most + 1).query(&mut c).unwrap();
    let out = d.run(&TakeQuota::take("tb", "slow", ok, 1).unwrap()).await.unwrap();
    assert_eq!(out.limit, 10, "an override past the bound is no override");
}
