//! A call that changes nothing stores nothing, on every write route: sent with a fresh
//! `Idempotency-Key`, it leaves Redis byte-equal (every key's DUMP and exact expiry, the key
//! count, DEBUG DIGEST), so a flood of fresh keys costs no memory; sent again under its key
//! it is a new call (the same answer while the state is the same, not marked replayed).
//!
//! Nothing here is a list of routes. The write routes are found by asking the router
//! itself (`redcount_api::handle`, in-process, no Redis): every path made of the string
//! literals of redcount-api's source, one policy of each kind, algorithm, storage and mode,
//! and a subject, with each method; what it routes (any answer but 404 or 405) with POST,
//! PUT or DELETE is a write route. The no-change outcomes are made from each policy's
//! kind and settings ([`scenarios`]), and the test fails naming a write route none of them
//! reaches (or a scenario on a route the router does not have). Each scenario then runs
//! against a real server through `redcount serve`'s app (`Backend::Direct`, oneshot).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use axum::body::Body;
use axum::http::Request;
use redcount_api::{ApiRequest, Config, Policy, Step};
use redcount_cli::serve::{Backend, app};
use redcount_core::ops::counter::{Mode, Storage};
use redcount_core::ops::quota::Algorithm;
use serde_json::{Value, json};
use tower::ServiceExt;

mod support;
use support::{diff, server, snapshot};

const ADMIN: &str = "admin-token-of-no-change-0123";
/// The subject of a found route, and its placeholder in a route's name.
const SUBJECT: &str = "s1";
/// The semaphore's lease: long enough to act between two leases' ends (see [`scenarios`]).
const LEASE_MS: u64 = 4000;

/// One policy of every kind, algorithm, storage and mode ([`shape`] says which are needed).
fn policies() -> String {
    let mut p = serde_json::Map::new();
    for storage in ["key", "hash"] {
        for mode in ["clamp", "reject"] {
            p.insert(
                format!("counter-{storage}-{mode}"),
                json!({"kind": "counter", "min": 0, "max": 2, "mode": mode, "storage": storage,
                       "ttl_ms": 3_600_000, "max_step": 5}),
            );
        }
    }
    p.insert("claim".into(), json!({"kind": "claim", "window_ms": 3_600_000}));
    p.insert(
        "fixed".into(),
        json!({"kind": "quota", "algorithm": "fixed", "limit": 2, "window_ms": 1_000_000_000_000i64}),
    );
    p.insert("sliding".into(), json!({"kind": "quota", "algorithm": "sliding", "limit": 2, "window_ms": 3_600_000}));
    p.insert(
        "bucket".into(),
        json!({"kind": "quota", "algorithm": "bucket", "capacity": 2, "refill": 1, "interval_ms": 3_600_000}),
    );
    p.insert(
        "gcra".into(),
        json!({"kind": "quota", "algorithm": "gcra", "rate": 1, "period_ms": 3_600_000, "burst": 2}),
    );
    p.insert("sem".into(), json!({"kind": "semaphore", "limit": 2, "lease_ms": LEASE_MS}));
    p.insert(
        "packets".into(),
        json!({"kind": "redpackets", "max_shares": 10, "max_total_cents": 5000, "ttl_ms": 3_600_000}),
    );
    p.insert("mail".into(), json!({"kind": "inbox", "max_len": 3, "max_age_s": 3600}));
    Value::Object(p).to_string()
}

fn config() -> Config {
    let policies = policies();
    Config::from_env(|name| match name {
        "REDCOUNT_POLICIES" => Some(policies.clone()),
        "REDCOUNT_ADMIN_TOKEN" => Some(ADMIN.to_string()),
        _ => None,
    })
    .expect("the test's policies are valid")
}

/// What makes a policy's no-change outcomes differ. Exhaustive: a new kind, algorithm,
/// storage or mode does not compile until it is given a policy above and scenarios below.
fn shape(p: &Policy) -> String {
    match p {
        Policy::Quota { algorithm, .. } => match algorithm {
            Algorithm::FixedWindow { .. } => "quota fixed",
            Algorithm::SlidingWindow { .. } => "quota sliding",
            Algorithm::TokenBucket { .. } => "quota bucket",
            Algorithm::Gcra { .. } => "quota gcra",
        }
        .into(),
        Policy::Counter { bounds, storage, .. } => format!(
            "counter {} {}",
            match storage {
                Storage::Key => "key",
                Storage::HashField => "hash",
            },
            match bounds.mode {
                Mode::Clamp => "clamp",
                Mode::Reject => "reject",
            }
        ),
        Policy::Semaphore { .. } => "semaphore".into(),
        Policy::Claim { .. } => "claim".into(),
        Policy::RedPackets { .. } => "redpackets".into(),
        Policy::Inbox { .. } => "inbox".into(),
    }
}

// ---------------------------------------------------------------------------------------
// The write routes, as the router has them.

/// The string literals of lowercase letters in redcount-api's source: the route table's
/// words among them (and many that are not, which the router simply does not route).
fn words() -> BTreeSet<String> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../redcount-api/src");
    let mut out = BTreeSet::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let text = std::fs::read(&path).unwrap();
        for (i, _) in text.iter().enumerate().filter(|(_, b)| **b == b'"') {
            let word: Vec<u8> = text[i + 1..].iter().take_while(|b| b.is_ascii_lowercase()).copied().collect();
            if !word.is_empty() && text.get(i + 1 + word.len()) == Some(&b'"') {
                out.insert(String::from_utf8(word).unwrap());
            }
        }
    }
    // The route table's own path words (its paths are whole strings, `/api/quotas/{policy}/…`).
    for spec in redcount_api::ROUTES {
        let literal = spec.path.split('/').filter(|w| !w.is_empty() && *w != "api" && !w.starts_with('{'));
        out.extend(literal.map(String::from));
    }
    assert!(out.len() > 20, "found the words of {}", dir.display());
    out
}

/// How the router answers `method path` from the admin, with no key: `None` when it does not
/// route it (404, 405), else the status it answered (0: it made a call). The body is filled
/// as the router asks: each field a 400 names gets a string, then a number (so a route that
/// reads its body before its policy is still asked about the policy).
fn routed(config: &Config, method: &str, path: &str) -> Option<u16> {
    let auth = format!("Bearer {ADMIN}");
    let mut body = serde_json::Map::new();
    loop {
        let bytes = Value::Object(body.clone()).to_string();
        let req = ApiRequest {
            method,
            path,
            query: "",
            authorization: Some(&auth),
            origin: None,
            idempotency_key: None,
            body: bytes.as_bytes(),
        };
        let r = match redcount_api::handle(config, &req, &mut rand::rng()) {
            Step::Send(_) | Step::Script(_) => return Some(0),
            Step::Respond(r) => r,
        };
        let field = serde_json::from_str::<Value>(&r.body).ok().and_then(|v| v["field"].as_str().map(str::to_string));
        // Not routed: no route (404 naming nothing), no policy of that name, another method.
        // A 404 naming `id` is a route that looked for its object (a reservation's id is
        // checked before anything is sent).
        if r.status == 405 || (r.status == 404 && field.as_deref() != Some("id")) {
            return None;
        }
        match field.filter(|f| r.status == 400 && f != "body" && !body.get(f).is_some_and(Value::is_number)) {
            Some(f) if body.contains_key(&f) => body.insert(f, json!(1)),
            Some(f) => body.insert(f, json!("x1")),
            None => return Some(r.status),
        };
    }
}

/// Every (method, path) the router routes with POST, PUT or DELETE, named with `{s}` for a
/// subject (or id: any segment where a subject is routed too) and the policy's name where a
/// policy is named.
fn write_routes(config: &Config) -> BTreeSet<String> {
    let words = words();
    // One policy of each kind stands for its kind in the search (a route takes a policy by
    // its kind); each route found is then tried with every policy of that kind.
    let mut kinds: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (name, p) in &config.policies {
        kinds.entry(p.kind()).or_default().push(name);
    }
    let second: Vec<&str> = kinds.values().map(|names| names[0]).chain([SUBJECT]).collect();
    // Paths of up to five segments, grown one segment at a time while some row of the route
    // table has the path's shape so far: at a row's word, that word if the source has it; at a
    // parameter, the subject (and, second, a policy of each kind). The table's shapes prune
    // the search; the router alone decides what is routed.
    let mut paths: Vec<Vec<&str>> = Vec::new();
    let mut open: Vec<Vec<&str>> = vec![Vec::new()];
    for at in 0..5 {
        let mut next = Vec::new();
        for prefix in &open {
            let mut options: BTreeSet<&str> = BTreeSet::new();
            for pattern in redcount_api::ROUTES.iter().map(|spec| spec.path.split('/').skip(2).collect::<Vec<_>>()) {
                let fits = pattern.len() > at && pattern.iter().zip(prefix).all(|(p, s)| p.starts_with('{') || p == s);
                match pattern.get(at) {
                    Some(p) if fits && p.starts_with('{') && at == 1 => options.extend(&second),
                    Some(p) if fits && p.starts_with('{') => drop(options.insert(SUBJECT)),
                    Some(p) if fits && words.contains(*p) => drop(options.insert(p)),
                    _ => {}
                }
            }
            next.extend(options.into_iter().map(|s| prefix.iter().copied().chain([s]).collect::<Vec<_>>()));
        }
        paths.extend(next.iter().cloned());
        open = next;
    }
    let path = |segs: &[&str]| format!("/api/{}", segs.join("/"));
    let mut found = BTreeSet::new();
    for method in ["POST", "PUT", "DELETE"] {
        for segs in &paths {
            if routed(config, method, &path(segs)).is_none() {
                continue;
            }
            let variants: Vec<Vec<&str>> = match segs.get(1).and_then(|x| kinds.values().find(|n| n[0] == *x)) {
                Some(names) => names.iter().map(|p| [&segs[..1], &[*p], &segs[2..]].concat()).collect(),
                None => vec![segs.clone()],
            };
            for segs in variants {
                if routed(config, method, &path(&segs)).is_none() {
                    continue;
                }
                // A segment is a subject (or id) where a subject is routed too, to the same
                // route of the table (`…/{s}/refund` is not a tenant's user called refund).
                let id = |segs: &[&str]| redcount_api::Route::parse(method, &path(segs)).map(|r| r.id()).ok();
                let named: Vec<&str> = (0..segs.len())
                    .map(|i| {
                        let mut with_subject = segs.clone();
                        with_subject[i] = SUBJECT;
                        let subject = i > 0
                            && (segs[i] == SUBJECT
                                || (id(&with_subject) == id(&segs)
                                    && routed(config, method, &path(&with_subject)).is_some()));
                        if subject { "{s}" } else { segs[i] }
                    })
                    .collect();
                found.insert(format!("{method} {}", path(&named)));
            }
        }
    }
    found
}

// ---------------------------------------------------------------------------------------
// The no-change outcomes, made from the policies.

/// A step that makes a scenario's state.
#[derive(Debug, Clone)]
enum Given {
    /// A request through the app (`{s}`, `{id}`, `{token}` substituted) and the status it
    /// must answer; `{id}` and `{token}` become the answer's `id` and `fencing_token`.
    Call(&'static str, String, String, Option<&'static str>, u16),
    Sleep(Duration),
    /// Deletes the stored replies (`…:idem:…`): a record that expired while its object lives.
    DropRecords,
}

fn call(method: &'static str, path: impl Into<String>, body: impl Into<String>, status: u16) -> Given {
    Given::Call(method, path.into(), body.into(), None, status)
}

/// A request that must change nothing, and what its answer must say.
#[derive(Debug, Clone)]
struct Scenario {
    /// The route, named as [`write_routes`] names it.
    route: String,
    /// The outcome, for messages.
    outcome: String,
    given: Vec<Given>,
    path: String,
    body: String,
    /// The key to send (a fresh one when `None`).
    key: Option<&'static str>,
    status: u16,
    /// JSON pointer -> the value the answer must have there.
    expect: Vec<(&'static str, Value)>,
}

fn scenario(
    route: String,
    outcome: impl Into<String>,
    given: Vec<Given>,
    body: impl Into<String>,
    status: u16,
) -> Scenario {
    let path = route.split_once(' ').unwrap().1.to_string();
    Scenario { route, outcome: outcome.into(), given, path, body: body.into(), key: None, status, expect: Vec::new() }
}

impl Scenario {
    fn expect(mut self, pointer: &'static str, v: impl Into<Value>) -> Scenario {
        self.expect.push((pointer, v.into()));
        self
    }

    fn path(mut self, path: impl Into<String>) -> Scenario {
        self.path = path.into();
        self
    }
}

/// Every no-change outcome of every write route, from each policy's kind and settings.
fn scenarios(config: &Config) -> Vec<Scenario> {
    let mut out = Vec::new();
    let sleep = |ms: u64| Given::Sleep(Duration::from_millis(ms));
    for (name, policy) in &config.policies {
        match policy {
            Policy::Counter { bounds, .. } => {
                let r = format!("POST /api/counters/{name}/{{s}}");
                let path = format!("/api/counters/{name}/{{s}}");
                let max = bounds.max.expect("the test's counters have a maximum");
                let word = match bounds.mode {
                    Mode::Clamp => "clamped",
                    Mode::Reject => "rejected",
                };
                out.push(scenario(r.clone(), "delta 0", vec![], r#"{"delta":0}"#, 200).expect("/applied", 0));
                out.push(
                    scenario(
                        r.clone(),
                        format!("{word} at the maximum"),
                        vec![call("POST", &path, format!(r#"{{"delta":{max}}}"#), 200)],
                        r#"{"delta":1}"#,
                        200,
                    )
                    .expect("/applied", 0)
                    .expect("/status", word),
                );
                out.push(
                    scenario(r, format!("{word} at the minimum"), vec![], r#"{"delta":-1}"#, 200)
                        .expect("/value", bounds.min)
                        .expect("/applied", 0)
                        .expect("/status", word),
                );
            }
            Policy::Claim { .. } => {
                let r = format!("POST /api/claims/{name}/{{s}}");
                let path = format!("/api/claims/{name}/{{s}}");
                out.push(
                    scenario(r, "already claimed", vec![call("POST", path, "", 200)], "", 200)
                        .expect("/claimed", false),
                );
            }
            Policy::Quota { algorithm, .. } => {
                let take = format!("/api/quotas/{name}/{{s}}");
                let limit = algorithm.limit();
                let all = call("POST", &take, format!(r#"{{"cost":{limit}}}"#), 200);
                out.push(
                    scenario(format!("POST {take}"), "denied", vec![all.clone()], r#"{"cost":1}"#, 200)
                        .expect("/allowed", false),
                );
                out.push(
                    scenario(format!("DELETE {take}"), "nothing to reset", vec![], "", 200).expect("/reset", false),
                );
                let refund = format!("POST {take}/refund");
                out.push(
                    scenario(refund.clone(), "nothing in use", vec![], r#"{"cost":1}"#, 200).expect("/refunded", 0),
                );
                let back = vec![
                    call("POST", &take, r#"{"cost":1}"#, 200),
                    call("POST", format!("{take}/refund"), r#"{"cost":1}"#, 200),
                ];
                out.push(scenario(refund, "all given back already", back, r#"{"cost":1}"#, 200).expect("/refunded", 0));
                // A tenant's user, two segments: the same outcomes at its own keys.
                let user = format!("/api/quotas/{name}/{{s}}/{{s}}");
                let user_all = call("POST", &user, format!(r#"{{"cost":{limit}}}"#), 200);
                out.push(
                    scenario(format!("POST {user}"), "denied", vec![user_all.clone()], r#"{"cost":1}"#, 200)
                        .expect("/allowed", false),
                );
                out.push(
                    scenario(format!("DELETE {user}"), "nothing to reset", vec![], "", 200).expect("/reset", false),
                );
                out.push(
                    scenario(format!("POST {user}/refund"), "nothing in use", vec![], r#"{"cost":1}"#, 200)
                        .expect("/refunded", 0),
                );
                out.push(
                    scenario(
                        "POST /api/decisions/{s}/{s}".to_string(),
                        format!("denied by {name} at the tenant's level"),
                        vec![call(
                            "POST",
                            "/api/decisions/{s}/{s}",
                            json!({"parts": [{"policy": name, "cost": limit, "level": "tenant"}]}).to_string(),
                            200,
                        )],
                        json!({"parts": [{"policy": name, "level": "tenant"}]}).to_string(),
                        200,
                    )
                    .expect("/allowed", false)
                    .expect("/denied_by", name.as_str()),
                );
                reservations(&mut out, name, all.clone(), user_all);
                out.push(
                    scenario(
                        "POST /api/decisions/{s}".to_string(),
                        format!("denied by {name}"),
                        vec![all],
                        json!({"parts": [{"policy": name}]}).to_string(),
                        200,
                    )
                    .expect("/allowed", false)
                    .expect("/denied_by", name.as_str()),
                );
                overrides(&mut out, name);
            }
            Policy::Semaphore { limit, .. } => {
                let sem = |action: &str| format!("/api/semaphores/{name}/{{s}}/{action}");
                let acquire = |h: &str| call("POST", sem("acquire"), json!({"holder": h}).to_string(), 200);
                let holders: Vec<Given> = (0..*limit).map(|i| acquire(&format!("h{i}"))).collect();
                let other = r#"{"holder":"other"}"#;
                out.push(
                    scenario(format!("POST {}", sem("acquire")), "full", holders.clone(), other, 200)
                        .expect("/result", "full"),
                );
                // One lease ended (not yet reclaimed) while another still runs.
                let ended = vec![acquire("h0"), sleep(LEASE_MS / 2 + 200), acquire("h1"), sleep(LEASE_MS / 2)];
                for action in ["renew", "release"] {
                    let r = format!("POST {}", sem(action));
                    out.push(scenario(r.clone(), "never held", vec![], other, 200).expect("/result", "not_holder"));
                    out.push(
                        scenario(r.clone(), "never held, others hold", holders.clone(), other, 200)
                            .expect("/result", "not_holder"),
                    );
                    out.push(
                        scenario(r, "its lease ended", ended.clone(), r#"{"holder":"h0"}"#, 200)
                            .expect("/result", "not_holder"),
                    );
                }
                let check = format!("POST {}", sem("check"));
                let with = |h: &str| r#"{"holder":"HOLDER","fencing_token":{token}}"#.replace("HOLDER", h);
                out.push(
                    scenario(check.clone(), "held", vec![acquire("h0")], with("h0"), 200).expect("/result", "held"),
                );
                let released = vec![acquire("h0"), call("POST", sem("release"), r#"{"holder":"h0"}"#, 200)];
                out.push(scenario(check.clone(), "ended", released, with("h0"), 200).expect("/result", "ended"));
                out.push(
                    scenario(check, "never held", vec![], r#"{"holder":"h0","fencing_token":1}"#, 200)
                        .expect("/result", "never_held"),
                );
                // A tenant's user's semaphore is named by its subject, TENANT/USER.
                for (path, name_of) in [("/api/reservations/{s}", "{s}"), ("/api/reservations/{s}/{s}", "{s}%2F{s}")] {
                    let at = |h: &str| {
                        let acquire = format!("/api/semaphores/{name}/{name_of}/acquire");
                        call("POST", acquire, json!({"holder": h}).to_string(), 200)
                    };
                    let holders: Vec<Given> = (0..*limit).map(|i| at(&format!("h{i}"))).collect();
                    out.push(
                        scenario(
                            format!("POST {path}"),
                            format!("denied by a full {name}"),
                            holders,
                            json!({"parts": [{"policy": name, "holder": "other"}]}).to_string(),
                            200,
                        )
                        .expect("/allowed", false)
                        .expect("/reservation", Value::Null)
                        .expect("/parts/0/result", "full"),
                    );
                    out.push(
                        scenario(
                            format!("POST {path}"),
                            format!("denied: its holder holds a lease of {name}"),
                            vec![at("h0")],
                            json!({"parts": [{"policy": name, "holder": "h0"}]}).to_string(),
                            200,
                        )
                        .expect("/allowed", false)
                        .expect("/parts/0/result", "held"),
                    );
                }
                out.push(
                    scenario(
                        "POST /api/decisions/{s}".into(),
                        format!("denied by a full {name}"),
                        holders,
                        json!({"parts": [{"policy": name, "holder": "other"}]}).to_string(),
                        200,
                    )
                    .expect("/allowed", false)
                    .expect("/denied_by", name.as_str()),
                );
                overrides(&mut out, name);
            }
            Policy::Inbox { max_len, .. } => {
                let r = "POST /api/inbox/{s}/messages".to_string();
                let append =
                    |id: i64| call("POST", "/api/inbox/{s}/messages", json!({"id": id, "body": "hi"}).to_string(), 201);
                out.push(
                    scenario(r, "an id already stored", vec![append(1)], r#"{"id":1,"body":"hi"}"#, 200)
                        .expect("/stored", false),
                );
                let r = "POST /api/inbox/{s}/trim".to_string();
                out.push(scenario(r.clone(), "an empty inbox", vec![], "", 200).expect("/deleted", 0));
                let young: Vec<Given> = (1..=*max_len).map(append).collect();
                out.push(scenario(r, "young messages, within its length", young, "", 200).expect("/deleted", 0));
            }
            Policy::RedPackets { .. } => {
                let create = json!({"policy": name, "total_cents": 100, "count": 1}).to_string();
                let made = call("POST", "/api/redpackets", &create, 201);
                let keyed = Given::Call("POST", "/api/redpackets".into(), create.clone(), Some("the-create"), 201);
                let mut again = scenario(
                    "POST /api/redpackets".into(),
                    "its packet exists, its record gone",
                    vec![keyed, Given::DropRecords],
                    &create,
                    409,
                );
                again.key = Some("the-create");
                out.push(again);
                let r = "POST /api/redpackets/{s}/grab".to_string();
                let grab = |u: &str| call("POST", "/api/redpackets/{id}/grab", json!({"user": u}).to_string(), 200);
                out.push(
                    scenario(r.clone(), "already", vec![made.clone(), grab("alice")], r#"{"user":"alice"}"#, 200)
                        .path("/api/redpackets/{id}/grab")
                        .expect("/outcome", "already"),
                );
                out.push(
                    scenario(r.clone(), "empty", vec![made, grab("bob")], r#"{"user":"alice"}"#, 200)
                        .path("/api/redpackets/{id}/grab")
                        .expect("/outcome", "empty"),
                );
                out.push(
                    scenario(r, "not found", vec![], r#"{"user":"alice"}"#, 404)
                        .path("/api/redpackets/no-such-packet/grab"),
                );
            }
        }
    }
    out
}

/// The reservation routes over the quota `name` (`all` takes it whole for the subject,
/// `user_all` for the tenant's user): a reserve denied and a peek, for a plain subject and a
/// tenant's user; a settle, extend or release of a reservation settled already.
fn reservations(out: &mut Vec<Scenario>, name: &str, all: Given, user_all: Given) {
    let one = json!({"parts": [{"policy": name, "units": 1}]}).to_string();
    let peek = json!({"parts": [{"policy": name, "units": 1}], "peek": true}).to_string();
    for (path, all) in [("/api/reservations/{s}", all), ("/api/reservations/{s}/{s}", user_all)] {
        let r = format!("POST {path}");
        out.push(
            scenario(r.clone(), format!("denied by {name}"), vec![all], &one, 200)
                .expect("/allowed", false)
                .expect("/denied_by", name),
        );
        out.push(scenario(r.clone(), "a peek", vec![], &peek, 200).expect("/allowed", true).expect("/peek", true));
        let reserve = call("POST", path, &one, 200);
        let settled = vec![reserve, call("POST", format!("{path}/{{id}}/settle"), actual(name, 1), 200)];
        for (act, body) in [("settle", actual(name, 0)), ("extend", String::new()), ("release", String::new())] {
            out.push(
                scenario(format!("POST {path}/{{s}}/{act}"), "settled already", settled.clone(), body, 200)
                    .path(format!("{path}/{{id}}/{act}"))
                    .expect("/already_settled", true)
                    .expect("/state", "settled"),
            );
        }
    }
}

fn actual(name: &str, units: i64) -> String {
    json!({"actual": [{"policy": name, "units": units}]}).to_string()
}

/// The override routes of a quota or semaphore policy: a clear of nothing, and a size set to
/// what it already is.
fn overrides(out: &mut Vec<Scenario>, name: &str) {
    let path = format!("/api/overrides/{name}/{{s}}");
    out.push(scenario(format!("DELETE {path}"), "nothing to clear", vec![], "", 200).expect("/cleared", false));
    let set = call("PUT", &path, r#"{"limit":5}"#, 200);
    out.push(
        scenario(format!("PUT {path}"), "the size it has", vec![set], r#"{"limit":5}"#, 200).expect("/replaced", true),
    );
}

// ---------------------------------------------------------------------------------------
// Redis, byte for byte.

// ---------------------------------------------------------------------------------------
// The run.

struct Answer {
    status: u16,
    json: Value,
    replayed: bool,
}

async fn send(app: &axum::Router, method: &str, path: &str, body: &str, key: Option<&str>) -> Answer {
    let mut r = Request::builder().method(method).uri(path).header("authorization", format!("Bearer {ADMIN}"));
    if let Some(k) = key {
        r = r.header("idempotency-key", k);
    }
    let response = app.clone().oneshot(r.body(Body::from(body.to_string())).unwrap()).await.unwrap();
    let status = response.status().as_u16();
    let replayed = response.headers().get("idempotent-replayed").is_some();
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
    Answer { status, json: serde_json::from_slice(&bytes).unwrap_or(Value::Null), replayed }
}

/// `a` and `b` equal, but for durations (`…_ms`), which count down between two calls.
fn same_answer(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter().all(|(k, v)| {
                    y.get(k).is_some_and(|w| match (k.ends_with("_ms"), v.as_i64(), w.as_i64()) {
                        (true, Some(v), Some(w)) => (v - w).abs() <= 60_000,
                        _ => same_answer(v, w),
                    })
                })
        }
        (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(v, w)| same_answer(v, w)),
        _ => a == b,
    }
}

#[tokio::test]
async fn a_call_that_changes_nothing_stores_nothing_on_every_write_route() {
    let config = config();
    let shapes: BTreeSet<String> = config.policies.iter().map(|(_, p)| shape(p)).collect();
    assert_eq!(shapes.len(), config.policies.len(), "one policy of each shape: {shapes:?}");

    let routes = write_routes(&config);
    let all = scenarios(&config);
    let covered: BTreeSet<String> = all.iter().map(|s| s.route.clone()).collect();
    let uncovered: Vec<&String> = routes.difference(&covered).collect();
    assert!(uncovered.is_empty(), "write routes no scenario reaches (give each its no-change outcomes): {uncovered:?}");
    let unknown: Vec<&String> = covered.difference(&routes).collect();
    assert!(unknown.is_empty(), "scenarios on routes the router does not have: {unknown:?} (it has {routes:?})");
    eprintln!("{} write routes, {} no-change scenarios: {routes:?}", routes.len(), all.len());

    let server = server();
    let direct = redcount::Direct::connect(&server.url).await.unwrap();
    let www = redcount_procs::scratch_dir("no-change-www");
    let app = app(config, Backend::Direct(direct), www.clone(), Duration::from_secs(5));
    let mut c = redis::Client::open(server.url.as_str()).unwrap().get_connection().unwrap();

    // The snapshot sees a call that did change something, and the reply it stored.
    let before = snapshot(&mut c);
    let a = send(&app, "POST", "/api/counters/counter-key-clamp/control", r#"{"delta":1}"#, Some("control")).await;
    assert_eq!(a.status, 200);
    let after = snapshot(&mut c);
    assert!(after.keys.keys().any(|k| k.windows(6).any(|w| w == b":idem:")), "a change stores its reply");
    assert_ne!((before.dbsize, &before.digest), (after.dbsize, &after.digest));

    let mut failures = Vec::new();
    for (i, s) in all.iter().enumerate() {
        let _: () = redis::cmd("FLUSHALL").query(&mut c).unwrap();
        let subject = format!("n{i}");
        let (mut id, mut token) = (String::new(), String::new());
        let subst =
            |t: &str, id: &str, token: &str| t.replace("{s}", &subject).replace("{id}", id).replace("{token}", token);
        for g in &s.given {
            match g {
                Given::Call(method, path, body, key, status) => {
                    let a = send(&app, method, &subst(path, &id, &token), &subst(body, &id, &token), *key).await;
                    assert_eq!(
                        a.status, *status,
                        "{} ({}): set-up {method} {path} {body}: {}",
                        s.route, s.outcome, a.json
                    );
                    if let Some(v) = a.json["id"].as_str().or(a.json["reservation"].as_str()) {
                        id = v.to_string();
                    }
                    if let Some(v) = a.json["fencing_token"].as_i64() {
                        token = v.to_string();
                    }
                }
                Given::Sleep(d) => tokio::time::sleep(*d).await,
                Given::DropRecords => {
                    let records: Vec<String> = redis::cmd("KEYS").arg("*:idem:*").query(&mut c).unwrap();
                    assert!(!records.is_empty(), "{}: a record to drop", s.route);
                    let _: () = redis::cmd("DEL").arg(&records).query(&mut c).unwrap();
                }
            }
        }
        let path = subst(&s.path, &id, &token);
        let body = subst(&s.body, &id, &token);
        let key = s.key.map(str::to_string).unwrap_or_else(|| format!("fresh-{i}"));
        let what = format!("{} ({}): {path} {body}", s.route, s.outcome);
        let before = snapshot(&mut c);
        let first = send(&app, s.route.split(' ').next().unwrap(), &path, &body, Some(&key)).await;
        assert_eq!(first.status, s.status, "{what}: {}", first.json);
        for (pointer, v) in &s.expect {
            assert_eq!(first.json.pointer(pointer), Some(v), "{what}: {pointer} in {}", first.json);
        }
        let after = snapshot(&mut c);
        if after != before {
            failures.push(format!("{what}: changed {:?}", diff(&before, &after)));
            continue;
        }
        // Sent again under its key: a new call that finds the same state.
        let again = send(&app, s.route.split(' ').next().unwrap(), &path, &body, Some(&key)).await;
        assert!(
            again.status == first.status && same_answer(&first.json, &again.json) && !again.replayed,
            "{what}: sent again under its key: {} {} (replayed: {}), first {} {}",
            again.status,
            again.json,
            again.replayed,
            first.status,
            first.json
        );
        let last = snapshot(&mut c);
        if last != before {
            failures.push(format!("{what}: sent again, changed {:?}", diff(&before, &last)));
        }
    }
    let _ = std::fs::remove_dir_all(&www);
    assert!(
        failures.is_empty(),
        "{} of {} calls that change nothing wrote:\n{}",
        failures.len(),
        all.len(),
        failures.join("\n")
    );
}
