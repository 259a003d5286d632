//! A request's body, path and headers, read into what it asks for ([`Request`]) or refused
//! with a [`Failure`] naming what is wrong. No I/O: the handler reads the body first.

use axum::body::Bytes;
use axum::http::{HeaderMap, HeaderName, Method, StatusCode, Uri};
use serde_json::value::RawValue;

use crate::failure::{Failure, error};

/// One parsed command: name and arguments as bytes.
#[derive(Debug)]
pub(crate) struct Cmd {
    pub name: String,
    pub args: Vec<Vec<u8>>,
}

impl Cmd {
    /// As redis-rs sends it.
    pub(crate) fn to_redis(&self) -> redis::Cmd {
        // Sized once: growing its buffers argument by argument reallocated them.
        let size = self.name.len() + self.args.iter().map(Vec::len).sum::<usize>();
        let mut c = redis::Cmd::with_capacity(self.args.len() + 1, size);
        c.arg(&self.name);
        for a in &self.args {
            c.arg(&a[..]);
        }
        c
    }
}

/// How the answer is encoded (`Upstash-Encoding`, `Upstash-Response-Format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Format {
    /// Strings in base64 (JSON answers only).
    pub base64: bool,
    /// Raw RESP2 instead of JSON.
    pub resp2: bool,
}

/// What a request asks for.
#[derive(Debug)]
pub(crate) enum Request {
    /// `/subscribe/<channel>…` or `/psubscribe/<pattern>…`.
    Subscribe { pattern: bool, names: Vec<Vec<u8>> },
    /// One command: a JSON array posted to `/`, or path style.
    One(Cmd, Format),
    /// A `/pipeline` (`atomic` false) or a `/multi-exec`: each entry parsed on its own, so one
    /// bad entry of a pipeline is that entry's error.
    Many { entries: Vec<Result<Cmd, Failure>>, atomic: bool, format: Format },
}

/// Whether `method` may be used at all (405 otherwise, before anything else).
pub(crate) fn method_allowed(method: &Method) -> bool {
    matches!(*method, Method::GET | Method::POST | Method::PUT | Method::HEAD)
}

/// Reads the request once its body has arrived.
pub(crate) fn parse(method: &Method, uri: &Uri, headers: &HeaderMap, body: &Bytes) -> Result<Request, Failure> {
    if let Some((pattern, names)) = crate::subscribe::kind(uri.path()) {
        let names = names.split('/').filter(|s| !s.is_empty()).map(percent_decode).collect::<Result<_, _>>()?;
        return Ok(Request::Subscribe { pattern, names });
    }
    let format = format(headers)?;
    let path = uri.path();
    match path {
        "/pipeline" | "/multi-exec" => {
            if *method != Method::POST && *method != Method::PUT {
                return Err(error(StatusCode::METHOD_NOT_ALLOWED, format!("ERR {path} takes POST")));
            }
            Ok(Request::Many { entries: parse_many(body)?, atomic: path == "/multi-exec", format })
        }
        "/" if *method == Method::POST || *method == Method::PUT => Ok(Request::One(parse_one(body)?, format)),
        _ => Ok(Request::One(path_command(method, path, uri.query().unwrap_or(""), body)?, format)),
    }
}

/// The answer's encoding from the request's headers.
fn format(headers: &HeaderMap) -> Result<Format, Failure> {
    // Names made once: a `&str` name is parsed again on every look-up.
    static ENCODING: HeaderName = HeaderName::from_static("upstash-encoding");
    static RESPONSE_FORMAT: HeaderName = HeaderName::from_static("upstash-response-format");
    let base64 = header_is(headers, &ENCODING, "base64");
    let resp2 = match headers.get(&RESPONSE_FORMAT).map(|v| v.to_str().map(str::trim)) {
        None => false,
        Some(Ok(f)) if f.eq_ignore_ascii_case("json") => false,
        Some(Ok(f)) if f.eq_ignore_ascii_case("resp2") => true,
        Some(_) => return Err(error(StatusCode::BAD_REQUEST, "ERR Upstash-Response-Format must be json or resp2")),
    };
    if resp2 && base64 {
        return Err(error(
            StatusCode::BAD_REQUEST,
            "ERR Upstash-Encoding: base64 applies to JSON answers; resp2 carries bytes as they are",
        ));
    }
    Ok(Format { base64, resp2 })
}

/// Path style: `/set/foo/bar`, with a POST body as the last argument and query arguments
/// after it (`POST /set/foo?EX=100` is `SET foo <body> EX 100`); `/` alone is PING.
fn path_command(method: &Method, path: &str, query: &str, body: &Bytes) -> Result<Cmd, Failure> {
    let mut parts: Vec<Vec<u8>> =
        path.split('/').filter(|s| !s.is_empty()).map(percent_decode).collect::<Result<_, _>>()?;
    if parts.is_empty() {
        parts.push(b"PING".to_vec());
    }
    if matches!(*method, Method::POST | Method::PUT) && !body.is_empty() {
        parts.push(body.to_vec());
    }
    parts.extend(query_args(query)?);
    let name = String::from_utf8(parts.remove(0))
        .map_err(|_| error(StatusCode::BAD_REQUEST, "ERR command name is not UTF-8"))?;
    Ok(Cmd { name, args: parts })
}

/// A path-style command's query string as arguments, in order: `k=v` gives `k`, `v`; a bare
/// `k` gives `k` (a flag such as `NX`). `_token` is refused: a token in a URL ends up in logs.
fn query_args(query: &str) -> Result<Vec<Vec<u8>>, Failure> {
    let mut out = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = match pair.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (pair, None),
        };
        if k == "_token" {
            return Err(error(
                StatusCode::BAD_REQUEST,
                "ERR a token in the URL is not accepted (URLs get logged): send `Authorization: Bearer <token>`",
            ));
        }
        out.push(percent_decode(k)?);
        if let Some(v) = v {
            out.push(percent_decode(v)?);
        }
    }
    Ok(out)
}

fn header_is(headers: &HeaderMap, name: &HeaderName, want: &str) -> bool {
    headers.get(name).and_then(|v| v.to_str().ok()).is_some_and(|v| v.trim().eq_ignore_ascii_case(want))
}

pub(crate) fn percent_decode(seg: &str) -> Result<Vec<u8>, Failure> {
    redcount_core::text::percent_decode(seg)
        .ok_or_else(|| error(StatusCode::BAD_REQUEST, "ERR malformed percent-encoding in the path"))
}

/// One command from its JSON array. Arguments are sent as the official clients mean them:
/// strings as their text, numbers as their exact JSON text (no float round trip: `1E3` stays
/// `1E3`, 2^70 keeps every digit), booleans and null as `true`, `false`, `null` (the clients
/// send them, and Upstash stores the text).
fn command_from_json(v: &RawValue) -> Result<Cmd, Failure> {
    let items: Vec<&RawValue> = serde_json::from_str(v.get()).map_err(|_| {
        error(StatusCode::BAD_REQUEST, "ERR a command is a JSON array like [\"SET\", \"key\", \"value\"]")
    })?;
    command_from_items(&items)
}

/// [`command_from_json`] once the array is split into its items.
fn command_from_items(items: &[&RawValue]) -> Result<Cmd, Failure> {
    let mut args = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let text = item.get();
        args.push(match text.as_bytes().first() {
            // Without a backslash a JSON string's text is its value (the raw value is valid
            // JSON, so it holds no control character): no second parse.
            Some(b'"') if !text.contains('\\') => text.as_bytes()[1..text.len() - 1].to_vec(),
            Some(b'"') => serde_json::from_str::<String>(text)
                .map_err(|e| error(StatusCode::BAD_REQUEST, format!("ERR argument {i} is not a valid string: {e}")))?
                .into_bytes(),
            Some(b'-' | b'0'..=b'9' | b't' | b'f' | b'n') => text.as_bytes().to_vec(),
            _ => {
                let kind = if text.starts_with('[') { "an array" } else { "an object" };
                return Err(error(
                    StatusCode::BAD_REQUEST,
                    format!("ERR argument {i} is {kind}; every argument must be a string, a number, a boolean or null"),
                ));
            }
        });
    }
    if args.is_empty() {
        return Err(error(StatusCode::BAD_REQUEST, "ERR empty command"));
    }
    let name = String::from_utf8(args.remove(0))
        .map_err(|_| error(StatusCode::BAD_REQUEST, "ERR command name is not UTF-8"))?;
    if name.is_empty() {
        return Err(error(StatusCode::BAD_REQUEST, "ERR empty command name"));
    }
    Ok(Cmd { name, args })
}

fn parse_json(bytes: &Bytes) -> Result<&RawValue, Failure> {
    serde_json::from_slice(bytes)
        .map_err(|e| error(StatusCode::BAD_REQUEST, format!("ERR body is not valid JSON: {e}")))
}

pub(crate) fn parse_one(bytes: &Bytes) -> Result<Cmd, Failure> {
    // A well-formed array in one pass; anything else through the steps that name what is wrong.
    match serde_json::from_slice::<Vec<&RawValue>>(bytes) {
        Ok(items) => command_from_items(&items),
        Err(_) => command_from_json(parse_json(bytes)?),
    }
}

/// The commands of a `/pipeline` or `/multi-exec` body, each parsed on its own: one bad
/// entry is that entry's error, not the whole request's (with auto-pipelining, unrelated
/// calls share a body). The body itself must be a non-empty array.
pub(crate) fn parse_many(bytes: &Bytes) -> Result<Vec<Result<Cmd, Failure>>, Failure> {
    let items: Vec<&RawValue> = serde_json::from_str(parse_json(bytes)?.get())
        .map_err(|_| error(StatusCode::BAD_REQUEST, "ERR body must be a JSON array of commands"))?;
    if items.is_empty() {
        return Err(error(StatusCode::BAD_REQUEST, "ERR empty pipeline"));
    }
    Ok(items.into_iter().map(command_from_json).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The two-step parse `parse_one` takes a shortcut past: same command, or an error both ways.
    fn two_steps(bytes: &Bytes) -> Option<(String, Vec<Vec<u8>>)> {
        let v = parse_json(bytes).ok()?;
        let items: Vec<&RawValue> = serde_json::from_str(v.get()).ok()?;
        let mut args = Vec::new();
        for item in items {
            let text = item.get();
            args.push(match text.as_bytes().first() {
                Some(b'"') => serde_json::from_str::<String>(text).ok()?.into_bytes(),
                Some(b'-' | b'0'..=b'9' | b't' | b'f' | b'n') => text.as_bytes().to_vec(),
                _ => return None,
            });
        }
        if args.is_empty() {
            return None;
        }
        let name = String::from_utf8(args.remove(0)).ok()?;
        (!name.is_empty()).then_some((name, args))
    }

    #[test]
    fn the_one_pass_parse_reads_every_body_as_the_two_step_one() {
        // Bodies put together from pieces that matter to a JSON reader: escapes, non-ASCII,
        // numbers, literals, nesting, whitespace and broken syntax; from a fixed seed, so a
        // failure replays (its case number and body are printed).
        let pieces = [
            "\"SET\"",
            "\"k\"",
            "\"a\\\"b\"",
            "\"\\u00e9\"",
            "\"é\"",
            "\"\\\\\"",
            "\"\\n\"",
            "1",
            "-2.5e3",
            "1E3",
            "true",
            "null",
            "false",
            "[]",
            "{}",
            "[\"x\"]",
            "\"\"",
            " ",
            ",",
            "\"\\ud83d\\ude00\"",
            "\"\\x\"",
            "\"",
        ];
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        for case in 0..20_000 {
            let mut body = String::from(if case % 7 == 0 { " [" } else { "[" });
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            let n = (seed >> 60) as usize;
            for j in 0..n {
                seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                if j > 0 && !(seed >> 59).is_multiple_of(13) {
                    body.push(',');
                }
                body.push_str(pieces[(seed >> 33) as usize % pieces.len()]);
            }
            if case % 11 != 0 {
                body.push(']');
            }
            if case % 5 == 0 {
                body.push_str(" \n");
            }
            let bytes = Bytes::from(body.clone());
            let got = parse_one(&bytes).ok().map(|c| (c.name, c.args));
            assert_eq!(got, two_steps(&bytes), "case {case}: {body}");
        }
    }
}
