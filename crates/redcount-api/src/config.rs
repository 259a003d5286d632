//! Server configuration: the named policies, the admin token, CORS, the key namespace; and,
//! apart, where the REST front is ([`RestTarget`], for the shells that call one).
//!
//! A public request names a policy and a subject; it never chooses a limit, a window or a
//! lease. Policies come from `REDCOUNT_POLICIES`, a JSON object of name → settings.

use alloc::borrow::ToOwned;
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec;
use alloc::vec::Vec;
use core::fmt;
use redcount_core::json::{self, Json, Map};

use redcount_core::keys::Namespace;
use redcount_core::ops::counter::{self, Bounds, Mode, Storage};
use redcount_core::ops::quota::Algorithm;
use redcount_core::ops::reservation::OnExpiry;
use redcount_core::validate;

/// A configuration that cannot be used, with the variable and the reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The variable (and policy path) at fault, e.g. `REDCOUNT_POLICIES.daily-prize.limit`.
    pub variable: String,
    /// What is wrong.
    pub problem: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.variable, self.problem)
    }
}

impl core::error::Error for ConfigError {}

// Out of line: configure makes one at each of some forty places.
#[inline(never)]
fn err(variable: impl Into<String>, problem: impl Into<String>) -> ConfigError {
    ConfigError { variable: variable.into(), problem: problem.into() }
}

/// `at.field`, a setting's place in the configuration (one copy, not one per setting).
#[inline(never)]
fn path(at: &str, field: &str) -> String {
    let mut out = String::with_capacity(at.len() + 1 + field.len());
    out.push_str(at);
    out.push('.');
    out.push_str(field);
    out
}

/// One named policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Policy {
    /// N per window for each subject.
    Quota {
        /// How it counts.
        algorithm: Algorithm,
        /// Largest cost a public request may ask for.
        max_cost: i64,
        /// The most units a reservation's overrun may leave it above its size (0: none; the
        /// overrun is charged up to the size, the rest reported uncharged).
        max_debt: i64,
        /// What a reservation whose lease ends unsettled does with its units.
        on_expiry: OnExpiry,
    },
    /// At most `limit` holders, each with a lease.
    Semaphore {
        /// Holders at once.
        limit: i64,
        /// Lease length in ms.
        lease_ms: i64,
    },
    /// A bounded counter per subject.
    Counter {
        /// Bounds and mode.
        bounds: Bounds,
        /// Key per subject, or one hash per policy.
        storage: Storage,
        /// Largest |delta| a public request may apply.
        max_step: i64,
    },
    /// Once per window for each subject.
    Claim {
        /// Window length in ms.
        window_ms: i64,
    },
    /// Red packets the public may create within limits.
    RedPackets {
        /// Most shares of a public packet.
        max_shares: i64,
        /// Largest total of a public packet, in cents.
        max_total_cents: i64,
        /// Smallest share, in cents.
        min_cents: i64,
        /// Life of a packet, in ms.
        ttl_ms: i64,
    },
    /// Per-user inboxes.
    Inbox {
        /// TTL of a new inbox, in ms.
        ttl_ms: i64,
        /// Messages kept.
        max_len: i64,
        /// Age after which trim drops a message, in s.
        max_age_s: i64,
        /// Whether requests without the admin token may use it.
        public: bool,
    },
}

impl Policy {
    /// The kind as named in the JSON.
    pub fn kind(&self) -> &'static str {
        match self {
            Policy::Quota { .. } => "quota",
            Policy::Semaphore { .. } => "semaphore",
            Policy::Counter { .. } => "counter",
            Policy::Claim { .. } => "claim",
            Policy::RedPackets { .. } => "redpackets",
            Policy::Inbox { .. } => "inbox",
        }
    }

    /// The policy as public JSON (it holds no secret).
    #[cfg(feature = "std")]
    pub fn to_json(&self) -> serde_json::Value {
        let mut text = String::new();
        self.write_json(&mut text);
        serde_json::from_str(&text).unwrap_or(serde_json::Value::Null)
    }

    /// Writes the policy as public JSON (the text serde_json makes of [`Policy::to_json`]).
    pub(crate) fn write_json(&self, out: &mut String) {
        use crate::Field::{Bool, Int, Word};
        let opt = crate::Field::opt;
        match *self {
            Policy::Quota { algorithm, max_cost, max_debt, on_expiry } => {
                let quota = ("kind", Word("quota"));
                let mut fields = match algorithm {
                    Algorithm::FixedWindow { limit, window_ms } | Algorithm::SlidingWindow { limit, window_ms } => {
                        let name = if matches!(algorithm, Algorithm::FixedWindow { .. }) { "fixed" } else { "sliding" };
                        vec![quota, ("algorithm", Word(name)), ("limit", Int(limit)), ("window_ms", Int(window_ms))]
                    }
                    Algorithm::TokenBucket { capacity, refill, interval_ms } => vec![
                        quota,
                        ("algorithm", Word("bucket")),
                        ("capacity", Int(capacity)),
                        ("refill", Int(refill)),
                        ("interval_ms", Int(interval_ms)),
                    ],
                    Algorithm::Gcra { rate, period_ms, burst } => vec![
                        quota,
                        ("algorithm", Word("gcra")),
                        ("rate", Int(rate)),
                        ("period_ms", Int(period_ms)),
                        ("burst", Int(burst)),
                    ],
                };
                fields.push(("max_cost", Int(max_cost)));
                // The reservation settings only when not the defaults, so a policy without
                // them reads as before.
                if max_debt != 0 {
                    fields.push(("max_debt", Int(max_debt)));
                }
                if on_expiry == OnExpiry::Refund {
                    fields.push(("on_expiry", Word("refund")));
                }
                crate::object(out, &mut fields)
            }
            Policy::Semaphore { limit, lease_ms } => crate::object(
                out,
                &mut [("kind", Word("semaphore")), ("limit", Int(limit)), ("lease_ms", Int(lease_ms))],
            ),
            Policy::Counter { bounds, storage, max_step } => crate::object(
                out,
                &mut [
                    ("kind", Word("counter")),
                    ("min", Int(bounds.min)),
                    ("max", opt(bounds.max)),
                    ("mode", Word(if bounds.mode == Mode::Clamp { "clamp" } else { "reject" })),
                    ("storage", Word(if storage == Storage::Key { "key" } else { "hash" })),
                    ("ttl_ms", Int(bounds.ttl_ms)),
                    ("max_step", Int(max_step)),
                ],
            ),
            Policy::Claim { window_ms } => {
                crate::object(out, &mut [("kind", Word("claim")), ("window_ms", Int(window_ms))])
            }
            Policy::RedPackets { max_shares, max_total_cents, min_cents, ttl_ms } => crate::object(
                out,
                &mut [
                    ("kind", Word("redpackets")),
                    ("max_shares", Int(max_shares)),
                    ("max_total_cents", Int(max_total_cents)),
                    ("min_cents", Int(min_cents)),
                    ("ttl_ms", Int(ttl_ms)),
                ],
            ),
            Policy::Inbox { ttl_ms, max_len, max_age_s, public } => crate::object(
                out,
                &mut [
                    ("kind", Word("inbox")),
                    ("ttl_ms", Int(ttl_ms)),
                    ("max_len", Int(max_len)),
                    ("max_age_s", Int(max_age_s)),
                    ("public", Bool(public)),
                ],
            ),
        }
    }
}

/// What the API needs: the policies, the admin token, CORS, the key namespace (where REST
/// calls go is [`RestTarget`]).
#[derive(Clone, PartialEq, Eq)]
pub struct Config {
    /// The admin token (secret); `None` disables admin actions.
    pub admin_token: Option<String>,
    /// Named policies, in their JSON order.
    pub policies: Vec<(String, Policy)>,
    /// Origins allowed to call the API from a browser (CORS); empty: same origin only.
    pub cors_origins: Vec<String>,
    /// The first part of every key (`REDCOUNT_NAMESPACE`, default `rc`).
    pub namespace: Namespace,
    /// Derives red-packet ids from idempotency keys (see [`Config::id_secret`]).
    id_secret: Vec<u8>,
    /// Each policy's declared failure mode, when it declares one.
    failure: Vec<(String, FailureMode)>,
    /// Each quota policy's local decisions, when they differ from the default.
    local: Vec<(String, LocalMode)>,
    /// Each policy's [`Config::fingerprint`], in `policies` order (computed once: a local
    /// state asks for it on every take).
    fingerprints: Vec<u64>,
}

/// What a shell may decide without Redis for a quota policy (`"cache_denials_ms"` and
/// `"borrow"` in its JSON): see [`crate::Local`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalMode {
    /// How long a shell may repeat a denial from memory, in ms (never past the denial's own
    /// `retry_after_ms`); 0: never. Default [`DEFAULT_CACHE_DENIALS_MS`].
    pub cache_denials_ms: u32,
    /// Budget leases (fixed windows only), if the policy asks for them.
    pub borrow: Option<Borrow>,
}

/// A quota's budget leases (`"borrow": {"units": 50, "ms": 1000}`): a shell takes up to
/// `units` of a subject's remaining limit in one call, admits from that stock for at most
/// `ms`, then gives back what it did not use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Borrow {
    /// Most units one shell borrows at once.
    pub units: i64,
    /// Longest a shell admits from one borrow, in ms.
    pub ms: u32,
}

/// How long a denial may be repeated from memory unless a policy says otherwise, in ms.
pub const DEFAULT_CACHE_DENIALS_MS: u32 = 1000;
/// Longest `cache_denials_ms` (and the staleness it allows after an override elsewhere).
pub const MAX_CACHE_DENIALS_MS: i64 = 60_000;
/// Longest `borrow.ms`: a worker gives back a lease's units after a response (`waitUntil`),
/// which the platform runs for at most 30 s.
pub const MAX_BORROW_MS: i64 = 30_000;

impl Default for LocalMode {
    fn default() -> Self {
        LocalMode { cache_denials_ms: DEFAULT_CACHE_DENIALS_MS, borrow: None }
    }
}

/// What a policy answers when Redis or the REST front does not answer in time
/// (`"on_unavailable"` and `"timeout_ms"` in its JSON). Never a silent allow: the answer says
/// `"degraded": true` and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FailureMode {
    /// `"allow"` (quotas and claims only): the call passes, marked degraded. Otherwise it is
    /// refused (503), marked degraded. Money and lease paths (counters, red packets,
    /// semaphores, inboxes) always refuse.
    pub allow: bool,
    /// The most a call of this policy waits for Redis, in ms (`None`: the shell's own bound).
    pub timeout_ms: Option<u32>,
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the secrets.
        f.debug_struct("Config")
            .field("policies", &self.policies)
            .field("cors_origins", &self.cors_origins)
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

/// Shortest accepted secret, in bytes.
pub const MIN_SECRET_LEN: usize = 16;

impl Config {
    /// The key red-packet ids are derived with (from an `Idempotency-Key`), so ids cannot be
    /// predicted from a key: `REDCOUNT_ID_SECRET` when set, else the admin token. It depends
    /// on nothing about the transport, so every shell of one deployment (the worker, `serve`
    /// over REST or over RESP) derives the same id for a key. Rotating it changes the id a
    /// replay derives, so rotate when no replay is pending (replies are kept 24 h).
    pub fn id_secret(&self) -> &[u8] {
        &self.id_secret
    }

    /// Reads the configuration through `var` (an environment lookup).
    ///
    /// `REDCOUNT_POLICIES` is required; `REDCOUNT_ADMIN_TOKEN`, `REDCOUNT_CORS_ORIGINS`
    /// (comma-separated), `REDCOUNT_NAMESPACE` and `REDCOUNT_ID_SECRET` are optional (an empty
    /// namespace is refused: unset it for the default). `REDCOUNT_REST_TOKEN`, when set, is
    /// read only to check the admin token differs from it; where REST calls go is
    /// [`RestTarget`]'s business.
    pub fn from_env(var: impl Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        let required = |name: &str| -> Result<String, ConfigError> {
            match var(name) {
                Some(v) if !v.trim().is_empty() => Ok(v.trim().to_owned()),
                _ => Err(err(name, "is not set")),
            }
        };
        let rest_token = var("REDCOUNT_REST_TOKEN").map(|t| t.trim().to_owned()).unwrap_or_default();
        let admin_token = match var("REDCOUNT_ADMIN_TOKEN").map(|t| t.trim().to_owned()) {
            Some(t) if t.is_empty() => None,
            Some(t) if t.len() < MIN_SECRET_LEN => {
                return Err(err("REDCOUNT_ADMIN_TOKEN", format!("must be at least {MIN_SECRET_LEN} characters")));
            }
            Some(t) if t == rest_token => {
                return Err(err("REDCOUNT_ADMIN_TOKEN", "must differ from REDCOUNT_REST_TOKEN"));
            }
            other => other,
        };
        let policies = parse_policies(&required("REDCOUNT_POLICIES")?)?;
        let cors_origins = var("REDCOUNT_CORS_ORIGINS")
            .unwrap_or_default()
            .split(',')
            .map(|s| s.trim().trim_end_matches('/').to_owned())
            .filter(|s| !s.is_empty())
            .collect();
        // Set but empty is a mistake, not a wish for the default: two deployments would share
        // every key without anyone having said so.
        let namespace = match var("REDCOUNT_NAMESPACE").map(|n| n.trim().to_owned()) {
            Some(n) if n.is_empty() => {
                return Err(err("REDCOUNT_NAMESPACE", "is empty: unset it for the default namespace (rc)"));
            }
            Some(n) => Namespace::new(&n).map_err(|e| err("REDCOUNT_NAMESPACE", e.to_string()))?,
            None => Namespace::default(),
        };
        let id_secret = match var("REDCOUNT_ID_SECRET").map(|t| t.trim().to_owned()).filter(|t| !t.is_empty()) {
            Some(t) if t.len() < MIN_SECRET_LEN => {
                return Err(err("REDCOUNT_ID_SECRET", format!("must be at least {MIN_SECRET_LEN} characters")));
            }
            Some(t) => Vec::from(t.as_bytes()),
            None => Vec::from(admin_token.as_deref().unwrap_or("").as_bytes()),
        };
        let (policies, failure, local) = policies;
        let mut config = Config {
            admin_token,
            policies,
            cors_origins,
            namespace,
            id_secret,
            failure,
            local,
            fingerprints: Vec::new(),
        };
        config.fingerprints = config.policies.iter().map(|(name, p)| config.digest(name, p)).collect();
        Ok(config)
    }

    /// The declared failure mode of the policy called `name` (the default: refuse, within
    /// the shell's own bound).
    pub fn failure_mode(&self, name: &str) -> FailureMode {
        self.failure.iter().find(|(n, _)| n == name).map(|(_, f)| *f).unwrap_or_default()
    }

    /// What shells may decide without Redis for the policy called `name` (the default for a
    /// policy that says nothing: denials repeated for [`DEFAULT_CACHE_DENIALS_MS`], no leases).
    pub fn local_mode(&self, name: &str) -> LocalMode {
        self.local.iter().find(|(n, _)| n == name).map(|(_, m)| *m).unwrap_or_default()
    }

    /// A fingerprint of the definition of the policy called `name`: the first 8 bytes of the
    /// SHA-1 of its public JSON, its declared failure mode and its local decisions, so the same definition has the
    /// same fingerprint in every process and build, and any change to it (a redeploy that
    /// raises a limit) another one. What a shell keys state by that must not outlive the
    /// definition (a cache of denials). `None` when no policy has that name.
    ///
    /// ```
    /// use redcount_api::Config;
    ///
    /// let with = |policies: &str| {
    ///     let policies = policies.to_string();
    ///     Config::from_env(move |v| (v == "REDCOUNT_POLICIES").then(|| policies.clone())).unwrap()
    /// };
    /// let a = with(r#"{"q": {"kind": "quota", "limit": 5, "window_ms": 1000}}"#);
    /// let b = with(r#"{"q": {"window_ms": 1000, "limit": 5, "kind": "quota"}, "other": {"kind": "claim", "window_ms": 1}}"#);
    /// let c = with(r#"{"q": {"kind": "quota", "limit": 6, "window_ms": 1000}}"#);
    /// assert_eq!(a.fingerprint("q"), b.fingerprint("q"));
    /// assert_ne!(a.fingerprint("q"), c.fingerprint("q"));
    /// assert_eq!(a.fingerprint("nope"), None);
    /// ```
    pub fn fingerprint(&self, name: &str) -> Option<u64> {
        let at = self.policies.iter().position(|(n, _)| n == name)?;
        self.fingerprints.get(at).copied()
    }

    fn digest(&self, name: &str, policy: &Policy) -> u64 {
        let mut text = String::new();
        policy.write_json(&mut text);
        let mode = self.failure_mode(name);
        text.push_str(if mode.allow { "\nallow\n" } else { "\ndeny\n" });
        text.push_str(itoa::Buffer::new().format(mode.timeout_ms.unwrap_or(0)));
        // Only what differs from the default, so a policy's fingerprint stays what it was.
        let local = self.local_mode(name);
        if local != LocalMode::default() {
            let borrow = local.borrow.map_or((0, 0), |b| (b.units, b.ms));
            text.push_str(&format!("\ncache {}\nborrow {} {}", local.cache_denials_ms, borrow.0, borrow.1));
        }
        let digest = redcount_core::sha1::digest(text.as_bytes());
        let mut first = [0; 8];
        first.copy_from_slice(&digest[..8]);
        u64::from_be_bytes(first)
    }

    /// The policy called `name`.
    pub fn policy(&self, name: &str) -> Option<&Policy> {
        self.policies.iter().find(|(n, _)| n == name).map(|(_, p)| p)
    }

    /// The first policy of a kind (red packets and inboxes are not named in their routes).
    pub fn first_of(&self, kind: &str) -> Option<(&str, &Policy)> {
        self.policies.iter().find(|(_, p)| p.kind() == kind).map(|(n, p)| (n.as_str(), p))
    }
}

/// Where a shell sends the API's calls: an Upstash-compatible REST front and its token.
#[derive(Clone, PartialEq, Eq)]
pub struct RestTarget {
    /// Base URL, without a trailing `/` (`REDCOUNT_REST_URL`).
    pub url: String,
    /// Its token (secret; `REDCOUNT_REST_TOKEN`).
    pub token: String,
}

impl fmt::Debug for RestTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RestTarget").field("url", &self.url).finish_non_exhaustive()
    }
}

impl RestTarget {
    /// Reads `REDCOUNT_REST_URL` (http:// or https://) and `REDCOUNT_REST_TOKEN`, both required.
    pub fn from_env(var: impl Fn(&str) -> Option<String>) -> Result<RestTarget, ConfigError> {
        let required = |name: &str| match var(name).map(|v| v.trim().to_owned()) {
            Some(v) if !v.is_empty() => Ok(v),
            _ => Err(err(name, "is not set")),
        };
        let url = required("REDCOUNT_REST_URL")?;
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(err("REDCOUNT_REST_URL", "must start with http:// or https://"));
        }
        Ok(RestTarget { url: url.trim_end_matches('/').to_owned(), token: required("REDCOUNT_REST_TOKEN")? })
    }
}

/// Parses `REDCOUNT_POLICIES`: the policies, the failure modes some declare and the local
/// decisions quotas ask for.
#[allow(clippy::type_complexity)]
fn parse_policies(
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
                "is for fixed windows only (elsewhere a unit counts when charged, not when used)",
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

/// Each kind's settings as its JSON may give them (a quota's, of every algorithm; each
/// algorithm takes its own few), besides the ones every policy may give (`on_unavailable`,
/// `timeout_ms`) and a quota's local decisions (`cache_denials_ms`, `borrow`).
const SETTINGS: [(&str, &[&str]); 6] = [
    (
        "quota",
        &[
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
    ),
    ("semaphore", &["kind", "limit", "lease_ms"]),
    ("counter", &["kind", "min", "max", "mode", "storage", "ttl_ms", "max_step"]),
    ("claim", &["kind", "window_ms"]),
    ("redpackets", &["kind", "max_shares", "max_total_cents", "min_cents", "ttl_ms"]),
    ("inbox", &["kind", "ttl_ms", "max_len", "max_age_s", "public"]),
];

/// A policy's integer settings, read in order with the first error kept: a read after an
/// error answers its `min` (safe for the bounds computed from it) and checks nothing, so a
/// policy reads straight through and reports that first error once, not at every read.
struct Ints<'a> {
    s: &'a Map,
    at: &'a str,
    error: Option<ConfigError>,
}

impl Ints<'_> {
    /// [`int_setting`], or `min` once an error is kept.
    #[inline(never)]
    fn int(&mut self, field: &'static str, min: i64, max: i64, default: Option<i64>) -> i64 {
        if self.error.is_none() {
            match int_setting(self.s, self.at, field, min, max, default) {
                Ok(v) => return v,
                Err(e) => self.error = Some(e),
            }
        }
        min
    }

    /// The first error kept, before a check of something else may report its own.
    fn check(&mut self) -> Result<(), ConfigError> {
        self.error.take().map_or(Ok(()), Err)
    }
}

fn parse_policy(at: &str, s: &Map) -> Result<Policy, ConfigError> {
    let mut ints = Ints { s, at, error: None };
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
            Some(_) => SETTINGS[0].1,
        },
        other => match SETTINGS.iter().find(|(k, _)| *k == other) {
            Some((_, settings)) => settings,
            None => return Err(err(path(at, "kind"), format!("unknown kind `{other}`"))),
        },
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
                    limit: ints.int("limit", 1, quota::MAX_LIMIT, None),
                    window_ms: ints.int("window_ms", 1, quota::MAX_WINDOW_MS, None),
                },
                "sliding" => Algorithm::SlidingWindow {
                    limit: ints.int("limit", 1, quota::MAX_SLIDING_LIMIT, None),
                    window_ms: ints.int("window_ms", 1, quota::MAX_WINDOW_MS, None),
                },
                "bucket" => {
                    let capacity = ints.int("capacity", 1, quota::MAX_LIMIT, None);
                    let refill = ints.int("refill", 1, capacity, None);
                    // A refill from empty within MAX_BUCKET_SPAN (the script's expiry).
                    let steps = (capacity + refill - 1) / refill;
                    let interval_ms =
                        ints.int("interval_ms", 1, quota::MAX_WINDOW_MS.min(quota::MAX_BUCKET_SPAN / steps), None);
                    Algorithm::TokenBucket { capacity, refill, interval_ms }
                }
                "gcra" => {
                    let period_ms = ints.int("period_ms", 1, quota::MAX_GCRA_PERIOD_MS, None);
                    Algorithm::Gcra {
                        rate: ints.int("rate", 1, quota::MAX_GCRA_RATE, None),
                        period_ms,
                        // The span bound keeps the script's exact arithmetic within 2^53.
                        burst: ints.int("burst", 1, quota::MAX_LIMIT.min(quota::MAX_GCRA_SPAN / period_ms), None),
                    }
                }
                other => {
                    return Err(err(path(at, "algorithm"), format!("`{other}` is not fixed, sliding, bucket or gcra")));
                }
            };
            ints.check()?;
            let on_expiry = match s.get("on_expiry").map(|w| w.as_str()) {
                None | Some(Some("charge")) => OnExpiry::Charge,
                Some(Some("refund")) => OnExpiry::Refund,
                _ => return Err(err(path(at, "on_expiry"), "must be \"charge\" or \"refund\"")),
            };
            Policy::Quota {
                max_cost: ints.int("max_cost", 1, algorithm.limit(), Some(1)),
                // Above the size by at most what the algorithm's largest size leaves.
                max_debt: ints.int("max_debt", 0, algorithm.max_size() - algorithm.limit(), Some(0)),
                on_expiry,
                algorithm,
            }
        }
        "semaphore" => Policy::Semaphore {
            limit: ints.int("limit", 1, semaphore::MAX_LIMIT, None),
            lease_ms: ints.int("lease_ms", 1, semaphore::MAX_LEASE_MS, None),
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
                Some(_) => Some(ints.int("max", -counter::MAX_VALUE, counter::MAX_VALUE, None)),
            };
            let bounds = Bounds {
                min: ints.int("min", -counter::MAX_VALUE, counter::MAX_VALUE, Some(0)),
                max,
                mode,
                ttl_ms: ints.int("ttl_ms", 0, counter::MAX_TTL_MS, Some(0)),
            };
            ints.check()?;
            bounds.validate().map_err(|e| err(path(at, e.field), e.to_string()))?;
            Policy::Counter { bounds, storage, max_step: ints.int("max_step", 1, counter::MAX_VALUE, Some(1)) }
        }
        "claim" => Policy::Claim { window_ms: ints.int("window_ms", 1, claim::MAX_WINDOW_MS, None) },
        "redpackets" => {
            let max_shares = ints.int("max_shares", 1, redcount_core::split::MAX_COUNT, None);
            let min_cents = ints.int("min_cents", 1, redcount_core::split::MAX_TOTAL, Some(1));
            Policy::RedPackets {
                max_shares,
                max_total_cents: ints.int("max_total_cents", min_cents, redcount_core::split::MAX_TOTAL, None),
                min_cents,
                ttl_ms: ints.int("ttl_ms", 1, redpacket::MAX_TTL_MS, Some(86_400_000)),
            }
        }
        _ => Policy::Inbox {
            ttl_ms: ints.int("ttl_ms", 1, inbox::MAX_TTL_MS, Some(7 * 86_400_000)),
            max_len: ints.int("max_len", 1, inbox::MAX_LEN, Some(1000)),
            max_age_s: ints.int("max_age_s", 1, inbox::MAX_AGE_S, Some(7 * 86_400)),
            public: match s.get("public") {
                None | Some(Json::Bool(false)) => false,
                Some(Json::Bool(true)) => true,
                // After the integers: their error comes first.
                Some(_) => {
                    ints.check()?;
                    return Err(err(path(at, "public"), "must be true or false"));
                }
            },
        },
    };
    ints.check()?;
    Ok(policy)
}

#[cfg(test)]
mod config_tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    /// The settings `parse_policies` takes out before `parse_policy` sees the rest.
    const OUTER: [&str; 4] = ["on_unavailable", "timeout_ms", "cache_denials_ms", "borrow"];
    const WORDS: [&str; 16] = [
        "fixed", "sliding", "bucket", "gcra", "charge", "refund", "clamp", "reject", "key", "hash", "allow", "deny",
        "quota", "x", "", "5",
    ];
    /// The bounds the settings are checked against, each ±1, and a few other edges.
    const INTS: [i64; 34] = [
        0,
        1,
        2,
        3,
        -1,
        7,
        10,
        60,
        100,
        1000,
        59_999,
        60_000,
        60_001,
        30_000,
        30_001,
        86_400,
        604_800,
        86_400_000,
        604_800_000,
        1 << 31,
        1 << 32,
        1 << 40,
        1 << 53,
        (1 << 53) + 1,
        1_000_000,
        1_000_001,
        1_000_000_000,
        999_999_999_999_999,
        1_000_000_000_000_000,
        -1_000_000_000_000_000,
        4_000_000_000,
        i64::MAX,
        i64::MIN,
        31_536_000_000,
    ];

    /// A value for a setting: mostly small valid-looking integers, sometimes a boundary, a
    /// word, another type, or an integer written another way.
    fn value(rng: &mut StdRng, depth: u32) -> String {
        match rng.random_range(0..20) {
            0..=6 => rng.random_range(1..50i64).to_string(),
            7..=10 => INTS[rng.random_range(0..INTS.len())].to_string(),
            11 | 12 => format!("\"{}\"", WORDS[rng.random_range(0..WORDS.len())]),
            13 => ["null", "true", "false"][rng.random_range(0..3)].to_string(),
            14 => ["1.5", "1e3", "-0", "18446744073709551616", "1.0"][rng.random_range(0..5)].to_string(),
            15 => format!("\"{}\"", ["12", "012", "-0", "1.5", "9223372036854775808"][rng.random_range(0..5)]),
            16 if depth == 0 => {
                let mut fields = Vec::new();
                for k in ["units", "ms", "other"] {
                    if rng.random_bool(if k == "other" { 0.1 } else { 0.85 }) {
                        fields.push(format!("\"{k}\":{}", value(rng, depth + 1)));
                    }
                }
                format!("{{{}}}", fields.join(","))
            }
            17 => "[1]".to_string(),
            _ => rng.random_range(-5..5000i64).to_string(),
        }
    }

    /// One policy's settings: a kind (rarely a wrong one), its settings each present or not,
    /// and sometimes a setting of another kind or one no kind has.
    /// Returns the JSON, its kind (when it names one rightly) and the settings it has.
    fn policy(rng: &mut StdRng) -> (String, Option<&'static str>, Vec<&'static str>) {
        let (kind, fields) = SETTINGS[rng.random_range(0..SETTINGS.len())];
        let fields = fields.iter().filter(|f| !["kind", "algorithm"].contains(f));
        let (mut out, mut given) = (Vec::new(), Vec::new());
        let named = match rng.random_range(0..30) {
            0 => None,
            1 => {
                out.push("\"kind\":\"queue\"".to_string());
                None
            }
            2 => {
                out.push("\"kind\":7".to_string());
                None
            }
            _ => {
                out.push(format!("\"kind\":\"{kind}\""));
                Some(kind)
            }
        };
        if kind == "quota" && rng.random_bool(0.8) {
            let algorithm =
                ["\"fixed\"", "\"sliding\"", "\"bucket\"", "\"gcra\"", "\"leaky\"", "3"][rng.random_range(0..6)];
            out.push(format!("\"algorithm\":{algorithm}"));
            given.push("algorithm");
        }
        for f in fields.chain(OUTER.iter()) {
            let p = if OUTER.contains(f) { 0.15 } else { 0.6 };
            if rng.random_bool(p) {
                out.push(format!("\"{f}\":{}", value(rng, 0)));
                given.push(*f);
            }
        }
        if rng.random_bool(0.05) {
            let (_, other) = SETTINGS[rng.random_range(0..SETTINGS.len())];
            let f = other[rng.random_range(1..other.len())];
            out.push(format!("\"{f}\":{}", value(rng, 0)));
            given.push(f);
        }
        if rng.random_bool(0.03) {
            out.push("\"surprise\":1".to_string());
            given.push("surprise");
        }
        // Any order: the parser sorts an object's fields.
        for i in (1..out.len()).rev() {
            out.swap(i, rng.random_range(0..=i));
        }
        (format!("{{{}}}", out.join(",")), named, given)
    }

    /// Configurations generated from the kinds and their settings, mutated (wrong types, values
    /// past each bound, unknown kinds and settings, repeated and bad names): a configuration
    /// is refused naming a setting it has (or a required one it lacks, or its kind), and one
    /// taken has each policy it gave, of the kind it gave.
    #[test]
    fn generated_policies_are_refused_naming_a_setting_they_have_or_taken_as_given() {
        let seed: u64 = std::env::var("REDCOUNT_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand::random);
        eprintln!("REDCOUNT_SEED={seed}");
        let mut rng = StdRng::seed_from_u64(seed);
        let (mut ok, mut errors) = (0, std::collections::BTreeSet::new());
        for case in 0..20_000 {
            let n = rng.random_range(1..=3);
            let names = ["a", "b-2", "c_3", "bad name"];
            let mut given = Vec::new();
            let body: Vec<String> = (0..n)
                .map(|_| {
                    let name = if rng.random_bool(0.02) { names[3] } else { names[rng.random_range(0..3)] };
                    let (json, kind, settings) = policy(&mut rng);
                    given.push((name, kind, settings));
                    format!("\"{name}\":{json}")
                })
                .collect();
            let text = format!("{{{}}}", body.join(","));
            let what = format!("REDCOUNT_SEED={seed}, case {case}: {text}");
            let parsed = parse_policies(&text);
            match parsed {
                Ok((policies, _, _)) => {
                    ok += 1;
                    assert_eq!(policies.len(), given.len(), "{what}");
                    for (name, kind, _) in &given {
                        let p = policies.iter().find(|(n, _)| n == name).map(|(_, p)| p.kind());
                        assert_eq!(p, *kind, "{what}");
                    }
                }
                Err(e) => {
                    assert!(!e.problem.is_empty(), "{what}");
                    let at = e.variable.strip_prefix("REDCOUNT_POLICIES.").unwrap_or_else(|| panic!("{e}: {what}"));
                    let (name, field) = at.split_once('.').map_or((at, None), |(n, f)| (n, Some(f)));
                    let (_, _, settings) =
                        given.iter().find(|(n, _, _)| *n == name).unwrap_or_else(|| panic!("{e}: {what}"));
                    if let Some(field) = field {
                        let first = field.split('.').next().unwrap_or_default();
                        let named = first == "kind" || settings.contains(&first) || e.problem == "is required";
                        assert!(named, "{e} names no setting of the policy: {what}");
                        errors.insert(first.to_string());
                    }
                }
            }
        }
        eprintln!("{ok} configurations taken; errors named {} settings: {errors:?}", errors.len());
        // The generator reaches both sides: valid configurations, and errors at most settings.
        assert!(ok > 200, "only {ok} valid configurations (REDCOUNT_SEED={seed})");
        assert!(errors.len() > 25, "errors named only {errors:?} (REDCOUNT_SEED={seed})");
    }
}
