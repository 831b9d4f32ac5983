//! Client-side rate limit of a Kubernetes client: client-go's `--kube-api-qps` / `--kube-api-burst`.
//!
//! client-go gives every REST client a token bucket (`flowcontrol.NewTokenBucketRateLimiter(qps, burst)`,
//! i.e. `golang.org/x/time/rate`): the bucket holds `burst` tokens and refills at `qps` tokens per second; each
//! request (a watch included: only its start counts) waits for a token before it is sent. [`TokenBucket`] is
//! the same bucket (GCRA from `governor`, which admits exactly the same request times), and
//! [`RateLimitLayer`] puts it in front of a `tower` service: the outermost layer of a `kube::Client`, so
//! every request of every `Api` built from that client shares one bucket, as in client-go.
//!
//! | `qps` | `burst` | bucket (client-go `rest.RESTClientFor`) |
//! |---|---|---|
//! | `< 0` | any | none: requests are never delayed |
//! | `0` | any | client-go's default 5 QPS |
//! | `> 0` | `0` | client-go's default burst 10 |
//! | `> 0` | `> 0` | `qps` per second, `burst` at once |
//!
//! N requests sent at once through a bucket of `qps` q and `burst` b take at least `(N − b) / q` seconds:
//! the first `b` go at once, each later one a `1/q` period after the one before.

use std::{
    future::Future,
    num::NonZeroU32,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use governor::{DefaultDirectRateLimiter, Quota};

/// client-go's `rest.DefaultQPS`: the bucket's rate when the configured QPS is 0.
pub const CLIENT_GO_DEFAULT_QPS: f32 = 5.0;
/// client-go's `rest.DefaultBurst`: the bucket's size when the configured burst is 0.
pub const CLIENT_GO_DEFAULT_BURST: u32 = 10;

/// A QPS or burst that cannot make a token bucket.
#[derive(Clone, Debug, thiserror::Error, PartialEq)]
#[non_exhaustive]
pub enum RateLimitError {
    /// The QPS is not a number or infinite.
    #[error("--kube-api-qps {0} is not a finite number (expected e.g. 20, 0.5; < 0 turns the limit off)")]
    NotFinite(f32),
    /// The QPS is so small that a full bucket (`burst` periods of `1/qps`) lasts more than 584 years.
    #[error(
        "--kube-api-qps {qps} with --kube-api-burst {burst} is out of range (burst / qps must be under 584 years)"
    )]
    OutOfRange {
        /// The QPS.
        qps: f32,
        /// The burst.
        burst: u32,
    },
}

/// One token bucket shared by every clone (every request of one client).
///
/// ```
/// use vgpu_kube::rate_limit::TokenBucket;
///
/// let bucket = TokenBucket::new(20.0, 30)?;
/// assert_eq!(bucket.rate(), Some((20.0, 30)));
/// // Negative QPS: no limit, as in client-go.
/// assert_eq!(TokenBucket::new(-1.0, 30)?.rate(), None);
/// // Zero picks client-go's defaults.
/// assert_eq!(TokenBucket::new(0.0, 0)?.rate(), Some((5.0, 10)));
/// # Ok::<(), vgpu_kube::rate_limit::RateLimitError>(())
/// ```
#[derive(Clone, Debug)]
pub struct TokenBucket {
    inner: Option<Arc<Bucket>>,
}

#[derive(Debug)]
struct Bucket {
    limiter: DefaultDirectRateLimiter,
    qps: f32,
    burst: u32,
}

impl TokenBucket {
    /// A bucket of `burst` tokens refilled at `qps` per second, with client-go's reading of 0 and negative
    /// values (see the [module table](self)).
    pub fn new(qps: f32, burst: u32) -> Result<Self, RateLimitError> {
        if !qps.is_finite() {
            return Err(RateLimitError::NotFinite(qps));
        }
        if qps < 0.0 {
            return Ok(Self::unlimited());
        }
        let qps = if qps == 0.0 { CLIENT_GO_DEFAULT_QPS } else { qps };
        let burst = NonZeroU32::new(if burst == 0 { CLIENT_GO_DEFAULT_BURST } else { burst })
            .unwrap_or(NonZeroU32::MIN);
        let out_of_range = RateLimitError::OutOfRange { qps, burst: burst.get() };
        // governor counts in u64 nanoseconds (and panics past them): the whole bucket must fit.
        let period = Duration::try_from_secs_f64(1.0 / f64::from(qps)).map_err(|_| out_of_range.clone())?;
        let fits = u64::try_from(period.as_nanos()).ok().and_then(|n| n.checked_mul(u64::from(burst.get())));
        if fits.is_none() {
            return Err(out_of_range);
        }
        // `with_period` refuses only a zero period: a QPS above 1e9 refills every nanosecond.
        let quota =
            Quota::with_period(period.max(Duration::from_nanos(1))).ok_or(out_of_range)?.allow_burst(burst);
        Ok(Self {
            inner: Some(Arc::new(Bucket {
                limiter: DefaultDirectRateLimiter::direct(quota),
                qps,
                burst: burst.get(),
            })),
        })
    }

    /// A bucket that never delays (client-go with a negative QPS).
    pub fn unlimited() -> Self {
        Self { inner: None }
    }

    /// The effective `(qps, burst)`, or `None` when unlimited.
    pub fn rate(&self) -> Option<(f32, u32)> {
        self.inner.as_ref().map(|b| (b.qps, b.burst))
    }

    /// Waits for a token (at once while the bucket holds one).
    pub async fn acquire(&self) {
        if let Some(bucket) = &self.inner {
            bucket.limiter.until_ready().await;
        }
    }
}

/// A `tower` layer that makes each request wait for a token of one shared [`TokenBucket`].
///
/// ```
/// use vgpu_kube::rate_limit::{RateLimitLayer, TokenBucket};
/// use tower::{Layer, Service, ServiceExt, service_fn};
///
/// let layer = RateLimitLayer::new(TokenBucket::new(1000.0, 2)?);
/// let mut svc = layer.layer(service_fn(|n: u32| async move { Ok::<_, std::convert::Infallible>(n * 2) }));
/// let rt = tokio::runtime::Builder::new_current_thread().enable_time().build()?;
/// assert_eq!(rt.block_on(async { svc.ready().await?.call(21).await })?, 42);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct RateLimitLayer {
    bucket: TokenBucket,
}

impl RateLimitLayer {
    /// A layer over `bucket` (clones of the layer and of its services share it).
    pub fn new(bucket: TokenBucket) -> Self {
        Self { bucket }
    }
}

impl<S> tower::Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit { inner, bucket: self.bucket.clone(), permit: Permit::None }
    }
}

/// The service of [`RateLimitLayer`]: not ready until it holds a token, then as ready as the inner service.
///
/// The wait is in `poll_ready` (as `tower::limit::RateLimit` does), so the inner service needs no `Clone`
/// (kube's stack is a `BoxService`) and a request is never built before its token is there. kube's
/// `Client` drives its stack from one `Buffer` worker, so the bucket orders requests first come, first
/// served.
pub struct RateLimit<S> {
    inner: S,
    bucket: TokenBucket,
    permit: Permit,
}

enum Permit {
    /// No token taken yet for the next request.
    None,
    /// Waiting for one.
    Waiting(Pin<Box<dyn Future<Output = ()> + Send>>),
    /// Holding one: the next `call` spends it.
    Held,
}

impl<S: Clone> Clone for RateLimit<S> {
    fn clone(&self) -> Self {
        // A clone starts without a token: each request of each clone takes its own.
        Self { inner: self.inner.clone(), bucket: self.bucket.clone(), permit: Permit::None }
    }
}

impl<S: std::fmt::Debug> std::fmt::Debug for RateLimit<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let permit = match self.permit {
            Permit::None => "none",
            Permit::Waiting(_) => "waiting",
            Permit::Held => "held",
        };
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("bucket", &self.bucket)
            .field("permit", &permit)
            .finish()
    }
}

impl<S, Req> tower::Service<Req> for RateLimit<S>
where
    S: tower::Service<Req>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        loop {
            match &mut self.permit {
                Permit::None => {
                    self.permit = match &self.bucket.inner {
                        // Unlimited: never waits.
                        None => Permit::Held,
                        Some(bucket) if bucket.limiter.check().is_ok() => Permit::Held,
                        Some(_) => {
                            let bucket = self.bucket.clone();
                            Permit::Waiting(Box::pin(async move { bucket.acquire().await }))
                        }
                    };
                }
                Permit::Waiting(wait) => {
                    if wait.as_mut().poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                    self.permit = Permit::Held;
                }
                Permit::Held => return self.inner.poll_ready(cx),
            }
        }
    }

    fn call(&mut self, req: Req) -> Self::Future {
        // tower's contract: `call` follows a `poll_ready` that returned ready, which took the token.
        self.permit = Permit::None;
        self.inner.call(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn client_go_defaults_and_refusals() {
        assert_eq!(TokenBucket::new(0.0, 7).unwrap().rate(), Some((5.0, 7)));
        assert_eq!(TokenBucket::new(3.5, 0).unwrap().rate(), Some((3.5, 10)));
        assert_eq!(TokenBucket::new(-0.5, 0).unwrap().rate(), None);
        assert!(TokenBucket::new(f32::NAN, 1).unwrap_err().to_string().contains("--kube-api-qps"));
        assert!(matches!(TokenBucket::new(f32::INFINITY, 1), Err(RateLimitError::NotFinite(_))));
        assert!(TokenBucket::new(1e30, 1).is_ok());
        assert!(TokenBucket::new(1e-30, 1).is_err());
    }

    proptest! {
        // Any finite QPS and burst give a bucket or a typed error, never a panic; a bucket holds `burst`
        // tokens at first.
        #[test]
        fn any_rate_is_a_bucket_or_an_error(qps in proptest::num::f32::ANY, burst in 0u32..10_000) {
            if let Ok(bucket) = TokenBucket::new(qps, burst)
                && let Some((_, b)) = bucket.rate()
            {
                let limiter = &bucket.inner.as_ref().unwrap().limiter;
                for _ in 0..b.min(64) {
                    prop_assert!(limiter.check().is_ok());
                }
            }
        }
    }
}
