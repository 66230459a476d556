"""`egpu top` (and `kubectl egpu top`): the cluster's GPUs per node and card, who holds what,
what is free, health and fragmentation, and the defragmentation plans recorded on pending pods
(docs/top.md).

Six LISTs, concurrently (Nodes, GPUDevices, Pods not finished, ElasticGPUs, and for DRA nodes
ResourceSlices and ResourceClaims), through the project's REST client (`kube.client`); the view
is `core.gpuview.build_view` (pure; a DRA node's cards and claims read by
`core.dra.sliceview`), the rendering a rich table. `--watch` lists again every `--interval` seconds.
"""

from __future__ import annotations

import asyncio
import dataclasses
import fnmatch
import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from elastic_gpu.cli.options import LogLevel, start_logging
from elastic_gpu.core.defrag.record import PendingPlan, PlanRecord, pending_plans
from elastic_gpu.core.gpuview import (
    CardView,
    ClusterView,
    ElasticGPUHold,
    Holder,
    NodeView,
    PodHold,
)
from elastic_gpu.core.podlife import NOT_TERMINAL_SELECTOR, holds_cards
from elastic_gpu.core.resources import MILLI_PER_CARD
from elastic_gpu.kube.resources import (
    ELASTICGPUS,
    GPUDEVICES,
    NODES,
    PODS,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
)

log = logging.getLogger(__name__)

#: not finished pods: the only ones that may hold cards (`core.podlife.holds_cards` decides)
LIVE_PODS = {"fieldSelector": NOT_TERMINAL_SELECTOR}


@dataclass(frozen=True)
class Objects:
    """What one refresh read from the API, as plain dicts."""

    nodes: list[dict[str, Any]]
    devices: list[dict[str, Any]]
    pods: list[dict[str, Any]]
    elasticgpus: list[dict[str, Any]]
    #: DRA nodes' inventory and holds (empty where resource.k8s.io/v1 is not served)
    slices: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    claims: list[dict[str, Any]] = dataclasses.field(default_factory=list)


async def fetch(client: Any) -> Objects:
    """The four lists, at once. A CRD that is not installed (no GPUDevices: another device
    plugin; no ElasticGPUs) reads as empty."""
    from elastic_gpu.kube.errors import NotFound

    async def optional(path: str) -> list[dict[str, Any]]:
        try:
            items, _ = await client.list(path)
        except NotFound:
            return []
        return list(items)

    async def required(path: str, params: Mapping[str, str] | None = None
                       ) -> list[dict[str, Any]]:
        items, _ = await client.list(path, params)
        return list(items)

    nodes, devices, pods, egpus, slices, claims = await asyncio.gather(
        required(NODES.path()), optional(GPUDEVICES.path()), required(PODS.path(), LIVE_PODS),
        optional(ELASTICGPUS.path()), optional(RESOURCE_SLICES.path()),
        optional(RESOURCE_CLAIMS.path()))
    return Objects(nodes, devices, pods, egpus, slices, claims)


def view_from_objects(objects: Objects, node_patterns: Sequence[str] = ()) -> ClusterView:
    """Objects -> core values -> the view. Objects that cannot be read (a GPUDevice or an
    ElasticGPU that fails its decoder, a bad assignment annotation) are skipped with a
    warning: the view shows the rest."""
    from elastic_gpu.api.elasticgpu import ElasticGPUObjectError, elasticgpu_from_object
    from elastic_gpu.api.gpudevice import GPUDeviceError, card_from_object
    from elastic_gpu.core import annotations as ann
    from elastic_gpu.core.assignment import AssignmentError, distrust, pod_assignment
    from elastic_gpu.core.gpuview import build_view
    from elastic_gpu.core.model import Node
    from elastic_gpu.core.resources import is_gpu_resource

    def wanted(name: str) -> bool:
        return not node_patterns or any(fnmatch.fnmatchcase(name, p) for p in node_patterns)

    cards: dict[str, list[Any]] = {}
    for obj in objects.devices:
        try:
            node, card = card_from_object(obj)
        except GPUDeviceError as err:
            log.warning("skipped: %s", err)
            continue
        if wanted(node):
            cards.setdefault(node, []).append(card)
    from elastic_gpu.core.dra.sliceview import claim_holds, node_cards

    dra_cards = {node: found for node, found in node_cards(objects.slices).items()
                 if wanted(node) and node not in cards}
    cards.update(dra_cards)
    claim_held, stale = claim_holds(objects.claims, dra_cards)
    for why in stale:
        log.warning("skipped: %s", why)
    uninventoried: dict[str, dict[str, int]] = {}
    for obj in objects.nodes:
        name = str((obj.get("metadata") or {}).get("name", ""))
        if name in cards or not wanted(name):
            continue
        capacity = (obj.get("status") or {}).get("capacity") or {}
        gpus = {key: _count(value) for key, value in capacity.items() if is_gpu_resource(key)}
        gpus = {key: n for key, n in gpus.items() if n}
        if gpus:
            uninventoried[name] = gpus
    holds = []
    for pod in objects.pods:
        meta = pod.get("metadata") or {}
        bound = (pod.get("spec") or {}).get("nodeName")
        if not bound or not holds_cards(pod):
            continue
        try:
            assignment = pod_assignment(pod)
        except AssignmentError as err:
            log.warning("pod %s/%s: skipped: %s", meta.get("namespace"), meta.get("name"), err)
            continue
        if assignment is None:
            continue
        notes = meta.get("annotations") or {}
        if distrust(bound, notes.get(ann.ASSIGNED_NODE), assignment) is None and wanted(bound):
            holds.append(PodHold(str(meta.get("namespace")), str(meta.get("name")), assignment))
    egpus = []
    for obj in objects.elasticgpus:
        try:
            egpu = elasticgpu_from_object(obj)
        except ElasticGPUObjectError as err:
            log.warning("skipped: %s", err)
            continue
        if egpu.node and wanted(egpu.node):
            claim = (f"{egpu.claim_ref.namespace}/{egpu.claim_ref.name}"
                     if egpu.claim_ref is not None else "")
            egpus.append(ElasticGPUHold(egpu.name, egpu.node, egpu.shares, claim))
    nodes = [Node(name=name, cpu_milli=0, memory_mib=0, cards=tuple(found))
             for name, found in cards.items()]
    view = build_view(nodes, holds, egpus, uninventoried, claim_held)
    plans, unreadable = pending_plans(objects.pods)
    for key, why in unreadable:
        log.warning("pod %s: defrag plan skipped: %s", key, why)
    shown = tuple(p for p in plans if any(wanted(node) for node in _plan_nodes(p.record)))
    return dataclasses.replace(view, plans=shown)


def _plan_nodes(record: PlanRecord) -> list[str]:
    """The nodes a plan touches: where the pending pod goes, where moves come from and go."""
    return [record.placement.node, *(a.node for m in record.moves for a in (m.source, m.target))]


def _count(value: Any) -> int:
    from elastic_gpu.core.quantity import QuantityError, parse_quantity

    try:
        return int(parse_quantity(str(value)))
    except QuantityError:
        return 0


# ---- rendering --------------------------------------------------------------------------


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "-"


def _gib(mib: int) -> str:
    """Memory as people read it: 8.0Gi, 1.2Ti past 1024 GiB."""
    return f"{mib / 1024:.1f}Gi" if mib < 1 << 20 else f"{mib / (1 << 20):.1f}Ti"


def _num(value: float) -> str:
    """At most two decimals, no trailing zeros: 2.78, 0.5, 125."""
    return f"{value:.2f}".rstrip("0").rstrip(".")


def _cards(milli: int) -> str:
    """Compute in cards: 1 card, 0.35 cards, 12 cards."""
    return f"{_num(milli / 1000)} card{'' if milli == 1000 else 's'}"


def _hundredths(milli: int) -> int:
    """Milli-cards to hundredths of a card, half up (integers: no float ties)."""
    return (milli + 5) // 10


def _used_and_free(used_milli: int, free_milli: int, total_milli: int) -> tuple[str, str]:
    """The summary's allocated and free compute in cards, rounded so that, where every card
    is healthy (used + free = total), the two shown add up to the total shown: each rounded
    alone, 2.645 and 3.355 of 6 cards read 2.65 and 3.36 (or 2.64 and 3.35 by float ties)."""
    used = _hundredths(used_milli)
    free = (_hundredths(total_milli) - used if used_milli + free_milli == total_milli
            else _hundredths(free_milli))
    return _num(used / 100), f"{_num(free / 100)} card{'' if free == 100 else 's'}"


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _bar(part: int, whole: int, width: int = 10) -> str:
    filled = round(width * part / whole) if whole else 0
    filled = min(max(filled, 0), width)
    return "█" * filled + "·" * (width - filled)


def _holders(card: CardView) -> str:
    parts = []
    for h in card.holders:
        amount = (_pct(h.milli, MILLI_PER_CARD)
                  + (f" {_gib(h.memory_mib)}" if h.memory_mib else ""))
        if h.kind == "pod":
            what = f"{h.name} ({h.detail})"
        elif h.kind == "resourceclaim":
            used = f" used by {', '.join(h.users)}" if h.users else ""
            what = f"claim {h.name}{used}"
        else:
            claim = f" claim {h.detail}" if h.detail else " unclaimed"
            used = f" used by {', '.join(h.users)}" if h.users else ""
            what = f"egpu {h.name}{claim}{used}"
        mig = f" [MIG {h.mig_profile}]" if h.mig_profile else ""
        parts.append(f"{what}{mig} {amount}{_uses(h)}")
    free_mig = [m.profile for m in card.mig if m.holder is None]
    if free_mig:
        parts.append("free MIG " + ", ".join(free_mig))
    return "\n".join(parts) if parts else "-"


def _uses(h: Holder) -> str:
    """What a holder's containers are observed to use, beside what it holds ("" when the card
    is not observed), flagged when above its memory share."""
    if h.observed_mib is None:
        return ""
    sm = f" SM {h.observed_sm}%" if h.observed_sm is not None else ""
    flag = f" ABOVE ITS SHARE (+{_gib(h.observed_mib - h.memory_mib)})" if h.above_share else ""
    return f" · uses {_gib(h.observed_mib)}{sm}{flag}"


def _observed_card(card: CardView) -> str:
    """The OBSERVED cell of a card: memory in use, utilisation, out-of-band memory."""
    if card.usage is None:
        return "-"
    oob = f" oob {_gib(card.out_of_band_mib)}" if card.out_of_band_mib else ""
    return f"{_gib(card.usage.used_mib)} SM {card.usage.sm_percent}%{oob}"


def _observed_node(node: NodeView) -> str:
    if not node.observed:
        return "-" if node.cards else ""
    oob = f" oob {_gib(node.out_of_band_mib)}" if node.out_of_band_mib else ""
    return f"{_gib(node.observed_mib)}{oob}"


def _summary(view: ClusterView) -> str:
    whose = "its" if view.above_share == 1 else "their"
    observed = (f" · observed: {_gib(view.out_of_band_mib)} out of band, "
                f"{_plural(view.above_share, 'holder')} above {whose} memory share"
                if view.observed else "")
    return _allocated_summary(view) + observed


def _allocated_summary(view: ClusterView) -> str:
    used, free = _used_and_free(view.used_milli, view.free_milli, view.compute_milli)
    return (f"{_plural(len(view.nodes), 'node')} · {_plural(view.cards, 'card')} "
            f"({view.unhealthy} unhealthy) · allocated: compute "
            f"{_pct(view.used_milli, view.compute_milli)} ({used}/"
            f"{_num(view.compute_milli / 1000)} cards), memory "
            f"{_pct(view.used_mib, view.memory_mib)} · free: {free}, "
            f"{view.free_cards} whole, {_gib(view.free_mib)} · fragmentation "
            f"{100 * view.fragmentation:.0f}%")


def _node_note(node: NodeView) -> str:
    """The node row's last cell: whole free cards and fragmentation, or why it has no cards."""
    if not node.cards:
        listed = ", ".join(f"{k}={v}" for k, v in sorted(node.uninventoried.items()))
        return f"no GPUDevice inventory ({listed})"
    whole = f"{_plural(node.free_cards, 'whole card')} free"
    return f"{whole} · fragmentation {100 * node.fragmentation:.0f}%"


HEADERS = ("NODE", "GPU", "MODEL", "HEALTH", "COMPUTE", "MEMORY", "FREE", "HELD BY")
#: shown before HELD BY when some card is observed (GPUDevice status.usage)
OBSERVED = "OBSERVED"
#: columns aligned to the right (the rest to the left)
RIGHT = {1}
GAP = "  "


@dataclass(frozen=True)
class _Row:
    cells: tuple[str, ...]
    #: style per column index (rich style names)
    styles: Mapping[int, str]
    #: lines after the first of the last cell (more holders), aligned under it
    more: tuple[str, ...] = ()


def _rows(view: ClusterView, holders: bool) -> list[_Row]:
    rows = _base_rows(view, holders)
    if not view.observed:
        return rows
    # the OBSERVED column, before HELD BY (or last without it), in the rows' order
    cells = [cell for node in view.nodes
             for cell in (_observed_node(node), *map(_observed_card, node.cards))]
    flags = [flag for node in view.nodes
             for flag in (False, *(card.above_share > 0 for card in node.cards))]
    at = 7
    out = []
    for row, cell, flag in zip(rows, cells, flags, strict=True):
        styles = {(i + 1 if i >= at else i): st for i, st in row.styles.items()}
        if flag:
            styles[at + 1] = "bold red"
        out.append(_Row((*row.cells[:at], cell, *row.cells[at:]), styles, row.more))
    return out


def _base_rows(view: ClusterView, holders: bool) -> list[_Row]:
    rows = []
    for node in view.nodes:
        n = len(node.cards)
        health, health_style = (f"{node.unhealthy} bad", "bold red") if node.unhealthy else (
            ("ok", "green") if n else ("", ""))
        cells = [node.name, "", _plural(n, "card"), health]
        if n:
            cells += [f"{_bar(node.used_milli, node.compute_milli)} "
                      f"{_pct(node.used_milli, node.compute_milli):>4}",
                      f"{_gib(node.used_mib)}/{_gib(node.memory_mib)}",
                      f"{_cards(node.free_milli)} {_gib(node.free_mib)}"]
        else:
            cells += ["", "", ""]
        if holders:
            cells.append(_node_note(node))
        rows.append(_Row(tuple(cells), {0: "bold", 3: health_style, 7: "dim"}))
        for card in node.cards:
            cells = ["", str(card.index), card.model, "ok" if card.healthy else "UNHEALTHY",
                     f"{_bar(card.used_milli, card.compute_milli)} "
                     f"{_pct(card.used_milli, card.compute_milli):>4}",
                     f"{_gib(card.used_mib)}/{_gib(card.memory_mib)}",
                     f"{_pct(card.free_milli, MILLI_PER_CARD)} {_gib(card.free_mib)}"]
            more: tuple[str, ...] = ()
            if holders:
                first, *rest = _holders(card).split("\n")
                cells.append(first)
                more = tuple(rest)
            rows.append(_Row(tuple(cells), {3: "green" if card.healthy else "bold red"}, more))
    return rows


def render(view: ClusterView, *, holders: bool = True) -> Any:
    """The rich renderable of a view: a summary line and one table: per node a row of its
    totals (FREE in cards of compute and memory), then its cards (FREE in percent of the
    card). Laid out here in fixed-width columns, one rich Text per line: rich's Table measures
    and pads every cell, which made a 100-node cluster take most of a second to draw."""
    from rich.console import Group
    from rich.text import Text

    headers = HEADERS if holders else HEADERS[:-1]
    if view.observed:
        headers = (*HEADERS[:7], OBSERVED, *headers[7:])
    rows = _rows(view, holders)
    widths = [max([len(headers[i]), *(len(r.cells[i]) for r in rows)])
              for i in range(len(headers))]
    widths[-1] = 0  # the last column is not padded

    def line(cells: Sequence[str], styles: Mapping[int, str]) -> Text:
        text = Text(no_wrap=False)
        for i, cell in enumerate(cells):
            if i:
                text.append(GAP)
            padded = cell.rjust(widths[i]) if i in RIGHT else cell.ljust(widths[i])
            text.append(padded, style=styles.get(i) or None)
        return text

    offset = sum(widths[:-1]) + len(GAP) * (len(headers) - 1)
    lines = [Text(_summary(view), style="bold"),
             line(headers, dict.fromkeys(range(len(headers)), "bold"))]
    for row in rows:
        lines.append(line(row.cells, row.styles))
        lines.extend(Text(" " * offset + extra) for extra in row.more)
    if view.plans:
        lines.append(Text(f"defrag plans for {_plural(len(view.plans), 'pending pod')}:",
                          style="bold"))
        lines.extend(Text(_plan_line(plan)) for plan in view.plans)
    return Group(*lines)


def _plan_line(plan: PendingPlan) -> str:
    """`ml/whole (report mode, planned 20:10:05Z): would move 1 pod(s): ...`."""
    record = plan.record
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(record.at))
    if record.mode == "report":
        return f"  {plan.pod} (report mode, nothing moved; planned {at}): would {record.describe()}"
    return f"  {plan.pod} (moving, planned {at}): {record.describe()}"


# ---- command ----------------------------------------------------------------------------


def default_kubeconfig(explicit: Path | None) -> Path | None:
    """--kubeconfig, else $KUBECONFIG's first existing file, else ~/.kube/config if it
    exists; None: the in-cluster service account (kubectl's order)."""
    if explicit is not None:
        return explicit
    for entry in os.environ.get("KUBECONFIG", "").split(os.pathsep):
        if entry and Path(entry).is_file():
            return Path(entry)
    home = Path.home() / ".kube" / "config"
    return home if home.is_file() else None


async def snapshot(client: Any, node_patterns: Sequence[str]) -> ClusterView:
    return view_from_objects(await fetch(client), node_patterns)


def top(
    kubeconfig: Annotated[Path | None, typer.Option(
        "--kubeconfig", help="Kubeconfig file; default $KUBECONFIG, ~/.kube/config, "
        "then the in-cluster service account.")] = None,
    node: Annotated[list[str] | None, typer.Option(
        "--node", help="Only nodes matching this name or glob (repeatable).")] = None,
    watch: Annotated[bool, typer.Option(
        "--watch", "-w", help="Refresh every --interval seconds until interrupted.")] = False,
    interval: Annotated[float, typer.Option(
        "--interval", min=0.2, help="Seconds between refreshes with --watch.")] = 2.0,
    no_holders: Annotated[bool, typer.Option(
        "--no-holders", help="Leave out the HELD BY column.")] = False,
    log_level: LogLevel = "WARNING",
) -> None:
    """Show the cluster's GPUs: per node and card who holds what (pods, claims' ElasticGPUs,
    MIG instances), free compute and memory, health and fragmentation; and the
    defragmentation controller's latest plan for each pending pod."""
    from rich.console import Console

    from elastic_gpu.kube.client import KubeClient
    from elastic_gpu.kube.errors import ApiError
    from elastic_gpu.kube.kubeconfig import ClientConfigError

    start_logging("egpu top", log_level, fmt="egpu top: %(message)s")
    console = Console()
    if not console.is_terminal:
        # piped or captured (`egpu top > file`, `| grep`): one line per row, as kubectl prints,
        # never wrapped at rich's 80-column default for non-terminals
        console = Console(width=1000, soft_wrap=True)
    patterns = list(node or [])
    try:
        client = KubeClient.from_config(default_kubeconfig(kubeconfig))
    except ClientConfigError as err:
        typer.echo(f"egpu top: {err}", err=True)
        raise typer.Exit(2) from None

    async def once() -> ClusterView:
        return await snapshot(client, patterns)

    async def run() -> None:
        try:
            if not watch:
                console.print(render(await once(), holders=not no_holders))
                return
            if not console.is_terminal:
                # piped (`| tee`, a log): rich's Live draws only to a terminal and printed
                # nothing until interrupted; append each refresh, as `kubectl get -w` does
                while True:
                    started = time.monotonic()
                    console.print(render(await once(), holders=not no_holders))
                    console.print()
                    console.file.flush()
                    await asyncio.sleep(max(interval - (time.monotonic() - started), 0))
            from rich.live import Live

            with Live(console=console, auto_refresh=False, screen=False) as live:
                while True:
                    started = time.monotonic()
                    live.update(render(await once(), holders=not no_holders), refresh=True)
                    await asyncio.sleep(max(interval - (time.monotonic() - started), 0))
        finally:
            await client.close()

    try:
        asyncio.run(run())
    except KeyboardInterrupt:
        pass
    except ApiError as err:
        typer.echo(f"egpu top: the API server refused a read: {err}", err=True)
        raise typer.Exit(1) from None
