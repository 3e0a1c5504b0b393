//! Keeping custody's CA and certificates current while the controller runs: the CA Secret
//! made, rotated and read ([`ensure`]), its bundle published, the shared authority that signs,
//! and the loop that renews them.

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};

use super::{Authority, CONFIG_MAP, Step, authority_of, issue_own, next_secret, state_of, step};
use crate::error::{Error, Result};

/// Reads the CA Secret (`namespace/name`), making or rotating the CA when [`step`] says so (a
/// replica that loses the race reads the winner's). Returns what signs and what is trusted.
pub async fn ensure(
    client: &Client,
    secret: &str,
    lifetime: i64,
    propagation: i64,
    leaf_lifetime: i64,
) -> Result<Authority> {
    let (namespace, name) = secret.split_once('/').ok_or_else(|| {
        Error::Certificates(format!("--ca-secret {secret:?} is not namespace/name"))
    })?;
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    for _ in 0..5 {
        let now = k8s_openapi::jiff::Timestamp::now().as_second();
        let stored = api.get_opt(name).await.map_err(|source| Error::Read {
            object: format!("Secret {secret}"),
            source,
        })?;
        // A Secret of that name custody did not make is not overwritten: it may be someone's.
        if let Some(found) = &stored
            && found
                .labels()
                .get("app.kubernetes.io/managed-by")
                .map(String::as_str)
                != Some("custody")
        {
            return Err(Error::Certificates(format!(
                "Secret {secret} exists and is not custody's (no label app.kubernetes.io/managed-by=custody): delete it, or name another with --ca-secret"
            )));
        }
        let decision = step(stored.as_ref().map(state_of), now, lifetime, leaf_lifetime);
        if decision == Step::Keep
            && let Some(authority) = stored.as_ref().and_then(|found| authority_of(found, now))
        {
            return Ok(authority);
        }
        let wanted = next_secret(stored.as_ref(), name, decision, now, lifetime, propagation)?;
        let written = match &stored {
            None => api.create(&PostParams::default(), &wanted).await,
            Some(_) => api.replace(name, &PostParams::default(), &wanted).await,
        };
        match written {
            Ok(written) => {
                tracing::info!(secret, ?decision, "custody CA written");
                if let Some(authority) = authority_of(&written, now) {
                    return Ok(authority);
                }
            }
            Err(kube::Error::Api(status)) if status.code == 409 => continue,
            Err(source) => {
                return Err(Error::Create {
                    object: format!("Secret {secret}"),
                    source,
                });
            }
        }
    }
    Err(Error::Certificates(format!(
        "Secret {secret} keeps changing; try again"
    )))
}

/// Publishes the trust bundle as ConfigMap [`CONFIG_MAP`] in `namespace`.
pub async fn publish(client: &Client, namespace: &str, bundle: &str) -> Result<()> {
    crate::gate_ca::apply(
        client,
        namespace,
        CONFIG_MAP,
        bundle,
        crate::run::CONTROLLER_NAME,
    )
    .await
}

/// Writes the new bundle into `custody-gate-ca` of every namespace under restore now, rather
/// than at its Restore's next reconciliation: the kubelet then has the whole propagation time
/// to bring it to the pods that wait there.
async fn republish_gate_ca(client: &Client, bundle: &str) {
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let marked = match namespaces
        .list_metadata(&kube::api::ListParams::default().labels(crate::restoring::LABEL))
        .await
    {
        Ok(marked) => marked,
        Err(error) => {
            tracing::warn!(%error, "listing namespaces under restore to publish the new CA bundle");
            return;
        }
    };
    for namespace in marked {
        let name = namespace.metadata.name.unwrap_or_default();
        if let Err(error) =
            crate::gate_ca::publish(client, &name, Some(bundle), crate::restores::FIELD_MANAGER)
                .await
        {
            tracing::warn!(namespace = name, %error, "publishing the new CA bundle");
        }
    }
}

/// The authority as this replica last read it, shared with the report service.
#[derive(Clone, Debug, Default)]
pub struct Shared(std::sync::Arc<std::sync::RwLock<Option<Authority>>>);

impl Shared {
    pub fn current(&self) -> Option<Authority> {
        self.0
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    fn set(&self, authority: Authority) {
        *self
            .0
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(authority);
    }
}

/// Whether a certificate issued at `issued_at` by `issued_by`, valid until `not_after`, is to
/// be replaced at `now` (pure): a third of its `lifetime` or less left, signed by another CA
/// than the one signing now, or issued before `reissue_after`.
pub fn renew_leaf(
    held: Option<(i64, i64, &str)>,
    signing: &str,
    reissue_after: i64,
    now: i64,
    lifetime: i64,
) -> bool {
    let Some((issued_at, not_after, issued_by)) = held else {
        return true;
    };
    issued_by != signing || issued_at < reissue_after || not_after - now <= lifetime / 3
}

/// How [`run`] works.
#[derive(Clone, Debug)]
pub struct Settings {
    /// `namespace/name` of the CA Secret.
    pub secret: String,
    pub ca_lifetime: std::time::Duration,
    pub propagation: std::time::Duration,
    pub check: std::time::Duration,
    /// Names of the report service's certificate.
    pub report_names: Vec<String>,
    /// Lifetime of the certificates issued.
    pub leaf_lifetime: std::time::Duration,
}

/// Keeps the CA, its published trust bundle, the gate CA handed to namespaces and the report
/// service's certificate (`report`) current, checking every `settings.check`.
pub async fn run(
    client: Client,
    settings: Settings,
    shared: Shared,
    report: Option<std::sync::Arc<custody_kube::tls::Swap>>,
    gate: crate::gate_ca::Trust,
    metrics: std::sync::Arc<crate::metrics::Metrics>,
) {
    let namespace = settings
        .secret
        .split_once('/')
        .map(|(namespace, _)| namespace.to_string())
        .unwrap_or_default();
    // The report service's certificate: (issued at, not after, issuing CA).
    let mut served: Option<(i64, i64, String)> = None;
    let mut published: Option<String> = None;
    let lifetime = settings.leaf_lifetime.as_secs() as i64;
    loop {
        let attempt = async {
            let authority = ensure(
                &client,
                &settings.secret,
                settings.ca_lifetime.as_secs() as i64,
                settings.propagation.as_secs() as i64,
                lifetime,
            )
            .await?;
            if published.as_deref() != Some(authority.bundle.as_str()) {
                publish(&client, &namespace, &authority.bundle).await?;
                if gate.current().is_some() {
                    republish_gate_ca(&client, &authority.bundle).await;
                }
                published = Some(authority.bundle.clone());
            }
            gate.set(authority.bundle.clone());
            shared.set(authority.clone());
            let now = k8s_openapi::jiff::Timestamp::now().as_second();
            if let Some(swap) = &report
                && renew_leaf(
                    served
                        .as_ref()
                        .map(|(from, to, by)| (*from, *to, by.as_str())),
                    &authority.name,
                    authority.reissue_after,
                    now,
                    lifetime,
                )
            {
                let (issued, key) = issue_own(&authority, &settings.report_names, now, lifetime)?;
                swap.set(&issued.cert, &key).map_err(Error::Certificates)?;
                tracing::info!(
                    names = settings.report_names.join(","),
                    not_after = issued.not_after,
                    ca = authority.name,
                    "report service certificate issued"
                );
                served = Some((issued.issued_at, issued.not_after, authority.name.clone()));
            }
            metrics.ca_checked_at_seconds.set(now);
            Ok::<_, Error>(())
        };
        let pause = match attempt.await {
            Ok(()) => settings.check,
            Err(error) => {
                tracing::warn!(%error, secret = settings.secret, "custody's CA cannot be read or renewed; trying again in 5 s");
                std::time::Duration::from_secs(5)
            }
        };
        tokio::time::sleep(pause).await;
    }
}
