//! Per-user inbox: a sorted set of messages by id, each stamped with its Unix time.
//!
//! Member layout (shared with existing deployments of this pattern): 4 bytes of Unix
//! time in seconds, little-endian, then the body.

use alloc::string::String;
use alloc::vec::Vec;

use super::Operation;
use crate::command::{Command, itoa_i};
use crate::error::{InputError, ShapeError};
use crate::keys;
use crate::script::{INBOX_APPEND, INBOX_TRIM, Invocation, Request};
use crate::validate;
use crate::value::Value;

/// Longest message body, in bytes.
pub const MAX_BODY: usize = 8 * 1024;
/// Most messages kept, and most returned by one read.
pub const MAX_LEN: i64 = 1_000_000;
/// Largest page of one read.
pub const MAX_PAGE: i64 = 1_000;
/// Longest TTL of an inbox: 1000 days in ms.
pub const MAX_TTL_MS: i64 = 86_400_000_000;

/// Appends a message (a retry with the same id is not stored twice).
#[derive(Debug, Clone)]
pub struct Append {
    key: String,
    id: i64,
    body: String,
    ttl_ms: i64,
    max_len: i64,
}

impl Append {
    /// Validates and builds the operation. `ttl_ms` applies when the message creates the
    /// inbox; the oldest messages beyond `max_len` are dropped.
    pub fn new(user: &str, id: i64, body: &str, ttl_ms: i64, max_len: i64) -> Result<Self, InputError> {
        let user = validate::id("user", user)?;
        validate::range("id", id, 0, validate::MAX_SAFE)?;
        let body = validate::text("body", body, MAX_BODY)?;
        validate::range("ttl_ms", ttl_ms, 1, MAX_TTL_MS)?;
        validate::range("max_len", max_len, 1, MAX_LEN)?;
        Ok(Append { key: keys::inbox(user), id, body: String::from(body), ttl_ms, max_len })
    }
}

/// The result of [`Append`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Appended {
    /// False when a message with this id was already there.
    pub stored: bool,
    /// Messages in the inbox after the call.
    pub length: i64,
}

impl Operation for Append {
    type Outcome = Appended;
    const NAME: &'static str = "inbox_append";

    fn request(&self) -> Request {
        Request::Script(Invocation {
            script: &INBOX_APPEND,
            keys: alloc::vec![self.key.clone()],
            args: alloc::vec![itoa_i(self.id), self.body.clone(), itoa_i(self.ttl_ms), itoa_i(self.max_len)],
        })
    }

    fn parse(&self, reply: Value) -> Result<Appended, ShapeError> {
        let [stored, length] = reply.into_ints::<2>(Self::NAME)?;
        Ok(Appended { stored: stored == 1, length })
    }
}

/// Reads up to `limit` messages with ids above `after`, oldest first.
#[derive(Debug, Clone)]
pub struct Read {
    key: String,
    after: Option<i64>,
    limit: i64,
}

impl Read {
    /// Validates and builds the operation; `after: None` reads from the start.
    pub fn new(user: &str, after: Option<i64>, limit: i64) -> Result<Self, InputError> {
        let user = validate::id("user", user)?;
        if let Some(a) = after {
            validate::range("after", a, 0, validate::MAX_SAFE)?;
        }
        validate::range("limit", limit, 1, MAX_PAGE)?;
        Ok(Read { key: keys::inbox(user), after, limit })
    }
}

/// One message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// Its id (the sorted-set score).
    pub id: i64,
    /// Unix time in seconds when it was appended.
    pub time: u32,
    /// The body bytes.
    pub body: Vec<u8>,
}

/// Decodes a member `le32 time ++ le64 id ++ body` of the message `id` (the id keeps equal
/// bodies distinct), or the first layout `le32 time ++ body`; `None` when it is shorter than
/// the stamp.
///
/// ```
/// use redcount_core::ops::inbox::decode_member;
/// let mut m = 7u32.to_le_bytes().to_vec();
/// m.extend_from_slice(&42u64.to_le_bytes());
/// m.extend_from_slice(b"hi");
/// assert_eq!(decode_member(&m, 42), Some((7, &b"hi"[..])));
/// assert_eq!(decode_member(&[7, 0, 0, 0, b'h', b'i'], 42), Some((7, &b"hi"[..])));
/// ```
pub fn decode_member(member: &[u8], id: i64) -> Option<(u32, &[u8])> {
    let (stamp, rest) = member.split_first_chunk::<4>()?;
    let body = match rest.split_first_chunk::<8>() {
        Some((tag, body)) if u64::try_from(id).is_ok_and(|id| *tag == id.to_le_bytes()) => body,
        _ => rest,
    };
    Some((u32::from_le_bytes(*stamp), body))
}

/// Parses a score that Redis printed with `%.17g`.
fn score(v: &Value, op: &'static str) -> Result<i64, ShapeError> {
    if let Ok(n) = v.to_int(op) {
        return Ok(n);
    }
    if let Value::Bytes(b) = v
        && let Some(n) = core::str::from_utf8(b).ok().and_then(|s| crate::text::whole_number(s, validate::MAX_SAFE))
    {
        return Ok(n);
    }
    Err(ShapeError::new(op, "score is not an integer"))
}

impl Operation for Read {
    type Outcome = Vec<Message>;
    const NAME: &'static str = "inbox_read";

    fn request(&self) -> Request {
        let min = match self.after {
            Some(a) => {
                let mut s = String::from("(");
                s.push_str(&itoa_i(a));
                s
            }
            None => String::from("-inf"),
        };
        Request::Command(
            Command::new("ZRANGEBYSCORE")
                .arg(self.key.clone())
                .arg(min)
                .arg("+inf")
                .arg("WITHSCORES")
                .arg("LIMIT")
                .arg("0")
                .arg(itoa_i(self.limit)),
        )
    }

    fn parse(&self, reply: Value) -> Result<Vec<Message>, ShapeError> {
        let mut items = reply.into_array(Self::NAME)?;
        // RESP3 sends WITHSCORES as [member, score] pairs; RESP2 (and REST) flat.
        if !items.is_empty() && items.iter().all(|v| matches!(v, Value::Array(pair) if pair.len() == 2)) {
            items =
                items.into_iter().flat_map(|v| if let Value::Array(pair) = v { pair } else { Vec::new() }).collect();
        }
        if items.len() % 2 != 0 {
            return Err(ShapeError::new(Self::NAME, "odd WITHSCORES reply"));
        }
        let mut out = Vec::with_capacity(items.len() / 2);
        for pair in items.chunks_exact(2) {
            let id = score(&pair[1], Self::NAME)?;
            let Value::Bytes(member) = &pair[0] else {
                return Err(ShapeError::new(Self::NAME, "member is not a string"));
            };
            // A member without a stamp was not written by redcount: time 0, all bytes body.
            let (time, body) = decode_member(member, id).unwrap_or((0, member));
            out.push(Message { id, time, body: body.to_vec() });
        }
        Ok(out)
    }
}

/// Drops expired messages (oldest first), caps the length, deletes an empty inbox.
#[derive(Debug, Clone)]
pub struct Trim {
    key: String,
    max_age_s: i64,
    max_len: i64,
    scan: i64,
}

/// Longest max age: about 31 years in s.
pub const MAX_AGE_S: i64 = 1_000_000_000;
/// Most of the oldest messages examined for expiry by one trim.
pub const MAX_SCAN: i64 = 100_000;

impl Trim {
    /// Validates and builds the operation.
    pub fn new(user: &str, max_age_s: i64, max_len: i64, scan: i64) -> Result<Self, InputError> {
        let user = validate::id("user", user)?;
        validate::range("max_age_s", max_age_s, 1, MAX_AGE_S)?;
        validate::range("max_len", max_len, 1, MAX_LEN)?;
        validate::range("scan", scan, 1, MAX_SCAN)?;
        Ok(Trim { key: keys::inbox(user), max_age_s, max_len, scan })
    }
}

/// The result of [`Trim`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Trimmed {
    /// Messages removed.
    pub deleted: i64,
    /// Stamp of the newest remaining message; `None` when the inbox is now empty.
    pub newest_time: Option<i64>,
}

impl Operation for Trim {
    type Outcome = Trimmed;
    const NAME: &'static str = "inbox_trim";

    fn request(&self) -> Request {
        Request::Script(Invocation {
            script: &INBOX_TRIM,
            keys: alloc::vec![self.key.clone()],
            args: alloc::vec![itoa_i(self.max_age_s), itoa_i(self.max_len), itoa_i(self.scan)],
        })
    }

    fn parse(&self, reply: Value) -> Result<Trimmed, ShapeError> {
        let [deleted, newest] = reply.into_ints::<2>(Self::NAME)?;
        Ok(Trimmed { deleted, newest_time: if newest > 0 { Some(newest) } else { None } })
    }
}

impl super::Replayable for Append {}

impl super::Replayable for Trim {}
