//! Where `serve` and `sweep` get the pre-shared token: `--token-file PATH`, else the
//! `RDMA_HINT_TOKEN` environment variable (never a command-line value, which `ps` shows).

use anyhow::{bail, Context, Result};
use std::io::Read;
use std::path::Path;

/// The most a token file is read: a 64-byte token, CR LF, and one byte to tell it is longer.
const MAX_FILE_BYTES: usize = 67;

/// The variable read when no `--token-file` is given.
pub(crate) const TOKEN_VARIABLE: &str = "RDMA_HINT_TOKEN";

/// The token from `file` (one trailing newline dropped) or from [`TOKEN_VARIABLE`]; `None`
/// when neither is set. 1…64 bytes.
pub(crate) fn load(file: Option<&Path>) -> Result<Option<Vec<u8>>> {
    let token = match file {
        Some(path) => {
            // A regular file only (a fifo would block, /dev/zero never end), read no further
            // than one byte past the longest token.
            let refuse = |why: String| anyhow::anyhow!("--token-file {}: {why}", path.display());
            let metadata = std::fs::metadata(path).map_err(|e| refuse(format!("cannot read it: {e}")))?;
            if !metadata.is_file() {
                return Err(refuse("not a regular file".into()));
            }
            let mut bytes = Vec::with_capacity(MAX_FILE_BYTES);
            std::fs::File::open(path)
                .and_then(|file| Read::read_to_end(&mut Read::take(file, MAX_FILE_BYTES as u64), &mut bytes))
                .map_err(|e| refuse(format!("cannot read it: {e}")))?;
            warn_if_readable_by_others(path);
            if bytes.ends_with(b"\n") {
                bytes.pop();
                if bytes.ends_with(b"\r") {
                    bytes.pop();
                }
            }
            bytes
        }
        None => match std::env::var_os(TOKEN_VARIABLE) {
            Some(value) => value.into_encoded_bytes(),
            None => return Ok(None),
        },
    };
    if token.is_empty() || token.len() > 64 {
        let what =
            file.map_or_else(|| TOKEN_VARIABLE.to_string(), |p| format!("--token-file {}", p.display()));
        // A file is read only one byte past the longest token: past that, say so, not a count.
        let size = match file.and_then(|p| std::fs::metadata(p).ok()) {
            Some(metadata) if token.len() > 64 => format!("{} bytes", metadata.len()),
            _ if token.len() > 64 && file.is_some() => "more than 64 bytes".to_string(),
            _ => format!("{} bytes", token.len()),
        };
        bail!("the token ({what}) has {size}; it needs 1 to 64");
    }
    Ok(Some(token))
}

/// A fresh random token for a pair whose two ends are both in this process (the in-process
/// loopback): authenticated like any other pair, and known to nobody else.
pub(crate) fn ephemeral() -> Result<Vec<u8>> {
    use std::io::Read;
    let mut token = vec![0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut random| random.read_exact(&mut token))
        .context("reading /dev/urandom for the loopback pair's token")?;
    Ok(token)
}

/// Refuses at once, in one line, a command that would talk to another process over UCX
/// without a token: UCX connects only to authenticated peers, so every run would fail (serve
/// used to print "serving" and then one error a run, dozens a second).
pub(crate) fn required_by(transport: &rdma_hint::TransportId, have_token: bool) -> Result<()> {
    if transport.backend() == "ucx" && !have_token {
        bail!(
            "--backend ucx needs a pre-shared token (UCX connects only to authenticated peers): give --token-file PATH or set ${TOKEN_VARIABLE}, the same on both sides"
        );
    }
    Ok(())
}

fn warn_if_readable_by_others(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(metadata) = std::fs::metadata(path) {
        if metadata.permissions().mode() & 0o077 != 0 {
            tracing::warn!(path = %path.display(), "the token file is readable by other users; chmod 600 it");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_lose_one_newline_and_bad_lengths_are_refused() {
        let dir = std::env::temp_dir().join(format!("rdma-hint-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("token");
        std::fs::write(&file, b"s3cret\n").unwrap();
        assert_eq!(load(Some(&file)).unwrap().unwrap(), b"s3cret");
        std::fs::write(&file, b"\n").unwrap();
        assert!(load(Some(&file)).is_err());
        std::fs::write(&file, [b'x'; 65]).unwrap();
        assert!(load(Some(&file)).is_err());
        assert!(load(Some(&dir.join("missing"))).unwrap_err().to_string().contains("--token-file"));
        assert!(load(Some(&dir)).unwrap_err().to_string().contains("not a regular file"), "a directory");
        let endless = std::path::Path::new("/dev/zero");
        assert!(load(Some(endless)).unwrap_err().to_string().contains("not a regular file"));
        std::fs::write(&file, [b'x'; 1 << 20]).unwrap();
        assert!(
            load(Some(&file)).unwrap_err().to_string().contains("1 to 64"),
            "read no further than needed"
        );
        std::fs::write(&file, [b'x'; 136]).unwrap();
        let error = load(Some(&file)).unwrap_err().to_string();
        assert!(error.contains("has 136 bytes"), "the file's size, not what was read of it: {error}");
        let _ = std::fs::remove_dir_all(dir);
    }
}
