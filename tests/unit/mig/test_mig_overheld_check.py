"""The sandbox tests' independent MIG ledger check (`egpu_testing.workbench.mig_overheld`)
finds an instance two live pods hold and one the card does not carry, and nothing else."""

from __future__ import annotations

from egpu_testing.defrag import mig_pod
from egpu_testing.workbench import mig_overheld
from elastic_gpu.core.model import Card, MigInstance, Node
from elastic_gpu.core.resources import MigProfile

P3 = MigProfile.parse("3g.40gb")
NODE = Node("m0", 64_000, 256_000, (Card(0, "GPU-m0", "A100-SXM4-80GB", 81920, mig=(
    MigInstance(P3, "MIG-m0-0", 0), MigInstance(P3, "MIG-m0-1", 4))),))


def test_one_holder_per_instance_is_clean_and_a_second_is_found() -> None:
    a = mig_pod("a", profile="3g.40gb", node="m0", instances=(0,))
    b = mig_pod("b", profile="3g.40gb", node="m0", instances=(1,))
    assert mig_overheld([a, b], [NODE]) == []
    twice = mig_pod("c", profile="3g.40gb", node="m0", instances=(0,))
    (problem,) = mig_overheld([a, b, twice], [NODE])
    assert "MIG-m0-0" in problem and "ml/a" in problem and "ml/c" in problem
    twice["status"]["phase"] = "Succeeded"  # a finished pod holds nothing
    assert mig_overheld([a, b, twice], [NODE]) == []


def test_an_instance_the_card_does_not_carry_is_found() -> None:
    ghost = mig_pod("g", profile="3g.40gb", node="m0", instances=(7,))
    (problem,) = mig_overheld([ghost], [NODE])
    assert "has no MIG instance MIG-m0-7" in problem
