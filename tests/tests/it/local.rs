//! Local decisions against a real redis-server: several shells, each a [`Local`] (denials
//! repeated from memory, budget leases) with a clock of its own, run seeded random takes and
//! peeks of one Redis, answers held back and delivered late, overrides raised and lowered,
//! refunds and resets through one shell or another, clocks stepped forward and back, leases
//! given back when due, every shell drained at the end. A lease running low is renewed in the
//! background ([`Local::due`]): the model holds renewals back while the old stock is used,
//! fails some (lost before Redis, or run and their answer lost), and answers some only after
//! their shell was drained.
//!
//! Checked on every answer: a denial repeated from memory (`"cached": true`) comes from a
//! denial Redis gave that shell, sent after the last override, refund or reset of the subject's
//! policy through that shell, less than `cache_denials_ms` and its `retry_after_ms` before,
//! with that `retry_after_ms` shrunk by the time since; so no shell denies from memory for
//! longer than `cache_denials_ms` after a raise anywhere. Checked at the end: in every window
//! of a fixed-window policy, the units admitted (from Redis or from a lease's stock) never
//! exceed the largest limit in force (since the last reset, counting the limits of the
//! `borrow.ms` before it, when lent units still in use were charged), less what refunds gave
//! back. A refund through a shell holding a lease of the subject puts units back into it
//! first: every return a lease makes is checked against its record in Redis (never more than
//! it was lent), and for `long`, whose window outlasts the run and which is only taken and
//! refunded (of more units at times than were admitted), admissions less refunds stay within
//! the limit at every answer and Redis ends counting exactly admissions less refunds.
//!
//! Shell clocks never lag the real one (Redis's, on this machine): a lease's end is reckoned
//! on the shell's clock from the time its borrow was sent, and a clock that lags would stretch
//! it (the README says so). They jump ahead, and back (which drops a shell's state).
//! `REDCOUNT_SEED` replays a run; `REDCOUNT_MODEL_STEPS` sets its length.

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redcount::{Direct, Error};
use redcount_api::{ApiRequest, ApiResponse, Config, Exchange, Local, Step, Wait};
use redcount_tests::RedisServer;
use serde_json::Value;

use crate::model::{Rng, seed};

const WINDOW: i64 = 1_000;
const POLICIES: &str = r#"{
  "lease": {"kind": "quota", "algorithm": "fixed", "limit": 16, "window_ms": 1000, "max_cost": 3, "cache_denials_ms": 300, "borrow": {"units": 4, "ms": 500}},
  "plain": {"kind": "quota", "algorithm": "fixed", "limit": 6, "window_ms": 1000, "max_cost": 2, "cache_denials_ms": 400},
  "rate": {"kind": "quota", "algorithm": "gcra", "rate": 4, "period_ms": 1000, "burst": 4, "max_cost": 2, "cache_denials_ms": 250},
  "long": {"kind": "quota", "algorithm": "fixed", "limit": 200, "window_ms": 3600000, "max_cost": 3, "cache_denials_ms": 300, "borrow": {"units": 8, "ms": 500}}
}"#;
/// `long`'s limit: its window outlasts the run, so Redis's count is checked against every
/// admission and refund of it, exactly.
const LONG_LIMIT: i64 = 200;
const ADMIN: &str = "local-model-admin-token-0123";
const SHELLS: usize = 3;
const SUBJECTS: [&str; 2] = ["ann", "bo"];
const BORROW_MS: i64 = 500;

fn unix_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as i64
}

/// A denial Redis gave a shell.
#[derive(Debug, Clone, Copy)]
struct Denied {
    seq: u64,
    sent_real: i64,
    sent_shell: u64,
    retry: i64,
}

/// A call in flight.
struct Held {
    ex: Exchange,
    asked: Asked,
}

/// What a shell was asked, and when.
#[derive(Debug, Clone)]
struct Asked {
    policy: &'static str,
    subject: &'static str,
    cost: i64,
    peek: bool,
    seq: u64,
    sent_real: i64,
    sent_shell: u64,
    /// When it was handed to Redis (real unix ms): a call held back is sent only then.
    delivered_real: i64,
    /// Real unix ms read just before the shell's clock (`sent_real` just after): a lease that
    /// admitted at that shell time was within its window at this one, however long the thread
    /// was held between the two reads on a loaded machine.
    read_real: i64,
}

struct Shell {
    local: Local,
    /// Its clock: real ms since the run began, plus this (never negative: never behind).
    skew: u64,
    /// The last time it told its local state (what the state's clock is at: after a step back,
    /// below earlier ones).
    seen: std::cell::Cell<u64>,
    held: Vec<Held>,
    /// Redis's denials to this shell, by (policy, subject, cost).
    denied: BTreeMap<(&'static str, &'static str, i64), Vec<Denied>>,
    /// The last override, refund or reset of (policy, subject) through this shell.
    forgot: BTreeMap<(&'static str, &'static str), u64>,
}

struct Run {
    rng: Rng,
    config: Config,
    redis: Direct,
    started: Instant,
    seq: u64,
    shells: Vec<Shell>,
    /// Units admitted, by (policy, subject, window, segment).
    admitted: BTreeMap<(&'static str, &'static str, i64, u64), i64>,
    /// Units refunded, likewise.
    refunded: BTreeMap<(&'static str, &'static str, i64, u64), i64>,
    /// Resets so far, by (policy, subject): the segment, and when (real unix ms) each began.
    segments: BTreeMap<(&'static str, &'static str), Vec<i64>>,
    /// The limit in force by (policy, subject), each change with its real unix ms.
    limits: BTreeMap<(&'static str, &'static str), Vec<(i64, i64)>>,
    /// Every shell's cache_denials_ms, by policy.
    cache_ms: BTreeMap<&'static str, i64>,
    /// Renewals: handed out, answered with units while the shell still held some (two leases
    /// at once), failed, answered after their shell was drained.
    renewals: [u64; 4],
    /// `long`, by subject: units admitted, units refunded, units lent to a renewal that ran
    /// and whose answer was lost (stranded until the window ends).
    long: BTreeMap<&'static str, [i64; 3]>,
    /// Refunds a shell put back into its own lease (some of their units, or all), and units.
    refunds_here: [i64; 2],
    log: Vec<String>,
}

impl Run {
    fn fail(&self, why: String) -> ! {
        let tail = self.log.len().saturating_sub(40);
        panic!("REDCOUNT_SEED={}: {why}\nlast steps:\n{}", seed(), self.log[tail..].join("\n"));
    }

    /// The shell's clock, read to be told to its local state (which remembers the last).
    fn shell_now(&self, i: usize) -> u64 {
        let now = self.shell_clock(i);
        self.shells[i].seen.set(now);
        now
    }

    /// The shell's clock, read for the test's own use: a clock set back below this but not
    /// below what the local state last saw would be one that lags, unseen.
    fn shell_clock(&self, i: usize) -> u64 {
        self.started.elapsed().as_millis() as u64 + self.shells[i].skew
    }

    fn segment(&self, policy: &'static str, subject: &'static str) -> u64 {
        self.segments.get(&(policy, subject)).map_or(0, |s| s.len() as u64)
    }

    async fn ask(&mut self, i: usize, asked: Asked, body: String) {
        let path = format!("/api/quotas/{}/{}", asked.policy, asked.subject);
        let (method, query) =
            if asked.peek { ("GET", format!("cost={}", asked.cost)) } else { ("POST", String::new()) };
        let body = if asked.peek { String::new() } else { body };
        let mut may_wait = true;
        loop {
            let req = ApiRequest {
                method,
                path: &path,
                query: &query,
                authorization: None,
                origin: None,
                idempotency_key: None,
                body: body.as_bytes(),
            };
            let before = unix_ms();
            let now = self.shell_now(i);
            let mut asked = asked.clone();
            asked.sent_shell = now;
            asked.sent_real = unix_ms();
            asked.read_real = before;
            let step = self.shells[i].local.handle(&self.config, &req, now, may_wait, &mut self.rng);
            match step {
                Ok(Step::Respond(r)) => return self.check(i, &asked, &r, false),
                Ok(Step::Script(_)) => self.fail(format!("shell {i}: a first step asked for a script")),
                Ok(Step::Send(ex)) => {
                    if self.shells[i].held.len() < 4 && self.rng.percent(30) {
                        self.log.push(format!("  held by shell {i}"));
                        self.shells[i].held.push(Held { ex, asked });
                    } else {
                        self.deliver(i, Held { ex, asked }).await;
                    }
                    return;
                }
                Err(Wait) => {
                    self.log.push(format!("  shell {i}: wait"));
                    // As a shell would: the borrow under way is answered, then ask again (a
                    // second time without waiting).
                    if !self.shells[i].held.is_empty() && self.rng.percent(70) {
                        let at = self.rng.index(self.shells[i].held.len());
                        let held = self.shells[i].held.remove(at);
                        self.deliver(i, held).await;
                    } else {
                        may_wait = false;
                    }
                }
            }
        }
    }

    async fn deliver(&mut self, i: usize, held: Held) {
        let Held { ex, mut asked } = held;
        asked.delivered_real = unix_ms();
        let renewal = asked.policy == "-" && ex.must_finish();
        if asked.policy == "-" && !renewal {
            self.check_return(i, &ex).await;
        }
        let r = if renewal && self.rng.percent(20) {
            // A renewal that fails: lost before Redis, or run there and its answer lost (its
            // units stranded until the window ends: fewer admissions, never more).
            let ran = self.rng.percent(50);
            if ran {
                let before = self.long_counts().await;
                let _ = self.redis.send(ex.command()).await;
                for (&subject, (was, now)) in SUBJECTS.iter().zip(before.into_iter().zip(self.long_counts().await)) {
                    self.long.entry(subject).or_default()[2] += now - was;
                }
            }
            self.log.push(format!("  shell {i}: a renewal fails ({})", if ran { "ran" } else { "never sent" }));
            self.renewals[2] += 1;
            let now = self.shell_now(i);
            self.shells[i].local.answered(ex.fail("lost by the model"), now)
        } else {
            let before = self.shells[i].local.lent();
            let r = self.drive(i, ex).await;
            if renewal && before > 0 && self.shells[i].local.lent() > before {
                self.renewals[1] += 1;
            }
            r
        };
        self.check(i, &asked, &r, true);
    }

    /// Redis's count of `long` for each subject.
    async fn long_counts(&self) -> Vec<i64> {
        let mut counts = Vec::new();
        for subject in SUBJECTS {
            let key = redcount_core::keys::quota("long", subject, "fw");
            counts.push(match self.redis.send(&redcount_core::Command::new("GET").arg(&key)).await {
                Ok(redcount_core::Value::Bytes(b)) => String::from_utf8(b).unwrap().parse().unwrap(),
                _ => 0,
            });
        }
        counts
    }

    /// A lease's return, before it is sent: never more units than Redis lent that lease (its
    /// record), whatever refunds put back into its stock; a `long` lease's record is there
    /// while it holds units (its window outlasts the run).
    async fn check_return(&mut self, i: usize, ex: &Exchange) {
        let parts = ex.command().parts();
        let [.., lent_key, op, units, id] = parts else { return };
        if op != "return" {
            return;
        }
        let units: i64 = units.parse().unwrap();
        let cmd = redcount_core::Command::new("HGET").arg(lent_key).arg(id);
        let record = match self.redis.send(&cmd).await {
            Ok(redcount_core::Value::Bytes(b)) => Some(String::from_utf8(b).unwrap().parse::<i64>().unwrap()),
            _ => None,
        };
        self.log.push(format!("  shell {i}: returns {units} of lease {id} (lent {record:?})"));
        match record {
            Some(lent) if units > lent => {
                self.fail(format!("shell {i}: lease {id} returns {units} units, more than the {lent} it was lent"))
            }
            None if units > 0 && lent_key.contains(":long:") => {
                self.fail(format!("shell {i}: lease {id} returns {units} units with no record of them in Redis"))
            }
            _ => {}
        }
    }

    /// A lease given back, or a renewal, as `Held`.
    fn background_call(ex: Exchange, now: u64) -> Held {
        Held {
            ex,
            asked: Asked {
                policy: "-",
                subject: "-",
                cost: 0,
                peek: false,
                seq: 0,
                sent_real: 0,
                sent_shell: now,
                delivered_real: 0,
                read_real: 0,
            },
        }
    }

    /// Sends `ex` to Redis, and whatever call follows it, until shell `i` answers.
    async fn drive(&mut self, i: usize, mut ex: Exchange) -> ApiResponse {
        loop {
            let step = match self.redis.send(ex.command()).await {
                Ok(v) => ex.receive_value(Ok(v)),
                Err(Error::Redis(e)) => ex.receive_value(Err(e)),
                Err(e) => self.fail(format!("Redis did not answer: {e}")),
            };
            let now = self.shell_now(i);
            let step = match self.shells[i].local.after(step, now) {
                // Redis lost a script (flushed): the EVAL with the text the test links.
                Step::Script(wants) => self.shells[i].local.after(wants.give_compiled_script(), now),
                step => step,
            };
            match step {
                Step::Respond(r) => return r,
                Step::Send(next) => ex = next,
                Step::Script(_) => self.fail(format!("shell {i}: a script asked for twice")),
            }
        }
    }

    /// Checks an answer and counts what it admitted.
    fn check(&mut self, i: usize, asked: &Asked, r: &ApiResponse, from_redis: bool) {
        if asked.policy == "-" {
            return; // a lease given back
        }
        let j: Value = serde_json::from_str(&r.body).unwrap_or(Value::Null);
        if r.status != 200 {
            self.fail(format!("shell {i}: {asked:?} answered {} {}", r.status, r.body));
        }
        let allowed = j["allowed"] == Value::Bool(true);
        let cached = j["cached"] == Value::Bool(true);
        let retry = j["retry_after_ms"].as_i64().unwrap();
        // A local answer is of the time the shell was asked at.
        let (now_shell, now_real) =
            if from_redis { (self.shell_clock(i), unix_ms()) } else { (asked.sent_shell, asked.sent_real) };
        self.log.push(format!(
            "  shell {i} at {now_shell}: {} {}/{} cost {}: {}",
            if asked.peek { "peek" } else { "take" },
            asked.policy,
            asked.subject,
            asked.cost,
            r.body
        ));
        let key = (asked.policy, asked.subject, asked.cost);
        if cached {
            if from_redis || allowed {
                self.fail(format!("shell {i}: a cached answer from Redis, or an admission marked cached: {}", r.body));
            }
            let cache_ms = self.cache_ms[asked.policy];
            let forgot = self.shells[i].forgot.get(&(asked.policy, asked.subject)).copied().unwrap_or(0);
            let denials = self.shells[i].denied.get(&key).cloned().unwrap_or_default();
            let from = denials.iter().find(|d| {
                let life = cache_ms.min(d.retry);
                let gone = now_shell as i64 - d.sent_shell as i64;
                // (The shell's clock and the real one are read apart and each cut to whole
                // ms: they may differ by 1.)
                d.seq > forgot
                    && d.sent_real <= now_real
                    && now_real < d.sent_real + life + 1
                    && gone < life
                    && retry == (d.retry - gone).max(1)
            });
            if from.is_none() {
                let recent: Vec<_> = denials.iter().rev().take(4).collect();
                self.fail(format!(
                    "shell {i}: {} repeated from memory at {now_shell} (real {now_real}) comes from no denial of Redis's within cache_denials_ms {cache_ms} and its retry_after_ms, after the last forget (#{forgot}): the last {} of {}: {recent:?}",
                    r.body,
                    recent.len(),
                    denials.len()
                ));
            }
            return;
        }
        if from_redis && !allowed {
            self.shells[i].denied.entry(key).or_default().push(Denied {
                seq: asked.seq,
                sent_real: asked.sent_real,
                sent_shell: asked.sent_shell,
                retry,
            });
        }
        if allowed && !asked.peek && asked.policy == "long" {
            let [admitted, refunded, _] = self.long.entry(asked.subject).or_default();
            *admitted += asked.cost;
            if *admitted - *refunded > LONG_LIMIT {
                let (a, r) = (*admitted, *refunded);
                self.fail(format!("long/{}: {a} units admitted, {r} refunded, past {LONG_LIMIT}", asked.subject));
            }
        } else if allowed && !asked.peek && asked.policy != "rate" {
            // The window the units count in: from Redis, the one whose end `reset_ms` names
            // (reckoned from when the call was handed to Redis: one held back goes later than
            // it was asked, by more than half a window at times); from a lease's stock, now's
            // (a lease ends before its window).
            let window = if from_redis {
                let reset = j["reset_ms"].as_i64().unwrap();
                ((asked.delivered_real + reset) as f64 / WINDOW as f64).round() as i64 - 1
            } else {
                asked.read_real / WINDOW
            };
            let seg = self.segment(asked.policy, asked.subject);
            *self.admitted.entry((asked.policy, asked.subject, window, seg)).or_default() += asked.cost;
        }
    }

    async fn admin(&mut self, i: usize) {
        // Takes under way are answered first, so each is counted on its side of a reset.
        for s in 0..self.shells.len() {
            while let Some(held) = self.shells[s].held.pop() {
                self.deliver(s, held).await;
            }
        }
        let policy = ["lease", "plain", "long"][self.rng.index(3)];
        let subject = SUBJECTS[self.rng.index(SUBJECTS.len())];
        let default = if policy == "lease" { 16 } else { 6 };
        // `long` is only refunded (its count is checked exactly): of more units at times than
        // were ever admitted, as an attacker holding the admin token would.
        let what = if policy == "long" { 3 } else { self.rng.below(5) };
        // Mostly through the shell holding the most units (likeliest to hold a lease of it).
        let i = if policy == "long" && self.rng.percent(70) {
            (0..self.shells.len()).max_by_key(|&s| self.shells[s].local.lent()).unwrap_or(i)
        } else {
            i
        };
        let (method, path, body) = match what {
            0 | 1 => {
                let limit = self.rng.range(1, 24);
                ("PUT", format!("/api/overrides/{policy}/{subject}"), format!(r#"{{"limit": {limit}}}"#))
            }
            2 => ("DELETE", format!("/api/overrides/{policy}/{subject}"), String::new()),
            3 => {
                let cost = self.rng.range(1, if policy == "long" { 6 } else { 3 });
                ("POST", format!("/api/quotas/{policy}/{subject}/refund"), format!(r#"{{"cost": {cost}}}"#))
            }
            _ => ("DELETE", format!("/api/quotas/{policy}/{subject}"), String::new()),
        };
        self.seq += 1;
        self.shells[i].forgot.insert((policy, subject), self.seq);
        let bearer = format!("Bearer {ADMIN}");
        let req = ApiRequest {
            method,
            path: &path,
            query: "",
            authorization: Some(&bearer),
            origin: None,
            idempotency_key: None,
            body: body.as_bytes(),
        };
        let now = self.shell_now(i);
        let lent = self.shells[i].local.lent();
        let r = match self.shells[i].local.handle(&self.config, &req, now, true, &mut self.rng) {
            Ok(Step::Send(ex)) => self.drive(i, ex).await,
            // A refund put back whole into this shell's lease.
            Ok(Step::Respond(r)) if method == "POST" => r,
            _ => self.fail(format!("{method} {path} was neither sent nor a refund answered here")),
        };
        let here = self.shells[i].local.lent() - lent;
        if here > 0 {
            self.refunds_here[0] += 1;
            self.refunds_here[1] += here;
        }
        self.log.push(format!("  shell {i}: {method} {path} {body}: {} {}", r.status, r.body));
        if r.status != 200 {
            self.fail(format!("{method} {path}: {} {}", r.status, r.body));
        }
        let j: Value = serde_json::from_str(&r.body).unwrap();
        let now_real = unix_ms();
        let limits = self.limits.entry((policy, subject)).or_insert_with(|| vec![(0, default)]);
        match (method, path.contains("overrides")) {
            ("PUT", _) => limits.push((now_real, j["limit"].as_i64().unwrap())),
            ("DELETE", true) => limits.push((now_real, default)),
            ("POST", _) if policy == "long" => {
                self.long.entry(subject).or_default()[1] += j["refunded"].as_i64().unwrap();
            }
            ("POST", _) => {
                let seg = self.segment(policy, subject);
                *self.refunded.entry((policy, subject, now_real / WINDOW, seg)).or_default() +=
                    j["refunded"].as_i64().unwrap();
            }
            _ => self.segments.entry((policy, subject)).or_default().push(now_real),
        }
    }

    async fn background(&mut self, i: usize) {
        let now = self.shell_now(i);
        self.background_at(i, now).await;
    }

    /// [`Run::background`] at the shell's time `now`.
    async fn background_at(&mut self, i: usize, now: u64) {
        let due = self.shells[i].local.due(now);
        for ex in due {
            if ex.must_finish() {
                self.renewals[0] += 1;
                // Held back: the old stock is used (or runs out) while it is in flight.
                if self.shells[i].held.len() < 6 && self.rng.percent(60) {
                    self.log.push(format!("  renewal held by shell {i}"));
                    self.shells[i].held.push(Run::background_call(ex, now));
                    continue;
                }
            }
            self.deliver(i, Run::background_call(ex, now)).await;
        }
    }

    /// The largest limit of (policy, subject) in force within [from, to] (real unix ms).
    fn limit_within(&self, policy: &'static str, subject: &'static str, from: i64, to: i64) -> i64 {
        let default = if policy == "lease" { 16 } else { 6 };
        let changes = self.limits.get(&(policy, subject)).cloned().unwrap_or_else(|| vec![(0, default)]);
        let mut most = 0;
        for (k, (at, limit)) in changes.iter().enumerate() {
            let until = changes.get(k + 1).map_or(i64::MAX, |c| c.0);
            if *at <= to && until >= from {
                most = most.max(*limit);
            }
        }
        most
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shells_with_caches_and_leases_never_admit_past_the_limit_nor_deny_from_memory_too_long() {
    let redis = RedisServer::start();
    let vars = [("REDCOUNT_POLICIES", POLICIES), ("REDCOUNT_ADMIN_TOKEN", ADMIN)];
    let config = Config::from_env(|n| vars.iter().find(|(k, _)| *k == n).map(|(_, v)| v.to_string())).unwrap();
    let steps = std::env::var("REDCOUNT_MODEL_STEPS").ok().and_then(|s| s.parse().ok()).unwrap_or(1500usize);
    let mut rng = Rng::new(seed(), "local");
    let shells = (0..SHELLS)
        .map(|_| Shell {
            local: Local::new(32, 8, rng.next()),
            skew: 0,
            seen: std::cell::Cell::new(0),
            held: Vec::new(),
            denied: BTreeMap::new(),
            forgot: BTreeMap::new(),
        })
        .collect();
    let mut run = Run {
        rng,
        config,
        redis: redis.direct().await,
        started: Instant::now(),
        seq: 0,
        shells,
        admitted: BTreeMap::new(),
        refunded: BTreeMap::new(),
        segments: BTreeMap::new(),
        limits: BTreeMap::new(),
        cache_ms: [("lease", 300), ("plain", 400), ("rate", 250), ("long", 300)].into_iter().collect(),
        renewals: [0; 4],
        long: BTreeMap::new(),
        refunds_here: [0; 2],
        log: Vec::new(),
    };
    let mut admitted_local = 0;
    for step in 0..steps {
        let i = run.rng.index(SHELLS);
        run.log.push(format!("step {step}, shell {i}"));
        match run.rng.below(100) {
            0..=61 => {
                let policy = ["lease", "lease", "plain", "rate", "long", "long"][run.rng.index(6)];
                let subject = SUBJECTS[run.rng.index(SUBJECTS.len())];
                let cost = run.rng.range(1, if policy == "lease" || policy == "long" { 3 } else { 2 });
                let peek = run.rng.percent(10);
                run.seq += 1;
                let asked = Asked {
                    policy,
                    subject,
                    cost,
                    peek,
                    seq: run.seq,
                    sent_real: 0,
                    sent_shell: 0,
                    delivered_real: 0,
                    read_real: 0,
                };
                let lent = run.shells[i].local.lent();
                run.ask(i, asked, format!(r#"{{"cost": {cost}}}"#)).await;
                if run.shells[i].local.lent() < lent {
                    admitted_local += 1;
                }
                // As the worker and `redcount serve` do after a response, often: the background
                // calls due (a renewal while the stock still admits).
                if run.shells[i].local.has_returns() && run.rng.percent(50) {
                    run.background(i).await;
                }
            }
            62..=76 => {
                if !run.shells[i].held.is_empty() {
                    let at = run.rng.index(run.shells[i].held.len());
                    let held = run.shells[i].held.remove(at);
                    run.deliver(i, held).await;
                }
            }
            77..=82 => run.admin(i).await,
            83..=89 => run.background(i).await,
            90..=93 => {
                // The shell's clock jumps ahead, or back below what its state last saw (never
                // behind the real one; a clock that only runs slower is one that lags).
                let real = run.started.elapsed().as_millis() as u64;
                let back = run.shells[i].seen.get().saturating_sub(real + 1);
                if run.rng.percent(70) || back == 0 {
                    run.shells[i].skew += run.rng.range(1, 400) as u64;
                } else {
                    run.shells[i].skew = back.saturating_sub(run.rng.range(0, 400) as u64);
                }
                let skew = run.shells[i].skew;
                run.log.push(format!("  shell {i}: clock skew now {skew} ms"));
                // The shell reads its clock at once (its next call), as it was set: ms passing
                // before the read would make a step back below what the state saw one that
                // only lags (real time passing that the state does not see).
                let now = real + skew;
                run.shells[i].seen.set(now);
                run.background_at(i, now).await;
            }
            _ => tokio::time::sleep(Duration::from_millis(run.rng.range(5, 60) as u64)).await,
        }
    }
    // Every shell stops: what is held is answered (some renewals only after the shell was
    // drained), every lease given back.
    for i in 0..SHELLS {
        let mut late = Vec::new();
        while let Some(held) = run.shells[i].held.pop() {
            if held.asked.policy == "-" && held.ex.must_finish() && run.rng.percent(50) {
                late.push(held);
            } else {
                run.deliver(i, held).await;
            }
        }
        // Renewals due now are sent before the drain; some answered only after it.
        let now = run.shell_now(i);
        for ex in run.shells[i].local.due(now) {
            let call = Run::background_call(ex, now);
            if call.ex.must_finish() {
                run.renewals[0] += 1;
                late.push(call);
            } else {
                run.deliver(i, call).await;
            }
        }
        let back = run.shells[i].local.drain();
        for ex in back {
            run.deliver(i, Run::background_call(ex, now)).await;
        }
        for held in late {
            run.log.push(format!("  shell {i}: a renewal answered after the drain"));
            run.renewals[3] += 1;
            run.deliver(i, held).await;
        }
        run.background(i).await;
        assert_eq!(run.shells[i].local.lent(), 0);
        assert_eq!(run.shells[i].local.renewing(), 0, "a renewal left unanswered");
    }
    // No window's admissions past the largest limit in force, less what refunds gave back.
    let mut windows = 0;
    for (&(policy, subject, window, seg), &n) in &run.admitted {
        let segments = run.segments.get(&(policy, subject)).cloned().unwrap_or_default();
        let start = (window * WINDOW).max(if seg == 0 { 0 } else { segments[seg as usize - 1] });
        let end = (window + 1) * WINDOW;
        let limit = run.limit_within(policy, subject, start - BORROW_MS, end);
        let back = run.refunded.get(&(policy, subject, window, seg)).copied().unwrap_or(0);
        if n - back > limit {
            run.fail(format!(
                "{policy}/{subject}: {n} units admitted in window {window} (segment {seg}), {back} refunded, past the limit {limit}"
            ));
        }
        windows += 1;
    }
    assert!(windows > 4, "the run crossed too few windows to say anything");
    // Every shell drained: Redis counts exactly what was admitted less what was refunded (and
    // what lost renewals stranded), so no refund gave back a unit twice and none was lost.
    let counts = run.long_counts().await;
    for (subject, count) in SUBJECTS.iter().zip(counts) {
        let [admitted, refunded, stranded] = run.long.get(subject).copied().unwrap_or_default();
        if count != admitted - refunded + stranded {
            run.fail(format!(
                "long/{subject}: Redis counts {count}, {admitted} admitted less {refunded} refunded plus {stranded} stranded"
            ));
        }
    }
    let [refunds_here, units_here] = run.refunds_here;
    assert!(refunds_here > 0, "no refund was put back into a lease");
    assert!(admitted_local > 0, "no take was admitted from a lease's stock");
    let [renewed, overlapped, failed, late] = run.renewals;
    assert!(renewed > 0, "no lease was renewed");
    eprintln!(
        "local model: seed {}, {steps} steps, {windows} windows, {admitted_local} admissions from stock, {renewed} renewals ({overlapped} answered while the old stock lasted, {failed} failed, {late} after the drain), {refunds_here} refunds put back {units_here} units into a lease, long: {:?}",
        seed(),
        run.long
    );
}

/// The lease script's edges against a real Redis: what is lent stays counted through a reset
/// and is never given back by an admin refund; a return gives back only its own lease's units,
/// once, in its own window; the script refuses what the core would.
#[tokio::test]
async fn lent_units_stay_counted_until_their_own_lease_gives_them_back() {
    use redcount_core::ops::quota::{Algorithm, BorrowQuota, RefundQuota, ResetQuota, ReturnQuota, TakeQuota};
    let redis = RedisServer::start();
    let d = redis.direct().await;
    let algo = Algorithm::FixedWindow { limit: 100, window_ms: 3_600_000 };
    let subject = redcount_tests::uid("s");
    let borrow = |units, lease: &str| BorrowQuota::new("q", &subject, algo, 1, units, lease, None).unwrap();
    // Adaptive: at most a quarter of what remains after the cost.
    let b = d.run(&borrow(50, "l1")).await.unwrap();
    assert_eq!((b.outcome.allowed, b.lent, b.outcome.remaining), (true, 24, 75));
    let b = d.run(&borrow(10, "l2")).await.unwrap();
    assert_eq!((b.lent, b.outcome.remaining), (10, 64));
    let count = |d: &Direct| {
        let k = redcount_core::keys::quota("q", &subject, "fw");
        let d = d.clone();
        async move {
            match d.send(&redcount_core::Command::new("GET").arg(&k)).await.unwrap() {
                redcount_core::Value::Bytes(b) => String::from_utf8(b).unwrap().parse::<i64>().unwrap(),
                _ => 0,
            }
        }
    };
    assert_eq!(count(&d).await, 36);
    // An admin refund gives back what was used, not what is lent.
    assert_eq!(d.run(&RefundQuota::new("q", &subject, algo, 5).unwrap()).await.unwrap(), 2);
    assert_eq!(count(&d).await, 34);
    // Nothing but lent units: a reset has nothing to forget.
    assert!(!d.run(&ResetQuota::new("q", &subject, algo).unwrap()).await.unwrap());
    // A reset forgets the use, not the units lent (the shells admit from them).
    d.run(&TakeQuota::take("q", &subject, algo, 3).unwrap()).await.unwrap();
    assert!(d.run(&ResetQuota::new("q", &subject, algo).unwrap()).await.unwrap());
    assert_eq!(count(&d).await, 34);
    let take = TakeQuota::take("q", &subject, algo, 66).unwrap();
    assert!(d.run(&take).await.unwrap().allowed, "the limit less what is lent");
    assert!(!d.run(&TakeQuota::take("q", &subject, algo, 1).unwrap()).await.unwrap().allowed);
    // A return gives back at most its own lease's units, once; an unknown lease nothing.
    assert_eq!(d.run(&ReturnQuota::new("q", &subject, 30, "l1").unwrap()).await.unwrap(), 24);
    assert_eq!(d.run(&ReturnQuota::new("q", &subject, 30, "l1").unwrap()).await.unwrap(), 0);
    assert_eq!(d.run(&ReturnQuota::new("q", &subject, 3, "nope").unwrap()).await.unwrap(), 0);
    assert_eq!(count(&d).await, 76);
    // A used-up lease named by the next borrow is forgotten: a reset then counts only live ones.
    let b = BorrowQuota::new("q", &subject, algo, 1, 5, "l3", Some("l2")).unwrap();
    assert_eq!(d.run(&b).await.unwrap().lent, 5);
    let lent = redcount_core::keys::quota_lent("q", &subject, "fw");
    let fields = d.send(&redcount_core::Command::new("HKEYS").arg(&lent)).await.unwrap();
    assert_eq!(fields, redcount_core::Value::Array(vec![redcount_core::Value::Bytes(b"l3".to_vec())]));
    assert!(d.run(&ResetQuota::new("q", &subject, algo).unwrap()).await.unwrap());
    assert_eq!(count(&d).await, 5);
    // The record expires with its window: a return after the window gives nothing back.
    let short = Algorithm::FixedWindow { limit: 100, window_ms: 300 };
    let s2 = redcount_tests::uid("s");
    let mut lent_then = 0;
    for _ in 0..20 {
        // (A borrow right at a window's end may see too little time left to be worth it.)
        lent_then = d.run(&BorrowQuota::new("w", &s2, short, 1, 8, "w1", None).unwrap()).await.unwrap().lent;
        if lent_then > 0 {
            break;
        }
    }
    assert_eq!(lent_then, 8);
    tokio::time::sleep(std::time::Duration::from_millis(350)).await;
    d.run(&TakeQuota::take("w", &s2, short, 1).unwrap()).await.unwrap();
    assert_eq!(d.run(&ReturnQuota::new("w", &s2, 8, "w1").unwrap()).await.unwrap(), 0);
    // Whatever the core would refuse, the script refuses too, having written nothing.
    let k = [
        redcount_core::keys::quota("q", &subject, "fw"),
        redcount_core::keys::quota_override("q", &subject),
        lent.clone(),
    ];
    let before = count(&d).await;
    for args in [
        vec!["borrow", "100", "3600000", "1", "5", "bad lease"],
        vec!["borrow", "100", "3600000", "1", "-1", "l9"],
        vec!["borrow", "100", "3600000", "-1", "5", "l9"],
        vec!["borrow", "100", "3600000", "1", "5"],
        vec!["return", "-1", "l3"],
        vec!["return", "1e3", "l3"],
        vec!["steal", "5", "l3"],
    ] {
        let mut cmd = redcount_core::Command::new("EVAL").arg(redcount_core::script::QUOTA_LEASE.source()).arg("3");
        for part in k.iter().map(String::as_str).chain(args.iter().copied()) {
            cmd = cmd.arg(part);
        }
        let r = d.send(&cmd).await;
        assert!(matches!(r, Err(Error::Redis(_))), "{args:?}: {r:?}");
    }
    assert_eq!(count(&d).await, before);
}

/// Policies of the tests through real shells.
const SHELL_POLICIES: &str = r#"{
  "flood": {"kind": "quota", "algorithm": "fixed", "limit": 3, "window_ms": 3600000},
  "raw": {"kind": "quota", "algorithm": "fixed", "limit": 3, "window_ms": 3600000, "cache_denials_ms": 0},
  "hot": {"kind": "quota", "algorithm": "fixed", "limit": 500, "window_ms": 3600000, "borrow": {"units": 50, "ms": 1000}}
}"#;

/// Script calls Redis has run so far.
fn script_calls(redis: &RedisServer) -> u64 {
    redis.calls("evalsha") + redis.calls("eval")
}

/// `n` takes of one exhausted subject of `policy`, 20 at a time: every one denied, with a
/// `retry_after_ms` that is the window's true remainder (from Redis's PTTL) at most, and at
/// most 250 ms (or the longest round trip seen) less than it. Returns the script calls Redis
/// ran meanwhile, the answers marked cached, and the seconds taken.
async fn flood(
    api: std::sync::Arc<redcount_tests::Api>,
    redis: &RedisServer,
    policy: &str,
    n: usize,
) -> (u64, u64, f64) {
    let subject = redcount_tests::uid("f");
    let path = format!("/api/quotas/{policy}/{subject}");
    for _ in 0..3 {
        assert_eq!(api.post(&path, "").await.json["allowed"], true);
    }
    // The first denial, alone: the flood then starts with it known (or not, without a cache).
    let first = Instant::now();
    assert_eq!(api.post(&path, "").await.json["allowed"], false);
    let first_rtt = first.elapsed().as_millis() as u64;
    let key = redcount_core::keys::quota(policy, &subject, "fw");
    let pttl: i64 = redis::cmd("PTTL").arg(&key).query(&mut redis.conn()).unwrap();
    // The window's end, on this process's clock (Redis runs on this machine).
    let end = Instant::now() + Duration::from_millis(pttl as u64);
    let before = script_calls(redis);
    let started = Instant::now();
    let tasks: Vec<_> = (0..20)
        .map(|t| {
            let (api, path) = (api.clone(), path.clone());
            tokio::spawn(async move {
                let (mut cached, mut seen, mut rtt) = (0, Vec::new(), 0);
                for _ in (t..n).step_by(20) {
                    let sent = Instant::now();
                    let r = api.post(&path, "").await;
                    let received = Instant::now();
                    assert_eq!((r.status, &r.json["allowed"]), (200, &Value::Bool(false)), "{}", r.json);
                    let retry = r.json["retry_after_ms"].as_u64().unwrap();
                    let (most, least) = ((end - sent).as_millis() as u64, (end - received).as_millis() as u64);
                    assert!(
                        retry <= most + 2,
                        "retry_after_ms {retry}, the window ends in {least}..{most} ms: {}",
                        r.json
                    );
                    seen.push((retry, least, most, r.json.to_string()));
                    rtt = rtt.max((received - sent).as_millis() as u64);
                    let header: u64 = r.headers["retry-after"].to_str().unwrap().parse().unwrap();
                    assert_eq!(header, retry.div_ceil(1000), "{:?}", r.headers);
                    if r.json["cached"] == Value::Bool(true) {
                        cached += 1;
                    } else {
                        assert!(r.json.get("cached").is_none(), "{}", r.json);
                    }
                }
                (cached, seen, rtt)
            })
        })
        .collect();
    let (mut cached, mut seen, mut rtt) = (0, Vec::new(), first_rtt);
    for t in tasks {
        let (c, s, r) = t.await.unwrap();
        (cached, rtt) = (cached + c, rtt.max(r));
        seen.extend(s);
    }
    // A remembered wait counts from when the call that learnt it was sent (never past the
    // truth): short of it by that call's round trip at most, which a loaded machine stretches.
    let short = 250.max(rtt + 50);
    for (retry, least, most, json) in seen {
        assert!(retry + short >= least, "retry_after_ms {retry}, the window ends in {least}..{most} ms: {json}");
    }
    let calls = script_calls(redis) - before;
    // Every answer not marked cached was Redis's own.
    assert_eq!(cached + calls, n as u64, "{cached} answers marked cached, {calls} calls to Redis");
    (calls, cached, started.elapsed().as_secs_f64())
}

/// Floods of one exhausted subject through a shell: with the cache, at most two calls to Redis
/// per second (one refresh near the end of each `cache_denials_ms`, with room for the load's
/// jitter) and the first; without it, one per take.
async fn floods(name: &str, api: std::sync::Arc<redcount_tests::Api>, redis: &RedisServer) {
    let (calls, cached, secs) = flood(api.clone(), redis, "flood", 2_000).await;
    eprintln!("{name}: 2,000 denied takes, {cached} from memory, {calls} script calls in {secs:.1} s");
    assert!(calls <= 1 + 2 * secs.ceil() as u64, "{calls} calls to Redis in {secs:.1} s");
    let (calls, cached, _) = flood(api, redis, "raw", 200).await;
    eprintln!("{name}, cache_denials_ms 0: 200 denied takes, {calls} script calls");
    assert_eq!((calls, cached), (200, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flood_of_one_exhausted_subject_barely_reaches_redis_through_serve_and_the_worker() {
    let redis = RedisServer::start();
    let admin = redcount_tests::secret("admin");
    let serve = redcount_tests::NativeServer::start(&[("REDIS_URL", &redis.url())], &admin, SHELL_POLICIES);
    floods("redcount serve", std::sync::Arc::new(redcount_tests::Api::new(serve.url(), &admin)), &redis).await;

    let (_front, worker) = worker_on(&redis, &admin);
    let api = std::sync::Arc::new(redcount_tests::Api::new(worker.url(), &admin));
    floods("the worker", api.clone(), &redis).await;
    refund_into_the_lease(&api, &redis, &worker.log()).await;
}

/// Through a shell (here the worker): three takes (one borrow, two from its stock), a refund
/// of the two put back into the lease at once with no Redis call, and Redis counting the one
/// take left once the lease has ended and given back its stock.
async fn refund_into_the_lease(api: &redcount_tests::Api, redis: &RedisServer, log: &str) {
    let subject = redcount_tests::uid("w");
    let path = format!("/api/quotas/hot/{subject}");
    for _ in 0..3 {
        assert_eq!(api.post(&path, "").await.json["allowed"], true);
    }
    let calls = script_calls(redis);
    let r = api.call("POST", &format!("{path}/refund"), Some(r#"{"cost": 2}"#), true).await;
    assert_eq!((r.status, &r.json["refunded"]), (200, &Value::from(2)), "{}\n{log}", r.json);
    assert_eq!(script_calls(redis), calls, "no Redis call for what the lease admitted");
    let deadline = Instant::now() + Duration::from_secs(10);
    while hot_count(redis, &subject) != 1 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(hot_count(redis, &subject), 1, "three takes, two refunded\n{log}");
}

/// The worker under workerd with [`SHELL_POLICIES`], through a REST front of `redis`.
fn worker_on(redis: &RedisServer, admin: &str) -> (redcount_tests::RestFront, redcount_tests::Workerd) {
    let front = redcount_tests::RestFront::start(&redis.url(), false);
    let worker = redcount_tests::Workerd::start(&[
        ("REDCOUNT_REST_URL", &front.url()),
        ("REDCOUNT_REST_TOKEN", &front.token),
        ("REDCOUNT_ADMIN_TOKEN", admin),
        ("REDCOUNT_POLICIES", SHELL_POLICIES),
    ]);
    (front, worker)
}

/// The units of `hot` Redis counts for `subject` (admitted, plus lent and not given back).
fn hot_count(redis: &RedisServer, subject: &str) -> i64 {
    let count: Option<i64> =
        redis::cmd("GET").arg(redcount_core::keys::quota("hot", subject, "fw")).query(&mut redis.conn()).unwrap();
    count.unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_serve_processes_with_leases_admit_at_most_the_limit_and_give_units_back_at_sigterm() {
    lease_storm(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn serve_processes_and_the_worker_with_leases_admit_at_most_the_limit_and_give_units_back() {
    lease_storm(true).await;
}

/// 1,000 concurrent takes of a limit of 500 through two `redcount serve` processes (and the
/// worker, when `worker`), with `borrow`: at most the limit admitted, fewer calls than takes,
/// and every unit lent and not used back in Redis after serve's SIGTERM and the leases' end.
async fn lease_storm(worker: bool) {
    let redis = RedisServer::start();
    let admin = redcount_tests::secret("admin");
    let mut shells: Vec<redcount_tests::NativeServer> = (0..2)
        .map(|_| redcount_tests::NativeServer::start(&[("REDIS_URL", &redis.url())], &admin, SHELL_POLICIES))
        .collect();
    let wrangler = worker.then(|| worker_on(&redis, &admin));
    let mut urls: Vec<String> = shells.iter().map(|s| s.url()).collect();
    urls.extend(wrangler.as_ref().map(|(_, w)| w.url()));
    let log = || wrangler.as_ref().map(|(_, w)| w.log()).unwrap_or_default();
    let n = urls.len();
    let apis: Vec<_> = urls.into_iter().map(|u| std::sync::Arc::new(redcount_tests::Api::new(u, &admin))).collect();
    let subject = redcount_tests::uid("h");
    let path = format!("/api/quotas/hot/{subject}");
    let before = script_calls(&redis);
    // 1,000 takes at once, spread over the shells.
    let tasks: Vec<_> = (0..1_000)
        .map(|i| {
            let (api, path) = (apis[i % n].clone(), path.clone());
            tokio::spawn(async move {
                let r = api.post(&path, "").await;
                (r.status, r.json)
            })
        })
        .collect();
    let mut admitted = 0;
    for t in tasks {
        let (status, json) = t.await.unwrap();
        assert_eq!(status, 200, "{json}\n{}", log());
        admitted += u64::from(json["allowed"] == Value::Bool(true));
    }
    let calls = script_calls(&redis) - before;
    eprintln!("{n} shells, 1,000 takes of a limit of 500: {admitted} admitted, {calls} script calls");
    assert!(admitted <= 500, "{admitted} admitted");
    // What the shells still hold when the takes end is at most units × shells.
    assert!(admitted >= 500 - 50 * n as u64, "{admitted} admitted");
    // Fewer calls than takes: some were admitted from a lease's stock. How many fewer depends on
    // how long a borrow takes (a take waits at most 1-2 s for one, then asks Redis itself), so
    // the ratio is the bench's (`cargo xtask bench`, "Local decisions"), not asserted here.
    assert!(calls < 1_000, "{calls} calls to Redis for 1,000 takes");

    // A few takes of a fresh subject through each shell: each borrows more than it uses, and
    // Redis counts the lent units at once.
    let fresh = redcount_tests::uid("g");
    let path = format!("/api/quotas/hot/{fresh}");
    for api in &apis {
        for _ in 0..3 {
            assert_eq!(api.post(&path, "").await.json["allowed"], true);
        }
    }
    let taken = 3 * n as i64;
    assert!(hot_count(&redis, &fresh) > taken, "{} units counted for {taken} takes", hot_count(&redis, &fresh));
    // A graceful stop (SIGTERM) of serve gives back every unused unit; the worker gives its
    // back when its lease ends (1 s). Redis then counts exactly what was admitted.
    let held = hot_count(&redis, &fresh);
    for s in &mut shells {
        s.stop(Duration::from_secs(10));
    }
    // Serve's units are back once it has exited.
    assert_eq!(
        hot_count(&redis, &fresh),
        held - 2 * (held - 3 * n as i64) / n as i64,
        "serve gives its units back at SIGTERM"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while hot_count(&redis, &fresh) != taken && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // (On a failure, the worker's log says whether workerd restarted its isolate, which
    // loses what it held: the documented price of an evicted isolate.)
    assert_eq!(hot_count(&redis, &fresh), taken, "units lent and not used are given back\n{}", log());
    assert_eq!(hot_count(&redis, &subject), admitted as i64, "units lent and not used are given back\n{}", log());
}

/// Refunds of units a shell admitted from its lease. Through that shell, at once and with no
/// Redis call: back into its lease's stock (a refund of no more than the lease admitted; a
/// larger one goes to Redis whole), so the subject is admitted exactly up to the limit again. Through a shell
/// holding no lease of the subject, while another's runs: only what Redis counts and no lease
/// holds, the rest once the lease has ended; a used-up lease's record is forgotten by then, so
/// a shell left idle holds no refund back. Redis ends counting exactly what was admitted less
/// what was refunded.
#[tokio::test]
async fn units_admitted_from_a_lease_are_refundable_at_once_through_its_shell() {
    let redis = RedisServer::start();
    let admin = redcount_tests::secret("admin");
    let mut serve = redcount_tests::NativeServer::start(&[("REDIS_URL", &redis.url())], &admin, SHELL_POLICIES);
    let mut other = redcount_tests::NativeServer::start(&[("REDIS_URL", &redis.url())], &admin, SHELL_POLICIES);
    let api = std::sync::Arc::new(redcount_tests::Api::new(serve.url(), &admin));
    let api2 = std::sync::Arc::new(redcount_tests::Api::new(other.url(), &admin));
    let refund = |api: &std::sync::Arc<redcount_tests::Api>, path: String, cost: i64| {
        let api = api.clone();
        async move {
            let body = format!(r#"{{"cost": {cost}}}"#);
            let r = api.call("POST", &format!("{path}/refund"), Some(&body), true).await;
            assert_eq!(r.status, 200, "{}", r.json);
            r.json["refunded"].as_i64().unwrap()
        }
    };
    // Takes until a round admits none (units a lease gave back meanwhile are borrowed again).
    let exhaust = |path: String| {
        let api = api.clone();
        async move {
            let mut admitted = 0;
            loop {
                let mut round = 0;
                while api.post(&path, "").await.json["allowed"] == Value::Bool(true) {
                    round += 1;
                }
                if round == 0 {
                    return admitted;
                }
                admitted += round;
                // Every lease ends (1 s) and gives back what it did not use.
                tokio::time::sleep(Duration::from_millis(1_300)).await;
            }
        }
    };
    // Five takes (one borrow, four from its stock): a refund of 4 through this shell is put
    // back into its lease at once, with no Redis call; of 3 more (to Redis), only the borrow's
    // own take is left to give back, never more than was admitted.
    let subject = redcount_tests::uid("r");
    let path = format!("/api/quotas/hot/{subject}");
    for _ in 0..5 {
        assert_eq!(api.post(&path, "").await.json["allowed"], true);
    }
    let calls = script_calls(&redis);
    assert_eq!(refund(&api, path.clone(), 4).await, 4, "put back into this shell's lease");
    assert_eq!(script_calls(&redis), calls, "no Redis call for what the lease admitted");
    assert_eq!(refund(&api, path.clone(), 3).await, 1, "never more than was admitted");
    // Nothing is held back: the subject is admitted exactly up to the limit again.
    let admitted = exhaust(path.clone()).await;
    assert_eq!(admitted, 500, "after 5 admitted and 5 refunded");
    // At the limit, through the shell that admitted the last units, and again up to it exactly.
    assert_eq!(refund(&api, path.clone(), 3).await, 3);
    assert_eq!(exhaust(path.clone()).await, 3);
    // Through a shell holding no lease of the subject, while another's runs: only what no lease
    // holds (the borrow's own take), the rest once the lease has ended.
    let bounded = redcount_tests::uid("b");
    let bounded_path = format!("/api/quotas/hot/{bounded}");
    for _ in 0..3 {
        assert_eq!(api.post(&bounded_path, "").await.json["allowed"], true);
    }
    assert_eq!(refund(&api2, bounded_path.clone(), 3).await, 1, "only the units no lease holds, while it runs");
    tokio::time::sleep(Duration::from_millis(2_000)).await;
    assert_eq!(refund(&api2, bounded_path.clone(), 2).await, 2, "refundable once the lease has ended");
    // Takes until a lease is used up and renewed, then the shell idles past the leases' end.
    let idle = redcount_tests::uid("i");
    let path_idle = format!("/api/quotas/hot/{idle}");
    let mut taken = 0;
    for _ in 0..60 {
        taken += i64::from(api.post(&path_idle, "").await.json["allowed"] == Value::Bool(true));
    }
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    // Every lease ended, used-up ones too: no record is left to hold a refund back.
    let lent = redcount_core::keys::quota_lent("hot", &idle, "fw");
    let left: i64 = redis::cmd("HLEN").arg(&lent).query(&mut redis.conn()).unwrap();
    assert_eq!(left, 0, "lease records left after the shell idled past its leases");
    let given = refund(&api2, path_idle.clone(), taken).await;
    serve.stop(Duration::from_secs(10));
    other.stop(Duration::from_secs(10));
    assert_eq!(hot_count(&redis, &subject), 500, "{} admitted, 8 refunded", 5 + admitted + 3);
    assert_eq!(hot_count(&redis, &bounded), 0, "three takes, three refunds");
    assert_eq!((given, hot_count(&redis, &idle)), (taken, 0), "{taken} takes, each refunded");
}

/// An admin refunding while takes run, through two `redcount serve` processes with `borrow`,
/// each refund of more units at times than were admitted: whatever each shell puts back into
/// its own lease and Redis gives back, admissions less refunds never pass the limit, and once
/// both have stopped Redis counts exactly that difference.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn refunds_racing_takes_through_two_serve_processes_never_admit_past_the_limit() {
    let redis = RedisServer::start();
    let admin = redcount_tests::secret("admin");
    let mut shells: Vec<redcount_tests::NativeServer> = (0..2)
        .map(|_| redcount_tests::NativeServer::start(&[("REDIS_URL", &redis.url())], &admin, SHELL_POLICIES))
        .collect();
    let apis: Vec<_> = shells.iter().map(|s| std::sync::Arc::new(redcount_tests::Api::new(s.url(), &admin))).collect();
    let subject = redcount_tests::uid("x");
    let path = format!("/api/quotas/hot/{subject}");
    // 1,200 takes and 150 refunds of 1 to 6 units, at once, spread over both shells.
    let tasks: Vec<_> = (0..1_350)
        .map(|i| {
            let (api, path) = (apis[i % 2].clone(), path.clone());
            tokio::spawn(async move {
                if i % 9 == 4 {
                    let body = format!(r#"{{"cost": {}}}"#, 1 + i % 6);
                    let r = api.call("POST", &format!("{path}/refund"), Some(&body), true).await;
                    assert_eq!(r.status, 200, "{}", r.json);
                    (0, r.json["refunded"].as_i64().unwrap())
                } else {
                    let r = api.post(&path, "").await;
                    assert_eq!(r.status, 200, "{}", r.json);
                    (i64::from(r.json["allowed"] == Value::Bool(true)), 0)
                }
            })
        })
        .collect();
    let (mut admitted, mut refunded) = (0, 0);
    for t in tasks {
        let (a, r) = t.await.unwrap();
        (admitted, refunded) = (admitted + a, refunded + r);
    }
    eprintln!("2 shells, 1,200 takes and 150 refunds of a limit of 500: {admitted} admitted, {refunded} refunded");
    assert!(refunded <= admitted, "{refunded} refunded of {admitted} admitted");
    assert!(admitted - refunded <= 500, "{admitted} admitted, {refunded} refunded");
    for s in &mut shells {
        s.stop(Duration::from_secs(10));
    }
    assert_eq!(hot_count(&redis, &subject), admitted - refunded, "Redis counts admissions less refunds");
}

/// A Redis of its own and one `redcount serve` of `policies` on it, with `--timeout-ms`.
fn serve_alone(policies: &str, timeout_ms: &str) -> (RedisServer, redcount_tests::NativeServer, redcount_tests::Api) {
    let redis = RedisServer::start();
    let admin = redcount_tests::secret("admin");
    let serve = redcount_tests::NativeServer::start_with(
        &[("REDIS_URL", &redis.url())],
        &admin,
        policies,
        &["--timeout-ms", timeout_ms],
    );
    let api = redcount_tests::Api::new(serve.url(), &admin);
    (redis, serve, api)
}

/// SIGTERM of `redcount serve` while Redis does not answer (SIGSTOP): serve exits within its
/// shutdown bound, and the give-back of every lease it held was sent before it did, so Redis
/// runs them all once it answers again (none of the lent units stays charged).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn serve_stopped_while_redis_is_paused_sends_every_give_back_within_its_bound() {
    let policies = r#"{"held": {"kind": "quota", "algorithm": "fixed", "limit": 100000,
        "window_ms": 1000000000000, "borrow": {"units": 50, "ms": 30000}}}"#;
    let (redis, mut serve, api) = serve_alone(policies, "700");
    let count = |subject: &str| -> i64 {
        let key = redcount_core::keys::quota("held", subject, "fw");
        redis::cmd("GET").arg(key).query::<Option<i64>>(&mut redis.conn()).unwrap().unwrap_or(0)
    };
    // Each subject's first take borrows a lease: 1 admitted, 50 lent.
    let subjects: Vec<String> = (0..20).map(|_| redcount_tests::uid("p")).collect();
    for s in &subjects {
        assert_eq!(api.post(&format!("/api/quotas/held/{s}"), "").await.json["allowed"], true);
        assert_eq!(count(s), 51, "{s}: a take and its lease");
    }
    let paused = redcount_tests::Stopped::stop(redis.pid());
    let started = Instant::now();
    serve.stop(Duration::from_secs(60));
    let took = started.elapsed();
    drop(paused);
    // Its bound: 5 s for the give-back, after the HTTP server's own drain.
    assert!(took < Duration::from_secs(8), "SIGTERM took {took:?} while Redis was paused\n{}", serve.log());
    let deadline = Instant::now() + Duration::from_secs(10);
    let back = || subjects.iter().filter(|s| count(s) == 1).count();
    while back() < subjects.len() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        back(),
        subjects.len(),
        "leases given back once Redis answered (SIGTERM took {took:?})\n{}",
        serve.log()
    );
}

/// SIGTERM of `redcount serve` while a take waits on a paused Redis with a `--timeout-ms` over
/// the 5 s a shutdown waits for open connections by default: the take is still answered (503,
/// "may have run") before serve exits, not cut off unanswered.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn serve_stopped_during_a_call_longer_than_five_seconds_answers_it() {
    let policies = r#"{"plain": {"kind": "quota", "algorithm": "fixed", "limit": 10, "window_ms": 1000000000000}}"#;
    let (redis, mut serve, api) = serve_alone(policies, "6500");
    let subject = redcount_tests::uid("t");
    let path = format!("/api/quotas/plain/{subject}");
    assert_eq!(api.post(&path, "").await.json["allowed"], true, "{}", serve.log());
    let paused = redcount_tests::Stopped::stop(redis.pid());
    let url = format!("{}{path}", serve.url());
    let call = tokio::spawn(async move {
        let resp = redcount_tests::http().post(url).send().await.map_err(|e| e.to_string())?;
        let status = resp.status().as_u16();
        let text = resp.text().await.map_err(|e| e.to_string())?;
        let json: Value = serde_json::from_str(&text).map_err(|e| format!("{e}: {text}"))?;
        Ok::<_, String>((status, json))
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    tokio::task::spawn_blocking(move || {
        serve.stop(Duration::from_secs(30));
        serve
    })
    .await
    .unwrap();
    let took = started.elapsed();
    drop(paused);
    let answer = call.await.unwrap();
    let (status, json) =
        answer.unwrap_or_else(|e| panic!("the take in flight got no answer ({e}); SIGTERM took {took:?}"));
    assert_eq!(status, 503, "{json}");
    assert_eq!(json["may_have_run"], true, "{json}");
}
