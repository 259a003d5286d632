//! Key names. Each object's keys share one hash tag `{…}`, so a script's keys always sit
//! in one Redis Cluster slot. Every part is an allow-listed id (see [`crate::validate::id`]).

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

    /// The namespace of `scope` (an id) within this one: `{namespace}.{scope}`. No id holds a
    /// `.`, so a scoped namespace never equals a configured one, nor another scope's.
    ///
    /// ```
    /// use redcount_core::keys::{self, Namespace};
    ///
    /// let acme = Namespace::default().scoped("acme");
    /// assert_eq!(acme.apply(&keys::claim("bonus", "alice")), "rc.acme:{cl:bonus:alice}");
    /// ```
    pub fn scoped(&self, scope: &str) -> Namespace {
        Namespace(concat(&[&self.0, ".", scope]))
    }

    /// True for [`PREFIX`], where keys need no change.
    pub fn is_default(&self) -> bool {
        self.0 == PREFIX
    }

    /// `key`, as built under [`PREFIX`], in this namespace (other keys unchanged).
    pub fn apply(&self, key: &str) -> String {
        match key.strip_prefix(PREFIX).filter(|rest| rest.starts_with(':')) {
            Some(rest) => concat(&[&self.0, rest]),
            None => String::from(key),
        }
    }

    /// The SCAN pattern matching every red packet's grab log in this namespace.
    pub fn redpacket_logs(&self) -> String {
        concat(&[&self.0, ":{rp:*}:log"])
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
    concat(&[PREFIX, ":{c:", scope, ":", subject, "}"])
}

/// A hash of counters of one scope (one field per subject).
pub fn counter_hash(scope: &str) -> String {
    concat(&[PREFIX, ":{c:", scope, "}"])
}

/// A once-per-window claim.
pub fn claim(scope: &str, subject: &str) -> String {
    concat(&[PREFIX, ":{cl:", scope, ":", subject, "}"])
}

// Every quota and semaphore key of one subject starts `rc:{u:SUBJECT}` (the functions below
// spell it out, for one allocation per key): its hash tag puts a compound decision over several
// of the subject's policies in one Redis Cluster slot.

/// The base of a compound decision's idempotency keys (`…:idem:<suffix>`): in the subject's
/// slot, whatever the decision's parts and their order.
pub fn decision(subject_id: &str) -> String {
    concat(&[PREFIX, ":{u:", subject_id, "}:d"])
}

/// A quota's state; `algo` is `fw`, `sw`, `tb` or `gc`. In the subject's slot.
///
/// ```
/// use redcount_core::keys;
///
/// // A subject's quotas and semaphores share its hash tag: one slot for a compound decision.
/// assert_eq!(keys::quota("per-day", "alice", "fw"), "rc:{u:alice}:q:per-day:fw");
/// assert_eq!(keys::semaphore("in-flight", "alice"), "rc:{u:alice}:s:in-flight");
/// ```
pub fn quota(scope: &str, subject_id: &str, algo: &str) -> String {
    concat(&[PREFIX, ":{u:", subject_id, "}:q:", scope, ":", algo])
}

/// The units a quota has lent to shells and not yet got back (budget leases, by lease id),
/// beside its state (`algo` as in [`quota`]; only a fixed window lends any).
pub fn quota_lent(scope: &str, subject_id: &str, algo: &str) -> String {
    concat(&[PREFIX, ":{u:", subject_id, "}:q:", scope, ":", algo, ":lent"])
}

/// A subject's override of a quota policy's size, in the slot of its quota state.
pub fn quota_override(scope: &str, subject_id: &str) -> String {
    concat(&[PREFIX, ":{u:", subject_id, "}:q:", scope, ":ovr"])
}

/// A semaphore's holder set, in the slot of the subject it is named after (a compound
/// decision's lease is the semaphore named by the decision's subject).
pub fn semaphore(scope: &str, name: &str) -> String {
    concat(&[PREFIX, ":{u:", name, "}:s:", scope])
}

/// A semaphore's override of its policy's limit, in the semaphore's slot.
pub fn semaphore_override(scope: &str, name: &str) -> String {
    concat(&[PREFIX, ":{u:", name, "}:s:", scope, ":ovr"])
}

/// The three keys of a semaphore whose holder set is `set` (see [`semaphore`]): the set, its
/// holders' fencing tokens and its override, in one slot (lib_lease.lua).
pub fn semaphore_keys(set: &str) -> [String; 3] {
    [String::from(set), concat(&[set, ":tok"]), concat(&[set, ":ovr"])]
}

/// A user's inbox.
pub fn inbox(user: &str) -> String {
    concat(&[PREFIX, ":{ib:", user, "}"])
}

/// The four keys of a red packet: meta, shares, grabs (who got which share), log (every
/// grab in order, append-only).
pub fn redpacket(id: &str) -> [String; 4] {
    [
        concat(&[PREFIX, ":{rp:", id, "}:meta"]),
        concat(&[PREFIX, ":{rp:", id, "}:shares"]),
        concat(&[PREFIX, ":{rp:", id, "}:grabs"]),
        concat(&[PREFIX, ":{rp:", id, "}:log"]),
    ]
}

/// The parts one after the other, in one allocation of the right size: keys are built on every
/// request (twice per quota take), and `format!` costs several times as much in the worker's wasm.
fn concat(parts: &[&str]) -> String {
    let mut out = String::with_capacity(parts.iter().map(|p| p.len()).sum());
    for p in parts {
        out.push_str(p);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::format;
    use proptest::prelude::*;

    proptest! {
        // Keys name data already in Redis: each is the text the format! it replaced made.
        #[test]
        fn every_key_is_spelled_as_before(a in "[a-zA-Z0-9_.:-]{1,64}", b in "[a-zA-Z0-9_.:-]{1,64}", algo in "fw|sw|tb|gc") {
            let u = format!("{PREFIX}:{{u:{b}}}");
            prop_assert_eq!(counter(&a, &b), format!("{PREFIX}:{{c:{a}:{b}}}"));
            prop_assert_eq!(counter_hash(&a), format!("{PREFIX}:{{c:{a}}}"));
            prop_assert_eq!(claim(&a, &b), format!("{PREFIX}:{{cl:{a}:{b}}}"));
            prop_assert_eq!(decision(&b), format!("{u}:d"));
            prop_assert_eq!(quota(&a, &b, &algo), format!("{u}:q:{a}:{algo}"));
            prop_assert_eq!(quota_override(&a, &b), format!("{u}:q:{a}:ovr"));
            prop_assert_eq!(quota_lent(&a, &b, &algo), format!("{u}:q:{a}:{algo}:lent"));
            prop_assert_eq!(semaphore(&a, &b), format!("{u}:s:{a}"));
            prop_assert_eq!(semaphore_override(&a, &b), format!("{u}:s:{a}:ovr"));
            let set = semaphore(&a, &b);
            prop_assert_eq!(semaphore_keys(&set), [set.clone(), format!("{set}:tok"), format!("{set}:ovr")]);
            prop_assert_eq!(inbox(&a), format!("{PREFIX}:{{ib:{a}}}"));
            prop_assert_eq!(
                redpacket(&a),
                [
                    format!("{PREFIX}:{{rp:{a}}}:meta"),
                    format!("{PREFIX}:{{rp:{a}}}:shares"),
                    format!("{PREFIX}:{{rp:{a}}}:grabs"),
                    format!("{PREFIX}:{{rp:{a}}}:log"),
                ]
            );
            if let Ok(ns) = Namespace::new(&a) {
                prop_assert_eq!(ns.apply(&counter(&a, &b)), format!("{a}:{{c:{a}:{b}}}"));
                prop_assert_eq!(ns.redpacket_logs(), format!("{a}:{{rp:*}}:log"));
            }
        }
    }
}
