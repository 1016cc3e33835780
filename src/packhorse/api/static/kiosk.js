// The wallboard (/kiosk#token=…): problems first, in large type, refreshed unattended.
// The token is read from the URL's fragment, which the browser never sends to the server
// (no access log holds it); a kiosk token reads only /api/kiosk (docs/operator-guide.md).
(function () {
  "use strict";
  const cfg = JSON.parse(document.getElementById("packhorse-config").textContent || "{}");
  const $ = (id) => document.getElementById(id);
  const token = new URLSearchParams(location.hash.replace(/^#/, "")).get("token") || "";
  const refreshMs = Math.max(1, Number(new URLSearchParams(location.search).get("refresh")) || cfg.refreshSeconds || 15) * 1000;
  $("version").textContent = cfg.version || "";

  const { el, utc, problemLines } = window.PackhorseDom;
  function notice(text) { $("notice").textContent = text; $("notice").hidden = false; }

  async function refresh() {
    let r;
    try {
      r = await fetch("/api/kiosk", { headers: { Authorization: "Bearer " + token } });
    } catch (e) {
      notice("Cannot reach packhorse (" + e.message + "); showing the last answer.");
      return;
    }
    if (r.status === 401 || r.status === 403) {
      notice("This token is unknown, revoked or may not read the wallboard: packhorse token create --role kiosk --name NAME");
      $("problems").replaceChildren();
      return;
    }
    if (!r.ok) { notice("packhorse answered HTTP " + r.status + "; showing the last answer."); return; }
    const k = await r.json();
    $("notice").hidden = true;
    $("problems").replaceChildren(...problemLines(k.problems));
    const statuses = Object.keys(k.totals);
    $("totals").replaceChildren(el("tr", {}, ...statuses.map((s) => el("th", {}, s))),
      el("tr", {}, ...statuses.map((s) => el("td", { class: "num " + (s === "FAILED" && k.totals[s] ? "FAILED" : "") }, k.totals[s]))));
    if (k.unavailable_locations.length) {
      $("totals").append(el("caption", { class: "bad", "data-testid": "unavailable" },
        "unavailable: " + k.unavailable_locations.join(", ")));
    }
    $("updated").textContent = "updated " + utc(k.generated_at);
  }

  if (!token) {
    notice("Open this page as /kiosk#token=TOKEN with a kiosk token (packhorse token create --role kiosk --name wallboard).");
  } else {
    refresh();
    setInterval(refresh, refreshMs);
  }
})();
