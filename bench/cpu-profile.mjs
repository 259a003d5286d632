// CPU profile shares of one worker under load, for `cargo xtask bench`.
//
// node --experimental-websocket bench/cpu-profile.mjs INSPECTOR_HOST:PORT|- URL SECONDS CONNS [one]
//
// Connects to workerd's V8 inspector (`workerd serve --inspector-addr`), starts V8's sampling
// profiler (the same profiler as `--cpu-prof`), sends POST URL-with-a-fresh-subject from CONNS
// concurrent loops for SECONDS, stops, and prints one JSON line: requests sent, the isolate's
// busy time per request (µs), and the share of busy time whose own frame is
//   js:       JavaScript of the worker (the shell and wasm-bindgen glue, or a JS library),
//   builtins: the runtime's native functions called from JS (fetch, Response, arrayBuffer…),
//   wasm:     WebAssembly functions,
//   other:    V8/workerd work outside any JS frame ("(program)") and garbage collection.
// The load runs in this process, outside workerd, so its cost is not in the profile.
// With INSPECTOR "-" it only sends the load and prints {"requests": N} (no profiler running).
// With "one" every request names the same subject (a flood, or a hot limit).
const [inspector, url, seconds, conns, one] = process.argv.slice(2);

let sent = 0;
async function load() {
  const until = Date.now() + Number(seconds) * 1000;
  const loop = async (c) => {
    while (Date.now() < until) {
      const r = await fetch(one === "one" ? `${url}one` : `${url}p${c}-${sent % 1000}`, { method: "POST" });
      sent++;
      await r.arrayBuffer();
    }
  };
  await Promise.all(Array.from({ length: Number(conns) }, (_, c) => loop(c)));
}

if (inspector === "-") {
  await load();
  console.log(JSON.stringify({ requests: sent }));
  process.exit(0);
}

const list = await (await fetch(`http://${inspector}/json/list`)).json();
const target = list.find((t) => t.webSocketDebuggerUrl) ?? list[0];
const ws = new WebSocket(target.webSocketDebuggerUrl);
await new Promise((ok, fail) => {
  ws.onopen = ok;
  ws.onerror = fail;
});
let next = 1;
const waiting = new Map();
ws.onmessage = (m) => {
  const msg = JSON.parse(m.data);
  if (msg.id && waiting.has(msg.id)) {
    waiting.get(msg.id)(msg);
    waiting.delete(msg.id);
  }
};
const call = (method, params = {}) =>
  new Promise((ok) => {
    const id = next++;
    waiting.set(id, ok);
    ws.send(JSON.stringify({ id, method, params }));
  });

await call("Profiler.enable");
await call("Profiler.setSamplingInterval", { interval: 100 });
await call("Profiler.start");
await load();
const { result } = await call("Profiler.stop");
ws.close();

const { nodes, samples, timeDeltas } = result.profile;
const kind = new Map();
for (const n of nodes) {
  const { functionName: f, url: u } = n.callFrame;
  let k;
  if (f === "(idle)" || f === "(root)") k = "idle";
  else if (f === "(program)" || f === "(garbage collector)") k = "other";
  else if (u.startsWith("wasm://") || f.startsWith("$") || f.startsWith("wasm-function")) k = "wasm";
  else if (u === "") k = "builtins";
  else k = "js";
  kind.set(n.id, k);
}
// Each sample stands for the time since the one before it.
const count = { js: 0, builtins: 0, wasm: 0, other: 0, idle: 0 };
samples.forEach((id, i) => (count[kind.get(id) ?? "other"] += timeDeltas[i]));
const busy = count.js + count.builtins + count.wasm + count.other;
// The functions with the most self time (where to look next), by name, with their kind.
const self = new Map();
const byId = new Map(nodes.map((x) => [x.id, x]));
samples.forEach((id, i) => {
  const k = kind.get(id) ?? "other";
  if (k === "idle") return;
  const n = byId.get(id);
  const name = `${k}:${n ? n.callFrame.functionName || "(anonymous)" : "?"}`;
  self.set(name, (self.get(name) ?? 0) + timeDeltas[i]);
});
const share = (k) => Math.round((1000 * count[k]) / Math.max(busy, 1)) / 10;
console.log(
  JSON.stringify({
    requests: sent,
    cpu_us_per_request: Math.round(busy / Math.max(sent, 1)),
    js: share("js"),
    builtins: share("builtins"),
    wasm: share("wasm"),
    other: share("other"),
    top: [...self]
      .sort((a, b) => b[1] - a[1])
      .slice(0, 12)
      .map(([name, t]) => [name, Math.round((1000 * t) / Math.max(busy, 1)) / 10]),
  }),
);
