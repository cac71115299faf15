import LockboxCore
import LockboxVault

#if canImport(Glibc)
import Glibc
#endif

/// The files a keychain keeps beside it for sync (`VAULT.sync/`: the configuration, each group's
/// state, lock and fleet marks): a directory of mode 0700 and files of mode 0600, whatever the
/// process's umask, set without changing it (a umask is the whole process's, and another
/// thread's files would be made under it meanwhile).
package enum SyncFiles {
    /// Makes `directory` (mode 0700) or checks the one there: a directory (not a link to one)
    /// this user may write in, its mode narrowed to 0700 if it allows others more.
    /// - Throws: `errSecIO` naming the directory and what to do; nothing is created elsewhere.
    package static func prepareDirectory(_ directory: String) throws(LockboxError) {
        if mkdir(directory, 0o700) != 0 && errno != EEXIST {
            throw LockboxError(.io, "Cannot create \(directory). Check the permissions of the directory it is in, then try again; nothing was created or changed.")
        }
        var info = stat()
        guard lstat(directory, &info) == 0, info.st_mode & S_IFMT == S_IFDIR, access(directory, W_OK | X_OK) == 0 else {
            throw LockboxError(
                .io, "\(directory) is not a directory this user may write in. Fix it (or remove it), then try again; nothing was created or changed.")
        }
        if info.st_mode & 0o077 != 0 && chmod(directory, 0o700) != 0 {
            throw LockboxError(.io, "Cannot make \(directory) private to this user (mode 0700). Fix its permissions, then try again.")
        }
    }

    /// Makes the file at `path` (mode 0600), or narrows an existing one to 0600, before a
    /// database opens it (SQLite gives its log and shared-memory files the file's mode). A link
    /// there is refused.
    package static func prepareFile(_ path: String) throws(LockboxError) {
        let descriptor = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0o600)
        guard descriptor >= 0 else {
            throw LockboxError(.io, "Cannot open \(path) (a link, or permissions). Fix it, then try again.")
        }
        defer { close(descriptor) }
        var info = stat()
        guard fstat(descriptor, &info) == 0, info.st_mode & S_IFMT == S_IFREG else {
            throw LockboxError(.io, "\(path) is not a regular file. Fix it, then try again.")
        }
        if info.st_mode & 0o077 != 0 && fchmod(descriptor, 0o600) != 0 {
            throw LockboxError(.io, "Cannot make \(path) private to this user (mode 0600). Fix its permissions, then try again.")
        }
    }

    /// Narrows an existing file at `path` (a database's log or shared memory, kept between
    /// connections) to mode 0600; nothing when there is none.
    /// A link or anything but a file there is refused, naming it (a database would refuse it
    /// in words that name the file it belongs to).
    package static func narrowIfPresent(_ path: String) throws(LockboxError) {
        var info = stat()
        guard lstat(path, &info) == 0 else { return }
        guard info.st_mode & S_IFMT == S_IFREG else {
            throw LockboxError(
                .io, "\(path) is a link or not a regular file; Lockbox uses only a file of its own there. Remove it, then try again (the keychain's items are not affected).")
        }
        guard info.st_mode & 0o077 != 0 else { return }
        if chmod(path, 0o600) != 0 {
            throw LockboxError(.io, "Cannot make \(path) private to this user (mode 0600). Fix its permissions, then try again.")
        }
    }

    /// `VAULT.sync`, the directory of a keychain's sync files.
    package static func directory(vault path: String) -> String { path + ".sync" }

    /// What ``readDeviceRecord(_:limit:)`` found.
    package enum DeviceRecord {
        /// No file.
        case absent
        /// The file's bytes (empty for an empty file).
        case bytes([UInt8])
        /// A file that is not one to read: a link, a FIFO, not this user's to read, larger
        /// than the limit.
        case unreadable
    }

    /// The path of one of this device's own records of a group (the last pull, the devices
    /// seen) in the device identity's directory (`$XDG_STATE_HOME/lockbox/sync/`), beside the
    /// vault's remembered generations, not beside the keychain.
    static func deviceRecordPath(vault: Vault, group: String, device: DeviceSecret, kind: String) -> String {
        deviceRecordPath(vault: vault, group: group, deviceID: device.id, kind: kind)
    }

    static func deviceRecordPath(vault: Vault, group: String, deviceID: String, kind: String) -> String {
        let directory = FilePermissions.directory(of: vault.configuration.device.resolvedKeyPath)
        return (directory == "/" ? "" : directory) + "/sync/" + group + "-" + deviceID + "." + kind
    }

    /// Removes the records an earlier device of this keychain kept (its last pull, the devices
    /// it saw), once a join replaced it: under a key that is gone, they serve nothing. Best effort.
    static func removeDeviceRecords(vault: Vault, group: String, deviceID: String) {
        guard SyncGroup.isDeviceIdentifier(deviceID) else { return }
        for kind in ["pulled", "devices"] { unlink(deviceRecordPath(vault: vault, group: group, deviceID: deviceID, kind: kind)) }
    }

    /// Reads such a record (or the sync configuration beside the keychain), at most `limit`
    /// bytes: only a regular file, without following a link, and without blocking (a FIFO
    /// planted there hung every sync).
    package static func readDeviceRecord(_ path: String, limit: Int) -> DeviceRecord {
        let descriptor = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK)
        guard descriptor >= 0 else { return errno == ENOENT ? .absent : .unreadable }
        defer { close(descriptor) }
        var info = stat()
        guard fstat(descriptor, &info) == 0, info.st_mode & S_IFMT == S_IFREG else { return .unreadable }
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: min(limit + 1, 16 * 1024))
        while true {
            let count = chunk.withUnsafeMutableBytes { Glibc.read(descriptor, $0.baseAddress, $0.count) }
            guard count >= 0 else { return .unreadable }
            if count == 0 { return .bytes(bytes) }
            bytes += chunk[0..<count]
            guard bytes.count <= limit else { return .unreadable }
        }
    }
}
