// packhorse dashboard: plain JavaScript over the HTTP API. Every value from the server is
// inserted as text (never as HTML). Observers see what is stuck; admins also get the
// diagnose / reset / breaker controls (the server enforces the roles either way).
"use strict";
(function () {
  let cfg = {};
  try { cfg = JSON.parse(document.getElementById("packhorse-config").textContent); } catch (e) { cfg = {}; }
  const refreshMs = Math.max(0.2, Number(new URLSearchParams(location.search).get("refresh") || cfg.refreshSeconds || 5)) * 1000;
  const KINDS = ["raw_data_package", "data_transfer_package", "transfer", "unpack", "long_term_archive", "staging", "deletion", "fixity_check"];
  const STATUSES = ["PENDING", "SCHEDULED", "IN_PROGRESS", "COMPLETED", "FAILED"];
  let token = sessionStorage.getItem("packhorse-token") || "";
  let role = null;
  let timer = null;
  let openReport = null; // {kind, id}
  const $ = (id) => document.getElementById(id);

  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") e.className = v;
      else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
      else if (v !== undefined && v !== null) e.setAttribute(k, v);
    }
    for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(c === null || c === undefined ? "" : String(c)));
    return e;
  }
  function fill(table, head, rows) {
    table.replaceChildren(el("tr", {}, ...head.map((h) => el("th", {}, h))), ...rows);
  }
  function bytes(n) {
    const u = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let i = 0; let x = Number(n);
    while (x >= 1024 && i < u.length - 1) { x /= 1024; i++; }
    return (i ? x.toFixed(1) : String(x)) + " " + u[i];
  }
  async function api(method, path, body) {
    const opts = { method, headers: { Authorization: "Bearer " + token } };
    if (body !== undefined) { opts.headers["Content-Type"] = "application/json"; opts.body = JSON.stringify(body); }
    const r = await fetch(path, opts);
    let data = null;
    try { data = await r.json(); } catch (e) { data = null; }
    if (!r.ok) { const err = new Error((data && data.detail) ? (typeof data.detail === "string" ? data.detail : JSON.stringify(data.detail)) : r.statusText); err.status = r.status; throw err; }
    return data;
  }

  async function signIn() {
    $("whoami").textContent = "";
    role = null;
    if (!token) { showNotice("Enter an API token (packhorse token create --role observer --name NAME) to see the pipeline."); return; }
    try {
      const me = await api("GET", "/api/whoami");
      role = me.role;
      $("whoami").replaceChildren(el("span", { class: "role" }, me.role), " " + me.name);
      $("notice").hidden = true;
      $("pipeline").hidden = false;
      await refresh();
      clearInterval(timer);
      timer = setInterval(refresh, refreshMs);
    } catch (e) {
      showNotice(e.status === 401 ? "This token is unknown or revoked." : "Cannot reach the API: " + e.message);
    }
  }
  function showNotice(text) {
    clearInterval(timer);
    $("notice").textContent = text; $("notice").hidden = false;
    $("pipeline").hidden = true; $("report").hidden = true;
  }

  async function refresh() {
    try {
      const [ov, locs] = await Promise.all([api("GET", "/api/transfer/overview"), api("GET", "/api/transfer/locations")]);
      renderCounts(ov); renderStuck(ov); renderLocations(locs);
      await Promise.all([renderHealth(), renderBreakers()]);
      $("updated").textContent = "updated " + new Date().toLocaleTimeString();
      $("refresh-error").textContent = "";
      if (openReport && role === "admin") await showReport(openReport.kind, openReport.id, true);
    } catch (e) {
      if (e.status === 401) { showNotice("This token is unknown or revoked."); return; }
      $("refresh-error").textContent = "refresh failed: " + e.message;
    }
  }
  function renderCounts(ov) {
    const by = {};
    for (const c of ov.counts) { by[c.kind] = by[c.kind] || {}; by[c.kind][c.status] = (by[c.kind][c.status] || 0) + c.count; }
    const stalled = {};
    for (const o of ov.operations) if (o.stalled) stalled[o.kind] = (stalled[o.kind] || 0) + 1;
    const rows = KINDS.filter((k) => by[k]).map((k) => el("tr", { "data-kind": k }, el("th", {}, k),
      ...STATUSES.map((s) => el("td", { class: "num " + (s === "FAILED" && by[k][s] ? "FAILED" : ""), "data-status": s }, by[k][s] || 0)),
      el("td", { class: "num " + (stalled[k] ? "stalled" : "") }, stalled[k] || 0)));
    fill($("counts"), ["stage", ...STATUSES, "stalled"], rows);
  }
  function renderStuck(ov) {
    const stuck = ov.operations.filter((o) => o.status === "FAILED" || o.stalled);
    $("stuck-empty").hidden = stuck.length > 0;
    const head = ["kind", "id", "package", "location", "status", "retries"];
    if (role === "admin") head.push("actions");
    const rows = stuck.map((o) => {
      const tr = el("tr", { "data-testid": "op-" + o.kind + "-" + o.operation_id },
        el("td", {}, o.kind), el("td", { class: "num" }, o.operation_id), el("td", {}, o.package || "—"),
        el("td", {}, o.location || "—"),
        el("td", { class: o.stalled ? "stalled" : o.status, "data-testid": "status" }, o.stalled ? "IN_PROGRESS (stalled)" : o.status),
        el("td", { class: "num" }, o.retry_count + " / " + o.max_retries));
      if (role === "admin") {
        const cell = el("td", {}, el("button", { type: "button", "data-testid": "diagnose", onclick: () => showReport(o.kind, o.operation_id) }, "Diagnose"));
        if (o.status === "FAILED") cell.append(" ", el("button", { type: "button", "data-testid": "reset", onclick: () => resetOp(o.kind, o.operation_id) }, "Reset"));
        tr.append(cell);
      }
      return tr;
    });
    fill($("stuck"), head, rows);
  }
  function renderLocations(locs) {
    fill($("locations"), ["location", "site", "role", "storage", "copies", "bytes", "disk used"], locs.map((l) => el("tr", { "data-location": l.name },
      el("td", {}, l.name + (l.active ? "" : " (inactive)")), el("td", {}, l.site), el("td", {}, l.role), el("td", {}, l.storage),
      el("td", { class: "num" }, l.copies), el("td", { class: "num", title: l.bytes + " bytes" }, bytes(l.bytes)),
      el("td", { class: "num disk-" + (l.disk ? l.disk.level : "none"),
                 title: l.disk ? bytes(l.disk.free_bytes) + " free of " + bytes(l.disk.total_bytes) : "not measured" },
         l.disk ? l.disk.percent.toFixed(1) + " % (" + l.disk.level + ")" : "–"))));
  }
  async function optional(path) {
    try { return await api("GET", path); } catch (e) { if (e.status === 404 || e.status === 403) return null; throw e; }
  }
  async function renderHealth() {
    const h = await optional("/api/health");
    $("health-section").hidden = !h;
    if (!h) return;
    fill($("health"), ["service", "kind", "host", "pid", "last seen", "state"], (h.services || []).map((s) => el("tr", {},
      el("td", {}, s.service), el("td", {}, s.kind), el("td", {}, s.host), el("td", { class: "num" }, s.pid), el("td", {}, s.last_seen),
      el("td", { class: s.alive ? "ok" : "bad" }, s.alive ? "alive" : "dead"))));
  }
  async function renderBreakers() {
    const b = role === "admin" ? await optional("/api/admin/breakers") : null;
    $("breakers-section").hidden = !b;
    if (!b) return;
    const open = b.filter((x) => x.state === "open");
    fill($("breakers"), ["kind", "operation", "stalls", "last stall", "closes at", "actions"], open.map((x) => el("tr", { "data-testid": "breaker-" + x.kind + "-" + x.operation_id },
      el("td", {}, x.kind), el("td", { class: "num" }, x.operation_id), el("td", { class: "num" }, x.stall_count),
      el("td", {}, x.last_stall_at), el("td", {}, x.closes_at),
      el("td", {}, el("button", { type: "button", "data-testid": "breaker-reset", onclick: () => breakerAction(x, "reset") }, "Reset breaker"), " ",
        el("button", { type: "button", "data-testid": "force-retry", onclick: () => breakerAction(x, "force-retry") }, "Force retry")))));
  }
  async function breakerAction(x, what) {
    const reason = window.prompt("Why? (kept in the audit log)", "") || null;
    const path = what === "reset" ? `/api/admin/breakers/${x.kind}/${x.operation_id}/reset` : `/api/transfer/operation/${x.kind}/${x.operation_id}/force-retry`;
    try { await api("POST", path, { reason }); } catch (e) { window.alert(e.message); }
    await refresh();
  }
  async function resetOp(kind, id) {
    try {
      const r = await api("POST", `/api/transfer/operation/${kind}/${id}/reset`, { reason: "reset from the dashboard" });
      $("report-action").textContent = `reset ${r.count} operation(s) to PENDING`;
    } catch (e) { $("report-action").textContent = "reset refused: " + e.message; }
    await refresh();
  }
  async function showReport(kind, id, quiet) {
    openReport = { kind, id };
    let r;
    try { r = await api("GET", `/api/admin/diagnose/${kind}/${id}`); } catch (e) { if (!quiet) window.alert(e.message); return; }
    $("report").hidden = false;
    $("report-title").textContent = `${kind} ${id} (${r.operation.status}${r.operation.stalled ? ", stalled" : ""})`;
    $("report-diagnosis").textContent = r.diagnosis;
    $("report-reset").disabled = r.operation.status !== "FAILED";
    const snap = r.operation;
    const keys = ["status", "attempt", "retry_count", "max_retries", "stall_count", "site", "source_location", "destination_location",
      "raw_data_package", "data_transfer_package", "lease_owner", "lease_expires_at", "heartbeat_at", "not_before", "updated_at", "finished_at", "bytes_done"];
    fill($("report-snapshot"), ["field", "value"], keys.map((k) => el("tr", {}, el("th", {}, k), el("td", {}, snap[k] === null ? "—" : snap[k]))));
    $("report-events").replaceChildren(...(r.failure_events.length ? r.failure_events.map((e) => el("details", { "data-testid": "event" },
      el("summary", {}, `${e.created_at} attempt ${e.attempt}: ${e.error_type}: ${e.message}${e.will_retry ? " (retried)" : ""}`),
      el("pre", {}, (e.error_context && e.error_context.traceback) || JSON.stringify(e.error_context, null, 2)))) : [el("p", {}, "No failure recorded.")]));
    fill($("report-copies"), ["artifact", "location", "role", "status", "path", "size", "verified"], r.copies.map((c) => el("tr", {},
      el("td", {}, c.name), el("td", {}, c.location), el("td", {}, c.role),
      el("td", { class: c.status === "present" ? "ok" : (c.status === "absent" ? "" : "bad") }, c.status),
      el("td", {}, c.path || "—"), el("td", { class: "num" }, c.size === null ? "—" : c.size), el("td", {}, c.verified_at || "—"))));
    if (!quiet) $("report").scrollIntoView();
  }
  async function liveCheck() {
    if (!openReport) return;
    const out = $("report-live-result");
    out.textContent = "live check: pending…";
    try {
      const t = await api("POST", `/api/admin/diagnose/${openReport.kind}/${openReport.id}/live-check`);
      for (let i = 0; i < 120; i++) {
        const s = await api("GET", `/api/admin/diagnose/live-check/${t.correlation_id}`);
        if (s.state !== "pending") { renderLive(s); return; }
        await new Promise((res) => setTimeout(res, 500));
      }
      out.textContent = "live check: still pending; the database report above stands";
    } catch (e) { out.textContent = "live check unavailable (" + e.message + "); the database report above stands"; }
  }
  function liveObject(o) {
    if (o.expect === "not_required") return `${o.path} ${o.exists ? "present" : "absent"} (${o.note || "not required"})`;
    if (o.expect === "folder") return `${o.path} ${o.ok ? "staged folder present" : (o.exists ? "folder without bagit.txt" : "staged folder MISSING")}`;
    return `${o.path} ${o.exists ? (o.ok ? "present" : "present, size " + o.size + " ≠ " + o.expected_size) : "MISSING"}`;
  }
  function renderLive(s) {
    const out = $("report-live-result");
    if (s.state === "failed") { out.textContent = "live check failed: " + (s.result && s.result.error) + "; the database report above stands"; return; }
    const items = [];
    for (const c of s.result.checked) {
      items.push(el("li", { class: c.ok ? "ok" : "bad" }, `${c.location}: ` + (c.error ? c.error :
        c.objects.map(liveObject).join("; "))));
    }
    for (const k of s.result.skipped) items.push(el("li", {}, `${k.location}: skipped (${k.reason})`));
    out.replaceChildren(el("p", {}, `live check at ${s.result.checked_at}:`), el("ul", {}, ...items));
  }

  document.addEventListener("DOMContentLoaded", () => {
    $("version").textContent = cfg.version || "";
    $("token-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      token = $("token").value.trim(); $("token").value = "";
      sessionStorage.setItem("packhorse-token", token);
      openReport = null; $("report").hidden = true;
      signIn();
    });
    $("token-forget").addEventListener("click", () => { token = ""; sessionStorage.removeItem("packhorse-token"); signIn(); });
    $("report-close").addEventListener("click", () => { openReport = null; $("report").hidden = true; });
    $("report-reset").addEventListener("click", () => openReport && resetOp(openReport.kind, openReport.id));
    $("report-live").addEventListener("click", liveCheck);
    signIn();
  });
})();
