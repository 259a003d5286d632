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
// of the subject's policies in one Redis Cluster slot. A subject `TENANT/USER` (see
// [`validate::subject`]) is a user of a tenant: every key of the tenant, at either level,
// starts `rc:{t:TENANT}`, the user's `rc:{t:TENANT}:u:USER` and the tenant's own
// `rc:{t:TENANT}`, so one script sees a user's and the tenant's counters in one slot. A plain
// subject has no `/` (ids never do), so its keys are exactly what they were.

/// Which counter of a `TENANT/USER` subject a policy applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Level {
    /// The subject's own (the user's, for `TENANT/USER`; a plain subject has only this).
    #[default]
    User,
    /// The tenant's own counter of the policy, shared by every user of the tenant.
    Tenant,
}

/// `rc:{u:SUBJECT}` + `rest`, or for `TENANT/USER` `rc:{t:TENANT}:u:USER` + `rest` (the
/// tenant's own, `rc:{t:TENANT}` + `rest`, at [`Level::Tenant`]), in one allocation. A plain
/// subject has no tenant level: its own keys are used.
fn subject_key(subject: &str, level: Level, rest: &[&str]) -> String {
    let head: [&str; 5] = match subject.split_once('/') {
        None => [PREFIX, ":{u:", subject, "}", ""],
        Some((tenant, _)) if level == Level::Tenant => [PREFIX, ":{t:", tenant, "}", ""],
        Some((tenant, user)) => [PREFIX, ":{t:", tenant, "}:u:", user],
    };
    let mut out = String::with_capacity(head.iter().chain(rest).map(|p| p.len()).sum());
    for p in head.iter().chain(rest) {
        out.push_str(p);
    }
    out
}

/// The base of a compound decision's idempotency keys (`…:idem:<suffix>`): in the subject's
/// slot, whatever the decision's parts and their order.
pub fn decision(subject_id: &str) -> String {
    subject_key(subject_id, Level::User, &[":d"])
}

/// A quota's state; `algo` is `fw`, `sw`, `tb` or `gc`. In the subject's slot.
///
/// ```
/// use redcount_core::keys::{self, Level};
///
/// // A subject's quotas and semaphores share its hash tag: one slot for a compound decision.
/// assert_eq!(keys::quota("per-day", "alice", "fw"), "rc:{u:alice}:q:per-day:fw");
/// assert_eq!(keys::semaphore("in-flight", "alice"), "rc:{u:alice}:s:in-flight");
/// // A user of a tenant, and the tenant's own counter: one tag for both levels.
/// assert_eq!(keys::quota("tpm", "acme/alice", "fw"), "rc:{t:acme}:u:alice:q:tpm:fw");
/// assert_eq!(keys::quota_at("tpm", "acme/alice", Level::Tenant, "fw"), "rc:{t:acme}:q:tpm:fw");
/// ```
pub fn quota(scope: &str, subject_id: &str, algo: &str) -> String {
    quota_at(scope, subject_id, Level::User, algo)
}

/// A quota's state at `level` of the subject (see [`Level`]).
pub fn quota_at(scope: &str, subject_id: &str, level: Level, algo: &str) -> String {
    subject_key(subject_id, level, &[":q:", scope, ":", algo])
}

/// The units a quota has lent to shells and not yet got back (budget leases, by lease id),
/// beside its state (`algo` as in [`quota`]; only a fixed window lends any).
pub fn quota_lent(scope: &str, subject_id: &str, algo: &str) -> String {
    quota_lent_at(scope, subject_id, Level::User, algo)
}

/// The units lent of a quota at `level` of the subject (see [`Level`], [`quota_lent`]).
pub fn quota_lent_at(scope: &str, subject_id: &str, level: Level, algo: &str) -> String {
    subject_key(subject_id, level, &[":q:", scope, ":", algo, ":lent"])
}

/// A subject's override of a quota policy's size, in the slot of its quota state.
pub fn quota_override(scope: &str, subject_id: &str) -> String {
    quota_override_at(scope, subject_id, Level::User)
}

/// A subject's override of a quota policy's size at `level` (see [`Level`]).
pub fn quota_override_at(scope: &str, subject_id: &str, level: Level) -> String {
    subject_key(subject_id, level, &[":q:", scope, ":ovr"])
}

/// The reservations of a quota (`quota_at`'s key, then `:rx`) that give their units back
/// when their lease ends unsettled: lua/lib_reserve.lua.
pub fn quota_expiry(quota_key: &str) -> String {
    concat(&[quota_key, ":rx"])
}

/// A semaphore's holder set, in the slot of the subject it is named after (a compound
/// decision's lease is the semaphore named by the decision's subject).
pub fn semaphore(scope: &str, name: &str) -> String {
    semaphore_at(scope, name, Level::User)
}

/// A semaphore's holder set at `level` of the subject it is named after (see [`Level`]).
pub fn semaphore_at(scope: &str, name: &str, level: Level) -> String {
    subject_key(name, level, &[":s:", scope])
}

/// A semaphore's override of its policy's limit, in the semaphore's slot.
pub fn semaphore_override(scope: &str, name: &str) -> String {
    subject_key(name, Level::User, &[":s:", scope, ":ovr"])
}

/// The three keys of a semaphore whose holder set is `set` (see [`semaphore`]): the set, its
/// holders' fencing tokens and its override, in one slot (lib_lease.lua).
pub fn semaphore_keys(set: &str) -> [String; 3] {
    [String::from(set), concat(&[set, ":tok"]), concat(&[set, ":ovr"])]
}

/// A reservation's record, in its subject's slot (lua/lib_reserve.lua).
pub fn reservation(subject_id: &str, id: &str) -> String {
    subject_key(subject_id, Level::User, &[":r:", id])
}

/// The base of a subject's reservation calls' idempotency keys (`…:idem:<suffix>`): in the
/// subject's slot, whatever the reservation.
pub fn reservations(subject_id: &str) -> String {
    subject_key(subject_id, Level::User, &[":r"])
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
            // A plain subject has no tenant level: its own keys.
            prop_assert_eq!(quota_at(&a, &b, Level::Tenant, &algo), quota(&a, &b, &algo));
            prop_assert_eq!(semaphore_at(&a, &b, Level::Tenant), semaphore(&a, &b));
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

        // Every key of a tenant, at both levels and for every user, is in the tenant's one slot
        // (Redis Cluster hashes the text between the first `{` and the next `}`); and no two
        // (level, user, kind, policy) name one key, nor a tenant's key a plain subject's.
        #[test]
        fn a_tenants_keys_share_its_tag_and_never_meet(
            t in "[a-zA-Z0-9_-]{1,64}",
            users in proptest::collection::vec("[a-zA-Z0-9_-]{1,8}", 1..4),
            scopes in proptest::collection::vec("[a-zA-Z0-9_-]{1,8}", 1..3),
        ) {
            let tag = |k: &str| {
                let open = k.find('{').unwrap();
                String::from(&k[open + 1..open + 1 + k[open + 1..].find('}').unwrap()])
            };
            let mut seen = alloc::collections::BTreeMap::new();
            for u in &users {
                let subject = format!("{t}/{u}");
                for level in [Level::User, Level::Tenant] {
                    for scope in &scopes {
                        let q = quota_at(scope, &subject, level, "fw");
                        let mut ks = alloc::vec![
                            q.clone(),
                            quota_override_at(scope, &subject, level),
                            quota_expiry(&q),
                        ];
                        ks.extend(semaphore_keys(&semaphore_at(scope, &subject, level)));
                        if level == Level::User {
                            ks.extend([decision(&subject), reservations(&subject), reservation(&subject, scope)]);
                        }
                        for (i, k) in ks.into_iter().enumerate() {
                            prop_assert_eq!(tag(&k), format!("t:{t}"));
                            // The same key only from the same thing (a tenant's own keys are
                            // the same for every user).
                            // (A decision's and the reservations' base name no policy.)
                            let scope = if i == 6 || i == 7 { String::new() } else { scope.clone() };
                            let who = (if level == Level::User { u.clone() } else { String::new() }, scope, i);
                            if let Some(before) = seen.insert(k.clone(), who.clone()) {
                                prop_assert_eq!(before, who, "{}", k);
                            }
                            prop_assert!(!k.contains("{u:"), "{}", k);
                        }
                    }
                }
            }
        }
    }
}
