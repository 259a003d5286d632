// The client's denial cache: a quota take or peek, or a decision, that redcount denied is
// answered again from the caller's own memory, with no call across the binding or the network,
// for as long as redcount's answer allowed (`cache_ms`: the least of what is left of the
// policy's `cache_denials_ms` and of the denial's `retry_after_ms`; redcount leaves it out
// where a denial may not be repeated: `cache_denials_ms` 0, a decision with a semaphore part,
// an Idempotency-Key, a degraded answer). Repeated answers say `"cached": true`, their waits
// shrunk by the time passed.
//
// It lives in module scope, one per isolate (or process), shared by every client in it: a
// Worker makes its client per request (`new Redcount({ binding: env.REDCOUNT })` in a
// handler), so a cache of the instance's would be gone by the next request, while the
// isolate serves a whole flood. Entries are keyed by where the call goes (the binding object,
// or the URL and the fetch), the method and every argument but the call options, so only the
// same call is ever answered from it; bounded by MAX_DENIALS, least recently used out.
// An override, refund, reset or a reservation's settle, extend or release made through any
// client of this isolate drops the subject's entries (its tenant's, for `TENANT/USER`) at
// once, under every target (the same subjects may be reached through two bindings); made
// elsewhere, redcount's `cache_ms` bounds how long a denial outlives it.
import type { MethodName } from "./generated.js";

/** The most denials the cache keeps (each at most {@link MAX_KEY} characters of key). */
export const MAX_DENIALS = 1000;
/** A call whose arguments are longer than this (as JSON) is never cached. */
const MAX_KEY = 2048;
/** A denial is refreshed by one call (the others still answered) in the last 1/REFRESH_AT of its life. */
const REFRESH_AT = 8;

/** The calls whose denials may be repeated, and the index of their subject (or tenant). */
const REPEATED: { [name: string]: number } = {
  take: 1,
  peek: 1,
  takeTenant: 1,
  peekTenant: 1,
  decide: 0,
  decideTenant: 0,
};

/** The calls that may give a subject units back, and the index of their subject (or tenant). */
const FORGETTING: { [name: string]: number } = {
  refund: 1,
  reset: 1,
  setOverride: 1,
  clearOverride: 1,
  refundTenant: 1,
  resetTenant: 1,
  settle: 0,
  extendReservation: 0,
  releaseReservation: 0,
  settleTenant: 0,
  extendReservationTenant: 0,
  releaseReservationTenant: 0,
};

type Answer = { [field: string]: unknown };

interface Entry {
  /** When the call it repeats was sent (this clock): the answer is at least that fresh. */
  at: number;
  /** Repeated until then. */
  until: number;
  /** The subject's tenant (the subject before `/`): what a give-back drops. */
  root: string;
  answer: Answer;
  /** A call under way that refreshes it. */
  refresh?: Promise<unknown>;
}

const entries = new Map<string, Entry>();
/** Bumped by every give-back: a denial answered across one is not kept. */
let forgets = 0;
/** The latest time seen: a clock that goes back drops everything. */
let latest = 0;
const ids = new WeakMap<object, number>();
let made = 0;

function now(): number {
  const t = Date.now();
  if (t < latest) entries.clear();
  latest = t;
  return t;
}

/** Objects that stand for another target (an engine made per request, for its env and props). */
const aliases = new WeakMap<object, object>();

/** Makes `o` the same target as `as` for the denial cache. */
export function alias(o: object, as: object): void {
  aliases.set(o, as);
}

/** A number for an object (a binding, a fetch), the same for as long as it lives (0 for none). */
export function idOf(o: unknown): number {
  if ((typeof o !== "object" && typeof o !== "function") || o === null) return 0;
  o = aliases.get(o) ?? o;
  let id = ids.get(o as object);
  if (id === undefined) {
    id = ++made;
    ids.set(o as object, id);
  }
  return id;
}

const texts = new Map<string, number>();

/** A number for a text (an admin token: its rights change the answers), the same for the
 * isolate's life (0 for none); the text itself never goes into a key. */
export function idOfText(t: string | undefined): number {
  if (!t) return 0;
  let id = texts.get(t);
  if (id === undefined) {
    id = ++made;
    texts.set(t, id);
  }
  return id;
}

/** True for JSON made of strings, finite numbers, booleans, null, arrays and plain objects. */
function plain(v: unknown, depth = 0): boolean {
  if (v === null || typeof v === "string" || typeof v === "boolean") return true;
  if (typeof v === "number") return Number.isFinite(v);
  if (typeof v !== "object" || depth > 4) return false;
  if (Array.isArray(v)) return v.every((x) => plain(x, depth + 1));
  const proto = Object.getPrototypeOf(v);
  return (proto === Object.prototype || proto === null) && Object.values(v).every((x) => plain(x, depth + 1));
}

/** The root of a subject: its tenant for `TENANT/USER`, else itself. */
function rootOf(subject: string): string {
  const slash = subject.indexOf("/");
  return slash < 0 ? subject : subject.slice(0, slash);
}

/**
 * `send()`, the call `name(...args)` to `target` (`params` path parameters), through the
 * cache: a repeatable call is answered from it when it can be, and its denial kept; a
 * give-back drops its subject's entries. `use` false: nothing is looked up or kept (a
 * give-back still drops).
 */
export function through(
  target: string,
  name: MethodName,
  params: number,
  args: unknown[],
  use: boolean,
  send: () => Promise<unknown>,
): Promise<unknown> {
  const forgetting = FORGETTING[name];
  if (forgetting !== undefined) {
    const subject = args[forgetting];
    if (typeof subject !== "string") return send();
    forget(rootOf(subject));
    // Dropped again when it ends: a denial answered meanwhile may predate it.
    const end = () => forget(rootOf(subject));
    return send().finally(end);
  }
  const at = REPEATED[name];
  if (!use || at === undefined) return send();
  const options = args[params + 1] as { idempotencyKey?: unknown } | undefined;
  // An Idempotency-Key's answer may be a stored one: never repeated, never kept.
  if (args.length > params + 2 || (options !== undefined && (typeof options !== "object" || options?.idempotencyKey !== undefined))) {
    return send();
  }
  // The key: `target`, `name` and the JSON of the path parameters and fields (as an array),
  // written piece by piece rather than through copies of the arguments.
  let json = "[";
  for (let i = 0; i < params; i++) {
    const p = args[i];
    if (typeof p !== "string") return send();
    json += JSON.stringify(p) + ",";
  }
  const fields = args[params] ?? null;
  if (!plain(fields)) return send();
  json += JSON.stringify(fields) + "]";
  if (json.length > MAX_KEY) return send();
  const key = `${target}\0${name}\0${json}`;
  const e = entries.get(key);
  // Nothing held (allowed traffic): straight to the call, no promise of the cache's own.
  return e === undefined ? learn(key, rootOf(args[at] as string), send) : repeat(key, e, rootOf(args[at] as string), send);
}

/** The call whose key holds the entry `held`: answered from it, or sent again to refresh it. */
async function repeat(key: string, held: Entry, root: string, send: () => Promise<unknown>): Promise<unknown> {
  let e: Entry | undefined = held;
  let t = now();
  // Late in its life, one call refreshes it while the others are still answered.
  if (t < e.until && (e.refresh !== undefined || (e.until - t) * REFRESH_AT > e.until - e.at)) return answer(key, e, t);
  if (e.refresh !== undefined) {
    // Ended with a refresh under way: wait for it, once, rather than all asking at once.
    await e.refresh.then(
      () => {},
      () => {},
    );
    const again = entries.get(key);
    t = now();
    if (again !== undefined && t < again.until) return answer(key, again, t);
    e = undefined;
  }
  const sent = learn(key, root, send);
  if (e !== undefined) {
    const refreshed = e;
    refreshed.refresh = sent;
    const done = () => {
      if (refreshed.refresh === sent) refreshed.refresh = undefined;
    };
    sent.then(done, done);
  }
  return sent;
}

/** Sends the call; keeps its denial when redcount says it may be repeated, else drops the entry. */
function learn(key: string, root: string, send: () => Promise<unknown>): Promise<unknown> {
  const at = now();
  const generation = forgets;
  return send().then((got) => keep(key, root, at, generation, got));
}

/** `got`, the answer to a call sent at `at`; kept when it is a denial that may be repeated. */
function keep(key: string, root: string, at: number, generation: number, got: unknown): unknown {
  const a = got as Answer | null;
  const ms = a?.cache_ms;
  const retry = a?.retry_after_ms;
  if (
    a !== null &&
    typeof a === "object" &&
    a.allowed === false &&
    a.degraded !== true &&
    typeof ms === "number" &&
    typeof retry === "number" &&
    ms > 0 &&
    generation === forgets
  ) {
    entries.delete(key);
    if (entries.size >= MAX_DENIALS) entries.delete(entries.keys().next().value as string);
    entries.set(key, { at, until: at + Math.min(ms, retry), root, answer: copy(a) });
  } else {
    entries.delete(key);
  }
  return got;
}

/** The denial again at `t`: `cached`, its waits shrunk by the time passed. */
function answer(key: string, e: Entry, t: number): Answer {
  // Most recently used: last out.
  entries.delete(key);
  entries.set(key, e);
  const gone = t - e.at;
  const a = copy(e.answer);
  a.cached = true;
  a.cache_ms = e.until - t;
  a.retry_after_ms = Math.max(1, (a.retry_after_ms as number) - gone);
  const waits: number[] = [];
  if (Array.isArray(a.parts)) {
    for (const p of a.parts as Answer[]) {
      if (typeof p.reset_ms === "number") p.reset_ms = Math.max(0, p.reset_ms - gone);
      if (typeof p.retry_after_ms === "number") p.retry_after_ms = p.allowed ? 0 : Math.max(0, p.retry_after_ms - gone);
      waits.push((p.allowed ? p.reset_ms : p.retry_after_ms) as number);
    }
  } else {
    if (typeof a.reset_ms === "number") a.reset_ms = Math.max(0, a.reset_ms - gone);
    waits.push(a.retry_after_ms as number);
  }
  const h = a.headers as { [name: string]: string } | undefined;
  if (h !== undefined) {
    const s = (ms: number) => Math.ceil(Math.max(0, ms) / 1000);
    if (h["Retry-After"] !== undefined) h["Retry-After"] = String(Math.max(1, s(a.retry_after_ms as number)));
    let i = 0;
    // `"policy";r=…;t=…`, one item per part: `t` is the item's wait in seconds.
    if (h.RateLimit !== undefined) {
      h.RateLimit = h.RateLimit.replace(/;t=\d+/g, (m) => {
        const w = waits[i++];
        return w === undefined ? m : `;t=${s(w)}`;
      });
    }
  }
  return a;
}

/** A copy of an answer (flat but for its headers and parts), so no caller changes the kept one. */
function copy(a: Answer): Answer {
  const c: Answer = { ...a };
  if (a.headers !== undefined) c.headers = { ...(a.headers as object) };
  if (Array.isArray(a.parts)) c.parts = a.parts.map((p) => ({ ...p }));
  return c;
}

/** Drops every entry of the subjects under `root`, and every denial answered across this. */
function forget(root: string): void {
  forgets++;
  for (const [key, e] of entries) if (e.root === root) entries.delete(key);
}

/** How many denials the cache holds now (for tests and stats). */
export function denialsHeld(): number {
  return entries.size;
}
