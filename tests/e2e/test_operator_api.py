"""Spot, diagnose, reset — through the HTTP API and the CLI, on a real installation whose
transfers FAILED (seed 002 "Diagnosing and Resetting a Stuck or Failed Operation")."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from api_support import ERROR_TEXT, Api, api_for, clone, failed_installation, fix_installation
from packhorse.api.schemas import Overview
from support import run_packhorse

ERROR_WORDS = ("error", "traceback", "diagnosis", "message", "exception")


@pytest.fixture(scope="module")
def failed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return failed_installation(tmp_path_factory.mktemp("failed") / "site")


@pytest.fixture
def inst(failed: Path, tmp_path: Path) -> tuple[Path, Api]:
    cfg = clone(failed, tmp_path / "site")
    return cfg, api_for(cfg)


def _failed_transfers(api: Api) -> list[dict[str, Any]]:
    ov = api.client.get("/api/transfer/overview", headers=api.auth(api.observer)).json()
    return [o for o in ov["operations"] if o["kind"] == "transfer" and o["status"] == "FAILED"]


def _property_names(schema: Any, defs: dict[str, Any]) -> set[str]:
    """Every property name reachable in a JSON schema (following $ref)."""
    names: set[str] = set()
    stack, seen = [schema], set()
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            ref = node.get("$ref")
            if ref and ref not in seen:
                seen.add(ref)
                stack.append(defs[ref.rsplit("/", 1)[-1]])
            names.update(node.get("properties", {}))
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return names


def test_the_overview_model_cannot_carry_an_error_field() -> None:
    schema = Overview.model_json_schema()
    names = _property_names(schema, schema.get("$defs", {}))
    assert {"operations", "kind", "package", "location", "status", "retry_count"} <= names
    assert not [n for n in names if any(w in n.lower() for w in ERROR_WORDS)], names
    # undeclared fields are refused, not passed through
    with pytest.raises(Exception):  # noqa: B017 (pydantic refuses it; the type is its own)
        Overview.model_validate({"generated_at": "x", "counts": [], "totals": {}, "stalled": 0, "operations": [],
                                 "truncated": False, "error_context": {"message": "boom"}})


def test_observer_spots_the_failed_transfers_without_seeing_why(inst) -> None:
    _cfg, api = inst
    for token in (api.observer, api.admin):
        r = api.client.get("/api/transfer/overview", headers=api.auth(token))
        assert r.status_code == 200
        assert ERROR_TEXT not in r.text and "TransferCommandError" not in r.text and "Traceback" not in r.text
    failed = _failed_transfers(api)
    assert {(o["location"], o["retry_count"]) for o in failed} == {("cologne-buffer", 0), ("cornell-buffer", 0)}
    assert all(o["package"] and o["package"].startswith("fyst-") for o in failed)
    ov = api.client.get("/api/transfer/overview", headers=api.auth(api.observer)).json()
    assert {"kind": "transfer", "location": "cologne-buffer", "status": "FAILED", "count": 1} in ov["counts"]
    # the same payload for every caller
    admin_ov = api.client.get("/api/transfer/overview", headers=api.auth(api.admin)).json()
    assert {**ov, "generated_at": None} == {**admin_ov, "generated_at": None}


def test_admin_diagnoses_a_failed_transfer(inst) -> None:
    _cfg, api = inst
    op = _failed_transfers(api)[0]
    r = api.client.get(f"/api/admin/diagnose/transfer/{op['operation_id']}", headers=api.auth(api.admin))
    assert r.status_code == 200
    rep = r.json()
    assert rep["operation"]["status"] == "FAILED"
    assert rep["operation"]["error_context"]["error_type"] == "TransferCommandError"
    assert "transfer command failed" in rep["diagnosis"] and ERROR_TEXT in rep["diagnosis"]
    assert [e["error_type"] for e in rep["failure_events"]] == ["TransferCommandError"]
    assert "Traceback" in rep["failure_events"][0]["error_context"]["traceback"]
    presence = {c["location"]: c["status"] for c in rep["copies"] if c["artifact"] == "data_transfer_package"}
    assert presence["fyst-buffer"] == "present" and presence[op["location"]] == "absent"
    by_pkg = api.client.get(f"/api/admin/diagnose/by-package/{op['package']}", headers=api.auth(api.admin)).json()
    assert {(x["operation"]["kind"], x["operation"]["status"]) for x in by_pkg["reports"]} >= {
        ("data_transfer_package", "COMPLETED"), ("transfer", "FAILED")}
    assert api.client.get("/api/admin/diagnose/by-package/nope", headers=api.auth(api.admin)).status_code == 404
    assert api.client.get("/api/admin/diagnose/transfer/9999", headers=api.auth(api.admin)).status_code == 404
    assert api.client.get("/api/admin/diagnose/unpack/1", headers=api.auth(api.admin)).status_code == 404


def test_live_check_reports_the_bytes_on_disk_now_and_expires(inst) -> None:
    cfg, api = inst
    op = _failed_transfers(api)[0]
    h = api.auth(api.admin)
    ticket = api.client.post(f"/api/admin/diagnose/transfer/{op['operation_id']}/live-check", headers=h)
    assert ticket.status_code == 202 and ticket.json()["state"] == "pending"
    cid = ticket.json()["correlation_id"]
    deadline = time.monotonic() + 30
    while True:
        state = api.client.get(f"/api/admin/diagnose/live-check/{cid}", headers=h).json()
        if state["state"] != "pending" or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert state["state"] == "done", state
    found = {c["location"]: c for c in state["result"]["checked"]}
    assert found["fyst-buffer"]["ok"] and found["fyst-buffer"]["objects"][0]["exists"]
    assert not found[op["location"]]["objects"][0]["exists"]
    # remove the source bundle behind packhorse's back: the next live check sees it
    bundle = cfg.parent / "sites" / "fyst" / "buffer" / found["fyst-buffer"]["objects"][0]["path"]
    bundle.chmod(0o644)
    bundle.unlink()
    cid2 = api.client.post(f"/api/admin/diagnose/transfer/{op['operation_id']}/live-check", headers=h).json()["correlation_id"]
    deadline = time.monotonic() + 30
    while (s2 := api.client.get(f"/api/admin/diagnose/live-check/{cid2}", headers=h).json())["state"] == "pending":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert not {c["location"]: c for c in s2["result"]["checked"]}["fyst-buffer"]["ok"]
    assert api.client.get("/api/admin/diagnose/live-check/unknown", headers=h).status_code == 404


def test_reset_through_the_api_keeps_history_and_the_fixed_pipeline_archives(inst) -> None:
    cfg, api = inst
    h = api.auth(api.admin)
    ops = _failed_transfers(api)
    first = ops[0]["operation_id"]
    assert api.client.post("/api/transfer/operation/nonsense/1/reset", headers=h).status_code == 422
    assert api.client.post("/api/transfer/operation/transfer/9999/reset", headers=h).status_code == 404
    r = api.client.post(f"/api/transfer/operation/transfer/{first}/reset", headers=h, json={"reason": "typo fixed"})
    assert r.status_code == 200 and r.json() == {"kind": "transfer", "reset": [first], "count": 1}
    again = api.client.post(f"/api/transfer/operation/transfer/{first}/reset", headers=h)
    assert again.status_code == 409
    rep = api.client.get(f"/api/admin/diagnose/transfer/{first}", headers=h).json()
    assert rep["operation"]["status"] == "PENDING" and rep["operation"]["retry_count"] == 1
    assert rep["operation"]["error_context"] is None
    assert len(rep["failure_events"]) == 1  # the history survives the reset
    rest = api.client.post("/api/transfer/operation/transfer/reset-all-failed", headers=h).json()
    assert rest["count"] == 1
    fixed = fix_installation(cfg)
    r = run_packhorse("run", "-c", str(fixed), "--until-idle", "--quiet")
    assert r.returncode == 0, r.stderr
    status = json.loads(run_packhorse("status", "-c", str(fixed), "--json").stdout)
    assert status["packages"] == {"total": 1, "archived": 1, "failed": 0}
    audit = api.client.get("/api/admin/audit", headers=h).json()
    resets = [a for a in audit if a["action"].startswith("operation.reset")]
    # newest first: reset-all, the refused repeat, the reset, the refused unknown id
    assert [(a["action"], a["result"]) for a in resets] == [
        ("operation.reset_all_failed", "ok"), ("operation.reset", "refused"), ("operation.reset", "ok"),
        ("operation.reset", "refused")]
    assert {"token:test-admin"} == {a["actor"] for a in resets}
    assert any(a["result"] == "ok" and a["details"]["reason"] == "typo fixed" for a in resets)
    assert any(a["result"] == "refused" and "not FAILED" in a["message"] for a in resets)


def test_reconcile_marks_a_package_whose_archive_copies_went_missing(tmp_path: Path, failed: Path) -> None:
    cfg = clone(failed, tmp_path / "site")
    fixed = fix_installation(cfg)
    assert run_packhorse("reset", "transfer", "--all-failed", "-c", str(fixed)).returncode == 0
    assert run_packhorse("run", "-c", str(fixed), "--until-idle", "--quiet").returncode == 0
    api = api_for(fixed)
    h = api.auth(api.admin)
    assert api.client.post("/api/transfer/raw-data-package/reconcile-inconsistent", headers=h).json()["changed"] == []
    # a fixity check (or a person) marks an archive copy missing: the package is no longer archived
    from sqlalchemy import update

    from packhorse.config import load_config
    from packhorse.db.models import DataLocation, PhysicalCopy
    from packhorse.db.session import Database

    db = Database(load_config(fixed).database_url)
    db.transact(lambda s: s.execute(update(PhysicalCopy).where(PhysicalCopy.location_id.in_(
        s.query(DataLocation.id).filter(DataLocation.name == "cologne-lta").scalar_subquery())).values(status="missing")))
    out = api.client.post("/api/transfer/raw-data-package/1/reconcile", headers=h).json()
    assert out["changed"] and not out["archived"]
    assert json.loads(run_packhorse("status", "-c", str(fixed), "--json").stdout)["packages"]["archived"] == 0
    assert api.client.post("/api/transfer/raw-data-package/99/reconcile", headers=h).status_code == 404
    cli = run_packhorse("reconcile", "-c", str(fixed), "--json")
    assert cli.returncode == 0 and json.loads(cli.stdout) == {"checked": 1, "changed": []}


def test_cli_diagnose_token_and_audit(inst) -> None:
    cfg, api = inst
    op = _failed_transfers(api)[0]
    r = run_packhorse("diagnose", "transfer", str(op["operation_id"]), "-c", str(cfg), "--json")
    assert r.returncode == 1  # the operation is FAILED
    rep = json.loads(r.stdout)
    assert rep["operation"]["id"] == op["operation_id"] and "transfer command failed" in rep["diagnosis"]
    live = json.loads(run_packhorse("diagnose", "--package", op["package"], "--live", "-c", str(cfg), "--json").stdout)
    assert any(x.get("live_check", {}).get("checked") for x in live)
    assert run_packhorse("diagnose", "transfer", "9999", "-c", str(cfg)).returncode == 1
    assert run_packhorse("diagnose", "bogus", "1", "-c", str(cfg)).returncode == 2
    created = run_packhorse("token", "create", "--role", "observer", "--name", "scientist", "-c", str(cfg))
    assert created.returncode == 0
    token = created.stdout.splitlines()[-1]
    assert token.startswith("ph_") and " " not in token
    assert api.client.get("/api/whoami", headers=api.auth(token)).json() == {"name": "scientist", "role": "observer"}
    listed = run_packhorse("token", "list", "-c", str(cfg), "--json")
    assert token not in listed.stdout and "scientist" in listed.stdout
    assert run_packhorse("token", "create", "--role", "root", "--name", "x", "-c", str(cfg)).returncode == 2
    assert run_packhorse("token", "revoke", "scientist", "-c", str(cfg)).returncode == 0
    assert api.client.get("/api/whoami", headers=api.auth(token)).status_code == 401
    audit = json.loads(run_packhorse("audit", "-c", str(cfg), "--json").stdout)
    assert [a["action"] for a in audit[:3]] == ["token.revoke", "token.create", "token.create"]
    assert audit[0]["actor"].startswith("cli:") and audit[1]["result"] == "refused"


def test_circuit_breakers_health_and_force_retry_through_the_api(inst) -> None:
    cfg, api = inst
    import datetime as dt

    from packhorse.config import load_config
    from packhorse.db.models import CircuitBreaker, utcnow
    from packhorse.db.session import Database

    h, obs = api.auth(api.admin), api.auth(api.observer)
    op = _failed_transfers(api)[0]
    oid = op["operation_id"]
    db = Database(load_config(cfg).database_url)
    now = utcnow()
    db.transact(lambda s: s.add(CircuitBreaker(kind="transfer", operation_id=oid, stall_count=3, last_stall_attempt=1,
                                               last_stall_at=now, opened_at=now, state="open", trips=1,
                                               next_attempt_at=now + dt.timedelta(hours=1))))
    listed = api.client.get("/api/admin/breakers", headers=h).json()
    assert [(b["kind"], b["operation_id"], b["state"], b["stall_count"]) for b in listed] == [("transfer", oid, "open", 3)]
    assert 'packhorse_circuit_breakers_open{kind="transfer"} 1.0' in api.client.get("/metrics").text
    rep = api.client.get(f"/api/admin/diagnose/transfer/{oid}", headers=h).json()
    assert rep["breaker"]["state"] == "open" and "blocked by its open circuit breaker (3 stalls)" in rep["diagnosis"]
    assert api.client.get("/api/admin/breakers", headers=obs).status_code == 403
    assert api.client.post(f"/api/admin/breakers/transfer/{oid}/reset", headers=obs).status_code == 403
    r = api.client.post(f"/api/admin/breakers/transfer/{oid}/reset", headers=h, json={"reason": "mount fixed"})
    assert r.status_code == 200 and r.json()["state"] == "closed"
    assert 'packhorse_circuit_breakers_open{kind="transfer"} 0.0' in api.client.get("/metrics").text
    assert api.client.post("/api/admin/breakers/transfer/9999/reset", headers=h).status_code == 404
    r = api.client.post(f"/api/transfer/operation/transfer/{oid}/force-retry", headers=h, json={"reason": "try now"})
    assert r.status_code == 200 and r.json() == {"kind": "transfer", "operation_id": oid, "previous_status": "FAILED",
                                                 "status": "PENDING"}
    raw = api.client.get("/api/admin/diagnose/raw_data_package/1", headers=h).json()
    assert raw["operation"]["status"] == "COMPLETED"
    assert api.client.post("/api/transfer/operation/raw_data_package/1/force-retry", headers=h).status_code == 409
    actions = [(a["action"], a["result"]) for a in api.client.get("/api/admin/audit", headers=h).json()]
    assert ("breaker.reset", "ok") in actions and ("operation.force_retry", "ok") in actions
    assert ("operation.force_retry", "refused") in actions
    health = api.client.get("/api/health", headers=obs)
    assert health.status_code == 200 and set(health.json()) == {
        "services", "dead", "scans_overdue", "no_monitor", "leases_not_reclaimed", "sites_unreachable"}
    cli = run_packhorse("breaker", "reset", "transfer", str(oid), "-c", str(cfg), "--json")
    assert cli.returncode == 0
    assert json.loads(run_packhorse("audit", "-c", str(cfg), "--json").stdout)[0]["action"] == "breaker.reset"


def test_locate_history_and_failure_groups_through_the_api_and_the_cli(inst) -> None:
    cfg, api = inst
    # where is my file: observers see that attempts failed, admins why
    obs = api.client.get("/api/transfer/locate", params={"q": "cam/obs1/a.dat"}, headers=api.auth(api.observer))
    assert obs.status_code == 200 and obs.json()["matched"] == "file"
    assert ERROR_TEXT not in obs.text and "TransferCommandError" not in obs.text
    pkg = obs.json()["packages"][0]
    assert pkg["name"] == "cam/obs1" and "transfer failed" in [e["event"] for e in pkg["timeline"]]
    adm = api.client.get("/api/transfer/locate", params={"q": "cam/obs1"}, headers=api.auth(api.admin)).json()
    assert adm["matched"] == "package" and ERROR_TEXT in json.dumps(adm)
    assert api.client.get("/api/transfer/locate", params={"q": ""}, headers=api.auth(api.observer)).status_code == 422
    cli = run_packhorse("locate", "cam/obs1/a.dat", "--json", "-c", str(cfg))
    assert cli.returncode == 0, cli.stderr
    assert json.loads(cli.stdout)["packages"][0]["name"] == "cam/obs1"
    assert run_packhorse("locate", "cam/none", "-c", str(cfg)).returncode == 1
    # the history: completed packaging and bundling, the transfers' failures
    h = api.client.get("/api/transfer/history", params={"minutes": 30}, headers=api.auth(api.observer))
    assert h.status_code == 200
    h = h.json()
    assert sum(h["throughput"]["raw_data_package"]["files_per_minute"]) > 0 and sum(h["failures"]["transfer"]) == 2
    assert api.client.get("/api/transfer/history", params={"minutes": 0}, headers=api.auth(api.observer)).status_code == 422
    # failures by cause: admins only; a group reset needs a reason
    assert api.client.get("/api/admin/failures", headers=api.auth(api.observer)).status_code == 403
    groups = api.client.get("/api/admin/failures", headers=api.auth(api.admin)).json()["groups"]
    assert sorted((g["location"], g["error_type"], g["count"]) for g in groups) == [
        ("cologne-buffer", "TransferCommandError", 1), ("cornell-buffer", "TransferCommandError", 1)]
    body = {"kind": "transfer", "location": "cologne-buffer", "error_type": "TransferCommandError"}
    assert api.client.post("/api/admin/failures/reset", json={**body, "reason": ""},
                           headers=api.auth(api.admin)).status_code == 422
    r = api.client.post("/api/admin/failures/reset", json={**body, "reason": "mount back"}, headers=api.auth(api.admin))
    assert r.status_code == 200 and r.json()["count"] == 1
    left = api.client.get("/api/admin/failures", headers=api.auth(api.admin)).json()
    assert [g["location"] for g in left["groups"]] == ["cornell-buffer"] and left["failed"] == 1
