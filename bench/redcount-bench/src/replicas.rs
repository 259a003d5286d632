//! `redcount-bench replicas`: what waiting for a replica costs writes of money (`redcount serve
//! --wait-replicas 1`: `WAIT 1 <ms>` after each counter or red-packet script, on connections
//! of their own): counter adds and red-packet grabs over direct RESP, one shared connection as
//! `serve` has it, without and with the wait, three interleaved rounds; throughput, latency
//! and the Redis CPU time per call of the master and of its replica.

use std::time::Duration;

use redcount::Direct;
use redcount::direct::ReplicaWait;
use redcount_core::ops::counter::{AddCounter, Bounds, Storage};
use redcount_core::ops::redpacket::{self, Create, Grab, GrabOutcome};

use crate::Error;
use crate::harness::{Row, Shape, ms, run_ops};

const COUNTER: &str = "counter add";
const GRAB: &str = "redpacket grab";
const PLAIN: &str = "no wait";
const WAITED: &str = "WAIT 1 replica";

/// A measured row and the master's and the replica's CPU time per call (µs).
struct Measured {
    row: Row,
    master_cpu: f64,
    replica_cpu: f64,
}

/// `INFO section` of `redis`.
async fn info(redis: &Direct, section: &str) -> Result<String, Error> {
    let reply = redis.send(&redcount_core::Command::new("INFO").arg(section)).await?;
    reply.into_string("info").map_err(|e| Error::Failed(e.to_string()))
}

/// A Redis's CPU time so far (user + system, `INFO cpu`), in µs.
async fn cpu_us(redis: &Direct) -> Result<f64, Error> {
    let text = info(redis, "cpu").await?;
    let field = |name: &str| -> Option<f64> {
        text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(':')).and_then(|v| v.trim().parse().ok())
    };
    match (field("used_cpu_user"), field("used_cpu_sys")) {
        (Some(u), Some(s)) => Ok((u + s) * 1e6),
        _ => Err(Error::Failed(format!("INFO cpu without used_cpu_user / used_cpu_sys: {text}"))),
    }
}

/// Waits until `replica` is in sync with its master.
async fn synced(replica: &Direct) -> Result<(), Error> {
    for _ in 0..200 {
        if info(replica, "replication").await?.contains("master_link_status:up") {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(Error::Failed("the replica did not sync with its master within 20 s".into()))
}

/// One measurement: `ops` calls of `scenario` through `d` (shared by every client, as `serve`
/// shares its connection), with the CPU time both Redis processes spent on them.
async fn once(
    scenario: &'static str,
    variant: &'static str,
    d: &Direct,
    stats: (&Direct, &Direct),
    s: Shape,
) -> Result<Measured, Error> {
    let clients = vec![d.clone(); s.concurrency];
    let run = format!("{:x}", rand::random::<u32>());
    let (m0, r0) = (cpu_us(stats.0).await?, cpu_us(stats.1).await?);
    let t = if scenario == COUNTER {
        // Over 1,000 subjects, key storage.
        let make = move |i: usize| {
            Ok(AddCounter::new("bench-wait", &format!("{run}-{}", i % 1000), Storage::Key, 1, Bounds::default())?)
        };
        run_ops(None, clients, s.ops, make, |o| o.value > 0).await
    } else {
        // Packets of 10,000 shares (one per 10,000 calls): every grab wins.
        let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::from_os_rng();
        let packets: Vec<String> = (0..s.ops.div_ceil(10_000)).map(|_| redpacket::new_id(&mut rng)).collect();
        for id in &packets {
            stats.0.run(&Create::new(id, 100_000_000, 10_000, 1, 3_600_000, &mut rng)?).await?;
        }
        let packets = std::sync::Arc::new(packets);
        let make = move |i: usize| Ok(Grab::new(&packets[i / 10_000], &format!("u{run}-{i}"))?);
        run_ops(None, clients, s.ops, make, |o| matches!(o, GrabOutcome::Won { .. })).await
    };
    let (m1, r1) = (cpu_us(stats.0).await?, cpu_us(stats.1).await?);
    let row = Row::new(scenario, variant, &t);
    if row.errors > 0 || row.successes != row.ops as u64 {
        return Err(Error::Failed(format!(
            "{scenario}, {variant}: {} errors, {} of {} succeeded",
            row.errors, row.successes, row.ops
        )));
    }
    Ok(Measured { row, master_cpu: (m1 - m0) / s.ops as f64, replica_cpu: (r1 - r0) / s.ops as f64 })
}

/// Runs both scenarios without and with the wait (`wait_ms`), three interleaved rounds, and
/// returns the table: every measurement, then the medians of with / without.
pub async fn run(master: &str, replica: &str, wait_ms: u64, s: Shape) -> Result<String, Error> {
    let timeout = Duration::from_secs(5);
    let (stats_master, stats_replica) = (Direct::connect(master).await?, Direct::connect(replica).await?);
    synced(&stats_replica).await?;
    let plain = Direct::connect_with(master, timeout).await?;
    let wait = ReplicaWait { replicas: 1, timeout: Duration::from_millis(wait_ms) };
    let waited = Direct::connect_waiting(master, false, timeout, wait).await?;
    let stats = (&stats_master, &stats_replica);
    // Warm up: script caches, connections.
    for d in [&plain, &waited] {
        once(COUNTER, PLAIN, d, stats, Shape { ops: 1_000, concurrency: s.concurrency }).await?;
    }
    let mut all: Vec<Measured> = Vec::new();
    for round in 0..3 {
        eprintln!("replicas: round {}/3 …", round + 1);
        for scenario in [COUNTER, GRAB] {
            let order = if round % 2 == 0 {
                [(PLAIN, &plain), (WAITED, &waited)]
            } else {
                [(WAITED, &waited), (PLAIN, &plain)]
            };
            for (variant, d) in order {
                all.push(once(scenario, variant, d, stats, s).await?);
            }
        }
    }
    let mut out = format!(
        "{} concurrent calls through one `Direct` (as `redcount serve --redis` runs them; with the wait, its {} connections\n\
         for such calls), {} calls per measurement, 3 interleaved rounds; a replica on the same machine, `WAIT 1 {wait_ms}`.\n\
         CPU is each Redis process's own (`INFO cpu`, user + system) over the calls.\n\n\
         | scenario | variant | ops/s | p50 ms | p99 ms | master CPU per call | replica CPU per call |\n|---|---|---:|---:|---:|---:|---:|\n",
        s.concurrency,
        redcount::direct::WAIT_LANES,
        s.ops
    );
    for m in &all {
        out.push_str(&format!(
            "| {} | {} | {:.0} | {} | {} | {:.1} µs | {:.1} µs |\n",
            m.row.scenario,
            m.row.variant,
            m.row.ops_per_sec(),
            ms(m.row.p50),
            ms(m.row.p99),
            m.master_cpu,
            m.replica_cpu
        ));
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    out.push_str(
        "\n| scenario | with / without: throughput | p50 added | p99 added | master CPU per call | replica CPU per call |\n|---|---:|---:|---:|---:|---:|\n",
    );
    for scenario in [COUNTER, GRAB] {
        let pick =
            |v: &str| all.iter().filter(|m| m.row.scenario == scenario && m.row.variant == v).collect::<Vec<_>>();
        let (p, w) = (pick(PLAIN), pick(WAITED));
        let med = |v: &[&Measured], f: fn(&Measured) -> f64| median(v.iter().map(|m| f(m)).collect());
        out.push_str(&format!(
            "| {scenario} | **{:.2}x** | {:+.3} ms | {:+.3} ms | {:.2}x | {:.2}x |\n",
            med(&w, |m| m.row.ops_per_sec()) / med(&p, |m| m.row.ops_per_sec()),
            med(&w, |m| m.row.p50.as_secs_f64() * 1e3) - med(&p, |m| m.row.p50.as_secs_f64() * 1e3),
            med(&w, |m| m.row.p99.as_secs_f64() * 1e3) - med(&p, |m| m.row.p99.as_secs_f64() * 1e3),
            med(&w, |m| m.master_cpu) / med(&p, |m| m.master_cpu),
            med(&w, |m| m.replica_cpu) / med(&p, |m| m.replica_cpu),
        ));
    }
    Ok(out)
}
