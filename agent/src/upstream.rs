//! How the agent reaches the controller's report service: a channel that checks the service's
//! certificate with the CA bundle as it is now, and the agent's report token on each call.

use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

use crate::state::Agent;

/// Puts the agent's report token (read anew: the kubelet rotates it) into `request`.
pub(crate) fn authorize<T>(agent: &Agent, request: &mut tonic::Request<T>) {
    match std::fs::read_to_string(&agent.options.report_token_file) {
        Ok(token) => match format!("Bearer {}", token.trim()).parse() {
            Ok(value) => {
                request.metadata_mut().insert("authorization", value);
            }
            Err(error) => tracing::warn!(%error, "the report token is not a valid header"),
        },
        Err(error) => tracing::warn!(
            path = %agent.options.report_token_file.display(),
            %error,
            "cannot read the report token"
        ),
    }
}

/// A channel to the report service at `url`, checking its certificate with the CA bundle as
/// the file holds it now.
pub(crate) fn channel(agent: &Agent, url: &str) -> Result<Channel, Box<dyn std::error::Error>> {
    let mut endpoint = Endpoint::from_shared(url.to_string())?
        .connect_timeout(std::time::Duration::from_secs(5))
        .timeout(std::time::Duration::from_secs(15));
    if url.starts_with("https://") {
        let mut tls = ClientTlsConfig::new();
        let watched =
            agent.options.report_ca_config_map.is_some() || agent.options.report_ca.is_some();
        if watched {
            let pem = agent.report_trust.borrow().clone().ok_or_else(|| {
                match (
                    &agent.options.report_ca_config_map,
                    &agent.options.report_ca,
                ) {
                    (Some(config_map), _) => {
                        format!("no CA bundle in ConfigMap {config_map} (key ca.crt) yet")
                    }
                    (None, Some(path)) => format!("cannot read the report CA {}", path.display()),
                    (None, None) => String::new(),
                }
            })?;
            tls = tls.ca_certificate(Certificate::from_pem(pem));
        }
        if let Some(name) = &agent.options.report_server_name {
            tls = tls.domain_name(name.clone());
        }
        endpoint = endpoint.tls_config(tls)?;
    }
    Ok(endpoint.connect_lazy())
}
