import LockboxCore

#if canImport(Glibc)
import Glibc
#endif

/// The file operations of installing units: nothing is replaced or removed unless Lockbox
/// wrote it.
enum UnitFiles {
    static func systemError(_ call: String, _ message: String) -> LockboxError {
        LockboxError(.io, message, cause: .systemCall(call, errno: errno))
    }

    /// `mkdir -p`: the user's config directories, 0700 for a new `$XDG_CONFIG_HOME`, 0755 below
    /// (systemd's own layout).
    static func makeDirectories(_ path: String) throws(LockboxError) {
        var prefix = ""
        for component in path.split(separator: "/") {
            prefix += "/" + component
            var status = stat()
            if lstat(prefix, &status) == 0 {
                guard status.st_mode & S_IFMT == S_IFDIR else {
                    throw LockboxError(.io, "\(prefix) is not a directory; the units go in \(path).")
                }
                continue
            }
            guard errno == ENOENT else { throw systemError("lstat", "Checking \(prefix) failed.") }
            guard mkdir(prefix, 0o755) == 0 || errno == EEXIST else { throw systemError("mkdir", "Creating \(prefix) failed.") }
        }
    }

    /// Throws unless `path` is absent or a regular file that begins with the marker.
    static func checkReplaceable(_ path: String) throws(LockboxError) {
        var status = stat()
        guard lstat(path, &status) == 0 else {
            if errno == ENOENT { return }
            throw systemError("lstat", "Checking \(path) failed.")
        }
        guard status.st_mode & S_IFMT == S_IFREG, let text = try? contents(path), text.hasPrefix(BrokerUnits.marker) else {
            throw LockboxError(
                .duplicateItem,
                "\(path) exists and was not written by lockbox broker install-units; it was left as it is. "
                    + "Move it away (or remove it) if lockbox should manage it, then run the command again.")
        }
    }

    static func contents(_ path: String) throws(LockboxError) -> String {
        guard let file = FileDescriptor.open(path, flags: O_RDONLY | O_NOFOLLOW), let bytes = file.readAll(limit: 1024 * 1024) else {
            throw systemError("open", "Reading \(path) failed.")
        }
        return String(decoding: bytes, as: UTF8.self)
    }

    /// Writes a temporary file beside `path`, flushes it, then renames it over `path`.
    static func writeAtomically(_ path: String, _ text: String) throws(LockboxError) {
        var template = Array((path + ".XXXXXX").utf8CString)
        let descriptor = template.withUnsafeMutableBufferPointer { mkstemp($0.baseAddress!) }
        guard descriptor >= 0 else { throw systemError("mkstemp", "Creating a temporary file beside \(path) failed.") }
        let file = FileDescriptor(descriptor)
        let temporary = String(decoding: template.dropLast().map { UInt8(bitPattern: $0) }, as: UTF8.self)
        var written = 0
        let bytes = Array(text.utf8)
        while written < bytes.count {
            let count = bytes[written...].withUnsafeBytes { write(file.raw, $0.baseAddress, $0.count) }
            if count < 0 && errno == EINTR { continue }
            guard count > 0 else {
                let failure = systemError("write", "Writing \(path) failed.")
                unlink(temporary)
                throw failure
            }
            written += count
        }
        guard fchmod(file.raw, 0o644) == 0, fsync(file.raw) == 0, rename(temporary, path) == 0 else {
            let failure = systemError("rename", "Writing \(path) failed.")
            unlink(temporary)
            throw failure
        }
    }

    /// A symbolic link at `path` to `target`; an existing link there is replaced only when it
    /// already points to `target`.
    static func link(_ path: String, to target: String) throws(LockboxError) {
        if symlink(target, path) == 0 { return }
        guard errno == EEXIST else { throw systemError("symlink", "Creating the link \(path) failed.") }
        guard linkTarget(path) == target else {
            throw LockboxError(.duplicateItem, "\(path) exists and is not the link lockbox makes; it was left as it is. Remove it, then run the command again.")
        }
    }

    static func linkTarget(_ path: String) -> String? {
        var buffer = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
        let count = readlink(path, &buffer, buffer.count - 1)
        guard count > 0 else { return nil }
        return String(decoding: buffer[0..<count].map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    /// Removes the link at `path` when it points to `target`; false when there is none.
    static func removeLink(_ path: String, ifItPointsTo target: String) throws(LockboxError) -> Bool {
        guard linkTarget(path) == target else { return false }
        guard unlink(path) == 0 else { throw systemError("unlink", "Removing \(path) failed.") }
        return true
    }

    /// Removes a unit file (`checkReplaceable` said it is Lockbox's); false when there is none.
    static func remove(_ path: String) throws(LockboxError) -> Bool {
        if unlink(path) == 0 { return true }
        if errno == ENOENT { return false }
        throw systemError("unlink", "Removing \(path) failed.")
    }
}

/// The user's systemd manager, when one runs for this session (its private socket exists in
/// `$XDG_RUNTIME_DIR/systemd/`).
struct UserManager {
    let runtimeDirectory: String

    init?(runtimeDirectory: String?) {
        guard let runtimeDirectory, runtimeDirectory.hasPrefix("/") else { return nil }
        var status = stat()
        guard lstat(runtimeDirectory + "/systemd/private", &status) == 0, status.st_mode & S_IFMT == S_IFSOCK else { return nil }
        self.runtimeDirectory = runtimeDirectory
    }

    /// Runs `systemctl --user ARGUMENTS`, its output going where this process's goes.
    func systemctl(_ arguments: [String]) throws(LockboxError) {
        let argv = (["systemctl", "--user"] + arguments).map { strdup($0) }
        defer { argv.forEach { free($0) } }
        var pid = pid_t()
        let spawned = posix_spawnp(&pid, "systemctl", nil, nil, argv + [nil], environ)
        guard spawned == 0 else {
            throw LockboxError(
                .io, "Running systemctl failed; is systemd installed? Run: systemctl --user \(arguments.joined(separator: " "))",
                cause: .systemCall("posix_spawnp", errno: spawned))
        }
        var status: Int32 = 0
        while waitpid(pid, &status, 0) < 0 {
            guard errno == EINTR else { throw UnitFiles.systemError("waitpid", "Waiting for systemctl failed.") }
        }
        guard status & 0x7f == 0, (status >> 8) & 0xff == 0 else {
            throw LockboxError(.io, "systemctl --user \(arguments.joined(separator: " ")) failed (status \(status)); see its message above.")
        }
    }
}
