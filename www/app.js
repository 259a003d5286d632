// The redcount demo page. It talks to this worker's /api only and holds no secret.
const $ = (sel, root = document) => root.querySelector(sel);
const yuan = (cents) => `¥${(cents / 100).toFixed(2)}`;

async function api(method, path, body) {
  let res;
  try {
    res = await fetch(path, {
      method,
      headers: body === undefined ? {} : { "Content-Type": "application/json" },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch (e) {
    throw new Error(`network error: ${e.message}`);
  }
  let data = {};
  try { data = await res.json(); } catch { /* empty or non-JSON body */ }
  if (!res.ok) {
    const field = data.field ? ` (field: ${data.field})` : "";
    const err = new Error(`${res.status}: ${data.error || res.statusText}${field}`);
    err.status = res.status;
    throw err;
  }
  return data;
}

// Health
(async () => {
  const el = $("#health");
  try {
    await api("GET", "/api/health");
    el.textContent = "Redis reachable";
    el.dataset.ok = "true";
  } catch (e) {
    el.textContent = `Redis unreachable: ${e.message}`;
    el.dataset.ok = "false";
  }
})();

// Describe the panels from the server's own policies (the page never assumes limits).
const span = (ms) => ms % 86400000 === 0 ? `${ms / 86400000 === 1 ? "" : ms / 86400000 + " "}day${ms / 86400000 === 1 ? "" : "s"}`
  : ms % 3600000 === 0 ? `${ms / 3600000} h` : `${ms / 1000} s`;
function describe(p) {
  switch (p.kind) {
    case "quota": return p.algorithm === "bucket"
      ? `${p.capacity} tokens, ${p.refill} back every ${span(p.interval_ms)}`
      : p.algorithm === "gcra"
      ? `${p.rate} per user per ${span(p.period_ms)}, evenly spaced, bursts of ${p.burst} (GCRA)`
      : `${p.limit} per user per ${span(p.window_ms)} (${p.algorithm} window)`;
    case "claim": return `once per user per ${span(p.window_ms)}`;
    case "semaphore": return `${p.limit} holders at once, ${span(p.lease_ms)} leases`;
    case "counter": return `never below ${p.min}${p.max == null ? "" : `, never above ${p.max}`}`;
    default: return "";
  }
}
(async () => {
  try {
    const { policies } = await api("GET", "/api/policies");
    for (const el of document.querySelectorAll("[data-policy]")) {
      const p = policies[el.dataset.policy];
      if (!p) { el.textContent = `Policy ${el.dataset.policy} is not configured on this server.`; continue; }
      el.replaceChildren("Policy ", Object.assign(document.createElement("code"), { textContent: el.dataset.policy }), `: ${describe(p)}.`);
    }
    const rp = Object.values(policies).find((p) => p.kind === "redpackets");
    if (rp) {
      $("#count").max = rp.max_shares;
      $("#total").max = rp.max_total_cents / 100;
    }
  } catch (e) {
    message(`Could not read the policies: ${e.message}`);
  }
})();

// Red packet storm
const state = { id: null, total: 0, count: 0, won: 0, empty: 0, sum: 0, bars: [] };

function message(text, kind = "error") {
  const el = $("#packet-msg");
  el.textContent = text;
  el.dataset.kind = kind;
}

function renderStats(remaining) {
  $("#s-remaining").textContent = remaining ?? "–";
  $("#s-won").textContent = state.won;
  $("#s-empty").textContent = state.empty;
  $("#s-sum").textContent = `${yuan(state.sum)} / ${yuan(state.total)}`;
}

function renderChart() {
  const svg = $("#chart");
  const n = Math.max(state.count, 1);
  const max = Math.max(...state.bars.map((b) => b.amount), 1);
  svg.setAttribute("viewBox", `0 0 ${n * 10} 100`);
  svg.replaceChildren(...state.bars.map((b) => {
    const r = document.createElementNS("http://www.w3.org/2000/svg", "rect");
    const h = Math.max(2, (b.amount / max) * 96);
    r.setAttribute("x", (b.index - 1) * 10 + 1);
    r.setAttribute("y", 100 - h);
    r.setAttribute("width", 8);
    r.setAttribute("height", h);
    if (b.amount === max) r.setAttribute("class", "big");
    const t = document.createElementNS("http://www.w3.org/2000/svg", "title");
    t.textContent = `#${b.index} ${b.user}: ${yuan(b.amount)}`;
    r.append(t);
    return r;
  }));
}

function addClaim(user, amount, index) {
  const li = document.createElement("li");
  li.innerHTML = `<span>#${index} <span class="who"></span></span><span class="amt">${yuan(amount)}</span>`;
  $(".who", li).textContent = user;
  $("#claims").prepend(li);
}

$("#packet-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const total = Math.round(parseFloat($("#total").value) * 100);
  const count = parseInt($("#count").value, 10);
  if (!Number.isFinite(total) || total <= 0) return message("Total must be a positive amount.");
  if (!Number.isInteger(count) || count <= 0) return message("Shares must be a positive whole number.");
  $("#send").disabled = true;
  try {
    const p = await api("POST", "/api/redpackets", { total_cents: total, count });
    Object.assign(state, { id: p.id, total: p.total_cents, count: p.count, won: 0, empty: 0, sum: 0, bars: [] });
    $("#claims").replaceChildren();
    renderStats(p.count);
    renderChart();
    $("#verdict").dataset.state = "idle";
    $("#verdict").textContent = `Packet ${p.id.slice(0, 8)}… holds ${p.count} shares of ${yuan(p.total_cents)}.`;
    message(`Packet ready; it expires at ${new Date(p.expires_at_ms).toLocaleTimeString()}.`, "info");
    $("#storm").disabled = false;
  } catch (e) {
    message(`Could not create the packet: ${e.message}`);
  } finally {
    $("#send").disabled = false;
  }
});

$("#storm").addEventListener("click", async () => {
  const crowd = parseInt($("#crowd").value, 10);
  if (!state.id) return message("Send a packet first.");
  if (!Number.isInteger(crowd) || crowd < 1 || crowd > 1000) return message("The crowd is 1 to 1000 people.");
  $("#storm").disabled = true;
  $("#send").disabled = true;
  message(`${crowd} people grab at once…`, "info");
  const run = Math.random().toString(36).slice(2, 7);
  let errors = 0;
  await Promise.all(Array.from({ length: crowd }, async (_, i) => {
    const user = `guest-${run}-${i + 1}`;
    try {
      const g = await api("POST", `/api/redpackets/${state.id}/grab`, { user });
      if (g.outcome === "won") {
        state.won += 1;
        state.sum += g.amount_cents;
        state.bars.push({ index: g.index, amount: g.amount_cents, user });
        addClaim(user, g.amount_cents, g.index);
        renderChart();
        renderStats(g.remaining);
      } else if (g.outcome === "empty") {
        state.empty += 1;
        renderStats(0);
      }
    } catch (e) {
      errors += 1;
      message(`A grab failed: ${e.message}`);
    }
  }));
  try {
    const s = await api("GET", `/api/redpackets/${state.id}`);
    renderStats(s.remaining);
    const balanced = s.claimed_cents === state.sum && (s.remaining > 0 || s.claimed_cents === s.total_cents);
    const v = $("#verdict");
    v.dataset.state = balanced && errors === 0 ? "ok" : "bad";
    v.textContent = s.remaining === 0
      ? `${s.claimed} winners claimed ${yuan(s.claimed_cents)} of ${yuan(s.total_cents)}: ${s.claimed_cents === s.total_cents ? "the sum equals the total ✓" : "MISMATCH ✗"}`
      : `${s.claimed} winners claimed ${yuan(s.claimed_cents)}; ${s.remaining} shares are still waiting.`;
    v.dataset.sum = String(s.claimed_cents);
    v.dataset.total = String(s.total_cents);
    if (errors === 0) message(`${state.won} won, ${state.empty} came too late.`, "info");
  } catch (e) {
    message(`Could not read the packet: ${e.message}`);
  } finally {
    $("#send").disabled = false;
  }
});

// Compound decision under a crowd: every call asks for both quotas at once; the meters
// read each quota afterwards (a peek), so the page shows what each was really charged.
const DECIDE = ["calls-per-hour", "calls-per-minute"];

function meter(name, used, limit) {
  const row = document.createElement("div");
  row.className = "meter";
  row.dataset.policy = name;
  row.dataset.used = String(used);
  const label = Object.assign(document.createElement("code"), { textContent: name });
  const bar = Object.assign(document.createElement("div"), { className: "bar" });
  const fill = Object.assign(document.createElement("div"), { className: "fill" });
  fill.style.width = `${Math.min(100, (used / Math.max(limit, 1)) * 100)}%`;
  bar.append(fill);
  const num = Object.assign(document.createElement("span"), { className: "num", textContent: `${used} / ${limit} used` });
  row.append(label, bar, num);
  return row;
}

$("#decide-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const subject = $("#decide-subject").value.trim();
  const crowd = parseInt($("#decide-crowd").value, 10);
  const msg = $("#decide-msg");
  const say = (text, kind = "error") => { msg.textContent = text; msg.dataset.kind = kind; };
  if (!Number.isInteger(crowd) || crowd < 1 || crowd > 500) return say("The crowd is 1 to 500 calls.");
  $("#decide-go").disabled = true;
  say(`${crowd} calls decide at once…`, "info");
  const path = (p) => `/api/quotas/${p}/${encodeURIComponent(subject)}`;
  try {
    // Usage before, so a second crowd on the same team is counted from where it stood.
    const before = await Promise.all(DECIDE.map((p) => api("GET", path(p))));
    let admitted = 0, errors = 0;
    const deniedBy = {};
    await Promise.all(Array.from({ length: crowd }, async () => {
      try {
        const d = await api("POST", `/api/decisions/${encodeURIComponent(subject)}`, { parts: DECIDE.map((policy) => ({ policy })) });
        if (d.allowed) admitted += 1;
        else deniedBy[d.denied_by] = (deniedBy[d.denied_by] || 0) + 1;
      } catch (e) {
        errors += 1;
        say(`A call failed: ${e.message}`);
      }
      $("#d-admitted").textContent = admitted;
      $("#d-denied").textContent = Object.values(deniedBy).reduce((a, b) => a + b, 0);
    }));
    const after = await Promise.all(DECIDE.map((p) => api("GET", path(p))));
    const charged = after.map((q, i) => (before[i].remaining - q.remaining));
    $("#d-calls").textContent = crowd;
    $("#d-by").textContent = Object.entries(deniedBy).map(([p, n]) => `${p} ×${n}`).join(", ") || "none";
    $("#meters").replaceChildren(...after.map((q, i) => meter(DECIDE[i], q.limit - q.remaining, q.limit)));
    const exact = errors === 0 && charged.every((c) => c === admitted);
    const v = $("#decide-verdict");
    v.dataset.state = exact ? "ok" : "bad";
    v.dataset.admitted = String(admitted);
    v.dataset.charged = charged.join(",");
    v.textContent = exact
      ? `${admitted} admitted, and each policy was charged exactly ${admitted}: the ${crowd - admitted} denied calls cost nothing ✓`
      : `admitted ${admitted}, charged ${charged.join(" and ")}: MISMATCH ✗`;
    if (errors === 0) say(`${admitted} admitted, ${crowd - admitted} denied.`, "info");
  } catch (e) {
    say(`Could not decide: ${e.message}`);
  } finally {
    $("#decide-go").disabled = false;
  }
});

// Reserve, then settle: the estimate is held at once (tokens, 2 micro-dollars a token and an
// in-flight slot); the settle charges what was used. The meters read each quota (a peek).
const LLM = ["llm-tpm", "llm-usd-day"];
const USD_PER_TOKEN = 2;
let held = null;
let limits = [];

async function llmMeters(subject) {
  const qs = await Promise.all(LLM.map((p) => api("GET", `/api/quotas/${p}/${encodeURIComponent(subject)}`)));
  $("#r-meters").replaceChildren(...qs.map((q, i) => meter(LLM[i], q.limit - q.remaining, q.limit)));
  limits = qs.map((q) => q.limit);
  return qs.map((q) => q.limit - q.remaining);
}

async function reserveStep(kind) {
  const say = (text, k = "error") => { $("#r-msg").textContent = text; $("#r-msg").dataset.kind = k; };
  const v = $("#r-verdict");
  const buttons = ["#r-reserve", "#r-settle", "#r-release"].map((b) => $(b));
  buttons.forEach((b) => { b.disabled = true; });
  try {
    if (kind === "reserve") {
      const subject = $("#r-subject").value.trim();
      const tokens = parseInt($("#r-estimate").value, 10);
      const r = await api("POST", `/api/reservations/${encodeURIComponent(subject)}`, {
        parts: [{ policy: "llm-tpm", units: tokens }, { policy: "llm-usd-day", units: tokens * USD_PER_TOKEN },
          { policy: "llm-in-flight", holder: `page-${Date.now()}` }],
      });
      const used = await llmMeters(subject);
      if (!r.allowed) {
        v.dataset.state = "idle";
        v.textContent = `Refused by ${r.denied_by}: retry in ${secs(r.retry_after_ms)} (nothing was held)`;
        say("Refused.", "info");
        return;
      }
      held = { subject, id: r.reservation, tokens, used };
      $("#r-reserved").textContent = tokens;
      for (const id of ["#r-refunded", "#r-charged", "#r-debt"]) $(id).textContent = "–";
      v.dataset.state = "idle";
      v.textContent = `${tokens} tokens held until ${new Date(r.expires_ms).toLocaleTimeString()}: now settle what was used.`;
      say("Reserved.", "info");
    } else {
      const { subject, id, tokens, used } = held;
      const actual = parseInt($("#r-actual").value, 10);
      const body = kind === "settle"
        ? { actual: [{ policy: "llm-tpm", units: actual }, { policy: "llm-usd-day", units: actual * USD_PER_TOKEN }] } : {};
      const s = await api("POST", `/api/reservations/${encodeURIComponent(subject)}/${id}/${kind}`, body);
      held = null;
      const tpm = s.parts[0];
      const after = await llmMeters(subject);
      $("#r-refunded").textContent = tpm.refunded;
      $("#r-charged").textContent = tpm.charged;
      $("#r-debt").textContent = `${tpm.debt} / ${tpm.uncharged}`;
      // The meter must move exactly as the answer says (on a user nobody else is calling):
      // the refund back, the overrun charged (a meter shows no more than the limit).
      const exact = after[0] === Math.min(used[0] - tpm.refunded + tpm.charged, limits[0]);
      v.dataset.state = exact && (s.state === "settled" || s.state === "released") ? "ok" : "bad";
      Object.assign(v.dataset, { refunded: String(tpm.refunded), charged: String(tpm.charged), debt: String(tpm.debt),
        uncharged: String(tpm.uncharged), used: String(after[0]) });
      v.textContent = kind === "release"
        ? `Released: all ${tpm.refunded} tokens back, the slot freed ✓`
        : `Used ${actual} of ${tokens}: ${tpm.refunded} back, ${tpm.charged} charged over${tpm.uncharged ? `, ${tpm.uncharged} past max_debt not charged` : ""}; the meter went from ${used[0]} to ${after[0]} ${exact ? "✓" : "✗"}`;
      say(`${s.state}.`, "info");
    }
  } catch (e) {
    say(e.message);
  } finally {
    $("#r-reserve").disabled = false;
    $("#r-settle").disabled = $("#r-release").disabled = held === null;
  }
}
$("#reserve-form").addEventListener("submit", (ev) => { ev.preventDefault(); reserveStep("reserve"); });
$("#r-settle").addEventListener("click", () => reserveStep("settle"));
$("#r-release").addEventListener("click", () => reserveStep("release"));

// Small panels
function show(panel, ok, text) {
  const out = $(".out", panel);
  out.dataset.ok = String(ok);
  out.textContent = text;
}
const secs = (ms) => (ms == null ? "–" : ms >= 3600000 ? `${(ms / 3600000).toFixed(1)} h` : `${Math.ceil(ms / 1000)} s`);

const panels = {
  async quota(panel, subject) {
    const q = await api("POST", `/api/quotas/daily-prize/${encodeURIComponent(subject)}`, { cost: 1 });
    show(panel, q.allowed, `${q.allowed ? "Allowed" : "Denied"} · ${q.remaining}/${q.limit} left\nresets in ${secs(q.reset_ms)}`);
  },
  async claim(panel, subject) {
    const c = await api("POST", `/api/claims/signup-bonus/${encodeURIComponent(subject)}`);
    show(panel, c.claimed, `${c.claimed ? "Claimed!" : "Already claimed"}\nnext window in ${secs(c.retry_after_ms)}`);
  },
  async semaphore(panel, subject, btn) {
    const action = btn.dataset.action;
    const s = await api("POST", `/api/semaphores/device-slots/demo/${action}`, { holder: subject });
    show(panel, s.result !== "full" && s.result !== "not_holder", `${s.result.replace("_", " ")} · ${s.in_use}/${s.limit} in use${s.holding ? `\nlease ${secs(s.lease_ms)}` : ""}`);
  },
  async counter(panel, subject, btn) {
    const c = await api("POST", `/api/counters/running-jobs/${encodeURIComponent(subject)}`, { delta: parseInt(btn.dataset.delta, 10) });
    show(panel, c.status !== "rejected", `value ${c.value} · ${c.status}${c.status === "clamped" ? " (never below 0)" : ""}`);
  },
};

for (const panel of document.querySelectorAll("[data-panel]")) {
  for (const btn of panel.querySelectorAll(".go")) {
    btn.addEventListener("click", async () => {
      const subject = $(".subject", panel).value.trim();
      btn.disabled = true;
      try {
        await panels[panel.dataset.panel](panel, subject, btn);
      } catch (e) {
        show(panel, false, e.message);
      } finally {
        btn.disabled = false;
      }
    });
  }
}
