//! What each route does: authentication, body and query parsing, and each route's answer.
//! Which route a request is, is [`crate::route`]'s business.

use alloc::borrow::ToOwned;
use alloc::boxed::Box;
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use rand_core::RngCore;
use redcount_core::json::{self, Json, Map};

use super::{
    ApiError, ApiRequest, ApiResponse, Caller, Config, Exchange, Field, Input, Local, MAX_BODY, Policy, Route, Step,
    Verdict, list, local, object, same_secret,
};
use redcount_core::command::Command;
use redcount_core::error::{InputError, Problem, ShapeError};
use redcount_core::ops::claim::Claim;
use redcount_core::ops::counter::{AddCounter, CounterStatus, GetCounter};
use redcount_core::ops::decision::{self, Decide, Part, PartOutcome};
use redcount_core::ops::inbox::{Append, Read, Trim};
use redcount_core::ops::quota::{Algorithm, OverrideQuota, RefundQuota, ResetQuota, TakeQuota};
use redcount_core::ops::redpacket::{self, Create, Grab, GrabOutcome, ReadGrabs, ReadStatus};
use redcount_core::ops::semaphore::{Action, SemaphoreResult, UpdateLease};
use redcount_core::ratelimit::Limit;
use redcount_core::script::Request;
use redcount_core::split;
use redcount_core::text;
use redcount_core::validate;
use redcount_core::value::Value;
use redcount_core::{Operation, ops};
use reservations::Close;

mod reservations;
pub use reservations::MAX_PUBLIC_LEASE_MS;

type Routed = Result<Step, ApiError>;

/// An HTTP request's route and caller: `None` for a CORS preflight (`OPTIONS` on any API
/// path). Checked in this order: the path (404, 400), the body's size (413), the token (401),
/// the route (404, 405). `binding`'s scope is the caller's, its admin rights added to the token's.
pub(crate) fn http(
    config: &Config,
    req: &ApiRequest<'_>,
    binding: &Caller,
) -> Result<Option<(Route, Caller)>, ApiError> {
    let segments = crate::route::segments(req.path)?;
    if req.body.len() > MAX_BODY {
        return Err(too_large());
    }
    if req.method == "OPTIONS" {
        return Ok(None);
    }
    let token = authenticate(config, req.authorization)?;
    let caller = Caller { admin: token.admin || binding.admin, scope: binding.scope.clone() };
    Ok(Some((Route::matching(req.method, segments)?, caller)))
}

fn too_large() -> ApiError {
    ApiError::new(413, format!("body larger than {MAX_BODY} bytes"))
}

/// One call: what the route says to do with this input, for this caller.
struct Cx<'a> {
    config: &'a Config,
    route: &'a Route,
    input: Input<'a>,
    caller: &'a Caller,
    key: Option<&'a str>,
    /// A local state will decide with the call: its exchange carries what it needs.
    planned: bool,
}

pub(crate) fn run<R: RngCore + ?Sized>(
    config: &Config,
    route: Route,
    input: Input<'_>,
    caller: &Caller,
    key: Option<&str>,
    rng: &mut R,
    planned: bool,
) -> Routed {
    if input.body().len() > MAX_BODY {
        return Err(too_large());
    }
    let cx = Cx { config, route: &route, input, caller, key, planned };
    let routed = dispatch(&cx, &route, rng);
    // A write route's call may still run when Redis answers late: its failure says so.
    match routed {
        Ok(Step::Send(mut ex)) => {
            ex.writes = route.id().spec().method != "GET";
            Ok(Step::Send(ex))
        }
        other => other,
    }
}

/// The handler of `route`.
fn dispatch<R: RngCore + ?Sized>(cx: &Cx<'_>, route: &Route, rng: &mut R) -> Routed {
    let (cx, config) = (cx, cx.config);
    match route {
        Route::Health {} => Ok(Step::Send(Exchange::new(Ping, |_, ()| {
            ApiResponse::flat(&mut [
                ("ok", Field::Bool(true)),
                ("rest", Field::Word("reachable")),
                ("redis", Field::Word("reachable")),
            ])
        }))),
        Route::Policies {} => {
            // By name, as a JSON map orders them (insertion sort: a few policies, and no
            // general sort's code in the bundle).
            let mut sorted: Vec<&(String, Policy)> = Vec::with_capacity(config.policies.len());
            for p in &config.policies {
                let at = sorted.iter().position(|q| q.0 > p.0).unwrap_or(sorted.len());
                sorted.insert(at, p);
            }
            let mut text = String::from("{");
            for (i, (name, p)) in sorted.into_iter().enumerate() {
                if i > 0 {
                    text.push(',');
                }
                // Policy names are ids: nothing to escape.
                text.push('"');
                text.push_str(name);
                text.push_str("\":");
                p.write_json(&mut text);
            }
            text.push('}');
            Ok(Step::Respond(ApiResponse::flat(&mut [("policies", Field::Raw(&text))])))
        }
        Route::OpenApi {} => openapi(),
        Route::CounterGet { policy, subject } => counter_get(cx, policy, subject),
        Route::CounterAdd { policy, subject } => counter_add(cx, policy, subject),
        Route::Claim { policy, subject } => claim(cx, policy, subject),
        Route::QuotaPeek { policy, subject } => quota_take(cx, policy, subject, true),
        Route::QuotaTake { policy, subject } => quota_take(cx, policy, subject, false),
        Route::QuotaReset { policy, subject } => quota_reset(cx, policy, subject),
        Route::QuotaRefund { policy, subject } => refund(cx, policy, subject),
        Route::OverrideSet { policy, subject } => override_set(cx, policy, subject),
        Route::OverrideClear { policy, subject } => override_clear(cx, policy, subject),
        Route::QuotaPeekTenant { policy, tenant, user } => quota_take(cx, policy, &tenant_user(tenant, user)?, true),
        Route::QuotaTakeTenant { policy, tenant, user } => quota_take(cx, policy, &tenant_user(tenant, user)?, false),
        Route::QuotaResetTenant { policy, tenant, user } => quota_reset(cx, policy, &tenant_user(tenant, user)?),
        Route::QuotaRefundTenant { policy, tenant, user } => refund(cx, policy, &tenant_user(tenant, user)?),
        Route::Decide { subject } => decide(cx, subject),
        Route::DecideTenant { tenant, user } => decide(cx, &tenant_user(tenant, user)?),
        Route::Reserve { subject } => reservations::reserve(cx, subject, rng),
        Route::ReserveTenant { tenant, user } => reservations::reserve(cx, &tenant_user(tenant, user)?, rng),
        Route::Settle { subject, id } => reservations::close(cx, subject, id, Close::Settle),
        Route::SettleTenant { tenant, user, id } => {
            reservations::close(cx, &tenant_user(tenant, user)?, id, Close::Settle)
        }
        Route::Extend { subject, id } => reservations::close(cx, subject, id, Close::Extend),
        Route::ExtendTenant { tenant, user, id } => {
            reservations::close(cx, &tenant_user(tenant, user)?, id, Close::Extend)
        }
        Route::Release { subject, id } => reservations::close(cx, subject, id, Close::Release),
        Route::ReleaseTenant { tenant, user, id } => {
            reservations::close(cx, &tenant_user(tenant, user)?, id, Close::Release)
        }
        Route::SemaphoreAcquire { policy, name } => semaphore(cx, policy, name, Act::Acquire),
        Route::SemaphoreRenew { policy, name } => semaphore(cx, policy, name, Act::Renew),
        Route::SemaphoreRelease { policy, name } => semaphore(cx, policy, name, Act::Release),
        Route::SemaphoreCheck { policy, name } => semaphore(cx, policy, name, Act::Check),
        Route::InboxRead { user } => inbox_read(cx, user),
        Route::InboxAppend { user } => inbox_append(cx, user),
        Route::InboxTrim { user } => inbox_trim(cx, user),
        Route::PacketCreate {} => create_packet(cx, rng),
        Route::PacketStatus { id } => packet_status(cx, id),
        Route::PacketGrab { id } => grab(cx, id),
        Route::PacketGrabs { id } => grabs(cx, id),
    }
}

/// `GET /api/openapi.json`: generated from the route table where std is (`redcount serve`);
/// the worker serves the same text as a static file, so its wasm carries none of it.
fn openapi() -> Routed {
    #[cfg(feature = "std")]
    {
        Ok(Step::Respond(ApiResponse::text(200, crate::openapi::document().to_owned())))
    }
    #[cfg(not(feature = "std"))]
    Err(ApiError::new(404, "the OpenAPI document is served as a static file (openapi.json)"))
}

impl<'a> Cx<'a> {
    /// The body's fields (a JSON object or empty), known names only.
    fn body(&self, known: &[&str]) -> Result<Fields, ApiError> {
        body(self.input.body(), known).map(Fields::Json)
    }

    /// A reading route's fields: HTTP's query string, or the JSON input's object.
    fn query(&self, known: &[&'static str]) -> Result<Fields, ApiError> {
        match self.input {
            Input::Http { query, .. } => Fields::query(query, known),
            Input::Json(bytes) => body(bytes, known).map(Fields::Json),
        }
    }

    fn admin(&self) -> bool {
        self.caller.is_admin()
    }

    /// `ex`, an override, refund or reset of `policy` for `subject`: a local state drops that
    /// subject's denials of it when the call is made, and again when it is answered.
    fn forgetting(&self, ex: Exchange, policy: &str, subject: &str) -> Exchange {
        self.forgetting_all(ex, [policy], subject)
    }

    /// [`Cx::forgetting`] of several policies (a reservation's parts).
    pub(crate) fn forgetting_all<'p>(
        &self,
        mut ex: Exchange,
        policies: impl IntoIterator<Item = &'p str>,
        subject: &str,
    ) -> Exchange {
        if self.planned {
            ex.plan = Some(Box::new(Local::forget_plan(self.caller, policies.into_iter().collect(), subject)));
        }
        ex
    }

    fn require_admin(&self) -> Result<(), ApiError> {
        match self.caller.is_admin() {
            true => Ok(()),
            false => Err(ApiError::new(401, "this action needs `Authorization: Bearer <admin token>`")),
        }
    }

    /// The `Idempotency-Key`, checked (1 to 255 visible ASCII characters), as the operation's
    /// replay key: scoped by the route's method and path, fingerprinted by the parsed body.
    fn idempotency(&self) -> Result<Option<ops::Idempotency>, ApiError> {
        let Some(k) = self.key else { return Ok(None) };
        if k.is_empty() || k.len() > 255 || !k.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(
                ApiError::new(400, "Idempotency-Key must be 1 to 255 visible ASCII characters").at("Idempotency-Key")
            );
        }
        // The fingerprint is of the parsed request, so `{"delta": 1}` and `{"delta":1}` are one
        // request (objects are re-serialised with sorted keys). No body is the empty object:
        // routes whose body is optional read it so.
        let body = self.input.body();
        let canonical = match json::from_slice(body) {
            Ok(json) => {
                let mut text = String::with_capacity(body.len());
                if crate::canonical(&mut text, &json) { text.into_bytes() } else { body.to_vec() }
            }
            Err(_) if body.iter().all(u8::is_ascii_whitespace) => b"{}".to_vec(),
            Err(_) => body.to_vec(),
        };
        let scope = scope(k, self.route.spec().method, &self.route.path(), self.caller.scope());
        Ok(Some(ops::Idempotency::new(&scope, &canonical)))
    }

    /// `op`, made replayable by the `Idempotency-Key` if the call has one.
    fn replayable<O: ops::Replayable>(&self, op: Result<O, InputError>) -> Result<ops::Idempotent<O>, ApiError> {
        let op = op?;
        Ok(ops::Idempotent::new(op, self.idempotency()?))
    }

    /// The policy `name` (404 when none is configured). Callers match the variant they
    /// want and answer [`wrong_kind`] otherwise, so no kind string is checked apart from the
    /// data (and no generic copy of this is made per kind).
    fn find(&self, name: &str) -> Result<&'a Policy, ApiError> {
        validate::id("policy", name)?;
        self.config.policy(name).ok_or_else(|| ApiError::new(404, format!("no policy named {name}")).at("policy"))
    }
}

/// The answer for the policy `name`, a `p`, where a `kind` policy is wanted.
fn wrong_kind(name: &str, p: &Policy, kind: &str) -> ApiError {
    ApiError::new(404, format!("policy {name} is a {} policy, not a {kind} policy", p.kind())).at("policy")
}

/// The subject `TENANT/USER` of a tenant route's two segments (checked, as every subject, by
/// the operation, after the policy: a segment holding `/` makes no valid subject).
/// A tenant route's subject, `TENANT/USER`, each part checked under its own name.
fn tenant_user(tenant: &str, user: &str) -> Result<String, ApiError> {
    validate::id("tenant", tenant)?;
    validate::id("user", user)?;
    Ok(format!("{tenant}/{user}"))
}

/// What makes two uses of one `Idempotency-Key` the same request: the method, the route
/// and the key (the layout is part of the stored data: red-packet ids derive from it), and
/// for a scoped caller its scope first, so no two scopes derive one record name or packet id
/// from the same key (their keys live apart anyway: this keeps even the names apart).
fn scope(key: &str, method: &str, path: &str, caller: Option<&crate::Scope>) -> Vec<u8> {
    let mut scope = Vec::with_capacity(method.len() + path.len() + key.len() + 2);
    if let Some(s) = caller {
        scope.extend_from_slice(s.as_str().as_bytes());
        scope.push(b'\n');
    }
    scope.extend_from_slice(method.as_bytes());
    scope.push(b'\n');
    scope.extend_from_slice(path.as_bytes());
    scope.push(b'\n');
    scope.extend_from_slice(key.as_bytes());
    scope
}

impl Exchange {
    /// Bounds the call by `policy`'s `timeout_ms`, if it declares one.
    fn bounded_by(mut self, config: &Config, policy: &str) -> Self {
        self.timeout_ms = config.failure_mode(policy).timeout_ms;
        self
    }

    /// A decision route: bounded by `policy`'s `timeout_ms`, and answering its declared
    /// failure mode in `field` when Redis does not answer (`allow` only if `allowable`:
    /// a lease cannot be granted without Redis).
    fn deciding(mut self, config: &Config, policy: &str, field: &'static str, allowable: bool) -> Self {
        let mode = config.failure_mode(policy);
        self.degrade = Some((field, mode.allow && allowable));
        self.timeout_ms = mode.timeout_ms;
        self
    }
}

fn send(ex: Exchange) -> Routed {
    Ok(Step::Send(ex))
}

pub(crate) fn authenticate(config: &Config, header: Option<&str>) -> Result<Caller, ApiError> {
    let Some(h) = header else { return Ok(Caller::public()) };
    let token = redcount_core::text::bearer_token(h).unwrap_or("");
    match &config.admin_token {
        Some(admin) if !token.is_empty() && same_secret(token.as_bytes(), admin.as_bytes()) => Ok(Caller::admin()),
        _ => Err(ApiError::new(401, "invalid token (send none for public access, or the admin token)")),
    }
}

pub(crate) fn preflight(config: &Config, origin: Option<&str>) -> ApiResponse {
    let mut r = ApiResponse::text(204, String::new());
    if origin.is_some_and(|o| config.cors_origins.iter().any(|a| a == o || a == "*")) {
        r.headers.push(("Access-Control-Allow-Methods", "GET, POST, PUT, DELETE, OPTIONS".to_owned()));
        r.headers.push(("Access-Control-Allow-Headers", "Content-Type, Authorization, Idempotency-Key".to_owned()));
        r.headers.push(("Access-Control-Max-Age", "600".to_owned()));
    }
    r
}

/// A public request asking for more than the policy grants the public.
fn beyond(field: &'static str, what: String) -> ApiError {
    ApiError::new(403, format!("{field}: {what} is past the public limit (admin only)")).at(field)
}

/// Refuses `n` of `field` past `most`, the policy's public limit, unless the caller is `admin`
/// (one function for every such bound: the worker's bundle has no room for a copy each).
fn within(admin: bool, field: &'static str, n: i64, most: i64) -> Result<(), ApiError> {
    match !admin && n > most {
        true => Err(beyond(field, format!("{n} > {most}"))),
        false => Ok(()),
    }
}

// ---------------------------------------------------------------------------------------
// Counters, claims, quotas, overrides.

fn counter_policy(cx: &Cx<'_>, policy: &str) -> Result<(ops::counter::Bounds, ops::counter::Storage, i64), ApiError> {
    match *cx.find(policy)? {
        Policy::Counter { bounds, storage, max_step } => Ok((bounds, storage, max_step)),
        ref p => Err(wrong_kind(policy, p, "counter")),
    }
}

/// `GET /api/counters/{policy}/{subject}`.
fn counter_get(cx: &Cx<'_>, policy: &str, subject: &str) -> Routed {
    let (_, storage, _) = counter_policy(cx, policy)?;
    let op = GetCounter::new(policy, subject, storage)?;
    send(Exchange::new(op, |_, v| ApiResponse::flat(&mut [("value", Field::Int(v))])).bounded_by(cx.config, policy))
}

/// `POST /api/counters/{policy}/{subject}` `{"delta": N}`.
fn counter_add(cx: &Cx<'_>, policy: &str, subject: &str) -> Routed {
    let (bounds, storage, max_step) = counter_policy(cx, policy)?;
    let delta = cx.body(&["delta"])?.int("delta", -ops::counter::MAX_VALUE, ops::counter::MAX_VALUE, None)?;
    within(cx.admin(), "delta", delta.abs(), max_step)?;
    let op = cx.replayable(AddCounter::new(policy, subject, storage, delta, bounds))?;
    let ex = Exchange::new(op, |_, o| {
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
    });
    send(ex.bounded_by(cx.config, policy))
}

/// `POST /api/claims/{policy}/{subject}`.
fn claim(cx: &Cx<'_>, policy: &str, subject: &str) -> Routed {
    cx.body(&[])?;
    let window_ms = match *cx.find(policy)? {
        Policy::Claim { window_ms } => window_ms,
        ref p => return Err(wrong_kind(policy, p, "claim")),
    };
    let op = cx.replayable(Claim::new(policy, subject, window_ms))?;
    let name = policy.to_owned();
    let ex = Exchange::new(op, move |_, o| {
        let r = ApiResponse::flat(&mut [
            ("claimed", Field::Bool(o.claimed)),
            ("retry_after_ms", Field::opt(o.window_left_ms)),
        ]);
        let verdict =
            Verdict { allowed: o.claimed, retry_after_ms: if o.claimed { 0 } else { o.window_left_ms.unwrap_or(0) } };
        // A claim refused is an answer, not a throttle: no Retry-After (its wait is in the body).
        let mut r = r.decided(&[Limit::claim(&name, window_ms, &o)], Verdict { retry_after_ms: 0, ..verdict });
        r.verdict = Some(verdict);
        r
    });
    send(ex.deciding(cx.config, policy, "claimed", true))
}

fn quota_policy(cx: &Cx<'_>, policy: &str) -> Result<(Algorithm, i64), ApiError> {
    match *cx.find(policy)? {
        Policy::Quota { algorithm, max_cost, .. } => Ok((algorithm, max_cost)),
        ref p => Err(wrong_kind(policy, p, "quota")),
    }
}

/// `POST /api/quotas/{policy}/{subject}` `{"cost": N}` takes; `GET …?cost=N` peeks.
fn quota_take(cx: &Cx<'_>, policy: &str, subject: &str, peek: bool) -> Routed {
    let (algorithm, max_cost) = quota_policy(cx, policy)?;
    let name = policy.to_owned();
    // A take with an Idempotency-Key may be answered from its stored reply: never repeated.
    let repeat_ms = if peek || cx.key.is_none() { cx.config.local_mode(policy).cache_denials_ms } else { 0 };
    let render = move |_: &ops::Idempotent<TakeQuota>, o: ops::quota::QuotaOutcome| {
        quota_answer(&name, &algorithm, o, false, i64::from(repeat_ms))
    };
    let (op, cost) = if peek {
        let cost = cx.query(&["cost"])?.int("cost", 1, algorithm.limit(), Some(1))?;
        // A peek writes nothing, not even a stored reply.
        (ops::Idempotent::new(TakeQuota::peek(policy, subject, algorithm, cost)?, None), cost)
    } else {
        let cost = cx.body(&["cost"])?.int("cost", 1, algorithm.limit(), Some(1))?;
        within(cx.admin(), "cost", cost, max_cost)?;
        (cx.replayable(TakeQuota::take(policy, subject, algorithm, cost))?, cost)
    };
    let mut ex = Exchange::new(op, render).deciding(cx.config, policy, "allowed", true);
    // A take with an Idempotency-Key is Redis's alone: its stored answer may be an admission.
    if cx.planned && (peek || cx.key.is_none()) {
        let plan = Local::quota_plan(cx.config, cx.caller, policy, subject, algorithm, cost, peek);
        ex.plan = Some(Box::new(local::Plan::Quota(plan)));
    }
    send(ex)
}

/// A quota take's or peek's answer (`cached`: repeated from memory, see [`Local`]). A denial
/// says `cache_ms`, how long from now a client may repeat it without asking: `repeat_ms` (0 for
/// never), and never past its wait.
pub(crate) fn quota_answer(
    name: &str,
    algorithm: &Algorithm,
    o: ops::quota::QuotaOutcome,
    cached: bool,
    repeat_ms: i64,
) -> ApiResponse {
    let cache_ms = if o.allowed { 0 } else { o.retry_after_ms.min(repeat_ms) };
    let mut fields = [
        ("allowed", Field::Bool(o.allowed)),
        ("limit", Field::Int(o.limit)),
        ("remaining", Field::Int(o.remaining)),
        ("reset_ms", Field::Int(o.reset_ms)),
        ("retry_after_ms", Field::Int(o.retry_after_ms)),
        ("cache_ms", Field::Int(cache_ms)),
        ("cached", Field::Bool(true)),
    ];
    // (What is repeated from memory may be repeated again: `cached` comes with `cache_ms`.)
    let n = 5 + usize::from(cache_ms > 0) + usize::from(cached);
    let mut r = ApiResponse::flat(&mut fields[..n]).decided(
        &[Limit::quota(name, algorithm, &o)],
        Verdict { allowed: o.allowed, retry_after_ms: o.retry_after_ms },
    );
    r.seen = Some(local::Seen::Quota(o));
    r
}

/// `DELETE /api/quotas/{policy}/{subject}` (admin).
fn quota_reset(cx: &Cx<'_>, policy: &str, subject: &str) -> Routed {
    let (algorithm, _) = quota_policy(cx, policy)?;
    cx.require_admin()?;
    let op = cx.replayable(ResetQuota::new(policy, subject, algorithm))?;
    let ex = Exchange::new(op, |_, existed| ApiResponse::flat(&mut [("reset", Field::Bool(existed))]));
    send(cx.forgetting(ex.bounded_by(cx.config, policy), policy, subject))
}

/// `POST /api/quotas/{policy}/{subject}/refund` (admin): gives units back, never above the
/// limit; answers how many were given back.
fn refund(cx: &Cx<'_>, policy: &str, subject: &str) -> Routed {
    let (algorithm, _) = quota_policy(cx, policy)?;
    cx.require_admin()?;
    let cost = cx.body(&["cost"])?.int("cost", 1, algorithm.limit(), Some(1))?;
    let op = cx.replayable(RefundQuota::new(policy, subject, algorithm, cost))?;
    let ex = Exchange::new(op, |_, given| ApiResponse::flat(&mut [("refunded", Field::Int(given))]));
    let mut ex = cx.forgetting(ex.bounded_by(cx.config, policy), policy, subject);
    // A shell's running lease of the subject may take the refund ([`Local::refund`]); not one
    // with an Idempotency-Key, whose retry would give back that part again.
    if cx.key.is_none()
        && let Some(local::Plan::Forget(f)) = ex.plan.as_deref_mut()
    {
        f.refund = Some(Box::new((Local::lease_key(cx.config, cx.caller, policy, subject), cost)));
    }
    send(ex)
}

/// A quota's algorithm (`Some`) or a semaphore (`None`): the policies an override sizes.
fn sized(cx: &Cx<'_>, policy: &str) -> Result<Option<Algorithm>, ApiError> {
    match cx.config.policy(policy) {
        Some(Policy::Quota { algorithm, .. }) => Ok(Some(*algorithm)),
        Some(Policy::Semaphore { .. }) => Ok(None),
        _ => Err(ApiError::new(404, format!("no quota or semaphore policy named `{policy}`")).at("policy")),
    }
}

/// `PUT /api/overrides/{policy}/{subject}` (admin) `{"limit": N, "ttl_ms": T}` sets a
/// subject's own size of a quota policy (`limit`, or the algorithm's own name for it:
/// `capacity`, `burst`), or a semaphore's own limit, for `ttl_ms` (absent: until cleared).
fn override_set(cx: &Cx<'_>, policy: &str, subject: &str) -> Routed {
    let algorithm = sized(cx, policy)?;
    cx.require_admin()?;
    let own = algorithm.map_or("limit", |a| a.size_field());
    let fields: &[&str] = if own == "limit" { &["limit", "ttl_ms"] } else { &["limit", own, "ttl_ms"] };
    let b = cx.body(fields)?;
    let max = algorithm.map_or(ops::semaphore::MAX_LIMIT, |a| a.max_size());
    let size = match (own != "limit" && b.has(own), b.has("limit")) {
        (true, true) => return Err(ApiError::new(400, format!("give `limit` or `{own}`, not both")).at("limit")),
        (true, false) => b.int(own, 1, max, None)?,
        _ => b.int("limit", 1, max, None)?,
    };
    let ttl_ms = b.int("ttl_ms", 1, ops::quota::MAX_OVERRIDE_TTL_MS, Some(0))?;
    let op = cx.replayable(match algorithm {
        Some(a) => OverrideQuota::set(policy, subject, a, size, ttl_ms),
        None => OverrideQuota::set_semaphore(policy, subject, size, ttl_ms),
    })?;
    let (name, who) = (policy.to_owned(), subject.to_owned());
    let ex = Exchange::new(op, move |_, replaced| {
        ApiResponse::flat(&mut [
            ("policy", Field::Text(&name)),
            ("subject", Field::Text(&who)),
            ("limit", Field::Int(size)),
            ("ttl_ms", Field::opt((ttl_ms != 0).then_some(ttl_ms))),
            ("replaced", Field::Bool(replaced)),
        ])
    });
    send(cx.forgetting(ex.bounded_by(cx.config, policy), policy, subject))
}

/// `DELETE /api/overrides/{policy}/{subject}` (admin).
fn override_clear(cx: &Cx<'_>, policy: &str, subject: &str) -> Routed {
    let algorithm = sized(cx, policy)?;
    cx.require_admin()?;
    let op = cx.replayable(match algorithm {
        Some(_) => OverrideQuota::clear(policy, subject),
        None => OverrideQuota::clear_semaphore(policy, subject),
    })?;
    let ex = Exchange::new(op, |_, existed| ApiResponse::flat(&mut [("cleared", Field::Bool(existed))]));
    send(cx.forgetting(ex.bounded_by(cx.config, policy), policy, subject))
}

// ---------------------------------------------------------------------------------------
// Decisions and semaphores.

/// `POST /api/decisions/{subject}` `{"parts": [{"policy": "per-second", "cost": 1},
/// {"policy": "in-flight", "holder": "job-7"}], "peek": false}`: quota and semaphore policies
/// of one subject decided at once, all or nothing (a denied decision consumes nothing).
fn decide(cx: &Cx<'_>, subject: &str) -> Routed {
    let b = body(cx.input.body(), &["parts", "peek"])?;
    let peek = match b.get("peek") {
        None | Some(Json::Bool(false)) => false,
        Some(Json::Bool(true)) => true,
        Some(_) => return Err(ApiError::new(400, "peek must be true or false").at("peek")),
    };
    let list = parts_list(&b)?;
    let mut parts = Vec::with_capacity(list.len());
    let mut costs = Vec::with_capacity(list.len());
    let mut kinds: Vec<(String, Option<Algorithm>)> = Vec::with_capacity(list.len());
    // The declared failure mode of the whole: allow only when every part declares it (a
    // lease never degrades to a pass), and the shortest time budget of the parts.
    let (mut allow_all, mut timeout_ms) = (true, None::<u32>);
    // A denial is repeated by a client for the least cache_denials_ms of the parts (never with
    // a lease part, whose state is live): at most each denying part's.
    let mut repeat_ms = u32::MAX;
    for (i, item) in list.iter().enumerate() {
        let (part, name, algorithm, cost) = decision_part(cx, subject, item).map_err(|e| e.in_part(i))?;
        costs.push((cost, part.level()));
        repeat_ms = repeat_ms.min(algorithm.map_or(0, |_| cx.config.local_mode(&name).cache_denials_ms));
        let mode = cx.config.failure_mode(&name);
        allow_all &= mode.allow && algorithm.is_some();
        timeout_ms = match (timeout_ms, mode.timeout_ms) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        parts.push(part);
        kinds.push((name, algorithm));
    }
    // A peek writes nothing, not even a stored reply: like a quota's GET it uses no key (but
    // a malformed one is refused, as on every route that takes one).
    let idem = cx.idempotency()?;
    let keyed = idem.is_some() && !peek;
    let op = match peek {
        true => ops::Idempotent::new(Decide::peek(subject, parts)?, None),
        false => ops::Idempotent::new(Decide::new(subject, parts)?, idem),
    };
    let plan = (cx.planned && !keyed)
        .then(|| Local::decision_plan(cx.config, cx.caller, subject, kinds.clone(), &costs, peek));
    // (Nor with an Idempotency-Key: its answer may be a stored one.)
    let repeat_ms = if keyed { 0 } else { i64::from(repeat_ms) };
    let mut ex = Exchange::new(op, move |_, d| decision_response(&kinds, d, peek, false, repeat_ms));
    ex.degrade = Some(("allowed", allow_all));
    ex.timeout_ms = timeout_ms;
    ex.plan = plan.map(|p| Box::new(local::Plan::Decision(p)));
    send(ex)
}

/// A body's `parts`: an array of 1 to [`decision::MAX_PARTS`] items.
fn parts_list(b: &Map) -> Result<&Vec<Json>, ApiError> {
    let list = match b.get("parts") {
        Some(Json::Array(list)) => list,
        None => return Err(ApiError::new(400, "parts is required").at("parts")),
        Some(_) => return Err(ApiError::new(400, "parts must be an array of parts").at("parts")),
    };
    if list.is_empty() || list.len() > decision::MAX_PARTS {
        return Err(ApiError::new(400, format!("parts must hold 1 to {} parts", decision::MAX_PARTS)).at("parts"));
    }
    Ok(list)
}

/// One part of a decision: the part, its policy's name, its algorithm (`None`: a lease) and
/// its cost (0 for a lease).
fn decision_part(cx: &Cx<'_>, subject: &str, item: &Json) -> Result<(Part, String, Option<Algorithm>, i64), ApiError> {
    let Json::Object(map) = item else {
        return Err(ApiError::new(400, "a part must be a JSON object").at("part"));
    };
    let part = Fields::Json(map.clone());
    let name = part.string("policy")?;
    let (built, algorithm, cost) = match *cx.find(&name)? {
        Policy::Quota { algorithm, max_cost, .. } => {
            known_fields(map, &["policy", "cost", "level"])?;
            let cost = part.int("cost", 1, algorithm.limit(), Some(1))?;
            within(cx.admin(), "cost", cost, max_cost)?;
            (Part::quota(&name, algorithm, cost), Some(algorithm), cost)
        }
        Policy::Semaphore { limit, lease_ms } => {
            known_fields(map, &["policy", "holder", "level"])?;
            (Part::lease(&name, &part.string("holder")?, limit, lease_ms), None, 0)
        }
        ref other => {
            return Err(ApiError::new(
                400,
                format!("policy {name} is a {} policy: a decision takes quota and semaphore policies", other.kind()),
            )
            .at("policy"));
        }
    };
    let level = reservations::level(map, subject)?;
    Ok((built?.at(level), name, algorithm, cost))
}

/// A decision's answer (`cached` and `repeat_ms`: as a quota's, see [`quota_answer`]).
pub(crate) fn decision_response(
    kinds: &[(String, Option<Algorithm>)],
    d: decision::Decision,
    peek: bool,
    cached: bool,
    repeat_ms: i64,
) -> ApiResponse {
    let cache_ms = if d.allowed { 0 } else { d.retry_after_ms.min(repeat_ms) };
    let parts = list(kinds.iter().zip(&d.parts), |out, ((name, _), p)| part_object(out, name, p, None));
    let denied_by = d.denied_by.and_then(|i| kinds.get(i)).map_or(Field::Null, |(n, _)| Field::Text(n));
    let limits: Vec<Limit<'_>> =
        kinds.iter().zip(&d.parts).filter_map(|((name, a), p)| Limit::part(name, a.as_ref(), p)).collect();
    let mut fields = [
        ("allowed", Field::Bool(d.allowed)),
        ("denied_by", denied_by),
        ("retry_after_ms", Field::Int(d.retry_after_ms)),
        ("peek", Field::Bool(peek)),
        ("parts", Field::Raw(&parts)),
        ("cache_ms", Field::Int(cache_ms)),
        ("cached", Field::Bool(true)),
    ];
    let n = 5 + usize::from(cache_ms > 0) + usize::from(cached);
    let mut r = ApiResponse::flat(&mut fields[..n])
        .decided(&limits, Verdict { allowed: d.allowed, retry_after_ms: d.retry_after_ms });
    drop(limits);
    // Only a denial is ever kept.
    if !d.allowed {
        r.seen = Some(local::Seen::Decision(d));
    }
    r
}

/// What a reservation adds to a part's answer: its level, and for a quota part the units
/// reserved and those given back (`reclaimed`).
struct Held {
    level: &'static str,
    reserved: i64,
    reclaimed: i64,
}

/// One part's answer in a decision's or a reservation's `parts` (`held`: a reservation's).
fn part_object(out: &mut String, name: &str, p: &PartOutcome, held: Option<Held>) {
    // `object` sorts the fields by name: a reservation's are written after the others.
    let level = ("level", held.as_ref().map_or(Field::Null, |h| Field::Word(h.level)));
    match *p {
        PartOutcome::Quota(q) => {
            let (reserved, reclaimed) = held.as_ref().map_or((0, 0), |h| (h.reserved, h.reclaimed));
            let mut fields = [
                ("policy", Field::Text(name)),
                ("kind", Field::Word("quota")),
                ("allowed", Field::Bool(q.allowed)),
                ("limit", Field::Int(q.limit)),
                ("remaining", Field::Int(q.remaining)),
                ("reset_ms", Field::Int(q.reset_ms)),
                ("retry_after_ms", Field::Int(q.retry_after_ms)),
                level,
                ("reserved", Field::Int(reserved)),
                ("reclaimed", Field::Int(reclaimed)),
            ];
            let n = if held.is_some() { 10 } else { 7 };
            object(out, &mut fields[..n]);
        }
        PartOutcome::Lease { result, in_use, limit, earliest_end_ms, retry_after_ms, lease_ms, fencing_token } => {
            let mut fields = [
                ("policy", Field::Text(name)),
                ("kind", Field::Word("semaphore")),
                ("allowed", Field::Bool(p.allowed())),
                ("result", Field::Word(reservations::lease_result(result))),
                ("in_use", Field::Int(in_use)),
                ("limit", Field::Int(limit)),
                ("earliest_end_ms", Field::opt(earliest_end_ms)),
                ("retry_after_ms", Field::Int(retry_after_ms)),
                ("lease_ms", Field::Int(lease_ms)),
                ("fencing_token", Field::opt(fencing_token)),
                level,
            ];
            let n = if held.is_some() { 11 } else { 10 };
            object(out, &mut fields[..n]);
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Act {
    Acquire,
    Renew,
    Release,
    Check,
}

/// `POST /api/semaphores/{policy}/{name}/{acquire|renew|release|check}` `{"holder": "h"}`
/// (`check` also takes the `fencing_token`).
fn semaphore(cx: &Cx<'_>, policy: &str, name: &str, act: Act) -> Routed {
    let fields: &[&str] = if act == Act::Check { &["holder", "fencing_token"] } else { &["holder"] };
    let b = cx.body(fields)?;
    let action = match act {
        Act::Acquire => Action::Acquire,
        Act::Renew => Action::Renew,
        Act::Release => Action::Release,
        Act::Check => Action::Check { fencing_token: b.int("fencing_token", 1, validate::MAX_SAFE, None)? },
    };
    let holder = b.string("holder")?;
    let (limit, lease_ms) = match *cx.find(policy)? {
        Policy::Semaphore { limit, lease_ms } => (limit, lease_ms),
        ref p => return Err(wrong_kind(policy, p, "semaphore")),
    };
    let op = cx.replayable(UpdateLease::new(policy, name, action, &holder, limit, lease_ms))?;
    let policy_name = policy.to_owned();
    let ex = Exchange::new(op, move |_, o| {
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
        let holding = matches!(o.result, SemaphoreResult::Acquired | SemaphoreResult::Renewed | SemaphoreResult::Held);
        let r = ApiResponse::flat(&mut [
            ("result", Field::Word(result)),
            ("holding", Field::Bool(holding)),
            ("in_use", Field::Int(o.in_use)),
            ("limit", Field::Int(o.limit)),
            ("earliest_end_ms", Field::opt(o.earliest_end_ms)),
            ("lease_ms", Field::Int(o.lease_ms)),
            ("fencing_token", Field::opt(o.fencing_token)),
        ]);
        // A full semaphore is an answer, not a throttle: no Retry-After (its wait is in the body).
        let mut r = r.decided(&[Limit::lease(&policy_name, &o)], Verdict { allowed: true, retry_after_ms: 0 });
        let wait = if holding { 0 } else { o.earliest_end_ms.unwrap_or(0) };
        r.verdict = Some(Verdict { allowed: holding, retry_after_ms: wait });
        r
    });
    // Leases always deny when Redis does not answer: a lease cannot be granted without it.
    send(ex.deciding(cx.config, policy, "holding", false))
}

// ---------------------------------------------------------------------------------------
// Inboxes and red packets.

/// The inbox policy (routes name none: the first one), checked against the caller.
fn inbox_policy<'c>(cx: &Cx<'c>) -> Result<(&'c str, i64, i64, i64), ApiError> {
    let Some((name, &Policy::Inbox { ttl_ms, max_len, max_age_s, public })) = cx.config.first_of("inbox") else {
        return Err(ApiError::new(404, "no inbox policy is configured"));
    };
    if !public {
        cx.require_admin()?;
    }
    Ok((name, ttl_ms, max_len, max_age_s))
}

/// `GET /api/inbox/{user}/messages?after=&limit=`.
fn inbox_read(cx: &Cx<'_>, user: &str) -> Routed {
    let (name, ..) = inbox_policy(cx)?;
    let q = cx.query(&["after", "limit"])?;
    let after = q.opt_int("after", 0, validate::MAX_SAFE)?;
    let limit = q.int("limit", 1, ops::inbox::MAX_PAGE, Some(50))?;
    let op = Read::new(user, after, limit)?;
    let ex = Exchange::new(op, |_, msgs| {
        let messages = list(msgs, |out, m| {
            let body = String::from_utf8_lossy(&m.body);
            object(
                out,
                &mut [("id", Field::Int(m.id)), ("time", Field::Int(m.time.into())), ("body", Field::Text(&body))],
            )
        });
        ApiResponse::flat(&mut [("messages", Field::Raw(&messages))])
    });
    send(ex.bounded_by(cx.config, name))
}

/// `POST /api/inbox/{user}/messages` `{"id": N, "body": "…"}`.
fn inbox_append(cx: &Cx<'_>, user: &str) -> Routed {
    let (name, ttl_ms, max_len, _) = inbox_policy(cx)?;
    let b = cx.body(&["id", "body"])?;
    let id = b.int("id", 0, validate::MAX_SAFE, None)?;
    let text = b.string("body")?;
    let op = cx.replayable(Append::new(user, id, &text, ttl_ms, max_len))?;
    let ex = Exchange::new(op, |_, o| {
        let status = if o.stored { 201 } else { 200 };
        ApiResponse::object(status, &mut [("stored", Field::Bool(o.stored)), ("length", Field::Int(o.length))])
    });
    send(ex.bounded_by(cx.config, name))
}

/// `POST /api/inbox/{user}/trim`.
fn inbox_trim(cx: &Cx<'_>, user: &str) -> Routed {
    let (name, _, max_len, max_age_s) = inbox_policy(cx)?;
    cx.body(&[])?;
    let op = cx.replayable(Trim::new(user, max_age_s, max_len, 1000))?;
    let ex = Exchange::new(op, |_, o| {
        ApiResponse::flat(&mut [("deleted", Field::Int(o.deleted)), ("newest_time", Field::opt(o.newest_time))])
    });
    send(ex.bounded_by(cx.config, name))
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

fn not_found_packet() -> ApiResponse {
    ApiResponse::error(404, "no such red packet (unknown or expired)", Some("id"))
}

/// `POST /api/redpackets` `{"total_cents": N, "count": N, "policy": "…", "min_cents": N}`.
fn create_packet<R: RngCore + ?Sized>(cx: &Cx<'_>, rng: &mut R) -> Routed {
    let b = cx.body(&["total_cents", "count", "policy", "min_cents"])?;
    let (name, (max_shares, max_total_cents, min_cents, ttl_ms)) = match b.opt_string("policy")? {
        Some(name) => {
            let p = cx.find(&name)?;
            let Some(settings) = red_packets(p) else { return Err(wrong_kind(&name, p, "redpackets")) };
            (name, settings)
        }
        None => match cx.config.first_of("redpackets").and_then(|(n, p)| Some((n.to_owned(), red_packets(p)?))) {
            Some(found) => found,
            None => return Err(ApiError::new(404, "no redpackets policy is configured").at("policy")),
        },
    };
    let total = b.int("total_cents", 1, split::MAX_TOTAL, None)?;
    let count = b.int("count", 1, split::MAX_COUNT, None)?;
    let min = b.int("min_cents", 1, split::MAX_TOTAL, Some(min_cents))?;
    within(cx.admin(), "total_cents", total, max_total_cents)?;
    within(cx.admin(), "count", count, max_shares)?;
    if !cx.admin() && min != min_cents {
        return Err(beyond("min_cents", format!("{min} ≠ {min_cents}")));
    }
    // With an Idempotency-Key the id comes from the key, so a replay finds the same packet.
    let idem = cx.idempotency()?;
    let id = match &idem {
        Some(i) => redpacket::id_for(i, cx.config.id_secret()),
        None => redpacket::new_id(rng),
    };
    let op = ops::Idempotent::new(Create::new(&id, total, count, min, ttl_ms, rng)?, idem);
    let timeout = cx.config.failure_mode(&name).timeout_ms;
    let mut ex = Exchange::new(op, move |_, o| {
        if !o.created {
            return ApiResponse::error(409, "a packet with this id exists; try again", None);
        }
        ApiResponse::object(
            201,
            &mut [
                ("id", Field::Text(&id)),
                ("policy", Field::Text(&name)),
                ("total_cents", Field::Int(total)),
                ("count", Field::Int(count)),
                ("expires_at_ms", Field::Int(o.expires_at_ms)),
            ],
        )
    });
    ex.timeout_ms = timeout;
    send(ex)
}

/// `GET /api/redpackets/{id}`.
fn packet_status(cx: &Cx<'_>, id: &str) -> Routed {
    let op = ReadStatus::new(id)?;
    let id = id.to_owned();
    let mut ex = Exchange::new(op, move |_, o| match o {
        Some(s) => ApiResponse::flat(&mut [
            ("id", Field::Text(&id)),
            ("total_cents", Field::Int(s.total)),
            ("count", Field::Int(s.count)),
            ("remaining", Field::Int(s.remaining)),
            ("claimed", Field::Int(s.grabbed)),
            ("claimed_cents", Field::Int(s.grabbed_sum)),
            ("created_ms", Field::Int(s.created_ms)),
            ("expires_ms", Field::Int(s.expires_ms)),
        ]),
        None => not_found_packet(),
    });
    ex.timeout_ms = packet_timeout(cx.config);
    send(ex)
}

/// `POST /api/redpackets/{id}/grab` `{"user": "…"}`.
fn grab(cx: &Cx<'_>, id: &str) -> Routed {
    let user = cx.body(&["user"])?.string("user")?;
    let op = Grab::new(id, &user)?;
    let mut ex = Exchange::new(op, |_, o| match o {
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
        GrabOutcome::Empty => ApiResponse::flat(&mut [("outcome", Field::Word("empty")), ("remaining", Field::Int(0))]),
        GrabOutcome::NotFound => not_found_packet(),
    });
    ex.timeout_ms = packet_timeout(cx.config);
    send(ex)
}

/// `GET /api/redpackets/{id}/claims?offset=&limit=`: the packet's grabs, in order.
fn grabs(cx: &Cx<'_>, id: &str) -> Routed {
    let q = cx.query(&["offset", "limit"])?;
    let offset = q.int("offset", 0, split::MAX_COUNT, Some(0))?;
    let limit = q.int("limit", 1, redpacket::MAX_PAGE, Some(100))?;
    let op = ReadGrabs::new(id, offset, limit)?;
    let mut ex = Exchange::new(op, |_, claims| {
        let claims = list(claims, |out, c| {
            object(
                out,
                &mut [
                    ("user", Field::Text(&c.user)),
                    ("amount_cents", Field::Int(c.amount)),
                    ("amount", Field::Int(c.amount)),
                    ("index", Field::Int(c.index)),
                    ("at_ms", Field::Int(c.at_ms)),
                ],
            )
        });
        ApiResponse::flat(&mut [("claims", Field::Raw(&claims))])
    });
    ex.timeout_ms = packet_timeout(cx.config);
    send(ex)
}

// ---------------------------------------------------------------------------------------
// Fields: a JSON body's, or a query string's.

/// A route's input fields, known names only: a JSON object's, or a query string's (where
/// integers are decimal text).
enum Fields {
    Json(Map),
    Query(Vec<(String, String)>),
}

/// The fields of a JSON object body (empty: no fields), known names only.
fn body(bytes: &[u8], known: &[&str]) -> Result<Map, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(Map::new());
    }
    let (json, repeated) =
        json::read(bytes).map_err(|e| ApiError::new(400, format!("body is not valid JSON: {e}")).at("body"))?;
    let Json::Object(map) = json else {
        return Err(ApiError::new(400, "body must be a JSON object").at("body"));
    };
    // An object keeps the last of repeated keys: `{"delta":1,"delta":5}` must not pass as either.
    if let Some(k) = repeated.and_then(|mut path| path.pop()) {
        return Err(ApiError::new(400, format!("field `{k}` appears more than once")).at("body"));
    }
    known_fields(&map, known)?;
    Ok(map)
}

/// Refuses a field outside `fields`.
fn known_fields(map: &Map, fields: &[&str]) -> Result<(), ApiError> {
    match map.keys().find(|k| !fields.contains(&k.as_str())) {
        Some(k) => {
            let known = if fields.is_empty() { String::from("none") } else { text::join(fields, ", ") };
            Err(ApiError::new(400, format!("unknown field `{k}` (known: {known})")).at(k.as_str()))
        }
        None => Ok(()),
    }
}

impl Fields {
    /// Query parameters (known names only, each at most once).
    fn query(q: &str, known: &[&'static str]) -> Result<Fields, ApiError> {
        let mut out = Vec::new();
        for pair in q.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            if !known.contains(&k) {
                return Err(ApiError::new(
                    400,
                    format!("unknown query parameter `{k}` (known: {})", text::join(known, ", ")),
                )
                .at(k));
            }
            // As with repeated JSON fields: which one was meant is not ours to guess.
            if out.iter().any(|(seen, _): &(String, String)| seen == k) {
                return Err(ApiError::new(400, format!("query parameter `{k}` is given twice")).at(k));
            }
            out.push((k.to_owned(), v.to_owned()));
        }
        Ok(Fields::Query(out))
    }

    fn has(&self, field: &str) -> bool {
        match self {
            Fields::Json(map) => map.contains_key(field),
            Fields::Query(pairs) => pairs.iter().any(|(k, _)| k == field),
        }
    }

    fn opt_int(&self, field: &'static str, min: i64, max: i64) -> Result<Option<i64>, ApiError> {
        let n = match self {
            Fields::Json(map) => match map.get(field) {
                None => return Ok(None),
                Some(v) => validate::int_json(field, v, min, max)?,
            },
            Fields::Query(pairs) => match pairs.iter().find(|(k, _)| k == field) {
                None => return Ok(None),
                Some((_, v)) => validate::int_str(field, v, min, max)?,
            },
        };
        Ok(Some(n))
    }

    fn int(&self, field: &'static str, min: i64, max: i64, default: Option<i64>) -> Result<i64, ApiError> {
        match (self.opt_int(field, min, max)?, default) {
            (Some(n), _) | (None, Some(n)) => Ok(n),
            (None, None) => Err(InputError::new(field, Problem::Missing).into()),
        }
    }

    fn string(&self, field: &'static str) -> Result<String, ApiError> {
        let Fields::Json(map) = self else { return Err(InputError::new(field, Problem::Missing).into()) };
        match map.get(field) {
            Some(Json::String(s)) => Ok(s.clone()),
            None | Some(Json::Null) => Err(InputError::new(field, Problem::Missing).into()),
            Some(_) => Err(InputError::new(field, Problem::WrongType("a string")).into()),
        }
    }

    fn opt_string(&self, field: &'static str) -> Result<Option<String>, ApiError> {
        if self.has(field) { self.string(field).map(Some) } else { Ok(None) }
    }
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
