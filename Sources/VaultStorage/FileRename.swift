internal import CWriteAheadBuffer

/// Renames that never replace a file.
package enum FileRename {
    /// Renames `from` to `to` unless something is at `to`, atomically. Returns 0, or the errno:
    /// `EEXIST` when `to` exists, `EINVAL` (or `ENOSYS`) where the file system or kernel cannot
    /// rename without replacing.
    package static func withoutReplacing(_ from: String, _ to: String) -> Int32 {
        lockbox_rename_no_replace(from, to)
    }
}
