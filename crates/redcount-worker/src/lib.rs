//! redcount's Cloudflare Worker: a thin I/O shell around `redcount_api`.
//!
//! It reads the environment, hands each request to the core, makes the REST calls the core
//! asks for, and writes the core's response. No routing, validation or reply parsing
//! happens here: the native server runs the very same functions.

use redcount_api::{self as api, ApiRequest, ApiResponse, Config, REST_HEADERS, RestTarget, Step};
use wasm_bindgen::{JsCast, JsValue};
use wasm_bindgen_futures::JsFuture;
use worker::{Context, Env, event, js_sys, wasm_bindgen, wasm_bindgen_futures, web_sys};

fn config(env: &Env) -> std::result::Result<(Config, RestTarget), api::ConfigError> {
    // `.dev.vars` and `wrangler secret` give secrets; `[vars]` gives plain vars.
    let var =
        |name: &str| env.secret(name).map(|s| s.to_string()).or_else(|_| env.var(name).map(|v| v.to_string())).ok();
    Ok((Config::from_env(var)?, RestTarget::from_env(var)?))
}

/// Randomness straight from the platform's CSPRNG (`crypto.getRandomValues`), drawn only when
/// a route asks for it (creating a red packet): no generator to seed on every request, and no
/// ChaCha in the bundle. Shares are money, so nothing weaker will do.
struct PlatformRng {
    crypto: js_sys::Object,
    get_random_values: js_sys::Function,
}

thread_local! {
    /// Looked up once per isolate.
    static CRYPTO: Option<(js_sys::Object, js_sys::Function)> = {
        use wasm_bindgen::JsCast;
        let crypto: Option<js_sys::Object> =
            js_sys::Reflect::get(&js_sys::global(), &"crypto".into()).ok().and_then(|c| c.dyn_into().ok());
        let get = crypto.as_ref().and_then(|c| js_sys::Reflect::get(c, &"getRandomValues".into()).ok());
        crypto.zip(get.and_then(|f| f.dyn_into::<js_sys::Function>().ok()))
    };
}

impl PlatformRng {
    /// `None` where the runtime has no Web Crypto (never on Workers).
    fn new() -> Option<Self> {
        CRYPTO.with(|c| c.clone()).map(|(crypto, get_random_values)| PlatformRng { crypto, get_random_values })
    }

    fn fill(&self, dest: &mut [u8]) {
        // getRandomValues fills at most 65,536 bytes per call; within that bound, on an
        // Uint8Array, it cannot throw.
        for chunk in dest.chunks_mut(65_536) {
            let buf = js_sys::Uint8Array::new_with_length(chunk.len() as u32);
            if self.get_random_values.call1(&self.crypto, &buf).is_err() {
                // Unreachable by the above; never hand out shares from unfilled bytes.
                panic!("crypto.getRandomValues failed");
            }
            buf.copy_to(chunk);
        }
    }
}

impl rand_core::RngCore for PlatformRng {
    fn next_u32(&mut self) -> u32 {
        let mut b = [0u8; 4];
        self.fill(&mut b);
        u32::from_le_bytes(b)
    }
    fn next_u64(&mut self) -> u64 {
        let mut b = [0u8; 8];
        self.fill(&mut b);
        u64::from_le_bytes(b)
    }
    fn fill_bytes(&mut self, dest: &mut [u8]) {
        self.fill(dest)
    }
}

impl rand_core::CryptoRng for PlatformRng {}

/// The platform's response for the API's: the body copied once, the headers as the API shaped them.
fn respond(r: ApiResponse) -> web_sys::Response {
    let init = web_sys::ResponseInit::new();
    init.set_status(r.status);
    let headers = web_sys::Headers::new().ok();
    if let Some(h) = &headers {
        for (k, v) in r.header_list() {
            // Names and values come from the API, all valid; a refusal would only drop one.
            let _ = h.append(k, v);
        }
        init.set_headers(h);
    }
    let body = (r.status != 204).then_some(r.body.as_str());
    // Only fails for a status outside 200..=599, which the API never makes.
    web_sys::Response::new_with_opt_str_and_init(body, &init).unwrap_or_else(|_| {
        web_sys::Response::new_with_opt_str(Some("{\"error\":\"bad response\"}")).expect("a plain response")
    })
}

fn js_error(e: JsValue) -> String {
    e.dyn_ref::<js_sys::Error>().map(|e| String::from(e.message())).unwrap_or_else(|| format!("{e:?}"))
}

/// The bytes of a request's or response's body, read in one piece.
async fn body_bytes(buffer: Result<js_sys::Promise, JsValue>) -> Result<Vec<u8>, String> {
    let buffer = JsFuture::from(buffer.map_err(js_error)?).await.map_err(js_error)?;
    Ok(js_sys::Uint8Array::new(&buffer).to_vec())
}

/// One REST round trip; `Err` when the front cannot be reached, or did not answer within
/// `timeout_ms` (the policy's own bound) when there is one.
async fn post(target: &RestTarget, body: &str, timeout_ms: Option<u32>) -> Result<(u16, Vec<u8>), String> {
    let headers = web_sys::Headers::new().map_err(js_error)?;
    headers.set("Authorization", &format!("Bearer {}", target.token)).map_err(js_error)?;
    for (k, v) in REST_HEADERS {
        headers.set(k, v).map_err(js_error)?;
    }
    let init = web_sys::RequestInit::new();
    init.set_method("POST");
    init.set_headers(&headers);
    init.set_body(&JsValue::from_str(body));
    if let Some(ms) = timeout_ms {
        init.set_signal(Some(&web_sys::AbortSignal::timeout_with_u32(ms)));
    }
    let global: web_sys::WorkerGlobalScope = js_sys::global().unchecked_into();
    let url = format!("{}/", target.url);
    let resp = JsFuture::from(global.fetch_with_str_and_init(&url, &init)).await.map_err(js_error)?;
    let resp: web_sys::Response = resp.dyn_into().map_err(js_error)?;
    let bytes = body_bytes(resp.array_buffer()).await?;
    Ok((resp.status(), bytes))
}

/// `scheme://host/path?query#fragment` → (`/path`, `query`).
fn split_url(url: &str) -> (&str, &str) {
    let after_scheme = url.find("://").map(|i| &url[i + 3..]).unwrap_or(url);
    let from_path = after_scheme.find('/').map(|i| &after_scheme[i..]).unwrap_or("/");
    let no_fragment = from_path.split('#').next().unwrap_or("/");
    no_fragment.split_once('?').unwrap_or((no_fragment, ""))
}

#[event(fetch)]
async fn fetch(req: web_sys::Request, env: Env, _ctx: Context) -> worker::Result<web_sys::Response> {
    let (config, target) = match config(&env) {
        Ok(c) => c,
        Err(e) => {
            worker::console_error!("redcount: server misconfigured: {e}");
            return Ok(respond(api::misconfigured(&e)));
        }
    };
    let headers = req.headers();
    let header = |name: &str| headers.get(name).ok().flatten();
    let origin = header("Origin");
    let own = |r: ApiResponse| respond(api::with_cors(&config, origin.as_deref(), r));
    // Refuse an oversized body before reading it.
    if header("Content-Length").and_then(|v| v.parse::<usize>().ok()).unwrap_or(0) > api::MAX_BODY {
        return Ok(own(api::too_large()));
    }
    let body = match body_bytes(req.array_buffer()).await {
        Ok(b) => b,
        Err(e) => return Ok(own(api::unavailable(&format!("the request body could not be read: {e}")))),
    };
    // The runtime hands us a parsed, absolute URL; splitting its text avoids linking a URL
    // parser (with its Unicode tables) into the bundle.
    let url = req.url();
    let (path, query) = split_url(&url);
    let method = req.method();
    let authorization = header("Authorization");
    let idempotency_key = header("Idempotency-Key");
    let request = ApiRequest {
        method: &method,
        path,
        query,
        authorization: authorization.as_deref(),
        origin: origin.as_deref(),
        idempotency_key: idempotency_key.as_deref(),
        body: &body,
    };
    let Some(mut rng) = PlatformRng::new() else {
        return Ok(own(api::unavailable("no randomness (crypto.getRandomValues is missing)")));
    };
    let mut step = api::handle(&config, &request, &mut rng);
    loop {
        match step {
            Step::Respond(r) => return Ok(respond(r)),
            Step::Send(exchange) => {
                // Past the policy's timeout_ms the runtime aborts the fetch ("…timeout").
                step = match post(&target, exchange.body(), exchange.timeout_ms()).await {
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
