// redcount's decisions in the caller's own isolate: the redcount worker's module (its wasm and
// shell, as `cargo xtask build-worker` makes them, copied beside this file as engine/ by
// `cargo xtask build-client`), called as a library, with no Service binding between. The
// caller then holds the REST front's token itself, as with @upstash/ratelimit.
import { alias } from "./cache.js";
import type { Binding } from "./index.js";
// @ts-ignore: plain JavaScript, copied into dist/engine/ when the package is built.
import { Redcount as Entrypoint } from "./engine/worker.js";
// @ts-ignore: the worker's Lua scripts by SHA-1 (www/lua), written there at the same time.
import scripts from "./engine/scripts.js";

// What the worker gets from its static assets: a script's text when Redis has lost it (NOSCRIPT).
const ASSETS = {
  async fetch(url: string): Promise<Response> {
    const sha = /\/lua\/([0-9a-f]{40})\.lua$/.exec(url)?.[1];
    const text = sha === undefined ? undefined : (scripts as Record<string, string>)[sha];
    return text === undefined ? new Response(null, { status: 404 }) : new Response(text);
  },
};

// The environment the worker's module reads: the caller's, with the scripts as its assets;
// one per caller env, so the module reads the configuration once (it re-reads on a new object).
// And per props (as written), the one target the client's denial cache sees for every engine
// of those; at most TARGETS of them kept, so props made per request cannot grow the isolate.
const envs = new WeakMap<object, { env: object; targets: Map<string, object> }>();
const TARGETS = 1024;

// The REDCOUNT_* vars of the first env: the module keeps one configuration (its leases, denials
// and calls in flight are of it), so an env that configures it otherwise is refused rather than
// switched to under those calls.
let configuration: string | undefined;

// The env as the module reads it, each of its values read once (a getter or a proxy cannot
// answer the check one way and the module another), the REDCOUNT_* vars in one order (the
// module compares their text), frozen (no one changes it under the module), and their text.
function snapshot(env: object): { env: object; vars: string } {
  const copy: { [name: string]: unknown } = {};
  const vars: [string, string][] = [];
  for (const [name, value] of Object.entries(env)) {
    if (name.startsWith("REDCOUNT_") && typeof value === "string") vars.push([name, value]);
    else copy[name] = value;
  }
  vars.sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  for (const [name, value] of vars) copy[name] = value;
  copy.ASSETS = ASSETS;
  return { env: Object.freeze(copy), vars: vars.flat().join("\0") };
}

function json(value: unknown): string | undefined {
  try {
    return JSON.stringify(value ?? null);
  } catch {
    return undefined;
  }
}

/** What the engine needs of the caller's request context: its `waitUntil`. */
export interface EngineContext {
  waitUntil(promise: Promise<unknown>): void;
}

/** The rights a call gets, as a Service binding's props give them to the worker. */
export interface EngineProps {
  /** Confines every key the calls touch to this tenant. */
  namespace?: string;
  /** The admin rights (within the namespace). */
  admin?: boolean;
}

/**
 * redcount in this isolate, for `new Redcount({ binding: engine(env, ctx) })`: the same methods,
 * answers and typed errors as the Service binding, without its hop. `env` holds the worker's
 * configuration (`REDCOUNT_POLICIES`, `REDCOUNT_REST_URL`, `REDCOUNT_REST_TOKEN`, as the redcount
 * worker reads them); `ctx` is this request's (its `waitUntil` keeps lease renewals and
 * give-backs running after the answer). Make one per request: engines of the same `env` and
 * props are one target for the client's denial cache, which answers a denied subject again
 * before the engine is asked (the engine keeps its own denials and leases too). One
 * configuration per isolate: an `env` whose `REDCOUNT_*` vars differ from the first one's is
 * refused (a `TypeError`).
 *
 * ```ts
 * import { Redcount } from "@redcount/client";
 * import { engine } from "@redcount/client/engine";
 *
 * export default {
 *   async fetch(request: Request, env: Env, ctx: ExecutionContext) {
 *     const redcount = new Redcount({ binding: engine(env, ctx) });
 *     const r = await redcount.take("per-user", "alice");
 *     return r.allowed ? new Response("hello") : new Response("later", { status: 429 });
 *   },
 * };
 * ```
 */
export function engine(env: object, ctx: EngineContext, props?: EngineProps): Binding {
  if (typeof env !== "object" || env === null) throw new TypeError("engine(env, ctx): env is the Worker's env");
  if (typeof ctx?.waitUntil !== "function") throw new TypeError("engine(env, ctx): ctx is the request's context");
  // The entrypoint's methods read `this.env` and `this.ctx` (its `waitUntil` and `props`).
  let own = envs.get(env);
  if (own === undefined) {
    const { env: copy, vars } = snapshot(env);
    configuration ??= vars;
    if (vars !== configuration) {
      throw new TypeError("engine(env, ctx): one redcount configuration per isolate, and this env's REDCOUNT_* vars differ from the first one's");
    }
    own = { env: copy, targets: new Map() };
    envs.set(env, own);
  }
  // The props as they are now, as JSON: what the module reads and the cache's target are one
  // (props changed after this call change neither); props that are not JSON go as they are,
  // for the module to refuse.
  const scope = json(props);
  const seen = scope === undefined ? props : JSON.parse(scope);
  const self = Object.create(Entrypoint.prototype, {
    env: { value: own.env },
    ctx: { value: Object.freeze({ waitUntil: (p: Promise<unknown>) => ctx.waitUntil(p), props: seen }) },
  });
  // Engines of one env and the same props answer alike: one target for the client's cache
  // (props that are not JSON, or longer than any valid ones, get none: the module refuses them).
  if (scope !== undefined && scope.length <= 256) {
    let target = own.targets.get(scope);
    if (target === undefined) {
      if (own.targets.size >= TARGETS) own.targets.clear();
      target = {};
      own.targets.set(scope, target);
    }
    alias(self, target);
  }
  return self as Binding;
}
