"""The extender wire format: Go field names in and out, clear errors for bad bodies."""

from __future__ import annotations

import json

import msgspec
import pytest

from elastic_gpu.scheduler import wire


def test_args_with_node_names() -> None:
    body = json.dumps({"Pod": {"metadata": {"name": "p"}}, "Nodes": None,
                       "NodeNames": ["a", "b"]}).encode()
    args = wire.parse(wire.ExtenderArgs, body)
    assert args.node_names() == ["a", "b"]
    result = wire.filter_result(args, ["b"], {"a": "full"}, {})
    assert result == {"NodeNames": ["b"], "Nodes": None, "FailedNodes": {"a": "full"},
                      "FailedAndUnresolvableNodes": {}, "Error": ""}


def test_args_with_node_objects_answer_with_node_objects() -> None:
    nodes = [{"metadata": {"name": "a"}}, {"metadata": {"name": "b"}}]
    body = json.dumps({"Pod": {}, "Nodes": {"items": nodes}}).encode()
    args = wire.parse(wire.ExtenderArgs, body)
    assert args.node_names() == ["a", "b"]
    result = wire.filter_result(args, ["a"], {}, {"b": "no GPUs"})
    assert result["Nodes"] == {"items": [nodes[0]]}
    assert result["NodeNames"] is None
    assert result["FailedAndUnresolvableNodes"] == {"b": "no GPUs"}


@pytest.mark.parametrize(("body", "needle"), [
    (b"{not json", "not JSON"),
    (b"[1, 2]", "must be a JSON object"),
    (b'{"NodeNames": ["a"]}', "Pod"),
    (b'{"Pod": 3, "NodeNames": ["a"]}', "Pod"),
    (b'{"Pod": {}, "NodeNames": [1, {}]}', "NodeNames"),
    (b"\xff\xfe", "not JSON"),
])
def test_malformed_args_name_the_problem(body: bytes, needle: str) -> None:
    with pytest.raises(wire.WireError, match=needle):
        wire.parse(wire.ExtenderArgs, body)


def test_no_candidates_is_an_error() -> None:
    args = wire.parse(wire.ExtenderArgs, b'{"Pod": {}}')
    with pytest.raises(wire.WireError, match="neither NodeNames nor Nodes"):
        args.node_names()


def test_node_object_without_name() -> None:
    args = wire.parse(wire.ExtenderArgs, b'{"Pod": {}, "Nodes": {"items": [{"metadata": {}}]}}')
    with pytest.raises(wire.WireError, match=r"Nodes.items\[0\].metadata.name"):
        args.node_names()


def test_binding_args_need_every_field() -> None:
    ok = wire.parse(wire.ExtenderBindingArgs, json.dumps(
        {"PodName": "p", "PodNamespace": "ns", "PodUID": "u", "Node": "n"}).encode())
    assert (ok.PodName, ok.PodNamespace, ok.PodUID, ok.Node) == ("p", "ns", "u", "n")
    with pytest.raises(wire.WireError, match="Node"):
        wire.parse(wire.ExtenderBindingArgs, b'{"PodName": "p", "PodNamespace": "ns", '
                                             b'"PodUID": "u", "Node": ""}')


def test_preemption_meta_victims_round_trip() -> None:
    body = json.dumps({"Pod": {}, "NodeNameToVictims": None, "NodeNameToMetaVictims": {
        "n1": {"Pods": [{"UID": "u1"}, {"UID": "u2"}], "NumPDBViolations": 1},
        "n2": None}}).encode()
    args = wire.parse(wire.ExtenderPreemptionArgs, body)
    assert args.victims() == {"n1": (["u1", "u2"], 1), "n2": ([], 0)}
    assert wire.preemption_result({"n1": (["u1"], 1)}) == {
        "NodeNameToMetaVictims": {"n1": {"Pods": [{"UID": "u1"}], "NumPDBViolations": 1}}}


def test_preemption_full_victims_need_uids() -> None:
    body = json.dumps({"Pod": {}, "NodeNameToVictims": {
        "n1": {"Pods": [{"metadata": {"uid": "u1"}}], "NumPDBViolations": 0}}}).encode()
    assert wire.parse(wire.ExtenderPreemptionArgs, body).victims() == {"n1": (["u1"], 0)}
    bad = json.dumps({"Pod": {}, "NodeNameToVictims": {"n1": {"Pods": [{}]}}}).encode()
    with pytest.raises(wire.WireError, match="uid is missing"):
        wire.parse(wire.ExtenderPreemptionArgs, bad).victims()


def test_host_priorities_shape() -> None:
    encoded = msgspec.json.encode(wire.host_priorities({"a": 10, "b": 0}))
    assert json.loads(encoded) == [{"Host": "a", "Score": 10}, {"Host": "b", "Score": 0}]
