//! One pod mutation through the whole `/pods/mutate` path minus HTTP: AdmissionReview decode → mutation →
//! JSON patch → AdmissionReview encode, for a kubectl-made pod (managedFields, service-account volume,
//! tolerations) with one vGPU container. Target: median ≤ 100 µs. Also the same with `--default-convert2-dra`.
//!
//! Last run (shared 2-core box, load average ≈ 5): 60 µs median (58.6–61.5 µs); with conversion 108 µs.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use vgpu_core::model::{SchedulingPolicy, TopologyMode};
use vgpu_kube::claims::MemoryApi;
use vgpu_webhook::admit::Admission;
use vgpu_webhook::config::WebhookConfig;

const BODY: &str = r#"{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{"uid":"0c9a8d74-9cb7-44dd-b98e-09fd62def2f4","kind":{"group":"","version":"v1","kind":"Pod"},"resource":{"group":"","version":"v1","resource":"pods"},"requestKind":{"group":"","version":"v1","kind":"Pod"},"requestResource":{"group":"","version":"v1","resource":"pods"},"name":"train-0","namespace":"ml","operation":"CREATE","userInfo":{"username":"alice","groups":["system:authenticated"]},"object":{"kind":"Pod","apiVersion":"v1","metadata":{"name":"train-0","namespace":"ml","labels":{"app":"train"},"annotations":{"kubectl.kubernetes.io/last-applied-configuration":"{\"apiVersion\":\"v1\",\"kind\":\"Pod\",\"metadata\":{\"annotations\":{},\"labels\":{\"app\":\"train\"},\"name\":\"train-0\",\"namespace\":\"ml\"},\"spec\":{\"containers\":[{\"image\":\"pytorch/pytorch\",\"name\":\"main\",\"resources\":{\"limits\":{\"nvidia.com/vgpu-number\":\"1\",\"nvidia.com/vgpu-memory\":\"4096\"}}}]}}\n"},"managedFields":[{"manager":"kubectl","operation":"Update","apiVersion":"v1","time":"2026-03-29T23:02:16Z","fieldsType":"FieldsV1","fieldsV1":{"f:metadata":{"f:annotations":{".":{},"f:kubectl.kubernetes.io/last-applied-configuration":{}},"f:labels":{".":{},"f:app":{}}},"f:spec":{"f:containers":{"k:{\"name\":\"main\"}":{".":{},"f:image":{},"f:imagePullPolicy":{},"f:name":{},"f:resources":{".":{},"f:limits":{".":{},"f:nvidia.com/vgpu-memory":{},"f:nvidia.com/vgpu-number":{}},"f:requests":{}},"f:terminationMessagePath":{},"f:terminationMessagePolicy":{}}},"f:dnsPolicy":{},"f:enableServiceLinks":{},"f:restartPolicy":{},"f:schedulerName":{},"f:securityContext":{},"f:terminationGracePeriodSeconds":{}}}}]},"spec":{"volumes":[{"name":"kube-api-access-rxbqq","projected":{"sources":[{"serviceAccountToken":{"expirationSeconds":3607,"path":"token"}},{"configMap":{"name":"kube-root-ca.crt","items":[{"key":"ca.crt","path":"ca.crt"}]}}],"defaultMode":420}}],"containers":[{"name":"main","image":"pytorch/pytorch","resources":{"limits":{"nvidia.com/vgpu-memory":"4096","nvidia.com/vgpu-number":"1"},"requests":{"nvidia.com/vgpu-memory":"4096","nvidia.com/vgpu-number":"1"}},"volumeMounts":[{"name":"kube-api-access-rxbqq","readOnly":true,"mountPath":"/var/run/secrets/kubernetes.io/serviceaccount"}],"terminationMessagePath":"/dev/termination-log","terminationMessagePolicy":"File","imagePullPolicy":"Always"}],"restartPolicy":"Always","terminationGracePeriodSeconds":30,"dnsPolicy":"ClusterFirst","serviceAccountName":"default","serviceAccount":"default","nodeName":"gpu-node-1","securityContext":{},"schedulerName":"default-scheduler","tolerations":[{"key":"node.kubernetes.io/not-ready","operator":"Exists","effect":"NoExecute","tolerationSeconds":300},{"key":"node.kubernetes.io/unreachable","operator":"Exists","effect":"NoExecute","tolerationSeconds":300}],"priority":0,"enableServiceLinks":true},"status":{}},"oldObject":null,"dryRun":false,"options":{"kind":"CreateOptions","apiVersion":"meta.k8s.io/v1"}}}"#;

fn config(convert: bool) -> WebhookConfig {
    WebhookConfig {
        scheduler_name: Some("vgpu-scheduler".into()),
        default_node_policy: Some(SchedulingPolicy::Binpack),
        default_device_policy: Some(SchedulingPolicy::Spread),
        default_topology_mode: Some(TopologyMode::Numa),
        convert_to_dra: convert,
        ..WebhookConfig::default()
    }
}

fn bench(c: &mut Criterion) {
    for (name, convert) in [("pod mutate (decode+patch+encode)", false), ("pod mutate convert2-dra", true)] {
        let admission = Admission::new(config(convert), MemoryApi::new());
        c.bench_function(name, |b| {
            b.iter(|| {
                admission
                    .mutate_pods(black_box(BODY.as_bytes()))
                    .ok()
                    .and_then(|review| serde_json::to_vec(&review).ok())
            })
        });
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
