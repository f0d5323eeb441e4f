"""The Kubernetes API client every component uses: no call without a timeout.

The generated client waits forever by default, so one API server (or proxy) that accepts a request
and never answers would stop the policy scheduler for good. Every request goes through
``ApiClient.call_api``; giving it a default ``_request_timeout`` there covers pod, node, event,
status and lease calls alike, and calls that pass their own (the watches' long reads) keep theirs.
"""

from __future__ import annotations

from typing import Any

from kubernetes import client
from kubernetes import config as kube_config

#: Seconds to connect and seconds per read of one API call, unless the call sets its own.
DEFAULT_API_TIMEOUT = 30.0


class TimeoutApiClient(client.ApiClient):
    """An ``ApiClient`` whose calls without ``_request_timeout`` get ``(timeout, timeout)``."""

    def __init__(self, configuration: client.Configuration | None = None, *, timeout: float) -> None:
        if not timeout > 0:
            raise ValueError(f"API request timeout must be positive, got {timeout!r}")
        super().__init__(configuration)
        self.request_timeout = (timeout, timeout)

    def call_api(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("_request_timeout") is None:
            kwargs["_request_timeout"] = self.request_timeout
        return super().call_api(*args, **kwargs)


def load_api_client(
    timeout: float = DEFAULT_API_TIMEOUT,
    pool_size: int = 16,
    *,
    config_file: str | None = None,
    context: str | None = None,
) -> TimeoutApiClient:
    """In-cluster credentials when running in a pod, else KUBECONFIG / ~/.kube/config; a kubeconfig
    file or context named (the CLI's --kubeconfig, --context) is always used instead, as kubectl does."""
    if config_file or context:
        kube_config.load_kube_config(config_file=config_file, context=context)  # type: ignore[no-untyped-call,unused-ignore]
    else:
        try:
            kube_config.load_incluster_config()  # type: ignore[no-untyped-call,unused-ignore]
        except kube_config.ConfigException:
            kube_config.load_kube_config()  # type: ignore[no-untyped-call,unused-ignore]
    configuration = client.Configuration.get_default_copy()
    configuration.connection_pool_maxsize = pool_size
    return TimeoutApiClient(configuration, timeout=timeout)
