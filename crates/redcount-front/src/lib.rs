//! An Upstash-compatible REST front for Redis and Redis Cluster.
//!
//! Speaks the protocol the official Upstash clients expect (`POST /`, `/pipeline`,
//! `/multi-exec`, path-style commands, `Upstash-Encoding: base64`, RESP2 responses), with
//! two additions: scripts written for Upstash's `#!lua flags=allow-key-locking` run on
//! real Redis, and commands that would hold or block the shared connection are refused.
#![warn(missing_docs)]

mod auth;
mod backend;
mod cluster_users;
mod commands;
mod http;
mod reply;
mod scripts;
mod subscribe;
mod tokens;
mod watchdog;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;

use http::router;
use redcount_http::log;

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

/// What `--help` says of the servers behind the front (which are tested, and what differs) and
/// of trusting a private CA.
const SERVERS: &str = "\
Servers: tested with Redis 7.0 and Valkey 8.1 (also as a Cluster). The front reads what a \
command may do from the server's own COMMAND table, so each server's commands are treated \
by their flags. On Valkey, for a client: SCRIPT SHOW gives the full token (and a --tokens \
user allowed to script) the source of any cached script (read-only tokens are refused it); \
a blocking command inside a script (BLPOP...) answers at once instead of being refused; \
COMMANDLOG is refused as administrative, like SLOWLOG; and error texts differ after their \
first word (NOSCRIPT, an ACL refusal inside a script), which clients should read alone.

TLS: rediss:// (Redis over TLS) trusts the system's root certificates. To trust a private CA \
instead, set SSL_CERT_FILE to a PEM file of it (it replaces the system's roots): \
SSL_CERT_FILE=/etc/redcount/redis-ca.pem redcount-rest --redis rediss://… \
(rediss://…#insecure is refused).";

/// Command-line configuration; every flag has an environment variable.
#[derive(Parser, Clone)]
#[command(version, about = "An Upstash-compatible REST front for Redis and Redis Cluster", after_help = SERVERS)]
pub struct Config {
    /// Address to listen on.
    #[arg(long, env = "REDCOUNT_REST_LISTEN", default_value = "127.0.0.1:8079")]
    pub listen: SocketAddr,

    /// Redis URL (redis://host:port, or redis://user:password@host:port/db); with --cluster, a comma-separated list
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

    /// Most bytes of request bodies over 16 KiB being received or handled at once (each
    /// counted at its declared length); past it such requests get 503. Bounds what slow large
    /// bodies can hold; smaller bodies are not counted (the connection cap bounds them).
    /// Never below --max-body-bytes (one largest body always fits).
    #[arg(long, env = "REDCOUNT_REST_MAX_INFLIGHT_BODY_BYTES", default_value_t = 256 * 1024 * 1024)]
    pub max_inflight_body_bytes: usize,

    /// Most bytes of large replies in flight at once: charged as they are read from Redis
    /// (past the first 16 KiB of each) and as their responses are encoded, held until sent
    /// (or the client is cut off by the stall timeout); past it such requests get 503.
    /// Never below --max-response-bytes.
    #[arg(long, env = "REDCOUNT_REST_MAX_INFLIGHT_RESPONSE_BYTES", default_value_t = 256 * 1024 * 1024)]
    pub max_inflight_response_bytes: usize,

    /// Largest reply for one request (a pipeline's replies together), in bytes of RESP read
    /// from Redis and again once encoded for the client (JSON escapes may grow it sixfold);
    /// past it the request fails with 400 (and a connection that read too much is closed).
    /// The RESP bound is not enforced on --cluster yet.
    #[arg(long, env = "REDCOUNT_REST_MAX_RESPONSE_BYTES", default_value_t = 16 * 1024 * 1024)]
    pub max_response_bytes: usize,

    /// Redis's output-buffer limit for normal clients, in bytes, set at start and on every
    /// new connection (`client-output-buffer-limit normal`): Redis stops building a reply
    /// past it and closes that connection, so one request cannot make Redis itself hold
    /// gigabytes (an MGET naming a large key 100,000 times). Default: --max-response-bytes
    /// plus 1 MiB. 0 leaves Redis's setting alone. A Redis-wide setting: other normal clients
    /// of the same Redis get it too.
    #[arg(long, env = "REDCOUNT_REST_REDIS_OUTPUT_LIMIT_BYTES")]
    pub redis_output_limit_bytes: Option<usize>,

    /// Most commands in one `/multi-exec`. A transaction runs in Redis as one step that the
    /// front cannot stop when --timeout-ms has passed (a `/pipeline` is sent in chunks and
    /// stops there), so its Redis time is the sum of its commands': this bounds how many.
    #[arg(long, env = "REDCOUNT_REST_MAX_TRANSACTION_COMMANDS", default_value_t = 32)]
    pub max_transaction_commands: usize,

    /// Longest wait for Redis to answer one request, in ms; then 504.
    #[arg(long, env = "REDCOUNT_REST_TIMEOUT_MS", default_value_t = 5_000)]
    pub timeout_ms: u64,

    /// Acknowledge redcount's money calls (counters, red packets: EVALSHA of their scripts as a
    /// single command, as the worker and `redcount serve --rest-url` send them) only once this
    /// many replicas have the write: `WAIT` on the same Redis connection, right after the
    /// script. Fewer within --wait-replicas-ms: 503 with `"durable": false` (the write
    /// happened on the master and may be lost if it fails over). 0: off.
    #[arg(long, env = "REDCOUNT_REST_WAIT_REPLICAS", default_value_t = 0)]
    pub wait_replicas: u32,

    /// How long a money call waits for --wait-replicas, in ms (less than --timeout-ms).
    #[arg(long, env = "REDCOUNT_REST_WAIT_REPLICAS_MS", default_value_t = 250)]
    pub wait_replicas_ms: u64,

    /// Worker threads (0: one per core). One thread is often fastest when Redis shares the
    /// machine: the front then never competes with itself.
    #[arg(long, env = "REDCOUNT_REST_THREADS", default_value_t = 0)]
    pub threads: usize,

    /// Let the full token run administrative commands (COMMAND flag `admin`: CONFIG SET,
    /// SHUTDOWN, REPLICAOF, ACL SETUSER, DEBUG...). Off: they are refused with 403.
    #[arg(long, env = "REDCOUNT_REST_ALLOW_ADMIN_COMMANDS")]
    pub allow_admin_commands: bool,

    /// Longest a script (EVAL*, EVALSHA*, FCALL*) may run, in ms; past it the front kills it
    /// with SCRIPT KILL / FUNCTION KILL from a connection of its own. Redis cannot kill a
    /// script that has already written (UNKILLABLE): such a script still runs to its end.
    #[arg(long, env = "REDCOUNT_REST_SCRIPT_TIMEOUT_MS", default_value_t = 1_000)]
    pub script_timeout_ms: u64,

    /// Most connections to Redis per token kind, made as needed. Each serves one request at a
    /// time (so its reply can be bounded, and a slow command holds up no other request);
    /// more requests at once wait for a free one.
    #[arg(long, env = "REDCOUNT_REST_REDIS_CONNECTIONS", default_value_t = 64)]
    pub redis_connections: usize,

    /// Client connections served at once; past it new ones get 503 and are closed (lowered
    /// to fit the open-file limit, which is raised to its hard limit at start).
    #[arg(long, env = "REDCOUNT_REST_MAX_CONNECTIONS", default_value_t = 10_000)]
    pub max_connections: usize,

    /// Client connections served at once from one IP address (0: unbounded); past it new
    /// ones from that address get 503 and are closed. Behind a proxy every client shares the
    /// proxy's address: raise it there.
    #[arg(long, env = "REDCOUNT_REST_MAX_CONNECTIONS_PER_IP", default_value_t = 1_000)]
    pub max_connections_per_ip: usize,

    /// Longest a client connection may take to send a complete request head, from its start
    /// or its previous response (so also the idle keep-alive time), in ms.
    #[arg(long, env = "REDCOUNT_REST_HEADER_TIMEOUT_MS", default_value_t = 10_000)]
    pub header_timeout_ms: u64,
    /// Subscribers (`/subscribe`, `/psubscribe`) at once; each holds a Redis connection.
    #[arg(long, env = "REDCOUNT_REST_MAX_SUBSCRIBERS", default_value_t = 256)]
    pub max_subscribers: usize,
    /// Bytes of messages a subscriber may leave unread; a slower one is dropped (its stream
    /// ends), as Redis drops a slow subscriber of its own. The front holds at most
    /// --max-subscribers times this for subscribers.
    #[arg(long, env = "REDCOUNT_REST_MAX_SUBSCRIBER_BACKLOG_BYTES", default_value_t = 1 << 20)]
    pub max_subscriber_backlog_bytes: usize,
    /// More tokens, one per app, each logged in to Redis as its own ACL user (a JSON array of
    /// `{"token", "user", "password", "readonly"}`; see the README). Reloaded on SIGHUP.
    ///
    /// Redis's key patterns (`~app1:*`) do not stop commands that name no key, so the front
    /// adds its own rules to each user (ACL SETUSER, also in each of its selectors; at start,
    /// on SIGHUP, on one Redis before each new connection, and within 2 s of any change to the
    /// user or of a node's restart, on every Cluster node) and checks with ACL DRYRUN that Redis then refuses them: every
    /// command or subcommand that names no key yet reaches every key or the server (Redis's
    /// COMMAND table: reads and writes of @keyspace, @dangerous, administration: KEYS, SCAN,
    /// RANDOMKEY, DBSIZE, FLUSHALL, FLUSHDB, SWAPDB, INFO, CONFIG…), that replaces every app's
    /// functions (FUNCTION LOAD/FLUSH/DELETE/RESTORE), and SCRIPT FLUSH, SELECT, MOVE, COPY
    /// (another database), CLUSTER GETKEYSINSLOT/COUNTKEYSINSLOT, MEMORY STATS. So a file
    /// token may not run them as commands nor inside scripts, whatever its user allows. The
    /// --redis URL's user needs the right to run ACL SETUSER, GETUSER and DRYRUN; where the
    /// front cannot put its rules on a user it refuses to start (on SIGHUP: keeps the tokens
    /// in force; later: refuses that user's tokens with 503 until it can). A user must be the
    /// app's own: the rules apply to every client that logs in as it.
    #[arg(long, env = "REDCOUNT_REST_TOKENS_FILE")]
    pub tokens: Option<std::path::PathBuf>,
    /// Serve HTTPS with this certificate chain (PEM); needs --tls-key. Reloaded, with the
    /// key, on SIGHUP.
    #[arg(long, env = "REDCOUNT_REST_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<std::path::PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(long, env = "REDCOUNT_REST_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<std::path::PathBuf>,

    /// Log level: error, info or debug (debug logs one line per request; never a token).
    #[arg(long, env = "REDCOUNT_REST_LOG", default_value = "info")]
    pub log: log::Level,
    /// Log lines as text or as JSON objects.
    #[arg(long, env = "REDCOUNT_REST_LOG_FORMAT", default_value = "text")]
    pub log_format: log::Format,
    /// Serve Prometheus metrics at `GET /metrics` on this address (off by default; keep it
    /// off the public network: it needs no token).
    #[arg(long, env = "REDCOUNT_REST_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
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
}

/// Connects to Redis, then serves until SIGINT or SIGTERM.
pub async fn run(config: Config) -> Result<(), String> {
    log::init(config.log, config.log_format);
    redcount_http::serve_metrics(config.metrics_listen)?;
    if config.token.is_empty() {
        return Err("--token (REDCOUNT_REST_TOKEN) must not be empty".into());
    }
    if config.readonly_token.as_deref() == Some(&config.token) {
        return Err("--readonly-token must differ from --token".into());
    }
    let timeout = Duration::from_millis(config.timeout_ms.max(1));
    let script_timeout = Duration::from_millis(config.script_timeout_ms.max(1));
    let wait = replica_wait(&config)?;
    let unreachable = |e: backend::Failed| format!("cannot reach Redis at {}: {e}", backend::redact(&config.redis));
    let connect = |login: Option<backend::Login>, n: usize, wait: Option<redcount_cluster::ReplicaWait>| {
        let url = config.redis.clone();
        let max_reply = config.max_response_bytes.max(1024);
        async move { backend::Backend::connect(&url, config.cluster, timeout, login.as_ref(), n, max_reply, wait).await }
    };
    // The URL's own user: the front's set-up and its SCRIPT KILLs, never a client's request.
    let killer = connect(None, 1, None).await.map_err(unreachable)?;
    let commands = commands::Table::load(&killer).await.map_err(|e| format!("cannot read COMMAND from Redis: {e}"))?;
    let kill_setting = allow_script_kill(&killer, script_timeout).await;
    let full_login = if config.allow_admin_commands {
        None
    } else {
        match restricted_login(&killer, &config.token, Restriction::Full).await {
            Ok(login) => Some(login),
            Err(e) => {
                tracing::error!(
                    "cannot set up the restricted Redis user for the full token ({e}): scripts it runs may call administrative commands as far as the Redis URL's user may"
                );
                None
            }
        }
    };
    // Connections logged in as a front-made user make it again whenever Redis forgot it (a
    // restart without a saved ACL).
    // The users the front made, for the nodes that lack or changed them later (cluster_users).
    let mut made_users: Vec<(String, redis::Cmd)> = Vec::new();
    if let Some((login, setuser)) = &full_login {
        made_users.push((login.user.clone(), setuser.clone()));
    }
    let backend = match full_login {
        None => connect(None, config.redis_connections, wait).await.map_err(unreachable)?,
        Some((login, setuser)) => connect(Some(login), config.redis_connections, wait)
            .await
            .map_err(unreachable)?
            .restore_with(setuser, &killer),
    };
    let readonly_backend = match &config.readonly_token {
        None => None,
        Some(ro) => match restricted_login(&killer, ro, Restriction::ReadOnly).await {
            Ok((login, setuser)) => Some({
                made_users.push((login.user.clone(), setuser.clone()));
                connect(Some(login), config.redis_connections, None)
                    .await
                    .map_err(unreachable)?
                    .restore_with(setuser, &killer)
            }),
            Err(e) => {
                tracing::error!(
                    "the read-only token may not run scripts: cannot set up the restricted Redis user ({e})"
                );
                None
            }
        },
    };
    // A restarted Redis has its own settings again: set them on every new connection.
    let output_limit = config.redis_output_limit_bytes.unwrap_or(config.max_response_bytes.max(1024) + (1 << 20));
    let output_set = bound_output_buffers(&killer, output_limit).await;
    let run_id = if config.cluster { None } else { http::run_id(&killer).await };
    warn_if_evicting(&killer).await;
    let output_limit = if output_set.is_some() { output_limit } else { 0 };
    let settings: Vec<redis::Cmd> = kill_setting.into_iter().chain(output_set).collect();
    let made_users_empty = made_users.is_empty();
    let keeper = Arc::new(cluster_users::Keeper::new(
        &config.redis,
        config.cluster,
        made_users,
        settings.clone(),
        &commands,
        timeout,
    )?);
    // On one Redis only when there is something to keep (a managed Redis may refuse ACL).
    if config.cluster || !made_users_empty || config.tokens.is_some() {
        tokio::spawn(keeper.clone().run());
    }
    if !settings.is_empty() {
        killer.on_connect(settings.clone(), None);
        backend.on_connect(settings.clone(), Some(&killer));
        if let Some(ro) = &readonly_backend {
            ro.on_connect(settings.clone(), Some(&killer));
        }
    }
    // One budget for large replies: charged while they are read, held until they are sent.
    let response_budget = Arc::new(tokio::sync::Semaphore::new(
        (config.max_inflight_response_bytes / 1024).clamp(config.max_response_bytes.div_ceil(1024).max(1), 1 << 30),
    ));
    backend.charge_replies(&response_budget);
    if let Some(ro) = &readonly_backend {
        ro.charge_replies(&response_budget);
    }
    // Its own connection: a SCRIPT KILL may wait for a script to reach its bound. Where the
    // threshold could not be lowered it still kills, once Redis's own threshold has passed.
    tokio::spawn(watchdog::run(connect(None, 1, None).await.map_err(unreachable)?, script_timeout));
    let state = Arc::new(State {
        backend,
        readonly_backend,
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
        timeout,
        scripts: scripts::Scripts::default(),
        commands,
        output_limit,
        run_id: std::sync::Mutex::new(run_id),
    });
    if let Some(path) = &config.tokens {
        scoped_tokens(&state, &config, path.clone(), settings, wait, keeper).await?;
    }
    let tls = redcount_http::Tls::from_flags(config.tls_cert.as_deref(), config.tls_key.as_deref())?;
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", config.listen))?;
    tracing::info!(
        "listening on {}://{} for Redis {}{}",
        if tls.is_some() { "https" } else { "http" },
        listener.local_addr().map_err(|e| e.to_string())?,
        backend::redact(&config.redis),
        if config.cluster { " (cluster)" } else { "" }
    );
    let limits = redcount_http::Limits {
        max_connections: config.max_connections,
        max_per_ip: config.max_connections_per_ip,
        header_timeout: Duration::from_millis(config.header_timeout_ms.max(1)),
        stall_timeout: timeout.max(Duration::from_secs(1)),
    };
    redcount_http::serve_tls(listener, router(state), limits, tls, shutdown()).await.map_err(|e| e.to_string())
}

/// `--wait-replicas` and `--wait-replicas-ms`, checked: the wait must end inside the request's
/// own time limit.
fn replica_wait(config: &Config) -> Result<Option<redcount_cluster::ReplicaWait>, String> {
    if config.wait_replicas == 0 {
        return Ok(None);
    }
    if config.wait_replicas_ms == 0 || config.wait_replicas_ms >= config.timeout_ms {
        return Err(format!(
            "--wait-replicas-ms must be between 1 and --timeout-ms ({}), not {}: the wait must end inside the request's time limit",
            config.timeout_ms, config.wait_replicas_ms
        ));
    }
    Ok(Some(redcount_cluster::ReplicaWait {
        replicas: config.wait_replicas,
        timeout: Duration::from_millis(config.wait_replicas_ms),
    }))
}

/// Logs a warning when Redis may evict keys: redcount's counting primitives (through the
/// worker or `redcount serve --rest-url`) need `maxmemory-policy noeviction`. The front
/// serves other data too (a cache may want eviction), so it warns rather than refuses.
async fn warn_if_evicting(killer: &backend::Backend) {
    let get = |name: &'static str| async move {
        match killer.query(redis::cmd("CONFIG").arg("GET").arg(name)).await {
            Ok(redis::Value::Array(pair)) => {
                pair.get(1).and_then(|v| redis::from_redis_value::<String>(v.clone()).ok())
            }
            Ok(redis::Value::Map(pairs)) => {
                pairs.first().and_then(|(_, v)| redis::from_redis_value::<String>(v.clone()).ok())
            }
            _ => None,
        }
    };
    if let (Some(policy), Some(max)) = (get("maxmemory-policy").await, get("maxmemory").await)
        && max != "0"
        && policy != "noeviction"
    {
        tracing::warn!(
            "Redis may evict keys (maxmemory-policy {policy}, maxmemory {max}): redcount's counters, quotas, claims and idempotency records need noeviction"
        );
    }
}

/// Sets Redis's output-buffer limit for normal clients to `bytes` (0: leaves it). Returns the
/// command that did it, to send again to a restarted Redis.
async fn bound_output_buffers(backend: &backend::Backend, bytes: usize) -> Option<redis::Cmd> {
    if bytes == 0 {
        return None;
    }
    let mut set = redis::cmd("CONFIG");
    set.arg("SET").arg("client-output-buffer-limit").arg(format!("normal {bytes} 0 0"));
    match backend.query(&set).await {
        Ok(_) => {
            tracing::info!("Redis drops a normal client whose pending reply passes {bytes} bytes");
            Some(set)
        }
        Err(e) => {
            tracing::error!(
                "cannot set client-output-buffer-limit ({e}): a request for a huge reply makes Redis build it whole before the front refuses it"
            );
            None
        }
    }
}

/// Redis only answers other clients (and so SCRIPT KILL) while a script runs once
/// `busy-reply-threshold` has passed: bring it down to the front's script bound.
/// Returns the command that did it, to send again to a restarted Redis.
async fn allow_script_kill(backend: &backend::Backend, bound: Duration) -> Option<redis::Cmd> {
    let ms = bound.as_millis().to_string();
    let mut set = redis::cmd("CONFIG");
    set.arg("SET").arg("busy-reply-threshold").arg(&ms);
    if let Err(e) = backend.query(&set).await {
        set = redis::cmd("CONFIG");
        set.arg("SET").arg("lua-time-limit").arg(&ms);
        if backend.query(&set).await.is_err() {
            tracing::error!(
                "cannot set busy-reply-threshold ({e}): a runaway script is killed only after Redis's own threshold"
            );
            return None;
        }
    }
    tracing::info!("scripts are killed after {ms} ms");
    Some(set)
}

/// What a front-made Redis user may not do.
#[derive(Clone, Copy)]
enum Restriction {
    /// The full token: no administration (flag `admin` / category `@admin`), no MIGRATE, no
    /// script debugger, so scripts cannot reach them either.
    Full,
    /// The read-only token: also no writes, pub/sub, blocking, keyspace walks, nor PFCOUNT
    /// (it rewrites its value's cached cardinality).
    ReadOnly,
}

/// Sets up the Redis ACL user a token's connections log in as, so Redis itself refuses what
/// the token may not run, even inside a script. Named and keyed after the token, so fronts
/// sharing a token share the user and restarts add nothing.
async fn restricted_login(
    setup: &backend::Backend,
    token: &str,
    kind: Restriction,
) -> Result<(backend::Login, redis::Cmd), String> {
    let (tag, rules): (&str, &[&str]) = match kind {
        Restriction::Full => ("full", &["+@all", "-@admin", "-migrate", "-script|debug", "-lcs"]),
        Restriction::ReadOnly => (
            "ro",
            &[
                "+@all",
                "-@write",
                "-@admin",
                "-@dangerous",
                "-@pubsub",
                "-@blocking",
                "-keys",
                "-scan",
                "-pfcount",
                "-lcs",
                "-memory|purge",
                "-script|debug",
            ],
        ),
    };
    let user = format!("redcount-rest-{tag}-{}", &scripts::sha_hex(token.as_bytes())[..12]);
    // The read-only user's password has been derived this way since it was introduced.
    let label = if tag == "ro" { "readonly" } else { tag };
    let password = scripts::sha_hex(format!("redcount-rest {label} user\0{token}").as_bytes());
    let mut setuser = redis::cmd("ACL");
    setuser.arg("SETUSER").arg(&user).arg("reset").arg("on").arg(format!(">{password}")).arg("~*").arg("&*");
    for rule in rules {
        setuser.arg(*rule);
    }
    setup.query(&setuser).await.map_err(|e| e.to_string())?;
    Ok((backend::Login { user, password }, setuser))
}

/// Loads `--tokens` into `state`, then again on every SIGHUP (a failed reload keeps the
/// tokens in force and says why; it never prints a token).
async fn scoped_tokens(
    state: &Arc<State>,
    config: &Config,
    path: std::path::PathBuf,
    settings: Vec<redis::Cmd>,
    wait: Option<redcount_cluster::ReplicaWait>,
    keeper: Arc<cluster_users::Keeper>,
) -> Result<(), String> {
    let (url, cluster, timeout) =
        (config.redis.clone(), config.cluster, Duration::from_millis(config.timeout_ms.max(1)));
    let (max_reply, per_token) = (config.max_response_bytes.max(1024), config.redis_connections.clamp(1, 16));
    let mut reserved = vec![config.token.clone()];
    reserved.extend(config.readonly_token.clone());
    let load = {
        let state = state.clone();
        move |logins: HashMap<String, (String, String)>| {
            let (state, url, path, settings, reserved, keeper) =
                (state.clone(), url.clone(), path.clone(), settings.clone(), reserved.clone(), keeper.clone());
            async move {
                let connect = |login: backend::Login| {
                    // Before each new connection the front's rules go on the user again: a
                    // restarted Redis may have made it from its own files without them.
                    let mut on_connect = settings.clone();
                    on_connect.push(keeper.root_rules(&login.user));
                    let (url, state) = (url.clone(), state.clone());
                    async move {
                        let b =
                            backend::Backend::connect(&url, cluster, timeout, Some(&login), per_token, max_reply, wait)
                                .await
                                .map_err(|e| e.to_string())?;
                        b.on_connect(on_connect, Some(&state.killer));
                        b.charge_replies(&state.response_budget);
                        Ok(b)
                    }
                };
                let previous = state.scoped.read().unwrap_or_else(|e| e.into_inner()).clone();
                let reserved: Vec<&str> = reserved.iter().map(String::as_str).collect();
                let (scoped, logins) = tokens::load(&path, &reserved, &previous, &logins, &keeper, connect).await?;
                let n = scoped.len();
                tokens::revoke_dropped(&previous, &scoped);
                *state.scoped.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(scoped);
                Ok::<_, String>((n, logins))
            }
        }
    };
    let (n, mut logins) = load(HashMap::new()).await?;
    tracing::info!("{n} tokens from --tokens");
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        while hup.recv().await.is_some() {
            match load(logins.clone()).await {
                Ok((n, new)) => {
                    logins = new;
                    tracing::info!("SIGHUP: {n} tokens from --tokens");
                }
                Err(e) => tracing::error!("SIGHUP: --tokens not reloaded, the tokens in force stay: {e}"),
            }
        }
    });
    Ok(())
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
