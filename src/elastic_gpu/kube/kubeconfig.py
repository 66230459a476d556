"""An async lightkube client from a kubeconfig file or the in-cluster service account."""

from __future__ import annotations

from pathlib import Path
from typing import Any


class ClientConfigError(RuntimeError):
    """No usable API server configuration; the message says where we looked."""


def load_config(kubeconfig: Path | None) -> tuple[Any, Any]:
    """lightkube's (KubeConfig, current single config) from `kubeconfig`, or from the in-cluster
    service account when it is None; every failure is a ClientConfigError saying where."""
    from lightkube import KubeConfig
    from lightkube.core.exceptions import ConfigError

    where = str(kubeconfig) if kubeconfig is not None else "the in-cluster service account"
    try:
        if kubeconfig is not None:
            if not kubeconfig.is_file():
                raise ClientConfigError(f"kubeconfig {kubeconfig} does not exist")
            config = KubeConfig.from_file(str(kubeconfig))
        else:
            config = KubeConfig.from_service_account()
    except ConfigError as err:
        raise ClientConfigError(f"cannot configure the Kubernetes client from {where}: "
                                f"{err}") from None
    except (OSError, KeyError) as err:
        raise ClientConfigError(f"cannot read {where} ({err}); pass --kubeconfig when "
                                "running outside a cluster") from None
    single = config.get()
    if single is None or single.user is None:
        raise ClientConfigError(f"{where} has no current context with a user")
    return config, single


def async_client(kubeconfig: Path | None = None, *, field_manager: str,
                 timeout_s: float = 10.0, max_connections: int = 64) -> Any:
    """`lightkube.AsyncClient` for `kubeconfig`, or in-cluster config when it is None.

    Typed `Any` because lightkube's public methods are untyped overloads; callers wrap it.
    """
    import httpx2
    from lightkube import AsyncClient
    from lightkube.config.client_adapter import verify_cluster

    config, single = load_config(kubeconfig)
    # Our own transport for its connection limits: a burst of concurrent requests with
    # httpx's default of 20 kept-alive connections reopens TLS connections for most of them.
    # TLS settings are lightkube's, from the same kubeconfig.
    tls = verify_cluster(single.cluster, single.user, single.abs_file, trust_env=False)
    transport = httpx2.AsyncHTTPTransport(verify=tls, limits=httpx2.Limits(
        max_connections=max_connections, max_keepalive_connections=max_connections))
    return AsyncClient(config=config, field_manager=field_manager,
                       timeout=httpx2.Timeout(timeout_s), trust_env=False, transport=transport)
