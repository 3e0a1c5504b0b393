//! Who is calling: decisions over the result of a TokenReview, for both gRPC services.
//!
//! The gate answers a pod only about itself and only if it runs on the agent's node; the
//! report service accepts a report about a node only from the agent on that node. Both take
//! the identity from the API server's TokenReview, never from the request.

use std::collections::BTreeMap;

use crate::names;

/// The parts of a TokenReview status these decisions read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Review {
    pub authenticated: bool,
    /// The API server's error, when it gave one.
    pub error: Option<String>,
    /// Audiences the token is valid for, of those asked for.
    pub audiences: Vec<String>,
    pub username: String,
    pub extra: BTreeMap<String, Vec<String>>,
}

/// A pod the caller's token is bound to, as the agent's own view of its node lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KnownPod {
    pub namespace: String,
    pub name: String,
    pub node_name: String,
}

/// Why a caller is refused. Each variant names what to fix.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("the token was not accepted by the API server: {0}")]
    Unauthenticated(String),
    #[error("the token is not valid for audience {0:?}")]
    WrongAudience(String),
    #[error("the token does not belong to a ServiceAccount")]
    NotAServiceAccount,
    #[error("the token is not bound to a pod: use a projected ServiceAccount token")]
    NotBoundToPod,
    #[error("the token's pod runs on node {found:?}, not on this agent's node {expected:?}")]
    OtherNode { expected: String, found: String },
    #[error("pod {0} is not on this agent's node")]
    PodNotOnThisNode(String),
    #[error("the token names pod {token}, but that UID belongs to {found}")]
    PodMismatch { token: String, found: String },
    #[error("ServiceAccount {found:?} may not report; expected {expected:?}")]
    NotTheAgent { expected: String, found: String },
    #[error(
        "the token names no node; the report service needs a token of a pod scheduled to its node"
    )]
    NoNode,
    #[error("the bearer token is not a ServiceAccount token: {0}")]
    Malformed(String),
    #[error("the token expired")]
    Expired,
}

impl Refusal {
    /// CamelCase reason for logs and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::Unauthenticated(_) => "Unauthenticated",
            Refusal::WrongAudience(_) => "WrongAudience",
            Refusal::NotAServiceAccount => "NotAServiceAccount",
            Refusal::NotBoundToPod => "NotBoundToPod",
            Refusal::OtherNode { .. } => "OtherNode",
            Refusal::PodNotOnThisNode(_) => "PodNotOnThisNode",
            Refusal::PodMismatch { .. } => "PodMismatch",
            Refusal::NotTheAgent { .. } => "NotTheAgent",
            Refusal::NoNode => "NoNode",
            Refusal::Malformed(_) => "MalformedToken",
            Refusal::Expired => "TokenExpired",
        }
    }

    /// Whether the caller is not who it says (gRPC `Unauthenticated`), rather than known and
    /// not allowed (`PermissionDenied`).
    pub fn unauthenticated(&self) -> bool {
        matches!(
            self,
            Refusal::Unauthenticated(_)
                | Refusal::WrongAudience(_)
                | Refusal::Malformed(_)
                | Refusal::Expired
        )
    }
}

/// The longest bearer token considered (a projected ServiceAccount token is about 1 KiB).
pub const MAX_TOKEN_BYTES: usize = 16 << 10;

/// Seconds a token may look expired by the agent's clock and still be reviewed (the API server's
/// clock decides).
pub const EXPIRY_LEEWAY_SECONDS: i64 = 60;

/// What an unreviewed token claims: the pod it is bound to, and its node when it names one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claimed {
    pub pod_uid: String,
    pub node: Option<String>,
}

/// Checks, before anything asks the API server, that `token` can be a pod-bound ServiceAccount
/// token for `audience` that has not expired at `now` (Unix seconds): a JWT whose unverified
/// claims say so. Returns the pod (and node) it claims to be bound to. It proves nothing (the
/// TokenReview does); it keeps junk, other audiences, expired and unbound tokens from costing a
/// TokenReview each.
pub fn token_shape(token: &str, audience: &str, now: i64) -> Result<Claimed, Refusal> {
    use base64::Engine;
    let malformed = |why: &str| Err(Refusal::Malformed(why.to_string()));
    if token.len() > MAX_TOKEN_BYTES {
        return malformed("longer than 16 KiB");
    }
    let parts: Vec<&str> = token.split('.').collect();
    let [header, payload, signature] = parts.as_slice() else {
        return malformed("not a JWT (three dot-separated parts)");
    };
    if header.is_empty() || signature.is_empty() {
        return malformed("not a signed JWT");
    }
    let Ok(payload) =
        base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(payload.trim_end_matches('='))
    else {
        return malformed("its claims are not base64url");
    };
    let Ok(claims) = serde_json::from_slice::<serde_json::Value>(&payload) else {
        return malformed("its claims are not JSON");
    };
    let audiences = match &claims["aud"] {
        serde_json::Value::String(one) => vec![one.as_str()],
        serde_json::Value::Array(many) => many.iter().filter_map(|one| one.as_str()).collect(),
        _ => Vec::new(),
    };
    if !audiences.contains(&audience) {
        return Err(Refusal::WrongAudience(audience.to_string()));
    }
    match claims["exp"].as_i64() {
        Some(exp) if exp + EXPIRY_LEEWAY_SECONDS > now => {}
        Some(_) => return Err(Refusal::Expired),
        None => return malformed("it has no expiry"),
    }
    let bound = &claims["kubernetes.io"];
    match bound["pod"]["uid"].as_str() {
        Some(uid) if !uid.is_empty() => Ok(Claimed {
            pod_uid: uid.to_string(),
            node: bound["node"]["name"].as_str().map(str::to_string),
        }),
        _ => Err(Refusal::NotBoundToPod),
    }
}

/// The pod a gate caller is, once proven.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GateCaller {
    pub pod_uid: String,
    pub namespace: String,
    pub name: String,
}

fn single<'a>(review: &'a Review, key: &str) -> Option<&'a str> {
    match review.extra.get(key).map(Vec::as_slice) {
        Some([value]) if !value.is_empty() => Some(value),
        _ => None,
    }
}

fn authenticated(review: &Review, audience: &str) -> Result<(), Refusal> {
    if !review.authenticated {
        return Err(Refusal::Unauthenticated(
            review
                .error
                .clone()
                .unwrap_or_else(|| "not authenticated".to_string()),
        ));
    }
    if !review.audiences.iter().any(|found| found == audience) {
        return Err(Refusal::WrongAudience(audience.to_string()));
    }
    Ok(())
}

/// `system:serviceaccount:<namespace>:<name>` split in two.
fn service_account(username: &str) -> Option<(&str, &str)> {
    let rest = username.strip_prefix("system:serviceaccount:")?;
    let (namespace, name) = rest.split_once(':')?;
    (!namespace.is_empty() && !name.is_empty() && !name.contains(':')).then_some((namespace, name))
}

/// Decides who a gate caller is: the pod its token is bound to, which must run on
/// `own_node`. `pods` looks a pod up by UID in the agent's view of its own node.
pub fn gate_caller(
    review: &Review,
    own_node: &str,
    pods: impl Fn(&str) -> Option<KnownPod>,
) -> Result<GateCaller, Refusal> {
    authenticated(review, names::GATE_AUDIENCE)?;
    let (account_namespace, _) =
        service_account(&review.username).ok_or(Refusal::NotAServiceAccount)?;
    let (Some(pod_uid), Some(pod_name)) = (
        single(review, names::EXTRA_POD_UID),
        single(review, names::EXTRA_POD_NAME),
    ) else {
        return Err(Refusal::NotBoundToPod);
    };
    if let Some(node) = single(review, names::EXTRA_NODE_NAME)
        && node != own_node
    {
        return Err(Refusal::OtherNode {
            expected: own_node.to_string(),
            found: node.to_string(),
        });
    }
    let token_pod = format!("{account_namespace}/{pod_name}");
    let pod = pods(pod_uid).ok_or_else(|| Refusal::PodNotOnThisNode(token_pod.clone()))?;
    if pod.node_name != own_node {
        return Err(Refusal::OtherNode {
            expected: own_node.to_string(),
            found: pod.node_name,
        });
    }
    if pod.namespace != account_namespace || pod.name != pod_name {
        return Err(Refusal::PodMismatch {
            token: token_pod,
            found: format!("{}/{}", pod.namespace, pod.name),
        });
    }
    Ok(GateCaller {
        pod_uid: pod_uid.to_string(),
        namespace: pod.namespace,
        name: pod.name,
    })
}

/// Decides whether a report about `claimed_node` comes from the agent on that node: the
/// token must belong to `agent_account` (`namespace:name`) and be bound to a pod scheduled to
/// that node.
pub fn report_caller(
    review: &Review,
    agent_account: &str,
    claimed_node: &str,
) -> Result<(), Refusal> {
    authenticated(review, names::REPORT_AUDIENCE)?;
    let (namespace, name) = service_account(&review.username).ok_or(Refusal::NotAServiceAccount)?;
    if format!("{namespace}:{name}") != agent_account {
        return Err(Refusal::NotTheAgent {
            expected: agent_account.to_string(),
            found: format!("{namespace}:{name}"),
        });
    }
    let node = single(review, names::EXTRA_NODE_NAME).ok_or(Refusal::NoNode)?;
    if node != claimed_node {
        return Err(Refusal::OtherNode {
            expected: claimed_node.to_string(),
            found: node.to_string(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests;
