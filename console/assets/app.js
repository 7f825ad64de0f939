// The Aether console: a read-only page over the registrar's /ui/api. It
// follows /ui/api/events (server-sent events): on "change" it re-reads
// what it shows, on "rate" it redraws the events-per-second chart. No
// framework, no network beyond the registrar: it works offline.
"use strict";

const api = "api/";
let route = { view: "overview", arg: "" };
let inflight = false, again = false;

// el builds a DOM element; text goes in as text, never as HTML.
function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null) continue;
    if (k === "class") e.className = v; else e.setAttribute(k, v);
  }
  for (const k of kids.flat(Infinity)) {
    if (k === undefined || k === null) continue;
    e.append(k instanceof Node ? k : document.createTextNode(String(k)));
  }
  return e;
}

function secs(s) {
  if (s === undefined || s === null || s < 0) return "-";
  if (s < 1) return (s * 1000).toFixed(0) + "ms";
  if (s < 120) return s.toFixed(1) + "s";
  if (s < 7200) return (s / 60).toFixed(1) + "m";
  if (s < 172800) return (s / 3600).toFixed(1) + "h";
  return (s / 86400).toFixed(1) + "d";
}

function table(id, headers, rows) {
  return el("table", { id },
    el("thead", {}, el("tr", {}, headers.map(h => el("th", { class: /^[#≥]|count|serving|draining|nodes|endpoints|weight|age|lag|remaining/i.test(h) ? "num" : null }, h)))),
    el("tbody", {}, rows));
}

function td(v, cls) { return el("td", { class: cls }, v); }
function num(v) { return el("td", { class: "num" }, v); }

async function get(path) {
  const res = await fetch(api + path, { cache: "no-store" });
  if (!res.ok) throw new Error(path + ": " + res.status + " " + (await res.text()));
  return res.json();
}

function parseRoute() {
  const h = decodeURIComponent(location.hash.replace(/^#\/?/, ""));
  const [view, ...rest] = h.split("/");
  route = { view: view || "overview", arg: rest.join("/") };
  for (const a of document.querySelectorAll("nav a")) {
    a.classList.toggle("active", a.id === "nav-" + route.view);
  }
}

// refresh re-reads the current view; changes arriving meanwhile cause one
// more read once it is done, so a burst costs at most two.
async function refresh() {
  if (inflight) { again = true; return; }
  inflight = true;
  try {
    do {
      again = false;
      await render();
    } while (again);
  } catch (e) {
    document.getElementById("view").replaceChildren(el("div", { class: "card", id: "error" }, String(e)));
  } finally {
    inflight = false;
  }
}

async function render() {
  const ov = await get("overview");
  header(ov);
  const view = document.getElementById("view");
  let content;
  switch (route.view) {
    case "services":
      content = route.arg ? await serviceView(route.arg) : await servicesView();
      break;
    case "nodes": content = await nodesView(); break;
    case "xds": content = await xdsView(); break;
    default: content = overviewView(ov);
  }
  if (route.view === "services" && !route.arg) {
    // Keep the search box (and its focus) across refreshes.
    // Moving a focused element blurs it, so the box stays where it is
    // and only the list beside it is replaced.
    let box = document.getElementById("search");
    const old = document.getElementById("services-list");
    if (!box || !view.contains(box) || !old) {
      box = el("input", { type: "search", id: "search", placeholder: "search services", autocomplete: "off" });
      box.addEventListener("input", () => filterServices());
      view.replaceChildren(box, content);
    } else {
      old.replaceWith(content);
    }
    filterServices();
  } else {
    view.replaceChildren(content);
  }
  document.getElementById("version").textContent = ov.replica.version || "-";
  document.getElementById("updated").textContent = new Date().toLocaleTimeString();
  document.body.dataset.version = ov.replica.version || "";
}

function header(ov) {
  const r = ov.replica;
  document.getElementById("replica").textContent =
    `${r.region} / ${r.cluster}${r.zone ? " / " + r.zone : ""} · ${r.grpc_addr || ""}`;
  const b = document.getElementById("ready");
  b.textContent = r.ready ? "READY" : "NOT READY";
  b.className = "badge " + (r.ready ? "ok" : "bad");
}

function overviewView(ov) {
  const r = ov.replica, be = ov.backend, t = ov.totals;
  const kv = (pairs) => el("dl", {}, pairs.map(([k, v, id]) => [el("dt", {}, k), el("dd", { id }, v)]));
  const cards = el("div", { class: "grid" },
    el("div", { class: "card" }, el("h2", {}, "Replica"), kv([
      ["region", r.region], ["cluster", r.cluster], ["zone", r.zone || "-"],
      ["gRPC", r.grpc_addr || "-"], ["HTTP", r.http_addr || "-"], ["xDS", r.xds_addr || "off"],
      ["version", r.version || "-"], ["ready", r.ready ? "yes" : "no", "replica-ready"],
    ]), el("ul", { class: "checks" }, ov.checks.map(c =>
      el("li", {}, el("span", { class: "badge " + (c.ok ? "ok" : "bad") }, c.ok ? "ok" : "failed"), " ", c.name, c.detail ? ": " + c.detail : "")))),
    el("div", { class: "card" }, el("h2", {}, "Backend"), kv([
      ["kind", be.kind || "-", "backend-kind"], ["endpoints", (be.endpoints || []).join(", ") || "-"],
      ["health", be.healthy ? "healthy" : "flush failing", "backend-health"],
      ["unpersisted", String(be.pending), "backend-pending"],
      ["persistence lag", secs(be.oldest_unpersisted_seconds), "backend-lag"],
      ["stuck", be.stuck ? `yes (over ${secs(be.stuck_after_seconds)})` : "no", "backend-stuck"],
      ["isolated writes", String(be.isolated_writes)],
      ["last flush error", be.last_flush_error || "-"],
    ])),
    el("div", { class: "card" }, el("h2", {}, "Plane"),
      el("div", { class: "big" }, el("span", { id: "total-endpoints" }, t.endpoints), " endpoints"),
      kv([["services", String(t.services), "total-services"], ["serving", String(t.serving), "total-serving"],
        ["draining", String(t.draining), "total-draining"], ["nodes", String(t.nodes), "total-nodes"]])),
    el("div", { class: "card" }, el("h2", {}, "Events per second, last 5 minutes"),
      chart("rate-chart", ov.events.per_second), el("div", { class: "muted" }, "total ", el("span", { id: "events-total" }, ov.events.total))),
    el("div", { class: "card" }, el("h2", {}, "Cross-replica propagation, max ms per second"),
      chart("prop-chart", ov.propagation.max_millis),
      el("div", { class: "muted" }, el("span", { id: "prop-samples" }, ov.propagation.samples),
        " writes of other replicas measured while this page is open")));
  const regionRows = [];
  for (const reg of ov.regions) for (const c of reg.clusters) {
    regionRows.push(el("tr", { "data-region": reg.name, "data-cluster": c.name },
      td(reg.name), td(c.name), num(c.endpoints), num(c.serving), num(c.draining), num(c.nodes)));
  }
  const parts = [cards, el("h3", {}, "Regions and clusters"),
    table("regions", ["region", "cluster", "endpoints", "serving", "draining", "nodes"], regionRows)];
  if (ov.replication.enabled) {
    parts.push(el("h3", {}, "Replication peers"), table("peers",
      ["region", "reachable", "synced", "leader", "lag", "lease remaining", "keys", "last error"],
      (ov.replication.peers || []).map(p => el("tr", {}, td(p.region), td(p.reachable ? "yes" : "no"), td(p.synced ? "yes" : "no"),
        td(p.is_leader ? "this replica" : (p.leader || "-")), num(secs(p.lag_seconds)), num(secs(p.lease_ttl_remaining_seconds)),
        num(p.keys_mirrored), td(p.last_error || "")))));
  }
  if (ov.replicas.peer_watch) {
    parts.push(el("h3", {}, "Replicas of this cluster"), table("replicas",
      ["address", "epoch", "peer-watch stream", "since", "writes received"],
      (ov.replicas.peers || []).map(p => el("tr", { "data-addr": p.addr }, td(p.addr), td(p.epoch),
        td(p.connected ? "connected" : "not connected"), td(p.since), num(p.writes_received)))));
  }
  if (ov.xds.enabled) {
    parts.push(el("h3", {}, "xDS"), el("div", { class: "card", id: "xds-summary" },
      `${ov.xds.clients} clients: ${ov.xds.synced} synced, ${ov.xds.stale} stale, ${ov.xds.nacked} nacked`));
  }
  return el("div", { id: "overview" }, parts);
}

// chart draws a series (one value a second) as an inline SVG polyline.
function chart(id, series) {
  const W = 300, H = 110, pad = 22;
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.setAttribute("class", "chart");
  svg.setAttribute("id", id);
  const peak = Math.ceil(Math.max(1, ...series));
  const pts = series.map((v, i) => {
    const x = pad + (W - pad - 4) * i / Math.max(1, series.length - 1);
    const y = H - 14 - (H - 24) * v / peak;
    return x.toFixed(1) + "," + y.toFixed(1);
  }).join(" ");
  const add = (tag, attrs, text) => {
    const e = document.createElementNS(ns, tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    svg.append(e);
  };
  add("line", { class: "axis", x1: pad, y1: H - 14, x2: W - 4, y2: H - 14 });
  add("line", { class: "axis", x1: pad, y1: 6, x2: pad, y2: H - 14 });
  add("text", { x: 0, y: 12 }, String(peak));
  add("text", { x: 0, y: H - 14 }, "0");
  add("text", { x: pad, y: H - 2 }, "-5m");
  add("text", { x: W - 24, y: H - 2 }, "now");
  add("polyline", { points: pts });
  return svg;
}

let servicesCache = [];
async function servicesView() {
  const doc = await get("services");
  servicesCache = doc.services;
  return el("div", { id: "services-list" });
}

function filterServices() {
  const box = document.getElementById("search");
  const q = box ? box.value.trim().toLowerCase() : "";
  const host = document.getElementById("services-list");
  if (!host) return;
  const rows = servicesCache.filter(s => !q || s.name.toLowerCase().includes(q)).map(s =>
    el("tr", { "data-service": s.name },
      td(el("a", { href: "#/services/" + encodeURIComponent(s.name) }, s.name)),
      num(s.endpoints), num(s.serving), num(s.draining), num(s.nodes),
      td(s.localities.map(l => el("div", {}, `${l.region}/${l.zone || "-"}: ${l.serving} serving, ${l.draining} draining`)))));
  host.replaceChildren(table("services", ["service", "endpoints", "serving", "draining", "nodes", "per locality"], rows),
    el("div", { class: "muted", id: "services-count" }, `${rows.length} of ${servicesCache.length} services`));
}

async function serviceView(name) {
  const doc = await get("services/" + encodeURIComponent(name));
  const s = doc.service;
  const rows = doc.endpoints.map(e => el("tr", { "data-endpoint": e.ip, "data-protocol": e.protocol, "data-state": e.state },
    td(e.ip), td(e.protocol), td(e.ports.join(", ")), td(e.state, e.state), td(e.node || "-"),
    td(e.region), td(e.cluster), td(e.zone || "-"), num(e.weight), num(secs(e.age_seconds))));
  return el("div", { id: "service" },
    el("h3", {}, el("a", { href: "#/services" }, "Services"), " / ", el("span", { id: "service-name" }, name)),
    el("p", { id: "service-summary" }, `${s.endpoints} endpoints: ${s.serving} serving, ${s.draining} draining`),
    table("endpoints", ["address", "protocol", "ports", "state", "node", "region", "cluster", "zone", "weight", "age"], rows),
    rows.length ? null : el("p", { class: "muted", id: "no-endpoints" }, "no endpoints"));
}

async function nodesView() {
  const doc = await get("nodes");
  const rows = doc.nodes.map(n => el("tr", { "data-node": n.name },
    td(n.name), td(n.region), td(n.cluster), td(n.site || "-"), td(n.address || "-"),
    td(n.health, n.healthy ? "SERVING" : "DRAINING"), num(`${n.endpoints_held_serving}/${n.endpoints_held}`),
    num(secs(n.heartbeat_age_seconds)), num(secs(n.lease_remaining_seconds))));
  return el("div", { id: "nodes" }, table("nodes-table",
    ["node", "region", "cluster", "site", "address", "health", "serving/held", "heartbeat age", "lease remaining"], rows),
    el("div", { class: "muted" }, `${rows.length} nodes`));
}

async function xdsView() {
  const doc = await get("xds");
  if (!doc.enabled) return el("div", { class: "card", id: "xds-off" }, "The xDS feed is off on this registrar (no --xds-addr).");
  const types = ["CDS", "EDS", "LDS", "RDS"];
  const short = (url) => ({ Cluster: "CDS", ClusterLoadAssignment: "EDS", Listener: "LDS", RouteConfiguration: "RDS" })[url.split(".").pop()];
  const rows = doc.clients.map(c => {
    const by = {};
    for (const [url, ts] of Object.entries(c.types || {})) by[short(url)] = ts;
    return el("tr", { "data-xds-node": c.node }, td(c.node), td(c.variant + (c.service !== "ads" ? "/" + c.service : "")),
      types.map(t => by[t] ? td(`${by[t].state} ${by[t].acked_version || ""}`, by[t].state) : td("-")));
  });
  return el("div", { id: "xds" }, table("xds-table", ["node", "variant", ...types], rows));
}

function connect() {
  const live = document.getElementById("live");
  const es = new EventSource(api + "events");
  es.addEventListener("open", () => { live.textContent = "live"; live.className = "badge ok"; });
  es.addEventListener("error", () => { live.textContent = "reconnecting"; live.className = "badge warn"; });
  es.addEventListener("change", () => refresh());
  es.addEventListener("rate", (m) => {
    const r = JSON.parse(m.data);
    const old = document.getElementById("rate-chart");
    if (old) old.replaceWith(chart("rate-chart", r.per_second));
    const tot = document.getElementById("events-total");
    if (tot) tot.textContent = r.total;
    const prop = document.getElementById("prop-chart");
    if (prop) prop.replaceWith(chart("prop-chart", r.propagation.max_millis));
    const ps = document.getElementById("prop-samples");
    if (ps) ps.textContent = r.propagation.samples;
  });
}

window.addEventListener("hashchange", () => { parseRoute(); refresh(); });
parseRoute();
connect();
refresh();
// Node heartbeats and lease ages are not endpoint events: the nodes and
// xDS views also re-read every 5s.
setInterval(() => { if (route.view === "nodes" || route.view === "xds") refresh(); }, 5000);
