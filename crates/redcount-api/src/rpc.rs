//! Calls through the worker's RPC binding (a Service binding to its `WorkerEntrypoint`): one
//! method per route of the table ([`RouteSpec::rpc`]), called as
//! `take(policy, subject, input, options)`: the route's path parameters in order, then its
//! fields as one object (the HTTP body's, or the query's as JSON numbers), then call options
//! (`idempotencyKey`). The caller's rights and scope come from the binding's `ctx.props`
//! ([`caller`]), never from an argument. The shell only moves bytes: it hands the four JSON
//! texts to [`call`] and gives back what [`answer`] makes of the response.
//!
//! ```
//! use redcount_api::{Config, Step, rpc};
//!
//! let policies = r#"{"per-user": {"kind": "quota", "algorithm": "fixed", "limit": 10, "window_ms": 60000}}"#;
//! let config = Config::from_env(|v| (v == "REDCOUNT_POLICIES").then(|| policies.to_string())).unwrap();
//! let caller = rpc::caller(br#"{"namespace": "acme"}"#).unwrap();
//! let take = rpc::method("take").unwrap();
//! let step = rpc::call(&config, take, br#"["per-user","alice"]"#, br#"{"cost":1}"#, b"null", &caller, &mut rand::rng());
//! let Step::Send(exchange) = step else { panic!() };
//! assert!(exchange.body().contains(r#""rc.acme:{u:alice}:q:per-user:fw""#), "the binding's scope");
//! let Step::Respond(r) = exchange.receive(200, br#"{"result":[1,10,9,60000,0]}"#) else { panic!() };
//! let returned = rpc::answer(&r).unwrap();
//! assert!(returned.starts_with(r#"{"allowed":true,"#) && returned.contains(r#""headers":{"RateLimit-Policy":"#));
//!
//! // Bad input is an error whose message carries its status and field.
//! let Step::Respond(r) = rpc::call(&config, take, br#"["per-user",7]"#, b"null", b"null", &caller, &mut rand::rng()) else { panic!() };
//! assert_eq!(rpc::answer(&r).unwrap_err(), r#"{"status":400,"error":"subject must be a string","field":"subject"}"#);
//! ```

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use rand_core::RngCore;
use redcount_core::json::{self, Json};

use crate::{
    ApiError, ApiResponse, Caller, Config, Input, Local, ROUTES, Route, RouteId, RouteSpec, Scope, Step, Wait,
};

/// The routes an RPC binding calls, in table order (the shell numbers its methods so).
pub fn methods() -> impl Iterator<Item = &'static RouteSpec> {
    ROUTES.iter().filter(|s| s.rpc().is_some())
}

/// The route whose RPC method is `name`.
pub fn method(name: &str) -> Option<RouteId> {
    methods().find(|s| s.rpc() == Some(name)).map(|s| s.id)
}

/// The caller a binding's `ctx.props` make (their JSON; `null` or empty: none, the public
/// rights): `namespace`, an id, confines every key the caller's calls touch to that scope
/// ([`Caller::scoped`]); `admin: true` gives the admin rights (within the scope, if any).
/// Anything else (an unknown prop, a wrong type) is a binding misconfigured, refused with a
/// 500 rather than read as fewer or more rights than it says.
pub fn caller(props: &[u8]) -> Result<Caller, ApiError> {
    let bad = |why: String| ApiError::new(500, format!("server misconfigured: the binding's props: {why}"));
    if props.iter().all(u8::is_ascii_whitespace) {
        return Ok(Caller::public());
    }
    let (map, repeated) = match json::read(props) {
        Ok((Json::Null, _)) => return Ok(Caller::public()),
        Ok((Json::Object(map), repeated)) => (map, repeated),
        _ => return Err(bad("not a JSON object".into())),
    };
    if repeated.is_some() {
        return Err(bad("a prop is given twice".into()));
    }
    let mut caller = Caller::public();
    for (k, v) in &map {
        caller = match (k.as_str(), v) {
            ("admin", Json::Bool(true)) => Caller { admin: true, ..caller },
            ("admin", Json::Bool(false)) => caller,
            ("namespace", Json::String(ns)) => caller.scoped(Scope::new(ns).map_err(|e| bad(format!("{e}")))?),
            ("admin", _) => return Err(bad("`admin` must be true or false".into())),
            ("namespace", _) => return Err(bad("`namespace` must be a string".into())),
            (other, _) => return Err(bad(format!("unknown prop `{other}` (known: namespace, admin)"))),
        };
    }
    Ok(caller)
}

/// One RPC call of `route`: `params`, the JSON array of its path parameters (strings, in path
/// order); `input`, the JSON object of its fields (`null`: none); `options`, a JSON object
/// (`idempotencyKey`) or `null`; as `caller` ([`caller`]). Driven as [`crate::handle`]'s steps are.
pub fn call<R: RngCore + ?Sized>(
    config: &Config,
    route: RouteId,
    params: &[u8],
    input: &[u8],
    options: &[u8],
    caller: &Caller,
    rng: &mut R,
) -> Step {
    match parse(route, params, input, options) {
        Ok((route, input, key)) => crate::call(config, route, Input::Json(input), caller, key.as_deref(), rng),
        Err(e) => Step::Respond(e.response()),
    }
}

/// [`call`], deciding with a shell's local state at `now_ms` ([`Local::call`]): the binding
/// shares the isolate's denial cache and budget leases with its HTTP requests. [`Wait`] only
/// when `may_wait`.
#[allow(clippy::too_many_arguments)]
pub fn call_local<R: RngCore + ?Sized>(
    local: &mut Local,
    now_ms: u64,
    may_wait: bool,
    config: &Config,
    route: RouteId,
    (params, input, options): (&[u8], &[u8], &[u8]),
    caller: &Caller,
    rng: &mut R,
) -> Result<Step, Wait> {
    match parse(route, params, input, options) {
        Ok((route, input, key)) => {
            local.call(config, route, Input::Json(input), caller, key.as_deref(), now_ms, may_wait, rng)
        }
        Err(e) => Ok(Step::Respond(e.response())),
    }
}

/// The route, its fields' JSON and the `Idempotency-Key` an RPC call's texts name.
fn parse<'a>(
    route: RouteId,
    params: &[u8],
    input: &'a [u8],
    options: &[u8],
) -> Result<(Route, &'a [u8], Option<String>), ApiError> {
    let spec = route.spec();
    let (params, key) = match (parse_params(spec, params), parse_options(options)) {
        (Ok(p), Ok(k)) => (p, k),
        (Err(e), _) | (_, Err(e)) => return Err(e),
    };
    let input = match input.iter().find(|b| !b.is_ascii_whitespace()) {
        _ if input == b"null" => &[][..],
        // What a route reads is an object (the API checks it); one that reads nothing still
        // refuses anything else, as a misplaced argument.
        Some(b'{') | None => input,
        Some(_) => return Err(ApiError::new(400, "the input must be an object").at("body")),
    };
    Ok((Route::with_params(route, params), input, key))
}

fn parse_params(spec: &RouteSpec, params: &[u8]) -> Result<Vec<String>, ApiError> {
    let list = match json::from_slice(params) {
        Ok(Json::Array(list)) => list,
        _ => return Err(ApiError::new(400, "the arguments are not JSON").at("arguments")),
    };
    if list.len() > spec.params.len() {
        let want = redcount_core::text::join(spec.params, ", ");
        return Err(ApiError::new(400, format!("too many arguments before the input (want: {want})")).at("arguments"));
    }
    let mut out = Vec::with_capacity(spec.params.len());
    for (i, name) in spec.params.iter().enumerate() {
        match list.get(i) {
            Some(Json::String(s)) => out.push(s.clone()),
            None | Some(Json::Null) => return Err(ApiError::new(400, format!("{name} is required")).at(*name)),
            Some(_) => return Err(ApiError::new(400, format!("{name} must be a string")).at(*name)),
        }
    }
    Ok(out)
}

fn parse_options(options: &[u8]) -> Result<Option<String>, ApiError> {
    let map = match json::from_slice(options) {
        Ok(Json::Null) => return Ok(None),
        Ok(Json::Object(map)) => map,
        _ => return Err(ApiError::new(400, "the call options must be an object").at("options")),
    };
    let mut key = None;
    for (k, v) in map {
        match (k.as_str(), v) {
            ("idempotencyKey", Json::String(s)) => key = Some(s),
            ("idempotencyKey", Json::Null) => {}
            ("idempotencyKey", _) => return Err(ApiError::new(400, "idempotencyKey must be a string").at(k)),
            _ => return Err(ApiError::new(400, format!("unknown option `{k}` (known: idempotencyKey)")).at(k)),
        }
    }
    Ok(key)
}

/// What an RPC method gives back for `r`: `Ok`, the answer's JSON object (a degraded answer
/// too: it is the policy's declared decision) with its own headers in `headers`
/// (`RateLimit-Policy`, `RateLimit`, `Retry-After`, `Idempotent-Replayed`), when it has any;
/// `Err`, an error's JSON object with its `status` (`{"status":400,"error":…,"field":…}`),
/// which the binding throws as the message of an `Error` (the one part of an error that
/// crosses a binding) and the npm client reads back into its typed error.
pub fn answer(r: &ApiResponse) -> Result<String, String> {
    let body = if r.body.starts_with('{') { r.body.as_str() } else { "{}" };
    if r.status >= 400 && !r.degraded {
        let mut out = format!("{{\"status\":{}", r.status);
        if body.len() > 2 {
            out.push(',');
        }
        out.push_str(&body[1..]);
        return Err(out);
    }
    if r.headers.is_empty() {
        return Ok(body.into());
    }
    let mut out = String::with_capacity(body.len() + 128);
    out.push_str(&body[..body.len() - 1]);
    out.push_str(if body.len() > 2 { ",\"headers\":{" } else { "\"headers\":{" });
    for (i, (k, v)) in r.headers.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        redcount_core::rest::write_json_string(&mut out, k);
        out.push(':');
        redcount_core::rest::write_json_string(&mut out, v);
    }
    out.push_str("}}");
    Ok(out)
}
