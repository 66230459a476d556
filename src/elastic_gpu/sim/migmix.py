"""MIG demand in a replay (`egpu simulate --mig-mix ...`, issue 42): static layouts against
the dynamic-MIG planner, on a pool of MIG-capable nodes.

The trace has no MIG-capable cards, so the mix runs on its own pool (`MigMixSpec.nodes` nodes
of `gpus` cards of `model`), beside the replay (which it leaves exactly as it was). Its tasks:

- **the trace's single-card tasks**, drawn with the seed: a share of one card
  (`gpu_milli` < 1000) is a HAMi `nvidia.com/vgpu-mode: mig` share, served by the smallest
  profile with at least its compute (`ceil(gpu_milli x 7 / 1000)` of 7 slices, scaled to
  the model's) and the least memory; a whole card (`gpu_milli` 1000, one GPU) is a whole-card task;
- **a synthetic mix of profile requests** (`MigMixSpec.profiles` of the tasks), drawn with the
  seed from `PROFILE_MIX` (NVIDIA's profiles of the model, small ones most often).

Tasks arrive as a Poisson process and leave after an exponential time (`mean_hours`), the
arrival rate chosen so the offered load is `load` x the pool's compute. A task that cannot be
placed when it arrives fails (it does not wait). Two runs of the same tasks:

- **static**: a share of the cards, the MIG tasks' share of the offered compute, is carved
  once in `STATIC_LAYOUTS` (3g + 2g + 1g + 1g; the A30 2g + 1g + 1g); the rest stay whole.
  A MIG task takes a free instance of its profile, else the smallest compatible free one (the
  MIG adapter's substitution); a whole task a whole free card. Layouts never change.
- **dynamic**: every card starts whole; when a task finds nothing, the planner
  (`core.mig.planner.plan`) is called with it as the demand (MIG or whole-card) and its plan
  applied at once (the agent's apply is not simulated), then the task tries again. Carved
  cards with no holder are merged back for a whole-card task after `cooldown_s`.

Measures: MIG tasks served, whole-card tasks served (% of their arrivals), GPU time served
(% of the GPU time offered, an instance counting its compute slices), whole cards left (free,
uncarved cards, % of the pool, mean over arrivals), and the planner's time per call.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from elastic_gpu.core.mig.cardstate import (
    CardState,
    Instance,
    MigDemand,
    PlannerConfig,
    WholeDemand,
)
from elastic_gpu.core.mig.layout import Placement, check_layout, layout_starts
from elastic_gpu.core.mig.pick import free_instances
from elastic_gpu.core.mig.planner import plan
from elastic_gpu.core.mig.profiles import MigModel, compatible, mig_model
from elastic_gpu.core.model import Card, Health, MigInstance
from elastic_gpu.core.resources import MigProfile
from elastic_gpu.sim.trace import Task

#: The synthetic profile requests, by weight, as slices of a 7-slice card (the model's profile
#: of that compute and the smaller memory): small instances most often (inference), a few
#: half and full cards (training).
PROFILE_MIX: tuple[tuple[int, float], ...] = ((1, 0.45), (2, 0.25), (3, 0.2), (4, 0.05),
                                              (7, 0.05))
#: The static layout carved on the MIG share of the cards (a balanced NVIDIA layout), in
#: compute slices, by the card's slices (7; the A30's 4).
STATIC_LAYOUTS: dict[int, tuple[int, ...]] = {7: (3, 2, 1, 1), 4: (2, 1, 1)}


@dataclass(frozen=True)
class MigMixSpec:
    """`--mig-mix nodes=16,gpus=8,model=A100-SXM4-80GB,profiles=0.5,load=1.0,tasks=4000`."""

    nodes: int = 16
    gpus: int = 8
    model: str = "A100-SXM4-80GB"
    #: share of the tasks that are synthetic profile requests (the rest: the trace's)
    profiles: float = 0.5
    #: offered load, x the pool's compute
    load: float = 0.85
    tasks: int = 4000
    mean_hours: float = 1.0
    cooldown_s: float = 300.0

    @classmethod
    def parse(cls, text: str) -> MigMixSpec:
        spec = cls()
        if not text.strip() or text.strip() == "default":
            return spec
        kinds = {"nodes": int, "gpus": int, "model": str, "profiles": float, "load": float,
                 "tasks": int, "mean_hours": float, "cooldown_s": float}
        values: dict[str, object] = {}
        for part in text.split(","):
            key, _, value = part.partition("=")
            key = key.strip().replace("-", "_")
            if key not in kinds or not value.strip():
                raise ValueError(f"--mig-mix {text!r}: {part!r} is not KEY=VALUE with KEY one "
                                 f"of {', '.join(kinds)}")
            try:
                values[key] = kinds[key](value.strip())
            except ValueError:
                raise ValueError(f"--mig-mix {text!r}: {key}={value!r} is not a "
                                 f"{kinds[key].__name__}") from None
        spec = replace(spec, **values)  # type: ignore[arg-type]
        if mig_model(spec.model) is None:
            raise ValueError(f"--mig-mix: model {spec.model!r} is no MIG model we know")
        if spec.nodes < 1 or spec.gpus < 1 or spec.tasks < 1 or not 0 <= spec.profiles <= 1 \
                or spec.load <= 0 or spec.mean_hours <= 0 or spec.cooldown_s < 0:
            raise ValueError(f"--mig-mix {text!r}: nodes, gpus, tasks at least 1; profiles in "
                             "[0, 1]; load and mean_hours above 0; cooldown_s 0 or more")
        return spec


@dataclass(frozen=True)
class MixTask:
    name: str
    arrive: float
    leave: float
    #: None: a whole card
    profile: MigProfile | None


@dataclass
class MixResult:
    mode: str
    mig_tasks: int = 0
    mig_served: int = 0
    whole_tasks: int = 0
    whole_served: int = 0
    whole_left_sum: float = 0.0
    arrivals: int = 0
    planner_calls: int = 0
    planner_seconds: float = 0.0
    cards: int = 0
    changes: int = 0
    merges: int = 0
    #: GPU time offered and served, in card-seconds (an instance counts its compute slices)
    offered: float = 0.0
    served: float = 0.0
    #: checks of every plan applied (both stay 0): layouts NVIDIA's rules refuse, and held
    #: instances (or cards held whole) a plan destroyed
    invalid_layouts: int = 0
    held_destroyed: int = 0

    def summary(self) -> dict[str, float | int | str]:
        return {
            "mode": self.mode,
            "mig_tasks": self.mig_tasks,
            "mig_served_pct": round(100 * self.mig_served / max(1, self.mig_tasks), 1),
            "whole_tasks": self.whole_tasks,
            "whole_served_pct": round(100 * self.whole_served / max(1, self.whole_tasks), 1),
            "whole_cards_left_pct": round(100 * self.whole_left_sum
                                          / max(1, self.arrivals * self.cards), 1),
            "gpu_time_served_pct": round(100 * self.served / max(self.offered, 1e-9), 1),
            "planner_calls": self.planner_calls,
            "planner_ms_per_call": round(1000 * self.planner_seconds
                                         / max(1, self.planner_calls), 3),
            "cards_changed": self.changes,
            "cards_merged": self.merges,
        }


def _profile_of(model: MigModel, slices: int) -> MigProfile:
    """The model's plain profile with at least `slices` of 7 compute slices (scaled to the
    model's: an A30 has 4) and the least memory."""
    want = math.ceil(slices * model.compute_slices / 7)
    rows = [r.profile for r in model.profiles if not r.profile.extra and r.compute_slices >= want]
    return min(rows, key=lambda p: (p.slices, p.memory_gb))


def _share_profile(model: MigModel, task: Task) -> MigProfile:
    """A share of one card as HAMi's `vgpu-mode: mig` serves it: the smallest profile with
    its compute (and, through `_profile_of`, the least memory of that compute)."""
    return _profile_of(model, max(1, math.ceil(task.gpu_milli * 7 / 1000)))


def mix_tasks(spec: MigMixSpec, trace: Sequence[Task], seed: int) -> list[MixTask]:
    """The mix's tasks (see the module's docstring), deterministic for a seed."""
    model = mig_model(spec.model)
    assert model is not None
    rng = np.random.default_rng(seed)
    single = [t for t in trace if t.num_gpu == 1 and t.gpu_milli > 0]
    weights = np.array([w for _, w in PROFILE_MIX])
    drawn: list[tuple[str, MigProfile | None]] = []
    for k in range(spec.tasks):
        if not single or rng.random() < spec.profiles:
            slices = PROFILE_MIX[int(rng.choice(len(PROFILE_MIX), p=weights / weights.sum()))][0]
            drawn.append((f"mig-{k}", _profile_of(model, slices)))
        else:
            task = single[int(rng.integers(len(single)))]
            drawn.append((f"{task.name}#{k}", None if task.gpu_milli >= 1000
                          else _share_profile(model, task)))
    mean_s = spec.mean_hours * 3600
    cards = spec.nodes * spec.gpus
    asked = [(p.slices / model.compute_slices) if p is not None else 1.0 for _, p in drawn]
    # Little's law: load x cards = rate x mean duration x mean size
    rate = spec.load * cards / (mean_s * float(np.mean(asked)))
    now, out = 0.0, []
    for (name, profile), gap, life in zip(drawn, rng.exponential(1 / rate, len(drawn)),
                                          rng.exponential(mean_s, len(drawn)), strict=True):
        now += float(gap)
        out.append(MixTask(name, now, now + float(life), profile))
    return out


@dataclass
class _Pool:
    """The pool's cards while a mix runs (internal)."""

    model: MigModel
    cards: list[CardState]
    next_id: int = 0

    def card_index(self, uuid: str) -> int:
        return next(k for k, c in enumerate(self.cards) if c.uuid == uuid)

    def set_held(self, k: int, uuid: str, held: bool) -> None:
        c = self.cards[k]
        self.cards[k] = replace(c, instances=tuple(
            replace(i, held=held) if i.uuid == uuid else i for i in c.instances))


def _pool(spec: MigMixSpec, static: bool, mig_share: float) -> _Pool:
    """The pool: every card whole, or (static) `mig_share` of them, spread evenly, carved in
    `STATIC_LAYOUTS`."""
    model = mig_model(spec.model)
    assert model is not None
    layout = [min((r.profile for r in model.profiles
                   if not r.profile.extra and r.compute_slices == slices),
                  key=lambda p: p.memory_gb)
              for slices in STATIC_LAYOUTS[model.compute_slices]]
    starts = layout_starts(model.name, layout)
    total = spec.nodes * spec.gpus
    count = min(total, round(total * mig_share)) if static else 0
    carved = {int(j * total / count) for j in range(count)} if count else set()
    cards = []
    for k in range(total):
        node, uuid = f"mig-node-{k // spec.gpus:03d}", f"GPU-{k:04d}"
        instances = tuple(Instance(Placement(p, s), f"MIG-{uuid}-{j}")
                          for j, (p, s) in enumerate(zip(layout, starts, strict=True))
                          ) if k in carved else ()
        cards.append(CardState(node, uuid, model.name, instances, opted_in=not static))
    return _Pool(model, cards)


def _as_card(model: MigModel, k: int, c: CardState) -> Card:
    """A pool card as `core.mig.pick` reads it (its index: the card's place in the pool)."""
    return Card(k, c.uuid, c.model, model.memory_gb * 1024,
                health=Health.HEALTHY if c.healthy else Health.UNHEALTHY,
                mig=tuple(MigInstance(i.placement.profile, i.uuid, i.placement.start)
                          for i in c.instances))


def _place_mig(pool: _Pool, task: MixTask) -> str | None:
    """The instance a MIG task takes: its profile free, else the smallest compatible one (the
    MIG adapter's substitution); of one profile, the instance `core.mig.pick` takes (the
    engine's and the DRA allocator's rule), over the whole pool: partly held cards first (for
    one instance, the engine's node preference), then the fullest card; the card's place in
    the pool (node, then card) stands in for the node policy."""
    assert task.profile is not None
    carved = [(k, c) for k, c in enumerate(pool.cards) if c.free]
    if not carved:
        return None
    model = pool.model.name
    free = {i.placement.profile for _, c in carved for i in c.free}
    profiles = sorted((p for p in free if p == task.profile
                       or compatible(task.profile, p, model)),
                      key=lambda p: (p != task.profile, p.slices, p.memory_gb, p.name))
    if not profiles:
        return None
    cards = [_as_card(pool.model, k, c) for k, c in carved]
    held = {i.uuid for _, c in carved for i in c.held}
    found = free_instances(cards, profiles[0], held)
    if not found:
        return None
    card, inst = found[0]
    pool.set_held(card.index, inst.uuid, True)
    return inst.uuid


def _place_whole(pool: _Pool) -> str | None:
    """The whole card a whole-card task takes: the first free uncarved one."""
    for k, c in enumerate(pool.cards):
        if not c.carved and not c.held_whole and c.healthy:
            pool.cards[k] = replace(c, held_whole=True)
            return c.uuid
    return None


def _apply(pool: _Pool, result: MixResult, demand: list[MigDemand], whole: list[WholeDemand],
           now: float, config: PlannerConfig) -> None:
    start = time.perf_counter()
    decided = plan(demand, pool.cards, whole, now=now, config=config)
    result.planner_seconds += time.perf_counter() - start
    result.planner_calls += 1
    for change in decided.cards:
        k = pool.card_index(change.card)
        c = pool.cards[k]
        gone = {i.uuid for i in change.destroy}
        result.held_destroyed += sum(1 for i in c.instances if i.held and i.uuid in gone) + \
            c.held_whole
        kept = [i for i in c.instances if i.uuid not in gone]
        made = []
        for placement in change.create:
            pool.next_id += 1
            made.append(Instance(placement, f"MIG-{c.uuid}-n{pool.next_id}"))
        pool.cards[k] = replace(c, instances=(*kept, *made), changed_at=now)
        result.invalid_layouts += check_layout(
            pool.model, [i.placement for i in pool.cards[k].instances]) is not None
        result.changes += 1
        result.merges += change.merge


def run_mix(spec: MigMixSpec, tasks: Sequence[MixTask], dynamic: bool) -> MixResult:
    """One run of the mix's tasks on the pool, static layouts or the planner's."""
    model = mig_model(spec.model)
    assert model is not None
    mig_compute = sum(t.profile.slices / model.compute_slices * (t.leave - t.arrive)
                      for t in tasks if t.profile is not None)
    all_compute = sum((t.profile.slices / model.compute_slices if t.profile else 1.0)
                      * (t.leave - t.arrive) for t in tasks)
    pool = _pool(spec, static=not dynamic, mig_share=mig_compute / max(all_compute, 1e-9))
    result = MixResult("dynamic" if dynamic else "static", cards=len(pool.cards))
    config = PlannerConfig(merge_cooldown_s=spec.cooldown_s)
    leaving: list[tuple[float, str]] = []
    held_by: dict[str, str] = {}  # task -> instance or card uuid
    for task in tasks:
        while leaving and leaving[0][0] <= task.arrive:
            at, name = heapq.heappop(leaving)
            uuid = held_by.pop(name)
            for k, c in enumerate(pool.cards):
                if c.uuid == uuid:
                    pool.cards[k] = replace(c, held_whole=False, changed_at=at)
                elif any(i.uuid == uuid for i in c.instances):
                    pool.set_held(k, uuid, False)
                    pool.cards[k] = replace(pool.cards[k], changed_at=at)
        result.arrivals += 1
        result.whole_left_sum += sum(1 for c in pool.cards if not c.carved and not c.held_whole)
        if task.profile is not None:
            result.mig_tasks += 1
            held = _place_mig(pool, task)
            if held is None and dynamic:
                _apply(pool, result, [MigDemand(task.name, task.profile)], [], task.arrive,
                       config)
                held = _place_mig(pool, task)
            result.mig_served += held is not None
        else:
            result.whole_tasks += 1
            held = _place_whole(pool)
            if held is None and dynamic:
                _apply(pool, result, [], [WholeDemand(task.name)], task.arrive, config)
                held = _place_whole(pool)
            result.whole_served += held is not None
        size = task.profile.slices / model.compute_slices if task.profile else 1.0
        result.offered += size * (task.leave - task.arrive)
        if held is not None:
            result.served += size * (task.leave - task.arrive)
            held_by[task.name] = held
            heapq.heappush(leaving, (task.leave, task.name))
    return result


def compare_mix(spec: MigMixSpec, trace: Sequence[Task], seed: int) -> list[MixResult]:
    """Static, then dynamic, on the same tasks."""
    tasks = mix_tasks(spec, trace, seed)
    return [run_mix(spec, tasks, dynamic=False), run_mix(spec, tasks, dynamic=True)]
