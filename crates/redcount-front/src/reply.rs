//! Redis replies as Upstash JSON (`{"result": …}`, optionally base64) or raw RESP2.

use base64::Engine as _;
use redis::Value;
use serde_json::{Value as Json, json};

/// A reply as the JSON `result`; an error reply nested in an array becomes its message.
pub fn to_json(v: &Value, base64: bool) -> Json {
    let string = |b: &[u8]| -> Json {
        if base64 {
            Json::String(base64::engine::general_purpose::STANDARD.encode(b))
        } else {
            Json::String(String::from_utf8_lossy(b).into_owned())
        }
    };
    match v {
        Value::Nil => Json::Null,
        Value::Int(n) => json!(n),
        Value::BulkString(b) => string(b),
        // Upstash leaves a literal OK unencoded in base64 mode, and the clients expect that.
        Value::SimpleString(s) if s == "OK" => Json::String("OK".into()),
        Value::SimpleString(s) => string(s.as_bytes()),
        Value::Okay => Json::String("OK".into()),
        Value::Array(a) | Value::Set(a) | Value::Push { data: a, .. } => {
            Json::Array(a.iter().map(|x| to_json(x, base64)).collect())
        }
        Value::Map(m) => Json::Array(m.iter().flat_map(|(k, x)| [to_json(k, base64), to_json(x, base64)]).collect()),
        Value::Attribute { data, .. } => to_json(data, base64),
        Value::Double(d) => string(d.to_string().as_bytes()),
        Value::Boolean(b) => json!(*b as i64),
        Value::VerbatimString { text, .. } => string(text.as_bytes()),
        Value::BigNumber(n) => string(n),
        Value::ServerError(e) => Json::String(server_error_text(e)),
        _ => Json::Null,
    }
}

pub fn server_error_text(e: &redis::ServerError) -> String {
    match e.details() {
        Some(d) => format!("{} {}", e.code(), d),
        None => e.code().to_string(),
    }
}

/// Writes `{"result":…}` straight into a buffer: the hot path, no intermediate JSON tree.
pub fn write_result(v: &Value, base64: bool, out: &mut String) {
    out.push_str("{\"result\":");
    write_json(v, base64, out);
    out.push('}');
}

fn write_json(v: &Value, base64: bool, out: &mut String) {
    let string = |b: &[u8], out: &mut String| {
        if base64 {
            out.push('"');
            base64::engine::general_purpose::STANDARD.encode_string(b, out);
            out.push('"');
        } else {
            redcount_core::rest::write_json_string(out, &String::from_utf8_lossy(b));
        }
    };
    match v {
        Value::Nil => out.push_str("null"),
        Value::Int(n) => out.push_str(itoa::Buffer::new().format(*n)),
        Value::BulkString(b) => string(b, out),
        // A literal OK stays unencoded in base64 mode (as in `to_json`).
        Value::Okay => out.push_str("\"OK\""),
        Value::SimpleString(s) if s == "OK" => out.push_str("\"OK\""),
        Value::SimpleString(s) => string(s.as_bytes(), out),
        Value::Array(a) | Value::Set(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_json(x, base64, out);
            }
            out.push(']');
        }
        // Rare shapes (RESP3 only): through the general path.
        other => out.push_str(&to_json(other, base64).to_string()),
    }
}

/// One pipeline entry: `{"result": …}` or `{"error": "…"}`.
pub fn entry(v: &Value, base64: bool) -> Json {
    match v {
        Value::ServerError(e) => json!({ "error": server_error_text(e) }),
        other => json!({ "result": to_json(other, base64) }),
    }
}

/// The RESP2 encoding of a reply (`Upstash-Response-Format: resp2`).
pub fn to_resp2(v: &Value, out: &mut Vec<u8>) {
    let line = |out: &mut Vec<u8>, tag: u8, s: &str| {
        out.push(tag);
        out.extend_from_slice(s.as_bytes());
        out.extend_from_slice(b"\r\n");
    };
    let bulk = |out: &mut Vec<u8>, b: &[u8]| {
        line(out, b'$', &b.len().to_string());
        out.extend_from_slice(b);
        out.extend_from_slice(b"\r\n");
    };
    match v {
        Value::Nil => out.extend_from_slice(b"$-1\r\n"),
        Value::Int(n) => line(out, b':', &n.to_string()),
        Value::BulkString(b) => bulk(out, b),
        Value::SimpleString(s) => line(out, b'+', s),
        Value::Okay => out.extend_from_slice(b"+OK\r\n"),
        Value::Array(a) | Value::Set(a) | Value::Push { data: a, .. } => {
            line(out, b'*', &a.len().to_string());
            for x in a {
                to_resp2(x, out);
            }
        }
        Value::Map(m) => {
            line(out, b'*', &(m.len() * 2).to_string());
            for (k, x) in m {
                to_resp2(k, out);
                to_resp2(x, out);
            }
        }
        Value::Attribute { data, .. } => to_resp2(data, out),
        Value::Double(d) => bulk(out, d.to_string().as_bytes()),
        Value::Boolean(b) => line(out, b':', if *b { "1" } else { "0" }),
        Value::VerbatimString { text, .. } => bulk(out, text.as_bytes()),
        Value::BigNumber(n) => bulk(out, n),
        Value::ServerError(e) => line(out, b'-', &server_error_text(e).replace(['\r', '\n'], " ")),
        _ => out.extend_from_slice(b"$-1\r\n"),
    }
}

/// How a reply goes out to the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// JSON, strings as text (the default).
    Json,
    /// JSON, strings base64 (`Upstash-Encoding: base64`).
    Base64,
    /// Raw RESP2 (`Upstash-Response-Format: resp2`).
    Resp2,
}

/// The encoding a request asked for (RESP2 wins: its strings are raw whatever the other
/// header says).
pub fn encoding(base64: bool, resp2: bool) -> Encoding {
    match (resp2, base64) {
        (true, _) => Encoding::Resp2,
        (false, true) => Encoding::Base64,
        (false, false) => Encoding::Json,
    }
}

/// At least as many bytes as the reply takes once encoded, computed without encoding it. In
/// JSON a control byte becomes `\u0001` (six bytes) and a byte that is not valid UTF-8
/// U+FFFD (three), so a reply may grow sixfold on the way out; base64 grows it by 4/3, and
/// RESP2 only by its framing.
pub fn encoded_len_bound(v: &Value, encoding: Encoding) -> usize {
    let bytes = |b: &[u8]| -> usize {
        match encoding {
            Encoding::Resp2 => b.len() + 16,
            Encoding::Base64 => b.len().div_ceil(3) * 4 + 16,
            Encoding::Json => {
                b.iter()
                    .map(|&c| match c {
                        b'"' | b'\\' => 2,
                        0..=0x1f | 0x7f => 6,
                        0x80.. => 3,
                        _ => 1,
                    })
                    .sum::<usize>()
                    + 16
            }
        }
    };
    match v {
        Value::BulkString(b) => bytes(b),
        Value::SimpleString(s) | Value::VerbatimString { text: s, .. } => bytes(s.as_bytes()),
        Value::BigNumber(n) => bytes(n),
        Value::Array(a) | Value::Set(a) | Value::Push { data: a, .. } => {
            a.iter().map(|x| encoded_len_bound(x, encoding)).sum::<usize>() + 16
        }
        Value::Map(m) => m.iter().map(|(k, x)| encoded_len_bound(k, encoding) + encoded_len_bound(x, encoding)).sum(),
        Value::Attribute { data, .. } => encoded_len_bound(data, encoding),
        Value::ServerError(e) => server_error_text(e).len() * 6 + 16,
        _ => 32,
    }
}
