"""MIG profiles per GPU model: NVIDIA's table, and which profile may stand in for which.

The table is NVIDIA's, as the MIG user guide publishes it ("Supported MIG Profiles",
https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html, and
"Supported GPUs" for the models and their 7 (A30: 4) instances at most): per profile the
compute slices (fraction of SMs), the memory slices (fraction of memory, in eighths; A30 in
quarters), the memory in GB its name gives and how many instances of it one card holds. The
A100-SXM4-80GB and the H100 80 GB carry the same names (1g.10gb ... 7g.80gb) and sizes; the H200
141 GB carries 1g.18gb ... 7g.141gb. The `+me` profiles (media extensions) exist once per card.
The H100-80GB and H200-141GB rows (names and instances per card) were cross-checked against
NVIDIA's own MIG partition editor defaults (NVIDIA/mig-parted,
deployments/systemd/config-default.yaml: `all-1g.10gb` 7, `all-1g.20gb` 4, `all-2g.20gb` 3,
`all-3g.40gb` 2, `all-4g.40gb` 1, `all-7g.80gb` 1 for H100-80GB; `all-1g.18gb` 7,
`all-1g.35gb` 4, `all-2g.35gb` 3, `all-3g.71gb` 2, `all-4g.71gb` 1, `all-7g.141gb` 1 for
H200-141GB; one `+me` each).

`compatible(requested, offered, model)`: may a pod asking `requested` run on an instance of
`offered` carved on a card of `model`? Same model family, at least the compute slices and the
memory asked, a different profile (the same one is no substitution).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property

from elastic_gpu.core.resources import MigProfile


@dataclass(frozen=True)
class ProfileSize:
    """One row of NVIDIA's table: a profile and its size on one card model."""

    profile: MigProfile
    #: compute slices (the profile's `<n>g`; a card has `MigModel.compute_slices`)
    compute_slices: int
    #: memory slices (of `MigModel.memory_slices`)
    memory_slices: int
    #: how many instances of this profile one card holds at most
    max_instances: int
    #: the placement slots an instance may start at (NVML's `GpuInstancePlacement.start`,
    #: `nvidia-smi mig -lgipp`): slots are the card's memory slices, an instance spans
    #: `memory_slices` of them from its start (see `core.mig.layout`)
    starts: tuple[int, ...] = ()

    @property
    def memory_gb(self) -> int:
        return self.profile.memory_gb


@dataclass(frozen=True)
class MigModel:
    """A MIG-capable card model and its profiles."""

    name: str
    #: the product family: substitution never crosses it (A100 40 GB and 80 GB are one family)
    family: str
    memory_gb: int
    compute_slices: int
    memory_slices: int
    profiles: tuple[ProfileSize, ...]

    def size(self, profile: MigProfile) -> ProfileSize | None:
        return self._sizes.get(profile)

    @cached_property
    def _sizes(self) -> dict[MigProfile, ProfileSize]:
        return {p.profile: p for p in self.profiles}

    @property
    def slots(self) -> int:
        """The placement slots of one card (its memory slices: 8, the A30 4)."""
        return self.memory_slices


def _rows(*rows: tuple[str, int, int, tuple[int, ...]]) -> tuple[ProfileSize, ...]:
    out = []
    for name, memory_slices, max_instances, starts in rows:
        profile = MigProfile.parse(name)
        out.append(ProfileSize(profile, profile.slices, memory_slices, max_instances, starts))
    return tuple(out)


#: NVIDIA's placements on the 7-slice cards (8 placement slots, one per memory slice; the MIG
#: user guide's "A100 MIG profiles" / "H100 MIG profiles" figures, `nvidia-smi mig -lgipp`):
#: one-slot profiles start at 0..6 (slot 7 has memory, no compute), two-slot `1g` at 0, 2, 4, 6,
#: `2g` at 0, 2, 4, `3g` at 0 or 4, `4g` and `7g` at 0 only.
_S1, _S2, _S2G, _S3G, _S0 = (0, 1, 2, 3, 4, 5, 6), (0, 2, 4, 6), (0, 2, 4), (0, 4), (0,)

#: The 80 GB Ampere/Hopper layout: the A100-SXM4-80GB (and PCIe 80 GB) and the H100 80 GB.
_EIGHTY = (("1g.10gb", 1, 7, _S1), ("1g.10gb+me", 1, 1, _S1), ("1g.20gb", 2, 4, _S2),
           ("2g.20gb", 2, 3, _S2G), ("3g.40gb", 4, 2, _S3G), ("4g.40gb", 4, 1, _S0),
           ("7g.80gb", 8, 1, _S0))

#: NVIDIA's published profiles per model (see the module's docstring for the source).
MIG_MODELS: tuple[MigModel, ...] = (
    # A30: 4 slots, `1g` at 0..3, `2g` at 0 or 2, `4g` at 0 (the guide's "A30 MIG profiles")
    MigModel("A30-24GB", "A30", 24, 4, 4, _rows(
        ("1g.6gb", 1, 4, (0, 1, 2, 3)), ("1g.6gb+me", 1, 1, (0, 1, 2, 3)),
        ("2g.12gb", 2, 2, (0, 2)), ("2g.12gb+me", 2, 1, (0, 2)), ("4g.24gb", 4, 1, _S0))),
    MigModel("A100-SXM4-40GB", "A100", 40, 7, 8, _rows(
        ("1g.5gb", 1, 7, _S1), ("1g.5gb+me", 1, 1, _S1), ("1g.10gb", 2, 4, _S2),
        ("2g.10gb", 2, 3, _S2G), ("3g.20gb", 4, 2, _S3G), ("4g.20gb", 4, 1, _S0),
        ("7g.40gb", 8, 1, _S0))),
    MigModel("A100-80GB", "A100", 80, 7, 8, _rows(*_EIGHTY)),
    MigModel("H100-80GB", "H100", 80, 7, 8, _rows(*_EIGHTY)),
    MigModel("H200-141GB", "H200", 141, 7, 8, _rows(
        ("1g.18gb", 1, 7, _S1), ("1g.18gb+me", 1, 1, _S1), ("1g.35gb", 2, 4, _S2),
        ("2g.35gb", 2, 3, _S2G), ("3g.71gb", 4, 2, _S3G), ("4g.71gb", 4, 1, _S0),
        ("7g.141gb", 8, 1, _S0))),
)

_BY_NAME = {m.name: m for m in MIG_MODELS}


def mig_model(card_model: str) -> MigModel | None:
    """The table's model for a card model as a node or NVML names it (`A100-SXM4-40GB`,
    `NVIDIA A100-PCIE-80GB`, `NVIDIA H100 80GB HBM3`, `H200`, ...); None for a card the table
    does not know (no substitution is made on it)."""
    if card_model in _BY_NAME:
        return _BY_NAME[card_model]
    text = card_model.upper().replace("_", "-").replace(" ", "-")
    if "A30" in text:
        return _BY_NAME["A30-24GB"]
    if "A100" in text:
        return _BY_NAME["A100-80GB" if "80GB" in text else "A100-SXM4-40GB"]
    if "H200" in text:
        return _BY_NAME["H200-141GB"]
    if "H100" in text and "80GB" in text:
        return _BY_NAME["H100-80GB"]
    return None


#: Compute slices of a card whose model the table does not know, for a profile no model of the
#: table lists: every MIG-capable card NVIDIA publishes has 7 but the A30 (4), whose profiles
#: carry names no other model has (`1g.6gb`, `2g.12gb`, `4g.24gb`).
DEFAULT_COMPUTE_SLICES = 7


def card_slices(card_model: str | None, profile: MigProfile | None = None,
                spanned: int = 0) -> int:
    """The compute slices of a card: its model's when the table knows `card_model`; else
    those of the models whose table lists `profile`'s size (a name means one size: the A30's
    names are its own, every other model has 7; were two ever to differ, the fewest, so a share
    is never understated); else `DEFAULT_COMPUTE_SLICES`. Never fewer than `spanned` (the
    slices the card's instances are seen to span: a layout beyond the table trusts the driver)
    nor than the profile's own (no instance is more than its card)."""
    known = mig_model(card_model) if card_model else None
    if known is not None:
        total = known.compute_slices
    else:
        listing = [m.compute_slices for m in MIG_MODELS if profile is not None
                   and any(_same_size(row.profile, profile) for row in m.profiles)]
        total = min(listing, default=DEFAULT_COMPUTE_SLICES)
    return max(total, spanned, profile.slices if profile is not None else 0)


def _same_size(row: MigProfile, profile: MigProfile) -> bool:
    # `+me`, `+me.all` and `+gfx` variants are the plain profile's compute
    return (row.slices, row.memory_gb) == (profile.slices, profile.memory_gb)


def card_fraction(profile: MigProfile, card_model: str | None = None,
                  spanned: int = 0) -> Fraction:
    """What share of one card an instance of `profile` is, exactly: its compute slices over
    its card's (`card_slices`): an A30 `1g.6gb` is 1/4, an A100 `1g.5gb` 1/7. `card_model`
    None is an instance not placed yet (a pod's request): its name decides. Every reader
    (budget, quota, node-level count, cluster view, DRA devices) rounds this one fraction the
    way its purpose needs."""
    return Fraction(profile.slices, card_slices(card_model, profile, spanned))


def compatible(requested: MigProfile, offered: MigProfile, model: str) -> bool:
    """Whether a pod asking `requested` may run on an instance of `offered` on a card of
    `model`: the card's family has `requested` (on some model of the family: the pod's name
    means a size there), `offered` is a profile of `model`, it has at least the compute slices
    and the memory asked, and it is another profile. A `+me` request needs the same media
    extensions; a plain request may take a `+me` instance."""
    card = mig_model(model)
    if card is None or requested == offered:
        return False
    have = card.size(offered)
    if have is None:
        return False
    family = [m for m in MIG_MODELS if m.family == card.family]
    if not any(m.size(requested) is not None for m in family):
        return False
    if requested.extra and requested.extra != offered.extra:
        return False
    return offered.slices >= requested.slices and offered.memory_gb >= requested.memory_gb


#: MiB per GB of a profile's name when a share's memory is matched to a profile (HAMi's
#: `nvidia.com/vgpu-mode: mig`): a `1g.10gb` serves a share asking up to 10 GiB.
MIB_PER_PROFILE_GB = 1024


def smallest_profile_for_memory(memory_mib: int, card_model: str,
                                extra: str = "") -> MigProfile | None:
    """The profile HAMi's `vgpu-mode: mig` share of `memory_mib` MiB becomes on a card of
    `card_model`: the smallest (compute slices, then memory) of the model's profiles with at
    least that memory (`MIB_PER_PROFILE_GB` per GB of its name), plain unless `extra` asks
    `+me`; None when the model is unknown or no profile holds that much."""
    model = mig_model(card_model)
    if model is None:
        return None
    fits = [r.profile for r in model.profiles if r.profile.extra == extra
            and r.profile.memory_gb * MIB_PER_PROFILE_GB >= memory_mib]
    return min(fits, key=lambda p: (p.slices, p.memory_gb), default=None)
