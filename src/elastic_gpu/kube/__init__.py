"""The package's one Kubernetes client stack: every API request of every component, the CLI
and the sandbox goes through here, and nothing outside imports an HTTP or Kubernetes library.

- `transport`: the REST transport (aiohttp + msgspec, one kept-alive session, paged lists,
  watch streams);
- `kubeconfig`: configuration from a kubeconfig file or the in-cluster service account
  (lightkube's parser, so every client accepts the same files);
- `paths`: every API path, built from checked names; `errors`: the API server's answers as
  typed errors (NotFound, AlreadyExists, Conflict, TooManyRequests...);
- `client.KubeClient`: JSON verbs (async); `sync.SyncKubeClient`: the same verbs for threads
  (the agent, the sandbox, the CLI), one event loop owning the client;
- `informer`: list+watch into a store with handlers (the only watch loop); `workqueue`:
  per-key work with backoff; `leaderelection`: Lease leader election; `events`: Event
  recording;
- `crds`: installing CRDs until they are served; `apply`: create-or-update of an installer's
  objects.

See docs/architecture.md, "Library choices" and "One client stack".
"""
