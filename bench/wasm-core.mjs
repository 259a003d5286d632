// The worker's wasm half on its own, in V8 (Node's, the engine workerd embeds): µs per quota
// take for handle() + receive(), the REST round trip answered in memory. No runtime, no I/O:
// only what the core and the shell's buffer copies cost, so builds can be compared side by side.
//
// node bench/wasm-core.mjs BUILD_DIR [BUILD_DIR ...]
//
// Each BUILD_DIR is what `cargo xtask build-worker` leaves in crates/redcount-worker/build/
// (copy one away before building another). The builds are warmed up, then take turns for
// ROUNDS rounds of N requests each; every round's figure is printed.
import fs from "node:fs";
import path from "node:path";

const N = 200_000;
const ROUNDS = 5;
const utf8 = new TextEncoder();
const text = new TextDecoder();
const POLICIES = '{"bench-quota":{"kind":"quota","algorithm":"fixed","limit":500,"window_ms":3600000}}';

async function load(dir) {
  const glue = await import(path.resolve(dir, "redcount_worker.js"));
  const bytes = fs.readFileSync(path.resolve(dir, "redcount_worker_bg.wasm"));
  const { memory } = glue.initSync({ module: new WebAssembly.Module(bytes) });
  // As shell.js does: the input written into the module's buffer, the output read in place.
  const put = (str, extra = new Uint8Array(0)) => {
    const room = str.length * 3 + extra.length;
    const at = glue.input(room); // first: it may grow the memory, detaching the old buffer
    const view = new Uint8Array(memory.buffer, at, room);
    const { written } = utf8.encodeInto(str, view);
    view.set(extra, written);
    return written;
  };
  const output = (at) => {
    const m = new Uint8Array(memory.buffer);
    return m.subarray(at + 4, at + 4 + ((m[at] | (m[at + 1] << 8) | (m[at + 2] << 16) | (m[at + 3] << 24)) >>> 0));
  };
  const vars = ["REDCOUNT_POLICIES", POLICIES, "REDCOUNT_REST_URL", "http://127.0.0.1:1",
    "REDCOUNT_REST_TOKEN", "r".repeat(40), "REDCOUNT_ADMIN_TOKEN", "a".repeat(40)].join("\0");
  const problem = text.decode(output(glue.configure(put(vars))));
  if (problem) throw new Error(`${dir}: ${problem}`);
  const reply = utf8.encode('{"result":[1,500,499,3599000,0]}');
  // One request: POST without a body, then the front's answer to its EVALSHA.
  return (i) => {
    let step = output(glue.handle(put(`POST\0http://w/api/quotas/bench-quota/s${i % 1000}\0-\0-\0-\0+0\0-`), 0));
    if (step[0] !== 1) throw new Error(`${dir}: expected a REST call, got ${text.decode(step)}`);
    const id = (step[1] | (step[2] << 8) | (step[3] << 16) | (step[4] << 24)) >>> 0;
    const sent = step.length;
    put("", reply);
    step = output(glue.receive(id, 200, reply.length));
    if (step[0] !== 0 || (step[1] | (step[2] << 8)) !== 200) throw new Error(`${dir}: expected a 200`);
    return sent + step.length;
  };
}

const dirs = process.argv.slice(2);
if (dirs.length === 0) {
  console.error("usage: node bench/wasm-core.mjs BUILD_DIR [BUILD_DIR ...]");
  process.exit(2);
}
const builds = [];
for (const d of dirs) builds.push({ dir: d, one: await load(d), runs: [] });
for (const b of builds) for (let i = 0; i < 20_000; i++) b.one(i);
let sink = 0; // summed so the work cannot be optimised away
for (let r = 0; r < ROUNDS; r++) {
  for (const b of builds) {
    const t = process.hrtime.bigint();
    for (let i = 0; i < N; i++) sink += b.one(i);
    b.runs.push(Number(process.hrtime.bigint() - t) / N / 1000);
  }
}
for (const b of builds) {
  const sorted = [...b.runs].sort((x, y) => x - y);
  console.log(`${b.dir}: median ${sorted[sorted.length >> 1].toFixed(2)} µs per quota take (${b.runs.map((x) => x.toFixed(2)).join(", ")})`);
}
if (sink === 0) console.error("no bytes came back");
