"""What the API serves loads nothing from the internet and is hard to misuse from another site:
every response (errors included) carries a Content-Security-Policy, ``nosniff`` and
``X-Frame-Options: DENY``; ``/docs`` and ``/redoc`` reference only this origin; the dashboard's
configuration is a JSON data block (no inline script); a package name with ``/`` reaches the
by-package report."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from packhorse.api.app import create_app
from packhorse.api.tokens import create_token
from packhorse.config import load_config
from packhorse.db.models import RawDataPackage
from support import write_site_config


@pytest.fixture
def api(tmp_path: Path, empty_db):
    app = create_app(load_config(write_site_config(tmp_path / "site")), empty_db)
    return TestClient(app), create_token(empty_db, name="a", role="admin", created_by="test"), empty_db


def _assets(html: str) -> list[str]:
    return re.findall(r'(?:src|href|spec-url)="([^"]+)"', html)


@pytest.mark.parametrize("path", ["/", "/docs", "/redoc", "/metrics", "/openapi.json", "/api/whoami", "/static/app.js",
                                  "/no-such-page"])
def test_every_response_carries_the_security_headers(api, path: str) -> None:
    client, _token, _db = api
    r = client.get(path)
    assert r.headers["x-content-type-options"] == "nosniff"
    assert r.headers["x-frame-options"] == "DENY"
    csp = r.headers["content-security-policy"]
    assert "frame-ancestors 'none'" in csp and "script-src 'self'" in csp
    assert "http" not in csp  # no other origin is allowed anywhere


def test_the_dashboard_policy_forbids_inline_scripts_and_styles(api) -> None:
    client, _token, _db = api
    csp = client.get("/").headers["content-security-policy"]
    assert "'unsafe-inline'" not in csp and "'unsafe-eval'" not in csp
    html = client.get("/").text
    # the only <script> without src is the JSON configuration block, which is never executed
    inline = re.findall(r"<script(?![^>]*\bsrc=)([^>]*)>", html)
    assert inline == [' id="packhorse-config" type="application/json"']
    assert '"refreshSeconds"' in html


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_the_api_docs_load_every_asset_from_the_package(api, page: str) -> None:
    client, _token, _db = api
    html = client.get(page).text
    assets = _assets(html)
    assert assets and all(a.startswith("/") and not a.startswith("//") for a in assets), assets
    assert "cdn" not in html and "googleapis" not in html
    for a in assets:
        r = client.get(a)
        assert r.status_code == 200 and len(r.content) > 0, a
    if page == "/docs":
        assert any(a.endswith("swagger-ui-bundle.js") for a in assets)
        assert client.get("/static/docs-swagger.js").text.count("/openapi.json") == 0  # read from the page
    else:
        assert any(a.endswith("redoc.standalone.js") for a in assets)


#: A resource a script or a style sheet would load: an image, script or style source, a CSS url().
_LOADED = re.compile(r"""(?:\bsrc\s*[:=]\s*|\burl\(\s*|@import\s+)["']?(https?:)?//""")


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_the_api_docs_scripts_and_schema_load_nothing_from_the_internet(api, page: str) -> None:
    client, _token, _db = api
    assert not re.search(r"https?://", client.get("/openapi.json").text)  # no x-logo, no remote link
    assert not re.search(r"https?://", client.get(page).text)
    for asset in _assets(client.get(page).text):
        text = client.get(asset).text
        found = [text[max(m.start() - 40, 0):m.end() + 40] for m in _LOADED.finditer(text)]
        assert found == [], (asset, found)
    if page == "/redoc":  # the footer's logo, from the package
        js = client.get("/static/docs-assets/redoc.standalone.js").text
        assert 'src:"/static/redoc-logo.svg"' in js
        logo = client.get("/static/redoc-logo.svg")
        assert logo.status_code == 200 and logo.headers["content-type"].startswith("image/svg+xml")


def test_a_package_name_with_slashes_reaches_its_report(api) -> None:
    client, token, db = api
    from packhorse.runtime.topology import sync_topology

    settings = client.app.state.ctx.settings
    topo = sync_topology(db, settings)
    db.transact(lambda s: s.add(RawDataPackage(name="instrument-00/obs-0003+2", group_path="instrument-00/obs-0003",
                                               source_location_id=topo.location_ids["fyst-source"],
                                               bagging_date="2026-12-01", file_count=1, payload_bytes=1)))
    h = {"Authorization": f"Bearer {token}"}
    for url in ("/api/admin/diagnose/by-package/instrument-00/obs-0003+2",
                "/api/admin/diagnose/by-package/instrument-00%2Fobs-0003%2B2"):
        r = client.get(url, headers=h)
        assert r.status_code == 200, (url, r.text)
        assert r.json()["package"] == "instrument-00/obs-0003+2" and r.json()["type"] == "raw_data_package"
    assert client.get("/api/admin/diagnose/by-package/instrument-00/nope", headers=h).status_code == 404


def test_a_non_loopback_host_is_told_apart_for_the_tls_warning() -> None:
    from packhorse.cli.distributed import _is_loopback

    assert all(_is_loopback(h) for h in ("127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost"))
    assert not any(_is_loopback(h) for h in ("0.0.0.0", "192.168.1.10", "::", "packhorse.example.org"))


@pytest.mark.parametrize("content_type", ["text/plain", "application/octet-stream", None])
def test_a_body_of_bytes_that_are_not_utf_8_is_refused_not_a_500(api, content_type: str | None) -> None:
    # sent as anything but JSON, the body reached FastAPI's 422 as raw bytes, which its answer
    # could not encode: a 500 without the security headers (found by an attacker's trial)
    client, token, _db = api
    headers = {"Authorization": f"Bearer {token}", **({"Content-Type": content_type} if content_type else {})}
    for method, path in (("PUT", "/api/admin/settings/log_level"), ("POST", "/api/admin/failures/reset")):
        r = client.request(method, path, content=b"caf\xe9 \xff", headers=headers)
        assert r.status_code in (400, 422), (path, r.status_code, r.text)
        assert r.headers["x-content-type-options"] == "nosniff"
        r.json()  # a JSON answer


def test_a_lone_surrogate_in_a_request_is_refused_and_leaves_the_audit_log_readable(api) -> None:
    # a refused PUT with a lone surrogate was audited as it came, and from then on every read of
    # the audit log failed (the API with a 500, `packhorse audit --json` with a traceback)
    client, token, _db = api
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    r = client.put("/api/admin/settings/log_level", content=b'{"value": "x\\ud800y"}', headers=headers)
    assert r.status_code == 422, r.text
    r = client.post("/api/admin/failures/reset", content=b'{"reason": "x\\ud800y"}', headers=headers)
    assert r.status_code in (200, 409, 422), r.text
    r.json()
    audit = client.get("/api/admin/audit", headers=headers)
    assert audit.status_code == 200, audit.text
    assert any("\\ud800" in json.dumps(e) for e in audit.json()), audit.json()
