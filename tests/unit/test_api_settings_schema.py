"""The OpenAPI document says what the API answers: every runtime setting key with the values it
accepts, a 400 on every route that reads a body (one that cannot be decoded is answered 400),
and a 405 lists every method of its path in ``Allow``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from packhorse.api.app import create_app
from packhorse.api.tokens import create_token
from packhorse.config import load_config
from packhorse.runtime.settings import KEYS
from support import write_site_config


@pytest.fixture
def api(tmp_path: Path, empty_db):
    app = create_app(load_config(write_site_config(tmp_path / "site")), empty_db)
    token = create_token(empty_db, name="a", role="admin", created_by="test")
    return TestClient(app), {"Authorization": f"Bearer {token}"}


def _url(path: str) -> str:
    """``path`` with its parameters filled with values that pass validation."""
    return re.sub(r"\{[^}]+\}", "1", path.replace("{kind}", "transfer").replace("{key}", "log_level"))


def test_the_schema_lists_every_runtime_setting_key_and_the_values_each_accepts(api) -> None:
    client, auth = api
    schema = client.get("/openapi.json").json()
    for method in ("put", "delete"):
        (key,) = [p for p in schema["paths"]["/api/admin/settings/{key}"][method]["parameters"] if p["name"] == "key"]
        assert key["schema"]["enum"] == list(KEYS), method
    alternatives = {a["title"]: a for a in schema["components"]["schemas"]["SettingIn"]["properties"]["value"]["anyOf"]}
    assert set(alternatives) == set(KEYS)
    assert schema["components"]["schemas"]["SettingOut"]["properties"]["key"]["enum"] == list(KEYS)
    # what the schema says is what the API does: the bound refused, a value inside it taken
    for name, alt in alternatives.items():
        if "enum" in alt:
            bad, good = "LOUD", alt["enum"][-1]
        else:
            assert alt["type"] == "number" and alt["exclusiveMinimum"] == 0, (name, alt)
            bad, good = 0, 2.5
        assert client.put(f"/api/admin/settings/{name}", headers=auth, json={"value": bad}).status_code == 422, name
        assert client.put(f"/api/admin/settings/{name}", headers=auth, json={"value": good}).status_code == 200, name


def test_every_route_that_answers_400_to_a_body_it_cannot_read_documents_it(api) -> None:
    client, auth = api
    schema = client.get("/openapi.json").json()
    answered_400 = []
    for path, ops in schema["paths"].items():
        for method, op in ops.items():
            r = client.request(method.upper(), _url(path), headers={**auth, "Content-Type": "application/json"},
                               content=b"\xff\xfe{not json")
            if r.status_code == 400:
                answered_400.append((method, path))
                assert "400" in op["responses"], (method, path)
                documented = op["responses"]["400"]["content"]["application/json"]["schema"]["$ref"].split("/")[-1]
                detail = schema["components"]["schemas"][documented]["properties"]["detail"]
                assert r.json()["detail"] == detail["const"], (method, path, r.json())
            else:
                assert "400" not in op["responses"], (method, path, r.status_code)
    assert len(answered_400) >= 7, answered_400  # every POST and PUT with a body


def test_a_405_lists_every_method_of_its_path(api) -> None:
    client, auth = api
    schema = client.get("/openapi.json").json()
    assert {"put", "delete"} <= set(schema["paths"]["/api/admin/settings/{key}"])
    for path in schema["paths"]:
        r = client.options(_url(path), headers=auth)
        assert r.status_code == 405, path
        # another template may match the same URL (``/diagnose/{kind}/{id}`` and ``/diagnose/live-check/{id}``)
        same_url = {m.upper() for p, o in schema["paths"].items() if re.fullmatch(
            re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(p)), _url(path)) for m in o}
        assert r.headers["allow"].split(", ") == sorted(same_url), (path, r.headers["allow"])
    assert client.options("/api/admin/settings/log_level", headers=auth).headers["allow"] == "DELETE, PUT"


def test_a_405_outside_the_api_lists_the_methods_there_too(api) -> None:
    # the schema and the static files answered a 405 with an empty Allow (found by an attacker's trial)
    client, _auth = api
    for method, path in (("POST", "/openapi.json"), ("DELETE", "/openapi.json"), ("POST", "/static/app.js"),
                         ("PUT", "/static/docs-assets/swagger-ui.css")):
        r = client.request(method, path)
        assert r.status_code == 405, (method, path, r.status_code)
        assert set(r.headers["allow"].split(", ")) == {"GET", "HEAD"}, (path, r.headers.get("allow"))
