//! Repositories of format 2 (restic's layout) in the test S3 server, made and opened the way
//! the controller does, and read with restic itself.

use std::process::{Command, Output};

use custody_repository::backend::{Location, S3Backend};
use custody_repository::open::{self, Password};
use rustic_core::RepositoryBackends;

use crate::s3;

/// Where test repositories live in their bucket (the controller's sub-prefix).
pub const PREFIX: &str = "custody_repository";

/// A password the tests create repositories with.
pub const PASSWORD: &str = "correct horse battery staple";

/// A repository's backends in `bucket` of the server at `url`. Blocks on the current Tokio
/// runtime: call it from a blocking thread.
pub fn backends(url: &str, bucket: &str) -> RepositoryBackends {
    let backend = S3Backend::new(
        s3::client(url),
        Location {
            bucket: bucket.into(),
            prefix: PREFIX.into(),
        },
        tokio::runtime::Handle::current(),
    );
    RepositoryBackends::new(backend.shared(), None)
}

/// A new repository in `bucket` with [`PASSWORD`]: its ID and its master key (restic's JSON).
pub async fn create(url: &str, bucket: &str) -> (String, String) {
    let (url, bucket) = (url.to_string(), bucket.to_string());
    tokio::task::spawn_blocking(move || {
        let (opened, _) = open::open_or_init(
            &backends(&url, &bucket),
            &[Password {
                name: "password".into(),
                value: PASSWORD.into(),
            }],
        )
        .expect("a repository is created");
        let key = serde_json::to_string(&opened.repository.key()).expect("a key serialises");
        (opened.repository_id, key)
    })
    .await
    .expect("the creating thread")
}

/// Moves the times in the repository's index back by `hours`: a prune then sees its marks as
/// that much older (the grace is 23 h; a test cannot wait it out).
pub async fn backdate(url: &str, bucket: &str, key: &str, hours: u64) {
    backdate_at(url, bucket, PREFIX, key, hours).await;
}

/// [`backdate`] for the repository at `prefix`.
pub async fn backdate_at(url: &str, bucket: &str, prefix: &str, key: &str, hours: u64) {
    let (url, bucket, prefix, key) = (
        url.to_string(),
        bucket.to_string(),
        prefix.to_string(),
        key.to_string(),
    );
    tokio::task::spawn_blocking(move || {
        let backend = S3Backend::new(
            s3::client(&url),
            Location { bucket, prefix },
            tokio::runtime::Handle::current(),
        );
        let backends = RepositoryBackends::new(backend.shared(), None);
        let (repository, _) =
            open::open_with_master_key(&backends, &key).expect("the repository opens");
        custody_repository::prune::backdate_index(
            &repository,
            backends.repository().as_ref(),
            std::time::Duration::from_secs(hours * 3600),
        )
        .expect("the index is backdated");
    })
    .await
    .expect("the backdating thread")
}

/// restic on the repository in `bucket`, with [`PASSWORD`].
pub fn restic(url: &str, bucket: &str, args: &[&str]) -> Output {
    restic_at(url, bucket, PREFIX, PASSWORD, args)
}

/// restic on the repository at `prefix` in `bucket`, with `password`.
pub fn restic_at(url: &str, bucket: &str, prefix: &str, password: &str, args: &[&str]) -> Output {
    let output = Command::new("restic")
        .args(["-r", &format!("s3:{url}/{bucket}/{prefix}"), "--no-cache"])
        .args(args)
        .env("RESTIC_PASSWORD", password)
        .env("AWS_ACCESS_KEY_ID", s3::ACCESS_KEY)
        .env("AWS_SECRET_ACCESS_KEY", s3::SECRET_KEY)
        .output()
        .expect("restic runs (hack/prerequisites.sh installs it)");
    eprintln!(
        "restic {args:?}: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// Takes the pack `pack` (its ID in hex) out of the repository's index, as if the index had
/// lost it: the index file naming it is written again without it (as a prune writes one) and
/// the old one removed. Its blocks are then in no pack the index lists.
pub async fn lose_pack_from_index(url: &str, bucket: &str, key: &str, pack: &str) {
    let (url, bucket, key, pack) = (
        url.to_string(),
        bucket.to_string(),
        key.to_string(),
        pack.to_string(),
    );
    tokio::task::spawn_blocking(move || {
        let backends = backends(&url, &bucket);
        let (repository, _) =
            open::open_with_master_key(&backends, &key).expect("the repository opens");
        let cipher = custody_repository::crypto::Cipher::new(&repository.key()).expect("a cipher");
        let backend = backends.repository();
        let mut lost = 0;
        for file in repository
            .stream_files::<rustic_core::repofile::IndexFile>()
            .expect("the index files list")
        {
            let (id, mut index) = file.expect("an index file reads");
            let before = index.packs.len();
            index
                .packs
                .retain(|listed| listed.id.to_hex().as_str() != pack);
            if index.packs.len() == before {
                continue;
            }
            lost += before - index.packs.len();
            custody_repository::index_file::save_index(backend.as_ref(), &cipher, &index, 3)
                .expect("the index file is written again");
            backend
                .remove(rustic_core::FileType::Index, &id, true)
                .expect("the old index file is removed");
        }
        assert_eq!(lost, 1, "pack {pack} in the index");
    })
    .await
    .expect("the index thread")
}
