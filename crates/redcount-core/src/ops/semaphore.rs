//! UpdateLease with per-holder leases.

use alloc::string::String;

use super::{Operation, opt_ms};
use crate::command::itoa_i;
use crate::error::{InputError, ShapeError};
use crate::keys;
use crate::script::{Invocation, Request, SEMAPHORE};
use crate::validate;
use crate::value::Value;

/// Most holders of one semaphore.
pub const MAX_LIMIT: i64 = 1_000_000;
/// Longest lease: about 115 days in ms.
pub const MAX_LEASE_MS: i64 = 10_000_000_000;

/// What a holder asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Take a slot (or renew the lease already held: idempotent).
    Acquire,
    /// Extend the lease already held.
    Renew,
    /// Give the slot back.
    Release,
    /// Ask whether the lease of this fencing token is still live (changes nothing).
    Check {
        /// The token the holder was given.
        fencing_token: i64,
    },
}

impl Action {
    fn as_str(self) -> &'static str {
        match self {
            Action::Acquire => "acquire",
            Action::Renew => "renew",
            Action::Release => "release",
            Action::Check { .. } => "check",
        }
    }
}

/// One call on a semaphore.
#[derive(Debug, Clone)]
pub struct UpdateLease {
    key: String,
    action: Action,
    holder: String,
    limit: i64,
    lease_ms: i64,
}

impl UpdateLease {
    /// Validates and builds the operation. `name` is an id, or a `TENANT/USER` subject (the
    /// semaphore a decision of that subject leases).
    pub fn new(
        scope: &str,
        name: &str,
        action: Action,
        holder: &str,
        limit: i64,
        lease_ms: i64,
    ) -> Result<Self, InputError> {
        let scope = validate::id("policy", scope)?;
        let name = validate::subject("name", name)?;
        let holder = validate::id("holder", holder)?;
        if let Action::Check { fencing_token } = action {
            validate::range("fencing_token", fencing_token, 1, validate::MAX_SAFE)?;
        }
        validate::range("limit", limit, 1, MAX_LIMIT)?;
        validate::range("lease_ms", lease_ms, 1, MAX_LEASE_MS)?;
        Ok(UpdateLease { key: keys::semaphore(scope, name), action, holder: String::from(holder), limit, lease_ms })
    }
}

/// What happened to the holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SemaphoreResult {
    /// A new lease was granted.
    Acquired,
    /// The holder already had a lease; it was extended.
    Renewed,
    /// Every slot is held.
    Full,
    /// The lease was given back.
    Released,
    /// The holder has no lease (never had one, released it, or it expired).
    NotHolder,
    /// Check: the token's lease is live (still yours).
    Held,
    /// Check: the token was issued and its lease is over (released, expired, or the holder
    /// holds a newer one). Known while the semaphore is in use and one lease after.
    Ended,
    /// Check: no such token was issued (or it is long forgotten).
    NeverHeld,
}

/// The result of [`UpdateLease`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SemaphoreOutcome {
    /// What happened.
    pub result: SemaphoreResult,
    /// Live leases after the call.
    pub in_use: i64,
    /// The limit.
    pub limit: i64,
    /// Ms until the earliest lease ends (`None` when no lease is held).
    pub earliest_end_ms: Option<i64>,
    /// Ms until this holder's lease ends (0 when it holds none).
    pub lease_ms: i64,
    /// The lease's fencing token: minted in the same script as the lease, kept by renewals,
    /// strictly increasing per semaphore (a resource refuses a token older than one it has
    /// seen). `None` when the call holds no lease.
    pub fencing_token: Option<i64>,
}

impl Operation for UpdateLease {
    type Outcome = SemaphoreOutcome;
    const NAME: &'static str = "semaphore";

    fn request(&self) -> Request {
        let token = match self.action {
            Action::Check { fencing_token } => itoa_i(fencing_token),
            _ => String::from("0"),
        };
        Request::Script(Invocation {
            script: &SEMAPHORE,
            keys: keys::semaphore_keys(&self.key).to_vec(),
            args: alloc::vec![
                String::from(self.action.as_str()),
                self.holder.clone(),
                itoa_i(self.limit),
                itoa_i(self.lease_ms),
                token,
            ],
        })
    }

    fn parse(&self, reply: Value) -> Result<SemaphoreOutcome, ShapeError> {
        let [code, in_use, limit, earliest, lease_ms, token] = reply.into_ints::<6>(Self::NAME)?;
        let result = match code {
            0 => SemaphoreResult::Full,
            1 => SemaphoreResult::Acquired,
            2 => SemaphoreResult::Renewed,
            3 => SemaphoreResult::Released,
            4 => SemaphoreResult::NotHolder,
            5 => SemaphoreResult::Held,
            6 => SemaphoreResult::Ended,
            7 => SemaphoreResult::NeverHeld,
            _ => return Err(ShapeError::new(Self::NAME, "unknown result code")),
        };
        let fencing_token = (token > 0).then_some(token);
        Ok(SemaphoreOutcome { result, in_use, limit, earliest_end_ms: opt_ms(earliest), lease_ms, fencing_token })
    }
}

impl super::Replayable for UpdateLease {}
