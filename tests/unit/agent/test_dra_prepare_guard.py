"""NodePrepareResources refuses a claim that would put a card over capacity beside the claims
prepared on the node (issue 41, `agent.dra.guard` over `core.dra.capacity_guard`): the plugin
with a scripted claim reader, its checkpoint and CDI directory on disk."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from egpu_testing.dra import claim_object, result
from elastic_gpu.agent.backends.fake import FakeBackend
from elastic_gpu.agent.config import parse_config
from elastic_gpu.agent.devices import logical_cards
from elastic_gpu.agent.dra.cdi import spec_file
from elastic_gpu.agent.dra.checkpoint import CHECKPOINT_FILE
from elastic_gpu.agent.dra.guard import pods_to_tell
from elastic_gpu.agent.dra.kubelet_plugin import DraPlugin
from elastic_gpu.agent.dra.prepare import ClaimRef, GrantInputs, PrepareError
from elastic_gpu.agent.grant import DeviceFiles
from elastic_gpu.core.dra.devices import device_table
from elastic_gpu.kube.errors import NotFound

NODE = "n"
INV = {"cards": [{"model": "A100", "memoryMiB": 40960},
                 {"model": "A100", "memoryMiB": 40960,
                  "mig": [{"profile": "3g.20gb", "uuid": "MIG-z"}]}]}
BACKEND = FakeBackend.from_dict(INV, NODE)
CARDS = {lc.index: lc for lc in logical_cards(BACKEND.discover(), False)}
MIG = next(n for n, r in device_table([lc.card for lc in CARDS.values()]).items() if r.mig)


class Claims:
    """The API's claims by name; a missing one is NotFound."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}

    def add(self, name: str, device: str, **consumed: str) -> ClaimRef:
        uid = f"uid-{name}"
        self.objects[name] = claim_object(name, "ns", uid, NODE, [result(
            NODE, device, consumed=consumed or None)])
        return ClaimRef("ns", name, uid)

    def __call__(self, ref: ClaimRef) -> Mapping[str, Any]:
        try:
            return self.objects[ref.name]
        except KeyError:
            raise NotFound(404, "NotFound", f"resourceclaims {ref.name!r}") from None


@pytest.fixture
def plugin(tmp_path: Path) -> tuple[DraPlugin, Claims, list[tuple[str, str]]]:
    claims = Claims()
    parsed = parse_config({})
    inputs = GrantInputs(parsed, "NVIDIA_VISIBLE_DEVICES",
                         DeviceFiles({}, []), BACKEND.isolation(parsed.sharing))
    out = DraPlugin(NODE, claims, lambda: CARDS, inputs, tmp_path / "plugin", tmp_path / "cdi")
    told: list[tuple[str, str]] = []
    out.on_refused = lambda claim, message: told.append((claim["metadata"]["name"], message))
    return out, claims, told


def test_a_share_past_the_card_is_refused_told_and_not_written(
        plugin: tuple[DraPlugin, Claims, list[tuple[str, str]]], tmp_path: Path) -> None:
    dra, claims, told = plugin
    dra.prepare(claims.add("a", "gpu-0", compute="60", memory="8Gi"))
    over = claims.add("b", "gpu-0", compute="50", memory="8Gi")
    with pytest.raises(PrepareError) as err:
        dra.prepare(over)
    assert str(err.value).startswith(
        "ResourceClaim ns/b (uid uid-b): refused, it would put a device over capacity: device "
        "gpu-0 would hold compute 110 % of 100 % with the claims prepared on this node "
        "(ns/a: 60 %, 8192 MiB)")
    assert told == [("b", str(err.value))]
    assert dra.checkpoint.uids() == ["uid-a"]
    assert not spec_file(tmp_path / "cdi", "uid-b").exists()
    # what fits beside it is prepared
    dra.prepare(claims.add("c", "gpu-0", compute="40", memory="8Gi"))
    assert dra.checkpoint.uids() == ["uid-a", "uid-c"]
    # the Event goes to the pods the refused claim is reserved for
    assert pods_to_tell(claims.objects["b"]) == [{
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"namespace": "ns", "name": "p", "uid": "pod-uid"}}]


def test_whole_cards_are_exclusive_and_a_mig_instance_has_one_holder(
        plugin: tuple[DraPlugin, Claims, list[tuple[str, str]]]) -> None:
    dra, claims, told = plugin
    dra.prepare(claims.add("whole", "gpu-0"))
    with pytest.raises(PrepareError, match="compute 101 % of 100 % and memory 40961 of 40960"):
        dra.prepare(claims.add("tiny", "gpu-0", compute="1", memory="1Mi"))
    dra.prepare(claims.add("mig-a", MIG))
    with pytest.raises(PrepareError, match=f"MIG device {MIG} is already prepared for ns/mig-a"):
        dra.prepare(claims.add("mig-b", MIG))
    assert [name for name, _ in told] == ["tiny", "mig-b"]


def test_a_prepared_claim_gone_from_the_api_no_longer_counts(
        plugin: tuple[DraPlugin, Claims, list[tuple[str, str]]]) -> None:
    """kubelet has not unprepared it yet (the agent was down when its pod went): a stale
    checkpoint entry must not block the node."""
    dra, claims, _ = plugin
    dra.prepare(claims.add("a", "gpu-0"))
    del claims.objects["a"]
    dra.prepare(claims.add("b", "gpu-0"))
    # deleted and created again under its name (another uid): not the prepared one either
    claims.objects["b"] = claim_object("b", "ns", "uid-b-again", NODE, None)
    dra.prepare(claims.add("c", "gpu-0"))
    assert dra.checkpoint.uids() == ["uid-a", "uid-b", "uid-c"]


def test_an_older_agents_entry_without_shares_is_counted_from_the_api(
        plugin: tuple[DraPlugin, Claims, list[tuple[str, str]]], tmp_path: Path) -> None:
    dra, claims, _ = plugin
    dra.prepare(claims.add("a", "gpu-0", compute="70", memory="8Gi"))
    path = tmp_path / "plugin" / CHECKPOINT_FILE
    data = json.loads(path.read_text())
    for device in data["claims"]["uid-a"]["devices"]:
        del device["share"]
    path.write_text(json.dumps(data))
    restarted = DraPlugin(NODE, claims, lambda: CARDS, dra.inputs, tmp_path / "plugin",
                          tmp_path / "cdi")
    with pytest.raises(PrepareError, match=r"ns/a: 70 %"):
        restarted.prepare(claims.add("b", "gpu-0", compute="40", memory="8Gi"))


def test_a_holder_that_cannot_be_read_again_still_counts(
        plugin: tuple[DraPlugin, Claims, list[tuple[str, str]]]) -> None:
    dra, claims, _ = plugin
    dra.prepare(claims.add("a", "gpu-0"))
    over = claims.add("b", "gpu-0")
    reader = dra.read_claim

    def flaky(ref: ClaimRef) -> Mapping[str, Any]:
        if ref.name == "a":
            raise TimeoutError("the API did not answer")
        return reader(ref)
    dra.read_claim = dra.guard.read_claim = flaky
    with pytest.raises(PrepareError, match="ns/a: 100 %"):
        dra.prepare(over)
