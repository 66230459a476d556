"""Claims: the pure decisions of the Elastic GPU API (binding, provisioning, reclaiming). No I/O.

The controller (`elastic_gpu.controller.claims`, an adapter) feeds these functions what the
API says and carries out what they return:

- `binding.decide(claim, classes, egpus, consumer_node)` -> a `decisions` outcome;
- `provisioning.provision(decision, claim, cls, engine)` -> the ElasticGPU to create, placed by
  the same engine that places pods, or `Pending` with the engine's reason;
- `release.decide_release(egpu, claim)` -> `Keep`, `MarkReleased` (Retain) or
  `DeleteElasticGPU` (Delete) once the claim it was bound to is gone.

The objects they read are in `model`; what an ElasticGPU holds (its assignment, checked against
the node's inventory) in `inventory`; pods that name claims in `pods`.
"""
