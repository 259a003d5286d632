// The floors in `cargo xtask bench`. The default export does nothing but one fetch to the
// REST front per request (PING) and hands back its answer: no worker that calls Redis through
// the front can cost less; the redcount and @upstash/ratelimit workers are measured against it.
// `Floor`, an RPC entrypoint, is the same floor for a Service binding: `take(policy, subject)`
// makes one fetch (an INCR of the subject's key, less Redis work than any limiter's script) and
// answers an object of a take's shape. No limiter reached through a binding can cost less.
import { WorkerEntrypoint } from "cloudflare:workers";

const post = (env, body) =>
  fetch(env.REST_URL + "/", { method: "POST", headers: { Authorization: `Bearer ${env.REST_TOKEN}` }, body });

export default {
  async fetch(request, env) {
    const reply = await post(env, '["PING"]');
    return new Response(await reply.arrayBuffer(), {
      status: reply.status,
      headers: { "Content-Type": "application/json" },
    });
  },
};

export class Floor extends WorkerEntrypoint {
  async take(policy, subject) {
    const reply = await post(this.env, JSON.stringify(["INCR", `floor:${policy}:${subject}`]));
    const { result } = await reply.json();
    return { allowed: true, remaining: 500 - result, limit: 500, reset_ms: 3600000 };
  }
}
