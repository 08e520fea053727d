{{/* Names are cut to 63 characters: the limit of a Kubernetes label value and DNS label. */}}
{{- define "txstream.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "txstream.fullname" -}}
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

{{- define "txstream.selectorLabels" -}}
app.kubernetes.io/name: {{ include "txstream.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "txstream.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "txstream.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "txstream.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "txstream.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "txstream.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* The pod is a Spark driver whose executors run as pods in the cluster. */}}
{{- define "txstream.sparkOnK8s" -}}
{{- if hasPrefix "k8s://" .Values.spark.master }}true{{ end }}
{{- end }}

{{/* A checkpoint dir that is a path lives on the checkpoint volume; a URI does not. */}}
{{- define "txstream.checkpointOnVolume" -}}
{{- if hasPrefix "/" .Values.checkpoint.dir }}true{{ end }}
{{- end }}

{{- define "txstream.claimName" -}}
{{- default (printf "%s-checkpoints" (include "txstream.fullname" .)) .Values.checkpoint.persistence.existingClaim }}
{{- end }}
