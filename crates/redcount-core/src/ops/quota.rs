//! Quotas: N units per window, by fixed window, sliding window log, token bucket or GCRA.

use alloc::string::String;

use super::Operation;
use crate::command::itoa_i;
use crate::error::{InputError, ShapeError};
use crate::keys::{self, Level};
use crate::script::{
    Invocation, QUOTA_BUCKET, QUOTA_FIXED, QUOTA_GCRA, QUOTA_LEASE, QUOTA_OVERRIDE, QUOTA_REFUND, QUOTA_RESET,
    QUOTA_SLIDING, Request,
};
use crate::validate;
use crate::value::Value;

/// Largest limit or capacity of a fixed window or token bucket.
pub const MAX_LIMIT: i64 = 1_000_000_000;
/// Largest limit of a sliding window (its log keeps one entry per admitted call).
pub const MAX_SLIDING_LIMIT: i64 = 10_000;
/// Longest window or refill step, in ms.
pub const MAX_WINDOW_MS: i64 = 1_000_000_000_000;
/// Largest GCRA rate (units per period): 10^7 per second is an emission interval of 0.1 µs.
pub const MAX_GCRA_RATE: i64 = 10_000_000;
/// Longest GCRA period, in ms: a leap year.
pub const MAX_GCRA_PERIOD_MS: i64 = 31_622_400_000;
/// Largest `burst * period_ms` of a GCRA quota. The script keeps time exactly in units of
/// 1/rate µs, where the burst window is `burst * period_ms * 1000`; this keeps every such
/// quantity (twice the window at most) below 2^53, where Lua's doubles are exact integers.
pub const MAX_GCRA_SPAN: i64 = 4_500_000_000_000;
/// Longest time a token bucket takes to refill from empty, in ms (`ceil(capacity / refill) *
/// interval_ms`, with a subject's override as the capacity): about 142,000 years. The script
/// sets the bucket's expiry and reports its reset from it; past 2^63 ms PEXPIRE refuses it
/// (after the bucket was written), past 2^53 Lua's doubles lose it.
pub const MAX_BUCKET_SPAN: i64 = 4_500_000_000_000_000;

/// How a quota counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// `limit` units per window; windows aligned to the Unix epoch.
    FixedWindow {
        /// Units per window.
        limit: i64,
        /// Window length in ms.
        window_ms: i64,
    },
    /// At most `limit` units in any `window_ms` (exact: a log of admitted calls).
    SlidingWindow {
        /// Units per window (at most [`MAX_SLIDING_LIMIT`]).
        limit: i64,
        /// Window length in ms.
        window_ms: i64,
    },
    /// A bucket of `capacity` tokens, `refill` added every `interval_ms`.
    TokenBucket {
        /// Bucket size (and the starting amount).
        capacity: i64,
        /// Tokens added per step.
        refill: i64,
        /// Step in ms.
        interval_ms: i64,
    },
    /// GCRA (generic cell rate algorithm): `rate` units per `period_ms`, evenly spaced (one
    /// every `period_ms / rate`, exactly, even below a microsecond), with up to `burst` at
    /// once. One key per subject (its theoretical arrival time), O(1) Redis time.
    Gcra {
        /// Units per period (at most [`MAX_GCRA_RATE`]).
        rate: i64,
        /// The period, in ms (at most [`MAX_GCRA_PERIOD_MS`]).
        period_ms: i64,
        /// Units a subject may take at once after being idle (`burst * period_ms` at most
        /// [`MAX_GCRA_SPAN`]).
        burst: i64,
    },
}

impl Algorithm {
    /// Checks the parameters.
    pub fn validate(&self) -> Result<(), InputError> {
        match *self {
            Algorithm::FixedWindow { limit, window_ms } => {
                validate::range("limit", limit, 1, MAX_LIMIT)?;
                validate::range("window_ms", window_ms, 1, MAX_WINDOW_MS)?;
            }
            Algorithm::SlidingWindow { limit, window_ms } => {
                validate::range("limit", limit, 1, MAX_SLIDING_LIMIT)?;
                validate::range("window_ms", window_ms, 1, MAX_WINDOW_MS)?;
            }
            Algorithm::TokenBucket { capacity, refill, interval_ms } => {
                validate::range("capacity", capacity, 1, MAX_LIMIT)?;
                validate::range("refill", refill, 1, capacity)?;
                let steps = (capacity + refill - 1) / refill; // refill steps from empty
                validate::range("interval_ms", interval_ms, 1, MAX_WINDOW_MS.min(MAX_BUCKET_SPAN / steps))?;
            }
            Algorithm::Gcra { rate, period_ms, burst } => {
                validate::range("rate", rate, 1, MAX_GCRA_RATE)?;
                validate::range("period_ms", period_ms, 1, MAX_GCRA_PERIOD_MS)?;
                validate::range("burst", burst, 1, MAX_LIMIT.min(MAX_GCRA_SPAN / period_ms))?;
            }
        }
        Ok(())
    }

    /// The limit (or capacity).
    pub fn limit(&self) -> i64 {
        match *self {
            Algorithm::FixedWindow { limit, .. } | Algorithm::SlidingWindow { limit, .. } => limit,
            Algorithm::TokenBucket { capacity, .. } => capacity,
            Algorithm::Gcra { burst, .. } => burst,
        }
    }

    /// The largest size (limit, capacity or burst) this algorithm allows with these
    /// parameters: the bound of a subject's override.
    pub fn max_size(&self) -> i64 {
        match *self {
            Algorithm::FixedWindow { .. } => MAX_LIMIT,
            Algorithm::TokenBucket { refill, interval_ms, .. } => {
                MAX_LIMIT.min((MAX_BUCKET_SPAN / interval_ms.max(1)).saturating_mul(refill))
            }
            Algorithm::SlidingWindow { .. } => MAX_SLIDING_LIMIT,
            Algorithm::Gcra { period_ms, .. } => MAX_LIMIT.min(MAX_GCRA_SPAN / period_ms.max(1)),
        }
    }

    /// What the size is called in a policy: `limit`, `capacity` or `burst`.
    pub fn size_field(&self) -> &'static str {
        match self {
            Algorithm::FixedWindow { .. } | Algorithm::SlidingWindow { .. } => "limit",
            Algorithm::TokenBucket { .. } => "capacity",
            Algorithm::Gcra { .. } => "burst",
        }
    }

    /// The parameters as the scripts read them (lib_*.lua: `*_args`, where the cost follows).
    pub(crate) fn push_params(&self, args: &mut alloc::vec::Vec<String>) {
        match *self {
            Algorithm::FixedWindow { limit, window_ms } | Algorithm::SlidingWindow { limit, window_ms } => {
                args.extend([itoa_i(limit), itoa_i(window_ms)]);
            }
            Algorithm::TokenBucket { capacity, refill, interval_ms } => {
                args.extend([itoa_i(capacity), itoa_i(refill), itoa_i(interval_ms)]);
            }
            Algorithm::Gcra { rate, period_ms, burst } => args.extend([itoa_i(rate), itoa_i(period_ms), itoa_i(burst)]),
        }
    }

    /// Its tag in key names and script arguments: `fw`, `sw`, `tb` or `gc`.
    pub fn tag(&self) -> &'static str {
        match self {
            Algorithm::FixedWindow { .. } => "fw",
            Algorithm::SlidingWindow { .. } => "sw",
            Algorithm::TokenBucket { .. } => "tb",
            Algorithm::Gcra { .. } => "gc",
        }
    }
}

/// Takes (or peeks at) `cost` units of a subject's quota.
#[derive(Debug, Clone)]
pub struct TakeQuota {
    /// The state, then the subject's override.
    keys: [String; 2],
    algo: Algorithm,
    cost: i64,
    peek: bool,
}

impl TakeQuota {
    /// Consumes `cost` units if they are available. The subject may be `TENANT/USER`
    /// ([`validate::subject`]): the user's own counter.
    pub fn take(scope: &str, subject: &str, algo: Algorithm, cost: i64) -> Result<Self, InputError> {
        Self::build(scope, subject, Level::User, algo, cost, false)
    }

    /// Reports what [`TakeQuota::take`] with this cost would get; consumes and writes nothing.
    pub fn peek(scope: &str, subject: &str, algo: Algorithm, cost: i64) -> Result<Self, InputError> {
        Self::build(scope, subject, Level::User, algo, cost, true)
    }

    /// As [`TakeQuota::take`] at `level` of a `TENANT/USER` subject: [`Level::Tenant`] takes
    /// from the tenant's own counter of the policy.
    pub fn take_at(scope: &str, subject: &str, level: Level, algo: Algorithm, cost: i64) -> Result<Self, InputError> {
        Self::build(scope, subject, level, algo, cost, false)
    }

    /// As [`TakeQuota::peek`] at `level` of a `TENANT/USER` subject.
    pub fn peek_at(scope: &str, subject: &str, level: Level, algo: Algorithm, cost: i64) -> Result<Self, InputError> {
        Self::build(scope, subject, level, algo, cost, true)
    }

    fn build(
        scope: &str,
        subject: &str,
        level: Level,
        algo: Algorithm,
        cost: i64,
        peek: bool,
    ) -> Result<Self, InputError> {
        let (scope, subject) = scope_and_subject(scope, subject, level)?;
        algo.validate()?;
        validate::range("cost", cost, 1, algo.limit())?;
        let keys = [keys::quota_at(scope, subject, level, algo.tag()), keys::quota_override_at(scope, subject, level)];
        Ok(TakeQuota { keys, algo, cost, peek })
    }
}

/// A policy and a subject as every quota operation checks them: the policy an id, the subject
/// an id or `TENANT/USER`, and [`Level::Tenant`] only for a subject with a tenant.
pub(crate) fn scope_and_subject<'a>(
    scope: &'a str,
    subject: &'a str,
    level: Level,
) -> Result<(&'a str, &'a str), InputError> {
    let scope = validate::id("policy", scope)?;
    let subject = validate::subject("subject", subject)?;
    if level == Level::Tenant && !subject.contains('/') {
        return Err(InputError::new(
            "level",
            crate::error::Problem::Inconsistent("tenant needs a TENANT/USER subject"),
        ));
    }
    Ok((scope, subject))
}

/// The result of [`TakeQuota`] (and of a quota part of a decision).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotaOutcome {
    /// True when the units were (or, for a peek, would be) granted.
    pub allowed: bool,
    /// The limit (or bucket capacity).
    pub limit: i64,
    /// Units left after this call.
    pub remaining: i64,
    /// Ms until the quota is whole again.
    pub reset_ms: i64,
    /// 0 when allowed, else ms until a call of the same cost can pass.
    pub retry_after_ms: i64,
}

impl QuotaOutcome {
    /// From the scripts' reply: `{allowed, limit, remaining, reset_ms, retry_after_ms}`.
    pub(crate) fn from_reply([allowed, limit, remaining, reset_ms, retry_after_ms]: [i64; 5]) -> Self {
        QuotaOutcome { allowed: allowed == 1, limit, remaining, reset_ms, retry_after_ms }
    }
}

impl Operation for TakeQuota {
    type Outcome = QuotaOutcome;
    const NAME: &'static str = "quota";

    fn request(&self) -> Request {
        let script = match self.algo {
            Algorithm::FixedWindow { .. } => &QUOTA_FIXED,
            Algorithm::SlidingWindow { .. } => &QUOTA_SLIDING,
            Algorithm::TokenBucket { .. } => &QUOTA_BUCKET,
            Algorithm::Gcra { .. } => &QUOTA_GCRA,
        };
        let mut args = alloc::vec::Vec::with_capacity(5);
        self.algo.push_params(&mut args);
        args.extend([itoa_i(self.cost), String::from(if self.peek { "1" } else { "0" })]);
        Request::Script(Invocation { script, keys: self.keys.to_vec(), args })
    }

    fn parse(&self, reply: Value) -> Result<QuotaOutcome, ShapeError> {
        let [allowed, limit, remaining, reset_ms, retry_after_ms] = reply.into_ints::<5>(Self::NAME)?;
        Ok(QuotaOutcome::from_reply([allowed, limit, remaining, reset_ms, retry_after_ms]))
    }
}

/// Forgets a subject's usage of one quota (an admin action): no SCAN. Units lent to shells
/// ([`BorrowQuota`]) and not yet given back stay counted: the shells holding them admit from
/// them without asking Redis.
#[derive(Debug, Clone)]
pub struct ResetQuota {
    /// The state, then the units lent.
    keys: [String; 2],
}

impl ResetQuota {
    /// Validates and builds the operation (the subject may be `TENANT/USER`: the user's).
    pub fn new(scope: &str, subject: &str, algo: Algorithm) -> Result<Self, InputError> {
        Self::new_at(scope, subject, Level::User, algo)
    }

    /// As [`ResetQuota::new`], at `level` of a `TENANT/USER` subject.
    pub fn new_at(scope: &str, subject: &str, level: Level, algo: Algorithm) -> Result<Self, InputError> {
        let (scope, subject) = scope_and_subject(scope, subject, level)?;
        let keys =
            [keys::quota_at(scope, subject, level, algo.tag()), keys::quota_lent_at(scope, subject, level, algo.tag())];
        Ok(ResetQuota { keys })
    }
}

impl Operation for ResetQuota {
    /// True when there was usage to forget.
    type Outcome = bool;
    const NAME: &'static str = "quota_reset";

    fn request(&self) -> Request {
        Request::Script(Invocation { script: &QUOTA_RESET, keys: self.keys.to_vec(), args: alloc::vec::Vec::new() })
    }

    fn parse(&self, reply: Value) -> Result<bool, ShapeError> {
        let [existed] = reply.into_ints::<1>(Self::NAME)?;
        Ok(existed > 0)
    }
}

/// Gives `units` back to a subject's quota (the work they paid for did not happen), never
/// above the limit: a fixed window's current count, a sliding window's newest logged calls, a
/// bucket's tokens, a GCRA quota's arrival time. An admin action: a public refund would undo
/// the limit. Units lent to shells ([`BorrowQuota`]) are never given back this way.
#[derive(Debug, Clone)]
pub struct RefundQuota {
    /// The state, the subject's override, the units lent.
    keys: [String; 3],
    algo: Algorithm,
    units: i64,
}

impl RefundQuota {
    /// Validates and builds the operation (the subject may be `TENANT/USER`: the user's).
    pub fn new(scope: &str, subject: &str, algo: Algorithm, units: i64) -> Result<Self, InputError> {
        Self::new_at(scope, subject, Level::User, algo, units)
    }

    /// As [`RefundQuota::new`], at `level` of a `TENANT/USER` subject.
    pub fn new_at(scope: &str, subject: &str, level: Level, algo: Algorithm, units: i64) -> Result<Self, InputError> {
        let (scope, subject) = scope_and_subject(scope, subject, level)?;
        algo.validate()?;
        validate::range("cost", units, 1, algo.limit())?;
        let keys = [
            keys::quota_at(scope, subject, level, algo.tag()),
            keys::quota_override_at(scope, subject, level),
            keys::quota_lent_at(scope, subject, level, algo.tag()),
        ];
        Ok(RefundQuota { keys, algo, units })
    }
}

impl Operation for RefundQuota {
    /// The units given back (fewer when fewer were in use).
    type Outcome = i64;
    const NAME: &'static str = "quota_refund";

    fn request(&self) -> Request {
        let mut args = alloc::vec![String::from(self.algo.tag()), itoa_i(self.units)];
        self.algo.push_params(&mut args);
        Request::Script(Invocation { script: &QUOTA_REFUND, keys: self.keys.to_vec(), args })
    }

    fn parse(&self, reply: Value) -> Result<i64, ShapeError> {
        let [given] = reply.into_ints::<1>(Self::NAME)?;
        Ok(given)
    }
}

impl super::Replayable for RefundQuota {}

/// Borrows a slice of a fixed-window quota's remaining units for a shell's local stock (a
/// budget lease): takes `cost` for this call and, when that passes, lends up to `units` more
/// (at most a quarter of what remains after the cost), charged at once like a take and
/// recorded under the lease's id until [`ReturnQuota`] gives back what was not used. The
/// shell admits from that stock without Redis, only within the window the units were
/// charged in (the reply's `reset_ms`).
///
/// ```
/// use redcount_core::Operation;
/// use redcount_core::ops::quota::{Algorithm, BorrowQuota};
///
/// let per_minute = Algorithm::FixedWindow { limit: 600, window_ms: 60_000 };
/// let op = BorrowQuota::new("per-minute", "alice", per_minute, 1, 50, "a1b2-1", None).unwrap();
/// let keys = op.request().keys().to_vec();
/// assert_eq!(keys[2], "rc:{u:alice}:q:per-minute:fw:lent");
/// // Only a fixed window lends: elsewhere a unit counts at the time it is charged.
/// let gcra = Algorithm::Gcra { rate: 10, period_ms: 1_000, burst: 10 };
/// assert!(BorrowQuota::new("per-second", "alice", gcra, 1, 5, "a1b2-1", None).is_err());
/// ```
#[derive(Debug, Clone)]
pub struct BorrowQuota {
    /// The state, the override, the units lent.
    keys: [String; 3],
    args: alloc::vec::Vec<String>,
}

/// The result of [`BorrowQuota`]: the take's answer and the units lent beside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Borrowed {
    /// The take's answer (`remaining` after the cost and the units lent).
    pub outcome: QuotaOutcome,
    /// The units lent (0 when denied).
    pub lent: i64,
}

impl BorrowQuota {
    /// Takes `cost` (0: a renewal, which only lends) and borrows up to `units` more under the
    /// new lease `lease` (an id unique to this lease: a return names it), forgetting `used_up`
    /// (this shell's last lease of the same quota, wholly used) on the way.
    pub fn new(
        scope: &str,
        subject: &str,
        algo: Algorithm,
        cost: i64,
        units: i64,
        lease: &str,
        used_up: Option<&str>,
    ) -> Result<Self, InputError> {
        let scope = validate::id("policy", scope)?;
        let subject = validate::id("subject", subject)?;
        algo.validate()?;
        let Algorithm::FixedWindow { limit, window_ms } = algo else {
            return Err(InputError::new("borrow", crate::error::Problem::Inconsistent("only a fixed window lends")));
        };
        validate::range("cost", cost, 0, limit)?;
        validate::range("units", units, 0, MAX_LIMIT)?;
        let mut args = alloc::vec![
            String::from("borrow"),
            itoa_i(limit),
            itoa_i(window_ms),
            itoa_i(cost),
            itoa_i(units),
            String::from(validate::id("lease", lease)?),
        ];
        if let Some(last) = used_up {
            args.push(String::from(validate::id("lease", last)?));
        }
        let tag = algo.tag();
        let keys = [
            keys::quota(scope, subject, tag),
            keys::quota_override(scope, subject),
            keys::quota_lent(scope, subject, tag),
        ];
        Ok(BorrowQuota { keys, args })
    }
}

impl Operation for BorrowQuota {
    type Outcome = Borrowed;
    const NAME: &'static str = "quota_borrow";

    fn request(&self) -> Request {
        Request::Script(Invocation { script: &QUOTA_LEASE, keys: self.keys.to_vec(), args: self.args.clone() })
    }

    fn parse(&self, reply: Value) -> Result<Borrowed, ShapeError> {
        let [allowed, limit, remaining, reset_ms, retry_after_ms, lent] = reply.into_ints::<6>(Self::NAME)?;
        if lent < 0 || (allowed != 1 && lent != 0) {
            return Err(ShapeError::new(Self::NAME, "units lent out of range"));
        }
        Ok(Borrowed { outcome: QuotaOutcome::from_reply([allowed, limit, remaining, reset_ms, retry_after_ms]), lent })
    }
}

/// Gives back the unused units of a budget lease ([`BorrowQuota`]): at most what the lease
/// still has on record, and nothing once its window is over (or a reset forgot the record).
#[derive(Debug, Clone)]
pub struct ReturnQuota {
    /// The state, the override (unused, for the script's shape), the units lent.
    keys: [String; 3],
    units: i64,
    lease: String,
}

impl ReturnQuota {
    /// Gives `units` of the lease `lease` back to the subject's fixed-window quota (0: forgets
    /// the record of a lease whose units were all used).
    pub fn new(scope: &str, subject: &str, units: i64, lease: &str) -> Result<Self, InputError> {
        let scope = validate::id("policy", scope)?;
        let subject = validate::id("subject", subject)?;
        validate::range("units", units, 0, MAX_LIMIT)?;
        let lease = String::from(validate::id("lease", lease)?);
        let keys = [
            keys::quota(scope, subject, "fw"),
            keys::quota_override(scope, subject),
            keys::quota_lent(scope, subject, "fw"),
        ];
        Ok(ReturnQuota { keys, units, lease })
    }
}

impl Operation for ReturnQuota {
    /// The units given back.
    type Outcome = i64;
    const NAME: &'static str = "quota_return";

    fn request(&self) -> Request {
        let args = alloc::vec![String::from("return"), itoa_i(self.units), self.lease.clone()];
        Request::Script(Invocation { script: &QUOTA_LEASE, keys: self.keys.to_vec(), args })
    }

    fn parse(&self, reply: Value) -> Result<i64, ShapeError> {
        let [given] = reply.into_ints::<1>(Self::NAME)?;
        if !(0..=self.units).contains(&given) {
            return Err(ShapeError::new(Self::NAME, "units given back out of range"));
        }
        Ok(given)
    }
}

/// Longest a subject's override holds before it lapses, in ms.
pub const MAX_OVERRIDE_TTL_MS: i64 = 1_000_000_000_000;

/// Sets or clears a subject's override of a quota policy's size, or a semaphore's own limit
/// (an admin action): read by every take and refund of that subject (every call on that
/// semaphore) in the same script.
#[derive(Debug, Clone)]
pub struct OverrideQuota {
    key: String,
    /// `Some((size, ttl_ms))` to set (ttl 0: until cleared), `None` to clear.
    set: Option<(i64, i64)>,
}

impl OverrideQuota {
    /// Sets the subject's size to `size` (within the algorithm's bound) for `ttl_ms` (0: until
    /// cleared).
    pub fn set(scope: &str, subject: &str, algo: Algorithm, size: i64, ttl_ms: i64) -> Result<Self, InputError> {
        Self::set_at(scope, subject, Level::User, algo, size, ttl_ms)
    }

    /// As [`OverrideQuota::set`], at `level` of a `TENANT/USER` subject.
    pub fn set_at(
        scope: &str,
        subject: &str,
        level: Level,
        algo: Algorithm,
        size: i64,
        ttl_ms: i64,
    ) -> Result<Self, InputError> {
        let (scope, subject) = scope_and_subject(scope, subject, level)?;
        validate::range("limit", size, 1, algo.max_size())?;
        validate::range("ttl_ms", ttl_ms, 0, MAX_OVERRIDE_TTL_MS)?;
        Ok(OverrideQuota { key: keys::quota_override_at(scope, subject, level), set: Some((size, ttl_ms)) })
    }

    /// Sets a semaphore's own limit (at most [`super::semaphore::MAX_LIMIT`]) for `ttl_ms`
    /// (0: until cleared): read by every call on that semaphore in the same script.
    pub fn set_semaphore(scope: &str, name: &str, limit: i64, ttl_ms: i64) -> Result<Self, InputError> {
        let scope = validate::id("policy", scope)?;
        let name = validate::subject("subject", name)?;
        validate::range("limit", limit, 1, super::semaphore::MAX_LIMIT)?;
        validate::range("ttl_ms", ttl_ms, 0, MAX_OVERRIDE_TTL_MS)?;
        Ok(OverrideQuota { key: keys::semaphore_override(scope, name), set: Some((limit, ttl_ms)) })
    }

    /// Clears a semaphore's own limit: the policy's applies again.
    pub fn clear_semaphore(scope: &str, name: &str) -> Result<Self, InputError> {
        let scope = validate::id("policy", scope)?;
        let name = validate::subject("subject", name)?;
        Ok(OverrideQuota { key: keys::semaphore_override(scope, name), set: None })
    }

    /// Clears the subject's override: the policy's size applies again.
    pub fn clear(scope: &str, subject: &str) -> Result<Self, InputError> {
        Self::clear_at(scope, subject, Level::User)
    }

    /// As [`OverrideQuota::clear`], at `level` of a `TENANT/USER` subject.
    pub fn clear_at(scope: &str, subject: &str, level: Level) -> Result<Self, InputError> {
        let (scope, subject) = scope_and_subject(scope, subject, level)?;
        Ok(OverrideQuota { key: keys::quota_override_at(scope, subject, level), set: None })
    }
}

impl Operation for OverrideQuota {
    /// True when an override was in force before the call.
    type Outcome = bool;
    const NAME: &'static str = "quota_override";

    fn request(&self) -> Request {
        let (op, size, ttl) = match self.set {
            Some((size, ttl)) => ("set", size, ttl),
            None => ("clear", 1, 0),
        };
        Request::Script(Invocation {
            script: &QUOTA_OVERRIDE,
            keys: alloc::vec![self.key.clone()],
            args: alloc::vec![String::from(op), itoa_i(size), itoa_i(ttl)],
        })
    }

    fn parse(&self, reply: Value) -> Result<bool, ShapeError> {
        let [existed] = reply.into_ints::<1>(Self::NAME)?;
        Ok(existed == 1)
    }
}

impl super::Replayable for OverrideQuota {}

impl super::Replayable for TakeQuota {}

impl super::Replayable for ResetQuota {}
