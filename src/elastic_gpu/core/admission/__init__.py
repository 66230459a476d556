"""Admission: is a pod acceptable, and what patch completes it? Pure decisions, no I/O.

- `admit` (the entry) reads a pod and the cluster facts and returns a `Verdict`;
- `rules`: what a pod must be, each broken rule a `Refusal`;
- `facts`: what admission knows of the cluster (`ClusterFacts`, made from Nodes);
- `claim_plan`: what the ElasticGPUClaims a pod names mean for its containers;
- `jsonpatch`: the operations the mutators make, and applying them;
- `mutation`: the one interface of every mutator; `mutators/`: one module per feature that
  owns one (claims, resources, MIG adapter, budgets; the quota's is `core.quota`);
- `chain`: their order, and the webhook's choice of them.
"""
