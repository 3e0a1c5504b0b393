//! Certificates for tests, made with the openssl CLI: a CA and server certificates signed by
//! it, and JWTs signed with a given key (to present expired or forged tokens to the real
//! API server).

use std::path::{Path, PathBuf};
use std::process::Command;

fn openssl(args: &[&str], dir: &Path) {
    crate::run(Command::new("openssl").args(args).current_dir(dir));
}

/// A CA with one server certificate, in a temporary directory.
pub struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    /// A CA and a server certificate for `dns_names` and 127.0.0.1.
    pub fn new(dns_names: &[&str]) -> Pki {
        let dir = tempfile::tempdir().expect("temporary directory");
        let path = dir.path();
        openssl(
            &[
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-nodes",
                "-keyout",
                "ca.key",
                "-out",
                "ca.crt",
                "-days",
                "2",
                "-subj",
                "/CN=custody-test-ca",
            ],
            path,
        );
        let san = dns_names
            .iter()
            .map(|name| format!("DNS:{name}"))
            .chain(["IP:127.0.0.1".to_string()])
            .collect::<Vec<_>>()
            .join(",");
        std::fs::write(
            path.join("server.ext"),
            format!("subjectAltName={san}\nextendedKeyUsage=serverAuth\n"),
        )
        .expect("extension file");
        openssl(
            &[
                "req",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-nodes",
                "-keyout",
                "server.key",
                "-out",
                "server.csr",
                "-subj",
                "/CN=custody-test-server",
            ],
            path,
        );
        openssl(
            &[
                "x509",
                "-req",
                "-in",
                "server.csr",
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                "server.crt",
                "-days",
                "2",
                "-extfile",
                "server.ext",
            ],
            path,
        );
        Pki { dir }
    }

    pub fn ca(&self) -> PathBuf {
        self.dir.path().join("ca.crt")
    }

    pub fn cert(&self) -> PathBuf {
        self.dir.path().join("server.crt")
    }

    pub fn key(&self) -> PathBuf {
        self.dir.path().join("server.key")
    }
}

fn base64url(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let value = chunk.iter().enumerate().fold(0u32, |value, (index, byte)| {
            value | (u32::from(*byte) << (16 - 8 * index))
        });
        for index in 0..=chunk.len() {
            out.push(ALPHABET[((value >> (18 - 6 * index)) & 63) as usize] as char);
        }
    }
    out
}

/// An RS256 JWT with `claims`, signed with the PEM RSA key at `key`.
pub fn sign_jwt(claims: &serde_json::Value, key: &Path) -> String {
    let header = base64url(br#"{"alg":"RS256","typ":"JWT"}"#);
    let payload = base64url(claims.to_string().as_bytes());
    let signing_input = format!("{header}.{payload}");
    let dir = tempfile::tempdir().expect("temporary directory");
    std::fs::write(dir.path().join("input"), &signing_input).expect("signing input");
    openssl(
        &[
            "dgst",
            "-sha256",
            "-sign",
            key.to_str().expect("utf-8"),
            "-out",
            "signature",
            "input",
        ],
        dir.path(),
    );
    let signature = std::fs::read(dir.path().join("signature")).expect("signature");
    format!("{signing_input}.{}", base64url(&signature))
}

/// A fresh RSA key, unknown to the API server.
pub fn stranger_key(dir: &Path) -> PathBuf {
    openssl(
        &[
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
            "-out",
            "stranger.key",
        ],
        dir,
    );
    dir.join("stranger.key")
}

#[cfg(test)]
mod tests {
    #[test]
    fn base64url_matches_the_rfc_vectors() {
        for (input, output) in [
            ("", ""),
            ("f", "Zg"),
            ("fo", "Zm8"),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg"),
            ("fooba", "Zm9vYmE"),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(super::base64url(input.as_bytes()), output);
        }
        assert_eq!(super::base64url(&[0xfb, 0xff]), "-_8");
    }
}
