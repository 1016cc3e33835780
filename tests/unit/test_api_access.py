"""Access to the HTTP API: every ``/api/`` route in the OpenAPI schema refuses a
request without a token (401), refuses an observer on admin and state-changing routes (403),
and decides both *before* the request is validated; the overview needs only an observer;
``/metrics``, the schema and the dashboard page load without a token."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from packhorse.api.app import create_app
from packhorse.api.tokens import create_token, revoke_token
from packhorse.config import load_config
from support import write_site_config

STATE_CHANGING = {"post", "put", "patch", "delete"}


@pytest.fixture
def api(tmp_path: Path, empty_db):
    app = create_app(load_config(write_site_config(tmp_path / "site")), empty_db)
    tokens = {role: create_token(empty_db, name=role, role=role, created_by="test") for role in ("observer", "admin")}
    return TestClient(app), tokens, empty_db


def _routes(client: TestClient) -> list[tuple[str, str]]:
    schema = client.get("/openapi.json").json()
    return [(method, path) for path, ops in schema["paths"].items() for method in ops if path.startswith("/api/")]


def _invalid_url(path: str) -> str:
    """The path with every parameter replaced by a value that fails validation."""
    return re.sub(r"\{[^}]+\}", "not%20valid%20%7B%7D", path)


def _call(client: TestClient, method: str, url: str, token: str | None):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    # a body that is not even JSON: validation would answer 422 if it ran first
    return client.request(method.upper(), url, headers={**headers, "Content-Type": "application/json"},
                          content=b"{not json")


def test_every_api_route_needs_a_token_and_the_right_role_before_validation(api) -> None:
    client, tokens, _db = api
    routes = _routes(client)
    assert len(routes) >= 14, routes  # the walk cannot pass by finding nothing
    admin_only = 0
    for method, path in routes:
        url = _invalid_url(path)
        assert _call(client, method, url, None).status_code == 401, (method, path)
        assert _call(client, method, url, "ph_not-a-token").status_code == 401, (method, path)
        needs_admin = path.startswith("/api/admin/") or method in STATE_CHANGING
        observer = _call(client, method, url, tokens["observer"]).status_code
        if needs_admin:
            admin_only += 1
            assert observer == 403, (method, path, observer)
        else:
            assert observer not in (401, 403), (method, path, observer)
        assert _call(client, method, url, tokens["admin"]).status_code not in (401, 403), (method, path)
    assert admin_only >= 10


def test_the_overview_needs_no_more_than_an_observer(api) -> None:
    client, tokens, _db = api
    r = client.get("/api/transfer/overview", headers={"Authorization": f"Bearer {tokens['observer']}"})
    assert r.status_code == 200 and r.json()["operations"] == []


def test_metrics_schema_and_dashboard_load_without_a_token(api) -> None:
    client, _tokens, _db = api
    assert client.get("/metrics").status_code == 200
    assert "packhorse_operations" in client.get("/metrics").text
    assert client.get("/openapi.json").status_code == 200
    page = client.get("/")
    assert page.status_code == 200 and "packhorse" in page.text
    assert client.get("/static/app.js").status_code == 200


def test_a_revoked_token_is_refused_and_a_token_is_urlsafe_and_stored_only_as_a_hash(api) -> None:
    client, tokens, db = api
    tok = create_token(db, name="ci", role="observer", created_by="test")
    assert re.fullmatch(r"[A-Za-z0-9_-]{40,}", tok)
    from sqlalchemy import select

    from packhorse.db.models import ApiToken

    stored = db.read(lambda s: list(s.execute(select(ApiToken.token_hash, ApiToken.name))))
    assert all(tok not in h for h, _ in stored) and len(stored) == 3
    auth = {"Authorization": f"Bearer {tok}"}
    assert client.get("/api/whoami", headers=auth).json() == {"name": "ci", "role": "observer"}
    revoke_token(db, "ci")
    assert client.get("/api/whoami", headers=auth).status_code == 401


def test_locations_show_each_locations_latest_disk_usage(tmp_path: Path, empty_db) -> None:
    # "packhorse usage, metrics and the dashboard show it" — the dashboard reads this
    from packhorse.rules.disk_usage import record_sample
    from packhorse.runtime.topology import sync_topology
    from packhorse.storage.usage import Usage

    settings = load_config(write_site_config(tmp_path / "site"))
    topo = sync_topology(empty_db, settings)
    record_sample(empty_db, settings, topo.location_ids["fyst-buffer"], "fyst-buffer",
                  Usage(total=1000, used=870, free=130))
    client = TestClient(create_app(settings, empty_db))
    token = create_token(empty_db, name="obs", role="observer", created_by="test")
    r = client.get("/api/transfer/locations", headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200, r.text
    by_name = {loc["name"]: loc for loc in r.json()}
    disk = by_name["fyst-buffer"]["disk"]
    assert (disk["total_bytes"], disk["used_bytes"], disk["free_bytes"], disk["percent"], disk["level"]) == (
        1000, 870, 130, 87.0, "critical")
    assert by_name["cologne-lta"]["disk"] is None  # not measured yet
