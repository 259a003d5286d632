//! The Upstash REST wire format: command → JSON body, HTTP reply → [`Value`].
//!
//! Requests: `POST /` with a JSON array (one command), `POST /pipeline` or
//! `POST /multi-exec` with an array of arrays. Replies: `{"result": X}` or
//! `{"error": "…"}`; with the `Upstash-Encoding: base64` request header every string in
//! X is base64 (errors are not). redcount always asks for base64, because replies can be
//! binary (an inbox member starts with 4 raw bytes of time).

use crate::json::{self, Json};
use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;

use crate::command::Command;
use crate::error::ErrorReply;
use crate::value::Value;

/// The request header that asks for base64-encoded strings in replies.
pub const ENCODING_HEADER: &str = "Upstash-Encoding";
/// Its value.
pub const ENCODING_BASE64: &str = "base64";

/// The largest REST reply a shell reads (16 MiB, redcount-rest's own default bound): every
/// reply redcount asks for is far smaller, so past it the front is broken or hostile (or plain
/// HTTP was tampered with) and the call fails as the front's fault, the rest unread.
pub const MAX_REPLY: usize = 16 * 1024 * 1024;

// The largest reply redcount asks for, a full page of the inbox (1,000 bodies of 8 KiB, base64,
// with their ids and times: about 11 MB), fits within it.
const _: () =
    assert!((crate::ops::inbox::MAX_PAGE as usize) * (crate::ops::inbox::MAX_BODY.div_ceil(3) * 4 + 128) < MAX_REPLY);

/// How the strings of a reply are encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// Strings as JSON strings (not binary-safe).
    Plain,
    /// Strings base64-encoded (the `Upstash-Encoding: base64` header was sent).
    Base64,
}

/// A REST reply that is not a successful result.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RestError {
    /// Redis (or the front) answered an error reply.
    Reply(ErrorReply),
    /// HTTP 401/403: the token is missing or wrong.
    Unauthorized(String),
    /// The front could not reach Redis (HTTP 5xx), with its message if any.
    Unavailable(u16, String),
    /// The body is not a REST reply.
    Malformed(&'static str),
}

impl fmt::Display for RestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RestError::Reply(e) => write!(f, "redis error: {e}"),
            RestError::Unauthorized(m) => write!(f, "REST front refused the token: {m}"),
            RestError::Unavailable(s, m) => write!(f, "REST front unavailable (HTTP {s}): {m}"),
            RestError::Malformed(m) => write!(f, "malformed REST reply: {m}"),
        }
    }
}

impl core::error::Error for RestError {}

/// Writes `["a","b",…]` with JSON string escaping.
pub(crate) fn write_json_array(out: &mut String, items: &[String]) {
    out.push('[');
    for (i, s) in items.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        write_json_string(out, s);
    }
    out.push(']');
}

/// True when a byte of `s` must be escaped in a JSON string (`"`, `\\`, or below 0x20),
/// eight bytes at a time (each test below says whether any byte of the word matches, never
/// wrongly: the classic "has a zero byte" / "has a byte less than n" word tricks).
fn needs_escape(s: &[u8]) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let below = |w: u64, n: u64| w.wrapping_sub(ONES * n) & !w & HIGH != 0;
    let mut chunks = s.chunks_exact(8);
    for chunk in &mut chunks {
        // Always 8 bytes; zeros otherwise, which count as needing escape (the careful path).
        let w = u64::from_le_bytes(<[u8; 8]>::try_from(chunk).unwrap_or([0; 8]));
        if below(w, 0x20) || below(w ^ (ONES * u64::from(b'"')), 1) || below(w ^ (ONES * u64::from(b'\\')), 1) {
            return true;
        }
    }
    chunks.remainder().iter().any(|&b| b < 0x20 || b == b'"' || b == b'\\')
}

/// Writes one JSON string literal, escaped as serde_json escapes it (so text written here and
/// text serde_json writes are the same bytes).
pub fn write_json_string(out: &mut String, s: &str) {
    out.reserve(s.len() + 2);
    out.push('"');
    // Most arguments (keys, numbers, ids) need no escape at all: copied whole after one scan.
    if !needs_escape(s.as_bytes()) {
        out.push_str(s);
        out.push('"');
        return;
    }
    // Runs of bytes that need no escape are copied whole: most arguments are all one run.
    // Every byte escaped is ASCII, so each cut falls on a char boundary.
    let mut start = 0;
    for (i, b) in s.bytes().enumerate() {
        let escaped = match b {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            0x08 => "\\b",
            0x0c => "\\f",
            b'\n' => "\\n",
            b'\r' => "\\r",
            b'\t' => "\\t",
            0..=0x1f => "",
            _ => continue,
        };
        out.push_str(&s[start..i]);
        if escaped.is_empty() {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            out.push_str("\\u00");
            out.push(HEX[(b as usize) >> 4] as char);
            out.push(HEX[(b as usize) & 0xf] as char);
        } else {
            out.push_str(escaped);
        }
        start = i + 1;
    }
    out.push_str(&s[start..]);
    out.push('"');
}

/// The body of `POST /pipeline` or `POST /multi-exec`: an array of commands.
pub fn pipeline_body(commands: &[Command]) -> String {
    let mut out = String::from("[");
    for (i, c) in commands.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        write_json_array(&mut out, c.parts());
    }
    out.push(']');
    out
}

/// The JSON of a REST reply, or the error its status says (401/403; a 5xx without JSON).
fn envelope(status: u16, body: &[u8]) -> Result<Json, RestError> {
    if status == 401 || status == 403 {
        return Err(RestError::Unauthorized(error_text(body)));
    }
    match json::from_slice(body) {
        Ok(j) => Ok(j),
        Err(_) if status >= 500 => Err(RestError::Unavailable(status, error_text(body))),
        Err(_) => Err(RestError::Malformed("body is not JSON")),
    }
}

/// Reads the reply to `POST /` (one command).
pub fn decode_reply(status: u16, body: &[u8], encoding: Encoding) -> Result<Value, RestError> {
    // The front's usual answer, `{"result":…}` as it writes it, read without building the
    // object around the result (a map per reply): when what lies between the braces after
    // the key is one JSON value, the body is that object and nothing else.
    if status != 401 && status != 403 {
        let inner = body.strip_prefix(b"{\"result\":").and_then(|b| b.strip_suffix(b"}"));
        if let Some(Ok(json)) = inner.map(json::from_slice) {
            return value(json, encoding, 0);
        }
    }
    decode_any_reply(status, body, encoding)
}

/// [`decode_reply`] for every body, through the whole envelope.
fn decode_any_reply(status: u16, body: &[u8], encoding: Encoding) -> Result<Value, RestError> {
    let json = envelope(status, body)?;
    let item = entry(json, encoding)?;
    match item {
        Ok(v) => Ok(v),
        Err(e) if status >= 500 => Err(RestError::Unavailable(status, e.message)),
        Err(e) => Err(RestError::Reply(e)),
    }
}

/// Reads the reply to `POST /pipeline`: one result or error per command, in order.
pub fn decode_pipeline(
    status: u16,
    body: &[u8],
    encoding: Encoding,
) -> Result<Vec<Result<Value, ErrorReply>>, RestError> {
    let json = envelope(status, body)?;
    match json {
        Json::Array(items) => items.into_iter().map(|j| entry(j, encoding)).collect(),
        // A whole pipeline or transaction refused: one error object.
        other => match entry(other, encoding)? {
            Err(e) if status >= 500 => Err(RestError::Unavailable(status, e.message)),
            Err(e) => Err(RestError::Reply(e)),
            Ok(_) => Err(RestError::Malformed("expected an array of results")),
        },
    }
}

/// One `{"result": …}` or `{"error": "…"}` object.
fn entry(json: Json, encoding: Encoding) -> Result<Result<Value, ErrorReply>, RestError> {
    let Json::Object(mut map) = json else {
        return Err(RestError::Malformed("expected an object"));
    };
    if let Some(err) = map.remove("error") {
        return match err {
            Json::String(s) => Ok(Err(ErrorReply::new(s))),
            _ => Err(RestError::Malformed("error is not a string")),
        };
    }
    match map.remove("result") {
        Some(r) => Ok(Ok(value(r, encoding, 0)?)),
        None => Err(RestError::Malformed("neither result nor error")),
    }
}

/// Deepest nesting accepted in a result (Redis replies of redcount nest at most 2).
const MAX_DEPTH: usize = 16;

fn value(json: Json, encoding: Encoding, depth: usize) -> Result<Value, RestError> {
    if depth > MAX_DEPTH {
        return Err(RestError::Malformed("result nested too deeply"));
    }
    Ok(match json {
        Json::Null => Value::Nil,
        Json::Number(n) => Value::Int(n.as_i64().ok_or(RestError::Malformed("number is not a 64-bit integer"))?),
        Json::String(s) => Value::Bytes(match encoding {
            Encoding::Plain => s.into_bytes(),
            Encoding::Base64 => match crate::b64::decode_standard(s.as_bytes()) {
                Some(b) => b,
                // Upstash leaves a literal OK status unencoded.
                None if s == "OK" => s.into_bytes(),
                None => return Err(RestError::Malformed("string is not base64")),
            },
        }),
        Json::Array(items) => {
            Value::Array(items.into_iter().map(|j| value(j, encoding, depth + 1)).collect::<Result<_, _>>()?)
        }
        Json::Bool(_) | Json::Object(_) => return Err(RestError::Malformed("unexpected JSON type in result")),
    })
}

fn error_text(body: &[u8]) -> String {
    if let Ok(Json::Object(map)) = json::from_slice(body)
        && let Some(Json::String(s)) = map.get("error")
    {
        return s.clone();
    }
    let text = String::from_utf8_lossy(&body[..body.len().min(200)]);
    String::from(text.trim())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        // Strings weighted toward what needs escaping (every control char, quotes,
        // backslashes) between runs of ASCII and multi-byte text.
        #[test]
        fn json_strings_are_written_as_serde_json_writes_them(s in "([\\x00-\\x1f\"\\\\\\x7f]|[a-z]{0,8}|[é€😀]){0,12}") {
            let mut out = String::from("x");
            write_json_string(&mut out, &s);
            // The model: serde_json's own escaping (the API's answers and fingerprints are
            // held to its bytes).
            prop_assert_eq!(&out[1..], serde_json::to_string(&s).unwrap());
            prop_assert_eq!(serde_json::from_str::<String>(&out[1..]).unwrap(), s);
        }

        // The short way through a `{"result":…}` reply answers what the whole envelope does,
        // for any result, status and encoding (and for bodies that only look like one).
        #[test]
        fn a_result_reads_as_through_the_whole_envelope(
            inner in prop_oneof![
                "(\\[|\\]|,|[0-9]{1,3}|-1|null|true|\"[A-Za-z0-9+/=]{0,8}\"|\"OK\"|\\{\\}|1\\.5| ){0,8}",
                Just(String::from("1,\"error\":\"ERR x\"")),
                Just(String::from("[1,2]} {\"result\":3")),
            ],
            status in prop_oneof![Just(200_u16), Just(400), Just(401), Just(500), Just(503)],
            base64 in any::<bool>(),
        ) {
            let body = format!("{{\"result\":{inner}}}");
            let encoding = if base64 { Encoding::Base64 } else { Encoding::Plain };
            let fast = decode_reply(status, body.as_bytes(), encoding);
            let whole = decode_any_reply(status, body.as_bytes(), encoding);
            prop_assert_eq!(format!("{fast:?}"), format!("{whole:?}"), "{}", body);
        }

        // The word-at-a-time scan says what a byte-by-byte one says, wherever the byte is.
        #[test]
        fn the_escape_scan_is_exact(bytes in proptest::collection::vec(prop_oneof![8 => 0x20_u8..0x7f, 1 => any::<u8>()], 0..40)) {
            let slow = bytes.iter().any(|&b| b < 0x20 || b == b'"' || b == b'\\');
            prop_assert_eq!(needs_escape(&bytes), slow);
        }
    }
}
