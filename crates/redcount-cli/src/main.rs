//! `redcount`: the native command line.
use clap::{Parser, Subcommand};

/// redcount: atomic counting primitives for Redis, natively.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// List the Lua scripts with the SHA-1 that EVALSHA uses.
    Scripts,
    /// Load every script into a Redis script cache (SCRIPT LOAD), checking each SHA-1.
    Load {
        /// Redis URL.
        #[arg(long, env = "REDIS_URL", default_value = "redis://127.0.0.1:6379")]
        redis: String,
    },
    /// Serve the HTTP API and the demo page (the worker's routes, natively).
    #[command(after_help = "TLS: rediss:// (Redis over TLS) and an https:// --rest-url trust the system's root \
                      certificates. To trust a private CA instead, set SSL_CERT_FILE to a PEM file of it (it \
                      replaces the system's roots): SSL_CERT_FILE=/etc/redcount/redis-ca.pem redcount serve \
                      --redis rediss://…")]
    Serve(Box<ServeArgs>),
    /// Copy red-packet claims from Redis into SQLite, exactly once (safe to kill and rerun).
    Drain {
        /// Redis URL; with --cluster, a comma-separated list of seed nodes.
        #[arg(long, env = "REDIS_URL", default_value = "redis://127.0.0.1:6379")]
        redis: String,
        /// Treat --redis as Redis Cluster seed nodes: SCAN every master for grab logs, read
        /// each log from the master that serves it.
        #[arg(long, env = "REDCOUNT_CLUSTER")]
        cluster: bool,
        /// SQLite database file (created if missing).
        #[arg(long)]
        db: std::path::PathBuf,
        /// Packets to drain (repeatable); default: every packet with a claim log (SCAN).
        #[arg(long = "packet")]
        packets: Vec<String>,
        /// Claims per transaction.
        #[arg(long, default_value_t = redcount_cli::drain::DEFAULT_BATCH)]
        batch: i64,
        /// Keep draining until stopped (Ctrl-C / SIGTERM), polling every --interval-ms.
        #[arg(long)]
        follow: bool,
        /// Key namespace the packets live in (as `redcount serve --namespace`).
        #[arg(long, env = "REDCOUNT_NAMESPACE", default_value = redcount_core::keys::PREFIX)]
        namespace: String,
        /// Pause between passes with --follow.
        #[arg(long, default_value_t = 1_000)]
        interval_ms: u64,
    },
}

#[derive(clap::Args, Debug)]
struct ServeArgs {
    /// Address to listen on.
    #[arg(long, env = "REDCOUNT_LISTEN", default_value = "127.0.0.1:8788")]
    listen: std::net::SocketAddr,
    /// Backend: an Upstash-compatible REST front (Upstash, redcount-rest).
    #[arg(long, env = "REDCOUNT_REST_URL", conflicts_with = "redis")]
    rest_url: Option<String>,
    /// Token of the REST front.
    #[arg(long, env = "REDCOUNT_REST_TOKEN", hide_env_values = true)]
    rest_token: Option<String>,
    /// Backend: Redis itself, over RESP (redis://host:port/db); with --cluster, a
    /// comma-separated list of Redis Cluster seed nodes.
    #[arg(long, env = "REDIS_URL")]
    redis: Option<String>,
    /// Treat --redis as Redis Cluster seed nodes (slot routing; MOVED/ASK followed and
    /// TRYAGAIN/CLUSTERDOWN waited out within --timeout-ms, a write never sent twice).
    #[arg(long, env = "REDCOUNT_CLUSTER")]
    cluster: bool,
    /// Policies: JSON, or @path of a JSON file (see wrangler.toml for the format).
    #[arg(long, env = "REDCOUNT_POLICIES")]
    policies: String,
    /// Admin token (at least 16 characters); without it admin actions are refused.
    #[arg(long, env = "REDCOUNT_ADMIN_TOKEN", hide_env_values = true)]
    admin_token: Option<String>,
    /// Secret red-packet ids are derived with from an Idempotency-Key (at least 16
    /// characters; default: the admin token). Give every shell of a deployment the same one.
    #[arg(long, env = "REDCOUNT_ID_SECRET", hide_env_values = true)]
    id_secret: Option<String>,
    /// Browser origins allowed to call the API (comma-separated).
    #[arg(long, env = "REDCOUNT_CORS_ORIGINS", default_value = "")]
    cors_origins: String,
    /// Key namespace: the first part of every key (letters, digits, `_`, `-`), so several
    /// deployments can share one Redis.
    #[arg(long, env = "REDCOUNT_NAMESPACE", default_value = redcount_core::keys::PREFIX)]
    namespace: String,
    /// Log level: error, info or debug (debug logs one line per request; never a token).
    #[arg(long, env = "REDCOUNT_LOG", default_value = "info")]
    log: redcount_http::log::Level,
    /// Log lines as text or as JSON objects.
    #[arg(long, env = "REDCOUNT_LOG_FORMAT", default_value = "text")]
    log_format: redcount_http::log::Format,
    /// Serve Prometheus metrics at `GET /metrics` on this address (off by default; keep it
    /// off the public network: it needs no token).
    #[arg(long, env = "REDCOUNT_METRICS_LISTEN")]
    metrics_listen: Option<std::net::SocketAddr>,
    /// Serve HTTPS with this certificate chain (PEM); needs --tls-key. Reloaded, with the
    /// key, on SIGHUP.
    #[arg(long, env = "REDCOUNT_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<std::path::PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(long, env = "REDCOUNT_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<std::path::PathBuf>,
    /// Directory of the demo page.
    #[arg(long, env = "REDCOUNT_WWW", default_value = "www")]
    www: std::path::PathBuf,
    /// Longest wait for one Redis or REST call (and for a request body), in ms.
    #[arg(long, env = "REDCOUNT_TIMEOUT_MS", default_value_t = 5_000)]
    timeout_ms: u64,
    /// With --redis: acknowledge writes of money (counters, red packets) only once this many
    /// replicas have them (`WAIT` on the same connection, right after the script; on their own
    /// connections). Fewer within --wait-replicas-ms: 503 with `"durable": false` (the write
    /// happened on the master and may be lost if it fails over). 0: off. Through a REST front,
    /// start the front with its own --wait-replicas.
    #[arg(long, env = "REDCOUNT_WAIT_REPLICAS", default_value_t = 0, conflicts_with = "rest_url")]
    wait_replicas: u32,
    /// How long a write of money waits for --wait-replicas, in ms (less than --timeout-ms).
    #[arg(long, env = "REDCOUNT_WAIT_REPLICAS_MS", default_value_t = 250)]
    wait_replicas_ms: u64,
    /// Client connections served at once; past it new ones get 503 and are closed.
    #[arg(long, env = "REDCOUNT_MAX_CONNECTIONS", default_value_t = 10_000)]
    max_connections: usize,
    /// Client connections served at once from one IP address (0: unbounded); past it new
    /// ones from that address get 503 and are closed.
    #[arg(long, env = "REDCOUNT_MAX_CONNECTIONS_PER_IP", default_value_t = 1_000)]
    max_connections_per_ip: usize,
    /// Start although Redis may evict keys (`maxmemory` set and `maxmemory-policy` other than
    /// `noeviction`): an evicted claim, quota window or idempotency record breaks redcount's
    /// promises, so by default `--redis` refuses such a Redis. (Red-packet grabs refuse a
    /// packet whose keys were evicted in part either way.)
    #[arg(long, env = "REDCOUNT_ALLOW_EVICTION")]
    allow_eviction: bool,
    /// Longest a client connection may take to send a complete request head, from its start
    /// or its previous response (so also the idle keep-alive time), in ms.
    #[arg(long, env = "REDCOUNT_HEADER_TIMEOUT_MS", default_value_t = 10_000)]
    header_timeout_ms: u64,
}

fn main() -> std::process::ExitCode {
    redcount::tls::install_crypto_provider();
    let cli = Cli::parse();
    // The server uses every core; the load generator stays on one thread (its figures were
    // measured that way, and it leaves the other core to what it measures).
    let runtime = match cli.command {
        Cmd::Serve(_) => tokio::runtime::Builder::new_multi_thread().enable_all().build(),
        _ => tokio::runtime::Builder::new_current_thread().enable_all().build(),
    };
    match runtime {
        Ok(rt) => rt.block_on(run(cli)),
        Err(e) => {
            eprintln!("redcount: cannot start the runtime: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> std::process::ExitCode {
    match cli.command {
        Cmd::Scripts => {
            for s in redcount_core::script::ALL {
                println!("{}  {}", s.sha1(), s.name());
            }
        }
        Cmd::Load { redis } => {
            let direct = match redcount::Direct::connect(&redis).await {
                Ok(d) => d,
                Err(e) => {
                    eprintln!("redcount: {e}");
                    return std::process::ExitCode::FAILURE;
                }
            };
            for s in redcount_core::script::ALL {
                let cmd = redcount_core::Command::new("SCRIPT").arg("LOAD").arg(s.source());
                match direct.send(&cmd).await {
                    Ok(redcount_core::Value::Bytes(sha)) if sha == s.sha1().as_bytes() => {
                        println!("loaded {}", s.name())
                    }
                    Ok(other) => {
                        eprintln!("redcount: {} loaded under an unexpected SHA: {other:?}", s.name());
                        return std::process::ExitCode::FAILURE;
                    }
                    Err(e) => {
                        eprintln!("redcount: loading {}: {e}", s.name());
                        return std::process::ExitCode::FAILURE;
                    }
                }
            }
        }
        Cmd::Drain { redis, cluster, db, packets, batch, follow, interval_ms, namespace } => {
            let redis = RedisTarget { urls: &redis, cluster };
            if let Err(e) = drain(redis, &db, packets, batch, follow, interval_ms, &namespace).await {
                eprintln!("redcount: drain: {e}");
                return std::process::ExitCode::FAILURE;
            }
        }
        Cmd::Serve(args) => {
            if let Err(e) = serve(*args).await {
                eprintln!("redcount: serve: {e}");
                return std::process::ExitCode::FAILURE;
            }
        }
    }
    std::process::ExitCode::SUCCESS
}

/// Where drain reads: one Redis, or a Redis Cluster through seed nodes (comma-separated).
struct RedisTarget<'a> {
    urls: &'a str,
    cluster: bool,
}

async fn drain(
    redis: RedisTarget<'_>,
    db: &std::path::Path,
    packets: Vec<String>,
    batch: i64,
    follow: bool,
    interval_ms: u64,
    namespace: &str,
) -> Result<(), redcount_cli::drain::Error> {
    use redcount_cli::drain;
    redcount_core::validate::range("batch", batch, 1, redcount_core::ops::redpacket::MAX_PAGE)?;
    for p in &packets {
        redcount_core::validate::id("packet", p)?;
    }
    let namespace = redcount_core::keys::Namespace::new(namespace)?;
    let direct = &redcount::Direct::connect_to(redis.urls, redis.cluster, std::time::Duration::from_secs(5)).await?;
    let mut store = drain::Store::open(db, &namespace)?;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    if follow {
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
            let term = async move {
                match term.as_mut() {
                    Some(t) => {
                        t.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::select! { _ = tokio::signal::ctrl_c() => {}, _ = term => {} }
            stop.store(true, std::sync::atomic::Ordering::SeqCst);
        });
    }
    let mut total = 0u64;
    loop {
        let ids = if packets.is_empty() { drain::packets(direct, &namespace).await? } else { packets.clone() };
        let mut pass = 0u64;
        for id in &ids {
            let n = drain::drain_packet(direct, &namespace, &mut store, id, batch).await?;
            if n > 0 {
                let (name, count, sum) = store.generations(id)?.pop().unwrap_or_default();
                eprintln!("drain: packet {name}: +{n} claims ({count} stored, {sum} cents)");
            }
            pass += n;
        }
        total += pass;
        if !follow || stop.load(std::sync::atomic::Ordering::SeqCst) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(interval_ms)).await;
        if stop.load(std::sync::atomic::Ordering::SeqCst) {
            break;
        }
    }
    eprintln!("drain: {total} claims copied");
    Ok(())
}

async fn serve(args: ServeArgs) -> Result<(), String> {
    use redcount_cli::serve::Backend;
    redcount_http::log::init(args.log, args.log_format);
    redcount_http::serve_metrics(args.metrics_listen)?;
    let policies = match args.policies.strip_prefix('@') {
        Some(path) => std::fs::read_to_string(path).map_err(|e| format!("--policies @{path}: {e}"))?,
        None => args.policies.clone(),
    };
    let var = |name: &str| -> Option<String> {
        match name {
            "REDCOUNT_REST_URL" => args.rest_url.clone(),
            "REDCOUNT_REST_TOKEN" => args.rest_token.clone(),
            "REDCOUNT_ADMIN_TOKEN" => args.admin_token.clone(),
            "REDCOUNT_ID_SECRET" => args.id_secret.clone(),
            "REDCOUNT_POLICIES" => Some(policies.clone()),
            "REDCOUNT_CORS_ORIGINS" => Some(args.cors_origins.clone()),
            "REDCOUNT_NAMESPACE" => Some(args.namespace.clone()),
            _ => None,
        }
    };
    let config = redcount_api::Config::from_env(var).map_err(|e| e.to_string())?;
    let timeout = timeout(&args);
    if args.cluster && (args.redis.is_none() || args.rest_url.is_some()) {
        return Err("--cluster is for --redis: give --redis with the Redis Cluster's seed nodes".into());
    }
    let (backend, what) = match (&args.rest_url, &args.redis) {
        (Some(url), _) => {
            let target = redcount_api::RestTarget::from_env(var).map_err(|e| e.to_string())?;
            let r = redcount::Rest::new(&target.url, &target.token, timeout).map_err(|e| e.to_string())?;
            (Backend::Rest(r), format!("REST front {url}"))
        }
        (None, Some(url)) => {
            let what = if args.cluster { "the Redis Cluster" } else { "Redis" };
            let d = match args.wait_replicas {
                0 => redcount::Direct::connect_to(url, args.cluster, timeout).await,
                n => {
                    let wait = redcount::direct::ReplicaWait {
                        replicas: n,
                        timeout: std::time::Duration::from_millis(args.wait_replicas_ms),
                    };
                    redcount::Direct::connect_waiting(url, args.cluster, timeout, wait).await
                }
            }
            .map_err(|e| format!("cannot reach {what}: {e}"))?;
            if let Some(risk) = d.eviction_risk().await {
                if !args.allow_eviction {
                    return Err(format!(
                        "{risk}; run Redis with maxmemory-policy noeviction (at maxmemory redcount's writes then fail closed with 507), or pass --allow-eviction"
                    ));
                }
                tracing::warn!("{risk} (--allow-eviction)");
            }
            let what = if args.cluster { "Redis Cluster over RESP" } else { "Redis over RESP" };
            (Backend::Direct(d), String::from(what))
        }
        (None, None) => return Err("give a backend: --rest-url (with --rest-token) or --redis".into()),
    };
    if !args.www.join("index.html").exists() {
        return Err(format!("--www {}: no index.html there", args.www.display()));
    }
    let tls = redcount_http::Tls::from_flags(args.tls_cert.as_deref(), args.tls_key.as_deref())?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    tracing::info!("serving {scheme}://{} with {what}", listener.local_addr().map_err(|e| e.to_string())?);
    let shutdown = async {
        let term = async {
            if let Ok(mut s) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                s.recv().await;
            }
        };
        tokio::select! { _ = tokio::signal::ctrl_c() => {}, _ = term => {} }
    };
    let limits = limits(&args);
    redcount_cli::serve::serve(listener, config, backend, args.www, limits, timeout, tls, shutdown)
        .await
        .map_err(|e| e.to_string())
}

/// `--timeout-ms`: the most a call to Redis, and a request's body, may take.
fn timeout(args: &ServeArgs) -> std::time::Duration {
    std::time::Duration::from_millis(args.timeout_ms.max(1))
}

/// The bounds `serve`'s flags set: connection caps and timeouts (`--timeout-ms` is also the
/// longest a write to the client may stall, never under a second).
fn limits(args: &ServeArgs) -> redcount_http::Limits {
    let timeout = timeout(args);
    redcount_http::Limits {
        max_connections: args.max_connections,
        max_per_ip: args.max_connections_per_ip,
        header_timeout: std::time::Duration::from_millis(args.header_timeout_ms.max(1)),
        stall_timeout: timeout.max(std::time::Duration::from_secs(1)),
        // The longest a request takes: its body (--timeout-ms), a wait for a borrow under way,
        // two calls (EVAL after NOSCRIPT); and a second to write the answer.
        drain_timeout: (3 * timeout + redcount_cli::serve::MOST_WAIT + std::time::Duration::from_secs(1))
            .max(std::time::Duration::from_secs(5)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_serving_flags_are_the_servers_limits() {
        let limits = |extra: &[&str]| {
            let args = ["redcount", "serve", "--policies", "{}"].iter().chain(extra);
            let Cmd::Serve(serve) = Cli::try_parse_from(args).unwrap().command else { panic!("not serve") };
            let l = super::limits(&serve);
            (l.max_connections, l.max_per_ip, l.header_timeout, l.stall_timeout, super::timeout(&serve))
        };
        let (ms, s) = (std::time::Duration::from_millis, std::time::Duration::from_secs);
        assert_eq!(limits(&[]), (10_000, 1_000, s(10), s(5), s(5)), "the defaults");
        let flags = ["--max-connections", "20", "--max-connections-per-ip", "10", "--header-timeout-ms", "1500"];
        assert_eq!(limits(&flags), (20, 10, ms(1500), s(5), s(5)));
        assert_eq!(limits(&["--timeout-ms", "60000"]).3, s(60));
        // A body trickled past --timeout-ms is cut off (408: app_routes' body_that_never_arrives_is_408).
        assert_eq!(limits(&["--timeout-ms", "800"]).4, ms(800));
        assert_eq!(limits(&["--timeout-ms", "200"]).3, s(1));
    }
}
