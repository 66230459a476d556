"""What a card's node observes on it: memory and compute in use, by holders and by no one.

The scheduler counts what pods asked; the agent samples what processes use. These values carry
the sample from the agent (which writes them into each card's GPUDevice status) to the
scheduler (which subtracts out-of-band memory in fit and can prefer cool cards) and to
`egpu top`. Plain immutable values; `Card.usage` holds one (None: nothing observed yet, or an
agent that does not observe).
"""

from __future__ import annotations

from dataclasses import dataclass

#: Utilisation is a percentage of the card's streaming multiprocessors' time.
MAX_PERCENT = 100


@dataclass(frozen=True)
class ContainerUsage:
    """One holder's observed use of one card."""

    namespace: str
    pod: str
    container: str
    memory_mib: int
    #: SM utilisation attributed to the container's processes, percent of the card; None where
    #: the backend cannot sample per process.
    sm_percent: int | None = None

    def __post_init__(self) -> None:
        _check_mib("container memory", self.memory_mib)
        if self.sm_percent is not None:
            _check_percent("container utilisation", self.sm_percent)


@dataclass(frozen=True)
class CardUsage:
    """One card's observed use.

    `used_mib` is every process's memory on the card; `out_of_band_mib` is the part no holder
    of the card accounts for (processes outside any pod holding it, leaked contexts): memory a
    new share cannot have, whatever the ledger says.
    """

    used_mib: int
    out_of_band_mib: int
    sm_percent: int
    #: When the agent sampled it, RFC 3339 (as written on the wire).
    observed_at: str = ""
    containers: tuple[ContainerUsage, ...] = ()

    def __post_init__(self) -> None:
        _check_mib("used memory", self.used_mib)
        _check_mib("out-of-band memory", self.out_of_band_mib)
        _check_percent("utilisation", self.sm_percent)
        if self.out_of_band_mib > self.used_mib:
            raise ValueError(f"out-of-band memory {self.out_of_band_mib} MiB exceeds the used "
                             f"memory {self.used_mib} MiB")


def _check_mib(what: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{what} {value!r} MiB is not a whole number >= 0")


def _check_percent(what: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_PERCENT:
        raise ValueError(f"{what} {value!r}% is not a whole number in 0..{MAX_PERCENT}")
