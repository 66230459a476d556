"""The MigLayout CRD: one Python source, the file on disk, the typed reader."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from elastic_gpu.api import miglayout as api
from elastic_gpu.api.miglayout import MigLayoutError
from elastic_gpu.api.registry import CRDS
from elastic_gpu.core.mig.apply import Placed
from elastic_gpu.core.model import MigInstance
from elastic_gpu.core.resources import MigProfile
from elastic_gpu.kube.resources import MIG_LAYOUTS, RESOURCES

ROOT = Path(__file__).parents[3]


def test_crd_file_matches_the_code_and_is_installed() -> None:
    on_disk = yaml.safe_load((ROOT / "deploy" / "crds" / api.CRD_FILE).read_text())
    assert on_disk == api.crd_manifest(), (
        "regenerate: python -m elastic_gpu.api.miglayout --write deploy/crds")
    assert (ROOT / "charts/elastic-gpu/crds" / api.CRD_FILE).read_text() == \
        (ROOT / "deploy/crds" / api.CRD_FILE).read_text()
    assert any(entry.kind == api.KIND and entry.installed_by == "installer" for entry in CRDS)
    assert RESOURCES[api.KIND] is MIG_LAYOUTS and not MIG_LAYOUTS.namespaced


def _obj(**spec: Any) -> dict[str, Any]:
    body = api.layout_spec("gpu-node-1", "GPU-0A0A", [Placed(4, MigProfile.parse("1g.10gb")),
                                                       Placed(0, MigProfile.parse("3g.40gb"))])
    body["spec"].update(spec)
    body["metadata"]["generation"] = 2
    return body


def test_a_written_layout_reads_back() -> None:
    body = _obj()
    assert body["metadata"]["name"] == "gpu-node-1.gpu-0a0a"
    assert body["spec"]["instances"][0] == {"profile": "3g.40gb", "start": 0}
    layout = api.layout_from_object(body)
    assert (layout.node, layout.card_uuid, layout.generation, layout.phase) == \
        ("gpu-node-1", "GPU-0A0A", 2, "Pending")
    assert [str(p) for p in layout.instances] == ["3g.40gb@0", "1g.10gb@4"]


@pytest.mark.parametrize(("spec", "words"), [
    ({"instances": [{"profile": "3g.41", "start": 0}]}, "spec.instances[0].profile"),
    ({"instances": [{"profile": "3g.40gb", "start": 9}]}, "spec.instances[0].start=9"),
    ({"instances": "3g.40gb"}, "spec.instances is not a list"),
    ({"cardUUID": ""}, "spec.nodeName and spec.cardUUID"),
])
def test_an_unreadable_layout_names_the_field(spec: dict[str, Any], words: str) -> None:
    with pytest.raises(MigLayoutError, match=r"MigLayout gpu-node-1\.gpu-0a0a: ") as caught:
        api.layout_from_object(_obj(**spec))
    assert words in str(caught.value)


def test_status_lists_the_real_instances_in_order() -> None:
    real = [MigInstance(MigProfile.parse("1g.10gb"), "MIG-b", 4),
            MigInstance(MigProfile.parse("3g.40gb"), "MIG-a", 0)]
    body = api.status_body("Applied", 2, "", real)["status"]
    assert body["instances"] == [{"profile": "3g.40gb", "start": 0, "uuid": "MIG-a"},
                                 {"profile": "1g.10gb", "start": 4, "uuid": "MIG-b"}]
    assert set(api.PHASES) == set(api.crd_manifest()["spec"]["versions"][0]["schema"][
        "openAPIV3Schema"]["properties"]["status"]["properties"]["phase"]["enum"])
