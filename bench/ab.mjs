// A/B rounds of workerd configs under load, for by-hand comparisons of worker bundles.
//
// node bench/ab.mjs SECONDS ROUNDS CONNS LABEL=CONFIG@SOCKET:PATH[:one] ...
//
// Each round serves every variant in turn (the order turning each round) with
// `workerd serve CONFIG --socket-addr=SOCKET=127.0.0.1:<free port>`, warms it with 200 POSTs
// of the load's own URL, then sends `bench/cpu-profile.mjs -` (outside workerd: its CPU is not
// counted) for SECONDS with CONNS loops, and reads workerd's CPU (user + system, every thread)
// from /proc before and after. Prints each run, then per variant the CPU per request of every
// round and each round's ratio to the first variant: on a shared machine the CPU per request
// moves between rounds, so compare within a round.
import { spawn, execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { createServer } from "node:net";
import { fileURLToPath } from "node:url";
import { dirname, join } from "node:path";

const here = dirname(fileURLToPath(import.meta.url));
const workerd = join(here, "../node_modules/@cloudflare/workerd-linux-64/bin/workerd");
const [seconds, rounds, conns, ...specs] = process.argv.slice(2);
const variants = specs.map((s) => {
  const [label, rest] = s.split(/=(.*)/s);
  const [config, target] = rest.split("@");
  const [socket, path, one] = target.split(":");
  return { label, config, socket, path, one: one === "one" };
});
const hz = Number(execFileSync("getconf", ["CLK_TCK"]).toString().trim()) || 100;
const cpu = (pid) => {
  const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  const f = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  return ((Number(f[11]) + Number(f[12])) * 1e6) / hz;
};
const freePort = () =>
  new Promise((ok) => {
    const s = createServer().listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => ok(port));
    });
  });
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function run(v) {
  const port = await freePort();
  const child = spawn(workerd, ["serve", v.config, `--socket-addr=${v.socket}=127.0.0.1:${port}`], {
    stdio: ["ignore", "ignore", "ignore"],
  });
  const url = `http://127.0.0.1:${port}${v.path}`;
  const target = v.one ? `${url}one` : `${url}warm`;
  for (let i = 0; ; i++) {
    try {
      await (await fetch(target, { method: "POST" })).arrayBuffer();
      break;
    } catch {
      if (i > 300) throw new Error(`workerd for ${v.label} did not answer`);
      await sleep(100);
    }
  }
  // (AB_WARM_BODY: the warm-up sends `{}` as xtask's does.)
  const warm = process.env.AB_WARM_BODY ? { method: "POST", body: "{}" } : { method: "POST" };
  for (let i = 0; i < 200; i++) await (await fetch(v.one ? target : `${url}warm${i}`, warm)).arrayBuffer();
  const before = cpu(child.pid);
  const out = execFileSync("node", [join(here, "cpu-profile.mjs"), "-", url, seconds, conns, ...(v.one ? ["one"] : [])]);
  const after = cpu(child.pid);
  child.kill("SIGTERM");
  await new Promise((r) => child.once("exit", r));
  const { requests } = JSON.parse(out.toString());
  return { rps: requests / Number(seconds), us: (after - before) / requests };
}

const results = variants.map(() => []);
for (let r = 0; r < Number(rounds); r++) {
  for (let k = 0; k < variants.length; k++) {
    const i = (k + r) % variants.length;
    const x = await run(variants[i]);
    results[i].push(x);
    console.log(`round ${r + 1} ${variants[i].label}: ${x.rps.toFixed(0)} req/s, ${x.us.toFixed(1)} µs CPU/request`);
  }
}
const median = (a) => {
  const s = [...a].sort((x, y) => x - y);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};
console.log("\nvariant | CPU µs/request each round | median | ratio to first each round | median ratio | req/s median");
variants.forEach((v, i) => {
  const us = results[i].map((x) => x.us);
  const ratio = us.map((u, r) => u / results[0][r].us);
  console.log(
    `${v.label} | ${us.map((u) => u.toFixed(0)).join(", ")} | ${median(us).toFixed(1)} | ${ratio.map((x) => x.toFixed(2)).join(", ")} | ${median(ratio).toFixed(3)} | ${median(results[i].map((x) => x.rps)).toFixed(0)}`,
  );
});
