"""The one table of GPU resource names and units.

Every GPU resource name that a user may write, ours and the earlier systems', is a row in
`RESOURCE_TABLE` saying what it measures and in what unit. Everything else in the product
(admission, scheduler, agent, simulator) converts through `to_amount`, so a new alias is one
new row here and nowhere else.

Internal units:
- compute in *milli-cards* (1000 = one whole card; 1% = 10 milli), the unit of the Alibaba
  trace's `gpu_milli`, fine enough for both 1% shares and the trace's values;
- memory in MiB;
- whole cards and MIG instances as counts;
- TFLOPS as asked: the share it becomes depends on the card (`core.tflops`).
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from elastic_gpu.core.quantity import QuantityError, parse_quantity

MILLI_PER_CARD = 1000
MILLI_PER_PERCENT = 10
#: The percent unit of one card, in which users write shares (`gpu-core: 30`) and the quota's,
#: the node-level count's and the DRA devices' compute are counted.
PERCENT_PER_CARD = MILLI_PER_CARD // MILLI_PER_PERCENT

#: The project's own resource names, also advertised as node capacity by the agent.
GPU_CORE = "elasticgpu.io/gpu-core"  # percent of one card; >100 only as a multiple of 100
GPU_MEMORY = "elasticgpu.io/gpu-memory"  # MiB of card memory
GPU_WHOLE = "elasticgpu.io/gpu"  # whole cards
GPU_TFLOPS = "elasticgpu.io/gpu-tflops"  # TFLOPS of one card (`core.tflops`)

_BINARY_SUFFIX = re.compile(r"[KMGTPE]i\s*$")
#: How a GPU resource value may be written: ASCII digits and at most a decimal suffix or a
#: positive exponent, the forms the apiserver itself writes for whole numbers ("90k", "1e3").
_PLAIN_COUNT = re.compile(r"[0-9]+(?:[kMGTPE]|[eE][0-9]+)?", re.ASCII)
#: The largest value a GPU resource may have, in its own unit: far above any real request, and
#: exact as a JSON (float64) number.
MAX_RESOURCE_VALUE = 2**53

#: Every name under this prefix is a MIG resource: one that is not a valid profile is an error,
#: never "not a GPU resource" (a pod asking for it would fit everywhere).
MIG_PREFIX = "nvidia.com/mig-"
#: NVIDIA's published profiles use 1, 2, 3, 4 or 7 of at most 7 compute slices (A30: 4), hence
#: the pattern's 1-7; how many a card has is its model's (`core.mig.profiles.card_slices`).
MIG_RESOURCE_PATTERN = re.compile(
    r"nvidia\.com/mig-(?P<g>[1-7])g\.(?P<mem>[1-9][0-9]{0,3})gb(?P<extra>\+me|\+me\.all|\+gfx)?\Z",
    re.ASCII)
MIG_RULE = ("a MIG profile is written <slices>g.<memory>gb with 1-7 compute slices, 1-9999 GB "
            "of memory (no leading zero) and optionally +me, +me.all or +gfx, e.g. 3g.40gb or "
            "1g.10gb+me")


class Measure(enum.Enum):
    """What a resource measures."""

    COMPUTE = "compute"  # a share of a card's compute, possibly several whole cards
    MEMORY = "memory"  # card memory
    CARDS = "cards"  # whole cards, exclusively
    MIG = "mig"  # MIG instances of one profile
    #: throughput of one card in TFLOPS (`core.tflops.PRECISION`): a compute share whose
    #: size in milli-cards depends on the card's model, so it is computed per candidate card
    TFLOPS = "tflops"


class Rule(enum.Enum):
    """How a value must look to be valid; the text is what the user is told."""

    PERCENT_SHARE_OR_WHOLE = "an integer 1-99 (a share of one card) or a multiple of 100 (whole cards)"
    NON_NEGATIVE_INT = "a non-negative whole number"
    POSITIVE_INT = "a positive whole number"


@dataclass(frozen=True)
class ResourceSpec:
    """One row of the table."""

    name: str
    measure: Measure
    #: How many internal units (milli-cards, MiB, cards, instances) one user unit is.
    scale: int
    rule: Rule
    #: The earlier system whose users write this name.
    origin: str
    doc: str


RESOURCE_TABLE: tuple[ResourceSpec, ...] = (
    ResourceSpec(GPU_CORE, Measure.COMPUTE, MILLI_PER_PERCENT, Rule.PERCENT_SHARE_OR_WHOLE,
                 "elastic-gpu", "percent of one card's compute"),
    ResourceSpec(GPU_MEMORY, Measure.MEMORY, 1, Rule.NON_NEGATIVE_INT,
                 "elastic-gpu", "MiB of card memory (per card)"),
    ResourceSpec(GPU_WHOLE, Measure.CARDS, 1, Rule.POSITIVE_INT,
                 "elastic-gpu", "whole cards"),
    ResourceSpec(GPU_TFLOPS, Measure.TFLOPS, 1, Rule.POSITIVE_INT, "elastic-gpu",
                 "TFLOPS (dense FP16 tensor) of one card, a share sized per card model"),
    ResourceSpec("gpushare.provisioner.elasticgpu.io/gpu-core", Measure.COMPUTE, MILLI_PER_PERCENT,
                 Rule.PERCENT_SHARE_OR_WHOLE, "elastic-gpu claims", "percent of one card's compute"),
    ResourceSpec("gpushare.provisioner.elasticgpu.io/gpu-memory", Measure.MEMORY, 1,
                 Rule.NON_NEGATIVE_INT, "elastic-gpu claims", "MiB of card memory (per card)"),
    ResourceSpec("tencent.com/vcuda-core", Measure.COMPUTE, MILLI_PER_PERCENT,
                 Rule.PERCENT_SHARE_OR_WHOLE, "gpu-manager", "percent of one card's compute"),
    ResourceSpec("tencent.com/vcuda-memory", Measure.MEMORY, 256, Rule.NON_NEGATIVE_INT,
                 "gpu-manager", "units of 256 MiB of card memory (per card)"),
    ResourceSpec("nano-gpu/gpu-percent", Measure.COMPUTE, MILLI_PER_PERCENT,
                 Rule.PERCENT_SHARE_OR_WHOLE, "nano-gpu", "percent of one card's compute"),
    ResourceSpec("nvidia.com/gpu", Measure.CARDS, 1, Rule.POSITIVE_INT,
                 "nvidia device plugin", "whole cards"),
    ResourceSpec("iluvatar.com/gpu", Measure.CARDS, 1, Rule.POSITIVE_INT,
                 "ix device plugin", "whole cards (or chips of a split board)"),
)

_BY_NAME: dict[str, ResourceSpec] = {spec.name: spec for spec in RESOURCE_TABLE}


@dataclass(frozen=True)
class MigProfile:
    """A MIG profile such as `3g.40gb`: `slices` compute slices and `memory_gb` of memory."""

    slices: int
    memory_gb: int
    extra: str = ""  # e.g. "+me" (media extensions): a distinct profile, kept verbatim

    @property
    def name(self) -> str:
        return f"{self.slices}g.{self.memory_gb}gb{self.extra}"

    @property
    def resource_name(self) -> str:
        return f"nvidia.com/mig-{self.name}"

    @classmethod
    def parse(cls, text: str) -> MigProfile:
        """Parse `3g.40gb` or `nvidia.com/mig-3g.40gb`, strictly (`MIG_RULE`)."""
        if not isinstance(text, str):
            raise ResourceError(short_repr(text), "", MIG_RULE)
        name = text if text.startswith(MIG_PREFIX) else f"{MIG_PREFIX}{text}"
        match = MIG_RESOURCE_PATTERN.match(name) if len(name) <= 64 else None
        if match is None:
            raise ResourceError(text if len(text) <= 80 else short_repr(text), "", MIG_RULE)
        return cls(int(match["g"]), int(match["mem"]), match["extra"] or "")


class ResourceError(ValueError):
    """A GPU resource value that breaks its rule; the message names resource, value and rule."""

    def __init__(self, resource: str, value: object, rule: str, *,
                 show_value: bool | None = None) -> None:
        """`value` "" means none (a rule about names), unless `show_value` says otherwise."""
        self.resource = resource
        self.value = value
        self.rule = rule
        show = value != "" if show_value is None else show_value
        shown = f"={short_repr(value)}" if show else ""
        super().__init__(f"{resource}{shown}: {rule}")


def short_repr(value: object, limit: int = 80) -> str:
    """`repr(value)`, cut short: a 400-digit number is not echoed back whole."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:60]}... ({len(text)} characters)"


def lookup(name: str) -> ResourceSpec | None:
    """The table row for a resource name, or a synthesized MIG row, or None if not a GPU name.

    Raises `ResourceError` for a name under `nvidia.com/mig-` that is not a valid MIG profile
    (`mig-0g.0gb`, `mig-abc.defgb`): it names a GPU, just wrongly."""
    spec = _BY_NAME.get(name)
    if spec is not None:
        return spec
    if name.startswith(MIG_PREFIX):
        MigProfile.parse(name)  # raises with the rule
        return ResourceSpec(name, Measure.MIG, 1, Rule.POSITIVE_INT, "nvidia mig", "MIG instances")
    return None


def is_gpu_resource(name: str) -> bool:
    """Whether `name` is a GPU resource this product reads (malformed MIG names are not)."""
    try:
        return lookup(name) is not None
    except ResourceError:
        return False


@dataclass(frozen=True)
class Amount:
    """One resource value converted to internal units."""

    spec: ResourceSpec
    #: compute: total milli (e.g. 2000 for two whole cards); memory: MiB; cards/MIG: count.
    value: int

    @property
    def whole_cards(self) -> int:
        """For compute amounts of 100% or more: how many whole cards (0 for a share)."""
        if self.spec.measure is Measure.COMPUTE and self.value >= MILLI_PER_CARD:
            return self.value // MILLI_PER_CARD
        return 0


def to_amount(name: str, raw: str | int | float) -> Amount:
    """Convert one `name: value` from a pod spec into internal units, enforcing its rule.

    Strict, whatever the rule: a string is ASCII digits with at most a decimal suffix (k, M, G,
    T, P, E) or a positive exponent, the forms the apiserver writes for whole numbers; no sign,
    fraction, byte suffix or space. A JSON number is an integer (or a float with an integral
    value, e.g. 2.0); booleans are refused. Every value is at most `MAX_RESOURCE_VALUE`."""
    spec = lookup(name)
    if spec is None:
        raise ResourceError(name, raw, "not a GPU resource known to Elastic GPU")
    if isinstance(raw, bool):
        raise ResourceError(name, raw, f"{spec.rule.value}; a boolean is not a number",
                            show_value=True)
    if isinstance(raw, str) and len(raw) <= 15 and raw.isascii() and raw.isdigit():
        # the usual form ("30", "4096"): what the rule below reads it as, without the regexes
        # and the exact (Fraction) parse; 15 digits stay below MAX_RESOURCE_VALUE (2**53)
        number = int(raw)
        _check_rule(spec, raw, number)
        return Amount(spec, number * spec.scale)
    if isinstance(raw, str):
        if _BINARY_SUFFIX.search(raw):
            # Extended resources are counts in their own unit: "4Gi" of a MiB resource would be
            # read by kube-scheduler as 4294967296 MiB, so a byte suffix is refused, never
            # converted. Decimal forms stay valid: the apiserver itself rewrites 90000 as "90k".
            raise ResourceError(name, raw, f"{spec.rule.value}, counted in {spec.doc}, without "
                                "a byte suffix (e.g. 4096, not 4Gi)")
        if len(raw) > 64 or not _PLAIN_COUNT.fullmatch(raw):
            raise ResourceError(name, raw, f"{spec.rule.value}, written with the digits 0-9 "
                                "and at most a suffix k, M, G, T, P, E or an exponent such as "
                                "e3 (no sign, fraction or spaces)", show_value=True)
    elif not isinstance(raw, (int, float)):
        raise ResourceError(name, raw, f"{spec.rule.value}; a number or a quantity string, not "
                            f"{type(raw).__name__}", show_value=True)
    try:
        quantity = parse_quantity(raw)
    except QuantityError as err:
        raise ResourceError(name, raw, f"{spec.rule.value} ({err})") from None
    if quantity.denominator != 1:
        raise ResourceError(name, raw, spec.rule.value)
    number = quantity.numerator
    if number > MAX_RESOURCE_VALUE:
        raise ResourceError(name, raw, f"{spec.rule.value}, at most {MAX_RESOURCE_VALUE}")
    _check_rule(spec, raw, number)
    return Amount(spec, number * spec.scale)


def _check_rule(spec: ResourceSpec, raw: object, number: int) -> None:
    if spec.rule is Rule.PERCENT_SHARE_OR_WHOLE:
        if number <= 0 or (number >= 100 and number % 100 != 0):
            raise ResourceError(spec.name, raw, spec.rule.value)
    elif spec.rule is Rule.POSITIVE_INT:
        if number <= 0:
            raise ResourceError(spec.name, raw, spec.rule.value)
    elif number < 0:
        raise ResourceError(spec.name, raw, spec.rule.value)
