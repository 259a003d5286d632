// A Worker of your own calling redcount through a Service binding (env.REDCOUNT, the redcount
// worker's `Redcount` entrypoint): the Hono middleware limits a route per user, and a route
// makes a call of its own with the typed client.
import { Hono } from "hono";
import { type Binding, Redcount, RedcountError } from "@redcount/client";
import { rateLimit } from "@redcount/client/hono";

export type Env = { REDCOUNT: Binding };

const app = new Hono<{ Bindings: Env }>();

// Each user gets the "calls-per-minute" quota: past it, 429 with RateLimit-Policy, RateLimit
// and Retry-After; allowed answers carry RateLimit-Policy and RateLimit.
app.use("/hello/*", rateLimit({ policy: "calls-per-minute", key: (c) => c.req.header("x-user") ?? "anonymous" }));
app.get("/hello/:name", (c) => c.text(`hello, ${c.req.param("name")}`));

// A call of one's own: a share of a red packet, once per user.
app.post("/packets/:id/grab", async (c) => {
  const redcount = new Redcount({ binding: c.env.REDCOUNT });
  try {
    return c.json(await redcount.grab(c.req.param("id"), { user: c.req.header("x-user") ?? "" }));
  } catch (e) {
    // Bad input (400, naming the field), no such packet (404), redcount unavailable (503).
    if (e instanceof RedcountError) return c.json({ error: e.message, field: e.field }, e.status as 400);
    throw e;
  }
});

export default app;
