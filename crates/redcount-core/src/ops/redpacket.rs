//! Red packets: a total pre-split into random shares, each user grabbing at most one.

use alloc::string::String;
use alloc::vec::Vec;
use rand_core::RngCore;

use super::Operation;
use crate::command::{Command, itoa_i};
use crate::error::{InputError, ShapeError};
use crate::keys;
use crate::script::{Invocation, REDPACKET_CREATE, REDPACKET_GRAB, REDPACKET_STATUS, Request};
use crate::split;
use crate::validate;
use crate::value::Value;

/// Longest life of a packet: 30 days in ms.
pub const MAX_TTL_MS: i64 = 30 * 86_400_000;
/// Largest page of grab records.
pub const MAX_PAGE: i64 = 1_000;

/// The packet id for a create carrying an idempotency key: derived from it, so that a replay
/// addresses the same packet (and the same cluster slot) as the first call, keyed with the
/// server's `secret` (HMAC-SHA-1), so nobody can predict the id of another client's key.
pub fn id_for(idem: &super::Idempotency, secret: &[u8]) -> String {
    let mac = crate::sha1::hmac(secret, idem.suffix.as_bytes());
    String::from_utf8(crate::sha1::hex(mac).to_vec()).map(|h| String::from(&h[..32])).unwrap_or_default()
}

/// A fresh random packet id: 32 hex digits (128 bits, so ids never collide).
pub fn new_id<R: RngCore + ?Sized>(rng: &mut R) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut bytes = [0u8; 16];
    rng.fill_bytes(&mut bytes);
    bytes.iter().flat_map(|b| [HEX[(b >> 4) as usize] as char, HEX[(b & 0xf) as usize] as char]).collect()
}

/// Creates a packet: the core splits the total, one script stores everything.
#[derive(Debug, Clone)]
pub struct Create {
    keys: [String; 4],
    total: i64,
    shares: Vec<i64>,
    ttl_ms: i64,
}

impl Create {
    /// Validates, splits `total_cents` into `count` shares of at least `min_cents`.
    pub fn new<R: RngCore + ?Sized>(
        id: &str,
        total_cents: i64,
        count: i64,
        min_cents: i64,
        ttl_ms: i64,
        rng: &mut R,
    ) -> Result<Self, InputError> {
        let id = validate::id("id", id)?;
        validate::range("ttl_ms", ttl_ms, 1, MAX_TTL_MS)?;
        let shares = split::split(total_cents, count, min_cents, rng)?;
        Ok(Create { keys: keys::redpacket(id), total: total_cents, shares, ttl_ms })
    }

    /// The shares, in the order they will be handed out.
    pub fn shares(&self) -> &[i64] {
        &self.shares
    }
}

/// The result of [`Create`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Created {
    /// False when a packet with this id already exists (nothing was written).
    pub created: bool,
    /// When the packet expires, in ms since the Unix epoch (server time).
    pub expires_at_ms: i64,
}

impl Operation for Create {
    type Outcome = Created;
    const NAME: &'static str = "redpacket_create";

    fn request(&self) -> Request {
        let mut args = Vec::with_capacity(self.shares.len() + 2);
        args.push(itoa_i(self.ttl_ms));
        args.push(itoa_i(self.total));
        args.extend(self.shares.iter().map(|s| itoa_i(*s)));
        Request::Script(Invocation { script: &REDPACKET_CREATE, keys: self.keys.to_vec(), args })
    }

    fn parse(&self, reply: Value) -> Result<Created, ShapeError> {
        let [created, expires_at_ms] = reply.into_ints::<2>(Self::NAME)?;
        Ok(Created { created: created == 1, expires_at_ms })
    }
}

/// One user grabs a share.
#[derive(Debug, Clone)]
pub struct Grab {
    keys: [String; 4],
    user: String,
}

impl Grab {
    /// Validates and builds the operation.
    pub fn new(id: &str, user: &str) -> Result<Self, InputError> {
        let id = validate::id("id", id)?;
        let user = validate::id("user", user)?;
        Ok(Grab { keys: keys::redpacket(id), user: String::from(user) })
    }
}

/// The result of [`Grab`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GrabOutcome {
    /// This call won a share.
    Won {
        /// The share, in cents.
        amount: i64,
        /// Its position in grab order, from 1.
        index: i64,
        /// Shares left.
        remaining: i64,
    },
    /// The user had already won this share (retries are idempotent).
    Already {
        /// The share, in cents.
        amount: i64,
        /// Its position in grab order.
        index: i64,
    },
    /// No share left.
    Empty,
    /// No such packet, or it expired.
    NotFound,
}

impl Operation for Grab {
    type Outcome = GrabOutcome;
    const NAME: &'static str = "redpacket_grab";

    fn request(&self) -> Request {
        Request::Script(Invocation {
            script: &REDPACKET_GRAB,
            keys: self.keys.to_vec(),
            args: alloc::vec![self.user.clone()],
        })
    }

    fn parse(&self, reply: Value) -> Result<GrabOutcome, ShapeError> {
        let [code, amount, index, remaining] = reply.into_ints::<4>(Self::NAME)?;
        Ok(match code {
            1 => GrabOutcome::Won { amount, index, remaining },
            2 => GrabOutcome::Already { amount, index },
            0 => GrabOutcome::Empty,
            -1 => GrabOutcome::NotFound,
            _ => return Err(ShapeError::new(Self::NAME, "unknown outcome code")),
        })
    }
}

/// Reads a packet's status.
#[derive(Debug, Clone)]
pub struct ReadStatus {
    keys: [String; 4],
}

impl ReadStatus {
    /// Validates and builds the operation.
    pub fn new(id: &str) -> Result<Self, InputError> {
        Ok(ReadStatus { keys: keys::redpacket(validate::id("id", id)?) })
    }
}

/// A packet's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PacketStatus {
    /// Total in cents.
    pub total: i64,
    /// Number of shares.
    pub count: i64,
    /// Shares not yet grabbed.
    pub remaining: i64,
    /// Shares grabbed.
    pub grabbed: i64,
    /// Sum of the grabbed shares, in cents.
    pub grabbed_sum: i64,
    /// Creation time, ms since the epoch.
    pub created_ms: i64,
    /// Expiry time, ms since the epoch.
    pub expires_ms: i64,
}

impl Operation for ReadStatus {
    /// `None` when the packet is unknown or expired.
    type Outcome = Option<PacketStatus>;
    const NAME: &'static str = "redpacket_status";

    fn request(&self) -> Request {
        Request::Script(Invocation { script: &REDPACKET_STATUS, keys: self.keys[..2].to_vec(), args: Vec::new() })
    }

    fn parse(&self, reply: Value) -> Result<Option<PacketStatus>, ShapeError> {
        let [found, total, count, remaining, grabbed, grabbed_sum, created_ms, expires_ms] =
            reply.into_ints::<8>(Self::NAME)?;
        Ok((found == 1).then_some(PacketStatus {
            total,
            count,
            remaining,
            grabbed,
            grabbed_sum,
            created_ms,
            expires_ms,
        }))
    }
}

/// Reads a page of grab records, in grab order.
#[derive(Debug, Clone)]
pub struct ReadGrabs {
    log: String,
    offset: i64,
    limit: i64,
}

impl ReadGrabs {
    /// Validates and builds the operation.
    pub fn new(id: &str, offset: i64, limit: i64) -> Result<Self, InputError> {
        let [_, _, _, log] = keys::redpacket(validate::id("id", id)?);
        validate::range("offset", offset, 0, split::MAX_COUNT)?;
        validate::range("limit", limit, 1, MAX_PAGE)?;
        Ok(ReadGrabs { log, offset, limit })
    }
}

/// One grab record (from the packet's append-only grab log).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrabRecord {
    /// Who won.
    pub user: String,
    /// The share, in cents.
    pub amount: i64,
    /// Position in grab order, from 1.
    pub index: i64,
    /// When, in ms since the epoch (server time).
    pub at_ms: i64,
}

impl Operation for ReadGrabs {
    type Outcome = Vec<GrabRecord>;
    const NAME: &'static str = "redpacket_grabs";

    fn request(&self) -> Request {
        Request::Command(
            Command::new("LRANGE")
                .arg(self.log.clone())
                .arg(itoa_i(self.offset))
                .arg(itoa_i(self.offset + self.limit - 1)),
        )
    }

    fn parse(&self, reply: Value) -> Result<Vec<GrabRecord>, ShapeError> {
        let bad = || ShapeError::new(Self::NAME, "malformed grab record");
        reply
            .into_array(Self::NAME)?
            .into_iter()
            .map(|v| {
                let s = v.into_string(Self::NAME)?;
                let mut it = s.split(':');
                let (Some(user), Some(a), Some(i), Some(t), None) =
                    (it.next(), it.next(), it.next(), it.next(), it.next())
                else {
                    return Err(bad());
                };
                // In the text the grab script writes: positive amounts and indexes, a time not
                // before the epoch; a record edited by hand is refused, not listed.
                let num = |x: &str, min: i64| {
                    crate::validate::int_str("record", x, min, crate::validate::MAX_SAFE).map_err(|_| bad())
                };
                Ok(GrabRecord { user: String::from(user), amount: num(a, 1)?, index: num(i, 1)?, at_ms: num(t, 0)? })
            })
            .collect()
    }
}

impl super::Replayable for Create {}
