// The typed client of redcount: the same methods, answers and error whether it calls the
// redcount worker through a Cloudflare Service binding (RPC, no network hop) or the HTTP API
// (the worker's or `redcount serve`'s). Its methods come from the route table through
// openapi.json (src/generated.ts).
import { idOf, idOfText, through } from "./cache.js";
import { type MethodName, type Methods, routes } from "./generated.js";

export * from "./generated.js";
export { MAX_DENIALS, denialsHeld } from "./cache.js";

/** A refused call: its HTTP status, the message, and the input field at fault (if one is). */
export class RedcountError extends Error {
  /** The HTTP status (400 bad input, 401 rights, 403 beyond a public limit, 404, 503, …). */
  readonly status: number;
  /** The input at fault: a field (`cost`), a parameter (`subject`), `body`, `Idempotency-Key`. */
  readonly field: string | undefined;
  /** The error's whole body (`durable`, `may_have_run` where they apply). */
  readonly body: Record<string, unknown>;

  constructor(status: number, body: Record<string, unknown>) {
    super(typeof body.error === "string" ? body.error : `HTTP ${status}`);
    this.name = "RedcountError";
    this.status = status;
    this.field = typeof body.field === "string" ? body.field : undefined;
    this.body = body;
  }

  /**
   * The typed error a binding's thrown error stands for (its message is the error's JSON with
   * its status), or `undefined` for any other error.
   */
  static fromBinding(e: unknown): RedcountError | undefined {
    if (!(e instanceof Error)) return undefined;
    try {
      const body = JSON.parse(e.message);
      if (body && typeof body === "object" && typeof body.status === "number" && typeof body.error === "string") {
        const { status, ...rest } = body;
        return new RedcountError(status, rest);
      }
    } catch {}
    return undefined;
  }
}

/** The redcount worker's Service binding (`env.REDCOUNT`): any object with its methods. */
export type Binding = { [name: string]: ((...args: never[]) => Promise<unknown>) | unknown };

/** How to reach redcount. */
export type Options = (
  | {
      /** The Service binding to the redcount worker's `Redcount` entrypoint. */
      binding: Binding;
    }
  | {
      /** The HTTP API's base URL (`https://redcount.example.workers.dev`). */
      url: string;
      /** The admin token, for admin calls and beyond the public limits. Never in a browser. */
      adminToken?: string;
      /** The fetch to use (default: the global one). */
      fetch?: typeof fetch;
    }
) & {
  /**
   * Answer a denied take, peek or decision again from this isolate's memory, without a call,
   * for as long as redcount says it may be repeated (at most the policy's `cache_denials_ms`,
   * never past its `retry_after_ms`), as `"cached": true`. Default: true.
   */
  cacheDenials?: boolean;
};

/** The headers of an HTTP answer that are part of the answer (as the binding gives them). */
const ANSWER_HEADERS = ["RateLimit-Policy", "RateLimit", "Retry-After", "Idempotent-Replayed"];

/**
 * A redcount client. Over a binding: `new Redcount({ binding: env.REDCOUNT })`; over HTTP:
 * `new Redcount({ url, adminToken })`. Every method takes the route's path parameters, then
 * its fields, then call options, and answers the API's JSON (with `headers` when it came with
 * RateLimit headers); a refused call throws a {@link RedcountError}.
 *
 * ```ts
 * const redcount = new Redcount({ binding: env.REDCOUNT });
 * const r = await redcount.take("per-user", "alice", { cost: 1 });
 * if (!r.allowed) return new Response("slow down", { status: 429, headers: r.headers });
 * ```
 */
export class Redcount {
  readonly #options: Options;
  /** Where its calls go, as the denial cache tells targets apart. */
  readonly #target: string;

  constructor(options: Options) {
    if (!options || (!("binding" in options) && !("url" in options))) {
      throw new TypeError("new Redcount({ binding }) or new Redcount({ url, adminToken })");
    }
    this.#options = options;
    // A binding is its object (its props, which scope it, cannot be read); a URL is itself, the
    // fetch that reaches it (a Service binding's fetch may carry props of its own) and the
    // admin token it sends (an admin's denial is no answer to a public call, which may be 403).
    this.#target =
      "binding" in options
        ? `b${idOf(options.binding)}`
        : `u${options.fetch ? idOf(options.fetch) : 0}\0${idOfText(options.adminToken)}\0${options.url.replace(/\/+$/, "")}`;
  }

  /** Calls the method `name` with `args` (what each typed method does). */
  call(name: MethodName, args: unknown[]): Promise<unknown> {
    // Not an async function: the promise is through's own, one fewer per call; an error in
    // reading the arguments still comes as a rejection.
    try {
      const params = routes[name]?.params.length ?? 0;
      const use = this.#options.cacheDenials !== false;
      return through(this.#target, name, params, args, use, () => this.#send(name, args));
    } catch (e) {
      return Promise.reject(e);
    }
  }

  async #send(name: MethodName, args: unknown[]): Promise<unknown> {
    const o = this.#options;
    if ("binding" in o) {
      const binding = o.binding as { [name: string]: (...args: unknown[]) => Promise<unknown> };
      // Read once: on an RPC stub each read of a method makes a new callable.
      const method = binding[name];
      if (typeof method !== "function") throw new TypeError(`the binding has no method ${name}`);
      try {
        // Reflect.apply, not method.apply: on an RPC stub, `apply` and `call` are remote names too.
        return await Reflect.apply(method, binding, args);
      } catch (e) {
        throw RedcountError.fromBinding(e) ?? e;
      }
    }
    return this.#http(o, name, args);
  }

  async #http(o: Extract<Options, { url: string }>, name: MethodName, args: unknown[]): Promise<unknown> {
    const route = routes[name];
    const n = route.params.length;
    // A tenant's user goes as one segment, `TENANT%2FUSER`: in two, a user named like an
    // action of the path (`refund`) would be read as that action.
    let path: string = route.path.replace("{tenant}/{user}", "{tenant}%2F{user}");
    route.params.forEach((p, i) => {
      const value = args[i];
      if (typeof value !== "string") {
        throw new RedcountError(400, { error: `${p} must be a string`, field: p });
      }
      path = path.replace(`{${p}}`, encodeURIComponent(value));
    });
    const input = args[n] as Record<string, unknown> | null | undefined;
    const options = (args[n + 1] ?? {}) as { idempotencyKey?: string };
    const headers: Record<string, string> = {};
    if (o.adminToken) headers.Authorization = `Bearer ${o.adminToken}`;
    if (options.idempotencyKey !== undefined) headers["Idempotency-Key"] = options.idempotencyKey;
    let body: string | undefined;
    if (route.query) {
      const q = new URLSearchParams();
      for (const [k, v] of Object.entries(input ?? {})) if (v !== undefined) q.set(k, String(v));
      const text = q.toString();
      if (text) path += `?${text}`;
    } else if (input !== undefined && input !== null) {
      headers["Content-Type"] = "application/json";
      body = JSON.stringify(input);
    }
    const resp = await (o.fetch ?? fetch)(o.url.replace(/\/+$/, "") + path, { method: route.method, headers, body });
    const text = await resp.text();
    let json: Record<string, unknown>;
    try {
      json = JSON.parse(text);
    } catch {
      throw new RedcountError(resp.status, { error: `not a redcount answer (HTTP ${resp.status}): ${text.slice(0, 200)}` });
    }
    if (resp.status >= 400 && json.degraded !== true) throw new RedcountError(resp.status, json);
    const own: Record<string, string> = {};
    for (const h of ANSWER_HEADERS) {
      const v = resp.headers.get(h);
      if (v !== null) own[h] = v;
    }
    return Object.keys(own).length > 0 ? { ...json, headers: own } : json;
  }
}

// One method per route, from the table: `take(...)` is `call("take", [...])`.
export interface Redcount extends Methods {}
for (const name of Object.keys(routes) as MethodName[]) {
  Object.defineProperty(Redcount.prototype, name, {
    value: function (this: Redcount, ...args: unknown[]) {
      return this.call(name, args);
    },
    writable: true,
    configurable: true,
  });
}
