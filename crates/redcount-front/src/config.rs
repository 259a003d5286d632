//! The front's flags: every one has an environment variable.

use std::net::SocketAddr;
use std::time::Duration;

use clap::Parser;
use redcount_http::log;

use crate::backend;

/// What `--help` says of the servers behind the front (which are tested, and what differs) and
/// of trusting a private CA.
const SERVERS: &str = "\
Servers: tested with Redis 7.0 and Valkey 8.1 (also as a Cluster). The front reads what a \
command may do from the server's own COMMAND table, so each server's commands are treated \
by their flags. On Valkey, for a client: SCRIPT SHOW gives the full token the source of any \
cached script (read-only and --tokens tokens are refused it); \
a blocking command inside a script (BLPOP...) answers at once instead of being refused; \
COMMANDLOG is refused as administrative, like SLOWLOG; and error texts differ after their \
first word (NOSCRIPT, an ACL refusal inside a script), which clients should read alone.

Settings the front makes on Redis (at start, on every new connection, on every Cluster node; \
they apply to every client of that Redis): busy-reply-threshold (--script-timeout-ms), \
client-output-buffer-limit normal (--redis-output-limit-bytes), and sanitize-dump-payload \
clients where it is no (Redis's default): Redis then checks every client's RESTORE payload, \
refusing a corrupt one instead of crashing when its key is next read.

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
    /// More tokens, one per app (a JSON array of `{"token", "user", "password", "readonly"}`;
    /// see docs/front.md). Reloaded on SIGHUP.
    ///
    /// Each token logs in to Redis as a user the front derives from the file's ACL user
    /// (`redcount-rest-t-<user>-…`: its passwords, key and channel patterns, commands and
    /// selectors, as ACL GETUSER shows them), with the front's own rules added, since key
    /// patterns (`~app1:*`) do not stop commands that name no key. Derived at start, on SIGHUP,
    /// and within 2 s of any change to either user or of a node's restart (on every Cluster
    /// node); ACL DRYRUN then checks that Redis refuses them: every command or subcommand that
    /// names no key yet reaches every key or the server (Redis's COMMAND table: reads and
    /// writes of @keyspace, @dangerous, administration: KEYS, SCAN, RANDOMKEY, DBSIZE,
    /// FLUSHALL, FLUSHDB, SWAPDB, INFO, CONFIG…), that replaces every app's functions
    /// (FUNCTION LOAD/FLUSH/DELETE/RESTORE), every subcommand of PUBSUB, FUNCTION, SCRIPT,
    /// MEMORY and CLUSTER but HELP, SCRIPT EXISTS/LOAD, MEMORY USAGE and the Cluster's topology
    /// (every app's channels, functions, running script, memory, keys of a slot), and SELECT,
    /// MOVE, COPY, MIGRATE (another database or host), RESTORE, RESTORE-ASKING (a crafted
    /// payload). So a file token may not run them as commands nor inside scripts, whatever its
    /// user allows, and nothing done to that user removes them. The user off, deleted or no
    /// longer accepting the file's password: within 2 s the front deletes the derived user
    /// (closing its connections) and answers the token 503 saying why, until it is back. The
    /// --redis URL's user needs the right to run ACL SETUSER, GETUSER, DELUSER and DRYRUN;
    /// where the front cannot derive a user it refuses to start (on SIGHUP: keeps the tokens in
    /// force; later: refuses that user's tokens with 503 until it can).
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

impl Config {
    /// The configuration of the command line `args` (the program's name first), the
    /// environment filling in what they leave out, as the binary reads its own.
    pub fn from_args<I, T>(args: I) -> Result<Config, String>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        Config::try_parse_from(args).map_err(|e| e.to_string())
    }

    /// `--timeout-ms`.
    pub(crate) fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms.max(1))
    }

    /// `--script-timeout-ms`.
    pub(crate) fn script_timeout(&self) -> Duration {
        Duration::from_millis(self.script_timeout_ms.max(1))
    }

    /// The bounds of serving: connection caps and timeouts.
    pub fn limits(&self) -> redcount_http::Limits {
        redcount_http::Limits {
            max_connections: self.max_connections,
            max_per_ip: self.max_connections_per_ip,
            header_timeout: Duration::from_millis(self.header_timeout_ms.max(1)),
            stall_timeout: self.timeout().max(Duration::from_secs(1)),
            // The longest a request takes: its body and its Redis time (--timeout-ms each), and
            // a second to write the answer.
            drain_timeout: (2 * self.timeout() + Duration::from_secs(1)).max(Duration::from_secs(5)),
        }
    }
}

/// `--wait-replicas` and `--wait-replicas-ms`, checked: the wait must end inside the request's
/// own time limit.
pub(crate) fn replica_wait(config: &Config) -> Result<Option<redcount_cluster::ReplicaWait>, String> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_serving_flags_are_the_servers_limits() {
        let limits = |extra: &[&str]| {
            let args = ["redcount-rest", "--token", "a-token-for-the-test"].iter().chain(extra);
            let l = Config::from_args(args).unwrap().limits();
            (l.max_connections, l.max_per_ip, l.header_timeout, l.stall_timeout)
        };
        let (ms, s) = (Duration::from_millis, Duration::from_secs);
        assert_eq!(limits(&[]), (10_000, 1_000, s(10), s(5)), "the defaults");
        let flags = ["--max-connections", "20", "--max-connections-per-ip", "10", "--header-timeout-ms", "1500"];
        assert_eq!(limits(&flags), (20, 10, ms(1500), s(5)));
        // A slow reader is cut off at the request timeout, never under a second.
        assert_eq!(limits(&["--timeout-ms", "60000"]).3, s(60));
        assert_eq!(limits(&["--timeout-ms", "200"]).3, s(1));
    }
}
