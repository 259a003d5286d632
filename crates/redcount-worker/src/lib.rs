//! redcount's Cloudflare Worker: a thin I/O shell around `redcount_api`.
//!
//! It reads the environment, hands each request to the core, makes the REST calls the core
//! asks for, and writes the core's response. No routing, validation or reply parsing
//! happens here: the native server runs the very same functions.

use rand_chacha::ChaCha20Rng;
use rand_core::SeedableRng;
use redcount_api::{self as api, ApiRequest, ApiResponse, Config, REST_HEADERS, Step};
use worker::{
    Context, Env, Fetch, Headers, Method, Request, RequestInit, Response, Result, event, js_sys, wasm_bindgen,
};

fn config(env: &Env) -> std::result::Result<Config, api::ConfigError> {
    Config::from_env(|name| {
        // `.dev.vars` and `wrangler secret` give secrets; `[vars]` gives plain vars.
        env.secret(name).map(|s| s.to_string()).or_else(|_| env.var(name).map(|v| v.to_string())).ok()
    })
}

/// A CSPRNG seeded from the platform's `crypto.getRandomValues`.
fn rng() -> std::result::Result<ChaCha20Rng, String> {
    use wasm_bindgen::JsCast;
    let crypto = js_sys::Reflect::get(&js_sys::global(), &"crypto".into()).map_err(|_| "no crypto")?;
    let get: js_sys::Function = js_sys::Reflect::get(&crypto, &"getRandomValues".into())
        .ok()
        .and_then(|f| f.dyn_into().ok())
        .ok_or("no crypto.getRandomValues")?;
    let buf = js_sys::Uint8Array::new_with_length(32);
    get.call1(&crypto, &buf).map_err(|_| "crypto.getRandomValues failed")?;
    let mut seed = [0u8; 32];
    buf.copy_to(&mut seed);
    Ok(ChaCha20Rng::from_seed(seed))
}

fn respond(r: ApiResponse) -> Result<Response> {
    let mut resp = if r.status == 204 { Response::empty()? } else { Response::from_bytes(r.body.into_bytes())? };
    resp = resp.with_status(r.status);
    let headers = resp.headers_mut();
    if r.status != 204 {
        headers.set("Content-Type", "application/json")?;
    }
    headers.set("Cache-Control", "no-store")?;
    for (k, v) in &r.headers {
        headers.append(k, v)?;
    }
    Ok(resp)
}

fn error(status: u16, message: &str) -> Result<Response> {
    respond(ApiResponse { status, body: format!("{{\"error\":{}}}", json_string(message)), headers: Vec::new() })
}

fn json_string(s: &str) -> String {
    let mut out = String::new();
    redcount_core::rest::write_json_string(&mut out, s);
    out
}

/// One REST round trip; `Err` when the front cannot be reached.
async fn post(config: &Config, body: &str) -> std::result::Result<(u16, Vec<u8>), String> {
    let headers = Headers::new();
    let auth = format!("Bearer {}", config.rest_token);
    headers.set("Authorization", &auth).map_err(|e| e.to_string())?;
    for (k, v) in REST_HEADERS {
        headers.set(k, v).map_err(|e| e.to_string())?;
    }
    let mut init = RequestInit::new();
    init.with_method(Method::Post).with_headers(headers).with_body(Some(body.into()));
    let request = Request::new_with_init(&format!("{}/", config.rest_url), &init).map_err(|e| e.to_string())?;
    let mut resp = Fetch::Request(request).send().await.map_err(|e| e.to_string())?;
    let status = resp.status_code();
    let bytes = resp.bytes().await.map_err(|e| e.to_string())?;
    Ok((status, bytes))
}

/// `scheme://host/path?query#fragment` → (`/path`, `query`).
fn split_url(url: &str) -> (&str, &str) {
    let after_scheme = url.find("://").map(|i| &url[i + 3..]).unwrap_or(url);
    let from_path = after_scheme.find('/').map(|i| &after_scheme[i..]).unwrap_or("/");
    let no_fragment = from_path.split('#').next().unwrap_or("/");
    no_fragment.split_once('?').unwrap_or((no_fragment, ""))
}

#[event(fetch)]
async fn fetch(mut req: Request, env: Env, _ctx: Context) -> Result<Response> {
    let config = match config(&env) {
        Ok(c) => c,
        Err(e) => {
            worker::console_error!("redcount: server misconfigured: {e}");
            return respond(api::misconfigured(&e));
        }
    };
    // Refuse an oversized body before reading it.
    let declared = req.headers().get("Content-Length")?.and_then(|v| v.parse::<usize>().ok()).unwrap_or(0);
    if declared > api::MAX_BODY {
        return error(413, &format!("body larger than {} bytes", api::MAX_BODY));
    }
    let body = req.bytes().await.unwrap_or_default();
    // The runtime hands us a parsed, absolute URL; splitting its text avoids linking a URL
    // parser (with its Unicode tables) into the bundle.
    let url = req.inner().url();
    let (path, query) = split_url(&url);
    let method = req.method().to_string();
    let authorization = req.headers().get("Authorization")?;
    let origin = req.headers().get("Origin")?;
    let idempotency_key = req.headers().get("Idempotency-Key")?;
    let request = ApiRequest {
        method: &method,
        path,
        query,
        authorization: authorization.as_deref(),
        origin: origin.as_deref(),
        idempotency_key: idempotency_key.as_deref(),
        body: &body,
    };
    let mut rng = match rng() {
        Ok(r) => r,
        Err(e) => return error(503, &format!("no randomness available: {e}")),
    };
    let mut step = api::handle(&config, &request, &mut rng);
    loop {
        match step {
            Step::Respond(r) => return respond(r),
            Step::Send(exchange) => {
                step = match post(&config, exchange.body()).await {
                    Ok((status, bytes)) => exchange.receive(status, &bytes),
                    Err(e) => Step::Respond(exchange.fail(&e)),
                };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn splits_urls() {
        assert_eq!(super::split_url("http://h:8787/api/x?a=1#f"), ("/api/x", "a=1"));
        assert_eq!(super::split_url("https://h"), ("/", ""));
        assert_eq!(super::split_url("http://h/a%2Fb?"), ("/a%2Fb", ""));
    }
}
