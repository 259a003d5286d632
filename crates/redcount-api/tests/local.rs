//! Local decisions without I/O: the denial cache and budget leases of [`Local`], driven with
//! REST replies a test writes, at times the test chooses.

use rand::SeedableRng;
use rand::rngs::StdRng;
use redcount_api::{ApiRequest, ApiResponse, Caller, Config, Exchange, Input, Local, Route, Scope, Step, Wait};
use redcount_core::script;
use serde_json::{Value, json};

const ADMIN: &str = "admin-token-0123456789";

const POLICIES: &str = r#"{
  "daily": {"kind": "quota", "algorithm": "fixed", "limit": 3, "window_ms": 86400000, "max_cost": 3},
  "quick": {"kind": "quota", "algorithm": "gcra", "rate": 10, "period_ms": 1000, "burst": 10, "max_cost": 5},
  "raw": {"kind": "quota", "algorithm": "fixed", "limit": 3, "window_ms": 60000, "cache_denials_ms": 0},
  "hot": {"kind": "quota", "algorithm": "fixed", "limit": 1000, "window_ms": 60000, "max_cost": 10, "borrow": {"units": 50, "ms": 1000}},
  "slots": {"kind": "semaphore", "limit": 1, "lease_ms": 60000},
  "bonus": {"kind": "claim", "window_ms": 86400000},
  "jobs": {"kind": "counter", "min": 0, "max": 1}
}"#;

fn config_with(policies: &str) -> Config {
    let vars = [("REDCOUNT_ADMIN_TOKEN", ADMIN), ("REDCOUNT_POLICIES", policies)];
    Config::from_env(|n| vars.iter().find(|(k, _)| *k == n).map(|(_, v)| v.to_string())).unwrap()
}

fn config() -> Config {
    config_with(POLICIES)
}

/// A shell of one local state, at a time the test sets.
struct Shell {
    config: Config,
    local: Local,
    rng: StdRng,
}

fn shell() -> Shell {
    Shell { config: config(), local: Local::new(64, 16, 7), rng: StdRng::seed_from_u64(1) }
}

fn req<'a>(method: &'a str, path: &'a str, body: &'a str, admin: bool) -> ApiRequest<'a> {
    let (path, query) = path.split_once('?').unwrap_or((path, ""));
    let authorization = admin.then_some("Bearer admin-token-0123456789");
    ApiRequest { method, path, query, authorization, origin: None, idempotency_key: None, body: body.as_bytes() }
}

impl Shell {
    fn ask(&mut self, r: ApiRequest<'_>, now: u64) -> Result<Step, Wait> {
        self.local.handle(&self.config, &r, now, true, &mut self.rng)
    }

    /// A request that must go to Redis: its REST body.
    fn sends(&mut self, r: ApiRequest<'_>, now: u64) -> Exchange {
        match self.ask(r, now) {
            Ok(Step::Send(ex)) => ex,
            Ok(Step::Respond(resp)) => panic!("expected a REST call, got {} {}", resp.status, resp.body),
            Ok(Step::Script(_)) => panic!("expected a REST call, got a script step"),
            Err(Wait) => panic!("expected a REST call, got wait"),
        }
    }

    /// A request answered here.
    fn answers(&mut self, r: ApiRequest<'_>, now: u64) -> ApiResponse {
        match self.ask(r, now) {
            Ok(Step::Respond(resp)) => resp,
            Ok(Step::Send(ex)) => panic!("expected an answer from memory, got a REST call: {}", ex.body()),
            Ok(Step::Script(_)) => panic!("expected an answer from memory, got a script step"),
            Err(Wait) => panic!("expected an answer, got wait"),
        }
    }

    /// Redis's reply to `ex`, at `now`: the response.
    fn reply(&mut self, ex: Exchange, result: Value, now: u64) -> ApiResponse {
        let body = json!({ "result": result }).to_string();
        match self.local.after(ex.receive(200, body.as_bytes()), now) {
            Step::Respond(r) => r,
            Step::Send(ex) => panic!("a second call: {}", ex.body()),
            Step::Script(_) => panic!("a script step"),
        }
    }

    /// A take that Redis answers with `result` (sent at `now`, answered 5 ms later).
    fn through(&mut self, r: ApiRequest<'_>, result: Value, now: u64) -> ApiResponse {
        let ex = self.sends(r, now);
        self.reply(ex, result, now + 5)
    }
}

fn take(policy: &str, subject: &str) -> String {
    format!("/api/quotas/{policy}/{subject}")
}

fn json_of(r: &ApiResponse) -> Value {
    serde_json::from_str(&r.body).unwrap()
}

fn header<'a>(r: &'a ApiResponse, name: &str) -> Option<&'a str> {
    r.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
}

fn rest(ex: &Exchange) -> Value {
    serde_json::from_str(ex.body()).unwrap()
}

#[test]
fn a_denial_is_repeated_with_its_wait_shrinking_for_at_most_cache_denials_ms() {
    let mut s = shell();
    let path = take("daily", "alice");
    let first = s.through(req("POST", &path, "", false), json!([0, 3, 0, 50_000, 50_000]), 1_000);
    assert_eq!(json_of(&first)["allowed"], false);
    assert!(json_of(&first).get("cached").is_none(), "Redis's own answer is not marked");
    // A client may repeat it for cache_denials_ms (less than its wait).
    assert_eq!(json_of(&first)["cache_ms"], 1_000);
    // Repeated from memory: its times shrink from when the call was sent (1,000), and what a
    // client may repeat of it is what is left here.
    let again = s.answers(req("POST", &path, "", false), 1_400);
    assert_eq!(
        json_of(&again),
        json!({"allowed": false, "cache_ms": 600, "cached": true, "limit": 3, "remaining": 0, "reset_ms": 49_600, "retry_after_ms": 49_600})
    );
    assert_eq!(again.status, 200);
    assert_eq!(header(&again, "Retry-After"), Some("50"));
    assert_eq!(header(&again, "RateLimit"), Some("\"daily\";r=0;t=50"));
    assert_eq!(again.verdict.map(|v| (v.allowed, v.retry_after_ms)), Some((false, 49_600)));
    // A peek of the same cost learns from it too.
    assert_eq!(json_of(&s.answers(req("GET", &path, "", false), 1_450))["cached"], true);
    // Halfway through its life it is still answered from memory: a flood costs about one call
    // per cache_denials_ms, not two.
    assert_eq!(json_of(&s.answers(req("POST", &path, "", false), 1_500))["retry_after_ms"], 49_500);
    assert_eq!(json_of(&s.answers(req("POST", &path, "", false), 1_874))["cached"], true);
    // In the last eighth of its life one call refreshes it while the others are still answered.
    let refresh = s.sends(req("POST", &path, "", false), 1_875);
    assert_eq!(json_of(&s.answers(req("POST", &path, "", false), 1_960))["cached"], true);
    // Its end is 1,000 ms after the denied call was sent, refreshed or not: then the takes wait
    // for the refresh under way (or, told not to wait, ask Redis).
    assert!(matches!(s.ask(req("POST", &path, "", false), 2_000), Err(Wait)));
    let settled = s.local.settled();
    let r = req("POST", &path, "", false);
    assert!(matches!(s.local.handle(&s.config, &r, 2_000, false, &mut s.rng), Ok(Step::Send(_))));
    // The refresh denies again: repeated for another 1,000 ms from when it was sent (1,875).
    s.reply(refresh, json!([0, 3, 0, 49_500, 49_500]), 2_001);
    assert_ne!(s.local.settled(), settled, "the waiting takes are woken");
    assert_eq!(json_of(&s.answers(req("POST", &path, "", false), 2_002))["retry_after_ms"], 49_373);
    assert_eq!(json_of(&s.answers(req("POST", &path, "", false), 2_749))["retry_after_ms"], 48_626);
    let _again = s.sends(req("POST", &path, "", false), 2_750);
    assert_eq!(json_of(&s.answers(req("POST", &path, "", false), 2_874))["retry_after_ms"], 48_501);
    assert!(matches!(s.ask(req("POST", &path, "", false), 2_875), Err(Wait)));
}

#[test]
fn a_refresh_that_never_answers_holds_the_waiting_takes_for_a_bounded_time() {
    let mut s = shell();
    let path = take("daily", "dora");
    s.through(req("POST", &path, "", false), json!([0, 3, 0, 50_000, 50_000]), 0);
    let _lost = s.sends(req("POST", &path, "", false), 900);
    assert!(matches!(s.ask(req("POST", &path, "", false), 1_000), Err(Wait)));
    assert!(matches!(s.ask(req("POST", &path, "", false), 1_899), Err(Wait)));
    s.sends(req("POST", &path, "", false), 1_900);
}

#[test]
fn a_denial_is_never_repeated_past_its_own_retry_after() {
    let mut s = shell();
    let path = take("quick", "bob");
    s.through(req("POST", &path, r#"{"cost": 2}"#, false), json!([0, 10, 1, 50, 120]), 10_000);
    let r = s.answers(req("POST", &path, r#"{"cost": 2}"#, false), 10_059);
    assert_eq!(json_of(&r)["retry_after_ms"], 61);
    assert_eq!(json_of(&r)["cache_ms"], 61, "a client may repeat it no longer than its wait");
    assert_eq!(json_of(&r)["reset_ms"], 0);
    let refresh = s.sends(req("POST", &path, r#"{"cost": 2}"#, false), 10_105);
    // Past its retry_after_ms while the refresh is under way: never answered from memory.
    assert!(matches!(s.ask(req("POST", &path, r#"{"cost": 2}"#, false), 10_120), Err(Wait)));
    s.reply(refresh, json!([0, 10, 1, 15, 15]), 10_121);
    // That answer came too late to be repeated (its own wait is over): one take asks again,
    // the others wait for it rather than all asking at once.
    s.sends(req("POST", &path, r#"{"cost": 2}"#, false), 10_121);
    assert!(matches!(s.ask(req("POST", &path, r#"{"cost": 2}"#, false), 10_122), Err(Wait)));
}

#[test]
fn only_the_same_subject_policy_cost_and_scope_are_denied_from_memory() {
    let mut s = shell();
    s.through(req("POST", &take("quick", "bob"), r#"{"cost": 3}"#, false), json!([0, 10, 2, 100, 100]), 0);
    // Another cost (smaller: it might pass), subject, or policy goes to Redis.
    s.sends(req("POST", &take("quick", "bob"), r#"{"cost": 2}"#, false), 10);
    s.sends(req("POST", &take("quick", "bo"), r#"{"cost": 3}"#, false), 10);
    s.sends(req("POST", &take("quick", "bobb"), r#"{"cost": 3}"#, false), 10);
    s.sends(req("POST", &take("daily", "bob"), r#"{"cost": 3}"#, false), 10);
    s.answers(req("POST", &take("quick", "bob"), r#"{"cost": 3}"#, false), 10);
    // A scoped caller (the RPC binding's tenant) lives apart from the unscoped one and from
    // other scopes, whatever subject it names.
    let route = || Route::QuotaTake { policy: "quick".into(), subject: "bob".into() };
    let acme = Caller::public().scoped(Scope::new("acme").unwrap());
    let mut call = |caller: &Caller, now| {
        s.local.call(&s.config, route(), Input::Json(br#"{"cost": 3}"#), caller, None, now, true, &mut s.rng)
    };
    let Ok(Step::Send(ex)) = call(&acme, 20) else { panic!("a scope does not see the unscoped denial") };
    assert!(ex.body().contains("rc.acme:{u:bob}"), "{}", ex.body());
    let r = s.local.after(ex.receive(200, br#"{"result":[0,10,2,100,100]}"#), 21);
    assert!(matches!(r, Step::Respond(_)));
    let other = Caller::public().scoped(Scope::new("other").unwrap());
    let mut call = |caller: &Caller, now| {
        s.local.call(&s.config, route(), Input::Json(br#"{"cost": 3}"#), caller, None, now, true, &mut s.rng)
    };
    assert!(matches!(call(&acme, 30), Ok(Step::Respond(_))));
    assert!(matches!(call(&other, 30), Ok(Step::Send(_))));
}

#[test]
fn admissions_peeks_that_admit_and_other_primitives_are_never_repeated() {
    let mut s = shell();
    let path = take("daily", "carol");
    let admitted = s.through(req("POST", &path, "", false), json!([1, 3, 2, 50_000, 0]), 0);
    assert!(json_of(&admitted).get("cache_ms").is_none(), "{}", admitted.body);
    s.sends(req("POST", &path, "", false), 10);
    s.through(req("GET", &path, "", false), json!([1, 3, 2, 50_000, 0]), 20);
    s.sends(req("GET", &path, "", false), 30);
    // A claim taken already, a full semaphore, a counter at its bound: asked again each time.
    let claim = "/api/claims/bonus/carol";
    s.through(req("POST", claim, "", false), json!([0, 40_000]), 40);
    s.sends(req("POST", claim, "", false), 50);
    let acquire = "/api/semaphores/slots/carol/acquire";
    s.through(req("POST", acquire, r#"{"holder": "h2"}"#, false), json!([0, 1, 1, 30_000, 0, 0, 0]), 60);
    s.sends(req("POST", acquire, r#"{"holder": "h2"}"#, false), 70);
    // A policy that says 0 keeps nothing.
    let raw = s.through(req("POST", &take("raw", "carol"), "", false), json!([0, 3, 0, 5_000, 5_000]), 80);
    assert!(json_of(&raw).get("cache_ms").is_none(), "a client may not repeat it: {}", raw.body);
    s.sends(req("POST", &take("raw", "carol"), "", false), 90);
}

#[test]
fn a_take_with_an_idempotency_key_always_asks_redis() {
    let mut s = shell();
    let path = take("daily", "dan");
    s.through(req("POST", &path, "", false), json!([0, 3, 0, 50_000, 50_000]), 0);
    let mut keyed = req("POST", &path, "", false);
    keyed.idempotency_key = Some("k-1");
    // Its stored answer may be an admission: replayed by Redis, never denied from memory.
    let ex = s.sends(keyed, 10);
    assert!(rest(&ex).as_array().unwrap().iter().any(|v| v.as_str().is_some_and(|k| k.contains(":idem:"))));
    // Nor may a client repeat its answer.
    let r = s.reply(ex, json!([0, 3, 0, 50_000, 50_000]), 11);
    assert!(json_of(&r).get("cache_ms").is_none(), "{}", r.body);
    s.answers(req("POST", &path, "", false), 20);
}

#[test]
fn an_override_refund_or_reset_through_this_shell_drops_the_denials_at_once() {
    for (method, route, body) in [
        ("PUT", "/api/overrides/daily/erin", r#"{"limit": 10}"#),
        ("DELETE", "/api/overrides/daily/erin", ""),
        ("POST", "/api/quotas/daily/erin/refund", r#"{"cost": 1}"#),
        ("DELETE", "/api/quotas/daily/erin", ""),
    ] {
        let mut s = shell();
        let path = take("daily", "erin");
        s.through(req("POST", &path, r#"{"cost": 2}"#, false), json!([0, 3, 2, 50_000, 50_000]), 0);
        s.through(req("POST", &path, "", false), json!([0, 3, 0, 50_000, 50_000]), 0);
        s.through(req("POST", &take("daily", "other"), "", false), json!([0, 3, 0, 50_000, 50_000]), 0);
        // A denial under way while the change is made is not kept either.
        let late = s.sends(req("POST", &take("quick", "x"), "", false), 5);
        let in_flight = s.sends(req("POST", &take("daily", "erin"), r#"{"cost": 3}"#, false), 10);
        let admin = s.sends(req(method, route, body, true), 20);
        // Every cost of the subject's policy is asked again; another subject is not.
        s.sends(req("POST", &path, r#"{"cost": 2}"#, false), 21);
        s.sends(req("POST", &path, "", false), 21);
        s.answers(req("POST", &take("daily", "other"), "", false), 21);
        s.reply(in_flight, json!([0, 3, 0, 49_990, 49_990]), 25);
        s.sends(req("POST", &path, r#"{"cost": 3}"#, false), 26);
        s.reply(late, json!([0, 10, 0, 100, 100]), 27);
        s.reply(admin, json!([1]), 30);
        s.sends(req("POST", &take("quick", "x"), "", false), 31);
    }
}

#[test]
fn a_changed_definition_or_a_clock_that_goes_back_forgets_every_denial() {
    let mut s = shell();
    let path = take("daily", "fay");
    s.through(req("POST", &path, "", false), json!([0, 3, 0, 50_000, 50_000]), 1_000);
    s.answers(req("POST", &path, "", false), 1_100);
    // A redeploy raising the limit: another definition, another key.
    s.config =
        config_with(&POLICIES.replace(r#""limit": 3, "window_ms": 86400000"#, r#""limit": 4, "window_ms": 86400000"#));
    s.sends(req("POST", &path, "", false), 1_150);
    s.config = config();
    s.answers(req("POST", &path, "", false), 1_200);
    // The clock goes back: nothing timed by it is trusted.
    s.sends(req("POST", &path, "", false), 900);
}

#[test]
fn a_flood_of_distinct_subjects_never_grows_the_tables() {
    let mut s = shell();
    for i in 0..2_000 {
        let path = take("daily", &format!("s{i}"));
        s.through(req("POST", &path, "", false), json!([0, 3, 0, 50_000, 50_000]), 10 + i);
        let (denials, _) = s.local.sizes();
        assert!(denials <= 64, "{denials} denials kept");
    }
    // A subject asked often stays in its set while a flood passes through the others.
    let mut s = shell();
    let hot = take("daily", "hot");
    s.through(req("POST", &hot, "", false), json!([0, 3, 0, 50_000, 50_000]), 0);
    // (Before the last eighth of its life: then it would be refreshed.)
    for i in 0..80 {
        s.answers(req("POST", &hot, "", false), 10 + 6 * i);
        let path = take("daily", &format!("f{i}"));
        s.through(req("POST", &path, "", false), json!([0, 3, 0, 50_000, 50_000]), 10 + 6 * i);
    }
}

#[test]
fn a_decision_denied_by_its_quotas_is_repeated_but_not_one_with_a_lease_part() {
    let mut s = shell();
    let quotas = r#"{"parts": [{"policy": "daily", "cost": 1}, {"policy": "quick", "cost": 2}]}"#;
    let reply = json!([0, 1, 50_000, 2, 0, 3, 0, 50_000, 50_000, 0, 0, 1, 10, 8, 200, 0, 0, 0]);
    let first = s.through(req("POST", "/api/decisions/gus", quotas, false), reply.clone(), 0);
    assert_eq!(json_of(&first)["denied_by"], "daily");
    assert_eq!(json_of(&first)["cache_ms"], 1_000);
    let again = s.answers(req("POST", "/api/decisions/gus", quotas, false), 300);
    let j = json_of(&again);
    assert_eq!((j["cached"].clone(), j["retry_after_ms"].clone()), (json!(true), json!(49_700)));
    assert_eq!(j["cache_ms"], 700);
    assert_eq!(j["parts"][0]["reset_ms"], 49_700);
    assert_eq!(j["parts"][1]["reset_ms"], 0, "a part's times shrink, never below 0");
    assert_eq!(header(&again, "Retry-After"), Some("50"));
    // Its denying part is a quota denial of its own: a plain take of it is answered too.
    s.answers(req("POST", &take("daily", "gus"), "", false), 300);
    // With a part of cache_denials_ms 0 (here one that admits), a client may not repeat it.
    let strict = r#"{"parts": [{"policy": "daily", "cost": 1}, {"policy": "raw", "cost": 1}]}"#;
    let reply = json!([0, 1, 50_000, 2, 0, 3, 0, 50_000, 50_000, 0, 1, 3, 2, 60_000, 0, 0, 0, 0]);
    let r = s.through(req("POST", "/api/decisions/gil", strict, false), reply, 300);
    assert_eq!(json_of(&r)["denied_by"], "daily", "{}", r.body);
    assert!(json_of(&r).get("cache_ms").is_none(), "{}", r.body);
    // Another list of parts is another decision.
    s.sends(req("POST", "/api/decisions/gus", r#"{"parts": [{"policy": "daily", "cost": 1}]}"#, false), 300);
    // With a lease part, the lease's state is live: asked again every time (its quota part's
    // denial is still learnt).
    let mixed = r#"{"parts": [{"policy": "daily", "cost": 1}, {"policy": "slots", "holder": "h"}]}"#;
    let reply = json!([0, 1, 50_000, 2, 0, 3, 0, 50_000, 50_000, 0, 0, 1, 1, 0, 0, 0, 60_000, 0]);
    let r = s.through(req("POST", "/api/decisions/hal", mixed, false), reply, 400);
    assert!(json_of(&r).get("cache_ms").is_none(), "a client may not repeat it: {}", r.body);
    s.sends(req("POST", "/api/decisions/hal", mixed, false), 500);
    s.answers(req("POST", &take("daily", "hal"), "", false), 500);
    // A decision denied by its lease part alone teaches nothing.
    let reply = json!([0, 2, 30_000, 2, 1, 3, 2, 50_000, 0, 0, 0, 0, 1, 1, 30_000, 30_000, 0, 0]);
    s.through(req("POST", "/api/decisions/ivy", mixed, false), reply, 600);
    s.sends(req("POST", "/api/decisions/ivy", mixed, false), 700);
    s.sends(req("POST", &take("daily", "ivy"), "", false), 700);
}

/// The one background call due now, a renewal: its arguments (a borrow of cost 0) and itself.
fn renewal(s: &mut Shell, now: u64) -> (Vec<String>, Exchange) {
    assert!(s.local.has_returns(), "a renewal is due");
    let mut calls = s.local.due(now);
    assert_eq!(calls.len(), 1);
    let ex = calls.pop().unwrap();
    let args = borrow_args(&ex);
    assert_eq!(args[..4], ["borrow", "1000", "60000", "0"], "a renewal takes nothing");
    (args, ex)
}

/// The renewal due now, lost on its way (no answer).
fn lose_renewal(s: &mut Shell, now: u64) {
    let (_, ex) = renewal(s, now);
    s.local.answered(ex.fail("connection reset"), now);
    assert_eq!(s.local.renewing(), 0);
}

/// The borrow a take became: its script and its arguments.
fn borrow_args(ex: &Exchange) -> Vec<String> {
    let body = rest(ex);
    let parts: Vec<String> = body.as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_string()).collect();
    assert_eq!(parts[1], script::QUOTA_LEASE.sha1(), "{parts:?}");
    parts[6..].to_vec()
}

#[test]
fn a_lease_admits_from_its_stock_then_gives_back_what_is_left() {
    let mut s = shell();
    let path = take("hot", "jo");
    let ex = s.sends(req("POST", &path, "", false), 1_000);
    let args = borrow_args(&ex);
    assert_eq!(args[..5], ["borrow", "1000", "60000", "1", "50"], "the take's cost and up to 50 more");
    let lease = args[5].clone();
    // Redis lends 50 beside the take: 949 left there, 50 here.
    let first = s.reply(ex, json!([1, 1000, 949, 30_000, 0, 50]), 1_005);
    assert_eq!(
        json_of(&first),
        json!({"allowed": true, "limit": 1000, "remaining": 999, "reset_ms": 30_000, "retry_after_ms": 0})
    );
    for i in 0..48 {
        let r = s.answers(req("POST", &path, "", false), 1_010 + i);
        assert_eq!(json_of(&r)["remaining"], 998 - i as i64);
        assert_eq!(json_of(&r)["reset_ms"], 30_000 - 10 - i as i64);
        if i == 24 {
            // Half used: its renewal, lost here (this lease runs alone).
            lose_renewal(&mut s, 1_034);
        }
    }
    // A peek is answered from the stock too, taking nothing.
    assert_eq!(json_of(&s.answers(req("GET", &path, "", false), 1_100))["remaining"], 951);
    assert_eq!(s.local.lent(), 2);
    // Its time is up (1,000 ms after the borrow was sent): the 2 left go back.
    assert!(s.local.due(1_999).is_empty());
    assert_eq!(s.local.next_due(), Some(2_000));
    let back = s.local.due(2_000);
    assert_eq!(back.len(), 1);
    let body: Vec<String> = rest(&back[0]).as_array().unwrap().iter().map(|v| v.as_str().unwrap().into()).collect();
    assert_eq!(body[1], script::QUOTA_LEASE.sha1());
    assert_eq!(body[3..6], ["rc:{u:jo}:q:hot:fw", "rc:{u:jo}:q:hot:ovr", "rc:{u:jo}:q:hot:fw:lent"]);
    assert_eq!(body[6..], ["return", "2", lease.as_str()]);
    assert_eq!(s.local.lent(), 0);
    // The next take borrows again, under a new lease.
    let ex = s.sends(req("POST", &path, "", false), 2_001);
    let again = borrow_args(&ex);
    assert_ne!(again[5], lease);
    assert_eq!(again.len(), 6, "the last lease was given back, not used up: nothing to forget");
}

#[test]
fn a_used_up_lease_is_forgotten_by_the_next_borrow_and_a_lease_never_outlives_its_window() {
    let mut s = shell();
    let path = take("hot", "kim");
    let ex = s.sends(req("POST", &path, r#"{"cost": 2}"#, false), 0);
    let first = borrow_args(&ex)[5].clone();
    // 3 lent; the window ends in 500 ms, before the lease's 1,000.
    s.reply(ex, json!([1, 1000, 10, 500, 0, 3]), 5);
    s.answers(req("POST", &path, r#"{"cost": 2}"#, false), 10);
    lose_renewal(&mut s, 10);
    // One unit left: a take of 2 asks Redis as usual, the unit kept.
    let plain = s.sends(req("POST", &path, r#"{"cost": 2}"#, false), 20);
    assert_eq!(rest(&plain)[1], script::QUOTA_FIXED.sha1());
    s.reply(plain, json!([1, 1000, 8, 480, 0]), 25);
    s.answers(req("POST", &path, "", false), 30);
    assert_eq!(s.local.lent(), 0);
    // Used up: the next borrow names it, so Redis forgets its record.
    let ex = s.sends(req("POST", &path, "", false), 40);
    let args = borrow_args(&ex);
    assert_eq!(args[6], first);
    s.reply(ex, json!([1, 1000, 5, 460, 0, 2]), 45);
    // The window ends 460 ms after this borrow was sent (40), less a guard of 10 ms.
    assert_eq!(s.local.next_due(), Some(490));
    s.answers(req("POST", &path, "", false), 489);
    lose_renewal(&mut s, 489);
    assert!(s.local.due(489).is_empty());
    assert!(matches!(s.ask(req("POST", &path, "", false), 490), Ok(Step::Send(_))));
}

#[test]
fn a_lease_running_low_is_renewed_in_the_background_and_each_lease_gives_back_its_own() {
    let mut s = shell();
    let path = take("hot", "ren");
    let ex = s.sends(req("POST", &path, "", false), 1_000);
    let first = borrow_args(&ex)[5].clone();
    s.reply(ex, json!([1, 1000, 949, 30_000, 0, 50]), 1_005);
    // Until half of the 50 is used, nothing to do in the background.
    for i in 0..24 {
        s.answers(req("POST", &path, "", false), 1_010 + i);
        assert!(!s.local.has_returns());
    }
    s.answers(req("POST", &path, "", false), 1_040);
    let (args, renewal_ex) = renewal(&mut s, 1_040);
    assert_eq!(args[4], "50");
    let second = args[5].clone();
    assert_eq!(s.local.renewing(), 1);
    // While it is in flight, takes are admitted from what is left, and no second one goes.
    for i in 0..15 {
        s.answers(req("POST", &path, "", false), 1_041 + i);
    }
    assert!(s.local.due(1_060).is_empty());
    let r = s.reply(renewal_ex, json!([1, 1000, 899, 29_000, 0, 50]), 1_061);
    assert_eq!(r.status, 200);
    assert_eq!((s.local.renewing(), s.local.lent()), (0, 60), "10 of the first lease, 50 of the next");
    // A peek counts both; Redis's remaining is the renewal's.
    assert_eq!(json_of(&s.answers(req("GET", &path, "", false), 1_062))["remaining"], 959);
    // The first is used up, then the second admits; its renewal forgets the first's record.
    for i in 0..35 {
        let r = s.answers(req("POST", &path, "", false), 1_070 + i);
        assert_eq!(json_of(&r)["remaining"], 958 - i as i64);
    }
    let (args, third) = renewal(&mut s, 1_105);
    assert_eq!(args[6], first, "the used-up lease, forgotten in Redis");
    let third_id = args[5].clone();
    s.reply(third, json!([1, 1000, 849, 28_000, 0, 50]), 1_110);
    assert_eq!(s.local.lent(), 75);
    // A shutdown gives back each lease's own units under its own id.
    let back = s.local.drain();
    let mut returns: Vec<Vec<String>> = back.iter().map(borrow_args).collect();
    returns.sort();
    let mut want = vec![
        vec!["return".to_string(), "25".into(), second.clone()],
        vec!["return".to_string(), "50".into(), third_id.clone()],
    ];
    want.sort();
    assert_eq!(returns, want);
    assert_eq!(s.local.lent(), 0);

    // A renewal answered after the drain is given back at once.
    let mut s = shell();
    let ex = s.sends(req("POST", &path, "", false), 0);
    s.reply(ex, json!([1, 1000, 949, 30_000, 0, 4]), 5);
    s.answers(req("POST", &path, "", false), 6);
    s.answers(req("POST", &path, "", false), 7);
    let (args, late) = renewal(&mut s, 7);
    assert_eq!(borrow_args(&s.local.drain()[0])[..2], ["return", "2"]);
    s.reply(late, json!([1, 1000, 899, 29_000, 0, 50]), 9);
    let back = s.local.due(9);
    assert_eq!(back.len(), 1);
    assert_eq!(borrow_args(&back[0]), ["return", "50", args[5].as_str()]);
    assert_eq!((s.local.lent(), s.local.renewing()), (0, 0));

    // A renewal that fails, or lends nothing (the limit is near): the lease runs on alone, no
    // second renewal of it, and once used up the next take borrows as before.
    for reply in [None, Some(json!([1, 1000, 2, 29_000, 0, 0]))] {
        let mut s = shell();
        let ex = s.sends(req("POST", &path, "", false), 0);
        s.reply(ex, json!([1, 1000, 10, 30_000, 0, 2]), 5);
        s.answers(req("POST", &path, "", false), 6);
        let (_, ex) = renewal(&mut s, 6);
        match reply {
            None => drop(s.local.answered(ex.fail("timed out"), 8)),
            Some(r) => drop(s.reply(ex, r, 8)),
        }
        assert_eq!((s.local.lent(), s.local.renewing()), (1, 0));
        s.answers(req("POST", &path, "", false), 9);
        assert!(!s.local.has_returns());
        assert_eq!(borrow_args(&s.sends(req("POST", &path, "", false), 10))[3], "1");
    }
}

/// A refund's call to Redis: the units it asks Redis to give back.
fn refund_units(ex: &Exchange) -> String {
    let body = rest(ex);
    assert_eq!(body[1], script::QUOTA_REFUND.sha1(), "{body}");
    // After its keys (an Idempotency-Key adds one).
    let at = 3 + body[2].as_str().unwrap().parse::<usize>().unwrap();
    assert_eq!(body[at], "fw");
    body[at + 1].as_str().unwrap().to_string()
}

/// The one return [`Local::drain`] hands out: the units it gives back.
fn drained(s: &mut Shell) -> i64 {
    let back = s.local.drain();
    assert_eq!(back.len(), 1);
    borrow_args(&back[0])[1].parse().unwrap()
}

/// A shell whose lease of `hot` for `subject`, lent `lent` units, admitted three takes (its
/// renewal lost): the shell, the take's path and the refund's.
fn three_taken(subject: &str, lent: i64) -> (Shell, String, String) {
    let mut s = shell();
    let path = take("hot", subject);
    let ex = s.sends(req("POST", &path, "", false), 0);
    s.reply(ex, json!([1, 1000, 10, 30_000, 0, lent]), 5);
    for _ in 0..3 {
        s.answers(req("POST", &path, "", false), 10);
    }
    lose_renewal(&mut s, 10);
    let refund = format!("{path}/refund");
    (s, path, refund)
}

#[test]
fn a_refund_through_a_shell_holding_a_lease_puts_back_what_the_lease_admitted() {
    let (mut s, path, refund) = three_taken("lee", 5);
    // A take of 10 is more than the lease holds (2): Redis denies it, and the denial is
    // repeated from memory.
    s.through(req("POST", &path, r#"{"cost": 10}"#, false), json!([0, 1000, 0, 29_000, 29_000]), 20);
    assert_eq!(json_of(&s.answers(req("POST", &path, r#"{"cost": 10}"#, false), 30))["cached"], true);
    // A refund of 2 of the 3 the lease admitted: back in its stock, no Redis call, and the
    // subject's denials dropped as by any refund.
    let r = s.answers(req("POST", &refund, r#"{"cost": 2}"#, true), 40);
    assert_eq!((r.status, json_of(&r)), (200, json!({"refunded": 2})));
    assert_eq!(s.local.lent(), 4);
    assert!(matches!(s.ask(req("POST", &path, r#"{"cost": 10}"#, false), 41), Ok(Step::Send(_))));
    // A refund of more than the lease has admitted (1) goes to Redis whole, which gives back
    // what it counts and no lease holds; the lease keeps its stock.
    let ex = s.sends(req("POST", &refund, r#"{"cost": 5}"#, true), 50);
    assert_eq!(refund_units(&ex), "5");
    assert_eq!(json_of(&s.reply(ex, json!([3]), 55)), json!({"refunded": 3}));
    assert_eq!(s.local.lent(), 4);
    assert_eq!(json_of(&s.answers(req("POST", &refund, r#"{"cost": 1}"#, true), 60)), json!({"refunded": 1}));
    assert_eq!(s.local.lent(), 5);
    // Nothing more admitted here: to Redis.
    assert_eq!(refund_units(&s.sends(req("POST", &refund, r#"{"cost": 1}"#, true), 61)), "1");
    // One admitted again; a refund with an Idempotency-Key (its retry would give a local part
    // back again) and one of a subject this shell holds no lease of go to Redis all the same.
    s.answers(req("POST", &path, "", false), 70);
    let keyed = ApiRequest { idempotency_key: Some("k-1"), ..req("POST", &refund, r#"{"cost": 1}"#, true) };
    assert_eq!(refund_units(&s.sends(keyed, 71)), "1");
    let other = format!("{}/refund", take("hot", "nobody"));
    assert_eq!(refund_units(&s.sends(req("POST", &other, r#"{"cost": 1}"#, true), 72)), "1");
    assert_eq!(s.local.lent(), 4);
    // Through a Service binding (the RPC path) as through HTTP.
    let route = Route::QuotaRefund { policy: "hot".into(), subject: "lee".into() };
    let step =
        s.local.call(&s.config, route, Input::Json(br#"{"cost": 1}"#), &Caller::admin(), None, 73, true, &mut s.rng);
    let Ok(Step::Respond(r)) = step else { panic!("{step:?}") };
    assert_eq!(json_of(&r), json!({"refunded": 1}));
    assert_eq!(s.local.lent(), 5);
    // Its end gives back its stock, never more than it was lent.
    assert_eq!(drained(&mut s), 5);
    // Nor does a drained shell take refunds: every lease has ended.
    assert_eq!(refund_units(&s.sends(req("POST", &refund, r#"{"cost": 1}"#, true), 80)), "1");
}

#[test]
fn a_refund_of_a_lease_used_up_or_out_of_time_and_of_a_policy_without_leases_goes_to_redis() {
    let (mut s, path, refund) = three_taken("uma", 3);
    assert_eq!(s.local.lent(), 0);
    // Used up: its units are Redis's to give back once it has ended.
    assert_eq!(refund_units(&s.sends(req("POST", &refund, r#"{"cost": 2}"#, true), 20)), "2");
    // A lease whose time is up (1,000 ms after its borrow), not yet given back: to Redis too.
    let ex = s.sends(req("POST", &path, "", false), 30);
    s.reply(ex, json!([1, 1000, 5, 30_000, 0, 4]), 35);
    s.answers(req("POST", &path, "", false), 40);
    assert_eq!(json_of(&s.answers(req("POST", &refund, r#"{"cost": 1}"#, true), 1_029)), json!({"refunded": 1}));
    s.answers(req("POST", &path, "", false), 1_029);
    assert_eq!(refund_units(&s.sends(req("POST", &refund, r#"{"cost": 1}"#, true), 1_030)), "1");
    // A policy without leases: the whole refund to Redis, as before.
    let ex = s.sends(req("POST", &format!("{}/refund", take("daily", "uma")), r#"{"cost": 2}"#, true), 1_031);
    assert_eq!(refund_units(&ex), "2");
}

#[test]
fn one_borrow_at_a_time_the_others_wait_or_ask_redis_themselves() {
    let mut s = shell();
    let path = take("hot", "lee");
    let ex = s.sends(req("POST", &path, "", false), 0);
    assert_eq!(s.ask(req("POST", &path, "", false), 1).unwrap_err(), Wait);
    // One that has waited long enough takes as usual.
    let plain = s.local.handle(&s.config, &req("POST", &path, "", false), 2, false, &mut s.rng);
    let Ok(Step::Send(plain)) = plain else { panic!() };
    assert_eq!(rest(&plain)[1], script::QUOTA_FIXED.sha1());
    s.reply(ex, json!([1, 1000, 900, 30_000, 0, 50]), 5);
    s.answers(req("POST", &path, "", false), 6);
    // A borrow that failed (no answer) lets the next take borrow.
    let mut s = shell();
    let ex = s.sends(req("POST", &path, "", false), 0);
    let r = s.local.answered(ex.fail("connection refused"), 5);
    assert_eq!(r.status, 503);
    assert!(borrow_args(&s.sends(req("POST", &path, "", false), 6)).len() >= 6);
}

#[test]
fn a_denied_borrow_is_asked_of_redis_once_then_repeated() {
    let mut s = shell();
    let path = take("hot", "max");
    let ex = s.sends(req("POST", &path, "", false), 0);
    let r = s.reply(ex, json!([0, 1000, 0, 20_000, 20_000, 0]), 5);
    assert_eq!(json_of(&r)["allowed"], false);
    assert_eq!(s.local.lent(), 0);
    assert_eq!(json_of(&s.answers(req("POST", &path, "", false), 100))["cached"], true);
}

#[test]
fn units_that_cannot_be_used_go_back_at_once() {
    // Answered after a shutdown began.
    let mut s = shell();
    let path = take("hot", "ned");
    let ex = s.sends(req("POST", &path, "", false), 0);
    assert!(s.local.drain().is_empty());
    s.reply(ex, json!([1, 1000, 900, 30_000, 0, 50]), 5);
    let back = s.local.due(6);
    assert_eq!(back.len(), 1);
    assert!(back[0].body().contains(r#""return","50""#), "{}", back[0].body());
    // After a shutdown began a take is a plain take.
    assert_eq!(rest(&s.sends(req("POST", &path, "", false), 7))[1], script::QUOTA_FIXED.sha1());
    // Answered after its window's end.
    let mut s = shell();
    let ex = s.sends(req("POST", &path, "", false), 0);
    s.reply(ex, json!([1, 1000, 900, 8, 0, 50]), 20);
    assert_eq!(s.local.due(21).len(), 1);
    // Held at a shutdown: every lease's units back.
    let mut s = shell();
    for (i, who) in ["a", "b", "c"].into_iter().enumerate() {
        let ex = s.sends(req("POST", &take("hot", who), "", false), 10 * i as u64);
        s.reply(ex, json!([1, 1000, 900, 30_000, 0, 10 + i]), 10 * i as u64 + 5);
    }
    assert_eq!(s.local.lent(), 33);
    let back = s.local.drain();
    assert_eq!(back.len(), 3);
    assert_eq!(s.local.lent(), 0);
    // A clock that goes back ends every lease.
    let mut s = shell();
    let ex = s.sends(req("POST", &path, "", false), 1_000);
    s.reply(ex, json!([1, 1000, 900, 30_000, 0, 50]), 1_005);
    s.sends(req("POST", &path, "", false), 900);
    assert_eq!(s.local.due(900).len(), 1);
}

#[test]
fn evicted_leases_give_their_units_back() {
    let mut s = Shell { config: config(), local: Local::new(64, 4, 9), rng: StdRng::seed_from_u64(2) };
    let mut lent = 0;
    for i in 0..40 {
        let ex = s.sends(req("POST", &take("hot", &format!("e{i}")), "", false), 0);
        s.reply(ex, json!([1, 1000, 900, 30_000, 0, 5]), 1);
        lent += 5;
        assert!(s.local.sizes().1 <= 4);
    }
    let back: i64 =
        s.local.due(2).iter().map(|ex| rest(ex).as_array().unwrap()[7].as_str().unwrap().parse::<i64>().unwrap()).sum();
    assert_eq!(back + s.local.lent(), lent, "every unit lent is held or given back");
}

#[test]
fn borrow_is_for_fixed_windows_and_cache_denials_ms_for_quotas() {
    let refused = |policies: &str| {
        let vars = [("REDCOUNT_POLICIES", policies)];
        Config::from_env(|n| vars.iter().find(|(k, _)| *k == n).map(|(_, v)| v.to_string())).unwrap_err()
    };
    let e = refused(
        r#"{"q": {"kind": "quota", "algorithm": "gcra", "rate": 1, "period_ms": 1000, "burst": 5, "borrow": {"units": 2, "ms": 100}}}"#,
    );
    assert_eq!(e.variable, "REDCOUNT_POLICIES.q.borrow");
    let e = refused(r#"{"q": {"kind": "quota", "limit": 5, "window_ms": 1000, "borrow": {"units": 6, "ms": 100}}}"#);
    assert_eq!(e.variable, "REDCOUNT_POLICIES.q.borrow.units");
    let e = refused(r#"{"q": {"kind": "quota", "limit": 5, "window_ms": 1000, "borrow": {"units": 2, "ms": 30001}}}"#);
    assert_eq!(e.variable, "REDCOUNT_POLICIES.q.borrow.ms");
    let e = refused(r#"{"q": {"kind": "quota", "limit": 5, "window_ms": 1000, "borrow": {"units": 2}}}"#);
    assert_eq!(e.variable, "REDCOUNT_POLICIES.q.borrow.ms");
    let e =
        refused(r#"{"q": {"kind": "quota", "limit": 5, "window_ms": 1000, "borrow": {"units": 2, "ms": 5, "x": 1}}}"#);
    assert_eq!(e.variable, "REDCOUNT_POLICIES.q.borrow.x");
    let e = refused(r#"{"c": {"kind": "claim", "window_ms": 1000, "cache_denials_ms": 5}}"#);
    assert_eq!(e.variable, "REDCOUNT_POLICIES.c.cache_denials_ms");
    let e = refused(r#"{"q": {"kind": "quota", "limit": 5, "window_ms": 1000, "cache_denials_ms": -1}}"#);
    assert_eq!(e.variable, "REDCOUNT_POLICIES.q.cache_denials_ms");
    // The settings are part of the definition; their defaults leave the fingerprint as it was.
    let c = config_with(
        r#"{"a": {"kind": "quota", "limit": 5, "window_ms": 1000}, "b": {"kind": "quota", "limit": 5, "window_ms": 1000, "cache_denials_ms": 1000}, "d": {"kind": "quota", "limit": 5, "window_ms": 1000, "cache_denials_ms": 999}}"#,
    );
    assert_eq!(c.fingerprint("a"), c.fingerprint("b"));
    assert_ne!(c.fingerprint("a"), c.fingerprint("d"));
}

/// A reservation that gives units back through this shell (a settle below what was reserved,
/// a release, a reserve that applies expired reservations' refunds first) drops the
/// subject's denials of its quotas at once, as a refund does; another subject keeps its own.
#[test]
fn units_a_reservation_gives_back_through_this_shell_drop_its_denials() {
    for (act, body) in [
        ("release", "{}"),
        ("settle", r#"{"actual": [{"policy": "daily", "units": 0}]}"#),
        ("extend", r#"{"used": [{"policy": "daily", "units": 0}]}"#),
    ] {
        let mut s = shell();
        let path = take("daily", "erin");
        let reserve =
            s.sends(req("POST", "/api/reservations/erin", r#"{"parts":[{"policy":"daily","units":1}]}"#, false), 0);
        let ends = 60_000;
        let r = s.reply(reserve, json!([1, 0, 0, 1, ends, 1, 1, 3, 0, 50_000, 0, 1, 0]), 0);
        let id = json_of(&r)["reservation"].as_str().unwrap_or_else(|| panic!("no id: {}", r.body)).to_string();
        s.through(req("POST", &path, "", false), json!([0, 3, 0, 50_000, 50_000]), 10);
        s.through(req("POST", &take("daily", "other"), "", false), json!([0, 3, 0, 50_000, 50_000]), 20);
        s.answers(req("POST", &path, "", false), 30);
        let close = s.sends(req("POST", &format!("/api/reservations/erin/{id}/{act}"), body, false), 40);
        s.sends(req("POST", &path, "", false), 41);
        s.answers(req("POST", &take("daily", "other"), "", false), 41);
        drop(close);
        // A reserve (it may apply owed refunds first) drops them too; a peek does not.
        s.through(req("POST", &path, "", false), json!([0, 3, 0, 50_000, 50_000]), 50);
        s.sends(
            req(
                "POST",
                "/api/reservations/erin?peek=true",
                r#"{"parts":[{"policy":"daily","units":1}],"peek":true}"#,
                false,
            ),
            60,
        );
        s.answers(req("POST", &path, "", false), 60);
        s.sends(req("POST", "/api/reservations/erin", r#"{"parts":[{"policy":"daily","units":1}]}"#, false), 70);
        s.sends(req("POST", &path, "", false), 71);
    }
}

/// A request seen again is answered from memory without being routed or parsed again; that
/// shortcut must answer exactly as the whole path does. Two shells take the same random
/// requests (subjects, policies, costs, callers, origins, peeks, refunds and resets, time
/// passing, Redis's answers held and given late, a redeploy with another limit or admin token
/// without a word to the local state), one with each body padded (JSON's blanks)
/// past what the shortcut keeps, so it always takes the whole path: every step must be the same.
#[test]
fn a_request_answered_from_memory_again_is_answered_as_the_whole_path_would() {
    use rand::Rng;
    let seed: u64 = std::env::var("REDCOUNT_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand::random);
    eprintln!("REDCOUNT_SEED={seed}");
    let vars = [
        ("REDCOUNT_ADMIN_TOKEN", ADMIN),
        ("REDCOUNT_POLICIES", POLICIES),
        ("REDCOUNT_CORS_ORIGINS", "https://a.example"),
    ];
    let raised = POLICIES.replace(r#""limit": 1000, "window_ms": 60000"#, r#""limit": 1001, "window_ms": 60000"#);
    let redeploys = [
        vars,
        [vars[0], ("REDCOUNT_POLICIES", raised.as_str()), vars[2]],
        [("REDCOUNT_ADMIN_TOKEN", "another-admin-token-0123"), vars[1], vars[2]],
    ];
    let config_of = |vars: &[(&str, &str); 3]| {
        Config::from_env(|n| vars.iter().find(|(k, _)| *k == n).map(|(_, v)| v.to_string())).unwrap()
    };
    let config = || config_of(&vars);
    let mut shells =
        [0, 1].map(|_| Shell { config: config(), local: Local::new(64, 16, 7), rng: StdRng::seed_from_u64(1) });
    let mut r = StdRng::seed_from_u64(seed);
    let mut now = 0;
    let mut held: Vec<(Exchange, Exchange)> = Vec::new();
    let (mut from_memory, mut repeats) = (0, 0);
    for step in 0..4_000 {
        now += [0, 0, 1, 5, 40, 300][r.random_range(0..6)];
        let (subject, policy) =
            (["s0", "s1"][r.random_range(0..2)], ["daily", "quick", "hot", "raw"][r.random_range(0..4)]);
        let (method, path, body) = match r.random_range(0..20) {
            0 => ("POST", format!("/api/quotas/{policy}/{subject}/refund"), r#"{"cost": 1}"#),
            1 => ("DELETE", take(policy, subject), "{}"),
            2..=4 => ("GET", take(policy, subject), "{}"),
            n => ("POST", take(policy, subject), if n % 2 == 0 { "{}" } else { r#"{"cost": 2}"# }),
        };
        let admin = r.random_bool(0.2);
        let origin = [None, Some("https://a.example"), Some("https://b.example")][r.random_range(0..3)];
        let may_wait = r.random_bool(0.8);
        if r.random_bool(0.01) {
            let vars = &redeploys[r.random_range(0..redeploys.len())];
            shells.iter_mut().for_each(|s| s.config = config_of(vars));
        }
        let padded = format!("{body}{}", " ".repeat(600));
        let what = format!("REDCOUNT_SEED={seed}, step {step}: {method} {path} {body} at {now}");
        let [a, b] = [body, padded.as_str()].map(|body| ApiRequest { origin, ..req(method, &path, body, admin) });
        let [sa, sb] = &mut shells;
        let steps = (
            sa.local.handle(&sa.config, &a, now, may_wait, &mut sa.rng),
            sb.local.handle(&sb.config, &b, now, may_wait, &mut sb.rng),
        );
        match steps {
            (Ok(Step::Respond(x)), Ok(Step::Respond(y))) => {
                assert_eq!((x.status, &x.body, &x.headers), (y.status, &y.body, &y.headers), "{what}");
                from_memory += usize::from(x.body.contains("cached") || x.body.contains("\"allowed\":true"));
                // A repeat may be answered again at the same ms without asking (the worker's
                // shell does): the whole path, asked again, answers the same, and the shell
                // that did not ask stays in step with the one that did.
                if sa.local.repeated() {
                    repeats += 1;
                    assert!(x.body.contains("\"cached\":true"), "{what}: {}", x.body);
                    for _ in 0..r.random_range(1..3) {
                        let Ok(Step::Respond(z)) = sb.local.handle(&sb.config, &b, now, may_wait, &mut sb.rng) else {
                            panic!("{what}: a repeat asked again is not answered from memory");
                        };
                        assert_eq!((x.status, &x.body, &x.headers), (z.status, &z.body, &z.headers), "{what}: again");
                    }
                }
            }
            (Ok(Step::Send(x)), Ok(Step::Send(y))) => {
                assert_eq!(x.body(), y.body(), "{what}");
                held.push((x, y));
            }
            (Err(Wait), Err(Wait)) => {}
            (x, y) => panic!("{what}: {:?} against {:?}", x.map(|s| step_kind(&s)), y.map(|s| step_kind(&s))),
        }
        // Redis answers some of the calls under way, in any order; a quota's answer at random.
        while !held.is_empty() && r.random_bool(0.6) {
            let (x, y) = held.swap_remove(r.random_range(0..held.len()));
            let call = rest(&x);
            let sha = call[1].as_str().unwrap_or("").to_string();
            let (allowed, remaining, retry) =
                if r.random_bool(0.5) { (1, 2, 0) } else { (0, 0, r.random_range(1..3_000)) };
            let result = if sha == script::QUOTA_LEASE.sha1() && call[6] == "borrow" {
                json!([allowed, 1000, remaining, 30_000, retry, if allowed == 1 { r.random_range(0..4) } else { 0 }])
            } else if sha == script::QUOTA_FIXED.sha1() || sha == script::QUOTA_GCRA.sha1() {
                json!([allowed, 3, remaining, 30_000, retry])
            } else {
                // (Refunds, resets, returns: lost, as a call can be.)
                shells[0].local.answered(x.fail("lost"), now);
                shells[1].local.answered(y.fail("lost"), now);
                continue;
            };
            let [x, y] = [(0, x), (1, y)].map(|(k, ex)| shells[k].reply(ex, result.clone(), now));
            assert_eq!((x.status, &x.body, &x.headers), (y.status, &y.body, &y.headers), "{what}: the reply");
        }
        if r.random_bool(0.05) {
            let [x, y] =
                [0, 1].map(|k| shells[k].local.due(now).iter().map(|ex| ex.body().to_string()).collect::<Vec<_>>());
            assert_eq!(x, y, "{what}: due");
        }
    }
    assert!(from_memory > 100, "only {from_memory} answers from memory (REDCOUNT_SEED={seed})");
    assert!(repeats > 20, "only {repeats} repeats (REDCOUNT_SEED={seed})");
}

fn step_kind(s: &Step) -> &'static str {
    match s {
        Step::Respond(_) => "respond",
        Step::Send(_) => "send",
        Step::Script(_) => "script",
    }
}

#[test]
fn a_tenant_level_denial_and_a_user_level_one_of_a_subject_are_apart() {
    let tenant = r#"{"parts": [{"policy": "daily", "level": "tenant"}]}"#;
    let user = r#"{"parts": [{"policy": "daily"}]}"#;
    let reply = json!([0, 1, 50_000, 1, 0, 3, 0, 50_000, 50_000, 0, 0]);
    // The tenant's counter denied: the user's own take, peek and decision still ask Redis.
    let mut s = shell();
    let first = s.through(req("POST", "/api/decisions/acme/u1", tenant, false), reply.clone(), 0);
    assert_eq!(json_of(&first)["denied_by"], "daily", "{}", first.body);
    assert_eq!(json_of(&s.answers(req("POST", "/api/decisions/acme/u1", tenant, false), 100))["cached"], true);
    s.sends(req("POST", &take("daily", "acme/u1"), "", false), 100);
    s.sends(req("GET", &take("daily", "acme/u1"), "", false), 100);
    s.sends(req("POST", "/api/decisions/acme/u1", user, false), 100);
    // The user's counter denied: the tenant-level decision still asks Redis.
    let mut s = shell();
    s.through(req("POST", "/api/decisions/acme/u1", user, false), reply, 0);
    s.answers(req("POST", &take("daily", "acme/u1"), "", false), 100);
    s.sends(req("POST", "/api/decisions/acme/u1", tenant, false), 100);
}

/// Units given back to a tenant's own counter (a reservation of `TENANT/USER` closed) may admit
/// any user of the tenant: every user's tenant-level denials of that policy go at once in this
/// shell; a user-level denial, and another tenant's, stay.
#[test]
fn units_given_back_to_a_tenant_drop_every_users_tenant_level_denials() {
    let tenant = r#"{"parts": [{"policy": "daily", "level": "tenant"}]}"#;
    let denied = json!([0, 1, 50_000, 1, 0, 3, 0, 50_000, 50_000, 0, 0]);
    for act in ["release", "settle", "extend"] {
        let mut s = shell();
        let parts = r#"{"parts":[{"policy":"daily","units":1,"level":"tenant"}]}"#;
        let reserve = s.sends(req("POST", "/api/reservations/acme/u2", parts, false), 0);
        let r = s.reply(reserve, json!([1, 0, 0, 1, 60_000, 1, 1, 3, 0, 50_000, 0, 1, 0]), 0);
        let id = json_of(&r)["reservation"].as_str().unwrap_or_else(|| panic!("no id: {}", r.body)).to_string();
        s.through(req("POST", "/api/decisions/acme/u1", tenant, false), denied.clone(), 5);
        s.through(req("POST", "/api/decisions/acmex/u1", tenant, false), denied.clone(), 10);
        s.through(req("POST", &take("daily", "acme/u3"), "", false), json!([0, 3, 0, 50_000, 50_000]), 15);
        for path in ["/api/decisions/acme/u1", "/api/decisions/acmex/u1"] {
            s.answers(req("POST", path, tenant, false), 20);
        }
        s.answers(req("POST", &take("daily", "acme/u3"), "", false), 20);
        let body = match act {
            "settle" => r#"{"actual": [{"policy": "daily", "units": 0}]}"#,
            "extend" => r#"{"used": [{"policy": "daily", "units": 0}]}"#,
            _ => "{}",
        };
        let close = s.sends(req("POST", &format!("/api/reservations/acme/u2/{id}/{act}"), body, false), 30);
        s.sends(req("POST", "/api/decisions/acme/u1", tenant, false), 31);
        s.answers(req("POST", "/api/decisions/acmex/u1", tenant, false), 31);
        s.answers(req("POST", &take("daily", "acme/u3"), "", false), 31);
        drop(close);
    }
}
