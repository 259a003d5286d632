//! Local decisions: what a shell keeps between calls so that most decisions need no Redis
//! round trip, exact where it counts.
//!
//! - **A denial cache.** A quota take or peek, or a compound decision, that Redis denied is
//!   repeated from memory (`"cached": true`, its `retry_after_ms` and `reset_ms` shrinking
//!   with the time passed) for at most the policy's `cache_denials_ms` and never past the
//!   denial's own `retry_after_ms`, keyed by the caller's scope, the subject (and a decision
//!   part's level), the policy, the cost and the policy's definition
//!   ([`Config::fingerprint`]). Nothing else is ever
//!   repeated: no admission, no peek that admits, nothing of counters, claims, red packets,
//!   inboxes or semaphores (a decision with a semaphore part is not repeated: its lease's
//!   state is live). A call with an `Idempotency-Key` always goes to Redis (its stored answer
//!   may be an admission). An admin override, refund or reset made through this shell drops
//!   the subject's entries at once; other shells may keep denying for at most
//!   `cache_denials_ms`.
//! - **Budget leases** (`"borrow": {"units": 50, "ms": 1000}`, fixed windows only). A take
//!   with no stock at hand borrows up to `units` more in the same script call, charged in
//!   Redis at once and recorded under a lease id (`lua/quota_lease.lua`); later takes are
//!   admitted from that stock until it is used, `ms` has passed or the window ends, whichever
//!   is first; then [`Local::due`] hands the shell the call giving back what was not used.
//!   Once a lease's stock is down to half of what it was lent, [`Local::due`] hands the shell
//!   a renewal to send in the background: a borrow of the next lease (charging no take), whose
//!   units are admitted from once the running lease is used up, so that in the steady state no
//!   take waits for Redis. The units are counted in Redis before any is used, so admissions
//!   never exceed the limit; what a shell holds (the running lease's last half and the next
//!   lease: at most 1.5 × `units`, 2 × after refunds put back into the running lease) is
//!   unavailable to the others for at most `ms` (until the window ends, for a shell that
//!   dies). One borrow per subject is in flight per shell; meanwhile a take of the subject
//!   that finds no stock is told to [`Wait`] for it. A refund through this shell (without an
//!   `Idempotency-Key`) of no more units than its running lease of the subject has admitted
//!   is put back into that lease, with no Redis call; any other goes to Redis.
//!
//! A request whose every byte was seen before (over HTTP, [`Local::handle`]) is looked up
//! before it is routed or parsed: the take it was, when the policy's definition and the admin
//! token are still the same, and only an answer from memory is made that way.
//!
//! The state is sans-IO like the rest of the API: the shell passes the time (ms, from a clock
//! that does not go back; one that does drops every entry and ends every lease) and does the
//! I/O the state asks for. Memory is bounded: both tables have a fixed number of slots (set
//! associative, least recently used out), so a flood of distinct subjects evicts, never grows.
//!
//! ```
//! use redcount_api::{ApiRequest, Config, Local, Step};
//!
//! let policies = r#"{"per-day": {"kind": "quota", "algorithm": "fixed", "limit": 1, "window_ms": 86400000}}"#;
//! let config = Config::from_env(|v| (v == "REDCOUNT_POLICIES").then(|| policies.to_string())).unwrap();
//! let mut local = Local::new(64, 16, 7);
//! let take = ApiRequest { method: "POST", path: "/api/quotas/per-day/alice", query: "", authorization: None, origin: None, idempotency_key: None, body: b"" };
//! // The first take goes to Redis, which denies it (nothing left until the window ends).
//! let Ok(Step::Send(ex)) = local.handle(&config, &take, 1_000, true, &mut rand::rng()) else { panic!() };
//! let denied = local.after(ex.receive(200, br#"{"result":[0,1,0,50000,50000]}"#), 1_010);
//! let Step::Respond(r) = denied else { panic!() };
//! assert_eq!(r.status, 200);
//! // 300 ms later the same take is answered from memory, its wait shorter by as much.
//! let Ok(Step::Respond(r)) = local.handle(&config, &take, 1_300, true, &mut rand::rng()) else { panic!() };
//! assert_eq!(r.body, r#"{"allowed":false,"cache_ms":700,"cached":true,"limit":1,"remaining":0,"reset_ms":49700,"retry_after_ms":49700}"#);
//! // Past cache_denials_ms (1000 by default) it asks Redis again.
//! assert!(matches!(local.handle(&config, &take, 2_001, true, &mut rand::rng()), Ok(Step::Send(_))));
//! ```

use alloc::borrow::ToOwned;
use alloc::boxed::Box;
use alloc::string::String;
use alloc::vec::Vec;
use rand_core::RngCore;

use crate::config::{Borrow, LocalMode};
use crate::{ApiRequest, ApiResponse, Caller, Config, Exchange, Input, Route, Step};
use redcount_core::keys::{Level, Namespace};
use redcount_core::ops::decision::{Decision, PartOutcome};
use redcount_core::ops::quota::{Algorithm, BorrowQuota, Borrowed, QuotaOutcome, ReturnQuota};

/// The answer of [`Local::handle`] and [`Local::call`] when a borrow for the same subject is
/// in flight in this shell: wait until the shell's next reply is settled (or a short while),
/// then ask again; a shell that has waited long enough asks with `may_wait` false and gets a
/// plain call to Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wait;

/// A shell's local state (see the module's documentation).
#[derive(Debug)]
pub struct Local {
    /// Mixed into every key's hash, so that nobody outside can aim keys at one set.
    seed: u64,
    /// The latest time the shell passed in.
    now: u64,
    denials: Table<Denial>,
    leases: Table<Lease>,
    /// Unused units of ended leases, waiting to be given back by [`Local::due`].
    returns: Vec<Return>,
    /// Renewals to send ([`Local::due`]): at most one per lease.
    renewals: Vec<Exchange>,
    /// Renewals handed to the shell and not answered yet.
    renewing: u64,
    /// Numbers the next lease id.
    leases_made: u64,
    /// Bumped by every override, refund and reset through this shell: a denial that Redis
    /// answered while one was under way is not kept.
    forgets: u64,
    /// Bumped by a new configuration or a clock that went back: what was asked before is not
    /// learnt.
    epoch: u64,
    /// After [`Local::drain`]: no more leases.
    closed: bool,
    /// Borrows answered (or failed) so far.
    settled: u64,
    /// The earliest end of a lease with stock (`u64::MAX`: none).
    next_due: u64,
    /// HTTP requests lately answered here, by their bytes ([`memo_key`]): the take or peek
    /// each was, so that the same request again is answered without being routed, parsed and
    /// made into a call first. (`None` while in use.)
    memo: Memo,
    /// The plan of the take or peek the last call answered here, for [`Local::handle`] to keep.
    hit: Option<Box<QuotaPlan>>,
    /// The last [`Local::handle`] repeated a denial and changed nothing else ([`Local::repeated`]).
    repeated: bool,
}

/// What a call teaches the local state, carried by its [`Exchange`] and then by its response
/// (see [`Local::after`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Plan {
    /// A quota take or peek.
    Quota(Box<QuotaPlan>),
    /// A compound decision.
    Decision(Box<DecisionPlan>),
    /// An admin override, refund or reset of one subject's policy, or a reservation's
    /// settle, extend or release (units given back): the subject's denials of those policies
    /// go, and its decisions'.
    Forget(Forgets),
    /// Learnt when sent (a return, or a call after the local state's time).
    Nothing,
}

/// The denials a [`Plan::Forget`] drops.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Forgets {
    /// Every key of the subject's quotas of those policies starts with one of these.
    prefixes: Vec<String>,
    /// Every decision key of the subject starts with this.
    decisions: String,
    /// For `TENANT/USER`: units given back to the tenant's own counter may admit any user of
    /// the tenant, so every user's tenant-level denials of those policies (keys starting with
    /// one of these, ending in the tenant mark) and every user's decisions (starting with the
    /// last) go too.
    tenant: Option<(Vec<String>, String)>,
    /// A refund without an `Idempotency-Key`: the subject's lease key and the units asked
    /// ([`Local::refund`]).
    /// (Boxed: every plan is as large as this one.)
    pub(crate) refund: Option<Box<(String, i64)>>,
}

/// The end of a tenant-level part's key (after the cost's digits, so never a policy's name).
const TENANT_MARK: &str = "\0t";

impl Plan {
    /// True for a borrow, or a refresh others may wait for.
    pub(crate) fn lends(&self) -> bool {
        matches!(self, Plan::Quota(p) if p.borrow.is_some() || p.refresh)
    }
}

/// [`Local::memo`]: its keys hold `Authorization` headers, so it never prints them.
struct Memo(Table<Option<Box<QuotaPlan>>>);

impl core::fmt::Debug for Memo {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "Memo({} requests)", self.0.len())
    }
}

/// The longest request [`Local::memo`] keeps.
const MEMO_KEY_MAX: usize = 512;

/// A request's every byte that its route, caller, input and CORS headers depend on, as the
/// key of [`Local::memo`]; `None` for one never kept (an `Idempotency-Key`, a body that is not
/// UTF-8, a long one).
fn memo_key(req: &ApiRequest<'_>) -> Option<String> {
    let body = core::str::from_utf8(req.body).ok()?;
    let parts = [Some(req.method), Some(req.path), Some(req.query), req.authorization, req.origin, Some(body)];
    let len: usize = parts.iter().map(|p| p.map_or(0, str::len) + 2).sum();
    // (A NUL inside a part could make two requests one key: none of an HTTP head has one.)
    if req.idempotency_key.is_some() || len > MEMO_KEY_MAX || parts[..5].iter().flatten().any(|p| p.contains('\0')) {
        return None;
    }
    let mut key = String::with_capacity(len);
    for p in parts {
        // `+text` or `-` (absent), each ended by a NUL.
        match p {
            Some(p) => {
                key.push('+');
                key.push_str(p);
            }
            None => key.push('-'),
        }
        key.push('\0');
    }
    Some(key)
}

/// A quota take or peek, as the local state sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct QuotaPlan {
    pub(crate) policy: String,
    pub(crate) subject: String,
    pub(crate) algorithm: Algorithm,
    pub(crate) cost: i64,
    pub(crate) peek: bool,
    pub(crate) mode: LocalMode,
    /// The policy's [`Config::fingerprint`].
    fp: u64,
    /// `scope \0 policy \0 subject \0 fingerprint`: the lease's key.
    lease_key: String,
    /// The lease key `\0 cost`: the denial's key.
    key: String,
    sent: Sent,
    /// A borrow: the lease's id and where its units live.
    borrow: Option<(String, Namespace)>,
    /// Sent to refresh a denial still repeated.
    refresh: bool,
    /// A renewal: a borrow of the next lease, no take (nothing to answer, nothing to cache).
    renew: bool,
}

/// A compound decision, as the local state sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DecisionPlan {
    /// Each part: its policy and algorithm (`None`: a lease) as the answer names them.
    pub(crate) kinds: Vec<(String, Option<Algorithm>)>,
    /// Each quota part's denial key and `cache_denials_ms` (`None` for a lease part).
    parts: Vec<Option<(String, u32)>>,
    pub(crate) peek: bool,
    /// The whole decision's key, when it may be repeated (no lease part).
    key: Option<String>,
    sent: Sent,
}

/// When and under which state a call was sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Sent {
    at: u64,
    forgets: u64,
    epoch: u64,
}

/// What a call's answer said, for the local state (set by the routes that decide).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Seen {
    Quota(QuotaOutcome),
    Borrowed(Borrowed),
    Decision(Decision),
}

#[derive(Debug)]
struct Denial {
    /// When the call that was denied was sent (its answer is at least this fresh).
    at: u64,
    /// Repeated until then: `at` + the least of `cache_denials_ms` and its `retry_after_ms`.
    until: u64,
    /// Since when a call refreshing it is under way.
    refreshing: Option<u64>,
    what: Denied,
}

#[derive(Debug)]
enum Denied {
    Quota(QuotaOutcome),
    Decision(Decision),
}

#[derive(Debug)]
struct Lease {
    /// The current lease's id (`None`: no lease, only a borrow in flight or one used up).
    id: Option<String>,
    /// Units left to admit from.
    stock: i64,
    /// Units the current lease was lent: its renewal is sent once `stock` is down to half.
    lent: i64,
    /// The current lease's renewal was sent (one per lease, answered or not).
    renewed: bool,
    /// The next lease, lent by a renewal while the current one still had stock: admitted from
    /// once the current one is used up or ended.
    next: Option<Box<Next>>,
    /// Admits until then (exclusive).
    until: u64,
    /// When its borrow was sent, and the take's answer then.
    at: u64,
    outcome: QuotaOutcome,
    /// Since when a borrow is in flight.
    borrowing: Option<u64>,
    /// The last lease, wholly used: the next borrow forgets its record in Redis.
    used_up: Option<String>,
    /// Where its units live, for giving them back.
    ns: Namespace,
    policy: String,
    subject: String,
}

/// A lease lent ahead of the current one ([`Lease::next`]).
#[derive(Debug)]
struct Next {
    id: String,
    stock: i64,
    lent: i64,
    until: u64,
    at: u64,
    outcome: QuotaOutcome,
}

impl Lease {
    /// Units at hand, in the current lease and the next.
    fn held(&self) -> i64 {
        self.stock + self.next.as_ref().map_or(0, |n| n.stock)
    }

    /// When the first of its leases with stock ends (`u64::MAX`: none).
    fn ends(&self) -> u64 {
        let next = self.next.as_ref().map_or(u64::MAX, |n| n.until);
        if self.stock > 0 || self.used_up.is_some() { self.until.min(next) } else { next }
    }

    /// Ends what has run out of time at `now` (its unused units to `returns`), and makes the
    /// next lease the current one when the current one has no stock left.
    fn expire(&mut self, now: u64, returns: &mut Vec<Return>) {
        if self.next.as_ref().is_some_and(|n| n.until <= now) {
            returns.extend(self.end_next());
        }
        if self.stock > 0 && self.until <= now {
            returns.extend(end(self));
        }
        if self.stock == 0
            && let Some(n) = self.next.take()
        {
            self.id = Some(n.id);
            self.stock = n.stock;
            self.lent = n.lent;
            self.until = n.until;
            self.at = n.at;
            self.outcome = n.outcome;
            self.renewed = false;
        }
        // A used-up lease no borrow has named by the end of the lease it left: its record goes
        // now, so that resets stop counting units all used.
        if self.until <= now {
            returns.extend(self.forget_used());
        }
    }

    /// Forgets the used-up lease's record in Redis (a return of 0 units).
    fn forget_used(&mut self) -> Option<Return> {
        let id = self.used_up.take()?;
        Some(Return { ns: self.ns.clone(), policy: self.policy.clone(), subject: self.subject.clone(), units: 0, id })
    }

    /// Ends the next lease: its units to give back.
    fn end_next(&mut self) -> Option<Return> {
        let n = self.next.take()?;
        (n.stock > 0).then(|| Return {
            ns: self.ns.clone(),
            policy: self.policy.clone(),
            subject: self.subject.clone(),
            units: n.stock,
            id: n.id,
        })
    }
}

/// Unused units to give back.
#[derive(Debug)]
struct Return {
    ns: Namespace,
    policy: String,
    subject: String,
    units: i64,
    id: String,
}

/// A shell clock that lags the true one by less than this cannot stretch a lease into the
/// next window.
const LEASE_GUARD_MS: u64 = 10;
/// A denial is refreshed (one call, while the others are still answered from memory) in the
/// last 1/`REFRESH_AT` of its life: late, so a flood costs little more than one call per
/// `cache_denials_ms`, yet with time left for the refresh's round trip.
const REFRESH_AT: u64 = 8;
/// Once a denial has ended, the takes of its subject wait for the refresh under way (for
/// this long at most) rather than all asking Redis at once.
const REFRESH_WAIT_MS: u64 = 1000;
/// A lease's renewal is sent once its stock is down to 1/`RENEW_AT` of what it was lent: early
/// enough that the next lease arrives before this one is used up, late enough that a shell
/// holds at most 1 + 1/`RENEW_AT` leases' worth.
const RENEW_AT: i64 = 2;

impl Local {
    /// A local state of `denials` cached denials and `leases` leases at most (each rounded up
    /// to a multiple of 4), its hashes keyed by `seed` (random: nobody outside may predict
    /// which subjects share a set).
    pub fn new(denials: usize, leases: usize, seed: u64) -> Local {
        Local {
            seed,
            now: 0,
            denials: Table::new(denials),
            leases: Table::new(leases),
            returns: Vec::new(),
            renewals: Vec::new(),
            renewing: 0,
            leases_made: 0,
            forgets: 0,
            epoch: 0,
            closed: false,
            settled: 0,
            next_due: u64::MAX,
            memo: Memo(Table::new(denials.div_ceil(4))),
            hit: None,
            repeated: false,
        }
    }

    /// [`crate::handle`] with this local state, at `now_ms`: an answer from memory, a call to
    /// make, or [`Wait`] (only when `may_wait`).
    pub fn handle<R: RngCore + ?Sized>(
        &mut self,
        config: &Config,
        req: &ApiRequest<'_>,
        now_ms: u64,
        may_wait: bool,
        rng: &mut R,
    ) -> Result<Step, Wait> {
        self.handle_as(config, req, &Caller::public(), now_ms, may_wait, rng)
    }

    /// [`Local::handle`] for a request through a Service binding whose props make `binding`
    /// ([`crate::rpc::caller`]): its scope is the request's, its admin rights are added to
    /// those of the request's token.
    pub fn handle_as<R: RngCore + ?Sized>(
        &mut self,
        config: &Config,
        req: &ApiRequest<'_>,
        binding: &Caller,
        now_ms: u64,
        may_wait: bool,
        rng: &mut R,
    ) -> Result<Step, Wait> {
        self.tick(now_ms);
        self.repeated = false;
        // (A binding's scope or rights are not in the request's bytes: its requests are not memoed.)
        let key = if *binding == Caller::public() { memo_key(req) } else { None };
        let hash = key.as_deref().map_or(0, |k| self.key_hash(k));
        if let Some(key) = &key
            && let Some(mut plan) = self.memo.0.get(hash, key).and_then(Option::take)
        {
            // The same bytes make the same take (route, caller, cost) while the policy's
            // definition and the admin token are the same; only an answer from memory is
            // taken here, never a call.
            let same = config.fingerprint(&plan.policy) == Some(plan.fp)
                && req.authorization.is_none_or(|h| crate::routes::authenticate(config, Some(h)).is_ok());
            plan.sent = self.sent();
            let here = if same { self.quota_here(&mut plan, may_wait, false) } else { Ok(None) };
            let leased = plan.mode.borrow.is_some();
            if let Some(slot) = self.memo.0.get(hash, key) {
                *slot = Some(plan);
            }
            if let Some(mut r) = here? {
                // A denial (a lease's admission uses its stock) of a policy without leases
                // (whose lookup may end one): read, nothing written.
                self.repeated = !leased && r.verdict.is_some_and(|v| !v.allowed);
                r.headers.extend(crate::cors_headers(config, req.origin));
                return Ok(Step::Respond(r));
            }
        }
        self.hit = None;
        let step = crate::handle_in(config, req, binding, rng, Some((&mut *self, may_wait)))?;
        if let (Some(plan), Some(key)) = (self.hit.take(), key)
            && matches!(step, Step::Respond(_))
            && self.memo.0.get(hash, &key).is_none()
        {
            self.memo.0.insert(hash, key, Some(plan));
        }
        Ok(step)
    }

    /// [`crate::call`] with this local state, at `now_ms` (the RPC binding's path).
    #[allow(clippy::too_many_arguments)]
    pub fn call<R: RngCore + ?Sized>(
        &mut self,
        config: &Config,
        route: Route,
        input: Input<'_>,
        caller: &Caller,
        idempotency_key: Option<&str>,
        now_ms: u64,
        may_wait: bool,
        rng: &mut R,
    ) -> Result<Step, Wait> {
        self.tick(now_ms);
        let step = crate::call_in(config, route, input, caller, idempotency_key, rng, Some((&mut *self, may_wait)));
        self.hit = None;
        step
    }

    /// Learns from a step a call of this state led to ([`Exchange::receive`] and friends), at
    /// `now_ms`: a response is learnt from and returned; another call is returned as it is.
    pub fn after(&mut self, step: Step, now_ms: u64) -> Step {
        match step {
            Step::Respond(r) => Step::Respond(self.answered(r, now_ms)),
            send => send,
        }
    }

    /// Learns from a response ([`Exchange::fail`], [`Exchange::not_durable`], or the
    /// response of [`Local::after`]'s step), at `now_ms`.
    pub fn answered(&mut self, mut r: ApiResponse, now_ms: u64) -> ApiResponse {
        self.tick(now_ms);
        let seen = r.seen.take();
        match r.plan.take().map(|p| *p) {
            Some(Plan::Quota(plan)) => self.learn_quota(&plan, seen),
            Some(Plan::Decision(plan)) => self.learn_decision(&plan, seen),
            Some(Plan::Forget(f)) => self.forget(&f),
            Some(Plan::Nothing) | None => {}
        }
        r
    }

    /// The calls to make in the background now (after a response: the worker's `waitUntil`):
    /// the renewals of leases running low, and the returns of the unused units of every lease
    /// that has ended. Each is driven like any other exchange, its steps through
    /// [`Local::after`].
    pub fn due(&mut self, now_ms: u64) -> Vec<Exchange> {
        self.tick(now_ms);
        if self.next_due <= self.now {
            let now = self.now;
            let mut next = u64::MAX;
            for l in self.leases.values_mut() {
                l.expire(now, &mut self.returns);
                next = next.min(l.ends());
            }
            self.next_due = next;
        }
        self.renewing += self.renewals.len() as u64;
        let mut calls = core::mem::take(&mut self.renewals);
        calls.extend(self.returns.drain(..).filter_map(Return::exchange));
        calls
    }

    /// When the next lease ends (in the shell's ms), if one holds units: the shell calls
    /// [`Local::due`] then.
    pub fn next_due(&self) -> Option<u64> {
        (self.next_due != u64::MAX).then_some(self.next_due)
    }

    /// Ends every lease now and lends no more (a graceful shutdown): the calls giving back
    /// every unused unit. A borrow answered later is given back at once.
    pub fn drain(&mut self) -> Vec<Exchange> {
        self.closed = true;
        // Not sent yet: nothing was lent.
        self.renewals.clear();
        self.end_all();
        self.returns.drain(..).filter_map(Return::exchange).collect()
    }

    /// A new configuration: every denial goes, every lease ends (its units given back by the
    /// next [`Local::due`]).
    pub fn reconfigure(&mut self) {
        self.epoch += 1;
        self.denials.clear();
        self.memo.0.clear();
        self.end_all();
    }

    /// How many denials and leases it keeps now (each table's size is fixed at [`Local::new`]).
    pub fn sizes(&self) -> (usize, usize) {
        (self.denials.len(), self.leases.len())
    }

    /// True when the last [`Local::handle`] (or [`Local::handle_as`]) repeated a denial from
    /// memory and changed nothing else here (only the tables' recency): the same request at
    /// the same `now_ms`, with no other call of this state between, gets the same answer. A
    /// shell may answer it again so without asking (the worker keeps such answers for the ms).
    pub fn repeated(&self) -> bool {
        self.repeated
    }

    /// How many borrows and refreshes were answered (or failed) so far: a shell wakes the
    /// takes told to [`Wait`] when it changes.
    pub fn settled(&self) -> u64 {
        self.settled
    }

    /// True when background calls wait to be made, units to give back or a renewal (the shell
    /// calls [`Local::due`]).
    pub fn has_returns(&self) -> bool {
        !self.returns.is_empty() || !self.renewals.is_empty()
    }

    /// Renewals [`Local::due`] handed out and not answered (or failed) yet: a shell shutting
    /// down waits for them, and gives back what they lent.
    pub fn renewing(&self) -> u64 {
        self.renewing
    }

    /// Units held by this shell's leases now (what it keeps from other shells).
    pub fn lent(&self) -> i64 {
        self.leases.values().map(Lease::held).sum()
    }

    fn end_all(&mut self) {
        for l in self.leases.values_mut() {
            self.returns.extend(end(l));
            self.returns.extend(l.end_next());
            self.returns.extend(l.forget_used());
        }
        self.next_due = u64::MAX;
    }

    fn tick(&mut self, now: u64) {
        if now < self.now {
            // A clock that went back: nothing timed by it can be trusted.
            self.reconfigure();
        }
        self.now = now;
    }

    fn sent(&self) -> Sent {
        Sent { at: self.now, forgets: self.forgets, epoch: self.epoch }
    }

    fn key_hash(&self, key: &str) -> u64 {
        // FNV-1a, seeded.
        let mut h = 0xcbf2_9ce4_8422_2325 ^ self.seed;
        for b in key.bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        h ^ (h >> 29)
    }

    /// Decides a quota take or peek (`ex`, whose plan is `plan`) here if it can.
    pub(crate) fn quota(
        &mut self,
        config: &Config,
        caller: &Caller,
        mut ex: Exchange,
        mut plan: Box<QuotaPlan>,
        may_wait: bool,
    ) -> Result<Step, Wait> {
        let now = self.now;
        plan.sent = self.sent();
        if let Some(r) = self.quota_here(&mut plan, may_wait, true)? {
            self.hit = Some(plan);
            return Ok(Step::Respond(r));
        }
        let borrow = plan.mode.borrow.filter(|_| !self.closed);
        if let Some(b) = borrow {
            let hash = self.key_hash(&plan.lease_key);
            if plan.peek || plan.refresh {
                return Ok(Step::Send(ex.with_plan(Plan::Quota(plan))));
            }
            // No stock: borrow, unless a borrow is already under way (then wait for it, or
            // take as usual).
            let borrowing = self.leases.get(hash, &plan.lease_key).and_then(|l| l.borrowing);
            if borrowing.is_some_and(|since| now < since + u64::from(b.ms).max(1000)) {
                if may_wait {
                    return Err(Wait);
                }
                return Ok(Step::Send(ex.with_plan(Plan::Quota(plan))));
            }
            if self.leases.get(hash, &plan.lease_key).is_some_and(|l| l.held() > 0) {
                // A live lease too small for this cost: a take as usual, its stock kept.
                return Ok(Step::Send(ex.with_plan(Plan::Quota(plan))));
            }
            return Ok(Step::Send(self.borrow(config, caller, ex, plan, b, hash)));
        }
        ex.plan = Some(Box::new(Plan::Quota(plan)));
        Ok(Step::Send(ex))
    }

    /// The answer to a take or peek from memory, if there is one now: from its lease's stock,
    /// or its cached denial; `None` to ask Redis (with `refresh` set when this call is to
    /// refresh the denial: only when `may_refresh`, else nothing is changed).
    fn quota_here(
        &mut self,
        plan: &mut QuotaPlan,
        may_wait: bool,
        may_refresh: bool,
    ) -> Result<Option<ApiResponse>, Wait> {
        let now = self.now;
        if plan.mode.borrow.is_some() && !self.closed {
            let hash = self.key_hash(&plan.lease_key);
            if let Some(l) = self.leases.get(hash, &plan.lease_key) {
                l.expire(now, &mut self.returns);
                if !plan.peek && l.stock < plan.cost && l.next.as_ref().is_some_and(|n| n.stock >= plan.cost) {
                    // Too few units left for this cost: they go back, the next lease runs.
                    self.returns.extend(end(l));
                    l.expire(now, &mut self.returns);
                }
                if l.stock >= plan.cost {
                    // What Redis has left after the last lend, and what this shell holds.
                    let left = l.next.as_ref().map_or(l.outcome.remaining, |n| n.outcome.remaining);
                    let o = QuotaOutcome {
                        allowed: true,
                        remaining: left + l.held() - if plan.peek { 0 } else { plan.cost },
                        reset_ms: l.outcome.reset_ms.saturating_sub(elapsed(now, l.at)).max(0),
                        retry_after_ms: 0,
                        ..l.outcome
                    };
                    let mut renew = false;
                    if !plan.peek {
                        l.stock -= plan.cost;
                        if l.stock == 0 {
                            // (One record is named at a time: an earlier one not yet named goes now.)
                            self.returns.extend(l.forget_used());
                            l.used_up = l.id.take();
                            l.expire(now, &mut self.returns);
                        } else if l.stock * RENEW_AT <= l.lent
                            && !l.renewed
                            && l.next.is_none()
                            && l.borrowing.is_none()
                        {
                            l.renewed = true;
                            renew = true;
                        }
                    }
                    if renew {
                        self.renew(hash, plan);
                    }
                    return Ok(Some(crate::routes::quota_answer(&plan.policy, &plan.algorithm, o, false, 0)));
                }
            }
        }
        self.repeat_quota(plan, may_wait, may_refresh)
    }

    /// The cached denial of this take, if one may be repeated now; `None` to ask Redis (this
    /// call refreshes the denial near the end of its life, while the others are still
    /// answered from memory, or once it has ended); [`Wait`] for a refresh under way when the
    /// denial has ended.
    fn repeat_quota(
        &mut self,
        plan: &mut QuotaPlan,
        may_wait: bool,
        may_refresh: bool,
    ) -> Result<Option<ApiResponse>, Wait> {
        if plan.mode.cache_denials_ms == 0 {
            return Ok(None);
        }
        let now = self.now;
        let hash = self.key_hash(&plan.key);
        let Some(d) = self.denials.get(hash, &plan.key) else { return Ok(None) };
        let Denied::Quota(o) = d.what else { return Ok(None) };
        // A refresh that has not answered within REFRESH_WAIT_MS is given up on.
        let refreshing = d.refreshing.is_some_and(|since| now < since + REFRESH_WAIT_MS);
        if now >= d.until && refreshing {
            return if may_wait { Err(Wait) } else { Ok(None) };
        }
        // Ended with none under way (its refresh answered too late to be kept, or was lost):
        // this call refreshes it and the others wait, rather than all asking at once.
        if !refreshing && (now >= d.until || (d.until - now) * REFRESH_AT <= d.until - d.at) {
            if may_refresh {
                d.refreshing = Some(now);
                plan.refresh = true;
            }
            return Ok(None);
        }
        let gone = elapsed(now, d.at);
        let o = QuotaOutcome {
            reset_ms: o.reset_ms.saturating_sub(gone).max(0),
            retry_after_ms: o.retry_after_ms.saturating_sub(gone).max(1),
            ..o
        };
        let left = elapsed(d.until, now);
        Ok(Some(crate::routes::quota_answer(&plan.policy, &plan.algorithm, o, true, left)))
    }

    /// A borrow of `cost` and up to `units` more of `plan`'s quota under a new lease id,
    /// forgetting the used-up lease of `plan`'s slot: the call and the id.
    #[inline(never)]
    fn lend_op(&mut self, plan: &QuotaPlan, hash: u64, cost: i64, units: i64) -> Option<(BorrowQuota, String)> {
        self.leases_made += 1;
        let id = lease_id(self.seed, self.leases_made);
        let used_up = self.leases.get(hash, &plan.lease_key).and_then(|l| l.used_up.take());
        let op = BorrowQuota::new(&plan.policy, &plan.subject, plan.algorithm, cost, units, &id, used_up.as_deref());
        Some((op.ok()?, id))
    }

    /// A lease running low: the next one is borrowed in the background ([`Local::due`]) while
    /// this one admits.
    #[inline(never)]
    fn renew(&mut self, hash: u64, plan: &QuotaPlan) {
        let Some(b) = plan.mode.borrow else { return };
        let Some((op, id)) = self.lend_op(plan, hash, 0, b.units) else { return };
        let now = self.now;
        let Some(l) = self.leases.get(hash, &plan.lease_key) else { return };
        l.borrowing = Some(now);
        let mut ex = Exchange::lend(op, &plan.policy, plan.algorithm);
        ex.move_to(&l.ns);
        let mut renewal = Box::new(plan.clone());
        renewal.borrow = Some((id, l.ns.clone()));
        renewal.renew = true;
        self.renewals.push(ex.with_plan(Plan::Quota(renewal)));
    }

    /// The borrow replacing a take: the take's cost and up to `b.units` more.
    fn borrow(
        &mut self,
        config: &Config,
        caller: &Caller,
        ex: Exchange,
        mut plan: Box<QuotaPlan>,
        b: Borrow,
        hash: u64,
    ) -> Exchange {
        let ns = match caller.scope() {
            Some(s) => config.namespace.scoped(s.as_str()),
            None => config.namespace.clone(),
        };
        let now = self.now;
        let Some((op, id)) = self.lend_op(&plan, hash, plan.cost, b.units) else {
            return ex.with_plan(Plan::Quota(plan));
        };
        match self.leases.get(hash, &plan.lease_key) {
            Some(l) => {
                // (No stock: a borrow is made only then, so nothing of the old lease is lost.)
                l.borrowing = Some(now);
                l.ns = ns.clone();
            }
            None => {
                let lease = Lease {
                    id: None,
                    stock: 0,
                    until: 0,
                    at: now,
                    outcome: QuotaOutcome { allowed: true, limit: 0, remaining: 0, reset_ms: 0, retry_after_ms: 0 },
                    lent: 0,
                    renewed: false,
                    next: None,
                    borrowing: Some(now),
                    used_up: None,
                    ns: ns.clone(),
                    policy: plan.policy.clone(),
                    subject: plan.subject.clone(),
                };
                if let Some(evicted) = self.leases.insert(hash, plan.lease_key.clone(), lease) {
                    self.evicted(evicted);
                }
            }
        }
        plan.borrow = Some((id, ns));
        let mut borrow = ex.replaced(op, &plan.policy, plan.algorithm);
        borrow.plan = Some(Box::new(Plan::Quota(plan)));
        borrow
    }

    fn evicted(&mut self, mut l: Lease) {
        // Bounded: a flood of evictions gives back what it can, the rest waits for its window.
        if self.returns.len() < 4 * self.leases.capacity() {
            self.returns.extend(end(&mut l));
            self.returns.extend(l.end_next());
            self.returns.extend(l.forget_used());
        }
    }

    fn learn_quota(&mut self, plan: &QuotaPlan, seen: Option<Seen>) {
        let hash = self.key_hash(&plan.key);
        if plan.refresh {
            self.settled += 1;
            if let Some(d) = self.denials.get(hash, &plan.key) {
                d.refreshing = None;
            }
        }
        if plan.borrow.is_some() {
            self.settled += 1;
            let lease_hash = self.key_hash(&plan.lease_key);
            if let Some(l) = self.leases.get(lease_hash, &plan.lease_key) {
                l.borrowing = None;
            }
        }
        if plan.renew {
            // No take: only its units are learnt (a cost of 0 says nothing of a take's).
            self.renewing = self.renewing.saturating_sub(1);
            if let Some(Seen::Borrowed(b)) = seen
                && b.lent > 0
            {
                self.lease(plan, b.outcome, b.lent);
            }
            return;
        }
        let (outcome, lent) = match seen {
            Some(Seen::Quota(o)) => (o, 0),
            Some(Seen::Borrowed(b)) => (b.outcome, b.lent),
            _ => return,
        };
        if lent > 0 {
            self.lease(plan, outcome, lent);
        }
        if outcome.allowed {
            self.denials.remove(hash, &plan.key);
        } else if plan.sent.forgets == self.forgets && plan.sent.epoch == self.epoch {
            self.deny(
                hash,
                &plan.key,
                plan.mode.cache_denials_ms,
                plan.sent.at,
                outcome.retry_after_ms,
                Denied::Quota(outcome),
            );
        }
    }

    /// A borrow's units arrived: this shell's stock, or given back at once when they cannot be.
    fn lease(&mut self, plan: &QuotaPlan, outcome: QuotaOutcome, lent: i64) {
        let Some((id, ns)) = plan.borrow.clone() else { return };
        let now = self.now;
        let ms = plan.mode.borrow.map_or(0, |b| u64::from(b.ms));
        // Within the window the units were charged in: its end is at least `reset_ms` after
        // the borrow was sent.
        let reset = u64::try_from(outcome.reset_ms).unwrap_or(0);
        let until = plan.sent.at + ms.min(reset.saturating_sub(LEASE_GUARD_MS));
        let hash = self.key_hash(&plan.lease_key);
        let usable = !self.closed && plan.sent.epoch == self.epoch && until > now;
        match self.leases.get(hash, &plan.lease_key) {
            Some(l) if usable && l.stock == 0 && l.next.is_none() => {
                l.id = Some(id);
                l.stock = lent;
                l.lent = lent;
                l.renewed = false;
                l.until = until;
                l.at = plan.sent.at;
                l.outcome = outcome;
                l.ns = ns;
                self.next_due = self.next_due.min(until);
            }
            // The current lease still admits (a renewal): this one runs once it is used up.
            Some(l) if usable && l.next.is_none() => {
                l.next = Some(Box::new(Next { id, stock: lent, lent, until, at: plan.sent.at, outcome }));
                self.next_due = self.next_due.min(until);
            }
            // Two leases hold stock already (two borrows crossed), its slot was taken meanwhile,
            // or the units cannot be used (too late, a new configuration, a shutdown): back at once.
            _ => self.returns.push(Return {
                ns,
                policy: plan.policy.clone(),
                subject: plan.subject.clone(),
                units: lent,
                id,
            }),
        }
    }

    fn deny(&mut self, hash: u64, key: &str, cache_ms: u32, at: u64, retry: i64, what: Denied) {
        let life = u64::from(cache_ms).min(u64::try_from(retry).unwrap_or(0));
        if life == 0 || at + life <= self.now {
            return;
        }
        let d = Denial { at, until: at + life, refreshing: None, what };
        match self.denials.get(hash, key) {
            Some(old) => *old = d,
            None => {
                self.denials.insert(hash, key.to_owned(), d);
            }
        }
    }

    /// Decides a compound decision (`ex`, whose plan is `plan`) here if it can.
    pub(crate) fn decision(&mut self, mut ex: Exchange, mut plan: Box<DecisionPlan>) -> Step {
        plan.sent = self.sent();
        if let Some(key) = &plan.key {
            let now = self.now;
            let hash = self.key_hash(key);
            if let Some(d) = self.denials.get(hash, key)
                && now < d.until
                && let Denied::Decision(decision) = &d.what
            {
                let gone = elapsed(now, d.at);
                let mut decision = decision.clone();
                decision.retry_after_ms = decision.retry_after_ms.saturating_sub(gone).max(1);
                for p in &mut decision.parts {
                    if let PartOutcome::Quota(q) = p {
                        q.reset_ms = q.reset_ms.saturating_sub(gone).max(0);
                        q.retry_after_ms = if q.allowed { 0 } else { q.retry_after_ms.saturating_sub(gone).max(0) };
                    }
                }
                let left = elapsed(d.until, now);
                return Step::Respond(crate::routes::decision_response(&plan.kinds, decision, plan.peek, true, left));
            }
        }
        ex.plan = Some(Box::new(Plan::Decision(plan)));
        Step::Send(ex)
    }

    fn learn_decision(&mut self, plan: &DecisionPlan, seen: Option<Seen>) {
        let Some(Seen::Decision(d)) = seen else { return };
        if d.allowed || plan.sent.forgets != self.forgets || plan.sent.epoch != self.epoch {
            return;
        }
        // Each quota part that denied is a quota denial of its own; the whole decision is
        // repeated for as long as one of them may be.
        let mut life = 0;
        for (part, outcome) in plan.parts.iter().zip(&d.parts) {
            if let (Some((key, cache_ms)), PartOutcome::Quota(q)) = (part, outcome)
                && !q.allowed
            {
                let hash = self.key_hash(key);
                self.deny(hash, key, *cache_ms, plan.sent.at, q.retry_after_ms, Denied::Quota(*q));
                life = life.max(i64::from(*cache_ms).min(q.retry_after_ms));
            }
        }
        if let Some(key) = &plan.key {
            let hash = self.key_hash(key);
            let life = u32::try_from(life).unwrap_or(0);
            self.deny(hash, key, life, plan.sent.at, d.retry_after_ms, Denied::Decision(d));
        }
    }

    /// An override, refund or reset through this shell (or units a reservation gave back):
    /// the subject's denials of those policies (every cost, every definition) and its
    /// decisions go.
    pub(crate) fn forget(&mut self, f: &Forgets) {
        self.forgets += 1;
        let starts = |key: &str, prefixes: &[String]| prefixes.iter().any(|p| key.starts_with(p.as_str()));
        self.denials.retain(|key| {
            let tenant = f.tenant.as_ref().is_some_and(|(parts, decisions)| {
                key.starts_with(decisions.as_str()) || (key.ends_with(TENANT_MARK) && starts(key, parts))
            });
            !tenant && !key.starts_with(&f.decisions) && !starts(key, &f.prefixes)
        });
    }

    /// An override, refund or reset through this shell, about to be sent (`ex`, its plan
    /// `f`): the subject's denials go ([`Local::forget`]). A refund ([`Forgets::refund`]) of
    /// no more units than this shell's running lease of the subject has admitted (lent less
    /// stock) is put back into that lease's stock and answered with no Redis call: never more
    /// than the lease was lent, so what it gives back to Redis at its end never exceeds what
    /// Redis lent. Units are alike: one put back here that another shell admitted still keeps
    /// admissions less refunds within the limit. Any other refund goes to Redis whole, which
    /// gives back what it counts and no lease holds. (A larger refund is not split between the
    /// lease and Redis, nor does a used-up lease run again: each cost the worker's bundle more
    /// than its 100 KB allows.)
    pub(crate) fn refund(&mut self, ex: Exchange, f: Forgets) -> Step {
        self.forget(&f);
        let (mut here, now) = (0, self.now);
        if let Some((key, cost)) = f.refund.as_deref() {
            let hash = self.key_hash(key);
            if let Some(l) = self.leases.get(hash, key)
                && l.id.is_some()
                && l.until > now
                && l.lent - l.stock >= *cost
            {
                l.stock += cost;
                here = *cost;
            }
        }
        let ex = ex.with_plan(Plan::Forget(f));
        if here > 0 {
            // (Through the exchange, which drops itself: no second copy of its drop here.)
            return Step::Respond(ex.finish(ApiResponse::flat(&mut [("refunded", crate::Field::Int(here))])));
        }
        Step::Send(ex)
    }

    /// The key of `caller`'s leases of `policy` for `subject` (a take's, [`Local::quota_plan`]).
    pub(crate) fn lease_key(config: &Config, caller: &Caller, policy: &str, subject: &str) -> String {
        subject_key(caller, policy, subject, config.fingerprint(policy).unwrap_or(0))
    }

    /// The plan of a take or peek of `policy` (a quota) by `caller`.
    pub(crate) fn quota_plan(
        config: &Config,
        caller: &Caller,
        policy: &str,
        subject: &str,
        algorithm: Algorithm,
        cost: i64,
        peek: bool,
    ) -> Box<QuotaPlan> {
        let fp = config.fingerprint(policy).unwrap_or(0);
        let lease_key = subject_key(caller, policy, subject, fp);
        let key = cost_key(&lease_key, cost);
        Box::new(QuotaPlan {
            policy: policy.to_owned(),
            subject: subject.to_owned(),
            algorithm,
            cost,
            peek,
            mode: config.local_mode(policy),
            fp,
            lease_key,
            key,
            sent: Sent::default(),
            borrow: None,
            refresh: false,
            renew: false,
        })
    }

    /// The plan of a decision of `subject` with these parts (policy, algorithm or `None` for a
    /// lease, cost and level: a tenant-level part counts in another Redis key than the user's).
    pub(crate) fn decision_plan(
        config: &Config,
        caller: &Caller,
        subject: &str,
        kinds: Vec<(String, Option<Algorithm>)>,
        costs: &[(i64, Level)],
        peek: bool,
    ) -> Box<DecisionPlan> {
        let mut whole = decisions_prefix(caller, subject);
        whole.push(if peek { '1' } else { '0' });
        let mut parts = Vec::with_capacity(kinds.len());
        let mut repeatable = true;
        for ((policy, algorithm), &(cost, level)) in kinds.iter().zip(costs) {
            let fp = config.fingerprint(policy).unwrap_or(0);
            let tenant = if level == Level::Tenant { TENANT_MARK } else { "" };
            whole.push('\0');
            whole.push_str(policy);
            whole.push('\0');
            whole.push_str(itoa::Buffer::new().format(cost));
            whole.push('\0');
            whole.push_str(itoa::Buffer::new().format(fp));
            whole.push_str(if tenant.is_empty() { "\0u" } else { tenant });
            parts.push(match algorithm {
                Some(_) => {
                    // A user-level part is the user's quota (a take's key); the tenant's, apart.
                    let key = cost_key(&subject_key(caller, policy, subject, fp), cost) + tenant;
                    Some((key, config.local_mode(policy).cache_denials_ms))
                }
                None => {
                    repeatable = false;
                    None
                }
            });
        }
        Box::new(DecisionPlan { kinds, parts, peek, key: repeatable.then_some(whole), sent: Sent::default() })
    }

    /// The plan of an override, refund or reset of `policies` for `subject` by `caller`.
    /// (Out of line and not generic: one copy for every route that forgets.)
    #[inline(never)]
    pub(crate) fn forget_plan(caller: &Caller, policies: Vec<&str>, subject: &str) -> Plan {
        // Every definition's: the key up to the fingerprint.
        let fp_digits = itoa::Buffer::new().format(0u64).len();
        let prefixes_of = |subject: &str| -> Vec<String> {
            policies
                .iter()
                .map(|policy| {
                    let mut prefix = subject_key(caller, policy, subject, 0);
                    prefix.truncate(prefix.len() - fp_digits);
                    prefix
                })
                .collect()
        };
        // `TENANT/` in place of the subject: the keys of every user of the tenant.
        let tenant = subject.split_once('/').map(|(tenant, _)| {
            let users = redcount_core::text::join(&[tenant, "/"], "");
            let mut parts = prefixes_of(&users);
            parts.iter_mut().for_each(|p| {
                p.truncate(p.len() - 1); // the `\0` after the subject
            });
            let mut decisions = decisions_prefix(caller, &users);
            decisions.pop();
            (parts, decisions)
        });
        Plan::Forget(Forgets {
            prefixes: prefixes_of(subject),
            decisions: decisions_prefix(caller, subject),
            tenant,
            refund: None,
        })
    }
}

/// `scope \0 policy \0 subject \0 fingerprint` (a scope is an id: never empty, never `\0`).
fn subject_key(caller: &Caller, policy: &str, subject: &str, fp: u64) -> String {
    let scope = caller.scope().map_or("", |s| s.as_str());
    let mut key = String::with_capacity(scope.len() + policy.len() + subject.len() + 24);
    for part in [scope, policy, subject] {
        key.push_str(part);
        key.push('\0');
    }
    key.push_str(itoa::Buffer::new().format(fp));
    key
}

fn cost_key(subject_key: &str, cost: i64) -> String {
    let mut key = String::with_capacity(subject_key.len() + 12);
    key.push_str(subject_key);
    key.push('\0');
    key.push_str(itoa::Buffer::new().format(cost));
    key
}

/// Every decision key of `subject` starts with this (a quota key's first part is a scope or
/// empty, never `\u{1}`).
fn decisions_prefix(caller: &Caller, subject: &str) -> String {
    let scope = caller.scope().map_or("", |s| s.as_str());
    let mut key = String::from("\u{1}");
    for part in [scope, subject] {
        key.push_str(part);
        key.push('\0');
    }
    key
}

/// A lease id: this shell's seed and its count of leases, in hex (an id, 1..64 of `[0-9a-f-]`).
fn lease_id(seed: u64, n: u64) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut id = String::with_capacity(33);
    for word in [seed, n] {
        if !id.is_empty() {
            id.push('-');
        }
        for i in (0..16).rev() {
            id.push(char::from(HEX[((word >> (4 * i)) & 15) as usize]));
        }
    }
    id
}

fn elapsed(now: u64, at: u64) -> i64 {
    i64::try_from(now.saturating_sub(at)).unwrap_or(i64::MAX)
}

/// Ends a lease: its unused units to give back, if any.
fn end(l: &mut Lease) -> Option<Return> {
    let stock = core::mem::take(&mut l.stock);
    let id = l.id.take()?;
    (stock > 0).then(|| Return {
        ns: l.ns.clone(),
        policy: l.policy.clone(),
        subject: l.subject.clone(),
        units: stock,
        id,
    })
}

impl Return {
    fn exchange(self) -> Option<Exchange> {
        let op = ReturnQuota::new(&self.policy, &self.subject, self.units, &self.id).ok()?;
        let mut ex =
            Exchange::new(op, |_, given| crate::ApiResponse::flat(&mut [("returned", crate::Field::Int(given))]));
        ex.move_to(&self.ns);
        ex.plan = Some(Box::new(Plan::Nothing));
        Some(ex)
    }
}

impl Exchange {
    fn with_plan(mut self, plan: Plan) -> Exchange {
        self.plan = Some(Box::new(plan));
        self
    }
}

/// A set-associative table of `V` by text key: a fixed number of sets of [`WAYS`] slots, the
/// least recently used slot of a full set replaced. Lookups and inserts touch one set.
#[derive(Debug)]
struct Table<V> {
    slots: Vec<Option<Slot<V>>>,
    /// Sets - 1 (a power of two less one).
    mask: u64,
    tick: u64,
}

#[derive(Debug)]
struct Slot<V> {
    hash: u64,
    key: String,
    used: u64,
    value: V,
}

const WAYS: usize = 4;

impl<V> Table<V> {
    fn new(capacity: usize) -> Self {
        let sets = capacity.div_ceil(WAYS).max(1).next_power_of_two();
        let mut slots = Vec::with_capacity(sets * WAYS);
        slots.resize_with(sets * WAYS, || None);
        Table { slots, mask: sets as u64 - 1, tick: 0 }
    }

    fn capacity(&self) -> usize {
        self.slots.len()
    }

    fn set(&mut self, hash: u64) -> &mut [Option<Slot<V>>] {
        let at = (hash & self.mask) as usize * WAYS;
        &mut self.slots[at..at + WAYS]
    }

    fn get(&mut self, hash: u64, key: &str) -> Option<&mut V> {
        self.tick += 1;
        let tick = self.tick;
        let slot = self.set(hash).iter_mut().flatten().find(|s| s.hash == hash && s.key == key)?;
        slot.used = tick;
        Some(&mut slot.value)
    }

    /// Inserts (the key must not be there): the entry it put out, if any.
    fn insert(&mut self, hash: u64, key: String, value: V) -> Option<V> {
        self.tick += 1;
        let used = self.tick;
        let set = self.set(hash);
        let at = match set.iter().position(Option::is_none) {
            Some(free) => free,
            None => set.iter().enumerate().min_by_key(|(_, s)| s.as_ref().map_or(0, |s| s.used)).map_or(0, |(i, _)| i),
        };
        set[at].replace(Slot { hash, key, used, value }).map(|s| s.value)
    }

    fn remove(&mut self, hash: u64, key: &str) -> Option<V> {
        let set = self.set(hash);
        let at = set.iter().position(|s| s.as_ref().is_some_and(|s| s.hash == hash && s.key == key))?;
        set[at].take().map(|s| s.value)
    }

    fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        for s in &mut self.slots {
            if s.as_ref().is_some_and(|s| !keep(&s.key)) {
                *s = None;
            }
        }
    }

    fn clear(&mut self) {
        self.slots.iter_mut().for_each(|s| *s = None);
    }

    fn values(&self) -> impl Iterator<Item = &V> {
        self.slots.iter().flatten().map(|s| &s.value)
    }

    fn values_mut(&mut self) -> impl Iterator<Item = &mut V> {
        self.slots.iter_mut().flatten().map(|s| &mut s.value)
    }

    fn len(&self) -> usize {
        self.slots.iter().flatten().count()
    }
}
