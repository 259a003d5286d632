//! The primitives as typed operations.
//!
//! Each operation is built with `new` (which validates every input and fails with an
//! [`InputError`](crate::error::InputError) naming the field, before any Redis call can be
//! made), says what to send with [`Operation::request`], and reads the reply with
//! [`Operation::parse`]. The driver in between is the caller's:
//!
//! ```text
//!   op.request().command() ──send──▶ reply
//!        │ error NOSCRIPT? ──▶ request().fallback(&err) ──send──▶ reply
//!   op.parse(reply) ──▶ Outcome
//! ```

use crate::error::ShapeError;
use crate::script::Request;
use crate::value::Value;

pub mod claim;
pub mod counter;
pub mod inbox;
pub mod quota;
pub mod redpacket;
pub mod semaphore;

/// A validated operation: what to send and how to read the answer.
pub trait Operation {
    /// The typed result.
    type Outcome;
    /// The operation's name, for errors and logs.
    const NAME: &'static str;
    /// What to send.
    fn request(&self) -> Request;
    /// Reads a successful reply. A reply of another shape is an error, never a panic.
    fn parse(&self, reply: Value) -> Result<Self::Outcome, ShapeError>;
}

/// Milliseconds, non-negative where the reply uses a negative number for "none".
pub(crate) fn opt_ms(n: i64) -> Option<i64> {
    if n >= 0 { Some(n) } else { None }
}
