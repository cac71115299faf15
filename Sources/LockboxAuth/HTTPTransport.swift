import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// Sends HTTP requests for the credential lifecycle. Inject one to add logging, proxies or
/// metrics; the default is ``URLSessionTransport``.
///
/// There is deliberately no way to turn off certificate validation: on Linux, URLSession trusts
/// the system store, so a private CA goes into `/usr/local/share/ca-certificates` and
/// `update-ca-certificates`.
public protocol HTTPTransport: Sendable {
    /// Sends `request` and returns the body and response, whatever the status code.
    /// - Throws: any error when no HTTP response arrived (network down, TLS failure, timeout).
    func send(_ request: URLRequest) async throws -> (Data, HTTPURLResponse)
}

/// The default transport: an ephemeral `URLSession` (no cookies, no cache, no credential store).
public struct URLSessionTransport: HTTPTransport {
    private let session: URLSession

    /// - Parameter timeout: the per-request timeout.
    public init(timeout: TimeInterval = 30) {
        let configuration = URLSessionConfiguration.ephemeral
        configuration.timeoutIntervalForRequest = timeout
        configuration.requestCachePolicy = .reloadIgnoringLocalCacheData
        configuration.urlCache = nil
        configuration.httpCookieStorage = nil
        configuration.httpShouldSetCookies = false
        session = URLSession(configuration: configuration)
    }

    public func send(_ request: URLRequest) async throws -> (Data, HTTPURLResponse) {
        let (data, response) = try await session.data(for: request)
        guard let http = response as? HTTPURLResponse else {
            throw URLError(.badServerResponse)
        }
        return (data, http)
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

import LockboxCore

extension HTTPTransport {
    /// Sends, mapping transport failures to ``AuthError/network(_:)`` (with no request details:
    /// the URL of an OAuth request may carry a code).
    func exchange(_ request: URLRequest) async throws(AuthError) -> (Data, HTTPURLResponse) {
        do {
            return try await send(request)
        } catch is CancellationError {
            throw .cancelled
        } catch let error as URLError where error.code == .cancelled {
            throw .cancelled
        } catch let error as URLError {
            throw .network(Self.describe(error))
        } catch {
            throw .network("\(type(of: error))")
        }
    }

    private static func describe(_ error: URLError) -> String {
        switch error.code {
        case .serverCertificateUntrusted, .serverCertificateHasBadDate, .serverCertificateHasUnknownRoot,
            .serverCertificateNotYetValid, .secureConnectionFailed, .clientCertificateRejected:
            "TLS failed: the server's certificate is not trusted (URLError \(error.code.rawValue))"
        case .timedOut: "the request timed out"
        case .cannotConnectToHost, .cannotFindHost: "cannot connect to the server"
        case .networkConnectionLost: "the connection was lost before the answer arrived"
        case .notConnectedToInternet: "no network"
        default:
            // On Linux, URLSession reports most TLS failures as code -1 with curl's message,
            // which names the problem and never contains request data.
            error.localizedDescription.contains("SSL") || error.localizedDescription.contains("certificate")
                ? "TLS failed: \(error.localizedDescription)"
                : "URLError \(error.code.rawValue): \(error.localizedDescription)"
        }
    }
}
