"""Issue #15, must-show 1: the Elastic GPU seed README's flow, verbatim, on a default sandbox.

`kubectl apply` of the README's class, two claims (gpu-core 10, gpu-memory 4) and two pods
naming them: both claims Bound, two ElasticGPUs, both pods bound with their claims' cards
(the webhook gave their containers the claims' share; the extender placed them on their
ElasticGPUs' node and cards), both ElasticGPUs on one card (the default binpack card tier);
`kubectl get egpuc,egpu` shows it.

Needs every part of #15: the webhook (claim admission), `egpu controller` (binding and
provisioning, run by the sandbox) and the extender (`POST /provision`, claim pods).
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from egpu_testing import sandbox as cli
from egpu_testing.seed import SEED_README
from elastic_gpu.core.assignment import CardShare

pytestmark = pytest.mark.integration

egpu = functools.partial(cli.egpu, timeout=300)
CLAIMS = ("gpushare-egpuc-1", "gpushare-egpuc-2")
PODS = {"test-cuda-1": "gpushare-egpuc-1", "test-cuda-2": "gpushare-egpuc-2"}
SHARE = {"elasticgpu.io/gpu-core": "10", "elasticgpu.io/gpu-memory": "4"}
#: what the sandbox's webhook adds for the quota (on by default, docs/budgets.md "Quota")
QUOTA = {"quota.elasticgpu.io/gpu-core": "10", "quota.elasticgpu.io/gpu-memory": "4"}


def get_json(kc: Path, *args: str) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(cli.kubectl(kc, "get", *args, "-o", "json"))
    return out


def diagnosis(kc: Path) -> str:
    shown = [cli.kubectl_run(kc, "get", "egpuc,egpu,pods", "-o", "wide").stdout,
             cli.kubectl_run(kc, "get", "events", "--sort-by=.lastTimestamp").stdout[-4000:]]
    return "\n".join(shown)


def wait_for(kc: Path, what: str, ready: Callable[[], bool], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not within {timeout_s:.0f} s:\n{diagnosis(kc)}")
        time.sleep(0.3)


def tables(text: str) -> list[list[dict[str, str]]]:
    """kubectl's tables (one per kind, separated by a blank line) as rows of column -> cell.
    Every cell here is one word (the CAPACITY JSON has no spaces)."""
    out: list[list[dict[str, str]]] = []
    for block in text.strip().split("\n\n"):
        header, *lines = block.strip().splitlines()
        columns = header.split()
        out.append([dict(zip(columns, line.split(), strict=True)) for line in lines])
    return out


def test_the_seed_readme_flow_verbatim_on_a_default_sandbox(tmp_path: Path) -> None:
    state, kc = tmp_path / "state", tmp_path / "kubeconfig"
    up = egpu("sandbox", "up", "--kubeconfig", str(kc), "--state-dir", str(state))
    assert up.returncode == 0, up.stderr + up.stdout
    try:
        applied = cli.kubectl_run(kc, "apply", "-f", "-", input=SEED_README)
        assert applied.returncode == 0, applied.stderr

        def claims_bound() -> bool:
            items = get_json(kc, "egpuc")["items"]
            return len(items) == 2 and all(
                (c.get("status") or {}).get("phase") == "Bound" for c in items)

        wait_for(kc, "both claims Bound", claims_bound)

        def pods_bound() -> bool:
            return all(get_json(kc, "pod", p)["spec"].get("nodeName") for p in PODS)

        wait_for(kc, "both pods bound", pods_bound)

        claims = {c["metadata"]["name"]: c for c in get_json(kc, "egpuc")["items"]}
        egpus = {e["metadata"]["name"]: e for e in get_json(kc, "egpu")["items"]}
        assert set(claims) == set(CLAIMS) and len(egpus) == 2
        for name, claim in claims.items():
            egpu_obj = egpus[claim["status"]["elasticGPUName"]]
            assert egpu_obj["metadata"]["name"] == f"egpu-{claim['metadata']['uid']}"
            assert egpu_obj["spec"]["claimRef"]["name"] == name
            assert egpu_obj["status"]["phase"] == "Bound"
            assert claim["spec"]["elasticGPUName"] == egpu_obj["metadata"]["name"]
            assert claim["status"]["node"] == egpu_obj["spec"]["node"]

        cards_of_pods = {}
        for pod_name, claim_name in PODS.items():
            pod = get_json(kc, "pod", pod_name)
            egpu_obj = egpus[claims[claim_name]["status"]["elasticGPUName"]]
            (container,) = pod["spec"]["containers"]
            assert container["resources"] == {"limits": SHARE | QUOTA,
                                              "requests": SHARE | QUOTA}
            assert pod["spec"]["nodeName"] == egpu_obj["spec"]["node"]
            assignment = json.loads(pod["metadata"]["annotations"]["elasticgpu.io/assignment"])
            assert assignment["node"] == egpu_obj["spec"]["node"]
            assert [CardShare.from_dict(c) for c in assignment["containers"]["test-cuda"]] == \
                [CardShare.from_dict(c) for c in egpu_obj["spec"]["cards"]]
            assert assignment["claims"] == {"test-cuda": egpu_obj["metadata"]["name"]}
            (card,) = egpu_obj["spec"]["cards"]
            assert (card["milli"], card["memoryMiB"]) == (100, 4)
            cards_of_pods[pod_name] = (pod["spec"]["nodeName"], card["index"], card["uuid"])
        # binpack: the second share goes on the card the first one started
        assert len(set(cards_of_pods.values())) == 1, cards_of_pods

        egpuc_table, egpu_table = tables(cli.kubectl(kc, "get", "egpuc,egpu"))
        node, index, _ = cards_of_pods["test-cuda-1"]
        assert sorted(row["NAME"] for row in egpuc_table) == [
            f"elasticgpuclaim.elasticgpu.io/{c}" for c in CLAIMS]
        for row in egpuc_table:
            claim = claims[row["NAME"].rsplit("/", 1)[1]]
            assert (row["STATUS"], row["ELASTICGPU"], row["CLASS"], row["NODE"]) == (
                "Bound", claim["status"]["elasticGPUName"], "gpushare-egpuclass", node)
            assert json.loads(row["CAPACITY"]) == {
                "gpushare.provisioner.elasticgpu.io/gpu-core": 10,
                "gpushare.provisioner.elasticgpu.io/gpu-memory": 4}
        assert sorted(row["CLAIM"] for row in egpu_table) == list(CLAIMS)
        for row in egpu_table:
            assert (row["NODE"], row["CARDS"], row["RECLAIMPOLICY"], row["STATUS"],
                    row["CLASS"]) == (node, str(index), "Retain", "Bound", "gpushare-egpuclass")
    finally:
        down = egpu("sandbox", "down", "--state-dir", str(state))
        assert down.returncode == 0, down.stderr
