"""CDI (Container Device Interface) specs of prepared claims. Pure but for `write_spec` and
`remove_spec`.

kubelet hands the container runtime the CDI device ids the plugin answers for a claim's
devices; the runtime (containerd, CRI-O) finds them in the spec files of its CDI directories
(`/var/run/cdi` by default) and applies their `containerEdits` to the container. One spec
file per claim, `gpu.elasticgpu.io-<claim uid>.json`, kind `gpu.elasticgpu.io/gpu`, one CDI
device per (claim uid, device): `<claim uid>-<device>`, so a device shared by several claims
(consumable capacity) is a different CDI device in each, with that claim's limits, and a
claim's spec is removed without touching another's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from elastic_gpu.agent.files import remove_file, write_json_atomic
from elastic_gpu.agent.grant import Grant
from elastic_gpu.core.dra.devices import DRIVER

CDI_VERSION = "0.6.0"
CDI_CLASS = "gpu"
CDI_KIND = f"{DRIVER}/{CDI_CLASS}"


#: What a claim uid may be to name files and CDI devices (a Kubernetes uid is a UUID): no
#: separator, no leading dot, so a uid can never name a path outside the CDI directory.
_UID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}")


def uid_problem(claim_uid: str) -> str | None:
    """Why `claim_uid` cannot name a spec file (None: it can)."""
    if _UID.fullmatch(claim_uid):
        return None
    return f"claim uid {claim_uid!r} is not a Kubernetes uid (letters, digits, '-', '_')"


def cdi_name(claim_uid: str, device: str) -> str:
    """The CDI device name of one device of one claim (CDI names allow [A-Za-z0-9_.:-])."""
    return f"{claim_uid}-{device}"


def cdi_id(claim_uid: str, device: str) -> str:
    """The fully qualified CDI device id kubelet passes to the runtime."""
    return f"{CDI_KIND}={cdi_name(claim_uid, device)}"


def spec_file(cdi_dir: Path, claim_uid: str) -> Path:
    problem = uid_problem(claim_uid)
    if problem is not None:
        raise ValueError(problem)
    return cdi_dir / f"{DRIVER}-{claim_uid}.json"


def container_edits(grant: Grant) -> dict[str, Any]:
    """A grant (what the device-plugin path's Allocate answers) as CDI containerEdits."""
    edits: dict[str, Any] = {"env": [f"{key}={value}" for key, value in
                                     sorted(grant.envs.items())]}
    if grant.devices:
        edits["deviceNodes"] = [{"path": d.container_path, "hostPath": d.host_path,
                                 "permissions": d.permissions} for d in grant.devices]
    if grant.mounts:
        edits["mounts"] = [{"hostPath": m.host_path, "containerPath": m.container_path,
                            "options": ["ro" if m.read_only else "rw", "nosuid", "nodev",
                                        "bind"]}
                           for m in grant.mounts]
    return edits


def claim_spec(claim_uid: str, devices: Mapping[str, Grant]) -> dict[str, Any]:
    """The CDI spec of one claim: device name -> its grant."""
    return {
        "cdiVersion": CDI_VERSION,
        "kind": CDI_KIND,
        "annotations": {f"{DRIVER}/claim-uid": claim_uid},
        "devices": [{"name": cdi_name(claim_uid, device), "containerEdits": container_edits(g)}
                    for device, g in devices.items()],
    }


def write_spec(cdi_dir: Path, claim_uid: str, spec: Mapping[str, Any]) -> Path:
    path = spec_file(cdi_dir, claim_uid)
    write_json_atomic(path, spec)
    return path


def remove_spec(cdi_dir: Path, claim_uid: str) -> bool:
    return remove_file(spec_file(cdi_dir, claim_uid))
