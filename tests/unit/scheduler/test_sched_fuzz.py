"""No request body makes the extender answer 5xx: every field of every verb's arguments, at
every level, replaced by every kind of wrong JSON value (or removed), plus random bodies,
truncated JSON and deep nesting, against the real aiohttp server.

The sweep is exhaustive over the fields of full, realistic templates (a pod with every field
the extender reads and some it does not, node objects, both victims forms, binding args);
hypothesis then combines several mutations at once. Each answer must be a 2xx/4xx whose JSON
says what went wrong (`Error`), and a 200 must have the verb's shape.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from egpu_testing.workbench import ServedExtender, ready_state
from elastic_gpu.core.model import Card, Node
from elastic_gpu.scheduler.extender import Extender
from elastic_gpu.scheduler.http import BIND_BODY_BYTES

NODES = [Node(f"n{i}", 64_000, 256_000, (Card(0, f"GPU-{i}", "A100", 16384),
                                        Card(1, f"GPU-{i}b", "T4", 16384)),
              {"zone": "a", "kubernetes.io/hostname": f"n{i}"}) for i in range(3)]

POD: dict[str, Any] = {
    "apiVersion": "v1", "kind": "Pod",
    "metadata": {"name": "fz", "namespace": "default", "uid": "uid-fz", "resourceVersion": "12",
                 "labels": {"app": "x"},
                 "annotations": {"elasticgpu.io/node-policy": "binpack",
                                 "elasticgpu.io/gpu-model": "A100|T4", "note": "ü"}},
    "spec": {
        "containers": [{"name": "main", "image": "busybox",
                        "resources": {"limits": {"elasticgpu.io/gpu-core": "30",
                                                 "elasticgpu.io/gpu-memory": "1024",
                                                 "cpu": "500m", "memory": "1Gi"},
                                      "requests": {"cpu": "250m", "memory": 1048576}}},
                       {"name": "side", "resources": {}}],
        "initContainers": [{"name": "init", "resources": {"requests": {"cpu": "100m"}}}],
        "overhead": {"cpu": "10m"},
        "nodeSelector": {"zone": "a"},
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}],
                 "matchFields": [{"key": "metadata.name", "operator": "NotIn",
                                  "values": ["n9"]}]}]}}},
        "tolerations": [{"key": "k", "operator": "Equal", "value": "v", "effect": "NoSchedule",
                         "tolerationSeconds": 30}],
        "priority": 10, "schedulerName": "default-scheduler", "nodeName": ""},
    "status": {"phase": "Pending"}}


def node_object(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"zone": "a"}},
            "spec": {"taints": [{"key": "t", "value": "1", "effect": "PreferNoSchedule"}]},
            "status": {"allocatable": {"cpu": "64", "memory": "256Gi"}}}


TEMPLATES: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = {
    "names": (("filter", "prioritize"), {"Pod": POD, "Nodes": None,
                                         "NodeNames": ["n0", "n1", "ghost"]}),
    "objects": (("filter", "prioritize"), {"Pod": POD, "NodeNames": None, "Nodes": {
        "items": [node_object("n0"), node_object("ghost")]}}),
    "meta-victims": (("preempt",), {"Pod": POD, "NodeNameToVictims": None,
                                    "NodeNameToMetaVictims": {
                                        "n0": {"Pods": [{"UID": "v1"}], "NumPDBViolations": 0},
                                        "n1": None}}),
    "victims": (("preempt",), {"Pod": POD, "NodeNameToVictims": {
        "n0": {"Pods": [POD], "NumPDBViolations": 1}, "n1": None}}),
    "binding": (("bind",), {"PodName": "fz", "PodNamespace": "default", "PodUID": "uid-fz",
                            "Node": "n0"}),
}

DEEP = "\x00deep\x00"
#: Every kind of JSON value, and the edge cases of each.
JUNK: list[Any] = [
    None, True, False, 0, -1, 2**31, 2**63, -(2**63) - 1, 2**64, 10**40, -(10**400), 1.5, -0.0,
    1e308, "", "x", "ü\u2028😀\u0000", "\ud800", "9" * 5000, "1e999999999", "+Inf",
    [], [1, "a", None, {}], list(range(3000)), {}, {"a": {"b": [1, {"c": None}]}},
    {"metadata": "s", "name": 1}, DEEP,
]


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every position in a JSON document (not the root)."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield (*prefix, key)
            yield from paths(item, (*prefix, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield (*prefix, i)
            yield from paths(item, (*prefix, i))


_DELETE = object()


def mutate(doc: Any, path: tuple[Any, ...], junk: Any) -> Any:
    doc = copy.deepcopy(doc)
    parent = doc
    for step in path[:-1]:
        parent = parent[step]
    if junk is _DELETE:
        del parent[path[-1]]
    else:
        parent[path[-1]] = junk
    return doc


def encode(doc: Any) -> bytes:
    text = json.dumps(doc)  # ensure_ascii: lone surrogates travel as \ud800 escapes
    return text.replace(json.dumps(DEEP), "[" * 5000 + "]" * 5000).encode()


class FakeApi:
    async def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return None

    async def bind(self, *args: Any) -> None:
        return None


@pytest.fixture(scope="module")
def server() -> Iterator[ServedExtender]:
    state = ready_state(NODES, pods=[POD])
    srv = ServedExtender(Extender(state, FakeApi()))
    yield srv
    srv.stop()


def check(srv: ServedExtender, verb: str, body: bytes) -> int:
    status, answer = srv.post(f"/{verb}", body)
    assert status < 500, (verb, status, answer, body[:300])
    if status != 200:
        assert isinstance(answer, dict) and isinstance(answer["Error"], str) and answer["Error"]
        return status
    if verb == "filter":
        assert isinstance(answer["Error"], str)
        assert isinstance(answer["FailedNodes"], dict)
        assert answer["NodeNames"] is None or isinstance(answer["NodeNames"], list)
    elif verb == "prioritize":
        assert isinstance(answer, list) and all(0 <= h["Score"] <= 10 for h in answer)
    elif verb == "preempt":
        assert answer.get("NodeNameToMetaVictims") is None or isinstance(
            answer["NodeNameToMetaVictims"], dict)
    else:
        assert isinstance(answer["Error"], str)
    return status


@pytest.mark.parametrize("template", sorted(TEMPLATES))
def test_the_templates_are_valid(server: ServedExtender, template: str) -> None:
    verbs, doc = TEMPLATES[template]
    for verb in verbs:
        assert check(server, verb, encode(doc)) == 200


@pytest.mark.parametrize("template", sorted(TEMPLATES))
def test_every_field_replaced_by_every_kind_of_value(server: ServedExtender,
                                                     template: str) -> None:
    verbs, doc = TEMPLATES[template]
    seen: dict[int, int] = {}
    for path in paths(doc):
        for junk in [*JUNK, _DELETE]:
            body = encode(mutate(doc, path, junk))
            for verb in verbs:
                status = check(server, verb, body)
                seen[status] = seen.get(status, 0) + 1
    assert seen.get(400), seen  # the sweep reaches the validation, not only the happy path


@pytest.mark.parametrize("template", sorted(TEMPLATES))
def test_truncated_and_wrapped_bodies(server: ServedExtender, template: str) -> None:
    _, doc = TEMPLATES[template]
    text = encode(doc)
    for verb in ("filter", "prioritize", "bind", "preempt"):
        for cut in range(0, len(text), max(1, len(text) // 97)):
            check(server, verb, text[:cut])
        for wrapped in (b"[" + text + b"]", b'{"Pod": ' + text + b"}", text + b"garbage",
                        text.replace(b'"', b"'"), b"\xef\xbb\xbf" + text, text[:-1] + b",}"):
            check(server, verb, wrapped)


def json_values() -> st.SearchStrategy[Any]:
    scalars = (st.none() | st.booleans() | st.integers() | st.integers(-(2**80), 2**80)
               | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12)
               | st.sampled_from(JUNK[:22]))
    return st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                        | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                        max_leaves=12)


@st.composite
def mutated(draw: st.DrawFn) -> tuple[str, bytes]:
    name = draw(st.sampled_from(sorted(TEMPLATES)))
    verbs, doc = TEMPLATES[name]
    every = list(paths(doc))
    for _ in range(draw(st.integers(1, 4))):
        live = [p for p in every if _exists(doc, p)]
        if not live:
            break
        path = draw(st.sampled_from(live))
        doc = mutate(doc, path, draw(st.just(_DELETE) | json_values()))
    verb = draw(st.sampled_from([*verbs, "filter", "prioritize", "bind", "preempt"]))
    return verb, encode(doc)


def _exists(doc: Any, path: tuple[Any, ...]) -> bool:
    for step in path:
        if (isinstance(doc, dict) and step in doc) or (
                isinstance(doc, list) and isinstance(step, int) and step < len(doc)):
            doc = doc[step]
        else:
            return False
    return True


@settings(max_examples=600, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(case=mutated())
def test_random_combinations_of_mutations(server: ServedExtender, case: tuple[str, bytes]) -> None:
    check(server, *case)


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(verb=st.sampled_from(["filter", "prioritize", "bind", "preempt"]),
       body=st.binary(max_size=200) | json_values().map(lambda v: json.dumps(v).encode()))
def test_random_bodies(server: ServedExtender, verb: str, body: bytes) -> None:
    check(server, verb, body)


#: The issue's hostile bodies (issue 26, item 8): 100,000 levels of lists or objects, alone or
#: as the value of a field the extender reads or ignores. They answered 500 (RecursionError).
DEEP_BODIES = [
    b"[" * 100_000 + b"]" * 100_000,
    b'{"a":' * 100_000 + b"1" + b"}" * 100_000,
    b'{"Pod": ' + b"[" * 100_000 + b"]" * 100_000 + b', "NodeNames": ["n0"]}',
    b'{"Pod": {}, "NodeNames": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    b'{"Extra": ' + b"[" * 100_000 + b"]" * 100_000 + b', "Pod": {}, "NodeNames": ["n0"]}',
    b"[" * 100_000,  # never closed
    b"[" * 30_000 + b"]" * 30_000,  # under a bind's 64 KiB
    b'{"PodName": ' + b"[" * 30_000 + b"]" * 30_000 + b"}",
]


@pytest.mark.parametrize("verb", ["filter", "prioritize", "bind", "preempt", "provision"])
def test_deep_nesting_is_refused_with_400_naming_the_limit(server: ServedExtender,
                                                           verb: str) -> None:
    for body in DEEP_BODIES:
        status, answer = server.post(f"/{verb}", body)
        if verb in ("bind", "provision") and len(body) > BIND_BODY_BYTES:
            assert status == 413 and "bytes is over the limit" in answer["Error"], answer
            continue
        assert status == 400, (verb, status, answer, body[:40])
        assert "levels deep, more than the limit of 256" in answer["Error"], answer


def test_a_connection_flood_beyond_the_cap_leaves_every_verb_answering() -> None:
    """Issue 26, item 9, in the hostile corpus: idle connections that never send a request,
    three times the cap, held open while every verb is asked; the server answers each, and
    closes the idle ones after its timeouts."""
    import socket

    from elastic_gpu.scheduler.config import SchedulerConfig
    from elastic_gpu.scheduler.state import SchedulerState

    config = SchedulerConfig(header_timeout_s=1.0, idle_timeout_s=1.0, max_connections=20)
    srv = ServedExtender(Extender(ready_state(NODES, SchedulerState(config), pods=[POD]),
                                  FakeApi()))
    flood = [socket.create_connection(("127.0.0.1", srv.port)) for _ in range(60)]
    try:
        srv.conn.close()  # a fresh connection per verb, each one past the flood
        for name, (verbs, doc) in sorted(TEMPLATES.items()):
            for verb in verbs:
                srv.conn = type(srv.conn)("127.0.0.1", srv.port, timeout=30)
                assert check(srv, verb, encode(doc)) == 200, (name, verb)
        assert srv.gate.open_count <= srv.gate.cap
        deadline = time.monotonic() + 60
        while srv.gate.open_count > 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert srv.gate.open_count <= 1, f"{srv.gate.open_count} idle connections still open"
    finally:
        for sock in flood:
            sock.close()
        srv.stop()
