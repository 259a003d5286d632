//! examples/llm-gateway (with the `npm pack`ed @redcount/client) under workerd beside the
//! redcount worker, before a real REST front and Redis, and a fake streaming upstream started
//! here: concurrent chat streams of random real usage (below, equal to and above the
//! estimate), some clients going away mid-stream, some upstreams failing mid-stream, some
//! streams outliving the lease (kept by the heartbeat), against a tokens-per-minute quota, a
//! micro-dollar quota and an in-flight semaphore.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use redcount_core::keys;
use redcount_core::ops::quota::Algorithm;
use redcount_core::ops::reservation::OnExpiry;
use redcount_procs::workerd::Binding;
use redcount_tests::{root, uid};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

use crate::model::{Rng, seed};
use crate::reservations::{live_leases, policy_json, used_of};

/// The quotas' sizes, their debt bounds (above the most that the streams in flight at once
/// can overrun together, so that every overrun is charged and the sums are exact), the
/// in-flight limit, the lease the heartbeat renews, and the prices (µ$ per token).
const TPM: i64 = 1_500;
const TPM_DEBT: i64 = 800;
const USD: i64 = 16_000;
const USD_DEBT: i64 = 12_000;
const IN_FLIGHT: i64 = 4;
const LEASE_MS: i64 = 1_000;
const PRICES: (i64, i64) = (3, 15);

/// Nothing comes back by time during the test (a token a year at the most, within the
/// bounds the policy check sets): what a quota holds is what was charged.
fn bucket(capacity: i64) -> Algorithm {
    let interval_ms = 1_000_000_000_000.min(4_500_000_000_000_000 / (2 * capacity));
    Algorithm::TokenBucket { capacity, refill: 1, interval_ms }
}

/// What the upstream is asked to do (the `fake` field of a request, which the gateway passes
/// on with the rest of the body).
fn plan(rng: &mut Rng, chunks: i64, fail_after: Option<i64>, usage: (i64, i64)) -> Value {
    json!({"chunks": chunks, "delay_ms": rng.range(30, 100), "fail_after": fail_after,
           "prompt_tokens": usage.0, "completion_tokens": usage.1})
}

/// The fake upstream: an OpenAI-style streaming chat completion (HTTP/1.1, chunked), as
/// `fake` says: `chunks` content chunks `delay_ms` apart, then a chunk with `usage` and
/// `[DONE]`; or the connection dropped after `fail_after` chunks. Counts its requests.
async fn upstream(listener: TcpListener, requests: Arc<AtomicUsize>) {
    loop {
        let Ok((sock, _)) = listener.accept().await else { return };
        let requests = requests.clone();
        tokio::spawn(async move {
            let _ = answer(sock, &requests).await;
        });
    }
}

async fn answer(sock: TcpStream, requests: &AtomicUsize) -> std::io::Result<()> {
    let mut sock = BufReader::new(sock);
    let mut length = 0;
    loop {
        let mut line = String::new();
        if sock.read_line(&mut line).await? == 0 {
            return Ok(());
        }
        if let Some((k, v)) = line.split_once(':')
            && k.eq_ignore_ascii_case("content-length")
        {
            length = v.trim().parse().unwrap_or(0);
        }
        if line == "\r\n" {
            break;
        }
    }
    let mut body = vec![0; length];
    sock.read_exact(&mut body).await?;
    requests.fetch_add(1, Ordering::SeqCst);
    let body: Value = serde_json::from_slice(&body).unwrap_or_default();
    let sock = sock.get_mut();
    if body["stream"] != true || body["stream_options"]["include_usage"] != true {
        // The gateway always asks for a stream with its usage (else it answers 502).
        return sock.write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n").await;
    }
    let fake = &body["fake"];
    let n = |k: &str| fake[k].as_i64().unwrap_or(0);
    sock.write_all(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n",
    )
    .await?;
    let chunk = |data: String| {
        let event = format!("data: {data}\n\n");
        format!("{:x}\r\n{event}\r\n", event.len())
    };
    for i in 0..n("chunks") {
        if fake["fail_after"].as_i64() == Some(i) {
            // Dropped mid-stream: no usage, no last chunk.
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(n("delay_ms") as u64)).await;
        sock.write_all(chunk(json!({"choices": [{"delta": {"content": format!("w{i} ")}}]}).to_string()).as_bytes())
            .await?;
    }
    tokio::time::sleep(Duration::from_millis(n("delay_ms") as u64)).await;
    let usage = json!({"prompt_tokens": n("prompt_tokens"), "completion_tokens": n("completion_tokens")});
    sock.write_all(chunk(json!({"choices": [], "usage": usage}).to_string()).as_bytes()).await?;
    sock.write_all(chunk("[DONE]".into()).as_bytes()).await?;
    sock.write_all(b"0\r\n\r\n").await
}

/// How a stream ended, seen from its client.
#[derive(Debug, Clone, PartialEq)]
enum End {
    /// Refused by the gateway (429), by this policy.
    Denied(String),
    /// Read to its end, `usage` (prompt, completion tokens) in its last chunk.
    Settled(i64, i64),
    /// The client went away after the first chunk.
    Cancelled,
    /// The upstream broke off before its usage.
    Failed,
}

/// The LLM gateway test: 128 chat requests from 16 clients over two users, each with
/// a random prompt and max_tokens, real usage below, equal to or above the gateway's
/// estimate, one in five clients going away after the first chunk and one in five upstreams
/// failing mid-stream, some streams longer than the lease. Afterwards each
/// user's quotas in Redis hold exactly the settled streams' tokens and prices (cancelled and
/// failed ones gave everything back); sampled throughout, no quota was ever above its size
/// plus its max_debt and never more than the in-flight limit of streams were live; a denied
/// request (429 with Retry-After and RateLimit) never reached the upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_llm_gateway_settles_real_usage_and_gives_back_cancelled_streams() {
    let seed = seed();
    println!("seed {seed} (replay: REDCOUNT_SEED={seed})");
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream_url = format!("http://{}/v1/chat/completions", listener.local_addr().unwrap());
    let requests = Arc::new(AtomicUsize::new(0));
    tokio::spawn(upstream(listener, requests.clone()));

    let policies = json!({
        "tpm": policy_json(bucket(TPM), TPM_DEBT, OnExpiry::Charge, TPM),
        "usd-day": policy_json(bucket(USD), USD_DEBT, OnExpiry::Charge, USD),
        "in-flight": {"kind": "semaphore", "limit": IN_FLIGHT, "lease_ms": LEASE_MS},
    });
    let vars = [
        ("UPSTREAM_URL", upstream_url),
        ("PRICE_PROMPT", PRICES.0.to_string()),
        ("PRICE_COMPLETION", PRICES.1.to_string()),
        ("LEASE_MS", LEASE_MS.to_string()),
    ];
    let s = crate::rpc::own_worker(
        "llm-gateway",
        &policies.to_string(),
        &root().join("examples/llm-gateway/src/index.ts"),
        &vars,
        vec![Binding::service("REDCOUNT", "redcount", Some("Redcount"), None)],
    );
    let users = [uid("alice"), uid("bob")];

    // The sampler: every quota within its size plus its max_debt, the streams live within
    // the in-flight limit, at every sample.
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (done, users, mut c) = (done.clone(), users.clone(), s.redis.conn());
        std::thread::spawn(move || {
            let mut most = (0, 0, 0);
            while !done.load(Ordering::Relaxed) {
                for u in &users {
                    most.0 = most.0.max(used_of(&mut c, &keys::quota("tpm", u, "tb"), bucket(TPM)));
                    most.1 = most.1.max(used_of(&mut c, &keys::quota("usd-day", u, "tb"), bucket(USD)));
                    most.2 = most.2.max(live_leases(&mut c, &keys::semaphore("in-flight", u)));
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            most
        })
    };

    let started = Instant::now();
    let mut clients = Vec::new();
    for c in 0..16 {
        let (user, log) = (users[c % 2].clone(), s.log.clone());
        // A connection per request: a stream broken off leaves none half-read in a pool.
        let api = reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap();
        let url = format!("{}/v1/chat/completions", s.api.base);
        clients.push(tokio::spawn(async move {
            let mut rng = Rng::new(seed, &format!("llm/{c}"));
            let mut ends = Vec::new();
            for _ in 0..8 {
                let content = "x".repeat(rng.range(20, 400) as usize);
                let max_tokens = rng.range(10, 200);
                let prompt = 4 + (content.len() as i64 + 3) / 4;
                let estimate = prompt + max_tokens;
                // The real prompt within a few tokens of the estimate; the completion such
                // that the total is below, equal to or above the estimate.
                let real_prompt = (prompt + rng.range(-3, 3)).max(1);
                let completion = match rng.below(3) {
                    0 => rng.range(0, estimate - real_prompt - 1),
                    1 => estimate - real_prompt,
                    _ => estimate - real_prompt + rng.range(1, max_tokens / 2 + 1),
                };
                let chunks = rng.range(5, 14);
                let what = rng.below(5);
                let fail_after = (what == 0).then(|| rng.range(1, chunks - 1));
                let cancel = what == 1;
                let body = json!({"model": "m", "max_tokens": max_tokens,
                                  "messages": [{"role": "user", "content": content}],
                                  "fake": plan(&mut rng, chunks, fail_after, (real_prompt, completion))});
                let mut resp = api.post(&url).header("x-user", &user).body(body.to_string()).send().await.unwrap();
                let status = resp.status().as_u16();
                if status == 429 {
                    let h = resp.headers();
                    assert!(h["retry-after"].to_str().unwrap().parse::<u64>().is_ok(), "{h:?}");
                    assert!(h.contains_key("ratelimit") && h.contains_key("ratelimit-policy"), "{h:?}");
                    let refused: Value = serde_json::from_str(&resp.text().await.unwrap()).unwrap();
                    ends.push((user.clone(), End::Denied(refused["denied_by"].as_str().unwrap_or("?").to_string())));
                    tokio::time::sleep(Duration::from_millis(rng.range(10, 40) as u64)).await;
                    continue;
                }
                if status != 200 {
                    let log = std::fs::read_to_string(&log).unwrap_or_default();
                    panic!("{status}: {}\n{log}", resp.text().await.unwrap_or_default());
                }
                if cancel {
                    assert!(resp.chunk().await.unwrap().is_some(), "a first chunk");
                    drop(resp);
                    ends.push((user.clone(), End::Cancelled));
                    continue;
                }
                let mut text = Vec::new();
                while let Ok(Some(b)) = resp.chunk().await {
                    text.extend_from_slice(&b);
                }
                let text = String::from_utf8(text).unwrap();
                let end = match fail_after {
                    Some(_) => {
                        assert!(!text.contains("usage"), "{text}");
                        End::Failed
                    }
                    None => {
                        assert!(text.contains("\"usage\"") && text.ends_with("data: [DONE]\n\n"), "{text}");
                        End::Settled(real_prompt, completion)
                    }
                };
                ends.push((user.clone(), end));
            }
            ends
        }));
    }
    let mut ends = Vec::new();
    for c in clients {
        ends.extend(c.await.unwrap());
    }
    let took = started.elapsed();

    // Every stream's reservation settled or released: no lease left.
    let mut c = s.redis.conn();
    let deadline = Instant::now() + Duration::from_secs(10);
    while users.iter().any(|u| live_leases(&mut c, &keys::semaphore("in-flight", u)) > 0) {
        let live: Vec<i64> = users.iter().map(|u| live_leases(&mut c, &keys::semaphore("in-flight", u))).collect();
        assert!(Instant::now() < deadline, "leases still live: {live:?}; {ends:?}\n{}", s.log());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    done.store(true, Ordering::Relaxed);
    let most = sampler.join().unwrap();

    let count = |f: fn(&End) -> bool| ends.iter().filter(|(_, e)| f(e)).count();
    let denied = count(|e| matches!(e, End::Denied(_)));
    let counts = (
        count(|e| matches!(e, End::Settled(..))),
        count(|e| *e == End::Cancelled),
        count(|e| *e == End::Failed),
        denied,
    );
    let mut by: BTreeMap<&str, usize> = BTreeMap::new();
    for (_, e) in &ends {
        if let End::Denied(policy) = e {
            *by.entry(policy).or_default() += 1;
        }
    }
    println!("{counts:?} (settled, cancelled, failed, denied: {by:?}) in {took:?}; most held {most:?}");
    assert!(
        by.keys().all(|p| ["tpm", "usd-day", "in-flight"].contains(p))
            && by.contains_key("in-flight")
            && (by.contains_key("tpm") || by.contains_key("usd-day")),
        "refused by the slots and by a quota: {by:?}"
    );
    assert!(counts.0 > 0 && counts.1 > 0 && counts.2 > 0 && denied > 0, "every ending happened: {counts:?}");
    assert_eq!(requests.load(Ordering::SeqCst), ends.len() - denied, "a denied request reached the upstream");
    let mut model: BTreeMap<&str, (i64, i64)> = BTreeMap::new();
    for (user, end) in &ends {
        let m = model.entry(user).or_default();
        if let End::Settled(p, cpl) = end {
            m.0 += p + cpl;
            m.1 += p * PRICES.0 + cpl * PRICES.1;
        }
    }
    for u in &users {
        let held = (
            used_of(&mut c, &keys::quota("tpm", u, "tb"), bucket(TPM)),
            used_of(&mut c, &keys::quota("usd-day", u, "tb"), bucket(USD)),
        );
        assert_eq!(held, model.get(u.as_str()).copied().unwrap_or_default(), "{u}: tokens, µ$\n{}", s.log());
    }
    assert!(most.0 <= TPM + TPM_DEBT && most.1 <= USD + USD_DEBT, "over a quota's bound: {most:?}");
    assert!(most.2 <= IN_FLIGHT, "more streams live than the limit: {most:?}");
    let log = s.log();
    assert!(!log.contains("settle or release failed"), "{log}");
}
