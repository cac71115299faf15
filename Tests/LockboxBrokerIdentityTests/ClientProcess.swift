import Foundation
import LockboxTestSupport

#if canImport(Glibc)
import Glibc
#endif

/// A listening Unix socket in a private temporary directory.
final class Listener {
    let directory: TemporaryDirectory
    let path: String
    let descriptor: Int32

    init(mode: mode_t = 0o700) throws {
        directory = TemporaryDirectory("lockbox-identity")
        chmod(directory.path, mode)
        path = directory.file("broker.sock")
        descriptor = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard descriptor >= 0 else { throw TestFailure("socket: errno \(errno)") }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &address.sun_path) { buffer in
            let bytes = Array(path.utf8)
            buffer.copyBytes(from: bytes)
            buffer[bytes.count] = 0
        }
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(descriptor, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        guard bound == 0, chmod(path, 0o777) == 0, listen(descriptor, 8) == 0 else { throw TestFailure("bind/listen: errno \(errno)") }
    }

    /// The next connection; fails after 20 seconds without one (the client did not connect).
    func accept() throws -> Int32 {
        var poller = pollfd(fd: descriptor, events: Int16(POLLIN), revents: 0)
        guard poll(&poller, 1, 20_000) == 1 else { throw TestFailure("no client connected to \(path) within 20 s") }
        let connection = Glibc.accept(descriptor, nil, nil)
        guard connection >= 0 else { throw TestFailure("accept: errno \(errno)") }
        // Not inherited by the clients other tests start meanwhile.
        _ = fcntl(connection, F_SETFD, FD_CLOEXEC)
        return connection
    }

    deinit { close(descriptor) }
}

struct TestFailure: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

/// The Python that clients run (Debian's, not a version manager's shim script).
let systemPython = "/usr/bin/python3"

/// A client program started with posix_spawn, so that the test decides when it is reaped (a
/// zombie stays one until `reap`). It holds a pipe on its stdin: closing it ends the client.
final class ClientProcess {
    let pid: pid_t
    private var stdinWriter: Int32
    private(set) var reaped = false

    /// Connects to `socketPath` with Python, then (unless `exitAtOnce`) waits for stdin to close.
    /// `beforeConnect` is Python run first.
    convenience init(
        connectingTo socketPath: String, program: [String] = [systemPython], beforeConnect: String = "", exitAtOnce: Bool = false,
        environment: [String: String] = [:]
    ) throws {
        let script = """
            import socket, sys
            \(beforeConnect)
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(sys.argv[1])
            \(exitAtOnce ? "sys.exit(0)" : "sys.stdin.buffer.read()")
            """
        try self.init(program + ["-c", script, socketPath], environment: environment)
    }

    init(_ arguments: [String], environment: [String: String] = [:]) throws {
        var pipeEnds: [Int32] = [0, 0]
        guard pipe(&pipeEnds) == 0 else { throw TestFailure("pipe: errno \(errno)") }
        _ = fcntl(pipeEnds[1], F_SETFD, FD_CLOEXEC)
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_adddup2(&actions, pipeEnds[0], 0)
        var merged = ProcessInfo.processInfo.environment
        for (key, value) in environment { merged[key] = value }
        let argv = arguments.map { strdup($0) } + [nil]
        let envp = merged.map { strdup("\($0.key)=\($0.value)") } + [nil]
        defer {
            argv.forEach { free($0) }
            envp.forEach { free($0) }
        }
        var child = pid_t()
        let status = posix_spawn(&child, arguments[0], &actions, nil, argv, envp)
        close(pipeEnds[0])
        guard status == 0 else {
            close(pipeEnds[1])
            throw TestFailure("posix_spawn \(arguments[0]): errno \(status)")
        }
        pid = child
        stdinWriter = pipeEnds[1]
    }

    /// Closes its stdin and waits for it to exit.
    func finish() {
        if stdinWriter >= 0 {
            close(stdinWriter)
            stdinWriter = -1
        }
        reap()
    }

    func kill() { _ = Glibc.kill(pid, SIGKILL) }

    /// Waits for it to exit and collects it; its pid is then free for reuse.
    @discardableResult
    func reap() -> Int32 {
        guard !reaped else { return 0 }
        var status: Int32 = 0
        while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
        reaped = true
        return status
    }

    /// Waits until it is a zombie (exited, not reaped).
    func waitUntilZombie() throws {
        for _ in 0..<400 {
            if let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
                let close = stat.lastIndex(of: ")"), stat[stat.index(close, offsetBy: 2)] == "Z"
            {
                return
            }
            usleep(25_000)
        }
        throw TestFailure("process \(pid) did not exit within 10 s")
    }

    deinit {
        if stdinWriter >= 0 { close(stdinWriter) }
        if !reaped {
            kill()
            reap()
        }
    }
}

/// Field 22 of /proc/PID/stat, read the plain way.
func startTime(of pid: pid_t) throws -> UInt64 {
    let stat = try String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8)
    let fields = stat[stat.index(after: stat.lastIndex(of: ")")!)...].split(separator: " ")
    return UInt64(fields[19])!
}

/// The real path of a file, symbolic links resolved.
func realPath(_ path: String) -> String {
    guard let resolved = realpath(path, nil) else { return path }
    defer { free(resolved) }
    return String(cString: resolved)
}
