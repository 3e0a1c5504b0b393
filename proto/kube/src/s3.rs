//! S3 clients for a BackupRepository: the controller checks repositories and deletes
//! artifacts with them, the mover uploads and downloads.

use aws_sdk_s3::config::{BehaviorVersion, Credentials as SdkCredentials, Region};
use aws_smithy_http_client::tls::{self, TlsContext, TrustStore, rustls_provider::CryptoMode};

/// Where a repository is and how to reach it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Endpoint {
    /// `http://` or `https://` URL of the S3 API.
    pub url: String,
    pub region: String,
    pub bucket: String,
    /// Path-style addressing (`https://host/bucket/key`), which most self-hosted servers need.
    pub path_style: bool,
    /// PEM CA bundle trusted in addition to the system roots.
    pub ca_bundle: Option<Vec<u8>>,
    /// How long its calls may take.
    pub limits: Limits,
    /// How fast a mover may send, and receive (the repository's `spec.bandwidth`; the
    /// controller's own calls are not bounded).
    pub upload: Throttle,
    pub download: Throttle,
}

pub use custody_proto::s3_limits::{
    DEFAULT_MIN_KIB_PER_SECOND, DEFAULT_STALL_SECONDS, Limits, Overdue, Throttle,
};

/// The limits a repository's `spec.timeouts` asks for (the defaults where it says nothing).
pub fn limits_of(timeouts: Option<&crate::api::RepositoryTimeouts>) -> Limits {
    let default = Limits::default();
    let Some(timeouts) = timeouts else {
        return default;
    };
    Limits {
        connect: default.connect,
        stall: timeouts
            .stall_seconds
            .and_then(|seconds| u64::try_from(seconds).ok())
            .filter(|seconds| *seconds > 0)
            .map_or(default.stall, std::time::Duration::from_secs),
        min_bytes_per_second: timeouts
            .minimum_kib_per_second
            .and_then(|rate| u64::try_from(rate).ok())
            .filter(|rate| *rate > 0)
            .map_or(default.min_bytes_per_second, |rate| rate * 1024),
    }
}

/// The S3 endpoint a repository describes.
pub fn endpoint_of(repository: &crate::api::BackupRepository) -> Endpoint {
    Endpoint {
        url: repository.spec.endpoint.clone(),
        region: repository.spec.region.clone().unwrap_or_default(),
        bucket: repository.spec.bucket.clone(),
        path_style: repository.spec.force_path_style,
        ca_bundle: repository
            .spec
            .ca_bundle
            .as_ref()
            .map(|pem| pem.as_bytes().to_vec()),
        limits: limits_of(repository.spec.timeouts.as_ref()),
        ..Default::default()
    }
}

/// Access key and secret.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret {
    pub access_key_id: String,
    pub secret_access_key: String,
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Secret")
            .field("access_key_id", &self.access_key_id)
            .finish_non_exhaustive()
    }
}

/// Keys of the credentials Secret (the same names as the mover's environment).
pub use custody_proto::mover::env::{ACCESS_KEY_ID, SECRET_ACCESS_KEY};

/// Why a client cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("the CA bundle is not usable: {0}")]
    CaBundle(String),
}

/// How custody signs its calls to a repository.
#[derive(Clone, Debug)]
pub enum Credentials {
    /// Keys (a credentials Secret).
    Keys(Secret),
    /// Temporary credentials for a ServiceAccount's token, from the STS (asked again as
    /// they near their end).
    WebIdentity(crate::sts::WebIdentity),
    /// Temporary credentials already had (one check's calls).
    Session(crate::sts::Temporary),
}

impl From<Secret> for Credentials {
    fn from(secret: Secret) -> Credentials {
        Credentials::Keys(secret)
    }
}

fn tls_context(endpoint: &Endpoint) -> Result<TlsContext, ClientError> {
    tls_context_trusting(endpoint, TrustStore::default())
}

/// Whether `url` is plain HTTP: no TLS is ever negotiated with it.
fn plain_http(url: &str) -> bool {
    url.get(..7)
        .is_some_and(|scheme| scheme.eq_ignore_ascii_case("http://"))
}

fn tls_context_trusting(
    endpoint: &Endpoint,
    mut trust: TrustStore,
) -> Result<TlsContext, ClientError> {
    if let Some(pem) = &endpoint.ca_bundle {
        trust = trust.with_pem_certificate(pem.clone());
    }
    TlsContext::builder()
        .with_trust_store(trust)
        .build()
        .map_err(|error| ClientError::CaBundle(error.to_string()))
}

/// A plain HTTP(S) connector trusting what `endpoint` trusts (the STS's calls).
pub(crate) fn connector(
    endpoint: &Endpoint,
) -> Result<aws_smithy_http_client::Connector, ClientError> {
    Ok(aws_smithy_http_client::Connector::builder()
        .tls_provider(tls::Provider::Rustls(CryptoMode::Ring))
        .tls_context(tls_context(endpoint)?)
        .build())
}

/// An S3 client for `endpoint` signing with `credentials`.
pub fn client(
    endpoint: &Endpoint,
    credentials: &Credentials,
) -> Result<aws_sdk_s3::Client, ClientError> {
    // The system's roots are read and parsed when the client is built (about 150 files here,
    // from the disk when the cache is cold): not for an endpoint that never uses TLS.
    let trust = if plain_http(&endpoint.url) {
        TrustStore::empty()
    } else {
        TrustStore::default()
    };
    let http = aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(CryptoMode::Ring))
        .tls_context(tls_context_trusting(endpoint, trust)?)
        .build_https();
    let provider = match credentials {
        Credentials::Keys(secret) => {
            aws_sdk_s3::config::SharedCredentialsProvider::new(SdkCredentials::new(
                &secret.access_key_id,
                &secret.secret_access_key,
                None,
                None,
                "custody",
            ))
        }
        Credentials::Session(session) => {
            aws_sdk_s3::config::SharedCredentialsProvider::new(SdkCredentials::new(
                &session.access_key_id,
                &session.secret_access_key,
                Some(session.session_token.clone()),
                Some(session.expires),
                "custody-web-identity",
            ))
        }
        Credentials::WebIdentity(identity) => {
            aws_sdk_s3::config::SharedCredentialsProvider::new(crate::sts::Provider {
                identity: identity.clone(),
                endpoint: endpoint.clone(),
            })
        }
    };
    let config = aws_sdk_s3::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .endpoint_url(&endpoint.url)
        .region(Region::new(if endpoint.region.is_empty() {
            "us-east-1".to_string()
        } else {
            endpoint.region.clone()
        }))
        .credentials_provider(provider)
        .force_path_style(endpoint.path_style)
        // Integrity is custody's own (BLAKE3 of the artifact and its manifest); the extra
        // CRC trailers of newer SDKs are not understood by every S3-compatible server.
        .request_checksum_calculation(aws_sdk_s3::config::RequestChecksumCalculation::WhenRequired)
        .response_checksum_validation(aws_sdk_s3::config::ResponseChecksumValidation::WhenRequired)
        .http_client(http)
        // Connecting is bounded here; a call as a whole by `Limits::bounded` at the caller,
        // which knows how many bytes it moves. A body that stops coming fails after `stall`.
        .timeout_config(
            aws_sdk_s3::config::timeout::TimeoutConfig::builder()
                .connect_timeout(endpoint.limits.connect)
                .build(),
        )
        .stalled_stream_protection(
            aws_sdk_s3::config::StalledStreamProtectionConfig::enabled()
                .grace_period(endpoint.limits.stall)
                .build(),
        )
        .build();
    Ok(aws_sdk_s3::Client::from_conf(config))
}

/// An error and its chain of causes on one line (SDK errors hide the useful part, such as
/// "connection refused" or a TLS alert, in their sources).
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}

/// An S3 call's error for a person: the HTTP status and the server's error code and message
/// when the server answered (the SDK's own text for a 503 is "service error: unhandled
/// error"), the chain of causes when it did not (connection refused, a TLS alert, a timeout).
pub fn sdk_error<E>(
    error: &aws_sdk_s3::error::SdkError<E, aws_sdk_s3::config::http::HttpResponse>,
) -> String
where
    E: aws_sdk_s3::error::ProvideErrorMetadata + std::error::Error + 'static,
{
    use aws_sdk_s3::error::ProvideErrorMetadata;
    match error.raw_response() {
        Some(response) => {
            let mut message = format!("the server answered HTTP {}", response.status().as_u16());
            if let Some(code) = error.code() {
                message.push_str(&format!(" {code}"));
            }
            if let Some(text) = error.message().filter(|text| !text.is_empty()) {
                message.push_str(&format!(": {text}"));
            }
            message
        }
        None => error_chain(error),
    }
}

/// The environment of a `custody-mover` container for `repository`: endpoint, bucket, region,
/// addressing, CA, and the credentials as references to the repository's Secret (never
/// copied into the Job).
pub fn mover_env(repository: &crate::api::BackupRepositorySpec) -> Vec<serde_json::Value> {
    use custody_proto::mover::env;
    let mut variables = vec![
        serde_json::json!({"name": env::ENDPOINT, "value": repository.endpoint}),
        serde_json::json!({"name": env::BUCKET, "value": repository.bucket}),
        serde_json::json!({"name": env::REGION, "value": repository.region.clone().unwrap_or_else(|| "us-east-1".into())}),
        serde_json::json!({"name": env::PATH_STYLE, "value": repository.force_path_style.to_string()}),
    ];
    if let Some(secret) = repository.credentials_secret() {
        variables.extend([
            serde_json::json!({"name": ACCESS_KEY_ID, "valueFrom": {"secretKeyRef": {"name": secret, "key": ACCESS_KEY_ID}}}),
            serde_json::json!({"name": SECRET_ACCESS_KEY, "valueFrom": {"secretKeyRef": {"name": secret, "key": SECRET_ACCESS_KEY}}}),
        ]);
    }
    if let Some(identity) = &repository.web_identity {
        variables.extend([
            serde_json::json!({"name": env::ROLE_ARN, "value": identity.role_arn}),
            serde_json::json!({"name": env::WEB_IDENTITY_TOKEN_FILE, "value": format!("{}/{}", crate::sts::TOKEN_DIRECTORY, crate::sts::TOKEN_FILE)}),
            serde_json::json!({"name": env::ROLE_SESSION_NAME, "value": "custody-mover"}),
        ]);
        // The STS the controller asks too (an SDK's default may differ), and the region a
        // user's command's SDK needs.
        let sts = identity.sts_endpoint.clone().unwrap_or_else(|| {
            crate::sts::default_sts_endpoint(repository.region.as_deref().unwrap_or_default())
        });
        let region = repository
            .region
            .clone()
            .unwrap_or_else(|| "us-east-1".into());
        variables.extend([
            serde_json::json!({"name": env::STS_ENDPOINT, "value": sts}),
            serde_json::json!({"name": "AWS_REGION", "value": region}),
        ]);
    }
    if let Some(ca) = &repository.ca_bundle {
        variables.push(serde_json::json!({"name": env::CA_BUNDLE, "value": ca}));
    }
    if let Some(timeouts) = &repository.timeouts {
        if let Some(seconds) = timeouts.stall_seconds {
            variables.push(
                serde_json::json!({"name": env::STALL_SECONDS, "value": seconds.to_string()}),
            );
        }
        if let Some(rate) = timeouts.minimum_kib_per_second {
            variables.push(
                serde_json::json!({"name": env::MIN_KIB_PER_SECOND, "value": rate.to_string()}),
            );
        }
    }
    if let Some(bandwidth) = &repository.bandwidth {
        for (name, rate) in [
            (env::UPLOAD_KIB_PER_SECOND, bandwidth.upload_kib_per_second),
            (
                env::DOWNLOAD_KIB_PER_SECOND,
                bandwidth.download_kib_per_second,
            ),
        ] {
            // The schema refuses 0 and below; a value that went past it is no bound.
            if let Some(rate) = rate.filter(|rate| *rate > 0) {
                variables.push(serde_json::json!({"name": name, "value": rate.to_string()}));
            }
        }
    }
    variables
}

/// The volume a mover's pod has its web identity token in (`None` for a repository that signs
/// with keys): projected by the kubelet for the repository's audience only, so no container
/// of the pod has a token the Kubernetes API accepts.
pub fn web_identity_volume(
    repository: &crate::api::BackupRepositorySpec,
) -> Option<serde_json::Value> {
    let identity = repository.web_identity.as_ref()?;
    Some(serde_json::json!({
        "name": WEB_IDENTITY_VOLUME,
        "projected": {"sources": [{"serviceAccountToken": {
            "audience": identity.audience.as_deref().unwrap_or(crate::sts::DEFAULT_AUDIENCE),
            "expirationSeconds": crate::sts::PROJECTED_TOKEN_SECONDS,
            "path": crate::sts::TOKEN_FILE,
        }}]},
    }))
}

/// The name of [`web_identity_volume`] in a mover's pod.
pub const WEB_IDENTITY_VOLUME: &str = "web-identity";

/// What signs a repository's calls, as the repository (or a Backup's artifact) names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Signer {
    /// The keys in this Secret of the namespace.
    Secret(String),
    /// A token of a ServiceAccount of the namespace, exchanged at the STS.
    WebIdentity(crate::api::RepositoryWebIdentity),
}

impl Signer {
    /// What `repository` names (its schema allows exactly one).
    pub fn of(repository: &crate::api::BackupRepositorySpec) -> Signer {
        match (&repository.web_identity, repository.credentials_secret()) {
            (Some(identity), _) => Signer::WebIdentity(identity.clone()),
            (None, secret) => Signer::Secret(secret.unwrap_or_default().to_string()),
        }
    }
}

/// How custody's controller signs its own calls to `repository`: the keys of its Secret, or
/// a token of its ServiceAccount exchanged at the STS.
pub async fn credentials_of(
    client: &kube::Client,
    repository: &crate::api::BackupRepository,
) -> Result<Credentials, CredentialsError> {
    let namespace = repository.metadata.namespace.clone().unwrap_or_default();
    let who = format!(
        "custody-{namespace}-{}",
        repository.metadata.name.as_deref().unwrap_or_default()
    );
    credentials_for(
        client,
        &namespace,
        &Signer::of(&repository.spec),
        repository.spec.region.as_deref().unwrap_or_default(),
        &who,
    )
    .await
}

/// The credentials `signer` gives in `namespace` (a web identity's session named after `who`;
/// its default STS that of `region`). A web identity's token and credentials are asked for
/// at the first call, not here.
pub async fn credentials_for(
    client: &kube::Client,
    namespace: &str,
    signer: &Signer,
    region: &str,
    who: &str,
) -> Result<Credentials, CredentialsError> {
    match signer {
        Signer::Secret(name) => credentials(client, namespace, name)
            .await
            .map(Credentials::Keys),
        Signer::WebIdentity(identity) => Ok(Credentials::WebIdentity(crate::sts::WebIdentity {
            role_arn: identity.role_arn.clone(),
            sts_endpoint: identity
                .sts_endpoint
                .clone()
                .unwrap_or_else(|| crate::sts::default_sts_endpoint(region)),
            session_name: crate::sts::session_name(who),
            token: crate::sts::TokenSource::Request {
                client: client.clone(),
                namespace: namespace.to_string(),
                account: identity.service_account_name.clone(),
                audience: identity
                    .audience
                    .clone()
                    .unwrap_or_else(|| crate::sts::DEFAULT_AUDIENCE.to_string()),
            },
        })),
    }
}

/// Why a repository's credentials could not be read.
#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    /// The API server could not be asked: try again later.
    #[error("reading Secret {name}: {source}")]
    Read {
        name: String,
        #[source]
        source: kube::Error,
    },
    /// The Secret does not exist.
    #[error("the credentials Secret {name} does not exist")]
    SecretMissing { name: String },
    /// The Secret lacks a key (or its value is empty).
    #[error("Secret {name} has no {key}")]
    KeyMissing { name: String, key: &'static str },
}

/// The access key and secret in a repository's credentials Secret `name`.
pub async fn credentials(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<Secret, CredentialsError> {
    let secrets: kube::Api<k8s_openapi::api::core::v1::Secret> =
        kube::Api::namespaced(client.clone(), namespace);
    let secret = secrets
        .get_opt(name)
        .await
        .map_err(|source| CredentialsError::Read {
            name: name.to_string(),
            source,
        })?
        .ok_or_else(|| CredentialsError::SecretMissing {
            name: name.to_string(),
        })?;
    let value = |key: &'static str| {
        secret
            .data
            .as_ref()
            .and_then(|data| data.get(key))
            .map(|bytes| String::from_utf8_lossy(&bytes.0).trim().to_string())
            .filter(|value| !value.is_empty())
            .ok_or_else(|| CredentialsError::KeyMissing {
                name: name.to_string(),
                key,
            })
    };
    Ok(Secret {
        access_key_id: value(ACCESS_KEY_ID)?,
        secret_access_key: value(SECRET_ACCESS_KEY)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value_of(env: &[serde_json::Value], name: &str) -> Option<String> {
        env.iter()
            .find(|variable| variable["name"] == name)
            .map(|variable| variable["value"].as_str().unwrap_or_default().to_string())
    }

    #[test]
    fn a_mover_gets_the_repository_bounds_it_names_and_no_others() {
        use custody_proto::mover::env;
        let mut spec: crate::api::BackupRepositorySpec = serde_json::from_value(
            serde_json::json!({"endpoint": "http://s3", "bucket": "b", "credentialsSecretRef": {"name": "creds"}}),
        )
        .unwrap();
        let plain = mover_env(&spec);
        for name in [
            env::UPLOAD_KIB_PER_SECOND,
            env::DOWNLOAD_KIB_PER_SECOND,
            env::STALL_SECONDS,
            env::MIN_KIB_PER_SECOND,
        ] {
            assert_eq!(value_of(&plain, name), None, "{name}");
        }
        spec.bandwidth = Some(crate::api::RepositoryBandwidth {
            upload_kib_per_second: Some(512),
            download_kib_per_second: None,
        });
        let bounded = mover_env(&spec);
        assert_eq!(
            value_of(&bounded, env::UPLOAD_KIB_PER_SECOND).as_deref(),
            Some("512")
        );
        assert_eq!(value_of(&bounded, env::DOWNLOAD_KIB_PER_SECOND), None);
        spec.bandwidth = Some(crate::api::RepositoryBandwidth {
            upload_kib_per_second: None,
            download_kib_per_second: Some(2048),
        });
        let bounded = mover_env(&spec);
        assert_eq!(value_of(&bounded, env::UPLOAD_KIB_PER_SECOND), None);
        assert_eq!(
            value_of(&bounded, env::DOWNLOAD_KIB_PER_SECOND).as_deref(),
            Some("2048")
        );
    }

    #[test]
    fn only_a_plain_http_endpoint_goes_without_the_system_roots() {
        for (url, plain) in [
            ("http://127.0.0.1:9000", true),
            ("HTTP://minio.example:9000/", true),
            ("https://s3.example.com", false),
            ("HTTPS://s3.example.com", false),
            ("http", false),
            ("", false),
            ("s3.example.com", false),
        ] {
            assert_eq!(plain_http(url), plain, "{url}");
        }
    }

    /// What `kubectl explain backuprepository.spec.credentialsSecretRef` says are the Secret's
    /// keys is what the controller and the movers read.
    #[test]
    fn the_documented_secret_keys_are_the_ones_read() {
        use kube::CustomResourceExt;
        let crd = serde_json::to_value(crate::api::BackupRepository::crd()).unwrap();
        let said = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
            ["properties"]["credentialsSecretRef"]["description"]
            .as_str()
            .unwrap()
            .to_string();
        for key in [ACCESS_KEY_ID, SECRET_ACCESS_KEY] {
            assert!(said.contains(&format!("`{key}`")), "{key} not in: {said}");
        }
        for wrong in ["accessKeyId", "secretAccessKey"] {
            assert!(!said.contains(wrong), "{wrong} in: {said}");
        }
    }
}
