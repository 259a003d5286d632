//! Reservations: units of several quotas (and semaphore leases) of one subject held before
//! the work whose cost is known only after it ends (LLM tokens, money), then settled at what
//! was used.
//!
//! [`Reserve`] decides every part at one server time before anything is written, all or
//! nothing ([`Mode::All`]), or each quota part at what remains if that is at least its
//! minimum ([`Mode::Capped`]); a denied reservation or a peek writes nothing. It takes the
//! units from each quota as a take would, so every other call sees them in use at once, and
//! holds its leases until the reservation ends. Then one of:
//!
//! - [`Settle`] with the units actually used (`actual`): below the reservation, the
//!   difference comes back (see "In each algorithm's own terms" below); above it, the
//!   overrun is charged at once, the quota standing at most the part's `max_debt` above its
//!   size (0 by default: the charge stops at the size, and the outcome says how much was not
//!   charged, [`SettledPart::Quota::uncharged`]). A quota above its size refuses every call,
//!   new reservations included, until time has repaid the debt. The leases are released.
//! - [`Extend`]: a new lease from now (a heartbeat for long streams), with the units used so
//!   far: units past what stands charged are charged as a settle's overrun is, and stay
//!   charged (a settle's `actual` is at least the most an extend reported).
//! - [`Release`] (cancel): every unit not reported used by an extend comes back, the leases
//!   are freed.
//! - Nothing: when the lease ends unsettled, the reservation is settled by its policy's
//!   [`OnExpiry`]: [`OnExpiry::Charge`] (the default) lets the units stand as reserved;
//!   [`OnExpiry::Refund`] gives back the units not reported used, applied by the next
//!   reservation call (reserve, settle, extend or release) of that subject with that quota
//!   among its parts, at most 8 owed refunds per call, before the call is decided. Its
//!   leases end with it.
//!
//! A second settle (or release, or extend) of a finished reservation answers the first
//! settlement's numbers with `already_settled`, and does nothing again; a settle after the
//! lease ended says the reservation expired and applies nothing but its `on_expiry`, once.
//! Its record is kept for `keep_ms` ([`KEEP_MS`] by default) after it ended; after that a
//! settle answers "unknown" (nothing done).
//!
//! # In each algorithm's own terms
//!
//! Units given back come off the state the reserve charged, and nothing else; units charged
//! late are charged at the time of the call. What that means per algorithm:
//!
//! - **Fixed window.** The reserve's units count in the window running at the reserve. Given
//!   back while that window runs, they come off its count; once it has ended they are back
//!   already (the next window started at 0), and nothing more comes back: a reservation that
//!   outlives its window keeps its units counted in that window only. An overrun counts in
//!   the window running at the settle.
//! - **Sliding window log.** The reserve logs one entry (its units, at its time, tagged with
//!   its id). Units given back come off that entry, which keeps its time (every later entry's
//!   running total is rewritten, 32 entries at most per call over all its parts: past that,
//!   or once the entry has left the window, nothing comes back early and its units leave the
//!   window with it; so a sliding window's refund on expiry, applied later, seldom gives
//!   anything back in a busy log). An overrun is a new entry at the time of the settle.
//! - **Token bucket.** The units go back in as tokens (the refills due first), never above the
//!   capacity and never more than the units less what the refill steps since the reserve
//!   added (those steps already made up for them: giving them back too would let the bucket
//!   admit more than its capacity plus its refills). An overrun takes tokens below 0 (debt),
//!   which the refill repays.
//! - **GCRA.** The theoretical arrival time moves back by the whole emission intervals of the
//!   units' span left after the time elapsed since the reserve (so one unit less once any
//!   time has passed), never before now: a quota whole again takes nothing back. An overrun moves it past the burst window (debt), which time repays at the rate.
//!
//! No unit is counted twice or lost: each unit a reservation takes is either still charged,
//! given back once (by its settle, release, or its expiry's refund, whichever comes first:
//! they share its record and its expiry entry), or back by time.
//!
//! # Tenant levels
//!
//! The subject may be `TENANT/USER`: a part at [`Level::Tenant`] holds units of the tenant's
//! own counter of its policy (shared by every user of the tenant), the others the user's;
//! every key is in the tenant's slot, so one script decides both levels.
//!
//! ```
//! use redcount_core::Operation;
//! use redcount_core::keys::Level;
//! use redcount_core::ops::quota::Algorithm;
//! use redcount_core::ops::reservation::{Mode, OnExpiry, Part, Reserve};
//!
//! let tpm = Algorithm::FixedWindow { limit: 100_000, window_ms: 60_000 };
//! let usd_day = Algorithm::FixedWindow { limit: 50_000_000, window_ms: 86_400_000 }; // micro-dollars
//! let reserve = Reserve::new(
//!     "acme/alice",
//!     "req-7f3a",
//!     vec![
//!         Part::quota("tpm", tpm, 1_200).unwrap(),
//!         Part::quota("tpm", tpm, 1_200).unwrap().at(Level::Tenant),
//!         Part::quota("usd-day", usd_day, 350_000).unwrap().max_debt(50_000).unwrap(),
//!         Part::lease("in-flight", "req-7f3a", 4).unwrap(),
//!     ],
//!     60_000,
//!     Mode::All,
//! )
//! .unwrap();
//! // One script, every key in the tenant's slot.
//! assert!(reserve.request().keys().iter().all(|k| k.starts_with("rc:{t:acme}")));
//! // After the call: what was used, per part in order (a lease part's is 0).
//! let settle = reserve.settle(&[900, 900, 120_000, 0]).unwrap();
//! assert_eq!(settle.request().keys(), reserve.request().keys());
//! // A reservation's units are a take's: at most the limit.
//! assert_eq!(Part::quota("tpm", tpm, 100_001).unwrap_err().field, "units");
//! let _ = OnExpiry::Refund;
//! ```

use alloc::string::String;
use alloc::vec::Vec;

use super::Operation;
use super::decision::{LeaseResult, MAX_PARTS, PartOutcome, check_places, denied_by, part_place};
use super::quota::{Algorithm, QuotaOutcome};
use super::semaphore::{MAX_LEASE_MS, MAX_LIMIT as MAX_SEMAPHORE_LIMIT};
use crate::command::itoa_i;
use crate::error::{InputError, Problem, ShapeError};
use crate::keys::{self, Level};
use crate::script::{Invocation, RESERVE, Request, SETTLE};
use crate::validate;
use crate::value::Value;

/// Most units of one part, and of one settle's `actual`: a quota's largest limit.
pub const MAX_UNITS: i64 = super::quota::MAX_LIMIT;
/// How long a finished reservation's record is kept by default, in ms: a settle within it
/// answers the first settlement again; after it, "unknown".
pub const KEEP_MS: i64 = 3_600_000;
/// Longest a record may be kept, in ms: 7 days.
pub const MAX_KEEP_MS: i64 = 604_800_000;

/// All or nothing, or what remains.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// Every part gets its units, or nothing is reserved.
    #[default]
    All,
    /// A quota part short of units gets what remains, if that is at least its `min_units`
    /// ([`Part::min_units`], 1 by default); otherwise nothing is reserved.
    Capped,
}

/// What a quota policy does with a reservation whose lease ends unsettled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnExpiry {
    /// The units stand as reserved (and as an extend charged them).
    #[default]
    Charge,
    /// The units not reported used by an extend come back.
    Refund,
}

/// One part of a reservation, built by [`Part::quota`] or [`Part::lease`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    policy: String,
    level: Level,
    kind: PartKind,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum PartKind {
    Quota { algorithm: Algorithm, units: i64, min_units: Option<i64>, max_debt: i64, on_expiry: OnExpiry },
    Lease { holder: String, limit: i64 },
}

part_place!(Part);

impl Part {
    /// Holds `units` of the subject's quota under `policy` (1 to the limit, as a take's cost).
    pub fn quota(policy: &str, algorithm: Algorithm, units: i64) -> Result<Part, InputError> {
        let policy = validate::id("policy", policy)?;
        algorithm.validate()?;
        validate::range("units", units, 1, algorithm.limit())?;
        Ok(Part {
            policy: String::from(policy),
            level: Level::User,
            kind: PartKind::Quota { algorithm, units, min_units: None, max_debt: 0, on_expiry: OnExpiry::Charge },
        })
    }

    /// Holds a new lease for `holder` on the semaphore of `policy` named by the subject, for
    /// the reservation's lease (a holder that already holds one is refused).
    pub fn lease(policy: &str, holder: &str, limit: i64) -> Result<Part, InputError> {
        let policy = validate::id("policy", policy)?;
        let holder = validate::id("holder", holder)?;
        validate::range("limit", limit, 1, MAX_SEMAPHORE_LIMIT)?;
        Ok(Part {
            policy: String::from(policy),
            level: Level::User,
            kind: PartKind::Lease { holder: String::from(holder), limit },
        })
    }

    /// The fewest units a quota part accepts in [`Mode::Capped`] (1 to its units).
    pub fn min_units(mut self, n: i64) -> Result<Part, InputError> {
        match &mut self.kind {
            PartKind::Quota { units, min_units, .. } => {
                *min_units = Some(validate::range("min_units", n, 1, *units)?);
                Ok(self)
            }
            PartKind::Lease { .. } => {
                Err(InputError::new("min_units", Problem::Inconsistent("a lease part has no units")))
            }
        }
    }

    /// The most units the quota may stand above its size after an overrun is charged (the
    /// policy's `max_debt`; 0 by default): at most the algorithm's largest size less the
    /// limit ([`Algorithm::max_size`]).
    pub fn max_debt(mut self, n: i64) -> Result<Part, InputError> {
        match &mut self.kind {
            PartKind::Quota { algorithm, max_debt, .. } => {
                *max_debt = validate::range("max_debt", n, 0, algorithm.max_size() - algorithm.limit())?;
                Ok(self)
            }
            PartKind::Lease { .. } => {
                Err(InputError::new("max_debt", Problem::Inconsistent("a lease part has no units")))
            }
        }
    }

    /// What the policy does if the lease ends unsettled (a lease part ends with it whatever
    /// this says).
    pub fn on_expiry(mut self, what: OnExpiry) -> Part {
        if let PartKind::Quota { on_expiry, .. } = &mut self.kind {
            *on_expiry = what;
        }
        self
    }

    /// The units asked for (`None` for a lease part).
    pub fn units(&self) -> Option<i64> {
        match self.kind {
            PartKind::Quota { units, .. } => Some(units),
            PartKind::Lease { .. } => None,
        }
    }

    /// The holder of a lease part (`None` for a quota part).
    pub fn holder(&self) -> Option<&str> {
        match &self.kind {
            PartKind::Lease { holder, .. } => Some(holder),
            PartKind::Quota { .. } => None,
        }
    }

    fn is_quota(&self) -> bool {
        matches!(self.kind, PartKind::Quota { .. })
    }
}

/// What every reservation call checks and builds from a subject, an id and the parts: the
/// record's key, then three keys per part (lua/lib_reserve.lua).
fn checked_keys(subject: &str, id: &str, parts: &[Part]) -> Result<Vec<String>, InputError> {
    let subject = validate::subject("subject", subject)?;
    let id = validate::id("reservation", id)?;
    if parts.is_empty() || parts.len() > MAX_PARTS {
        return Err(InputError::new("parts", Problem::OutOfRange { min: 1, max: MAX_PARTS as i64 }));
    }
    let mut keys = Vec::with_capacity(1 + 3 * parts.len());
    keys.push(keys::reservation(subject, id));
    check_places(subject, parts.iter().map(|p| (p.policy.as_str(), p.level)))?;
    for p in parts {
        match &p.kind {
            PartKind::Quota { algorithm, .. } => {
                let state = keys::quota_at(&p.policy, subject, p.level, algorithm.tag());
                let expiry = keys::quota_expiry(&state);
                keys.extend([state, keys::quota_override_at(&p.policy, subject, p.level), expiry]);
            }
            PartKind::Lease { .. } => {
                keys.extend(keys::semaphore_keys(&keys::semaphore_at(&p.policy, subject, p.level)))
            }
        }
    }
    Ok(keys)
}

/// Reserves units of several quotas (and leases) of one subject, all at once or none.
#[derive(Debug, Clone)]
pub struct Reserve {
    subject: String,
    id: String,
    parts: Vec<Part>,
    lease_ms: i64,
    mode: Mode,
    peek: bool,
    keep_ms: i64,
    keys: Vec<String>,
}

impl Reserve {
    /// Reserves every part for `lease_ms` (1 to [`MAX_LEASE_MS`]) under the id `id`: the
    /// caller's, unguessable (with the subject it lets its holder settle), and never used
    /// again in the subject (one in use is refused; one whose record has been forgotten may
    /// still name a refund owed on expiry).
    pub fn new(subject: &str, id: &str, parts: Vec<Part>, lease_ms: i64, mode: Mode) -> Result<Self, InputError> {
        Self::build(subject, id, parts, lease_ms, mode, false)
    }

    /// Reports what [`Reserve::new`] would get; reserves and writes nothing.
    pub fn peek(subject: &str, id: &str, parts: Vec<Part>, lease_ms: i64, mode: Mode) -> Result<Self, InputError> {
        Self::build(subject, id, parts, lease_ms, mode, true)
    }

    fn build(
        subject: &str,
        id: &str,
        parts: Vec<Part>,
        lease_ms: i64,
        mode: Mode,
        peek: bool,
    ) -> Result<Self, InputError> {
        let keys = checked_keys(subject, id, &parts)?;
        validate::range("lease_ms", lease_ms, 1, MAX_LEASE_MS)?;
        if mode == Mode::All && parts.iter().any(|p| matches!(p.kind, PartKind::Quota { min_units: Some(_), .. })) {
            return Err(InputError::new("min_units", Problem::Inconsistent("only with mode capped")));
        }
        Ok(Reserve {
            subject: String::from(subject),
            id: String::from(id),
            parts,
            lease_ms,
            mode,
            peek,
            keep_ms: KEEP_MS,
            keys,
        })
    }

    /// Keeps the record `ms` after the reservation ends (1 to [`MAX_KEEP_MS`]; [`KEEP_MS`] by
    /// default).
    pub fn keep_ms(mut self, ms: i64) -> Result<Self, InputError> {
        self.keep_ms = validate::range("keep_ms", ms, 1, MAX_KEEP_MS)?;
        Ok(self)
    }

    /// The reservation's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The parts, in order.
    pub fn parts(&self) -> &[Part] {
        &self.parts
    }

    /// The subject.
    pub fn subject(&self) -> &str {
        &self.subject
    }

    /// The lease, in ms.
    pub fn lease_ms(&self) -> i64 {
        self.lease_ms
    }

    /// Its settle with the units used per part, in order (0 for a lease part).
    pub fn settle(&self, actual: &[i64]) -> Result<Settle, InputError> {
        Settle::new(&self.subject, &self.id, self.parts.clone(), actual)
    }

    /// Its extend: a new lease of `lease_ms` from now, and the units used so far per part.
    pub fn extend(&self, lease_ms: i64, used: &[i64]) -> Result<Extend, InputError> {
        Extend::new(&self.subject, &self.id, self.parts.clone(), lease_ms, used)
    }

    /// Its release.
    pub fn release(&self) -> Result<Release, InputError> {
        Release::new(&self.subject, &self.id, self.parts.clone())
    }
}

/// What a reservation is in, as its record says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Holding its units, its lease running.
    Open,
    /// Settled at the units used.
    Settled,
    /// Released: its units back.
    Released,
    /// Its lease ended unsettled: settled by its policies' [`OnExpiry`].
    Expired,
}

impl State {
    fn from_code(code: i64) -> Result<Option<State>, ()> {
        Ok(Some(match code {
            0 => return Ok(None),
            1 => State::Open,
            2 => State::Settled,
            3 => State::Released,
            4 => State::Expired,
            _ => return Err(()),
        }))
    }
}

/// One part of a [`Reservation`], in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReservedPart {
    /// As a decision's part reports it: a quota's `allowed`, `limit`, `remaining` (after the
    /// reservation), `reset_ms`, `retry_after_ms`; a lease's grant. In a denied reservation,
    /// whether this part alone would admit, and what remains without it.
    pub outcome: PartOutcome,
    /// Units held (a quota part; in [`Mode::Capped`], what remained; 0 when denied).
    pub reserved: i64,
    /// Units of this quota's expired reservations given back before this one was decided.
    pub back: i64,
}

/// The result of [`Reserve`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    /// True when every part was reserved (would be, for a peek).
    pub allowed: bool,
    /// The first part that denied (`None` when allowed).
    pub denied_by: Option<usize>,
    /// 0 when allowed, else the longest wait of the parts that denied, in ms.
    pub retry_after_ms: i64,
    /// The lease's end, Redis's clock in ms since the epoch (`None` when nothing was
    /// reserved).
    pub expires_at_ms: Option<i64>,
    /// Open when reserved (`None` when nothing was; a replay tells the reservation as it is
    /// now, `None` once forgotten).
    pub state: Option<State>,
    /// Each part, in order.
    pub parts: Vec<ReservedPart>,
}

/// Numbers of a reply, each checked to be in a range.
fn ints(op: &'static str, reply: Value, len: usize) -> Result<Vec<i64>, ShapeError> {
    let items = reply.into_array(op)?;
    if items.len() != len {
        return Err(ShapeError::new(op, "wrong number of items"));
    }
    items.iter().map(|v| v.to_int(op)).collect()
}

impl Operation for Reserve {
    type Outcome = Reservation;
    const NAME: &'static str = "reservation";

    fn request(&self) -> Request {
        let mut args = alloc::vec![
            itoa_i(self.parts.len() as i64),
            String::from(if self.mode == Mode::Capped { "1" } else { "0" }),
            String::from(if self.peek { "1" } else { "0" }),
            self.id.clone(),
            itoa_i(self.lease_ms),
            itoa_i(self.keep_ms),
        ];
        for p in &self.parts {
            match &p.kind {
                PartKind::Quota { algorithm, units, min_units, on_expiry, .. } => {
                    args.push(String::from(algorithm.tag()));
                    algorithm.push_params(&mut args);
                    args.extend([
                        itoa_i(*units),
                        itoa_i(min_units.unwrap_or(1)),
                        String::from(if *on_expiry == OnExpiry::Refund { "1" } else { "0" }),
                    ]);
                }
                PartKind::Lease { holder, limit } => args.extend([String::from("se"), holder.clone(), itoa_i(*limit)]),
            }
        }
        Request::Script(Invocation { script: &RESERVE, keys: self.keys.clone(), args })
    }

    fn parse(&self, reply: Value) -> Result<Reservation, ShapeError> {
        let bad = |why| ShapeError::new(Self::NAME, why);
        let n = self.parts.len();
        let v = ints(Self::NAME, reply, 6 + 7 * n)?;
        if v[3] != n as i64 {
            return Err(bad("wrong number of parts"));
        }
        let denied_by = denied_by(v[1], n).map_err(bad)?;
        let allowed = match v[0] {
            0 => false,
            1 => true,
            _ => return Err(bad("allowed is not 0 or 1")),
        };
        if allowed != denied_by.is_none() {
            return Err(bad("allowed and denied_by disagree"));
        }
        let state = State::from_code(v[5]).map_err(|_| bad("unknown state"))?;
        let mut parts = Vec::with_capacity(n);
        for (p, r) in self.parts.iter().zip(v[6..].chunks_exact(7)) {
            parts.push(match p.kind {
                PartKind::Quota { .. } => {
                    if r[5] < 0 || r[6] < 0 {
                        return Err(bad("negative units"));
                    }
                    ReservedPart {
                        outcome: PartOutcome::Quota(QuotaOutcome::from_reply([r[0], r[1], r[2], r[3], r[4]])),
                        reserved: r[5],
                        back: r[6],
                    }
                }
                PartKind::Lease { .. } => ReservedPart {
                    outcome: PartOutcome::lease(
                        match r[0] {
                            0 => LeaseResult::Full,
                            1 => LeaseResult::Acquired,
                            3 => LeaseResult::Held,
                            _ => return Err(bad("unknown lease code")),
                        },
                        r,
                    ),
                    reserved: 0,
                    back: 0,
                },
            });
        }
        let expires_at_ms = (v[4] > 0).then_some(v[4]);
        Ok(Reservation { allowed, denied_by, retry_after_ms: v[2], expires_at_ms, state, parts })
    }
}

impl super::Replayable for Reserve {
    fn idempotency_base(&self) -> Option<String> {
        Some(keys::reservations(&self.subject))
    }
}

/// What a settle, extend or release sends: the op, the parts as reserved, and per quota
/// part the units it reports.
#[derive(Debug, Clone)]
struct Call {
    op: &'static str,
    subject: String,
    id: String,
    parts: Vec<Part>,
    units: Vec<i64>,
    lease_ms: i64,
    keep_ms: i64,
    keys: Vec<String>,
}

impl Call {
    fn build(
        op: &'static str,
        field: &'static str,
        subject: &str,
        id: &str,
        parts: Vec<Part>,
        units: &[i64],
        lease_ms: i64,
    ) -> Result<Call, InputError> {
        let keys = checked_keys(subject, id, &parts)?;
        if units.len() != parts.len() {
            return Err(InputError::new(field, Problem::Inconsistent("one number per part, in the parts' order")));
        }
        for (p, &u) in parts.iter().zip(units) {
            validate::range(field, u, 0, if p.is_quota() { MAX_UNITS } else { 0 })?;
        }
        Ok(Call {
            op,
            subject: String::from(subject),
            id: String::from(id),
            parts,
            units: Vec::from(units),
            lease_ms,
            keep_ms: KEEP_MS,
            keys,
        })
    }

    fn request(&self) -> Request {
        let mut args = alloc::vec![
            String::from(self.op),
            itoa_i(self.parts.len() as i64),
            self.id.clone(),
            itoa_i(self.lease_ms),
            itoa_i(self.keep_ms),
        ];
        for (p, &u) in self.parts.iter().zip(&self.units) {
            match &p.kind {
                PartKind::Quota { algorithm, max_debt, .. } => {
                    args.push(String::from(algorithm.tag()));
                    algorithm.push_params(&mut args);
                    args.extend([itoa_i(u), itoa_i(*max_debt)]);
                }
                PartKind::Lease { .. } => args.push(String::from("se")),
            }
        }
        Request::Script(Invocation { script: &SETTLE, keys: self.keys.clone(), args })
    }

    fn parse(&self, name: &'static str, reply: Value) -> Result<Settlement, ShapeError> {
        let bad = |why| ShapeError::new(name, why);
        let n = self.parts.len();
        let v = ints(name, reply, 4 + 7 * n)?;
        if v[2] != n as i64 {
            return Err(bad("wrong number of parts"));
        }
        let state = State::from_code(v[0]).map_err(|_| bad("unknown state"))?;
        let already_settled = match v[1] {
            0 => false,
            1 => true,
            _ => return Err(bad("already is not 0 or 1")),
        };
        let mut parts = Vec::with_capacity(n);
        for (p, r) in self.parts.iter().zip(v[4..].chunks_exact(7)) {
            if r.iter().any(|&x| x < 0) {
                return Err(bad("negative units"));
            }
            parts.push(if p.is_quota() {
                SettledPart::Quota {
                    reserved: r[0],
                    actual: r[1],
                    refunded: r[2],
                    charged: r[3],
                    uncharged: r[4],
                    debt: r[5],
                    back: r[6],
                }
            } else {
                match r[0] {
                    0 | 1 => SettledPart::Lease { done: r[0] == 1 },
                    _ => return Err(bad("unknown lease code")),
                }
            });
        }
        Ok(Settlement { state, already_settled, expires_at_ms: v[3], parts })
    }
}

/// One part of a [`Settlement`], in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SettledPart {
    /// A quota part.
    Quota {
        /// Units taken at the reserve.
        reserved: i64,
        /// What the part is settled at: a settle's `actual` (at least what an extend
        /// reported used); a release's, what an extend reported used; an expired
        /// reservation's, the units that stand. An extend's: the units used so far.
        actual: i64,
        /// Units given back by this call, in the algorithm's own terms (see the module).
        refunded: i64,
        /// The overrun charged by this call.
        charged: i64,
        /// Units used beyond what stands charged that were not charged: the quota would
        /// have stood more than its `max_debt` above its size.
        uncharged: i64,
        /// Units the quota stands above its size after the call (repaid by time).
        debt: i64,
        /// Units of this quota's other expired reservations given back first.
        back: i64,
    },
    /// A lease part.
    Lease {
        /// The lease was released (renewed, for an extend): it was still this
        /// reservation's.
        done: bool,
    },
}

/// The result of [`Settle`], [`Extend`] and [`Release`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settlement {
    /// The reservation's state after the call (`None`: no such reservation, or forgotten;
    /// nothing was done). [`State::Expired`]: its lease had ended unsettled, and only its
    /// `on_expiry` was applied.
    pub state: Option<State>,
    /// An earlier call settled, released or expired it: these are that call's numbers, and
    /// nothing was done again.
    pub already_settled: bool,
    /// Its lease's end (after an extend, the new one), Redis's clock in ms since the epoch.
    pub expires_at_ms: i64,
    /// Each part, in order.
    pub parts: Vec<SettledPart>,
}

macro_rules! reservation_call {
    ($(#[$doc:meta])* $name:ident, $op_name:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone)]
        pub struct $name(Call);

        impl $name {
            /// Keeps the record `ms` after the reservation ends (1 to [`MAX_KEEP_MS`];
            /// [`KEEP_MS`] by default).
            pub fn keep_ms(mut self, ms: i64) -> Result<Self, InputError> {
                self.0.keep_ms = validate::range("keep_ms", ms, 1, MAX_KEEP_MS)?;
                Ok(self)
            }
        }

        impl Operation for $name {
            type Outcome = Settlement;
            const NAME: &'static str = $op_name;

            fn request(&self) -> Request {
                self.0.request()
            }

            fn parse(&self, reply: Value) -> Result<Settlement, ShapeError> {
                self.0.parse(Self::NAME, reply)
            }
        }

        impl super::Replayable for $name {
            fn idempotency_base(&self) -> Option<String> {
                Some(keys::reservations(&self.0.subject))
            }
        }
    };
}

reservation_call!(
    /// Settles a reservation at the units used: the difference back, or the overrun
    /// charged; its leases released.
    Settle,
    "reservation_settle"
);
reservation_call!(
    /// Extends a reservation's lease from now, charging units used past what stands.
    Extend,
    "reservation_extend"
);
reservation_call!(
    /// Cancels a reservation: every unit not reported used back, its leases released.
    Release,
    "reservation_release"
);

impl Settle {
    /// Settles `id` of `subject`, whose parts were `parts` (as reserved: the same policies,
    /// levels and order; a quota part's `max_debt` is read now), at `actual` units per
    /// part in order (0 to [`MAX_UNITS`]; 0 for a lease part).
    pub fn new(subject: &str, id: &str, parts: Vec<Part>, actual: &[i64]) -> Result<Self, InputError> {
        Ok(Settle(Call::build("settle", "actual", subject, id, parts, actual, 0)?))
    }
}

impl Extend {
    /// Extends `id` of `subject` (parts as reserved) to `lease_ms` from now (1 to
    /// [`MAX_LEASE_MS`]), with the units `used` so far per part in order (0 for a lease
    /// part).
    pub fn new(subject: &str, id: &str, parts: Vec<Part>, lease_ms: i64, used: &[i64]) -> Result<Self, InputError> {
        validate::range("lease_ms", lease_ms, 1, MAX_LEASE_MS)?;
        Ok(Extend(Call::build("extend", "used", subject, id, parts, used, lease_ms)?))
    }
}

impl Release {
    /// Releases `id` of `subject` (parts as reserved).
    pub fn new(subject: &str, id: &str, parts: Vec<Part>) -> Result<Self, InputError> {
        let zeros = alloc::vec![0; parts.len()];
        Ok(Release(Call::build("release", "parts", subject, id, parts, &zeros, 0)?))
    }
}
