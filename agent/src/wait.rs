//! `custody-wait`: the init container that keeps a pod from starting until the agent on its
//! node has verified every restored volume of the pod.

use std::time::Duration;

use custody_proto::gate::gate_client::GateClient;
use custody_proto::gate::{VolumeState, WaitProgress, WaitRequest};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

use crate::cli::WaitOptions;

/// Waits until the pod is released. Returns only then: on refusals, unreachable agents and
/// failed verifications it keeps trying, printing why, because a pod must never start on
/// unverified data.
pub async fn run(options: &WaitOptions) -> WaitProgress {
    let mut last_line = String::new();
    loop {
        match attempt(options, &mut last_line).await {
            Ok(Some(released)) => return released,
            Ok(None) => say(
                &mut last_line,
                "the agent ended the stream; asking again".into(),
            ),
            Err(error) => say(&mut last_line, error),
        }
        tokio::time::sleep(options.retry).await;
    }
}

/// Prints `line` unless it repeats the previous one.
fn say(last_line: &mut String, line: String) {
    if *last_line != line {
        println!("custody-wait: {line}");
        *last_line = line;
    }
}

fn channel(options: &WaitOptions) -> Result<Channel, String> {
    gate_channel(&options.agent, &options.ca_file, &options.server_name)
}

/// A TLS channel to the agent's gate at `agent` (`host:port`), whose certificate `ca_file`
/// signed for `server_name`; connected on first use.
pub fn gate_channel(
    agent: &str,
    ca_file: &std::path::Path,
    server_name: &str,
) -> Result<Channel, String> {
    let ca = std::fs::read(ca_file)
        .map_err(|error| format!("reading CA {}: {error}", ca_file.display()))?;
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca))
        .domain_name(server_name.to_string());
    Endpoint::from_shared(format!("https://{agent}"))
        .and_then(|endpoint| endpoint.tls_config(tls))
        .map(|endpoint| {
            endpoint
                .connect_timeout(Duration::from_secs(5))
                .http2_keep_alive_interval(Duration::from_secs(5))
                .keep_alive_timeout(Duration::from_secs(10))
                .connect_lazy()
        })
        .map_err(|error| format!("agent address {agent:?}: {error}"))
}

async fn attempt(
    options: &WaitOptions,
    last_line: &mut String,
) -> Result<Option<WaitProgress>, String> {
    let token = std::fs::read_to_string(&options.token_file)
        .map_err(|error| format!("reading token {}: {error}", options.token_file.display()))?;
    let mut client = GateClient::new(channel(options)?);
    let mut request = tonic::Request::new(WaitRequest {});
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {}", token.trim())
            .parse()
            .map_err(|_| "the token is not a valid header value".to_string())?,
    );
    let mut stream = client
        .wait(request)
        .await
        .map_err(|status| format!("agent at {}: {}", options.agent, status.message()))?
        .into_inner();
    while let Some(progress) = stream
        .message()
        .await
        .map_err(|status| format!("agent at {}: {}", options.agent, status.message()))?
    {
        if progress.released {
            return Ok(Some(progress));
        }
        say(last_line, describe(&progress));
    }
    Ok(None)
}

/// One line about the pod's volumes.
pub fn describe(progress: &WaitProgress) -> String {
    let volumes = progress
        .volumes
        .iter()
        .map(|volume| {
            let state = VolumeState::try_from(volume.state)
                .map(|state| {
                    state
                        .as_str_name()
                        .trim_start_matches("VOLUME_STATE_")
                        .to_lowercase()
                })
                .unwrap_or_else(|_| format!("state {}", volume.state));
            let mut text = format!("{} ({}) {state}", volume.volume, volume.claim_name);
            if !volume.reason.is_empty() {
                text.push_str(&format!(" [{}]", volume.reason));
            }
            if !volume.message.is_empty() {
                text.push_str(&format!(": {}", volume.message));
            }
            text
        })
        .collect::<Vec<_>>()
        .join("; ");
    format!("{}: {volumes}", progress.pod)
}
