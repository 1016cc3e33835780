"""The dashboard's pictures and tools in headless Chromium (Debian's ``chromium`` driven by
Playwright): the charts render with the installation's data; the search finds a source file
and shows its package, copies and timeline (observers without error text); failures are
grouped by cause and reset in bulk with a reason; the open diagnostic report keeps its expanded
events across refreshes and a page reload, and is audited once; ``/docs`` and ``/redoc`` load
nothing from outside and break no Content-Security-Policy rule. Screenshots go to
``test-artifacts/dashboard/`` (or ``$PACKHORSE_TEST_ARTIFACTS``)."""

from __future__ import annotations

import json
import re
import urllib.request

import pytest
from test_dashboard import ARGS, ARTIFACTS, CHROMIUM, served  # noqa: F401  (the fixture)

from api_support import ERROR_TEXT


def _browser(pw):  # type: ignore[no-untyped-def]
    return pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)


def _watch(page, base: str) -> dict[str, list[str]]:  # type: ignore[no-untyped-def]
    """Record what the page fetched from other origins (a request that completed or got any
    answer), foreign requests the browser refused (by its CSP too: none is allowed), and console errors
    (CSP violations are console errors)."""
    seen: dict[str, list[str]] = {"foreign": [], "errors": []}
    local = (base, "data:", "blob:")
    page.on("requestfinished", lambda r: seen["foreign"].append(r.url) if not r.url.startswith(local) else None)
    page.on("requestfailed", lambda r: seen["foreign"].append(f"{r.url} ({r.failure})")
            if not r.url.startswith(local) else None)
    page.on("console", lambda m: seen["errors"].append(m.text) if m.type == "error" else None)
    return seen


def _sign_in(page, token: str, role: str) -> None:  # type: ignore[no-untyped-def]
    from playwright.sync_api import expect

    page.fill("#token", token)
    page.click("#token-use")
    expect(page.get_by_test_id("whoami")).to_contain_text(role)


def _audit(base: str, token: str, action: str) -> list[dict]:
    req = urllib.request.Request(f"{base}/api/admin/audit?action={action}&limit=1000",
                                 headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def test_charts_render_with_data_and_the_search_shows_a_timeline(served) -> None:  # noqa: F811
    from playwright.sync_api import expect, sync_playwright

    base, tokens, _cfg = served
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = _browser(pw)
        page = browser.new_page(viewport={"width": 1400, "height": 1100})
        page.set_default_timeout(30_000)
        seen = _watch(page, base)
        page.goto(f"{base}/?refresh=1")
        _sign_in(page, tokens["observer"], "observer")
        # throughput of the stages that completed (packaging, bundling), failures of the transfers
        for chart in ("throughput-bytes", "throughput-files", "failures", "disk", "backlog"):
            fig = page.get_by_test_id(f"chart-{chart}")
            expect(fig.locator("canvas")).to_have_count(1)
            assert int(fig.get_attribute("data-series") or 0) >= 1, chart
        for chart in ("throughput-bytes", "throughput-files", "failures", "disk"):
            assert int(page.get_by_test_id(f"chart-{chart}").get_attribute("data-points") or 0) >= 1, chart
        legend = page.get_by_test_id("chart-throughput-bytes").locator(".u-legend")
        expect(legend).to_contain_text("raw_data_package")
        expect(page.get_by_test_id("chart-failures").locator(".u-legend")).to_contain_text("transfer")
        expect(page.get_by_test_id("chart-disk").locator(".u-legend")).to_contain_text("emergency 95")
        page.screenshot(path=str(ARTIFACTS / "charts.png"), full_page=True)

        # where is my file: as an observer, the history without error text
        page.fill("#locate-q", "cam/obs1/a.dat")
        page.click("#locate-go")
        result = page.get_by_test_id("locate-result")
        expect(result.get_by_test_id("locate-versions")).to_contain_text("cam/obs1/a.dat")
        card = result.get_by_test_id("locate-package").first
        expect(card).to_contain_text("package cam/obs1")
        timeline = card.get_by_test_id("timeline")
        for event in ("registered", "packaged", "bundled", "transfer failed", "attempt failed"):
            expect(timeline.locator(f"li[data-event='{event}']").first).to_be_visible()
        expect(card.get_by_test_id("locate-copies")).to_contain_text("fyst-buffer")
        assert ERROR_TEXT not in result.inner_text() and "TransferCommandError" not in result.inner_text()
        # its times in the dashboard's one format (2026-12-06 05:43:55 UTC), never raw ISO with
        # microseconds and an offset beside them (the versions, copies and "archived" line were)
        assert not re.search(r"\d\d:\d\d:\d\d\.\d{6}|\+00:00|\d{4}-\d\d-\d\dT\d\d:\d\d", result.inner_text()), \
            result.inner_text()
        result.scroll_into_view_if_needed()
        page.screenshot(path=str(ARTIFACTS / "locate-observer.png"), full_page=True)

        # an admin sees why the attempts failed
        _sign_in(page, tokens["admin"], "admin")
        expect(page.get_by_test_id("locate-result").get_by_test_id("timeline").first).to_contain_text("TransferCommandError")
        page.get_by_test_id("locate-result").scroll_into_view_if_needed()
        page.screenshot(path=str(ARTIFACTS / "locate-admin.png"), full_page=True)
        page.fill("#locate-q", "no/such/file")
        page.click("#locate-go")
        expect(page.get_by_test_id("locate-none")).to_contain_text("Nothing registered or packaged")
        browser.close()
    assert not seen["foreign"], seen["foreign"]
    assert not [e for e in seen["errors"] if "Content Security Policy" in e or "Refused" in e], seen["errors"]


def test_failures_grouped_by_cause_reset_in_bulk_and_the_report_survives_a_reload(served) -> None:  # noqa: F811
    from playwright.sync_api import expect, sync_playwright

    base, tokens, _cfg = served
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = _browser(pw)
        page = browser.new_page(viewport={"width": 1400, "height": 1100})
        page.set_default_timeout(30_000)
        seen = _watch(page, base)
        page.goto(f"{base}/?refresh=0.5")
        _sign_in(page, tokens["observer"], "observer")
        expect(page.locator("#failures-section")).to_be_hidden()  # observers never see why
        _sign_in(page, tokens["admin"], "admin")
        groups = page.get_by_test_id("failures").get_by_test_id("group")
        expect(groups).to_have_count(2)  # one TransferCommandError group per destination buffer
        expect(groups.first).to_contain_text("TransferCommandError")
        cologne = page.locator("[data-testid='group'][data-group='transfer|cologne-buffer|TransferCommandError']")
        cornell = page.locator("[data-testid='group'][data-group='transfer|cornell-buffer|TransferCommandError']")
        expect(cologne.get_by_test_id("group-count")).to_have_text("1")

        # expand the cologne group and open the report of its operation; expand its event
        cologne.get_by_test_id("group-toggle").click()
        op_row = page.locator("tr.group-ops[data-testid^='group-op-']").first
        expect(op_row).to_be_visible()
        op_id = op_row.get_attribute("data-testid").rsplit("-", 1)[-1]  # type: ignore[union-attr]
        op_row.get_by_test_id("diagnose").click()
        expect(page.get_by_test_id("diagnosis")).to_contain_text("transfer command failed")
        event = page.get_by_test_id("events").get_by_test_id("event").first
        event.locator("summary").click()
        expect(event).to_have_attribute("open", "")
        page.wait_for_timeout(2500)  # several refreshes re-render the report
        expect(page.get_by_test_id("events").get_by_test_id("event").first).to_have_attribute("open", "")
        expect(page.locator("tr.group-ops").first).to_be_visible()  # the group stays expanded too
        page.reload()
        expect(page.get_by_test_id("report")).to_be_visible()
        expect(page.locator("#report-title")).to_contain_text(f"transfer {op_id}")
        expect(page.get_by_test_id("events").get_by_test_id("event").first).to_have_attribute("open", "")
        expect(page.locator(f"[data-testid='group-op-{op_id}']")).to_be_visible()  # the group is still expanded
        page.screenshot(path=str(ARTIFACTS / "report-after-reload.png"), full_page=True)
        opened = [e for e in _audit(base, tokens["admin"], "operation.diagnose") if e["target"] == f"transfer/{op_id}"]
        assert len(opened) == 1, opened  # opened once; the refreshes and the reload are not audited

        # bulk reset of one group: a reason is required, then confirm; feedback on that row
        cologne.get_by_test_id("group-reset").click()
        confirm = cologne.get_by_test_id("reset-confirm")
        expect(confirm).to_be_disabled()
        cologne.get_by_test_id("reset-reason").fill("cologne mount back")
        page.wait_for_timeout(1200)  # a refresh while typing keeps the reason
        expect(cologne.get_by_test_id("reset-reason")).to_have_value("cologne mount back")
        page.screenshot(path=str(ARTIFACTS / "failures-grouped.png"), full_page=True)
        cologne.get_by_test_id("reset-confirm").click()
        expect(cologne.get_by_test_id("feedback")).to_contain_text("reset 1 operation(s) to PENDING")
        expect(cologne.get_by_test_id("group-count")).to_have_text("0", timeout=60_000)  # the group cleared
        expect(cornell.get_by_test_id("group-count")).to_have_text("1")
        entry = [e for e in _audit(base, tokens["admin"], "operation.reset_group")]
        assert len(entry) == 1 and entry[0]["details"]["reason"] == "cologne mount back"

        # every failed operation of a kind, with a reason and a confirmation
        kind = page.get_by_test_id("reset-kind-transfer")
        kind.get_by_test_id("reset-kind").click()
        kind.get_by_test_id("reset-reason").fill("all transfers: command fixed")
        kind.get_by_test_id("reset-confirm").click()
        expect(page.get_by_test_id("failures-kinds").get_by_test_id("feedback")).to_contain_text(
            "reset 1 failed transfer operation(s) to PENDING")
        expect(page.locator("#failures-empty")).to_be_visible(timeout=60_000)
        expect(page.locator("#stuck-empty")).to_be_visible(timeout=60_000)
        page.screenshot(path=str(ARTIFACTS / "failures-reset.png"), full_page=True)
        browser.close()
    assert not seen["foreign"], seen["foreign"]
    assert not [e for e in seen["errors"] if "Content Security Policy" in e or "Refused" in e], seen["errors"]


@pytest.mark.parametrize("page_path, ready", [("/docs", ".opblock"), ("/redoc", "[data-section-id]")])
def test_the_api_docs_render_offline(served, page_path: str, ready: str) -> None:  # noqa: F811
    from playwright.sync_api import expect, sync_playwright

    base, _tokens, _cfg = served
    with sync_playwright() as pw:
        browser = _browser(pw)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.set_default_timeout(30_000)
        seen = _watch(page, base)
        page.goto(base + page_path)
        expect(page.locator(ready).first).to_be_visible()
        expect(page.locator("body")).to_contain_text("/api/transfer/locate")
        page.screenshot(path=str(ARTIFACTS / f"api{page_path.replace('/', '-')}.png"))
        browser.close()
    assert not seen["foreign"], seen["foreign"]
    assert not [e for e in seen["errors"] if "Content Security Policy" in e or "Refused" in e], seen["errors"]


#: Every axis label of every chart, with its box in CSS pixels relative to the chart's canvas
#: (the text measured with the axis's own font, placed as uPlot places it: a left axis's labels
#: end ``gap`` pixels before its ticks, a bottom axis's are centred on their tick).
_AXIS_LABELS = """(ids) => ids.map((id) => {
  const u = window.PackhorseCharts.plot(id);
  if (!u) return { id, labels: [] };
  const ctx = document.createElement("canvas").getContext("2d");
  const left = u.bbox.left / devicePixelRatio; const top = u.bbox.top / devicePixelRatio;
  const pw = u.bbox.width / devicePixelRatio; const ph = u.bbox.height / devicePixelRatio;
  const labels = [];
  u.axes.forEach((a, i) => {
    if (a.show === false) return;
    ctx.font = Array.isArray(a.font) ? a.font[0] : a.font;
    const scale = u.scales[a.scale];
    (a._values || []).forEach((v, j) => {
      if (v === null || v === undefined || v === "") return;
      const lines = String(v).split("\\n");
      const w = Math.max(...lines.map((l) => ctx.measureText(l).width)) / devicePixelRatio;
      const pos = u.valToPos(a._splits[j], a.scale);
      const tick = a.ticks && a.ticks.show !== false ? a.ticks.size : 0;
      if (a.side === 3) {  // left: right-aligned before the tick
        const x1 = left - tick - a.gap; labels.push({ axis: i, text: String(v), x0: x1 - w, x1, y: top + pos });
      } else if (a.side === 2) {  // bottom: centred on the tick
        labels.push({ axis: i, text: String(v), x0: left + pos - w / 2, x1: left + pos + w / 2, y: top + ph });
      }
    });
  });
  return { id, width: u.width, height: u.height, labels };
})"""


def _scaled(body: dict, factor: float) -> dict:
    """The history payload with every throughput and failure value times ``factor``: an
    installation moving hundreds of TiB a minute, the widest labels the axes get."""
    for series in body["throughput"].values():
        for k in ("bytes_per_minute", "files_per_minute"):
            series[k] = [None if v is None else v * factor for v in series[k]]
    body["failures"] = {k: [None if v is None else v * 1000 for v in vs] for k, vs in body["failures"].items()}
    return body


@pytest.mark.parametrize(("width", "factor"), [(1400, 1), (1000, 1), (1400, 3e11), (1000, 7e7)])
def test_no_chart_axis_label_is_clipped(served, width: int, factor: float) -> None:  # noqa: F811
    """Every axis label lies inside its chart's canvas: the y axis is as wide as its widest label
    (``1023.9 TiB``, ``100.0 %``), the first and last time labels fit."""
    from playwright.sync_api import expect, sync_playwright

    base, tokens, _cfg = served
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = _browser(pw)
        page = browser.new_page(viewport={"width": width, "height": 1000})
        page.set_default_timeout(30_000)
        if factor != 1:
            def bigger(route) -> None:  # type: ignore[no-untyped-def]
                r = route.fetch()
                route.fulfill(response=r, body=json.dumps(_scaled(r.json(), factor)))

            page.route("**/api/transfer/history*", bigger)
        page.goto(f"{base}/?refresh=1")
        _sign_in(page, tokens["observer"], "observer")
        ids = ["throughput-bytes", "throughput-files", "backlog", "disk", "failures"]
        for chart in ids:
            expect(page.get_by_test_id(f"chart-{chart}").locator("canvas")).to_have_count(1)
        found = page.evaluate(_AXIS_LABELS, ids)
        expect(page.get_by_test_id("chart-backlog").locator(".u-legend")).to_contain_text("time (UTC)")
        page.get_by_test_id("chart-throughput-bytes").scroll_into_view_if_needed()
        page.screenshot(path=str(ARTIFACTS / f"chart-axes-{width}-{factor:g}.png"), full_page=True)
        browser.close()
    assert all(c["labels"] for c in found), found
    clipped = [(c["id"], lab["text"], round(lab["x0"], 1), round(lab["x1"], 1), c["width"])
               for c in found for lab in c["labels"] if lab["x0"] < 0 or lab["x1"] > c["width"]]
    assert not clipped, clipped
    # the time axis in the dashboard's one time format: UTC, 24-hour, the date where the day changes
    times = [lab["text"] for c in found for lab in c["labels"] if lab["axis"] == 0]
    assert times and all(re.fullmatch(r"\d\d:\d\d(:\d\d)?(\n\d{4}-\d\d-\d\d)?", t) for t in times), times
    assert not [t for t in times if "am" in t or "pm" in t], times
