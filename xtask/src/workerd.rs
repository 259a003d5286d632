//! Workers served by workerd directly, for the benchmark: no `wrangler dev` (whose local
//! Node.js proxy caps every worker at a few hundred requests per second) in front. The
//! bundles and configs are `redcount_procs::workerd`'s (shared with the tests); this module
//! serves them and measures them.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::procs::{Guard, free_port, wait_port};
use crate::setup::{self, root};

pub use redcount_procs::workerd::{Binding, Worker};

/// The workerd binary wrangler itself runs (npm `@cloudflare/workerd-linux-64`, pinned by
/// package-lock.json through wrangler).
pub fn binary() -> PathBuf {
    redcount_procs::workerd::binary(&root())
}

/// A worker ready to be served by workerd: its generated config.
#[derive(Debug)]
pub struct Prepared {
    /// The config file (beside the modules it embeds).
    pub config: PathBuf,
    /// The port it serves on.
    pub port: u16,
    /// The socket's name in the config (`http-<worker>`).
    socket: String,
}

/// Bundles the worker of `dir` and writes its workerd config, to serve on a free port.
pub fn prepare(dir: &Path) -> Result<Prepared, String> {
    let worker = Worker::from_dir(&root(), dir, &dir.join("bundle"))?;
    prepare_with(dir, &worker, &[])
}

/// Writes the config of `worker` in `dir` (on a free port) with the workers it calls
/// through Service bindings (`others`, served without a socket of their own).
pub fn prepare_with(dir: &Path, worker: &Worker, others: &[&Worker]) -> Result<Prepared, String> {
    let port = free_port();
    let mut all = vec![(worker, Some(port))];
    all.extend(others.iter().map(|w| (*w, None)));
    let config = redcount_procs::workerd::write(&dir.join("config"), &all)?;
    Ok(Prepared { config, port, socket: format!("http-{}", worker.name) })
}

fn command(p: &Prepared, port: u16) -> Command {
    let mut cmd = Command::new(binary());
    cmd.arg("serve")
        .arg(&p.config)
        .arg(format!("--socket-addr={}=127.0.0.1:{port}", p.socket))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        // Its warnings (and the workers' console) would drown the benchmark's progress.
        .stderr(Stdio::null());
    cmd
}

/// Starts workerd on a prepared worker and waits for its port.
pub fn serve(p: &Prepared) -> Result<Guard, String> {
    let mut g = Guard::spawn("workerd", &mut command(p, p.port))?;
    wait_port(p.port, Duration::from_secs(30), &mut g)?;
    Ok(g)
}

/// Where the isolate's CPU time goes under load: workerd (on a port of its own) with its V8
/// inspector open, and `bench/cpu-profile.mjs` sampling it while it sends `conns` concurrent
/// loops of `POST path…` for `seconds`. Returns the script's JSON line.
pub fn profile(p: &Prepared, path: &str, seconds: u32, conns: u32) -> Result<String, String> {
    let (port, inspector) = (free_port(), free_port());
    let mut cmd = command(p, port);
    cmd.arg(format!("--inspector-addr=127.0.0.1:{inspector}"));
    let mut g = Guard::spawn("workerd", &mut cmd)?;
    wait_port(port, Duration::from_secs(30), &mut g)?;
    wait_port(inspector, Duration::from_secs(30), &mut g)?;
    // Compiled and warm before sampling starts.
    for i in 0..200 {
        post_once(port, &format!("{path}warm{i}"));
    }
    let out = Command::new("node")
        .arg("--experimental-websocket")
        .arg(root().join("bench/cpu-profile.mjs"))
        .arg(format!("127.0.0.1:{inspector}"))
        .arg(format!("http://127.0.0.1:{port}{path}"))
        .arg(seconds.to_string())
        .arg(conns.to_string())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run node: {e}"))?;
    g.stop(Duration::from_secs(5));
    let line = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if !out.status.success() || !line.starts_with('{') {
        return Err(format!("bench/cpu-profile.mjs failed: {line}"));
    }
    Ok(line)
}

/// CPU time (user + system) a process has used so far, from /proc (Linux), in µs.
pub fn cpu_us(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which is in parentheses and may hold spaces).
    let fields: Vec<&str> = stat[stat.rfind(')')? + 2..].split(' ').collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    let hz: f64 = Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0);
    Some(ticks * 1e6 / hz)
}

/// The worker's CPU per request: workerd (on a port of its own, no inspector) under `conns`
/// concurrent loops of `POST path…` for `seconds`, sent by `bench/cpu-profile.mjs` from outside;
/// workerd's own CPU time (every thread, from /proc) over the requests it answered. Unlike
/// wall-clock figures, other load on the machine hardly moves it. Returns (requests, µs).
pub fn cpu_per_request(p: &Prepared, path: &str, seconds: u32, conns: u32) -> Result<(f64, f64), String> {
    let (requests, cpu, _) = under_load(p, path, seconds, conns, false, &|| (0, 0))?;
    Ok((requests, cpu))
}

/// [`cpu_per_request`], every request naming one subject (`path` + `one`) when `one`, and
/// what `calls` counted over the load (two counts of Redis's, read before and after it).
/// Returns (requests, µs of CPU per request, the two counts' growth).
pub fn under_load(
    p: &Prepared,
    path: &str,
    seconds: u32,
    conns: u32,
    one: bool,
    calls: &dyn Fn() -> (u64, u64),
) -> Result<(f64, f64, (u64, u64)), String> {
    let port = free_port();
    let mut g = Guard::spawn("workerd", &mut command(p, port))?;
    wait_port(port, Duration::from_secs(30), &mut g)?;
    // Warm on the load's own subject when it has one: what is measured is the steady state
    // (a flood's subject already exhausted and known to the isolate, a lease already held), and
    // no warm-up subject's lease is given back during the load.
    for i in 0..200 {
        post_once(port, &if one { format!("{path}one") } else { format!("{path}warm{i}") });
    }
    let pid = g.id().ok_or("workerd has no pid")?;
    let (before, calls_before) = (cpu_us(pid).ok_or("cannot read /proc/PID/stat")?, calls());
    let out = Command::new("node")
        .arg(root().join("bench/cpu-profile.mjs"))
        .args(["-", &format!("http://127.0.0.1:{port}{path}"), &seconds.to_string(), &conns.to_string()])
        .args(one.then_some("one"))
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run node: {e}"))?;
    let (after, calls_after) = (cpu_us(pid).ok_or("cannot read /proc/PID/stat")?, calls());
    g.stop(Duration::from_secs(5));
    let line = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let requests = json_number(&line, "requests").filter(|n| *n > 0.0).ok_or(format!("no load sent: {line}"))?;
    let grew = (calls_after.0.saturating_sub(calls_before.0), calls_after.1.saturating_sub(calls_before.1));
    Ok((requests, (after - before) / requests, grew))
}

/// The number after `"key":` in a flat JSON line.
pub fn json_number(line: &str, key: &str) -> Option<f64> {
    let at = line.find(&format!("\"{key}\":"))? + key.len() + 3;
    let rest = &line[at..];
    rest[..rest.find([',', '}'])?].trim().parse().ok()
}

/// One HTTP/1.1 POST: the status code once its status line arrives, or `None` when the server
/// is not answering yet. (workerd may hold the connection open a while after answering, so
/// the end of the stream is not waited for.)
fn post_once(port: u16, path: &str) -> Option<u16> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(s, "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{{}}").ok()?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 512];
    while !buf.windows(2).any(|w| w == b"\r\n") {
        let n = s.read(&mut chunk).ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    String::from_utf8_lossy(&buf).strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()
}

/// Cold start: from spawning workerd to the first answer to `POST path` (a real request, its
/// REST round trip included), `runs` times; returns each, in ms.
pub fn cold_starts(p: &Prepared, path: &str, runs: usize) -> Result<Vec<f64>, String> {
    let mut out = Vec::new();
    for run in 0..runs {
        let path = format!("{path}{run}x{}", std::process::id());
        let start = Instant::now();
        let mut g = Guard::spawn("workerd", &mut command(p, p.port))?;
        let status = loop {
            if let Some(s) = post_once(p.port, &path) {
                break s;
            }
            if start.elapsed() > Duration::from_secs(30) || !g.alive() {
                return Err("workerd did not answer within 30 s".into());
            }
            std::thread::sleep(Duration::from_millis(1));
        };
        let ms = start.elapsed().as_secs_f64() * 1000.0;
        g.stop(Duration::from_secs(5));
        if status != 200 {
            return Err(format!("the first answer was {status}, not 200"));
        }
        out.push(ms);
    }
    Ok(out)
}

/// The median of `v`.
pub fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    if v.is_empty() { 0.0 } else { v[v.len() / 2] }
}

/// `setup` for the benchmark's workerd: the pinned npm packages (wrangler brings workerd).
pub fn ensure() -> Result<(), String> {
    setup::ensure_npm()?;
    if !binary().exists() {
        return Err(format!("{} is missing (npm ci installs it with wrangler)", binary().display()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_profile_line() {
        let line = r#"{"requests":100,"cpu_us_per_request":412,"js":10.5,"builtins":30,"wasm":20.1,"other":39.4}"#;
        assert_eq!(json_number(line, "js"), Some(10.5));
        assert_eq!(json_number(line, "other"), Some(39.4));
        assert_eq!(json_number(line, "cpu_us_per_request"), Some(412.0));
        assert_eq!(json_number(line, "nope"), None);
    }
}
