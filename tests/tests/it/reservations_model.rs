//! A seeded model of reservations with the faults of model.rs: four clients, each a user of
//! its own tenant, reserve, settle, extend and release at random over eight quotas (each
//! algorithm at the user's and the tenant's level, each with its own max_debt and
//! on_expiry) and a semaphore, with peeks, leases that end unsettled, admin overrides and
//! refunds, replays and clashes of Idempotency-Keys, while SCRIPT FLUSH, a SIGKILL and
//! restart from the AOF, or maxmemory land at random. Every answer is checked against a
//! small model of each algorithm's state (kept exactly: nothing comes back by time), and at
//! the end Redis holds what the model holds, every owed refund given back once.
//!
//! Each client writes with an Idempotency-Key and sends a write again while its outcome is
//! unknown, so each write has one effect and one answer. Leases that may end during a call
//! are used only in rounds without a fault that loses answers, and a client waits past
//! every lease end before it calls, so the model knows which reservations have expired.
//! `REDCOUNT_SEED` replays a run (model.rs).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redcount_core::ErrorKind;
use redcount_core::keys::{self, Level};
use redcount_core::ops::decision::{LeaseResult, PartOutcome};
use redcount_core::ops::quota::{Algorithm, OverrideQuota, RefundQuota};
use redcount_core::ops::reservation::{Mode, OnExpiry, Part, Reservation, Reserve, SettledPart, Settlement, State};
use redcount_core::ops::{Idempotency, Idempotent, Replayable};

use crate::model::{CLIENTS, Client, Env, Fault, OPS, Outcome, now_ms};

const LONG: i64 = 1_000_000_000_000;
/// A GCRA period of a leap year (its largest burst is 142: room for debt).
const GCRA_PERIOD: i64 = 31_622_400_000;
const SLOTS: i64 = 2;
/// How close to a lease's end a client does not call (ms), so the server's clock and the
/// client's agree on whether it has ended.
const MARGIN: i64 = 60;
/// A lease that ends within the test: 150 to 400 ms; one that does not.
const SHORT: (i64, i64) = (150, 400);
const FOREVER: i64 = 600_000;
/// Operations per client per round.
const STEPS: usize = 5 * OPS;

/// The quota policies: name, algorithm, max_debt, on_expiry refund. Each is used at both
/// levels of the client's subject.
fn policies() -> [(&'static str, Algorithm, i64, bool); 4] {
    [
        ("fw", Algorithm::FixedWindow { limit: 12, window_ms: LONG }, 4, true),
        ("sw", Algorithm::SlidingWindow { limit: 12, window_ms: LONG }, 3, false),
        ("tb", Algorithm::TokenBucket { capacity: 12, refill: 1, interval_ms: LONG }, 5, true),
        ("gc", Algorithm::Gcra { rate: 1, period_ms: GCRA_PERIOD, burst: 12 }, 2, true),
    ]
}

/// One quota's state as its algorithm keeps it (lib_*.lua), and its expiry queue.
#[derive(Debug, Clone)]
struct Quota {
    name: &'static str,
    level: Level,
    algo: Algorithm,
    debt: i64,
    refund: bool,
    ovr: Option<i64>,
    /// Fixed window: the count.
    used: i64,
    /// Sliding window: the log, oldest first: cost, tag.
    log: Vec<(i64, Option<String>)>,
    /// Token bucket: the tokens (`None`: no key, full).
    tokens: Option<i64>,
    /// GCRA: units ahead, and the debt field.
    ahead: i64,
    d: Option<i64>,
    /// The expiry queue: (lease end, member, id, units).
    due: Vec<(i64, String, String, i64)>,
}

impl Quota {
    fn size(&self) -> i64 {
        self.ovr.unwrap_or(self.algo.limit())
    }

    fn most(&self) -> i64 {
        self.algo.max_size()
    }

    fn tokens_now(&self) -> i64 {
        let size = self.size();
        self.tokens.map_or(size, |t| t.max(size - self.most()).min(size))
    }

    /// Units in use, as the eval reads them.
    fn count(&self) -> i64 {
        let size = self.size();
        match self.algo {
            Algorithm::FixedWindow { .. } => self.used,
            Algorithm::SlidingWindow { .. } => self.log.iter().map(|e| e.0).sum(),
            Algorithm::TokenBucket { .. } => size - self.tokens_now(),
            Algorithm::Gcra { .. } => self.ahead.min(size + self.d.unwrap_or(0).clamp(0, self.most() - size)),
        }
    }

    fn remaining(&self) -> i64 {
        (self.size() - self.count()).max(0)
    }

    /// `n` more units (n > 0), or n back (n < 0, within the count), as `q.add` writes them.
    fn add(&mut self, n: i64, tag: Option<&str>) {
        let size = self.size();
        match self.algo {
            Algorithm::FixedWindow { .. } => self.used += n,
            Algorithm::SlidingWindow { .. } => self.log.push((n, tag.map(String::from))),
            Algorithm::TokenBucket { .. } => {
                let t = self.tokens_now() - n;
                // A full bucket's key expires at once (the client waits past it).
                self.tokens = if t >= size { None } else { Some(t) };
            }
            Algorithm::Gcra { .. } => {
                let c = (self.count() + n).max(0);
                self.ahead = c;
                self.d = (c > size).then_some(c - size);
            }
        }
    }

    /// Up to `units` back off what reservation `tag` took (lib_give.lua).
    fn give(&mut self, units: i64, tag: &str) -> i64 {
        if let Algorithm::SlidingWindow { .. } = self.algo {
            let Some(i) = self.log.iter().position(|e| e.1.as_deref() == Some(tag)) else { return 0 };
            let n = units.min(self.log[i].0);
            self.log[i].0 -= n;
            if self.log[i].0 == 0 {
                self.log.remove(i);
            }
            return n;
        }
        // A GCRA reservation's: the whole units of their span left after the time since the
        // reserve, one less (the period is a year: under one unit of it has passed).
        let units = match self.algo {
            Algorithm::Gcra { .. } if !tag.is_empty() => units - 1,
            _ => units,
        };
        let n = units.min(self.count()).max(0);
        // Nothing given writes nothing (lib_give.lua): a bucket holding more than a lowered
        // size keeps its key.
        if n > 0 {
            self.add(-n, None);
        }
        n
    }

    /// An admin refund: as `give`, a sliding window's off its newest calls.
    fn refund(&mut self, units: i64) -> i64 {
        if let Algorithm::SlidingWindow { .. } = self.algo {
            let mut left = units.min(self.count());
            let given = left;
            while left > 0 {
                let last = self.log.last_mut().unwrap();
                if last.0 <= left {
                    left -= last.0;
                    self.log.pop();
                } else {
                    last.0 -= left;
                    last.1 = None; // kept untagged
                    left = 0;
                }
            }
            return given;
        }
        self.give(units, "")
    }

    /// A late charge of up to `units`: (charged, debt after).
    fn charge(&mut self, units: i64) -> (i64, i64) {
        let top = (self.size() + self.debt).min(self.most());
        let n = units.min(top - self.count()).max(0);
        if n > 0 {
            self.add(n, None);
        }
        (n, (self.count() - self.size()).max(0))
    }

    /// Gives back the due entries (lease end before `now`) of this queue, up to `budget`,
    /// `own` left out, in the queue's order; returns the units and the entries taken.
    fn settle_due(&mut self, now: i64, budget: &mut usize, own: Option<&str>) -> i64 {
        let mut due: Vec<(i64, String, String, i64)> =
            self.due.iter().filter(|e| e.0 < now && Some(e.2.as_str()) != own).cloned().collect();
        due.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
        due.truncate(*budget);
        *budget -= due.len();
        let mut back = 0;
        for (e, member, id, units) in due {
            back += self.give(units, &id);
            self.due.retain(|x| !(x.0 == e && x.1 == member));
        }
        back
    }
}

/// A quota part of a reservation in the model.
#[derive(Debug, Clone)]
struct Held {
    q: usize,
    reserved: i64,
    charged: i64,
    used: i64,
}

#[derive(Debug, Clone)]
struct Res {
    reserve: Reserve,
    held: Vec<Option<Held>>, // per part (None: the lease part)
    lease: bool,
    ends: i64,
    state: State,
    /// The final answer (settled, released or expired).
    answer: Option<Settlement>,
}

/// A client's model: its quotas, reservations, and answered keyed writes to replay.
struct Model {
    subject: String,
    quotas: Vec<Quota>,
    res: BTreeMap<String, Res>,
    replays: Vec<(Replay, Idempotency)>,
    next: usize,
    /// Units given back by expiry, and owed (refund policies' expired reservations).
    back: i64,
    owed: i64,
    counts: BTreeMap<&'static str, usize>,
}

#[derive(Debug, Clone)]
enum Replay {
    Reserve(Reserve, Reservation),
    Settle(redcount_core::ops::reservation::Settle, Settlement),
}

impl Model {
    fn new(n: usize) -> Self {
        let mut quotas = Vec::new();
        for (name, algo, debt, refund) in policies() {
            for level in [Level::User, Level::Tenant] {
                quotas.push(Quota {
                    name,
                    level,
                    algo,
                    debt,
                    refund,
                    ovr: None,
                    used: 0,
                    log: Vec::new(),
                    tokens: None,
                    ahead: 0,
                    d: None,
                    due: Vec::new(),
                });
            }
        }
        Model {
            subject: format!("ten{n}/user"),
            quotas,
            res: BTreeMap::new(),
            replays: Vec::new(),
            next: 0,
            back: 0,
            owed: 0,
            counts: BTreeMap::new(),
        }
    }

    fn part(&self, q: usize, units: i64) -> Part {
        let m = &self.quotas[q];
        let exp = if m.refund { OnExpiry::Refund } else { OnExpiry::Charge };
        Part::quota(m.name, m.algo, units).unwrap().max_debt(m.debt).unwrap().on_expiry(exp).at(m.level)
    }

    /// Every key of the client's subject that a call may write, for DUMPs.
    fn keys(&self, ids: &[&str]) -> Vec<String> {
        let mut out = Vec::new();
        for m in &self.quotas {
            let state = keys::quota_at(m.name, &self.subject, m.level, m.algo.tag());
            out.push(keys::quota_expiry(&state));
            out.push(state);
            out.push(keys::quota_override_at(m.name, &self.subject, m.level));
        }
        // (Not the holders' tokens: they outlive the leases by a lease, which may end within a
        // call; nothing writes them without writing the set or a record too.)
        let [set, _tokens, ovr] = keys::semaphore_keys(&keys::semaphore("slots", &self.subject));
        out.extend([set, ovr]);
        for id in ids {
            out.push(keys::reservation(&self.subject, id));
        }
        out
    }
}

/// DUMPs of `keys`, with the server's run id around them (None when Redis does not answer,
/// as during a restart). Two DUMPs compare only when taken by one server process (a restart
/// from the AOF may store a hash's fields in another order) less than MARGIN apart
/// (clear_of_lease_ends: no lease, and so no key's expiry, ends in between); `since`: the
/// first one's time.
async fn dump(c: &Client, keys: &[String], since: Option<i64>) -> Option<(String, Vec<redcount_core::Value>)> {
    let run_id = || async {
        let info =
            c.direct.send(&redcount_core::Command::new("INFO").arg("server")).await.ok()?.into_string("info").ok()?;
        info.lines().find_map(|l| l.strip_prefix("run_id:")).map(String::from)
    };
    let first = run_id().await?;
    let mut out = Vec::new();
    for k in keys {
        out.push(c.direct.send(&redcount_core::Command::new("DUMP").arg(k)).await.ok()?);
    }
    let late = since.is_some_and(|t| now_ms() - t >= MARGIN);
    (!late && run_id().await? == first).then_some((first, out))
}

/// Runs a keyed write until it has an answer: `None` when it was refused whole before any
/// attempt may have run (maxmemory, or never sent), else its one answer.
async fn keyed<O: Replayable + Clone + Sync>(c: &Client, op: &O, idem: &Idempotency) -> Option<O::Outcome>
where
    O::Outcome: Clone,
{
    let op = Idempotent::new(op.clone(), Some(idem.clone()));
    let mut unknown = false;
    for _ in 0..300 {
        let t = c.run(&op).await;
        match t.out {
            Outcome::Done(o) => return Some(o),
            Outcome::Refused if !unknown => return None,
            Outcome::Refused | Outcome::Unknown(_) => unknown = true,
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    c.fail(format!("{}: no answer in 15 s", O::NAME))
}

/// Waits until no open reservation's lease ends within MARGIN of now, then returns now
/// (Redis's clock, read by the client's: the same machine's).
async fn clear_of_lease_ends(m: &Model) -> i64 {
    loop {
        let now = now_ms();
        let near =
            m.res.values().filter(|r| r.state == State::Open).map(|r| r.ends).find(|e| (e - now).abs() <= MARGIN);
        match near {
            Some(e) => tokio::time::sleep(Duration::from_millis((e + MARGIN + 1 - now).max(1) as u64)).await,
            None => return now,
        }
    }
}

/// Whether the reservation's lease had ended at `now` (the model's view, kept unambiguous).
fn ended(r: &Res, now: i64) -> bool {
    r.ends <= now
}

/// Live leases of the slots semaphore at `now`.
fn live(m: &Model, now: i64) -> i64 {
    m.res.values().filter(|r| r.lease && r.state == State::Open && !ended(r, now)).count() as i64
}

/// Processes the due expiry entries of the quota parts `qs` in order (budget 8), as a call
/// does before it decides; returns the units back per part.
fn owed_first(m: &mut Model, qs: &[Option<usize>], now: i64, own: Option<&str>) -> Vec<i64> {
    let mut budget = 8;
    let mut out = Vec::new();
    for q in qs {
        let back = match q {
            Some(q) => m.quotas[*q].settle_due(now, &mut budget, own),
            None => 0,
        };
        m.back += back;
        out.push(back);
    }
    out
}

/// What the model grants each quota part (`None`: denied), and whether and by which part the
/// reservation is denied.
fn decide(
    m: &Model,
    asks: &[(usize, i64, i64)],
    capped: bool,
    lease_part: bool,
    now: i64,
) -> (bool, Option<usize>, Vec<Option<i64>>) {
    let mut grant = Vec::new();
    for &(q, units, min) in asks {
        let left = m.quotas[q].remaining();
        grant.push(if left >= units {
            Some(units)
        } else if capped && left >= min {
            Some(left)
        } else {
            None
        });
    }
    let lease_ok = !lease_part || live(m, now) < SLOTS;
    let allowed = grant.iter().all(Option::is_some) && lease_ok;
    let denied_by = grant.iter().position(Option::is_none).or((!lease_ok).then_some(asks.len()));
    (allowed, denied_by, grant)
}

/// One client's round: OPS operations at random, each checked against the model.
async fn client_round(mut c: Client, models: Arc<Mutex<Vec<Model>>>, calm: bool, last: bool) -> (Client, Vec<()>) {
    let mut m = std::mem::replace(&mut models.lock().unwrap()[c.n], Model::new(c.n));
    for _ in 0..STEPS {
        tokio::time::sleep(Duration::from_millis(2)).await; // a full bucket's key is gone
        step(&mut c, &mut m, calm).await;
    }
    if calm || last {
        // No lease of this round ends in the next one (a fault there may stretch a call).
        let latest =
            m.res.values().filter(|r| r.state == State::Open && r.ends - now_ms() < 60_000).map(|r| r.ends).max();
        if let Some(e) = latest {
            let wait = e + MARGIN + 1 - now_ms();
            if wait > 0 {
                tokio::time::sleep(Duration::from_millis(wait as u64)).await;
            }
        }
    }
    models.lock().unwrap()[c.n] = m;
    (c, Vec::new())
}

async fn step(c: &mut Client, m: &mut Model, calm: bool) {
    let roll = c.rng.below(100);
    let open: Vec<String> = m.res.iter().filter(|(_, r)| r.state == State::Open).map(|(k, _)| k.clone()).collect();
    let finished: Vec<String> = m.res.iter().filter(|(_, r)| r.state != State::Open).map(|(k, _)| k.clone()).collect();
    let pick = |c: &mut Client, v: &[String]| v[c.rng.index(v.len())].clone();
    match roll {
        0..=29 => reserve(c, m, calm).await,
        30..=47 if !open.is_empty() => {
            let id = pick(c, &open);
            finish(c, m, &id, "settle", calm).await
        }
        48..=53 if !open.is_empty() => {
            let id = pick(c, &open);
            finish(c, m, &id, "extend", calm).await
        }
        54..=59 if !open.is_empty() => {
            let id = pick(c, &open);
            finish(c, m, &id, "release", calm).await
        }
        60..=64 if !finished.is_empty() => {
            let id = pick(c, &finished);
            let what = ["settle", "release", "extend"][c.rng.index(3)];
            finish(c, m, &id, what, calm).await
        }
        65..=72 if !m.replays.is_empty() => replay(c, m).await,
        73..=78 => override_or_refund(c, m, true).await,
        79..=90 => override_or_refund(c, m, false).await,
        91..=95 if calm => {
            // Let the next lease that ends soon end unsettled.
            let now = now_ms();
            if let Some(e) = m
                .res
                .values()
                .filter(|r| r.state == State::Open && r.ends > now && r.ends - now < 1_000)
                .map(|r| r.ends)
                .min()
            {
                tokio::time::sleep(Duration::from_millis((e + MARGIN + 1 - now) as u64)).await;
            }
        }
        _ => reserve(c, m, calm).await,
    }
}

async fn reserve(c: &mut Client, m: &mut Model, calm: bool) {
    let n_quota = c.rng.range(1, 3) as usize;
    let mut qs: Vec<usize> = Vec::new();
    while qs.len() < n_quota {
        let q = c.rng.index(m.quotas.len());
        if !qs.contains(&q) {
            qs.push(q);
        }
    }
    let capped = c.rng.percent(25);
    let mut parts = Vec::new();
    let mut asks = Vec::new();
    for &q in &qs {
        let units = c.rng.range(1, 6);
        let min = c.rng.range(1, units);
        let mut p = m.part(q, units);
        if capped {
            p = p.min_units(min).unwrap();
        }
        parts.push(p);
        asks.push((q, units, if capped { min } else { units }));
    }
    let lease_part = c.rng.percent(40);
    m.next += 1;
    let id = format!("r{}-{}", c.n, m.next);
    if lease_part {
        parts.push(Part::lease("slots", &id, SLOTS).unwrap());
    }
    let lease_ms = if calm && c.rng.percent(35) { c.rng.range(SHORT.0, SHORT.1) } else { FOREVER };
    let mode = if capped { Mode::Capped } else { Mode::All };
    let peek = c.rng.percent(10);
    let now = clear_of_lease_ends(m).await;
    if peek {
        let op = Reserve::peek(&m.subject, &id, parts, lease_ms, mode).unwrap();
        let keys = m.keys(&[&id]);
        let before = dump(c, &keys, None).await;
        let t = c.run(&op).await;
        let Outcome::Done(got) = t.out else { return };
        let after = dump(c, &keys, Some(now)).await;
        if let (Some(b), Some(a)) = (before, after)
            && b != a
        {
            c.fail(format!("a peek wrote: {got:?}"))
        }
        // As the model decides, without owed refunds (a peek applies none).
        let (allowed, denied_by, grant) = decide(m, &asks, capped, lease_part, now);
        if got.allowed != allowed || got.denied_by != denied_by || got.state.is_some() {
            c.fail(format!("peek {id}: {got:?}, model {allowed} {denied_by:?}"))
        }
        for (k, g) in grant.iter().enumerate() {
            let want = if allowed { g.unwrap_or(0) } else { 0 };
            if got.parts[k].reserved != want {
                c.fail(format!("peek {id}: part {k}: {got:?}, model {want}"))
            }
        }
        *m.counts.entry("peek").or_default() += 1;
        return;
    }
    let op = Reserve::new(&m.subject, &id, parts, lease_ms, mode).unwrap();
    let idem = Idempotency::new(id.as_bytes(), b"reserve");
    let Some(got) = keyed(c, &op, &idem).await else { return };
    // The model: owed refunds first, then every part decided.
    let mut qparts: Vec<Option<usize>> = qs.iter().map(|&q| Some(q)).collect();
    if lease_part {
        qparts.push(None);
    }
    let back = owed_first(m, &qparts, now, None);
    let (allowed, denied_by, grant) = decide(m, &asks, capped, lease_part, now);
    let lease_ok = !lease_part || live(m, now) < SLOTS;
    let ctx = format!("reserve {id} {asks:?} lease {lease_part}: {got:?}");
    if got.allowed != allowed || got.denied_by != denied_by {
        let states: Vec<&Quota> = asks.iter().map(|&(q, ..)| &m.quotas[q]).collect();
        c.fail(format!("{ctx}: model allowed {allowed}, denied_by {denied_by:?}, back {back:?}, quotas {states:?}"))
    }
    let mut held = Vec::new();
    for (k, &(q, ..)) in asks.iter().enumerate() {
        let p = got.parts[k];
        let r = if allowed { grant[k].unwrap() } else { 0 };
        if allowed {
            m.quotas[q].add(r, Some(&id));
        }
        let PartOutcome::Quota(o) = p.outcome else { c.fail(format!("{ctx}: part {k}")) };
        let want = (r, back[k], m.quotas[q].size(), m.quotas[q].remaining());
        if (p.reserved, p.back, o.limit, o.remaining) != want {
            c.fail(format!("{ctx}: part {k}: model (reserved, back, limit, remaining) {want:?}"))
        }
        held.push(Some(Held { q, reserved: r, charged: r, used: 0 }));
    }
    if lease_part {
        let PartOutcome::Lease { result, in_use, .. } = got.parts[asks.len()].outcome else { c.fail(ctx) };
        let want = if lease_ok { LeaseResult::Acquired } else { LeaseResult::Full };
        let in_model = live(m, now) + i64::from(allowed);
        if result != want || in_use != in_model {
            c.fail(format!("{ctx}: lease: model {want:?}, {in_model} in use"))
        }
        held.push(None);
    }
    *m.counts.entry(if allowed { "reserved" } else { "denied" }).or_default() += 1;
    if !allowed {
        return;
    }
    let ends = got.expires_at_ms.unwrap_or_else(|| c.fail(format!("{ctx}: no lease end")));
    if !(now..=now_ms() + 1).contains(&(ends - lease_ms)) {
        c.fail(format!("{ctx}: lease end {ends} not {lease_ms} ms after the call ({now})"))
    }
    for h in held.iter().flatten() {
        let q = &mut m.quotas[h.q];
        if q.refund {
            let where_ = match q.algo {
                Algorithm::FixedWindow { window_ms, .. } => (now / window_ms + 1) * window_ms,
                _ => 0,
            };
            q.due.push((ends, format!("{id}:{}:{where_}", h.reserved), id.clone(), h.reserved));
        }
    }
    m.res.insert(
        id.clone(),
        Res { reserve: op.clone(), held, lease: lease_part, ends, state: State::Open, answer: None },
    );
    m.replays.push((Replay::Reserve(op, got), idem));
}

/// A settle, extend or release of `id`, open or finished.
async fn finish(c: &mut Client, m: &mut Model, id: &str, what: &str, calm: bool) {
    let r = m.res[id].clone();
    let amounts: Vec<i64> =
        r.held.iter().map(|h| h.as_ref().map_or(0, |h| c.rng.range(0, 2 * h.reserved + 2))).collect();
    let lease_ms = if calm && c.rng.percent(30) { c.rng.range(SHORT.0, SHORT.1) } else { FOREVER };
    let now = clear_of_lease_ends(m).await;
    m.next += 1;
    let key = format!("{id}-{what}-{}", m.next);
    let ctx = format!("{what} {id} {amounts:?} ({:?}, ends {}, now {now})", r.state, r.ends);
    let got = match what {
        "settle" => {
            let op = r.reserve.settle(&amounts).unwrap();
            let idem = Idempotency::new(key.as_bytes(), format!("{amounts:?}").as_bytes());
            let got = keyed(c, &op, &idem).await;
            if let Some(g) = &got
                && r.state == State::Open
            {
                m.replays.push((Replay::Settle(op, g.clone()), idem));
            }
            got
        }
        "extend" => {
            let op = r.reserve.extend(lease_ms, &amounts).unwrap();
            keyed(c, &op, &Idempotency::new(key.as_bytes(), b"extend")).await
        }
        _ => keyed(c, &r.reserve.release().unwrap(), &Idempotency::new(key.as_bytes(), b"release")).await,
    };
    let Some(got) = got else { return };
    let ctx = format!("{ctx}: {got:?}");
    if r.state != State::Open {
        // Finished: the first settlement's answer, nothing done.
        let first = r.answer.clone().unwrap();
        if !got.already_settled || got.state != first.state || got.parts != first.parts {
            c.fail(format!("{ctx}: not the first settlement {first:?}"))
        }
        *m.counts.entry("already").or_default() += 1;
        return;
    }
    let qparts: Vec<Option<usize>> = r.held.iter().map(|h| h.as_ref().map(|h| h.q)).collect();
    let back = owed_first(m, &qparts, now, Some(id));
    let expired = ended(&r, now);
    let mut parts = Vec::new();
    let mut held = r.held.clone();
    let ends = if what == "extend" && !expired { got.expires_at_ms } else { r.ends };
    for (k, h) in held.iter_mut().enumerate() {
        let Some(h) = h else {
            parts.push(SettledPart::Lease { done: !expired });
            continue;
        };
        let q = &mut m.quotas[h.q];
        let owed = if q.refund { (h.reserved - h.used).max(0) } else { 0 };
        let own = q.due.iter().position(|e| e.2 == id);
        let (actual, mut refunded, mut charged);
        refunded = 0;
        charged = 0;
        if expired {
            actual = h.charged - owed;
            if owed > 0 && own.is_some() {
                refunded = q.give(owed, id);
                m.back += refunded;
            }
        } else if what == "extend" {
            let used = amounts[k].max(h.used);
            actual = used;
            if used > h.charged {
                charged = q.charge(used - h.charged).0;
            }
        } else {
            actual = if what == "release" { h.used } else { amounts[k].max(h.used) };
            if actual < h.reserved {
                refunded = q.give(h.reserved - actual, id);
            } else if actual > h.charged {
                charged = q.charge(actual - h.charged).0;
            }
        }
        let debt = (q.count() - q.size()).max(0);
        let uncharged = (actual - h.charged - charged).max(0);
        // The expiry queue: own entry gone, or (extend) rescheduled with what is owed now.
        if let Some(i) = own {
            q.due.remove(i);
        }
        if what == "extend" && !expired {
            h.used = actual;
            h.charged += charged;
            let left = (h.reserved - h.used).max(0);
            if q.refund && left > 0 {
                let where_ = match q.algo {
                    Algorithm::FixedWindow { window_ms, .. } => (now / window_ms + 1) * window_ms,
                    _ => 0,
                };
                q.due.push((ends, format!("{id}:{left}:{where_}"), id.to_string(), left));
            }
        } else if expired && owed > 0 {
            m.owed += owed;
        }
        parts.push(SettledPart::Quota {
            reserved: h.reserved,
            actual,
            refunded,
            charged,
            uncharged,
            debt,
            back: back[k],
        });
    }
    let state = if expired {
        State::Expired
    } else {
        match what {
            "settle" => State::Settled,
            "release" => State::Released,
            _ => State::Open,
        }
    };
    if got.state != Some(state) || got.already_settled || got.parts != parts {
        c.fail(format!("{ctx}: model {state:?} {parts:?}"))
    }
    let entry = m.res.get_mut(id).unwrap();
    entry.held = held;
    entry.ends = ends;
    entry.state = state;
    if state != State::Open {
        entry.answer = Some(got);
    }
    *m.counts.entry(if expired { "expired" } else { "finished" }).or_default() += 1;
}

/// An answered keyed write sent again: the same answer, nothing written; or another request
/// under its key: refused, nothing written.
async fn replay(c: &mut Client, m: &mut Model) {
    let (what, idem) = m.replays[c.rng.index(m.replays.len())].clone();
    let clash = c.rng.percent(25);
    let now = clear_of_lease_ends(m).await;
    let ids: Vec<String> = m.res.keys().cloned().collect();
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    let keys = m.keys(&ids);
    let before = dump(c, &keys, None).await;
    let idem = if clash { Idempotency { fingerprint: format!("{}x", idem.fingerprint), ..idem } } else { idem };
    let got: Result<String, redcount::Error> = match &what {
        Replay::Reserve(op, first) => {
            // The reservation as it is now.
            let state = m
                .res
                .get(op.id())
                .map(|r| if r.state == State::Open && ended(r, now) { State::Expired } else { r.state });
            let want = Reservation { state, ..first.clone() };
            c.direct
                .run(&Idempotent::new(op.clone(), Some(idem.clone())))
                .await
                .map(|got| if got == want { String::new() } else { format!("{got:?}, first {want:?}") })
        }
        Replay::Settle(op, first) => c
            .direct
            .run(&Idempotent::new(op.clone(), Some(idem.clone())))
            .await
            .map(|got| if got == *first { String::new() } else { format!("{got:?}, first {first:?}") }),
    };
    match got {
        Err(redcount::Error::Transport(_)) => return,
        Err(redcount::Error::Redis(e)) if matches!(e.kind, ErrorKind::OutOfMemory | ErrorKind::Unavailable) => return,
        Err(redcount::Error::Redis(e)) if clash && e.kind == ErrorKind::IdempotencyConflict => {}
        Ok(diff) if !clash && diff.is_empty() => {}
        other => c.fail(format!("{} {what:?}: {other:?}", if clash { "a clash" } else { "a replay" })),
    }
    let after = dump(c, &keys, Some(now)).await;
    if let (Some(b), Some(a)) = (before, after)
        && b != a
    {
        let changed: Vec<&String> =
            keys.iter().zip(b.1.iter().zip(&a.1)).filter(|(_, (x, y))| x != y).map(|(k, _)| k).collect();
        c.fail(format!("a replay or a clash wrote {changed:?} ({what:?})"))
    }
    *m.counts.entry(if clash { "clash" } else { "replay" }).or_default() += 1;
}

/// An admin override of a quota's size (set or cleared), or an admin refund.
async fn override_or_refund(c: &mut Client, m: &mut Model, over: bool) {
    let q = c.rng.index(m.quotas.len());
    let (name, level, algo) = (m.quotas[q].name, m.quotas[q].level, m.quotas[q].algo);
    m.next += 1;
    let idem = Idempotency::new(format!("admin-{}-{}", c.n, m.next).as_bytes(), b"admin");
    let _ = clear_of_lease_ends(m).await;
    if over {
        let size = c.rng.range(6, 20);
        let clear = c.rng.percent(40);
        let op = if clear {
            OverrideQuota::clear_at(name, &m.subject, level)
        } else {
            OverrideQuota::set_at(name, &m.subject, level, algo, size, 0)
        }
        .unwrap();
        if keyed(c, &op, &idem).await.is_some() {
            m.quotas[q].ovr = (!clear).then_some(size);
            *m.counts.entry("override").or_default() += 1;
        }
    } else {
        let units = c.rng.range(1, 8);
        let op = RefundQuota::new_at(name, &m.subject, level, algo, units).unwrap();
        if let Some(given) = keyed(c, &op, &idem).await {
            let want = m.quotas[q].refund(units);
            if given != want {
                c.fail(format!("refund {units} of {name} {level:?}: {given}, model {want}"))
            }
            *m.counts.entry("refund").or_default() += 1;
        }
    }
}

/// Redis's state of each quota against the model's.
fn check_state(env: &Env, m: &Model) {
    let mut conn = env.conn();
    for q in &m.quotas {
        let key = keys::quota_at(q.name, &m.subject, q.level, q.algo.tag());
        let what = format!("{} {}, {:?} (seed {})", m.subject, q.name, q.level, env.ctx.seed);
        match q.algo {
            Algorithm::FixedWindow { .. } => {
                let v: Option<i64> = redis::cmd("GET").arg(&key).query(&mut conn).unwrap();
                assert_eq!(v.unwrap_or(0), q.used, "{what}");
            }
            Algorithm::SlidingWindow { .. } => {
                let members: Vec<String> = redis::cmd("ZRANGE").arg(&key).arg(0).arg(-1).query(&mut conn).unwrap();
                let mut totals = Vec::new();
                let log: Vec<(i64, Option<String>)> = members
                    .iter()
                    .map(|s| {
                        let mut f = s.split(':');
                        totals.push(f.next().unwrap()[1..].parse::<i64>().unwrap());
                        (f.next().unwrap().parse().unwrap(), f.next().map(String::from))
                    })
                    .collect();
                assert_eq!(log, q.log, "{what}");
                // Each running total is the one before plus the entry's cost.
                for i in 1..log.len() {
                    assert_eq!(totals[i] - totals[i - 1], log[i].0, "{what}: {members:?}");
                }
            }
            Algorithm::TokenBucket { .. } => {
                let t: Option<i64> = redis::cmd("HGET").arg(&key).arg("tokens").query(&mut conn).unwrap();
                assert_eq!(t, q.tokens, "{what}");
            }
            Algorithm::Gcra { rate, period_ms, .. } => {
                let (t, r, d): (Option<i64>, Option<i64>, Option<i64>) =
                    redis::cmd("HMGET").arg(&key).arg("t").arg("r").arg("d").query(&mut conn).unwrap();
                let (secs, micros): (i64, i64) = redis::cmd("TIME").query(&mut conn).unwrap();
                let ahead = t.map_or(0, |t| ((t - (secs * 1_000_000 + micros)) * rate + r.unwrap_or(0)).max(0));
                let unit = period_ms * 1000;
                assert_eq!(((ahead + unit - 1) / unit, d), (q.ahead, q.d), "{what}");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reservations_match_the_model_under_faults() {
    let (mut env, rounds) = Env::start("reservations_match_the_model_under_faults").await;
    let mut clients = env.clients(10).await;
    let models = Arc::new(Mutex::new((0..CLIENTS).map(Model::new).collect::<Vec<_>>()));
    for round in 0..rounds {
        let calm = matches!(env.schedule[round], Fault::Calm | Fault::ScriptFlush);
        let last = round + 1 == rounds;
        let ms = models.clone();
        env.round(round, &mut clients, 150, move |c| client_round(c, ms.clone(), calm, last)).await;
    }
    // Every open reservation settled or ended, every owed refund given back (a call on each
    // quota until none gives anything back), then Redis holds what the model holds.
    let mut all = std::mem::take(&mut *models.lock().unwrap());
    for (c, m) in clients.iter_mut().zip(all.iter_mut()) {
        let open: Vec<String> = m.res.iter().filter(|(_, r)| r.state == State::Open).map(|(k, _)| k.clone()).collect();
        for id in open {
            finish(c, m, &id, "settle", false).await;
        }
        for sweep in 0.. {
            let qs: Vec<usize> = (0..m.quotas.len()).collect();
            let now = clear_of_lease_ends(m).await;
            m.next += 1;
            let id = format!("sweep{}", m.next);
            let parts: Vec<Part> = qs.iter().map(|&q| m.part(q, 1)).collect();
            let r = Reserve::new(&m.subject, &id, parts, 60_000, Mode::Capped).unwrap();
            let got = keyed(c, &r, &Idempotency::new(id.as_bytes(), b"sweep")).await.expect("Redis is up");
            let qparts: Vec<Option<usize>> = qs.iter().map(|&q| Some(q)).collect();
            let back = owed_first(m, &qparts, now, None);
            let reported: Vec<i64> = got.parts.iter().map(|p| p.back).collect();
            assert_eq!(reported, back, "sweep of {}: {got:?}", m.subject);
            if got.allowed {
                for (k, p) in got.parts.iter().enumerate() {
                    m.quotas[k].add(p.reserved, Some(&id));
                }
                let st = keyed(c, &r.release().unwrap(), &Idempotency::new(format!("{id}-rel").as_bytes(), b"r"))
                    .await
                    .unwrap();
                for (k, p) in st.parts.iter().enumerate() {
                    let SettledPart::Quota { reserved, refunded, .. } = *p else { unreachable!() };
                    assert_eq!(refunded, m.quotas[k].give(reserved, &id), "{st:?}");
                }
            }
            if back.iter().sum::<i64>() == 0 {
                break;
            }
            assert!(sweep < 100);
        }
        assert_eq!(pending(m), 0, "{}: every owed refund given back", m.subject);
        tokio::time::sleep(Duration::from_millis(5)).await;
        check_state(&env, m);
        env.ctx.say(format!("{}: {:?}", m.subject, m.counts));
    }
    let total = |k: &str| all.iter().map(|m| m.counts.get(k).copied().unwrap_or(0)).sum::<usize>();
    for k in ["reserved", "denied", "finished", "expired", "already", "replay", "clash", "peek", "override", "refund"] {
        assert!(total(k) > 0, "no {k} in the run (seed {})", env.ctx.seed);
    }
}

/// Units still owed (refund entries of expired reservations not yet given back): none after
/// the sweep.
fn pending(m: &Model) -> i64 {
    m.quotas.iter().flat_map(|q| q.due.iter()).map(|e| e.3).sum()
}
