//! Routing, authentication, body and query parsing, and each route's response.

use alloc::borrow::ToOwned;
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use rand_core::RngCore;
use serde_json::{Map, Value as Json, json};

use super::{ApiRequest, ApiResponse, Config, Exchange, Field, MAX_BODY, Policy, Step, same_secret};
use redcount_core::command::Command;
use redcount_core::error::{InputError, ShapeError};
use redcount_core::ops::claim::Claim;
use redcount_core::ops::counter::{AddCounter, CounterStatus, GetCounter};
use redcount_core::ops::decision::{self, Decide, LeaseResult, Part, PartOutcome};
use redcount_core::ops::inbox::{Append, Read, Trim};
use redcount_core::ops::quota::{OverrideQuota, RefundQuota, ResetQuota, TakeQuota};
use redcount_core::ops::redpacket::{self, Create, Grab, GrabOutcome, ReadGrabs, ReadStatus};
use redcount_core::ops::semaphore::{Action, SemaphoreResult, UpdateLease};
use redcount_core::script::Request;
use redcount_core::split;
use redcount_core::validate;
use redcount_core::value::Value;
use redcount_core::{Operation, ops};

type Routed = Result<Step, ApiResponse>;

/// The request's `Idempotency-Key`, checked: 1 to 255 visible ASCII characters.
fn idempotency(req: &ApiRequest<'_>) -> Result<Option<ops::Idempotency>, ApiResponse> {
    let Some(k) = req.idempotency_key else { return Ok(None) };
    if k.is_empty() || k.len() > 255 || !k.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(ApiResponse::error(
            400,
            "Idempotency-Key must be 1 to 255 visible ASCII characters",
            Some("Idempotency-Key"),
        ));
    }
    // The fingerprint is of the parsed request, so `{"delta": 1}` and `{"delta":1}` are one
    // request (objects are re-serialised with sorted keys).
    // No body is the empty object: routes whose body is optional read it so.
    let canonical = match serde_json::from_slice::<Json>(req.body) {
        Ok(json) => json.to_string().into_bytes(),
        Err(_) if req.body.iter().all(u8::is_ascii_whitespace) => b"{}".to_vec(),
        Err(_) => req.body.to_vec(),
    };
    Ok(Some(ops::Idempotency::new(&scope(k, req.method, &canonical_path(req.path)), &canonical)))
}

/// What makes two uses of one `Idempotency-Key` the same request: the method, the route
/// and the key (the layout is part of the stored data: red-packet ids derive from it).
fn scope(key: &str, method: &str, path: &str) -> Vec<u8> {
    let mut scope = Vec::with_capacity(method.len() + path.len() + key.len() + 2);
    scope.extend_from_slice(method.as_bytes());
    scope.push(b'\n');
    scope.extend_from_slice(path.as_bytes());
    scope.push(b'\n');
    scope.extend_from_slice(key.as_bytes());
    scope
}

/// The path as routing sees it: every segment percent-decoded, then encoded one way (only
/// bytes outside `A-Z a-z 0-9 - . _ ~` escaped, in upper-case hex). `/api/%72edpackets` and
/// `/api/redpackets` are one route, so one scope for an idempotency key: a client or proxy
/// that re-encodes the path between retries must not apply the request twice.
fn canonical_path(path: &str) -> String {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = String::with_capacity(path.len());
    for (i, raw) in path.split('/').enumerate() {
        if i > 0 {
            out.push('/');
        }
        let bytes = redcount_core::text::percent_decode(raw).unwrap_or_else(|| raw.as_bytes().to_vec());
        for b in bytes {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
                out.push(char::from(b));
            } else {
                out.push('%');
                out.push(char::from(HEX[usize::from(b >> 4)]));
                out.push(char::from(HEX[usize::from(b & 15)]));
            }
        }
    }
    out
}

#[cfg(test)]
mod canonical_path_tests {
    #[test]
    fn one_route_one_scope() {
        let p = super::canonical_path;
        assert_eq!(p("/api/%72edpackets"), p("/api/redpackets"));
        assert_eq!(p("/api/quot%61s/d%61ily/u%2d1"), p("/api/quotas/daily/u-1"));
        assert_eq!(p("/api/inbox/a%2fb"), "/api/inbox/a%2Fb");
        assert_ne!(p("/api/inbox/a%2fb"), p("/api/inbox/a/b"), "an encoded slash stays inside its segment");
    }
}

/// Applies the idempotency key, if the request has one, to a write operation.
macro_rules! replayable {
    ($req:expr, $op:expr) => {{
        let op = $op;
        ops::Idempotent::new(op, idempotency($req)?)
    }};
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Caller {
    Public,
    Admin,
}

/// Longest path segment looked at (ids are at most 64; anything longer is refused early).
const MAX_SEGMENT: usize = 256;

pub(super) fn route<R: RngCore + ?Sized>(config: &Config, req: &ApiRequest<'_>, rng: &mut R) -> Step {
    match dispatch(config, req, rng) {
        Ok(step) => step,
        Err(response) => Step::Respond(response),
    }
}

fn dispatch<R: RngCore + ?Sized>(config: &Config, req: &ApiRequest<'_>, rng: &mut R) -> Routed {
    let Some(rest) = req.path.strip_prefix("/api/") else {
        return Err(ApiResponse::error(404, "not found", None));
    };
    let segs = segments(rest)?;
    let segs: Vec<&str> = segs.iter().map(String::as_str).collect();
    if req.body.len() > MAX_BODY {
        return Err(ApiResponse::error(413, format!("body larger than {MAX_BODY} bytes"), None));
    }
    if req.method == "OPTIONS" {
        return Ok(Step::Respond(preflight(config, req.origin)));
    }
    let caller = authenticate(config, req.authorization)?;
    let m = req.method;
    let mut routed = match segs.as_slice() {
        ["health"] => {
            allow(m, &["GET", "HEAD"])?;
            Ok(Step::Send(Exchange::new(Ping, |_, ()| {
                ApiResponse::json(200, json!({"ok": true, "rest": "reachable", "redis": "reachable"}))
            })))
        }
        ["policies"] => {
            allow(m, &["GET", "HEAD"])?;
            let mut map = Map::new();
            for (name, p) in &config.policies {
                map.insert(name.clone(), p.to_json());
            }
            Ok(respond(200, json!({ "policies": map })))
        }
        ["counters", policy, subject] => counters(config, req, caller, policy, subject),
        ["claims", policy, subject] => {
            allow(m, &["POST"])?;
            body(req, &[])?;
            let window_ms = find(config, policy, "claim", |p| match *p {
                Policy::Claim { window_ms } => Some(window_ms),
                _ => None,
            })?;
            let op = replayable!(req, Claim::new(policy, subject, window_ms).map_err(|e| ApiResponse::input(&e))?);
            Ok(Step::Send(Exchange::new(op, |_, o| {
                ApiResponse::json(200, json!({"claimed": o.claimed, "retry_after_ms": o.window_left_ms}))
            })))
        }
        ["quotas", policy, subject] => quotas(config, req, caller, policy, subject),
        ["quotas", policy, subject, "refund"] => refund(config, req, caller, policy, subject),
        ["overrides", policy, subject] => overrides(config, req, caller, policy, subject),
        ["decisions", subject] => decisions(config, req, caller, subject),
        ["semaphores", policy, name, action] => {
            allow(m, &["POST"])?;
            let fields: &[&str] = if *action == "check" { &["holder", "fencing_token"] } else { &["holder"] };
            let b = body(req, fields)?;
            let action = match *action {
                "acquire" => Action::Acquire,
                "renew" => Action::Renew,
                "release" => Action::Release,
                "check" => Action::Check { fencing_token: b.int("fencing_token", 1, validate::MAX_SAFE, None)? },
                _ => {
                    return Err(ApiResponse::error(
                        404,
                        "semaphore actions are acquire, renew, release and check",
                        None,
                    ));
                }
            };
            let holder = b.string("holder")?;
            let (limit, lease_ms) = find(config, policy, "semaphore", |p| match *p {
                Policy::Semaphore { limit, lease_ms } => Some((limit, lease_ms)),
                _ => None,
            })?;
            let op = replayable!(
                req,
                UpdateLease::new(policy, name, action, &holder, limit, lease_ms).map_err(|e| ApiResponse::input(&e))?
            );
            Ok(Step::Send(Exchange::new(op, |_, o| {
                let result = match o.result {
                    SemaphoreResult::Acquired => "acquired",
                    SemaphoreResult::Renewed => "renewed",
                    SemaphoreResult::Full => "full",
                    SemaphoreResult::Released => "released",
                    SemaphoreResult::NotHolder => "not_holder",
                    SemaphoreResult::Held => "held",
                    SemaphoreResult::Ended => "ended",
                    SemaphoreResult::NeverHeld => "never_held",
                };
                ApiResponse::json(
                    200,
                    json!({
                        "result": result,
                        "holding": matches!(
                            o.result,
                            SemaphoreResult::Acquired | SemaphoreResult::Renewed | SemaphoreResult::Held
                        ),
                        "in_use": o.in_use, "limit": o.limit,
                        "earliest_end_ms": o.earliest_end_ms, "lease_ms": o.lease_ms,
                        "fencing_token": o.fencing_token
                    }),
                )
            })))
        }
        ["inbox", user, rest @ ..] => inbox(config, req, caller, user, rest),
        ["redpackets"] => {
            allow(m, &["POST"])?;
            create_packet(config, req, caller, rng)
        }
        ["redpackets", id] => {
            allow(m, &["GET", "HEAD"])?;
            let op = ReadStatus::new(id).map_err(|e| ApiResponse::input(&e))?;
            let id = (*id).to_owned();
            Ok(Step::Send(Exchange::new(op, move |_, o| match o {
                Some(s) => ApiResponse::json(
                    200,
                    json!({
                        "id": id, "total_cents": s.total, "count": s.count, "remaining": s.remaining,
                        "claimed": s.grabbed, "claimed_cents": s.grabbed_sum,
                        "created_ms": s.created_ms, "expires_ms": s.expires_ms
                    }),
                ),
                None => not_found_packet(),
            })))
        }
        ["redpackets", id, "grab"] => {
            allow(m, &["POST"])?;
            let b = body(req, &["user"])?;
            let user = b.string("user")?;
            let op = Grab::new(id, &user).map_err(|e| ApiResponse::input(&e))?;
            Ok(Step::Send(Exchange::new(op, |_, o| match o {
                GrabOutcome::Won { amount, index, remaining } => ApiResponse::flat(&mut [
                    ("outcome", Field::Word("won")),
                    ("amount_cents", Field::Int(amount)),
                    ("amount", Field::Int(amount)),
                    ("index", Field::Int(index)),
                    ("remaining", Field::Int(remaining)),
                ]),
                GrabOutcome::Already { amount, index } => ApiResponse::flat(&mut [
                    ("outcome", Field::Word("already")),
                    ("amount_cents", Field::Int(amount)),
                    ("amount", Field::Int(amount)),
                    ("index", Field::Int(index)),
                ]),
                GrabOutcome::Empty => {
                    ApiResponse::flat(&mut [("outcome", Field::Word("empty")), ("remaining", Field::Int(0))])
                }
                GrabOutcome::NotFound => not_found_packet(),
            })))
        }
        ["redpackets", id, "claims"] => {
            allow(m, &["GET", "HEAD"])?;
            let q = Query::parse(req.query, &["offset", "limit"])?;
            let offset = q.int("offset", 0, split::MAX_COUNT, 0)?;
            let limit = q.int("limit", 1, redpacket::MAX_PAGE, 100)?;
            let op = ReadGrabs::new(id, offset, limit).map_err(|e| ApiResponse::input(&e))?;
            Ok(Step::Send(Exchange::new(op, |_, claims| {
                let list: Vec<Json> = claims
                    .into_iter()
                    .map(|c| json!({"user": c.user, "amount_cents": c.amount, "amount": c.amount, "index": c.index, "at_ms": c.at_ms}))
                    .collect();
                ApiResponse::json(200, json!({ "claims": list }))
            })))
        }
        _ => Err(ApiResponse::error(404, "no such route", None)),
    };
    // A decision route answers its policy's declared failure mode, found by the decoded
    // names routing used: `/api/quot%61s/d%61ily/…` gets what `/api/quotas/daily/…` gets.
    if let Ok(Step::Send(ex)) = &mut routed {
        let decision = match (segs.as_slice(), m) {
            (["quotas", policy, _], "POST" | "GET" | "HEAD") => Some(("allowed", *policy)),
            (["claims", policy, _], "POST") => Some(("claimed", *policy)),
            (["semaphores", policy, _, _], "POST") => Some(("holding", *policy)),
            _ => None,
        };
        if let Some((field, policy)) = decision {
            let mode = config.failure_mode(policy);
            // Leases always deny: a lease cannot be granted without Redis.
            ex.degrade = Some((field, mode.allow && field != "holding"));
            ex.timeout_ms = mode.timeout_ms;
        } else if ex.timeout_ms.is_none() {
            // Every other call of a policy waits at most its timeout_ms too (a decision's
            // budget and a packet create's are set where they are built).
            ex.timeout_ms = match segs.as_slice() {
                ["counters" | "quotas" | "overrides", policy, ..] => config.failure_mode(policy).timeout_ms,
                ["inbox", ..] => config.first_of("inbox").and_then(|(name, _)| config.failure_mode(name).timeout_ms),
                ["redpackets", _, ..] => packet_timeout(config),
                _ => None,
            };
        }
    }
    routed
}

/// The bound of a call on a red packet by its id, which names no policy: the longest
/// `timeout_ms` of the redpackets policies when every one declares one (so no packet's call
/// is cut shorter than its own policy says), else none.
fn packet_timeout(config: &Config) -> Option<u32> {
    let mut longest = None;
    for (name, p) in &config.policies {
        if p.kind() == "redpackets" {
            let t = config.failure_mode(name).timeout_ms?;
            longest = longest.max(Some(t));
        }
    }
    longest
}

fn respond(status: u16, body: Json) -> Step {
    Step::Respond(ApiResponse::json(status, body))
}

fn not_found_packet() -> ApiResponse {
    ApiResponse::error(404, "no such red packet (unknown or expired)", Some("id"))
}

/// Percent-decodes the path segments; empty segments (`//`) match no route.
fn segments(rest: &str) -> Result<Vec<String>, ApiResponse> {
    let bad = |why: &str| ApiResponse::error(400, format!("path: {why}"), Some("path"));
    let mut out = Vec::new();
    for raw in rest.split('/') {
        if raw.len() > 3 * MAX_SEGMENT {
            return Err(bad("a segment is too long"));
        }
        let bytes = redcount_core::text::percent_decode(raw).ok_or_else(|| bad("malformed percent-encoding"))?;
        let s = String::from_utf8(bytes).map_err(|_| bad("not UTF-8"))?;
        if s.len() > MAX_SEGMENT {
            return Err(bad("a segment is too long"));
        }
        out.push(s);
    }
    if out.iter().any(String::is_empty) {
        return Err(ApiResponse::error(404, "no such route", None));
    }
    Ok(out)
}

fn allow(method: &str, allowed: &[&str]) -> Result<(), ApiResponse> {
    if allowed.contains(&method) {
        return Ok(());
    }
    let mut r = ApiResponse::error(405, format!("method {method} not allowed here"), None);
    r.headers.push(("Allow", allowed.join(", ")));
    Err(r)
}

fn authenticate(config: &Config, header: Option<&str>) -> Result<Caller, ApiResponse> {
    let Some(h) = header else { return Ok(Caller::Public) };
    let token = redcount_core::text::bearer_token(h).unwrap_or("");
    match &config.admin_token {
        Some(admin) if !token.is_empty() && same_secret(token.as_bytes(), admin.as_bytes()) => Ok(Caller::Admin),
        _ => Err(ApiResponse::error(401, "invalid token (send none for public access, or the admin token)", None)),
    }
}

fn require_admin(caller: Caller) -> Result<(), ApiResponse> {
    match caller {
        Caller::Admin => Ok(()),
        Caller::Public => Err(ApiResponse::error(401, "this action needs `Authorization: Bearer <admin token>`", None)),
    }
}

fn preflight(config: &Config, origin: Option<&str>) -> ApiResponse {
    let mut r = ApiResponse { status: 204, body: String::new(), headers: Vec::new() };
    if origin.is_some_and(|o| config.cors_origins.iter().any(|a| a == o || a == "*")) {
        r.headers.push(("Access-Control-Allow-Methods", "GET, POST, PUT, DELETE, OPTIONS".to_owned()));
        r.headers.push(("Access-Control-Allow-Headers", "Content-Type, Authorization, Idempotency-Key".to_owned()));
        r.headers.push(("Access-Control-Max-Age", "600".to_owned()));
    }
    r
}

/// The policy `name`, read by `pick` as the kind `kind` it must be: 404 naming what it is
/// otherwise. (`pick` matches the one variant it wants, so no kind string is checked apart
/// from the data.)
fn find<T>(config: &Config, name: &str, kind: &str, pick: impl Fn(&Policy) -> Option<T>) -> Result<T, ApiResponse> {
    validate::id("policy", name).map_err(|e| ApiResponse::input(&e))?;
    let Some(p) = config.policy(name) else {
        return Err(ApiResponse::error(404, format!("no policy named {name}"), Some("policy")));
    };
    pick(p).ok_or_else(|| {
        ApiResponse::error(404, format!("policy {name} is a {} policy, not a {kind} policy", p.kind()), Some("policy"))
    })
}

/// A red-packet policy's settings.
fn red_packets(p: &Policy) -> Option<(i64, i64, i64, i64)> {
    match *p {
        Policy::RedPackets { max_shares, max_total_cents, min_cents, ttl_ms } => {
            Some((max_shares, max_total_cents, min_cents, ttl_ms))
        }
        _ => None,
    }
}

/// A JSON object body with known fields only.
struct Body(Map<String, Json>);

/// The first key repeated in any JSON object within `bytes` (the body, or a decision's parts),
/// if any.
fn repeated_key(bytes: &[u8]) -> Option<String> {
    repeated_path(bytes).and_then(|mut path| path.pop())
}

/// Where the first key repeated in any JSON object within `bytes` is: the keys of the objects
/// leading to it (arrays are passed through unnamed), then the key itself. A map keeps the last of repeated keys, so
/// `{"delta":1,"delta":5}` would otherwise pass as one of them.
pub(crate) fn repeated_path(bytes: &[u8]) -> Option<Vec<String>> {
    /// Any JSON value, remembering the path of the first key an object in it repeats.
    struct Keys(Option<Vec<String>>);
    impl<'de> serde::Deserialize<'de> for Keys {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V;
            impl<'de> serde::de::Visitor<'de> for V {
                type Value = Keys;
                fn expecting(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                    f.write_str("JSON")
                }
                fn visit_bool<E>(self, _: bool) -> Result<Keys, E> {
                    Ok(Keys(None))
                }
                fn visit_i64<E>(self, _: i64) -> Result<Keys, E> {
                    Ok(Keys(None))
                }
                fn visit_u64<E>(self, _: u64) -> Result<Keys, E> {
                    Ok(Keys(None))
                }
                fn visit_f64<E>(self, _: f64) -> Result<Keys, E> {
                    Ok(Keys(None))
                }
                fn visit_str<E>(self, _: &str) -> Result<Keys, E> {
                    Ok(Keys(None))
                }
                fn visit_unit<E>(self) -> Result<Keys, E> {
                    Ok(Keys(None))
                }
                fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut s: A) -> Result<Keys, A::Error> {
                    let mut repeated = None;
                    while let Some(Keys(inner)) = s.next_element::<Keys>()? {
                        repeated = repeated.or(inner);
                    }
                    Ok(Keys(repeated))
                }
                fn visit_map<A: serde::de::MapAccess<'de>>(self, mut m: A) -> Result<Keys, A::Error> {
                    // A set: a 16 KiB body can hold thousands of keys.
                    let mut seen = alloc::collections::BTreeSet::new();
                    let mut repeated = None;
                    while let Some(k) = m.next_key::<String>()? {
                        let Keys(inner) = m.next_value::<Keys>()?;
                        if repeated.is_none() {
                            if seen.contains(&k) {
                                repeated = Some(alloc::vec![k.clone()]);
                            } else if let Some(mut p) = inner {
                                p.insert(0, k.clone());
                                repeated = Some(p);
                            }
                        }
                        seen.insert(k);
                    }
                    Ok(Keys(repeated))
                }
            }
            d.deserialize_any(V)
        }
    }
    serde_json::from_slice::<Keys>(bytes).ok().and_then(|k| k.0)
}

fn body(req: &ApiRequest<'_>, fields: &[&'static str]) -> Result<Body, ApiResponse> {
    if req.body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Body(Map::new()));
    }
    let json: Json = serde_json::from_slice(req.body)
        .map_err(|e| ApiResponse::error(400, format!("body is not valid JSON: {e}"), Some("body")))?;
    let Json::Object(map) = json else {
        return Err(ApiResponse::error(400, "body must be a JSON object", Some("body")));
    };
    // A map keeps the last of repeated keys: `{"delta":1,"delta":5}` must not pass as either.
    if let Some(k) = repeated_key(req.body) {
        return Err(ApiResponse::error(400, format!("field `{k}` appears more than once"), Some("body")));
    }
    let body = Body(map);
    body.known(fields)?;
    Ok(body)
}

impl Body {
    /// Refuses a field outside `fields` (as [`body`] does for a whole body).
    fn known(&self, fields: &[&str]) -> Result<(), ApiResponse> {
        match self.0.keys().find(|k| !fields.contains(&k.as_str())) {
            Some(k) => {
                let known = if fields.is_empty() { String::from("none") } else { fields.join(", ") };
                Err(ApiResponse::error(400, format!("unknown field `{k}` (known: {known})"), Some(k)))
            }
            None => Ok(()),
        }
    }

    fn has(&self, field: &str) -> bool {
        self.0.contains_key(field)
    }

    fn int(&self, field: &'static str, min: i64, max: i64, default: Option<i64>) -> Result<i64, ApiResponse> {
        match (self.0.get(field), default) {
            (None, Some(d)) => Ok(d),
            (None, None) => Err(ApiResponse::input(&InputError::new(field, redcount_core::error::Problem::Missing))),
            (Some(v), _) => validate::int_json(field, v, min, max).map_err(|e| ApiResponse::input(&e)),
        }
    }

    fn string(&self, field: &'static str) -> Result<String, ApiResponse> {
        match self.0.get(field) {
            Some(Json::String(s)) => Ok(s.clone()),
            None | Some(Json::Null) => {
                Err(ApiResponse::input(&InputError::new(field, redcount_core::error::Problem::Missing)))
            }
            Some(_) => {
                Err(ApiResponse::input(&InputError::new(field, redcount_core::error::Problem::WrongType("a string"))))
            }
        }
    }

    fn opt_string(&self, field: &'static str) -> Result<Option<String>, ApiResponse> {
        if self.0.contains_key(field) { self.string(field).map(Some) } else { Ok(None) }
    }
}

/// Query parameters (known names only).
struct Query(Vec<(String, String)>);

impl Query {
    fn parse(q: &str, known: &[&'static str]) -> Result<Query, ApiResponse> {
        let mut out = Vec::new();
        for pair in q.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            if !known.contains(&k) {
                return Err(ApiResponse::error(
                    400,
                    format!("unknown query parameter `{k}` (known: {})", known.join(", ")),
                    Some(k),
                ));
            }
            // As with repeated JSON fields: which one was meant is not ours to guess.
            if out.iter().any(|(seen, _): &(String, String)| seen == k) {
                return Err(ApiResponse::error(400, format!("query parameter `{k}` is given twice"), Some(k)));
            }
            out.push((k.to_owned(), v.to_owned()));
        }
        Ok(Query(out))
    }

    fn int(&self, field: &'static str, min: i64, max: i64, default: i64) -> Result<i64, ApiResponse> {
        match self.0.iter().find(|(k, _)| k == field) {
            None => Ok(default),
            Some((_, v)) => validate::int_str(field, v, min, max).map_err(|e| ApiResponse::input(&e)),
        }
    }

    fn opt_int(&self, field: &'static str, min: i64, max: i64) -> Result<Option<i64>, ApiResponse> {
        match self.0.iter().find(|(k, _)| k == field) {
            None => Ok(None),
            Some((_, v)) => validate::int_str(field, v, min, max).map(Some).map_err(|e| ApiResponse::input(&e)),
        }
    }
}

/// A public request asking for more than the policy grants the public.
fn beyond(field: &'static str, what: String) -> ApiResponse {
    ApiResponse::error(
        403,
        format!("{field}: {what} is beyond this policy's public limit (admin token required)"),
        Some(field),
    )
}

fn counters(config: &Config, req: &ApiRequest<'_>, caller: Caller, policy: &str, subject: &str) -> Routed {
    allow(req.method, &["GET", "HEAD", "POST"])?;
    let (bounds, storage, max_step) = find(config, policy, "counter", |p| match *p {
        Policy::Counter { bounds, storage, max_step } => Some((bounds, storage, max_step)),
        _ => None,
    })?;
    if req.method == "POST" {
        let b = body(req, &["delta"])?;
        let delta = b.int("delta", -ops::counter::MAX_VALUE, ops::counter::MAX_VALUE, None)?;
        if caller == Caller::Public && delta.abs() > max_step {
            return Err(beyond("delta", format!("|{delta}| > {max_step}")));
        }
        let op = replayable!(
            req,
            AddCounter::new(policy, subject, storage, delta, bounds).map_err(|e| ApiResponse::input(&e))?
        );
        Ok(Step::Send(Exchange::new(op, |_, o| {
            let status = match o.status {
                CounterStatus::Applied => "applied",
                CounterStatus::Clamped => "clamped",
                CounterStatus::Rejected => "rejected",
            };
            ApiResponse::flat(&mut [
                ("value", Field::Int(o.value)),
                ("applied", Field::Int(o.applied)),
                ("status", Field::Word(status)),
            ])
        })))
    } else {
        let op = GetCounter::new(policy, subject, storage).map_err(|e| ApiResponse::input(&e))?;
        Ok(Step::Send(Exchange::new(op, |_, v| ApiResponse::json(200, json!({ "value": v })))))
    }
}

fn quotas(config: &Config, req: &ApiRequest<'_>, caller: Caller, policy: &str, subject: &str) -> Routed {
    allow(req.method, &["GET", "HEAD", "POST", "DELETE"])?;
    let (algorithm, max_cost) = find(config, policy, "quota", |p| match *p {
        Policy::Quota { algorithm, max_cost, .. } => Some((algorithm, max_cost)),
        _ => None,
    })?;
    let render = |_: &ops::Idempotent<TakeQuota>, o: ops::quota::QuotaOutcome| {
        let mut r = ApiResponse::flat(&mut [
            ("allowed", Field::Bool(o.allowed)),
            ("limit", Field::Int(o.limit)),
            ("remaining", Field::Int(o.remaining)),
            ("reset_ms", Field::Int(o.reset_ms)),
            ("retry_after_ms", Field::Int(o.retry_after_ms)),
        ]);
        if !o.allowed {
            r.headers.push(("Retry-After", redcount_core::command::itoa_i(((o.retry_after_ms + 999) / 1000).max(1))));
        }
        r
    };
    match req.method {
        "DELETE" => {
            require_admin(caller)?;
            let op = replayable!(req, ResetQuota::new(policy, subject, algorithm).map_err(|e| ApiResponse::input(&e))?);
            Ok(Step::Send(Exchange::new(op, |_, existed| ApiResponse::json(200, json!({ "reset": existed })))))
        }
        "POST" => {
            let cost = body(req, &["cost"])?.int("cost", 1, algorithm.limit(), Some(1))?;
            if caller == Caller::Public && cost > max_cost {
                return Err(beyond("cost", format!("{cost} > {max_cost}")));
            }
            let op = replayable!(
                req,
                TakeQuota::take(policy, subject, algorithm, cost).map_err(|e| ApiResponse::input(&e))?
            );
            Ok(Step::Send(Exchange::new(op, render)))
        }
        _ => {
            let cost = Query::parse(req.query, &["cost"])?.int("cost", 1, algorithm.limit(), 1)?;
            let op = TakeQuota::peek(policy, subject, algorithm, cost).map_err(|e| ApiResponse::input(&e))?;
            Ok(Step::Send(Exchange::new(ops::Idempotent::new(op, None), render)))
        }
    }
}

/// `POST /api/quotas/{policy}/{subject}/refund` (admin): gives units back, never above the
/// limit; answers how many were given back.
fn refund(config: &Config, req: &ApiRequest<'_>, caller: Caller, policy: &str, subject: &str) -> Routed {
    allow(req.method, &["POST"])?;
    let algorithm = find(config, policy, "quota", |p| match *p {
        Policy::Quota { algorithm, .. } => Some(algorithm),
        _ => None,
    })?;
    require_admin(caller)?;
    let cost = body(req, &["cost"])?.int("cost", 1, algorithm.limit(), Some(1))?;
    let op = replayable!(req, RefundQuota::new(policy, subject, algorithm, cost).map_err(|e| ApiResponse::input(&e))?);
    Ok(Step::Send(Exchange::new(op, |_, given| ApiResponse::json(200, json!({ "refunded": given })))))
}

/// `PUT /api/overrides/{policy}/{subject}` (admin) `{"limit": N, "ttl_ms": T}` sets a
/// subject's own size of a quota policy (`limit`, or the algorithm's own name for it:
/// `capacity`, `burst`), or a semaphore's own limit, for `ttl_ms` (absent: until cleared);
/// `DELETE` clears it.
fn overrides(config: &Config, req: &ApiRequest<'_>, caller: Caller, policy: &str, subject: &str) -> Routed {
    allow(req.method, &["PUT", "DELETE"])?;
    // A quota's size (`limit`, or the algorithm's own name for it), or a semaphore's limit
    // (the subject is the semaphore's name).
    let algorithm = match config.policy(policy) {
        Some(Policy::Quota { algorithm, .. }) => Some(*algorithm),
        Some(Policy::Semaphore { .. }) => None,
        _ => {
            return Err(ApiResponse::error(
                404,
                format!("no quota or semaphore policy named `{policy}`"),
                Some("policy"),
            ));
        }
    };
    require_admin(caller)?;
    let input = |e: redcount_core::error::InputError| ApiResponse::input(&e);
    if req.method == "DELETE" {
        let op = match algorithm {
            Some(_) => OverrideQuota::clear(policy, subject),
            None => OverrideQuota::clear_semaphore(policy, subject),
        };
        let op = replayable!(req, op.map_err(input)?);
        return Ok(Step::Send(Exchange::new(op, |_, existed| ApiResponse::json(200, json!({ "cleared": existed })))));
    }
    let own = algorithm.map_or("limit", |a| a.size_field());
    let fields: &[&str] = if own == "limit" { &["limit", "ttl_ms"] } else { &["limit", own, "ttl_ms"] };
    let b = body(req, fields)?;
    let max = algorithm.map_or(redcount_core::ops::semaphore::MAX_LIMIT, |a| a.max_size());
    let size = match (own != "limit" && b.has(own), b.has("limit")) {
        (true, true) => {
            return Err(ApiResponse::error(400, format!("give `limit` or `{own}`, not both"), Some("limit")));
        }
        (true, false) => b.int(own, 1, max, None)?,
        _ => b.int("limit", 1, max, None)?,
    };
    let ttl_ms = b.int("ttl_ms", 1, redcount_core::ops::quota::MAX_OVERRIDE_TTL_MS, Some(0))?;
    let op = match algorithm {
        Some(a) => OverrideQuota::set(policy, subject, a, size, ttl_ms),
        None => OverrideQuota::set_semaphore(policy, subject, size, ttl_ms),
    };
    let op = replayable!(req, op.map_err(input)?);
    let (policy, subject) = (policy.to_owned(), subject.to_owned());
    Ok(Step::Send(Exchange::new(op, move |_, replaced| {
        ApiResponse::json(
            200,
            json!({
                "policy": policy, "subject": subject, "limit": size,
                "ttl_ms": if ttl_ms == 0 { Json::Null } else { json!(ttl_ms) }, "replaced": replaced
            }),
        )
    })))
}

/// `POST /api/decisions/{subject}` `{"parts": [{"policy": "per-second", "cost": 1},
/// {"policy": "in-flight", "holder": "job-7"}], "peek": false}`: quota and semaphore policies
/// of one subject decided at once, all or nothing (a denied decision consumes nothing).
fn decisions(config: &Config, req: &ApiRequest<'_>, caller: Caller, subject: &str) -> Routed {
    allow(req.method, &["POST"])?;
    let b = body(req, &["parts", "peek"])?;
    let peek = match b.0.get("peek") {
        None | Some(Json::Bool(false)) => false,
        Some(Json::Bool(true)) => true,
        Some(_) => return Err(ApiResponse::error(400, "peek must be true or false", Some("peek"))),
    };
    let list = match b.0.get("parts") {
        Some(Json::Array(list)) => list,
        None => return Err(ApiResponse::error(400, "parts is required", Some("parts"))),
        Some(_) => return Err(ApiResponse::error(400, "parts must be an array of parts", Some("parts"))),
    };
    if list.is_empty() || list.len() > decision::MAX_PARTS {
        return Err(ApiResponse::error(
            400,
            format!("parts must hold 1 to {} parts", decision::MAX_PARTS),
            Some("parts"),
        ));
    }
    let mut parts = Vec::with_capacity(list.len());
    // The declared failure mode of the whole: allow only when every part declares it (a
    // lease never degrades to a pass), and the shortest time budget of the parts.
    let (mut allow_all, mut timeout_ms) = (true, None::<u32>);
    for (i, item) in list.iter().enumerate() {
        let at = |e: ApiResponse| in_part(i, e);
        let Json::Object(map) = item else {
            return Err(at(ApiResponse::error(400, "a part must be a JSON object", Some("part"))));
        };
        let part = Body(map.clone());
        let name = part.string("policy").map_err(at)?;
        let policy = find(config, &name, "quota or semaphore", |p| Some(p.clone())).map_err(at)?;
        let built = match policy {
            Policy::Quota { algorithm, max_cost, .. } => {
                part.known(&["policy", "cost"]).map_err(at)?;
                let cost = part.int("cost", 1, algorithm.limit(), Some(1)).map_err(at)?;
                if caller == Caller::Public && cost > max_cost {
                    return Err(at(beyond("cost", format!("{cost} > {max_cost}"))));
                }
                Part::quota(&name, algorithm, cost)
            }
            Policy::Semaphore { limit, lease_ms } => {
                part.known(&["policy", "holder"]).map_err(at)?;
                allow_all = false;
                Part::lease(&name, &part.string("holder").map_err(at)?, limit, lease_ms)
            }
            other => {
                return Err(at(ApiResponse::error(
                    400,
                    format!(
                        "policy {name} is a {} policy: a decision takes quota and semaphore policies",
                        other.kind()
                    ),
                    Some("policy"),
                )));
            }
        };
        parts.push(built.map_err(|e| at(ApiResponse::input(&e)))?);
        let mode = config.failure_mode(&name);
        allow_all &= mode.allow;
        timeout_ms = match (timeout_ms, mode.timeout_ms) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
    let names: Vec<String> = parts.iter().map(|p| p.policy().to_owned()).collect();
    // A peek writes nothing, not even a stored reply: like a quota's GET it takes no key.
    let op = match peek {
        true => ops::Idempotent::new(Decide::peek(subject, parts).map_err(|e| ApiResponse::input(&e))?, None),
        false => replayable!(req, Decide::new(subject, parts).map_err(|e| ApiResponse::input(&e))?),
    };
    let mut ex = Exchange::new(op, move |_, d| decision_response(&names, d, peek));
    ex.degrade = Some(("allowed", allow_all));
    ex.timeout_ms = timeout_ms;
    Ok(Step::Send(ex))
}

/// An error about one part's field, as the part's own: `parts[1].cost` (the shared body
/// helpers name the field alone).
fn in_part(i: usize, e: ApiResponse) -> ApiResponse {
    let mut v: Json = serde_json::from_str(&e.body).unwrap_or(Json::Null);
    if let Some(field) = v.get("field").and_then(Json::as_str).map(|f| format!("parts[{i}].{f}")) {
        let message = v.get("error").and_then(Json::as_str).unwrap_or("").to_owned();
        v["error"] = Json::String(format!("parts[{i}]: {message}"));
        v["field"] = Json::String(field);
    }
    ApiResponse { status: e.status, body: v.to_string(), headers: e.headers }
}

fn decision_response(names: &[String], d: decision::Decision, peek: bool) -> ApiResponse {
    let parts: Vec<Json> = names
        .iter()
        .zip(&d.parts)
        .map(|(name, p)| match *p {
            PartOutcome::Quota(q) => json!({
                "policy": name, "kind": "quota", "allowed": q.allowed, "limit": q.limit,
                "remaining": q.remaining, "reset_ms": q.reset_ms, "retry_after_ms": q.retry_after_ms
            }),
            PartOutcome::Lease { result, in_use, limit, earliest_end_ms, retry_after_ms, lease_ms, fencing_token } => {
                json!({
                    "policy": name, "kind": "semaphore", "allowed": p.allowed(),
                    "result": match result {
                        LeaseResult::Full => "full",
                        LeaseResult::Acquired => "acquired",
                        LeaseResult::Renewed => "renewed",
                        LeaseResult::Ended => "ended",
                    },
                    "in_use": in_use, "limit": limit, "earliest_end_ms": earliest_end_ms,
                    "retry_after_ms": retry_after_ms, "lease_ms": lease_ms, "fencing_token": fencing_token
                })
            }
        })
        .collect();
    let denied_by = d.denied_by.and_then(|i| names.get(i));
    let mut r = ApiResponse::json(
        200,
        json!({
            "allowed": d.allowed, "denied_by": denied_by, "retry_after_ms": d.retry_after_ms,
            "peek": peek, "parts": parts
        }),
    );
    if !d.allowed {
        r.headers.push(("Retry-After", redcount_core::command::itoa_i(((d.retry_after_ms + 999) / 1000).max(1))));
    }
    r
}

fn inbox(config: &Config, req: &ApiRequest<'_>, caller: Caller, user: &str, rest: &[&str]) -> Routed {
    let Some((_, &Policy::Inbox { ttl_ms, max_len, max_age_s, public })) = config.first_of("inbox") else {
        return Err(ApiResponse::error(404, "no inbox policy is configured", None));
    };
    if !public {
        require_admin(caller)?;
    }
    match rest {
        ["messages"] => {
            allow(req.method, &["GET", "HEAD", "POST"])?;
            if req.method == "POST" {
                let b = body(req, &["id", "body"])?;
                let id = b.int("id", 0, validate::MAX_SAFE, None)?;
                let text = b.string("body")?;
                let op = replayable!(
                    req,
                    Append::new(user, id, &text, ttl_ms, max_len).map_err(|e| ApiResponse::input(&e))?
                );
                Ok(Step::Send(Exchange::new(op, |_, o| {
                    ApiResponse::json(if o.stored { 201 } else { 200 }, json!({"stored": o.stored, "length": o.length}))
                })))
            } else {
                let q = Query::parse(req.query, &["after", "limit"])?;
                let after = q.opt_int("after", 0, validate::MAX_SAFE)?;
                let limit = q.int("limit", 1, ops::inbox::MAX_PAGE, 50)?;
                let op = Read::new(user, after, limit).map_err(|e| ApiResponse::input(&e))?;
                Ok(Step::Send(Exchange::new(op, |_, msgs| {
                    let list: Vec<Json> = msgs
                        .into_iter()
                        .map(|m| json!({"id": m.id, "time": m.time, "body": String::from_utf8_lossy(&m.body)}))
                        .collect();
                    ApiResponse::json(200, json!({ "messages": list }))
                })))
            }
        }
        ["trim"] => {
            allow(req.method, &["POST"])?;
            body(req, &[])?;
            let op = replayable!(req, Trim::new(user, max_age_s, max_len, 1000).map_err(|e| ApiResponse::input(&e))?);
            Ok(Step::Send(Exchange::new(op, |_, o| {
                ApiResponse::json(200, json!({"deleted": o.deleted, "newest_time": o.newest_time}))
            })))
        }
        _ => Err(ApiResponse::error(404, "no such route", None)),
    }
}

fn create_packet<R: RngCore + ?Sized>(config: &Config, req: &ApiRequest<'_>, caller: Caller, rng: &mut R) -> Routed {
    let b = body(req, &["total_cents", "count", "policy", "min_cents"])?;
    let (name, (max_shares, max_total_cents, min_cents, ttl_ms)) = match b.opt_string("policy")? {
        Some(name) => {
            let p = find(config, &name, "redpackets", red_packets)?;
            (name, p)
        }
        None => match config.first_of("redpackets").and_then(|(n, p)| Some((n.to_owned(), red_packets(p)?))) {
            Some(found) => found,
            None => return Err(ApiResponse::error(404, "no redpackets policy is configured", Some("policy"))),
        },
    };
    let total = b.int("total_cents", 1, split::MAX_TOTAL, None)?;
    let count = b.int("count", 1, split::MAX_COUNT, None)?;
    let min = b.int("min_cents", 1, split::MAX_TOTAL, Some(min_cents))?;
    if caller == Caller::Public {
        if total > max_total_cents {
            return Err(beyond("total_cents", format!("{total} > {max_total_cents}")));
        }
        if count > max_shares {
            return Err(beyond("count", format!("{count} > {max_shares}")));
        }
        if min != min_cents {
            return Err(beyond("min_cents", format!("{min} ≠ {min_cents}")));
        }
    }
    // With an Idempotency-Key the id comes from the key, so a replay finds the same packet.
    let idem = idempotency(req)?;
    let id = match &idem {
        Some(i) => redpacket::id_for(i, config.id_secret()),
        None => redpacket::new_id(rng),
    };
    let op = Create::new(&id, total, count, min, ttl_ms, rng).map_err(|e| ApiResponse::input(&e))?;
    let op = ops::Idempotent::new(op, idem);
    let timeout_ms = config.failure_mode(&name).timeout_ms;
    let mut ex = Exchange::new(op, move |_, o| {
        if !o.created {
            return ApiResponse::error(409, "a packet with this id exists; try again", None);
        }
        ApiResponse::json(
            201,
            json!({
                "id": id, "policy": name, "total_cents": total, "count": count, "expires_at_ms": o.expires_at_ms
            }),
        )
    });
    ex.timeout_ms = timeout_ms;
    Ok(Step::Send(ex))
}

/// `PING`: the health check's one round trip.
struct Ping;

impl Operation for Ping {
    type Outcome = ();
    const NAME: &'static str = "ping";

    fn request(&self) -> Request {
        Request::Command(Command::new("PING"))
    }

    fn parse(&self, reply: Value) -> Result<(), ShapeError> {
        match reply {
            Value::Bytes(b) if b == b"PONG" => Ok(()),
            _ => Err(ShapeError::new(Self::NAME, "expected PONG")),
        }
    }
}
