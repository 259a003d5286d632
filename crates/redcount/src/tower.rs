//! Rate limiting for any tower service (axum, hyper, tonic): a [`RateLimitLayer`] takes a
//! quota from a subject for each request, over any [`Driver`] ([`Direct`](crate::Direct) on
//! RESP, `Rest` on an Upstash-compatible REST front). Feature `tower`.
//!
//! A request the quota admits goes on to the inner service, and its response gains the
//! `RateLimit-Policy` and `RateLimit` headers (draft-ietf-httpapi-ratelimit-headers, made by
//! [`redcount_core::ratelimit`], as the HTTP API makes them). A request the quota denies is
//! answered `429 Too Many Requests` with the same two headers and `Retry-After`, and never
//! reaches the inner service. When Redis does not answer within the policy's time bound, the
//! policy's declared [`OnUnavailable`] applies: `503 Service Unavailable` (the default), or
//! the request passes unlimited.
//!
//! Each answer the layer makes itself has an empty body (`ResBody::default()`); every
//! response has the [`Decision`] in its extensions (so an outer layer can log it, or write a
//! body of its choice), and a request passed on has it in its own (for the handler: a
//! request passed while Redis was unavailable is marked so). The layer needs a Tokio runtime
//! with time enabled (axum's), for its time bound.
//!
//! ```
//! use std::convert::Infallible;
//! use http::{Request, Response, StatusCode};
//! use redcount::tower::{Algorithm, QuotaPolicy, RateLimitLayer};
//! use tower::{ServiceBuilder, ServiceExt};
//!
//! # #[derive(Default)]
//! # struct Redis(std::sync::atomic::AtomicI64); // stands in for a Direct: a window of 2
//! # impl redcount::Driver for Redis {
//! #     async fn send(&self, _: &redcount_core::Command) -> Result<redcount_core::Value, redcount::Error> {
//! #         let used = self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
//! #         let (allowed, remaining, retry) = if used < 2 { (1, 1 - used, 0) } else { (0, 0, 30_000) };
//! #         Ok(redcount_core::Value::Array([allowed, 2, remaining, 30_000, retry].map(redcount_core::Value::Int).to_vec()))
//! #     }
//! # }
//! # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
//! # let redis = Redis::default();
//! // let redis = redcount::Direct::connect("redis://127.0.0.1:6379").await?;
//! let policy = QuotaPolicy::new("per-key", Algorithm::FixedWindow { limit: 2, window_ms: 60_000 })?;
//! let limit = RateLimitLayer::new(redis, policy, |req| {
//!     Some(req.headers.get("x-api-key")?.to_str().ok()?.to_owned())
//! });
//! let app = ServiceBuilder::new()
//!     .layer(limit)
//!     .service_fn(|_: Request<String>| async { Ok::<_, Infallible>(Response::new(String::from("hello"))) });
//!
//! let call = || app.clone().oneshot(Request::builder().header("x-api-key", "k1").body(String::new()).unwrap());
//! let first = call().await.unwrap();
//! assert_eq!(first.status(), StatusCode::OK);
//! assert_eq!(first.headers()["ratelimit-policy"], r#""per-key";q=2;w=60"#);
//! assert_eq!(first.headers()["ratelimit"], r#""per-key";r=1;t=30"#);
//! call().await.unwrap();
//! let third = call().await.unwrap();
//! assert_eq!(third.status(), StatusCode::TOO_MANY_REQUESTS);
//! assert_eq!(third.headers()["retry-after"], "30");
//! assert_eq!(third.headers()["ratelimit"], r#""per-key";r=0;t=30"#);
//! assert_eq!(third.body(), "", "the layer's own answers have an empty body");
//! # Ok::<(), redcount::Error>(()) }).unwrap();
//! ```

use std::borrow::Cow;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use base64::Engine as _;
use http::header::{HeaderName, RETRY_AFTER};
use http::request::Parts;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use redcount_api::Policy;
use redcount_core::ErrorKind;
use redcount_core::ops::Namespaced;
use redcount_core::ops::quota::TakeQuota;
use redcount_core::ratelimit::{self, Limit};
use tower_layer::Layer;
use tower_service::Service;

use crate::{Driver, Error};

// What a user of the layer names, without depending on redcount-core or redcount-api.
pub use redcount_api::Config;
pub use redcount_core::keys::Namespace;
pub use redcount_core::ops::quota::{Algorithm, QuotaOutcome};

/// How long a request waits for Redis when its policy declares no bound (`timeout_ms`).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);
/// The longest bound a policy may set (as `timeout_ms` in the policy JSON).
pub const MAX_TIMEOUT: Duration = Duration::from_secs(60);

/// `RateLimit-Policy`, as `http` spells header names.
const POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit`.
const LIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// What a request gets when Redis does not answer in time (or cannot be reached).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnUnavailable {
    /// Refused: `503 Service Unavailable`. The default: a quota fails closed.
    #[default]
    Deny,
    /// Passed on to the inner service, unlimited and without RateLimit headers (its
    /// [`Decision`] says [`Decision::Unavailable`], and a warning is logged).
    Allow,
}

/// A quota policy: its name (the `RateLimit` items' name, and part of every Redis key), how
/// it counts, and what happens when Redis does not answer.
///
/// Built in code with [`QuotaPolicy::new`], or read from the same policy JSON the HTTP API
/// reads (`REDCOUNT_POLICIES`, with `on_unavailable`, `timeout_ms` and `REDCOUNT_NAMESPACE`)
/// with [`QuotaPolicy::from_config`], so a service and the HTTP API count the same subjects in
/// the same keys.
///
/// ```
/// use std::time::Duration;
/// use redcount::tower::{OnUnavailable, QuotaPolicy};
///
/// let policies = r#"{"per-client": {"kind": "quota", "algorithm": "gcra", "rate": 10, "period_ms": 1000,
///                    "burst": 20, "on_unavailable": "allow", "timeout_ms": 250}}"#;
/// let config = redcount::tower::Config::from_env(|v| (v == "REDCOUNT_POLICIES").then(|| policies.to_string()))?;
/// let policy = QuotaPolicy::from_config(&config, "per-client")?;
/// assert_eq!(policy.failure_mode(), OnUnavailable::Allow);
/// assert_eq!(policy.time_bound(), Duration::from_millis(250));
///
/// assert!(QuotaPolicy::from_config(&config, "nope").is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaPolicy {
    name: String,
    algorithm: Algorithm,
    on_unavailable: OnUnavailable,
    timeout: Duration,
    namespace: Namespace,
}

impl QuotaPolicy {
    /// A policy called `name` (an id: `[A-Za-z0-9_-]{1,64}`) counting with `algorithm`;
    /// denies with 503 when Redis has not answered within [`DEFAULT_TIMEOUT`].
    pub fn new(name: &str, algorithm: Algorithm) -> Result<Self, Error> {
        redcount_core::validate::id("policy", name)?;
        algorithm.validate()?;
        Ok(QuotaPolicy {
            name: name.to_owned(),
            algorithm,
            on_unavailable: OnUnavailable::Deny,
            timeout: DEFAULT_TIMEOUT,
            namespace: Namespace::default(),
        })
    }

    /// The quota policy called `name` in `config`, with its declared failure mode and time
    /// bound, in the configuration's key namespace. Its `max_cost` is not used: it bounds
    /// what public HTTP callers may ask for, and a layer's cost comes from the service's own
    /// code (up to the quota's size).
    pub fn from_config(config: &Config, name: &str) -> Result<Self, Error> {
        let algorithm = match config.policy(name) {
            Some(Policy::Quota { algorithm, .. }) => *algorithm,
            Some(other) => {
                return Err(Error::Config(format!("policy `{name}` is a {}, not a quota", other.kind())));
            }
            None => return Err(Error::Config(format!("no policy named `{name}`"))),
        };
        let mode = config.failure_mode(name);
        let mut policy = QuotaPolicy::new(name, algorithm)?.namespace(config.namespace.clone());
        policy = policy.on_unavailable(if mode.allow { OnUnavailable::Allow } else { OnUnavailable::Deny });
        if let Some(ms) = mode.timeout_ms {
            policy = policy.timeout(Duration::from_millis(u64::from(ms)));
        }
        Ok(policy)
    }

    /// What a request gets when Redis does not answer in time.
    pub fn on_unavailable(mut self, mode: OnUnavailable) -> Self {
        self.on_unavailable = mode;
        self
    }

    /// The most a request waits for Redis, within 1 ms..=[`MAX_TIMEOUT`] (clamped). A take
    /// given up may still be applied if it reached Redis (a Redis that was paused runs it on
    /// waking): the failure mode decides the request, not whether it was counted.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout.clamp(Duration::from_millis(1), MAX_TIMEOUT);
        self
    }

    /// The key namespace (as `REDCOUNT_NAMESPACE`; default `rc`).
    pub fn namespace(mut self, namespace: Namespace) -> Self {
        self.namespace = namespace;
        self
    }

    /// The policy's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How it counts.
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// Its failure mode.
    pub fn failure_mode(&self) -> OnUnavailable {
        self.on_unavailable
    }

    /// Its time bound.
    pub fn time_bound(&self) -> Duration {
        self.timeout
    }
}

/// How the layer decided a request: in the extensions of a request it passed on, and of
/// every response.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Decision {
    /// Redis counted the request: its answer (allowed, or denied with 429).
    Counted(QuotaOutcome),
    /// The request costs nothing (its cost was 0): passed on, Redis not asked.
    Free,
    /// Redis did not answer in time, could not be reached, or answered an error: `allowed`
    /// by the policy's [`OnUnavailable::Allow`] (never for an error Redis answered, such as
    /// out of memory), otherwise refused with 503.
    Unavailable {
        /// Whether the request was passed on.
        allowed: bool,
        /// Why, for logs.
        reason: String,
    },
    /// The request costs more than the whole quota: refused with 429, never admitted, so
    /// without `Retry-After`.
    TooCostly {
        /// Its cost.
        cost: u32,
        /// The quota's size.
        limit: i64,
    },
    /// The key extractor found no key: refused with the layer's
    /// [`missing_key`](RateLimitLayer::missing_key) status (400 by default).
    NoKey,
}

/// The subject a key is counted under: the key itself when it is an id
/// (`[A-Za-z0-9_-]{1,64}`) not starting with `_`, otherwise `_` and the SHA-256 of the key
/// (base64url, 43 characters), so any text (an IP address, an e-mail, a header's bytes) has a
/// subject of its own and two keys never share one. The HTTP API names the same quota by
/// this subject (`/api/quotas/{policy}/{subject}`: to peek at it, reset or override it).
///
/// ```
/// use redcount::tower::subject;
///
/// assert_eq!(subject("alice"), "alice");
/// assert_eq!(subject("203.0.113.7"), "__sUlZaoM8Y9X189bOscoUDuJktLW99RtodEgEJCQKwI");
/// assert_ne!(subject("_alice"), "_alice", "the `_` prefix is kept for hashed keys");
/// assert!(subject(&"x".repeat(65)).len() <= 64);
/// ```
pub fn subject(key: &str) -> Cow<'_, str> {
    if !key.starts_with('_') && redcount_core::validate::id("subject", key).is_ok() {
        return Cow::Borrowed(key);
    }
    let digest = ring::digest::digest(&ring::digest::SHA256, key.as_bytes());
    let mut hashed = String::with_capacity(44);
    hashed.push('_');
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode_string(digest.as_ref(), &mut hashed);
    Cow::Owned(hashed)
}

type KeyFn = dyn Fn(&Parts) -> Option<String> + Send + Sync;
type CostFn = dyn Fn(&Parts) -> u32 + Send + Sync;

/// What a layer and every service it makes share.
struct Shared<D> {
    driver: Arc<D>,
    policy: QuotaPolicy,
    key: Arc<KeyFn>,
    cost: Arc<CostFn>,
    missing_key: StatusCode,
}

impl<D> Clone for Shared<D> {
    fn clone(&self) -> Self {
        Shared {
            driver: Arc::clone(&self.driver),
            policy: self.policy.clone(),
            key: Arc::clone(&self.key),
            cost: Arc::clone(&self.cost),
            missing_key: self.missing_key,
        }
    }
}

/// A tower [`Layer`] that takes a quota of [`QuotaPolicy`] from each request's subject (what
/// its key extractor finds), over `D`, a [`Driver`]. See the [module docs](self).
///
/// ```
/// use std::convert::Infallible;
/// use http::{Request, Response, StatusCode};
/// use redcount::tower::{Algorithm, Decision, QuotaPolicy, RateLimitLayer};
/// use tower::{ServiceBuilder, ServiceExt};
///
/// # struct Down; // stands in for a Direct to a Redis that is down
/// # impl redcount::Driver for Down {
/// #     async fn send(&self, _: &redcount_core::Command) -> Result<redcount_core::Value, redcount::Error> {
/// #         Err(redcount::Error::Transport(redcount::Transport { may_have_run: false, timed_out: false, detail: "connection refused".into() }))
/// #     }
/// # }
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// # let redis = Down;
/// // let redis = redcount::Direct::connect("redis://127.0.0.1:6379").await?;
/// let policy = QuotaPolicy::new("uploads", Algorithm::TokenBucket { capacity: 100, refill: 10, interval_ms: 1000 })?;
/// // A user left by an authentication layer outside this one; an upload costs a unit per MB
/// // begun, a request without a body nothing.
/// #[derive(Clone)]
/// struct User(String);
/// let layer = RateLimitLayer::new(redis, policy, |req| req.extensions.get::<User>().map(|u| u.0.clone()))
///     .cost(|req| {
///         let bytes = req.headers.get("content-length").and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
///         u32::try_from(bytes.unwrap_or(0).div_ceil(1 << 20)).unwrap_or(u32::MAX)
///     })
///     .missing_key(StatusCode::UNAUTHORIZED);
/// let app = ServiceBuilder::new()
///     .layer(layer)
///     .service_fn(|_: Request<Vec<u8>>| async { Ok::<_, Infallible>(Response::new(Vec::<u8>::new())) });
///
/// let signed_in = |length: &str| {
///     let mut req = Request::post("/upload").header("content-length", length).body(Vec::new()).unwrap();
///     req.extensions_mut().insert(User("alice".into()));
///     req
/// };
/// let anonymous = Request::post("/upload").body(Vec::new()).unwrap();
/// assert_eq!(app.clone().oneshot(anonymous).await.unwrap().status(), StatusCode::UNAUTHORIZED);
/// let free = app.clone().oneshot(signed_in("0")).await.unwrap();
/// assert_eq!((free.status(), free.extensions().get()), (StatusCode::OK, Some(&Decision::Free)));
/// // Redis down: the policy's failure mode (refuse, by default).
/// let upload = app.clone().oneshot(signed_in("5000000")).await.unwrap();
/// assert_eq!(upload.status(), StatusCode::SERVICE_UNAVAILABLE);
/// assert!(matches!(upload.extensions().get(), Some(Decision::Unavailable { allowed: false, .. })));
/// # Ok::<(), redcount::Error>(()) }).unwrap();
/// ```
pub struct RateLimitLayer<D> {
    shared: Shared<D>,
}

impl<D> Clone for RateLimitLayer<D> {
    fn clone(&self) -> Self {
        RateLimitLayer { shared: self.shared.clone() }
    }
}

impl<D> fmt::Debug for RateLimitLayer<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("policy", &self.shared.policy)
            .field("missing_key", &self.shared.missing_key)
            .finish_non_exhaustive()
    }
}

impl<D: Driver + Send + Sync + 'static> RateLimitLayer<D> {
    /// Limits each request by `policy`, counted under the subject of the key `key` finds in
    /// its head ([`subject`]); each request costs 1 (see [`cost`](Self::cost)); a request
    /// with no key is refused with 400 (see [`missing_key`](Self::missing_key)).
    pub fn new(driver: D, policy: QuotaPolicy, key: impl Fn(&Parts) -> Option<String> + Send + Sync + 'static) -> Self {
        RateLimitLayer {
            shared: Shared {
                driver: Arc::new(driver),
                policy,
                key: Arc::new(key),
                cost: Arc::new(|_| 1),
                missing_key: StatusCode::BAD_REQUEST,
            },
        }
    }

    /// What each request costs, from its head (0: it passes without being counted). A cost
    /// over the quota's size is refused with 429 and no `Retry-After`: it can never pass.
    pub fn cost(mut self, cost: impl Fn(&Parts) -> u32 + Send + Sync + 'static) -> Self {
        self.shared.cost = Arc::new(cost);
        self
    }

    /// The status of a request for which the key extractor found no key (400 by default;
    /// e.g. 401 when the key is an authenticated user). To count such requests together
    /// instead, have the extractor return a shared key for them.
    pub fn missing_key(mut self, status: StatusCode) -> Self {
        self.shared.missing_key = status;
        self
    }
}

impl<S, D> Layer<S> for RateLimitLayer<D> {
    type Service = RateLimit<S, D>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit { inner, shared: Arc::new(self.shared.clone()) }
    }
}

/// The service [`RateLimitLayer`] makes: `S` behind a quota.
pub struct RateLimit<S, D> {
    inner: S,
    shared: Arc<Shared<D>>,
}

impl<S: Clone, D> Clone for RateLimit<S, D> {
    fn clone(&self) -> Self {
        RateLimit { inner: self.inner.clone(), shared: Arc::clone(&self.shared) }
    }
}

impl<S: fmt::Debug, D> fmt::Debug for RateLimit<S, D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit").field("inner", &self.inner).field("policy", &self.shared.policy).finish()
    }
}

/// The future of a [`RateLimit`] call.
pub struct ResponseFuture<B, E> {
    inner: Pin<Box<dyn Future<Output = Result<Response<B>, E>> + Send>>,
}

impl<B, E> fmt::Debug for ResponseFuture<B, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<B, E> Future for ResponseFuture<B, E> {
    type Output = Result<Response<B>, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

impl<S, D, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S, D>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    D: Driver + Send + Sync + 'static,
    ReqBody: Send + 'static,
    ResBody: Default + Send + 'static,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = ResponseFuture<ResBody, S::Error>;

    /// Ready when the inner service is: a request the quota admits goes to it at once.
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        // The service that was polled ready is the one to call (it may hold a slot reserved
        // by poll_ready); a clone, not yet ready, stays here for the next poll_ready.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let shared = Arc::clone(&self.shared);
        let (mut parts, body) = req.into_parts();
        let key = (shared.key)(&parts);
        let cost = (shared.cost)(&parts);
        let inner = Box::pin(async move {
            let Checked { refuse, headers, decision } = shared.check(key, cost).await;
            match refuse {
                Some(status) => Ok(own_response(status, headers, decision)),
                None => {
                    parts.extensions.insert(decision.clone());
                    let mut response = inner.call(Request::from_parts(parts, body)).await?;
                    response.extensions_mut().insert(decision);
                    // Appended, not set: nested layers' items add up to one list per field.
                    for (name, value) in headers {
                        if let Some(name) = name {
                            response.headers_mut().append(name, value);
                        }
                    }
                    Ok(response)
                }
            }
        });
        ResponseFuture { inner }
    }
}

/// What [`Shared::check`] found: refuse with a status, or pass; the headers either way.
struct Checked {
    refuse: Option<StatusCode>,
    headers: HeaderMap,
    decision: Decision,
}

impl Checked {
    fn pass(decision: Decision) -> Self {
        Checked { refuse: None, headers: HeaderMap::new(), decision }
    }

    fn refuse(status: StatusCode, decision: Decision) -> Self {
        Checked { refuse: Some(status), headers: HeaderMap::new(), decision }
    }
}

impl<D: Driver> Shared<D> {
    /// Takes `cost` from `key`'s quota, within the policy's time bound.
    async fn check(&self, key: Option<String>, cost: u32) -> Checked {
        let Some(key) = key else {
            return Checked::refuse(self.missing_key, Decision::NoKey);
        };
        if cost == 0 {
            return Checked::pass(Decision::Free);
        }
        let policy = &self.policy;
        let limit = policy.algorithm.limit();
        if i64::from(cost) > limit {
            let mut checked = Checked::refuse(StatusCode::TOO_MANY_REQUESTS, Decision::TooCostly { cost, limit });
            // What the quota is (its remainder is unknown: Redis was not asked).
            let size = QuotaOutcome { allowed: false, limit, remaining: 0, reset_ms: 0, retry_after_ms: 0 };
            let field = ratelimit::policy_field(&[Limit::quota(&policy.name, &policy.algorithm, &size)]);
            insert(&mut checked.headers, POLICY, &field);
            return checked;
        }
        let subject = subject(&key);
        let op = match TakeQuota::take(&policy.name, &subject, policy.algorithm, i64::from(cost)) {
            Ok(op) => Namespaced::new(op, policy.namespace.clone()),
            // Every input was checked above; refused all the same if one ever is not.
            Err(e) => return self.unavailable(Err(Error::Input(e))),
        };
        let outcome = match tokio::time::timeout(policy.timeout, self.driver.run(&op)).await {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(e)) => return self.unavailable(Err(e)),
            Err(_) => return self.unavailable(Ok(policy.timeout)),
        };
        let limits = [Limit::quota(&policy.name, &policy.algorithm, &outcome)];
        let mut checked = if outcome.allowed {
            Checked::pass(Decision::Counted(outcome))
        } else {
            let mut c = Checked::refuse(StatusCode::TOO_MANY_REQUESTS, Decision::Counted(outcome));
            insert(&mut c.headers, RETRY_AFTER, &ratelimit::retry_after_s(outcome.retry_after_ms).to_string());
            c
        };
        insert(&mut checked.headers, POLICY, &ratelimit::policy_field(&limits));
        insert(&mut checked.headers, LIMIT, &ratelimit::limit_field(&limits));
        checked
    }

    /// The answer when Redis did not answer (`Ok(the bound that ran out)`) or failed.
    fn unavailable(&self, why: Result<Duration, Error>) -> Checked {
        let name = &self.policy.name;
        // Only a Redis that did not answer (or said it cannot for now) is "unavailable"; an
        // answer that is an error (out of memory, a refused token, a reply of the wrong
        // shape) is a fault to see, and refused whatever the failure mode.
        let (no_answer, reason) = match why {
            Ok(bound) => (true, format!("Redis did not answer within {} ms", bound.as_millis())),
            Err(e) => {
                let no_answer = match &e {
                    Error::Transport(_) => true,
                    Error::Redis(reply) => reply.kind == ErrorKind::Unavailable,
                    _ => false,
                };
                (no_answer, e.to_string())
            }
        };
        let allowed = no_answer && self.policy.on_unavailable == OnUnavailable::Allow;
        if allowed {
            tracing::warn!(policy = %name, "rate limit not applied, passed by the policy's failure mode: {reason}");
            Checked::pass(Decision::Unavailable { allowed, reason })
        } else {
            tracing::warn!(policy = %name, "request refused (503): {reason}");
            Checked::refuse(StatusCode::SERVICE_UNAVAILABLE, Decision::Unavailable { allowed, reason })
        }
    }
}

/// Adds a header whose value redcount made (printable ASCII); skipped if it ever is not.
fn insert(headers: &mut HeaderMap, name: HeaderName, value: &str) {
    if let Ok(value) = HeaderValue::try_from(value) {
        headers.insert(name, value);
    }
}

/// An answer of the layer's own: `status`, `headers`, an empty body, the decision.
fn own_response<B: Default>(status: StatusCode, headers: HeaderMap, decision: Decision) -> Response<B> {
    let mut response = Response::new(B::default());
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    response.extensions_mut().insert(decision);
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Any text has a subject that is an id; it is the key itself exactly when the key
        /// is an id not starting with `_`, and a hash (which always starts with `_`) otherwise,
        /// so a key passed through never equals another key's hash.
        #[test]
        fn every_key_has_an_id_of_its_own(key in prop_oneof!["\\PC*", "[A-Za-z0-9_-]{1,70}", ".{0,200}"]) {
            let s = subject(&key);
            prop_assert!(redcount_core::validate::id("subject", &s).is_ok(), "{key:?} -> {s:?}");
            let passed = matches!(s, Cow::Borrowed(_));
            prop_assert_eq!(passed, !key.starts_with('_') && redcount_core::validate::id("subject", &key).is_ok());
            prop_assert_eq!(passed, !s.starts_with('_'));
            prop_assert!(passed || s.len() == 44);
        }
    }

    #[test]
    fn header_names_are_the_cores() {
        assert_eq!(POLICY.as_str(), ratelimit::POLICY_HEADER.to_ascii_lowercase());
        assert_eq!(LIMIT.as_str(), ratelimit::LIMIT_HEADER.to_ascii_lowercase());
    }
}
