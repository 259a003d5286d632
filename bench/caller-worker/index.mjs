// The benchmark's caller worker (`cargo xtask bench`), in one workerd with the redcount worker:
// one quota take per request, through its RPC entrypoint (POST /rpc/<subject>) or as an HTTP
// request to the same worker through a plain Service binding (POST /http/<subject>), so the
// two differ in the call's form only.
export default {
  async fetch(request, env) {
    const [, how, subject] = new URL(request.url).pathname.split("/");
    if (how === "rpc") return Response.json(await env.REDCOUNT.take("bench-quota", subject));
    const resp = await env.REDCOUNT_HTTP.fetch(`http://redcount/api/quotas/bench-quota/${subject}`, { method: "POST" });
    return new Response(resp.body, resp);
  },
};
