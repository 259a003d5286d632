//! Small text helpers shared by the API and the REST front.

use alloc::string::String;
use alloc::vec::Vec;

/// Decodes `%XX` escapes of a URL path segment into bytes; `None` for a malformed escape.
/// Shared by the API and the REST front's path-style commands.
pub fn percent_decode(segment: &str) -> Option<Vec<u8>> {
    let b = segment.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let v = b
                .get(i + 1..i + 3)
                .and_then(|h| core::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())?;
            out.push(v);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    Some(out)
}

/// The token of an `Authorization: Bearer <token>` header (the scheme in any case, as RFC
/// 9110 says; surrounding spaces ignored); `None` for another scheme or no token.
///
/// ```
/// use redcount_core::text::bearer_token;
/// assert_eq!(bearer_token("Bearer abc"), Some("abc"));
/// assert_eq!(bearer_token("bearer  abc "), Some("abc"));
/// assert_eq!(bearer_token("Basic abc"), None);
/// assert_eq!(bearer_token("Bearer "), None);
/// ```
pub fn bearer_token(header: &str) -> Option<&str> {
    let (scheme, token) = header.trim_start().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Compares secrets without an early exit (the time does not reveal a matching prefix).
pub fn same_secret(a: &[u8], b: &[u8]) -> bool {
    let mut diff = a.len() ^ b.len();
    for i in 0..a.len().max(b.len()) {
        diff |= (a.get(i).copied().unwrap_or(0) ^ b.get(i).copied().unwrap_or(0)) as usize;
    }
    core::hint::black_box(diff) == 0
}

/// `parts` joined by `sep`, as `[&str]::join` gives them: one loop, in place of the standard
/// library's generic join (a copy of its own in the worker's wasm, several times this size).
///
/// ```
/// use redcount_core::text::join;
/// assert_eq!(join(&["a", "b", "c"], ", "), "a, b, c");
/// assert_eq!(join(&[], ", "), "");
/// ```
pub fn join(parts: &[&str], sep: &str) -> String {
    let mut out = String::new();
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            out.push_str(sep);
        }
        out.push_str(part);
    }
    out
}

/// `text` read as `i64::from_str` reads it: an optional `+` or `-`, then one or more ASCII
/// digits; `None` for anything else or past `i64`'s range. One small reader for the few
/// integers the worker parses, in place of core's generic parser copied per integer type.
///
/// ```
/// use redcount_core::text::int;
/// assert_eq!(int("+12"), Some(12));
/// assert_eq!(int("-9223372036854775808"), Some(i64::MIN));
/// assert_eq!(int("9223372036854775808"), None);
/// assert_eq!(int("-"), None);
/// assert_eq!(int(" 1"), None);
/// ```
pub fn int(text: &str) -> Option<i64> {
    let b = text.as_bytes();
    let (negative, digits) = match b.first() {
        Some(b'-') => (true, &b[1..]),
        Some(b'+') => (false, &b[1..]),
        _ => (false, b),
    };
    if digits.is_empty() {
        return None;
    }
    let mut n: i64 = 0;
    for &c in digits {
        if !c.is_ascii_digit() {
            return None;
        }
        let d = i64::from(c - b'0');
        // Negatives are summed downwards, so i64::MIN is reached.
        n = n.checked_mul(10)?;
        n = if negative { n.checked_sub(d)? } else { n.checked_add(d)? };
    }
    Some(n)
}

/// The whole number a decimal text names exactly, within `-max..=max`: digits with an optional
/// sign, fraction and exponent (`-0`, `1e3`, `12.50e1`, the forms `%.17g` and its kin print a
/// whole-number score in). `None` for anything else: a fraction that is not zero, `nan`,
/// `inf`, out of range, or more than 64 bytes. Read exactly, without floating point (an `f64`
/// parse would round, and would bring a float parser into the worker's wasm).
///
/// ```
/// use redcount_core::text::whole_number;
/// assert_eq!(whole_number("1234", 1 << 53), Some(1234));
/// assert_eq!(whole_number("-0", 1 << 53), Some(0));
/// assert_eq!(whole_number("1.5e1", 1 << 53), Some(15));
/// assert_eq!(whole_number("9.007199254740991e+15", 1 << 53), Some(9_007_199_254_740_991));
/// assert_eq!(whole_number("1.5", 1 << 53), None);
/// assert_eq!(whole_number("1e16", 1 << 53), None);
/// assert_eq!(whole_number("inf", 1 << 53), None);
/// ```
pub fn whole_number(text: &str, max: i64) -> Option<i64> {
    let b = text.as_bytes();
    if b.is_empty() || b.len() > 64 {
        return None;
    }
    let (negative, b) = match b[0] {
        b'-' => (true, &b[1..]),
        b'+' => (false, &b[1..]),
        _ => (false, b),
    };
    let (mantissa, exponent) = match b.iter().position(|&c| c == b'e' || c == b'E') {
        Some(at) => (&b[..at], i32::try_from(int(core::str::from_utf8(&b[at + 1..]).ok()?)?).ok()?),
        None => (b, 0),
    };
    let (whole, fraction) = match mantissa.iter().position(|&c| c == b'.') {
        Some(at) => (&mantissa[..at], &mantissa[at + 1..]),
        None => (mantissa, &mantissa[..0]),
    };
    if whole.is_empty() && fraction.is_empty() {
        return None;
    }
    // The digits, and where the decimal point falls among them once the exponent is applied.
    let digits = whole.iter().chain(fraction);
    let point = i64::try_from(whole.len()).ok()? + i64::from(exponent);
    let (mut value, mut at) = (0i64, 0i64);
    for &c in digits {
        if !c.is_ascii_digit() {
            return None;
        }
        let d = i64::from(c - b'0');
        if at < point {
            value = value.checked_mul(10)?.checked_add(d)?;
            if value > max {
                return None;
            }
        } else if d != 0 {
            return None; // a digit after the point that is not zero: not a whole number
        }
        at += 1;
    }
    // Zeros the exponent adds past the last digit.
    while at < point {
        value = value.checked_mul(10)?;
        if value > max {
            return None;
        }
        at += 1;
    }
    Some(if negative { -value } else { value })
}

#[cfg(test)]
mod int_tests {
    use super::int;
    use alloc::string::String;
    use proptest::prelude::*;

    proptest! {
        /// `int` reads what core's parsers read, for i64 and for the narrower types it stands
        /// in for (i32, and usize with no `-`).
        #[test]
        fn int_reads_as_from_str(s in prop_oneof![
            "[+-]?[0-9]{0,21}",
            "[+-]?(9223372036854775[0-9]{3}|214748364[0-9])",
            "[+-]{0,2}[0-9a ._e]{0,6}",
            any::<String>(),
        ]) {
            prop_assert_eq!(int(&s), s.parse::<i64>().ok());
            prop_assert_eq!(int(&s).and_then(|n| i32::try_from(n).ok()), s.parse::<i32>().ok());
            let unsigned = Some(&s).filter(|s| !s.starts_with('-')).and_then(|s| int(s)).and_then(|n| u32::try_from(n).ok());
            prop_assert_eq!(unsigned, s.parse::<u32>().ok());
        }
    }
}
