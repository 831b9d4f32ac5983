//! Bearer-token authorization of non-resource URLs (`/metrics`) by the Kubernetes API server, as
//! controller-runtime's `WithAuthenticationAndAuthorization` filter and kube-rbac-proxy do (vgpu-manager's
//! `--enable-rbac`).
//!
//! For each request, [`Authorizer::authorize`] takes the `Authorization: Bearer <token>` header and asks:
//!
//! 1. **Who is it?** A `TokenReview` (`authentication.k8s.io/v1`) with the token (and the configured
//!    audiences, if any). Not authenticated → 401.
//! 2. **May they?** A `SubjectAccessReview` (`authorization.k8s.io/v1`) for that user, its groups, UID and
//!    extra, with `nonResourceAttributes: {path, verb}`. Not allowed → 403.
//!
//! | request | answer ([`Denied::status`]) |
//! |---|---|
//! | no `Authorization: Bearer` header (or an empty token) | 401 `Unauthorized`, `WWW-Authenticate: Bearer` |
//! | token not authenticated (unknown, expired, wrong audience) | 401 |
//! | authenticated, not allowed | 403 `Forbidden (user=…, verb=…, path=…)` |
//! | authenticated and allowed | passes: [`Authorizer::authorize`] returns the [`UserInfo`] |
//! | the API server could not be asked | 500 (logged at warn; never cached) |
//!
//! The caller's RBAC, for Prometheus to scrape `/metrics`:
//!
//! ```yaml
//! rules:
//! - nonResourceURLs: ["/metrics"]
//!   verbs: ["get"]
//! ```
//!
//! and the server's own, to ask (the `system:auth-delegator` ClusterRole grants exactly these):
//!
//! ```yaml
//! rules:
//! - apiGroups: ["authentication.k8s.io"]
//!   resources: ["tokenreviews"]
//!   verbs: ["create"]
//! - apiGroups: ["authorization.k8s.io"]
//!   resources: ["subjectaccessreviews"]
//!   verbs: ["create"]
//! ```
//!
//! # Cache
//!
//! Every decision (per token, path and verb) is kept for a short time so that scrapes every few seconds do
//! not send two reviews each: allowed for [`AuthzConfig::allowed_ttl`] (default 10 s), refused (401 or 403)
//! for [`AuthzConfig::denied_ttl`] (default 2 s). So a revoked binding or token takes effect within 10 s.
//! The cache holds at most [`AuthzConfig::max_entries`] decisions (default 1024): when full, expired ones
//! are dropped first, then the ones closest to expiry. Failures to ask are not cached. Tokens are kept only
//! in memory, as keys of that cache, and never logged.
//!
//! # Seam
//!
//! [`Reviewer`] is the question asked of the API server; [`KubeReviewer`] asks it with a `kube::Client`, and
//! [`MemoryReviewer`] answers from a table of tokens and grants (tests, examples). The HTTP layer is left
//! to the server: it calls [`Authorizer::authorize`] with the request's headers and answers a [`Denied`]
//! with [`Denied::response`] (or its own form of [`Denied::status`] and the message).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode, header};
use http_body_util::Full;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::Api;
use kube::api::PostParams;

/// Default [`AuthzConfig::allowed_ttl`].
pub const DEFAULT_ALLOWED_TTL: Duration = Duration::from_secs(10);
/// Default [`AuthzConfig::denied_ttl`].
pub const DEFAULT_DENIED_TTL: Duration = Duration::from_secs(2);
/// Default [`AuthzConfig::max_entries`].
pub const DEFAULT_MAX_ENTRIES: usize = 1024;

/// An authenticated user, as the `TokenReview` names it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UserInfo {
    /// User name, e.g. `system:serviceaccount:monitoring:prometheus`.
    pub username: String,
    /// User UID (may be empty).
    pub uid: String,
    /// Groups, e.g. `system:serviceaccounts`.
    pub groups: Vec<String>,
    /// Extra attributes (e.g. the service account's pod name).
    pub extra: BTreeMap<String, Vec<String>>,
}

impl UserInfo {
    /// A user with a name only.
    pub fn new(username: impl Into<String>) -> Self {
        Self { username: username.into(), ..Self::default() }
    }

    /// The same user with `groups`.
    #[must_use]
    pub fn with_groups(mut self, groups: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.groups = groups.into_iter().map(Into::into).collect();
        self
    }
}

/// What is asked for: a non-resource URL and an HTTP-style verb (`get` for a scrape).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct NonResourceRequest {
    /// URL path, e.g. `/metrics`.
    pub path: String,
    /// Lower-case verb, e.g. `get`.
    pub verb: String,
}

impl NonResourceRequest {
    /// `verb` on `path`.
    pub fn new(path: impl Into<String>, verb: impl Into<String>) -> Self {
        Self { path: path.into(), verb: verb.into() }
    }

    /// `get` on `path` (a scrape).
    pub fn get(path: impl Into<String>) -> Self {
        Self::new(path, "get")
    }
}

/// The answer to a `TokenReview`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenReviewed {
    /// The token belongs to this user.
    Authenticated(UserInfo),
    /// The token was not accepted; the API server's reason (may be empty).
    Unauthenticated {
        /// Why, as the API server says it.
        reason: String,
    },
}

/// The answer to a `SubjectAccessReview`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessReviewed {
    /// Whether the request is allowed.
    pub allowed: bool,
    /// The authorizer's reason (may be empty).
    pub reason: String,
}

/// Why a reviewer could not answer.
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    /// The API call failed.
    #[error("creating a {kind}: {source}")]
    Api {
        /// `TokenReview` or `SubjectAccessReview`.
        kind: &'static str,
        /// The client's error.
        source: kube::Error,
    },
    /// The API server answered without a status.
    #[error("the API server answered the {kind} without a status")]
    NoStatus {
        /// `TokenReview` or `SubjectAccessReview`.
        kind: &'static str,
    },
    /// The reviewer is not available (e.g. [`MemoryReviewer::set_unavailable`]).
    #[error("reviewer unavailable: {0}")]
    Unavailable(String),
}

/// A boxed future of a review's answer.
pub type ReviewFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, ReviewError>> + Send + 'a>>;

/// The two questions asked of the API server (module docs).
pub trait Reviewer: Send + Sync + fmt::Debug {
    /// Who does `token` belong to? With `audiences` non-empty, the token must be valid for one of them.
    fn review_token<'a>(&'a self, token: &'a str, audiences: &'a [String])
    -> ReviewFuture<'a, TokenReviewed>;

    /// May `user` do `request`?
    fn review_access<'a>(
        &'a self,
        user: &'a UserInfo,
        request: &'a NonResourceRequest,
    ) -> ReviewFuture<'a, AccessReviewed>;
}

/// [`Reviewer`] over a `kube::Client`: `POST /apis/authentication.k8s.io/v1/tokenreviews` and
/// `POST /apis/authorization.k8s.io/v1/subjectaccessreviews`.
#[derive(Clone)]
pub struct KubeReviewer {
    client: kube::Client,
}

impl fmt::Debug for KubeReviewer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KubeReviewer").finish_non_exhaustive()
    }
}

impl KubeReviewer {
    /// A reviewer asking with `client` (whose identity needs `create` on `tokenreviews` and
    /// `subjectaccessreviews`).
    pub fn new(client: kube::Client) -> Self {
        Self { client }
    }
}

impl Reviewer for KubeReviewer {
    fn review_token<'a>(
        &'a self,
        token: &'a str,
        audiences: &'a [String],
    ) -> ReviewFuture<'a, TokenReviewed> {
        Box::pin(async move {
            const KIND: &str = "TokenReview";
            let api: Api<TokenReview> = Api::all(self.client.clone());
            let review = TokenReview {
                spec: TokenReviewSpec {
                    token: token.to_owned(),
                    audiences: (!audiences.is_empty()).then(|| audiences.to_vec()),
                },
                ..TokenReview::default()
            };
            let answer = api
                .create(&PostParams::default(), &review)
                .await
                .map_err(|source| ReviewError::Api { kind: KIND, source })?;
            let status = answer.status.ok_or(ReviewError::NoStatus { kind: KIND })?;
            let reason = status.error.unwrap_or_default();
            if status.authenticated != Some(true) {
                return Ok(TokenReviewed::Unauthenticated { reason });
            }
            // With audiences asked for, the API server answers the ones the token is valid for.
            if !audiences.is_empty()
                && !status.audiences.unwrap_or_default().iter().any(|a| audiences.contains(a))
            {
                return Ok(TokenReviewed::Unauthenticated {
                    reason: "the token is not valid for the expected audiences".into(),
                });
            }
            let user = status.user.unwrap_or_default();
            let username = user.username.unwrap_or_default();
            if username.is_empty() {
                return Ok(TokenReviewed::Unauthenticated { reason: "the TokenReview named no user".into() });
            }
            Ok(TokenReviewed::Authenticated(UserInfo {
                username,
                uid: user.uid.unwrap_or_default(),
                groups: user.groups.unwrap_or_default(),
                extra: user.extra.unwrap_or_default(),
            }))
        })
    }

    fn review_access<'a>(
        &'a self,
        user: &'a UserInfo,
        request: &'a NonResourceRequest,
    ) -> ReviewFuture<'a, AccessReviewed> {
        Box::pin(async move {
            const KIND: &str = "SubjectAccessReview";
            let api: Api<SubjectAccessReview> = Api::all(self.client.clone());
            let review = SubjectAccessReview {
                spec: SubjectAccessReviewSpec {
                    user: Some(user.username.clone()),
                    uid: (!user.uid.is_empty()).then(|| user.uid.clone()),
                    groups: (!user.groups.is_empty()).then(|| user.groups.clone()),
                    extra: (!user.extra.is_empty()).then(|| user.extra.clone()),
                    non_resource_attributes: Some(NonResourceAttributes {
                        path: Some(request.path.clone()),
                        verb: Some(request.verb.clone()),
                    }),
                    resource_attributes: None,
                },
                ..SubjectAccessReview::default()
            };
            let answer = api
                .create(&PostParams::default(), &review)
                .await
                .map_err(|source| ReviewError::Api { kind: KIND, source })?;
            let status = answer.status.ok_or(ReviewError::NoStatus { kind: KIND })?;
            let reason =
                match (status.reason.unwrap_or_default(), status.evaluation_error.unwrap_or_default()) {
                    (r, e) if e.is_empty() => r,
                    (r, e) if r.is_empty() => e,
                    (r, e) => format!("{r}; {e}"),
                };
            Ok(AccessReviewed { allowed: status.allowed && status.denied != Some(true), reason })
        })
    }
}

#[derive(Debug, Default)]
struct MemoryState {
    tokens: HashMap<String, UserInfo>,
    /// (user or group, path, verb); path `*` and verb `*` match any.
    grants: HashSet<(String, String, String)>,
    unavailable: Option<String>,
}

/// [`Reviewer`] answering from a table of tokens and grants (tests, examples). Grants match the user name
/// or one of its groups; a grant's path may end in `*` (prefix), and a verb of `*` matches any, as RBAC's
/// `nonResourceURLs` rules do.
#[derive(Debug, Default)]
pub struct MemoryReviewer {
    state: Mutex<MemoryState>,
    calls: AtomicUsize,
}

impl MemoryReviewer {
    /// No tokens, no grants.
    pub fn new() -> Self {
        Self::default()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, MemoryState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `token` authenticates as `user`.
    pub fn add_token(&self, token: impl Into<String>, user: UserInfo) {
        self.state().tokens.insert(token.into(), user);
    }

    /// `token` no longer authenticates.
    pub fn remove_token(&self, token: &str) {
        self.state().tokens.remove(token);
    }

    /// `subject` (a user name or group) may do `verb` on `path`.
    pub fn allow(&self, subject: impl Into<String>, path: impl Into<String>, verb: impl Into<String>) {
        self.state().grants.insert((subject.into(), path.into(), verb.into()));
    }

    /// Takes back a grant given by [`MemoryReviewer::allow`].
    pub fn revoke(&self, subject: &str, path: &str, verb: &str) {
        self.state().grants.remove(&(subject.to_owned(), path.to_owned(), verb.to_owned()));
    }

    /// From now on every review fails with `reason` (`None`: answers again).
    pub fn set_unavailable(&self, reason: Option<&str>) {
        self.state().unavailable = reason.map(str::to_owned);
    }

    /// Reviews answered so far (token and access reviews together, failures included).
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::Relaxed)
    }

    fn begin(&self) -> Result<std::sync::MutexGuard<'_, MemoryState>, ReviewError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let state = self.state();
        match &state.unavailable {
            Some(reason) => Err(ReviewError::Unavailable(reason.clone())),
            None => Ok(state),
        }
    }
}

fn rule_matches(rule: &str, value: &str) -> bool {
    rule == "*" || rule == value || rule.strip_suffix('*').is_some_and(|prefix| value.starts_with(prefix))
}

impl Reviewer for MemoryReviewer {
    fn review_token<'a>(
        &'a self,
        token: &'a str,
        _audiences: &'a [String],
    ) -> ReviewFuture<'a, TokenReviewed> {
        let answer = self.begin().map(|state| match state.tokens.get(token) {
            Some(user) => TokenReviewed::Authenticated(user.clone()),
            None => TokenReviewed::Unauthenticated { reason: "unknown token".into() },
        });
        Box::pin(std::future::ready(answer))
    }

    fn review_access<'a>(
        &'a self,
        user: &'a UserInfo,
        request: &'a NonResourceRequest,
    ) -> ReviewFuture<'a, AccessReviewed> {
        let answer = self.begin().map(|state| {
            let allowed = state.grants.iter().any(|(subject, path, verb)| {
                (*subject == user.username || user.groups.contains(subject))
                    && rule_matches(path, &request.path)
                    && (verb == "*" || *verb == request.verb)
            });
            AccessReviewed { allowed, reason: String::new() }
        });
        Box::pin(std::future::ready(answer))
    }
}

/// Why a request was not let through ([`Authorizer::authorize`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Denied {
    /// No `Authorization: Bearer` header, or an empty token.
    #[error("Unauthorized: no bearer token (expected an \"Authorization: Bearer <token>\" header)")]
    MissingToken,
    /// The API server did not authenticate the token.
    #[error("Unauthorized: the token was not authenticated{}", suffix(reason))]
    Unauthenticated {
        /// The API server's reason (may be empty).
        reason: String,
    },
    /// The user may not do this.
    #[error("Forbidden (user={user}, verb={verb}, path={path}){}", suffix(reason))]
    Forbidden {
        /// The authenticated user name.
        user: String,
        /// The verb asked for.
        verb: String,
        /// The path asked for.
        path: String,
        /// The authorizer's reason (may be empty).
        reason: String,
    },
    /// The API server could not be asked (details in the log).
    #[error("authorization unavailable: the API server could not review the request; retry later")]
    Unavailable,
}

fn suffix(reason: &str) -> String {
    if reason.is_empty() { String::new() } else { format!(": {reason}") }
}

impl Denied {
    /// 401 (no token, not authenticated), 403 (not allowed) or 500 (not reviewed).
    pub fn status(&self) -> StatusCode {
        match self {
            Denied::MissingToken | Denied::Unauthenticated { .. } => StatusCode::UNAUTHORIZED,
            Denied::Forbidden { .. } => StatusCode::FORBIDDEN,
            Denied::Unavailable => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The answer: [`Denied::status`], the message as `text/plain`, and `WWW-Authenticate: Bearer` on 401.
    pub fn response(&self) -> http::Response<Full<Bytes>> {
        let mut response = http::Response::new(Full::new(Bytes::from(format!("{self}\n"))));
        *response.status_mut() = self.status();
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
        if self.status() == StatusCode::UNAUTHORIZED {
            headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

/// The bearer token of a request's `Authorization` header (scheme case-insensitive), if any.
pub fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?.trim();
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Cache and review settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthzConfig {
    /// How long an allowed decision is reused.
    pub allowed_ttl: Duration,
    /// How long a refusal (401 or 403) is reused.
    pub denied_ttl: Duration,
    /// Most decisions kept at once.
    pub max_entries: usize,
    /// Audiences the token must be valid for (empty: the API server's own).
    pub audiences: Vec<String>,
}

impl Default for AuthzConfig {
    fn default() -> Self {
        Self {
            allowed_ttl: DEFAULT_ALLOWED_TTL,
            denied_ttl: DEFAULT_DENIED_TTL,
            max_entries: DEFAULT_MAX_ENTRIES,
            audiences: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct CacheKey {
    token: String,
    request: NonResourceRequest,
}

#[derive(Debug, Clone)]
struct CacheEntry {
    expires: Instant,
    decision: Result<UserInfo, Denied>,
}

type Now = Arc<dyn Fn() -> Instant + Send + Sync>;

/// Token authorization with a decision cache (module docs). Share one per server (`Arc`).
pub struct Authorizer {
    reviewer: Arc<dyn Reviewer>,
    config: AuthzConfig,
    cache: Mutex<HashMap<CacheKey, CacheEntry>>,
    now: Now,
}

impl fmt::Debug for Authorizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Authorizer")
            .field("reviewer", &self.reviewer)
            .field("config", &self.config)
            .field("cached", &self.cached())
            .finish_non_exhaustive()
    }
}

impl Authorizer {
    /// An authorizer asking `reviewer`, with the default [`AuthzConfig`].
    pub fn new(reviewer: Arc<dyn Reviewer>) -> Self {
        Self {
            reviewer,
            config: AuthzConfig::default(),
            cache: Mutex::new(HashMap::new()),
            now: Arc::new(Instant::now),
        }
    }

    /// An authorizer over the API server of `client` ([`KubeReviewer`]).
    pub fn kube(client: kube::Client) -> Self {
        Self::new(Arc::new(KubeReviewer::new(client)))
    }

    /// Other cache and review settings.
    #[must_use]
    pub fn with_config(mut self, config: AuthzConfig) -> Self {
        self.config = config;
        self
    }

    /// Another clock for the cache's expiry (tests).
    #[must_use]
    pub fn with_clock(mut self, now: impl Fn() -> Instant + Send + Sync + 'static) -> Self {
        self.now = Arc::new(now);
        self
    }

    /// The settings.
    pub fn config(&self) -> &AuthzConfig {
        &self.config
    }

    /// Decisions in the cache now (expired ones included until they are dropped).
    pub fn cached(&self) -> usize {
        self.cache.lock().unwrap_or_else(PoisonError::into_inner).len()
    }

    /// Authorizes a request by its `Authorization: Bearer` header (module docs): the user when allowed,
    /// else why not.
    pub async fn authorize(
        &self,
        headers: &HeaderMap,
        request: &NonResourceRequest,
    ) -> Result<UserInfo, Denied> {
        let token = bearer_token(headers).ok_or(Denied::MissingToken)?;
        self.authorize_token(token, request).await
    }

    /// Authorizes `token` for `request` (cached).
    pub async fn authorize_token(
        &self,
        token: &str,
        request: &NonResourceRequest,
    ) -> Result<UserInfo, Denied> {
        if token.is_empty() {
            return Err(Denied::MissingToken);
        }
        let key = CacheKey { token: token.to_owned(), request: request.clone() };
        let now = (self.now)();
        {
            let cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(entry) = cache.get(&key).filter(|e| e.expires > now) {
                return entry.decision.clone();
            }
        }
        let decision = match self.review(token, request).await {
            Ok(decision) => decision,
            Err(e) => {
                tracing::warn!(path = %request.path, verb = %request.verb, error = %e, "authorization review failed");
                return Err(Denied::Unavailable);
            }
        };
        let ttl = if decision.is_ok() { self.config.allowed_ttl } else { self.config.denied_ttl };
        self.remember(key, CacheEntry { expires: (self.now)() + ttl, decision: decision.clone() });
        decision
    }

    async fn review(
        &self,
        token: &str,
        request: &NonResourceRequest,
    ) -> Result<Result<UserInfo, Denied>, ReviewError> {
        let user = match self.reviewer.review_token(token, &self.config.audiences).await? {
            TokenReviewed::Authenticated(user) => user,
            TokenReviewed::Unauthenticated { reason } => return Ok(Err(Denied::Unauthenticated { reason })),
        };
        let access = self.reviewer.review_access(&user, request).await?;
        if access.allowed {
            Ok(Ok(user))
        } else {
            tracing::debug!(user = %user.username, path = %request.path, verb = %request.verb, "request forbidden");
            Ok(Err(Denied::Forbidden {
                user: user.username,
                verb: request.verb.clone(),
                path: request.path.clone(),
                reason: access.reason,
            }))
        }
    }

    fn remember(&self, key: CacheKey, entry: CacheEntry) {
        if self.config.max_entries == 0 {
            return;
        }
        let now = (self.now)();
        let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        if cache.len() >= self.config.max_entries && !cache.contains_key(&key) {
            cache.retain(|_, e| e.expires > now);
            while cache.len() >= self.config.max_entries {
                let Some(oldest) = cache.iter().min_by_key(|(_, e)| e.expires).map(|(k, _)| k.clone()) else {
                    break;
                };
                cache.remove(&oldest);
            }
        }
        cache.insert(key, entry);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROM: &str = "system:serviceaccount:monitoring:prometheus";

    fn headers(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, HeaderValue::from_str(value).unwrap());
        h
    }

    /// A clock the test moves by hand.
    fn manual_clock() -> (Arc<Mutex<Instant>>, impl Fn() -> Instant + Send + Sync + 'static) {
        let t = Arc::new(Mutex::new(Instant::now()));
        let read = t.clone();
        (t, move || *read.lock().unwrap())
    }

    fn advance(t: &Mutex<Instant>, by: Duration) {
        let mut now = t.lock().unwrap();
        *now += by;
    }

    fn setup() -> (Arc<MemoryReviewer>, Authorizer, Arc<Mutex<Instant>>) {
        let reviewer = Arc::new(MemoryReviewer::new());
        reviewer.add_token("prom", UserInfo::new(PROM).with_groups(["system:serviceaccounts"]));
        reviewer.add_token("other", UserInfo::new("system:serviceaccount:default:other"));
        reviewer.allow(PROM, "/metrics", "get");
        let (t, clock) = manual_clock();
        (reviewer.clone(), Authorizer::new(reviewer).with_clock(clock), t)
    }

    #[test]
    fn bearer_tokens_are_parsed() {
        assert_eq!(bearer_token(&headers("Bearer abc")), Some("abc"));
        assert_eq!(bearer_token(&headers("bearer   abc ")), Some("abc"));
        assert_eq!(bearer_token(&headers("Bearer ")), None);
        assert_eq!(bearer_token(&headers("Basic dXNlcjpwYXNz")), None);
        assert_eq!(bearer_token(&headers("abc")), None);
        assert_eq!(bearer_token(&HeaderMap::new()), None);
    }

    #[tokio::test]
    async fn decisions_map_to_401_403_and_pass() {
        let (reviewer, authz, _) = setup();
        let metrics = NonResourceRequest::get("/metrics");
        let user = authz.authorize(&headers("Bearer prom"), &metrics).await.unwrap();
        assert_eq!(user.username, PROM);
        assert_eq!(user.groups, ["system:serviceaccounts"]);

        let e = authz.authorize(&HeaderMap::new(), &metrics).await.unwrap_err();
        assert_eq!((e.clone(), e.status()), (Denied::MissingToken, StatusCode::UNAUTHORIZED));
        assert_eq!(reviewer.calls(), 2, "no token, no review");
        let response = e.response();
        assert_eq!(response.headers()[header::WWW_AUTHENTICATE], "Bearer");

        let e = authz.authorize(&headers("Bearer nope"), &metrics).await.unwrap_err();
        assert_eq!(e.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(e.to_string(), "Unauthorized: the token was not authenticated: unknown token");
        assert_eq!(reviewer.calls(), 3, "no access review for an unauthenticated token");

        let e = authz.authorize(&headers("Bearer other"), &metrics).await.unwrap_err();
        assert_eq!(e.status(), StatusCode::FORBIDDEN);
        assert_eq!(
            e.to_string(),
            "Forbidden (user=system:serviceaccount:default:other, verb=get, path=/metrics)"
        );
        assert!(!e.response().headers().contains_key(header::WWW_AUTHENTICATE));

        // Another path or verb is another question.
        let e = authz.authorize(&headers("Bearer prom"), &NonResourceRequest::new("/metrics", "post")).await;
        assert_eq!(e.unwrap_err().status(), StatusCode::FORBIDDEN);
        let e = authz.authorize(&headers("Bearer prom"), &NonResourceRequest::get("/debug")).await;
        assert_eq!(e.unwrap_err().status(), StatusCode::FORBIDDEN);

        // Group grants and wildcard paths, as RBAC matches them.
        reviewer.allow("system:serviceaccounts", "/debug/*", "*");
        let ok =
            authz.authorize(&headers("Bearer prom"), &NonResourceRequest::new("/debug/pprof", "get")).await;
        assert!(ok.is_ok());
    }

    #[tokio::test]
    async fn decisions_are_cached_for_their_ttl() {
        let (reviewer, authz, t) = setup();
        let metrics = NonResourceRequest::get("/metrics");
        authz.authorize(&headers("Bearer prom"), &metrics).await.unwrap();
        assert_eq!(reviewer.calls(), 2);
        for _ in 0..5 {
            authz.authorize(&headers("Bearer prom"), &metrics).await.unwrap();
        }
        assert_eq!(reviewer.calls(), 2, "allowed decision reused");

        // A revoked grant takes effect when the allowed decision expires (10 s).
        reviewer.revoke(PROM, "/metrics", "get");
        advance(&t, Duration::from_secs(9));
        authz.authorize(&headers("Bearer prom"), &metrics).await.unwrap();
        advance(&t, Duration::from_secs(2));
        let e = authz.authorize(&headers("Bearer prom"), &metrics).await.unwrap_err();
        assert_eq!(e.status(), StatusCode::FORBIDDEN);
        assert_eq!(reviewer.calls(), 4);

        // Refusals are reused for 2 s only.
        reviewer.allow(PROM, "/metrics", "get");
        advance(&t, Duration::from_millis(1500));
        assert!(authz.authorize(&headers("Bearer prom"), &metrics).await.is_err());
        assert_eq!(reviewer.calls(), 4);
        advance(&t, Duration::from_millis(600));
        authz.authorize(&headers("Bearer prom"), &metrics).await.unwrap();
        assert_eq!(reviewer.calls(), 6);

        // Unauthenticated tokens too.
        assert!(authz.authorize(&headers("Bearer later"), &metrics).await.is_err());
        reviewer.add_token("later", UserInfo::new(PROM));
        assert!(authz.authorize(&headers("Bearer later"), &metrics).await.is_err(), "cached 401");
        advance(&t, Duration::from_secs(3));
        authz.authorize(&headers("Bearer later"), &metrics).await.unwrap();
    }

    #[tokio::test]
    async fn failures_are_500_and_not_cached() {
        let (reviewer, authz, _) = setup();
        let metrics = NonResourceRequest::get("/metrics");
        reviewer.set_unavailable(Some("connection refused"));
        let e = authz.authorize(&headers("Bearer prom"), &metrics).await.unwrap_err();
        assert_eq!((e.clone(), e.status()), (Denied::Unavailable, StatusCode::INTERNAL_SERVER_ERROR));
        assert!(!e.to_string().contains("connection refused"), "details stay in the log");
        assert_eq!(authz.cached(), 0);
        reviewer.set_unavailable(None);
        authz.authorize(&headers("Bearer prom"), &metrics).await.unwrap();
    }

    #[tokio::test]
    async fn the_cache_is_bounded() {
        let (reviewer, authz, t) = setup();
        let authz = authz.with_config(AuthzConfig { max_entries: 4, ..AuthzConfig::default() });
        let metrics = NonResourceRequest::get("/metrics");
        authz.authorize(&headers("Bearer prom"), &metrics).await.unwrap();
        for i in 0..10 {
            advance(&t, Duration::from_millis(10));
            let _ = authz.authorize(&headers(&format!("Bearer spray-{i}")), &metrics).await;
            assert!(authz.cached() <= 4);
        }
        assert_eq!(authz.cached(), 4);
        // The decisions closest to expiry went first: the refusals, so the allowed one is still reused.
        let before = reviewer.calls();
        authz.authorize(&headers("Bearer prom"), &metrics).await.unwrap();
        assert_eq!(reviewer.calls(), before, "the allowed decision survived the spray");
        advance(&t, Duration::from_secs(10));
        authz.authorize(&headers("Bearer prom"), &metrics).await.unwrap();
        assert_eq!(reviewer.calls(), before + 2, "expired, so asked again");

        let none = Authorizer::new(reviewer.clone())
            .with_config(AuthzConfig { max_entries: 0, ..AuthzConfig::default() });
        none.authorize(&headers("Bearer prom"), &metrics).await.unwrap();
        assert_eq!(none.cached(), 0);
    }
}
