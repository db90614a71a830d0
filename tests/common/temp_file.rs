//! A file a test writes to the temporary directory and leaves nothing of: removed when the test
//! ends, whether it passed or failed (a panic drops it too), so that repeated runs do not fill
//! `/tmp` with copies.

use std::path::{Path, PathBuf};

/// A file in the temporary directory, removed when dropped. It reads as its path.
pub struct TempFile(PathBuf);

impl TempFile {
    /// Writes `contents` to a file named `name` in the temporary directory; `name` must be unique
    /// among the tests that may run at once.
    pub fn write(name: &str, contents: impl AsRef<[u8]>) -> Self {
        let path = std::env::temp_dir().join(name);
        std::fs::write(&path, contents)
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
        Self(path)
    }
}

impl std::ops::Deref for TempFile {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        // A file already gone is what was wanted.
        let _ = std::fs::remove_file(&self.0);
    }
}
