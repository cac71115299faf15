import CPeerIdentity
import LockboxCore
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// The steps of `PeerIdentity.identify`, with a hook between the first start-time read and the
/// last, so that a test can make the process exit in the middle.
struct PeerIdentification {
    let socket: Int32
    let hashExecutable: Bool
    let between: (() -> Void)?
    /// Whether the kernel's `SO_PEERPIDFD` is asked first (tests also run the `pidfd_open` path
    /// that kernels before 6.5 take).
    var socketPidfd = true

    /// `.flatpak-info` is a few hundred bytes; anything this large is not one.
    static let flatpakInfoLimit = 64 * 1024
    static let cgroupLimit = 64 * 1024

    func run() throws(LockboxError) -> PeerIdentity {
        // The connection existed before this moment, so its process started before it.
        let startedBy = try Self.bootTimeTicks()

        var pid: pid_t = 0
        var uid: uid_t = 0
        var gid: gid_t = 0
        guard lockbox_peer_credentials(socket, &pid, &uid, &gid) == 0 else {
            throw LockboxError(
                .io, "The broker could not read its client's credentials (SO_PEERCRED); the connection is not a Unix socket.",
                cause: .systemCall("getsockopt(SO_PEERCRED)", errno: errno))
        }
        guard uid == geteuid() else {
            throw Self.refused("the client runs as user \(uid), not as the broker's user \(geteuid()); each user runs their own broker.")
        }
        guard pid > 0 else {
            throw Self.refused("the kernel names no process for the client (it is in a pid namespace the broker cannot see).")
        }

        let pidfd = try Self.pidfd(socket: socket, pid: pid, fromSocket: socketPidfd)
        guard let process = FileDescriptor.open("/proc/\(pid)", flags: LOCKBOX_O_PATH | O_DIRECTORY) else {
            throw Self.exited(pid)
        }
        // The pidfd was taken first: while its process exists, the pid is not reused, so the
        // directory opened above is that process's.
        try Self.checkAlive(pidfd, pid)
        let startTime = try Self.startTime(process, pid)
        guard startTime <= startedBy else {
            throw Self.refused("process \(pid) started after the connection was made: its number was reused; connect again.")
        }
        between?()

        let executablePath = try Self.executablePath(process, pid)
        // A process in the middle of an exec already shows its new program here while the old
        // program's descriptors are still open (the kernel switches the executable, then closes
        // the close-on-exec descriptors, which takes as long as the process has descriptors, then
        // maps the new program). Once the program is mapped, that exec is over.
        try Self.checkMapsItsProgram(executablePath, process, pid)
        // A pidfd opened by number may name a later process that reuses the number of one that
        // connected and exited (leaving the connection to another): that process does not hold
        // the connection's other end. And on every kernel: a process that connected, then ran
        // another program (exec keeps the pid and the pidfd) while a child it forked kept the
        // connection, holds it only through a descriptor that survived the exec, one without
        // close-on-exec. Checked after the program was read: an exec after this check leaves
        // the identity of the program that connected.
        try Self.checkHoldsPeer(of: socket, process, pid)
        let kind: PeerIdentity.Kind
        var executableIsAtPath = false
        if let appID = try Self.flatpakAppID(process, pid) {
            kind = .flatpak(appID: appID)
        } else if let unit = SystemdCgroup.userService(cgroupFile: try Self.text(process, "cgroup", pid), uid: uid) {
            kind = .systemdUnit(unit)
            executableIsAtPath = executablePath.hasPrefix("/") && (try? Self.checkRunsTheFileAt(executablePath, process, pid)) != nil
        } else {
            // A memfd's target is "/memfd:NAME (deleted)": no file anyone can name.
            guard executablePath.hasPrefix("/"), !executablePath.hasPrefix("/memfd:") else {
                throw Self.refused("process \(pid) runs no file with a path (\(executablePath)); only programs run from a file can be identified.")
            }
            try Self.checkRunsTheFileAt(executablePath, process, pid)
            executableIsAtPath = true
            kind = .executable(path: executablePath)
        }
        let digest = hashExecutable ? try Self.executableDigest(process, pid) : nil

        // Still the same process, and still there: what was read above is its.
        guard try Self.startTime(process, pid) == startTime else { throw Self.exited(pid) }
        try Self.checkAlive(pidfd, pid)
        return PeerIdentity(
            uid: UInt32(uid), pid: Int32(pid), kind: kind, executablePath: executablePath, executableSHA256: digest, startTime: startTime,
            executableIsAtPath: executableIsAtPath)
    }

    // MARK: Steps

    static func refused(_ reason: String) -> LockboxError {
        LockboxError(.authFailed, "The broker refused the connection: \(reason)")
    }

    static func exited(_ pid: pid_t) -> LockboxError {
        refused("process \(pid) exited while it was being identified.")
    }

    /// CLOCK_BOOTTIME in clock ticks, the unit of `/proc/PID/stat`'s start time.
    static func bootTimeTicks() throws(LockboxError) -> UInt64 {
        var now = timespec()
        guard clock_gettime(CLOCK_BOOTTIME, &now) == 0 else {
            throw LockboxError(.io, "Reading the boot-time clock failed.", cause: .systemCall("clock_gettime", errno: errno))
        }
        let ticksPerSecond = UInt64(sysconf(Int32(_SC_CLK_TCK)))
        return UInt64(now.tv_sec) * ticksPerSecond + UInt64(now.tv_nsec) * ticksPerSecond / 1_000_000_000
    }

    /// The kernel's pidfd for the peer (SO_PEERPIDFD, taken when it connected), else one opened
    /// now for its pid (older kernels: the start-time check then covers the gap).
    static func pidfd(socket: Int32, pid: pid_t, fromSocket useSocket: Bool) throws(LockboxError) -> FileDescriptor {
        if useSocket {
            let fromSocket = lockbox_peer_pidfd(socket)
            if fromSocket >= 0 {
                let descriptor = FileDescriptor(fromSocket)
                // The pid the pidfd refers to now: -1 once the process has been reaped.
                guard let pidLine = fdinfoPid(descriptor.raw) else { return descriptor }
                guard pidLine == pid else { throw exited(pid) }
                return descriptor
            }
            let socketErrno = errno
            guard socketErrno == ENOPROTOOPT || socketErrno == EINVAL else {
                if socketErrno == ESRCH { throw exited(pid) }
                throw LockboxError(
                    .io, "Taking the client's pidfd failed.", cause: .systemCall("getsockopt(SO_PEERPIDFD)", errno: socketErrno))
            }
        }
        let opened = lockbox_pidfd_open(pid)
        guard opened >= 0 else {
            if errno == ESRCH { throw exited(pid) }
            throw LockboxError(
                .io, "Opening a pidfd for process \(pid) failed; the broker needs Linux 5.3 or later.",
                cause: .systemCall("pidfd_open", errno: errno))
        }
        return FileDescriptor(opened)
    }

    /// Throws unless the process has a descriptor of the socket at the other end of `socket`.
    static func checkHoldsPeer(of socket: Int32, _ process: FileDescriptor, _ pid: pid_t) throws(LockboxError) {
        var peerInode: UInt32 = 0
        guard lockbox_unix_peer_inode(socket, &peerInode) == 0 else {
            if errno == ENOENT { throw exited(pid) }
            throw LockboxError(
                .notAvailable,
                "The broker cannot ask the kernel which socket its client holds (NETLINK_SOCK_DIAG failed), which it needs on "
                    + "kernels before 6.5 to pin a client against pid reuse. Load the unix_diag module (modprobe unix_diag).",
                cause: .systemCall("sock_diag(UNIX_DIAG_PEER)", errno: errno))
        }
        guard let descriptors = FileDescriptor.open("fd", relativeTo: process, flags: O_RDONLY | O_DIRECTORY) else {
            if errno == EACCES || errno == EPERM {
                throw refused("process \(pid) is not dumpable (PR_SET_DUMPABLE 0), so the broker may not check that it holds the connection.")
            }
            throw exited(pid)
        }
        let expected = "socket:[\(peerInode)]"
        let duplicate = dup(descriptors.raw)
        guard duplicate >= 0 else { throw LockboxError(.io, "Duplicating a descriptor failed.", cause: .systemCall("dup", errno: errno)) }
        guard let directory = fdopendir(duplicate) else {
            close(duplicate)
            throw exited(pid)
        }
        defer { closedir(directory) }
        var buffer = [CChar](repeating: 0, count: 64)
        var heldAcrossExec = false
        while let entry = readdir(directory) {
            let name = DirectoryEntry.name(entry)
            let count = readlinkat(descriptors.raw, name, &buffer, buffer.count - 1)
            guard count > 0, String(decoding: buffer[0..<count].map { UInt8(bitPattern: $0) }, as: UTF8.self) == expected else { continue }
            if try closesOnExec(descriptor: name, process, pid) { return }
            heldAcrossExec = true
        }
        if heldAcrossExec {
            throw refused(
                "process \(pid) holds the connection only through a descriptor without close-on-exec, which a program it ran since "
                    + "connecting would have kept: open the connection with SOCK_CLOEXEC (Lockbox's clients do).")
        }
        throw refused(
            "process \(pid) does not hold the connection, so it cannot be shown to be the process that connected (its number may "
                + "have been reused); connect again from the process that uses the connection.")
    }

    /// Whether the process's descriptor `name` has close-on-exec, from the `flags:` line
    /// (octal) of `/proc/PID/fdinfo/NAME`.
    static func closesOnExec(descriptor name: String, _ process: FileDescriptor, _ pid: pid_t) throws(LockboxError) -> Bool {
        guard let file = FileDescriptor.open("fdinfo/" + name, relativeTo: process, flags: O_RDONLY), let bytes = file.readAll(limit: 4096)
        else { throw exited(pid) }
        for line in String(decoding: bytes, as: UTF8.self).split(separator: "\n") where line.hasPrefix("flags:") {
            guard let flags = Int(line.dropFirst(6).trimmingWhitespace, radix: 8) else { return false }
            return flags & Int(O_CLOEXEC) != 0
        }
        return false
    }

    /// The `Pid:` line of a pidfd's fdinfo; nil when the kernel does not show one.
    static func fdinfoPid(_ pidfd: Int32) -> pid_t? {
        guard let file = FileDescriptor.open("/proc/self/fdinfo/\(pidfd)", flags: O_RDONLY),
            let bytes = file.readAll(limit: 4096)
        else { return nil }
        for line in String(decoding: bytes, as: UTF8.self).split(separator: "\n") where line.hasPrefix("Pid:") {
            return pid_t(line.dropFirst(4).trimmingWhitespace)
        }
        return nil
    }

    static func checkAlive(_ pidfd: FileDescriptor, _ pid: pid_t) throws(LockboxError) {
        guard lockbox_pidfd_probe(pidfd.raw) == 0 else { throw exited(pid) }
    }

    /// Field 22 of `/proc/PID/stat`; a zombie counts as exited.
    static func startTime(_ process: FileDescriptor, _ pid: pid_t) throws(LockboxError) -> UInt64 {
        let stat = try text(process, "stat", pid)
        // The command name (field 2) is in parentheses and may hold anything, ')' included.
        guard let close = stat.lastIndex(of: ")") else { throw exited(pid) }
        let fields = stat[stat.index(after: close)...].split(separator: " ")
        // fields[0] is field 3 (the state), so field 22 is fields[19].
        guard fields.count > 19, let startTime = UInt64(fields[19]) else {
            throw refused("/proc/\(pid)/stat has an unexpected layout.")
        }
        if fields[0] == "Z" || fields[0] == "X" { throw exited(pid) }
        return startTime
    }

    static func text(_ process: FileDescriptor, _ name: String, _ pid: pid_t) throws(LockboxError) -> String {
        guard let file = FileDescriptor.open(name, relativeTo: process, flags: O_RDONLY | O_NOFOLLOW),
            let bytes = file.readAll(limit: cgroupLimit)
        else { throw exited(pid) }
        return String(decoding: bytes, as: UTF8.self)
    }

    /// That the file at `path`, as the broker's own mount namespace resolves it, is the file the
    /// process runs (same device and inode). `/proc/PID/exe` names a path as the process's
    /// namespace sees it: a bind mount in a namespace of its own (`unshare -rm`) puts any file
    /// under an entitled program's path, and a file named "NAME (deleted)" reads as NAME. A
    /// program whose file was replaced since it started (an upgrade) is refused too, until it
    /// is started again.
    static func checkRunsTheFileAt(_ path: String, _ process: FileDescriptor, _ pid: pid_t) throws(LockboxError) {
        var running = stat()
        guard fstatat(process.raw, "exe", &running, 0) == 0 else {
            if errno == EACCES || errno == EPERM {
                throw refused("the broker may not look at the program of process \(pid) (it is not dumpable).")
            }
            throw exited(pid)
        }
        var named = stat()
        guard stat(path, &named) == 0, named.st_dev == running.st_dev, named.st_ino == running.st_ino else {
            throw refused(
                "process \(pid) does not run the file at \(path) as the broker sees it: the file was replaced since the program "
                    + "started (start it again), or the path is another file in the program's own mount namespace.")
        }
    }

    /// That the process has its program (`path`, as `/proc/PID/exe` named it) mapped: a process
    /// in the middle of an exec has none of the new program's mappings yet.
    static func checkMapsItsProgram(_ path: String, _ process: FileDescriptor, _ pid: pid_t) throws(LockboxError) {
        guard path.hasPrefix("/"), !path.hasPrefix("/memfd:") else { return }
        guard let file = FileDescriptor.open("maps", relativeTo: process, flags: O_RDONLY), let bytes = file.readAll(limit: 64 << 20)
        else {
            if errno == EACCES || errno == EPERM {
                throw refused("process \(pid) is not dumpable (PR_SET_DUMPABLE 0), so the broker may not read which program it maps.")
            }
            throw exited(pid)
        }
        let mapped = String(decoding: bytes, as: UTF8.self).split(separator: "\n").contains { line in
            // "start-end perms offset dev inode   path": the path is the rest after five fields.
            var fields = line.split(separator: " ", maxSplits: 5, omittingEmptySubsequences: true)
            guard fields.count == 6 else { return false }
            var name = fields.removeLast().drop { $0 == " " }
            if name.hasSuffix(" (deleted)") { name = name.dropLast(" (deleted)".count) }
            return name == path
        }
        guard mapped else {
            throw refused("process \(pid) is in the middle of running another program (exec); connect again once it runs.")
        }
    }

    /// `/proc/PID/exe`'s target; a file replaced since it was started keeps its path.
    static func executablePath(_ process: FileDescriptor, _ pid: pid_t) throws(LockboxError) -> String {
        var buffer = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
        let count = readlinkat(process.raw, "exe", &buffer, buffer.count - 1)
        guard count > 0 else {
            if errno == EACCES || errno == EPERM {
                throw refused(
                    "process \(pid) is not dumpable (PR_SET_DUMPABLE 0), so the broker may not read which program it runs. "
                        + "A client connects and is identified before it makes itself non-dumpable.")
            }
            throw exited(pid)
        }
        let path = String(decoding: buffer[0..<count].map { UInt8(bitPattern: $0) }, as: UTF8.self)
        let deleted = " (deleted)"
        return path.hasSuffix(deleted) ? String(path.dropLast(deleted.count)) : path
    }

    /// The app id in the sandbox's `/.flatpak-info`, read through the process's root without
    /// following a link; nil when its root has none. A file there that is not a regular file or
    /// names no valid app id is refused: the process is sandboxed but says nothing usable.
    static func flatpakAppID(_ process: FileDescriptor, _ pid: pid_t) throws(LockboxError) -> String? {
        guard let root = FileDescriptor.open("root", relativeTo: process, flags: LOCKBOX_O_PATH | O_DIRECTORY) else {
            if errno == EACCES || errno == EPERM {
                throw refused("the broker may not look into the root directory of process \(pid) (it is not dumpable).")
            }
            throw exited(pid)
        }
        guard let info = FileDescriptor.open(".flatpak-info", relativeTo: root, flags: O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY)
        else {
            if errno == ENOENT { return nil }
            throw refused("process \(pid) has a /.flatpak-info that cannot be opened as a file (errno \(errno)).")
        }
        guard let status = info.status(), status.st_mode & S_IFMT == S_IFREG,
            let bytes = info.readAll(limit: flatpakInfoLimit)
        else {
            throw refused("process \(pid) has a /.flatpak-info that is not a readable regular file.")
        }
        guard let appID = FlatpakInfo.appID(keyFile: String(decoding: bytes, as: UTF8.self)) else {
            throw refused("process \(pid) runs in a Flatpak sandbox whose /.flatpak-info names no valid application.")
        }
        return appID
    }

    /// SHA-256 of the file the process executes: `/proc/PID/exe` opens the running inode, not
    /// whatever is at its path now.
    static func executableDigest(_ process: FileDescriptor, _ pid: pid_t) throws(LockboxError) -> String {
        guard let executable = FileDescriptor.open("exe", relativeTo: process, flags: O_RDONLY) else {
            if errno == EACCES || errno == EPERM {
                throw refused("the broker may not read the program of process \(pid) to check its SHA-256 (it is not dumpable).")
            }
            throw exited(pid)
        }
        guard let status = executable.status() else { throw exited(pid) }
        let version = FileVersion(status)
        if let known = digests.withLock({ $0[version] }) { return known }
        var hash = SHA256()
        guard executable.readChunks({ hash.update($0) }) else { throw exited(pid) }
        let digest = hash.finalizeHex()
        digests.withLock { cache in
            if cache.count >= 256 { cache.removeAll() }
            cache[version] = digest
        }
        return digest
    }

    /// One version of a file: writing to it, or replacing it, changes the modification and
    /// change times (and a file being executed cannot be opened for writing at all).
    struct FileVersion: Hashable {
        let fields: [Int]
        init(_ status: stat) {
            fields = [
                Int(status.st_dev), Int(status.st_ino), Int(status.st_size), Int(status.st_mtim.tv_sec), Int(status.st_mtim.tv_nsec),
                Int(status.st_ctim.tv_sec), Int(status.st_ctim.tv_nsec),
            ]
        }
    }

    /// Digests of executables already hashed, so that a program that connects again costs a
    /// `fstat`, not a read of its whole file.
    static let digests = Mutex<[FileVersion: String]>([:])
}
