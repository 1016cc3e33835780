// Shared by the dashboard (app.js) and the wallboard (kiosk.js): building elements from server
// values (always inserted as text, never as HTML), UTC times, and the problems-first lines.
// window.PackhorseDom = { el(tag, attrs, ...children), utc(iso), problemLines(problems) }.
"use strict";
(function () {
  // el("p", {class: "x", onclick: fn, "data-testid": "y"}, "text", node) -> Element
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
  // "2026-12-06T03:01:02.123+00:00" -> "2026-12-06 03:01:02 UTC"; the server sends UTC times
  function utc(iso) { return iso ? iso.replace("T", " ").slice(0, 19) + " UTC" : "—"; }
  // the server's problems ([{cause, text, needs_human}], status/problems.py) as <p> lines, red
  // where a human is needed; one line saying so when there are none
  function problemLines(problems) {
    const lines = (problems || []).map((p) => el("p", {
      class: "problem " + (p.needs_human ? "human" : "waiting"), "data-testid": "problem-" + p.cause }, p.text));
    if (!lines.length) lines.push(el("p", { class: "problem none", "data-testid": "problem-none" },
      "No problems: nothing FAILED, nothing blocked, every data location available."));
    return lines;
  }
  window.PackhorseDom = { el, utc, problemLines };
})();
