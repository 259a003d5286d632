//! Compound decisions: several quota policies and a semaphore lease of one subject, decided
//! in one script, all or nothing ("2 per second AND 100 per day AND at most 3 in flight").
//!
//! Either every part admits and every part is consumed, or nothing is written and the
//! outcome says which part denied and when to retry. A subject's quota and semaphore keys
//! share one hash tag ([`crate::keys`]), so a decision is one slot on Redis Cluster; for a
//! subject `TENANT/USER` that tag is the tenant's, so a part at [`Level::Tenant`] (the
//! tenant's own counter) is decided with the user's in the same script.

use alloc::string::String;
use alloc::vec::Vec;

use super::Operation;
use super::quota::{Algorithm, QuotaOutcome};
use super::semaphore::{MAX_LEASE_MS, MAX_LIMIT as MAX_SEMAPHORE_LIMIT};
use crate::command::itoa_i;
use crate::error::{InputError, Problem, ShapeError};
use crate::keys::{self, Level};
use crate::script::{DECIDE, Invocation, Request};
use crate::validate;
use crate::value::Value;

/// Most parts in one decision (the script's reply, 7 numbers a part, stays small enough to
/// be stored whole for an idempotent replay).
pub const MAX_PARTS: usize = 8;

/// One part of a decision, built by [`Part::quota`] or [`Part::lease`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    policy: String,
    level: Level,
    kind: PartKind,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum PartKind {
    Quota { algorithm: Algorithm, cost: i64 },
    Lease { holder: String, limit: i64, lease_ms: i64 },
}

impl Part {
    /// Takes `cost` units of the subject's quota under `policy`.
    pub fn quota(policy: &str, algorithm: Algorithm, cost: i64) -> Result<Part, InputError> {
        let policy = validate::id("policy", policy)?;
        algorithm.validate()?;
        validate::range("cost", cost, 1, algorithm.limit())?;
        Ok(Part { policy: String::from(policy), level: Level::User, kind: PartKind::Quota { algorithm, cost } })
    }

    /// Acquires a lease for `holder` on the semaphore of `policy` named by the subject (or
    /// renews the lease it holds).
    pub fn lease(policy: &str, holder: &str, limit: i64, lease_ms: i64) -> Result<Part, InputError> {
        let policy = validate::id("policy", policy)?;
        let holder = validate::id("holder", holder)?;
        validate::range("limit", limit, 1, MAX_SEMAPHORE_LIMIT)?;
        validate::range("lease_ms", lease_ms, 1, MAX_LEASE_MS)?;
        Ok(Part {
            policy: String::from(policy),
            level: Level::User,
            kind: PartKind::Lease { holder: String::from(holder), limit, lease_ms },
        })
    }
}

/// A part's policy and level, the same for a decision's parts and a reservation's.
macro_rules! part_place {
    ($part:ident) => {
        impl $part {
            /// This part at `level` of a `TENANT/USER` subject: [`Level::Tenant`] applies it
            /// to the tenant's own counter (or semaphore) of the policy, shared by its users;
            /// a plain subject refuses it, naming `level`.
            pub fn at(mut self, level: Level) -> $part {
                self.level = level;
                self
            }

            /// The policy this part applies.
            pub fn policy(&self) -> &str {
                &self.policy
            }

            /// The level it applies at.
            pub fn level(&self) -> Level {
                self.level
            }
        }
    };
}
pub(super) use part_place;
part_place!(Part);

/// Refuses a subject's parts (by policy and level) that are not one of each, or whose level
/// the subject does not have.
pub(super) fn check_places<'a>(
    subject: &str,
    parts: impl Iterator<Item = (&'a str, Level)> + Clone,
) -> Result<(), InputError> {
    for (i, (policy, level)) in parts.clone().enumerate() {
        super::quota::scope_and_subject(policy, subject, level)?;
        if parts.clone().take(i).any(|q| q == (policy, level)) {
            return Err(InputError::new("parts", Problem::Inconsistent("each policy may appear once per level")));
        }
    }
    Ok(())
}

/// The part that denied, from a script's 1-based `code` (0: none) among `n` parts.
pub(super) fn denied_by(code: i64, n: usize) -> Result<Option<usize>, &'static str> {
    match code {
        0 => Ok(None),
        i if (1..=n as i64).contains(&i) => Ok(Some(i as usize - 1)),
        _ => Err("denied_by out of range"),
    }
}

/// Decides several parts for one subject at once: all consumed, or none.
///
/// ```
/// use redcount_core::Operation;
/// use redcount_core::ops::decision::{Decide, Part};
/// use redcount_core::ops::quota::Algorithm;
///
/// let per_second = Algorithm::FixedWindow { limit: 2, window_ms: 1_000 };
/// let per_day = Algorithm::Gcra { rate: 100, period_ms: 86_400_000, burst: 100 };
/// let op = Decide::new("alice", vec![
///     Part::quota("per-second", per_second, 1).unwrap(),
///     Part::quota("per-day", per_day, 1).unwrap(),
///     Part::lease("in-flight", "job-7", 3, 30_000).unwrap(),
/// ]).unwrap();
/// // One script call; every key in alice's slot.
/// let keys = op.request().keys().to_vec();
/// assert!(keys.iter().all(|k| k.starts_with("rc:{u:alice}:")), "{keys:?}");
/// // The same policy twice would read its state twice before writing it: refused.
/// let twice = vec![Part::quota("per-second", per_second, 1).unwrap(), Part::quota("per-second", per_second, 1).unwrap()];
/// assert_eq!(Decide::new("alice", twice).unwrap_err().field, "parts");
///
/// // A user of a tenant within the tenant's total: both levels of one policy, one slot.
/// use redcount_core::keys::Level;
/// let both = vec![Part::quota("tpm", per_second, 1).unwrap(), Part::quota("tpm", per_second, 1).unwrap().at(Level::Tenant)];
/// let keys = Decide::new("acme/alice", both.clone()).unwrap().request().keys().to_vec();
/// assert_eq!(keys[0], "rc:{t:acme}:u:alice:q:tpm:fw");
/// assert_eq!(keys[2], "rc:{t:acme}:q:tpm:fw");
/// // A plain subject has no tenant level.
/// assert_eq!(Decide::new("alice", both).unwrap_err().field, "level");
/// ```
#[derive(Debug, Clone)]
pub struct Decide {
    /// Its idempotency keys' base (see [`keys::decision`]).
    base: String,
    parts: Vec<Part>,
    keys: Vec<String>,
    args: Vec<String>,
}

impl Decide {
    /// Consumes every part if every part admits; otherwise nothing.
    pub fn new(subject: &str, parts: Vec<Part>) -> Result<Self, InputError> {
        Self::build(subject, parts, false)
    }

    /// Reports what [`Decide::new`] would decide; consumes and writes nothing.
    pub fn peek(subject: &str, parts: Vec<Part>) -> Result<Self, InputError> {
        Self::build(subject, parts, true)
    }

    fn build(subject: &str, parts: Vec<Part>, peek: bool) -> Result<Self, InputError> {
        let subject = validate::subject("subject", subject)?;
        if parts.is_empty() || parts.len() > MAX_PARTS {
            return Err(InputError::new("parts", Problem::OutOfRange { min: 1, max: MAX_PARTS as i64 }));
        }
        check_places(subject, parts.iter().map(|p| (p.policy.as_str(), p.level)))?;
        let mut keys = Vec::with_capacity(3 * parts.len());
        let mut args = alloc::vec![itoa_i(parts.len() as i64), String::from(if peek { "1" } else { "0" })];
        for p in &parts {
            match &p.kind {
                PartKind::Quota { algorithm, cost } => {
                    keys.push(keys::quota_at(&p.policy, subject, p.level, algorithm.tag()));
                    keys.push(keys::quota_override_at(&p.policy, subject, p.level));
                    args.push(String::from(algorithm.tag()));
                    algorithm.push_params(&mut args);
                    args.push(itoa_i(*cost));
                }
                PartKind::Lease { holder, limit, lease_ms } => {
                    keys.extend(keys::semaphore_keys(&keys::semaphore_at(&p.policy, subject, p.level)));
                    args.extend([String::from("se"), holder.clone(), itoa_i(*limit), itoa_i(*lease_ms)]);
                }
            }
        }
        Ok(Decide { base: keys::decision(subject), parts, keys, args })
    }

    /// The parts, in order.
    pub fn parts(&self) -> &[Part] {
        &self.parts
    }
}

/// What a lease part got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseResult {
    /// Every slot is held by others.
    Full,
    /// A new lease (or, in a denied decision, one would have been granted).
    Acquired,
    /// The holder's lease was extended (or, in a denied decision, would have been).
    Renewed,
    /// A replayed decision whose lease has ended since (or is another holder's now): the
    /// decision is no longer allowed, its quotas stay charged.
    Ended,
    /// A reservation's lease part whose holder holds a lease of the semaphore already (a
    /// reservation takes a new one, which its settle ends): denied until that lease ends.
    Held,
}

/// One part's result, in the decision's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartOutcome {
    /// A quota part: as a single take reports it; in a denied decision, `allowed` says
    /// whether this part alone would have admitted, and `remaining` is unchanged.
    Quota(QuotaOutcome),
    /// A lease part.
    Lease {
        /// What the holder got (would get, in a denied decision).
        result: LeaseResult,
        /// Live leases after the call.
        in_use: i64,
        /// The limit in force (the semaphore's override, if any).
        limit: i64,
        /// Ms until the earliest lease ends (`None` when none is held).
        earliest_end_ms: Option<i64>,
        /// 0 unless full: ms until the earliest lease ends.
        retry_after_ms: i64,
        /// The lease granted, in ms (0 when none was).
        lease_ms: i64,
        /// The lease's fencing token (`None` when none was granted).
        fencing_token: Option<i64>,
    },
}

impl PartOutcome {
    /// A lease part's outcome: `result`, then a script's numbers after its code, `[_, limit,
    /// in_use, earliest end, retry after, lease ms, fencing token]`.
    pub(super) fn lease(result: LeaseResult, r: &[i64]) -> PartOutcome {
        PartOutcome::Lease {
            result,
            limit: r[1],
            in_use: r[2],
            earliest_end_ms: super::opt_ms(r[3]),
            retry_after_ms: r[4],
            lease_ms: r[5],
            fencing_token: (r[6] > 0).then_some(r[6]),
        }
    }

    /// True when this part (alone) admits.
    pub fn allowed(&self) -> bool {
        match self {
            PartOutcome::Quota(q) => q.allowed,
            PartOutcome::Lease { result, .. } => matches!(result, LeaseResult::Acquired | LeaseResult::Renewed),
        }
    }
}

/// The result of [`Decide`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// True when every part admitted and was consumed (would be, for a peek).
    pub allowed: bool,
    /// The index of the first part that denied (`None` when allowed).
    pub denied_by: Option<usize>,
    /// 0 when allowed, else the longest wait of the parts that denied, in ms.
    pub retry_after_ms: i64,
    /// Each part's result, in order.
    pub parts: Vec<PartOutcome>,
}

impl Operation for Decide {
    type Outcome = Decision;
    const NAME: &'static str = "decision";

    fn request(&self) -> Request {
        Request::Script(Invocation { script: &DECIDE, keys: self.keys.clone(), args: self.args.clone() })
    }

    fn parse(&self, reply: Value) -> Result<Decision, ShapeError> {
        let bad = |why| ShapeError::new(Self::NAME, why);
        let items = reply.into_array(Self::NAME)?;
        let n = self.parts.len();
        if items.len() != 4 + 7 * n {
            return Err(bad("wrong number of items"));
        }
        let ints = items.iter().map(|v| v.to_int(Self::NAME)).collect::<Result<Vec<i64>, _>>()?;
        if ints[3] != n as i64 {
            return Err(bad("wrong number of parts"));
        }
        let denied_by = denied_by(ints[1], n).map_err(bad)?;
        let mut parts = Vec::with_capacity(n);
        for (p, r) in self.parts.iter().zip(ints[4..].chunks_exact(7)) {
            parts.push(match p.kind {
                PartKind::Quota { .. } => PartOutcome::Quota(QuotaOutcome::from_reply([r[0], r[1], r[2], r[3], r[4]])),
                PartKind::Lease { .. } => PartOutcome::lease(
                    match r[0] {
                        0 => LeaseResult::Full,
                        1 => LeaseResult::Acquired,
                        2 => LeaseResult::Renewed,
                        3 => LeaseResult::Ended,
                        _ => return Err(bad("unknown lease code")),
                    },
                    r,
                ),
            });
        }
        let allowed = ints[0] == 1;
        if allowed != denied_by.is_none() {
            return Err(bad("allowed and denied_by disagree"));
        }
        Ok(Decision { allowed, denied_by, retry_after_ms: ints[2], parts })
    }
}

impl super::Replayable for Decide {
    fn idempotency_base(&self) -> Option<String> {
        Some(self.base.clone())
    }
}
