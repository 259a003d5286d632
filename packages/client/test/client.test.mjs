// The client over HTTP against a real `redcount serve` (the test crate starts it, with the
// test suite's policies, and passes REDCOUNT_URL and REDCOUNT_ADMIN_TOKEN): every method through
// the shared contract, the typed error, the Hono middleware in-process, and src/generated.ts
// checked against openapi.json.
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { Hono } from "hono";
import * as lib from "@redcount/client";
import { rateLimit } from "@redcount/client/hono";
import { contract } from "./contract.mjs";

const url = process.env.REDCOUNT_URL;
const adminToken = process.env.REDCOUNT_ADMIN_TOKEN;
const run = Math.random().toString(36).slice(2, 10);

test("src/generated.ts is what openapi.json generates", () => {
  execFileSync(process.execPath, [new URL("../scripts/generate.mjs", import.meta.url).pathname, "--check"]);
});

test("every method over HTTP", { skip: !url }, async () => {
  const calls = await contract(lib, (admin) => new lib.Redcount(admin ? { url, adminToken } : { url }), run);
  assert.ok(calls > 40, `${calls} calls`);
});

test("a bad input is a RedcountError with its status and field", { skip: !url }, async () => {
  const redcount = new lib.Redcount({ url });
  await assert.rejects(redcount.peek("daily-prize", `e-${run}`, { cost: 2.5 }), (e) => {
    assert.ok(e instanceof lib.RedcountError);
    assert.equal(e.status, 400);
    assert.equal(e.field, "cost");
    assert.match(e.message, /cost/);
    return true;
  });
});

test("the Hono middleware answers 429 with the headers, and sets them on allowed answers", { skip: !url }, async () => {
  const app = new Hono();
  const client = new lib.Redcount({ url });
  app.use("/limited/*", rateLimit({ policy: "daily-prize", key: (c) => c.req.header("x-user") ?? "anon", client }));
  app.get("/limited/hello", (c) => c.text("hello"));
  const user = `m-${run}`;
  for (let i = 0; i < 2; i++) {
    const r = await app.request("/limited/hello", { headers: { "x-user": user } });
    assert.equal(r.status, 200);
    assert.equal(await r.text(), "hello");
    assert.equal(r.headers.get("RateLimit-Policy"), '"daily-prize";q=2;w=86400');
    assert.match(r.headers.get("RateLimit"), /^"daily-prize";r=\d+;t=\d+$/);
  }
  const denied = await app.request("/limited/hello", { headers: { "x-user": user } });
  assert.equal(denied.status, 429);
  assert.ok(Number(denied.headers.get("Retry-After")) > 0);
  assert.equal(denied.headers.get("RateLimit-Policy"), '"daily-prize";q=2;w=86400');
  assert.match(denied.headers.get("RateLimit"), /^"daily-prize";r=0;/);
  assert.equal((await denied.json()).error, "rate limited");
  // Another user has their own quota.
  assert.equal((await app.request("/limited/hello", { headers: { "x-user": `${user}-2` } })).status, 200);
});
