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

{{/* Kafka TLS material (kafka.security.tls.existingSecret) is mounted here when TLS is on. */}}
{{- define "txstream.kafkaTlsDir" -}}/etc/kafka-tls{{- end }}

{{- define "txstream.liveTlsDir" -}}/etc/txstream-live-tls{{- end }}

{{- define "txstream.kafkaTlsMounted" -}}
{{- if and (hasSuffix "SSL" .Values.kafka.security.protocol) .Values.kafka.security.tls.existingSecret }}true{{ end }}
{{- end }}

{{/* The pipeline config's `kafka_security` from `kafka.security`, as YAML; empty for
PLAINTEXT. Nothing secret: secrets reach the process through the environment and files. */}}
{{- define "txstream.kafkaSecurity" -}}
{{- $security := .Values.kafka.security }}
{{- $_ := "" }}
{{- if ne $security.protocol "PLAINTEXT" }}
{{- $block := dict "security_protocol" $security.protocol }}
{{- if hasPrefix "SASL_" $security.protocol }}
{{- $_ = set $block "sasl_mechanism" $security.sasl.mechanism }}
{{- if eq $security.sasl.mechanism "OAUTHBEARER" }}
{{- $oauth := $security.sasl.oauthbearer }}
{{- $_ = set $block "oauthbearer_token_endpoint_url" $oauth.tokenEndpointUrl }}
{{- $_ = set $block "oauthbearer_client_id" $oauth.clientId }}
{{- if $oauth.scope }}
{{- $_ = set $block "oauthbearer_scope" $oauth.scope }}
{{- end }}
{{- end }}
{{- end }}
{{- if hasSuffix "SSL" $security.protocol }}
{{- $_ = set $block "ssl_endpoint_identification" $security.tls.endpointIdentification }}
{{- if include "txstream.kafkaTlsMounted" . }}
{{- $dir := include "txstream.kafkaTlsDir" . }}
{{- $tls := $security.tls }}
{{- if $tls.caKey }}
{{- $_ = set $block "ssl_ca_file" (printf "%s/%s" $dir $tls.caKey) }}
{{- end }}
{{- if $tls.certificateKey }}
{{- $_ = set $block "ssl_cert_file" (printf "%s/%s" $dir $tls.certificateKey) }}
{{- end }}
{{- if $tls.keyKey }}
{{- $_ = set $block "ssl_key_file" (printf "%s/%s" $dir $tls.keyKey) }}
{{- end }}
{{- end }}
{{- end }}
{{- toYaml $block }}
{{- end }}
{{- end }}
