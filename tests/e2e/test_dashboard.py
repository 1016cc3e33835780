"""The web dashboard in headless Chromium (Debian's ``chromium`` driven by Playwright):
load the page, see the stuck operations as an observer (no controls, no error text), then as
an admin diagnose one, run a live check, reset it, and see it move to COMPLETED. Screenshots
of every step go to ``test-artifacts/dashboard/`` (or ``$PACKHORSE_TEST_ARTIFACTS``)."""

from __future__ import annotations

import os
import re
import shutil
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from api_support import ERROR_TEXT, failed_installation, fix_installation, start_serving, stop
from support import run_packhorse

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
#: Debian's chromium as a headless test browser that reaches nothing but the page under test
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync"]
ARTIFACTS = Path(os.environ.get("PACKHORSE_TEST_ARTIFACTS", Path(__file__).resolve().parents[2] / "test-artifacts")) / "dashboard"


#: How long a page assertion waits, milliseconds. Playwright's default (5 s) is too short under
#: CI's four test processes on 2 cores: ReDoc took longer than that to render its first section.
EXPECT_TIMEOUT_MS = 30_000


def _need_browser() -> None:
    why = None
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        why = "playwright is not installed (pip install -e '.[test]')"
    if why is None and CHROMIUM is None:
        why = "Debian's chromium is not installed (apt-get install chromium)"
    if why:
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    from playwright.sync_api import expect

    expect.set_options(timeout=EXPECT_TIMEOUT_MS)


@pytest.fixture
def served(tmp_path: Path):
    """A fixed installation with two FAILED transfers, served by ``packhorse run --api``."""
    _need_browser()
    cfg = fix_installation(failed_installation(tmp_path / "site"))
    tokens = {role: run_packhorse("token", "create", "--role", role, "--name", role, "-c", str(cfg)).stdout.splitlines()[-1]
              for role in ("observer", "admin")}
    proc, base = start_serving(["run", "--api", "--api-port", "0", "-c", str(cfg), "--quiet"], tmp_path / "run.log")
    yield base, tokens, cfg
    stop(proc)


def test_observer_sees_what_is_stuck_and_admin_diagnoses_and_resets(served) -> None:
    from playwright.sync_api import expect, sync_playwright

    base, tokens, cfg = served
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 1000})
        page.set_default_timeout(30_000)
        page.goto(f"{base}/?refresh=0.5")
        expect(page.get_by_test_id("notice")).to_contain_text("Enter an API token")
        page.screenshot(path=str(ARTIFACTS / "1-no-token.png"), full_page=True)

        # observer: sees the two FAILED transfers, no controls, no error text
        page.fill("#token", tokens["observer"])
        page.click("#token-use")
        expect(page.get_by_test_id("whoami")).to_contain_text("observer")
        rows = page.locator("[data-testid^='op-transfer-']")
        expect(rows).to_have_count(2)
        expect(rows.first.get_by_test_id("status")).to_have_text("FAILED")
        expect(page.get_by_test_id("diagnose")).to_have_count(0)
        expect(page.get_by_test_id("reset")).to_have_count(0)
        assert ERROR_TEXT not in page.content() and "TransferCommandError" not in page.content()
        # problems first: a red line on the first screen says what needs a human, before any table
        banner = page.get_by_test_id("problem-failed")
        expect(banner).to_contain_text("FAILED: 2 operation(s): a human must act")
        expect(banner).to_have_class(re.compile(r"\bhuman\b"))
        box = banner.bounding_box()
        assert box is not None and box["y"] + box["height"] < 1000, box  # no scrolling needed
        # the source location holds raw files, not package copies: no "0 copies" there
        source_row = page.locator("#locations tr[data-location='fyst-source'] td")
        expect(source_row.nth(4)).to_have_text("source")
        expect(page.locator("#locations tr[data-location='fyst-buffer'] td").nth(4)).to_have_text("2")  # package, bundle
        page.screenshot(path=str(ARTIFACTS / "2-observer.png"), full_page=True)

        # the wallboard: a kiosk token (it reads nothing but the problem summary) in the URL's
        # fragment, no form, no typing; the problems in red on the first screen, no error text
        kiosk_token = run_packhorse("token", "create", "--role", "kiosk", "--name", "wallboard",
                                    "-c", str(cfg)).stdout.splitlines()[-1]
        board = browser.new_page(viewport={"width": 1400, "height": 1000})
        board.goto(f"{base}/kiosk?refresh=0.5#token={kiosk_token}")
        line = board.get_by_test_id("problem-failed")
        expect(line).to_contain_text("FAILED: 2 operation(s): a human must act")
        expect(line).to_have_class(re.compile(r"\bhuman\b"))
        assert ERROR_TEXT not in board.content() and "TransferCommandError" not in board.content()
        board.screenshot(path=str(ARTIFACTS / "2b-kiosk.png"))
        board.close()
        for path, code in (("/api/kiosk", 200), ("/api/transfer/overview", 403), ("/api/admin/breakers", 403)):
            req = urllib.request.Request(base + path, headers={"Authorization": f"Bearer {kiosk_token}"})
            try:
                with urllib.request.urlopen(req, timeout=30) as r:  # noqa: S310 - the test's own server
                    got = r.status
            except urllib.error.HTTPError as e:
                got = e.code
            assert got == code, (path, got)

        # admin: diagnose the first, live check, reset, watch it complete
        page.fill("#token", tokens["admin"])
        page.click("#token-use")
        expect(page.get_by_test_id("whoami")).to_contain_text("admin")
        row = rows.first
        op_id = row.get_attribute("data-testid").rsplit("-", 1)[-1]  # type: ignore[union-attr]
        row.get_by_test_id("diagnose").click()
        expect(page.get_by_test_id("diagnosis")).to_contain_text("transfer command failed")
        expect(page.get_by_test_id("events").locator("summary")).to_contain_text("TransferCommandError")
        page.get_by_test_id("report-live").click()
        expect(page.get_by_test_id("live-result")).to_contain_text("fyst-buffer")
        page.screenshot(path=str(ARTIFACTS / "3-diagnosis.png"), full_page=True)
        page.get_by_test_id("report-reset").click()
        expect(page.get_by_test_id("report-action")).to_contain_text("reset 1 operation(s) to PENDING")
        expect(page.locator("#report-title")).to_contain_text("COMPLETED", timeout=60_000)
        expect(page.locator(f"[data-testid='op-transfer-{op_id}']")).to_have_count(0)
        expect(rows).to_have_count(1)
        page.screenshot(path=str(ARTIFACTS / "4-after-reset.png"), full_page=True)

        # the other transfer is held by an open circuit breaker: it is listed as blocked, with
        # the command that releases it; force a retry from the page
        other = int(rows.first.get_attribute("data-testid").rsplit("-", 1)[-1])  # type: ignore[union-attr]
        _open_breaker(cfg, other)
        held = page.get_by_test_id(f"blocked-circuit_breaker-transfer-{other}")
        expect(held.get_by_test_id("release")).to_have_text(f"packhorse retry transfer {other}")
        expect(held).to_contain_text("next automatic attempt")
        breaker = page.get_by_test_id(f"breaker-transfer-{other}")
        expect(breaker).to_be_visible()
        expect(page.get_by_test_id("problem-circuit_breaker")).to_have_class(re.compile(r"\bwaiting\b"))
        page.screenshot(path=str(ARTIFACTS / "5-open-breaker.png"), full_page=True)
        page.once("dialog", lambda dialog: dialog.accept("mount fixed"))
        breaker.get_by_test_id("force-retry").click()
        expect(breaker).to_have_count(0)
        expect(rows).to_have_count(0, timeout=60_000)
        expect(page.locator("#stuck-empty")).to_be_visible()
        expect(page.locator("#blocked-empty")).to_be_visible()
        expect(page.get_by_test_id("problem-none")).to_contain_text("No problems")
        page.screenshot(path=str(ARTIFACTS / "6-all-done.png"), full_page=True)
        browser.close()
    assert (ARTIFACTS / "6-all-done.png").stat().st_size > 0


def _open_breaker(cfg, operation_id: int) -> None:  # type: ignore[no-untyped-def]
    """Leave the operation as the monitor does after its third stall: IN_PROGRESS with an
    expired lease, held by an open circuit breaker for an hour."""
    import datetime as dt

    from sqlalchemy import update

    from packhorse.config import load_config
    from packhorse.db.models import CircuitBreaker, Operation, utcnow
    from packhorse.db.session import Database

    db = Database(load_config(cfg).database_url)
    now = utcnow()

    def tx(s):  # type: ignore[no-untyped-def]
        op = s.get(Operation, operation_id)
        s.execute(update(Operation).where(Operation.id == operation_id).values(
            status="IN_PROGRESS", lease_owner="killed-worker", lease_expires_at=now - dt.timedelta(seconds=5),
            error_context=None, finished_at=None))
        s.add(CircuitBreaker(kind="transfer", operation_id=operation_id, stall_count=3, state="open", trips=1,
                             last_stall_attempt=op.attempt, last_stall_at=now, opened_at=now,
                             next_attempt_at=now + dt.timedelta(hours=1)))

    db.transact(tx)
    db.dispose()
