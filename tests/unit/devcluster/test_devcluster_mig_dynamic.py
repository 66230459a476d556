"""Dynamic MIG in the sandbox: a cluster group's `migDynamic: true` labels its nodes
`elasticgpu.io/mig-dynamic=true` (refused on a model without MIG, boards, DRA groups, a
non-boolean); such a node offers every profile of its model to admission (so a profile no card
has yet is not refused at create); and the kwok nodes' stand-in applier (`devcluster.mig_agent`)
rebuilds its fake card from the GPUDevices as published, a fence being no ill health."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from egpu_testing.clock import ManualClock
from egpu_testing.memory_api import MemoryApi
from elastic_gpu.agent.deviceplugin.publish import publish_fake_node
from elastic_gpu.api import miglayout as ml
from elastic_gpu.core.admission.facts import node_gpus
from elastic_gpu.core.annotations import MIG_DYNAMIC_LABEL
from elastic_gpu.core.mig.apply import FENCE_SETTLE_S, Placed
from elastic_gpu.core.model import Health, MigInstance
from elastic_gpu.core.resources import MigProfile
from elastic_gpu.devcluster import mig_agent
from elastic_gpu.devcluster.nodes import (
    ClusterSpecError,
    node_manifest,
    parse_cluster,
)
from elastic_gpu.kube.resources import MIG_LAYOUTS, NODES

GROUP = {"name": "dyn", "count": 1, "gpus": 2, "model": "A100-SXM4-80GB", "memoryMiB": 81920}


def test_mig_dynamic_groups_label_their_nodes() -> None:
    (group,) = parse_cluster({"nodeGroups": [{**GROUP, "migDynamic": True}]})
    (inventory,) = group.inventories()
    assert node_manifest(inventory)["metadata"]["labels"][MIG_DYNAMIC_LABEL] == "true"
    (plain,) = parse_cluster({"nodeGroups": [GROUP]})[0].inventories()
    assert MIG_DYNAMIC_LABEL not in node_manifest(plain)["metadata"]["labels"]


def test_a_dra_group_may_opt_in_too() -> None:
    (group,) = parse_cluster({"nodeGroups": [{**GROUP, "migDynamic": True, "gpuMode": "dra"}]})
    (inventory,) = group.inventories()
    labels = node_manifest(inventory)["metadata"]["labels"]
    assert labels[MIG_DYNAMIC_LABEL] == "true"
    assert labels["elasticgpu.io/gpu-mode"] == "dra"


@pytest.mark.parametrize("extra, words", [
    ({"migDynamic": "yes"}, "must be true or false"),
    ({"migDynamic": True, "model": "T4"}, "dynamic MIG needs single-chip cards of a MIG model"),
])
def test_mig_dynamic_is_refused_where_it_cannot_work(extra: dict[str, object],
                                                      words: str) -> None:
    with pytest.raises(ClusterSpecError, match=words):
        parse_cluster({"nodeGroups": [{**GROUP, **extra}]})


def test_an_opted_in_node_offers_every_profile_and_every_card_to_admission() -> None:
    (group,) = parse_cluster({"nodeGroups": [{**GROUP, "migDynamic": True}]})
    gpus = node_gpus(node_manifest(group.inventories()[0]))
    assert gpus is not None
    assert {"nvidia.com/mig-1g.10gb", "nvidia.com/mig-3g.40gb",
            "nvidia.com/mig-7g.80gb"} <= gpus.mig_profiles
    # a card carved now may be merged back: admission counts every card of the node
    inventory = group.inventories()[0]
    first = replace(inventory.cards[0], mig=(MigInstance(MigProfile.parse("3g.40gb"), "MIG-a",
                                                         4),))
    carved = node_manifest(replace(inventory, cards=(first, *inventory.cards[1:])))
    assert carved["status"]["capacity"]["nvidia.com/gpu"] == "1"
    carved_gpus = node_gpus(carved)
    assert carved_gpus is not None and carved_gpus.cards == 2
    (plain,) = parse_cluster({"nodeGroups": [GROUP]})
    plain_gpus = node_gpus(node_manifest(plain.inventories()[0]))
    assert plain_gpus is not None and plain_gpus.mig_profiles == frozenset()


def test_the_stand_in_carves_and_a_restarted_one_reads_the_card_as_published() -> None:
    api = MemoryApi()
    (group,) = parse_cluster({"nodeGroups": [{**GROUP, "migDynamic": True}]})
    (inventory,) = group.inventories()
    api.add(NODES.path(), node_manifest(inventory))
    publish_fake_node(api, inventory)  # type: ignore[arg-type]
    card = inventory.cards[1].uuid
    body = ml.layout_spec(inventory.name, card, [Placed(4, MigProfile.parse("3g.40gb"))])
    body["metadata"]["generation"] = 1
    api.create(MIG_LAYOUTS.path(), body)
    clock = ManualClock()
    agents = mig_agent.MigAgents(api)  # type: ignore[arg-type]
    agents.sync()
    agents.appliers[inventory.name].clock = clock
    agents.appliers[inventory.name].fences = {card: clock()}
    rebuilt = mig_agent.fake_backend(api, inventory.name)  # type: ignore[arg-type]
    assert rebuilt is not None and rebuilt.discover()[1].health is Health.HEALTHY  # fenced
    clock.advance(FENCE_SETTLE_S)
    agents.sync()
    rebuilt = mig_agent.fake_backend(api, inventory.name)  # type: ignore[arg-type]
    assert rebuilt is not None
    assert [(m.profile.name, m.start) for m in rebuilt.discover()[1].mig] == [("3g.40gb", 4)]
    assert api.get(MIG_LAYOUTS.path(name=body["metadata"]["name"]))["status"]["phase"] == \
        "Applied"


def test_the_sandboxs_controller_runs_mig_dynamic_when_its_config_is_there(
        tmp_path: Path) -> None:
    """`up` writes the controller's config (mig.dynamic on) into the work dir when a group
    opted in; the controller's command line takes it, and the controller's loader reads it."""
    from elastic_gpu.controller.config import load_config
    from elastic_gpu.devcluster import components

    env = components.ComponentEnv(tmp_path / "kc", tmp_path, 1234, "python")
    assert "--config" not in components.CONTROLLER.argv(env)
    (tmp_path / components.CONTROLLER_CONFIG).write_text(components.MIG_DYNAMIC_CONFIG)
    argv = components.CONTROLLER.argv(env)
    config = Path(argv[argv.index("--config") + 1])
    assert load_config(config).mig.dynamic.enabled
