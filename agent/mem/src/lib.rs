//! `memcpy`, `memmove`, `memset`, `memcmp` and `bcmp` for custody's static musl binaries.
//!
//! musl's x86_64 `memcpy` copies up to seven bytes one `movsb` at a time on each side of a
//! `rep movsq`, and its `memcmp` compares one byte at a time. Rust calls them for nearly every
//! short copy and comparison (a string, a node, a 32-byte block ID in an index search): an
//! unchanged backup of the benchmark set makes 2.3 million `memcpy` calls of 130 bytes on
//! average and 5.4 million `memcmp` calls of 15, and its walk spent a third of its CPU in the
//! two. These do the short ones with a few unaligned loads and stores, as glibc does, and hand
//! long copies to `rep movsb`.
//!
//! The binary's own definitions are the ones linked (before musl's `libc.a`), for Rust's code,
//! musl's and mimalloc's alike; they are exported only in musl builds. The crate is
//! `no_builtins`: LLVM must not turn a loop here back into a call to `memcpy`.
#![cfg_attr(not(test), no_std)]
#![no_builtins]

/// Copies at least this long go to `rep movsb` (fast on every x86_64 with ERMS; below it, the
/// instruction's start-up costs more than a loop of 16-byte moves).
const REP_MOVSB_FROM: usize = 2048;

#[inline(always)]
unsafe fn load<T: Copy>(at: *const u8) -> T {
    // SAFETY: the caller gives `size_of::<T>()` readable bytes at `at`.
    unsafe { at.cast::<T>().read_unaligned() }
}

#[inline(always)]
unsafe fn store<T>(at: *mut u8, value: T) {
    // SAFETY: the caller gives `size_of::<T>()` writable bytes at `at`.
    unsafe { at.cast::<T>().write_unaligned(value) }
}

/// Copies `n <= 32` bytes, every load before any store: any overlap is allowed.
#[inline(always)]
unsafe fn copy_short(dest: *mut u8, src: *const u8, n: usize) {
    // SAFETY (all): `n` bytes are readable at `src` and writable at `dest`; each access lies
    // within the first `n` (the two of a pair may overlap each other).
    unsafe {
        if n >= 16 {
            let (head, tail) = (load::<u128>(src), load::<u128>(src.add(n - 16)));
            store(dest, head);
            store(dest.add(n - 16), tail);
        } else if n >= 8 {
            let (head, tail) = (load::<u64>(src), load::<u64>(src.add(n - 8)));
            store(dest, head);
            store(dest.add(n - 8), tail);
        } else if n >= 4 {
            let (head, tail) = (load::<u32>(src), load::<u32>(src.add(n - 4)));
            store(dest, head);
            store(dest.add(n - 4), tail);
        } else if n >= 2 {
            let (head, tail) = (load::<u16>(src), load::<u16>(src.add(n - 2)));
            store(dest, head);
            store(dest.add(n - 2), tail);
        } else if n == 1 {
            store(dest, load::<u8>(src));
        }
    }
}

/// Copies `n > 32` bytes front to back, 16 at a time; `dest` may overlap `src` only when it
/// is below it (each block is loaded before it is stored, and the stores stay behind the
/// loads; the last 16 bytes are loaded first).
#[inline(always)]
unsafe fn copy_forward_blocks(dest: *mut u8, src: *const u8, n: usize) {
    // SAFETY (all): within the `n` bytes the caller gives.
    unsafe {
        let tail = load::<u128>(src.add(n - 16));
        let mut at = 0;
        while at + 16 < n {
            store(dest.add(at), load::<u128>(src.add(at)));
            at += 16;
        }
        store(dest.add(n - 16), tail);
    }
}

/// Copies `n > 32` bytes back to front, 16 at a time; `dest` may overlap `src` only when it
/// is above it (the first 16 bytes are loaded first).
#[inline(always)]
unsafe fn copy_backward_blocks(dest: *mut u8, src: *const u8, n: usize) {
    // SAFETY (all): within the `n` bytes the caller gives.
    unsafe {
        let head = load::<u128>(src);
        let mut end = n;
        while end > 16 {
            end -= 16;
            store(dest.add(end), load::<u128>(src.add(end)));
        }
        store(dest, head);
    }
}

/// Copies `n` bytes front to back with `rep movsb` (correct for a `dest` below an overlapping
/// `src`: the instruction moves byte by byte in effect).
#[inline(always)]
unsafe fn copy_rep(dest: *mut u8, src: *const u8, n: usize) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `n` bytes readable at `src` and writable at `dest`; the direction flag is clear
    // (the ABI's state at any call).
    unsafe {
        core::arch::asm!(
            "rep movsb",
            inout("rcx") n => _,
            inout("rdi") dest => _,
            inout("rsi") src => _,
            options(nostack, preserves_flags)
        );
    }
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: as the caller's.
    unsafe {
        copy_forward_blocks(dest, src, n)
    }
}

/// `memcpy`: `dest` and `src` do not overlap.
///
/// # Safety
/// `n` bytes readable at `src`, writable at `dest`, not overlapping.
pub unsafe fn copy(dest: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    // SAFETY: as the caller's.
    unsafe {
        if n <= 32 {
            copy_short(dest, src, n);
        } else if n < REP_MOVSB_FROM {
            copy_forward_blocks(dest, src, n);
        } else {
            copy_rep(dest, src, n);
        }
    }
    dest
}

/// `memmove`: `dest` and `src` may overlap.
///
/// # Safety
/// `n` bytes readable at `src` and writable at `dest`.
pub unsafe fn copy_overlapping(dest: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    // SAFETY: as the caller's; each path is correct for the overlap it is taken with.
    unsafe {
        if n <= 32 {
            copy_short(dest, src, n);
        } else if (dest as usize).wrapping_sub(src as usize) >= n {
            // `dest` is below `src`, or past its end: front to back never reads a byte it wrote.
            if n < REP_MOVSB_FROM {
                copy_forward_blocks(dest, src, n);
            } else {
                copy_rep(dest, src, n);
            }
        } else {
            copy_backward_blocks(dest, src, n);
        }
    }
    dest
}

/// `memset`.
///
/// # Safety
/// `n` bytes writable at `dest`.
pub unsafe fn fill(dest: *mut u8, byte: u8, n: usize) -> *mut u8 {
    let wide = u64::from(byte) * 0x0101_0101_0101_0101;
    // SAFETY (all): within the `n` bytes the caller gives.
    unsafe {
        if n >= 32 {
            let block = u128::from(wide) | (u128::from(wide) << 64);
            if n >= REP_MOVSB_FROM {
                fill_rep(dest, byte, n);
            } else {
                let mut at = 0;
                while at + 16 < n {
                    store(dest.add(at), block);
                    at += 16;
                }
                store(dest.add(n - 16), block);
            }
        } else if n >= 16 {
            let block = u128::from(wide) | (u128::from(wide) << 64);
            store(dest, block);
            store(dest.add(n - 16), block);
        } else if n >= 8 {
            store(dest, wide);
            store(dest.add(n - 8), wide);
        } else if n >= 4 {
            store(dest, wide as u32);
            store(dest.add(n - 4), wide as u32);
        } else if n >= 2 {
            store(dest, wide as u16);
            store(dest.add(n - 2), wide as u16);
        } else if n == 1 {
            store(dest, byte);
        }
    }
    dest
}

#[inline(always)]
unsafe fn fill_rep(dest: *mut u8, byte: u8, n: usize) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `n` bytes writable at `dest`; the direction flag is clear.
    unsafe {
        core::arch::asm!(
            "rep stosb",
            inout("rcx") n => _,
            inout("rdi") dest => _,
            in("al") byte,
            options(nostack, preserves_flags)
        );
    }
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: as the caller's.
    unsafe {
        let mut at = 0;
        while at < n {
            store(dest.add(at), byte);
            at += 1;
        }
    }
}

/// The order of two different 8-byte words as loaded from memory, as `memcmp` orders their
/// bytes (the first byte first).
#[inline(always)]
fn order(a: u64, b: u64) -> i32 {
    if u64::from_be(a) < u64::from_be(b) {
        -1
    } else {
        1
    }
}

/// `memcmp`: negative, zero or positive as the first differing byte of `a` is below, absent
/// or above `b`'s.
///
/// # Safety
/// `n` bytes readable at `a` and at `b`.
pub unsafe fn compare(a: *const u8, b: *const u8, n: usize) -> i32 {
    // SAFETY (all): within the `n` bytes the caller gives.
    unsafe {
        if n >= 8 {
            let mut at = 0;
            while at + 8 < n {
                let (x, y) = (load::<u64>(a.add(at)), load::<u64>(b.add(at)));
                if x != y {
                    return order(x, y);
                }
                at += 8;
            }
            // The last 8 bytes (they may go over bytes already found equal).
            let (x, y) = (load::<u64>(a.add(n - 8)), load::<u64>(b.add(n - 8)));
            return if x == y { 0 } else { order(x, y) };
        }
        if n >= 4 {
            // The first four bytes and the last four in one number each, first byte highest.
            let word = |at: *const u8| {
                (u64::from(u32::from_be(load::<u32>(at))) << 32)
                    | u64::from(u32::from_be(load::<u32>(at.add(n - 4))))
            };
            let (x, y) = (word(a), word(b));
            return if x < y { -1 } else { i32::from(x > y) };
        }
        let mut at = 0;
        while at < n {
            let (x, y) = (load::<u8>(a.add(at)), load::<u8>(b.add(at)));
            if x != y {
                return i32::from(x) - i32::from(y);
            }
            at += 1;
        }
        0
    }
}

/// `bcmp`: zero when the `n` bytes are the same, non-zero otherwise.
///
/// # Safety
/// `n` bytes readable at `a` and at `b`.
pub unsafe fn differ(a: *const u8, b: *const u8, n: usize) -> i32 {
    // SAFETY (all): within the `n` bytes the caller gives.
    unsafe {
        if n >= 8 {
            let mut at = 0;
            while at + 8 < n {
                if load::<u64>(a.add(at)) != load::<u64>(b.add(at)) {
                    return 1;
                }
                at += 8;
            }
            return i32::from(load::<u64>(a.add(n - 8)) != load::<u64>(b.add(n - 8)));
        }
        if n >= 4 {
            let x = load::<u32>(a) ^ load::<u32>(b);
            let y = load::<u32>(a.add(n - 4)) ^ load::<u32>(b.add(n - 4));
            return i32::from(x | y != 0);
        }
        let mut at = 0;
        while at < n {
            if load::<u8>(a.add(at)) != load::<u8>(b.add(at)) {
                return 1;
            }
            at += 1;
        }
        0
    }
}

/// The C symbols, in musl builds only (elsewhere the C library's are good).
#[cfg(all(target_env = "musl", not(test)))]
mod exported {
    use core::ffi::c_int;

    /// # Safety
    /// C's `memcpy`.
    #[unsafe(no_mangle)]
    pub unsafe extern "C" fn memcpy(dest: *mut u8, src: *const u8, n: usize) -> *mut u8 {
        // SAFETY: C's contract.
        unsafe { super::copy(dest, src, n) }
    }

    /// # Safety
    /// C's `memmove`.
    #[unsafe(no_mangle)]
    pub unsafe extern "C" fn memmove(dest: *mut u8, src: *const u8, n: usize) -> *mut u8 {
        // SAFETY: C's contract.
        unsafe { super::copy_overlapping(dest, src, n) }
    }

    /// # Safety
    /// C's `memset`.
    #[unsafe(no_mangle)]
    pub unsafe extern "C" fn memset(dest: *mut u8, byte: c_int, n: usize) -> *mut u8 {
        // SAFETY: C's contract.
        unsafe { super::fill(dest, byte as u8, n) }
    }

    /// # Safety
    /// C's `memcmp`.
    #[unsafe(no_mangle)]
    pub unsafe extern "C" fn memcmp(a: *const u8, b: *const u8, n: usize) -> c_int {
        // SAFETY: C's contract.
        unsafe { super::compare(a, b, n) }
    }

    /// # Safety
    /// C's `bcmp`.
    #[unsafe(no_mangle)]
    pub unsafe extern "C" fn bcmp(a: *const u8, b: *const u8, n: usize) -> c_int {
        // SAFETY: C's contract.
        unsafe { super::differ(a, b, n) }
    }
}

#[cfg(test)]
mod tests;
