// Settle dashboard: a client of the public HTTP API (/v1/…), nothing private.
// Pages by hash route (#/overview, #/entities?…, #/entity/M/K, #/parked, #/operations,
// #/operation/ID, #/machines, #/machine/M). Each page renders its frame once and draws
// again what changed when the change feed (GET /v1/feed) says something it shows did;
// while the feed is down it polls every 1.5 s. The bearer token lives in sessionStorage
// only.
"use strict";

const REFRESH_MS = 1500;
const TOKEN_KEY = "settle.token";
const $ = (sel, root = document) => root.querySelector(sel);

// ---- text and time -------------------------------------------------------------

function esc(v) {
  return String(v ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}
function enc(v) { return encodeURIComponent(v); }
function pad(n, w = 2) { return String(n).padStart(w, "0"); }
/** A time in the browser's zone, with that zone's offset from UTC ("… 10:15:02.120 +01:00"). */
function fmtTime(ms) {
  if (ms == null) return "–";
  const d = new Date(ms);
  const off = -d.getTimezoneOffset();
  const zone = `${off < 0 ? "-" : "+"}${pad(Math.floor(Math.abs(off) / 60))}:${pad(Math.abs(off) % 60)}`;
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)} ${zone}`;
}
function ago(ms, now = Date.now()) {
  if (ms == null) return "–";
  let s = Math.round((now - ms) / 1000);
  const future = s < 0; s = Math.abs(s);
  const t = s < 60 ? `${s}s` : s < 3600 ? `${Math.floor(s / 60)}m` : s < 86400 ? `${Math.floor(s / 3600)}h` : `${Math.floor(s / 86400)}d`;
  return future ? `in ${t}` : `${t} ago`;
}
function stateCell(e) {
  return e.health === "error" ? `<span class="health-error" title="declared health = error: failing">${esc(e.state)}</span>` : esc(e.state);
}
function statusCell(st) { return `<span class="status-${esc(st)}">${esc(st)}</span>`; }
function entityHref(machine, key) { return `#/entity/${enc(machine)}/${enc(key)}`; }
function entityLink(e) { return `<a href="${entityHref(e.machine, e.key)}" class="wrap">${esc(e.key)}</a>`; }
function opLink(id) { return id ? `<a href="#/operation/${enc(id)}" class="mono wrap">${esc(id)}</a>` : "–"; }
function requestId() {
  const b = new Uint8Array(8);
  crypto.getRandomValues(b);
  return "ui-" + Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
}

// ---- the API -------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, problem) {
    super(problem?.detail || problem?.title || `HTTP ${status}`);
    this.status = status;
    this.problem = problem;
  }
}

async function api(path, { method = "GET", body, headers = {}, text = false } = {}) {
  const h = { Accept: text ? "*/*" : "application/json", ...headers };
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) h.Authorization = `Bearer ${token}`;
  // Every request that can change something says JSON, even without a body: the server
  // refuses a POST without it (a request a page of another site could send unasked).
  if (body !== undefined || method !== "GET") h["Content-Type"] = "application/json";
  const r = await fetch(path, { method, headers: h, body: body === undefined ? undefined : JSON.stringify(body) });
  if (!r.ok) {
    let problem = null;
    try { problem = await r.json(); } catch (_) { /* not JSON */ }
    if (r.status === 401 && app.session) signOut(`Signed out: ${problem?.detail || "the server no longer accepts this token"}`);
    throw new ApiError(r.status, problem);
  }
  return text ? r.text() : r.json();
}

// ---- session -------------------------------------------------------------------

const app = { session: null, page: null, timer: null, busy: false, machines: null, svg: new Map() };

async function boot() {
  $("#signin-form").addEventListener("submit", (ev) => { ev.preventDefault(); signIn(); });
  $("#signout").addEventListener("click", () => signOut(""));
  $("#confirm-cancel").addEventListener("click", () => $("#confirm").close("cancel"));
  $("#confirm-ok").addEventListener("click", () => $("#confirm").close("ok"));
  window.addEventListener("hashchange", route);
  await start();
}

async function start() {
  let session;
  try {
    session = await api("/v1/session");
  } catch (e) {
    showSignIn(explain(e));
    return;
  }
  if (!session.signed_in) {
    app.session = null;
    const presented = sessionStorage.getItem(TOKEN_KEY);
    sessionStorage.removeItem(TOKEN_KEY);
    showSignIn(presented ? `The server does not accept this token: ${session.reason}. Check it and try again.` : "");
    return;
  }
  app.session = session;
  $("#signin").hidden = true;
  $("#main").hidden = false;
  $("#nav").hidden = false;
  $("#who").hidden = false;
  $("#role").textContent = session.name ? `${session.name} · ${session.role}` : session.role;
  $("#signout").hidden = session.open;
  if (!location.hash || location.hash === "#" || location.hash === "#/") location.hash = "#/overview";
  else route();
}

function explain(e) {
  if (e instanceof ApiError) {
    if (e.status === 401) return `The server does not accept this token (401: ${e.message}). Check it and try again.`;
    if (e.status === 429) return `Not now (429: ${e.message}).`;
    if (e.status === 403) return `This token may not read the API (403: ${e.message}). The dashboard needs a reader, operator or admin token.`;
    return `The server answered ${e.status}: ${e.message}`;
  }
  return `Cannot reach the server: ${e.message}`;
}

function showSignIn(message) {
  stopTimer();
  unfollow();
  $("#main").hidden = true;
  $("#nav").hidden = true;
  $("#who").hidden = true;
  $("#signin").hidden = false;
  $("#signin-error").textContent = message || "";
  $("#token").focus();
}

async function signIn() {
  const token = $("#token").value.trim();
  if (!token) return;
  sessionStorage.setItem(TOKEN_KEY, token);
  $("#token").value = "";
  await start();
}

function signOut(message) {
  sessionStorage.removeItem(TOKEN_KEY);
  app.session = null;
  app.page = null;
  if (soon.t) { clearTimeout(soon.t); soon.t = null; }
  showSignIn(message);
}

function canWrite() { return !!app.session?.can_write; }

// ---- routing and refresh -------------------------------------------------------

const PAGES = { overview, entities, entity, parked, operations, operation, machines, machine };

function parseHash() {
  const raw = location.hash.replace(/^#\/?/, "");
  const [path, query = ""] = raw.split("?");
  const parts = path.split("/").map(decodeURIComponent);
  return { name: parts[0] || "overview", args: parts.slice(1), query: new URLSearchParams(query) };
}

function route() {
  if (!app.session) return;
  const r = parseHash();
  const make = PAGES[r.name];
  for (const a of document.querySelectorAll("#nav a")) {
    const current = a.dataset.page === r.name || (r.name === "entity" && a.dataset.page === "entities")
      || (r.name === "operation" && a.dataset.page === "operations") || (r.name === "machine" && a.dataset.page === "machines");
    if (current) a.setAttribute("aria-current", "page"); else a.removeAttribute("aria-current");
  }
  stopTimer();
  const main = $("#main");
  if (!make) { main.innerHTML = `<h1>Not found</h1><p>No page <code>${esc(r.name)}</code>. <a href="#/overview">Overview</a></p>`; return; }
  main.innerHTML = "";
  app.page = make(main, r);
  document.title = `Settle · ${app.page.title || r.name}`;
  tick();
  follow(app.page.feed ?? "coalesce=true");
}

function startTimer() { if (!app.timer) app.timer = setInterval(tick, REFRESH_MS); }
function stopTimer() { if (app.timer) clearInterval(app.timer); app.timer = null; }

async function tick() {
  const page = app.page;
  // Signed out: nothing to draw (a change heard just before must not ask without a token).
  if (!page || !app.session || document.hidden || $("#confirm").open) return;
  // A change heard while drawing: draw again after.
  if (app.busy) { app.again = true; return; }
  app.busy = true;
  try {
    await page.refresh();
    app.refreshed = (app.refreshed || 0) + 1;
    $("#live").classList.remove("stale");
    $("#live").textContent = "live";
    $("#live").title = `${feed.connected ? "following the change feed" : "polling every 1.5 s"} · updated ${fmtTime(Date.now())}`;
    // A read that failed while the feed was up started the poll: the feed carries on.
    if (feed.connected) stopTimer();
  } catch (e) {
    $("#live").classList.add("stale");
    // What is not there will not come by asking again: the page stops following (another
    // page starts again).
    const gone = e instanceof ApiError && e.status === 404;
    $("#live").textContent = gone ? "not found · stopped" : "offline";
    // Anything else (a dropped connection, a 5xx) may pass: ask again every 1.5 s until a
    // read succeeds, also while the feed is connected (a quiet feed would leave the page
    // "offline" until the next change).
    if (gone) { stopTimer(); unfollow(); } else startTimer();
    if (page.error) page.error(e);
  } finally {
    app.busy = false;
    // (Also when the page changed meanwhile: the new one was not drawn yet.)
    if (app.again) { app.again = false; soon(); }
  }
}

// ---- the change feed -------------------------------------------------------------
// One stream at a time, of what the page shows (`page.feed`: the query of GET /v1/feed;
// by default a count per read of every change). Read with fetch, which sends the token
// (EventSource cannot); each change draws the page again (at most every 150 ms); the
// stream reconnects with the last id it saw, and the page polls while it is down.

const feed = { ctrl: null, query: null, last: null, changes: 0, connected: false };

function soon() {
  if (!soon.t) soon.t = setTimeout(() => { soon.t = null; tick(); }, 150);
}

function unfollow() {
  if (feed.ctrl) feed.ctrl.abort();
  Object.assign(feed, { ctrl: null, query: null, last: null, connected: false });
}

function follow(query) {
  if (feed.ctrl && feed.query === query) return;
  unfollow();
  const ctrl = new AbortController();
  Object.assign(feed, { ctrl, query });
  (async () => {
    while (!ctrl.signal.aborted) {
      try {
        const h = { Accept: "text/event-stream" };
        const token = sessionStorage.getItem(TOKEN_KEY);
        if (token) h.Authorization = `Bearer ${token}`;
        if (feed.last) h["Last-Event-ID"] = feed.last;
        const r = await fetch(`/v1/feed${query ? `?${query}` : ""}`, { headers: h, signal: ctrl.signal });
        if (!r.ok) throw new ApiError(r.status, null);
        feed.connected = true;
        stopTimer();
        // What changed before the stream opened.
        soon();
        const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
        let buf = "";
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buf += value;
          for (let i = buf.indexOf("\n\n"); i >= 0; i = buf.indexOf("\n\n")) {
            const block = buf.slice(0, i);
            buf = buf.slice(i + 2);
            let data = "";
            for (const line of block.split("\n")) {
              if (line.startsWith("id:")) feed.last = line.slice(3).trim();
              else if (line.startsWith("data:")) data += line.slice(5).trim();
            }
            if (data) { feed.changes++; soon(); }
          }
        }
      } catch (_) { /* aborted, or the server went away: below */ }
      if (ctrl.signal.aborted) return;
      feed.connected = false;
      startTimer();
      await new Promise((res) => setTimeout(res, 3000));
    }
  })();
}

function flash(html) {
  const f = $("#flash");
  f.innerHTML = html;
  clearTimeout(flash.t);
  flash.t = setTimeout(() => { f.innerHTML = ""; }, 8000);
}

async function servedMachines() {
  if (!app.machines) app.machines = (await api("/v1/machines")).items;
  return app.machines;
}

// ---- confirmation and commands ---------------------------------------------------

/** Asks to confirm; a destructive action's dialog opens with Cancel focused, so Enter
 * does not do what cannot be undone. */
function confirmAction(title, text, extraHtml = "", destructive = false) {
  const d = $("#confirm");
  $("#confirm-title").textContent = title;
  $("#confirm-text").textContent = text;
  $("#confirm-extra").innerHTML = extraHtml;
  d.returnValue = "";
  d.showModal();
  const first = extraHtml ? $("#confirm-extra input, #confirm-extra select, #confirm-extra textarea") : $("#confirm-ok");
  (destructive ? $("#confirm-cancel") : first)?.focus();
  return new Promise((resolve) => {
    d.addEventListener("close", () => resolve(d.returnValue === "ok"), { once: true });
  });
}

const COMMANDS = {
  pause: "Pause: the entity stops taking work until resumed.",
  resume: "Resume: the entity runs again (a parked entity retries its state).",
  kill: "Kill: the entity stops for good. This cannot be undone.",
  retry: "Retry: the entity re-runs its current state's action now.",
  release: "Release: the engine holding its lease lets go (use when that engine is gone).",
  sleep: "Sleep: the entity waits until the given time, then runs again.",
};

async function command(e, cmd, done) {
  let body;
  let extra = "";
  if (cmd === "sleep") extra = `<label for="sleep-until">Until (+duration or RFC 3339 UTC)</label><input id="sleep-until" value="+10m">`;
  // The reason travels with the command: kept with its operation and in the history.
  extra += `<label for="cmd-reason">Reason (kept with the operation and in the history)</label><input id="cmd-reason">`;
  const ok = await confirmAction(`${cmd[0].toUpperCase()}${cmd.slice(1)} ${e.machine}/${e.key}?`, COMMANDS[cmd], extra, cmd === "kill");
  if (!ok) return;
  if (cmd === "sleep") body = { until: $("#sleep-until").value.trim() };
  const reason = $("#cmd-reason").value.trim();
  const id = requestId();
  try {
    const q = reason ? `?reason=${enc(reason)}` : "";
    const r = await api(`/v1/machines/${enc(e.machine)}/entities/${enc(e.key)}/${cmd}${q}`, { method: "POST", body, headers: { "Idempotency-Key": id } });
    flash(`${esc(cmd)} ${esc(e.key)}: now <strong>${esc(r.run_status)}</strong> · operation ${opLink(id)}`);
  } catch (err) {
    flash(`<span>${esc(cmd)} ${esc(e.key)} failed: ${esc(err.message)}</span>`);
  }
  if (done) await done();
}

function commandButtons(e, which) {
  if (!canWrite()) return "";
  return which.map((c) => `<button type="button" class="${c === "kill" ? "danger" : "secondary"}" data-cmd="${c}" data-machine="${esc(e.machine)}" data-key="${esc(e.key)}">${c[0].toUpperCase()}${c.slice(1)}</button>`).join(" ");
}

function wireCommands(root, done) {
  root.addEventListener("click", (ev) => {
    const b = ev.target.closest("button[data-cmd]");
    if (!b) return;
    command({ machine: b.dataset.machine, key: b.dataset.key }, b.dataset.cmd, done);
  });
}

// ---- overview --------------------------------------------------------------------

function overview(main) {
  main.innerHTML = `<h1>Overview</h1>
    <div class="cards" id="cards"></div>
    <h2>Transitions and errors per minute, last hour</h2>
    <div class="panel chart" id="chart"></div>
    <div class="grid2">
      <div><h2>Entities by machine, state and run status</h2><div class="scroll" id="counts"></div></div>
      <div><h2>Operations by outcome</h2><div id="ops"></div><h2>Open agent tasks</h2><div id="tasks"></div></div>
    </div>`;
  return {
    title: "Overview",
    async refresh() {
      const o = await api("/v1/overview?window=1h");
      const last = o.minutes.slice(-2, -1)[0] || { transitions: 0, errors: 0 };
      const hour = o.minutes.reduce((a, m) => ({ t: a.t + m.transitions, e: a.e + m.errors }), { t: 0, e: 0 });
      const rate = hour.t ? (100 * hour.e / hour.t).toFixed(1) : "0.0";
      // Each card opens the list it counts.
      $("#cards").innerHTML = [
        ["entities", o.entities, "Entities", "", "#/entities"],
        ["failing", o.failing, "Failing (in an error-health state)", o.failing ? "bad" : "", "#/entities?health=error"],
        ["parked", o.parked, "Parked (failed or fault)", o.parked ? "bad" : "", "#/parked"],
        ["due", o.due_backlog, "Due backlog", "", "#/entities?status=active"],
        ["tps", (last.transitions / 60).toFixed(1), "Transitions/s (last full minute)", "", "#/operations"],
        ["errors", `${rate}%`, "Error rate, last hour", hour.e ? "bad" : "", "#/operations?outcome=failed"],
      ].map(([id, n, l, cls, href]) => `<a class="card ${cls}" data-card="${id}" href="${href}"><div class="n">${esc(n)}</div><div class="l">${esc(l)}</div></a>`).join("");
      $("#chart").innerHTML = chart(o.minutes);
      $("#counts").innerHTML = `<table id="counts-table"><thead><tr><th>Machine</th><th>State</th><th>Run status</th><th class="num">Entities</th></tr></thead><tbody>${
        o.counts.length ? o.counts.map((c) => `<tr data-machine="${esc(c.machine)}" data-state="${esc(c.state)}" data-status="${esc(c.run_status)}" data-health="${esc(c.health)}">
          <td>${esc(c.machine)}</td><td><a href="#/entities?machine=${enc(c.machine)}&state=${enc(c.state)}&status=${enc(c.run_status)}" class="health-${esc(c.health)}">${esc(c.path)}</a>${c.health === "error" ? ` <span class="badge bad">failing</span>` : ""}</td>
          <td>${statusCell(c.run_status)}</td><td class="num">${c.count}</td></tr>`).join("")
          : `<tr class="empty"><td colspan="4">no entities yet</td></tr>`}</tbody></table>`;
      $("#ops").innerHTML = `<table><thead><tr><th>Outcome</th><th class="num">Operations</th></tr></thead><tbody>${
        o.operations.length ? o.operations.map((c) => `<tr><td><a href="#/operations?outcome=${enc(c.outcome)}" class="outcome-${esc(c.outcome)}">${esc(c.outcome)}</a></td><td class="num">${c.count}</td></tr>`).join("")
          : `<tr class="empty"><td colspan="2">none</td></tr>`}</tbody></table>`;
      $("#tasks").innerHTML = `<table><thead><tr><th>Queue</th><th>Status</th><th class="num">Tasks</th></tr></thead><tbody>${
        o.tasks.length ? o.tasks.map((t) => `<tr><td>${esc(t.queue)}</td><td>${esc(t.status)}</td><td class="num">${t.count}</td></tr>`).join("")
          : `<tr class="empty"><td colspan="3">none</td></tr>`}</tbody></table>`;
    },
  };
}

function chart(minutes) {
  const w = 1200, h = 160, pad = 24;
  const max = Math.max(1, ...minutes.map((m) => m.transitions));
  const bw = (w - pad) / Math.max(1, minutes.length);
  const bars = minutes.map((m, i) => {
    const x = pad + i * bw;
    const th = (h - 30) * m.transitions / max;
    const eh = (h - 30) * m.errors / max;
    const label = `${fmtTime(m.at).slice(11, 16)}: ${m.transitions} transitions, ${m.errors} errors`;
    return `<g><title>${esc(label)}</title><rect class="bar" x="${x.toFixed(1)}" y="${(h - 16 - th).toFixed(1)}" width="${Math.max(1, bw - 2).toFixed(1)}" height="${th.toFixed(1)}"></rect>${
      m.errors ? `<rect class="err" x="${x.toFixed(1)}" y="${(h - 16 - eh).toFixed(1)}" width="${Math.max(1, bw - 2).toFixed(1)}" height="${eh.toFixed(1)}"></rect>` : ""}</g>`;
  }).join("");
  const first = minutes[0], lastM = minutes[minutes.length - 1];
  return `<svg viewBox="0 0 ${w} ${h}" preserveAspectRatio="none" role="img" aria-label="transitions per minute over the last hour, peak ${max}">
    <line class="axis" x1="${pad}" y1="${h - 16}" x2="${w}" y2="${h - 16}"></line>
    <text x="0" y="12">${max}</text><text x="0" y="${h - 18}">0</text>
    ${first ? `<text x="${pad}" y="${h - 2}">${esc(fmtTime(first.at).slice(11, 16))}</text>` : ""}
    ${lastM ? `<text x="${w - 34}" y="${h - 2}">${esc(fmtTime(lastM.at).slice(11, 16))}</text>` : ""}
    ${bars}</svg>`;
}

// ---- entities ----------------------------------------------------------------------

function entityRows(items, { withErrors = null, commands = [] } = {}) {
  if (!items.length) return `<tr class="empty"><td colspan="8">no entities match</td></tr>`;
  return items.map((e) => `<tr data-key="${esc(e.key)}" data-machine="${esc(e.machine)}">
    <td>${entityLink(e)}</td><td>${esc(e.machine)}</td><td>${stateCell(e)}</td><td>${statusCell(e.run_status)}</td>
    <td class="num">${e.version}</td><td title="${esc(fmtTime(e.entered_at))}">${esc(ago(e.entered_at))}</td>
    ${withErrors ? `<td class="wrap">${esc(withErrors(e) ?? "")}</td>` : ""}
    ${commands.length ? `<td class="actions">${commandButtons(e, commands)}</td>` : ""}</tr>`).join("");
}

function entities(main, r) {
  const q = r.query;
  main.innerHTML = `<h1>Entities</h1>
    <form class="filters" id="filters">
      <div><label for="f-machine">Machine</label><select id="f-machine" name="machine"><option value="">any</option></select></div>
      <div><label for="f-state">State</label><select id="f-state" name="state"><option value="">any</option></select></div>
      <div><label for="f-status">Run status</label><select id="f-status" name="status"><option value="">any</option>
        ${["active", "paused", "sleeping", "fault", "failed", "killed"].map((s) => `<option>${s}</option>`).join("")}</select></div>
      <div><label for="f-health">Health</label><select id="f-health" name="health"><option value="">any</option>
        <option value="error">error (failing)</option><option value="ok">ok</option></select></div>
      <div><label for="f-prefix">Key prefix</label><input id="f-prefix" name="prefix" size="18"></div>
      <div><label for="f-where">Where</label><input id="f-where" name="where" size="24" placeholder='props.region == "eu"'></div>
      <div><label for="f-error">Error contains</label><input id="f-error" name="error" size="18"></div>
      <div><label for="f-entered">Entered before</label><input id="f-entered" name="entered_before" size="12" placeholder="-1h"></div>
      <div><label for="f-sort">Order</label><select id="f-sort" name="sort"><option value="">by id</option>
        <option value="entered">longest in state first</option><option value="-entered">newest in state first</option></select></div>
      <div><button type="submit">Filter</button></div>
    </form>
    <div class="scroll"><table id="entities-table"><thead><tr><th>Key</th><th>Machine</th><th>State</th><th>Run status</th><th class="num">Version</th><th>Entered</th></tr></thead><tbody id="rows"></tbody></table></div>
    <p id="entities-total" class="sub" aria-live="polite"></p>
    <div class="pager"><button type="button" class="secondary" id="first">First page</button><button type="button" class="secondary" id="prev">Previous page</button><button type="button" class="secondary" id="next">Next page</button></div>`;
  const form = $("#filters");
  const fill = async () => {
    const ms = await servedMachines();
    $("#f-machine").innerHTML = `<option value="">any</option>` + ms.map((m) => `<option>${esc(m.name)}</option>`).join("");
    $("#f-machine").value = q.get("machine") || "";
    const states = new Set();
    for (const m of ms) if (!q.get("machine") || m.name === q.get("machine")) {
      const def = await machineDef(m.name);
      for (const s of def.states) states.add(s.name);
    }
    $("#f-state").innerHTML = `<option value="">any</option>` + [...states].map((s) => `<option>${esc(s)}</option>`).join("");
    $("#f-state").value = q.get("state") || "";
  };
  $("#f-status").value = q.get("status") || "";
  $("#f-health").value = q.get("health") || "";
  $("#f-prefix").value = q.get("prefix") || "";
  $("#f-where").value = q.get("where") || "";
  $("#f-error").value = q.get("error") || "";
  $("#f-entered").value = q.get("entered_before") || "";
  $("#f-sort").value = q.get("sort") || "";
  fill().catch(() => {});
  $("#f-machine").addEventListener("change", () => { q.set("machine", $("#f-machine").value); q.delete("state"); fill().catch(() => {}); });
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const p = new URLSearchParams();
    for (const [k, v] of new FormData(form)) if (v) p.set(k, v);
    location.hash = `#/entities?${p}`;
  });
  // Pages both ways: `back` holds the cursors of the pages before this one.
  let next = null;
  const back = (q.get("back") || "").split(",").filter(Boolean).map(decodeURIComponent);
  const at = (p) => { location.hash = `#/entities?${p}`; };
  $("#first").addEventListener("click", () => { const p = new URLSearchParams(q); p.delete("after"); p.delete("back"); at(p); });
  $("#prev").addEventListener("click", () => {
    const p = new URLSearchParams(q);
    const last = back[back.length - 1];
    if (last && last !== "0") p.set("after", last); else p.delete("after");
    if (back.length > 1) p.set("back", back.slice(0, -1).map(enc).join(",")); else p.delete("back");
    at(p);
  });
  $("#next").addEventListener("click", () => {
    if (!next) return;
    const p = new URLSearchParams(q);
    p.set("back", back.concat([q.get("after") || "0"]).map(enc).join(","));
    p.set("after", next);
    at(p);
  });
  let shown = null;
  return {
    title: "Entities",
    async refresh() {
      const p = new URLSearchParams();
      for (const k of ["machine", "state", "status", "health", "prefix", "where", "error", "entered_before", "sort", "after"]) if (q.get(k)) p.set(k, q.get(k));
      p.set("limit", "50");
      p.set("total", "true");
      const page = await api(`/v1/entities?${p}`);
      next = page.next;
      const t = page.total;
      // With criteria no index holds a page may hold fewer than 50: only how many it shows.
      const narrowed = ["where", "error", "entered_before"].some((k) => q.get(k));
      const from = back.length * 50;
      $("#entities-total").textContent = `${t.exact ? t.count : `${narrowed ? "at least" : "more than"} ${t.count}`} matching`
        + (!page.items.length ? "" : narrowed ? ` · showing ${page.items.length} here` : ` · showing ${from + 1}–${from + page.items.length}`);
      const text = JSON.stringify(page.items.map((e) => [e.machine, e.key, e.version, e.run_status, e.health]));
      if (text !== shown) { shown = text; $("#rows").innerHTML = entityRows(page.items); } // unchanged: keep selection
      $("#next").disabled = !next;
      $("#prev").disabled = !back.length;
      $("#first").disabled = !q.get("after");
    },
  };
}

const defs = new Map();
async function machineDef(name) {
  if (!defs.has(name)) defs.set(name, await api(`/v1/machines/${enc(name)}`));
  return defs.get(name);
}

// ---- one entity ----------------------------------------------------------------------

function entity(main, r) {
  const [machineName, key] = r.args;
  const base = `/v1/machines/${enc(machineName)}/entities/${enc(key)}`;
  main.innerHTML = `<h1><span class="sub">${esc(machineName)} /</span> <span class="wrap">${esc(key)}</span></h1>
    <div id="head"></div>
    <section id="why-box" hidden><h2>Why it failed</h2><div class="panel" id="why"></div></section>
    <div class="actions" id="commands"></div>
    <div class="grid2">
      <div>
        <h2>State diagram</h2><p class="sub" id="diagram-version"></p><div class="diagram" id="diagram" aria-live="off"></div>
        <h2>Properties</h2><div class="panel" id="props"></div>
        ${canWrite() ? `<h2>Raise an event</h2><form class="panel" id="raise">
          <label for="raise-event">Event</label><select id="raise-event" name="event"></select>
          <label for="raise-params">Parameters (JSON object)</label><textarea id="raise-params" name="params">{}</textarea>
          <div class="actions"><button type="submit">Raise…</button></div></form>` : ""}
      </div>
      <div>
        <h2>Queued events</h2><div id="inbox"></div>
        <h2>Schedules reaching it</h2><div id="next-fires"></div>
        <h2>Timers</h2><div id="timers"></div>
        <h2>Related entities</h2><div id="related"></div>
      </div>
    </div>
    <h2>Timeline</h2><div class="scroll" id="timeline"><table id="timeline-table"><thead><tr><th>Time</th><th>Kind</th><th>Transition</th><th>Cause</th><th>Request</th><th>Detail</th></tr></thead><tbody id="timeline-rows"></tbody></table></div>`;
  let latest = null, whyShown = null;
  wireCommands($("#commands"), () => tick());
  let permitted = null;
  if (canWrite()) {
    // Choosing an event fills in its declared parameters (unless they were edited).
    let filled = "{}";
    $("#raise-event").addEventListener("change", async () => {
      const def = await machineDef(machineName).catch(() => null);
      const declared = def?.events?.find((x) => x.name === $("#raise-event").value)?.params || [];
      const text = JSON.stringify(Object.fromEntries(declared.map((p) => [p, ""])), null, 1).replace(/\n/g, " ");
      if ($("#raise-params").value === filled) $("#raise-params").value = filled = declared.length ? text : "{}";
    });
    $("#raise").addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const event = $("#raise-event").value;
      let params;
      try {
        params = JSON.parse($("#raise-params").value || "{}");
        if (params === null || typeof params !== "object" || Array.isArray(params)) throw new Error("not an object");
      } catch (e) { flash(`Parameters must be a JSON object (${esc(e.message)})`); return; }
      if (!event) return;
      if (!(await confirmAction(`Raise ${event} on ${machineName}/${key}?`, `Parameters: ${JSON.stringify(params)}`))) return;
      const id = requestId();
      try {
        await api(`${base}/events/${enc(event)}`, { method: "POST", body: params, headers: { "Idempotency-Key": id } });
        flash(`Raised ${esc(event)} · operation ${opLink(id)}`);
      } catch (e) { flash(`Raise ${esc(event)} failed: ${esc(e.message)}`); }
      tick();
    });
  }
  return {
    title: `${machineName}/${key}`,
    feed: `machine=${enc(machineName)}&key=${enc(key)}`,
    error(e) { if (e instanceof ApiError && (e.status === 404 || e.status === 410)) $("#head").innerHTML = `<p class="error">${esc(e.message)}</p>`; },
    async refresh() {
      const [e, history, errors, timers, related] = await Promise.all([
        api(base).catch((err) => { if (err.status === 410) return null; throw err; }),
        api(`${base}/history`), api(`${base}/errors`), api(`${base}/timers`), api(`${base}/related`),
      ]);
      const state = e ? e.state : history.filter((h) => h.to).slice(-1)[0]?.to;
      $("#head").innerHTML = e ? `<dl class="props" id="summary">
          <dt>State</dt><dd data-field="state"><strong>${stateCell(e)}</strong>${e.health === "error" ? ` <span class="badge bad">failing</span>` : ""}</dd>
          <dt>Run status</dt><dd data-field="run_status">${statusCell(e.run_status)}${e.sleep_until ? ` until ${esc(fmtTime(e.sleep_until))}` : ""}</dd>
          <dt>Version</dt><dd>${e.version} (retry ${e.retry})</dd>
          <dt>Entered</dt><dd>${esc(fmtTime(e.entered_at))} (${esc(ago(e.entered_at))})</dd>
          <dt>Due</dt><dd>${e.due_at ? esc(fmtTime(e.due_at)) : "dormant"}</dd>
          <dt>Lease</dt><dd>${e.lease_owner ? `${esc(e.lease_owner)} until ${esc(fmtTime(e.lease_until))}` : "none"}</dd>
          <dt>Recent errors</dt><dd>${e.recent_errors ?? 0}</dd>
          ${(e.limits || []).map((l) => `<dt>Limit</dt><dd data-field="limit">${esc(l.says)}</dd>`).join("")}</dl>`
        : `<p class="error">This entity was deleted; its history stays readable.</p>`;
      // Only the commands that would change something; the others say why not.
      const offers = e?.commands || [];
      if (e && JSON.stringify(offers) !== latest) {
        latest = JSON.stringify(offers);
        const off = offers.filter((c) => !c.applies);
        $("#commands").innerHTML = commandButtons(e, offers.filter((c) => c.applies).map((c) => c.name))
          + (canWrite() && off.length ? `<p class="sub" id="not-offered">Not offered: ${off.map((c) => `${esc(c.name)} (${esc(c.why)})`).join(", ")}</p>` : "");
      }
      if (e && canWrite()) {
        const list = (e.permitted_events || []).join(",");
        if (list !== permitted) {
          permitted = list;
          $("#raise-event").innerHTML = (e.permitted_events || []).map((n) => `<option>${esc(n)}</option>`).join("") || `<option value="">(none permitted now)</option>`;
          $("#raise-event").dispatchEvent(new Event("change"));
        }
      }
      // Why it fails, down to the first cause (rendered again only when it changed).
      const failing = e && (e.health === "error" || e.run_status === "failed" || e.run_status === "fault");
      const why = failing ? await api(`${base}/why`).catch(() => null) : null;
      const whyText = JSON.stringify(why);
      if (whyText !== whyShown) {
        whyShown = whyText;
        $("#why-box").hidden = !why;
        $("#why").innerHTML = why ? whyChain(why) : "";
      }
      setHtml($("#props"), e ? `<pre class="mono wrap" id="properties">${esc(JSON.stringify(e.properties, null, 2))}</pre>` : "–");
      setHtml($("#inbox"), simpleTable(["Event", "Parameters"], (e?.inbox || []).map((i) => [esc(i.event), `<code class="wrap">${esc(JSON.stringify(i.params))}</code>`]), "no events queued"));
      setHtml($("#next-fires"), simpleTable(["Schedule", "Does", "Next fire"], (e?.next_fires || []).map((f) => [esc(f.schedule), esc(f.does),
        f.paused ? "paused" : f.at ? `<span class="mono">${esc(fmtTime(f.at))}</span>` : "—"]), "no schedule reaches its state"));
      setHtml($("#timers"), simpleTable(["Timer", "Event", "Due", "Every"], timers.map((t) => [esc(t.name), esc(t.event), `${esc(fmtTime(t.due_at))} (${esc(ago(t.due_at))})`, t.every_ms ? `${t.every_ms / 1000}s` : "once"]), "no pending timers"));
      const rel = (label, list) => list.length ? `<p>${label}: ${list.slice(0, 50).map((x) => `<a href="${entityHref(x.machine, x.key)}">${esc(x.machine)}/${esc(x.key)}</a> <span class="sub">(${esc(x.state)})</span>`).join(", ")}${list.length > 50 ? ` … and ${list.length - 50} more` : ""}</p>` : "";
      setHtml($("#related"), (rel("Predecessors", related.predecessors) + rel("Successors", related.successors) +
        (related.subscriptions.length ? simpleTable(["Subscription", "Pattern", "Progress", "Holds"], related.subscriptions.map((s) => [esc(s.event), `<code>${esc(s.pattern)}</code>`, `${s.satisfying} of ${s.selected}`, s.fired ? "fired" : s.holds ? "yes" : "not yet"]), "") : "")) || `<p class="sub">none</p>`);
      // The diagram of the version it runs under (an older one says so).
      const current = (await servedMachines().catch(() => [])).find((m) => m.name === machineName)?.hash;
      const version = e?.machine_version && current && e.machine_version !== current ? e.machine_version : null;
      $("#diagram-version").textContent = version ? `Drawn as version ${version.slice(0, 12)}, the one it runs under (current: ${current.slice(0, 12)}).` : "";
      await drawDiagram($("#diagram"), machineName, state, history, version);
      setRows($("#timeline-rows"), timelineRows(history, errors));
    },
  };
}

// The chain of causes of a failure: the entity, then what caused it, indented by depth.
function whyChain(w) {
  return `<ol class="why" id="why-chain">${w.chain.map((c, i) => `<li style="margin-left:${c.depth * 20}px" data-machine="${esc(c.machine)}" data-key="${esc(c.key)}">
    ${i ? "caused by " : ""}<a href="${entityHref(c.machine, c.key)}">${esc(c.machine)}/${esc(c.key)}</a>
    <span class="sub">(${c.state ? `now ${esc(c.state)}, ${esc(c.run_status)}` : "not stored any more"})</span>
    ${c.details ? `<div class="wrap"><strong class="health-error">${esc(c.details)}</strong> <span class="sub">${esc(c.kind)} · ${esc(fmtTime(c.at))}${c.request_id ? ` · ${opLink(c.request_id)}` : ""}</span></div>` : `<div class="sub">no failure recorded</div>`}
  </li>`).join("")}</ol>`;
}

// Sets an element's HTML only when it changed: a live page keeps the reader's selection
// and focus in what did not change.
const shownHtml = new WeakMap();
function setHtml(el, html) {
  if (!el || shownHtml.get(el) === html) return;
  shownHtml.set(el, html);
  el.innerHTML = html;
}

function simpleTable(heads, rows, empty) {
  return `<table><thead><tr>${heads.map((h) => `<th>${esc(h)}</th>`).join("")}</tr></thead><tbody>${
    rows.length ? rows.map((r) => `<tr>${r.map((c) => `<td>${c}</td>`).join("")}</tr>`).join("") : `<tr class="empty"><td colspan="${heads.length}">${esc(empty)}</td></tr>`}</tbody></table>`;
}

// Sets a table body's rows, each `[key, html of a <tr>]` in order, touching only rows that
// are new or gone: a live page keeps the reader's selection in the rows that stay.
function setRows(tbody, rows) {
  const have = new Map([...tbody.children].map((tr) => [tr.dataset.row, tr]));
  let at = tbody.firstElementChild;
  for (const [key, html] of rows) {
    let tr = have.get(key);
    if (tr) have.delete(key);
    else {
      const t = document.createElement("template");
      t.innerHTML = html;
      tr = t.content.firstElementChild;
      tr.dataset.row = key;
    }
    if (tr === at) at = at.nextElementSibling;
    else tbody.insertBefore(tr, at);
  }
  for (const tr of have.values()) tr.remove();
}

// The timeline's rows, newest first, each keyed by what it says.
function timelineRows(history, errors) {
  const rows = history.map((h) => ({ at: h.at, kind: h.kind, what: h.to ? `${h.from ?? "∅"} → ${h.to}` : h.from ?? "", cause: h.event ? `event ${h.event}` : h.action ? `action ${h.action}` : "", rid: h.request_id, detail: h.detail }))
    .concat(errors.map((e) => ({ at: e.at, kind: `error: ${e.kind}`, what: "", cause: "", rid: e.request_id, detail: e.details, error: true })));
  rows.sort((a, b) => b.at - a.at);
  const seen = new Map();
  const out = rows.map((r) => {
    const html = `<tr class="${r.error ? "error" : ""}" data-kind="${esc(r.kind)}"><td class="mono">${esc(fmtTime(r.at))}</td><td>${esc(r.kind)}</td><td>${esc(r.what)}</td><td>${esc(r.cause)}</td><td>${opLink(r.rid)}</td><td class="wrap">${esc(r.detail ?? "")}</td></tr>`;
    const n = (seen.get(html) || 0) + 1;
    seen.set(html, n);
    return [`${n}:${html}`, html];
  });
  return out.length ? out : [["empty", `<tr class="empty"><td colspan="6">nothing yet</td></tr>`]];
}

// A machine's diagram, of a stored version when given (`null`: the current one).
async function diagramSvg(name, version = null) {
  const id = version ? `${name}@${version}` : name;
  if (!app.svg.has(id)) {
    const v = version ? `&version=${enc(version)}` : "";
    app.svg.set(id, await api(`/v1/machines/${enc(name)}/graph?format=svg${v}`, { text: true }));
  }
  return app.svg.get(id);
}

// Lights the current state (and the composite states holding it) and marks the states
// and edges the entity's history went through.
async function drawDiagram(box, machineName, state, history, version = null) {
  const id = version ? `${machineName}@${version}` : machineName;
  if (box.dataset.machine !== id) {
    box.innerHTML = await diagramSvg(machineName, version);
    box.dataset.machine = id;
  }
  const svg = box.querySelector("svg");
  if (!svg) return;
  const css = (s) => (window.CSS && CSS.escape ? CSS.escape(s) : s.replace(/["\\]/g, "\\$&"));
  svg.querySelectorAll(".lit, .visited").forEach((n) => n.classList.remove("lit", "visited"));
  for (const h of history) {
    if (h.to) svg.querySelector(`.state[data-state="${css(h.to)}"]`)?.classList.add("visited");
    if (!h.from || !h.to) continue;
    // Only the edge that ran: its event's (or, moved by an auto action, the action's); by
    // its states alone only when no edge carries that label (a parent's edge, say).
    const between = [...svg.querySelectorAll(`.edge[data-from="${css(h.from)}"][data-to="${css(h.to)}"]`)];
    const ran = between.filter((n) => n.dataset.label === (h.event || h.action) || (!h.event && n.dataset.label === h.action));
    (ran.length ? ran : between).forEach((n) => n.classList.add("visited"));
  }
  let s = state ? svg.querySelector(`.state[data-state="${css(state)}"]`) : null;
  while (s) {
    s.classList.add("lit");
    const parent = s.getAttribute("data-parent");
    s = parent ? svg.querySelector(`.state[data-state="${css(parent)}"]`) : null;
  }
}

// ---- parked ----------------------------------------------------------------------------

function parked(main, r) {
  const q = r.query;
  const status = q.get("status") === "fault" ? "fault" : "failed";
  const machine = q.get("machine") || "";
  const error = q.get("error") || "";
  main.innerHTML = `<h1>Parked</h1><p class="sub">Entities an operator must look at: <code>failed</code> (parked after their fault policy gave up) and <code>fault</code> (backing off after errors).</p>
    <form class="filters" id="parked-filters">
      <div><label for="p-status">Run status</label><select id="p-status" name="status"><option>failed</option><option>fault</option></select></div>
      <div><label for="p-machine">Machine</label><select id="p-machine" name="machine"><option value="">any</option></select></div>
      <div><button type="submit">Filter</button></div>
      ${canWrite() ? `<div><button type="button" id="bulk-resume">Resume all matching…</button></div>` : ""}
    </form>
    ${error ? `<p id="parked-error">Only errors like <code>${esc(error)}</code> · <a href="#/parked?${new URLSearchParams({ status, ...(machine ? { machine } : {}) })}">all errors</a></p>` : ""}
    <p id="parked-total" class="sub" aria-live="polite"></p>
    <div id="parked-groups"></div>
    <div class="scroll"><table id="parked-table"><thead><tr><th>Key</th><th>Machine</th><th>State</th><th>Run status</th><th class="num">Version</th><th>Entered</th><th>Last error</th>${canWrite() ? "<th>Actions</th>" : ""}</tr></thead><tbody id="rows"></tbody></table></div>
    <div class="pager"><button type="button" class="secondary" id="p-first">First page</button><button type="button" class="secondary" id="p-prev">Previous page</button><button type="button" class="secondary" id="p-next">Next page</button></div>`;
  $("#p-status").value = status;
  servedMachines().then((ms) => {
    $("#p-machine").innerHTML = `<option value="">any</option>` + ms.map((m) => `<option>${esc(m.name)}</option>`).join("");
    $("#p-machine").value = machine;
  }).catch(() => {});
  const go = (p) => { location.hash = `#/parked?${p}`; };
  const base = () => { const p = new URLSearchParams(); p.set("status", status); if (machine) p.set("machine", machine); if (error) p.set("error", error); return p; };
  $("#parked-filters").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const p = new URLSearchParams();
    for (const [k, v] of new FormData($("#parked-filters"))) if (v) p.set(k, v);
    go(p);
  });
  // Pages both ways: `after` is where this page starts; `back` the cursors of the pages before.
  const back = (q.get("back") || "").split(",").filter(Boolean).map(decodeURIComponent);
  let next = null;
  $("#p-first").addEventListener("click", () => go(base()));
  $("#p-prev").addEventListener("click", () => {
    const p = base();
    const prev = back.slice(0, -1);
    if (back.length && back[back.length - 1] !== "0") p.set("after", back[back.length - 1]);
    if (prev.length) p.set("back", prev.map(enc).join(","));
    go(p);
  });
  $("#p-next").addEventListener("click", () => {
    if (!next) return;
    const p = base();
    p.set("after", next);
    p.set("back", back.concat([q.get("after") || "0"]).map(enc).join(","));
    go(p);
  });
  if (canWrite()) $("#bulk-resume").addEventListener("click", () => bulkResume({ status, ...(machine ? { machine } : {}), ...(error ? { error } : {}) }));
  wireCommands($("#rows"), () => tick());
  let shown = null, groupsShown = null;
  return {
    title: "Parked",
    async refresh() {
      const p = base();
      if (q.get("after")) p.set("after", q.get("after"));
      p.set("limit", "50");
      p.set("total", "true");
      p.set("errors", "latest");
      const g = new URLSearchParams({ status, ...(machine ? { machine } : {}) });
      const [page, grouped] = await Promise.all([api(`/v1/entities?${p}`), api(`/v1/entities/error-groups?${g}`)]);
      next = page.next;
      const t = page.total;
      $("#parked-total").textContent = `${t.exact ? t.count : `${error ? "at least" : "more than"} ${t.count}`} ${status}${machine ? ` of machine ${machine}` : ""}`
        + (!page.items.length ? "" : error ? ` · showing ${page.items.length} here` : ` · showing ${back.length * 50 + 1}–${back.length * 50 + page.items.length}`);
      // Every parked entity's newest error (up to 10,000), grouped by its text with
      // numbers as #: a group opens its entities.
      const groupsText = JSON.stringify(grouped);
      if (groupsText !== groupsShown) {
        groupsShown = groupsText;
        const link = (gr) => `#/parked?${new URLSearchParams({ status, ...(machine ? { machine } : {}), error: gr.error })}`;
        $("#parked-groups").innerHTML = grouped.groups.length ? `<table id="error-groups"><thead><tr><th>Error${grouped.exact ? "" : ` (of the first ${grouped.examined})`}</th><th class="num">Entities</th><th>For example</th></tr></thead><tbody>${
          grouped.groups.map((gr) => `<tr${gr.error === error && error ? ` class="current"` : ""}><td class="wrap">${gr.error === null ? "(no error recorded)" : `<a href="${esc(link(gr))}">${esc(gr.error)}</a>`}</td><td class="num">${gr.count}</td><td class="mono">${esc(gr.example)}</td></tr>`).join("")}</tbody></table>` : "";
      }
      $("#p-next").disabled = !next;
      $("#p-prev").disabled = !back.length;
      $("#p-first").disabled = !q.get("after");
      if ($("#rows").contains(document.activeElement) && document.activeElement.tagName === "BUTTON") return; // keep focus while tabbing
      const text = JSON.stringify(page.items.map((e) => [e.machine, e.key, e.version, e.run_status, e.last_error?.details]));
      if (text === shown) return; // nothing changed: keep selection
      shown = text;
      const lastError = (e) => (e.last_error ? `${e.last_error.details} (${ago(e.last_error.at)})` : "");
      $("#rows").innerHTML = entityRows(page.items, { withErrors: lastError, commands: canWrite() ? ["resume", "kill"] : [] });
    },
  };
}

// A bulk resume of what a filter matches: its dry-run count, confirmed with a reason, then
// followed to its end.
async function bulkResume(filter) {
  let dry;
  try {
    dry = await api("/v1/bulk", { method: "POST", body: { action: "resume", filter, dry_run: true } });
  } catch (e) { flash(`Dry run failed: ${esc(e.message)}`); return; }
  const words = Object.entries(filter).map(([k, v]) => `${k}=${v}`).join(" ");
  const count = dry.more ? `more than ${dry.count}` : String(dry.count);
  const extra = `<p id="bulk-count" data-count="${dry.count}">${esc(count)} entities match <code>${esc(words)}</code>.</p>
    <label for="bulk-reason">Reason (recorded with the operation)</label><input id="bulk-reason" required>`;
  if (!(await confirmAction(`Resume ${count} entities?`, "Each entity matching the filter is resumed once, as one bulk operation.", extra, true))) return;
  const reason = $("#bulk-reason").value.trim();
  if (!reason) { flash("A bulk operation needs a reason."); return; }
  const id = requestId();
  try {
    await api("/v1/bulk", { method: "POST", body: { action: "resume", filter, reason }, headers: { "Idempotency-Key": id } });
  } catch (e) { flash(`Bulk resume failed: ${esc(e.message)}`); return; }
  flash(`Bulk resume <span class="mono">${esc(id)}</span> started: ${esc(count)} entities`);
  for (;;) {
    const b = await api(`/v1/bulk/${enc(id)}`).catch(() => null);
    if (!b) return;
    flash(`Bulk resume <span class="mono" id="bulk-id">${esc(id)}</span>: <span id="bulk-status">${esc(b.status)}</span>, <span id="bulk-done">${b.done}</span> of ${b.total} done, ${b.failed} failed`);
    if (b.status !== "running") { tick(); return; }
    await new Promise((res) => setTimeout(res, 500));
  }
}

// ---- operations ----------------------------------------------------------------------------

// An operation's outcome: `open`, or `open · failing` once it met an error (it ends failed).
function outcomeCell(o) {
  if (o.outcome) return `<span class="outcome-${esc(o.outcome)}">${esc(o.outcome)}</span>`;
  return o.error ? `<span class="outcome-failed" title="still running; it met an error and will end failed">open · failing</span>` : `<span class="outcome-open">open</span>`;
}

function operations(main, r) {
  const q = r.query;
  const outcome = q.get("outcome") || "";
  const FILTERS = ["outcome", "machine", "name", "started_after"];
  main.innerHTML = `<h1>Operations</h1>
    <form class="filters" id="filters"><div><label for="f-outcome">Outcome</label><select id="f-outcome" name="outcome"><option value="">any</option>
      ${["open", "success", "failed", "canceled", "hung"].map((o) => `<option>${o}</option>`).join("")}</select></div>
      <div><label for="f-opmachine">Machine</label><input id="f-opmachine" name="machine" size="12"></div>
      <div><label for="f-name">Name</label><input id="f-name" name="name" size="14" placeholder="vm.create"></div>
      <div><label for="f-since">Started after</label><input id="f-since" name="started_after" size="12" placeholder="-1h"></div>
      <div><button type="submit">Filter</button></div></form>
    <form class="filters" id="find"><div><label for="f-request">Request id</label><input id="f-request" size="40"></div><div><button type="submit" class="secondary">Open</button></div></form>
    <div class="scroll"><table id="ops-table"><thead><tr><th>Request id</th><th>Name</th><th>Entity</th><th>Started</th><th class="num">ms</th><th>Outcome</th><th>Error</th></tr></thead><tbody id="rows"></tbody></table></div>
    <div class="pager"><button type="button" class="secondary" id="o-first">Newest</button><button type="button" class="secondary" id="o-prev">Newer page</button><button type="button" class="secondary" id="o-next">Older page</button></div>`;
  $("#f-outcome").value = outcome;
  $("#f-opmachine").value = q.get("machine") || "";
  $("#f-name").value = q.get("name") || "";
  $("#f-since").value = q.get("started_after") || "";
  const base = () => { const p = new URLSearchParams(); for (const k of FILTERS) if (q.get(k)) p.set(k, q.get(k)); return p; };
  const go = (p) => { location.hash = `#/operations${[...p].length ? `?${p}` : ""}`; };
  $("#filters").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const p = new URLSearchParams();
    for (const [k, v] of new FormData($("#filters"))) if (v) p.set(k, v);
    go(p);
  });
  $("#find").addEventListener("submit", (ev) => { ev.preventDefault(); const id = $("#f-request").value.trim(); if (id) location.hash = `#/operation/${enc(id)}`; });
  const back = (q.get("back") || "").split(",").filter(Boolean).map(decodeURIComponent);
  let next = null, shown = null;
  $("#o-first").addEventListener("click", () => go(base()));
  $("#o-prev").addEventListener("click", () => {
    const p = base();
    const last = back[back.length - 1];
    if (last && last !== "0") p.set("before", last);
    if (back.length > 1) p.set("back", back.slice(0, -1).map(enc).join(","));
    go(p);
  });
  $("#o-next").addEventListener("click", () => {
    if (!next) return;
    const p = base();
    p.set("back", back.concat([q.get("before") || "0"]).map(enc).join(","));
    p.set("before", next);
    go(p);
  });
  return {
    title: "Operations",
    async refresh() {
      const p = base();
      p.set("limit", "100");
      if (q.get("before")) p.set("before", q.get("before"));
      const list = await api(`/v1/operations?${p}`);
      next = list.next;
      $("#o-next").disabled = !next;
      $("#o-prev").disabled = !back.length;
      $("#o-first").disabled = !q.get("before");
      const text = JSON.stringify(list.items.map((o) => [o.request_id, o.outcome, o.error, o.ended_at]));
      if (text === shown) return; // unchanged: keep selection
      shown = text;
      $("#rows").innerHTML = list.items.length ? list.items.map((o) => `<tr data-request="${esc(o.request_id)}"><td>${opLink(o.request_id)}</td><td>${esc(o.name)}</td>
        <td>${o.machine && o.key ? `<a href="${entityHref(o.machine, o.key)}" class="wrap">${esc(o.machine)}/${esc(o.key)}</a>` : "–"}</td>
        <td title="${esc(fmtTime(o.started_at))}">${esc(ago(o.started_at))}</td><td class="num">${o.ended_at ? o.ended_at - o.started_at : "–"}</td>
        <td>${outcomeCell(o)}</td><td class="wrap">${esc(o.error ?? "")}</td></tr>`).join("")
        : `<tr class="empty"><td colspan="7">${next ? "none among these; older ones follow" : "no operations"}</td></tr>`;
    },
  };
}

function operation(main, r) {
  const id = r.args[0];
  main.innerHTML = `<h1>Operation <span class="mono wrap">${esc(id)}</span></h1><div id="op"></div>
    <h2>Entities it touched</h2><div class="scroll" id="touched"></div>
    <h2>Transitions it caused</h2><div class="scroll" id="transitions"></div>`;
  return {
    title: `Operation ${id}`,
    feed: `request_id=${enc(id)}`,
    error(e) { if (e instanceof ApiError && e.status === 404) $("#op").innerHTML = `<p class="error">${esc(e.message)}</p>`; },
    async refresh() {
      const t = await api(`/v1/operations/${enc(id)}/trace`);
      const o = t.operation;
      $("#op").innerHTML = `<dl class="props"><dt>Name</dt><dd>${esc(o.name)}</dd><dt>Outcome</dt><dd>${outcomeCell(o)}</dd>
        <dt>Started</dt><dd>${esc(fmtTime(o.started_at))}</dd><dt>Ended</dt><dd>${esc(fmtTime(o.ended_at))}</dd>
        <dt>Error</dt><dd class="wrap">${esc(o.error ?? "none")}</dd><dt>Restarts lived through</dt><dd>${o.restart_count}</dd></dl>`;
      $("#touched").innerHTML = `<table><thead><tr><th>Key</th><th>Machine</th><th>State</th><th>Run status</th><th class="num">Version</th><th>Entered</th></tr></thead><tbody>${entityRows(t.entities)}</tbody></table>${t.truncated ? `<p class="sub">Only the first 1000 are listed.</p>` : ""}`;
      $("#transitions").innerHTML = simpleTable(["Time", "Entity", "Kind", "Transition", "Cause", "Detail"], t.transitions.map((h) => [
        `<span class="mono">${esc(fmtTime(h.at))}</span>`, `<a href="${entityHref(h.machine, h.key)}">${esc(h.machine)}/${esc(h.key)}</a>`, esc(h.kind),
        esc(h.to ? `${h.from ?? "∅"} → ${h.to}` : h.from ?? ""), esc(h.event ? `event ${h.event}` : h.action ? `action ${h.action}` : ""), `<span class="wrap">${esc(h.detail ?? "")}</span>`]), "none");
    },
  };
}

// ---- machines ------------------------------------------------------------------------------

function machines(main) {
  main.innerHTML = `<h1>Machines</h1><div class="scroll"><table id="machines-table"><thead><tr><th>Machine</th><th>Version</th><th class="num">States</th><th class="num">Events</th><th class="num">Entities</th><th>Kept after it ends</th></tr></thead><tbody id="rows"></tbody></table></div>
    <h2>Schedules</h2><div class="scroll" id="schedules"></div>`;
  // Pause and resume (operators): the schedule's row says which it is now.
  $("#schedules").addEventListener("click", async (ev) => {
    const b = ev.target.closest("button[data-schedule]");
    if (!b) return;
    const [m, n] = b.dataset.schedule.split("/");
    try {
      const r = await api(`/v1/schedules/${enc(m)}/${enc(n)}/${b.dataset.act}`, { method: "POST", body: {} });
      flash(`schedule ${esc(m)}/${esc(n)}: ${r.paused ? "paused" : `next fire ${esc(fmtTime(r.next_at))}`}`);
    } catch (err) {
      flash(`<span>schedule ${esc(m)}/${esc(n)}: ${esc(err.message)}</span>`);
    }
    await app.page?.refresh();
  });
  return {
    title: "Machines",
    async refresh() {
      const [ms, o, sched] = await Promise.all([servedMachines(), api("/v1/overview?window=1m"), api("/v1/schedules")]);
      const count = (name) => o.counts.filter((c) => c.machine === name).reduce((a, c) => a + c.count, 0);
      $("#rows").innerHTML = ms.map((m) => `<tr><td><a href="#/machine/${enc(m.name)}">${esc(m.name)}</a></td><td class="mono">${esc(m.hash.slice(0, 12))}</td>
        <td class="num">${m.states.length}</td><td class="num">${m.events.length}</td><td class="num">${count(m.name)}</td><td>${retentionText(m)}</td></tr>`).join("");
      $("#schedules").innerHTML = simpleTable(["Schedule", "Cron", "Does", "Next fire", "Fired", "Missed", "Skipped", ""], sched.items.map((x) => [
        `${esc(x.machine)}/${esc(x.name)}`, `<span class="mono">${esc(x.cron)}</span>`, esc(x.does),
        x.paused ? "paused" : x.next_at ? `<span class="mono">${esc(fmtTime(x.next_at))}</span>` : "—",
        String(x.fired), String(x.missed), String(x.skipped),
        canWrite() ? `<button data-schedule="${esc(x.machine)}/${esc(x.name)}" data-act="${x.paused ? "resume" : "pause"}">${x.paused ? "Resume" : "Pause"}</button>` : ""]), "no schedules");
    },
  };
}

/** How long a machine keeps its entities after each end state ("failed 90d, gone 30d"). */
function retentionText(m) {
  const r = m.retention || [];
  return r.length ? r.map((x) => `${esc(x.state)} ${esc(x.keep)}`).join(", ") : `<span class="sub">no end state: kept while live</span>`;
}

function machine(main, r) {
  const name = r.args[0];
  main.innerHTML = `<h1>Machine ${esc(name)}</h1>
    <p id="retention" class="sub"></p>
    <h2>Entities by state</h2><div class="scroll" id="states"></div>
    <h2>Diagram</h2><div class="diagram" id="diagram"></div>
    <h2>Stored versions</h2><div class="scroll" id="versions"></div>
    <h2>Definition (TOML)</h2><pre class="source" id="toml" tabindex="0"></pre>`;
  let loaded = false;
  return {
    title: `Machine ${name}`,
    error(e) { if (e instanceof ApiError && e.status === 404) $("#states").innerHTML = `<p class="error">${esc(e.message)}</p>`; },
    async refresh() {
      if (!loaded) {
        const [toml, versions] = await Promise.all([api(`/v1/machines/${enc(name)}/toml`, { text: true }), api(`/v1/machines/${enc(name)}/versions`)]);
        $("#toml").textContent = toml;
        $("#versions").innerHTML = simpleTable(["Version", "Stored", "Entities", "Current", "Origin"], versions.map((v) => [`<span class="mono">${esc(v.hash.slice(0, 12))}</span>`, esc(fmtTime(v.stored_at)), String(v.entities), v.current ? "current" : "", esc(v.origin || "")]), "none stored");
        await drawDiagram($("#diagram"), name, null, []);
        const m = (await servedMachines()).find((x) => x.name === name);
        if (m) $("#retention").innerHTML = `Kept after it ends: ${retentionText(m)} (then removed with all its rows${m.archived ? ", archived first" : ""}; README "Retention"). A live entity keeps of its history: ${esc(m.history || "forever")}.`;
        loaded = true;
      }
      const o = await api("/v1/overview?window=1m");
      const mine = o.counts.filter((c) => c.machine === name);
      $("#states").innerHTML = simpleTable(["State", "Run status", "Entities"], mine.map((c) => [
        `<a href="#/entities?machine=${enc(name)}&state=${enc(c.state)}&status=${enc(c.run_status)}">${esc(c.path)}</a>`, statusCell(c.run_status), String(c.count)]), "no entities");
      heatMap($("#diagram svg"), name, mine);
    },
  };
}

// The machine's diagram as a heat map: each state with its entities (a red badge for those
// parked), and a click (or Enter) on a state opens its list.
function heatMap(svg, name, counts) {
  if (!svg) return;
  const per = new Map();
  for (const c of counts) {
    const p = per.get(c.state) || { n: 0, parked: 0 };
    p.n += c.count;
    if (c.run_status === "failed" || c.run_status === "fault") p.parked += c.count;
    per.set(c.state, p);
  }
  const NS = "http://www.w3.org/2000/svg";
  for (const g of svg.querySelectorAll(".state[data-state]")) {
    const st = g.dataset.state;
    g.querySelectorAll(".heat").forEach((n) => n.remove());
    const rect = g.querySelector("rect");
    const p = per.get(st);
    if (rect && p) {
      const x = Number(rect.getAttribute("x")) + Number(rect.getAttribute("width")) - 4;
      const y = Number(rect.getAttribute("y")) + 12;
      const t = document.createElementNS(NS, "text");
      t.setAttribute("class", `heat${p.parked ? " parked" : ""}`);
      t.setAttribute("x", x); t.setAttribute("y", y); t.setAttribute("text-anchor", "end");
      t.textContent = p.parked ? `${p.n} · ${p.parked} parked` : String(p.n);
      g.appendChild(t);
    }
    g.dataset.count = p ? p.n : 0;
    if (!g.dataset.linked) {
      g.dataset.linked = "1";
      g.setAttribute("tabindex", "0");
      g.setAttribute("role", "link");
      g.setAttribute("aria-label", `entities in ${st}`);
      const open = () => { location.hash = `#/entities?machine=${enc(name)}&state=${enc(st)}`; };
      g.addEventListener("click", open);
      g.addEventListener("keydown", (ev) => { if (ev.key === "Enter") open(); });
    }
  }
}

document.addEventListener("DOMContentLoaded", () => { boot().catch((e) => showSignIn(explain(e))); });
