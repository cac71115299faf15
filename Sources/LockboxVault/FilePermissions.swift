import LockboxCore

#if canImport(Glibc)
import Glibc
#endif

/// The vault's file-system rules: directory 0700, file 0600, both owned by the caller.
///
/// Checks are made on an opened directory, not on paths looked up again: the directory is
/// opened and checked with `fstat`, each file in it is checked with `fstatat` without following
/// links (never opened and closed, which would drop SQLite's POSIX locks on it), and after
/// SQLite opens the vault, its own descriptor must be the very file that was checked (same
/// device and inode), so a rename or a symlink planted between the check and the open is caught.
package enum FilePermissions {
    /// A file's identity: what an opened descriptor refers to.
    struct Identity: Hashable {
        var device: UInt64
        var inode: UInt64

        init(_ info: stat) {
            device = UInt64(info.st_dev)
            inode = UInt64(info.st_ino)
        }
    }

    /// Creates `directory` (and its parents) with mode 0700 where missing.
    static func createPrivateDirectory(_ directory: String) throws(LockboxError) {
        if mkdir(directory, 0o700) == 0 || errno == EEXIST { return }
        guard errno == ENOENT else {
            throw LockboxError(.io, "Cannot create the directory \(directory): \(String(cString: strerror(errno))).")
        }
        let parent = Self.directory(of: directory)
        if parent != directory && parent != "." { try createPrivateDirectory(parent) }
        if mkdir(directory, 0o700) != 0 && errno != EEXIST {
            throw LockboxError(.io, "Cannot create the directory \(directory): \(String(cString: strerror(errno))).")
        }
    }

    /// Refuses a directory or file that other users can reach, or that another user owns.
    /// Checked on descriptors; returns the identities of the files that exist.
    ///
    /// With `singleName`, a file with more than one name (hard links) is refused too: SQLite
    /// keeps a database's write-ahead log beside the name it was opened by, so processes that
    /// open one keychain by two names write two logs, and writes acknowledged through one name
    /// are lost to the other (the keychain then fails its integrity check).
    @discardableResult
    static func check(directory: String, files: [String], singleName: Bool = false) throws(LockboxError) -> [String: Identity] {
        let directoryDescriptor = open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard directoryDescriptor >= 0 else {
            let reason = errno
            // Only a directory that is not there means no keychain: one this user may not
            // enter is said as it is.
            throw LockboxError(
                reason == ENOENT || reason == ENOTDIR ? .noSuchKeychain : .io,
                "Cannot open the directory \(directory): \(String(cString: strerror(reason))).")
        }
        defer { close(directoryDescriptor) }
        var info = stat()
        guard fstat(directoryDescriptor, &info) == 0 else {
            throw LockboxError(.io, "Cannot read \(directory): \(String(cString: strerror(errno))).")
        }
        try checkDirectory(directory, info)
        var identities: [String: Identity] = [:]
        var keychainWritable = false
        for file in files {
            let name = file.lastIndex(of: "/").map { String(file[file.index(after: $0)...]) } ?? file
            // fstatat, not open: closing a descriptor of a file would drop every POSIX lock this
            // process holds on it, including SQLite's locks of other connections to the vault.
            var fileInfo = stat()
            guard fstatat(directoryDescriptor, name, &fileInfo, AT_SYMLINK_NOFOLLOW) == 0 else {
                if errno == ENOENT { continue }
                throw LockboxError(.io, "Cannot read \(file): \(String(cString: strerror(errno))).")
            }
            if fileInfo.st_mode & S_IFMT == S_IFLNK {
                throw LockboxError(.io, "\(file) is a symbolic link; Lockbox opens only a regular file of your own there.")
            }
            guard fileInfo.st_mode & S_IFMT == S_IFREG else {
                throw LockboxError(.io, "\(file) is not a regular file; Lockbox opens only a regular file of your own there.")
            }
            guard fileInfo.st_uid == geteuid() else {
                throw LockboxError(
                    .io, "\(file) belongs to another user (uid \(fileInfo.st_uid)); Lockbox opens only your own keychain files.")
            }
            if singleName && fileInfo.st_nlink > 1 {
                throw LockboxError(
                    .io,
                    "\(file) has \(fileInfo.st_nlink) names (hard links). Lockbox opens a keychain by one name only: SQLite keeps its "
                        + "log beside the name it was opened by, and writes made through another name would be lost. Nothing was "
                        + "read. Remove the other names (find them with: find / -xdev -samefile '\(file)'), or make them copies "
                        + "(cp), then try again.")
            }
            let mode = fileInfo.st_mode & 0o777
            guard mode & ~0o600 == 0 else {
                throw LockboxError(
                    .io,
                    "\(file) is readable or writable by other users (mode \(String(mode, radix: 8))). Fix it with: chmod 600 '\(file)'")
            }
            // A log or shared-memory file SQLite made while the keychain was read-only (it gives
            // them the keychain's mode) stays read-only once the keychain is writable again, and
            // every write then fails naming the keychain: given the keychain's owner mode back.
            if file == files.first {
                keychainWritable = mode & 0o200 != 0
            } else if keychainWritable, mode & 0o600 != 0o600 {
                fchmodat(directoryDescriptor, name, 0o600, 0)
            }
            identities[file] = Identity(fileInfo)
        }
        return identities
    }

    /// The directory must be the caller's and private. The advice never widens or narrows a
    /// directory shared with others (such as /tmp): it names a private directory instead.
    private static func checkDirectory(_ directory: String, _ info: stat) throws(LockboxError) {
        let mode = info.st_mode & 0o7777
        // Another user's own private directory (`sudo -E` keeps that user's HOME and XDG
        // variables): the keychain there is theirs, and the advice is to run as them.
        if info.st_uid != geteuid() && mode & S_ISVTX == 0 && mode & 0o077 == 0 {
            throw LockboxError(
                .io,
                "\(directory) belongs to another user (uid \(info.st_uid)), and so does any keychain in it: Lockbox opens only "
                    + "your own (uid \(geteuid())). Run it as that user (sudo -E keeps their HOME and XDG variables, not their "
                    + "identity), or give your own keychain with --keychain.")
        }
        let shared = info.st_uid != geteuid() || mode & S_ISVTX != 0
        if shared {
            throw LockboxError(
                .io,
                "\(directory) is a directory shared with other users"
                    + (mode & S_ISVTX != 0 ? " (sticky, mode \(String(mode & 0o777, radix: 8)))" : " (owned by uid \(info.st_uid))")
                    + ": other users could replace the keychain there. Keep the keychain in a private directory of your own, "
                    + "for example: mkdir -m 700 '\(directory)/lockbox-$USER' and use --keychain '\(directory)/lockbox-$USER/NAME.lockbox'.")
        }
        guard mode & 0o077 == 0 else {
            throw LockboxError(
                .io,
                "\(directory) is readable or writable by other users (mode \(String(mode & 0o777, radix: 8))). "
                    + "Fix it with: chmod 700 '\(directory)'")
        }
    }

    /// Confirms that SQLite's own descriptor (`opened`, asked of SQLite) refers to the file
    /// that was checked: a rename between the check and SQLite's open is refused. When SQLite
    /// cannot say (another VFS than its default), the open is refused too.
    static func confirmOpened(_ identity: Identity, path: String, opened: (device: UInt64, inode: UInt64)?) throws(LockboxError) {
        guard let opened else {
            throw LockboxError(.io, "Cannot confirm which file SQLite opened for \(path): Lockbox needs SQLite's default unix VFS.")
        }
        guard opened.device == identity.device && opened.inode == identity.inode else {
            throw LockboxError(
                .io, "\(path) was replaced while it was being opened. Nothing was read; check who else can write to its directory.")
        }
    }

    /// Sets `path`'s mode to 0600.
    static func makePrivate(_ path: String) throws(LockboxError) {
        guard chmod(path, 0o600) == 0 || errno == ENOENT else {
            throw LockboxError(.io, "Cannot set the permissions of \(path): \(String(cString: strerror(errno))).")
        }
    }

    static func exists(_ path: String) -> Bool {
        access(path, F_OK) == 0
    }

    /// Whether a keychain file is at `path`: false only when nothing is there. A path this user
    /// cannot reach (a directory of another user's, say) is an error that says so: it is not
    /// "no keychain", which would send the user to make one.
    static func keychainExists(_ path: String) throws(LockboxError) -> Bool {
        var info = stat()
        if stat(path, &info) == 0 && info.st_mode & S_IFMT == S_IFDIR {
            throw LockboxError(
                .param, "\(path) is a directory, not a keychain: name the keychain's file (such as \(path)/default.lockbox).")
        }
        guard access(path, F_OK) != 0 else { return true }
        let reason = errno
        guard reason == ENOENT || reason == ENOTDIR else {
            throw LockboxError(
                .io,
                "Cannot reach \(path): \(String(cString: strerror(reason))). Lockbox opens only a keychain of your own, in "
                    + "directories you may enter; check the path, and who owns its directories.")
        }
        return false
    }

    /// The directory `path` is in: `.` without a slash, `/` at the root.
    package static func directory(of path: String) -> String {
        guard let slash = path.lastIndex(of: "/") else { return "." }
        let directory = String(path[..<slash])
        return directory.isEmpty ? "/" : directory
    }
}
