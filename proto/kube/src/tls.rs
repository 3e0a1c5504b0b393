//! Serving TLS with a certificate that can change while the server runs: the gate's and the
//! report service's certificates are renewed in place, so neither needs a restart.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::sign::CertifiedKey;

use crate::grpc::Counted;

/// The certificate in force; [`Swap::set`] replaces it for every later handshake (open
/// connections keep theirs).
#[derive(Debug, Default)]
pub struct Swap(RwLock<Option<Arc<CertifiedKey>>>);

impl Swap {
    /// Serves `cert` (PEM chain) with `key` (PEM) from now on.
    pub fn set(&self, cert: &str, key: &str) -> Result<(), String> {
        let certified = certified_key(cert, key)?;
        *self
            .0
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(certified);
        Ok(())
    }

    /// Whether a certificate is set.
    pub fn is_set(&self) -> bool {
        self.0
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .is_some()
    }
}

impl rustls::server::ResolvesServerCert for Swap {
    fn resolve(&self, _: rustls::server::ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.0
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }
}

/// A PEM certificate chain and key, ready to serve.
pub fn certified_key(cert: &str, key: &str) -> Result<Arc<CertifiedKey>, String> {
    let chain = CertificateDer::pem_slice_iter(cert.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| format!("certificate: {error}"))?;
    if chain.is_empty() {
        return Err("certificate: no PEM certificate found".into());
    }
    let key =
        PrivateKeyDer::from_pem_slice(key.as_bytes()).map_err(|error| format!("key: {error}"))?;
    let signer = rustls::crypto::ring::sign::any_supported_type(&key)
        .map_err(|error| format!("key: {error}"))?;
    let certified = CertifiedKey::new(chain, signer);
    // A key that does not belong to the certificate would fail every handshake: refused here.
    certified
        .keys_match()
        .map_err(|error| format!("certificate and key: {error}"))?;
    Ok(Arc::new(certified))
}

/// A TLS acceptor serving whatever `swap` holds, offering `alpn` (`h2` for gRPC).
pub fn acceptor(swap: Arc<Swap>, alpn: &[&[u8]]) -> Result<tokio_rustls::TlsAcceptor, String> {
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|error| error.to_string())?
    .with_no_client_auth()
    .with_cert_resolver(swap);
    config.alpn_protocols = alpn.iter().map(|protocol| protocol.to_vec()).collect();
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

/// The TLS connections over `incoming` (see [`crate::grpc::counted_incoming`]): each
/// handshake runs on its own task, bounded by `timeout`, so a slow peer holds up nobody; a
/// failed or late handshake closes its connection.
pub fn incoming(
    incoming: impl futures::Stream<Item = std::io::Result<Counted>> + Send + 'static,
    acceptor: tokio_rustls::TlsAcceptor,
    timeout: Duration,
) -> impl futures::Stream<Item = std::io::Result<tokio_rustls::server::TlsStream<Counted>>> {
    use futures::StreamExt;
    let (sender, receiver) = tokio::sync::mpsc::channel(64);
    tokio::spawn(async move {
        let mut incoming = std::pin::pin!(incoming);
        loop {
            // The server gone (its stream dropped): stop accepting, and let go of the port.
            let connection = tokio::select! {
                () = sender.closed() => return,
                connection = incoming.next() => connection,
            };
            let Some(connection) = connection else { return };
            let Ok(connection) = connection else { continue };
            let acceptor = acceptor.clone();
            let sender = sender.clone();
            tokio::spawn(async move {
                match tokio::time::timeout(timeout, acceptor.accept(connection)).await {
                    Ok(Ok(tls)) => {
                        let _ = sender.send(Ok(tls)).await;
                    }
                    Ok(Err(error)) => tracing::debug!(%error, "TLS handshake failed"),
                    Err(_) => tracing::debug!("TLS handshake timed out"),
                }
            });
        }
    });
    futures::stream::unfold(receiver, |mut receiver| async move {
        receiver.recv().await.map(|item| (item, receiver))
    })
}

/// Keeps `swap` serving the PEM files `cert` and `key`, re-read every `interval` (a Secret
/// volume that cert-manager renews changes them in place). Returns only if the first read
/// fails; a later unreadable or unusable pair keeps the one in force and is said.
pub async fn follow_files(
    swap: Arc<Swap>,
    cert: std::path::PathBuf,
    key: std::path::PathBuf,
    interval: Duration,
) -> Result<std::convert::Infallible, String> {
    let read = || -> Result<(String, String), String> {
        let text = |path: &std::path::Path| {
            std::fs::read_to_string(path)
                .map_err(|error| format!("reading {}: {error}", path.display()))
        };
        Ok((text(&cert)?, text(&key)?))
    };
    let mut served = read()?;
    swap.set(&served.0, &served.1)?;
    loop {
        tokio::time::sleep(interval).await;
        match read() {
            Ok(pair) if pair != served => match swap.set(&pair.0, &pair.1) {
                Ok(()) => {
                    tracing::info!(cert = %cert.display(), "serving the renewed certificate");
                    served = pair;
                }
                // A cert and key written one after the other may not match for a moment.
                Err(error) => {
                    tracing::warn!(cert = %cert.display(), %error, "renewed certificate not usable yet")
                }
            },
            Ok(_) => {}
            Err(error) => tracing::warn!(%error, "certificate files"),
        }
    }
}
