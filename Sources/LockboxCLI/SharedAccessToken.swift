import KeyProviders
import Lockbox
import LockboxCommandLine

#if canImport(Glibc)
import Glibc
#endif

/// `lockbox token` answered here, without starting `lockbox-oauth` and without network, when
/// the kernel keyring holds a fresh access token that another process shared (LockboxAuth's
/// `KernelKeyringTokenCache`, same entries through ``AccessTokenKeyring``). Any miss (no entry,
/// not fresh, no session or several, a locked keychain) hands over to `lockbox-oauth`, which
/// refreshes under the cross-process lock or reports the problem. So does a DPoP session's token
/// (bound to a key), which is printed only with a proof (`lockbox token --url`).
enum SharedAccessToken {
    /// `ItemStoreTokenStore.service`: the refresh-token items whose attributes name the sessions.
    static let refreshTokenService = "lockbox.oauth.refresh-token"

    /// Prints the shared token and returns true, or returns false on a miss.
    static func answer(issuer: String?, clientID: String?, options: Keychain.Options) -> Bool {
        if let setting = ProcessEnvironment.value("LOCKBOX_ACCESS_TOKEN_CACHE"),
            ["off", "0", "no", "false"].contains(setting.lowercased())
        {
            return false
        }
        guard let opened = try? Keychain.open(options) else { return false }
        let namespace = opened.accessTokenCacheNamespace(explicitPath: options.path)
        var query = Query.genericPassword(service: refreshTokenService)
        query.limit = .all
        query.returning = .attributes
        guard let items = try? opened.store.items(matching: query) else { return false }
        let wantedIssuer = issuer.map { $0.hasSuffix("/") ? String($0.dropLast()) : $0 }
        var matches: [String] = []
        for item in items {
            guard let identity = item.attributes.account, let parts = sessionParts(identity) else { continue }
            if let wantedIssuer, parts.issuer != wantedIssuer { continue }
            if let clientID, parts.clientID != clientID { continue }
            matches.append(identity)
        }
        guard matches.count == 1,
            let entry = try? AccessTokenKeyring.read(namespace: namespace, identity: matches[0]),
            nowMilliseconds() < entry.freshUntilMilliseconds,
            // A DPoP-bound token is useless without a proof: `lockbox-oauth` says what to pass.
            entry.tokenType.lowercased() == "bearer"
        else { return false }
        SecretInput.writeToStandardOutput(entry.token)
        return true
    }

    /// The issuer and client id of a session's identity, `<n>:<issuer>|<m>:<client id>|<account>`.
    static func sessionParts(_ identity: String) -> (issuer: String, clientID: String)? {
        var rest = Substring(identity)
        func field() -> String? {
            guard let colon = rest.firstIndex(of: ":"), let length = Int(rest[..<colon]) else { return nil }
            let start = rest.utf8.index(after: colon)
            guard let end = rest.utf8.index(start, offsetBy: length, limitedBy: rest.utf8.endIndex), end < rest.utf8.endIndex,
                rest.utf8[end] == UInt8(ascii: "|")
            else { return nil }
            let value = String(rest[start..<end])
            rest = rest[rest.utf8.index(after: end)...]
            return value
        }
        guard let issuer = field(), let clientID = field() else { return nil }
        return (issuer, clientID)
    }

    private static func nowMilliseconds() -> Int64 {
        var now = timespec()
        clock_gettime(CLOCK_REALTIME, &now)
        return Int64(now.tv_sec) * 1000 + Int64(now.tv_nsec) / 1_000_000
    }
}
