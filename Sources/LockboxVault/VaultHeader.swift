import LockboxCore
import VaultCrypto
import VaultStorage

/// The authenticated part of a vault file: its identity, the key slots that wrap the master
/// key, and the class keys.
///
/// Everything here is covered by a MAC keyed from the master key, checked at every unlock,
/// so an edit to any field (weaker Argon2id parameters, a swapped class key, another vault's
/// identity) is detected as soon as the vault is opened.
struct VaultHeader: Sendable {
    static let format = "lockbox-vault"

    var vaultID: [UInt8]
    /// 1: the first release's header; 2: the index root is a wrapped key of its own (so the
    /// master key can rotate without changing every lookup digest), the `always` class keys
    /// are wrapped by the master key and by each machine's device key instead of the vault's
    /// identity, and earlier master keys are kept for other machines' class keys.
    var version: Int = 2
    var slots: [KeySlot]
    var wrappedClassKeys: SmallMap<ClassKeyID, [UInt8]>
    /// The public half of the presence key pair: access-controlled items are sealed to it,
    /// and only a passphrase re-entry releases the secret half. Nil without a passphrase.
    var presencePublicKey: [UInt8]?
    /// Version 2: the lookup-index root, sealed with the master key.
    var wrappedIndexRoot: [UInt8]?
    /// Version 2: earlier master keys, sealed with the current one, kept only while another
    /// machine's `*ThisDeviceOnly` class keys are still wrapped by them (that machine rewraps
    /// them at its next unlock).
    var previousMasters: [[UInt8]] = []
    var mac: [UInt8]

    /// A class key's place: portable classes have one (device ""), `*ThisDeviceOnly` classes
    /// one per machine that has unlocked the vault.
    struct ClassKeyID: Equatable, Comparable, Sendable {
        var accessibility: Accessibility
        var device: String

        static func < (left: ClassKeyID, right: ClassKeyID) -> Bool {
            let leftIndex = Accessibility.allCases.firstIndex(of: left.accessibility)!
            let rightIndex = Accessibility.allCases.firstIndex(of: right.accessibility)!
            return leftIndex != rightIndex ? leftIndex < rightIndex : left.device < right.device
        }
    }

    struct KeySlot: Sendable {
        enum Kind: String, Sendable {
            /// Argon2id of a passphrase. Also wraps the presence key for access control.
            case passphrase
            /// No passphrase: the device secret alone (like an iPhone without a passcode).
            case device
            /// A key kept outside the file (the desktop keyring); `parameters` names the keeper.
            case external
        }

        var id: Int
        var kind: Kind
        var parameters: [UInt8]
        var wrappedMasterKey: [UInt8]
        var wrappedPresenceKey: [UInt8]?
    }

    var hasPassphrase: Bool { slots.contains { $0.kind == .passphrase } }

    // MARK: Associated data

    func slotAssociatedData(_ slot: KeySlot, purpose: String = "master") -> [UInt8] {
        // The vault identity is left out on purpose: it is covered by the header MAC, so an
        // edited identity reads as tampering (errSecDecode), not as a wrong passphrase.
        var encoder = FieldEncoder()
        encoder.string("lockbox.slot.v1")
        encoder.integer(slot.id)
        encoder.string(slot.kind.rawValue)
        encoder.bytes(slot.parameters)
        encoder.string(purpose)
        return encoder.bytes
    }

    func classKeyAssociatedData(_ id: ClassKeyID) -> [UInt8] {
        var encoder = FieldEncoder()
        encoder.string("lockbox.class-key.v1")
        encoder.bytes(vaultID)
        encoder.string(id.accessibility.rawValue)
        encoder.string(id.device)
        return encoder.bytes
    }

    /// The bytes the header MAC covers, in a canonical order.
    func authenticatedBytes() -> [UInt8] {
        var encoder = FieldEncoder()
        encoder.string(Self.format)
        encoder.integer(version)
        encoder.bytes(vaultID)
        for slot in slots.sorted(by: { $0.id < $1.id }) {
            encoder.integer(slot.id)
            encoder.string(slot.kind.rawValue)
            encoder.bytes(slot.parameters)
            encoder.bytes(slot.wrappedMasterKey)
            encoder.bytes(slot.wrappedPresenceKey)
        }
        encoder.bytes(presencePublicKey)
        encoder.string("class-keys")
        for id in wrappedClassKeys.keys.sorted() {
            encoder.string(id.accessibility.rawValue)
            encoder.string(id.device)
            encoder.bytes(wrappedClassKeys[id])
        }
        if version >= 2 {
            encoder.bytes(wrappedIndexRoot)
            encoder.integer(previousMasters.count)
            for wrapped in previousMasters { encoder.bytes(wrapped) }
        }
        return encoder.bytes
    }

    /// The lookup-index root: sealed in a version-2 header, derived from the master key in a
    /// version-1 one.
    func indexRoot(master: SecretBytes) throws(LockboxError) -> SecretBytes {
        guard version >= 2 else { return Crypto.deriveKey(from: master, context: "lbxindex", identifier: 0) }
        guard let wrappedIndexRoot,
            let root = try? Crypto.open(wrappedIndexRoot, key: master, associatedData: indexRootAssociatedData()),
            root.count == Crypto.keyByteCount
        else { throw LockboxError.integrity("The keychain's index key") }
        return root
    }

    func indexRootAssociatedData() -> [UInt8] {
        var encoder = FieldEncoder()
        encoder.string("lockbox.index-root.v2")
        encoder.bytes(vaultID)
        return encoder.bytes
    }

    func previousMasterAssociatedData() -> [UInt8] {
        var encoder = FieldEncoder()
        encoder.string("lockbox.previous-master.v2")
        encoder.bytes(vaultID)
        return encoder.bytes
    }

    /// The earlier master keys, newest first.
    func openPreviousMasters(master: SecretBytes) throws(LockboxError) -> [SecretBytes] {
        var keys: [SecretBytes] = []
        for wrapped in previousMasters {
            guard let key = try? Crypto.open(wrapped, key: master, associatedData: previousMasterAssociatedData()) else {
                throw LockboxError.integrity("The keychain header")
            }
            keys.append(key)
        }
        return keys
    }

    static func macKey(master: SecretBytes) -> SecretBytes {
        Crypto.deriveKey(from: master, context: "lbxheadr", identifier: 1)
    }

    mutating func seal(master: SecretBytes) {
        mac = Crypto.keyedDigest(authenticatedBytes(), key: Self.macKey(master: master))
    }

    func verify(master: SecretBytes) -> Bool {
        let expected = Crypto.keyedDigest(authenticatedBytes(), key: Self.macKey(master: master))
        guard expected.count == mac.count else { return false }
        return expected.withUnsafeBytes { left in mac.withUnsafeBytes { right in constantTimeEquals(left, right) } }
    }

    // MARK: Storage

    static func load(from database: Database) throws(LockboxError) -> VaultHeader {
        var values: [String: [UInt8]] = [:]
        let rows = try database.statement("SELECT name, value FROM header")
        while try rows.step() {
            if let name = rows.text(0), let value = rows.blob(1) { values[name] = value }
        }
        guard values["format"] == Array(format.utf8), let vaultID = values["vault_id"], vaultID.count == 16,
            let mac = values["mac"]
        else {
            throw LockboxError.integrity("The keychain header in \(database.path)")
        }
        var slots: [KeySlot] = []
        let slotRows = try database.statement(
            "SELECT id, kind, parameters, wrapped_master_key, wrapped_presence_key FROM key_slots ORDER BY id")
        while try slotRows.step() {
            guard let id = slotRows.integer(0), let kindName = slotRows.text(1), let kind = KeySlot.Kind(rawValue: kindName),
                let parameters = slotRows.blob(2), let wrapped = slotRows.blob(3)
            else {
                throw LockboxError.integrity("A key slot in \(database.path)")
            }
            slots.append(
                KeySlot(id: id, kind: kind, parameters: parameters, wrappedMasterKey: wrapped, wrappedPresenceKey: slotRows.blob(4)))
        }
        var classKeys = SmallMap<ClassKeyID, [UInt8]>()
        let classRows = try database.statement("SELECT accessibility, device_id, wrapped_key FROM class_keys")
        while try classRows.step() {
            guard let name = classRows.text(0), let accessibility = Accessibility(rawValue: name),
                let device = classRows.text(1), let wrapped = classRows.blob(2)
            else {
                throw LockboxError.integrity("A class key in \(database.path)")
            }
            classKeys[ClassKeyID(accessibility: accessibility, device: device)] = wrapped
        }
        var version = 1
        if let stored = values["version"] {
            guard stored.count == 1, stored[0] == 2 else { throw LockboxError.integrity("The keychain header in \(database.path)") }
            version = 2
        }
        var previousMasters: [[UInt8]] = []
        if let stored = values["previous_masters"] {
            var decoder = FieldDecoder(stored)
            while !decoder.isAtEnd {
                guard let wrapped = try? decoder.bytes() else { throw LockboxError.integrity("The keychain header in \(database.path)") }
                previousMasters.append(wrapped)
            }
        }
        guard version == 2 || (values["index_root"] == nil && previousMasters.isEmpty) else {
            throw LockboxError.integrity("The keychain header in \(database.path)")
        }
        return VaultHeader(
            vaultID: vaultID, version: version, slots: slots, wrappedClassKeys: classKeys,
            presencePublicKey: values["presence_public_key"], wrappedIndexRoot: values["index_root"],
            previousMasters: previousMasters, mac: mac)
    }

    /// Writes the whole header. Call inside a write transaction.
    func save(to database: Database) throws(LockboxError) {
        try database.execute("DELETE FROM header; DELETE FROM key_slots; DELETE FROM class_keys;")
        var values = [("format", Array(Self.format.utf8)), ("vault_id", vaultID), ("mac", mac)]
        if let presencePublicKey { values.append(("presence_public_key", presencePublicKey)) }
        if version >= 2 { values.append(("version", [UInt8(version)])) }
        if let wrappedIndexRoot { values.append(("index_root", wrappedIndexRoot)) }
        if !previousMasters.isEmpty {
            var encoder = FieldEncoder()
            for wrapped in previousMasters { encoder.bytes(wrapped) }
            values.append(("previous_masters", encoder.bytes))
        }
        for (name, value) in values {
            let statement = try database.statement("INSERT INTO header (name, value) VALUES (?, ?)")
            statement.bind(1, name)
            statement.bind(2, value)
            try statement.run()
        }
        for slot in slots {
            let statement = try database.statement(
                "INSERT INTO key_slots (id, kind, parameters, wrapped_master_key, wrapped_presence_key) VALUES (?, ?, ?, ?, ?)")
            statement.bind(1, slot.id)
            statement.bind(2, slot.kind.rawValue)
            statement.bind(3, slot.parameters)
            statement.bind(4, slot.wrappedMasterKey)
            statement.bind(5, slot.wrappedPresenceKey)
            try statement.run()
        }
        for (id, wrapped) in wrappedClassKeys.entries {
            let statement = try database.statement(
                "INSERT INTO class_keys (accessibility, device_id, wrapped_key) VALUES (?, ?, ?)")
            statement.bind(1, id.accessibility.rawValue)
            statement.bind(2, id.device)
            statement.bind(3, wrapped)
            try statement.run()
        }
    }
}
