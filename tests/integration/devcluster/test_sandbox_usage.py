"""Issue 28 on the sandbox, through `egpu sandbox up` as a user runs it: the fake usage model
(pod and kwok Node annotations `fake.elasticgpu.io/usage`) read by the allocation sync's
sampling loop, its `status.usage` seen by `kubectl get gpudevices` and by the extender (started
with `--extender-config` turning `loadAware` on), drift Events, the agent's usage metrics served
for the kwok nodes by allocation-sync, and TFLOPS claims on two models.

One sandbox for the module; each test pins its pods to nodes of its own, so the tests do not
see each other's load. Cluster: three 2-card A100 nodes (`a100-000`: the three pods and the write
rate; `a100-001`: load-aware; `a100-002`: out-of-band memory) and one 1-card H100 node (TFLOPS).
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from egpu_testing.claims import claim_object, class_object
from egpu_testing.metricsdoc import check_page, metrics_table
from egpu_testing.sandbox import egpu, kubectl
from egpu_testing.workbench import metric_value

pytestmark = pytest.mark.integration

USAGE = "fake.elasticgpu.io/usage"
#: The allocation sync's write period (the agent's default `usage.writeSeconds`).
WRITE_SECONDS = 30
MIB = 1 << 20

CLUSTER = """\
nodeGroups:
- {name: a100, count: 3, gpus: 2, model: A100-SXM4-80GB, memoryMiB: 81920}
- {name: h100, count: 1, gpus: 1, model: H100 80GB HBM3, memoryMiB: 81920}
"""


def _wait(what: str, probe: Callable[[], Any], timeout_s: float = 120.0) -> Any:
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(0.5)
    raise AssertionError(f"{what}: not so after {timeout_s:.0f} s (last: {last!r})")


@pytest.fixture(scope="module")
def kc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    tmp = tmp_path_factory.mktemp("sandbox-usage")
    state, kubeconfig = tmp / "state", tmp / "kubeconfig"
    (tmp / "cluster.yaml").write_text(CLUSTER)
    (tmp / "extender.yaml").write_text("loadAware: true\n")
    up = egpu("sandbox", "up", "--cluster", str(tmp / "cluster.yaml"), "--extender-config",
              str(tmp / "extender.yaml"), "--kubeconfig", str(kubeconfig),
              "--state-dir", str(state))
    try:
        assert up.returncode == 0, up.stderr + up.stdout
        yield kubeconfig
    finally:
        down = egpu("sandbox", "down", "--state-dir", str(state))
        assert down.returncode == 0, down.stderr


def _pod(name: str, node: str, limits: dict[str, str], usage: dict[str, Any] | None = None
         ) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if usage is not None:
        meta["annotations"] = {USAGE: json.dumps({"main": usage})}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"nodeSelector": {"kubernetes.io/hostname": node},
                     "containers": [{"name": "main", "image": "cuda:fake",
                                     "resources": {"limits": limits}}]}}


def _share(memory_mib: int, core: int = 20) -> dict[str, str]:
    return {"elasticgpu.io/gpu-core": str(core), "elasticgpu.io/gpu-memory": str(memory_mib)}


def _get(kc: Path, *args: str) -> Any:
    return json.loads(kubectl(kc, "get", *args, "-o", "json"))


def _devices(kc: Path, node: str) -> dict[int, dict[str, Any]]:
    items = _get(kc, "gpudevices", "-l", f"elasticgpu.io/node={node}")["items"]
    return {int(d["spec"]["index"]): d for d in items}


def _bound_card(kc: Path, pod: str) -> int | None:
    """The card index the pod's assignment names (None while it is unbound)."""
    obj = _get(kc, "pod", pod)
    if not obj["spec"].get("nodeName"):
        return None
    for device in _get(kc, "gpudevices")["items"]:
        holders = json.dumps((device.get("status") or {}).get("pods") or [])
        if f"default/{pod} " in holders or f"default/{pod}\"" in holders:
            return int(device["spec"]["index"])
    return None


def _wait_observed(kc: Path, node: str, index: int, check: Callable[[dict[str, Any]], bool]
                   ) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        usage = (_devices(kc, node)[index].get("status") or {}).get("usage")
        return usage if usage is not None and check(usage) else None
    return dict(_wait(f"{node} card {index} observed usage", probe))


def _metrics_url(kc: Path) -> str:
    """The `/metrics` of allocation-sync, from `egpu sandbox status --json`."""
    status = egpu("sandbox", "status", "--json", "--state-dir", str(kc.parent / "state"))
    endpoint = json.loads(status.stdout)["components"]["allocation-sync"]["endpoint"]
    assert endpoint, status.stdout
    return f"{endpoint}/metrics"


def _http_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return str(response.read().decode())


def test_three_pods_observed_columns_and_drift_event(kc: Path) -> None:
    node = "a100-000"
    under = _pod("under", node, _share(8192), {"memoryMiB": 2000, "smPercent": 10})
    over = _pod("over", node, _share(4096), {"memoryMiB": 6000, "smPercent": 30})
    whole = _pod("whole", node, {"nvidia.com/gpu": "1"}, {"memoryMiB": 40000, "smPercent": 90})
    for pod in (under, over, whole):
        kubectl(kc, "apply", "-f", "-", input=json.dumps(pod))
    for name in ("under", "over", "whole"):
        _wait(f"{name} bound", lambda n=name: _bound_card(kc, n) is not None)
    cards = {name: _bound_card(kc, name) for name in ("under", "over", "whole")}
    assert cards["under"] == cards["over"] != cards["whole"]
    shared, whole_card = cards["under"], cards["whole"]
    assert shared is not None and whole_card is not None
    usage = _wait_observed(kc, node, shared, lambda u: u["usedMemoryMiB"] == 8000)
    assert usage["outOfBandMemoryMiB"] == 0
    _wait_observed(kc, node, whole_card, lambda u: u["usedMemoryMiB"] == 40000)
    # the observed columns of `kubectl get gpudevices`
    table = kubectl(kc, "get", "gpudevices", "-l", f"elasticgpu.io/node={node}")
    header, *rows = table.splitlines()
    assert "OBSERVED" in header and "OUTOFBAND" in header and "UTIL%" in header
    at = header.index("OBSERVED")  # the PODS column before it holds spaces: cut by position
    observed = {row.split()[0]: row[at:].split()[:3] for row in rows}
    assert observed[f"{node}-gpu{shared}"] == ["8000", "0", "40"]  # used, out of band, SM %
    assert observed[f"{node}-gpu{whole_card}"] == ["40000", "0", "90"]
    # the container above its share, and only it, gets the drift Event
    def over_events() -> list[dict[str, Any]]:
        return [e for e in _get(kc, "events", "--field-selector",
                                "reason=GPUMemoryOverShare")["items"]]
    events = _wait("GPUMemoryOverShare Event", over_events)
    assert {e["involvedObject"]["name"] for e in events} == {"over"}
    assert "6000 MiB" in events[0]["message"] and "4096 MiB" in events[0]["message"]
    assert events[0]["type"] == "Warning"
    # the metrics of the three: allocation-sync's endpoint, as `egpu sandbox status` records it
    url = _metrics_url(kc)

    def held(name: str, pod: str, card: int) -> str:
        return (f'elasticgpu_agent_{name}{{namespace="default",pod="{pod}",container="main",'
                f'node="{node}",device_index="{card}"}}')
    fake_mib = {"under": (shared, 2000), "over": (shared, 6000), "whole": (whole_card, 40000)}

    def page() -> str | None:
        text = _http_text(url)
        return text if all(
            metric_value(text, held("container_gpu_memory_used_bytes", pod, card)) == mib * MIB
            for pod, (card, mib) in fake_mib.items()) else None
    text = _wait("each pod's observed memory in the metrics", page)
    assert metric_value(text, held("container_over_share", "over", shared)) == 1
    assert metric_value(text, held("container_over_share", "under", shared)) is None
    assert metric_value(text, held("container_over_share", "whole", whole_card)) is None
    assert metric_value(text, held("container_gpu_sm_utilization_ratio", "over", shared)
                        ) == pytest.approx(0.30)
    # the whole card's own series: what it is, what its pod holds, what is observed on it
    card = f'node="{node}",device_index="{whole_card}"'
    for name, value in [("card_memory_capacity_bytes", 81920 * MIB),
                        ("card_compute_allocated_millicards", 1000),
                        ("card_memory_allocated_bytes", 81920 * MIB),
                        ("card_gpu_memory_used_bytes", 40000 * MIB),
                        ("card_out_of_band_memory_bytes", 0)]:
        assert metric_value(text, f"elasticgpu_agent_{name}{{{card}}}") == value, name
    assert metric_value(text, f"elasticgpu_agent_card_gpu_sm_utilization_ratio{{{card}}}"
                        ) == pytest.approx(0.90)
    assert metric_value(text, held("container_compute_allocated_millicards", "whole",
                                   whole_card)) == 1000
    # one endpoint for every kwok node, each under its node label
    assert {n: metric_value(text, f'elasticgpu_agent_card_healthy{{node="{n}"}}')
            for n in ("a100-000", "a100-001", "a100-002", "h100-000")} == {
        "a100-000": 2, "a100-001": 2, "a100-002": 2, "h100-000": 1}
    assert (metric_value(text, f'elasticgpu_agent_usage_writes_total{{node="{node}"}}')
            or 0) >= 2
    # the agent's names, types and labels (docs/metrics.md), less the two families no kwok
    # node has: kubelet's Allocate calls and MPS daemons
    absent = ("elasticgpu_agent_allocations_total", "elasticgpu_agent_mps_daemon_up")
    assert [p for p in check_page(metrics_table(), "agent", text)
            if not any(name in p for name in absent)] == []


def test_out_of_band_memory_refuses_a_share_with_the_reason(kc: Path) -> None:
    node = "a100-002"
    oob = {str(i): {"outOfBandMiB": 61440} for i in (0, 1)}
    kubectl(kc, "annotate", "node", node, "--overwrite", f"{USAGE}={json.dumps(oob)}")
    for index in (0, 1):
        _wait_observed(kc, node, index, lambda u: u["outOfBandMemoryMiB"] == 61440)
    # a share that fits the card on paper (30 GiB of 80) but not beside 60 GiB out of band
    kubectl(kc, "apply", "-f", "-", input=json.dumps(_pod("big", node, _share(30720))))

    def unschedulable() -> str | None:
        for cond in (_get(kc, "pod", "big").get("status") or {}).get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("reason") == "Unschedulable" \
                    and "out of band" in cond.get("message", ""):
                return str(cond["message"])
        return None
    message = _wait("big Unschedulable naming out-of-band memory", unschedulable)
    assert "61440 MiB" in message and "30720 MiB" in message
    # a share that fits beside it is placed on the same node
    kubectl(kc, "apply", "-f", "-", input=json.dumps(_pod("small", node, _share(8192))))
    _wait("small bound", lambda: _bound_card(kc, "small") is not None)
    assert _get(kc, "pod", "big")["spec"].get("nodeName") is None


def test_load_aware_puts_new_shares_on_the_cool_card(kc: Path) -> None:
    node = "a100-001"
    # card 0 hot: without loadAware the first of two equal cards (index 0) would be chosen
    hot = {"0": {"smPercent": 95}}  # card 1 stays idle
    kubectl(kc, "annotate", "node", node, "--overwrite", f"{USAGE}={json.dumps(hot)}")
    _wait_observed(kc, node, 0, lambda u: u["smUtilizationPercent"] == 95)
    _wait_observed(kc, node, 1, lambda u: u["smUtilizationPercent"] == 0)
    names = [f"cool-{i}" for i in range(3)]
    for name in names:
        kubectl(kc, "apply", "-f", "-", input=json.dumps(_pod(name, node, _share(4096, 10))))
        _wait(f"{name} bound", lambda n=name: _bound_card(kc, n) is not None)
    assert [_bound_card(kc, name) for name in names] == [1, 1, 1]


def test_usage_writes_stay_within_the_rate_limit(kc: Path) -> None:
    """A pod whose usage changes every second (news at every sample): the card's
    `status.usage` is still written at most once per write period (plus the first write)."""
    node = "a100-000"
    kubectl(kc, "apply", "-f", "-", input=json.dumps(
        _pod("busy", node, _share(16384), {"memoryMiB": 1000, "smPercent": 10})))
    _wait("busy bound", lambda: _bound_card(kc, "busy") is not None)
    card = _bound_card(kc, "busy")
    assert card is not None
    seen: list[str] = []
    start = time.monotonic()
    step = 0
    while time.monotonic() - start < WRITE_SECONDS + 10:
        step += 1
        use = {"main": {"memoryMiB": 1000 + 512 * (step % 20), "smPercent": 10 + step % 50}}
        kubectl(kc, "annotate", "pod", "busy", "--overwrite", f"{USAGE}={json.dumps(use)}")
        stamp = ((_devices(kc, node)[card].get("status") or {}).get("usage") or {}).get(
            "observedAt")
        if stamp and (not seen or seen[-1] != stamp):
            seen.append(stamp)
        time.sleep(1.0)
    elapsed = time.monotonic() - start
    # news kept coming, so the card was written; never more often than the period allows
    assert len(seen) >= 2, seen
    assert len(seen) <= int(elapsed // WRITE_SECONDS) + 2, (elapsed, seen)


def test_tflops_claims_get_each_models_share(kc: Path) -> None:
    kubectl(kc, "apply", "-f", "-", input=json.dumps(class_object("share")))
    # 900 TFLOPS is more than an A100 (312): only the H100 (989) takes it,
    # ceil(900 / 989 x 1000) = 911 milli
    kubectl(kc, "apply", "-f", "-", input=json.dumps(
        claim_object("fast", {"elasticgpu.io/gpu-tflops": 900,
                              "elasticgpu.io/gpu-memory": 1024})))
    h100 = _wait_claim(kc, "fast")
    assert h100["spec"]["node"] == "h100-000"
    assert [c["milli"] for c in h100["spec"]["cards"]] == [911]
    # 100 TFLOPS would be 102 milli of the H100, which has 89 left: an A100 takes it, 321 milli
    kubectl(kc, "apply", "-f", "-", input=json.dumps(
        claim_object("slow", {"elasticgpu.io/gpu-tflops": 100,
                              "elasticgpu.io/gpu-memory": 1024})))
    a100 = _wait_claim(kc, "slow")
    assert a100["spec"]["node"].startswith("a100-")
    assert [c["milli"] for c in a100["spec"]["cards"]] == [321]


def _wait_claim(kc: Path, name: str) -> dict[str, Any]:
    def bound() -> str | None:
        claim = _get(kc, "elasticgpuclaims", name)
        status = claim.get("status") or {}
        return status.get("elasticGPUName") if status.get("phase") == "Bound" else None
    egpu_name = _wait(f"claim {name} Bound", bound)
    return dict(_get(kc, "elasticgpus", str(egpu_name)))
