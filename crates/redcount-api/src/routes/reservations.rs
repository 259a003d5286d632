//! The reservation routes: reserve, then settle, extend or release, by an id the API makes.
//!
//! The id a client gets back is a sealed ticket, not the key the scripts store the
//! reservation under: base64url of a version byte, a 16-byte nonce (random, or derived from
//! the `Idempotency-Key` so a replay names the same reservation), the parts (per part the
//! first 4 bytes of its policy name's SHA-1 and its level) and 10 bytes of an HMAC-SHA-1 of
//! all of it and the subject under the server's id secret ([`Config::id_secret`]). So a
//! settle needs only the id and the units used: the API rebuilds the parts (each policy as
//! configured now) from it, and an id is refused (404 naming `id`) under any other subject or
//! with its parts edited, before anything is sent. The script's own check stands behind it:
//! the record keeps the SHA-1 of its parts' keys, so a settle naming other keys is refused
//! whatever id reached it, and the reservation's key is under the subject's (and a scoped
//! caller's) own part of the key space.

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use rand_core::RngCore;
use redcount_core::b64;
use redcount_core::json::{Json, Map};

use super::{
    ApiError, ApiResponse, Cx, Exchange, Field, Fields, Held, Policy, Routed, Verdict, body, part_object, send, within,
};
use crate::{Config, list, object};
use redcount_core::keys::Level;
use redcount_core::ops::decision::{LeaseResult, MAX_PARTS};
use redcount_core::ops::quota::Algorithm;
use redcount_core::ops::reservation::{
    Extend, MAX_UNITS, Mode, Part, Release, Reservation, Reserve, Settle, SettledPart, Settlement, State,
};
use redcount_core::ops::semaphore::MAX_LEASE_MS;
use redcount_core::ratelimit::Limit;
use redcount_core::sha1;
use redcount_core::validate;
use redcount_core::{Operation, ops};

/// A reservation's lease when the request names none and has no lease part, in ms.
const DEFAULT_LEASE_MS: i64 = 60_000;
/// A public caller's longest `lease_ms` (reserve and extend) when the reservation has no lease
/// part, in ms: one hour (with lease parts, the shortest one's policy `lease_ms`). The record
/// lives that long plus its keep (an hour) even when its quotas' keys have expired; an admin
/// token may ask up to the scripts' bound.
pub const MAX_PUBLIC_LEASE_MS: i64 = 3_600_000;

/// The ticket's layout version (its first byte).
const VERSION: u8 = 1;
const NONCE: usize = 16;
const PART: usize = 5;
const MAC: usize = 10;

/// One part as the API knows it: its policy's name and definition and its level.
struct Named<'c> {
    name: &'c str,
    policy: &'c Policy,
    level: Level,
}

impl Named<'_> {
    fn is_quota(&self) -> bool {
        matches!(self.policy, Policy::Quota { .. })
    }

    /// The part as the core builds it for a settle, an extend or a release (the units of a
    /// quota part and the holder of a lease part are the reserve's, not needed again).
    fn part(&self) -> Result<Part, ApiError> {
        let part = match *self.policy {
            Policy::Quota { algorithm, max_debt, on_expiry, .. } => {
                Part::quota(self.name, algorithm, 1)?.max_debt(max_debt)?.on_expiry(on_expiry)
            }
            Policy::Semaphore { limit, .. } => Part::lease(self.name, "h", limit)?,
            _ => return Err(ApiError::new(409, "the reservation's policies changed since it was made").at("id")),
        };
        Ok(part.at(self.level))
    }

    /// The name of this part's item in the RateLimit fields (a tenant's own counter's is
    /// `policy:tenant`, so a policy at both levels gives two items).
    fn label(&self) -> String {
        match self.level {
            Level::User => String::from(self.name),
            Level::Tenant => format!("{}:tenant", self.name),
        }
    }
}

fn level_word(level: Level) -> &'static str {
    match level {
        Level::User => "user",
        Level::Tenant => "tenant",
    }
}

fn name_hash(name: &str) -> [u8; 4] {
    let d = sha1::digest(name.as_bytes());
    [d[0], d[1], d[2], d[3]]
}

fn mac(config: &Config, subject: &str, sealed: &[u8]) -> [u8; 20] {
    let mut msg = Vec::with_capacity(32 + subject.len() + sealed.len());
    msg.extend_from_slice(b"redcount reservation\n");
    msg.extend_from_slice(subject.as_bytes());
    msg.push(b'\n');
    msg.extend_from_slice(sealed);
    sha1::hmac(config.id_secret(), &msg)
}

/// The id handed to the client for the reservation `nonce` of `subject` with `parts`.
fn seal(config: &Config, subject: &str, nonce: &[u8; NONCE], parts: &[Named<'_>]) -> String {
    let mut bytes = Vec::with_capacity(2 + NONCE + PART * parts.len() + MAC);
    bytes.push(VERSION);
    bytes.extend_from_slice(nonce);
    for p in parts {
        bytes.extend_from_slice(&name_hash(p.name));
        bytes.push(u8::from(p.level == Level::Tenant));
    }
    let m = mac(config, subject, &bytes);
    bytes.extend_from_slice(&m[..MAC]);
    b64::encode_url(&bytes)
}

/// The script's id of the reservation `id` of `subject` (the nonce, base64url) and its parts,
/// each policy as configured now; 404 naming `id` for an id this server did not make for
/// this subject.
fn open<'c>(config: &'c Config, subject: &str, id: &str) -> Result<(String, Vec<Named<'c>>), ApiError> {
    let unknown = || ApiError::new(404, "no such reservation (the id was not made for this subject)").at("id");
    // The longest id: 8 parts.
    if id.len() > 4 * (1 + NONCE + PART * MAX_PARTS + MAC).div_ceil(3) {
        return Err(unknown());
    }
    let bytes = b64::decode_url(id.as_bytes()).ok_or_else(unknown)?;
    let body = bytes.len().checked_sub(1 + NONCE + MAC).ok_or_else(unknown)?;
    if bytes[0] != VERSION || body == 0 || body % PART != 0 || body / PART > MAX_PARTS {
        return Err(unknown());
    }
    let (sealed, tag) = bytes.split_at(bytes.len() - MAC);
    if !crate::same_secret(&mac(config, subject, sealed)[..MAC], tag) {
        return Err(unknown());
    }
    let mut parts = Vec::with_capacity(body / PART);
    for chunk in sealed[1 + NONCE..].chunks_exact(PART) {
        let level = match chunk[4] {
            0 => Level::User,
            1 => Level::Tenant,
            _ => return Err(unknown()),
        };
        let mut found = config.policies.iter().filter(|(n, _)| name_hash(n)[..] == chunk[..4]);
        match (found.next(), found.next()) {
            (Some((name, policy)), None) => parts.push(Named { name, policy, level }),
            _ => {
                return Err(ApiError::new(409, "the reservation names a policy no longer configured").at("id"));
            }
        }
    }
    Ok((b64::encode_url(&sealed[1..1 + NONCE]), parts))
}

/// A level field: `"user"` (the default) or `"tenant"` (only for a `TENANT/USER` subject).
pub(super) fn level(map: &Map, subject: &str) -> Result<Level, ApiError> {
    match map.get("level") {
        None => Ok(Level::User),
        Some(Json::String(s)) if s == "user" => Ok(Level::User),
        Some(Json::String(s)) if s == "tenant" => match subject.contains('/') {
            true => Ok(Level::Tenant),
            false => Err(ApiError::new(400, "level tenant needs a TENANT/USER subject").at("level")),
        },
        Some(_) => Err(ApiError::new(400, "level must be \"user\" or \"tenant\"").at("level")),
    }
}

/// `policy` at `level` may appear once among `seen`.
fn once(seen: &[(&str, Level)], name: &str, level: Level) -> Result<(), ApiError> {
    match seen.iter().any(|&(n, l)| n == name && l == level) {
        true => {
            Err(ApiError::new(400, format!("policy {name} appears twice at level {}", level_word(level))).at("policy"))
        }
        false => Ok(()),
    }
}

/// The shortest lease of the lease parts (a public reservation's lease may be no longer: a
/// semaphore's slot is held as long as the policy lets one acquire hold it).
fn lease_bound(parts: &[Named<'_>]) -> Option<i64> {
    parts
        .iter()
        .filter_map(|p| match *p.policy {
            Policy::Semaphore { lease_ms, .. } => Some(lease_ms),
            _ => None,
        })
        .min()
}

/// The request's `lease_ms` (the shortest lease part's, else [`DEFAULT_LEASE_MS`], when it
/// names none); a public caller's at most the shortest lease part's, or
/// [`MAX_PUBLIC_LEASE_MS`] without one.
fn lease_ms(cx: &Cx<'_>, b: &Fields, parts: &[Named<'_>]) -> Result<i64, ApiError> {
    let bound = lease_bound(parts);
    let ms = b.int("lease_ms", 1, MAX_LEASE_MS, Some(bound.unwrap_or(DEFAULT_LEASE_MS)))?;
    let most = bound.unwrap_or(MAX_PUBLIC_LEASE_MS);
    within(cx.admin(), "lease_ms", ms, most)?;
    Ok(ms)
}

/// The whole call's bound: the shortest `timeout_ms` its policies declare.
fn timeout(config: &Config, parts: &[Named<'_>]) -> Option<u32> {
    parts.iter().filter_map(|p| config.failure_mode(p.name).timeout_ms).min()
}

/// `POST /api/reservations/{subject}` (or `/{tenant}/{user}`) `{"parts": [{"policy": "tpm",
/// "units": 1200, "level": "tenant", "min_units": 100}, {"policy": "in-flight", "holder":
/// "req-7"}], "lease_ms": 60000, "mode": "all" | "capped", "peek": false}`.
pub(super) fn reserve<R: RngCore + ?Sized>(cx: &Cx<'_>, subject: &str, rng: &mut R) -> Routed {
    validate::subject("subject", subject)?;
    let map = body(cx.input.body(), &["parts", "lease_ms", "mode", "peek"])?;
    let peek = match map.get("peek") {
        None | Some(Json::Bool(false)) => false,
        Some(Json::Bool(true)) => true,
        Some(_) => return Err(ApiError::new(400, "peek must be true or false").at("peek")),
    };
    let mode = match map.get("mode") {
        None => Mode::All,
        Some(Json::String(s)) if s == "all" => Mode::All,
        Some(Json::String(s)) if s == "capped" => Mode::Capped,
        Some(_) => return Err(ApiError::new(400, "mode must be \"all\" or \"capped\"").at("mode")),
    };
    let list = super::parts_list(&map)?;
    let (mut parts, mut named) = (Vec::with_capacity(list.len()), Vec::with_capacity(list.len()));
    let mut seen: Vec<(&str, Level)> = Vec::with_capacity(list.len());
    for (i, item) in list.iter().enumerate() {
        let (part, n) = reserve_part(cx, subject, item, mode, &seen).map_err(|e| e.in_part(i))?;
        seen.push((n.name, n.level));
        parts.push(part);
        named.push(n);
    }
    let b = Fields::Json(map);
    let lease_ms = lease_ms(cx, &b, &named)?;
    // With an Idempotency-Key the nonce comes from the key, so a replay names the same
    // reservation (and answers the same id).
    let idem = cx.idempotency()?;
    let mut nonce = [0u8; NONCE];
    match &idem {
        Some(i) => {
            let m = sha1::hmac(cx.config.id_secret(), format!("reservation id\n{}", i.suffix).as_bytes());
            nonce.copy_from_slice(&m[..NONCE]);
        }
        None => rng.fill_bytes(&mut nonce),
    }
    let rid = b64::encode_url(&nonce);
    let op = match peek {
        // A peek writes nothing, not even a stored reply.
        true => ops::Idempotent::new(Reserve::peek(subject, &rid, parts, lease_ms, mode)?, None),
        false => ops::Idempotent::new(Reserve::new(subject, &rid, parts, lease_ms, mode)?, idem),
    };
    let id = (!peek).then(|| seal(cx.config, subject, &nonce, &named));
    let timeout_ms = timeout(cx.config, &named);
    let labels: Vec<(String, String, Level, Option<Algorithm>)> = named
        .iter()
        .map(|n| {
            let algorithm = match *n.policy {
                Policy::Quota { algorithm, .. } => Some(algorithm),
                _ => None,
            };
            (String::from(n.name), n.label(), n.level, algorithm)
        })
        .collect();
    let mut ex = Exchange::new(op, move |_, r| reservation_response(&labels, id.as_deref(), &r, peek));
    // A reservation is never granted without Redis (it is a record there).
    ex.degrade = Some(("allowed", false));
    ex.timeout_ms = timeout_ms;
    // A reserve first gives back what expired reservations owe (on_expiry refund).
    send(if peek { ex } else { cx.forgetting_all(ex, named.iter().map(|n| n.name), subject) })
}

/// One part of a reserve.
fn reserve_part<'c>(
    cx: &Cx<'c>,
    subject: &str,
    item: &Json,
    mode: Mode,
    seen: &[(&str, Level)],
) -> Result<(Part, Named<'c>), ApiError> {
    let Json::Object(map) = item else {
        return Err(ApiError::new(400, "a part must be a JSON object").at("part"));
    };
    let fields = Fields::Json(map.clone());
    let wanted = fields.string("policy")?;
    let policy = cx.find(&wanted)?;
    // The configuration's own copy of the name (the part borrows it).
    let name = cx.config.policies.iter().find(|(n, _)| *n == wanted).map_or("", |(n, _)| n.as_str());
    let level = level(map, subject)?;
    once(seen, name, level)?;
    let part = match *policy {
        Policy::Quota { algorithm, max_cost, max_debt, on_expiry } => {
            super::known_fields(map, &["policy", "units", "level", "min_units"])?;
            let units = fields.int("units", 1, algorithm.limit(), None)?;
            within(cx.admin(), "units", units, max_cost)?;
            let mut part = Part::quota(name, algorithm, units)?.max_debt(max_debt)?.on_expiry(on_expiry);
            if let Some(min) = fields.opt_int("min_units", 1, units)? {
                if mode != Mode::Capped {
                    return Err(ApiError::new(400, "min_units is read only with mode capped").at("min_units"));
                }
                part = part.min_units(min)?;
            }
            part
        }
        Policy::Semaphore { limit, .. } => {
            super::known_fields(map, &["policy", "holder", "level"])?;
            Part::lease(name, &fields.string("holder")?, limit)?
        }
        ref other => {
            return Err(ApiError::new(
                400,
                format!("policy {name} is a {} policy: a reservation takes quota and semaphore policies", other.kind()),
            )
            .at("policy"));
        }
    };
    Ok((part.at(level), Named { name, policy, level }))
}

fn reservation_response(
    labels: &[(String, String, Level, Option<Algorithm>)],
    id: Option<&str>,
    r: &Reservation,
    peek: bool,
) -> ApiResponse {
    let parts = list(labels.iter().zip(&r.parts), |out, ((name, _, level, _), p)| {
        let held = Held { level: level_word(*level), reserved: p.reserved, reclaimed: p.back };
        part_object(out, name, &p.outcome, Some(held))
    });
    let denied_by = r.denied_by.and_then(|i| labels.get(i)).map_or(Field::Null, |(n, ..)| Field::Text(n));
    let limits: Vec<Limit<'_>> = labels
        .iter()
        .zip(&r.parts)
        .filter_map(|((_, label, _, a), p)| Limit::part(label, a.as_ref(), &p.outcome))
        .collect();
    // The id only of a reservation that holds (or held: a replay) its units.
    let id = if r.state.is_some() { id.map_or(Field::Null, Field::Text) } else { Field::Null };
    ApiResponse::flat(&mut [
        ("allowed", Field::Bool(r.allowed)),
        ("reservation", id),
        ("state", r.state.map_or(Field::Null, |s| Field::Word(state_word(s)))),
        ("expires_ms", Field::opt(r.expires_at_ms)),
        ("denied_by", denied_by),
        ("retry_after_ms", Field::Int(r.retry_after_ms)),
        ("peek", Field::Bool(peek)),
        ("parts", Field::Raw(&parts)),
    ])
    .decided(&limits, Verdict { allowed: r.allowed, retry_after_ms: r.retry_after_ms })
}

fn state_word(s: State) -> &'static str {
    match s {
        State::Open => "open",
        State::Settled => "settled",
        State::Released => "released",
        State::Expired => "expired",
    }
}

/// What a call on an existing reservation does.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Close {
    Settle,
    Extend,
    Release,
}

/// `POST /api/reservations/{subject}/{id}/settle` `{"actual": [{"policy": "tpm", "units": 900}]}`,
/// `…/extend` `{"lease_ms": 60000, "used": [{"policy": "tpm", "units": 400}]}`, `…/release`.
pub(super) fn close(cx: &Cx<'_>, subject: &str, id: &str, act: Close) -> Routed {
    validate::subject("subject", subject)?;
    let (rid, named) = open(cx.config, subject, id)?;
    let (known, list): (&[&str], &'static str) = match act {
        Close::Settle => (&["actual"], "actual"),
        Close::Extend => (&["lease_ms", "used"], "used"),
        Close::Release => (&[], "actual"),
    };
    let map = body(cx.input.body(), known)?;
    let units = match act {
        Close::Release => alloc::vec![0; named.len()],
        _ => units(map.get(list), list, &named, act == Close::Settle, cx.admin())?,
    };
    // A loop, not a collect into a Result: that adapter is a kilobyte of its own in the bundle.
    let mut parts = Vec::with_capacity(named.len());
    for n in &named {
        parts.push(n.part()?);
    }
    let ex = match act {
        Close::Settle => settle_exchange(cx, &named, id, cx.replayable(Settle::new(subject, &rid, parts, &units))?),
        Close::Extend => {
            let lease_ms = lease_ms(cx, &Fields::Json(map), &named)?;
            settle_exchange(cx, &named, id, cx.replayable(Extend::new(subject, &rid, parts, lease_ms, &units))?)
        }
        Close::Release => settle_exchange(cx, &named, id, cx.replayable(Release::new(subject, &rid, parts))?),
    };
    // Units given back: this shell's denials of those quotas may no longer hold.
    send(cx.forgetting_all(ex, named.iter().map(|n| n.name), subject))
}

/// The units per part of `field`'s list (`[{"policy": …, "units": …, "level": …}]`): an item
/// without `level` gives its units to the policy's parts at every level. Every quota part
/// needs its units when `every` (a settle), else it has 0 (an extend: nothing used yet). A
/// public caller's (not `admin`) at most the policy's `max_cost`, as a take's: what it reports
/// is charged.
fn units(
    given: Option<&Json>,
    field: &'static str,
    parts: &[Named<'_>],
    every: bool,
    admin: bool,
) -> Result<Vec<i64>, ApiError> {
    let items: &[Json] = match given {
        Some(Json::Array(items)) => items,
        None if !every => &[],
        None => return Err(ApiError::new(400, format!("{field} is required")).at(field)),
        Some(_) => return Err(ApiError::new(400, format!("{field} must be an array of parts")).at(field)),
    };
    if items.len() > MAX_PARTS {
        return Err(ApiError::new(400, format!("{field} must hold at most {MAX_PARTS} items")).at(field));
    }
    let mut out: Vec<Option<i64>> = parts.iter().map(|p| (!p.is_quota()).then_some(0)).collect();
    for (i, item) in items.iter().enumerate() {
        let at = |e: ApiError| e.in_list(field, i);
        let Json::Object(map) = item else {
            return Err(at(ApiError::new(400, "an item must be a JSON object").at("item")));
        };
        super::known_fields(map, &["policy", "units", "level"]).map_err(at)?;
        let fields = Fields::Json(map.clone());
        let name = fields.string("policy").map_err(at)?;
        let n = fields.int("units", 0, MAX_UNITS, None).map_err(at)?;
        let level = match map.get("level") {
            None => None,
            Some(_) => Some(level(map, "t/u").map_err(at)?),
        };
        let mut matched = 0;
        for (p, slot) in parts.iter().zip(out.iter_mut()) {
            if p.name != name || level.is_some_and(|l| l != p.level) {
                continue;
            }
            if !p.is_quota() {
                return Err(at(ApiError::new(400, format!("{name} is a lease part: it has no units")).at("policy")));
            }
            if slot.is_some() {
                return Err(at(ApiError::new(400, format!("units for {name} are given twice")).at("policy")));
            }
            if let Policy::Quota { max_cost, .. } = *p.policy {
                within(admin, "units", n, max_cost).map_err(at)?;
            }
            *slot = Some(n);
            matched += 1;
        }
        if matched == 0 {
            return Err(at(
                ApiError::new(400, format!("the reservation has no part {name} at that level")).at("policy")
            ));
        }
    }
    let mut units = Vec::with_capacity(parts.len());
    for (p, slot) in parts.iter().zip(out) {
        match slot {
            Some(n) => units.push(n),
            None if !every => units.push(0),
            None => {
                return Err(ApiError::new(
                    400,
                    format!("{field} gives no units for {} at level {}", p.name, level_word(p.level)),
                )
                .at(field));
            }
        }
    }
    Ok(units)
}

fn settle_exchange<O>(cx: &Cx<'_>, named: &[Named<'_>], id: &str, op: O) -> Exchange
where
    O: Operation<Outcome = Settlement> + Send + 'static,
{
    let labels: Vec<(String, Level)> = named.iter().map(|n| (String::from(n.name), n.level)).collect();
    let id = String::from(id);
    let mut ex = Exchange::new(op, move |_, s| settlement_response(&labels, &id, &s));
    ex.timeout_ms = timeout(cx.config, named);
    ex
}

fn settlement_response(labels: &[(String, Level)], id: &str, s: &Settlement) -> ApiResponse {
    let Some(state) = s.state else {
        return ApiError::new(404, "no such reservation (unknown, or ended and forgotten)").at("id").response();
    };
    let parts = list(labels.iter().zip(&s.parts), |out, ((name, level), p)| {
        let level = Field::Word(level_word(*level));
        match *p {
            SettledPart::Quota { reserved, actual, refunded, charged, uncharged, debt, back } => object(
                out,
                &mut [
                    ("policy", Field::Text(name)),
                    ("level", level),
                    ("kind", Field::Word("quota")),
                    ("reserved", Field::Int(reserved)),
                    ("actual", Field::Int(actual)),
                    ("refunded", Field::Int(refunded)),
                    ("charged", Field::Int(charged)),
                    ("uncharged", Field::Int(uncharged)),
                    ("debt", Field::Int(debt)),
                    ("reclaimed", Field::Int(back)),
                ],
            ),
            SettledPart::Lease { done } => {
                let lease = match (done, state) {
                    (false, _) => "ended",
                    (true, State::Open) => "renewed",
                    (true, _) => "released",
                };
                object(
                    out,
                    &mut [
                        ("policy", Field::Text(name)),
                        ("level", level),
                        ("kind", Field::Word("semaphore")),
                        ("lease", Field::Word(lease)),
                    ],
                )
            }
        }
    });
    ApiResponse::flat(&mut [
        ("reservation", Field::Text(id)),
        ("state", Field::Word(state_word(state))),
        ("already_settled", Field::Bool(s.already_settled)),
        ("expires_ms", Field::Int(s.expires_at_ms)),
        ("parts", Field::Raw(&parts)),
    ])
}

/// The word of a lease part's result, as decisions and reservations answer it.
pub(super) fn lease_result(result: LeaseResult) -> &'static str {
    match result {
        LeaseResult::Full => "full",
        LeaseResult::Acquired => "acquired",
        LeaseResult::Renewed => "renewed",
        LeaseResult::Ended => "ended",
        LeaseResult::Held => "held",
    }
}
