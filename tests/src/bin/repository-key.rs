//! Creates a repository of format 2 (or opens the one there) with a password, and prints its
//! master key (restic's JSON) for `custody-mover`'s `CUSTODY_REPOSITORY_KEY`: what the
//! controller does for its movers, for benchmarks and trying the mover by hand.
//!
//!   AWS_ACCESS_KEY_ID=... AWS_SECRET_ACCESS_KEY=... CUSTODY_REPOSITORY_PASSWORD=... \
//!   repository-key ENDPOINT BUCKET PREFIX

use custody_repository::backend::{Location, S3Backend};
use custody_repository::open::{self, Password};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let [_, url, bucket, prefix] = &args[..] else {
        anyhow::bail!("usage: repository-key ENDPOINT BUCKET PREFIX");
    };
    let env = |name: &str| std::env::var(name).map_err(|_| anyhow::anyhow!("{name} is not set"));
    let password = Password {
        name: "password".into(),
        value: env("CUSTODY_REPOSITORY_PASSWORD")?,
    };
    let client = custody_kube::s3::client(
        &custody_kube::s3::Endpoint {
            url: url.clone(),
            region: "us-east-1".into(),
            bucket: bucket.clone(),
            path_style: true,
            ca_bundle: None,
            limits: custody_kube::s3::Limits::default(),
            ..Default::default()
        },
        &custody_kube::s3::Credentials::Keys(custody_kube::s3::Secret {
            access_key_id: env("AWS_ACCESS_KEY_ID")?,
            secret_access_key: env("AWS_SECRET_ACCESS_KEY")?,
        }),
    )?;
    let runtime = tokio::runtime::Runtime::new()?;
    let backend = S3Backend::new(
        client,
        Location {
            bucket: bucket.clone(),
            prefix: prefix.clone(),
        },
        runtime.handle().clone(),
    );
    let backends = rustic_core::RepositoryBackends::new(backend.shared(), None);
    let (opened, _) = open::open_or_init(&backends, &[password])?;
    println!("{}", serde_json::to_string(&opened.repository.key())?);
    Ok(())
}
