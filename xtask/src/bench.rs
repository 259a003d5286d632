//! `cargo xtask bench`: start every part, run the suite, write BENCHMARKS.md.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Command;

use crate::setup::{self, root};
use crate::{procs, workerd};

mod binding;
mod delay;

/// Added each way by the delay proxy between a second front and Redis: a round trip of about
/// 1 ms, Redis in the same region as the worker rather than on loopback.
const SAME_REGION_DELAY: std::time::Duration = std::time::Duration::from_micros(500);

const BENCH_POLICIES: &str = r#"{
  "bench-quota":  { "kind": "quota", "algorithm": "fixed", "limit": 500, "window_ms": 3600000 },
  "bench-raw":    { "kind": "quota", "algorithm": "fixed", "limit": 500, "window_ms": 3600000, "cache_denials_ms": 0 },
  "storm":        { "kind": "quota", "algorithm": "fixed", "limit": 1, "window_ms": 3600000 },
  "storm-raw":    { "kind": "quota", "algorithm": "fixed", "limit": 1, "window_ms": 3600000, "cache_denials_ms": 0 },
  "hot":          { "kind": "quota", "algorithm": "fixed", "limit": 100000000, "window_ms": 3600000 },
  "hot-lease":    { "kind": "quota", "algorithm": "fixed", "limit": 100000000, "window_ms": 3600000, "borrow": { "units": 50, "ms": 1000 } },
  "running-jobs": { "kind": "counter", "min": 0, "storage": "hash" },
  "demo-packets": { "kind": "redpackets", "max_shares": 1000, "max_total_cents": 1000000, "ttl_ms": 3600000 }
}"#;

fn version(cmd: &str, args: &[&str]) -> String {
    Command::new(cmd)
        .args(args)
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.lines().next().unwrap_or("").trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| String::from("unknown"))
}

fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|l| l.trim_start_matches([' ', '\t', ':']).to_string());
    let cores = cpuinfo.lines().filter(|l| l.starts_with("processor")).count();
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| m.lines().find_map(|l| l.strip_prefix("MemTotal:")).map(|v| v.trim().to_string()))
        .unwrap_or_default();
    format!("{} × {}, {mem} memory", cores, model.unwrap_or_else(|| "unknown CPU".into()))
}

/// Writes a worker's config directory as wrangler reads it: `wrangler.toml` and `.dev.vars`.
fn worker_dir(dir: &std::path::Path, toml: &str, dev_vars: &str) -> Result<(), String> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    std::fs::write(dir.join("wrangler.toml"), toml).map_err(|e| e.to_string())?;
    std::fs::write(dir.join(".dev.vars"), dev_vars).map_err(|e| e.to_string())
}

/// The one compatibility date, wrangler.toml's, for the workers the benchmarks configure.
fn compatibility_date() -> Result<String, String> {
    let text = std::fs::read_to_string(root().join("wrangler.toml")).map_err(|e| e.to_string())?;
    Ok(redcount_procs::workerd::parse_wrangler_toml(&text)?.compatibility_date)
}

/// The redcount worker's directory `work`/`name` (as tests and `dev` run it), on the front at
/// `front_url`.
fn redcount_dir(
    work: &std::path::Path,
    name: &str,
    front_url: &str,
    rest_token: &str,
    admin: &str,
) -> Result<PathBuf, String> {
    let date = compatibility_date()?;
    let wdir = work.join(name);
    worker_dir(
        &wdir,
        &format!(
            "name = \"redcount-bench\"\nmain = \"{}\"\ncompatibility_date = \"{date}\"\nkeep_names = false\n[assets]\ndirectory = \"{}\"\nbinding = \"ASSETS\"\n[vars]\nREDCOUNT_POLICIES = '''{BENCH_POLICIES}'''\n",
            root().join("crates/redcount-worker/build/index.js").display(),
            root().join("www").display()
        ),
        &format!("REDCOUNT_REST_URL={front_url}\nREDCOUNT_REST_TOKEN={rest_token}\nREDCOUNT_ADMIN_TOKEN={admin}\n"),
    )?;
    Ok(wdir)
}

/// bench/caller-worker in one workerd with the redcount worker of `wdir`: a take through its
/// RPC entrypoint (`/rpc/<policy>/`), as an HTTP request through a plain Service binding
/// (`/http/<policy>/`), through a binding to the floor worker of `fdir` (`/floor/<policy>/`: the
/// hop and one fetch, no decision), with redcount's engine in the caller's isolate
/// (`/inline/<policy>/`: @redcount/client/engine), or over the network to the redcount worker served at `public_url`
/// (`/public/<policy>/`).
pub fn callers(
    work: &std::path::Path,
    wdir: &std::path::Path,
    fdir: &std::path::Path,
    public_url: &str,
) -> Result<workerd::Prepared, String> {
    let date = compatibility_date()?;
    let cdir = work.join("caller");
    worker_dir(
        &cdir,
        &format!(
            "name = \"caller\"\nmain = \"{}\"\ncompatibility_date = \"{date}\"\nkeep_names = false\n[vars]\nPUBLIC_URL = \"{public_url}\"\nREDCOUNT_POLICIES = '''{BENCH_POLICIES}'''\n",
            root().join("bench/caller-worker/index.mjs").display()
        ),
        // The redcount worker's REST target and admin token, for the engine in the caller.
        &std::fs::read_to_string(wdir.join(".dev.vars")).map_err(|e| e.to_string())?,
    )?;
    let callee = workerd::Worker::from_dir(&root(), wdir, &cdir.join("callee"))?;
    let mut caller = workerd::Worker::from_dir(&root(), &cdir, &cdir.join("bundle"))?;
    caller.bindings.push(workerd::Binding::service("REDCOUNT", &callee.name, Some("Redcount"), None));
    caller.bindings.push(workerd::Binding::service("REDCOUNT_HTTP", &callee.name, None, None));
    let floor = workerd::Worker::from_dir(&root(), fdir, &cdir.join("floor"))?;
    caller.bindings.push(workerd::Binding::service("FLOOR", &floor.name, Some("Floor"), None));
    workerd::prepare_with(&cdir, &caller, &[&callee, &floor])
}

/// The sentence under the CPU table comparing the two callers' rows (each is two isolates'
/// CPU, caller and callee, per request).
fn binding_ratio(rpc: &[f64], http: &[f64]) -> String {
    format!(
        "\nA take through the RPC binding costs {:.2}× the CPU of the same take as an HTTP request through a Service binding (caller and callee together).\n",
        workerd::median(rpc) / workerd::median(http)
    )
}

/// `redcount-bench fronts`: redcount-rest (port `front_port`, process `front_pid`) beside a
/// webdis started here before the same Redis; the table is written to `out`.
pub fn fronts(
    bins: &std::path::Path,
    work: &std::path::Path,
    redis_port: u16,
    front_port: u16,
    front_pid: Option<u32>,
    token: &str,
    out: &std::path::Path,
) -> Result<(), String> {
    let (webdis, webdis_port) = procs::webdis(&work.join("webdis"), redis_port)?;
    let pid = |p: Option<u32>| p.map(|p| p.to_string()).ok_or("a front's process id is unknown");
    setup::run(
        Command::new(bins.join("redcount-bench"))
            .args(["fronts", "--rest-url", &format!("http://127.0.0.1:{front_port}")])
            .args(["--rest-pid", &pid(front_pid)?])
            .args(["--webdis-url", &format!("http://127.0.0.1:{webdis_port}"), "--webdis-pid", &pid(webdis.id())?])
            .arg("--out")
            .arg(out)
            .env("REDCOUNT_REST_TOKEN", token),
    )
}

/// `redcount-bench replicas`: a replica of the Redis on `redis_port` started here, then counter
/// adds and red-packet grabs without and with `--wait-replicas 1`; the table is written to `out`.
pub fn replicas(
    bins: &std::path::Path,
    work: &std::path::Path,
    redis_port: u16,
    out: &std::path::Path,
) -> Result<(), String> {
    let (_replica, replica_port) = procs::redis_replica(&work.join("replica"), redis_port)?;
    setup::run(
        Command::new(bins.join("redcount-bench"))
            .args(["replicas", "--redis", &format!("redis://127.0.0.1:{redis_port}")])
            .args(["--replica", &format!("redis://127.0.0.1:{replica_port}")])
            .arg("--out")
            .arg(out),
    )
}

/// The heading of BENCHMARKS.md's last section, written by hand and kept by each run.
const BY_HAND: &str = "\n## Measured by hand";

/// Cold starts per worker: the median and every run, in ms.
const COLD_RUNS: usize = 5;

/// What Redis (on `port`) has run so far, from INFO commandstats: (script calls, every
/// command, those run by scripts included). Not counted: INFO (ours), PING, CLIENT SETINFO and
/// SCRIPT/FUNCTION KILL (the front's health checks and watchdog polls).
fn redis_calls(port: u16) -> (u64, u64) {
    let out = Command::new("redis-cli").args(["-p", &port.to_string(), "INFO", "commandstats"]).output();
    let text = out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default();
    let noise = ["info", "ping", "client|setinfo", "script|kill", "function|kill"];
    let (mut scripts, mut all) = (0, 0);
    for l in text.lines() {
        let Some((name, rest)) = l.strip_prefix("cmdstat_").and_then(|l| l.split_once(':')) else { continue };
        let Some(n) = rest.split("calls=").nth(1).and_then(|r| r.split(',').next()?.parse::<u64>().ok()) else {
            continue;
        };
        if noise.contains(&name) {
            continue;
        }
        all += n;
        if name.starts_with("eval") {
            scripts += n;
        }
    }
    (scripts, all)
}

/// The local-decisions table: each load with the feature off and on (and the peer with its
/// ephemeral cache), rows taking turns over three rounds.
///
/// The hot limit is measured on loopback (Redis a ~0.1 ms round trip away) and through `far`,
/// the same worker on a second front whose Redis is behind [`delay::proxy`] (~1 ms), at 1
/// connection (latency-bound: the per-call worker waits a round trip per take) and 10.
fn local_decisions(
    ours: &workerd::Prepared,
    far: &workerd::Prepared,
    peer_one: &workerd::Prepared,
    none: &workerd::Prepared,
    redis_port: u16,
) -> Result<String, String> {
    const SECONDS: u32 = 3;
    const FLOOD: &str = "flood of one exhausted subject";
    const FLOOD_50: &str = "flood of one exhausted subject, 50 connections";
    const HOT_1: &str = "hot limit, one subject, 1 connection";
    const FAR: &str = "hot limit, one subject, Redis ~1 ms away";
    const FAR_1: &str = "hot limit, one subject, Redis ~1 ms away, 1 connection";
    const NO: &str = "redcount worker, no borrow";
    const YES: &str = "redcount worker, borrow 50 units for 1 s";
    const ALONE: &str = "workerd alone: no I/O";
    let rows: [(&str, &str, &workerd::Prepared, &str, bool, u32); 19] = [
        (FLOOD, "redcount worker, cache_denials_ms 0", ours, "/api/quotas/storm-raw/", true, 10),
        (FLOOD, "redcount worker, cache_denials_ms 1000 (the default)", ours, "/api/quotas/storm/", true, 10),
        (FLOOD, "@upstash/ratelimit worker, no cache", peer_one, "/limit/", true, 10),
        (FLOOD, "@upstash/ratelimit worker, its default ephemeral cache", peer_one, "/cached/", true, 10),
        (FLOOD, ALONE, none, "/none/", true, 10),
        (FLOOD_50, "redcount worker, cache_denials_ms 1000 (the default)", ours, "/api/quotas/storm/", true, 50),
        (FLOOD_50, "@upstash/ratelimit worker, its default ephemeral cache", peer_one, "/cached/", true, 50),
        (FLOOD_50, ALONE, none, "/none/", true, 50),
        ("allowed, 1,000 subjects", "redcount worker, cache_denials_ms 0", ours, "/api/quotas/bench-raw/", false, 10),
        (
            "allowed, 1,000 subjects",
            "redcount worker, cache_denials_ms 1000 (the default)",
            ours,
            "/api/quotas/bench-quota/",
            false,
            10,
        ),
        ("hot limit, one subject", "redcount worker, no borrow", ours, "/api/quotas/hot/", true, 10),
        (
            "hot limit, one subject",
            "redcount worker, borrow 50 units for 1 s",
            ours,
            "/api/quotas/hot-lease/",
            true,
            10,
        ),
        (HOT_1, NO, ours, "/api/quotas/hot/", true, 1),
        (HOT_1, YES, ours, "/api/quotas/hot-lease/", true, 1),
        (HOT_1, ALONE, none, "/none/", true, 1),
        (FAR, NO, far, "/api/quotas/hot/", true, 10),
        (FAR, YES, far, "/api/quotas/hot-lease/", true, 10),
        (FAR_1, NO, far, "/api/quotas/hot/", true, 1),
        (FAR_1, YES, far, "/api/quotas/hot-lease/", true, 1),
    ];
    let mut runs: Vec<Vec<[f64; 4]>> = vec![Vec::new(); rows.len()];
    for _ in 0..3 {
        for (k, (_, _, p, path, one, conns)) in rows.iter().enumerate() {
            let (requests, cpu, (scripts, all)) =
                workerd::under_load(p, path, SECONDS, *conns, *one, &|| redis_calls(redis_port))?;
            let per_1000 = |n: u64| n as f64 * 1000.0 / requests;
            runs[k].push([requests / f64::from(SECONDS), cpu, per_1000(scripts), per_1000(all)]);
        }
    }
    let mut t = String::from(
        "| load | worker | requests/s | CPU per request | script calls per 1,000 requests | Redis commands per 1,000 | each run (req/s; script calls per 1,000; CPU µs) |\n\
         |---|---|---:|---:|---:|---:|---|\n",
    );
    for ((load, name, ..), r) in rows.iter().zip(&runs) {
        let col = |i: usize| workerd::median(&r.iter().map(|x| x[i]).collect::<Vec<_>>());
        let each: Vec<String> = r.iter().map(|x| format!("{:.0}; {:.1}; {:.0}", x[0], x[2], x[1])).collect();
        let _ = writeln!(
            t,
            "| {load} | {name} | {:.0} | {:.0} µs | {:.1} | {:.1} | {} |",
            col(0),
            col(1),
            col(2),
            col(3),
            each.join(", ")
        );
    }
    // Borrow beside the per-call worker, each load's two rows of the same round.
    // The ceiling: workerd alone (no I/O at all) at the same connections, over the per-call
    // worker: what any answer from memory could gain on this machine, where the load
    // generator, workerd, the front and Redis share two cores.
    t.push_str(
        "\nThe hot limit, borrow ÷ no borrow (medians of the rounds' ratios; goal ≥ 3×), and the \
         ceiling: \"workerd alone: no I/O\" ÷ no borrow at the same connections, the most that any \
         answer without a round trip could gain on this machine:\n\n",
    );
    for (k, (load, name, _, _, _, conns)) in rows.iter().enumerate() {
        let Some(no) = rows.iter().position(|r| r.0 == *load && r.1 == NO).filter(|_| *name == YES) else { continue };
        let ratio = |of: usize, f: &dyn Fn(&[f64; 4], &[f64; 4]) -> f64| {
            workerd::median(&runs[of].iter().zip(&runs[no]).map(|(y, n)| f(y, n)).collect::<Vec<_>>())
        };
        let (rps, cpu) = (ratio(k, &|y, n| y[0] / n[0]), ratio(k, &|y, n| n[1] / y[1]));
        let met = if rps >= 3.0 { "met" } else { "not met" };
        let ceiling = rows
            .iter()
            .position(|r| r.1 == ALONE && r.5 == *conns)
            .map(|a| ratio(a, &|y, n| y[0] / n[0]))
            .map(|c| format!("; ceiling {c:.2}×, borrow at {:.0}% of it", 100.0 * rps / c))
            .unwrap_or_default();
        let _ = writeln!(t, "- {load}: {rps:.2}× by requests/s ({met}), {cpu:.2}× by CPU per request{ceiling}");
    }
    Ok(t)
}

/// A second front whose Redis is behind [`delay::proxy`], and the redcount worker on it: the
/// front's guard, the worker, and the proxy's measured round trip (ms).
fn far_worker(
    bins: &std::path::Path,
    work: &std::path::Path,
    redis_port: u16,
    rest_token: &str,
    admin: &str,
) -> Result<(procs::Guard, workerd::Prepared, f64), String> {
    let proxy = delay::proxy(redis_port, SAME_REGION_DELAY)?;
    let rtt = delay::ping_ms(proxy)?;
    let url = format!("redis://127.0.0.1:{proxy}");
    let (front, port) = procs::rest_front(bins, &url, rest_token, &["--threads", "1", "--log", "error"])?;
    let dir = redcount_dir(work, "worker-far", &format!("http://127.0.0.1:{port}"), rest_token, admin)?;
    Ok((front, workerd::prepare(&dir)?, rtt))
}

/// What `cargo xtask bench` runs.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// Everything, writing BENCHMARKS.md.
    All,
    /// The workers side by side only, printed.
    Workers,
    /// The local-decisions table only, printed (debug builds of the front: its CPU is not
    /// measured, and the workers' CPU and Redis calls do not depend on it).
    Local,
    /// The callers as users call redcount only: its section of BENCHMARKS.md rewritten.
    Binding,
}

/// `cargo xtask bench`: the part asked for.
pub fn all(part: Part) -> Result<(), String> {
    let full = part == Part::All;
    setup::ensure_test_deps()?;
    workerd::ensure()?;
    // `binding` runs no load generator of redcount-bench's.
    let bins =
        if part == Part::Binding { setup::build_bins(true)? } else { setup::build_bench_bins(part != Part::Local)? };
    let (_, bundle_gz) = crate::worker::build()?;
    if part != Part::Local {
        // The callers' typed client (bench/caller-worker imports its build).
        crate::client::build()?;
    }
    let work = setup::target_dir().join("bench");
    let (redis, redis_port) = procs::redis_server(&work.join("redis"))?;
    let redis_url = format!("redis://127.0.0.1:{redis_port}");
    let rest_token = procs::secret()?;
    let (front, front_port) = procs::rest_front(&bins, &redis_url, &rest_token, &["--threads", "1", "--log", "error"])?;
    let front_url = format!("http://127.0.0.1:{front_port}");
    let admin = procs::secret()?;

    // Each worker as wrangler sees it: the redcount worker (as tests and `dev` run it), the
    // @upstash/ratelimit peer, and the floor (one fetch to the front per request); all on
    // the same front and Redis.
    let date = compatibility_date()?;
    let wdir = redcount_dir(&work, "worker", &front_url, &rest_token, &admin)?;
    let pdir = work.join("peer");
    worker_dir(
        &pdir,
        &format!(
            "name = \"ratelimit-peer\"\nmain = \"{}\"\ncompatibility_date = \"{date}\"\n[vars]\nLIMIT = \"500\"\nWINDOW = \"1 h\"\nPREFIX = \"peer\"\n",
            root().join("bench/ratelimit-worker/index.mjs").display()
        ),
        &format!("REST_URL={front_url}\nREST_TOKEN={rest_token}\n"),
    )?;
    // The peer again with a limit of 1, for the denial flood.
    let p1dir = work.join("peer-one");
    worker_dir(
        &p1dir,
        &format!(
            "name = \"ratelimit-peer-one\"\nmain = \"{}\"\ncompatibility_date = \"{date}\"\n[vars]\nLIMIT = \"1\"\nWINDOW = \"1 h\"\nPREFIX = \"peer-one\"\n",
            root().join("bench/ratelimit-worker/index.mjs").display()
        ),
        &format!("REST_URL={front_url}\nREST_TOKEN={rest_token}\n"),
    )?;
    let fdir = work.join("floor");
    worker_dir(
        &fdir,
        &format!(
            "name = \"floor\"\nmain = \"{}\"\ncompatibility_date = \"{date}\"\n",
            root().join("bench/floor-worker/index.mjs").display()
        ),
        &format!("REST_URL={front_url}\nREST_TOKEN={rest_token}\n"),
    )?;
    // And workerd alone: a worker that answers without any I/O.
    let ndir = work.join("none");
    worker_dir(
        &ndir,
        &format!(
            "name = \"none\"\nmain = \"{}\"\ncompatibility_date = \"{date}\"\n",
            root().join("bench/null-worker/index.mjs").display()
        ),
        "",
    )?;
    let (ours, peer, floor) = (workerd::prepare(&wdir)?, workerd::prepare(&pdir)?, workerd::prepare(&fdir)?);
    let none = workerd::prepare(&ndir)?;
    let peer_one = workerd::prepare(&p1dir)?;
    let (_far_front, far, rtt) = far_worker(&bins, &work, redis_port, &rest_token, &admin)?;
    if part == Part::Local {
        println!("\nRedis PING through the delay proxy: {rtt:.2} ms (median of 200)");
        println!("\n{}", local_decisions(&ours, &far, &peer_one, &none, redis_port)?);
        return Ok(());
    }
    let callers = callers(&work, &wdir, &fdir, &format!("http://127.0.0.1:{}", ours.port))?;
    let users = binding::Parts { callers: &callers, redcount: &ours, peer: &peer, peer_one: &peer_one, redis_port };
    let pids = [front.id(), redis.id()];
    if part == Part::Binding {
        return binding::write(&binding::section(&users, &pids)?);
    }

    // Cold starts, the two workers taking turns.
    let (mut cold_ours, mut cold_peer) = (Vec::new(), Vec::new());
    for _ in 0..COLD_RUNS {
        cold_ours.extend(workerd::cold_starts(&ours, "/api/quotas/bench-quota/cold", 1)?);
        cold_peer.extend(workerd::cold_starts(&peer, "/limit/cold", 1)?);
    }
    eprintln!("xtask: cold starts (ms): redcount {cold_ours:?}, peer {cold_peer:?}");
    // CPU per request, each worker in turn, three times; then where each isolate's CPU goes.
    let mut cpu: Vec<(&str, Vec<f64>)> = vec![
        ("redcount worker", vec![]),
        ("@upstash/ratelimit worker", vec![]),
        ("floor: one fetch", vec![]),
        ("caller worker → redcount worker, RPC binding", vec![]),
        ("caller worker → redcount worker, HTTP through a Service binding", vec![]),
    ];
    for _ in 0..3 {
        let runs = [
            (&ours, "/api/quotas/bench-quota/"),
            (&peer, "/limit/"),
            (&floor, "/floor/"),
            (&callers, "/rpc/bench-quota/"),
            (&callers, "/http/bench-quota/"),
        ];
        for (k, (p, path)) in runs.into_iter().enumerate() {
            cpu[k].1.push(workerd::cpu_per_request(p, path, 4, 10)?.1);
        }
    }
    let mut cpu_table = String::from("| worker | CPU per request (median) | each run |\n|---|---:|---|\n");
    for (name, runs) in &cpu {
        let each: Vec<String> = runs.iter().map(|r| format!("{r:.0} µs")).collect();
        let _ = writeln!(cpu_table, "| {name} | {:.0} µs | {} |", workerd::median(runs), each.join(", "));
    }
    cpu_table.push_str(&binding_ratio(&cpu[3].1, &cpu[4].1));
    let local_table = local_decisions(&ours, &far, &peer_one, &none, redis_port)?;
    // Where each isolate's CPU goes, under 10 connections for 5 s.
    let profiles = [
        ("redcount worker", workerd::profile(&ours, "/api/quotas/bench-quota/", 5, 10)?),
        ("@upstash/ratelimit worker", workerd::profile(&peer, "/limit/", 5, 10)?),
    ];
    let mut profile_table = String::from(
        "| worker | requests sampled | isolate CPU per request | JS (shell, glue, library) | runtime built-ins | wasm | other (V8/workerd outside JS, GC) |\n\
         |---|---:|---:|---:|---:|---:|---:|\n",
    );
    for (name, line) in &profiles {
        let n = |k: &str| workerd::json_number(line, k).unwrap_or(f64::NAN);
        let _ = writeln!(
            profile_table,
            "| {name} | {:.0} | {:.0} µs | {:.1}% | {:.1}% | {:.1}% | {:.1}% |",
            n("requests"),
            n("cpu_us_per_request"),
            n("js"),
            n("builtins"),
            n("wasm"),
            n("other")
        );
    }

    let users_section = binding::section(&users, &pids)?;

    let _served: Vec<procs::Guard> =
        [&ours, &peer, &floor, &none].into_iter().map(workerd::serve).collect::<Result<_, _>>()?;
    let url = |p: &workerd::Prepared| format!("http://127.0.0.1:{}", p.port);
    // The redcount worker under wrangler dev too, for the reference row.
    let (_dev, dev_port) = procs::wrangler(&wdir)?;

    let workers_table = work.join("workers.md");
    setup::run(
        Command::new(bins.join("redcount-bench"))
            .args(["workers", "--worker-url", &url(&ours), "--peer-url", &url(&peer)])
            .args(["--floor-url", &url(&floor), "--null-url", &url(&none)])
            .args(["--wrangler-dev-url", &format!("http://127.0.0.1:{dev_port}")])
            .arg("--out")
            .arg(&workers_table),
    )?;
    if !full {
        let text = std::fs::read_to_string(&workers_table).map_err(|e| e.to_string())?;
        println!(
            "\ncold starts (ms): redcount {cold_ours:.0?}, @upstash/ratelimit {cold_peer:.0?}\n\n{cpu_table}\n{local_table}\n{profile_table}\n{text}"
        );
        // The profiles' own lines too: their `top` lists the functions with the most self time.
        for (name, line) in &profiles {
            println!("profile of the {name}: {line}");
        }
        return Ok(());
    }
    let table = work.join("all.md");
    let chart = root().join("BENCHMARKS.svg");
    setup::run(
        Command::new(bins.join("redcount-bench"))
            .args(["all", "--redis", &redis_url, "--rest-url", &front_url])
            .args(["--worker-url", &url(&ours)])
            .args(["--peer-url", &url(&peer)])
            .arg("--out-md")
            .arg(&table)
            .arg("--out-svg")
            .arg(&chart)
            .env("REDCOUNT_REST_TOKEN", &rest_token)
            .env("REDCOUNT_ADMIN_TOKEN", &admin)
            // The peer's Lua, measured beside redcount's in the Redis-time section.
            .env("REDCOUNT_PEER_JS", root().join("node_modules/@upstash/ratelimit/dist/index.js")),
    )?;
    let fronts_table = work.join("fronts.md");
    fronts(&bins, &work, redis_port, front_port, front.id(), &rest_token, &fronts_table)?;
    let fronts_table = std::fs::read_to_string(&fronts_table).map_err(|e| e.to_string())?;
    let replicas_table = work.join("replicas.md");
    replicas(&bins, &work, redis_port, &replicas_table)?;
    let replicas_table = std::fs::read_to_string(&replicas_table).map_err(|e| e.to_string())?;
    let table = std::fs::read_to_string(&table).map_err(|e| e.to_string())?;
    let workers_table = std::fs::read_to_string(&workers_table).map_err(|e| e.to_string())?;
    let cold = |v: &[f64]| {
        let all: Vec<String> = v.iter().map(|x| format!("{x:.0}")).collect();
        format!("{:.0} ms ({})", workerd::median(v), all.join(", "))
    };
    let mut md = String::new();
    let date = version("date", &["-u", "+%Y-%m-%d %H:%M UTC"]);
    let _ = write!(
        md,
        "# Benchmarks\n\nRegenerated by `cargo xtask bench` ({date}); every row comes from the same run, on one machine.\n\n\
         - Machine: {}\n- rustc: {}\n- redis-server: {}\n- Node.js: {}; wrangler {}; workerd {}\n\
         - Redis, redcount-rest (one worker thread), the workers and the load generator\n  \
         all share this machine's cores, so absolute figures are low; compare rows, not machines.\n\n\
         ## The workers side by side\n\n\
         Each worker is served by **workerd directly** (the binary wrangler runs, from its npm package),\n\
         with a config generated from its `wrangler.toml` and `.dev.vars` and the bundle\n\
         `wrangler deploy --dry-run` makes (`xtask/src/workerd.rs`); the first three call the same\n\
         redcount-rest and Redis:\n\n\
         - **redcount worker**: `POST /api/quotas/bench-quota/{{subject}}` (fixed window; never denied here;\n  \
         every request to every worker is a POST without a body, so the quota's default cost of 1).\n\
         - **@upstash/ratelimit worker**: the official library, fixed window, no ephemeral cache:\n  \
         `bench/ratelimit-worker/index.mjs`.\n\
         - **floor: one fetch**: a worker that only POSTs `PING` to the front and returns its answer\n  \
         (`bench/floor-worker/index.mjs`): no worker calling Redis through the front costs less.\n\
         - **workerd alone: no I/O**: a worker that answers at once (`bench/null-worker/index.mjs`):\n  \
         workerd's own latency. Its tail is workerd's: on this machine workerd pauses every few\n  \
         hundred milliseconds for tens of milliseconds with every connection waiting, whatever the\n  \
         worker does (the `≥ 20 ms` column counts the requests caught in such pauses). At 50\n  \
         connections one pause covers 50 requests, so p99 there is set by how many pauses a\n  \
         measurement meets, not by the worker; compare p50 and the `≥ 20 ms` share.\n\
         - The last row is the redcount worker under **`wrangler dev`** (its local Node.js proxy in\n  \
         front of workerd caps any worker at a few hundred requests per second), for reference only.\n\n\
         {workers_table}\n\
         Worker bundle: {:.1} KB gzipped (wasm + JS, `gzip -9` per file, as `cargo xtask build-worker` prints it).\n\n\
         Cold start, from spawning workerd to the first answer of a real request (its REST round trip\n\
         included), median of {COLD_RUNS} (each run): redcount worker {}; @upstash/ratelimit worker {}.\n\n\
         CPU per request: workerd's own CPU time (user + system, every thread, from `/proc`) over the\n\
         requests it answered while `bench/cpu-profile.mjs` sent 10 concurrent loops for 4 s from\n\
         outside; three runs per worker, taking turns. Other load on the machine hardly moves it,\n\
         unlike the wall-clock figures above.\n\n\
         {cpu_table}\n\
         ### Local decisions: the denial cache and budget leases\n\n\
         The same workers, each row in turn, three rounds (medians; 10 connections unless the row says\n\
         otherwise, 3 s a run): a flood of one exhausted subject (a limit of 1), an allowed stream over 1,000\n\
         subjects, and a hot limit (one subject, every call admitted), each with the feature off and on;\n\
         the hot limit also at 1 connection, and with Redis ~1 ms away (a second front whose Redis is\n\
         behind a proxy adding 0.5 ms each way, `xtask/src/bench/delay.rs`);\n\
         a load of one subject is warmed on that subject, so the run shows the steady state (an\n\
         isolate's first takes of a subject each ask Redis until one is answered). From INFO commandstats\n\
         over the run, per 1,000 requests: script calls (EVALSHA/EVAL: round trips), and every\n\
         command Redis ran, those inside scripts included (less the front's health checks).\n\
         CPU per request is workerd's, as above.\n\n\
         {local_table}\n\
         Where each isolate's CPU goes: V8's sampling profiler (the one behind `--cpu-prof`), read\n\
         through workerd's inspector by `bench/cpu-profile.mjs` while it sends 10 concurrent loops of\n\
         requests for 5 s (from outside workerd); each share is of the isolate's busy time, by the\n\
         frame the sample fell in (a runtime function called from JS counts as built-in, not JS).\n\n\
         {profile_table}\n\
         ## The REST front beside webdis\n\n\
         redcount-rest and webdis (Debian's package), each with one worker thread, before the same\n\
         Redis; the load generator sends the same commands through each (`redcount-bench fronts`).\n\n\
         {fronts_table}\n\
         ## Writes of money that wait for a replica\n\n\
         `redcount serve --redis … --wait-replicas 1` (the front's `--wait-replicas` does the same): `WAIT`\n\
         after each counter or red-packet script, on the same connection (`redcount-bench replicas`).\n\n\
         {replicas_table}\n\
         ## What the variants are\n\n\
         - **Lua over RESP**: redcount's script, one EVALSHA per operation, straight to Redis.\n\
         - **Lua via redcount-rest**: the same call as an Upstash REST request through the front.\n\
         - **worker HTTP API**: the redcount worker's route under workerd (HTTP → worker → REST front → Redis).\n\
         - **naive GET-check-…**: read, decide in the client, write: two round trips with a race between them.\n\
         - **naive …, … back on overflow/underflow**: write first, undo if it went too far (readers see the overshoot).\n\
         - **naive WATCH/MULTI/EXEC**: optimistic transaction, retried until it commits.\n\
         - **peer: @upstash/ratelimit worker**: the peer above, under workerd too.\n\n\
         Invariants checked against Redis after each row: shares over-issued (storm), calls allowed over the limit\n\
         or wrongly refused (quota), counts below zero at the end or seen by readers (counter floor).\n\n\
         ## Results\n\n{table}\n![throughput chart](BENCHMARKS.svg)\n",
        machine(),
        version("rustc", &["--version"]),
        version("redis-server", &["--version"]),
        version("node", &["--version"]),
        version(&root().join("node_modules/.bin/wrangler").display().to_string(), &["--version"]),
        version(&workerd::binary().display().to_string(), &["--version"]),
        bundle_gz as f64 / 1024.0,
        cold(&cold_ours),
        cold(&cold_peer),
    );
    md.push('\n');
    md.push_str(&users_section);
    // A section measured by hand (e.g. against an older build) is kept as it was.
    let old = std::fs::read_to_string(root().join("BENCHMARKS.md")).unwrap_or_default();
    if let Some(at) = old.find(BY_HAND) {
        md.push('\n');
        md.push_str(&old[at + 1..]);
    }
    std::fs::write(root().join("BENCHMARKS.md"), md).map_err(|e| e.to_string())?;
    eprintln!("xtask: wrote BENCHMARKS.md and BENCHMARKS.svg");
    Ok(())
}
