//! Plays the kubelet for the demo, on one or more fake nodes: registers each Node (Ready, with
//! its address), runs the pods custody's Jobs create (the real `custody-mover` with each claim
//! mapped to its PersistentVolume's directory), mounts workload pods' local PersistentVolumes
//! under the node's kubelet root, runs their `custody-wait` init container for real, and
//! reports pod status as the kubelet would. Nothing else.
//!
//!   fake-kubelet --namespace NS --node NAME=IP=KUBELET_ROOT [--node ...]
//!                [--claim CLAIM=DIR ...] [--tamper CLAIM=FILE ...]
//!
//! `--tamper` changes one byte of FILE (relative to the volume) after a Job pod wrote the
//! claim and before its success is reported: a volume damaged between restore and
//! verification, for the demo to show what the agent does with it.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use clap::Parser;
use custody_tests::kubelet::{FakeKubelet, PodRunner};
use custody_tests::workloads::WorkloadRunner;

#[derive(Parser)]
struct Options {
    #[arg(long)]
    namespace: String,
    /// `name=address=kubelet root`, repeatable.
    #[arg(long = "node")]
    nodes: Vec<String>,
    /// `claim=host directory` for claims not bound to a local PersistentVolume, repeatable.
    #[arg(long = "claim")]
    claims: Vec<String>,
    /// `claim=file`: damage that file after a Job pod wrote the claim, repeatable.
    #[arg(long = "tamper")]
    tamper: Vec<String>,
}

fn pair(value: &str, flag: &str) -> anyhow::Result<(String, String)> {
    value
        .split_once('=')
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .ok_or_else(|| anyhow::anyhow!("--{flag} {value:?}: expected A=B"))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let options = Options::parse();
    let mut claims = BTreeMap::new();
    for claim in &options.claims {
        let (name, path) = pair(claim, "claim")?;
        claims.insert(name, PathBuf::from(path));
    }
    let mut tamper = BTreeMap::new();
    for entry in &options.tamper {
        let (claim, file) = pair(entry, "tamper")?;
        tamper.insert(claim, PathBuf::from(file));
    }
    let tamper = Arc::new(tamper);
    let client = kube::Client::try_default().await?;
    let mut running = Vec::new();
    for node in &options.nodes {
        let (name, rest) = pair(node, "node")?;
        let (ip, root) = pair(&rest, "node")?;
        std::fs::create_dir_all(&root)?;
        let kubelet =
            Arc::new(FakeKubelet::at(&client, &name, &ip, std::path::Path::new(&root)).await);
        let jobs = PodRunner::start(&client, &options.namespace, &name, claims.clone());
        let damage = tamper.clone();
        jobs.set_tamper(move |claim, volume| {
            if let Some(file) = damage.get(claim) {
                let path = volume.join(file);
                if let Ok(mut bytes) = std::fs::read(&path)
                    && !bytes.is_empty()
                {
                    bytes[0] ^= 0x20;
                    let _ = std::fs::write(&path, bytes);
                    eprintln!(
                        "fake-kubelet: changed one byte of {} after the restore",
                        path.display()
                    );
                }
            }
        });
        let workloads = WorkloadRunner::start(&client, &options.namespace, kubelet.clone());
        eprintln!("fake-kubelet: node {name} ({ip}) ready, kubelet root {root}");
        running.push((kubelet, jobs, workloads));
    }
    custody_kube::process::wait_for_signal().await;
    for (kubelet, jobs, workloads) in running {
        drop(workloads);
        drop(jobs);
        kubelet.delete().await;
    }
    Ok(())
}
