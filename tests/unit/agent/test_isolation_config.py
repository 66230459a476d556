"""The per-node isolation provider in the agent config: strict like every other field, and a
section for another mode is refused, not ignored."""

from __future__ import annotations

import pytest

from elastic_gpu.agent.config import Preload, SharingMode, parse_config
from elastic_gpu.api.config.loader import ConfigError


def refused(sharing: object) -> str:
    with pytest.raises(ConfigError) as err:
        parse_config({"sharing": sharing})
    return str(err.value)


def test_the_three_modes() -> None:
    assert parse_config({}).sharing.mode is SharingMode.ACCOUNTING
    mps = parse_config({"sharing": {"mode": "mps", "mps": {"daemon": {}}}}).sharing
    assert mps.mode is SharingMode.MPS and mps.mps.daemon is not None
    assert mps.mps.daemon.binary == "/usr/bin/nvidia-cuda-mps-control"
    hami = parse_config({"sharing": {"mode": "hami-core"}}).sharing
    assert hami.mode is SharingMode.HAMI_CORE
    assert hami.hamiCore.library == "/usr/local/vgpu/libvgpu.so"
    assert hami.hamiCore.preload is Preload.ENV


def test_a_section_of_another_mode_is_refused() -> None:
    assert "mps.daemon belongs to mode mps, not accounting" in refused({"mps": {"daemon": {}}})
    assert "mps.daemon belongs to mode mps, not hami-core" in refused(
        {"mode": "hami-core", "mps": {"daemon": {}}})
    assert "hamiCore belongs to mode hami-core, not mps" in refused(
        {"mode": "mps", "hamiCore": {"library": "/opt/libvgpu.so"}})


@pytest.mark.parametrize(("sharing", "words"), [
    ({"mode": "hami"}, "sharing.mode"),
    ({"mode": "hami-core", "hamiCore": {"library": "libvgpu.so"}}, "absolute path"),
    ({"mode": "hami-core", "hamiCore": {"preload": "LD_PRELOAD"}}, "sharing.hamiCore.preload"),
    ({"mode": "hami-core", "hamiCore": {"libary": "/x"}}, "sharing.hamiCore.libary"),
    ({"mode": "mps", "mps": {"daemon": {"binary": "nvidia-cuda-mps-control"}}}, "absolute"),
    ({"mode": "mps", "mps": {"daemon": {"checkSeconds": 0}}}, "checkSeconds"),
    ({"mode": "mps", "mps": {"daemon": {"restartInitialSeconds": 10,
                                        "restartMaxSeconds": 5}}},
     "restartMaxSeconds must be at least restartInitialSeconds"),
    ({"mode": "mps", "mps": {"daemon": {"shmDirectory": "run/shm"}}}, "absolute"),
])
def test_wrong_values_are_refused_naming_the_field(sharing: object, words: str) -> None:
    assert words in refused(sharing)
