import FoundationEssentials
import LockboxCore
import VaultCrypto
import VaultStorage

extension Vault {
    // MARK: ItemStore

    public func add(_ item: Item) throws(LockboxError) {
        try add(item, madeAt: nil)
    }

    /// ``add(_:)``, dated `madeAt` (a change another device made, applied here by sync) instead
    /// of now.
    package func add(_ item: Item, madeAt: Date?) throws(LockboxError) {
        let prepared = try prepareForAdding(item, now: madeAt ?? currentDate())
        try withState { state throws(LockboxError) in
            try writeRows(state) { writer throws(LockboxError) in
                _ = try insert(prepared, writer: writer, state: state)
            }
        }
    }

    /// Adds several items in one transaction: all of them or, on any error, none.
    public func add(contentsOf items: [Item]) throws(LockboxError) {
        var prepared: [PreparedItem] = []
        prepared.reserveCapacity(items.count)
        let now = currentDate()
        for item in items {
            prepared.append(try prepareForAdding(item, now: now))
        }
        try withState { state throws(LockboxError) in
            try writeRows(state) { writer throws(LockboxError) in
                for item in prepared {
                    _ = try insert(item, writer: writer, state: state)
                }
            }
        }
    }

    /// An item checked and completed for adding (access group, accessibility, sync flag, dates).
    struct PreparedItem {
        var itemClass: ItemClass
        var attributes: ItemAttributes
        /// `attributes.encoded()`, made once for the size check and the seal.
        var encodedAttributes: [UInt8]
        var data: SecretBytes
        var accessControl: AccessControl?
    }

    /// `sizeLimit`: what the item is checked against instead of this store's limit (an item
    /// sync applies: ``syncedItemSizeLimit``).
    func prepareForAdding(_ item: Item, now: Date, sizeLimit: Int? = nil) throws(LockboxError) -> PreparedItem {
        var attributes = item.attributes
        attributes.accessGroup = try resolvedGroupForWriting(attributes.accessGroup)
        attributes.accessibility = attributes.accessibility ?? .default
        attributes.synchronizable = attributes.synchronizable ?? false
        attributes.creationDate = now
        attributes.modificationDate = now
        let data = item.data ?? .empty
        let encoded = attributes.encoded()
        try checkSizes(data: data, encodedAttributes: encoded, limit: sizeLimit)
        try Self.checkSynchronizable(attributes, hasAccessControl: item.accessControl != nil)
        return PreparedItem(
            itemClass: item.itemClass, attributes: attributes, encodedAttributes: encoded, data: data, accessControl: item.accessControl)
    }

    /// Seals a prepared item as a new row and inserts it; returns the row's identifier (the
    /// item's persistent reference).
    func insert(_ item: PreparedItem, writer: RowWriter, state: State) throws(LockboxError) -> [UInt8] {
        let keys = try keysForWriting(item.itemClass, item.attributes.accessibility!, state: state)
        if item.accessControl != nil && state.header.presencePublicKey == nil {
            throw LockboxError(
                .notAvailable,
                "Access control needs a passphrase to verify the user, and this keychain has none. "
                    + "Set one with `lockbox set-passphrase`.")
        }
        let row = Self.sealForAdding(
            item, keys: keys, vaultID: state.header.vaultID, deviceID: state.device.identifier,
            presencePublicKey: state.header.presencePublicKey, version: writer.generation)
        try insertSealed(row, writer: writer)
        return row.id
    }

    /// Seals a prepared item as a new row (a new identifier for the writing generation,
    /// ``SealedRow/newIdentifier(generation:)``; the value under its class key, or under a fresh
    /// item key when it has access control) with the keys of its class and accessibility. Uses
    /// nothing of the vault's state: it may run on another thread.
    static func sealForAdding(
        _ item: PreparedItem, keys: (classKey: SecretBytes, indexKey: SecretBytes), vaultID: [UInt8], deviceID: String,
        presencePublicKey: [UInt8]?, version: Int
    ) -> SealedRow {
        SealedRow.seal(
            id: SealedRow.newIdentifier(generation: version), itemClass: item.itemClass, attributes: item.attributes,
            encodedAttributes: item.encodedAttributes, data: item.data,
            classKey: keys.classKey, indexKey: keys.indexKey, vaultID: vaultID,
            deviceID: deviceID, accessControl: item.accessControl,
            presencePublicKey: presencePublicKey, version: version)
    }

    /// Inserts a row sealed for adding, refusing a duplicate of an item already here
    /// (`errSecDuplicateItem`, from the writer's primary-key check): the one place every add,
    /// single or bulk, inserts its row.
    func insertSealed(_ row: SealedRow, writer: RowWriter) throws(LockboxError) {
        do throws(LockboxError) {
            try writer.insert(row)
        } catch {
            guard error.code == .duplicateItem, error.message != Self.boundToAnotherDevice.message else { throw error }
            throw duplicate(row.itemClass, cause: error.cause)
        }
    }

    public func items(matching query: Query) throws(LockboxError) -> [Item] {
        try items(matching: query, releasingKeyMaterial: false)
    }

    /// `releasingKeyMaterial` is true only for the key API (``keyMaterial(matching:)``): any other
    /// read of a non-extractable key's value is refused (see ManagedKeyValue.swift).
    func items(matching query: Query, releasingKeyMaterial: Bool) throws(LockboxError) -> [Item] {
        try listing(matching: query, releasingKeyMaterial: releasingKeyMaterial).items
    }

    /// ``items(matching:)``, and how many candidates it left out because their class is locked
    /// (with `limit: .all`): a listing that shows what it can (`dump`, `ssh-agent list`) says
    /// what it could not, rather than pass for the whole keychain.
    /// - Throws: as ``items(matching:)``: `interactionNotAllowed` when nothing could be shown
    ///   and a locked candidate was left out.
    ///   With `showingLockedOnly`, a query whose every candidate is locked answers no item and
    ///   their count instead.
    package func listing(matching query: Query, showingLockedOnly: Bool = false) throws(LockboxError) -> (items: [Item], locked: Int) {
        try listing(matching: query, releasingKeyMaterial: false, showingLockedOnly: showingLockedOnly)
    }

    private func listing(
        matching query: Query, releasingKeyMaterial: Bool, showingLockedOnly: Bool = false
    ) throws(LockboxError) -> (items: [Item], locked: Int) {
        try withStateVerifyingUser { state throws(LockboxError) in
            // One snapshot for the integrity state and the rows.
            try state.database.readTransaction { () throws(LockboxError) -> (items: [Item], locked: Int) in
                _ = try currentIntegrity(state)
                let plan = try plan(for: query, readingData: query.returning.contains(.data), state: state)
                let rows = try verifyIntegrity(of: try candidates(plan, state: state), plan: plan, state: state)
                var results: [Item] = []
                var locked = 0
                // A read of the value alone by a name or a full primary key (`data(matching:)`)
                // does not decode the attributes: the value's and its key's associated data bind
                // the row's digests and plain columns, so opening them proves the row is the one
                // the digest names, as comparing the attributes would. The attributes are still
                // authenticated, so an edited column is an error, not ignored: from row format 3
                // by the value's own open, which binds their digest.
                let valueOnly = query.returning.contains(.data) && !query.returning.contains(.attributes)
                    && plan.residual.isEmpty && !plan.shape.isDisjoint(with: [.lookupDigest, .nameDigest])
                for row in rows {
                    var item = Item(query.itemClass, attributes: ItemAttributes())
                    guard let classKey = try state.keys.classKey(for: row.accessibility, header: state.header) else {
                        locked += 1
                        continue
                    }
                    let prefix = row.associatedDataPrefix(vaultID: state.header.vaultID)
                    if valueOnly && row.bindsDigests {
                        guard row.itemClass == plan.itemClass else { throw LockboxError.integrity() }
                        // An access-controlled row's attributes are checked before the user is asked.
                        if !(row.bindsAttributesToValue && row.sealsValueWithClassKey) {
                            try row.authenticateAttributes(classKey: classKey, prefix: prefix)
                        }
                    } else {
                        guard let opened = try openMatching(row, plan: plan, classKey: classKey, prefix: prefix) else { continue }
                        if query.returning.contains(.attributes) { item.attributes = opened }
                    }
                    // Only the value needs the item key, and so, for an access-controlled item, the user.
                    if query.returning.contains(.data) {
                        let valueKey = try valueKey(of: row, classKey: classKey, prefix: prefix, query: query, action: "read", state: state)
                        item.data = try row.openData(valueKey: valueKey, prefix: prefix)
                        if row.itemClass == .key && !releasingKeyMaterial, let data = item.data, ManagedKeyValue.isNonExtractable(data) {
                            throw ManagedKeyValue.refusal
                        }
                    }
                    item.persistentReference = Data(row.id)
                    if !row.accessControl.isEmpty { item.accessControl = AccessControl(parsing: row.accessControl) }
                    results.append(item)
                    if query.limit == .one { break }
                }
                if results.isEmpty {
                    if showingLockedOnly && locked > 0 { return ([], locked) }
                    throw try noMatch(lockedCandidate: locked > 0, plan: plan, state: state)
                }
                return (results, locked)
            }
        }
    }

    public func update(matching query: Query, to update: ItemUpdate) throws(LockboxError) {
        if let data = update.data { try checkSizes(data: data, encodedAttributes: nil) }
        if update.attributes.accessGroup != nil {
            _ = try resolvedGroupForWriting(update.attributes.accessGroup)
        }
        try withStateVerifyingUser { state throws(LockboxError) in
            try writeRows(state) { writer throws(LockboxError) in
                try updateRows(matching: query, to: update, writer: writer, state: state)
            }
            // The replaced values must not linger in the write-ahead log.
            state.database.truncateWriteAheadLog()
        }
    }

    /// `update(matching:to:)` inside a write transaction already open; with `replacingAttributes`,
    /// the rows' attributes become exactly `update`'s (the dates aside), as a
    /// ``SyncedChange/replace(reference:with:)`` writes them; `sizeLimit` instead of this store's
    /// limit (a change sync applies).
    func updateRows(
        matching query: Query, to update: ItemUpdate, replacingAttributes: Bool = false, sizeLimit: Int? = nil, writer: RowWriter,
        state: State, modifiedAt: Date? = nil
    ) throws(LockboxError) {
        var query = query
        query.limit = .all
        let plan = try plan(for: query, readingData: true, state: state)
        let rows = try verifyIntegrity(of: try candidates(plan, state: state), plan: plan, state: state)
        var matched = 0
        var lockedCandidate = false
        for row in rows {
            guard let classKey = try state.keys.classKey(for: row.accessibility, header: state.header) else {
                lockedCandidate = true
                continue
            }
            let prefix = row.associatedDataPrefix(vaultID: state.header.vaultID)
            guard var attributes = try openMatching(row, plan: plan, classKey: classKey, prefix: prefix) else { continue }
            try Self.checkSynchronizable(update.attributes, hasAccessControl: !row.accessControl.isEmpty)
            let valueKey = try valueKey(of: row, classKey: classKey, prefix: prefix, query: query, action: "update", state: state)
            let data: SecretBytes
            if let replacement = update.data {
                data = replacement
            } else {
                data = try row.openData(valueKey: valueKey, prefix: prefix)
            }
            if replacingAttributes {
                attributes.replace(with: update.attributes)
                // What the store sets on an add, set again: the group resolved (and checked
                // against this store's groups) as an add resolves it, the default class and
                // sync flag when the replacement names none.
                attributes.accessGroup = try resolvedGroupForWriting(attributes.accessGroup)
                attributes.accessibility = attributes.accessibility ?? .default
                attributes.synchronizable = attributes.synchronizable ?? false
            } else {
                attributes.apply(update.attributes)
            }
            attributes.creationDate = attributes.creationDate ?? currentDate()
            attributes.modificationDate = modifiedAt ?? currentDate()
            let encoded = attributes.encoded()
            // The value is checked only when it is replaced: an item that sync brought, larger
            // than this store takes of its own, can still be renamed or made not to sync.
            try checkSizes(data: update.data == nil ? .empty : data, encodedAttributes: encoded, limit: sizeLimit)
            // A new accessibility means a new class key: the item key is rewrapped.
            let keys = try keysForWriting(query.itemClass, attributes.accessibility ?? .default, state: state)
            let sealed = SealedRow.seal(
                id: row.id, itemClass: query.itemClass, attributes: attributes, encodedAttributes: encoded, data: data,
                classKey: keys.classKey, indexKey: keys.indexKey, vaultID: state.header.vaultID,
                deviceID: state.device.identifier, accessControl: AccessControl(parsing: row.accessControl),
                presencePublicKey: state.header.presencePublicKey, version: writer.generation)
            do throws(LockboxError) {
                try writer.replace(row, with: sealed)
            } catch {
                guard error.code == .duplicateItem, error.message != Self.boundToAnotherDevice.message else { throw error }
                throw duplicate(query.itemClass, cause: error.cause)
            }
            matched += 1
        }
        if matched == 0 {
            throw try noMatch(lockedCandidate: lockedCandidate, plan: plan, state: state)
        }
    }

    /// Deletes the matching items. The rule is the one reads follow: every candidate's attributes
    /// are opened and checked against the query, so a locked keychain deletes nothing and answers
    /// `errSecInteractionNotAllowed`, never deleting what it cannot read. Access control does not
    /// apply to deleting (as on iOS).
    @discardableResult
    public func delete(matching query: Query) throws(LockboxError) -> Int {
        try delete(matching: query, recordingDeletionAt: nil)
    }

    /// ``delete(matching:)``, recording a synchronizable row's deletion with `madeAt` (a delete
    /// another device made, applied here by sync) instead of now.
    @discardableResult
    package func delete(matching query: Query, recordingDeletionAt madeAt: Date?) throws(LockboxError) -> Int {
        try withState { state throws(LockboxError) -> Int in
            let count = try writeRows(state) { writer throws(LockboxError) -> Int in
                writer.deletionTime = madeAt
                return try deleteRows(matching: query, writer: writer, state: state)
            }
            // Deleted values must not linger in the write-ahead log.
            state.database.truncateWriteAheadLog()
            return count
        }
    }

    /// `delete(matching:)` inside a write transaction already open.
    func deleteRows(matching query: Query, writer: RowWriter, state: State) throws(LockboxError) -> Int {
        var query = query
        query.limit = .all
        let plan = try plan(for: query, readingData: false, state: state)
        let rows = try verifyIntegrity(of: try candidates(plan, state: state), plan: plan, state: state)
        var doomed: [SealedRow] = []
        for row in rows {
            guard let classKey = try state.keys.classKey(for: row.accessibility, header: state.header) else {
                throw lockedError()
            }
            let prefix = row.associatedDataPrefix(vaultID: state.header.vaultID)
            guard try openMatching(row, plan: plan, classKey: classKey, prefix: prefix) != nil else { continue }
            // An access-controlled item is deleted without asking the user, as on iOS
            // (Apple's access-control evaluation allows the delete operation): deleting
            // reveals nothing, and the class key already proved the keychain unlocked.
            doomed.append(row)
        }
        if doomed.isEmpty {
            throw try noMatch(lockedCandidate: false, plan: plan, state: state)
        }
        for row in doomed { try writer.delete(row) }
        return doomed.count
    }

    // MARK: Integrity on every read

    /// Checks the integrity buckets a query depends on: the bucket its lookup digest names
    /// (so a deleted row is noticed even when nothing is found), the buckets of every row found,
    /// and every bucket for a query that scans its class.
    func verifyIntegrity(of rows: [SealedRow], plan: QueryPlan, state: State) throws(LockboxError) -> [SealedRow] {
        // A row whose bucket column disagrees with its digest was moved out of the count. (A
        // file of the first format has no bucket column until its upgrade.)
        let counted = try currentIntegrity(state).state != nil
        guard !counted || rows.allSatisfy(\.isInItsBucket) else { throw Self.rowOutsideCount }
        try verifyBuckets(of: rows, plan: plan, state: state)
        let admitted = rows.filter { admits($0, plan, state: state) }
        if admitted.isEmpty && !plan.shape.contains(.lookupDigest) && plan.isSelective {
            // Nothing found by a name or a reference: the row may have been deleted or its
            // digest edited, and no bucket is known for it. Every bucket is checked (once per
            // state of the file) before answering "not found".
            try verifyAllBuckets(state: state)
        }
        return admitted
    }

    /// The error for a row whose `bucket` column disagrees with its digest.
    static let rowOutsideCount = LockboxError(
        .decode,
        "The keychain file holds a row outside Lockbox's integrity record (moved or replayed from an older copy). "
            + "Nothing was read. Check it with `lockbox verify`; restore it from a backup.")

    /// Whether a verified row meets the conditions a selective plan left out of its SQL.
    func admits(_ row: SealedRow, _ plan: QueryPlan, state: State) -> Bool {
        guard !plan.shape.contains(.nothing) else { return false }
        let synchronizable: Query.SynchronizableMatch =
            plan.shape.contains(.onlyNotSynchronizable) ? .notSynchronizable : plan.shape.contains(.onlySynchronizable) ? .synchronizable : .any
        guard admits(row, itemClass: plan.itemClass, group: plan.group, accessibility: plan.accessibility,
                     synchronizable: synchronizable, state: state)
        else { return false }
        if plan.shape.contains(.alwaysOnly) && row.accessibility.availability != .always { return false }
        return true
    }

    /// Whether a verified row is of the class, this machine's or portable, in the group asked
    /// for (or one this store may see), of the accessibility asked for, with the sync flag the
    /// query matches.
    func admits(
        _ row: SealedRow, itemClass: ItemClass, group: String?, accessibility: Accessibility?,
        synchronizable: Query.SynchronizableMatch, state: State
    ) -> Bool {
        guard row.itemClass == itemClass, row.deviceID.isEmpty || row.deviceID == state.device.identifier else { return false }
        if let group, row.accessGroup != group { return false }
        if group == nil, let groups = configuration.accessGroups, !groups.contains(row.accessGroup) { return false }
        if let accessibility, row.accessibility != accessibility { return false }
        return synchronizable.matches(row.synchronizable)
    }

    private func verifyBuckets(of rows: [SealedRow], plan: QueryPlan, state: State) throws(LockboxError) {
        if plan.shape.contains(.lookupDigest) || plan.shape.contains(.nameDigest) {
            var buckets = Set(rows.map(\.bucket))
            if let digest = plan.lookupDigest { buckets.insert(SealedRow.bucket(ofLookupDigest: digest)) }
            try verifyBuckets(buckets, state: state)
        } else if plan.shape.contains(.persistentReference) && !rows.isEmpty {
            try verifyBuckets(Set(rows.map(\.bucket)), state: state)
        } else {
            try verifyAllBuckets(state: state)
        }
    }

    /// Opens a candidate's attributes and compares them with the query. The attributes its
    /// digest stood for must match, or the row is not what its columns claim (`errSecDecode`);
    /// the rest decide whether it matches. Nil when it does not.
    func openMatching(_ row: SealedRow, plan: QueryPlan, classKey: SecretBytes, prefix: FieldEncoder) throws(LockboxError) -> ItemAttributes? {
        guard row.itemClass == plan.itemClass else { throw LockboxError.integrity() }
        let opened = try row.openAttributes(classKey: classKey, prefix: prefix)
        guard plan.covered.matches(opened) else { throw LockboxError.integrity() }
        return plan.residual.matches(opened) ? opened : nil
    }

    // MARK: Opening rows

    /// The key `row`'s value is sealed under. Access-controlled rows first ask the user
    /// (through the query's authentication context): the verification yields the key that
    /// opens the row, it is not a flag.
    func valueKey(
        of row: SealedRow, classKey: SecretBytes, prefix: FieldEncoder, query: Query, action: String, state: State
    ) throws(LockboxError) -> SecretBytes {
        var presence: (publicKey: [UInt8], secretKey: SecretBytes)?
        if !row.accessControl.isEmpty {
            presence = try presenceKeys(for: row, query: query, action: action, state: state)
        }
        return try row.openValueKey(classKey: classKey, prefix: prefix, presence: presence)
    }

    private func presenceKeys(
        for row: SealedRow, query: Query, action: String, state: State
    ) throws(LockboxError) -> (publicKey: [UInt8], secretKey: SecretBytes) {
        guard let control = AccessControl(parsing: row.accessControl) else { throw LockboxError.integrity() }
        guard control.isSatisfiableByPassphrase else {
            throw LockboxError(
                .authFailed,
                "This item requires biometry (\(control)); this machine has no biometric hardware the keychain can trust.")
        }
        guard let publicKey = state.header.presencePublicKey else {
            throw LockboxError(.authFailed, "This keychain has no passphrase to verify the user with.")
        }
        let context = query.authenticationContext ?? configuration.authenticationContext
        let realm = state.header.vaultID.hexString
        if let proof = context?.rememberedProof(realm: realm) {
            return (publicKey, proof)
        }
        if let given = state.presenceProof, given.realm == realm {
            return (publicKey, given.secretKey)
        }
        guard let context, !context.interactionNotAllowed, let verifier = context.verifier else {
            throw LockboxError(
                .interactionNotAllowed,
                "This item needs the user's passphrase (access control \(control)) and no interaction is allowed here. "
                    + "Give the query an AuthenticationContext with a verifier.")
        }
        // The user is asked outside the vault's lock and transaction (see
        // `withStateVerifyingUser`): this attempt of the operation ends here, changing nothing,
        // and runs again with the proof.
        let name = query.attributes.service ?? query.attributes.server ?? query.itemClass.rawValue
        state.presenceRequest = PresenceRequest(
            context: context, verifier: verifier, realm: realm,
            request: AuthenticationRequest(reason: context.reason ?? "\(action) the keychain item \(name)", accessControl: control))
        throw LockboxError(.interactionNotAllowed, "This item needs the user's passphrase (access control \(control)).")
    }

    /// A question for the user that an operation could not ask while holding the vault's lock.
    struct PresenceRequest {
        let context: AuthenticationContext
        let verifier: any PresenceVerifier
        let realm: String
        let request: AuthenticationRequest
    }

    /// A verified presence key, given to one run of an operation.
    struct PresenceProof {
        let realm: String
        let secretKey: SecretBytes
    }

    /// Runs `body` under the vault's lock; when it stops to ask the user for an
    /// access-controlled item, asks (and derives the proof with Argon2id) outside the lock,
    /// where a `lock()` or another read from another thread does not wait behind the prompt,
    /// then runs `body` again with the proof. A wrong passphrase is counted by the shared
    /// attempt throttle and ends the operation.
    func withStateVerifyingUser<T>(_ body: (State) throws(LockboxError) -> sending T) throws(LockboxError) -> sending T {
        var proof: PresenceProof?
        for _ in 0..<3 {
            let request: PresenceRequest
            do throws(LockboxError) {
                return try withState { state throws(LockboxError) -> sending T in
                    state.presenceProof = proof
                    state.presenceRequest = nil
                    defer { state.presenceProof = nil }
                    return try body(state)
                }
            } catch {
                let pending = withState { state -> PresenceRequest? in
                    defer { state.presenceRequest = nil }
                    return state.presenceRequest
                }
                guard let pending else { throw error }
                request = pending
            }
            let passphrase = try request.verifier.passphrase(for: request.request)
            let verified = try checkPassphrase(passphrase, failure: "User verification failed: the passphrase is wrong")
            guard let secretKey = verified.presence else {
                throw LockboxError(.authFailed, "User verification failed: the passphrase is wrong.")
            }
            request.context.remember(secretKey, realm: request.realm)
            proof = PresenceProof(realm: request.realm, secretKey: secretKey)
        }
        throw LockboxError(
            .authFailed, "User verification did not open the item: the keychain's passphrase changed meanwhile. Try again.")
    }

    /// The error for a query that matched nothing: "locked" whenever a locked item could have
    /// matched, "not found" only when nothing could.
    private func noMatch(lockedCandidate: Bool, plan: QueryPlan, state: State) throws(LockboxError) -> LockboxError {
        if lockedCandidate { return lockedError() }
        if plan.shape.contains(.alwaysOnly) {
            // Before the first unlock only `always` items could be searched.
            let others = try state.database.statement(
                "SELECT 1 FROM items WHERE item_class = ? AND accessibility NOT IN ('always', 'alwaysThisDeviceOnly') LIMIT 1")
            others.bind(1, plan.itemClass.rawValue)
            if try others.step() { return lockedError() }
        }
        return notFound()
    }

    // MARK: Planning

    /// How a query finds its candidates: which digest narrows the rows, and which attributes
    /// remain to be checked on the opened metadata.
    struct QueryPlan {
        var sql: String
        var arguments: [Argument]
        /// Attributes still to compare after decryption.
        var residual: AttributePredicate
        /// Attributes the digest stood for: an opened row must carry exactly these.
        var covered: AttributePredicate { AttributePredicate(coveredAttributes, among: coveredFields) }
        var coveredAttributes: ItemAttributes
        var coveredFields: [AttributeField]
        /// The lookup digest searched for, when the query names a full primary key.
        var lookupDigest: [UInt8]?
        /// The access group asked for, when one.
        var group: String?
        /// The accessibility asked for, when one.
        var accessibility: Accessibility?

        /// Selects by a digest or a reference alone (the other conditions apply in ``admits``).
        var isSelective: Bool {
            !shape.isDisjoint(with: [.lookupDigest, .nameDigest, .persistentReference])
        }
        /// True when `residual` is not empty: candidates must be decrypted to match.
        var needsMetadata: Bool
        /// True when the metadata column is read (to match or to return attributes).
        var readsMetadata: Bool
        var itemClass: ItemClass
        var shape: PlanShape

        enum Argument {
            case text(String)
            case blob([UInt8])
        }
    }

    /// The parts of a plan's SQL, as bits: the SQL text depends on nothing else, so it is
    /// built once per shape and cached.
    struct PlanShape: OptionSet, Hashable {
        let rawValue: Int
        static let persistentReference = PlanShape(rawValue: 1 << 0)
        static let lookupDigest = PlanShape(rawValue: 1 << 1)
        static let nameDigest = PlanShape(rawValue: 1 << 2)
        static let groupEquals = PlanShape(rawValue: 1 << 3)
        static let groupIn = PlanShape(rawValue: 1 << 4)
        static let accessibility = PlanShape(rawValue: 1 << 5)
        static let onlyNotSynchronizable = PlanShape(rawValue: 1 << 6)
        static let onlySynchronizable = PlanShape(rawValue: 1 << 7)
        static let metadataColumn = PlanShape(rawValue: 1 << 8)
        static let secretColumn = PlanShape(rawValue: 1 << 9)
        static let nothing = PlanShape(rawValue: 1 << 10)
        static let alwaysOnly = PlanShape(rawValue: 1 << 11)
    }

    func plan(for query: Query, readingData: Bool, state: State) throws(LockboxError) -> QueryPlan {
        var shape: PlanShape = []
        var arguments: [QueryPlan.Argument] = [.text(query.itemClass.rawValue), .text(state.device.identifier)]
        var residual = query.attributes
        residual.synchronizable = nil
        var covered = ItemAttributes()
        var coveredFields: [AttributeField] = []
        var lookupDigest: [UInt8]?
        var selectedGroup: String?

        // A plan that selects by a digest or a reference selects by that alone; every other
        // condition is applied after the rows found were checked against the integrity record,
        // so an edited column cannot hide a row (the read would say "not found").
        var selective: QueryPlan.Argument?
        if let reference = query.persistentReference {
            shape.insert(.persistentReference)
            arguments.append(.blob(Array(reference)))
            selective = .blob(Array(reference))
        }
        let complete = PrimaryKey.isComplete(query.itemClass, residual)
        let name = complete ? nil : PrimaryKey.encodeName(query.itemClass, residual)
        let indexKey = complete || name != nil ? try state.keys.indexKey(for: query.itemClass) : nil
        if (complete || name != nil) && indexKey == nil {
            // Before the first unlock there is no lookup index: only `always` items, whose keys
            // need no unlock, can be searched, by their sealed attributes.
            shape.insert(.alwaysOnly)
        } else if let indexKey, complete {
            shape.insert(.lookupDigest)
            let digest = Crypto.keyedDigest(PrimaryKey.encode(query.itemClass, residual, includingGroup: false), key: indexKey)
            arguments.append(.blob(digest))
            if selective == nil { selective = .blob(digest) }
            lookupDigest = digest
            covered = residual.primaryKeyOnly(of: query.itemClass)
            coveredFields = ItemAttributes.primaryKeyFields(of: query.itemClass)
            residual.clearPrimaryKey(of: query.itemClass)
        } else if let indexKey, let name {
            shape.insert(.nameDigest)
            let digest = Crypto.keyedDigest(name, key: indexKey)
            arguments.append(.blob(digest))
            if selective == nil { selective = .blob(digest) }
            covered = residual.nameOnly(of: query.itemClass)
            coveredFields = [ItemAttributes.nameField(of: query.itemClass)]
            residual.clearName(of: query.itemClass)
        }
        if let group = residual.accessGroup {
            if isVisible(group) {
                shape.insert(.groupEquals)
                arguments.append(.text(group))
                selectedGroup = group
            } else {
                // Another group's items behave exactly as absent ones.
                shape.insert(.nothing)
            }
            residual.accessGroup = nil
        } else if let groups = configuration.accessGroups {
            shape.insert(.groupIn)
            arguments.append(contentsOf: groups.map { .text($0) })
        }
        let wantedAccessibility = residual.accessibility
        if let accessibility = residual.accessibility {
            shape.insert(.accessibility)
            arguments.append(.text(accessibility.rawValue))
            residual.accessibility = nil
        }
        if let selective { arguments = [selective] }
        switch query.synchronizable {
        case .notSynchronizable: shape.insert(.onlyNotSynchronizable)
        case .synchronizable: shape.insert(.onlySynchronizable)
        case .any: break
        }
        let residualPredicate = AttributePredicate(residual)
        let needsMetadata = !residualPredicate.isEmpty
        // Every row read is opened and checked against the query.
        shape.insert(.metadataColumn)
        if readingData { shape.insert(.secretColumn) }
        let sql: String
        if let cached = state.sqlByShape[shape] {
            sql = cached
        } else {
            sql = Self.select(shape, groupCount: configuration.accessGroups?.count ?? 0)
            state.sqlByShape[shape] = sql
        }
        return QueryPlan(
            sql: sql, arguments: arguments, residual: residualPredicate, coveredAttributes: covered, coveredFields: coveredFields,
            lookupDigest: lookupDigest,
            group: selectedGroup, accessibility: wantedAccessibility, needsMetadata: needsMetadata,
            readsMetadata: shape.contains(.metadataColumn), itemClass: query.itemClass, shape: shape)
    }

    private static func select(_ shape: PlanShape, groupCount: Int) -> String {
        let columns = SealedRow.columns(metadata: shape.contains(.metadataColumn), secret: shape.contains(.secretColumn))
        if shape.contains(.persistentReference) {
            return "SELECT \(columns) FROM items WHERE id = ? ORDER BY rowid"
        }
        if shape.contains(.lookupDigest) {
            return "SELECT \(columns) FROM items WHERE lookup_digest = ? ORDER BY rowid"
        }
        if shape.contains(.nameDigest) {
            return "SELECT \(columns) FROM items WHERE name_digest = ? ORDER BY rowid"
        }
        // A scan: every bucket is verified, so filtering in SQL hides nothing.
        // Items bound to another machine (a copied vault file) are invisible here.
        var conditions = ["item_class = ?", "device_id IN ('', ?)"]
        if shape.contains(.alwaysOnly) { conditions.append("accessibility IN ('always', 'alwaysThisDeviceOnly')") }
        if shape.contains(.persistentReference) { conditions.append("id = ?") }
        if shape.contains(.lookupDigest) { conditions.append("lookup_digest = ?") }
        if shape.contains(.nameDigest) { conditions.append("name_digest = ?") }
        if shape.contains(.groupEquals) { conditions.append("access_group = ?") }
        if shape.contains(.groupIn) {
            conditions.append("access_group IN (" + Array(repeating: "?", count: groupCount).joined(separator: ", ") + ")")
        }
        if shape.contains(.accessibility) { conditions.append("accessibility = ?") }
        if shape.contains(.onlyNotSynchronizable) { conditions.append("synchronizable = 0") }
        if shape.contains(.onlySynchronizable) { conditions.append("synchronizable = 1") }
        if shape.contains(.nothing) { conditions.append("0") }
        return "SELECT \(columns) FROM items WHERE "
            + conditions.joined(separator: " AND ") + " ORDER BY rowid"
    }

    func candidates(_ plan: QueryPlan, state: State) throws(LockboxError) -> [SealedRow] {
        // Statements are reset at the end of every operation, so a cached one is ready.
        let statement: Statement
        if let cached = state.statementByShape[plan.shape] {
            statement = cached
        } else {
            statement = try state.database.statement(plan.sql)
            state.statementByShape[plan.shape] = statement
        }
        for (offset, argument) in plan.arguments.enumerated() {
            let index = Int32(offset + 1)
            switch argument {
            case .text(let value): statement.bind(index, value)
            case .blob(let value): statement.bind(index, value)
            }
        }
        var rows: [SealedRow] = []
        while try statement.step() {
            rows.append(try SealedRow.read(from: statement))
        }
        return rows
    }

    // MARK: Writing

    func keysForWriting(
        _ itemClass: ItemClass, _ accessibility: Accessibility, state: State
    ) throws(LockboxError) -> (classKey: SecretBytes, indexKey: SecretBytes) {
        if accessibility == .whenPasscodeSetThisDeviceOnly && !state.header.hasPassphrase {
            throw LockboxError(
                .notAvailable,
                "whenPasscodeSetThisDeviceOnly items need a passphrase, and this keychain has none. "
                    + "Set one with `lockbox set-passphrase`.")
        }
        guard let classKey = try state.keys.classKey(for: accessibility, header: state.header),
            let indexKey = try state.keys.indexKey(for: itemClass)
        else {
            throw lockedError()
        }
        return (classKey, indexKey)
    }

    // MARK: Rules and messages

    private func resolvedGroupForWriting(_ group: String?) throws(LockboxError) -> String {
        let resolved = group ?? configuration.accessGroups?.first ?? Self.defaultAccessGroup
        if group != nil && !isVisible(resolved) {
            throw LockboxError(
                .missingEntitlement,
                "This store was opened for the access groups \(configuration.accessGroups ?? []); "
                    + "it cannot write to the group \(resolved).")
        }
        // Checked here too (the writer checks every row) so that an update fails before it
        // asks the user anything.
        try RowWriter.checkStorable(accessGroup: resolved)
        return resolved
    }

    private func isVisible(_ group: String) -> Bool {
        configuration.accessGroups.map { $0.contains(group) } ?? true
    }

    /// `encodedAttributes`: the attributes as sealed (`encoded()`), or nil when they are not
    /// being written.
    /// The largest value, and encoded attributes, an item that sync carries may have. An item
    /// another device's store allowed is applied here up to this size, whatever this store's
    /// own limit (``Configuration/maximumValueSize``, which is for what is written here): a
    /// group's devices hold the same items. Sync refuses to send a larger one.
    package static let syncedItemSizeLimit = 16 << 20

    /// Checks a value and encoded attributes against `limit`, or this store's limit.
    private func checkSizes(data: SecretBytes, encodedAttributes: [UInt8]?, limit: Int? = nil) throws(LockboxError) {
        let whose = limit == nil ? "this store's limit" : "sync's limit"
        let limit = limit ?? configuration.maximumValueSize
        guard data.count <= limit else {
            throw LockboxError(
                .param,
                "The value is \(data.count) bytes, over \(whose) of \(limit) bytes. "
                    + "Keep large data in a file encrypted with a key stored here.")
        }
        if let encodedAttributes, encodedAttributes.count > limit {
            throw LockboxError(.param, "The item's attributes are over \(whose) of \(limit) bytes.")
        }
    }

    func lockedError() -> LockboxError {
        LockboxError.locked("Unlock it with `lockbox unlock` (or `unlock(passphrase:)`) and try again.")
    }

    private func notFound() -> LockboxError {
        LockboxError(.itemNotFound, "No item matches the query in the keychain.")
    }

    /// A duplicate of an item bound to another machine's device key, which this process can
    /// neither see nor change.
    static let boundToAnotherDevice = LockboxError(
        .duplicateItem,
        "An item of the same name is already in this keychain, bound to another device key (ThisDeviceOnly): that of the "
            + "machine the keychain was copied from, or of a process that used another device key file (\(KeyCache.deviceKeyHint)). "
            + "This process cannot read, update or delete it. Run Lockbox with that environment, or give the new item another name.")

    func duplicate(_ itemClass: ItemClass, cause: LockboxError.Cause?) -> LockboxError {
        let key =
            switch itemClass {
            case .genericPassword: "service and account"
            case .internetPassword: "server, protocol, port, path, account, authentication type and security domain"
            case .key: "key class, type, size, application label and tag"
            case .certificate: "certificate type, issuer and serial number"
            }
        return LockboxError(
            .duplicateItem,
            "An item with the same \(key) already exists in this access group. Update it instead (`-U` on the command line).",
            cause: cause)
    }
}

extension ItemAttributes {
    /// Clears the attributes a primary-key digest already matched.
    mutating func clearPrimaryKey(of itemClass: ItemClass) {
        for field in Self.primaryKeyFields(of: itemClass) {
            field.set(nil, in: &self)
        }
    }

    /// Only the attributes of `itemClass`'s primary key (what a lookup digest stands for).
    func primaryKeyOnly(of itemClass: ItemClass) -> ItemAttributes {
        var kept = ItemAttributes()
        for field in Self.primaryKeyFields(of: itemClass) {
            field.copy(from: self, to: &kept)
        }
        return kept
    }

    /// Only the attribute a name digest stands for.
    func nameOnly(of itemClass: ItemClass) -> ItemAttributes {
        var kept = ItemAttributes()
        Self.nameField(of: itemClass).copy(from: self, to: &kept)
        return kept
    }

    /// Clears the attribute a name digest already matched.
    mutating func clearName(of itemClass: ItemClass) {
        Self.nameField(of: itemClass).set(nil, in: &self)
    }
}

extension Vault {
    /// Now, for creation and modification dates: the configuration's clock.
    func currentDate() -> Date {
        Date(timeIntervalSince1970: configuration.clock.sinceEpoch().secondsValue)
    }

    /// ``currentDate()`` for the packages that date what they write into the vault (sync).
    package var now: Date { currentDate() }

    /// A new row's identifier as a write of `generation` makes it, for the benchmarks that
    /// store rows of the vault's shape.
    package static func newRowIdentifier(generation: Int) -> [UInt8] { SealedRow.newIdentifier(generation: generation) }
}
