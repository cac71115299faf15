internal import CCurl
import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import LockboxAuth
import LockboxCore
import Synchronization

/// An ``HTTPTransport`` over libcurl's easy interface, whose wait for an answer sleeps in
/// `poll(2)` on a thread of its own.
///
/// On Linux, `URLSession` (swift-corelibs-foundation) keeps a Dispatch write source on a socket
/// after libcurl stops asking for write readiness; a connected socket is always writable, so
/// while a server takes its time to answer, that source fires without pause and keeps most of a
/// core busy. The CLI waits on slow servers (and on the device flow's polling), so it uses this
/// transport. Certificates are checked against the system store as `URLSession` does; there is
/// no switch that turns the check off.
///
/// Redirects are followed only as the request's ``RedirectPolicy`` allows, for GET and HEAD;
/// an answer is read up to ``HTTPRequestOptions/maximumResponseSize``; cancelling the task
/// aborts the transfer within a second.
public struct CurlTransport: HTTPTransport {
    private static let initialized: Bool = {
        curl_global_init(Int(CURL_GLOBAL_DEFAULT)) == CURLE_OK
    }()

    public init() {}

    public func send(_ request: URLRequest) async throws -> (Data, HTTPURLResponse) {
        try await send(request, options: HTTPRequestOptions(redirects: .sameOrigin, maximumResponseSize: .max))
    }

    public func send(_ request: URLRequest, options: HTTPRequestOptions) async throws -> (Data, HTTPURLResponse) {
        guard Self.initialized else { throw URLError(.unknown) }
        var current = request
        for _ in 0..<5 {
            let answer = try await perform(current, limit: options.maximumResponseSize)
            let method = (current.httpMethod ?? "GET").uppercased()
            guard (300...399).contains(answer.1.statusCode), method == "GET" || method == "HEAD",
                let location = answer.1.value(forHTTPHeaderField: "Location"), let source = current.url,
                let target = URL(string: location, relativeTo: source)?.absoluteURL,
                options.redirects.allows(from: source, to: target)
            else { return answer }
            current.url = target
        }
        throw URLError(.httpTooManyRedirects)
    }

    private func perform(_ request: URLRequest, limit: Int) async throws -> (Data, HTTPURLResponse) {
        let transfer = Transfer(limit: limit)
        let request = SendableRequest(request)
        do {
            return try await withTaskCancellationHandler {
                try await BlockingCall.run { () throws(TransferError) in try transfer.run(request.value) }
            } onCancel: {
                transfer.cancel()
            }
        } catch let failure as TransferError {
            throw failure.error
        }
    }
}

private struct SendableRequest: @unchecked Sendable {
    // URLRequest is a value type; the box only carries it onto the blocking thread.
    let value: URLRequest
    init(_ value: URLRequest) { self.value = value }
}

private struct TransferError: Error {
    let error: any Error
}

/// One transfer's state, reached from libcurl's callbacks through their user-data pointer.
private final class Transfer: Sendable {
    private struct State {
        var body = Data()
        var headerLines: [String] = []
        var tooLarge = false
    }

    let limit: Int
    private let state = Mutex(State())
    private let cancelled = Atomic<Bool>(false)

    init(limit: Int) {
        self.limit = limit
    }

    func cancel() {
        cancelled.store(true, ordering: .relaxed)
    }

    var isCancelled: Bool { cancelled.load(ordering: .relaxed) }

    func append(_ bytes: UnsafeRawBufferPointer) -> Bool {
        state.withLock { state in
            guard bytes.count <= limit - state.body.count else {
                state.tooLarge = true
                return false
            }
            state.body.append(contentsOf: bytes)
            return true
        }
    }

    func header(_ line: String) {
        state.withLock { state in
            // A new status line (after a 100 Continue) starts a new set of headers.
            if line.hasPrefix("HTTP/") { state.headerLines = [] }
            state.headerLines.append(line)
        }
    }

    func run(_ request: URLRequest) throws(TransferError) -> (Data, HTTPURLResponse) {
        guard let url = request.url, let handle = curl_easy_init() else { throw TransferError(error: URLError(.badURL)) }
        defer { curl_easy_cleanup(handle) }
        var headers: UnsafeMutablePointer<curl_slist>?
        defer { curl_slist_free_all(headers) }
        for (name, value) in request.allHTTPHeaderFields ?? [:] {
            headers = curl_slist_append(headers, "\(name): \(value)")
        }
        // No "Expect: 100-continue" round trip for small bodies.
        headers = curl_slist_append(headers, "Expect:")
        let context = Unmanaged.passUnretained(self).toOpaque()
        var code = CURLE_OK
        func set(_ result: CURLcode) { if code == CURLE_OK { code = result } }
        set(lockbox_curl_set_string(handle, CURLOPT_URL, url.absoluteString))
        set(lockbox_curl_set_string(handle, CURLOPT_PROTOCOLS_STR, "http,https"))
        set(lockbox_curl_set_long(handle, CURLOPT_FOLLOWLOCATION, 0))
        set(lockbox_curl_set_long(handle, CURLOPT_NOSIGNAL, 1))
        set(lockbox_curl_set_long(handle, CURLOPT_SSL_VERIFYPEER, 1))
        set(lockbox_curl_set_long(handle, CURLOPT_SSL_VERIFYHOST, 2))
        set(lockbox_curl_set_long(handle, CURLOPT_CONNECTTIMEOUT, 30))
        set(lockbox_curl_set_list(handle, CURLOPT_HTTPHEADER, headers))
        let method = (request.httpMethod ?? "GET").uppercased()
        if let body = request.httpBody {
            set(lockbox_curl_set_offset(handle, CURLOPT_POSTFIELDSIZE_LARGE, curl_off_t(body.count)))
            body.withUnsafeBytes { bytes in
                set(lockbox_curl_set_pointer(handle, CURLOPT_COPYPOSTFIELDS, UnsafeMutableRawPointer(mutating: bytes.baseAddress)))
            }
            if method != "POST" { set(lockbox_curl_set_string(handle, CURLOPT_CUSTOMREQUEST, method)) }
        } else if method == "HEAD" {
            set(lockbox_curl_set_long(handle, CURLOPT_NOBODY, 1))
        } else if method != "GET" {
            set(lockbox_curl_set_string(handle, CURLOPT_CUSTOMREQUEST, method))
        }
        set(lockbox_curl_set_data_callback(handle, CURLOPT_WRITEFUNCTION, { data, size, count, context in
            let transfer = Unmanaged<Transfer>.fromOpaque(context!).takeUnretainedValue()
            let bytes = UnsafeRawBufferPointer(start: data, count: size * count)
            return transfer.append(bytes) ? size * count : 0
        }))
        set(lockbox_curl_set_pointer(handle, CURLOPT_WRITEDATA, context))
        set(lockbox_curl_set_data_callback(handle, CURLOPT_HEADERFUNCTION, { data, size, count, context in
            let transfer = Unmanaged<Transfer>.fromOpaque(context!).takeUnretainedValue()
            let line = String(decoding: UnsafeRawBufferPointer(start: data, count: size * count), as: UTF8.self)
            transfer.header(line.trimmingCharacters(in: .whitespacesAndNewlines))
            return size * count
        }))
        set(lockbox_curl_set_pointer(handle, CURLOPT_HEADERDATA, context))
        // Called about once a second while the transfer waits: the way to abort it.
        set(lockbox_curl_set_long(handle, CURLOPT_NOPROGRESS, 0))
        set(lockbox_curl_set_progress_callback(handle, { context, _, _, _, _ in
            Unmanaged<Transfer>.fromOpaque(context!).takeUnretainedValue().isCancelled ? 1 : 0
        }))
        set(lockbox_curl_set_pointer(handle, CURLOPT_XFERINFODATA, context))
        guard code == CURLE_OK else { throw TransferError(error: URLError(.unknown)) }

        let result = curl_easy_perform(handle)
        let (body, lines, tooLarge) = state.withLock { ($0.body, $0.headerLines, $0.tooLarge) }
        if tooLarge { throw TransferError(
                error: AuthError(
                    .responseTooLarge,
                    "The authorization server's answer is over \(limit) bytes and was refused unread. Credentials are kept.")) }
        guard result == CURLE_OK else {
            if isCancelled { throw TransferError(error: CancellationError()) }
            throw TransferError(error: Self.urlError(result, url: url))
        }
        var status = 0
        _ = lockbox_curl_response_code(handle, &status)
        var fields: [String: String] = [:]
        for line in lines.dropFirst() {
            guard let colon = line.firstIndex(of: ":") else { continue }
            let name = String(line[..<colon])
            let value = line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)
            fields[name] = fields[name].map { $0 + ", " + value } ?? value
        }
        guard let response = HTTPURLResponse(url: url, statusCode: status, httpVersion: "HTTP/1.1", headerFields: fields) else {
            throw TransferError(error: URLError(.badServerResponse))
        }
        return (body, response)
    }

    private static func urlError(_ code: CURLcode, url: URL) -> URLError {
        let userInfo: [String: Any] = [NSURLErrorFailingURLErrorKey: url]
        switch code {
        case CURLE_COULDNT_RESOLVE_HOST: return URLError(.cannotFindHost, userInfo: userInfo)
        case CURLE_COULDNT_CONNECT: return URLError(.cannotConnectToHost, userInfo: userInfo)
        case CURLE_OPERATION_TIMEDOUT: return URLError(.timedOut, userInfo: userInfo)
        case CURLE_PEER_FAILED_VERIFICATION: return URLError(.serverCertificateUntrusted, userInfo: userInfo)
        case CURLE_SSL_CONNECT_ERROR, CURLE_SSL_CACERT_BADFILE: return URLError(.secureConnectionFailed, userInfo: userInfo)
        case CURLE_GOT_NOTHING, CURLE_RECV_ERROR, CURLE_SEND_ERROR, CURLE_PARTIAL_FILE:
            return URLError(.networkConnectionLost, userInfo: userInfo)
        default: return URLError(.unknown, userInfo: userInfo)
        }
    }
}
