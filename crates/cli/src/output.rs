//! Where the command's output goes: stdout (a closed pipe ends the command quietly, as for any
//! Unix filter) and the files `--json`/`--plot` name, checked before any measuring starts.

use anyhow::{Context, Result};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Writes `text` to stdout and flushes it. A reader that went away (`| head`) is a
/// [`std::io::ErrorKind::BrokenPipe`] error that `main` turns into a quiet exit.
pub(crate) fn print(text: &str) -> std::io::Result<()> {
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(text.as_bytes())?;
    stdout.flush()
}

/// [`print()`] with a trailing newline.
pub(crate) fn print_line(text: &str) -> std::io::Result<()> {
    print(&format!("{}\n", text.trim_end()))
}

/// True when `error`'s chain holds a broken pipe: the reader of our stdout left.
pub(crate) fn is_broken_pipe(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause.downcast_ref::<std::io::Error>().is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// `error` and its causes on one line, `outer: inner: innermost`, each cause left out when the
/// message before it already says it (errors that print their source and also return it).
pub(crate) fn error_line(error: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if !line.contains(&text) {
            if !line.is_empty() {
                line.push_str(": ");
            }
            line.push_str(&text);
        }
    }
    line
}

/// An output file named on the command line, opened for writing up front so a bad path fails
/// before a sweep spends minutes measuring. Removed again if the command fails before
/// [`OutputFile::done`] and it did not exist before.
#[derive(Debug)]
pub(crate) struct OutputFile {
    path: PathBuf,
    created: bool,
    done: bool,
}

impl OutputFile {
    /// Checks that `path` (given to `flag`) can be written: creates it if missing, leaves an
    /// existing file's contents alone until the command writes it.
    pub(crate) fn reserve(path: &Path, flag: &str) -> Result<OutputFile> {
        let existed = path.exists();
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .with_context(|| format!("{flag} {}: cannot write there", path.display()))?;
        Ok(OutputFile { path: path.to_path_buf(), created: !existed, done: false })
    }

    /// The path to write.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The command wrote the file: keep it.
    pub(crate) fn done(mut self) {
        self.done = true;
    }
}

impl Drop for OutputFile {
    fn drop(&mut self) {
        if self.created && !self.done {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}
