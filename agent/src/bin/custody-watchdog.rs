//! custody-watchdog: the container beside the agent that thaws every filesystem the agent
//! froze once the freeze's bound passed, whatever became of the agent (killed, OOM-killed,
//! waiting out the kubelet's crash-loop back-off). It reads only the agent's freeze notes
//! (`--state-dir`) and calls FITHAW; it talks to nothing else.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use custody_agent::freeze::{STALE_CLAIM_MILLIS, Thawer, boot_millis, entries, thaw_due};
use custody_kube::process::{LogFormat, init_tracing};

#[derive(Debug, Parser)]
#[command(name = "custody-watchdog", version)]
struct Options {
    /// The agent's state directory, where it notes each freeze and its bound.
    #[arg(
        long,
        env = "CUSTODY_STATE_DIR",
        default_value = "/var/lib/custody-agent"
    )]
    state_dir: PathBuf,
    /// How often the notes are read, in milliseconds: a freeze ends at most this late.
    #[arg(long, env = "CUSTODY_WATCHDOG_INTERVAL_MILLIS", default_value = "100")]
    interval_millis: u64,
    /// Log line format.
    #[arg(long, env = "CUSTODY_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

fn main() -> anyhow::Result<()> {
    let options = Options::parse();
    init_tracing(options.log_format);
    tracing::info!(state_dir = %options.state_dir.display(), interval_millis = options.interval_millis, "watching the agent's freezes");
    let interval = Duration::from_millis(options.interval_millis.max(10));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let stop = custody_kube::process::wait_for_signal();
        tokio::pin!(stop);
        loop {
            sweep(&options.state_dir);
            tokio::select! {
                _ = &mut stop => break,
                _ = tokio::time::sleep(interval) => {}
            }
        }
    });
    Ok(())
}

/// Thaws every freeze past its bound, and finishes a claim the agent left unfinished.
fn sweep(state_dir: &std::path::Path) {
    if entries(state_dir).is_empty() {
        return;
    }
    // The mover's mount may be gone: the device is then thawed through another mount of it.
    let mounts = std::fs::read_to_string("/proc/self/mountinfo")
        .map(|text| custody_agent::volumes::parse_mountinfo(&text))
        .unwrap_or_default();
    for (device, result) in thaw_due(
        state_dir,
        boot_millis(),
        Thawer::Watchdog,
        STALE_CLAIM_MILLIS,
        &mounts,
    ) {
        match result {
            Ok(true) => tracing::warn!(
                device,
                "thawed a filesystem at its freeze bound: the agent had not"
            ),
            Ok(false) => tracing::info!(device, "a freeze past its bound was not frozen any more"),
            Err(error) => {
                tracing::error!(device, %error, "cannot thaw a filesystem past its freeze bound; trying again")
            }
        }
    }
}
