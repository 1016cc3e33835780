"""The HTTP API conforms to its own OpenAPI schema: schemathesis generates requests
for every operation — as an admin on a real installation with FAILED operations, and without a
token — and checks that no response is a 5xx and every response matches its documented schema."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from api_support import api_for, failed_installation

MAX_EXAMPLES = 15


@pytest.fixture(scope="module")
def api_app(tmp_path_factory: pytest.TempPathFactory):
    api = api_for(failed_installation(tmp_path_factory.mktemp("schema") / "site"))
    app = api.client.app
    app.state.test_tokens = {"admin": api.admin, "observer": api.observer}
    return schemathesis.openapi.from_asgi("/openapi.json", app)


CHECKS = [schemathesis.checks.not_a_server_error, schemathesis.checks.status_code_conformance,
          schemathesis.checks.content_type_conformance, schemathesis.checks.response_schema_conformance]


def _for_every_operation(schema, examples: int, check) -> int:  # type: ignore[no-untyped-def]
    """Run ``check(case)`` on ``examples`` generated cases of every API operation; returns how
    many operations were exercised. (The schemathesis pytest plugin's lazy fixture does not
    work with this pytest, so the operations are walked here.)"""
    n = 0
    for result in schema.get_all_operations():
        operation = result.ok()

        @given(case=operation.as_strategy())
        @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def run(case) -> None:  # type: ignore[no-untyped-def]
            check(case)

        run()
        n += 1
    return n


def test_admin_requests_conform_to_the_schema(api_app) -> None:
    token = api_app.app.state.test_tokens["admin"]
    n = _for_every_operation(api_app, MAX_EXAMPLES, lambda case: case.call_and_validate(
        headers={"Authorization": f"Bearer {token}"}, checks=CHECKS))
    assert n >= 14


def test_requests_without_a_token_get_a_documented_401(api_app) -> None:
    def check(case) -> None:  # type: ignore[no-untyped-def]
        assert case.call_and_validate(checks=CHECKS).status_code == 401

    assert _for_every_operation(api_app, 3, check) >= 14
