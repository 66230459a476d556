"""Flags merged into the one versioned config (`api.config.merge` through `load_settings`): a
flag given beats the file's value, the file's beats the default; a key's old spelling is read
as the new key with one warning naming it; an unknown key is refused with its path; a flag's
bad value is refused naming the flag and its key."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict, Field

from elastic_gpu.api.config import loader
from elastic_gpu.api.config.loader import ConfigError, load_settings
from elastic_gpu.api.config.merge import (
    Override,
    Rename,
    flag_field,
    with_new_spellings,
    with_overrides,
)
from elastic_gpu.controller.config import load_config


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "controller.yaml"
    path.write_text(text)
    return path


def lease(duration: float | None = None, deadline: float | None = None) -> list[Override]:
    return [Override("leaderElection.leaseDurationSeconds", "--lease-duration", duration),
            Override("leaderElection.renewDeadlineSeconds", "--renew-deadline", deadline)]


def test_a_flag_given_beats_the_file_and_the_file_beats_the_default(tmp_path: Path) -> None:
    path = write(tmp_path, "leaderElection: {leaseDurationSeconds: 40, renewDeadlineSeconds: 30}\n"
                           "workers: 4\n")
    settings = load_config(path, lease(duration=60.0))
    election = settings.leader_election
    assert election.lease_duration_s == 60.0  # the flag
    assert election.renew_deadline_s == 30.0  # the file (no flag given)
    assert election.retry_period_s == 2.0  # the default (neither)
    assert settings.workers == 4


def test_a_flag_not_given_leaves_the_files_value(tmp_path: Path) -> None:
    path = write(tmp_path, "budgets: {defaultGPUHours: 2.5, defaultPeriod: 24h}\n")
    flags = [Override("budgets.defaultGPUHours", "--budget-default-gpu-hours", None),
             Override("budgets.defaultPeriod", "--budget-default-period", None)]
    budgets = load_config(path, flags).budgets
    assert (budgets.default_gpu_hours, budgets.default_period) == (2.5, "24h")


def test_flags_alone_make_the_config_without_a_file() -> None:
    flags = [Override("controllers", "--only", ["budgets"]),
             Override("budgets.refreshSeconds", "--budget-refresh-seconds", 2)]
    settings = load_config(None, flags)
    assert settings.controllers == ("budgets",)
    assert settings.budgets.refresh_s == 2
    assert settings.leader_election.lease_name == "egpu-controller"


def test_every_controller_setting_is_read_from_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, """\
apiVersion: elasticgpu.io/v1alpha1
kind: ControllerConfig
controllers: [claims, budgets]
workers: 3
backoff: {baseSeconds: 0.5, maxSeconds: 5}
leaderElection: {leaseNamespace: egpu, leaseName: ctl, leaseDurationSeconds: 20,
                 renewDeadlineSeconds: 15, retryPeriodSeconds: 3}
metrics: {host: 0.0.0.0, port: 9090}
extender: {url: "https://x:8888", caFile: /ca.crt, clientCertFile: /c.crt,
           clientKeyFile: /c.key}
budgets: {defaultGPUHours: 10, defaultPeriod: 1h, refreshSeconds: 5, minWriteSeconds: 0}
mig: {enabled: false}
defrag: {enabled: true}
""")
    s = load_config(path)
    assert s.controllers == ("claims", "budgets") and s.workers == 3
    assert (s.backoff.base_s, s.backoff.max_s) == (0.5, 5.0)
    le = s.leader_election
    assert (le.lease_namespace, le.lease_name, le.lease_duration_s, le.renew_deadline_s,
            le.retry_period_s) == ("egpu", "ctl", 20.0, 15.0, 3.0)
    assert (s.metrics.host, s.metrics.port) == ("0.0.0.0", 9090)
    assert (s.extender.url, s.extender.ca_file, s.extender.client_cert_file,
            s.extender.client_key_file) == ("https://x:8888", "/ca.crt", "/c.crt", "/c.key")
    assert (s.budgets.default_gpu_hours, s.budgets.default_period, s.budgets.refresh_s,
            s.budgets.min_write_s) == (10.0, "1h", 5, 0.0)
    assert not s.mig.enabled and s.defrag.enabled


def test_an_unknown_key_is_refused_with_its_path(tmp_path: Path) -> None:
    path = write(tmp_path, "leaderElection: {leaseDurationSecond: 20}\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert err.value.field == "leaderElection.leaseDurationSecond"
    assert "is not a known key" in str(err.value) and str(path) in str(err.value)


def test_a_flags_bad_value_is_refused_naming_the_flag_and_its_key(tmp_path: Path) -> None:
    path = write(tmp_path, "workers: 2\n")
    with pytest.raises(ConfigError) as err:
        load_config(path, [Override("metrics.port", "--metrics-port", 70000)])
    assert err.value.field == "--metrics-port (metrics.port)"
    assert err.value.value == "70000 (an integer)"


def test_a_rule_between_keys_names_the_flags_that_set_them() -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, lease(duration=10.0, deadline=10.0))
    assert err.value.field == "leaderElection (set by --lease-duration, --renew-deadline)"
    assert "must exceed renewDeadlineSeconds" in str(err.value)


class _Renamed(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, strict=True)

    plugin_directory: str = Field(default="/d", validation_alias="pluginDirectory")


class _Outer(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    dra: _Renamed = _Renamed()


RENAMES = (Rename("dra.pluginDir", "dra.pluginDirectory"),)


def test_an_old_spelling_is_read_as_the_new_key_with_one_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loader, "_WARNED", set())
    path = write(tmp_path, "dra: {pluginDir: /old}\n")
    with caplog.at_level(logging.WARNING, logger=loader.__name__):
        first = load_settings(path, _Outer, "TestConfig", renames=RENAMES)
        again = load_settings(path, _Outer, "TestConfig", renames=RENAMES)
    assert first.dra.plugin_directory == again.dra.plugin_directory == "/old"
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1, warnings
    assert "dra.pluginDir is the old spelling of dra.pluginDirectory" in warnings[0]
    # without the rename the old key is unknown: the rename is what reads it
    with pytest.raises(ConfigError, match=r"dra\.pluginDir: got '/old'"):
        load_settings(path, _Outer, "TestConfig")


def test_both_spellings_of_a_key_are_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "dra: {pluginDir: /old, pluginDirectory: /new}\n")
    with pytest.raises(ConfigError) as err:
        load_settings(path, _Outer, "TestConfig", renames=RENAMES)
    assert err.value.field == "dra.pluginDir"
    assert "keep dra.pluginDirectory only" in str(err.value)


def test_a_flag_beats_a_value_given_under_the_old_spelling(tmp_path: Path) -> None:
    path = write(tmp_path, "dra: {pluginDir: /old}\n")
    settings = load_settings(path, _Outer, "TestConfig", renames=RENAMES,
                             overrides=[Override("dra.pluginDirectory", "--dir", "/flag")])
    assert settings.dra.plugin_directory == "/flag"


def test_merge_functions_leave_their_input_alone() -> None:
    data = {"a": {"b": 1}}
    assert with_overrides(data, [Override("a.c", "--c", 2), Override("d.e", "--e", 3)]) == \
        {"a": {"b": 1, "c": 2}, "d": {"e": 3}}
    assert with_new_spellings(data, [Rename("a.b", "a.n")]) == ({"a": {"n": 1}}, [
        Rename("a.b", "a.n")])
    assert data == {"a": {"b": 1}}
    # a key whose parent is no mapping is left for the model to refuse there
    assert with_overrides({"a": 5}, [Override("a.c", "--c", 2)]) == {"a": 5}
    assert flag_field("x", [Override("x", "--x", None)]) == "x"  # not given: not named


def test_the_agents_old_directory_keys_are_read_with_a_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    from elastic_gpu.agent.config import load_config as load_agent_config

    monkeypatch.setattr(loader, "_WARNED", set())
    path = tmp_path / "agent.yaml"
    path.write_text("devicePluginDir: /dp/\ndra: {cdiDir: /cdi, registryDir: /reg}\n")
    with caplog.at_level(logging.WARNING, logger=loader.__name__):
        config = load_agent_config(path)
    assert str(config.devicePluginDirectory) == "/dp"
    assert (str(config.dra.cdiDirectory), str(config.dra.registryDirectory)) == ("/cdi", "/reg")
    warned = " ".join(r.getMessage() for r in caplog.records)
    for old, new in (("devicePluginDir", "devicePluginDirectory"),
                     ("dra.cdiDir", "dra.cdiDirectory"), ("dra.registryDir", "dra.registryDirectory")):
        assert f"{old} is the old spelling of {new}" in warned, warned
    path.write_text("devicePluginDir: /a/\ndevicePluginDirectory: /b/\n")
    with pytest.raises(ConfigError, match="keep devicePluginDirectory only"):
        load_agent_config(path)


def test_a_bad_value_under_an_old_spelling_is_named_as_written(tmp_path: Path) -> None:
    from elastic_gpu.agent.config import load_config as load_agent_config

    path = tmp_path / "agent.yaml"
    path.write_text("dra: {cdiDir: relative}\n")
    with pytest.raises(ConfigError) as err:
        load_agent_config(path)
    assert err.value.field == "dra.cdiDir (now dra.cdiDirectory)"
    path.write_text("dra: {pluginDir: 5}\n")
    with pytest.raises(ConfigError) as err:
        load_settings(path, _Outer, "TestConfig", renames=RENAMES)
    assert err.value.field == "dra.pluginDir (now dra.pluginDirectory)"


def test_an_old_top_level_key_alone_is_no_configmap_file(tmp_path: Path) -> None:
    """A file of one string key that is no key of any form is a ConfigMap's `data` (the file
    under that key); an old spelling is a key of the agent's form, not such a file name."""
    from elastic_gpu.agent.config import load_config as load_agent_config

    path = tmp_path / "agent.yaml"
    path.write_text("devicePluginDir: ''\n")
    with pytest.raises(ConfigError) as err:
        load_agent_config(path)
    assert err.value.field == "devicePluginDir (now devicePluginDirectory)"
    assert "must be an absolute path" in str(err.value)


@pytest.mark.parametrize(("text", "flag", "enabled"), [
    ("leaderElection: {enabled: false}\n", True, True),   # the flag beats the file
    ("leaderElection: {enabled: true}\n", None, True),    # not given: the file's
    ("seed: 1\n", None, False),                           # neither: the default
])
def test_the_extenders_leader_elect_flag_merges_by_the_same_rule(
        tmp_path: Path, text: str, flag: bool | None, enabled: bool) -> None:
    from elastic_gpu.scheduler.config import load_config as load_scheduler_config

    path = tmp_path / "scheduler.yaml"
    path.write_text(text)
    flags = [Override("leaderElection.enabled", "--leader-elect", flag)]
    assert load_scheduler_config(path, flags).leader_election.enabled is enabled


def test_the_agents_metrics_flags_merge_by_the_same_rule(tmp_path: Path) -> None:
    from elastic_gpu.agent.config import load_config as load_agent_config
    from elastic_gpu.agent.config import parse_config

    path = tmp_path / "agent.yaml"
    path.write_text("metrics: {host: 127.0.0.1, port: 9400}\n")
    flags = [Override("metrics.port", "--metrics-port", 9500),
             Override("metrics.host", "--metrics-host", None)]
    metrics = load_agent_config(path, flags).metrics
    assert (metrics.host, metrics.port) == ("127.0.0.1", 9500)  # file's host, flag's port
    assert parse_config({}, "flags").metrics.port == 0  # neither: the default, no metrics
    with pytest.raises(ConfigError) as err:
        parse_config({}, "flags", [Override("metrics.port", "--metrics-port", -1)])
    assert err.value.field == "--metrics-port (metrics.port)"


def _extender_flags(**given: object) -> list[Override]:
    from elastic_gpu.cli.scheduler import FLAG_KEYS

    return [Override(key, flag, given.get(flag.lstrip("-").replace("-", "_")))
            for flag, key in FLAG_KEYS.items()]


def test_the_extenders_serving_flags_merge_into_its_config_by_the_same_rule(
        tmp_path: Path) -> None:
    from elastic_gpu.scheduler.app import serve_options
    from elastic_gpu.scheduler.config import load_config as load_scheduler_config

    path = tmp_path / "scheduler.yaml"
    path.write_text("host: 0.0.0.0\nport: 9443\ndrainSeconds: 3\nhealthPort: 8889\n"
                    "tls: {certFile: /tls/file.crt, keyFile: /tls/file.key, "
                    "clientCAFile: /tls/ca.crt}\n")
    # given flags beat the file; the others leave the file's values alone
    config = load_scheduler_config(path, _extender_flags(port=8443, tls_cert="/flag.crt",
                                                         tls_key="/flag.key"))
    options = serve_options(config, "replica-0")
    assert (options.host, options.port, options.drain_s, options.health_port) == (
        "0.0.0.0", 8443, 3.0, 8889)
    assert (str(options.tls_cert), str(options.tls_key), str(options.tls_client_ca)) == (
        "/flag.crt", "/flag.key", "/tls/ca.crt")
    assert options.identity == "replica-0"
    # neither flag nor file: the model's defaults, plain HTTP on loopback
    defaults = serve_options(load_scheduler_config(None, _extender_flags()))
    assert (defaults.host, defaults.port, defaults.drain_s, defaults.health_port) == (
        "127.0.0.1", 8888, 10.0, 0)
    assert defaults.tls_cert is None and defaults.tls_client_ca is None


@pytest.mark.parametrize(("text", "given", "field", "rule"), [
    ("", {"tls_client_ca": "/ca.crt"}, "tls (set by --tls-client-ca)",
     "clientCAFile needs certFile and keyFile (HTTPS)"),
    ("tls: {certFile: /a.crt}\n", {}, "tls", "certFile and keyFile go together"),
    ("", {"port": 0}, "--port (port)", "greater than or equal to 1"),
    ("drainSeconds: 301\n", {}, "drainSeconds", "less than or equal to 300"),
    ("", {"drain_seconds": -1.0}, "--drain-seconds (drainSeconds)",
     "greater than or equal to 0"),
])
def test_the_extenders_serving_settings_are_refused_naming_the_flag_or_key(
        tmp_path: Path, text: str, given: dict[str, object], field: str, rule: str) -> None:
    from elastic_gpu.scheduler.config import load_config as load_scheduler_config

    path = tmp_path / "scheduler.yaml"
    path.write_text(text or "seed: 0\n")
    with pytest.raises(ConfigError) as err:
        load_scheduler_config(path, _extender_flags(**given))
    assert err.value.field == field
    assert rule in str(err.value)
