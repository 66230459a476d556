"""GPU vendor backends: the interface (`base`), NVIDIA over NVML (`nvml`), the YAML-described
fake (`fake`), the isolation settings a backend's cards need (`isolation`), and the registry
that turns a config's `backend:` into one (`registry`). A new vendor is one module here and one
registry entry; `tests/unit/agent/test_backend_conformance.py` runs it through the contract."""
