"""The components' settings files as a wire contract: one strict YAML reader (`strict_yaml`)
and one loader (`loader`) that checks the version header (`apiVersion: elasticgpu.io/v1alpha1`
and the kind: AgentConfig, SchedulerConfig, ControllerConfig, WebhookConfig, SandboxCluster)
and turns every refusal into one `ConfigError` naming field, value and rule; one merge rule
(`merge`: a flag given beats the file, the file beats the default; a renamed key's old
spelling read with a warning); and the `leaderElection:` section the extender and the
controllers share (`leaderelection`).

The settings models themselves stay with the component that reads them (`agent/config.py`,
`scheduler/config.py`, `controller/config.py`): each names its fields and ranges beside the
code they drive, and hands its model and kind to `loader.load_settings`.
"""
