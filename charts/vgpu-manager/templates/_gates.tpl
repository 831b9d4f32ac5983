{{/*
Feature gates, from files/gates.json (generated from vgpu-gates by bins/tests/chart_gates.rs).

vgpu.gates.render: the map at a component's values path as a `--feature-gates` / FEATURE_GATES value
("A=true,B=false", names sorted). Unknown names never get here: values.schema.json allows only the
component's gate names.
  include "vgpu.gates.render" (dict "gates" .Values.kubeletPlugin.containers.plugin.featureGates)

vgpu.gates.violations: the component's Requires and Mutually-exclusive rules checked against the effective
values (the chart's defaults, then the map), as a JSON list of the binaries' messages ("<rule>; fix: <fix>",
in rule order, the fix offering the gates the map does not set, as vgpu-gates does).
  include "vgpu.gates.violations" (dict "root" $ "component" "kubelet-plugin" "gates" $map)

vgpu.gates.check: fails the install with every violation, worded as the binary's start-up error.
*/}}
{{- define "vgpu.gates.render" -}}
{{- $parts := list -}}
{{- range $name := (keys (.gates | default dict) | sortAlpha) -}}
{{- $parts = append $parts (printf "%s=%t" $name (index $.gates $name)) -}}
{{- end -}}
{{- join "," $parts -}}
{{- end -}}

{{- define "vgpu.gates.violations" -}}
{{- $spec := index (.root.Files.Get "files/gates.json" | fromJson) .component -}}
{{- $set := .gates | default dict -}}
{{- $eff := dict -}}
{{- $locked := dict -}}
{{- range $spec.gates -}}
{{- $_ := set $eff .name (hasKey $set .name | ternary (index $set .name) .default) -}}
{{- $_ := set $locked .name .locked -}}
{{- end -}}
{{- $out := list -}}
{{- range $spec.rules -}}
{{- $msg := "" -}}
{{- $candidates := list -}}
{{- if eq .kind "requires" -}}
{{- if and (index $eff .gate) (not (index $eff .other)) -}}
{{- $msg = printf "feature gate %s requires %s to also be enabled" .gate .other -}}
{{- $candidates = list (list .other true) (list .gate false) -}}
{{- end -}}
{{- else -}}
{{- if and (index $eff .gate) (index $eff .other) -}}
{{- $msg = printf "feature gate %s is currently mutually exclusive with %s" .gate .other -}}
{{- $candidates = list (list .gate false) (list .other false) -}}
{{- end -}}
{{- end -}}
{{- if $msg -}}
{{- $settable := list -}}
{{- range $candidates -}}{{- if not (index $locked (index . 0)) -}}{{- $settable = append $settable . -}}{{- end -}}{{- end -}}
{{- $implicit := list -}}
{{- range $settable -}}{{- if not (hasKey $set (index . 0)) -}}{{- $implicit = append $implicit . -}}{{- end -}}{{- end -}}
{{- $chosen := empty $implicit | ternary $settable $implicit -}}
{{- $opts := list -}}
{{- range $chosen -}}{{- $opts = append $opts (printf "%s=%t" (index . 0) (index . 1)) -}}{{- end -}}
{{- $fix := empty $opts | ternary "no fix: the gates involved are locked" (printf "set %s" (join " or " $opts)) -}}
{{- $out = append $out (printf "%s; fix: %s" $msg $fix) -}}
{{- end -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{- define "vgpu.gates.check" -}}
{{- $violations := include "vgpu.gates.violations" . | fromJsonArray -}}
{{- if $violations -}}
{{- fail (printf "feature gate validation failed for %s:\n  %s" .component (join "\n  " $violations)) -}}
{{- end -}}
{{- end -}}

{{/* vgpu.gates.on: "true" when `gate` is on for the component (the map, else the default); empty otherwise. */}}
{{- define "vgpu.gates.on" -}}
{{- $spec := index (.root.Files.Get "files/gates.json" | fromJson) .component -}}
{{- $set := .gates | default dict -}}
{{- $value := false -}}
{{- range $spec.gates -}}{{- if eq .name $.gate -}}{{- $value = .default -}}{{- end -}}{{- end -}}
{{- if hasKey $set .gate -}}{{- $value = index $set .gate -}}{{- end -}}
{{- if $value -}}true{{- end -}}
{{- end -}}
