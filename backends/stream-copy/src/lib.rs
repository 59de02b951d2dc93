//! The CPU copy of a write into a peer's memory mapped here (the staged shm channel's, UCX's
//! direct writes), with streaming (non-temporal) stores where a write cannot stay in the cache
//! anyway.
//!
//! A plain `memcpy` into memory no cache holds reads every destination line before writing it
//! (read for ownership). On the 2-core machine, copying 64 MiB between two memfds in 16 KiB
//! pieces ran at 7.3–10.4 GB/s with `memcpy` and 12.4–14.1 GB/s with streaming stores, 1 MiB
//! pieces 7.9–13.0 against 13.6–14.2 (one process per run): the streaming copy is faster, flat
//! in the piece's size, and varies less from one process to the next. It is wrong for bytes that
//! are about to be read again: a 64 KiB block written again and again stays in the writer's L2
//! at several times that rate. So a connection streams only a write that continues a run of
//! adjacent writes past [`STREAM_AFTER_BYTES`] ([`Run`]).
//!
//! ```
//! use rdma_hint_stream_copy::{copy_slice, Run};
//!
//! let (source, mut target) = (vec![7u8; 8 << 20], vec![0u8; 8 << 20]);
//! let mut run = Run::default();
//! for (from, to) in source.chunks(16 << 10).zip(target.chunks_mut(16 << 10)) {
//!     // The first 4 MiB of the run are copied plainly, the rest streamed.
//!     let stream = run.streams(to.as_ptr() as usize, to.len() as u64);
//!     copy_slice(from, to, stream);
//! }
//! run.fence(); // before the peer is told
//! assert!(!run.unfenced());
//! assert_eq!(source, target);
//! ```
//!
//! Streaming stores are weakly ordered: they may be seen after stores that follow them. The
//! [`Run`] keeps the order. A write it answers "plain" first fences the streamed ones before it,
//! and [`Run::fence`] must run before anything tells the peer the bytes are there (an
//! announcement, a completion, a hand-off to another thread).

/// How many bytes of adjacent writes a connection makes before its copies stream: past the
/// writer's own L2 (2 MiB on the H200 host, 4 MiB on the 2-core VM). A single write longer than
/// this streams whole: it cannot stay in that cache either.
pub const STREAM_AFTER_BYTES: u64 = 4 << 20;

/// Smaller copies are not worth their fence.
pub const STREAM_MIN_BYTES: u64 = 4096;

/// Where a connection's writes have been landing, by destination address: a write that starts
/// at or after the previous one's end, within [`RUN_GAP_BLOCKS`] of its own length (one lane of
/// several takes every n-th block), continues the run; any other starts a new one. It also
/// tracks whether streamed stores are still unfenced.
#[derive(Debug, Default)]
pub struct Run {
    end: usize,
    bytes: u64,
    unfenced: bool,
}

/// How far ahead of the previous write's end, in that write's lengths, a write still continues
/// a run.
pub const RUN_GAP_BLOCKS: u64 = 16;

impl Run {
    /// Records a write of `len` bytes to `destination` (its address); whether its copy should
    /// stream. A write that is not to stream first fences the streamed stores before it, so its
    /// plain stores cannot be seen before them.
    pub fn streams(&mut self, destination: usize, len: u64) -> bool {
        let ahead = (destination as u64).checked_sub(self.end as u64);
        let continues = ahead.is_some_and(|gap| gap <= len.saturating_mul(RUN_GAP_BLOCKS));
        self.bytes = if continues { self.bytes.saturating_add(len) } else { len };
        self.end = destination.saturating_add(usize::try_from(len).unwrap_or(usize::MAX));
        let stream =
            cfg!(target_arch = "x86_64") && self.bytes > STREAM_AFTER_BYTES && len >= STREAM_MIN_BYTES;
        if stream {
            self.unfenced = true;
        } else {
            self.fence();
        }
        stream
    }

    /// Orders the streamed stores so far before every store that follows (call it before the
    /// bytes are announced, completed or handed to another thread).
    pub fn fence(&mut self) {
        if std::mem::take(&mut self.unfenced) {
            fence();
        }
    }

    /// Whether streamed stores may still be unfenced.
    pub fn unfenced(&self) -> bool {
        self.unfenced
    }
}

impl Drop for Run {
    /// A connection's stores are ordered before whatever its end tells the peer.
    fn drop(&mut self) {
        self.fence();
    }
}

/// Copies `len` bytes from `source` to `destination`, with streaming stores if `stream` (x86-64;
/// elsewhere always plainly). Fence (the [`Run`]'s, or [`fence`]) before the bytes are announced.
///
/// # Safety
/// `source` must be valid for reads and `destination` for writes of `len` bytes, and the two
/// ranges may overlap only if `stream` is false.
pub unsafe fn copy(source: *const u8, destination: *mut u8, len: usize, stream: bool) {
    #[cfg(target_arch = "x86_64")]
    if stream {
        // SAFETY: the caller's contract; the ranges do not overlap when `stream` is set.
        unsafe { x86::stream(source, destination, len) };
        return;
    }
    let _ = stream;
    // SAFETY: the caller's contract; `ptr::copy` tolerates overlap.
    unsafe { std::ptr::copy(source, destination, len) };
}

/// [`copy`] between two slices (which cannot overlap). Fence ([`Run::fence`] or [`fence`]) before
/// anyone is told the bytes are there: once per batch of copies, not per copy (at 16 KiB pieces
/// a fence after each cost the 2-core VM a third of the streamed rate).
///
/// # Panics
/// If the slices differ in length.
pub fn copy_slice(source: &[u8], destination: &mut [u8], stream: bool) {
    assert_eq!(source.len(), destination.len(), "copy_slice: lengths differ");
    // SAFETY: two slices of the same length, one shared and one unique: valid and disjoint.
    unsafe { copy(source.as_ptr(), destination.as_mut_ptr(), source.len(), stream) };
}

/// Orders every streaming store before the stores that follow it (the announcement's).
pub fn fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `sfence` has no operands and no preconditions; SSE is part of x86_64.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::{
        __m128i, __m256i, _mm256_loadu_si256, _mm256_stream_si256, _mm_loadu_si128, _mm_stream_si128,
    };
    use std::sync::OnceLock;

    /// Copies with streaming stores: plain copies up to the destination's first cache-line
    /// boundary and after its last, streamed whole lines in between (a line written partly by
    /// streaming stores costs the memory a read-modify-write: a 16-byte offset halved the rate).
    ///
    /// # Safety
    /// As [`super::copy`] with `stream`: valid, non-overlapping ranges of `len` bytes.
    pub(super) unsafe fn stream(source: *const u8, destination: *mut u8, len: usize) {
        static AVX: OnceLock<bool> = OnceLock::new();
        let avx = *AVX.get_or_init(|| std::arch::is_x86_feature_detected!("avx"));
        // SAFETY: the caller's contract; `avx` only where the CPU has it.
        unsafe { stream_using(source, destination, len, avx) };
    }

    /// [`stream`] with the AVX kernel or the SSE2 one.
    ///
    /// # Safety
    /// As [`stream`]; `avx` only where the CPU has AVX.
    pub(super) unsafe fn stream_using(source: *const u8, destination: *mut u8, len: usize, avx: bool) {
        let head = destination.align_offset(64).min(len);
        let body = (len - head) / 64 * 64;
        // SAFETY: head + body + tail == len: every piece lies in the caller's ranges, and the
        // body starts at a 64-byte boundary of the destination.
        unsafe {
            std::ptr::copy_nonoverlapping(source, destination, head);
            let (from, to) = (source.add(head), destination.add(head));
            if avx {
                stream_avx(from, to, body);
            } else {
                stream_sse2(from, to, body);
            }
            let done = head + body;
            std::ptr::copy_nonoverlapping(source.add(done), destination.add(done), len - done);
        }
    }

    /// # Safety
    /// `to` is 64-byte aligned, `len` a multiple of 64, both ranges valid; AVX is available.
    #[target_feature(enable = "avx")]
    unsafe fn stream_avx(from: *const u8, to: *mut u8, len: usize) {
        for at in (0..len).step_by(64) {
            // SAFETY: `at + 64 <= len`; loads are unaligned, stores 32-byte aligned (`to` is 64-byte aligned).
            unsafe {
                let low = _mm256_loadu_si256(from.add(at).cast::<__m256i>());
                let high = _mm256_loadu_si256(from.add(at + 32).cast::<__m256i>());
                _mm256_stream_si256(to.add(at).cast::<__m256i>(), low);
                _mm256_stream_si256(to.add(at + 32).cast::<__m256i>(), high);
            }
        }
    }

    /// # Safety
    /// `to` is 64-byte aligned, `len` a multiple of 64, both ranges valid.
    unsafe fn stream_sse2(from: *const u8, to: *mut u8, len: usize) {
        for at in (0..len).step_by(16) {
            // SAFETY: `at + 16 <= len`; loads are unaligned, stores 16-byte aligned (`to` is 64-byte aligned).
            unsafe {
                _mm_stream_si128(
                    to.add(at).cast::<__m128i>(),
                    _mm_loadu_si128(from.add(at).cast::<__m128i>()),
                )
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_adjacent_writes_past_the_threshold_stream() {
        let block = 16usize << 10;
        let blocks = (STREAM_AFTER_BYTES as usize) / block;
        let base = 1usize << 40;
        let mut run = Run::default();
        for i in 0..blocks {
            assert!(!run.streams(base + i * block, block as u64), "block {i} is within the threshold");
        }
        assert!(run.streams(base + blocks * block, block as u64));
        // The same bytes again (a ping-pong) start a new run; so does a write far ahead.
        assert!(!run.streams(base, block as u64));
        let mut run = Run::default();
        for i in 0..=blocks {
            run.streams(base + i * block, block as u64);
        }
        assert!(!run.streams(base + (blocks + 1 + 17) * block, block as u64));
        // Every fourth block (one lane of four) continues a run.
        let mut run = Run::default();
        let streamed =
            (0..4 * blocks + 8).step_by(4).map(|i| run.streams(base + i * block, block as u64)).last();
        assert_eq!(streamed, Some(true));
    }

    #[test]
    fn a_run_fences_before_a_plain_write_and_on_request() {
        let base = 1usize << 40;
        let mut run = Run::default();
        // One write past the threshold streams whole; a small one never streams.
        assert!(run.streams(base, STREAM_AFTER_BYTES + 4096) == cfg!(target_arch = "x86_64"));
        assert_eq!(run.unfenced(), cfg!(target_arch = "x86_64"));
        let next = base + STREAM_AFTER_BYTES as usize + 4096;
        assert!(!run.streams(next, STREAM_MIN_BYTES - 1), "below the smallest streamed copy");
        assert!(!run.unfenced(), "a plain write fences the streamed ones before it");
        run.streams(next + 4095, 1 << 20);
        run.fence();
        assert!(!run.unfenced());
    }

    /// Every kernel this CPU has, at every alignment the head and tail logic distinguishes.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn a_streamed_copy_moves_every_byte_at_any_alignment() {
        let source: Vec<u8> = (0..70_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        let kernels =
            [false, true].into_iter().filter(|&avx| !avx || std::arch::is_x86_feature_detected!("avx"));
        for avx in kernels {
            for (from, to, len) in
                [(0, 0, 65_536), (3, 5, 60_001), (17, 0, 4096), (0, 31, 4097), (1, 1, 100), (0, 63, 64)]
            {
                let mut destination = vec![0u8; 70_000];
                // SAFETY: both ranges lie in their own vectors; AVX only where detected.
                unsafe {
                    x86::stream_using(source.as_ptr().add(from), destination.as_mut_ptr().add(to), len, avx)
                };
                fence();
                assert_eq!(&destination[to..to + len], &source[from..from + len], "{avx} {from} {to} {len}");
                assert!(destination[..to].iter().chain(&destination[to + len..]).all(|&b| b == 0));
            }
        }
    }
}
