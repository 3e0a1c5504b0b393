//! The real `custody-mover` binary against the real S3 server (MinIO) and real ext4 volumes:
//! a backup lands under its UID key and restores to an identical, verifiable tree; bad
//! restores are refused; a server that dies mid-upload leaves no object behind.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use custody_agent::verify::{Expected, Options, verify_volume};
use custody_proto::mover::BackupResult;
use custody_tests::binary;
use custody_tests::s3::{self, PrivateS3};
use custody_tests::volumes::{self, LoopVolume, fill, incompressible, inodes};

const BACKUP_UID: &str = "0b5e6a34-1111-4000-8000-0000000000b1";
const RESTORE_UID: &str = "0b5e6a34-1111-4000-8000-0000000000e1";

fn mover(url: &str, bucket: &str, args: &[&str]) -> Command {
    let mut command = Command::new(binary("custody-mover"));
    command
        .args(args)
        .args(["--endpoint", url, "--bucket", bucket, "--path-style"])
        .env("AWS_ACCESS_KEY_ID", s3::ACCESS_KEY)
        .env("AWS_SECRET_ACCESS_KEY", s3::SECRET_KEY)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

fn run(mut command: Command) -> Output {
    let output = command.output().expect("running custody-mover");
    eprintln!("{}", String::from_utf8_lossy(&output.stderr));
    output
}

fn backup(url: &str, bucket: &str, source: &Path, prefix: &str) -> BackupResult {
    let output = run(mover(url, bucket, &backup_args(source, prefix)));
    assert!(output.status.success(), "backup failed");
    serde_json::from_slice(&output.stdout).expect("backup result")
}

fn restore(
    url: &str,
    bucket: &str,
    target: &Path,
    result: &BackupResult,
    extra: &[&str],
) -> Output {
    let mut command = restore_as(url, bucket, target, result, RESTORE_UID);
    command.args(extra);
    run(command)
}

#[tokio::test]
async fn a_backup_lands_under_its_uid_and_restores_to_a_verified_identical_tree() {
    let url = s3::shared();
    let bucket = s3::bucket(url, "mover").await;
    let source = LoopVolume::new(256);
    fill(source.path());
    let prefix = format!("custody/db/orders/{BACKUP_UID}");

    let started = Instant::now();
    let result = backup(url, &bucket, source.path(), &prefix);
    eprintln!("backup took {:?}: {result:?}", started.elapsed());
    assert_eq!(result.key, format!("{prefix}/data.tar.zst"));
    assert_eq!(result.manifest_key, format!("{prefix}/manifest.jsonl"));
    assert_eq!(result.files, 10_003);
    let mut keys = s3::keys(url, &bucket, "").await;
    keys.sort();
    assert_eq!(keys, [result.key.clone(), result.manifest_key.clone()]);

    let target = LoopVolume::new(256);
    let output = restore(url, &bucket, target.path(), &result, &[]);
    assert!(output.status.success(), "restore failed");
    let restored: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(restored["files"], 10_003);

    // The agent's verifier, with the manifest hash as the Backup would record it.
    let verified = verify_volume(
        target.path(),
        &Expected {
            manifest_hash: blake3::Hash::from_hex(&result.manifest_hash).unwrap(),
            backup_uid: BACKUP_UID.into(),
            restore_uid: RESTORE_UID.into(),
        },
        Options::default(),
    )
    .expect("the restored volume verifies");
    assert_eq!(verified.files, 10_003);
    let owner = std::os::unix::fs::MetadataExt::uid(
        &std::fs::metadata(target.path().join("base/000/00001")).unwrap(),
    );
    assert_eq!(owner, 999);

    // Another restore into the now non-empty volume is refused unless asked to overwrite (the
    // same restore run again finds its own finished output: see the resume test).
    let other = "0b5e6a34-1111-4000-8000-0000000000e9";
    let output = run(restore_as(url, &bucket, target.path(), &result, other));
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("TargetNotEmpty"));
    let output = restore(url, &bucket, target.path(), &result, &["--overwrite"]);
    assert!(output.status.success(), "overwrite restore failed");

    // A manifest hash other than the recorded one: refused before anything is written.
    let fresh = LoopVolume::new(64);
    let mut tampered = result.clone();
    tampered.manifest_hash = blake3::hash(b"another manifest").to_hex().to_string();
    let output = restore(url, &bucket, fresh.path(), &tampered, &[]);
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("ManifestTampered"));
    assert!(
        custody_agent::mover::extract::first_entry(fresh.path())
            .unwrap()
            .is_none()
    );
}

#[tokio::test]
async fn a_server_that_dies_mid_upload_leaves_no_object_and_no_open_upload() {
    let mut server = PrivateS3::start();
    let bucket = s3::bucket(&server.url, "crash").await;
    let source = LoopVolume::new(512);
    // Incompressible data, so that the upload takes many parts.
    let content = incompressible(320 << 20, 0x9e3779b97f4a7c15u64);
    std::fs::write(source.path().join("big"), &content).unwrap();
    drop(content);
    let prefix = format!("custody/db/orders/{BACKUP_UID}");
    let child = mover(
        &server.url,
        &bucket,
        &[
            "backup",
            "--source",
            source.path().to_str().unwrap(),
            "--prefix",
            &prefix,
            "--backup-uid",
            BACKUP_UID,
            "--cluster-uid",
            "cluster-uid",
        ],
    )
    .spawn()
    .expect("starting custody-mover");

    // Kill the server once the upload has begun, long enough for the SDK's retries to give up,
    // and bring it back while the mover still tries to abort.
    let client = s3::client(&server.url);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let uploads = client
            .list_multipart_uploads()
            .bucket(&bucket)
            .send()
            .await
            .map(|listed| listed.uploads().len())
            .unwrap_or(0);
        if uploads > 0 {
            break;
        }
        assert!(Instant::now() < deadline, "the upload never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server.kill();
    tokio::time::sleep(Duration::from_secs(6)).await;
    server.resume();

    let output = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    eprintln!("{stderr}");
    assert!(!output.status.success(), "the backup reported success");
    assert!(stderr.contains("UploadFailed"), "{stderr}");
    assert!(stderr.contains("aborted the multipart upload"), "{stderr}");
    // Nothing complete under the key, and no upload left open.
    let client = s3::client(&server.url);
    assert!(s3::keys(&server.url, &bucket, "").await.is_empty());
    let open = client
        .list_multipart_uploads()
        .bucket(&bucket)
        .send()
        .await
        .unwrap();
    assert!(open.uploads().is_empty(), "{:?}", open.uploads());
}

/// The keys under `bucket` and the multipart uploads still open there.
async fn left_in(url: &str, bucket: &str) -> (Vec<String>, usize) {
    let open = s3::client(url)
        .list_multipart_uploads()
        .bucket(bucket)
        .send()
        .await
        .unwrap()
        .uploads()
        .len();
    (s3::keys(url, bucket, "").await, open)
}

fn backup_args<'a>(source: &'a Path, prefix: &'a str) -> Vec<&'a str> {
    vec![
        "backup",
        "--source",
        source.to_str().unwrap(),
        "--prefix",
        prefix,
        "--backup-uid",
        BACKUP_UID,
        "--cluster-uid",
        "cluster-uid",
    ]
}

/// Issue 15, item 5: content a restore could never write and verify fails the backup, not a
/// restore months later.
#[tokio::test]
async fn a_symlink_leading_out_of_the_volume_fails_the_backup_naming_it() {
    let url = s3::shared();
    let bucket = s3::bucket(url, "symlink").await;
    let source = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(source.path().join("base")).unwrap();
    std::fs::write(source.path().join("base/1"), "rows").unwrap();
    // PostgreSQL's WAL on another volume.
    std::os::unix::fs::symlink("/var/lib/wal-volume/pg_wal", source.path().join("pg_wal")).unwrap();
    let prefix = format!("custody/db/orders/{BACKUP_UID}");
    let output = run(mover(url, &bucket, &backup_args(source.path(), &prefix)));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains("SymlinkLeavesVolume"), "{stderr}");
    assert!(stderr.contains("pg_wal"), "{stderr}");
    assert_eq!(left_in(url, &bucket).await, (Vec::new(), 0));

    // Relative links are fine while they stay inside; one that climbs out is not.
    std::fs::remove_file(source.path().join("pg_wal")).unwrap();
    std::os::unix::fs::symlink("../base", source.path().join("base/inside")).unwrap();
    backup(url, &bucket, source.path(), &prefix);
    std::os::unix::fs::symlink("../../etc", source.path().join("base/outside")).unwrap();
    let output = run(mover(
        url,
        &bucket,
        &backup_args(source.path(), &format!("{prefix}-2")),
    ));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("SymlinkLeavesVolume") && stderr.contains("base/outside"),
        "{stderr}"
    );
}

/// Issue 15, item 5: SIGTERM (a deleted Job, a drained node) aborts the multipart upload.
#[tokio::test]
async fn sigterm_aborts_the_multipart_upload() {
    let url = s3::shared();
    let bucket = s3::bucket(url, "sigterm").await;
    let source = LoopVolume::new(512);
    let content = incompressible(320 << 20, 0x2545f4914f6cdd1du64);
    std::fs::write(source.path().join("big"), &content).unwrap();
    drop(content);
    let prefix = format!("custody/db/orders/{BACKUP_UID}");
    let child = mover(url, &bucket, &backup_args(source.path(), &prefix))
        .spawn()
        .expect("starting custody-mover");
    let deadline = Instant::now() + Duration::from_secs(30);
    while left_in(url, &bucket).await.1 == 0 {
        assert!(Instant::now() < deadline, "the upload never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let started = Instant::now();
    let status = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let output = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    eprintln!("{stderr} (ended {:?} after SIGTERM)", started.elapsed());
    assert!(!output.status.success());
    assert!(stderr.contains("Interrupted"), "{stderr}");
    assert_eq!(left_in(url, &bucket).await, (Vec::new(), 0), "{stderr}");
}

/// Issue 13, item 5: without writable scratch space the backup fails naming that, not as an
/// upload that "ended before it was complete".
#[tokio::test]
async fn a_backup_without_scratch_space_says_so() {
    let url = s3::shared();
    let bucket = s3::bucket(url, "scratch").await;
    let source = tempfile::tempdir().unwrap();
    fill(source.path());
    let prefix = format!("custody/db/orders/{BACKUP_UID}");
    let mut command = mover(url, &bucket, &backup_args(source.path(), &prefix));
    command.env("TMPDIR", "/nonexistent/scratch");
    let output = run(command);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains("LocalError"), "{stderr}");
    assert!(stderr.contains("a temporary manifest file"), "{stderr}");
    assert_eq!(left_in(url, &bucket).await, (Vec::new(), 0));
}

/// `custody-mover restore` of `result` into `target` as Restore `restore_uid`.
fn restore_as(
    url: &str,
    bucket: &str,
    target: &Path,
    result: &BackupResult,
    restore_uid: &str,
) -> Command {
    mover(
        url,
        bucket,
        &[
            "restore",
            "--target",
            target.to_str().unwrap(),
            "--key",
            &result.key,
            "--manifest-key",
            &result.manifest_key,
            "--manifest-hash",
            &result.manifest_hash,
            "--backup-uid",
            BACKUP_UID,
            "--restore-uid",
            restore_uid,
        ],
    )
}

/// Issue 15, item 4: one transient fault does not fail a restore for good. A 500 MiB
/// artifact whose download is cut at about 30 %, 60 % and 90 % resumes with ranged GETs and
/// restores a verified tree; a restore that fails partway leaves output its retry recognises
/// (and nobody else's restore takes for its own).
#[tokio::test]
async fn a_download_cut_three_times_resumes_and_a_retry_recognises_its_own_partial_output() {
    let url = s3::shared();
    let bucket = s3::bucket(url, "resume").await;
    let source = LoopVolume::new(640);
    let content = incompressible(500 << 20, 0x853c49e6748fea9bu64);
    std::fs::create_dir_all(source.path().join("base")).unwrap();
    std::fs::write(source.path().join("base/big"), &content).unwrap();
    drop(content);
    for index in 0..100 {
        std::fs::write(
            source.path().join(format!("base/{index:03}")),
            format!("row {index}"),
        )
        .unwrap();
    }
    let prefix = format!("custody/db/orders/{BACKUP_UID}");
    let result = backup(url, &bucket, source.path(), &prefix);
    drop(source);
    let size = result.size_bytes;
    let link = s3::FaultyLink::start(url);

    // Cut every connection after 30 % of the artifact: three resumes.
    link.set(s3::Fault::CutEvery(size * 3 / 10));
    let target = LoopVolume::new(640);
    let started = Instant::now();
    let output = run(restore_as(
        &link.url,
        &bucket,
        target.path(),
        &result,
        RESTORE_UID,
    ));
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    assert!(output.status.success(), "{stderr}");
    let resumes = stderr.matches("resuming").count();
    eprintln!(
        "restored {size} bytes with {resumes} resumes in {:?}",
        started.elapsed()
    );
    assert_eq!(resumes, 3, "{stderr}");
    assert_eq!(
        volumes::verified(
            target.path(),
            &result.manifest_hash,
            BACKUP_UID,
            RESTORE_UID
        ),
        101
    );
    drop(target);

    // The link then stops answering for good: the restore fails partway, naming where.
    let second = "0b5e6a34-1111-4000-8000-0000000000e2";
    let target = LoopVolume::new(640);
    let child = restore_as(&link.url, &bucket, target.path(), &result, second)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while used_bytes(target.path()) < size / 10 {
        assert!(Instant::now() < deadline, "nothing was written");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    link.set(s3::Fault::CutEvery(0));
    let output = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    assert!(!output.status.success(), "{stderr}");
    assert!(
        stderr.contains("DownloadFailed") && stderr.contains("stopped at byte"),
        "{stderr}"
    );
    assert!(
        custody_agent::mover::extract::first_entry(target.path())
            .unwrap()
            .is_some(),
        "partial output was left"
    );
    link.set(s3::Fault::None);
    // Another restore's data is not taken for this one's: refused.
    let output = run(restore_as(
        url,
        &bucket,
        target.path(),
        &result,
        RESTORE_UID,
    ));
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("TargetNotEmpty"));
    // The same restore, tried again, starts clean and verifies.
    let output = run(restore_as(url, &bucket, target.path(), &result, second));
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    assert!(output.status.success(), "{stderr}");
    assert!(
        stderr.contains("unfinished attempt of this restore"),
        "{stderr}"
    );
    assert_eq!(
        volumes::verified(target.path(), &result.manifest_hash, BACKUP_UID, second),
        101
    );
    // Finished, the same restore run again (its pod moved to another node) writes nothing:
    // every file keeps its inode, and the exit code says success. The permanent refusal of
    // anyone else's data is unchanged, and exits with the code a Job gives up on.
    let before = inodes(target.path());
    let output = run(restore_as(url, &bucket, target.path(), &result, second));
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    assert!(output.status.success(), "{stderr}");
    assert!(
        stderr.contains("finished output of this restore"),
        "{stderr}"
    );
    assert_eq!(inodes(target.path()), before);
    assert_eq!(
        volumes::verified(target.path(), &result.manifest_hash, BACKUP_UID, second),
        101
    );
    let output = run(restore_as(
        url,
        &bucket,
        target.path(),
        &result,
        RESTORE_UID,
    ));
    assert_eq!(
        output.status.code(),
        Some(i32::from(custody_proto::mover::EXIT_PERMANENT)),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Bytes of the files under `path` (`du -sb`).
fn used_bytes(path: &Path) -> u64 {
    let output = Command::new("du").arg("-sb").arg(path).output().unwrap();
    String::from_utf8_lossy(&output.stdout)
        .split_whitespace()
        .next()
        .and_then(|bytes| bytes.parse().ok())
        .unwrap_or(0)
}

/// Issue 24, item 4: an artifact deleted behind custody's back is gone for good: the restore
/// fails at once with `ArtifactMissing` and the exit code its Job does not retry (before: exit
/// 1, `DownloadFailed`, and the Job tried three pods). The manifest's download resumes after a
/// reset, as the archive's does (before, a cut manifest failed the restore at once).
#[tokio::test]
async fn a_deleted_artifact_fails_the_restore_for_good_and_a_cut_manifest_download_resumes() {
    let url = s3::shared();
    let bucket = s3::bucket(url, "missing").await;
    let source = LoopVolume::new(64);
    for index in 0..3_000 {
        let directory = source.path().join(format!("base/{:02}", index / 100));
        std::fs::create_dir_all(&directory).unwrap();
        std::fs::write(
            directory.join(format!("{index:05}")),
            format!("row {index}"),
        )
        .unwrap();
    }
    let prefix = format!("custody/db/orders/{BACKUP_UID}");
    let result = backup(url, &bucket, source.path(), &prefix);
    drop(source);
    let client = s3::client(url);
    let manifest_size = client
        .head_object()
        .bucket(&bucket)
        .key(&result.manifest_key)
        .send()
        .await
        .unwrap()
        .content_length()
        .unwrap() as u64;
    let cut = manifest_size.max(result.size_bytes) / 4;
    assert!(
        manifest_size > cut,
        "the manifest ({manifest_size} bytes) is cut too"
    );

    // Every answer cut after a quarter of the larger object: both downloads resume.
    let link = s3::FaultyLink::start(url);
    link.set(s3::Fault::CutEvery(cut));
    let target = LoopVolume::new(64);
    let output = restore(&link.url, &bucket, target.path(), &result, &[]);
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    assert!(output.status.success(), "{stderr}");
    let manifest_resumes = stderr
        .lines()
        .filter(|line| line.contains(&format!("downloading {} stopped", result.manifest_key)))
        .count();
    eprintln!(
        "manifest of {manifest_size} bytes cut every {cut} bytes: {manifest_resumes} resumes"
    );
    assert!(manifest_resumes >= 1, "{stderr}");
    assert_eq!(
        volumes::verified(
            target.path(),
            &result.manifest_hash,
            BACKUP_UID,
            RESTORE_UID
        ),
        3_000
    );
    link.set(s3::Fault::None);
    drop(target);

    // The archive, then the manifest, deleted behind custody's back: no retry can bring
    // either back.
    for (key, said) in [(&result.key, "404"), (&result.manifest_key, "NoSuchKey")] {
        client
            .delete_object()
            .bucket(&bucket)
            .key(key)
            .send()
            .await
            .unwrap();
        let target = LoopVolume::new(64);
        let output = restore(url, &bucket, target.path(), &result, &[]);
        let stderr = String::from_utf8_lossy(&output.stderr).to_string();
        assert_eq!(
            output.status.code(),
            Some(i32::from(custody_proto::mover::EXIT_PERMANENT)),
            "{stderr}"
        );
        assert!(
            stderr.contains("ArtifactMissing") && stderr.contains(key) && stderr.contains(said),
            "{stderr}"
        );
    }
}

/// Issue 24, item 4: format 1 too: a server that accepts and never answers fails the backup
/// within the repository's stall bound, naming it (the uploads' calls had no bound at all).
#[tokio::test]
async fn a_stalled_server_fails_a_format_1_backup_within_its_bound() {
    let url = s3::shared();
    let bucket = s3::bucket(url, "stalled-f1").await;
    let source = LoopVolume::new(64);
    std::fs::write(source.path().join("table"), incompressible(2 << 20, 7)).unwrap();
    let link = s3::FaultyLink::start(url);
    link.set(s3::Fault::Stall);
    let prefix = format!("custody/db/orders/{BACKUP_UID}");
    let started = Instant::now();
    let mut command = mover(&link.url, &bucket, &backup_args(source.path(), &prefix));
    command.args(["--s3-stall-seconds", "3"]);
    let output = run(command);
    let took = started.elapsed();
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    eprintln!("stalled server, stall bound 3 s: the format 1 backup failed after {took:?}");
    assert!(!output.status.success(), "{stderr}");
    assert!(
        stderr.contains("UploadFailed") && stderr.contains("did not finish within 3s"),
        "{stderr}"
    );
    assert!(took < Duration::from_secs(20), "{took:?}");
    link.set(s3::Fault::None);
}

/// Issue 24, item 6: a repository's bandwidth bound, format 1 (an unencrypted repository's
/// archive): parts are sent no faster than the bound, the download is read no faster, and a
/// bound below the slowest transfer the repository accepts fails nothing.
#[tokio::test]
async fn a_bandwidth_bound_paces_the_archive_both_ways() {
    let url = s3::shared();
    let bucket = s3::bucket(url, "archive-bandwidth").await;
    let source = LoopVolume::new(64);
    const MIB: u64 = 1 << 20;
    let size = 16 * MIB;
    std::fs::write(source.path().join("big"), incompressible(size as usize, 23)).unwrap();
    let rate_kib = 2048;
    let rate = rate_kib * 1024;
    // Every byte but one part's (5 MiB) at the rate, less the one second allowed ahead.
    let at_least = Duration::from_secs_f64((size - 5 * MIB) as f64 / rate as f64 - 1.0);

    let started = Instant::now();
    backup(url, &bucket, source.path(), "custody/db/unbounded");
    let unbounded_took = started.elapsed();

    let prefix = format!("custody/db/orders/{BACKUP_UID}");
    let mut command = mover(url, &bucket, &backup_args(source.path(), &prefix));
    // Four times slower than the slowest transfer accepted, with a stall of one second: a
    // part may take 1 s + 5 MiB at 8 MiB/s, and waits 2.5 s for the bound, between calls.
    command
        .env("CUSTODY_S3_UPLOAD_KIB_PER_SECOND", rate_kib.to_string())
        .env("CUSTODY_S3_MIN_KIB_PER_SECOND", (4 * rate_kib).to_string())
        .env("CUSTODY_S3_STALL_SECONDS", "1");
    let started = Instant::now();
    let output = run(command);
    let bounded_took = started.elapsed();
    assert!(output.status.success(), "the bounded backup failed");
    let result: BackupResult = serde_json::from_slice(&output.stdout).unwrap();
    eprintln!(
        "archive of {} MiB: {unbounded_took:?} unbounded, {bounded_took:?} at {rate_kib} KiB/s (at least {at_least:?})",
        size / MIB
    );
    assert!(
        unbounded_took < at_least,
        "too slow to tell: {unbounded_took:?}"
    );
    assert!(bounded_took >= at_least, "{bounded_took:?} < {at_least:?}");

    let target = LoopVolume::new(64);
    let mut command = restore_as(url, &bucket, target.path(), &result, RESTORE_UID);
    command
        .env("CUSTODY_S3_DOWNLOAD_KIB_PER_SECOND", rate_kib.to_string())
        .env("CUSTODY_S3_MIN_KIB_PER_SECOND", (4 * rate_kib).to_string())
        .env("CUSTODY_S3_STALL_SECONDS", "1");
    let started = Instant::now();
    let output = run(command);
    let restore_took = started.elapsed();
    assert!(output.status.success(), "the bounded restore failed");
    eprintln!("archive restore at {rate_kib} KiB/s: {restore_took:?} (at least {at_least:?})");
    assert!(restore_took >= at_least, "{restore_took:?} < {at_least:?}");
    assert_eq!(
        volumes::verified(
            target.path(),
            &result.manifest_hash,
            BACKUP_UID,
            RESTORE_UID
        ),
        1
    );
}
