"""NodePrepareResources for one claim, decided: which devices, what the container gets, which
CDI ids. Pure, no I/O: the plugin (`kubelet_plugin`) reads the claim, writes the spec and the
checkpoint.

A claim is refused, naming why, when the ResourceClaim read from the API is not the one kubelet
asked about (another uid: deleted and created again under the name), is not allocated, is
reserved for no pod, or has no device of this driver in this node's pool; and when its
allocation names a device this node does not publish or a share it cannot give
(`core.dra.allocation`). Each device's container edits are exactly what the device-plugin
path's Allocate gives a container holding the same share (`agent.grant.build_grant`, with the
node's cards, config, visible-devices variable, device files and isolation provider): the
claim's devices on this node are granted together, as Allocate grants a container's cards, so
every CDI device of a claim carries the same environment (the runtime merges identical
variables and device nodes of one container).

A container given devices of several claims sees all of them in one visible-devices variable
(`claim_group`): a runtime applies each CDI device's environment in turn, so with one grant per
claim the last claim's variable would hide the others'. When the claim is reserved for one pod
and every container of that pod using it uses the same claims, the claim's grant is built for
the shares of all of them (claims in name order), so every claim of the group carries the same
variables and the container sees every card whichever the runtime applies last. Otherwise (a
claim shared by several pods, or containers using it with different claims beside it) each
claim keeps its own grant, since a union would name cards a container was not given.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from elastic_gpu.agent.backends.isolation import Isolation
from elastic_gpu.agent.config import AgentConfig
from elastic_gpu.agent.devices import LogicalCard
from elastic_gpu.agent.dra.cdi import cdi_id, claim_spec
from elastic_gpu.agent.grant import DeviceFiles, GrantError, build_grant
from elastic_gpu.core.assignment import CardShare
from elastic_gpu.core.dra.allocation import AllocationError, allocated_devices
from elastic_gpu.core.dra.devices import DRIVER, DeviceRef, device_table
from elastic_gpu.core.dra.pods import container_claims


class PrepareError(ValueError):
    """This claim cannot be prepared on this node: the per-claim error kubelet is answered."""


@dataclass(frozen=True)
class ClaimRef:
    """The claim kubelet asks about."""

    namespace: str
    name: str
    uid: str

    def describe(self) -> str:
        return f"ResourceClaim {self.namespace}/{self.name} (uid {self.uid})"


@dataclass(frozen=True)
class PreparedDevice:
    """One device of the answer (NodePrepareResourceResponse.devices[])."""

    requests: tuple[str, ...]
    pool: str
    device: str
    cdi_ids: tuple[str, ...]
    share_id: str | None = None
    #: what the device holds of its card (the node's held accounting, `agent.dra.holdings`);
    #: None in an entry an older agent checkpointed
    share: CardShare | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"requests": list(self.requests), "pool": self.pool,
                               "device": self.device, "cdiIds": list(self.cdi_ids)}
        if self.share_id is not None:
            out["shareId"] = self.share_id
        if self.share is not None:
            out["share"] = self.share.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PreparedDevice:
        share = data.get("shareId")
        held = data.get("share")
        return cls(tuple(str(r) for r in data["requests"]), str(data["pool"]),
                   str(data["device"]), tuple(str(i) for i in data["cdiIds"]),
                   None if share is None else str(share),
                   None if held is None else CardShare.from_dict(held))


@dataclass(frozen=True)
class PreparedClaim:
    """A prepared claim: the answer and the CDI spec it stands on (both checkpointed)."""

    ref: ClaimRef
    devices: tuple[PreparedDevice, ...]
    spec: Mapping[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"namespace": self.ref.namespace, "name": self.ref.name,
                "devices": [d.to_dict() for d in self.devices], "cdiSpec": self.spec}

    @classmethod
    def from_dict(cls, uid: str, data: Mapping[str, Any]) -> PreparedClaim:
        return cls(ClaimRef(str(data["namespace"]), str(data["name"]), uid),
                   tuple(PreparedDevice.from_dict(d) for d in data["devices"]),
                   dict(data["cdiSpec"]))


@dataclass(frozen=True)
class GrantInputs:
    """What `build_grant` needs beyond the shares: the same objects the device-plugin path's
    Allocator holds."""

    config: AgentConfig
    visible_env: str
    files: DeviceFiles
    isolation: Isolation | None


def claim_refusal(claim: Mapping[str, Any], ref: ClaimRef) -> str | None:
    """Why the claim read from the API is not one to prepare (None: go on)."""
    meta = claim.get("metadata") or {}
    if meta.get("uid") != ref.uid:
        return (f"{ref.describe()}: the API's claim of that name has uid {meta.get('uid')!r} "
                "(deleted and created again?)")
    status = claim.get("status") or {}
    if not status.get("allocation"):
        return f"{ref.describe()}: not allocated"
    if not any(isinstance(r, Mapping) and r.get("resource") == "pods"
               for r in status.get("reservedFor") or []):
        return f"{ref.describe()}: reserved for no pod"
    return None


def reserved_pods(claim: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The (name, uid) of the pods the claim is reserved for."""
    return [(str(r.get("name")), str(r.get("uid")))
            for r in (claim.get("status") or {}).get("reservedFor") or []
            if isinstance(r, Mapping) and r.get("resource", "pods") == "pods"]


def claim_group(pod: Mapping[str, Any], claim: str) -> tuple[str, ...]:
    """The ResourceClaims (names, sorted) whose devices share one grant with `claim`'s: those
    every container of `pod` that uses `claim` uses, when all such containers use the same
    claims; else `claim` alone."""
    sets = {frozenset(name for name, _ in refs)
            for refs in container_claims(pod).values() if any(n == claim for n, _ in refs)}
    if len(sets) != 1:
        return (claim,)
    (group,) = sets
    return tuple(sorted(group))


def _shares(claim: Mapping[str, Any], node: str, table: Mapping[str, DeviceRef]
            ) -> list[CardShare]:
    try:
        return [a.share for a in allocated_devices(claim, node, table)]
    except AllocationError:
        return []  # that claim's own prepare refuses it, naming why


def prepare_claim(claim: Mapping[str, Any], ref: ClaimRef, node: str,
                  cards: Mapping[int, LogicalCard], inputs: GrantInputs,
                  group: Sequence[tuple[str, Mapping[str, Any]]] = ()) -> PreparedClaim:
    """The claim's devices on `node` with their grant; PrepareError naming why not. `group`:
    the claims (name, object) that share its grant (`claim_group`, this claim included);
    empty: the claim alone."""
    refusal = claim_refusal(claim, ref)
    if refusal is not None:
        raise PrepareError(refusal)
    table = device_table([lc.card for lc in sorted(cards.values(), key=lambda c: c.index)])
    try:
        allocated = allocated_devices(claim, node, table)
    except AllocationError as err:
        raise PrepareError(f"{ref.describe()}: {err}") from None
    if not allocated:
        raise PrepareError(f"{ref.describe()}: allocates no device of {DRIVER} in pool {node} "
                           "(allocated for another node?)")
    shares = [a.share for a in allocated]
    if len(group) > 1:
        shares = [share for name, other in group
                  for share in (shares if name == ref.name else _shares(other, node, table))]
    try:
        grant = build_grant(shares, cards, inputs.config,
                            inputs.visible_env, inputs.files, inputs.isolation)
    except GrantError as err:
        raise PrepareError(f"{ref.describe()}: {err}") from None
    names = list(dict.fromkeys(a.device for a in allocated))
    spec = claim_spec(ref.uid, {name: grant for name in names})
    devices = tuple(PreparedDevice((a.request,), node, a.device, (cdi_id(ref.uid, a.device),),
                                   a.share_id, a.share) for a in allocated)
    return PreparedClaim(ref, devices, spec)
