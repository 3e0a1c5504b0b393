//! custody-watchdog: the container beside the agent that thaws every filesystem the agent
//! froze once the freeze's bound passed, whatever became of the agent (killed, OOM-killed,
//! waiting out the kubelet's crash-loop back-off). It reads only the agent's freeze notes
//! (`--state-dir`) and calls FITHAW; it talks to nothing else.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use custody_agent::freeze::{Thawer, now_unix_millis, thaw_due};
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

fn main() {
    let options = Options::parse();
    init_tracing(options.log_format);
    tracing::info!(state_dir = %options.state_dir.display(), interval_millis = options.interval_millis, "watching the agent's freezes");
    let interval = Duration::from_millis(options.interval_millis.max(10));
    loop {
        let due = thaw_due(&options.state_dir, now_unix_millis(), Thawer::Watchdog, &[]);
        for (device, result) in due {
            match result {
                Ok(true) => tracing::warn!(
                    device,
                    "thawed a filesystem at its freeze bound: the agent had not"
                ),
                Ok(false) => tracing::info!(device, "a freeze past its bound was thawed already"),
                Err(error) => {
                    tracing::error!(device, %error, "cannot thaw a filesystem past its freeze bound")
                }
            }
        }
        std::thread::sleep(interval);
    }
}
