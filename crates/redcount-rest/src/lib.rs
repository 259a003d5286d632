//! An Upstash-compatible REST front for Redis and Redis Cluster.
//!
//! Speaks the protocol the official Upstash clients expect (`POST /`, `/pipeline`,
//! `/multi-exec`, path-style commands, `Upstash-Encoding: base64`, RESP2 responses), with
//! two additions: scripts written for Upstash's `#!lua flags=allow-key-locking` run on
//! real Redis, and commands that would hold or block the shared connection are refused.
#![warn(missing_docs)]

mod auth;
mod backend;
mod commands;
mod http;
mod log;
mod reply;
mod scripts;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;

use http::router;

/// The front's request parsing on arbitrary input; for the fuzz targets only.
#[doc(hidden)]
pub fn fuzz_parse(path: &str, body: &[u8]) {
    http::fuzz_parse(path, body)
}

/// Command-line configuration; every flag has an environment variable.
#[derive(Parser, Clone)]
#[command(version, about = "An Upstash-compatible REST front for Redis and Redis Cluster")]
pub struct Config {
    /// Address to listen on.
    #[arg(long, env = "REDCOUNT_REST_LISTEN", default_value = "127.0.0.1:8079")]
    pub listen: SocketAddr,

    /// Redis URL (redis://[:password@]host:port[/db]); with --cluster, a comma-separated list
    /// of seed nodes.
    #[arg(long, env = "REDIS_URL", default_value = "redis://127.0.0.1:6379")]
    pub redis: String,

    /// Treat --redis as Redis Cluster seed nodes (slot routing, MOVED/ASK followed).
    #[arg(long, env = "REDCOUNT_REST_CLUSTER")]
    pub cluster: bool,

    /// Bearer token that may run every command (required).
    #[arg(long, env = "REDCOUNT_REST_TOKEN", hide_env_values = true)]
    pub token: String,

    /// Bearer token that may run read-only commands only (by Redis's own COMMAND flags).
    #[arg(long, env = "REDCOUNT_REST_READONLY_TOKEN", hide_env_values = true)]
    pub readonly_token: Option<String>,

    /// Largest request body accepted; larger ones get 413.
    #[arg(long, env = "REDCOUNT_REST_MAX_BODY_BYTES", default_value_t = 1024 * 1024)]
    pub max_body_bytes: usize,

    /// Longest wait for Redis to answer one request, in ms; then 504.
    #[arg(long, env = "REDCOUNT_REST_TIMEOUT_MS", default_value_t = 5_000)]
    pub timeout_ms: u64,

    /// Worker threads (0: one per core). One thread is often fastest when Redis shares the
    /// machine: the front then never competes with itself.
    #[arg(long, env = "REDCOUNT_REST_THREADS", default_value_t = 0)]
    pub threads: usize,

    /// Log level: error, info or debug (debug logs one line per request; never a token).
    #[arg(long, env = "REDCOUNT_REST_LOG", default_value = "info")]
    pub log: log::Level,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the tokens or a password in the URL.
        f.debug_struct("Config")
            .field("listen", &self.listen)
            .field("redis", &backend::redact(&self.redis))
            .field("cluster", &self.cluster)
            .finish_non_exhaustive()
    }
}

/// Shared state of the server.
pub(crate) struct State {
    pub backend: backend::Backend,
    pub token: String,
    pub readonly_token: Option<String>,
    pub max_body: usize,
    pub timeout: Duration,
    pub scripts: scripts::Scripts,
    pub commands: commands::Table,
    pub log: log::Level,
}

/// Connects to Redis, then serves until SIGINT or SIGTERM.
pub async fn run(config: Config) -> Result<(), String> {
    if config.token.is_empty() {
        return Err("--token (REDCOUNT_REST_TOKEN) must not be empty".into());
    }
    if config.readonly_token.as_deref() == Some(&config.token) {
        return Err("--readonly-token must differ from --token".into());
    }
    let timeout = Duration::from_millis(config.timeout_ms.max(1));
    let backend = backend::Backend::connect(&config.redis, config.cluster, timeout)
        .await
        .map_err(|e| format!("cannot reach Redis at {}: {e}", backend::redact(&config.redis)))?;
    let commands = commands::Table::load(&backend).await.map_err(|e| format!("cannot read COMMAND from Redis: {e}"))?;
    let state = Arc::new(State {
        backend,
        token: config.token.clone(),
        readonly_token: config.readonly_token.clone(),
        max_body: config.max_body_bytes,
        timeout,
        scripts: scripts::Scripts::default(),
        commands,
        log: config.log,
    });
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", config.listen))?;
    log::info(
        state.log,
        &format!(
            "listening on http://{} for Redis {}{}",
            listener.local_addr().map_err(|e| e.to_string())?,
            backend::redact(&config.redis),
            if config.cluster { " (cluster)" } else { "" }
        ),
    );
    use axum::serve::ListenerExt;
    // Small request/response exchanges: never let Nagle hold a reply back.
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    axum::serve(listener, router(state)).with_graceful_shutdown(shutdown()).await.map_err(|e| e.to_string())
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
