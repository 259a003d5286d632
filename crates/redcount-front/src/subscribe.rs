//! `POST /subscribe/<channel>…` and `/psubscribe/<pattern>…` as server-sent events, as the
//! official clients use them: each subscriber gets a Redis connection of its own (pub/sub
//! holds it), at most `--max-subscribers` at once; events are lines
//! `data: subscribe,<channel>,<count>`, `data: message,<channel>,<message>` and
//! `data: pmessage,<pattern>,<channel>,<message>`. The connection ends when the client goes.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use futures_util::StreamExt;

use crate::State;
use crate::auth::Access;

/// How often an idle stream gets a comment line.
const KEEPALIVE: Duration = Duration::from_secs(15);
const KEEPALIVE_LINE: &[u8] = b": keep-alive\n\n";

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
    // redis-rs reads a subscriber's connection as fast as Redis sends, whether or not the
    // client reads its stream: a task moves each message into the stream and counts what
    // waits unread there, so a client that stops reading is dropped, not buffered for.
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<axum::body::Bytes>();
    let waiting = Arc::new(AtomicUsize::new(0));
    let revoked = access.revoked().cloned().unwrap_or_default();
    tokio::spawn(forward(pubsub, tx, waiting.clone(), st.subscriber_backlog, revoked));
    let messages = futures_util::stream::unfold(rx, move |mut rx| {
        let waiting = waiting.clone();
        async move {
            let line = rx.recv().await?;
            waiting.fetch_sub(line.len().min(waiting.load(Ordering::Relaxed)), Ordering::Relaxed);
            Some((Ok::<_, std::convert::Infallible>(line), rx))
        }
    });
    let head = futures_util::stream::iter(first.into_iter().map(|l| Ok(axum::body::Bytes::from(l))));
    let held = Held(permit);
    let body = head.chain(messages).map(move |item| {
        let _held = &held;
        item
    });
    let mut r = Response::new(Body::from_stream(body));
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    Ok(r)
}

/// Moves each message of `pubsub` into the stream `tx` feeds, counting in `waiting` the bytes
/// left unread there; ends past `backlog` of them, when the token is `revoked`, or when Redis
/// ends the connection (saying why, as a comment line), and when the client has gone.
async fn forward(
    pubsub: redis::aio::PubSub,
    tx: tokio::sync::mpsc::UnboundedSender<axum::body::Bytes>,
    counted: Arc<AtomicUsize>,
    backlog: usize,
    revoked: tokio_util::sync::CancellationToken,
) {
    let mut messages = pubsub.into_on_message();
    // A comment now and then: a client that went away is noticed by the failed write
    // (and the stall timeout), and proxies keep the stream open.
    let mut keepalive = tokio::time::interval_at(tokio::time::Instant::now() + KEEPALIVE, KEEPALIVE);
    let why: &str = loop {
        let m = tokio::select! {
            () = tx.closed() => return,
            () = revoked.cancelled() => break "the token was removed",
            _ = keepalive.tick() => {
                counted.fetch_add(KEEPALIVE_LINE.len(), Ordering::Relaxed);
                if tx.send(axum::body::Bytes::from_static(KEEPALIVE_LINE)).is_err() {
                    return;
                }
                continue;
            }
            m = messages.next() => m,
        };
        let Some(m) = m else { break "the Redis connection ended" };
        let payload = m.get_payload_bytes();
        let channel = m.get_channel_name().as_bytes();
        let line = match m.get_pattern::<Option<Vec<u8>>>().ok().flatten() {
            Some(p) => event(&[b"pmessage", &p, channel, payload]),
            None => event(&[b"message", channel, payload]),
        };
        if counted.fetch_add(line.len(), Ordering::Relaxed) + line.len() > backlog {
            metrics::counter!("redcount_rest_subscribers_dropped_total").increment(1);
            tracing::info!("a subscriber left more than --max-subscriber-backlog-bytes ({backlog}) unread: dropped");
            break "more than --max-subscriber-backlog-bytes waited unread";
        }
        if tx.send(axum::body::Bytes::from(line)).is_err() {
            return;
        }
    };
    // An SSE comment: clients skip it; a person reading the stream sees why it ended.
    let _ = tx.send(axum::body::Bytes::from(format!(": closed: {why}\n\n")));
}

/// The subscriber's place, given back (and counted) when its stream is dropped.
struct Held(#[allow(dead_code)] tokio::sync::OwnedSemaphorePermit);

impl Drop for Held {
    fn drop(&mut self) {
        metrics::gauge!("redcount_rest_subscribers").decrement(1.0);
    }
}
