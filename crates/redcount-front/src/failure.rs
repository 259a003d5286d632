//! A request's failure: the status and message its client gets, and why, as a [`Cause`] later
//! decisions match on (never the message's text). Every failure is made here, and counted here
//! when it comes from Redis or on the way to it (`/metrics`).

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use redcount_core::{ErrorKind, ErrorReply};
use serde_json::json;

use crate::backend::{BUDGET_SPENT, Failed, TOO_LARGE};

/// A request's failure: the status and message the client gets, and why, classified once
/// where it happened.
#[derive(Debug)]
pub(crate) struct Failure {
    pub status: StatusCode,
    pub message: String,
    pub cause: Cause,
}

/// Why a request failed, as far as later steps care.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cause {
    /// Redis answered with an error reply of this kind (the core's one classification: e.g.
    /// `Unavailable` for BUSY / LOADING / TRYAGAIN / CLUSTERDOWN / MASTERDOWN / NOREPLICAS, which ran
    /// nothing and will serve again soon; `Redirect` for a MOVED / ASK the client library's
    /// own redirect budget did not follow).
    Reply(ErrorKind),
    /// The connection ended after the command was sent, before its answer.
    Lost,
    /// A money call ran, but fewer replicas than `--wait-replicas` acknowledged its write.
    NotDurable,
    /// No answer within the request's time limit (it may have run).
    TimedOut,
    /// Redis discarded a transaction whole (EXECABORT): nothing of it ran.
    ExecAbort,
    /// Anything else (refused input, limits).
    Other,
}

/// How a request whose connection Redis closed before the answer fails.
const LOST: &str = "ERR the connection to Redis ended before its answer";

/// A money call not known durable: the first word of its message.
const NOT_DURABLE: &str = "NOTDURABLE";

/// A failure of the front's own (refused input, a limit), with no cause later steps look at.
pub(crate) fn error(status: StatusCode, msg: impl Into<String>) -> Failure {
    Failure { status, message: msg.into(), cause: Cause::Other }
}

/// A failure for Redis's error reply `text` (`CODE detail`), classified by the core.
pub(crate) fn reply_failure(text: String) -> Failure {
    let kind = ErrorReply::new(&text).kind;
    count_redis_error(kind_label(kind));
    let status = reply_status(text.split(' ').next().unwrap_or(""));
    Failure { status, message: text, cause: Cause::Reply(kind) }
}

/// The failure of an error reply Redis gave as a command's answer.
pub(crate) fn server_error(e: &redis::ServerError) -> Failure {
    count_redis_error(kind_label(ErrorReply::new(e.code()).kind));
    error(reply_status(e.code()), crate::reply::server_error_text(e))
}

/// The kind of Redis's error reply `e` (the core's classification of its first word).
pub(crate) fn kind_of(e: &redis::ServerError) -> ErrorKind {
    ErrorReply::new(e.code()).kind
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        let body = match self.cause {
            // Distinct from "not now": it ran, and the client must not take it as durable.
            Cause::NotDurable => json!({ "error": self.message, "durable": false, "may_have_run": true }),
            _ => json!({ "error": self.message }),
        };
        (self.status, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
    }
}

/// A reply past `--max-response-bytes` (`bound`): 400 naming the bound, then `how` to ask
/// instead.
pub(crate) fn too_large(bound: usize, how: &str) -> Failure {
    error(StatusCode::BAD_REQUEST, format!("ERR {TOO_LARGE} ({bound} bytes){how}"))
}

/// Counts a failure from Redis (or on the way to it) by kind, for `/metrics`.
pub(crate) fn count_redis_error(kind: &'static str) {
    metrics::counter!("redcount_rest_redis_errors_total", "kind" => kind).increment(1);
}

/// The metrics label of an error kind.
fn kind_label(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::NoScript => "noscript",
        ErrorKind::WrongType => "wrongtype",
        ErrorKind::Rejected => "rejected",
        ErrorKind::CrossSlot => "crossslot",
        ErrorKind::Redirect => "redirect",
        ErrorKind::Unavailable => "unavailable",
        ErrorKind::Denied => "denied",
        ErrorKind::OutOfMemory => "oom",
        ErrorKind::IdempotencyConflict => "idempotency_conflict",
        _ => "other",
    }
}

/// The status for a Redis error reply: 503 when Redis cannot serve now and ran nothing
/// (`LOADING` after a restart, `BUSY`, `MASTERDOWN`, `NOREPLICAS`, `CLUSTERDOWN`, `TRYAGAIN`), so
/// clients retry; 400 for the rest, as Upstash answers a command's error.
fn reply_status(code: &str) -> StatusCode {
    match ErrorReply::new(code).kind {
        ErrorKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::BAD_REQUEST,
    }
}

/// How a failed call is answered: the one place the backend's [`Failed`] becomes a status,
/// a message and a cause. `timeout` is `--timeout-ms`, for the message.
pub(crate) fn failure(e: &Failed, timeout: std::time::Duration) -> Failure {
    match e {
        Failed::TimedOut => timed_out(timeout),
        Failed::Refused(r) | Failed::Login(r) | Failed::Redis(r) if r.is_timeout() => timed_out(timeout),
        Failed::BudgetSpent => error(StatusCode::SERVICE_UNAVAILABLE, format!("ERR {BUDGET_SPENT}")),
        Failed::TooLarge { .. } => error(
            StatusCode::BAD_REQUEST,
            format!(
                "ERR {e}: ask for less at once (GETRANGE, LRANGE/ZRANGE with a range, HSCAN, fewer commands per pipeline)"
            ),
        ),
        Failed::NotDurable(why) => not_durable(why),
        Failed::Redirected(_) => {
            count_redis_error("redirect");
            error(StatusCode::SERVICE_UNAVAILABLE, format!("ERR {e}: nothing ran; retry"))
        }
        Failed::Unreachable(_) => {
            tracing::error!("redis unreachable: {e}");
            count_redis_error("unreachable");
            error(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("ERR Redis is unreachable (a write may or may not have happened): {e}"),
            )
        }
        Failed::Refused(r) | Failed::Login(r) | Failed::Redis(r) => redis_failure(r),
    }
}

/// A money call whose write fewer replicas than `--wait-replicas` acknowledged (`why`).
pub(crate) fn not_durable(why: &str) -> Failure {
    count_redis_error("not_durable");
    let message = format!("{NOT_DURABLE} not known durable: {why} (--wait-replicas)");
    Failure { status: StatusCode::SERVICE_UNAVAILABLE, message, cause: Cause::NotDurable }
}

/// No answer within `--timeout-ms` (`timeout`).
pub(crate) fn timed_out(timeout: std::time::Duration) -> Failure {
    count_redis_error("timeout");
    Failure {
        status: StatusCode::GATEWAY_TIMEOUT,
        message: format!(
            "ERR Redis did not answer within {} ms (a write may or may not have happened)",
            timeout.as_millis()
        ),
        cause: Cause::TimedOut,
    }
}

/// How a redis-rs error is answered: refused (nothing sent), lost (it may have run), Redis's
/// own error reply.
fn redis_failure(e: &redis::RedisError) -> Failure {
    if e.is_connection_refusal() {
        tracing::error!("redis unreachable: {e}");
        count_redis_error("unreachable");
        return error(StatusCode::SERVICE_UNAVAILABLE, format!("ERR Redis is unreachable: {e}"));
    }
    if e.is_io_error() || e.is_connection_dropped() || e.is_unrecoverable_error() {
        // Sent, but the connection ended before the answer: it may have run, so it is not
        // sent again.
        tracing::error!("redis connection lost: {e}");
        count_redis_error("lost");
        let message = format!("{LOST} (a write may or may not have happened): {e}");
        return Failure { status: StatusCode::SERVICE_UNAVAILABLE, message, cause: Cause::Lost };
    }
    match (e.code(), e.detail()) {
        (Some("EXECABORT"), _) => Failure {
            status: StatusCode::BAD_REQUEST,
            message: "EXECABORT Transaction discarded because of previous errors: Redis refused a queued command (unknown command, wrong number of arguments, or not allowed to this token's Redis user); nothing ran".into(),
            cause: Cause::ExecAbort,
        },
        (Some(code), Some(detail)) => reply_failure(format!("{code} {detail}")),
        (Some(code), None) => reply_failure(code.to_string()),
        _ => error(StatusCode::SERVICE_UNAVAILABLE, format!("ERR Redis request failed: {e}")),
    }
}
