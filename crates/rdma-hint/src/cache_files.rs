//! The hint cache's files as a trust boundary. The cache directory comes from the environment
//! and may be shared with, or planted by, another user; what it holds decides the block size
//! every transfer uses. So:
//!
//! * only an absolute `RDMA_HINT_CACHE_DIR`, `XDG_CACHE_HOME` or `HOME` names it (an empty or
//!   relative one is ignored, as the XDG spec says), and an existing directory is used only if
//!   it is this user's and nobody else can write it; a new one is created 0700. Otherwise the
//!   library runs without a cache and says so once;
//! * a file is read only if it is a regular file (opened without following a link, and
//!   without blocking on a fifo) of at most [`MAX_CACHE_FILE_BYTES`];
//! * a file is written through a fresh temporary file of a random name, created exclusively
//!   without following links, mode 0600, then renamed over the old one.

use std::fs::{DirBuilder, File, OpenOptions};
use std::hash::{BuildHasher, Hasher};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The largest cache file read: thousands of entries; anything larger is not ours.
pub(crate) const MAX_CACHE_FILE_BYTES: u64 = 1 << 20;

/// The cache directory, when one is configured and safe to use.
pub(crate) fn cache_dir() -> Option<PathBuf> {
    let dir = configured_dir()?;
    match check_dir(&dir) {
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

/// The effective user id, from `/proc/self/status` (no libc call needed).
fn effective_uid() -> Result<u32, String> {
    let status = std::fs::read_to_string("/proc/self/status")
        .map_err(|e| format!("cannot read /proc/self/status: {e}"))?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1))
        .and_then(|uid| uid.parse().ok())
        .ok_or_else(|| "no effective uid in /proc/self/status".to_string())
}

/// A directory that does not exist yet is fine (created 0700 when first written); an existing
/// one must be a directory of this user that neither its group nor others can write.
fn check_dir(dir: &Path) -> Result<(), String> {
    let metadata = match std::fs::metadata(dir) {
        Ok(metadata) => metadata,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(error) => return Err(format!("cannot read it: {error}")),
    };
    if !metadata.is_dir() {
        return Err("not a directory".into());
    }
    let me = effective_uid()?;
    if metadata.uid() != me {
        return Err(format!("owned by uid {}, not by this user (uid {me})", metadata.uid()));
    }
    if metadata.mode() & 0o022 != 0 {
        return Err(format!("writable by others (mode {:o})", metadata.mode() & 0o7777));
    }
    Ok(())
}

/// The bytes of cache file `path`: `None` when it does not exist, or (with a warning that
/// names it) when it is not a regular file, is a link, or is larger than
/// [`MAX_CACHE_FILE_BYTES`].
pub(crate) fn read(path: &Path) -> Option<Vec<u8>> {
    let refuse = |why: &dyn std::fmt::Display| {
        tracing::warn!(file = %path.display(), %why, "rdma-hint: ignoring a hint cache file");
        None
    };
    let mut file =
        match OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK).open(path) {
            Ok(file) => file,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return None,
            Err(error) if error.raw_os_error() == Some(libc::ELOOP) => return refuse(&"a symbolic link"),
            Err(error) => return refuse(&error),
        };
    let metadata = match file.metadata() {
        Ok(metadata) => metadata,
        Err(error) => return refuse(&error),
    };
    if !metadata.is_file() {
        return refuse(&"not a regular file");
    }
    if metadata.len() > MAX_CACHE_FILE_BYTES {
        return refuse(&format!(
            "{} bytes, more than the {MAX_CACHE_FILE_BYTES} a cache file may hold",
            metadata.len()
        ));
    }
    let mut bytes = Vec::with_capacity(metadata.len() as usize);
    if let Err(error) = Read::by_ref(&mut file).take(MAX_CACHE_FILE_BYTES + 1).read_to_end(&mut bytes) {
        return refuse(&error);
    }
    if bytes.len() as u64 > MAX_CACHE_FILE_BYTES {
        return refuse(&format!("grew past the {MAX_CACHE_FILE_BYTES} bytes a cache file may hold"));
    }
    Some(bytes)
}

/// Replaces cache file `path` by `bytes`: a fresh temporary file beside it (random name,
/// created exclusively, no link followed, mode 0600), renamed over it. Creates the directory
/// (0700) first if needed, and refuses one another user could have prepared.
pub(crate) fn write(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().filter(|dir| !dir.as_os_str().is_empty()).ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{}: no directory", path.display()))
    })?;
    DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    check_dir(dir).map_err(|why| {
        std::io::Error::new(std::io::ErrorKind::PermissionDenied, format!("{}: {why}", dir.display()))
    })?;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let (temporary, mut file) = create_temporary(dir, &name)?;
    let written = file
        .write_all(bytes)
        .and_then(|()| file.sync_data())
        .and_then(|()| std::fs::rename(&temporary, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    written
}

/// A new file `.NAME.RANDOM.tmp` in `dir` that nobody else created first.
fn create_temporary(dir: &Path, name: &str) -> std::io::Result<(PathBuf, File)> {
    let mut last = None;
    for attempt in 0..16u64 {
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u64(attempt);
        hasher.write_u32(std::process::id());
        let temporary = dir.join(format!(".{name}.{:016x}.tmp", hasher.finish()));
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&temporary)
        {
            Ok(file) => return Ok((temporary, file)),
            Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => last = Some(error),
            Err(error) => return Err(error),
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
        assert_eq!(std::fs::metadata(&file).unwrap().mode() & 0o777, 0o600);
        let link = dir.join("link.json");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        assert!(read(&link).is_none(), "a link is not followed");
        let zero = dir.join("zero.json");
        std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
        assert!(read(&zero).is_none());
        assert!(read(Path::new("/dev/zero")).is_none(), "a device is not a regular file");
        let large = dir.join("large.json");
        std::fs::write(&large, vec![b' '; (MAX_CACHE_FILE_BYTES + 1) as usize]).unwrap();
        assert!(read(&large).is_none());
        assert!(read(&dir.join("missing.json")).is_none());
        // The directory of another writer is refused.
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
        assert!(check_dir(&dir).unwrap_err().contains("writable by others"));
        assert!(write(&file, b"[]").is_err());
        let _ = std::fs::remove_dir_all(dir);
    }
}
