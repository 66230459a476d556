"""The one logging setup of every `egpu` command and process (scheduler, its API worker,
controller, webhook, agent, top).

Each command used to call `logging.basicConfig` itself, with its own reading of the level
(`--log-level` upper-cased, the agent's `--verbose`), so a wrong level was a traceback in one
and impossible in another. Here a level is a name logging knows (any case: `debug`, `INFO`,
`warn`), an unknown one is a `LogLevelError` naming the known ones, and the format is the one
every component has always written, `TIME LEVEL LOGGER: MESSAGE`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TextIO

#: Every long-running component's line: `2026-11-28 17:22:00,123 INFO elastic_gpu.x: text`.
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: The levels a --log-level help text offers (logging also knows CRITICAL, WARN, FATAL).
COMMON_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


class LogLevelError(ValueError):
    """A level name logging does not know; the message lists the known ones."""


def parse_level(name: str) -> int:
    """The numeric level of `name` (case does not matter); `LogLevelError` otherwise."""
    known = logging.getLevelNamesMapping()
    level = known.get(name.strip().upper())
    if level is None:
        raise LogLevelError(f"unknown log level {name!r}: known levels are "
                            f"{', '.join(COMMON_LEVELS)} (and CRITICAL)")
    return level


def setup_logging(level: str, *, fmt: str = FORMAT, quiet: Iterable[str] = (),
                  stream: TextIO | None = None) -> None:
    """Configure the root logger once for this process: `level` (a name, `parse_level`),
    lines in `fmt` on `stream` (stderr by default); the loggers named in `quiet` log only
    WARNING and above (an HTTP client's one INFO line per request would drown the rest)."""
    logging.basicConfig(level=parse_level(level), format=fmt, stream=stream)
    for name in quiet:
        logging.getLogger(name).setLevel(logging.WARNING)
