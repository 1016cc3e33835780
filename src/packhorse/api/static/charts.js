// packhorse dashboard: the pipeline over time, drawn with uPlot (vendored in /static/vendor,
// MIT; nothing is loaded from the internet). Input: the payload of GET /api/transfer/history.
// window.PackhorseCharts.render(container, history) draws (or updates) five charts:
// throughput bytes/min and files/min per stage, backlog per stage, disk usage per location
// against its thresholds, failures per stage. Times are UTC, 24-hour; each axis is sized to its
// widest label, so none is cut off.
"use strict";
(function () {
  const PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"];
  const THRESHOLD_COLORS = { warning: "#d4a000", critical: "#e8590c", emergency: "#b00020" };
  const charts = {}; // id -> {plot, key}

  function bytesPerMin(v) {
    if (v === null || v === undefined) return "–";
    const u = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let i = 0; let x = Number(v);
    while (Math.abs(x) >= 1024 && i < u.length - 1) { x /= 1024; i++; }
    return (i ? x.toFixed(1) : x.toFixed(0)) + " " + u[i];
  }
  const count = (v) => (v === null || v === undefined ? "–" : String(Math.round(v * 100) / 100));

  // times in the dashboard's one format: UTC, 24-hour (as dom.js utc(): "2026-12-06 05:43:55 UTC");
  // a time label carries its date under it where the day changes (and on the first label)
  function utcTicks(u, splits, axisIdx, space, incr) {
    let day = null;
    return splits.map((ts) => {
      const iso = new Date(ts * 1000).toISOString();
      const t = incr < 60 ? iso.slice(11, 19) : iso.slice(11, 16);
      const d = iso.slice(0, 10);
      const out = d !== day ? t + "\n" + d : t;
      day = d;
      return out;
    });
  }
  const utcValue = (u, ts) => (ts === null || ts === undefined ? "–" : new Date(ts * 1000).toISOString().slice(0, 16).replace("T", " ") + " UTC");

  // an axis as wide (a left axis) or as tall (a bottom axis) as its widest (tallest) label, measured
  // with the axis's own font, plus its ticks and gap: a fixed size cut off "1023.9 TiB" and
  // long counts at the chart's left edge
  function axisSize(u, values, axisIdx) { // measured every cycle: the splits change between cycles
    const axis = u.axes[axisIdx];
    const tick = axis.ticks && axis.ticks.show !== false ? axis.ticks.size : 0;
    const vals = (values || []).filter((v) => v !== null && v !== undefined && v !== "");
    u.ctx.font = Array.isArray(axis.font) ? axis.font[0] : axis.font;
    const px = window.devicePixelRatio || 1;
    if (axis.side === 2 || axis.side === 0) { // horizontal: lines of text
      const lines = Math.max(1, ...vals.map((v) => String(v).split("\n").length));
      const lineHeight = (Array.isArray(axis.font) ? axis.font[1] : 12) / px * 1.5;
      return Math.ceil(tick + axis.gap + lines * lineHeight + 4);
    }
    const widest = Math.max(0, ...vals.map((v) => Math.max(...String(v).split("\n").map((l) => u.ctx.measureText(l).width)))) / px;
    return Math.ceil(tick + axis.gap + widest + 6);
  }

  function specs(h) {
    const kinds = (o) => Object.keys(o).sort();
    const t = h.throughput; const b = h.backlog; const f = h.failures; const d = h.disk;
    const out = [
      { id: "throughput-bytes", title: "Throughput per stage (bytes per minute)", fmt: bytesPerMin,
        series: kinds(t).map((k) => ({ label: k, values: t[k].bytes_per_minute })) },
      { id: "throughput-files", title: "Throughput per stage (raw files per minute)", fmt: count,
        series: kinds(t).map((k) => ({ label: k, values: t[k].files_per_minute })) },
      { id: "backlog", title: "Backlog per stage (not completed: waiting + running + failed)", fmt: count, spanGaps: true,
        series: kinds(b).map((k) => ({ label: k, values: b[k].waiting.map((w, i) => (w === null ? null : w + (b[k].running[i] || 0) + (b[k].failed[i] || 0))) })) },
      { id: "disk", title: "Disk usage per location (% used; thresholds dashed)", fmt: (v) => (v === null || v === undefined ? "–" : v.toFixed(1) + " %"),
        spanGaps: true, range: [0, 100],
        series: kinds(d).map((k) => ({ label: k, values: d[k].percent })),
        thresholds: ["warning", "critical", "emergency"].map((k) => ({ label: k + " " + h.thresholds[k] + " %", value: h.thresholds[k], color: THRESHOLD_COLORS[k] })) },
      { id: "failures", title: "Failures per stage (failed attempts per interval)", fmt: count,
        series: kinds(f).map((k) => ({ label: k, values: f[k] })) },
    ];
    return out;
  }

  function draw(container, spec, h) {
    let box = container.querySelector(`[data-chart="${spec.id}"]`);
    if (!box) {
      box = document.createElement("figure");
      box.className = "chart";
      box.setAttribute("data-chart", spec.id);
      box.setAttribute("data-testid", "chart-" + spec.id);
      const cap = document.createElement("figcaption"); cap.textContent = spec.title;
      const plot = document.createElement("div"); plot.className = "plot";
      const empty = document.createElement("p"); empty.className = "meta empty";
      box.append(cap, plot, empty);
      container.append(box);
    }
    const plotEl = box.querySelector(".plot");
    const empty = box.querySelector(".empty");
    box.setAttribute("data-series", String(spec.series.length));
    const points = spec.series.reduce((n, s) => n + s.values.filter((v) => v !== null && v !== 0).length, 0);
    box.setAttribute("data-points", String(points));
    empty.textContent = spec.series.length ? "" : "no data in this window yet";
    // sampled series (backlog, disk) are sparse: their points are drawn, so one sample shows
    const lines = spec.series.map((s, i) => ({ label: s.label, stroke: PALETTE[i % PALETTE.length], fill: spec.spanGaps ? undefined : PALETTE[i % PALETTE.length] + "22",
      width: 2, value: (u, v) => spec.fmt(v), spanGaps: !!spec.spanGaps, points: spec.spanGaps ? { show: true, size: 6 } : undefined }));
    const extra = (spec.thresholds || []).map((t) => ({ label: t.label, stroke: t.color, width: 1, dash: [6, 4], points: { show: false }, value: () => "" }));
    const data = [h.times, ...spec.series.map((s) => s.values), ...(spec.thresholds || []).map((t) => h.times.map(() => t.value))];
    const key = lines.map((l) => l.label).join("|") + "#" + extra.map((l) => l.label).join("|");
    const prev = charts[spec.id];
    if (!spec.series.length) {
      if (prev) { prev.plot.destroy(); delete charts[spec.id]; }
      return;
    }
    if (prev && prev.key === key) { prev.plot.setData(data); return; }
    if (prev) prev.plot.destroy();
    const width = Math.max(320, Math.min(620, (container.clientWidth || 1200) / 2 - 24));
    const opts = {
      width, height: 220,
      scales: { x: { time: true }, y: spec.range ? { range: spec.range } : { range: (u, min, max) => [0, Math.max(1, max * 1.1)] } },
      axes: [{ values: utcTicks, size: axisSize }, { values: (u, vals) => vals.map((v) => spec.fmt(v)), size: axisSize }],
      series: [{ label: "time (UTC)", value: utcValue }, ...lines, ...extra],
      legend: { live: true },
    };
    charts[spec.id] = { plot: new uPlot(opts, data, plotEl), key };
  }

  window.PackhorseCharts = {
    render(container, h) { for (const spec of specs(h)) draw(container, spec, h); },
    // the uPlot instance of a chart (or null): what the dashboard's browser tests measure
    plot(id) { return charts[id] ? charts[id].plot : null; },
  };
})();
