// The example with routes the tests drive (tests/tests/it/rpc.rs), served under workerd beside
// the redcount worker: the client's contract over the binding, any method through any of the
// bindings the test config gives it (public, admin, a tenant's), the isolate's stats, and
// calls cancelled while in flight. Not part of the example a user copies.
import app from "../src/index";
import * as lib from "@redcount/client";
import { type EngineContext, engine } from "@redcount/client/engine";
import { contract } from "../../../packages/client/test/contract.mjs";

type Bindings = { [name: string]: any };
const test = app as unknown as import("hono").Hono<{ Bindings: Bindings }>;

// Every method over the binding: the same contract the client passes over HTTP.
test.post("/test/contract", async (c) => {
  const make = (admin: boolean) => new lib.Redcount({ binding: admin ? c.env.REDCOUNT_ADMIN : c.env.REDCOUNT });
  try {
    return c.json({ calls: await contract(lib, make, crypto.randomUUID().slice(0, 8)) });
  } catch (e) {
    return c.json({ failed: String(e) }, 500);
  }
});

// Every method with redcount's engine in this isolate (no binding; this worker's REDCOUNT_*
// vars): the same contract.
test.post("/test/contract-engine", async (c) => {
  const make = (admin: boolean) =>
    new lib.Redcount({ binding: engine(c.env, c.executionCtx, admin ? { admin: true } : undefined) });
  try {
    return c.json({ calls: await contract(lib, make, crypto.randomUUID().slice(0, 8)) });
  } catch (e) {
    return c.json({ failed: String(e) }, 500);
  }
});

// The binding named `binding`; ENGINE (public rights), ENGINE_ADMIN and ENGINE_BAD (props that
// are no rights): the engine instead.
const ENGINES: { [name: string]: object | undefined } = { ENGINE: undefined, ENGINE_ADMIN: { admin: true }, ENGINE_BAD: { zzz: 1 } };
function target(c: { env: Bindings; executionCtx: EngineContext }, name: string): lib.Binding {
  if (name in ENGINES) return engine(c.env, c.executionCtx, ENGINES[name]);
  return c.env[name];
}

// A take through an engine of another env object: the `same` REDCOUNT_* vars, the same in
// another `order`, `other` ones (one configuration per isolate: refused), or a `getter` whose
// policies are the same on the first read and none after. The answer, or the thrown message.
function otherEnv(env: Bindings, kind: string): object {
  if (kind === "same") return { ...env };
  if (kind === "other") return { ...env, REDCOUNT_POLICIES: "{}" };
  if (kind === "order") {
    const names = Object.keys(env).filter((k) => k.startsWith("REDCOUNT_")).reverse();
    return { ...Object.fromEntries(names.map((k) => [k, env[k]])), ...env };
  }
  let reads = 0;
  const copy = { ...env };
  Object.defineProperty(copy, "REDCOUNT_POLICIES", { enumerable: true, get: () => (reads++ === 0 ? env.REDCOUNT_POLICIES : "{}") });
  return copy;
}
test.post("/test/engine-env/:kind/:subject", async (c) => {
  try {
    const client = new lib.Redcount({ binding: engine(otherEnv(c.env, c.req.param("kind")), c.executionCtx) });
    return c.json({ value: await client.take("one-a-day", c.req.param("subject")) });
  } catch (e) {
    return c.json({ thrown: e instanceof Error ? `${e.name}: ${e.message}` : String(e) });
  }
});

// A take through an engine made with props `{}`, the props object then given a prop that is
// no right before the call: the call is made with the props as they were.
test.post("/test/engine-props-changed/:subject", async (c) => {
  const props: { [k: string]: unknown } = {};
  const client = new lib.Redcount({ binding: engine(c.env, c.executionCtx, props) });
  props.zzz = 1;
  try {
    return c.json({ value: await client.take("one-a-day", c.req.param("subject")) });
  } catch (e) {
    if (e instanceof lib.RedcountError) return c.json({ error: { status: e.status, message: e.message, field: e.field } });
    return c.json({ thrown: String(e) });
  }
});

// One call: `args` (the JSON body) to `method` through the binding named `binding`.
test.post("/test/call/:binding/:method", async (c) => {
  const client = new lib.Redcount({ binding: target(c, c.req.param("binding")) });
  try {
    return c.json({ value: await client.call(c.req.param("method") as lib.MethodName, await c.req.json()) });
  } catch (e) {
    if (e instanceof lib.RedcountError) return c.json({ error: { status: e.status, message: e.message, field: e.field } });
    return c.json({ thrown: String(e) }, 500);
  }
});

// One call as `/test/call` makes it, through a wrapper of the binding that counts the calls
// that cross it (one wrapper per binding for the isolate's life, as the binding is one object:
// the client's denial cache, in module scope, tells targets apart by that object).
const counted = new WeakMap<object, { stub: object; crossed: number }>();
test.post("/test/counted/:binding/:method", async (c) => {
  const b = c.env[c.req.param("binding")];
  let w = counted.get(b);
  if (w === undefined) {
    const entry = { stub: {}, crossed: 0 };
    entry.stub = new Proxy(b, {
      get: (t, name) =>
        typeof t[name] === "function"
          ? (...args: unknown[]) => {
              entry.crossed++;
              return t[name](...args);
            }
          : t[name],
    });
    counted.set(b, entry);
    w = entry;
  }
  const client = new lib.Redcount({ binding: w.stub as lib.Binding });
  try {
    const value = await client.call(c.req.param("method") as lib.MethodName, await c.req.json());
    return c.json({ value, crossed: w.crossed, held: lib.denialsHeld() });
  } catch (e) {
    if (e instanceof lib.RedcountError) return c.json({ error: { status: e.status, message: e.message, field: e.field } });
    return c.json({ thrown: String(e) }, 500);
  }
});

// `n` calls at once through the binding (`args`: the JSON body, `{i}` in a string replaced by
// the call's number): the answers, in order.
test.post("/test/storm/:method/:n", async (c) => {
  const client = new lib.Redcount({ binding: c.env.REDCOUNT });
  const args = JSON.stringify(await c.req.json());
  const calls = Array.from({ length: Number(c.req.param("n")) }, (_, i) =>
    client.call(c.req.param("method") as lib.MethodName, JSON.parse(args.replaceAll("{i}", String(i)))).then(
      (value) => ({ value }),
      (e) => ({ error: String(e) }),
    ),
  );
  return c.json(await Promise.all(calls));
});

test.get("/test/stats", async (c) => c.json(await c.env.REDCOUNT_ADMIN.stats()));

// Through the binding named `binding`, an oversized call: `take` with a field of `n` characters
// (`?arg=subject`: a subject of `n`), or (`?length=`) a POST of `n` bytes whose Content-Length
// header says `length`. The thrown message, or the response's status and JSON.
test.post("/test/oversize/:binding/:n", async (c) => {
  const [b, n, length] = [c.env[c.req.param("binding")], Number(c.req.param("n")), c.req.query("length")];
  try {
    if (length === undefined) {
      const big = "\x01".repeat(n);
      const args = c.req.query("arg") === "subject" ? ["daily-prize", big] : ["daily-prize", "big", { cost: 1, pad: big }];
      return c.json({ value: await b.take(...args) });
    }
    const init = { method: "POST", headers: { "Content-Length": length }, body: new Uint8Array(n).fill(65) };
    const r = await b.fetch("http://redcount/api/quotas/daily-prize/big", init);
    return c.json({ status: r.status, json: await r.json() });
  } catch (e) {
    return c.json({ thrown: e instanceof Error ? e.message : String(e) });
  }
});

// A request through the plain Service binding named `binding` (`/api/...` and its method as
// given, no Authorization): the status and the JSON.
test.all("/test/http/:binding/*", async (c) => {
  const path = new URL(c.req.url).pathname.split("/").slice(4).join("/");
  const r = await c.env[c.req.param("binding")].fetch(`http://redcount/${path}`, { method: c.req.method });
  return c.json({ status: r.status, json: await r.json() });
});

// `n` HTTP requests to the redcount worker (through a plain Service binding), each given up
// after `ms`: requests the runtime cancels while their REST call is in flight.
test.post("/test/cancel/http/:n/:ms", async (c) => {
  const [n, ms] = [Number(c.req.param("n")), Number(c.req.param("ms"))];
  const sent = Array.from({ length: n }, (_, i) =>
    c.env.REDCOUNT_HTTP.fetch(`http://redcount/api/quotas/burst/cancel-h${i}`, { method: "POST", signal: AbortSignal.timeout(ms) }),
  );
  const settled = await Promise.allSettled(sent);
  return c.json({ cancelled: settled.filter((s) => s.status === "rejected").length });
});

// The same for RPC calls: each made by a request of this worker's own (through SELF) that is
// given up after `ms`, which cancels its call in flight.
test.post("/test/cancel/rpc/:n/:ms", async (c) => {
  const [n, ms] = [Number(c.req.param("n")), Number(c.req.param("ms"))];
  const sent = Array.from({ length: n }, (_, i) =>
    c.env.SELF.fetch(`http://caller/test/rpc-once/cancel-r${i}`, { method: "POST", signal: AbortSignal.timeout(ms) }),
  );
  const settled = await Promise.allSettled(sent);
  return c.json({ cancelled: settled.filter((s) => s.status === "rejected").length });
});

test.post("/test/rpc-once/:subject", async (c) => {
  return c.json(await new lib.Redcount({ binding: c.env.REDCOUNT }).take("burst", c.req.param("subject")));
});

export default test;
