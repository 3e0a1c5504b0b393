//! The gate's certificate from custody's CA: the agent makes a key, the controller signs it
//! for this node's name (`<node>.gate.custody.io`) over the report service, and the agent
//! renews it (a new key each time) when a third of its life is left or the controller says
//! certificates issued before a moment are to be replaced (its CA rotated). Key and
//! certificate are kept in the state directory, so a restarted agent serves at once.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use custody_proto::report::GateCertificateRequest;
use custody_proto::report::agent_report_client::AgentReportClient;

use crate::state::Agent;

const KEY_FILE: &str = "gate.key";
const CERT_FILE: &str = "gate.crt";
/// `<issued at> <not after>`, Unix seconds.
const META_FILE: &str = "gate.meta";

/// Whether a certificate issued at `issued_at`, valid until `not_after`, is to be replaced
/// at `now` (pure): none held, a third of its life or less left, or issued before
/// `reissue_after`.
pub fn renew(held: Option<(i64, i64)>, reissue_after: i64, now: i64) -> bool {
    let Some((issued_at, not_after)) = held else {
        return true;
    };
    issued_at < reissue_after || not_after - now <= (not_after - issued_at) / 3
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| elapsed.as_secs() as i64)
        .unwrap_or(0)
}

/// The stored certificate's `(issued at, not after)`, when key, certificate and times are
/// all there and the agent serves them.
fn load(agent: &Agent, dir: &Path) -> Option<(i64, i64)> {
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).ok();
    let (key, cert, meta) = (read(KEY_FILE)?, read(CERT_FILE)?, read(META_FILE)?);
    let mut times = meta
        .split_whitespace()
        .map(|value| value.parse::<i64>().ok());
    let (issued_at, not_after) = (times.next()??, times.next()??);
    match agent.gate_certificate.set(&cert, &key) {
        Ok(()) => Some((issued_at, not_after)),
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
async fn request(agent: &Agent, url: &str, dir: &Path) -> Result<(i64, i64), String> {
    let key = rcgen::KeyPair::generate().map_err(|error| format!("making a key: {error}"))?;
    let channel = crate::report::channel(agent, url).map_err(|error| error.to_string())?;
    let mut client = AgentReportClient::new(channel);
    let mut call = tonic::Request::new(GateCertificateRequest {
        node_name: agent.options.node_name.clone(),
        public_key: key.public_key_raw().to_vec(),
    });
    crate::report::authorize(agent, &mut call);
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
    agent
        .reissue_after
        .fetch_max(answer.reissue_after_unix, Ordering::Relaxed);
    let stored = std::fs::create_dir_all(dir)
        .and_then(|()| store(dir, KEY_FILE, &key_pem))
        .and_then(|()| store(dir, CERT_FILE, &answer.certificate_pem))
        .and_then(|()| {
            store(
                dir,
                META_FILE,
                &format!("{} {}\n", answer.issued_at_unix, answer.not_after_unix),
            )
        });
    if let Err(error) = stored {
        // Served all the same; a restarted agent asks again.
        tracing::warn!(%error, dir = %dir.display(), "storing the gate certificate");
    }
    Ok((answer.issued_at_unix, answer.not_after_unix))
}

/// Keeps the gate's certificate current until the agent stops.
pub async fn run(agent: Arc<Agent>, url: String) {
    let dir: PathBuf = agent.options.state_dir.join("gate-certificate");
    let mut held = load(&agent, &dir);
    if let Some((_, not_after)) = held {
        tracing::info!(not_after, "serving the stored gate certificate");
    }
    let mut pause = Duration::from_secs(1);
    loop {
        let reissue_after = agent.reissue_after.load(Ordering::Relaxed);
        if renew(held, reissue_after, now()) {
            match request(&agent, &url, &dir).await {
                Ok(issued) => {
                    tracing::info!(
                        name = format!(
                            "{}.{}",
                            agent.options.node_name,
                            custody_proto::names::GATE_NAME_SUFFIX
                        ),
                        not_after = issued.1,
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
                    tokio::time::sleep(pause).await;
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
    use super::renew;

    #[test]
    fn renewals() {
        let day = 86_400;
        let rows = [
            ("none held", None, 0, 0, true),
            ("fresh", Some((0, 7 * day)), 0, day, false),
            ("a third left", Some((0, 6 * day)), 0, 4 * day, true),
            (
                "just over a third",
                Some((0, 6 * day)),
                0,
                4 * day - 1,
                false,
            ),
            (
                "issued before reissue-after",
                Some((10, 7 * day)),
                11,
                20,
                true,
            ),
            (
                "issued at reissue-after",
                Some((10, 7 * day)),
                10,
                20,
                false,
            ),
            ("expired", Some((0, day)), 0, 2 * day, true),
        ];
        for (name, held, reissue_after, now, expected) in rows {
            assert_eq!(renew(held, reissue_after, now), expected, "{name}");
        }
    }
}
