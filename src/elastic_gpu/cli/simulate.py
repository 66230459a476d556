"""`egpu simulate`: replay a GPU trace through the placement engine (see docs/simulator.md)."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from elastic_gpu.core.policies import DEFAULT_NODE_POLICY

DEFAULT_POLICIES = "random,dotprod,clustering,packing,bestfit,fgd,fgdx,fgdx-mem,fgdx-auto"


def simulate(
    nodes: Annotated[Path | None, typer.Option(
        "--nodes", help="Node list CSV (Alibaba trace format).")] = None,
    pods: Annotated[list[Path] | None, typer.Option(
        "--pods", help="Pod list CSV; with --compare it may be given several times.")] = None,
    policy: Annotated[str, typer.Option(
        help="Node policy; default: the extender's default too.")] = DEFAULT_NODE_POLICY,
    card_policy: Annotated[str, typer.Option(
        help="Card policy; auto: the one the node policy is paired with, which the extender "
             "also uses when cardPolicy is not set: the FGD artifact's pairing (random->random; "
             "fgd and fgdx-cpufit->fgd; others->binpack) and ours (fgdx, fgdx-mem, fgdx-auto->fgd-waste).")
    ] = "auto",
    seed: Annotated[int, typer.Option(help="Shuffle/resample/tie-break seed.")] = 42,
    inflation: Annotated[float, typer.Option(help="Resample the GPU request up to this x capacity.")] = 1.3,
    json_path: Annotated[Path | None, typer.Option("--json", help="Write the summary as JSON here.")] = None,
    placements: Annotated[Path | None, typer.Option(help="Write task,node,cards CSV here.")] = None,
    plot: Annotated[Path | None, typer.Option(help="Write a PNG of allocation and fragmentation.")] = None,
    compare: Annotated[bool, typer.Option("--compare", help="Run policies x seeds x workloads.")] = False,
    policies: Annotated[str, typer.Option(
        help="--compare: comma-separated node policies.")] = DEFAULT_POLICIES,
    seeds: Annotated[str, typer.Option(help="--compare: seeds, e.g. 42-51.")] = "42-51",
    reference_dir: Annotated[Path | None, typer.Option(
        help="--compare: FGD reference results (analysis_allo_discrete.csv) to show beside ours.")] = None,
    processes: Annotated[int, typer.Option(help="--compare: worker processes.")] = 2,
    popularity: Annotated[float | None, typer.Option(
        help="Share of the tasks (0-1] that FGD's typical pods, the target workload the FGD "
             "family scores against, must cover; default: the policy's (0.95 as in the FGD "
             "paper; fgdx-mem 1.0, every shape; fgdx-auto 1.0, or 0.95 from 22.5% CPU-only tasks "
             "and, when the tasks ask more CPU per GPU than the nodes have, once shares of one "
             "card ask half the GPU asked).")
    ] = None,
    multi_share_fraction: Annotated[float, typer.Option(
        help="Share (0-1) of the one-card share tasks that ask their share on "
             "--multi-share-cards distinct cards instead (a multi-card share; the public traces "
             "have none). The same tasks for every seed.")] = 0.0,
    multi_share_cards: Annotated[int, typer.Option(
        help="Cards of each injected multi-card share (2 or more).")] = 2,
    defrag_moves: Annotated[str, typer.Option(
        help="Defragmentation: when a GPU task fails to place, the planner may move up to K "
             "placed GPU tasks to make room (0: off). With --compare a comma-separated list "
             "sweeps several budgets, e.g. 0,1,2,4.")] = "0",
    mig_mix: Annotated[str | None, typer.Option(
        "--mig-mix", help="Also replay MIG demand on a pool of MIG-capable nodes, static layouts "
             "against the dynamic-MIG planner (docs/simulator.md, 'MIG demand'): 'default' or "
             "KEY=VALUE,... of nodes, gpus, model, profiles, load, tasks, mean_hours, "
             "cooldown_s.")] = None,
) -> None:
    """Replay a GPU trace (or the built-in cluster and workload) through the placement engine."""
    from elastic_gpu.sim.trace import TraceError

    if popularity is not None and not 0.0 < popularity <= 1.0:
        raise typer.BadParameter(f"--popularity must be in (0, 1], got {popularity}")
    if (nodes is None) != (not pods):
        raise typer.BadParameter("give --nodes and --pods together, or neither for the built-in trace")
    if not 0.0 <= multi_share_fraction <= 1.0:
        raise typer.BadParameter(f"--multi-share-fraction must be in [0, 1], got "
                                 f"{multi_share_fraction}")
    if multi_share_cards < 2:
        raise typer.BadParameter(f"--multi-share-cards must be 2 or more, got {multi_share_cards}")
    multi = (multi_share_fraction, multi_share_cards)
    budgets = _move_budgets(defrag_moves)
    if compare and mig_mix is not None:
        raise typer.BadParameter("--mig-mix runs with a single replay, not --compare")
    if not compare and len(budgets) > 1:
        raise typer.BadParameter("several --defrag-moves need --compare")
    try:
        if compare:
            _compare(nodes, pods or [], policies, seeds, inflation, card_policy, reference_dir,
                     processes, json_path, popularity, budgets, multi)
        else:
            if pods and len(pods) > 1:
                raise typer.BadParameter("several --pods need --compare")
            _single(nodes, pods[0] if pods else None, policy, card_policy, seed, inflation,
                    json_path, placements, plot, popularity, budgets[0], multi, mig_mix)
    except (TraceError, ValueError) as err:
        typer.echo(f"egpu simulate: {err}", err=True)
        raise typer.Exit(2) from None


def _move_budgets(text: str) -> list[int]:
    """`--defrag-moves`: `2` or `0,1,2,4` -> the budgets, each a whole number 0 or more."""
    budgets: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit():
            raise typer.BadParameter(f"--defrag-moves takes whole numbers 0 or more, got {text!r}")
        budgets.append(int(part))
    return list(dict.fromkeys(budgets))


def _single(nodes_path: Path | None, pods_path: Path | None, policy: str, card_policy: str, seed: int,
            inflation: float, json_path: Path | None, placements_path: Path | None,
            plot_path: Path | None, popularity: float | None = None, defrag_moves: int = 0,
            multi: tuple[float, int] = (0.0, 2), mig_mix: str | None = None) -> None:
    from rich.console import Console
    from rich.progress import Progress

    from elastic_gpu.core.policies import CARD_POLICIES, NODE_POLICIES
    from elastic_gpu.sim.builtin import builtin_nodes, builtin_tasks
    from elastic_gpu.sim.replay import replay
    from elastic_gpu.sim.trace import load_nodes, load_tasks, with_multi_shares

    if policy not in NODE_POLICIES:
        raise ValueError(f"unknown --policy {policy!r}; known: {', '.join(sorted(NODE_POLICIES))}")
    if card_policy != "auto" and card_policy not in CARD_POLICIES:
        raise ValueError(f"unknown --card-policy {card_policy!r}; known: auto, "
                         f"{', '.join(sorted(CARD_POLICIES))}")
    mix_spec = None
    if mig_mix is not None:
        from elastic_gpu.sim.migmix import MigMixSpec

        mix_spec = MigMixSpec.parse(mig_mix)
    if pods_path is None:
        nodes, tasks = builtin_nodes(), builtin_tasks()
    else:
        assert nodes_path is not None
        nodes, tasks = load_nodes(nodes_path), load_tasks(pods_path)
    if multi[0] > 0:
        tasks = with_multi_shares(tasks, *multi)
    console = Console(stderr=True)
    if sys.stderr.isatty():
        with Progress(console=console, transient=True) as bar:
            handle = bar.add_task(f"replaying ({policy})", total=None)
            result = replay(nodes, tasks, policy, seed=seed, inflation=inflation,
                            card_policy=card_policy, keep_placements=placements_path is not None,
                            progress=lambda done, total: bar.update(handle, completed=done, total=total),
                            popularity=popularity, defrag_moves=defrag_moves)
    else:
        result = replay(nodes, tasks, policy, seed=seed, inflation=inflation, card_policy=card_policy,
                        keep_placements=placements_path is not None, popularity=popularity,
                        defrag_moves=defrag_moves)
    summary = result.summary()
    if mix_spec is not None:
        from elastic_gpu.sim.migmix import compare_mix

        summary["mig_mix"] = {"spec": mix_spec.__dict__,
                              "runs": [r.summary() for r in compare_mix(mix_spec, tasks, seed)]}
    if json_path is not None:
        json_path.write_text(json.dumps(summary, indent=2) + "\n")
    if placements_path is not None:
        with placements_path.open("w", newline="") as handle_out:
            writer = csv.writer(handle_out)
            writer.writerow(["task", "node", "cards"])
            for p in result.placements:
                writer.writerow([p.task, p.node, ";".join(f"{i}:{m}" for i, m in p.cards)])
    if plot_path is not None:
        from elastic_gpu.sim.plot import plot_replay

        plot_replay(result, plot_path)
    _print_summary(summary)


def _print_summary(summary: dict[str, object]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{summary['policy']} / {summary['card_policy']}, seed {summary['seed']}, "
                        f"{summary['gpu_capacity']} GPUs, {summary['tasks']} arrivals, "
                        f"{summary['wall_seconds']} s")
    table.add_column("arrived %")
    table.add_column("allocated %")
    table.add_column("unallocated %")
    table.add_column("frag rate %")
    alloc = summary["allocation"]
    unalloc = summary["unallocated"]
    rate = summary["fragmentation_rate"]
    assert isinstance(alloc, dict) and isinstance(unalloc, dict) and isinstance(rate, dict)
    for point in alloc:
        table.add_row(point, f"{alloc[point]:.2f}", f"{unalloc[point]:.2f}", f"{rate.get(point, 0):.2f}")
    Console().print(table)
    Console().print(f"failed (first failing check): {summary['failed']}; "
                    f"up to 100% arrived: {summary['failed_to_100']}")
    mix = summary.get("mig_mix")
    if isinstance(mix, dict):
        _print_mig_mix(mix)
    defrag = summary.get("defrag")
    if isinstance(defrag, dict):
        Console().print(f"defragmentation (at most {defrag['defrag_moves']} moves per failed task): "
                        f"{defrag['moves']} moves ({defrag['moves_pct_of_tasks']}% of tasks), "
                        f"{defrag['rescued']} tasks placed by a plan; up to 100% arrived: "
                        f"{defrag['moves_to_100']} moves, {defrag['rescued_to_100']} placed")


def _print_mig_mix(mix: dict[str, object]) -> None:
    from rich.console import Console
    from rich.table import Table

    spec = mix["spec"]
    runs = mix["runs"]
    assert isinstance(spec, dict) and isinstance(runs, list)
    table = Table(title=f"MIG demand: {spec['nodes']} x {spec['gpus']} {spec['model']}, "
                        f"{spec['tasks']} tasks, load {spec['load']}")
    for column in ("layouts", "MIG tasks served %", "whole-card tasks served %",
                   "GPU time served %", "whole cards left %", "planner ms/call", "cards changed",
                   "merged"):
        table.add_column(column)
    for run in runs:
        table.add_row(str(run["mode"]), str(run["mig_served_pct"]), str(run["whole_served_pct"]),
                      str(run["gpu_time_served_pct"]), str(run["whole_cards_left_pct"]),
                      str(run["planner_ms_per_call"]),
                      str(run["cards_changed"]), str(run["cards_merged"]))
    Console().print(table)


def _compare(nodes_path: Path | None, pods_paths: list[Path], policies: str, seeds: str,
             inflation: float, card_policy: str, reference_dir: Path | None, processes: int,
             json_path: Path | None, popularity: float | None = None,
             budgets: list[int] | None = None, multi: tuple[float, int] = (0.0, 2)) -> None:
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    from elastic_gpu.core.policies import NODE_POLICIES
    from elastic_gpu.sim.compare import (
        Job,
        Outcome,
        load_reference,
        medians,
        move_medians,
        parse_seeds,
        run_jobs,
    )

    names = [p.strip() for p in policies.split(",") if p.strip()]
    unknown = [p for p in names if p not in NODE_POLICIES]
    if unknown:
        raise ValueError(f"unknown policies {', '.join(unknown)}; known: {', '.join(sorted(NODE_POLICIES))}")
    seed_list = parse_seeds(seeds)
    workloads: list[tuple[str, str | None, str | None]] = (
        [(p.stem, str(nodes_path), str(p)) for p in pods_paths] if pods_paths else [("builtin", None, None)])
    budgets = budgets or [0]
    jobs = [Job(w, n, p, pol, s, inflation, card_policy, popularity, defrag_moves=k,
                multi_share_fraction=multi[0], multi_share_cards=multi[1])
            for w, n, p in workloads for pol in names for k in budgets for s in seed_list]
    reference = load_reference(reference_dir) if reference_dir is not None else {}
    console = Console()
    outcomes: list[Outcome]
    with Progress(console=Console(stderr=True), transient=True,
                  disable=not sys.stderr.isatty()) as bar:
        handle = bar.add_task("replays", total=len(jobs))
        outcomes = run_jobs(jobs, processes, done=lambda _o: bar.advance(handle))
    table = Table(title=f"median unallocated GPU % at 100% arrived, seeds {seeds}, {inflation}x")
    table.add_column("workload")
    table.add_column("policy")
    table.add_column("runs", justify="right")
    table.add_column("ours", justify="right")
    if reference:
        table.add_column("reference", justify="right")
        table.add_column("diff", justify="right")
    defrag = any(k > 0 for k in budgets)
    if defrag:
        table.add_column("moves % of tasks (to 100%)", justify="right")
    result = medians(outcomes)
    moves = move_medians(outcomes)
    labels = [Job("", None, None, pol, 0, inflation, card_policy, defrag_moves=k).label
              for pol in names for k in budgets]
    rows = []
    ordered = sorted(result.items(), key=lambda kv: (kv[0][0], labels.index(kv[0][1])))
    for (workload, pol), (median, count) in ordered:
        ref = reference.get((workload, pol))
        # three decimals: per-seed figures have two, so a median of an even count can end in 5
        cells = [workload, pol, str(count), f"{median:.3f}"]
        if reference:
            cells += [f"{ref:.3f}" if ref is not None else "-",
                      f"{median - ref:+.3f}" if ref is not None else "-"]
        moved = moves.get((workload, pol))
        if defrag:
            cells.append(f"{moved[0]:.3f} ({moved[1]:.3f})" if moved is not None else "-")
        table.add_row(*cells)
        row: dict[str, object] = {"workload": workload, "policy": pol, "runs": count,
                                  "median_unallocated_100": median, "reference": ref}
        if moved is not None:
            row["median_moves_pct"], row["median_moves_to_100_pct"] = moved
        rows.append(row)
    console.print(table)
    if json_path is not None:
        json_path.write_text(json.dumps({"medians": rows, "runs": [o.summary for o in outcomes]},
                                        indent=2) + "\n")
