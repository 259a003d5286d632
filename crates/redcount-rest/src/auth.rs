//! Bearer token checks, in constant time.

// The core's constant-time comparison, so the API and the front check tokens alike.
use redcount_core::text::same_secret as same;

/// What a request may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Every command.
    Full,
    /// Read-only commands.
    ReadOnly,
}

/// Checks the `Authorization` header against the tokens.
pub fn check(header: Option<&str>, token: &str, readonly: Option<&str>) -> Option<Access> {
    let given = redcount_core::text::bearer_token(header?)?;
    // Compare against both so the time does not tell which token was close.
    let full = same(given.as_bytes(), token.as_bytes());
    let ro = readonly.is_some_and(|r| same(given.as_bytes(), r.as_bytes()));
    if full {
        Some(Access::Full)
    } else if ro {
        Some(Access::ReadOnly)
    } else {
        None
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
        assert_eq!(check(Some("Bearer t1"), "t1", Some("r1")), Some(Access::Full));
        assert_eq!(check(Some("Bearer r1"), "t1", Some("r1")), Some(Access::ReadOnly));
        assert_eq!(check(Some("Bearer x"), "t1", Some("r1")), None);
        assert_eq!(check(Some("t1"), "t1", None), None);
        assert_eq!(check(Some("bearer t1"), "t1", None), Some(Access::Full));
        assert_eq!(check(Some("BEARER r1"), "t1", Some("r1")), Some(Access::ReadOnly));
        assert_eq!(check(Some("Basic t1"), "t1", None), None);
        assert_eq!(check(None, "t1", None), None);
    }
}
