//! A ServiceAccount's token exchanged for temporary S3 credentials: STS
//! `AssumeRoleWithWebIdentity`, as IRSA and any OpenID Connect federation with the cluster's
//! ServiceAccount issuer do. The mover reads its token from the file the kubelet projects into
//! its pod (and keeps fresh); the controller asks the API server for one with a TokenRequest,
//! which only a namespace's admin lets it do.

use std::path::PathBuf;
use std::time::SystemTime;

use aws_sdk_s3::config::Credentials;

/// The audience of a web identity's token when the repository names none (what AWS's STS
/// expects).
pub const DEFAULT_AUDIENCE: &str = "sts.amazonaws.com";
/// Where a mover's pod has its web identity token (a projected volume of that audience only).
pub const TOKEN_DIRECTORY: &str = "/var/run/secrets/custody.io/web-identity";
/// The token's file in [`TOKEN_DIRECTORY`].
pub const TOKEN_FILE: &str = "token";
/// How long a token custody asks for lives (the API server's minimum is 10 minutes).
pub const TOKEN_SECONDS: i64 = 600;
/// How long a token the kubelet projects into a mover's pod lives (it renews it at 80%).
pub const PROJECTED_TOKEN_SECONDS: i64 = 3600;
/// The longest STS answer read (a few KiB in practice; the endpoint is the repository
/// writer's to choose, and the controller is every tenant's).
pub const MAX_ANSWER_BYTES: usize = 64 * 1024;
/// How long the temporary credentials live (the STS's minimum; asked again when they end).
pub const SESSION_SECONDS: u32 = 3600;

/// Where a web identity's token comes from.
#[derive(Clone)]
pub enum TokenSource {
    /// A file the kubelet keeps fresh: read at every exchange.
    File(PathBuf),
    /// A TokenRequest for `account` in `namespace`, for `audience`.
    Request {
        client: kube::Client,
        namespace: String,
        account: String,
        audience: String,
    },
}

impl std::fmt::Debug for TokenSource {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TokenSource::File(path) => write!(formatter, "the token in {}", path.display()),
            TokenSource::Request {
                namespace, account, ..
            } => write!(formatter, "a token of ServiceAccount {namespace}/{account}"),
        }
    }
}

/// A web identity: whose token, exchanged where, for which role.
#[derive(Clone, Debug)]
pub struct WebIdentity {
    pub role_arn: String,
    /// The STS's URL.
    pub sts_endpoint: String,
    pub session_name: String,
    pub token: TokenSource,
}

/// Why no temporary credentials were had.
#[derive(Debug, thiserror::Error)]
pub enum StsError {
    /// The token could not be read or asked for.
    #[error("{0}")]
    Token(String),
    /// The API server refused custody a token of the ServiceAccount (403): the namespace's
    /// admin has not let it.
    #[error(
        "custody may not ask for tokens of ServiceAccount {namespace}/{account}: the namespace's admin lets it with kubectl create rolebinding {role} --namespace {namespace} --clusterrole {role} and custody's ServiceAccount as its subject (--serviceaccount custody-system:custody-controller as deploy/ installs it)",
        role = WEB_IDENTITY_ROLE
    )]
    TokenForbidden { namespace: String, account: String },
    /// The ServiceAccount does not exist (404).
    #[error(
        "ServiceAccount {namespace}/{account} does not exist: create it, or fix spec.webIdentity.serviceAccountName"
    )]
    AccountMissing { namespace: String, account: String },
    /// The STS did not answer, or not in time.
    #[error("the STS at {endpoint} did not answer: {reason}")]
    Unreachable { endpoint: String, reason: String },
    /// The STS answered with an error.
    #[error("the STS at {endpoint} refused the token: {reason}")]
    Refused { endpoint: String, reason: String },
    /// The STS answered something that is not credentials.
    #[error("the STS at {endpoint} answered no credentials: {reason}")]
    Unreadable { endpoint: String, reason: String },
}

/// The ClusterRole a namespace's admin binds to custody's controller in the namespace to let
/// it ask for tokens of the namespace's ServiceAccounts (web identities).
pub const WEB_IDENTITY_ROLE: &str = "custody-web-identity";

/// Temporary credentials the STS gave.
#[derive(Clone, PartialEq, Eq)]
pub struct Temporary {
    pub access_key_id: String,
    pub secret_access_key: String,
    pub session_token: String,
    pub expires: SystemTime,
}

impl std::fmt::Debug for Temporary {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Temporary")
            .field("access_key_id", &self.access_key_id)
            .field("expires", &self.expires)
            .finish_non_exhaustive()
    }
}

/// The STS of `region` on AWS (the global one without a region).
pub fn default_sts_endpoint(region: &str) -> String {
    if region.is_empty() {
        "https://sts.amazonaws.com".to_string()
    } else {
        format!("https://sts.{region}.amazonaws.com")
    }
}

/// A session name the STS accepts (`[\w+=,.@-]`, 2 to 64 characters) saying who asks.
pub fn session_name(who: &str) -> String {
    let mut name: String = who
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "_+=,.@-".contains(c) {
                c
            } else {
                '-'
            }
        })
        .take(64)
        .collect();
    while name.len() < 2 {
        name.push('-');
    }
    name
}

/// `application/x-www-form-urlencoded` of `pairs`.
pub fn form(pairs: &[(&str, &str)]) -> String {
    let encode = |text: &str| {
        let mut out = String::with_capacity(text.len());
        for byte in text.bytes() {
            if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
                out.push(byte as char);
            } else {
                out.push_str(&format!("%{byte:02X}"));
            }
        }
        out
    };
    pairs
        .iter()
        .map(|(name, value)| format!("{}={}", encode(name), encode(value)))
        .collect::<Vec<_>>()
        .join("&")
}

/// The body of an `AssumeRoleWithWebIdentity` call.
pub fn request_body(identity: &WebIdentity, token: &str) -> String {
    let seconds = SESSION_SECONDS.to_string();
    form(&[
        ("Action", "AssumeRoleWithWebIdentity"),
        ("Version", "2011-06-15"),
        ("RoleArn", &identity.role_arn),
        ("RoleSessionName", &identity.session_name),
        ("WebIdentityToken", token),
        ("DurationSeconds", &seconds),
    ])
}

/// What the STS's answer (HTTP `status`, XML `body`) says: credentials, or why not.
pub fn read_answer(endpoint: &str, status: u16, body: &str) -> Result<Temporary, StsError> {
    let texts = texts(body).map_err(|reason| StsError::Unreadable {
        endpoint: endpoint.to_string(),
        reason: format!("HTTP {status}: {reason}"),
    })?;
    let find = |name: &str| {
        texts
            .iter()
            .find(|(tag, _)| tag == name)
            .map(|(_, text)| text.trim().to_string())
            .filter(|text| !text.is_empty())
    };
    if !(200..300).contains(&status) {
        let reason = match (find("Code"), find("Message")) {
            (Some(code), Some(message)) => format!("HTTP {status} {code}: {message}"),
            (Some(code), None) => format!("HTTP {status} {code}"),
            (None, Some(message)) => format!("HTTP {status}: {message}"),
            (None, None) => format!("HTTP {status}"),
        };
        // A server error or throttling says nothing of the token: try again later.
        if status >= 500 || status == 429 {
            return Err(StsError::Unreachable {
                endpoint: endpoint.to_string(),
                reason,
            });
        }
        return Err(StsError::Refused {
            endpoint: endpoint.to_string(),
            reason,
        });
    }
    let unreadable = |reason: String| StsError::Unreadable {
        endpoint: endpoint.to_string(),
        reason,
    };
    let field = |name: &str| find(name).ok_or_else(|| unreadable(format!("no {name}")));
    let expiration = field("Expiration")?;
    let expires = aws_smithy_types::DateTime::from_str(
        &expiration,
        aws_smithy_types::date_time::Format::DateTime,
    )
    .ok()
    .and_then(|time| SystemTime::try_from(time).ok())
    .ok_or_else(|| unreadable(format!("Expiration {expiration:?} is not a time")))?;
    Ok(Temporary {
        access_key_id: field("AccessKeyId")?,
        secret_access_key: field("SecretAccessKey")?,
        session_token: field("SessionToken")?,
        expires,
    })
}

/// Every element with text of an XML document, as (local name, text), in document order.
fn texts(body: &str) -> Result<Vec<(String, String)>, String> {
    let mut document = aws_smithy_xml::decode::Document::new(body);
    let mut root = document
        .root_element()
        .map_err(|error| format!("not XML: {error}"))?;
    let mut found = Vec::new();
    collect(&mut root, &mut found, 0)?;
    Ok(found)
}

fn collect(
    element: &mut aws_smithy_xml::decode::ScopedDecoder<'_, '_>,
    found: &mut Vec<(String, String)>,
    depth: usize,
) -> Result<(), String> {
    if depth > 8 {
        return Err("nested too deep".into());
    }
    while let Some(mut child) = element.next_tag() {
        let name = child.start_el().local().to_string();
        if matches!(
            name.as_str(),
            "AccessKeyId" | "SecretAccessKey" | "SessionToken" | "Expiration" | "Code" | "Message"
        ) {
            let text = aws_smithy_xml::decode::try_data(&mut child)
                .map_err(|error| format!("{name}: {error}"))?;
            found.push((name, text.into_owned()));
        } else {
            collect(&mut child, found, depth + 1)?;
        }
    }
    Ok(())
}

impl WebIdentity {
    /// The token to present now.
    pub async fn token(&self) -> Result<String, StsError> {
        match &self.token {
            TokenSource::File(path) => std::fs::read_to_string(path)
                .map(|token| token.trim().to_string())
                .map_err(|error| {
                    StsError::Token(format!(
                        "reading the web identity token {}: {error}",
                        path.display()
                    ))
                }),
            TokenSource::Request {
                client,
                namespace,
                account,
                audience,
            } => {
                let accounts: kube::Api<k8s_openapi::api::core::v1::ServiceAccount> =
                    kube::Api::namespaced(client.clone(), namespace);
                let answer = accounts
                    .create_token_request(
                        account,
                        &kube::api::PostParams::default(),
                        &token_request(audience),
                    )
                    .await;
                answered_token(namespace, account, answer)
            }
        }
    }

    /// Temporary credentials for the token, from the STS (trusted with `endpoint`'s CA bundle,
    /// bounded by its connect and stall limits).
    pub async fn assume(&self, endpoint: &crate::s3::Endpoint) -> Result<Temporary, StsError> {
        let token = self.token().await?;
        let unreachable = |reason: String| StsError::Unreachable {
            endpoint: self.sts_endpoint.clone(),
            reason,
        };
        let connector =
            crate::s3::connector(endpoint).map_err(|error| unreachable(error.to_string()))?;
        let mut request = aws_smithy_runtime_api::http::Request::new(
            aws_smithy_types::body::SdkBody::from(request_body(self, &token)),
        );
        request
            .set_method("POST")
            .map_err(|error| unreachable(error.to_string()))?;
        request
            .set_uri(self.sts_endpoint.as_str())
            .map_err(|error| unreachable(format!("not a URL: {error}")))?;
        request
            .headers_mut()
            .insert("content-type", "application/x-www-form-urlencoded");
        let bound = endpoint.limits.connect + endpoint.limits.stall;
        let call = async {
            use aws_smithy_runtime_api::client::http::HttpConnector;
            let response = connector
                .call(request)
                .await
                .map_err(|error| crate::s3::error_chain(&error))?;
            let status = response.status().as_u16();
            let mut stream = aws_smithy_types::byte_stream::ByteStream::new(response.into_body());
            let mut body = Vec::new();
            while let Some(bytes) = stream.next().await {
                body.extend_from_slice(&bytes.map_err(|error| crate::s3::error_chain(&error))?);
                if body.len() > MAX_ANSWER_BYTES {
                    return Err(format!(
                        "its answer is longer than {MAX_ANSWER_BYTES} bytes"
                    ));
                }
            }
            Ok::<_, String>((status, body))
        };
        let (status, body) = tokio::time::timeout(bound, call)
            .await
            .map_err(|_| unreachable(format!("no answer within {bound:?}")))?
            .map_err(unreachable)?;
        read_answer(&self.sts_endpoint, status, &String::from_utf8_lossy(&body))
    }
}

/// A TokenRequest for `audience` alone, living [`TOKEN_SECONDS`].
pub fn token_request(audience: &str) -> k8s_openapi::api::authentication::v1::TokenRequest {
    use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
    TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec![audience.to_string()],
            expiration_seconds: Some(TOKEN_SECONDS),
            bound_object_ref: None,
        },
        ..TokenRequest::default()
    }
}

/// What the API server's answer to a TokenRequest for `namespace`/`account` gives: the token,
/// or why not (403: the namespace has not let custody ask).
pub fn answered_token(
    namespace: &str,
    account: &str,
    answer: Result<k8s_openapi::api::authentication::v1::TokenRequest, kube::Error>,
) -> Result<String, StsError> {
    match answer {
        Ok(answer) => answer
            .status
            .map(|status| status.token)
            .filter(|token| !token.is_empty())
            .ok_or_else(|| {
                StsError::Token(format!(
                    "the API server gave no token of ServiceAccount {namespace}/{account}"
                ))
            }),
        Err(kube::Error::Api(status)) if status.code == 403 => Err(StsError::TokenForbidden {
            namespace: namespace.to_string(),
            account: account.to_string(),
        }),
        Err(kube::Error::Api(status)) if status.code == 404 => Err(StsError::AccountMissing {
            namespace: namespace.to_string(),
            account: account.to_string(),
        }),
        Err(error) => Err(StsError::Token(format!(
            "asking for a token of ServiceAccount {namespace}/{account}: {error}"
        ))),
    }
}

/// The SDK's credentials provider for a web identity: asked again when the credentials it gave
/// near their end.
#[derive(Debug)]
pub(crate) struct Provider {
    pub identity: WebIdentity,
    pub endpoint: crate::s3::Endpoint,
}

impl aws_sdk_s3::config::ProvideCredentials for Provider {
    fn provide_credentials<'a>(
        &'a self,
    ) -> aws_credential_types::provider::future::ProvideCredentials<'a>
    where
        Self: 'a,
    {
        aws_credential_types::provider::future::ProvideCredentials::new(async move {
            let temporary = self
                .identity
                .assume(&self.endpoint)
                .await
                .map_err(|error| {
                    aws_credential_types::provider::error::CredentialsError::provider_error(error)
                })?;
            Ok(Credentials::new(
                temporary.access_key_id,
                temporary.secret_access_key,
                Some(temporary.session_token),
                Some(temporary.expires),
                "custody-web-identity",
            ))
        })
    }
}

/// How a mover signs, from its environment (`lookup`): the standard AWS chain's first two
/// links, keys (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`) before a web identity
/// (`AWS_ROLE_ARN`, `AWS_WEB_IDENTITY_TOKEN_FILE`, `AWS_ENDPOINT_URL_STS`,
/// `AWS_ROLE_SESSION_NAME`); `region` picks the default STS.
pub fn from_env(
    lookup: impl Fn(&str) -> Option<String>,
    region: &str,
) -> Result<crate::s3::Credentials, String> {
    use custody_proto::mover::env;
    let read = |name: &str| lookup(name).filter(|value| !value.trim().is_empty());
    match (read(env::ACCESS_KEY_ID), read(env::SECRET_ACCESS_KEY)) {
        (Some(access_key_id), Some(secret_access_key)) => {
            return Ok(crate::s3::Credentials::Keys(crate::s3::Secret {
                access_key_id,
                secret_access_key,
            }));
        }
        (Some(_), None) => return Err(format!("${} is not set", env::SECRET_ACCESS_KEY)),
        (None, Some(_)) => return Err(format!("${} is not set", env::ACCESS_KEY_ID)),
        (None, None) => {}
    }
    match (read(env::ROLE_ARN), read(env::WEB_IDENTITY_TOKEN_FILE)) {
        (Some(role_arn), Some(file)) => Ok(crate::s3::Credentials::WebIdentity(WebIdentity {
            role_arn,
            sts_endpoint: read(env::STS_ENDPOINT).unwrap_or_else(|| default_sts_endpoint(region)),
            session_name: session_name(
                &read(env::ROLE_SESSION_NAME).unwrap_or_else(|| "custody-mover".into()),
            ),
            token: TokenSource::File(PathBuf::from(file)),
        })),
        (Some(_), None) => Err(format!(
            "${} is set but ${} is not",
            env::ROLE_ARN,
            env::WEB_IDENTITY_TOKEN_FILE
        )),
        (None, Some(_)) => Err(format!(
            "${} is set but ${} is not",
            env::WEB_IDENTITY_TOKEN_FILE,
            env::ROLE_ARN
        )),
        (None, None) => Err(format!(
            "no S3 credentials: neither ${} and ${} (a credentials Secret) nor ${} and ${} (a web identity) are set",
            env::ACCESS_KEY_ID,
            env::SECRET_ACCESS_KEY,
            env::ROLE_ARN,
            env::WEB_IDENTITY_TOKEN_FILE
        )),
    }
}

#[cfg(test)]
mod tests;
