// redcount's Cloudflare Worker: the platform half of a thin shell around redcount_api.
//
// This module owns the I/O (reading the request, the REST fetch, the Response); every
// decision is the wasm module's (src/lib.rs, which drives redcount_api): it is called once
// per step with the bytes of that step, written into its input buffer, and leaves the next
// step in its output buffer (its doc comment has the layout). `cargo xtask build-worker`
// copies this file to build/index.js beside wasm-bindgen's glue and the wasm.
import wasmModule from "./redcount_worker_bg.wasm";
import { initSync, input, configure, rest_target, max_body, max_reply, handle, receive, fail, due } from "./redcount_worker.js";

const { memory } = initSync({ module: wasmModule });

const MAX_BODY = max_body();
const MAX_REPLY = max_reply();
const EMPTY = new Uint8Array(0);
const text = new TextDecoder();
const utf8 = new TextEncoder();

// Writes `str` (UTF-8) then `bytes` into the wasm module's input buffer; returns the length
// of `str` in bytes.
function put(str, bytes = EMPTY) {
  const room = str.length * 3 + bytes.length;
  const at = input(room);
  const view = new Uint8Array(memory.buffer, at, room);
  const { written } = utf8.encodeInto(str, view);
  view.set(bytes, written);
  return written;
}

const word = (b, at) => (b[at] | (b[at + 1] << 8) | (b[at + 2] << 16) | (b[at + 3] << 24)) >>> 0;

// A call's output: a view of wasm memory, valid until the next call into the module.
function output(at) {
  const mem = new Uint8Array(memory.buffer);
  return mem.subarray(at + 4, at + 4 + word(mem, at));
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
  for (const name of Object.keys(env)) {
    const value = env[name];
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

function header(headers, name) {
  const v = headers.get(name);
  return v === null ? "-" : "+" + v;
}

// The headers of the last response, reused while the next one's bytes are the same (most
// responses carry exactly Content-Type and Cache-Control); Response copies them, never changes
// them. A plain object: the runtime converts it in one go, cheaper than a list of pairs.
let lastBlock = EMPTY;
let lastHeaders = {};

function headerObject(block) {
  if (block.length === lastBlock.length) {
    let i = 0;
    while (i < block.length && block[i] === lastBlock[i]) i++;
    if (i === block.length) return lastHeaders;
  }
  const list = text.decode(block).split("\0");
  const headers = {};
  for (let i = 0; i + 1 < list.length; i += 2) {
    const [name, value] = [list[i], list[i + 1]];
    // A repeated name (none today) keeps every value, as HTTP lists do.
    headers[name] = Object.hasOwn(headers, name) ? `${headers[name]}, ${value}` : value;
  }
  lastBlock = block.slice();
  lastHeaders = headers;
  return headers;
}

// A respond step as the platform's Response: status, the API's headers, the body (one copy).
function respond(step) {
  const status = step[1] | (step[2] << 8);
  const len = (step[3] | (step[4] << 8) | (step[5] << 16) | (step[6] << 24)) >>> 0;
  const headers = headerObject(step.subarray(7, 7 + len));
  // slice: the body is copied out of wasm memory once, for the runtime to keep.
  return new Response(status === 204 ? null : step.slice(7 + len), { status, headers });
}

// The REST reply's bytes, refused past MAX_REPLY as they arrive (a longer Content-Length
// unread): a broken or hostile front must not make the isolate hold whatever it sends.
async function replyBytes(resp) {
  const length = resp.headers.get("Content-Length");
  if (length !== null && Number(length) <= MAX_REPLY) return new Uint8Array(await resp.arrayBuffer());
  const tooLarge = () => new Error(`reply larger than ${MAX_REPLY} bytes`);
  if (length !== null || resp.body === null) {
    if (resp.body !== null) await resp.body.cancel();
    if (length !== null) throw tooLarge();
    return EMPTY;
  }
  const reader = resp.body.getReader();
  const chunks = [];
  let size = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    size += value.length;
    if (size > MAX_REPLY) {
      await reader.cancel();
      throw tooLarge();
    }
    chunks.push(value);
  }
  const all = new Uint8Array(size);
  let at = 0;
  for (const c of chunks) {
    all.set(c, at);
    at += c.length;
  }
  return all;
}

// Makes the REST calls a step asks for until a respond step (a view, as `output`'s).
async function drive(step) {
  while (step[0] === 1) {
    const id = word(step, 1);
    const timeout = word(step, 5);
    // slice: the REST body is copied out of wasm memory once, for the fetch to keep.
    const init = { method: "POST", headers: restHeaders, body: step.slice(9) };
    // Past the policy's timeout_ms the runtime aborts the fetch ("…timeout").
    if (timeout > 0) init.signal = AbortSignal.timeout(timeout);
    let status;
    let reply;
    try {
      const resp = await fetch(restUrl, init);
      status = resp.status;
      reply = await replyBytes(resp);
    } catch (e) {
      reply = null;
      step = output(fail(id, put(errorText(e)), Date.now()));
    }
    if (reply !== null) {
      put("", reply);
      step = output(receive(id, status, reply.length, Date.now()));
    }
    wake?.resolve();
    wake = null;
  }
  return step;
}

// After a response: the background calls due (leases' unused units given back), and a wake
// at the next lease's end, each kept alive past the response by `waitUntil`.
function background(ctx) {
  const out = output(due(Date.now()));
  const next = word(out, 0);
  for (let at = 4; at < out.length; at += 4 + word(out, at)) {
    ctx.waitUntil(drive(out.subarray(at + 4, at + 4 + word(out, at))));
  }
  if (next <= 60000) ctx.waitUntil(new Promise((r) => setTimeout(r, next)).then(() => background(ctx)));
}

function errorText(e) {
  return e instanceof Error ? e.message || e.name : String(e);
}

export default {
  async fetch(request, env, ctx) {
    configured(env);
    const h = request.headers;
    const length = h.get("Content-Length");
    const head =
      request.method + "\0" + request.url + "\0" + header(h, "Authorization") + "\0" + header(h, "Origin") + "\0" +
      header(h, "Idempotency-Key") + "\0" + (length === null ? "-" : "+" + length);
    let body = EMPTY;
    let bodyError = "-";
    // Past MAX_BODY the wasm side answers 413 without the body ever being read; an empty one
    // (Content-Length: 0) is not waited for.
    if (request.body !== null && length !== "0" && !(Number(length) > MAX_BODY)) {
      try {
        body = new Uint8Array(await request.arrayBuffer());
      } catch (e) {
        bodyError = "+" + errorText(e).replaceAll("\0", " ");
      }
    }
    const since = Date.now();
    const ask = () => output(handle(put(head + "\0" + bodyError, body), body.length, Date.now(), Date.now() - since < 1000 ? 1 : 0));
    let step;
    while ((step = ask())[0] === 2) await settled();
    step = await drive(step);
    const more = step[0] === 3;
    const response = respond(step);
    if (more) background(ctx);
    return response;
  },
};
