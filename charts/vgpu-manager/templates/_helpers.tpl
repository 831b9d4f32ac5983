{{- define "vgpu.name" -}}{{ .Chart.Name }}{{- end -}}
{{- define "vgpu.fullname" -}}{{ printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" }}{{- end -}}
{{- define "vgpu.image" -}}{{ printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}{{- end -}}
{{- define "vgpu.labels" -}}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}
{{- define "vgpu.selector" -}}
app.kubernetes.io/name: {{ .name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
{{- end -}}
