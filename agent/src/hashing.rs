//! BLAKE3 of file content, from an already-opened descriptor (never by path, so nothing can
//! be swapped in between the checks and the read).

use std::cell::RefCell;
use std::fs::File;
use std::io::{self, Read};

/// Files at least this large are hashed with several threads.
pub const PARALLEL_THRESHOLD: u64 = 1 << 20;
const LARGE_BUFFER: usize = 8 << 20;
const SMALL_BUFFER: usize = 256 << 10;

thread_local! {
    static BUFFER: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Hashes everything `file` yields from its current position; returns the hash and the number
/// of bytes read. `expected_size` only chooses the strategy.
pub fn hash_file(file: &mut File, expected_size: u64) -> io::Result<(blake3::Hash, u64)> {
    let parallel = expected_size >= PARALLEL_THRESHOLD;
    BUFFER.with_borrow_mut(|buffer| {
        let wanted = if parallel { LARGE_BUFFER } else { SMALL_BUFFER };
        if buffer.len() < wanted {
            buffer.resize(wanted, 0);
        }
        let buffer = &mut buffer[..wanted];
        let mut hasher = blake3::Hasher::new();
        let mut total = 0u64;
        loop {
            let filled = fill(file, buffer)?;
            if filled == 0 {
                break;
            }
            if parallel {
                hasher.update_rayon(&buffer[..filled]);
            } else {
                hasher.update(&buffer[..filled]);
            }
            total += filled as u64;
            if filled < buffer.len() {
                break;
            }
        }
        Ok((hasher.finalize(), total))
    })
}

// Reads until the buffer is full or the file ends.
fn fill(file: &mut File, buffer: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buffer.len() {
        match file.read(&mut buffer[filled..]) {
            Ok(0) => break,
            Ok(read) => filled += read,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    Ok(filled)
}
