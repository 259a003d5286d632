//! The policy parser as it was before its integer settings were read through `Ints`: the
//! reference the property test in `config_tests` holds the new one to.

use super::*;

/// Parses `REDCOUNT_POLICIES`: the policies, the failure modes some declare and the local
/// decisions quotas ask for.
#[allow(clippy::type_complexity)]
pub(super) fn parse_policies(
    text: &str,
) -> Result<(Vec<(String, Policy)>, Vec<(String, FailureMode)>, Vec<(String, LocalMode)>), ConfigError> {
    const VAR: &str = "REDCOUNT_POLICIES";
    let (json, repeated) = json::read(text.as_bytes()).map_err(|e| err(VAR, format!("is not valid JSON: {e}")))?;
    let Json::Object(map) = json else {
        return Err(err(VAR, "must be a JSON object of policy name -> settings"));
    };
    if map.is_empty() {
        return Err(err(VAR, "defines no policy"));
    }
    // A map keeps the last of repeated names: a policy defined twice must not pass as one.
    if let Some(path) = repeated {
        // Joined by hand: `[String]::join` is a generic copy of its own in the bundle.
        let at = path.iter().fold(String::from(VAR), |at, key| at + "." + key);
        return Err(err(at, "is defined more than once"));
    }
    let mut out = Vec::with_capacity(map.len());
    let mut failure = Vec::new();
    let mut local = Vec::new();
    for (name, settings) in &map {
        let at = path(VAR, name);
        validate::id("policy", name).map_err(|_| err(&at, "policy names must be 1-64 of A-Z a-z 0-9 _ -"))?;
        let Json::Object(s) = settings else {
            return Err(err(&at, "must be an object with a \"kind\""));
        };
        let mut s = s.clone();
        let (on_unavailable, timeout) = (s.remove("on_unavailable"), s.remove("timeout_ms"));
        let (cache, borrow) = (s.remove("cache_denials_ms"), s.remove("borrow"));
        let policy = parse_policy(&at, &s)?;
        if let Some(mode) = local_mode(&at, &policy, cache.as_ref(), borrow.as_ref())? {
            local.push((name.clone(), mode));
        }
        let allow = match on_unavailable.as_ref().map(|v| v.as_str()) {
            None | Some(Some("deny")) => false,
            Some(Some("allow")) if matches!(policy, Policy::Quota { .. } | Policy::Claim { .. }) => true,
            Some(Some("allow")) => {
                return Err(err(
                    path(&at, "on_unavailable"),
                    "only quotas and claims may allow when Redis does not answer (money and leases always deny)",
                ));
            }
            _ => return Err(err(path(&at, "on_unavailable"), "must be \"deny\" or \"allow\"")),
        };
        let timeout_ms = match &timeout {
            None => None,
            Some(v) => Some(
                u32::try_from(
                    validate::int_json("timeout_ms", v, 1, 60_000)
                        .map_err(|e| err(path(&at, "timeout_ms"), e.to_string()))?,
                )
                .unwrap_or(60_000),
            ),
        };
        if on_unavailable.is_some() || timeout.is_some() {
            failure.push((name.clone(), FailureMode { allow, timeout_ms }));
        }
        out.push((name.clone(), policy));
    }
    Ok((out, failure, local))
}

/// A quota's `cache_denials_ms` and `borrow`, when it gives either (`None` when it gives
/// neither); refused on any other kind of policy, and `borrow` on any but a fixed window.
fn local_mode(
    at: &str,
    policy: &Policy,
    cache: Option<&Json>,
    borrow: Option<&Json>,
) -> Result<Option<LocalMode>, ConfigError> {
    if cache.is_none() && borrow.is_none() {
        return Ok(None);
    }
    let field = if cache.is_some() { "cache_denials_ms" } else { "borrow" };
    let Policy::Quota { algorithm, .. } = policy else {
        return Err(err(path(at, field), format!("is not a setting of a {} policy (quotas only)", policy.kind())));
    };
    let int = |name: &str, v: &Json, lo: i64, hi: i64| {
        validate::int_json("value", v, lo, hi).map_err(|e| err(path(at, name), e.to_string()))
    };
    let mut mode = LocalMode::default();
    if let Some(v) = cache {
        mode.cache_denials_ms = int("cache_denials_ms", v, 0, MAX_CACHE_DENIALS_MS)? as u32;
    }
    if let Some(v) = borrow {
        let redcount_core::ops::quota::Algorithm::FixedWindow { limit, .. } = algorithm else {
            return Err(err(
                path(at, "borrow"),
                "is for fixed windows only: in a sliding window, a bucket or GCRA a unit counts when it is charged, so units used later than they were borrowed could pass the limit",
            ));
        };
        let Json::Object(b) = v else {
            return Err(err(path(at, "borrow"), "must be an object {\"units\": N, \"ms\": N}"));
        };
        if let Some(k) = b.keys().find(|k| *k != "units" && *k != "ms") {
            return Err(err(path(&path(at, "borrow"), k), "is not a setting of borrow (units, ms)"));
        }
        let need = |k: &str| b.get(k).ok_or_else(|| err(path(&path(at, "borrow"), k), "is required"));
        mode.borrow = Some(Borrow {
            units: int("borrow.units", need("units")?, 1, *limit)?,
            ms: int("borrow.ms", need("ms")?, 1, MAX_BORROW_MS)? as u32,
        });
    }
    Ok(Some(mode))
}

/// The integer setting `field` of the settings `s` (at `at`), within `min..=max`, or
/// `default` when absent (required when `None`). Out of line: parse_policy reads a dozen.
#[inline(never)]
fn int_setting(
    s: &Map,
    at: &str,
    field: &'static str,
    min: i64,
    max: i64,
    default: Option<i64>,
) -> Result<i64, ConfigError> {
    match s.get(field) {
        None | Some(Json::Null) => default.ok_or_else(|| err(path(at, field), "is required")),
        Some(v) => validate::int_json(field, v, min, max).map_err(|e| err(path(at, field), e.to_string())),
    }
}

fn parse_policy(at: &str, s: &Map) -> Result<Policy, ConfigError> {
    let int =
        |field: &'static str, min: i64, max: i64, default: Option<i64>| int_setting(s, at, field, min, max, default);
    let word = |field: &str, default: &'static str| -> Result<String, ConfigError> {
        match s.get(field) {
            None => Ok(default.to_owned()),
            Some(Json::String(w)) => Ok(w.clone()),
            Some(_) => Err(err(path(at, field), "must be a string")),
        }
    };
    let kind = match s.get("kind") {
        Some(Json::String(k)) => k.as_str(),
        _ => {
            return Err(err(path(at, "kind"), "must be one of quota, semaphore, counter, claim, redpackets, inbox"));
        }
    };
    let allowed: &[&str] = match kind {
        // A setting of another algorithm is refused, not silently ignored.
        "quota" => match s.get("algorithm").and_then(Json::as_str) {
            Some("sliding") | Some("fixed") | None => {
                &["kind", "algorithm", "limit", "window_ms", "max_cost", "max_debt", "on_expiry"]
            }
            Some("bucket") => {
                &["kind", "algorithm", "capacity", "refill", "interval_ms", "max_cost", "max_debt", "on_expiry"]
            }
            Some("gcra") => &["kind", "algorithm", "rate", "period_ms", "burst", "max_cost", "max_debt", "on_expiry"],
            // An unknown algorithm is named below.
            Some(_) => &[
                "kind",
                "algorithm",
                "limit",
                "window_ms",
                "capacity",
                "refill",
                "interval_ms",
                "rate",
                "period_ms",
                "burst",
                "max_cost",
                "max_debt",
                "on_expiry",
            ],
        },
        "semaphore" => &["kind", "limit", "lease_ms"],
        "counter" => &["kind", "min", "max", "mode", "storage", "ttl_ms", "max_step"],
        "claim" => &["kind", "window_ms"],
        "redpackets" => &["kind", "max_shares", "max_total_cents", "min_cents", "ttl_ms"],
        "inbox" => &["kind", "ttl_ms", "max_len", "max_age_s", "public"],
        other => return Err(err(path(at, "kind"), format!("unknown kind `{other}`"))),
    };
    if let Some(extra) = s.keys().find(|k| !allowed.contains(&k.as_str())) {
        let what = match (kind, s.get("algorithm").and_then(Json::as_str)) {
            ("quota", Some(a)) => format!("a {a} quota"),
            _ => format!("a {kind} policy"),
        };
        return Err(err(path(at, extra), format!("is not a setting of {what}")));
    }
    use redcount_core::ops::{claim, inbox, quota, redpacket, semaphore};
    let policy = match kind {
        "quota" => {
            let algorithm = match word("algorithm", "fixed")?.as_str() {
                "fixed" => Algorithm::FixedWindow {
                    limit: int("limit", 1, quota::MAX_LIMIT, None)?,
                    window_ms: int("window_ms", 1, quota::MAX_WINDOW_MS, None)?,
                },
                "sliding" => Algorithm::SlidingWindow {
                    limit: int("limit", 1, quota::MAX_SLIDING_LIMIT, None)?,
                    window_ms: int("window_ms", 1, quota::MAX_WINDOW_MS, None)?,
                },
                "bucket" => {
                    let capacity = int("capacity", 1, quota::MAX_LIMIT, None)?;
                    let refill = int("refill", 1, capacity, None)?;
                    // A refill from empty within MAX_BUCKET_SPAN (the script's expiry).
                    let steps = (capacity + refill - 1) / refill;
                    let interval_ms =
                        int("interval_ms", 1, quota::MAX_WINDOW_MS.min(quota::MAX_BUCKET_SPAN / steps), None)?;
                    Algorithm::TokenBucket { capacity, refill, interval_ms }
                }
                "gcra" => {
                    let period_ms = int("period_ms", 1, quota::MAX_GCRA_PERIOD_MS, None)?;
                    Algorithm::Gcra {
                        rate: int("rate", 1, quota::MAX_GCRA_RATE, None)?,
                        period_ms,
                        // The span bound keeps the script's exact arithmetic within 2^53.
                        burst: int("burst", 1, quota::MAX_LIMIT.min(quota::MAX_GCRA_SPAN / period_ms), None)?,
                    }
                }
                other => {
                    return Err(err(path(at, "algorithm"), format!("`{other}` is not fixed, sliding, bucket or gcra")));
                }
            };
            let on_expiry = match s.get("on_expiry").map(|w| w.as_str()) {
                None | Some(Some("charge")) => OnExpiry::Charge,
                Some(Some("refund")) => OnExpiry::Refund,
                _ => return Err(err(path(at, "on_expiry"), "must be \"charge\" or \"refund\"")),
            };
            Policy::Quota {
                max_cost: int("max_cost", 1, algorithm.limit(), Some(1))?,
                // Above the size by at most what the algorithm's largest size leaves.
                max_debt: int("max_debt", 0, algorithm.max_size() - algorithm.limit(), Some(0))?,
                on_expiry,
                algorithm,
            }
        }
        "semaphore" => Policy::Semaphore {
            limit: int("limit", 1, semaphore::MAX_LIMIT, None)?,
            lease_ms: int("lease_ms", 1, semaphore::MAX_LEASE_MS, None)?,
        },
        "counter" => {
            let mode = match word("mode", "clamp")?.as_str() {
                "clamp" => Mode::Clamp,
                "reject" => Mode::Reject,
                other => return Err(err(path(at, "mode"), format!("`{other}` is not clamp or reject"))),
            };
            let storage = match word("storage", "key")?.as_str() {
                "key" => Storage::Key,
                "hash" => Storage::HashField,
                other => return Err(err(path(at, "storage"), format!("`{other}` is not key or hash"))),
            };
            let max = match s.get("max") {
                None | Some(Json::Null) => None,
                Some(_) => Some(int("max", -counter::MAX_VALUE, counter::MAX_VALUE, None)?),
            };
            let bounds = Bounds {
                min: int("min", -counter::MAX_VALUE, counter::MAX_VALUE, Some(0))?,
                max,
                mode,
                ttl_ms: int("ttl_ms", 0, counter::MAX_TTL_MS, Some(0))?,
            };
            bounds.validate().map_err(|e| err(path(at, e.field), e.to_string()))?;
            Policy::Counter { bounds, storage, max_step: int("max_step", 1, counter::MAX_VALUE, Some(1))? }
        }
        "claim" => Policy::Claim { window_ms: int("window_ms", 1, claim::MAX_WINDOW_MS, None)? },
        "redpackets" => {
            let max_shares = int("max_shares", 1, redcount_core::split::MAX_COUNT, None)?;
            let min_cents = int("min_cents", 1, redcount_core::split::MAX_TOTAL, Some(1))?;
            Policy::RedPackets {
                max_shares,
                max_total_cents: int("max_total_cents", min_cents, redcount_core::split::MAX_TOTAL, None)?,
                min_cents,
                ttl_ms: int("ttl_ms", 1, redpacket::MAX_TTL_MS, Some(86_400_000))?,
            }
        }
        _ => Policy::Inbox {
            ttl_ms: int("ttl_ms", 1, inbox::MAX_TTL_MS, Some(7 * 86_400_000))?,
            max_len: int("max_len", 1, inbox::MAX_LEN, Some(1000))?,
            max_age_s: int("max_age_s", 1, inbox::MAX_AGE_S, Some(7 * 86_400))?,
            public: match s.get("public") {
                None => false,
                Some(Json::Bool(b)) => *b,
                Some(_) => return Err(err(path(at, "public"), "must be true or false")),
            },
        },
    };
    Ok(policy)
}
