"""/provision: the controller asks the extender to place an ElasticGPUClaim's ElasticGPU; the
decision is the state's (`core.claims`), the create is ours, serialized per claim with binds.
"""

from __future__ import annotations

import logging
from typing import Any

from aiohttp import web

from elastic_gpu.api import elasticgpu as egpu_api
from elastic_gpu.core.claims import decisions as claims_decisions
from elastic_gpu.core.claims import model as claims_model
from elastic_gpu.core.claims.decisions import Bind, InSync
from elastic_gpu.core.claims.model import provisioned_name
from elastic_gpu.scheduler import wire
from elastic_gpu.scheduler.handle import BindError, ClaimApi, Handle
from elastic_gpu.scheduler.http import json_answer
from elastic_gpu.scheduler.state import SchedulerState

log = logging.getLogger(__name__)


class _NotFound(Exception):
    """/provision: the claim does not exist (404)."""


class Provisioner:
    """The provision verb."""

    def __init__(self, handle: Handle) -> None:
        self._handle = handle

    @property
    def state(self) -> SchedulerState:
        return self._handle.state

    @property
    def claims_api(self) -> ClaimApi | None:
        return self._handle.claims_api

    async def provision(self, body: bytes) -> web.Response:
        """`POST /provision` (docs/claims.md, "The extender's part"): provision a claim from the
        caches; 200 with Provisioned / Pending / NotNeeded, 404 for an unknown claim."""
        args = wire.parse_provision(body)
        if self.claims_api is None:
            return json_answer({"Error": "this extender has no API access"}, status=503)
        self.state.require_ready()
        key = f"{args.namespace}/{args.name}"
        try:
            with self._handle.binds.running():  # a drain lets it finish, like a bind
                async with self._handle.claim_locks.held([args.uid]):
                    answer = await self._provision(args, key)
        except _NotFound as err:
            return json_answer({"Error": str(err)}, status=404)
        except BindError as err:
            # the API refused or did not answer the creation: the controller retries
            return json_answer({"Error": f"provisioning claim {key}: {err}"}, status=503)
        return json_answer(answer)

    async def _provision(self, args: wire.ProvisionArgs, key: str) -> dict[str, Any]:
        assert self.claims_api is not None
        claim = self.state.claim(args.namespace, args.name)
        if claim is None or claim.uid != args.uid:
            raw = await self.claims_api.get_claim(args.namespace, args.name)
            try:
                claim = egpu_api.claim_from_object(raw) if raw is not None else None
            except egpu_api.ElasticGPUObjectError as err:
                raise _NotFound(f"ElasticGPUClaim {key} cannot be read: {err}") from None
            if claim is None:
                raise _NotFound(f"ElasticGPUClaim {key} does not exist")
            if claim.uid != args.uid:
                raise _NotFound(f"ElasticGPUClaim {key} has uid {claim.uid}, not {args.uid}: "
                                "it was deleted (and maybe re-created)")
            await self._handle.calls(self.state.upsert_claim, claim)
        outcome, token = await self._handle.calls(self.state.provision, claim)
        if isinstance(outcome, claims_model.ElasticGPU):
            assert token is not None
            egpu = await self._create_provisioned(outcome, token, key)
            self._handle.metrics.provisioned.inc()
            return {"result": "Provisioned", "elasticGPU": egpu.name, "node": egpu.node}
        if isinstance(outcome, claims_decisions.Pending):
            return {"result": "Pending", "reason": outcome.reason.value,
                    "message": outcome.message}
        if isinstance(outcome, Bind) and claim.elastic_gpu_name is None and \
                outcome.elastic_gpu == provisioned_name(claim):
            made = self.state.elasticgpu(outcome.elastic_gpu)  # pre-bound: provisioned already
            return {"result": "Provisioned", "elasticGPU": outcome.elastic_gpu,
                    "node": made.node if made is not None else ""}
        if isinstance(outcome, claims_decisions.Lost):
            return {"result": "NotNeeded", "decision": "Lost",
                    "elasticGPU": claim.elastic_gpu_name or "", "message": outcome.message}
        if isinstance(outcome, InSync | Bind):
            return {"result": "NotNeeded", "decision": type(outcome).__name__,
                    "elasticGPU": outcome.elastic_gpu}
        raise AssertionError(f"unexpected decision {outcome!r}")  # Provision is never returned

    async def _create_provisioned(self, egpu: claims_model.ElasticGPU, token: int,
                                  key: str) -> claims_model.ElasticGPU:
        assert self.claims_api is not None
        where = f"provision claim {key}"
        try:
            created = await self.claims_api.create_elasticgpu(egpu_api.elasticgpu_to_object(egpu))
        except BindError as err:
            if err.code != 409:
                await self._handle.calls(self.state.settle_elasticgpu, egpu.name, token,
                                       "failed" if err.definite else "unknown")
                raise BindError(f"creating ElasticGPU {egpu.name}: {err}",
                                definite=err.definite) from None
            await self._handle.calls(self.state.settle_elasticgpu, egpu.name, token, "failed")
            existing = await self._handle.existing_elasticgpu(where, egpu.name)
            if existing.claim_ref != egpu.claim_ref:
                raise BindError(f"ElasticGPU {egpu.name} exists and is not this claim's",
                                definite=True) from None
            return existing
        try:
            made = egpu_api.elasticgpu_from_object(created)
        except egpu_api.ElasticGPUObjectError as err:
            await self._handle.calls(self.state.settle_elasticgpu, egpu.name, token, "unknown")
            raise BindError(f"{where}: {err}", definite=False) from None
        await self._handle.calls(self.state.settle_elasticgpu, egpu.name, token, "created", made,
                               str((created.get("metadata") or {}).get("uid") or ""))
        return made
