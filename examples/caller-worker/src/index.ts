// A Worker of your own calling redcount through a Service binding (env.REDCOUNT, the redcount
// worker's `Redcount` entrypoint): the Hono middleware gives each user the "calls-per-minute"
// quota on /hello (past it 429 with RateLimit-Policy, RateLimit and Retry-After; allowed
// answers carry the first two), and a route makes a call of its own with the typed client,
// a refused call (bad input 400 naming the field, no such packet 404) answered as such.
// The part between the markers is README.md's "From your Worker" (rpc.rs holds them equal).

// README from your Worker: begin
import { Hono } from "hono";
import { type Binding, Redcount, RedcountError } from "@redcount/client";
import { rateLimit } from "@redcount/client/hono";

const app = new Hono<{ Bindings: { REDCOUNT: Binding } }>();
app.use("/hello/*", rateLimit({ policy: "calls-per-minute", key: (c) => c.req.header("x-user") ?? "anonymous" }));
app.get("/hello/:name", (c) => c.text(`hello, ${c.req.param("name")}`));
app.post("/packets/:id/grab", async (c) => {
  const redcount = new Redcount({ binding: c.env.REDCOUNT });
  try {
    return c.json(await redcount.grab(c.req.param("id"), { user: c.req.header("x-user") ?? "" }));
  } catch (e) {
    if (e instanceof RedcountError) return c.json({ error: e.message, field: e.field }, e.status as 400);
    throw e;
  }
});
export default app;
// README from your Worker: end
