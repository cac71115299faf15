import LockboxCore
import VaultCrypto
import VaultStorage

/// The authenticated part of a vault file: its identity, the key slots that wrap the master
/// key, and the class keys wrapped by the master key.
///
/// Everything here is covered by a MAC keyed from the master key, checked at every unlock,
/// so an edit to any field (weaker Argon2id parameters, a swapped class key, another vault's
/// identity) is detected as soon as the vault is opened with a valid passphrase.
struct VaultHeader {
    static let format = "lockbox-vault"

    var vaultID: [UInt8]
    var slots: [KeySlot]
    var wrappedClassKeys: [Accessibility: [UInt8]]
    var mac: [UInt8]

    struct KeySlot {
        enum Kind: String {
            case passphrase
        }

        var id: Int
        var kind: Kind
        var parameters: [UInt8]
        var wrappedMasterKey: [UInt8]
    }

    // MARK: Associated data

    func slotAssociatedData(_ slot: KeySlot) -> [UInt8] {
        var encoder = FieldEncoder()
        // The vault identity is left out on purpose: it is covered by the header MAC, so an
        // edited identity reads as tampering (errSecDecode), not as a wrong passphrase.
        encoder.string("lockbox.slot.v1")
        encoder.integer(slot.id)
        encoder.string(slot.kind.rawValue)
        encoder.bytes(slot.parameters)
        return encoder.bytes
    }

    func classKeyAssociatedData(_ accessibility: Accessibility) -> [UInt8] {
        var encoder = FieldEncoder()
        encoder.string("lockbox.class-key.v1")
        encoder.bytes(vaultID)
        encoder.string(accessibility.rawValue)
        return encoder.bytes
    }

    /// The bytes the header MAC covers, in a canonical order.
    func authenticatedBytes() -> [UInt8] {
        var encoder = FieldEncoder()
        encoder.string(Self.format)
        encoder.integer(VaultSchema.current)
        encoder.bytes(vaultID)
        for slot in slots.sorted(by: { $0.id < $1.id }) {
            encoder.integer(slot.id)
            encoder.string(slot.kind.rawValue)
            encoder.bytes(slot.parameters)
            encoder.bytes(slot.wrappedMasterKey)
        }
        encoder.string("class-keys")
        for accessibility in Accessibility.allCases {
            encoder.string(accessibility.rawValue)
            encoder.bytes(wrappedClassKeys[accessibility])
        }
        return encoder.bytes
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
        let slotRows = try database.statement("SELECT id, kind, parameters, wrapped_master_key FROM key_slots ORDER BY id")
        while try slotRows.step() {
            guard let id = slotRows.integer(0), let kindName = slotRows.text(1), let kind = KeySlot.Kind(rawValue: kindName),
                let parameters = slotRows.blob(2), let wrapped = slotRows.blob(3)
            else {
                throw LockboxError.integrity("A key slot in \(database.path)")
            }
            slots.append(KeySlot(id: id, kind: kind, parameters: parameters, wrappedMasterKey: wrapped))
        }
        var classKeys: [Accessibility: [UInt8]] = [:]
        let classRows = try database.statement("SELECT accessibility, wrapped_key FROM class_keys")
        while try classRows.step() {
            guard let name = classRows.text(0), let accessibility = Accessibility(rawValue: name),
                let wrapped = classRows.blob(1)
            else {
                throw LockboxError.integrity("A class key in \(database.path)")
            }
            classKeys[accessibility] = wrapped
        }
        return VaultHeader(vaultID: vaultID, slots: slots, wrappedClassKeys: classKeys, mac: mac)
    }

    /// Writes the whole header. Call inside a write transaction.
    func save(to database: Database) throws(LockboxError) {
        try database.execute("DELETE FROM header; DELETE FROM key_slots; DELETE FROM class_keys;")
        for (name, value) in [("format", Array(Self.format.utf8)), ("vault_id", vaultID), ("mac", mac)] {
            let statement = try database.statement("INSERT INTO header (name, value) VALUES (?, ?)")
            statement.bind(1, name)
            statement.bind(2, value)
            try statement.run()
        }
        for slot in slots {
            let statement = try database.statement(
                "INSERT INTO key_slots (id, kind, parameters, wrapped_master_key) VALUES (?, ?, ?, ?)")
            statement.bind(1, slot.id)
            statement.bind(2, slot.kind.rawValue)
            statement.bind(3, slot.parameters)
            statement.bind(4, slot.wrappedMasterKey)
            try statement.run()
        }
        for (accessibility, wrapped) in wrappedClassKeys {
            let statement = try database.statement("INSERT INTO class_keys (accessibility, wrapped_key) VALUES (?, ?)")
            statement.bind(1, accessibility.rawValue)
            statement.bind(2, wrapped)
            try statement.run()
        }
    }
}
