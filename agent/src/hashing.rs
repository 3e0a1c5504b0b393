//! BLAKE3 of file content, from an already-opened descriptor (never by path, so nothing can
//! be swapped in between the checks and the read).

use std::cell::RefCell;
use std::fs::File;
use std::io::{self, Read};

/// Files at least this large are hashed with several threads.
pub const PARALLEL_THRESHOLD: u64 = 1 << 20;
/// Files at least this large are read on a thread of their own while the previous chunk is
/// hashed, so that copying out of the page cache overlaps hashing.
pub const OVERLAP_THRESHOLD: u64 = 64 << 20;
const LARGE_BUFFER: usize = 8 << 20;
const SMALL_BUFFER: usize = 256 << 10;
const OVERLAP_BUFFER: usize = 4 << 20;
const OVERLAP_BUFFERS: usize = 3;

thread_local! {
    static BUFFER: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Hashes everything `file` yields from its current position; returns the hash and the number
/// of bytes read. `expected_size` only chooses the strategy.
pub fn hash_file(file: &mut File, expected_size: u64) -> io::Result<(blake3::Hash, u64)> {
    if expected_size >= OVERLAP_THRESHOLD {
        return hash_overlapped(file);
    }
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

/// Reads chunks on a scoped thread while this one hashes the chunk before, with a few
/// buffers passed back and forth.
fn hash_overlapped(file: &mut File) -> io::Result<(blake3::Hash, u64)> {
    let (full_sender, full) = std::sync::mpsc::sync_channel::<(Vec<u8>, usize)>(OVERLAP_BUFFERS);
    let (empty_sender, empty) = std::sync::mpsc::sync_channel::<Vec<u8>>(OVERLAP_BUFFERS);
    for _ in 0..OVERLAP_BUFFERS {
        // Cannot fail: the channel has room for every buffer.
        let _ = empty_sender.send(vec![0; OVERLAP_BUFFER]);
    }
    std::thread::scope(|scope| {
        let reader = scope.spawn(move || -> io::Result<()> {
            // The hashing side hangs up only when it is done, so a closed channel ends the read.
            while let Ok(mut buffer) = empty.recv() {
                let filled = fill(file, &mut buffer)?;
                let last = filled < buffer.len();
                if full_sender.send((buffer, filled)).is_err() || last {
                    break;
                }
            }
            Ok(())
        });
        let mut hasher = blake3::Hasher::new();
        let mut total = 0u64;
        for (buffer, filled) in full {
            hasher.update_rayon(&buffer[..filled]);
            total += filled as u64;
            let _ = empty_sender.send(buffer);
        }
        drop(empty_sender);
        reader
            .join()
            .map_err(|_| io::Error::other("the reading thread panicked"))??;
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Seek, Write};

    /// Every strategy gives the reference hash and the byte count actually read, whatever
    /// size the caller expected.
    #[test]
    fn every_strategy_hashes_what_the_file_holds() {
        let content: Vec<u8> = (0..(OVERLAP_THRESHOLD as usize + (3 << 20) + 17))
            .map(|index| (index * 131 % 253) as u8)
            .collect();
        for (length, expected_size) in [
            (0, 0),
            (1000, 1000),
            (PARALLEL_THRESHOLD as usize + 5, PARALLEL_THRESHOLD + 5),
            (content.len(), content.len() as u64),
            // Sizes that lie: the strategy changes, the answer does not.
            (1000, OVERLAP_THRESHOLD * 2),
            (content.len(), 10),
        ] {
            let mut part = tempfile::tempfile().unwrap();
            part.write_all(&content[..length]).unwrap();
            part.rewind().unwrap();
            let (hash, read) = hash_file(&mut part, expected_size).unwrap();
            assert_eq!(
                read, length as u64,
                "{length} bytes, expected {expected_size}"
            );
            assert_eq!(hash, blake3::hash(&content[..length]), "{length} bytes");
        }
    }
}
