//! BackupRepository readiness with the real controller, API server and S3 server: each kind
//! of misconfiguration has its own reason, and fixing the Secret is noticed at once.

use std::time::Duration;

use custody_kube::api::{BackupRepository, HasConditions};
use custody_tests::agent::ControllerProcess;
use custody_tests::pki::Pki;
use custody_tests::{TestNamespace, await_condition, free_port, s3};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::events::v1::Event;
use kube::api::{ListParams, PostParams};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(60);

fn reason(repository: &BackupRepository) -> Option<(String, String)> {
    repository
        .conditions()
        .iter()
        .find(|condition| condition.type_ == "Ready")
        .map(|condition| (condition.status.clone(), condition.reason.clone()))
}

async fn secret(namespace: &TestNamespace, name: &str, access: &str, secret: &str) {
    let object: Secret = serde_json::from_value(json!({
        "metadata": {"name": name},
        "stringData": {"AWS_ACCESS_KEY_ID": access, "AWS_SECRET_ACCESS_KEY": secret},
    }))
    .unwrap();
    namespace
        .api::<Secret>()
        .create(&PostParams::default(), &object)
        .await
        .unwrap();
}

async fn repository(
    namespace: &TestNamespace,
    name: &str,
    endpoint: &str,
    bucket: &str,
    secret: &str,
) {
    let object: BackupRepository = serde_json::from_value(json!({
        "apiVersion": "custody.io/v1alpha1", "kind": "BackupRepository",
        "metadata": {"name": name},
        "spec": {
            "endpoint": endpoint, "bucket": bucket, "forcePathStyle": true,
            "credentialsSecretRef": {"name": secret},
        },
    }))
    .unwrap();
    namespace
        .api::<BackupRepository>()
        .create(&PostParams::default(), &object)
        .await
        .unwrap();
}

#[tokio::test]
async fn each_repository_problem_has_its_own_reason() {
    let namespace = TestNamespace::create("repo").await;
    let url = s3::shared();
    let bucket = s3::bucket(url, "repo").await;
    let pki = Pki::new(&["custody-controller"]);
    let _controller = ControllerProcess::start(&namespace.name, &pki, &[]);

    secret(&namespace, "good", s3::ACCESS_KEY, s3::SECRET_KEY).await;
    secret(&namespace, "wrong", "nobody", "not-the-secret").await;
    let down = format!("http://127.0.0.1:{}", free_port());
    let https_to_plain = url.replace("http://", "https://");
    let cases = [
        (
            "available",
            url,
            bucket.as_str(),
            "good",
            "True",
            "Available",
        ),
        (
            "no-secret",
            url,
            bucket.as_str(),
            "missing",
            "False",
            "SecretNotFound",
        ),
        (
            "wrong-keys",
            url,
            bucket.as_str(),
            "wrong",
            "False",
            "AccessDenied",
        ),
        (
            "no-bucket",
            url,
            "no-such-bucket-here",
            "good",
            "False",
            "BucketNotFound",
        ),
        (
            "down",
            down.as_str(),
            bucket.as_str(),
            "good",
            "False",
            "EndpointUnreachable",
        ),
        (
            "tls",
            https_to_plain.as_str(),
            bucket.as_str(),
            "good",
            "False",
            "TLSError",
        ),
    ];
    for (name, endpoint, bucket, secret, _, _) in &cases {
        repository(&namespace, name, endpoint, bucket, secret).await;
    }
    let repositories = namespace.api::<BackupRepository>();
    for (name, _, _, _, status, expected) in &cases {
        let found = await_condition(&repositories, name, expected, TIMEOUT, |repository| {
            reason(repository) == Some((status.to_string(), expected.to_string()))
        })
        .await;
        let message = &found
            .conditions()
            .iter()
            .find(|condition| condition.type_ == "Ready")
            .expect("Ready")
            .message;
        assert!(!message.is_empty(), "{name}: empty message");
        eprintln!("{name}: {expected}: {message}");
    }

    // A Warning Event names the problem.
    let events = namespace
        .api::<Event>()
        .list(&ListParams::default())
        .await
        .unwrap();
    assert!(
        events
            .items
            .iter()
            .any(|event| event.reason.as_deref() == Some("SecretNotFound")
                && event.type_.as_deref() == Some("Warning")),
        "{:?}",
        events
            .items
            .iter()
            .map(|event| &event.reason)
            .collect::<Vec<_>>()
    );

    // Creating the missing Secret is noticed through the Secret watch, well before the 30 s
    // re-check.
    let started = std::time::Instant::now();
    secret(&namespace, "missing", s3::ACCESS_KEY, s3::SECRET_KEY).await;
    await_condition(
        &repositories,
        "no-secret",
        "Available",
        Duration::from_secs(20),
        |repository| reason(repository) == Some(("True".into(), "Available".into())),
    )
    .await;
    assert!(started.elapsed() < Duration::from_secs(20));
    namespace.delete().await;
}
