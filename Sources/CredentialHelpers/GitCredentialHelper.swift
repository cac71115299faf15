import FoundationEssentials
import LockboxCore

/// git's credential-helper protocol over any ``ItemStore``: `get`, `store` and `erase`.
///
/// Credentials are internet passwords keyed by protocol, host, port, path and username, in
/// the store's default access group, shared with the CLI and git's libsecret helper. The
/// docker helper's items for the same host (``DockerCredentialHelper/accessGroup``) are never
/// answered, overwritten or erased; items it wrote before it had that group are moved there
/// when met.
/// The item's value is the password, followed by `\npassword_expiry_utc=...` and
/// `\noauth_refresh_token=...` lines when git gave them: the layout git's own libsecret
/// helper uses, so on the Secret Service either helper reads the other's items.
///
/// ```
/// git config --global credential.helper lockbox   # runs git-credential-lockbox
/// ```
public struct GitCredentialHelper: Sendable {
    public let store: any ItemStore
    /// The clock, for skipping expired passwords.
    public var now: @Sendable () -> Date = { Date() }

    public init(store: any ItemStore) {
        self.store = store
    }

    /// Runs one operation on helper input; unknown operations do nothing, as git asks.
    public func run(operation: String, input: [UInt8]) -> HelperOutcome {
        let credential: GitCredential
        do {
            credential = try GitCredential.parse(input)
        } catch {
            return HelperOutcome(standardError: "git-credential-lockbox: \(error)", exitStatus: 1)
        }
        do throws(LockboxError) {
            switch operation {
            case "get":
                guard let found = try get(credential) else { return HelperOutcome() }
                if let field = found.fieldWithControlCharacter {
                    return HelperOutcome(
                        standardError: "git-credential-lockbox: the stored \(field) for this host contains a control "
                            + "character, which git's credential protocol cannot carry; nothing was returned. "
                            + "Store the credential again without it.",
                        exitStatus: 1)
                }
                return HelperOutcome(standardOutput: found.serialized())
            case "store":
                try store(credential)
            case "erase":
                try erase(credential)
            default:
                break
            }
            return HelperOutcome()
        } catch {
            return HelperOutcome(standardError: "git-credential-lockbox: \(error)", exitStatus: 1)
        }
    }

    /// The stored credential for `request`'s protocol, host, path and username, or nil.
    public func get(_ request: GitCredential) throws(LockboxError) -> GitCredential? {
        guard let candidates = try matching(request, returningData: true) else { return nil }
        for item in candidates {
            guard let data = item.data else { continue }
            var answer = Self.decodeValue(data)
            if let expiry = answer.passwordExpiryUTC, expiry <= Int64(now().timeIntervalSince1970) { continue }
            answer.username = item.attributes.account
            return answer
        }
        return nil
    }

    /// Stores `credential`, replacing the password of the same protocol, host, path and user.
    /// Without protocol, host, username and password there is nothing to store.
    public func store(_ credential: GitCredential) throws(LockboxError) {
        guard let scheme = credential.protocol, let (host, port) = credential.hostAndPort,
            let username = credential.username, let password = credential.password
        else { return }
        var attributes = ItemAttributes.internet(
            server: host, account: username, protocol: InternetProtocol(name: scheme), port: port,
            path: credential.path)
        attributes.label = "Git: \(scheme)://\(credential.host ?? host)/\(credential.path ?? "")"
        let value = Self.encodeValue(password: password, credential)
        var query = Query(.internetPassword, attributes: attributes)
        query.attributes.label = nil
        query.limit = .all
        let existing: [Item]
        do {
            existing = try withoutDockerItems(store.items(matching: query)).filter { Self.sameKey($0.attributes, attributes) }
        } catch LockboxError.itemNotFound {
            existing = []
        }
        if existing.isEmpty {
            try store.add(Item(.internetPassword, attributes: attributes, data: value))
        }
        for item in existing {
            try store.update(matching: Self.exactQuery(item), to: ItemUpdate(data: value))
        }
    }

    /// Erases the matching credentials; when git gives a password, only those that still
    /// hold it (another process may have stored a newer one meanwhile).
    public func erase(_ request: GitCredential) throws(LockboxError) {
        guard let candidates = try matching(request, returningData: request.password != nil) else { return }
        for item in candidates {
            if let password = request.password {
                guard let data = item.data, Self.decodeValue(data).password == password else { continue }
            }
            do {
                try store.delete(matching: Self.exactQuery(item))
            } catch LockboxError.itemNotFound {
                continue
            }
        }
    }

    /// Items for the request's host (and protocol, port, path, username when given).
    private func matching(_ request: GitCredential, returningData: Bool) throws(LockboxError) -> [Item]? {
        guard let (host, port) = request.hostAndPort else { return nil }
        var query = Query(.internetPassword, attributes: .internet(server: host), limit: .all)
        query.attributes.protocol = request.protocol.map(InternetProtocol.init(name:))
        query.attributes.path = request.path
        query.attributes.account = request.username
        query.attributes.port = port
        query.returning = returningData ? [.attributes, .data] : [.attributes]
        do {
            // An absent port in the request means the default port, not "any port".
            return try withoutDockerItems(store.items(matching: query)).filter { $0.attributes.port == port }
        } catch LockboxError.itemNotFound {
            return nil
        }
    }

    /// `items` less docker's. Docker items from before their access group are moved there
    /// first, so that an item git then adds for the same key is no duplicate of one.
    private func withoutDockerItems(_ items: [Item]) -> [Item] {
        if items.contains(where: { DockerCredentialHelper.isLegacyDockerItem($0.attributes) }) {
            _ = DockerCredentialHelper.moveToOwnGroup(items, in: store)
        }
        return items.filter { !DockerCredentialHelper.isDockerItem($0.attributes) }
    }

    /// A query for exactly `item`: its key attributes, and its reference where the store
    /// gives one.
    static func exactQuery(_ item: Item) -> Query {
        let key = item.attributes
        var query = Query(
            .internetPassword,
            attributes: .internet(
                server: key.server ?? "", account: key.account, protocol: key.protocol, port: key.port,
                path: key.path),
            limit: .all)
        query.persistentReference = item.persistentReference
        return query
    }

    private static func sameKey(_ stored: ItemAttributes, _ wanted: ItemAttributes) -> Bool {
        stored.server == wanted.server && stored.protocol == wanted.protocol && stored.port == wanted.port
            && stored.path == wanted.path && stored.account == wanted.account
    }

    /// `password[\npassword_expiry_utc=N][\noauth_refresh_token=T]`
    static func encodeValue(password: SecretBytes, _ credential: GitCredential) -> SecretBytes {
        var bytes = password.withUnsafeBytes { Array($0) }
        defer { bytes.wipe() }
        if let expiry = credential.passwordExpiryUTC {
            bytes.append(contentsOf: Array("\npassword_expiry_utc=\(expiry)".utf8))
        }
        if let token = credential.oauthRefreshToken {
            bytes.append(contentsOf: Array("\noauth_refresh_token=".utf8))
            token.withUnsafeBytes { bytes.append(contentsOf: $0) }
        }
        return SecretBytes(copying: bytes)
    }

    static func decodeValue(_ value: SecretBytes) -> GitCredential {
        var credential = GitCredential()
        value.withUnsafeBytes { bytes in
            let lines = bytes.split(separator: UInt8(ascii: "\n"), omittingEmptySubsequences: false)
            guard let first = lines.first else {
                credential.password = .empty
                return
            }
            credential.password = SecretBytes(copying: UnsafeRawBufferPointer(rebasing: first))
            for line in lines.dropFirst() {
                guard let equals = line.firstIndex(of: UInt8(ascii: "=")) else { continue }
                let key = String(decoding: line[line.startIndex..<equals], as: UTF8.self)
                let rest = UnsafeRawBufferPointer(rebasing: line[(equals + 1)...])
                switch key {
                case "password_expiry_utc": credential.passwordExpiryUTC = Int64(String(decoding: rest, as: UTF8.self))
                case "oauth_refresh_token": credential.oauthRefreshToken = SecretBytes(copying: rest)
                default: break
                }
            }
        }
        return credential
    }
}
