"""Hostile and broken config files through the real commands (issue #26, item 13).

Each input of the issue is its own case, run as a user would: `egpu agent --check --config F`
as a subprocess. Before the one strict loader, five of them crashed (a traceback) or hung the
reader, and fourteen were accepted, then broke the running agent (a sync thread killed by
`syncSeconds: 1e10`, 1,716 API calls in 25 s from `syncSeconds: 1e-9`). Now each is refused
with exit status 2 and a message naming the field (or where in the file) and the rule broken;
the scheduler's and controller's `--check` and `egpu sandbox up --cluster` read through the
same loader and refuse the same way, starting nothing. Every config the project ships (the
chart's rendered ConfigMaps in deploy/, the examples in docs/) passes `--check`.

The hostile files are small (the largest is 40 KB) and each command runs under a generous
deadline: a command still running at the deadline is a hang, reported as such, not a slow
machine's duration.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
#: A hang, not a slow start: the command reads one small file and exits.
DEADLINE_S = 120


@dataclass(frozen=True)
class Outcome:
    code: int
    output: str


def egpu(*args: str, cwd: Path | None = None) -> Outcome:
    """`egpu <args>` in a fresh process (as a user runs it), stdout and stderr together."""
    try:
        done = subprocess.run([sys.executable, "-m", "elastic_gpu.cli.main", *args],
                              capture_output=True, timeout=DEADLINE_S, cwd=cwd)
    except subprocess.TimeoutExpired:
        pytest.fail(f"egpu {' '.join(args)} was still running after {DEADLINE_S} s: the "
                    "config reader hangs on this input instead of refusing it")
    output = (done.stdout + done.stderr).decode("utf-8", "replace")
    return Outcome(done.returncode, output)


def refused_cleanly(outcome: Outcome, *words: str) -> None:
    flat = " ".join(outcome.output.split())
    assert "Traceback" not in outcome.output, f"a crash, not a refusal:\n{outcome.output}"
    assert outcome.code == 2, f"exit {outcome.code}, expected 2 (refused):\n{outcome.output}"
    for word in words:
        assert word in flat, f"the message does not say {word!r}:\n{outcome.output}"


BILLION_LAUGHS = "\n".join(
    ["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    + [f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]"
       for i in range(8)]) + "\n"

#: (case id, file bytes, words the refusal must contain: the field or place, and the rule).
HOSTILE: list[tuple[str, bytes, tuple[str, ...]]] = [
    # Five that crashed or hung the reader.
    ("5000-digit-integer", b"syncSeconds: " + b"9" * 5000 + b"\n",
     ("syncSeconds:", "an integer of 5000 digits: at most 18 digits")),
    ("complex-key", b"? [a, b]\n: 1\n", ("(top level): key a list: keys must be strings",)),
    ("non-utf8-byte", b"splitBoard: \xff\n", ("byte 0xff at offset 12 is not UTF-8",)),
    ("20000-deep-nesting", b"healthCheck: " + b"[" * 20000 + b"]" * 20000 + b"\n",
     ("healthCheck[0][0]", "nested deeper than 32 mappings and lists")),
    ("billion-laughs", BILLION_LAUGHS.encode(),
     ("a: anchor &a: anchors and aliases are not allowed",)),
    # Fourteen that were accepted.
    ("syncSeconds-1e10", b"syncSeconds: 1e10\n",
     ("syncSeconds: got 10000000000.0", "less than or equal to 3600")),
    ("syncSeconds-1e-9", b"syncSeconds: 1e-9\n",
     ("syncSeconds: got 1e-09", "greater than or equal to 1")),
    ("pollSeconds-1e-9", b"healthCheck: {pollSeconds: 1e-9}\n",
     ("healthCheck.pollSeconds: got 1e-09", "greater than or equal to 0.05")),
    ("ignoredXids-negative-and-huge", b"healthCheck: {ignoredXids: [-1, 1e20]}\n",
     ("healthCheck.ignoredXids[0]: got -1", "greater than or equal to 1",
      "healthCheck.ignoredXids[1]: got 1e+20", "must be a whole number")),
    ("recoverAfterSeconds-1e300", b"healthCheck: {recoverAfterSeconds: 1e300}\n",
     ("healthCheck.recoverAfterSeconds: got 1e+300", "less than or equal to 86400")),
    ("devicePluginDir-empty", b"devicePluginDir: ''\n",
     ("devicePluginDir (now devicePluginDirectory): got ''", "must be an absolute path")),
    ("devicePluginDir-relative", b"devicePluginDir: var/lib/kubelet/device-plugins\n",
     ("devicePluginDir (now devicePluginDirectory): got 'var/lib/kubelet/device-plugins'",
      "must be an absolute path")),
    ("mps-pipeDirectory-empty", b"sharing: {mode: mps, mps: {pipeDirectory: ''}}\n",
     ("sharing.mps.pipeDirectory: got ''", "must be an absolute path")),
    ("fake-section-under-nvml", b"backend: nvml\nfake: {inventory: /etc/hosts}\n",
     ("fake: got {'inventory': '/etc/hosts'}", "belongs to backend fake, not nvml")),
    ("fake-inventory-missing", b"backend: fake\nfake: {inventory: no-such-inventory.yaml}\n",
     ("fake.inventory: got 'no-such-inventory.yaml'", "must be an existing file",
      "does not exist")),
    ("fake-inventory-directory", b"backend: fake\nfake: {inventory: /}\n",
     ("fake.inventory: got '/'", "must be an existing file", "is a directory")),
    ("nvidia-gfd-untyped",
     b"version: v1\nflags:\n  gfd: {oneshot: maybe, noTimestamp: 1, sleepInterval: 60,\n"
     b"        outputFile: features, machineTypeFile: 7}\n",
     ("flags.gfd.oneshot: got 'maybe'", "flags.gfd.noTimestamp: got 1",
      "must be true or false", "flags.gfd.sleepInterval: got 60",
      "must be a duration such as 60s", "flags.gfd.outputFile: got 'features'",
      "flags.gfd.machineTypeFile: got 7", "must be an absolute path")),
    ("ix-mps-replicas-false", b'version: "4.3.0"\nsharing: {mps: {replicas: false}}\n',
     ("sharing.mps.replicas: got False", "must be a whole number")),
    ("ix-mps-replicas-0.0", b'version: "4.3.0"\nsharing: {mps: {replicas: 0.0}}\n',
     ("sharing.mps.replicas: got 0.0", "must be a whole number")),
    # The header: a version this agent does not know is refused, not guessed.
    ("unknown-apiVersion", b"apiVersion: elasticgpu.io/v2\nkind: AgentConfig\n",
     ("apiVersion: got 'elasticgpu.io/v2'", "must be 'elasticgpu.io/v1alpha1'")),
    ("kind-of-another-component", b"apiVersion: elasticgpu.io/v1alpha1\nkind: SchedulerConfig\n",
     ("kind: got 'SchedulerConfig'", "must be 'AgentConfig'")),
]


@pytest.mark.parametrize(("content", "words"), [(c, w) for _, c, w in HOSTILE],
                         ids=[name for name, _, _ in HOSTILE])
def test_agent_check_refuses_each_hostile_config_naming_field_and_rule(
        tmp_path: Path, content: bytes, words: tuple[str, ...]) -> None:
    path = tmp_path / "agent.yaml"
    path.write_bytes(content)
    assert len(content) < 64 * 1024, "hostile files stay small"
    outcome = egpu("agent", "--check", "--config", str(path), cwd=tmp_path)
    refused_cleanly(outcome, str(path), *words)


def test_agent_check_without_config_says_what_it_needs() -> None:
    refused_cleanly(egpu("agent", "--check"), "--check reads --config")


@pytest.mark.parametrize("component", ["scheduler", "controller"])
@pytest.mark.parametrize(("content", "words"), [
    (b"? [a, b]\n: 1\n", ("key a list: keys must be strings",)),
    (BILLION_LAUGHS.encode(), ("anchors and aliases are not allowed",)),
    (b"seed: " + b"9" * 5000 + b"\n", ("seed:", "at most 18 digits")),
    (b"x: \xff\n", ("byte 0xff at offset 3 is not UTF-8",)),
    (b"x: " + b"{a: " * 20000 + b"1" + b"}" * 20000 + b"\n", ("nested deeper than 32",)),
    (b"apiVersion: elasticgpu.io/v1alpha1\nkind: AgentConfig\n", ("kind: got 'AgentConfig'",)),
], ids=["complex-key", "billion-laughs", "5000-digits", "non-utf8", "deep-nesting",
        "wrong-kind"])
def test_scheduler_and_controller_check_refuse_the_same_input(
        tmp_path: Path, component: str, content: bytes, words: tuple[str, ...]) -> None:
    path = tmp_path / f"{component}.yaml"
    path.write_bytes(content)
    refused_cleanly(egpu(component, "--check", "--config", str(path)), str(path), *words)


@pytest.mark.parametrize(("component", "content", "words"), [
    ("scheduler", b"reservationTTLSeconds: 1e10\n",
     ("reservationTTLSeconds: got 10000000000.0", "less than or equal to 3600")),
    ("scheduler", b"seed: -1\n", ("seed: got -1", "greater than or equal to 0")),
    ("scheduler", b'reservationTTLSeconds: "30"\n',
     ("reservationTTLSeconds: got '30'", "must be a number written without quotes")),
    ("controller", b"mig: {ruleGraceSeconds: 1e300}\n",
     ("mig.ruleGraceSeconds: got 1e+300", "less than or equal to 3600")),
    ("controller", b'mig: {enabled: "no"}\n', ("mig.enabled: got 'no'", "must be true or false")),
])
def test_scheduler_and_controller_check_name_field_value_and_rule(
        tmp_path: Path, component: str, content: bytes, words: tuple[str, ...]) -> None:
    path = tmp_path / f"{component}.yaml"
    path.write_bytes(content)
    refused_cleanly(egpu(component, "--check", "--config", str(path)), str(path), *words)


def test_sandbox_up_refuses_a_complex_key_in_the_cluster_file_and_starts_nothing(
        tmp_path: Path) -> None:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("nodeGroups:\n- name: nv\n  count: 1\n  gpus: 8\n  ? [a, b]\n  : 1\n")
    state = tmp_path / "state"
    outcome = egpu("sandbox", "up", "--cluster", str(cluster), "--state-dir", str(state),
                   "--bin-dir", str(tmp_path / "no-binaries"))
    refused_cleanly(outcome, "--cluster", "nodeGroups[0]", "key a list: keys must be strings")
    assert not state.exists(), f"the refused sandbox left state behind: {list(state.iterdir())}"


# ------------------------------------------------------- the running agent, real control plane

@pytest.fixture
def bare_node(k8s_cluster: Any) -> Iterator[str]:
    """A Node with no GPUs yet and the GPUDevice CRD served: what a fresh GPU node looks like
    before its agent starts."""
    from egpu_testing.pytest_plugin import unique_name
    from elastic_gpu.devcluster.nodes import unregister_fake_node

    k8s_cluster.kubectl("apply", "-f", str(REPO / "deploy" / "crds" / "gpudevices.yaml"))
    k8s_cluster.kubectl("wait", "--for=condition=Established", "--timeout=120s",
                        "crd/gpudevices.elasticgpu.io")
    name = unique_name("cfg")
    resources = {"cpu": "16", "memory": "64Gi", "pods": "250"}
    k8s_cluster.kubectl("create", "-f", "-", input=json.dumps(
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
         "status": {"capacity": resources, "allocatable": resources}}))
    yield name
    unregister_fake_node(k8s_cluster.kube(), name)


@pytest.mark.parametrize("sync", ["1e-9", "1e10"])
def test_the_agent_refuses_a_sync_period_out_of_range_before_touching_the_api(
        k8s_cluster: Any, bare_node: str, sync: str) -> None:
    """The issue's attack on a real API server: `syncSeconds: 1e-9` made the agent write 1,716
    times in 25 s, `1e10` killed its sync thread while it went on serving. Now the agent exits
    2 naming the field and the bound, and the node gets no GPUDevice and no GPU capacity."""
    from egpu_testing.kubelet import KubeletDouble

    plugin_dir = Path(tempfile.mkdtemp(prefix="egpu-cfg-"))  # unix socket paths are short
    kubelet = KubeletDouble(plugin_dir)
    kubelet.start()
    try:
        (plugin_dir / "inv.yaml").write_text("cards: [{model: L4, memoryMiB: 23034}]\n")
        config = plugin_dir / "agent.yaml"
        config.write_text(f"backend: fake\nfake: {{inventory: inv.yaml}}\n"
                          f"devicePluginDirectory: {plugin_dir}\nsyncSeconds: {sync}\n")
        process = subprocess.Popen(
            [sys.executable, "-m", "elastic_gpu.cli.main", "agent", "--node", bare_node,
             "--kubeconfig", str(k8s_cluster.kubeconfig), "--config", str(config)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            output, _ = process.communicate(timeout=DEADLINE_S)
        except subprocess.TimeoutExpired:
            process.kill()
            output, _ = process.communicate()
            devices = k8s_cluster.kubectl("get", "gpudevices", "-l",
                                          f"elasticgpu.io/node={bare_node}", "-o", "name").stdout
            pytest.fail(f"egpu agent with syncSeconds: {sync} was still running after "
                        f"{DEADLINE_S} s instead of refusing its config; it published "
                        f"{devices.split() or 'nothing'}:\n{output.decode(errors='replace')}")
        refused_cleanly(Outcome(process.returncode, output.decode("utf-8", "replace")),
                        "syncSeconds: got", "Input should be")
    finally:
        kubelet.stop()
        shutil.rmtree(plugin_dir, ignore_errors=True)
    devices = k8s_cluster.kubectl("get", "gpudevices", "-l", f"elasticgpu.io/node={bare_node}",
                                  "-o", "name").stdout
    assert devices.split() == [], f"the refused agent published {devices}"
    node = json.loads(k8s_cluster.kubectl("get", "node", bare_node, "-o", "json").stdout)
    assert not [r for r in node["status"].get("capacity", {}) if "gpu" in r], node["status"]


# ------------------------------------------------------------------- what the project ships

def _yaml_blocks(doc: Path) -> list[str]:
    """The ```yaml blocks of a Markdown file, each YAML document of a block on its own."""
    blocks = re.findall(r"^```yaml\n(.*?)^```", doc.read_text(), flags=re.M | re.S)
    return [part for block in blocks for part in re.split(r"^---\n", block, flags=re.M)]


def _configmap_files(name: str) -> list[tuple[str, str]]:
    """(where, text) of every file in the ConfigMaps called `name` rendered into deploy/."""
    found = []
    for manifest in sorted((REPO / "deploy").rglob("*.yaml")):
        for obj in yaml.safe_load_all(manifest.read_text()):
            if (isinstance(obj, dict) and obj.get("kind") == "ConfigMap"
                    and obj["metadata"]["name"].startswith(name)):
                for key, text in obj.get("data", {}).items():
                    found.append((f"{manifest.relative_to(REPO)}: {key}", text))
    return found


def _shipped() -> list[tuple[str, str, str]]:
    """(component, where, text) of every shipped config file and documented example."""
    out = [("agent", where, text) for where, text in _configmap_files("elastic-gpu-agent")]
    out += [("scheduler", where, text)
            for where, text in _configmap_files("elastic-gpu-scheduler")
            if not text.lstrip().startswith("apiVersion: kubescheduler")]
    best = REPO / "deploy" / "scheduler" / "scheduler-best.yaml"  # egpu scheduler --config
    out.append(("scheduler", str(best.relative_to(REPO)), best.read_text()))
    docs = REPO / "docs"
    out += [("agent", f"docs/agent.md block {i}", text)
            for i, text in enumerate(_yaml_blocks(docs / "agent.md"))
            # the fake inventory's format, and pod fragments (an annotation shown in place)
            if not re.search(r"^(cards|metadata):", text, flags=re.M)]
    out += [("scheduler", f"docs/scheduler.md block {i}", text)
            for i, text in enumerate(_yaml_blocks(docs / "scheduler.md"))
            if re.search(r"^nodePolicy:", text, flags=re.M)]
    out += [("controller", f"docs/mig-adapter.md block {i}", text)
            for i, text in enumerate(_yaml_blocks(docs / "mig-adapter.md"))
            if re.search(r"^mig:", text, flags=re.M)]
    out += [("controller", f"docs/config.md block {i}", text)
            for i, text in enumerate(_yaml_blocks(docs / "config.md"))
            if re.search(r"^kind: ControllerConfig", text, flags=re.M)]
    out += [("controller", where, text)
            for where, text in _configmap_files("elastic-gpu-controller")]
    return out


SHIPPED = _shipped()


def test_every_kind_of_shipped_config_is_found() -> None:
    components = {component for component, _, _ in SHIPPED}
    assert components == {"agent", "scheduler", "controller"}, SHIPPED
    assert any(where.startswith("deploy/agent") for _, where, _ in SHIPPED), SHIPPED


@pytest.mark.parametrize(("component", "text"), [(c, t) for c, _, t in SHIPPED],
                         ids=[where for _, where, _ in SHIPPED])
def test_shipped_configs_pass_check(tmp_path: Path, component: str, text: str) -> None:
    path = tmp_path / f"{component}.yaml"
    path.write_text(text)
    outcome = egpu(component, "--check", "--config", str(path))
    assert outcome.code == 0, outcome.output
    assert f"{path}: valid" in outcome.output, outcome.output


def test_the_documented_cluster_file_is_read_by_the_same_loader(tmp_path: Path) -> None:
    from elastic_gpu.devcluster.nodes import load_cluster

    (example,) = [text for text in _yaml_blocks(REPO / "docs" / "sandbox.md")
                  if "nodeGroups:" in text]
    path = tmp_path / "cluster.yaml"
    path.write_text(example)
    assert [group.name for group in load_cluster(path)] == ["nv", "ix", "mig", "bi"]
