//! custody's repository format v2: restic's documented repository format, read and written by
//! rustic_core, in a BackupRepository's bucket.

pub mod backend;
pub mod blocks;
pub mod check;
pub mod chunker;
pub mod crypto;
pub mod index_file;
pub mod listing;
pub mod memory;
pub mod open;
pub mod prune;
pub mod snapshot;
pub mod writer;

/// Test data: `size` incompressible pseudo-random bytes (xorshift) from `seed`, the same for
/// the same seed.
#[cfg(test)]
pub(crate) fn test_bytes(size: usize, seed: u64) -> Vec<u8> {
    // Odd, so never the zero state (which would give only zeros).
    let mut state = seed * 2 + 1;
    (0..size)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}
