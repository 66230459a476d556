"""Errors of the development control plane; each message says what to do about it."""

from __future__ import annotations


class DevClusterError(RuntimeError):
    """Base class: something about the local control plane is wrong."""


class MissingBinariesError(DevClusterError):
    """The control plane binaries are not built (or not where we were told to look)."""

    def __init__(self, where: str, missing: list[str]) -> None:
        self.where = where
        self.missing = missing
        super().__init__(
            f"control plane binaries missing in {where}: {', '.join(missing)}. "
            "Build them once with `hack/ensure-k8s.sh` (needs Go >= 1.26 and the Go module "
            "proxy), or point EGPU_K8S_BIN_DIR at a directory that holds them."
        )


class PortInUseError(DevClusterError):
    """A port we were asked to use is already taken."""

    def __init__(self, port: int, what: str) -> None:
        self.port = port
        super().__init__(f"port {port} on 127.0.0.1 for {what} is already in use; "
                         "choose another port or stop whatever listens there")


class ComponentStartError(DevClusterError):
    """A component exited while starting, or did not become ready in time."""

    def __init__(self, name: str, reason: str, log_path: str, log_tail: str) -> None:
        self.name = name
        self.log_path = log_path
        self.log_tail = log_tail
        super().__init__(f"{name} {reason}; last lines of {log_path}:\n{log_tail}")
