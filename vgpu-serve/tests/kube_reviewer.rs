//! `KubeReviewer` and `Authorizer` at the HTTP layer: a `tower_test` mock service stands in for the API
//! server, and every TokenReview and SubjectAccessReview request's method, path, content type and body is
//! checked, with the answers mapped to 401, 403, pass and 500.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/mock_api_server.rs"]
mod mock_api_server;

use std::sync::Arc;

use http::{HeaderMap, HeaderValue, StatusCode, header};
use mock_api_server::{ApiHandle, next, reply};
use serde_json::{Value, json};
use vgpu_serve::authz::{
    AccessReviewed, Authorizer, AuthzConfig, Denied, KubeReviewer, NonResourceRequest, Reviewer,
    TokenReviewed, UserInfo,
};

fn client() -> (kube::Client, ApiHandle) {
    mock_api_server::mock_client()
}

/// The API server's answer to a TokenReview: the request echoed with `status`.
fn token_review_answer(request: &Value, status: Value) -> Value {
    let mut answer = request.clone();
    answer["status"] = status;
    answer
}

const PROM: &str = "system:serviceaccount:monitoring:prometheus";

fn prom_user() -> Value {
    json!({
        "username": PROM,
        "uid": "uid-1",
        "groups": ["system:serviceaccounts", "system:serviceaccounts:monitoring", "system:authenticated"],
        "extra": {"authentication.kubernetes.io/pod-name": ["prometheus-0"]}
    })
}

#[tokio::test]
async fn token_review_request_and_answers() {
    let (client, mut api) = client();
    let reviewer = KubeReviewer::new(client);
    let audiences = vec!["https://kubernetes.default.svc".to_owned()];

    let server = tokio::spawn(async move {
        // 1: authenticated, no audiences asked.
        let (seen, send) = next(&mut api).await;
        assert_eq!(seen.method, "POST");
        assert_eq!(seen.uri, "/apis/authentication.k8s.io/v1/tokenreviews?");
        assert_eq!(seen.content_type.as_deref(), Some("application/json"));
        assert_eq!(
            seen.body,
            json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "metadata": {},
                   "spec": {"token": "t-1"}})
        );
        reply(
            send,
            201,
            &token_review_answer(&seen.body, json!({"authenticated": true, "user": prom_user()})),
        );
        // 2: audiences asked for and answered.
        let (seen, send) = next(&mut api).await;
        assert_eq!(
            seen.body["spec"],
            json!({"token": "t-2", "audiences": ["https://kubernetes.default.svc"]})
        );
        let status = json!({"authenticated": true, "user": prom_user(), "audiences": ["https://kubernetes.default.svc"]});
        reply(send, 201, &token_review_answer(&seen.body, status));
        // 3: audiences asked for, none in the answer.
        let (seen, send) = next(&mut api).await;
        reply(
            send,
            201,
            &token_review_answer(&seen.body, json!({"authenticated": true, "user": prom_user()})),
        );
        // 4: not authenticated.
        let (seen, send) = next(&mut api).await;
        let status = json!({"authenticated": false, "error": "invalid bearer token", "user": {}});
        reply(send, 201, &token_review_answer(&seen.body, status));
        // 5: forbidden to the reviewer itself.
        let (_, send) = next(&mut api).await;
        reply(
            send,
            403,
            &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden", "code": 403,
                    "message": "tokenreviews.authentication.k8s.io is forbidden: User \"x\" cannot create resource"}),
        );
    });

    let TokenReviewed::Authenticated(user) = reviewer.review_token("t-1", &[]).await.unwrap() else {
        panic!("not authenticated")
    };
    assert_eq!(user.username, PROM);
    assert_eq!(user.uid, "uid-1");
    assert_eq!(user.groups.len(), 3);
    assert_eq!(user.extra["authentication.kubernetes.io/pod-name"], ["prometheus-0"]);
    assert!(matches!(
        reviewer.review_token("t-2", &audiences).await.unwrap(),
        TokenReviewed::Authenticated(_)
    ));
    assert_eq!(
        reviewer.review_token("t-3", &audiences).await.unwrap(),
        TokenReviewed::Unauthenticated { reason: "the token is not valid for the expected audiences".into() }
    );
    assert_eq!(
        reviewer.review_token("t-4", &[]).await.unwrap(),
        TokenReviewed::Unauthenticated { reason: "invalid bearer token".into() }
    );
    let e = reviewer.review_token("t-5", &[]).await.unwrap_err();
    assert!(e.to_string().starts_with("creating a TokenReview: "), "{e}");
    assert!(e.to_string().contains("forbidden"), "{e}");
    server.await.unwrap();
}

#[tokio::test]
async fn subject_access_review_request_and_answers() {
    let (client, mut api) = client();
    let reviewer = KubeReviewer::new(client);
    let mut user = UserInfo::new(PROM).with_groups(["system:serviceaccounts", "system:authenticated"]);
    user.uid = "uid-1".into();
    user.extra.insert("authentication.kubernetes.io/pod-name".into(), vec!["prometheus-0".into()]);

    let server = tokio::spawn(async move {
        let (seen, send) = next(&mut api).await;
        assert_eq!(seen.method, "POST");
        assert_eq!(seen.uri, "/apis/authorization.k8s.io/v1/subjectaccessreviews?");
        assert_eq!(seen.content_type.as_deref(), Some("application/json"));
        assert_eq!(
            seen.body,
            json!({
                "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "metadata": {},
                "spec": {
                    "user": PROM, "uid": "uid-1",
                    "groups": ["system:serviceaccounts", "system:authenticated"],
                    "extra": {"authentication.kubernetes.io/pod-name": ["prometheus-0"]},
                    "nonResourceAttributes": {"path": "/metrics", "verb": "get"}
                }
            })
        );
        let mut answer = seen.body.clone();
        answer["status"] =
            json!({"allowed": true, "reason": "RBAC: allowed by ClusterRoleBinding \"prometheus\""});
        reply(send, 201, &answer);

        // A user with a name only: no empty uid, groups or extra are sent.
        let (seen, send) = next(&mut api).await;
        assert_eq!(
            seen.body["spec"],
            json!({"user": "bob", "nonResourceAttributes": {"path": "/metrics", "verb": "get"}})
        );
        let mut answer = seen.body.clone();
        answer["status"] = json!({"allowed": false, "evaluationError": "no RBAC policy matched"});
        reply(send, 201, &answer);

        // `denied` wins over `allowed`.
        let (seen, send) = next(&mut api).await;
        let mut answer = seen.body.clone();
        answer["status"] = json!({"allowed": true, "denied": true, "reason": "webhook says no"});
        reply(send, 201, &answer);
    });

    let metrics = NonResourceRequest::get("/metrics");
    assert_eq!(
        reviewer.review_access(&user, &metrics).await.unwrap(),
        AccessReviewed { allowed: true, reason: "RBAC: allowed by ClusterRoleBinding \"prometheus\"".into() }
    );
    let bob = UserInfo::new("bob");
    assert_eq!(
        reviewer.review_access(&bob, &metrics).await.unwrap(),
        AccessReviewed { allowed: false, reason: "no RBAC policy matched".into() }
    );
    assert!(!reviewer.review_access(&bob, &metrics).await.unwrap().allowed);
    server.await.unwrap();
}

/// The authorizer over the kube reviewer: one TokenReview and one SubjectAccessReview per decision, then the
/// cache answers; a forbidden user gets 403 and an API failure 500.
#[tokio::test]
async fn authorizer_over_the_api_server() {
    let (client, mut api) = client();
    let authz = Arc::new(Authorizer::kube(client).with_config(AuthzConfig::default()));
    let bearer = |token: &str| {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, HeaderValue::from_str(&format!("Bearer {token}")).unwrap());
        h
    };
    let metrics = NonResourceRequest::get("/metrics");

    let server = tokio::spawn(async move {
        let mut paths = Vec::new();
        for (allowed, user) in [(true, PROM), (false, "system:serviceaccount:default:nobody")] {
            let (seen, send) = next(&mut api).await;
            paths.push(seen.uri.clone());
            let status = json!({"authenticated": true, "user": {"username": user}});
            reply(send, 201, &token_review_answer(&seen.body, status));
            let (seen, send) = next(&mut api).await;
            paths.push(seen.uri.clone());
            assert_eq!(seen.body["spec"]["user"], user);
            let mut answer = seen.body.clone();
            answer["status"] = json!({"allowed": allowed});
            reply(send, 201, &answer);
        }
        let (_, send) = next(&mut api).await;
        reply(send, 500, &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 500}));
        paths
    });

    assert_eq!(authz.authorize(&bearer("t-prom"), &metrics).await.unwrap().username, PROM);
    assert_eq!(authz.authorize(&bearer("t-prom"), &metrics).await.unwrap().username, PROM, "cached");
    let e = authz.authorize(&bearer("t-nobody"), &metrics).await.unwrap_err();
    assert_eq!(e.status(), StatusCode::FORBIDDEN);
    let e = authz.authorize(&bearer("t-broken"), &metrics).await.unwrap_err();
    assert_eq!((e.clone(), e.status()), (Denied::Unavailable, StatusCode::INTERNAL_SERVER_ERROR));
    let e = authz.authorize(&HeaderMap::new(), &metrics).await.unwrap_err();
    assert_eq!(e.status(), StatusCode::UNAUTHORIZED);
    let paths = server.await.unwrap();
    assert_eq!(
        paths,
        [
            "/apis/authentication.k8s.io/v1/tokenreviews?",
            "/apis/authorization.k8s.io/v1/subjectaccessreviews?",
            "/apis/authentication.k8s.io/v1/tokenreviews?",
            "/apis/authorization.k8s.io/v1/subjectaccessreviews?",
        ]
    );
}
