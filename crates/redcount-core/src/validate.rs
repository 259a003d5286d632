//! Input validation: allow-listed ids and canonical, bounded integers.
//!
//! Lua's `tonumber` accepts "nan", "inf", "0x10", " 5 " and "1e3", and Lua numbers are
//! doubles (exact only to 2^53), so nothing reaches a script unless it passed here.
//! The scripts check again, so a caller that skips the core still cannot corrupt state.

use crate::json::Json;

use crate::error::{InputError, Problem};

/// Largest integer every layer (JSON in JavaScript, Lua doubles) holds exactly: 2^53 - 1.
pub const MAX_SAFE: i64 = (1 << 53) - 1;

/// Longest id accepted.
pub const MAX_ID_LEN: usize = 64;

/// Checks an id against `[A-Za-z0-9_-]{1,64}`.
///
/// Ids become parts of key names: `{`, `}` or `:` would move a key to another cluster slot or
/// namespace, so nothing else is accepted.
pub fn id<'a>(field: &'static str, s: &'a str) -> Result<&'a str, InputError> {
    let ok = !s.is_empty()
        && s.len() <= MAX_ID_LEN
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok { Ok(s) } else { Err(InputError::new(field, Problem::BadId)) }
}

/// Checks a subject: an id, or `TENANT/USER`, two ids (a user of a tenant: its keys share the
/// tenant's hash tag, see [`crate::keys::Level`]).
///
/// ```
/// use redcount_core::validate::subject;
///
/// assert!(subject("subject", "alice").is_ok());
/// assert!(subject("subject", "acme/alice").is_ok());
/// for bad in ["acme/", "/alice", "a/b/c", "acme/al ice", ""] {
///     assert_eq!(subject("subject", bad).unwrap_err().field, "subject", "{bad}");
/// }
/// ```
pub fn subject<'a>(field: &'static str, s: &'a str) -> Result<&'a str, InputError> {
    match s.split_once('/') {
        None => id(field, s),
        Some((tenant, user)) => {
            id(field, tenant)?;
            id(field, user)?;
            Ok(s)
        }
    }
}

/// Checks that `n` lies in `min..=max`.
pub fn range(field: &'static str, n: i64, min: i64, max: i64) -> Result<i64, InputError> {
    if (min..=max).contains(&n) { Ok(n) } else { Err(InputError::new(field, Problem::OutOfRange { min, max })) }
}

/// Parses a canonical decimal integer (`-?(0|[1-9][0-9]*)`, no `-0`) within `min..=max`.
pub fn int_str(field: &'static str, s: &str, min: i64, max: i64) -> Result<i64, InputError> {
    let digits = s.strip_prefix('-').unwrap_or(s);
    let canonical = !digits.is_empty()
        && digits.len() <= 19
        && digits.bytes().all(|b| b.is_ascii_digit())
        && (digits == "0" || !digits.starts_with('0'))
        && s != "-0";
    if !canonical {
        return Err(InputError::new(field, Problem::NotInteger));
    }
    let n = crate::text::int(s).ok_or(InputError::new(field, Problem::OutOfRange { min, max }))?;
    range(field, n, min, max)
}

/// Reads an integer from JSON: a number with no fraction or exponent, or a string holding a
/// canonical decimal (for clients that send large numbers as strings).
pub fn int_json(field: &'static str, v: &Json, min: i64, max: i64) -> Result<i64, InputError> {
    match v {
        Json::Number(n) => match n.as_i64() {
            Some(i) => range(field, i, min, max),
            // A u64 above i64::MAX is an integer, just far out of range.
            None if n.as_u64().is_some() => Err(InputError::new(field, Problem::OutOfRange { min, max })),
            None => Err(InputError::new(field, Problem::NotInteger)),
        },
        Json::String(s) => int_str(field, s, min, max),
        Json::Null => Err(InputError::new(field, Problem::Missing)),
        _ => Err(InputError::new(field, Problem::WrongType("an integer"))),
    }
}

/// Checks a text's length in bytes.
pub fn text<'a>(field: &'static str, s: &'a str, max: usize) -> Result<&'a str, InputError> {
    if s.len() <= max { Ok(s) } else { Err(InputError::new(field, Problem::TooLong { max })) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_integers() {
        for ok in ["0", "7", "-7", "9007199254740991"] {
            assert!(int_str("n", ok, -MAX_SAFE, MAX_SAFE).is_ok(), "{ok}");
        }
        for bad in ["", "-", "-0", "007", "+5", " 5", "5 ", "1e3", "0x10", "2.5", "nan", "inf", "5a"] {
            assert_eq!(int_str("n", bad, -MAX_SAFE, MAX_SAFE).unwrap_err().problem, Problem::NotInteger, "{bad}");
        }
        assert!(matches!(
            int_str("n", "9007199254740992", 0, MAX_SAFE).unwrap_err().problem,
            Problem::OutOfRange { .. }
        ));
        assert!(matches!(
            int_str("n", "99999999999999999999", 0, MAX_SAFE).unwrap_err().problem,
            Problem::NotInteger | Problem::OutOfRange { .. }
        ));
    }
}
