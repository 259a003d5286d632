// Every method of the client once or more against a live redcount configured with the test
// suite's policies (tests/src/lib.rs TEST_POLICIES), with plain checks (it also runs inside a
// worker, where node:assert is not at hand). The same contract runs over HTTP (test/client.test.mjs,
// against `redcount serve`) and over the Service binding (examples/caller-worker under workerd):
// the same answers and the same typed error either way.
//
// `contract(lib, make, run)`: `lib` is the package as the caller imported it (its `Redcount` and
// `RedcountError`: the copy under test, not this repository's sources); `make(admin)` gives a
// client with the public or the admin rights; `run` makes the subjects fresh. Resolves to the
// number of calls made; rejects on the first mismatch.

function check(ok, what, got) {
  if (!ok) throw new Error(`${what}: got ${JSON.stringify(got)}`);
}

async function refusedBy(lib, call, status, field, what) {
  try {
    const got = await call();
    check(false, `${what}: expected a ${status} error`, got);
  } catch (e) {
    check(e instanceof lib.RedcountError, `${what}: a RedcountError`, String(e));
    check(e.status === status && e.field === field, `${what}: status ${status}, field ${field}`, {
      status: e.status,
      field: e.field,
      message: e.message,
    });
  }
}

export async function contract(lib, make, run) {
  const pub = make(false);
  const admin = make(true);
  check(pub instanceof lib.Redcount && admin instanceof lib.Redcount, "clients", null);
  const refused = (...args) => refusedBy(lib, ...args);
  let calls = 0;
  const c = (client) =>
    new Proxy(client, {
      get(target, name) {
        const f = target[name];
        return typeof f === "function" ? (...args) => (calls++, f.apply(target, args)) : f;
      },
    });
  const [p, a] = [c(pub), c(admin)];
  const s = (name) => `${name}-${run}`;

  const h = await p.health();
  check(h.ok === true, "health", h);
  const pol = await p.policies();
  check(pol.policies["daily-prize"].kind === "quota", "policies", pol);

  // Counters: bounded, a public step limit, the admin beyond it.
  check((await p.addCounter("running-jobs", s("c"), { delta: 1 })).value === 1, "addCounter", null);
  check((await p.getCounter("running-jobs", s("c"))).value === 1, "getCounter", null);
  await refused(() => p.addCounter("running-jobs", s("c"), { delta: 5 }), 403, "delta", "public step");
  check((await a.addCounter("running-jobs", s("c"), { delta: 5 })).value === 6, "admin step", null);
  // An Idempotency-Key: the retry answers what the first call answered, and says so.
  const first = await p.addCounter("running-jobs", s("i"), { delta: 1 }, { idempotencyKey: s("k") });
  const again = await p.addCounter("running-jobs", s("i"), { delta: 1 }, { idempotencyKey: s("k") });
  check(first.value === 1 && again.value === 1, "replayed value", [first, again]);
  check(again.headers?.["Idempotent-Replayed"] === "true", "replay marked", again);

  // A claim, once per window.
  check((await p.claim("signup-bonus", s("u"))).claimed === true, "claim", null);
  const claimed = await p.claim("signup-bonus", s("u"));
  check(claimed.claimed === false && claimed.retry_after_ms > 0, "claimed again", claimed);

  // A quota of 2 a day: two takes, a denial with its headers, a peek, an admin reset and refund.
  for (let i = 0; i < 2; i++) {
    const t = await p.take("daily-prize", s("q"), { cost: 1 });
    check(t.allowed === true && t.headers?.["RateLimit-Policy"] === '"daily-prize";q=2;w=86400', "take", t);
  }
  const denied = await p.take("daily-prize", s("q"));
  check(denied.allowed === false && Number(denied.headers?.["Retry-After"]) > 0, "denied", denied);
  check(denied.headers?.RateLimit?.startsWith('"daily-prize";r=0;'), "RateLimit", denied);
  check((await p.peek("daily-prize", s("q"), { cost: 1 })).remaining === 0, "peek", null);
  await refused(() => p.reset("daily-prize", s("q")), 401, undefined, "public reset");
  check((await a.reset("daily-prize", s("q"))).reset === true, "reset", null);
  check((await p.take("daily-prize", s("q"))).allowed === true, "after reset", null);
  check((await a.refund("daily-prize", s("q"), { cost: 1 })).refunded === 1, "refund", null);
  // A tenant's user named like an action of the quota routes (`refund`): that user's quota,
  // never the action on the tenant's own subject.
  check((await p.takeTenant("daily-prize", s("t"), "refund", { cost: 1 })).allowed === true, "takeTenant", null);
  check((await p.peekTenant("daily-prize", s("t"), "refund", { cost: 1 })).remaining === 1, "peekTenant", null);
  check((await p.peek("daily-prize", s("t"), { cost: 1 })).remaining === 2, "the tenant's subject untouched", null);
  check((await a.resetTenant("daily-prize", s("t"), "refund")).reset === true, "resetTenant", null);
  check((await p.peekTenant("daily-prize", s("t"), "refund", { cost: 1 })).remaining === 2, "after resetTenant", null);
  const o = await a.setOverride("daily-prize", s("q"), { limit: 5, ttl_ms: 60000 });
  check(o.limit === 5 && o.replaced === false, "setOverride", o);
  check((await a.clearOverride("daily-prize", s("q"))).cleared === true, "clearOverride", null);

  // Bad input: the field named, nothing sent.
  await refused(() => p.take("daily-prize", s("q"), { cost: "x" }), 400, "cost", "cost x");
  await refused(() => p.take("daily-prize", s("q"), { cost: 0 }), 400, "cost", "cost 0");
  await refused(() => p.take("daily-prize", 7), 400, "subject", "subject 7");
  await refused(() => p.take("daily-prize", "a:b"), 400, "subject", "subject a:b");
  await refused(() => p.take("no-such-policy", s("q")), 404, "policy", "no policy");
  await refused(() => p.take("daily-prize", s("q"), { cost: 1, extra: 1 }), 400, "extra", "unknown field");

  // A compound decision and a semaphore's lease life.
  const d = await p.decide(s("d"), { parts: [{ policy: "burst" }, { policy: "device-slots", holder: "h1" }] });
  check(d.allowed === true && d.parts[1].fencing_token > 0, "decide", d);
  const got = await p.acquire("device-slots", s("sem"), { holder: "h1" });
  check(got.result === "acquired" && got.holding, "acquire", got);
  check((await p.renew("device-slots", s("sem"), { holder: "h1" })).result === "renewed", "renew", null);
  const held = await p.check("device-slots", s("sem"), { holder: "h1", fencing_token: got.fencing_token });
  check(held.result === "held", "check", held);
  check((await p.release("device-slots", s("sem"), { holder: "h1" })).result === "released", "release", null);

  // The inbox (admin-only under this policy).
  await refused(() => p.appendInbox(s("ib"), { id: 1, body: "hi" }), 401, undefined, "public inbox");
  check((await a.appendInbox(s("ib"), { id: 1, body: "hi ✓" })).stored === true, "appendInbox", null);
  const read = await a.readInbox(s("ib"), { after: 0, limit: 10 });
  check(read.messages.length === 1 && read.messages[0].body === "hi ✓", "readInbox", read);
  check((await a.trimInbox(s("ib"))).deleted === 0, "trimInbox", null);

  // A red packet.
  const made = await p.createPacket({ total_cents: 300, count: 3 });
  check(typeof made.id === "string" && made.count === 3, "createPacket", made);
  const won = await p.grab(made.id, { user: s("g") });
  check(won.outcome === "won" && won.amount_cents > 0, "grab", won);
  check((await p.packetStatus(made.id)).claimed === 1, "packetStatus", null);
  const grabs = await p.packetGrabs(made.id, { offset: 0, limit: 10 });
  check(grabs.claims[0].user === s("g"), "packetGrabs", grabs);
  await refused(() => p.grab("0123456789abcdef", { user: "u" }), 404, "id", "no packet");
  await refused(() => p.createPacket({ total_cents: 300, count: 501 }), 403, "count", "beyond public");
  return calls;
}
