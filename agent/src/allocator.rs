//! The mover's memory allocator: mimalloc (the binary declares it), set up to give memory
//! back as soon as it is freed.
//!
//! musl's allocator, which the static mover used before, maps and unmaps memory for most
//! blocks it hands out and takes back. On the benchmark set (same session, alternating runs):
//! the first backup took 7.4–8.6 s, 4.2–5.8 s of it system time, under musl and 6.4–7.0 s
//! (3.5–3.9 s) under mimalloc; a backup of the unchanged set 0.52–0.58 s against 0.43–0.48 s.
//!
//! Memory: with mimalloc's defaults (freed memory kept for a second, arenas committed at
//! once) a restore peaked at about 200 MiB resident; with the two options below at 73 MiB, and at
//! 62–65 MiB once mimalloc is also built without its 4 MiB pages for blocks of 64–512 KiB
//! (each thread keeps one per block size: `.cargo/config.toml`), against 60–61 MiB under
//! musl. The restore's read-ahead and the backup's packs were made smaller to stay within
//! the mover's 64 MiB (see `AHEAD_PLAIN_BYTES` and `WriterOptions::data_pack_bytes`).

/// mimalloc's `mi_option_e` as its v3 `mimalloc.h` numbers them (libmimalloc-sys names only
/// some of them).
const ARENA_EAGER_COMMIT: libmimalloc_sys::mi_option_t = 4;
const PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Freed memory goes back to the system at once, and arenas are committed as they are used.
/// The first thing `main` does.
#[allow(unsafe_code)]
pub fn give_back_at_once() {
    // SAFETY: `mi_option_set` stores a value in mimalloc's option table, which any thread may
    // do at any time.
    unsafe {
        libmimalloc_sys::mi_option_set(PURGE_DELAY, 0);
        libmimalloc_sys::mi_option_set(ARENA_EAGER_COMMIT, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The numbers name the options meant: their defaults (1000 ms, and 2: "on overcommitting
    /// systems") are what mimalloc reports for them before any is set. A mimalloc whose
    /// numbering moved fails here rather than set two other options.
    #[test]
    #[allow(unsafe_code)]
    fn the_option_numbers_are_purge_delay_and_arena_eager_commit() {
        if std::env::vars().any(|(name, _)| name.starts_with("MIMALLOC_")) {
            eprintln!("skipped: MIMALLOC_* set in the environment changes the defaults");
            return;
        }
        // SAFETY: reading an option.
        let (delay, eager) = unsafe {
            (
                libmimalloc_sys::mi_option_get(PURGE_DELAY),
                libmimalloc_sys::mi_option_get(ARENA_EAGER_COMMIT),
            )
        };
        assert_eq!((delay, eager), (1000, 2));
    }
}
