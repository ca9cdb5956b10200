//! Response bodies: reading one up to a cap, and passing it on whole when
//! the cap was passed.

use bytes::{Buf, Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

/// A response body passed on without being stored: the frames already read
/// (while trying to store it), then the rest of the original body.
///
/// Nothing is lost or reordered: a body that turned out too large to store
/// reaches the client exactly as the handler produced it.
pub struct Passthrough<B: Body> {
    read: VecDeque<Frame<Bytes>>,
    error: Option<B::Error>,
    rest: Option<Pin<Box<B>>>,
}

impl<B: Body> std::fmt::Debug for Passthrough<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Passthrough")
            .field("read_frames", &self.read.len())
            .field("rest", &self.rest.is_some())
            .finish_non_exhaustive()
    }
}

impl<B: Body> Passthrough<B> {
    /// The body as is, nothing read yet.
    pub(crate) fn new(body: B) -> Self {
        Self::from_boxed(Box::pin(body))
    }

    fn from_boxed(body: Pin<Box<B>>) -> Self {
        Self {
            read: VecDeque::new(),
            error: None,
            rest: Some(body),
        }
    }
}

fn to_bytes<D: Buf>(mut d: D) -> Bytes {
    // Zero-copy when `D` is `Bytes`.
    d.copy_to_bytes(d.remaining())
}

// No field is structurally pinned (the body is boxed), so moving a
// `Passthrough` is fine whatever `B::Error` is.
impl<B: Body> Unpin for Passthrough<B> {}

impl<B: Body> Body for Passthrough<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.get_mut();
        if let Some(frame) = this.read.pop_front() {
            return Poll::Ready(Some(Ok(frame)));
        }
        if let Some(e) = this.error.take() {
            this.rest = None;
            return Poll::Ready(Some(Err(e)));
        }
        let Some(rest) = this.rest.as_mut() else {
            return Poll::Ready(None);
        };
        match rest.as_mut().poll_frame(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Some(Ok(frame))) => Poll::Ready(Some(Ok(frame.map_data(to_bytes)))),
            Poll::Ready(Some(Err(e))) => {
                this.rest = None;
                Poll::Ready(Some(Err(e)))
            }
            Poll::Ready(None) => {
                this.rest = None;
                Poll::Ready(None)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.read.is_empty()
            && self.error.is_none()
            && self.rest.as_ref().is_none_or(|r| r.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        let read: u64 = self
            .read
            .iter()
            .filter_map(|f| f.data_ref().map(|d| d.len() as u64))
            .sum();
        let Some(rest) = &self.rest else {
            if self.error.is_some() {
                // The body breaks after what was read: not an exact length
                // (a server would frame it as complete; hyper asserts that
                // the length agrees with a `Content-Length` header).
                let mut hint = SizeHint::new();
                hint.set_lower(read);
                return hint;
            }
            return SizeHint::with_exact(read);
        };
        let r = rest.size_hint();
        let mut hint = SizeHint::new();
        hint.set_lower(r.lower().saturating_add(read));
        if let Some(upper) = r.upper() {
            hint.set_upper(upper.saturating_add(read));
        }
        hint
    }
}

/// What reading a response body up to a cap gave.
pub(crate) enum Collected<B: Body> {
    /// The whole body, within the cap, without trailers: storable.
    Whole(Bytes),
    /// Too large, trailers, or a read error: pass on, do not store.
    Partial(Passthrough<B>),
}

/// Reads `body` while it stays within `cap` bytes.
pub(crate) async fn collect_capped<B: Body>(body: B, cap: usize) -> Collected<B> {
    let mut body = Box::pin(body);
    let mut read: VecDeque<Frame<Bytes>> = VecDeque::new();
    let mut size = 0usize;
    loop {
        match body.frame().await {
            None => break,
            Some(Ok(frame)) => {
                let frame = frame.map_data(to_bytes);
                let storable = match frame.data_ref() {
                    Some(d) => {
                        size = size.saturating_add(d.len());
                        size <= cap
                    }
                    // Trailers are not stored; rather than replay a response
                    // without them, do not store it.
                    None => false,
                };
                read.push_back(frame);
                if !storable {
                    let mut p = Passthrough::from_boxed(body);
                    p.read = read;
                    return Collected::Partial(p);
                }
            }
            Some(Err(e)) => {
                return Collected::Partial(Passthrough {
                    read,
                    error: Some(e),
                    rest: None,
                });
            }
        }
    }
    Collected::Whole(concat(read, size))
}

fn concat(mut frames: VecDeque<Frame<Bytes>>, size: usize) -> Bytes {
    if frames.len() == 1 {
        if let Some(Ok(d)) = frames.pop_front().map(Frame::into_data) {
            return d;
        }
        return Bytes::new();
    }
    let mut out = BytesMut::with_capacity(size);
    for f in frames {
        if let Ok(d) = f.into_data() {
            out.extend_from_slice(&d);
        }
    }
    out.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{Full, StreamBody};

    fn stream(chunks: &[&'static [u8]]) -> impl Body<Data = Bytes, Error = std::io::Error> {
        let frames: Vec<Result<Frame<Bytes>, std::io::Error>> = chunks
            .iter()
            .map(|c| Ok(Frame::data(Bytes::from_static(c))))
            .collect();
        StreamBody::new(futures_util::stream::iter(frames))
    }

    /// A body that broke after some frames does not claim to be exactly
    /// those frames: a server would send it as complete (and hyper, with a
    /// `Content-Length` header, panics in debug builds on the mismatch).
    #[tokio::test]
    async fn a_broken_body_is_not_of_exact_length() {
        let frames: Vec<Result<Frame<Bytes>, std::io::Error>> = vec![
            Ok(Frame::data(Bytes::from_static(b"ab"))),
            Err(std::io::Error::other("broke")),
        ];
        let body = StreamBody::new(futures_util::stream::iter(frames));
        let Collected::Partial(p) = collect_capped(body, 1024).await else {
            panic!("a broken body is not storable");
        };
        let hint = p.size_hint();
        assert_eq!(hint.lower(), 2);
        assert_eq!(hint.exact(), None, "{hint:?}");
    }

    #[tokio::test]
    async fn within_the_cap_is_whole() {
        match collect_capped(stream(&[b"ab", b"cd"]), 4).await {
            Collected::Whole(b) => assert_eq!(&b[..], b"abcd"),
            Collected::Partial(_) => panic!("should fit"),
        }
        match collect_capped(Full::new(Bytes::from_static(b"x")), 1).await {
            Collected::Whole(b) => assert_eq!(&b[..], b"x"),
            Collected::Partial(_) => panic!("should fit"),
        }
    }

    #[tokio::test]
    async fn over_the_cap_passes_everything_on() {
        match collect_capped(stream(&[b"ab", b"cd", b"ef"]), 3).await {
            Collected::Whole(_) => panic!("over the cap"),
            Collected::Partial(p) => {
                let all = p.collect().await.unwrap().to_bytes();
                assert_eq!(&all[..], b"abcdef");
            }
        }
    }
}
