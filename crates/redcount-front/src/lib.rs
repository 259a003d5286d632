//! The front: an Upstash-compatible REST server for Redis and Redis Cluster (the binary
//! `redcount-rest`).
//!
//! Speaks the protocol the official Upstash clients expect (`POST /`, `/pipeline`,
//! `/multi-exec`, path-style commands, `Upstash-Encoding: base64`, RESP2 responses), with
//! two additions: scripts written for Upstash's `#!lua flags=allow-key-locking` run on
//! real Redis, and commands that would hold or block the shared connection are refused.
//!
//! [`app`] connects to Redis and gives the front's HTTP service ([`Front`]) and the tasks that
//! run beside it; [`serve`] serves it within the flags' bounds; [`run`] is both, until SIGINT or SIGTERM (the
//! binary). A request goes through `http` (token, body), `request` (parsed, or refused),
//! `rules` (what the token may run), then a plan (`plan`: what to send, wait for or answer,
//! decided apart from doing it) that the driver (`driver`) carries out against the
//! connections (`backend`).
//!
//! ```no_run
//! # async fn demo() -> Result<(), String> {
//! use clap::Parser;
//! let config = redcount_front::Config::parse_from(["redcount-rest", "--token", "a-long-random-token"]);
//! let (front, _background) = redcount_front::app(&config).await?;
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.map_err(|e| e.to_string())?;
//! redcount_front::serve(listener, front, &config, std::future::pending()).await
//! # }
//! ```
#![warn(missing_docs)]

mod auth;
mod backend;
mod cluster_users;
mod commands;
mod config;
mod driver;
mod failure;
mod fixup;
mod http;
mod plan;
mod reply;
mod request;
mod respond;
mod rules;
mod scripts;
mod setup;
mod subscribe;
mod tokens;
mod watchdog;

use std::sync::Arc;
use std::time::Duration;

use redcount_http::log;

pub use config::Config;
pub use http::Front;

/// Commands whose reply is one integer whatever their arguments (none blocks, none changes
/// the connection's state): like redcount's own scripts, they run on the front's shared,
/// pipelined connections, several clients' commands in one write to Redis, instead of on a
/// connection of their own, which exists so that an unbounded reply (GET, LRANGE, a script's)
/// can be cut off without harming other requests. Left out on purpose: SET (`GET` returns a
/// value), ZADD (`INCR` returns a score), INCRBYFLOAT (a bulk string). The tests run every one
/// against Redis and check that the reply is an integer.
pub const INTEGER_REPLY_COMMANDS: &[&str] = &[
    "INCR",
    "INCRBY",
    "DECR",
    "DECRBY",
    "DEL",
    "UNLINK",
    "EXISTS",
    "TOUCH",
    "EXPIRE",
    "PEXPIRE",
    "EXPIREAT",
    "PEXPIREAT",
    "TTL",
    "PTTL",
    "PERSIST",
    "SETNX",
    "STRLEN",
    "GETBIT",
    "SETBIT",
    "BITCOUNT",
    "HINCRBY",
    "HSET",
    "HSETNX",
    "HDEL",
    "HEXISTS",
    "HLEN",
    "SADD",
    "SREM",
    "SISMEMBER",
    "SCARD",
    "LPUSH",
    "RPUSH",
    "LPUSHX",
    "RPUSHX",
    "LLEN",
    "ZREM",
    "ZCARD",
    "PFADD",
    "PUBLISH",
];

/// The front's request parsing on arbitrary input; for the fuzz targets only.
#[doc(hidden)]
pub fn fuzz_parse(path: &str, body: &[u8]) {
    http::fuzz_parse(path, body)
}

/// Shared state of the server.
pub(crate) struct State {
    /// The connections the full token's requests use.
    pub backend: backend::Backend,
    /// The read-only token's connections, logged in as a Redis ACL user that may not write
    /// (so Redis itself refuses writes, even inside scripts); `None` when that user could not
    /// be set up, and then the read-only token may not run scripts at all.
    pub readonly_backend: Option<backend::Backend>,
    /// A connection kept free for SCRIPT KILL / FUNCTION KILL.
    pub killer: backend::Backend,
    pub allow_admin: bool,
    pub token: String,
    pub readonly_token: Option<String>,
    /// Places for subscribers (`--max-subscribers`).
    pub subscribers: Arc<tokio::sync::Semaphore>,
    /// `--max-subscriber-backlog-bytes`.
    pub subscriber_backlog: usize,
    /// The Redis URL (seeds on --cluster), for connections of their own.
    pub redis_url: String,
    /// The tokens of `--tokens`, swapped whole on reload.
    pub scoped: std::sync::RwLock<Arc<Vec<auth::Scoped>>>,
    pub max_body: usize,
    /// `--max-transaction-commands`.
    pub max_transaction: usize,
    /// KiB of request bodies that may be in flight at once.
    pub body_budget: tokio::sync::Semaphore,
    /// KiB of large responses that may be in flight at once.
    pub response_budget: Arc<tokio::sync::Semaphore>,
    /// `--max-response-bytes`: also the bound on a reply once encoded.
    pub max_response: usize,
    pub timeout: Duration,
    pub scripts: scripts::Scripts,
    pub commands: commands::Table,
    /// Redis's output-buffer limit for normal clients as the front set it (0: not set).
    pub output_limit: usize,
    /// The run id of the Redis the front last saw its output-buffer limit in force on (not on
    /// --cluster): a connection closed while it stays the same was closed on purpose. Taken at
    /// start, and again after a restart once the limit is back (set on every new connection).
    pub run_id: std::sync::Mutex<Option<String>>,
    /// The requests' metrics.
    pub requests: http::Requests,
}

impl State {
    /// The rules a request's commands are checked against.
    pub(crate) fn rules(&self) -> rules::Rules<'_> {
        rules::Rules {
            commands: &self.commands,
            allow_admin: self.allow_admin,
            readonly_scripts: self.readonly_backend.is_some(),
            max_response: self.max_response,
        }
    }

    /// What responses are bounded by.
    pub(crate) fn bounds(&self) -> respond::Bounds<'_> {
        respond::Bounds { max_response: self.max_response, budget: &self.response_budget }
    }
}

/// What runs beside the front's service: its script watchdog, the keeper of its Redis users
/// and settings, and the reload of `--tokens` on SIGHUP. Dropping it stops them.
#[derive(Debug, Default)]
pub struct Background(Vec<tokio::task::JoinHandle<()>>);

impl Drop for Background {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// Connects to Redis as `config` says (its users, settings and connections, `--tokens`), and
/// gives the front's HTTP service and what runs beside it. Must run inside a Tokio runtime, which
/// the background tasks then use.
pub async fn app(config: &Config) -> Result<(Front, Background), String> {
    if config.token.is_empty() {
        return Err("--token (REDCOUNT_REST_TOKEN) must not be empty".into());
    }
    if config.readonly_token.as_deref() == Some(&config.token) {
        return Err("--readonly-token must differ from --token".into());
    }
    let wait = config::replica_wait(config)?;
    let setup::Connected { killer, commands, backend, readonly, made_users, settings, output_limit, run_id } =
        setup::connect(config, wait).await?;
    let mut background = Background::default();
    let keep_users = config.cluster || !made_users.is_empty() || config.tokens.is_some();
    let keeper = Arc::new(cluster_users::Keeper::new(
        &config.redis,
        config.cluster,
        made_users,
        settings.clone(),
        &commands,
        config.timeout(),
    )?);
    // On one Redis only when there is something to keep (a managed Redis may refuse ACL).
    if keep_users {
        background.0.push(tokio::spawn(keeper.clone().run()));
    }
    if !settings.is_empty() {
        killer.on_connect(settings.clone(), None);
        backend.on_connect(settings.clone(), Some(&killer));
        if let Some(ro) = &readonly {
            ro.on_connect(settings.clone(), Some(&killer));
        }
    }
    // One budget for large replies: charged while they are read, held until they are sent.
    let response_budget = Arc::new(tokio::sync::Semaphore::new(
        (config.max_inflight_response_bytes / 1024).clamp(config.max_response_bytes.div_ceil(1024).max(1), 1 << 30),
    ));
    backend.charge_replies(&response_budget);
    if let Some(ro) = &readonly {
        ro.charge_replies(&response_budget);
    }
    // Its own connection: a SCRIPT KILL may wait for a script to reach its bound. Where the
    // threshold could not be lowered it still kills, once Redis's own threshold has passed.
    background.0.push(tokio::spawn(watchdog::run(setup::own_connection(config).await?, config.script_timeout())));
    let state = Arc::new(State {
        backend,
        readonly_backend: readonly,
        killer,
        allow_admin: config.allow_admin_commands,
        token: config.token.clone(),
        readonly_token: config.readonly_token.clone(),
        subscribers: Arc::new(tokio::sync::Semaphore::new(config.max_subscribers)),
        subscriber_backlog: config.max_subscriber_backlog_bytes.max(1024),
        redis_url: config.redis.clone(),
        scoped: std::sync::RwLock::new(Arc::new(Vec::new())),
        max_body: config.max_body_bytes,
        max_transaction: config.max_transaction_commands.max(1),
        body_budget: tokio::sync::Semaphore::new(
            (config.max_inflight_body_bytes / 1024).clamp(config.max_body_bytes.div_ceil(1024).max(1), 1 << 30),
        ),
        response_budget,
        max_response: config.max_response_bytes.max(1024),
        timeout: config.timeout(),
        scripts: scripts::Scripts::default(),
        commands,
        output_limit,
        run_id: std::sync::Mutex::new(run_id),
        requests: http::Requests::new(),
    });
    if let Some(path) = &config.tokens {
        background.0.push(setup::scoped_tokens(&state, config, path.clone(), settings, wait, keeper).await?);
    }
    Ok((http::Front::new(state), background))
}

/// Serves `front` on `listener` within `config`'s bounds (connection caps, header and stall
/// timeouts; HTTPS with `--tls-cert`), until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    front: Front,
    config: &Config,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), String> {
    let tls = redcount_http::Tls::from_flags(config.tls_cert.as_deref(), config.tls_key.as_deref())?;
    tracing::info!(
        "listening on {}://{} for Redis {}{}",
        if tls.is_some() { "https" } else { "http" },
        listener.local_addr().map_err(|e| e.to_string())?,
        backend::redact(&config.redis),
        if config.cluster { " (cluster)" } else { "" }
    );
    redcount_http::serve_tls(listener, front, config.limits(), tls, shutdown).await.map_err(|e| e.to_string())
}

/// Connects to Redis, then serves until SIGINT or SIGTERM.
pub async fn run(config: Config) -> Result<(), String> {
    log::init(config.log, config.log_format);
    redcount_http::serve_metrics(config.metrics_listen)?;
    let (front, _background) = app(&config).await?;
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", config.listen))?;
    serve(listener, front, &config, shutdown()).await
}

async fn shutdown() {
    let term = async {
        if let Ok(mut s) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            s.recv().await;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}
