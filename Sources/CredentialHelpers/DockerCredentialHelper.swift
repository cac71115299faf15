import FoundationEssentials
import LockboxCore

/// docker's credential-helper protocol (docker-credential-helpers) over any ``ItemStore``:
/// `store`, `get`, `erase`, `list` and `version`.
///
/// Credentials are internet passwords for the registry's host in the access group
/// ``accessGroup``, marked with the item description ``itemDescription`` and keyed by the
/// exact server URL docker gave (kept in the comment), so `list` returns the URLs byte for
/// byte. The access group keeps them apart from git's credentials for the same host, which
/// `git-credential-lockbox` never reads, overwrites or erases (docs/SECRET-SERVICE.md, "git and
/// docker items"). Errors go to stdout with exit status 1, as docker's client reads them; a
/// missing credential is exactly ``notFoundMessage``.
public struct DockerCredentialHelper: Sendable {
    public let store: any ItemStore
    public static let notFoundMessage = "credentials not found in native keychain"
    public static let itemDescription = "Docker credentials"
    /// The access group of docker's items: a primary key of their own, apart from the default
    /// group that git's items, the CLI's and other tools' share.
    public static let accessGroup = "io.lockbox.docker-credentials"
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
        static let inputTooLarge = HelperFailure(
            message: "the input is larger than 1 MiB, more than any registry credential needs; nothing was done")
    }

    /// The largest input `store`, `get` and `erase` accept: 1 MiB.
    public static let maximumInputSize = 1 << 20

    /// The credentials `store` was given, read as docker-credential-helpers reads them.
    struct Credentials {
        var serverURL: String
        var username: String
        var secret: SecretBytes
    }

    /// Reads `store`'s input as docker-credential-helpers does: the lines of stdin joined
    /// without their line ends (bufio.Scanner), then the first JSON value decoded by Go's
    /// `encoding/json` into `{ServerURL, Username, Secret}`. So keys match case-insensitively
    /// (`serverurl`, `SECRET`; the last of two spellings wins), unknown members of any type are
    /// ignored, `null` leaves a field empty, and text after the object is not read. A member
    /// of a wanted name whose value is not a string is refused, as Go refuses it.
    static func credentials(_ input: [UInt8]) throws(HelperFailure) -> Credentials {
        guard input.count <= maximumInputSize else { throw .inputTooLarge }
        var joined = joinedLines(input)
        defer { joined.wipe() }
        var members: [FlatJSON.Member]
        do {
            members = try FlatJSON.parseFirstObject(joined)
        } catch {
            throw HelperFailure(message: "invalid credentials JSON: \(error)")
        }
        var fields: [String: [UInt8]] = [:]
        defer {
            for key in fields.keys { fields[key]?.wipe() }
            for index in members.indices {
                if case .string(var bytes) = members[index].value {
                    members[index].value = .null
                    bytes.wipe()
                }
            }
        }
        for member in members {
            guard let name = ["ServerURL", "Username", "Secret"].first(where: { goFold($0) == goFold(member.key) }) else {
                continue
            }
            switch member.value {
            case .string(let bytes): fields[name] = bytes
            case .null: break
            case .other: throw HelperFailure(message: "invalid credentials JSON: \(name) is not a string")
            }
        }
        guard let urlBytes = fields["ServerURL"], !urlBytes.isEmpty else { throw .noServerURL }
        guard let serverURL = String(validating: urlBytes, as: UTF8.self) else {
            throw HelperFailure(message: "invalid credentials JSON: ServerURL is not UTF-8")
        }
        guard let usernameBytes = fields["Username"], !usernameBytes.isEmpty else { throw .noUsername }
        guard let username = String(validating: usernameBytes, as: UTF8.self) else {
            throw HelperFailure(message: "invalid credentials JSON: Username is not UTF-8")
        }
        return Credentials(serverURL: serverURL, username: username, secret: SecretBytes(copying: fields["Secret"] ?? []))
    }

    /// The input without its line ends, as bufio.Scanner's ScanLines splits it: LF ends a
    /// line, and a CR just before it (or at the very end) goes with it.
    static func joinedLines(_ input: [UInt8]) -> [UInt8] {
        var output: [UInt8] = []
        output.reserveCapacity(input.count)
        var index = 0
        while index < input.count {
            let byte = input[index]
            let endsLine = index + 1 == input.count || input[index + 1] == UInt8(ascii: "\n")
            if byte == UInt8(ascii: "\n") || (byte == UInt8(ascii: "\r") && endsLine) {
                index += 1
                continue
            }
            output.append(byte)
            index += 1
        }
        return output
    }

    /// A field name folded as Go's encoding/json folds names to match them: ASCII letters
    /// to upper case, other characters through their simple lower- then upper-case mapping
    /// (so `ſecret` is `SECRET`, as in Go).
    static func goFold(_ name: String) -> [Unicode.Scalar] {
        name.unicodeScalars.map { scalar in
            if scalar.isASCII {
                return (scalar >= "a" && scalar <= "z") ? Unicode.Scalar(UInt8(scalar.value) - 0x20) : scalar
            }
            func single(_ mapping: String) -> Unicode.Scalar? {
                let scalars = mapping.unicodeScalars
                return scalars.count == 1 ? scalars.first : nil
            }
            let lower = single(scalar.properties.lowercaseMapping) ?? scalar
            return single(lower.properties.uppercaseMapping) ?? lower
        }
    }

    private func storeCredentials(_ input: [UInt8]) throws(HelperFailure) {
        let credentials = try Self.credentials(input)
        let serverURL = credentials.serverURL
        let username = credentials.username
        let secret = credentials.secret
        var attributes = Self.attributes(serverURL)
        attributes.account = username
        attributes.label = "Docker credentials for \(serverURL)"
        do throws(LockboxError) {
            // The new credential is stored before any other is removed: a store that fails (a
            // secret over the keychain's limit, a locked keychain) leaves the server's credential
            // as it was. Before, the old one was deleted first, and lost.
            var existingQuery = Self.query(serverURL)
            existingQuery.returning = [.attributes, .persistentReference]
            var existing: [Item] = []
            do throws(LockboxError) {
                existing = try store.items(matching: existingQuery)
            } catch where error.code == .itemNotFound {}
            let sameUser = existing.firstIndex { ($0.attributes.account ?? "").utf8.elementsEqual(username.utf8) }
            if let sameUser, let reference = existing[sameUser].persistentReference {
                var update = ItemAttributes()
                update.label = attributes.label
                try store.update(matching: Self.row(reference), to: ItemUpdate(attributes: update, data: secret))
                existing.remove(at: sameUser)
            } else {
                try store.add(Item(.internetPassword, attributes: attributes, data: secret))
            }
            // The server's credentials for other user names: one credential per server, as before.
            for other in existing {
                guard let reference = other.persistentReference else { continue }
                do throws(LockboxError) {
                    try store.delete(matching: Self.row(reference))
                } catch where error.code == .itemNotFound {}
            }
        } catch {
            throw HelperFailure(message: error.description)
        }
    }

    /// The one row `reference` names.
    private static func row(_ reference: Data) -> Query {
        var query = Query(.internetPassword, synchronizable: .any)
        query.persistentReference = reference
        return query
    }

    private func get(serverURL: String) throws(HelperFailure) -> [UInt8] {
        var query = Self.query(serverURL)
        query.returning = [.attributes, .data]
        let found: Item?
        do throws(LockboxError) {
            found = Self.ownGroupFirst(Self.moveToOwnGroup(try store.items(matching: query), in: store)).first
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
        query.returning = [.attributes]
        let items: [Item]
        do throws(LockboxError) {
            items = Self.ownGroupFirst(Self.moveToOwnGroup(try store.items(matching: query), in: store))
        } catch LockboxError.itemNotFound {
            items = []
        } catch {
            throw HelperFailure(message: error.description)
        }
        var accounts: [String: [UInt8]] = [:]
        for item in items where Self.isDockerItem(item.attributes) {
            guard let url = item.attributes.comment, accounts[url] == nil else { continue }
            accounts[url] = Array((item.attributes.account ?? "").utf8)
        }
        return FlatJSON.encodeObject(accounts.sorted { $0.key < $1.key }.map { ($0.key, $0.value) })
    }

    // MARK: Keeping docker's items apart

    /// True for an item of this helper's: in its access group, or written before the group
    /// existed (``isLegacyDockerItem(_:)``).
    static func isDockerItem(_ attributes: ItemAttributes) -> Bool {
        attributes.accessGroup == accessGroup || isLegacyDockerItem(attributes)
    }

    /// An item this helper wrote before it kept its items in ``accessGroup``: its description
    /// and the server URL in its comment, in another group (the default one).
    static func isLegacyDockerItem(_ attributes: ItemAttributes) -> Bool {
        attributes.accessGroup != accessGroup && attributes.itemDescription == itemDescription
            && attributes.comment != nil
    }

    /// Moves the legacy items among `items` into ``accessGroup`` and returns `items` as they
    /// now are. The move is an update of the one item's access group in place (same row or
    /// Secret Service object, same value): nothing is copied or deleted, so no failure can lose
    /// it. An item that cannot move (its key is taken in the group, the store is locked) stays
    /// where it is, still recognised as docker's, and is tried again next time.
    static func moveToOwnGroup(_ items: [Item], in store: any ItemStore) -> [Item] {
        items.map { item in
            guard isLegacyDockerItem(item.attributes), let reference = item.persistentReference else { return item }
            let key = item.attributes
            var exact = Query(
                .internetPassword,
                attributes: .internet(
                    server: key.server ?? "", account: key.account, protocol: key.protocol, port: key.port, path: key.path),
                limit: .all)
            exact.attributes.comment = key.comment
            exact.attributes.itemDescription = key.itemDescription
            exact.attributes.accessGroup = key.accessGroup
            exact.persistentReference = reference
            do throws(LockboxError) {
                try store.update(matching: exact, to: ItemUpdate(attributes: ItemAttributes(accessGroup: accessGroup)))
            } catch {
                return item
            }
            var moved = item
            moved.attributes.accessGroup = accessGroup
            return moved
        }
    }

    /// `items` with those in ``accessGroup`` first (a legacy copy that could not move yields to
    /// the current one), in their order otherwise.
    static func ownGroupFirst(_ items: [Item]) -> [Item] {
        items.filter { $0.attributes.accessGroup == accessGroup } + items.filter { $0.attributes.accessGroup != accessGroup }
    }

    /// docker sends the server URL as the whole of stdin, maybe with a newline.
    static func serverURL(_ input: [UInt8]) throws(HelperFailure) -> String {
        guard input.count <= maximumInputSize else { throw .inputTooLarge }
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
        attributes.accessGroup = accessGroup
        return attributes
    }

    /// This helper's items for `serverURL`, in any access group: legacy items are found too,
    /// so that `store` and `erase` replace and remove them as well.
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
