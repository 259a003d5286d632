//! redcount's Cloudflare Worker: the wasm half of a thin I/O shell around `redcount_api`.
//!
//! The platform side is `shell.js` (beside this crate's `Cargo.toml`), a small JavaScript
//! module that owns every `await`: it reads the request, calls into this module once per
//! step, makes the REST call the API asks for, and builds the platform's `Response`. This
//! half keeps the configuration (parsed once per isolate, again only when its text
//! changes) and the exchanges in flight, and does nothing but drive [`redcount_api::handle`]
//! and [`redcount_api::Exchange`]: no routing, validation or reply parsing happens here.
//!
//! Each step crosses the boundary once each way, as bytes in two buffers this module keeps
//! (no allocation per call, one copy in, one copy out, numbers only in every signature): the
//! shell asks [`input`] for room, writes the call's input there, makes the call, and reads the
//! output at the address it returns (`len:u32le`, then `len` bytes; valid until the next call).
//!
//! ```text
//!   configure(len)                   vars             -> "" | error       once per isolate / env change
//!   rest_target()                                     -> url \0 header \0 value …
//!   handle(head_len, body_len, now, may_wait)  head, body  -> step
//!   receive(handle, status, len, now)  REST reply body -> step           after a REST reply
//!   fail(handle, len, now)           why              -> step             the REST front did not answer
//!   script(handle, len, now)         a script's text  -> step             after a fetch-script step
//!   rpc_methods()                                     -> name \0 params …  once per isolate
//!   rpc(len, now, may_wait)          the call         -> step             an RPC call
//!   due(now)                                          -> next_ms:u32le, then send steps  (background)
//!   stats(len)                       props            -> return | throw   the admin's look inside
//!   generation()                                      -> the address of a u32 (no output)  once per isolate
//! ```
//!
//! A step's first byte says what the shell does next:
//!
//! | byte | step | then |
//! |------|------|------|
//! | `0`  | respond: `status:u16le headers_len:u32le headers body` (`headers` is `name\0value\0…`) | done |
//! | `1`  | send: `handle:u32le timeout_ms:u32le rest_body` | `receive` or `fail` with the handle, at the latest after `timeout_ms` (the policy's, or [`MAX_WAIT_MS`]) |
//! | `2`  | wait: a borrow of the same subject is under way | ask again (`handle` or `rpc`) once an exchange is answered, or after a short while; `may_wait` 0 after a second |
//! | `3`  | fetch script: `handle:u32le sha1` (Redis lost that script) | `script` with the text of the static asset `lua/<sha1>.lua`, or nothing when there is none |
//! | `4`  | an RPC call's return: `json` | return the value |
//! | `5`  | an RPC call's throw: `json` | throw an `Error` with this message (the status, message and field, which the npm client reads back) |
//! | `8`, `12`, `13` | `0`, `4`, `5` with [`THEN_DUE`] set | as those, then call `due` in the background (`waitUntil`) |
//! | `16` | `0` with [`REPEAT`] set | as `0`; the same request at the same `now` gets these bytes while the [`generation`] stands |
//!
//! `now` is `Date.now()`. `due` lists the background calls to make now (`len:u32le` then a
//! send step, each, driven like any other; their last steps are dropped), after `next_ms`,
//! when to call it again (`u32::MAX`: no need).
//!
//! The isolate keeps one [`redcount_api::Local`]: denials repeated from memory, budget leases.
//! Every call of the isolate decides with that one (`Isolate::local`), HTTP requests and RPC
//! calls alike, so a denial learnt over one is repeated over the other.
//!
//! The RPC class (`Redcount`, a `WorkerEntrypoint` in the shell) has one method per route of
//! the API's table, made from [`rpc_methods`]: a route added to the table is a method of the
//! binding with nothing to write here or in the shell.
//!
//! The scripts' texts are not in this module: EVAL after NOSCRIPT is rare, and they were a
//! tenth of the bundle. `cargo xtask build-worker` writes them to the static assets
//! (`www/lua/`, by the `script-assets` binary of this crate); the API checks each text it is
//! given against the SHA-1 the module does carry.

// On wasm32 the crate needs no std: core and alloc only, so the bundle carries none of std's
// panic, thread-local or I/O machinery. Host builds (its unit tests) keep std.
#![cfg_attr(target_family = "wasm", no_std)]
extern crate alloc;

use alloc::borrow::ToOwned;
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

/// The allocator on wasm32 (not the default dlmalloc): talc, several KB smaller in the bundle.
/// A worker isolate runs one thread, which is what talc's wasm allocator assumes.
#[cfg(all(target_family = "wasm", not(target_feature = "atomics")))]
#[global_allocator]
static ALLOCATOR: talc::wasm::WasmDynamicTalc = talc::wasm::new_wasm_dynamic_allocator();

use redcount_api::{self as api, ApiRequest, ApiResponse, Config, ConfigError, Exchange, Local, RestTarget, Step};
use redcount_core::text::int;
use wasm_bindgen::prelude::wasm_bindgen;

#[wasm_bindgen]
extern "C" {
    /// Web Crypto's CSPRNG; it fills a view of wasm memory in place.
    #[wasm_bindgen(js_namespace = crypto, js_name = getRandomValues)]
    fn get_random_values(buf: &mut [u8]);
}

/// Randomness straight from the platform's CSPRNG (`crypto.getRandomValues`), drawn only when
/// a route asks for it (creating a red packet): no generator to seed on every request, and no
/// ChaCha in the bundle. Shares are money, so nothing weaker will do.
struct PlatformRng;

impl PlatformRng {
    fn fill(dest: &mut [u8]) {
        // getRandomValues fills at most 65,536 bytes per call; within that bound, on a view
        // of wasm memory (an ArrayBuffer, never shared), it cannot throw.
        for chunk in dest.chunks_mut(65_536) {
            get_random_values(chunk);
        }
    }
}

impl rand_core::RngCore for PlatformRng {
    fn next_u32(&mut self) -> u32 {
        let mut b = [0u8; 4];
        Self::fill(&mut b);
        u32::from_le_bytes(b)
    }
    fn next_u64(&mut self) -> u64 {
        let mut b = [0u8; 8];
        Self::fill(&mut b);
        u64::from_le_bytes(b)
    }
    fn fill_bytes(&mut self, dest: &mut [u8]) {
        Self::fill(dest)
    }
}

impl rand_core::CryptoRng for PlatformRng {}

/// The bound of a REST call whose policy declares none. Every call is bounded: a request the
/// runtime cancels (its client gone) runs on to its end under `waitUntil`, which frees its
/// exchange, and the runtime allows that 30 s.
pub const MAX_WAIT_MS: u32 = 20_000;

/// What one isolate keeps between requests.
struct Isolate {
    /// The configuration read by the last [`configure`]; `None` before the first.
    config: Option<Result<(Config, RestTarget), ConfigError>>,
    /// Exchanges waiting for their REST reply (or a script's text), by handle, each with what
    /// made it: an RPC call (true) or an HTTP request; a slot is reused once finished.
    pending: Vec<Option<(Exchange, bool)>>,
    /// Free slots of `pending`.
    free: Vec<u32>,
    /// Where the shell writes each call's input.
    input: Vec<u8>,
    /// Where each call leaves its output: `len:u32le`, then the bytes.
    output: Vec<u8>,
    /// The isolate's local decisions, made at the first configuration.
    local: Option<Local>,
    /// The lease end the shell was last told to call `due` at (`u64::MAX`: none).
    told: u64,
    /// The call under way answered a [`REPEAT`]: the [`generation`] stands.
    repeat: bool,
    /// See [`generation`].
    generation: u32,
}

/// Cached denials one isolate keeps at most.
const DENIALS: usize = 1024;
/// Leases one isolate holds at most.
const LEASES: usize = 256;

impl Isolate {
    const fn new() -> Self {
        Isolate {
            config: None,
            pending: Vec::new(),
            free: Vec::new(),
            input: Vec::new(),
            output: Vec::new(),
            local: None,
            told: u64::MAX,
            repeat: false,
            generation: 0,
        }
    }

    /// The local state every call of the isolate decides with.
    fn local(&mut self) -> &mut Local {
        self.local.get_or_insert_with(|| Local::new(DENIALS, LEASES, seed()))
    }
}

/// A random seed for the local state's hashes: the platform's CSPRNG.
#[cfg(target_family = "wasm")]
fn seed() -> u64 {
    let mut seed = [0; 8];
    PlatformRng::fill(&mut seed);
    u64::from_le_bytes(seed)
}

/// On the host (the unit tests), std's per-process random hasher keys.
#[cfg(not(target_family = "wasm"))]
fn seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    std::collections::hash_map::RandomState::new().build_hasher().finish()
}

impl Isolate {
    fn park(&mut self, ex: (Exchange, bool)) -> u32 {
        match self.free.pop() {
            Some(h) => {
                self.pending[h as usize] = Some(ex);
                h
            }
            None => {
                self.pending.push(Some(ex));
                (self.pending.len() - 1) as u32
            }
        }
    }

    fn take(&mut self, handle: u32) -> Option<(Exchange, bool)> {
        let ex = self.pending.get_mut(handle as usize)?.take()?;
        self.free.push(handle);
        Some(ex)
    }
}

/// The isolate's state. An isolate runs one thread, so the lock is never contended; a call
/// that finds it held is a bug (a call nested in another), and traps rather than waits.
#[cfg(target_family = "wasm")]
static ISOLATE: spin::Mutex<Isolate> = spin::Mutex::new(Isolate::new());

// On the host (the unit tests, run on parallel threads): one isolate per thread.
#[cfg(not(target_family = "wasm"))]
std::thread_local! {
    static ISOLATE: core::cell::RefCell<Isolate> = const { core::cell::RefCell::new(Isolate::new()) };
}

fn isolate<R>(f: impl FnOnce(&mut Isolate) -> R) -> R {
    #[cfg(target_family = "wasm")]
    match ISOLATE.try_lock() {
        Some(mut i) => f(&mut i),
        None => core::arch::wasm32::unreachable(),
    }
    #[cfg(not(target_family = "wasm"))]
    ISOLATE.with_borrow_mut(f)
}

/// A panic on wasm32 (none is expected: the API returns errors) traps at once, without
/// formatting a message nobody would read.
#[cfg(all(target_family = "wasm", not(test)))]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo<'_>) -> ! {
    core::arch::wasm32::unreachable()
}

/// Room for the next call's input: makes the input buffer at least `len` bytes long and
/// returns its address in wasm memory (the buffer is reused from call to call).
#[wasm_bindgen]
pub fn input(len: usize) -> *mut u8 {
    isolate(|i| {
        if i.input.len() < len {
            i.input.resize(len, 0);
        }
        i.input.as_mut_ptr()
    })
}

/// The address of the isolate's generation (a `u32`, little-endian, in wasm memory, where
/// the isolate's state lives for good), bumped by every call but one answering a [`REPEAT`]:
/// the shell answers a repeat again only while it stands, reading it without a call.
#[wasm_bindgen]
pub fn generation() -> *const u32 {
    isolate(|i| &raw const i.generation)
}

/// Runs `f` on the first `len` bytes of the input buffer and keeps what it returns as the
/// output: its address (`len:u32le`, then the bytes), valid until the next call.
fn call(len: usize, f: impl FnOnce(&[u8]) -> Vec<u8>) -> *const u8 {
    let input = call_input();
    let out = f(&input[..len.min(input.len())]);
    call_output(input, out)
}

/// The input buffer, out of the isolate while a call runs (the call borrows the isolate).
/// (This and [`call_output`] are out of line: one copy, not one in each exported function.)
#[inline(never)]
fn call_input() -> Vec<u8> {
    isolate(|i| {
        i.repeat = false;
        core::mem::take(&mut i.input)
    })
}

/// Puts the input buffer back, keeps `out` as the output, and returns the output's address.
#[inline(never)]
fn call_output(input: Vec<u8>, out: Vec<u8>) -> *const u8 {
    isolate(|i| {
        if !i.repeat {
            i.generation = i.generation.wrapping_add(1);
        }
        i.input = input;
        i.output.clear();
        i.output.extend_from_slice(&(out.len() as u32).to_le_bytes());
        i.output.extend_from_slice(&out);
        i.output.as_ptr()
    })
}

fn text(bytes: &[u8]) -> &str {
    // The shell encodes JS strings, always valid UTF-8.
    core::str::from_utf8(bytes).unwrap_or("")
}

/// Reads the configuration from the input, `NAME\0value\0NAME\0value…` (`len` bytes: the
/// environment's `REDCOUNT_*` text, plain vars and secrets alike). Outputs `""` when it is
/// usable, else the error, which the shell logs; every request then gets the 500 naming the
/// variable.
#[wasm_bindgen]
pub fn configure(len: usize) -> *const u8 {
    call(len, |vars| configure_text(text(vars)).into_bytes())
}

/// Where REST calls go, for the shell to build its fetch once per configuration: outputs the
/// URL, then every header as `\0name\0value` (`Authorization` first, then
/// [`api::REST_HEADERS`]); empty when the configuration is not usable.
#[wasm_bindgen]
pub fn rest_target() -> *const u8 {
    call(0, |_| rest_target_text().into_bytes())
}

/// One request: the input is its head (`head_len` bytes) then its body (`body_len` bytes).
/// The head is `METHOD\0URL\0authorization\0origin\0idempotency-key\0content-length\0props\0body-error`,
/// each header and body-error (why the body could not be read) `+value` when present and `-`
/// when absent; props, the JSON of the Service binding's `ctx.props` (`null` for none), read as
/// an RPC binding's are. Outputs a step.
#[wasm_bindgen]
pub fn handle(head_len: usize, body_len: usize, now: f64, may_wait: u32) -> *const u8 {
    call(head_len + body_len, |input| {
        let (head, body) = input.split_at(head_len.min(input.len()));
        let (head, body_error) = match text(head).rsplit_once('\0') {
            Some((head, error)) => (head, error.strip_prefix('+')),
            None => (text(head), None),
        };
        handle_request(head, body, body_error, ms(now), may_wait != 0)
    })
}

/// The REST front answered the exchange `handle` with `status` and a body (the input, `len`
/// bytes). Outputs a step.
#[wasm_bindgen]
pub fn receive(handle: u32, status: u16, len: usize, now: f64) -> *const u8 {
    call(len, |body| receive_reply(handle, status, body, ms(now)))
}

/// The REST front could not be reached for the exchange `handle` (or did not answer within
/// its policy's `timeout_ms`): the input (`len` bytes) says how. Outputs a step.
#[wasm_bindgen]
pub fn fail(handle: u32, len: usize, now: f64) -> *const u8 {
    call(len, |why| fail_exchange(handle, text(why), ms(now)))
}

/// The background calls due now (renewals of leases running low, leases' unused units given
/// back): `next_ms:u32le` (when to
/// call again, `u32::MAX`: no need), then each call as `len:u32le` and a send step.
#[wasm_bindgen]
pub fn due(now: f64) -> *const u8 {
    call(0, |_| due_calls(ms(now)))
}

/// `Date.now()` as whole ms (a clock before 1970 or not a number is 0).
fn ms(now: f64) -> u64 {
    if now > 0.0 { now as u64 } else { 0 }
}

/// The RPC methods, in the order [`rpc`] numbers them: `name\0params\0…`, each with its number
/// of path parameters (the arguments before the fields object).
#[wasm_bindgen]
pub fn rpc_methods() -> *const u8 {
    call(0, |_| {
        let mut out = String::new();
        for (i, spec) in api::rpc::methods().enumerate() {
            if i > 0 {
                out.push('\0');
            }
            out.push_str(spec.rpc().unwrap_or(""));
            out.push('\0');
            out.push(char::from(b'0' + spec.params.len() as u8));
        }
        out.into_bytes()
    })
}

/// One RPC call: the input (`len` bytes) is `method\0props\0params\0options\0input`, the
/// method's number in [`rpc_methods`], then JSON texts (which never hold a NUL), at `now`
/// (`may_wait` as [`handle`]'s). Outputs a step; it ends in `[4] json` (return it) or
/// `[5] json` (throw it).
#[wasm_bindgen]
pub fn rpc(len: usize, now: f64, may_wait: u32) -> *const u8 {
    call(len, |bytes| rpc_call(text(bytes), ms(now), may_wait != 0))
}

/// The isolate's stats for a binding whose props (the input, `len` bytes) say `admin: true`:
/// `[4] {"parked":n,"memory_bytes":m}`, else `[5]` and the error.
#[wasm_bindgen]
pub fn stats(len: usize) -> *const u8 {
    call(len, stats_of)
}

/// The text of the script the exchange `handle` asked for (the input, `len` bytes; empty when
/// the shell found none), at `now`. Outputs a step: the EVAL, or a 500 when the text is not the script's.
#[wasm_bindgen]
pub fn script(handle: u32, len: usize, now: f64) -> *const u8 {
    call(len, |source| give_script(handle, source, ms(now)))
}

fn configure_text(vars: &str) -> String {
    let mut parts = vars.split('\0');
    let mut pairs = Vec::new();
    while let (Some(k), Some(v)) = (parts.next(), parts.next()) {
        pairs.push((k, v));
    }
    let var = |name: &str| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| (*v).to_owned());
    let config = Config::from_env(var).and_then(|c| Ok((c, RestTarget::from_env(var)?)));
    let message = match &config {
        Ok(_) => String::new(),
        Err(e) => format!("server misconfigured: {e}"),
    };
    isolate(|i| {
        i.config = Some(config);
        // Nothing learnt under another configuration is kept; leases end (given back by `due`).
        i.local().reconfigure();
        // The shell was told of no lease end yet: the next one is told at the next answer.
        i.told = u64::MAX;
    });
    message
}

fn rest_target_text() -> String {
    isolate(|i| match &i.config {
        Some(Ok((_, t))) => {
            let mut out = format!("{}/\0Authorization\0Bearer {}", t.url, t.token);
            for (k, v) in api::REST_HEADERS {
                out.push('\0');
                out.push_str(k);
                out.push('\0');
                out.push_str(v);
            }
            out
        }
        _ => String::new(),
    })
}

/// Largest request body the API reads: the shell refuses a longer `Content-Length` unread.
#[wasm_bindgen]
pub fn max_body() -> u32 {
    api::MAX_BODY as u32
}

/// Largest REST reply the shell reads ([`redcount_core::rest::MAX_REPLY`]): past it the call
/// fails as the front's fault, the rest unread.
#[wasm_bindgen]
pub fn max_reply() -> u32 {
    redcount_core::rest::MAX_REPLY as u32
}

/// One request: `head` is `METHOD\0URL\0authorization\0origin\0idempotency-key\0content-length\0props`,
/// each header `+value` when present and `-` when absent; `body` its bytes (empty when not
/// read); `body_error` why it could not be read, if so.
fn handle_request(head: &str, body: &[u8], body_error: Option<&str>, now: u64, may_wait: bool) -> Vec<u8> {
    let mut f = head.split('\0');
    let (method, url) = (f.next().unwrap_or(""), f.next().unwrap_or(""));
    let mut header = || f.next().and_then(|h| h.strip_prefix('+'));
    let (authorization, origin, idempotency_key, content_length) = (header(), header(), header(), header());
    let props = f.next().unwrap_or("null");
    isolate(|i| {
        let config = match &i.config {
            Some(Ok((config, _))) => config,
            Some(Err(e)) => return respond(api::misconfigured(e)),
            None => return respond(api::unavailable("the worker was not configured")),
        };
        let own = |r: ApiResponse| respond(api::with_cors(config, origin, r));
        // Props not understood give no rights at all: every request is refused.
        let binding = match api::rpc::caller(props.as_bytes()) {
            Ok(caller) => caller,
            Err(e) => return own(e.response()),
        };
        // The shell left an oversized body unread: a Content-Length of digits past MAX_BODY
        // (however many). Any other it read up to MAX_BODY + 1 bytes, which the API refuses.
        let digits = content_length.map(str::trim).filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()));
        if digits.is_some_and(|v| int(v).is_none_or(|n| n > api::MAX_BODY as i64)) {
            return own(api::too_large());
        }
        if let Some(e) = body_error {
            return own(api::unavailable(&format!("the request body could not be read: {e}")));
        }
        let (path, query) = split_url(url);
        let request = ApiRequest { method, path, query, authorization, origin, idempotency_key, body };
        // (The configuration is borrowed from the isolate beside its local state.)
        let Isolate { config: Some(Ok((config, _))), local: Some(local), .. } = &mut *i else {
            return respond(api::unavailable("the worker was not configured"));
        };
        match local.handle_as(config, &request, &binding, now, may_wait, &mut PlatformRng) {
            Ok(step) => {
                let repeated = local.repeated();
                let mut out = next(i, step, false);
                // (Not with THEN_DUE: that answer told the shell something once.)
                if repeated && out[0] == 0 {
                    out[0] = REPEAT;
                    i.repeat = true;
                }
                out
            }
            Err(api::Wait) => alloc::vec![2],
        }
    })
}

/// One RPC call: `call` is `method\0props\0params\0options\0input` (the method's index in
/// [`rpc_methods`], then the binding's props, the path parameters, the call options and the
/// fields object, each as JSON), decided with the isolate's local state as a request is.
fn rpc_call(call: &str, now: u64, may_wait: bool) -> Vec<u8> {
    let mut f = call.splitn(5, '\0');
    let (method, props, params, options) = (f.next(), f.next(), f.next(), f.next());
    let input = f.next().unwrap_or("null").as_bytes();
    // A method's index, as `usize::from_str` reads one (no `-`, not even `-0`).
    let method = method
        .filter(|m| !m.starts_with('-'))
        .and_then(int)
        .and_then(|m| api::rpc::methods().nth(usize::try_from(m).ok()?));
    isolate(|i| {
        let (Some(spec), Some(props), Some(params), Some(options)) = (method, props, params, options) else {
            return lost();
        };
        let step = match (&mut *i, api::rpc::caller(props.as_bytes())) {
            (Isolate { config: Some(Err(e)), .. }, _) => Step::Respond(api::misconfigured(e)),
            (Isolate { config: Some(Ok((config, _))), local: Some(local), .. }, Ok(caller)) => {
                let texts = (params.as_bytes(), input, options.as_bytes());
                match api::rpc::call_local(local, now, may_wait, config, spec.id, texts, &caller, &mut PlatformRng) {
                    Ok(step) => step,
                    Err(api::Wait) => return alloc::vec![2],
                }
            }
            (Isolate { config: Some(Ok(_)), .. }, Err(e)) => Step::Respond(e.response()),
            _ => Step::Respond(api::unavailable("the worker was not configured")),
        };
        next(i, step, true)
    })
}

fn receive_reply(handle: u32, status: u16, body: &[u8], now: u64) -> Vec<u8> {
    isolate(|i| match i.take(handle) {
        Some((ex, rpc)) => {
            let step = i.local().after(ex.receive(status, body), now);
            next(i, step, rpc)
        }
        None => lost(),
    })
}

fn give_script(handle: u32, source: &[u8], now: u64) -> Vec<u8> {
    isolate(|i| match i.take(handle) {
        Some((ex, rpc)) => {
            let step = i.local().after(ex.give_script(source), now);
            next(i, step, rpc)
        }
        None => lost(),
    })
}

/// Set in a final step's first byte when the shell, after answering, must call `due` in the
/// background: the local state has units to give back or a lease to renew, or a lease end the
/// shell was not told of.
pub const THEN_DUE: u8 = 8;

/// Set in a respond step's first byte when the answer is a denial repeated from memory that
/// changed nothing here ([`Local::repeated`]): the same request (head, and no body) at the
/// same `now` gets these same bytes while the [`generation`] stands, so the shell may answer
/// it again without a call.
pub const REPEAT: u8 = 16;

/// The shell's next step: answer (an HTTP response, or an RPC call's return value or error);
/// send the REST body (`[1]`, the exchange parked until its reply); or fetch a script's text
/// (`[3]`, parked until then).
fn next(i: &mut Isolate, step: Step, rpc: bool) -> Vec<u8> {
    let (kind, ex) = match step {
        Step::Respond(r) => return answer(i, r, rpc),
        Step::Send(ex) => (1, ex),
        Step::Script(ex) => (3, ex),
    };
    let mut out = Vec::with_capacity(9 + ex.body().len());
    out.push(kind);
    out.extend_from_slice(&[0; 4]); // the handle, known once the exchange is parked
    if kind == 1 {
        out.extend_from_slice(&ex.timeout_ms().unwrap_or(MAX_WAIT_MS).to_le_bytes());
        out.extend_from_slice(ex.body().as_bytes());
    } else {
        out.extend_from_slice(ex.wanted_script().map_or("", |s| s.sha1()).as_bytes());
    }
    let handle = i.park((ex, rpc));
    out[1..5].copy_from_slice(&handle.to_le_bytes());
    out
}

fn fail_exchange(handle: u32, why: &str, now: u64) -> Vec<u8> {
    isolate(|i| match i.take(handle) {
        Some((ex, rpc)) => {
            let r = i.local().answered(ex.fail(why), now);
            answer(i, r, rpc)
        }
        None => lost(),
    })
}

fn due_calls(now: u64) -> Vec<u8> {
    isolate(|i| {
        let calls = i.local().due(now);
        let next_due = i.local().next_due();
        i.told = next_due.unwrap_or(u64::MAX);
        let wait = next_due.map_or(u32::MAX, |t| u32::try_from(t.saturating_sub(now)).unwrap_or(u32::MAX - 1));
        let mut out = Vec::from(wait.to_le_bytes());
        for ex in calls {
            let step = next(i, Step::Send(ex), false);
            out.extend_from_slice(&(step.len() as u32).to_le_bytes());
            out.extend_from_slice(&step);
        }
        out
    })
}

/// A final step: a response (`[0]`), or an RPC call's value (`[4]`) or error (`[5]`), with
/// [`THEN_DUE`] set when the shell has background calls to make or a lease end to wake for
/// that it was not told of yet.
fn answer(i: &mut Isolate, r: ApiResponse, rpc: bool) -> Vec<u8> {
    let mut out = if rpc { rpc_end(r) } else { respond(r) };
    let local = i.local();
    let next_due = local.next_due().unwrap_or(u64::MAX);
    if local.has_returns() || next_due < i.told {
        i.told = next_due;
        out[0] |= THEN_DUE;
    }
    out
}

/// An RPC call's end: `[4] json` (the value to return) or `[5] json` (the error to throw,
/// `{status, error, field}`: see [`api::rpc::answer`]).
fn rpc_end(r: ApiResponse) -> Vec<u8> {
    let (kind, json) = match api::rpc::answer(&r) {
        Ok(json) => (4, json),
        Err(json) => (5, json),
    };
    let mut out = Vec::with_capacity(1 + json.len());
    out.push(kind);
    out.extend_from_slice(json.as_bytes());
    out
}

/// What the admin may ask of the isolate: the exchanges parked now and the wasm memory's size
/// (`{"parked":n,"memory_bytes":m}`), for a test that cancels requests and shows both flat.
fn stats_of(props: &[u8]) -> Vec<u8> {
    let parked = isolate(|i| i.pending.iter().filter(|p| p.is_some()).count());
    #[cfg(target_family = "wasm")]
    let memory = core::arch::wasm32::memory_size(0) * 65_536;
    #[cfg(not(target_family = "wasm"))]
    let memory = 0;
    match api::rpc::caller(props) {
        Ok(c) if c.is_admin() => {
            let mut out = alloc::vec![4];
            out.extend_from_slice(format!("{{\"parked\":{parked},\"memory_bytes\":{memory}}}").as_bytes());
            out
        }
        Ok(_) => rpc_end(ApiResponse::error(401, "the isolate's stats need a binding with admin: true", None)),
        Err(e) => rpc_end(e.response()),
    }
}

/// A handle the shell never got (a bug in the shell, not a request's fault).
fn lost() -> Vec<u8> {
    respond(ApiResponse::error(500, "internal error: unknown exchange", None))
}

/// The API's response as a step: status, headers (as the API listed them), body.
fn respond(r: ApiResponse) -> Vec<u8> {
    let body = if r.status == 204 { "" } else { r.body.as_str() };
    let mut out = Vec::with_capacity(7 + 160 + body.len());
    out.push(0);
    out.extend_from_slice(&r.status.to_le_bytes());
    out.extend_from_slice(&[0; 4]); // the header block's length, known once it is written
    for (k, v) in r.header_list() {
        out.extend_from_slice(k.as_bytes());
        out.push(0);
        out.extend_from_slice(v.as_bytes());
        out.push(0);
    }
    let len = (out.len() - 7) as u32;
    out[3..7].copy_from_slice(&len.to_le_bytes());
    out.extend_from_slice(body.as_bytes());
    out
}

/// `scheme://host/path?query#fragment` → (`/path`, `query`). The runtime hands the shell a
/// parsed, absolute URL; splitting its text avoids linking a URL parser into the bundle.
fn split_url(url: &str) -> (&str, &str) {
    // A byte-window search (a `&str` pattern would link the two-way searcher into the bundle).
    let after_scheme = url.as_bytes().windows(3).position(|w| w == b"://").map_or(url, |i| &url[i + 3..]);
    let from_path = after_scheme.find('/').map(|i| &after_scheme[i..]).unwrap_or("/");
    let no_fragment = from_path.split('#').next().unwrap_or("/");
    no_fragment.split_once('?').unwrap_or((no_fragment, ""))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A respond step: status, header block, body.
    fn parse(step: &[u8]) -> (u16, &str, &str) {
        assert_eq!(step[0] & !REPEAT, 0, "a respond step");
        let status = u16::from_le_bytes([step[1], step[2]]);
        let len = u32::from_le_bytes(step[3..7].try_into().unwrap()) as usize;
        let text = core::str::from_utf8(&step[7..]).unwrap();
        (status, &text[..len], &text[len..])
    }

    /// A send step: handle, timeout, REST body.
    fn parse_send(step: &[u8]) -> (u32, u32, &str) {
        assert_eq!(step[0], 1, "a send step");
        let word = |at: usize| u32::from_le_bytes(step[at..at + 4].try_into().unwrap());
        (word(1), word(5), core::str::from_utf8(&step[9..]).unwrap())
    }

    const VARS: &str = "REDCOUNT_POLICIES\0{\"bonus\": {\"kind\": \"claim\", \"window_ms\": 86400000, \"timeout_ms\": 250}}\0\
                        REDCOUNT_REST_URL\0http://127.0.0.1:9/\0REDCOUNT_REST_TOKEN\0rest-token-0123456789";
    const CLAIM: &str = "POST\0http://h/api/claims/bonus/alice?x=1\0-\0-\0-\0-";

    #[test]
    fn splits_urls() {
        assert_eq!(split_url("http://h:8787/api/x?a=1#f"), ("/api/x", "a=1"));
        assert_eq!(split_url("https://h"), ("/", ""));
        assert_eq!(split_url("http://h/a%2Fb?"), ("/a%2Fb", ""));
    }

    #[test]
    fn drives_the_api_in_byte_steps() {
        assert_eq!(configure_text(VARS), "");
        assert_eq!(
            rest_target_text(),
            "http://127.0.0.1:9/\0Authorization\0Bearer rest-token-0123456789\0\
             Upstash-Encoding\0base64\0Content-Type\0application/json"
        );
        let step = handle_request(CLAIM, b"", None, 1_000, true);
        let (h, timeout, rest) = parse_send(&step);
        assert!(rest.starts_with(r#"["EVALSHA","#), "{rest}");
        assert_eq!(timeout, 250);
        let done = receive_reply(h, 200, br#"{"result":[1,0]}"#, 1_010);
        let (status, headers, body) = parse(&done);
        assert_eq!((status, body), (200, r#"{"claimed":true,"retry_after_ms":0}"#));
        assert_eq!(
            headers,
            "Content-Type\0application/json\0Cache-Control\0no-store\0\
             RateLimit-Policy\0\"bonus\";q=1;w=86400\0RateLimit\0\"bonus\";r=0;t=0\0"
        );
        // A finished exchange's handle is spent, and its slot serves the next one.
        assert_eq!(parse(&receive_reply(h, 200, b"{}", 1_010)).0, 500);
        let step = handle_request(CLAIM, b"", None, 1_000, true);
        let (h2, ..) = parse_send(&step);
        assert_eq!(h2, h);
        let failed = fail_exchange(h2, "connection refused", 1_010);
        let (status, _, body) = parse(&failed);
        // The policy's declared answer (deny, the default), marked degraded, with the reason.
        assert_eq!(status, 503);
        assert!(body.contains(r#""degraded":true"#) && body.contains("connection refused"), "{body}");
    }

    #[test]
    fn a_plain_bindings_props_are_read_as_an_rpc_bindings() {
        assert_eq!(configure_text(VARS), "");
        let with = |props: &str| handle_request(&format!("{CLAIM}\0{props}"), b"", None, 1_000, true);
        let scoped = with(r#"{"namespace":"acme"}"#);
        let (h, _, rest) = parse_send(&scoped);
        assert!(rest.contains(r#""rc.acme:{cl:bonus:alice}""#), "{rest}");
        fail_exchange(h, "gone", 1_010);
        for bad in [r#"{"namespace":"acme","role":"admin"}"#, r#"{"admin":"yes"}"#, "[]"] {
            let refused = with(bad);
            let (status, _, body) = parse(&refused);
            assert!(status == 500 && body.contains("props"), "{bad}: {status} {body}");
        }
    }

    #[test]
    fn a_lost_script_is_asked_for_by_its_sha_and_checked() {
        assert_eq!(configure_text(VARS), "");
        let noscript = br#"{"error":"NOSCRIPT No matching script. Please use EVAL."}"#;
        let script = &redcount_core::script::CLAIM;
        let ask = |h: u32| {
            let step = receive_reply(h, 400, noscript, 1_010);
            assert_eq!(step[0], 3, "a fetch-script step");
            assert_eq!(core::str::from_utf8(&step[5..]).unwrap(), script.sha1());
            u32::from_le_bytes(step[1..5].try_into().unwrap())
        };
        // No text (no asset), or another text: a 500 naming the script, nothing sent.
        for wrong in [&b""[..], b"return 1"] {
            let (h, ..) = parse_send(&handle_request(CLAIM, b"", None, 1_000, true));
            let step = give_script(ask(h), wrong, 1_020);
            let (status, _, body) = parse(&step);
            assert_eq!(status, 500);
            assert!(body.contains(script.sha1()), "{body}");
        }
        // The script's own text: the EVAL, with the same bound as the EVALSHA.
        let (h, ..) = parse_send(&handle_request(CLAIM, b"", None, 1_000, true));
        let step = give_script(ask(h), script.source().as_bytes(), 1_020);
        let (h, timeout, rest) = parse_send(&step);
        assert!(rest.starts_with(r#"["EVAL","#), "{rest}");
        assert_eq!(timeout, 250);
        let (status, _, _) = parse(&receive_reply(h, 200, br#"{"result":[1,0]}"#, 1_030));
        assert_eq!(status, 200);
    }

    #[test]
    fn headers_absent_and_empty_differ_and_big_bodies_stay_unread() {
        assert_eq!(configure_text(VARS), "");
        // An empty Idempotency-Key is refused; an absent one is no key.
        let empty_key =
            parse(&handle_request("POST\0http://h/api/claims/bonus/alice\0-\0-\0+\0-", b"", None, 1_000, true)).0;
        assert_eq!(empty_key, 400);
        let big = handle_request("POST\0http://h/api/claims/bonus/alice\0-\0-\0-\0+99999", b"", None, 1_000, true);
        assert_eq!(parse(&big).0, 413);
        let big = handle_request(
            "POST\0http://h/api/claims/bonus/alice\0-\0-\0-\0+99999999999999999999999",
            b"",
            None,
            1_000,
            true,
        );
        assert_eq!(parse(&big).0, 413);
        let unread = handle_request(CLAIM, b"", Some("reset by peer"), 1_000, true);
        let (status, _, body) = parse(&unread);
        assert_eq!(status, 503);
        assert!(body.contains("reset by peer"), "{body}");
    }

    #[test]
    fn rpc_calls_end_in_a_value_or_an_error() {
        assert_eq!(configure_text(VARS), "");
        rpc_methods();
        let methods = String::from_utf8(isolate(|i| i.output[4..].to_vec())).unwrap();
        let list: Vec<&str> = methods.split('\0').collect();
        let claim = list.chunks(2).position(|m| m == ["claim", "2"]).expect("claim takes policy and subject");
        let step =
            rpc_call(&format!("{claim}\0{{\"namespace\":\"acme\"}}\0[\"bonus\",\"alice\"]\0null\0null"), 1_000, true);
        let (h, _, rest) = parse_send(&step);
        assert!(rest.contains("rc.acme:{cl:bonus:alice}"), "{rest}");
        let done = receive_reply(h, 200, br#"{"result":[1,0]}"#, 1_030);
        assert_eq!(done[0], 4, "a value to return");
        let value: &str = core::str::from_utf8(&done[1..]).unwrap();
        assert!(value.starts_with(r#"{"claimed":true,"retry_after_ms":0,"headers":{"#), "{value}");
        // Bad input, and props that are not a binding's: an error to throw, nothing sent.
        for (head, want) in [
            (
                format!("{claim}\0null\0[\"bonus\",5]\0null\0null"),
                r#"{"status":400,"error":"subject must be a string","field":"subject"}"#,
            ),
            (format!("{claim}\0{{\"admin\":1}}\0[\"bonus\",\"a\"]\0null\0null"), r#"{"status":500,"#),
        ] {
            let out = rpc_call(&head, 1_000, true);
            assert_eq!(out[0], 5, "an error to throw");
            assert!(core::str::from_utf8(&out[1..]).unwrap().starts_with(want), "{head}");
        }
        // The front gone: a claim's declared failure mode (deny) is a value, not an error.
        let step = rpc_call(&format!("{claim}\0null\0[\"bonus\",\"a\"]\0null\0null"), 1_000, true);
        let (h, ..) = parse_send(&step);
        let out = fail_exchange(h, "connection refused", 1_010);
        assert_eq!(out[0], 4);
        assert!(core::str::from_utf8(&out[1..]).unwrap().contains(r#""degraded":true"#));
        // Stats are the admin's.
        assert_eq!(stats_of(br#"{"admin":true}"#)[0], 4);
        assert_eq!(stats_of(b"null")[0], 5);
    }

    #[test]
    fn a_denial_over_the_binding_is_repeated_from_the_isolates_cache() {
        let vars = "REDCOUNT_POLICIES\0{\"day\": {\"kind\": \"quota\", \"algorithm\": \"fixed\", \"limit\": 1, \"window_ms\": 86400000}}\0\
                    REDCOUNT_REST_URL\0http://127.0.0.1:9/\0REDCOUNT_REST_TOKEN\0rest-token-0123456789";
        assert_eq!(configure_text(vars), "");
        let take = api::rpc::methods().position(|s| s.rpc() == Some("take")).unwrap();
        let call = format!("{take}\0null\0[\"day\",\"alice\"]\0null\0null");
        let value = |step: &[u8]| {
            assert_eq!(step[0] & !THEN_DUE, 4, "a value to return");
            String::from_utf8(step[1..].to_vec()).unwrap()
        };
        // Redis denies the first take (nothing left until the window ends).
        let (h, ..) = parse_send(&rpc_call(&call, 1_000, true));
        let denied = value(&receive_reply(h, 200, br#"{"result":[0,1,0,50000,50000]}"#, 1_010));
        assert!(denied.starts_with(r#"{"allowed":false,"#) && !denied.contains("cached"), "{denied}");
        // 300 ms later the same take over the binding, then over HTTP, is answered from the
        // isolate's one cache, nothing sent.
        let again = value(&rpc_call(&call, 1_300, true));
        assert!(again.starts_with(r#"{"allowed":false,"cache_ms":700,"cached":true,"#), "{again}");
        assert!(again.contains(r#""retry_after_ms":49700"#), "{again}");
        let http = handle_request("POST\0http://h/api/quotas/day/alice\0-\0-\0-\0-", b"", None, 1_400, true);
        let (status, _, body) = parse(&http);
        assert_eq!(status, 200);
        assert!(body.contains(r#""cached":true"#), "{body}");
        // Another subject still goes to Redis.
        let other = format!("{take}\0null\0[\"day\",\"bob\"]\0null\0null");
        assert_eq!(rpc_call(&other, 1_400, true)[0], 1, "a send step");
    }

    #[test]
    fn a_denial_repeated_from_memory_is_marked_and_keeps_the_generation_which_any_other_call_bumps() {
        let vars = "REDCOUNT_POLICIES\0{\"day\": {\"kind\": \"quota\", \"algorithm\": \"fixed\", \"limit\": 1, \"window_ms\": 86400000}}\0\
                    REDCOUNT_REST_URL\0http://127.0.0.1:9/\0REDCOUNT_REST_TOKEN\0rest-token-0123456789\0\
                    REDCOUNT_ADMIN_TOKEN\0admin-token-0123456789";
        assert_eq!(configure_text(vars), "");
        // Through the exported calls, as the shell makes them: the generation is bumped there.
        let ask = |head: &str, now: f64| {
            let head = format!("{head}\0-");
            input(head.len());
            isolate(|i| i.input[..head.len()].copy_from_slice(head.as_bytes()));
            handle(head.len(), 0, now, 1);
            isolate(|i| i.output[4..].to_vec())
        };
        let generation = || isolate(|i| i.generation);
        let take = "POST\0http://h/api/quotas/day/alice\0-\0-\0-\0+0\0{}";
        // Redis denies the first take; the next is repeated from memory by the whole path.
        let (h, ..) = parse_send(&ask(take, 1_000.0));
        receive_reply(h, 200, br#"{"result":[0,1,0,50000,50000]}"#, 1_010);
        assert_eq!(ask(take, 1_100.0)[0], 0, "the whole path's answer is no repeat");
        // Then by the request's bytes: a repeat, the generation unchanged, the same bytes at
        // the same ms (the shell answers those itself) and other bytes a ms later.
        let before = generation();
        let first = ask(take, 1_200.0);
        assert_eq!(first[0], REPEAT);
        let (status, headers, body) = parse(&first);
        assert_eq!(status, 200);
        assert!(body.contains(r#""cached":true"#) && body.contains(r#""retry_after_ms":49800"#), "{body}");
        assert!(headers.ends_with(concat!("Retry-After\0", "50\0")), "{headers:?}");
        assert_eq!(ask(take, 1_200.0), first);
        assert_eq!(generation(), before);
        let later = ask(take, 1_201.0);
        assert_eq!(later[0], REPEAT);
        assert!(parse(&later).2.contains(r#""retry_after_ms":49799"#));
        assert_eq!(generation(), before);
        // Any other call bumps it: another request, a refund (which drops the denial) and its
        // reply.
        ask("POST\0http://h/api/quotas/day/bob\0-\0-\0-\0+0\0{}", 1_300.0);
        assert_ne!(generation(), before);
        let refund = "POST\0http://h/api/quotas/day/alice/refund\0+Bearer admin-token-0123456789\0-\0-\0+0\0{}";
        let before = generation();
        let (h, ..) = parse_send(&ask(refund, 1_300.0));
        assert_ne!(generation(), before);
        let before = generation();
        let reply = br#"{"result":1}"#;
        input(reply.len());
        isolate(|i| i.input[..reply.len()].copy_from_slice(reply));
        receive(h, 200, reply.len(), 1_310.0);
        assert_ne!(generation(), before);
        assert_eq!(ask(take, 1_310.0)[0], 1, "after the refund, the take asks Redis");
    }

    #[test]
    fn a_lease_borrowed_over_the_binding_is_given_back_at_its_end() {
        let vars = "REDCOUNT_POLICIES\0{\"hot\": {\"kind\": \"quota\", \"algorithm\": \"fixed\", \"limit\": 1000, \"window_ms\": 60000, \"borrow\": {\"units\": 50, \"ms\": 1000}}}\0\
                    REDCOUNT_REST_URL\0http://127.0.0.1:9/\0REDCOUNT_REST_TOKEN\0rest-token-0123456789";
        assert_eq!(configure_text(vars), "");
        let take = api::rpc::methods().position(|s| s.rpc() == Some("take")).unwrap();
        let call = format!("{take}\0null\0[\"hot\",\"jo\"]\0null\0null");
        // The first take of the isolate borrows 50 units beside it.
        let borrow = rpc_call(&call, 1_000, true);
        let (h, _, rest) = parse_send(&borrow);
        assert!(rest.contains(r#""borrow""#), "{rest}");
        let first = receive_reply(h, 200, br#"{"result":[1,1000,949,30000,0,50]}"#, 1_005);
        // Its value, and the shell told to call `due`: a lease end to wake for.
        assert_eq!(first[0], 4 | THEN_DUE, "{:?}", String::from_utf8_lossy(&first[1..]));
        let wake = |out: &[u8]| u32::from_le_bytes(out[..4].try_into().unwrap());
        assert_eq!(wake(&due_calls(1_010)), 990, "a wake at the lease's end");
        // Told once: the next answers from its stock need no `due`.
        assert_eq!(rpc_call(&call, 1_020, true)[0], 4);
        // At its end the 49 units not used go back, in a call of their own.
        let back = due_calls(2_000);
        assert_eq!(wake(&back), u32::MAX, "nothing more to wake for");
        let len = u32::from_le_bytes(back[4..8].try_into().unwrap()) as usize;
        let (_, _, rest) = parse_send(&back[8..8 + len]);
        assert!(rest.contains(r#""return","49""#), "{rest}");
    }

    #[test]
    fn calls_read_the_input_buffer_and_leave_a_framed_output() {
        let put = |bytes: &[u8]| {
            input(bytes.len());
            isolate(|i| i.input[..bytes.len()].copy_from_slice(bytes));
        };
        let output = || isolate(|i| i.output.clone());
        put(VARS.as_bytes());
        configure(VARS.len());
        assert_eq!(output(), [0, 0, 0, 0], "no error");
        let head = format!("{CLAIM}\0-");
        put(format!("{head}{{}}").as_bytes());
        handle(head.len(), 2, 1_000.0, 1);
        let out = output();
        assert_eq!(u32::from_le_bytes(out[..4].try_into().unwrap()) as usize, out.len() - 4);
        let (h, _, rest) = parse_send(&out[4..]);
        assert!(rest.starts_with(r#"["EVALSHA","#), "{rest}");
        put(b"connection refused");
        fail(h, 18, 1_010.0);
        let out = output();
        let (status, _, body) = parse(&out[4..]);
        assert_eq!(status, 503);
        assert!(body.contains("connection refused"), "{body}");
        // A body error rides at the end of the head.
        let head = format!("{CLAIM}\0+reset by peer");
        put(head.as_bytes());
        handle(head.len(), 0, 1_000.0, 1);
        let out = output();
        let (status, _, body) = parse(&out[4..]);
        assert_eq!(status, 503);
        assert!(body.contains("reset by peer"), "{body}");
    }

    #[test]
    fn a_bad_configuration_answers_500_naming_the_variable() {
        assert_eq!(parse(&handle_request(CLAIM, b"", None, 1_000, true)).0, 503, "not configured yet");
        let e = configure_text("REDCOUNT_REST_URL\0http://127.0.0.1:9");
        assert!(e.starts_with("server misconfigured: REDCOUNT_POLICIES"), "{e}");
        assert_eq!(rest_target_text(), "");
        let step = handle_request(CLAIM, b"", None, 1_000, true);
        let (status, _, body) = parse(&step);
        assert_eq!(status, 500);
        assert!(body.contains("REDCOUNT_POLICIES"), "{body}");
    }
}
