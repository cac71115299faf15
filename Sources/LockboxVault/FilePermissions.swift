import LockboxCore

#if canImport(Glibc)
import Glibc
#endif

/// The vault's file-system rules: directory 0700, file 0600, both owned by the caller.
enum FilePermissions {
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
    static func check(directory: String, files: [String]) throws(LockboxError) {
        try checkOne(directory, maximumMode: 0o700, fix: "chmod 700 '\(directory)'", mustExist: true)
        for file in files {
            try checkOne(file, maximumMode: 0o600, fix: "chmod 600 '\(file)'", mustExist: false)
        }
    }

    private static func checkOne(
        _ path: String, maximumMode: mode_t, fix: @autoclosure () -> String, mustExist: Bool
    ) throws(LockboxError) {
        var info = stat()
        guard stat(path, &info) == 0 else {
            if !mustExist && errno == ENOENT { return }
            throw LockboxError(.noSuchKeychain, "Cannot read \(path): \(String(cString: strerror(errno))).")
        }
        guard info.st_uid == geteuid() else {
            throw LockboxError(
                .io, "\(path) belongs to another user (uid \(info.st_uid)); Lockbox opens only your own keychain files.")
        }
        let mode = info.st_mode & 0o777
        guard mode & ~maximumMode == 0 else {
            throw LockboxError(
                .io,
                "\(path) is readable or writable by other users (mode \(String(mode, radix: 8))). Fix it with: \(fix())")
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

    static func directory(of path: String) -> String {
        guard let slash = path.lastIndex(of: "/") else { return "." }
        let directory = String(path[..<slash])
        return directory.isEmpty ? "/" : directory
    }
}
