//! The standard rate-limit header fields, `RateLimit-Policy` and `RateLimit`
//! (draft-ietf-httpapi-ratelimit-headers-10/-11), made from typed outcomes: a pure function
//! that any shell (the HTTP API, a tower layer) calls with what an operation answered.
//!
//! Each field is a Structured Field List (RFC 9651) of String items named after the policy:
//! `RateLimit-Policy: "per-user";q=100;w=60` (the quota `q` per window `w` seconds, and
//! `qu="concurrent-requests"` for a semaphore), `RateLimit: "per-user";r=42;t=17` (units
//! remaining, seconds until more are available). A compound decision gives one item per part.
//!
//! ```
//! use redcount_core::ops::quota::{Algorithm, QuotaOutcome};
//! use redcount_core::ratelimit::{self, Limit};
//!
//! let algorithm = Algorithm::FixedWindow { limit: 100, window_ms: 60_000 };
//! let taken = QuotaOutcome { allowed: true, limit: 100, remaining: 42, reset_ms: 16_200, retry_after_ms: 0 };
//! let limits = [Limit::quota("per-user", &algorithm, &taken)];
//! assert_eq!(ratelimit::policy_field(&limits), r#""per-user";q=100;w=60"#);
//! assert_eq!(ratelimit::limit_field(&limits), r#""per-user";r=42;t=17"#);
//! ```

use alloc::string::String;

use crate::ops::claim::ClaimOutcome;
use crate::ops::decision::PartOutcome;
use crate::ops::quota::{Algorithm, QuotaOutcome};
use crate::ops::semaphore::SemaphoreOutcome;

/// The `RateLimit-Policy` header's name.
pub const POLICY_HEADER: &str = "RateLimit-Policy";
/// The `RateLimit` header's name.
pub const LIMIT_HEADER: &str = "RateLimit";

/// What a quota counts (the `qu` parameter).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Requests, or units of cost (the draft's default, so `qu` is left out).
    Requests,
    /// Holders at once: a semaphore's leases (`qu="concurrent-requests"`).
    ConcurrentRequests,
}

/// One policy's item in both fields: its quota and what is left of it after a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit<'a> {
    /// The policy's name: the item of both lists.
    pub policy: &'a str,
    /// `q`: the quota (limit, capacity, burst, or a semaphore's holders), as in force for
    /// this subject (its override included).
    pub quota: i64,
    /// `qu`.
    pub unit: Unit,
    /// `w`: the window in seconds (rounded up, at least 1): how long the whole quota takes
    /// to come back. `None` where there is no window (a semaphore).
    pub window_s: Option<i64>,
    /// `r`: units left.
    pub remaining: i64,
    /// `t`: seconds (rounded up) until more units are available: on a denial, until a call
    /// of the same cost can pass (the `Retry-After`, never earlier); otherwise until the
    /// quota is whole again. `None` when not known.
    pub reset_s: Option<i64>,
}

/// `ms` in whole seconds, rounded up (0 stays 0; negative is 0).
pub fn ceil_s(ms: i64) -> i64 {
    if ms <= 0 { 0 } else { ms / 1000 + i64::from(ms % 1000 != 0) }
}

/// The `Retry-After` value for a wait of `ms`: whole seconds, rounded up, at least 1.
pub fn retry_after_s(ms: i64) -> i64 {
    ceil_s(ms).max(1)
}

/// How long `algorithm` takes to give back a whole quota of `size` (its limit in force), in ms.
/// Saturating: policies are bounded far below the overflow (the GCRA span within 2^53).
fn window_ms(algorithm: &Algorithm, size: i64) -> i64 {
    let (size, per) = (size.max(1), |n: i64| n.max(1));
    match *algorithm {
        Algorithm::FixedWindow { window_ms, .. } | Algorithm::SlidingWindow { window_ms, .. } => per(window_ms),
        // Refills of `refill` every `interval_ms`, from empty to `size`.
        Algorithm::TokenBucket { refill, interval_ms, .. } => {
            div_ceil(size, per(refill)).saturating_mul(per(interval_ms))
        }
        // One unit every period/rate, `size` of them.
        Algorithm::Gcra { rate, period_ms, .. } => div_ceil(size.saturating_mul(per(period_ms)), per(rate)),
    }
}

/// `n / d` rounded up (`n` at least 0, `d` at least 1: unsigned, so nothing can trap).
fn div_ceil(n: i64, d: i64) -> i64 {
    let (n, d) = (n.max(0).unsigned_abs(), d.max(1).unsigned_abs());
    i64::try_from(n / d + u64::from(n % d != 0)).unwrap_or(i64::MAX)
}

impl<'a> Limit<'a> {
    /// A quota take or peek of `policy`.
    pub fn quota(policy: &'a str, algorithm: &Algorithm, o: &QuotaOutcome) -> Self {
        Limit {
            policy,
            quota: o.limit,
            unit: Unit::Requests,
            window_s: Some(ceil_s(window_ms(algorithm, o.limit)).max(1)),
            remaining: o.remaining.max(0),
            reset_s: Some(ceil_s(if o.allowed { o.reset_ms } else { o.retry_after_ms })),
        }
    }

    /// A claim (once per `window_ms`): after any claim call the claim is taken, by this call
    /// or an earlier one, so nothing remains until the window ends.
    pub fn claim(policy: &'a str, window_ms: i64, o: &ClaimOutcome) -> Self {
        Limit {
            policy,
            quota: 1,
            unit: Unit::Requests,
            window_s: Some(ceil_s(window_ms).max(1)),
            remaining: 0,
            reset_s: o.window_left_ms.map(ceil_s),
        }
    }

    /// A semaphore's state after an acquire, renew, release or check.
    pub fn lease(policy: &'a str, o: &SemaphoreOutcome) -> Self {
        Self::holders(policy, o.limit, o.in_use, o.earliest_end_ms)
    }

    fn holders(policy: &'a str, limit: i64, in_use: i64, earliest_end_ms: Option<i64>) -> Self {
        let remaining = (limit - in_use).max(0);
        Limit {
            policy,
            quota: limit,
            unit: Unit::ConcurrentRequests,
            window_s: None,
            remaining,
            // When full, a holder comes free when the earliest lease ends.
            reset_s: if remaining == 0 { earliest_end_ms.map(ceil_s) } else { None },
        }
    }

    /// One part of a compound decision: `algorithm` is the part's quota algorithm (`None`
    /// for a lease part).
    pub fn part(policy: &'a str, algorithm: Option<&Algorithm>, o: &PartOutcome) -> Option<Self> {
        match (o, algorithm) {
            (PartOutcome::Quota(q), Some(a)) => Some(Self::quota(policy, a, q)),
            (PartOutcome::Lease { in_use, limit, earliest_end_ms, .. }, _) => {
                Some(Self::holders(policy, *limit, *in_use, *earliest_end_ms))
            }
            (PartOutcome::Quota(_), None) => None,
        }
    }
}

/// The `RateLimit-Policy` field value: one item per limit, `"name";q=…[;qu=…][;w=…]`.
pub fn policy_field(limits: &[Limit<'_>]) -> String {
    let mut out = String::with_capacity(limits.len() * 32);
    for (i, l) in limits.iter().enumerate() {
        item(&mut out, i, l.policy);
        param(&mut out, "q", l.quota);
        if l.unit == Unit::ConcurrentRequests {
            out.push_str(";qu=\"concurrent-requests\"");
        }
        if let Some(w) = l.window_s {
            param(&mut out, "w", w);
        }
    }
    out
}

/// The `RateLimit` field value: one item per limit, `"name";r=…[;t=…]`.
pub fn limit_field(limits: &[Limit<'_>]) -> String {
    let mut out = String::with_capacity(limits.len() * 32);
    for (i, l) in limits.iter().enumerate() {
        item(&mut out, i, l.policy);
        param(&mut out, "r", l.remaining);
        if let Some(t) = l.reset_s {
            param(&mut out, "t", t);
        }
    }
    out
}

/// A list member's String bare item (`, ` between members). Only printable ASCII may appear
/// in a String: `"` and `\` are escaped, anything else outside 0x20..=0x7E becomes `?`
/// (redcount's own policy names are ids, which need neither).
fn item(out: &mut String, index: usize, name: &str) {
    if index > 0 {
        out.push_str(", ");
    }
    out.push('"');
    // Most names (every redcount policy's) need no escape: copied whole.
    if name.bytes().all(|b| matches!(b, b' '..=b'~') && b != b'"' && b != b'\\') {
        out.push_str(name);
        out.push('"');
        return;
    }
    for c in name.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('?'),
        }
    }
    out.push('"');
}

/// An Integer parameter (Structured Fields bound it to 15 digits: larger values are capped).
fn param(out: &mut String, key: &str, value: i64) {
    const MAX: i64 = 999_999_999_999_999;
    out.push(';');
    out.push_str(key);
    out.push('=');
    out.push_str(itoa::Buffer::new().format(value.clamp(0, MAX)));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_round_up() {
        assert_eq!([ceil_s(-5), ceil_s(0), ceil_s(1), ceil_s(1000), ceil_s(1001)], [0, 0, 1, 1, 2]);
        assert_eq!([retry_after_s(0), retry_after_s(4200)], [1, 5]);
    }

    #[test]
    fn windows_are_the_time_a_whole_quota_takes_to_return() {
        let bucket = Algorithm::TokenBucket { capacity: 10, refill: 3, interval_ms: 1000 };
        assert_eq!(window_ms(&bucket, 10), 4000, "4 refills of 3 fill 10");
        let gcra = Algorithm::Gcra { rate: 3, period_ms: 1000, burst: 10 };
        assert_eq!(window_ms(&gcra, 10), 3334);
        let fixed = Algorithm::FixedWindow { limit: 5, window_ms: 1500 };
        assert_eq!(window_ms(&fixed, 9), 1500, "an override changes the quota, not the window");
    }
}
