//! The HTTP API without I/O: requests in, REST bodies and responses out.

use rand::SeedableRng;
use rand::rngs::StdRng;
use redcount_api::{self as api, ApiRequest, ApiResponse, Config, Policy, Step};
use redcount_core::script;
use serde_json::{Value, json};

const ADMIN: &str = "admin-token-0123456789";

fn config() -> Config {
    let vars = [
        ("REDCOUNT_REST_URL", "http://127.0.0.1:8079/"),
        ("REDCOUNT_REST_TOKEN", "rest-token"),
        ("REDCOUNT_ADMIN_TOKEN", ADMIN),
        ("REDCOUNT_CORS_ORIGINS", "https://app.example"),
        (
            "REDCOUNT_POLICIES",
            r#"{
              "daily-prize": {"kind": "quota", "algorithm": "fixed", "limit": 2, "window_ms": 86400000},
              "device-slots": {"kind": "semaphore", "limit": 60, "lease_ms": 300000},
              "running-jobs": {"kind": "counter", "min": 0, "storage": "hash"},
              "signup-bonus": {"kind": "claim", "window_ms": 86400000},
              "demo-packets": {"kind": "redpackets", "max_shares": 100, "max_total_cents": 10000},
              "inbox": {"kind": "inbox"}
            }"#,
        ),
    ];
    Config::from_env(|n| vars.iter().find(|(k, _)| *k == n).map(|(_, v)| v.to_string())).unwrap()
}

fn req<'a>(method: &'a str, path: &'a str, body: &'a str) -> ApiRequest<'a> {
    let (path, query) = path.split_once('?').unwrap_or((path, ""));
    ApiRequest { method, path, query, authorization: None, origin: None, idempotency_key: None, body: body.as_bytes() }
}

fn step(r: ApiRequest<'_>) -> Step {
    api::handle(&config(), &r, &mut StdRng::seed_from_u64(1))
}

fn respond(r: ApiRequest<'_>) -> ApiResponse {
    match step(r) {
        Step::Respond(resp) => resp,
        Step::Send(ex) | Step::Script(ex) => panic!("expected a response, got a REST call: {}", ex.body()),
    }
}

fn send_body(r: ApiRequest<'_>) -> Value {
    match step(r) {
        Step::Send(ex) => serde_json::from_str(ex.body()).unwrap(),
        Step::Respond(resp) => panic!("expected a REST call, got {} {}", resp.status, resp.body),
        Step::Script(ex) => panic!("a first call asks for no script: {}", ex.body()),
    }
}

fn json_of(r: &ApiResponse) -> Value {
    serde_json::from_str(&r.body).unwrap()
}

#[test]
fn routes_become_exactly_one_evalsha() {
    let b = send_body(req("POST", "/api/redpackets/abc/grab", r#"{"user":"alice"}"#));
    assert_eq!(
        b,
        json!([
            "EVALSHA",
            script::REDPACKET_GRAB.sha1(),
            "4",
            "rc:{rp:abc}:meta",
            "rc:{rp:abc}:shares",
            "rc:{rp:abc}:grabs",
            "rc:{rp:abc}:log",
            "alice"
        ])
    );
    let b = send_body(req("POST", "/api/quotas/daily-prize/u1", r#"{"cost":1}"#));
    assert_eq!(
        b,
        json!([
            "EVALSHA",
            script::QUOTA_FIXED.sha1(),
            "2",
            "rc:{u:u1}:q:daily-prize:fw",
            "rc:{u:u1}:q:daily-prize:ovr",
            "2",
            "86400000",
            "1",
            "0"
        ])
    );
    let b = send_body(req("GET", "/api/quotas/daily-prize/u1", ""));
    assert_eq!(b[8], "1", "GET peeks");
    let b = send_body(req("POST", "/api/counters/running-jobs/app-1", r#"{"delta":-1}"#));
    assert_eq!(
        b,
        json!(["EVALSHA", script::COUNTER.sha1(), "1", "rc:{c:running-jobs}", "app-1", "-1", "0", "", "clamp", "0"])
    );
    let b = send_body(req("POST", "/api/semaphores/device-slots/pool/acquire", r#"{"holder":"dev-1"}"#));
    assert_eq!(
        b.as_array().unwrap()[3..],
        json!([
            "rc:{u:pool}:s:device-slots",
            "rc:{u:pool}:s:device-slots:tok",
            "rc:{u:pool}:s:device-slots:ovr",
            "acquire",
            "dev-1",
            "60",
            "300000",
            "0"
        ])
        .as_array()
        .unwrap()[..]
    );
    assert_eq!(send_body(req("GET", "/api/health", "")), json!(["PING"]));
    let b = send_body(req("GET", "/api/redpackets/abc/claims?offset=10&limit=5", ""));
    assert_eq!(b, json!(["LRANGE", "rc:{rp:abc}:log", "10", "14"]));
}

#[test]
fn replies_become_responses_and_noscript_retries_once() {
    let Step::Send(ex) = step(req("POST", "/api/redpackets/abc/grab", r#"{"user":"alice"}"#)) else { panic!() };
    let noscript = br#"{"error":"NOSCRIPT No matching script. Please use EVAL."}"#;
    let Step::Script(ex) = ex.receive(400, noscript) else { panic!("NOSCRIPT asks for the script's text") };
    let script = ex.wanted_script().unwrap();
    assert_eq!(script.name(), "redpacket_grab");
    let Step::Send(ex) = ex.give_compiled_script() else { panic!("then EVAL") };
    assert!(ex.body().starts_with("[\"EVAL\",\""));
    // A second NOSCRIPT is not retried again.
    let Step::Respond(r) = ex.receive(400, noscript) else { panic!() };
    assert_eq!(r.status, 502);
    // A text given from elsewhere must be the script's own: anything else is a 500 that
    // names the script, and nothing is sent.
    for wrong in [&b""[..], b"return 1", &script.source().as_bytes()[1..]] {
        let Step::Send(ex) = step(req("POST", "/api/redpackets/abc/grab", r#"{"user":"alice"}"#)) else { panic!() };
        let Step::Script(ex) = ex.receive(400, noscript) else { panic!() };
        let Step::Respond(r) = ex.give_script(wrong) else { panic!("a wrong text is not sent") };
        assert_eq!(r.status, 500);
        assert!(r.body.contains(script.sha1()), "{}", r.body);
    }
    let Step::Send(ex) = step(req("POST", "/api/redpackets/abc/grab", r#"{"user":"alice"}"#)) else { panic!() };
    let Step::Script(ex) = ex.receive(400, noscript) else { panic!() };
    let Step::Send(ex) = ex.give_script(script.source().as_bytes()) else { panic!() };
    assert_eq!(serde_json::from_str::<Value>(ex.body()).unwrap()[1], json!(script.source()));

    let Step::Send(ex) = step(req("POST", "/api/redpackets/abc/grab", r#"{"user":"alice"}"#)) else { panic!() };
    // [1, 250, 3, 7] base64-free integers.
    let Step::Respond(r) = ex.receive(200, br#"{"result":[1,250,3,7]}"#) else { panic!() };
    assert_eq!(
        (r.status, json_of(&r)),
        (200, json!({"outcome": "won", "amount_cents": 250, "amount": 250, "index": 3, "remaining": 7}))
    );

    let Step::Send(ex) = step(req("POST", "/api/redpackets/abc/grab", r#"{"user":"alice"}"#)) else { panic!() };
    let Step::Respond(r) = ex.receive(200, br#"{"result":[-1,0,0,0]}"#) else { panic!() };
    assert_eq!(r.status, 404);

    let Step::Send(ex) = step(req("POST", "/api/quotas/daily-prize/u1", "")) else { panic!() };
    let Step::Respond(r) = ex.receive(200, br#"{"result":[0,2,0,5000,4200]}"#) else { panic!() };
    assert_eq!(json_of(&r)["allowed"], json!(false));
    assert!(r.headers.contains(&("Retry-After", "5".into())));

    for (status, body, want) in [
        (503, &br#"{"error":"ERR Redis is unreachable"}"#[..], 503),
        (504, br#"{"error":"ERR Redis did not answer"}"#, 503),
        (401, br#"{"error":"Unauthorized"}"#, 502),
        (400, br#"{"error":"WRONGTYPE Operation against a key"}"#, 502),
        (400, br#"{"error":"TRYAGAIN Multiple keys request during rehashing of slot"}"#, 503),
        (400, br#"{"error":"LOADING Redis is loading the dataset in memory"}"#, 503),
        (200, br#"{"result":"garbage"}"#, 502),
        (200, b"<html>", 502),
    ] {
        let Step::Send(ex) = step(req("POST", "/api/redpackets/abc/grab", r#"{"user":"a"}"#)) else { panic!() };
        let Step::Respond(r) = ex.receive(status, body) else { panic!() };
        assert_eq!(r.status, want, "{}", String::from_utf8_lossy(body));
        assert!(json_of(&r)["error"].is_string());
    }
    let Step::Send(ex) = step(req("GET", "/api/health", "")) else { panic!() };
    assert_eq!(ex.fail("connection refused").status, 503);
}

#[test]
fn bad_requests_never_reach_redis_and_name_the_field() {
    let cases: &[(&str, &str, &str, u16, Option<&str>)] = &[
        ("POST", "/api/redpackets/abc/grab", r#"{"user":"a:b"}"#, 400, Some("user")),
        ("POST", "/api/redpackets/abc/grab", r#"{"user":5}"#, 400, Some("user")),
        ("POST", "/api/redpackets/abc/grab", r#"{}"#, 400, Some("user")),
        ("POST", "/api/redpackets/abc/grab", r#"{"user":"a","extra":1}"#, 400, Some("extra")),
        ("POST", "/api/redpackets/abc/grab", r#"["user"]"#, 400, Some("body")),
        ("POST", "/api/redpackets/abc/grab", r#"{"user":"a\u0000"}"#, 400, Some("user")),
        ("POST", "/api/redpackets/abc/grab", "{\"user\":\"\u{0}\"}", 400, Some("body")),
        ("POST", "/api/redpackets/a%7Bb/grab", r#"{"user":"a"}"#, 400, Some("id")),
        ("POST", "/api/redpackets/..%2Fx/grab", r#"{"user":"a"}"#, 400, Some("id")),
        ("POST", "/api/redpackets/%zz/grab", r#"{"user":"a"}"#, 400, Some("path")),
        ("POST", "/api/redpackets/%FF/grab", r#"{"user":"a"}"#, 400, Some("path")),
        ("POST", "/api/redpackets", r#"{"total_cents":2.5,"count":2}"#, 400, Some("total_cents")),
        ("POST", "/api/redpackets", r#"{"total_cents":1e3,"count":2}"#, 400, Some("total_cents")),
        ("POST", "/api/redpackets", r#"{"total_cents":"0x10","count":2}"#, 400, Some("total_cents")),
        ("POST", "/api/redpackets", r#"{"total_cents":9007199254740993,"count":2}"#, 400, Some("total_cents")),
        ("POST", "/api/redpackets", r#"{"total_cents":100000000000000000000000,"count":2}"#, 400, Some("total_cents")),
        ("POST", "/api/redpackets", r#"{"total_cents":100,"count":-1}"#, 400, Some("count")),
        ("POST", "/api/redpackets", r#"{"total_cents":1,"count":2}"#, 400, Some("total_cents")),
        ("POST", "/api/redpackets", r#"{"total_cents":20000,"count":2}"#, 403, Some("total_cents")),
        ("POST", "/api/redpackets", r#"{"total_cents":200,"count":101}"#, 403, Some("count")),
        ("POST", "/api/redpackets", r#"{"total_cents":200,"count":2,"policy":"daily-prize"}"#, 404, Some("policy")),
        ("POST", "/api/quotas/daily-prize/u1", r#"{"cost":2}"#, 403, Some("cost")),
        ("POST", "/api/quotas/daily-prize/u1", r#"{"cost":3}"#, 400, Some("cost")),
        ("GET", "/api/quotas/daily-prize/u1?cost=nan", "", 400, Some("cost")),
        ("GET", "/api/quotas/daily-prize/u1?bogus=1", "", 400, Some("bogus")),
        ("DELETE", "/api/quotas/daily-prize/u1", "", 401, None),
        ("POST", "/api/quotas/nope/u1", "", 404, Some("policy")),
        ("POST", "/api/quotas/device-slots/u1", "", 404, Some("policy")),
        ("POST", "/api/counters/running-jobs/app", r#"{"delta":5}"#, 403, Some("delta")),
        ("POST", "/api/counters/running-jobs/app", r#"{"delta":"1e3"}"#, 400, Some("delta")),
        ("POST", "/api/semaphores/device-slots/pool/steal", r#"{"holder":"a"}"#, 404, None),
        ("POST", "/api/inbox/alice/messages", r#"{"id":1,"body":"hi"}"#, 401, None),
        ("PUT", "/api/redpackets/abc/grab", "", 405, None),
        ("GET", "/api/nope", "", 404, None),
        ("GET", "/api//x", "", 404, None),
        ("GET", "/elsewhere", "", 404, None),
    ];
    for &(method, path, body, status, field) in cases {
        let r = respond(req(method, path, body));
        let j = json_of(&r);
        assert_eq!(r.status, status, "{method} {path} {body}: {}", r.body);
        assert!(j["error"].as_str().is_some_and(|m| !m.is_empty()), "{path}: {}", r.body);
        assert_eq!(j["field"].as_str(), field, "{method} {path} {body}: {}", r.body);
    }
    let long = format!("/api/redpackets/{}/grab", "x".repeat(10_000));
    assert_eq!(respond(req("POST", &long, r#"{"user":"a"}"#)).status, 400);
    let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
    assert_eq!(respond(req("POST", "/api/redpackets/abc/grab", &deep)).status, 400);
    let huge = format!(r#"{{"user":"{}"}}"#, "a".repeat(api::MAX_BODY));
    assert_eq!(respond(req("POST", "/api/redpackets/abc/grab", &huge)).status, 413);
    let bad_utf8 = ApiRequest { body: b"{\"user\":\"\xff\"}", ..req("POST", "/api/redpackets/abc/grab", "") };
    assert_eq!(respond(bad_utf8).status, 400);
    let r = respond(req("PUT", "/api/redpackets/abc/grab", ""));
    assert!(r.headers.contains(&("Allow", "POST".into())));
}

#[test]
fn idempotency_keys_add_one_key_in_the_same_slot() {
    let with = |k: &'static str| ApiRequest {
        idempotency_key: Some(k),
        ..req("POST", "/api/quotas/daily-prize/u1", r#"{"cost":1}"#)
    };
    let b = send_body(with("order-42"));
    let arr = b.as_array().unwrap();
    assert_eq!(arr[2], "3", "the reply key joins the quota's state and override keys");
    let key = arr[5].as_str().unwrap();
    assert!(key.starts_with("rc:{u:u1}:q:daily-prize:fw:idem:"), "{key}: same hash tag, same slot");
    assert_eq!(arr.len(), 12, "ttl and fingerprint follow the arguments");
    assert_eq!(send_body(with("order-42")), b, "the same request maps to the same reply key");
    assert_ne!(send_body(with("order-43"))[5], b[5]);
    // Packets take their id from the key, so a replay addresses the same packet.
    let create = |k: &'static str| ApiRequest {
        idempotency_key: Some(k),
        ..req("POST", "/api/redpackets", r#"{"total_cents":100,"count":2}"#)
    };
    assert_eq!(send_body(create("p-1"))[4], send_body(create("p-1"))[4]);
    for bad in ["", " spaced ", "ünï", &*Box::leak("k".repeat(256).into_boxed_str())] {
        let r = respond(ApiRequest { idempotency_key: Some(bad), ..req("POST", "/api/quotas/daily-prize/u1", "") });
        assert_eq!((r.status, json_of(&r)["field"].as_str()), (400, Some("Idempotency-Key")), "{bad:?}");
    }
    // The same key with another request: 422.
    let Step::Send(ex) = step(with("order-42")) else { panic!() };
    let Step::Respond(r) = ex.receive(
        400,
        br#"{"error":"IDEMPOTENCY_CONFLICT this Idempotency-Key was already used for a different request script: x"}"#,
    ) else {
        panic!()
    };
    assert_eq!((r.status, json_of(&r)["field"].as_str()), (422, Some("Idempotency-Key")));
}

#[test]
fn admin_token_is_required_and_checked() {
    let admin = format!("Bearer {ADMIN}");
    let with = |auth: &'static str| ApiRequest {
        authorization: Some(auth),
        ..req("DELETE", "/api/quotas/daily-prize/u1", "")
    };
    let auth: &'static str = Box::leak(admin.into_boxed_str());
    assert!(matches!(step(with(auth)), Step::Send(_)));
    assert_eq!(respond(with("Bearer admin-token-012345678X")).status, 401);
    assert_eq!(respond(with("Bearer rest-token")).status, 401, "the REST token is not an admin token");
    assert_eq!(respond(with("Basic abc")).status, 401);
    // Admin may exceed the public limits.
    let big = ApiRequest {
        authorization: Some(auth),
        ..req("POST", "/api/redpackets", r#"{"total_cents":20000,"count":200}"#)
    };
    assert!(matches!(step(big), Step::Send(_)));
}

#[test]
fn policies_cors_and_config_errors() {
    let r = respond(req("GET", "/api/policies", ""));
    let j = json_of(&r);
    assert_eq!(
        j["policies"]["daily-prize"],
        json!({"kind": "quota", "algorithm": "fixed", "limit": 2, "window_ms": 86400000, "max_cost": 1})
    );
    assert!(!r.body.contains("rest-token") && !r.body.contains(ADMIN));
    let with_origin = |o: &'static str| ApiRequest { origin: Some(o), ..req("GET", "/api/policies", "") };
    assert!(
        respond(with_origin("https://app.example"))
            .headers
            .contains(&("Access-Control-Allow-Origin", "https://app.example".into()))
    );
    assert!(
        respond(with_origin("https://evil.example")).headers.iter().all(|(k, _)| *k != "Access-Control-Allow-Origin")
    );
    let pre = respond(ApiRequest { origin: Some("https://app.example"), ..req("OPTIONS", "/api/redpackets", "") });
    assert_eq!(pre.status, 204);
    assert!(pre.headers.iter().any(|(k, _)| *k == "Access-Control-Allow-Methods"));

    let env = |pairs: &'static [(&'static str, &'static str)]| {
        move |n: &str| pairs.iter().find(|(k, _)| *k == n).map(|(_, v)| v.to_string())
    };
    let base: &[(&str, &str)] = &[("REDCOUNT_REST_URL", "http://x"), ("REDCOUNT_REST_TOKEN", "t")];
    let e = Config::from_env(env(base)).unwrap_err();
    assert_eq!(e.variable, "REDCOUNT_POLICIES");
    for (policies, at) in [
        ("{", "REDCOUNT_POLICIES"),
        ("[]", "REDCOUNT_POLICIES"),
        (r#"{"a":{"kind":"quota","limit":0,"window_ms":1}}"#, "REDCOUNT_POLICIES.a.limit"),
        (r#"{"a":{"kind":"quota","limit":5}}"#, "REDCOUNT_POLICIES.a.window_ms"),
        (r#"{"a":{"kind":"quota","limit":5,"window_ms":1,"typo":1}}"#, "REDCOUNT_POLICIES.a.typo"),
        (r#"{"a":{"kind":"nope"}}"#, "REDCOUNT_POLICIES.a.kind"),
        (r#"{"c":{"kind":"counter","min":0,"on_unavailable":"allow"}}"#, "REDCOUNT_POLICIES.c.on_unavailable"),
        (
            r#"{"s":{"kind":"semaphore","limit":1,"lease_ms":1,"on_unavailable":"allow"}}"#,
            "REDCOUNT_POLICIES.s.on_unavailable",
        ),
        (
            r#"{"q":{"kind":"quota","limit":1,"window_ms":1,"on_unavailable":"open"}}"#,
            "REDCOUNT_POLICIES.q.on_unavailable",
        ),
        (r#"{"q":{"kind":"quota","limit":1,"window_ms":1,"timeout_ms":0}}"#, "REDCOUNT_POLICIES.q.timeout_ms"),
        (
            r#"{"g":{"kind":"quota","algorithm":"gcra","rate":0,"period_ms":1000,"burst":1}}"#,
            "REDCOUNT_POLICIES.g.rate",
        ),
        (r#"{"g":{"kind":"quota","algorithm":"gcra","rate":1,"burst":1}}"#, "REDCOUNT_POLICIES.g.period_ms"),
        (
            r#"{"g":{"kind":"quota","algorithm":"gcra","rate":1,"period_ms":31536000000,"burst":1000}}"#,
            "REDCOUNT_POLICIES.g.burst",
        ),
        (
            r#"{"g":{"kind":"quota","algorithm":"gcra","rate":1,"period_ms":1000,"burst":2,"limit":3}}"#,
            "REDCOUNT_POLICIES.g.limit",
        ),
        (r#"{"g":{"kind":"quota","algorithm":"leaky","limit":3,"window_ms":1}}"#, "REDCOUNT_POLICIES.g.algorithm"),
        (r#"{"a:b":{"kind":"claim","window_ms":1}}"#, "REDCOUNT_POLICIES.a:b"),
        (r#"{"c":{"kind":"counter","min":5,"max":1}}"#, "REDCOUNT_POLICIES.c.max"),
        // Reservation settings: a debt within what the algorithm's largest size leaves
        // (a fixed window's 10^9, a sliding window's 10,000), charge or refund, quotas only.
        (r#"{"q":{"kind":"quota","limit":5,"window_ms":1,"max_debt":-1}}"#, "REDCOUNT_POLICIES.q.max_debt"),
        (r#"{"q":{"kind":"quota","limit":5,"window_ms":1,"max_debt":999999996}}"#, "REDCOUNT_POLICIES.q.max_debt"),
        (
            r#"{"q":{"kind":"quota","algorithm":"sliding","limit":9000,"window_ms":1,"max_debt":1001}}"#,
            "REDCOUNT_POLICIES.q.max_debt",
        ),
        (r#"{"q":{"kind":"quota","limit":5,"window_ms":1,"max_debt":"x"}}"#, "REDCOUNT_POLICIES.q.max_debt"),
        (r#"{"q":{"kind":"quota","limit":5,"window_ms":1,"on_expiry":"forget"}}"#, "REDCOUNT_POLICIES.q.on_expiry"),
        (r#"{"q":{"kind":"quota","limit":5,"window_ms":1,"on_expiry":1}}"#, "REDCOUNT_POLICIES.q.on_expiry"),
        (r#"{"s":{"kind":"semaphore","limit":1,"lease_ms":1,"max_debt":1}}"#, "REDCOUNT_POLICIES.s.max_debt"),
        (r#"{"c":{"kind":"claim","window_ms":1,"on_expiry":"refund"}}"#, "REDCOUNT_POLICIES.c.on_expiry"),
        // A repeated name, or a repeated setting, is refused (a map would keep the last).
        (r#"{"c":{"kind":"claim","window_ms":1},"c":{"kind":"counter"}}"#, "REDCOUNT_POLICIES.c"),
        (
            r#"{"a":{"kind":"claim","window_ms":1},"q":{"kind":"quota","limit":1,"limit":9,"window_ms":1}}"#,
            "REDCOUNT_POLICIES.q.limit",
        ),
    ] {
        let vars: Vec<(&str, &str)> = base.iter().copied().chain([("REDCOUNT_POLICIES", policies)]).collect();
        let e = Config::from_env(|n| vars.iter().find(|(k, _)| *k == n).map(|(_, v)| v.to_string())).unwrap_err();
        assert_eq!(e.variable, at, "{policies}: {e}");
        let r = api::misconfigured(&e);
        assert_eq!(r.status, 500);
        assert!(json_of(&r)["error"].as_str().unwrap().contains(at));
    }
    let short_admin: &[(&str, &str)] = &[
        ("REDCOUNT_REST_URL", "http://x"),
        ("REDCOUNT_REST_TOKEN", "t"),
        ("REDCOUNT_ADMIN_TOKEN", "short"),
        ("REDCOUNT_POLICIES", r#"{"a":{"kind":"claim","window_ms":1}}"#),
    ];
    assert_eq!(Config::from_env(env(short_admin)).unwrap_err().variable, "REDCOUNT_ADMIN_TOKEN");

    // The reservation settings are read, and shown when they are not the defaults.
    let with: &[(&str, &str)] = &[(
        "REDCOUNT_POLICIES",
        r#"{"q":{"kind":"quota","limit":5,"window_ms":1,"max_debt":3,"on_expiry":"refund"},"p":{"kind":"quota","limit":5,"window_ms":1,"on_expiry":"charge"}}"#,
    )];
    let c = Config::from_env(env(with)).unwrap();
    assert!(matches!(
        c.policy("q"),
        Some(Policy::Quota { max_debt: 3, on_expiry: redcount_core::ops::reservation::OnExpiry::Refund, .. })
    ));
    assert_eq!(c.policy("q").unwrap().to_json()["max_debt"], 3);
    assert_eq!(c.policy("q").unwrap().to_json()["on_expiry"], "refund");
    assert!(matches!(
        c.policy("p"),
        Some(Policy::Quota { max_debt: 0, on_expiry: redcount_core::ops::reservation::OnExpiry::Charge, .. })
    ));
    assert_eq!(
        c.policy("p").unwrap().to_json(),
        json!({"kind": "quota", "algorithm": "fixed", "limit": 5, "window_ms": 1, "max_cost": 1})
    );
}

#[test]
fn a_namespace_moves_every_key_of_every_call_and_the_reply_key_with_them() {
    let vars = |ns: &'static str| {
        move |n: &str| match n {
            "REDCOUNT_POLICIES" => Some(r#"{"signup-bonus": {"kind": "claim", "window_ms": 1000}}"#.to_string()),
            "REDCOUNT_NAMESPACE" => Some(ns.to_string()),
            _ => None,
        }
    };
    let config = Config::from_env(vars("app2")).unwrap();
    let request = ApiRequest { idempotency_key: Some("k-1"), ..req("POST", "/api/claims/signup-bonus/alice", "") };
    let Step::Send(ex) = api::handle(&config, &request, &mut StdRng::seed_from_u64(1)) else { panic!() };
    let body: Value = serde_json::from_str(ex.body()).unwrap();
    // EVALSHA sha 2 <claim key> <reply key> ...
    assert_eq!(body[2], "2", "{body}");
    assert_eq!(body[3], "app2:{cl:signup-bonus:alice}", "{body}");
    assert!(body[4].as_str().unwrap().starts_with("app2:{cl:signup-bonus:alice}:idem:"), "{body}");
    // The default namespace (unset) leaves keys as they were; set but empty is refused.
    let config = Config::from_env(|n| vars("rc")(n).filter(|_| n != "REDCOUNT_NAMESPACE")).unwrap();
    let Step::Send(ex) = api::handle(&config, &request, &mut StdRng::seed_from_u64(1)) else { panic!() };
    assert!(ex.body().contains(r#""rc:{cl:signup-bonus:alice}""#), "{}", ex.body());
    // A namespace that could break a key or a SCAN pattern is refused, naming the variable.
    for bad in ["", "  ", "a:b", "a{b", "a*", "x y"] {
        let e = Config::from_env(vars(bad)).unwrap_err();
        assert_eq!(e.variable, "REDCOUNT_NAMESPACE", "{bad}: {e}");
    }
}

/// A red packet's id derived from an Idempotency-Key depends on the deployment's secret only,
/// not on the transport: a retry that lands on another shell (REST or RESP) gets the same id.
#[test]
fn packet_ids_from_a_key_do_not_depend_on_the_transport() {
    let policies = r#"{"demo-packets": {"kind": "redpackets", "max_shares": 100, "max_total_cents": 10000}}"#;
    let id_of = |pairs: &[(&str, &str)]| {
        let config = Config::from_env(|n| {
            if n == "REDCOUNT_POLICIES" {
                return Some(policies.to_string());
            }
            pairs.iter().find(|(k, _)| *k == n).map(|(_, v)| v.to_string())
        })
        .unwrap();
        let request = ApiRequest {
            idempotency_key: Some("retry-1"),
            ..req("POST", "/api/redpackets", r#"{"total_cents": 1000, "count": 5}"#)
        };
        let Step::Send(ex) = api::handle(&config, &request, &mut StdRng::seed_from_u64(7)) else { panic!() };
        let body: Value = serde_json::from_str(ex.body()).unwrap();
        body[3].as_str().unwrap().to_string() // the packet's meta key holds its id
    };
    let over_rest = id_of(&[("REDCOUNT_ADMIN_TOKEN", ADMIN), ("REDCOUNT_REST_TOKEN", "rest-token")]);
    let over_resp = id_of(&[("REDCOUNT_ADMIN_TOKEN", ADMIN)]);
    assert_eq!(over_rest, over_resp, "the REST token changed the id");
    let other_secret = id_of(&[("REDCOUNT_ADMIN_TOKEN", ADMIN), ("REDCOUNT_ID_SECRET", "another-secret-0123")]);
    assert_ne!(other_secret, over_resp, "REDCOUNT_ID_SECRET is the secret");
    let other_admin = id_of(&[("REDCOUNT_ADMIN_TOKEN", "another-admin-0123456")]);
    assert_ne!(other_admin, over_resp, "without REDCOUNT_ID_SECRET the admin token is");
}

/// The same operations without HTTP (an RPC binding's way in): a typed route, its input as a
/// JSON object, a caller. Same exchanges, same answers, same idempotency scope as over HTTP.
#[test]
fn calls_without_http_make_the_same_exchanges() {
    use api::{Caller, Input, Route};
    let config = config();
    let call = |route: Route, input: &[u8], caller: &Caller, key: Option<&str>| {
        api::call(&config, route, Input::Json(input), caller, key, &mut StdRng::seed_from_u64(1))
    };
    let take = || Route::QuotaTake { policy: "daily-prize".into(), subject: "u1".into() };
    let body = |step: Step| match step {
        Step::Send(ex) => ex.body().to_string(),
        Step::Respond(r) => panic!("expected a REST call, got {} {}", r.status, r.body),
        Step::Script(ex) => panic!("a first call asks for no script: {}", ex.body()),
    };
    let error = |step: Step| match step {
        Step::Respond(r) => (r.status, json_of(&r)["field"].as_str().map(str::to_owned)),
        Step::Send(ex) | Step::Script(ex) => panic!("expected an answer, sent {}", ex.body()),
    };
    // The same REST body as the HTTP request, the Idempotency-Key's reply key included.
    let http =
        ApiRequest { idempotency_key: Some("k-1"), ..req("POST", "/api/quot%61s/daily-prize/u1", r#"{"cost": 1}"#) };
    let over_http = match step(http) {
        Step::Send(ex) => ex.body().to_string(),
        Step::Respond(r) => panic!("{}", r.body),
        Step::Script(ex) => panic!("a first call asks for no script: {}", ex.body()),
    };
    assert_eq!(body(call(take(), br#"{"cost":1}"#, &Caller::public(), Some("k-1"))), over_http);
    // A peek reads its cost from the object, as JSON numbers (the query's text over HTTP).
    let peek = || Route::QuotaPeek { policy: "daily-prize".into(), subject: "u1".into() };
    let peeked: Value = serde_json::from_str(&body(call(peek(), br#"{"cost": 2}"#, &Caller::public(), None))).unwrap();
    assert_eq!(peeked[7], "2", "{peeked}");
    assert_eq!(error(call(peek(), br#"{"cost": 2.5}"#, &Caller::public(), None)), (400, Some("cost".into())));
    assert_eq!(error(call(peek(), br#"{"after": 1}"#, &Caller::public(), None)), (400, Some("after".into())));
    // Rights: the public limit holds for a public caller, not an admin one; admin routes need admin.
    assert_eq!(error(call(take(), br#"{"cost":2}"#, &Caller::public(), None)), (403, Some("cost".into())));
    body(call(take(), br#"{"cost":2}"#, &Caller::admin(), None));
    let reset = || Route::QuotaReset { policy: "daily-prize".into(), subject: "u1".into() };
    assert_eq!(error(call(reset(), b"", &Caller::public(), None)).0, 401);
    body(call(reset(), b"", &Caller::admin(), None));
    // A decision part's error names the part's field, as over HTTP.
    let decide = Route::Decide { subject: "u1".into() };
    let bad_part = br#"{"parts": [{"policy": "daily-prize"}, {"policy": "device-slots", "holder": "a:b"}]}"#;
    assert_eq!(error(call(decide, bad_part, &Caller::public(), None)), (400, Some("parts[1].holder".into())));
}

/// A scoped caller (an RPC binding's `ctx.props`) lives under `namespace.scope`: every key of
/// every call it makes, the reply key of its Idempotency-Key too, whatever it names.
#[test]
fn a_scoped_caller_cannot_name_another_scopes_keys() {
    use api::{Caller, Input, Route, Scope};
    let keys_of = |config: &Config, caller: &Caller, route: Route, input: &[u8]| -> Vec<String> {
        match api::call(config, route, Input::Json(input), caller, Some("k"), &mut StdRng::seed_from_u64(1)) {
            Step::Send(ex) => {
                let b: Value = serde_json::from_str(ex.body()).unwrap();
                let n: usize = b[2].as_str().unwrap().parse().unwrap();
                b.as_array().unwrap()[3..3 + n].iter().map(|k| k.as_str().unwrap().to_owned()).collect()
            }
            Step::Respond(r) => panic!("{} {}", r.status, r.body),
            Step::Script(ex) => panic!("a first call asks for no script: {}", ex.body()),
        }
    };
    let acme = Caller::public().scoped(Scope::new("acme").unwrap());
    let routes = || {
        [
            (Route::QuotaTake { policy: "daily-prize".into(), subject: "alice".into() }, &b""[..]),
            (Route::Claim { policy: "signup-bonus".into(), subject: "alice".into() }, b""),
            (Route::CounterAdd { policy: "running-jobs".into(), subject: "alice".into() }, br#"{"delta":1}"#),
            (Route::SemaphoreAcquire { policy: "device-slots".into(), name: "alice".into() }, br#"{"holder":"h"}"#),
            (Route::PacketGrab { id: "p1".into() }, br#"{"user":"alice"}"#),
            (Route::PacketCreate {}, br#"{"total_cents":100,"count":2}"#),
        ]
    };
    let config = config();
    for (route, input) in routes() {
        let unscoped = keys_of(&config, &Caller::public(), route.clone(), input);
        let scoped = keys_of(&config, &acme, route.clone(), input);
        assert!(!scoped.is_empty());
        for (u, s) in unscoped.iter().zip(&scoped) {
            // The same key, moved; an idempotency record's name is the scope's own too.
            let (u, u_idem) = u.split_once(":idem:").unwrap_or((u, ""));
            let (s, s_idem) = s.split_once(":idem:").unwrap_or((s, ""));
            // A packet whose id comes from the key: another id in the scope (see below).
            let packet = |k: &str| k.split_once("{rp:").map(|(_, rest)| rest.split_once('}').unwrap().0.to_string());
            let (u_id, s_id) = (packet(u).unwrap_or_default(), packet(s).unwrap_or_default());
            assert_eq!(u_id != s_id, route == Route::PacketCreate {}, "{route:?}");
            let id = |k: &str, i: &str| if i.is_empty() { k.to_string() } else { k.replace(i, "ID") };
            let (u, s) = (id(u, &u_id), id(s, &s_id));
            assert_eq!(format!("rc.acme{}", u.strip_prefix("rc").unwrap()), s, "{route:?}");
            assert!(u_idem != s_idem || u_idem.is_empty(), "{route:?}");
        }
    }
    // Under a configured namespace, the scope is within it.
    let vars = |n: &str| match n {
        "REDCOUNT_POLICIES" => Some(r#"{"signup-bonus": {"kind": "claim", "window_ms": 1000}}"#.to_string()),
        "REDCOUNT_NAMESPACE" => Some("app2".to_string()),
        _ => None,
    };
    let app2 = Config::from_env(vars).unwrap();
    let claim = Route::Claim { policy: "signup-bonus".into(), subject: "alice".into() };
    assert!(keys_of(&app2, &acme, claim, b"").iter().all(|k| k.starts_with("app2.acme:{")));
    // A scope is an id: it cannot hold a separator, a hash tag or a glob.
    for bad in ["", "a:b", "a{b", "a.b", "a*", &"x".repeat(65)] {
        assert_eq!(Scope::new(bad).unwrap_err().field, "scope", "{bad:?}");
    }
}
