//! Redis's answers as the client's response: encoded as asked, within `--max-response-bytes`
//! once encoded, and holding their share of `--max-inflight-response-bytes` until sent.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use redis::Value;
use serde_json::{Value as Json, json};

use crate::backend::Held;
use crate::failure::{Failure, error, too_large};
use crate::reply::{self, Encoding};
use crate::request::Format;

/// What the responses are bounded by.
pub(crate) struct Bounds<'a> {
    /// `--max-response-bytes`: also the bound on a reply once encoded.
    pub max_response: usize,
    /// KiB of large responses that may be in flight at once.
    pub budget: &'a Arc<tokio::sync::Semaphore>,
}

/// One command's answer.
pub(crate) fn one(bounds: &Bounds, value: &Value, format: Format, held: Held) -> Result<Response, Failure> {
    encodable(bounds, value, reply::encoding(format.base64, format.resp2))?;
    if format.resp2 {
        let mut out = Vec::new();
        reply::to_resp2(value, &mut out);
        return ok_response(bounds, out, "application/octet-stream", held);
    }
    let mut body = String::with_capacity(64);
    reply::write_result(value, format.base64, &mut body);
    ok_response(bounds, body.into_bytes(), "application/json", held)
}

/// A batch's answer: `answers` in request order, the refused entries' failures in their
/// places. A RESP2 pipeline answer is raw RESP; a transaction's and every JSON one is JSON
/// (base64 if asked).
pub(crate) fn many(
    bounds: &Bounds,
    answers: &[Result<&Value, Failure>],
    atomic: bool,
    format: Format,
    held: Held,
) -> Result<Response, Failure> {
    let raw = format.resp2 && !atomic;
    let encoding = reply::encoding(format.base64, raw);
    let size: usize =
        answers.iter().filter_map(|a| a.as_ref().ok()).map(|v| reply::encoded_len_bound(v, encoding)).sum();
    check_size(bounds, size + 16)?;
    if raw {
        let mut out = Vec::new();
        for answer in answers {
            match answer {
                Ok(item) => reply::to_resp2(item, &mut out),
                // One line: the messages are built here, without line breaks.
                Err(f) => out.extend_from_slice(format!("-{}\r\n", f.message.replace(['\r', '\n'], " ")).as_bytes()),
            }
        }
        return ok_response(bounds, out, "application/octet-stream", held);
    }
    let body = Json::Array(
        answers
            .iter()
            .map(|a| match a {
                Ok(item) => reply::entry(item, format.base64),
                Err(f) => json!({ "error": f.message }),
            })
            .collect(),
    )
    .to_string();
    ok_response(bounds, body.into_bytes(), "application/json", held)
}

/// Refuses a reply that would be larger than `--max-response-bytes` once encoded.
fn encodable(bounds: &Bounds, value: &Value, encoding: Encoding) -> Result<(), Failure> {
    check_size(bounds, reply::encoded_len_bound(value, encoding))
}

fn check_size(bounds: &Bounds, bound: usize) -> Result<(), Failure> {
    if bound > bounds.max_response {
        return Err(too_large(
            bounds.max_response,
            &format!(
                " once encoded (up to {bound}): ask for less at once, or with Upstash-Encoding: base64 for binary values"
            ),
        ));
    }
    Ok(())
}

/// A 200 response. A body over 16 KiB holds its size of `--max-inflight-response-bytes` until
/// it has been sent or dropped (a client that does not read is cut off by the stall timeout),
/// so clients that stop reading cannot make the front hold gigabytes; when that budget is
/// spent, 503. What the replies `read` hold of it (charged as they were read from Redis) is
/// held as long.
fn ok_response(bounds: &Bounds, body: Vec<u8>, content_type: &'static str, read: Held) -> Result<Response, Failure> {
    let mut r = if body.len() <= 16 * 1024 {
        Response::new(Body::from(body))
    } else {
        let kib = u32::try_from(body.len().div_ceil(1024)).unwrap_or(u32::MAX);
        let Ok(permit) = bounds.budget.clone().try_acquire_many_owned(kib) else {
            return Err(error(
                StatusCode::SERVICE_UNAVAILABLE,
                "ERR too many large responses being sent (--max-inflight-response-bytes); retry shortly",
            ));
        };
        let all = Bytes::from(body);
        let chunks: Vec<Bytes> =
            (0..all.len()).step_by(64 * 1024).map(|i| all.slice(i..(i + 64 * 1024).min(all.len()))).collect();
        // The stream owns the permit and hands out 64 KiB at a time (hyper asks for more as it
        // writes), so the permit is given back once the body is as good as sent, or dropped.
        let stream = futures_util::StreamExt::map(futures_util::stream::iter(chunks), move |c| {
            let _held = (&permit, &read);
            Ok::<_, std::convert::Infallible>(c)
        });
        Response::new(Body::from_stream(stream))
    };
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    Ok(r)
}
