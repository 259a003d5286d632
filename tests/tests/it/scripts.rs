//! The script registry against a real script cache.

use redcount_core::ops::counter::{AddCounter, Bounds, Storage};
use redcount_core::{Command, Value};
use redcount_tests::{RedisServer, mentions, uid};

#[tokio::test]
async fn every_sha_equals_what_script_load_returns() {
    let redis = RedisServer::start();
    let d = redis.direct().await;
    for s in redcount_core::script::ALL {
        let sha = d.send(&Command::new("SCRIPT").arg("LOAD").arg(s.source())).await.unwrap();
        assert_eq!(sha, Value::Bytes(s.sha1().as_bytes().to_vec()), "{}", s.name());
    }
}

#[tokio::test]
async fn noscript_recovers_with_one_extra_round_trip() {
    let redis = RedisServer::start();
    let d = redis.direct().await;
    let subject = uid("s");
    let op = AddCounter::new("jobs", &subject, Storage::Key, 1, Bounds::default()).unwrap();
    d.run(&op).await.unwrap(); // EVALSHA fails, EVAL caches it
    assert_eq!((redis.calls("evalsha"), redis.calls("eval")), (1, 1));
    d.run(&op).await.unwrap(); // cached now: EVALSHA only
    assert_eq!((redis.calls("evalsha"), redis.calls("eval")), (2, 1));

    d.send(&Command::new("SCRIPT").arg("FLUSH")).await.unwrap();
    let out = d.run(&op).await.unwrap();
    assert_eq!(out.value, 3, "the write after the flush happened exactly once");
    assert_eq!((redis.calls("evalsha"), redis.calls("eval")), (3, 2), "one EVAL after the flush");
    d.run(&op).await.unwrap();
    assert_eq!((redis.calls("evalsha"), redis.calls("eval")), (4, 2));
}

/// The fixed window's fast path (lua/fast_fixed.lua, run before the prelude) against the
/// full path it shortcuts, on the same seeded random states, overrides and arguments, hostile
/// ones among them: three copies of each case, run by the script as shipped, by the script
/// with its fast path switched off, and by the fast path alone (ending where the full path
/// would start). The shipped script answers and writes exactly as the full path; the fast
/// path alone either answers the same or falls through having written nothing; and it does
/// answer most of the common cases. Replay: `REDCOUNT_SEED=<seed printed>`.
#[test]
fn fixed_window_fast_path_answers_as_the_full_path() {
    use crate::model::{Rng, seed};
    use redis::Value as R;
    /// One copy's reply (an error without the script's SHA), its state (value, PTTL) and
    /// its stored idempotent reply.
    type Run = (Result<R, String>, (Option<String>, i64), Option<String>);

    let redis = RedisServer::start();
    let mut c = redis.conn();
    let seed = seed();
    let mut rng = Rng::new(seed, "fast_fixed");
    let shipped = redcount_core::script::QUOTA_FIXED.source();
    let guard = "if #KEYS == 2 and #ARGV == 4 and ARGV[4] == '0'";
    assert_eq!(shipped.matches(guard).count(), 1, "the fast path's guard, as this test switches it off");
    let full = shipped.replacen(guard, "if false and #ARGV == 4 and ARGV[4] == '0'", 1);
    // The shebang line, then the fast path's lines (build.rs keeps every line), then a marker.
    let fast_lines =
        std::fs::read_to_string(redcount_tests::root().join("lua/fast_fixed.lua")).unwrap().lines().count();
    let fast_only: String =
        shipped.lines().take(1 + fast_lines).map(|l| format!("{l}\n")).collect::<String>() + "return 'fell through'\n";

    let time_ms = |c: &mut redis::Connection| -> i64 {
        let (s, us): (i64, i64) = redis::cmd("TIME").query(c).unwrap();
        s * 1000 + us / 1000
    };
    let state = |c: &mut redis::Connection, k: &str| -> (Option<String>, i64) {
        let v: Option<String> = redis::cmd("GET").arg(k).query(c).unwrap();
        (v, redis::cmd("PTTL").arg(k).query(c).unwrap())
    };
    let weird =
        ["0", "-1", "+5", "007", " 5", "1e3", "0x10", "2.5", "nan", "", "abc", "1000000000001", "99999999999999999999"];
    let (mut cases, mut answered, mut skipped) = (0, 0, 0);
    while cases < 800 {
        let fail = |what: String| -> ! {
            panic!("fast_fixed (seed {seed}, case {cases}): {what}\n  replay: REDCOUNT_SEED={seed}")
        };
        let limit = if rng.percent(5) {
            weird[rng.index(weird.len())].to_string()
        } else {
            [1, 2, 5, 100, 1_000_000_000][rng.index(5)].to_string()
        };
        let window_ms = [60_000i64, 3_600_000, 86_400_000, 1_000_000_000_000][rng.index(4)];
        let window = if rng.percent(5) { weird[rng.index(weird.len())].to_string() } else { window_ms.to_string() };
        let l: i64 = limit.parse().unwrap_or(5).clamp(1, 1000);
        let cost =
            if rng.percent(5) { weird[rng.index(weird.len())].to_string() } else { rng.range(1, l + 2).to_string() };
        let peek = ["0", "0", "0", "0", "0", "0", "1", "x"][rng.index(8)];
        let now = time_ms(&mut c);
        let w = now / window_ms;
        let value = match rng.below(12) {
            0 | 1 => None,
            2 => Some(weird[rng.index(weird.len())].to_string()),
            3 => Some(format!("{}:{}", [w, w - 1][rng.index(2)], rng.range(0, l + 2))), // the older layout
            _ => Some(rng.range(0, l + 2).to_string()),
        };
        // No expiry, one inside the window, one longer than the window can be, or one set
        // under a longer window (its end past this window's).
        let expiry = match rng.below(10) {
            0 => None,
            1 => Some(now + window_ms + rng.range(1, 10_000)),
            _ => Some(now + rng.range(500, window_ms)),
        };
        let over = match rng.below(10) {
            0..=5 => None,
            6 | 7 => Some(rng.range(1, l + 3).to_string()),
            _ => Some(["0", "-3", "2.5", "abc", "1000000001", "1e2"][rng.index(6)].to_string()),
        };
        let idem = rng.percent(10);
        let mut outs = Vec::new();
        let t0 = time_ms(&mut c);
        for (i, src) in [&shipped, &full, &fast_only].into_iter().enumerate() {
            let tag = format!("{{ff{seed}:{}:{i}}}", cases + skipped); // a skipped case's keys are not reused
            let (k, o, ik) = (format!("{tag}:s"), format!("{tag}:o"), format!("{tag}:i"));
            if let Some(v) = &value {
                let _: () = redis::cmd("SET").arg(&k).arg(v).query(&mut c).unwrap();
                if let Some(at) = expiry {
                    let _: () = redis::cmd("PEXPIREAT").arg(&k).arg(at).query(&mut c).unwrap();
                }
            }
            if let Some(v) = &over {
                let _: () = redis::cmd("SET").arg(&o).arg(v).query(&mut c).unwrap();
            }
            let mut cmd = redis::cmd("EVAL");
            cmd.arg(src.as_str()).arg(if idem { 3 } else { 2 }).arg(&k).arg(&o);
            if idem {
                cmd.arg(&ik);
            }
            cmd.arg(&limit).arg(&window).arg(&cost).arg(peek);
            if idem {
                cmd.arg("60000").arg("fp");
            }
            let reply = match cmd.query::<R>(&mut c) {
                Ok(v) => Ok(v),
                // Without the script's SHA, which Redis names in an error and which differs
                // between the copies.
                Err(e) => Err(e.to_string().split(" script: ").next().unwrap_or_default().to_string()),
            };
            let idem_state: Option<String> = redis::cmd("GET").arg(&ik).query(&mut c).unwrap();
            outs.push((reply, state(&mut c, &k), idem_state));
        }
        let t1 = time_ms(&mut c);
        // A window that ended between the copies gives them different windows: not a case.
        let span = window.parse::<i64>().ok().filter(|w| *w > 0).unwrap_or(window_ms);
        if t0 / span != t1 / span || expiry.is_some_and(|at| at <= t1 + 5) {
            skipped += 1;
            continue;
        }
        let slack = t1 - t0 + 2;
        let same = |a: &Run, b: &Run| -> bool {
            let replies = match (&a.0, &b.0) {
                (Ok(R::Array(x)), Ok(R::Array(y))) => {
                    x.len() == y.len()
                        && x.iter().zip(y).enumerate().all(|(i, (p, q))| match (p, q) {
                            // reset and retry are read from the live clock in each copy
                            (R::Int(p), R::Int(q)) if i >= 3 => (p - q).abs() <= slack,
                            _ => p == q,
                        })
                }
                (x, y) => x == y,
            };
            let ttl = |t: i64| if t < 0 { t } else { 0 };
            replies
                && a.1.0 == b.1.0
                && ttl(a.1.1) == ttl(b.1.1)
                && (a.1.1 - b.1.1).abs() <= slack
                && match (&a.2, &b.2) {
                    // a stored reply: the same, but for its reset and retry (as above)
                    (Some(x), Some(y)) => {
                        let nums = |r: &str| {
                            r.split(['|', ',']).skip(1).map(|n| n.parse::<i64>().unwrap()).collect::<Vec<_>>()
                        };
                        let (x, y) = (nums(x), nums(y));
                        x.len() == y.len()
                            && x.iter()
                                .zip(&y)
                                .enumerate()
                                .all(|(i, (p, q))| if i >= 3 { (p - q).abs() <= slack } else { p == q })
                    }
                    (x, y) => x == y,
                }
        };
        let case = format!(
            "limit {limit:?} window {window:?} cost {cost:?} peek {peek:?} state {value:?} expiry {:?} override {over:?} idempotent {idem}\n  shipped   {:?}\n  full path {:?}\n  fast only {:?}",
            expiry.map(|at| at - now),
            outs[0],
            outs[1],
            outs[2]
        );
        if !same(&outs[0], &outs[1]) {
            fail(format!("the shipped script and the full path differ: {case}"));
        }
        if outs[2].0 == Ok(R::BulkString(b"fell through".to_vec())) {
            let untouched = (value.clone(), if value.is_none() { -2 } else { expiry.map_or(-1, |at| at - t1) });
            if outs[2].1.0 != untouched.0 || (outs[2].1.1 - untouched.1).abs() > slack || outs[2].2.is_some() {
                fail(format!("the fast path fell through but wrote: {case}"));
            }
        } else if same(&outs[2], &outs[1]) {
            answered += 1;
        } else {
            fail(format!("the fast path answered otherwise than the full path: {case}"));
        }
        cases += 1;
    }
    println!("fast_fixed seed {seed}: {answered} of {cases} cases answered by the fast path, {skipped} skipped");
    assert!(answered >= cases / 6, "the fast path answered only {answered} of {cases} cases (seed {seed})");
    assert!(skipped < cases / 10, "{skipped} cases skipped (seed {seed})");
}

/// What redcount relies on in the server it runs on, checked on the one this run starts
/// (`REDCOUNT_TEST_SERVER`: `cargo xtask test` runs this on Redis and on Valkey): errors are
/// told apart by their first word whatever text follows it (Valkey's NOSCRIPT lacks Redis's
/// "Please use EVAL."), a `#!lua` script is refused whole at maxmemory while a `no-writes`
/// one reads, a shebang flag the server does not know is refused (the front drops Upstash's
/// `allow-key-locking`), `busy-reply-threshold` can be set, a missing command (HPEXPIRE before
/// Redis 7.4 and in Valkey 8) fails only its `pcall`, and a blocking command never blocks inside
/// a script (Redis refuses it there; Valkey runs it without blocking).
#[tokio::test]
async fn what_redcount_relies_on_in_the_server() {
    use redcount::Error;
    use redcount_core::ErrorKind;
    use std::time::{Duration, Instant};

    let redis = RedisServer::start();
    let d = redis.direct().await;
    let eval = |script: &str| Command::new("EVAL").arg(script).arg("0");
    let kind = |r: Result<Value, Error>| match r {
        Err(Error::Redis(e)) => (e.kind, e.message),
        other => panic!("expected an error reply, got {other:?}"),
    };

    let (k, m) = kind(d.send(&Command::new("EVALSHA").arg("0".repeat(40)).arg("0")).await);
    assert_eq!(k, ErrorKind::NoScript, "{m}");
    let (k, m) = kind(d.send(&eval("return error({err = 'ERR redcount: x must be y'})")).await);
    assert!(k == ErrorKind::Rejected && m.starts_with("ERR redcount: x must be y"), "{k:?} {m}");
    let (k, m) = kind(d.send(&eval("return error({err = 'IDEMPOTENCY_CONFLICT this key'})")).await);
    assert_eq!(k, ErrorKind::IdempotencyConflict, "{m}");
    let (_, m) = kind(d.send(&eval("#!lua flags=allow-key-locking\nreturn 1")).await);
    assert!(m.contains("allow-key-locking"), "an unknown shebang flag is refused, naming it: {m}");
    for flag in ["", " flags=no-writes", " flags=allow-oom", " flags=no-cluster", " flags=allow-stale"] {
        let ok = d.send(&eval(&format!("#!lua{flag}\nreturn 1"))).await;
        assert_eq!(ok.unwrap(), Value::Int(1), "#!lua{flag}");
    }
    let set = Command::new("CONFIG").arg("SET").arg("busy-reply-threshold").arg("1000");
    d.send(&set).await.unwrap();
    let got = d.send(&Command::new("CONFIG").arg("GET").arg("busy-reply-threshold")).await.unwrap();
    assert_eq!(got, Value::Array(vec![Value::Bytes(b"busy-reply-threshold".to_vec()), Value::Bytes(b"1000".to_vec())]));

    // A command the server lacks fails only its pcall; the script goes on.
    let r = d.send(&eval("local ok = pcall(redis.call, 'NOSUCHCOMMAND', 'k') return ok and 1 or 0")).await;
    assert_eq!(r.unwrap(), Value::Int(0));

    // Blocking commands inside a script: refused or answered at once, never a wait.
    for cmd in ["redis.call('BLPOP', 'empty-list', 0)", "redis.call('WAIT', 1, 0)"] {
        let at = Instant::now();
        let r = d.send(&eval(&format!("local ok = pcall(function() return {cmd} end) return 1"))).await;
        assert!(r.is_ok() && at.elapsed() < Duration::from_secs(2), "{cmd}: {r:?} after {:?}", at.elapsed());
    }

    // At maxmemory a `#!lua` script is refused before it runs; a no-writes one still reads.
    let mut c = redis.conn();
    let _: () = redis::cmd("SET").arg("fill").arg(vec![b'x'; 256 * 1024]).query(&mut c).unwrap();
    let _: () = redis::cmd("CONFIG").arg("SET").arg("maxmemory").arg("1").query(&mut c).unwrap();
    let (k, m) = kind(d.send(&eval("#!lua\nreturn 1")).await);
    assert_eq!(k, ErrorKind::OutOfMemory, "{m}");
    let read = d.send(&eval("#!lua flags=no-writes\nreturn redis.call('STRLEN', 'fill')")).await.unwrap();
    assert_eq!(read, Value::Int(256 * 1024));
    let _: () = redis::cmd("CONFIG").arg("SET").arg("maxmemory").arg("0").query(&mut c).unwrap();
}

/// What differs between Redis and Valkey for a client of the REST front, checked on the
/// server this run starts (docs/front.md, redcount-rest --help): Valkey's SCRIPT SHOW gives the full
/// token the source of any cached script (the read-only token is refused it on either, as every
/// command COMMAND does not flag read-only, and a `--tokens` token, as reading other apps'
/// scripts), a blocking command inside a script answers at
/// once on Valkey where Redis refuses it (never a stall on either), and Valkey's COMMANDLOG is
/// refused as administrative, from its COMMAND flags, like SLOWLOG.
#[tokio::test]
async fn what_differs_on_valkey_through_the_front() {
    use redcount_procs::Server;
    use redcount_tests::RestFront;
    use serde_json::{Value as J, json};
    use std::time::{Duration, Instant};

    let valkey = Server::from_env() == Server::Valkey;
    let redis = RedisServer::start();
    super::front_tokens::readme_users(&redis, &["app1"]);
    let tenant = redcount_tests::secret("t1");
    let file = redcount_tests::scratch_dir("valkey-differs").join("tokens.json");
    super::front_tokens::write_tokens(&file, &[(&tenant, "app1", "pw-app1-0123456789", false)]);
    let front = RestFront::start_with(&redis.url(), false, &["--tokens", file.to_str().unwrap()]);
    let http = redcount_tests::http();
    let call = |token: &str, body: J| {
        let r = http.post(front.url()).bearer_auth(token).body(body.to_string()).send();
        async move {
            let r = r.await.unwrap();
            let status = r.status().as_u16();
            (status, serde_json::from_str::<J>(&r.text().await.unwrap()).unwrap())
        }
    };
    let (status, sha) = call(&front.token, json!(["SCRIPT", "LOAD", "return 42"])).await;
    assert_eq!(status, 200, "{sha}");
    let sha = sha["result"].as_str().unwrap().to_string();
    let (status, shown) = call(&front.token, json!(["SCRIPT", "SHOW", sha])).await;
    match valkey {
        true => assert_eq!((status, &shown["result"]), (200, &json!("return 42")), "{shown}"),
        false => assert_eq!(status, 400, "Redis 7.0 has no SCRIPT SHOW: {shown}"),
    }
    let (status, shown) = call(&front.readonly_token, json!(["SCRIPT", "SHOW", sha])).await;
    assert_eq!(status, 403, "{shown}");
    // Another app's script, by a tenant (on Valkey it read any cached script's source before).
    let (status, shown) = call(&tenant, json!(["SCRIPT", "SHOW", sha])).await;
    assert!(status == 403 || (!valkey && status == 400), "a --tokens token's SCRIPT SHOW: {status} {shown}");
    assert!(!mentions(&shown, "return 42"), "{shown}");
    let show = json!(["EVAL", "return redis.call('SCRIPT', 'SHOW', ARGV[1])", "0", sha]);
    let (status, shown) = call(&tenant, show).await;
    assert!(status != 200 && !mentions(&shown, "return 42"), "inside a script: {status} {shown}");

    let at = Instant::now();
    let (status, got) =
        call(&front.token, json!(["EVAL", "return redis.call('BLPOP', KEYS[1], 0)", "1", "nolist"])).await;
    assert!(at.elapsed() < Duration::from_secs(2), "answered at once: {:?}", at.elapsed());
    match valkey {
        true => assert_eq!((status, &got["result"]), (200, &J::Null), "{got}"),
        false => assert!(status == 400 && got["error"].as_str().unwrap().contains("not allowed from script"), "{got}"),
    }

    let (status, got) = call(&front.token, json!(["COMMANDLOG", "GET", "10", "slow"])).await;
    assert_eq!(status, if valkey { 403 } else { 400 }, "{got}");
}
