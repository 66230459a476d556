"""`egpu sandbox`: a local cluster with fake GPU nodes (owned by the devcluster part)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated

import typer

from elastic_gpu.cli.options import HELP_MARKUP

app = typer.Typer(help="A local Kubernetes cluster with fake GPU nodes, running the Elastic GPU "
                  "system (--bare: Kubernetes alone).", no_args_is_help=True,
                  rich_markup_mode=HELP_MARKUP)

StateDir = Annotated[
    Path | None,
    typer.Option("--state-dir", help="Where pids, certificates and logs are kept "
                 "[default: ~/.local/state/elastic-gpu/sandbox]"),
]


#: Fake GPU nodes of a plain `egpu sandbox up` (8 cards each, as --gpus-per-node says).
DEFAULT_GPU_NODES = 4


def _state_dir(value: Path | None) -> Path:
    from elastic_gpu.devcluster.sandbox import default_state_dir

    return value if value is not None else default_state_dir()


@app.command()
def up(
    kubeconfig: Annotated[Path | None, typer.Option(
        "--kubeconfig", help="Write the admin kubeconfig here [default: kubeconfig in the "
        "state dir]")] = None,
    gpu_nodes: Annotated[int | None, typer.Option(
        "--gpu-nodes", min=0, help="Number of fake GPU nodes [default: "
        f"{DEFAULT_GPU_NODES} without --nodes-csv or --cluster] (with --nodes-csv: the first N "
        "GPU nodes of the file)")] = None,
    gpus_per_node: Annotated[int, typer.Option("--gpus-per-node", min=1)] = 8,
    gpu_model: Annotated[str, typer.Option("--gpu-model")] = "A100-SXM4-80GB",
    gpu_memory: Annotated[int, typer.Option("--gpu-memory", min=1,
                                            help="MiB of memory per card")] = 81920,
    nodes_csv: Annotated[Path | None, typer.Option(
        "--nodes-csv", exists=True, dir_okay=False,
        help="Alibaba trace node list (sn,cpu_milli,memory_mib,gpu,model); GPU rows only")
    ] = None,
    cluster: Annotated[Path | None, typer.Option(
        "--cluster", exists=True, dir_okay=False,
        help="Cluster file: nodeGroups [{name, count, gpus, model, memoryMiB, chipsPerBoard, "
        "mig, agentConfig, gpuMode, migDynamic}], e.g. MIG A100s beside time-sliced 2-chip IX "
        "boards (docs/sandbox.md)")
    ] = None,
    agent_config: Annotated[Path | None, typer.Option(
        "--agent-config", exists=True, dir_okay=False,
        help="Agent config YAML (docs/agent.md) the GPU nodes of --gpu-nodes / --nodes-csv are "
        "published with, e.g. resources.gpu iluvatar.com/gpu and timeSlicing.replicas 4")
    ] = None,
    scheduler_config: Annotated[Path | None, typer.Option(
        "--scheduler-config", exists=True, dir_okay=False,
        help="KubeSchedulerConfiguration YAML for the sandbox's kube-scheduler instead of the "
        "one calling the sandbox's extender; kubeconfig and leader election are filled in")
    ] = None,
    extender_config: Annotated[Path | None, typer.Option(
        "--extender-config", exists=True, dir_okay=False,
        help="Config YAML of the sandbox's scheduler extender (docs/scheduler.md), e.g. "
        "loadAware: true; checked by the extender's own loader before anything starts "
        "(a bad file: exit 2)")] = None,
    bare: Annotated[bool, typer.Option(
        "--bare", help="Kubernetes alone: no Elastic GPU components (no scheduler "
        "extender; kube-scheduler as it comes)")] = False,
    no_controller_manager: Annotated[bool, typer.Option(
        "--no-controller-manager", help="Leave out kube-controller-manager (then no "
        "Deployment makes pods, nothing is garbage-collected, a deleted namespace stays "
        "Terminating; the ServiceAccount admission plugin is off)")] = False,
    real_nodes: Annotated[int, typer.Option(
        "--real-nodes", min=0, help="Real kubelet nodes (containerd, runc, busybox "
        "containers; root and Debian packages needed, docs/sandbox.md) beside the fake ones, "
        "each with an agent (fake backend, 2 cards); at most 1 per machine")] = 0,
    dra_nodes: Annotated[int, typer.Option(
        "--dra-nodes", min=0, help="The last N of the --gpu-nodes / --nodes-csv nodes serve "
        "their cards through DRA (label elasticgpu.io/gpu-mode: dra, ResourceSlices of the "
        "driver gpu.elasticgpu.io, no GPUDevices; the first one's last 80 GB card carved into "
        "MIG instances); with --cluster, give a node group gpuMode: dra (docs/dra.md)")] = 0,
    extender_replicas: Annotated[int, typer.Option(
        "--extender-replicas", min=1, max=5, help="Scheduler extender replicas: more than 1 "
        "run leader-elected (one serves, the others stand by with warm caches) behind a "
        "forwarder to the leader, the stand-in for the chart's Service (docs/scheduler.md, "
        "\"High availability\")")] = 1,
    state_dir: StateDir = None,
    bin_dir: Annotated[Path | None, typer.Option(
        "--bin-dir", help="Control plane binaries [default: from hack/ensure-k8s.sh]")] = None,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds to wait for each "
                                           "step")] = 120.0,
) -> None:
    """Start the whole system: etcd, kube-apiserver, kube-controller-manager, the Elastic GPU
    scheduler extender (`egpu scheduler`), admission webhook (`egpu webhook`) and controller
    (`egpu controller`), kube-scheduler calling the extender, kwok and allocation-sync (the fake
    nodes' agents); register fake GPU nodes and wait until they are Ready and the extender
    knows them."""
    from elastic_gpu.agent.config import AgentConfig, load_config
    from elastic_gpu.api.config.loader import ConfigError
    from elastic_gpu.devcluster import nodes, sandbox
    from elastic_gpu.devcluster.errors import DevClusterError

    node_config: AgentConfig | None = None
    per_node: dict[str, AgentConfig | None] = {}
    if agent_config is not None:
        if cluster is not None:
            raise typer.BadParameter("--agent-config applies to --gpu-nodes / --nodes-csv; with "
                                     "--cluster, give each node group its agentConfig",
                                     param_hint="--agent-config")
        try:
            node_config = load_config(agent_config)
        except ConfigError as err:
            raise typer.BadParameter(str(err), param_hint="--agent-config") from None
    if cluster is not None:
        if gpu_nodes is not None or nodes_csv is not None:
            raise typer.BadParameter("--cluster describes every node; leave out --gpu-nodes and "
                                     "--nodes-csv", param_hint="--cluster")
        try:
            groups = nodes.load_cluster(cluster)
        except nodes.ClusterSpecError as err:
            raise typer.BadParameter(str(err), param_hint="--cluster") from None
        inventories = []
        for group in groups:
            for inventory in group.inventories():
                inventories.append(inventory)
                per_node[inventory.name] = group.agent_config
    elif nodes_csv is not None:
        try:
            inventories = nodes.read_nodes_csv(nodes_csv, limit=gpu_nodes)
        except (OSError, nodes.NodesCsvError) as err:
            raise typer.BadParameter(str(err), param_hint="--nodes-csv") from None
    else:
        inventories = nodes.uniform_inventories(
            DEFAULT_GPU_NODES if gpu_nodes is None else gpu_nodes, gpus=gpus_per_node,
                                                gpu_model=gpu_model,
                                                gpu_memory_mib=gpu_memory)
    if dra_nodes:
        if cluster is not None:
            raise typer.BadParameter("with --cluster, give a node group gpuMode: dra",
                                     param_hint="--dra-nodes")
        from elastic_gpu.devcluster.dra_nodes import with_dra_nodes

        try:
            inventories = with_dra_nodes(inventories, dra_nodes)
        except ValueError as err:
            raise typer.BadParameter(str(err), param_hint="--dra-nodes") from None
    sched_cfg = None
    if scheduler_config is not None:
        from elastic_gpu.api.config.loader import read_file

        try:
            sched_cfg = read_file(scheduler_config)
        except ConfigError as err:
            raise typer.BadParameter(str(err), param_hint="--scheduler-config") from None
        if not isinstance(sched_cfg, dict) or sched_cfg.get("kind") not in (
                None, "KubeSchedulerConfiguration"):
            raise typer.BadParameter(f"{scheduler_config}: not a KubeSchedulerConfiguration",
                                     param_hint="--scheduler-config")
    if extender_config is not None:
        if bare:
            raise typer.BadParameter("--bare runs no extender", param_hint="--extender-config")
        from elastic_gpu.scheduler.config import load_config as load_extender_config

        try:
            load_extender_config(extender_config)
        except ConfigError as err:
            raise typer.BadParameter(str(err), param_hint="--extender-config") from None
    from elastic_gpu.devcluster import realnode_sandbox

    try:
        why_not = realnode_sandbox.preflight(real_nodes, bin_dir)
    except DevClusterError as err:  # e.g. no binaries: the same error `up` would give
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(1) from None
    if why_not is not None:
        raise typer.BadParameter(why_not, param_hint="--real-nodes")
    from elastic_gpu.devcluster.components import REGISTRY, with_extender_replicas

    registry = with_extender_replicas(REGISTRY, extender_replicas)
    start = time.monotonic()
    try:
        where = _state_dir(state_dir)
        box = sandbox.up(where, kubeconfig if kubeconfig is not None else where / "kubeconfig",
                         inventories, bin_dir=bin_dir,
                         timeout_s=timeout, scheduler_config=sched_cfg,
                         agent_config=node_config,
                         agent_configs={k: v for k, v in per_node.items() if v is not None},
                         controller_manager=not no_controller_manager, bare=bare,
                         real_nodes=real_nodes, registry=registry,
                         extender_config=extender_config)
    except DevClusterError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(1) from None
    real = f" + {real_nodes} real node(s)" if real_nodes else ""
    typer.echo(f"sandbox up in {time.monotonic() - start:.1f} s: {len(inventories)} GPU "
               f"node(s){real} Ready, API server {box.plane.server}")
    for spec in registry:
        url = box.endpoint_of(spec.name)
        if spec.title is not None and url is not None:
            typer.echo(f"  {spec.title} {url}")
    typer.echo(f"  {box.plane.bin_dir / 'kubectl'} --kubeconfig {box.kubeconfig} get nodes")


@app.command()
def status(
    state_dir: StateDir = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print machine-readable JSON")] = False,
) -> None:
    """Show every component (pid, state, endpoint, log) and the nodes' readiness; exit 1
    unless every component runs (its health check answering) and every node is Ready."""
    from elastic_gpu.devcluster import sandbox

    info = sandbox.status(_state_dir(state_dir))
    if as_json:
        typer.echo(json.dumps(info, indent=2))
    elif "components" not in info:
        typer.echo(f"no sandbox (state dir {info['state_dir']})")
    else:
        typer.echo(f"sandbox {'running' if info['running'] else 'NOT fully running'}"
                   f"{' (bare: Kubernetes alone)' if info['bare'] else ''}; API server "
                   f"{info['server']}, kubeconfig {info['kubeconfig']}")
        typer.echo(f"  {'COMPONENT':<24} {'PID':<8} {'STATE':<10} {'ENDPOINT':<24} LOG")
        for name, comp in info["components"].items():
            typer.echo(f"  {name:<24} {comp['pid']:<8} {comp['state']:<10} "
                       f"{comp['endpoint'] or '-':<24} {comp['log']}")
        if "nodes_ready" in info:
            typer.echo(f"  nodes: {info['nodes_ready']} Ready, {info['nodes_registered']} "
                       f"registered, {info['nodes_expected']} expected")
        elif "nodes_error" in info:
            typer.echo(f"  nodes: unknown ({info['nodes_error']})")
        else:
            typer.echo(f"  nodes: unknown (kube-apiserver is not running), "
                       f"{info['nodes_expected']} expected")
        for node in info.get("real_nodes", []):
            typer.echo(f"  real node {node['name']}: Ready {node['ready']}")
            for name, comp in node["components"].items():
                state = "running" if comp["alive"] else "DEAD"
                typer.echo(f"    {name:<22} {comp['pid']:<8} {state:<10} {'-':<24} "
                           f"{comp['log']}")
    if not info["running"]:
        raise typer.Exit(1)


@app.command()
def down(state_dir: StateDir = None) -> None:
    """Stop every sandbox component and remove its state (certificates, etcd data, logs):
    no process, mount or cgroup of it is left (its recorded processes are checked by pid and
    start time, not by probing its ports: another program may have taken a freed one)."""
    from elastic_gpu.devcluster import sandbox
    from elastic_gpu.devcluster.errors import DevClusterError

    try:
        stopped = sandbox.down(_state_dir(state_dir))
    except DevClusterError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"stopped: {', '.join(stopped)}" if stopped else "no sandbox was running")
