import Synchronization
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
import Dispatch
import Foundation

/// A one-shot HTTP listener on 127.0.0.1 for an OAuth redirect (RFC 8252 section 7.3): it
/// accepts connections until one asks for the redirect path, answers it with a short page and
/// returns its query. Bound to the loopback address only, never to all interfaces.
final class LoopbackListener: Sendable {
    private let descriptor: Int32
    let port: UInt16

    init() throws(AuthError) {
        let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard descriptor >= 0 else { throw .configuration("cannot create the loopback socket (errno \(errno))") }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = 0
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(descriptor, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard bound == 0, listen(descriptor, 8) == 0 else {
            close(descriptor)
            throw .configuration("cannot listen on 127.0.0.1 (errno \(errno))")
        }
        var actual = sockaddr_in()
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &actual) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(descriptor, $0, &length) }
        }
        self.descriptor = descriptor
        self.port = UInt16(bigEndian: actual.sin_port)
    }

    deinit {
        close(descriptor)
    }

    /// Waits (off the cooperative pool) for a request for `path` whose query `isValid` approves;
    /// returns its query items. Requests for `path` that `isValid` refuses are answered 400 and
    /// ignored; other paths get 404. Cancelling the task ends the wait within a second.
    func waitForRedirect(
        path: String, timeout: Duration, isValid: @escaping @Sendable ([URLQueryItem]) -> Bool
    ) async throws(AuthError) -> [URLQueryItem] {
        let deadline = ContinuousClock.now + timeout
        let cancelled = CancellationFlag()
        let result: Result<[URLQueryItem], AuthError> = await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                DispatchQueue.global().async {
                    continuation.resume(returning: self.acceptLoop(path: path, deadline: deadline, cancelled: cancelled, isValid: isValid))
                }
            }
        } onCancel: {
            cancelled.set()
        }
        return try result.get()
    }

    private func acceptLoop(
        path: String, deadline: ContinuousClock.Instant, cancelled: CancellationFlag, isValid: ([URLQueryItem]) -> Bool
    ) -> Result<[URLQueryItem], AuthError> {
        while true {
            if cancelled.isSet { return .failure(.cancelledError) }
            let remaining = ContinuousClock.now.duration(to: deadline)
            guard remaining > .zero else {
                return .failure(.flowFailed("timeout", "no browser redirect arrived in time"))
            }
            var poller = pollfd(fd: descriptor, events: Int16(POLLIN), revents: 0)
            let milliseconds = Int32(min(remaining.components.seconds * 1000 + remaining.components.attoseconds / 1_000_000_000_000_000 + 1, 1000))
            let ready = poll(&poller, 1, milliseconds)
            if ready <= 0 { continue }
            let connection = accept(descriptor, nil, nil)
            guard connection >= 0 else { continue }
            defer { close(connection) }
            guard let target = readRequestTarget(connection) else { continue }
            guard let queryItems = Self.redirectQuery(target: target, path: path) else {
                respond(connection, status: "404 Not Found", body: "Not found.")
                continue
            }
            guard isValid(queryItems) else {
                respond(
                    connection, status: "400 Bad Request",
                    body: "This response does not belong to the sign-in in progress and was ignored. Nothing was signed in.")
                continue
            }
            let refused = queryItems.contains { $0.name == "error" }
            respond(
                connection, status: "200 OK",
                body: refused
                    ? "The sign-in was not approved. You can close this window and return to the application."
                    : "Sign-in received. You can close this window; the application finishes signing in.")
            return .success(queryItems)
        }
    }

    /// The request target of `GET <target> HTTP/1.1`, reading at most 16 KiB of headers for at
    /// most 5 seconds in all (a client that trickles bytes cannot hold the listener).
    private func readRequestTarget(_ connection: Int32) -> String? {
        var buffer = [UInt8]()
        var chunk = [UInt8](repeating: 0, count: 2048)
        let deadline = ContinuousClock.now + .seconds(5)
        while buffer.count < 16 * 1024 {
            let remaining = ContinuousClock.now.duration(to: deadline)
            guard remaining > .zero else { break }
            var poller = pollfd(fd: connection, events: Int16(POLLIN), revents: 0)
            let milliseconds = Int32(remaining.components.seconds * 1000 + remaining.components.attoseconds / 1_000_000_000_000_000 + 1)
            guard poll(&poller, 1, milliseconds) > 0 else { break }
            let count = read(connection, &chunk, chunk.count)
            if count <= 0 { break }
            buffer.append(contentsOf: chunk[0..<count])
            if buffer.count >= 4, buffer.suffix(4) == [13, 10, 13, 10] { break }
            if let text = String(bytes: buffer, encoding: .utf8), text.contains("\r\n\r\n") { break }
        }
        defer { buffer.wipe() }
        return Self.requestTarget(of: buffer)
    }

    /// The request target of a request head (`GET <target> HTTP/1.1` ...). Pure: any bytes in.
    static func requestTarget(of requestHead: [UInt8]) -> String? {
        guard let line = String(decoding: requestHead, as: UTF8.self).split(separator: "\r\n").first else { return nil }
        let parts = line.split(separator: " ")
        guard parts.count == 3, parts[0] == "GET" else { return nil }
        return String(parts[1])
    }

    /// The query items of a redirect whose target is for `path`; nil for any other target.
    static func redirectQuery(target: String, path: String) -> [URLQueryItem]? {
        guard let components = URLComponents(string: "http://127.0.0.1" + target), components.path == path else { return nil }
        return components.queryItems ?? []
    }

    private func respond(_ connection: Int32, status: String, body: String) {
        let response = "HTTP/1.1 \(status)\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: \(body.utf8.count)\r\n"
            + "Cache-Control: no-store\r\nConnection: close\r\n\r\n\(body)"
        let bytes = Array(response.utf8)
        _ = bytes.withUnsafeBytes { write(connection, $0.baseAddress, $0.count) }
    }
}

/// Set once by a cancellation handler, read by a blocking loop on another thread.
final class CancellationFlag: Sendable {
    private let flag = Mutex(false)

    func set() { flag.withLock { $0 = true } }
    var isSet: Bool { flag.withLock { $0 } }
}
