//! The two base64 forms the worker's paths use, written for them alone: the standard alphabet
//! with canonical padding (strings in REST replies, as Upstash encodes them) and the URL-safe
//! alphabet without padding (reservation ids). Each accepts and makes exactly what the base64
//! crate's `STANDARD` and `URL_SAFE_NO_PAD` engines do (a property test holds them to it):
//! that crate's general engine, its tables and both alphabets weighed several KB in the
//! worker's bundle, where these are a few hundred bytes.
//!
//! ```
//! use redcount_core::b64;
//!
//! assert_eq!(b64::decode_standard(b"aGk="), Some(b"hi".to_vec()));
//! assert_eq!(b64::decode_standard(b"aGk"), None, "padding required");
//! assert_eq!(b64::encode_url(&[0xfb, 0xff]), "-_8");
//! assert_eq!(b64::decode_url(b"-_8"), Some(vec![0xfb, 0xff]));
//! ```

use alloc::string::String;
use alloc::vec::Vec;

/// The 6-bit value of `b` in the standard (`url`: URL-safe) alphabet.
fn sextet(b: u8, url: bool) -> Option<u32> {
    let v = match b {
        b'A'..=b'Z' => b - b'A',
        b'a'..=b'z' => b - b'a' + 26,
        b'0'..=b'9' => b - b'0' + 52,
        b'+' if !url => 62,
        b'/' if !url => 63,
        b'-' if url => 62,
        b'_' if url => 63,
        _ => return None,
    };
    Some(u32::from(v))
}

/// Decodes symbols without padding: `None` for a byte outside the alphabet, a length that
/// leaves one symbol over, or bits left over that are not zero.
fn decode(symbols: &[u8], url: bool) -> Option<Vec<u8>> {
    if symbols.len() % 4 == 1 {
        return None;
    }
    let mut out = Vec::with_capacity(symbols.len() / 4 * 3 + 2);
    let (mut acc, mut bits) = (0u32, 0u32);
    for &b in symbols {
        acc = (acc << 6 | sextet(b, url)?) & 0xFFFF;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    (acc & ((1 << bits) - 1) == 0).then_some(out)
}

/// Decodes standard base64 with its padding (`=` to a multiple of 4, as many as needed).
pub fn decode_standard(text: &[u8]) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(4) {
        return None;
    }
    // Within a multiple of 4, at most two `=` are as many as the last group needs.
    let pad = text.iter().rev().take_while(|&&b| b == b'=').count();
    if pad > 2 {
        return None;
    }
    decode(&text[..text.len() - pad], false)
}

/// Decodes URL-safe base64 without padding.
pub fn decode_url(text: &[u8]) -> Option<Vec<u8>> {
    decode(text, true)
}

/// Encodes `bytes` as URL-safe base64 without padding.
pub fn encode_url(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
        for i in 0..=chunk.len() {
            out.push(char::from(ALPHABET[(n >> (18 - 6 * i) & 63) as usize]));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use ::base64::Engine as _;
    use ::base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(3000))]

        // Any bytes encode as the crate encodes them and decode back.
        #[test]
        fn encodes_as_the_crate_does(bytes in prop::collection::vec(any::<u8>(), 0..40)) {
            let text = encode_url(&bytes);
            prop_assert_eq!(&text, &URL_SAFE_NO_PAD.encode(&bytes));
            prop_assert_eq!(decode_url(text.as_bytes()), Some(bytes.clone()));
            prop_assert_eq!(decode_standard(STANDARD.encode(&bytes).as_bytes()), Some(bytes));
        }

        // Any text near base64 (every symbol of both alphabets, `=` anywhere, odd lengths,
        // bits left over): accepted and decoded exactly when the crate does.
        #[test]
        fn decodes_what_the_crate_decodes(text in "[A-Da-c0-3+/_=-]{0,12}|[A-Za-z0-9+/]{0,9}={0,3}|[A-Za-z0-9_-]{0,9}") {
            prop_assert_eq!(decode_standard(text.as_bytes()), STANDARD.decode(&text).ok(), "{}", text);
            prop_assert_eq!(decode_url(text.as_bytes()), URL_SAFE_NO_PAD.decode(&text).ok(), "{}", text);
        }
    }

    #[test]
    fn edges_decode_as_the_crate_decodes() {
        for text in
            ["", "=", "==", "====", "A===", "AA==", "AB==", "AAA=", "AAB=", "AA=A", "AA==AAAA", "AAAA====", "QQ", "QR"]
        {
            assert_eq!(decode_standard(text.as_bytes()), STANDARD.decode(text).ok(), "{text}");
            assert_eq!(decode_url(text.as_bytes()), URL_SAFE_NO_PAD.decode(text).ok(), "{text}");
        }
    }
}
