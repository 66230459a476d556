"""Elastic GPU: Kubernetes-native GPU sharing, scheduling, isolation and accounting."""

__version__ = "0.1.0"
