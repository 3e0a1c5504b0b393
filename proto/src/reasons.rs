//! Failure reasons that cross from one binary to another (the mover's result, the agent's
//! volume reports). Each is an enum both sides use; a reason text this build does not know
//! (from an older or newer peer) parses to the enum's named fallback, and the reader logs it.
//! The texts are CamelCase words, used as condition reasons and Event reasons.

/// Declares a reason enum with its texts and a fallback for unknown texts.
macro_rules! reasons {
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $( $(#[$variant_meta:meta])* $variant:ident, )*
        }
        fallback $(#[$fallback_meta:meta])* $fallback:ident;
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name {
            $( $(#[$variant_meta])* $variant, )*
            $(#[$fallback_meta])*
            $fallback,
        }

        impl $name {
            /// Every reason, the fallback last.
            pub const ALL: &'static [$name] = &[$($name::$variant,)* $name::$fallback];

            /// The CamelCase text.
            pub fn as_str(self) -> &'static str {
                match self {
                    $( $name::$variant => stringify!($variant), )*
                    $name::$fallback => stringify!($fallback),
                }
            }

            /// The reason a text names; the fallback for a text this build does not know.
            pub fn parse(text: &str) -> Self {
                Self::known(text).unwrap_or($name::$fallback)
            }

            /// The reason a text names, if this build knows it.
            pub fn known(text: &str) -> Option<Self> {
                Self::ALL.iter().copied().find(|reason| reason.as_str() == text)
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                formatter.write_str(self.as_str())
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.as_str())
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
                Ok(Self::parse(&text))
            }
        }
    };
}

reasons! {
    /// Why a restored volume is not verified: found by the agent (verification, the volume on
    /// the node, the Restore and Backup it reads) and reported to the controller and to
    /// `custody-wait`.
    pub enum VolumeFailure {
        /// A file, directory or symlink differs from the manifest, or something is extra.
        ContentMismatch,
        /// No manifest on the volume.
        ManifestMissing,
        /// The manifest names another Backup.
        ManifestOfAnotherBackup,
        /// The manifest's BLAKE3 is not the one the Backup recorded.
        ManifestTampered,
        /// The manifest cannot be read.
        ManifestInvalid,
        /// No restore identity beside the manifest.
        RestoreIdentityMissing,
        /// The restore identity names another Restore.
        WrittenByAnotherRestore,
        /// The restore identity names another Backup.
        RestoreIdentityOfAnotherBackup,
        /// The volume could not be read.
        VolumeUnreadable,
        /// The pod's volume name cannot be a directory name.
        InvalidVolumeName,
        /// The pod's volume is not under the kubelet root.
        VolumeNotFound,
        /// More than one directory could be the pod's volume.
        VolumeAmbiguous,
        /// The volume directory is not a mount point (the data would be the node's disk).
        NotAMountPoint,
        /// The volume is a pseudo filesystem (tmpfs, ...), not persistent storage.
        NotAPersistentFilesystem,
        /// Verification stopped before it finished.
        VerificationAborted,
        /// The Restore the pod names does not exist.
        RestoreNotFound,
        /// The Restore of that name has another UID than the pod's.
        RestoreReplaced,
        /// The Restore's Backup does not exist.
        BackupNotFound,
        /// The Restore's Backup has no recorded manifest hash.
        BackupIncomplete,
        /// The prepareData pod that writes the volume failed.
        PrepareDataFailed,
        /// The pod's restore annotations cannot be read.
        InvalidRestoreAnnotations,
        /// The Restore's status records the volume failed for good (its Job gave up, its
        /// deadline passed, ...): the controller's reason is in the message.
        RestoreFailed,
    }
    fallback
    /// A reason this build does not know.
    VerificationFailed;
}

reasons! {
    /// Why `custody-mover` failed, from its result.
    pub enum MoverFailure {
        /// The application's backup tool exited with an error while it wrote its stream: what
        /// it wrote is not a backup.
        ToolFailed,
        /// The repository's credentials are not in the environment.
        CredentialsMissing,
        /// The repository's settings (CA bundle, ...) cannot make a client.
        InvalidRepository,
        /// The volume could not be read.
        ReadVolumeFailed,
        /// A symlink on the volume leads out of it (such as `pg_wal` on another volume): the
        /// backup could never be restored and verified.
        SymlinkLeavesVolume,
        /// The upload failed (and was aborted).
        UploadFailed,
        /// A local file could not be read or written (scratch space, result file, ...).
        LocalError,
        /// The artifact or its manifest could not be downloaded.
        DownloadFailed,
        /// The artifact or its manifest is not in the repository (404): deleted behind
        /// custody's back.
        ArtifactMissing,
        /// The manifest in the repository is not the one the Backup recorded.
        ManifestTampered,
        /// The manifest names another Backup.
        ManifestOfAnotherBackup,
        /// The manifest cannot be read.
        ManifestInvalid,
        /// The restore target is not empty.
        TargetNotEmpty,
        /// The archive does not match its manifest.
        ArchiveDoesNotMatchManifest,
        /// The archive is larger than its manifest accounts for.
        ArchiveTooLarge,
        /// The archive cannot be decompressed or read.
        ArchiveUnreadable,
        /// The restore target could not be written.
        WriteFailed,
        /// `--manifest-hash` is not a BLAKE3 hash.
        InvalidManifestHash,
        /// The mover was stopped by a signal.
        Interrupted,
        /// `verify` found the directory not matching (the message names the verification
        /// reason).
        VerificationFailed,
        /// The node agent would not freeze the volume (the message says why).
        FreezeRefused,
        /// The volume was thawed before it was all read (the bound passed, the agent stopped
        /// or the connection to it dropped): the copy would not be a point in time.
        FreezeLost,
        /// The repository password does not open the repository: nothing was read or written.
        RepositoryKeyRejected,
        /// There is no repository where the BackupRepository says (no config file), or it is
        /// another repository than the one recorded.
        RepositoryMissing,
        /// The repository could not be read (the server, the network): worth trying again.
        RepositoryUnreadable,
        /// The snapshot is gone, unfinished, not custody's, or not the one recorded.
        SnapshotInvalid,
        /// The backup was not saved: it ran past the deadline a prune's grace allows, or a
        /// prune removed blocks it reused (the message says which). Trying again reads the
        /// repository's index anew.
        SnapshotNotSecured,
        /// The backup tool left more on disk than its `scratchSize`: nothing was read.
        ToolOutputTooLarge,
        /// The restore target has less room than the backup's files take: nothing was written.
        TargetTooSmall,
    }
    fallback
    /// A reason this build does not know.
    MoverFailed;
}

impl MoverFailure {
    /// Whether trying again cannot help: the artifact, its manifest, the target or the
    /// settings are wrong, not the moment. A restore's Job gives up at once on these (the mover
    /// exits with [`crate::mover::EXIT_PERMANENT`]); anything else (a download that kept
    /// failing, a write error, a signal, a crash) is tried again by the Job, and the retried
    /// mover recognises its own unfinished output and starts clean.
    pub fn permanent(self) -> bool {
        match self {
            MoverFailure::CredentialsMissing
            | MoverFailure::InvalidRepository
            | MoverFailure::SymlinkLeavesVolume
            | MoverFailure::ArtifactMissing
            | MoverFailure::ManifestTampered
            | MoverFailure::ManifestOfAnotherBackup
            | MoverFailure::ManifestInvalid
            | MoverFailure::TargetNotEmpty
            | MoverFailure::ArchiveDoesNotMatchManifest
            | MoverFailure::ArchiveTooLarge
            | MoverFailure::ArchiveUnreadable
            | MoverFailure::InvalidManifestHash
            | MoverFailure::VerificationFailed
            | MoverFailure::FreezeRefused
            | MoverFailure::RepositoryKeyRejected
            | MoverFailure::RepositoryMissing
            | MoverFailure::SnapshotInvalid
            | MoverFailure::ToolOutputTooLarge
            | MoverFailure::TargetTooSmall
            | MoverFailure::MoverFailed => true,
            MoverFailure::ReadVolumeFailed
            | MoverFailure::ToolFailed
            | MoverFailure::UploadFailed
            | MoverFailure::LocalError
            | MoverFailure::DownloadFailed
            | MoverFailure::WriteFailed
            | MoverFailure::Interrupted
            | MoverFailure::FreezeLost
            | MoverFailure::RepositoryUnreadable
            | MoverFailure::SnapshotNotSecured => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_failures_of_the_moment_are_tried_again() {
        let again: Vec<&str> = MoverFailure::ALL
            .iter()
            .filter(|reason| !reason.permanent())
            .map(|reason| reason.as_str())
            .collect();
        assert_eq!(
            again,
            [
                "ToolFailed",
                "ReadVolumeFailed",
                "UploadFailed",
                "LocalError",
                "DownloadFailed",
                "WriteFailed",
                "Interrupted",
                "FreezeLost",
                "RepositoryUnreadable",
                "SnapshotNotSecured"
            ]
        );
        assert!(MoverFailure::parse("SomethingNew").permanent());
    }

    #[test]
    fn texts_round_trip_and_unknown_texts_fall_back() {
        for reason in VolumeFailure::ALL {
            assert_eq!(VolumeFailure::parse(reason.as_str()), *reason);
        }
        for reason in MoverFailure::ALL {
            assert_eq!(MoverFailure::parse(reason.as_str()), *reason);
        }
        assert_eq!(
            VolumeFailure::parse("ContentMismatch"),
            VolumeFailure::ContentMismatch
        );
        assert_eq!(
            VolumeFailure::parse("Anything Else"),
            VolumeFailure::VerificationFailed
        );
        assert_eq!(VolumeFailure::known("Anything Else"), None);
        assert_eq!(
            MoverFailure::parse("NewerReason"),
            MoverFailure::MoverFailed
        );
        assert_eq!(MoverFailure::parse(""), MoverFailure::MoverFailed);
        let json = serde_json::to_string(&MoverFailure::UploadFailed).unwrap();
        assert_eq!(json, "\"UploadFailed\"");
        let parsed: MoverFailure = serde_json::from_str("\"SomethingNew\"").unwrap();
        assert_eq!(parsed, MoverFailure::MoverFailed);
    }
}
