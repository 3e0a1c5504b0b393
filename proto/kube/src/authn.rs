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
