// The floor in `cargo xtask bench`: a worker that does nothing but one fetch to the REST front
// per request (PING) and hands back its answer. No worker that calls Redis through the front
// can cost less; the redcount and @upstash/ratelimit workers are measured against it.
export default {
  async fetch(request, env) {
    const reply = await fetch(env.REST_URL + "/", {
      method: "POST",
      headers: { Authorization: `Bearer ${env.REST_TOKEN}` },
      body: '["PING"]',
    });
    return new Response(await reply.arrayBuffer(), {
      status: reply.status,
      headers: { "Content-Type": "application/json" },
    });
  },
};
