//! What can go wrong when running an operation, typed so callers decide without reading text.

use std::fmt;

use redcount_core::{ErrorReply, InputError, ShapeError};

/// A failed operation.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// Refused by validation: nothing was sent.
    Input(InputError),
    /// Redis answered with an error reply (its [`ErrorReply::kind`] says which).
    Redis(ErrorReply),
    /// Redis answered something the operation cannot read.
    Shape(ShapeError),
    /// The call did not complete: the backend was unreachable, the connection ended, or no
    /// answer came in time.
    Transport(Transport),
    /// The REST front refused the token.
    Unauthorized(String),
    /// The REST front answered something that is not a REST reply.
    Protocol(String),
    /// A setting that cannot be used (e.g. a malformed URL): nothing was sent.
    Config(String),
    /// The call ran and Redis answered, but fewer replicas than asked acknowledged its write
    /// within the wait ([`crate::direct::ReplicaWait`]): the write happened on the master and
    /// may be lost in a failover. Never a success.
    NotDurable(String),
}

/// Why a call did not complete, and what that means for the command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transport {
    /// False only when the command is known not to have reached Redis (the connection was
    /// refused): then retrying a write cannot apply it twice. True otherwise: a write may or
    /// may not have happened.
    pub may_have_run: bool,
    /// True when the time limit ran out.
    pub timed_out: bool,
    /// What happened, for people.
    pub detail: String,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Input(e) => write!(f, "bad input: {e}"),
            Error::Redis(e) => write!(f, "redis error: {e}"),
            Error::Shape(e) => write!(f, "{e}"),
            Error::Transport(t) => {
                let what = if t.timed_out { "no answer in time" } else { "unreachable" };
                let ran = if t.may_have_run { "; a write may or may not have happened" } else { "" };
                write!(f, "{what}: {}{ran}", t.detail)
            }
            Error::Unauthorized(e) => write!(f, "unauthorized: {e}"),
            Error::Protocol(e) => write!(f, "protocol error: {e}"),
            Error::Config(e) => write!(f, "bad setting: {e}"),
            Error::NotDurable(e) => write!(f, "not known durable: {e}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<InputError> for Error {
    fn from(e: InputError) -> Self {
        Error::Input(e)
    }
}
