"""Kubernetes adapters: API clients, watch-backed caches, inventory objects."""
