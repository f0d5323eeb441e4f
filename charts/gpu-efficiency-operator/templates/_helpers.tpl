{{/* Chart name, truncated to the 63 characters a label allows. */}}
{{- define "gpueff.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name, as `helm create` makes it: fullnameOverride; else <release> when it already contains
     the chart name (release gpu-efficiency-operator); else <release>-<chart>. One rule more, so the
     documented `helm install gpu-efficiency ...` does not double the name
     (gpu-efficiency-gpu-efficiency-operator): a release name that the chart name starts with, up to
     a dash, gives the chart name (gpu-efficiency-operator). */}}
{{- define "gpueff.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else if hasPrefix (printf "%s-" .Release.Name) $name }}
{{- $name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Name of the agent objects (DaemonSet, Service, ClusterRole). */}}
{{- define "gpueff.agentFullname" -}}
{{- printf "%s-agent" (include "gpueff.fullname" . | trunc 57 | trimSuffix "-") }}
{{- end }}

{{- define "gpueff.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object. */}}
{{- define "gpueff.labels" -}}
helm.sh/chart: {{ include "gpueff.chart" . }}
{{ include "gpueff.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gpu-efficiency-operator
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "gpueff.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpueff.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Labels of the operator objects (component operator). */}}
{{- define "gpueff.operatorLabels" -}}
{{ include "gpueff.labels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "gpueff.operatorSelectorLabels" -}}
{{ include "gpueff.selectorLabels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{/* Labels of the agent objects. The operator finds its agents by app.kubernetes.io/component=node-agent
     in its own namespace (gpu_efficiency.sources.metrics.agent.AGENT_POD_SELECTOR): keep them in step. */}}
{{- define "gpueff.agentLabels" -}}
{{ include "gpueff.labels" . }}
app.kubernetes.io/component: node-agent
{{- end }}

{{- define "gpueff.agentSelectorLabels" -}}
{{ include "gpueff.selectorLabels" . }}
app.kubernetes.io/component: node-agent
{{- end }}

{{/* ServiceAccount names. */}}
{{- define "gpueff.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "gpueff.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "gpueff.agentServiceAccountName" -}}
{{- if .Values.agent.serviceAccount.create }}
{{- default (include "gpueff.agentFullname" .) .Values.agent.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.agent.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Image reference: repository@digest when a digest is set, else repository:tag (tag defaults to appVersion). */}}
{{- define "gpueff.imageRef" -}}
{{- $repo := index . 0 }}{{- $tag := index . 1 }}{{- $digest := index . 2 }}
{{- if $digest }}
{{- printf "%s@%s" $repo $digest }}
{{- else }}
{{- printf "%s:%s" $repo $tag }}
{{- end }}
{{- end }}

{{- define "gpueff.image" -}}
{{- include "gpueff.imageRef" (list .Values.image.repository (default .Chart.AppVersion .Values.image.tag) .Values.image.digest) }}
{{- end }}

{{- define "gpueff.agentImage" -}}
{{- $a := .Values.agent.image }}
{{- $repo := default .Values.image.repository $a.repository }}
{{- $tag := default (default .Chart.AppVersion .Values.image.tag) $a.tag }}
{{- $digest := $a.digest }}
{{- if and (not $a.repository) (not $a.tag) (not $digest) }}{{ $digest = .Values.image.digest }}{{ end }}
{{- include "gpueff.imageRef" (list $repo $tag $digest) }}
{{- end }}

{{/* Namespaces the operator never touches: the release namespace plus the configured ones. */}}
{{- define "gpueff.protectedNamespaces" -}}
{{- $ns := list .Release.Namespace }}
{{- range .Values.operator.protectedNamespaces }}{{ $ns = append $ns . }}{{ end }}
{{- $ns | uniq | join "," }}
{{- end }}

{{/* The workload kinds the operator reclaims (enforce): API group -> resources. The ClusterRole's
     enforce part grants their writes; the "-workloads" admission policy admits on each only our
     annotations, the Kubeflow stop annotation, spec.suspend / spec.active / spec.runPolicy.suspend and
     replicas through /scale. A new owner kind is added here and in the ClusterRole. */}}
{{- define "gpueff.workloadResources" -}}
apps: [deployments, statefulsets, replicasets]
batch: [jobs]
jobset.x-k8s.io: [jobsets]
leaderworkerset.x-k8s.io: [leaderworkersets]
kubeflow.org: [notebooks, pytorchjobs, mpijobs, tfjobs]
ray.io: [rayclusters, rayjobs]
trainer.kubeflow.org: [trainjobs]
kueue.x-k8s.io: [workloads]
{{- end }}

{{/* Every namespace the operator never writes in: Kubernetes' own, the release namespace and the
     configured ones (the operator adds the kube-* namespaces itself too: config.py). */}}
{{- define "gpueff.neverWrittenNamespaces" -}}
{{- $ns := list "kube-system" "kube-public" "kube-node-lease" .Release.Namespace }}
{{- range .Values.operator.protectedNamespaces }}{{ $ns = append $ns . }}{{ end }}
{{- $ns | uniq | toJson }}
{{- end }}

{{/* Checks of value combinations the schema cannot express; fail with a message naming the fields. */}}
{{- define "gpueff.validate" -}}
{{- if and (gt (int .Values.replicaCount) 1) (not .Values.operator.leaderElection) }}
{{- fail (printf "replicaCount=%d needs operator.leaderElection=true: without a leader every replica would act" (int .Values.replicaCount)) }}
{{- end }}
{{- if eq (int .Values.metrics.port) (int .Values.health.port) }}
{{- fail (printf "metrics.port and health.port must differ (both are %d)" (int .Values.metrics.port)) }}
{{- end }}
{{- if or (eq .Values.image.tag "latest") (eq .Values.agent.image.tag "latest") }}
{{- fail "image.tag / agent.image.tag: latest is not allowed, pin a version (or set image.digest)" }}
{{- end }}
{{- if and .Values.prometheus.ca.configMapName .Values.prometheus.ca.secretName }}
{{- fail "set only one of prometheus.ca.configMapName and prometheus.ca.secretName" }}
{{- end }}
{{- if and .Values.prometheus.bearerToken.secretName .Values.prometheus.basicAuth.secretName }}
{{- fail "set only one of prometheus.bearerToken.secretName and prometheus.basicAuth.secretName" }}
{{- end }}
{{- end }}

{{/*
prometheus.headers as GPUEFF_PROMETHEUS_HEADERS: "Name: value" pairs, comma separated, by name.
The headers the operator's HTTP client writes itself are refused here, as the operator would
refuse them at start-up (gpu_efficiency/http_headers.py RESERVED).
*/}}
{{- define "gpueff.prometheusHeaders" -}}
{{- $pairs := list -}}
{{- $reserved := list "authorization" "connection" "content-encoding" "content-length" "content-type" "host" "transfer-encoding" -}}
{{- range $name, $value := . -}}
{{- if has (lower $name) $reserved -}}
{{- fail (printf "prometheus.headers.%s is set by the operator itself (Authorization: use prometheus.bearerToken or prometheus.basicAuth)" $name) -}}
{{- end -}}
{{- $pairs = append $pairs (printf "%s: %s" $name $value) -}}
{{- end -}}
{{- join "," $pairs -}}
{{- end -}}
