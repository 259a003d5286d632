//! The Lua scripts, their SHA-1 names, and the EVALSHA / EVAL commands that run them.
//!
//! Sending a command and retrying once on NOSCRIPT is the caller's job; this module only
//! builds the two commands (`Request::command`, then `Request::fallback` on NOSCRIPT).

use alloc::string::String;
use alloc::vec::Vec;

use crate::command::{Command, itoa};
use crate::error::ErrorReply;
use crate::sha1;

/// A Lua script shipped with redcount: its name and the SHA-1 of its source (computed at
/// compile time). The source itself is reached only through [`Script::source`], so a build
/// that never calls it (the worker's wasm, which fetches the text from its static assets
/// after a NOSCRIPT, see [`Call::wanted`]) carries none of the texts. Two scripts are equal
/// when their names and SHA-1s are.
#[derive(Debug, PartialEq, Eq)]
pub struct Script {
    name: &'static str,
    sha1: [u8; 40],
}

impl Script {
    /// A script named `name` whose source is `parts` (at most 16) one after the other: the
    /// SHA-1 of their concatenation is computed at compile time, and the parts are not kept
    /// (they stay in [`SOURCES`]).
    const fn new(name: &'static str, parts: &'static [&'static str]) -> Self {
        Script { name, sha1: sha1::hex(sha1::digest_strs(parts)) }
    }

    /// The file name without `.lua`.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The Lua source, as sent by EVAL and SCRIPT LOAD: the parts joined (only those two
    /// need the text; EVALSHA sends the SHA-1). Calling it links every script's text into
    /// the binary.
    pub fn source(&self) -> String {
        SOURCES.iter().find(|(name, _)| *name == self.name).map(|(_, parts)| parts.concat()).unwrap_or_default()
    }

    /// The SHA-1 of the source in lowercase hex: the name EVALSHA uses.
    pub fn sha1(&self) -> &str {
        // Always ASCII hex digits.
        core::str::from_utf8(&self.sha1).unwrap_or("")
    }

    /// True when `text` is this script's source (its SHA-1 is the script's): how a shell
    /// that keeps the texts elsewhere checks one before sending it.
    pub fn is_source(&self, text: &[u8]) -> bool {
        sha1::hex(sha1::digest(text)) == self.sha1
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
        // the binary. The parts are a `const` per script, read at compile time for the SHA-1
        // and at run time only through `SOURCES`.
        mod parts {
            $( pub(super) const $id: &[&str] = &[
                concat!($shebang, "\n"),
                $(include_str!(concat!(env!("OUT_DIR"), "/lua/", $head, ".lua")),)?
                include_str!(concat!(env!("OUT_DIR"), "/lua/prelude.lua")),
                $(include_str!(concat!(env!("OUT_DIR"), "/lua/", $lib, ".lua")),)*
                include_str!(concat!(env!("OUT_DIR"), "/lua/", $file, ".lua")),
            ]; )*
        }
        $( $(#[$doc])* pub static $id: Script = Script::new($file, parts::$id); )*
        /// Every script, e.g. to `SCRIPT LOAD` them ahead of time.
        pub static ALL: &[&Script] = &[$(&$id),*];
        /// Every script's source, by name, as its parts (see [`Script::source`]).
        static SOURCES: &[(&str, &[&str])] = &[$(($file, parts::$id)),*];
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
        self.eval_with(&self.script.source())
    }

    /// `EVAL` with `source` as the script's text (which the caller checked: see
    /// [`Script::is_source`]).
    pub fn eval_with(&self, source: &str) -> Command {
        self.build("EVAL", source)
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
/// [`Call::command`] and feeds error replies to [`Call::retry`] (a shell whose binary
/// carries the script texts), or to [`Call::needs_source`] and then gives the text of
/// [`Call::wanted`] to [`Call::give_source`] (a shell that keeps the texts elsewhere, like
/// the worker, whose bundle would otherwise carry every script).
///
/// ```
/// use redcount_core::{ErrorReply, Operation, script::Call};
/// use redcount_core::ops::claim::Claim;
///
/// let noscript = ErrorReply::new("NOSCRIPT No matching script.");
/// let mut call = Call::new(Claim::new("bonus", "alice", 60_000).unwrap().request());
/// assert_eq!(call.command().parts()[0], "EVALSHA");
/// // Redis lost its script cache: one EVAL, with the source.
/// assert!(call.retry(&noscript));
/// assert_eq!(call.command().parts()[0], "EVAL");
/// // A second NOSCRIPT (or any other error) is the answer.
/// assert!(!call.retry(&noscript));
///
/// // The same, the source coming from elsewhere: it must be the script's own text.
/// let mut call = Call::new(Claim::new("bonus", "alice", 60_000).unwrap().request());
/// assert!(call.needs_source(&noscript));
/// let script = call.wanted().unwrap();
/// assert!(!call.give_source(b"return 1"), "not the script's text: refused");
/// assert!(call.give_source(script.source().as_bytes()));
/// assert_eq!(call.command().parts()[0], "EVAL");
/// ```
#[must_use = "a call does nothing until its command is sent"]
#[derive(Debug, Clone)]
pub struct Call {
    request: Request,
    command: Command,
    state: State,
}

/// Where a call is in its one fallback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// The first command.
    First,
    /// NOSCRIPT came back: the EVAL waits for the script's source.
    Wanting,
    /// The EVAL is (or was) the command: no more retries.
    Retried,
}

impl Call {
    /// The request being made.
    pub fn request(&self) -> &Request {
        &self.request
    }

    /// The call of `request`, at its first command.
    pub fn new(request: Request) -> Call {
        let command = request.command();
        Call { request, command, state: State::First }
    }

    /// The command to send now.
    pub fn command(&self) -> &Command {
        &self.command
    }

    /// After the error reply `err`: true when the call goes on (send [`Call::command`] again,
    /// now the EVAL fallback, with the source this binary carries), false when `err` is the
    /// answer.
    pub fn retry(&mut self, err: &ErrorReply) -> bool {
        if !self.needs_source(err) {
            return false;
        }
        match &self.request {
            Request::Script(inv) => self.command = inv.eval(),
            Request::Command(_) => return false,
        }
        self.state = State::Retried;
        true
    }

    /// After the error reply `err`: true when the call goes on once [`Call::give_source`]
    /// has the text of the script [`Call::wanted`] names (NOSCRIPT, the first time), false
    /// when `err` is the answer.
    pub fn needs_source(&mut self, err: &ErrorReply) -> bool {
        let wanted = self.state == State::First && err.is_noscript() && matches!(self.request, Request::Script(_));
        if wanted {
            self.state = State::Wanting;
        }
        wanted
    }

    /// The script whose source the EVAL waits for, after [`Call::needs_source`] said so.
    pub fn wanted(&self) -> Option<&'static Script> {
        match (&self.request, self.state) {
            (Request::Script(inv), State::Wanting) => Some(inv.script),
            _ => None,
        }
    }

    /// Gives the source of [`Call::wanted`]: true when `text` is that script's (checked
    /// against its SHA-1), and the EVAL is then [`Call::command`]; false, and nothing to
    /// send, when it is not (or no source was wanted).
    pub fn give_source(&mut self, text: &[u8]) -> bool {
        let Some(script) = self.wanted() else { return false };
        let (Request::Script(inv), Ok(source)) = (&self.request, core::str::from_utf8(text)) else { return false };
        if !script.is_source(text) {
            return false;
        }
        self.command = inv.eval_with(source);
        self.state = State::Retried;
        true
    }
}
