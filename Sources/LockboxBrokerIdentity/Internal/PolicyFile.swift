import LockboxCore

#if canImport(Glibc)
import Glibc
#endif

/// Reading the policy file without trusting its path: the directory and the file are opened
/// without following a link, checked through their descriptors, and the file is read again
/// if it changed while it was read.
enum PolicyFile {
    /// What identifies one version of the directory and the file: a replaced or edited file,
    /// or a directory whose owner or mode changed, has another one.
    struct Version: Hashable, Sendable {
        var directory: [Int]
        var file: [Int]?

        init(directory: stat, file: stat?) {
            self.directory = Self.fields(directory)
            self.file = file.map(Self.fields)
        }

        static func fields(_ status: stat) -> [Int] {
            [
                Int(status.st_dev), Int(status.st_ino), Int(status.st_mode), Int(status.st_uid), Int(status.st_size),
                Int(status.st_mtim.tv_sec), Int(status.st_mtim.tv_nsec), Int(status.st_ctim.tv_sec), Int(status.st_ctim.tv_nsec),
            ]
        }
    }

    /// The version now on disk, without reading or checking anything; nil when the directory
    /// does not exist or cannot be examined (a full read then says why).
    static func currentVersion(directory: String) -> Version? {
        var directoryStatus = stat()
        guard lstat(directory, &directoryStatus) == 0 else { return nil }
        var fileStatus = stat()
        guard lstat(directory + "/" + BrokerPolicy.fileName, &fileStatus) == 0 else {
            return errno == ENOENT ? Version(directory: directoryStatus, file: nil) : nil
        }
        return Version(directory: directoryStatus, file: fileStatus)
    }

    static func read(directory: String) throws(LockboxError) -> (policy: BrokerPolicy, version: Version?) {
        let path = directory + "/" + BrokerPolicy.fileName
        guard let directoryDescriptor = FileDescriptor.open(directory, flags: O_RDONLY | O_DIRECTORY | O_NOFOLLOW) else {
            if errno == ENOENT { return (BrokerPolicy(path: path), nil) }
            if errno == ELOOP || errno == ENOTDIR {
                throw LockboxError(
                    .io, "\(directory) is a symbolic link or not a directory; the broker reads its policy only from a directory of your own there.")
            }
            throw LockboxError(.io, "The broker's policy directory \(directory) cannot be opened.", cause: .systemCall("open", errno: errno))
        }
        guard let directoryStatus = directoryDescriptor.status() else {
            throw LockboxError(.io, "Checking \(directory) failed.", cause: .systemCall("fstat", errno: errno))
        }
        try checkOwnership(directoryStatus, path: directory, isDirectory: true)

        for _ in 0..<3 {
            guard
                let file = FileDescriptor.open(
                    BrokerPolicy.fileName, relativeTo: directoryDescriptor, flags: O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY)
            else {
                if errno == ENOENT { return (BrokerPolicy(path: path), Version(directory: directoryStatus, file: nil)) }
                if errno == ELOOP {
                    throw LockboxError(.io, "\(path) is a symbolic link; the broker reads only a regular file of your own there. Replace the link with the file.")
                }
                throw LockboxError(.io, "The broker's policy \(path) cannot be opened.", cause: .systemCall("open", errno: errno))
            }
            guard let before = file.status() else {
                throw LockboxError(.io, "Checking \(path) failed.", cause: .systemCall("fstat", errno: errno))
            }
            guard before.st_mode & S_IFMT == S_IFREG else {
                throw LockboxError(.io, "\(path) is not a regular file; the broker reads only a regular file of your own there.")
            }
            try checkOwnership(before, path: path, isDirectory: false)
            guard Int(before.st_size) <= BrokerPolicy.maximumFileSize, let bytes = file.readAll(limit: BrokerPolicy.maximumFileSize) else {
                if errno == EFBIG || Int(before.st_size) > BrokerPolicy.maximumFileSize {
                    throw LockboxError(.param, "\(path) is larger than \(BrokerPolicy.maximumFileSize) bytes; a policy is a few lines.")
                }
                throw LockboxError(.io, "Reading \(path) failed.", cause: .systemCall("read", errno: errno))
            }
            guard let after = file.status() else {
                throw LockboxError(.io, "Checking \(path) failed.", cause: .systemCall("fstat", errno: errno))
            }
            // Edited in place while it was read: read it again.
            if Version(directory: directoryStatus, file: before) != Version(directory: directoryStatus, file: after) { continue }
            guard let text = String(validating: bytes, as: UTF8.self) else {
                throw LockboxError(.param, "\(path) is not UTF-8 text.")
            }
            return (try PolicyParser.parse(text, path: path), Version(directory: directoryStatus, file: before))
        }
        throw LockboxError(.io, "\(path) kept changing while it was read; save it once (an editor's atomic save), then try again.")
    }

    /// Owned by this user and not writable by group or others.
    static func checkOwnership(_ status: stat, path: String, isDirectory: Bool) throws(LockboxError) {
        guard status.st_uid == geteuid() else {
            throw LockboxError(
                .io, "\(path) belongs to another user (uid \(status.st_uid)); the broker trusts only a policy that is your own. "
                    + "Fix it with: chown \(geteuid()) '\(path)'")
        }
        let mode = status.st_mode & 0o7777
        guard mode & 0o022 == 0 else {
            throw LockboxError(
                .io, "\(path) is writable by other users (mode \(String(mode & 0o777, radix: 8))), who could grant themselves your access groups. "
                    + "Fix it with: chmod go-w '\(path)'")
        }
    }
}
