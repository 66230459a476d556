"""The DRA kubelet plugin's pure parts and files: a claim's allocation to CDI devices with the
device-plugin path's grant, the refusals, the CDI spec and the checkpoint; and both gRPC
services on real unix sockets with a scripted claim reader."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import grpc
import pytest

from egpu_testing.dra import claim_object, env_of, result
from elastic_gpu.agent.backends.fake import FakeBackend
from elastic_gpu.agent.config import parse_config
from elastic_gpu.agent.devices import logical_cards
from elastic_gpu.agent.dra.cdi import CDI_KIND, cdi_id, spec_file
from elastic_gpu.agent.dra.checkpoint import CHECKPOINT_FILE, Checkpoint
from elastic_gpu.agent.dra.kubelet_plugin import (
    PLUGIN_TYPE,
    SUPPORTED_SERVICES,
    DraPlugin,
    KubeletPluginServer,
)
from elastic_gpu.agent.dra.prepare import (
    ClaimRef,
    GrantInputs,
    PrepareError,
    claim_refusal,
    prepare_claim,
)
from elastic_gpu.agent.grant import DeviceFiles, build_grant
from elastic_gpu.agent.proto import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    pluginregistration_v1_pb2,
    pluginregistration_v1_pb2_grpc,
)
from elastic_gpu.core.assignment import CardShare
from elastic_gpu.core.dra.devices import DRIVER, device_table
from elastic_gpu.kube.errors import NotFound

NODE = "n"
INV = {"cards": [{"model": "A100", "memoryMiB": 40960},
                 {"model": "A100", "memoryMiB": 40960,
                  "mig": [{"profile": "1g.5gb", "uuid": "MIG-z"}]}]}
BACKEND = FakeBackend.from_dict(INV, NODE)
CARDS = {lc.index: lc for lc in logical_cards(BACKEND.discover(), False)}
FILES = DeviceFiles({"GPU-fake-n-0": ["/dev/nvidia0"]}, ["/dev/nvidiactl"])
MIG_DEVICE = next(name for name, ref in device_table([lc.card for lc in CARDS.values()]).items()
                  if ref.mig is not None)
REF = ClaimRef("ns", "c", "uid-1")


def inputs(**config: object) -> GrantInputs:
    parsed = parse_config(config)
    return GrantInputs(parsed, "NVIDIA_VISIBLE_DEVICES", FILES,
                       BACKEND.isolation(parsed.sharing))


def share_claim(uid: str = "uid-1") -> dict[str, Any]:
    return claim_object("c", "ns", uid, NODE, [result(
        NODE, "gpu-0", consumed={"compute": "30", "memory": "4Gi"}, share_id="s1")])


def test_a_share_gets_what_allocate_gives_for_the_same_share() -> None:
    ins = inputs(sharing={"mode": "mps"})
    prepared = prepare_claim(share_claim(), REF, NODE, CARDS, ins)
    (device,) = prepared.devices
    assert (device.requests, device.pool, device.device, device.share_id) == (
        ("gpu",), NODE, "gpu-0", "s1")
    assert device.cdi_ids == (f"{CDI_KIND}=uid-1-gpu-0",) == (cdi_id("uid-1", "gpu-0"),)
    allocate = build_grant([CardShare(0, "GPU-fake-n-0", 300, 4096)], CARDS, ins.config,
                           ins.visible_env, ins.files, ins.isolation)
    assert env_of(prepared.spec, "uid-1-gpu-0") == allocate.envs
    assert allocate.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
    edits = prepared.spec["devices"][0]["containerEdits"]
    assert [d["hostPath"] for d in edits["deviceNodes"]] == [d.host_path for d in allocate.devices]
    assert [m["hostPath"] for m in edits["mounts"]] == [m.host_path for m in allocate.mounts]
    assert prepared.spec["kind"] == "gpu.elasticgpu.io/gpu"


def test_no_consumed_capacity_is_the_whole_card_and_mig_is_its_instance() -> None:
    whole = prepare_claim(claim_object("c", "ns", "uid-1", NODE, [result(NODE, "gpu-0")]),
                          REF, NODE, CARDS, inputs())
    assert env_of(whole.spec, "uid-1-gpu-0")["EGPU_ISOLATION"] == "exclusive"
    assert whole.devices[0].share_id is None
    mig = prepare_claim(claim_object("c", "ns", "uid-1", NODE, [result(NODE, MIG_DEVICE)]),
                        REF, NODE, CARDS, inputs())
    env = env_of(mig.spec, f"uid-1-{MIG_DEVICE}")
    assert env["NVIDIA_VISIBLE_DEVICES"] == "MIG-z" and env["EGPU_ISOLATION"] == "mig"


def test_two_devices_of_one_claim_carry_the_claims_grant() -> None:
    claim = claim_object("c", "ns", "uid-1", NODE, [result(NODE, "gpu-0", "a"),
                                                    result(NODE, MIG_DEVICE, "b")])
    prepared = prepare_claim(claim, REF, NODE, CARDS, inputs())
    assert [d.requests for d in prepared.devices] == [("a",), ("b",)]
    envs = [env_of(prepared.spec, f"uid-1-{d.device}") for d in prepared.devices]
    assert envs[0] == envs[1]
    assert envs[0]["NVIDIA_VISIBLE_DEVICES"] == "GPU-fake-n-0,MIG-z"


@pytest.mark.parametrize(("claim", "why"), [
    (share_claim("other-uid"), "has uid 'other-uid'"),
    (claim_object("c", "ns", "uid-1", NODE, None), "not allocated"),
    (claim_object("c", "ns", "uid-1", NODE, [result(NODE, "gpu-0")], reserved=False),
     "reserved for no pod"),
    (claim_object("c", "ns", "uid-1", NODE, [result("other-node", "gpu-0")]),
     "no device of gpu.elasticgpu.io in pool n"),
    (claim_object("c", "ns", "uid-1", NODE, [result(NODE, "gpu-0", driver="x.example.com")]),
     "no device of gpu.elasticgpu.io"),
    (claim_object("c", "ns", "uid-1", NODE, [result(NODE, "gpu-7")]),
     "'gpu-7' is not one this node publishes"),
    (claim_object("c", "ns", "uid-1", NODE, [result(NODE, "gpu-0",
                                                     consumed={"compute": "250"})]),
     "not a whole percent in 1..100"),
])
def test_refusals_name_the_claim_and_why(claim: dict[str, Any], why: str) -> None:
    with pytest.raises(PrepareError, match="ResourceClaim ns/c") as err:
        prepare_claim(claim, REF, NODE, CARDS, inputs())
    assert why in str(err.value)


def test_an_unhealthy_card_is_refused_as_allocate_refuses_it() -> None:
    from dataclasses import replace

    from elastic_gpu.core.model import Health
    sick = dict(CARDS)
    sick[0] = replace(CARDS[0], card=replace(CARDS[0].card, health=Health.UNHEALTHY))
    with pytest.raises(PrepareError, match="unhealthy"):
        prepare_claim(share_claim(), REF, NODE, sick, inputs())


def test_claim_refusal_accepts_an_allocated_reserved_claim() -> None:
    assert claim_refusal(share_claim(), REF) is None


def test_checkpoint_round_trip_and_a_corrupt_file_is_set_aside(tmp_path: Path) -> None:
    prepared = prepare_claim(share_claim(), REF, NODE, CARDS, inputs())
    cp = Checkpoint(tmp_path / CHECKPOINT_FILE)
    cp.put(prepared)
    again = Checkpoint(tmp_path / CHECKPOINT_FILE)
    assert again.get("uid-1") == prepared
    assert again.remove("uid-1") and not again.remove("uid-1")
    assert Checkpoint(tmp_path / CHECKPOINT_FILE).uids() == []
    (tmp_path / CHECKPOINT_FILE).write_text("{not json")
    assert Checkpoint(tmp_path / CHECKPOINT_FILE).uids() == []
    assert (tmp_path / f"{CHECKPOINT_FILE}.corrupt").read_text() == "{not json"
    assert not list(tmp_path.glob(".*.tmp"))  # atomic writes leave no temporary file


class Reader:
    """Claims by (namespace, name), counting reads."""

    def __init__(self, claims: Mapping[tuple[str, str], dict[str, Any]]) -> None:
        self.claims = dict(claims)
        self.reads = 0

    def __call__(self, ref: ClaimRef) -> Mapping[str, Any]:
        self.reads += 1
        try:
            return self.claims[ref.namespace, ref.name]
        except KeyError:
            raise NotFound(404, "NotFound", f"resourceclaims {ref.name!r} not found") from None


def _plugin(root: Path, reader: Reader) -> DraPlugin:
    return DraPlugin(NODE, reader, lambda: CARDS, inputs(), root / "plugin", root / "cdi")


def test_prepare_is_answered_from_the_checkpoint_after_a_restart(plugin_dir: Path) -> None:
    reader = Reader({("ns", "c"): share_claim()})
    first = _plugin(plugin_dir, reader).prepare(REF)
    spec = spec_file(plugin_dir / "cdi", "uid-1")
    written = spec.stat()
    restarted = _plugin(plugin_dir, reader)
    assert restarted.prepare(REF) == first
    assert reader.reads == 1 and restarted.prepared_from_api == 0
    assert spec.stat().st_mtime_ns == written.st_mtime_ns and spec.stat().st_ino == written.st_ino
    spec.unlink()  # /var/run/cdi emptied by a reboot: the same spec is written again
    assert restarted.prepare(REF) == first and reader.reads == 1
    assert json.loads(spec.read_text()) == first.spec
    restarted.unprepare("uid-1")
    restarted.unprepare("uid-1")  # idempotent
    restarted.unprepare("never-prepared")
    assert not spec.exists() and restarted.checkpoint.uids() == []


def test_both_services_on_unix_sockets(plugin_dir: Path) -> None:
    reader = Reader({("ns", "c"): share_claim(),
                     ("ns", "stale"): share_claim("recreated")})
    plugin = _plugin(plugin_dir, reader)
    server = KubeletPluginServer(plugin, plugin_dir / "plugin", plugin_dir / "registry")
    server.start()
    try:
        with grpc.insecure_channel(f"unix://{server.registration_socket}") as channel:
            reg = pluginregistration_v1_pb2_grpc.RegistrationStub(channel)
            info = reg.GetInfo(pluginregistration_v1_pb2.InfoRequest(), timeout=5)
            assert (info.type, info.name, list(info.supported_versions)) == (
                PLUGIN_TYPE, DRIVER, list(SUPPORTED_SERVICES))
            assert info.endpoint == str(plugin_dir / "plugin" / "dra.sock")
            reg.NotifyRegistrationStatus(pluginregistration_v1_pb2.RegistrationStatus(
                plugin_registered=False, error="no such version"), timeout=5)
            assert server.registration.status == (False, "no such version")
            reg.NotifyRegistrationStatus(pluginregistration_v1_pb2.RegistrationStatus(
                plugin_registered=True), timeout=5)
            assert server.registration.registered.is_set()
        with grpc.insecure_channel(f"unix://{info.endpoint}") as channel:
            dra = dra_v1_pb2_grpc.DRAPluginStub(channel)
            answer = dra.NodePrepareResources(dra_v1_pb2.NodePrepareResourcesRequest(claims=[
                dra_v1_pb2.Claim(namespace="ns", name="c", uid="uid-1"),
                dra_v1_pb2.Claim(namespace="ns", name="stale", uid="uid-2"),
                dra_v1_pb2.Claim(namespace="ns", name="gone", uid="uid-3")]), timeout=5)
            ok = answer.claims["uid-1"]
            assert ok.error == ""
            assert [(list(d.request_names), d.pool_name, d.device_name, list(d.cdi_device_ids),
                     d.share_id) for d in ok.devices] == [
                (["gpu"], NODE, "gpu-0", ["gpu.elasticgpu.io/gpu=uid-1-gpu-0"], "s1")]
            assert "has uid 'recreated'" in answer.claims["uid-2"].error
            assert "not found" in answer.claims["uid-3"].error
            assert not answer.claims["uid-2"].devices
            undone = dra.NodeUnprepareResources(dra_v1_pb2.NodeUnprepareResourcesRequest(
                claims=[dra_v1_pb2.Claim(namespace="ns", name="c", uid="uid-1"),
                        dra_v1_pb2.Claim(namespace="ns", name="x", uid="unknown")]),
                timeout=5)
            assert {uid: a.error for uid, a in undone.claims.items()} == {"uid-1": "",
                                                                          "unknown": ""}
    finally:
        server.stop()
    assert not server.registration_socket.exists()


def test_device_health_follows_cards_and_mig_instances() -> None:
    from dataclasses import replace

    from elastic_gpu.agent.dra.health import device_health
    from elastic_gpu.core.model import Health
    rows = {r.device: (r.health, r.message) for r in device_health(CARDS, {})}
    assert rows == {"gpu-0": (Health.HEALTHY, ""), MIG_DEVICE: (Health.HEALTHY, "")}
    mig_card = CARDS[1].card
    sick_mig = replace(mig_card, mig=(replace(mig_card.mig[0], health=Health.UNHEALTHY),))
    cards = {0: replace(CARDS[0], card=replace(CARDS[0].card, health=Health.UNHEALTHY)),
             1: replace(CARDS[1], card=sick_mig)}
    rows = {r.device: (r.health, r.message) for r in device_health(cards, {0: "XID 79"})}
    assert rows == {"gpu-0": (Health.UNHEALTHY, "XID 79"),
                    MIG_DEVICE: (Health.UNHEALTHY, "unhealthy")}


def test_the_health_stream_reports_at_once_and_on_a_change(plugin_dir: Path) -> None:
    from elastic_gpu.agent.backends.base import HealthEvent
    from elastic_gpu.agent.proto import dra_health_v1alpha1_pb2, dra_health_v1alpha1_pb2_grpc
    from elastic_gpu.agent.state import NodeState
    from elastic_gpu.core.model import Health

    state = NodeState(CARDS.values())
    plugin = DraPlugin(NODE, Reader({}), state.cards, inputs(), plugin_dir / "plugin",
                       plugin_dir / "cdi")
    server = KubeletPluginServer(plugin, plugin_dir / "plugin", plugin_dir / "registry", state)
    server.start()
    try:
        with grpc.insecure_channel(f"unix://{server.service_socket}") as channel:
            stream = dra_health_v1alpha1_pb2_grpc.DRAResourceHealthStub(channel)\
                .NodeWatchResources(dra_health_v1alpha1_pb2.NodeWatchResourcesRequest(),
                                    timeout=30)
            first = next(stream)
            assert {(d.device.pool_name, d.device.device_name, d.health)
                    for d in first.devices} == {(NODE, "gpu-0", dra_health_v1alpha1_pb2.HEALTHY),
                                                (NODE, MIG_DEVICE,
                                                 dra_health_v1alpha1_pb2.HEALTHY)}
            assert all(d.health_check_timeout_seconds > 0 for d in first.devices)
            state.apply([HealthEvent("GPU-fake-n-0", Health.UNHEALTHY, "XID 79")])
            second = next(stream)
            gpu0 = next(d for d in second.devices if d.device.device_name == "gpu-0")
            assert (gpu0.health, gpu0.message) == (dra_health_v1alpha1_pb2.UNHEALTHY, "XID 79")
            stream.cancel()
    finally:
        server.stop()


def test_a_uid_that_could_name_a_path_elsewhere_is_refused(plugin_dir: Path) -> None:
    outside = plugin_dir / "victim.json"
    outside.write_text("{}")
    (plugin_dir / "cdi" / f"{DRIVER}-..").mkdir(parents=True)
    plugin = _plugin(plugin_dir, Reader({}))
    with pytest.raises(ValueError, match="is not a Kubernetes uid"):
        plugin.unprepare("../../../victim")  # unchecked: cdi/gpu...-../../../victim.json
    with pytest.raises(PrepareError, match="is not a Kubernetes uid"):
        plugin.prepare(ClaimRef("ns", "c", "../victim"))
    assert outside.exists()
    plugin.unprepare("0b5e3c1a-7d0f-4c7e-9d6a-2f1e8c9b4a77")  # a real uid: fine, unknown
