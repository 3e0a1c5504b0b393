//! The mover's side of a frozen copy: ask the node agent to freeze the volume's filesystem,
//! hold the call open while the volume is read, then let go (the agent thaws). If the agent
//! ends the call first (its bound passed, it stopped, the connection dropped), the freeze is
//! lost and the copy is no point in time: the backup fails.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use custody_proto::gate::FreezeRequest;
use custody_proto::gate::gate_client::GateClient;
use custody_proto::names;
use tokio::sync::{oneshot, watch};

use super::MoverError;

/// The open freeze calls: dropping a sender ends its call, and the agent thaws.
type Releases = Arc<Mutex<Vec<oneshot::Sender<()>>>>;

/// The filesystems the agent holds frozen for this mover: thawed when released, or when
/// this and every releaser are dropped.
pub struct Held {
    /// Why a freeze ended before it was released, once one did.
    pub lost: watch::Receiver<Option<String>>,
    /// Each freeze's own account (the combined one above is written by a task).
    each: Vec<watch::Receiver<Option<String>>>,
    release: Releases,
    since: Instant,
}

impl Held {
    /// A function that ends every freeze at once, for the thread that reads the volumes.
    pub fn releaser(&mut self) -> impl FnOnce() + Send + 'static {
        let release = self.release.clone();
        move || release_all(&release)
    }

    /// Whether a freeze ended before it was released, and why.
    pub fn lost_reason(&self) -> Option<String> {
        self.each
            .iter()
            .find_map(|lost| lost.borrow().clone())
            .or_else(|| self.lost.borrow().clone())
    }

    /// When the filesystem was frozen.
    pub fn since(&self) -> Instant {
        self.since
    }
}

/// Ends every open freeze call.
fn release_all(release: &Mutex<Vec<oneshot::Sender<()>>>) {
    let senders = std::mem::take(
        &mut *release
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()),
    );
    drop(senders);
}

fn setting(name: &str) -> Result<String, MoverError> {
    std::env::var(name)
        .ok()
        .filter(|value| !value.is_empty())
        .ok_or_else(|| MoverError::FreezeRefused(format!("${name} is not set")))
}

/// Asks the agent on this node to freeze the filesystem of every claim, one after another,
/// each for at most `max_seconds`; returns once all are frozen, so that no volume is read
/// before every one is frozen (one point in time for all of them). A refusal thaws those
/// frozen before it. The first freeze that ends early loses them all.
pub async fn hold_all(claims: &[String], max_seconds: u32) -> Result<Held, MoverError> {
    if claims.is_empty() {
        return Err(MoverError::FreezeRefused("no claim to freeze".into()));
    }
    let mut held: Vec<Held> = Vec::with_capacity(claims.len());
    for claim in claims {
        // On an error, dropping what is held ends those calls: the agent thaws them.
        held.push(hold(claim, max_seconds).await?);
    }
    let since = held.first().map_or_else(Instant::now, |first| first.since);
    let (lost_sender, lost) = watch::channel(None);
    let mut senders = Vec::with_capacity(held.len());
    let mut watched = Vec::with_capacity(held.len());
    for one in held {
        senders.append(&mut std::mem::take(
            &mut *one
                .release
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
        ));
        watched.push(one.lost);
    }
    let release: Releases = Arc::new(Mutex::new(senders));
    let each = watched.clone();
    // A weak hold: the freezes end with the last owner even if none is ever lost.
    let on_loss = Arc::downgrade(&release);
    tokio::spawn(async move {
        let losses = watched.into_iter().map(|mut lost| {
            Box::pin(async move {
                // Released: the sender goes without a reason; that one is never lost.
                let reason = lost
                    .wait_for(Option::is_some)
                    .await
                    .ok()
                    .and_then(|reason| reason.clone());
                match reason {
                    Some(reason) => Some(reason),
                    None => std::future::pending().await,
                }
            })
        });
        if let (Some(reason), _, _) = futures::future::select_all(losses).await {
            // One lost: the others are thawed now, not when the reading notices.
            if let Some(release) = on_loss.upgrade() {
                release_all(&release);
            }
            let _ = lost_sender.send(Some(reason));
        }
    });
    Ok(Held {
        lost,
        each,
        release,
        since,
    })
}

/// Asks the agent on this node to freeze the filesystem of `claim`, for at most
/// `max_seconds`; returns once it is frozen.
async fn hold(claim: &str, max_seconds: u32) -> Result<Held, MoverError> {
    let agent = setting(names::ENV_AGENT_ADDRESS)?;
    let token_file = setting(names::ENV_TOKEN_FILE)?;
    let ca_file = setting(names::ENV_CA_FILE)?;
    let refused =
        |message: String| MoverError::FreezeRefused(format!("agent at {agent}: {message}"));
    let token = std::fs::read_to_string(&token_file)
        .map_err(|error| refused(format!("reading token {token_file}: {error}")))?;
    let server_name = std::env::var(names::ENV_AGENT_SERVER_NAME)
        .ok()
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| names::AGENT_SERVER_NAME.to_string());
    let channel = crate::wait::gate_channel(&agent, std::path::Path::new(&ca_file), &server_name)
        .map_err(refused)?;
    let authorization: tonic::metadata::MetadataValue<tonic::metadata::Ascii> =
        format!("Bearer {}", token.trim())
            .parse()
            .map_err(|_| refused("the token is not a valid header value".into()))?;
    let mut client = GateClient::new(channel);
    // The gate reviews at most a few tokens at once and refuses a call beyond them
    // (`ResourceExhausted`), and a Job the controller has just created may not be recorded on
    // its Backup yet (`Unavailable`): asked again for a while, before nothing is frozen yet.
    let mut busy = 0;
    let mut stream = loop {
        let mut request = tonic::Request::new(FreezeRequest {
            claim_name: claim.to_string(),
            max_seconds,
        });
        request
            .metadata_mut()
            .insert("authorization", authorization.clone());
        match client.freeze(request).await {
            Ok(response) => break response.into_inner(),
            Err(status)
                if matches!(
                    status.code(),
                    tonic::Code::ResourceExhausted | tonic::Code::Unavailable
                ) && busy < 30 =>
            {
                busy += 1;
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            }
            Err(status) => return Err(refused(status.message().to_string())),
        }
    };
    let frozen = stream
        .message()
        .await
        .map_err(|status| refused(status.message().to_string()))?
        .ok_or_else(|| refused("the agent ended the call before freezing".into()))?;
    let since = Instant::now();
    tracing::info!(
        claim,
        device = frozen.device,
        max_seconds = frozen.max_seconds,
        "filesystem frozen"
    );
    let (lost_sender, lost) = watch::channel(None);
    let (release, released) = oneshot::channel::<()>();
    tokio::spawn(async move {
        let ended = tokio::select! {
            _ = released => None,
            message = stream.message() => Some(match message {
                Ok(Some(_)) => "the agent sent an unexpected message".to_string(),
                Ok(None) => "the agent ended the freeze".to_string(),
                Err(status) => status.message().to_string(),
            }),
        };
        // Dropping the stream ends the call: the agent thaws.
        drop(stream);
        if let Some(reason) = ended {
            tracing::warn!(reason, "the freeze ended before the volume was read");
            let _ = lost_sender.send(Some(reason));
        }
    });
    Ok(Held {
        each: vec![lost.clone()],
        lost,
        release: Arc::new(Mutex::new(vec![release])),
        since,
    })
}
