//! The connection as pingora sees it during one request: it reads the
//! request's body and nothing past it.
//!
//! Why: pingora's body reader forgives chunked framing that a strict parser
//! refuses (an empty chunk-size line ends its body; it skips trailers
//! unread), and it may read past the end of a chunked body, into the next
//! request, which it then drops (or, on its streaming path, takes for
//! "data after the end of the body" and fails the request). Here each read
//! of a chunked body is checked ([`crate::strict::chunked`]) before pingora
//! sees it, and refused as an `InvalidData` error holding a
//! [`crate::strict::chunked::ChunkError`]; bytes past the end of the body are kept for the
//! listener, which reads the next head from them. Once the body is over, a
//! read waits for ever: the next request is the listener's to read, after
//! this one's answer (pingora's own idle reads wait likewise).

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use async_trait::async_trait;
use bytes::BytesMut;
use pingora::protocols::raw_connect::ProxyDigest;
use pingora::protocols::{
    GetProxyDigest, GetSocketDigest, GetTimingDigest, Peek, Shutdown, SocketDigest, Ssl, Stream,
    TimingDigest, UniqueID, UniqueIDType,
};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::strict::chunked::Chunked;

/// What is left of the request's body on the stream.
#[derive(Debug)]
pub enum Left {
    /// This many bytes of a `Content-Length` body.
    Length(u64),
    /// The rest of a chunked body.
    Chunked(Chunked),
    /// Nothing: the body is over (or there was none).
    Done,
}

/// A request's stream: see the module comment.
#[derive(Debug)]
pub struct Framed {
    inner: Stream,
    left: Left,
    /// Bytes read past the end of a chunked body: the next request's.
    next: BytesMut,
}

impl Framed {
    pub fn new(inner: Stream, left: Left) -> Framed {
        Framed {
            inner,
            left,
            next: BytesMut::new(),
        }
    }

    /// The stream, and what was read of the next request.
    pub fn into_parts(self) -> (Stream, BytesMut) {
        (self.inner, self.next)
    }
}

impl AsyncRead for Framed {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match &mut this.left {
            Left::Done => Poll::Pending,
            Left::Length(left) => {
                let before = buf.filled().len();
                std::task::ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
                let got = &buf.filled()[before..];
                match usize::try_from(*left) {
                    Ok(rest) if rest <= got.len() => {
                        this.next.extend_from_slice(&got[rest..]);
                        buf.set_filled(before + rest);
                        this.left = Left::Done;
                    }
                    _ => *left -= got.len() as u64,
                }
                Poll::Ready(Ok(()))
            }
            Left::Chunked(chunked) => {
                let before = buf.filled().len();
                std::task::ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
                let got = &buf.filled()[before..];
                match chunked.feed(got) {
                    Ok(used) => {
                        if used < got.len() {
                            this.next.extend_from_slice(&got[used..]);
                            buf.set_filled(before + used);
                        }
                        if chunked.is_done() {
                            this.left = Left::Done;
                        }
                        Poll::Ready(Ok(()))
                    }
                    Err(e) => {
                        buf.set_filled(before);
                        Poll::Ready(Err(io::Error::new(io::ErrorKind::InvalidData, e)))
                    }
                }
            }
        }
    }
}

impl AsyncWrite for Framed {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[async_trait]
impl Shutdown for Framed {
    async fn shutdown(&mut self) {
        self.inner.shutdown().await
    }
}

impl UniqueID for Framed {
    fn id(&self) -> UniqueIDType {
        self.inner.id()
    }
}

impl Ssl for Framed {
    fn get_ssl(&self) -> Option<&pingora::protocols::tls::TlsRef> {
        self.inner.get_ssl()
    }

    fn get_ssl_digest(&self) -> Option<Arc<pingora::protocols::tls::SslDigest>> {
        self.inner.get_ssl_digest()
    }

    fn selected_alpn_proto(&self) -> Option<pingora::protocols::ALPN> {
        self.inner.selected_alpn_proto()
    }
}

impl GetTimingDigest for Framed {
    fn get_timing_digest(&self) -> Vec<Option<TimingDigest>> {
        self.inner.get_timing_digest()
    }
}

impl GetProxyDigest for Framed {
    fn get_proxy_digest(&self) -> Option<Arc<ProxyDigest>> {
        self.inner.get_proxy_digest()
    }
}

impl GetSocketDigest for Framed {
    fn get_socket_digest(&self) -> Option<Arc<SocketDigest>> {
        self.inner.get_socket_digest()
    }
}

#[async_trait]
impl Peek for Framed {}
