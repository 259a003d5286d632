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

/// Compares secrets without an early exit (the time does not reveal a matching prefix).
pub fn same_secret(a: &[u8], b: &[u8]) -> bool {
    let mut diff = a.len() ^ b.len();
    for i in 0..a.len().max(b.len()) {
        diff |= (a.get(i).copied().unwrap_or(0) ^ b.get(i).copied().unwrap_or(0)) as usize;
    }
    core::hint::black_box(diff) == 0
}
