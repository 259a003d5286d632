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
//!       }
//!   }
//! ```
//!
//! Every operation costs one REST round trip (EVALSHA), two only when the script cache
//! lost the script (then EVAL, once). Nothing is sent for a request that fails validation.
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
mod routes;

use alloc::borrow::ToOwned;
use alloc::boxed::Box;
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use rand_core::RngCore;
use serde_json::{Value as Json, json};

pub use config::{Config, ConfigError, FailureMode, Policy, RestTarget};

use redcount_core::error::{ErrorKind, InputError, ShapeError};
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
}

impl ApiResponse {
    fn json(status: u16, body: Json) -> Self {
        ApiResponse { status, body: body.to_string(), headers: Vec::new() }
    }

    /// A 200 whose body is a flat object, written straight to its text: the same text
    /// [`ApiResponse::json`] makes of it (keys sorted, as serde_json's map orders them), without
    /// building a map first. For the answers of the routes called most (a quota take costs
    /// several times as much in the worker's wasm through a map).
    fn flat(fields: &mut [(&'static str, Field)]) -> Self {
        // Insertion sort: a handful of fields, and no general sort's code in the bundle.
        for i in 1..fields.len() {
            let mut j = i;
            while j > 0 && fields[j - 1].0 > fields[j].0 {
                fields.swap(j - 1, j);
                j -= 1;
            }
        }
        let mut body = String::with_capacity(16 + fields.len() * 24);
        body.push('{');
        for (i, (k, v)) in fields.iter().enumerate() {
            if i > 0 {
                body.push(',');
            }
            // Keys and words are this crate's own identifiers: nothing to escape.
            let plain = |s: &str| s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
            debug_assert!(plain(k));
            body.push('"');
            body.push_str(k);
            body.push_str("\":");
            match *v {
                Field::Int(n) => body.push_str(itoa::Buffer::new().format(n)),
                Field::Bool(b) => body.push_str(if b { "true" } else { "false" }),
                Field::Word(w) => {
                    debug_assert!(plain(w));
                    body.push('"');
                    body.push_str(w);
                    body.push('"');
                }
            }
        }
        body.push('}');
        ApiResponse { status: 200, body, headers: Vec::new() }
    }

    /// An error response: `{"error": message}`, with `"field"` when one input is at fault.
    pub fn error(status: u16, message: impl Into<String>, field: Option<&str>) -> Self {
        let message = message.into();
        let body = match field {
            Some(f) => json!({ "error": message, "field": f }),
            None => json!({ "error": message }),
        };
        Self::json(status, body)
    }

    /// The response for input refused by validation: 400, naming the field.
    pub fn input(e: &InputError) -> Self {
        Self::error(400, e.to_string(), Some(e.field))
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

/// What the shell does next.
#[derive(Debug)]
pub enum Step {
    /// Send this response; the request is done.
    Respond(ApiResponse),
    /// Make this REST call, then give its reply to [`Exchange::receive`].
    Send(Exchange),
}

/// A value of a flat answer ([`ApiResponse::flat`]).
#[derive(Debug, Clone, Copy)]
enum Field {
    Int(i64),
    Bool(bool),
    /// A fixed word (`"won"`, `"applied"`): letters and `_` only, which need no escape.
    Word(&'static str),
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
        let mut response = (self.f)(&self.op, self.op.parse(reply)?);
        if replayed {
            // The stored answer of an earlier request with the same Idempotency-Key.
            response.headers.push(("Idempotent-Replayed", "true".to_owned()));
        }
        Ok(response)
    }
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
        let call = Call::new(op.request());
        let body = call.command().to_rest_body();
        Exchange { call, body, render: Box::new(With { op, f }), cors: Vec::new(), degrade: None, timeout_ms: None }
    }

    /// The most this call may wait for its answer, in ms, when its policy declares one
    /// (`timeout_ms`): the shell stops waiting then and calls [`Exchange::fail`].
    pub fn timeout_ms(&self) -> Option<u32> {
        self.timeout_ms
    }

    /// The answer when Redis did not answer: on a decision route (quota, claim, semaphore,
    /// compound decision) the policy's declared one, marked `"degraded": true` with the
    /// reason; elsewhere `plain`.
    ///
    /// A call that reached Redis before its answer was given up may still be applied when
    /// Redis answers (a paused Redis runs it on waking): a degraded answer says so
    /// (`"may_have_run": true`), so a client does not take "denied" for "not charged".
    fn unavailable(&self, status: u16, why: String) -> ApiResponse {
        match self.degrade {
            Some((field, allow)) => {
                let why = format!("{why}; if the call reached Redis it may still be applied");
                let mut body = json!({ field: allow, "degraded": true, "reason": why, "may_have_run": true });
                if !allow {
                    // A refusal is an error too, for clients that read `error`.
                    body["error"] = json!(why);
                }
                ApiResponse::json(if allow { 200 } else { 503 }, body)
            }
            None => ApiResponse::error(status, why, None),
        }
    }

    /// Moves the call's keys into `ns` (before anything was sent).
    fn move_to(&mut self, ns: &redcount_core::keys::Namespace) {
        self.call = Call::new(self.call.request().clone().in_namespace(ns));
        self.body = self.call.command().to_rest_body();
    }

    /// The command to send, for a shell that talks RESP instead of REST.
    pub fn command(&self) -> &redcount_core::Command {
        self.call.command()
    }

    /// Reads a reply that arrived some other way than REST (e.g. RESP): the response, or
    /// one more call (EVAL after NOSCRIPT).
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

    /// Reads the REST reply: the response, or one more call (EVAL after NOSCRIPT).
    pub fn receive(self, status: u16, body: &[u8]) -> Step {
        self.receive_result(rest::decode_reply(status, body, Encoding::Base64))
    }

    fn receive_result(mut self, reply: Result<Value, RestError>) -> Step {
        let response = match reply {
            Ok(value) => match self.render.render(value) {
                Ok(r) => r,
                Err(e) => ApiResponse::error(502, format!("unexpected reply from Redis: {e}"), None),
            },
            Err(RestError::Reply(e)) if self.call.retry(&e) => {
                self.body = self.call.command().to_rest_body();
                return Step::Send(self);
            }
            Err(RestError::Reply(e)) if e.kind == ErrorKind::IdempotencyConflict => ApiResponse::error(
                422,
                "this Idempotency-Key was already used for a different request",
                Some("Idempotency-Key"),
            ),
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

    /// The response when the call ran but fewer replicas than the shell waits for
    /// acknowledged its write in time (`redcount serve --wait-replicas`, or the REST front's):
    /// 503 with `"durable": false` and `"may_have_run": true`, whatever the route: the write
    /// happened on the master and may be lost in a failover.
    pub fn not_durable(self, why: &str) -> ApiResponse {
        let body = json!({ "error": format!("not known durable: {why}"), "durable": false, "may_have_run": true });
        let r = ApiResponse::json(503, body);
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
        r
    }
}

/// Handles one request: a response now, or a REST call to make first.
pub fn handle<R: RngCore + ?Sized>(config: &Config, req: &ApiRequest<'_>, rng: &mut R) -> Step {
    let cors = cors_headers(config, req.origin);
    let step = routes::route(config, req, rng);
    match step {
        Step::Respond(mut r) => {
            r.headers.extend(cors);
            Step::Respond(r)
        }
        Step::Send(mut ex) => {
            ex.cors = cors;
            if !config.namespace.is_default() {
                ex.move_to(&config.namespace);
            }
            Step::Send(ex)
        }
    }
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
                ("Access-Control-Expose-Headers", "Idempotent-Replayed, Retry-After".to_owned()),
                ("Vary", "Origin".to_owned()),
            ]
        }
        _ => Vec::new(),
    }
}

pub use redcount_core::text::{percent_decode, same_secret};

#[cfg(test)]
mod flat_tests {
    use super::*;
    use proptest::prelude::*;

    const NAMES: [&str; 8] =
        ["allowed", "limit", "remaining", "reset_ms", "retry_after_ms", "value", "amount_cents", "index"];
    const WORDS: [&str; 4] = ["won", "already", "applied", "clamped"];

    fn field() -> impl Strategy<Value = Field> {
        prop_oneof![
            any::<i64>().prop_map(Field::Int),
            (-1_000_i64..1_000).prop_map(Field::Int),
            any::<bool>().prop_map(Field::Bool),
            (0..WORDS.len()).prop_map(|i| Field::Word(WORDS[i])),
        ]
    }

    proptest! {
        // Any set of distinct names in any order, with any values: the text `json!` (a map)
        // made of the same fields, byte for byte.
        #[test]
        fn a_flat_answer_is_the_text_of_its_map(picked in proptest::sample::subsequence(NAMES.to_vec(), 0..=NAMES.len()).prop_shuffle(), values in proptest::collection::vec(field(), NAMES.len())) {
            let mut fields: Vec<(&'static str, Field)> = picked.iter().copied().zip(values.iter().copied()).collect();
            let mut map = serde_json::Map::new();
            for (k, v) in &fields {
                let v = match *v {
                    Field::Int(n) => json!(n),
                    Field::Bool(b) => json!(b),
                    Field::Word(w) => json!(w),
                };
                map.insert((*k).to_owned(), v);
            }
            let r = ApiResponse::flat(&mut fields);
            prop_assert_eq!(r.status, 200);
            prop_assert_eq!(r.body, ApiResponse::json(200, Json::Object(map)).body);
        }
    }
}
