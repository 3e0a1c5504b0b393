//! Opening a repository with the passwords a user keeps in a Secret, creating it on first
//! use, and keeping its key files in step with that Secret.
//!
//! Every password wraps the same master key (restic's key files), so any one of them opens
//! the repository and several can be held at once: a new password is added while an old one
//! still works, then the old one removed. Losing every password loses the data: nothing else
//! can decrypt it.

use std::collections::BTreeMap;

use rustic_core::repofile::{KeyId, MasterKey};
use rustic_core::{
    ConfigOptions, Credentials, KeyOptions, OpenStatus, Repository, RepositoryBackends,
    RepositoryOptions, RusticError,
};

/// A repository password, by the name of its key in the Secret.
#[derive(Clone, PartialEq, Eq)]
pub struct Password {
    pub name: String,
    pub value: String,
}

impl std::fmt::Debug for Password {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Password")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// Why a repository could not be opened (or created).
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("no password given")]
    NoPassword,
    #[error("there is no repository at {location} (no config file)")]
    NotARepository { location: String },
    #[error(
        "none of the passwords {names:?} opens the repository at {location}: each key file there wraps the master key under another password (the data cannot be read without one that does)"
    )]
    KeyRejected {
        location: String,
        names: Vec<String>,
    },
    #[error("the repository at {location} cannot be read: {message}")]
    Unreadable { location: String, message: String },
}

impl OpenError {
    pub(crate) fn unreadable(location: &str, error: &RusticError) -> OpenError {
        OpenError::Unreadable {
            location: location.to_string(),
            message: error.display_log(),
        }
    }
}

/// An open repository and what opened it.
pub struct Opened {
    pub repository: Repository<OpenStatus>,
    /// The password that opened it.
    pub password: String,
    /// The key file that password opened.
    pub key_id: KeyId,
    /// The repository's ID (its config's), the same for everyone who opens it.
    pub repository_id: String,
}

/// Options every custody process opens repositories with: no local cache (the mover's root
/// filesystem is read-only and its pod short-lived; the controller holds no disk).
pub fn options() -> RepositoryOptions {
    RepositoryOptions::default().no_cache(true)
}

fn location(backends: &RepositoryBackends) -> String {
    backends.repository().location()
}

/// Opens the repository with the first password (in name order) that opens it.
pub fn open(backends: &RepositoryBackends, passwords: &[Password]) -> Result<Opened, OpenError> {
    if passwords.is_empty() {
        return Err(OpenError::NoPassword);
    }
    let location = location(backends);
    let mut ordered: Vec<&Password> = passwords.iter().collect();
    ordered.sort_by(|a, b| a.name.cmp(&b.name));
    for password in ordered {
        match open_with(backends, password) {
            Ok(opened) => return Ok(opened),
            Err(OpenError::KeyRejected { .. }) => continue,
            Err(other) => return Err(other),
        }
    }
    Err(OpenError::KeyRejected {
        location,
        names: passwords
            .iter()
            .map(|password| password.name.clone())
            .collect(),
    })
}

fn open_with(backends: &RepositoryBackends, password: &Password) -> Result<Opened, OpenError> {
    let location = location(backends);
    let repository = Repository::new(&options(), backends)
        .map_err(|error| OpenError::unreadable(&location, &error))?;
    match repository.config_id() {
        Ok(Some(_)) => {}
        Ok(None) => return Err(OpenError::NotARepository { location }),
        Err(error) => return Err(OpenError::unreadable(&location, &error)),
    }
    let repository = repository
        .open(&Credentials::password(&password.value))
        .map_err(|error| {
            if error.is_incorrect_password() {
                OpenError::KeyRejected {
                    location: location.clone(),
                    names: vec![password.name.clone()],
                }
            } else {
                OpenError::unreadable(&location, &error)
            }
        })?;
    Ok(opened(repository, &password.value))
}

/// Opens the repository with its master key itself (restic's JSON of it): no key file and
/// no key derivation. custody keeps the master key in a Secret of its own for its movers, so
/// that a mover needs neither the time nor the memory of a password's derivation (restic's
/// scrypt takes 128 MiB). A key that does not decrypt the repository's config is refused.
pub fn open_with_master_key(
    backends: &RepositoryBackends,
    master_key: &str,
) -> Result<(Repository<OpenStatus>, String), OpenError> {
    let location = location(backends);
    let key: MasterKey = serde_json::from_str(master_key).map_err(|_| OpenError::KeyRejected {
        location: location.clone(),
        names: vec!["the master key (not restic's JSON of one)".into()],
    })?;
    let repository = Repository::new(&options(), backends)
        .map_err(|error| OpenError::unreadable(&location, &error))?;
    match repository.config_id() {
        Ok(Some(_)) => {}
        Ok(None) => return Err(OpenError::NotARepository { location }),
        Err(error) => return Err(OpenError::unreadable(&location, &error)),
    }
    // The key must open the config (sealed under it) before anything else is trusted.
    let config = backends
        .repository()
        .read_full(rustic_core::FileType::Config, &rustic_core::Id::default())
        .map_err(|error| OpenError::unreadable(&location, &error))?;
    let cipher = crate::crypto::Cipher::new(&key).map_err(|_| OpenError::KeyRejected {
        location: location.clone(),
        names: vec!["the master key (not 64 bytes)".into()],
    })?;
    if cipher.open(&config).is_err() {
        return Err(OpenError::KeyRejected {
            location,
            names: vec!["the master key".into()],
        });
    }
    let repository = repository
        .open(&Credentials::Masterkey(key))
        .map_err(|error| OpenError::unreadable(&location, &error))?;
    let repository_id = repository.config().id.to_hex().to_string();
    Ok((repository, repository_id))
}

fn opened(repository: Repository<OpenStatus>, password: &str) -> Opened {
    let key_id = repository
        .key_id()
        .expect("a repository opened with a password knows its key file");
    let repository_id = repository.config().id.to_hex().to_string();
    Opened {
        repository,
        password: password.to_string(),
        key_id,
        repository_id,
    }
}

/// Creates a repository at an empty location with `password`, then opens it.
pub fn init(backends: &RepositoryBackends, password: &Password) -> Result<Opened, OpenError> {
    let location = location(backends);
    let repository = Repository::new(&options(), backends)
        .map_err(|error| OpenError::unreadable(&location, &error))?
        .init(
            &Credentials::password(&password.value),
            &KeyOptions::default(),
            &config(),
        )
        .map_err(|error| OpenError::unreadable(&location, &error))?;
    Ok(opened(repository, &password.value))
}

/// The repository configuration custody creates: restic's format version 2 (compressed),
/// with data packs bounded so that a mover's memory stays bounded whatever the repository's
/// size (restic's own default pack size is 16 MiB).
pub fn config() -> ConfigOptions {
    ConfigOptions::default()
        .set_version(2u32)
        .set_datapack_size_limit(bytesize::ByteSize::mib(16))
}

/// What [`open_or_init`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arrival {
    Opened,
    /// There was no repository: custody created it.
    Created,
}

/// Opens the repository, creating it with the first password when the location holds none.
pub fn open_or_init(
    backends: &RepositoryBackends,
    passwords: &[Password],
) -> Result<(Opened, Arrival), OpenError> {
    match open(backends, passwords) {
        Err(OpenError::NotARepository { .. }) => {
            let mut ordered: Vec<&Password> = passwords.iter().collect();
            ordered.sort_by(|a, b| a.name.cmp(&b.name));
            let first = ordered.first().ok_or(OpenError::NoPassword)?;
            Ok((init(backends, first)?, Arrival::Created))
        }
        other => other.map(|opened| (opened, Arrival::Opened)),
    }
}

/// A key file of the repository, and the Secret key whose password opens it, as custody
/// recorded it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordedKey {
    pub name: String,
    pub key_id: String,
}

/// What to do to bring the repository's key files in step with the Secret.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeyPlan {
    /// Passwords (by name) that open no key file: add one for each.
    pub add: Vec<String>,
    /// Key files custody recorded for passwords no longer in the Secret: remove them.
    pub remove: Vec<RecordedKey>,
    /// What is recorded once the plan is carried out (name → key file).
    pub keep: Vec<RecordedKey>,
}

/// Decides how the key files follow the Secret. `opens` maps each password in the Secret
/// to the key file it opens (`None`: it opens none); `recorded` is what custody recorded
/// before. A key file is removed only when custody recorded it for a password the Secret no
/// longer holds, and never the one the repository was opened with (`in_use`), nor one a
/// password still in the Secret opens: nothing a user added by hand, and never the last way in.
pub fn plan_keys(
    opens: &BTreeMap<String, Option<String>>,
    recorded: &[RecordedKey],
    in_use: &str,
) -> KeyPlan {
    let mut plan = KeyPlan::default();
    for (name, key_id) in opens {
        match key_id {
            Some(key_id) => plan.keep.push(RecordedKey {
                name: name.clone(),
                key_id: key_id.clone(),
            }),
            None => plan.add.push(name.clone()),
        }
    }
    let still_opened: Vec<&String> = opens.values().flatten().collect();
    for key in recorded {
        let removed_from_secret = !opens.contains_key(&key.name);
        if removed_from_secret && key.key_id != in_use && !still_opened.contains(&&key.key_id) {
            plan.remove.push(key.clone());
        }
    }
    plan
}

/// Which key file each password opens (`None`: none). Each password costs one key
/// derivation per key file it is tried against (scrypt).
pub fn key_files_opened(
    backends: &RepositoryBackends,
    passwords: &[Password],
) -> Result<BTreeMap<String, Option<String>>, OpenError> {
    let mut opens = BTreeMap::new();
    for password in passwords {
        let key_id = match open_with(backends, password) {
            Ok(opened) => Some(opened.key_id.to_hex().to_string()),
            Err(OpenError::KeyRejected { .. }) => None,
            Err(other) => return Err(other),
        };
        opens.insert(password.name.clone(), key_id);
    }
    Ok(opens)
}

/// Carries out a key plan on an open repository; returns what is recorded afterwards.
pub fn apply_keys(
    opened: &Opened,
    passwords: &[Password],
    plan: &KeyPlan,
) -> Result<Vec<RecordedKey>, OpenError> {
    let location = opened.repository.name.clone();
    let mut recorded = plan.keep.clone();
    for name in &plan.add {
        let Some(password) = passwords.iter().find(|password| &password.name == name) else {
            continue;
        };
        let key_id = opened
            .repository
            .add_key(&password.value, &KeyOptions::default())
            .map_err(|error| OpenError::unreadable(&location, &error))?;
        recorded.push(RecordedKey {
            name: name.clone(),
            key_id: key_id.to_hex().to_string(),
        });
    }
    for key in &plan.remove {
        let key_id: KeyId = key
            .key_id
            .parse::<rustic_core::Id>()
            .map_err(|error| OpenError::unreadable(&location, &error))?
            .into();
        opened
            .repository
            .delete_key(&key_id)
            .map_err(|error| OpenError::unreadable(&location, &error))?;
    }
    recorded.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(recorded)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opens(pairs: &[(&str, Option<&str>)]) -> BTreeMap<String, Option<String>> {
        pairs
            .iter()
            .map(|(name, id)| (name.to_string(), id.map(str::to_string)))
            .collect()
    }

    fn key(name: &str, key_id: &str) -> RecordedKey {
        RecordedKey {
            name: name.into(),
            key_id: key_id.into(),
        }
    }

    #[test]
    fn key_files_follow_the_secret() {
        struct Case {
            what: &'static str,
            opens: BTreeMap<String, Option<String>>,
            recorded: Vec<RecordedKey>,
            in_use: &'static str,
            add: Vec<&'static str>,
            remove: Vec<RecordedKey>,
        }
        let cases = [
            Case {
                what: "one password that opens: nothing to do",
                opens: opens(&[("old", Some("k1"))]),
                recorded: vec![key("old", "k1")],
                in_use: "k1",
                add: vec![],
                remove: vec![],
            },
            Case {
                what: "a new password is added as a key file",
                opens: opens(&[("new", None), ("old", Some("k1"))]),
                recorded: vec![key("old", "k1")],
                in_use: "k1",
                add: vec!["new"],
                remove: vec![],
            },
            Case {
                what: "the old password removed from the Secret: its key file goes",
                opens: opens(&[("new", Some("k2"))]),
                recorded: vec![key("new", "k2"), key("old", "k1")],
                in_use: "k2",
                add: vec![],
                remove: vec![key("old", "k1")],
            },
            Case {
                what: "never the key file the repository is open with",
                opens: opens(&[("new", Some("k2"))]),
                recorded: vec![key("old", "k2")],
                in_use: "k2",
                add: vec![],
                remove: vec![],
            },
            Case {
                what: "a renamed password keeps its key file",
                opens: opens(&[("renamed", Some("k1"))]),
                recorded: vec![key("old", "k1")],
                in_use: "k1",
                add: vec![],
                remove: vec![],
            },
            Case {
                what: "key files custody never recorded (added with restic) are left alone",
                opens: opens(&[("old", Some("k1"))]),
                recorded: vec![],
                in_use: "k1",
                add: vec![],
                remove: vec![],
            },
        ];
        for case in cases {
            let plan = plan_keys(&case.opens, &case.recorded, case.in_use);
            assert_eq!(plan.add, case.add, "{}", case.what);
            assert_eq!(plan.remove, case.remove, "{}", case.what);
            let kept: Vec<_> = case
                .opens
                .iter()
                .filter_map(|(name, id)| id.as_ref().map(|id| key(name, id)))
                .collect();
            assert_eq!(plan.keep, kept, "{}", case.what);
        }
    }
}
