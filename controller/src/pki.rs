//! custody's own CA (`--ca-secret`): made by the controller on first start, kept in one Secret
//! that every replica reads, rotated without a moment when a certificate in use is not trusted.
//!
//! - It signs the report service's certificate (each replica issues its own, in memory) and each
//!   node's gate certificate (over the agent's own public key, asked for by the agent through
//!   the report service; the name is `<node>.gate.custody.io`, so one node's key cannot stand
//!   in for another node's gate).
//! - Its trust bundle (every CA still trusted) is published as ConfigMap `custody-ca` in the
//!   Secret's namespace (agents mount it) and as `custody-gate-ca` in namespaces under
//!   restore ([`crate::gate_ca`]); every reader re-reads the mounted file, so nothing restarts.
//! - Rotation ([`step`]): when a third of the CA's life is left (or an operator annotates the
//!   Secret `custody.io/rotate-ca`, whose value may give the seconds to wait instead), a next
//!   CA joins the bundle; `--ca-propagation-seconds` later it becomes the signing CA, the old one stays in the bundle until it expires, and
//!   `custody.io/reissue-after` tells every holder of an older certificate to get a new one.
//!   Annotating the Secret `custody.io/reissue-after` (Unix seconds) by hand does the last part
//!   alone.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};

use crate::error::{Error, Result};

/// Secret keys.
mod rotation;
pub use rotation::{Settings, Shared, ensure, publish, renew_leaf, run};

const CA_CERT: &str = "ca.crt";
const CA_KEY: &str = "ca.key";
/// The signing CA's subject name (an issuer is named by it).
const CA_NAME: &str = "ca.name";
const NEXT_CERT: &str = "next.crt";
const NEXT_NAME: &str = "next.name";
const NEXT_KEY: &str = "next.key";
const PREVIOUS_CERT: &str = "previous.crt";
/// Every CA still trusted, PEM, concatenated: what the ConfigMaps carry.
const BUNDLE: &str = "bundle.crt";
/// Annotations on the Secret.
const ANNOTATION_CA_NOT_AFTER: &str = "custody.io/ca-not-after";
/// When the next CA starts signing (Unix seconds).
const ANNOTATION_NEXT_PROMOTE_AT: &str = "custody.io/next-ca-signs-at";
const ANNOTATION_NEXT_NOT_AFTER: &str = "custody.io/next-ca-not-after";
/// When the last rotation's new CA started signing (Unix seconds).
const ANNOTATION_PROMOTED_AT: &str = "custody.io/ca-promoted-at";
const ANNOTATION_PREVIOUS_NOT_AFTER: &str = "custody.io/previous-ca-not-after";
pub const ANNOTATION_REISSUE_AFTER: &str = "custody.io/reissue-after";
pub const ANNOTATION_ROTATE: &str = "custody.io/rotate-ca";

/// The ConfigMap, in the CA Secret's namespace, holding the trust bundle as `ca.crt`.
pub const CONFIG_MAP: &str = "custody-ca";
/// The gate's name for `node`.
pub fn gate_name(node: &str) -> String {
    format!("{node}.{}", custody_proto::names::GATE_NAME_SUFFIX)
}

/// What the stored Secret says about the CA, as far as the decision needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct State {
    /// When the signing CA expires; `None` when the Secret lacks a usable CA.
    pub signing_not_after: Option<i64>,
    /// When the next CA, if there is one, is to start signing.
    pub next_promote_at: Option<i64>,
    /// An operator asked for a new CA.
    pub rotate_requested: bool,
    /// When the last rotation's new CA started signing: certificates of the CA before it may
    /// live on until a leaf lifetime later, and that CA is dropped from the bundle by the next
    /// promotion.
    pub promoted_at: Option<i64>,
}

/// What to do with the stored CA.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    Keep,
    /// Nothing usable stored: make a CA.
    Create,
    /// Make the next CA and trust it, without signing with it yet.
    AddNext,
    /// The next CA has been trusted long enough: sign with it from now on.
    Promote,
}

/// The decision (pure): a missing or unreadable CA is made; a next CA is promoted once its
/// time came (everyone has had it in their bundle for the propagation time); otherwise a next
/// CA is added when a third of the signing CA's `lifetime` is left or a rotation was asked
/// for, but not before every certificate of the CA before the last rotation has expired
/// (`leaf_lifetime` after that rotation): the next promotion drops that CA from the bundle.
pub fn step(stored: Option<State>, now: i64, lifetime: i64, leaf_lifetime: i64) -> Step {
    let Some(state) = stored else {
        return Step::Create;
    };
    let Some(not_after) = state.signing_not_after else {
        return Step::Create;
    };
    match state.next_promote_at {
        Some(at) if now >= at => Step::Promote,
        Some(_) => Step::Keep,
        None if state
            .promoted_at
            .is_some_and(|promoted| now - promoted < leaf_lifetime) =>
        {
            Step::Keep
        }
        None if state.rotate_requested || not_after - now <= lifetime / 3 => Step::AddNext,
        None => Step::Keep,
    }
}

/// What signs and what is trusted, as one replica last read it.
#[derive(Clone, PartialEq, Eq)]
pub struct Authority {
    pub name: String,
    pub cert: String,
    pub key: String,
    /// Every CA to trust, PEM.
    pub bundle: String,
    /// Certificates issued before this (Unix seconds) are to be replaced.
    pub reissue_after: i64,
}

/// Without the key: an Authority in a log line must not leak it.
impl std::fmt::Debug for Authority {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Authority")
            .field("name", &self.name)
            .field("reissue_after", &self.reissue_after)
            .finish_non_exhaustive()
    }
}

fn rcgen_error(error: rcgen::Error) -> Error {
    Error::Certificates(format!("generating certificates: {error}"))
}

fn offset(unix: i64) -> Result<time::OffsetDateTime> {
    time::OffsetDateTime::from_unix_timestamp(unix)
        .map_err(|error| Error::Certificates(format!("time {unix}: {error}")))
}

pub(crate) fn ca_params(name: &str) -> CertificateParams {
    let mut params = CertificateParams::default();
    let mut distinguished = DistinguishedName::new();
    distinguished.push(DnType::CommonName, name);
    params.distinguished_name = distinguished;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params
}

/// A new CA: (name, certificate, key, not after).
fn new_ca(now: i64, lifetime: i64) -> Result<(String, String, String, i64)> {
    let key = KeyPair::generate().map_err(rcgen_error)?;
    // Each CA has a name of its own: clients pick the issuer by name.
    let name = format!("custody-ca-{now}");
    let mut params = ca_params(&name);
    params.not_before = offset(now - 300)?;
    let not_after = now + lifetime;
    params.not_after = offset(not_after)?;
    let cert = params.self_signed(&key).map_err(rcgen_error)?;
    Ok((name, cert.pem(), key.serialize_pem(), not_after))
}

/// A serving certificate's parameters: `common_name`, `names` as DNS names or IP addresses,
/// valid from `not_before` to `not_after` (shared with the webhook's certificate).
pub(crate) fn serving_params(
    common_name: &str,
    names: &[String],
    not_before: i64,
    not_after: i64,
) -> Result<CertificateParams> {
    let mut leaf = CertificateParams::default();
    let mut distinguished = DistinguishedName::new();
    distinguished.push(DnType::CommonName, common_name);
    leaf.distinguished_name = distinguished;
    leaf.subject_alt_names = names
        .iter()
        .map(|name| match name.parse::<std::net::IpAddr>() {
            Ok(ip) => Ok(SanType::IpAddress(ip)),
            Err(_) => name
                .clone()
                .try_into()
                .map(SanType::DnsName)
                .map_err(rcgen_error),
        })
        .collect::<Result<_>>()?;
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    leaf.not_before = offset(not_before)?;
    leaf.not_after = offset(not_after)?;
    Ok(leaf)
}

/// A public key handed in by an agent: an ECDSA P-256 point.
struct P256(Vec<u8>);

impl rcgen::PublicKeyData for P256 {
    fn der_bytes(&self) -> &[u8] {
        &self.0
    }

    fn algorithm(&self) -> &'static rcgen::SignatureAlgorithm {
        &rcgen::PKCS_ECDSA_P256_SHA256
    }
}

/// An issued certificate.
#[derive(Clone, Debug)]
pub struct Issued {
    pub cert: String,
    /// When it was issued; valid from 5 minutes before (for clocks behind).
    pub issued_at: i64,
    pub not_after: i64,
}

/// Signs a serving certificate for `names` over `public_key` (an uncompressed P-256 point),
/// valid `lifetime` seconds from `now`.
pub fn sign(
    authority: &Authority,
    names: &[String],
    public_key: &[u8],
    now: i64,
    lifetime: i64,
) -> Result<Issued> {
    if public_key.len() != 65 || public_key[0] != 0x04 {
        return Err(Error::Certificates(format!(
            "the public key is not an uncompressed ECDSA P-256 point ({} bytes)",
            public_key.len()
        )));
    }
    let ca_key = KeyPair::from_pem(&authority.key).map_err(rcgen_error)?;
    let issuer = Issuer::new(ca_params(&authority.name), &ca_key);
    let not_after = now + lifetime.max(60);
    let leaf = serving_params(
        names.first().map(String::as_str).unwrap_or("custody"),
        names,
        now - 300,
        not_after,
    )?;
    let cert = leaf
        .signed_by(&P256(public_key.to_vec()), &issuer)
        .map_err(rcgen_error)?;
    Ok(Issued {
        cert: cert.pem(),
        issued_at: now,
        not_after,
    })
}

/// A serving certificate with a key made here: (certificate, key PEM).
pub fn issue_own(
    authority: &Authority,
    names: &[String],
    now: i64,
    lifetime: i64,
) -> Result<(Issued, String)> {
    let key = KeyPair::generate().map_err(rcgen_error)?;
    let issued = sign(authority, names, key.public_key_raw(), now, lifetime)?;
    Ok((issued, key.serialize_pem()))
}

fn text(data: &BTreeMap<String, ByteString>, key: &str) -> Option<String> {
    data.get(key)
        .map(|value| String::from_utf8_lossy(&value.0).into_owned())
        .filter(|value| !value.is_empty())
}

fn annotation(secret: &Secret, key: &str) -> Option<i64> {
    secret
        .annotations()
        .get(key)
        .and_then(|value| value.parse().ok())
}

fn state_of(secret: &Secret) -> State {
    let data = secret.data.clone().unwrap_or_default();
    // A key that does not parse would fail every signing: unusable.
    let usable = [CA_NAME, CA_CERT, BUNDLE]
        .iter()
        .all(|key| text(&data, key).is_some())
        && text(&data, CA_KEY).is_some_and(|key| KeyPair::from_pem(&key).is_ok());
    let next = [NEXT_NAME, NEXT_CERT, NEXT_KEY]
        .iter()
        .all(|key| text(&data, key).is_some());
    State {
        signing_not_after: annotation(secret, ANNOTATION_CA_NOT_AFTER).filter(|_| usable),
        next_promote_at: annotation(secret, ANNOTATION_NEXT_PROMOTE_AT).filter(|_| next),
        rotate_requested: secret.annotations().contains_key(ANNOTATION_ROTATE),
        promoted_at: annotation(secret, ANNOTATION_PROMOTED_AT),
    }
}

/// The bundle: the signing CA, the next one and the previous one while it is valid.
fn bundle_of(data: &BTreeMap<String, String>, previous_not_after: Option<i64>, now: i64) -> String {
    let mut bundle = String::new();
    for key in [CA_CERT, NEXT_CERT] {
        if let Some(pem) = data.get(key) {
            bundle.push_str(pem.trim_end());
            bundle.push('\n');
        }
    }
    if let (Some(pem), Some(not_after)) = (data.get(PREVIOUS_CERT), previous_not_after)
        && not_after > now
    {
        bundle.push_str(pem.trim_end());
        bundle.push('\n');
    }
    bundle
}

/// What `secret` says signs and is trusted, read at `now`. A reissue time more than a
/// minute ahead (a hand-set value in the wrong unit) is ignored: it would have every holder
/// ask for a certificate again and again.
fn authority_of(secret: &Secret, now: i64) -> Option<Authority> {
    let data = secret.data.clone().unwrap_or_default();
    let reissue_after = annotation(secret, ANNOTATION_REISSUE_AFTER).unwrap_or(0);
    if reissue_after > now + 60 {
        tracing::warn!(
            reissue_after,
            now,
            "custody.io/reissue-after on the CA Secret is in the future: ignored"
        );
    }
    Some(Authority {
        name: text(&data, CA_NAME)?,
        cert: text(&data, CA_CERT)?,
        key: text(&data, CA_KEY)?,
        bundle: text(&data, BUNDLE)?,
        reissue_after: if reissue_after > now + 60 {
            0
        } else {
            reissue_after
        },
    })
}

/// The Secret after `step` at `now`, from `current` (if any). A next CA signs `propagation`
/// seconds after it is added, or as many as the `custody.io/rotate-ca` annotation says.
fn next_secret(
    current: Option<&Secret>,
    name: &str,
    step: Step,
    now: i64,
    lifetime: i64,
    propagation: i64,
) -> Result<Secret> {
    let mut data: BTreeMap<String, String> = current
        .and_then(|secret| secret.data.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|(key, value)| (key, String::from_utf8_lossy(&value.0).into_owned()))
        .collect();
    let mut annotations: BTreeMap<String, String> = current
        .map(|secret| secret.annotations().clone())
        .unwrap_or_default();
    match step {
        Step::Keep => {}
        Step::Create => {
            let (ca_name, cert, key, not_after) = new_ca(now, lifetime)?;
            data.clear();
            data.insert(CA_NAME.into(), ca_name);
            data.insert(CA_CERT.into(), cert);
            data.insert(CA_KEY.into(), key);
            annotations.insert(ANNOTATION_CA_NOT_AFTER.into(), not_after.to_string());
            annotations.insert(ANNOTATION_REISSUE_AFTER.into(), now.to_string());
            annotations.remove(ANNOTATION_NEXT_PROMOTE_AT);
            annotations.remove(ANNOTATION_NEXT_NOT_AFTER);
            annotations.remove(ANNOTATION_PREVIOUS_NOT_AFTER);
            annotations.remove(ANNOTATION_PROMOTED_AT);
            annotations.remove(ANNOTATION_ROTATE);
        }
        Step::AddNext => {
            let (next_name, cert, key, next_not_after) = new_ca(now, lifetime)?;
            annotations.insert(ANNOTATION_NEXT_NOT_AFTER.into(), next_not_after.to_string());
            data.insert(NEXT_NAME.into(), next_name);
            data.insert(NEXT_CERT.into(), cert);
            data.insert(NEXT_KEY.into(), key);
            let wait = annotations
                .remove(ANNOTATION_ROTATE)
                .and_then(|value| value.trim().parse::<i64>().ok())
                .map(|seconds| seconds.max(0))
                .unwrap_or(propagation);
            annotations.insert(ANNOTATION_NEXT_PROMOTE_AT.into(), (now + wait).to_string());
        }
        Step::Promote => {
            let (Some(next_name), Some(next_cert), Some(next_key)) = (
                data.remove(NEXT_NAME),
                data.remove(NEXT_CERT),
                data.remove(NEXT_KEY),
            ) else {
                return Err(Error::Certificates("no next CA to promote".into()));
            };
            data.insert(CA_NAME.into(), next_name);
            annotations.remove(ANNOTATION_NEXT_PROMOTE_AT);
            let next_not_after = annotations
                .remove(ANNOTATION_NEXT_NOT_AFTER)
                .unwrap_or_else(|| (now + lifetime).to_string());
            if let Some(old) = data.insert(CA_CERT.into(), next_cert) {
                data.insert(PREVIOUS_CERT.into(), old);
            }
            data.insert(CA_KEY.into(), next_key);
            if let Some(old) = annotations.insert(ANNOTATION_CA_NOT_AFTER.into(), next_not_after) {
                annotations.insert(ANNOTATION_PREVIOUS_NOT_AFTER.into(), old);
            }
            annotations.insert(ANNOTATION_REISSUE_AFTER.into(), now.to_string());
            annotations.insert(ANNOTATION_PROMOTED_AT.into(), now.to_string());
            // A rotation asked for while this one was pending is this one.
            annotations.remove(ANNOTATION_ROTATE);
        }
    }
    let previous_not_after = annotations
        .get(ANNOTATION_PREVIOUS_NOT_AFTER)
        .and_then(|value| value.parse().ok());
    data.remove(BUNDLE);
    let bundle = bundle_of(&data, previous_not_after, now);
    data.insert(BUNDLE.into(), bundle);
    let mut secret = Secret {
        data: Some(
            data.into_iter()
                .map(|(key, value)| (key, ByteString(value.into_bytes())))
                .collect(),
        ),
        type_: Some("Opaque".into()),
        ..Secret::default()
    };
    secret.metadata.name = Some(name.to_string());
    secret.metadata.resource_version = current.and_then(|secret| secret.resource_version());
    secret.metadata.labels = Some(
        [(
            "app.kubernetes.io/managed-by".to_string(),
            "custody".to_string(),
        )]
        .into(),
    );
    secret.metadata.annotations = Some(annotations);
    Ok(secret)
}

#[cfg(test)]
mod tests;
