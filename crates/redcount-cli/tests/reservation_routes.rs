//! The reservation routes through `redcount serve`'s app, in-process (`Backend::Direct`,
//! oneshot) against a real redis-server: what they answer, and what a client trying them as
//! an attacker gets (another subject's id, a forged id, a second settle, actuals out of range,
//! parts that are not the reservation's, a quota pushed past its limit and max_debt), each
//! with Redis compared byte for byte where nothing may be written.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::http::{HeaderMap, Request};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use redcount_cli::serve::{Backend, app};
use serde_json::{Value, json};
use tower::ServiceExt;

mod support;
use support::{Server, Snapshot, diff, server, snapshot};

const ADMIN: &str = "admin-token-of-reservation-routes";
/// Long enough that nothing comes back by time during a test.
const LONG: i64 = 1_000_000_000_000;

fn policies() -> String {
    json!({
        "tpm": {"kind": "quota", "algorithm": "sliding", "limit": 10_000, "window_ms": 3_600_000,
                "max_cost": 5_000, "on_expiry": "refund"},
        "usd": {"kind": "quota", "algorithm": "fixed", "limit": 1_000_000, "window_ms": LONG,
                "max_cost": 1_000_000, "max_debt": 50_000},
        "burst": {"kind": "quota", "algorithm": "bucket", "capacity": 100, "refill": 1, "interval_ms": LONG,
                  "max_cost": 100, "max_debt": 20},
        "gtok": {"kind": "quota", "algorithm": "gcra", "rate": 100, "period_ms": 60_000, "burst": 100, "max_cost": 100},
        "flight": {"kind": "semaphore", "limit": 3, "lease_ms": 60_000},
        "hits": {"kind": "counter", "min": 0},
    })
    .to_string()
}

struct Env {
    _server: Server,
    app: axum::Router,
    c: redis::Connection,
}

async fn env_with(secret: Option<&str>) -> Env {
    let server = server();
    let policies = policies();
    let config = redcount_api::Config::from_env(|name| match name {
        "REDCOUNT_POLICIES" => Some(policies.clone()),
        "REDCOUNT_ADMIN_TOKEN" => Some(ADMIN.to_string()),
        "REDCOUNT_ID_SECRET" => secret.map(str::to_string),
        _ => None,
    })
    .unwrap();
    let direct = redcount::Direct::connect(&server.url).await.unwrap();
    let www = std::env::temp_dir();
    let app = app(config, Backend::Direct(direct), www, Duration::from_secs(5));
    let c = redis::Client::open(server.url.as_str()).unwrap().get_connection().unwrap();
    Env { _server: server, app, c }
}

async fn env() -> Env {
    env_with(None).await
}

struct Answer {
    status: u16,
    headers: HeaderMap,
    json: Value,
}

impl Answer {
    fn field(&self) -> &str {
        self.json["field"].as_str().unwrap_or("")
    }
}

impl Env {
    async fn send(&self, method: &str, path: &str, body: &str, headers: &[(&str, &str)]) -> Answer {
        let mut r = Request::builder().method(method).uri(path);
        for (k, v) in headers {
            r = r.header(*k, *v);
        }
        let response = self.app.clone().oneshot(r.body(Body::from(body.to_string())).unwrap()).await.unwrap();
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
        Answer { status, headers, json: serde_json::from_slice(&bytes).unwrap_or(Value::Null) }
    }

    async fn post(&self, path: &str, body: Value) -> Answer {
        self.send("POST", path, &body.to_string(), &[]).await
    }

    /// A reservation that must be granted: its id.
    async fn reserve(&self, subject: &str, body: Value) -> String {
        let a = self.post(&format!("/api/reservations/{subject}"), body).await;
        assert_eq!((a.status, &a.json["allowed"]), (200, &json!(true)), "{}", a.json);
        a.json["reservation"].as_str().unwrap().to_string()
    }

    fn snapshot(&mut self) -> Snapshot {
        snapshot(&mut self.c)
    }

    /// What the quota has left for `subject` (a peek, which writes nothing).
    async fn remaining(&self, policy: &str, subject: &str) -> i64 {
        let a = self.send("GET", &format!("/api/quotas/{policy}/{subject}"), "", &[]).await;
        a.json["remaining"].as_i64().unwrap()
    }
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as i64
}

fn part(a: &Answer, i: usize) -> &Value {
    &a.json["parts"][i]
}

/// The part's numbers of a settlement: reserved, actual, refunded, charged, uncharged, debt.
fn settled(a: &Answer, i: usize) -> [i64; 6] {
    let p = part(a, i);
    ["reserved", "actual", "refunded", "charged", "uncharged", "debt"].map(|k| p[k].as_i64().unwrap())
}

#[tokio::test]
async fn a_reservation_is_reserved_then_settled_at_what_was_used() {
    let env = env().await;
    let a = env
        .post(
            "/api/reservations/alice",
            json!({"parts": [{"policy": "tpm", "units": 1200}, {"policy": "usd", "units": 350_000},
                             {"policy": "flight", "holder": "req-7"}], "lease_ms": 60_000, "mode": "all"}),
        )
        .await;
    assert_eq!(a.status, 200, "{}", a.json);
    assert_eq!(
        (&a.json["allowed"], &a.json["state"], &a.json["denied_by"]),
        (&json!(true), &json!("open"), &json!(null))
    );
    let expires = a.json["expires_ms"].as_i64().unwrap();
    assert!((now_ms() + 50_000..=now_ms() + 61_000).contains(&expires), "{}", a.json);
    assert_eq!((&part(&a, 0)["reserved"], &part(&a, 0)["remaining"]), (&json!(1200), &json!(8800)));
    assert_eq!((&part(&a, 1)["reserved"], &part(&a, 1)["level"]), (&json!(350_000), &json!("user")));
    assert_eq!((&part(&a, 2)["result"], &part(&a, 2)["in_use"]), (&json!("acquired"), &json!(1)));
    let policy = a.headers["ratelimit-policy"].to_str().unwrap();
    assert!(policy.contains(r#""tpm";q=10000"#) && policy.contains(r#""flight";q=3"#), "{policy}");
    assert!(a.headers["ratelimit"].to_str().unwrap().contains(r#""usd";r=650000"#), "{:?}", a.headers);
    let id = a.json["reservation"].as_str().unwrap().to_string();

    // Below the reservation on one part, above it on the other: the difference back, the
    // overrun charged; the lease freed.
    let s = env
        .post(
            &format!("/api/reservations/alice/{id}/settle"),
            json!({"actual": [{"policy": "tpm", "units": 900}, {"policy": "usd", "units": 400_000}]}),
        )
        .await;
    assert_eq!(s.status, 200, "{}", s.json);
    assert_eq!(
        (&s.json["state"], &s.json["already_settled"], &s.json["reservation"]),
        (&json!("settled"), &json!(false), &json!(id))
    );
    assert_eq!(settled(&s, 0), [1200, 900, 300, 0, 0, 0]);
    assert_eq!(settled(&s, 1), [350_000, 400_000, 0, 50_000, 0, 0]);
    assert_eq!(part(&s, 2)["lease"], "released");
    assert_eq!(env.remaining("tpm", "alice").await, 10_000 - 900);
    assert_eq!(env.remaining("usd", "alice").await, 1_000_000 - 400_000);
    let free = env.post("/api/semaphores/flight/alice/acquire", json!({"holder": "req-7"})).await;
    assert_eq!(free.json["in_use"], 1, "the reservation's lease was released: {}", free.json);
}

#[tokio::test]
async fn settling_twice_answers_the_first_settlement_and_applies_nothing_again() {
    let mut env = env().await;
    let id = env
        .reserve("bob", json!({"parts": [{"policy": "usd", "units": 1000}, {"policy": "flight", "holder": "h"}]}))
        .await;
    let settle = |units: i64| json!({"actual": [{"policy": "usd", "units": units}]});
    let first = env.post(&format!("/api/reservations/bob/{id}/settle"), settle(400)).await;
    assert_eq!(settled(&first, 0), [1000, 400, 600, 0, 0, 0]);
    let before = env.snapshot();
    for (act, body) in
        [("settle", settle(900_000)), ("settle", settle(400)), ("extend", json!({})), ("release", json!({}))]
    {
        let again = env.post(&format!("/api/reservations/bob/{id}/{act}"), body).await;
        assert_eq!((again.status, &again.json["already_settled"]), (200, &json!(true)), "{act}: {}", again.json);
        assert_eq!((&again.json["state"], settled(&again, 0)), (&json!("settled"), [1000, 400, 600, 0, 0, 0]), "{act}");
        assert_eq!(diff(&before, &env.snapshot()), Vec::<String>::new(), "a {act} of a settled reservation wrote");
    }
    assert_eq!(env.remaining("usd", "bob").await, 1_000_000 - 400);
}

#[tokio::test]
async fn denied_reservations_and_peeks_leave_redis_byte_equal() {
    let mut env = env().await;
    // tpm full for carol (5,000 twice: the public max_cost), a lease of flight held by h0.
    for _ in 0..2 {
        env.reserve("carol", json!({"parts": [{"policy": "tpm", "units": 5000}]})).await;
    }
    env.post("/api/semaphores/flight/carol/acquire", json!({"holder": "h0"})).await;
    env.reserve("acme%2Fcarol", json!({"parts": [{"policy": "usd", "units": 1_000_000, "level": "tenant"}]})).await;
    let before = env.snapshot();
    let cases = [
        ("carol", json!({"parts": [{"policy": "usd", "units": 5}, {"policy": "tpm", "units": 1}]}), "tpm", false),
        ("carol", json!({"parts": [{"policy": "tpm", "units": 1}], "mode": "capped"}), "tpm", false),
        ("carol", json!({"parts": [{"policy": "flight", "holder": "h0"}]}), "flight", false),
        ("carol", json!({"parts": [{"policy": "usd", "units": 5}], "peek": true}), "", true),
        ("carol", json!({"parts": [{"policy": "tpm", "units": 5}], "peek": true}), "tpm", false),
        ("acme/carol", json!({"parts": [{"policy": "usd", "units": 1, "level": "tenant"}]}), "usd", false),
        (
            "acme/dave",
            json!({"parts": [{"policy": "usd", "units": 1}, {"policy": "usd", "units": 1, "level": "tenant"}]}),
            "usd",
            false,
        ),
    ];
    for (subject, body, denied_by, allowed) in cases {
        let a = env.post(&format!("/api/reservations/{subject}"), body.clone()).await;
        assert_eq!(a.status, 200, "{body}: {}", a.json);
        assert_eq!(a.json["allowed"], allowed, "{body}: {}", a.json);
        assert_eq!(a.json["reservation"], Value::Null, "{body}: no id for what holds nothing");
        if !allowed {
            assert_eq!(a.json["denied_by"], denied_by, "{body}: {}", a.json);
            if denied_by != "flight" {
                assert!(a.headers.contains_key("retry-after"), "{body}: {:?}", a.headers);
            }
        }
        assert_eq!(diff(&before, &env.snapshot()), Vec::<String>::new(), "{body} wrote");
    }
    let held = env.post("/api/reservations/carol", json!({"parts": [{"policy": "flight", "holder": "h0"}]})).await;
    assert_eq!(part(&held, 0)["result"], "held", "{}", held.json);
    // And a denied decision through a tenant route, for the same reason.
    let d = env.post("/api/decisions/acme/carol", json!({"parts": [{"policy": "usd", "level": "tenant"}]})).await;
    assert_eq!((d.status, &d.json["allowed"]), (200, &json!(false)), "{}", d.json);
    assert_eq!(env.snapshot(), before);
}

#[tokio::test]
async fn another_subjects_reservation_id_is_refused() {
    let mut env = env().await;
    let id = env.reserve("erin", json!({"parts": [{"policy": "usd", "units": 100}]})).await;
    let tenant_id =
        env.reserve("acme/erin", json!({"parts": [{"policy": "usd", "units": 100, "level": "tenant"}]})).await;
    let before = env.snapshot();
    let body = json!({"actual": [{"policy": "usd", "units": 0}]}).to_string();
    for (path, why) in [
        (format!("/api/reservations/frank/{id}/settle"), "another subject"),
        (format!("/api/reservations/acme/erin/{id}/settle"), "erin of acme is not erin"),
        (format!("/api/reservations/erin/{tenant_id}/settle"), "erin is not erin of acme"),
        (format!("/api/reservations/acme/frank/{tenant_id}/settle"), "another user of the tenant"),
        (format!("/api/reservations/other/erin/{tenant_id}/settle"), "another tenant"),
        (format!("/api/reservations/frank/{id}/extend"), "an extend"),
        (format!("/api/reservations/frank/{id}/release"), "a release"),
    ] {
        let b = if path.ends_with("settle") { body.as_str() } else { "" };
        let a = env.send("POST", &path, b, &[]).await;
        assert_eq!((a.status, a.field()), (404, "id"), "{why}: {}", a.json);
        assert_eq!(diff(&before, &env.snapshot()), Vec::<String>::new(), "{why} wrote");
    }
    // Its own subject, in either spelling, settles it.
    let a = env.send("POST", &format!("/api/reservations/acme%2Ferin/{tenant_id}/release"), "", &[]).await;
    assert_eq!((a.status, &a.json["state"], settled(&a, 0)[2]), (200, &json!("released"), 100), "{}", a.json);
    let a = env.send("POST", &format!("/api/reservations/erin/{id}/settle"), &body, &[]).await;
    assert_eq!((a.status, &a.json["state"]), (200, &json!("settled")), "{}", a.json);
}

#[tokio::test]
async fn a_forged_id_is_refused_before_anything_is_sent() {
    let mut env = env().await;
    let body = json!({"parts": [{"policy": "usd", "units": 100}, {"policy": "burst", "units": 5}, {"policy": "flight", "holder": "g"}]});
    let id = env.reserve("gail", body.clone()).await;
    let bytes = B64.decode(&id).unwrap();
    assert_eq!(bytes.len(), 1 + 16 + 3 * 5 + 10, "version, nonce, three parts, MAC");
    let before = env.snapshot();
    let settle = |id: &str| format!("/api/reservations/gail/{id}/settle");
    let actual = json!({"actual": [{"policy": "usd", "units": 0}, {"policy": "burst", "units": 0}]}).to_string();
    let mut forged: Vec<(String, String)> = Vec::new();
    // Every bit of it flipped, one at a time.
    for i in 0..bytes.len() {
        for bit in 0..8 {
            let mut b = bytes.clone();
            b[i] ^= 1 << bit;
            forged.push((B64.encode(&b), format!("byte {i} bit {bit}")));
        }
    }
    // A part dropped or added, the MAC left as it was; cut short; made longer.
    let (sealed, mac) = bytes.split_at(bytes.len() - 10);
    forged.push((B64.encode([&sealed[..sealed.len() - 5], mac].concat()), "a part dropped".into()));
    forged.push((B64.encode([sealed, &sealed[17..22], mac].concat()), "a part added".into()));
    forged.push((B64.encode(&bytes[..bytes.len() - 1]), "cut short".into()));
    forged.push((B64.encode([&bytes[..], &[0]].concat()), "made longer".into()));
    for junk in ["x", "AAAA", "not-a-ticket", &"A".repeat(200), &format!("{id}="), &id[..id.len() - 1]] {
        forged.push((junk.to_string(), format!("junk {junk:.20}")));
    }
    for (f, why) in &forged {
        let a = env.send("POST", &settle(f), &actual, &[]).await;
        assert!(
            a.status == 404 && a.field() == "id" || (a.status == 400 && a.field() == "path"),
            "{why}: {} {}",
            a.status,
            a.json
        );
    }
    assert_eq!(diff(&before, &env.snapshot()), Vec::<String>::new(), "a forged id wrote");
    // An id sealed by another server (another id secret) is not this server's.
    let other = env_with(Some("another-server-s-id-secret-0123456789")).await;
    let theirs = other.reserve("gail", body).await;
    let a = env.send("POST", &settle(&theirs), &actual, &[]).await;
    assert_eq!((a.status, a.field()), (404, "id"), "{}", a.json);
    println!("{} forged ids refused", forged.len() + 1);
}

#[tokio::test]
async fn actuals_out_of_range_are_refused_naming_the_field() {
    let mut env = env().await;
    let id =
        env.reserve("hal", json!({"parts": [{"policy": "usd", "units": 100}, {"policy": "burst", "units": 5}]})).await;
    let before = env.snapshot();
    for bad in [
        json!(-1),
        json!(1_000_000_001),
        json!(1.5),
        json!("12a"),
        json!(true),
        json!(null),
        json!(9_223_372_036_854_775_808u64),
        json!("-0"),
    ] {
        for (act, list) in [("settle", "actual"), ("extend", "used")] {
            let body = json!({list: [{"policy": "usd", "units": 5}, {"policy": "burst", "units": bad}]});
            let a = env.post(&format!("/api/reservations/hal/{id}/{act}"), body).await;
            assert_eq!((a.status, a.field()), (400, format!("{list}[1].units").as_str()), "{act} {bad}: {}", a.json);
        }
    }
    for bad in [json!(0), json!(-5), json!(10_000_000_001i64), json!("soon")] {
        let a = env.post(&format!("/api/reservations/hal/{id}/extend"), json!({"lease_ms": bad})).await;
        assert_eq!((a.status, a.field()), (400, "lease_ms"), "{bad}: {}", a.json);
    }
    assert_eq!(diff(&before, &env.snapshot()), Vec::<String>::new(), "a refused settle wrote");
}

#[tokio::test]
async fn a_settle_naming_other_parts_is_refused() {
    let mut env = env().await;
    let id = env.reserve("acme/ivy", json!({"parts": [{"policy": "usd", "units": 100}, {"policy": "usd", "units": 100, "level": "tenant"}, {"policy": "flight", "holder": "i"}]})).await;
    let path = format!("/api/reservations/acme/ivy/{id}/settle");
    let before = env.snapshot();
    let u = |policy: &str, units: i64| json!({"policy": policy, "units": units});
    for (actual, field) in [
        (json!([u("tpm", 5)]), "actual[0].policy"),
        (json!([u("usd", 5), u("usd", 6)]), "actual[1].policy"),
        (json!([{"policy": "usd", "units": 5, "level": "user"}]), "actual"),
        (
            json!([{"policy": "usd", "units": 5, "level": "user"}, {"policy": "usd", "units": 5, "level": "user"}]),
            "actual[1].policy",
        ),
        (json!([u("usd", 5), u("flight", 1)]), "actual[1].policy"),
        (json!([{"policy": "usd", "units": 5, "level": "org"}]), "actual[0].level"),
        (json!([{"policy": "usd", "units": 5, "cost": 1}]), "actual[0].cost"),
        (Value::Array(vec![u("usd", 1); 9]), "actual"),
        (json!({"usd": 5}), "actual"),
        (json!(["usd"]), "actual[0].item"),
        (json!(null), "actual"),
    ] {
        let a = env.post(&path, json!({"actual": actual})).await;
        assert_eq!((a.status, a.field()), (400, field), "{actual}: {}", a.json);
    }
    let a = env.send("POST", &path, "", &[]).await;
    assert_eq!((a.status, a.field()), (400, "actual"), "{}", a.json);
    assert_eq!(diff(&before, &env.snapshot()), Vec::<String>::new(), "a refused settle wrote");
    // One item without a level settles the policy at both levels; with one, only there.
    let a = env.post(&path, json!({"actual": [u("usd", 30)]})).await;
    assert_eq!((settled(&a, 0), settled(&a, 1)), ([100, 30, 70, 0, 0, 0], [100, 30, 70, 0, 0, 0]), "{}", a.json);
}

#[tokio::test]
async fn reserve_input_is_refused_naming_the_part_and_field() {
    let mut env = env().await;
    let before = env.snapshot();
    let q = |policy: &str, units: i64| json!({"policy": policy, "units": units});
    let cases = [
        (json!({"parts": [q("usd", 1), q("burst", 0)]}), 400, "parts[1].units"),
        (json!({"parts": [q("tpm", 5001)]}), 403, "parts[0].units"),
        (json!({"parts": [q("tpm", 10_001)]}), 400, "parts[0].units"),
        (json!({"parts": [{"policy": "usd", "units": 1, "level": "tenant"}]}), 400, "parts[0].level"),
        (json!({"parts": [{"policy": "usd", "units": 1, "level": "org"}]}), 400, "parts[0].level"),
        (json!({"parts": [{"policy": "usd", "units": 5, "min_units": 2}]}), 400, "parts[0].min_units"),
        (
            json!({"parts": [{"policy": "usd", "units": 5, "min_units": 6}], "mode": "capped"}),
            400,
            "parts[0].min_units",
        ),
        (json!({"parts": [q("usd", 1), q("usd", 2)]}), 400, "parts[1].policy"),
        (json!({"parts": [q("hits", 1)]}), 400, "parts[0].policy"),
        (json!({"parts": [q("nope", 1)]}), 404, "parts[0].policy"),
        (json!({"parts": [{"policy": "usd", "cost": 1}]}), 400, "parts[0].cost"),
        (json!({"parts": [{"policy": "flight", "holder": "a b"}]}), 400, "parts[0].holder"),
        (json!({"parts": [{"policy": "flight", "holder": "h", "units": 1}]}), 400, "parts[0].units"),
        (json!({"parts": [{"policy": "flight", "holder": "h"}], "lease_ms": 60_001}), 403, "lease_ms"),
        (json!({"parts": [q("usd", 1)], "lease_ms": 0}), 400, "lease_ms"),
        (json!({"parts": [q("usd", 1)], "mode": "some"}), 400, "mode"),
        (json!({"parts": [q("usd", 1)], "peek": 1}), 400, "peek"),
        (json!({"parts": vec![q("usd", 1); 9]}), 400, "parts"),
        (json!({"parts": []}), 400, "parts"),
        (json!({"parts": [q("usd", 1)], "id": "mine"}), 400, "id"),
    ];
    for (body, status, field) in cases {
        let a = env.post("/api/reservations/acme", body.clone()).await;
        assert_eq!((a.status, a.field()), (status, field), "{body}: {}", a.json);
    }
    let bad_key = env
        .send(
            "POST",
            "/api/reservations/acme",
            &json!({"parts": [q("usd", 1)]}).to_string(),
            &[("idempotency-key", "")],
        )
        .await;
    assert_eq!((bad_key.status, bad_key.field()), (400, "Idempotency-Key"));
    // One segment `TENANT%2FUSER` is that tenant's user: here user `b/c`, refused by its name.
    let bad_subject = env.post("/api/reservations/a%2Fb%2Fc", json!({"parts": [q("usd", 1)]})).await;
    assert_eq!((bad_subject.status, bad_subject.field()), (400, "user"), "{}", bad_subject.json);
    let bad_subject = env.post("/api/reservations/a%2Cb", json!({"parts": [q("usd", 1)]})).await;
    assert_eq!((bad_subject.status, bad_subject.field()), (400, "subject"), "{}", bad_subject.json);
    assert_eq!(diff(&before, &env.snapshot()), Vec::<String>::new(), "refused input wrote");
    // The admin may reserve beyond the public limits.
    let a = env
        .send(
            "POST",
            "/api/reservations/acme",
            &json!({"parts": [q("tpm", 5001)]}).to_string(),
            &[("authorization", &format!("Bearer {ADMIN}"))],
        )
        .await;
    assert_eq!((a.status, &a.json["allowed"]), (200, &json!(true)), "{}", a.json);
}

#[tokio::test]
async fn a_quota_never_stands_past_its_limit_and_max_debt() {
    let mut env = env().await;
    let key = "rc:{u:jo}:q:usd:fw";
    let used = |c: &mut redis::Connection| redis::cmd("GET").arg(key).query::<Option<i64>>(c).unwrap().unwrap_or(0);
    let (mut uncharged, mut denied) = (0, 0);
    for round in 0..40 {
        let before = used(&mut env.c);
        let a = env.post("/api/reservations/jo", json!({"parts": [{"policy": "usd", "units": 100_000}]})).await;
        if a.json["allowed"] == false {
            // Only when the units do not fit (a quota in debt refuses every call), and nothing
            // was written.
            assert!(before + 100_000 > 1_000_000, "round {round}: refused at {before}: {}", a.json);
            assert_eq!(used(&mut env.c), before);
            denied += 1;
            continue;
        }
        let id = a.json["reservation"].as_str().unwrap();
        let actual = [0, 100_000, 250_000, 1_000_000_000][round % 4];
        // Past the public limit (max_cost 10^6): the admin's settle.
        let body = json!({"actual": [{"policy": "usd", "units": actual}]}).to_string();
        let admin = format!("Bearer {ADMIN}");
        let s =
            env.send("POST", &format!("/api/reservations/jo/{id}/settle"), &body, &[("authorization", &admin)]).await;
        let [reserved, got, refunded, charged, unch, debt] = settled(&s, 0);
        assert_eq!((reserved, got), (100_000, actual), "{}", s.json);
        assert_eq!((refunded, charged + unch), ((100_000 - actual).max(0), (actual - 100_000).max(0)), "{}", s.json);
        assert!(debt <= 50_000, "{}", s.json);
        uncharged += unch;
        let now = used(&mut env.c);
        assert!(now <= 1_050_000, "round {round}: {now} units stand");
        assert_eq!(now, before + 100_000 - refunded + charged, "round {round}: {}", s.json);
    }
    assert_eq!(used(&mut env.c), 1_050_000, "at the limit plus max_debt");
    assert!(uncharged > 0 && denied > 0, "{uncharged} uncharged, {denied} denied");
    // A take is refused too while the quota stands in debt.
    let t = env.post("/api/quotas/usd/jo", json!({"cost": 1})).await;
    assert_eq!(t.json["allowed"], false, "{}", t.json);
}

#[tokio::test]
async fn extend_charges_what_was_used_and_release_gives_back_the_rest() {
    let env = env().await;
    let body =
        json!({"parts": [{"policy": "burst", "units": 10}, {"policy": "flight", "holder": "k"}], "lease_ms": 30_000});
    let id = env.reserve("kim", body.clone()).await;
    let e = env
        .post(
            &format!("/api/reservations/kim/{id}/extend"),
            json!({"lease_ms": 50_000, "used": [{"policy": "burst", "units": 4}]}),
        )
        .await;
    assert_eq!(
        (e.status, &e.json["state"], &part(&e, 1)["lease"]),
        (200, &json!("open"), &json!("renewed")),
        "{}",
        e.json
    );
    assert!((now_ms() + 40_000..=now_ms() + 51_000).contains(&e.json["expires_ms"].as_i64().unwrap()));
    assert_eq!(settled(&e, 0), [10, 4, 0, 0, 0, 0]);
    let r = env.send("POST", &format!("/api/reservations/kim/{id}/release"), "", &[]).await;
    assert_eq!(
        (&r.json["state"], settled(&r, 0), &part(&r, 1)["lease"]),
        (&json!("released"), [10, 4, 6, 0, 0, 0], &json!("released")),
        "{}",
        r.json
    );
    assert_eq!(env.remaining("burst", "kim").await, 96);
    // Used past the reservation while streaming: the overrun charged at the extend, within
    // max_debt (burst: 20).
    // Past the public limit (max_cost 100): the admin's extend.
    let id = env.reserve("kim", body).await;
    let used = json!({"used": [{"policy": "burst", "units": 130}]}).to_string();
    let admin = format!("Bearer {ADMIN}");
    let e = env.send("POST", &format!("/api/reservations/kim/{id}/extend"), &used, &[("authorization", &admin)]).await;
    // 14 stood (4 used before, 10 held): 106 more reach the capacity plus the debt of 20.
    assert_eq!(settled(&e, 0), [10, 130, 0, 106, 14, 20], "{}", e.json);
    let r = env.send("POST", &format!("/api/reservations/kim/{id}/release"), "", &[]).await;
    assert_eq!(settled(&r, 0)[..3], [10, 130, 0], "{}", r.json);
}

#[tokio::test]
async fn a_settle_after_the_lease_ended_says_it_expired() {
    let env = env().await;
    let id = env.reserve("lee", json!({"parts": [{"policy": "tpm", "units": 1000}], "lease_ms": 200})).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let s = env
        .post(&format!("/api/reservations/lee/{id}/settle"), json!({"actual": [{"policy": "tpm", "units": 10}]}))
        .await;
    assert_eq!((&s.json["state"], &s.json["already_settled"]), (&json!("expired"), &json!(false)), "{}", s.json);
    // tpm gives back on expiry: the reservation's units, not the settle's actual.
    assert_eq!(settled(&s, 0)[..3], [1000, 0, 1000], "{}", s.json);
    let again = env
        .post(&format!("/api/reservations/lee/{id}/settle"), json!({"actual": [{"policy": "tpm", "units": 10}]}))
        .await;
    assert_eq!((&again.json["state"], &again.json["already_settled"]), (&json!("expired"), &json!(true)));
    assert_eq!(env.remaining("tpm", "lee").await, 10_000);
}

#[tokio::test]
async fn a_reserve_replayed_under_its_key_names_the_same_reservation_once() {
    let env = env().await;
    let body = json!({"parts": [{"policy": "usd", "units": 700}]}).to_string();
    let key = [("idempotency-key", "req-1")];
    let first = env.send("POST", "/api/reservations/max", &body, &key).await;
    let again = env.send("POST", "/api/reservations/max", &body, &key).await;
    assert_eq!(first.json["reservation"], again.json["reservation"], "{} / {}", first.json, again.json);
    assert!(first.json["reservation"].is_string());
    assert_eq!(again.headers["idempotent-replayed"], "true");
    assert_eq!(env.remaining("usd", "max").await, 1_000_000 - 700, "taken once");
    let other = env
        .send("POST", "/api/reservations/max", &json!({"parts": [{"policy": "usd", "units": 1}]}).to_string(), &key)
        .await;
    assert_eq!((other.status, other.field()), (422, "Idempotency-Key"), "{}", other.json);
    // The same key on another subject's route is another reservation.
    let elsewhere = env.send("POST", "/api/reservations/ned", &body, &key).await;
    assert_ne!(elsewhere.json["reservation"], first.json["reservation"]);
    // A replayed reserve tells the reservation as it is now.
    let id = first.json["reservation"].as_str().unwrap();
    env.post(&format!("/api/reservations/max/{id}/settle"), json!({"actual": [{"policy": "usd", "units": 1}]})).await;
    let later = env.send("POST", "/api/reservations/max", &body, &key).await;
    assert_eq!(
        (&later.json["reservation"], &later.json["state"]),
        (&first.json["reservation"], &json!("settled")),
        "{}",
        later.json
    );
}

#[tokio::test]
async fn tenant_subjects_are_two_segments_on_quotas_and_decisions() {
    let mut env = env().await;
    let a = env.post("/api/quotas/usd/acme/olga", json!({"cost": 5})).await;
    assert_eq!((a.status, &a.json["remaining"]), (200, &json!(999_995)), "{}", a.json);
    let p = env.send("GET", "/api/quotas/usd/acme/olga", "", &[]).await;
    assert_eq!(p.json["remaining"], 999_995);
    let d = env
        .post(
            "/api/decisions/acme/olga",
            json!({"parts": [{"policy": "usd", "cost": 7, "level": "tenant"}, {"policy": "usd", "cost": 1}]}),
        )
        .await;
    assert_eq!((d.status, &d.json["allowed"]), (200, &json!(true)), "{}", d.json);
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut env.c).unwrap();
    let mut keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["rc:{t:acme}:q:usd:fw", "rc:{t:acme}:u:olga:q:usd:fw"]);
    let tenant: i64 = redis::cmd("GET").arg("rc:{t:acme}:q:usd:fw").query(&mut env.c).unwrap();
    let user: i64 = redis::cmd("GET").arg("rc:{t:acme}:u:olga:q:usd:fw").query(&mut env.c).unwrap();
    assert_eq!((tenant, user), (7, 6));
    let reset =
        env.send("DELETE", "/api/quotas/usd/acme/olga", "", &[("authorization", &format!("Bearer {ADMIN}"))]).await;
    assert_eq!((reset.status, &reset.json["reset"]), (200, &json!(true)));
    // A level of a plain subject, and a subject of three segments, are refused.
    let d = env.post("/api/decisions/olga", json!({"parts": [{"policy": "usd", "level": "tenant"}]})).await;
    assert_eq!((d.status, d.field()), (400, "parts[0].level"), "{}", d.json);
    let a = env.post("/api/quotas/usd/acme%2Fx/olga", json!({"cost": 1})).await;
    assert_eq!((a.status, a.field()), (400, "tenant"), "{}", a.json);
}

/// A public reservation with no lease part may not hold its record past
/// [`redcount_api::MAX_PUBLIC_LEASE_MS`]: every route whose body takes `lease_ms` (from the
/// OpenAPI document: reserve and extend, by subject and by tenant and user), with each quota
/// policy configured (one per algorithm), refuses a longer one 403 naming `lease_ms` with
/// Redis unchanged, grants the bound itself, and grants an admin past it.
#[tokio::test]
async fn a_public_lease_is_bounded_on_every_route_that_takes_one() {
    let mut env = env().await;
    let most = redcount_api::MAX_PUBLIC_LEASE_MS;
    let doc: Value = serde_json::from_str(redcount_api::openapi::document()).unwrap();
    let routes: Vec<&str> = redcount_api::ROUTES
        .iter()
        .map(|r| r.path)
        .filter(|p| {
            let schema = &doc["paths"][*p]["post"]["requestBody"]["content"]["application/json"]["schema"];
            schema["properties"]["lease_ms"].is_object()
        })
        .collect();
    assert_eq!(routes.len(), 4, "reserve and extend, by subject and by tenant/user: {routes:?}");
    let config: Value = serde_json::from_str(&policies()).unwrap();
    let quotas: Vec<&str> = config
        .as_object()
        .unwrap()
        .iter()
        .filter(|(_, p)| p["kind"] == "quota")
        .map(|(name, _)| name.as_str())
        .collect();
    let algorithms: std::collections::BTreeSet<&str> =
        quotas.iter().map(|q| config[*q]["algorithm"].as_str().unwrap()).collect();
    assert_eq!(algorithms.len(), 4, "one policy per algorithm at least: {algorithms:?}");
    let admin = format!("Bearer {ADMIN}");
    for route in &routes {
        for (n, policy) in quotas.iter().enumerate() {
            let subject = if route.contains("{tenant}") { format!("acme/u{n}") } else { format!("lp{n}") };
            let parts = json!([{"policy": policy, "units": 1}]);
            let id = env.reserve(&subject, json!({"parts": parts})).await;
            let path = route.replace("{subject}", &subject).replace("{tenant}/{user}", &subject).replace("{id}", &id);
            let body = |ms: i64| match route.ends_with("/extend") {
                true => json!({"lease_ms": ms}),
                false => json!({"parts": parts, "lease_ms": ms}),
            };
            let before = env.snapshot();
            for past in [most + 1, 10_000_000_000] {
                let a = env.post(&path, body(past)).await;
                assert_eq!((a.status, a.field()), (403, "lease_ms"), "{route} {policy} {past}: {}", a.json);
            }
            assert_eq!(diff(&before, &env.snapshot()), Vec::<String>::new(), "{route} {policy}: a refused call wrote");
            let a = env.post(&path, body(most)).await;
            assert_eq!(a.status, 200, "{route} {policy}: {}", a.json);
            let a = env.send("POST", &path, &body(most + 1).to_string(), &[("authorization", &admin)]).await;
            assert_eq!(a.status, 200, "{route} {policy}, admin: {}", a.json);
        }
    }
}

/// A public settle or extend charges at most a policy's public limit (`max_cost`) per part, as
/// a public take or reserve does: every route whose body reports units (`actual`, `used`; from
/// the OpenAPI document), every quota policy (one per algorithm), at the user and the tenant
/// level, refuses more with 403 naming the item's `units` and Redis unchanged, grants the limit
/// itself, and grants an admin past it. (A tokenless reserve of 1 settled at 10^9 charged the
/// tenant's whole limit and debt before.)
#[tokio::test]
async fn a_public_settle_or_extend_is_bounded_by_the_public_limit() {
    let mut env = env().await;
    let doc: Value = serde_json::from_str(redcount_api::openapi::document()).unwrap();
    let routes: Vec<(&str, &str)> = redcount_api::ROUTES
        .iter()
        .map(|r| r.path)
        .filter_map(|p| {
            let schema = &doc["paths"][p]["post"]["requestBody"]["content"]["application/json"]["schema"];
            ["actual", "used"].into_iter().find(|l| schema["properties"][*l].is_object()).map(|l| (p, l))
        })
        .collect();
    assert_eq!(routes.len(), 4, "settle and extend, by subject and by tenant/user: {routes:?}");
    let config: Value = serde_json::from_str(&policies()).unwrap();
    let quotas: Vec<(&str, i64)> = config
        .as_object()
        .unwrap()
        .iter()
        .filter(|(_, p)| p["kind"] == "quota")
        .map(|(name, p)| (name.as_str(), p["max_cost"].as_i64().unwrap()))
        .collect();
    let algorithms: std::collections::BTreeSet<&str> =
        quotas.iter().map(|(q, _)| config[*q]["algorithm"].as_str().unwrap()).collect();
    assert_eq!(algorithms.len(), 4, "one policy per algorithm at least: {algorithms:?}");
    let admin = format!("Bearer {ADMIN}");
    for (r, (route, list)) in routes.iter().enumerate() {
        for (n, (policy, most)) in quotas.iter().enumerate() {
            let tenant = route.contains("{tenant}");
            let levels: &[Option<&str>] = if tenant { &[Some("user"), Some("tenant")] } else { &[None] };
            for (l, level) in levels.iter().enumerate() {
                // A tenant of its own (a tenant part's units are the tenant's, whatever the user).
                let subject = if tenant { format!("t{r}-{n}-{l}/u") } else { format!("p{r}-{n}") };
                let mut item = json!({"policy": policy, "units": 1});
                if let Some(level) = level {
                    item["level"] = json!(level);
                }
                let path = |id: &str, subject: &str| {
                    route.replace("{subject}", subject).replace("{tenant}/{user}", subject).replace("{id}", id)
                };
                let body = |units: i64| {
                    let mut i = item.clone();
                    i["units"] = json!(units);
                    json!({*list: [i]})
                };
                let id = env.reserve(&subject, json!({"parts": [item.clone()]})).await;
                let before = env.snapshot();
                for past in [most + 1, 1_000_000_000] {
                    let a = env.post(&path(&id, &subject), body(past)).await;
                    let field = format!("{list}[0].units");
                    assert_eq!(
                        (a.status, a.field()),
                        (403, field.as_str()),
                        "{route} {policy} {level:?} {past}: {}",
                        a.json
                    );
                }
                assert_eq!(
                    diff(&before, &env.snapshot()),
                    Vec::<String>::new(),
                    "{route} {policy}: a refused call wrote"
                );
                let a = env.post(&path(&id, &subject), body(*most)).await;
                assert_eq!(a.status, 200, "{route} {policy} {level:?}: {}", a.json);
                // An admin may report more (another reservation: the one above may be settled).
                let subject = if tenant { format!("t{r}-{n}-{l}a/u") } else { format!("p{r}-{n}a") };
                let id = env.reserve(&subject, json!({"parts": [item.clone()]})).await;
                let a = env
                    .send("POST", &path(&id, &subject), &body(most + 1).to_string(), &[("authorization", &admin)])
                    .await;
                assert_eq!(a.status, 200, "{route} {policy} {level:?}, admin: {}", a.json);
            }
        }
    }
}

/// A reservation made before a redeploy changed one of its policies (its algorithm, here):
/// the settle, extend or release is refused 409 naming `id`, with redcount's own words (not
/// the script's SHA and line Redis adds to an error a script raises), Redis unchanged. (Before:
/// the raw text "… the reservation script: <sha>, on @user_script:<line>." and no field.)
#[tokio::test]
async fn a_reservation_whose_policy_changed_since_is_a_clear_409() {
    let mut env = env().await;
    let id = env.reserve("chg", json!({"parts": [{"policy": "tpm", "units": 10}]})).await;
    // The same Redis and id secret, `tpm` now a token bucket.
    let mut changed: Value = serde_json::from_str(&policies()).unwrap();
    changed["tpm"] = json!({"kind": "quota", "algorithm": "bucket", "capacity": 10_000, "refill": 1,
                            "interval_ms": 60_000, "max_cost": 5_000});
    let config = redcount_api::Config::from_env(|name| match name {
        "REDCOUNT_POLICIES" => Some(changed.to_string()),
        "REDCOUNT_ADMIN_TOKEN" => Some(ADMIN.to_string()),
        _ => None,
    })
    .unwrap();
    let direct = redcount::Direct::connect(&env._server.url).await.unwrap();
    let redeployed = app(config, Backend::Direct(direct), std::env::temp_dir(), Duration::from_secs(5));
    let before = env.snapshot();
    for (act, body) in
        [("settle", json!({"actual": [{"policy": "tpm", "units": 5}]})), ("extend", json!({})), ("release", json!({}))]
    {
        let request = Request::post(format!("/api/reservations/chg/{id}/{act}")).body(Body::from(body.to_string()));
        let response = redeployed.clone().oneshot(request.unwrap()).await.unwrap();
        let status = response.status().as_u16();
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
        let json: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!((status, json["field"].as_str()), (409, Some("id")), "{act}: {json}");
        let error = json["error"].as_str().unwrap();
        assert!(!error.contains("script") && !error.contains('@'), "{act}: Redis's decoration: {error}");
    }
    assert_eq!(diff(&before, &env.snapshot()), Vec::<String>::new(), "a refused call wrote");
}

/// A GCRA reservation open while a redeploy changes the quota's rate (each unit's emission
/// interval ten times longer): its release gives nothing back, as the units it took were
/// spans of the old interval, and moving the arrival time back by units of the new one let
/// the quota admit past its limit (an outside re-check: 1,080 takes of a burst of 1,000). With
/// the rate unchanged it gives back as before.
#[tokio::test]
async fn a_gcra_reservation_across_a_change_of_rate_gives_nothing_back() {
    let mut env = env().await;
    let slower = |rate: i64| {
        let mut p: Value = serde_json::from_str(&policies()).unwrap();
        p["gtok"]["rate"] = json!(rate);
        redcount_api::Config::from_env(|name| match name {
            "REDCOUNT_POLICIES" => Some(p.to_string()),
            "REDCOUNT_ADMIN_TOKEN" => Some(ADMIN.to_string()),
            _ => None,
        })
        .unwrap()
    };
    let release = |app: &axum::Router, subject: &str, id: &str| {
        let request = Request::post(format!("/api/reservations/{subject}/{id}/release")).body(Body::empty()).unwrap();
        let app = app.clone();
        async move {
            let response = app.oneshot(request).await.unwrap();
            let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
            serde_json::from_slice::<Value>(&bytes).unwrap()
        }
    };
    let remaining = |app: &axum::Router, subject: &str| {
        let request = Request::get(format!("/api/quotas/gtok/{subject}")).body(Body::empty()).unwrap();
        let app = app.clone();
        async move {
            let response = app.oneshot(request).await.unwrap();
            let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
            serde_json::from_slice::<Value>(&bytes).unwrap()["remaining"].as_i64().unwrap()
        }
    };
    let direct = redcount::Direct::connect(&env._server.url).await.unwrap();
    let redeployed = app(slower(10), Backend::Direct(direct.clone()), std::env::temp_dir(), Duration::from_secs(5));
    let same = app(slower(100), Backend::Direct(direct), std::env::temp_dir(), Duration::from_secs(5));

    let id = env.reserve("gr", json!({"parts": [{"policy": "gtok", "units": 100}]})).await;
    let before = remaining(&redeployed, "gr").await;
    let snapshot = env.snapshot();
    let r = release(&redeployed, "gr", &id).await;
    assert_eq!((&r["state"], &part_of(&r)["refunded"]), (&json!("released"), &json!(0)), "{r}");
    assert_eq!(remaining(&redeployed, "gr").await, before, "the arrival time stayed: {r}");
    assert!(
        !diff(&snapshot, &env.snapshot()).iter().any(|k| k.contains(":q:gtok:")),
        "the quota's state was not moved"
    );

    // The rate as it was (its own config, as a redeploy that changed nothing): given back.
    let id = env.reserve("gs", json!({"parts": [{"policy": "gtok", "units": 100}]})).await;
    let r = release(&same, "gs", &id).await;
    assert!(part_of(&r)["refunded"].as_i64().unwrap() >= 90, "{r}");
}

fn part_of(a: &Value) -> &Value {
    &a["parts"][0]
}
