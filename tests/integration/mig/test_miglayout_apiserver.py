"""The MigLayout CRD on the real kube-apiserver (issue 42): a card's wanted layout is served,
read back as the agent reads it, and what the schema can check alone is refused."""

from __future__ import annotations

import json
from typing import Any

import pytest

from elastic_gpu.api import miglayout as api
from elastic_gpu.core.mig.apply import Placed
from elastic_gpu.core.resources import MigProfile

pytestmark = pytest.mark.integration


@pytest.fixture
def crds(k8s_cluster: Any) -> Any:
    from elastic_gpu.kube.crds import install_elasticgpu_crds

    install_elasticgpu_crds(k8s_cluster.kube())  # what the sandbox installs
    return k8s_cluster


def test_a_layout_is_served_read_printed_and_keeps_its_card(crds: Any) -> None:
    body = api.layout_spec("gpu-node-1", "GPU-IT-0A0A", [Placed(0, MigProfile.parse("3g.40gb")),
                                                         Placed(4, MigProfile.parse("1g.10gb"))])
    name = body["metadata"]["name"]
    crds.kubectl("create", "-f", "-", input=json.dumps(body))
    try:
        obj = json.loads(crds.kubectl("get", api.SHORT, name, "-o", "json").stdout)
        layout = api.layout_from_object(obj)
        assert (layout.node, layout.card_uuid, layout.generation) == \
            ("gpu-node-1", "GPU-IT-0A0A", 1)
        assert [str(p) for p in layout.instances] == ["3g.40gb@0", "1g.10gb@4"]
        out = crds.kubectl("get", api.SHORT, name).stdout.split("\n")
        assert out[0].split() == ["NAME", "NODE", "CARD", "PHASE", "AGE"]
        moved = crds.kubectl("patch", api.SHORT, name, "--type=merge",
                             "-p", '{"spec":{"cardUUID":"GPU-other"}}', check=False)
        assert moved.returncode != 0 and "nodeName and cardUUID are immutable" in moved.stderr
    finally:
        crds.kubectl("delete", api.SHORT, name, check=False)


@pytest.mark.parametrize(("instance", "words"), [
    ({"profile": "nvidia.com/mig-3g.40gb", "start": 0}, "spec.instances[0].profile"),
    ({"profile": "3g.40gb", "start": 8}, "spec.instances[0].start"),
    ({"profile": "3g.40gb"}, "spec.instances[0].start: Required value"),
])
def test_what_the_schema_can_say_alone_is_refused(crds: Any, instance: dict[str, Any],
                                                  words: str) -> None:
    body = api.layout_spec("gpu-node-1", "GPU-IT-BAD", [])
    body["spec"]["instances"] = [instance]
    result = crds.kubectl("create", "-f", "-", input=json.dumps(body), check=False)
    assert result.returncode != 0 and words in result.stderr, result.stderr
