//! restic's content-defined chunking, with rustic_core's exact boundaries: a Rabin
//! fingerprint over a 64-byte window with the repository's polynomial; a chunk ends where the
//! fingerprint's low bits are zero, never before the minimum size (512 KiB) nor after the
//! maximum (8 MiB). A file smaller than the minimum is one chunk. Data custody and rustic (or
//! restic) store therefore deduplicates across them.
//!
//! The tables are computed once per chunker (rustic_core computes them for every file, which
//! dominated its time on volumes of many small files), and the rolling loop keeps its state
//! in locals. Each chunk's boundary depends on its own bytes only.

use rustic_cdc::{Polynom, Rabin64};

const WINDOW: usize = 64;
/// Stretches of the rolling fingerprint computed side by side on one core.
const LANES: usize = 4;
/// Lanes are used only when each has at least this many bytes to roll.
const LANE_BYTES_AT_LEAST: usize = 4096;
/// restic's polynomials have degree 53 (the fingerprint's top byte is 45 bits up) and its
/// chunks average 1 MiB.
const RESTIC_SHIFT: i32 = 53 - 8;
const RESTIC_MASK: u64 = (1 << 20) - 1;

/// Where chunks end.
#[derive(Clone)]
pub struct Chunker {
    out_table: [u64; 256],
    mod_table: [u64; 256],
    shift: i32,
    min: usize,
    max: usize,
    mask: u64,
}

impl Chunker {
    /// A chunker for the repository's polynomial and sizes (`average` a power of two).
    pub fn new(polynomial: u64, min: usize, average: usize, max: usize) -> Chunker {
        Chunker {
            out_table: Rabin64::calculate_out_table(WINDOW, &polynomial),
            mod_table: Rabin64::calculate_mod_table(&polynomial),
            shift: polynomial.degree() - 8,
            min: min.max(WINDOW),
            max,
            mask: average as u64 - 1,
        }
    }

    /// The fewest bytes a chunk has, but for a file's last.
    pub fn min(&self) -> usize {
        self.min
    }

    /// The most bytes a chunk has: give [`Chunker::boundary`] this much (or the rest of the
    /// file) and it always finds the end.
    pub fn max(&self) -> usize {
        self.max
    }

    /// Where the chunk that starts `data` ends. `data` holds at least [`Chunker::max`] bytes,
    /// or all that is left of the file.
    pub fn boundary(&self, data: &[u8]) -> usize {
        Scan::new(self)
            .end(data, true)
            .expect("a chunk ends within its maximum or at the end of the file")
    }
}

/// The search for one chunk's end over bytes that arrive in pieces: a reader fills the chunk
/// as it reads and asks again after each read, and the search goes on where it stopped. The
/// same boundaries as [`Chunker::boundary`] on the whole.
pub struct Scan<'c> {
    chunker: &'c Chunker,
    window: [u8; WINDOW],
    hash: u64,
    index: usize,
    /// The next byte of the chunk to roll in; 0 until the minimum size has arrived.
    position: usize,
}

impl<'c> Scan<'c> {
    pub fn new(chunker: &'c Chunker) -> Scan<'c> {
        Scan {
            chunker,
            window: [0u8; WINDOW],
            hash: 0,
            index: WINDOW - 1,
            position: 0,
        }
    }

    /// Where the chunk ends, given its bytes so far (`chunk` starts where the chunk does, and
    /// each call's holds the last one's): `None` while more of the file is needed; `last`
    /// when `chunk` holds all that is left of the file.
    pub fn end(&mut self, chunk: &[u8], last: bool) -> Option<usize> {
        let Chunker {
            out_table,
            mod_table,
            shift,
            min,
            max,
            mask,
        } = self.chunker;
        let (shift, min, max, mask) = (*shift, *min, *max, *mask);
        if self.position == 0 {
            if chunk.len() < min {
                return last.then_some(chunk.len());
            }
            // The window starts with the 63 bytes before the minimum size and a zero
            // (rustic_cdc's prefill).
            let mut hash = 0u64;
            for (slot, &byte) in self.window.iter_mut().zip(&chunk[min - WINDOW..min - 1]) {
                *slot = byte;
                let mod_index = (hash >> shift) & 255;
                hash = ((hash << 8) | u64::from(byte)) ^ mod_table[mod_index as usize];
            }
            self.hash = hash;
            self.position = min;
        }
        let end = chunk.len().min(max);
        let (mut hash, mut index, mut position) = (self.hash, self.index, self.position);
        // Past the prefill, the fingerprint at a position is that of the 64 bytes before it
        // alone: a long stretch is rolled in lanes side by side (`roll_lanes`), for restic's
        // fingerprint degree (53) and average chunk (1 MiB), the only ones it makes.
        if shift == RESTIC_SHIFT
            && mask == RESTIC_MASK
            && end - position >= LANES * LANE_BYTES_AT_LEAST
        {
            match roll_lanes::<RESTIC_SHIFT, RESTIC_MASK>(
                (out_table, mod_table),
                &chunk[..end],
                position,
                (hash, &mut self.window, index),
            ) {
                Rolled::Boundary(boundary) => {
                    self.position = boundary;
                    return Some(boundary);
                }
                Rolled::Until(at, rolled, at_index) => {
                    (hash, position, index) = (rolled, at, at_index);
                }
            }
        }
        // The rolling loop keeps its state in locals.
        let window = &mut self.window;
        while position < end && hash & mask != 0 {
            let byte = chunk[position];
            hash ^= out_table[window[index] as usize];
            window[index] = byte;
            let mod_index = (hash >> shift) & 255;
            hash = ((hash << 8) | u64::from(byte)) ^ mod_table[mod_index as usize];
            index = (index + 1) & (WINDOW - 1);
            position += 1;
        }
        (self.hash, self.index, self.position) = (hash, index, position);
        let found = hash & mask == 0 || position == max || (last && position == chunk.len());
        found.then_some(position)
    }
}

/// Where lanes stopped: at the chunk's end, or (none found) the last lane's position,
/// fingerprint and window index.
enum Rolled {
    Boundary(usize),
    Until(usize, u64, usize),
}

/// Rolls `chunk[position..]` cut into [`LANES`] lanes side by side: each lane's steps wait on
/// one another, the lanes' do not, so one core rolls several at once (one lane is bound by
/// the latency of its table lookups). The first lane goes on from `hash` and `window`; every
/// other starts from its own 64 bytes, laid out as the first lane's window so that all share
/// its index. The chunk ends at the first boundary of the first lane that has one; with none,
/// `window` becomes the last lane's and its state is returned (a remainder of fewer than
/// [`LANES`] bytes is left to roll).
fn roll_lanes<const SHIFT: i32, const MASK: u64>(
    (out_table, mod_table): (&[u64; 256], &[u64; 256]),
    chunk: &[u8],
    position: usize,
    (hash, window, mut index): (u64, &mut [u8; WINDOW], usize),
) -> Rolled {
    let span = (chunk.len() - position) / LANES;
    let start = |lane: usize| position + lane * span;
    let append = |hash: u64, byte: u8| {
        ((hash << 8) | u64::from(byte)) ^ mod_table[((hash >> SHIFT) & 255) as usize]
    };
    let mut windows = [*window; LANES];
    let mut hashes = [hash; LANES];
    for lane in 1..LANES {
        hashes[lane] = 0;
        for (at, &byte) in chunk[start(lane) - WINDOW..start(lane)].iter().enumerate() {
            windows[lane][(index + at) & (WINDOW - 1)] = byte;
            hashes[lane] = append(hashes[lane], byte);
        }
    }
    let [mut h0, mut h1, mut h2, mut h3] = hashes;
    let [mut w0, mut w1, mut w2, mut w3] = windows;
    let (c0, c1, c2, c3) = (
        &chunk[start(0)..start(1)],
        &chunk[start(1)..start(2)],
        &chunk[start(2)..start(3)],
        &chunk[start(3)..start(3) + span],
    );
    // The lanes after the first that found a boundary, where (the first's ends the chunk).
    let mut found = [usize::MAX; LANES];
    for step in 0..span {
        if (h0 & MASK == 0) | (h1 & MASK == 0) | (h2 & MASK == 0) | (h3 & MASK == 0) {
            if h0 & MASK == 0 {
                return Rolled::Boundary(start(0) + step);
            }
            for (lane, hash) in [(1, h1), (2, h2), (3, h3)] {
                if hash & MASK == 0 && found[lane] == usize::MAX {
                    found[lane] = start(lane) + step;
                }
            }
        }
        let (b0, b1, b2, b3) = (c0[step], c1[step], c2[step], c3[step]);
        h0 = append(h0 ^ out_table[w0[index] as usize], b0);
        h1 = append(h1 ^ out_table[w1[index] as usize], b1);
        h2 = append(h2 ^ out_table[w2[index] as usize], b2);
        h3 = append(h3 ^ out_table[w3[index] as usize], b3);
        (w0[index], w1[index], w2[index], w3[index]) = (b0, b1, b2, b3);
        index = (index + 1) & (WINDOW - 1);
    }
    if let Some(&boundary) = found.iter().find(|&&at| at != usize::MAX) {
        return Rolled::Boundary(boundary);
    }
    *window = w3;
    Rolled::Until(start(3) + span, h3, index)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_bytes;
    use rustic_cdc::RollingHash64;

    const POLYNOMIAL: u64 = 0x3DA3358B4DC173;
    const MIN: usize = 512 << 10;
    const MAX: usize = 8 << 20;

    fn chunks(chunker: &Chunker, data: &[u8]) -> Vec<usize> {
        let mut at = 0;
        let mut lengths = Vec::new();
        while at < data.len() {
            let end = (at + chunker.max()).min(data.len());
            let length = chunker.boundary(&data[at..end]);
            lengths.push(length);
            at += length;
        }
        lengths
    }

    /// rustic_core's chunking (its `ChunkIter`), byte by byte with rustic_cdc's Rabin64, a new
    /// Rabin64 for every file.
    fn rustic_chunks(data: &[u8]) -> Vec<usize> {
        let mut rabin = Rabin64::new_with_polynom(6, &POLYNOMIAL);
        let mut lengths = Vec::new();
        let mut at = 0;
        while at < data.len() {
            let start = at;
            if data.len() - at < MIN {
                lengths.push(data.len() - at);
                break;
            }
            at += MIN;
            rabin.reset_and_prefill_window(&mut data[at - 64..at].iter().copied());
            loop {
                if at - start >= MAX || rabin.hash & ((1 << 20) - 1) == 0 || at == data.len() {
                    break;
                }
                rabin.slide(data[at]);
                at += 1;
            }
            lengths.push(at - start);
        }
        lengths
    }

    #[test]
    fn boundaries_are_rustic_cores() {
        let chunker = Chunker::new(POLYNOMIAL, MIN, 1 << 20, MAX);
        // Several files through one chunker: each as rustic_core chunks it on its own.
        for (size, seed) in [
            (24 << 20, 7),
            (3 << 20, 8),
            (100, 9),
            (MIN, 10),
            (9 << 20, 11),
        ] {
            let data = test_bytes(size, seed);
            assert_eq!(
                chunks(&chunker, &data),
                rustic_chunks(&data),
                "{size} {seed}"
            );
        }
        // Runs of zeros (the low bits of the fingerprint stay zero): the minimum applies.
        let zeros = vec![0u8; 3 << 20];
        assert_eq!(chunks(&chunker, &zeros), rustic_chunks(&zeros));
    }

    #[test]
    fn a_boundary_at_the_start_of_any_lane_is_found_where_rustic_core_finds_it() {
        let chunker = Chunker::new(POLYNOMIAL, MIN, 1 << 20, MAX);
        let data = test_bytes(MAX, 21);
        let first = rustic_chunks(&data)[0];
        assert!(
            first > MIN + LANES * 2 * LANE_BYTES_AT_LEAST && first < MAX,
            "{first}"
        );
        let mut tried = 0;
        // The stretch cut so that lane `lane` starts `before` bytes ahead of the boundary:
        // within its first 64 bytes its fingerprint comes from its own prefill alone.
        for lane in 1..LANES {
            for before in 0..=WINDOW + 2 {
                if !(first - before - MIN).is_multiple_of(lane) {
                    continue;
                }
                let span = (first - before - MIN) / lane;
                let length = MIN + LANES * span;
                assert_eq!(
                    Scan::new(&chunker).end(&data[..length], false),
                    Some(first),
                    "lane {lane}, {before} bytes before"
                );
                tried += 1;
            }
        }
        assert!(tried > WINDOW, "{tried}");
    }

    #[test]
    fn chunks_stay_within_their_bounds_and_find_content_again_after_a_shift() {
        let chunker = Chunker::new(POLYNOMIAL, MIN, 1 << 20, MAX);
        let data = test_bytes(24 << 20, 7);
        let lengths = chunks(&chunker, &data);
        assert_eq!(lengths.iter().sum::<usize>(), data.len());
        let (last, rest) = lengths.split_last().unwrap();
        assert!(rest.iter().all(|length| (MIN..=MAX).contains(length)));
        assert!(*last <= MAX);
        assert!(lengths.len() > 8, "{lengths:?}");
        // Content defined: 1000 bytes inserted at the front shift the data, and after the
        // first boundaries the same chunks come back.
        let mut shifted = test_bytes(1000, 9);
        shifted.extend_from_slice(&data);
        let shifted_lengths = chunks(&chunker, &shifted);
        let tail = |lengths: &[usize]| lengths[3..lengths.len() - 1].to_vec();
        assert_eq!(tail(&shifted_lengths), tail(&lengths));
        // A file below the minimum is one chunk; the same data chunks the same way twice.
        assert_eq!(chunks(&chunker, &data[..1000]), [1000]);
        assert_eq!(chunks(&chunker, &data), lengths);
    }

    #[test]
    fn a_chunk_found_piece_by_piece_ends_where_it_does_whole() {
        let chunker = Chunker::new(POLYNOMIAL, MIN, 1 << 20, MAX);
        let mut pieces = 1u64;
        for (size, seed) in [
            (24 << 20, 7),
            (100, 9),
            (MIN, 10),
            (MIN + 1, 12),
            (9 << 20, 11),
        ] {
            let data = test_bytes(size, seed);
            let zeros = vec![0u8; size];
            for data in [&data, &zeros] {
                let mut lengths = Vec::new();
                let mut at = 0;
                while at < data.len() {
                    // Pieces of changing sizes (1 byte to 1.3 MiB), as reads return them.
                    let mut scan = Scan::new(&chunker);
                    let mut have = 0;
                    let length = loop {
                        pieces = pieces.wrapping_mul(6364136223846793005).wrapping_add(1);
                        have = (have + 1 + (pieces >> 44) as usize % (1300 << 10))
                            .min(data.len() - at);
                        let last = at + have == data.len();
                        if let Some(length) = scan.end(&data[at..at + have], last) {
                            break length;
                        }
                        assert!(!last && have < MAX, "no end at the end of the file");
                    };
                    lengths.push(length);
                    at += length;
                }
                assert_eq!(lengths, chunks(&chunker, data), "{size} {seed}");
            }
        }
    }
}
