//! Test support: real servers started on free loopback ports, stopped on drop (the process
//! handling itself is `redcount-procs`, shared with `cargo xtask`).

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

pub use redcount_procs::{Proc, free_port, scratch_dir};

mod front;
pub use front::{Front, SharedDb, shared_redis};

/// A `redis-server` of our own, on a free port, with no persistence unless asked.
#[derive(Debug)]
pub struct RedisServer {
    child: Option<Proc>,
    port: u16,
    dir: PathBuf,
    args: Vec<String>,
}

impl RedisServer {
    /// Starts a fresh server (no RDB, no AOF).
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts a server with extra `redis-server` arguments (e.g. `["--appendonly", "yes"]`).
    pub fn start_with(extra: &[&str]) -> Self {
        let mut s = RedisServer {
            child: None,
            port: free_port(),
            dir: scratch_dir("redis"),
            args: extra.iter().map(|s| s.to_string()).collect(),
        };
        // A port free a moment ago can be taken before Redis binds it, and a cluster node
        // also binds port + 10,000 (its bus), which nothing reserved: on a busy machine a
        // start failed that way ("exited before listening"). Another port then, a few times.
        let cluster = s.args.iter().any(|a| a == "--cluster-enabled");
        for attempt in 1.. {
            if cluster {
                while s.port > 55_535 || std::net::TcpListener::bind(("127.0.0.1", s.port + 10_000)).is_err() {
                    s.port = free_port();
                }
            }
            match s.try_spawn_only() {
                Ok(()) => break,
                Err(e) if attempt < 4 => {
                    eprintln!("redis-server on port {}: {e}; trying another port", s.port);
                    s.port = free_port();
                }
                Err(e) => panic!("{e}"),
            }
        }
        s.wait_ping();
        s
    }

    fn spawn(&mut self) {
        self.spawn_only();
        self.wait_ping();
    }

    /// Accepting connections is not enough: waits until it answers PING.
    fn wait_ping(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        let client = redis::Client::open(self.url()).unwrap();
        loop {
            if let Ok(mut c) = client.get_connection()
                && redis::cmd("PING").query::<String>(&mut c).is_ok()
            {
                return;
            }
            assert!(Instant::now() < deadline, "redis-server on port {} did not answer PING", self.port);
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts the process and waits for its port only (it may still be loading its data).
    fn spawn_only(&mut self) {
        self.try_spawn_only().unwrap();
    }

    fn try_spawn_only(&mut self) -> Result<(), String> {
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        let mut cmd = redcount_procs::redis_command(self.port, &self.dir, &args);
        let mut child = Proc::spawn("redis-server", &mut cmd)
            .unwrap_or_else(|e| panic!("{e} (run `cargo xtask test`, which installs it)"));
        redcount_procs::wait_port(self.port, Duration::from_secs(10), &mut child)?;
        self.child = Some(child);
        Ok(())
    }

    /// Its URL.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A plain synchronous connection, for setting up and inspecting state.
    pub fn conn(&self) -> redis::Connection {
        redis::Client::open(self.url()).unwrap().get_connection().expect("connect to test redis")
    }

    /// A core driver.
    pub async fn direct(&self) -> redcount::Direct {
        redcount::Direct::connect(&self.url()).await.expect("connect to test redis")
    }

    /// Kills the server with SIGKILL (no shutdown save).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill();
        }
    }

    /// Starts it again on the same port, data dir and arguments.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Starts it again like [`restart`](Self::restart), returning as soon as it accepts
    /// connections: while it loads its data it answers `LOADING` to every command.
    pub fn restart_loading(&mut self) {
        self.kill();
        self.spawn_only();
    }

    /// Its process id (INFO server).
    pub fn pid(&self) -> u32 {
        let info: String = redis::cmd("INFO").arg("server").query(&mut self.conn()).unwrap();
        info.lines().find_map(|l| l.strip_prefix("process_id:")).unwrap().trim().parse().unwrap()
    }

    /// Calls of `command` (e.g. "evalsha") since start, from INFO commandstats.
    pub fn calls(&self, command: &str) -> u64 {
        let info: String = redis::cmd("INFO").arg("commandstats").query(&mut self.conn()).unwrap();
        let needle = format!("cmdstat_{}:calls=", command.to_lowercase());
        info.lines()
            .find_map(|l| l.strip_prefix(&needle))
            .and_then(|rest| rest.split(',').next())
            .map(|n| n.parse().unwrap())
            .unwrap_or(0)
    }

    /// Calls of every command together (INFO commandstats), less the INFO calls themselves.
    pub fn total_calls(&self) -> u64 {
        let info: String = redis::cmd("INFO").arg("commandstats").query(&mut self.conn()).unwrap();
        // INFO (ours), CLUSTER (a cluster client refreshing its slot map), PING (health
        // checks), SCRIPT/FUNCTION KILL (the REST front's script watchdog polls with them) and
        // CLIENT SETINFO (redis-rs names itself on every new connection; counted where the
        // server has it: Valkey, Redis 7.2+) and ACL GETUSER (the front checks its users every
        // 2 s) are not traffic of the requests under test.
        info.lines()
            .filter(|l| {
                l.starts_with("cmdstat_")
                    && !l.starts_with("cmdstat_info:")
                    && !l.starts_with("cmdstat_cluster")
                    && !l.starts_with("cmdstat_ping:")
                    && !l.starts_with("cmdstat_script|kill:")
                    && !l.starts_with("cmdstat_function|kill:")
                    && !l.starts_with("cmdstat_client|setinfo:")
                    && !l.starts_with("cmdstat_acl|getuser:")
            })
            .filter_map(|l| l.split("calls=").nth(1))
            .filter_map(|r| r.split(',').next())
            .map(|n| n.parse::<u64>().unwrap())
            .sum()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A process stopped with SIGSTOP; SIGCONT on drop, so a failed assertion leaves none stopped.
#[derive(Debug)]
pub struct Stopped(u32);

impl Stopped {
    /// Stops process `pid`.
    pub fn stop(pid: u32) -> Self {
        assert!(Command::new("kill").args(["-STOP", &pid.to_string()]).status().unwrap().success());
        Stopped(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["-CONT", &self.0.to_string()]).status();
    }
}

/// Waits until something accepts connections on `port`.
pub fn wait_for_port(port: u16, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "nothing listens on port {port} after {timeout:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A random id for test objects, unique across tests sharing a server.
pub fn uid(tag: &str) -> String {
    format!("{tag}-{:08x}", rand::random::<u32>())
}

/// Where the workspace's binaries are: `REDCOUNT_BIN_DIR` (set by `cargo xtask test`, which
/// builds them first), else the target dir this test binary runs from.
pub fn bin(name: &str) -> PathBuf {
    let path = bin_dir().join(name);
    assert!(path.exists(), "{} is missing: run `cargo xtask test` (it builds the binaries first)", path.display());
    path
}

/// The directory of [`bin`].
fn bin_dir() -> PathBuf {
    std::env::var_os("REDCOUNT_BIN_DIR").map(PathBuf::from).unwrap_or_else(|| {
        // target/debug/deps/it-xxxx -> target/debug
        let exe = std::env::current_exe().unwrap();
        exe.parent().and_then(|p| p.parent()).unwrap().to_path_buf()
    })
}

/// The workspace root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// A random secret for a test run.
pub fn secret(tag: &str) -> String {
    redcount_procs::secret(tag)
}

/// The code of an error answer, `{"error": "NOPERM …"}`: its message's first word, as Redis
/// wrote it and the front passes it on (`None` for an answer that is not an error).
pub fn error_code(answer: &Value) -> Option<&str> {
    answer["error"].as_str()?.split(' ').next()
}

/// Whether a key or a string anywhere in a JSON answer holds `needle`: how a test shows that
/// data planted where the caller may not reach did not leak into an answer, a result or an
/// error's message alike. Not for telling one error from another: compare a code or a field.
pub fn mentions(answer: &Value, needle: &str) -> bool {
    match answer {
        Value::String(s) => s.contains(needle),
        Value::Array(items) => items.iter().any(|v| mentions(v, needle)),
        Value::Object(fields) => fields.iter().any(|(k, v)| k.contains(needle) || mentions(v, needle)),
        Value::Null | Value::Bool(_) | Value::Number(_) => false,
    }
}

/// A running `redcount-rest` process.
#[derive(Debug)]
pub struct RestFront {
    child: Option<Proc>,
    redis_url: String,
    port: u16,
    /// Its full-access token.
    pub token: String,
    /// Its read-only token.
    pub readonly_token: String,
    log: PathBuf,
    args: Vec<String>,
    /// Extra environment (e.g. `SSL_CERT_FILE`).
    env: Vec<(String, String)>,
}

impl RestFront {
    /// Starts the front before `redis_url` (several URLs, comma-separated, with `cluster`).
    pub fn start(redis_url: &str, cluster: bool) -> Self {
        Self::start_with(redis_url, cluster, &[])
    }

    /// Starts it with extra flags.
    pub fn start_with(redis_url: &str, cluster: bool, extra: &[&str]) -> Self {
        Self::start_env(redis_url, cluster, extra, &[])
    }

    /// Starts it with extra flags and environment; with `--tls-cert` it serves HTTPS.
    pub fn start_env(redis_url: &str, cluster: bool, extra: &[&str], env: &[(&str, &str)]) -> Self {
        let mut args = vec!["--log".to_string(), "debug".into()];
        if cluster {
            args.push("--cluster".into());
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut f = RestFront {
            child: None,
            redis_url: redis_url.to_string(),
            port: free_port(),
            token: secret("tok"),
            readonly_token: secret("ro"),
            log: scratch_dir("rest").join("rest.log"),
            args,
            env: env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        };
        f.spawn();
        f
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().and_then(Proc::id).expect("running")
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&self.log).unwrap();
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        bin("redcount-rest"); // says how to build it when it is missing
        let mut cmd = redcount_procs::rest_front_command(&bin_dir(), self.port, &self.redis_url, &args);
        cmd.env("REDCOUNT_REST_TOKEN", &self.token)
            .env("REDCOUNT_REST_READONLY_TOKEN", &self.readonly_token)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .stderr(log);
        let mut child = Proc::spawn("redcount-rest", &mut cmd).unwrap();
        redcount_procs::wait_port(self.port, Duration::from_secs(15), &mut child).unwrap();
        self.child = Some(child);
    }

    /// Its base URL (https with `--tls-cert`, named `localhost` as its certificate is).
    pub fn url(&self) -> String {
        if self.args.iter().any(|a| a == "--tls-cert") {
            return format!("https://localhost:{}", self.port);
        }
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Everything it logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Kills it (SIGKILL).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill();
        }
    }

    /// Its peak resident memory so far (VmHWM), in KiB.
    pub fn peak_rss_kib(&self) -> u64 {
        peak_rss_kib(self.child.as_ref().and_then(Proc::id).expect("running"))
    }

    /// Starts it again on the same port with the same tokens.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }
}

impl Drop for RestFront {
    fn drop(&mut self) {
        // A fast stop: nothing of the front's outlives it.
        self.kill();
    }
}

/// A local Redis Cluster: `masters` primaries on loopback, joined with `redis-cli --cluster create`.
#[derive(Debug)]
pub struct RedisCluster {
    /// The nodes.
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts and joins the cluster, waiting until every slot is served.
    pub fn start(masters: usize) -> Self {
        Self::start_with(masters, &[])
    }

    /// Starts and joins the cluster, each node with extra `redis-server` arguments.
    pub fn start_with(masters: usize, extra: &[&str]) -> Self {
        Self::start_nodes(masters, 0, extra)
    }

    /// Starts and joins `masters` masters with one replica each (`nodes` lists them as
    /// `redis-cli --cluster create` chose their roles: see `CLUSTER NODES`).
    pub fn start_with_replicas(masters: usize) -> Self {
        Self::start_nodes(masters, 1, &[])
    }

    fn start_nodes(masters: usize, replicas: usize, extra: &[&str]) -> Self {
        let args: Vec<&str> = redcount_procs::CLUSTER_NODE.into_iter().chain(extra.iter().copied()).collect();
        let nodes: Vec<RedisServer> = (0..masters * (1 + replicas)).map(|_| RedisServer::start_with(&args)).collect();
        let ports: Vec<u16> = nodes.iter().map(RedisServer::port).collect();
        let replicas = replicas.to_string();
        redcount_procs::cluster_create_with(&ports, &["--cluster-replicas", &replicas]).unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        for n in &nodes {
            loop {
                let info: String = redis::cmd("CLUSTER").arg("INFO").query(&mut n.conn()).unwrap();
                if info.contains("cluster_state:ok") {
                    break;
                }
                assert!(Instant::now() < deadline, "cluster did not become ok");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        // Replicas in sync, so that one can take its master's place.
        for n in &nodes {
            loop {
                let info: String = redis::cmd("INFO").arg("replication").query(&mut n.conn()).unwrap();
                if info.contains("role:master") || info.contains("master_link_status:up") {
                    break;
                }
                assert!(Instant::now() < deadline, "a replica did not sync");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        RedisCluster { nodes }
    }

    /// A cluster connection (follows MOVED), for reading what the front wrote.
    pub fn conn(&self) -> redis::cluster::ClusterConnection {
        let seeds: Vec<String> = self.nodes.iter().map(|n| n.url()).collect();
        redis::cluster::ClusterClient::new(seeds).unwrap().get_connection().unwrap()
    }

    /// The cluster id of node `i` (CLUSTER MYID).
    pub fn node_id(&self, i: usize) -> String {
        redis::cmd("CLUSTER").arg("MYID").query(&mut self.nodes[i].conn()).unwrap()
    }

    /// The index of the node that holds keys of `slot`, if any does.
    pub fn holder_of(&self, slot: i64) -> Option<usize> {
        self.nodes.iter().position(|n| {
            let count: i64 = redis::cmd("CLUSTER").arg("COUNTKEYSINSLOT").arg(slot).query(&mut n.conn()).unwrap();
            count > 0
        })
    }

    /// Moves `slot` from node `from` to node `to` as `redis-cli --cluster reshard` does:
    /// IMPORTING / MIGRATING, MIGRATE one key at a time with pauses (so traffic meets the
    /// slot split over two nodes: ASK, TRYAGAIN), then NODE everywhere. Returns when the
    /// first key moved.
    pub fn migrate_slot(&self, slot: i64, from: usize, to: usize) -> Instant {
        self.begin_migration(slot, from, to);
        let started = Instant::now();
        loop {
            let keys: Vec<String> = redis::cmd("CLUSTER")
                .arg("GETKEYSINSLOT")
                .arg(slot)
                .arg(1)
                .query(&mut self.nodes[from].conn())
                .unwrap();
            if keys.is_empty() {
                break;
            }
            self.move_keys(from, to, &keys);
            std::thread::sleep(Duration::from_millis(30));
        }
        self.end_migration(slot, to);
        started
    }

    /// Marks `slot` as leaving node `from` for node `to` (IMPORTING on `to`, MIGRATING on
    /// `from`): from then on `from` answers ASK for its keys that have left.
    pub fn begin_migration(&self, slot: i64, from: usize, to: usize) {
        let (src, dst) = (&self.nodes[from], &self.nodes[to]);
        let (src_id, dst_id) = (self.node_id(from), self.node_id(to));
        redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(slot)
            .arg("IMPORTING")
            .arg(&src_id)
            .query::<()>(&mut dst.conn())
            .unwrap();
        redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(slot)
            .arg("MIGRATING")
            .arg(&dst_id)
            .query::<()>(&mut src.conn())
            .unwrap();
    }

    /// Moves `keys` (of a slot in migration) from node `from` to node `to` (MIGRATE).
    pub fn move_keys(&self, from: usize, to: usize, keys: &[String]) {
        redis::cmd("MIGRATE")
            .arg("127.0.0.1")
            .arg(self.nodes[to].port())
            .arg("")
            .arg(0)
            .arg(5000)
            .arg("KEYS")
            .arg(keys)
            .query::<()>(&mut self.nodes[from].conn())
            .unwrap();
    }

    /// Hands `slot` to node `to` on every node (SETSLOT NODE): the migration is over.
    pub fn end_migration(&self, slot: i64, to: usize) {
        let dst_id = self.node_id(to);
        for n in &self.nodes {
            redis::cmd("CLUSTER").arg("SETSLOT").arg(slot).arg("NODE").arg(&dst_id).query::<()>(&mut n.conn()).unwrap();
        }
    }

    /// Seed URLs, comma-separated.
    pub fn urls(&self) -> String {
        self.nodes.iter().map(|n| n.url()).collect::<Vec<_>>().join(",")
    }
}

/// Policies the worker tests run with (public limits small enough to test both sides).
pub const TEST_POLICIES: &str = r#"{
  "daily-prize":  { "kind": "quota", "algorithm": "fixed", "limit": 2, "window_ms": 86400000 },
  "burst":        { "kind": "quota", "algorithm": "sliding", "limit": 5, "window_ms": 10000 },
  "calls-per-hour":   { "kind": "quota", "algorithm": "gcra", "rate": 100, "period_ms": 3600000, "burst": 100 },
  "calls-per-minute": { "kind": "quota", "algorithm": "sliding", "limit": 10, "window_ms": 60000 },
  "device-slots": { "kind": "semaphore", "limit": 2, "lease_ms": 300000 },
  "short-slots":  { "kind": "semaphore", "limit": 1, "lease_ms": 1000 },
  "running-jobs": { "kind": "counter", "min": 0, "storage": "hash" },
  "signup-bonus": { "kind": "claim", "window_ms": 86400000 },
  "demo-packets": { "kind": "redpackets", "max_shares": 500, "max_total_cents": 1000000, "ttl_ms": 3600000 },
  "inbox":        { "kind": "inbox", "ttl_ms": 604800000, "max_len": 100, "max_age_s": 604800 }
}"#;

/// A client of the HTTP API of the worker or `redcount serve`.
#[derive(Debug)]
pub struct Api {
    /// The HTTP client.
    pub http: reqwest::Client,
    /// The server's base URL.
    pub base: String,
    /// The admin token, sent when a call asks for it.
    pub admin: String,
}

/// An answer: status, headers and the JSON body (a string when not JSON, null when empty).
#[derive(Debug)]
pub struct Reply {
    /// The HTTP status.
    pub status: u16,
    /// The response headers.
    pub headers: reqwest::header::HeaderMap,
    /// The body.
    pub json: Value,
}

impl Reply {
    /// The status and the body.
    pub fn parts(self) -> (u16, Value) {
        (self.status, self.json)
    }
}

impl Api {
    /// A client of `base` (a pool large enough for storms, calls bounded at 60 s).
    pub fn new(base: String, admin: &str) -> Self {
        let http = http_builder().pool_max_idle_per_host(64).timeout(Duration::from_secs(60)).build().unwrap();
        Api { http, base, admin: admin.to_string() }
    }

    /// Sends a request (with the admin token when `admin`).
    pub async fn call(&self, method: &str, path: &str, body: Option<&str>, admin: bool) -> Reply {
        let mut r = self.http.request(method.parse().unwrap(), format!("{}{path}", self.base));
        if let Some(b) = body {
            r = r.header("Content-Type", "application/json").body(b.to_string());
        }
        if admin {
            r = r.bearer_auth(&self.admin);
        }
        let resp = r.send().await.unwrap();
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let text = resp.text().await.unwrap();
        let json =
            if text.is_empty() { Value::Null } else { serde_json::from_str(&text).unwrap_or(Value::String(text)) };
        Reply { status, headers, json }
    }
    /// GET without a token.
    pub async fn get(&self, path: &str) -> Reply {
        self.call("GET", path, None, false).await
    }
    /// POST without a token.
    pub async fn post(&self, path: &str, body: &str) -> Reply {
        self.call("POST", path, Some(body), false).await
    }

    /// A request with an `Idempotency-Key`.
    pub async fn keyed(&self, method: &str, path: &str, body: &str, key: &str, admin: bool) -> (u16, Value) {
        let (status, json, _) = self.keyed_replayed(method, path, body, key, admin).await;
        (status, json)
    }

    /// [`Api::keyed`], and whether the response says it is a replay (`Idempotent-Replayed`).
    pub async fn keyed_replayed(
        &self,
        method: &str,
        path: &str,
        body: &str,
        key: &str,
        admin: bool,
    ) -> (u16, Value, bool) {
        let mut r =
            self.http.request(method.parse().unwrap(), format!("{}{path}", self.base)).header("Idempotency-Key", key);
        if !body.is_empty() {
            r = r.body(body.to_string());
        }
        if admin {
            r = r.bearer_auth(&self.admin);
        }
        let resp = r.send().await.unwrap();
        let status = resp.status().as_u16();
        let replayed = resp.headers().get("idempotent-replayed").is_some_and(|v| v == "true");
        (status, serde_json::from_str(&resp.text().await.unwrap()).unwrap_or(Value::Null), replayed)
    }

    /// Sends a request and hangs up without reading the answer: a client that timed out.
    pub async fn keyed_and_dropped(&self, method: &str, path: &str, body: &str, key: &str) {
        use tokio::io::AsyncWriteExt;
        let addr = self.base.trim_start_matches("http://");
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let req = format!(
            "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nIdempotency-Key: {key}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        s.write_all(req.as_bytes()).await.unwrap();
        s.flush().await.unwrap();
        drop(s);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// A TCP proxy before `redis_port` that, once armed, forwards the next script call (EVAL or
/// EVALSHA), lets Redis run it, and closes the client's connection before the reply reaches
/// it: a reply lost after the command left (as when Redis dies between its write and its
/// reply), without any limit involved. Returns its port and the arming flag.
pub async fn reply_losing_proxy(redis_port: u16) -> (u16, std::sync::Arc<std::sync::atomic::AtomicBool>) {
    use std::sync::atomic::Ordering;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let armed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = armed.clone();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            let armed = flag.clone();
            tokio::spawn(async move {
                let Ok(mut server) = tokio::net::TcpStream::connect(("127.0.0.1", redis_port)).await else { return };
                let (mut up, mut down) = (vec![0u8; 65536], vec![0u8; 65536]);
                loop {
                    tokio::select! {
                        n = client.read(&mut up) => {
                            let Ok(n @ 1..) = n else { return };
                            if server.write_all(&up[..n]).await.is_err() {
                                return;
                            }
                            let script = up[..n].windows(4).any(|w| w.eq_ignore_ascii_case(b"EVAL"));
                            if script && armed.swap(false, Ordering::SeqCst) {
                                // Redis runs it and answers; the answer goes nowhere.
                                let _ = server.read(&mut down).await;
                                return; // both connections close
                            }
                        }
                        n = server.read(&mut down) => {
                            let Ok(n @ 1..) = n else { return };
                            if client.write_all(&down[..n]).await.is_err() {
                                return;
                            }
                        }
                    }
                }
            });
        }
    });
    (port, armed)
}

/// A TCP proxy before a Redis port whose connections can be frozen: once frozen, the
/// connections open at that moment pass nothing either way (what their client sends is read
/// and dropped, Redis's answers are dropped), held open as a process that stopped answering
/// would hold them, while connections opened later pass as usual. It runs on a runtime of its
/// own, so it adds no task to the test's runtime.
#[derive(Debug)]
pub struct FreezingProxy {
    port: u16,
    /// The freeze flag of every connection opened so far (a frozen one stays frozen).
    conns: std::sync::Arc<std::sync::Mutex<Vec<std::sync::Arc<std::sync::atomic::AtomicBool>>>>,
    /// Connections whose client has not closed its side yet.
    open: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl FreezingProxy {
    /// Starts one before `redis_port`.
    pub fn start(redis_port: u16) -> Self {
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        use std::sync::{Arc, Mutex};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let conns: Arc<Mutex<Vec<Arc<AtomicBool>>>> = Arc::default();
        let open = Arc::new(AtomicUsize::new(0));
        let (list, live) = (conns.clone(), open.clone());
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                while let Ok((mut client, _)) = listener.accept().await {
                    let frozen = Arc::new(AtomicBool::new(false));
                    list.lock().unwrap().push(frozen.clone());
                    let live = live.clone();
                    live.fetch_add(1, Ordering::SeqCst);
                    tokio::spawn(async move {
                        if let Ok(mut server) = tokio::net::TcpStream::connect(("127.0.0.1", redis_port)).await {
                            let (mut up, mut down) = (vec![0u8; 65536], vec![0u8; 65536]);
                            loop {
                                tokio::select! {
                                    n = client.read(&mut up) => {
                                        let Ok(n @ 1..) = n else { break };
                                        if !frozen.load(Ordering::SeqCst) && server.write_all(&up[..n]).await.is_err() {
                                            break;
                                        }
                                    }
                                    n = server.read(&mut down) => {
                                        let Ok(n @ 1..) = n else { break };
                                        if !frozen.load(Ordering::SeqCst) && client.write_all(&down[..n]).await.is_err() {
                                            break;
                                        }
                                    }
                                }
                            }
                        }
                        live.fetch_sub(1, Ordering::SeqCst);
                    });
                }
            });
        });
        FreezingProxy { port, conns, open }
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Freezes every connection open now.
    pub fn freeze(&self) {
        for c in self.conns.lock().unwrap().iter() {
            c.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }

    /// Connections whose client has not closed them (frozen ones included).
    pub fn open(&self) -> usize {
        self.open.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// An HTTP client for tests. reqwest is built with rustls and no provider of its own (see
/// `redcount::tls`), so every client is made here, after the provider is installed.
pub fn http() -> reqwest::Client {
    http_builder().build().expect("an HTTP client")
}

/// [`http`], to configure first.
pub fn http_builder() -> reqwest::ClientBuilder {
    redcount::tls::install_crypto_provider();
    reqwest::Client::builder()
}

/// The real worker as it is uploaded (the bundle `wrangler deploy --dry-run` makes of what
/// `cargo xtask build-worker` built), served by workerd, the runtime `wrangler dev` runs, with
/// no local proxy in front: wrangler dev's proxy restarts its runtime on a loaded machine and
/// answers the requests in flight 503 "Your worker restarted mid-request" whether the worker
/// ran them or not (RELIABILITY.md), and takes seconds to start. Vars and secrets are text
/// bindings, `env.ASSETS` the `www/` directory (the Lua scripts the worker loads after a
/// `SCRIPT FLUSH`). The static page is not served here: Cloudflare's assets layer answers it
/// before the worker, as [`Wrangler`] shows.
#[derive(Debug)]
pub struct Workerd {
    child: Option<Proc>,
    port: u16,
    dir: PathBuf,
    log: PathBuf,
}

impl Workerd {
    /// Starts workerd with the worker and `vars`, and waits until the worker answers.
    pub fn start(vars: &[(&str, &str)]) -> Self {
        use redcount_procs::workerd::{self, Binding};
        let root = root();
        let mut worker = worker_bundle().clone();
        worker.bindings = vars.iter().map(|(k, v)| Binding::Text(k.to_string(), v.to_string())).collect();
        worker.bindings.push(Binding::Disk("ASSETS".into(), root.join("www")));
        let dir = scratch_dir("workerd");
        let log = dir.join("workerd.log");
        let port = free_port();
        let config = workerd::write(&dir.join("config"), &[(&worker, Some(port))]).unwrap();
        let mut cmd = workerd::command(&root, &config, Some(&log)).unwrap();
        // workerd's informational messages in the log too (`--verbose`), for a failing test to show.
        cmd.arg("--verbose");
        let child = Proc::spawn("workerd", &mut cmd).unwrap();
        let w = Workerd { child: Some(child), port, dir, log };
        assert!(wait_worker(port, Duration::from_secs(60)), "workerd did not serve the worker:\n{}", w.log());
        w
    }

    /// The worker's base URL.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// What workerd printed so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Workerd {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.stop(Duration::from_secs(5));
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The worker's bundle, made once per test process (the vars are bindings, not in it).
fn worker_bundle() -> &'static redcount_procs::workerd::Worker {
    static BUNDLE: std::sync::OnceLock<redcount_procs::workerd::Worker> = std::sync::OnceLock::new();
    BUNDLE.get_or_init(|| {
        let root = root();
        let main = root.join("crates/redcount-worker/build/index.js");
        assert!(main.exists(), "{} is missing: run `cargo xtask test` (it builds the worker first)", main.display());
        let wrangler = std::fs::read_to_string(root.join("wrangler.toml")).expect("wrangler.toml");
        let date = wrangler.lines().find(|l| l.starts_with("compatibility_date")).expect("a compatibility_date");
        // Left in the target directory for the process's lifetime: its modules are copied into
        // each workerd config.
        let dir = scratch_dir("worker-bundle");
        let toml = format!("name = \"redcount-test\"\nmain = \"{}\"\n{date}\nkeep_names = false\n", main.display());
        std::fs::write(dir.join("wrangler.toml"), toml).unwrap();
        redcount_procs::workerd::Worker::from_dir(&root, &dir, &dir.join("bundle")).unwrap()
    })
}

/// Whether the worker on `port` answers `GET /api/policies` (200, or 500 for a bad
/// configuration) within `timeout`.
fn wait_worker(port: u16, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) {
            use std::io::{Read, Write};
            let _ = s.set_read_timeout(Some(Duration::from_secs(60)));
            let _ = s.write_all(b"GET /api/policies HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
            let mut buf = String::new();
            let _ = s.read_to_string(&mut buf);
            if buf.starts_with("HTTP/1.1 200") || buf.starts_with("HTTP/1.1 500") {
                return true;
            }
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// The real worker (the wasm that `cargo xtask build-worker` built) under `wrangler dev`, as
/// `cargo xtask dev` runs it: its assets layer serves the page before the worker.
#[derive(Debug)]
pub struct Wrangler {
    child: Option<Proc>,
    port: u16,
    dir: PathBuf,
    log: PathBuf,
}

impl Wrangler {
    /// Starts wrangler dev with its own config directory (so `.dev.vars` is per test) and
    /// waits until the worker answers.
    pub fn start(vars: &[(&str, &str)]) -> Self {
        let root = root();
        let main = root.join("crates/redcount-worker/build/index.js");
        assert!(main.exists(), "{} is missing: run `cargo xtask test` (it builds the worker first)", main.display());
        assert!(
            root.join("node_modules/.bin/wrangler").exists(),
            "wrangler is missing: run `cargo xtask test` (it runs npm ci)"
        );
        let dir = scratch_dir("wrangler");
        // The one compatibility date, wrangler.toml's.
        let wrangler = std::fs::read_to_string(root.join("wrangler.toml")).expect("wrangler.toml");
        let date = wrangler.lines().find(|l| l.starts_with("compatibility_date")).expect("a compatibility_date");
        let mut toml = format!(
            "name = \"redcount-test\"\nmain = \"{}\"\n{date}\nkeep_names = false\n\n[assets]\ndirectory = \"{}\"\nbinding = \"ASSETS\"\n\n[vars]\n",
            main.display(),
            root.join("www").display()
        );
        let mut dev_vars = String::new();
        for (k, v) in vars {
            if *k == "REDCOUNT_POLICIES" || *k == "REDCOUNT_CORS_ORIGINS" {
                toml.push_str(&format!("{k} = '''\n{v}\n'''\n"));
            } else {
                dev_vars.push_str(&format!("{k}={v}\n"));
            }
        }
        std::fs::write(dir.join("wrangler.toml"), toml).unwrap();
        std::fs::write(dir.join(".dev.vars"), dev_vars).unwrap();
        let log = dir.join("wrangler.log");
        let mut w = Wrangler { child: None, port: 0, dir, log };
        // wrangler's boot has once hung after its banner (seen once in many runs, not
        // reproduced): give it one more try on fresh ports rather than fail the suite.
        for attempt in 1..=2 {
            w.spawn();
            if wait_worker(w.port, Duration::from_secs(90)) {
                return w;
            }
            eprintln!("wrangler dev attempt {attempt} did not serve within 90 s; its output:\n{}", w.log());
            w.stop();
        }
        panic!("wrangler dev did not serve the worker:\n{}", w.log());
    }

    fn spawn(&mut self) {
        self.port = free_port();
        let mut cmd = redcount_procs::wrangler_command(&root(), &self.dir, self.port).unwrap();
        self.child = Some(Proc::spawn("wrangler dev", &mut cmd).unwrap());
    }

    /// The worker's base URL.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// What wrangler printed so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Wrangler {
    /// Stops wrangler and workerd (the whole process group).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.stop(Duration::from_secs(5));
        }
    }
}

impl Drop for Wrangler {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A running `redcount serve` (the native shell of the HTTP API).
#[derive(Debug)]
pub struct NativeServer {
    child: Option<Proc>,
    port: u16,
    log: PathBuf,
}

impl NativeServer {
    /// Starts it with a backend: `--rest-url` (token in the environment) or `--redis`.
    pub fn start(backend: &[(&str, &str)], admin_token: &str, policies: &str) -> Self {
        Self::start_with(backend, admin_token, policies, &[])
    }

    /// Starts it with extra `redcount serve` flags.
    pub fn start_with(backend: &[(&str, &str)], admin_token: &str, policies: &str, extra: &[&str]) -> Self {
        let port = free_port();
        let log = scratch_dir("serve").join("serve.log");
        let out = std::fs::File::create(&log).unwrap();
        let mut cmd = Command::new(bin("redcount"));
        cmd.arg("serve")
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--www")
            .arg(root().join("www"))
            .env("REDCOUNT_POLICIES", policies)
            .env("REDCOUNT_ADMIN_TOKEN", admin_token)
            .env("REDCOUNT_CORS_ORIGINS", "http://allowed.example")
            .args(extra)
            .stdout(out.try_clone().unwrap())
            .stderr(out);
        for (k, v) in backend {
            cmd.env(k, v); // secrets through the environment, not argv
        }
        let mut child = Proc::spawn("redcount serve", &mut cmd).unwrap();
        redcount_procs::wait_port(port, Duration::from_secs(15), &mut child).unwrap();
        NativeServer { child: Some(child), port, log }
    }

    /// Its base URL.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// What it logged.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its peak resident memory so far (VmHWM), in KiB.
    pub fn peak_rss_kib(&self) -> u64 {
        peak_rss_kib(self.child.as_ref().and_then(Proc::id).expect("running"))
    }

    /// Stops it as an operator would (SIGTERM: a graceful shutdown), killing it if it has not
    /// exited within `grace`.
    pub fn stop(&mut self, grace: Duration) {
        if let Some(mut c) = self.child.take() {
            c.stop(grace);
        }
    }
}

/// A process's peak resident memory (VmHWM from /proc), in KiB.
pub fn peak_rss_kib(pid: u32) -> u64 {
    redcount_procs::peak_rss_kib(pid).expect("VmHWM in /proc/<pid>/status")
}

impl Drop for NativeServer {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill();
        }
    }
}

/// The Redis behind a test: one server, or a cluster.
#[derive(Debug)]
pub enum Store {
    /// A standalone redis-server.
    One(RedisServer),
    /// A local Redis Cluster.
    Cluster(RedisCluster),
}

impl Store {
    fn nodes(&self) -> Vec<&RedisServer> {
        match self {
            Store::One(r) => vec![r],
            Store::Cluster(c) => c.nodes.iter().collect(),
        }
    }

    /// The URL (comma-separated seeds for a cluster).
    pub fn url(&self) -> String {
        match self {
            Store::One(r) => r.url(),
            Store::Cluster(c) => c.urls(),
        }
    }

    /// Calls of `command`, over every node.
    pub fn calls(&self, command: &str) -> u64 {
        self.nodes().iter().map(|n| n.calls(command)).sum()
    }

    /// Calls of every command (see [`RedisServer::total_calls`]), over every node.
    pub fn total_calls(&self) -> u64 {
        self.nodes().iter().map(|n| n.total_calls()).sum()
    }

    /// Runs `cmd` on the node that serves `key`.
    pub fn on_key<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> T {
        let mut last = None;
        for n in self.nodes() {
            match cmd.query::<T>(&mut n.conn()) {
                Ok(v) => return v,
                Err(e) => last = Some(e), // MOVED: another node serves the key
            }
        }
        panic!("no node ran the command: {last:?}")
    }

    /// Runs `cmd` on every node (e.g. SCRIPT FLUSH).
    pub fn everywhere(&self, cmd: &redis::Cmd) {
        for n in self.nodes() {
            cmd.query::<()>(&mut n.conn()).unwrap();
        }
    }

    /// Kills the standalone server (a cluster test stops the front instead).
    pub fn kill(&mut self) {
        match self {
            Store::One(r) => r.kill(),
            Store::Cluster(_) => panic!("kill a cluster node by node"),
        }
    }

    /// Restarts the standalone server.
    pub fn restart(&mut self) {
        match self {
            Store::One(r) => r.restart(),
            Store::Cluster(_) => panic!("restart a cluster node by node"),
        }
    }
}
