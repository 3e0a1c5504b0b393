//! Serving the webhooks: HTTPS on every replica with the certificate in force (rotation swaps
//! it without a restart), the configurations' CA kept current, and the routes.

use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use axum::Router;
use axum::routing::post;
use kube::Client;
use tokio_rustls::rustls;

use super::{PATH, WebhookContext, certs, mutate, requester};
use crate::error::{Error, Result};

/// Serves the certificate currently in force; rotation swaps it without a restart.
#[derive(Debug)]
struct Resolver(RwLock<Arc<rustls::sign::CertifiedKey>>);

impl rustls::server::ResolvesServerCert for Resolver {
    fn resolve(
        &self,
        _: rustls::server::ClientHello<'_>,
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        Some(self.0.read().expect("not poisoned").clone())
    }
}

fn certified_key(bundle: &certs::Bundle) -> Result<Arc<rustls::sign::CertifiedKey>> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let chain = CertificateDer::pem_slice_iter(bundle.cert.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| Error::Webhook(format!("serving certificate: {error}")))?;
    let key = PrivateKeyDer::from_pem_slice(bundle.key.as_bytes())
        .map_err(|error| Error::Webhook(format!("serving key: {error}")))?;
    let signer = rustls::crypto::ring::sign::any_supported_type(&key)
        .map_err(|error| Error::Webhook(format!("serving key: {error}")))?;
    Ok(Arc::new(rustls::sign::CertifiedKey::new(chain, signer)))
}

/// Settings of the webhook server.
pub struct Settings {
    pub address: SocketAddr,
    /// The MutatingWebhookConfiguration of the restore gate.
    pub configuration: String,
    /// The ValidatingWebhookConfiguration of the requester check ([`requester`]).
    pub validating_configuration: String,
    pub secret: String,
    pub names: Vec<String>,
    pub days: u32,
    /// How often the certificate is checked for renewal.
    pub check: Duration,
    /// Set once the webhook listens: the replica's readiness.
    pub ready: Arc<std::sync::atomic::AtomicBool>,
}

/// Publishes `ca` to both webhook configurations.
async fn publish(client: &Client, settings: &Settings, ca: &str) -> Result<()> {
    certs::publish_ca(
        client,
        certs::Configuration::Mutating,
        &settings.configuration,
        ca,
    )
    .await?;
    certs::publish_ca(
        client,
        certs::Configuration::Validating,
        &settings.validating_configuration,
        ca,
    )
    .await?;
    Ok(())
}

/// Issues (or reads) the certificate, publishes the CA, serves until `stopped`, and checks for
/// renewal every hour.
pub async fn run(
    context: Arc<WebhookContext>,
    settings: Settings,
    stopped: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let client = context.client.clone();
    requester::learn_own_user(&context).await;
    // Until the CA is in both configurations the API server cannot call this replica, so it
    // does not listen (nor say it is ready) before: a failure (RBAC, another replica's write
    // at the same moment) is tried again, and said, rather than leaving a replica that is
    // never ready and never restarted.
    let mut pause = Duration::from_secs(1);
    let bundle = loop {
        let attempt = async {
            let bundle =
                certs::ensure(&client, &settings.secret, &settings.names, settings.days).await?;
            publish(&client, &settings, &bundle.ca_cert).await?;
            Ok::<_, Error>(bundle)
        };
        match attempt.await {
            Ok(bundle) => break bundle,
            Err(error) => {
                tracing::warn!(%error, retry_in_seconds = pause.as_secs(), "the webhook cannot start yet: its certificate or CA cannot be written");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(30));
            }
        }
    };
    let resolver = Arc::new(Resolver(RwLock::new(certified_key(&bundle)?)));
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|error| Error::Webhook(error.to_string()))?
    .with_no_client_auth()
    .with_cert_resolver(resolver.clone());
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind(settings.address)
        .await
        .map_err(|error| Error::Webhook(format!("binding {}: {error}", settings.address)))?;
    tracing::info!(address = %settings.address, configuration = settings.configuration, "serving the admission webhook");
    settings
        .ready
        .store(true, std::sync::atomic::Ordering::Relaxed);

    // Renewal: every replica re-reads the Secret, so all serve what one of them issued.
    let renew = {
        let client = client.clone();
        let resolver = resolver.clone();
        async move {
            let mut served = bundle;
            loop {
                tokio::time::sleep(settings.check).await;
                match certs::ensure(&client, &settings.secret, &settings.names, settings.days).await
                {
                    Ok(bundle) if bundle != served => match certified_key(&bundle) {
                        Ok(key) => {
                            *resolver.0.write().expect("not poisoned") = key;
                            let _ = publish(&client, &settings, &bundle.ca_cert).await;
                            tracing::info!(
                                not_after = bundle.not_after,
                                "webhook certificate rotated"
                            );
                            served = bundle;
                        }
                        Err(error) => tracing::warn!(%error, "renewed certificate unusable"),
                    },
                    Ok(_) => {
                        let _ = publish(&client, &settings, &served.ca_cert).await;
                    }
                    Err(error) => tracing::warn!(%error, "webhook certificate check failed"),
                }
            }
        }
    };

    let router = Router::new()
        .route(PATH, post(mutate))
        .route(requester::PATH, post(requester::validate))
        .with_state(context);
    let serve = async move {
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::warn!(%error, "webhook accept");
                    continue;
                }
            };
            let acceptor = acceptor.clone();
            let router = router.clone();
            tokio::spawn(async move {
                let tls =
                    match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(stream))
                        .await
                    {
                        Ok(Ok(tls)) => tls,
                        Ok(Err(error)) => {
                            tracing::debug!(%peer, %error, "webhook TLS handshake");
                            return;
                        }
                        Err(_) => return,
                    };
                let service = hyper_util::service::TowerToHyperService::new(router);
                let _ = hyper_util::server::conn::auto::Builder::new(
                    hyper_util::rt::TokioExecutor::new(),
                )
                .http1_only()
                .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                .await;
            });
        }
    };
    tokio::select! {
        _ = serve => {}
        _ = renew => {}
        _ = stopped => {}
    }
    Ok(())
}
