//! One client must not stop or exhaust the front: a runaway script, slow commands, replies
//! past their bounds, and memory under large requests. The connection caps and their
//! eviction, shared by both servers, are tested in redcount-http (tests/caps.rs). The front
//! runs in this process (`redcount_tests::Front`) but where its process's memory is measured.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use redcount_procs::client::{hold_from, request};
use redcount_tests::{Front, RedisServer, RestFront};

/// A request whose reply is huge (an 8.5 KB pipeline of 500 GETs of a 900 KB value: 450 MB)
/// is cut off at `--max-response-bytes` with a clear error, the front's memory stays near
/// the bound, nobody else's request fails, and a writing command that overran is not sent
/// again.
#[test]
fn huge_replies_are_cut_off_at_the_bound() {
    let redis = RedisServer::start();
    let front = RestFront::start_with(&redis.url(), false, &["--max-response-bytes", "8388608"]);
    let _: () = redis::cmd("SET").arg("big").arg(vec![b'v'; 900_000]).query(&mut redis.conn()).unwrap();
    let before = front.peak_rss_kib();
    let gets = serde_json::Value::Array((0..500).map(|_| serde_json::json!(["GET", "big"])).collect());
    let port = front.port();
    let (token, ro) = (front.token.clone(), front.readonly_token.clone());
    let others = std::thread::spawn(move || {
        (0..40)
            .map(|_| {
                std::thread::sleep(Duration::from_millis(10));
                request(port, "POST", "/", &token, r#"["INCR", "others"]"#).0
            })
            .collect::<Vec<_>>()
    });
    // And a 36-byte read-only request for a 26 MB reply, no data needed.
    let _: i64 = redis::cmd("SADD").arg("set").arg("abcdefghij").query(&mut redis.conn()).unwrap();
    for t in [&front.token, &ro] {
        for body in [gets.to_string(), r#"["SRANDMEMBER", "set", "-2000000"]"#.to_string()] {
            let path = if body.starts_with("[[") { "/pipeline" } else { "/" };
            let (status, body) = request(port, "POST", path, t, &body);
            assert_eq!(status, 400, "{}", &body[..body.len().min(300)]);
            // Cut off by the front as it reads, or inside Redis by the limit the front set.
            assert!(
                body.contains("--max-response-bytes") || body.contains("--redis-output-limit-bytes"),
                "{}",
                &body[..body.len().min(300)]
            );
        }
    }
    // The read-only token may PING (Redis does not flag it read-only).
    assert_eq!(request(port, "POST", "/", &ro, r#"["PING"]"#).0, 200);
    assert!(others.join().unwrap().iter().all(|s| *s == 200), "another client's requests were served");
    let grown = front.peak_rss_kib().saturating_sub(before);
    println!("peak RSS grew by {grown} KiB over four 450 MB and two 26 MB replies");
    assert!(grown < 160 * 1024, "the front held the replies: +{grown} KiB");
    // Under the bound, the same value is served whole.
    let (status, body) = request(port, "POST", "/", &front.token, r#"["GET", "big"]"#);
    assert_eq!((status, body.len() > 900_000), (200, true));
    // A script that wrote before its reply overran ran once: not retried.
    let script = r#"["EVAL", "redis.call('INCR', KEYS[1]) return string.rep('x', 9000000)", "1", "n"]"#;
    let (status, body) = request(port, "POST", "/", &front.token, script);
    assert_eq!(status, 400, "{}", &body[..body.len().min(300)]);
    let n: i64 = redis::cmd("GET").arg("n").query(&mut redis.conn()).unwrap();
    assert_eq!(n, 1, "the overrunning write was sent once");

    // redcount's own scripts share connections (no reply bound there): their replies stay
    // small even when the stored answer of an idempotent call was replaced by a huge one.
    use redcount_core::Operation;
    use redcount_core::ops::counter::{AddCounter, Bounds, Storage};
    let idem = redcount_core::ops::Idempotency::new(b"POST\n/x\nk", b"{}");
    let op = redcount_core::ops::Idempotent::new(
        AddCounter::new("c", "s", Storage::Key, 1, Bounds::default()).unwrap(),
        Some(idem.clone()),
    );
    let parts = op.request().command().parts().to_vec();
    let keys: usize = parts[2].parse().unwrap();
    let stored = format!("{}|{}", idem.fingerprint, "1,".repeat(5_000_000));
    let _: () = redis::cmd("SET").arg(&parts[3 + keys - 1]).arg(stored).query(&mut redis.conn()).unwrap();
    let load = serde_json::json!(["SCRIPT", "LOAD", redcount_core::script::COUNTER.source()]).to_string();
    assert_eq!(request(port, "POST", "/", &front.token, &load).0, 200);
    let (status, body) = request(port, "POST", "/", &front.token, &serde_json::json!(parts).to_string());
    assert_eq!(status, 200, "{}", &body[..body.len().min(300)]);
    assert!(body.len() < 200, "a replay's reply stays small: {} bytes", body.len());
}

/// Slow large bodies cannot add up: 100 connections each declare 1 MB, send 900 KB and
/// stall. Past `--max-inflight-body-bytes` they are refused, the front's memory stays near
/// the bound, and small requests are served meanwhile.
#[test]
fn slow_large_bodies_stay_within_their_budget() {
    let redis = RedisServer::start();
    let front =
        RestFront::start_with(&redis.url(), false, &["--max-inflight-body-bytes", "8388608", "--timeout-ms", "3000"]);
    let before = front.peak_rss_kib();
    let head = format!(
        "POST / HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {}\r\ncontent-length: 1000000\r\n\r\n",
        front.readonly_token
    );
    let mut held = Vec::new();
    for i in 0..100u8 {
        let mut s = hold_from([127, 0, 1, i], front.port(), 1).pop().unwrap();
        s.set_write_timeout(Some(Duration::from_secs(2))).unwrap();
        let _ = s.write_all(head.as_bytes());
        let _ = s.write_all(&vec![b' '; 900_000]);
        held.push(s);
    }
    let (status, body) = request(front.port(), "POST", "/", &front.token, r#"["PING"]"#);
    assert_eq!(status, 200, "a small request while 100 large bodies stall: {body}");
    let grown = front.peak_rss_kib().saturating_sub(before);
    println!("peak RSS grew by {grown} KiB with 100 stalled 1 MB bodies");
    assert!(grown < 16 * 1024, "the front held the bodies: +{grown} KiB");
    let mut refused = 0;
    for s in &mut held {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        if out.contains("--max-inflight-body-bytes") {
            refused += 1;
        }
    }
    assert!(refused >= 50, "{refused} of 100 were told the budget was spent");
}

/// A reply under the bound in RESP may be six times larger as JSON (control bytes become
/// `\u0001`): the bound holds for the encoded response too. And clients that ask for large
/// replies and never read them hold at most `--max-inflight-response-bytes`.
#[test]
fn encoded_replies_and_slow_readers_stay_within_their_bounds() {
    let redis = RedisServer::start();
    let front = RestFront::start_with(
        &redis.url(),
        false,
        &["--max-response-bytes", "8388608", "--max-inflight-response-bytes", "16777216", "--timeout-ms", "3000"],
    );
    let _: () = redis::cmd("SET").arg("ctl").arg(vec![1u8; 3_000_000]).query(&mut redis.conn()).unwrap();
    let _: () = redis::cmd("SET").arg("plain").arg(vec![b'x'; 6_000_000]).query(&mut redis.conn()).unwrap();
    let port = front.port();
    let (status, body) = request(port, "POST", "/", &front.token, r#"["GET", "ctl"]"#);
    assert_eq!(status, 400, "3 MB of control bytes is 18 MB of JSON: {}", &body[..body.len().min(200)]);
    assert!(body.contains("--max-response-bytes"), "{}", &body[..body.len().min(200)]);
    // With base64 it is 4 MB: served.
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let req = r#"["GET", "ctl"]"#;
    write!(
        s,
        "POST / HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {}\r\nupstash-encoding: base64\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{req}",
        front.token,
        req.len()
    )
    .unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    assert!(out.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&out[..out.len().min(200)]));

    // 40 clients ask for 6 MB each and never read.
    let before = front.peak_rss_kib();
    let ask = format!(
        "POST / HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {}\r\ncontent-length: 16\r\n\r\n[\"GET\", \"plain\"]",
        front.readonly_token
    );
    let mut readers = Vec::new();
    for i in 0..40u8 {
        let mut s = hold_from([127, 0, 4, i], port, 1).pop().unwrap();
        s.write_all(ask.as_bytes()).unwrap();
        readers.push(s);
    }
    std::thread::sleep(Duration::from_millis(800));
    let (status, body) = request(port, "POST", "/", &front.token, r#"["SET", "k", "v"]"#);
    assert_eq!(status, 200, "a small request while 40 clients do not read: {body}");
    // Replies are charged as they are read, so the budget bounds the peak too (about 40 x 12
    // MB without it).
    let grown = front.peak_rss_kib().saturating_sub(before);
    println!("peak RSS grew by {grown} KiB with 40 clients not reading 6 MB replies");
    assert!(grown < 160 * 1024, "the front held the replies: +{grown} KiB");
    // Most were told the budget was spent (read now, a little at a time).
    let mut refused = 0;
    for s in &mut readers {
        s.set_read_timeout(Some(Duration::from_secs(6))).unwrap();
        let mut head = [0u8; 512];
        let n = s.read(&mut head).unwrap_or(0);
        if String::from_utf8_lossy(&head[..n]).contains("503") {
            refused += 1;
        }
    }
    assert!(refused >= 30, "{refused} of 40 were refused");
}

#[test]
fn a_runaway_script_is_killed_and_nothing_waits_on_it() {
    let mut redis = RedisServer::start();
    let front = Front::start_with(&redis.url(), false, &["--script-timeout-ms", "500"]);
    let port = front.port();
    // The read-only token runs only scripts the full token loaded.
    let (status, body) = request(port, "POST", "/", &front.token, r#"["SCRIPT", "LOAD", "while true do end"]"#);
    assert_eq!(status, 200, "{body}");
    for token in [front.readonly_token.clone(), front.token.clone()] {
        let name = if token == front.token { "EVAL" } else { "EVAL_RO" };
        let runaway = std::thread::spawn(move || {
            request(port, "POST", "/", &token, &format!(r#"["{name}", "while true do end", "0"]"#))
        });
        std::thread::sleep(Duration::from_millis(100));
        // Other requests are answered once the script is killed, with no operator.
        for _ in 0..10 {
            let (status, body) = request(port, "POST", "/", &front.token, r#"["SET", "k", "v"]"#);
            assert_eq!(status, 200, "{body}");
        }
        let (status, body) = runaway.join().unwrap();
        assert_eq!(status, 400, "{body}");
        assert!(body.contains("killed"), "the runaway's caller is told: {body}");
    }
    assert!(front.log().contains("ran past --script-timeout-ms"), "the front logs the kill");
    // Redis itself answers again.
    let pong: String = redis::cmd("PING").query(&mut redis.conn()).unwrap();
    assert_eq!(pong, "PONG");

    // A restarted Redis is back at its own busy-reply-threshold: the front sets its bound
    // again (on its new connections), so a runaway is still killed.
    redis.restart();
    let (status, body) = request(port, "POST", "/", &front.token, r#"["SET", "k", "v"]"#);
    assert_eq!(status, 200, "{body}");
    let got: Vec<String> =
        redis::cmd("CONFIG").arg("GET").arg("busy-reply-threshold").query(&mut redis.conn()).unwrap();
    assert_eq!(got[1], "500", "the front's script bound, set again after the restart");
    let token = front.token.clone();
    let runaway =
        std::thread::spawn(move || request(port, "POST", "/", &token, r#"["EVAL", "while true do end", "0"]"#));
    std::thread::sleep(Duration::from_millis(100));
    let (status, body) = request(port, "POST", "/", &front.token, r#"["SET", "k", "w"]"#);
    assert_eq!(status, 200, "{body}");
    let (status, body) = runaway.join().unwrap();
    assert!(status == 400 && body.contains("killed"), "{status} {body}");
}

/// Fills the list `big` with 200,000 numbers; returns what one `SORT_RO big LIMIT 0 1` (a
/// slow read with a one-element reply) costs Redis here.
fn slow_read(redis: &RedisServer) -> Duration {
    let _: () = redis::cmd("EVAL")
        .arg("for i = 1, 200000 do redis.call('RPUSH', KEYS[1], (i * 7919) % 1000003) end")
        .arg(1)
        .arg("big")
        .query(&mut redis.conn())
        .unwrap();
    let one = Instant::now();
    let _: Vec<String> = redis::cmd("SORT_RO").arg("big").arg("LIMIT").arg(0).arg(1).query(&mut redis.conn()).unwrap();
    one.elapsed()
}

/// Several runaway scripts in one `/multi-exec` or `/pipeline` keep Redis busy script after
/// script, long after their request has timed out: every one is still killed at its bound,
/// and Redis answers again with no operator.
#[test]
fn runaway_scripts_in_a_batch_are_all_killed() {
    let redis = RedisServer::start();
    let front = Front::start_with(&redis.url(), false, &["--script-timeout-ms", "300", "--timeout-ms", "1000"]);
    let port = front.port();
    for (path, n) in [("/multi-exec", 7), ("/pipeline", 10)] {
        let batch =
            serde_json::Value::Array((0..n).map(|_| serde_json::json!(["EVAL", "while true do end", "0"])).collect());
        let t = Instant::now();
        let (status, _) = request(port, "POST", path, &front.token, &batch.to_string());
        assert!(status == 504 || status == 200, "{path}: {status}");
        // Every script is killed within its bound: all of them within n × 300 ms and a margin.
        let deadline = t + Duration::from_millis(300 * n + 3_000);
        loop {
            let mut c = redis.conn();
            match redis::cmd("PING").query::<String>(&mut c) {
                Ok(pong) if pong == "PONG" => break,
                other => {
                    assert!(Instant::now() < deadline, "{path}: Redis still busy after {:?}: {other:?}", t.elapsed())
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let (status, body) = request(port, "POST", "/", &front.token, r#"["SET", "k", "v"]"#);
        assert_eq!(status, 200, "{path}: {body}");
    }
    assert!(front.log().contains("killed a script"), "{}", front.log());

    // A runaway that starts late, behind slow commands of its own transaction (2.4 s of
    // SORT_RO), long after its request timed out, is still killed at its bound.
    let late = Front::start_with(
        &redis.url(),
        false,
        &["--script-timeout-ms", "300", "--timeout-ms", "500", "--max-transaction-commands", "100"],
    );
    let one = slow_read(&redis);
    let slow = (2_400 / one.as_millis().max(1) as usize).clamp(10, 99);
    let mut tx: Vec<serde_json::Value> =
        (0..slow).map(|_| serde_json::json!(["SORT_RO", "big", "LIMIT", "0", "1"])).collect();
    tx.push(serde_json::json!(["EVAL", "while true do end", "0"]));
    let t = Instant::now();
    let (status, _) =
        request(late.port(), "POST", "/multi-exec", &late.token, &serde_json::Value::Array(tx).to_string());
    assert_eq!(status, 504);
    let deadline = t + one * slow as u32 + Duration::from_millis(3_000);
    loop {
        match redis::cmd("PING").query::<String>(&mut redis.conn()) {
            Ok(pong) if pong == "PONG" && t.elapsed() > Duration::from_millis(600) => break,
            other => assert!(Instant::now() < deadline, "Redis still busy after {:?}: {other:?}", t.elapsed()),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn remembered_script_rewrites_stay_within_their_byte_bound() {
    let redis = RedisServer::start();
    let front = RestFront::start(&redis.url(), false);
    let before = front.peak_rss_kib();
    for i in 0..120 {
        // A distinct ~1 MiB script Redis accepts, carrying the flag the front rewrites.
        let pad = "-".repeat(1_000_000);
        let src = format!("#!lua flags=no-writes,allow-key-locking\n-- {i} {pad}\nreturn 1");
        let body = serde_json::json!(["EVAL_RO", src, "0"]).to_string();
        let (status, text) = request(front.port(), "POST", "/", &front.token, &body);
        assert_eq!(status, 200, "{text}");
    }
    let grown = front.peak_rss_kib().saturating_sub(before);
    println!("peak RSS grew by {grown} KiB over 120 MiB of scripts");
    assert!(grown < 64 * 1024, "the front kept the scripts: +{grown} KiB");
}

/// The response bound is checked against the size in the encoding asked for: raw RESP2
/// passes a reply whose JSON form (six bytes per control byte) would not.
#[test]
fn the_response_bound_counts_the_encoding_asked_for() {
    let redis = RedisServer::start();
    let front = Front::start_with(&redis.url(), false, &["--max-response-bytes", "1000000"]);
    let _: () = redis::cmd("SET").arg("ctl").arg(vec![1u8; 400_000]).query(&mut redis.conn()).unwrap();
    let get = |headers: &str, path: &str, body: &str| {
        let mut s = TcpStream::connect(("127.0.0.1", front.port())).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        write!(
            s,
            "POST {path} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {}\r\n{headers}content-length: {}\r\nconnection: close\r\n\r\n{body}",
            front.token,
            body.len()
        )
        .unwrap();
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        let head_end = out.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
        (String::from_utf8_lossy(&out[..12]).into_owned(), out.len() - head_end)
    };
    for path in ["/", "/pipeline"] {
        let body = if path == "/" { r#"["GET","ctl"]"# } else { r#"[["GET","ctl"]]"# };
        let (status, len) = get("upstash-response-format: resp2\r\n", path, body);
        assert_eq!(status, "HTTP/1.1 200", "resp2 {path}");
        assert!(len > 400_000 && len < 400_100, "{len}");
        let (status, len) = get("upstash-encoding: base64\r\n", path, body);
        assert_eq!(status, "HTTP/1.1 200", "base64 {path}");
        assert!(len > 533_000, "{len}");
        let (status, _) = get("", path, body);
        assert_eq!(status, "HTTP/1.1 400", "JSON {path}: 2.4 MB once escaped");
    }
}

/// Redis's own memory is bounded too: a read-only MGET naming a 10 KB key 20,000 times (a
/// 200 MB reply from a 140 KB request) is cut off inside Redis by the output-buffer limit the
/// front sets, and a negative count that must reply more than the bound is refused before
/// anything is sent.
#[test]
fn redis_does_not_build_replies_past_the_bound() {
    let redis = RedisServer::start();
    let front = Front::start_with(&redis.url(), false, &["--max-response-bytes", "8388608"]);
    let mut c = redis.conn();
    let _: () = redis::cmd("SET").arg("k10k").arg(vec![b'v'; 10_000]).query(&mut c).unwrap();
    let _: i64 = redis::cmd("SADD").arg("one").arg("m").query(&mut c).unwrap();
    let limit: Vec<String> = redis::cmd("CONFIG").arg("GET").arg("client-output-buffer-limit").query(&mut c).unwrap();
    assert!(limit[1].starts_with(&format!("normal {} 0 0", 8_388_608 + (1 << 20))), "{limit:?}");
    let used_peak = |c: &mut redis::Connection| -> u64 {
        let info: String = redis::cmd("INFO").arg("memory").query(c).unwrap();
        info.lines().find_map(|l| l.strip_prefix("used_memory_peak:")).unwrap().trim().parse().unwrap()
    };
    let before = used_peak(&mut c);
    let mget = serde_json::Value::Array(
        std::iter::once(serde_json::json!("MGET")).chain((0..20_000).map(|_| serde_json::json!("k10k"))).collect(),
    );
    let (status, body) = request(front.port(), "POST", "/", &front.readonly_token, &mget.to_string());
    assert_eq!(status, 400, "{}", &body[..body.len().min(300)]);
    let grown = used_peak(&mut c).saturating_sub(before);
    assert!(grown < 48 << 20, "Redis's peak memory grew by {} MiB for one request", grown >> 20);

    let t = Instant::now();
    for cmd in ["SRANDMEMBER", "ZRANDMEMBER", "HRANDFIELD"] {
        let (status, body) =
            request(front.port(), "POST", "/", &front.readonly_token, &format!(r#"["{cmd}","one","-200000000"]"#));
        assert_eq!(status, 400, "{body}");
        assert!(body.contains("--max-response-bytes") && body.contains("-200000000"), "{body}");
    }
    assert!(t.elapsed() < Duration::from_secs(2), "refused before Redis spent seconds on it: {:?}", t.elapsed());
    // Other clients are served, and a count within the bound still works.
    let (status, body) = request(front.port(), "POST", "/", &front.token, r#"["SRANDMEMBER","one","-3"]"#);
    assert_eq!((status, body.as_str()), (200, r#"{"result":["m","m","m"]}"#));
}

/// Redis time per request is bounded too, not only reply size: a `/pipeline` of slow reads
/// that reply little (each SORT_RO of a 200,000-element list, LIMIT 0 1) is sent
/// in chunks and stops once `--timeout-ms` is spent, so Redis is free again right after; a
/// `/multi-exec` (which cannot stop) is bounded by `--max-transaction-commands`; LCS, whose
/// cost is the product of two lengths, is refused.
#[test]
fn slow_commands_cannot_hold_redis_past_the_timeout() {
    let redis = RedisServer::start();
    let front = Front::start_with(&redis.url(), false, &["--timeout-ms", "1000"]);
    let cost = slow_read(&redis);
    let n = (6_000 / cost.as_millis().max(1) as usize).clamp(20, 3_000);
    let pipeline =
        serde_json::Value::Array((0..n).map(|_| serde_json::json!(["SORT_RO", "big", "LIMIT", "0", "1"])).collect());
    let t = Instant::now();
    let (status, body) = request(front.port(), "POST", "/pipeline", &front.token, &pipeline.to_string());
    assert_eq!(status, 504, "{}", &body[..body.len().min(300)]);
    // Stopped between chunks, or while the last chunk sent was running.
    assert!(body.contains("the rest were not sent") || body.contains("did not answer within 1000 ms"), "{body}");
    // Redis answers another client right after: what was sent ran, the rest never reached it.
    let pong: String = redis::cmd("PING").query(&mut redis.conn()).unwrap();
    let free = t.elapsed();
    assert_eq!(pong, "PONG");
    println!("{n} SORT_RO of {cost:?} each ({:?} in all): Redis free after {free:?}", cost * n as u32);
    // The bound leaves room for a loaded 2-core machine (scheduling, the last chunk's own
    // run); all the work sent at once would hold Redis at least twice as long.
    let bound = Duration::from_millis(1_700) + cost * 3;
    assert!(cost * n as u32 >= bound * 2, "the pipeline is too cheap to tell ({:?} in all)", cost * n as u32);
    assert!(free < bound, "Redis was held {free:?} (bound {bound:?})");

    let tx = |k: usize| serde_json::Value::Array((0..k).map(|_| serde_json::json!(["GET", "x"])).collect()).to_string();
    let (status, body) = request(front.port(), "POST", "/multi-exec", &front.readonly_token, &tx(33));
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("--max-transaction-commands"), "{body}");
    assert_eq!(request(front.port(), "POST", "/multi-exec", &front.readonly_token, &tx(32)).0, 200);
    for token in [&front.token, &front.readonly_token] {
        let (status, body) = request(front.port(), "POST", "/", token, r#"["LCS", "a", "b", "LEN"]"#);
        assert_eq!(status, 400, "{body}");
        assert!(body.contains("LCS"), "{body}");
    }
    // Nor inside the full token's scripts (its Redis user may not).
    let (status, body) = request(
        front.port(),
        "POST",
        "/",
        &front.token,
        r#"["EVAL", "return redis.call('lcs', KEYS[1], KEYS[2])", "2", "a", "b"]"#,
    );
    assert_eq!(status, 400, "{body}");
    // (Redis 7.0: "can't run this command"; Valkey 8: "ACL failure in script ... no permissions".)
    let refused = ["NOPERM", "can't run this command", "no permissions to run the 'lcs' command"];
    assert!(refused.iter().any(|r| body.contains(r)), "{body}");
    // One set named many times would make Redis redo the work for every copy.
    let _: i64 = redis::cmd("SADD").arg("s").arg("m").query(&mut redis.conn()).unwrap();
    for cmd in [r#"["SUNION","s","s"]"#, r#"["SINTERCARD","2","s","s"]"#, r#"["ZUNIONSTORE","d","3","z","y","z"]"#] {
        let (status, body) = request(front.port(), "POST", "/", &front.token, cmd);
        assert_eq!(status, 400, "{cmd}: {body}");
        assert!(body.contains("more than once"), "{body}");
    }
    let (status, body) = request(front.port(), "POST", "/", &front.readonly_token, r#"["SUNION","s","t"]"#);
    assert_eq!((status, body.as_str()), (200, r#"{"result":["m"]}"#));
}

/// The commands the front runs on its shared, pipelined connections (beside redcount's own
/// scripts) answer one integer whatever their arguments, and none blocks: each is run against
/// a real Redis with the widest arguments it takes (options included), and looked up in
/// Redis's own COMMAND table. The table here covers the front's list exactly, so a command
/// added there without a case here fails.
#[test]
fn the_commands_that_share_connections_answer_one_integer() {
    let redis = RedisServer::start();
    let mut c = redis.conn();
    let _: () = redis::cmd("SET").arg("s").arg("hello").query(&mut c).unwrap();
    let _: () = redis::cmd("SET").arg("n").arg("5").query(&mut c).unwrap();
    let cases: &[(&str, &[&str])] = &[
        ("INCR", &["n"]),
        ("INCRBY", &["n", "5"]),
        ("DECR", &["n"]),
        ("DECRBY", &["n", "2"]),
        ("DEL", &["a", "b", "c"]),
        ("UNLINK", &["a", "b"]),
        ("EXISTS", &["s", "n", "s"]),
        ("TOUCH", &["s", "n"]),
        ("EXPIRE", &["n", "100", "NX"]),
        ("PEXPIRE", &["n", "100000", "GT"]),
        ("EXPIREAT", &["n", "4000000000", "XX"]),
        ("PEXPIREAT", &["n", "4000000000000"]),
        ("TTL", &["n"]),
        ("PTTL", &["n"]),
        ("PERSIST", &["n"]),
        ("SETNX", &["s", "x"]),
        ("STRLEN", &["s"]),
        ("GETBIT", &["s", "3"]),
        ("SETBIT", &["bits", "100", "1"]),
        ("BITCOUNT", &["s", "0", "-1", "BIT"]),
        ("HINCRBY", &["h", "f", "3"]),
        ("HSET", &["h", "a", "1", "b", "2"]),
        ("HSETNX", &["h", "c", "3"]),
        ("HDEL", &["h", "a", "zz"]),
        ("HEXISTS", &["h", "b"]),
        ("HLEN", &["h"]),
        ("SADD", &["set", "a", "b"]),
        ("SREM", &["set", "a"]),
        ("SISMEMBER", &["set", "b"]),
        ("SCARD", &["set"]),
        ("LPUSH", &["list", "a", "b"]),
        ("RPUSH", &["list", "c"]),
        ("LPUSHX", &["list", "d"]),
        ("RPUSHX", &["nolist", "d"]),
        ("LLEN", &["list"]),
        ("ZREM", &["zset", "a"]),
        ("ZCARD", &["zset"]),
        ("PFADD", &["hll", "a", "b"]),
        ("PUBLISH", &["channel", "a message"]),
    ];
    let listed: std::collections::BTreeSet<&str> = redcount_front::INTEGER_REPLY_COMMANDS.iter().copied().collect();
    let tested: std::collections::BTreeSet<&str> = cases.iter().map(|c| c.0).collect();
    assert_eq!(listed, tested, "every command on the shared connections has a case here");
    for (name, args) in cases {
        let reply: redis::Value = redis::cmd(name).arg(*args).query(&mut c).unwrap();
        assert!(matches!(reply, redis::Value::Int(_)), "{name} {args:?} answered {reply:?}");
        // Redis's own table: [[name, arity, [flags…], first key, last key, step, …]].
        let info: Vec<redis::Value> = redis::cmd("COMMAND").arg("INFO").arg(*name).query(&mut c).unwrap();
        let Some(redis::Value::Array(entry)) = info.first() else { panic!("{name} is not in Redis's COMMAND table") };
        let Some(redis::Value::Array(flags)) = entry.get(2) else { panic!("{name}: no flags in {entry:?}") };
        let flags: Vec<String> = flags.iter().map(|f| redis::from_redis_value::<String>(f.clone()).unwrap()).collect();
        assert!(!flags.iter().any(|f| f == "blocking"), "{name} may block a shared connection: {flags:?}");
    }
}

/// A reply past Redis's output-buffer limit is the client's 400 naming the bound, also after
/// Redis restarted under the front (which sets the limit again on its new connections).
#[test]
fn a_reply_past_the_output_limit_is_a_400_after_a_redis_restart_too() {
    let mut redis = RedisServer::start();
    let front = Front::start(&redis.url(), false);
    let port = front.port();
    // 52 MB of reply: Redis passes the output limit (17 MiB by default) long before the front
    // has read its own bound.
    let huge = r#"["SRANDMEMBER", "set", "-4000000"]"#;
    let ask = |redis: &RedisServer| {
        let _: i64 = redis::cmd("SADD").arg("set").arg("abcdefghij").query(&mut redis.conn()).unwrap();
        request(port, "POST", "/", &front.token, huge)
    };
    let (status, body) = ask(&redis);
    assert_eq!(status, 400, "{}", &body[..body.len().min(300)]);
    redis.restart();
    // The first request after the restart may lose its connection to the restart itself (a
    // 503 then); the ones after it are judged against the new Redis.
    let answers: Vec<(u16, String)> = (0..3).map(|_| ask(&redis)).collect();
    let (status, body) = answers.last().unwrap();
    assert_eq!(*status, 400, "{:?}", answers.iter().map(|(s, b)| (s, &b[..b.len().min(200)])).collect::<Vec<_>>());
    assert!(body.contains("--redis-output-limit-bytes") || body.contains("--max-response-bytes"), "{body}");
}
