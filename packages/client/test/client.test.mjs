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
  // A key that is no subject: redcount's 400 naming it, not an opaque 500.
  const bad = await app.request("/limited/hello", { headers: { "x-user": "no good" } });
  assert.equal(bad.status, 400);
  assert.equal((await bad.json()).field, "subject");
});

// The HTTP calls the clients below make, counted (one function for the file: the denial cache
// tells targets apart by the fetch as well as the URL).
let sent = 0;
const counting = (...args) => {
  sent++;
  return fetch(...args);
};
// A client per call, as a Worker makes one per request: the cache is the module's.
const client = () => new lib.Redcount({ url, fetch: counting });
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

test("a denial is repeated from the caller's memory for what redcount allows, its wait shrinking", { skip: !url }, async () => {
  const s = `d-${run}`;
  assert.equal((await client().take("one-a-day", s)).allowed, true);
  const first = await client().take("one-a-day", s);
  assert.equal(first.allowed, false);
  assert.equal(first.cached, undefined, "redcount's own answer");
  assert.ok(first.cache_ms > 0 && first.cache_ms <= 1000, `cache_ms ${first.cache_ms}`);
  // A flood of the exhausted subject: answered here, a call now and then to refresh it.
  const [before, started] = [sent, Date.now()];
  const flood = [];
  for (let round = 0; round < 10; round++) {
    flood.push(...(await Promise.all(Array.from({ length: 50 }, () => client().take("one-a-day", s)))));
  }
  const [calls, seconds] = [sent - before, (Date.now() - started) / 1000];
  assert.ok(calls <= 2 + 2 * Math.ceil(seconds), `${calls} calls for 500 takes in ${seconds} s`);
  for (const a of flood) {
    assert.equal(a.allowed, false);
    assert.ok(a.retry_after_ms >= 1 && a.retry_after_ms <= first.retry_after_ms, JSON.stringify(a));
    assert.ok(a.cache_ms > 0 && a.cache_ms <= 1000, JSON.stringify(a));
    assert.equal(a.headers["Retry-After"], String(Math.max(1, Math.ceil(a.retry_after_ms / 1000))));
    assert.equal(a.headers.RateLimit, `"one-a-day";r=0;t=${Math.ceil(a.retry_after_ms / 1000)}`);
  }
  assert.ok(flood.filter((a) => a.cached === true).length >= 500 - calls, "the others are marked cached");
  // Its wait shrinks with the time passed.
  const a = await client().take("one-a-day", s);
  await sleep(60);
  const b = await client().take("one-a-day", s);
  assert.ok(b.retry_after_ms <= a.retry_after_ms - 50, `${a.retry_after_ms} then ${b.retry_after_ms}`);

  // Never another subject, another cost, another method, nor a call with an Idempotency-Key
  // (its answer may be a stored one: redcount gives it no cache_ms, and it is not kept).
  let at = sent;
  assert.equal((await client().take("one-a-day", `${s}-2`)).allowed, true);
  assert.equal((await client().peek("one-a-day", s, { cost: 1 })).allowed, false);
  const keyed = await client().take("one-a-day", s, {}, { idempotencyKey: `k-${run}` });
  assert.equal(keyed.allowed, false);
  assert.equal(keyed.cache_ms, undefined);
  assert.equal(sent - at, 3, "each asked redcount");

  // A refund through any client of this process drops the subject's denials at once.
  const admin = new lib.Redcount({ url, adminToken });
  assert.equal((await admin.refund("one-a-day", s, { cost: 1 })).refunded, 1);
  at = sent;
  assert.equal((await client().take("one-a-day", s)).allowed, true);
  assert.equal(sent - at, 1);
  // An admission, a peek's included, is never kept.
  const fresh = `${s}-3`;
  for (let i = 0; i < 2; i++) assert.equal((await client().peek("one-a-day", fresh, { cost: 1 })).allowed, true);
  assert.equal(sent - at, 3);
  // So does a tenant's: its users' denials go.
  const t = `t-${run}`;
  assert.equal((await client().takeTenant("one-a-day", t, "u1")).allowed, true);
  assert.equal((await client().takeTenant("one-a-day", t, "u1")).allowed, false);
  assert.equal((await client().takeTenant("one-a-day", t, "u1")).cached, true);
  await admin.resetTenant("one-a-day", t, "u1");
  assert.equal((await client().takeTenant("one-a-day", t, "u1")).allowed, true);

  // A client told not to keeps nothing and asks every time.
  const u = `n-${run}`;
  const uncaching = new lib.Redcount({ url, fetch: counting, cacheDenials: false });
  await uncaching.take("one-a-day", u);
  at = sent;
  for (let i = 0; i < 3; i++) assert.equal((await uncaching.take("one-a-day", u)).allowed, false);
  assert.equal(sent - at, 3);
});

test("a policy with cache_denials_ms 0, or a decision with a semaphore part, is never repeated", { skip: !url }, async () => {
  const s = `z-${run}`;
  assert.equal((await client().take("uncached", s)).allowed, true);
  const at = sent;
  for (let i = 0; i < 5; i++) {
    const r = await client().take("uncached", s);
    assert.equal(r.allowed, false);
    assert.equal(r.cache_ms, undefined);
    assert.equal(r.cached, undefined);
  }
  assert.equal(sent - at, 5);
  // A decision denied by its quota part: repeated with its parts' waits shrunk, unless a
  // semaphore part's live state is in it.
  const quota = { parts: [{ policy: "one-a-day" }] };
  assert.equal((await client().decide(s, quota)).allowed, true);
  const denied = await client().decide(s, quota);
  assert.ok(!denied.allowed && denied.cache_ms > 0, JSON.stringify(denied));
  await sleep(20);
  const again = await client().decide(s, quota);
  assert.equal(again.cached, true);
  assert.ok(again.parts[0].retry_after_ms < denied.parts[0].retry_after_ms, JSON.stringify(again));
  assert.equal(again.headers.RateLimit, `"one-a-day";r=0;t=${Math.ceil(again.parts[0].retry_after_ms / 1000)}`);
  const mixed = { parts: [{ policy: "one-a-day" }, { policy: "device-slots", holder: "h" }] };
  const before = sent;
  for (let i = 0; i < 2; i++) {
    const r = await client().decide(s, mixed);
    assert.ok(!r.allowed && r.cache_ms === undefined && r.cached === undefined, JSON.stringify(r));
  }
  assert.equal(sent - before, 2);
});

test("a flood of distinct subjects never grows the cache past its cap", { skip: !url }, async () => {
  const n = lib.MAX_DENIALS + 40;
  const subject = (i) => `l-${run}-${i}`;
  for (let i = 0; i < n; i += 50) {
    const batch = Array.from({ length: Math.min(50, n - i) }, (_, k) => subject(i + k));
    await Promise.all(batch.map((s) => client().take("one-a-day", s)));
    const denied = await Promise.all(batch.map((s) => client().take("one-a-day", s)));
    assert.ok(denied.every((d) => d.allowed === false && d.cache_ms > 0));
    assert.ok(lib.denialsHeld() <= lib.MAX_DENIALS, `${lib.denialsHeld()} held`);
  }
  assert.equal(lib.denialsHeld(), lib.MAX_DENIALS);
  // The least recently used went first: the first subject is asked again, the last is not
  // (answered within its cache_ms).
  const at = sent;
  assert.equal((await client().take("one-a-day", subject(n - 1))).cached, true);
  assert.equal(sent - at, 0);
  assert.equal((await client().take("one-a-day", subject(0))).allowed, false);
  assert.equal(sent - at, 1);
});

test("an admin's cached denial is no answer to a public client of the same URL", { skip: !url }, async () => {
  const s = `adm-${run}`;
  const admin = () => new lib.Redcount({ url, fetch: counting, adminToken });
  // A cost past the public maximum (1): the admin takes the limit (2), then is denied; the
  // public is refused (403), not told the admin's denial.
  assert.equal((await admin().take("daily-prize", s, { cost: 2 })).allowed, true);
  const denied = await admin().take("daily-prize", s, { cost: 2 });
  assert.ok(!denied.allowed && denied.cache_ms > 0, JSON.stringify(denied));
  assert.equal((await admin().take("daily-prize", s, { cost: 2 })).cached, true);
  await assert.rejects(client().take("daily-prize", s, { cost: 2 }), (e) => e instanceof lib.RedcountError && e.status === 403);
});
