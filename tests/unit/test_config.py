"""Configuration: the minimum schema, relative paths, env overrides and every refusal (ConfigError
naming the key)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from packhorse import config as cfg
from packhorse.config import load_config, settings_from_dict
from packhorse.domain import LocationRole, StorageType, TransferMethod
from packhorse.errors import ConfigError
from support import write_site_config


def minimal() -> dict[str, Any]:
    """The smallest valid configuration: fyst → cologne, as a parsed TOML document."""
    return {
        "sites": [{"name": "fyst"}, {"name": "cologne"}],
        "locations": [
            {"name": "fyst-source", "site": "fyst", "role": "source", "path": "src"},
            {"name": "fyst-buffer", "site": "fyst", "role": "buffer", "path": "fb"},
            {"name": "cologne-buffer", "site": "cologne", "role": "buffer", "path": "cb"},
            {"name": "cologne-lta", "site": "cologne", "role": "long_term_archive", "path": "ca"},
        ],
        "routes": [{"source_site": "fyst", "destination_sites": ["cologne"]}],
    }


def refuse(data: dict[str, Any], **kw: Any) -> str:
    """Validate ``data`` expecting a ConfigError; return its message."""
    with pytest.raises(ConfigError) as ei:
        settings_from_dict(data, source="site.toml", environ={}, **kw)
    msg = str(ei.value)
    assert msg.startswith("site.toml: "), msg
    return msg


# ------------------------------------------------------------------------------ loading


def test_minimum_schema_from_conftest_loads(tmp_path: Path) -> None:
    path = write_site_config(tmp_path)
    s = load_config(path)
    assert [x.name for x in s.sites] == ["fyst", "cologne", "cornell"]
    assert [l.name for l in s.locations] == [
        "fyst-source", "fyst-buffer", "cologne-buffer", "cologne-lta", "cornell-buffer", "cornell-lta"]
    assert s.location("cologne-lta").role is LocationRole.LONG_TERM_ARCHIVE
    assert s.location("cologne-lta").storage is StorageType.DISK
    route = s.route_from("fyst")
    assert route is not None and route.destination_sites == ["cologne", "cornell"]
    assert route.method is TransferMethod.COPY
    assert s.buffer_of("cornell").name == "cornell-buffer"
    assert s.recovery.lease_timeout_seconds == 2.0
    assert s.recovery.heartbeat_interval_seconds == 0.3
    assert s.recovery.renewal_deadline_seconds == pytest.approx(2 - 1.5 * 0.3)
    assert s.executor.workers == 2
    assert s.packaging.settle_seconds == 0


def test_defaults_follow_design_numbers() -> None:
    s = settings_from_dict(minimal(), environ={})
    r = s.recovery
    assert (r.lease_timeout_seconds, r.heartbeat_interval_seconds, r.monitor_interval_seconds) == (300, 60, 60)
    assert (r.max_retries, r.max_stall_count, r.circuit_breaker_timeout_seconds) == (3, 3, 3600)
    assert r.notification_cooldown_seconds == 3600
    assert s.reconcile_floor_seconds == 0.0  # embedded
    assert s.database.url == "sqlite:///packhorse.db"


def _duration_fields() -> list[tuple[str, str]]:
    """Every ``*_seconds`` key of every table: (section, key); section ``locations`` is per entry."""
    sections: dict[str, type[BaseModel]] = {
        "executor": cfg.ExecutorConfig, "packaging": cfg.PackagingConfig, "managers": cfg.ManagersConfig,
        "recovery": cfg.RecoveryConfig, "locations": cfg.LocationConfig,
    }
    out = []
    for section, model in sections.items():
        for name in model.model_fields:
            if name.endswith("_seconds"):
                out.append((section, name))
    return out


def test_duration_fields_are_all_found() -> None:
    # guard for the parametrization below: a new *_seconds key is picked up automatically
    keys = {k for _, k in _duration_fields()}
    assert {"lease_timeout_seconds", "settle_seconds", "retention_seconds", "poll_interval_seconds",
            "visibility_timeout_seconds", "bundle_max_wait_seconds"} <= keys


@pytest.mark.parametrize(("section", "key"), _duration_fields())
def test_every_duration_accepts_a_float(section: str, key: str) -> None:
    data = minimal()
    # 7.25 satisfies heartbeat × 1.5 < lease (default lease 300) and every lower bound
    value = 7.25 if key != "lease_timeout_seconds" else 95.5
    if section == "locations":
        data["locations"][1][key] = value
        got = getattr(settings_from_dict(data, environ={}).locations[1], key)
    else:
        data[section] = {key: value}
        got = getattr(getattr(settings_from_dict(data, environ={}), section), key)
    assert got == value and isinstance(got, float)


def test_float_durations_in_toml_file(tmp_path: Path) -> None:
    path = write_site_config(tmp_path, lease_timeout_seconds=2.5, heartbeat_interval_seconds=0.25,
                             settle_seconds=0.5, poll_interval_seconds=0.75, bundle_max_wait_seconds=1.5)
    s = load_config(path)
    assert s.recovery.lease_timeout_seconds == 2.5
    assert s.recovery.heartbeat_interval_seconds == 0.25
    assert s.packaging.settle_seconds == 0.5
    assert s.managers.poll_interval_seconds == 0.75
    assert s.packaging.bundle_max_wait_seconds == 1.5


def test_relative_paths_resolve_against_config_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_site_config(tmp_path / "conf")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # the working directory must not matter
    s = load_config(path)
    folder = path.resolve().parent
    assert s.location_path("cologne-lta") == folder / "sites" / "cologne" / "archive"
    assert s.location_path("fyst-source") == folder / "source"
    assert s.database_url == f"sqlite:///{folder / 'packhorse.db'}"


def test_absolute_paths_and_urls_are_kept(tmp_path: Path) -> None:
    src = tmp_path / "abs-source"
    path = write_site_config(tmp_path / "conf", source=str(src))
    text = path.read_text().replace('url = "sqlite:///packhorse.db"', f'url = "sqlite:///{tmp_path}/x.db"')
    path.write_text(text)
    s = load_config(path)
    assert s.location_path("fyst-source") == src
    assert s.database_url == f"sqlite:///{tmp_path}/x.db"
    for url in ("sqlite:///:memory:", "postgresql+psycopg://u@db/ops"):
        d = minimal()
        d["database"] = {"url": url}
        assert settings_from_dict(d, base_dir=tmp_path, environ={}).database_url == url


def test_a_leading_tilde_is_the_home_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # as in a shell, not a folder named "~" next to the config (found by a new-user trial)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    path = write_site_config(tmp_path / "conf", source="~/telescope/raw")
    text = path.read_text().replace('url = "sqlite:///packhorse.db"', 'url = "sqlite:///~/ops/packhorse.db"')
    path.write_text(text)
    s = load_config(path)
    assert s.location_path("fyst-source") == tmp_path / "home" / "telescope" / "raw"
    assert s.database_url == f"sqlite:///{tmp_path / 'home' / 'ops' / 'packhorse.db'}"


def test_config_loaded_with_relative_file_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_site_config(tmp_path / "conf")
    monkeypatch.chdir(tmp_path)
    s = load_config(Path("conf/packhorse.toml"))
    assert s.location_path("fyst-buffer") == tmp_path.resolve() / "conf" / "sites" / "fyst" / "buffer"


# ------------------------------------------------------------------------- env overrides


def test_env_override_wins_over_file() -> None:
    data = minimal()
    data["recovery"] = {"lease_timeout_seconds": 2, "heartbeat_interval_seconds": 0.3}
    s = settings_from_dict(data, environ={"PACKHORSE_RECOVERY__LEASE_TIMEOUT_SECONDS": "30"})
    assert s.recovery.lease_timeout_seconds == 30.0
    assert s.recovery.heartbeat_interval_seconds == 0.3  # other keys of the table are kept
    # the caller's document is not modified by the override
    assert data["recovery"]["lease_timeout_seconds"] == 2


def test_env_override_without_table_in_file_and_unrelated_vars_ignored() -> None:
    s = settings_from_dict(minimal(), environ={
        "PACKHORSE_DATABASE__URL": "postgresql+psycopg://u@db/ops",
        "PACKHORSE_LOG_LEVEL": "DEBUG",  # no "__": not an override
        "OTHER__X": "1",
    })
    assert s.database.url == "postgresql+psycopg://u@db/ops"


def test_env_override_through_load_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_site_config(tmp_path)
    monkeypatch.setenv("PACKHORSE_RECOVERY__LEASE_TIMEOUT_SECONDS", "30.5")
    assert load_config(path).recovery.lease_timeout_seconds == 30.5


def test_env_override_with_bad_value_names_the_key() -> None:
    with pytest.raises(ConfigError, match=r"recovery\.max_retries"):
        settings_from_dict(minimal(), environ={"PACKHORSE_RECOVERY__MAX_RETRIES": "many"})
    with pytest.raises(ConfigError, match=r"recovery\.no_such_key: unknown key"):
        settings_from_dict(minimal(), environ={"PACKHORSE_RECOVERY__NO_SUCH_KEY": "1"})


# ------------------------------------------------------------------------------ refusals


@pytest.mark.parametrize(("section", "key", "value", "says"), [
    ("packaging", "settle_seconds", float("inf"), "finite number"),   # --until-idle waited forever
    ("packaging", "settle_seconds", float("nan"), "finite number"),
    ("recovery", "lease_timeout_seconds", float("-inf"), "finite number"),
    ("packaging", "group_depth", True, "True is not a number"),       # silently acted as 1
    ("packaging", "settle_seconds", "2", "'2' is not a number"),
    ("executor", "workers", "4", "'4' is not a number"),
    ("deletion", "delete_source_files", 1, "1 is not true or false"),
    ("deletion", "delete_source_files", "yes", "'yes' is not true or false"),
])
def test_a_value_of_the_wrong_type_is_refused_naming_the_key(section: str, key: str, value: Any, says: str) -> None:
    msg = refuse({**minimal(), section: {key: value}})
    assert f"{section}.{key}: " in msg and says in msg, msg


def test_environment_text_is_converted_but_must_be_finite() -> None:
    s = settings_from_dict(minimal(), environ={"PACKHORSE_PACKAGING__SETTLE_SECONDS": "2.5",
                                               "PACKHORSE_EXECUTOR__WORKERS": "3",
                                               "PACKHORSE_DELETION__DELETE_SOURCE_FILES": "true"})
    assert (s.packaging.settle_seconds, s.executor.workers, s.deletion.delete_source_files) == (2.5, 3, True)
    with pytest.raises(ConfigError, match="packaging.settle_seconds: Input should be a finite number"):
        settings_from_dict(minimal(), environ={"PACKHORSE_PACKAGING__SETTLE_SECONDS": "inf"})


def test_minimal_is_valid() -> None:
    # every refusal below is a one-key change of this document
    settings_from_dict(minimal(), environ={})


def test_unknown_top_level_key() -> None:
    d = minimal()
    d["colour"] = "blue"
    assert "colour: unknown key" in refuse(d)


def test_base_dir_is_not_a_key() -> None:
    d = minimal()
    d["base_dir"] = "/"
    assert "base_dir: unknown key" in refuse(d)


def test_unknown_key_inside_table() -> None:
    d = minimal()
    d["packaging"] = {"foo": 1}
    assert "packaging.foo: unknown key" in refuse(d)


def test_unknown_key_inside_table_in_toml_file(tmp_path: Path) -> None:
    path = write_site_config(tmp_path, extra="[deletion]\nfoo = 1\n")
    with pytest.raises(ConfigError) as ei:
        load_config(path)
    assert str(ei.value).startswith(str(path))
    assert "deletion.foo: unknown key" in str(ei.value)


def test_a_misspelt_key_is_answered_with_the_key_of_its_table_it_is_close_to() -> None:
    d = minimal()
    d["packaging"] = {"settle_second": 2}
    assert "packaging.settle_second: unknown key (did you mean 'settle_seconds'?)" in refuse(d)
    d = minimal()
    d["locations"][1]["retention_second"] = 3  # in an array of tables: that table's keys
    assert "locations[1].retention_second: unknown key (did you mean 'retention_seconds'?)" in refuse(d)
    d = minimal()
    d["packaging"] = {"colour": 1}  # nothing close: no guess
    assert refuse(d).endswith("packaging.colour: unknown key")


def test_a_misspelt_environment_variable_is_named() -> None:
    d = minimal()
    with pytest.raises(ConfigError) as ei:
        settings_from_dict(d, environ={"PACKHORSE_PACKAGING__SETTLE_SECOND": "2"})
    assert ("packaging.settle_second: unknown key (did you mean 'settle_seconds'?) (from the environment variable "
            "PACKHORSE_PACKAGING__SETTLE_SECOND)") in str(ei.value), str(ei.value)


def test_unknown_key_inside_locations_entry() -> None:
    d = minimal()
    d["locations"][2]["colour"] = "red"
    assert "locations[2].colour: unknown key" in refuse(d)


def test_unknown_site_in_location() -> None:
    d = minimal()
    d["locations"][2]["site"] = "koeln"
    assert "locations[2].site: unknown site 'koeln'" in refuse(d)


def test_unknown_site_in_route_destination_and_source() -> None:
    d = minimal()
    d["routes"][0]["destination_sites"] = ["cologne", "koeln"]
    assert "routes[0].destination_sites: unknown site 'koeln'" in refuse(d)
    d = minimal()
    d["routes"][0]["source_site"] = "atacama"
    assert "routes[0].source_site: unknown site 'atacama'" in refuse(d)


def test_missing_buffer_for_destination_site() -> None:
    d = minimal()
    del d["locations"][2]  # cologne-buffer
    assert "routes[0]: site 'cologne' has no active location with role 'buffer'" in refuse(d)


def test_missing_buffer_for_source_site_and_inactive_buffer() -> None:
    d = minimal()
    del d["locations"][1]  # fyst-buffer
    assert "routes[0]: site 'fyst' has no active location with role 'buffer'" in refuse(d)
    d = minimal()
    d["locations"][2]["active"] = False
    assert "site 'cologne' has no active location with role 'buffer'" in refuse(d)


def test_destination_without_long_term_archive() -> None:
    d = minimal()
    d["locations"][3]["role"] = "processing"
    msg = refuse(d)
    assert "routes[0].destination_sites: site 'cologne' has no active 'long_term_archive' location" in msg


def test_source_site_without_source_location() -> None:
    d = minimal()
    d["locations"][0]["role"] = "processing"
    assert "routes[0].source_site: site 'fyst' has no 'source' location" in refuse(d)


def test_duplicate_site_names() -> None:
    d = minimal()
    d["sites"].append({"name": "fyst"})
    assert "sites: duplicate site name 'fyst'" in refuse(d)


def test_duplicate_location_names() -> None:
    d = minimal()
    d["locations"].append({"name": "cologne-lta", "site": "cologne", "role": "long_term_archive", "path": "other"})
    assert "locations: duplicate location name 'cologne-lta'" in refuse(d)


def test_overlapping_paths_same_path() -> None:
    d = minimal()
    d["locations"][3]["path"] = "cb"
    assert "locations[3].path: 'cb' (location 'cologne-lta') overlaps 'cb' (location 'cologne-buffer')" in refuse(d)


def test_overlapping_paths_same_folder_spelled_differently() -> None:
    d = minimal()
    d["locations"][3]["path"] = "./x/../cb/"
    assert "locations[3].path:" in refuse(d)


def test_overlapping_paths_one_inside_another() -> None:
    d = minimal()
    d["locations"][3]["path"] = "cb/archive"
    assert "locations[3].path: 'cb/archive' (location 'cologne-lta') overlaps 'cb'" in refuse(d)
    d = minimal()
    d["locations"][0]["path"] = "fb/sub"  # the earlier entry inside the later one
    assert "locations[1].path: 'fb' (location 'fyst-buffer') overlaps 'fb/sub'" in refuse(d)


def test_absolute_path_inside_relative_one_overlaps(tmp_path: Path) -> None:
    d = minimal()
    d["locations"][3]["path"] = str(tmp_path / "cb" / "deep")
    assert "locations[3].path:" in refuse(d, base_dir=tmp_path)


def test_sibling_paths_with_common_prefix_do_not_overlap() -> None:
    d = minimal()
    d["locations"][2]["path"] = "data/cb"
    d["locations"][3]["path"] = "data/cb2"
    s = settings_from_dict(d, environ={})
    assert s.location_path("cologne-lta").name == "cb2"


def test_wrong_role_value() -> None:
    d = minimal()
    d["locations"][1]["role"] = "scratch"
    msg = refuse(d)
    assert "locations[1].role:" in msg
    assert "'buffer'" in msg  # says what is allowed


def test_wrong_storage_and_executor_values() -> None:
    d = minimal()
    d["locations"][1]["storage"] = "tape"
    assert "locations[1].storage:" in refuse(d)
    d = minimal()
    d["executor"] = {"workers": 0}
    assert "executor.workers:" in refuse(d)


def test_disk_location_without_path() -> None:
    d = minimal()
    del d["locations"][3]["path"]
    msg = refuse(d)
    assert "locations[3]:" in msg and "'cologne-lta'" in msg and "'path'" in msg


def test_command_method_without_template() -> None:
    d = minimal()
    d["routes"][0]["method"] = "command"
    msg = refuse(d)
    assert "routes[0]:" in msg and "command" in msg
    d["routes"][0]["command"] = "rsync {source} /tmp/x"  # no {destination}
    assert "routes[0]:" in refuse(d)
    d["routes"][0]["command"] = "rsync {source} {destination}"
    assert settings_from_dict(d, environ={}).routes[0].command == "rsync {source} {destination}"
    d["routes"][0]["command"] = "rsync --partial --append-verify {source} {partial}"  # resumes
    assert "{partial}" in settings_from_dict(d, environ={}).routes[0].command


def test_heartbeat_must_fit_lease() -> None:
    d = minimal()
    d["recovery"] = {"lease_timeout_seconds": 3, "heartbeat_interval_seconds": 2}
    assert "recovery:" in refuse(d) and "heartbeat_interval_seconds" in refuse(d)


def test_every_error_is_reported_at_once() -> None:
    d = minimal()
    d["sites"].append({"name": "fyst"})
    d["locations"][2]["site"] = "koeln"
    msg = refuse(d)
    assert "duplicate site name 'fyst'" in msg and "unknown site 'koeln'" in msg


def test_wrong_type_for_list_table() -> None:
    d = minimal()
    d["sites"] = {"name": "fyst"}  # [sites] instead of [[sites]]
    assert "sites: Input should be a valid list" in refuse(d)


def test_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    with pytest.raises(ConfigError) as ei:
        load_config(missing)
    assert str(missing) in str(ei.value) and "not found" in str(ei.value)


def test_invalid_toml(tmp_path: Path) -> None:
    p = tmp_path / "packhorse.toml"
    p.write_text("[database\nurl = 'x'\n")
    with pytest.raises(ConfigError) as ei:
        load_config(p)
    assert str(ei.value).startswith(f"{p}: not valid TOML")


def test_not_utf8(tmp_path: Path) -> None:
    p = tmp_path / "packhorse.toml"
    p.write_bytes(b"[database]\nurl = '\xff'\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(p)


def test_extraction_limits_from_the_file_and_the_environment() -> None:
    from packhorse.bags.extraction import DEFAULT_LIMITS, ExtractionLimits

    s = settings_from_dict(minimal(), environ={})
    assert ExtractionLimits.from_settings(s) == DEFAULT_LIMITS
    data = {**minimal(), "extraction": {"max_members": 10, "max_member_bytes": 2048},
            "packaging": {"max_package_bytes": 2048}}
    s = settings_from_dict(data, environ={"PACKHORSE_EXTRACTION__MAX_TOTAL_BYTES": "4096"})
    assert ExtractionLimits.from_settings(s) == ExtractionLimits(max_members=10, max_member_bytes=2048,
                                                                 max_total_bytes=4096)
    with pytest.raises(ConfigError, match=r"site.toml: extraction.max_members: "):
        settings_from_dict({**minimal(), "extraction": {"max_members": 0}}, source="site.toml", environ={})
    with pytest.raises(ConfigError, match=r"extraction.max_member_bytes: .*not a number"):
        settings_from_dict({**minimal(), "extraction": {"max_member_bytes": "1"}}, source="site.toml", environ={})


def test_one_path_at_two_sites_is_two_folders_when_distributed_one_when_embedded() -> None:
    # distributed, each site's workers write only to that site's own hosts: the same path at
    # cologne and at cornell names two folders; embedded, every site is on this one host
    d = minimal()
    d["sites"].append({"name": "cornell"})
    d["locations"] += [{"name": "cornell-buffer", "site": "cornell", "role": "buffer", "path": "cb"},
                       {"name": "cornell-lta", "site": "cornell", "role": "long_term_archive", "path": "ca"}]
    d["routes"][0]["destination_sites"] = ["cologne", "cornell"]
    assert "locations[4].path: 'cb' (location 'cornell-buffer') overlaps 'cb' (location 'cologne-buffer')" in refuse(d)
    d["executor"] = {"kind": "celery", "broker_url": "redis://127.0.0.1:6379/0"}
    d["database"] = {"url": "postgresql+psycopg://postgres@127.0.0.1/x"}
    settings = settings_from_dict(d, source="site.toml", environ={})
    assert settings.location("cornell-buffer").path == settings.location("cologne-buffer").path
    # within one site the folders still must not overlap
    d["locations"][3]["path"] = "cb/archive"
    assert "locations[3].path: 'cb/archive' (location 'cologne-lta') overlaps 'cb'" in refuse(d)


def test_the_distributed_example_of_the_deployment_guide_is_a_valid_configuration() -> None:
    import re
    import tomllib

    doc = (Path(__file__).resolve().parents[2] / "docs" / "deployment.md").read_text(encoding="utf-8")
    blocks = [b for b in re.findall(r"```toml\n(.*?)```", doc, re.S) if "[[locations]]" in b]
    assert blocks, "docs/deployment.md has no example configuration"
    for block in blocks:
        settings = settings_from_dict(tomllib.loads(block), source="deployment.md", environ={})
        assert settings.executor.kind == "celery"


def test_an_extraction_limit_below_the_package_size_is_refused_at_start() -> None:
    d = minimal()
    d["extraction"] = {"max_member_bytes": 100_000}
    msg = refuse(d)
    assert "extraction.max_member_bytes: 100000 is less than packaging.max_package_bytes" in msg
    d["packaging"] = {"max_package_bytes": 100_000}
    settings_from_dict(d, source="site.toml", environ={})


def test_every_table_of_keys_takes_environment_overrides() -> None:
    # [quarantine] and [metrics] were documented as overridable and refused ("unknown section")
    s = settings_from_dict({}, environ={"PACKHORSE_QUARANTINE__MIN_RETENTION_SECONDS": "0",
                                        "PACKHORSE_METRICS__INFLUXDB__URL": "http://127.0.0.1:8086",
                                        "PACKHORSE_METRICS__INFLUXDB__DATABASE": "packhorse"})
    assert s.quarantine.min_retention_seconds == 0
    assert s.metrics.influxdb.url == "http://127.0.0.1:8086"
    from packhorse.config import ENV_SECTIONS, Settings
    tables = {name for name, f in Settings.model_fields.items() if hasattr(f.default, "model_fields")}
    assert tables <= set(ENV_SECTIONS), tables - set(ENV_SECTIONS)
