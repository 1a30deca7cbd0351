// Pulse's page. Plain JavaScript, served by Pulse itself: no build step, nothing fetched from elsewhere.
// Every page reads JSON from /api/…; the overview and the events tail stay live over server-sent events.
"use strict";

const CSRF = document.querySelector('meta[name="csrf"]').content;
// The page's first data, when the server put it in the page: drawn at once, before any request.
const FIRST = JSON.parse(document.getElementById("first")?.textContent || "null");
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

// One time format on every page: the viewer's local time as 2026-12-03 17:55:02 (the time only, for
// today), with the zone, the UTC time and how long ago on hover; `relative`: "3 min ago" shown, the
// time on hover. The API gives epoch seconds or ISO 8601; both are read here.
const pad = (n) => String(n).padStart(2, "0");
const ZONE = Intl.DateTimeFormat().resolvedOptions().timeZone || "local time";

function toDate(ts) {
  return typeof ts === "string" ? new Date(ts) : new Date(ts * 1000);
}

function localTime(d, {short = true} = {}) {
  const day = `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}`;
  const time = `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  const today = new Date().toDateString() === d.toDateString();
  return short && today ? time : `${day} ${time}`;
}

function zoneOffset(d) {
  const m = -d.getTimezoneOffset(), sign = m < 0 ? "-" : "+";
  return `UTC${sign}${pad(Math.floor(Math.abs(m) / 60))}:${pad(Math.abs(m) % 60)}`;
}

// `axis`: the span of a chart's window in seconds: a short label for its time axis (hours and minutes,
// or the day over a multi-day window), so three of them never run together on a phone
function when(ts, {relative = false, axis = null} = {}) {
  if (ts === null || ts === undefined) return el("span", {class: "muted"}, "-");
  const d = toDate(ts), age = (Date.now() - d.getTime()) / 1000;
  const hover = `${localTime(d, {short: false})} ${ZONE} (${zoneOffset(d)}) · ${d.toISOString().replace(/\.\d+Z$/, "Z")} · ${ago(age)}`;
  const text = axis === null ? (relative ? ago(age) : localTime(d))
    : axis > 172800 ? `${pad(d.getMonth() + 1)}-${pad(d.getDate())}` : `${pad(d.getHours())}:${pad(d.getMinutes())}`;
  return el("time", {datetime: d.toISOString(), title: hover}, text);
}

function megabytes(bytes) {
  return bytes >= 104858 ? `${(bytes / 1048576).toFixed(1)} MB` : `${Math.round(bytes / 1024)} KB`;
}

function ago(seconds) {
  if (seconds === null || seconds === undefined) return "-";
  if (seconds < 0) return "in " + ago(-seconds).replace(/ ago$/, "");
  if (seconds < 1) return seconds.toFixed(1) + " s ago";
  if (seconds < 120) return Math.round(seconds) + " s ago";
  if (seconds < 7200) return Math.round(seconds / 60) + " min ago";
  if (seconds < 172800) return Math.round(seconds / 3600) + " h ago";
  return Math.round(seconds / 86400) + " days ago";
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

// Every table: on a phone (app.css) each row is a card, each cell under its column's name (its
// data-label, set here from `head` when the row did not); a long value takes a card's whole line.
const LONG = 18;          // characters: a cell longer than this is "wide" on a phone

function labelled(row, head) {
  [...row.children].forEach((cell, i) => {
    if (cell.tagName === "TD" && !cell.dataset.label && head[i]) cell.dataset.label = head[i];
    if (cell.tagName === "TD" && cell.textContent.length > LONG) cell.classList.add("wide");
  });
  return row;
}

function table(head, rows) {
  const empty = el("tr", {}, el("td", {class: "muted", colspan: String(head.length)}, "none yet"));
  return el("table", {class: "cards"}, el("thead", {}, el("tr", {}, head.map(h => el("th", {scope: "col"}, h)))),
            el("tbody", {}, rows.length ? rows.map(r => labelled(r, head)) : empty));
}

function section(title, ...body) {
  return el("section", {"aria-label": title}, el("h2", {}, title), ...body);
}

// Where a series stops: a step between two points longer than GAP_STEPS of its usual step (or of
// `step`, the bucket) is time nobody sampled (pulsed was down), drawn as a gap, not a line across.
const GAP_STEPS = 2.5;

function segments(points, step = null) {
  const steps = points.slice(1).map((p, i) => p[0] - points[i][0]).sort((a, b) => a - b);
  const usual = Math.max(step ?? 0, steps.length ? steps[Math.floor(steps.length / 2)] : 0);
  const out = [];
  points.forEach((p, i) => {
    if (!i || p[0] - points[i - 1][0] > GAP_STEPS * usual) out.push([]);
    out[out.length - 1].push(p);
  });
  return out;
}

function spark(points, {label = "", max = null, from = null, to = null, step = null} = {}) {
  // points: [[ts, value], ...]; inline SVG polylines over [from, to] (default: the series' own span),
  // from 0 to `max` (a percentage: 100), else to the series' own largest value; one per segment.
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("viewBox", "0 0 100 40");
  svg.setAttribute("preserveAspectRatio", "none");
  svg.setAttribute("role", "img");
  svg.setAttribute("aria-label", label);
  if (points.length > 1) {
    const t0 = from ?? points[0][0], t1 = to ?? points[points.length - 1][0];
    const vs = points.map(p => p[1]);
    const lo = Math.min(...vs, 0), hi = max ?? Math.max(...vs, lo + 1e-9);
    for (const part of segments(points, step)) {
      const line = document.createElementNS(svg.namespaceURI, "polyline");
      const drawn = part.length > 1 ? part : [part[0], [part[0][0] + (t1 - t0) / 200, part[0][1]]];   // a lone point: a dot
      line.setAttribute("points", drawn.map(([t, v]) =>
        `${((t - t0) / (t1 - t0 || 1) * 100).toFixed(2)},${(38 - (v - lo) / (hi - lo) * 36).toFixed(2)}`).join(" "));
      svg.append(line);
    }
  }
  return svg;
}

// A vital field's unit, from its name (rss_mb, cpu_pct, run_ms): what the chart's figures are in.
const UNITS = {_pct: "%", _mb: "MB", _ms: "ms", _s: "s", _bytes: "bytes", _kb: "kB", " ok": "ok", _ok: "ok"};

function unitOf(key) {
  const found = Object.keys(UNITS).find(suffix => key.endsWith(suffix));
  return found ? UNITS[found] : "";
}

function figure(value, unit) {
  if (value === null || value === undefined) return "-";
  if (unit === "bytes") return value ? megabytes(value) : "0";
  if (unit === "ok") return value >= 0.5 ? "ok" : "failing";      // a probe's verdict: 1 or 0 (a bucket's mean)
  const text = Number.isInteger(value) || Math.abs(value) >= 100 ? value.toFixed(0) : value.toFixed(1);
  return unit === "%" ? text + "%" : unit ? `${text} ${unit}` : text;
}

// A chart with its axes: the value's range and unit on the left, the window's times below.
function chart(points, {label, unit = "", max = null, from, to, step = null}) {
  const vs = points.map(p => p[1]), hi = max ?? (vs.length ? Math.max(...vs) : null);
  const times = [from, (from + to) / 2, to].map(t => el("span", {}, when(t, {axis: to - from})));
  return el("div", {class: "plot"},
    el("div", {class: "yaxis muted small"}, el("span", {}, figure(hi, unit)), el("span", {}, figure(0, unit))),
    spark(points, {label: `${label}${unit ? ", " + unit : ""}`, max, from, to, step}),
    el("div", {class: "xaxis muted small"}, times));
}

// -- the overview ---------------------------------------------------------------------------------------

const FIELDS = ["state", "pid", "uptime", "crashes", "restarted", "last_exit", "heartbeat"];
const SIGNALS = {1: "SIGHUP", 2: "SIGINT", 6: "SIGABRT", 9: "SIGKILL", 11: "SIGSEGV", 15: "SIGTERM"};

function workerRow(w) {
  const x = w.last_exit;   // hung: pulsed's own abort is how it ended, not what went wrong
  const exit = !x ? "-" : x.why === "hung" ? "hung" : x.signal ? SIGNALS[x.signal] || `signal ${x.signal}`
    : x.code === null ? "unknown" : `code ${x.code}`;
  // crashes (restarted after a crash, a hang or a failed start) apart from the operator's restarts and reloads
  const cells = {state: w.state, pid: w.pid ?? "-", uptime: duration(w.uptime_s), crashes: w.crashes,
                 restarted: w.operator_restarts,
                 last_exit: exit, heartbeat: ago(w.heartbeat_age_s)};
  const act = (action) => workerButton(w, action);
  return el("tr", {"data-worker": w.name},
            el("th", {scope: "row"}, w.name),
            FIELDS.map(f => el("td", {"data-field": f, "data-label": f.replace("_", " "),
                                      class: f === "state" ? `state-${w.state}` : null}, String(cells[f]))),
            el("td", {class: "actions"}, act("restart"), " ", act("stop"), " ", act("start")));
}

// A button is enabled only when its action can apply to the worker's state now; its title says why
// not. The page never stops the web worker that serves it: pulsectl does (the server refuses too).
const CAN = {
  restart: (w) => !["stopping"].includes(w.state) || "it is stopping",
  stop: (w) => w.name === "web" ? "the page cannot stop its own web worker: run `pulsectl stop web` on the host"
             : !["stopped", "stopping"].includes(w.state) || `it is ${w.state}`,
  start: (w) => ["stopped", "failed"].includes(w.state) || `it is ${w.state}; start applies to a stopped or failed worker`,
};
const CONFIRM = {
  restart: (w) => `Restart ${w.name}? Its process is stopped and a new one started (pid ${w.pid ?? "-"}).`,
  stop: (w) => `Stop ${w.name}? It stays stopped, even across a reload, until you start it.`,
  start: (w) => `Start ${w.name}?`,
};

function whyNot(w, action) {
  const can = CAN[action](w);
  return can === true ? null : can;
}

function workerButton(w, action) {
  const why = whyNot(w, action);
  return el("button", {type: "button", "data-action": action, disabled: why ? "" : null, title: why,
                       onclick: () => { if (confirm(CONFIRM[action](w))) post("/api/workers", {action, worker: w.name}); }}, action);
}

// A critical process: its state, its tree's memory (figure and the last ten minutes), its latest health
// probe, its restarts and the last thing done about it (the reason on hover and below it).
const PROCESS_FIELDS = ["state", "uptime", "memory", "health", "config", "restarts", "last_action"];
const WIDE = ["memory", "config", "last_action"];     // a whole line of a card on a phone

// Its `config` files against their known-good copies, and its last restore (the diff summary on hover).
function configCell(c) {
  if (!c) return el("span", {class: "muted"}, "-");
  const off = c.files.filter(f => f.state === "changed" || f.state === "missing");
  const said = off.length ? el("span", {class: "bad", title: off.map(f => `${f.path}: ${f.state}`).join("\n")},
                               `${off.length} of ${c.files.length} changed`)
    : c.kept_at ? el("span", {class: "ok", title: c.files.map(f => f.path).join("\n")}, "known good")
    : el("span", {class: "muted"}, "not kept yet");
  return [said, c.pinned ? " (pinned)" : [], c.kept_at ? [" kept ", when(c.kept_at)] : [],
          c.restored_at ? el("div", {class: "muted small", title: c.restore_summary || ""},
                             `restored (${c.restore_why}, ${c.restore_state || "running"}) `, when(c.restored_at)) : []];
}

// Its state as the tick projects it (pulse.rules.processstate), why on hover; a backoff says until when.
const PROCESS_STATE_CLASS = {running: "ok", starting: "paused", paused: "paused", stopped: "paused", backoff: "paused",
                             unhealthy: "bad", fatal: "bad", dead: "bad", unknown: "muted"};

function processState(p) {
  return p.stopped ? "stopped" : p.state || (p.paused_until ? "paused" : p.alive === null ? "unknown" : p.alive ? "running" : "dead");
}

function processHealth(h) {
  if (!h) return el("span", {class: "muted"}, "-");
  const took = h.latency_ms === null || h.latency_ms === undefined ? "" : ` ${Math.round(h.latency_ms)} ms`;
  return el("span", {class: h.ok ? "ok" : "bad", title: h.error || ""}, h.ok ? `ok${took}` : `failing ${h.failing}${took}`);
}

function processCells(p, card = {}) {
  const state = processState(p), last = card.last_action, health = card.health;
  const points = card.memory || [], top = Math.max(p.max_mb ?? 0, ...points.map(q => q[1]));
  return {
    state: [el("span", {class: PROCESS_STATE_CLASS[state] || state, title: p.why || ""}, state),
            p.paused_until ? [" until ", when(p.paused_until)] : state === "backoff" && p.until ? [" until ", when(p.until)] : [],
            state === "fatal" && p.last_exit ? el("div", {class: "muted small", title: (p.last_exit.output || []).join("\n")},
                                                  p.why) : []],
    uptime: p.uptime_s === null || p.uptime_s === undefined ? el("span", {class: "muted"}, "-") : duration(p.uptime_s),
    memory: [el("span", {class: p.max_mb && p.rss_mb > p.max_mb ? "figure bad" : "figure"}, p.rss_mb === null || p.rss_mb === undefined ? "-" : `${Math.round(p.rss_mb)} MB`
                + (p.max_mb ? ` of ${p.max_mb}` : "")),
             spark(points, {label: `${p.name}: its tree's memory over ten minutes, MB`, max: top || null})],
    health: [p.health ? processHealth(p.health) : health ? el("span", {class: health.ok ? "ok" : "bad", title: health.error || ""},
                                                              health.ok ? "ok" : "failing") : el("span", {class: "muted"}, "-"),
             (card.latency || []).length ? spark(card.latency, {label: `${p.name}: its health probe's latency over ten minutes, ms`})
                                         : []],
    config: configCell(p.config),
    restarts: String(p.restarts ?? card.restarts ?? 0),
    last_action: last ? [el("span", {class: last.outcome, title: [last.reason, last.error].filter(Boolean).join(" · ")},
                            `${last.kind}${last.why ? ` (${last.why})` : ""} ${last.outcome}`), " ", when(last.ts),
                         last.reason || last.error ? el("div", {class: "muted small"}, last.error || last.reason) : []]
                       : el("span", {class: "muted"}, "-"),
  };
}

const PAUSE_DEFAULT = "30m";

// Pause applies to a process not paused, resume to a paused one; an empty answer to "how long"
// is the default (Cancel is no pause).
function processButton(p, action) {
  const paused = Boolean(p.paused_until);
  const why = action === "pause" ? (paused ? "it is paused already" : null) : (paused ? null : "it is not paused");
  return el("button", {type: "button", "data-action": action, disabled: why ? "" : null, title: why, onclick: () => {
    if (action === "pause") {
      const span = prompt(`Leave ${p.name} alone (no restarts) for how long? 90s, 30m, 2h, 1d (empty: ${PAUSE_DEFAULT})`, PAUSE_DEFAULT);
      if (span !== null) post("/api/processes", {action, process: p.name, for: span.trim() || PAUSE_DEFAULT});
    } else if (confirm(`Resume watching ${p.name}? Its rules may restart it again.`)) post("/api/processes", {action, process: p.name});
  }}, action);
}

// Restart, stop and start act as `pulsectl process restart|stop|start` do: a stopped process stays
// down (survival leaves it so, across restarts of Pulse) until it is started.
const PROCESS_CAN = {
  restart: (p) => true,
  stop: (p) => !p.stopped || "an operator stopped it already",
  start: (p) => p.stopped || p.alive === false || "it is running",
};
const PROCESS_CONFIRM = {
  restart: (p) => `Restart ${p.name}? Its process tree is stopped, then it is started again (pid ${p.pid ?? "-"}).`,
  stop: (p) => `Stop ${p.name}? It stays down, even across restarts of Pulse, until you start it.`,
  start: (p) => `Start ${p.name}?`,
};

function steerButton(p, action) {
  const can = PROCESS_CAN[action](p), why = can === true ? null : can;
  return el("button", {type: "button", "data-action": action, disabled: why ? "" : null, title: why,
                       onclick: () => { if (confirm(PROCESS_CONFIRM[action](p))) post("/api/processes", {action, process: p.name}); }},
            action);
}

// A row's buttons, made current: replaced only when the state they depend on changed.
function refreshButtons(row, fresh) {
  for (const b of row.querySelectorAll("button[data-action]")) {
    b.replaceWith(fresh.querySelector(`button[data-action="${b.dataset.action}"]`));
  }
}

function processRow(p, card) {
  const act = (action) => processButton(p, action), steer = (action) => steerButton(p, action);
  const cells = processCells(p, card);
  return el("tr", {"data-process": p.name},
            el("th", {scope: "row"}, p.name),
            PROCESS_FIELDS.map(f => el("td", {"data-field": f, "data-label": f.replace("_", " "),
                                             class: WIDE.includes(f) ? "wrap wide" : null}, cells[f])),
            el("td", {class: "actions"}, steer("restart"), " ", steer("stop"), " ", steer("start"), " ",
               act("pause"), " ", act("resume")));
}

// What a process row's buttons depend on: replaced when it changes.
const buttonsKey = (p) => JSON.stringify([Boolean(p.paused_until), Boolean(p.stopped), p.alive]);

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
    if (row.dataset.buttons !== buttonsKey(p)) {
      row.dataset.buttons = buttonsKey(p);
      refreshButtons(row, processRow(p, cards[p.name]));
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
      if (row.dataset.state !== w.state) {
        row.dataset.state = w.state;
        refreshButtons(row, fresh);
      }
    }
  }
  if (s) document.getElementById("pulsed").textContent = `pulsed pid ${s.supervisor.pid}, up ${duration(s.supervisor.uptime_s)}`;
  // issue 25: a full disk is said under the workers, in red, until there is room again
  const line = document.getElementById("pulsed");
  line.className = view.disk_full ? "bad" : "muted";
  if (view.disk_full) line.textContent += ` · ${view.disk_full}`;
  if (view.history) line.textContent += ` · ${view.history}`;
}

function renderOverview(view) {
  const main = document.querySelector("main"), s = view.status;
  if (!document.getElementById("workers")) {
    // the critical processes first: they are what the operator came for (a phone shows them on its first screen)
    main.replaceChildren(...["processes", "workers", "files", "dirs", "fresh", "engine", "host", "survival"].map(id =>
      el("section", {id, "aria-live": id === "workers" ? "polite" : null})));
  }
  refreshWorkers(view);
  refreshProcesses(view);
  refresh("files", "Watched files", s?.files, () => [s?.files?.length
    ? table(["watch", "matches", "largest", "max", "action", "last trim"], s.files.map(f => el("tr", {"data-watch": f.name},
        el("th", {scope: "row"}, f.name),
        el("td", {"data-label": "matches"}, f.files === null ? "-" : `${f.files} (${megabytes(f.bytes)})`,
           f.over ? el("span", {class: "bad"}, ` ${f.over} over`) : []),
        el("td", {"data-label": "largest", class: "wrap wide"}, f.largest ? `${megabytes(f.largest_bytes)} ${f.largest}` : "-"),
        el("td", {"data-label": "max"}, `${f.max_mb} MB`), el("td", {"data-label": "action"}, f.action),
        el("td", {"data-label": "last trim", class: f.last_trim_state || null},
           f.last_trim_at ? [`${f.last_trim_state} `, when(f.last_trim_at)] : "-"))), "cards")
    : el("p", {class: "muted"}, "none configured ([[watch.file]] in config.toml)")]);
  refresh("dirs", "Watched directories", s?.dirs, () => [s?.dirs?.length
    ? table(["watch", "dirs", "files", "oldest file", "bounds", "oldest", "last trim"], s.dirs.map(d => el("tr", {"data-watch": d.name},
        el("th", {scope: "row"}, d.name),
        el("td", {"data-label": "dirs"}, d.dirs === null ? "-" : `${d.dirs}`,
           d.over ? el("span", {class: "bad"}, ` ${d.over} over`) : [], d.refused ? el("span", {class: "bad"}, ` ${d.refused} refused`) : []),
        el("td", {"data-label": "files"}, d.dirs === null ? "-" : `${d.files} (${megabytes(d.bytes)})`),
        el("td", {"data-label": "oldest file"}, d.oldest_mtime ? when(d.oldest_mtime) : "-"),
        el("td", {"data-label": "bounds"}, [d.max_files !== null ? `${d.max_files} files` : null,
           d.max_mb !== null ? `${d.max_mb} MB` : null, d.max_age].filter(x => x).join(", ")),
        el("td", {"data-label": "oldest"}, d.oldest),
        el("td", {"data-label": "last trim", class: d.last_trim_state || null},
           d.last_trim_at ? [`${d.last_trim_state} `, when(d.last_trim_at)] : "-"))), "cards")
    : el("p", {class: "muted"}, "none configured ([[watch.dir]] in config.toml)")]);
  refresh("fresh", "Proof of work", s?.fresh, () => [s?.fresh?.length
    ? table(["watch", "state", "last work", "within", "restart", "looks at"], s.fresh.map(f => el("tr", {"data-fresh": f.name},
        el("th", {scope: "row"}, f.name),
        el("td", {"data-label": "state", class: f.stale === null ? "muted" : f.stale ? "bad" : "ok", title: f.error || ""},
           f.stale === null ? "-" : f.stale ? "stale" : "fresh"),
        el("td", {"data-label": "last work"}, f.changed_at ? when(f.changed_at)
           : f.age_s === null ? "-" : `none in ${duration(f.age_s)}`),
        el("td", {"data-label": "within"}, duration(f.within_s)), el("td", {"data-label": "restart"}, f.restart || "-"),
        el("td", {"data-label": "looks at", class: "wrap wide"}, f.what, f.value !== null ? el("span", {class: "muted"}, ` = ${f.value}`) : [],
           f.error ? el("div", {class: "bad small"}, f.error) : []))), "cards")
    : el("p", {class: "muted"}, "none configured ([[watch.fresh]] in config.toml)")]);
  const engine = s?.workers.find(w => w.name === "engine");
  refresh("engine", "Engine", [s?.engine_commit, engine?.state, view.last_promote], () => [el("p", {},
    "commit ", el("code", {"data-field": "engine-commit"}, s?.engine_commit?.slice(0, 12) || "-"),
    ", state ", el("span", {"data-field": "engine-state"}, engine?.state || "-"),
    ", last promote ", view.last_promote ? when(view.last_promote.ts) : "none")]);
  const to = Date.now() / 1000, from = to - 600;     // the overview's charts: the last ten minutes
  refresh("host", "Host, last ten minutes", view.vitals, () => [el("div", {class: "charts"}, Object.entries(view.vitals).map(([key, points]) =>
    el("div", {class: "chart", "data-vital": key},
       el("div", {}, key, " ", el("strong", {}, points.length ? figure(points[points.length - 1][1], "%") : "-")),
       chart(points, {label: key, unit: "%", max: 100, from, to, step: 5}))))]);
  refresh("survival", "Last survival actions", view.survival, () => [view.survival.length
    ? table(["when", "why", "kind", "target", "outcome"], view.survival.map(a => el("tr", {},
        el("td", {"data-label": "when", class: "wide"}, when(a.ts)), el("td", {"data-label": "why", class: "wide"}, a.why || "-"),
        el("td", {"data-label": "kind", class: "wide"}, a.count > 1 ? `${a.kind} ×${a.count}` : a.kind),
        el("td", {"data-label": "target"}, a.target || "-"),
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

// A task's id where a target names one: its link goes to the task's page.
const TASK_ID = /^task-[1-9][0-9]*$/;

function target(name) {
  if (name === null || name === undefined) return "-";
  return TASK_ID.test(name) ? el("a", {href: `/tasks/${name}`, title: "the task's page"}, name) : name;
}

// An event's data in one line a person can scan: key=value, spaced so it wraps between fields; a
// field that is a time (epoch seconds in the store) in the page's one time format.
const TIME_KEYS = /(^|_)(ts|at|time|now|created|deadline|until|since|started|ended|opened|last|expires|next_retry|slot|before)$/;

function isWallTime(k, v) {     // a named time, or a fractional number of seconds in 2001 … 2096
  return typeof v === "number" && v > 1e9 && v < 4e9 && (TIME_KEYS.test(k) || !Number.isInteger(v));
}

function dataValue(k, v) {
  if (isWallTime(k, v)) return localTime(toDate(v));
  return typeof v === "string" ? v : JSON.stringify(v, (kk, vv) => isWallTime(kk, vv) ? localTime(toDate(vv)) : vv);
}

function dataLine(data) {
  const text = Object.entries(data || {}).map(([k, v]) => `${k}=${dataValue(k, v)}`).join(" ");
  return text.length > 240 ? text.slice(0, 240) + " …" : text;
}

const EVENT_HEAD = ["id", "when", "type", "source", "target", "data"];

function eventRow(e) {
  return labelled(el("tr", {"data-event": e.id, class: /error|failed|hung|blocked/.test(e.type) ? "bad-row" : null},
            el("td", {}, el("a", {href: `/events/${e.id}`}, String(e.id))), el("td", {}, when(e.ts)),
            el("td", {}, e.type), el("td", {}, e.source), el("td", {}, target(e.target)),
            el("td", {class: "wrap wide"}, el("code", {}, dataLine(e.data)))), EVENT_HEAD);
}

function eventsPage() {
  const main = document.querySelector("main");
  const params = new URLSearchParams(location.search);
  const field = (name, label, extra = {}) => el("label", {}, label,
      el("input", {name, value: params.get(name) || "", ...extra}));
  const form = el("form", {class: "filters", method: "get"},
    field("type", "type", {list: "types"}), field("source", "source"), field("target", "target"),
    field("since", "since (10m, ISO)"), field("q", "search"), el("button", {type: "submit"}, "filter"));
  // the filters folded away until asked for (they filled a phone's first screen), open while one is set
  const filtered = ["type", "source", "target", "since", "q"].filter(k => params.get(k));
  const filters = el("details", {class: "filters-box", open: filtered.length ? "" : null},
    el("summary", {}, filtered.length ? `filtered by ${filtered.join(", ")}` : "filter"), form);
  const body = el("tbody"), pages = el("p", {class: "pages"});
  main.replaceChildren(section(params.get("before") ? `Events before #${params.get("before")}` : "Events, newest first",
    filters, el("table", {class: "cards"}, el("thead", {}, el("tr", {}, EVENT_HEAD.map(h => el("th", {scope: "col"}, h)))), body),
    pages));
  (FIRST ? Promise.resolve(FIRST) : getJSON("/api/events?" + params)).then(r => {
    form.append(el("datalist", {id: "types"}, r.types.map(t => el("option", {value: t}))));
    body.replaceChildren(...r.events.map(eventRow));
    if (r.error) say(r.error, true);
    const at = (before) => { const q = new URLSearchParams(params); before ? q.set("before", before) : q.delete("before"); return `?${q}`; };
    pages.replaceChildren(...[r.before ? el("a", {href: at(null)}, "newest") : "",
                              r.older ? el("a", {href: at(r.older), rel: "next"}, "older events") : ""].filter(Boolean)
                            .flatMap((a, i) => i ? [" · ", a] : [a]));
    if (r.before) return;           // a page back in the history: no live tail at its top
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
    el("p", {class: "muted small"}, "Times in your zone; a gap is time with no samples (pulsed was down)."),
    el("div", {class: "charts"}, Object.entries(r.series).map(([key, points]) => {
      const vs = points.map(p => p[1]), last = vs[vs.length - 1], unit = unitOf(key);
      const range = vs.length ? `${figure(Math.min(...vs), unit)} … ${figure(Math.max(...vs), unit)}` : "";
      return el("div", {class: "chart big", "data-vital": key}, el("div", {}, key, " ", el("strong", {}, figure(last, unit))),
                el("div", {class: "muted"}, `${range} · ${points.length} points`),
                chart(points, {label: key, unit, max: unit === "%" ? 100 : unit === "ok" ? 1 : null, from: r.since, to: r.now,
                               step: r.bucket_s}));
    }))));
}

async function effectsPage() {
  const r = await getJSON("/api/effects");
  document.querySelector("main").replaceChildren(...Object.entries(r.by_state).map(([state, rows]) =>
    section(`${state} (${rows.length})`, table(["id", "origin", "kind", "target", "age", "why"], rows.map(e =>
      el("tr", {"data-effect": e.id}, el("td", {}, el("code", {}, e.id.slice(0, 12))), el("td", {}, e.origin),
         el("td", {}, e.kind), el("td", {}, e.task ? target(e.task) : target(e.target)), el("td", {}, when(e.created, {relative: true})),
         el("td", {class: "wrap wide"}, e.why ?? "")))))));
}

// What a task event says, in words: a failure's reason and the CLI's own error (not just "agent").
function taskDetail(e) {
  const d = e.data;
  if (e.type === "task-failed") return [d.reason, d.error].filter(Boolean).join(": ") || "failed";
  if (e.type === "task-given-up") return d.reason || "given up";
  return d.agent ? `by ${d.agent}` : d.by ? `by ${d.by}` : "";
}

// A board column's heading: how many tasks are in it, and, for the ended ones (the page lists only the
// newest of those: issue 25), how many of them are shown.
function boardHeading(status, tasks, counts) {
  const n = (counts || {})[status] ?? tasks.length;
  return n > tasks.length ? `${status} (${n}, the newest ${tasks.length} shown)` : `${status} (${n})`;
}

async function tasksPage() {
  const r = await getJSON("/api/tasks");
  const main = document.querySelector("main");
  main.replaceChildren(
    section("Board", el("div", {class: "board"}, Object.entries(r.by_status).map(([status, tasks]) =>
      el("div", {"data-status": status}, el("h2", {}, boardHeading(status, tasks, r.counts)),
         el("ul", {}, tasks.map(t => el("li", {}, el("a", {href: `/tasks/${t.id}`, title: "the task's page"}, t.id), " ", t.title,
            el("div", {class: "muted"}, `${t.project} · ${t.agent || "unassigned"} · ${t.attempts} runs` +
               (t.pin ? ` · for ${t.pin}` : "") + (t.tags && t.tags.length ? ` · tags ${t.tags.join(", ")}` : "")),
            t.waiting ? el("div", {class: "waits", "data-waits": t.id}, `waiting: ${t.waiting.reason}: ${t.waiting.why}`) : ""))))))),
    section("Agents", table(["agent", "runs", "success", "mean duration", "cost"], r.agents.map(a =>
      el("tr", {}, el("td", {}, a.agent), el("td", {}, a.runs), el("td", {}, (a.success_rate * 100).toFixed(0) + "%"),
         el("td", {}, a.mean_run_s === null ? "-" : a.mean_run_s.toFixed(1) + "s"),
         el("td", {}, a.cost_usd === null ? "-" : "$" + a.cost_usd.toFixed(2)))))),
    section("History", table(["when", "task", "event", "detail"], r.history.map(e =>
      el("tr", {}, el("td", {}, when(e.ts)), el("td", {}, target(e.target)),
         el("td", {}, e.type), el("td", {class: "wrap"}, taskDetail(e)))))));
}

// What staging holds that main has not; after a rollback, a warning: the next promote ships it again.
function stagingNote(r) {
  const differs = r.staging_differs, last = r.history[0];
  if (!differs) return el("p", {class: "muted"}, "staging: git cannot say what it holds");
  if (!differs.length) return el("p", {class: "muted", "data-field": "staging"}, "staging: the same as main, nothing to promote");
  const files = differs.map(l => l.replace(/\s+/, " ")).join(", ");
  if (last && last.type === "rollback")
    return el("p", {class: "bad", "data-field": "staging"}, `staging still holds what was rolled back (${files}): `,
              "the next promote ships it again; fix or revert it in staging first");
  return el("p", {"data-field": "staging"}, `staging: a promote would change ${files}`);
}

// A rollback needs a promote to undo.
function canRollback(r) {
  return r.history.some(e => e.type === "promote");
}

function disabled(button, why) {
  button.disabled = true;
  button.title = why;
  return button;
}

async function enginePage() {
  const r = await getJSON("/api/engine");
  const act = (action) => el("button", {type: "button", "data-action": action,
      onclick: () => { if (confirm(`${action} the engine?`)) post("/api/engine", {action}); }}, action);
  document.querySelector("main").replaceChildren(
    section("Engine", el("p", {}, "running ", el("code", {}, (r.commit || "-").slice(0, 12)), " ",
                         r.staging_differs && !r.staging_differs.length
                           ? disabled(act("promote"), "staging holds nothing main has not: commit a change in staging first")
                           : act("promote"), " ",
                         canRollback(r) ? act("rollback") : disabled(act("rollback"), "nothing promoted yet: there is no earlier commit to go back to")),
            stagingNote(r)),
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
        el("td", {}, s.agent), el("td", {}, target(s.task)), el("td", {}, s.state), el("td", {}, s.calls),
        el("td", {}, s.blocked), el("td", {}, s.unverified.join(", ") || "-"), el("td", {}, when(s.last)))))),
    section("Blocked calls", table(["when", "session", "tool", "code", "reason"], r.blocked.map(e =>
      el("tr", {}, el("td", {}, when(e.ts)), el("td", {}, e.target), el("td", {}, e.data.tool),
         el("td", {}, e.data.code), el("td", {class: "wrap"}, e.data.reason))))));
}

// A log line's level, from the workers' format (`… LEVEL name: message`); a traceback's lines are errors.
const LOG_TIME = /^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z) (.*)$/s;
const LOG_LEVEL = /\b(CRITICAL|ERROR|WARNING|INFO|DEBUG)\b/;

// A traceback's lines (Python's, or faulthandler's dump of a hung worker) carry no level: they are errors.
const TRACEBACK = /^(Traceback|File "|Fatal Python error|Current thread|Thread 0x|\w+(Error|Exception)\b)/;

function logLevel(line) {
  const m = LOG_LEVEL.exec(line);
  if (m) return m[1];
  const said = line.replace(/^\S+ \S+\[\d+\]\s+/, "").trim();     // what follows "<time> <process>[<pid>]"
  return TRACEBACK.test(said) ? "ERROR" : "";
}

async function logPage() {
  const params = new URLSearchParams(location.search);
  const r = await getJSON("/api/log?" + params);
  const pick = el("select", {name: "worker", onchange: (e) => { location.search = e.target.value ? `?worker=${e.target.value}` : ""; }},
    el("option", {value: ""}, "every process"),
    r.processes.map(p => el("option", {value: p, selected: p === params.get("worker") ? "" : null}, p)));
  const lines = [...r.lines].reverse();       // newest first: what just happened is at the top
  const errors = lines.filter(l => ["ERROR", "CRITICAL"].includes(logLevel(l))).length;
  document.querySelector("main").replaceChildren(section("pulse.log, newest first", el("label", {}, "process ", pick),
    el("p", {class: errors ? "bad small" : "muted small"}, `${lines.length} lines, ${errors} errors (marked)`),
    el("div", {class: "log"}, lines.map(l => {
      const level = logLevel(l), bad = ["ERROR", "CRITICAL"].includes(level);
      const stamped = LOG_TIME.exec(l);     // the line's own UTC stamp, shown as every time on the page
      return el("div", {class: bad ? "line error" : level === "WARNING" ? "line warning" : "line",
                        "data-level": level || null}, bad ? el("strong", {class: "bad"}, "✖ ") : "",
                stamped ? [when(stamped[1]), " ", stamped[2]] : l);
    }))));
}

// -- one task: what `pulsectl task show` says (pulse.agents.taskview), the output as escaped text ---------

function money(usd) {
  return usd === null || usd === undefined ? "-" : "$" + usd.toFixed(4);
}

function tokens(counts) {
  const parts = Object.entries(counts || {}).sort().map(([k, v]) => `${v} ${k}`);
  return parts.length ? parts.join(", ") : "-";
}

async function taskPage() {
  const id = location.pathname.split("/").pop();
  const main = document.querySelector("main");
  const r = await fetch(`/api/tasks/${encodeURIComponent(id)}`, {credentials: "same-origin"}).then(x => x.json());
  if (r.error) {
    main.replaceChildren(section("No such task", el("p", {class: "bad"}, r.error)));
    return;
  }
  document.title = `Pulse · ${r.id}`;
  const facts = [["title", r.title], ["project", r.project], ["status", el("span", {class: r.status}, r.status.replace("_", " "))],
                 ["agent", r.agent || "-"], ["priority", String(r.priority)], ["created", when(r.created)],
                 ["updated", when(r.updated)], ["attempts", String(r.attempts)], ["cost", money(r.cost_usd)],
                 ["tokens", tokens(r.tokens)], ...(r.error ? [["last error", el("span", {class: "bad"}, r.error)]] : []),
                 ...(r.given_up ? [["given up", el("span", {class: "bad", "data-field": "given-up"}, r.given_up.why || "-")]] : []),
                 ...(r.waiting ? [["waiting", el("span", {class: "waits", "data-field": "waiting"},
                                                 `${r.waiting.reason}: ${r.waiting.why}`)]] : [])];
  const runs = r.runs.map(a => el("tr", {"data-attempt": a.attempt},
    el("td", {}, String(a.attempt)), el("td", {}, a.agent || "-"), el("td", {}, when(a.started || a.assigned)),
    el("td", {}, when(a.ended)), el("td", {class: a.outcome}, a.outcome),
    el("td", {class: "wrap"}, a.reason ? el("span", {}, el("strong", {}, a.reason), a.error ? ": " + a.error : "") : "-",
       (a.notices || []).map(n => el("div", {class: "waits", "data-notice": n.guard},
                                     `noticed, left running: ${n.guard}: ${n.detail}`))),
    el("td", {}, money(a.cost_usd)), el("td", {}, tokens(a.tokens)),
    el("td", {}, a.run_ms === null || a.run_ms === undefined ? "-" : figure(a.run_ms / 1000, "s"))));
  const calls = r.gate_calls.map(g => el("tr", {class: g.ok === false ? "bad-row" : null},
    el("td", {}, when(g.ts)), el("td", {}, g.phase || g.type), el("td", {}, g.tool || "-"),
    el("td", {class: g.ok === false ? "bad" : g.ok ? "ok" : null}, g.ok === null || g.ok === undefined ? "-" : g.ok ? "ok" : "refused"),
    el("td", {class: "wrap"}, g.reason || "-"), el("td", {}, el("a", {href: `/events/${g.id}`}, String(g.id)))));
  main.replaceChildren(
    section(`${r.id}: ${r.title}`, el("dl", {class: "facts", "data-task": r.id}, facts.map(([k, v]) => [el("dt", {}, k), el("dd", {}, v)])),
            el("p", {}, el("a", {href: `/events?target=${r.id}`}, "its events"))),
    section("Prompt", el("pre", {class: "text", "data-field": "prompt"}, r.prompt)),
    section("Attempts", table(["#", "agent", "started", "ended", "outcome", "reason", "cost", "tokens", "took"], runs)),
    section("Output of the last attempt", r.output_text === null
      ? el("p", {class: "muted"}, "no output kept")
      : el("pre", {class: "text", "data-field": "output"}, r.output_text)),
    section(`Gate calls (${r.gate_calls.length})`, table(["when", "phase", "tool", "ok", "reason", "event"], calls)));
}

// The schedules: what each runs and when, its last run, the run it waits on (one open run at a time),
// the slots it skipped, its failures in a row.
async function schedulesPage() {
  const r = await getJSON("/api/schedules");
  document.querySelector("main").replaceChildren(section("Schedules", r.schedules.length === 0
    ? el("p", {class: "muted"}, "none configured ([[schedule]] in config.toml)")
    : table(["schedule", "when", "makes", "next run", "last run", "runs", "skipped", "failed"], r.schedules.map(s =>
        el("tr", {"data-schedule": s.name}, el("th", {scope: "row"}, s.name),
           el("td", {"data-label": "when"}, s.spec.cron || `every ${s.spec.every}`), el("td", {"data-label": "makes"}, s.makes),
           el("td", {"data-label": "next run", class: s.open_run ? "pending" : null},
              s.open_run ? ["after ", target(s.open_run)] : when(s.next_run)),
           el("td", {"data-label": "last run"}, s.last_run ? [when(s.last_run_ts), " ", target(s.last_run)] : "-"),
           el("td", {"data-label": "runs"}, String(s.runs + s.manual_runs)),
           el("td", {"data-label": "skipped"}, String(s.skipped)),
           el("td", {"data-label": "failed", class: s.failing ? "bad" : null},
              s.failures_in_row ? `${s.failures_in_row} in a row` : "-"))), "cards")));
}

// Spend against the limits: today and this month in dollars, runs in the last hour; over a limit in red,
// with the tasks that wait on it.
function spent(used, limit) {
  const dollars = (v) => "$" + v.toFixed(2);
  if (limit === null || limit === undefined) return dollars(used);
  return el("span", {class: used >= limit ? "bad" : used >= 0.8 * limit ? "pending" : null}, `${dollars(used)} of ${dollars(limit)}`);
}

async function budgetPage() {
  const r = await getJSON("/api/budget");
  document.querySelector("main").replaceChildren(section("Budget", table(
    ["agent", "today", "this month", "runs last hour", "no cost reported", "waiting"], r.rows.map(b =>
      el("tr", {"data-agent": b.agent}, el("th", {scope: "row"}, b.agent === "*" ? "host (all agents)" : b.agent),
         el("td", {"data-label": "today"}, spent(b.today_usd, b.usd_per_day)),
         el("td", {"data-label": "this month"}, spent(b.month_usd, b.usd_per_month)),
         el("td", {"data-label": "runs last hour", class: b.runs_per_hour !== null && b.runs_last_hour >= b.runs_per_hour ? "bad" : null},
            b.runs_per_hour === null ? String(b.runs_last_hour) : `${b.runs_last_hour} of ${b.runs_per_hour}`),
         el("td", {"data-label": "no cost reported"}, String(b.runs_without_cost)),
         el("td", {"data-label": "waiting", class: "wrap wide"}, b.waiting_tasks.length
            ? b.waiting_tasks.flatMap((t, i) => i ? [", ", target(t)] : [target(t)]) : "-"))), "cards"),
    el("p", {class: "muted small"}, "Limits: [[agent]] budget and [budget] in config.toml; pulsectl budget reset AGENT forgives.")),
    (r.sessions || []).length ? section("Sessions Pulse did not start", table(
      ["session", "today", "this month", "counted"], r.sessions.map(s =>
        el("tr", {"data-session": s.session || "*"},
           el("th", {scope: "row"}, s.counted ? `${s.service || "session"} ${s.session}` : "without the receiver's token"),
           el("td", {"data-label": "today"}, money(s.today_usd)), el("td", {"data-label": "this month"}, money(s.month_usd)),
           el("td", {"data-label": "counted", class: "wrap"}, s.counted ? "against the host's [budget]"
              : "no: anyone local can send that; send the token of telemetry.token"))), "cards"),
      el("p", {class: "muted small"}, "Their own telemetry, sent to Pulse's receiver; Pulse never ends them.")) : "");
}

// -- start --------------------------------------------------------------------------------------------------

// the fleet: a host links to its own page where it advertises one; a host gone from the fleet is red,
// and a host not up shows no counts: its last summary says what it was, not what runs there now
function fleetRow(h) {
  const name = h.web_url ? el("a", {href: h.web_url}, h.host) : h.host;
  const up = h.state === "up";
  return el("tr", {"data-host": h.host, class: h.state === "gone" ? "bad" : null},
    el("td", {}, name), el("td", {}, h.state), el("td", {}, up ? `${h.workers_running}/${h.workers_total}` : "-"),
    el("td", {}, up ? `${h.processes_healthy}/${h.processes_total}` : "-"), el("td", {}, up ? h.open_effects ?? "-" : "-"),
    el("td", {}, up ? `${h.agents_busy}/${h.agents_busy + h.agents_free}` : "-"),
    el("td", {class: "wrap"}, h.agents?.length ? h.agents.map(fleetAgent) : "-"), el("td", {}, ago(h.last_seen_age_s)));
}

// a fleet task this host offered or took; a dead-lettered one is red, with why
function fleetTaskRow(t) {
  return el("tr", {"data-fleet-task": t.fleet_id, "data-role": t.role, class: t.dead ? "bad-row" : null},
    el("td", {}, t.fleet_id), el("td", {}, t.role), el("td", {}, t.title || "-"),
    el("td", {class: t.dead ? "bad" : t.state === "acked" ? "ok" : null}, t.dead ? "dead-lettered" : t.state),
    el("td", {}, t.host || "-"), el("td", {}, t.agent || "-"), el("td", {class: "wrap"}, t.outcome || "-"));
}

// an agent of a host: busy/slots, [tags], (projects); red with why when a spend limit holds it
function fleetAgent(a) {
  const words = `${a.name} ${a.busy}/${a.slots}` + (a.tags?.length ? ` [${a.tags.join(",")}]` : "") +
    (a.projects ? ` (${a.projects.join(",")})` : "");
  return el("div", {"data-agent": a.name, class: a.budget ? "bad" : null},
            a.budget ? `${words} held: ${a.budget}` : a.budget_known === false ? `${words} budget unknown` : words);
}

async function fleetPage() {
  const draw = async () => {
    const r = await getJSON("/api/fleet");
    document.querySelector("main").replaceChildren(section("Fleet",
      r.error ? el("p", {class: "muted"}, r.error) : r.stale
        ? el("p", {class: "bad"}, `as seen by ${r.host} ${Math.round(r.age_s)} s ago: not refreshed within the presence ` +
             "TTL (NATS unreachable? the overview says why), so the other hosts are unknown")
        : el("p", {class: "muted"}, `as seen by ${r.host}`),
      table(["host", "state", "workers", "processes", "open effects", "agents busy", "agents", "last seen"],
            r.hosts.map(fleetRow))),
      section("Fleet tasks", (r.tasks || []).length === 0 ? el("p", {class: "muted"}, "no fleet task offered or taken here")
        : table(["fleet id", "here", "title", "state", "host", "agent", "outcome"], r.tasks.map(fleetTaskRow))));
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
// A page rendered by the server marks its times <time data-ts=…>: shown here like every other time.
for (const t of document.querySelectorAll("time[data-ts]")) t.replaceWith(when(Number(t.dataset.ts)));
const PAGES = {overview: () => { if (FIRST) renderOverview(FIRST); return live("/api/stream/overview", renderOverview); },
               events: eventsPage, vitals: vitalsPage,
               effects: effectsPage, tasks: tasksPage, task: taskPage, engine: enginePage, gate: gatePage, log: logPage,
               fleet: fleetPage, schedules: schedulesPage, budget: budgetPage};
Promise.resolve(PAGES[PAGE]?.()).catch(err => say(String(err), true));
