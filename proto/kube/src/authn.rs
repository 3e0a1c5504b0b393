//! Asking the API server who a bearer token belongs to. The decisions over the answer are
//! the pure functions in [`custody_proto::authn`].

use custody_proto::authn::Review;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use kube::api::{Api, PostParams};

/// The bearer token of a gRPC request's `authorization` metadata.
pub fn bearer_token(metadata: &tonic::metadata::MetadataMap) -> Option<&str> {
    let value = metadata.get("authorization")?.to_str().ok()?;
    let token = value
        .strip_prefix("Bearer ")
        .or_else(|| value.strip_prefix("bearer "))?
        .trim();
    (!token.is_empty()).then_some(token)
}

/// Reviews `token` for `audience` with a TokenReview.
pub async fn review(
    client: &kube::Client,
    token: &str,
    audience: &str,
) -> Result<Review, kube::Error> {
    let request = TokenReview {
        spec: TokenReviewSpec {
            token: Some(token.to_string()),
            audiences: Some(vec![audience.to_string()]),
        },
        ..TokenReview::default()
    };
    let answer = Api::<TokenReview>::all(client.clone())
        .create(&PostParams::default(), &request)
        .await?;
    let status = answer.status.unwrap_or_default();
    let user = status.user.unwrap_or_default();
    Ok(Review {
        authenticated: status.authenticated.unwrap_or(false),
        error: status.error.filter(|error| !error.is_empty()),
        audiences: status.audiences.unwrap_or_default(),
        username: user.username.unwrap_or_default(),
        extra: user.extra.unwrap_or_default().into_iter().collect(),
    })
}

/// How many TokenReviews one server has in flight at most; a call beyond them is refused
/// (`ResourceExhausted`, tried again by custody's own clients) rather than queued.
pub const MAX_REVIEWS_IN_FLIGHT: usize = 8;

/// Why a caller was not reviewed, or its review failed.
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    /// Refused before any review: not a token that could be right.
    #[error(transparent)]
    Refused(#[from] custody_proto::authn::Refusal),
    /// As many reviews as allowed are in flight.
    #[error("{MAX_REVIEWS_IN_FLIGHT} token reviews are in flight: try again")]
    Busy,
    /// The API server could not be asked.
    #[error("cannot review the token: {0}")]
    Failed(#[source] kube::Error),
}

/// TokenReviews of one server: a token's shape checked first
/// ([`custody_proto::authn::token_shape`]), at most [`MAX_REVIEWS_IN_FLIGHT`] at once.
pub struct Reviewer {
    client: kube::Client,
    in_flight: tokio::sync::Semaphore,
}

impl Reviewer {
    pub fn new(client: kube::Client) -> Reviewer {
        Reviewer {
            client,
            in_flight: tokio::sync::Semaphore::new(MAX_REVIEWS_IN_FLIGHT),
        }
    }

    /// Reviews `token` for `audience` if its shape allows, `pod` accepts the pod UID it claims
    /// (the gate: a pod it knows on its node) and a review slot is free.
    pub async fn review(
        &self,
        token: &str,
        audience: &str,
        pod: impl FnOnce(&custody_proto::authn::Claimed) -> Result<(), custody_proto::authn::Refusal>,
    ) -> Result<Review, ReviewError> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_secs() as i64);
        pod(&custody_proto::authn::token_shape(token, audience, now)?)?;
        let _slot = self
            .in_flight
            .try_acquire()
            .map_err(|_| ReviewError::Busy)?;
        review(&self.client, token, audience)
            .await
            .map_err(ReviewError::Failed)
    }
}

/// Whether a review's outcome came from asking the API server.
pub fn asked(outcome: &Result<Review, ReviewError>) -> bool {
    matches!(outcome, Ok(_) | Err(ReviewError::Failed(_)))
}

/// The gRPC status a refused caller gets (`Unauthenticated` when it is not who it says,
/// `PermissionDenied` when it is and may not), and the reason it is counted under.
pub fn refusal_status(refusal: &custody_proto::authn::Refusal) -> (&'static str, tonic::Status) {
    let status = if refusal.unauthenticated() {
        tonic::Status::unauthenticated(refusal.to_string())
    } else {
        tonic::Status::permission_denied(refusal.to_string())
    };
    (refusal.reason(), status)
}

impl ReviewError {
    /// The gRPC status a caller gets, and the reason it is counted under.
    pub fn status(&self) -> (&'static str, tonic::Status) {
        match self {
            ReviewError::Refused(refusal) => refusal_status(refusal),
            ReviewError::Busy => (
                "TooManyReviews",
                tonic::Status::resource_exhausted(self.to_string()),
            ),
            ReviewError::Failed(_) => (
                "TokenReviewFailed",
                tonic::Status::unavailable(self.to_string()),
            ),
        }
    }
}
