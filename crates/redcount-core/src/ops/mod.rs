//! The primitives as typed operations.
//!
//! Each operation is built with `new` (which validates every input and fails with an
//! [`InputError`](crate::error::InputError) naming the field, before any Redis call can be
//! made), says what to send with [`Operation::request`], and reads the reply with
//! [`Operation::parse`]. The driver in between is the caller's:
//!
//! ```text
//!   op.request().command() ──send──▶ reply
//!        │ error NOSCRIPT? ──▶ script::Call::retry(&err) ──send──▶ reply
//!   op.parse(reply) ──▶ Outcome
//! ```

use crate::error::ShapeError;
use crate::keys::Namespace;
use crate::script::Request;
use crate::value::Value;

pub mod claim;
pub mod counter;
pub mod decision;
pub mod inbox;
pub mod quota;
pub mod redpacket;
pub mod reservation;
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

/// Makes a write replayable: the script stores its reply under a key in the same slot as the
/// object, for `ttl_ms`, and a replay (same suffix) returns it unchanged. A replay whose
/// `fingerprint` differs (same key, another request) is refused by the script. Only a call
/// that changed something stores its reply: one that changed nothing (denied, full, not a
/// holder, already claimed or stored, nothing applied, trimmed, reset, refunded or cleared)
/// stores nothing, so sent again under its key it is a new call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Idempotency {
    /// Unique per (route, client key): becomes `<object key>:idem:<suffix>`.
    pub suffix: alloc::string::String,
    /// Identifies the request body.
    pub fingerprint: alloc::string::String,
    /// How long the reply is kept, in ms.
    pub ttl_ms: i64,
}

/// How long idempotent replies are kept by default: 24 h.
pub const IDEMPOTENCY_TTL_MS: i64 = 86_400_000;

/// The longest `ttl_ms` an [`Idempotency`] may ask for (7 days): the scripts refuse a longer one.
pub const MAX_IDEMPOTENCY_TTL_MS: i64 = 7 * 86_400_000;
const _: () = assert!(IDEMPOTENCY_TTL_MS <= MAX_IDEMPOTENCY_TTL_MS);

impl Idempotency {
    /// From the key's `scope` (what makes two uses of one client key the same request: for
    /// the HTTP API its method, route and the key itself; any bytes the caller chooses) and
    /// the request's body in a canonical form (the fingerprint is a SHA-1 of these bytes).
    pub fn new(scope: &[u8], body: &[u8]) -> Self {
        // A digest, not the body itself: the fingerprint is stored with every reply.
        let digest = crate::sha1::hex(crate::sha1::digest(body));
        let fingerprint = alloc::string::String::from_utf8(digest.to_vec()).unwrap_or_default();
        Idempotency { suffix: hex(scope), fingerprint, ttl_ms: IDEMPOTENCY_TTL_MS }
    }

    /// Adds the reply key (after the script's own keys, named after the first of them) and the
    /// TTL and fingerprint (after its own arguments) to a script call.
    pub fn apply(&self, inv: &mut crate::script::Invocation) {
        let first = inv.keys.first().cloned().unwrap_or_default();
        self.apply_at(inv, &first);
    }

    /// `request` with this applied to its script, at `base` when given (else at its first
    /// key). Out of line: one copy, not one per replayable operation.
    #[inline(never)]
    fn applied(&self, request: Request, base: Option<alloc::string::String>) -> Request {
        match request {
            Request::Script(mut inv) => {
                match base {
                    Some(base) => self.apply_at(&mut inv, &base),
                    None => self.apply(&mut inv),
                }
                Request::Script(inv)
            }
            request => request,
        }
    }

    /// As [`Idempotency::apply`], the reply key named after `base` (a key in the call's slot).
    pub fn apply_at(&self, inv: &mut crate::script::Invocation, base: &str) {
        inv.keys.push(alloc::format!("{base}:idem:{}", self.suffix));
        inv.args.push(crate::command::itoa_i(self.ttl_ms));
        inv.args.push(self.fingerprint.clone());
    }
}

/// A write whose script can store its reply under an idempotency key (the scripts that call
/// the prelude's `idempotency`): only these can be made [`Idempotent`].
pub trait Replayable: Operation {
    /// The key the reply key is named after (`<base>:idem:<suffix>`), in the call's slot; by
    /// default the call's first key. An operation whose first key depends on the request's
    /// order (a decision's first part) names one that does not, so a key reused for another
    /// request is always found and refused.
    fn idempotency_base(&self) -> Option<alloc::string::String> {
        None
    }
}

/// An operation made replayable with an idempotency key, or left as it is (`None`): its
/// script gets the reply key after its own keys and the TTL and fingerprint after its own
/// arguments (see [`Idempotency`]); the outcome is the operation's own.
///
/// ```
/// use redcount_core::Operation;
/// use redcount_core::ops::{Idempotency, Idempotent, claim::Claim};
///
/// let idem = Idempotency::new(b"POST\n/api/claims/bonus/alice\nkey-1", b"{}");
/// let op = Idempotent::new(Claim::new("bonus", "alice", 60_000).unwrap(), Some(idem));
/// let parts = op.request().command().parts().to_vec();
/// assert_eq!(parts[2], "2"); // the claim's key and the reply key, in one slot
/// assert!(parts[4].starts_with(&parts[3][..]), "the reply key shares the claim key's slot");
/// ```
#[derive(Debug, Clone)]
pub struct Idempotent<O> {
    op: O,
    idem: Option<Idempotency>,
}

impl<O: Replayable> Idempotent<O> {
    /// `op`, replayable under `idem` when there is one.
    pub fn new(op: O, idem: Option<Idempotency>) -> Self {
        Idempotent { op, idem }
    }

    /// The operation itself.
    pub fn inner(&self) -> &O {
        &self.op
    }
}

impl<O: Replayable> Operation for Idempotent<O> {
    type Outcome = O::Outcome;
    const NAME: &'static str = O::NAME;

    fn request(&self) -> Request {
        match &self.idem {
            Some(i) => i.applied(self.op.request(), self.op.idempotency_base()),
            None => self.op.request(),
        }
    }

    fn parse(&self, reply: Value) -> Result<Self::Outcome, ShapeError> {
        self.op.parse(reply)
    }
}

/// An operation whose keys live in a [`Namespace`] other than the default `rc`; the outcome
/// is the operation's own.
///
/// ```
/// use redcount_core::Operation;
/// use redcount_core::keys::Namespace;
/// use redcount_core::ops::{Namespaced, claim::Claim};
///
/// let op = Namespaced::new(Claim::new("bonus", "alice", 60_000).unwrap(), Namespace::new("app2").unwrap());
/// assert_eq!(op.request().keys(), ["app2:{cl:bonus:alice}"]);
/// ```
#[derive(Debug, Clone)]
pub struct Namespaced<O> {
    op: O,
    ns: Namespace,
}

impl<O: Operation> Namespaced<O> {
    /// `op` with its keys in `ns`.
    pub fn new(op: O, ns: Namespace) -> Self {
        Namespaced { op, ns }
    }
}

impl<O: Operation> Operation for Namespaced<O> {
    type Outcome = O::Outcome;
    const NAME: &'static str = O::NAME;

    fn request(&self) -> Request {
        self.op.request().in_namespace(&self.ns)
    }

    fn parse(&self, reply: Value) -> Result<Self::Outcome, ShapeError> {
        self.op.parse(reply)
    }
}

fn hex(data: &[u8]) -> alloc::string::String {
    alloc::string::String::from_utf8(crate::sha1::hex(crate::sha1::digest(data)).to_vec()).unwrap_or_default()
}

/// Milliseconds, non-negative where the reply uses a negative number for "none".
pub(crate) fn opt_ms(n: i64) -> Option<i64> {
    if n >= 0 { Some(n) } else { None }
}
