"""A thin Kubernetes layer for controllers: typed API errors, a reflector with a store, a work
queue with per-key backoff, Lease leader election and an Event recorder.

Built on `elastic_gpu.kube.transport` (aiohttp + msgspec, configured from a kubeconfig by
lightkube's parser), the client the scheduler's API worker already uses; see
docs/architecture.md, "Library choices".
"""
