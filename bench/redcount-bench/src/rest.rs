//! `redcount bench rest`: red-packet grabs and quota calls, direct RESP vs an
//! Upstash-compatible REST front in front of the same Redis, three interleaved rounds.

use std::sync::Arc;

use redcount_core::ops::quota::{Algorithm, TakeQuota};
use redcount_core::ops::redpacket::{self, Create, Grab, GrabOutcome};

use crate::harness::{LeanRest, Row, Shape, connect_all, ms, run_ops};
use redcount::{Direct, Driver};

use crate::Error;

const GRAB: &str = "redpacket grab";
const QUOTA: &str = "quota take";
const DIRECT: &str = "direct RESP";
const REST: &str = "REST front";

/// Runs both scenarios through both transports, three rounds; returns the rows in order.
pub async fn run(redis: &str, rest_url: &str, token: &str, s: Shape) -> Result<Vec<Row>, Error> {
    let direct = || connect_all(s.concurrency, || Direct::connect(redis));
    let rest = || connect_all(s.concurrency, || LeanRest::connect(rest_url, token));
    // Warm up both paths (script caches, connections).
    grab_storm("warm", direct().await?, 2_000).await?;
    grab_storm("warm", rest().await?, 2_000).await?;
    let mut rows = Vec::new();
    // Interleaved, so drift on a noisy machine hits both transports alike.
    for round in 0..3 {
        eprintln!("round {}/3 …", round + 1);
        rows.push(grab_storm(DIRECT, direct().await?, s.ops).await?);
        rows.push(grab_storm(REST, rest().await?, s.ops).await?);
        rows.push(quota_burst(DIRECT, direct().await?, s.ops).await?);
        rows.push(quota_burst(REST, rest().await?, s.ops).await?);
    }
    Ok(rows)
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
pub fn markdown(rows: &[Row], s: Shape) -> String {
    let mut table = format!(
        "concurrency {}, {} ops per row\n\n| scenario | transport | ops/s | p50 ms | p99 ms | errors | successes |\n|---|---|---|---|---|---|---|\n",
        s.concurrency, s.ops
    );
    for r in rows {
        table.push_str(&format!(
            "| {} | {} | {:.0} | {} | {} | {} | {} |\n",
            r.scenario,
            r.variant,
            r.ops_per_sec(),
            ms(r.p50),
            ms(r.p99),
            r.errors,
            r.successes
        ));
    }
    table.push_str("\n| scenario | REST/direct throughput | p99 added by the front (ms) |\n|---|---|---|\n");
    for scenario in [GRAB, QUOTA] {
        let pick = |t: &str| rows.iter().filter(|r| r.scenario == scenario && r.variant == t).collect::<Vec<_>>();
        let (d, r) = (pick(DIRECT), pick(REST));
        let tput = |v: &[&Row]| v.iter().map(|m| m.ops_per_sec()).sum::<f64>() / v.len() as f64;
        let p99 = |v: &[&Row]| v.iter().map(|m| m.p99.as_secs_f64() * 1000.0).sum::<f64>() / v.len() as f64;
        table.push_str(&format!("| {scenario} | {:.2}x | {:+.3} |\n", tput(&r) / tput(&d), p99(&r) - p99(&d)));
    }
    table
}
