import FoundationEssentials
import LockboxCore
import LockboxVault

/// Operations a broker serves beside the item store's (keys used inside the broker): the
/// executable that links the key API provides them, so that clients never load it.
package protocol BrokerKeyOperations: Sendable {
    /// Handles ``BrokerProtocol/Operation/generateKey``, ``BrokerProtocol/Operation/sign``,
    /// ``BrokerProtocol/Operation/encrypt``, ``BrokerProtocol/Operation/decrypt`` and
    /// ``BrokerProtocol/Operation/publicKey``; returns
    /// the reply's result fields. A key is used only when the peer's grant reaches its access
    /// group (``BrokerService/matching(_:grant:)``), with `context` for an access-controlled key.
    func handle(
        _ operation: BrokerProtocol.Operation, arguments: inout FieldDecoder, grant: BrokerGrant, context: AuthenticationContext,
        vault: Vault
    ) throws(LockboxError) -> (inout FieldEncoder) -> Void
}

/// Answers one request with the vault, inside the walls of the peer's grant. Holds no state
/// of its own: the vault is the state, and it is durable before a reply is sent.
package struct BrokerService: Sendable {
    package let vault: Vault
    package let keyOperations: (any BrokerKeyOperations)?

    package init(vault: Vault, keyOperations: (any BrokerKeyOperations)? = nil) {
        self.vault = vault
        self.keyOperations = keyOperations
    }

    /// The reply's bytes for a request's bytes. Never throws: every failure is a reply. A
    /// passphrase the client's user entered (``BrokerProtocol/Operation/authenticate``) is
    /// checked here, then kept in the session for its reuse window.
    package func reply(to bytes: [UInt8], session: inout BrokerSession) -> [UInt8] {
        do throws(LockboxError) {
            var request = try BrokerRequest(decoding: bytes)
            if request.operation == .authenticate {
                var inner = try Self.authenticated(&request.arguments)
                defer { inner.passphrase = .empty }
                try authenticate(inner.passphrase, reuse: inner.reuse, session: &session)
                return answer(try BrokerRequest(decoding: inner.request), session: &session)
            }
            let widens = request.operation == .unlock && Self.carriesPassphrase(request.arguments)
            let reply = answer(request, session: &session)
            if widens, session.grant.reachesEveryGroupWithPassphrase, (try? BrokerCoding.decodeReply(reply)) != nil {
                // An unlock with the passphrase is that passphrase entered again.
                session.widen(for: .zero)
            }
            return reply
        } catch {
            return BrokerCoding.failure(error)
        }
    }

    /// Whether an unlock's arguments hold a passphrase. An unlock without one (a vault already
    /// unlocked, another unlock method) proves nothing about the user and widens nothing.
    static func carriesPassphrase(_ arguments: FieldDecoder) -> Bool {
        var arguments = arguments
        guard var passphrase = try? arguments.bytes() else { return false }
        defer { passphrase.wipe() }
        return !passphrase.isEmpty
    }

    /// An ``BrokerProtocol/Operation/authenticate`` request's arguments: the passphrase, the
    /// reuse window the client's context asks, and the request to run with them.
    package static func authenticated(_ arguments: inout FieldDecoder) throws(LockboxError) -> (
        passphrase: SecretBytes, reuse: Duration, request: [UInt8]
    ) {
        guard var bytes = try? arguments.bytes(), let milliseconds = try? arguments.integer(), milliseconds >= 0,
            let request = try? arguments.bytes(), arguments.isAtEnd
        else { throw BrokerCoding.malformed("an authentication") }
        let passphrase = SecretBytes(copying: bytes)
        bytes.wipe()
        var inner = FieldDecoder(request)
        guard let raw = try? inner.integer(), let operation = BrokerProtocol.Operation(rawValue: raw),
            ![.hello, .authenticate, .unlock, .stop].contains(operation)
        else { throw BrokerCoding.malformed("an authentication without a request to run") }
        guard !passphrase.isEmpty else {
            throw LockboxError(.userCanceled, "Cancelled: the passphrase was not given.")
        }
        return (passphrase, .milliseconds(min(milliseconds, Int(BrokerSession.longestReuse.components.seconds) * 1000)), request)
    }

    /// Checks the user's passphrase (counted by the failed-attempt back-off) and keeps the
    /// verification in the session.
    private func authenticate(_ passphrase: SecretBytes, reuse: Duration, session: inout BrokerSession) throws(LockboxError) {
        let verified = try vault.verifyPresence(passphrase: passphrase)
        session.remember(verified, for: reuse)
        if session.grant.reachesEveryGroupWithPassphrase { session.widen(for: reuse) }
    }

    /// Runs one request with the session's grant and verification; a request refused for want
    /// of the user's passphrase says so (a challenge), so that the client can ask its user.
    private func answer(_ request: BrokerRequest, session: inout BrokerSession) -> [UInt8] {
        var request = request
        let recorder = PresenceRecorder()
        let context = session.context(recorder)
        let grant = session.currentGrant
        defer { session.requestAnswered() }
        do throws(LockboxError) {
            let body = try perform(request.operation, &request.arguments, grant: grant, context: context)
            return BrokerCoding.success(body)
        } catch {
            if let asked = recorder.request, error.code == .interactionNotAllowed {
                return BrokerCoding.failure(error, challenge: (.userPresence, asked))
            }
            if error.code == .missingEntitlement, session.grant.reachesEveryGroupWithPassphrase {
                let reason = "let \(grant.peerName) use every access group"
                return BrokerCoding.failure(error, challenge: (.everyGroup, AuthenticationRequest(reason: reason, accessControl: .userPresence)))
            }
            return BrokerCoding.failure(error)
        }
    }

    private func perform(
        _ operation: BrokerProtocol.Operation, _ arguments: inout FieldDecoder, grant: BrokerGrant, context: AuthenticationContext
    ) throws(LockboxError) -> (inout FieldEncoder) -> Void {
        switch operation {
        case .hello:
            throw LockboxError(.param, "A connection says hello once, first.")
        case .authenticate:
            throw BrokerCoding.malformed("an authentication inside another")
        case .stop:
            throw LockboxError(.param, "The broker's server answers stop; this request reached no server.")
        case .add:
            var item = try BrokerCoding.decodeItem(&arguments)
            try expectEnd(arguments)
            let group = item.attributes.accessGroup ?? grant.defaultAccessGroup
            guard grant.allows(group) else { throw grant.missing(group) }
            item.attributes.accessGroup = group
            try vault.add(item)
            return { _ in }
        case .items:
            var query = try BrokerCoding.decodeQuery(&arguments)
            try expectEnd(arguments)
            query.authenticationContext = context
            let items = try matching(query, grant: grant)
            var encoder = FieldEncoder()
            encoder.integer(items.count)
            for item in items {
                BrokerCoding.encode(item, into: &encoder)
                guard encoder.bytes.count < BrokerProtocol.maximumReplyBytes - 64 else {
                    throw LockboxError(
                        .param, "Over \(items.count) items match, more than one reply carries: narrow the query or ask for attributes only.")
                }
            }
            let encoded = encoder.bytes
            return { $0.bytes(encoded) }
        case .update:
            var query = try BrokerCoding.decodeQuery(&arguments)
            let update = try BrokerCoding.decodeUpdate(&arguments)
            try expectEnd(arguments)
            query.authenticationContext = context
            if let target = update.attributes.accessGroup, !grant.allows(target) { throw grant.missing(target) }
            try eachGroup(of: query, grant: grant) { query throws(LockboxError) in
                try vault.update(matching: query, to: update)
                return 1
            }
            return { _ in }
        case .delete:
            var query = try BrokerCoding.decodeQuery(&arguments)
            try expectEnd(arguments)
            query.authenticationContext = context
            let deleted = try eachGroup(of: query, grant: grant) { query throws(LockboxError) in try vault.delete(matching: query) }
            return { $0.integer(deleted) }
        case .status:
            try expectEnd(arguments)
            var status = try vault.status()
            if grant.accessGroups != nil {
                // Walled in: the program learns of its own groups, not how many items other
                // programs keep or when they write (the generation counts every write).
                status.itemCount = try ownItemCount(grant: grant)
                status.itemsBoundToOtherMachines = 0
                status.generation = nil
            }
            guard let json = try? JSONEncoder().encode(status) else {
                throw LockboxError(.io, "The keychain's status could not be encoded.")
            }
            return { $0.bytes(Array(json)) }
        case .unlock:
            guard var bytes = try? arguments.bytes() else { throw BrokerCoding.malformed("no passphrase") }
            try expectEnd(arguments)
            let passphrase = SecretBytes(copying: bytes)
            bytes.wipe()
            if passphrase.isEmpty {
                try vault.unlock()
            } else {
                try vault.unlock(passphrase: passphrase)
            }
            return { _ in }
        case .lock:
            guard let all = try? arguments.integer() else { throw BrokerCoding.malformed("no lock scope") }
            try expectEnd(arguments)
            if all == 1 { vault.lockAll() } else { vault.lock() }
            return { _ in }
        case .sign, .publicKey, .generateKey, .decrypt, .encrypt:
            guard let keyOperations else {
                throw LockboxError(.unimplemented, "This broker does not serve key operations; run lockboxd, which does.")
            }
            return try keyOperations.handle(operation, arguments: &arguments, grant: grant, context: context, vault: vault)
        }
    }

    private func expectEnd(_ arguments: FieldDecoder) throws(LockboxError) {
        guard arguments.isAtEnd else { throw BrokerCoding.malformed("trailing bytes") }
    }

    /// The groups a query reaches: the one it names (when the peer holds it), else every group
    /// the peer holds; nil for no restriction.
    package static func groups(of query: Query, grant: BrokerGrant) throws(LockboxError) -> [String]? {
        if let group = query.attributes.accessGroup {
            guard grant.allows(group) else { throw grant.missing(group) }
            return [group]
        }
        return grant.accessGroups
    }

    /// How many items the peer's groups hold that it can read now (a locked class's are not
    /// counted: they cannot be told apart from other groups' without their keys).
    private func ownItemCount(grant: BrokerGrant) throws(LockboxError) -> Int {
        var count = 0
        for itemClass in ItemClass.allCases {
            var query = Query(itemClass, limit: .all, returning: [.attributes])
            query.synchronizable = .any
            do {
                count += try matching(query, grant: grant).count
            } catch where error.code == .itemNotFound || error.code == .interactionNotAllowed {
                continue
            }
        }
        return count
    }

    /// The matches in the peer's groups, as one store restricted to them answers.
    package func matching(_ query: Query, grant: BrokerGrant) throws(LockboxError) -> [Item] {
        guard let groups = try Self.groups(of: query, grant: grant) else { return try vault.items(matching: query) }
        var found: [Item] = []
        var locked: LockboxError?
        for group in groups {
            var restricted = query
            restricted.attributes.accessGroup = group
            do throws(LockboxError) {
                found += try vault.items(matching: restricted)
                if query.limit == .one, !found.isEmpty { return [found[0]] }
            } catch where error.code == .itemNotFound {
                continue
            } catch where error.code == .interactionNotAllowed {
                locked = locked ?? error
            }
        }
        // Locked is never reported as "not found".
        if let locked { throw locked }
        guard !found.isEmpty else { throw LockboxError(.itemNotFound, "No matching item was found in the keychain.") }
        return found
    }

    /// Runs `body` once per group the query reaches; the sum of its results.
    @discardableResult
    private func eachGroup(of query: Query, grant: BrokerGrant, _ body: (Query) throws(LockboxError) -> Int) throws(LockboxError) -> Int {
        guard let groups = try Self.groups(of: query, grant: grant) else { return try body(query) }
        var total = 0
        var locked: LockboxError?
        for group in groups {
            var restricted = query
            restricted.attributes.accessGroup = group
            do throws(LockboxError) {
                total += try body(restricted)
            } catch where error.code == .itemNotFound {
                continue
            } catch where error.code == .interactionNotAllowed {
                locked = locked ?? error
            }
        }
        if let locked { throw locked }
        guard total > 0 else { throw LockboxError(.itemNotFound, "No matching item was found in the keychain.") }
        return total
    }
}
