{{/*
Names and labels.
*/}}
{{- define "rlhf-exporter.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "rlhf-exporter.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "rlhf-exporter.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "rlhf-exporter.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rlhf-exporter.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "rlhf-exporter.labels" -}}
helm.sh/chart: {{ include "rlhf-exporter.chart" . }}
{{ include "rlhf-exporter.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: rlhf-exporter
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "rlhf-exporter.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- if not $tag }}
{{- fail "image.tag is empty and the chart's appVersion is unknown here (Helm older than 3.9?): set image.tag" }}
{{- end }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}

{{/*
The port name of the exporter container: "metrics" in the standalone Deployment, and
sidecar.portName in Ray pods (KubeRay already names Ray's own port 8080 "metrics").
*/}}
{{- define "rlhf-exporter.portName" -}}
{{- if eq .Values.mode "standalone" }}metrics{{ else }}{{ .Values.sidecar.portName }}{{ end }}
{{- end }}

{{/*
The values (and appVersion) of this chart for the sidecar helpers, as YAML, called with
(dict "root" $ "chart" NAME): `root` is the caller's top context, this chart's own or that of a
parent chart that depends on this one (whose values hold this chart's under its name or alias,
defaults included); `chart` is that name or alias (default "rlhf-exporter").
*/}}
{{- define "rlhf-exporter.context" -}}
{{- $chart := default "rlhf-exporter" .chart }}
{{- if and (eq .root.Chart.Name "rlhf-exporter") (hasKey .root.Values "sidecar") }}
{{- toYaml (dict "Values" .root.Values "Chart" (dict "AppVersion" .root.Chart.AppVersion)) }}
{{- else if hasKey .root.Values $chart }}
{{- $appVersion := "" }}
{{- with .root.Subcharts }}{{ with index . $chart }}{{ $appVersion = .Chart.AppVersion }}{{ end }}{{ end }}
{{- toYaml (dict "Values" (index .root.Values $chart) "Chart" (dict "AppVersion" $appVersion)) }}
{{- else }}
{{- fail (printf "rlhf-exporter.sidecar: chart %q is not a dependency of %q; add it to Chart.yaml dependencies (or pass \"chart\" with its alias)" $chart .root.Chart.Name) }}
{{- end }}
{{- end }}

{{/*
"rlhf-exporter.sidecar": the exporter container for a KubeRay pod, as one list item for
`containers:`. Call it from the pod template of a RayCluster/RayJob:

  containers:
    - name: ray-head
      ...
    {{- include "rlhf-exporter.sidecar" (dict "root" $ "role" "head") | nindent 4 }}

role "head": reads every verl job's printed steps and Ray's state API from the Ray dashboard on
localhost (sidecar.head.console), verl's JSONL files from a shared logs volume when
sidecar.logsVolume names one (mounted read-only at sidecar.logsMountPath), NVML and the push
endpoint.
role "worker": NVML only, plus the head's state API when sidecar.gpuRoles is on (to match GPU
PIDs to roles); never exports Ray actor counts (the head does), so nothing is counted twice.
*/}}
{{- define "rlhf-exporter.sidecar" -}}
{{- $role := default "head" .role }}
{{- if not (has $role (list "head" "worker")) }}
{{- fail (printf "rlhf-exporter.sidecar: role must be \"head\" or \"worker\", got %q" $role) }}
{{- end }}
{{- $ctx := include "rlhf-exporter.context" . | fromYaml }}
{{- $v := $ctx.Values }}
{{- $env := list }}
{{- if eq $role "head" }}
{{- if not (or $v.sidecar.logsVolume $v.sidecar.head.console $v.push.enabled $v.sidecar.head.nvml) }}
{{- /* the exporter would see no job, and its /readyz would answer 503 for good: the head pod
       would never be ready (docs/serve.md, set-up problems) */}}
{{- fail "the head sidecar would see no verl job (and never become ready): keep sidecar.head.console on (the default), or set sidecar.logsVolume or push.enabled" }}
{{- end }}
{{- if $v.sidecar.logsVolume }}
{{- $env = append $env (dict "name" "RLHF_EXPORTER_VERL_ROOT" "value" $v.sidecar.logsMountPath) }}
{{- end }}
{{- $env = append $env (dict "name" "RLHF_EXPORTER_CONSOLE" "value" (toString $v.sidecar.head.console)) }}
{{- $env = append $env (dict "name" "RLHF_EXPORTER_RAY" "value" "true") }}
{{- $env = append $env (dict "name" "RLHF_EXPORTER_RAY_ADDRESS" "value" $v.sidecar.head.rayAddress) }}
{{- $env = append $env (dict "name" "RLHF_EXPORTER_RAY_ACTORS" "value" "true") }}
{{- $env = append $env (dict "name" "RLHF_EXPORTER_NVML" "value" (toString $v.sidecar.head.nvml)) }}
{{- $env = append $env (dict "name" "RLHF_EXPORTER_GPU_ROLES" "value" (toString (and $v.sidecar.head.nvml $v.sidecar.gpuRoles))) }}
{{- with $v.sidecar.head.engines }}{{ if .volume }}
{{- /* verl's rollout.prometheus.file: every rollout replica of the job (docs/engines.md) */}}
{{- $env = append $env (dict "name" "RLHF_EXPORTER_ENGINE_PROMETHEUS_FILE" "value" (printf "%s/%s" (trimSuffix "/" .mountPath) .file)) }}
{{- end }}{{ end }}
{{- if and $v.push.tokenSecret.name (not $v.push.enabled) }}
{{- /* the token also guards the head's GET /api/v1/windows, which the workers read */}}
{{- $env = append $env (dict "name" "RLHF_EXPORTER_PUSH_TOKEN" "valueFrom" (dict "secretKeyRef" (dict "name" $v.push.tokenSecret.name "key" $v.push.tokenSecret.key))) }}
{{- end }}
{{- else }}
{{- if $v.sidecar.gpuRoles }}
{{- $address := $v.sidecar.worker.rayAddress }}
{{- if not $address }}
{{- /* KubeRay labels every pod with its RayCluster's name and names the head service after it. */}}
{{- $env = append $env (dict "name" "RAY_CLUSTER_NAME" "valueFrom" (dict "fieldRef" (dict "fieldPath" "metadata.labels['ray.io/cluster']"))) }}
{{- $env = append $env (dict "name" "POD_NAMESPACE" "valueFrom" (dict "fieldRef" (dict "fieldPath" "metadata.namespace"))) }}
{{- $address = "http://$(RAY_CLUSTER_NAME)-head-svc.$(POD_NAMESPACE).svc:8265" }}
{{- end }}
{{- $env = append $env (dict "name" "RLHF_EXPORTER_RAY" "value" "true") }}
{{- $env = append $env (dict "name" "RLHF_EXPORTER_RAY_ADDRESS" "value" $address) }}
{{- else }}
{{- $env = append $env (dict "name" "RLHF_EXPORTER_RAY" "value" "false") }}
{{- end }}
{{- $env = append $env (dict "name" "RLHF_EXPORTER_RAY_ACTORS" "value" "false") }}
{{- $env = append $env (dict "name" "RLHF_EXPORTER_NVML" "value" "true") }}
{{- $env = append $env (dict "name" "RLHF_EXPORTER_GPU_ROLES" "value" (toString $v.sidecar.gpuRoles)) }}
{{- with $v.sidecar.worker.gpuWindowsFrom }}
{{- /* GPU time by step window: the head sidecar's recent step windows, read with the push token;
       a template, rendered in the calling chart (e.g. its Service named after .Release.Name) */}}
{{- $env = append $env (dict "name" "RLHF_EXPORTER_GPU_WINDOWS_FROM" "value" (tpl . $.root)) }}
{{- if $v.push.tokenSecret.name }}
{{- $env = append $env (dict "name" "RLHF_EXPORTER_PUSH_TOKEN" "valueFrom" (dict "secretKeyRef" (dict "name" $v.push.tokenSecret.name "key" $v.push.tokenSecret.key))) }}
{{- end }}
{{- end }}
{{- end }}
{{- if and $v.sidecar.nvidiaVisibleDevices (or (eq $role "worker") $v.sidecar.head.nvml) }}
{{- $env = append $env (dict "name" "NVIDIA_VISIBLE_DEVICES" "value" $v.sidecar.nvidiaVisibleDevices) }}
{{- end }}
{{- $mounts := list }}
{{- if and (eq $role "head") $v.sidecar.logsVolume }}
{{- $mounts = append $mounts (dict "name" $v.sidecar.logsVolume "mountPath" $v.sidecar.logsMountPath "readOnly" true) }}
{{- end }}
{{- if eq $role "head" }}
{{- with $v.sidecar.head.engines.volume }}
{{- $mounts = append $mounts (dict "name" . "mountPath" $v.sidecar.head.engines.mountPath "readOnly" true) }}
{{- end }}
{{- end }}
{{- include "rlhf-exporter.container" (dict "ctx" $ctx "name" $v.sidecar.name "portName" $v.sidecar.portName "env" $env "push" (eq $role "head") "mounts" $mounts) }}
{{- end }}

{{/*
"rlhf-exporter.podLabels": the labels a Ray pod template needs so that the PodMonitor (or
Service) selects it: sidecar.podLabels (what a scope=cluster release selects, for every job)
and rlhf-exporter.io/release (what a scope=all release adds, for its own pods only).
Call with (dict "root" $).
*/}}
{{- define "rlhf-exporter.podLabels" -}}
{{- $ctx := include "rlhf-exporter.context" . | fromYaml }}
{{- toYaml (merge (dict "rlhf-exporter.io/release" .root.Release.Name) $ctx.Values.sidecar.podLabels) }}
{{- end }}

{{/*
"rlhf-exporter.shareProcessNamespace": renders `shareProcessNamespace: true` for a pod spec
when sidecar.gpuRoles is on (the sidecar must see the Ray workers' PIDs), and nothing when it
is off (the sidecar is then told gpu_roles=false and claims no attribution). Call with
(dict "root" $).
*/}}
{{- define "rlhf-exporter.shareProcessNamespace" -}}
{{- $ctx := include "rlhf-exporter.context" . | fromYaml }}
{{- if $ctx.Values.sidecar.gpuRoles }}shareProcessNamespace: true{{ end }}
{{- end }}

{{/*
"rlhf-exporter.container": one exporter container (a list item), shared by the sidecar and the
standalone Deployment. Args: ctx (this chart's context), name, portName, env (the mode's
settings as env entries), push (whether this container serves the push endpoint), mounts.
*/}}
{{- define "rlhf-exporter.container" -}}
{{- $v := .ctx.Values }}
{{- $env := list (dict "name" "RLHF_EXPORTER_LISTEN" "value" (printf "0.0.0.0:%d" (int $v.port))) }}
{{- $env = append $env (dict "name" "RLHF_EXPORTER_LOG_FORMAT" "value" $v.logFormat) }}
{{- $env = append $env (dict "name" "RLHF_EXPORTER_LOG_LEVEL" "value" $v.logLevel) }}
{{- $env = concat $env .env }}
{{- $ray := false }}
{{- range .env }}{{ if and (eq .name "RLHF_EXPORTER_RAY") (eq (toString .value) "true") }}{{ $ray = true }}{{ end }}{{ end }}
{{- if and $ray $v.ray.tokenSecret.name }}
{{- /* Ray's token authentication: the cluster's token, sent as `Authorization: Bearer` */}}
{{- $env = append $env (dict "name" "RLHF_EXPORTER_RAY_TOKEN" "valueFrom" (dict "secretKeyRef" (dict "name" $v.ray.tokenSecret.name "key" $v.ray.tokenSecret.key))) }}
{{- end }}
{{- $push := and .push $v.push.enabled }}
{{- $env = append $env (dict "name" "RLHF_EXPORTER_PUSH" "value" (toString $push)) }}
{{- if and $push (not $v.push.tokenSecret.name) }}
{{- fail "push.enabled needs push.tokenSecret.name: a Secret holding the bearer token pushes must carry" }}
{{- end }}
{{- if and $push $v.push.tokenSecret.name }}
{{- $env = append $env (dict "name" "RLHF_EXPORTER_PUSH_TOKEN" "valueFrom" (dict "secretKeyRef" (dict "name" $v.push.tokenSecret.name "key" $v.push.tokenSecret.key))) }}
{{- end }}
{{- $env = append $env (dict "name" "PYTHONDONTWRITEBYTECODE" "value" "1") }}
{{- $env = concat $env $v.extraEnv -}}
- name: {{ .name }}
  image: {{ include "rlhf-exporter.image" .ctx | quote }}
  imagePullPolicy: {{ $v.image.pullPolicy }}
  args:
    - serve
    {{- with $v.extraArgs }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  ports:
    - name: {{ .portName }}
      containerPort: {{ $v.port }}
      protocol: TCP
  env:
    {{- toYaml $env | nindent 4 }}
  {{- with .mounts }}
  volumeMounts:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  livenessProbe:
    httpGet:
      path: /healthz
      port: {{ .portName }}
    {{- toYaml $v.probes.liveness | nindent 4 }}
  readinessProbe:
    httpGet:
      path: /readyz
      port: {{ .portName }}
    {{- toYaml $v.probes.readiness | nindent 4 }}
  resources:
    {{- toYaml $v.resources | nindent 4 }}
  securityContext:
    {{- toYaml $v.securityContext | nindent 4 }}
{{- end }}

{{- define "rlhf-exporter.serviceAccountName" -}}
{{- if .Values.standalone.serviceAccount.create }}
{{- default (include "rlhf-exporter.fullname" .) .Values.standalone.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.standalone.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The pod selector of the Service and the PodMonitor: the Deployment's pods in standalone
mode; in sidecar mode the pods labelled with sidecar.podLabels, and with scope=all only those
of this release (labelled rlhf-exporter.io/release by "rlhf-exporter.podLabels").
*/}}
{{- define "rlhf-exporter.podSelector" -}}
{{- if eq .Values.mode "standalone" }}
{{- include "rlhf-exporter.selectorLabels" . }}
{{- else if eq .Values.scope "all" }}
{{- /* this release's own sidecars only: another job's release in the namespace has its own */}}
{{- toYaml (merge (dict "rlhf-exporter.io/release" .Release.Name) .Values.sidecar.podLabels) }}
{{- else }}
{{- /* scope=cluster: every job's sidecars */}}
{{- toYaml .Values.sidecar.podLabels }}
{{- end }}
{{- end }}
