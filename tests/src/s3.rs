//! The real S3 server (MinIO built by `hack/build-s3.sh`): the shared one `hack/s3-up.sh`
//! runs, or a private one a test may stop and start.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use custody_kube::s3::{self, Credentials, Endpoint, Secret};

use crate::{ChildGuard, free_port, repo_root};

/// Access key of the test servers (hack/lib.sh's default).
pub const ACCESS_KEY: &str = "custody";
/// Secret key of the test servers (hack/lib.sh's default).
pub const SECRET_KEY: &str = "custody-secret-key";

/// The credentials of the test servers.
pub fn secret() -> Credentials {
    Credentials::Keys(Secret {
        access_key_id: ACCESS_KEY.into(),
        secret_access_key: SECRET_KEY.into(),
    })
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
        ca_bundle: trusted().lock().expect("CAs").get(url).cloned(),
        limits: s3::Limits::default(),
        ..Default::default()
    }
}

/// The CA bundles of the TLS servers this process started, by URL.
fn trusted() -> &'static std::sync::Mutex<std::collections::HashMap<String, Vec<u8>>> {
    static CAS: OnceLock<std::sync::Mutex<std::collections::HashMap<String, Vec<u8>>>> =
        OnceLock::new();
    CAS.get_or_init(Default::default)
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

/// The object at `key`.
pub async fn get(url: &str, bucket: &str, key: &str) -> Vec<u8> {
    client(url)
        .get_object()
        .bucket(bucket)
        .key(key)
        .send()
        .await
        .unwrap_or_else(|error| panic!("getting {bucket}/{key}: {error}"))
        .body
        .collect()
        .await
        .expect("reading the body")
        .into_bytes()
        .to_vec()
}

/// Deletes `keys` from `bucket`.
pub async fn delete(url: &str, bucket: &str, keys: &[&str]) {
    let client = client(url);
    for key in keys {
        client
            .delete_object()
            .bucket(bucket)
            .key(*key)
            .send()
            .await
            .unwrap_or_else(|error| panic!("deleting {key}: {error:?}"));
    }
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
    /// Serving certificate and key, for HTTPS, and the CA that signed them.
    tls: Option<(tempfile::TempDir, PathBuf)>,
    /// More of the server's environment (an OpenID Connect provider).
    env: Vec<(String, String)>,
    /// Where the server's output goes.
    log: tempfile::NamedTempFile,
    process: Option<ChildGuard>,
}

impl PrivateS3 {
    pub fn start() -> PrivateS3 {
        let mut server = PrivateS3::on(free_port(), None, Vec::new());
        server.resume();
        server
    }

    /// A server not started yet: on `port`, HTTPS with `tls`, with more environment `env`.
    fn on(
        port: u16,
        tls: Option<(tempfile::TempDir, PathBuf)>,
        env: Vec<(String, String)>,
    ) -> PrivateS3 {
        let scheme = if tls.is_some() { "https" } else { "http" };
        PrivateS3 {
            url: format!("{scheme}://127.0.0.1:{port}"),
            port,
            data: tempfile::tempdir().expect("data directory"),
            tls,
            env,
            log: tempfile::NamedTempFile::new().expect("a log file"),
            process: None,
        }
    }

    /// A server whose STS trusts the tokens of the OpenID Connect provider whose discovery
    /// document is at `config_url` for audience `client_id`, giving them MinIO's policy
    /// `readwrite` (a role policy); with the role's ARN, as the server printed it.
    pub fn start_federated(config_url: &str, client_id: &str) -> (PrivateS3, String) {
        let mut server = PrivateS3::on(
            free_port(),
            None,
            vec![
                ("MINIO_IDENTITY_OPENID_CONFIG_URL".into(), config_url.into()),
                ("MINIO_IDENTITY_OPENID_CLIENT_ID".into(), client_id.into()),
                (
                    "MINIO_IDENTITY_OPENID_ROLE_POLICY".into(),
                    "readwrite".into(),
                ),
            ],
        );
        server.resume();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let log = std::fs::read_to_string(server.log.path()).unwrap_or_default();
            if let Some(role) = log
                .lines()
                .find_map(|line| line.split("IAM Roles: ").nth(1))
                .and_then(|roles| roles.split_whitespace().next())
            {
                return (server, role.to_string());
            }
            assert!(
                Instant::now() < deadline,
                "MinIO printed no role ARN for its OpenID provider: {log}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A server on HTTPS with `pki`'s serving certificate (valid for 127.0.0.1); clients of
    /// this module trust its CA.
    pub fn start_tls(pki: &crate::pki::Pki) -> PrivateS3 {
        let port = free_port();
        let certs = tempfile::tempdir().expect("certs directory");
        std::fs::copy(pki.cert(), certs.path().join("public.crt")).expect("certificate");
        std::fs::copy(pki.key(), certs.path().join("private.key")).expect("key");
        let mut server = PrivateS3::on(port, Some((certs, pki.ca())), Vec::new());
        trusted().lock().expect("CAs").insert(
            server.url.clone(),
            std::fs::read(pki.ca()).expect("CA certificate"),
        );
        server.resume();
        server
    }

    fn ready(&self) -> bool {
        match &self.tls {
            None => crate::agent::http_get(self.port, "/minio/health/ready")
                .is_some_and(|(code, _)| code == 200),
            Some((_, ca)) => Command::new("curl")
                .args(["-sf", "-o", "/dev/null", "--cacert"])
                .arg(ca)
                .arg(format!("{}/minio/health/ready", self.url))
                .status()
                .is_ok_and(|status| status.success()),
        }
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
            .args(self.tls.iter().flat_map(|(certs, _)| {
                [
                    std::ffi::OsStr::new("--certs-dir"),
                    certs.path().as_os_str(),
                ]
            }))
            .env("MINIO_ROOT_USER", ACCESS_KEY)
            .env("MINIO_ROOT_PASSWORD", SECRET_KEY)
            .env("MINIO_BROWSER", "off")
            .env("MINIO_UPDATE", "off")
            .envs(self.env.iter().map(|(name, value)| (name, value)))
            .stdout(self.log.reopen().expect("the log file"))
            .stderr(self.log.reopen().expect("the log file"))
            .spawn()
            .expect("starting MinIO");
        self.process = Some(ChildGuard(Some(child)));
        let deadline = Instant::now() + Duration::from_secs(30);
        let health = format!("127.0.0.1:{}", self.port);
        loop {
            if self.ready() {
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

/// What a [`FaultyLink`] does to the requests it relays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Relays every byte both ways.
    None,
    /// Answers every request `503 Service Unavailable` with an S3 error body, as an overloaded
    /// server does.
    Unavailable,
    /// Accepts the connection and never answers, as a hung server does.
    Stall,
    /// Relays uploads at most this many bytes per second (per connection), as a slow link
    /// does; answers at full speed.
    Throttle(u64),
    /// Relays answers (downloads) at most this many bytes per second (per connection);
    /// uploads at full speed.
    ThrottleDownloads(u64),
    /// Stalls a connection whose first request writes (`PUT`, `POST`: an upload), relays the
    /// others (a bucket check, a listing) as [`Fault::None`] does.
    StallWrites,
    /// Relays at most this many bytes of each answer, then cuts the connection, as a reset
    /// in the middle of a download does.
    CutEvery(u64),
}

/// A TCP relay in front of a real S3 server that injects server errors and stalls. Each
/// connection is treated by the fault in force when it was accepted.
pub struct FaultyLink {
    pub url: String,
    fault: std::sync::Arc<std::sync::Mutex<Fault>>,
}

impl FaultyLink {
    /// Relays to `upstream` (`http://host:port`).
    pub fn start(upstream: &str) -> FaultyLink {
        FaultyLink::start_on("127.0.0.1", upstream)
    }

    /// Relays to `upstream`, listening on `address` (such as the host address pods reach).
    pub fn start_on(address: &str, upstream: &str) -> FaultyLink {
        let upstream = upstream
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_string();
        let listener =
            std::net::TcpListener::bind(format!("{address}:0")).expect("binding the relay");
        let port = listener.local_addr().expect("relay address").port();
        let fault = std::sync::Arc::new(std::sync::Mutex::new(Fault::None));
        let shared = fault.clone();
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let now = *shared.lock().expect("fault");
                let upstream = upstream.clone();
                let shared = shared.clone();
                std::thread::spawn(move || relay(client, &upstream, now, &shared));
            }
        });
        FaultyLink {
            url: format!("http://{address}:{port}"),
            fault,
        }
    }

    pub fn set(&self, fault: Fault) {
        *self.fault.lock().expect("fault") = fault;
    }
}

/// Relays both ways between `client` and `upstream`; with `cut`, only that many bytes of the
/// answer, then both connections are closed.
fn pipe(client: std::net::TcpStream, upstream: &str, cut: Option<u64>) {
    pipe_limited(client, upstream, cut, None)
}

/// [`pipe`], the upload limited to `rate` bytes per second.
fn pipe_limited(
    mut client: std::net::TcpStream,
    upstream: &str,
    cut: Option<u64>,
    rate: Option<u64>,
) {
    use std::io::Read;
    let Ok(mut server) = std::net::TcpStream::connect(upstream) else {
        return;
    };
    let (Ok(mut client_reader), Ok(mut server_writer)) = (client.try_clone(), server.try_clone())
    else {
        return;
    };
    let upload = std::thread::spawn(move || {
        match rate {
            None => {
                let _ = std::io::copy(&mut client_reader, &mut server_writer);
            }
            Some(rate) => {
                use std::io::Write;
                let started = Instant::now();
                let (mut sent, mut chunk) = (0u64, vec![0u8; 16 << 10]);
                while let Ok(read) = client_reader.read(&mut chunk) {
                    if read == 0 || server_writer.write_all(&chunk[..read]).is_err() {
                        break;
                    }
                    sent += read as u64;
                    let due = Duration::from_secs_f64(sent as f64 / rate.max(1) as f64);
                    if let Some(wait) = due.checked_sub(started.elapsed()) {
                        std::thread::sleep(wait);
                    }
                }
            }
        }
        let _ = server_writer.shutdown(std::net::Shutdown::Write);
    });
    let _ = std::io::copy(
        &mut (&mut server).take(cut.unwrap_or(u64::MAX)),
        &mut client,
    );
    if cut.is_some() {
        let _ = client.shutdown(std::net::Shutdown::Both);
        let _ = server.shutdown(std::net::Shutdown::Both);
    } else {
        let _ = client.shutdown(std::net::Shutdown::Write);
    }
    let _ = upload.join();
}

/// Relays requests as they come and answers at most `rate` bytes per second.
fn pipe_paced_answers(mut client: std::net::TcpStream, upstream: &str, rate: u64) {
    use std::io::{Read, Write};
    let Ok(mut server) = std::net::TcpStream::connect(upstream) else {
        return;
    };
    let (Ok(mut client_reader), Ok(mut server_writer)) = (client.try_clone(), server.try_clone())
    else {
        return;
    };
    let requests = std::thread::spawn(move || {
        let _ = std::io::copy(&mut client_reader, &mut server_writer);
        let _ = server_writer.shutdown(std::net::Shutdown::Write);
    });
    let started = Instant::now();
    let (mut sent, mut chunk) = (0u64, vec![0u8; 16 << 10]);
    while let Ok(read) = server.read(&mut chunk) {
        if read == 0 || client.write_all(&chunk[..read]).is_err() {
            break;
        }
        sent += read as u64;
        let due = Duration::from_secs_f64(sent as f64 / rate.max(1) as f64);
        if let Some(wait) = due.checked_sub(started.elapsed()) {
            std::thread::sleep(wait);
        }
    }
    let _ = client.shutdown(std::net::Shutdown::Both);
    let _ = server.shutdown(std::net::Shutdown::Both);
    let _ = requests.join();
}

/// Holds the connection, answering nothing, while `fault` is in force (at most 5 minutes).
fn stall(fault: Fault, current: &std::sync::Mutex<Fault>) {
    let deadline = Instant::now() + Duration::from_secs(300);
    while *current.lock().expect("fault") == fault && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn relay(
    mut client: std::net::TcpStream,
    upstream: &str,
    fault: Fault,
    current: &std::sync::Mutex<Fault>,
) {
    use std::io::{Read, Write};
    match fault {
        Fault::None => pipe(client, upstream, None),
        Fault::CutEvery(limit) => pipe(client, upstream, Some(limit)),
        Fault::Throttle(rate) => pipe_limited(client, upstream, None, Some(rate)),
        Fault::ThrottleDownloads(rate) => pipe_paced_answers(client, upstream, rate),
        Fault::Unavailable => {
            // Read the request head, then answer as an overloaded S3 server.
            let mut head = Vec::new();
            let mut byte = [0u8; 1024];
            while !head.windows(4).any(|window| window == b"\r\n\r\n") {
                match client.read(&mut byte) {
                    Ok(0) | Err(_) => return,
                    Ok(read) => head.extend_from_slice(&byte[..read]),
                }
            }
            let body = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>ServiceUnavailable</Code><Message>injected by the test relay</Message></Error>";
            let _ = write!(
                client,
                "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/xml\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
        Fault::Stall => stall(fault, current),
        Fault::StallWrites => {
            // Peeked, not read: a connection that is relayed gets every byte.
            let mut first = [0u8; 8];
            let writes = matches!(client.peek(&mut first), Ok(read) if first[..read].starts_with(b"PUT") || first[..read].starts_with(b"POST"));
            if writes {
                stall(fault, current);
            } else {
                pipe(client, upstream, None);
            }
        }
    }
}
