//! The route contract as a table, run in-process: each row is a request, the script (or
//! plain command) the API must send for it, the REST reply a scripted responder gives, and
//! the response the API must make of it. One behaviour per row; the real-process pass through
//! the worker and `redcount serve` (tests/it/worker.rs) is the complement.

use rand::SeedableRng;
use rand::rngs::StdRng;
use redcount_api::{self as api, ApiRequest, Config, Step};
use redcount_core::script;
use serde_json::{Value, json};

const ADMIN: &str = "admin-token-0123456789";

fn config() -> Config {
    let policies = r#"{
      "daily": {"kind": "quota", "algorithm": "fixed", "limit": 2, "window_ms": 86400000},
      "slots": {"kind": "semaphore", "limit": 60, "lease_ms": 300000},
      "jobs": {"kind": "counter", "min": 0, "storage": "hash"},
      "bonus": {"kind": "claim", "window_ms": 86400000},
      "packets": {"kind": "redpackets", "max_shares": 100, "max_total_cents": 10000},
      "inbox": {"kind": "inbox"}
    }"#;
    let vars = [("REDCOUNT_ADMIN_TOKEN", ADMIN), ("REDCOUNT_POLICIES", policies)];
    Config::from_env(|n| vars.iter().find(|(k, _)| *k == n).map(|(_, v)| v.to_string())).unwrap()
}

/// What the API must send: a script by name, or a plain command.
#[derive(Debug, Clone, Copy)]
enum Sends {
    Script(&'static str),
    Command(&'static str),
    Nothing,
}

struct Row {
    method: &'static str,
    path: &'static str,
    body: &'static str,
    admin: bool,
    sends: Sends,
    /// The REST reply's `result` (integers: no base64 needed).
    reply: Value,
    status: u16,
    /// Fields the response must have, with these values.
    expect: Value,
}

fn row(
    method: &'static str,
    path: &'static str,
    body: &'static str,
    sends: Sends,
    reply: Value,
    status: u16,
    expect: Value,
) -> Row {
    Row { method, path, body, admin: false, sends, reply, status, expect }
}

/// The name of the script whose SHA-1 an EVALSHA body carries.
fn script_named(sha: &str) -> &'static str {
    script::ALL.iter().find(|s| s.sha1() == sha).map(|s| s.name()).unwrap_or("unknown")
}

fn table() -> Vec<Row> {
    use Sends::*;
    let mut admin_reset =
        row("DELETE", "/api/quotas/daily/u1", "", Script("quota_reset"), json!([1]), 200, json!({"reset": true}));
    admin_reset.admin = true;
    let mut admin_packet = row(
        "POST",
        "/api/redpackets",
        r#"{"total_cents":100000,"count":3}"#,
        Script("redpacket_create"),
        json!([1, 1]),
        201,
        json!({}),
    );
    admin_packet.admin = true;
    vec![
        row(
            "POST",
            "/api/counters/jobs/a",
            r#"{"delta":1}"#,
            Script("counter"),
            json!([1, 1, 0]),
            200,
            json!({"value": 1, "applied": 1, "status": "applied"}),
        ),
        row("POST", "/api/counters/jobs/a", r#"{"delta":2}"#, Nothing, Value::Null, 403, json!({"field": "delta"})),
        row(
            "POST",
            "/api/counters/jobs/a",
            r#"{"delta":-1}"#,
            Script("counter"),
            json!([0, 0, 1]),
            200,
            json!({"value": 0, "applied": 0, "status": "clamped"}),
        ),
        row("GET", "/api/counters/jobs/a", "", Command("HGET"), json!(7), 200, json!({"value": 7})),
        row("POST", "/api/counters/jobs/a", r#"{"delta":"x"}"#, Nothing, Value::Null, 400, json!({"field": "delta"})),
        row("POST", "/api/counters/nope/a", r#"{"delta":1}"#, Nothing, Value::Null, 404, json!({"field": "policy"})),
        row("POST", "/api/counters/daily/a", r#"{"delta":1}"#, Nothing, Value::Null, 404, json!({"field": "policy"})),
        row("POST", "/api/claims/bonus/a", "", Script("claim"), json!([1, -1]), 200, json!({"claimed": true})),
        row(
            "POST",
            "/api/claims/bonus/a",
            "",
            Script("claim"),
            json!([0, 5000]),
            200,
            json!({"claimed": false, "retry_after_ms": 5000}),
        ),
        row(
            "POST",
            "/api/quotas/daily/u1",
            r#"{"cost":1}"#,
            Script("quota_fixed"),
            json!([1, 2, 1, 1000, 0]),
            200,
            json!({"allowed": true, "remaining": 1}),
        ),
        row(
            "POST",
            "/api/quotas/daily/u1",
            "",
            Script("quota_fixed"),
            json!([0, 2, 0, 1000, 1000]),
            200,
            json!({"allowed": false, "retry_after_ms": 1000}),
        ),
        row(
            "GET",
            "/api/quotas/daily/u1?cost=2",
            "",
            Script("quota_fixed"),
            json!([1, 2, 2, 1000, 0]),
            200,
            json!({"remaining": 2}),
        ),
        row("POST", "/api/quotas/daily/u1", r#"{"cost":3}"#, Nothing, Value::Null, 400, json!({"field": "cost"})),
        row("DELETE", "/api/quotas/daily/u1", "", Nothing, Value::Null, 401, json!({})),
        admin_reset,
        row(
            "POST",
            "/api/semaphores/slots/n/acquire",
            r#"{"holder":"h1"}"#,
            Script("semaphore"),
            json!([1, 1, 60, 300000, 300000, 1795000000000001_i64]),
            200,
            json!({"result": "acquired", "in_use": 1, "fencing_token": 1795000000000001_i64}),
        ),
        row(
            "POST",
            "/api/semaphores/slots/n/release",
            r#"{"holder":"h1"}"#,
            Script("semaphore"),
            json!([3, 0, 60, -1, 0, 1795000000000001_i64]),
            200,
            json!({"result": "released", "fencing_token": 1795000000000001_i64}),
        ),
        row("POST", "/api/semaphores/slots/n/steal", r#"{"holder":"h1"}"#, Nothing, Value::Null, 404, json!({})),
        row(
            "POST",
            "/api/semaphores/slots/n/acquire",
            r#"{"holder":"a:b"}"#,
            Nothing,
            Value::Null,
            400,
            json!({"field": "holder"}),
        ),
        row(
            "POST",
            "/api/redpackets",
            r#"{"total_cents":1000,"count":3}"#,
            Script("redpacket_create"),
            json!([1, 1]),
            201,
            json!({}),
        ),
        row(
            "POST",
            "/api/redpackets",
            r#"{"total_cents":100000,"count":3}"#,
            Nothing,
            Value::Null,
            403,
            json!({"field": "total_cents"}),
        ),
        admin_packet,
        row(
            "POST",
            "/api/redpackets/p1/grab",
            r#"{"user":"alice"}"#,
            Script("redpacket_grab"),
            json!([1, 250, 1, 2]),
            200,
            json!({"outcome": "won", "amount_cents": 250, "index": 1}),
        ),
        row(
            "POST",
            "/api/redpackets/p1/grab",
            r#"{"user":"alice"}"#,
            Script("redpacket_grab"),
            json!([2, 250, 1, 2]),
            200,
            json!({"outcome": "already", "amount_cents": 250}),
        ),
        row(
            "POST",
            "/api/redpackets/p1/grab",
            r#"{"user":"bob"}"#,
            Script("redpacket_grab"),
            json!([0, 0, 0, 0]),
            200,
            json!({"outcome": "empty"}),
        ),
        row(
            "POST",
            "/api/redpackets/p1/grab",
            r#"{"user":"bob"}"#,
            Script("redpacket_grab"),
            json!([-1, 0, 0, 0]),
            404,
            json!({"field": "id"}),
        ),
        row("POST", "/api/redpackets/p1/grab", r#"{}"#, Nothing, Value::Null, 400, json!({"field": "user"})),
        row("POST", "/api/inbox/u1/messages", r#"{"id":1,"body":"hi"}"#, Nothing, Value::Null, 401, json!({})),
        row("PUT", "/api/counters/jobs/a", r#"{"delta":1}"#, Nothing, Value::Null, 405, json!({})),
        row("GET", "/api/nothing-here", "", Nothing, Value::Null, 404, json!({})),
    ]
}

#[test]
fn every_row_of_the_route_table() {
    let config = config();
    let auth = format!("Bearer {ADMIN}");
    for (i, r) in table().into_iter().enumerate() {
        let (path, query) = r.path.split_once('?').unwrap_or((r.path, ""));
        let request = ApiRequest {
            method: r.method,
            path,
            query,
            authorization: r.admin.then_some(auth.as_str()),
            origin: None,
            idempotency_key: None,
            body: r.body.as_bytes(),
        };
        let what = format!("row {i}: {} {}", r.method, r.path);
        let response = match (api::handle(&config, &request, &mut StdRng::seed_from_u64(i as u64)), r.sends) {
            (Step::Respond(resp), Sends::Nothing) => resp,
            (Step::Send(ex), Sends::Script(name)) => {
                let sent: Value = serde_json::from_str(ex.body()).unwrap();
                assert_eq!(sent[0], json!("EVALSHA"), "{what}");
                assert_eq!(script_named(sent[1].as_str().unwrap()), name, "{what}: which script");
                let Step::Respond(resp) = ex.receive(200, json!({"result": r.reply}).to_string().as_bytes()) else {
                    panic!("{what}: a second call after a plain reply")
                };
                resp
            }
            (Step::Send(ex), Sends::Command(name)) => {
                let sent: Value = serde_json::from_str(ex.body()).unwrap();
                assert_eq!(sent[0], json!(name), "{what}");
                let Step::Respond(resp) = ex.receive(200, json!({"result": r.reply}).to_string().as_bytes()) else {
                    panic!("{what}: a second call after a plain reply")
                };
                resp
            }
            (Step::Respond(resp), sends) => {
                panic!("{what}: answered {} {} without sending {sends:?}", resp.status, resp.body)
            }
            (Step::Send(ex), Sends::Nothing) => panic!("{what}: sent {} though it must not", ex.body()),
            (Step::Script(ex), _) => panic!("{what}: asked for a script before sending {}", ex.body()),
        };
        assert_eq!(response.status, r.status, "{what}: {}", response.body);
        if !response.body.is_empty() {
            let got: Value = serde_json::from_str(&response.body).unwrap();
            for (k, v) in r.expect.as_object().unwrap() {
                assert_eq!(&got[k], v, "{what}: field {k} of {got}");
            }
            if r.status >= 400 {
                assert!(got["error"].is_string(), "{what}: errors say why: {got}");
            }
        }
        // The same call through the RPC binding: the same command, the same answer.
        if let Ok(route) = api::Route::parse(r.method, path)
            && route.spec().rpc().is_some()
        {
            let sent = match api::handle(&config, &request, &mut StdRng::seed_from_u64(i as u64)) {
                Step::Send(ex) => Some(ex.body().to_string()),
                _ => None,
            };
            let (rpc_sent, answer) = rpc_call(&config, &route, query, r.body, r.admin, i, &r.reply);
            assert_eq!(rpc_sent, sent, "{what}: over RPC");
            match (api::rpc::answer(&answer), response.status) {
                (Ok(text), status) => {
                    assert!(status < 400 || answer.degraded, "{what}: an error returned over RPC: {text}");
                    let mut got: Value = serde_json::from_str(&text).unwrap();
                    got.as_object_mut().unwrap().remove("headers");
                    assert_eq!(got, serde_json::from_str::<Value>(&response.body).unwrap(), "{what}: over RPC");
                }
                (Err(text), status) => {
                    let got: Value = serde_json::from_str(&text).unwrap();
                    assert_eq!(got["status"], json!(status), "{what}: over RPC: {got}");
                    assert_eq!(got["field"], serde_json::from_str::<Value>(&response.body).unwrap()["field"], "{what}");
                }
            }
        }
    }
}

/// `route` called through the RPC binding with the row's fields (a query's as JSON numbers),
/// admin rights from the binding's props: the REST body sent, if any, and the answer made of
/// the row's reply.
fn rpc_call(
    config: &Config,
    route: &api::Route,
    query: &str,
    body: &str,
    admin: bool,
    seed: usize,
    reply: &Value,
) -> (Option<String>, api::ApiResponse) {
    let params = serde_json::to_string(&route.params().collect::<Vec<_>>()).unwrap();
    let input = if query.is_empty() {
        if body.is_empty() { "null".to_string() } else { body.to_string() }
    } else {
        let fields: serde_json::Map<String, Value> = query
            .split('&')
            .map(|kv| kv.split_once('=').unwrap_or((kv, "")))
            .map(|(k, v)| (k.to_string(), v.parse::<i64>().map_or_else(|_| json!(v), |n| json!(n))))
            .collect();
        Value::Object(fields).to_string()
    };
    let caller = api::rpc::caller(if admin { br#"{"admin": true}"# } else { b"null" }).unwrap();
    let step = api::rpc::call(
        config,
        route.id(),
        params.as_bytes(),
        input.as_bytes(),
        b"null",
        &caller,
        &mut StdRng::seed_from_u64(seed as u64),
    );
    match step {
        Step::Respond(r) => (None, r),
        Step::Send(ex) => {
            let sent = ex.body().to_string();
            let Step::Respond(r) = ex.receive(200, json!({"result": reply}).to_string().as_bytes()) else { panic!() };
            (Some(sent), r)
        }
        Step::Script(ex) => panic!("asked for a script before sending {}", ex.body()),
    }
}

/// A valid call of every route of the route table (a new route makes this match fail to
/// compile): its method, path (the table's, with each parameter filled) and body.
fn valid_call(spec: &api::RouteSpec) -> (&'static str, String, &'static str) {
    use api::RouteId::*;
    let (policy, body) = match spec.id {
        Health | Policies | OpenApi | InboxRead | PacketStatus | PacketGrabs => ("", ""),
        // An id of these is a sealed ticket a reserve answered (anything else is a 404 before
        // a call): their failures are driven in redcount-cli's reservation_routes.
        Settle | SettleTenant | Extend | ExtendTenant | Release | ReleaseTenant => ("", ""),
        QuotaPeekTenant | QuotaResetTenant => ("daily", ""),
        QuotaTakeTenant | QuotaRefundTenant => ("daily", r#"{"cost":1}"#),
        DecideTenant => ("", r#"{"parts":[{"policy":"daily","level":"tenant"}]}"#),
        Reserve | ReserveTenant => ("", r#"{"parts":[{"policy":"daily","units":1}]}"#),
        CounterGet => ("jobs", ""),
        CounterAdd => ("jobs", r#"{"delta":1}"#),
        Claim => ("bonus", ""),
        QuotaPeek | QuotaReset | OverrideClear => ("daily", ""),
        QuotaTake | QuotaRefund => ("daily", r#"{"cost":1}"#),
        OverrideSet => ("daily", r#"{"limit":5}"#),
        Decide => ("", r#"{"parts":[{"policy":"daily"}]}"#),
        SemaphoreAcquire | SemaphoreRenew | SemaphoreRelease => ("slots", r#"{"holder":"h1"}"#),
        SemaphoreCheck => ("slots", r#"{"holder":"h1","fencing_token":1}"#),
        InboxAppend => ("", r#"{"id":1,"body":"hi"}"#),
        InboxTrim => ("", "{}"),
        PacketCreate => ("", r#"{"total_cents":100,"count":2,"policy":"packets"}"#),
        PacketGrab => ("", r#"{"user":"alice"}"#),
    };
    let path = spec
        .path
        .replace("{policy}", policy)
        .replace("{id}", "0123456789abcdef0123456789abcdef")
        .replace("{subject}", "u1")
        .replace("{name}", "n1")
        .replace("{user}", "u1")
        .replace("{tenant}", "t1");
    (spec.method, path, body)
}

/// A call Redis did not answer (the policy's `timeout_ms`, the front or Redis unreachable) may
/// still run when Redis answers: every write route's failure says `"may_have_run": true` (a red
/// packet created when a paused Redis woke was answered a plain 503, and its retry without
/// the key made a second one), as the degraded answers of decision routes do; a read's does
/// not. Every route of the route table that sends a call, each way a call fails.
#[test]
fn a_write_that_got_no_answer_may_have_run() {
    let config = config();
    let auth = format!("Bearer {ADMIN}");
    let mut sent = 0;
    for spec in api::ROUTES {
        if spec.path.starts_with("/api/reservations/") && spec.path.contains("{id}") {
            continue; // (see valid_call)
        }
        let (method, path, body) = valid_call(spec);
        let request = ApiRequest {
            method,
            path: &path,
            query: "",
            authorization: Some(&auth),
            origin: None,
            idempotency_key: None,
            body: body.as_bytes(),
        };
        for way in 0..3 {
            let ex = match api::handle(&config, &request, &mut StdRng::seed_from_u64(1)) {
                Step::Send(ex) => ex,
                Step::Respond(r) if r.status < 400 => break,
                Step::Respond(r) => panic!("{method} {path}: {} {}", r.status, r.body),
                Step::Script(ex) => panic!("{method} {path}: a first call asks for no script: {}", ex.body()),
            };
            sent += 1;
            let response = match way {
                0 => ex.fail("the REST front did not answer within the policy's timeout_ms (300 ms)"),
                1 => ex.fail_at("Redis", "connection refused"),
                _ => match ex.receive(503, br#"{"error":"ERR Redis is unreachable"}"#) {
                    Step::Respond(resp) => resp,
                    Step::Send(_) | Step::Script(_) => panic!("{method} {path}: a second call after a 503"),
                },
            };
            let what = format!("{method} {path} (way {way}): {} {}", response.status, response.body);
            let got: Value = serde_json::from_str(&response.body).unwrap();
            if got["degraded"] == json!(true) {
                assert_eq!(got["may_have_run"], json!(true), "{what}");
                continue;
            }
            assert_eq!(response.status, 503, "{what}");
            assert!(got["error"].is_string(), "{what}");
            let write = method != "GET";
            assert_eq!(got["may_have_run"], if write { json!(true) } else { Value::Null }, "{what}");
        }
    }
    assert!(sent >= 3 * 20, "{sent} failed calls");
}
