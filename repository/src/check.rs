//! A repository check: rustic_core's, the same as `restic check` (every index, pack header and
//! snapshot tree; with `read_data_percent`, that share of the packs read whole and every blob
//! in them decrypted and hashed against its ID).

use rustic_core::{CheckOptions, Open, ReadSubsetOption, Repository};

/// At most this many findings are reported one by one (all are counted).
pub const FINDINGS_REPORTED: usize = 20;

/// What a check found.
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CheckReport {
    /// No error found (warnings do not count).
    pub passed: bool,
    /// Problems that mean data may not be restorable.
    pub errors: u64,
    /// Oddities that do not affect the data (an unreferenced pack, say).
    pub warnings: u64,
    /// The first findings, errors first, as rustic_core words them.
    pub findings: Vec<String>,
    /// The share of the packs read whole (0: structure only).
    pub read_data_percent: u8,
}

/// Checks the repository, reading `read_data_percent` % of its packs (chosen at random each
/// time, so that repeated partial checks cover the whole in time).
pub fn check<S: Open>(
    repository: &Repository<S>,
    read_data_percent: u8,
) -> Result<CheckReport, String> {
    let percent = read_data_percent.min(100);
    let mut options = CheckOptions::default();
    options.trust_cache = true;
    options.read_data = percent > 0;
    options.read_data_subset = if percent >= 100 {
        ReadSubsetOption::All
    } else {
        ReadSubsetOption::Percentage(f64::from(percent))
    };
    let results = repository
        .check(options)
        .map_err(|error| error.display_log())?;
    let mut errors = Vec::new();
    let mut warnings = Vec::new();
    for (level, finding) in results.0 {
        // On one line: rustic_core's messages span several.
        let finding = finding
            .to_string()
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        // rustic_core does not export the level's type: its name tells.
        if format!("{level:?}") == "Warn" {
            warnings.push(format!("warning: {finding}"));
        } else {
            errors.push(format!("error: {finding}"));
        }
    }
    Ok(CheckReport {
        passed: errors.is_empty(),
        errors: errors.len() as u64,
        warnings: warnings.len() as u64,
        findings: errors
            .into_iter()
            .chain(warnings)
            .take(FINDINGS_REPORTED)
            .collect(),
        read_data_percent: percent,
    })
}
