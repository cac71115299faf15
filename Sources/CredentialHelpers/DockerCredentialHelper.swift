import LockboxCore

/// docker's credential-helper protocol (docker-credential-helpers) over any ``ItemStore``:
/// `store`, `get`, `erase`, `list` and `version`.
///
/// Credentials are internet passwords for the registry's host, marked with the item
/// description ``itemDescription`` and keyed by the exact server URL docker gave (kept in
/// the comment), so `list` returns the URLs byte for byte. Errors go to stdout with exit
/// status 1, as docker's client reads them; a missing credential is exactly
/// ``notFoundMessage``.
public struct DockerCredentialHelper: Sendable {
    public let store: any ItemStore
    public static let notFoundMessage = "credentials not found in native keychain"
    public static let itemDescription = "Docker credentials"
    public static let version = "0.1.0"

    public init(store: any ItemStore) {
        self.store = store
    }

    public func run(operation: String, input: [UInt8]) -> HelperOutcome {
        do throws(HelperFailure) {
            switch operation {
            case "store": try storeCredentials(input)
            case "get": return HelperOutcome(standardOutput: try get(serverURL: Self.serverURL(input)))
            case "erase": try erase(serverURL: Self.serverURL(input))
            case "list": return HelperOutcome(standardOutput: try list())
            case "version":
                return HelperOutcome(standardOutput: Array("docker-credential-lockbox (lockbox) \(Self.version)\n".utf8))
            default:
                return HelperOutcome(
                    standardOutput: Array("Usage: docker-credential-lockbox <store|get|erase|list|version>\n".utf8),
                    exitStatus: 1)
            }
            return HelperOutcome()
        } catch {
            return HelperOutcome(standardOutput: Array((error.message + "\n").utf8), exitStatus: 1)
        }
    }

    struct HelperFailure: Error {
        let message: String
        static let notFound = HelperFailure(message: DockerCredentialHelper.notFoundMessage)
        static let noServerURL = HelperFailure(message: "no credentials server URL")
        static let noUsername = HelperFailure(message: "no credentials username")
    }

    private func storeCredentials(_ input: [UInt8]) throws(HelperFailure) {
        var object: [String: [UInt8]]
        do {
            object = try FlatJSON.parseObject(input)
        } catch {
            throw HelperFailure(message: "invalid credentials JSON: \(error)")
        }
        defer {
            for key in object.keys { object[key]?.wipe() }
        }
        guard let urlBytes = object["ServerURL"], let serverURL = String(validating: urlBytes, as: UTF8.self),
            !serverURL.isEmpty
        else { throw .noServerURL }
        guard let usernameBytes = object["Username"], let username = String(validating: usernameBytes, as: UTF8.self),
            !username.isEmpty
        else { throw .noUsername }
        let secret = SecretBytes(copying: object["Secret"] ?? [])
        var attributes = Self.attributes(serverURL)
        attributes.account = username
        attributes.label = "Docker credentials for \(serverURL)"
        do throws(LockboxError) {
            do {
                try store.delete(matching: Self.query(serverURL))
            } catch LockboxError.itemNotFound {}
            try store.add(Item(.internetPassword, attributes: attributes, data: secret))
        } catch {
            throw HelperFailure(message: error.description)
        }
    }

    private func get(serverURL: String) throws(HelperFailure) -> [UInt8] {
        var query = Self.query(serverURL)
        query.limit = .one
        query.returning = [.attributes, .data]
        let found: Item?
        do throws(LockboxError) {
            found = try store.items(matching: query).first
        } catch LockboxError.itemNotFound {
            throw .notFound
        } catch {
            throw HelperFailure(message: error.description)
        }
        guard let item = found else { throw .notFound }
        var secret = item.data?.withUnsafeBytes { Array($0) } ?? []
        defer { secret.wipe() }
        return FlatJSON.encodeObject([
            ("ServerURL", Array(serverURL.utf8)),
            ("Username", Array((item.attributes.account ?? "").utf8)),
            ("Secret", secret),
        ])
    }

    private func erase(serverURL: String) throws(HelperFailure) {
        do throws(LockboxError) {
            try store.delete(matching: Self.query(serverURL))
        } catch LockboxError.itemNotFound {
            throw .notFound
        } catch {
            throw HelperFailure(message: error.description)
        }
    }

    private func list() throws(HelperFailure) -> [UInt8] {
        var query = Query(.internetPassword, limit: .all)
        query.attributes.itemDescription = Self.itemDescription
        let items: [Item]
        do throws(LockboxError) {
            items = try store.items(matching: query)
        } catch LockboxError.itemNotFound {
            items = []
        } catch {
            throw HelperFailure(message: error.description)
        }
        let pairs = items.compactMap { item -> (String, [UInt8])? in
            guard let url = item.attributes.comment else { return nil }
            return (url, Array((item.attributes.account ?? "").utf8))
        }
        return FlatJSON.encodeObject(pairs.sorted { $0.0 < $1.0 })
    }

    /// docker sends the server URL as the whole of stdin, maybe with a newline.
    static func serverURL(_ input: [UInt8]) throws(HelperFailure) -> String {
        guard let text = String(validating: input, as: UTF8.self) else { throw .noServerURL }
        let trimmed = text.trimmingASCIIWhitespace
        guard !trimmed.isEmpty else { throw .noServerURL }
        return trimmed
    }

    /// The registry as an internet password: host, scheme, port and path from the URL,
    /// which is also kept verbatim in the comment.
    static func attributes(_ serverURL: String) -> ItemAttributes {
        var rest = Substring(serverURL)
        var scheme: String? = nil
        if let range = rest.firstRange(of: "://") {
            scheme = String(rest[..<range.lowerBound])
            rest = rest[range.upperBound...]
        }
        var authority = rest
        var path: String? = nil
        if let slash = rest.firstIndex(of: "/") {
            authority = rest[..<slash]
            let remainder = rest[rest.index(after: slash)...]
            path = remainder.isEmpty ? nil : String(remainder)
        }
        var host = String(authority)
        var port: Int? = nil
        if let colon = authority.lastIndex(of: ":"), let value = Int(authority[authority.index(after: colon)...]) {
            host = String(authority[..<colon])
            port = value
        }
        var attributes = ItemAttributes.internet(
            server: host, protocol: scheme.map(InternetProtocol.init(name:)), port: port, path: path)
        attributes.comment = serverURL
        attributes.itemDescription = itemDescription
        return attributes
    }

    static func query(_ serverURL: String) -> Query {
        var query = Query(.internetPassword, limit: .all)
        query.attributes.server = attributes(serverURL).server
        query.attributes.comment = serverURL
        query.attributes.itemDescription = itemDescription
        return query
    }
}

extension String {
    var trimmingASCIIWhitespace: String {
        let bytes = Array(utf8)
        let isSpace: (UInt8) -> Bool = { [0x20, 0x09, 0x0A, 0x0D].contains($0) }
        guard let first = bytes.firstIndex(where: { !isSpace($0) }),
            let last = bytes.lastIndex(where: { !isSpace($0) })
        else { return "" }
        return String(decoding: bytes[first...last], as: UTF8.self)
    }
}
