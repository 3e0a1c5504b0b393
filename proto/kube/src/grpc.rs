//! What custody's gRPC servers (the agent's gate, the controller's report service) share.

use std::time::Duration;

use tonic::transport::Server;

/// A server's bounds against slow or many callers: a call's answer must start within 120 s (a
/// gate stream then runs as long as its pod waits), one connection carries at most 32 calls at
/// once and 64 streams, and HTTP/2 keepalive pings find peers that went away (10 s to answer).
/// The answer timeout is 120 s: a freeze answers once FIFREEZE returned, which flushes the
/// filesystem's dirty data first. Serve it on [`counted_incoming`] to bound its connections
/// too, with TLS handshakes bounded by [`TLS_HANDSHAKE_TIMEOUT`].
pub fn bounded(builder: Server) -> Server {
    builder
        .timeout(Duration::from_secs(120))
        .concurrency_limit_per_connection(32)
        .max_concurrent_streams(Some(64))
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)))
}

/// How many connections one server holds open at once (a node runs at most about 110 pods,
/// each waiting with one connection), and how many of them one peer address may hold: a
/// connection beyond either is closed as soon as it is accepted (its caller tries again), so
/// that one pod cannot take every slot, and memory stays bounded (each open TLS connection
/// costs some tens of KiB).
pub const MAX_CONNECTIONS: usize = 256;
pub const MAX_CONNECTIONS_PER_PEER: usize = 32;

/// How long a TLS handshake may take before its connection is closed.
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Open connections, in all and per peer address.
#[derive(Default)]
struct Slots {
    total: usize,
    per_peer: std::collections::HashMap<std::net::IpAddr, usize>,
}

/// Whether a connection from `peer` may be kept, given what is open (pure: table-tested).
fn admit(slots: &Slots, peer: std::net::IpAddr, max: usize, per_peer: usize) -> bool {
    slots.total < max && slots.per_peer.get(&peer).copied().unwrap_or(0) < per_peer
}

/// An accepted connection, counted against the limits until it closes.
pub struct Counted {
    stream: tokio::net::TcpStream,
    peer: std::net::IpAddr,
    slots: std::sync::Arc<std::sync::Mutex<Slots>>,
}

impl Drop for Counted {
    fn drop(&mut self) {
        let mut slots = self
            .slots
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        slots.total = slots.total.saturating_sub(1);
        if let Some(count) = slots.per_peer.get_mut(&self.peer) {
            *count -= 1;
            if *count == 0 {
                slots.per_peer.remove(&self.peer);
            }
        }
    }
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

/// The connections `listener` accepts that are within [`MAX_CONNECTIONS`] and
/// [`MAX_CONNECTIONS_PER_PEER`]; the others are closed at once. An accept that fails (out of
/// file descriptors) is logged and tried again after a pause, never ending the server.
pub fn counted_incoming(
    listener: tokio::net::TcpListener,
) -> impl futures::Stream<Item = std::io::Result<Counted>> {
    let slots = std::sync::Arc::new(std::sync::Mutex::new(Slots::default()));
    futures::stream::unfold((listener, slots), |(listener, slots)| async move {
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::warn!(%error, "accepting a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let peer = peer.ip();
            {
                let mut open = slots
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
                if !admit(&open, peer, MAX_CONNECTIONS, MAX_CONNECTIONS_PER_PEER) {
                    tracing::debug!(%peer, open = open.total, "too many connections; closed");
                    continue;
                }
                open.total += 1;
                *open.per_peer.entry(peer).or_default() += 1;
            }
            let _ = stream.set_nodelay(true);
            let counted = Counted {
                stream,
                peer,
                slots: slots.clone(),
            };
            return Some((Ok(counted), (listener, slots)));
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connection is kept while both the total and its peer's count are below their limits.
    #[test]
    fn connections_are_capped_in_all_and_per_peer() {
        let (one, two): (std::net::IpAddr, std::net::IpAddr) =
            ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let open = |total: usize, of_one: usize| Slots {
            total,
            per_peer: [(one, of_one)]
                .into_iter()
                .filter(|(_, n)| *n > 0)
                .collect(),
        };
        let rows = [
            (open(0, 0), one, true),
            (open(15, 15), one, true),
            (open(16, 16), one, false),
            (open(16, 16), two, true),
            (open(255, 0), two, true),
            (open(256, 0), two, false),
            (open(256, 16), one, false),
        ];
        for (slots, peer, expected) in rows {
            assert_eq!(
                admit(&slots, peer, 256, 16),
                expected,
                "{} open, {peer}",
                slots.total
            );
        }
    }
}
