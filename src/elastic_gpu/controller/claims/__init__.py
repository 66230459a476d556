"""The claims controller: binder, provisioner trigger, reclaimer and claim-protection finalizer.

Per claim (key `claim:<namespace>/<name>`):
1. a deleted claim (deletionTimestamp) keeps its finalizer while `core.claims.pods.pods_using` lists
   an unfinished pod naming it (Event `WaitingForPods`), then the finalizer is removed;
2. otherwise the finalizer is added first;
3. `core.claims.binding.decide` on the caches; `Bind` writes the ElasticGPU's claimRef, then
   its phase Bound and the claim's spec.elasticGPUName in parallel, then the claim's status
   (a crash between any two writes is
   finished by the next reconcile, which decides Bind again); `Provision` asks the extender
   (`POST /provision`), which creates `egpu-<uid>` pre-bound to the claim, and binds it at
   once; `Pending` / `Lost` go to status with an Event.
Per ElasticGPU (key `egpu:<name>`): `core.claims.release.decide_release` once its claim is gone
(confirmed by a live GET, never from a cache alone) and no pod that has not stopped uses its
cards (`core.claims.pods.pods_holding`, from the cache and then a live list of the claim's
namespace; Event `WaitingForPods`): status Released (Retain) or deleted.

Writes happen only when something changes (status compared before patching), carry the
object's resourceVersion (a stale cache gets 409 and a requeue, never a lost update), and
Events are de-duplicated by the recorder. Unschedulable claims are retried with backoff and
at once when capacity may have freed (a GPU pod finished or deleted, an ElasticGPU deleted).

Pre-created ElasticGPUs (not pre-bound to a claim's uid, not bound yet) are checked against
the GPUDevice inventory first (`core.claims.inventory.inventory_problem`: node, card indexes, uuids and
MIG instances): `Available`, or `Failed` with the reason (a claim never binds to it); checked
again whenever a GPUDevice's spec changes.

Its parts, one reason each: `caches.py` (the informers, the indexes kept from their events and
which keys each event enqueues), `binder.py` (a claim's reconcile: protection, decide,
provisioning, binding, status writes), `reclaimer.py` (an ElasticGPU's reconcile: the
inventory check and the release), `metrics.py` (the phase gauges), `controller.py` (the work
queue's workers, which route each key to its reconcile).
"""

