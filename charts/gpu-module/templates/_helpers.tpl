{{- define "gpum.image" -}}{{ printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}{{- end -}}
{{- define "gpum.labels" -}}
app.kubernetes.io/part-of: gpu-module
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}
{{- define "gpum.rbac" -}}
{{- /* ServiceAccount + ClusterRole + binding: dict "root" $ "name" N "rules" (list ...) */ -}}
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {{ .name }}
  namespace: {{ .root.Release.Namespace }}
  labels: {{- include "gpum.labels" .root | nindent 4 }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: {{ .name }}
  labels: {{- include "gpum.labels" .root | nindent 4 }}
rules: {{- toYaml .rules | nindent 2 }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: {{ .name }}
  labels: {{- include "gpum.labels" .root | nindent 4 }}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: {{ .name }}}
subjects:
  - {kind: ServiceAccount, name: {{ .name }}, namespace: {{ .root.Release.Namespace }}}
{{- end -}}
