import LockboxCore
import VaultCrypto

/// An outside keeper of a key that opens one of the vault's slots: the desktop keyring (the
/// Secret Service), later a TPM. The vault wraps its master key with a random slot key and
/// hands that slot key to the keeper; unlocking asks the keeper for it back.
public protocol ExternalKeyKeeper: Sendable {
    /// The slot kind recorded in the vault header (`secret-service`).
    var slotKind: String { get }
    /// Keeps `key` for the vault `vaultIdentifier`, replacing any earlier one.
    func storeSlotKey(_ key: SecretBytes, vaultIdentifier: String) throws(LockboxError)
    /// The key kept for `vaultIdentifier`. Throws `interactionNotAllowed` when the keeper is
    /// locked and `notAvailable` when it cannot be reached: never "not found" for those.
    func slotKey(vaultIdentifier: String) throws(LockboxError) -> SecretBytes
    /// Forgets the key kept for `vaultIdentifier`.
    func deleteSlotKey(vaultIdentifier: String) throws(LockboxError)
}

extension Vault {
    /// Adds a slot whose key lives with `keeper` (the vault must be unlocked), so the vault
    /// opens without its passphrase where the keeper is available: on a desktop, with the
    /// login session. The passphrase slot stays.
    public func enroll(_ keeper: some ExternalKeyKeeper) throws(LockboxError) {
        // The keeper is reached outside the vault's lock (a D-Bus call may take seconds).
        let identifier: String = try withState { state throws(LockboxError) in
            guard try state.keys.currentMaster() != nil else { throw lockedError() }
            return identifierHex(state)
        }
        let slotKey = Crypto.generateKey()
        try keeper.storeSlotKey(slotKey, vaultIdentifier: identifier)
        try withState { state throws(LockboxError) in
            guard let master = try state.keys.currentMaster() else { throw lockedError() }
            try commitHeaderChange(state, master: master) { header throws(LockboxError) in
                header.slots.removeAll { $0.kind == .external && $0.parameters == Array(keeper.slotKind.utf8) }
                let nextID = (header.slots.map(\.id).max() ?? 0) + 1
                var slot = VaultHeader.KeySlot(
                    id: nextID, kind: .external, parameters: Array(keeper.slotKind.utf8), wrappedMasterKey: [])
                slot.wrappedMasterKey = Crypto.seal(master, key: slotKey, associatedData: header.slotAssociatedData(slot))
                header.slots.append(slot)
            }
        }
    }

    /// Removes `keeper`'s slot and the key it keeps.
    public func unenroll(_ keeper: some ExternalKeyKeeper) throws(LockboxError) {
        let identifier: String = try withState { state throws(LockboxError) in
            guard let master = try state.keys.currentMaster() else { throw lockedError() }
            try commitHeaderChange(state, master: master) { header throws(LockboxError) in
                header.slots.removeAll { $0.kind == .external && $0.parameters == Array(keeper.slotKind.utf8) }
            }
            return identifierHex(state)
        }
        try? keeper.deleteSlotKey(vaultIdentifier: identifier)
    }

    /// The kinds of outside keepers enrolled (`secret-service`).
    public var enrolledKeepers: [String] {
        withState { state in
            state.header.slots.filter { $0.kind == .external }.map(\.externalKind)
        }
    }

    /// Unlocks with the key `keeper` holds.
    /// - Throws: `notAvailable` when no such slot is enrolled or the keeper cannot be reached;
    ///   `interactionNotAllowed` when the keeper is locked; `authFailed` when its key does not
    ///   open the slot.
    public func unlock(with keeper: some ExternalKeyKeeper) throws(LockboxError) {
        // The keeper is asked outside the vault's lock.
        let (identifier, hasSlot): (String, Bool) = try withState { state throws(LockboxError) in
            state.header = try VaultHeader.load(from: state.database)
            let hasSlot = state.header.slots.contains { $0.kind == .external && $0.parameters == Array(keeper.slotKind.utf8) }
            return (identifierHex(state), hasSlot)
        }
        guard hasSlot else {
            throw LockboxError(
                .notAvailable,
                "This keychain has no \(keeper.slotKind) unlock method. Enroll one with `lockbox enroll \(keeper.slotKind)`.")
        }
        let slotKey: SecretBytes
        do throws(LockboxError) {
            slotKey = try keeper.slotKey(vaultIdentifier: identifier)
        } catch {
            guard error.code == .itemNotFound else { throw error }
            throw LockboxError(
                .authFailed, "The \(keeper.slotKind) holds no key for this keychain any more; unlock with the passphrase.")
        }
        try withState { state throws(LockboxError) in
            state.header = try VaultHeader.load(from: state.database)
            guard let slot = state.header.slots.first(where: { $0.kind == .external && $0.parameters == Array(keeper.slotKind.utf8) })
            else {
                throw LockboxError(
                    .notAvailable,
                    "This keychain has no \(keeper.slotKind) unlock method. Enroll one with `lockbox enroll \(keeper.slotKind)`.")
            }
            guard let master = try? Crypto.open(slot.wrappedMasterKey, key: slotKey, associatedData: state.header.slotAssociatedData(slot))
            else {
                throw LockboxError(.authFailed, "The key in the \(keeper.slotKind) does not open this keychain.")
            }
            try finishUnlock(master: master, presenceSecretKey: nil, state: state)
        }
    }

    private func identifierHex(_ state: State) -> String {
        state.header.vaultID.hexString
    }
}

/// A keeper that seals the slot key itself and hands back an opaque blob, which the vault keeps
/// in the slot: a TPM, whose sealed blob opens only on that TPM (and, when bound to PCRs, only
/// in the same boot state), as `systemd-cryptenroll --tpm2-device` keeps its blob in the LUKS
/// header. Nothing is stored outside the vault file.
public protocol SealingKeyKeeper: Sendable {
    /// The slot kind recorded in the vault header (`tpm2`).
    var slotKind: String { get }
    /// `key` sealed by the keeper.
    func seal(_ key: SecretBytes) throws(LockboxError) -> [UInt8]
    /// The key in `sealed`. Throws `notAvailable` when the keeper cannot be reached and
    /// `authFailed` when it refuses (another TPM, changed PCRs).
    func unseal(_ sealed: [UInt8]) throws(LockboxError) -> SecretBytes
}

extension VaultHeader.KeySlot {
    /// An external slot's keeper name: its parameters up to the first zero byte (a sealing
    /// keeper's blob follows it).
    var externalKind: String {
        String(decoding: parameters.prefix { $0 != 0 }, as: UTF8.self)
    }
}

extension Vault {
    /// Adds a slot whose key `keeper` seals (the vault must be unlocked), replacing any
    /// earlier slot of that keeper: the vault then opens with no passphrase wherever the keeper
    /// unseals, for example a service at boot with the machine's TPM. The passphrase slot stays.
    public func enroll(sealing keeper: some SealingKeyKeeper) throws(LockboxError) {
        try withState { state throws(LockboxError) in
            guard try state.keys.currentMaster() != nil else { throw lockedError() }
        }
        // The keeper (a TPM: tens of milliseconds) is asked outside the vault's lock.
        let slotKey = Crypto.generateKey()
        let sealed = try keeper.seal(slotKey)
        try withState { state throws(LockboxError) in
            guard let master = try state.keys.currentMaster() else { throw lockedError() }
            try commitHeaderChange(state, master: master) { header throws(LockboxError) in
                header.slots.removeAll { $0.kind == .external && $0.externalKind == keeper.slotKind }
                let nextID = (header.slots.map(\.id).max() ?? 0) + 1
                var slot = VaultHeader.KeySlot(
                    id: nextID, kind: .external, parameters: Array(keeper.slotKind.utf8) + [0] + sealed, wrappedMasterKey: [])
                slot.wrappedMasterKey = Crypto.seal(master, key: slotKey, associatedData: header.slotAssociatedData(slot))
                header.slots.append(slot)
            }
        }
    }

    /// Removes the slot of the sealing keeper named `slotKind` (`tpm2`).
    /// - Throws: `itemNotFound` when there is none (nothing changes).
    public func unenroll(sealingKind slotKind: String) throws(LockboxError) {
        try withState { state throws(LockboxError) in
            guard let master = try state.keys.currentMaster() else { throw lockedError() }
            guard state.header.slots.contains(where: { $0.kind == .external && $0.externalKind == slotKind }) else {
                throw LockboxError(.itemNotFound, "This keychain has no \(slotKind) unlock method; nothing was changed.")
            }
            try commitHeaderChange(state, master: master) { header throws(LockboxError) in
                header.slots.removeAll { $0.kind == .external && $0.externalKind == slotKind }
            }
        }
    }

    /// Unlocks with the key `keeper` unseals from its slot, with no passphrase.
    /// - Throws: `notAvailable` when no such slot is enrolled or the keeper cannot be reached;
    ///   `authFailed` when the keeper refuses or its key does not open the slot.
    public func unlock(sealing keeper: some SealingKeyKeeper) throws(LockboxError) {
        let sealed: [UInt8] = try withState { state throws(LockboxError) in
            state.header = try VaultHeader.load(from: state.database)
            guard let slot = state.header.slots.first(where: { $0.kind == .external && $0.externalKind == keeper.slotKind }) else {
                throw LockboxError(
                    .notAvailable,
                    "This keychain has no \(keeper.slotKind) unlock method. Enroll one with `lockbox enroll \(keeper.slotKind)`.")
            }
            return Array(slot.parameters.drop { $0 != 0 }.dropFirst())
        }
        let slotKey = try keeper.unseal(sealed)
        try withState { state throws(LockboxError) in
            state.header = try VaultHeader.load(from: state.database)
            guard let slot = state.header.slots.first(where: { $0.kind == .external && $0.externalKind == keeper.slotKind }),
                let master = try? Crypto.open(slot.wrappedMasterKey, key: slotKey, associatedData: state.header.slotAssociatedData(slot))
            else {
                throw LockboxError(.authFailed, "The key the \(keeper.slotKind) unsealed does not open this keychain (it was enrolled again since).")
            }
            try finishUnlock(master: master, presenceSecretKey: nil, state: state)
        }
    }
}
