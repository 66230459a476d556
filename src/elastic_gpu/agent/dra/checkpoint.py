"""The plugin's record of prepared claims: one JSON file in its directory, rewritten atomically
on every change.

kubelet may call NodePrepareResources again for a claim it prepared before (a retry, a kubelet
or agent restart, a reboot: kubelet keeps its own checkpoint of prepared claims). The answer
must be the same, so it is read from here, not derived again: the claim's cards may since have
turned unhealthy or its CDI directory (a tmpfs) been emptied, and the container that already
runs keeps what it got. An unreadable file is set aside (`.corrupt`) with a warning and the
plugin starts empty: a claim prepared again is prepared from the API, with the same CDI ids.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Any

from elastic_gpu.agent.dra.prepare import PreparedClaim
from elastic_gpu.agent.files import write_json_atomic
from elastic_gpu.core.dra.devices import DRIVER

log = logging.getLogger(__name__)

CHECKPOINT_FILE = "checkpoint.json"
VERSION = 1


class Checkpoint:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._claims: dict[str, PreparedClaim] = self._load()

    def _load(self) -> dict[str, PreparedClaim]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}
        try:
            data: Any = json.loads(text)
            if data.get("version") != VERSION or data.get("driver") != DRIVER:
                raise ValueError(f"version {data.get('version')!r} of driver "
                                 f"{data.get('driver')!r}, not {VERSION} of {DRIVER}")
            return {str(uid): PreparedClaim.from_dict(str(uid), entry)
                    for uid, entry in data["claims"].items()}
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            aside = self.path.with_name(self.path.name + ".corrupt")
            self.path.replace(aside)
            log.warning("DRA checkpoint %s is unreadable (%s): moved to %s, starting empty; "
                        "claims kubelet prepares again are prepared from the API", self.path,
                        err, aside)
            return {}

    def _save(self) -> None:
        write_json_atomic(self.path, {
            "version": VERSION, "driver": DRIVER,
            "claims": {uid: claim.to_dict() for uid, claim in sorted(self._claims.items())}},
            mode=0o600)

    def get(self, uid: str) -> PreparedClaim | None:
        with self._lock:
            return self._claims.get(uid)

    def put(self, claim: PreparedClaim) -> None:
        with self._lock:
            self._claims[claim.ref.uid] = claim
            self._save()

    def remove(self, uid: str) -> bool:
        """Forget the claim; True when it was recorded."""
        with self._lock:
            if self._claims.pop(uid, None) is None:
                return False
            self._save()
            return True

    def claims(self) -> list[PreparedClaim]:
        """Every prepared claim, by uid."""
        with self._lock:
            return [self._claims[uid] for uid in sorted(self._claims)]

    def uids(self) -> list[str]:
        with self._lock:
            return sorted(self._claims)
