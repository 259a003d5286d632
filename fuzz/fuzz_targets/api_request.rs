//! The HTTP API's request handling (routing, percent-decoding, JSON bodies, queries, auth)
//! and then the REST reply it gets back: arbitrary requests and replies never panic.
#![no_main]
use libfuzzer_sys::fuzz_target;
use rand::SeedableRng;
use redcount_api::{self as api, ApiRequest, Config, Step};

const POLICIES: &str = r#"{
  "q": {"kind": "quota", "algorithm": "sliding", "limit": 5, "window_ms": 1000, "max_cost": 2},
  "s": {"kind": "semaphore", "limit": 2, "lease_ms": 1000},
  "c": {"kind": "counter", "min": 0, "max": 10, "storage": "hash"},
  "k": {"kind": "claim", "window_ms": 1000},
  "p": {"kind": "redpackets", "max_shares": 10, "max_total_cents": 1000},
  "i": {"kind": "inbox", "public": true}
}"#;

fuzz_target!(|data: &[u8]| {
    let config = Config::from_env(|n| match n {
        "REDCOUNT_REST_URL" => Some("http://127.0.0.1:1".into()),
        "REDCOUNT_REST_TOKEN" => Some("t".into()),
        "REDCOUNT_ADMIN_TOKEN" => Some("0123456789abcdef".into()),
        "REDCOUNT_POLICIES" => Some(POLICIES.into()),
        _ => None,
    })
    .unwrap();
    // Layout: method selector, then "path\nquery\nheaders\nbody...\n\x00reply".
    let Some((m, rest)) = data.split_first() else { return };
    let method = ["GET", "POST", "DELETE", "PUT", "OPTIONS", "HEAD"][*m as usize % 6];
    let (request, reply) = match rest.iter().position(|b| *b == 0) {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, &b"{\"result\":[1,2,3,4,5]}"[..]),
    };
    let mut parts = request.splitn(4, |b| *b == b'\n');
    let text = |p: Option<&[u8]>| std::str::from_utf8(p.unwrap_or(b"")).unwrap_or("").to_string();
    let (path, query, header) = (text(parts.next()), text(parts.next()), text(parts.next()));
    let body = parts.next().unwrap_or(b"");
    let req = ApiRequest {
        method,
        path: &format!("/api/{path}"),
        query: &query,
        authorization: header.strip_prefix("A:"),
        origin: None,
        idempotency_key: header.strip_prefix("I:"),
        body,
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut step = api::handle(&config, &req, &mut rng);
    for _ in 0..3 {
        match step {
            Step::Respond(r) => {
                assert!((200..600).contains(&r.status));
                return;
            }
            Step::Send(ex) => step = ex.receive(reply.first().map(|b| 200 + (*b as u16 % 4) * 100).unwrap_or(200), reply),
            // Any text as a script's: only the one whose SHA-1 matches is ever sent.
            Step::Script(ex) => step = ex.give_script(reply),
        }
    }
});
