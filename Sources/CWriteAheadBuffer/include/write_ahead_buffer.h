#ifndef LOCKBOX_WRITE_AHEAD_BUFFER_H
#define LOCKBOX_WRITE_AHEAD_BUFFER_H

/// The name of the SQLite VFS that `lockbox_register_write_ahead_buffer` registers.
extern const char *const lockbox_write_ahead_buffer_vfs;

/// Registers (once; later calls return the first call's result) a VFS over SQLite's `unix` one
/// that gathers the consecutive writes SQLite makes to a write-ahead log (each frame is a
/// 24-byte header and a page, two `pwrite` calls) and hands them to the file in one write
/// before anything reads, sizes, truncates, syncs or closes it. Every other file, and every
/// other operation, goes to `unix` unchanged, so what reaches the disk, and when it is synced,
/// is what SQLite asked for. Returns an SQLite result code.
int lockbox_register_write_ahead_buffer(void);

/// Renames `from` to `to` unless something is at `to` (atomically: renameat2 with
/// RENAME_NOREPLACE). Returns 0, or the errno: EEXIST when `to` exists, EINVAL (or ENOSYS)
/// where the file system or kernel cannot do it.
int lockbox_rename_no_replace(const char *from, const char *to);

#endif
