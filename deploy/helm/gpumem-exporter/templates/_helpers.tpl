{{/* The chart's name, at most 63 characters (a DNS label). */}}
{{- define "gpumem-exporter.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The name of every namespaced object: the release's name, with the
chart's appended unless the release's name already contains it. */}}
{{- define "gpumem-exporter.fullname" -}}
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

{{- define "gpumem-exporter.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Selector labels: stable across upgrades (a DaemonSet's selector is
immutable). */}}
{{- define "gpumem-exporter.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpumem-exporter.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "gpumem-exporter.labels" -}}
helm.sh/chart: {{ include "gpumem-exporter.chart" . }}
{{ include "gpumem-exporter.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gpumem
{{- end }}

{{/* The labels kube-prometheus-stack selects ServiceMonitors and
PrometheusRules by. */}}
{{- define "gpumem-exporter.prometheusLabels" -}}
{{- with .Values.kubePrometheusStack.release }}
release: {{ . | quote }}
{{- end }}
{{- end }}

{{- define "gpumem-exporter.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "gpumem-exporter.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "gpumem-exporter.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* The CSI node plugin's directory on the host, where its socket lives. */}}
{{- define "gpumem-exporter.csiPluginDir" -}}
{{- printf "%s/plugins/%s" (trimSuffix "/" .Values.csi.kubeletDir) .Values.csi.driverName }}
{{- end }}

{{/* csi-node is a native sidecar (an init container with restartPolicy
Always), which Kubernetes 1.29 turned on by default. An older API server
would drop the field and wait forever for the "init" container to finish. */}}
{{- define "gpumem-exporter.checkKubeVersion" -}}
{{- if and .Values.csi.enabled (semverCompare "<1.29-0" .Capabilities.KubeVersion.Version) }}
{{- fail (printf "csi.enabled needs Kubernetes 1.29 or later (native sidecar containers), and Helm says the cluster is %s. If it is newer: helm install and helm upgrade read the version from the cluster, but helm template and helm lint assume an old default unless told, so add --kube-version with the cluster's version (kubectl version prints it), e.g. helm template ... --kube-version 1.34. If it is older: upgrade it, or set csi.enabled=false (workloads then mount a hostPath and need a privileged namespace)" .Capabilities.KubeVersion.Version) }}
{{- end }}
{{- end }}
