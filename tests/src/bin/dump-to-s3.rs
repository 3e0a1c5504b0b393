//! Stands in for a user's backup command (a database operator's dump job): writes one dump
//! under `$CUSTODY_S3_PREFIX/` named with the current UTC time by this process's clock —
//! which `faketime` may skew, as a node's clock can be — and nothing else.
//!
//!   CUSTODY_S3_ENDPOINT=... CUSTODY_S3_BUCKET=... CUSTODY_S3_PREFIX=... \
//!   AWS_ACCESS_KEY_ID=... AWS_SECRET_ACCESS_KEY=... dump-to-s3 [SOURCE]

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let env = |name: &str| std::env::var(name).map_err(|_| anyhow::anyhow!("{name} is not set"));
    let endpoint = env("CUSTODY_S3_ENDPOINT")?;
    let bucket = env("CUSTODY_S3_BUCKET")?;
    let prefix = env("CUSTODY_S3_PREFIX")?;
    let source = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "/data".to_string());
    let files = std::fs::read_dir(&source)
        .map(|dir| dir.count())
        .unwrap_or(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs();
    let stamp = k8s_openapi::jiff::Timestamp::from_second(now as i64)?
        .strftime("%Y%m%dT%H%M%SZ")
        .to_string();
    let key = format!("{}/db-{stamp}.dump", prefix.trim_end_matches('/'));
    let endpoint = custody_kube::s3::Endpoint {
        url: endpoint,
        region: "us-east-1".to_string(),
        bucket: bucket.clone(),
        path_style: true,
        ca_bundle: None,
        limits: custody_kube::s3::Limits::default(),
        ..Default::default()
    };
    let secret = custody_kube::s3::Credentials::Keys(custody_kube::s3::Secret {
        access_key_id: env("AWS_ACCESS_KEY_ID")?,
        secret_access_key: env("AWS_SECRET_ACCESS_KEY")?,
    });
    custody_kube::s3::client(&endpoint, &secret)?
        .put_object()
        .bucket(bucket)
        .key(&key)
        .body(
            format!("dump of {files} entries of {source}\n")
                .into_bytes()
                .into(),
        )
        .send()
        .await?;
    eprintln!("wrote {key}");
    Ok(())
}
