"""The Elastic GPU API layer: CRD files equal the code, typed objects read strictly."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from elastic_gpu.api import elasticgpu as api
from elastic_gpu.core.assignment import CardShare
from elastic_gpu.core.claims import decisions as claim_decisions
from elastic_gpu.core.claims import model as claim_model
from elastic_gpu.core.claims.decisions import Bind, Provision
from elastic_gpu.core.claims.model import (
    GPUSHARE,
    WHOLE_CARDS,
    BindingMode,
    Claim,
    ClaimPhase,
    ClaimRef,
    Condition,
    ElasticGPUPhase,
    GPUClass,
    LostReason,
    PendingReason,
    ReclaimPolicy,
)
from elastic_gpu.core.request import PodRequest
from elastic_gpu.core.resources import RESOURCE_TABLE

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("plural", list(api.CRD_FILES))
def test_crd_files_match_the_code(plural: str) -> None:
    on_disk = yaml.safe_load((ROOT / "deploy" / "crds" / api.CRD_FILES[plural]).read_text())
    assert on_disk == api.crd_manifests()[plural], \
        "regenerate: python -m elastic_gpu.api.elasticgpu --write deploy/crds"


def _version(plural: str) -> dict[str, Any]:
    crd = api.crd_manifests()[plural]
    (version,) = crd["spec"]["versions"]
    return version  # type: ignore[no-any-return]


def test_names_scopes_and_versions_are_the_seeds() -> None:
    crds = api.crd_manifests()
    got = {p: (c["spec"]["names"]["kind"], c["spec"]["scope"], c["spec"]["names"]["shortNames"])
           for p, c in crds.items()}
    assert got == {"elasticgpuclasses": ("ElasticGPUClass", "Cluster", ["egpuclass"]),
                   "elasticgpuclaims": ("ElasticGPUClaim", "Namespaced", ["egpuc"]),
                   "elasticgpus": ("ElasticGPU", "Cluster", ["egpu"])}
    for plural, crd in crds.items():
        assert crd["spec"]["group"] == "elasticgpu.io"
        assert _version(plural)["name"] == "v1alpha" and _version(plural)["storage"]
        assert crd["spec"]["conversion"] == {"strategy": "None"}
    assert "subresources" not in _version("elasticgpuclasses")
    assert _version("elasticgpuclaims")["subresources"] == {"status": {}}
    assert _version("elasticgpus")["subresources"] == {"status": {}}


def test_class_fields_are_top_level_with_enums_and_defaults() -> None:
    schema = _version("elasticgpuclasses")["schema"]["openAPIV3Schema"]
    props = schema["properties"]
    assert schema["required"] == ["provisioner"]
    assert props["reclaimPolicy"]["enum"] == ["Retain", "Delete"]
    assert props["reclaimPolicy"]["default"] == "Delete"
    assert props["egpuBindingMode"]["enum"] == ["Immediate", "WaitForFirstConsumer"]
    assert props["egpuBindingMode"]["default"] == "Immediate"
    pattern = re.compile(props["provisioner"]["pattern"])
    for name in (GPUSHARE, WHOLE_CARDS, claim_model.MIG, "elasticgpu.io/qgpu"):
        assert pattern.match(name), name
    assert not pattern.match("Not A Provisioner!")


def test_request_keys_rule_names_every_row_of_the_resource_table() -> None:
    requests = _version("elasticgpuclaims")["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "properties"]["resources"]["properties"]["requests"]
    rule = requests["x-kubernetes-validations"][0]["rule"]
    for spec in RESOURCE_TABLE:
        assert f"'{spec.name}'" in rule
    assert "nvidia\\\\.com/mig-" in rule


def test_every_status_field_the_api_layer_reads_is_in_the_schema() -> None:
    # a structural schema prunes unknown fields: what the controller writes must be declared
    claim_status = _version("elasticgpuclaims")["schema"]["openAPIV3Schema"]["properties"]["status"]
    assert {"phase", "elasticGPUName", "node", "capacity", "conditions"} <= set(claim_status["properties"])
    egpu = claim_model.ElasticGPU("e", {"elasticgpu.io/gpu": 1}, "n", (CardShare(0, "u", 1000, 0),),
                           ClaimRef("ns", "c", "uid"), "cls", ReclaimPolicy.DELETE,
                           ElasticGPUPhase.BOUND)
    obj = api.elasticgpu_to_object(egpu)
    egpu_schema = _version("elasticgpus")["schema"]["openAPIV3Schema"]["properties"]
    assert set(obj["spec"]) <= set(egpu_schema["spec"]["properties"])
    assert set(obj["status"]) <= set(egpu_schema["status"]["properties"])
    card_props = egpu_schema["spec"]["properties"]["cards"]["items"]["properties"]
    assert set(obj["spec"]["cards"][0]) <= set(card_props)


def test_elasticgpu_round_trips_through_its_object() -> None:
    egpu = claim_model.ElasticGPU("egpu-1", {"nvidia.com/mig-1g.10gb": 1}, "n1",
                           (CardShare(2, "GPU-2", 142, 9728, "1g.10gb", "MIG-a"),),
                           ClaimRef("ns", "c", "uid-1"), "mig", ReclaimPolicy.DELETE,
                           ElasticGPUPhase.BOUND)
    assert api.elasticgpu_from_object(api.elasticgpu_to_object(egpu)) == egpu
    bare = claim_model.ElasticGPU("pre", {"elasticgpu.io/gpu": 2}, "n2",
                           (CardShare(0, "a", 1000, 0), CardShare(1, "b", 1000, 0)))
    assert api.elasticgpu_from_object(api.elasticgpu_to_object(bare)) == bare


def test_claim_and_class_read_as_the_api_serves_them() -> None:
    claim = api.claim_from_object({
        "apiVersion": api.API_VERSION, "kind": "ElasticGPUClaim",
        "metadata": {"name": "c1", "namespace": "ns", "uid": "u1", "resourceVersion": "7",
                     "labels": {"x": "y"}, "managedFields": [{"manager": "kubectl"}]},
        "spec": {"egpuClassName": "cls", "resources": {"requests": {
            "gpushare.provisioner.elasticgpu.io/gpu-core": 10,
            "gpushare.provisioner.elasticgpu.io/gpu-memory": "4k"}}},
        "status": {"phase": "Bound", "elasticGPUName": "egpu-u1"}})
    assert claim == Claim("ns", "c1", "u1", "cls", {
        "gpushare.provisioner.elasticgpu.io/gpu-core": 10,
        "gpushare.provisioner.elasticgpu.io/gpu-memory": "4k"}, None, ClaimPhase.BOUND)
    cls = api.class_from_object({"metadata": {"name": "k"}, "provisioner": claim_model.MIG,
                                 "egpuBindingMode": "WaitForFirstConsumer"})
    assert cls == GPUClass("k", claim_model.MIG, {}, ReclaimPolicy.DELETE,
                                BindingMode.WAIT_FOR_FIRST_CONSUMER)


@pytest.mark.parametrize(("read", "obj", "words"), [
    (api.class_from_object, {"metadata": {"name": "k"}, "provisioner": "p", "reclaimPolicy": "Recycle"},
     "ElasticGPUClass k: reclaimPolicy='Recycle' is not one of Retain | Delete"),
    (api.class_from_object, {"metadata": {"name": "k"}}, r"ElasticGPUClass k: .*provisioner"),
    (api.claim_from_object, {"metadata": {"name": "c", "namespace": "n"},
                             "spec": {"resources": {"requests": {"x": 1.5}}}},
     r"ElasticGPUClaim c: .*\$\.spec\.resources\.requests\[\.\.\.\]"),
    (api.claim_from_object, {"metadata": {"name": "c", "namespace": "n"},
                             "spec": {"resources": {"requests": {}}}, "status": {"phase": "Gone"}},
     "ElasticGPUClaim n/c: status.phase='Gone' is not one of Pending | Bound | Lost"),
    (api.elasticgpu_from_object, {"metadata": {"name": "e"}, "spec": {
        "capacity": {}, "node": "n", "cards": [{"index": 0, "uuid": "u", "milli": 2000,
                                                 "memoryMiB": 0}]}},
     "ElasticGPU e: spec.cards: card share milli=2000 exceeds one card"),
    (api.elasticgpu_from_object, {"metadata": {"name": "e"}, "spec": {
        "capacity": {}, "node": "n", "cards": [{"index": "0", "uuid": "u", "milli": 1,
                                                 "memoryMiB": 0}]}},
     r"ElasticGPU e: Expected `int`, got `str` - at `\$\.spec\.cards\[0\]\.index`"),
])
def test_malformed_objects_name_object_and_field(read: Any, obj: dict[str, Any], words: str) -> None:
    with pytest.raises(api.ElasticGPUObjectError, match=words):
        read(obj)


def test_cli_writes_the_files(tmp_path: Path) -> None:
    assert api._main(["--write", str(tmp_path)]) == 0
    for plural, filename in api.CRD_FILES.items():
        text = (tmp_path / filename).read_text()
        assert text == (ROOT / "deploy" / "crds" / filename).read_text()
        assert yaml.safe_load(text) == api.crd_manifests()[plural]
        assert "&id" not in text  # no YAML anchors: the files are read by people too


def test_claim_status_carries_phase_binding_and_a_condition_that_keeps_its_time() -> None:
    obj: dict[str, Any] = {"metadata": {"name": "c", "namespace": "ns", "generation": 2},
                           "spec": {}, "status": {}}
    pending = claim_decisions.Pending(PendingReason.CLASS_NOT_FOUND, "ElasticGPUClass x does not exist")
    first = api.claim_status(pending, obj, "2026-01-01T00:00:00Z")
    assert first == {"phase": "Pending", "conditions": [{
        "type": "Bound", "status": "False", "reason": "ClassNotFound",
        "message": "ElasticGPUClass x does not exist", "lastTransitionTime": "2026-01-01T00:00:00Z",
        "observedGeneration": 2}]}
    # the same outcome later keeps the time it became so; a different reason with the same
    # status too (the status did not transition)
    obj["status"] = first
    again = api.claim_status(claim_decisions.Pending(PendingReason.UNSCHEDULABLE, "0/4 nodes"), obj,
                             "2026-01-01T00:05:00Z")
    assert again["conditions"][0]["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    assert again["conditions"][0]["reason"] == "Unschedulable"
    egpu = claim_model.ElasticGPU("egpu-u", {"elasticgpu.io/gpu": 1}, "n1", (CardShare(0, "u", 1000, 0),))
    obj["status"] = again
    bound = api.claim_status(Bind("egpu-u"), obj, "2026-01-01T00:09:00Z", egpu)
    assert (bound["phase"], bound["elasticGPUName"], bound["node"], bound["capacity"]) == (
        "Bound", "egpu-u", "n1", {"elasticgpu.io/gpu": 1})
    assert bound["conditions"][0]["status"] == "True"
    assert bound["conditions"][0]["lastTransitionTime"] == "2026-01-01T00:09:00Z"
    # a provisioning in flight keeps the phase; a lost claim says Lost
    provisioning = api.claim_status(Provision(GPUSHARE, PodRequest("c"), "n2"), obj, "t")
    assert provisioning["phase"] == "Pending"
    assert provisioning["conditions"][0]["message"] == (
        "provisioning by gpushare.provisioner.elasticgpu.io on node n2")
    lost = api.claim_status(claim_decisions.Lost(LostReason.ELASTICGPU_MISSING, "gone"), obj, "t")
    assert (lost["phase"], lost["conditions"][0]["reason"]) == ("Lost", "ElasticGPUMissing")


def test_other_conditions_are_kept() -> None:
    other = {"type": "Resizing", "status": "True", "reason": "X", "message": "",
             "lastTransitionTime": "t0"}
    merged = api.merge_condition([other], Condition("Bound", "True", "Bound", "ok"), "t1")
    assert merged[0] == other and merged[1]["type"] == "Bound"


def test_every_reason_is_a_valid_condition_reason() -> None:
    claims = api.crd_manifests()["elasticgpuclaims"]["spec"]["versions"][0]
    pattern = claims["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"][
        "conditions"]["items"]["properties"]["reason"]["pattern"]
    for reason in [*PendingReason, *LostReason]:
        assert re.match(pattern, reason.value), reason


names = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?", fullmatch=True)
shares = st.builds(CardShare, index=st.integers(0, 63), uuid=names, milli=st.integers(0, 1000),
                   memory_mib=st.integers(0, 1 << 20),
                   mig_profile=st.none() | st.just("1g.10gb"), mig_uuid=st.none() | names,
                   replicas=st.integers(0, 64))


@settings(max_examples=200, deadline=None)
@given(name=names, node=names, cards=st.lists(shares, min_size=1, max_size=4),
       capacity=st.dictionaries(st.sampled_from([s.name for s in RESOURCE_TABLE]),
                                st.integers(0, 1 << 40) | st.from_regex(r"[0-9]{1,6}k?", fullmatch=True),
                                min_size=1, max_size=3),
       ref=st.none() | st.builds(ClaimRef, names, names, st.just("") | names),
       cls=st.none() | names, reclaim=st.sampled_from(ReclaimPolicy),
       phase=st.sampled_from(ElasticGPUPhase))
def test_every_elasticgpu_round_trips(name: str, node: str, cards: list[CardShare],
                                      capacity: dict[str, int | str], ref: ClaimRef | None,
                                      cls: str | None, reclaim: ReclaimPolicy,
                                      phase: ElasticGPUPhase) -> None:
    # a MIG uuid is only kept beside a MIG profile (the assignment's form)
    cards = [CardShare(c.index, c.uuid, c.milli, c.memory_mib, c.mig_profile,
                       c.mig_uuid if c.mig_profile else None, c.replicas) for c in cards]
    egpu = claim_model.ElasticGPU(name, capacity, node, tuple(cards), ref, cls, reclaim, phase)
    assert api.elasticgpu_from_object(api.elasticgpu_to_object(egpu)) == egpu
