// The demo page in a real browser (Debian's Chromium, driven by playwright-core).
// Env: BASE_URL, ARTIFACTS (a directory for screenshots), CHROMIUM (executable path).
// Sends a packet, releases the crowd, and checks that the page shows the claimed sum
// equal to the total; takes a desktop and a phone-width screenshot. Exits 1 on failure.
import { chromium } from "playwright-core";
import { mkdirSync } from "node:fs";

const base = process.env.BASE_URL;
const artifacts = process.env.ARTIFACTS;
mkdirSync(artifacts, { recursive: true });
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
let failed = false;
const fail = (msg) => { failed = true; console.log(`not ok - ${msg}`); };
try {
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  const consoleErrors = [];
  // Failed loads are logged as console errors; the one deliberate 400 below is expected.
  page.on("console", (m) => {
    if (m.type() === "error" && !/Failed to load resource: .* 400/.test(m.text())) consoleErrors.push(m.text());
  });
  const requests = [];
  page.on("request", (r) => requests.push(r.url()));
  await page.goto(base + "/");
  await page.waitForSelector('#health[data-ok="true"]', { timeout: 30000 });
  await page.fill("#total", "123.45");
  await page.fill("#count", "25");
  await page.fill("#crowd", "80");
  await page.click("#send");
  await page.waitForSelector("#storm:not([disabled])", { timeout: 30000 });
  await page.click("#storm");
  await page.waitForSelector('#verdict[data-state="ok"], #verdict[data-state="bad"]', { timeout: 60000 });
  const verdict = await page.$eval("#verdict", (v) => ({ state: v.dataset.state, sum: v.dataset.sum, total: v.dataset.total, text: v.textContent }));
  console.log(`verdict: ${JSON.stringify(verdict)}`);
  if (verdict.state !== "ok") fail(`verdict is ${verdict.state}: ${verdict.text}`);
  if (verdict.sum !== "12345" || verdict.total !== "12345") fail(`sum ${verdict.sum} / total ${verdict.total}`);
  const won = await page.textContent("#s-won");
  const empty = await page.textContent("#s-empty");
  const bars = await page.$$eval("#chart rect", (r) => r.length);
  const claims = await page.$$eval("#claims li", (l) => l.length);
  console.log(`won=${won} empty=${empty} bars=${bars} claims=${claims}`);
  if (won !== "25" || empty !== "55" || bars !== 25 || claims !== 25) fail("winners, late comers, chart bars and claim list must be 25/55/25/25");
  await page.screenshot({ path: `${artifacts}/demo-desktop.png`, fullPage: true });

  // Compound decisions under a crowd: 30 calls of calls-per-hour AND calls-per-minute (10
  // a minute) admit 10, and each policy is charged exactly 10 (denied calls cost nothing).
  await page.fill("#decide-subject", `team-${Date.now()}`);
  await page.fill("#decide-crowd", "30");
  await page.click("#decide-go");
  await page.waitForSelector('#decide-verdict[data-state="ok"], #decide-verdict[data-state="bad"]', { timeout: 60000 });
  const decided = await page.$eval("#decide-verdict", (v) => ({ state: v.dataset.state, admitted: v.dataset.admitted, charged: v.dataset.charged, text: v.textContent }));
  console.log(`decisions: ${JSON.stringify(decided)}`);
  if (decided.state !== "ok" || decided.admitted !== "10" || decided.charged !== "10,10") fail(`decision panel: ${JSON.stringify(decided)}`);
  const meters = await page.$$eval("#meters .meter", (m) => m.map((x) => `${x.dataset.policy}=${x.dataset.used}`).join(" "));
  if (meters !== "calls-per-hour=10 calls-per-minute=10") fail(`meters: ${meters}`);
  const by = await page.textContent("#d-by");
  if (by !== "calls-per-minute ×20") fail(`denied by: ${by}`);
  await page.locator(".decide").screenshot({ path: `${artifacts}/demo-decisions.png` });

  // Reserve, then settle: 4,500 tokens held, 4,000 used, 500 back; then 3,000 held with 8,000
  // used (the most a public settle may report: max_cost): the overrun charged up to the
  // policy's max_debt (2,000 above its 8,000), the rest reported uncharged; the meter moves
  // exactly as each answer says.
  const user = `page-${Date.now()}`;
  const rounds = [
    { estimate: "4500", actual: "4000", want: { refunded: "500", charged: "0", debt: "0", uncharged: "0", used: "4000" } },
    { estimate: "3000", actual: "8000", want: { refunded: "0", charged: "3000", debt: "2000", uncharged: "2000", used: "8000" } },
  ];
  await page.fill("#r-subject", user);
  for (const { estimate, actual, want } of rounds) {
    await page.fill("#r-estimate", estimate);
    await page.fill("#r-actual", actual);
    await page.click("#r-reserve");
    await page.waitForSelector("#r-settle:not([disabled])", { timeout: 30000 });
    const reserved = await page.textContent("#r-reserved");
    if (reserved !== estimate) fail(`reserved ${reserved}, not ${estimate}`);
    await page.click("#r-settle");
    await page.waitForSelector('#r-verdict[data-state="ok"], #r-verdict[data-state="bad"]', { timeout: 30000 });
    const got = await page.$eval("#r-verdict", (v) => ({ ...v.dataset, text: v.textContent }));
    console.log(`reservation: ${JSON.stringify(got)}`);
    for (const [k, v] of Object.entries({ state: "ok", ...want })) {
      if (got[k] !== v) fail(`reservation panel: ${k} is ${got[k]}, not ${v}: ${got.text}`);
    }
    // Reset for the next round: the verdict is read again only once it changes.
    await page.$eval("#r-verdict", (v) => { v.dataset.state = "idle"; });
  }
  // In debt, the quota refuses the next reservation, and says so.
  await page.fill("#r-estimate", "1");
  await page.click("#r-reserve");
  await page.waitForFunction(() => /Refused by llm-tpm/.test(document.querySelector("#r-verdict").textContent));
  await page.locator(".reserve").screenshot({ path: `${artifacts}/demo-reservations.png` });

  // A small panel: the quota allows 2 a day, then denies, and says so.
  const quota = page.locator('[data-panel="quota"]');
  for (const want of ["true", "true", "false"]) {
    await quota.locator(".go").click();
    await page.waitForFunction((w) => document.querySelector('[data-panel="quota"] .out').dataset.ok === w
      && !document.querySelector('[data-panel="quota"] .go').disabled, want);
  }
  const denied = await quota.locator(".out").textContent();
  if (!/Denied · 0\/2 left/.test(denied)) fail(`quota panel says ${denied}`);
  // An error is shown, not swallowed (an id with a forbidden character).
  const claim = page.locator('[data-panel="claim"]');
  await claim.locator(".subject").fill("a:b");
  await claim.locator(".go").click();
  await page.waitForFunction(() => /400/.test(document.querySelector('[data-panel="claim"] .out').textContent));

  // Phone width: nothing overflows sideways.
  await page.setViewportSize({ width: 390, height: 844 });
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  if (overflow > 0) fail(`page overflows by ${overflow}px at phone width`);
  await page.screenshot({ path: `${artifacts}/demo-phone.png`, fullPage: true });

  if (consoleErrors.length) fail(`console errors: ${consoleErrors.join(" | ")}`);
  const foreign = requests.filter((u) => !u.startsWith(base));
  if (foreign.length) fail(`requests left the origin (no CDN allowed): ${foreign.join(", ")}`);
} catch (e) {
  fail(e.stack || String(e));
} finally {
  await browser.close();
}
console.log(failed ? "browser: 0 passed, 1 failed" : "browser: 1 passed, 0 failed");
process.exit(failed ? 1 : 0);
