// An LLM gateway: before a chat completion goes upstream, redcount reserves its worst case
// (prompt tokens + max_tokens of the "tpm" quota, their price in micro-dollars of "usd-day",
// and a slot of the "in-flight" semaphore), all or nothing, in one call through the Service
// binding. A denied request is answered 429 and never reaches the upstream. The answer is
// streamed to the client as it comes; its last chunk's `usage` settles the reservation at the
// real token count and price (the difference given back, an overrun charged within the
// policy's max_debt). A client that goes away, or an upstream that fails before its usage,
// releases everything. Long streams renew the reservation's lease as they go.

import { type Binding, Redcount, RedcountError } from "@redcount/client";

interface Env {
  REDCOUNT: Binding;
  /** An OpenAI-style chat completions URL. */
  UPSTREAM_URL: string;
  /** Its bearer token, if it needs one (a secret). */
  UPSTREAM_KEY?: string;
  /** Micro-dollars per prompt token and per completion token (the worst-case price). */
  PRICE_PROMPT: string;
  PRICE_COMPLETION: string;
  /** How long a reservation lives without a heartbeat (default 30 s; at most in-flight's lease). */
  LEASE_MS?: string;
}

type Ctx = { waitUntil(promise: Promise<unknown>): void };

type Usage = { prompt_tokens: number; completion_tokens: number };

/** The most tokens a request may ask for. */
const MAX_TOKENS = 32_000;

/** A prompt's tokens, estimated from its characters (about 4 a token, plus each message's framing). */
export function promptTokens(messages: { content?: unknown }[]): number {
  return messages.reduce((n, m) => n + 4 + Math.ceil(String(m.content ?? "").length / 4), 0);
}

export default {
  async fetch(req: Request, env: Env, ctx: Ctx): Promise<Response> {
    if (req.method !== "POST") return json({ error: "POST a chat completion" }, 405);
    // Who pays: in a real gateway, the user of the API key the request carries.
    const user = req.headers.get("x-user") ?? "anonymous";
    const body = (await req.json().catch(() => null)) as { messages?: unknown; max_tokens?: unknown } | null;
    if (!body || !Array.isArray(body.messages)) return json({ error: "messages must be an array", field: "messages" }, 400);
    const maxTokens = body.max_tokens ?? 1024;
    if (!Number.isInteger(maxTokens) || (maxTokens as number) < 1 || (maxTokens as number) > MAX_TOKENS) {
      return json({ error: `max_tokens must be an integer from 1 to ${MAX_TOKENS}`, field: "max_tokens" }, 400);
    }
    const price = (u: Usage) =>
      u.prompt_tokens * Number(env.PRICE_PROMPT) + u.completion_tokens * Number(env.PRICE_COMPLETION);
    const worst = { prompt_tokens: promptTokens(body.messages), completion_tokens: maxTokens as number };
    const leaseMs = Number(env.LEASE_MS ?? 30_000);

    const redcount = new Redcount({ binding: env.REDCOUNT });
    const r = await redcount.reserve(user, {
      parts: [
        { policy: "tpm", units: worst.prompt_tokens + worst.completion_tokens },
        { policy: "usd-day", units: price(worst) },
        { policy: "in-flight", holder: crypto.randomUUID() },
      ],
      lease_ms: leaseMs,
    });
    if ("degraded" in r) return json({ error: "limits could not be checked" }, 503);
    if (!r.allowed || !r.reservation) {
      // Refused: 429 with Retry-After and the RateLimit headers, naming the policy that refused.
      const refused = { error: "rate limited", denied_by: r.denied_by, retry_after_ms: r.retry_after_ms };
      return json(refused, 429, r.headers);
    }
    const id = r.reservation;
    const release = () => redcount.releaseReservation(user, id);

    let upstream: Response;
    try {
      upstream = await fetch(env.UPSTREAM_URL, {
        method: "POST",
        headers: { "content-type": "application/json", ...(env.UPSTREAM_KEY ? { authorization: `Bearer ${env.UPSTREAM_KEY}` } : {}) },
        body: JSON.stringify({ ...body, stream: true, stream_options: { include_usage: true } }),
      });
    } catch {
      ctx.waitUntil(release());
      return json({ error: "the upstream could not be reached" }, 502);
    }
    if (!upstream.ok || !upstream.body) {
      ctx.waitUntil(release());
      return json({ error: `the upstream answered ${upstream.status}` }, 502);
    }

    // The answer goes to the client through a TransformStream; reading the upstream, and the
    // settle or release after it, go on past this return (waitUntil).
    const { readable, writable } = new TransformStream<Uint8Array, Uint8Array>();
    const heartbeat = setInterval(() => {
      redcount.extendReservation(user, id, { lease_ms: leaseMs }).catch(() => {});
    }, leaseMs / 3);
    ctx.waitUntil(
      relay(upstream.body, writable, req.signal, leaseMs)
        .then((usage) =>
          usage
            ? redcount.settle(user, id, {
                actual: [
                  { policy: "tpm", units: usage.prompt_tokens + usage.completion_tokens },
                  { policy: "usd-day", units: price(usage) },
                ],
              })
            : release(),
        )
        .catch((e) => console.error("settle or release failed:", e instanceof RedcountError ? e.body : e))
        .finally(() => clearInterval(heartbeat)),
    );
    return new Response(readable, { headers: { "content-type": "text/event-stream", "cache-control": "no-store" } });
  },
};

/**
 * Copies the upstream's server-sent events to `to` as they come, watching for the `usage`
 * field (OpenAI's last chunk has it): the usage, or `undefined` if the upstream failed or
 * the client went away before it came (the upstream is then cancelled). A client is gone
 * when the request's signal says so (`gone`), or when it read nothing for `ms`: the runtime
 * does not always tell, and a write to a client that stopped reading waits for good.
 */
async function relay(
  from: ReadableStream<Uint8Array>,
  to: WritableStream<Uint8Array>,
  gone: AbortSignal,
  ms: number,
): Promise<Usage | undefined> {
  const reader = from.getReader();
  const writer = to.getWriter();
  const away = new Promise<never>((_, reject) => {
    if (gone.aborted) reject(gone.reason);
    gone.addEventListener("abort", () => reject(gone.reason), { once: true });
  });
  away.catch(() => {});
  // One read or write: given up when the client goes or after `ms`.
  const step = async <T>(p: Promise<T>): Promise<T> => {
    let timer: ReturnType<typeof setTimeout> | undefined;
    const stalled = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error(`stalled for ${ms} ms`)), ms);
    });
    try {
      return await Promise.race([p, away, stalled]);
    } finally {
      clearTimeout(timer);
    }
  };
  const decoder = new TextDecoder();
  let usage: Usage | undefined;
  let line = "";
  try {
    for (;;) {
      const { done, value } = await step(reader.read());
      if (done) break;
      line += decoder.decode(value, { stream: true });
      const lines = line.split("\n");
      line = lines.pop() ?? "";
      for (const l of lines) usage = usageOf(l) ?? usage;
      await step(writer.write(value));
    }
    await step(writer.close());
  } catch (e) {
    // The upstream broke off, or the client did: stop both, waiting on neither. A usage
    // already seen was billed.
    reader.cancel(e).catch(() => {});
    writer.abort(e).catch(() => {});
  }
  return usage;
}

/** The `usage` of one `data: {...}` line, if it has one with both counts. */
function usageOf(line: string): Usage | undefined {
  if (!line.startsWith("data:")) return undefined;
  try {
    const u = JSON.parse(line.slice(5)).usage;
    if (Number.isInteger(u?.prompt_tokens) && Number.isInteger(u?.completion_tokens)) return u;
  } catch {}
  return undefined;
}

function json(body: unknown, status: number, headers?: Record<string, string>): Response {
  return new Response(JSON.stringify(body), { status, headers: { "content-type": "application/json", ...headers } });
}
