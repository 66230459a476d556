"""The MIG adapter (docs/mig-adapter.md, DESIGN.md 7.3): pods pending for a MIG profile move to
a compatible free one, and back when theirs frees; every move recorded in a MIGSubstitution.

One level-triggered round (a single work-queue key, so rounds never overlap) reads the caches
(pods, Nodes, GPUDevices, MIGSubstitutions) and decides with the pure functions of `core.mig`:

0. each rule is checked alone (`core.mig.rules.check_rule`): one the adapter did not write (no
   `app.kubernetes.io/managed-by` label of its own), or one it cannot read or verify (savedPod
   missing or malformed, the recorded uid or digest missing or not matching), is not carried
   out: `Valid=False` with the reason in its status and a Warning Event; the rest go on;
1. bare pods' rules are made true again (`core.mig.bare.bare_rule_step`): a pod deleted but not
   re-created (a controller killed between the two) is created from the rule's saved pod, a
   move or a return that stopped before its delete goes on, rules nothing refers to go;
2. pods Pending (PodScheduled False, Unschedulable) for one MIG instance in a namespace the
   configuration governs get `plan_substitutions` over the free instances (the Nodes' GPUDevices
   less what the pods there hold by their assignments, less the instances reserved by moves
   in flight): a move writes the rule first (with the saved pod for a bare pod), then deletes
   the pod (uid precondition); a bare pod is created again from the rule at once, an owner's
   replacement is rewritten by the webhook by the rule. `NoCompatibleProfileFree` is a
   Warning Event on the pod;
3. moved pods go back by `move_back` under the configured policy: an owner's pod has its
   rule deleted, then the pod (the replacement asks the original profile); a bare pod's rule
   is marked returning, the pod deleted and created as written, the rule deleted;
4. owner rules no unfinished pod refers to, older than the grace, with no move in flight,
   are deleted.

Ordering with the webhook: the webhook reads a MIG pod's rules from the API (a quorum list of
the pod's namespace) at admission, so a rule written (201) before the pod is deleted is seen by
the admission of its replacement, which is created after the delete (docs/mig-adapter.md,
"Ordering").

Its parts, one reason each: `controller.py` (the informers, the round and what it reads off
the caches), `bare.py` (step 1), `substitution.py` (step 2), `moveback.py` (step 3),
`writes.py` (the rule and pod writes every step makes, each told in an Event), `objects.py`
(what the adapter reads off a pod or a rule), `state.py` (what it remembers between rounds:
reservations, repairs, what it told), `metrics.py`.
"""
