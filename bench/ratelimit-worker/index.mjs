// The peer in `cargo xtask bench`: a JavaScript worker using the official @upstash/ratelimit
// (fixed window) through the same REST front and Redis as the redcount worker's quota route.
// POST /limit/{id} -> {"allowed", "remaining", "limit", "reset"}; POST /cached/{id} the same
// with the library's default ephemeral cache (identifiers denied are denied from isolate memory
// until their reset).
import { Redis } from "@upstash/redis/cloudflare";
import { Ratelimit } from "@upstash/ratelimit";

const limiters = {}; // one of each per isolate, as a real deployment would keep them

export default {
  async fetch(request, env) {
    const { pathname } = new URL(request.url);
    const m = pathname.match(/^\/(limit|cached)\/([A-Za-z0-9_-]{1,64})$/);
    if (!m || request.method !== "POST") {
      return Response.json({ error: "POST /limit/{id} or /cached/{id}" }, { status: 404 });
    }
    const cached = m[1] === "cached";
    limiters[m[1]] ??= new Ratelimit({
      redis: new Redis({ url: env.REST_URL, token: env.REST_TOKEN, enableTelemetry: false }),
      limiter: Ratelimit.fixedWindow(Number(env.LIMIT), env.WINDOW),
      prefix: cached ? `${env.PREFIX}-cached` : env.PREFIX,
      analytics: false,
      // /limit/: every call asks Redis, as redcount's route without a cache does; /cached/:
      // the library's default (a Map per isolate).
      ...(cached ? {} : { ephemeralCache: false }),
    });
    try {
      const r = await limiters[m[1]].limit(m[2]);
      return Response.json({ allowed: r.success, remaining: r.remaining, limit: r.limit, reset: r.reset });
    } catch (e) {
      return Response.json({ error: String(e) }, { status: 502 });
    }
  },
};
