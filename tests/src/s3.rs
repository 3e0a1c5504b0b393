//! The real S3 server (MinIO built by `hack/build-s3.sh`): the shared one `hack/s3-up.sh`
//! runs, or a private one a test may stop and start.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use custody_controller::s3::{self, Endpoint, Secret};

use crate::{ChildGuard, free_port, repo_root};

/// Access key of the test servers (hack/lib.sh's default).
pub const ACCESS_KEY: &str = "custody";
/// Secret key of the test servers (hack/lib.sh's default).
pub const SECRET_KEY: &str = "custody-secret-key";

/// The credentials of the test servers.
pub fn secret() -> Secret {
    Secret {
        access_key_id: ACCESS_KEY.into(),
        secret_access_key: SECRET_KEY.into(),
    }
}

/// Starts the shared S3 server once per test process; returns its endpoint URL.
pub fn shared() -> &'static str {
    static ENDPOINT: OnceLock<String> = OnceLock::new();
    ENDPOINT.get_or_init(|| {
        let output = Command::new(repo_root().join("hack/s3-up.sh"))
            .stderr(Stdio::inherit())
            .output()
            .expect("running hack/s3-up.sh");
        assert!(output.status.success(), "hack/s3-up.sh failed");
        String::from_utf8(output.stdout)
            .expect("utf-8")
            .lines()
            .last()
            .expect("endpoint")
            .trim()
            .to_string()
    })
}

/// The MinIO binary (built by `hack/build-s3.sh`).
pub fn minio_binary() -> PathBuf {
    let output = Command::new(repo_root().join("hack/build-s3.sh"))
        .stderr(Stdio::inherit())
        .output()
        .expect("running hack/build-s3.sh");
    assert!(output.status.success(), "hack/build-s3.sh failed");
    PathBuf::from(
        String::from_utf8(output.stdout)
            .expect("utf-8")
            .lines()
            .last()
            .expect("binary path")
            .trim(),
    )
}

/// An endpoint for `bucket` on the server at `url`.
pub fn endpoint(url: &str, bucket: &str) -> Endpoint {
    Endpoint {
        url: url.to_string(),
        region: "us-east-1".into(),
        bucket: bucket.to_string(),
        path_style: true,
        ca_bundle: None,
    }
}

/// A client for the server at `url`.
pub fn client(url: &str) -> aws_sdk_s3::Client {
    s3::client(&endpoint(url, "unused"), &secret()).expect("S3 client")
}

/// A bucket of its own for a test, `<prefix>-<random>`.
pub async fn bucket(url: &str, prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .subsec_nanos();
    let name = format!(
        "{prefix}-{:08x}",
        nanos ^ std::process::id().rotate_left(12)
    );
    client(url)
        .create_bucket()
        .bucket(&name)
        .send()
        .await
        .unwrap_or_else(|error| panic!("creating bucket {name}: {error:?}"));
    name
}

/// Writes `body` at `key` (a test's way to corrupt an artifact).
pub async fn put(url: &str, bucket: &str, key: &str, body: Vec<u8>) {
    client(url)
        .put_object()
        .bucket(bucket)
        .key(key)
        .body(body.into())
        .send()
        .await
        .unwrap_or_else(|error| panic!("putting {bucket}/{key}: {error}"));
}

/// Keys in `bucket` under `prefix`.
pub async fn keys(url: &str, bucket: &str, prefix: &str) -> Vec<String> {
    let listed = client(url)
        .list_objects_v2()
        .bucket(bucket)
        .prefix(prefix)
        .send()
        .await
        .expect("listing objects");
    listed
        .contents()
        .iter()
        .filter_map(|object| object.key().map(str::to_string))
        .collect()
}

/// A MinIO of a test's own, on its own port and data directory, that the test may stop and
/// start again.
pub struct PrivateS3 {
    pub url: String,
    port: u16,
    data: tempfile::TempDir,
    process: Option<ChildGuard>,
}

impl PrivateS3 {
    pub fn start() -> PrivateS3 {
        let port = free_port();
        let mut server = PrivateS3 {
            url: format!("http://127.0.0.1:{port}"),
            port,
            data: tempfile::tempdir().expect("data directory"),
            process: None,
        };
        server.resume();
        server
    }

    /// Starts the server (again) on the same port and data.
    pub fn resume(&mut self) {
        let child = Command::new(minio_binary())
            .args([
                "server",
                self.data.path().to_str().expect("utf-8"),
                "--address",
            ])
            .arg(format!("127.0.0.1:{}", self.port))
            .args(["--console-address", &format!("127.0.0.1:{}", free_port())])
            .env("MINIO_ROOT_USER", ACCESS_KEY)
            .env("MINIO_ROOT_PASSWORD", SECRET_KEY)
            .env("MINIO_BROWSER", "off")
            .env("MINIO_UPDATE", "off")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting MinIO");
        self.process = Some(ChildGuard(Some(child)));
        let deadline = Instant::now() + Duration::from_secs(30);
        let health = format!("127.0.0.1:{}", self.port);
        loop {
            let ready = crate::agent::http_get(self.port, "/minio/health/ready")
                .is_some_and(|(code, _)| code == 200);
            if ready {
                return;
            }
            assert!(Instant::now() < deadline, "MinIO on {health} not ready");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Kills the server.
    pub fn kill(&mut self) {
        self.process = None;
    }
}
