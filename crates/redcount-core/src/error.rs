//! Error types, one per layer: bad input, a Redis error reply, a reply of the wrong shape.

use alloc::string::String;
use core::fmt;

/// Input refused by validation, before anything is sent to Redis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputError {
    /// The name of the offending field, as the HTTP API calls it.
    pub field: &'static str,
    /// What is wrong with it.
    pub problem: Problem,
}

/// What is wrong with an input field.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Problem {
    /// The field is required.
    Missing,
    /// Not a canonical decimal integer (no sign `+`, spaces, exponent, fraction, hex, leading zero).
    NotInteger,
    /// An integer outside `min..=max`.
    OutOfRange {
        /// Smallest accepted value.
        min: i64,
        /// Largest accepted value.
        max: i64,
    },
    /// An id outside the allow-list `[A-Za-z0-9_-]{1,64}`.
    BadId,
    /// A text longer than the limit, in bytes.
    TooLong {
        /// The limit in bytes.
        max: usize,
    },
    /// Not one of the accepted words.
    NotOneOf(&'static str),
    /// Fields that contradict each other.
    Inconsistent(&'static str),
    /// The wrong JSON type.
    WrongType(&'static str),
}

impl InputError {
    /// An error for `field`.
    pub const fn new(field: &'static str, problem: Problem) -> Self {
        InputError { field, problem }
    }
}

impl fmt::Display for InputError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let field = self.field;
        match &self.problem {
            Problem::Missing => write!(f, "{field} is required"),
            Problem::NotInteger => write!(f, "{field} must be a decimal integer"),
            Problem::OutOfRange { min, max } => write!(f, "{field} must be between {min} and {max}"),
            Problem::BadId => write!(f, "{field} must be 1 to 64 characters from A-Z a-z 0-9 _ -"),
            Problem::TooLong { max } => write!(f, "{field} must be at most {max} bytes"),
            Problem::NotOneOf(words) => write!(f, "{field} must be one of: {words}"),
            Problem::Inconsistent(why) => write!(f, "{field}: {why}"),
            Problem::WrongType(want) => write!(f, "{field} must be {want}"),
        }
    }
}

/// What kind of error reply Redis sent, for the cases a caller acts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// `NOSCRIPT`: the script cache lacks the script; resend it with EVAL.
    NoScript,
    /// `WRONGTYPE`: the key holds another type.
    WrongType,
    /// A redcount script refused its arguments (`ERR redcount: …`).
    Rejected,
    /// `CROSSSLOT`: keys of one call in different cluster slots.
    CrossSlot,
    /// `MOVED` / `ASK`: a cluster redirection the transport did not follow.
    Redirect,
    /// `BUSY` / `LOADING` / `TRYAGAIN` / `CLUSTERDOWN` / `MASTERDOWN` / `NOREPLICAS` (a
    /// master given `min-replicas-to-write` that has lost its replicas): nothing ran; try
    /// again later.
    Unavailable,
    /// `READONLY` / `NOPERM` / `NOAUTH`: not allowed.
    Denied,
    /// `OOM`: Redis is at `maxmemory` and refused the write as a whole (nothing written).
    OutOfMemory,
    /// `IDEMPOTENCY_CONFLICT`: the idempotency key was used before for a different request
    /// (nothing written; the first request's answer stands).
    IdempotencyConflict,
    /// `CONFLICT`: the call clashes with state a redcount script keeps (a reservation id in
    /// use, a settle naming other parts than its reservation's); nothing written.
    Conflict,
    /// Anything else.
    Other,
}

/// An error reply from Redis (or from the REST front, with the same text form).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorReply {
    /// Its classification.
    pub kind: ErrorKind,
    /// The full message, e.g. `NOSCRIPT No matching script. Please use EVAL.`
    pub message: String,
}

impl ErrorReply {
    /// Classifies an error message by its first word (and redcount's own prefix).
    pub fn new(message: impl Into<String>) -> Self {
        let message = message.into();
        let word = message.split(' ').next().unwrap_or("");
        let kind = match word {
            "NOSCRIPT" => ErrorKind::NoScript,
            "WRONGTYPE" => ErrorKind::WrongType,
            "CROSSSLOT" => ErrorKind::CrossSlot,
            "MOVED" | "ASK" => ErrorKind::Redirect,
            "BUSY" | "LOADING" | "TRYAGAIN" | "CLUSTERDOWN" | "MASTERDOWN" | "NOREPLICAS" => ErrorKind::Unavailable,
            "READONLY" | "NOPERM" | "NOAUTH" => ErrorKind::Denied,
            "OOM" => ErrorKind::OutOfMemory,
            "IDEMPOTENCY_CONFLICT" => ErrorKind::IdempotencyConflict,
            "CONFLICT" => ErrorKind::Conflict,
            // redcount's own refusals: the code ERR, then the word `redcount:` (compared as
            // bytes: a `str` search links more code into the worker's wasm).
            "ERR" if message.as_bytes().get(4..13) == Some(b"redcount:") => ErrorKind::Rejected,
            // A byte-window search: `str::contains` with a `&str` pattern links the two-way
            // searcher (kilobytes in the worker's wasm) for this one check.
            _ if message.as_bytes().windows(8).any(|w| w == b"NOSCRIPT") => ErrorKind::NoScript,
            _ => ErrorKind::Other,
        };
        ErrorReply { kind, message }
    }

    /// True for NOSCRIPT: the caller should resend the script with EVAL.
    pub fn is_noscript(&self) -> bool {
        self.kind == ErrorKind::NoScript
    }
}

impl fmt::Display for ErrorReply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// A reply that does not have the shape the operation expects (never a panic).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShapeError {
    /// The operation reading the reply.
    pub op: &'static str,
    /// What was expected.
    pub detail: &'static str,
}

impl ShapeError {
    /// A shape error of `op`.
    pub const fn new(op: &'static str, detail: &'static str) -> Self {
        ShapeError { op, detail }
    }
}

impl fmt::Display for ShapeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unexpected reply to {}: {}", self.op, self.detail)
    }
}

impl core::error::Error for InputError {}
impl core::error::Error for ErrorReply {}
impl core::error::Error for ShapeError {}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::ToString;

    /// Every refusal's message begins with the field it names, so a reader (and the API's
    /// `{"error", "field"}`) can tell which input is at fault.
    #[test]
    fn a_refusal_names_its_field_first() {
        let said = |problem| InputError::new("count", problem).to_string();
        assert_eq!(said(Problem::Missing), "count is required");
        assert_eq!(said(Problem::NotInteger), "count must be a decimal integer");
        assert_eq!(said(Problem::OutOfRange { min: 1, max: 9 }), "count must be between 1 and 9");
        assert_eq!(said(Problem::BadId), "count must be 1 to 64 characters from A-Z a-z 0-9 _ -");
        assert_eq!(said(Problem::TooLong { max: 8 }), "count must be at most 8 bytes");
        assert_eq!(said(Problem::NotOneOf("a, b")), "count must be one of: a, b");
        assert_eq!(said(Problem::Inconsistent("above max")), "count: above max");
        assert_eq!(said(Problem::WrongType("a number")), "count must be a number");
    }
}
