{{- define "vgpu-dra.name" -}}{{ .Chart.Name }}{{- end -}}
{{- define "vgpu-dra.fullname" -}}{{ printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" }}{{- end -}}
{{- define "vgpu-dra.serviceAccountName" -}}{{ .Values.serviceAccount.name | default (include "vgpu-dra.fullname" .) }}{{- end -}}
{{- define "vgpu-dra.image" -}}{{ printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}{{- end -}}
{{- define "vgpu-dra.labels" -}}
app.kubernetes.io/name: {{ include "vgpu-dra.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}
{{- define "vgpu-dra.selectorLabels" -}}
app.kubernetes.io/name: {{ include "vgpu-dra.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: kubelet-plugin
{{- end -}}
