//! Verification throughput on a prepared tree: `cargo bench -p custody-agent --bench verify -- DIR`.
//! Builds the tree's manifest (not timed as verification), writes what a restore leaves in
//! `.custody/`, then verifies the tree `RUNS` times and prints the best time and throughput.
//! `hack/bench-verify.sh` runs it against `b3sum` on the same data in the same run.

use std::path::PathBuf;
use std::time::Instant;

use custody_agent::manifest_builder;
use custody_agent::verify::{Expected, Options, verify_tree};
use custody_proto::manifest::Header;
use custody_proto::volume::{IDENTITY_PATH, MANIFEST_PATH, RestoreIdentity};

const RUNS: usize = 3;

fn main() {
    let root = std::env::args()
        .skip(1)
        .find(|argument| !argument.starts_with('-'))
        .map(PathBuf::from)
        .expect("usage: verify DIR");
    let header = Header::new("bench-backup", "bench-cluster", "2026-11-30T00:00:00Z");
    let started = Instant::now();
    let (manifest, summary) =
        manifest_builder::build(&root, &header, Vec::new()).expect("building the manifest");
    let build_seconds = started.elapsed().as_secs_f64();
    std::fs::create_dir_all(root.join(".custody")).expect(".custody");
    std::fs::write(root.join(MANIFEST_PATH), &manifest).expect("manifest");
    let identity = RestoreIdentity {
        restore_uid: "bench-restore".into(),
        backup_uid: "bench-backup".into(),
    };
    std::fs::write(
        root.join(IDENTITY_PATH),
        serde_json::to_vec(&identity).expect("json"),
    )
    .expect("identity");

    let expected = Expected {
        manifest_hash: summary.hash,
        backup_uid: "bench-backup".into(),
        restore_uid: "bench-restore".into(),
    };
    let mut best = f64::MAX;
    for _ in 0..RUNS {
        let started = Instant::now();
        let verified = verify_tree(&root, &expected, Options::default()).expect("verification");
        best = best.min(started.elapsed().as_secs_f64());
        assert_eq!(verified.files, summary.totals.files);
    }
    let gib = summary.totals.total_bytes as f64 / (1u64 << 30) as f64;
    println!(
        "custody-verify files={} bytes={} build_seconds={build_seconds:.3} best_seconds={best:.3} gib_per_second={:.3} files_per_second={:.0}",
        summary.totals.files,
        summary.totals.total_bytes,
        gib / best,
        summary.totals.files as f64 / best
    );
}
