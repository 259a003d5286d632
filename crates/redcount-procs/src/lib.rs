//! Real processes for redcount's tests and `cargo xtask`: one place that knows how to start
//! redis-server, a local Redis Cluster, redcount-rest, `wrangler dev` and workers under
//! workerd ([`workerd`]) on free loopback ports, and how to stop them.
//!
//! Every [`Proc`] runs in a process group of its own (wrangler starts workerd; both go
//! together) and is stopped with its group when dropped. The first spawn also installs a
//! Ctrl-C / SIGTERM handler that stops every group still running before the process exits,
//! so an interrupted `cargo xtask bench` or test run leaves nothing behind.
//!
//! ```
//! let port = redcount_procs::free_port();
//! let dir = redcount_procs::scratch_dir("doc");
//! let mut redis = redcount_procs::Proc::spawn("redis-server", &mut redcount_procs::redis_command(port, &dir, &[]))
//!     .expect("redis-server is installed");
//! redcount_procs::wait_port(port, std::time::Duration::from_secs(10), &mut redis).unwrap();
//! drop(redis); // stopped (SIGTERM to its group, SIGKILL if it lingers)
//! ```

pub mod workerd;

use std::collections::BTreeSet;
use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, Once};
use std::time::{Duration, Instant};

/// Process groups started and not yet reaped: what Ctrl-C stops.
static GROUPS: Mutex<BTreeSet<u32>> = Mutex::new(BTreeSet::new());
static HANDLER: Once = Once::new();

fn groups() -> std::sync::MutexGuard<'static, BTreeSet<u32>> {
    GROUPS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Sends `signal` (`TERM`, `KILL`) to process group `pgid`.
fn signal_group(pgid: u32, signal: &str) {
    let _ =
        Command::new("kill").args([&format!("-{signal}"), "--", &format!("-{pgid}")]).stderr(Stdio::null()).status();
}

/// A child process in a process group of its own, stopped with its group when dropped.
#[derive(Debug)]
pub struct Proc {
    /// What it is, for messages.
    pub name: String,
    child: Option<Child>,
}

impl Proc {
    /// Spawns `cmd` in a new process group.
    pub fn spawn(name: &str, cmd: &mut Command) -> Result<Proc, String> {
        use std::os::unix::process::CommandExt;
        HANDLER.call_once(|| {
            // Not fatal if another handler is installed already: drops still stop children.
            let _ = ctrlc::set_handler(|| {
                let all: Vec<u32> = groups().iter().copied().collect();
                for g in &all {
                    signal_group(*g, "TERM");
                }
                std::thread::sleep(Duration::from_millis(500));
                for g in &all {
                    signal_group(*g, "KILL");
                }
                std::process::exit(130);
            });
        });
        cmd.process_group(0);
        let child = cmd.spawn().map_err(|e| format!("cannot start {name}: {e}"))?;
        groups().insert(child.id());
        Ok(Proc { name: name.to_string(), child: Some(child) })
    }

    /// Its process id (also its group's), while it has not been reaped.
    pub fn id(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// True while it runs.
    pub fn alive(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// SIGKILLs its group at once and reaps it (a crash, for fault tests).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            signal_group(c.id(), "KILL");
            let _ = c.wait();
            groups().remove(&c.id());
        }
    }

    /// SIGTERMs its group, waits up to `grace` for it to exit, then SIGKILLs it.
    pub fn stop(&mut self, grace: Duration) {
        if let Some(c) = self.child.as_mut() {
            signal_group(c.id(), "TERM");
            let deadline = Instant::now() + grace;
            while Instant::now() < deadline && matches!(c.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(25));
            }
        }
        self.kill();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(3));
    }
}

/// A free TCP port on 127.0.0.1 (bound once, then released for a server to take).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("bind 127.0.0.1:0")
}

/// Waits until something accepts connections on `port`, failing early if `proc` exits.
pub fn wait_port(port: u16, timeout: Duration, proc: &mut Proc) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if !proc.alive() {
            return Err(format!("{} exited before listening on port {port}", proc.name));
        }
        if Instant::now() > deadline {
            return Err(format!("{} did not listen on port {port} within {timeout:?}", proc.name));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// A random secret, `tag-` and 128 bits from the OS as hex.
pub fn secret(tag: &str) -> String {
    let mut b = [0u8; 16];
    std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b)).expect("read /dev/urandom");
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    if tag.is_empty() { hex } else { format!("{tag}-{hex}") }
}

/// A new scratch directory (under `CARGO_TARGET_TMPDIR` in tests, else the system's).
pub fn scratch_dir(tag: &str) -> PathBuf {
    let base = std::env::var_os("CARGO_TARGET_TMPDIR").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
    let dir = base.join(format!("redcount-{tag}-{}-{}", std::process::id(), &secret("")[..8]));
    std::fs::create_dir_all(&dir).expect("create a scratch directory");
    dir
}

/// A process's peak resident memory (VmHWM from /proc), in KiB.
pub fn peak_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// Which server the tests and `cargo xtask` start: Redis, or Valkey (the fork most managed
/// "Redis" now runs). `REDCOUNT_TEST_SERVER=valkey|redis` picks one (default redis).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Server {
    /// `redis-server` (`REDIS_SERVER` names another binary).
    Redis,
    /// `valkey-server`: `REDCOUNT_VALKEY_SERVER`, else the one `cargo xtask setup` installs
    /// under `target/valkey/bin/`, else the one on PATH.
    Valkey,
}

impl Server {
    /// The server `REDCOUNT_TEST_SERVER` names (`redis` when unset); any other value panics,
    /// naming the variable (a typo must not quietly test Redis instead).
    pub fn from_env() -> Server {
        match std::env::var("REDCOUNT_TEST_SERVER").as_deref() {
            Err(_) | Ok("" | "redis") => Server::Redis,
            Ok("valkey") => Server::Valkey,
            Ok(other) => panic!("REDCOUNT_TEST_SERVER must be `redis` or `valkey`, not `{other}`"),
        }
    }

    /// `redis` or `valkey`.
    pub fn name(self) -> &'static str {
        match self {
            Server::Redis => "redis",
            Server::Valkey => "valkey",
        }
    }

    /// The server binary to run.
    pub fn binary(self) -> PathBuf {
        match self {
            Server::Redis => {
                std::env::var_os("REDIS_SERVER").map_or_else(|| PathBuf::from("redis-server"), PathBuf::from)
            }
            Server::Valkey => std::env::var_os("REDCOUNT_VALKEY_SERVER").map(PathBuf::from).unwrap_or_else(|| {
                let installed = valkey_dir().join("bin/valkey-server");
                if installed.exists() { installed } else { PathBuf::from("valkey-server") }
            }),
        }
    }

    /// Its command-line client (`redis-cli`, `valkey-cli`), beside the server binary when
    /// that is a path.
    pub fn cli(self) -> PathBuf {
        let name = match self {
            Server::Redis => "redis-cli",
            Server::Valkey => "valkey-cli",
        };
        let server = self.binary();
        match server.parent() {
            Some(dir) if !dir.as_os_str().is_empty() && dir.join(name).exists() => dir.join(name),
            _ => PathBuf::from(name),
        }
    }
}

/// Where `cargo xtask setup` installs Valkey (`bin/valkey-server`, `bin/valkey-cli`, and the
/// venv they came from): `valkey/` in the cargo target directory (`CARGO_TARGET_DIR`, else
/// this workspace's `target/`).
pub fn valkey_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"), PathBuf::from)
        .join("valkey")
}

/// The server of [`Server::from_env`] on `port` (loopback only), data in `dir`, no
/// persistence unless `extra` asks for it (`--appendonly yes`, `--save ...`).
pub fn redis_command(port: u16, dir: &Path, extra: &[&str]) -> Command {
    let mut cmd = Command::new(Server::from_env().binary());
    cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", ""])
        .arg("--dir")
        .arg(dir)
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if !extra.contains(&"--appendonly") {
        cmd.args(["--appendonly", "no"]);
    }
    cmd
}

/// Starts the server of [`Server::from_env`] on a free port with `extra` arguments (see
/// [`redis_command`]), data in `dir`, and waits until it answers PING (accepting connections
/// is not enough: it may still be loading). A port taken between choosing and binding it
/// is retried with another, a few times. Returns the process and its port.
pub fn start_server(dir: &Path, extra: &[&str]) -> Result<(Proc, u16), String> {
    let server = Server::from_env();
    let mut last = String::new();
    for _ in 0..4 {
        let port = free_port();
        let mut proc = Proc::spawn(server.name(), &mut redis_command(port, dir, extra))
            .map_err(|e| format!("{e} (`cargo xtask setup` installs redis-server and valkey-server)"))?;
        match wait_port(port, Duration::from_secs(10), &mut proc).and_then(|()| wait_ping(port)) {
            Ok(()) => return Ok((proc, port)),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// Waits up to 10 s until the server on `port` answers PING with PONG.
pub fn wait_ping(port: u16) -> Result<(), String> {
    use std::io::Write;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let pong = TcpStream::connect(("127.0.0.1", port)).and_then(|mut s| {
            s.set_read_timeout(Some(Duration::from_secs(1)))?;
            s.write_all(b"PING\r\n")?;
            let mut buf = [0u8; 7];
            s.read_exact(&mut buf)?;
            Ok(&buf == b"+PONG\r\n")
        });
        if pong.is_ok_and(|p| p) {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("the server on port {port} did not answer PING within 10 s"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The `redis-server` arguments of a Cluster node.
pub const CLUSTER_NODE: [&str; 4] = ["--cluster-enabled", "yes", "--cluster-node-timeout", "2000"];

/// Joins the nodes listening on `ports` into a Cluster of masters (`redis-cli --cluster
/// create`, or `valkey-cli`'s); the caller waits for `cluster_state:ok`.
pub fn cluster_create(ports: &[u16]) -> Result<(), String> {
    cluster_create_with(ports, &[])
}

/// [`cluster_create`] with more `redis-cli` arguments (`--tls --cacert ca.pem` for nodes
/// reached on their TLS ports).
pub fn cluster_create_with(ports: &[u16], cli: &[&str]) -> Result<(), String> {
    let mut cmd = Command::new(Server::from_env().cli());
    cmd.args(cli).args(["--cluster", "create"]);
    for p in ports {
        cmd.arg(format!("127.0.0.1:{p}"));
    }
    let out = cmd.arg("--cluster-yes").output().map_err(|e| format!("cannot run redis-cli: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("cluster create failed: {}", String::from_utf8_lossy(&out.stdout)))
    }
}

/// `redcount-rest` from `bin_dir` on `port` before `redis_url`; the tokens go in through the
/// environment (`REDCOUNT_REST_TOKEN`, `REDCOUNT_REST_READONLY_TOKEN`), never argv, which
/// every user of the machine can read.
pub fn rest_front_command(bin_dir: &Path, port: u16, redis_url: &str, extra: &[&str]) -> Command {
    let mut cmd = Command::new(bin_dir.join("redcount-rest"));
    cmd.args(["--listen", &format!("127.0.0.1:{port}"), "--redis", redis_url]).args(extra);
    cmd
}

/// `wrangler dev` (the npm package's binary under `root`) on `port`, with the config
/// directory `dir` (its `wrangler.toml` and `.dev.vars`), output to `dir/wrangler.log`.
pub fn wrangler_command(root: &Path, dir: &Path, port: u16) -> Result<Command, String> {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("wrangler.log"))
        .map_err(|e| e.to_string())?;
    let mut cmd = Command::new(root.join("node_modules/.bin/wrangler"));
    cmd.args(["dev", "--ip", "127.0.0.1", "--port", &port.to_string()])
        .args(["--inspector-port", &free_port().to_string()])
        .arg("--config")
        .arg(dir.join("wrangler.toml"))
        .current_dir(dir)
        .env("WRANGLER_SEND_METRICS", "false")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(log.try_clone().map_err(|e| e.to_string())?)
        .stderr(log);
    Ok(cmd)
}

/// Raw HTTP/1.1 clients for tests of connection caps: connections from any loopback address,
/// held open or sending one request.
#[cfg(feature = "client")]
pub mod client {
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::time::Duration;

    /// One HTTP/1.1 request on a fresh connection; the status (0 when none came) and body.
    pub fn request(port: u16, method: &str, path: &str, token: &str, body: &str) -> (u16, String) {
        request_from([127, 0, 0, 1], port, method, path, token, body)
    }

    /// [`request`] from the loopback address `from`.
    pub fn request_from(from: [u8; 4], port: u16, method: &str, path: &str, token: &str, body: &str) -> (u16, String) {
        let mut s = hold_from(from, port, 1).pop().expect("one connection");
        s.set_read_timeout(Some(Duration::from_secs(20))).expect("a read timeout");
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {token}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
        .expect("the request is sent");
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        let status = out.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
        let body = out.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
        (status, body)
    }

    /// Opens `n` connections from the loopback address `from` (any 127.x.y.z is this machine),
    /// so a test can play several clients.
    pub fn hold_from(from: [u8; 4], port: u16, n: usize) -> Vec<TcpStream> {
        use socket2::{Domain, Socket, Type};
        (0..n)
            .map(|_| {
                let s = Socket::new(Domain::IPV4, Type::STREAM, None).expect("a socket");
                s.bind(&std::net::SocketAddr::from((from, 0)).into()).expect("a loopback address");
                s.connect(&std::net::SocketAddr::from(([127, 0, 0, 1], port)).into()).expect("the server listens");
                s.into()
            })
            .collect()
    }
}
