//! The hint cache's files as a trust boundary. The cache directory comes from the environment
//! and may be shared with, or planted by, another user; what it holds decides the block size
//! every transfer uses. So:
//!
//! * only an absolute `RDMA_HINT_CACHE_DIR`, `XDG_CACHE_HOME` or `HOME` names it (an empty or
//!   relative one is ignored, as the XDG spec says), and an existing directory is used only if
//!   it is this user's and nobody else can write it; a new one is created 0700. Otherwise the
//!   library runs without a cache and says so once;
//! * the directory is opened once per read or write, without following a link
//!   (`O_DIRECTORY | O_NOFOLLOW`), and its owner and mode are checked on that descriptor
//!   (`fstat`); its files are opened relative to it (`openat`), so a path flipped between the
//!   check and the open (a link swapped in by whoever owns a parent) is never followed;
//! * a file is read only if it is a regular file of this user that nobody else can write
//!   (opened without following a link, and without blocking on a fifo) of at most
//!   [`MAX_CACHE_FILE_BYTES`];
//! * a file is written through a fresh temporary file of a random name, created exclusively
//!   without following links, mode 0600, then renamed over the old one in the same directory.

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use std::fs::{DirBuilder, File};
use std::hash::{BuildHasher, Hasher};
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

/// The largest cache file read: thousands of entries; anything larger is not ours.
pub(crate) const MAX_CACHE_FILE_BYTES: u64 = 1 << 20;

/// The cache directory, when one is configured and safe to use.
pub(crate) fn cache_dir() -> Option<PathBuf> {
    let dir = configured_dir()?;
    let checked = match open_dir(&dir) {
        Ok(_) => Ok(()),
        Err(DirError::Missing) => Ok(()),
        Err(DirError::Refused(why)) => Err(why),
    };
    match checked {
        Ok(()) => Some(dir),
        Err(why) => {
            static WARNED: std::sync::Once = std::sync::Once::new();
            WARNED.call_once(|| {
                tracing::warn!(dir = %dir.display(), why, "rdma-hint: not using this hint cache directory; hints come from the model and calibrations are not kept");
            });
            None
        }
    }
}

fn absolute_var(name: &str) -> Option<PathBuf> {
    let path = PathBuf::from(std::env::var_os(name)?);
    path.is_absolute().then_some(path)
}

fn configured_dir() -> Option<PathBuf> {
    absolute_var("RDMA_HINT_CACHE_DIR")
        .or_else(|| absolute_var("XDG_CACHE_HOME").map(|dir| dir.join("rdma-hint")))
        .or_else(|| absolute_var("HOME").map(|home| home.join(".cache/rdma-hint")))
}

/// Why a cache directory was not opened.
#[derive(Debug)]
enum DirError {
    /// It does not exist (yet): fine, it is created when first written.
    Missing,
    /// It exists and must not be used.
    Refused(String),
}

/// Opens `dir` itself, never through a link in its last component, and checks on the open
/// descriptor that it is a directory of this user that neither its group nor others can
/// write. Every later open is relative to this descriptor, so what was checked is what is
/// used.
fn open_dir(dir: &Path) -> Result<OwnedFd, DirError> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let fd = match rustix::fs::open(dir, flags, Mode::empty()) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT) => return Err(DirError::Missing),
        // O_DIRECTORY with O_NOFOLLOW answers ENOTDIR for a link, even to a directory.
        Err(rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR) => {
            let link = std::fs::symlink_metadata(dir).is_ok_and(|m| m.file_type().is_symlink());
            return Err(DirError::Refused(if link { "a symbolic link" } else { "not a directory" }.into()));
        }
        Err(error) => return Err(DirError::Refused(format!("cannot open it: {error}"))),
    };
    let stat = rustix::fs::fstat(&fd).map_err(|e| DirError::Refused(format!("cannot read it: {e}")))?;
    let me = rustix::process::geteuid().as_raw();
    if stat.st_uid != me {
        return Err(DirError::Refused(format!("owned by uid {}, not by this user (uid {me})", stat.st_uid)));
    }
    if stat.st_mode & 0o022 != 0 {
        return Err(DirError::Refused(format!("writable by others (mode {:o})", stat.st_mode & 0o7777)));
    }
    Ok(fd)
}

/// `path`'s directory and file name.
fn split(path: &Path) -> std::io::Result<(&Path, &std::ffi::OsStr)> {
    let dir = path.parent().filter(|dir| !dir.as_os_str().is_empty());
    match (dir, path.file_name()) {
        (Some(dir), Some(name)) => Ok((dir, name)),
        _ => Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{}: not a file in a directory", path.display()),
        )),
    }
}

/// The bytes of cache file `path`: `None` when it or its directory does not exist, or (with a
/// warning that names it) when the directory is not one to trust, or the file is not a
/// regular file of this user, is a link, or is larger than [`MAX_CACHE_FILE_BYTES`].
pub(crate) fn read(path: &Path) -> Option<Vec<u8>> {
    let refuse = |why: &dyn std::fmt::Display| {
        tracing::warn!(file = %path.display(), %why, "rdma-hint: ignoring a hint cache file");
        None
    };
    let (dir, name) = match split(path) {
        Ok(parts) => parts,
        Err(error) => return refuse(&error),
    };
    let dir = match open_dir(dir) {
        Ok(dir) => dir,
        Err(DirError::Missing) => return None,
        Err(DirError::Refused(why)) => return refuse(&format!("its directory: {why}")),
    };
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
    let file = match rustix::fs::openat(&dir, name, flags, Mode::empty()) {
        Ok(fd) => File::from(fd),
        Err(rustix::io::Errno::NOENT) => return None,
        Err(rustix::io::Errno::LOOP) => return refuse(&"a symbolic link"),
        Err(error) => return refuse(&std::io::Error::from(error)),
    };
    let stat = match rustix::fs::fstat(&file) {
        Ok(stat) => stat,
        Err(error) => return refuse(&std::io::Error::from(error)),
    };
    if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
        return refuse(&"not a regular file");
    }
    let me = rustix::process::geteuid().as_raw();
    if stat.st_uid != me {
        return refuse(&format!("owned by uid {}, not by this user (uid {me})", stat.st_uid));
    }
    if stat.st_mode & 0o022 != 0 {
        return refuse(&format!("writable by others (mode {:o})", stat.st_mode & 0o7777));
    }
    let len = u64::try_from(stat.st_size).unwrap_or(u64::MAX);
    if len > MAX_CACHE_FILE_BYTES {
        return refuse(&format!("{len} bytes, more than the {MAX_CACHE_FILE_BYTES} a cache file may hold"));
    }
    let mut bytes = Vec::with_capacity(len as usize);
    if let Err(error) = file.take(MAX_CACHE_FILE_BYTES + 1).read_to_end(&mut bytes) {
        return refuse(&error);
    }
    if bytes.len() as u64 > MAX_CACHE_FILE_BYTES {
        return refuse(&format!("grew past the {MAX_CACHE_FILE_BYTES} bytes a cache file may hold"));
    }
    Some(bytes)
}

/// Replaces cache file `path` by `bytes`: a fresh temporary file beside it (random name,
/// created exclusively, no link followed, mode 0600), renamed over it, both relative to the
/// directory opened and checked once. Creates the directory (0700) first if needed, and
/// refuses one another user could have prepared.
pub(crate) fn write(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let (dir_path, name) = split(path)?;
    DirBuilder::new().recursive(true).mode(0o700).create(dir_path)?;
    let dir = open_dir(dir_path).map_err(|error| {
        let why = match error {
            DirError::Missing => "vanished after it was created".to_string(),
            DirError::Refused(why) => why,
        };
        std::io::Error::new(std::io::ErrorKind::PermissionDenied, format!("{}: {why}", dir_path.display()))
    })?;
    let (temporary, mut file) = create_temporary(&dir, &name.to_string_lossy())?;
    let written = file
        .write_all(bytes)
        .and_then(|()| file.sync_data())
        .and_then(|()| rustix::fs::renameat(&dir, &temporary, &dir, name).map_err(std::io::Error::from));
    if written.is_err() {
        let _ = rustix::fs::unlinkat(&dir, &temporary, AtFlags::empty());
    }
    written
}

/// A new file `.NAME.RANDOM.tmp` in `dir` that nobody else created first.
fn create_temporary(dir: &OwnedFd, name: &str) -> std::io::Result<(String, File)> {
    let mut last = None;
    for attempt in 0..16u64 {
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u64(attempt);
        hasher.write_u32(std::process::id());
        let temporary = format!(".{name}.{:016x}.tmp", hasher.finish());
        let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        match rustix::fs::openat(dir, temporary.as_str(), flags, Mode::from_raw_mode(0o600)) {
            Ok(fd) => return Ok((temporary, File::from(fd))),
            Err(rustix::io::Errno::EXIST) => last = Some(std::io::Error::from(rustix::io::Errno::EXIST)),
            Err(error) => return Err(error.into()),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no temporary name was free")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_refuse_links_fifos_and_oversized_files() {
        let dir = std::env::temp_dir().join(format!("rdma-hint-cache-files-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("measured.json");
        write(&file, b"[]").unwrap();
        assert_eq!(read(&file).unwrap(), b"[]");
        assert_eq!(std::os::unix::fs::MetadataExt::mode(&std::fs::metadata(&file).unwrap()) & 0o777, 0o600);
        let link = dir.join("link.json");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        assert!(read(&link).is_none(), "a link is not followed");
        let zero = dir.join("zero.json");
        std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
        assert!(read(&zero).is_none());
        assert!(read(Path::new("/dev/zero")).is_none(), "a device is not a regular file");
        // A file others can write (left by an older version, say) is not read.
        let open = dir.join("open.json");
        std::fs::write(&open, b"[]").unwrap();
        std::fs::set_permissions(&open, std::os::unix::fs::PermissionsExt::from_mode(0o666)).unwrap();
        assert!(read(&open).is_none(), "read a file others can write");
        let large = dir.join("large.json");
        std::fs::write(&large, vec![b' '; (MAX_CACHE_FILE_BYTES + 1) as usize]).unwrap();
        assert!(read(&large).is_none());
        assert!(read(&dir.join("missing.json")).is_none());
        // The directory of another writer is refused.
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
        assert!(matches!(open_dir(&dir), Err(DirError::Refused(why)) if why.contains("writable by others")));
        assert!(write(&file, b"[]").is_err());
        let _ = std::fs::remove_dir_all(dir);
    }

    /// A cache directory reached through a link is not used, for reading or writing: a link
    /// swapped in by whoever owns a parent directory could point anywhere (#51).
    #[test]
    fn a_linked_directory_is_neither_read_nor_written() {
        let base = std::env::temp_dir().join(format!("rdma-hint-cache-link-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let (real, link) = (base.join("real"), base.join("link"));
        DirBuilder::new().recursive(true).mode(0o700).create(&real).unwrap();
        write(&real.join("measured.json"), b"[]").unwrap();
        std::os::unix::fs::symlink(&real, &link).unwrap();
        assert!(matches!(open_dir(&link), Err(DirError::Refused(why)) if why.contains("symbolic link")));
        assert!(read(&link.join("measured.json")).is_none(), "read through a linked directory");
        assert!(write(&link.join("calibrated.json"), b"[]").is_err(), "written through a linked directory");
        assert!(!real.join("calibrated.json").exists());
        let _ = std::fs::remove_dir_all(base);
    }

    /// A file in the directory that another user owns is not read (root can make one).
    #[test]
    fn a_file_another_user_owns_is_not_read() {
        if rustix::process::geteuid().as_raw() != 0 {
            return; // only root can give a file away; CI runs as root
        }
        let dir = std::env::temp_dir().join(format!("rdma-hint-cache-owner-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        DirBuilder::new().recursive(true).mode(0o700).create(&dir).unwrap();
        let file = dir.join("measured.json");
        write(&file, b"[]").unwrap();
        assert!(read(&file).is_some());
        std::os::unix::fs::chown(&file, Some(65534), Some(65534)).unwrap();
        assert!(read(&file).is_none(), "read a file another user owns");
        let _ = std::fs::remove_dir_all(dir);
    }
}
