//! Plays the kubelet for custody's Job pods on one node, for the demo: runs each pod's real
//! command (the workspace binary its container names) with its claims mapped to host
//! directories, and writes the pod's status from the real exit. Nothing else.
//!
//!   fake-kubelet --namespace NS --node NODE --claim CLAIM=DIR [--claim ...]

use std::collections::BTreeMap;
use std::path::PathBuf;

use clap::Parser;

#[derive(Parser)]
struct Options {
    #[arg(long)]
    namespace: String,
    #[arg(long)]
    node: String,
    /// `claim=host directory`, repeatable.
    #[arg(long = "claim")]
    claims: Vec<String>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let options = Options::parse();
    let mut claims = BTreeMap::new();
    for claim in &options.claims {
        let (name, path) = claim
            .split_once('=')
            .ok_or_else(|| anyhow::anyhow!("--claim {claim:?}: expected CLAIM=DIR"))?;
        claims.insert(name.to_string(), PathBuf::from(path));
    }
    let client = kube::Client::try_default().await?;
    let _runner = custody_tests::kubelet::PodRunner::start(
        &client,
        &options.namespace,
        &options.node,
        claims,
    );
    eprintln!("fake-kubelet: running custody pods on {}", options.node);
    custody_controller::run::wait_for_signal().await;
    Ok(())
}
