import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import LockboxCore

/// Revocations (RFC 7009) that could not be delivered yet, kept as items in the store so they
/// survive restarts, and retried later (`lockbox logout --retry`).
///
/// An entry holds the token to revoke, sealed like any item; it is never used to sign in again
/// and never shown. A revocation the server refuses permanently (a 4xx other than 429) is
/// dropped: retrying cannot help. Store calls run off the cooperative pool; errors are
/// ``AuthError``s (``AuthError/Code/storeLocked``, ``AuthError/Code/store`` with the store's
/// error as ``AuthError/storeError``).
public struct RevocationOutbox: Sendable {
    /// The keychain service of outbox items.
    public static let service = "lockbox.oauth.revocation-outbox"

    /// Where queued revocations are kept.
    public let store: any ItemStore
    /// The transport revocations are sent over.
    public let transport: any HTTPTransport
    private let events: @Sendable (AuthEvent) -> Void

    /// An outbox in `store`, sending over `transport` and reporting to `events`.
    public init(
        store: any ItemStore, transport: any HTTPTransport = URLSessionTransport(),
        events: @escaping @Sendable (AuthEvent) -> Void = { _ in }
    ) {
        self.store = store
        self.transport = transport
        self.events = events
    }

    /// One pending revocation.
    struct Entry: Codable {
        var token: String
        var tokenTypeHint: String
        var endpoint: URL
        var clientID: String
        var account: String
    }

    /// The outcome of one revocation attempt.
    public enum Outcome: Sendable, Hashable {
        /// The server revoked the token.
        case revoked
        /// Worth retrying (network, 5xx, 429); the reason code says which.
        case failed(String)
        /// Refused for good (4xx); retrying would not help.
        case refused(String)
    }

    /// The result of ``retryPending()``.
    public struct RetryResult: Sendable, Hashable {
        /// Revocations that succeeded.
        public let revoked: Int
        /// Revocations given up (refused for good, or too old).
        public let dropped: Int
        /// Revocations still waiting.
        public let remaining: Int
    }

    /// Stores a revocation to deliver; returns its id.
    @discardableResult
    func enqueue(token: SecretBytes, hint: String, endpoint: URL, clientID: String, account: String) async throws(AuthError) -> String {
        let id = UUID().uuidString
        let entry = Entry(token: token.temporaryString, tokenTypeHint: hint, endpoint: endpoint, clientID: clientID, account: account)
        guard var encoded = try? JSONEncoder().encode(entry) else {
            preconditionFailure("a revocation entry always encodes")
        }
        let secret = SecretBytes(copying: encoded)
        encoded.resetBytes(in: 0..<encoded.count)
        do {
            try await store.async.add(
                .genericPassword(
                    service: Self.service, account: id, data: secret, accessibility: .afterFirstUnlockThisDeviceOnly,
                    label: "Pending OAuth revocation: \(account)"))
        } catch {
            throw .from(error)
        }
        return id
    }

    func remove(_ id: String) async {
        _ = try? await store.async.delete(matching: .genericPassword(service: Self.service, account: id))
    }

    /// How many revocations wait for delivery.
    /// - Throws: ``AuthError/Code/storeLocked`` when the store is locked.
    public func pendingCount() async throws(AuthError) -> Int {
        var query = Query.genericPassword(service: Self.service)
        query.limit = .all
        query.returning = .attributes
        do {
            return try await store.async.items(matching: query).count
        } catch LockboxError.itemNotFound {
            return 0
        } catch {
            throw .from(error)
        }
    }

    /// Tries every pending revocation once; delivered and refused ones leave the outbox.
    /// - Throws: ``AuthError/Code/storeLocked`` when the store is locked.
    public func retryPending() async throws(AuthError) -> RetryResult {
        var query = Query.genericPassword(service: Self.service)
        query.limit = .all
        query.returning = [.attributes, .data]
        let items: [Item]
        do {
            items = try await store.async.items(matching: query)
        } catch LockboxError.itemNotFound {
            return RetryResult(revoked: 0, dropped: 0, remaining: 0)
        } catch {
            throw .from(error)
        }
        var revoked = 0, dropped = 0, remaining = 0
        for item in items {
            guard let id = item.attributes.account, let data = item.data,
                let entry = data.withUnsafeBytes({ try? JSONDecoder().decode(Entry.self, from: Data($0)) })
            else { continue }
            let token = SecretBytes(utf8: entry.token)
            switch await Self.revoke(token: token, hint: entry.tokenTypeHint, endpoint: entry.endpoint, clientID: entry.clientID, transport: transport) {
            case .revoked:
                await remove(id)
                revoked += 1
                events(AuthEvent(kind: .revocationSucceeded, reason: "retried", fingerprint: TokenFingerprint.of(token), account: entry.account))
            case .refused(let reason):
                await remove(id)
                dropped += 1
                events(AuthEvent(kind: .revocationDropped, reason: reason, fingerprint: TokenFingerprint.of(token), account: entry.account))
            case .failed(let reason):
                remaining += 1
                events(AuthEvent(kind: .revocationQueued, reason: reason, fingerprint: TokenFingerprint.of(token), account: entry.account))
            }
        }
        return RetryResult(revoked: revoked, dropped: dropped, remaining: remaining)
    }

    /// One RFC 7009 request for a public client; no redirect is followed.
    static func revoke(
        token: SecretBytes, hint: String, endpoint: URL, clientID: String, transport: any HTTPTransport,
        limits: RequestLimits = RequestLimits()
    ) async -> Outcome {
        let request = FormBody.post(endpoint, [
            ("token", token.temporaryString), ("token_type_hint", hint), ("client_id", clientID),
        ])
        do {
            let (_, response) = try await transport.exchange(request, limits: limits, redirects: .refuse)
            switch response.statusCode {
            case 200: return .revoked
            case 429, 500...599: return .failed("http_\(response.statusCode)")
            default: return .refused("http_\(response.statusCode)")
            }
        } catch {
            return .failed(error.code == .network || error.code == .cancelled ? error.code.rawValue : error.reasonCode)
        }
    }
}
