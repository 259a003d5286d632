//! The Lua scripts, their SHA-1 names, and the EVALSHA / EVAL commands that run them.
//!
//! Sending a command and retrying once on NOSCRIPT is the caller's job; this module only
//! builds the two commands (`Request::command`, then `Request::fallback` on NOSCRIPT).

use alloc::string::String;
use alloc::vec::Vec;

use crate::command::{Command, itoa};
use crate::error::ErrorReply;
use crate::sha1;

/// A Lua script shipped with redcount: its source is its parts one after the other. Two
/// scripts are equal when their parts are.
#[derive(Debug, PartialEq, Eq)]
pub struct Script {
    name: &'static str,
    parts: &'static [&'static str],
    sha1: [u8; 40],
}

impl Script {
    /// A script of `parts` (at most 16), with the SHA-1 of their concatenation computed at
    /// compile time.
    pub const fn new(name: &'static str, parts: &'static [&'static str]) -> Self {
        Script { name, parts, sha1: sha1::hex(sha1::digest_strs(parts)) }
    }

    /// The file name without `.lua`.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The Lua source, as sent by EVAL and SCRIPT LOAD: the parts joined (only those two
    /// need the text; EVALSHA sends the SHA-1).
    pub fn source(&self) -> String {
        self.parts.concat()
    }

    /// The SHA-1 of the source in lowercase hex: the name EVALSHA uses.
    pub fn sha1(&self) -> &str {
        // Always ASCII hex digits.
        core::str::from_utf8(&self.sha1).unwrap_or("")
    }
}

macro_rules! scripts {
    ($($(#[$doc:meta])* $id:ident = $file:literal $shebang:literal $(first $head:literal)? [$($lib:literal),*];)*) => {
        // Each script is sent as shebang + its fast path if it has one (`first`: code that must
        // run before the prelude defines anything; fast_fixed.lua says why) + prelude.lua +
        // the lib_*.lua files it uses + its own file (their comment lines left empty by
        // build.rs): self-contained for EVAL, one copy of the shared helpers and of each
        // algorithm in the repository (a quota script and a compound decision run the same
        // functions). The shebang makes Redis refuse a writing script as a whole at
        // maxmemory (OOM, nothing written) instead of letting it write once its first write
        // passed; reading scripts say `no-writes`.
        // Kept as parts, not one string per script: the same file's text is one constant in
        // the binary (the prelude was repeated in every script, in the worker's bundle too).
        $( $(#[$doc])* pub static $id: Script = Script::new(
            $file,
            &[
                concat!($shebang, "\n"),
                $(include_str!(concat!(env!("OUT_DIR"), "/lua/", $head, ".lua")),)?
                include_str!(concat!(env!("OUT_DIR"), "/lua/prelude.lua")),
                $(include_str!(concat!(env!("OUT_DIR"), "/lua/", $lib, ".lua")),)*
                include_str!(concat!(env!("OUT_DIR"), "/lua/", $file, ".lua")),
            ],
        ); )*
        /// Every script, e.g. to `SCRIPT LOAD` them ahead of time.
        pub static ALL: &[&Script] = &[$(&$id),*];
    };
}

scripts! {
    /// Bounded counter: clamp or reject at min/max.
    COUNTER = "counter" "#!lua" [];
    /// Once-per-window claim.
    CLAIM = "claim" "#!lua" [];
    /// Quota, fixed window.
    QUOTA_FIXED = "quota_fixed" "#!lua" first "fast_fixed" ["lib_take", "lib_fixed"];
    /// Quota, sliding window log.
    QUOTA_SLIDING = "quota_sliding" "#!lua" ["lib_take", "lib_sliding"];
    /// Quota, token bucket.
    QUOTA_BUCKET = "quota_bucket" "#!lua" ["lib_take", "lib_bucket"];
    /// Quota, GCRA.
    QUOTA_GCRA = "quota_gcra" "#!lua" ["lib_take", "lib_gcra"];
    /// Quota: set or clear a subject's override of the size.
    QUOTA_OVERRIDE = "quota_override" "#!lua" [];
    /// Quota: give units back.
    QUOTA_REFUND = "quota_refund" "#!lua" ["lib_fixed", "lib_sliding", "lib_bucket", "lib_gcra", "lib_give"];
    /// Quota: forget a subject's usage.
    QUOTA_RESET = "quota_reset" "#!lua" [];
    /// Quota, fixed window: budget leases (borrow a slice of the limit, give back the rest).
    QUOTA_LEASE = "quota_lease" "#!lua" ["lib_fixed"];
    /// Semaphore with leases.
    SEMAPHORE = "semaphore" "#!lua" ["lib_lease"];
    /// A compound decision: several quotas and a semaphore lease of one subject, all or nothing.
    DECIDE = "decide" "#!lua" ["lib_fixed", "lib_sliding", "lib_bucket", "lib_gcra", "lib_lease"];
    /// A reservation: several quotas and leases of one subject held, all or nothing.
    RESERVE = "reserve" "#!lua" ["lib_fixed", "lib_sliding", "lib_bucket", "lib_gcra", "lib_give", "lib_lease", "lib_reserve"];
    /// A reservation's settle, extend or release.
    SETTLE = "settle" "#!lua" ["lib_fixed", "lib_sliding", "lib_bucket", "lib_gcra", "lib_give", "lib_lease", "lib_reserve"];
    /// Inbox: append a message.
    INBOX_APPEND = "inbox_append" "#!lua" [];
    /// Inbox: trim by age and length.
    INBOX_TRIM = "inbox_trim" "#!lua" [];
    /// Red packet: create.
    REDPACKET_CREATE = "redpacket_create" "#!lua" [];
    /// Red packet: grab one share.
    REDPACKET_GRAB = "redpacket_grab" "#!lua" [];
    /// Red packet: status.
    REDPACKET_STATUS = "redpacket_status" "#!lua flags=no-writes" [];
}

/// A call of one script with its keys and arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invocation {
    /// The script.
    pub script: &'static Script,
    /// Every key the script touches (all in one hash slot).
    pub keys: Vec<String>,
    /// The arguments.
    pub args: Vec<String>,
}

impl Invocation {
    fn build(&self, verb: &str, head: &str) -> Command {
        // Sized once: a take's command is built on every request.
        let mut parts = Vec::with_capacity(3 + self.keys.len() + self.args.len());
        parts.extend([String::from(verb), String::from(head), itoa(self.keys.len() as u64)]);
        parts.extend(self.keys.iter().cloned());
        parts.extend(self.args.iter().cloned());
        Command::from_parts(parts)
    }

    /// `EVALSHA sha numkeys keys… args…`: the first try, cheap on the wire.
    pub fn evalsha(&self) -> Command {
        self.build("EVALSHA", self.script.sha1())
    }

    /// `EVAL source numkeys keys… args…`: the retry after NOSCRIPT (caches the script again).
    pub fn eval(&self) -> Command {
        self.build("EVAL", &self.script.source())
    }
}

/// What an operation sends: a script call or a plain command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// A script, run with EVALSHA first.
    Script(Invocation),
    /// A plain command (reads that need no script).
    Command(Command),
}

impl Request {
    /// The command to send first.
    pub fn command(&self) -> Command {
        match self {
            Request::Script(inv) => inv.evalsha(),
            Request::Command(c) => c.clone(),
        }
    }

    /// The one retry to send after `err`: EVAL when EVALSHA met NOSCRIPT, else none.
    pub fn fallback(&self, err: &ErrorReply) -> Option<Command> {
        match self {
            Request::Script(inv) if err.is_noscript() => Some(inv.eval()),
            _ => None,
        }
    }

    /// This request with its keys moved into `ns` (see [`crate::keys::Namespace`]).
    pub fn in_namespace(self, ns: &crate::keys::Namespace) -> Request {
        if ns.is_default() {
            return self;
        }
        match self {
            Request::Script(mut inv) => {
                for k in &mut inv.keys {
                    *k = ns.apply(k);
                }
                Request::Script(inv)
            }
            // A plain command's one key is its first argument (see `keys`).
            Request::Command(mut c) => {
                if let Some(k) = c.parts_mut().get_mut(1) {
                    *k = ns.apply(k);
                }
                Request::Command(c)
            }
        }
    }

    /// The keys this request touches (for cluster routing and idempotency checks).
    pub fn keys(&self) -> &[String] {
        match self {
            Request::Script(inv) => &inv.keys,
            Request::Command(c) => c.parts().get(1..2).unwrap_or(&[]),
        }
    }
}

/// The one call machine of every transport: a request's first command (EVALSHA for a
/// script), and after a NOSCRIPT reply the one EVAL, never more. Sans-IO: the shell sends
/// [`Call::command`] and feeds error replies to [`Call::retry`].
///
/// ```
/// use redcount_core::{ErrorReply, Operation, script::Call};
/// use redcount_core::ops::claim::Claim;
///
/// let mut call = Call::new(Claim::new("bonus", "alice", 60_000).unwrap().request());
/// assert_eq!(call.command().parts()[0], "EVALSHA");
/// // Redis lost its script cache: one EVAL, with the source.
/// assert!(call.retry(&ErrorReply::new("NOSCRIPT No matching script.")));
/// assert_eq!(call.command().parts()[0], "EVAL");
/// // A second NOSCRIPT (or any other error) is the answer.
/// assert!(!call.retry(&ErrorReply::new("NOSCRIPT No matching script.")));
/// ```
#[must_use = "a call does nothing until its command is sent"]
#[derive(Debug, Clone)]
pub struct Call {
    request: Request,
    command: Command,
    retried: bool,
}

impl Call {
    /// The request being made.
    pub fn request(&self) -> &Request {
        &self.request
    }

    /// The call of `request`, at its first command.
    pub fn new(request: Request) -> Call {
        let command = request.command();
        Call { request, command, retried: false }
    }

    /// The command to send now.
    pub fn command(&self) -> &Command {
        &self.command
    }

    /// After the error reply `err`: true when the call goes on (send [`Call::command`] again,
    /// now the EVAL fallback), false when `err` is the answer.
    pub fn retry(&mut self, err: &ErrorReply) -> bool {
        if self.retried {
            return false;
        }
        match self.request.fallback(err) {
            Some(eval) => {
                self.command = eval;
                self.retried = true;
                true
            }
            None => false,
        }
    }
}
