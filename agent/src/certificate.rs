//! The gate's certificate from custody's CA: the agent makes a key, the controller signs it
//! for this node's name (`<node>.gate.custody.io`) over the report service, and the agent
//! renews it (a new key each time) when a third of its life is left or the controller says
//! certificates issued before a moment are to be replaced (its CA rotated). Key and
//! certificate are kept in the state directory, so a restarted agent serves at once.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use custody_proto::report::GateCertificateRequest;
use custody_proto::report::agent_report_client::AgentReportClient;

use crate::state::Agent;
pub use crate::state::Told;
use crate::upstream;

const KEY_FILE: &str = "gate.key";
const CERT_FILE: &str = "gate.crt";
/// `<issued at> <not after> <issuing CA>`, Unix seconds.
const META_FILE: &str = "gate.meta";

/// Notes what the controller said in an answer.
pub fn told(agent: &Agent, reissue_after: i64, signing_ca: &str) {
    if let Ok(mut told) = agent.renewal.lock() {
        *told = Told {
            reissue_after,
            signing_ca: signing_ca.to_string(),
        };
    }
}

/// The certificate held: when issued, until when valid, by which CA.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    pub issued_at: i64,
    pub not_after: i64,
    pub issuer: String,
}

/// Whether the certificate `held` is to be replaced at `now` (pure): none held, a third of
/// its life or less left, issued before the controller's reissue time, or by another CA than
/// the one signing now.
pub fn renew(held: Option<&Held>, told: &Told, now: i64) -> bool {
    let Some(held) = held else {
        return true;
    };
    held.issued_at < told.reissue_after
        || (!told.signing_ca.is_empty() && held.issuer != told.signing_ca)
        || held.not_after - now <= (held.not_after - held.issued_at) / 3
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| elapsed.as_secs() as i64)
        .unwrap_or(0)
}

/// The stored certificate, when key, certificate and what it is are all there and the agent
/// serves them.
fn load(agent: &Agent, dir: &Path) -> Option<Held> {
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).ok();
    let (key, cert, meta) = (read(KEY_FILE)?, read(CERT_FILE)?, read(META_FILE)?);
    let mut fields = meta.split_whitespace();
    let held = Held {
        issued_at: fields.next()?.parse().ok()?,
        not_after: fields.next()?.parse().ok()?,
        issuer: fields.next().unwrap_or_default().to_string(),
    };
    match agent.gate_certificate.set(&cert, &key) {
        Ok(()) => Some(held),
        Err(error) => {
            tracing::warn!(%error, dir = %dir.display(), "the stored gate certificate is not usable; asking for another");
            None
        }
    }
}

/// Writes `contents` to `dir/name` whole (a temporary file renamed over it), readable by the
/// owner only.
fn store(dir: &Path, name: &str, contents: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let partial = dir.join(format!(".{name}.partial"));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&partial)?;
    file.write_all(contents.as_bytes())?;
    file.sync_all()?;
    std::fs::rename(&partial, dir.join(name))
}

/// Asks the controller for a certificate over a new key; serves and stores it.
async fn request(agent: &Agent, url: &str, dir: &Path) -> Result<Held, String> {
    let key = rcgen::KeyPair::generate().map_err(|error| format!("making a key: {error}"))?;
    let channel = upstream::channel(agent, url).map_err(|error| error.to_string())?;
    let mut client = AgentReportClient::new(channel);
    let mut call = tonic::Request::new(GateCertificateRequest {
        node_name: agent.options.node_name.clone(),
        public_key: key.public_key_raw().to_vec(),
    });
    upstream::authorize(agent, &mut call);
    let answer = client
        .issue_gate_certificate(call)
        .await
        .map_err(|status| format!("{:?}: {}", status.code(), status.message()))?
        .into_inner();
    let key_pem = key.serialize_pem();
    agent
        .gate_certificate
        .set(&answer.certificate_pem, &key_pem)
        .map_err(|error| format!("the certificate issued is not usable: {error}"))?;
    told(agent, answer.reissue_after_unix, &answer.signing_ca);
    let held = Held {
        issued_at: answer.issued_at_unix,
        not_after: answer.not_after_unix,
        issuer: answer.signing_ca.clone(),
    };
    let stored = std::fs::create_dir_all(dir)
        .and_then(|()| store(dir, KEY_FILE, &key_pem))
        .and_then(|()| store(dir, CERT_FILE, &answer.certificate_pem))
        .and_then(|()| {
            store(
                dir,
                META_FILE,
                &format!("{} {} {}\n", held.issued_at, held.not_after, held.issuer),
            )
        });
    if let Err(error) = stored {
        // Served all the same; a restarted agent asks again.
        tracing::warn!(%error, dir = %dir.display(), "storing the gate certificate");
    }
    Ok(held)
}

/// Keeps the gate's certificate current until the agent stops.
pub async fn run(agent: Arc<Agent>, url: String) {
    let dir: PathBuf = agent.options.state_dir.join("gate-certificate");
    let mut held = load(&agent, &dir);
    if let Some(held) = &held {
        tracing::info!(
            not_after = held.not_after,
            issuer = held.issuer,
            "serving the stored gate certificate"
        );
    }
    let mut pause = Duration::from_secs(1);
    let mut trust = agent.report_trust.subscribe();
    loop {
        let told = agent
            .renewal
            .lock()
            .map(|told| told.clone())
            .unwrap_or_default();
        if renew(held.as_ref(), &told, now()) {
            match request(&agent, &url, &dir).await {
                Ok(issued) => {
                    tracing::info!(
                        name = format!(
                            "{}.{}",
                            agent.options.node_name,
                            custody_proto::names::GATE_NAME_SUFFIX
                        ),
                        not_after = issued.not_after,
                        issuer = issued.issuer,
                        "gate certificate issued by the controller"
                    );
                    crate::metrics::count(&agent.metrics.gate_certificates, "Issued");
                    held = Some(issued);
                    pause = Duration::from_secs(1);
                }
                Err(error) => {
                    crate::metrics::count(&agent.metrics.gate_certificates, "Failed");
                    tracing::warn!(
                        url,
                        %error,
                        retry_in_seconds = pause.as_secs(),
                        serving = held.is_some(),
                        "asking the controller for a gate certificate"
                    );
                    // Sooner when the CA bundle changes (a new install publishes it late).
                    let _ = tokio::time::timeout(pause, trust.changed()).await;
                    pause = (pause * 2).min(Duration::from_secs(60));
                    continue;
                }
            }
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::{Held, Told, renew};

    #[test]
    fn renewals() {
        let day = 86_400;
        let held = |issued_at: i64, not_after: i64, issuer: &str| Held {
            issued_at,
            not_after,
            issuer: issuer.into(),
        };
        let told = |reissue_after: i64, signing_ca: &str| Told {
            reissue_after,
            signing_ca: signing_ca.into(),
        };
        let rows = [
            ("none held", None, told(0, ""), 0, true),
            (
                "fresh",
                Some(held(0, 7 * day, "a")),
                told(0, "a"),
                day,
                false,
            ),
            (
                "a third left",
                Some(held(0, 6 * day, "a")),
                told(0, "a"),
                4 * day,
                true,
            ),
            (
                "just over a third",
                Some(held(0, 6 * day, "a")),
                told(0, "a"),
                4 * day - 1,
                false,
            ),
            (
                "issued before reissue-after",
                Some(held(10, 7 * day, "a")),
                told(11, "a"),
                20,
                true,
            ),
            (
                "issued at reissue-after",
                Some(held(10, 7 * day, "a")),
                told(10, "a"),
                20,
                false,
            ),
            (
                "expired",
                Some(held(0, day, "a")),
                told(0, "a"),
                2 * day,
                true,
            ),
            (
                "another CA signs now",
                Some(held(10, 7 * day, "a")),
                told(0, "b"),
                20,
                true,
            ),
            (
                "the signing CA not said",
                Some(held(10, 7 * day, "a")),
                told(0, ""),
                20,
                false,
            ),
            (
                "issued by a lagging replica after the rotation",
                Some(held(30, 7 * day, "a")),
                told(20, "b"),
                40,
                true,
            ),
        ];
        for (name, held, told, now, expected) in rows {
            assert_eq!(renew(held.as_ref(), &told, now), expected, "{name}");
        }
    }
}
