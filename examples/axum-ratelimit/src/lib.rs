//! An axum service behind redcount's rate limit ([`redcount::tower::RateLimitLayer`]): each
//! client (its `x-api-key`, else its address) may make 100 requests a minute; `/search`
//! costs 5 of them, `/health` none. The policy is the JSON the HTTP API reads
//! (`REDCOUNT_POLICIES`), so its failure mode (`on_unavailable`, `timeout_ms`) and the key
//! namespace (`REDCOUNT_NAMESPACE`) are the same too.
//!
//! `cargo run -p axum-ratelimit` serves it on `PORT` (3000) against `REDIS_URL`
//! (`redis://127.0.0.1:6379`), or against an Upstash-compatible REST front when
//! `REDCOUNT_REST_URL` and `REDCOUNT_REST_TOKEN` are set. Its tests drive [`app`] in-process.

use std::net::SocketAddr;

use axum::extract::ConnectInfo;
use axum::http::request::Parts;
use axum::routing::get;
use axum::{Extension, Router};
use redcount::Driver;
use redcount::tower::{Config, Decision, QuotaPolicy, RateLimitLayer};

/// The policy the service is limited by, when `REDCOUNT_POLICIES` does not say otherwise.
pub const POLICIES: &str = r#"{
  "per-client": {"kind": "quota", "algorithm": "fixed", "limit": 100, "window_ms": 60000, "timeout_ms": 500}
}"#;

/// The policy's name in [`POLICIES`].
pub const POLICY: &str = "per-client";

/// The key of a request: its `x-api-key` header.
pub fn api_key(req: &Parts) -> Option<String> {
    Some(req.headers.get("x-api-key")?.to_str().ok()?.to_owned())
}

/// The key of a request: the IP address it came from (axum's `ConnectInfo`, set by
/// `into_make_service_with_connect_info`).
pub fn peer(req: &Parts) -> Option<String> {
    req.extensions.get::<ConnectInfo<SocketAddr>>().map(|ConnectInfo(addr)| addr.ip().to_string())
}

/// The key the service counts by: the API key, else the address.
pub fn api_key_or_peer(req: &Parts) -> Option<String> {
    api_key(req).or_else(|| peer(req))
}

/// A signed-in user, as an authentication layer would leave it in the request's extensions.
#[derive(Debug, Clone)]
pub struct User(pub String);

/// The key of a request: its signed-in user.
pub fn user(req: &Parts) -> Option<String> {
    req.extensions.get::<User>().map(|u| u.0.clone())
}

/// What a request costs: `/search` 5, `/health` nothing (not counted), the rest 1.
pub fn cost(req: &Parts) -> u32 {
    match req.uri.path() {
        "/health" => 0,
        "/search" => 5,
        _ => 1,
    }
}

/// The limit: [`POLICY`] of `config`, keyed by [`api_key_or_peer`], costed by [`cost`].
pub fn limit<D: Driver + Send + Sync + 'static>(
    driver: D,
    config: &Config,
) -> Result<RateLimitLayer<D>, redcount::Error> {
    Ok(RateLimitLayer::new(driver, QuotaPolicy::from_config(config, POLICY)?, api_key_or_peer).cost(cost))
}

/// The service: its routes behind `limit`.
pub fn app<D: Driver + Send + Sync + 'static>(limit: RateLimitLayer<D>) -> Router {
    Router::new()
        .route("/hello", get(hello))
        .route("/search", get(|| async { "results\n" }))
        .route("/health", get(|| async { "ok\n" }))
        .layer(limit)
}

/// A handler that reads what the limit decided.
async fn hello(Extension(decision): Extension<Decision>) -> String {
    match decision {
        Decision::Counted(o) => format!("hello ({} left)\n", o.remaining),
        _ => "hello\n".to_owned(),
    }
}

/// The README's quick start ("From axum"), kept compiling here: a test holds the lines
/// between the markers equal to the README's.
pub async fn quick_start() -> Result<Router, Box<dyn std::error::Error>> {
    // README from axum: begin
    use redcount::tower::{Algorithm, QuotaPolicy, RateLimitLayer};

    let redis = redcount::Direct::connect("redis://127.0.0.1:6379").await?;
    let policy = QuotaPolicy::new("per-key", Algorithm::FixedWindow { limit: 100, window_ms: 60_000 })?;
    let limit = RateLimitLayer::new(redis, policy, |req| Some(req.headers.get("x-api-key")?.to_str().ok()?.to_owned()));
    let app = Router::new().route("/", get(|| async { "hello" })).layer(limit);
    // README from axum: end
    Ok(app)
}
