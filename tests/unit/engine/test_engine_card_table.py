"""`Engine.card_table`: every card's allocation as of the call, read node by node later (the
extender's /metrics page reads it between other work: docs/metrics.md)."""

from __future__ import annotations

from engine_helpers import gpu_node, share

from elastic_gpu.core.placement import Engine


def test_the_table_is_what_card_usage_said_at_the_call_whatever_happens_after() -> None:
    engine = Engine([gpu_node("n1", cards=2), gpu_node("n2", cards=1)])
    first = engine.assign(share("a", 300, memory=1024), "n1")
    engine.allocate("a", first)
    table = engine.card_table()
    then = {name: engine.card_usage(name) for name in engine.nodes()}
    # after the call: another share, a node added (the layout is rebuilt), the first released
    engine.allocate("b", engine.assign(share("b", 500), "n2"))
    engine.upsert_node(gpu_node("n3", cards=4))
    engine.release("a")
    assert dict(table.items()) == then
    assert list(table) == ["n1", "n2"] and len(table) == 2
    assert table["n1"] == then["n1"] and table == then
    (card,) = {s.index for s in first.shares()}
    assert dict((index, (milli, mib)) for index, milli, mib in table["n1"])[card] == (300, 1024)
    assert engine.card_table()["n2"] == [(0, 500, 0)]
