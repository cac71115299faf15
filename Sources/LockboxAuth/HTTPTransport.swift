import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import LockboxCore
import Synchronization

/// Bounds on every request Lockbox makes to an authorization server.
public struct RequestLimits: Sendable, Hashable, Codable {
    /// The total time a request may take, from sending it to the last byte of the answer. A
    /// server that trickles its answer cannot hold a caller (or the cross-process refresh
    /// lock) longer than this. Default 30 s.
    public var deadline: Duration
    /// The largest answer accepted, in bytes; a larger one is refused without reading it all.
    /// Default 1 MiB.
    public var maximumResponseSize: Int

    /// Limits: a deadline for each request and the largest response read.
    public init(deadline: Duration = .seconds(30), maximumResponseSize: Int = 1 << 20) {
        precondition(deadline > .zero, "a request deadline must be positive")
        precondition(maximumResponseSize > 0, "a response size limit must be positive")
        self.deadline = deadline
        self.maximumResponseSize = maximumResponseSize
    }

    private enum CodingKeys: String, CodingKey {
        case deadlineMilliseconds, maximumResponseSize
    }

    /// Limits decoded from their stored form.
    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        let milliseconds = try container.decode(Int64.self, forKey: .deadlineMilliseconds)
        let size = try container.decode(Int.self, forKey: .maximumResponseSize)
        guard milliseconds > 0, size > 0 else {
            throw DecodingError.dataCorruptedError(forKey: .deadlineMilliseconds, in: container, debugDescription: "limits must be positive")
        }
        self.init(deadline: .milliseconds(milliseconds), maximumResponseSize: size)
    }

    /// Encodes the limits for storage with a session.
    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        let (seconds, attoseconds) = deadline.components
        try container.encode(seconds * 1000 + attoseconds / 1_000_000_000_000_000, forKey: .deadlineMilliseconds)
        try container.encode(maximumResponseSize, forKey: .maximumResponseSize)
    }

    var deadlineDescription: String {
        let (seconds, attoseconds) = deadline.components
        return attoseconds == 0 ? "\(seconds) s" : String(format: "%.3f s", Double(seconds) + Double(attoseconds) / 1e18)
    }
}

/// Which redirects a transport may follow for one request. A redirect that is not followed
/// comes back as the answer (its 3xx status).
public enum RedirectPolicy: Sendable, Hashable {
    /// None: the token, revocation and device endpoints (RFC 6749 section 3.2 gives them no
    /// reason to redirect, and following one would resend credentials elsewhere).
    case refuse
    /// Only to https URLs (discovery).
    case httpsOnly
    /// Only to the same scheme, host and port, and never from https to http (requests that
    /// carry a bearer token).
    case sameOrigin

    /// Whether a redirect from `source` to `target` may be followed.
    public func allows(from source: URL, to target: URL) -> Bool {
        let from = source.scheme?.lowercased()
        let to = target.scheme?.lowercased()
        if from == "https" && to != "https" { return false }
        switch self {
        case .refuse:
            return false
        case .httpsOnly:
            return to == "https"
        case .sameOrigin:
            return from == to && source.host?.lowercased() == target.host?.lowercased() && source.port == target.port
        }
    }
}

/// What a transport must enforce for one request.
public struct HTTPRequestOptions: Sendable, Hashable {
    /// Which redirects the transport may follow.
    public var redirects: RedirectPolicy
    /// The largest body to read, in bytes; past it, the transport stops reading and throws.
    public var maximumResponseSize: Int

    /// Options: the redirects allowed and the largest response read.
    public init(redirects: RedirectPolicy, maximumResponseSize: Int) {
        self.redirects = redirects
        self.maximumResponseSize = maximumResponseSize
    }
}

/// Sends HTTP requests for the credential lifecycle. Inject one to add logging, proxies or
/// metrics; the default is ``URLSessionTransport``.
///
/// There is deliberately no way to turn off certificate validation: on Linux, URLSession trusts
/// the system store, so a private CA goes into `/usr/local/share/ca-certificates` and
/// `update-ca-certificates`.
///
/// Lockbox calls ``send(_:options:)``. Its default implementation calls ``send(_:)`` and can
/// only check the answer afterwards (a redirect to another origin or from https to http, a
/// body over the limit), when the request was already resent or the body already buffered: a
/// transport should implement it to enforce both while the request runs, as
/// ``URLSessionTransport`` does. The total deadline is applied by Lockbox around every call,
/// whatever the transport (a transport that ignores cancellation is abandoned, not awaited).
public protocol HTTPTransport: Sendable {
    /// Sends `request` and returns the body and response, whatever the status code.
    /// - Throws: any error when no HTTP response arrived (network down, TLS failure, timeout).
    func send(_ request: URLRequest) async throws -> (Data, HTTPURLResponse)

    /// Sends `request`, following only the redirects `options` allow and reading at most
    /// `options.maximumResponseSize` bytes of body.
    /// - Throws: an ``AuthError`` with ``AuthError/Code/responseTooLarge`` past the size
    ///   limit; any error when no HTTP response arrived.
    func send(_ request: URLRequest, options: HTTPRequestOptions) async throws -> (Data, HTTPURLResponse)
}

extension HTTPTransport {
    /// The default: sends with ``send(_:)`` and checks the answer against `options` afterwards.
    public func send(_ request: URLRequest, options: HTTPRequestOptions) async throws -> (Data, HTTPURLResponse) {
        let (data, response) = try await send(request)
        // After the fact, only the origin can be checked (the path of `response.url` may be
        // the transport's own business): a change of scheme, host or port is refused.
        let check: RedirectPolicy = options.redirects == .refuse ? .sameOrigin : options.redirects
        if let source = request.url, let target = response.url, source != target, !check.allows(from: source, to: target) {
            throw AuthError.redirectRefused(status: nil, detail: "the transport followed a redirect this request does not allow")
        }
        guard data.count <= options.maximumResponseSize else {
            throw AuthError.responseTooLarge(limit: options.maximumResponseSize)
        }
        return (data, response)
    }
}

/// The default transport: an ephemeral `URLSession` (no cookies, no cache, no credential store)
/// that follows only the redirects a request allows and stops reading an answer at its size
/// limit.
public struct URLSessionTransport: HTTPTransport {
    private let engine: SessionEngine

    /// - Parameter timeout: the idle timeout (no byte for this long fails the request). The
    ///   total deadline is ``RequestLimits/deadline``.
    public init(timeout: Duration = .seconds(30)) {
        engine = SessionEngine(timeout: timeout.timeInterval)
    }

    /// Sends `request`, following redirects only within its origin and reading the whole body.
    public func send(_ request: URLRequest) async throws -> (Data, HTTPURLResponse) {
        try await engine.send(request, options: HTTPRequestOptions(redirects: .sameOrigin, maximumResponseSize: .max))
    }

    /// Sends `request`, following only the redirects `options` allow and reading at most
    /// `options.maximumResponseSize` bytes of body.
    public func send(_ request: URLRequest, options: HTTPRequestOptions) async throws -> (Data, HTTPURLResponse) {
        try await engine.send(request, options: options)
    }
}

/// Owns the session; invalidating it in `deinit` releases the delegate the session retains.
private final class SessionEngine: Sendable {
    private let session: URLSession
    private let tasks: TaskTable

    init(timeout: TimeInterval) {
        let configuration = URLSessionConfiguration.ephemeral
        configuration.timeoutIntervalForRequest = timeout
        configuration.requestCachePolicy = .reloadIgnoringLocalCacheData
        configuration.urlCache = nil
        configuration.httpCookieStorage = nil
        configuration.httpShouldSetCookies = false
        tasks = TaskTable()
        session = URLSession(configuration: configuration, delegate: tasks, delegateQueue: InlineDelegateQueue())
    }

    deinit {
        session.finishTasksAndInvalidate()
    }

    func send(_ request: URLRequest, options: HTTPRequestOptions) async throws -> (Data, HTTPURLResponse) {
        let task = session.dataTask(with: request)
        let identifier = task.taskIdentifier
        let box = TaskBox(task)
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { continuation in
                tasks.register(identifier, TaskTable.Pending(options: options, origin: request.url, continuation: continuation))
                box.task.resume()
            }
        } onCancel: {
            // Not inline: the cancellation handler runs holding the task's status lock, and
            // URLSession's `cancel` waits for its queue, where the delegate may be resuming this
            // very task's continuation (which needs that lock): a deadlock, seen at test exit.
            DispatchQueue.global().async { box.task.cancel() }
        }
    }
}

/// Runs URLSession's delegate calls on the thread that makes them, URLSession's own queue.
///
/// On Linux, URLSession hands each chunk it reads to the delegate queue without waiting: with a
/// queue of its own, a delegate that falls behind (a loaded machine) lets hundreds of megabytes
/// of a hostile answer pile up in queued chunks before it sees the size limit. Inline, the
/// limit is checked as each chunk arrives and nothing past it is kept. The delegate methods
/// below are short, never block, and never call back into the task synchronously (a `cancel`
/// is dispatched: URLSession's `cancel` waits for its own queue).
private final class InlineDelegateQueue: OperationQueue, @unchecked Sendable {
    override func addOperation(_ block: @Sendable @escaping () -> Void) {
        block()
    }
}

private final class TaskBox: @unchecked Sendable {
    // URLSessionTask is thread-safe; the box only carries it into the cancellation handler.
    let task: URLSessionDataTask
    init(_ task: URLSessionDataTask) { self.task = task }
}

/// The session's delegate: per task, the options, the body so far, and the waiting caller.
private final class TaskTable: NSObject, URLSessionDataDelegate, Sendable {
    struct Pending {
        let options: HTTPRequestOptions
        let origin: URL?
        let continuation: CheckedContinuation<(Data, HTTPURLResponse), any Error>
        var response: HTTPURLResponse?
        var body = Data()
        var refusal: AuthError?
    }

    private let pending = Mutex<[Int: Pending]>([:])

    func register(_ identifier: Int, _ entry: Pending) {
        pending.withLock { $0[identifier] = entry }
    }

    func urlSession(
        _ session: URLSession, dataTask: URLSessionDataTask, didReceive response: URLResponse,
        completionHandler: @escaping (URLSession.ResponseDisposition) -> Void
    ) {
        let allowed: Bool = pending.withLock { table in
            guard var entry = table[dataTask.taskIdentifier] else { return false }
            let limit = entry.options.maximumResponseSize
            entry.response = response as? HTTPURLResponse
            if response.expectedContentLength > 0, response.expectedContentLength > Int64(clamping: limit) {
                entry.refusal = .responseTooLarge(limit: limit)
            }
            table[dataTask.taskIdentifier] = entry
            return entry.refusal == nil
        }
        completionHandler(allowed ? .allow : .cancel)
        // URLSession on Linux ignores the disposition: cancel explicitly.
        if !allowed { Self.cancelLater(dataTask) }
    }

    func urlSession(_ session: URLSession, dataTask: URLSessionDataTask, didReceive data: Data) {
        let overLimit: Bool = pending.withLock { table in
            guard var entry = table[dataTask.taskIdentifier], entry.refusal == nil else { return false }
            let limit = entry.options.maximumResponseSize
            if data.count > limit - entry.body.count {
                entry.refusal = .responseTooLarge(limit: limit)
                entry.body = Data()
                table[dataTask.taskIdentifier] = entry
                return true
            }
            entry.body.append(data)
            table[dataTask.taskIdentifier] = entry
            return false
        }
        if overLimit { Self.cancelLater(dataTask) }
    }

    /// Not inline: URLSession's `cancel` waits for the queue the delegate runs on. Until it
    /// takes effect, further chunks are dropped as they arrive.
    private static func cancelLater(_ task: URLSessionDataTask) {
        let box = TaskBox(task)
        DispatchQueue.global().async { box.task.cancel() }
    }

    func urlSession(
        _ session: URLSession, task: URLSessionTask, willPerformHTTPRedirection response: HTTPURLResponse,
        newRequest request: URLRequest, completionHandler: @escaping (URLRequest?) -> Void
    ) {
        let follow: Bool = pending.withLock { table in
            guard let entry = table[task.taskIdentifier], let source = entry.origin ?? task.currentRequest?.url,
                let target = request.url
            else { return false }
            return entry.options.redirects.allows(from: source, to: target)
        }
        // nil: the redirect itself becomes the answer; the caller sees its 3xx status.
        completionHandler(follow ? request : nil)
    }

    func urlSession(_ session: URLSession, task: URLSessionTask, didCompleteWithError error: (any Error)?) {
        guard let entry = pending.withLock({ $0.removeValue(forKey: task.taskIdentifier) }) else { return }
        if let refusal = entry.refusal {
            entry.continuation.resume(throwing: refusal)
        } else if let error {
            entry.continuation.resume(throwing: error)
        } else if let response = entry.response ?? task.response as? HTTPURLResponse {
            entry.continuation.resume(returning: (entry.body, response))
        } else {
            entry.continuation.resume(throwing: URLError(.badServerResponse))
        }
    }
}

/// `application/x-www-form-urlencoded` bodies (RFC 6749 appendix B).
enum FormBody {
    private static let unreserved: CharacterSet = {
        var set = CharacterSet.alphanumerics
        set.insert(charactersIn: "-._~")
        return set
    }()

    static func encode(_ fields: [(String, String)]) -> Data {
        let text = fields.map { name, value in
            "\(escape(name))=\(escape(value))"
        }.joined(separator: "&")
        return Data(text.utf8)
    }

    static func escape(_ value: String) -> String {
        value.addingPercentEncoding(withAllowedCharacters: unreserved) ?? ""
    }

    static func post(_ url: URL, _ fields: [(String, String)]) -> URLRequest {
        var request = URLRequest(url: url)
        request.httpMethod = "POST"
        request.setValue("application/x-www-form-urlencoded", forHTTPHeaderField: "Content-Type")
        request.setValue("application/json", forHTTPHeaderField: "Accept")
        request.httpBody = encode(fields)
        return request
    }
}

extension SecretBytes {
    /// The token as text for a request body or header. The copy cannot be wiped; keep its
    /// lifetime to the one request.
    var temporaryString: String {
        withUnsafeBytes { String(decoding: $0, as: UTF8.self) }
    }
}

extension HTTPTransport {
    /// Sends one request to the authorization server: within `limits` (the total deadline, the
    /// body size) and following only the redirects `redirects` allows; an answer that is still
    /// a redirect is refused. Transport failures become ``AuthError/Code/network`` (with no
    /// request details: the URL of an OAuth request may carry a code).
    func exchange(_ request: URLRequest, limits: RequestLimits, redirects: RedirectPolicy) async throws(AuthError) -> (Data, HTTPURLResponse) {
        let options = HTTPRequestOptions(redirects: redirects, maximumResponseSize: limits.maximumResponseSize)
        let answer: (Data, HTTPURLResponse)
        switch await Deadline.run(limits.deadline, { try await self.send(request, options: options) }) {
        case .finished(.success(let result)):
            answer = result
        case .finished(.failure(let error)):
            throw Self.mapped(error)
        case .expired:
            throw .network(
                "no complete answer within the request deadline (\(limits.deadlineDescription))",
                urlErrorCode: URLError.timedOut.rawValue)
        case .cancelled:
            throw .cancelledError
        }
        if (300...399).contains(answer.1.statusCode) {
            throw .redirectRefused(
                status: answer.1.statusCode,
                detail: redirects == .refuse ? "this endpoint must answer directly" : "only redirects to https are followed")
        }
        return answer
    }

    /// Sends an API request carrying a bearer token: redirects only within its origin, no
    /// deadline beyond the caller's own cancellation, 3xx answers returned as they are.
    func exchangeBearerRequest(_ request: URLRequest) async throws(AuthError) -> (Data, HTTPURLResponse) {
        do {
            return try await send(request, options: HTTPRequestOptions(redirects: .sameOrigin, maximumResponseSize: .max))
        } catch {
            throw Self.mapped(error)
        }
    }

    private static func mapped(_ error: any Error) -> AuthError {
        switch error {
        case let error as AuthError: error
        case is CancellationError: .cancelledError
        case let error as URLError where error.code == .cancelled: .cancelledError
        case let error as URLError where error.code == .cannotFindHost || error.code == .dnsLookupFailed:
            .network(
                "the host \(error.failingURL?.host.map(TerminalText.sanitized) ?? "") could not be resolved (DNS); check the "
                    + "host name and the network", urlErrorCode: error.code.rawValue,
                failingURL: error.failingURL.flatMap(Self.origin))
        case let error as URLError: .network(describe(error), urlErrorCode: error.code.rawValue)
        default: .network("\(type(of: error))")
        }
    }

    /// Scheme, host and port only: a failing URL's path or query may carry a code.
    private static func origin(_ url: URL) -> URL? {
        var components = URLComponents()
        components.scheme = url.scheme
        components.host = url.host
        components.port = url.port
        return components.url
    }

    private static func describe(_ error: URLError) -> String {
        switch error.code {
        case .serverCertificateUntrusted, .serverCertificateHasBadDate, .serverCertificateHasUnknownRoot,
            .serverCertificateNotYetValid, .secureConnectionFailed, .clientCertificateRejected:
            "TLS failed: the server's certificate is not trusted (URLError \(error.code.rawValue))"
        case .timedOut: "the request timed out"
        case .cannotConnectToHost: "cannot connect to the server (nothing listens at its address, or a firewall refuses)"
        case .networkConnectionLost: "the connection was lost before the answer arrived"
        case .notConnectedToInternet: "no network"
        default:
            // On Linux, URLSession reports most TLS failures as code -1 with curl's message,
            // which names the problem and never contains request data.
            error.localizedDescription.contains("SSL") || error.localizedDescription.contains("certificate")
                ? "TLS failed: \(TerminalText.sanitized(error.localizedDescription))"
                : "URLError \(error.code.rawValue): \(TerminalText.sanitized(error.localizedDescription))"
        }
    }
}
