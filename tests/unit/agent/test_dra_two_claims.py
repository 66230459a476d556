"""Issue 41: a container given devices of two ResourceClaims sees all of them in one
visible-devices variable (`agent.dra.prepare.claim_group`), through the plugin with scripted
claim and pod readers; and a union is never made where it would name cards a container was not
given (a claim shared by two pods, or containers using a claim with different claims)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from egpu_testing.dra import claim_object, env_of, result
from elastic_gpu.agent.backends.fake import FakeBackend
from elastic_gpu.agent.config import parse_config
from elastic_gpu.agent.devices import logical_cards
from elastic_gpu.agent.dra.kubelet_plugin import DraPlugin
from elastic_gpu.agent.dra.prepare import ClaimRef, GrantInputs, claim_group
from elastic_gpu.agent.grant import DeviceFiles

NODE = "n"
BACKEND = FakeBackend.from_dict({"cards": [{"model": "A100", "memoryMiB": 40960}] * 3}, NODE)
CARDS = {lc.index: lc for lc in logical_cards(BACKEND.discover(), False)}
INPUTS = GrantInputs(parse_config({}), "NVIDIA_VISIBLE_DEVICES", DeviceFiles({}, []), None)


def pod(containers: Mapping[str, list[str]], uid: str = "pod-uid") -> dict[str, Any]:
    entries = sorted({c for claims in containers.values() for c in claims})
    return {"metadata": {"name": "p", "namespace": "ns", "uid": uid},
            "spec": {"resourceClaims": [{"name": e, "resourceClaimName": e} for e in entries],
                     "containers": [{"name": name, "resources": {
                         "claims": [{"name": c} for c in claims]}}
                         for name, claims in containers.items()]}}


CLAIMS = {name: claim_object(name, "ns", f"uid-{name}", NODE, [result(NODE, f"gpu-{i}")])
          for i, name in enumerate(("a", "b", "c"))}


def plugin(root: Path, the_pod: Mapping[str, Any] | None,
           claims: Mapping[str, dict[str, Any]] = CLAIMS) -> DraPlugin:
    return DraPlugin(NODE, lambda ref: claims[ref.name], lambda: CARDS, INPUTS,
                     root / "plugin", root / "cdi", lambda ns, name: the_pod)


def visible(p: DraPlugin, name: str) -> str:
    prepared = p.prepare(ClaimRef("ns", name, f"uid-{name}"))
    return env_of(prepared.spec, f"uid-{name}-{prepared.devices[0].device}")[
        "NVIDIA_VISIBLE_DEVICES"]


def test_one_container_with_two_claims_sees_both_whichever_is_applied_last(
        tmp_path: Path) -> None:
    p = plugin(tmp_path, pod({"main": ["a", "b"]}))
    both = "GPU-fake-n-0,GPU-fake-n-1"
    assert visible(p, "a") == visible(p, "b") == both


def test_no_union_where_it_would_name_cards_not_given(tmp_path: Path) -> None:
    # containers using claim a with different claims beside it: each claim alone
    mixed = pod({"x": ["a", "b"], "y": ["a"]})
    assert claim_group(mixed, "a") == ("a",)
    assert claim_group(mixed, "b") == ("a", "b")
    p = plugin(tmp_path / "1", mixed)
    assert visible(p, "a") == "GPU-fake-n-0"
    # a claim reserved for two pods: prepared once for both, alone
    shared = dict(CLAIMS["a"])
    shared["status"] = {**shared["status"], "reservedFor": [
        {"resource": "pods", "name": "p", "uid": "pod-uid"},
        {"resource": "pods", "name": "q", "uid": "q-uid"}]}
    p = plugin(tmp_path / "2", pod({"main": ["a", "b"]}), {**CLAIMS, "a": shared})
    assert visible(p, "a") == "GPU-fake-n-0"
    # the pod read is not the claim's pod (another uid): alone
    p = plugin(tmp_path / "3", pod({"main": ["a", "b"]}, uid="other"))
    assert visible(p, "a") == "GPU-fake-n-0"
