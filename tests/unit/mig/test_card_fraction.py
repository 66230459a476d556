"""What share of a card a MIG instance is: one function (`core.mig.profiles.card_fraction`),
per model, that every reader rounds its own way (issue #39). An A30 has 4 compute slices, so
its `1g` is a quarter of the card: its GPUBudget bills 1/4 card-second per second, its quota
and node-level count say 25, its GPUDevice column and `egpu top` 25 %, its DRA device 25."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from egpu_testing.workbench import pod_manifest
from elastic_gpu.core.assignment import Assignment, CardShare
from elastic_gpu.core.budget.ledger import observe
from elastic_gpu.core.budget.shares import container_shares
from elastic_gpu.core.budget.usage import record_usage
from elastic_gpu.core.dra.devices import node_slices
from elastic_gpu.core.dra.pods import device_compute
from elastic_gpu.core.gpuview import share_use
from elastic_gpu.core.mig.profiles import (
    DEFAULT_COMPUTE_SLICES,
    MIG_MODELS,
    card_fraction,
    card_slices,
)
from elastic_gpu.core.model import Card, MigInstance
from elastic_gpu.core.nodefit import node_core
from elastic_gpu.core.quota import QUOTA_CORE, canonical_resources
from elastic_gpu.core.request import container_request
from elastic_gpu.core.resources import MigProfile

A30_1G = MigProfile.parse("1g.6gb")
A30 = Card(0, "GPU-0", "NVIDIA A30", 24576, mig=(MigInstance(A30_1G, "MIG-a", 0),))
T0 = 1_700_000_000


@pytest.mark.parametrize(("profile", "model", "fraction"), [
    ("1g.6gb", None, Fraction(1, 4)),  # A30 names are the A30's own
    ("1g.6gb", "NVIDIA A30", Fraction(1, 4)),
    ("2g.12gb+me", None, Fraction(1, 2)),  # a +me variant is the plain profile's compute
    ("4g.24gb", "A30-24GB", Fraction(1)),
    ("1g.5gb", None, Fraction(1, 7)),
    ("3g.40gb", "NVIDIA H100 80GB HBM3", Fraction(3, 7)),
    ("1g.10gb", "A100-SXM4-40GB", Fraction(1, 7)),
    ("7g.141gb", None, Fraction(1)),
    ("1g.12gb", None, Fraction(1, DEFAULT_COMPUTE_SLICES)),  # a profile no model lists
    ("1g.12gb", "a card the table does not know", Fraction(1, 7)),
])
def test_a_profile_is_its_slices_over_its_cards(profile: str, model: str | None,
                                                 fraction: Fraction) -> None:
    assert card_fraction(MigProfile.parse(profile), model) == fraction


def test_a_name_means_one_size_so_an_unplaced_request_needs_no_model() -> None:
    # the rule `card_fraction(profile)` relies on: the models that list a profile's size
    # agree on the card's slices, so the share known at admission is the placed one's
    for model in MIG_MODELS:
        for row in model.profiles:
            assert card_fraction(row.profile) == card_fraction(row.profile, model.name), \
                (model.name, row.profile.name)


def test_a_layout_beyond_the_table_trusts_the_driver() -> None:
    assert card_slices("X", None, spanned=10) == 10
    assert card_fraction(MigProfile(4, 10), "X", spanned=10) == Fraction(4, 10)
    assert card_slices("NVIDIA A30") == 4 and card_slices("A100") == 7


def test_an_a30_1g_is_billed_a_quarter_card_second_from_its_request_and_its_assignment() -> None:
    status = {"containerStatuses": [{"name": "main", "state": {"terminated": {
        "startedAt": "2023-11-14T22:13:20Z", "finishedAt": "2023-11-14T22:15:00Z"}}}]}
    asked = {**pod_manifest("p", uid="u1", limits={"nvidia.com/mig-1g.6gb": "1"}),
             "status": status}
    record = observe(asked)
    assert record is not None and record_usage(record, 0, 2 * T0, 2 * T0) == 25
    placed = Assignment("n1", {"main": (CardShare(0, "GPU-0", 0, 6144, "1g.6gb", "MIG-a"),)})
    assert container_shares({**asked, "metadata": {**asked["metadata"], "annotations": {
        "elasticgpu.io/assignment": placed.to_json()}}}) == {"main": Fraction(1, 4)}


def test_every_reader_of_an_a30_1g_agrees_in_its_own_rounding() -> None:
    request = container_request("c", {"limits": {"nvidia.com/mig-1g.6gb": "2"}})
    assert canonical_resources(request)[QUOTA_CORE] == "50"  # quota: 25 each, rounded up
    assert node_core(request) == 50  # node-level count: 25 each, rounded down
    share = CardShare(0, "GPU-0", 0, 6144, "1g.6gb", "MIG-a")
    assert share_use(share, A30) == (250, 6144)  # GPUDevice columns and `egpu top`: 25 %
    mig_device = next(d for s in node_slices("n1", [A30], generation=1)
                      for d in s["spec"].get("devices", ()) if d["name"].startswith("gpu-0-mig"))
    assert mig_device["capacity"]["compute"] == {"value": "25"}
    assert device_compute({"device": mig_device["name"]}) == Fraction(1, 4)


def test_rounding_goes_the_way_each_purpose_needs() -> None:
    # a 1g of a 7-slice card is 14.28...%: the quota never under-counts, the node-level count
    # never overstates (seven of them must fit the card's 100)
    request = container_request("c", {"limits": {"nvidia.com/mig-1g.10gb": "1"}})
    exact = 100 * card_fraction(MigProfile.parse("1g.10gb"))
    assert int(canonical_resources(request)[QUOTA_CORE]) == math.ceil(exact) == 15
    assert node_core(request) == math.floor(exact) == 14
