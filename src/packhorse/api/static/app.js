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
  // the open report and its expanded failure events survive refreshes and page reloads
  let openReport = JSON.parse(sessionStorage.getItem("packhorse-report") || "null"); // {kind, id}
  let openEvents = new Set(JSON.parse(sessionStorage.getItem("packhorse-report-events") || "[]"));
  let historyMinutes = Number(sessionStorage.getItem("packhorse-history-minutes") || 60);
  const expandedGroups = new Set(JSON.parse(sessionStorage.getItem("packhorse-groups") || "[]"));
  const saveGroups = () => sessionStorage.setItem("packhorse-groups", JSON.stringify([...expandedGroups]));
  const groupFeedback = new Map(); // group key -> {text, group}
  const resetDrafts = new Map(); // group key or "kind:K" -> reason typed so far (kept across refreshes)
  const $ = (id) => document.getElementById(id);

  const { el, utc, problemLines } = window.PackhorseDom;
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

  // ---------------------------------------------------------------- the pipeline over time
  function renderHistory(h) {
    $("history-meta").textContent = `${utc(h.since)} – ${utc(h.until)}, ` +
      `one point per ${h.step_seconds / 60} min`;
    if (window.PackhorseCharts) window.PackhorseCharts.render($("charts"), h);
  }

  // ---------------------------------------------------------------- where is my file?
  async function locateFile(q) {
    q = (q || "").trim();
    const out = $("locate-result");
    if (!q) { out.replaceChildren(); sessionStorage.removeItem("packhorse-locate"); return; }
    sessionStorage.setItem("packhorse-locate", q);
    out.replaceChildren(el("p", { class: "meta" }, "searching…"));
    let r;
    try { r = await api("GET", "/api/transfer/locate?q=" + encodeURIComponent(q)); } catch (e) {
      out.replaceChildren(el("p", { class: "bad" }, "search failed: " + e.message)); return;
    }
    const skipped = (r.skipped || []).map((k) => el("p", { class: "bad", "data-testid": "locate-skipped" },
      `Skipped by the scan, never archived: ${k.location}:${k.path}: ${k.reason} (since ${utc(k.first_seen_at)}).`));
    if (!r.matched || r.matched === "skipped") {
      out.replaceChildren(...skipped, ...(r.matched ? [] : [el("p", { "data-testid": "locate-none" },
        `Nothing registered or packaged matches “${r.query}”.`)]));
      return;
    }
    const parts = [...skipped, el("p", { class: "meta" }, `“${r.query}” is a ${r.matched}` + (r.truncated ? " (more matches than listed)" : ""))];
    if (r.versions.length) {
      const t = el("table", { "data-testid": "locate-versions" });
      fill(t, ["version: location", "path", "version", "size", "sha256", "modified", "registered", "package"], r.versions.map((v) => el("tr", {},
        el("td", {}, v.location), el("td", {}, v.path), el("td", { class: "num" }, v.version), el("td", { class: "num" }, v.size), el("td", { title: v.sha256 }, v.sha256.slice(0, 12) + "…"),
        el("td", {}, utc(v.mtime)), el("td", {}, utc(v.registered_at)),
        el("td", {}, v.withdrawn ? `taken out: ${v.withdrawn}` : (v.package || "not packaged yet"), v.source_deleted_at ? ` (deleted from the source ${utc(v.source_deleted_at)})` : ""))));
      parts.push(t);
    }
    for (const p of r.packages) parts.push(packageCard(p));
    out.replaceChildren(...parts);
  }
  function packageCard(p) {
    const card = el("div", { class: "package-card", "data-testid": "locate-package", "data-package": p.name });
    const what = p.type === "data_transfer_package" ? "bundle" : "package";
    card.append(el("h3", {}, `${what} ${p.name} `, el("small", {}, [p.size !== null ? bytes(p.size) : "size not known yet",
      p.bundle ? "in bundle " + p.bundle : null, p.archived_at ? "archived " + utc(p.archived_at) : "not archived yet",
      p.members ? p.members.length + " package(s)" : null].filter(Boolean).join(" · "))));
    const copies = el("table", { "data-testid": "locate-copies" });
    fill(copies, ["copy of", "location", "site", "role", "status", "path", "last verified"], [...p.copies, ...p.bundle_copies].map((c) => el("tr", { "data-location": c.location },
      el("td", {}, c.artifact === "data_transfer_package" ? "bundle" : "package"), el("td", {}, c.location), el("td", {}, c.site), el("td", {}, c.role),
      el("td", { class: c.status === "present" ? "ok" : (c.status === "deleted" ? "" : "bad") }, c.status + (c.deleted_at ? " " + utc(c.deleted_at) : "") + (c.quarantined_as ? ", moved aside to " + c.quarantined_as + " " + utc(c.quarantined_at) : "")),
      el("td", {}, c.path), el("td", {}, utc(c.verified_at)))));
    card.append(copies);
    card.append(el("ol", { class: "timeline", "data-testid": "timeline" }, ...p.timeline.map((e) => el("li", {
      class: /failed|^found /.test(e.event) ? "bad" : "", "data-event": e.event },
      el("time", {}, utc(e.at)), el("strong", {}, e.event),
      e.location ? " at " + e.location : "", e.operation_id ? ` (${e.kind} ${e.operation_id})` : "",
      e.detail ? " — " + e.detail : "", e.error_type ? `: ${e.error_type}: ${e.message}` : ""))));
    return card;
  }

  // ---------------------------------------------------------------- failures grouped by cause
  const groupKey = (g) => `${g.kind}|${g.location || ""}|${g.error_type}`;
  function reasonForm(key, label, onConfirm) {
    const input = el("input", { type: "text", size: 28, placeholder: "reason (kept in the audit log)", "data-testid": "reset-reason" });
    input.value = resetDrafts.get(key) || "";
    const confirm = el("button", { type: "button", "data-testid": "reset-confirm" }, label);
    confirm.disabled = !input.value.trim();
    input.addEventListener("input", () => { resetDrafts.set(key, input.value); confirm.disabled = !input.value.trim(); });
    confirm.addEventListener("click", () => onConfirm(input.value.trim()));
    const cancel = el("button", { type: "button", "data-testid": "reset-cancel", onclick: () => { resetDrafts.delete(key); renderFailures(); } }, "Cancel");
    return el("span", { class: "reset-form" }, input, confirm, cancel);
  }
  async function renderFailures() {
    const f = role === "admin" ? await optional("/api/admin/failures") : null;
    $("failures-section").hidden = !f;
    if (!f) return;
    const focused = document.activeElement && document.activeElement.closest && document.activeElement.closest("[data-group], #failures-kinds");
    const focusKey = focused ? (focused.getAttribute("data-group") || "kinds") : null;
    const seen = new Set();
    const rows = [];
    for (const g of f.groups) {
      const key = groupKey(g); seen.add(key);
      rows.push(groupRow(g, key, false));
      if (expandedGroups.has(key)) {
        for (const o of g.operations) rows.push(el("tr", { class: "group-ops", "data-testid": "group-op-" + o.operation_id },
          el("td", {}, ""), el("td", { colspan: 3 }, `${g.kind} ${o.operation_id} · ${o.package || "—"} · failed ${utc(o.updated_at)} · retries ${o.retry_count} / ${o.max_retries}`),
          el("td", { colspan: 3 }, el("button", { type: "button", "data-testid": "diagnose", onclick: () => showReport(g.kind, o.operation_id) }, "Diagnose"))));
        if (g.count > g.operations.length) rows.push(el("tr", { class: "group-ops" }, el("td", {}, ""), el("td", { colspan: 6 }, `… and ${g.count - g.operations.length} more`)));
      }
    }
    for (const [key, fb] of groupFeedback) if (fb.group && !seen.has(key)) rows.push(groupRow(fb.group, key, true)); // acted on, now empty
    fill($("failures"), ["", "stage", "location", "error type", "count", "last failed", "actions"], rows);
    $("failures-empty").hidden = f.groups.length > 0;
    const kinds = [...new Set(f.groups.map((g) => g.kind))].sort();
    $("failures-kinds").replaceChildren(...kinds.map((k) => {
      const key = "kind:" + k;
      const n = f.groups.filter((g) => g.kind === k).reduce((a, g) => a + g.count, 0);
      const wrap = el("span", { "data-testid": "reset-kind-" + k, "data-group": key }, " ");
      if (resetDrafts.has(key)) wrap.append(reasonForm(key, `Reset all ${n} failed ${k}`, (reason) => resetKind(k, reason, wrap)));
      else wrap.append(el("button", { type: "button", "data-testid": "reset-kind", onclick: () => { resetDrafts.set(key, ""); renderFailures(); } }, `Reset every failed ${k} (${n})…`));
      if (groupFeedback.has(key)) wrap.append(" ", el("span", { class: "feedback", "data-testid": "feedback" }, groupFeedback.get(key).text));
      return wrap;
    }));
    for (const [key, fb] of groupFeedback) if (key.startsWith("kind:") && !kinds.includes(key.slice(5))) {
      $("failures-kinds").append(el("span", { "data-group": key }, " ", el("span", { class: "feedback", "data-testid": "feedback" }, fb.text)));
    }
    if (focusKey) { const again = document.querySelector(`[data-group="${CSS.escape(focusKey)}"] input`); if (again) again.focus(); }
  }
  function groupRow(g, key, gone) {
    const open = expandedGroups.has(key);
    const tr = el("tr", { "data-testid": "group", "data-group": key, class: gone ? "gone" : "" },
      el("td", {}, gone ? "" : el("button", { type: "button", "data-testid": "group-toggle", "aria-expanded": String(open),
        onclick: () => { if (open) expandedGroups.delete(key); else expandedGroups.add(key); saveGroups(); renderFailures(); } }, open ? "▾" : "▸")),
      el("td", {}, g.kind), el("td", {}, g.location || "—"), el("td", { class: "FAILED", title: g.sample_message || "" }, g.error_type),
      el("td", { class: "num", "data-testid": "group-count" }, gone ? 0 : g.count), el("td", {}, utc(g.last_at)));
    const cell = el("td", {});
    if (!gone) {
      if (resetDrafts.has(key)) cell.append(reasonForm(key, `Reset ${g.count} operation(s)`, (reason) => resetGroup(g, key, reason)));
      else cell.append(el("button", { type: "button", "data-testid": "group-reset", onclick: () => { resetDrafts.set(key, ""); renderFailures(); } }, "Reset group…"));
    }
    if (groupFeedback.has(key)) cell.append(" ", el("span", { class: "feedback", "data-testid": "feedback" }, groupFeedback.get(key).text));
    tr.append(cell);
    return tr;
  }
  async function resetGroup(g, key, reason) {
    try {
      const r = await api("POST", "/api/admin/failures/reset", { kind: g.kind, location: g.location, error_type: g.error_type, reason });
      groupFeedback.set(key, { text: `reset ${r.count} operation(s) to PENDING`, group: g });
      resetDrafts.delete(key);
    } catch (e) { groupFeedback.set(key, { text: "reset refused: " + e.message, group: g }); }
    await refresh();
  }
  async function resetKind(kind, reason) {
    const key = "kind:" + kind;
    try {
      const r = await api("POST", `/api/transfer/operation/${kind}/reset-all-failed`, { reason });
      groupFeedback.set(key, { text: `reset ${r.count} failed ${kind} operation(s) to PENDING`, group: null });
      resetDrafts.delete(key);
    } catch (e) { groupFeedback.set(key, { text: "reset refused: " + e.message, group: null }); }
    await refresh();
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
      if ($("locate-q").value.trim()) locateFile($("locate-q").value);
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
      const [ov, locs, hist] = await Promise.all([api("GET", "/api/transfer/overview"), api("GET", "/api/transfer/locations"),
        api("GET", "/api/transfer/history?minutes=" + historyMinutes)]);
      renderProblems(ov); renderCounts(ov); renderBlocked(ov); renderStuck(ov); renderLocations(locs, ov);
      renderHistory(hist);
      await Promise.all([renderHealth(), renderBreakers(), renderFailures()]);
      $("updated").textContent = "updated " + utc(new Date().toISOString());
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
  // one time format everywhere: "2026-12-05 10:01:02 UTC" (the CLI's)
  // problems first: one line per kind of problem, red where a human is needed (status/problems.py)
  function renderProblems(ov) {
    $("problems").replaceChildren(...problemLines(ov.problems));
  }
  function renderBlocked(ov) {
    const items = ov.blocked || [];
    $("blocked-empty").hidden = items.length > 0;
    const next = (b) => (b.detail && b.detail.state === "half_open") ? "half-open: one attempt running"
      : (b.detail && b.detail.next_attempt_at) ? "next automatic attempt " + utc(b.detail.next_attempt_at) : "";
    fill($("blocked"), ["what", "cause", "why", "releases it", "since"], items.map((b) => el("tr", {
        "data-testid": "blocked-" + b.cause + "-" + b.subject.replace(/\s+/g, "-") },
      el("td", {}, b.subject), el("td", {}, b.cause.replace(/_/g, " ")),
      el("td", {}, b.reason, next(b) ? el("br", {}) : "", next(b)),
      el("td", {}, el("code", { "data-testid": "release" }, b.release)), el("td", {}, utc(b.since)))));
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
  function renderLocations(locs, ov) {
    // an unavailable location is never shown as normal, whatever its last disk sample said
    const down = new Set((ov.blocked || []).filter((b) => b.cause === "location_unavailable").map((b) => b.detail.location));
    fill($("locations"), ["location", "site", "role", "storage", "copies", "bytes", "disk used"], locs.map((l) => el("tr", { "data-location": l.name },
      el("td", {}, l.name + (l.active ? "" : " (inactive)")), el("td", {}, l.site), el("td", {}, l.role), el("td", {}, l.storage),
      l.role === "source"  // raw files, not package copies (packhorse status counts its registered files)
        ? el("td", { class: "num", title: "a source location holds raw files, not package copies" }, "source")
        : el("td", { class: "num" }, l.copies),
      l.role === "source" ? el("td", { class: "num" }, "—") : el("td", { class: "num", title: l.bytes + " bytes" }, bytes(l.bytes)),
      down.has(l.name)
        ? el("td", { class: "bad", "data-testid": "unavailable", title: "see the Blocked table for the reason" }, "UNAVAILABLE")
        : el("td", { class: "num disk-" + (l.disk ? l.disk.level : "none"),
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
      el("td", {}, s.service), el("td", {}, s.kind), el("td", {}, s.host), el("td", { class: "num" }, s.pid), el("td", {}, utc(s.last_seen)),
      el("td", { class: s.alive ? "ok" : "bad" }, s.alive ? "alive" : "dead"))));
  }
  async function renderBreakers() {
    const b = role === "admin" ? await optional("/api/admin/breakers") : null;
    $("breakers-section").hidden = !b;
    if (!b) return;
    const open = b.filter((x) => x.state === "open" || x.state === "half_open");
    fill($("breakers"), ["kind", "operation", "stalls", "last stall", "next automatic attempt", "actions"], open.map((x) => el("tr", { "data-testid": "breaker-" + x.kind + "-" + x.operation_id },
      el("td", {}, x.kind), el("td", { class: "num" }, x.operation_id), el("td", { class: "num" }, x.stall_count),
      el("td", {}, utc(x.last_stall_at)), el("td", {}, x.state === "open" ? utc(x.next_attempt_at) : "half-open: trying since " + utc(x.half_open_at)),
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
  function saveReportState() {
    if (openReport) sessionStorage.setItem("packhorse-report", JSON.stringify(openReport));
    else sessionStorage.removeItem("packhorse-report");
    sessionStorage.setItem("packhorse-report-events", JSON.stringify([...openEvents]));
  }
  function closeReport() { openReport = null; openEvents = new Set(); saveReportState(); $("report").hidden = true; }
  // quiet: a refresh of the report already open (opened=false: the server does not audit it again)
  async function showReport(kind, id, quiet) {
    if (!quiet && !(openReport && openReport.kind === kind && openReport.id === id)) openEvents = new Set();
    openReport = { kind, id };
    saveReportState();
    let r;
    try { r = await api("GET", `/api/admin/diagnose/${kind}/${id}?opened=${quiet ? "false" : "true"}`); } catch (e) {
      if (e.status === 404) { closeReport(); return; }
      if (!quiet) window.alert(e.message);
      return;
    }
    $("report").hidden = false;
    $("report-title").textContent = `${kind} ${id} (${r.operation.status}${r.operation.stalled ? ", stalled" : ""})`;
    $("report-diagnosis").textContent = r.diagnosis;
    $("report-reset").disabled = r.operation.status !== "FAILED";
    const snap = r.operation;
    const keys = ["status", "attempt_words", "retry_count", "max_retries", "stall_count", "site", "source_location", "destination_location",
      "raw_data_package", "data_transfer_package", "lease_owner", "lease_expires_at", "heartbeat_at", "not_before", "updated_at", "finished_at", "bytes_done"];
    fill($("report-snapshot"), ["field", "value"], keys.map((k) => el("tr", {}, el("th", {}, k), el("td", {}, snap[k] === null ? "—" : snap[k]))));
    $("report-events").replaceChildren(...(r.failure_events.length ? r.failure_events.map((e) => {
      const d = el("details", { "data-testid": "event", "data-event-id": e.id, open: openEvents.has(e.id) ? "" : null },
        el("summary", {}, `${utc(e.created_at)} ${e.failure}: ${e.error_type}: ${e.message}${e.will_retry ? " (retried)" : ""}`),
        el("pre", {}, (e.error_context && e.error_context.traceback) || JSON.stringify(e.error_context, null, 2)));
      d.addEventListener("toggle", () => { if (d.open) openEvents.add(e.id); else openEvents.delete(e.id); saveReportState(); });
      return d;
    }) : [el("p", {}, "No failure recorded.")]));
    fill($("report-copies"), ["artifact", "location", "role", "status", "path", "size", "last verified / deleted"], r.copies.map((c) => el("tr", {},
      el("td", {}, c.name), el("td", {}, c.location), el("td", {}, c.role),
      el("td", { class: c.status === "present" ? "ok" : (c.status === "absent" ? "" : "bad") }, c.status),
      el("td", {}, c.path || "—"), el("td", { class: "num" }, c.size === null ? "—" : c.size),
      el("td", {}, c.deleted_at ? "deleted " + utc(c.deleted_at) : utc(c.verified_at)))));
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
    out.replaceChildren(el("p", {}, `live check at ${utc(s.result.checked_at)}:`), el("ul", {}, ...items));
  }

  document.addEventListener("DOMContentLoaded", () => {
    $("version").textContent = cfg.version || "";
    $("token-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      token = $("token").value.trim(); $("token").value = "";
      sessionStorage.setItem("packhorse-token", token);
      closeReport();
      signIn();
    });
    $("token-forget").addEventListener("click", () => { token = ""; sessionStorage.removeItem("packhorse-token"); signIn(); });
    $("report-close").addEventListener("click", closeReport);
    $("history-window").value = String(historyMinutes);
    $("history-window").addEventListener("change", () => {
      historyMinutes = Number($("history-window").value);
      sessionStorage.setItem("packhorse-history-minutes", String(historyMinutes));
      refresh();
    });
    $("locate-form").addEventListener("submit", (ev) => { ev.preventDefault(); locateFile($("locate-q").value); });
    const lastQuery = sessionStorage.getItem("packhorse-locate");
    if (lastQuery) $("locate-q").value = lastQuery;
    $("report-reset").addEventListener("click", () => openReport && resetOp(openReport.kind, openReport.id));
    $("report-live").addEventListener("click", liveCheck);
    signIn();
  });
})();
