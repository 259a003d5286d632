//! Pure tests of the core: exact wire bytes, reply decoding, the split's properties.

use proptest::prelude::*;
use rand::SeedableRng;
use rand::rngs::StdRng;
use redcount_core::ops::counter::{AddCounter, Bounds, Storage};
use redcount_core::ops::inbox::{Read, decode_member};
use redcount_core::ops::redpacket::{Grab, GrabOutcome, ReadStatus};
use redcount_core::rest::{Encoding, RestError, decode_pipeline, decode_reply, pipeline_body};
use redcount_core::{Command, ErrorKind, Operation, Value, script, split};

#[test]
fn golden_evalsha_and_eval_bodies() {
    let op = Grab::new("p1", "alice").unwrap();
    let req = op.request();
    let sha = script::REDPACKET_GRAB.sha1();
    assert_eq!(
        req.command().to_rest_body(),
        format!(
            r#"["EVALSHA","{sha}","4","rc:{{rp:p1}}:meta","rc:{{rp:p1}}:shares","rc:{{rp:p1}}:grabs","rc:{{rp:p1}}:log","alice"]"#
        )
    );
    let noscript = redcount_core::ErrorReply::new("NOSCRIPT No matching script. Please use EVAL.");
    let eval = req.fallback(&noscript).unwrap();
    assert_eq!(eval.parts()[0], "EVAL");
    assert_eq!(eval.parts()[1], script::REDPACKET_GRAB.source());
    assert_eq!(eval.parts()[2..], req.command().parts()[2..]);
    // Only NOSCRIPT triggers the retry.
    assert!(req.fallback(&redcount_core::ErrorReply::new("WRONGTYPE Operation against a key")).is_none());

    let add = AddCounter::new("jobs", "app-1", Storage::HashField, -3, Bounds { max: Some(10), ..Bounds::default() })
        .unwrap();
    assert_eq!(
        add.request().command().to_rest_body(),
        format!(r#"["EVALSHA","{}","1","rc:{{c:jobs}}","app-1","-3","0","10","clamp","0"]"#, script::COUNTER.sha1())
    );
    let read = Read::new("bob", Some(41), 50).unwrap();
    assert_eq!(
        read.request().command().to_rest_body(),
        r#"["ZRANGEBYSCORE","rc:{ib:bob}","(41","+inf","WITHSCORES","LIMIT","0","50"]"#
    );
}

#[test]
fn golden_escaping_pipeline_and_resp() {
    let c = Command::new("SET").arg("k").arg("q\"b\\s\n\t\u{1}é");
    assert_eq!(c.to_rest_body(), r#"["SET","k","q\"b\\s\n\t\u0001é"]"#);
    assert_eq!(pipeline_body(&[Command::new("PING"), c.clone()]), format!(r#"[["PING"],{}]"#, c.to_rest_body()));
    assert_eq!(Command::new("GET").arg("ké").to_resp(), b"*2\r\n$3\r\nGET\r\n$3\r\nk\xc3\xa9\r\n");
    // The body is valid JSON that decodes to the same strings.
    let back: Vec<String> = serde_json::from_str(&c.to_rest_body()).unwrap();
    assert_eq!(back, c.parts());
}

#[test]
fn decode_replies_plain_and_base64() {
    assert_eq!(decode_reply(200, br#"{"result":5}"#, Encoding::Plain), Ok(Value::Int(5)));
    assert_eq!(decode_reply(200, br#"{"result":null}"#, Encoding::Base64), Ok(Value::Nil));
    assert_eq!(
        decode_reply(200, br#"{"result":["AAEC/w==",1,null,["aGk="]]}"#, Encoding::Base64),
        Ok(Value::Array(vec![
            Value::Bytes(vec![0, 1, 2, 255]),
            Value::Int(1),
            Value::Nil,
            Value::Array(vec![Value::Bytes(b"hi".to_vec())])
        ]))
    );
    // Upstash leaves a literal OK unencoded; a front that encodes it works too.
    assert_eq!(decode_reply(200, br#"{"result":"OK"}"#, Encoding::Base64), Ok(Value::Bytes(b"OK".to_vec())));
    assert_eq!(decode_reply(200, br#"{"result":"T0s="}"#, Encoding::Base64), Ok(Value::Bytes(b"OK".to_vec())));

    match decode_reply(400, br#"{"error":"NOSCRIPT No matching script. Please use EVAL."}"#, Encoding::Base64) {
        Err(RestError::Reply(e)) => assert_eq!(e.kind, ErrorKind::NoScript),
        other => panic!("{other:?}"),
    }
    match decode_reply(
        400,
        br#"{"error":"ERR redcount: delta must be a decimal integer script: abc"}"#,
        Encoding::Plain,
    ) {
        Err(RestError::Reply(e)) => assert_eq!(e.kind, ErrorKind::Rejected),
        other => panic!("{other:?}"),
    }
    assert!(
        matches!(decode_reply(401, br#"{"error":"Unauthorized"}"#, Encoding::Plain), Err(RestError::Unauthorized(m)) if m == "Unauthorized")
    );
    assert!(matches!(decode_reply(503, b"<html>bad gateway", Encoding::Plain), Err(RestError::Unavailable(503, _))));
    assert!(
        matches!(decode_reply(503, br#"{"error":"redis down"}"#, Encoding::Plain), Err(RestError::Unavailable(503, m)) if m == "redis down")
    );
    for bad in [
        &b"not json"[..],
        b"[1]",
        b"{}",
        br#"{"result":1.5}"#,
        br#"{"result":true}"#,
        br#"{"result":"***"}"#,
        br#"{"error":5}"#,
    ] {
        assert!(
            matches!(decode_reply(200, bad, Encoding::Base64), Err(RestError::Malformed(_))),
            "{}",
            String::from_utf8_lossy(bad)
        );
    }
    let deep = format!(r#"{{"result":{}1{}}}"#, "[".repeat(40), "]".repeat(40));
    assert!(matches!(decode_reply(200, deep.as_bytes(), Encoding::Plain), Err(RestError::Malformed(_))));
}

#[test]
fn decode_pipelines() {
    let r = decode_pipeline(200, br#"[{"result":"aGk="},{"error":"WRONGTYPE x"}]"#, Encoding::Base64).unwrap();
    assert_eq!(r[0], Ok(Value::Bytes(b"hi".to_vec())));
    assert_eq!(r[1].as_ref().unwrap_err().kind, ErrorKind::WrongType);
    assert!(matches!(decode_pipeline(400, br#"{"error":"EXECABORT"}"#, Encoding::Plain), Err(RestError::Reply(_))));
}

#[test]
fn wrong_shapes_are_errors_not_panics() {
    let grab = Grab::new("p", "u").unwrap();
    for v in [
        Value::Nil,
        Value::Int(1),
        Value::Array(vec![Value::Int(1)]),
        Value::Array(vec![Value::Int(9), Value::Int(0), Value::Int(0), Value::Int(0)]),
        Value::Array(vec![Value::Bytes(b"x".to_vec()); 4]),
    ] {
        assert!(grab.parse(v).is_err());
    }
    assert_eq!(
        grab.parse(Value::Array(vec![Value::Int(1), Value::Int(5), Value::Int(2), Value::Bytes(b"3".to_vec())])),
        Ok(GrabOutcome::Won { amount: 5, index: 2, remaining: 3 })
    );
    assert!(ReadStatus::new("p").unwrap().parse(Value::Array(vec![])).is_err());
    assert!(Read::new("u", None, 5).unwrap().parse(Value::Array(vec![Value::Bytes(vec![1])])).is_err());
    assert_eq!(decode_member(&[1, 0, 0, 0, b'h'], 9), Some((1, &b"h"[..])));
    assert_eq!(decode_member(&[1, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, b'h'], 9), Some((1, &b"h"[..])));
    assert_eq!(decode_member(&[1, 0], 9), None);
}

proptest! {
    #[test]
    fn split_sums_exactly_and_respects_min(total in 1i64..10_000_000, count in 1i64..500, min in 1i64..50, seed: u64) {
        let mut rng = StdRng::seed_from_u64(seed);
        match split::split(total, count, min, &mut rng) {
            Ok(shares) => {
                prop_assert!(total >= count * min);
                prop_assert_eq!(shares.len() as i64, count);
                prop_assert_eq!(shares.iter().sum::<i64>(), total);
                prop_assert!(shares.iter().all(|&s| s >= min));
            }
            Err(e) => {
                prop_assert!(total < count * min);
                prop_assert_eq!(e.field, "total_cents");
            }
        }
    }

    #[test]
    fn uniform_stays_in_range(lo in 0u64..1000, span in 0u64..1000, seed: u64) {
        let mut rng = StdRng::seed_from_u64(seed);
        let x = split::uniform(&mut rng, lo, lo + span);
        prop_assert!((lo..=lo + span).contains(&x));
    }
}

#[test]
fn every_position_has_the_same_mean() {
    // 20,000 packets of 10,000 cents in 10 shares: each position's mean must be 1,000.
    let mut rng = StdRng::seed_from_u64(7);
    let (packets, count, total) = (20_000, 10usize, 10_000i64);
    let mut sums = vec![0i64; count];
    let mut squares = 0f64;
    for _ in 0..packets {
        let shares = split::split(total, count as i64, 1, &mut rng).unwrap();
        for (i, s) in shares.iter().enumerate() {
            sums[i] += s;
            squares += (*s as f64 - 1000.0).powi(2);
        }
    }
    for (i, s) in sums.iter().enumerate() {
        let mean = *s as f64 / packets as f64;
        // The standard error of a position's mean is about 5 cents here; allow 4%.
        assert!((mean - 1000.0).abs() < 40.0, "position {i}: mean {mean}");
    }
    // Random, not an even split: a uniform draw on [1, 2000] has a deviation near 577.
    let sd = (squares / (packets * count) as f64).sqrt();
    assert!((400.0..800.0).contains(&sd), "standard deviation {sd}");
}

/// Every script keeps one order: validate its arguments, then answer a replay, then act. A
/// replay is read only for a request that passed the checks, and no write comes before them.
#[test]
fn scripts_validate_then_replay_then_act() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../lua");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name == "prelude.lua" || !name.ends_with(".lua") {
            continue;
        }
        let src = std::fs::read_to_string(&path).unwrap();
        // Top-level lines only: helpers defined in the script are not steps.
        let top: Vec<&str> = src.lines().filter(|l| !l.starts_with(' ') && !l.starts_with("--")).collect();
        let first = |pat: &str| top.iter().position(|l| l.contains(pat));
        let last_check = top.iter().rposition(|l| l.contains("int('") || l.contains("id('"));
        let replay = first("idempotency(");
        let act = top.iter().position(|l| l.contains("redis.call(") && !l.trim_start().starts_with("local function"));
        if let (Some(check), Some(replay)) = (last_check, replay) {
            assert!(check < replay, "{name}: a check after the replay");
        }
        if let (Some(replay), Some(act)) = (replay, act) {
            assert!(replay < act, "{name}: Redis is called before the replay is answered");
        }
        checked += 1;
    }
    assert!(checked >= 10, "{checked} scripts");
}

/// The float-based reading `inbox` used before `text::whole_number` (f64 parse, whole, in
/// range): the reference for texts too short for f64 to round.
fn whole_by_float(s: &str, max: i64) -> Option<i64> {
    let f: f64 = s.parse().ok()?;
    ((-(max as f64)..=max as f64).contains(&f) && f == (f as i64) as f64).then_some(f as i64)
}

proptest! {
    /// Short texts over the characters a number is written with: the exact reading agrees
    /// with the float one (nothing of 9 characters or fewer is rounded by f64), except that
    /// the exact one takes no `inf`/`nan` spelling (neither does the float one in range).
    #[test]
    fn whole_number_agrees_with_the_float_reading(s in "[-+0-9.eE]{1,9}") {
        let max = redcount_core::validate::MAX_SAFE;
        prop_assert_eq!(redcount_core::text::whole_number(&s, max), whole_by_float(&s, max), "{:?}", s);
    }

    /// Every way a whole number in range is printed reads back as itself; half more does not.
    #[test]
    fn whole_number_reads_every_printing_of_a_whole_number(n in -(1i64 << 53) + 1..(1i64 << 53)) {
        let max = redcount_core::validate::MAX_SAFE;
        for text in [n.to_string(), format!("{:e}", n as f64), format!("{n}.000"), format!("{n}e0"), format!("{:E}", n as f64)] {
            prop_assert_eq!(redcount_core::text::whole_number(&text, max), Some(n), "{}", text);
        }
        if n.unsigned_abs() < 1 << 40 {
            prop_assert_eq!(redcount_core::text::whole_number(&format!("{n}.5"), max), None);
        }
        prop_assert_eq!(redcount_core::text::whole_number(&format!("{}0", max), max), None);
    }
}

/// Each script carries the `lua/lib_*.lua` files whose functions it uses (directly, or
/// through another library it carries) and no other: a missing one would fail in Redis at
/// the first call of that path, an extra one costs every call its text.
#[test]
fn every_script_carries_the_libraries_it_calls_and_no_other() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../lua");
    let code = |name: &str| -> String {
        let text = std::fs::read_to_string(dir.join(format!("{name}.lua"))).unwrap();
        text.lines().map(|l| l.split("--").next().unwrap_or("")).collect::<Vec<_>>().join("\n")
    };
    // Each library with the functions it defines.
    let mut libs: Vec<(String, String, Vec<String>)> = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let file = entry.unwrap().file_name().to_string_lossy().into_owned();
        let Some(name) = file.strip_prefix("lib_").and_then(|f| f.strip_suffix(".lua")) else { continue };
        let text = code(&format!("lib_{name}"));
        let defined = text
            .lines()
            .filter_map(|l| l.trim_start().strip_prefix("local function "))
            .map(|l| l.split('(').next().unwrap().trim().to_string())
            .collect();
        libs.push((format!("lib_{name}"), text, defined));
    }
    assert!(libs.len() >= 5, "{} libraries", libs.len());
    // A use: the name as a word (a call, or the function as a value, as decide.lua's table of
    // kinds holds them) in a text that does not define it.
    let calls = |text: &str, f: &str| {
        !text.contains(&format!("local function {f}("))
            && text.split(|c: char| !(c.is_alphanumeric() || c == '_')).any(|w| w == f)
    };
    for script in redcount_core::script::ALL {
        let source = script.source();
        let carried: std::collections::BTreeSet<&str> = libs
            .iter()
            .filter(|(_, _, defined)| defined.iter().any(|f| source.contains(&format!("local function {f}("))))
            .map(|(name, _, _)| name.as_str())
            .collect();
        let mut needed = std::collections::BTreeSet::new();
        let mut texts = vec![code(script.name())];
        while let Some(text) = texts.pop() {
            for (name, lib_text, defined) in &libs {
                if !needed.contains(name.as_str()) && defined.iter().any(|f| calls(&text, f)) {
                    needed.insert(name.as_str());
                    texts.push(lib_text.clone());
                }
            }
        }
        assert_eq!(carried, needed, "{}: the libraries it carries, and those it calls", script.name());
    }
}
