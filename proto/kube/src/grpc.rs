//! What custody's gRPC servers (the agent's gate, the controller's report service) share.

use std::time::Duration;

use tonic::transport::Server;

/// A server's bounds against slow or many callers: a call's answer must start within 30 s (a
/// gate stream then runs as long as its pod waits), one connection carries at most 32 calls at
/// once and 64 streams, and HTTP/2 keepalive pings find peers that went away (10 s to answer).
/// Serve it on [`counted_incoming`] to bound its connections too.
pub fn bounded(builder: Server) -> Server {
    builder
        .timeout(Duration::from_secs(30))
        .concurrency_limit_per_connection(32)
        .max_concurrent_streams(Some(64))
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)))
}

/// How many connections one server holds open at once (a node runs at most about 110 pods,
/// each waiting with one connection); further ones wait in the listen backlog until one
/// closes. It bounds the memory many callers can take: each open TLS connection costs some
/// tens of KiB.
pub const MAX_CONNECTIONS: usize = 256;

/// An accepted connection, counted against [`MAX_CONNECTIONS`] until it closes.
pub struct Counted {
    stream: tokio::net::TcpStream,
    _slot: tokio::sync::OwnedSemaphorePermit,
}

impl tonic::transport::server::Connected for Counted {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.stream.connect_info()
    }
}

impl tokio::io::AsyncRead for Counted {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        context: &mut std::task::Context<'_>,
        buffer: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.stream).poll_read(context, buffer)
    }
}

impl tokio::io::AsyncWrite for Counted {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        context: &mut std::task::Context<'_>,
        buffer: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.stream).poll_write(context, buffer)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        context: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.stream).poll_flush(context)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        context: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.stream).poll_shutdown(context)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        context: &mut std::task::Context<'_>,
        buffers: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.stream).poll_write_vectored(context, buffers)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// The connections `listener` accepts, at most `max` open at once: a slot is taken before
/// each accept and given back when the connection closes. An accept that fails (out of file
/// descriptors) is logged and tried again after a pause, never ending the server.
pub fn counted_incoming(
    listener: tokio::net::TcpListener,
    max: usize,
) -> impl futures::Stream<Item = std::io::Result<Counted>> {
    let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(max));
    futures::stream::unfold((listener, slots), |(listener, slots)| async move {
        let slot = slots
            .clone()
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    let counted = Counted {
                        stream,
                        _slot: slot,
                    };
                    return Some((Ok(counted), (listener, slots)));
                }
                Err(error) => {
                    tracing::warn!(%error, "accepting a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    })
}
