{{/*
Names and labels shared by every template. Object names are truncated to 63 characters because
Service names and label values may not be longer.
*/}}

{{- define "bindery.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "bindery.fullname" -}}
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

{{/* The reference resource manager's object names: <fullname>-rm. */}}
{{- define "bindery.refrm.fullname" -}}
{{- printf "%s-rm" (include "bindery.fullname" . | trunc 60 | trimSuffix "-") }}
{{- end }}

{{/* The metrics Service: <fullname>-metrics, a DNS label (at most 63 characters). */}}
{{- define "bindery.metrics.fullname" -}}
{{- printf "%s-metrics" (include "bindery.fullname" . | trunc 55 | trimSuffix "-") }}
{{- end }}

{{/* The operators' leader-election Lease (in the release namespace). */}}
{{- define "bindery.leaseName" -}}
{{- .Values.operator.leaderElection.leaseName | default (include "bindery.fullname" .) }}
{{- end }}

{{- define "bindery.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "bindery.labels" -}}
helm.sh/chart: {{ include "bindery.chart" . }}
app.kubernetes.io/name: {{ include "bindery.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: bindery
{{- end }}

{{/* Selector labels of the operator pods. */}}
{{- define "bindery.selectorLabels" -}}
app.kubernetes.io/name: {{ include "bindery.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{/* Selector labels of the reference resource manager pods. */}}
{{- define "bindery.refrm.selectorLabels" -}}
app.kubernetes.io/name: {{ include "bindery.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: reference-rm
{{- end }}

{{- define "bindery.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "bindery.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false: name the existing ServiceAccount the operator runs as" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "bindery.image" -}}
{{- $repo := .Values.image.repository }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" $repo .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" $repo (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* Name of the Secret holding the reference RM's bearer token. */}}
{{- define "bindery.refrm.tokenSecretName" -}}
{{- default (printf "%s-token" (include "bindery.refrm.fullname" .)) .Values.referenceRM.token.existingSecret }}
{{- end }}

{{/* In-cluster URL of the reference RM. */}}
{{- define "bindery.refrm.endpoint" -}}
{{- $scheme := ternary "https" "http" .Values.referenceRM.tls.enabled }}
{{- printf "%s://%s.%s.svc:%d" $scheme (include "bindery.refrm.fullname" .) .Release.Namespace (int .Values.referenceRM.port) }}
{{- end }}

{{/* Every scheduler name the values configure (for NOTES.txt). */}}
{{- define "bindery.schedulerNames" -}}
{{- $names := list }}
{{- if and .Values.referenceRM.enabled .Values.referenceRM.createResourceManager }}
{{- $names = concat $names .Values.referenceRM.schedulerNames }}
{{- end }}
{{- range .Values.resourceManagers }}
{{- $names = concat $names (.spec.schedulerNames | default list) }}
{{- end }}
{{- $names | uniq | join ", " }}
{{- end }}

{{- /*
A ResourceManager spec with each namespace's share of its budgets (values namespaceShare), unless
the spec sets them itself: maxInFlightPerNamespace and maxBindingWaitsPerNamespace, the fraction
of maxInFlight and maxBindingWaits (their CRD defaults when unset), rounded up, at least 1.
Called with (dict "spec" <spec> "share" .Values.namespaceShare); the spec is copied, not changed.
*/ -}}
{{- define "bindery.withNamespaceShares" -}}
{{- $spec := deepCopy .spec -}}
{{- $share := .share | default dict -}}
{{- if and $share.inFlight (not (hasKey $spec "maxInFlightPerNamespace")) -}}
{{- $_ := set $spec "maxInFlightPerNamespace" (max 1 (ceil (mulf (default 256 $spec.maxInFlight) $share.inFlight)) | int) -}}
{{- end -}}
{{- if and $share.bindingWaits (not (hasKey $spec "maxBindingWaitsPerNamespace")) -}}
{{- $_ := set $spec "maxBindingWaitsPerNamespace" (max 1 (ceil (mulf (default 64 $spec.maxBindingWaits) $share.bindingWaits)) | int) -}}
{{- end -}}
{{- toYaml $spec -}}
{{- end -}}
