{{/*
The chart name, overridable with nameOverride.
*/}}
{{- define "narad.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The full name of the release's resources: fullnameOverride, else RELEASE-NAME
(RELEASE alone when it already contains the chart name), at most 63 characters.
*/}}
{{- define "narad.fullname" -}}
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

{{/*
chart label: NAME-VERSION.
*/}}
{{- define "narad.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels of every resource.
*/}}
{{- define "narad.labels" -}}
helm.sh/chart: {{ include "narad.chart" . }}
{{ include "narad.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: narad
{{- end }}

{{/*
Labels naming the release's narad (every resource carries them).
*/}}
{{- define "narad.selectorLabels" -}}
app.kubernetes.io/name: {{ include "narad.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
Labels that select the server's pods only (not the migration Job's).
*/}}
{{- define "narad.serverSelectorLabels" -}}
{{ include "narad.selectorLabels" . }}
app.kubernetes.io/component: server
{{- end }}

{{/*
The image reference.
*/}}
{{- define "narad.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{/*
The Secret the pods read: existingSecret, else the chart's.
*/}}
{{- define "narad.secretName" -}}
{{- .Values.secret.existingSecret | default (include "narad.fullname" .) }}
{{- end }}

{{/*
The Secret the migration Job reads: existingSecret, else a hook Secret made
just before the Job (the chart's own Secret does not exist yet at pre-install).
*/}}
{{- define "narad.migrationSecretName" -}}
{{- if .Values.secret.existingSecret }}
{{- .Values.secret.existingSecret }}
{{- else }}
{{- printf "%s-migrate" (include "narad.fullname" . | trunc 55 | trimSuffix "-") }}
{{- end }}
{{- end }}

{{/*
The data of a chart-made Secret: only the values that are set (narad takes an
empty variable as set).
*/}}
{{- define "narad.secretData" -}}
{{- with .Values.secret.databaseUrl }}
{{ $.Values.secret.keys.databaseUrl }}: {{ . | b64enc | quote }}
{{- end }}
{{- with .Values.secret.jwtHs256Secret }}
{{ $.Values.secret.keys.jwtHs256Secret }}: {{ . | b64enc | quote }}
{{- end }}
{{- end }}

{{/*
Pod-level settings shared by the Deployment and the migration Job.
*/}}
{{- define "narad.podCommon" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.serviceAccountName }}
serviceAccountName: {{ . }}
{{- end }}
automountServiceAccountToken: false
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- with .Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
