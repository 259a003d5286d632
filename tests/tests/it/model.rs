//! Model-based randomized tests, one per primitive. Four concurrent clients (HTTP through
//! `redcount serve`, with and without `Idempotency-Key`, and RESP through `redcount::Direct`)
//! run seeded random operations in rounds; in each round one fault lands at a random point
//! (SCRIPT FLUSH, Redis SIGKILLed and restarted from its AOF, `maxmemory` set to one byte and
//! back, or none), and clients replay acknowledged keyed requests at random. Every answer is
//! checked when it arrives; after each round the round's calls are checked against the whole
//! history (a small reference model per primitive) and against what Redis holds.
//!
//! An answer says what happened. A refusal at maxmemory (OOM; HTTP 507) means nothing
//! happened. No answer (Redis down, a 503, a lost connection) means it may or may not have
//! happened: the models keep both possibilities. Clients and Redis share one machine and one
//! clock, so the client's clock before a call and after its answer bracket the `TIME` the
//! script saw: window and lease checks hold for every server time within the bracket.
//!
//! The seed is `REDCOUNT_SEED` (else one from the clock), printed with every failure:
//! `REDCOUNT_SEED=<n> cargo xtask test -- model` replays the same fault schedule and the same
//! random choices of each client (which follow the answers it gets, so a replay takes the
//! same path as far as the answers agree; the interleaving of the clients may differ).
//! `REDCOUNT_MODEL_STEPS` sets the operations per primitive (default 160); `cargo xtask soak`
//! runs many more.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Display;
use std::future::Future;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redcount::{Direct, Error};
use redcount_core::ops::claim::{Claim, ClaimOutcome};
use redcount_core::ops::counter::{self, AddCounter, Bounds, CounterOutcome, CounterStatus, Mode, Storage};
use redcount_core::ops::inbox::{Append, Appended, Message, Read, Trim, Trimmed};
use redcount_core::ops::quota::{Algorithm, QuotaOutcome, TakeQuota};
use redcount_core::ops::redpacket::{self, Create, Grab, GrabOutcome, GrabRecord, PacketStatus, ReadGrabs, ReadStatus};
use redcount_core::ops::semaphore::{Action, SemaphoreOutcome, SemaphoreResult, UpdateLease};
use redcount_core::{ErrorKind, Operation, keys};
use redcount_tests::{NativeServer, RedisServer};
use serde_json::{Value, json};

// ---------------------------------------------------------------------------------------------
// Seed, length, PRNG

/// The run's seed: `REDCOUNT_SEED`, else one from the clock (the same for every model test
/// of one run, so one number replays them all).
pub(crate) fn seed() -> u64 {
    static SEED: OnceLock<u64> = OnceLock::new();
    *SEED.get_or_init(|| match std::env::var("REDCOUNT_SEED") {
        Ok(s) => s.trim().parse().unwrap_or_else(|_| panic!("REDCOUNT_SEED must be an unsigned integer, not {s:?}")),
        Err(_) => {
            let t = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
            (t.as_secs() % 100_000) * 1_000_000 + u64::from(t.subsec_micros())
        }
    })
}

/// Operations per primitive: `REDCOUNT_MODEL_STEPS`, default 160.
pub(crate) fn steps() -> usize {
    match std::env::var("REDCOUNT_MODEL_STEPS") {
        Ok(s) => s.trim().parse().unwrap_or_else(|_| panic!("REDCOUNT_MODEL_STEPS must be a number, not {s:?}")),
        Err(_) => 160,
    }
}

/// splitmix64: a few lines, and the same sequence for a seed on every machine.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64, stream: &str) -> Self {
        let mut h = seed ^ 0xcbf2_9ce4_8422_2325;
        for b in stream.bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        Rng(h)
    }

    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub(crate) fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next() % n }
    }

    /// Uniform in `lo..=hi`.
    pub(crate) fn range(&mut self, lo: i64, hi: i64) -> i64 {
        lo + self.below((hi - lo + 1) as u64) as i64
    }

    pub(crate) fn percent(&mut self, p: u64) -> bool {
        self.below(100) < p
    }

    pub(crate) fn index(&mut self, len: usize) -> usize {
        self.below(len as u64) as usize
    }
}

impl rand::RngCore for Rng {
    fn next_u32(&mut self) -> u32 {
        (self.next() >> 32) as u32
    }

    fn next_u64(&mut self) -> u64 {
        self.next()
    }

    fn fill_bytes(&mut self, dst: &mut [u8]) {
        for chunk in dst.chunks_mut(8) {
            let bytes = self.next().to_le_bytes();
            chunk.copy_from_slice(&bytes[..chunk.len()]);
        }
    }
}

/// Now, in ms since the epoch: the clock Redis's `TIME` reads too.
pub(crate) fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as i64
}

/// Tolerance, in ms, on comparisons between the client's clock and Redis's.
const SLACK: i64 = 2;
/// Concurrent clients per test.
pub(crate) const CLIENTS: usize = 4;
/// Operations per client per round.
pub(crate) const OPS: usize = 5;

/// Which test, which seed: in every failure.
#[derive(Debug, Clone)]
pub(crate) struct Ctx {
    pub(crate) name: &'static str,
    pub(crate) seed: u64,
}

impl Ctx {
    #[track_caller]
    pub(crate) fn fail(&self, round: usize, what: impl Display) -> ! {
        panic!(
            "model::{} (seed {}, round {round}): {what}\n  replay: REDCOUNT_SEED={} cargo xtask test -- model::{}",
            self.name, self.seed, self.seed, self.name
        )
    }

    pub(crate) fn say(&self, what: impl Display) {
        println!("model::{} seed {}: {what}", self.name, self.seed);
    }
}

macro_rules! check {
    ($ctx:expr, $round:expr, $cond:expr, $($arg:tt)+) => {
        if !$cond {
            $ctx.fail($round, format!($($arg)+))
        }
    };
}

// ---------------------------------------------------------------------------------------------
// Calls and their outcomes

/// What became of one call.
#[derive(Debug, Clone)]
pub(crate) enum Outcome<T> {
    /// Answered: it happened, and this is what it did.
    Done(T),
    /// Refused whole at maxmemory (OOM; HTTP 507), or never sent (the connection was
    /// refused): nothing was written.
    Refused,
    /// No answer: it may or may not have happened.
    Unknown(String),
}

/// One call. If it ran, the server ran it between `s` and `r` (ms); `last` is when its last
/// attempt was sent (a keyed or idempotent call is sent again while its outcome is unknown).
#[derive(Debug, Clone)]
pub(crate) struct Timed<T> {
    pub(crate) s: i64,
    pub(crate) last: i64,
    pub(crate) r: i64,
    pub(crate) out: Outcome<T>,
}

impl<T> Timed<T> {
    pub(crate) fn done(&self) -> Option<&T> {
        match &self.out {
            Outcome::Done(t) => Some(t),
            _ => None,
        }
    }

    fn unknown(&self) -> bool {
        matches!(self.out, Outcome::Unknown(_))
    }

    /// Answered, or unanswered: it may have happened.
    fn maybe(&self) -> bool {
        !matches!(self.out, Outcome::Refused)
    }
}

/// The HTTP API of `redcount serve`.
#[derive(Debug, Clone)]
struct Api {
    http: reqwest::Client,
    base: String,
}

impl Api {
    async fn once(&self, method: &str, path: &str, body: &str, key: Option<&str>) -> Result<(u16, Value), String> {
        self.once_marked(method, path, body, key).await.map(|(answer, _)| answer)
    }

    /// [`Api::once`], and whether the answer was a stored one (`Idempotent-Replayed`).
    async fn once_marked(
        &self,
        method: &str,
        path: &str,
        body: &str,
        key: Option<&str>,
    ) -> Result<((u16, Value), bool), String> {
        let mut req = self.http.request(method.parse().unwrap(), format!("{}{path}", self.base));
        if let Some(k) = key {
            req = req.header("Idempotency-Key", k);
        }
        if !body.is_empty() {
            req = req.body(body.to_string());
        }
        let resp = req.send().await.map_err(|e| format!("no answer: {e}"))?;
        let status = resp.status().as_u16();
        let replayed = resp.headers().get("idempotent-replayed").is_some_and(|v| v == "true");
        let text = resp.text().await.map_err(|e| format!("answer cut: {e}"))?;
        Ok(((status, serde_json::from_str(&text).unwrap_or(Value::String(text))), replayed))
    }

    /// Sends a request; while its outcome is unknown (503, or no answer) and `retry` (a keyed
    /// request, or one idempotent by itself), sends it again, for about 3 s at most.
    async fn call(&self, method: &str, path: &str, body: &str, key: Option<&str>, retry: bool) -> Timed<(u16, Value)> {
        self.call_marked(method, path, body, key, retry).await.0
    }

    /// [`Api::call`], and whether its answer was a stored one (`Idempotent-Replayed`).
    async fn call_marked(
        &self,
        method: &str,
        path: &str,
        body: &str,
        key: Option<&str>,
        retry: bool,
    ) -> (Timed<(u16, Value)>, bool) {
        let s = now_ms();
        let mut unknown: Option<String> = None;
        let mut attempts = 0;
        loop {
            let last = now_ms();
            let got = self.once_marked(method, path, body, key).await;
            let r = now_ms();
            let why = match got {
                Ok(((503, v), _)) => format!("503 {v}"),
                Err(e) => e,
                Ok(((507, _), _)) => {
                    let out = match unknown {
                        Some(u) => Outcome::Unknown(u), // an earlier attempt may have applied
                        None => Outcome::Refused,
                    };
                    return (Timed { s, last, r, out }, false);
                }
                Ok((answer, replayed)) => return (Timed { s, last, r, out: Outcome::Done(answer) }, replayed),
            };
            attempts += 1;
            if !retry || attempts >= 60 {
                return (Timed { s, last, r, out: Outcome::Unknown(why) }, false);
            }
            unknown = Some(why);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// An acknowledged keyed request, for replays.
#[derive(Debug, Clone)]
struct Keyed {
    path: String,
    body: String,
    /// Another request under the same key: must be refused with 422.
    other: String,
    key: String,
    answer: (u16, Value),
}

/// One concurrent client: its own PRNG stream, HTTP client and RESP connection.
pub(crate) struct Client {
    pub(crate) n: usize,
    ctx: Ctx,
    pub(crate) round: usize,
    pub(crate) rng: Rng,
    api: Api,
    pub(crate) direct: Direct,
    pace_ms: u64,
    keyed: Vec<Keyed>,
}

impl Client {
    #[track_caller]
    pub(crate) fn fail(&self, what: impl Display) -> ! {
        self.ctx.fail(self.round, format!("client {}: {what}", self.n))
    }

    /// A random pause between calls, up to the test's pace.
    pub(crate) async fn pause(&mut self) {
        let ms = self.rng.below(self.pace_ms + 1);
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }

    fn http(&mut self) -> bool {
        self.rng.percent(50)
    }

    fn new_key(&mut self) -> String {
        format!("{}-{}-{:016x}", self.ctx.name, self.n, self.rng.next())
    }

    /// An HTTP write: 3 times in 4 with an `Idempotency-Key` (and then sent again while its
    /// outcome is unknown), else without (and then not retried).
    async fn write(&mut self, path: String, body: String, other: String) -> Timed<(u16, Value)> {
        let key = if self.rng.percent(75) { Some(self.new_key()) } else { None };
        let t = self.api.call("POST", &path, &body, key.as_deref(), key.is_some()).await;
        // An answer that changed nothing (a denied take, a claim already taken, nothing
        // applied, an id already stored, nothing trimmed) stores no reply: sent again under its
        // key it is a new call, so only answers that changed something are replays to compare.
        if let (Some(key), Outcome::Done(answer)) = (key, &t.out)
            && !changed_nothing(&answer.1)
        {
            self.keyed.push(Keyed { path, body, other, key, answer: answer.clone() });
        }
        t
    }

    /// Runs a core operation over RESP, once.
    pub(crate) async fn run<O: Operation + Sync>(&self, op: &O) -> Timed<O::Outcome> {
        let s = now_ms();
        let got = self.direct.run(op).await;
        let r = now_ms();
        let out = match got {
            Ok(o) => Outcome::Done(o),
            Err(Error::Redis(e)) if e.kind == ErrorKind::OutOfMemory => Outcome::Refused,
            Err(Error::Redis(e)) if e.kind == ErrorKind::Unavailable => Outcome::Unknown(e.to_string()),
            // The driver says whether the command could have reached Redis: when it could
            // not, the model holds it to "nothing changed".
            Err(Error::Transport(t)) if t.may_have_run => Outcome::Unknown(t.detail),
            Err(Error::Transport(_)) => Outcome::Refused,
            Err(e) => self.fail(format!("{}: unexpected error: {e}", O::NAME)),
        };
        Timed { s, last: s, r, out }
    }

    /// Runs an operation that is idempotent by itself (a grab, a create with a fixed id, an
    /// append of an id) over RESP, again while its outcome is unknown. Also says whether an
    /// attempt went unanswered (then "already there" may mean "stored by that attempt").
    async fn run_retried<O: Operation + Sync>(&self, op: &O) -> (Timed<O::Outcome>, bool) {
        let mut t = self.run(op).await;
        let s = t.s;
        let mut unknown = false;
        for _ in 0..60 {
            match t.out {
                Outcome::Unknown(_) => unknown = true,
                Outcome::Refused if unknown => {
                    t.out = Outcome::Unknown("refused at maxmemory after an unanswered attempt".into());
                    break;
                }
                _ => break,
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            t = self.run(op).await;
        }
        t.s = s;
        (t, unknown)
    }

    /// The typed answer of an HTTP call (`None` from `f`: an answer no model allows).
    #[track_caller]
    fn decode<T>(&self, t: Timed<(u16, Value)>, what: &str, f: impl FnOnce(u16, &Value) -> Option<T>) -> Timed<T> {
        let Timed { s, last, r, out } = t;
        let out = match out {
            Outcome::Done((status, v)) => match f(status, &v) {
                Some(x) => Outcome::Done(x),
                None => self.fail(format!("{what}: unexpected answer {status} {v}")),
            },
            Outcome::Refused => Outcome::Refused,
            Outcome::Unknown(e) => Outcome::Unknown(e),
        };
        Timed { s, last, r, out }
    }

    /// Sends an acknowledged keyed request again: the same answer (and, the models check, no
    /// second effect); or, 1 time in 4, another request under the same key: 422, no effect.
    async fn replay(&mut self) {
        if self.keyed.is_empty() {
            return;
        }
        let k = self.keyed[self.rng.index(self.keyed.len())].clone();
        let clash = self.rng.percent(25);
        // No body and `{}` are one request (the empty object): a replay, not a clash.
        let same = k.body.is_empty() && k.other == "{}";
        let body = if clash { &k.other } else { &k.body };
        match self.api.once("POST", &k.path, body, Some(&k.key)).await {
            Ok((503 | 507, _)) | Err(_) => {} // Redis down or full: nothing to compare
            Ok(got) if clash && same && got == k.answer => {}
            Ok((422, v)) if clash && !same => {
                if v["field"] != "Idempotency-Key" {
                    self.fail(format!("POST {} {body} under the key of {}: 422 without the field: {v}", k.path, k.body))
                }
            }
            Ok(got) if !clash && got == k.answer => {}
            Ok(got) => self.fail(format!(
                "POST {} {body} with Idempotency-Key {} (first sent with {}): first answer {:?}, now {got:?}",
                k.path, k.key, k.body, k.answer
            )),
        }
    }
}

/// True for an answer that says nothing changed, which stores no idempotent reply.
fn changed_nothing(v: &Value) -> bool {
    v["allowed"] == json!(false)
        || v["claimed"] == json!(false)
        || v["applied"] == json!(0)
        || v["stored"] == json!(false)
        || v["deleted"] == json!(0)
}

/// `a / b` rounded up (b > 0).
fn ceil_div(a: i64, b: i64) -> i64 {
    -(-a).div_euclid(b)
}

/// "n answered, n refused at maxmemory, n unanswered".
pub(crate) fn tally<'a, T: 'a>(outs: impl Iterator<Item = &'a Outcome<T>>) -> String {
    let (mut done, mut refused, mut unknown) = (0, 0, 0);
    for o in outs {
        match o {
            Outcome::Done(_) => done += 1,
            Outcome::Refused => refused += 1,
            Outcome::Unknown(_) => unknown += 1,
        }
    }
    format!("{done} answered, {refused} refused at maxmemory, {unknown} unanswered")
}

fn int(v: &Value, field: &str) -> Option<i64> {
    v.get(field)?.as_i64()
}

// ---------------------------------------------------------------------------------------------
// The environment: Redis with AOF, `redcount serve`, the fault schedule

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fault {
    Calm,
    ScriptFlush,
    KillRestart,
    MaxMemory,
}

const ADMIN: &str = "model-admin-token-0123456789";

pub(crate) struct Env {
    pub(crate) ctx: Ctx,
    pub(crate) redis: Arc<Mutex<RedisServer>>,
    _server: NativeServer,
    api: Api,
    url: String,
    rng: Rng,
    pub(crate) schedule: Vec<Fault>,
    /// A connection of the checker's own, for reading state between rounds.
    direct: Direct,
    /// When Redis was at maxmemory for certain: from `CONFIG SET maxmemory 1` answered to
    /// just before it was set back.
    full: Vec<(i64, i64)>,
}

impl Env {
    /// Starts Redis (AOF, fsync always, noeviction) and `redcount serve` before it, and plans
    /// the rounds: each fault in turn, in a seeded order.
    pub(crate) async fn start(name: &'static str) -> (Env, usize) {
        let ctx = Ctx { name, seed: seed() };
        let steps = steps();
        let rounds = steps.div_ceil(CLIENTS * OPS).max(4);
        ctx.say(format!("{steps} operations in {rounds} rounds of {CLIENTS} clients x {OPS}"));
        let redis = RedisServer::start_with(&[
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--maxmemory-policy",
            "noeviction",
        ]);
        let url = redis.url();
        let server = NativeServer::start(&[("REDIS_URL", &url)], ADMIN, &policies());
        let api = Api {
            http: redcount_tests::http_builder().timeout(Duration::from_secs(15)).build().unwrap(),
            base: server.url(),
        };
        let mut rng = Rng::new(ctx.seed, &format!("{name}/faults"));
        let mut schedule = Vec::new();
        while schedule.len() < rounds {
            let mut kinds = [Fault::Calm, Fault::ScriptFlush, Fault::KillRestart, Fault::MaxMemory];
            for i in (1..kinds.len()).rev() {
                kinds.swap(i, rng.index(i + 1));
            }
            schedule.extend(kinds);
        }
        schedule.truncate(rounds);
        let direct = Direct::connect_with(&url, Duration::from_secs(2)).await.expect("connect to test redis");
        let redis = Arc::new(Mutex::new(redis));
        let env = Env { ctx, redis, _server: server, api, url, rng, schedule, direct, full: Vec::new() };
        (env, rounds)
    }

    pub(crate) async fn clients(&self, pace_ms: u64) -> Vec<Client> {
        let mut out = Vec::new();
        for n in 0..CLIENTS {
            out.push(Client {
                n,
                ctx: self.ctx.clone(),
                round: 0,
                rng: Rng::new(self.ctx.seed, &format!("{}/client{n}", self.ctx.name)),
                api: self.api.clone(),
                direct: Direct::connect_with(&self.url, Duration::from_secs(2)).await.expect("connect"),
                pace_ms,
                keyed: Vec::new(),
            });
        }
        out
    }

    pub(crate) fn conn(&self) -> redis::Connection {
        self.redis.lock().unwrap().conn()
    }

    /// Redis's clock, in ms.
    fn server_ms(&self) -> i64 {
        let (secs, micros): (i64, i64) = redis::cmd("TIME").query(&mut self.conn()).unwrap();
        secs * 1000 + micros / 1000
    }

    /// Runs `op` on the checker's connection until Redis answers (between rounds it is up).
    async fn read<O: Operation + Sync>(&self, round: usize, op: &O) -> Timed<O::Outcome> {
        for _ in 0..50 {
            let s = now_ms();
            let got = self.direct.run(op).await;
            let r = now_ms();
            match got {
                Ok(o) => return Timed { s, last: s, r, out: Outcome::Done(o) },
                Err(Error::Transport(_)) => tokio::time::sleep(Duration::from_millis(50)).await,
                Err(e) => self.ctx.fail(round, format!("reading state ({}): {e}", O::NAME)),
            }
        }
        self.ctx.fail(round, format!("reading state ({}): Redis never answered", O::NAME))
    }

    /// Starts this round's fault, at a random point within about `span_ms`; it returns the
    /// time Redis was at maxmemory, if that was the fault.
    fn fault(&mut self, round: usize, span_ms: u64) -> tokio::task::JoinHandle<Option<(i64, i64)>> {
        let kind = self.schedule[round];
        let delay = self.rng.below(span_ms + 1);
        let hold = self.rng.range(30, 250) as u64;
        self.ctx.say(format!("round {round}: {kind:?} at +{delay} ms (held {hold} ms)"));
        let redis = self.redis.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(delay)).await;
            let on = |f: fn(&mut RedisServer)| {
                let redis = redis.clone();
                tokio::task::spawn_blocking(move || f(&mut redis.lock().unwrap()))
            };
            match kind {
                Fault::Calm => {}
                Fault::ScriptFlush => {
                    on(|r| redis::cmd("SCRIPT").arg("FLUSH").query::<()>(&mut r.conn()).unwrap()).await.unwrap()
                }
                Fault::KillRestart => {
                    on(RedisServer::kill).await.unwrap(); // SIGKILL: only what fsync wrote survives
                    tokio::time::sleep(Duration::from_millis(hold)).await;
                    on(RedisServer::restart).await.unwrap(); // same port, same AOF
                }
                Fault::MaxMemory => {
                    on(|r| set_maxmemory(r, "1")).await.unwrap(); // below use: every write refused
                    let from = now_ms();
                    tokio::time::sleep(Duration::from_millis(hold)).await;
                    let until = now_ms();
                    on(|r| set_maxmemory(r, "0")).await.unwrap();
                    return Some((from, until));
                }
            }
            None
        })
    }

    /// One round: the fault, and every client's `f` at once; returns their calls.
    pub(crate) async fn round<R, F, Fut>(
        &mut self,
        round: usize,
        clients: &mut Vec<Client>,
        span_ms: u64,
        f: F,
    ) -> Vec<R>
    where
        R: Send + 'static,
        F: Fn(Client) -> Fut,
        Fut: Future<Output = (Client, Vec<R>)> + Send + 'static,
    {
        let fault = self.fault(round, span_ms);
        let tasks: Vec<_> = clients
            .drain(..)
            .map(|mut c| {
                c.round = round;
                tokio::spawn(f(c))
            })
            .collect();
        let mut out = Vec::new();
        for t in tasks {
            match t.await {
                Ok((c, calls)) => {
                    clients.push(c);
                    out.extend(calls);
                }
                Err(e) => std::panic::resume_unwind(e.into_panic()),
            }
        }
        match fault.await {
            Ok(full) => self.full.extend(full),
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
        out
    }

    /// Writes that ran while Redis was at maxmemory were refused whole (507 / OOM): none was
    /// answered as done. (That nothing was written, the models check.)
    pub(crate) fn fail_closed<'a, T: 'a>(&self, round: usize, writes: impl Iterator<Item = (&'a Timed<T>, String)>) {
        for (t, what) in writes {
            // Strictly inside (times are whole ms): sent after the setting was answered,
            // answered before it was undone.
            if let Some(&(from, until)) = self.full.iter().find(|&&(from, until)| from < t.s && t.r < until) {
                check!(
                    self.ctx,
                    round,
                    !matches!(t.out, Outcome::Done(_)),
                    "a write ran at maxmemory (from {from} to {until}) and was answered: {what}"
                );
            }
        }
    }
}

fn set_maxmemory(r: &mut RedisServer, bytes: &str) {
    redis::cmd("CONFIG").arg("SET").arg("maxmemory").arg(bytes).query::<()>(&mut r.conn()).unwrap()
}

/// The policies of `redcount serve`, from the same constants the RESP clients and the models use.
fn policies() -> String {
    let mut p = serde_json::Map::new();
    for c in &COUNTERS {
        let mut v = json!({
            "kind": "counter", "min": c.bounds.min, "max_step": 100,
            "mode": if c.bounds.mode == Mode::Clamp { "clamp" } else { "reject" },
            "storage": if c.storage == Storage::Key { "key" } else { "hash" },
        });
        if let Some(max) = c.bounds.max {
            v["max"] = json!(max);
        }
        p.insert(c.policy.into(), v);
    }
    for q in &QUOTAS {
        let v = match q.algo {
            Algorithm::FixedWindow { limit, window_ms } => {
                json!({"kind": "quota", "algorithm": "fixed", "limit": limit, "window_ms": window_ms})
            }
            Algorithm::SlidingWindow { limit, window_ms } => {
                json!({"kind": "quota", "algorithm": "sliding", "limit": limit, "window_ms": window_ms})
            }
            Algorithm::TokenBucket { capacity, refill, interval_ms } => json!({
                "kind": "quota", "algorithm": "bucket", "capacity": capacity, "refill": refill, "interval_ms": interval_ms
            }),
            Algorithm::Gcra { rate, period_ms, burst } => json!({
                "kind": "quota", "algorithm": "gcra", "rate": rate, "period_ms": period_ms, "burst": burst
            }),
        };
        let mut v = v;
        v["max_cost"] = json!(MAX_COST);
        p.insert(q.policy.into(), v);
    }
    p.insert(CLAIM_POLICY.into(), json!({"kind": "claim", "window_ms": CLAIM_WINDOW}));
    p.insert(SEM_POLICY.into(), json!({"kind": "semaphore", "limit": SEM_LIMIT, "lease_ms": SEM_LEASE}));
    p.insert(
        "r-packets".into(),
        json!({"kind": "redpackets", "max_shares": 50, "max_total_cents": 100_000, "ttl_ms": PACKET_TTL}),
    );
    p.insert(
        "i-inbox".into(),
        json!({"kind": "inbox", "ttl_ms": INBOX_TTL, "max_len": INBOX_LEN, "max_age_s": INBOX_AGE, "public": true}),
    );
    Value::Object(p).to_string()
}

// ---------------------------------------------------------------------------------------------
// Counters: value == the sum of what was applied, never outside [min, max]

#[derive(Debug, Clone, Copy)]
struct CounterSpec {
    policy: &'static str,
    bounds: Bounds,
    storage: Storage,
}

const COUNTERS: [CounterSpec; 3] = [
    CounterSpec {
        policy: "m-floor",
        bounds: Bounds { min: 0, max: None, mode: Mode::Clamp, ttl_ms: 0 },
        storage: Storage::Key,
    },
    CounterSpec {
        policy: "m-capped",
        bounds: Bounds { min: 0, max: Some(12), mode: Mode::Reject, ttl_ms: 0 },
        storage: Storage::HashField,
    },
    CounterSpec {
        policy: "m-clamped",
        bounds: Bounds { min: 0, max: Some(9), mode: Mode::Clamp, ttl_ms: 0 },
        storage: Storage::Key,
    },
];
const SUBJECTS: [&str; 2] = ["s1", "s2"];

impl CounterSpec {
    fn max(&self) -> i64 {
        self.bounds.max.unwrap_or(counter::MAX_VALUE)
    }

    /// What an unanswered call may have added.
    fn maybe_applied(&self, delta: i64) -> Vec<i64> {
        match self.bounds.mode {
            Mode::Reject => vec![0, delta],
            Mode::Clamp => (delta.min(0)..=delta.max(0)).collect(),
        }
    }

    /// The stored value, read with plain Redis commands.
    fn stored(&self, conn: &mut redis::Connection, subject: &str) -> i64 {
        let v: Option<i64> = match self.storage {
            Storage::Key => redis::cmd("GET").arg(keys::counter(self.policy, subject)).query(conn).unwrap(),
            Storage::HashField => {
                redis::cmd("HGET").arg(keys::counter_hash(self.policy)).arg(subject).query(conn).unwrap()
            }
        };
        v.unwrap_or(0)
    }
}

#[derive(Debug, Clone)]
struct CounterCall {
    counter: usize,
    subject: usize,
    delta: i64,
    via: &'static str,
    t: Timed<CounterOutcome>,
}

impl CounterCall {
    fn show(&self) -> String {
        let (policy, subject) = (COUNTERS[self.counter].policy, SUBJECTS[self.subject]);
        format!("{policy} {subject} delta {} {} [{}, {}] {:?}", self.delta, self.via, self.t.s, self.t.r, self.t.out)
    }
}

/// Checks one answer on its own: within the bounds, and the status says what was applied.
fn check_counter_answer(c: &Client, spec: &CounterSpec, delta: i64, o: &CounterOutcome) {
    let (min, max) = (spec.bounds.min, spec.max());
    let before = o.value - o.applied;
    let what = format!("{} delta {delta} -> {o:?} (bounds {min}..={max}, {:?})", spec.policy, spec.bounds.mode);
    if o.value < min || o.value > max {
        c.fail(format!("{what}: value outside the bounds"));
    }
    let consistent = match o.status {
        CounterStatus::Applied => o.applied == delta,
        CounterStatus::Clamped => {
            spec.bounds.mode == Mode::Clamp
                && ((delta < 0 && o.value == min && before + delta < min)
                    || (delta > 0 && o.value == max && before + delta > max))
        }
        CounterStatus::Rejected => {
            spec.bounds.mode == Mode::Reject && o.applied == 0 && (before + delta < min || before + delta > max)
        }
    };
    if !consistent {
        c.fail(format!("{what}: the status does not match what was applied"));
    }
}

async fn counter_round(mut c: Client) -> (Client, Vec<CounterCall>) {
    let mut out = Vec::new();
    for _ in 0..OPS {
        c.pause().await;
        if c.rng.percent(12) {
            c.replay().await;
            continue;
        }
        let (k, sub) = (c.rng.index(COUNTERS.len()), c.rng.index(SUBJECTS.len()));
        let spec = COUNTERS[k];
        if c.rng.percent(8) {
            // A read through the API: within the bounds.
            let t =
                c.api.call("GET", &format!("/api/counters/{}/{}", spec.policy, SUBJECTS[sub]), "", None, false).await;
            let t = c.decode(t, "GET counter", |st, v| (st == 200).then(|| int(v, "value")).flatten());
            if let Some(&v) = t.done()
                && (v < spec.bounds.min || v > spec.max())
            {
                c.fail(format!("{} {}: read {v}, outside the bounds", spec.policy, SUBJECTS[sub]));
            }
            continue;
        }
        let delta = c.rng.range(-4, 5);
        let (via, t) = if c.http() {
            let path = format!("/api/counters/{}/{}", spec.policy, SUBJECTS[sub]);
            let t =
                c.write(path, json!({ "delta": delta }).to_string(), json!({ "delta": delta + 1 }).to_string()).await;
            let t = c.decode(t, "POST counter", |st, v| {
                let status = match v["status"].as_str()? {
                    "applied" => CounterStatus::Applied,
                    "clamped" => CounterStatus::Clamped,
                    "rejected" => CounterStatus::Rejected,
                    _ => return None,
                };
                (st == 200).then_some(CounterOutcome { value: int(v, "value")?, applied: int(v, "applied")?, status })
            });
            ("http", t)
        } else {
            let op = AddCounter::new(spec.policy, SUBJECTS[sub], spec.storage, delta, spec.bounds).unwrap();
            ("resp", c.run(&op).await)
        };
        if let Some(o) = t.done() {
            check_counter_answer(&c, &spec, delta, o);
        }
        out.push(CounterCall { counter: k, subject: sub, delta, via, t });
    }
    (c, out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn counter_value_is_the_sum_of_what_was_applied() {
    let (mut env, rounds) = Env::start("counter_value_is_the_sum_of_what_was_applied").await;
    let mut clients = env.clients(6).await;
    // The values each counter may hold, given every answer and every unanswered call so far.
    let mut model: BTreeMap<(usize, usize), BTreeSet<i64>> = BTreeMap::new();
    for k in 0..COUNTERS.len() {
        for s in 0..SUBJECTS.len() {
            model.insert((k, s), BTreeSet::from([0]));
        }
    }
    let mut history = Vec::new();
    for round in 0..rounds {
        let calls = env.round(round, &mut clients, 20, counter_round).await;
        env.fail_closed(round, calls.iter().map(|c| (&c.t, c.show())));
        let mut conn = env.conn();
        for (&(k, sub), possible) in model.iter_mut() {
            let spec = COUNTERS[k];
            let mine: Vec<&CounterCall> = calls.iter().filter(|c| (c.counter, c.subject) == (k, sub)).collect();
            let applied: i64 = mine.iter().filter_map(|c| c.t.done()).map(|o| o.applied).sum();
            let mut set: BTreeSet<i64> = possible.iter().map(|v| v + applied).collect();
            let unknown: Vec<&&CounterCall> = mine.iter().filter(|c| c.t.unknown()).collect();
            for u in &unknown {
                let adds = spec.maybe_applied(u.delta);
                set = set.iter().flat_map(|v| adds.iter().map(move |a| v + a)).collect();
            }
            set.retain(|v| (spec.bounds.min..=spec.max()).contains(v));
            let stored = spec.stored(&mut conn, SUBJECTS[sub]);
            check!(
                env.ctx,
                round,
                set.contains(&stored),
                "{} {}: Redis holds {stored}, the model allows {set:?} (before the round {possible:?}, \
                 answered calls applied {applied}, unanswered deltas {:?}; this round: {:?})",
                spec.policy,
                SUBJECTS[sub],
                unknown.iter().map(|u| (u.delta, u.via)).collect::<Vec<_>>(),
                mine.iter().map(|c| (c.via, c.delta, &c.t.out)).collect::<Vec<_>>()
            );
            *possible = BTreeSet::from([stored]);
        }
        history.extend(calls);
    }
    env.ctx.say(format!("{} calls: {}", history.len(), tally(history.iter().map(|c| &c.t.out))));
}

// ---------------------------------------------------------------------------------------------
// Quotas: never more than N units in a window

#[derive(Debug, Clone, Copy)]
struct QuotaSpec {
    policy: &'static str,
    algo: Algorithm,
}

const QUOTAS: [QuotaSpec; 4] = [
    QuotaSpec { policy: "q-fixed", algo: Algorithm::FixedWindow { limit: 5, window_ms: 300 } },
    QuotaSpec { policy: "q-sliding", algo: Algorithm::SlidingWindow { limit: 4, window_ms: 250 } },
    QuotaSpec { policy: "q-bucket", algo: Algorithm::TokenBucket { capacity: 4, refill: 1, interval_ms: 80 } },
    QuotaSpec { policy: "q-gcra", algo: Algorithm::Gcra { rate: 3, period_ms: 200, burst: 4 } },
];
const MAX_COST: i64 = 2;

#[derive(Debug, Clone)]
struct QuotaCall {
    quota: usize,
    cost: i64,
    peek: bool,
    via: &'static str,
    /// A denial `redcount serve` repeated from memory (`"cached": true`): no call to Redis.
    cached: bool,
    t: Timed<QuotaOutcome>,
}

impl QuotaCall {
    fn show(&self) -> String {
        let (policy, peek) = (QUOTAS[self.quota].policy, if self.peek { " (peek)" } else { "" });
        format!("{policy} cost {}{peek} {} [{}, {}] {:?}", self.cost, self.via, self.t.s, self.t.r, self.t.out)
    }

    /// Units this call took (an answered, allowed take).
    fn granted(&self) -> bool {
        !self.peek && self.t.done().is_some_and(|o| o.allowed)
    }

    /// A take that may have taken units: allowed, or unanswered.
    fn maybe_granted(&self) -> bool {
        !self.peek && (self.granted() || self.t.unknown())
    }

    /// Units in use when it ran, not counting its own (at least this many: `remaining` is
    /// clamped at 0).
    fn used_before(&self, limit: i64) -> Option<i64> {
        let o = self.t.done()?;
        Some(limit - o.remaining - if self.granted() { self.cost } else { 0 })
    }
}

fn check_quota_answer(c: &Client, spec: &QuotaSpec, cost: i64, peek: bool, o: &QuotaOutcome) {
    let limit = spec.algo.limit();
    let what = format!("{} cost {cost}{} -> {o:?}", spec.policy, if peek { " (peek)" } else { "" });
    let mut ok = o.limit == limit && (0..=limit).contains(&o.remaining) && o.reset_ms >= 0;
    ok &= if o.allowed {
        o.retry_after_ms == 0 && if peek { o.remaining >= cost } else { o.remaining <= limit - cost }
    } else {
        o.retry_after_ms >= 1 && o.remaining < cost
    };
    ok &= match spec.algo {
        Algorithm::FixedWindow { window_ms, .. } => (1..=window_ms).contains(&o.reset_ms),
        Algorithm::SlidingWindow { window_ms, .. } => o.reset_ms <= window_ms,
        Algorithm::TokenBucket { capacity, refill, interval_ms } => {
            o.reset_ms <= ceil_div(capacity, refill) * interval_ms
        }
        Algorithm::Gcra { rate, period_ms, burst } => o.reset_ms <= ceil_div(burst * period_ms, rate),
    };
    if !ok {
        c.fail(format!("{what}: an answer no quota gives"));
    }
}

async fn quota_round(mut c: Client) -> (Client, Vec<QuotaCall>) {
    let mut out = Vec::new();
    for _ in 0..OPS {
        c.pause().await;
        if c.rng.percent(10) {
            c.replay().await;
            continue;
        }
        let q = c.rng.index(QUOTAS.len());
        let spec = QUOTAS[q];
        let cost = c.rng.range(1, MAX_COST);
        let peek = c.rng.percent(15);
        let path = format!("/api/quotas/{}/s1", spec.policy);
        let cached = std::sync::atomic::AtomicBool::new(false);
        let parse = |st: u16, v: &Value| {
            cached.store(v["cached"] == Value::Bool(true), std::sync::atomic::Ordering::Relaxed);
            (st == 200).then_some(QuotaOutcome {
                allowed: v["allowed"].as_bool()?,
                limit: int(v, "limit")?,
                remaining: int(v, "remaining")?,
                reset_ms: int(v, "reset_ms")?,
                retry_after_ms: int(v, "retry_after_ms")?,
            })
        };
        let (via, t) = match (c.http(), peek) {
            (true, true) => {
                let t = c.api.call("GET", &format!("{path}?cost={cost}"), "", None, false).await;
                ("http", c.decode(t, "GET quota", parse))
            }
            (true, false) => {
                let t =
                    c.write(path, json!({ "cost": cost }).to_string(), json!({ "cost": 3 - cost }).to_string()).await;
                ("http", c.decode(t, "POST quota", parse))
            }
            (false, true) => ("resp", c.run(&TakeQuota::peek(spec.policy, "s1", spec.algo, cost).unwrap()).await),
            (false, false) => ("resp", c.run(&TakeQuota::take(spec.policy, "s1", spec.algo, cost).unwrap()).await),
        };
        if let Some(o) = t.done() {
            check_quota_answer(&c, &spec, cost, peek, o);
        }
        out.push(QuotaCall { quota: q, cost, peek, via, cached: cached.into_inner(), t });
    }
    (c, out)
}

/// Fixed window: the window of an answered call, from `reset_ms` (its end is a multiple of
/// the window within `[s + reset, r + reset]`); `None` when the bracket allows two.
fn fixed_window_of(call: &QuotaCall, window: i64) -> Option<i64> {
    let o = call.t.done()?;
    let (lo, hi) = (call.t.s + o.reset_ms, call.t.r + o.reset_ms);
    let end = ceil_div(lo, window) * window;
    (end <= hi && end + window > hi).then_some(end / window - 1)
}

/// Checks the calls of the round that began at `since` against the whole history (each call
/// once: everything that may have run before it is known by the end of its round).
fn check_quotas(ctx: &Ctx, round: usize, since: i64, history: &[QuotaCall]) {
    for (q, spec) in QUOTAS.iter().enumerate() {
        let calls: Vec<&QuotaCall> = history.iter().filter(|c| c.quota == q).collect();
        let new = |c: &QuotaCall| c.t.s >= since;
        let show = QuotaCall::show;
        match spec.algo {
            Algorithm::FixedWindow { limit, window_ms } => {
                // Units granted within one window are distinct units of 1..=limit (an answer
                // says which: limit - remaining is the count after it).
                let mut units: BTreeMap<i64, Vec<(i64, i64, &QuotaCall)>> = BTreeMap::new();
                for c in calls.iter().filter(|c| c.granted()) {
                    if let Some(w) = fixed_window_of(c, window_ms) {
                        let after = limit - c.t.done().unwrap().remaining;
                        units.entry(w).or_default().push((after - c.cost + 1, after, c));
                    }
                }
                for (w, mut taken) in units {
                    taken.sort_by_key(|u| u.0);
                    for pair in taken.windows(2) {
                        check!(
                            ctx,
                            round,
                            pair[0].1 < pair[1].0,
                            "{}: window {w} granted units {}..={} twice:\n  {}\n  {}",
                            spec.policy,
                            pair[1].0,
                            pair[0].1,
                            show(pair[0].2),
                            show(pair[1].2)
                        );
                    }
                    let total: i64 = taken.iter().map(|u| u.2.cost).sum();
                    check!(ctx, round, total <= limit, "{}: window {w} granted {total} units > {limit}", spec.policy);
                }
                // No usage that nobody could have caused.
                for c in calls.iter().filter(|c| new(c)) {
                    let (Some(w), Some(used)) = (fixed_window_of(c, window_ms), c.used_before(limit)) else { continue };
                    let could: i64 = calls
                        .iter()
                        .filter(|g| !std::ptr::eq(**g, *c) && g.maybe_granted() && g.t.s <= c.t.r)
                        .filter(|g| match fixed_window_of(g, window_ms) {
                            Some(gw) => gw == w,
                            None => g.t.s.div_euclid(window_ms) <= w && w <= g.t.r.div_euclid(window_ms),
                        })
                        .map(|g| g.cost)
                        .sum();
                    check!(
                        ctx,
                        round,
                        used <= could,
                        "{}: {} saw {used} units used in window {w}, but calls that may have taken units there \
                         took at most {could}",
                        spec.policy,
                        show(c)
                    );
                }
            }
            Algorithm::SlidingWindow { limit, window_ms } => {
                let mut grants: Vec<&QuotaCall> = calls.iter().copied().filter(|c| c.granted()).collect();
                grants.sort_by_key(|c| c.t.s);
                // Grants whose server times all lie within less than a window: at most `limit`.
                for (i, a) in grants.iter().enumerate().filter(|(_, a)| a.t.s + window_ms > since) {
                    let set: Vec<&&QuotaCall> =
                        grants[i..].iter().filter(|g| g.t.r < a.t.s + window_ms && a.t.r < a.t.s + window_ms).collect();
                    let total: i64 = set.iter().map(|g| g.cost).sum();
                    check!(
                        ctx,
                        round,
                        total <= limit,
                        "{}: {total} units granted within one {window_ms} ms window (limit {limit}):\n  {}",
                        spec.policy,
                        set.iter().map(|g| show(g)).collect::<Vec<_>>().join("\n  ")
                    );
                }
                for c in calls.iter().filter(|c| new(c)) {
                    let Some(used) = c.used_before(limit) else { continue };
                    let could: i64 = calls
                        .iter()
                        .filter(|g| !std::ptr::eq(**g, *c) && g.maybe_granted())
                        .filter(|g| g.t.s <= c.t.r && g.t.r > c.t.s - window_ms)
                        .map(|g| g.cost)
                        .sum();
                    check!(
                        ctx,
                        round,
                        used <= could,
                        "{}: {} saw {used} units in its window, but calls in reach took at most {could}",
                        spec.policy,
                        show(c)
                    );
                }
            }
            // Over any span: at most a full bucket plus what refills within it.
            Algorithm::TokenBucket { capacity, refill, interval_ms } => {
                check_spans(ctx, round, since, spec, &calls, |d| capacity + refill * (d / interval_ms + 1));
            }
            // Over any span of d ms: at most the burst plus one unit per emission interval
            // within it (rate * d / period, rounded up).
            Algorithm::Gcra { rate, period_ms, burst } => {
                check_spans(ctx, round, since, spec, &calls, |d| burst + ceil_div(rate * d, period_ms));
            }
        }
    }
}

/// Checks that the units granted over every span (from a grant's start to a later grant's
/// end, d ms) stay within `most(d)`. Spans start up to 2 s before the round: older ones were
/// checked before.
fn check_spans(ctx: &Ctx, round: usize, since: i64, spec: &QuotaSpec, calls: &[&QuotaCall], most: impl Fn(i64) -> i64) {
    let mut grants: Vec<&QuotaCall> = calls.iter().copied().filter(|c| c.granted()).collect();
    grants.sort_by_key(|c| c.t.s);
    for (i, a) in grants.iter().enumerate().filter(|(_, a)| a.t.s + 2_000 > since) {
        let (mut end, mut total) = (a.t.r, 0);
        for g in &grants[i..] {
            end = end.max(g.t.r);
            total += g.cost;
            let most = most(end - a.t.s);
            check!(
                ctx,
                round,
                total <= most,
                "{}: {total} units granted between {} and {end} ms, at most {most} possible (from {} to {})",
                spec.policy,
                a.t.s,
                QuotaCall::show(a),
                QuotaCall::show(g)
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn quota_never_grants_more_than_its_limit_in_a_window() {
    let (mut env, rounds) = Env::start("quota_never_grants_more_than_its_limit_in_a_window").await;
    let mut clients = env.clients(30).await;
    let mut history = Vec::new();
    for round in 0..rounds {
        let since = now_ms();
        let calls = env.round(round, &mut clients, 80, quota_round).await;
        // A peek shares the take script: refused too. A denial repeated from the shell's
        // memory reaches no script (a denial writes nothing).
        env.fail_closed(round, calls.iter().filter(|c| !c.cached).map(|c| (&c.t, c.show())));
        history.extend(calls);
        check_quotas(&env.ctx, round, since, &history);
    }
    let granted = history.iter().filter(|c| c.granted()).count();
    let denied = history.iter().filter(|c| c.t.done().is_some_and(|o| !o.allowed)).count();
    env.ctx.say(format!(
        "{} calls ({}): {granted} granted, {denied} denied",
        history.len(),
        tally(history.iter().map(|c| &c.t.out))
    ));
    assert!(granted > 0 && denied > 0, "the workload reaches both sides of every limit (seed {})", env.ctx.seed);
}

// ---------------------------------------------------------------------------------------------
// Once-per-window claims: at most one winner per window

const CLAIM_POLICY: &str = "c-once";
const CLAIM_WINDOW: i64 = 250;

#[derive(Debug, Clone)]
struct ClaimCall {
    subject: usize,
    via: &'static str,
    t: Timed<ClaimOutcome>,
}

impl ClaimCall {
    fn won(&self) -> bool {
        self.t.done().is_some_and(|o| o.claimed)
    }

    fn show(&self) -> String {
        format!("{} [{}, {}] {:?}", self.via, self.t.s, self.t.r, self.t.out)
    }
}

async fn claim_round(mut c: Client) -> (Client, Vec<ClaimCall>) {
    let mut out = Vec::new();
    for _ in 0..OPS {
        c.pause().await;
        if c.rng.percent(10) {
            c.replay().await;
            continue;
        }
        let sub = c.rng.index(SUBJECTS.len());
        let (via, t) = if c.http() {
            let path = format!("/api/claims/{CLAIM_POLICY}/{}", SUBJECTS[sub]);
            let t = c.write(path, String::new(), "{}".into()).await;
            let t = c.decode(t, "POST claim", |st, v| {
                (st == 200).then_some(ClaimOutcome {
                    claimed: v["claimed"].as_bool()?,
                    window_left_ms: v["retry_after_ms"].as_i64(),
                })
            });
            ("http", t)
        } else {
            ("resp", c.run(&Claim::new(CLAIM_POLICY, SUBJECTS[sub], CLAIM_WINDOW).unwrap()).await)
        };
        if let Some(o) = t.done() {
            let ok = if o.claimed {
                o.window_left_ms == Some(CLAIM_WINDOW)
            } else {
                o.window_left_ms.is_some_and(|ms| (0..=CLAIM_WINDOW).contains(&ms))
            };
            if !ok {
                c.fail(format!("claim {}: {o:?}: an answer no claim gives", SUBJECTS[sub]));
            }
        }
        out.push(ClaimCall { subject: sub, via, t });
    }
    (c, out)
}

fn check_claims(env: &Env, round: usize, since: i64, history: &[ClaimCall]) {
    let ctx = &env.ctx;
    let mut conn = env.conn();
    for (sub, subject) in SUBJECTS.iter().enumerate() {
        let calls: Vec<&ClaimCall> = history.iter().filter(|c| c.subject == sub).collect();
        let mut winners: Vec<&ClaimCall> = calls.iter().copied().filter(|c| c.won()).collect();
        winners.sort_by_key(|c| c.t.s);
        // Two winners must be able to be a window apart.
        for (i, a) in winners.iter().enumerate() {
            for b in winners[i + 1..].iter().filter(|b| a.t.s >= since || b.t.s >= since) {
                let farthest = (b.t.r - a.t.s).max(a.t.r - b.t.s);
                check!(
                    ctx,
                    round,
                    farthest >= CLAIM_WINDOW,
                    "{subject}: two winners within one {CLAIM_WINDOW} ms window:\n  {}\n  {}",
                    a.show(),
                    b.show()
                );
            }
        }
        // A refusal names the window of a claim someone made (answered or not).
        let maybe_won =
            |lo: i64, hi: i64| calls.iter().any(|g| (g.won() || g.t.unknown()) && g.t.s <= hi && g.t.r >= lo);
        for c in calls.iter().filter(|c| c.t.s >= since && c.t.done().is_some_and(|o| !o.claimed)) {
            let left = c.t.done().unwrap().window_left_ms.unwrap();
            let (lo, hi) = (c.t.s + left - CLAIM_WINDOW - SLACK, c.t.r + left - CLAIM_WINDOW + SLACK);
            check!(
                ctx,
                round,
                maybe_won(lo, hi),
                "{subject}: {} was refused for a claim made in [{lo}, {hi}], but nobody claimed then",
                c.show()
            );
        }
        // What Redis holds: the time of a claim someone made, and the last acknowledged winner's
        // claim while its window lasts.
        let key = keys::claim(CLAIM_POLICY, subject);
        let stored: Option<i64> = redis::cmd("GET").arg(&key).query(&mut conn).unwrap();
        let now = env.server_ms();
        if let Some(at) = stored {
            check!(
                ctx,
                round,
                maybe_won(at - SLACK, at + SLACK),
                "{subject}: Redis holds a claim made at {at}, but nobody claimed then"
            );
        }
        if let Some(last) = winners.iter().max_by_key(|c| c.t.s)
            && last.t.s + CLAIM_WINDOW > now + SLACK
        {
            check!(
                ctx,
                round,
                stored.is_some_and(|at| at >= last.t.s - SLACK && at <= last.t.r + SLACK),
                "{subject}: the acknowledged claim {} is still in its window at {now}, Redis holds {stored:?}",
                last.show()
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn claim_has_at_most_one_winner_per_window() {
    let (mut env, rounds) = Env::start("claim_has_at_most_one_winner_per_window").await;
    let mut clients = env.clients(40).await;
    let mut history = Vec::new();
    for round in 0..rounds {
        let since = now_ms();
        let calls = env.round(round, &mut clients, 100, claim_round).await;
        env.fail_closed(round, calls.iter().map(|c| (&c.t, c.show())));
        history.extend(calls);
        check_claims(&env, round, since, &history);
    }
    let won = history.iter().filter(|c| c.won()).count();
    env.ctx.say(format!("{} calls ({}), {won} winners", history.len(), tally(history.iter().map(|c| &c.t.out))));
    assert!(won > 1, "the run spans several windows (seed {})", env.ctx.seed);
}

// ---------------------------------------------------------------------------------------------
// UpdateLease: never more holders than the limit; no lease lost, none invented

const SEM_POLICY: &str = "s-slots";
const SEM_NAME: &str = "pool";
const SEM_LIMIT: i64 = 3;
const SEM_LEASE: i64 = 300;
/// Leases of the RESP clients (the HTTP clients get the policy's).
const SEM_LEASES: [i64; 3] = [150, SEM_LEASE, 800];
const SEM_LONGEST: i64 = 800;
/// Holders per client: client n owns holders n, n + CLIENTS, … so each holder's calls are
/// sequential.
const SEM_HOLDERS_EACH: usize = 2;

#[derive(Debug, Clone)]
struct SemCall {
    holder: usize,
    action: Action,
    lease: i64,
    /// A keyed acquire or renew sent again after it was answered: it tells the lease now, or
    /// not_holder; it grants nothing.
    replay: bool,
    via: &'static str,
    t: Timed<SemaphoreOutcome>,
}

impl SemCall {
    fn show(&self) -> String {
        format!(
            "h{} {:?}{} {} lease {} [{}, {}] {:?}",
            self.holder,
            self.action,
            if self.replay { " (replay)" } else { "" },
            self.via,
            self.lease,
            self.t.s,
            self.t.r,
            self.t.out
        )
    }
}

/// A keyed semaphore request already answered, for replays.
#[derive(Debug, Clone)]
struct SemKeyed {
    holder: usize,
    action: Action,
    key: String,
    path: String,
    body: String,
    answer: SemaphoreOutcome,
}

fn sem_parse(st: u16, v: &Value) -> Option<SemaphoreOutcome> {
    let result = match v["result"].as_str()? {
        "acquired" => SemaphoreResult::Acquired,
        "renewed" => SemaphoreResult::Renewed,
        "full" => SemaphoreResult::Full,
        "released" => SemaphoreResult::Released,
        "not_holder" => SemaphoreResult::NotHolder,
        "held" => SemaphoreResult::Held,
        "ended" => SemaphoreResult::Ended,
        "never_held" => SemaphoreResult::NeverHeld,
        _ => return None,
    };
    (st == 200).then_some(SemaphoreOutcome {
        result,
        in_use: int(v, "in_use")?,
        limit: int(v, "limit")?,
        earliest_end_ms: v["earliest_end_ms"].as_i64(),
        lease_ms: int(v, "lease_ms")?,
        fencing_token: v["fencing_token"].as_i64(),
    })
}

/// True when an acquire was refused as full.
fn o_full(t: &Timed<SemaphoreOutcome>) -> bool {
    t.done().is_some_and(|o| o.result == SemaphoreResult::Full)
}

async fn semaphore_round(mut c: Client, keyed: Arc<Mutex<Vec<SemKeyed>>>) -> (Client, Vec<SemCall>) {
    use SemaphoreResult::*;
    let mut out: Vec<SemCall> = Vec::new();
    for _ in 0..OPS {
        c.pause().await;
        let holder = c.n + CLIENTS * c.rng.index(SEM_HOLDERS_EACH);
        let name = format!("h{holder}");
        let mine: Vec<SemKeyed> = keyed.lock().unwrap().iter().filter(|k| k.holder == holder).cloned().collect();
        if !mine.is_empty() && c.rng.percent(12) {
            let k = &mine[c.rng.index(mine.len())];
            let (t, stored) = c.api.call_marked("POST", &k.path, &k.body, Some(&k.key), false).await;
            let t = c.decode(t, "semaphore replay", sem_parse);
            if let Some(o) = t.done() {
                // A stored grant is replayed as the lease held now (its code) or not_holder; a
                // stored refusal (full, or a renew's not_holder) as it was. A first not_holder may
                // itself have been the replay of a grant whose first attempt went unanswered.
                let lease_ok = (1..=SEM_LONGEST).contains(&o.lease_ms);
                let (ok, evidence) = match (k.answer.result, o.result) {
                    (Acquired | Renewed, Acquired | Renewed) => (o.result == k.answer.result && lease_ok, true),
                    (Acquired | Renewed, NotHolder) => (o.lease_ms == 0, true),
                    (NotHolder, Acquired | Renewed) => (lease_ok, true),
                    (NotHolder, NotHolder) => (o.lease_ms == 0, false),
                    _ => (*o == k.answer, false),
                };
                if !ok {
                    c.fail(format!("{name}: {:?} replayed: first {:?}, now {o:?}", k.action, k.answer));
                }
                // Not a stored answer: the first call stored no reply (a renew answered
                // not_holder, semaphore.lua), so this one ran anew and may have renewed a lease
                // taken since.
                if evidence || !stored {
                    out.push(SemCall { holder, action: k.action, lease: SEM_LEASE, replay: stored, via: "http", t });
                }
            }
            continue;
        }
        // What this client believes (its own last answer), to make the workload meaningful.
        let holds = out
            .iter()
            .rev()
            .find(|s| s.holder == holder && !s.replay)
            .and_then(|s| s.t.done())
            .is_some_and(|o| matches!(o.result, Acquired | Renewed));
        let action = match (holds, c.rng.below(10)) {
            (true, 0..=3) => Action::Renew,
            (true, 4..=7) => Action::Release,
            (false, 0..=7) | (true, _) => Action::Acquire,
            (false, 8) => Action::Renew,
            (false, _) => Action::Release,
        };
        let verb = match action {
            Action::Acquire => "acquire",
            Action::Renew => "renew",
            Action::Release => "release",
            Action::Check { .. } => unreachable!("not drawn"),
        };
        let (via, lease, t) = if c.http() {
            let path = format!("/api/semaphores/{SEM_POLICY}/{SEM_NAME}/{verb}");
            let body = json!({ "holder": name }).to_string();
            let key = if c.rng.percent(75) { Some(c.new_key()) } else { None };
            let t = c.api.call("POST", &path, &body, key.as_deref(), key.is_some()).await;
            let t = c.decode(t, "POST semaphore", sem_parse);
            // A release is not replayed; a refused acquire (full) stores no reply: a new call.
            if let (Some(key), Some(o), false) =
                (key, t.done(), action == Action::Release || (action == Action::Acquire && o_full(&t)))
            {
                let k = SemKeyed { holder, action, key, path, body, answer: *o };
                keyed.lock().unwrap().push(k);
            }
            ("http", SEM_LEASE, t)
        } else {
            let lease = SEM_LEASES[c.rng.index(SEM_LEASES.len())];
            let op = UpdateLease::new(SEM_POLICY, SEM_NAME, action, &name, SEM_LIMIT, lease).unwrap();
            ("resp", lease, c.run(&op).await)
        };
        if let Some(o) = t.done() {
            let ok = o.limit == SEM_LIMIT
                && (0..=SEM_LIMIT).contains(&o.in_use)
                && match o.result {
                    Acquired | Renewed => {
                        action != Action::Release
                            && o.in_use >= 1
                            && (1..=lease).contains(&o.lease_ms)
                            && o.fencing_token.is_some()
                    }
                    Full => action == Action::Acquire && o.in_use == SEM_LIMIT && o.lease_ms == 0,
                    Released => action == Action::Release && o.lease_ms == 0,
                    // A retried acquire may be answered by the replay of its first attempt.
                    NotHolder => o.lease_ms == 0,
                    Held | Ended | NeverHeld => false, // answers to a check, not asked here
                };
            if !ok {
                c.fail(format!("{name} {verb} (lease {lease}) -> {o:?}: an answer no semaphore gives"));
            }
        }
        out.push(SemCall { holder, action, lease, replay: false, via, t });
    }
    (c, out)
}

/// Per holder: when it certainly held a lease, and when it may have.
#[derive(Debug, Default)]
struct HolderView {
    certain: Vec<(i64, i64)>,
    possible: Vec<(i64, i64)>,
}

fn holder_view(ctx: &Ctx, round: usize, calls: &[&SemCall]) -> HolderView {
    use SemaphoreResult::*;
    let mut v = HolderView::default();
    // The interval being built of each kind: [start, end).
    let mut certain: Option<(i64, i64)> = None;
    let mut possible: Option<(i64, i64)> = None;
    for c in calls {
        let (s, r) = (c.t.s, c.t.r);
        let possible_at =
            |p: &Option<(i64, i64)>, v: &HolderView| p.iter().chain(&v.possible).any(|&(a, e)| a <= r && e >= s);
        let certain_over = certain.filter(|&(a, e)| a <= s && r < e);
        match &c.t.out {
            Outcome::Done(o) if c.replay && o.result != NotHolder => {
                check!(
                    ctx,
                    round,
                    possible_at(&possible, &v),
                    "a replay answered a lease nobody granted: {}",
                    c.show()
                );
            }
            Outcome::Done(o) if matches!(o.result, Acquired | Renewed) => {
                if o.result == Acquired
                    && let Some((a, e)) = certain_over
                {
                    check!(ctx, round, false, "a lease held for certain over [{a}, {e}) was lost: {}", c.show());
                }
                // The lease now ends `lease_ms` after the call ran (a renew may shorten it).
                let end = c.t.last + o.lease_ms;
                certain = match certain {
                    Some((a, e)) if e > r => Some((a, end)),
                    other => {
                        v.certain.extend(other.map(|(a, e)| (a, e.min(c.t.last))));
                        Some((r, end))
                    }
                };
                let pend = r + o.lease_ms + SLACK;
                possible = match possible {
                    Some((a, e)) if e >= s => Some((a, e.max(pend))),
                    other => {
                        v.possible.extend(other);
                        Some((s, pend))
                    }
                };
            }
            // A replay reports its own grant only while that grant is the lease (the same
            // fencing token): its NotHolder says nothing of a lease another call granted since.
            Outcome::Done(o) if c.replay && o.result == NotHolder => {}
            Outcome::Done(o) => {
                // Not holding when it ran (NotHolder, Full), or not any more (Released).
                if o.result == Released {
                    check!(ctx, round, possible_at(&possible, &v), "released a lease nobody granted: {}", c.show());
                } else if let Some((a, e)) = certain_over {
                    check!(ctx, round, false, "a lease held for certain over [{a}, {e}) was lost: {}", c.show());
                }
                v.certain.extend(certain.take().map(|(a, e)| (a, e.min(s))));
                v.possible.extend(possible.take().map(|(a, e)| (a, e.min(r))));
            }
            Outcome::Unknown(_) if c.action == Action::Release => {
                v.certain.extend(certain.take().map(|(a, e)| (a, e.min(s))));
            }
            Outcome::Unknown(_) if !c.replay => {
                // May have run: a renew (or an acquire of a holder) may have moved the end, to
                // at least s + lease; an acquire may have granted a lease.
                certain = certain.map(|(a, e)| (a, e.min(s + c.lease)));
                let pend = r + c.lease + SLACK;
                possible = match possible {
                    Some((a, e)) if e >= s => Some((a, e.max(pend))),
                    other if c.action == Action::Acquire => {
                        v.possible.extend(other);
                        Some((s, pend))
                    }
                    other => other,
                };
            }
            Outcome::Unknown(_) | Outcome::Refused => {}
        }
    }
    v.certain.extend(certain);
    v.possible.extend(possible);
    v.certain.retain(|(a, e)| a < e);
    v
}

fn check_semaphore(env: &Env, round: usize, since: i64, history: &[SemCall]) {
    let ctx = &env.ctx;
    let holders = CLIENTS * SEM_HOLDERS_EACH;
    let mut views = Vec::new();
    for h in 0..holders {
        let mut calls: Vec<&SemCall> = history.iter().filter(|c| c.holder == h).collect();
        calls.sort_by_key(|c| c.t.s);
        views.push(holder_view(ctx, round, &calls));
    }
    // Holders that certainly held at once: at most the limit.
    let mut events: Vec<(i64, i64, usize)> = Vec::new();
    for (h, v) in views.iter().enumerate() {
        for &(a, e) in &v.certain {
            events.push((a, 1, h));
            events.push((e, -1, h));
        }
    }
    events.sort_by_key(|&(t, d, _)| (t, d)); // an end before a start at the same ms
    let mut holding: BTreeSet<usize> = BTreeSet::new();
    for (t, d, h) in events {
        if d > 0 {
            holding.insert(h);
        } else {
            holding.remove(&h);
        }
        check!(
            ctx,
            round,
            holding.len() as i64 <= SEM_LIMIT,
            "at {t} ms these holders all held an acknowledged, unexpired, unreleased lease: {holding:?} \
             (limit {SEM_LIMIT}); their leases: {:?}",
            holding.iter().map(|h| (h, &views[*h].certain)).collect::<Vec<_>>()
        );
    }
    // "Full" only when enough others may have held a lease then.
    let full =
        |c: &&SemCall| !c.replay && c.t.s >= since && c.t.done().is_some_and(|o| o.result == SemaphoreResult::Full);
    for c in history.iter().filter(full) {
        let others: Vec<usize> = (0..holders)
            .filter(|&h| h != c.holder && views[h].possible.iter().any(|&(a, e)| a <= c.t.r && e >= c.t.s))
            .collect();
        check!(
            ctx,
            round,
            others.len() as i64 >= SEM_LIMIT,
            "{} was told full, but only {others:?} may have held a lease then",
            c.show()
        );
    }
    // What Redis holds now.
    let key = keys::semaphore(SEM_POLICY, SEM_NAME);
    let members: Vec<(String, i64)> =
        redis::cmd("ZRANGE").arg(&key).arg(0).arg(-1).arg("WITHSCORES").query(&mut env.conn()).unwrap();
    let now = env.server_ms();
    let live: BTreeMap<usize, i64> = members
        .iter()
        .filter(|(_, end)| *end > now)
        .map(|(m, end)| (m.trim_start_matches('h').parse().unwrap(), *end))
        .collect();
    check!(ctx, round, live.len() as i64 <= SEM_LIMIT, "Redis holds {live:?} at {now}, more than {SEM_LIMIT}");
    for (&h, &end) in &live {
        check!(
            ctx,
            round,
            views[h].possible.iter().any(|&(a, e)| a <= now && end <= e + SLACK),
            "Redis holds a lease of h{h} until {end} that no call may have granted (possible: {:?}); its calls:\n{}",
            views[h].possible,
            history.iter().filter(|c| c.holder == h).map(SemCall::show).collect::<Vec<_>>().join("\n")
        );
    }
    for (h, v) in views.iter().enumerate() {
        if let Some(&(a, e)) = v.certain.iter().find(|&&(a, e)| a <= now && now + SLACK < e) {
            check!(
                ctx,
                round,
                live.get(&h).is_some_and(|&end| end + SLACK >= e),
                "h{h} holds an acknowledged lease over [{a}, {e}), Redis at {now} has {:?}",
                live.get(&h)
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn semaphore_never_has_more_holders_than_its_limit() {
    let (mut env, rounds) = Env::start("semaphore_never_has_more_holders_than_its_limit").await;
    let mut clients = env.clients(30).await;
    let keyed = Arc::new(Mutex::new(Vec::new()));
    let mut history = Vec::new();
    for round in 0..rounds {
        let k = keyed.clone();
        let since = now_ms();
        let calls = env.round(round, &mut clients, 80, move |c| semaphore_round(c, k.clone())).await;
        env.fail_closed(round, calls.iter().map(|c| (&c.t, c.show())));
        history.extend(calls);
        check_semaphore(&env, round, since, &history);
    }
    let count = |r: SemaphoreResult| history.iter().filter(|c| c.t.done().is_some_and(|o| o.result == r)).count();
    env.ctx.say(format!(
        "{} calls ({}): {} acquired, {} full, {} released",
        history.len(),
        tally(history.iter().map(|c| &c.t.out)),
        count(SemaphoreResult::Acquired),
        count(SemaphoreResult::Full),
        count(SemaphoreResult::Released)
    ));
}

// ---------------------------------------------------------------------------------------------
// Inbox: every acknowledged message kept until trimmed by age or length; ids distinct, in order

const INBOX_TTL: i64 = 86_400_000;
const INBOX_LEN: i64 = 6;
const INBOX_AGE: i64 = 1;
/// The shorter length some RESP trims keep.
const INBOX_SHORT: i64 = 4;
const USERS: [&str; 2] = ["u1", "u2"];

#[derive(Debug, Clone)]
enum InboxOp {
    Append { id: i64, body: String },
    Read { after: Option<i64> },
    Trim { max_age: i64, max_len: i64 },
}

#[derive(Debug, Clone)]
enum InboxAnswer {
    Appended(Appended),
    Read(Vec<Message>),
    Trimmed(Trimmed),
}

#[derive(Debug, Clone)]
struct InboxCall {
    user: usize,
    op: InboxOp,
    via: &'static str,
    t: Timed<InboxAnswer>,
}

impl InboxCall {
    fn show(&self) -> String {
        let answer = match &self.t.out {
            Outcome::Done(InboxAnswer::Read(m)) => format!("read ids {:?}", m.iter().map(|m| m.id).collect::<Vec<_>>()),
            other => format!("{other:?}"),
        };
        format!("{} {:?} {} [{}, {}] {answer}", USERS[self.user], self.op, self.via, self.t.s, self.t.r)
    }

    /// An append that stored its message (answered so), or may have (unanswered).
    fn stored(&self) -> Option<(i64, &str)> {
        let InboxOp::Append { id, body } = &self.op else { return None };
        match &self.t.out {
            Outcome::Done(InboxAnswer::Appended(a)) if a.stored => Some((*id, body)),
            Outcome::Unknown(_) => Some((*id, body)),
            _ => None,
        }
    }
}

fn inbox_parse_read(st: u16, v: &Value) -> Option<InboxAnswer> {
    let list = v["messages"].as_array()?;
    let mut out = Vec::new();
    for m in list {
        out.push(Message {
            id: int(m, "id")?,
            time: u32::try_from(m["time"].as_u64()?).ok()?,
            body: m["body"].as_str()?.as_bytes().to_vec(),
        });
    }
    (st == 200).then_some(InboxAnswer::Read(out))
}

async fn inbox_round(
    mut c: Client,
    next_id: Arc<AtomicI64>,
    sent: Arc<Mutex<Vec<(usize, i64, String)>>>,
) -> (Client, Vec<InboxCall>) {
    let mut out = Vec::new();
    for _ in 0..OPS {
        c.pause().await;
        if c.rng.percent(8) {
            c.replay().await;
            continue;
        }
        let user = c.rng.index(USERS.len());
        let u = USERS[user];
        let pick = c.rng.below(100);
        let op = if pick < 45 {
            let id = next_id.fetch_add(1 + c.rng.below(3) as i64, Ordering::SeqCst);
            let body = match c.rng.below(4) {
                0 => "the same body".to_string(), // equal bodies are distinct messages
                1 => format!("ünï \"côdé\" {id}"),
                _ => format!("m{id}"),
            };
            sent.lock().unwrap().push((user, id, body.clone()));
            InboxOp::Append { id, body }
        } else if pick < 60 {
            // Again, an id sent before to this inbox: idempotent while it is there; now and
            // then with another body (the first stored body stays).
            let before: Vec<(i64, String)> =
                sent.lock().unwrap().iter().filter(|s| s.0 == user).map(|s| (s.1, s.2.clone())).collect();
            if before.is_empty() {
                continue;
            }
            let (id, body) = before[c.rng.index(before.len())].clone();
            InboxOp::Append { id, body: if c.rng.percent(25) { format!("other {id}") } else { body } }
        } else if pick < 88 {
            let after = if c.rng.percent(25) { Some(c.rng.range(0, next_id.load(Ordering::SeqCst))) } else { None };
            InboxOp::Read { after }
        } else {
            // The API trims with the policy; RESP callers may keep fewer.
            InboxOp::Trim { max_age: INBOX_AGE, max_len: if c.rng.percent(50) { INBOX_LEN } else { INBOX_SHORT } }
        };
        let http = c.http() && !matches!(op, InboxOp::Trim { max_len: INBOX_SHORT, .. });
        let t = match (&op, http) {
            (InboxOp::Append { id, body }, true) => {
                let path = format!("/api/inbox/{u}/messages");
                let other = json!({ "id": id, "body": format!("{body}!") }).to_string();
                let t = c.write(path, json!({ "id": id, "body": body }).to_string(), other).await;
                c.decode(t, "POST inbox message", |st, v| {
                    let a = Appended { stored: v["stored"].as_bool()?, length: int(v, "length")? };
                    (st == if a.stored { 201 } else { 200 }).then_some(InboxAnswer::Appended(a))
                })
            }
            (InboxOp::Append { id, body }, false) => {
                let op = Append::new(u, *id, body, INBOX_TTL, INBOX_LEN).unwrap();
                let (t, retried) = c.run_retried(&op).await; // an append of an id is idempotent
                let out = match t.out {
                    // "Already there" after an unanswered attempt: maybe stored by that attempt.
                    Outcome::Done(a) if retried && !a.stored => {
                        Outcome::Unknown("stored by an earlier attempt?".into())
                    }
                    other => map_outcome(other, InboxAnswer::Appended),
                };
                Timed { s: t.s, last: t.last, r: t.r, out }
            }
            (InboxOp::Read { after }, true) => {
                let q = after.map(|a| format!("&after={a}")).unwrap_or_default();
                let t = c.api.call("GET", &format!("/api/inbox/{u}/messages?limit=1000{q}"), "", None, true).await;
                c.decode(t, "GET inbox", inbox_parse_read)
            }
            (InboxOp::Read { after }, false) => {
                let t = c.run(&Read::new(u, *after, 1000).unwrap()).await;
                Timed { s: t.s, last: t.last, r: t.r, out: map_outcome(t.out, InboxAnswer::Read) }
            }
            (InboxOp::Trim { .. }, true) => {
                let t = c.write(format!("/api/inbox/{u}/trim"), String::new(), "{}".into()).await;
                c.decode(t, "POST inbox trim", |st, v| {
                    (st == 200).then_some(InboxAnswer::Trimmed(Trimmed {
                        deleted: int(v, "deleted")?,
                        newest_time: v["newest_time"].as_i64(),
                    }))
                })
            }
            (InboxOp::Trim { max_age, max_len }, false) => {
                let t = c.run(&Trim::new(u, *max_age, *max_len, 1000).unwrap()).await;
                Timed { s: t.s, last: t.last, r: t.r, out: map_outcome(t.out, InboxAnswer::Trimmed) }
            }
        };
        let call = InboxCall { user, op, via: if http { "http" } else { "resp" }, t };
        match call.t.done() {
            Some(InboxAnswer::Appended(a)) if !(1..=INBOX_LEN).contains(&a.length) => {
                c.fail(format!("{}: length outside 1..={INBOX_LEN}", call.show()))
            }
            Some(InboxAnswer::Read(m)) => {
                if let Err(e) = read_in_order(&call.op, m) {
                    c.fail(format!("{}: {e}", call.show()))
                }
            }
            Some(InboxAnswer::Trimmed(t)) if t.deleted < 0 => c.fail(format!("{}: deleted < 0", call.show())),
            _ => {}
        }
        out.push(call);
    }
    (c, out)
}

fn map_outcome<T, U>(o: Outcome<T>, f: impl FnOnce(T) -> U) -> Outcome<U> {
    match o {
        Outcome::Done(t) => Outcome::Done(f(t)),
        Outcome::Refused => Outcome::Refused,
        Outcome::Unknown(e) => Outcome::Unknown(e),
    }
}

/// A read on its own: ids strictly increasing, after `after`, at most the length kept.
fn read_in_order(op: &InboxOp, msgs: &[Message]) -> Result<(), String> {
    let InboxOp::Read { after } = op else { return Ok(()) };
    let ids: Vec<i64> = msgs.iter().map(|m| m.id).collect();
    if ids.windows(2).any(|w| w[0] >= w[1]) {
        return Err(format!("ids out of order or repeated: {ids:?}"));
    }
    if after.is_some_and(|a| ids.first().is_some_and(|&f| f <= a)) {
        return Err(format!("ids {ids:?} not all after {after:?}"));
    }
    if ids.len() as i64 > INBOX_LEN {
        return Err(format!("{} messages kept, more than {INBOX_LEN}", ids.len()));
    }
    Ok(())
}

fn check_inbox(ctx: &Ctx, round: usize, since: i64, history: &[InboxCall]) {
    for (user, u) in USERS.iter().enumerate() {
        let calls: Vec<&InboxCall> = history.iter().filter(|c| c.user == user).collect();
        let trims: Vec<(i64, i64, i64)> = calls
            .iter()
            .filter(|c| c.t.maybe())
            .filter_map(|c| match c.op {
                InboxOp::Trim { max_age, .. } => Some((c.t.s, c.t.r, max_age)),
                _ => None,
            })
            .collect();
        for c in calls.iter().filter(|c| c.t.s >= since) {
            let until = c.t.r;
            // Whether a message, stored by a call that started at `from`, may have been dropped
            // by the time `c` ended: by length (as many higher ids may have been stored as the
            // shortest length kept) or by age (a trim late enough for its stamp).
            let ids_by_then: BTreeSet<i64> =
                calls.iter().filter(|e| e.t.s <= until).filter_map(|e| e.stored()).map(|(i, _)| i).collect();
            let latest_cutoff = trims.iter().filter(|t| t.0 <= until).map(|&(_, r, age)| r / 1000 - age).max();
            let maybe_dropped = |id: i64, from: i64| {
                ids_by_then.range(id + 1..).nth(INBOX_SHORT as usize - 1).is_some()
                    || latest_cutoff.is_some_and(|cut| from / 1000 < cut)
            };
            match (&c.op, c.t.done()) {
                (InboxOp::Append { id, .. }, Some(InboxAnswer::Appended(a))) => {
                    let stores = |e: &&&InboxCall| !std::ptr::eq(**e, *c) && e.stored().is_some_and(|(i, _)| i == *id);
                    if a.stored {
                        // Stored again while it certainly was there: an acknowledged message lost.
                        let held = calls
                            .iter()
                            .filter(stores)
                            .find(|e| e.t.done().is_some() && e.t.r < c.t.s && !maybe_dropped(*id, e.t.s));
                        if let Some(e) = held {
                            ctx.fail(round, format!("{u}: id {id} stored twice:\n  {}\n  {}", e.show(), c.show()));
                        }
                    } else {
                        check!(
                            ctx,
                            round,
                            calls.iter().filter(stores).any(|e| e.t.s <= until),
                            "{u}: told id {id} is there, but no call stored it: {}",
                            c.show()
                        );
                    }
                }
                (InboxOp::Read { after }, Some(InboxAnswer::Read(msgs))) => {
                    // Every message is one someone stored: its id, its body, its time.
                    for m in msgs {
                        let ok = calls.iter().filter(|e| e.t.s <= until).any(|e| {
                            e.stored().is_some_and(|(i, b)| i == m.id && b.as_bytes() == m.body)
                                && e.t.s / 1000 <= i64::from(m.time)
                                && i64::from(m.time) <= e.t.r / 1000
                        });
                        check!(
                            ctx,
                            round,
                            ok,
                            "{u}: message {} ({:?}, time {}) matches no append: {}",
                            m.id,
                            String::from_utf8_lossy(&m.body),
                            m.time,
                            c.show()
                        );
                    }
                    // Every acknowledged message is there, unless it may have been trimmed.
                    let ids: BTreeSet<i64> = msgs.iter().map(|m| m.id).collect();
                    for e in calls.iter().filter(|e| e.t.done().is_some() && e.t.r < c.t.s) {
                        let Some((id, _)) = e.stored() else { continue };
                        if after.is_some_and(|a| id <= a) || ids.contains(&id) || maybe_dropped(id, e.t.s) {
                            continue;
                        }
                        ctx.fail(
                            round,
                            format!("{u}: acknowledged message {id} is missing:\n  {}\n  {}", e.show(), c.show()),
                        );
                    }
                }
                _ => {}
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn inbox_keeps_every_acknowledged_message_until_trimmed() {
    let (mut env, rounds) = Env::start("inbox_keeps_every_acknowledged_message_until_trimmed").await;
    let mut clients = env.clients(100).await;
    let next_id = Arc::new(AtomicI64::new(1));
    let sent = Arc::new(Mutex::new(Vec::new()));
    let mut history = Vec::new();
    for round in 0..rounds {
        let since = now_ms();
        let (n, s) = (next_id.clone(), sent.clone());
        let calls = env.round(round, &mut clients, 250, move |c| inbox_round(c, n.clone(), s.clone())).await;
        let writes = calls.iter().filter(|c| !matches!(c.op, InboxOp::Read { .. }));
        env.fail_closed(round, writes.map(|c| (&c.t, c.show())));
        history.extend(calls);
        // And a read of every inbox between rounds, checked like any other.
        for (user, u) in USERS.iter().enumerate() {
            let op = InboxOp::Read { after: None };
            let t = env.read(round, &Read::new(u, None, 1000).unwrap()).await;
            let call = InboxCall {
                user,
                op,
                via: "check",
                t: Timed { s: t.s, last: t.last, r: t.r, out: map_outcome(t.out, InboxAnswer::Read) },
            };
            if let Some(InboxAnswer::Read(m)) = call.t.done()
                && let Err(e) = read_in_order(&call.op, m)
            {
                env.ctx.fail(round, format!("{}: {e}", call.show()));
            }
            history.push(call);
        }
        check_inbox(&env.ctx, round, since, &history);
    }
    let count = |f: fn(&InboxCall) -> bool| history.iter().filter(|c| f(c)).count();
    env.ctx.say(format!(
        "{} calls ({}): {} stored, {} trims that deleted",
        history.len(),
        tally(history.iter().map(|c| &c.t.out)),
        count(|c| matches!(c.t.done(), Some(InboxAnswer::Appended(a)) if a.stored)),
        count(|c| matches!(c.t.done(), Some(InboxAnswer::Trimmed(t)) if t.deleted > 0))
    ));
}

// ---------------------------------------------------------------------------------------------
// Red packets: each user wins at most once, shares positive, never over-issued, exact when empty

const PACKET_TTL: i64 = 3_600_000;
const RP_USERS: usize = 16;

/// A claimed share: (amount, index).
type Share = (i64, i64);

#[derive(Debug, Clone)]
struct Packet {
    id: String,
    total: i64,
    count: i64,
}

#[derive(Debug, Clone)]
enum RpOp {
    Grab { packet: usize, user: usize },
    ReadStatus { packet: usize },
    ReadGrabs { packet: usize },
    Create { total: i64, count: i64 },
}

#[derive(Debug, Clone)]
enum RpAnswer {
    Grab(GrabOutcome),
    ReadStatus(Option<PacketStatus>),
    ReadGrabs(Vec<GrabRecord>),
    Created(String),
}

#[derive(Debug, Clone)]
struct RpCall {
    op: RpOp,
    via: &'static str,
    t: Timed<RpAnswer>,
}

impl RpCall {
    fn show(&self) -> String {
        format!("{:?} {} [{}, {}] {:?}", self.op, self.via, self.t.s, self.t.r, self.t.out)
    }

    /// The (packet, user) of a grab, and its claim if it was answered with one.
    fn grab(&self) -> Option<(usize, usize, Option<Share>)> {
        let RpOp::Grab { packet, user } = self.op else { return None };
        let claim = match self.t.done() {
            Some(RpAnswer::Grab(GrabOutcome::Won { amount, index, .. } | GrabOutcome::Already { amount, index })) => {
                Some((*amount, *index))
            }
            _ => None,
        };
        Some((packet, user, claim))
    }
}

/// A page of claims on its own: in order from 1, one per user, positive, within the total.
fn claims_in_order(p: &Packet, list: &[GrabRecord]) -> Result<(), String> {
    let users: BTreeSet<&str> = list.iter().map(|c| c.user.as_str()).collect();
    let sum: i64 = list.iter().map(|c| c.amount).sum();
    let n = list.len() as i64;
    if list.iter().enumerate().any(|(i, c)| c.index != i as i64 + 1 || c.amount < 1) || users.len() != list.len() {
        return Err(format!("claims out of order, repeated or not positive: {list:?}"));
    }
    if n > p.count || sum > p.total || (n == p.count && sum != p.total) {
        return Err(format!("{n} claims of {} summing to {sum} of {}", p.count, p.total));
    }
    Ok(())
}

fn check_rp_answer(c: &Client, p: &Packet, call: &RpCall) {
    let bad = |why: &str| c.fail(format!("packet {p:?}: {}: {why}", call.show()));
    match call.t.done() {
        Some(RpAnswer::Grab(GrabOutcome::Won { amount, index, remaining }))
            if !(1..=p.total).contains(amount) || !(1..=p.count).contains(index) || index + remaining != p.count =>
        {
            bad("a share no packet gives")
        }
        Some(RpAnswer::Grab(GrabOutcome::Already { amount, index }))
            if !(1..=p.total).contains(amount) || !(1..=p.count).contains(index) =>
        {
            bad("a share no packet gives")
        }
        Some(RpAnswer::Grab(GrabOutcome::NotFound) | RpAnswer::ReadStatus(None)) => {
            bad("an acknowledged packet is gone")
        }
        Some(RpAnswer::ReadStatus(Some(st))) => {
            let ok = (st.total, st.count) == (p.total, p.count)
                && st.grabbed + st.remaining == st.count
                && st.grabbed <= st.grabbed_sum
                && st.grabbed_sum <= st.total
                && (st.remaining > 0 || st.grabbed_sum == st.total);
            if !ok {
                bad("an inconsistent status")
            }
        }
        Some(RpAnswer::ReadGrabs(list)) => {
            if let Err(e) = claims_in_order(p, list) {
                bad(&e)
            }
        }
        _ => {}
    }
}

fn grab_parse(st: u16, v: &Value) -> Option<RpAnswer> {
    Some(RpAnswer::Grab(match (st, v["outcome"].as_str()) {
        (200, Some("won")) => {
            GrabOutcome::Won { amount: int(v, "amount")?, index: int(v, "index")?, remaining: int(v, "remaining")? }
        }
        (200, Some("already")) => GrabOutcome::Already { amount: int(v, "amount")?, index: int(v, "index")? },
        (200, Some("empty")) => GrabOutcome::Empty,
        (404, _) => GrabOutcome::NotFound,
        _ => return None,
    }))
}

async fn rp_round(mut c: Client, packets: Arc<Mutex<Vec<Packet>>>, max_packets: usize) -> (Client, Vec<RpCall>) {
    let mut out = Vec::new();
    for _ in 0..OPS {
        c.pause().await;
        if c.rng.percent(5) {
            c.replay().await; // replays of keyed creates
            continue;
        }
        let known = packets.lock().unwrap().clone();
        // Mostly the newer half: older packets are often empty already.
        let packet = if c.rng.percent(70) {
            known.len() / 2 + c.rng.index(known.len() - known.len() / 2)
        } else {
            c.rng.index(known.len())
        };
        let p = &known[packet];
        let pick = c.rng.below(100);
        let op = if pick < 8 && known.len() < max_packets {
            let count = c.rng.range(1, 15);
            RpOp::Create { total: c.rng.range(count, 5_000), count }
        } else if pick < 80 {
            RpOp::Grab { packet, user: c.rng.index(RP_USERS) }
        } else if pick < 92 {
            RpOp::ReadStatus { packet }
        } else {
            RpOp::ReadGrabs { packet }
        };
        let http = c.http();
        let t = match (&op, http) {
            (RpOp::Create { total, count }, true) => {
                let body = json!({ "total_cents": total, "count": count }).to_string();
                let other = json!({ "total_cents": total + 1, "count": count }).to_string();
                let t = c.write("/api/redpackets".into(), body, other).await;
                c.decode(t, "POST redpackets", |st, v| {
                    (st == 201).then_some(RpAnswer::Created(v["id"].as_str()?.to_string()))
                })
            }
            (RpOp::Create { total, count }, false) => {
                let id = redpacket::new_id(&mut c.rng);
                let op = Create::new(&id, *total, *count, 1, PACKET_TTL, &mut c.rng).unwrap();
                let (t, retried) = c.run_retried(&op).await;
                let out = match t.out {
                    // Created, or found made by an unanswered attempt of this very call.
                    Outcome::Done(made) if made.created || retried => Outcome::Done(RpAnswer::Created(id.clone())),
                    Outcome::Done(made) => c.fail(format!("a fresh random packet id {id} exists already: {made:?}")),
                    other => map_outcome(other, |_| unreachable!()),
                };
                Timed { s: t.s, last: t.last, r: t.r, out }
            }
            (RpOp::Grab { user, .. }, true) => {
                let body = json!({ "user": format!("u{user}") }).to_string();
                // A grab is idempotent per user: sent again while its outcome is unknown.
                let t = c.api.call("POST", &format!("/api/redpackets/{}/grab", p.id), &body, None, true).await;
                c.decode(t, "POST grab", grab_parse)
            }
            (RpOp::Grab { user, .. }, false) => {
                let (t, _) = c.run_retried(&Grab::new(&p.id, &format!("u{user}")).unwrap()).await;
                Timed { s: t.s, last: t.last, r: t.r, out: map_outcome(t.out, RpAnswer::Grab) }
            }
            (RpOp::ReadStatus { .. }, true) => {
                let t = c.api.call("GET", &format!("/api/redpackets/{}", p.id), "", None, true).await;
                c.decode(t, "GET redpacket", |st, v| match st {
                    404 => Some(RpAnswer::ReadStatus(None)),
                    200 => Some(RpAnswer::ReadStatus(Some(PacketStatus {
                        total: int(v, "total_cents")?,
                        count: int(v, "count")?,
                        remaining: int(v, "remaining")?,
                        grabbed: int(v, "claimed")?,
                        grabbed_sum: int(v, "claimed_cents")?,
                        created_ms: int(v, "created_ms")?,
                        expires_ms: int(v, "expires_ms")?,
                    }))),
                    _ => None,
                })
            }
            (RpOp::ReadStatus { .. }, false) => {
                let t = c.run(&ReadStatus::new(&p.id).unwrap()).await;
                Timed { s: t.s, last: t.last, r: t.r, out: map_outcome(t.out, RpAnswer::ReadStatus) }
            }
            (RpOp::ReadGrabs { .. }, true) => {
                let t = c.api.call("GET", &format!("/api/redpackets/{}/claims?limit=1000", p.id), "", None, true).await;
                c.decode(t, "GET claims", |st, v| {
                    let mut list = Vec::new();
                    for x in v["claims"].as_array()? {
                        list.push(GrabRecord {
                            user: x["user"].as_str()?.to_string(),
                            amount: int(x, "amount")?,
                            index: int(x, "index")?,
                            at_ms: int(x, "at_ms")?,
                        });
                    }
                    (st == 200).then_some(RpAnswer::ReadGrabs(list))
                })
            }
            (RpOp::ReadGrabs { .. }, false) => {
                let t = c.run(&ReadGrabs::new(&p.id, 0, 1000).unwrap()).await;
                Timed { s: t.s, last: t.last, r: t.r, out: map_outcome(t.out, RpAnswer::ReadGrabs) }
            }
        };
        let call = RpCall { op, via: if http { "http" } else { "resp" }, t };
        if let (RpOp::Create { total, count }, Some(RpAnswer::Created(id))) = (&call.op, call.t.done()) {
            packets.lock().unwrap().push(Packet { id: id.clone(), total: *total, count: *count });
        } else {
            check_rp_answer(&c, p, &call);
        }
        out.push(call);
    }
    (c, out)
}

fn check_packets(env: &Env, round: usize, since: i64, packets: &[Packet], history: &[RpCall]) {
    let ctx = &env.ctx;
    let mut conn = env.conn();
    for (n, p) in packets.iter().enumerate() {
        let grabs: Vec<(&RpCall, usize, Option<Share>)> = history
            .iter()
            .filter_map(|c| c.grab().filter(|g| g.0 == n).map(|(_, user, claim)| (c, user, claim)))
            .collect();
        // What each user was told: one claim, the same every time; won once at most.
        let mut told: BTreeMap<usize, (i64, i64, &RpCall)> = BTreeMap::new();
        let mut wins: BTreeMap<usize, Vec<&RpCall>> = BTreeMap::new();
        for &(c, user, claim) in &grabs {
            let Some((amount, index)) = claim else { continue };
            if let Some(&(a, i, first)) = told.get(&user) {
                check!(
                    ctx,
                    round,
                    (a, i) == (amount, index),
                    "packet {}: u{user} was told two claims:\n  {}\n  {}",
                    p.id,
                    first.show(),
                    c.show()
                );
            }
            told.entry(user).or_insert((amount, index, c));
            if matches!(c.t.done(), Some(RpAnswer::Grab(GrabOutcome::Won { .. }))) {
                wins.entry(user).or_default().push(c);
            }
        }
        for (user, w) in &wins {
            check!(
                ctx,
                round,
                w.len() == 1,
                "packet {}: u{user} won {} times: {:?}",
                p.id,
                w.len(),
                w.iter().map(|c| c.show()).collect::<Vec<_>>()
            );
        }
        let indexes: BTreeSet<i64> = told.values().map(|t| t.1).collect();
        check!(ctx, round, indexes.len() == told.len(), "packet {}: one share told to two users: {told:?}", p.id);
        // Empty only once every share may have gone to someone.
        let empty = |g: &&(&RpCall, usize, Option<Share>)| {
            g.0.t.s >= since && matches!(g.0.t.done(), Some(RpAnswer::Grab(GrabOutcome::Empty)))
        };
        for &(c, _, _) in grabs.iter().filter(empty) {
            let takers: BTreeSet<usize> = grabs
                .iter()
                .filter(|(g, _, claim)| g.t.s <= c.t.r && (claim.is_some() || g.t.unknown()))
                .map(|g| g.1)
                .collect();
            check!(
                ctx,
                round,
                takers.len() as i64 >= p.count,
                "packet {} ({} shares): {} was told empty, but only {takers:?} may hold a share",
                p.id,
                p.count,
                c.show()
            );
        }
        // A status or a claim list sees every claim acknowledged before it, and none nobody made.
        for c in history.iter().filter(|c| c.t.s >= since) {
            let (RpOp::ReadStatus { packet } | RpOp::ReadGrabs { packet }) = c.op else { continue };
            if packet != n {
                continue;
            }
            let before: BTreeMap<usize, (i64, i64)> =
                told.iter().filter(|(_, (_, _, g))| g.t.r < c.t.s).map(|(u, (a, i, _))| (*u, (*a, *i))).collect();
            let maybe: BTreeSet<usize> =
                grabs.iter().filter(|(g, _, _)| g.t.s <= c.t.r && g.t.maybe()).map(|g| g.1).collect();
            let ok = match c.t.done() {
                Some(RpAnswer::ReadStatus(Some(st))) => {
                    before.len() as i64 <= st.grabbed && st.grabbed <= maybe.len() as i64
                }
                Some(RpAnswer::ReadGrabs(list)) => {
                    let seen: BTreeMap<usize, (i64, i64)> = list
                        .iter()
                        .map(|r| (r.user.trim_start_matches('u').parse().unwrap(), (r.amount, r.index)))
                        .collect();
                    before.iter().all(|(u, claim)| seen.get(u) == Some(claim)) && seen.keys().all(|u| maybe.contains(u))
                }
                _ => true,
            };
            check!(
                ctx,
                round,
                ok,
                "packet {}: {} against the claims acknowledged before it {before:?} and the users who may \
                 hold one {maybe:?}",
                p.id,
                c.show()
            );
        }
        // What Redis holds.
        let [meta, shares, claims, log] = keys::redpacket(&p.id);
        let meta: BTreeMap<String, i64> = redis::cmd("HGETALL").arg(&meta).query(&mut conn).unwrap();
        let shares: Vec<i64> = redis::cmd("LRANGE").arg(&shares).arg(0).arg(-1).query(&mut conn).unwrap();
        let by_user: BTreeMap<String, String> = redis::cmd("HGETALL").arg(&claims).query(&mut conn).unwrap();
        let log: Vec<String> = redis::cmd("LRANGE").arg(&log).arg(0).arg(-1).query(&mut conn).unwrap();
        let records: Vec<GrabRecord> = log
            .iter()
            .map(|l| {
                let f: Vec<&str> = l.split(':').collect();
                GrabRecord {
                    user: f[0].to_string(),
                    amount: f[1].parse().unwrap(),
                    index: f[2].parse().unwrap(),
                    at_ms: f[3].parse().unwrap(),
                }
            })
            .collect();
        if let Err(e) = claims_in_order(p, &records) {
            ctx.fail(round, format!("packet {}: the claim log: {e}", p.id));
        }
        let claimed: i64 = records.iter().map(|c| c.amount).sum();
        let left: i64 = shares.iter().sum();
        let from_log: BTreeMap<String, String> =
            records.iter().map(|c| (c.user.clone(), format!("{}:{}", c.amount, c.index))).collect();
        check!(ctx, round, by_user == from_log, "packet {}: claims {by_user:?} differ from the log {log:?}", p.id);
        check!(
            ctx,
            round,
            meta.get("total") == Some(&p.total)
                && meta.get("count") == Some(&p.count)
                && meta.get("grabbed_n") == Some(&(records.len() as i64))
                && meta.get("grabbed_sum") == Some(&claimed),
            "packet {} {p:?}: meta {meta:?} against {} claims summing to {claimed}",
            p.id,
            records.len()
        );
        check!(
            ctx,
            round,
            shares.iter().all(|&s| s >= 1)
                && shares.len() + records.len() == p.count as usize
                && left + claimed == p.total,
            "packet {} {p:?}: shares left {shares:?} and claimed {claimed} in {} claims do not make the packet",
            p.id,
            records.len()
        );
        for (user, (amount, index, c)) in &told {
            check!(
                ctx,
                round,
                from_log.get(&format!("u{user}")) == Some(&format!("{amount}:{index}")),
                "packet {}: the acknowledged claim of u{user} is not in Redis ({:?}): {}",
                p.id,
                from_log.get(&format!("u{user}")),
                c.show()
            );
        }
        for r in &records {
            let user: usize = r.user.trim_start_matches('u').parse().unwrap();
            check!(
                ctx,
                round,
                grabs.iter().any(|(g, u, _)| *u == user && g.t.maybe()),
                "packet {}: Redis holds a claim of {} that no grab made: {r:?}",
                p.id,
                r.user
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redpacket_never_over_issues_and_each_user_wins_once() {
    let (mut env, rounds) = Env::start("redpacket_never_over_issues_and_each_user_wins_once").await;
    let mut clients = env.clients(8).await;
    let mut rng = Rng::new(env.ctx.seed, "redpacket/setup");
    let mut first = Vec::new();
    for _ in 0..2 {
        let id = redpacket::new_id(&mut rng);
        let (total, count) = (rng.range(10, 3_000), rng.range(1, 10));
        let op = Create::new(&id, total, count, 1, PACKET_TTL, &mut rng).unwrap();
        assert!(matches!(env.read(0, &op).await.out, Outcome::Done(c) if c.created));
        first.push(Packet { id, total, count });
    }
    let packets = Arc::new(Mutex::new(first));
    let max_packets = (steps() / 16).max(10); // new packets all along a long run
    let mut history = Vec::new();
    for round in 0..rounds {
        let p = packets.clone();
        let since = now_ms();
        let calls = env.round(round, &mut clients, 40, move |c| rp_round(c, p.clone(), max_packets)).await;
        let writes = calls.iter().filter(|c| matches!(c.op, RpOp::Grab { .. } | RpOp::Create { .. }));
        env.fail_closed(round, writes.map(|c| (&c.t, c.show())));
        history.extend(calls);
        let known = packets.lock().unwrap().clone();
        check_packets(&env, round, since, &known, &history);
    }
    let known = packets.lock().unwrap().clone();
    let won = history.iter().filter(|c| matches!(c.t.done(), Some(RpAnswer::Grab(GrabOutcome::Won { .. })))).count();
    let empty = history.iter().filter(|c| matches!(c.t.done(), Some(RpAnswer::Grab(GrabOutcome::Empty)))).count();
    env.ctx.say(format!(
        "{} packets, {} calls ({}): {won} won, {empty} empty",
        known.len(),
        history.len(),
        tally(history.iter().map(|c| &c.t.out))
    ));
}

// ---------------------------------------------------------------------------------------------
// What the model tests have caught

/// Seen by `counter_value_is_the_sum_of_what_was_applied` (seeds 80727275027 round 0 and
/// 80738944972 round 5): a RESP call answered "applied 2" had added 4.
/// redis-rs reports a reply lost after the command was sent as "broken pipe", the same error
/// as a command that never left, and `Direct::send` sent such a command again.
#[tokio::test]
async fn a_write_whose_reply_was_lost_is_not_applied_twice() {
    let redis = RedisServer::start();
    let (port, armed) = redcount_tests::reply_losing_proxy(redis.port()).await;
    let d = Direct::connect_with(&format!("redis://127.0.0.1:{port}/"), Duration::from_secs(2)).await.unwrap();
    let bounds = Bounds::default();
    let add = AddCounter::new("lost", "reply", Storage::Key, 1, bounds).unwrap();
    // The script is loaded and the connection is up; the next reply is lost.
    d.run(&AddCounter::new("lost", "reply", Storage::Key, 0, bounds).unwrap()).await.unwrap();
    armed.store(true, Ordering::SeqCst);
    let got = d.run(&add).await;
    let stored = CounterSpec { policy: "lost", bounds, storage: Storage::Key }.stored(&mut redis.conn(), "reply");
    assert!(!armed.load(Ordering::SeqCst), "the proxy dropped a reply");
    assert_eq!(stored, 1, "one call, answered {got:?}, added {stored}: a write whose reply was lost was sent again");
    if let Ok(o) = got {
        assert_eq!(o.value, stored, "the answer tells the value stored");
    }
}

/// The same through `redcount-rest` (the worker's path), whose pooled connections also send a
/// "broken pipe" command once more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)] // the proxy runs while the front starts
async fn a_write_whose_reply_was_lost_is_not_applied_twice_through_the_front() {
    let redis = RedisServer::start();
    let (port, armed) = redcount_tests::reply_losing_proxy(redis.port()).await;
    let front = redcount_tests::RestFront::start(&format!("redis://127.0.0.1:{port}/"), false);
    let http = redcount_tests::http();
    let incr = |key: &'static str| {
        http.post(front.url())
            .bearer_auth(&front.token)
            .body(json!(["EVAL", "return redis.call('INCR', KEYS[1])", "1", key]).to_string())
            .send()
    };
    assert_eq!(incr("warm").await.unwrap().status().as_u16(), 200, "the front is up");
    armed.store(true, Ordering::SeqCst);
    let answer = match incr("lost").await {
        Ok(r) => format!("{} {}", r.status(), r.text().await.unwrap_or_default()),
        Err(e) => format!("no answer: {e}"),
    };
    let stored: i64 = redis::cmd("GET").arg("lost").query(&mut redis.conn()).unwrap();
    assert!(!armed.load(Ordering::SeqCst), "the proxy dropped a reply");
    assert_eq!(stored, 1, "one INCR, answered {answer}, applied {stored} times: sent again after its reply was lost");
}
