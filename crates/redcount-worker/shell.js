// redcount's Cloudflare Worker: the platform half of a thin shell around redcount_api.
//
// This module owns the I/O (reading the request, the REST fetch, the Response, an RPC call's
// arguments and result); every decision is the wasm module's (src/lib.rs, which drives redcount_api): it is called once
// per step with the bytes of that step, written into its input buffer, and leaves the next
// step in its output buffer (its doc comment has the layout). `cargo xtask build-worker`
// copies this file to build/index.js beside wasm-bindgen's glue and the wasm.
import { WorkerEntrypoint } from "cloudflare:workers";
import wasmModule from "./redcount_worker_bg.wasm";
import {
  initSync, input, configure, rest_target, max_body, max_reply, handle, receive, fail, script, rpc_methods, rpc, stats, due,
  generation,
} from "./redcount_worker.js";

const { memory } = initSync({ module: wasmModule });

const MAX_BODY = max_body();
const MAX_REPLY = max_reply();
const EMPTY = new Uint8Array(0);
const text = new TextDecoder();
const utf8 = new TextEncoder();

// The module's memory as bytes: one view, made again only once the memory has grown (which
// detaches the old one), rather than a view per call.
let view = new Uint8Array(memory.buffer);
const mem = () => (view.byteLength === 0 ? (view = new Uint8Array(memory.buffer)) : view);

// Writes `str` (UTF-8) then `bytes` into the wasm module's input buffer; returns the length
// of `str` in bytes.
function put(str, bytes = EMPTY) {
  const room = str.length * 3;
  const at = input(room + bytes.length);
  const m = mem();
  const { written } = utf8.encodeInto(str, m.subarray(at, at + room));
  m.set(bytes, at + written);
  return written;
}

const word = (b, at) => (b[at] | (b[at + 1] << 8) | (b[at + 2] << 16) | (b[at + 3] << 24)) >>> 0;

// A call's output: a view of wasm memory, valid until the next call into the module.
function output(at) {
  const m = mem();
  return m.subarray(at + 4, at + 4 + word(m, at));
}

// Takes told to wait (a borrow of their subject is under way) wake when any exchange is
// answered, or after 50 ms, and ask again.
let wake = null;
const settled = () => {
  wake ??= Promise.withResolvers();
  return Promise.race([wake.promise, new Promise((r) => setTimeout(r, 50))]);
};

// The configuration as the wasm module last read it: the env it came from, its REDCOUNT_*
// text, and what the REST fetch needs. Parsed once per isolate; again only when the text changes.
let seenEnv = null;
let seenVars = null;
let restUrl = "";
let restHeaders = null;

function configured(env) {
  if (env === seenEnv) return;
  const parts = [];
  for (const [name, value] of Object.entries(env)) {
    if (typeof value === "string" && name.startsWith("REDCOUNT_")) parts.push(name, value);
  }
  const vars = parts.join("\0");
  if (vars !== seenVars) {
    const problem = text.decode(output(configure(put(vars))));
    if (problem) console.error(`redcount: ${problem}`);
    // The URL, then header pairs; one headers object for every REST call of this configuration.
    const [url, ...pairs] = text.decode(output(rest_target())).split("\0");
    restUrl = url;
    restHeaders = {};
    for (let i = 0; i + 1 < pairs.length; i += 2) restHeaders[pairs[i]] = pairs[i + 1];
    seenVars = vars;
  }
  seenEnv = env;
}

// A header's value as the module reads it: `+value`, or `-` when absent.
const mark = (v) => (v === null ? "-" : "+" + v);

// The headers of the last response, reused while the next one's bytes are the same (most
// responses carry exactly Content-Type and Cache-Control); Response copies them, never changes
// them. A Headers object: the runtime copies it as it is, cheaper than converting a plain
// object's properties for every response (about 4% of a cached denial's CPU under workerd).
let lastBlock = EMPTY;
let lastHeaders = new Headers();

function headerObject(block) {
  if (block.length === lastBlock.length) {
    let i = 0;
    while (i < block.length && block[i] === lastBlock[i]) i++;
    if (i === block.length) return lastHeaders;
  }
  const list = text.decode(block).split("\0");
  const headers = new Headers();
  // (A repeated name, none today, keeps every value, as HTTP lists do.)
  for (let i = 0; i + 1 < list.length; i += 2) headers.append(list[i], list[i + 1]);
  lastBlock = block.slice();
  lastHeaders = headers;
  return headers;
}

// A respond step as the platform's Response's body and init: status, the API's headers, the
// body (slice: copied out of wasm memory once, for the runtime to keep).
function parts(step) {
  const status = step[1] | (step[2] << 8);
  const len = word(step, 3);
  const headers = headerObject(step.subarray(7, 7 + len));
  return [status === 204 ? null : step.slice(7 + len), { status, headers }];
}

function respond(step) {
  const [body, init] = parts(step);
  return new Response(body, init);
}

// Repeats: a respond step marked REPEAT is a denial the module repeated from memory without
// changing anything; the same request (its head, no body) at the same ms gets the same bytes
// while the module's generation (a u32 in its memory, bumped by every other call) stands, so
// the shell answers it again without a call. Only the current ms's are kept, a few.
const REPEAT = 16;
const GENERATION = generation();
const repeats = new Map();
let repeatsAt = -1;
let repeatsOf = -1;

// The first bytes of `stream`, up to `max` + 1 (the rest left unread, the stream cancelled):
// more than `max` says "too long" without holding whatever a peer sends.
async function upTo(stream, max) {
  const reader = stream.getReader();
  const chunks = [];
  let size = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    chunks.push(value);
    size += value.length;
    if (size > max) {
      await reader.cancel();
      break;
    }
  }
  return new Uint8Array(await new Blob(chunks).arrayBuffer(), 0, Math.min(size, max + 1));
}

// The REST reply's bytes, refused past MAX_REPLY as they arrive (a longer Content-Length
// unread): a broken or hostile front must not make the isolate hold whatever it sends.
async function replyBytes(resp) {
  const length = resp.headers.get("Content-Length");
  if (length !== null && Number(length) <= MAX_REPLY) return new Uint8Array(await resp.arrayBuffer());
  const bytes = length === null && resp.body !== null ? await upTo(resp.body, MAX_REPLY) : EMPTY;
  if (length === null && bytes.length <= MAX_REPLY) return bytes;
  if (length !== null && resp.body !== null) await resp.body.cancel();
  throw new Error(`reply larger than ${MAX_REPLY} bytes`);
}

// A final step's flag: after answering, call `due` in the background.
const THEN_DUE = 8;

// After an answer: the background calls due (leases renewed, unused units given back), and a wake at
// the next lease's end, each kept alive past the answer by `waitUntil`.
function background(ctx, env) {
  const out = output(due(Date.now()));
  const next = word(out, 0);
  const calls = [];
  for (let at = 4; at < out.length; at += 4 + word(out, at)) calls.push(out.slice(at + 4, at + 4 + word(out, at)));
  for (const step of calls) ctx.waitUntil(drive(step, env, () => {}));
  if (next <= 60000) ctx.waitUntil(new Promise((r) => setTimeout(r, next)).then(() => background(ctx, env)));
}

function errorText(e) {
  return e instanceof Error ? e.message || e.name : String(e);
}

// A step that is not final: send (1), wait (2), fetch a script (3).
const going = (step) => step[0] > 0 && step[0] < 4;

// Drives the wasm module from a step to its answer: each REST call it asks for, the text of a
// script Redis lost (from the static assets), and `ask(mayWait)` again after a wait (a borrow of
// the same subject under way; after a second, to be sent regardless); then `finish(step)` on the
// last step, at once (the step is a view of wasm memory, valid until the next call).
async function drive(step, env, finish, ask) {
  const since = Date.now();
  while (going(step)) {
    if (step[0] === 2) {
      await settled();
      step = ask(Date.now() - since < 1000 ? 1 : 0);
      continue;
    }
    const id = word(step, 1);
    if (step[0] === 3) {
      // A NOSCRIPT: the script's text, which the module checks against its SHA-1.
      let source = EMPTY;
      try {
        const resp = await env.ASSETS.fetch(`https://assets/lua/${text.decode(step.subarray(5))}.lua`);
        if (resp.ok) source = new Uint8Array(await resp.arrayBuffer());
      } catch {}
      put("", source);
      step = output(script(id, source.length, Date.now()));
      continue;
    }
    // slice: the REST body is copied out of wasm memory once, for the fetch to keep. The
    // module bounds every call (the policy's timeout_ms, or its own); past it the fetch and
    // the reply's read are aborted ("timed out"). A timer cleared once the reply is read:
    // AbortSignal.timeout's stays pending to its end, a measurable share of a take's CPU.
    const abort = new AbortController();
    const timer = setTimeout(() => abort.abort(Error("timed out")), word(step, 5));
    let status;
    let reply = null;
    try {
      const resp = await fetch(restUrl, { method: "POST", headers: restHeaders, body: step.slice(9), signal: abort.signal });
      status = resp.status;
      reply = await replyBytes(resp);
    } catch (e) {
      step = output(fail(id, put(errorText(e)), Date.now()));
    }
    clearTimeout(timer);
    if (reply !== null) {
      put("", reply);
      step = output(receive(id, status, reply.length, Date.now()));
    }
    // Calls told to wait for this answer ask again.
    wake?.resolve();
    wake = null;
  }
  return finish(step);
}

// A call's answer from its first `step`, `finish` of its last step, then the background calls
// that step asks for (after: `due` reuses the output the step is a view of). At once when its
// first step is final (an answer from memory: nothing to await, no exchange parked, no promise
// made); else driven to its end, run to it even if the runtime cancels the call (its client
// gone): each REST call is bounded, and the end frees the exchange, which would otherwise stay
// parked in the module.
function start(ctx, env, step, ask, finish) {
  const end = (step) => {
    const more = step[0] & THEN_DUE;
    try {
      return finish(step);
    } finally {
      if (more) background(ctx, env);
    }
  };
  if (!going(step)) return end(step);
  const answer = drive(step, env, end, ask);
  ctx.waitUntil(answer.catch(() => {}));
  return answer;
}

function serve(request, env, ctx) {
  configured(env);
  const h = request.headers;
  const length = h.get("Content-Length");
  const head =
    request.method + "\0" + request.url + "\0" + mark(h.get("Authorization")) + "\0" + mark(h.get("Origin")) + "\0" +
    mark(h.get("Idempotency-Key")) + "\0" + mark(length) + "\0" + json(ctx.props) + "\0";
  // Past MAX_BODY the wasm side answers 413: the body unread when its Content-Length is digits
  // saying so, else read no further than MAX_BODY + 1 bytes, whatever a Content-Length that is
  // not a number or lies says. An empty one (Content-Length: 0) is not waited for.
  if (length !== "0" && request.body !== null && !(/^\d+$/.test(length) && Number(length) > MAX_BODY)) {
    let body = EMPTY;
    let bodyError = "-";
    const ask = (mayWait) => output(handle(put(head + bodyError, body), body.length, Date.now(), mayWait));
    const read = upTo(request.body, MAX_BODY)
      .then(
        (b) => (body = b),
        (e) => (bodyError = "+" + errorText(e).replaceAll("\0", " ")),
      )
      .then(() => start(ctx, env, ask(1), ask, respond));
    ctx.waitUntil(read.catch(() => {}));
    return read;
  }
  const now = Date.now();
  const gen = word(mem(), GENERATION);
  if (now !== repeatsAt || gen !== repeatsOf) {
    repeats.clear();
    repeatsAt = now;
    repeatsOf = gen;
  }
  const again = repeats.get(head);
  if (again !== undefined) return new Response(again[0], again[1]);
  const ask = (mayWait, at = Date.now()) => output(handle(put(head + "-"), 0, at, mayWait));
  const step = ask(1, now);
  if (step[0] !== REPEAT) return start(ctx, env, step, ask, respond);
  const answer = parts(step);
  if (repeats.size < 64) repeats.set(head, answer);
  return new Response(answer[0], answer[1]);
}

// HTTP requests, public or through a Service binding to this default entrypoint, whose props
// (`ctx.props`) the module reads as the `Redcount` entrypoint's.
export default { fetch: serve };

// An argument's JSON, or a text that is not JSON for what JSON cannot hold (a function, a
// BigInt, a cycle): the module refuses it, naming the argument.
function json(value) {
  try {
    return JSON.stringify(value ?? null) ?? "!";
  } catch {
    return "!";
  }
}

// A text past MAX_BODY characters is past MAX_BODY bytes: cut there, for the module to refuse
// (413 for the input, 400 for the arguments) without its whole copied into wasm memory.
const cut = (s) => (s.length > MAX_BODY ? s.slice(0, MAX_BODY + 1) : s);

// An RPC call's end: the value, or the error, whose message carries its status and field
// (`{"status":400,"error":…,"field":…}`: a thrown error's own properties do not cross a binding).
function settle(step) {
  const value = text.decode(step.subarray(1));
  if ((step[0] & ~THEN_DUE) === 5) throw new Error(value);
  return JSON.parse(value);
}

// The Service binding's entry point: `env.REDCOUNT.take("per-user", "alice", { cost: 1 })`,
// one method per route of the API's table. The binding's props (`namespace`, `admin`) are the
// caller's scope and rights; the module reads them.
export class Redcount extends WorkerEntrypoint {
  // HTTP requests through a binding to this entrypoint, read with its props: a binding to the
  // default export passes through the static-assets router first, which hands it none.
  fetch(request) {
    return serve(request, this.env, this.ctx);
  }

  // The isolate's parked exchanges and memory (admin bindings only).
  stats() {
    configured(this.env);
    return settle(output(stats(put(json(this.ctx.props)))));
  }
}

// The methods, from the route table: `name(...params, fields, { idempotencyKey })`.
const methods = text.decode(output(rpc_methods())).split("\0");
for (let m = 0; m < methods.length; m += 2) {
  const [index, params] = [m / 2, Number(methods[m + 1])];
  Redcount.prototype[methods[m]] = function (...args) {
    configured(this.env);
    const texts = [args.slice(0, params), args[params + 1], args[params]].map((a) => cut(json(a)));
    const call = [index, json(this.ctx.props), ...texts];
    const ask = (mayWait) => output(rpc(put(call.join("\0")), Date.now(), mayWait));
    return start(this.ctx, this.env, ask(1), ask, settle);
  };
}
