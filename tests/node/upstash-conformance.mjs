// Conformance of redcount-rest with the official Upstash clients, unmodified.
// Env: REST_URL, REST_TOKEN, REST_READONLY_TOKEN. Prints one line per check, then
// "N passed, N failed"; exits 1 on any failure. Run by tests/tests/it/rest.rs.
import assert from "node:assert/strict";
import { Redis } from "@upstash/redis";
import { Ratelimit } from "@upstash/ratelimit";

const url = process.env.REST_URL;
const token = process.env.REST_TOKEN;
const readonlyToken = process.env.REST_READONLY_TOKEN;
const run = Math.random().toString(36).slice(2, 8);
let pass = "a";
const k = (name) => `conf:${run}:${pass}:${name}`;

let passed = 0, failed = 0;
async function check(name, fn) {
  try {
    await fn();
    passed++;
    console.log(`ok - ${name}`);
  } catch (e) {
    failed++;
    console.log(`not ok - ${name}: ${e && e.stack ? e.stack.split("\n").slice(0, 3).join(" | ") : e}`);
  }
}

for (const encoding of ["base64", false]) {
  const redis = new Redis({ url, token, responseEncoding: encoding, enableTelemetry: false });
  const tag = `[encoding=${encoding}]`;
  pass = String(encoding);

  await check(`strings ${tag}`, async () => {
    assert.equal(await redis.set(k("s"), "héllo ✓ 🚀 \"quoted\" \\ back"), "OK");
    assert.equal(await redis.get(k("s")), "héllo ✓ 🚀 \"quoted\" \\ back");
    assert.equal(await redis.incr(k("n")), 1);
    assert.equal(await redis.incrby(k("n"), 41), 42);
    assert.equal(await redis.set(k("e"), "v", { ex: 100 }), "OK");
    const ttl = await redis.ttl(k("e"));
    assert.ok(ttl > 90 && ttl <= 100, `ttl ${ttl}`);
    assert.equal(await redis.append(k("s2"), "ab"), 2);
    await redis.mset({ [k("m1")]: "a", [k("m2")]: "b" });
    assert.deepEqual(await redis.mget(k("m1"), k("m2"), k("missing")), ["a", "b", null]);
    assert.equal(await redis.getdel(k("m1")), "a");
    assert.equal(await redis.get(k("m1")), null);
    // JSON values: the client serialises objects and reads them back.
    await redis.set(k("obj"), { a: 1, b: [1, 2] });
    assert.deepEqual(await redis.get(k("obj")), { a: 1, b: [1, 2] });
  });

  await check(`hashes ${tag}`, async () => {
    assert.equal(await redis.hset(k("h"), { f1: "v1", f2: "ünï" }), 2);
    assert.equal(await redis.hget(k("h"), "f2"), "ünï");
    assert.deepEqual(await redis.hgetall(k("h")), { f1: "v1", f2: "ünï" });
    assert.equal(await redis.hincrby(k("h"), "n", 5), 5);
    assert.equal(await redis.hlen(k("h")), 3);
  });

  await check(`lists ${tag}`, async () => {
    assert.equal(await redis.rpush(k("l"), "a", "b", "c"), 3);
    assert.equal(await redis.lpush(k("l"), "z"), 4);
    assert.deepEqual(await redis.lrange(k("l"), 0, -1), ["z", "a", "b", "c"]);
    assert.equal(await redis.lpop(k("l")), "z");
    assert.equal(await redis.llen(k("l")), 3);
  });

  await check(`sets ${tag}`, async () => {
    assert.equal(await redis.sadd(k("set"), "a", "b", "a"), 2);
    assert.deepEqual((await redis.smembers(k("set"))).sort(), ["a", "b"]);
    assert.equal(await redis.sismember(k("set"), "b"), 1);
    assert.equal(await redis.scard(k("set")), 2);
  });

  await check(`sorted sets ${tag}`, async () => {
    assert.equal(await redis.zadd(k("z"), { score: 1, member: "one" }, { score: 2, member: "two" }), 2);
    assert.deepEqual(await redis.zrange(k("z"), 0, -1, { withScores: true }), ["one", 1, "two", 2]);
    assert.equal(await redis.zscore(k("z"), "two"), 2);
    assert.equal(await redis.zincrby(k("z"), 5, "one"), 6);
    assert.deepEqual(await redis.zrange(k("z"), 0, -1), ["two", "one"]);
  });

  await check(`eval and evalsha ${tag}`, async () => {
    const src = "return {KEYS[1], ARGV[1], 7}";
    assert.deepEqual(await redis.eval(src, [k("ek")], ["arg"]), [k("ek"), "arg", 7]);
    const sha = await redis.scriptLoad("return ARGV[1] .. '!'");
    assert.match(sha, /^[0-9a-f]{40}$/);
    assert.equal(await redis.evalsha(sha, [], ["hi"]), "hi!");
    assert.deepEqual(await redis.scriptExists(sha), [1]);
  });

  await check(`Script class across SCRIPT FLUSH ${tag}`, async () => {
    const script = redis.createScript(`return redis.call('INCRBY', KEYS[1], ARGV[1]) -- ${run} ${encoding}`);
    assert.equal(await script.exec([k("sc")], ["2"]), 2);
    assert.equal(await script.exec([k("sc")], ["3"]), 5);
    assert.equal(await redis.scriptFlush(), "OK");
    assert.equal(await script.exec([k("sc")], ["4"]), 9, "EVALSHA fails with NOSCRIPT, the client retries with EVAL");
  });

  await check(`allow-key-locking scripts keep EVALSHA with the client's SHA ${tag}`, async () => {
    const src = `#!lua flags=allow-key-locking\nreturn redis.call('INCR', KEYS[1]) -- ${run} ${encoding}`;
    const sha = await redis.scriptLoad(src);
    const { createHash } = await import("node:crypto");
    assert.equal(sha, createHash("sha1").update(src).digest("hex"), "SCRIPT LOAD answers the SHA of the client's text");
    assert.equal(await redis.evalsha(sha, [k("kl")], []), 1);
    assert.equal(await redis.eval(src, [k("kl")], []), 2);
    assert.deepEqual(await redis.scriptExists(sha), [1]);
  });

  await check(`pipeline ${tag}`, async () => {
    const p = redis.pipeline();
    p.set(k("p1"), "x");
    p.incr(k("p2"));
    p.get(k("p1"));
    p.hset(k("p1"), { f: "v" }); // WRONGTYPE
    const res = await p.exec({ keepErrors: true });
    assert.equal(res[0].result, "OK");
    assert.equal(res[1].result, 1);
    assert.equal(res[2].result, "x");
    assert.match(String(res[3].error), /WRONGTYPE/);
  });

  await check(`transaction ${tag}`, async () => {
    const tx = redis.multi();
    tx.set(k("t1"), "1");
    tx.incr(k("t1"));
    tx.get(k("t1"));
    assert.deepEqual(await tx.exec(), ["OK", 2, 2]);
  });
}

await check("wrong token is refused with 401", async () => {
  const bad = new Redis({ url, token: "wrong", enableTelemetry: false });
  await assert.rejects(bad.get("x"), /Unauthorized/);
  const r = await fetch(url, { method: "POST", headers: { Authorization: "Bearer wrong" }, body: '["PING"]' });
  assert.equal(r.status, 401);
  assert.match((await r.json()).error, /Unauthorized/);
});

await check("read-only token reads, and is refused a write", async () => {
  const rw = new Redis({ url, token, enableTelemetry: false });
  const ro = new Redis({ url, token: readonlyToken, enableTelemetry: false });
  await rw.set(k("ro"), "v");
  assert.equal(await ro.get(k("ro")), "v");
  await assert.rejects(ro.set(k("ro"), "w"), /NOPERM.*read-only/);
  await assert.rejects(ro.eval("return 1", [], []), /EVAL_RO/);
  assert.equal(await rw.get(k("ro")), "v");
});

// @upstash/ratelimit, every single-region algorithm: a burst of 12 concurrent calls for one
// identifier gets exactly its limit of 5.
const redis = new Redis({ url, token, enableTelemetry: false });
const algorithms = {
  fixedWindow: Ratelimit.fixedWindow(5, "30 s"),
  slidingWindow: Ratelimit.slidingWindow(5, "30 s"),
  tokenBucket: Ratelimit.tokenBucket(1, "30 s", 5),
  cachedFixedWindow: Ratelimit.cachedFixedWindow(5, "30 s"),
};
for (const [name, limiter] of Object.entries(algorithms)) {
  await check(`@upstash/ratelimit ${name} allows exactly its limit`, async () => {
    const rl = new Ratelimit({
      redis,
      limiter,
      prefix: `rl:${run}:${name}`,
      analytics: false,
      ephemeralCache: name === "cachedFixedWindow" ? new Map() : false,
    });
    const results = await Promise.all(Array.from({ length: 12 }, () => rl.limit("user-1")));
    const ok = results.filter((r) => r.success).length;
    assert.equal(ok, 5, `${ok} allowed`);
    assert.equal(results.find((r) => r.success).limit, 5);
    const again = await rl.limit("user-1");
    assert.equal(again.success, false);
    const other = await rl.limit("user-2");
    assert.equal(other.success, true, "another identifier has its own limit");
    if (typeof rl.getRemaining === "function") {
      const rem = await rl.getRemaining("user-2");
      assert.equal(typeof rem === "object" ? rem.remaining : rem, 4);
    }
    // The cached variant also blocks in its in-process cache, so a reset shows only on the others.
    if (typeof rl.resetUsedTokens === "function" && name !== "cachedFixedWindow") {
      await rl.resetUsedTokens("user-1");
      assert.equal((await rl.limit("user-1")).success, true, "allowed again after resetUsedTokens");
    }
  });
}

// Pub/sub over server-sent events: the client's own subscriber parses the front's stream.
await check("subscribe / psubscribe over server-sent events", async () => {
  const redis = new Redis({ url, token, enableTelemetry: false });
  const channel = `conf:${run}:news`;
  const got = [];
  const pgot = [];
  const sub = redis.subscribe([channel]);
  const psub = redis.psubscribe([`conf:${run}:ne*`]);
  sub.on("message", (m) => got.push(m));
  psub.on("pmessage", (m) => pgot.push(m));
  const deadline = Date.now() + 10000;
  // Publish until both subscriptions are in place and have heard it.
  while ((got.length === 0 || pgot.length === 0) && Date.now() < deadline) {
    await redis.publish(channel, { hello: "world" });
    await new Promise((r) => setTimeout(r, 100));
  }
  await sub.unsubscribe();
  await psub.unsubscribe();
  assert.ok(got.length > 0, "no message reached the subscriber");
  assert.deepEqual(got[0], { channel, message: { hello: "world" } });
  assert.ok(pgot.length > 0, "no message reached the pattern subscriber");
  assert.equal(pgot[0].channel, channel);
  assert.deepEqual(pgot[0].message, { hello: "world" });
});

console.log(`\nconformance: ${passed} passed, ${failed} failed`);
process.exit(failed === 0 ? 0 : 1);
