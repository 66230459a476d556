"""Issue 41, DRA nodes in every view, the agent's half: the node-mode seam's `holdings` gives a
DRA node's claim pods the assignment their prepared claims amount to (from the plugin's
checkpoint), so the held metrics and observed usage's ledger (attribution, drift) count them as
they count device-plugin pods; a claim shared by two pods is held once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from egpu_testing.dra import claim_object, result
from elastic_gpu.agent.accounting import card_usage, container_shares
from elastic_gpu.agent.backends.fake import FakeBackend
from elastic_gpu.agent.config import parse_config
from elastic_gpu.agent.devices import logical_cards
from elastic_gpu.agent.dra.holdings import with_holdings
from elastic_gpu.agent.dra.kubelet_plugin import DraPlugin
from elastic_gpu.agent.dra.prepare import ClaimRef, GrantInputs
from elastic_gpu.agent.grant import DeviceFiles
from elastic_gpu.agent.metrics import card_families
from elastic_gpu.agent.usage.observe import ledger
from elastic_gpu.core.usage import ContainerRef

NODE = "n"
BACKEND = FakeBackend.from_dict({"cards": [{"model": "A100", "memoryMiB": 40960}] * 2}, NODE)
LOGICAL = logical_cards(BACKEND.discover(), False)
CARDS = {lc.index: lc for lc in LOGICAL}
INPUTS = GrantInputs(parse_config({}), "NVIDIA_VISIBLE_DEVICES", DeviceFiles({}, []), None)
CLAIMS = {
    "half": claim_object("half", "ml", "u-half", NODE, [result(
        NODE, "gpu-0", consumed={"compute": "50", "memory": "8Gi"}, share_id="s")]),
    "whole": claim_object("whole", "ml", "u-whole", NODE, [result(NODE, "gpu-1")]),
}


def pod(name: str, entry_claims: dict[str, str], template: bool = False) -> dict[str, Any]:
    entries = [{"name": e, ("resourceClaimTemplateName" if template else
                            "resourceClaimName"): c} for e, c in entry_claims.items()]
    status: dict[str, Any] = {"phase": "Running"}
    if template:
        status["resourceClaimStatuses"] = [{"name": e, "resourceClaimName": c}
                                           for e, c in entry_claims.items()]
    return {"metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}"},
            "spec": {"nodeName": NODE, "resourceClaims": entries, "containers": [
                {"name": "main", "resources": {"claims": [{"name": e} for e in entry_claims]}}]},
            "status": status}


def prepared(root: Path) -> DraPlugin:
    plugin = DraPlugin(NODE, lambda ref: CLAIMS[ref.name], lambda: CARDS, INPUTS,
                       root / "plugin", root / "cdi")
    for name in CLAIMS:
        plugin.prepare(ClaimRef("ml", name, f"u-{name}"))
    return plugin


def test_claim_pods_hold_what_their_prepared_claims_hold(tmp_path: Path) -> None:
    plugin = prepared(tmp_path)
    # read again from the checkpoint, as after an agent restart
    restarted = DraPlugin(NODE, lambda ref: CLAIMS[ref.name], lambda: CARDS, INPUTS,
                          tmp_path / "plugin", tmp_path / "cdi")
    assert restarted.checkpoint.claims() == plugin.checkpoint.claims()
    pods = [pod("a", {"gpu": "half"}, template=True), pod("b", {"gpu": "whole"}),
            pod("c", {"gpu": "whole"})]  # c shares b's claim
    held = with_holdings(pods, NODE, restarted.checkpoint.claims())
    cards = {lc.index: lc.card for lc in LOGICAL}
    usage = card_usage(held, NODE, cards)
    assert (usage[0].milli, usage[0].memory_mib, usage[0].holders) == (500, 8192,
                                                                        ["ml/a (main)"])
    assert (usage[1].milli, usage[1].holders) == (1000, ["ml/b (main)"])  # once
    assert [(s.pod, s.index, s.milli) for s in container_shares(held, NODE, cards)] == [
        ("a", 0, 500), ("b", 1, 1000)]
    assert ledger(held, NODE, LOGICAL)[0] == {ContainerRef("ml", "a", "main"): 8192}
    families = {f.name: f for f in card_families(NODE, list(cards.values()), held)}
    allocated = families["elasticgpu_agent_card_compute_allocated_millicards"]
    assert [s.value for s in allocated.samples] == [500, 1000]
    # without the seam, nothing is held on a DRA node
    assert card_usage(pods, NODE, cards) == {}
