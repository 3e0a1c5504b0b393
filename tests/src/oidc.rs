//! The cluster's ServiceAccount issuer, published for an STS to trust: its OpenID Connect
//! discovery document and signing keys, read from the API server and served over plain HTTP
//! on loopback, as a self-hosted cluster publishes them for IRSA (the API server serves them
//! only to authenticated clients here, and an STS cannot authenticate to it). The keys are the
//! API server's own: the tokens the STS checks are real ServiceAccount tokens.

use std::io::{Read, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// The issuer's documents, served until dropped.
pub struct PublishedIssuer {
    /// The discovery document's URL (`MINIO_IDENTITY_OPENID_CONFIG_URL`).
    pub config_url: String,
    address: std::net::SocketAddr,
    stop: Arc<AtomicBool>,
}

impl PublishedIssuer {
    /// Reads the documents with `client` and serves them, the discovery document's `jwks_uri`
    /// pointing at the keys served here.
    pub async fn start(client: &kube::Client) -> PublishedIssuer {
        let get = |path: &'static str| {
            let client = client.clone();
            async move {
                client
                    .request_text(
                        http::Request::get(path)
                            .body(Vec::new())
                            .expect("a request"),
                    )
                    .await
                    .unwrap_or_else(|error| panic!("reading {path} from the API server: {error}"))
            }
        };
        let mut discovery: serde_json::Value =
            serde_json::from_str(&get("/.well-known/openid-configuration").await)
                .expect("the discovery document");
        let keys = get("/openid/v1/jwks").await;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
        let address = listener.local_addr().expect("its address");
        discovery["jwks_uri"] = serde_json::json!(format!("http://{address}/openid/v1/jwks"));
        let discovery = discovery.to_string();
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        std::thread::spawn(move || {
            for connection in listener.incoming() {
                if stopped.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(mut connection) = connection else {
                    continue;
                };
                let _ = connection.set_read_timeout(Some(std::time::Duration::from_secs(5)));
                let mut request = Vec::new();
                let mut buffer = [0u8; 4096];
                while !request.windows(4).any(|window| window == b"\r\n\r\n")
                    && request.len() < 64 * 1024
                {
                    match connection.read(&mut buffer) {
                        Ok(0) | Err(_) => break,
                        Ok(read) => request.extend_from_slice(&buffer[..read]),
                    }
                }
                let line = String::from_utf8_lossy(&request);
                let path = line.split_whitespace().nth(1).unwrap_or_default();
                let (status, body) = match path {
                    "/.well-known/openid-configuration" => ("200 OK", discovery.as_str()),
                    "/openid/v1/jwks" => ("200 OK", keys.as_str()),
                    _ => ("404 Not Found", "{}"),
                };
                let _ = write!(
                    connection,
                    "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        PublishedIssuer {
            config_url: format!("http://{address}/.well-known/openid-configuration"),
            address,
            stop,
        }
    }
}

impl Drop for PublishedIssuer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wakes the accepting thread, which then sees the flag.
        let _ = std::net::TcpStream::connect(self.address);
    }
}
