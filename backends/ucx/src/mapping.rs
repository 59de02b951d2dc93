//! The peer's memory as UCX maps it here (`ucp_rkey_ptr`): over shared memory UCX attaches the
//! segment a packed rkey names, and a write is then one copy by this side's CPU, with no UCX
//! call (and no `process_vm_writev`) on the way.
//!
//! The rkey, address and length come from the peer, and UCX turns an address into a pointer by
//! an offset alone. A peer that advertises more than its segment holds would aim the copy past
//! it; one that shifts its address would aim it into another mapping of this process (another
//! peer's segment, which its own rkey may unmap while this side still copies, or UCX's own);
//! one that packs an rkey naming this side's own segment would aim it into this side's memory.
//! So the process's mappings are read before the peer's rkeys are unpacked and again after
//! (`/proc/self/smaps`; both reads and the unpacking under one process-wide lock, so no other
//! handshake of this process attaches a segment in between), and every range must lie inside
//! one mapping, of a segment (device and inode) that is none of those behind this side's own
//! regions and ring; a range that fails is a handshake error. Only a range in a mapping the
//! unpacking made (no attachment of that segment was there before), of a writable shared
//! System V segment of base pages, is written directly: no process can shrink one under the
//! writer, where a file the peer may truncate would fault the copy (SIGBUS), as would a
//! huge-page segment whose pages run out. Anything else (a POSIX shared-memory file, a mapping
//! that was there before, an rkey UCX cannot map directly: TCP, caller memory) leaves the
//! write to `ucp_put_nbx` (over these scopes CMA, whose copy the kernel checks).

use crate::status::status_text;
use rdma_hint_core::TransportError;
use rdma_hint_oob::handshake_error;
use rdma_hint_ucx_sys as sys;
use std::io::BufRead;
use std::sync::{Mutex, MutexGuard, PoisonError};

/// Held from the first read of the mappings to the second: this process's other handshakes
/// attach nothing in between.
static SCREENING: Mutex<()> = Mutex::new(());

/// Lines of `/proc/self/smaps` read at most (a process has far fewer; the bound keeps a
/// pathological one from making the handshake slow).
const MAX_SMAPS_LINES: usize = 1 << 22;

/// One mapping of `/proc/self/smaps`: the range, whether it is a writable shared mapping, the
/// device and inode (a System V segment's inode is its id), whether it is a System V segment,
/// and its page size.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Mapping {
    start: u64,
    end: u64,
    shared_writable: bool,
    file: (String, u64),
    sysv: bool,
    page_kib: u64,
}

/// A mapping's header line (the `/proc/self/maps` format), or `None` for its detail lines.
fn parse_header(line: &str) -> Option<Mapping> {
    let mut fields = line.split_whitespace();
    let (start, end) = fields.next()?.split_once('-')?;
    let perms = fields.next()?;
    let _offset = fields.next()?;
    let device = fields.next()?.to_string();
    let inode = fields.next()?.parse().ok()?;
    let path = fields.next().unwrap_or("");
    Some(Mapping {
        start: u64::from_str_radix(start, 16).ok()?,
        end: u64::from_str_radix(end, 16).ok()?,
        shared_writable: perms.len() == 4 && &perms[1..2] == "w" && &perms[3..4] == "s",
        file: (device, inode),
        sysv: path.starts_with("/SYSV"),
        page_kib: 0,
    })
}

/// The mappings of an smaps text, each with its `KernelPageSize`.
fn parse(lines: impl Iterator<Item = String>) -> Vec<Mapping> {
    let mut maps: Vec<Mapping> = Vec::new();
    for line in lines {
        if let Some(size) = line.strip_prefix("KernelPageSize:") {
            if let (Some(last), Some(kib)) = (maps.last_mut(), size.split_whitespace().next()) {
                last.page_kib = kib.parse().unwrap_or(0);
            }
        } else if let Some(mapping) = parse_header(&line) {
            maps.push(mapping);
        }
    }
    maps
}

fn mappings() -> Result<Vec<Mapping>, TransportError> {
    let smaps = std::fs::File::open("/proc/self/smaps").map_err(|e| {
        handshake_error(format!("cannot read /proc/self/smaps to check the peer's mapping: {e}"))
    })?;
    Ok(parse(std::io::BufReader::new(smaps).lines().take(MAX_SMAPS_LINES).map_while(Result::ok)))
}

/// The base page size in KiB.
fn base_page_kib() -> u64 {
    // SAFETY: sysconf reads a constant of the system; it touches no memory of ours.
    let bytes = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(bytes).unwrap_or(4096) / 1024
}

/// The process's mappings before the peer's rkeys were unpacked, and the segments behind this
/// side's own memory: what the ranges UCX maps for the peer are checked against.
#[derive(Debug)]
pub(crate) struct Screen {
    before: Vec<Mapping>,
    own_files: Vec<(String, u64)>,
    page_kib: u64,
    _screening: Option<MutexGuard<'static, ()>>,
}

impl Screen {
    /// Reads the mappings now, before any of the peer's rkeys is unpacked; `own` are this
    /// side's regions (and ring): base address and length of each.
    pub(crate) fn before_unpacking(own: &[(u64, u64)]) -> Result<Screen, TransportError> {
        let screening = SCREENING.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(Screen { _screening: Some(screening), ..Screen::from_maps(mappings()?, own, base_page_kib()) })
    }

    fn from_maps(before: Vec<Mapping>, own: &[(u64, u64)], page_kib: u64) -> Screen {
        let own_files = before
            .iter()
            .filter(|m| {
                m.shared_writable && own.iter().any(|&(base, len)| base < m.end && m.start < base + len)
            })
            .map(|m| m.file.clone())
            .collect();
        Screen { before, own_files, page_kib, _screening: None }
    }

    /// The mappings now, after the peer's rkeys were unpacked and mapped.
    pub(crate) fn after_unpacking(&self) -> Result<Mapped<'_>, TransportError> {
        Ok(Mapped { screen: self, after: mappings()? })
    }
}

/// The mappings after the unpacking, against those before.
#[derive(Debug)]
pub(crate) struct Mapped<'a> {
    screen: &'a Screen,
    after: Vec<Mapping>,
}

impl Mapped<'_> {
    /// Checks that `len` bytes at `pointer` lie inside one mapping the unpacking made, of a
    /// segment that is not one of this side's own; whether it may be written directly (a
    /// writable shared System V segment of base pages).
    pub(crate) fn check(&self, pointer: *mut u8, len: u64, what: &str) -> Result<bool, TransportError> {
        let pointer = pointer as u64;
        let refuse = |why: &str| handshake_error(format!("{what} at {pointer:#x}+{len} B: {why}"));
        let end = pointer.checked_add(len).ok_or_else(|| refuse("the range wraps"))?;
        let mapping = self
            .after
            .iter()
            .find(|m| m.start <= pointer && pointer < m.end)
            .ok_or_else(|| refuse("UCX mapped no segment there"))?;
        if end > mapping.end {
            return Err(refuse(&format!("runs {} B past the segment UCX mapped", end - mapping.end)));
        }
        if self.screen.own_files.contains(&mapping.file) {
            return Err(refuse("the segment is this side's own memory"));
        }
        // An attachment of the same segment that was there before (where this one lies) is not
        // this unpacking's own: its owner may unmap it while this side copies. A mapper that
        // reuses an attachment puts an honest peer's range there too, so that is the put path,
        // not an error. (A range another mapping left meanwhile, now holding this segment, is
        // this unpacking's.)
        let old = self
            .screen
            .before
            .iter()
            .any(|m| m.start < mapping.end && mapping.start < m.end && m.file == mapping.file);
        Ok(!old && mapping.shared_writable && mapping.sysv && mapping.page_kib == self.screen.page_kib)
    }
}

/// Where `address` (advertised by the peer with its rkey `rkey`) lies in this process, when UCX
/// maps it directly; `None` when it cannot (the write then goes through `ucp_put_nbx`). The
/// pointer is only arithmetic until [`Mapped::check`] vouches for the range behind it.
pub(crate) fn map_peer(rkey: sys::ucp_rkey_h, address: u64, what: &str) -> Option<*mut u8> {
    let mut pointer: *mut std::ffi::c_void = std::ptr::null_mut();
    // SAFETY: `rkey` was unpacked on a live endpoint and is not destroyed yet; the call only
    // translates the address (it reads and writes nothing at it).
    let status = unsafe { sys::ucp_rkey_ptr(rkey, address, &mut pointer) };
    if status != sys::UCS_OK || pointer.is_null() {
        tracing::debug!(what, status = %status_text(status), "ucx: not mapped directly");
        return None;
    }
    Some(pointer.cast())
}

#[cfg(test)]
mod tests {
    use super::*;

    const BEFORE: &str = "\
55d0c0000000-55d0c0021000 rw-p 00000000 00:00 0                          [heap]
KernelPageSize:        4 kB
7f0000000000-7f0000010000 rw-s 00000000 00:01 42                         /SYSV00000000 (deleted)
Size:                 64 kB
KernelPageSize:        4 kB
MMUPageSize:           4 kB
7f0000070000-7f0000080000 rw-s 00000000 00:01 50                         /SYSV00000000 (deleted)
KernelPageSize:        4 kB
";
    /// After the unpacking: the peer's segment 43, a second attachment of this side's own
    /// segment 42, a POSIX file, a read-only segment and a huge-page one are new.
    const NEW: &str = "\
7f0000010000-7f0000020000 rw-s 00000000 00:01 43                         /SYSV00000000 (deleted)
KernelPageSize:        4 kB
7f0000020000-7f0000030000 rw-s 00000000 00:01 42                         /SYSV00000000 (deleted)
KernelPageSize:        4 kB
7f0000030000-7f0000040000 rw-s 00000000 00:05 77                         /dev/shm/ucx_posix (deleted)
KernelPageSize:        4 kB
7f0000040000-7f0000050000 r--s 00000000 00:01 44                         /SYSV00000000 (deleted)
KernelPageSize:        4 kB
7f0000200000-7f0000400000 rw-s 00000000 00:0f 45                         /SYSV00000000 (deleted)
KernelPageSize:     2048 kB
";

    fn maps(text: &str) -> Vec<Mapping> {
        parse(text.lines().map(str::to_string))
    }

    /// This side's own memory is the segment with id 42 at 0x7f0000000000.
    fn check(pointer: u64, len: u64) -> Result<bool, TransportError> {
        let screen = Screen::from_maps(maps(BEFORE), &[(0x7f00_0000_0000, 0x1000)], 4);
        let after = [maps(BEFORE), maps(NEW)].concat();
        Mapped { screen: &screen, after }.check(pointer as *mut u8, len, "region 0")
    }

    #[test]
    fn a_range_in_a_segment_the_unpacking_made_passes_and_only_a_system_v_one_is_written_directly() {
        assert!(check(0x7f00_0001_0000, 0x10000).unwrap());
        assert!(check(0x7f00_0001_f000, 0x1000).unwrap());
        // A file the peer may truncate, a read-only segment, huge pages, and mappings that were
        // there before (another peer's segment, the heap): left to UCX's put.
        for pointer in
            [0x7f00_0003_0000, 0x7f00_0004_0000, 0x7f00_0020_0000, 0x7f00_0007_0000, 0x55d0_c000_0000]
        {
            assert!(!check(pointer, 8).unwrap(), "{pointer:#x}");
        }
    }

    #[test]
    fn ranges_a_lying_peer_could_aim_the_copy_with_are_refused() {
        let cases = [
            (0x7f00_0001_0000, 0x10001, "past the segment"),
            (0x7f00_0001_0000, u64::MAX, "wraps"),
            (0x7f00_0010_0000, 8, "no segment"),
            // The same segment as this side's own, attached a second time, or the original.
            (0x7f00_0002_0000, 8, "own memory"),
            (0x7f00_0000_0000, 8, "own memory"),
        ];
        for (pointer, len, why) in cases {
            let refused = check(pointer, len).unwrap_err().to_string();
            assert!(refused.contains(why), "{pointer:#x}+{len}: {refused}");
        }
    }

    #[test]
    fn this_process_mappings_parse_with_their_page_sizes() {
        let maps = mappings().unwrap();
        assert!(maps.len() > 3, "{maps:?}");
        assert!(maps.iter().all(|m| m.start < m.end));
        assert!(maps.iter().any(|m| m.page_kib == base_page_kib()), "{maps:?}");
    }
}
