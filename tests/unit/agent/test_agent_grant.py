"""What a container gets for its shares: MPS limits, accounting-only, MIG, refusals."""

from __future__ import annotations

import pytest

from elastic_gpu.agent.backends.fake import FakeBackend
from elastic_gpu.agent.config import parse_config
from elastic_gpu.agent.devices import logical_cards
from elastic_gpu.agent.grant import DeviceFiles, GrantError, build_grant
from elastic_gpu.core.assignment import CardShare

INV = {"cards": [{"model": "A100", "memoryMiB": 40960},
                 {"model": "A100", "memoryMiB": 40960,
                  "mig": [{"profile": "1g.5gb", "uuid": "MIG-z"}]}],
       "boards": [{"id": "bi0", "model": "BI-V150", "memoryMiB": 32768}]}
CARDS = {lc.index: lc for lc in logical_cards(FakeBackend.from_dict(INV, "n").discover(), False)}
FILES = DeviceFiles({"GPU-fake-n-0": ["/dev/nvidia0"], "bi0-chip0": ["/dev/iluvatar0"],
                     "bi0-chip1": ["/dev/iluvatar1"]}, ["/dev/nvidiactl"])


def grant(shares: list[CardShare], **config: object):  # type: ignore[no-untyped-def]
    parsed = parse_config(config)
    return build_grant(shares, CARDS, parsed, "NVIDIA_VISIBLE_DEVICES", FILES,
                       FakeBackend.from_dict(INV, "n").isolation(parsed.sharing))


def test_mps_mode_passes_compute_and_memory_limits() -> None:
    g = grant([CardShare(0, "GPU-fake-n-0", 300, 4096)], sharing={"mode": "mps"})
    assert g.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-fake-n-0"
    assert g.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
    assert g.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4096M"
    assert g.envs["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/nvidia-mps"
    assert g.envs["EGPU_ISOLATION"] == "mps"
    assert [m.host_path for m in g.mounts] == ["/tmp/nvidia-mps"]
    assert [d.host_path for d in g.devices] == ["/dev/nvidiactl", "/dev/nvidia0"]


def test_accounting_mode_says_so_and_sets_no_limits() -> None:
    g = grant([CardShare(0, "GPU-fake-n-0", 250, 1024)])
    assert g.envs["EGPU_ISOLATION"] == "accounting-only"
    assert g.annotations["elasticgpu.io/isolation"] == "accounting-only"
    assert not any(k.startswith("CUDA_MPS") for k in g.envs)
    assert g.envs["EGPU_CORE_PERCENT"] == "25" and g.envs["EGPU_MEMORY_MIB"] == "1024"


def test_whole_unsplit_board_gives_both_chips() -> None:
    g = grant([CardShare(2, "bi0", 1000, 0)], deviceSpecs=True)
    assert g.envs["NVIDIA_VISIBLE_DEVICES"] == "bi0-chip0,bi0-chip1"
    assert g.envs["EGPU_ISOLATION"] == "exclusive"
    assert [d.host_path for d in g.devices] == ["/dev/nvidiactl", "/dev/iluvatar0",
                                                "/dev/iluvatar1"]
    assert grant([CardShare(2, "bi0", 1000, 0)], deviceSpecs=False).devices == ()


def test_whole_card_as_the_scheduler_writes_it_is_exclusive() -> None:
    # The engine's whole-card share carries the card's memory (seen on the real kubelet node:
    # a `nvidia.com/gpu: 1` container was told accounting-only, EGPU_CORE_PERCENT=100).
    g = grant([CardShare(0, "GPU-fake-n-0", 1000, 40960)])
    assert g.envs["EGPU_ISOLATION"] == "exclusive"
    assert "EGPU_CORE_PERCENT" not in g.envs and "EGPU_MEMORY_MIB" not in g.envs


def test_mig_share_is_the_instance() -> None:
    g = grant([CardShare(1, "GPU-fake-n-1", 0, 0, "1g.5gb", "MIG-z")], sharing={"mode": "mps"})
    assert g.envs["NVIDIA_VISIBLE_DEVICES"] == "MIG-z"
    assert g.envs["EGPU_ISOLATION"] == "mig"
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in g.envs


@pytest.mark.parametrize(("share", "words"), [
    (CardShare(7, "GPU-x", 100, 0), "does not have"),
    (CardShare(0, "GPU-other", 100, 0), "stale"),
    (CardShare(1, "GPU-fake-n-1", 0, 0, "1g.5gb", "MIG-gone"), "no such instance"),
])
def test_an_assignment_that_does_not_fit_is_refused(share: CardShare, words: str) -> None:
    with pytest.raises(GrantError, match=words):
        grant([share])
