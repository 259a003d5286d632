//! Once-per-window claim: the first caller in a window wins, the others learn when it ends.

use alloc::string::String;

use super::{Operation, opt_ms};
use crate::command::itoa_i;
use crate::error::{InputError, ShapeError};
use crate::keys;
use crate::script::{CLAIM, Invocation, Request};
use crate::validate;
use crate::value::Value;

/// Longest window: about 31 years in ms.
pub const MAX_WINDOW_MS: i64 = 1_000_000_000_000;

/// Takes the claim of `subject` for one window.
#[derive(Debug, Clone)]
pub struct Claim {
    key: String,
    window_ms: i64,
}

impl Claim {
    /// Validates and builds the operation.
    pub fn new(scope: &str, subject: &str, window_ms: i64) -> Result<Self, InputError> {
        let scope = validate::id("policy", scope)?;
        let subject = validate::id("subject", subject)?;
        validate::range("window_ms", window_ms, 1, MAX_WINDOW_MS)?;
        Ok(Claim { key: keys::claim(scope, subject), window_ms })
    }
}

/// The result of [`Claim`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimOutcome {
    /// True when this call took the claim.
    pub claimed: bool,
    /// Ms until the window ends and the claim can be taken again (`None`: no expiry set).
    pub window_left_ms: Option<i64>,
}

impl Operation for Claim {
    type Outcome = ClaimOutcome;
    const NAME: &'static str = "claim";

    fn request(&self) -> Request {
        Request::Script(Invocation {
            script: &CLAIM,
            keys: alloc::vec![self.key.clone()],
            args: alloc::vec![itoa_i(self.window_ms)],
        })
    }

    fn parse(&self, reply: Value) -> Result<ClaimOutcome, ShapeError> {
        let [claimed, left] = reply.into_ints::<2>(Self::NAME)?;
        Ok(ClaimOutcome { claimed: claimed == 1, window_left_ms: opt_ms(left) })
    }
}

impl super::Replayable for Claim {}
