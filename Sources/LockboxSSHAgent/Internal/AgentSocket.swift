import Foundation
import LockboxCore
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// The agent's listening Unix socket: a 0600 socket in a 0700 directory of this user, removed
/// when the agent ends (SIGTERM, SIGINT, SIGHUP).
package final class AgentListener: Sendable {
    package let path: String
    private let descriptor: Int32
    /// Connections served at once; more are closed at once (a local client flooding the agent
    /// cannot make it run out of threads or descriptors).
    package static let maximumConnections = 64
    /// A connection that sends nothing for this long is closed.
    package static let idleSeconds = 120

    /// `$XDG_RUNTIME_DIR/lockbox/ssh-agent.sock`.
    /// - Throws: `param` when `XDG_RUNTIME_DIR` is not set to an absolute path.
    package static func defaultPath() throws(LockboxError) -> String {
        guard let runtime = ProcessEnvironment.value("XDG_RUNTIME_DIR"), !runtime.isEmpty else {
            throw LockboxError(
                .param, "XDG_RUNTIME_DIR is not set, so there is no private place for the agent's socket. Set it, or give one with -a PATH.")
        }
        guard runtime.hasPrefix("/") else {
            throw LockboxError(
                .param, "XDG_RUNTIME_DIR is a relative path, which names no fixed place for the agent's socket. "
                    + "Set it to an absolute path (such as /run/user/\(getuid())), or give one with -a PATH.")
        }
        return runtime + "/lockbox/ssh-agent.sock"
    }

    /// Makes the socket's directory (mode 0700) when missing, checks it is this user's and
    /// private, replaces a stale socket, and listens.
    /// - Throws: `duplicateItem` when another agent answers on `path`; `param` for an unsafe
    ///   directory; `io` when a system call fails.
    package init(path: String) throws(LockboxError) {
        guard path.utf8.count < MemoryLayout.size(ofValue: sockaddr_un().sun_path) else {
            throw LockboxError(.param, "The socket path is too long for a Unix socket (\(path.utf8.count) bytes); choose a shorter one.")
        }
        let directory = path.lastIndex(of: "/").map { String(path[..<$0]) } ?? "."
        try Self.preparePrivateDirectory(directory.isEmpty ? "/" : directory)
        try Self.removeStaleSocket(at: path)

        let socketDescriptor = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard socketDescriptor >= 0 else { throw Self.systemError("socket", "Creating the agent's socket failed.") }
        var address = Self.address(path)
        // Created 0600: no moment where another user could connect.
        let previousMask = umask(0o177)
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(socketDescriptor, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        let bindErrno = errno
        umask(previousMask)
        guard bound == 0 else {
            close(socketDescriptor)
            throw LockboxError(.io, "Binding the agent's socket at \(path) failed.", cause: .systemCall("bind", errno: bindErrno))
        }
        guard chmod(path, 0o600) == 0, listen(socketDescriptor, 64) == 0 else {
            let failure = Self.systemError("listen", "Listening on the agent's socket at \(path) failed.")
            close(socketDescriptor)
            unlink(path)
            throw failure
        }
        self.path = path
        descriptor = socketDescriptor
        Self.removeOnSignal(path)
    }

    /// Accepts connections for ever, each served by `responder` on the thread that accepted it.
    ///
    /// Threads wait in `accept` (the kernel wakes one per connection), and the one that takes a
    /// connection reads, answers and closes it itself: a listing costs one thread wake-up, as in
    /// a single-threaded agent, instead of a wake-up of the accepting thread and another of a
    /// worker it hands the connection to. A thread that takes a connection while no other waits
    /// in `accept` starts one first, so a connection that waits for the user (a `.userPresence`
    /// prompt) never holds the others back; past ``spareAcceptors`` waiting, a thread that
    /// finishes a connection ends.
    package func serve(_ responder: AgentResponder, log: @escaping @Sendable (String) -> Void) -> Never {
        let acceptors = AcceptorPool(listener: self, responder: responder, log: log)
        for _ in 1..<Self.spareAcceptors { acceptors.startAcceptor() }
        while true {
            acceptors.acceptWhileNeeded()
            // This thread always goes back to waiting, even when enough others wait.
            acceptors.rejoin()
        }
    }

    /// Threads kept waiting in `accept` beyond those serving a connection.
    package static let spareAcceptors = 2

    /// One accepted connection of this user (or root), or nil after a transient failure or a
    /// refusal; ends the process when `accept` fails for good.
    fileprivate func acceptConnection(log: @Sendable (String) -> Void) -> Int32? {
        // accept4 needs _GNU_SOURCE, which Glibc's Swift module does not define.
        let connection = accept(descriptor, nil, nil)
        if connection < 0 {
            switch errno {
            case EINTR, ECONNABORTED: return nil
            case EMFILE, ENFILE, ENOBUFS, ENOMEM:
                usleep(100_000)
                return nil
            default:
                log("accept failed (errno \(errno)); the agent stops")
                unlink(path)
                exit(1)
            }
        }
        _ = fcntl(connection, F_SETFD, FD_CLOEXEC)
        // The socket is 0600, so only this user (and root) can connect; check it anyway.
        var credentials = PeerCredentials()
        var length = socklen_t(MemoryLayout<PeerCredentials>.size)
        guard getsockopt(connection, SOL_SOCKET, SO_PEERCRED, &credentials, &length) == 0,
            credentials.uid == getuid() || credentials.uid == 0
        else {
            log("refused a connection from another user")
            close(connection)
            return nil
        }
        var timeout = timeval(tv_sec: Self.idleSeconds, tv_usec: 0)
        _ = setsockopt(connection, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        return connection
    }

    deinit {
        close(descriptor)
    }

    // MARK: Internals

    private static func address(_ path: String) -> sockaddr_un {
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &address.sun_path) { buffer in
            let bytes = Array(path.utf8)
            buffer.copyBytes(from: bytes)
            buffer[bytes.count] = 0
        }
        return address
    }

    private static func systemError(_ call: String, _ message: String) -> LockboxError {
        LockboxError(.io, message, cause: .systemCall(call, errno: errno))
    }

    private static func preparePrivateDirectory(_ directory: String) throws(LockboxError) {
        if mkdir(directory, 0o700) != 0 && errno != EEXIST {
            throw systemError("mkdir", "Creating the agent's directory \(directory) failed.")
        }
        var status = stat()
        guard lstat(directory, &status) == 0 else { throw systemError("lstat", "Checking the agent's directory \(directory) failed.") }
        guard status.st_mode & S_IFMT == S_IFDIR, status.st_uid == getuid() else {
            throw LockboxError(.param, "\(directory) is not a directory of this user; the agent's socket goes only in a private directory.")
        }
        guard status.st_mode & 0o077 == 0 else {
            throw LockboxError(
                .param, "\(directory) is readable or writable by other users; make it private (chmod 700) or choose another socket path.")
        }
    }

    private static func removeStaleSocket(at path: String) throws(LockboxError) {
        var status = stat()
        guard lstat(path, &status) == 0 else { return }
        guard status.st_mode & S_IFMT == S_IFSOCK else {
            throw LockboxError(.param, "\(path) exists and is not a socket; remove it or choose another path.")
        }
        let probe = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard probe >= 0 else { throw systemError("socket", "Checking the socket at \(path) failed.") }
        defer { close(probe) }
        var address = address(path)
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(probe, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        if connected == 0 {
            throw LockboxError(.duplicateItem, "An agent is already serving \(path). Stop it first, or choose another path with -a.")
        }
        guard unlink(path) == 0 else { throw systemError("unlink", "Removing the stale socket \(path) failed.") }
    }

    private static func removeOnSignal(_ path: String) {
        signalSocketPath = strdup(path)
        signal(SIGPIPE, SIG_IGN)
        // A parent may have started the agent with these blocked (a mask is inherited).
        var stopping = sigset_t()
        sigemptyset(&stopping)
        for signalNumber in [SIGTERM, SIGINT, SIGHUP] { sigaddset(&stopping, signalNumber) }
        pthread_sigmask(SIG_UNBLOCK, &stopping, nil)
        for signalNumber in [SIGTERM, SIGINT, SIGHUP] {
            signal(signalNumber) { _ in
                if let path = signalSocketPath { unlink(path) }
                _exit(0)
            }
        }
    }
}

/// Linux's `struct ucred` (SO_PEERCRED), which Glibc's Swift module hides behind _GNU_SOURCE.
private struct PeerCredentials {
    var pid: pid_t = 0
    var uid: uid_t = 0
    var gid: gid_t = 0
}

/// The socket path, for the signal handler (which may only call async-signal-safe functions).
nonisolated(unsafe) private var signalSocketPath: UnsafeMutablePointer<CChar>?

/// One client's connection: frames in, replies out, until it closes or sends garbage.
/// The threads that wait in `accept` and serve what they accept (see ``AgentListener/serve(_:log:)``).
private final class AcceptorPool: Sendable {
    let listener: AgentListener
    let responder: AgentResponder
    let log: @Sendable (String) -> Void
    /// Threads waiting in `accept` (or about to).
    private let waiting = Atomic<Int>(1)
    /// Connections being served.
    private let active = Atomic<Int>(0)

    init(listener: AgentListener, responder: AgentResponder, log: @escaping @Sendable (String) -> Void) {
        self.listener = listener
        self.responder = responder
        self.log = log
    }

    func startAcceptor() {
        waiting.add(1, ordering: .relaxed)
        Thread.detachNewThread { [self] in
            self.acceptWhileNeeded()
        }
    }

    /// Counts the calling thread among those waiting again (after ``acceptWhileNeeded()``
    /// returned on it).
    func rejoin() {
        waiting.add(1, ordering: .relaxed)
    }

    /// Accepts and serves on the calling thread; returns when, after a connection, enough
    /// other threads wait in `accept` (the thread is not counted as waiting then).
    func acceptWhileNeeded() {
        while true {
            guard let connection = listener.acceptConnection(log: log) else { continue }
            // This thread stops waiting: leave another one waiting for the next connection.
            if waiting.subtract(1, ordering: .relaxed).newValue == 0 { startAcceptor() }
            // Past the limit, closed at once: a local client flooding the agent cannot make it
            // run out of threads or descriptors.
            if active.add(1, ordering: .relaxed).newValue <= AgentListener.maximumConnections {
                AgentConnection.serve(connection, responder: responder)
            }
            close(connection)
            active.subtract(1, ordering: .relaxed)
            // Enough threads wait already: this one is not needed.
            if waiting.add(1, ordering: .relaxed).newValue > AgentListener.spareAcceptors {
                waiting.subtract(1, ordering: .relaxed)
                return
            }
        }
    }
}

enum AgentConnection {
    static func serve(_ descriptor: Int32, responder: AgentResponder) {
        var decoder = FrameDecoder()
        var buffer = [UInt8](repeating: 0, count: 16 * 1024)
        while true {
            let count = buffer.withUnsafeMutableBytes { read(descriptor, $0.baseAddress, $0.count) }
            if count < 0 && errno == EINTR { continue }
            // Closed, reset or idle too long: a request cut short is dropped unanswered.
            guard count > 0 else { return }
            decoder.append(buffer[0..<count])
            do {
                while let body = try decoder.nextBody() {
                    guard sendAll(responder.reply(toBody: body), to: descriptor) else { return }
                }
            } catch {
                // A frame that cannot be one (empty, over the limit): the stream cannot be
                // resynchronised, so answer once and close.
                _ = sendAll(AgentReply.failure, to: descriptor)
                return
            }
        }
    }

    private static func sendAll(_ bytes: [UInt8], to descriptor: Int32) -> Bool {
        var offset = 0
        while offset < bytes.count {
            let sent = bytes.withUnsafeBytes { send(descriptor, $0.baseAddress! + offset, $0.count - offset, Int32(MSG_NOSIGNAL)) }
            if sent < 0 && errno == EINTR { continue }
            guard sent > 0 else { return false }
            offset += sent
        }
        return true
    }
}
