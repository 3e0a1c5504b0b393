//! The webhook's certificates: a long-lived CA and a serving certificate it signs, kept in one
//! Secret that every replica reads (so that all of them serve the same chain), renewed when a
//! third of its lifetime is left or when the names change, and the CA written into the
//! MutatingWebhookConfiguration's `caBundle`. Renewing the serving certificate never changes
//! the CA, so the API server never sees a certificate it does not trust.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use rcgen::{CertificateParams, Issuer, KeyPair};

use crate::error::{Error, Result};

/// Secret keys.
pub const CA_CERT: &str = "ca.crt";
pub const CA_KEY: &str = "ca.key";
pub const TLS_CERT: &str = "tls.crt";
pub const TLS_KEY: &str = "tls.key";
/// Annotations on the Secret: when the serving certificate expires (Unix seconds), and the
/// names it carries.
pub const ANNOTATION_NOT_AFTER: &str = "custody.io/not-after";
pub const ANNOTATION_NAMES: &str = "custody.io/names";
/// Lifetime of the CA.
const CA_DAYS: i64 = 3650;
const CA_NAME: &str = "custody-webhook-ca";

/// The PEM material the webhook serves with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bundle {
    pub ca_cert: String,
    pub ca_key: String,
    pub cert: String,
    pub key: String,
    pub not_after: i64,
    pub names: Vec<String>,
}

/// What to do with the stored certificate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Renewal {
    /// Nothing stored: make a CA and a serving certificate.
    Create,
    /// Keep the CA, issue a new serving certificate.
    Renew,
    Keep,
}

/// Whether a serving certificate valid until `not_after` for `names`, issued for
/// `lifetime_seconds`, must be renewed at `now` to serve `wanted`: when a third of its lifetime
/// or less is left, when the names differ, or when it cannot be read.
pub fn renewal(
    stored: Option<(Option<i64>, &[String])>,
    wanted: &[String],
    now: i64,
    lifetime_seconds: i64,
) -> Renewal {
    let Some((not_after, names)) = stored else {
        return Renewal::Create;
    };
    let Some(not_after) = not_after else {
        return Renewal::Renew;
    };
    let mut names = names.to_vec();
    let mut wanted = wanted.to_vec();
    names.sort();
    wanted.sort();
    if names != wanted || not_after - now <= lifetime_seconds / 3 {
        Renewal::Renew
    } else {
        Renewal::Keep
    }
}

fn rcgen_error(error: rcgen::Error) -> Error {
    Error::Webhook(format!("generating certificates: {error}"))
}

fn ca_params() -> CertificateParams {
    crate::pki::ca_params(CA_NAME)
}

fn offset(unix: i64) -> Result<time::OffsetDateTime> {
    time::OffsetDateTime::from_unix_timestamp(unix)
        .map_err(|error| Error::Webhook(format!("time {unix}: {error}")))
}

/// Issues a serving certificate for `names` with the CA in `ca` (PEM certificate and key), or
/// with a new CA when `ca` is `None`.
pub fn issue(ca: Option<(&str, &str)>, names: &[String], now: i64, days: u32) -> Result<Bundle> {
    let (ca_cert, ca_key) = match ca {
        Some((cert, key)) => (
            cert.to_string(),
            KeyPair::from_pem(key).map_err(rcgen_error)?,
        ),
        None => {
            let key = KeyPair::generate().map_err(rcgen_error)?;
            let mut params = ca_params();
            params.not_before = offset(now - 300)?;
            params.not_after = offset(now + CA_DAYS * 86_400)?;
            let cert = params.self_signed(&key).map_err(rcgen_error)?;
            (cert.pem(), key)
        }
    };
    let not_after = now + i64::from(days.max(1)) * 86_400;
    let leaf = crate::pki::serving_params("custody-webhook", names, now - 300, not_after)?;
    let key = KeyPair::generate().map_err(rcgen_error)?;
    let issuer = Issuer::new(ca_params(), &ca_key);
    let cert = leaf.signed_by(&key, &issuer).map_err(rcgen_error)?;
    Ok(Bundle {
        ca_cert,
        ca_key: ca_key.serialize_pem(),
        cert: cert.pem(),
        key: key.serialize_pem(),
        not_after,
        names: names.to_vec(),
    })
}

fn text(data: &BTreeMap<String, ByteString>, key: &str) -> Option<String> {
    data.get(key)
        .map(|value| String::from_utf8_lossy(&value.0).into_owned())
        .filter(|value| !value.is_empty())
}

/// What a stored Secret holds, as far as it can be read.
struct Stored {
    /// Everything, when it is all there.
    bundle: Option<Bundle>,
    not_after: Option<i64>,
    names: Vec<String>,
    /// The CA certificate and key.
    ca: Option<(String, String)>,
}

fn from_secret(secret: &Secret) -> Stored {
    let data = secret.data.clone().unwrap_or_default();
    let annotations = secret.annotations();
    let not_after = annotations
        .get(ANNOTATION_NOT_AFTER)
        .and_then(|value| value.parse().ok());
    let names: Vec<String> = annotations
        .get(ANNOTATION_NAMES)
        .map(|value| value.split(',').map(str::to_string).collect())
        .unwrap_or_default();
    let ca = text(&data, CA_CERT).zip(text(&data, CA_KEY));
    let bundle = match (&ca, text(&data, TLS_CERT), text(&data, TLS_KEY), not_after) {
        (Some((ca_cert, ca_key)), Some(cert), Some(key), Some(not_after)) => Some(Bundle {
            ca_cert: ca_cert.clone(),
            ca_key: ca_key.clone(),
            cert,
            key,
            not_after,
            names: names.clone(),
        }),
        _ => None,
    };
    Stored {
        bundle,
        not_after,
        names,
        ca,
    }
}

fn secret_of(bundle: &Bundle, name: &str, resource_version: Option<String>) -> Secret {
    let data = [
        (CA_CERT, &bundle.ca_cert),
        (CA_KEY, &bundle.ca_key),
        (TLS_CERT, &bundle.cert),
        (TLS_KEY, &bundle.key),
    ]
    .into_iter()
    .map(|(key, value)| (key.to_string(), ByteString(value.as_bytes().to_vec())))
    .collect();
    let mut secret = Secret {
        data: Some(data),
        type_: Some("kubernetes.io/tls".to_string()),
        ..Secret::default()
    };
    secret.metadata.name = Some(name.to_string());
    secret.metadata.resource_version = resource_version;
    secret.metadata.labels = Some(
        [(
            "app.kubernetes.io/managed-by".to_string(),
            "custody".to_string(),
        )]
        .into(),
    );
    secret.metadata.annotations = Some(
        [
            (
                ANNOTATION_NOT_AFTER.to_string(),
                bundle.not_after.to_string(),
            ),
            (ANNOTATION_NAMES.to_string(), bundle.names.join(",")),
        ]
        .into(),
    );
    secret
}

/// Reads the stored certificate, issuing or renewing it when [`renewal`] says so (a replica
/// that loses the race to write it reads the winner's). Returns what to serve.
pub async fn ensure(client: &Client, secret: &str, names: &[String], days: u32) -> Result<Bundle> {
    let (namespace, name) = secret.split_once('/').ok_or_else(|| {
        Error::Webhook(format!("--webhook-secret {secret:?} is not namespace/name"))
    })?;
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    for _ in 0..5 {
        let now = k8s_openapi::jiff::Timestamp::now().as_second();
        let stored = api.get_opt(name).await.map_err(|source| Error::Read {
            object: format!("Secret {secret}"),
            source,
        })?;
        let parsed = stored.as_ref().map(from_secret);
        let decision = renewal(
            parsed
                .as_ref()
                .map(|stored| (stored.not_after, stored.names.as_slice())),
            names,
            now,
            i64::from(days.max(1)) * 86_400,
        );
        let written = match (decision, &stored, &parsed) {
            (
                Renewal::Keep,
                _,
                Some(Stored {
                    bundle: Some(bundle),
                    ..
                }),
            ) => return Ok(bundle.clone()),
            (Renewal::Create, _, _) | (_, None, _) => {
                let bundle = issue(None, names, now, days)?;
                api.create(&PostParams::default(), &secret_of(&bundle, name, None))
                    .await
                    .map(|_| bundle)
            }
            (_, Some(existing), parsed) => {
                let ca = parsed.as_ref().and_then(|stored| stored.ca.clone());
                let bundle = issue(
                    ca.as_ref().map(|(c, k)| (c.as_str(), k.as_str())),
                    names,
                    now,
                    days,
                )?;
                api.replace(
                    name,
                    &PostParams::default(),
                    &secret_of(&bundle, name, existing.resource_version()),
                )
                .await
                .map(|_| bundle)
            }
        };
        match written {
            Ok(bundle) => {
                tracing::info!(
                    secret,
                    names = bundle.names.join(","),
                    not_after = bundle.not_after,
                    ?decision,
                    "webhook certificate issued"
                );
                return Ok(bundle);
            }
            // Another replica wrote first: read theirs.
            Err(kube::Error::Api(status)) if status.code == 409 => continue,
            Err(source) => {
                return Err(Error::Create {
                    object: format!("Secret {secret}"),
                    source,
                });
            }
        }
    }
    Err(Error::Webhook(format!(
        "Secret {secret} keeps changing; try again"
    )))
}

/// The kinds of webhook configuration whose `caBundle` custody keeps current.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Configuration {
    Mutating,
    Validating,
}

impl Configuration {
    fn kind(self) -> &'static str {
        match self {
            Configuration::Mutating => "MutatingWebhookConfiguration",
            Configuration::Validating => "ValidatingWebhookConfiguration",
        }
    }
}

/// Writes `ca` into the `caBundle` of every webhook of `configuration` (of `kind`) that does
/// not carry it. Returns how many entries it changed.
pub async fn publish_ca(
    client: &Client,
    kind: Configuration,
    configuration: &str,
    ca: &str,
) -> Result<usize> {
    let resource = kube::api::ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk(
        "admissionregistration.k8s.io",
        "v1",
        kind.kind(),
    ));
    let api: Api<kube::api::DynamicObject> = Api::all_with(client.clone(), &resource);
    let object = format!("{} {configuration}", kind.kind());
    let Some(current) = api
        .get_opt(configuration)
        .await
        .map_err(Error::read(object.clone()))?
    else {
        tracing::warn!(
            configuration,
            kind = kind.kind(),
            "webhook configuration not found; its caBundle cannot be set"
        );
        return Ok(0);
    };
    let wanted = ByteString(ca.as_bytes().to_vec());
    let wanted_text = serde_json::to_value(&wanted)
        .map_err(|error| Error::Webhook(format!("encoding the caBundle: {error}")))?;
    let webhooks = current
        .data
        .get("webhooks")
        .and_then(|webhooks| webhooks.as_array())
        .cloned()
        .unwrap_or_default();
    let mut operations = Vec::new();
    for (index, webhook) in webhooks.iter().enumerate() {
        if webhook.pointer("/clientConfig/caBundle") != Some(&wanted_text) {
            operations.push(serde_json::json!({
                "op": "add",
                "path": format!("/webhooks/{index}/clientConfig/caBundle"),
                "value": wanted_text,
            }));
        }
    }
    if operations.is_empty() {
        return Ok(0);
    }
    // Guarded by the resourceVersion: a configuration changed meanwhile is read again next time.
    let mut patch = vec![serde_json::json!({
        "op": "test", "path": "/metadata/resourceVersion", "value": current.resource_version(),
    })];
    patch.extend(operations.iter().cloned());
    let patch: json_patch::Patch = serde_json::from_value(serde_json::Value::Array(patch))
        .map_err(|error| Error::Webhook(format!("building the caBundle patch: {error}")))?;
    api.patch(
        configuration,
        &PatchParams::default(),
        &Patch::<()>::Json(patch),
    )
    .await
    .map_err(|source| Error::Patch { object, source })?;
    tracing::info!(
        configuration,
        kind = kind.kind(),
        entries = operations.len(),
        "webhook caBundle written"
    );
    Ok(operations.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renewal_decisions() {
        let names = vec!["a.svc".to_string(), "127.0.0.1".to_string()];
        let day = 86_400;
        let life = 90 * day;
        type Row<'a> = (&'a str, Option<(Option<i64>, &'a [String])>, i64, Renewal);
        let rows: &[Row] = &[
            ("nothing stored", None, 0, Renewal::Create),
            ("fresh", Some((Some(89 * day), &names)), 0, Renewal::Keep),
            (
                "a third left",
                Some((Some(30 * day), &names)),
                0,
                Renewal::Renew,
            ),
            (
                "just over a third",
                Some((Some(30 * day + 1), &names)),
                0,
                Renewal::Keep,
            ),
            ("expired", Some((Some(-1), &names)), 0, Renewal::Renew),
            ("expiry unreadable", Some((None, &names)), 0, Renewal::Renew),
            (
                "other names",
                Some((Some(89 * day), &names[..1])),
                0,
                Renewal::Renew,
            ),
        ];
        for (name, stored, now, expected) in rows {
            assert_eq!(renewal(*stored, &names, *now, life), *expected, "{name}");
        }
        let reordered = vec!["127.0.0.1".to_string(), "a.svc".to_string()];
        assert_eq!(
            renewal(Some((Some(89 * day), &reordered)), &names, 0, life),
            Renewal::Keep,
            "order of names"
        );
    }

    #[test]
    fn renewing_keeps_the_ca() {
        let names = vec!["custody.svc".to_string(), "127.0.0.1".to_string()];
        let first = issue(None, &names, 1_800_000_000, 90).unwrap();
        let second = issue(
            Some((&first.ca_cert, &first.ca_key)),
            &names,
            1_800_000_100,
            90,
        )
        .unwrap();
        assert_eq!(first.ca_cert, second.ca_cert);
        assert_ne!(first.cert, second.cert);
        assert_ne!(first.key, second.key);
        assert_eq!(second.not_after, 1_800_000_100 + 90 * 86_400);
        assert!(second.cert.starts_with("-----BEGIN CERTIFICATE-----"));
    }
}
