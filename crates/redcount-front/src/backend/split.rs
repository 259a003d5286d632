//! Bounding each reply on a shared, pipelined connection.
//!
//! A connection that many requests share carries their replies back to back, so the count of
//! bytes read says nothing about one request, and cutting the stream would fail every request
//! on it. Instead the stream is read reply by reply ([`Framing`] finds where each ends): a
//! reply of at most [`SMALL`] bytes is passed on to redis-rs as it is; a larger one is kept
//! aside (charged to the budget of large replies in flight), whole, and redis-rs is handed a
//! short marker in its place, by which the request that gets it takes it back ([`Aside`]); one
//! past the bound is not kept (its bytes are read and dropped) and its marker says so. The
//! replies keep their order, so each marker reaches the request the reply was for, and the
//! other requests on the connection are not touched.
//!
//! A marker is an error reply carrying a secret of the process's (never answered to a
//! client), so a script that answers an error of the same shape is not taken for one.

use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use redis::{RedisError, Value};
use tokio::io::{AsyncRead, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::pool::Charge;

/// Replies up to this many bytes pass through as they are (and are not charged to the budget
/// of large replies, as on a connection of one's own).
pub(super) const SMALL: usize = 16 * 1024;

/// The error code of a marker.
const CODE: &str = "REDCOUNT-ASIDE";

/// Deepest nesting of aggregates followed; Redis's own script replies stop far short of it
/// (its Lua stack), so a deeper reply is taken for a broken stream.
const MAX_DEPTH: usize = 4096;

/// Where RESP2/RESP3 replies end, fed a stream's bytes as they come.
#[derive(Default, Debug)]
pub(super) struct Framing {
    /// Elements still to come in each open aggregate, outermost first.
    open: Vec<u64>,
    at: At,
}

#[derive(Default, Debug)]
enum At {
    /// At the type byte of the next element.
    #[default]
    Start,
    /// In a header or line of type `kind`: the number read so far, and whether it is negative.
    Line { kind: u8, n: u64, negative: bool },
    /// In a bulk payload: bytes left, its closing CRLF included.
    Payload(u64),
}

impl Framing {
    /// Reads `data` on from where the last call stopped: `Some(n)` when the current reply
    /// ends after its first `n` bytes (the rest is the next reply's), `None` when all of it
    /// belongs to a reply not yet ended. Fails on bytes that are not RESP.
    pub(super) fn feed(&mut self, data: &[u8]) -> io::Result<Option<usize>> {
        let mut i = 0;
        while i < data.len() {
            match &mut self.at {
                At::Payload(left) => {
                    let take = (*left).min((data.len() - i) as u64);
                    *left -= take;
                    i += take as usize;
                    if *left == 0 {
                        self.at = At::Start;
                        if self.element_ended() {
                            return Ok(Some(i));
                        }
                    }
                }
                At::Start => {
                    let kind = data[i];
                    if !b"+-:,(#_$!=*~>%|".contains(&kind) {
                        return Err(broken("a reply starting with an unknown type byte"));
                    }
                    self.at = At::Line { kind, n: 0, negative: false };
                    i += 1;
                }
                At::Line { kind, n, negative } => {
                    let rest = &data[i..];
                    let end = rest.iter().position(|&b| b == b'\n');
                    if b"$!=*~>%|".contains(kind) {
                        for &b in &rest[..end.unwrap_or(rest.len())] {
                            match b {
                                b'0'..=b'9' => *n = n.saturating_mul(10).saturating_add(u64::from(b - b'0')),
                                b'-' => *negative = true,
                                b'\r' => {}
                                _ => return Err(broken("a length that is not a number")),
                            }
                        }
                    }
                    let Some(end) = end else { return Ok(None) };
                    i += end + 1;
                    let (kind, n, negative) = (*kind, *n, *negative);
                    self.at = At::Start;
                    if self.header_ended(kind, n, negative)? {
                        return Ok(Some(i));
                    }
                }
            }
        }
        Ok(None)
    }

    /// A line of `kind` (with its number) has ended: true when that ended the reply.
    fn header_ended(&mut self, kind: u8, n: u64, negative: bool) -> io::Result<bool> {
        let elements = match kind {
            b'$' | b'!' | b'=' if !negative => {
                self.at = At::Payload(n.saturating_add(2));
                return Ok(false);
            }
            b'*' | b'~' | b'>' if !negative => n,
            b'%' if !negative => n.saturating_mul(2),
            // An attribute: its pairs, then the element it describes.
            b'|' => n.saturating_mul(2).saturating_add(1),
            _ => 0,
        };
        if elements == 0 {
            return Ok(self.element_ended());
        }
        if self.open.len() >= MAX_DEPTH {
            return Err(broken("a reply nested deeper than any Redis sends"));
        }
        self.open.push(elements);
        Ok(false)
    }

    /// An element has ended: true when that ended the reply.
    fn element_ended(&mut self) -> bool {
        while let Some(left) = self.open.last_mut() {
            *left -= 1;
            if *left > 0 {
                return false;
            }
            self.open.pop();
        }
        true
    }
}

fn broken(why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("Redis sent {why}"))
}

/// What took the place of a reply on a shared connection.
#[derive(Debug)]
pub(super) enum Marked {
    /// A reply larger than [`SMALL`] kept aside: its bytes, and what it holds of the budget.
    Large(Vec<u8>, Option<OwnedSemaphorePermit>),
    /// A reply past the bound (not kept).
    TooLarge,
    /// A reply refused by the budget of large replies in flight (not kept).
    BudgetSpent,
}

/// A large reply kept aside: since when, its bytes, what it holds of the budget.
type Kept = (Instant, Vec<u8>, Option<OwnedSemaphorePermit>);

/// The large replies of a backend's shared connections, each until the request it was for
/// takes it back; one not taken back within `keep` (its request gave up) is dropped.
pub(super) struct Aside {
    secret: String,
    next: AtomicU64,
    kept: Mutex<HashMap<u64, Kept>>,
    keep: Duration,
    /// `--max-response-bytes`.
    pub(super) bound: usize,
}

impl Aside {
    /// Replies up to `bound` bytes kept aside, each for at most `keep`.
    pub(super) fn new(bound: usize, keep: Duration) -> Self {
        Aside { secret: secret(), next: AtomicU64::new(0), kept: Mutex::new(HashMap::new()), keep, bound }
    }

    /// The marker for `what`, which is kept until taken back. Whatever was kept longer than
    /// `keep` goes (with what it held of the budget) at every marker, refusals included.
    fn mark(&self, what: Marked) -> Vec<u8> {
        let now = Instant::now();
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        kept.retain(|_, (at, _, _)| now.duration_since(*at) < self.keep);
        let tag = match what {
            Marked::Large(bytes, permit) => {
                let id = self.next.fetch_add(1, Ordering::Relaxed);
                kept.insert(id, (now, bytes, permit));
                id.to_string()
            }
            Marked::TooLarge => "too-large".to_string(),
            Marked::BudgetSpent => "budget-spent".to_string(),
        };
        format!("-{CODE} {} {tag}\r\n", self.secret).into_bytes()
    }

    /// What `e` marks, if it is one of this backend's markers (taken back: it is given once).
    pub(super) fn taken(&self, e: &RedisError) -> Option<Marked> {
        if e.code() != Some(CODE) {
            return None;
        }
        self.claim(e.detail()?)
    }

    /// What the marker `value` stands for, if it is one (an error reply in a pipeline's replies).
    pub(super) fn taken_value(&self, value: &Value) -> Option<Marked> {
        match value {
            Value::ServerError(e) if e.code() == CODE => self.claim(e.details()?),
            _ => None,
        }
    }

    fn claim(&self, detail: &str) -> Option<Marked> {
        let (secret, tag) = detail.split_once(' ')?;
        if secret != self.secret {
            return None;
        }
        match tag {
            "too-large" => Some(Marked::TooLarge),
            "budget-spent" => Some(Marked::BudgetSpent),
            id => {
                let id = id.parse().ok()?;
                let (_, bytes, permit) = self.kept.lock().unwrap_or_else(|e| e.into_inner()).remove(&id)?;
                Some(Marked::Large(bytes, permit))
            }
        }
    }
}

/// A secret no reply from Redis can know: 128 bits from the system's random source.
fn secret() -> String {
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; 16];
    ring::rand::SystemRandom::new().fill(&mut bytes).expect("the system's random source");
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The reading side of a shared connection: the replies read from Redis, as redis-rs is to
/// see them.
pub(super) struct Split {
    aside: Arc<Aside>,
    budget: Option<Arc<Semaphore>>,
    framing: Framing,
    /// The current reply's bytes so far (unless it is being dropped).
    reply: Vec<u8>,
    charge: Charge,
    /// The current reply is past the bound or the budget: its bytes are dropped.
    dropping: bool,
    /// Bytes for redis-rs, from `given` on.
    ready: Vec<u8>,
    given: usize,
    /// The buffer Redis's bytes are read into.
    raw: Box<[u8]>,
    /// The stream ended or failed: its connection is not to be used again.
    pub(super) ended: bool,
}

impl Split {
    pub(super) fn new(aside: Arc<Aside>, budget: Option<Arc<Semaphore>>) -> Self {
        Split {
            aside,
            charge: Charge::new(budget.clone(), SMALL),
            budget,
            framing: Framing::default(),
            reply: Vec::new(),
            dropping: false,
            ready: Vec::new(),
            given: 0,
            raw: vec![0; 16 * 1024].into_boxed_slice(),
            ended: false,
        }
    }

    /// Reads `inner` for redis-rs into `buf`: each reply whole, or its marker, in its place.
    pub(super) fn poll_read<S: AsyncRead + Unpin>(
        &mut self,
        inner: &mut S,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            let ready = self.ready();
            if !ready.is_empty() || buf.remaining() == 0 {
                let n = ready.len().min(buf.remaining());
                buf.put_slice(&ready[..n]);
                self.gave(n);
                return Poll::Ready(Ok(()));
            }
            let mut raw = ReadBuf::new(&mut self.raw);
            let polled = Pin::new(&mut *inner).poll_read(cx, &mut raw);
            let n = raw.filled().len();
            let taken = match polled {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(())) if n == 0 => Ok(false),
                Poll::Ready(Ok(())) => self.take_raw(n).map(|()| true),
                Poll::Ready(Err(e)) => Err(e),
            };
            match taken {
                Ok(true) => {}
                ended => {
                    self.ended = true;
                    return Poll::Ready(ended.map(|_| ()));
                }
            }
        }
    }

    /// Bytes ready for redis-rs, if any.
    pub(super) fn ready(&self) -> &[u8] {
        &self.ready[self.given..]
    }

    /// `n` of the ready bytes were handed on.
    pub(super) fn gave(&mut self, n: usize) {
        self.given += n;
        if self.given == self.ready.len() {
            self.ready.clear();
            self.given = 0;
        }
    }

    /// Takes in the first `n` bytes of `raw`, read from Redis.
    pub(super) fn take_raw(&mut self, n: usize) -> io::Result<()> {
        let raw = std::mem::take(&mut self.raw);
        let taken = self.take(&raw[..n]);
        self.raw = raw;
        taken
    }

    /// Takes in `data`, read from Redis: ends of replies make them ready, as they are or as
    /// markers.
    pub(super) fn take(&mut self, mut data: &[u8]) -> io::Result<()> {
        while !data.is_empty() {
            let ended = self.framing.feed(data)?;
            let (part, rest) = data.split_at(ended.unwrap_or(data.len()));
            data = rest;
            if !self.dropping {
                self.reply.extend_from_slice(part);
                if self.reply.len() > SMALL {
                    let refused = if self.reply.len() > self.aside.bound {
                        Some(Marked::TooLarge)
                    } else if !self.charge.add(part.len()) {
                        Some(Marked::BudgetSpent)
                    } else {
                        None
                    };
                    if let Some(refused) = refused {
                        // Said at once, in its place; the rest of its bytes are dropped.
                        self.dropping = true;
                        self.reply = Vec::new();
                        self.charge = Charge::new(self.budget.clone(), SMALL);
                        let marker = self.aside.mark(refused);
                        self.ready.extend_from_slice(&marker);
                    }
                } else {
                    // Small so far: free of charge, but counted for when it grows past SMALL.
                    let _ = self.charge.add(part.len());
                }
            }
            if ended.is_some() {
                self.reply_ended();
            }
        }
        Ok(())
    }

    fn reply_ended(&mut self) {
        let charge = std::mem::replace(&mut self.charge, Charge::new(self.budget.clone(), SMALL));
        if std::mem::take(&mut self.dropping) {
            return;
        }
        if self.reply.len() <= SMALL {
            self.ready.extend_from_slice(&self.reply);
            self.reply.clear();
        } else {
            let bytes = std::mem::take(&mut self.reply);
            let marker = self.aside.mark(Marked::Large(bytes, charge.into_held()));
            self.ready.extend_from_slice(&marker);
        }
    }
}

#[cfg(test)]
mod tests;
