//! Bounded counter: a value kept within `[min, max]`, changed by signed deltas.

use alloc::string::String;

use super::Operation;
use crate::command::{Command, itoa_i};
use crate::error::{InputError, Problem, ShapeError};
use crate::keys;
use crate::script::{COUNTER, Invocation, Request};
use crate::validate;
use crate::value::Value;

/// Largest magnitude of a delta, a bound or a value (10^15, far below 2^53).
pub const MAX_VALUE: i64 = 1_000_000_000_000_000;
/// Longest TTL accepted for a new counter: 10 years in ms.
pub const MAX_TTL_MS: i64 = 315_360_000_000;

/// Where a counter lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Storage {
    /// Its own string key per subject.
    Key,
    /// One field per subject in a hash per scope (`HINCRBY` style).
    HashField,
}

/// What to do with a delta that would cross a bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Apply the part of the delta that stays within the bounds.
    Clamp,
    /// Apply nothing.
    Reject,
}

impl Mode {
    fn as_str(self) -> &'static str {
        match self {
            Mode::Clamp => "clamp",
            Mode::Reject => "reject",
        }
    }
}

/// The bounds and behaviour of a counter (a policy's settings).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// Lowest value (0 for "never negative").
    pub min: i64,
    /// Highest value, if any.
    pub max: Option<i64>,
    /// Clamp or reject at the bounds.
    pub mode: Mode,
    /// TTL in ms set when a change creates the key; 0 for none.
    pub ttl_ms: i64,
}

impl Default for Bounds {
    fn default() -> Self {
        Bounds { min: 0, max: None, mode: Mode::Clamp, ttl_ms: 0 }
    }
}

impl Bounds {
    /// Checks the bounds themselves.
    pub fn validate(&self) -> Result<(), InputError> {
        validate::range("min", self.min, -MAX_VALUE, MAX_VALUE)?;
        if let Some(max) = self.max {
            validate::range("max", max, -MAX_VALUE, MAX_VALUE)?;
            if max < self.min {
                return Err(InputError::new("max", Problem::Inconsistent("must not be below min")));
            }
        }
        validate::range("ttl_ms", self.ttl_ms, 0, MAX_TTL_MS)?;
        Ok(())
    }
}

fn target(scope: &str, subject: &str, storage: Storage) -> Result<(String, String), InputError> {
    let scope = validate::id("policy", scope)?;
    let subject = validate::id("subject", subject)?;
    Ok(match storage {
        Storage::Key => (keys::counter(scope, subject), String::new()),
        Storage::HashField => (keys::counter_hash(scope), String::from(subject)),
    })
}

/// Adds `delta` to a counter within its bounds.
#[derive(Debug, Clone)]
pub struct AddCounter {
    key: String,
    field: String,
    delta: i64,
    bounds: Bounds,
}

impl AddCounter {
    /// Validates and builds the operation.
    pub fn new(scope: &str, subject: &str, storage: Storage, delta: i64, bounds: Bounds) -> Result<Self, InputError> {
        let (key, field) = target(scope, subject, storage)?;
        validate::range("delta", delta, -MAX_VALUE, MAX_VALUE)?;
        bounds.validate()?;
        Ok(AddCounter { key, field, delta, bounds })
    }
}

/// Whether a change was applied in full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CounterStatus {
    /// All of the delta was applied.
    Applied,
    /// Part of it was applied: the value stopped at a bound.
    Clamped,
    /// None of it was applied (mode `reject`).
    Rejected,
}

/// The result of [`AddCounter`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CounterOutcome {
    /// The value after the call.
    pub value: i64,
    /// How much was actually added.
    pub applied: i64,
    /// Whether the delta was applied in full.
    pub status: CounterStatus,
}

impl Operation for AddCounter {
    type Outcome = CounterOutcome;
    const NAME: &'static str = "counter";

    fn request(&self) -> Request {
        let b = &self.bounds;
        Request::Script(Invocation {
            script: &COUNTER,
            keys: alloc::vec![self.key.clone()],
            args: alloc::vec![
                self.field.clone(),
                itoa_i(self.delta),
                itoa_i(b.min),
                b.max.map(itoa_i).unwrap_or_default(),
                String::from(b.mode.as_str()),
                itoa_i(b.ttl_ms),
            ],
        })
    }

    fn parse(&self, reply: Value) -> Result<CounterOutcome, ShapeError> {
        let [value, applied, flag] = reply.into_ints::<3>(Self::NAME)?;
        let status = match flag {
            0 => CounterStatus::Applied,
            1 => CounterStatus::Clamped,
            2 => CounterStatus::Rejected,
            _ => return Err(ShapeError::new(Self::NAME, "unknown status flag")),
        };
        Ok(CounterOutcome { value, applied, status })
    }
}

/// Reads a counter (0 when absent).
#[derive(Debug, Clone)]
pub struct GetCounter {
    key: String,
    field: String,
}

impl GetCounter {
    /// Validates and builds the operation.
    pub fn new(scope: &str, subject: &str, storage: Storage) -> Result<Self, InputError> {
        let (key, field) = target(scope, subject, storage)?;
        Ok(GetCounter { key, field })
    }
}

impl Operation for GetCounter {
    type Outcome = i64;
    const NAME: &'static str = "counter_get";

    fn request(&self) -> Request {
        Request::Command(if self.field.is_empty() {
            Command::new("GET").arg(self.key.clone())
        } else {
            Command::new("HGET").arg(self.key.clone()).arg(self.field.clone())
        })
    }

    fn parse(&self, reply: Value) -> Result<i64, ShapeError> {
        match reply {
            Value::Nil => Ok(0),
            v => v.to_int(Self::NAME),
        }
    }
}

impl super::Replayable for AddCounter {}
