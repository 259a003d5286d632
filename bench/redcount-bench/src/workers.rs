//! `redcount-bench workers`: the redcount worker against the @upstash/ratelimit peer worker
//! and a one-fetch floor worker, each served by workerd directly (no wrangler dev proxy in
//! front), at several connection counts, in interleaved rounds, beside a worker that answers
//! without any I/O (workerd's own latency and pauses); one more row for the redcount worker
//! under wrangler dev, for reference.
//!
//! Every request is a quota call that is never denied (fresh subjects, far under the limit;
//! `POST` with an empty body, so the default cost of 1),
//! so each worker does exactly one REST round trip per request. Figures are medians over
//! rounds; the ratios that are the goals are computed from the same run.

use crate::Error;
use crate::harness::{LeanHttp, Row, Sample, connect_all, drive};

/// One worker under test.
#[derive(Debug, Clone)]
pub struct Target {
    /// Its name in the tables.
    pub name: &'static str,
    /// Base URL (`http://127.0.0.1:PORT`).
    pub url: String,
    /// The route prefix a subject is appended to (`POST {path}/{subject}`).
    pub path: &'static str,
    /// The JSON field that must be `true` in each answer, if any (the floor and the no-I/O
    /// worker answer PING).
    pub field: Option<&'static str>,
}

/// The workers and how hard to drive them.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The redcount worker, the peer, the floor and (optionally) the no-I/O worker, under workerd.
    pub targets: Vec<Target>,
    /// The redcount worker under wrangler dev (one row, at `reference_conns`).
    pub wrangler_dev: Option<Target>,
    /// Connection counts.
    pub conns: Vec<usize>,
    /// Rounds (each runs every target at every connection count; the order of targets turns
    /// from round to round).
    pub rounds: usize,
    /// Requests per measurement at one connection; 2.5 times as many at 10 connections and
    /// more, so each measurement lasts a few seconds.
    pub ops: usize,
    /// Connections of the wrangler-dev row.
    pub reference_conns: usize,
}

/// The measurements of one target at one connection count, one per round.
#[derive(Debug, Clone)]
pub struct Series {
    /// Target name.
    pub name: &'static str,
    /// Connections.
    pub conns: usize,
    /// One row per round.
    pub rounds: Vec<Row>,
}

impl Series {
    fn median(&self, f: impl Fn(&Row) -> f64) -> f64 {
        let mut v: Vec<f64> = self.rounds.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        if v.is_empty() { 0.0 } else { v[v.len() / 2] }
    }

    /// Median throughput over rounds.
    pub fn ops_per_sec(&self) -> f64 {
        self.median(Row::ops_per_sec)
    }

    /// Median p99 over rounds, in ms.
    pub fn p99_ms(&self) -> f64 {
        self.median(|r| r.p99.as_secs_f64() * 1000.0)
    }

    /// Median p99.9 over rounds, in ms.
    pub fn p999_ms(&self) -> f64 {
        self.median(|r| r.p999.as_secs_f64() * 1000.0)
    }

    /// Share of all requests, over every round, that took 20 ms or more (%).
    pub fn slow_pct(&self) -> f64 {
        let ops: usize = self.rounds.iter().map(|r| r.ops).sum();
        100.0 * self.rounds.iter().map(|r| r.slow).sum::<usize>() as f64 / ops.max(1) as f64
    }

    /// Median p50 over rounds, in ms.
    pub fn p50_ms(&self) -> f64 {
        self.median(|r| r.p50.as_secs_f64() * 1000.0)
    }

    /// Requests that failed or were not allowed, over all rounds.
    pub fn failures(&self) -> u64 {
        self.rounds.iter().map(|r| r.errors + (r.ops as u64 - r.successes)).sum()
    }
}

fn ops_at(plan: &Plan, conns: usize) -> usize {
    if conns >= 10 { plan.ops * 5 / 2 } else { plan.ops }
}

/// One measurement: `ops` quota calls over `conns` connections, subjects fresh for this run
/// (1,000 of them, so none comes near a limit).
async fn measure(t: &Target, conns: usize, ops: usize) -> Result<Row, Error> {
    let run = format!("{:08x}", rand::random::<u32>());
    let clients = connect_all(conns, || LeanHttp::connect(&t.url)).await?;
    // Open every connection before the clock starts: a cold connection is not the worker's cost.
    for c in &clients {
        c.post(&format!("{}/warm{run}", t.path), &[], String::new()).await?;
    }
    let (path, field) = (t.path, t.field);
    let label = format!("{} · {conns} conns", t.name);
    let totals = drive(Some(&label), clients, ops, move |d, i| {
        let path = format!("{path}/w{run}-{}", i % 1000);
        async move {
            // No body: the quota route takes its default cost (1); the peer and the floor read none.
            let (status, body) = d.post(&path, &[], String::new()).await?;
            let ok = status == 200
                && field.is_none_or(|f| {
                    serde_json::from_slice::<serde_json::Value>(&body).ok().and_then(|v| v.get(f).cloned())
                        == Some(serde_json::Value::Bool(true))
                });
            Ok(Sample::one(ok))
        }
    })
    .await;
    Ok(Row::new("workers under workerd", t.name, &totals))
}

/// Runs the plan: every target at every connection count, `rounds` times, the order of
/// targets rotated each round; then the wrangler-dev row. Returns the series and that row.
pub async fn run(plan: &Plan) -> Result<(Vec<Series>, Option<Series>), Error> {
    // Warm every worker (workerd compiles on first use; the front loads the scripts).
    for t in plan.targets.iter().chain(&plan.wrangler_dev) {
        measure(t, 1, 200).await?;
    }
    let mut series: Vec<Series> = Vec::new();
    for round in 0..plan.rounds {
        for &conns in &plan.conns {
            let n = plan.targets.len();
            for k in 0..n {
                let t = &plan.targets[(k + round) % n];
                let row = measure(t, conns, ops_at(plan, conns)).await?;
                match series.iter_mut().find(|s| s.name == t.name && s.conns == conns) {
                    Some(s) => s.rounds.push(row),
                    None => series.push(Series { name: t.name, conns, rounds: vec![row] }),
                }
            }
        }
    }
    series.sort_by_key(|s| (plan.targets.iter().position(|t| t.name == s.name), s.conns));
    let reference = match &plan.wrangler_dev {
        Some(t) => {
            let conns = plan.reference_conns;
            let row = measure(t, conns, ops_at(plan, conns)).await?;
            Some(Series { name: t.name, conns, rounds: vec![row] })
        }
        None => None,
    };
    Ok((series, reference))
}

/// The ratios of `a` to `b` (throughput, p99) round by round, each round's two measurements
/// taken close together (so under the same background load); their medians.
fn paired(a: &Series, b: &Series) -> (f64, f64) {
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        if v.is_empty() { f64::NAN } else { v[v.len() / 2] }
    };
    let rounds = a.rounds.iter().zip(&b.rounds);
    let x = median(rounds.clone().map(|(a, b)| a.ops_per_sec() / b.ops_per_sec()).collect());
    let p99 = median(rounds.map(|(a, b)| a.p99.as_secs_f64() / b.p99.as_secs_f64()).collect());
    (x, p99)
}

/// The tables: each series' medians, then the goal ratios between `ours`, `peer` and `floor`
/// (target names) at each connection count.
pub fn markdown(series: &[Series], reference: Option<&Series>, ours: &str, peer: &str, floor: &str) -> String {
    let rounds = series.iter().map(|s| s.rounds.len()).max().unwrap_or(0);
    let mut out = format!(
        "Medians of {rounds} interleaved rounds (each round runs every worker at every connection count, \
         the workers' order turning each round); a quota call per request, never denied.\n\n\
         | worker | served by | conns | ops/s | p50 ms | p99 ms | p99.9 ms | ≥ 20 ms | ops/s per round | failed |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---|---:|\n"
    );
    let line = |s: &Series, served: &str| {
        let per: Vec<String> = s.rounds.iter().map(|r| format!("{:.0}", r.ops_per_sec())).collect();
        format!(
            "| {} | {served} | {} | {:.0} | {:.2} | {:.2} | {:.2} | {:.2}% | {} | {} |\n",
            s.name,
            s.conns,
            s.ops_per_sec(),
            s.p50_ms(),
            s.p99_ms(),
            s.p999_ms(),
            s.slow_pct(),
            per.join(" / "),
            s.failures()
        )
    };
    for s in series {
        out.push_str(&line(s, "workerd"));
    }
    if let Some(r) = reference {
        out.push_str(&line(r, "wrangler dev (reference)"));
    }
    let find = |name: &str, conns: usize| series.iter().find(|s| s.name == name && s.conns == conns);
    out.push_str(
        "\nRatios are medians of the per-round ratios (each round measures the workers one after the \
         other, under the same background load).\n\n\
         | ratio (same run) | conns | throughput | p99 | goal | met |\n|---|---:|---:|---:|---|---|\n",
    );
    let mut conns: Vec<usize> = series.iter().map(|s| s.conns).collect();
    conns.sort_unstable();
    conns.dedup();
    for &c in &conns {
        if let (Some(o), Some(p)) = (find(ours, c), find(peer, c)) {
            let (x, p99) = paired(o, p);
            out.push_str(&format!(
                "| {ours} / {peer} | {c} | {x:.2}x | {p99:.2}x ({:.2} vs {:.2} ms) | ≥ 1.2x, p99 ≤ 1.0x | {} |\n",
                o.p99_ms(),
                p.p99_ms(),
                if x >= 1.2 && p99 <= 1.0 { "yes" } else { "no" }
            ));
        }
    }
    for &c in &conns {
        if let (Some(o), Some(f)) = (find(ours, c), find(floor, c)) {
            let (x, p99) = paired(o, f);
            let goal = c >= 50;
            out.push_str(&format!(
                "| {ours} / {floor} | {c} | {x:.2}x | {p99:.2}x | {} | {} |\n",
                if goal { "≥ 0.8x" } else { "—" },
                if !goal {
                    "—"
                } else if x >= 0.8 {
                    "yes"
                } else {
                    "no"
                }
            ));
        }
    }
    out
}
