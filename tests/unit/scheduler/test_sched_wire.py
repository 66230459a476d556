"""The extender wire format: Go field names in and out, every field typed and bounded, clear
errors (path, rule, value) for bad bodies."""

from __future__ import annotations

import json

import msgspec
import pytest

from elastic_gpu.scheduler import wire


def test_args_with_node_names() -> None:
    body = json.dumps({"Pod": {"metadata": {"name": "p"}}, "Nodes": None,
                       "NodeNames": ["a", "b"]}).encode()
    args = wire.parse_args(body)
    assert args.node_names() == ["a", "b"]
    result = wire.filter_result(args, ["b"], {"a": "full"}, {})
    assert result == {"NodeNames": ["b"], "Nodes": None, "FailedNodes": {"a": "full"},
                      "FailedAndUnresolvableNodes": {}, "Error": ""}


def test_args_with_node_objects_answer_with_the_objects_as_received() -> None:
    nodes = [{"metadata": {"name": "a", "labels": {"x": "1"}}, "status": {"images": [1, 2]}},
             {"metadata": {"name": "b"}}]
    body = json.dumps({"Pod": {}, "Nodes": {"items": nodes}}).encode()
    args = wire.parse_args(body)
    assert args.node_names() == ["a", "b"]
    result = wire.filter_result(args, ["a"], {}, {"b": "no GPUs"})
    assert json.loads(msgspec.json.encode(result["Nodes"])) == {"items": [nodes[0]]}
    assert result["NodeNames"] is None
    assert result["FailedAndUnresolvableNodes"] == {"b": "no GPUs"}


PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"


def test_the_pod_keeps_only_the_fields_the_extender_reads() -> None:
    pod = {"apiVersion": "v1", "metadata": {
        "name": "p", "namespace": "ns", "uid": "u", "resourceVersion": "7",
        "annotations": {"elasticgpu.io/gpu-model": "A100"}, "labels": {"a": "b"}},
        "spec": {"containers": [{"name": "c", "image": "busybox", "command": ["sh"],
                                 "resources": {"limits": {"nvidia.com/gpu": "1", "cpu": 2}}}],
                 "nodeSelector": {"zone": "a"}, "tolerations": [{"operator": "Exists"}],
                 "affinity": {"podAffinity": {"x": 1, PREFERRED: [
                     {"weight": 3, "podAffinityTerm": {"topologyKey": "zone"}}]},
                     "nodeAffinity": {
                         "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                             {"matchExpressions": [{"key": "k", "operator": "In",
                                                    "values": ["v"]}]}]},
                         PREFERRED: [{"weight": 7, "preference": {"matchExpressions": []}}]}},
                 "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone",
                                                "whenUnsatisfiable": "ScheduleAnyway"}],
                 "volumes": [{"name": "v"}], "priority": 5},
        "status": {"phase": "Pending", "conditions": []}}
    args = wire.parse_args(json.dumps({"Pod": pod, "NodeNames": ["a"]}).encode())
    assert args.Pod == {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u", "resourceVersion": "7",
                     "annotations": {"elasticgpu.io/gpu-model": "A100"}},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1",
                                                                       "cpu": 2}}}],
                 "priority": 5, "nodeSelector": {"zone": "a"},
                 # of soft terms only that they are stated (`narrowing`), by their weights
                 "affinity": {"podAffinity": {PREFERRED: [{"weight": 3}]}, "nodeAffinity": {
                     "requiredDuringSchedulingIgnoredDuringExecution":
                         pod["spec"]["affinity"]["nodeAffinity"][REQUIRED],
                     PREFERRED: [{"weight": 7}]}},
                 "topologySpreadConstraints": [{"whenUnsatisfiable": "ScheduleAnyway"}],
                 "tolerations": [{"operator": "Exists"}]},
        "status": {"phase": "Pending"}}


@pytest.mark.parametrize(("body", "needle"), [
    (b"{not json", "not JSON"),
    (b"[1, 2]", "must be a JSON object"),
    (b'{"NodeNames": ["a"]}', "missing required field `Pod`"),
    (b'{"Pod": 3, "NodeNames": ["a"]}', r"$.Pod: Expected `object | null`, got `int`"),
    (b'{"Pod": {}, "NodeNames": [1, {}]}', r"$.NodeNames[0]: Expected `str`, got `int` (got 1)"),
    (b'{"Pod": {}, "NodeNames": [""]}', r"$.NodeNames[0]: Expected `str` of length >= 1"),
    (b"\xff\xfe", "not JSON"),
    # the shapes the issue's fuzzing found, and their neighbours
    (b'{"Pod": {"metadata": "x"}, "NodeNames": ["a"]}', "$.Pod.metadata: Expected `object"),
    (b'{"Pod": {}, "Nodes": {"items": [{"metadata": "s"}]}}',
     "$.Nodes.items[0].metadata: Expected `object`, got `str` (got 's')"),
    (b'{"Pod": {}, "Nodes": {"items": [{"metadata": {}}]}}',
     "$.Nodes.items[0].metadata: Object missing required field `name`"),
    (b'{"Pod": {}, "Nodes": {"items": "x"}}', "$.Nodes.items: Expected `array"),
    (b'{"Pod": {"spec": {"containers": [{"name": 5}]}}, "NodeNames": ["a"]}',
     "$.Pod.spec.containers[0].name: Expected `str`, got `int` (got 5)"),
    (b'{"Pod": {"spec": {"containers": [{"name": "c", "resources": {"limits": '
     b'{"nvidia.com/gpu": 123456789012345678901234567890}}}]}}, "NodeNames": ["a"]}',
     "Expected `int` <= 9007199254740992"),
    (b'{"Pod": {"spec": {"containers": [{"resources": {"limits": {"cpu": 1e300}}}]}}, '
     b'"NodeNames": ["a"]}', "<= 9007199254740992.0"),
    (b'{"Pod": {"spec": {"containers": [{"resources": {"limits": {"cpu": true}}}]}}, '
     b'"NodeNames": ["a"]}', "got `bool`"),
    (b'{"Pod": {"metadata": {"annotations": {"a": 1}}}, "NodeNames": ["a"]}',
     "$.Pod.metadata.annotations[...]: Expected `str`"),
    (b'{"Pod": {"spec": {"priority": 4294967296}}, "NodeNames": ["a"]}',
     "$.Pod.spec.priority: Expected `int` <= 2147483647"),
    (b'{"Pod": {"spec": {"tolerations": [{"key": ["x"]}]}}, "NodeNames": ["a"]}',
     "$.Pod.spec.tolerations[0].key: Expected `str`"),
    (b'{"Pod": {"spec": {"affinity": {"nodeAffinity": {"requiredDuringScheduling'
     b'IgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [{"key": "k"}]}]}}}}}'
     b', "NodeNames": ["a"]}', "missing required field `operator`"),
    (b'{"Pod": {}, "NodeNames": ["' + b"x" * 254 + b'"]}', "of length <= 253"),
    (b'{"Pod": {}, "NodeNames": ["a"], "Extra": ' + b"[" * 3000 + b"]" * 3000 + b"}",
     "request body nests 3001 levels deep, more than the limit of 256"),
    (b"[" * 100_000 + b"]" * 100_000, "request body nests 100000 levels deep"),
])
def test_malformed_args_name_the_problem(body: bytes, needle: str) -> None:
    with pytest.raises(wire.WireError) as err:
        wire.parse_args(body)
    assert needle in str(err.value)


def test_unknown_fields_are_ignored() -> None:
    args = wire.parse_args(b'{"Pod": {"future": {"x": [1]}}, "NodeNames": ["a"], "New": 1}')
    assert args.Pod == {} and args.NodeNames == ["a"]


def test_no_candidates_is_an_error() -> None:
    for body in (b'{"Pod": {}}', b'{"Pod": {}, "Nodes": null, "NodeNames": null}'):
        with pytest.raises(wire.WireError, match="neither NodeNames nor Nodes"):
            wire.parse_args(body)


def test_too_many_names_are_refused_before_they_are_decoded() -> None:
    limits = wire.Limits(max_body_bytes=2**30, max_nodes=1_000)
    body = b'{"Pod": {}, "NodeNames": [' + b",".join(b'"n%d"' % i for i in range(1_001)) + b"]}"
    with pytest.raises(wire.WireError, match="1001 nodes, more than the limit of 1000"):
        wire.parse_args(body, limits)
    names = wire.parse_args(body.replace(b'"n1000",', b"").replace(b',"n1000"', b""), limits)
    assert len(names.node_names()) == 1_000
    # escaped quotes cannot smuggle names past the count
    tricky = b'{"Pod": {}, "NodeNames": [' + b",".join([b'"a\\\\"'] * 1_500) + b"]}"
    with pytest.raises(wire.WireError, match="more than the limit of 1000"):
        wire.parse_args(tricky, limits)
    with pytest.raises(wire.WireError, match="more than the limit of 1000"):
        wire.parse_args(body.replace(b",", b" , "), limits)
    items = json.dumps({"Pod": {}, "Nodes": {"items": [{"metadata": {"name": f"n{i}"}}
                                                       for i in range(1_001)]}}).encode()
    with pytest.raises(wire.WireError, match=r"\$.Nodes.items: 1001 nodes"):
        wire.parse_args(items, limits)


def test_the_issue_body_of_four_million_names_is_refused() -> None:
    body = b'{"Pod": {}, "NodeNames": [' + b",".join(
        b'"node-%07d"' % i for i in range(4_000_000)) + b"]}"
    with pytest.raises(wire.WireError, match="4000000 nodes, more than the limit of 20000"):
        wire.parse_args(body, wire.Limits(max_body_bytes=2**30))
    with pytest.raises(wire.WireError, match="over the limit of 16777216 bytes"):
        wire.parse_args(body)


def test_a_pod_larger_than_the_api_stores_is_refused() -> None:
    notes = {"a": "x" * 200_000}
    pod = {"metadata": {"annotations": {f"k{i}": notes["a"] for i in range(20)}}}
    body = json.dumps({"Pod": pod, "NodeNames": ["a"]}).encode()
    with pytest.raises(wire.WireError, match=r"\$.Pod: .* bytes, more than the 3145728"):
        wire.parse_args(body)


def test_binding_args_need_every_field() -> None:
    ok = wire.parse_binding(json.dumps(
        {"PodName": "p", "PodNamespace": "ns", "PodUID": "u", "Node": "n"}).encode())
    assert (ok.PodName, ok.PodNamespace, ok.PodUID, ok.Node) == ("p", "ns", "u", "n")
    for bad, needle in (({"PodName": "p", "PodNamespace": "ns", "PodUID": "u", "Node": ""},
                         "$.Node: Expected `str` of length >= 1"),
                        ({"PodName": "p", "PodNamespace": "ns", "PodUID": 1, "Node": "n"},
                         "$.PodUID: Expected `str`, got `int`"),
                        ({"PodName": "p"}, "missing required field `PodNamespace`")):
        with pytest.raises(wire.WireError) as err:
            wire.parse_binding(json.dumps(bad).encode())
        assert needle in str(err.value)


def test_preemption_meta_victims_round_trip() -> None:
    body = json.dumps({"Pod": {}, "NodeNameToVictims": None, "NodeNameToMetaVictims": {
        "n1": {"Pods": [{"UID": "u1"}, {"UID": "u2"}], "NumPDBViolations": 1},
        "n2": None}}).encode()
    args = wire.parse_preemption(body)
    assert args.victims() == {"n1": (["u1", "u2"], 1), "n2": ([], 0)}
    assert wire.preemption_result({"n1": (["u1"], 1)}) == {
        "NodeNameToMetaVictims": {"n1": {"Pods": [{"UID": "u1"}], "NumPDBViolations": 1}}}


def test_preemption_full_victims_need_uids() -> None:
    body = json.dumps({"Pod": {}, "NodeNameToVictims": {
        "n1": {"Pods": [{"metadata": {"uid": "u1"}}], "NumPDBViolations": 0}}}).encode()
    assert wire.parse_preemption(body).victims() == {"n1": (["u1"], 0)}
    for victims, needle in (
            ({"Pods": [{}]}, "$.NodeNameToVictims['n1'].Pods[0]: Object missing required "
                             "field `metadata`"),
            ({"Pods": [{"metadata": "u"}]}, "$.NodeNameToVictims['n1'].Pods[0].metadata: "
                                            "Expected `object`, got `str`"),
            ({"NumPDBViolations": 2**64}, "Expected `int` <= 9223372036854775807")):
        bad = json.dumps({"Pod": {}, "NodeNameToVictims": {"n1": victims}}).encode()
        with pytest.raises(wire.WireError) as err:
            wire.parse_preemption(bad)
        assert needle in str(err.value)


def test_host_priorities_shape() -> None:
    encoded = msgspec.json.encode(wire.host_priorities({"a": 10, "b": 0, "c": 3}))
    # a node scored 0 is left out: kube-scheduler adds nothing for an unlisted node
    assert json.loads(encoded) == [{"Host": "a", "Score": 10}, {"Host": "c", "Score": 3}]
