"""Card models and their TFLOPS: how a request in TFLOPS becomes a compute share of a card.

A pod or claim may ask `elasticgpu.io/gpu-tflops: N` instead of a percent of a card. The share
it gets depends on the card: on a card of T TFLOPS it is ceil(N / T * 1000) milli-cards, so a
request means the same throughput on every model it may land on, and placement computes it per
candidate card (`share_milli`).

Precision: every figure is the card's **dense FP16 Tensor Core** peak (BF16 is the same on
these cards), in TFLOPS, **without structured sparsity**, rounded down to a whole number, as
NVIDIA's data sheets give it. Why this one: it is the figure the training and inference work
that shares GPUs runs at, the one a model's FLOP count is budgeted against, and every card of
the table has it (FP32 would understate tensor-core cards by 4-16x and rank them unlike the
work does). Where a data sheet gives only the sparse figure, the dense one is half of it.
Cards without tensor cores (P100 and older) have no such figure and are not in the table; the
Alibaba trace's anonymised models (G2, G3) neither. A model name that says no form factor
(e.g. plain `V100`, `H100`) gets its lower figure (PCIe): a request is never promised more than
the card may have.

Sources (NVIDIA data sheets): T4 (65, "mixed precision FP16/FP32"); V100 (SXM2 125, PCIe 112,
V100S 130, "Tensor Performance"); A10 (125 | 250 sparse); A30 (165 | 330); A100 (312 | 624);
H100 (SXM 989, PCIe 756, NVL 835, from 1,979 / 1,513 / 1,671 sparse); H200 (SXM 989, NVL 835);
L4 (121, from 242 sparse); L40 (181 | 362); L40S (362 | 733).

A model missing from the table cannot take a TFLOPS request (placement says so, as a structured
fit failure); a request above one card's TFLOPS does not fit that model (a TFLOPS request is a
share of one card, never several: ask whole cards for more).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from elastic_gpu.core.resources import MILLI_PER_CARD

#: What every figure of the table is (shown in docs and refusals).
PRECISION = "dense FP16 Tensor Core TFLOPS (no sparsity)"

#: Canonical model -> TFLOPS at `PRECISION`.
TFLOPS_TABLE: Mapping[str, int] = {
    "T4": 65,
    "V100-PCIE": 112,
    "V100-SXM2": 125,
    "V100S": 130,
    "A10": 125,
    "A30": 165,
    "A100": 312,
    "H100-PCIE": 756,
    "H100-NVL": 835,
    "H100-SXM": 989,
    "H200-NVL": 835,
    "H200": 989,
    "L4": 121,
    "L40": 181,
    "L40S": 362,
}

#: How a card's model as a node or NVML names it (`NVIDIA A100-SXM4-80GB`, `Tesla T4`,
#: `NVIDIA H100 80GB HBM3`, the trace's `V100M16`) maps to a row: the first pattern that
#: matches the upper-cased name with spaces and underscores read as '-'. Word edges keep
#: A10 from matching A100 and L40 from matching L40S.
_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(p), row) for p, row in (
        (r"(^|-)T4($|-)", "T4"),
        (r"(^|-)V100S($|-)", "V100S"),
        (r"(^|-)V100-SXM", "V100-SXM2"),
        (r"(^|-)V100", "V100-PCIE"),
        (r"(^|-)A100($|-)", "A100"),
        (r"(^|-)A10($|-)", "A10"),
        (r"(^|-)A30($|-)", "A30"),
        (r"(^|-)H100-(.*-)?NVL|(^|-)H100-NVL", "H100-NVL"),
        (r"(^|-)H100-(.*-)?(SXM|HBM3)", "H100-SXM"),
        (r"(^|-)H100($|-)", "H100-PCIE"),
        (r"(^|-)H200-(.*-)?NVL", "H200-NVL"),
        (r"(^|-)H200($|-)", "H200"),
        (r"(^|-)L40S($|-)", "L40S"),
        (r"(^|-)L40($|-)", "L40"),
        (r"(^|-)L4($|-)", "L4"),
    ))


#: Other vendors' cards whose names contain an NVIDIA model's (Iluvatar's BI-V100 and MR-V100
#: are not V100s): never read as a row.
_OTHER_VENDORS = re.compile(r"^(BI|MR)-")


def table_row(model: str) -> str | None:
    """The table's row for a card model as nodes name it; None for a model it does not know."""
    if model in TFLOPS_TABLE:
        return model
    text = model.upper().replace("_", "-").replace(" ", "-")
    if _OTHER_VENDORS.match(text):
        return None
    for pattern, row in _PATTERNS:
        if pattern.search(text):
            return row
    return None


def card_tflops(model: str) -> int | None:
    """The model's TFLOPS at `PRECISION`; None for a model the table does not know."""
    row = table_row(model)
    return TFLOPS_TABLE[row] if row is not None else None


def advertised_tflops(model: str, compute_milli: int = MILLI_PER_CARD) -> int:
    """What a card advertises of a TFLOPS resource (the agent's device plugin: one device per
    TFLOPS): its model's TFLOPS for the compute it has (a whole card: all of them), 0 for a
    model the table does not know, which therefore cannot take a TFLOPS request on a real
    node either (kubelet admits only what the node advertises)."""
    have = card_tflops(model)
    return 0 if have is None else have * compute_milli // MILLI_PER_CARD


def share_milli(model: str, tflops: int) -> int | None:
    """The compute share (milli-cards) that gives `tflops` on a card of `model`:
    ceil(tflops / card's TFLOPS * 1000), never below 1; None when the model is not in the
    table or the request is more than the whole card (it does not fit this model)."""
    have = card_tflops(model)
    if have is None or tflops > have:
        return None
    return max(1, -(-tflops * MILLI_PER_CARD // have))


def short_share(model: str, tflops: int, milli: int) -> str | None:
    """Why a share of `milli` on a card of `model` does not give `tflops` (None: it does):
    what the node checks before it hands out a card for a TFLOPS request, so a container is
    never given less than it asked whatever the assignment says."""
    need = share_milli(model, tflops)
    if need is None:
        have = card_tflops(model)
        if have is None:
            return f"model {model!r} is not in the TFLOPS table"
        return f"{tflops} TFLOPS is more than a {model} card's {have}"
    if milli < need:
        return (f"{milli} milli of a {model} card is {card_tflops(model)} x {milli} / 1000 "
                f"TFLOPS, less than the {tflops} asked (needs {need} milli)")
    return None


def most_milli(tflops: int) -> int:
    """The largest share `tflops` can become on any model of the table (the weakest card that
    can take it): what accounting charges before the card is known, so that it never counts
    less than the pod will hold. A whole card when no model can take it."""
    shares = [m for model in TFLOPS_TABLE if (m := share_milli(model, tflops)) is not None]
    return max(shares, default=MILLI_PER_CARD)
