//! Small text helpers shared by the API and the REST front.

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
