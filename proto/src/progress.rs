//! How far a mover has come: what it writes into its pod's scratch volume every few seconds,
//! what the node agent reads there and reports, and the words people read it in.
//!
//! The path needs no privilege beyond what each part has: the mover writes a file in its own
//! `emptyDir`, the agent reads it under the kubelet's root (which it reads already to verify
//! restored volumes), and the report service hears it with the agent's other news.

use serde::{Deserialize, Serialize};

/// The environment variable naming the file the mover writes its progress to.
pub const ENV_FILE: &str = "CUSTODY_PROGRESS_FILE";
/// The file's name, in the mover pod's scratch volume.
pub const FILE_NAME: &str = "custody-progress.json";
/// A progress file larger than this is not read (a few hundred bytes are written).
pub const MAX_FILE_BYTES: u64 = 4096;
/// How often the mover writes its progress.
pub const WRITE_EVERY_SECONDS: u64 = 2;

/// One moment of a mover's run, as written to [`FILE_NAME`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Progress {
    /// `backup` or `restore`.
    pub operation: String,
    /// The volume being read or written now (a backup reads its volumes one after another).
    #[serde(default)]
    pub volume: String,
    /// Content bytes read and stored (a backup; an unchanged file counts whole) or written
    /// and hashed (a restore).
    pub bytes_done: u64,
    pub files_done: u64,
    /// The totals, once known: a restore knows them from the manifest at once; a backup
    /// counts its volumes while it reads them (not beside a frozen read: then never).
    #[serde(default)]
    pub bytes_total: Option<u64>,
    #[serde(default)]
    pub files_total: Option<u64>,
    /// Bytes uploaded to the repository so far (after deduplication, compression and
    /// encryption; a backup only). A backup reads ahead of its uploads by what its writer
    /// buffers: its uploads still moving are progress too.
    #[serde(default)]
    pub bytes_sent: u64,
}

impl Progress {
    /// Parses a progress file's content; `None` for anything else.
    pub fn parse(content: &[u8]) -> Option<Progress> {
        if content.len() as u64 > MAX_FILE_BYTES {
            return None;
        }
        let progress: Progress = serde_json::from_slice(content).ok()?;
        (progress.operation.len() <= 16 && progress.volume.len() <= 253).then_some(progress)
    }

    /// `1.5 GiB of 4.0 GiB (37%), 120 of 300 files, 800.0 MiB uploaded`.
    pub fn summary(&self) -> String {
        with_sent(
            summary(
                self.bytes_done,
                self.bytes_total,
                self.files_done,
                self.files_total,
            ),
            self.bytes_sent,
        )
    }
}

/// `1.5 GiB of 4.0 GiB (37%), 120 of 300 files`; a total not known is `?`.
pub fn summary(
    bytes_done: u64,
    bytes_total: Option<u64>,
    files_done: u64,
    files_total: Option<u64>,
) -> String {
    let bytes = match bytes_total {
        Some(total) if total > 0 => format!(
            "{} of {} ({}%)",
            human_bytes(bytes_done),
            human_bytes(total),
            (u128::from(bytes_done.min(total)) * 100 / u128::from(total))
        ),
        Some(_) => format!("{} of {}", human_bytes(bytes_done), human_bytes(0)),
        None => format!("{} of ?", human_bytes(bytes_done)),
    };
    let files = match files_total {
        Some(total) => format!("{files_done} of {total} files"),
        None => format!("{files_done} files"),
    };
    format!("{bytes}, {files}")
}

/// `summary` with the bytes uploaded, when any were.
pub fn with_sent(summary: String, bytes_sent: u64) -> String {
    if bytes_sent == 0 {
        return summary;
    }
    format!("{summary}, {} uploaded", human_bytes(bytes_sent))
}

/// Bytes in binary units with one decimal: `512 B`, `1.0 KiB`, `12.3 GiB`.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    // 1023.95 KiB and above would print as 1024.0: say the next unit instead.
    if value >= 1023.95 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_read_in_binary_units() {
        for (bytes, text) in [
            (0, "0 B"),
            (1023, "1023 B"),
            (1024, "1.0 KiB"),
            (1536, "1.5 KiB"),
            (1024 * 1024 - 1, "1.0 MiB"),
            (5 * 1024 * 1024 * 1024 + 300 * 1024 * 1024, "5.3 GiB"),
            (u64::MAX, "16.0 EiB"),
        ] {
            assert_eq!(human_bytes(bytes), text, "{bytes}");
        }
    }

    #[test]
    fn a_summary_says_done_of_total_or_that_the_total_is_being_counted() {
        let gib = 1024 * 1024 * 1024;
        for (done, total, files, files_total, text) in [
            (
                gib,
                Some(4 * gib),
                120,
                Some(300),
                "1.0 GiB of 4.0 GiB (25%), 120 of 300 files",
            ),
            (gib, None, 7, None, "1.0 GiB of ?, 7 files"),
            (0, Some(0), 0, Some(0), "0 B of 0 B, 0 of 0 files"),
            // Written past a total (a file grew while counted): never more than 100%.
            (
                5 * gib,
                Some(4 * gib),
                1,
                Some(1),
                "5.0 GiB of 4.0 GiB (100%), 1 of 1 files",
            ),
            (
                u64::MAX,
                Some(u64::MAX),
                0,
                Some(0),
                "16.0 EiB of 16.0 EiB (100%), 0 of 0 files",
            ),
        ] {
            assert_eq!(summary(done, total, files, files_total), text);
        }
    }

    #[test]
    fn the_bytes_uploaded_are_said_once_there_are_some() {
        let progress = Progress {
            operation: "backup".into(),
            bytes_done: 2048,
            bytes_total: Some(4096),
            files_done: 1,
            files_total: Some(2),
            ..Progress::default()
        };
        assert_eq!(progress.summary(), "2.0 KiB of 4.0 KiB (50%), 1 of 2 files");
        let sending = Progress {
            bytes_sent: 1536,
            ..progress
        };
        assert_eq!(
            sending.summary(),
            "2.0 KiB of 4.0 KiB (50%), 1 of 2 files, 1.5 KiB uploaded"
        );
    }

    #[test]
    fn only_a_small_well_formed_file_is_read() {
        let written = Progress {
            operation: "backup".into(),
            volume: "data".into(),
            bytes_done: 10,
            files_done: 1,
            bytes_total: Some(20),
            files_total: None,
            bytes_sent: 0,
        };
        let bytes = serde_json::to_vec(&written).unwrap();
        assert_eq!(Progress::parse(&bytes), Some(written.clone()));
        assert_eq!(Progress::parse(b"not json"), None);
        let mut padded = bytes.clone();
        padded.resize(MAX_FILE_BYTES as usize + 1, b' ');
        assert_eq!(Progress::parse(&padded), None);
        let long_volume = Progress {
            volume: "v".repeat(254),
            ..written
        };
        assert_eq!(
            Progress::parse(&serde_json::to_vec(&long_volume).unwrap()),
            None
        );
    }
}
