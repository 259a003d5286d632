//! `redcount-bench all`: every scenario through every variant, side by side, one run.
//!
//! Variants: redcount's Lua over RESP, through redcount-rest, through the worker's HTTP
//! API; and what a developer would write without scripts: GET-check-write in separate
//! round trips, write-then-undo on overflow, and WATCH/MULTI/EXEC with retries. After each
//! run the invariants are checked against Redis itself.

use redcount_core::ops::counter::{AddCounter, Bounds, CounterStatus, GetCounter, Storage};
use redcount_core::ops::quota::{Algorithm, TakeQuota};
use redcount_core::ops::redpacket::{self, Create, Grab, GrabOutcome, ReadStatus};
use redcount_core::{Command, Value};

use crate::harness::{LeanHttp, LeanRest, Row, Sample, Shape, Totals, connect_all, drive, ms, run_ops};
use redcount::Direct;

use crate::Error;
use redcount_core::Operation;

/// Where each variant sends its load.
#[derive(Debug, Clone)]
pub struct Targets {
    /// Redis, for the RESP variants and for checking invariants.
    pub redis: String,
    /// redcount-rest and its token.
    pub rest: Option<(String, String)>,
    /// The redcount worker (wrangler dev) and its admin token.
    pub worker: Option<(String, String)>,
    /// The @upstash/ratelimit peer worker.
    pub peer: Option<String>,
}

async fn directs(url: &str, n: usize) -> Result<Vec<Direct>, Error> {
    connect_all(n, || Direct::connect(url)).await
}

async fn https(url: &str, n: usize) -> Result<Vec<LeanHttp>, Error> {
    connect_all(n, || LeanHttp::connect(url)).await
}

/// Redis reached by redcount's Lua: over RESP, or through the REST front.
enum Lua {
    Resp(Vec<Direct>),
    Rest(Vec<LeanRest>),
}

/// The Lua transports under test, each with its own `n` connections.
async fn lua_transports(t: &Targets, n: usize) -> Result<Vec<(&'static str, Lua)>, Error> {
    let mut v = vec![("Lua over RESP", Lua::Resp(directs(&t.redis, n).await?))];
    if let Some((url, token)) = &t.rest {
        v.push(("Lua via redcount-rest", Lua::Rest(connect_all(n, || LeanRest::connect(url, token)).await?)));
    }
    Ok(v)
}

impl Lua {
    /// Runs `ops` operations `make(i)`, one round trip each; `ok` says which succeeded.
    async fn run<O, F>(self, label: &str, ops: usize, make: F, ok: fn(&O::Outcome) -> bool) -> Totals
    where
        O: Operation + Send + Sync + 'static,
        O::Outcome: Send,
        F: Fn(usize) -> Result<O, Error> + Send + Sync + 'static,
    {
        // Two arms, since each transport is its own driver type.
        match self {
            Lua::Resp(d) => run_ops(Some(label), d, ops, make, ok).await,
            Lua::Rest(d) => run_ops(Some(label), d, ops, make, ok).await,
        }
    }
}

/// POSTs `body` to an HTTP API route and returns `field` of its reply; a status other than
/// 200 is an error.
async fn api_field(d: &LeanHttp, path: &str, body: String, field: &str) -> Result<Option<serde_json::Value>, Error> {
    let (status, body) = d.post(path, &[], body).await?;
    if status != 200 {
        return Err(Error::Failed(format!("HTTP {status}")));
    }
    Ok(json_field(&body, field))
}

fn int(v: &Value) -> i64 {
    v.to_int("bench").unwrap_or(0)
}

fn cmd(parts: &[&str]) -> Command {
    let mut c = Command::new(parts[0]);
    for p in &parts[1..] {
        c.push(*p);
    }
    c
}

fn json_field(body: &[u8], key: &str) -> Option<serde_json::Value> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    v.get(key).cloned()
}

fn run_id() -> String {
    format!("{:08x}", rand::random::<u32>())
}

const SHARES: i64 = 1_000;
const TOTAL: i64 = 1_000_000;

/// Red-packet storm: `ops` distinct users, 1,000 shares.
async fn storm(t: &Targets, s: Shape, rows: &mut Vec<Row>) -> Result<(), Error> {
    const SC: &str = "red-packet storm";
    let check = Direct::connect(&t.redis).await?;
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::from_os_rng();
    let users = s.ops;
    let want_won = (users as i64).min(SHARES) as u64;

    // Lua, through each transport.
    let lua_verify = |won: u64, st: Option<redpacket::PacketStatus>| -> (u64, String) {
        let st = st.expect("packet exists");
        let over = won.saturating_sub(SHARES as u64) + (st.grabbed as u64).saturating_sub(SHARES as u64);
        let bad_sum = (users as i64 >= SHARES && st.grabbed_sum != TOTAL) as u64;
        (
            over + bad_sum + (won != want_won) as u64,
            if over + bad_sum > 0 { format!("{over} over-issued") } else { String::new() },
        )
    };
    for (variant, lua) in lua_transports(t, s.concurrency).await? {
        let id = redpacket::new_id(&mut rng);
        check.run(&Create::new(&id, TOTAL, SHARES, 1, 3_600_000, &mut rng)?).await?;
        let (run, idc) = (run_id(), id.clone());
        let make = move |i: usize| Ok(Grab::new(&idc, &format!("u{run}-{i}"))?);
        let tt = lua.run(&format!("storm · {variant}"), users, make, |o| matches!(o, GrabOutcome::Won { .. })).await;
        let (v, note) = lua_verify(tt.ok, check.run(&ReadStatus::new(&id)?).await?);
        rows.push(Row::new(SC, variant, &tt).checked(v, note));
    }
    if let Some((url, admin)) = &t.worker {
        let http = LeanHttp::connect(url).await?;
        let auth = format!("Bearer {admin}");
        let (status, body) = http
            .post(
                "/api/redpackets",
                &[("authorization", &auth)],
                format!(r#"{{"total_cents":{TOTAL},"count":{SHARES}}}"#),
            )
            .await?;
        let id = json_field(&body, "id").and_then(|v| v.as_str().map(String::from)).ok_or_else(|| {
            Error::Failed(format!("worker could not create a packet: {status} {}", String::from_utf8_lossy(&body)))
        })?;
        let run = run_id();
        let idc = id.clone();
        let label = Some("storm · worker HTTP API (Lua via REST)");
        let tt = drive(label, https(url, s.concurrency).await?, users, move |d, i| {
            let (path, body) = (format!("/api/redpackets/{idc}/grab"), format!(r#"{{"user":"u{run}-{i}"}}"#));
            async move { Ok(Sample::one(api_field(&d, &path, body, "outcome").await?.is_some_and(|o| o == "won"))) }
        })
        .await;
        let (v, note) = lua_verify(tt.ok, check.run(&ReadStatus::new(&id)?).await?);
        rows.push(Row::new(SC, "worker HTTP API", &tt).checked(v, note));
    }

    // Naive: a share counter, checked and changed in separate round trips.
    for (variant, kind) in
        [("naive GET-check-DECR", 0), ("naive DECR, INCR back on underflow", 1), ("naive WATCH/MULTI/EXEC", 2)]
    {
        let key = format!("bench:naive:{}:left", run_id());
        check.send(&cmd(&["SET", &key, &SHARES.to_string(), "EX", "3600"])).await?;
        let tt =
            drive(Some(&format!("storm · {variant}")), directs(&t.redis, s.concurrency).await?, users, move |d, _| {
                let key = key.clone();
                async move { naive_take(&d, &key, kind).await }
            })
            .await;
        let over = tt.ok.saturating_sub(SHARES as u64);
        let note = if over > 0 { format!("{over} shares over-issued") } else { String::new() };
        rows.push(Row::new(SC, variant, &tt).checked(over, note));
    }
    Ok(())
}

/// Takes one unit from a counter that must not go below zero, the naive ways:
/// 0 = GET then DECR, 1 = DECR then INCR back if negative, 2 = WATCH/MULTI/EXEC with retries.
async fn naive_take(d: &Direct, key: &str, kind: u8) -> Result<Sample, Error> {
    match kind {
        0 => {
            let left = int(&d.send(&cmd(&["GET", key])).await?);
            if left <= 0 {
                return Ok(Sample::one(false));
            }
            let after = int(&d.send(&cmd(&["DECR", key])).await?);
            Ok(Sample { ok: true, round_trips: 2, anomalies: (after < 0) as u32, ..Sample::default() })
        }
        1 => {
            let after = int(&d.send(&cmd(&["DECR", key])).await?);
            if after >= 0 {
                return Ok(Sample::one(true));
            }
            d.send(&cmd(&["INCR", key])).await?;
            // Between the two, every reader saw a negative count.
            Ok(Sample { ok: false, round_trips: 2, anomalies: 1, ..Sample::default() })
        }
        _ => watched(d, key, |left| left > 0, &[cmd(&["DECR", key])]).await,
    }
}

/// The optimistic way: WATCH the key, read it, and if `allowed(value)` queue `writes` in
/// MULTI/EXEC; a nil EXEC means another client wrote first, so start again.
async fn watched(d: &Direct, key: &str, allowed: impl Fn(i64) -> bool, writes: &[Command]) -> Result<Sample, Error> {
    let mut s = Sample::default();
    loop {
        d.send(&cmd(&["WATCH", key])).await?;
        let value = int(&d.send(&cmd(&["GET", key])).await?);
        s.round_trips += 2;
        if !allowed(value) {
            d.send(&cmd(&["UNWATCH"])).await?;
            s.round_trips += 1;
            return Ok(s);
        }
        d.send(&cmd(&["MULTI"])).await?;
        for w in writes {
            d.send(w).await?;
        }
        let exec = d.send(&cmd(&["EXEC"])).await?;
        s.round_trips += 2 + writes.len() as u32;
        if exec != Value::Nil {
            s.ok = true;
            return Ok(s);
        }
        s.retries += 1;
    }
}

/// TakeQuota burst: `ops` calls over 10 subjects, 500 per subject per hour (hot keys: contention).
async fn quota(t: &Targets, s: Shape, rows: &mut Vec<Row>) -> Result<(), Error> {
    const SC: &str = "quota burst";
    const SUBJECTS: usize = 10;
    const LIMIT: i64 = 500;
    let algo = Algorithm::FixedWindow { limit: LIMIT, window_ms: 3_600_000 };
    let want = (s.ops as u64).min(SUBJECTS as u64 * LIMIT as u64);
    let verdict = |allowed: u64| -> (u64, String) {
        let over = allowed.saturating_sub(want);
        let under = want.saturating_sub(allowed);
        let note = match (over, under) {
            (0, 0) => String::new(),
            (o, 0) => format!("{o} calls over the limit"),
            (_, u) => format!("{u} calls wrongly refused"),
        };
        (over + under, note)
    };
    for (variant, lua) in lua_transports(t, s.concurrency).await? {
        let run = run_id();
        let make = move |i: usize| Ok(TakeQuota::take("bench", &format!("s{run}-{}", i % SUBJECTS), algo, 1)?);
        let tt = lua.run(&format!("quota · {variant}"), s.ops, make, |o| o.allowed).await;
        let (v, note) = verdict(tt.ok);
        rows.push(Row::new(SC, variant, &tt).checked(v, note));
    }
    let http_quota = |label: &'static str,
                      url: String,
                      path: &'static str,
                      field: &'static str,
                      clients: usize,
                      ops: usize| async move {
        let run = run_id();
        let tt = drive(Some(label), https(&url, clients).await?, ops, move |d, i| {
            let path = format!("{path}/s{run}-{}", i % SUBJECTS);
            async move {
                let allowed = api_field(&d, &path, String::from("{}"), field).await?;
                Ok(Sample::one(allowed == Some(serde_json::Value::Bool(true))))
            }
        })
        .await;
        Ok::<_, Error>(tt)
    };
    if let Some((url, _)) = &t.worker {
        let tt = http_quota(
            "quota · worker HTTP API",
            url.clone(),
            "/api/quotas/bench-quota",
            "allowed",
            s.concurrency,
            s.ops,
        )
        .await?;
        let (v, note) = verdict(tt.ok);
        rows.push(Row::new(SC, "worker HTTP API", &tt).checked(v, note));
    }
    if let Some(url) = &t.peer {
        let tt = http_quota(
            "quota · peer @upstash/ratelimit worker",
            url.clone(),
            "/limit",
            "allowed",
            s.concurrency,
            s.ops,
        )
        .await?;
        let (v, note) = verdict(tt.ok);
        rows.push(Row::new(SC, "peer: @upstash/ratelimit worker", &tt).checked(v, note));
    }
    for (variant, kind) in
        [("naive GET-check-INCR", 0u8), ("naive INCR, DECR back on overflow", 1), ("naive WATCH/MULTI/EXEC", 2)]
    {
        let run = run_id();
        let tt =
            drive(Some(&format!("quota · {variant}")), directs(&t.redis, s.concurrency).await?, s.ops, move |d, i| {
                let key = format!("bench:naive:{run}:q{}", i % SUBJECTS);
                async move { naive_quota(&d, &key, LIMIT, kind).await }
            })
            .await;
        let (v, note) = verdict(tt.ok);
        rows.push(Row::new(SC, variant, &tt).checked(v, note));
    }
    // One client at a time: wrangler dev's local proxy does not queue, so the two workers'
    // own costs show (at 50 clients both sit at the proxy's ceiling).
    let solo = (s.ops / 10).max(100);
    if let Some((url, _)) = &t.worker {
        let tt =
            http_quota("quota · worker HTTP API, 1 client", url.clone(), "/api/quotas/bench-quota", "allowed", 1, solo)
                .await?;
        // Fresh subjects, well under the limit: every call must be allowed.
        let wrong = (solo as u64).abs_diff(tt.ok);
        rows.push(Row::new("quota, one client", "worker HTTP API", &tt).checked(wrong, String::new()));
    }
    if let Some(url) = &t.peer {
        let tt = http_quota("quota · peer worker, 1 client", url.clone(), "/limit", "allowed", 1, solo).await?;
        let wrong = (solo as u64).abs_diff(tt.ok);
        rows.push(Row::new("quota, one client", "peer: @upstash/ratelimit worker", &tt).checked(wrong, String::new()));
    }
    Ok(())
}

async fn naive_quota(d: &Direct, key: &str, limit: i64, kind: u8) -> Result<Sample, Error> {
    match kind {
        0 => {
            let used = int(&d.send(&cmd(&["GET", key])).await?);
            if used >= limit {
                return Ok(Sample::one(false));
            }
            let n = int(&d.send(&cmd(&["INCR", key])).await?);
            let mut rtt = 2;
            if n == 1 {
                d.send(&cmd(&["EXPIRE", key, "3600"])).await?;
                rtt += 1;
            }
            Ok(Sample { ok: true, round_trips: rtt, ..Sample::default() })
        }
        1 => {
            let n = int(&d.send(&cmd(&["INCR", key])).await?);
            if n == 1 {
                d.send(&cmd(&["EXPIRE", key, "3600"])).await?;
                return Ok(Sample { ok: true, round_trips: 2, ..Sample::default() });
            }
            if n <= limit {
                return Ok(Sample::one(true));
            }
            d.send(&cmd(&["DECR", key])).await?;
            Ok(Sample { ok: false, round_trips: 2, ..Sample::default() })
        }
        _ => watched(d, key, |used| used < limit, &[cmd(&["INCR", key]), cmd(&["EXPIRE", key, "3600"])]).await,
    }
}

/// Counter floor: 10 stocks of 500, `ops` decrements; none may end (or be seen) below 0.
async fn counter(t: &Targets, s: Shape, rows: &mut Vec<Row>) -> Result<(), Error> {
    const SC: &str = "counter floor";
    const SUBJECTS: usize = 10;
    const STOCK: i64 = 500;
    let want = (s.ops as u64).min(SUBJECTS as u64 * STOCK as u64);
    let check = Direct::connect(&t.redis).await?;
    let floor = Bounds::default();
    // The verdict on a redcount run (Lua or worker): how far its counters ended below zero,
    // read back through the core, plus one if the number applied is not the stock.
    let verdict = |name: &'static str, storage: Storage, run: String, applied: u64| {
        let check = &check;
        async move {
            let mut below = 0u64;
            for k in 0..SUBJECTS {
                below += (-check.run(&GetCounter::new(name, &format!("c{run}-{k}"), storage)?).await?).max(0) as u64;
            }
            let note = if below > 0 { format!("{below} below zero") } else { String::new() };
            Ok::<_, Error>((below + (applied != want) as u64, note))
        }
    };
    // Lua through RESP and REST: counters as their own keys.
    for (variant, lua) in lua_transports(t, s.concurrency).await? {
        let run = run_id();
        for k in 0..SUBJECTS {
            check.run(&AddCounter::new("bench", &format!("c{run}-{k}"), Storage::Key, STOCK, floor)?).await?;
        }
        let r = run.clone();
        let make =
            move |i: usize| Ok(AddCounter::new("bench", &format!("c{r}-{}", i % SUBJECTS), Storage::Key, -1, floor)?);
        let tt = lua.run(&format!("counter · {variant}"), s.ops, make, |o| o.status == CounterStatus::Applied).await;
        let (v, note) = verdict("bench", Storage::Key, run, tt.ok).await?;
        rows.push(Row::new(SC, variant, &tt).checked(v, note));
    }
    if let Some((url, admin)) = &t.worker {
        let run = run_id();
        let seed = LeanHttp::connect(url).await?;
        let auth = format!("Bearer {admin}");
        for k in 0..SUBJECTS {
            seed.post(
                &format!("/api/counters/running-jobs/c{run}-{k}"),
                &[("authorization", &auth)],
                format!(r#"{{"delta":{STOCK}}}"#),
            )
            .await?;
        }
        let r = run.clone();
        let tt = drive(Some("counter · worker HTTP API"), https(url, s.concurrency).await?, s.ops, move |d, i| {
            let path = format!("/api/counters/running-jobs/c{r}-{}", i % SUBJECTS);
            async move {
                let status = api_field(&d, &path, String::from(r#"{"delta":-1}"#), "status").await?;
                Ok(Sample::one(status.is_some_and(|s| s == "applied")))
            }
        })
        .await;
        let (v, note) = verdict("running-jobs", Storage::HashField, run, tt.ok).await?;
        rows.push(Row::new(SC, "worker HTTP API", &tt).checked(v, note));
    }
    for (variant, kind) in
        [("naive GET-check-DECR", 0u8), ("naive DECR, INCR back on underflow", 1), ("naive WATCH/MULTI/EXEC", 2)]
    {
        let run = run_id();
        for k in 0..SUBJECTS {
            check.send(&cmd(&["SET", &format!("bench:naive:{run}:c{k}"), &STOCK.to_string(), "EX", "3600"])).await?;
        }
        let r = run.clone();
        let tt = drive(
            Some(&format!("counter · {variant}")),
            directs(&t.redis, s.concurrency).await?,
            s.ops,
            move |d, i| {
                let key = format!("bench:naive:{r}:c{}", i % SUBJECTS);
                async move { naive_take(&d, &key, kind).await }
            },
        )
        .await;
        let mut below = 0u64;
        for k in 0..SUBJECTS {
            below += (-int(&check.send(&cmd(&["GET", &format!("bench:naive:{run}:c{k}")])).await?)).max(0) as u64;
        }
        let (v, note) = match (below, tt.anomalies) {
            (0, 0) => (0, String::new()),
            (b, 0) => (b, format!("ended {b} below zero")),
            (0, a) => (a, format!("{a} negative counts seen by readers")),
            (b, a) => (b + a, format!("ended {b} below zero; {a} negative counts seen")),
        };
        rows.push(Row::new(SC, variant, &tt).checked(v, note));
    }
    Ok(())
}

/// Runs every scenario; returns the rows in order.
pub async fn run_all(t: &Targets, s: Shape) -> Result<Vec<Row>, Error> {
    // Warm up the workers (workerd compiles the wasm on first use) and every script cache.
    for (url, path) in t
        .worker
        .iter()
        .map(|(u, _)| (u, "/api/quotas/bench-quota/warm"))
        .chain(t.peer.iter().map(|u| (u, "/limit/warm")))
    {
        let http = LeanHttp::connect(url).await?;
        for _ in 0..200 {
            http.post(path, &[], String::from("{}")).await?;
        }
    }
    let mut rows = Vec::new();
    eprintln!("red-packet storm: {} users, {SHARES} shares", s.ops);
    storm(t, s, &mut rows).await?;
    eprintln!("quota burst: {} calls over 10 subjects, 500 each per hour", s.ops);
    quota(t, s, &mut rows).await?;
    eprintln!("counter floor: {} decrements of 10 stocks of 500", s.ops);
    counter(t, s, &mut rows).await?;
    Ok(rows)
}

/// The table, and the ratios that matter, as Markdown.
pub fn markdown(rows: &[Row], s: Shape) -> String {
    let mut out = format!(
        "{} operations per row, {} concurrent clients (own connection each).\n\n\
         | scenario | variant | ops/s | p50 ms | p99 ms | round trips/op | retries | invariant violations |\n\
         |---|---|---:|---:|---:|---:|---:|---|\n",
        s.ops, s.concurrency
    );
    for r in rows {
        let v = if r.violations == 0 { String::from("0") } else { format!("**{}** ({})", r.violations, r.note) };
        out.push_str(&format!(
            "| {} | {} | {:.0} | {} | {} | {:.2} | {} | {} |\n",
            r.scenario,
            r.variant,
            r.ops_per_sec(),
            ms(r.p50),
            ms(r.p99),
            r.round_trips as f64 / r.ops as f64,
            r.retries,
            v
        ));
    }
    let find = |sc: &str, v: &str| rows.iter().find(|r| r.scenario == sc && r.variant == v);
    out.push_str("\n| comparison | throughput | p99 |\n|---|---:|---:|\n");
    for sc in ["red-packet storm", "quota burst", "counter floor"] {
        if let (Some(rest), Some(resp)) = (find(sc, "Lua via redcount-rest"), find(sc, "Lua over RESP")) {
            out.push_str(&format!(
                "| {sc}: redcount-rest / direct RESP | {:.2}x | {:+.3} ms |\n",
                rest.ops_per_sec() / resp.ops_per_sec(),
                (rest.p99.as_secs_f64() - resp.p99.as_secs_f64()) * 1000.0
            ));
        }
    }
    for sc in ["quota burst", "quota, one client"] {
        if let (Some(ours), Some(peer)) = (find(sc, "worker HTTP API"), find(sc, "peer: @upstash/ratelimit worker")) {
            out.push_str(&format!(
                "| {sc}: redcount worker / @upstash/ratelimit worker | {:.2}x | {:.2}x ({} vs {} ms) |\n",
                ours.ops_per_sec() / peer.ops_per_sec(),
                ours.p99.as_secs_f64() / peer.p99.as_secs_f64(),
                ms(ours.p99),
                ms(peer.p99)
            ));
        }
    }
    out
}

/// A bar chart of throughput per variant, one group per scenario; violating rows in red.
pub fn svg(rows: &[Row]) -> String {
    let (w, bar, gap, left) = (900.0, 16.0, 26.0, 300.0);
    let max = rows.iter().map(Row::ops_per_sec).fold(1.0, f64::max);
    let mut y = 52.0;
    let mut body = String::new();
    let mut last = "";
    for r in rows {
        if r.scenario != last {
            y += if last.is_empty() { 0.0 } else { gap };
            body.push_str(&format!(
                "<text x=\"10\" y=\"{:.0}\" font-weight=\"700\" font-size=\"14\">{}</text>\n",
                y,
                esc(r.scenario)
            ));
            y += 10.0;
            last = r.scenario;
        }
        let len = (w - left - 190.0) * r.ops_per_sec() / max;
        let color = if r.violations > 0 {
            "#1d1b1a"
        } else if r.variant.starts_with("naive") {
            "#b9aea7"
        } else if r.variant.starts_with("peer") {
            "#4a6fa5"
        } else {
            "#d6322f"
        };
        body.push_str(&format!(
            "<text x=\"{:.0}\" y=\"{:.0}\" font-size=\"12\" text-anchor=\"end\">{}</text>\
             <rect x=\"{left}\" y=\"{:.0}\" width=\"{len:.1}\" height=\"{bar}\" fill=\"{color}\"/>\
             <text x=\"{:.0}\" y=\"{:.0}\" font-size=\"12\">{:.0}/s{}</text>\n",
            left - 8.0,
            y + 12.0,
            esc(r.variant),
            y,
            left + len + 6.0,
            y + 12.0,
            r.ops_per_sec(),
            if r.violations > 0 { format!("  ✗ {} violations", r.violations) } else { String::new() }
        ));
        y += bar + 6.0;
    }
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{:.0}\" font-family=\"system-ui, sans-serif\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"#fbf7f2\"/>\n\
         <text x=\"10\" y=\"22\" font-size=\"15\" font-weight=\"700\">Throughput (ops/s)</text>\n\
         <rect x=\"200\" y=\"11\" width=\"12\" height=\"12\" fill=\"#d6322f\"/><text x=\"216\" y=\"22\" font-size=\"12\">redcount (Lua, one round trip)</text>\n\
         <rect x=\"410\" y=\"11\" width=\"12\" height=\"12\" fill=\"#b9aea7\"/><text x=\"426\" y=\"22\" font-size=\"12\">naive, no violation this run</text>\n\
         <rect x=\"610\" y=\"11\" width=\"12\" height=\"12\" fill=\"#1d1b1a\"/><text x=\"626\" y=\"22\" font-size=\"12\">invariant violated ✗</text>\n{body}</svg>\n",
        y + 20.0
    )
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// Redis's own time per EVALSHA since the last `CONFIG RESETSTAT` (INFO commandstats).
async fn evalsha_usec(d: &Direct) -> Result<f64, Error> {
    let text = match d.send(&Command::new("INFO").arg("commandstats")).await? {
        Value::Bytes(b) => String::from_utf8_lossy(&b).into_owned(),
        _ => String::new(),
    };
    let line = text.lines().find(|l| l.starts_with("cmdstat_evalsha:")).unwrap_or_default();
    Ok(line.split(',').find_map(|f| f.strip_prefix("usec_per_call=")).and_then(|v| v.parse().ok()).unwrap_or(0.0))
}

/// The quota policies at the largest values a policy may configure, as the Redis-time rows
/// measure them (the slowest allowed refills and rates included).
#[derive(Clone, Copy)]
struct Maxima {
    fixed: Algorithm,
    sliding: Algorithm,
    bucket: Algorithm,
    gcra_fast: Algorithm,
    gcra_slow: Algorithm,
}

impl Maxima {
    fn new() -> Self {
        use redcount_core::ops::quota::{MAX_BUCKET_SPAN, MAX_GCRA_PERIOD_MS, MAX_GCRA_RATE, MAX_GCRA_SPAN, MAX_LIMIT};
        Maxima {
            fixed: Algorithm::FixedWindow { limit: MAX_LIMIT, window_ms: 1_000_000_000_000 },
            sliding: Algorithm::SlidingWindow { limit: 10_000, window_ms: 3_600_000 },
            // The slowest refill a full-size bucket may have (from empty in MAX_BUCKET_SPAN ms).
            bucket: Algorithm::TokenBucket { capacity: MAX_LIMIT, refill: 1, interval_ms: MAX_BUCKET_SPAN / MAX_LIMIT },
            gcra_fast: Algorithm::Gcra { rate: MAX_GCRA_RATE, period_ms: 1_000, burst: MAX_GCRA_SPAN / 1_000 / 1_000 },
            gcra_slow: Algorithm::Gcra {
                rate: 1,
                period_ms: MAX_GCRA_PERIOD_MS,
                burst: MAX_GCRA_SPAN / MAX_GCRA_PERIOD_MS,
            },
        }
    }
}

/// Redis's own time per script call (INFO commandstats, EVALSHA) at the largest values a
/// policy may configure, beside a plain counter add measured in the same run: the bound
/// every call must keep (at most 1 ms) whatever the policy, denied calls included.
pub async fn redis_time(redis_url: &str) -> Result<String, Error> {
    use redcount_core::ops::inbox::{Append, MAX_LEN};
    let d = Direct::connect(redis_url).await?;
    let run = format!("{:x}", rand::random::<u32>());
    let reset = || async { d.send(&Command::new("CONFIG").arg("RESETSTAT")).await.map(|_| ()) };
    let usec_per_call = || evalsha_usec(&d);
    let mut rows: Vec<(String, f64)> = Vec::new();

    // Baseline: a counter add.
    let add = AddCounter::new("rt", &format!("c{run}"), Storage::HashField, 1, Bounds::default())?;
    d.run(&add).await?;
    reset().await?;
    for _ in 0..500 {
        d.run(&add).await?;
    }
    rows.push(("counter add (baseline)".into(), usec_per_call().await?));

    // Sliding window at its 10,000 cap: allowed calls on a log of 9,000, then denied calls
    // on a full log.
    let algo = Algorithm::SlidingWindow { limit: 10_000, window_ms: 3_600_000 };
    let subject = format!("s{run}");
    let take = TakeQuota::take("rt", &subject, algo, 1)?;
    for _ in 0..9_000 {
        d.run(&take).await?;
    }
    reset().await?;
    for _ in 0..500 {
        d.run(&take).await?;
    }
    rows.push(("sliding window, limit 10,000: allowed (log of 9,000+)".into(), usec_per_call().await?));
    for _ in 0..500 {
        d.run(&take).await?;
    }
    reset().await?;
    for _ in 0..500 {
        let o = d.run(&take).await?;
        if o.allowed {
            return Err(Error::Failed("the full sliding log allowed a call".into()));
        }
    }
    rows.push(("sliding window, limit 10,000: denied (full log)".into(), usec_per_call().await?));

    // An inbox of 20,000 messages whose policy lowers max_len to 1: each append trims a
    // bounded number (1,000), not all 19,999 at once.
    let user = format!("u{run}");
    for id in 0..20_000 {
        d.run(&Append::new(&user, id, "m", 86_400_000, MAX_LEN)?).await?;
    }
    reset().await?;
    for id in 20_000..20_020 {
        d.run(&Append::new(&user, id, "m", 86_400_000, 1)?).await?;
    }
    rows.push(("inbox append, max_len lowered 20,000 → 1 (trims ≤ 1,000 per call)".into(), usec_per_call().await?));

    // The compound decision's scripts, each at its largest allowed arguments. A helper measures `n`
    // calls of one operation (the state made first by `setup` calls, not counted).
    async fn measure<O: Operation + Sync>(d: &Direct, op: &O, n: usize) -> Result<f64, Error> {
        // Loaded first, so no call measured is a NOSCRIPT (then an EVAL, counted apart).
        if let redcount_core::script::Request::Script(inv) = op.request() {
            d.send(&Command::new("SCRIPT").arg("LOAD").arg(inv.script.source())).await?;
        }
        d.send(&Command::new("CONFIG").arg("RESETSTAT")).await?;
        for _ in 0..n {
            d.run(op).await?;
        }
        evalsha_usec(d).await
    }
    use redcount_core::ops::decision::{Decide, Part};
    use redcount_core::ops::quota::RefundQuota;
    use redcount_core::ops::semaphore::{Action, UpdateLease};
    let Maxima { fixed, sliding, bucket, gcra_fast, gcra_slow } = Maxima::new();
    let subject = format!("g{run}");
    rows.push((
        "quota take, fixed window, limit 10^9".into(),
        measure(&d, &TakeQuota::take("rt-f", &subject, fixed, 1)?, 500).await?,
    ));
    rows.push((
        "quota take, GCRA, 10^7 per second (T = 0.1 µs)".into(),
        measure(&d, &TakeQuota::take("rt-g1", &subject, gcra_fast, 1)?, 500).await?,
    ));
    let slow = TakeQuota::take("rt-g2", &subject, gcra_slow, 1)?;
    for _ in 0..gcra_slow.limit() {
        d.run(&slow).await?;
    }
    rows.push(("quota take, GCRA, 1 per leap year, denied".into(), measure(&d, &slow, 500).await?));

    // A decision of 8 parts, two of each algorithm, the sliding ones on logs of 9,000+
    // (allowed: every part read, then every part written), then on full logs (denied by the
    // sliding parts: every part read, nothing written).
    let parts = || -> Result<Vec<Part>, Error> {
        Ok(vec![
            Part::quota("d-f1", fixed, 1)?,
            Part::quota("d-b1", bucket, 1)?,
            Part::quota("d-g1", gcra_fast, 1)?,
            Part::quota("d-s1", sliding, 1)?,
            Part::quota("d-f2", fixed, 1)?,
            Part::quota("d-b2", bucket, 1)?,
            Part::quota("d-g2", gcra_fast, 1)?,
            Part::quota("d-s2", sliding, 1)?,
        ])
    };
    let decide = Decide::new(&subject, parts()?)?;
    for _ in 0..9_000 {
        d.run(&decide).await?;
    }
    rows.push((
        "decision, 8 parts (2 × each algorithm; sliding logs of 9,000+): allowed".into(),
        measure(&d, &decide, 500).await?,
    ));
    for _ in 0..500 {
        d.run(&decide).await?;
    }
    rows.push(("decision, 8 parts, both sliding logs full: denied".into(), measure(&d, &decide, 500).await?));

    // Semaphores of 10,000 holders: an acquire, a fencing check, and a decision of 7 quotas
    // and a lease on it.
    let holders = format!("h{run}");
    for i in 0..10_000 {
        d.run(&UpdateLease::new("rt-s", &holders, Action::Acquire, &format!("h{i}"), 1_000_000, 3_600_000)?).await?;
    }
    let acquire = UpdateLease::new("rt-s", &holders, Action::Acquire, "late", 1_000_000, 3_600_000)?;
    rows.push((
        "semaphore acquire, 10,000 holders (renewal after the first)".into(),
        measure(&d, &acquire, 500).await?,
    ));
    let check = UpdateLease::new("rt-s", &holders, Action::Check { fencing_token: 1 }, "h5", 1_000_000, 3_600_000)?;
    rows.push(("semaphore check (fencing token), 10,000 holders".into(), measure(&d, &check, 500).await?));
    let mut with_lease = parts()?;
    with_lease.pop();
    with_lease.push(Part::lease("rt-s", "late", 1_000_000, 3_600_000)?);
    let decide_lease = Decide::new(&holders, with_lease)?;
    rows.push(("decision, 7 quotas and a lease on 10,000 holders".into(), measure(&d, &decide_lease, 500).await?));

    // A refund of all 10,000 units of a full sliding log: one search, one range removal.
    let refund_subject = format!("r{run}");
    let take = TakeQuota::take("rt-r", &refund_subject, sliding, 1)?;
    for _ in 0..10_000 {
        d.run(&take).await?;
    }
    rows.push((
        "quota refund of 10,000 units on a full sliding log (the newest 500 calls change)".into(),
        measure(&d, &RefundQuota::new("rt-r", &refund_subject, sliding, 10_000)?, 1).await?,
    ));

    rows.extend(reservation_rows(&d, &run).await?);

    let peer = peer_rows(&d, &run).await?;

    let base = rows[0].1.max(0.001);
    let mut out = String::from(
        "\n## Redis time per call at the policy maxima\n\n\
         Redis's own time per EVALSHA (INFO commandstats), same run; the bound is 1,000 µs per call.\n\n\
         | call | µs per call | × counter add |\n|---|---:|---:|\n",
    );
    for (name, us) in &rows {
        out.push_str(&format!("| {name} | {us:.0} | {:.1} |\n", us / base));
    }
    out.push_str(&peer);
    Ok(out)
}

/// Redis's EVALSHA calls and microseconds so far (INFO commandstats).
async fn evalsha_totals(d: &Direct) -> Result<(u64, u64), Error> {
    let text = match d.send(&Command::new("INFO").arg("commandstats")).await? {
        Value::Bytes(b) => String::from_utf8_lossy(&b).into_owned(),
        _ => String::new(),
    };
    let line = text.lines().find(|l| l.starts_with("cmdstat_evalsha:")).unwrap_or_default();
    let field = |name: &str| line.split([':', ',']).find_map(|f| f.strip_prefix(name)).and_then(|v| v.parse().ok());
    Ok((field("calls=").unwrap_or(0), field("usec=").unwrap_or(0)))
}

/// Redis's time of each call of `op` alone (INFO commandstats around it, so calls between
/// them that set the next one up are not counted): the mean and the most, in µs.
struct PerCall(Vec<f64>);

impl PerCall {
    async fn run<O: Operation + Sync>(&mut self, d: &Direct, op: &O) -> Result<O::Outcome, Error> {
        let (c0, u0) = evalsha_totals(d).await?;
        let out = d.run(op).await?;
        let (c1, u1) = evalsha_totals(d).await?;
        if c1 != c0 + 1 {
            return Err(Error::Failed(format!("{}: {} script calls measured as one", O::NAME, c1 - c0)));
        }
        self.0.push((u1 - u0) as f64);
        Ok(out)
    }

    fn row(&self, what: &str) -> (String, f64) {
        let mean = self.0.iter().sum::<f64>() / self.0.len().max(1) as f64;
        let most = self.0.iter().copied().fold(0.0, f64::max);
        (format!("{what} (most {most:.0} µs of {} calls)", self.0.len()), mean)
    }
}

/// Reservations at their largest arguments: 8 quota parts, each algorithm twice at the policy
/// maxima with the sliding logs at 7,000 to 9,500 entries, every part giving back on expiry. Each
/// call's own Redis time is measured; the worst cases are built on purpose: a settle whose
/// two sliding parts rewrite 16 entries each (32, the most one call rewrites), a reserve that
/// first gives back 8 owed refunds (the most one call gives) of one sliding log: the first
/// rewrites 32 entries, the others find the call's rewrites spent.
async fn reservation_rows(d: &Direct, run: &str) -> Result<Vec<(String, f64)>, Error> {
    use redcount_core::ops::reservation::{Mode, OnExpiry, Part, Reserve};
    let Maxima { fixed, sliding, bucket, gcra_fast, .. } = Maxima::new();
    let subject = format!("v{run}");
    // The sliding parts first: owed refunds are given back in the parts' order.
    let algos = [
        ("v-s1", sliding),
        ("v-s2", sliding),
        ("v-f1", fixed),
        ("v-f2", fixed),
        ("v-b1", bucket),
        ("v-b2", bucket),
        ("v-g1", gcra_fast),
        ("v-g2", gcra_fast),
    ];
    let parts = |units: i64| -> Result<Vec<Part>, Error> {
        let mut out = Vec::new();
        for (name, algo) in algos {
            out.push(Part::quota(name, algo, units)?.on_expiry(OnExpiry::Refund));
        }
        Ok(out)
    };
    for script in [&redcount_core::script::RESERVE, &redcount_core::script::SETTLE] {
        d.send(&Command::new("SCRIPT").arg("LOAD").arg(script.source())).await?;
    }
    for name in ["v-s1", "v-s2"] {
        let take = TakeQuota::take(name, &subject, sliding, 1)?;
        for _ in 0..7_000 {
            d.run(&take).await?;
        }
    }
    let fill = |n: usize| {
        let subject = subject.clone();
        async move {
            for name in ["v-s1", "v-s2"] {
                for _ in 0..n {
                    d.run(&TakeQuota::take(name, &subject, sliding, 1)?).await?;
                }
            }
            Ok::<(), Error>(())
        }
    };
    let mut rows = Vec::new();
    let (mut reserve, mut below, mut above, mut extend, mut release) =
        (PerCall(Vec::new()), PerCall(Vec::new()), PerCall(Vec::new()), PerCall(Vec::new()), PerCall(Vec::new()));
    for i in 0..60 {
        let r = Reserve::new(&subject, &format!("a{i}"), parts(2)?, 3_600_000, Mode::All)?;
        if !reserve.run(d, &r).await?.allowed {
            return Err(Error::Failed("a reservation at the maxima was refused".into()));
        }
        // 15 calls after it in each sliding log: its settle rewrites 16 entries in each.
        fill(15).await?;
        match i % 4 {
            0 | 1 => drop(below.run(d, &r.settle(&[1; 8])?).await?),
            2 => {
                extend.run(d, &r.extend(3_600_000, &[3; 8])?).await?;
                above.run(d, &r.settle(&[5; 8])?).await?;
            }
            _ => drop(release.run(d, &r.release()?).await?),
        }
    }
    rows.push(reserve.row("reservation, 8 parts (2 × each algorithm at the maxima, sliding logs of 7,000+)"));
    rows.push(below.row("settle below the reservation, 8 parts (32 sliding entries rewritten)"));
    rows.push(above.row("settle above the reservation, 8 parts (each overrun charged)"));
    rows.push(extend.row("extend, 8 parts (units used so far charged)"));
    rows.push(release.row("release, 8 parts (32 sliding entries rewritten)"));

    // Owed refunds: 8 reservations whose lease ends unsettled, 7 calls after each.
    let mut owed = PerCall(Vec::new());
    for round in 0..10 {
        for j in 0..8 {
            let r = Reserve::new(&subject, &format!("x{round}-{j}"), parts(1)?, 1, Mode::All)?;
            d.run(&r).await?;
            fill(3).await?;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        let r = Reserve::new(&subject, &format!("y{round}"), parts(1)?, 3_600_000, Mode::All)?;
        let got = owed.run(d, &r).await?;
        if got.parts[0].back == 0 {
            return Err(Error::Failed("no owed refund given back".into()));
        }
        d.run(&r.release()?).await?;
    }
    rows.push(owed.row("reservation, 8 parts, giving back 8 owed refunds first (sliding)"));
    Ok(rows)
}

/// The fixed window's three Redis calls without anything else: what server time, the
/// override and a write-free denial cost at the least (a row beside the peer's).
const FIXED_FLOOR: &str = include_str!("../../lua/fixed_floor.lua");

/// Redis time per call of redcount's quota scripts beside @upstash/ratelimit's for the same
/// job, in one run: each measured over interleaved rounds (median), always allowed. The
/// peer's scripts are read from its npm package (`REDCOUNT_PEER_JS`: its dist/index.js, set
/// by `cargo xtask bench`); without it the section says so.
async fn peer_rows(d: &Direct, run: &str) -> Result<String, Error> {
    let mut out = String::from(
        "\n### Beside @upstash/ratelimit (same Redis, same run)\n\n\
         Median µs per call of 3 interleaved rounds of 2,000 allowed calls on one subject (so a running\n\
         window). redcount's scripts decide on the server's clock (the fixed window: its key's expiry,\n\
         read with PTTL), read the subject's override of the limit, check every argument and write\n\
         nothing when they deny; the peer's take the client's clock, read its dynamic limit (passed, as\n\
         redcount's override is) and are charged when they deny. The row after the fixed window is its\n\
         three Redis calls alone (`bench/lua/fixed_floor.lua`): what a take with those three properties\n\
         costs at the least, against the peer's two calls.\n\n| job | redcount µs | peer µs | ratio |\n|---|---:|---:|---:|\n",
    );
    let Some(js) = std::env::var_os("REDCOUNT_PEER_JS").and_then(|p| std::fs::read_to_string(p).ok()) else {
        out.push_str("| (REDCOUNT_PEER_JS not set: the peer's scripts were not found) | | | |\n");
        return Ok(out);
    };
    let script = |name: &str| -> Option<String> {
        let start = js.find(&format!("var {name} = `"))? + name.len() + 8;
        // Without Upstash's own shebang flag, which Redis refuses (as redcount-rest does).
        Some(js[start..start + js[start..].find('`')?].replacen("#!lua flags=allow-key-locking", "#!lua", 1))
    };
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|t| t.as_millis()).unwrap_or(0);
    let jobs: [(&str, Algorithm, &str, Vec<String>); 3] = [
        (
            "fixed window, 10^9 per hour",
            Algorithm::FixedWindow { limit: 1_000_000_000, window_ms: 3_600_000 },
            "fixedWindowLimitScript",
            vec![
                "2".into(),
                format!("pf{run}"),
                format!("pf{run}:dyn"),
                "1000000000".into(),
                "3600000".into(),
                "1".into(),
            ],
        ),
        (
            "sliding window, 10,000 per hour (peer: two-window estimate)",
            Algorithm::SlidingWindow { limit: 10_000, window_ms: 3_600_000 },
            "slidingWindowLimitScript",
            vec![
                "3".into(),
                format!("ps{run}:1"),
                format!("ps{run}:0"),
                format!("ps{run}:dyn"),
                "1000000000".into(),
                now.to_string(),
                "3600000".into(),
                "1".into(),
            ],
        ),
        (
            "token bucket, 10^9, 1 back per hour",
            Algorithm::TokenBucket { capacity: 1_000_000_000, refill: 1, interval_ms: 3_600_000 },
            "tokenBucketLimitScript",
            vec![
                "2".into(),
                format!("pb{run}"),
                format!("pb{run}:dyn"),
                "1000000000".into(),
                "3600000".into(),
                "1".into(),
                now.to_string(),
                "1".into(),
            ],
        ),
    ];
    for (job, algo, name, args) in jobs {
        let Some(text) = script(name) else {
            out.push_str(&format!("| {job} | | (no `{name}` in the peer's package) | |\n"));
            continue;
        };
        let sha = match d.send(&Command::new("SCRIPT").arg("LOAD").arg(text)).await? {
            Value::Bytes(b) => String::from_utf8_lossy(&b).into_owned(),
            _ => return Err(Error::Failed("SCRIPT LOAD answered no SHA".into())),
        };
        let mut theirs = Command::new("EVALSHA").arg(sha);
        for a in &args {
            theirs.push(a.clone());
        }
        // A subject of a 2,000,000-unit budget: 6,000 calls stay allowed.
        let op = TakeQuota::take("rt-peer", &format!("{name}{run}"), algo, 1)?;
        d.run(&op).await?;
        let ours = op.request().command();
        // Beside the fixed window: its three Redis calls alone (bench/lua/fixed_floor.lua).
        let floor = match algo {
            Algorithm::FixedWindow { .. } => {
                let counter = format!("{{pf{run}}}:floor");
                d.send(&Command::new("SET").arg(counter.as_str()).arg("1").arg("PX").arg("3600000")).await?;
                let sha = match d.send(&Command::new("SCRIPT").arg("LOAD").arg(FIXED_FLOOR)).await? {
                    Value::Bytes(b) => String::from_utf8_lossy(&b).into_owned(),
                    _ => return Err(Error::Failed("SCRIPT LOAD answered no SHA".into())),
                };
                Some(
                    Command::new("EVALSHA")
                        .arg(sha)
                        .arg("2")
                        .arg(counter.as_str())
                        .arg(format!("{{pf{run}}}:none"))
                        .arg("1"),
                )
            }
            _ => None,
        };
        let (mut a, mut b, mut c) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..3 {
            for (cmd, into) in [(Some(&ours), &mut a), (Some(&theirs), &mut b), (floor.as_ref(), &mut c)] {
                let Some(cmd) = cmd else { continue };
                d.send(&Command::new("CONFIG").arg("RESETSTAT")).await?;
                for _ in 0..2_000 {
                    d.send(cmd).await?;
                }
                into.push(evalsha_usec(d).await?);
            }
        }
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let (ours_us, peer_us) = (median(&mut a), median(&mut b));
        out.push_str(&format!("| {job} | {ours_us:.2} | {peer_us:.2} | {:.2}× |\n", ours_us / peer_us.max(0.001)));
        if !c.is_empty() {
            let floor_us = median(&mut c);
            out.push_str(&format!(
                "| fixed window: its three Redis calls alone (MGET, PTTL, INCRBY; no checks) | {floor_us:.2} | {peer_us:.2} | {:.2}× |\n",
                floor_us / peer_us.max(0.001)
            ));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::Maxima;
    use redcount_core::ops::decision::Part;
    use redcount_core::ops::quota::TakeQuota;

    /// The Redis-time rows' policies are ones a user may configure: a bound tightened in the
    /// core (a bucket's refill from empty) would make `cargo xtask bench` stop at that table,
    /// which no other test runs.
    #[test]
    fn the_redis_time_policies_are_accepted() {
        let m = Maxima::new();
        for algo in [m.fixed, m.sliding, m.bucket, m.gcra_fast, m.gcra_slow] {
            TakeQuota::take("p", "s", algo, 1).unwrap_or_else(|e| panic!("{algo:?}: {e}"));
            Part::quota("p", algo, 1).unwrap_or_else(|e| panic!("{algo:?}: {e}"));
        }
    }
}
