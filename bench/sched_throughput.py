"""End-to-end scheduling throughput on 1,000 kwok nodes: kube-scheduler alone vs kube-scheduler
with the Elastic GPU extender, side by side on the same control plane, whole-card pods.

    .venv/bin/python bench/sched_throughput.py --nodes 1000 --pods 2000 --rounds 3 [--cpu]

Per round and variant: `--pods` pods are created first with a scheduler name nobody serves;
then a kube-scheduler with that name starts and we time binding, from the first bind to the
last (pods/s = pods / that time), so pod creation speed does not enter the figure. The binds
are counted from a protobuf watch of the namespace (`egpu_testing.bind_counter`), not by
polling the API: a poll costs kube-apiserver CPU per second, which a slower variant paid more
of per pod. Variants:
- `plain`: kube-scheduler alone, pods asking `nvidia.com/gpu: 1` (counted by kube-scheduler
  itself; the fake nodes advertise 8 each);
- `egpu`: the same pods, kube-scheduler with the extender stanza of deploy/ and the extender's
  default `filterResult: auto` (these pods state no soft preference: filter answers the
  engine's one node, kube-scheduler binds it without scoring; `-all` variants: every fitting
  node, then prioritize);
- `egpu-share`: the extender with 25% + 8 GiB shares;
- `*-best`: the extender with `filterResult: best` and a kube-scheduler configuration without
  prioritizeVerb (deploy/scheduler/kube-scheduler-config-best.yaml): one round trip per pod;
- `plain-distinct` / `egpu-distinct`: as `plain` / `egpu`, but every pod has its own CPU
  request, so kube-scheduler's batching of identical pods (on by default since 1.35, off
  whenever extenders are configured) does not apply to either;
- `egpu-best-asyncio`: as `egpu-best` with `EGPU_EVENT_LOOP=asyncio` (no uvloop);
- `egpu-tls-distinct` / `before-auto-tls-distinct`: as `egpu-distinct` / `before-auto-distinct`
  over HTTPS with client certificates, as the chart deploys it (kube-scheduler's extender
  `tlsConfig`; `TestPki`): kube-scheduler's client keeps two idle connections, so each new
  one it opens is a TLS handshake;
- `before-best` / `before-best-distinct` / `before-distinct` / `before-auto-distinct`: as
  `egpu-best*` / `egpu-all-distinct` / `egpu-distinct`, but the extender runs the code of
  another checkout (`--before-src DIR/src`, with `filterResult: all` or `best`, which every
  version reads, or `auto`, which versions since issue 39 read), for before/after figures side
  by side.
`--until-running` (with `--cpu`): also the CPU per pod from the first bind until kwok has
marked every pod Running. kwok does that at its own pace (~50 status patches a second on the
development box), not per bind, so the window to the last bind holds more of it for a slower
variant (docs/benchmarks.md, "The window's bias"); to the last pod Running, every variant
holds all of it.
Variants alternate order per round; both kube-schedulers get the same client QPS. Medians.
Only the extender a variant uses runs during it (each is started before and stopped after), so
an idle one's watch work does not load the box.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from egpu_testing.bind_counter import BindCounter
from egpu_testing.process_cpu import cpu_by_kind, system_total
from egpu_testing.scenario import create_pods, list_pods
from egpu_testing.workbench import (
    ExtenderProcess,
    TestPki,
    extender_kube_scheduler_config,
    extender_tls_stanza,
    metric_value,
    metrics_text,
    plain_kube_scheduler_config,
    pod_manifest,
    start_gpu_cluster,
)
from elastic_gpu.devcluster.controlplane import ControlPlane
from elastic_gpu.devcluster.ports import free_ports

WHOLE = {"nvidia.com/gpu": "1"}
SHARE = {"elasticgpu.io/gpu-core": "25", "elasticgpu.io/gpu-memory": "8192"}
LIMITS = {"plain": WHOLE, "egpu": WHOLE, "egpu-best": WHOLE, "plain-distinct": WHOLE,
          "egpu-distinct": WHOLE, "egpu-all-distinct": WHOLE, "egpu-best-distinct": WHOLE,
          "egpu-share": SHARE,
          "egpu-share-best": SHARE, "before-best": WHOLE, "before-best-distinct": WHOLE,
          "before-distinct": WHOLE, "before-auto-distinct": WHOLE,
          "egpu-tls-distinct": WHOLE, "before-auto-tls-distinct": WHOLE,
          "egpu-best-asyncio": WHOLE}
#: `--before-src`: another checkout's src/ for the `before-*` variants (an earlier version of
#: the extender, run side by side with this one).
BEFORE_SRC: str | None = None


def manifest(variant: str, i: int, namespace: str) -> dict[str, Any]:
    pod = pod_manifest(f"p-{i:05d}", namespace, limits=LIMITS[variant], scheduler_name=namespace)
    if variant.endswith("-distinct"):
        # kube-scheduler >= 1.35 places identical pods in batches (OpportunisticBatching),
        # which it turns off when extenders are configured; pods that differ (here: each its
        # own CPU request) compare the two without that advantage.
        pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] = f"{10 + i}m"
    return pod


#: CPU seconds per process kind spent between the first and the last bind of the latest
#: `measure` that was given a `probe`, divided by the pods bound (sched_floor.py prints it).
LAST_WINDOW_CPU: dict[str, float] = {}
#: The same less what each kind spends idle over as long a window: kwok's heartbeats of 1,000
#: nodes and the watches they feed cost CPU per second, not per pod, so a slower variant's
#: window charges its pods more of them. Measured over `IDLE_S` just before kube-scheduler
#: starts, with everything else of the variant (its extender too) running and nothing to bind.
LAST_WINDOW_NET: dict[str, float] = {}
IDLE_S = 5.0
#: `--until-running`: also CPU per pod from the first bind until kwok has marked every pod
#: Running (gross, and net of idle as above). kwok marks pods Running at its own pace (~50
#: status patches a second here), not per bind, so a window that ends at the last bind holds
#: more of that per-pod work for a slower variant; to the last pod Running, every variant holds
#: all of it.
UNTIL_RUNNING = False
LAST_RUNNING_CPU: dict[str, float] = {}
LAST_RUNNING_NET: dict[str, float] = {}


def measure(plane: ControlPlane, client: Any, work: Path, variant: str,
            round_: int, count: int, url: str | None = None, *, bind_verb: bool = True,
            probe: Callable[[], dict[str, float]] | None = None) -> float:
    """pods/s of one variant; `url`: an extender already running there instead of a fresh
    `egpu scheduler` (sched_floor.py's do-nothing one); `bind_verb=False`: kube-scheduler
    binds itself; `probe`: CPU seconds by process kind, read at the first and last bind."""
    name = f"{variant}-{round_}"
    plane.kubectl("create", "namespace", name)
    pods = [manifest(variant, i, name) for i in range(count)]
    create_pods(client, pods)
    extender: ExtenderProcess | None = None
    best = "best" in variant.split("-")
    # before-*: an earlier checkout, which may not know `auto` (its default was `all`) unless
    # the variant names it
    words = variant.split("-")
    filter_result = "best" if best else "auto" if "auto" in words else "all" \
        if variant.startswith("before") or "all" in words else "auto"
    if variant.startswith("plain"):
        config = plain_kube_scheduler_config(name)
    elif url is not None:
        config = extender_kube_scheduler_config(url, name, prioritize=not best)
    else:
        (port,) = free_ports(1)
        pki = TestPki.create(work) if "tls" in words else None
        extender = ExtenderProcess(plane.kubeconfig, port, work / f"extender-{name}.log",
                                   config={"filterResult": filter_result},
                                   scheduler_name=name, tls=pki)
        if variant.endswith("-asyncio"):
            os.environ["EGPU_EVENT_LOOP"] = "asyncio"  # the standard loop instead of uvloop
        pythonpath = os.environ.get("PYTHONPATH")
        if variant.startswith("before"):
            if BEFORE_SRC is None:
                raise SystemExit("the before-* variants need --before-src")
            os.environ["PYTHONPATH"] = BEFORE_SRC  # the extender subprocess imports that code
        try:
            extender.start(timeout_s=120)
        finally:
            # the caller's own (a run of a snapshot of this tree sets it for every variant)
            if pythonpath is None:
                os.environ.pop("PYTHONPATH", None)
            else:
                os.environ["PYTHONPATH"] = pythonpath
            os.environ.pop("EGPU_EVENT_LOOP", None)
        config = extender_kube_scheduler_config(extender.url, name, prioritize=not best)
        if pki is not None:
            config["extenders"][0]["enableHTTPS"] = True
            config["extenders"][0]["tlsConfig"] = extender_tls_stanza(pki)
    if not bind_verb:
        for stanza in config.get("extenders", []):
            stanza.pop("bindVerb", None)
    idle_rate: dict[str, float] = {}
    if probe is not None:
        before, started = probe(), time.monotonic()
        time.sleep(IDLE_S)
        after, ended = probe(), time.monotonic()
        idle_rate = {k: (v - before.get(k, 0.0)) / (ended - started) for k, v in after.items()}
    # the bound count comes from a watch (its cost is per pod), not from polling the API (whose
    # cost is per second: a slower variant was charged more polls per pod)
    counter = BindCounter(plane.server, plane.client_tls(), name)
    handle = plane.start_scheduler(config, name=f"ks-{name}")
    try:
        first = last = running_at = None
        previous = running = 0
        cpu_first: dict[str, float] = {}
        cpu_last: dict[str, float] = {}
        cpu_running: dict[str, float] = {}
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            bound = counter.bound
            if counter.failed:
                raise RuntimeError(f"{variant}: the watch that counts bound pods failed")
            now = time.monotonic()
            if bound > 0 and first is None:
                first = now
                cpu_first = probe() if probe is not None else {}
            if bound != previous:
                last, previous = now, bound
                cpu_last = probe() if probe is not None else {}
            if UNTIL_RUNNING and counter.running != running:
                running_at, running = now, counter.running
                cpu_running = probe() if probe is not None else {}
            if bound == count and (not UNTIL_RUNNING or running == count):
                break
            time.sleep(0.1)
    finally:
        counter.stop()
        if counter.restarts:
            print(f"{name}: kube-apiserver ended the bind-count watch {counter.restarts} "
                  "times (started again each time)", flush=True)
        handle.stop()
        if extender is not None and previous:
            # kube-scheduler's connections to the extender: its client keeps two idle ones
            with contextlib.suppress(OSError):
                accepted = metric_value(metrics_text(extender.url, extender.tls),
                                        'elasticgpu_scheduler_connections_total'
                                        '{outcome="accepted"}')
                print(f"{name}: the extender accepted {accepted or 0:.0f} connections for "
                      f"{previous} pods bound", flush=True)
        if extender is not None:
            extender.stop()
    # kubectl's `delete --all` sends a DELETE per pod: on a loaded box 1,500 of them outran
    # the 60 s default (and one deletecollection request outran the client's own timeout)
    plane.kubectl("delete", "pods", "--all", "-n", name, "--force", "--grace-period=0",
                  "--wait=false", check=False, timeout_s=900)
    while list_pods(client, name):
        time.sleep(1)
    if probe is not None and previous and first is not None and last is not None:
        LAST_WINDOW_CPU.clear()
        LAST_WINDOW_CPU.update({k: (v - cpu_first.get(k, 0.0)) / previous
                                for k, v in cpu_last.items()})
        span = last - first
        LAST_WINDOW_NET.clear()
        LAST_WINDOW_NET.update({k: v - idle_rate.get(k, 0.0) * span / previous
                                for k, v in LAST_WINDOW_CPU.items()})
        LAST_RUNNING_CPU.clear()
        LAST_RUNNING_NET.clear()
        if UNTIL_RUNNING and running == count and running_at is not None:
            LAST_RUNNING_CPU.update({k: (v - cpu_first.get(k, 0.0)) / count
                                     for k, v in cpu_running.items()})
            LAST_RUNNING_NET.update({k: v - idle_rate.get(k, 0.0) * (running_at - first) / count
                                     for k, v in LAST_RUNNING_CPU.items()})
    if previous != count or first is None or last is None:
        raise RuntimeError(f"{variant}: only {previous}/{count} pods bound")
    if last == first:
        # Every pod was already bound at the first 0.1 s poll: the span is below what the poll
        # can time, and pods / ~0 would be a fantasy figure.
        raise RuntimeError(f"{variant}: all {count} pods bound within one poll; use more --pods")
    return count / (last - first)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--variants", default=",".join(LIMITS),
                        help=f"comma-separated subset of: {', '.join(LIMITS)}")
    parser.add_argument("--cpu", action="store_true",
                        help="also print the CPU each kind of process spent per pod between the "
                             "first and the last bind (sched_floor.py's table), median over "
                             "rounds; and the same net of each kind's idle CPU over as long a "
                             "window (measured for 5 s before kube-scheduler starts)")
    parser.add_argument("--until-running", action="store_true",
                        help="with --cpu: also the CPU per pod from the first bind until kwok "
                             "has marked every pod Running (every variant then holds all of "
                             "kwok's per-pod work, which it does at its own pace)")
    parser.add_argument("--before-src", default=None,
                        help="src/ of an earlier checkout, for the before-* variants "
                             "(e.g. git archive <commit> src | tar -x -C /tmp/before)")
    args = parser.parse_args()
    global BEFORE_SRC, UNTIL_RUNNING
    BEFORE_SRC = args.before_src
    UNTIL_RUNNING = args.until_running
    chosen = args.variants.split(",")
    unknown = sorted(set(chosen) - set(LIMITS))
    if unknown:
        parser.error(f"unknown variants {unknown}; choose from {', '.join(LIMITS)}")
    with tempfile.TemporaryDirectory(prefix="egpu-tput-") as tmp:
        work = Path(tmp)
        plane, client, _ = start_gpu_cluster(work, args.nodes, prefix="tput")
        try:
            results: dict[str, list[float]] = {v: [] for v in chosen}
            cpu: dict[str, list[dict[str, float]]] = {v: [] for v in chosen}
            net: dict[str, list[dict[str, float]]] = {v: [] for v in chosen}
            to_running: dict[str, list[dict[str, float]]] = {v: [] for v in chosen}
            to_running_net: dict[str, list[dict[str, float]]] = {v: [] for v in chosen}
            probe = None
            if args.cpu:
                probe = cpu_by_kind
            for r in range(args.rounds):
                order = list(chosen)
                if r % 2:
                    order.reverse()
                for variant in order:
                    rate = measure(plane, client, work, variant, r, args.pods, probe=probe)
                    results[variant].append(rate)
                    cpu[variant].append(dict(LAST_WINDOW_CPU))
                    net[variant].append(dict(LAST_WINDOW_NET))
                    to_running[variant].append(dict(LAST_RUNNING_CPU))
                    to_running_net[variant].append(dict(LAST_RUNNING_NET))
                    spent = ", ".join(f"{k} {v * 1000:.2f}"
                                      for k, v in sorted(LAST_WINDOW_CPU.items()))
                    print(f"round {r} {variant}: {rate:.1f} pods/s (load "
                          f"{os.getloadavg()[0]:.1f})"
                          + (f"; CPU ms per pod: {spent}, total "
                             f"{system_total(LAST_WINDOW_CPU) * 1000:.2f}, net of idle "
                             f"{system_total(LAST_WINDOW_NET) * 1000:.2f}" if args.cpu else "")
                          + (f"; to the last pod Running: total "
                             f"{system_total(LAST_RUNNING_CPU) * 1000:.2f}, net of idle "
                             f"{system_total(LAST_RUNNING_NET) * 1000:.2f}"
                             if args.cpu and LAST_RUNNING_CPU else ""),
                          flush=True)
            plain = statistics.median(results.get("plain") or [float("nan")])
            print(f"\n{args.pods} pods, {args.nodes} nodes x 8 cards, {args.rounds} rounds")
            print("| variant | pods/s (median) | runs | ratio to kube-scheduler alone (same pods) |")
            print("|---|---|---|---|")
            distinct = statistics.median(results.get("plain-distinct") or [float("nan")])
            labels = {
                "plain": ("kube-scheduler alone, identical `nvidia.com/gpu: 1` pods", plain),
                "egpu": ("kube-scheduler + extender, identical `nvidia.com/gpu: 1` pods", plain),
                "egpu-best": ("kube-scheduler + extender `filterResult: best`, no prioritize, "
                              "identical `nvidia.com/gpu: 1` pods", plain),
                "egpu-share": ("kube-scheduler + extender, identical 25% + 8 GiB shares", plain),
                "egpu-share-best": ("kube-scheduler + extender `filterResult: best`, no "
                                    "prioritize, identical 25% + 8 GiB shares", plain),
                "plain-distinct": ("kube-scheduler alone, `nvidia.com/gpu: 1`, distinct pods",
                                   distinct),
                "egpu-distinct": ("kube-scheduler + extender (`filterResult: auto`), "
                                  "`nvidia.com/gpu: 1`, distinct pods", distinct),
                "egpu-all-distinct": ("kube-scheduler + extender `filterResult: all`, "
                                      "`nvidia.com/gpu: 1`, distinct pods", distinct),
                "egpu-best-distinct": ("kube-scheduler + extender `filterResult: best`, no "
                                       "prioritize, `nvidia.com/gpu: 1`, distinct pods",
                                       distinct),
                "egpu-best-asyncio": ("kube-scheduler + extender `filterResult: best`, asyncio's "
                                      "event loop instead of uvloop, identical pods", plain),
                "before-best": ("earlier extender (--before-src) `filterResult: best`, "
                                "identical `nvidia.com/gpu: 1` pods", plain),
                "before-best-distinct": ("earlier extender (--before-src) `filterResult: best`, "
                                         "`nvidia.com/gpu: 1`, distinct pods", distinct),
                "before-distinct": ("earlier extender (--before-src), `nvidia.com/gpu: 1`, "
                                    "distinct pods", distinct),
                "before-auto-distinct": ("earlier extender (--before-src, `filterResult: "
                                         "auto`), `nvidia.com/gpu: 1`, distinct pods",
                                         distinct),
                "egpu-tls-distinct": ("kube-scheduler + extender (`filterResult: auto`) over "
                                      "HTTPS, `nvidia.com/gpu: 1`, distinct pods", distinct),
                "before-auto-tls-distinct": ("earlier extender (--before-src, `filterResult: "
                                             "auto`) over HTTPS, `nvidia.com/gpu: 1`, "
                                             "distinct pods", distinct)}
            for variant, (label, base) in labels.items():
                if variant not in results:
                    continue
                median = statistics.median(results[variant])
                runs = ", ".join(f"{x:.0f}" for x in results[variant])
                print(f"| {label} | {median:.1f} | {runs} | {median / base:.2f} |")
            if args.cpu:
                kinds = sorted({k for rows in cpu.values() for row in rows for k in row})
                tables = [("between the first and the last bind", cpu),
                          ("between the first and the last bind, net of idle", net)]
                if args.until_running:
                    tables += [("from the first bind to the last pod Running", to_running),
                               ("from the first bind to the last pod Running, net of idle",
                                to_running_net)]
                for title, table in tables:
                    print(f"\nCPU ms per pod {title} (median over rounds):")
                    print("| variant | " + " | ".join(kinds) + " | total |")
                    print("|---|" + "---|" * (len(kinds) + 1))
                    for variant in chosen:
                        medians = [statistics.median([row.get(k, 0.0) for row in table[variant]])
                                   * 1000 for k in kinds]
                        total = system_total(dict(zip(kinds, medians, strict=True)))
                        print(f"| {variant} | " + " | ".join(f"{m:.2f}" for m in medians)
                              + f" | {total:.2f} |")
            return 0
        finally:
            plane.stop()


if __name__ == "__main__":
    sys.exit(main())
