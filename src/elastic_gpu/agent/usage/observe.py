"""From a backend's sample to each logical card's `CardUsage`: who holds what (the ledger),
which container each process is (cgroup + the node's pods), and the out-of-band rest.

The ledger is the node's pods' assignments (`accounting.container_shares`, what the allocation
columns count). A process is mapped by its cgroup to (pod UID, container runtime ID) and those
to names through the pods' `containerStatuses` (the agent's pod cache; the kubelet's
PodResources API names no process or container ID, and only containers holding device-plugin
devices, so the pods are the one source that names every process's container; the monitor
reads PodResources beside them for which card kubelet gave, `agent.podresources`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from elastic_gpu.agent.accounting import container_shares, holding_pods
from elastic_gpu.agent.backends.base import CardSample, Holder
from elastic_gpu.agent.devices import LogicalCard
from elastic_gpu.agent.usage.cgroup import container_id, read_cgroup
from elastic_gpu.core.usage import (
    CardUsage,
    ContainerRef,
    MigUsage,
    ProcessUse,
    observe_card,
    observe_mig,
)

#: {logical card index: {holder: its memory share on that card, MiB}}
Ledger = dict[int, dict[ContainerRef, int]]


def ledger(pods: Iterable[Mapping[str, Any]], node: str, cards: Sequence[LogicalCard]
           ) -> Ledger:
    """Who holds each card and how much of its memory, from the pods' assignments."""
    out: Ledger = {lc.index: {} for lc in cards}
    by_index = {lc.index: lc.card for lc in cards}
    for share in container_shares(list(pods), node, by_index):
        ref = ContainerRef(share.namespace, share.pod, share.container)
        held = out.setdefault(share.index, {})
        held[ref] = held.get(ref, 0) + share.memory_mib
    return out


def _statuses(pod: Mapping[str, Any]) -> Iterable[Mapping[str, Any]]:
    status = pod.get("status") or {}
    for key in ("containerStatuses", "initContainerStatuses", "ephemeralContainerStatuses"):
        for item in status.get(key) or []:
            if isinstance(item, Mapping):
                yield item


def owner_index(pods: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], ContainerRef]:
    """{(pod UID, container runtime ID): the container}, from the pods' statuses."""
    out: dict[tuple[str, str], ContainerRef] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        for item in _statuses(pod):
            cid = container_id(str(item.get("containerID") or ""))
            if uid and cid:
                out[(uid, cid)] = ContainerRef(str(meta.get("namespace")), str(meta.get("name")),
                                               str(item.get("name")))
    return out


def container_ids(pods: Iterable[Mapping[str, Any]]) -> dict[ContainerRef, tuple[str, ...]]:
    """Each container's runtime IDs (a restarted container has had several; the live one is
    in the status)."""
    out: dict[ContainerRef, tuple[str, ...]] = {}
    for (_, cid), ref in owner_index(pods).items():
        out[ref] = (*out.get(ref, ()), cid)
    return out


def mig_holdings(pods: Iterable[Mapping[str, Any]], node: str
                 ) -> dict[tuple[ContainerRef, int], str]:
    """{(container, card index): the MIG instance it holds there}, from the assignments."""
    out: dict[tuple[ContainerRef, int], str] = {}
    for name, assignment in holding_pods(pods, node):
        namespace, _, pod = name.partition("/")
        for container, shares in assignment.containers.items():
            for share in shares:
                if share.mig_uuid is not None:
                    out[(ContainerRef(namespace, pod, container), share.index)] = share.mig_uuid
    return out


def holders(pods: Sequence[Mapping[str, Any]], cards: Sequence[LogicalCard], held: Ledger,
            migs: Mapping[tuple[ContainerRef, int], str] | None = None) -> list[Holder]:
    """What `Backend.sample` is told of each physical card's holders: per chip of a held
    logical card, the holder with its pod's annotations, its runtime IDs and the MIG instance
    it holds there (`migs`, from `mig_holdings`)."""
    by_name: dict[tuple[str, str], Mapping[str, Any]] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        by_name[(str(meta.get("namespace")), str(meta.get("name")))] = pod
    ids = container_ids(pods)
    out = []
    for lc in cards:
        for ref in sorted(held.get(lc.index, {})):
            pod = by_name.get((ref.namespace, ref.pod), {})
            annotations = {str(k): str(v) for k, v in
                           ((pod.get("metadata") or {}).get("annotations") or {}).items()}
            mig = (migs or {}).get((ref, lc.index))
            for chip in lc.chips:
                out.append(Holder(chip.uuid, ref, annotations, ids.get(ref, ()), mig))
    return out


def proc_resolver(pods: Iterable[Mapping[str, Any]], proc: Path = Path("/proc")
                  ) -> Callable[[int], ContainerRef | None]:
    """pid -> its pod container, by its cgroup and the pods' statuses (None: no pod's)."""
    owners = owner_index(pods)

    def resolve(pid: int) -> ContainerRef | None:
        ref = read_cgroup(pid, proc)
        return None if ref is None else owners.get((ref.pod_uid, ref.container_id))
    return resolve


def memoized(resolve: Callable[[int], ContainerRef | None]
             ) -> Callable[[int], ContainerRef | None]:
    """`resolve` reading each pid's cgroup once (one sample asks twice: `observe` and
    `seen_on_cards`)."""
    cache: dict[int, ContainerRef | None] = {}

    def once(pid: int) -> ContainerRef | None:
        if pid not in cache:
            cache[pid] = resolve(pid)
        return cache[pid]
    return once


def seen_on_cards(samples: Sequence[CardSample], cards: Sequence[LogicalCard],
                  resolve: Callable[[int], ContainerRef | None]) -> dict[int, set[ContainerRef]]:
    """{logical card: the pod containers whose processes the sample shows on it}, holders or
    not (the cgroup mapping, for the cross-check against kubelet)."""
    by_uuid = {s.uuid: s for s in samples}
    out: dict[int, set[ContainerRef]] = {}
    for lc in cards:
        for uuid in lc.uuids:
            sample = by_uuid.get(uuid)
            for proc in sample.processes if sample is not None else ():
                ref = proc.owner if proc.owner is not None else resolve(proc.pid)
                if ref is not None:
                    out.setdefault(lc.index, set()).add(ref)
    return out


def observe(samples: Sequence[CardSample], cards: Sequence[LogicalCard], held: Ledger,
            resolve: Callable[[int], ContainerRef | None], observed_at: str = ""
            ) -> dict[int, CardUsage]:
    """Each logical card's usage from its chips' samples (a card none of whose chips was
    sampled is left out). A chip's processes count on its logical card; utilisation is the
    chips' mean."""
    by_uuid = {s.uuid: s for s in samples}
    out: dict[int, CardUsage] = {}
    for lc in cards:
        chips = [by_uuid[u] for u in lc.uuids if u in by_uuid]
        if not chips:
            continue
        processes = [ProcessUse(p.memory_mib, p.sm_percent,
                                p.owner if p.owner is not None else resolve(p.pid))
                     for chip in chips for p in chip.processes]
        out[lc.index] = observe_card(sum(c.used_mib for c in chips),
                                     sum(c.sm_percent for c in chips) // len(chips), processes,
                                     held.get(lc.index, {}).keys(), observed_at)
    return out


def observe_migs(samples: Sequence[CardSample], cards: Sequence[LogicalCard],
                 resolve: Callable[[int], ContainerRef | None]) -> dict[str, MigUsage]:
    """Each sampled MIG instance's usage, by its UUID, on the logical card of its chip."""
    card_of = {uuid: lc.index for lc in cards for uuid in lc.uuids}
    out: dict[str, MigUsage] = {}
    for sample in samples:
        card = card_of.get(sample.uuid)
        if card is None:
            continue
        for mig in sample.mig:
            processes = [ProcessUse(p.memory_mib, None,
                                    p.owner if p.owner is not None else resolve(p.pid))
                         for p in mig.processes]
            out[mig.uuid] = observe_mig(card, mig.uuid, mig.used_mib, processes)
    return out
