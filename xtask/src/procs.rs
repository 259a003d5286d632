//! Child processes that stop with the task: redis-server, redcount-rest, wrangler.

use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// A child process killed (with its process group) when dropped.
pub struct Guard {
    pub name: &'static str,
    child: Child,
}

impl Guard {
    /// Spawns `cmd` in its own process group, so tools that start children of their own
    /// (wrangler starts workerd) stop as a whole.
    pub fn spawn(name: &'static str, cmd: &mut Command) -> Result<Self, String> {
        use std::os::unix::process::CommandExt;
        cmd.process_group(0);
        let child = cmd.spawn().map_err(|e| format!("cannot start {name}: {e}"))?;
        Ok(Guard { name, child })
    }

    /// True while it runs.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        // SIGTERM to the group, then SIGKILL if it lingers.
        let pgid = format!("-{}", self.child.id());
        let _ = Command::new("kill").args(["-TERM", "--", &pgid]).status();
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = Command::new("kill").args(["-KILL", "--", &pgid]).status();
        let _ = self.child.wait();
    }
}

pub fn free_port() -> Result<u16, String> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    Ok(l.local_addr().map_err(|e| e.to_string())?.port())
}

pub fn wait_port(port: u16, timeout: Duration, guard: &mut Guard) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if !guard.alive() {
            return Err(format!("{} exited before listening on port {port}", guard.name));
        }
        if Instant::now() > deadline {
            return Err(format!("{} did not listen on port {port} within {timeout:?}", guard.name));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// A random secret (128 bits from the OS) as hex.
pub fn secret() -> Result<String, String> {
    let mut b = [0u8; 16];
    std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b)).map_err(|e| e.to_string())?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// Starts a throw-away redis-server on a free port.
pub fn redis_server(dir: &std::path::Path) -> Result<(Guard, u16), String> {
    let port = free_port()?;
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    let mut g = Guard::spawn(
        "redis-server",
        Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(dir)
            .stdout(std::process::Stdio::null()),
    )?;
    wait_port(port, Duration::from_secs(10), &mut g)?;
    Ok((g, port))
}

/// Starts redcount-rest from `bin_dir` before `redis_url` with `token`.
pub fn rest_front(
    bin_dir: &std::path::Path,
    redis_url: &str,
    token: &str,
    extra: &[&str],
) -> Result<(Guard, u16), String> {
    let port = free_port()?;
    let mut g = Guard::spawn(
        "redcount-rest",
        Command::new(bin_dir.join("redcount-rest"))
            .args(["--listen", &format!("127.0.0.1:{port}"), "--redis", redis_url])
            .args(extra)
            .env("REDCOUNT_REST_TOKEN", token),
    )?;
    wait_port(port, Duration::from_secs(10), &mut g)?;
    Ok((g, port))
}

/// Starts `wrangler dev` on a config directory of its own (wrangler.toml + .dev.vars there).
pub fn wrangler(dir: &std::path::Path) -> Result<(Guard, u16), String> {
    let root = crate::setup::root();
    let port = free_port()?;
    let log = std::fs::File::create(dir.join("wrangler.log")).map_err(|e| e.to_string())?;
    let mut g = Guard::spawn(
        "wrangler dev",
        Command::new(root.join("node_modules/.bin/wrangler"))
            .args(["dev", "--ip", "127.0.0.1", "--port", &port.to_string()])
            .args(["--inspector-port", &free_port()?.to_string()])
            .arg("--config")
            .arg(dir.join("wrangler.toml"))
            .current_dir(dir)
            .env("WRANGLER_SEND_METRICS", "false")
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log),
    )?;
    wait_port(port, Duration::from_secs(180), &mut g)?;
    Ok((g, port))
}
