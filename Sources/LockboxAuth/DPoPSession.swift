import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import LockboxCore
import Synchronization

/// Where sessions' DPoP keys live: one non-extractable key per session, made at sign-in and
/// used for the session's whole life (its refresh token is bound to it). `LockboxAuthKeys`
/// supplies one over managed keys (`ManagedDPoPKeyStore`).
///
/// A key made for a sign-in stays unbound until ``CredentialsManager/signIn(with:)`` binds it:
/// a sign-in that fails leaves the previous session and its key as they were.
public protocol DPoPKeyStore: Sendable {
    /// A new key for a sign-in of `session`; not yet the session's key.
    func makeKey(for session: CredentialKey) async throws(LockboxError) -> any ProofSigningKey
    /// The key `session`'s tokens are bound to, or nil when there is none.
    /// - Throws: `interactionNotAllowed` when the store is locked (never nil then).
    func boundKey(for session: CredentialKey) async throws(LockboxError) -> (any ProofSigningKey)?
    /// Makes `key` (from ``makeKey(for:)``) the session's key and deletes its other keys.
    func bind(_ key: any ProofSigningKey, to session: CredentialKey) async throws(LockboxError)
    /// Deletes every key of `session`, bound or not; no error when there is none.
    func deleteKeys(for session: CredentialKey) async throws(LockboxError)
    /// Deletes `key`, made by ``makeKey(for:)`` for a sign-in of `session` that did not finish
    /// (cancelled, denied, expired); the key `session`'s tokens are bound to is never deleted
    /// this way. No error when the key is gone already.
    func discard(_ key: any ProofSigningKey, of session: CredentialKey) async throws(LockboxError)
}

extension DPoPKeyStore {
    /// Deletes nothing: a key store that does not implement it keeps a stopped sign-in's key
    /// until the next sign-in binds another (``bind(_:to:)`` deletes the session's other keys)
    /// or a sign-out deletes them all.
    public func discard(_ key: any ProofSigningKey, of session: CredentialKey) async throws(LockboxError) {}
}

extension ProofSigningKey {
    /// The JWK SHA-256 thumbprint (RFC 7638), base64url: the `jkt` a server binds tokens to.
    public var jwkThumbprint: String {
        let canonical = "{" + publicJWK.sorted { $0.key < $1.key }.map { "\"\($0.key)\":\"\($0.value)\"" }.joined(separator: ",") + "}"
        return SHA256.hash(Array(canonical.utf8)).base64URLString
    }
}

/// The latest `DPoP-Nonce` (RFC 9449 section 8) each server gave, by origin (scheme, host and
/// port). A nonce is not secret; it only proves a proof's freshness to the server that chose it.
///
/// Only nonces that are well formed (RFC 9449's `1*NQCHAR`, at most ``maximumLength`` bytes)
/// are kept: a header carrying anything else is ignored, as if it were absent.
public final class DPoPNonces: Sendable {
    /// The nonces of this process, shared by every flow and manager unless given others.
    public static let shared = DPoPNonces()
    /// The longest nonce kept, in bytes.
    public static let maximumLength = 512
    /// The most servers remembered; the oldest is forgotten past it.
    static let capacity = 64

    private let table = Mutex<[(origin: String, nonce: String)]>([])

    /// An empty table.
    public init() {}

    /// The last nonce `url`'s server gave, if any.
    public func nonce(for url: URL) -> String? {
        guard let origin = Self.origin(url) else { return nil }
        return table.withLock { entries in entries.last { $0.origin == origin }?.nonce }
    }

    /// Keeps the nonce in `response`'s `DPoP-Nonce` header for its server.
    /// - Returns: the nonce kept, or nil when the header was absent or not a valid nonce.
    @discardableResult
    func remember(from response: HTTPURLResponse, for url: URL) -> String? {
        guard let header = response.value(forHTTPHeaderField: "DPoP-Nonce"), Self.isValid(header), let origin = Self.origin(url)
        else { return nil }
        table.withLock { entries in
            entries.removeAll { $0.origin == origin }
            entries.append((origin, header))
            if entries.count > Self.capacity { entries.removeFirst(entries.count - Self.capacity) }
        }
        return header
    }

    /// RFC 9449 section 8.1: `nonce = 1*NQCHAR`, NQCHAR = %x21 / %x23-5B / %x5D-7E.
    static func isValid(_ nonce: String) -> Bool {
        let bytes = nonce.utf8
        return !bytes.isEmpty && bytes.count <= maximumLength
            && bytes.allSatisfy { $0 == 0x21 || (0x23...0x5B).contains($0) || (0x5D...0x7E).contains($0) }
    }

    static func origin(_ url: URL) -> String? {
        guard let scheme = url.scheme?.lowercased(), let host = url.host?.lowercased() else { return nil }
        return "\(scheme)://\(host):\(url.port ?? (scheme == "https" ? 443 : 80))"
    }
}

extension DPoPProofFactory {
    /// Refuses a sign-in whose proofs do not match the configuration: DPoP turned on without a
    /// key would silently yield bearer tokens, and a key without DPoP turned on would yield
    /// tokens the manager does not know how to use.
    static func check(_ dpop: DPoPProofFactory?, for configuration: ClientConfiguration) throws(AuthError) {
        if configuration.usesDPoP && dpop == nil {
            throw .configuration("DPoP is turned on for this client: pass the new session's proofs (CredentialsManager.signInProofs()) to the flow")
        }
        if !configuration.usesDPoP && dpop != nil {
            throw .configuration("DPoP proofs were given for a client whose configuration does not turn on usesDPoP")
        }
    }

    /// A proof for `request`'s method and URL, with the server's latest nonce.
    func proof(for request: URLRequest, accessToken: SecretBytes? = nil) async throws(AuthError) -> String {
        guard let url = request.url else { throw .configuration("the request has no URL") }
        return try await proof(method: request.httpMethod ?? "GET", url: url, accessToken: accessToken, nonce: nonces.nonce(for: url))
    }
}

/// What a resource server's `WWW-Authenticate` answer says about a DPoP request.
enum DPoPChallenge {
    /// `error="use_dpop_nonce"`: retry with the nonce the answer carries.
    case useNonce
    /// `error="invalid_dpop_proof"`.
    case invalidProof
    /// Anything else (including `invalid_token`, or no DPoP challenge at all).
    case other

    init(_ response: HTTPURLResponse) {
        guard response.statusCode == 401, let header = response.value(forHTTPHeaderField: "WWW-Authenticate"),
            header.utf8.count <= 8192, header.range(of: "dpop", options: .caseInsensitive) != nil
        else {
            self = .other
            return
        }
        if header.range(of: "error=\"use_dpop_nonce\"", options: .caseInsensitive) != nil {
            self = .useNonce
        } else if header.range(of: "error=\"invalid_dpop_proof\"", options: .caseInsensitive) != nil {
            self = .invalidProof
        } else {
            self = .other
        }
    }
}
