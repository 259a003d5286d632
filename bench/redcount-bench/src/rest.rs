//! `redcount-bench rest`: red-packet grabs and quota calls, direct RESP vs an
//! Upstash-compatible REST front in front of the same Redis, three interleaved rounds.

use std::sync::Arc;

use redcount_core::Operation;
use redcount_core::ops::quota::{Algorithm, TakeQuota};
use redcount_core::ops::redpacket::{self, Create, Grab, GrabOutcome};

use crate::harness::{LeanRest, Row, Shape, connect_all, ms, run_ops};
use redcount::{Direct, Driver};

use crate::Error;

const GRAB: &str = "redpacket grab";
const QUOTA: &str = "quota take";
const DIRECT: &str = "direct RESP";
const REST: &str = "REST front";

/// Runs both scenarios through both transports, three rounds; returns the rows in order, each
/// with the load generator's own CPU time per operation (this process's, µs).
pub async fn run(redis: &str, rest_url: &str, token: &str, s: Shape) -> Result<Vec<(Row, f64)>, Error> {
    let direct = || connect_all(s.concurrency, || Direct::connect(redis));
    let rest = || connect_all(s.concurrency, || LeanRest::connect(rest_url, token));
    // Warm up both paths (script caches, connections).
    grab_storm("warm", direct().await?, 2_000).await?;
    grab_storm("warm", rest().await?, 2_000).await?;
    let mut rows = Vec::new();
    // Interleaved, so drift on a noisy machine hits both transports alike.
    for round in 0..3 {
        eprintln!("round {}/3 …", round + 1);
        rows.push(timed(grab_storm(DIRECT, direct().await?, s.ops)).await?);
        rows.push(timed(grab_storm(REST, rest().await?, s.ops)).await?);
        rows.push(timed(quota_burst(DIRECT, direct().await?, s.ops)).await?);
        rows.push(timed(quota_burst(REST, rest().await?, s.ops)).await?);
    }
    Ok(rows)
}

/// A row, with this process's CPU time per operation while it ran (µs).
async fn timed(row: impl Future<Output = Result<Row, Error>>) -> Result<(Row, f64), Error> {
    let me = std::process::id();
    let before = cpu_us(me)?;
    let row = row.await?;
    let cpu = (cpu_us(me)? - before) / row.ops as f64;
    Ok((row, cpu))
}

/// Red-packet storm: `ops` distinct users grab from packets of 10,000 shares (one per
/// 10,000 users), so every grab does the full winning path.
async fn grab_storm<D: Driver + Send + Sync + 'static>(
    transport: &'static str,
    clients: Vec<D>,
    ops: usize,
) -> Result<Row, Error> {
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::from_os_rng();
    let packets: Vec<String> = (0..ops.div_ceil(10_000)).map(|_| redpacket::new_id(&mut rng)).collect();
    for id in &packets {
        clients[0].run(&Create::new(id, 100_000_000, 10_000, 1, 3_600_000, &mut rng)?).await?;
    }
    let (packets, run) = (Arc::new(packets), format!("{:x}", rand::random::<u32>()));
    let make = move |i: usize| Ok(Grab::new(&packets[i / 10_000], &format!("u{run}-{i}"))?);
    let t = run_ops(None, clients, ops, make, |o| matches!(o, GrabOutcome::Won { .. })).await;
    Ok(Row::new(GRAB, transport, &t))
}

/// TakeQuota burst: `ops` calls spread over 1,000 subjects, fixed window of 100 per hour.
async fn quota_burst<D: Driver + Send + Sync + 'static>(
    transport: &'static str,
    clients: Vec<D>,
    ops: usize,
) -> Result<Row, Error> {
    let run = format!("{:x}", rand::random::<u32>());
    let algo = Algorithm::FixedWindow { limit: 100, window_ms: 3_600_000 };
    let make = move |i: usize| Ok(TakeQuota::take("bench", &format!("s{run}-{}", i % 1000), algo, 1)?);
    let t = run_ops(None, clients, ops, make, |o| o.allowed).await;
    Ok(Row::new(QUOTA, transport, &t))
}

/// The rows, then REST against direct per scenario (averaged over the rounds), as Markdown.
pub fn markdown(timed: &[(Row, f64)], s: Shape) -> String {
    let mut table = format!(
        "concurrency {}, {} ops per row; the load generator's CPU per operation is this process's\n\
         (user + system, from `/proc`, 10 ms ticks) over the row\n\n\
         | scenario | transport | ops/s | p50 ms | p99 ms | errors | successes | load generator CPU per op |\n\
         |---|---|---|---|---|---|---|---:|\n",
        s.concurrency, s.ops
    );
    for (r, cpu) in timed {
        table.push_str(&format!(
            "| {} | {} | {:.0} | {} | {} | {} | {} | {cpu:.1} µs |\n",
            r.scenario,
            r.variant,
            r.ops_per_sec(),
            ms(r.p50),
            ms(r.p99),
            r.errors,
            r.successes
        ));
    }
    let rows: Vec<&Row> = timed.iter().map(|(r, _)| r).collect();
    table.push_str("\n| scenario | REST/direct throughput | p99 added by the front (ms) |\n|---|---|---|\n");
    for scenario in [GRAB, QUOTA] {
        let pick =
            |t: &str| rows.iter().copied().filter(|r| r.scenario == scenario && r.variant == t).collect::<Vec<_>>();
        let (d, r) = (pick(DIRECT), pick(REST));
        let tput = |v: &[&Row]| v.iter().map(|m| m.ops_per_sec()).sum::<f64>() / v.len() as f64;
        let p99 = |v: &[&Row]| v.iter().map(|m| m.p99.as_secs_f64() * 1000.0).sum::<f64>() / v.len() as f64;
        table.push_str(&format!("| {scenario} | {:.2}x | {:+.3} |\n", tput(&r) / tput(&d), p99(&r) - p99(&d)));
    }
    table
}

/// Where the two HTTP fronts of one Redis are, and their processes (for CPU time).
#[derive(Debug, Clone)]
pub struct Fronts {
    /// redcount-rest (`http://host:port`) and its token.
    pub rest_url: String,
    /// The token.
    pub token: String,
    /// redcount-rest's process id.
    pub rest_pid: u32,
    /// webdis (`http://host:port`), in front of the same Redis.
    pub webdis_url: String,
    /// webdis's process id.
    pub webdis_pid: u32,
}

/// A process's CPU time so far (user + system, every thread), in µs, from `/proc/PID/stat`.
fn cpu_us(pid: u32) -> Result<f64, Error> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map_err(|e| Error::Failed(format!("/proc/{pid}/stat: {e}")))?;
    // Fields after the command name (which may hold spaces, so split after its `)`).
    let fields: Vec<&str> = stat.rsplit_once(')').map(|(_, r)| r.split_whitespace().collect()).unwrap_or_default();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok());
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name; clock ticks
    // of 10 ms (USER_HZ is 100 on Linux).
    match (ticks(11), ticks(12)) {
        (Some(u), Some(s)) => Ok((u + s) * 10_000.0),
        _ => Err(Error::Failed(format!("/proc/{pid}/stat: no CPU times"))),
    }
}

/// A command as webdis takes it in a POST body: its words joined by `/`, each escaped.
fn webdis_path(parts: &[String]) -> String {
    let escape = |w: &str| {
        w.bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() || b"-_.".contains(&b) {
                    (b as char).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect::<String>()
    };
    parts.iter().map(|p| escape(p)).collect::<Vec<_>>().join("/")
}

/// One measurement of one front: `ops` requests over `concurrency` connections; returns the
/// row, the front's CPU time per request and the load generator's own (this process, µs):
/// a generator that needs as much CPU as the front caps both fronts' throughput alike.
async fn front_once(
    f: &Fronts,
    webdis: bool,
    job: &'static str,
    command: Arc<dyn Fn(usize) -> redcount_core::Command + Send + Sync>,
    s: Shape,
) -> Result<(Row, f64, f64), Error> {
    let me = std::process::id();
    let variant = if webdis { "webdis" } else { "redcount-rest" };
    let pid = if webdis { f.webdis_pid } else { f.rest_pid };
    let totals = if webdis {
        let clients = connect_all(s.concurrency, || crate::harness::KeptAlive::connect(&f.webdis_url, &[])).await?;
        for c in &clients {
            c.post("/", "PING").await?;
        }
        let before = (cpu_us(pid)?, cpu_us(me)?);
        let t = crate::harness::drive(None, clients, s.ops, move |c, i| {
            let body = webdis_path(command(i).parts());
            async move {
                let (status, reply) = c.post("/", &body).await?;
                // A Redis error comes back as `[false, "…"]` with status 200 too.
                Ok(crate::harness::Sample::one(status == 200 && !reply.starts_with(b"{\"EVALSHA\":[false")))
            }
        })
        .await;
        (t, cpu_us(pid)? - before.0, cpu_us(me)? - before.1)
    } else {
        let clients = connect_all(s.concurrency, || LeanRest::connect(&f.rest_url, &f.token)).await?;
        for c in &clients {
            c.send(&redcount_core::Command::new("PING")).await?;
        }
        let before = (cpu_us(pid)?, cpu_us(me)?);
        let t = crate::harness::drive(None, clients, s.ops, move |c, i| {
            let cmd = command(i);
            async move { Ok(crate::harness::Sample::one(c.send(&cmd).await.is_ok())) }
        })
        .await;
        (t, cpu_us(pid)? - before.0, cpu_us(me)? - before.1)
    };
    let (t, cpu, generator) = totals;
    Ok((Row::new(job, variant, &t), cpu / s.ops as f64, generator / s.ops as f64))
}

/// redcount-rest beside webdis, the same Redis behind both: INCR, and EVALSHA of redcount's
/// fixed-window take (never denied), three interleaved rounds (the order of the fronts turning
/// each round); throughput and each front's CPU time per request, medians, as Markdown.
pub async fn fronts(f: &Fronts, s: Shape) -> Result<String, Error> {
    let run = format!("{:x}", rand::random::<u32>());
    let algo = Algorithm::FixedWindow { limit: 1_000_000_000, window_ms: 3_600_000 };
    // Load the script once (EVALSHA then EVAL), so every measured call is an EVALSHA.
    let loader = LeanRest::connect(&f.rest_url, &f.token).await?;
    loader.run(&TakeQuota::take("bench-front", &format!("f{run}"), algo, 1)?).await?;
    let incr: Arc<dyn Fn(usize) -> redcount_core::Command + Send + Sync> = {
        let run = run.clone();
        Arc::new(move |i| redcount_core::Command::new("INCR").arg(format!("front:{run}:{}", i % 1000)))
    };
    let take: Arc<dyn Fn(usize) -> redcount_core::Command + Send + Sync> = {
        let run = run.clone();
        Arc::new(move |i| {
            TakeQuota::take("bench-front", &format!("f{run}-{}", i % 1000), algo, 1)
                .map(|op| op.request().command())
                .unwrap_or_else(|_| redcount_core::Command::new("PING"))
        })
    };
    let jobs = [("INCR", incr), ("EVALSHA (quota take)", take)];
    // [job][front] -> (ops/s, cpu µs, generator cpu µs) per round
    let mut m: Vec<[Vec<(f64, f64, f64)>; 2]> = vec![[Vec::new(), Vec::new()], [Vec::new(), Vec::new()]];
    for round in 0..3 {
        eprintln!("fronts: round {}/3 …", round + 1);
        for (j, (job, cmd)) in jobs.iter().enumerate() {
            let order = if round % 2 == 0 { [false, true] } else { [true, false] };
            for webdis in order {
                let (row, cpu, generator) = front_once(f, webdis, job, cmd.clone(), s).await?;
                if row.successes != row.ops as u64 {
                    return Err(Error::Failed(format!(
                        "{job} through {}: {} of {} failed",
                        row.variant,
                        row.ops as u64 - row.successes,
                        row.ops
                    )));
                }
                m[j][usize::from(webdis)].push((row.ops_per_sec(), cpu, generator));
            }
        }
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let mut out = format!(
        "{} connections, {} requests per measurement, 3 interleaved rounds (medians); CPU per request is\n\
         the front process's own CPU time (user + system, from `/proc`) over the requests it answered;\n\
         the load generator's is this process's over the same requests (when it needs as much as a\n\
         front, the machine's cores, not the front, set both fronts' ops/s).\n\n\
         | command | front | ops/s | ops/s per round | CPU per request | per round | load generator CPU per request |\n\
         |---|---|---:|---|---:|---|---:|\n",
        s.concurrency, s.ops
    );
    for (j, (job, _)) in jobs.iter().enumerate() {
        for (k, name) in ["redcount-rest", "webdis"].into_iter().enumerate() {
            let v = &m[j][k];
            let per = |g: fn(&(f64, f64, f64)) -> f64, unit: &str| {
                v.iter().map(|x| format!("{:.0}{unit}", g(x))).collect::<Vec<_>>().join(" / ")
            };
            out.push_str(&format!(
                "| {job} | {name} | {:.0} | {} | {:.1} µs | {} | {:.1} µs |\n",
                median(v.iter().map(|x| x.0).collect()),
                per(|x| x.0, ""),
                median(v.iter().map(|x| x.1).collect()),
                per(|x| x.1, " µs"),
                median(v.iter().map(|x| x.2).collect()),
            ));
        }
        let ratio =
            |g: fn(&(f64, f64, f64)) -> f64| median(m[j][0].iter().zip(&m[j][1]).map(|(a, b)| g(a) / g(b)).collect());
        out.push_str(&format!(
            "| {job} | **redcount-rest / webdis** | **{:.2}x** | | **{:.2}x** | | |\n",
            ratio(|x| x.0),
            ratio(|x| x.1)
        ));
    }
    Ok(out)
}
