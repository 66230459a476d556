"""The kube-scheduler extender: filter, prioritize, bind and preempt with the core engine."""
