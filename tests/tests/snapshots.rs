//! The real `custody-mover` writing and reading repository format 2 (restic's layout,
//! encrypted and deduplicated) in the real S3 server, on real ext4 volumes; and restic itself
//! reading what custody wrote.

use std::path::Path;
use std::process::{Command, Output, Stdio};

use custody_proto::mover::BackupResult;
use custody_tests::binary;
use custody_tests::repository::{self, PREFIX};
use custody_tests::s3;
use custody_tests::volumes::{self, LoopVolume, fill, incompressible, tree};

const BACKUP_UID: &str = "5a9a0b2e-2222-4000-8000-0000000000b1";
const CLUSTER_UID: &str = "5a9a0b2e-2222-4000-8000-0000000000c1";
const RESTORE_UID: &str = "5a9a0b2e-2222-4000-8000-0000000000e1";

/// The mover on the repository in `bucket`, opened with `key` (the master key's JSON).
fn mover(url: &str, bucket: &str, key: &str, args: &[&str]) -> Command {
    let mut command = Command::new(binary("custody-mover"));
    command
        .args(args)
        .args(["--endpoint", url, "--bucket", bucket, "--path-style"])
        .args(["--repository-prefix", PREFIX])
        .env("AWS_ACCESS_KEY_ID", s3::ACCESS_KEY)
        .env("AWS_SECRET_ACCESS_KEY", s3::SECRET_KEY)
        .env("CUSTODY_REPOSITORY_KEY", key)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

fn run(mut command: Command) -> Output {
    let output = command.output().expect("running custody-mover");
    eprintln!("{}", String::from_utf8_lossy(&output.stderr));
    output
}

/// A failed mover's reason and message, as it reports them (what its termination message
/// carries): its last line.
fn failure(output: &Output) -> serde_json::Value {
    assert!(!output.status.success(), "the mover succeeded");
    let line = String::from_utf8_lossy(&output.stderr)
        .lines()
        .filter_map(|line| line.strip_prefix("custody-mover: ").map(str::to_string))
        .next_back()
        .expect("the mover says why it failed");
    let (reason, message) = line.split_once(": ").expect("reason: message");
    serde_json::json!({"reason": reason, "message": message})
}

fn backup_args<'a>(source: &'a Path, backup_uid: &'a str, parent: Option<&'a str>) -> Vec<&'a str> {
    let mut args = vec![
        "backup",
        "--source",
        source.to_str().unwrap(),
        "--backup-uid",
        backup_uid,
        "--cluster-uid",
        CLUSTER_UID,
        "--volume",
        "data",
        "--claim",
        "data-orders-0",
        "--backup-name",
        "nightly",
        "--namespace",
        "shop",
        "--cluster",
        "orders",
        "--origin-cluster",
        "0c0ffee0-0000-4000-8000-000000000001",
        "--consistency",
        "Stopped",
    ];
    if let Some(parent) = parent {
        args.extend(["--parent", parent]);
    }
    args
}

fn backup(
    url: &str,
    bucket: &str,
    key: &str,
    source: &Path,
    backup_uid: &str,
    parent: Option<&str>,
) -> BackupResult {
    let output = run(mover(
        url,
        bucket,
        key,
        &backup_args(source, backup_uid, parent),
    ));
    assert!(output.status.success(), "backup failed");
    serde_json::from_slice(&output.stdout).expect("backup result")
}

fn snapshot_id(result: &BackupResult) -> String {
    result
        .snapshot
        .as_ref()
        .expect("a snapshot was written")
        .id
        .clone()
}

fn restore(
    url: &str,
    bucket: &str,
    key: &str,
    target: &Path,
    result: &BackupResult,
    backup_uid: &str,
) -> Output {
    let snapshot = snapshot_id(result);
    restore_volume(
        (url, bucket, key),
        target,
        (&snapshot, "data", &result.manifest_hash),
        backup_uid,
    )
}

/// Restores the `data` volume of `result` (backed up as `backup_uid`) into a fresh volume,
/// which must succeed and verify `files` files; the restored volume, for more checks.
fn restore_verified(
    (url, bucket, key): (&str, &str, &str),
    result: &BackupResult,
    backup_uid: &str,
    files: u64,
) -> LoopVolume {
    let target = LoopVolume::new(256);
    let output = restore(url, bucket, key, target.path(), result, backup_uid);
    assert!(output.status.success(), "restore failed");
    assert_eq!(
        volumes::verified(
            target.path(),
            &result.manifest_hash,
            backup_uid,
            RESTORE_UID
        ),
        files
    );
    target
}

/// The files under `root` but custody's own (`.custody`).
fn tree_without_custody(root: &Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    let mut files = tree(root);
    files.retain(|path, _| !path.starts_with(".custody"));
    files
}

/// Restores volume `volume` of snapshot `snapshot`, checked against `manifest_hash`.
fn restore_volume(
    repository: (&str, &str, &str),
    target: &Path,
    volume: (&str, &str, &str),
    backup_uid: &str,
) -> Output {
    run(restore_command(repository, target, volume, backup_uid))
}

/// The mover's command that [`restore_volume`] runs, for a caller that adds to its
/// environment.
fn restore_command(
    (url, bucket, key): (&str, &str, &str),
    target: &Path,
    (snapshot, volume, manifest_hash): (&str, &str, &str),
    backup_uid: &str,
) -> Command {
    mover(
        url,
        bucket,
        key,
        &[
            "restore",
            "--target",
            target.to_str().unwrap(),
            "--snapshot",
            snapshot,
            "--volume",
            volume,
            "--manifest-hash",
            manifest_hash,
            "--backup-uid",
            backup_uid,
            "--restore-uid",
            RESTORE_UID,
        ],
    )
}

#[tokio::test]
async fn a_snapshot_restores_verified_and_restic_reads_what_custody_wrote() {
    let url = s3::shared();
    let bucket = s3::bucket(url, "snapshot").await;
    let (repository_id, key) = repository::create(url, &bucket).await;
    let source = LoopVolume::new(256);
    fill(source.path());

    let result = backup(url, &bucket, &key, source.path(), BACKUP_UID, None);
    let written = result.snapshot.clone().unwrap();
    assert_eq!(written.repository_id, repository_id);
    assert_eq!(result.files, 10_003);
    assert_eq!(written.files_read, 10_003);
    // Everything is under the repository's prefix, in restic's layout.
    let keys = s3::keys(url, &bucket, "").await;
    assert!(
        keys.iter()
            .all(|key| key.starts_with(&format!("{PREFIX}/"))),
        "{keys:?}"
    );
    for directory in ["config", "keys/", "snapshots/", "index/", "data/"] {
        assert!(
            keys.iter()
                .any(|key| key.starts_with(&format!("{PREFIX}/{directory}"))),
            "{directory}"
        );
    }

    let target = restore_verified((url, &bucket, &key), &result, BACKUP_UID, 10_003);
    let owner = std::os::unix::fs::MetadataExt::uid(
        &std::fs::metadata(target.path().join("base/000/00001")).unwrap(),
    );
    assert_eq!(owner, 999);
    assert_eq!(tree_without_custody(target.path()), tree(source.path()));

    // restic opens custody's repository with the password, finds every pack intact, and
    // restores the same volume from it.
    let check = repository::restic(url, &bucket, &["check", "--read-data"]);
    assert!(check.status.success(), "restic check --read-data failed");
    let listed = repository::restic(url, &bucket, &["snapshots", "--json"]);
    assert!(listed.status.success());
    let snapshots: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(snapshots.as_array().unwrap().len(), 1);
    assert_eq!(snapshots[0]["id"], written.id);
    let tags: Vec<&str> = snapshots[0]["tags"]
        .as_array()
        .unwrap()
        .iter()
        .map(|tag| tag.as_str().unwrap())
        .collect();
    assert!(
        tags.contains(&"custody") && tags.contains(&"cluster=orders"),
        "{tags:?}"
    );
    let by_restic = tempfile::tempdir().unwrap();
    let restored = repository::restic(
        url,
        &bucket,
        &[
            "restore",
            &written.id,
            "--target",
            by_restic.path().to_str().unwrap(),
        ],
    );
    assert!(restored.status.success(), "restic restore failed");
    assert_eq!(
        tree(&by_restic.path().join("data/data")),
        tree(source.path())
    );
    // The manifest is in the snapshot too, and hashes to what the Backup records.
    let manifest = std::fs::read(by_restic.path().join("manifests/data.jsonl")).unwrap();
    assert_eq!(
        blake3::hash(&manifest).to_hex().to_string(),
        result.manifest_hash
    );
}

#[tokio::test]
async fn a_second_backup_reads_and_uploads_only_what_changed() {
    let url = s3::shared();
    let bucket = s3::bucket(url, "incremental").await;
    let (_, key) = repository::create(url, &bucket).await;
    let source = LoopVolume::new(256);
    fill(source.path());
    let first = backup(url, &bucket, &key, source.path(), BACKUP_UID, None);
    let volume_bytes = first.total_bytes;
    eprintln!("first: {first:?}");

    // Unchanged: nothing is read again, almost nothing is uploaded.
    let second_uid = "5a9a0b2e-2222-4000-8000-0000000000b2";
    let second = backup(
        url,
        &bucket,
        &key,
        source.path(),
        second_uid,
        Some(&snapshot_id(&first)),
    );
    eprintln!("unchanged: {second:?}");
    assert_eq!(second.snapshot.as_ref().unwrap().files_read, 0);
    // Its manifest is the first's but for the header (which names the Backup): stored as a
    // block of its own header and the first's blocks after it, not chunked again.
    let (first_blocks, second_blocks) = (
        manifest_blocks(url, &bucket, &snapshot_id(&first)),
        manifest_blocks(url, &bucket, &snapshot_id(&second)),
    );
    assert!(first_blocks.len() >= 2, "{first_blocks:?}");
    assert_ne!(first_blocks[0], second_blocks[0]);
    assert_eq!(first_blocks[1..], second_blocks[1..]);
    // (Not even its trees: below 0.1%, where the 1% target leaves room for a regression
    // that uploads every tree again, as recording access times did.)
    assert!(
        second.size_bytes * 1000 < volume_bytes,
        "uploaded {} of {volume_bytes}",
        second.size_bytes
    );

    // 1% of the files rewritten (100 of 10,003, one of them large): only they are read, and
    // the upload stays within 3% of the volume.
    for index in (0..10_000).step_by(100) {
        let path = source
            .path()
            .join(format!("base/{:03}/{index:05}", index / 100));
        std::fs::write(&path, format!("changed {index}")).unwrap();
    }
    let mut segment = std::fs::read(source.path().join("pg_wal/segment-1")).unwrap();
    segment[1 << 20] ^= 0xff;
    std::fs::write(source.path().join("pg_wal/segment-1"), &segment).unwrap();
    let third_uid = "5a9a0b2e-2222-4000-8000-0000000000b3";
    let third = backup(
        url,
        &bucket,
        &key,
        source.path(),
        third_uid,
        Some(&snapshot_id(&second)),
    );
    eprintln!("1% changed: {third:?}");
    assert_eq!(third.snapshot.as_ref().unwrap().files_read, 101);
    assert_ne!(
        manifest_blocks(url, &bucket, &snapshot_id(&third))[1..],
        second_blocks[1..],
        "the manifest of changed files is stored anew"
    );
    assert!(
        third.size_bytes * 100 < volume_bytes * 3,
        "uploaded {} of {volume_bytes}",
        third.size_bytes
    );

    // Each backup added an index file. A prune (nothing forgotten, nothing to delete) merges
    // those of fewer than 10,000 blocks (rustic's rule, restic's too): an unchanged backup
    // reads every index file, so they must not pile up from one prune to the next. The
    // restore below reads the merged index.
    let small = |blocks: &[usize]| blocks.iter().filter(|&&count| count < 10_000).count();
    let before = index_blocks(url, &bucket);
    assert!(small(&before) >= 2, "index files' blocks: {before:?}");
    let pruned = prune(url, &bucket, &key);
    assert_eq!(pruned.packs_marked + pruned.packs_deleted, 0, "{pruned:?}");
    let after = index_blocks(url, &bucket);
    let said = format!("index files' blocks: {before:?} before the prune, {after:?} after");
    eprintln!("{said}");
    assert_eq!(small(&after), 1, "{said}");
    assert_eq!(
        after.iter().sum::<usize>(),
        before.iter().sum::<usize>(),
        "{said}"
    );

    // What was not read is restored as it was, what was is restored as it is now.
    let target = restore_verified((url, &bucket, &key), &third, third_uid, 10_003);
    assert_eq!(tree_without_custody(target.path()), tree(source.path()));
}

#[tokio::test]
async fn a_wrong_key_reads_and_writes_nothing() {
    let url = s3::shared();
    let bucket = s3::bucket(url, "wrong-key").await;
    let (_, _key) = repository::create(url, &bucket).await;
    let (_, other_key) = repository::create(url, &s3::bucket(url, "other-key").await).await;
    let source = LoopVolume::new(64);
    std::fs::write(source.path().join("file"), b"data").unwrap();
    let before = s3::keys(url, &bucket, "").await;

    let output = run(mover(
        url,
        &bucket,
        &other_key,
        &backup_args(source.path(), BACKUP_UID, None),
    ));
    assert_eq!(output.status.code(), Some(3), "refused for good");
    let error = failure(&output);
    assert_eq!(error["reason"], "RepositoryKeyRejected");
    assert_eq!(
        s3::keys(url, &bucket, "").await,
        before,
        "nothing was written"
    );

    // A password that opens no key file is refused the same way.
    let mut command = mover(
        url,
        &bucket,
        "",
        &backup_args(source.path(), BACKUP_UID, None),
    );
    command
        .env_remove("CUSTODY_REPOSITORY_KEY")
        .env("CUSTODY_REPOSITORY_PASSWORD", "not the password");
    let output = run(command);
    assert_eq!(failure(&output)["reason"], "RepositoryKeyRejected");
    assert_eq!(
        s3::keys(url, &bucket, "").await,
        before,
        "nothing was written"
    );
}

#[tokio::test]
async fn a_pack_or_a_snapshot_with_one_byte_changed_is_refused_naming_it() {
    let url = s3::shared();
    let bucket = s3::bucket(url, "tampered").await;
    let (_, key) = repository::create(url, &bucket).await;
    let source = LoopVolume::new(64);
    let mut state = 7u64;
    let orders: Vec<u8> = (0..300_000)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect();
    std::fs::write(source.path().join("orders"), orders).unwrap();
    std::fs::write(source.path().join("customers"), b"alice bob").unwrap();
    let result = backup(url, &bucket, &key, source.path(), BACKUP_UID, None);

    // The manifest hash the Backup recorded must be the snapshot's own.
    let target = LoopVolume::new(64);
    let mut wrong = result.clone();
    wrong.manifest_hash = "0".repeat(64);
    let output = restore(url, &bucket, &key, target.path(), &wrong, BACKUP_UID);
    assert_eq!(failure(&output)["reason"], "ManifestTampered");
    // And the snapshot must be the Backup's.
    let output = restore(
        url,
        &bucket,
        &key,
        target.path(),
        &result,
        "5a9a0b2e-2222-4000-8000-00000000dead",
    );
    assert_eq!(failure(&output)["reason"], "ManifestOfAnotherBackup");

    // One byte of the data pack (the largest: 300 kB that do not compress) changed: its
    // block's MAC does not match, the pack is named.
    let mut packs = Vec::new();
    for pack in s3::keys(url, &bucket, &format!("{PREFIX}/data/")).await {
        let bytes = s3::get(url, &bucket, &pack).await;
        packs.push((bytes.len(), pack, bytes));
    }
    packs.sort();
    let (_, data_pack, mut bytes) = packs.pop().expect("a data pack");
    bytes[40] ^= 1;
    s3::put(url, &bucket, &data_pack, bytes).await;
    let target = LoopVolume::new(64);
    let output = restore(url, &bucket, &key, target.path(), &result, BACKUP_UID);
    assert_eq!(output.status.code(), Some(3), "refused for good");
    let error = failure(&output);
    assert_eq!(error["reason"], "ArchiveUnreadable", "{error}");
    let message = error["message"].as_str().unwrap();
    assert!(message.contains("MAC does not match"), "{error}");
    let pack_id = data_pack.rsplit('/').next().unwrap();
    assert!(message.contains(&pack_id[..8]), "names the pack: {error}");

    // One byte of a tree pack changed: the snapshot's tree does not read, for good.
    let (_, tree_pack, mut bytes) = packs.remove(0);
    bytes[20] ^= 1;
    s3::put(url, &bucket, &tree_pack, bytes).await;
    let target = LoopVolume::new(64);
    let output = restore(url, &bucket, &key, target.path(), &result, BACKUP_UID);
    assert_eq!(output.status.code(), Some(3), "refused for good");

    // One byte of the snapshot file changed: it does not open.
    let snapshot = format!("{PREFIX}/snapshots/{}", snapshot_id(&result));
    let mut bytes = s3::get(url, &bucket, &snapshot).await;
    bytes[20] ^= 1;
    s3::put(url, &bucket, &snapshot, bytes).await;
    let target = LoopVolume::new(64);
    let output = restore(url, &bucket, &key, target.path(), &result, BACKUP_UID);
    let error = failure(&output);
    assert_eq!(error["reason"], "SnapshotInvalid", "{error}");
}

/// The blocks each index file of the repository in `bucket` lists (in packs in use and in
/// marked ones), as restic reads them.
/// A parent snapshot whose blocks are not all in the index any more (a pack of its data lost
/// from the index): the next backup still uses it, reads again the files whose blocks the
/// pack held, and its snapshot restores whole and verified (reusing a lost block would leave
/// it naming a block no pack holds).
#[tokio::test]
async fn a_parent_whose_blocks_the_index_lost_has_those_files_read_again() {
    let url = s3::shared();
    let bucket = s3::bucket(url, "lost-parent-blocks").await;
    let (_, key) = repository::create(url, &bucket).await;
    let source = LoopVolume::new(256);
    fill(source.path());
    // Last in the walk: 32 MiB that do not compress, packed between the small files' blocks
    // and the manifest's, so that those never share a pack.
    std::fs::write(
        source.path().join("pg_wal/segment-9"),
        incompressible(32 << 20, 9),
    )
    .unwrap();
    let first = backup(url, &bucket, &key, source.path(), BACKUP_UID, None);

    // The pack holding the first file's block (a pack of the small files: the parent's
    // manifest and trees are in others), lost from the index.
    let first_file = std::fs::read(source.path().join("base/000/00000")).unwrap();
    let block =
        custody_repository::writer::rustic_id(&custody_repository::writer::block_id(&first_file))
            .to_hex()
            .to_string();
    let pack = data_packs(url, &bucket)
        .into_iter()
        .find(|(_, blocks)| blocks.contains(&block))
        .map(|(pack, _)| pack)
        .expect("a pack of data blocks holds the first file's");
    repository::lose_pack_from_index(url, &bucket, &key, &pack).await;
    assert!(
        data_packs(url, &bucket)
            .iter()
            .all(|(listed, _)| *listed != pack),
        "the index still lists {pack}"
    );

    // The parent is used (its trees and manifest are whole), and its files' blocks the index
    // lacks are read and stored again: the first file's block is listed again.
    let second_uid = "5a9a0b2e-2222-4000-8000-0000000000b2";
    let parent = snapshot_id(&first);
    let output = run(mover(
        url,
        &bucket,
        &key,
        &backup_args(source.path(), second_uid, Some(&parent)),
    ));
    assert!(output.status.success(), "backup failed");
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(!said.contains("not using parent snapshot"), "{said}");
    let second: BackupResult = serde_json::from_slice(&output.stdout).expect("backup result");
    eprintln!("after the pack was lost: {second:?}");
    assert!(second.snapshot.as_ref().unwrap().files_read > 0);
    assert!(
        data_packs(url, &bucket)
            .iter()
            .any(|(_, blocks)| blocks.contains(&block)),
        "the first file's block is not stored again"
    );

    let target = restore_verified((url, &bucket, &key), &second, second_uid, 10_004);
    assert_eq!(tree_without_custody(target.path()), tree(source.path()));
}

/// The packs the index lists that hold data blocks only, with their blocks, as restic reads
/// the index.
fn data_packs(url: &str, bucket: &str) -> Vec<(String, Vec<String>)> {
    let listed = repository::restic(url, bucket, &["list", "index"]);
    assert!(listed.status.success(), "restic list index failed");
    let mut packs = Vec::new();
    for id in String::from_utf8_lossy(&listed.stdout).lines() {
        let output = repository::restic(url, bucket, &["cat", "index", id.trim()]);
        assert!(output.status.success(), "restic cat index {id} failed");
        let index: serde_json::Value =
            serde_json::from_slice(&output.stdout).expect("an index file");
        for pack in index["packs"].as_array().into_iter().flatten() {
            let blobs = pack["blobs"].as_array().cloned().unwrap_or_default();
            if !blobs.is_empty() && blobs.iter().all(|blob| blob["type"] == "data") {
                packs.push((
                    pack["id"].as_str().expect("a pack id").to_string(),
                    blobs
                        .iter()
                        .map(|blob| blob["id"].as_str().expect("a blob id").to_string())
                        .collect(),
                ));
            }
        }
    }
    packs
}

/// The blocks of the volume `data`'s manifest in a snapshot, as restic reads its trees.
fn manifest_blocks(url: &str, bucket: &str, snapshot: &str) -> Vec<String> {
    let json = |args: &[&str]| -> serde_json::Value {
        let output = repository::restic(url, bucket, args);
        assert!(output.status.success(), "restic {args:?} failed");
        serde_json::from_slice(&output.stdout).expect("JSON")
    };
    let child = |tree: &str, name: &str| -> serde_json::Value {
        json(&["cat", "blob", tree])["nodes"]
            .as_array()
            .expect("a tree's nodes")
            .iter()
            .find(|node| node["name"] == name)
            .unwrap_or_else(|| panic!("no {name} in tree {tree}"))
            .clone()
    };
    let root = json(&["cat", "snapshot", snapshot])["tree"]
        .as_str()
        .expect("a snapshot's tree")
        .to_string();
    let manifests = child(&root, "manifests")["subtree"]
        .as_str()
        .expect("a directory's tree")
        .to_string();
    child(&manifests, "data.jsonl")["content"]
        .as_array()
        .expect("a file's blocks")
        .iter()
        .map(|id| id.as_str().expect("a block ID").to_string())
        .collect()
}

fn index_blocks(url: &str, bucket: &str) -> Vec<usize> {
    let listed = repository::restic(url, bucket, &["list", "index"]);
    assert!(listed.status.success(), "restic list index failed");
    String::from_utf8_lossy(&listed.stdout)
        .lines()
        .map(|id| {
            let output = repository::restic(url, bucket, &["cat", "index", id.trim()]);
            assert!(output.status.success(), "restic cat index {id} failed");
            let index: serde_json::Value =
                serde_json::from_slice(&output.stdout).expect("an index file");
            ["packs", "packs_to_delete"]
                .iter()
                .flat_map(|field| index[field].as_array().into_iter().flatten())
                .map(|pack| pack["blobs"].as_array().map_or(0, Vec::len))
                .sum()
        })
        .collect()
}

/// The mover's prune on the repository in `bucket`: what it reports.
fn prune(url: &str, bucket: &str, key: &str) -> custody_repository::prune::PruneReport {
    let output = run(mover(url, bucket, key, &["prune"]));
    assert!(output.status.success(), "prune failed");
    let report = serde_json::from_slice(&output.stdout).expect("a prune report");
    eprintln!("prune: {report:?}");
    report
}

fn signal(pid: u32, name: &str) {
    let sent = Command::new("kill")
        .args([format!("-{name}"), pid.to_string()])
        .status()
        .expect("kill runs");
    assert!(sent.success(), "SIG{name} to {pid}");
}

/// Whether the process holds a descriptor of `path` (or anything beneath it) open.
fn holds_open(pid: u32, path: &Path) -> bool {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| std::fs::read_link(entry.path()).ok())
        .any(|link| link.starts_with(path))
}

#[tokio::test]
async fn a_backup_reusing_data_while_a_prune_runs_keeps_every_block_and_forgotten_space_comes_back()
{
    let url = s3::shared();
    let bucket = s3::bucket(url, "prune-race").await;
    let (_, key) = repository::create(url, &bucket).await;
    let data_keys = |bucket: String| async move {
        s3::keys(url, &bucket, &format!("{PREFIX}/data/"))
            .await
            .len()
    };
    let source = LoopVolume::new(256);
    fill(source.path());
    let first = backup(url, &bucket, &key, source.path(), BACKUP_UID, None);
    let packs_of_first = data_keys(bucket.clone()).await;
    assert!(packs_of_first > 0);

    // The first snapshot is forgotten (by restic: the repository is restic's); a second
    // backup of the same data starts, loads the index (every block listed) and is stopped
    // once it reads the volume: everything it names, a prune now finds unused.
    let forgotten = repository::restic(url, &bucket, &["forget", &snapshot_id(&first)]);
    assert!(forgotten.status.success(), "restic forget failed");
    let second_uid = "5a9a0b2e-2222-4000-8000-0000000000b2";
    let second = mover(
        url,
        &bucket,
        &key,
        &backup_args(source.path(), second_uid, None),
    )
    .spawn()
    .expect("the second backup starts");
    let pid = second.id();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !holds_open(pid, source.path()) {
        assert!(
            std::time::Instant::now() < deadline,
            "the second backup never opened the volume"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    signal(pid, "STOP");
    let marked = prune(url, &bucket, &key);
    assert!(
        marked.packs_marked > 0,
        "the prune marked nothing: {marked:?}"
    );
    assert_eq!(marked.packs_deleted, 0, "a prune deleted at once");
    signal(pid, "CONT");
    let output = second.wait_with_output().expect("the second backup ends");
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    eprintln!("{stderr}");
    assert!(output.status.success(), "the second backup failed");
    // It found the packs it reuses marked, and listed them again before saving its snapshot.
    assert!(
        stderr.contains("pack(s) a prune marked while this backup ran are listed again"),
        "the second backup never met the prune's marks"
    );
    let second: BackupResult = serde_json::from_slice(&output.stdout).expect("backup result");

    // A day later (the index backdated past the grace) a prune deletes nothing the second
    // snapshot needs; it restores verified, and restic finds every pack intact.
    repository::backdate(url, &bucket, &key, 24).await;
    let later = prune(url, &bucket, &key);
    assert_eq!(later.packs_deleted, 0, "{later:?}");
    let target = restore_verified((url, &bucket, &key), &second, second_uid, 10_003);
    assert_eq!(tree_without_custody(target.path()), tree(source.path()));
    let check = repository::restic(url, &bucket, &["check", "--read-data"]);
    assert!(check.status.success(), "restic check --read-data failed");

    // Forgotten too: one prune marks everything, the next after the grace deletes it all.
    let forgotten = repository::restic(url, &bucket, &["forget", &snapshot_id(&second)]);
    assert!(forgotten.status.success(), "restic forget failed");
    let marking = prune(url, &bucket, &key);
    assert!(marking.packs_marked > 0, "{marking:?}");
    assert!(
        data_keys(bucket.clone()).await > 0,
        "deleted before the grace"
    );
    repository::backdate(url, &bucket, &key, 24).await;
    let deleting = prune(url, &bucket, &key);
    assert!(deleting.packs_deleted > 0, "{deleting:?}");
    assert_eq!(
        data_keys(bucket.clone()).await,
        0,
        "space did not come back"
    );
}

/// How many bytes the overdue call had to move, as its message says.
fn moved_bytes(said: &serde_json::Value) -> u64 {
    let message = said["message"].as_str().unwrap();
    let (before, _) = message
        .split_once(" bytes to move")
        .unwrap_or_else(|| panic!("no overdue call: {message}"));
    before
        .rsplit('(')
        .next()
        .and_then(|count| count.parse().ok())
        .unwrap_or_else(|| panic!("no byte count: {message}"))
}

/// Issue 24, item 4: a repository server that stops answering, or trickles, fails the mover
/// within the repository's bounds (`spec.timeouts`, passed to the mover as a Job does: here
/// 3 s and 256 KiB/s), naming them, and as a failure its Job may try again. Before, the SDK
/// waited without end: the Job held its Cluster's Lease until its one-day deadline.
#[tokio::test]
async fn a_server_that_stalls_or_trickles_fails_the_mover_within_its_bounds_naming_them() {
    let url = s3::shared();
    let bucket = s3::bucket(url, "bounded").await;
    let (_, key) = repository::create(url, &bucket).await;
    let source = LoopVolume::new(64);
    let random = |mut state: u64| -> Vec<u8> {
        (0..(1usize << 20))
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect()
    };
    std::fs::write(source.path().join("table"), random(0x9e3779b97f4a7c15)).unwrap();
    let result = backup(url, &bucket, &key, source.path(), BACKUP_UID, None);
    let link = s3::FaultyLink::start(url);
    let bounds = ["--s3-stall-seconds", "3", "--s3-min-kib-per-second", "256"];
    let second = "5a9a0b2e-2222-4000-8000-0000000000b2";
    let temporary = |said: &serde_json::Value| {
        custody_proto::reasons::MoverFailure::known(said["reason"].as_str().unwrap())
            .is_some_and(|reason| !reason.permanent())
    };
    // Runs the mover through the link; how long it took to fail, and what it said (a failure
    // its Job may try again).
    let fails = |args: &[&str], what: &str| {
        let started = std::time::Instant::now();
        let output = run(mover(&link.url, &bucket, &key, args));
        let took = started.elapsed();
        let said = failure(&output);
        eprintln!("{what}: failed after {took:?}: {said}");
        assert!(temporary(&said), "{said}");
        (took, said)
    };

    // Accepts and never answers: the first call fails at the stall bound.
    link.set(s3::Fault::Stall);
    let mut args = backup_args(source.path(), second, None);
    args.extend(bounds);
    let (took, said) = fails(&args, "stalled server, backup");
    assert!(
        said["message"]
            .as_str()
            .unwrap()
            .contains("did not finish within 3s"),
        "{said}"
    );
    assert!(took < std::time::Duration::from_secs(20), "{took:?}");

    // Uploads trickle at 8 kB/s: the new 1 MiB pack (the table changed: nothing to reuse)
    // may take 3 s + 4 s, and fails then.
    std::fs::write(source.path().join("table"), random(0x2545f4914f6cdd1d)).unwrap();
    link.set(s3::Fault::Throttle(8_000));
    let (took, said) = fails(&args, "uploads at 8 kB/s, backup");
    assert_eq!(said["reason"], "UploadFailed", "{said}");
    assert!(
        moved_bytes(&said) > 100_000,
        "a transfer's bound, not the stall: {said}"
    );
    assert!(took < std::time::Duration::from_secs(30), "{took:?}");

    // Downloads trickle at 8 kB/s: the restore fails the same way.
    link.set(s3::Fault::ThrottleDownloads(8_000));
    let target = LoopVolume::new(64);
    let snapshot = snapshot_id(&result);
    let mut args = vec![
        "restore",
        "--target",
        target.path().to_str().unwrap(),
        "--snapshot",
        &snapshot,
        "--volume",
        "data",
        "--manifest-hash",
        &result.manifest_hash,
        "--backup-uid",
        BACKUP_UID,
        "--restore-uid",
        RESTORE_UID,
    ];
    args.extend(bounds);
    let (took, said) = fails(&args, "downloads at 8 kB/s, restore");
    assert!(
        moved_bytes(&said) > 100_000,
        "a transfer's bound, not the stall: {said}"
    );
    assert!(took < std::time::Duration::from_secs(30), "{took:?}");

    // At full speed the same bounds hold nothing up.
    link.set(s3::Fault::None);
    let target = LoopVolume::new(64);
    args[2] = target.path().to_str().unwrap();
    let output = run(mover(&link.url, &bucket, &key, &args));
    assert!(output.status.success(), "restore failed");
}

/// Two volumes of one pod in one snapshot (PostgreSQL's `pg_wal` on a volume of its own): a
/// symlink from one into the other is kept when the application's mount paths say where it
/// leads, each volume restores and verifies on its own against its own manifest, and the
/// same link without the mount paths, or into a path no volume of the backup is mounted at,
/// is refused naming the link.
#[tokio::test]
async fn two_volumes_of_one_pod_are_one_snapshot_and_a_link_between_them_restores() {
    let url = s3::shared();
    let bucket = s3::bucket(url, "two-volumes").await;
    let (_, key) = repository::create(url, &bucket).await;
    let data = tempfile::tempdir().unwrap();
    let wal = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(data.path().join("base/1")).unwrap();
    std::fs::write(data.path().join("base/1/1259"), vec![7u8; 64 << 10]).unwrap();
    std::fs::write(data.path().join("PG_VERSION"), "15\n").unwrap();
    std::os::unix::fs::symlink("/var/lib/postgresql/wal/pg_wal", data.path().join("pg_wal"))
        .unwrap();
    std::fs::create_dir_all(wal.path().join("pg_wal/archive_status")).unwrap();
    std::fs::write(
        wal.path().join("pg_wal/000000010000000000000001"),
        vec![3u8; 1 << 20],
    )
    .unwrap();
    let two = |mounts: Option<[&str; 2]>| {
        let mut args: Vec<String> = backup_args(data.path(), BACKUP_UID, None)
            .into_iter()
            .map(str::to_string)
            .collect();
        if let Some([data_mount, _]) = mounts {
            args.extend(["--mount-path".into(), data_mount.into()]);
        }
        args.extend(
            [
                "--source",
                wal.path().to_str().unwrap(),
                "--volume",
                "wal",
                "--claim",
                "wal-orders-0",
            ]
            .map(str::to_string),
        );
        if let Some([_, wal_mount]) = mounts {
            args.extend(["--mount-path".into(), wal_mount.into()]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run(mover(url, &bucket, &key, &args))
    };

    // Without the mount paths the link leads out of its volume: refused, naming it.
    let refused = two(None);
    let said = failure(&refused);
    assert_eq!(said["reason"], "SymlinkLeavesVolume", "{said}");
    assert!(
        said["message"].as_str().unwrap().contains("pg_wal"),
        "{said}"
    );
    // With the wal volume mounted elsewhere than the link says: refused as well.
    let elsewhere = two(Some(["/var/lib/postgresql/data", "/srv/wal"]));
    assert_eq!(failure(&elsewhere)["reason"], "SymlinkLeavesVolume");

    let output = two(Some([
        "/var/lib/postgresql/data",
        "/var/lib/postgresql/wal",
    ]));
    assert!(output.status.success(), "backup of two volumes failed");
    let result: BackupResult = serde_json::from_slice(&output.stdout).unwrap();
    let names: Vec<&str> = result
        .volumes
        .iter()
        .map(|volume| volume.name.as_str())
        .collect();
    assert_eq!(names, ["data", "wal"]);
    assert_eq!(result.manifest_hash, result.volumes[0].manifest_hash);
    assert_ne!(
        result.volumes[0].manifest_hash,
        result.volumes[1].manifest_hash
    );
    assert_eq!(result.files, 3, "two files of data and one of wal");
    let snapshot = snapshot_id(&result);

    for (volume, source) in [("data", data.path()), ("wal", wal.path())] {
        let written = &result.volumes.iter().find(|v| v.name == volume).unwrap();
        let target = LoopVolume::new(64);
        let output = restore_volume(
            (url, &bucket, &key),
            target.path(),
            (&snapshot, volume, &written.manifest_hash),
            BACKUP_UID,
        );
        assert!(output.status.success(), "restore of {volume} failed");
        assert_eq!(
            volumes::verified(
                target.path(),
                &written.manifest_hash,
                BACKUP_UID,
                RESTORE_UID
            ),
            written.files
        );
        assert_eq!(
            tree_without_custody(target.path()),
            tree(source),
            "{volume}"
        );
        if volume == "data" {
            assert_eq!(
                std::fs::read_link(target.path().join("pg_wal")).unwrap(),
                Path::new("/var/lib/postgresql/wal/pg_wal")
            );
        }
    }
    // Each volume's manifest is its own: the wal volume's does not verify the data volume.
    let target = LoopVolume::new(64);
    let wal_hash = &result.volumes[1].manifest_hash;
    let crossed = restore_volume(
        (url, &bucket, &key),
        target.path(),
        (&snapshot, "data", wal_hash),
        BACKUP_UID,
    );
    assert!(
        !crossed.status.success(),
        "data restored against wal's manifest"
    );
}

/// A restore into a volume smaller than the backup's files is refused before anything is
/// written, naming both sizes, and not tried again (issue 24 item 6).
#[tokio::test]
async fn a_restore_into_a_volume_too_small_is_refused_before_writing_naming_both_sizes() {
    let url = s3::shared();
    let bucket = s3::bucket(url, "too-small").await;
    let (_, key) = repository::create(url, &bucket).await;
    let source = tempfile::tempdir().unwrap();
    let noise: Vec<u8> = (0..(24u32 << 20))
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(source.path().join("big"), &noise).unwrap();
    let result = backup(url, &bucket, &key, source.path(), BACKUP_UID, None);
    let target = LoopVolume::new(16);
    let before = tree(target.path());
    let output = restore(url, &bucket, &key, target.path(), &result, BACKUP_UID);
    let said = failure(&output);
    assert_eq!(said["reason"], "TargetTooSmall", "{said}");
    let message = said["message"].as_str().unwrap();
    assert!(
        message.contains("bytes free") && message.contains(&format!("take {} bytes", 24u32 << 20)),
        "{message}"
    );
    assert_eq!(output.status.code(), Some(3), "not tried again");
    assert_eq!(tree(target.path()), before, "nothing was written");
    assert!(!target.path().join(".custody").exists());
}

#[tokio::test]
async fn a_bandwidth_bound_slows_backup_and_restore_to_its_rate_and_fails_nothing() {
    let url = s3::shared();
    let bucket = s3::bucket(url, "bandwidth").await;
    let (_, key) = repository::create(url, &bucket).await;
    let source = LoopVolume::new(128);
    const MIB: u64 = 1 << 20;
    let size = 32 * MIB;
    std::fs::write(
        source.path().join("random"),
        incompressible(size as usize, 11),
    )
    .unwrap();
    // 1 MiB/s: the bounded copy takes at least 15 s, several times an unbounded one even on
    // a loaded machine (8 s was seen with two builds beside it; at 2 MiB/s the bound was 7 s).
    let rate_kib = 1024;
    let rate = rate_kib * 1024;
    // The throttle lets one second's worth run ahead and charges a call after it: at least
    // every byte but the largest call's (a pack, at most 16 MiB) at the rate, less that
    // second. Without a bound the same copy takes a fraction of it (printed below).
    let at_least = std::time::Duration::from_secs_f64((size - 16 * MIB) as f64 / rate as f64 - 1.0);

    let started = std::time::Instant::now();
    let unbounded = backup(url, &bucket, &key, source.path(), BACKUP_UID, None);
    let unbounded_took = started.elapsed();

    // A second repository, so that nothing is deduplicated away.
    let bucket = s3::bucket(url, "bandwidth-bounded").await;
    let (_, key) = repository::create(url, &bucket).await;
    let started = std::time::Instant::now();
    let mut command = mover(
        url,
        &bucket,
        &key,
        &backup_args(source.path(), BACKUP_UID, None),
    );
    command
        .env("CUSTODY_S3_UPLOAD_KIB_PER_SECOND", rate_kib.to_string())
        // Four times slower than the slowest transfer the repository accepts, with a stall of
        // one second: a pack may take 1 s + 16 MiB at 4 MiB/s, and waits about 16 s for the
        // bound. Waiting between calls never counts against a call; waiting inside one would.
        .env("CUSTODY_S3_MIN_KIB_PER_SECOND", (4 * rate_kib).to_string())
        .env("CUSTODY_S3_STALL_SECONDS", "1");
    let output = run(command);
    let bounded_took = started.elapsed();
    assert!(output.status.success(), "the bounded backup failed");
    let bounded: BackupResult = serde_json::from_slice(&output.stdout).unwrap();
    eprintln!(
        "backup of {} MiB: {unbounded_took:?} unbounded, {bounded_took:?} at {rate_kib} KiB/s (at least {at_least:?})",
        size / MIB
    );
    assert_eq!(bounded.total_bytes, unbounded.total_bytes);
    assert!(bounded.size_bytes >= size, "{bounded:?}");
    assert!(bounded_took >= at_least, "{bounded_took:?} < {at_least:?}");
    assert!(
        unbounded_took < at_least,
        "the copy without a bound ({unbounded_took:?}) is too slow for this test to tell"
    );

    let target = LoopVolume::new(128);
    let started = std::time::Instant::now();
    let snapshot = snapshot_id(&bounded);
    let mut command = restore_command(
        (url, &bucket, &key),
        target.path(),
        (&snapshot, "data", &bounded.manifest_hash),
        BACKUP_UID,
    );
    command.env("CUSTODY_S3_DOWNLOAD_KIB_PER_SECOND", rate_kib.to_string());
    let output = run(command);
    let restore_took = started.elapsed();
    assert!(output.status.success(), "the bounded restore failed");
    eprintln!("restore at {rate_kib} KiB/s: {restore_took:?} (at least {at_least:?})");
    assert!(restore_took >= at_least, "{restore_took:?} < {at_least:?}");
    assert_eq!(
        volumes::verified(
            target.path(),
            &bounded.manifest_hash,
            BACKUP_UID,
            RESTORE_UID
        ),
        1
    );
}

/// A backup by a stream tool: `custody-mover stream-setup` prepares the shared directory,
/// `stream-tool` runs the tool with its standard output on the FIFO, and the mover reads the
/// tar stream as it is written (`--tar-stream`, entries under `--tar-data-path`); its
/// snapshot is sealed only if the tool exited 0. The mover's result or failure, and whether a
/// snapshot was saved.
async fn stream_backup(
    (url, bucket, key): (&str, &str, &str),
    tool: &[&str],
    backup_uid: &str,
) -> (Output, bool) {
    let dir = tempfile::tempdir().unwrap();
    let stream = dir.path().to_str().unwrap();
    let setup = Command::new(binary("custody-mover"))
        .args(["stream-setup", "--dir", stream])
        .output()
        .unwrap();
    assert!(setup.status.success(), "{setup:?}");
    let mut args = backup_args(dir.path(), backup_uid, None);
    args.extend(["--tar-stream", stream, "--tar-data-path", "pgdata"]);
    let backup = mover(url, bucket, key, &args).spawn().unwrap();
    // The tool runs the copy setup left, as the tool's container does; it must end by itself
    // (its mover gone, its writes fail) within two minutes.
    let mut tool = Command::new(dir.path().join("custody-mover"))
        .args(["stream-tool", "--dir", stream, "--"])
        .args(tool)
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let tool = loop {
        if let Some(status) = tool.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = tool.kill();
            panic!("the tool was still running two minutes on");
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    let output = backup.wait_with_output().unwrap();
    eprintln!("tool: {tool}\n{}", String::from_utf8_lossy(&output.stderr));
    let snapshots = s3::keys(url, bucket, &format!("{PREFIX}/snapshots/")).await;
    (output, !snapshots.is_empty())
}

/// Issue 24 item 2: a tool's tar stream is read as it is produced (nothing of it lands on
/// disk), and restores verified into the tree it held, beneath `dataPath`: content, symlink,
/// owners, modes, the stream's root as `dataPath`'s directory.
#[tokio::test]
async fn a_tools_tar_stream_is_backed_up_as_it_is_written_and_restores_the_tree_it_held() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let url = s3::shared();
    let bucket = s3::bucket(url, "stream").await;
    let (_, key) = repository::create(url, &bucket).await;
    let source = tempfile::tempdir().unwrap();
    fill(source.path());
    std::fs::set_permissions(source.path(), std::fs::Permissions::from_mode(0o750)).unwrap();
    std::fs::set_permissions(
        source.path().join("base/000/00001"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    let src = source.path().to_str().unwrap();
    let (output, saved) = stream_backup(
        (url, &bucket, &key),
        &["tar", "-C", src, "-cf", "-", "."],
        BACKUP_UID,
    )
    .await;
    assert!(output.status.success(), "the stream backup failed");
    assert!(saved);
    let result: BackupResult = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(result.files, 10_003);

    let target = restore_verified((url, &bucket, &key), &result, BACKUP_UID, 10_003);
    assert_eq!(tree(&target.path().join("pgdata")), tree(source.path()));
    let restored = |path: &str| std::fs::symlink_metadata(target.path().join(path)).unwrap();
    assert_eq!(restored("pgdata").permissions().mode() & 0o7777, 0o750);
    assert_eq!(restored("pgdata/base/000/00001").uid(), 999);
    assert_eq!(
        restored("pgdata/base/000/00001").permissions().mode() & 0o7777,
        0o600
    );
    assert!(restored("pgdata/current").file_type().is_symlink());
}

/// A stream is a backup only if its tool exited 0: a tool that fails after writing a whole
/// tar, or whose stream breaks off mid-entry (even with exit 0), fails the mover and saves
/// no snapshot, naming why.
#[tokio::test]
async fn a_stream_whose_tool_failed_or_broke_off_saves_no_snapshot() {
    let url = s3::shared();
    let source = tempfile::tempdir().unwrap();
    fill(source.path());
    let src = source.path().to_str().unwrap();
    let whole_then_fail = format!("tar -C {src} -cf - . && exit 3");
    let broken_off = format!("tar -C {src} -cf - . | head -c 1000000");
    // Cut where an entry's header would start (the directory's header, then one file of
    // under 512 bytes: its header and its block): only the missing end-of-archive block tells.
    let broken_at_an_entry = format!("tar -C {src} -cf - base/000 | head -c 1536");
    let rows = [
        (whole_then_fail.as_str(), "ToolFailed", "code 3"),
        (broken_off.as_str(), "ReadVolumeFailed", "pgdata/"),
        (
            broken_at_an_entry.as_str(),
            "ReadVolumeFailed",
            "without the end of a tar archive",
        ),
        ("exit 0", "ToolFailed", "wrote nothing"),
    ];
    for (index, (script, reason, said)) in rows.into_iter().enumerate() {
        let bucket = s3::bucket(url, &format!("stream-fails-{index}")).await;
        let (_, key) = repository::create(url, &bucket).await;
        let (output, saved) =
            stream_backup((url, &bucket, &key), &["sh", "-c", script], BACKUP_UID).await;
        let failure = failure(&output);
        assert_eq!(failure["reason"], reason, "{script}: {failure}");
        assert!(
            failure["message"].as_str().unwrap().contains(said),
            "{script}: {failure}"
        );
        assert!(!saved, "{script}: a snapshot was saved");
    }
}

/// A mover that fails before it reads (a key the repository refuses) does not leave its tool
/// waiting for a reader: it opened its end of the FIFO first thing, so the tool's writes fail
/// once it is gone, and the tool ends.
#[tokio::test]
async fn a_mover_that_fails_before_reading_leaves_no_tool_waiting() {
    let url = s3::shared();
    let bucket = s3::bucket(url, "stream-early").await;
    repository::create(url, &bucket).await;
    let other = s3::bucket(url, "stream-other").await;
    let (_, other_key) = repository::create(url, &other).await;
    let source = tempfile::tempdir().unwrap();
    fill(source.path());
    let src = source.path().to_str().unwrap();
    let (output, saved) = stream_backup(
        (url, &bucket, &other_key),
        &["tar", "-C", src, "-cf", "-", "."],
        BACKUP_UID,
    )
    .await;
    let failure = failure(&output);
    assert_eq!(failure["reason"], "RepositoryKeyRejected", "{failure}");
    assert!(!saved);
}
