//! `devices.json`: the kubelet device IDs allocated to one container, as a JSON array of strings
//! (`["GPU-aaa::0","GPU-bbb::3"]`). Written at Allocate, compared with the PreStartContainer request.

use std::path::Path;

use super::{AbiError, atomic::write_atomic};

/// File name inside `<manager-dir>/<podUID>_<ctr>/`.
pub const FILE_NAME: &str = "devices.json";

/// The file content for `ids` (compact JSON, as Go's `json.Marshal`).
pub fn encode(ids: &[String]) -> String {
    serde_json::to_string(ids).unwrap_or_else(|_| "[]".to_owned())
}

/// Writes `ids` to `path` atomically (mode 0644 before umask).
pub fn write(path: &Path, ids: &[String]) -> Result<(), AbiError> {
    write_atomic(path, encode(ids).as_bytes(), 0o644)
}

/// Reads the IDs back; a file that is not a JSON array of strings is an [`AbiError::Json`].
pub fn read(path: &Path) -> Result<Vec<String>, AbiError> {
    let bytes = std::fs::read(path).map_err(|source| AbiError::Io {
        path: path.to_path_buf(),
        action: "read",
        source,
    })?;
    decode(&bytes, path)
}

/// Decodes a file image (what [`read`] does after reading it); `path` only names the file in errors.
pub fn decode(bytes: &[u8], path: &Path) -> Result<Vec<String>, AbiError> {
    serde_json::from_slice(bytes)
        .map_err(|err| AbiError::Json { path: path.to_path_buf(), message: err.to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        let ids = vec!["GPU-a::0".to_owned(), "GPU-b::9".to_owned()];
        write(&path, &ids).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), r#"["GPU-a::0","GPU-b::9"]"#);
        assert_eq!(read(&path).unwrap(), ids);
        std::fs::write(&path, "{").unwrap();
        let err = read(&path).unwrap_err();
        assert!(err.to_string().contains("devices.json: invalid JSON"), "{err}");
    }
}
