#!/usr/bin/env bash
# The charts' observability (issue #21 item 5): run by .ci/run after `helm lint`, with VGPU_HELM set to the
# Helm binary (e2e/build-helm.sh); needs python3 with PyYAML and openssl. Takes seconds.
#
# | check | how |
# |---|---|
# | off by default | `helm template` with the default values renders no monitoring object |
# | on, both charts | `helm template` renders the PodMonitors, Services + ServiceMonitors, PrometheusRule, dashboard ConfigMap (grafana_dashboard: "1"), metrics-reader RBAC and token Secret; `helm lint --strict` passes |
# | scrape auth | the monitors present the metrics-reader token; without enableRbac they present none; createTokenSecret false without existingSecret fails with a message |
# | extender HTTPS | by default kube-scheduler calls the extender over HTTPS (HTTP/2) on loopback: --enable-tls with the chart's serving certificate, `enableHTTPS` with the CA, no client certificate, the Secret rendered; `scheduler.schedulerExtender.https=false` renders plain HTTP and no Secret |
# | extender scraping | schedulerExtender.serveMetrics: HTTPS PodMonitor with the extender CA, certificates that verify (serving: DNS + 127.0.0.1, client), auth-delegator binding |
# | rules | `promtool check rules` on files/alerts.yaml and on the rendered PrometheusRule (equal to the file with default values); overrides (disabled, for, severity, additional labels); an unknown alert name fails |
# | alert behaviour | `promtool test rules alerts_test.yaml`: each alert fires on synthetic faulty series, silent on healthy ones |
# | dashboard | valid JSON; unique panel ids, no overlapping panels, all on the ${datasource} variable; every PromQL expression parses (`promtool check rules` on them as recording rules) and returns samples on synthetic series with the labels our code documents (`promtool test rules`, absent(<expr>) empty); the ConfigMap holds it unchanged |
# | metric names | every metric the rules and the dashboard read is exported by our Rust code (monitoring_check.py names) |
# | values schema | files/monitoring.schema.json merged into values.schema.json rejects typos and wrong types, accepts the defaults |
# | gpu-module | off by default (no monitor, rule, dcgm-exporter); adapters serve /metrics with --enable-rbac and the auth-delegator binding; PodMonitor/ServiceMonitor vgpu-adapter with the metrics-reader token (none without enableRbac); dcgm-exporter DaemonSet (image/tag values, NVIDIA nodes) and its monitors; PrometheusRule groups per what is on; `helm lint --strict`; rule names against our code (DCGM_FI_* listed as external); `promtool test rules gpu_module_alerts_test.yaml` |
#
# promtool missing: its checks are skipped, saying so (the rest still runs).
set -euo pipefail
cd "$(dirname "$0")/../.."

helm="${VGPU_HELM:-}"
if [[ -z "$helm" || ! -x "$helm" ]]; then
  echo "charts/tests/monitoring.sh: VGPU_HELM must name the Helm binary (e2e/build-helm.sh prints it)" >&2
  exit 2
fi
python3 -c 'import yaml' 2>/dev/null || { echo "charts/tests/monitoring.sh: python3 with PyYAML (python3-yaml) is required" >&2; exit 2; }
# The interpreter itself (not a version-manager shim): it runs a few dozen times.
py="$(python3 -c 'import sys; print(sys.executable)')"
check=("$py" charts/tests/monitoring_check.py)
kube=(--kube-version 1.37.2)
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fails=0
ok() { echo "  ok: $*"; }
bad() { echo "  FAIL: $*" >&2; fails=$((fails + 1)); }
# Expectations about rendered files are collected, then checked by one `verify` (each file parsed once).
expect() { local IFS=$'\t'; echo "$*" >>"$tmp/expect"; }
verify() {
  if [[ -s "$tmp/expect" ]]; then "${check[@]}" verify "$tmp/expect" || fails=$((fails + 1)); fi
  rm -f "$tmp/expect"
}
expect_kind() { expect kind "$@"; }
expect_no_kind() { expect nokind "$@"; }
expect_field() { expect field "$@"; }
expect_fail() { # message-substring helm-args...
  local want="$1" out
  shift
  if out="$("$helm" template r "$@" "${kube[@]}" 2>&1)"; then
    bad "helm template $* succeeded, expected a failure naming: $want"
  elif grep -qF -- "$want" <<<"$out"; then
    ok "refused ($want)"
  else
    bad "helm template $* failed without naming '$want': $out"
  fi
}

mgr=charts/vgpu-manager
dra=charts/vgpu-manager-dra-driver
on=(--set monitoring.podMonitor.enabled=true --set monitoring.serviceMonitor.enabled=true
  --set monitoring.prometheusRule.enabled=true --set monitoring.dashboard.enabled=true)

echo "=== off by default"
"$helm" template r "$mgr" -n vgpu "${kube[@]}" >"$tmp/mgr-default.yaml"
"$helm" template r "$dra" -n vgpu "${kube[@]}" >"$tmp/dra-default.yaml"
for k in PodMonitor ServiceMonitor PrometheusRule; do
  expect_no_kind "$tmp/mgr-default.yaml" "$k"
  expect_no_kind "$tmp/dra-default.yaml" "$k"
done
if grep -q 'grafana_dashboard' "$tmp/mgr-default.yaml"; then bad "dashboard ConfigMap rendered by default"; else ok "no dashboard ConfigMap"; fi
verify

echo "=== vgpu-manager with monitoring on"
"$helm" template r "$mgr" -n vgpu "${kube[@]}" "${on[@]}" --set monitoring.schedulerExtender.serveMetrics=true \
  >"$tmp/mgr.yaml"
expect_kind "$tmp/mgr.yaml" PodMonitor r-vgpu-manager-device-monitor
expect_kind "$tmp/mgr.yaml" PodMonitor r-vgpu-manager-scheduler-extender
expect_kind "$tmp/mgr.yaml" Service r-vgpu-manager-device-monitor
expect_kind "$tmp/mgr.yaml" ServiceMonitor r-vgpu-manager-device-monitor
expect_kind "$tmp/mgr.yaml" Service r-vgpu-manager-scheduler-extender
expect_kind "$tmp/mgr.yaml" ServiceMonitor r-vgpu-manager-scheduler-extender
expect_kind "$tmp/mgr.yaml" PrometheusRule r-vgpu-manager
expect_kind "$tmp/mgr.yaml" ConfigMap r-vgpu-manager-dashboard
expect_kind "$tmp/mgr.yaml" ClusterRole r-vgpu-manager-metrics-reader
expect_kind "$tmp/mgr.yaml" ClusterRoleBinding r-vgpu-manager-metrics-reader
expect_kind "$tmp/mgr.yaml" ServiceAccount r-vgpu-manager-metrics-reader
expect_kind "$tmp/mgr.yaml" Secret r-vgpu-manager-metrics-reader-token
expect_kind "$tmp/mgr.yaml" Secret r-vgpu-manager-scheduler-extender-tls
expect_kind "$tmp/mgr.yaml" ClusterRoleBinding r-vgpu-manager-scheduler-auth-delegator
expect_field "$tmp/mgr.yaml" ClusterRole r-vgpu-manager-metrics-reader rules \
  '[{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]'
expect_field "$tmp/mgr.yaml" Secret r-vgpu-manager-metrics-reader-token type '"kubernetes.io/service-account-token"'
expect_field "$tmp/mgr.yaml" ConfigMap r-vgpu-manager-dashboard metadata/labels/grafana_dashboard '"1"'
expect_field "$tmp/mgr.yaml" PodMonitor r-vgpu-manager-device-monitor spec/selector/matchLabels \
  '{"app.kubernetes.io/instance": "r", "app.kubernetes.io/name": "vgpu-device-plugin"}'
expect_field "$tmp/mgr.yaml" PodMonitor r-vgpu-manager-device-monitor spec/podMetricsEndpoints/0/port '"metrics"'
expect_field "$tmp/mgr.yaml" PodMonitor r-vgpu-manager-device-monitor spec/podMetricsEndpoints/0/authorization \
  '{"credentials": {"key": "token", "name": "r-vgpu-manager-metrics-reader-token"}, "type": "Bearer"}'
expect_field "$tmp/mgr.yaml" PodMonitor r-vgpu-manager-device-monitor spec/podMetricsEndpoints/0/relabelings \
  '[{"action": "replace", "replacement": "vgpu-device-monitor", "targetLabel": "job"}]'
expect_field "$tmp/mgr.yaml" ServiceMonitor r-vgpu-manager-device-monitor spec/endpoints/0/authorization/credentials/name \
  '"r-vgpu-manager-metrics-reader-token"'
expect_field "$tmp/mgr.yaml" PodMonitor r-vgpu-manager-scheduler-extender spec/podMetricsEndpoints/0/scheme '"https"'
expect_field "$tmp/mgr.yaml" PodMonitor r-vgpu-manager-scheduler-extender spec/podMetricsEndpoints/0/tlsConfig \
  '{"ca": {"secret": {"key": "ca.crt", "name": "r-vgpu-manager-scheduler-extender-tls"}}, "serverName": "vgpu-scheduler-extender"}'
expect_field "$tmp/mgr.yaml" ClusterRoleBinding r-vgpu-manager-scheduler-auth-delegator roleRef/name '"system:auth-delegator"'
# The Services select the pods the workloads label.
expect same "$tmp/mgr.yaml" Service r-vgpu-manager-device-monitor spec/selector \
  DaemonSet r-vgpu-manager-device-plugin spec/selector/matchLabels
expect same "$tmp/mgr.yaml" PodMonitor r-vgpu-manager-scheduler-extender spec/selector/matchLabels \
  Deployment r-vgpu-manager-scheduler spec/selector/matchLabels
expect same "$tmp/mgr.yaml" Service r-vgpu-manager-scheduler-extender spec/selector \
  Deployment r-vgpu-manager-scheduler spec/selector/matchLabels
expect subset "$tmp/mgr.yaml" ServiceMonitor r-vgpu-manager-device-monitor spec/selector/matchLabels \
  Service r-vgpu-manager-device-monitor metadata/labels
expect subset "$tmp/mgr.yaml" ServiceMonitor r-vgpu-manager-scheduler-extender spec/selector/matchLabels \
  Service r-vgpu-manager-scheduler-extender metadata/labels
verify

echo "=== the extender's certificates"
"${check[@]}" get "$tmp/mgr.yaml" Secret r-vgpu-manager-scheduler-extender-tls data >"$tmp/tls.json"
for k in ca.crt tls.crt client.crt; do
  "$py" -c 'import json, sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$tmp/tls.json" "$k" | base64 -d >"$tmp/$k"
done
if openssl verify -CAfile "$tmp/ca.crt" -purpose sslserver "$tmp/tls.crt" >/dev/null 2>&1; then ok "serving certificate verifies against ca.crt"; else bad "serving certificate does not verify"; fi
if openssl verify -CAfile "$tmp/ca.crt" -purpose sslclient "$tmp/client.crt" >/dev/null 2>&1; then ok "client certificate verifies against ca.crt"; else bad "client certificate does not verify"; fi
sans="$(openssl x509 -in "$tmp/tls.crt" -noout -ext subjectAltName 2>/dev/null | tail -n +2 | tr -d ' ')"
if [[ "$sans" == *"DNS:vgpu-scheduler-extender"* && "$sans" == *"IPAddress:127.0.0.1"* ]]; then ok "serving SANs: $sans"; else bad "serving SANs: $sans"; fi
# The extender's args and kube-scheduler's extender TLS, once templates/scheduler.yaml includes the helpers.
if grep -q 'vgpu.monitoring.extenderArgs' "$mgr/templates/scheduler.yaml"; then
  for want in -- --enable-tls --client-ca-file=/etc/vgpu-scheduler-extender/tls/ca.crt --enable-rbac \
    'urlPrefix: https://127.0.0.1:3456/scheduler' 'certFile: /etc/vgpu-scheduler-extender/tls/client.crt'; do
    [[ "$want" == -- ]] && continue
    if grep -qF -- "$want" "$tmp/mgr.yaml"; then ok "scheduler: $want"; else bad "scheduler: no $want"; fi
  done
else
  echo "  note: templates/scheduler.yaml does not include the vgpu.monitoring.extender* helpers yet: serveMetrics only renders the certificates and monitors"
fi

echo "=== the extender serves kube-scheduler over HTTPS by default"
expect_kind "$tmp/mgr-default.yaml" Secret r-vgpu-manager-scheduler-extender-tls
expect_field "$tmp/mgr-default.yaml" Deployment r-vgpu-manager-scheduler spec/template/spec/containers/1/args \
  '["--server-bind-port=3456", "--scheduler-name=vgpu-scheduler", "--domain=nvidia.com", "--kube-api-qps=100", "--kube-api-burst=200", "--enable-tls", "--tls-cert-file=/etc/vgpu-scheduler-extender/tls/tls.crt", "--tls-key-file=/etc/vgpu-scheduler-extender/tls/tls.key"]'
expect_field "$tmp/mgr-default.yaml" Deployment r-vgpu-manager-scheduler spec/template/spec/volumes/1 \
  '{"name": "extender-tls", "secret": {"secretName": "r-vgpu-manager-scheduler-extender-tls"}}'
verify
for want in 'urlPrefix: https://127.0.0.1:3456/scheduler' 'enableHTTPS: true' 'caFile: /etc/vgpu-scheduler-extender/tls/ca.crt'; do
  if grep -qF -- "$want" "$tmp/mgr-default.yaml"; then ok "default kube-scheduler config: $want"; else bad "default kube-scheduler config: no $want"; fi
done
if grep -qF 'certFile: /etc/vgpu-scheduler-extender/tls/client.crt' "$tmp/mgr-default.yaml"; then bad "client certificate without serveMetrics"; else ok "no client certificate without serveMetrics"; fi
"$helm" template r "$mgr" -n vgpu "${kube[@]}" --set scheduler.schedulerExtender.https=false >"$tmp/plain.yaml"
expect absent "$tmp/plain.yaml" Secret r-vgpu-manager-scheduler-extender-tls
verify
if grep -qF 'urlPrefix: http://127.0.0.1:3456/scheduler' "$tmp/plain.yaml" && ! grep -qF -- '--enable-tls' "$tmp/plain.yaml"; then
  ok "https=false: plain HTTP"
else
  bad "https=false still renders HTTPS"
fi

echo "=== scrape auth"
"$helm" template r "$mgr" -n vgpu "${kube[@]}" --set monitoring.podMonitor.enabled=true \
  --set devicePlugin.deviceMonitor.enableRbac=false >"$tmp/norbac.yaml"
expect nofield "$tmp/norbac.yaml" PodMonitor r-vgpu-manager-device-monitor spec/podMetricsEndpoints/0/authorization
expect absent "$tmp/norbac.yaml" ClusterRole r-vgpu-manager-metrics-reader
expect absent "$tmp/norbac.yaml" Secret r-vgpu-manager-metrics-reader-token
"$helm" template r "$mgr" -n vgpu "${kube[@]}" --set monitoring.podMonitor.enabled=true \
  --set monitoring.metricsAuth.createTokenSecret=false --set monitoring.metricsAuth.existingSecret=prom-token \
  --set 'monitoring.metricsAuth.extraSubjects[0].kind=ServiceAccount' \
  --set 'monitoring.metricsAuth.extraSubjects[0].name=prometheus-k8s' \
  --set 'monitoring.metricsAuth.extraSubjects[0].namespace=monitoring' >"$tmp/existing.yaml"
expect_field "$tmp/existing.yaml" PodMonitor r-vgpu-manager-device-monitor spec/podMetricsEndpoints/0/authorization/credentials/name '"prom-token"'
expect_field "$tmp/existing.yaml" ClusterRoleBinding r-vgpu-manager-metrics-reader subjects \
  '[{"kind": "ServiceAccount", "name": "prometheus-k8s", "namespace": "monitoring"}]'
expect absent "$tmp/existing.yaml" Secret r-vgpu-manager-metrics-reader-token
expect absent "$tmp/existing.yaml" ServiceAccount r-vgpu-manager-metrics-reader
verify
expect_fail "createTokenSecret is false and existingSecret is empty" "$mgr" --set monitoring.podMonitor.enabled=true \
  --set monitoring.metricsAuth.createTokenSecret=false
expect_fail "createTokenSecret is false and existingSecret is empty" "$dra" --set monitoring.podMonitor.enabled=true \
  --set monitoring.metricsAuth.createTokenSecret=false

echo "=== vgpu-manager-dra-driver with monitoring on"
"$helm" template r "$dra" -n vgpu "${kube[@]}" --set monitoring.podMonitor.enabled=true \
  --set monitoring.serviceMonitor.enabled=true >"$tmp/dra.yaml"
expect_kind "$tmp/dra.yaml" PodMonitor r-vgpu-manager-dra-driver-device-monitor
expect_kind "$tmp/dra.yaml" Service r-vgpu-manager-dra-driver-device-monitor
expect_kind "$tmp/dra.yaml" ServiceMonitor r-vgpu-manager-dra-driver-device-monitor
expect_kind "$tmp/dra.yaml" Secret r-vgpu-manager-dra-driver-metrics-reader-token
expect same "$tmp/dra.yaml" PodMonitor r-vgpu-manager-dra-driver-device-monitor spec/selector/matchLabels \
  DaemonSet r-vgpu-manager-dra-driver-kubelet-plugin spec/selector/matchLabels
expect_field "$tmp/dra.yaml" PodMonitor r-vgpu-manager-dra-driver-device-monitor spec/podMetricsEndpoints/0/authorization/credentials/name \
  '"r-vgpu-manager-dra-driver-metrics-reader-token"'
expect_field "$tmp/dra.yaml" PodMonitor r-vgpu-manager-dra-driver-device-monitor spec/podMetricsEndpoints/0/relabelings/0/replacement \
  '"vgpu-device-monitor"'
expect same "$tmp/dra.yaml" Service r-vgpu-manager-dra-driver-device-monitor spec/selector \
  DaemonSet r-vgpu-manager-dra-driver-kubelet-plugin spec/selector/matchLabels
expect subset "$tmp/dra.yaml" ServiceMonitor r-vgpu-manager-dra-driver-device-monitor spec/selector/matchLabels \
  Service r-vgpu-manager-dra-driver-device-monitor metadata/labels
verify

echo "=== helm lint --strict with monitoring on"
"$helm" lint --strict "${kube[@]}" "$mgr" "${on[@]}" --set monitoring.schedulerExtender.serveMetrics=true >"$tmp/lint.log" 2>&1 \
  && ok "vgpu-manager" || { cat "$tmp/lint.log" >&2; bad "helm lint vgpu-manager"; }
"$helm" lint --strict "${kube[@]}" "$dra" --set monitoring.podMonitor.enabled=true \
  --set monitoring.serviceMonitor.enabled=true >"$tmp/lint.log" 2>&1 \
  && ok "vgpu-manager-dra-driver" || { cat "$tmp/lint.log" >&2; bad "helm lint vgpu-manager-dra-driver"; }

echo "=== PrometheusRule overrides"
"${check[@]}" rule-spec "$tmp/mgr.yaml" "$tmp/rendered-rules.yaml"
if "${check[@]}" same-groups "$mgr/files/alerts.yaml" "$tmp/rendered-rules.yaml"; then ok "rendered rules = files/alerts.yaml"; else bad "rendered rules differ from files/alerts.yaml"; fi
"$helm" template r "$mgr" -n vgpu "${kube[@]}" --set monitoring.prometheusRule.enabled=true \
  --set monitoring.prometheusRule.alerts.VGPUDeviceMonitorDown.disabled=true \
  --set monitoring.prometheusRule.alerts.VGPUContainerNearMemoryLimit.for=15m \
  --set monitoring.prometheusRule.alerts.VGPUContainerNearMemoryLimit.severity=info \
  --set monitoring.prometheusRule.additionalAlertLabels.team=gpu >"$tmp/override.yaml"
"${check[@]}" rule-spec "$tmp/override.yaml" "$tmp/override-rules.yaml"
if grep -q VGPUDeviceMonitorDown "$tmp/override-rules.yaml"; then bad "disabled alert rendered"; else ok "disabled alert left out"; fi
"$py" - "$tmp/override-rules.yaml" <<'EOF' && ok "for/severity/additional labels applied" || bad "overrides not applied"
import sys, yaml
rules = {r["alert"]: r for g in yaml.safe_load(open(sys.argv[1]))["groups"] for r in g["rules"]}
r = rules["VGPUContainerNearMemoryLimit"]
assert r["for"] == "15m" and r["labels"] == {"severity": "info", "team": "gpu"}, r
assert rules["VGPUDeviceUnhealthy"]["labels"] == {"severity": "critical", "team": "gpu"}, rules["VGPUDeviceUnhealthy"]
EOF
# The values schema refuses an unknown alert name first; the template's own check stays for values that
# bypass the schema.
expect_fail "additional properties 'VGPUNoSuchAlert' not allowed" "$mgr" \
  --set monitoring.prometheusRule.enabled=true --set monitoring.prometheusRule.alerts.VGPUNoSuchAlert.disabled=true
expect_fail "monitoring.prometheusRule.alerts.VGPUNoSuchAlert: no such alert" "$mgr" --skip-schema-validation \
  --set monitoring.prometheusRule.enabled=true --set monitoring.prometheusRule.alerts.VGPUNoSuchAlert.disabled=true

echo "=== values schema (files/monitoring.schema.json merged as bins/tests/chart_gates.rs would)"
for chart in "$mgr" "$dra"; do
  name="$(basename "$chart")"
  "$py" -m json.tool "$chart/files/monitoring.schema.json" >/dev/null || bad "$chart/files/monitoring.schema.json is not JSON"
  if "$py" -c 'import json,sys; sys.exit(0 if "monitoring" in json.load(open(sys.argv[1])).get("properties", {}) else 1)' "$chart/values.schema.json"; then
    # Generated already: it must be the fragment.
    "$py" - "$chart/values.schema.json" "$chart/files/monitoring.schema.json" <<'EOF' && ok "$name: values.schema.json holds the fragment" || bad "$name: values.schema.json's monitoring differs from files/monitoring.schema.json (VGPU_REGEN=1 cargo test -p vgpu-bins --test chart_gates)"
import json, sys
sys.exit(0 if json.load(open(sys.argv[1]))["properties"]["monitoring"] == json.load(open(sys.argv[2])) else 1)
EOF
  fi
  cp -r "$chart" "$tmp/$name"
  "${check[@]}" merge-schema "$tmp/$name/values.schema.json" "$chart/files/monitoring.schema.json"
  "$helm" template r "$tmp/$name" "${kube[@]}" >/dev/null && ok "$name: defaults pass the schema" || bad "$name: defaults fail the schema"
  "$helm" template r "$tmp/$name" "${kube[@]}" --set monitoring.podMonitor.enabled=true --set monitoring.serviceMonitor.enabled=true >/dev/null \
    && ok "$name: monitors on pass the schema" || bad "$name: monitors on fail the schema"
  expect_fail "enabled" "$tmp/$name" --set monitoring.podMonitor.enabled=yes
  expect_fail "enable" "$tmp/$name" --set monitoring.podMonitor.enable=true
  expect_fail "interval" "$tmp/$name" --set monitoring.podMonitor.interval=soon
done
"$py" - "$mgr/files/monitoring.schema.json" "$mgr/files/alerts.yaml" <<'EOF' && ok "the schema's alert names are files/alerts.yaml's" || bad "monitoring.prometheusRule.alerts in files/monitoring.schema.json differs from the alerts of files/alerts.yaml"
import json, sys, yaml
schema = set(json.load(open(sys.argv[1]))["properties"]["prometheusRule"]["properties"]["alerts"]["properties"])
rules = {r["alert"] for g in yaml.safe_load(open(sys.argv[2]))["groups"] for r in g["rules"]}
sys.exit(0 if schema == rules else f"schema {sorted(schema)} vs rules {sorted(rules)}")
EOF
"$helm" template r "$tmp/vgpu-manager" "${kube[@]}" "${on[@]}" --set monitoring.schedulerExtender.serveMetrics=true >/dev/null \
  && ok "vgpu-manager: everything on passes the schema" || bad "vgpu-manager: everything on fails the schema"
expect_fail "additional properties 'VGPUNoSuchAlert' not allowed" "$tmp/vgpu-manager" --set monitoring.prometheusRule.alerts.VGPUNoSuchAlert.disabled=true
expect_fail "severity" "$tmp/vgpu-manager" --set monitoring.prometheusRule.alerts.VGPUDeviceUnhealthy.severity=
expect_fail "grafana_dashboard" "$tmp/vgpu-manager" --set monitoring.dashboard.labels.grafana_dashboard=1

echo "=== dashboard"
"$py" -m json.tool "$mgr/files/vgpu-dashboard.json" >/dev/null && ok "files/vgpu-dashboard.json is JSON" || bad "files/vgpu-dashboard.json is not JSON"
"${check[@]}" dashboard "$mgr/files/vgpu-dashboard.json" || bad "dashboard layout"
"$py" - "$tmp/mgr.yaml" "$mgr/files/vgpu-dashboard.json" <<'EOF' && ok "the ConfigMap holds the dashboard unchanged" || bad "the ConfigMap's dashboard differs from the file"
import json, sys, yaml
cm = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d.get("kind") == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard")][0]
sys.exit(0 if json.loads(cm["data"]["vgpu-dashboard.json"]) == json.load(open(sys.argv[2])) else 1)
EOF

echo "=== metric names (rules and dashboard) against the Rust sources"
"${check[@]}" names . "$mgr/files/alerts.yaml" "$mgr/files/vgpu-dashboard.json" || bad "metric names"

echo "=== gpu-module (adapter metrics, DCGM exporter: chart-only, untested without a GPU)"
gm=charts/gpu-module
gmon=(--set dra.enabled=true --set monitoring.podMonitor.enabled=true --set monitoring.serviceMonitor.enabled=true
  --set monitoring.prometheusRule.enabled=true)
"$helm" template r "$gm" -n d8-gpu "${kube[@]}" >"$tmp/gm-default.yaml"
"$helm" template r "$gm" -n d8-gpu "${kube[@]}" --set dra.enabled=true >"$tmp/gm-dra.yaml"
for k in PodMonitor ServiceMonitor PrometheusRule; do
  expect_no_kind "$tmp/gm-default.yaml" "$k"
  expect_no_kind "$tmp/gm-dra.yaml" "$k"
done
expect absent "$tmp/gm-default.yaml" DaemonSet dcgm-exporter
expect absent "$tmp/gm-dra.yaml" Secret vgpu-adapter-metrics-reader-token
expect_kind "$tmp/gm-dra.yaml" ClusterRoleBinding vgpu-adapter-auth-delegator
expect_field "$tmp/gm-dra.yaml" ClusterRoleBinding vgpu-adapter-auth-delegator roleRef/name '"system:auth-delegator"'
expect_field "$tmp/gm-dra.yaml" DaemonSet vgpu-adapter-nvidia spec/template/spec/containers/0/ports \
  '[{"containerPort": 8080, "name": "metrics"}]'
expect_field "$tmp/gm-dra.yaml" DaemonSet vgpu-adapter-nvidia spec/template/spec/containers/0/livenessProbe \
  '{"httpGet": {"path": "/healthz", "port": "metrics"}}'
verify
for want in --http-endpoint=:8080 --metrics-path=/metrics --enable-rbac=true; do
  if grep -qF -- "$want" "$tmp/gm-dra.yaml"; then ok "adapters: $want"; else bad "adapters: no $want"; fi
done
"$helm" template r "$gm" -n d8-gpu "${kube[@]}" "${gmon[@]}" --set dcgmExporter.enabled=true \
  --set dcgmExporter.image.tag=9.9.9-test >"$tmp/gm.yaml"
expect_kind "$tmp/gm.yaml" PodMonitor vgpu-adapter
expect_kind "$tmp/gm.yaml" Service vgpu-adapter
expect_kind "$tmp/gm.yaml" ServiceMonitor vgpu-adapter
expect_kind "$tmp/gm.yaml" ClusterRole vgpu-adapter-metrics-reader
expect_kind "$tmp/gm.yaml" ClusterRoleBinding vgpu-adapter-metrics-reader
expect_kind "$tmp/gm.yaml" ServiceAccount vgpu-adapter-metrics-reader
expect_kind "$tmp/gm.yaml" PodMonitor dcgm-exporter
expect_kind "$tmp/gm.yaml" ServiceMonitor dcgm-exporter
expect_kind "$tmp/gm.yaml" PrometheusRule gpu-module
expect_field "$tmp/gm.yaml" ClusterRole vgpu-adapter-metrics-reader rules '[{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]'
expect_field "$tmp/gm.yaml" Secret vgpu-adapter-metrics-reader-token type '"kubernetes.io/service-account-token"'
expect_field "$tmp/gm.yaml" PodMonitor vgpu-adapter spec/podMetricsEndpoints/0/authorization \
  '{"credentials": {"key": "token", "name": "vgpu-adapter-metrics-reader-token"}, "type": "Bearer"}'
expect_field "$tmp/gm.yaml" PodMonitor vgpu-adapter spec/podMetricsEndpoints/0/relabelings/0/replacement '"vgpu-adapter"'
expect_field "$tmp/gm.yaml" ServiceMonitor vgpu-adapter spec/endpoints/0/authorization/credentials/name \
  '"vgpu-adapter-metrics-reader-token"'
expect subset "$tmp/gm.yaml" PodMonitor vgpu-adapter spec/selector/matchLabels \
  DaemonSet vgpu-adapter-nvidia spec/template/metadata/labels
expect subset "$tmp/gm.yaml" Service vgpu-adapter spec/selector DaemonSet vgpu-adapter-metax spec/template/metadata/labels
expect subset "$tmp/gm.yaml" ServiceMonitor vgpu-adapter spec/selector/matchLabels Service vgpu-adapter metadata/labels
expect_field "$tmp/gm.yaml" DaemonSet dcgm-exporter spec/template/spec/containers/0/image '"nvcr.io/nvidia/k8s/dcgm-exporter:9.9.9-test"'
expect_field "$tmp/gm.yaml" DaemonSet dcgm-exporter spec/template/spec/nodeSelector '{"gpu.deckhouse.io/vendor": "nvidia"}'
expect nofield "$tmp/gm.yaml" PodMonitor dcgm-exporter spec/podMetricsEndpoints/0/authorization
expect subset "$tmp/gm.yaml" PodMonitor dcgm-exporter spec/selector/matchLabels DaemonSet dcgm-exporter spec/template/metadata/labels
expect subset "$tmp/gm.yaml" ServiceMonitor dcgm-exporter spec/selector/matchLabels Service dcgm-exporter metadata/labels
verify
"${check[@]}" rule-spec "$tmp/gm.yaml" "$tmp/gm-rules.yaml"
if "${check[@]}" same-groups "$gm/files/alerts.yaml" "$tmp/gm-rules.yaml"; then ok "rendered rules = files/alerts.yaml (everything on)"; else bad "gpu-module rendered rules differ from files/alerts.yaml"; fi
"$helm" template r "$gm" -n d8-gpu "${kube[@]}" "${gmon[@]}" >"$tmp/gm-nodcgm.yaml"
"${check[@]}" rule-spec "$tmp/gm-nodcgm.yaml" "$tmp/gm-nodcgm-rules.yaml"
if grep -q DCGM "$tmp/gm-nodcgm-rules.yaml"; then bad "DCGM alerts rendered without dcgmExporter.enabled"; else ok "no DCGM alerts without the exporter"; fi
expect absent "$tmp/gm-nodcgm.yaml" DaemonSet dcgm-exporter
expect absent "$tmp/gm-nodcgm.yaml" PodMonitor dcgm-exporter
verify
"$helm" template r "$gm" -n d8-gpu "${kube[@]}" "${gmon[@]}" --set adapters.metrics.enableRbac=false >"$tmp/gm-norbac.yaml"
expect nofield "$tmp/gm-norbac.yaml" PodMonitor vgpu-adapter spec/podMetricsEndpoints/0/authorization
expect absent "$tmp/gm-norbac.yaml" ClusterRoleBinding vgpu-adapter-auth-delegator
expect absent "$tmp/gm-norbac.yaml" Secret vgpu-adapter-metrics-reader-token
verify
if grep -qF -- --enable-rbac=false "$tmp/gm-norbac.yaml"; then ok "adapters: --enable-rbac=false"; else bad "adapters: no --enable-rbac=false"; fi
expect_fail "createTokenSecret is false and existingSecret is empty" "$gm" "${gmon[@]}" \
  --set monitoring.metricsAuth.createTokenSecret=false
"$helm" lint --strict "${kube[@]}" "$gm" "${gmon[@]}" --set dcgmExporter.enabled=true >"$tmp/lint.log" 2>&1 \
  && ok "helm lint --strict gpu-module" || { cat "$tmp/lint.log" >&2; bad "helm lint gpu-module"; }
"${check[@]}" names . "$gm/files/alerts.yaml" - || bad "gpu-module metric names"

echo "=== promtool"
if command -v promtool >/dev/null; then
  promtool check rules "$mgr/files/alerts.yaml" && ok "check rules files/alerts.yaml" || bad "promtool check rules files/alerts.yaml"
  promtool check rules "$tmp/rendered-rules.yaml" "$tmp/override-rules.yaml" && ok "check rules (rendered)" || bad "promtool check rules (rendered)"
  "${check[@]}" exprs "$mgr/files/alerts.yaml" "$mgr/files/vgpu-dashboard.json" "$tmp/exprs.yaml"
  promtool check rules "$tmp/exprs.yaml" && ok "every expression parses" || bad "an expression does not parse"
  (cd charts/tests && promtool test rules alerts_test.yaml) && ok "test rules alerts_test.yaml" || bad "promtool test rules"
  promtool check rules charts/gpu-module/files/alerts.yaml "$tmp/gm-rules.yaml" && ok "check rules gpu-module" || bad "promtool check rules gpu-module"
  (cd charts/tests && promtool test rules gpu_module_alerts_test.yaml) && ok "test rules gpu_module_alerts_test.yaml" || bad "promtool test rules gpu-module"
  "${check[@]}" dashboard-test . "$mgr/files/vgpu-dashboard.json" "$tmp/dashboard_test.yaml"
  promtool test rules "$tmp/dashboard_test.yaml" && ok "every dashboard expression returns samples on the documented label sets" \
    || bad "a dashboard expression returns nothing on series with the documented labels (vector matching or label names)"
else
  echo "  skipped: promtool not found (Debian package prometheus): the rules' syntax, their unit tests and the dashboard's PromQL are not checked"
fi

if (( fails )); then
  echo "charts/tests/monitoring.sh: $fails check(s) failed" >&2
  exit 1
fi
echo "charts/tests/monitoring.sh: all checks passed"
