"""The example alerting rules and Grafana panels in docs/ (docs/alerts/, docs/grafana-dashboard.json)
against the real ``/metrics``: the rules pass ``promtool check rules`` and their own ``promtool test
rules`` (the alerts fire on the series packhorse exports), every metric a rule or a panel names is
exported by ``/metrics`` of a real installation, and ``error_type`` labels are only in the answer
to a caller with an API token.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from api_support import Api, api_for, failed_installation

DOCS = Path(__file__).resolve().parents[2] / "docs"
RULES = DOCS / "alerts" / "packhorse-rules.yml"
RULE_TESTS = DOCS / "alerts" / "packhorse-rules.test.yml"
DASHBOARD = DOCS / "grafana-dashboard.json"
METRIC = re.compile(r"\bpackhorse_[a-z_]+\b")


def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        reason = "promtool is not installed (Debian package `prometheus`)"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    return found


def _exported(text: str) -> set[str]:
    """Every series name a scrape of ``text`` offers (counters with ``_total``, histograms with
    ``_bucket``, ``_sum``, ``_count``), from the ``# TYPE`` lines and the samples."""
    names = set()
    for fam in text_string_to_metric_families(text):
        names.add(fam.name)
        names.update({"counter": [fam.name + "_total"],
                      "histogram": [fam.name + s for s in ("_bucket", "_sum", "_count")]}.get(fam.type, []))
        names.update(s.name for s in fam.samples)
    return names


def _named_in_docs() -> dict[str, set[str]]:
    rules = yaml.safe_load(RULES.read_text())
    out: dict[str, set[str]] = {}
    for group in rules["groups"]:
        for rule in group["rules"]:
            out[f"rule {rule['alert']}"] = set(METRIC.findall(rule["expr"]))
            for text in rule.get("annotations", {}).values():
                out[f"rule {rule['alert']}"] |= set(METRIC.findall(text))
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        out[f"panel {panel['title']}"] = {m for t in panel.get("targets", []) for m in METRIC.findall(t["expr"])}
    return out


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_the_example_rules_pass_promtool_and_their_alerts_fire() -> None:
    promtool = _promtool()
    check = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS: 12 rules found" in check.stdout
    fire = subprocess.run([promtool, "test", "rules", str(RULE_TESTS)], capture_output=True, text=True,
                          cwd=RULE_TESTS.parent)
    assert fire.returncode == 0, fire.stdout + fire.stderr


def test_every_metric_of_the_rules_and_panels_is_exported_and_error_types_need_a_token(tmp_path: Path) -> None:
    api: Api = api_for(failed_installation(tmp_path / "site"))  # two transfers FAILED: TransferCommandError
    public = api.client.get("/metrics")
    assert public.status_code == 200
    exported = _exported(public.text)
    named = _named_in_docs()
    assert sum(len(v) for v in named.values()) > 20
    missing = {where: sorted(names - exported) for where, names in named.items() if names - exported}
    assert missing == {}, f"named in docs/ but not exported by /metrics: {missing}"
    for metric in ("packhorse_operations_blocked", "packhorse_location_unavailable",
                   "packhorse_location_unavailable_seconds", "packhorse_packages_not_archived",
                   "packhorse_oldest_not_archived_age_seconds", "packhorse_quarantined_bytes",
                   "packhorse_site_unreachable", "packhorse_link_unreachable_seconds"):
        assert any(metric in names for names in named.values()), f"no rule or panel uses {metric}"

    # what the installation holds, as the gauges say it
    m = _samples(public.text)
    assert m[("packhorse_operations_blocked", (("cause", "failed"),))] == 2
    assert m[("packhorse_operations_blocked", (("cause", "location_unavailable"),))] == 0
    assert m[("packhorse_location_unavailable", (("location", "cologne-lta"),))] == 0
    assert m[("packhorse_packages_not_archived", ())] == 1
    assert m[("packhorse_oldest_not_archived_age_seconds", ())] > 0

    # error_type: only for a caller with a token
    assert "error_type" not in public.text
    assert m[("packhorse_failure_events_total", (("kind", "transfer"),))] == 2
    for token in (api.observer, api.admin):
        detailed = api.client.get("/metrics", headers=Api.auth(token))
        assert detailed.status_code == 200
        d = _samples(detailed.text)
        assert d[("packhorse_failure_events_total", (("error_type", "TransferCommandError"), ("kind", "transfer")))] == 2
    refused = api.client.get("/metrics", headers=Api.auth("not-a-token"))
    assert refused.status_code == 401 and "error_type" not in refused.text
