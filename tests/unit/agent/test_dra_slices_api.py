"""Publishing a node's pool: what the API server writes back is compared as what was sent."""

from __future__ import annotations

import json

from elastic_gpu.agent.backends.fake import FakeBackend
from elastic_gpu.agent.devices import logical_cards


def test_a_pool_read_back_in_canonical_quantities_is_unchanged() -> None:
    from elastic_gpu.agent.dra.slices_api import _comparable
    from elastic_gpu.core.dra.devices import node_slices

    backend = FakeBackend.from_dict({"cards": [
        {"model": "A100", "memoryMiB": 40960},
        {"model": "A100", "memoryMiB": 40960,
         "mig": [{"profile": "3g.20gb", "uuid": "MIG-q", "start": 0}]}]}, "n")
    cards = [lc.card for lc in logical_cards(backend.discover(), False)]
    ours = node_slices("n", cards, 1)
    # what kube-apiserver 1.36 answered for these slices: 40960Mi as 40Gi, 20480Mi as 20Gi
    text = json.dumps([s["spec"] for s in ours]).replace('"40960Mi"', '"40Gi"')\
        .replace('"20480Mi"', '"20Gi"')
    assert '"40Gi"' in text and '"20Gi"' in text
    for sent, read in zip(ours, json.loads(text), strict=True):
        assert _comparable(read) == _comparable(sent["spec"])
    grown = json.loads(text.replace('"40Gi"', '"80Gi"', 1))
    assert _comparable(grown[0]) != _comparable(ours[0]["spec"])
