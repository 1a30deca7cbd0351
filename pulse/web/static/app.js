// Pulse's page. Plain JavaScript, served by Pulse itself: no build step, nothing fetched from elsewhere.
// Every page reads JSON from /api/…; the overview and the events tail stay live over server-sent events.
"use strict";

const CSRF = document.querySelector('meta[name="csrf"]').content;
const PAGE = document.body.dataset.page;

// -- small helpers ----------------------------------------------------------------------------------------

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined) continue;
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const c of children.flat(Infinity)) node.append(c instanceof Node ? c : document.createTextNode(c ?? ""));
  return node;
}

// Every time in the viewer's zone; UTC on hover.
function when(ts) {
  if (ts === null || ts === undefined) return el("span", {class: "muted"}, "-");
  const d = new Date(ts * 1000);
  return el("time", {datetime: d.toISOString(), title: d.toISOString().replace(/\.\d+Z$/, "Z") + " (UTC)"},
            d.toLocaleString());
}

function ago(seconds) {
  if (seconds === null || seconds === undefined) return "-";
  if (seconds < 1) return seconds.toFixed(1) + "s ago";
  if (seconds < 120) return Math.round(seconds) + "s ago";
  return Math.round(seconds / 60) + "m ago";
}

function duration(seconds) {
  if (seconds === null || seconds === undefined) return "-";
  const s = Math.floor(seconds), h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60);
  return `${h}:${String(m).padStart(2, "0")}:${String(s % 60).padStart(2, "0")}`;
}

async function getJSON(url) {
  const r = await fetch(url, {credentials: "same-origin"});
  if (!r.ok) throw new Error(`${url}: ${r.status}`);
  return r.json();
}

async function post(url, body) {
  const r = await fetch(url, {method: "POST", credentials: "same-origin",
                              headers: {"Content-Type": "application/json", "X-CSRF-Token": CSRF},
                              body: JSON.stringify(body)});
  const answer = await r.json().catch(() => ({ok: false, error: r.statusText}));
  say(answer.ok ? answer.message || "done" : `refused: ${answer.error}`, !answer.ok);
  return answer;
}

function say(text, bad = false) {
  const box = document.getElementById("said");
  box.textContent = text;
  box.className = bad ? "bad" : "muted";
}

function table(head, rows, className = null) {
  // className "cards": on a phone each row is a card, each cell labelled by its data-label
  const empty = el("tr", {}, el("td", {class: "muted", colspan: String(head.length)}, "none yet"));
  return el("table", {class: className}, el("thead", {}, el("tr", {}, head.map(h => el("th", {scope: "col"}, h)))),
            el("tbody", {}, rows.length ? rows : empty));
}

function section(title, ...body) {
  return el("section", {"aria-label": title}, el("h2", {}, title), ...body);
}

function spark(points, {label = "", max = null} = {}) {
  // points: [[ts, value], ...]; an inline SVG polyline from 0 to `max` (a percentage: 100), else
  // to the series' own largest value.
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("viewBox", "0 0 100 40");
  svg.setAttribute("preserveAspectRatio", "none");
  svg.setAttribute("role", "img");
  svg.setAttribute("aria-label", label);
  if (points.length > 1) {
    const t0 = points[0][0], t1 = points[points.length - 1][0] || t0 + 1;
    const vs = points.map(p => p[1]);
    const lo = Math.min(...vs, 0), hi = max ?? Math.max(...vs, lo + 1e-9);
    const line = document.createElementNS(svg.namespaceURI, "polyline");
    line.setAttribute("points", points.map(([t, v]) =>
      `${((t - t0) / (t1 - t0 || 1) * 100).toFixed(2)},${(38 - (v - lo) / (hi - lo) * 36).toFixed(2)}`).join(" "));
    svg.append(line);
  }
  return svg;
}

// -- the overview ---------------------------------------------------------------------------------------

const FIELDS = ["state", "pid", "uptime", "restarts", "last_exit", "heartbeat"];
const SIGNALS = {1: "SIGHUP", 2: "SIGINT", 6: "SIGABRT", 9: "SIGKILL", 11: "SIGSEGV", 15: "SIGTERM"};

function workerRow(w) {
  const exit = w.last_exit ? (w.last_exit.signal ? SIGNALS[w.last_exit.signal] || `signal ${w.last_exit.signal}` : `code ${w.last_exit.code}`) : "-";
  const cells = {state: w.state, pid: w.pid ?? "-", uptime: duration(w.uptime_s), restarts: w.restarts,
                 last_exit: exit, heartbeat: ago(w.heartbeat_age_s)};
  const act = (action) => el("button", {type: "button", "data-action": action,
      onclick: () => { if (confirm(`${action} ${w.name}?`)) post("/api/workers", {action, worker: w.name}); }}, action);
  return el("tr", {"data-worker": w.name},
            el("th", {scope: "row"}, w.name),
            FIELDS.map(f => el("td", {"data-field": f, "data-label": f.replace("_", " "),
                                      class: f === "state" ? `state-${w.state}` : null}, String(cells[f]))),
            el("td", {class: "actions"}, act("restart"), " ", act("stop"), " ", act("start")));
}

// A critical process: its state, its tree's memory (figure and the last ten minutes), its latest health
// probe, its restarts and the last thing done about it (the reason on hover and below it).
const PROCESS_FIELDS = ["state", "memory", "health", "restarts", "last_action"];
const WIDE = ["memory", "last_action"];     // a whole line of a card on a phone

function processState(p) {
  return p.paused_until ? "paused" : p.alive === null ? "unknown" : p.alive ? "alive" : "dead";
}

function processCells(p, card = {}) {
  const state = processState(p), last = card.last_action, health = card.health;
  const points = card.memory || [], top = Math.max(p.max_mb ?? 0, ...points.map(q => q[1]));
  return {
    state: [el("span", {class: state}, state), p.paused_until ? [" until ", when(p.paused_until)] : []],
    memory: [el("span", {class: p.max_mb && p.rss_mb > p.max_mb ? "figure bad" : "figure"}, p.rss_mb === null || p.rss_mb === undefined ? "-" : `${Math.round(p.rss_mb)} MB`
                + (p.max_mb ? ` of ${p.max_mb}` : "")),
             spark(points, {label: `${p.name}: its tree's memory over ten minutes, MB`, max: top || null})],
    health: health ? el("span", {class: health.ok ? "ok" : "bad", title: health.error || ""}, health.ok ? "ok" : "failing")
                   : el("span", {class: "muted"}, "-"),
    restarts: String(card.restarts ?? 0),
    last_action: last ? [el("span", {class: last.outcome, title: [last.reason, last.error].filter(Boolean).join(" · ")},
                            `${last.kind}${last.why ? ` (${last.why})` : ""} ${last.outcome}`), " ", when(last.ts),
                         last.reason || last.error ? el("div", {class: "muted small"}, last.error || last.reason) : []]
                       : el("span", {class: "muted"}, "-"),
  };
}

function processRow(p, card) {
  const act = (action) => el("button", {type: "button", "data-action": action, onclick: () => {
    if (action === "pause") {
      const span = prompt(`Leave ${p.name} alone (no restarts) for how long? 90s, 30m, 2h, 1d`, "30m");
      if (span) post("/api/processes", {action, process: p.name, for: span});
    } else if (confirm(`resume watching ${p.name}?`)) post("/api/processes", {action, process: p.name});
  }}, action);
  const cells = processCells(p, card);
  return el("tr", {"data-process": p.name},
            el("th", {scope: "row"}, p.name),
            PROCESS_FIELDS.map(f => el("td", {"data-field": f, "data-label": f.replace("_", " "),
                                             class: WIDE.includes(f) ? "wrap wide" : null}, cells[f])),
            el("td", {class: "actions"}, act("pause"), " ", act("resume")));
}

// Built once per set of processes, then each cell replaced only when what it shows changed: the
// buttons stay (and keep focus) while the memory moves every sample.
function refreshProcesses(view) {
  const s = view.status, box = document.getElementById("processes"), cards = view.processes || {};
  const names = s ? s.processes.map(p => p.name).join() : "";
  if (!s || !s.processes.length || box.dataset.names !== names) {
    box.dataset.names = names;
    box.replaceChildren(el("h2", {}, "Critical processes"), s && s.processes.length
      ? table(["process", ...PROCESS_FIELDS.map(f => f.replace("_", " ")), ""], s.processes.map(p => processRow(p, cards[p.name])), "cards")
      : el("p", {class: "muted"}, "none configured ([[process]] in config.toml)"));
    return;
  }
  for (const p of s.processes) {
    const row = box.querySelector(`[data-process="${CSS.escape(p.name)}"]`), cells = processCells(p, cards[p.name]);
    for (const f of PROCESS_FIELDS) {
      const cell = row.querySelector(`[data-field="${f}"]`), shows = JSON.stringify([p, cards[p.name] || {}, f]);
      if (cell.dataset.shows !== shows) {
        cell.dataset.shows = shows;
        cell.replaceChildren(...[cells[f]].flat(2));
      }
    }
  }
}

// The overview is built once, then kept current in place: a cell changes, its row and buttons stay
// (focus and an open confirmation survive the updates that come several times a second).
const shown = {};

function refresh(id, title, data, build) {
  const key = JSON.stringify(data);
  if (shown[id] === key) return;
  shown[id] = key;
  document.getElementById(id).replaceChildren(el("h2", {}, title), ...build());
}

function refreshWorkers(view) {
  const s = view.status, box = document.getElementById("workers");
  const names = s ? s.workers.map(w => w.name).join() : "";
  if (!s || box.dataset.names !== names) {
    box.dataset.names = names;
    box.replaceChildren(el("h2", {}, "Workers"),
      s ? table(["worker", ...FIELDS.map(f => f.replace("_", " ")), ""], s.workers.map(workerRow), "cards")
        : el("p", {class: "bad"}, view.error || "pulsed is not answering"),
      el("p", {class: "muted", id: "pulsed"}));
  } else {
    for (const w of s.workers) {
      const row = box.querySelector(`[data-worker="${w.name}"]`), fresh = workerRow(w);
      for (const f of FIELDS) {
        const cell = row.querySelector(`[data-field="${f}"]`), now = fresh.querySelector(`[data-field="${f}"]`);
        if (cell.textContent !== now.textContent) cell.textContent = now.textContent;
        cell.className = now.className;
      }
    }
  }
  if (s) document.getElementById("pulsed").textContent = `pulsed pid ${s.supervisor.pid}, up ${duration(s.supervisor.uptime_s)}`;
}

function renderOverview(view) {
  const main = document.querySelector("main"), s = view.status;
  if (!document.getElementById("workers")) {
    main.replaceChildren(...["workers", "processes", "engine", "host", "survival"].map(id =>
      el("section", {id, "aria-live": id === "workers" ? "polite" : null})));
  }
  refreshWorkers(view);
  refreshProcesses(view);
  const engine = s?.workers.find(w => w.name === "engine");
  refresh("engine", "Engine", [s?.engine_commit, engine?.state, view.last_promote], () => [el("p", {},
    "commit ", el("code", {"data-field": "engine-commit"}, s?.engine_commit?.slice(0, 12) || "-"),
    ", state ", el("span", {"data-field": "engine-state"}, engine?.state || "-"),
    ", last promote ", view.last_promote ? when(view.last_promote.ts) : "none")]);
  refresh("host", "Host", view.vitals, () => [el("div", {class: "charts"}, Object.entries(view.vitals).map(([key, points]) =>
    el("div", {class: "chart", "data-vital": key},
       el("div", {}, key, " ", el("strong", {}, points.length ? points[points.length - 1][1].toFixed(1) + "%" : "-")),
       spark(points, {label: `${key}, %`, max: 100}))))]);
  refresh("survival", "Last survival actions", view.survival, () => [view.survival.length
    ? table(["when", "rule", "kind", "target", "outcome"], view.survival.map(a => el("tr", {},
        el("td", {"data-label": "when", class: "wide"}, when(a.ts)), el("td", {"data-label": "rule", class: "wide"}, a.rule || "-"),
        el("td", {"data-label": "kind", class: "wide"}, a.kind), el("td", {"data-label": "target"}, a.target || "-"),
        el("td", {"data-label": "outcome", class: a.outcome}, a.outcome || "pending"))), "cards")
    : el("p", {class: "muted"}, "none yet")]);
}

function live(url, onData) {
  const source = new EventSource(url);
  source.onmessage = (m) => onData(JSON.parse(m.data));
  source.onerror = () => say("live updates interrupted; reconnecting…", true);
  source.onopen = () => say("live");
  return source;
}

// -- events ---------------------------------------------------------------------------------------------

function eventRow(e) {
  return el("tr", {"data-event": e.id},
            el("td", {}, el("a", {href: `/events/${e.id}`}, String(e.id))), el("td", {}, when(e.ts)),
            el("td", {}, e.type), el("td", {}, e.source), el("td", {}, e.target ?? "-"),
            el("td", {class: "wrap"}, el("code", {}, JSON.stringify(e.data).slice(0, 200))));
}

function eventsPage() {
  const main = document.querySelector("main");
  const params = new URLSearchParams(location.search);
  const field = (name, label, extra = {}) => el("label", {}, label,
      el("input", {name, value: params.get(name) || "", ...extra}));
  const form = el("form", {class: "filters", method: "get"},
    field("type", "type", {list: "types"}), field("source", "source"), field("target", "target"),
    field("since", "since (10m, ISO)"), field("q", "search"), el("button", {type: "submit"}, "filter"));
  const body = el("tbody");
  main.replaceChildren(section("Events", form,
    el("table", {}, el("thead", {}, el("tr", {}, ["id", "when", "type", "source", "target", "data"].map(h => el("th", {}, h)))), body)));
  getJSON("/api/events?" + params).then(r => {
    form.append(el("datalist", {id: "types"}, r.types.map(t => el("option", {value: t}))));
    body.replaceChildren(...r.events.map(eventRow));
    if (r.error) say(r.error, true);
    live("/api/stream/events?" + params + `&after=${r.last_id}`, (batch) => {
      for (const e of batch) body.prepend(eventRow(e));
    });
  }).catch(err => say(String(err), true));
}

// -- the other pages --------------------------------------------------------------------------------------

async function vitalsPage() {
  const main = document.querySelector("main");
  const params = new URLSearchParams(location.search);
  const window_ = params.get("window") || "1h";
  const pick = el("select", {name: "window", onchange: (e) => { location.search = `?window=${e.target.value}`; }},
    ["1h", "6h", "24h", "7d"].map(w => el("option", {value: w, selected: w === window_ ? "" : null}, w)));
  const r = await getJSON(`/api/vitals?window=${window_}`);
  main.replaceChildren(section(`Vitals over ${window_}`, el("label", {}, "window ", pick),
    el("div", {class: "charts"}, Object.entries(r.series).map(([key, points]) => {
      const vs = points.map(p => p[1]), last = vs[vs.length - 1];
      const range = vs.length ? `${Math.min(...vs).toFixed(1)} … ${Math.max(...vs).toFixed(1)}` : "";
      return el("div", {class: "chart big", "data-vital": key}, el("div", {}, key, " ", el("strong", {}, last?.toFixed(1) ?? "-")),
                el("div", {class: "muted"}, `${range} · ${points.length} points`),
                spark(points, {label: key, max: key.endsWith("_pct") ? 100 : null}));
    }))));
}

async function effectsPage() {
  const r = await getJSON("/api/effects");
  document.querySelector("main").replaceChildren(...Object.entries(r.by_state).map(([state, rows]) =>
    section(`${state} (${rows.length})`, table(["id", "origin", "kind", "target", "age", "why"], rows.map(e =>
      el("tr", {"data-effect": e.id}, el("td", {}, el("code", {}, e.id.slice(0, 12))), el("td", {}, e.origin),
         el("td", {}, e.kind), el("td", {}, e.target ?? "-"), el("td", {}, ago(r.now - e.created)),
         el("td", {class: "wrap"}, e.why ?? "")))))));
}

async function tasksPage() {
  const r = await getJSON("/api/tasks");
  const main = document.querySelector("main");
  main.replaceChildren(
    section("Board", el("div", {class: "board"}, Object.entries(r.by_status).map(([status, tasks]) =>
      el("div", {"data-status": status}, el("h2", {}, `${status} (${tasks.length})`),
         el("ul", {}, tasks.map(t => el("li", {}, el("a", {href: `/events?target=${t.id}`, title: "its history"}, t.id), " ", t.title,
            el("div", {class: "muted"}, `${t.project} · ${t.agent || "unassigned"} · ${t.attempts} runs`)))))))),
    section("Agents", table(["agent", "runs", "success", "mean duration", "cost"], r.agents.map(a =>
      el("tr", {}, el("td", {}, a.agent), el("td", {}, a.runs), el("td", {}, (a.success_rate * 100).toFixed(0) + "%"),
         el("td", {}, a.mean_run_s === null ? "-" : a.mean_run_s.toFixed(1) + "s"),
         el("td", {}, a.cost_usd === null ? "-" : "$" + a.cost_usd.toFixed(2)))))),
    section("History", table(["when", "task", "event", "detail"], r.history.map(e =>
      el("tr", {}, el("td", {}, when(e.ts)), el("td", {}, el("a", {href: `/events?target=${e.target}`}, e.target)),
         el("td", {}, e.type), el("td", {class: "wrap"}, e.data.reason || e.data.error || e.data.agent || ""))))));
}

async function enginePage() {
  const r = await getJSON("/api/engine");
  const act = (action) => el("button", {type: "button", "data-action": action,
      onclick: () => { if (confirm(`${action} the engine?`)) post("/api/engine", {action}); }}, action);
  document.querySelector("main").replaceChildren(
    section("Engine", el("p", {}, "running ", el("code", {}, (r.commit || "-").slice(0, 12)), " ", act("promote"), " ", act("rollback"))),
    section("Promotes and rollbacks", table(["when", "what", "from → to", "diff", "checks passed / reason"], r.history.map(e =>
      el("tr", {"data-event": e.id}, el("td", {}, when(e.ts)), el("td", {}, e.type),
         el("td", {}, el("code", {}, `${(e.data.before || "").slice(0, 12)} → ${(e.data.after || "").slice(0, 12)}`)),
         el("td", {}, e.diff || "-"),
         el("td", {class: "wrap"}, e.data.checks ? e.data.checks.join(", ") : e.data.reason || e.data.error || "-"))))));
}

async function gatePage() {
  const r = await getJSON("/api/gate");
  document.querySelector("main").replaceChildren(
    section("Gate sessions", table(["session", "agent", "task", "state", "calls", "blocked", "unverified", "last"],
      r.sessions.map(s => el("tr", {"data-session": s.session}, el("td", {}, el("code", {}, s.session)),
        el("td", {}, s.agent), el("td", {}, s.task || "-"), el("td", {}, s.state), el("td", {}, s.calls),
        el("td", {}, s.blocked), el("td", {}, s.unverified.join(", ") || "-"), el("td", {}, when(s.last)))))),
    section("Blocked calls", table(["when", "session", "tool", "code", "reason"], r.blocked.map(e =>
      el("tr", {}, el("td", {}, when(e.ts)), el("td", {}, e.target), el("td", {}, e.data.tool),
         el("td", {}, e.data.code), el("td", {class: "wrap"}, e.data.reason))))));
}

async function logPage() {
  const params = new URLSearchParams(location.search);
  const r = await getJSON("/api/log?" + params);
  const pick = el("select", {name: "worker", onchange: (e) => { location.search = e.target.value ? `?worker=${e.target.value}` : ""; }},
    el("option", {value: ""}, "every process"),
    r.processes.map(p => el("option", {value: p, selected: p === params.get("worker") ? "" : null}, p)));
  document.querySelector("main").replaceChildren(section("pulse.log", el("label", {}, "process ", pick),
    el("pre", {}, r.lines.join("\n"))));
}

// -- start --------------------------------------------------------------------------------------------------

// the fleet: a host links to its own page where it advertises one; a host gone from the fleet is red
function fleetRow(h) {
  const name = h.web_url ? el("a", {href: h.web_url}, h.host) : h.host;
  return el("tr", {"data-host": h.host, class: h.state === "gone" ? "bad" : null},
    el("td", {}, name), el("td", {}, h.state), el("td", {}, `${h.workers_running}/${h.workers_total}`),
    el("td", {}, `${h.processes_healthy}/${h.processes_total}`), el("td", {}, h.open_effects ?? "-"),
    el("td", {}, `${h.agents_busy}/${h.agents_busy + h.agents_free}`), el("td", {}, ago(h.last_seen_age_s)));
}

async function fleetPage() {
  const draw = async () => {
    const r = await getJSON("/api/fleet");
    document.querySelector("main").replaceChildren(section("Fleet",
      r.error ? el("p", {class: "muted"}, r.error) : el("p", {class: "muted"}, `as seen by ${r.host}`),
      table(["host", "state", "workers", "processes", "open effects", "agents busy", "last seen"],
            r.hosts.map(fleetRow))));
  };
  await draw();
  setInterval(() => draw().catch(err => say(String(err), true)), 1000);
}

function theme() {
  const saved = localStorage.getItem("pulse-theme");
  const dark = saved ? saved === "dark" : matchMedia("(prefers-color-scheme: dark)").matches;
  document.documentElement.dataset.theme = dark ? "dark" : "light";
  document.getElementById("theme").onclick = () => {
    const next = document.documentElement.dataset.theme === "dark" ? "light" : "dark";
    localStorage.setItem("pulse-theme", next);
    document.documentElement.dataset.theme = next;
  };
}

theme();
const PAGES = {overview: () => live("/api/stream/overview", renderOverview), events: eventsPage, vitals: vitalsPage,
               effects: effectsPage, tasks: tasksPage, engine: enginePage, gate: gatePage, log: logPage,
               fleet: fleetPage};
Promise.resolve(PAGES[PAGE]?.()).catch(err => say(String(err), true));
