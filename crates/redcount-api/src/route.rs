//! The route table: every route of the API once, as a typed [`Route`] parsed from the method
//! and the percent-decoded path. Dispatch, the failure-mode lookup, the metric labels and the
//! OpenAPI document all read this one table, and so do the worker's RPC binding and the npm
//! client (each route's method name); adding a route is one line in `routes!` (the compiler
//! then asks for its handler and its document entry; a test, for its client method).
//!
//! ```
//! use redcount_api::{Route, RouteId};
//!
//! let route = Route::parse("POST", "/api/quot%61s/per-user/alice").unwrap();
//! assert_eq!(route, Route::QuotaTake { policy: "per-user".into(), subject: "alice".into() });
//! assert_eq!(route.id().spec().path, "/api/quotas/{policy}/{subject}");
//! assert_eq!((route.policy(), route.subject().as_deref()), (Some("per-user"), Some("alice")));
//! assert_eq!(route.path(), "/api/quotas/per-user/alice");
//! // The same path with another method is another route; a method no route of the path has is a 405.
//! assert_eq!(Route::parse("GET", "/api/quotas/per-user/alice").unwrap().id(), RouteId::QuotaPeek);
//! assert_eq!(Route::parse("PATCH", "/api/quotas/per-user/alice").unwrap_err().status, 405);
//! // A user of a tenant: two segments.
//! let route = Route::parse("POST", "/api/reservations/acme/alice").unwrap();
//! assert_eq!((route.id(), route.subject().as_deref()), (RouteId::ReserveTenant, Some("acme/alice")));
//! // Or one, `TENANT%2FUSER`: the spelling that reaches a user named like an action too.
//! let route = Route::parse("POST", "/api/quotas/tpm/acme%2Frefund").unwrap();
//! assert_eq!((route.id(), route.param("user")), (RouteId::QuotaTakeTenant, Some("refund")));
//! assert_eq!(route.path(), "/api/quotas/tpm/acme%2Frefund");
//! assert_eq!(Route::parse("POST", "/api/quotas/tpm/acme/refund").unwrap().id(), RouteId::QuotaRefund);
//! ```

use alloc::borrow::Cow;
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use crate::ApiError;

/// One row of the table: a route's method and path pattern (`{name}` is a parameter: one
/// whole path segment).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouteSpec {
    /// Which route.
    pub id: RouteId,
    /// `GET` (which also answers `HEAD`), `POST`, `PUT` or `DELETE`.
    pub method: &'static str,
    /// The path, e.g. `/api/quotas/{policy}/{subject}`.
    pub path: &'static str,
    /// The parameters' names, in path order.
    pub params: &'static [&'static str],
    /// The method of the worker's RPC binding (and of the npm client) that makes this call
    /// (see [`RouteSpec::rpc`]); `_` for none.
    rpc: &'static str,
}

impl RouteSpec {
    /// The name of the RPC method that makes this call (`take`), the same in the npm client
    /// and in the OpenAPI document (`x-rpc`); `None` for a route an RPC caller has no use for
    /// (the OpenAPI document, which the worker serves as a static file).
    pub fn rpc(&self) -> Option<&'static str> {
        (self.rpc != "_").then_some(self.rpc)
    }

    /// The first segment after `/api/` (`quotas`): the route's family, the metric label.
    pub fn family(&self) -> &'static str {
        let rest = self.path.strip_prefix("/api/").unwrap_or(self.path);
        rest.split('/').next().unwrap_or(rest)
    }

    /// The row of a tenant's user for this subject row: the same method, `{tenant}/{user}` in
    /// the place of `{subject}`.
    pub fn tenant_row(&self) -> Option<&'static RouteSpec> {
        let of_tenant = |o: &&RouteSpec| {
            let (mut theirs, mut found) = (o.pattern(), false);
            let same = self.pattern().all(|p| match p {
                b"{subject}" => {
                    found = true;
                    theirs.next() == Some(b"{tenant}") && theirs.next() == Some(b"{user}")
                }
                p => theirs.next() == Some(p),
            });
            o.method == self.method && same && found && theirs.next().is_none()
        };
        ROUTES.iter().find(of_tenant)
    }

    /// True when this row takes requests with `method` (`HEAD` goes where `GET` does).
    fn takes(&self, method: &str) -> bool {
        self.method == method || (method == "HEAD" && self.method == "GET")
    }

    /// The path's segments after `/api/`, as bytes (a byte split: no string searcher per call).
    fn pattern(&self) -> impl Iterator<Item = &'static [u8]> {
        let path: &'static str = self.path;
        path.as_bytes().get(5..).unwrap_or_default().split(|&b| b == b'/')
    }

    /// True when `segments` (decoded, after `/api/`) fit this row's path: as many, and equal
    /// where the path is not a parameter (the first one rules out all but a few rows).
    fn fit(&self, segments: &[String]) -> bool {
        let mut pattern = self.pattern();
        segments.iter().all(|s| pattern.next().is_some_and(|p| p.first() == Some(&b'{') || p == s.as_bytes()))
            && pattern.next().is_none()
    }
}

/// Declares the routes: for each, its variant (with its parameters, in path order), method,
/// path and RPC method name (`_`: none). Generates [`Route`], [`RouteId`] and [`ROUTES`] (in this order: a route's id is
/// its row's index).
macro_rules! routes {
    ($(
        $(#[doc = $doc:literal])*
        $name:ident { $($param:ident),* } = $method:ident $path:literal => $rpc:tt;
    )*) => {
        /// A route with its parameters, each a whole percent-decoded path segment (validated by
        /// the operation that uses it, which names it on failure).
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub enum Route {
            $(
                $(#[doc = $doc])*
                #[doc = concat!("\n\n`", stringify!($method), " ", $path, "`")]
                $name {
                    $(
                        #[doc = concat!("The `", stringify!($param), "` segment.")]
                        $param: String,
                    )*
                },
            )*
        }

        /// Which route, without its parameters: the table's row.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum RouteId {
            $(
                $(#[doc = $doc])*
                $name,
            )*
        }

        /// The route table, in [`RouteId`] order.
        pub static ROUTES: &[RouteSpec] = &[
            $(
                RouteSpec {
                    id: RouteId::$name,
                    method: stringify!($method),
                    path: $path,
                    params: &[$(stringify!($param)),*],
                    rpc: stringify!($rpc),
                },
            )*
        ];

        impl RouteId {
            /// What the route does, in a line (its documentation).
            pub fn summary(self) -> &'static str {
                match self {
                    $( RouteId::$name => concat!($($doc),*).trim_start(), )*
                }
            }
        }

        impl Route {
            /// The route's row.
            pub fn id(&self) -> RouteId {
                match self {
                    $( Route::$name { .. } => RouteId::$name, )*
                }
            }

            /// The parameters, in path order.
            pub fn params(&self) -> impl Iterator<Item = &str> {
                let given: &[&str] = match self {
                    $( Route::$name { $($param),* } => &[$($param.as_str()),*], )*
                };
                let mut out = [""; MAX_PARAMS];
                for (slot, param) in out.iter_mut().zip(given) {
                    *slot = param;
                }
                out.into_iter().take(given.len())
            }

            /// The route `id` with `params` (in path order; missing ones are empty).
            pub fn with_params(id: RouteId, params: Vec<String>) -> Route {
                #[allow(unused_mut, unused_variables)]
                let mut p = params.into_iter();
                match id {
                    $( RouteId::$name => Route::$name { $($param: next_param(&mut p)),* }, )*
                }
            }
        }
    };
}

/// The next path parameter (empty when none is left): one call per field of
/// [`Route::with_params`], not a copy of the iterator's code in each.
#[inline(never)]
fn next_param(params: &mut alloc::vec::IntoIter<String>) -> String {
    params.next().unwrap_or_default()
}

routes! {
    /// Whether Redis answers (a `PING` through the shell's path to it).
    Health {} = GET "/api/health" => health;
    /// The configured policies (public: they hold no secret).
    Policies {} = GET "/api/policies" => policies;
    /// This API as an OpenAPI 3.1 document.
    OpenApi {} = GET "/api/openapi.json" => _;
    /// A counter's value.
    CounterGet { policy, subject } = GET "/api/counters/{policy}/{subject}" => getCounter;
    /// Adds `delta` to a counter, within its bounds.
    CounterAdd { policy, subject } = POST "/api/counters/{policy}/{subject}" => addCounter;
    /// Takes the once-per-window claim.
    Claim { policy, subject } = POST "/api/claims/{policy}/{subject}" => claim;
    /// Whether a take of `cost` would pass, taking nothing.
    QuotaPeek { policy, subject } = GET "/api/quotas/{policy}/{subject}" => peek;
    /// Takes `cost` units of a quota when they are there.
    QuotaTake { policy, subject } = POST "/api/quotas/{policy}/{subject}" => take;
    /// Forgets a subject's use of a quota (admin).
    QuotaReset { policy, subject } = DELETE "/api/quotas/{policy}/{subject}" => reset;
    /// Gives units back, never above the limit (admin).
    QuotaRefund { policy, subject } = POST "/api/quotas/{policy}/{subject}/refund" => refund;
    /// Whether a take of `cost` would pass, taking nothing: a user of a tenant.
    QuotaPeekTenant { policy, tenant, user } = GET "/api/quotas/{policy}/{tenant}/{user}" => peekTenant;
    /// Takes `cost` units of a quota when they are there: a user of a tenant.
    QuotaTakeTenant { policy, tenant, user } = POST "/api/quotas/{policy}/{tenant}/{user}" => takeTenant;
    /// Forgets a tenant's user's use of a quota (admin).
    QuotaResetTenant { policy, tenant, user } = DELETE "/api/quotas/{policy}/{tenant}/{user}" => resetTenant;
    /// Gives a tenant's user units back, never above the limit (admin).
    QuotaRefundTenant { policy, tenant, user } = POST "/api/quotas/{policy}/{tenant}/{user}/refund" => refundTenant;
    /// Sets a subject's own size of a quota or semaphore policy (admin).
    OverrideSet { policy, subject } = PUT "/api/overrides/{policy}/{subject}" => setOverride;
    /// Clears a subject's override (admin).
    OverrideClear { policy, subject } = DELETE "/api/overrides/{policy}/{subject}" => clearOverride;
    /// Quota and semaphore policies of one subject decided at once, all or nothing.
    Decide { subject } = POST "/api/decisions/{subject}" => decide;
    /// A tenant's user's and the tenant's own quota and semaphore policies decided at once.
    DecideTenant { tenant, user } = POST "/api/decisions/{tenant}/{user}" => decideTenant;
    /// Reserves units of quotas (and leases of semaphores) of one subject, all or nothing (or
    /// capped), until the reservation is settled at what was used.
    Reserve { subject } = POST "/api/reservations/{subject}" => reserve;
    /// Reserves for a user of a tenant, at either level.
    ReserveTenant { tenant, user } = POST "/api/reservations/{tenant}/{user}" => reserveTenant;
    /// Settles a reservation at the units used: the difference back, or the overrun charged.
    Settle { subject, id } = POST "/api/reservations/{subject}/{id}/settle" => settle;
    /// Settles a tenant's user's reservation.
    SettleTenant { tenant, user, id } = POST "/api/reservations/{tenant}/{user}/{id}/settle" => settleTenant;
    /// Renews a reservation's lease, charging the units used so far.
    Extend { subject, id } = POST "/api/reservations/{subject}/{id}/extend" => extendReservation;
    /// Renews a tenant's user's reservation.
    ExtendTenant { tenant, user, id } = POST "/api/reservations/{tenant}/{user}/{id}/extend" => extendReservationTenant;
    /// Cancels a reservation: every unit not reported used back, its leases freed.
    Release { subject, id } = POST "/api/reservations/{subject}/{id}/release" => releaseReservation;
    /// Cancels a tenant's user's reservation.
    ReleaseTenant { tenant, user, id } = POST "/api/reservations/{tenant}/{user}/{id}/release" => releaseReservationTenant;
    /// Takes a lease of a semaphore when one is free.
    SemaphoreAcquire { policy, name } = POST "/api/semaphores/{policy}/{name}/acquire" => acquire;
    /// Extends a held lease.
    SemaphoreRenew { policy, name } = POST "/api/semaphores/{policy}/{name}/renew" => renew;
    /// Gives a lease back.
    SemaphoreRelease { policy, name } = POST "/api/semaphores/{policy}/{name}/release" => release;
    /// Whether a holder still holds its lease under a fencing token.
    SemaphoreCheck { policy, name } = POST "/api/semaphores/{policy}/{name}/check" => check;
    /// A page of a user's inbox.
    InboxRead { user } = GET "/api/inbox/{user}/messages" => readInbox;
    /// Appends a message to a user's inbox (once per id).
    InboxAppend { user } = POST "/api/inbox/{user}/messages" => appendInbox;
    /// Drops a user's old messages.
    InboxTrim { user } = POST "/api/inbox/{user}/trim" => trimInbox;
    /// Creates a red packet: a total split into shares.
    PacketCreate {} = POST "/api/redpackets" => createPacket;
    /// A red packet's status.
    PacketStatus { id } = GET "/api/redpackets/{id}" => packetStatus;
    /// Grabs a share of a red packet (once per user).
    PacketGrab { id } = POST "/api/redpackets/{id}/grab" => grab;
    /// A page of a red packet's grabs.
    PacketGrabs { id } = GET "/api/redpackets/{id}/claims" => packetGrabs;
}

/// Most parameters a route has.
const MAX_PARAMS: usize = 4;

/// Longest path segment looked at (ids are at most 64; anything longer is refused early).
const MAX_SEGMENT: usize = 256;

impl RouteId {
    /// The route's row of [`ROUTES`].
    pub fn spec(self) -> &'static RouteSpec {
        &ROUTES[self as usize]
    }
}

impl Route {
    /// The route of `method` and `path` (still percent-encoded, without the query).
    pub fn parse(method: &str, path: &str) -> Result<Route, ApiError> {
        Route::matching(method, segments(path)?)
    }

    /// The route of `method` and the decoded `segments` after `/api/` ([`segments`]): 404
    /// when no route has this path, 405 (with `Allow`) when none of its routes has this method.
    /// The path's routes are those that fit it with the most fixed segments: a word such as
    /// `refund` after a subject names that action whatever the method, never a tenant's user.
    pub fn matching(method: &str, segments: Vec<String>) -> Result<Route, ApiError> {
        let fixed = |s: &RouteSpec| s.pattern().filter(|p| p.first() != Some(&b'{')).count();
        let most = ROUTES.iter().filter(|s| s.fit(&segments)).map(fixed).max();
        let of_path = |s: &&RouteSpec| Some(fixed(s)) == most && s.fit(&segments);
        if let Some(spec) = ROUTES.iter().filter(of_path).find(|s| s.takes(method)) {
            let mut params = segments;
            let mut at = spec.pattern().map(|p| p.first() == Some(&b'{'));
            params.retain(|_| at.next().unwrap_or(false));
            let spec = of_tenant(spec, &mut params);
            return Ok(Route::with_params(spec.id, params));
        }
        let mut allow = String::new();
        for spec in ROUTES.iter().filter(of_path) {
            if !allow.is_empty() {
                allow.push_str(", ");
            }
            allow.push_str(spec.method);
            if spec.method == "GET" {
                allow.push_str(", HEAD");
            }
        }
        Err(match allow.is_empty() {
            false => ApiError::new(405, format!("method {method} not allowed here")).header("Allow", allow),
            true => ApiError::new(404, "no such route"),
        })
    }

    /// The route's row.
    pub fn spec(&self) -> &'static RouteSpec {
        self.id().spec()
    }

    /// The parameter called `name`, if the route has one.
    pub fn param(&self, name: &str) -> Option<&str> {
        let i = self.spec().params.iter().position(|p| *p == name)?;
        self.params().nth(i)
    }

    /// The policy the route names, if any.
    pub fn policy(&self) -> Option<&str> {
        self.param("policy")
    }

    /// The subject the route names, if any (a semaphore's is its `name`; a tenant's user's,
    /// `TENANT/USER`).
    pub fn subject(&self) -> Option<Cow<'_, str>> {
        match (self.param("tenant"), self.param("user")) {
            (Some(tenant), Some(user)) if self.spec().params.contains(&"tenant") => {
                Some(Cow::Owned(format!("{tenant}/{user}")))
            }
            _ => self.param("subject").or_else(|| self.param("name")).map(Cow::Borrowed),
        }
    }

    /// The route's path, each parameter encoded one way (bytes outside `A-Z a-z 0-9 - . _ ~`
    /// escaped in upper-case hex; a tenant's user as one segment, `TENANT%2FUSER`): one text
    /// for every spelling of it (`/api/%72edpackets` is `/api/redpackets`), so what is keyed
    /// by it (an `Idempotency-Key`'s scope) cannot be split by a client or proxy that
    /// re-encodes the path between retries, and one that parses back to this route.
    pub fn path(&self) -> String {
        const HEX: &[u8; 16] = b"0123456789ABCDEF";
        let spec = self.spec();
        let mut params = self.params();
        let mut out = String::with_capacity(spec.path.len() + 32);
        let mut previous = "";
        for (i, seg) in spec.path.split('/').enumerate() {
            if i > 0 {
                out.push_str(if (previous, seg) == ("{tenant}", "{user}") { "%2F" } else { "/" });
            }
            previous = seg;
            if !seg.starts_with('{') {
                out.push_str(seg);
                continue;
            }
            for b in params.next().unwrap_or("").bytes() {
                if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
                    out.push(char::from(b));
                } else {
                    out.push('%');
                    out.push(char::from(HEX[usize::from(b >> 4)]));
                    out.push(char::from(HEX[usize::from(b & 15)]));
                }
            }
        }
        out
    }
}

/// A subject route whose subject is `TENANT/USER` (sent as one segment, `TENANT%2FUSER`) is
/// the route of that tenant's user ([`RouteSpec::tenant_row`]), when the table has one: its
/// row, `params` split so. This spelling reaches every user, one named like an action of the
/// path (`refund`) too, which the two-segment one reads as the action.
fn of_tenant(spec: &'static RouteSpec, params: &mut Vec<String>) -> &'static RouteSpec {
    let Some(at) = spec.params.iter().position(|p| *p == "subject") else { return spec };
    let (Some(row), Some(slash)) = (spec.tenant_row(), params[at].find('/')) else { return spec };
    let user = params[at].split_off(slash + 1);
    params[at].pop();
    params.insert(at + 1, user);
    row
}

/// The percent-decoded segments of an API path after `/api/`: 404 outside `/api/` and for an
/// empty segment (`//`), 400 naming `path` for a segment that is malformed, not UTF-8 or too long.
pub fn segments(path: &str) -> Result<Vec<String>, ApiError> {
    let Some(rest) = path.strip_prefix("/api/") else {
        return Err(ApiError::new(404, "not found"));
    };
    let bad = |why: &str| ApiError::new(400, format!("path: {why}")).at("path");
    let mut out = Vec::new();
    for raw in rest.split('/') {
        if raw.len() > 3 * MAX_SEGMENT {
            return Err(bad("a segment is too long"));
        }
        // Most segments hold no escape: taken as they are (already UTF-8).
        let s = if raw.bytes().any(|b| b == b'%') {
            let bytes = redcount_core::text::percent_decode(raw).ok_or_else(|| bad("malformed percent-encoding"))?;
            String::from_utf8(bytes).map_err(|_| bad("not UTF-8"))?
        } else {
            String::from(raw)
        };
        if s.len() > MAX_SEGMENT {
            return Err(bad("a segment is too long"));
        }
        out.push(s);
    }
    if out.iter().any(String::is_empty) {
        return Err(ApiError::new(404, "no such route"));
    }
    Ok(out)
}

/// The metric labels of a request: its route's family (a fixed word from the table, or
/// `other`) and its policy when the route names a configured one (else `-`), so a client
/// cannot add label values. Decoded as routing decodes: `/api/quot%61s/…` counts as `quotas`.
pub fn labels<'c>(config: &'c crate::Config, method: &str, path: &str) -> (&'static str, &'c str) {
    let Ok(segments) = segments(path) else { return ("other", "-") };
    let family = ROUTES.iter().map(|s| s.family()).find(|f| segments.first().is_some_and(|s| s == f));
    let policy = Route::matching(method, segments)
        .ok()
        .and_then(|r| r.policy().and_then(|p| config.policies.iter().find(|(n, _)| n == p)).map(|(n, _)| n.as_str()));
    (family.unwrap_or("other"), policy.unwrap_or("-"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_is_well_formed_and_reachable() {
        for (i, spec) in ROUTES.iter().enumerate() {
            assert_eq!(spec.id as usize, i, "{spec:?}: ids are row indexes");
            let placeholders: Vec<&str> =
                spec.path.split('/').filter_map(|s| s.strip_prefix('{').and_then(|s| s.strip_suffix('}'))).collect();
            assert_eq!(placeholders, spec.params, "{spec:?}: the path names the variant's fields in order");
            assert!(spec.params.len() <= MAX_PARAMS, "{spec:?}: raise MAX_PARAMS");
            // A request for the row's own path, parameters filled, comes back to the row.
            let params: Vec<String> = spec.params.iter().map(|p| format!("x-{p}")).collect();
            let route = Route::with_params(spec.id, params);
            assert_eq!(Route::parse(spec.method, &route.path()).unwrap(), route, "{spec:?}");
            assert!(ROUTES.iter().filter(|o| o.path == spec.path).filter(|o| o.method == spec.method).count() == 1);
        }
    }

    /// Every parameter of every route may be any word the table uses as a fixed segment
    /// (`refund`, `settle`, `quotas`, …): the route's path, parameters filled so, comes back
    /// to that route with those parameters, whatever the method.
    #[test]
    fn a_parameter_may_be_any_word_of_the_table() {
        let mut words: Vec<&str> = ROUTES
            .iter()
            .flat_map(|s| s.pattern())
            .filter(|p| p.first() != Some(&b'{'))
            .map(|p| core::str::from_utf8(p).unwrap())
            .collect();
        words.sort_unstable();
        words.dedup();
        assert!(words.contains(&"refund") && words.contains(&"settle"), "{words:?}");
        for spec in ROUTES {
            for at in 0..spec.params.len() {
                for word in &words {
                    let params = spec
                        .params
                        .iter()
                        .enumerate()
                        .map(|(i, p)| if i == at { (*word).into() } else { format!("x-{p}") })
                        .collect();
                    let route = Route::with_params(spec.id, params);
                    let path = route.path();
                    assert_eq!(Route::parse(spec.method, &path).ok(), Some(route.clone()), "{} {path}", spec.method);
                    if spec.method == "GET" {
                        assert_eq!(Route::parse("HEAD", &path).ok(), Some(route), "HEAD {path}");
                    }
                }
            }
        }
    }

    #[test]
    fn every_route_but_the_document_has_its_own_rpc_method() {
        let mut seen = Vec::new();
        for spec in ROUTES {
            let Some(name) = spec.rpc() else {
                assert_eq!(spec.id, RouteId::OpenApi, "{spec:?}: only the OpenAPI document has no RPC method");
                continue;
            };
            // A JavaScript method name, camelCase, never one of a WorkerEntrypoint's own.
            assert!(name.bytes().all(|b| b.is_ascii_alphabetic()) && name.as_bytes()[0].is_ascii_lowercase(), "{name}");
            assert!(!["fetch", "constructor", "env", "ctx", "stats", "connect"].contains(&name), "{name}");
            assert!(!seen.contains(&name), "{name} twice");
            seen.push(name);
        }
    }

    #[test]
    fn one_route_one_path_text() {
        let p = |path: &str| Route::parse("POST", path).unwrap().path();
        assert_eq!(p("/api/%72edpackets"), "/api/redpackets");
        assert_eq!(p("/api/quot%61s/d%61ily/u%2d1"), p("/api/quotas/daily/u-1"));
        assert_eq!(p("/api/inbox/a%2fb/messages"), "/api/inbox/a%2Fb/messages");
        assert!(Route::parse("POST", "/api/inbox/a/b/messages").is_err(), "an encoded slash stays inside its segment");
    }

    #[test]
    fn a_known_path_with_another_method_says_which_methods_it_takes() {
        let allow = |method: &str, path: &str| {
            let e = Route::parse(method, path).unwrap_err();
            assert_eq!(e.status, 405);
            e.headers.into_iter().find(|(k, _)| *k == "Allow").unwrap().1
        };
        assert_eq!(allow("PUT", "/api/quotas/a/b"), "GET, HEAD, POST, DELETE");
        assert_eq!(allow("PUT", "/api/counters/a/b"), "GET, HEAD, POST");
        assert_eq!(allow("GET", "/api/overrides/a/b"), "PUT, DELETE");
        assert_eq!(allow("PUT", "/api/redpackets/a/grab"), "POST");
        // An action's word after a subject is that action, never a tenant's user of that name.
        assert_eq!(allow("GET", "/api/quotas/a/b/refund"), "POST");
        assert_eq!(allow("DELETE", "/api/quotas/a/b/refund"), "POST");
        assert_eq!(Route::parse("GET", "/api/quotas/a/b/c").unwrap().id(), RouteId::QuotaPeekTenant);
        assert_eq!(Route::parse("POST", "/api/semaphores/a/b/steal").unwrap_err().status, 404);
    }
}
