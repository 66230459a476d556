"""`egpu webhook`: the HTTPS server (HTTP and TLS only) over `review.Admission`.

- `POST /mutate` and `POST /validate`: an AdmissionReview in, an AdmissionReview out (HTTP 200)
  with the outcome of `review.Admission` (`http_answer`) and, from /mutate, its JSON Patch. A
  body that is not an AdmissionReview v1 gets 400 with the reason; a review whose object cannot
  be read gets 200 with `allowed: false` and the reason; a body over `max_body_bytes` gets 413.
  Never 5xx.
- `POST /mutate-claims`: an ElasticGPUClaim being created gets the claim-protection finalizer
  (`core.claims.pods.protection_patch`; issue #26: on every claim from its creation, as a PVC's).
- `GET /healthz` (serving), `/readyz` (certificate loaded, Nodes listed, registration applied),
  `/metrics` (Prometheus, `elasticgpu_webhook_*`).
The server keeps the cluster facts current from its watches (Nodes, MIGSubstitutions) and
builds the review's lookups (`sources.Lookups`) from its caches; with `budget_finalizer` and
`quota` it adds those mutators (`core.admission.chain.mutator_chain`).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import ssl
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import msgspec
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from elastic_gpu.core.admission.chain import mutator_chain
from elastic_gpu.core.admission.facts import NodeGpus, default_policies, facts_from_nodes
from elastic_gpu.core.admission.mutation import Mutator
from elastic_gpu.core.connlimits import ConnectionLimits
from elastic_gpu.core.mig.rules import SubstitutionRule
from elastic_gpu.kube.client import KubeClient
from elastic_gpu.runtime.eventloop import stop_on_signals
from elastic_gpu.runtime.http_connections import (
    ConnectionGate,
    GateCollector,
    GatedSite,
    gated_app,
    runner_options,
)
from elastic_gpu.runtime.metrics import add_metrics
from elastic_gpu.webhook.budgets import BudgetLookup
from elastic_gpu.webhook.cards import CardCache
from elastic_gpu.webhook.certs import CertBundle, Lifetimes, not_after, serving_hosts
from elastic_gpu.webhook.cluster import (
    FIELD_MANAGER,
    ClaimCache,
    NodeFacts,
    SecretStore,
    StoredBundle,
    apply_configurations,
    initial_bundle,
    rotate_once,
)
from elastic_gpu.webhook.draclaims import DraClaimReader
from elastic_gpu.webhook.migrules import RuleCache
from elastic_gpu.webhook.registration import (
    CLAIM_MUTATE_PATH,
    DEFAULT_NAME,
    MUTATE_PATH,
    VALIDATE_PATH,
    Scope,
    Target,
    configurations,
)
from elastic_gpu.webhook.review import (
    API_VERSION,
    Admission,
    Allowed,
    BadRequest,
    Outcome,
    Refused,
)
from elastic_gpu.webhook.sources import Lookups

log = logging.getLogger(__name__)

#: kube-apiserver refuses request bodies over 3 MiB; a review wraps one object (CREATE).
DEFAULT_MAX_BODY = 4 * 2**20
LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                   0.25, 1.0)


_ENCODER = msgspec.json.Encoder()


class Metrics:
    """Each server has its own registry (several may run in one process: tests)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("elasticgpu_webhook_requests", "AdmissionReviews answered, by "
                                "webhook (mutate, validate, mutate-claims) and verdict "
                                "(allowed, patched, "
                                "refused, not_governed, bad_request)", ["webhook", "verdict"],
                                registry=self.registry)
        self.refusals = Counter("elasticgpu_webhook_refusals", "Refusals by rule",
                                ["webhook", "rule"], registry=self.registry)
        self.latency = Histogram("elasticgpu_webhook_request_duration_seconds",
                                 "Time from the request read to the answer, seconds",
                                 ["webhook"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.cert_expiry = Gauge("elasticgpu_webhook_certificate_expiry_timestamp_seconds",
                                 "When the serving certificate expires (Unix time)",
                                 registry=self.registry)
        self.cert_reloads = Counter("elasticgpu_webhook_certificate_reloads",
                                    "Serving certificates loaded (the first one included)",
                                    registry=self.registry)
        self.claim_lookups = Counter("elasticgpu_webhook_claim_lookups",
                                     "ElasticGPUClaims named by pods, by where they were found: "
                                     "cache (the watch) or api (a live read on a cache miss)",
                                     ["source"], registry=self.registry)
        self.rule_lookups = Counter("elasticgpu_webhook_mig_rule_lookups",
                                    "MIG pods at /mutate by where their namespace's "
                                    "MIGSubstitutions were read: api (a live list) or cache "
                                    "(the live list failed)", ["source"], registry=self.registry)
        self.budget_lookups = Counter("elasticgpu_webhook_budget_lookups",
                                      "GPU budget lookups of pods, by source: cache (the "
                                      "watches), api (a live read: cache not synced or a "
                                      "class missing from it), failed (admitted as it is)",
                                      ["source"], registry=self.registry)
        self.gpu_nodes = Gauge("elasticgpu_webhook_gpu_nodes", "GPU nodes known",
                               registry=self.registry)
        self.largest_cards = Gauge("elasticgpu_webhook_largest_node_cards",
                                   "Cards of the largest GPU node", registry=self.registry)


def _answer(uid: str, allowed: bool, message: str = "",
            patch: Sequence[dict[str, Any]] = ()) -> bytes:
    response: dict[str, Any] = {"uid": uid, "allowed": allowed}
    if not allowed:
        response["status"] = {"code": 403, "reason": "Forbidden", "message": message}
    if patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(_ENCODER.encode(list(patch))).decode()
    return _ENCODER.encode({"apiVersion": API_VERSION, "kind": "AdmissionReview",
                            "response": response})


@dataclass(frozen=True)
class HttpAnswer:
    """An outcome as HTTP: the status, the body, and its verdict for the metrics (allowed,
    patched, refused, not_governed, bad_request) with the rules of a refusal."""

    status: int
    body: bytes
    verdict: str
    rules: tuple[str, ...] = ()


def http_answer(outcome: Outcome) -> HttpAnswer:
    """The AdmissionReview response (HTTP 200) of an answered review, 400 with the reason for
    a body that is not one."""
    if isinstance(outcome, BadRequest):
        return HttpAnswer(400, _ENCODER.encode({"error": outcome.reason}), "bad_request")
    decision = outcome.decision
    if isinstance(decision, Refused):
        return HttpAnswer(200, _answer(outcome.uid, False, decision.message), "refused",
                          decision.rules)
    if isinstance(decision, Allowed):
        return HttpAnswer(200, _answer(outcome.uid, True, patch=decision.patch),
                          "patched" if decision.patch else "allowed")
    return HttpAnswer(200, _answer(outcome.uid, True), "not_governed")


class WebhookStartError(RuntimeError):
    """The webhook cannot start serving; the message says what it could not get."""


class TlsHolder:
    """One server SSLContext whose certificate is replaced in place: connections open keep
    their session, new handshakes get the new certificate."""

    def __init__(self) -> None:
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self._dir = Path(tempfile.mkdtemp(prefix="egpu-webhook-tls-"))
        self.loaded: str = ""

    def load(self, cert_pem: str, key_pem: str) -> bool:
        """Load a certificate and key (PEM); False when it is the one already served."""
        if cert_pem == self.loaded:
            return False
        cert, key = self._dir / "tls.crt", self._dir / "tls.key"
        key.touch(mode=0o600)
        key.write_text(key_pem)
        cert.write_text(cert_pem)
        # A pair that does not load (a key of another certificate, e.g. files caught half
        # rewritten) must not reach the live context: OpenSSL would drop the served
        # certificate there and every new handshake would fail. Try a throwaway one first.
        probe = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        probe.load_cert_chain(str(cert), str(key))
        self.context.load_cert_chain(str(cert), str(key))
        self.loaded = cert_pem
        return True

    def close(self) -> None:
        for name in ("tls.crt", "tls.key"):
            with contextlib.suppress(OSError):
                (self._dir / name).unlink()
        with contextlib.suppress(OSError):
            self._dir.rmdir()


@dataclass
class WebhookOptions:
    kubeconfig: Path | None = None
    host: str = "127.0.0.1"
    port: int = 9443
    namespace: str = "elastic-gpu"
    #: configuration names (cluster-scoped) and the Secret's name
    name: str = DEFAULT_NAME
    secret_name: str = "elastic-gpu-webhook-tls"
    #: kube-apiserver calls the Service (in a cluster) or, without one, `url`
    service_name: str | None = None
    service_port: int = 443
    url: str | None = None
    register: bool = True
    #: files from cert-manager (tls.crt, tls.key, ca.crt) instead of the Secret
    cert_dir: Path | None = None
    lifetimes: Lifetimes = field(default_factory=Lifetimes)
    rotation_check_s: float = 60.0
    timeout_s: int = 5
    namespace_labels: dict[str, str] = field(default_factory=dict)
    max_body_bytes: int = DEFAULT_MAX_BODY
    extra_hosts: tuple[str, ...] = ()
    #: the PriorityClass of over-budget namespaces' GPU pods (a GPUBudget may name another);
    #: None: budgets are not looked up
    over_budget_class: str | None = "egpu-over-budget"
    #: GPU pods of namespaces with a GPUBudget get the budget keeper's finalizer (run
    #: `egpu controller` with it)
    budget_finalizer: bool = False
    #: GPU containers get the canonical quota resources (the scheduler must ignore them)
    quota: bool = False
    #: handshake/header and idle timeouts, and the cap on open connections (issue 26, item 9)
    connection_limits: ConnectionLimits = field(default_factory=ConnectionLimits)

    def mutators(self) -> tuple[Mutator, ...]:
        return mutator_chain(quota=self.quota, finalizer=self.budget_finalizer)

    def target(self) -> Target:
        if self.service_name:
            return Target(service_name=self.service_name, service_namespace=self.namespace,
                          service_port=self.service_port)
        return Target(url=self.url or f"https://{self.host}:{self.port}")

    def hosts(self) -> list[str]:
        extra = list(self.extra_hosts)
        if self.host not in ("0.0.0.0", "::", ""):
            extra.append(self.host)
        return serving_hosts(self.service_name, self.namespace, extra)


class WebhookServer:
    def __init__(self, options: WebhookOptions) -> None:
        self.options = options

        self.claim_cache = ClaimCache()
        self.dra_claims = DraClaimReader()
        self.rule_cache = RuleCache(self.set_mig_rules)
        self.card_cache = CardCache(self.set_card_uuids)
        self.metrics = Metrics()
        # the GPUBudgets are watched for the downgrade and for the finalizer alike
        self.budgets = (BudgetLookup(options.over_budget_class or "",
                                     lambda source: self.metrics.budget_lookups.labels(
                                         source).inc())
                        if options.over_budget_class or options.budget_finalizer else None)
        sources = Lookups(claims=self.claim_cache.get, fetch=self.claim_cache.fetch,
                          on_claim_lookup=lambda source: self.metrics.claim_lookups.labels(
                              source).inc(),
                          fetch_rules=self.rule_cache.fetch,
                          on_rule_lookup=lambda source: self.metrics.rule_lookups.labels(
                              source).inc(),
                          budgets=self.budgets, fetch_dra=self.dra_claims)
        self.admission = Admission(sources=sources, mutators=options.mutators())
        self.tls = TlsHolder()
        self.ca_bundle = ""
        self.registered = asyncio.Event()
        self.nodes_synced = asyncio.Event()
        self._policies = default_policies()
        #: the serving site's connections (set when it serves)
        self.gate: ConnectionGate | None = None

    # facts ---------------------------------------------------------------------------------
    def set_nodes(self, nodes: Sequence[NodeGpus]) -> None:
        node_policies, card_policies = self._policies
        facts = facts_from_nodes(nodes, node_policies=node_policies, card_policies=card_policies)
        self.admission.facts = replace(facts, mig_substitutions=self.rule_cache.snapshot(),
                                       card_uuids=self.card_cache.uuids())
        self.metrics.gpu_nodes.set(len(nodes))
        self.metrics.largest_cards.set(facts.largest_cards)

    def set_mig_rules(self, rules: tuple[SubstitutionRule, ...]) -> None:
        """The MIG adapter's rules changed (the MIGSubstitution watch)."""
        self.admission.facts = replace(self.admission.facts, mig_substitutions=rules)

    def set_card_uuids(self, uuids: frozenset[str] | None) -> None:
        """The cluster's cards changed (the GPUDevice watch)."""
        self.admission.facts = replace(self.admission.facts, card_uuids=uuids)

    # HTTP ----------------------------------------------------------------------------------
    def app(self) -> Any:
        from aiohttp import web

        async def handle(request: web.Request, mutate: bool) -> web.Response:
            start = time.perf_counter()
            webhook = "mutate" if mutate else "validate"
            try:
                body = await request.read()
            except web.HTTPRequestEntityTooLarge:
                self.metrics.requests.labels(webhook, "bad_request").inc()
                return web.json_response(
                    {"error": f"body over {self.options.max_body_bytes} bytes"}, status=413)
            answer = http_answer(await self.admission.review_async(body, mutate=mutate))
            for rule in answer.rules:
                self.metrics.refusals.labels(webhook, rule).inc()
            self.metrics.requests.labels(webhook, answer.verdict).inc()
            self.metrics.latency.labels(webhook).observe(time.perf_counter() - start)
            return web.Response(body=answer.body, status=answer.status,
                                content_type="application/json")

        async def mutate(request: web.Request) -> web.Response:
            return await handle(request, True)

        async def validate(request: web.Request) -> web.Response:
            return await handle(request, False)

        async def mutate_claims(request: web.Request) -> web.Response:
            start = time.perf_counter()
            try:
                body = await request.read()
            except web.HTTPRequestEntityTooLarge:
                self.metrics.requests.labels("mutate-claims", "bad_request").inc()
                return web.json_response(
                    {"error": f"body over {self.options.max_body_bytes} bytes"}, status=413)
            answer = http_answer(self.admission.review_claim(body))
            # (the claims' webhook counts no refusals by rule: it has one, malformed)
            self.metrics.requests.labels("mutate-claims", answer.verdict).inc()
            self.metrics.latency.labels("mutate-claims").observe(time.perf_counter() - start)
            return web.Response(body=answer.body, status=answer.status,
                                content_type="application/json")

        async def healthz(_: web.Request) -> web.Response:
            return web.Response(text="ok")

        async def readyz(_: web.Request) -> web.Response:
            missing = [what for what, ok in (
                ("certificate", bool(self.tls.loaded)), ("nodes", self.nodes_synced.is_set()),
                ("registration", self.registered.is_set() or not self.options.register)) if not ok]
            if missing:
                return web.Response(status=503, text=f"not ready: {', '.join(missing)}")
            return web.Response(text="ok")

        app = web.Application(client_max_size=self.options.max_body_bytes)
        app.router.add_post(MUTATE_PATH, mutate)
        app.router.add_post(VALIDATE_PATH, validate)
        app.router.add_post(CLAIM_MUTATE_PATH, mutate_claims)
        app.router.add_get("/healthz", healthz)
        app.router.add_get("/readyz", readyz)
        add_metrics(app, self.metrics.registry)
        return app

    # certificates --------------------------------------------------------------------------
    def use_bundle(self, cert_pem: str, key_pem: str, ca_bundle: str) -> bool:
        """Serve this certificate; True when the CA bundle changed (re-register)."""
        if self.tls.load(cert_pem, key_pem):
            self.metrics.cert_reloads.inc()
            self.metrics.cert_expiry.set(not_after(cert_pem).timestamp())
            log.info("serving certificate loaded, valid until %s", not_after(cert_pem))
        changed = ca_bundle != self.ca_bundle
        self.ca_bundle = ca_bundle
        return changed

    def registration(self) -> tuple[dict[str, Any], dict[str, Any]]:
        scope = Scope(namespace=self.options.namespace, timeout_s=self.options.timeout_s,
                      namespace_labels=self.options.namespace_labels)
        return configurations(self.options.name, self.options.target(),
                              base64.b64encode(self.ca_bundle.encode()).decode(), scope)

    async def _register(self, client: KubeClient) -> None:
        if self.options.register:
            await apply_configurations(client, self.registration())
            self.registered.set()

    async def _rotate_secret(self, client: KubeClient, store: SecretStore,
                             stored: StoredBundle) -> None:
        hosts = self.options.hosts()
        while True:
            await asyncio.sleep(self.options.rotation_check_s)
            try:
                newer = await rotate_once(store, stored, hosts, self.options.lifetimes)
                bundle: CertBundle = newer.bundle
                # A new CA is trusted (registered) before a certificate it signed is served:
                # plan_rotation makes the CA and the certificate it signs in two steps.
                if bundle.ca_bundle != self.ca_bundle:
                    self.ca_bundle = bundle.ca_bundle
                    await self._register(client)
                self.use_bundle(bundle.tls_cert, bundle.tls_key, bundle.ca_bundle)
                stored = newer
            except asyncio.CancelledError:
                raise
            except Exception as err:  # API down: keep serving what we have, try again
                log.warning("certificate rotation check failed: %s", err)

    async def _watch_cert_dir(self, client: KubeClient, directory: Path) -> None:
        while True:
            await asyncio.sleep(self.options.rotation_check_s)
            try:
                cert, key, ca = _read_cert_dir(directory)
                if self.use_bundle(cert, key, ca):
                    await self._register(client)
            except asyncio.CancelledError:
                raise
            except Exception as err:
                log.warning("reading %s failed: %s", directory, err)

    async def run(self, stop: asyncio.Event) -> None:
        from aiohttp import web


        # One client for every call: writes name the webhook's field manager, and live reads
        # with names from reviews go by checked, escaped paths (kube.paths).
        client = reader = KubeClient.from_config(self.options.kubeconfig,
                                                 field_manager=FIELD_MANAGER)
        self.claim_cache.reader = self.rule_cache.reader = self.dra_claims.reader = reader
        if self.budgets is not None:
            self.budgets.reader = reader
        tasks: list[asyncio.Task[None]] = []
        try:
            if self.options.cert_dir is not None:
                cert, key, ca = _read_cert_dir(self.options.cert_dir)
                self.use_bundle(cert, key, ca)
                rotation = self._watch_cert_dir(client, self.options.cert_dir)
            else:
                store = SecretStore(client, self.options.namespace, self.options.secret_name)
                stored = await initial_bundle(store, self.options.hosts(),
                                              self.options.lifetimes)
                self.use_bundle(stored.bundle.tls_cert, stored.bundle.tls_key,
                                stored.bundle.ca_bundle)
                rotation = self._rotate_secret(client, store, stored)
        except Exception as err:
            with contextlib.suppress(Exception):
                await client.close()
            where = (f"--cert-dir {self.options.cert_dir}" if self.options.cert_dir else
                     f"Secret {self.options.namespace}/{self.options.secret_name}")
            raise WebhookStartError(f"no serving certificate from {where}: {err}") from err
        rotation_started = False
        facts = NodeFacts(self.set_nodes)
        tasks.append(asyncio.create_task(facts.run(client)))
        tasks.append(asyncio.create_task(self.claim_cache.run(client)))
        tasks.append(asyncio.create_task(self.rule_cache.run(client)))
        tasks.append(asyncio.create_task(self.card_cache.run(client)))
        if self.budgets is not None:
            tasks.append(asyncio.create_task(self.budgets.run(client)))
        limits = self.options.connection_limits
        self.gate = gate = ConnectionGate(limits)
        runner = web.AppRunner(gated_app(self.app(), gate), access_log=None,
                               shutdown_timeout=5.0, **runner_options(limits))
        await runner.setup()
        site = GatedSite(runner, self.options.host, self.options.port, gate=gate,
                         ssl_context=self.tls.context, reuse_address=True)
        await site.start()
        connections = GateCollector(gate, "elasticgpu_webhook_")
        self.metrics.registry.register(connections)  # until this server stops
        log.info("serving AdmissionReviews on https://%s:%d", self.options.host,
                 self.options.port)
        try:
            await facts.synced.wait()
            self.nodes_synced.set()
            await self._register(client)
            tasks.append(asyncio.create_task(rotation))
            rotation_started = True
            await stop.wait()
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            if not rotation_started:
                rotation.close()
            await runner.cleanup()
            self.metrics.registry.unregister(connections)
            self.tls.close()
            with contextlib.suppress(Exception):
                await client.close()


def _read_cert_dir(directory: Path) -> tuple[str, str, str]:
    cert = (directory / "tls.crt").read_text()
    key = (directory / "tls.key").read_text()
    ca_path = directory / "ca.crt"
    return cert, key, ca_path.read_text() if ca_path.exists() else ""


async def serve(options: WebhookOptions, stop: asyncio.Event | None = None) -> None:
    """Run until `stop` is set, or SIGTERM / SIGINT."""
    stop = stop or asyncio.Event()
    with stop_on_signals(stop):
        await WebhookServer(options).run(stop)


__all__ = ["HttpAnswer", "WebhookOptions", "WebhookServer", "WebhookStartError", "serve"]
