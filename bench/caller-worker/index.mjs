// The benchmark's caller worker (`cargo xtask bench`), in one workerd with the redcount worker:
// one quota take per request (POST /<how>/<policy>/<subject>), through its RPC entrypoint
// (`rpc`, the stub as a user's worker calls it), as an HTTP request to the same worker through
// a plain Service binding (`http`), or over the network to the redcount worker served on its
// own (`public`, at REDCOUNT_URL), so the three differ in the call's path only.
export default {
  async fetch(request, env) {
    const [, how, policy, subject] = new URL(request.url).pathname.split("/");
    if (how === "rpc") {
      // The same answer as bench/ratelimit-worker's, as a caller would build its own.
      const r = await env.REDCOUNT.take(policy, subject);
      return Response.json({ allowed: r.allowed, remaining: r.remaining, limit: r.limit, reset: r.reset_ms });
    }
    const path = `/api/quotas/${policy}/${subject}`;
    const resp =
      how === "http"
        ? await env.REDCOUNT_HTTP.fetch(`http://redcount${path}`, { method: "POST" })
        : await fetch(env.REDCOUNT_URL + path, { method: "POST" });
    return new Response(resp.body, resp);
  },
};
