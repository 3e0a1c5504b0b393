//! Restore-to-ready of a ~1 GiB volume through the whole system (real API server, controller,
//! webhook, scheduler, agent, custody-wait, custody-mover, MinIO, ext4 volumes), split into
//! download + extract (the prepareData pod's run), verification (the agent's own measure) and
//! everything else (scheduling, reports, Job creation, the gate's release, readiness). The
//! baseline, measured in the same run on the same machine: a plain `cp -a` of the same tree
//! between two ext4 volumes followed by `sync` — a copy with no network, no decompression and
//! no checks.
//!
//!   hack/bench-restore.sh        (cargo bench -p custody-tests --bench restore)

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use custody_kube::api::{Cluster, ClusterPhase};
use custody_tests::scenario::{restore_into, setup_with};
use custody_tests::volumes::LoopVolume;
use custody_tests::workloads::WorkloadRunner;
use custody_tests::{await_condition, control_plane};

const LARGE_FILES: usize = 56;
const LARGE_SIZE: usize = 16 << 20;
const SMALL_FILES: usize = 20_000;

/// ~1 GiB: 56 files of 16 MiB of incompressible data, 20,000 files of 1-8 KiB of text.
fn populate(root: &Path) {
    std::fs::create_dir_all(root.join("base")).expect("dir");
    std::fs::create_dir_all(root.join("pg_wal")).expect("dir");
    let mut buffer = vec![0u8; LARGE_SIZE];
    for index in 0..LARGE_FILES {
        let mut hasher = blake3::Hasher::new();
        hasher.update(&(index as u64).to_le_bytes());
        hasher.finalize_xof().fill(&mut buffer);
        std::fs::write(root.join(format!("pg_wal/{index:024}")), &buffer).expect("large file");
    }
    for index in 0..SMALL_FILES {
        let dir = root.join(format!("base/{}", index / 1000));
        if index % 1000 == 0 {
            std::fs::create_dir_all(&dir).expect("dir");
        }
        let line = format!("row {index} of the orders table, shipped\n");
        std::fs::write(
            dir.join(format!("{index}")),
            line.repeat(1 + (index % 8) * 1024 / line.len()),
        )
        .expect("small file");
    }
}

fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for next in chars.by_ref() {
                if next == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn seconds(value: Duration) -> String {
    format!("{:.2} s", value.as_secs_f64())
}

fn main() {
    control_plane();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let started = Instant::now();
        let setup = setup_with("bench", 1600, populate).await;
        let bytes: u64 = (LARGE_FILES * LARGE_SIZE) as u64
            + std::fs::read_dir(setup.source.path().join("base"))
                .expect("base")
                .flatten()
                .flat_map(|dir| std::fs::read_dir(dir.path()).expect("dir").flatten())
                .map(|file| file.metadata().expect("metadata").len())
                .sum::<u64>();
        eprintln!(
            "[bench] source {:.0} MiB written and backed up in {}",
            bytes as f64 / 1048576.0,
            seconds(started.elapsed())
        );

        // Baseline: a plain copy between two ext4 volumes.
        let copy = LoopVolume::new(1600);
        let begun = Instant::now();
        let status = Command::new("cp")
            .arg("-a")
            .arg(format!("{}/.", setup.source.path().display()))
            .arg(copy.path())
            .status()
            .expect("cp");
        assert!(status.success());
        assert!(Command::new("sync").status().expect("sync").success());
        let baseline = begun.elapsed();
        drop(copy);

        // custody: restore to ready.
        let client = setup.namespace.client.clone();
        let ns = setup.namespace.name.clone();
        let target = LoopVolume::new(1600);
        let workloads = WorkloadRunner::start(&client, &ns, setup.kubelet.clone());
        let begun = Instant::now();
        restore_into(&setup, target.path(), serde_json::json!({})).await;
        let clusters = setup.namespace.api::<Cluster>();
        await_condition(
            &clusters,
            "shop",
            "Running",
            Duration::from_secs(600),
            |cluster: &Cluster| {
                cluster.status.as_ref().and_then(|status| status.phase)
                    == Some(ClusterPhase::Running)
            },
        )
        .await;
        let total = begun.elapsed();

        let mover = setup
            .jobs
            .started()
            .into_iter()
            .find(|started| started.pod.starts_with("data-shop-0-restore-"))
            .expect("the prepareData pod ran");
        let mover_ended = mover.ended.lock().expect("not poisoned").expect("it ended");
        let mover_time = mover_ended - mover.at;
        let verify: f64 = setup
            .agent
            .logs
            .all()
            .iter()
            .map(|line| strip_ansi(line))
            .filter(|line| line.contains("volume verified") && line.contains("data-shop-0"))
            .find_map(|line| {
                let at = line.find("seconds=")?;
                line[at + 8..].split_whitespace().next()?.parse().ok()
            })
            .expect("the agent's verification time");
        let released = workloads
            .runs()
            .into_iter()
            .find(|run| run.container == "custody-wait" && run.exit_code == 0)
            .expect("custody-wait released");
        let after_mover = released.ended - mover_ended;
        let rest = total.as_secs_f64() - mover_time.as_secs_f64() - verify;
        let mib = bytes as f64 / 1048576.0;
        println!(
            "restore-to-ready of {mib:.0} MiB ({SMALL_FILES} small files, {LARGE_FILES} x 16 MiB):"
        );
        println!(
            "  total, Cluster created -> Running:        {}  ({:.0} MiB/s)",
            seconds(total),
            mib / total.as_secs_f64()
        );
        println!(
            "  download + extract (prepareData pod):     {}  ({:.0} MiB/s)",
            seconds(mover_time),
            mib / mover_time.as_secs_f64()
        );
        println!(
            "  verification on the node (agent):         {verify:.2} s  ({:.0} MiB/s)",
            mib / verify
        );
        println!(
            "  mover exit -> custody-wait released:      {}  (includes the verification)",
            seconds(after_mover)
        );
        println!("  everything else (scheduling, reports, Job, gate, readiness): {rest:.2} s");
        println!(
            "baseline, same run: cp -a + sync between two ext4 volumes: {}  ({:.0} MiB/s)",
            seconds(baseline),
            mib / baseline.as_secs_f64()
        );
        println!(
            "ratio restore-to-ready / plain copy: {:.2}x",
            total.as_secs_f64() / baseline.as_secs_f64()
        );
        drop(workloads);
        setup.finish().await;
    });
}
