//! The HTTP API, sans-IO: request in, REST calls out, replies in, response out.
//!
//! A shell (the Cloudflare Worker, the native server) drives it:
//!
//! ```text
//!   let mut step = redcount_api::handle(&config, &request, &mut rng);
//!   loop {
//!       match step {
//!           Step::Respond(response) => return response,             // write it out
//!           Step::Send(exchange) => {                                // one REST round trip
//!               step = match post(&target, exchange.body()) {          // a RestTarget
//!                   Ok((status, body)) => exchange.receive(status, &body),
//!                   Err(e) => Step::Respond(exchange.fail(&e)),
//!               };
//!           }
//!           Step::Script(exchange) => {                              // Redis lost the script
//!               step = exchange.give_compiled_script();                // or give_script(text)
//!           }
//!       }
//!   }
//! ```
//!
//! Every operation costs one REST round trip (EVALSHA), two only when the script cache
//! lost the script (then EVAL, once, with the script's text: from the binary, or, for a
//! shell that keeps the texts elsewhere, given by it and checked against the script's
//! SHA-1). Nothing is sent for a request that fails validation.
//!
//! A claim, answered by a REST reply the test makes up (a shell would POST the body):
//!
//! ```
//! use redcount_api::{ApiRequest, Config, Step};
//!
//! let policies = r#"{"bonus": {"kind": "claim", "window_ms": 86400000}}"#;
//! let config = Config::from_env(|v| (v == "REDCOUNT_POLICIES").then(|| policies.to_string())).unwrap();
//! let request = ApiRequest {
//!     method: "POST",
//!     path: "/api/claims/bonus/alice",
//!     query: "",
//!     authorization: None,
//!     origin: None,
//!     idempotency_key: None,
//!     body: b"",
//! };
//! let Step::Send(exchange) = redcount_api::handle(&config, &request, &mut rand::rng()) else { panic!() };
//! assert!(exchange.body().starts_with(r#"["EVALSHA","#));
//! // The front's reply: claimed, nothing left to wait.
//! let Step::Respond(response) = exchange.receive(200, br#"{"result":[1,0]}"#) else { panic!() };
//! assert_eq!((response.status, response.body.as_str()), (200, r#"{"claimed":true,"retry_after_ms":0}"#));
//! ```
//!
//! `no_std` + `alloc`, like redcount-core under it: the worker runs it in wasm.
#![cfg_attr(not(feature = "std"), no_std)]
#![warn(missing_docs)]
#![warn(clippy::std_instead_of_core, clippy::alloc_instead_of_core)]

extern crate alloc;

pub mod config;
pub mod local;
#[cfg(feature = "std")]
pub mod openapi;
pub mod route;
mod routes;
pub mod rpc;

use alloc::borrow::ToOwned;
use alloc::boxed::Box;
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use rand_core::RngCore;

pub use config::{Borrow, Config, ConfigError, FailureMode, LocalMode, Policy, RestTarget};
pub use local::{Local, Wait};
pub use route::{ROUTES, Route, RouteId, RouteSpec};
pub use routes::MAX_PUBLIC_LEASE_MS;

use redcount_core::command;
use redcount_core::error::{ErrorKind, InputError, ShapeError};
use redcount_core::json::Json;
use redcount_core::ratelimit;
use redcount_core::rest::{self, Encoding, RestError};
use redcount_core::script::Call;
use redcount_core::value::Value;

/// Largest request body accepted, in bytes.
pub const MAX_BODY: usize = 16 * 1024;

/// An HTTP request as the API sees it.
#[derive(Debug, Clone, Copy)]
pub struct ApiRequest<'a> {
    /// The method, upper case.
    pub method: &'a str,
    /// The path, still percent-encoded, without the query.
    pub path: &'a str,
    /// The query string without `?` (empty when none).
    pub query: &'a str,
    /// The `Authorization` header.
    pub authorization: Option<&'a str>,
    /// The `Origin` header.
    pub origin: Option<&'a str>,
    /// The `Idempotency-Key` header: write routes store their first result under it.
    pub idempotency_key: Option<&'a str>,
    /// The body (the shell may stop reading past [`MAX_BODY`] + 1 bytes).
    pub body: &'a [u8],
}

/// An HTTP response: a status, JSON, and extra headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiResponse {
    /// The status code.
    pub status: u16,
    /// The JSON body (empty for 204).
    pub body: String,
    /// Headers besides the ones every response carries (see [`ApiResponse::header_list`]).
    pub headers: Vec<(&'static str, String)>,
    /// What a decision route (quota take or peek, claim, semaphore, compound decision)
    /// decided, typed, for a shell that acts on answers without reading their JSON (the
    /// route names the policy and the subject; [`Config::fingerprint`] the policy's definition).
    pub verdict: Option<Verdict>,
    /// True for a decision route's declared answer when Redis did not answer (its body says
    /// `"degraded": true`): an answer, not an error, whatever its status.
    pub degraded: bool,
    /// What the answer said, typed, for [`Local`].
    pub(crate) seen: Option<local::Seen>,
    /// What the call that led to it teaches [`Local`].
    pub(crate) plan: Option<Box<local::Plan>>,
}

/// What a decision route decided (see [`ApiResponse::verdict`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// True when the call was admitted (claimed; holding, for a semaphore).
    pub allowed: bool,
    /// 0 when allowed, else the ms until a call of the same cost can pass (0 when unknown:
    /// a claim taken for good, a full semaphore's holders without an end).
    pub retry_after_ms: i64,
}

impl ApiResponse {
    /// A 200 whose body is an object, written straight to its text (see [`object`]).
    fn flat(fields: &mut [(&str, Field<'_>)]) -> Self {
        Self::object(200, fields)
    }

    /// An answer whose body is an object, written straight to its text (see [`object`]).
    fn object(status: u16, fields: &mut [(&str, Field<'_>)]) -> Self {
        let mut body = String::with_capacity(16 + fields.len() * 24);
        object(&mut body, fields);
        ApiResponse::text(status, body)
    }

    /// An answer with `body`, JSON already written (empty for 204).
    fn text(status: u16, body: String) -> Self {
        ApiResponse { status, body, headers: Vec::new(), verdict: None, degraded: false, seen: None, plan: None }
    }

    /// An error response: `{"error": message}`, with `"field"` when one input is at fault
    /// (see [`ApiError`]).
    pub fn error(status: u16, message: impl Into<String>, field: Option<&str>) -> Self {
        let e = ApiError::new(status, message);
        match field {
            Some(f) => e.at(f),
            None => e,
        }
        .response()
    }

    /// The response for input refused by validation: 400, naming the field.
    pub fn input(e: &InputError) -> Self {
        ApiError::input(e).response()
    }

    /// Adds the `RateLimit-Policy` and `RateLimit` headers of `limits`, and the verdict.
    fn decided(mut self, limits: &[ratelimit::Limit<'_>], verdict: Verdict) -> Self {
        self.headers.reserve(3);
        if !limits.is_empty() {
            self.headers.push((ratelimit::POLICY_HEADER, ratelimit::policy_field(limits)));
            self.headers.push((ratelimit::LIMIT_HEADER, ratelimit::limit_field(limits)));
        }
        if !verdict.allowed && verdict.retry_after_ms > 0 {
            self.headers.push(("Retry-After", command::itoa_i(ratelimit::retry_after_s(verdict.retry_after_ms))));
        }
        self.verdict = Some(verdict);
        self
    }

    /// Every header to send, in order: `Content-Type` (unless 204), `Cache-Control: no-store`
    /// (answers are live state), then [`ApiResponse::headers`]. Shells copy these as they are.
    pub fn header_list(&self) -> impl Iterator<Item = (&'static str, &str)> {
        let content_type = (self.status != 204).then_some(("Content-Type", "application/json"));
        content_type
            .into_iter()
            .chain(core::iter::once(("Cache-Control", "no-store")))
            .chain(self.headers.iter().map(|(k, v)| (*k, v.as_str())))
    }
}

/// An error answer, typed: its status, message, the input field at fault and any headers of
/// its own (`Allow` on a 405). Rendered in one place ([`ApiError::response`]) as
/// `{"error": message, "field": field}`; a producer that is not HTTP (an RPC binding) can
/// carry the same three values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// The HTTP status.
    pub status: u16,
    /// What is wrong, for people.
    pub message: String,
    /// The input at fault (a body or query field, a path parameter, `path`, `body`,
    /// `Idempotency-Key`; a decision part's as `parts[i].cost`).
    pub field: Option<String>,
    /// Headers of this answer's own.
    pub headers: Vec<(&'static str, String)>,
}

impl ApiError {
    /// An error with `status` and `message`, naming no field.
    #[inline(never)]
    pub fn new(status: u16, message: impl Into<String>) -> Self {
        ApiError { status, message: message.into(), field: None, headers: Vec::new() }
    }

    /// The same error, naming `field`.
    #[inline(never)]
    pub fn at(mut self, field: impl Into<String>) -> Self {
        self.field = Some(field.into());
        self
    }

    /// The same error with a header of its own.
    pub fn header(mut self, name: &'static str, value: String) -> Self {
        self.headers.push((name, value));
        self
    }

    /// Input refused by validation: 400, naming the field.
    pub fn input(e: &InputError) -> Self {
        ApiError::new(400, e.to_string()).at(e.field)
    }

    /// The same error as part `i`'s own: its field becomes `parts[i].field` and its message
    /// says which part (an error naming no field is the whole request's and stays as it is).
    fn in_part(self, i: usize) -> Self {
        self.in_list("parts", i)
    }

    /// The same error as item `i`'s own of the list `list` (see [`ApiError::in_part`]).
    fn in_list(mut self, list: &str, i: usize) -> Self {
        if let Some(f) = self.field.take() {
            self.message = format!("{list}[{i}]: {}", self.message);
            self.field = Some(format!("{list}[{i}].{f}"));
        }
        self
    }

    /// The response: the status, `{"error": message, "field": field}` (no `field` when none
    /// is at fault), the error's headers.
    pub fn response(self) -> ApiResponse {
        let mut fields = [("error", Field::Text(&self.message)), ("field", Field::Null)];
        let n = match &self.field {
            Some(f) => {
                fields[1].1 = Field::Text(f);
                2
            }
            None => 1,
        };
        let mut r = ApiResponse::object(self.status, &mut fields[..n]);
        r.headers = self.headers;
        r
    }
}

impl From<InputError> for ApiError {
    fn from(e: InputError) -> Self {
        ApiError::input(&e)
    }
}

impl core::fmt::Display for ApiError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{} {}", self.status, self.message)
    }
}

impl core::error::Error for ApiError {}

/// Who makes a call: the rights it has and, for a scoped caller, the part of the key space
/// it lives in. HTTP makes [`Caller::public`] or [`Caller::admin`] from the `Authorization`
/// header; another producer (the worker's RPC binding, from its `ctx.props`) makes it from
/// what it trusts.
///
/// ```
/// use redcount_api::{Caller, Scope};
///
/// let tenant = Caller::public().scoped(Scope::new("acme").unwrap());
/// assert!(!tenant.is_admin());
/// assert_eq!(tenant.scope().map(Scope::as_str), Some("acme"));
/// assert!(Scope::new("acme:other").is_err(), "a scope is an id: it cannot name a key of another");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Caller {
    admin: bool,
    scope: Option<Scope>,
}

impl Caller {
    /// A caller with the public rights: within each policy's public limits.
    pub fn public() -> Caller {
        Caller::default()
    }

    /// A caller with the admin rights (beyond public limits; resets, refunds, overrides).
    pub fn admin() -> Caller {
        Caller { admin: true, scope: None }
    }

    /// The same caller, confined to `scope`: every key its calls touch lives under the
    /// deployment's namespace *and* the scope (`rc.acme:{u:alice}:…`), so its subjects, ids
    /// and packets never meet another scope's or the unscoped ones, whatever it names.
    pub fn scoped(mut self, scope: Scope) -> Caller {
        self.scope = Some(scope);
        self
    }

    /// True for the admin rights.
    pub fn is_admin(&self) -> bool {
        self.admin
    }

    /// The caller's scope, if any.
    pub fn scope(&self) -> Option<&Scope> {
        self.scope.as_ref()
    }
}

/// A scoped caller's own part of the key space (see [`Caller::scoped`]): an id (letters,
/// digits, `_`, `-`; at most 64), so it cannot hold a key separator or a hash tag.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Scope(String);

impl Scope {
    /// A scope named `name`; refused (naming `scope`) unless it is an id.
    pub fn new(name: &str) -> Result<Scope, InputError> {
        Ok(Scope(redcount_core::validate::id("scope", name)?.to_owned()))
    }

    /// The scope's name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// What a route reads besides its path: its fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Input<'a> {
    /// An HTTP request's: the routes that read (`GET`) take their fields from the query
    /// string (without `?`), the others from the body (a JSON object, or empty).
    Http {
        /// The body.
        body: &'a [u8],
        /// The query string.
        query: &'a str,
    },
    /// A JSON object's text (or empty) holding the route's fields whatever its method, JSON
    /// numbers for integers: an RPC call's options, `{"cost": 2}` for a take as for a peek.
    Json(&'a [u8]),
}

impl<'a> Input<'a> {
    /// The JSON text the route's body fields come from.
    fn body(&self) -> &'a [u8] {
        match *self {
            Input::Http { body, .. } | Input::Json(body) => body,
        }
    }
}

/// What the shell does next.
#[derive(Debug)]
pub enum Step {
    /// Send this response; the request is done.
    Respond(ApiResponse),
    /// Make this REST call, then give its reply to [`Exchange::receive`].
    Send(Exchange),
    /// Redis lost the script the call runs (NOSCRIPT): give the text of
    /// [`Exchange::wanted_script`] to [`Exchange::give_script`] (a shell that keeps the texts
    /// outside its binary, like the worker), or call [`Exchange::give_compiled_script`] (a
    /// shell whose binary carries them); either leads to the one EVAL.
    Script(Exchange),
}

/// A value of an answer written by [`object`].
#[derive(Debug, Clone, Copy)]
enum Field<'a> {
    Int(i64),
    Bool(bool),
    Null,
    /// A fixed word (`"won"`, `"applied"`): letters and `_` only, which need no escape.
    Word(&'static str),
    /// Any text, escaped as serde_json escapes it.
    Text(&'a str),
    /// JSON this writer wrote (a nested object, or a list of them).
    Raw(&'a str),
}

impl Field<'_> {
    /// An integer, or null.
    fn opt(n: Option<i64>) -> Self {
        n.map_or(Field::Null, Field::Int)
    }
}

/// Writes `fields` as a JSON object: the text `json!` (serde_json's map) makes of the same
/// fields, keys sorted, without building a map first (for the answers, most of all the ones
/// called most: a quota take costs several times as much in the worker's wasm through a map,
/// and the map's code weighs on the bundle).
fn object(out: &mut String, fields: &mut [(&str, Field<'_>)]) {
    // Insertion sort: a handful of fields, and no general sort's code in the bundle.
    for i in 1..fields.len() {
        let mut j = i;
        while j > 0 && fields[j - 1].0 > fields[j].0 {
            fields.swap(j - 1, j);
            j -= 1;
        }
    }
    out.push('{');
    for (i, (k, v)) in fields.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        // Keys and words are this crate's own identifiers: nothing to escape.
        let plain = |s: &str| s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        debug_assert!(plain(k));
        out.push('"');
        out.push_str(k);
        out.push_str("\":");
        match *v {
            Field::Int(n) => out.push_str(itoa::Buffer::new().format(n)),
            Field::Bool(b) => out.push_str(if b { "true" } else { "false" }),
            Field::Null => out.push_str("null"),
            Field::Word(w) => {
                debug_assert!(plain(w));
                out.push('"');
                out.push_str(w);
                out.push('"');
            }
            Field::Text(t) => rest::write_json_string(out, t),
            Field::Raw(json) => out.push_str(json),
        }
    }
    out.push('}');
}

/// Writes `v` as serde_json writes it (`Value::to_string`: keys sorted, strings escaped the
/// same way), without serde_json's serializer in the bundle; `false` (and nothing written that
/// counts) for a number that is not an integer, which no validated request holds.
fn canonical(out: &mut String, v: &Json) -> bool {
    match v {
        Json::Null => out.push_str("null"),
        Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Json::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => out.push_str(itoa::Buffer::new().format(i)),
            (None, Some(u)) => out.push_str(itoa::Buffer::new().format(u)),
            _ => return false,
        },
        Json::String(s) => rest::write_json_string(out, s),
        Json::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                if !canonical(out, item) {
                    return false;
                }
            }
            out.push(']');
        }
        Json::Object(map) => {
            out.push('{');
            for (i, (k, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                rest::write_json_string(out, k);
                out.push(':');
                if !canonical(out, item) {
                    return false;
                }
            }
            out.push('}');
        }
    }
    true
}

/// `[item, …]`, each item written by `write`.
fn list<T>(items: impl IntoIterator<Item = T>, mut write: impl FnMut(&mut String, T)) -> String {
    let mut out = String::from("[");
    for (i, item) in items.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        write(&mut out, item);
    }
    out.push(']');
    out
}

/// Reads a reply into the response (the operation-specific part of an exchange).
trait Render {
    fn render(&self, reply: Value) -> Result<ApiResponse, ShapeError>;
}

struct With<O, F> {
    op: O,
    f: F,
}

impl<O, F> Render for With<O, F>
where
    O: redcount_core::Operation,
    F: Fn(&O, O::Outcome) -> ApiResponse,
{
    fn render(&self, mut reply: Value) -> Result<ApiResponse, ShapeError> {
        let replayed = reply.take_replay_mark();
        Ok(replay_marked((self.f)(&self.op, self.op.parse(reply)?), replayed))
    }
}

/// `response`, marked as the stored answer of an earlier request with the same
/// Idempotency-Key when `replayed` (apart from [`With::render`], so its copies per route
/// do not each carry this).
#[inline(never)]
fn replay_marked(mut response: ApiResponse, replayed: bool) -> ApiResponse {
    if replayed {
        response.headers.push(("Idempotent-Replayed", "true".to_owned()));
    }
    response
}

/// One pending REST round trip and how to finish it.
pub struct Exchange {
    call: Call,
    body: String,
    render: Box<dyn Render + Send>,
    cors: Vec<(&'static str, String)>,
    /// A decision route's answer when Redis cannot answer: its field and whether the
    /// policy declared `"on_unavailable": "allow"`.
    degrade: Option<(&'static str, bool)>,
    /// The policy's `timeout_ms`.
    timeout_ms: Option<u32>,
    /// What it teaches [`Local`], when a local state made it.
    plan: Option<Box<local::Plan>>,
    /// A write route's call (any method but GET): when Redis did not answer it may still run.
    writes: bool,
}

impl core::fmt::Debug for Exchange {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Exchange").field("body", &self.body).finish_non_exhaustive()
    }
}

/// The headers of every REST call besides `Authorization: Bearer <rest_token>`.
pub const REST_HEADERS: &[(&str, &str)] =
    &[(rest::ENCODING_HEADER, rest::ENCODING_BASE64), ("Content-Type", "application/json")];

impl Exchange {
    fn new<O, F>(op: O, f: F) -> Exchange
    where
        O: redcount_core::Operation + Send + 'static,
        F: Fn(&O, O::Outcome) -> ApiResponse + Send + 'static,
    {
        let request = op.request();
        Exchange::of(request, Box::new(With { op, f }))
    }

    /// [`Exchange::new`]'s part that does not depend on the operation (one copy of it, not
    /// one per route).
    #[inline(never)]
    fn of(request: redcount_core::script::Request, render: Box<dyn Render + Send>) -> Exchange {
        let call = Call::new(request);
        let body = call.command().to_rest_body();
        Exchange { call, body, render, cors: Vec::new(), degrade: None, timeout_ms: None, plan: None, writes: false }
    }

    /// A borrow in this take's place ([`Local`]): the same bounds, failure mode and CORS, the
    /// answer the take would have had (its `remaining` counting the units lent to this shell).
    pub(crate) fn replaced(
        self,
        op: redcount_core::ops::quota::BorrowQuota,
        policy: &str,
        algorithm: redcount_core::ops::quota::Algorithm,
    ) -> Exchange {
        let mut ex = Exchange::lend(op, policy, algorithm);
        ex.cors = self.cors;
        ex.degrade = self.degrade;
        ex.timeout_ms = self.timeout_ms;
        ex.writes = self.writes;
        ex
    }

    /// A borrow: the answer a take would have had (its `remaining` counting the units lent
    /// to this shell), for [`Local`] to learn the lease from.
    pub(crate) fn lend(
        op: redcount_core::ops::quota::BorrowQuota,
        policy: &str,
        algorithm: redcount_core::ops::quota::Algorithm,
    ) -> Exchange {
        let name = policy.to_owned();
        Exchange::new(op, move |_, b: redcount_core::ops::quota::Borrowed| {
            let o = redcount_core::ops::quota::QuotaOutcome { remaining: b.outcome.remaining + b.lent, ..b.outcome };
            // (Its denial says no `cache_ms`: the shell's repeat of it, the next take's, does.)
            let mut r = routes::quota_answer(&name, &algorithm, o, false, 0);
            r.seen = Some(local::Seen::Borrowed(b));
            r
        })
    }

    /// The most this call may wait for its answer, in ms, when its policy declares one
    /// (`timeout_ms`): the shell stops waiting then and calls [`Exchange::fail`].
    pub fn timeout_ms(&self) -> Option<u32> {
        self.timeout_ms
    }

    /// The answer when Redis did not answer: on a decision route (quota, claim, semaphore,
    /// compound decision) the policy's declared one, marked `"degraded": true` with the
    /// reason; elsewhere a `status` error.
    ///
    /// A call that reached Redis before its answer was given up may still be applied when
    /// Redis answers (a paused Redis runs it on waking): a degraded answer says so
    /// (`"may_have_run": true`), so a client does not take "denied" for "not charged"; so does
    /// the error of a write route (a red packet created then, a counter added), so a client
    /// retries with the same `Idempotency-Key` rather than a new call.
    fn unavailable(&self, status: u16, why: String) -> ApiResponse {
        match self.degrade {
            Some((field, allow)) => {
                let why = format!("{why}; if the call reached Redis it may still be applied");
                let mut fields = [
                    (field, Field::Bool(allow)),
                    ("degraded", Field::Bool(true)),
                    ("reason", Field::Text(&why)),
                    ("may_have_run", Field::Bool(true)),
                    // A refusal is an error too, for clients that read `error`.
                    ("error", Field::Text(&why)),
                ];
                let n = if allow { 4 } else { 5 };
                let mut r = ApiResponse::object(if allow { 200 } else { 503 }, &mut fields[..n]);
                r.degraded = true;
                r
            }
            None if self.writes => {
                let why = format!("{why}; if the call reached Redis it may still be applied");
                ApiResponse::object(status, &mut [("error", Field::Text(&why)), ("may_have_run", Field::Bool(true))])
            }
            None => ApiResponse::error(status, why, None),
        }
    }

    /// Moves the call's keys into `ns` (before anything was sent).
    fn move_to(&mut self, ns: &redcount_core::keys::Namespace) {
        self.call = Call::new(self.call.request().clone().in_namespace(ns));
        self.body = self.call.command().to_rest_body();
    }

    /// True when dropping this call unanswered would strand what it changes in Redis for the
    /// local state (a borrow's units): a shell drives it to its end even when the client that
    /// asked has gone away.
    pub fn must_finish(&self) -> bool {
        self.plan.as_deref().is_some_and(local::Plan::lends)
    }

    /// The command to send, for a shell that talks RESP instead of REST.
    pub fn command(&self) -> &redcount_core::Command {
        self.call.command()
    }

    /// Reads a reply that arrived some other way than REST (e.g. RESP): the response, or,
    /// after NOSCRIPT, a [`Step::Script`] that leads to the one EVAL.
    pub fn receive_value(self, reply: Result<Value, redcount_core::ErrorReply>) -> Step {
        match reply {
            Ok(v) => self.receive_result(Ok(v)),
            Err(e) => self.receive_result(Err(RestError::Reply(e))),
        }
    }

    /// The JSON body to `POST` to the REST front's `/`, with [`REST_HEADERS`] and the token.
    pub fn body(&self) -> &str {
        &self.body
    }

    /// Reads the REST reply: the response, or, after NOSCRIPT, a [`Step::Script`] that leads
    /// to the one EVAL.
    pub fn receive(self, status: u16, body: &[u8]) -> Step {
        self.receive_result(rest::decode_reply(status, body, Encoding::Base64))
    }

    fn receive_result(mut self, reply: Result<Value, RestError>) -> Step {
        let response = match reply {
            Ok(value) => match self.render.render(value) {
                Ok(r) => r,
                Err(e) => ApiResponse::error(502, format!("unexpected reply from Redis: {e}"), None),
            },
            Err(RestError::Reply(e)) if self.call.needs_source(&e) => return Step::Script(self),
            Err(RestError::Reply(e)) if e.kind == ErrorKind::IdempotencyConflict => ApiResponse::error(
                422,
                "this Idempotency-Key was already used for a different request",
                Some("Idempotency-Key"),
            ),
            // A script refused the call as clashing with what it keeps (a reservation's id in
            // use, a settle of a reservation made with other policy settings): the client's to
            // resolve, nothing written.
            Err(RestError::Reply(e)) if e.kind == ErrorKind::Conflict => {
                // A byte-window search (a `&str` pattern would link the two-way searcher in).
                let after = e.message.as_bytes().windows(2).position(|w| w == b": ").map(|i| i + 2);
                let why = after.map_or(e.message.as_str(), |i| &e.message[i..]);
                ApiResponse::error(409, why, Some("id"))
            }
            // BUSY, LOADING, TRYAGAIN, CLUSTERDOWN, MASTERDOWN, NOREPLICAS: retryable, so 503 rather than 502.
            Err(RestError::Reply(e)) if e.kind == ErrorKind::Unavailable => {
                self.unavailable(503, format!("Redis is unavailable for now: {e}"))
            }
            // The scripts' shebang makes Redis refuse them whole at maxmemory: fail closed.
            Err(RestError::Reply(e)) if e.kind == ErrorKind::OutOfMemory => ApiResponse::error(
                507,
                "Redis is out of memory (maxmemory reached): this call wrote nothing (an earlier call with the same Idempotency-Key, if any, stands); retry later",
                None,
            ),
            Err(RestError::Reply(e)) => ApiResponse::error(502, format!("Redis error: {e}"), None),
            Err(RestError::Unauthorized(_)) => {
                ApiResponse::error(502, "the REST front refused REDCOUNT_REST_TOKEN (server misconfigured)", None)
            }
            Err(RestError::Unavailable(s, m)) => {
                self.unavailable(503, format!("Redis is unavailable (REST front answered {s}: {m})"))
            }
            Err(e) => ApiResponse::error(502, format!("{e}"), None),
        };
        Step::Respond(self.finish(response))
    }

    /// The script whose text the call waits for, after a [`Step::Script`].
    pub fn wanted_script(&self) -> Option<&'static redcount_core::script::Script> {
        self.call.wanted()
    }

    /// Gives the text of [`Exchange::wanted_script`] after a [`Step::Script`]: the EVAL to
    /// send when `text` is that script's (its SHA-1 checked), else a 500 (the shell's copy
    /// is missing or stale; nothing was run).
    pub fn give_script(mut self, text: &[u8]) -> Step {
        if self.call.give_source(text) {
            self.body = self.call.command().to_rest_body();
            return Step::Send(self);
        }
        let (name, sha) = self.call.wanted().map_or(("?", ""), |s| (s.name(), s.sha1()));
        let why = format!(
            "server misconfigured: no valid copy of the script {name} ({sha}) to send after Redis lost it (NOSCRIPT); \
             the worker fetches lua/{sha}.lua from its static assets"
        );
        Step::Respond(self.finish(ApiResponse::error(500, why, None)))
    }

    /// After a [`Step::Script`], the EVAL with the text this binary carries (linking every
    /// script's text into it).
    pub fn give_compiled_script(self) -> Step {
        let text = self.call.wanted().map(|s| s.source()).unwrap_or_default();
        self.give_script(text.as_bytes())
    }

    /// The response when the call ran but fewer replicas than the shell waits for
    /// acknowledged its write in time (`redcount serve --wait-replicas`, or the REST front's):
    /// 503 with `"durable": false` and `"may_have_run": true`, whatever the route: the write
    /// happened on the master and may be lost in a failover.
    pub fn not_durable(self, why: &str) -> ApiResponse {
        let error = format!("not known durable: {why}");
        let r = ApiResponse::object(
            503,
            &mut [("error", Field::Text(&error)), ("durable", Field::Bool(false)), ("may_have_run", Field::Bool(true))],
        );
        self.finish(r)
    }

    /// The response when the REST front could not be reached at all.
    pub fn fail(self, why: &str) -> ApiResponse {
        self.fail_at("the REST front", why)
    }

    /// The response when `component` (the REST front, Redis) could not be reached at all.
    pub fn fail_at(self, component: &str, why: &str) -> ApiResponse {
        let r = self.unavailable(503, format!("{component} is unreachable: {why}"));
        self.finish(r)
    }

    fn finish(self, mut r: ApiResponse) -> ApiResponse {
        r.headers.extend(self.cors);
        r.plan = self.plan;
        r
    }
}

/// Handles one HTTP request: a response now, or a REST call to make first. It reads the
/// route ([`Route::parse`]), the caller (the `Authorization` header) and the input, then
/// makes the same [`call`] any other producer makes.
pub fn handle<R: RngCore + ?Sized>(config: &Config, req: &ApiRequest<'_>, rng: &mut R) -> Step {
    handle_in(config, req, &Caller::public(), rng, None)
        .unwrap_or_else(|Wait| Step::Respond(unavailable("a local state")))
}

/// [`handle`] for a request through a binding that makes `binding` ([`Local::handle_as`]),
/// with a local state when one is given ([`Local::handle`]).
pub(crate) fn handle_in<R: RngCore + ?Sized>(
    config: &Config,
    req: &ApiRequest<'_>,
    binding: &Caller,
    rng: &mut R,
    local: Option<(&mut Local, bool)>,
) -> Result<Step, Wait> {
    let cors = cors_headers(config, req.origin);
    let step = match routes::http(config, req, binding) {
        Ok(None) => Step::Respond(routes::preflight(config, req.origin)),
        Ok(Some((route, caller))) => {
            let input = Input::Http { body: req.body, query: req.query };
            call_in(config, route, input, &caller, req.idempotency_key, rng, local)?
        }
        Err(e) => Step::Respond(e.response()),
    };
    Ok(match step {
        Step::Respond(mut r) => {
            r.headers.extend(cors);
            Step::Respond(r)
        }
        Step::Send(mut ex) => {
            ex.cors = cors;
            Step::Send(ex)
        }
        // A first step never waits for a script: nothing was sent yet.
        step @ Step::Script(_) => step,
    })
}

/// Makes one call of `route` with `input`, as `caller`, from any producer (HTTP through
/// [`handle`]; an RPC binding directly): a response now (an error, or an answer needing no
/// Redis), or a REST call to make first, driven as [`handle`]'s is. `idempotency_key` is the
/// `Idempotency-Key`: a write stores its first answer under it (scoped by the route's
/// method and [`Route::path`], so HTTP and RPC calls of one route share it).
///
/// ```
/// use redcount_api::{Caller, Config, Input, Route, Step};
///
/// let policies = r#"{"per-user": {"kind": "quota", "algorithm": "fixed", "limit": 10, "window_ms": 60000, "max_cost": 5}}"#;
/// let config = Config::from_env(|v| (v == "REDCOUNT_POLICIES").then(|| policies.to_string())).unwrap();
/// let route = Route::QuotaTake { policy: "per-user".into(), subject: "alice".into() };
/// let step = redcount_api::call(&config, route, Input::Json(br#"{"cost": 2}"#), &Caller::public(), None, &mut rand::rng());
/// let Step::Send(exchange) = step else { panic!() };
/// let Step::Respond(r) = exchange.receive(200, br#"{"result":[1,10,8,60000,0]}"#) else { panic!() };
/// assert_eq!(r.body, r#"{"allowed":true,"limit":10,"remaining":8,"reset_ms":60000,"retry_after_ms":0}"#);
/// assert!(r.verdict.unwrap().allowed);
/// ```
pub fn call<R: RngCore + ?Sized>(
    config: &Config,
    route: Route,
    input: Input<'_>,
    caller: &Caller,
    idempotency_key: Option<&str>,
    rng: &mut R,
) -> Step {
    call_in(config, route, input, caller, idempotency_key, rng, None)
        .unwrap_or_else(|Wait| Step::Respond(unavailable("a local state")))
}

/// [`call`], with a local state when one is given ([`Local::call`]): it may answer from
/// memory, make another call (a borrow), or say wait.
pub(crate) fn call_in<R: RngCore + ?Sized>(
    config: &Config,
    route: Route,
    input: Input<'_>,
    caller: &Caller,
    idempotency_key: Option<&str>,
    rng: &mut R,
    local: Option<(&mut Local, bool)>,
) -> Result<Step, Wait> {
    let step = match routes::run(config, route, input, caller, idempotency_key, rng, local.is_some()) {
        Ok(Step::Send(mut ex)) => {
            let step = match (local, ex.plan.take().map(|p| *p)) {
                (Some((l, may_wait)), Some(local::Plan::Quota(plan))) => l.quota(config, caller, ex, plan, may_wait)?,
                (Some((l, _)), Some(local::Plan::Decision(plan))) => l.decision(ex, plan),
                (Some((l, _)), Some(local::Plan::Forget(f))) => l.refund(ex, f),
                _ => Step::Send(ex),
            };
            match step {
                Step::Send(mut ex) => {
                    match caller.scope() {
                        Some(scope) => ex.move_to(&config.namespace.scoped(scope.as_str())),
                        None if !config.namespace.is_default() => ex.move_to(&config.namespace),
                        None => {}
                    }
                    Step::Send(ex)
                }
                answered => answered,
            }
        }
        Ok(step) => step,
        Err(e) => Step::Respond(e.response()),
    };
    Ok(step)
}

/// `r` with the CORS headers a request from `origin` gets, for responses a shell makes
/// itself ([`too_large`], [`body_timeout`], [`unavailable`]) so a browser can read them too.
pub fn with_cors(config: &Config, origin: Option<&str>, mut r: ApiResponse) -> ApiResponse {
    r.headers.extend(cors_headers(config, origin));
    r
}

/// The response for a body over [`MAX_BODY`], for shells that stop reading early.
pub fn too_large() -> ApiResponse {
    ApiResponse::error(413, format!("body larger than {MAX_BODY} bytes"), None)
}

/// The response for a body that did not arrive within the shell's time limit.
pub fn body_timeout(limit_ms: u64) -> ApiResponse {
    ApiResponse::error(408, format!("the request body did not arrive within {limit_ms} ms"), None)
}

/// The response when the platform cannot do what the API needs (e.g. no randomness).
pub fn unavailable(what: &str) -> ApiResponse {
    ApiResponse::error(503, format!("unavailable: {what}"), None)
}

/// The response for a configuration that cannot be used (every request gets it).
pub fn misconfigured(e: &ConfigError) -> ApiResponse {
    ApiResponse::error(500, format!("server misconfigured: {e}"), None)
}

fn cors_headers(config: &Config, origin: Option<&str>) -> Vec<(&'static str, String)> {
    match origin {
        Some(o) if config.cors_origins.iter().any(|a| a == o || a == "*") => {
            alloc::vec![
                ("Access-Control-Allow-Origin", o.to_owned()),
                (
                    "Access-Control-Expose-Headers",
                    "Idempotent-Replayed, Retry-After, RateLimit-Policy, RateLimit".to_owned(),
                ),
                ("Vary", "Origin".to_owned()),
            ]
        }
        _ => Vec::new(),
    }
}

pub use redcount_core::text::{percent_decode, same_secret};

#[cfg(test)]
mod object_tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::{Value as Json, json};

    const NAMES: [&str; 8] =
        ["allowed", "limit", "remaining", "reset_ms", "retry_after_ms", "value", "amount_cents", "index"];
    const WORDS: [&str; 4] = ["won", "already", "applied", "clamped"];

    /// A value, and what serde_json makes of it.
    #[derive(Debug, Clone)]
    enum V {
        Int(i64),
        Bool(bool),
        Null,
        Word(&'static str),
        Text(String),
        /// A nested object of this writer's own.
        Nested(Vec<(&'static str, i64)>),
    }

    fn value() -> impl Strategy<Value = V> {
        prop_oneof![
            any::<i64>().prop_map(V::Int),
            (-1_000_i64..1_000).prop_map(V::Int),
            any::<bool>().prop_map(V::Bool),
            Just(V::Null),
            (0..WORDS.len()).prop_map(|i| V::Word(WORDS[i])),
            // Any text: quotes, backslashes, control characters, non-ASCII.
            any::<String>().prop_map(V::Text),
            "[\"\\\u{0}-\u{1f}a-z]{0,8}".prop_map(V::Text),
            proptest::sample::subsequence(NAMES.to_vec(), 0..4)
                .prop_flat_map(|names| {
                    let n = names.len();
                    (Just(names), proptest::collection::vec(any::<i64>(), n))
                })
                .prop_map(|(names, ints)| V::Nested(names.into_iter().zip(ints).collect())),
        ]
    }

    fn to_json(v: &V) -> Json {
        match v {
            V::Int(n) => json!(n),
            V::Bool(b) => json!(b),
            V::Null => Json::Null,
            V::Word(w) => json!(w),
            V::Text(t) => json!(t),
            V::Nested(fields) => Json::Object(fields.iter().map(|(k, n)| ((*k).to_owned(), json!(n))).collect()),
        }
    }

    proptest! {
        // Any set of distinct names in any order, with any values: the text serde_json makes
        // of a map of the same fields, byte for byte.
        #[test]
        fn an_answer_is_the_text_of_its_map(picked in proptest::sample::subsequence(NAMES.to_vec(), 0..=NAMES.len()).prop_shuffle(), values in proptest::collection::vec(value(), NAMES.len())) {
            let nested: Vec<String> = values.iter().map(|v| match v {
                V::Nested(f) => {
                    let mut out = String::new();
                    let mut f: Vec<(&str, Field<'_>)> = f.iter().map(|(k, n)| (*k, Field::Int(*n))).collect();
                    object(&mut out, &mut f);
                    out
                }
                _ => String::new(),
            }).collect();
            let mut fields: Vec<(&str, Field<'_>)> = picked.iter().zip(values.iter().zip(&nested)).map(|(k, (v, raw))| {
                let f = match v {
                    V::Int(n) => Field::Int(*n),
                    V::Bool(b) => Field::Bool(*b),
                    V::Null => Field::Null,
                    V::Word(w) => Field::Word(w),
                    V::Text(t) => Field::Text(t),
                    V::Nested(_) => Field::Raw(raw),
                };
                (*k, f)
            }).collect();
            let map: serde_json::Map<String, Json> =
                picked.iter().zip(&values).map(|(k, v)| ((*k).to_owned(), to_json(v))).collect();
            let r = ApiResponse::flat(&mut fields);
            prop_assert_eq!(r.status, 200);
            prop_assert_eq!(r.body, Json::Object(map).to_string());
        }
    }

    /// Any JSON without fractions: what a validated request body can hold.
    fn any_json() -> impl Strategy<Value = Json> {
        let leaf = prop_oneof![
            Just(Json::Null),
            any::<bool>().prop_map(Json::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            any::<u64>().prop_map(|n| json!(n)),
            any::<String>().prop_map(Json::String),
            "[\"\\\u{0}-\u{1f}\u{7f}a-z]{0,6}".prop_map(Json::String),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Json::Array),
                proptest::collection::btree_map("[a-z\"\\\u{1}]{0,4}", inner, 0..4)
                    .prop_map(|m| Json::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        // The Idempotency-Key's fingerprint is of this text: it must stay what serde_json wrote.
        #[test]
        fn canonical_text_is_serde_jsons(v in any_json()) {
            let mut out = String::new();
            let read = redcount_core::json::from_slice(v.to_string().as_bytes()).unwrap();
            prop_assert!(canonical(&mut out, &read));
            prop_assert_eq!(out, v.to_string());
        }
    }

    #[test]
    fn a_fraction_is_not_canonical() {
        let read = redcount_core::json::from_slice(br#"{"a": [1, 2.5]}"#).unwrap();
        assert!(!canonical(&mut String::new(), &read));
    }

    #[test]
    fn lists_and_errors() {
        assert_eq!(list([1, 2], |out, n| object(out, &mut [("n", Field::Int(n))])), r#"[{"n":1},{"n":2}]"#);
        assert_eq!(list(core::iter::empty::<i64>(), |_, _| ()), "[]");
        let e = ApiError::new(400, "say \"hi\"\n").at("a").response();
        assert_eq!(e.body, json!({"error": "say \"hi\"\n", "field": "a"}).to_string());
    }
}
