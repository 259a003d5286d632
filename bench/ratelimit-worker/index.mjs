// The peer in `cargo xtask bench`: a JavaScript worker using the official @upstash/ratelimit
// (fixed window) through the same REST front and Redis as the redcount worker's quota route.
// POST /limit/{id} -> {"allowed", "remaining", "limit", "reset"}.
import { Redis } from "@upstash/redis/cloudflare";
import { Ratelimit } from "@upstash/ratelimit";

let limiter; // one per isolate, as a real deployment would keep it

export default {
  async fetch(request, env) {
    const { pathname } = new URL(request.url);
    const m = pathname.match(/^\/limit\/([A-Za-z0-9_-]{1,64})$/);
    if (!m || request.method !== "POST") {
      return Response.json({ error: "POST /limit/{id}" }, { status: 404 });
    }
    limiter ??= new Ratelimit({
      redis: new Redis({ url: env.REST_URL, token: env.REST_TOKEN, enableTelemetry: false }),
      limiter: Ratelimit.fixedWindow(Number(env.LIMIT), env.WINDOW),
      prefix: env.PREFIX,
      analytics: false,
      ephemeralCache: false, // every call asks Redis, as redcount's route does
    });
    try {
      const r = await limiter.limit(m[1]);
      return Response.json({ allowed: r.success, remaining: r.remaining, limit: r.limit, reset: r.reset });
    } catch (e) {
      return Response.json({ error: String(e) }, { status: 502 });
    }
  },
};
