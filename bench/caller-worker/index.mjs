// The benchmark's caller worker (`cargo xtask bench`), in one workerd with the redcount worker:
// one quota take per request (POST /<how>/<policy>/<subject>), through its RPC entrypoint with
// the typed client as a user's worker calls it (`rpc`: a client made per request, its denial
// cache on as by default), as an HTTP request to the same worker through a plain Service
// binding (`http`), through a binding to the floor worker's `Floor` (`floor`: the hop and one
// fetch, no decision), with redcount's engine in this isolate (`inline`: the typed client over
// `@redcount/client/engine`, on this worker's REDCOUNT_* vars; no binding, no hop, as a
// library runs), or over the network to the redcount worker served on its own (`public`, at
// PUBLIC_URL), the last two with plain fetches: the call's path and nothing else.
// The client is packages/client as built (`cargo xtask build-client`), what its package holds.
import { Redcount } from "../../packages/client/dist/index.js";
import { engine } from "../../packages/client/dist/engine.js";

export default {
  async fetch(request, env, ctx) {
    const [, how, policy, subject] = new URL(request.url).pathname.split("/");
    if (how === "rpc") {
      // The same answer as bench/ratelimit-worker's, as a caller would build its own.
      const r = await new Redcount({ binding: env.REDCOUNT }).take(policy, subject);
      return Response.json({ allowed: r.allowed, remaining: r.remaining, limit: r.limit, reset: r.reset_ms });
    }
    if (how === "inline") {
      const r = await new Redcount({ binding: engine(env, ctx) }).take(policy, subject);
      return Response.json({ allowed: r.allowed, remaining: r.remaining, limit: r.limit, reset: r.reset_ms });
    }
    if (how === "floor") {
      // The floor of any limiter behind a binding (bench/floor-worker's `Floor`): the hop and
      // one fetch to the front in the callee, no decision.
      const r = await env.FLOOR.take(policy, subject);
      return Response.json({ allowed: r.allowed, remaining: r.remaining, limit: r.limit, reset: r.reset_ms });
    }
    const path = `/api/quotas/${policy}/${subject}`;
    const resp =
      how === "http"
        ? await env.REDCOUNT_HTTP.fetch(`http://redcount${path}`, { method: "POST" })
        : await fetch(env.PUBLIC_URL + path, { method: "POST" });
    return new Response(resp.body, resp);
  },
};
