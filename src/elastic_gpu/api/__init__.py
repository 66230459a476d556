"""Wire contracts, no I/O: CRD schemas and readers of every kind, component configs and their
strict loader, and the readers of API facts (a Node's GPUs, a pod's assignment, whether a pod
has stopped) that every component uses."""
