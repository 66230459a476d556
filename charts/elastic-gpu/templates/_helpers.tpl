{{/* The one image every component runs. */}}
{{- define "egpu.image" -}}
{{- $img := .Values.image -}}
{{- $tag := $img.tag | default .Chart.AppVersion -}}
{{- if $img.registry -}}{{ printf "%s/%s:%s" $img.registry $img.repository $tag }}{{- else -}}{{ printf "%s:%s" $img.repository $tag }}{{- end -}}
{{- end -}}

{{- define "egpu.labels" -}}
app.kubernetes.io/part-of: elastic-gpu
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Fixed object names: one Elastic GPU per cluster (its CRDs, webhook configurations and
     ClusterRoles are cluster-wide), and the names the components and RBAC resourceNames
     expect (the rbac.yaml files under deploy/). */}}
{{- define "egpu.schedulerURL" -}}
{{- printf "https://elastic-gpu-scheduler.%s.svc:%d" .Release.Namespace (int .Values.scheduler.port) -}}
{{- end -}}

{{- define "egpu.podCommon" -}}
{{- with .root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* Non-root, read-only, no capabilities: every container but the agent's. */}}
{{- define "egpu.restricted" -}}
securityContext:
  runAsNonRoot: true
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  capabilities: {drop: [ALL]}
  seccompProfile: {type: RuntimeDefault}
{{- end -}}

{{/*
The controllers' ControllerConfig (docs/config.md): the settings the values make, with
controller.config merged over them (a key of controller.config wins, as scheduler.config's
do in the extender's file).
*/}}
{{- define "egpu.controllerConfig" -}}
{{- $v := .Values.controller -}}
{{- $election := dict "leaseNamespace" .Release.Namespace "leaseName" "egpu-controller" "leaseDurationSeconds" $v.leaseDuration "renewDeadlineSeconds" $v.renewDeadline "retryPeriodSeconds" $v.retryPeriod -}}
{{- $settings := dict "workers" $v.workers "leaderElection" $election "metrics" (dict "host" "0.0.0.0" "port" $v.metricsPort) -}}
{{- if $v.extenderURL -}}
{{- $_ := set $settings "extender" (dict "url" $v.extenderURL) -}}
{{- else if .Values.scheduler.enabled -}}
{{- $_ := set $settings "extender" (dict "url" (include "egpu.schedulerURL" .) "caFile" "/etc/elastic-gpu/tls/ca.crt" "clientCertFile" "/etc/elastic-gpu/tls/client.crt" "clientKeyFile" "/etc/elastic-gpu/tls/client.key") -}}
{{- end -}}
{{- if not (kindIs "invalid" .Values.budgets.defaultGPUHours) -}}
{{- $_ := set $settings "budgets" (dict "defaultGPUHours" .Values.budgets.defaultGPUHours "defaultPeriod" .Values.budgets.defaultPeriod) -}}
{{- end -}}
{{- if $v.migDynamic.enabled -}}
{{- $_ := set $settings "mig" (dict "dynamic" (dict "enabled" true "mergeCooldownSeconds" $v.migDynamic.mergeCooldownSeconds)) -}}
{{- end -}}
{{- toYaml (merge (deepCopy ($v.config | default dict)) $settings) -}}
{{- end -}}
