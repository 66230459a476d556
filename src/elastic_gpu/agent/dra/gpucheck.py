"""The DRA prepare step of `egpu gpu-check` (`agent.gpucheck`): our DRA node mode's
`prepare_claim` for a synthetic claim (a share of the first whole card: `percent` of its compute,
`memory_mib` of its memory, through the MPS provider) on the real card, its CDI spec written into
a temporary directory (never the runtime's), printed and checked. No kubelet, no API server."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from elastic_gpu.agent.backends.nvml import NvmlBackend
from elastic_gpu.agent.config import parse_config
from elastic_gpu.agent.devices import logical_cards
from elastic_gpu.agent.dra.cdi import cdi_name, write_spec
from elastic_gpu.agent.dra.prepare import ClaimRef, GrantInputs, PrepareError, prepare_claim
from elastic_gpu.agent.gpucheck import DRA, CheckOptions, Host, whole_card
from elastic_gpu.agent.grant import DeviceFiles
from elastic_gpu.core.dra.devices import DRIVER, card_device
from elastic_gpu.core.gpucheck import Outcome, StepResult
from elastic_gpu.core.model import Card


def dra_step(cards: Sequence[Card], backend: NvmlBackend, options: CheckOptions,
         host: Host) -> StepResult:
    card = whole_card(cards)
    if card is None:
        return StepResult(DRA, Outcome.SKIP, "every card is MIG-carved; the check shares a "
                          "whole card")
    node, uid = "gpu-check", "00000000-0000-4000-8000-00000000e9c0"
    device = card_device(card.index)
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": "gpu-check", "namespace": "default", "uid": uid},
             "status": {"allocation": {"devices": {"results": [{
                 "request": "gpu", "driver": DRIVER, "pool": node, "device": device,
                 "consumedCapacity": {"compute": str(options.percent),
                                      "memory": f"{options.memory_mib}Mi"}}]}},
                 "reservedFor": [{"resource": "pods", "name": "gpu-check", "uid": "pod"}]}}
    with tempfile.TemporaryDirectory(prefix="egpu-gpu-check-cdi-") as tmp:
        config = parse_config({"sharing": {"mode": "mps",
                                           "mps": {"pipeDirectory": f"{tmp}/mps"}}})
        files = DeviceFiles({c.uuid: backend.device_nodes(c) for c in cards},
                            backend.control_nodes())
        inputs = GrantInputs(config, backend.visible_devices_env, files,
                             backend.isolation(config.sharing))
        logical = {lc.index: lc for lc in logical_cards(cards, False)}
        try:
            prepared = prepare_claim(claim, ClaimRef("default", "gpu-check", uid), node,
                                     logical, inputs)
        except PrepareError as err:
            return StepResult(DRA, Outcome.FAIL, str(err))
        path = write_spec(Path(tmp), uid, prepared.spec)
        spec = json.loads(path.read_text())
    problems = cdi_problems(spec, cdi_name(uid, device), card, backend, options, host)
    lines = (f"{path.name}:", *json.dumps(spec, indent=2).splitlines())
    if problems:
        return StepResult(DRA, Outcome.FAIL, "; ".join(problems), lines)
    return StepResult(DRA, Outcome.PASS, f"claim prepared on GPU {card.index} ({device}): "
                      "the CDI spec carries the card and the share's MPS limits", lines)


def cdi_problems(spec: Mapping[str, Any], name: str, card: Card, backend: NvmlBackend,
                 options: CheckOptions, host: Host) -> list[str]:
    """What is wrong with the CDI spec written for a share of `card` (empty: nothing)."""
    devices = {d.get("name"): d for d in spec.get("devices") or []}
    if spec.get("kind") != f"{DRIVER}/gpu" or name not in devices:
        return [f"the spec has kind {spec.get('kind')!r} and devices {sorted(devices)}"]
    edits = devices[name].get("containerEdits") or {}
    env = dict(item.split("=", 1) for item in edits.get("env") or [])
    want = {backend.visible_devices_env: card.uuid,
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(options.percent),
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={options.memory_mib}M"}
    problems = [f"{key}={env.get(key)!r}, expected {value!r}"
                for key, value in want.items() if env.get(key) != value]
    nodes = [d.get("hostPath") or d.get("path") for d in edits.get("deviceNodes") or []]
    for wanted in backend.device_nodes(card):
        if wanted not in nodes:
            problems.append(f"device node {wanted} missing")
    problems.extend(f"device node {n} does not exist on this host"
                    for n in (*backend.device_nodes(card), "/dev/nvidiactl")
                    if not host.exists(n))
    return problems
