//! Key names. Each object's keys share one hash tag `{…}`, so a script's keys always sit
//! in one Redis Cluster slot. Every part is an allow-listed id (see [`crate::validate::id`]).

use alloc::format;
use alloc::string::String;

/// Prefix of every key redcount writes.
pub const PREFIX: &str = "rc";

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

/// A semaphore's holder set.
pub fn semaphore(scope: &str, name: &str) -> String {
    format!("{PREFIX}:{{s:{scope}:{name}}}")
}

/// A user's inbox.
pub fn inbox(user: &str) -> String {
    format!("{PREFIX}:{{ib:{user}}}")
}

/// The four keys of a red packet: meta, shares, claims, log.
pub fn redpacket(id: &str) -> [String; 4] {
    [
        format!("{PREFIX}:{{rp:{id}}}:meta"),
        format!("{PREFIX}:{{rp:{id}}}:shares"),
        format!("{PREFIX}:{{rp:{id}}}:claims"),
        format!("{PREFIX}:{{rp:{id}}}:log"),
    ]
}
