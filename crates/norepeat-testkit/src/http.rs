//! One request through a tower service, read back whole.
//!
//! Every HTTP test sends a request to an app (`oneshot` on a clone, so the
//! app serves the next request too) and reads the answer's status, headers
//! and body. [`send`] does that once for every test; [`Answer`] holds what
//! came back, with readers for what the tests look at ([`Answer::json`],
//! [`Answer::text`], [`Answer::code`], [`Answer::replayed`]).
//!
//! ```
//! use http::{Request, Response, StatusCode};
//! use norepeat_testkit::send;
//!
//! # tokio::runtime::Runtime::new().expect("runtime").block_on(async {
//! let app = tower::service_fn(|_req: Request<String>| async {
//!     Ok::<_, std::convert::Infallible>(
//!         Response::builder()
//!             .status(StatusCode::CONFLICT)
//!             .header("content-type", "application/problem+json")
//!             .body(r#"{"code":"duplicate_submission"}"#.to_owned())
//!             .expect("valid response"),
//!     )
//! });
//! let answer = send(&app, Request::new(String::new())).await;
//! assert_eq!(answer.status, StatusCode::CONFLICT);
//! assert_eq!(answer.header("content-type"), Some("application/problem+json"));
//! assert_eq!(answer.code(), "duplicate_submission");
//! assert!(!answer.replayed());
//! # });
//! ```

use std::fmt::{Debug, Display};

use bytes::{BufMut as _, Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body::Body;
use http_body_util::BodyExt as _;
use tower::{Service, ServiceExt as _};

/// The header the tests name their caller in (the identity the library's
/// tests configure: `IdentityFrom::header("x-user-id")` and the like).
pub const USER_HEADER: &str = "x-user-id";

/// The header a one-time token travels in (`norepeat`'s default).
pub const TOKEN_HEADER: &str = "repeat-token";

/// `POST path` as `user` ([`USER_HEADER`]) with `token` in
/// [`TOKEN_HEADER`]: a token-guarded request, to which the caller adds its
/// other headers and its body. `token` is anything a header value is made
/// from (a `&str`, a `String`, a [`HeaderValue`], even an invalid one).
///
/// ```
/// let request = norepeat_testkit::post_with_token("/orders", "u1", "tok")
///     .header("content-type", "application/json")
///     .body(r#"{"sku":"a"}"#.to_owned())
///     .expect("valid request");
/// assert_eq!(request.headers()["x-user-id"], "u1");
/// assert_eq!(request.headers()["repeat-token"], "tok");
/// ```
pub fn post_with_token<T>(path: &str, user: &str, token: T) -> http::request::Builder
where
    HeaderValue: TryFrom<T>,
    <HeaderValue as TryFrom<T>>::Error: Into<http::Error>,
{
    Request::post(path)
        .header(USER_HEADER, user)
        .header(TOKEN_HEADER, token)
}

/// A response read whole: its status, its headers and its body's bytes
/// (trailers are not kept).
#[derive(Debug, Clone)]
pub struct Answer {
    /// The response's status.
    pub status: StatusCode,
    /// The response's headers.
    pub headers: HeaderMap,
    /// The body's data frames, joined.
    pub body: Bytes,
}

/// Sends `request` to a clone of `service` and reads the answer whole.
///
/// # Panics
///
/// Panics when the service fails or the response body fails: a test that
/// cannot read its answer cannot go on. For a body that is meant to fail
/// half-way, see [`send_until_break`].
pub async fn send<S, ReqBody, ResBody>(service: &S, request: Request<ReqBody>) -> Answer
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    S::Error: Debug,
    ResBody: Body,
    ResBody::Error: Display,
{
    Answer::read(respond(service, request).await).await
}

/// Like [`send`], for a response whose body may fail half-way: the body
/// reads as the bytes that came before the failure.
///
/// # Panics
///
/// Panics when the service fails.
pub async fn send_until_break<S, ReqBody, ResBody>(service: &S, request: Request<ReqBody>) -> Answer
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    S::Error: Debug,
    ResBody: Body,
    ResBody::Error: Display,
{
    let (parts, body) = respond(service, request).await.into_parts();
    Answer {
        status: parts.status,
        headers: parts.headers,
        body: read_body(body, OnError::Stop).await,
    }
}

async fn respond<S, ReqBody, ResBody>(service: &S, request: Request<ReqBody>) -> Response<ResBody>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    S::Error: Debug,
{
    match service.clone().oneshot(request).await {
        Ok(response) => response,
        Err(e) => panic!("norepeat-testkit: the service failed: {e:?}"),
    }
}

impl Answer {
    /// Reads `response` whole: for a test that sends the request itself (to
    /// time it, or to drop it half-way).
    ///
    /// # Panics
    ///
    /// Panics when the body fails.
    pub async fn read<B>(response: Response<B>) -> Self
    where
        B: Body,
        B::Error: Display,
    {
        let (parts, body) = response.into_parts();
        Self {
            status: parts.status,
            headers: parts.headers,
            body: read_body(body, OnError::Panic).await,
        }
    }

    /// The body as JSON; `Value::Null` when it is not JSON (an empty body,
    /// plain text).
    #[must_use]
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }

    /// The body as text.
    ///
    /// # Panics
    ///
    /// Panics when the body is not UTF-8.
    #[must_use]
    pub fn text(&self) -> String {
        match std::str::from_utf8(&self.body) {
            Ok(text) => text.to_owned(),
            Err(e) => panic!("norepeat-testkit: the body is not UTF-8: {e}"),
        }
    }

    /// The `code` member of a problem body (RFC 9457), such as
    /// `"duplicate_submission"`.
    ///
    /// # Panics
    ///
    /// Panics when the body is not JSON with a string `code`.
    #[must_use]
    pub fn code(&self) -> String {
        match self.json()["code"].as_str() {
            Some(code) => code.to_owned(),
            None => panic!(
                "norepeat-testkit: no problem code in the body {:?}",
                String::from_utf8_lossy(&self.body)
            ),
        }
    }

    /// The header `name` as text; `None` when it is missing or not text.
    #[must_use]
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name)?.to_str().ok()
    }

    /// Whether the answer is a replay of a stored one
    /// (`Idempotent-Replayed: true`).
    #[must_use]
    pub fn replayed(&self) -> bool {
        self.header("idempotent-replayed") == Some("true")
    }

    /// Whether a replay left its body out (`Idempotent-Body: omitted`).
    #[must_use]
    pub fn body_omitted(&self) -> bool {
        self.header("idempotent-body") == Some("omitted")
    }
}

/// What reading a body does when the body fails.
#[derive(Clone, Copy)]
enum OnError {
    Panic,
    Stop,
}

async fn read_body<B>(body: B, on_error: OnError) -> Bytes
where
    B: Body,
    B::Error: Display,
{
    let mut body = std::pin::pin!(body);
    let mut bytes = BytesMut::new();
    while let Some(frame) = body.frame().await {
        match (frame, on_error) {
            (Ok(frame), _) => {
                if let Ok(data) = frame.into_data() {
                    bytes.put(data);
                }
            }
            (Err(e), OnError::Panic) => panic!("norepeat-testkit: the response body failed: {e}"),
            (Err(_), OnError::Stop) => break,
        }
    }
    bytes.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body::Frame;
    use std::collections::VecDeque;
    use std::convert::Infallible;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    /// A body of two chunks that then fails.
    struct Breaking(VecDeque<Result<Frame<Bytes>, &'static str>>);

    impl Breaking {
        fn new() -> Self {
            Self(VecDeque::from([
                Ok(Frame::data(Bytes::from_static(b"chunk"))),
                Ok(Frame::data(Bytes::from_static(b"chunk"))),
                Err("the stream broke"),
            ]))
        }
    }

    impl Body for Breaking {
        type Data = Bytes;
        type Error = &'static str;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            Poll::Ready(self.0.pop_front())
        }
    }

    fn breaking_app()
    -> impl Service<
        Request<()>,
        Response = Response<Breaking>,
        Error = Infallible,
        Future = impl Send,
    > + Clone {
        tower::service_fn(|_req: Request<()>| async {
            Ok::<_, Infallible>(Response::new(Breaking::new()))
        })
    }

    #[tokio::test]
    async fn a_broken_body_reads_as_what_came_before_the_break() {
        let answer = send_until_break(&breaking_app(), Request::new(())).await;
        assert_eq!(answer.status, StatusCode::OK);
        assert_eq!(&answer.body[..], b"chunkchunk");
    }

    #[tokio::test]
    #[should_panic(expected = "the response body failed: the stream broke")]
    async fn send_refuses_a_broken_body() {
        send(&breaking_app(), Request::new(())).await;
    }

    #[tokio::test]
    async fn a_body_that_is_not_json_reads_as_null() {
        let app = tower::service_fn(|_req: Request<()>| async {
            Ok::<_, Infallible>(Response::new("created".to_owned()))
        });
        let answer = send(&app, Request::new(())).await;
        assert_eq!(answer.json(), serde_json::Value::Null);
        assert_eq!(answer.text(), "created");
        assert_eq!(answer.header("idempotent-replayed"), None);
        assert!(!answer.replayed() && !answer.body_omitted());
    }
}
