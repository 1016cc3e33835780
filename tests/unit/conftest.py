"""Unit-test fixtures: ``empty_db`` (an empty, migrated SQLite ops database per test, migrated
once per run) lives in ``tests/conftest.py``, shared with the integration tests."""
