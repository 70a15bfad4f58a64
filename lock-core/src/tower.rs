//! [`LockLayer`]: a tower layer that runs each request under a distributed
//! lock named by the request (feature `tower`).
//!
//! For axum, tonic, hyper, or any tower stack: a function of the request's
//! head (method, URI, headers, extensions) names the lock, say `order:42`
//! for `POST /orders/42/charge`, or returns `None` to let the request
//! through unlocked. The inner service's future runs through
//! [`LockClient::run_locked`]: it is only called once the lock is held, the
//! lease is renewed while it runs, it is dropped when the lock is lost, and
//! the lock is let go of however it ends (the response, an error, a panic,
//! or the client hanging up, which drops the future). A request that does
//! not get the lock, or whose lock is lost, is answered by the layer
//! without the inner service's response:
//!
//! | What happened | [`ErrorKind`] | Status (default) |
//! |---|---|---|
//! | another owner held the lock for the whole wait | `Contended` | `409 Conflict` ([`LockLayer::when_held`] changes it) |
//! | Redis unreachable or not answering in time | `Unavailable` | `503 Service Unavailable` |
//! | the client renews all the leases it can | `AtCapacity` | `503 Service Unavailable` |
//! | the lock was lost while the inner service ran | `Lost` | `503 Service Unavailable` |
//! | a key or option that is not valid, a Redis error, no client | the others | `500 Internal Server Error` |
//!
//! `409` rather than `423 Locked`: 423 belongs to WebDAV, where it says the
//! resource itself is locked against changes; here the request was refused
//! because a concurrent one is running, and may be sent again (the meaning
//! HTTP gives 409). The refusals have an empty body; for another answer
//! (a JSON problem document, a `Retry-After` header), give
//! [`refuse_with`](LockLayer::refuse_with) a function of the [`LockError`].
//!
//! The layer waits for the lock as its [`RunOptions`] say; the default is
//! the client's default wait, often too long for an HTTP request: set a
//! short one, or `Duration::ZERO` to answer 409 at once.
//!
//! ```
//! use http::{Request, Response, StatusCode};
//! use lock_core::tower::LockLayer;
//! use lock_core::{LockClient, MemoryStore, RunOptions};
//! use std::convert::Infallible;
//! use std::future::{Ready, ready};
//! use std::task::{Context, Poll};
//! use std::time::Duration;
//! use tower_layer::Layer;
//! use tower_service::Service;
//!
//! /// The route: answers 200. (In axum: `Router::new().route(..).layer(layer)`.)
//! #[derive(Clone)]
//! struct Charge;
//!
//! impl Service<Request<String>> for Charge {
//!     type Response = Response<String>;
//!     type Error = Infallible;
//!     type Future = Ready<Result<Response<String>, Infallible>>;
//!     fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
//!         Poll::Ready(Ok(()))
//!     }
//!     fn call(&mut self, _: Request<String>) -> Self::Future {
//!         ready(Ok(Response::new("charged".to_owned())))
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), lock_core::LockError> {
//! let store = MemoryStore::new();
//! let client = LockClient::in_memory_on(&store);
//! // `/orders/{id}/charge` locks `order:{id}`; other paths are not locked.
//! let layer = LockLayer::new(client, |request: &http::request::Parts| {
//!     let id = request.uri.path().strip_prefix("/orders/")?.strip_suffix("/charge")?;
//!     Some(format!("order:{id}"))
//! })
//! .options(RunOptions::new().ttl(Duration::from_secs(30)).wait(Duration::ZERO));
//! let mut service = layer.layer(Charge);
//!
//! let request = || Request::post("/orders/42/charge").body(String::new()).unwrap();
//! let answer = service.call(request()).await.unwrap();
//! assert_eq!(answer.status(), StatusCode::OK);
//!
//! // While another replica charges order 42, the request is refused.
//! let replica = LockClient::in_memory_on(&store);
//! let held = replica.lock("order:42", Duration::from_secs(30)).await?;
//! let refused = service.call(request()).await.unwrap();
//! assert_eq!(refused.status(), StatusCode::CONFLICT);
//! held.release().await?;
//! # Ok(()) }
//! ```

use crate::client::LockClient;
use crate::error::{ErrorKind, LockError};
use crate::run::RunOptions;
use futures::future::BoxFuture;
use http::request::Parts;
use http::{Request, Response, StatusCode};
use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};
use tower_layer::Layer;
use tower_service::Service;

/// A tower [`Layer`] that runs each request under the lock its key
/// function names; see the [module docs](self) for what it answers.
///
/// `K` names the lock: `Fn(&http::request::Parts) -> Option<String>`,
/// called once per request, before the inner service is; `None` lets the
/// request through without a lock. `R` answers the requests that do not
/// get the lock: [`Refusal`] by default, or any
/// `Fn(LockError) -> http::Response<B>` (see [`refuse_with`](Self::refuse_with)).
///
/// The layer and its services are `Clone` (clones share the client and the
/// functions), and the service's error is the inner service's: axum's
/// `Router::layer` and `route_layer` take it as it is.
pub struct LockLayer<K, R = Refusal> {
    client: LockClient,
    key: Arc<K>,
    options: RunOptions,
    refuse: Arc<R>,
}

impl<K> LockLayer<K, Refusal>
where
    K: Fn(&Parts) -> Option<String>,
{
    /// Locks through `client` the key `key` names, with the client's
    /// default ttl and wait ([`options`](Self::options) sets others), and
    /// refuses as the [module docs](self) say.
    pub fn new(client: LockClient, key: K) -> LockLayer<K, Refusal> {
        LockLayer {
            client,
            key: Arc::new(key),
            options: RunOptions::new(),
            refuse: Arc::new(Refusal::default()),
        }
    }

    /// The status of the answer to a request whose lock another owner held
    /// for the whole wait (default `409 Conflict`; `423 Locked`, say, for a
    /// WebDAV-minded API).
    pub fn when_held(mut self, status: StatusCode) -> LockLayer<K, Refusal> {
        self.refuse = Arc::new(Refusal { held: status });
        self
    }
}

impl<K, R> LockLayer<K, R> {
    /// How each lock is taken (ttl, wait, fencing, ...) and what is done on
    /// loss: [`OnLost::Continue`](crate::OnLost::Continue) lets the inner
    /// service finish and sends its response.
    pub fn options(mut self, options: impl Into<RunOptions>) -> LockLayer<K, R> {
        self.options = options.into();
        self
    }

    /// Answers a request that did not get its lock, or lost it, with
    /// `refuse(error)` instead of the default [`Refusal`]: any
    /// `Fn(LockError) -> http::Response<B>`, `B` the inner service's
    /// response body. [`Refusal::status`] gives the default status of an
    /// error.
    ///
    /// ```
    /// use http::{Response, StatusCode};
    /// use lock_core::tower::{LockLayer, Refusal};
    /// use lock_core::{ErrorKind, LockClient};
    ///
    /// let layer = LockLayer::new(LockClient::in_memory(), |request: &http::request::Parts| {
    ///     request.headers.get("x-account")?.to_str().ok().map(|id| format!("account:{id}"))
    /// })
    /// .refuse_with(|error: lock_core::LockError| {
    ///     let mut answer = Response::new(format!("{error}\n"));
    ///     *answer.status_mut() = Refusal::default().status(&error);
    ///     if error.kind() == ErrorKind::Contended {
    ///         answer.headers_mut().insert("retry-after", "1".parse().unwrap());
    ///     }
    ///     answer
    /// });
    /// # let _ = layer;
    /// ```
    pub fn refuse_with<R2>(self, refuse: R2) -> LockLayer<K, R2> {
        LockLayer {
            client: self.client,
            key: self.key,
            options: self.options,
            refuse: Arc::new(refuse),
        }
    }
}

impl<K, R> Clone for LockLayer<K, R> {
    fn clone(&self) -> Self {
        LockLayer {
            client: self.client.clone(),
            key: self.key.clone(),
            options: self.options.clone(),
            refuse: self.refuse.clone(),
        }
    }
}

impl<K, R> fmt::Debug for LockLayer<K, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockLayer")
            .field("client", &self.client)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl<S, K, R> Layer<S> for LockLayer<K, R> {
    type Service = LockService<S, K, R>;

    fn layer(&self, inner: S) -> LockService<S, K, R> {
        LockService {
            inner,
            layer: self.clone(),
        }
    }
}

/// The [`Service`] a [`LockLayer`] wraps around an inner one.
pub struct LockService<S, K, R = Refusal> {
    inner: S,
    layer: LockLayer<K, R>,
}

impl<S: Clone, K, R> Clone for LockService<S, K, R> {
    fn clone(&self) -> Self {
        LockService {
            inner: self.inner.clone(),
            layer: self.layer.clone(),
        }
    }
}

impl<S: fmt::Debug, K, R> fmt::Debug for LockService<S, K, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockService")
            .field("inner", &self.inner)
            .field("layer", &self.layer)
            .finish()
    }
}

impl<S, K, R, ReqBody, ResBody> Service<Request<ReqBody>> for LockService<S, K, R>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Error: Send + 'static,
    S::Future: Send + 'static,
    K: Fn(&Parts) -> Option<String>,
    R: Refuse<ResBody> + Send + Sync + 'static,
    ReqBody: Send + 'static,
    ResBody: Send + 'static,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Response<ResBody>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let (head, body) = request.into_parts();
        let key = (self.layer.key)(&head);
        let request = Request::from_parts(head, body);
        // The service polled ready is the one called; the clone stays for
        // the next request (tower's rule for services called from a future).
        let ready = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, ready);
        let Some(key) = key else {
            return Box::pin(inner.call(request));
        };
        let (client, options) = (self.layer.client.clone(), self.layer.options.clone());
        let refuse = self.layer.refuse.clone();
        Box::pin(async move {
            // Called inside the future: nothing of the request runs before
            // the lock is held.
            let route = async move { inner.call(request).await };
            match client.run_locked(&key, options, route).await {
                Ok(answer) => answer,
                Err(error) => Ok(refuse.refuse(error)),
            }
        })
    }
}

/// How a [`LockLayer`] answers a request that did not get its lock, or
/// lost it while the inner service ran: implemented by [`Refusal`] and by
/// every `Fn(LockError) -> http::Response<B>`.
pub trait Refuse<B> {
    /// The answer, for `error`.
    fn refuse(&self, error: LockError) -> Response<B>;
}

impl<B, F> Refuse<B> for F
where
    F: Fn(LockError) -> Response<B>,
{
    fn refuse(&self, error: LockError) -> Response<B> {
        self(error)
    }
}

/// The default answer of a [`LockLayer`]: the [status](Self::status) of
/// the error, and an empty body (`B::default()`, which axum's, hyper's and
/// tonic's bodies offer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refusal {
    held: StatusCode,
}

impl Default for Refusal {
    fn default() -> Refusal {
        Refusal {
            held: StatusCode::CONFLICT,
        }
    }
}

impl Refusal {
    /// The status of the answer to `error`, as the [module docs](self)'
    /// table gives it.
    pub fn status(&self, error: &LockError) -> StatusCode {
        match error.kind() {
            ErrorKind::Contended => self.held,
            ErrorKind::Unavailable | ErrorKind::AtCapacity | ErrorKind::Lost => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

impl<B: Default> Refuse<B> for Refusal {
    fn refuse(&self, error: LockError) -> Response<B> {
        let mut answer = Response::new(B::default());
        *answer.status_mut() = self.status(&error);
        answer
    }
}
