//! The peer's memory as UCX maps it here (`ucp_rkey_ptr`): over shared memory UCX attaches the
//! segment a packed rkey names, and a write is then one copy by this side's CPU, with no UCX
//! call (and no `process_vm_writev`) on the way.
//!
//! The rkey, address and length come from the peer. UCX turns an address into a pointer by an
//! offset alone, so a peer that advertises more than its segment holds would aim the copy past
//! it, into whatever this process mapped next, and a peer that names one of this side's own
//! segments would aim it into this side's own memory. Both are checked here, against
//! `/proc/self/maps`: the whole range must lie inside one mapping, and that mapping must not be
//! of a segment this side mapped for itself; a range that fails is a handshake error. Only a
//! writable shared System V segment is written directly: no process can shrink one under the
//! writer, where a file the peer may truncate would fault the copy (SIGBUS). Anything else (a
//! POSIX shared-memory file, an rkey UCX cannot map directly: TCP, caller memory reached
//! through CMA) leaves the write to `ucp_put_nbx`, whose copy the kernel checks.

use crate::status::status_text;
use rdma_hint_core::TransportError;
use rdma_hint_oob::handshake_error;
use rdma_hint_ucx_sys as sys;
use std::io::BufRead;

/// Lines of `/proc/self/maps` read at most (a process has far fewer mappings; the bound keeps
/// a pathological one from making the handshake slow).
const MAX_MAPS_LINES: usize = 1 << 20;

/// One line of `/proc/self/maps`: the range, whether it is a writable shared mapping, the
/// device and inode (a System V segment's inode is its id), and whether it is one.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Mapping {
    start: u64,
    end: u64,
    shared_writable: bool,
    file: (String, u64),
    sysv: bool,
}

fn parse(line: &str) -> Option<Mapping> {
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
    })
}

fn mappings() -> Result<Vec<Mapping>, TransportError> {
    let maps = std::fs::File::open("/proc/self/maps").map_err(|e| {
        handshake_error(format!("cannot read /proc/self/maps to check the peer's mapping: {e}"))
    })?;
    Ok(std::io::BufReader::new(maps)
        .lines()
        .take(MAX_MAPS_LINES)
        .map_while(Result::ok)
        .filter_map(|line| parse(&line))
        .collect())
}

/// What this side checks a peer's mapped ranges against: the process's mappings, and the
/// segments behind this side's own memory (`own`: base address and length of each).
#[derive(Debug)]
pub(crate) struct Screen {
    maps: Vec<Mapping>,
    own_files: Vec<(String, u64)>,
}

impl Screen {
    /// Reads the mappings now; `own` are this side's regions (and ring).
    pub(crate) fn new(own: &[(u64, u64)]) -> Result<Screen, TransportError> {
        Ok(Screen::from_maps(mappings()?, own))
    }

    fn from_maps(maps: Vec<Mapping>, own: &[(u64, u64)]) -> Screen {
        let own_files = maps
            .iter()
            .filter(|m| {
                m.shared_writable && own.iter().any(|&(base, len)| base < m.end && m.start < base + len)
            })
            .map(|m| m.file.clone())
            .collect();
        Screen { maps, own_files }
    }

    /// Checks that `len` bytes at `pointer` lie inside one mapping that is not one of this
    /// side's own segments; whether it may be written directly (a writable shared System V
    /// segment).
    fn check(&self, pointer: u64, len: u64, what: &str) -> Result<bool, TransportError> {
        let refuse = |why: &str| handshake_error(format!("{what} at {pointer:#x}+{len} B: {why}"));
        let end = pointer.checked_add(len).ok_or_else(|| refuse("the range wraps"))?;
        let mapping = self
            .maps
            .iter()
            .find(|m| m.start <= pointer && pointer < m.end)
            .ok_or_else(|| refuse("UCX mapped no segment there"))?;
        if end > mapping.end {
            return Err(refuse(&format!("runs {} B past the segment UCX mapped", end - mapping.end)));
        }
        if self.own_files.contains(&mapping.file) {
            return Err(refuse("the segment is this side's own memory"));
        }
        Ok(mapping.shared_writable && mapping.sysv)
    }
}

/// Where `len` bytes the peer advertised at `address` (its rkey `rkey`) lie in this process,
/// when UCX maps them directly and they may be written there (see [`Screen`]); `Ok(None)`
/// when not (the write then goes through `ucp_put_nbx`).
pub(crate) fn map_peer(
    rkey: sys::ucp_rkey_h,
    address: u64,
    len: u64,
    screen: &Screen,
    what: &str,
) -> Result<Option<*mut u8>, TransportError> {
    let mut pointer: *mut std::ffi::c_void = std::ptr::null_mut();
    // SAFETY: `rkey` was unpacked on a live endpoint and is not destroyed yet; the call only
    // translates the address (it reads and writes nothing at it).
    let status = unsafe { sys::ucp_rkey_ptr(rkey, address, &mut pointer) };
    if status != sys::UCS_OK || pointer.is_null() {
        tracing::debug!(what, status = %status_text(status), "ucx: not mapped directly");
        return Ok(None);
    }
    Ok(screen.check(pointer as u64, len, what)?.then_some(pointer.cast()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
55d0c0000000-55d0c0021000 rw-p 00000000 00:00 0                          [heap]
7f0000000000-7f0000010000 rw-s 00000000 00:01 42                         /SYSV00000000 (deleted)
7f0000010000-7f0000020000 rw-s 00000000 00:01 43                         /SYSV00000000 (deleted)
7f0000020000-7f0000030000 rw-s 00000000 00:01 42                         /SYSV00000000 (deleted)
7f0000030000-7f0000040000 rw-s 00000000 00:05 77                         /dev/shm/ucx_posix (deleted)
7f0000040000-7f0000050000 r--s 00000000 00:01 44                         /SYSV00000000 (deleted)
";

    /// This side's own memory is the segment with id 42 at 0x7f0000000000.
    fn screen() -> Screen {
        Screen::from_maps(MAPS.lines().filter_map(parse).collect(), &[(0x7f00_0000_0000, 0x1000)])
    }

    #[test]
    fn a_range_inside_a_peer_segment_passes_and_only_a_system_v_one_is_written_directly() {
        assert!(screen().check(0x7f00_0001_0000, 0x10000, "region 0").unwrap());
        assert!(screen().check(0x7f00_0001_f000, 0x1000, "region 0").unwrap());
        // A file the peer may truncate, a read-only segment, the heap: left to UCX's put.
        for pointer in [0x7f00_0003_0000, 0x7f00_0004_0000, 0x55d0_c000_0000] {
            assert!(!screen().check(pointer, 8, "region 0").unwrap(), "{pointer:#x}");
        }
    }

    #[test]
    fn ranges_a_lying_peer_could_aim_the_copy_with_are_refused() {
        let cases = [
            (0x7f00_0001_0000, 0x10001, "past the segment"),
            (0x7f00_0001_0000, u64::MAX, "wraps"),
            (0x7f00_0010_0000, 8, "no segment"),
            // The same segment as this side's own, attached a second time.
            (0x7f00_0002_0000, 8, "own memory"),
            (0x7f00_0000_0000, 8, "own memory"),
        ];
        for (pointer, len, why) in cases {
            let refused = screen().check(pointer, len, "region 0").unwrap_err().to_string();
            assert!(refused.contains(why), "{pointer:#x}+{len}: {refused}");
        }
    }

    #[test]
    fn this_process_maps_parse() {
        let maps = mappings().unwrap();
        assert!(maps.len() > 3, "{maps:?}");
        assert!(maps.iter().all(|m| m.start < m.end));
    }
}
