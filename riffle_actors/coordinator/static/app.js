// The coordinator's status page: reads the JSON API every PERIOD_MS and redraws three tables.
// No framework and no external resource: everything comes from this coordinator.
"use strict";

const PERIOD_MS = 5000;

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key === "class") node.className = value; else node.setAttribute(key, value);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function bytes(n) {
  if (!n) return "0 B";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

function when(ms) {
  if (!ms) return "";
  return new Date(ms).toLocaleString();
}

function ago(seconds) {
  if (seconds === undefined || seconds === null) return "";
  if (seconds < 60) return `${seconds.toFixed(1)} s ago`;
  return `${Math.round(seconds / 60)} min ago`;
}

function bar(fraction) {
  const pct = Math.max(0, Math.min(100, Math.round(fraction * 100)));
  const fill = el("i");
  fill.style.width = `${pct}%`; // CSSOM, not a style attribute: the page's CSP forbids inline styles
  return el("span", { class: "bar", title: `${pct}%` }, fill);
}

// apps per server: the live apps whose assignments use it (the coordinator's view), or what the
// server's heartbeat lists, whichever is larger
function serverRow(s, appsOn) {
  const total = s.used_memory + s.available_memory;
  const disks = el("td");
  for (const d of s.disks) {
    const used = d.capacity ? d.used_bytes / d.capacity : 0;
    disks.append(el("div", { class: "disk" + (d.status === "NORMAL" ? "" : " bad") },
      bar(used), `${d.mount_point} ${bytes(d.used_bytes)} / ${bytes(d.capacity)} ${d.status}`));
  }
  const tags = el("td");
  for (const t of s.tags) tags.append(el("span", { class: "tag" }, t));
  return el("tr", { "data-server-id": s.id },
    el("td", {}, s.id),
    el("td", {}, el("span", { class: `status ${s.status}` }, s.status)),
    el("td", {}, bar(total ? s.used_memory / total : 0), `${bytes(s.used_memory)} / ${bytes(total)}`),
    disks,
    el("td", { class: "num" }, Math.max(s.app_count, appsOn[s.id] || 0)),
    el("td", { class: "num" }, s.total_assigned_partitions),
    integrity(s),
    tags,
    el("td", {}, ago(s.heartbeat_age_s)),
    el("td", {}, s.version || ""));
}

// block integrity (docs/faults.md "Integrity"): blocks found corrupt on disk (scrubber or read check), and
// blocks refused at ingest for a crc mismatch that the client resent intact ("repaired")
function integrity(s) {
  const corrupt = s.corrupt_blocks || 0;
  return el("td", { class: "num integrity" + (corrupt ? " bad" : ""),
                    title: `refused at ingest ${s.refused_blocks || 0}, corrupt reads refused ${s.corrupt_reads_refused || 0}` },
    `${corrupt} / ${s.repaired_blocks || 0}`);
}

// the servers grouped by host (IP): a multi-worker riffle-server host registers one server per
// worker (one IP, several ports); a host row says how many and their memory together
function hostRows(servers, appsOn) {
  const hosts = new Map();
  for (const s of [...servers].sort((a, b) => (a.ip < b.ip ? -1 : a.ip > b.ip ? 1 : a.grpc_port - b.grpc_port))) {
    if (!hosts.has(s.ip)) hosts.set(s.ip, []);
    hosts.get(s.ip).push(s);
  }
  const rows = [];
  for (const [ip, group] of hosts) {
    const used = group.reduce((n, s) => n + s.used_memory, 0);
    const total = group.reduce((n, s) => n + s.used_memory + s.available_memory, 0);
    const active = group.filter((s) => s.status === "ACTIVE").length;
    rows.push(el("tr", { class: "host", "data-host": ip },
      el("td", { colspan: 10 }, `host ${ip}: ${group.length} server${group.length === 1 ? "" : "s"}, `
        + `${active} active, memory ${bytes(used)} / ${bytes(total)}`)));
    for (const s of group) rows.push(serverRow(s, appsOn));
  }
  return rows;
}

function appRow(a, historical) {
  return el("tr", { "data-app-id": a.app_id },
    el("td", {}, a.app_id), el("td", {}, a.user),
    el("td", { class: "num" }, a.shuffles), el("td", { class: "num" }, a.partitions),
    el("td", {}, a.servers.join(", ")),
    el("td", {}, when(a.registered_ms)),
    el("td", {}, when(historical ? a.expired_ms : a.last_heartbeat_ms)));
}

function fill(id, rows, empty, columns) {
  const body = document.querySelector(`#${id} tbody`);
  body.replaceChildren(...(rows.length ? rows : [el("tr", {}, el("td", { colspan: columns, class: "muted" }, empty))]));
}

async function getJson(path) {
  const response = await fetch(path, { cache: "no-store" });
  if (!response.ok) throw new Error(`${path}: HTTP ${response.status}`);
  return response.json();
}

async function refresh() {
  try {
    const [health, servers, apps, history] = await Promise.all([
      getJson("/api/health"), getJson("/api/servers"), getJson("/api/apps"), getJson("/api/historical_apps")]);
    const byStatus = {};
    for (const s of servers) byStatus[s.status] = (byStatus[s.status] || 0) + 1;
    const summary = document.getElementById("summary");
    summary.replaceChildren(
      el("span", {}, `${servers.length} servers`),
      ...Object.entries(byStatus).map(([k, v]) => el("span", {}, el("span", { class: `status ${k}` }, k), ` ${v}`)),
      el("span", {}, `${apps.length} apps`),
      el("span", { class: "muted" }, `version ${health.version}, up ${Math.round(health.uptime_s)} s`));
    document.getElementById("server-count").textContent = `(${servers.length})`;
    document.getElementById("app-count").textContent = `(${apps.length})`;
    document.getElementById("history-count").textContent = `(${history.length})`;
    const appsOn = {};
    for (const a of apps) for (const id of a.servers) appsOn[id] = (appsOn[id] || 0) + 1;
    fill("servers", hostRows(servers, appsOn), "no server registered", 10);
    fill("apps", apps.map((a) => appRow(a, false)), "no live application", 7);
    fill("history", history.map((a) => appRow(a, true)), "no expired application", 7);
    document.getElementById("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
    document.body.dataset.loaded = "true";
  } catch (err) {
    const summary = document.getElementById("summary");
    summary.replaceChildren(el("span", { class: "error" }, `cannot reach the coordinator: ${err.message}`));
  }
}

document.getElementById("period").textContent = String(PERIOD_MS / 1000);
refresh();
setInterval(refresh, PERIOD_MS);
