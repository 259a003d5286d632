//! `POST /subscribe/<channel>…` and `/psubscribe/<pattern>…` as server-sent events, as the
//! official clients use them: each subscriber gets a Redis connection of its own (pub/sub
//! holds it), at most `--max-subscribers` at once; events are lines
//! `data: subscribe,<channel>,<count>`, `data: message,<channel>,<message>` and
//! `data: pmessage,<pattern>,<channel>,<message>`. The connection ends when the client goes.

use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use futures_util::StreamExt;

use crate::State;
use crate::auth::Access;

/// Whether `path` asks for a subscription, and of which kind.
pub(crate) fn kind(path: &str) -> Option<(bool, &str)> {
    if let Some(rest) = path.strip_prefix("/subscribe/") {
        return Some((false, rest));
    }
    path.strip_prefix("/psubscribe/").map(|rest| (true, rest))
}

/// One line of an event: a message cannot break the stream (a line break in it would end
/// the `data:` line early), so line breaks travel as `\n`.
fn event(parts: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    out.extend_from_slice(b"data: ");
    for (i, p) in parts.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        for &b in *p {
            match b {
                b'\n' => out.extend_from_slice(b"\\n"),
                b'\r' => out.extend_from_slice(b"\\r"),
                _ => out.push(b),
            }
        }
    }
    out.extend_from_slice(b"\n\n");
    out
}

/// Opens the subscription and answers with its event stream; errors are the caller's to send.
pub(crate) async fn serve(
    st: &State,
    access: &Access,
    pattern: bool,
    names: Vec<Vec<u8>>,
) -> Result<Response, (StatusCode, String)> {
    if names.is_empty() {
        return Err((StatusCode::BAD_REQUEST, "ERR name at least one channel: /subscribe/<channel>".into()));
    }
    let Ok(permit) = st.subscribers.clone().try_acquire_owned() else {
        return Err((
            StatusCode::SERVICE_UNAVAILABLE,
            "ERR too many subscribers at once (--max-subscribers); retry shortly".into(),
        ));
    };
    let info = crate::backend::pubsub_info(&st.redis_url, access.login()).map_err(|e| (StatusCode::BAD_REQUEST, e))?;
    let client = redis::Client::open(info).map_err(|e| (StatusCode::SERVICE_UNAVAILABLE, format!("ERR {e}")))?;
    let mut pubsub = tokio::time::timeout(st.timeout, client.get_async_pubsub())
        .await
        .map_err(|_| (StatusCode::GATEWAY_TIMEOUT, "ERR Redis did not answer in time".into()))?
        .map_err(|e| (StatusCode::SERVICE_UNAVAILABLE, format!("ERR Redis is unreachable: {e}")))?;
    let mut first = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let subscribed =
            if pattern { pubsub.psubscribe(name.as_slice()).await } else { pubsub.subscribe(name.as_slice()).await };
        // Redis refuses what the token's user may not read (ACL channel rules).
        subscribed.map_err(|e| (StatusCode::BAD_REQUEST, format!("ERR {e}")))?;
        let what: &[u8] = if pattern { b"psubscribe" } else { b"subscribe" };
        first.push(event(&[what, name, (i + 1).to_string().as_bytes()]));
    }
    metrics::gauge!("redcount_rest_subscribers").increment(1.0);
    let messages = pubsub.into_on_message().map(move |m| {
        let payload = m.get_payload_bytes();
        let channel = m.get_channel_name().as_bytes();
        let line = match m.get_pattern::<Option<Vec<u8>>>().ok().flatten() {
            Some(p) => event(&[b"pmessage", &p, channel, payload]),
            None => event(&[b"message", channel, payload]),
        };
        Ok::<_, std::convert::Infallible>(axum::body::Bytes::from(line))
    });
    // A comment now and then: a client that went away is noticed by the failed write (and
    // the stall timeout), and proxies keep the stream open.
    let keepalive = futures_util::stream::unfold((), |()| async {
        tokio::time::sleep(Duration::from_secs(15)).await;
        Some((Ok(axum::body::Bytes::from_static(b": keep-alive\n\n")), ()))
    });
    let head = futures_util::stream::iter(first.into_iter().map(|l| Ok(axum::body::Bytes::from(l))));
    let held = Held(permit);
    let body = head.chain(futures_util::stream::select(messages, keepalive)).map(move |item| {
        let _held = &held;
        item
    });
    let mut r = Response::new(Body::from_stream(body));
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    Ok(r)
}

/// The subscriber's place, given back (and counted) when its stream is dropped.
struct Held(#[allow(dead_code)] tokio::sync::OwnedSemaphorePermit);

impl Drop for Held {
    fn drop(&mut self) {
        metrics::gauge!("redcount_rest_subscribers").decrement(1.0);
    }
}
