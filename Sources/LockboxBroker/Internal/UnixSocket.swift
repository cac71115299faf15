import LockboxCore

#if canImport(Glibc)
import Glibc
#endif

/// The one funnel for the broker's socket system calls: retries EINTR, captures errno at once.
enum SystemCall {
    static func check(_ operation: String, _ what: String, _ body: () -> Int32) throws(LockboxError) -> Int32 {
        while true {
            let result = body()
            if result >= 0 { return result }
            let code = errno
            if code == EINTR { continue }
            throw LockboxError(
                .io, "\(what) failed: \(String(cString: strerror(code))).", cause: .systemCall(operation, errno: code))
        }
    }
}

/// A connected Unix stream socket, closed when released. One thread uses it at a time.
final class UnixSocket: @unchecked Sendable {
    // The descriptor is owned by this object alone; callers serialize their use.
    let descriptor: Int32

    init(descriptor: Int32) { self.descriptor = descriptor }

    deinit { close(descriptor) }

    /// The frame's bytes, or nil at a clean end of stream before a frame began.
    /// - Throws: `errSecParam` for a length over `limit` (nothing more is read); `errSecIO` for
    ///   a stream that ends inside a frame or a failed read.
    func readFrame(limit: Int) throws(LockboxError) -> [UInt8]? {
        var header = [UInt8](repeating: 0, count: 4)
        let got = try readFully(&header, allowCleanEnd: true)
        guard got else { return nil }
        let length = Int(UInt32(header[0]) | UInt32(header[1]) << 8 | UInt32(header[2]) << 16 | UInt32(header[3]) << 24)
        guard length <= limit else {
            throw LockboxError(.param, "A broker frame of \(length) bytes is over the limit of \(limit) bytes; it was refused.")
        }
        var body = [UInt8](repeating: 0, count: length)
        _ = try readFully(&body, allowCleanEnd: false)
        return body
    }

    /// Writes one frame (length, then bytes) in a single send where it fits.
    func writeFrame(_ bytes: [UInt8]) throws(LockboxError) {
        var frame = [UInt8]()
        frame.reserveCapacity(bytes.count + 4)
        withUnsafeBytes(of: UInt32(bytes.count).littleEndian) { frame.append(contentsOf: $0) }
        frame.append(contentsOf: bytes)
        defer { frame.wipe() }
        var offset = 0
        while offset < frame.count {
            let sent = frame[offset...].withUnsafeBytes { send(descriptor, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            if sent < 0 {
                if errno == EINTR { continue }
                throw LockboxError(
                    .io, "The broker connection was closed: \(String(cString: strerror(errno))).", cause: .systemCall("send", errno: errno))
            }
            offset += sent
        }
    }

    private func readFully(_ buffer: inout [UInt8], allowCleanEnd: Bool) throws(LockboxError) -> Bool {
        var offset = 0
        while offset < buffer.count {
            let count = buffer[offset...].withUnsafeMutableBytes { recv(descriptor, $0.baseAddress, $0.count, 0) }
            if count > 0 {
                offset += count
            } else if count == 0 {
                if offset == 0 && allowCleanEnd { return false }
                throw LockboxError(.io, "The broker connection ended in the middle of a message.")
            } else if errno == EINTR {
                continue
            } else if errno == EAGAIN || errno == EWOULDBLOCK {
                throw LockboxError(.io, "The broker did not answer in time.", cause: .systemCall("recv", errno: errno))
            } else {
                throw LockboxError(
                    .io, "Reading from the broker connection failed: \(String(cString: strerror(errno))).",
                    cause: .systemCall("recv", errno: errno))
            }
        }
        return true
    }

    /// Waits up to `budget` nanoseconds for something to read without sleeping, yielding the
    /// processor between looks; then returns whatever the socket holds (the read that follows
    /// blocks as before). An answer that comes within the budget is read at once, not after
    /// the scheduler wakes a sleeping thread, which on an idle machine costs more than the
    /// broker's own work on a read.
    func awaitReadable(budget nanoseconds: UInt64) {
        var start = timespec()
        clock_gettime(CLOCK_MONOTONIC, &start)
        var entry = pollfd(fd: descriptor, events: Int16(POLLIN), revents: 0)
        while poll(&entry, 1, 0) == 0 {
            var now = timespec()
            clock_gettime(CLOCK_MONOTONIC, &now)
            let elapsed = (now.tv_sec - start.tv_sec) * 1_000_000_000 + (now.tv_nsec - start.tv_nsec)
            if elapsed < 0 || UInt64(elapsed) >= nanoseconds { return }
            sched_yield()
        }
    }

    /// The peer's process id, user id and group id, as the kernel recorded them at connect.
    func peerCredentials() throws(LockboxError) -> PeerCredentials {
        try Self.peerCredentials(descriptor)
    }

    /// Bounds how long a read waits (0: as long as it takes).
    func setReceiveTimeout(seconds: Int) throws(LockboxError) {
        var interval = timeval(tv_sec: seconds, tv_usec: 0)
        _ = try SystemCall.check("setsockopt", "Setting the broker connection's timeout") {
            setsockopt(descriptor, SOL_SOCKET, SO_RCVTIMEO, &interval, socklen_t(MemoryLayout<timeval>.size))
        }
    }

    // MARK: Addresses

    /// A `sockaddr_un` for `path`, passed to `body`.
    static func withAddress<T>(
        _ path: String, _ body: (UnsafePointer<sockaddr>, socklen_t) -> T
    ) throws(LockboxError) -> T {
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(path.utf8)
        let capacity = MemoryLayout.size(ofValue: address.sun_path)
        guard bytes.count < capacity else {
            throw LockboxError(.param, "The broker socket path \(path) is longer than \(capacity - 1) bytes; choose a shorter one.")
        }
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            raw.copyBytes(from: bytes)
            raw[bytes.count] = 0
        }
        return withUnsafePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { body($0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
    }

    /// Connects to `path`; the errno of a failed connect is in the thrown error's cause.
    static func connect(to path: String) throws(LockboxError) -> UnixSocket {
        // Never on a standard descriptor a program left closed (what it prints would go to lockboxd).
        let descriptor = try SystemCall.check("socket", "Creating a socket") {
            StandardDescriptors.movedAbove(socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0))
        }
        let connection = UnixSocket(descriptor: descriptor)
        let result = try withAddress(path) { address, length in
            var result: Int32
            repeat { result = Glibc.connect(descriptor, address, length) } while result < 0 && errno == EINTR
            return result < 0 ? errno : 0
        }
        guard result == 0 else {
            throw LockboxError(
                .notAvailable, "Cannot connect to the broker at \(path): \(String(cString: strerror(result))).",
                cause: .systemCall("connect", errno: result))
        }
        return connection
    }
}
