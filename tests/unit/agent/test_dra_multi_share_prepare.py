"""A DRA claim asking `count: 2` with capacity (issue 40): NodePrepareResources gives the
container what Allocate gives a multi-card share, HAMi-core's limits per card included."""

from __future__ import annotations

from pathlib import Path

from egpu_testing.dra import claim_object, env_of, result
from elastic_gpu.agent.backends.fake import FakeBackend
from elastic_gpu.agent.config import parse_config
from elastic_gpu.agent.devices import logical_cards
from elastic_gpu.agent.dra.prepare import ClaimRef, GrantInputs, prepare_claim
from elastic_gpu.agent.grant import DeviceFiles, build_grant
from elastic_gpu.core.assignment import CardShare

NODE = "n"
BACKEND = FakeBackend.from_dict({"cards": [{"model": "A100", "memoryMiB": 40960}] * 2}, NODE)
CARDS = {lc.index: lc for lc in logical_cards(BACKEND.discover(), False)}


def test_a_share_on_two_cards_gets_hami_cores_limits_per_card(tmp_path: Path) -> None:
    library = tmp_path / "libvgpu.so"
    library.write_text("stand-in")
    config = parse_config({"sharing": {"mode": "hami-core", "hamiCore": {
        "library": str(library), "cacheDirectory": str(tmp_path / "cache"),
        "lockDirectory": str(tmp_path / "lock")}}})
    ins = GrantInputs(config, "NVIDIA_VISIBLE_DEVICES", DeviceFiles({}, []),
                      BACKEND.isolation(config.sharing))
    consumed = {"compute": "30", "memory": "8Gi"}
    claim = claim_object("c", "ns", "uid-1", NODE, [
        result(NODE, "gpu-0", consumed=consumed, share_id="s0"),
        result(NODE, "gpu-1", consumed=consumed, share_id="s1")])
    prepared = prepare_claim(claim, ClaimRef("ns", "c", "uid-1"), NODE, CARDS, ins)
    assert [(d.device, d.share_id) for d in prepared.devices] == [("gpu-0", "s0"),
                                                                   ("gpu-1", "s1")]
    envs = [env_of(prepared.spec, f"uid-1-{d.device}") for d in prepared.devices]
    assert envs[0] == envs[1]
    env = envs[0]
    assert env["NVIDIA_VISIBLE_DEVICES"] == "GPU-fake-n-0,GPU-fake-n-1"
    assert (env["CUDA_DEVICE_MEMORY_LIMIT_0"], env["CUDA_DEVICE_MEMORY_LIMIT_1"]) == (
        "8192m", "8192m")
    assert (env["CUDA_DEVICE_SM_LIMIT_0"], env["CUDA_DEVICE_SM_LIMIT_1"]) == ("30", "30")
    assert env["EGPU_CORE_PERCENT"] == "30,30" and env["EGPU_MEMORY_MIB"] == "8192,8192"
    # exactly what the device-plugin path's Allocate gives the same multi-card share
    allocate = build_grant([CardShare(0, "GPU-fake-n-0", 300, 8192),
                            CardShare(1, "GPU-fake-n-1", 300, 8192)], CARDS, ins.config,
                           ins.visible_env, ins.files, ins.isolation)
    assert env == allocate.envs
