//! Key names. Each object's keys share one hash tag `{…}`, so a script's keys always sit
//! in one Redis Cluster slot. Every part is an allow-listed id (see [`crate::validate::id`]).

use alloc::format;
use alloc::string::String;

use crate::error::InputError;
use crate::validate;

/// The default namespace: the first part of every key the constructors below build.
pub const PREFIX: &str = "rc";

/// A key namespace: the first part of every key, so several deployments (or apps) can share
/// one Redis without meeting. Operations build their keys under [`PREFIX`]; a namespace moves
/// them (see [`crate::ops::Namespaced`]), outside the hash tag, so slots stay as they were
/// within one namespace.
///
/// ```
/// use redcount_core::keys::{self, Namespace};
///
/// let ns = Namespace::new("shop-eu").unwrap();
/// assert_eq!(ns.apply(&keys::claim("bonus", "alice")), "shop-eu:{cl:bonus:alice}");
/// assert!(Namespace::new("a*b").is_err(), "a namespace is an id: no glob or hash-tag characters");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Namespace(String);

impl Namespace {
    /// A namespace: an id (letters, digits, `_`, `-`), so it can appear in a SCAN pattern
    /// and never holds `{`, `}` or `:`.
    pub fn new(name: &str) -> Result<Self, InputError> {
        Ok(Namespace(String::from(validate::id("namespace", name)?)))
    }

    /// The namespace's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// True for [`PREFIX`], where keys need no change.
    pub fn is_default(&self) -> bool {
        self.0 == PREFIX
    }

    /// `key`, as built under [`PREFIX`], in this namespace (other keys unchanged).
    pub fn apply(&self, key: &str) -> String {
        match key.strip_prefix(PREFIX).filter(|rest| rest.starts_with(':')) {
            Some(rest) => format!("{}{rest}", self.0),
            None => String::from(key),
        }
    }

    /// The SCAN pattern matching every red packet's grab log in this namespace.
    pub fn redpacket_logs(&self) -> String {
        format!("{}:{{rp:*}}:log", self.0)
    }

    /// The packet id of a grab-log key matched by [`Namespace::redpacket_logs`].
    pub fn redpacket_of_log<'k>(&self, key: &'k str) -> Option<&'k str> {
        let id = key.strip_prefix(self.0.as_str())?.strip_prefix(":{rp:")?.strip_suffix("}:log")?;
        validate::id("id", id).ok()
    }
}

impl Default for Namespace {
    fn default() -> Self {
        Namespace(String::from(PREFIX))
    }
}

/// A counter stored as its own string key.
pub fn counter(scope: &str, subject: &str) -> String {
    format!("{PREFIX}:{{c:{scope}:{subject}}}")
}

/// A hash of counters of one scope (one field per subject).
pub fn counter_hash(scope: &str) -> String {
    format!("{PREFIX}:{{c:{scope}}}")
}

/// A once-per-window claim.
pub fn claim(scope: &str, subject: &str) -> String {
    format!("{PREFIX}:{{cl:{scope}:{subject}}}")
}

/// A quota's state; `algo` is `fw`, `sw` or `tb`.
pub fn quota(scope: &str, subject: &str, algo: &str) -> String {
    format!("{PREFIX}:{{q:{scope}:{subject}}}:{algo}")
}

/// A subject's override of a quota policy's size, in the slot of its quota state.
pub fn quota_override(scope: &str, subject: &str) -> String {
    format!("{PREFIX}:{{q:{scope}:{subject}}}:ovr")
}

/// A semaphore's holder set.
pub fn semaphore(scope: &str, name: &str) -> String {
    format!("{PREFIX}:{{s:{scope}:{name}}}")
}

/// A semaphore's override of its policy's limit, in the semaphore's slot.
pub fn semaphore_override(scope: &str, name: &str) -> String {
    format!("{PREFIX}:{{s:{scope}:{name}}}:ovr")
}

/// A user's inbox.
pub fn inbox(user: &str) -> String {
    format!("{PREFIX}:{{ib:{user}}}")
}

/// The four keys of a red packet: meta, shares, grabs (who got which share), log (every
/// grab in order, append-only).
pub fn redpacket(id: &str) -> [String; 4] {
    [
        format!("{PREFIX}:{{rp:{id}}}:meta"),
        format!("{PREFIX}:{{rp:{id}}}:shares"),
        format!("{PREFIX}:{{rp:{id}}}:grabs"),
        format!("{PREFIX}:{{rp:{id}}}:log"),
    ]
}
