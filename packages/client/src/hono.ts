// A Hono middleware that rate-limits requests with a redcount quota policy: one `take` per
// request, answered 429 with the standard headers when denied, the headers set on allowed
// responses too.
import type { Context, MiddlewareHandler } from "hono";
import { Redcount, RedcountError } from "./index.js";

/** What {@link rateLimit} needs. */
export interface RateLimitOptions<C extends Context = Context> {
  /** The quota policy (configured in the redcount worker) each request takes from. */
  policy: string;
  /** Who is limited: the subject of the take (a user id, an API key's id, an address). */
  key: (c: C) => string | Promise<string>;
  /** Units per request (default 1), or how many this request costs. */
  cost?: number | ((c: C) => number | Promise<number>);
  /**
   * The client (default: over the Service binding `c.env.REDCOUNT`, made once per binding).
   */
  client?: Redcount | ((c: C) => Redcount);
}

const clients = new WeakMap<object, Redcount>();

function clientOf<C extends Context>(c: C, option: RateLimitOptions<C>["client"]): Redcount {
  if (option instanceof Redcount) return option;
  if (typeof option === "function") return option(c);
  const binding = (c.env as { REDCOUNT?: object } | undefined)?.REDCOUNT;
  if (!binding) throw new TypeError("rateLimit: no client given and no REDCOUNT binding in c.env");
  let client = clients.get(binding);
  if (!client) {
    client = new Redcount({ binding: binding as never });
    clients.set(binding, client);
  }
  return client;
}

/**
 * Rate-limits with `policy`, per `key(c)`:
 *
 * ```ts
 * app.use("/api/*", rateLimit({ policy: "per-user", key: (c) => c.req.header("x-user-id") ?? "anonymous" }));
 * ```
 *
 * A denied request is answered 429 with `RateLimit-Policy`, `RateLimit` and `Retry-After`
 * (and `{"error", "retry_after_ms"}`); an allowed one goes on, its response given
 * `RateLimit-Policy` and `RateLimit`. When redcount cannot reach Redis, the policy's declared
 * failure mode decides: an allowed request goes on, a denied one is answered 503. A take
 * redcount refuses (a key that is no subject: 400; a cost past the public limit: 403) is
 * answered with that status and `{"error", "field"}`.
 */
export function rateLimit<C extends Context = Context>(options: RateLimitOptions<C>): MiddlewareHandler {
  return async (c, next) => {
    const ctx = c as C;
    const cost = typeof options.cost === "function" ? await options.cost(ctx) : (options.cost ?? 1);
    const answer = await clientOf(ctx, options.client)
      .take(options.policy, await options.key(ctx), { cost })
      .catch((e: unknown) => (e instanceof RedcountError ? e : Promise.reject(e)));
    if (answer instanceof RedcountError) {
      // Refused by redcount (a key that is no subject, a cost past the public limit): its
      // status and message, not an opaque 500.
      return c.json({ error: answer.message, field: answer.field }, answer.status as 400);
    }
    const headers = answer.headers ?? {};
    if (!answer.allowed) {
      const degraded = "degraded" in answer && answer.degraded === true;
      const body = degraded
        ? { error: "the rate limit could not be checked", reason: answer.reason }
        : { error: "rate limited", retry_after_ms: "retry_after_ms" in answer ? answer.retry_after_ms : undefined };
      return c.json(body, degraded ? 503 : 429, headers);
    }
    await next();
    for (const name of ["RateLimit-Policy", "RateLimit"]) {
      const value = headers[name];
      if (value === undefined) continue;
      try {
        c.res.headers.set(name, value);
      } catch {
        // A response whose headers are immutable (one fetched from elsewhere): a copy.
        c.res = new Response(c.res.body, c.res);
        c.res.headers.set(name, value);
      }
    }
  };
}
