//! Bearer token checks, in constant time.

use std::sync::Arc;

// The core's constant-time comparison, so the API and the front check tokens alike.
use redcount_core::text::same_secret as same;

use crate::backend::Backend;
use crate::cluster_users::Guard;

/// What a request may do, and on whose Redis connections it runs.
#[derive(Clone)]
pub enum Access {
    /// `--token`: every command (within the front's own rules).
    Full,
    /// `--readonly-token`: read-only commands.
    ReadOnly,
    /// A token from `--tokens`: its own Redis ACL user's connections, so Redis decides what it
    /// may touch; `readonly` adds the front's read-only rules.
    Scoped {
        /// The front's read-only rules apply too.
        readonly: bool,
        /// Connections logged in as the token's Redis user.
        backend: Arc<Backend>,
        /// Cancelled when a reload removes the token (or changes its login): its open
        /// subscriptions end.
        revoked: tokio_util::sync::CancellationToken,
        /// Says why while the token is refused: the front cannot keep its rules on the
        /// token's Redis user, or the operator's user is off, gone, or no longer accepts the
        /// file's password.
        guarded: Arc<Guard>,
    },
}

impl Access {
    /// The Redis user a connection of its own logs in as (`None`: the URL's).
    pub fn login(&self) -> Option<&crate::backend::Login> {
        match self {
            Access::Scoped { backend, .. } => backend.login(),
            _ => None,
        }
    }

    /// Cancelled when the token is removed; `None` for tokens that cannot be.
    pub fn revoked(&self) -> Option<&tokio_util::sync::CancellationToken> {
        match self {
            Access::Scoped { revoked, .. } => Some(revoked),
            _ => None,
        }
    }

    /// True when the front's read-only rules apply.
    pub fn readonly(&self) -> bool {
        matches!(self, Access::ReadOnly | Access::Scoped { readonly: true, .. })
    }
}

/// One token of `--tokens`, connected.
pub struct Scoped {
    pub token: String,
    pub readonly: bool,
    pub backend: Arc<Backend>,
    /// See [`Access::Scoped`].
    pub revoked: tokio_util::sync::CancellationToken,
    /// See [`Access::Scoped`].
    pub guarded: Arc<Guard>,
    /// The Redis user the token logs in as, derived from the file's.
    pub tenant: crate::cluster_users::Tenant,
}

/// Checks the `Authorization` header against every token. Each is compared in full, whatever
/// the others gave, so the time does not tell which token was close or how many there are
/// before it.
pub fn check(header: Option<&str>, token: &str, readonly: Option<&str>, scoped: &[Scoped]) -> Option<Access> {
    let given = redcount_core::text::bearer_token(header?)?;
    let full = same(given.as_bytes(), token.as_bytes());
    let ro = readonly.is_some_and(|r| same(given.as_bytes(), r.as_bytes()));
    let mut found = None;
    for s in scoped {
        if same(given.as_bytes(), s.token.as_bytes()) && found.is_none() {
            found = Some(Access::Scoped {
                readonly: s.readonly,
                backend: s.backend.clone(),
                revoked: s.revoked.clone(),
                guarded: s.guarded.clone(),
            });
        }
    }
    if full {
        Some(Access::Full)
    } else if ro {
        Some(Access::ReadOnly)
    } else {
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens() {
        assert!(same(b"abc", b"abc"));
        assert!(!same(b"abc", b"abd"));
        assert!(!same(b"abc", b"abcd"));
        assert!(!same(b"", b"a"));
        let kind = |header: Option<&str>, ro: Option<&str>| match check(header, "t1", ro, &[]) {
            Some(Access::Full) => "full",
            Some(Access::ReadOnly) => "ro",
            Some(Access::Scoped { .. }) => "scoped",
            None => "none",
        };
        assert_eq!(kind(Some("Bearer t1"), Some("r1")), "full");
        assert_eq!(kind(Some("Bearer r1"), Some("r1")), "ro");
        assert_eq!(kind(Some("Bearer x"), Some("r1")), "none");
        assert_eq!(kind(Some("t1"), None), "none");
        assert_eq!(kind(Some("bearer t1"), None), "full");
        assert_eq!(kind(Some("BEARER r1"), Some("r1")), "ro");
        assert_eq!(kind(Some("Basic t1"), None), "none");
        assert_eq!(kind(None, None), "none");
    }
}
