"""The extender's edge on the real control plane: mutual TLS with a real kube-scheduler, a
bind that refuses what kube-scheduler's filters would, and a clean SIGTERM drain.

kube-scheduler talks HTTPS to `egpu scheduler --tls-cert/--tls-key/--tls-client-ca` and
presents its client certificate (extender `tlsConfig`); GPU pods bind. A client without a
certificate (or with one from another CA) is refused in the TLS handshake; one with a valid
certificate that asks to bind a pod onto a node its nodeSelector or required node affinity
excludes, or to bind a non-GPU pod, gets an `Error` and the pod stays unbound.
"""

from __future__ import annotations

import http.client
import json
import signal
import ssl
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from egpu_testing.pytest_plugin import unique_name
from egpu_testing.scenario import create_pods, pods_by_name, wait_bound, wait_extender_knows
from egpu_testing.workbench import (
    ExtenderProcess,
    TestPki,
    extender_kube_scheduler_config,
    extender_tls_stanza,
    metric_value,
    metrics_text,
    pod_manifest,
)
from elastic_gpu.core import annotations as ann
from elastic_gpu.devcluster.ports import free_ports

pytestmark = pytest.mark.integration

#: a profile of the extender's schedulerNames that no kube-scheduler runs in these tests
DIRECT = "direct-binds"


def _post(extender: ExtenderProcess, context: ssl.SSLContext, verb: str, body: Any
          ) -> tuple[int, Any]:
    conn = http.client.HTTPSConnection("127.0.0.1", extender.port, timeout=10, context=context)
    try:
        conn.request("POST", f"/{verb}", body=json.dumps(body).encode())
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def test_mutual_tls_with_kube_scheduler_and_a_bind_that_checks_placement(
        k8s_cluster: Any, start_kube_scheduler: Any, fake_gpu_nodes: Any, k8s_namespace: str,
        tmp_path: Path) -> None:
    from elastic_gpu.agent.deviceplugin.inventory_api import ensure_crd

    client = k8s_cluster.client()
    ensure_crd(k8s_cluster.kube())
    pki = TestPki.create(tmp_path)
    (port,) = free_ports(1)
    # Two profiles call the extender: the test's kube-scheduler, and "direct-binds", which no
    # kube-scheduler runs: the test binds its pods itself, as kube-scheduler would.
    name = unique_name("egpu")
    extender = ExtenderProcess(k8s_cluster.kubeconfig, port, tmp_path / "extender.log", tls=pki,
                               config={"schedulerNames": [name, DIRECT]})
    extender.start()
    try:
        config = extender_kube_scheduler_config(extender.url, name)
        config["extenders"][0]["enableHTTPS"] = True
        config["extenders"][0]["tlsConfig"] = extender_tls_stanza(pki)
        start_kube_scheduler(config)
        (zone_a,) = fake_gpu_nodes(1, gpus=4, labels={"zone": "a"})
        (zone_b,) = fake_gpu_nodes(1, gpus=4, labels={"zone": "b"})
        trusted = pki.client_context()
        wait_extender_knows(extender.url, [zone_a, zone_b], 4, context=trusted)

        # kube-scheduler, presenting its client certificate, places and binds GPU pods
        wanted = []
        for i, zone in enumerate(("a", "b", "b")):
            pod = pod_manifest(f"gpu-{i}", k8s_namespace, scheduler_name=name,
                               limits={"elasticgpu.io/gpu-core": "30"})
            pod["spec"]["nodeSelector"] = {"zone": zone}
            wanted.append(pod)
        create_pods(client, wanted)
        bound = wait_bound(client, k8s_namespace, [p["metadata"]["name"] for p in wanted])
        assert [bound[f"gpu-{i}"]["spec"]["nodeName"] for i in range(3)] == [zone_a, zone_b,
                                                                             zone_b]
        assert all(ann.ASSIGNMENT in bound[f"gpu-{i}"]["metadata"]["annotations"]
                   for i in range(3))
        # over HTTPS kube-scheduler (Go) negotiates HTTP/2: its filters and binds share one
        # connection, not a TLS handshake for most pods
        page = metrics_text(extender.url, pki)
        assert (metric_value(page, "elasticgpu_scheduler_connections_http2_total") or 0) >= 1
        assert (metric_value(page, 'elasticgpu_scheduler_requests_total'
                                   '{outcome="bound",verb="bind"}') or 0) >= 3

        # pending pods no scheduler will touch, for direct binds
        held = pod_manifest("held", k8s_namespace, scheduler_name=DIRECT,
                            limits={"elasticgpu.io/gpu-core": "30"})
        held["spec"]["nodeSelector"] = {"zone": "a"}
        aff = pod_manifest("aff", k8s_namespace, scheduler_name=DIRECT,
                           limits={"elasticgpu.io/gpu-core": "30"})
        aff["spec"]["affinity"] = {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]}]}}}
        plain = pod_manifest("plain", k8s_namespace, scheduler_name=DIRECT)
        # a GPU pod of a scheduler that never calls the extender (issue 26, item 11)
        other = pod_manifest("other", k8s_namespace, scheduler_name="nobody",
                             limits={"elasticgpu.io/gpu-core": "30"})
        create_pods(client, [held, aff, plain, other])
        pods = pods_by_name(client, k8s_namespace)

        def bind_args(pod_name: str, node: str) -> dict[str, str]:
            meta = pods[pod_name]["metadata"]
            return {"PodName": pod_name, "PodNamespace": k8s_namespace, "PodUID": meta["uid"],
                    "Node": node}

        # no client certificate, or one another CA signed: refused in the handshake
        for context in (pki.client_context(cert=False), _stranger(pki)):
            with pytest.raises((ssl.SSLError, ConnectionError)):
                _post(extender, context, "bind", bind_args("held", zone_b))

        status, answer = _post(extender, trusted, "bind", bind_args("held", zone_b))
        assert status == 200
        assert answer["Error"] == (f"bind {k8s_namespace}/held to {zone_b}: the node does not "
                                   "match the pod's node selector or required node affinity")
        status, answer = _post(extender, trusted, "bind", bind_args("aff", zone_a))
        assert status == 200 and "required node affinity" in answer["Error"]
        status, answer = _post(extender, trusted, "bind", bind_args("plain", zone_a))
        assert status == 200 and "asks for no GPU resource" in answer["Error"]
        status, answer = _post(extender, trusted, "bind", bind_args("held", "no-such-node"))
        assert status == 200 and "unknown to the GPU scheduler" in answer["Error"]
        # a trusted client's bind of another scheduler's pod, onto a node it fits: refused
        status, answer = _post(extender, trusted, "bind", bind_args("other", zone_a))
        assert status == 200 and answer["Error"] == (
            f"bind {k8s_namespace}/other to {zone_a}: the pod's schedulerName is 'nobody'; this "
            f"extender binds only pods of the schedulers that call it ({', '.join(sorted([name, DIRECT]))}; "
            "its config's schedulerNames)")
        pods = pods_by_name(client, k8s_namespace)
        assert not any(pods[n]["spec"].get("nodeName") for n in ("held", "aff", "plain", "other"))
        assert ann.ASSIGNMENT not in (pods["held"]["metadata"].get("annotations") or {})

        # the same direct bind onto a node the pod allows goes through
        status, answer = _post(extender, trusted, "bind", bind_args("held", zone_a))
        assert (status, answer) == (200, {"Error": ""})
        assert pods_by_name(client, k8s_namespace)["held"]["spec"]["nodeName"] == zone_a
    finally:
        extender.stop()


def _stranger(pki: TestPki) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki.ca))
    context.load_cert_chain(str(pki.stranger_cert), str(pki.stranger_key))
    return context


def test_sigterm_stops_listening_and_exits_0(k8s_cluster: Any, tmp_path: Path) -> None:
    from elastic_gpu.agent.deviceplugin.inventory_api import ensure_crd

    ensure_crd(k8s_cluster.kube())
    (port,) = free_ports(1)
    extender = ExtenderProcess(k8s_cluster.kubeconfig, port, tmp_path / "extender.log")
    extender.start()
    assert extender.process is not None
    extender.process.send_signal(signal.SIGTERM)
    assert extender.process.wait(30) == 0, extender.log_tail()
    assert "stopped" in extender.log_tail()
    with pytest.raises(OSError):
        urllib.request.urlopen(f"{extender.url}/healthz", timeout=2)
