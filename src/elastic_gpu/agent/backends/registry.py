"""Backend name -> factory: the one place a config's `backend:` becomes a `Backend`.

Factories import their module when called, so a node without NVIDIA's library can run the
fake backend, and a vendor backend adds one entry here (and one to `BackendKind`), not a
branch somewhere in the agent.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from elastic_gpu.agent.backends.base import Backend, BackendError
from elastic_gpu.agent.config import AgentConfig, BackendKind

#: Builds the backend of `config` for the node named by the second argument.
BackendFactory = Callable[[AgentConfig, str], Backend]


def _nvml(config: AgentConfig, node_name: str) -> Backend:
    from elastic_gpu.agent.backends.nvml import NvmlBackend

    return NvmlBackend(config.healthCheck)


def _fake(config: AgentConfig, node_name: str) -> Backend:
    from elastic_gpu.agent.backends.fake import FakeBackend

    if config.fake is None:  # the config validator requires it; say so if it did not
        raise BackendError("the fake backend needs `fake.inventory` in the config")
    return FakeBackend.from_file(config.fake.inventory, node_name, config.fake.migState)


BACKENDS: Mapping[BackendKind, BackendFactory] = {
    BackendKind.NVML: _nvml,
    BackendKind.FAKE: _fake,
}


def make_backend(config: AgentConfig, node_name: str) -> Backend:
    """The backend the config names; BackendError when it cannot serve (no driver, ...)."""
    factory = BACKENDS.get(config.backend)
    if factory is None:
        known = ", ".join(kind.value for kind in BACKENDS)
        raise BackendError(f"no backend named {config.backend.value!r}; known: {known}")
    return factory(config, node_name)
