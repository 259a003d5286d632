//! The RPC binding's calls in-process: every method of the route table, the binding's props,
//! and a scoped caller's reach, generated from the table (the methods) and from hostile
//! strings (their arguments).

use proptest::prelude::*;
use rand::SeedableRng;
use rand::rngs::StdRng;
use redcount_api::{ApiResponse, Config, RouteId, Step, rpc};
use serde_json::{Value, json};

fn config(namespace: Option<&str>) -> Config {
    let policies = r#"{
      "daily": {"kind": "quota", "algorithm": "fixed", "limit": 5, "window_ms": 86400000},
      "slots": {"kind": "semaphore", "limit": 60, "lease_ms": 300000},
      "jobs": {"kind": "counter", "min": 0, "storage": "hash"},
      "solo": {"kind": "counter", "min": 0, "storage": "key"},
      "bonus": {"kind": "claim", "window_ms": 86400000},
      "packets": {"kind": "redpackets", "max_shares": 100, "max_total_cents": 10000},
      "inbox": {"kind": "inbox", "public": true}
    }"#;
    let vars = [
        ("REDCOUNT_ADMIN_TOKEN", Some("admin-token-0123456789")),
        ("REDCOUNT_POLICIES", Some(policies)),
        ("REDCOUNT_NAMESPACE", namespace),
    ];
    Config::from_env(|n| vars.iter().find(|(k, _)| *k == n).and_then(|(_, v)| v.map(str::to_string))).unwrap()
}

/// A valid input for each method, so a call with valid parameters reaches Redis.
fn input(route: RouteId) -> Value {
    match route {
        RouteId::CounterAdd => json!({"delta": 1}),
        RouteId::QuotaTake | RouteId::QuotaPeek | RouteId::QuotaRefund => json!({"cost": 1}),
        RouteId::QuotaTakeTenant | RouteId::QuotaPeekTenant | RouteId::QuotaRefundTenant => json!({"cost": 1}),
        RouteId::DecideTenant => json!({"parts": [{"policy": "daily", "level": "tenant"}]}),
        RouteId::Reserve | RouteId::ReserveTenant => json!({"parts": [{"policy": "daily", "units": 1}]}),
        RouteId::OverrideSet => json!({"limit": 3, "ttl_ms": 1000}),
        RouteId::Decide => json!({"parts": [{"policy": "daily"}, {"policy": "slots", "holder": "h1"}]}),
        RouteId::SemaphoreAcquire | RouteId::SemaphoreRenew | RouteId::SemaphoreRelease => json!({"holder": "h1"}),
        RouteId::SemaphoreCheck => json!({"holder": "h1", "fencing_token": 3}),
        RouteId::InboxAppend => json!({"id": 1, "body": "hi"}),
        RouteId::PacketCreate => json!({"total_cents": 100, "count": 2}),
        RouteId::PacketGrab => json!({"user": "u1"}),
        _ => Value::Null,
    }
}

/// A parameter value: `policy` one the method's route takes, others the given text.
fn params(route: RouteId, text: &str) -> Vec<String> {
    let policy = match route {
        RouteId::CounterAdd | RouteId::CounterGet => "jobs",
        RouteId::Claim => "bonus",
        RouteId::SemaphoreAcquire | RouteId::SemaphoreRenew | RouteId::SemaphoreRelease | RouteId::SemaphoreCheck => {
            "slots"
        }
        _ => "daily",
    };
    route.spec().params.iter().map(|p| if *p == "policy" { policy.to_string() } else { text.to_string() }).collect()
}

fn call(config: &Config, route: RouteId, params: &[String], input: &Value, options: &Value, props: &str) -> Step {
    let caller = match rpc::caller(props.as_bytes()) {
        Ok(c) => c,
        Err(e) => return Step::Respond(e.response()),
    };
    let params = serde_json::to_vec(params).unwrap();
    let (input, options) = (input.to_string(), options.to_string());
    rpc::call(config, route, &params, input.as_bytes(), options.as_bytes(), &caller, &mut StdRng::seed_from_u64(7))
}

/// The keys a REST body names (EVALSHA sha n keys…, or a plain command's one key).
fn keys(body: &str) -> Vec<String> {
    let b: Value = serde_json::from_str(body).unwrap();
    let parts: Vec<&str> = b.as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    match parts[0] {
        "EVALSHA" | "EVAL" => parts[3..3 + parts[2].parse::<usize>().unwrap()].iter().map(|k| k.to_string()).collect(),
        "PING" => vec![],
        _ => vec![parts[1].to_string()],
    }
}

fn error(step: Step) -> Value {
    match step {
        Step::Respond(r) => serde_json::from_str(&rpc::answer(&r).unwrap_err()).unwrap(),
        Step::Send(ex) | Step::Script(ex) => panic!("sent {}", ex.body()),
    }
}

#[test]
fn every_method_reaches_redis_with_valid_arguments_and_names_a_bad_one() {
    let config = config(None);
    let admin = r#"{"admin": true}"#;
    for spec in rpc::methods() {
        let route = spec.id;
        let name = spec.rpc().unwrap();
        assert_eq!(rpc::method(name), Some(route));
        // A settle's, extend's or release's id is a sealed ticket a reserve answered (any other
        // is a 404 naming id before a call): redcount-cli's reservation_routes drives those.
        if spec.path.starts_with("/api/reservations/") && spec.params.contains(&"id") {
            continue;
        }
        let good = params(route, "alice");
        match call(&config, route, &good, &input(route), &Value::Null, admin) {
            Step::Send(ex) => assert!(!ex.body().is_empty()),
            // The policies need no Redis.
            Step::Respond(r) if route == RouteId::Policies => assert_eq!(r.status, 200),
            Step::Respond(r) => panic!("{name}: {} {}", r.status, r.body),
            Step::Script(_) => unreachable!(),
        }
        // Each parameter missing, of another type, or not an id: a 400 naming it.
        for (i, p) in spec.params.iter().enumerate() {
            let mut args: Vec<Value> = good.iter().map(|s| json!(s)).collect();
            for bad in [json!(null), json!(7), json!({"a": 1}), json!("a:b")] {
                args[i] = bad.clone();
                let caller = rpc::caller(admin.as_bytes()).unwrap();
                let text = serde_json::to_vec(&args).unwrap();
                let input = input(route).to_string();
                let step =
                    rpc::call(&config, route, &text, input.as_bytes(), b"null", &caller, &mut StdRng::seed_from_u64(1));
                let e = error(step);
                // A policy that is not an id may also be "no such policy".
                let status =
                    if *p == "policy" && e["status"] == json!(404) { 400 } else { e["status"].as_u64().unwrap() };
                assert_eq!((status, e["field"].clone()), (400, json!(p)), "{name} {p}={bad}: {e}");
            }
        }
        // Too many arguments, a non-object input, unknown options: 400s naming what.
        let mut more: Vec<Value> = good.iter().map(|s| json!(s)).collect();
        more.push(json!("x"));
        let caller = rpc::caller(admin.as_bytes()).unwrap();
        let step = rpc::call(
            &config,
            route,
            &serde_json::to_vec(&more).unwrap(),
            b"null",
            b"null",
            &caller,
            &mut StdRng::seed_from_u64(1),
        );
        assert_eq!(error(step)["field"], json!("arguments"), "{name}");
        let e = error(call(&config, route, &good, &json!([1]), &Value::Null, admin));
        assert_eq!((e["status"].clone(), e["field"].clone()), (json!(400), json!("body")), "{name}: {e}");
        let e = error(call(&config, route, &good, &input(route), &json!({"idempotency_key": "k"}), admin));
        assert_eq!(e["field"], json!("idempotency_key"), "{name}: {e}");
        let e = error(call(&config, route, &good, &input(route), &json!({"idempotencyKey": 5}), admin));
        assert_eq!(e["field"], json!("idempotencyKey"), "{name}: {e}");
    }
}

#[test]
fn props_give_exactly_the_rights_they_say() {
    let config = config(None);
    let reset = rpc::method("reset").unwrap();
    let p = params(reset, "alice");
    // No props: the public rights (an admin action is refused); admin: true grants it.
    for props in ["", "null", "{}", r#"{"admin": false}"#, r#"{"namespace": "acme"}"#] {
        assert_eq!(error(call(&config, reset, &p, &Value::Null, &Value::Null, props))["status"], json!(401), "{props}");
    }
    assert!(matches!(call(&config, reset, &p, &Value::Null, &Value::Null, r#"{"admin": true}"#), Step::Send(_)));
    // Props that say something else are a misconfigured binding, never fewer or more rights.
    for props in [
        r#"{"admin": "true"}"#,
        r#"{"admin": 1}"#,
        r#"{"namespace": 7}"#,
        r#"{"namespace": "a:b"}"#,
        r#"{"namespace": ""}"#,
        r#"{"namepsace": "acme"}"#,
        r#"{"namespace": "a", "namespace": "b"}"#,
        r#"[1]"#,
        "not json",
    ] {
        let e = error(call(&config, reset, &p, &Value::Null, &Value::Null, props));
        assert_eq!(e["status"], json!(500), "{props}: {e}");
        assert!(e["error"].as_str().unwrap().contains("props"), "{e}");
    }
}

#[test]
fn answers_carry_their_headers_and_errors_their_status() {
    let config = config(None);
    let take = rpc::method("take").unwrap();
    let Step::Send(ex) = call(&config, take, &params(take, "alice"), &json!({"cost": 1}), &Value::Null, "null") else {
        panic!()
    };
    let Step::Respond(r) = ex.receive(200, br#"{"result":[0,5,0,60000,1500]}"#) else { panic!() };
    let got: Value = serde_json::from_str(&rpc::answer(&r).unwrap()).unwrap();
    assert_eq!(got["allowed"], json!(false));
    assert_eq!(got["headers"]["Retry-After"], json!("2"));
    assert_eq!(got["headers"]["RateLimit-Policy"], json!(r#""daily";q=5;w=86400"#));
    // A degraded answer is the policy's decision: returned, not thrown, whatever its status.
    let Step::Send(ex) = call(&config, take, &params(take, "alice"), &json!({"cost": 1}), &Value::Null, "null") else {
        panic!()
    };
    let r = ex.fail("connection refused");
    assert_eq!(r.status, 503);
    let got: Value = serde_json::from_str(&rpc::answer(&r).unwrap()).unwrap();
    assert_eq!((got["allowed"].clone(), got["degraded"].clone()), (json!(false), json!(true)));
    // A plain error keeps every field of its body beside its status.
    let r = ApiResponse::error(404, "no such red packet", Some("id"));
    assert_eq!(rpc::answer(&r).unwrap_err(), r#"{"status":404,"error":"no such red packet","field":"id"}"#);
}

#[test]
fn one_idempotency_key_in_two_scopes_names_two_records_and_two_packets() {
    let config = config(None);
    let create = rpc::method("createPacket").unwrap();
    let body = |props: &str| match call(&config, create, &[], &input(create), &json!({"idempotencyKey": "k1"}), props) {
        Step::Send(ex) => serde_json::from_str::<Value>(ex.body()).unwrap(),
        _ => panic!(),
    };
    let (a, b, plain) = (body(r#"{"namespace": "a"}"#), body(r#"{"namespace": "b"}"#), body("null"));
    let id = |v: &Value| v[3].as_str().unwrap().split("{rp:").nth(1).unwrap().split('}').next().unwrap().to_string();
    assert_ne!(id(&a), id(&b));
    assert_ne!(id(&a), id(&plain));
    // Over HTTP (unscoped) the same key still makes the same packet as before.
    assert_eq!(body("null"), plain);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    // Whatever a scoped caller names (subjects, holders, ids, users, idempotency keys, admin
    // or not), every key a call sends lives under `{namespace}.{scope}:`, and nothing else is
    // sent: a scoped binding cannot reach another scope's keys or the unscoped ones.
    #[test]
    fn a_scoped_caller_reaches_only_its_own_keys(
        method in 0..rpc::methods().count(),
        text in prop_oneof![
            Just("alice".to_string()),
            Just("rc".to_string()),
            Just("b".to_string()),
            "[a-z0-9:{}.*_ -]{0,12}",
            ".{0,8}",
        ],
        holder in prop_oneof![Just("h1".to_string()), "[a-z:{}.]{0,6}"],
        scope in prop_oneof![Just("acme"), Just("b"), Just("rc")],
        namespace in prop_oneof![Just(None), Just(Some("app2"))],
        admin in any::<bool>(),
        key in proptest::option::of("[!-~]{1,12}"),
    ) {
        let config = config(namespace);
        let spec = rpc::methods().nth(method).unwrap();
        let mut input = input(spec.id);
        if let Some(h) = input.get_mut("holder") {
            *h = json!(holder);
        }
        if let Some(u) = input.get_mut("user") {
            *u = json!(holder);
        }
        let props = json!({"namespace": scope, "admin": admin}).to_string();
        let options = key.map_or(Value::Null, |k| json!({"idempotencyKey": k}));
        let within = format!("{}.{scope}:{{", namespace.unwrap_or("rc"));
        match call(&config, spec.id, &params(spec.id, &text), &input, &options, &props) {
            Step::Send(ex) => {
                for k in keys(ex.body()) {
                    prop_assert!(k.starts_with(&within), "{}: key {k} outside {within}", spec.rpc().unwrap());
                    // One hash tag: the scope's own, whatever the arguments held.
                    prop_assert_eq!(k.matches('{').count(), 1, "{}", k);
                }
            }
            // Refused input, or an answer that needs no Redis (the policies).
            Step::Respond(r) => prop_assert!(r.status < 500, "{} {}", r.status, r.body),
            Step::Script(_) => prop_assert!(false, "a script asked for before anything was sent"),
        }
    }
}
