//! Workers served by workerd directly, for the benchmark: no `wrangler dev` (whose local
//! Node.js proxy caps every worker at a few hundred requests per second) in front.
//!
//! A worker is described the way wrangler sees it, by a directory with its `wrangler.toml` and
//! `.dev.vars`. Its bundle is the one `wrangler deploy --dry-run` makes (what would be
//! uploaded), and its workerd config (capnp) is generated from those two files: the
//! compatibility date and flags, `[vars]` and the `.dev.vars` secrets as text bindings, and
//! an outbound network that may reach loopback (the REST front runs there).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::procs::{Guard, free_port, wait_port};
use crate::setup::{self, root};

/// The workerd binary wrangler itself runs (npm `@cloudflare/workerd-linux-64`, pinned by
/// package-lock.json through wrangler).
pub fn binary() -> PathBuf {
    root().join("node_modules/@cloudflare/workerd-linux-64/bin/workerd")
}

/// Bundles the worker of `dir` (its `wrangler.toml`) with `wrangler deploy --dry-run` into
/// `dir/bundle`, offline and without an account.
pub fn bundle(dir: &Path) -> Result<PathBuf, String> {
    let out = dir.join("bundle");
    let _ = std::fs::remove_dir_all(&out);
    let status = Command::new(root().join("node_modules/.bin/wrangler"))
        .current_dir(dir)
        .args(["deploy", "--dry-run", "--outdir"])
        .arg(&out)
        .arg("--config")
        .arg(dir.join("wrangler.toml"))
        .env("WRANGLER_SEND_METRICS", "false")
        .env("WRANGLER_HIDE_BANNER", "true")
        .env("FORCE_COLOR", "0")
        .env_remove("CLOUDFLARE_API_TOKEN")
        .env_remove("CLOUDFLARE_ACCOUNT_ID")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .status()
        .map_err(|e| format!("cannot run wrangler: {e}"))?;
    if !status.success() {
        return Err(format!("wrangler deploy --dry-run failed for {}", dir.display()));
    }
    Ok(out)
}

/// What workerd needs from a `wrangler.toml`: the compatibility date and flags and the
/// `[vars]` (strings; `'''` multi-line ones included).
#[derive(Debug, Default, PartialEq)]
pub struct WranglerToml {
    /// `compatibility_date`.
    pub compatibility_date: String,
    /// `compatibility_flags`.
    pub compatibility_flags: Vec<String>,
    /// `[vars]`, in order.
    pub vars: Vec<(String, String)>,
}

fn unquote(v: &str) -> String {
    let v = v.trim();
    v.strip_prefix('"')
        .and_then(|v| v.strip_suffix('"'))
        .or_else(|| v.strip_prefix('\'').and_then(|v| v.strip_suffix('\'')))
        .unwrap_or(v)
        .to_string()
}

/// Reads the parts of `wrangler.toml` workerd needs (the subset of TOML wrangler configs use:
/// strings, string arrays, `'''` multi-line strings, `#` comments).
pub fn parse_wrangler_toml(text: &str) -> Result<WranglerToml, String> {
    let mut out = WranglerToml::default();
    let mut table = String::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let t = line.trim();
        if t.is_empty() || t.starts_with('#') {
            continue;
        }
        if t.starts_with('[') {
            table = t.trim_matches(|c| c == '[' || c == ']').trim().to_string();
            continue;
        }
        let Some((key, value)) = t.split_once('=') else { continue };
        let (key, value) = (key.trim(), value.trim());
        // A multi-line literal string: everything up to the closing '''.
        let value = if let Some(rest) = value.strip_prefix("'''") {
            let mut s = rest.strip_prefix('\n').unwrap_or(rest).to_string();
            if let Some(end) = s.find("'''") {
                s.truncate(end);
            } else {
                loop {
                    let next = lines.next().ok_or_else(|| format!("{key}: ''' is never closed"))?;
                    if let Some(end) = next.find("'''") {
                        if !s.is_empty() {
                            s.push('\n');
                        }
                        s.push_str(&next[..end]);
                        break;
                    }
                    if !s.is_empty() {
                        s.push('\n');
                    }
                    s.push_str(next);
                }
            }
            s
        } else {
            // A comment may follow a one-line value.
            let v = match value.find(" #") {
                Some(i) if !value.starts_with('[') => &value[..i],
                _ => value,
            };
            unquote(v)
        };
        match (table.as_str(), key) {
            ("", "compatibility_date") => out.compatibility_date = value,
            ("", "compatibility_flags") => {
                out.compatibility_flags = value
                    .trim_matches(|c| c == '[' || c == ']')
                    .split(',')
                    .map(unquote)
                    .filter(|f| !f.is_empty())
                    .collect()
            }
            ("vars", k) => out.vars.push((unquote(k), value)),
            _ => {}
        }
    }
    if out.compatibility_date.is_empty() {
        return Err("wrangler.toml has no compatibility_date".into());
    }
    Ok(out)
}

/// `.dev.vars` (`NAME=value` lines) as pairs.
pub fn parse_dev_vars(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), unquote(v)))
        .collect()
}

/// A capnp text literal.
fn capnp_str(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The workerd config serving `modules` (file names in the config's own directory, the main
/// module first) on `127.0.0.1:port`, with `toml`'s settings and vars plus `secrets` as text
/// bindings. Outbound fetches may reach loopback and private addresses (the REST front).
pub fn capnp(toml: &WranglerToml, secrets: &[(String, String)], modules: &[String], port: u16) -> String {
    let mods: Vec<String> = modules
        .iter()
        .map(|m| {
            let kind = if m.ends_with(".wasm") { "wasm" } else { "esModule" };
            format!("      (name = {}, {kind} = embed {}),\n", capnp_str(m), capnp_str(m))
        })
        .collect();
    let bindings: Vec<String> = toml
        .vars
        .iter()
        .chain(secrets)
        .map(|(k, v)| format!("      (name = {}, text = {}),\n", capnp_str(k), capnp_str(v)))
        .collect();
    let flags: Vec<String> = toml.compatibility_flags.iter().map(|f| capnp_str(f)).collect();
    format!(
        "# Generated by `cargo xtask bench` from wrangler.toml and .dev.vars; do not edit.\n\
         using Workerd = import \"/workerd/workerd.capnp\";\n\n\
         const config :Workerd.Config = (\n\
         \x20 services = [\n\
         \x20   (name = \"main\", worker = .worker),\n\
         \x20   (name = \"internet\", network = (allow = [\"public\", \"private\", \"local\"])),\n\
         \x20 ],\n\
         \x20 sockets = [(name = \"http\", address = \"127.0.0.1:{port}\", http = (), service = \"main\")],\n\
         );\n\n\
         const worker :Workerd.Worker = (\n\
         \x20 modules = [\n{}  ],\n\
         \x20 compatibilityDate = {},\n\
         \x20 compatibilityFlags = [{}],\n\
         \x20 bindings = [\n{}  ],\n\
         );\n",
        mods.concat(),
        capnp_str(&toml.compatibility_date),
        flags.join(", "),
        bindings.concat(),
    )
}

/// A worker ready to be served by workerd: its generated config.
#[derive(Debug)]
pub struct Prepared {
    /// The config file (in the bundle's directory, beside the modules it embeds).
    pub config: PathBuf,
    /// The port it serves on.
    pub port: u16,
}

/// Bundles the worker of `dir` and writes its workerd config, to serve on a free port.
pub fn prepare(dir: &Path) -> Result<Prepared, String> {
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).map_err(|e| format!("{}: {e}", dir.join(f).display()));
    let toml = parse_wrangler_toml(&read("wrangler.toml")?)?;
    let secrets = parse_dev_vars(&read(".dev.vars").unwrap_or_default());
    let out = bundle(dir)?;
    let mut modules: Vec<String> = std::fs::read_dir(&out)
        .map_err(|e| e.to_string())?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".js") || n.ends_with(".mjs") || n.ends_with(".wasm"))
        .collect();
    // The entry point first (wrangler names it after `main`, as index.js).
    modules.sort_by_key(|m| (m != "index.js", m.clone()));
    if modules.first().map(String::as_str) != Some("index.js") {
        return Err(format!("no index.js in {}", out.display()));
    }
    let port = free_port();
    let config = out.join("workerd.capnp");
    std::fs::write(&config, capnp(&toml, &secrets, &modules, port)).map_err(|e| e.to_string())?;
    Ok(Prepared { config, port })
}

fn command(p: &Prepared, port: u16) -> Command {
    let mut cmd = Command::new(binary());
    cmd.arg("serve")
        .arg(&p.config)
        .arg(format!("--socket-addr=http=127.0.0.1:{port}"))
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
fn cpu_us(pid: u32) -> Option<f64> {
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
    for i in 0..200 {
        post_once(port, &format!("{path}warm{i}"));
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
    fn reads_what_workerd_needs_from_wrangler_toml() {
        let t = parse_wrangler_toml(
            "name = \"x\"\nmain = \"a.js\"\ncompatibility_date = \"2025-09-01\" # pinned\n\
             compatibility_flags = [\"nodejs_compat\", 'other']\n[build]\ncommand = \"cargo\"\n\
             [vars]\nPOLICIES = '''\n{\n  \"a\": 1\n}\n'''\nNAME = \"shop\" # a comment\nONE = '''{}'''\n",
        )
        .unwrap();
        assert_eq!(t.compatibility_date, "2025-09-01");
        assert_eq!(t.compatibility_flags, ["nodejs_compat", "other"]);
        assert_eq!(
            t.vars,
            [
                ("POLICIES".into(), "{\n  \"a\": 1\n}\n".into()),
                ("NAME".into(), "shop".into()),
                ("ONE".into(), "{}".into())
            ]
        );
        assert!(parse_wrangler_toml("name = \"x\"").is_err());
    }

    #[test]
    fn reads_the_profile_line() {
        let line = r#"{"requests":100,"cpu_us_per_request":412,"js":10.5,"builtins":30,"wasm":20.1,"other":39.4}"#;
        assert_eq!(json_number(line, "js"), Some(10.5));
        assert_eq!(json_number(line, "other"), Some(39.4));
        assert_eq!(json_number(line, "cpu_us_per_request"), Some(412.0));
        assert_eq!(json_number(line, "nope"), None);
    }

    #[test]
    fn writes_a_capnp_config_with_escaped_bindings() {
        let t = WranglerToml {
            compatibility_date: "2025-09-01".into(),
            compatibility_flags: vec![],
            vars: vec![("P".into(), "{\"a\":\n1}".into())],
        };
        let c = capnp(&t, &parse_dev_vars("TOKEN=abc\n# no\n"), &["index.js".into(), "x-m.wasm".into()], 8123);
        assert!(c.contains(r#"(name = "index.js", esModule = embed "index.js")"#), "{c}");
        assert!(c.contains(r#"(name = "x-m.wasm", wasm = embed "x-m.wasm")"#), "{c}");
        assert!(c.contains(r#"(name = "P", text = "{\"a\":\n1}")"#), "{c}");
        assert!(c.contains(r#"(name = "TOKEN", text = "abc")"#), "{c}");
        assert!(c.contains("127.0.0.1:8123"), "{c}");
    }
}
