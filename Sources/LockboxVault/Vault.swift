import FoundationEssentials
import LockboxCore
import Synchronization
import VaultCrypto
import VaultStorage

#if canImport(Glibc)
import Glibc
#endif

/// Lockbox's embedded keychain: one encrypted SQLite file, unlocked by a passphrase, shared
/// safely by several processes.
///
/// ```swift
/// let vault = try Vault.create(at: path, passphrase: passphrase)   // created unlocked
/// try vault.add(.genericPassword(service: "api", account: "alice", data: token))
/// try vault.lock()
/// let other = try Vault.open(at: path)        // another process
/// try other.unlock(passphrase: passphrase)
/// ```
///
/// Keys: a random master key, wrapped once per unlock method ("slots"); one class key per
/// accessibility value, wrapped by the master key; one random key per item, wrapped by its
/// class key. Items and their attributes are sealed with XChaCha20-Poly1305; lookups use
/// keyed BLAKE2b digests. See ARCHITECTURE.md.
public final class Vault: ItemStore, Sendable {
    /// How a vault is opened.
    public struct Configuration: Sendable {
        /// The largest value (`kSecValueData`) accepted, in bytes. Default 64 KiB.
        public var maximumValueSize = 64 * 1024
        /// Seconds of inactivity after which `whenUnlocked` items lock again; 0 never.
        /// Default 15 minutes.
        public var idleTimeout: UInt32 = 900
        /// Argon2id strength for new passphrase slots. Default `.moderate` (libsodium's
        /// MODERATE); `.interactive` is the floor.
        public var keyDerivation: KeyDerivationStrength = .moderate
        /// Where unlocked keys are kept between operations and processes.
        public var unlockCache: UnlockCache = .kernelKeyring
        /// The access groups this store may see; nil for all. Items added without a group go
        /// to the first one (or ``Vault/defaultAccessGroup``). Groups are namespaces, not
        /// walls: any process of the same user can open the file with other groups.
        public var accessGroups: [String]?
        /// Milliseconds to wait for another process's write before giving up.
        public var busyTimeoutMilliseconds: Int32 = 10_000
        /// Where this machine's device secret comes from (`*ThisDeviceOnly` items).
        public var device = DeviceIdentity()
        /// The authentication used for access-controlled items when a query brings no
        /// ``AuthenticationContext`` of its own. Nil: such items read as locked (-25308).
        public var authenticationContext: AuthenticationContext?

        public init() {}
    }

    /// Argon2id strengths (libsodium's presets).
    public enum KeyDerivationStrength: String, Sendable, CaseIterable {
        /// 2 passes, 64 MiB: the floor; for tests and small machines.
        case interactive
        /// 3 passes, 256 MiB: the default.
        case moderate
        /// 4 passes, 1 GiB.
        case sensitive

        var parameters: PassphraseKeyDerivation {
            PassphraseKeyDerivation(strength: PassphraseKeyDerivation.Strength(rawValue: rawValue)!)
        }
    }

    /// The access group of items added without one, when the store is not restricted.
    public static let defaultAccessGroup = "default"

    /// The vault file.
    public let path: String
    public let configuration: Configuration

    let state: Mutex<State>

    /// Everything mutable, behind the mutex. SQLite connections are used by one thread at a time.
    final class State {
        let database: Database
        var header: VaultHeader
        let keys: KeyCache
        var device: DeviceSecret { keys.device }
        /// SQL text per query shape (see `PlanShape`).
        var sqlByShape = SmallMap<PlanShape, String>()
        var statementByShape = SmallMap<PlanShape, Statement>()

        init(database: Database, header: VaultHeader, keys: KeyCache) {
            self.database = database
            self.header = header
            self.keys = keys
        }
    }

    private init(path: String, configuration: Configuration, state: sending State) {
        self.path = path
        self.configuration = configuration
        self.state = Mutex(state)
    }

    /// The default location: `$XDG_DATA_HOME/lockbox/default.lockbox`
    /// (`~/.local/share/lockbox/default.lockbox`).
    public static var defaultPath: String {
        if let data = ProcessEnvironment.value("XDG_DATA_HOME"), data.hasPrefix("/") {
            return data + "/lockbox/default.lockbox"
        }
        return ProcessEnvironment.home + "/.local/share/lockbox/default.lockbox"
    }

    // MARK: Create and open

    /// Creates a vault protected by `passphrase` and leaves it unlocked.
    /// - Throws: `duplicateKeychain` when a file exists at `path`.
    public static func create(
        at path: String, passphrase: SecretBytes, configuration: Configuration = Configuration()
    ) throws(LockboxError) -> Vault {
        let directory = FilePermissions.directory(of: path)
        try FilePermissions.createPrivateDirectory(directory)
        try FilePermissions.check(directory: directory, files: [])
        guard !FilePermissions.exists(path) else {
            throw LockboxError(.duplicateKeychain, "A keychain already exists at \(path).")
        }
        guard !passphrase.isEmpty else {
            throw LockboxError(.param, "The passphrase is empty. Choose a passphrase to protect the keychain.")
        }
        let oldMask = umask(0o077)
        defer { umask(oldMask) }
        let database = try Database(path: path, create: true, busyTimeoutMilliseconds: configuration.busyTimeoutMilliseconds)
        try FilePermissions.makePrivate(path)
        try VaultSchema.migrate(database)

        let device = try DeviceSecret.load(configuration.device)
        let master = Crypto.generateKey()
        let presence = Crypto.generateKeyPair()
        var header = VaultHeader(
            vaultID: Crypto.randomBytes(16), slots: [], wrappedClassKeys: SmallMap(), presencePublicKey: presence.publicKey, mac: [])
        header.slots.append(
            try makePassphraseSlot(
                id: 1, header: header, passphrase: passphrase, master: master, presenceKey: presence.secretKey,
                strength: configuration.keyDerivation))
        _ = KeyCache.addMissingClassKeys(to: &header, master: master, device: device)
        header.seal(master: master)
        try database.writeTransaction { () throws(LockboxError) in try header.save(to: database) }

        let keys = KeyCache(vaultID: header.vaultID, mode: configuration.unlockCache, device: device, path: path)
        let vault = Vault(path: path, configuration: configuration, state: State(database: database, header: header, keys: keys))
        try vault.withState { state throws(LockboxError) in
            try vault.cacheUnlockedKeys(master: master, state: state)
        }
        return vault
    }

    /// Opens an existing vault. It is unlocked when another process (or an earlier one since
    /// boot) left its keys in the kernel keyring; otherwise call ``unlock(passphrase:)``.
    /// - Throws: `noSuchKeychain` when there is no vault at `path`; an I/O error naming the
    ///   `chmod` to run when the file or its directory is open to other users.
    public static func open(at path: String, configuration: Configuration = Configuration()) throws(LockboxError) -> Vault {
        guard FilePermissions.exists(path) else {
            throw LockboxError(.noSuchKeychain, "No keychain at \(path). Create one with `lockbox init`.")
        }
        try FilePermissions.check(
            directory: FilePermissions.directory(of: path), files: [path, path + "-wal", path + "-shm"])
        let oldMask = umask(0o077)
        defer { umask(oldMask) }
        let database = try Database(path: path, create: false, busyTimeoutMilliseconds: configuration.busyTimeoutMilliseconds)
        try VaultSchema.migrate(database)
        let header = try VaultHeader.load(from: database)
        let keys = KeyCache(
            vaultID: header.vaultID, mode: configuration.unlockCache, device: try DeviceSecret.load(configuration.device), path: path)
        return Vault(path: path, configuration: configuration, state: State(database: database, header: header, keys: keys))
    }

    // MARK: Lock state

    /// Unlocks with a passphrase.
    ///
    /// Repeated failures make the next attempt wait: nothing for the first three, then 1 s,
    /// 2 s, 4 s ... up to 30 s, counted in the vault file so every process shares the count.
    /// - Throws: `authFailed` for a wrong passphrase; `decode` when the header was modified.
    public func unlock(passphrase: SecretBytes) throws(LockboxError) {
        try withState { state throws(LockboxError) in
            try waitOutFailedAttempts(state.database)
            state.header = try VaultHeader.load(from: state.database)
            guard let (master, _) = try Self.openPassphraseSlot(state.header, passphrase: passphrase) else {
                let failures = try recordFailedAttempt(state.database)
                let wait = Self.delay(afterFailures: failures)
                throw LockboxError(
                    .authFailed,
                    "The passphrase is wrong (failed attempt \(failures)"
                        + (wait > 0 ? "; the next attempt waits \(wait) s)." : ")."))
            }
            try finishUnlock(master: master, state: state)
        }
    }

    /// Unlocks a vault that has no passphrase (see ``removePassphrase(_:)``) with this
    /// machine's device secret.
    /// - Throws: `authFailed` when the vault has a passphrase or was made on another machine.
    public func unlock() throws(LockboxError) {
        try withState { state throws(LockboxError) in
            state.header = try VaultHeader.load(from: state.database)
            let header = state.header
            guard let slot = header.slots.first(where: { $0.kind == .device }) else {
                throw LockboxError(.authFailed, "This keychain has a passphrase: unlock it with the passphrase.")
            }
            guard let master = try? Crypto.open(
                slot.wrappedMasterKey, key: Self.deviceSlotKey(state.device), associatedData: header.slotAssociatedData(slot))
            else {
                throw LockboxError(
                    .authFailed, "This keychain's passphrase-free unlock belongs to another machine; it cannot be unlocked here.")
            }
            try finishUnlock(master: master, state: state)
        }
    }

    /// After a slot opened: check the header, give this machine its class keys, cache.
    func finishUnlock(master: SecretBytes, state: State) throws(LockboxError) {
        guard state.header.verify(master: master) else {
            throw LockboxError.integrity("The keychain header")
        }
        var header = state.header
        if KeyCache.addMissingClassKeys(to: &header, master: master, device: state.device) {
            // First unlock on this machine: its ThisDeviceOnly classes get fresh keys.
            header.seal(master: master)
            try state.database.writeTransaction { () throws(LockboxError) in try header.save(to: state.database) }
            state.header = header
        }
        try clearFailedAttempts(state.database)
        try cacheUnlockedKeys(master: master, state: state)
    }

    /// The master and presence keys from the first passphrase slot that `passphrase` opens.
    static func openPassphraseSlot(_ header: VaultHeader, passphrase: SecretBytes) throws(LockboxError) -> (SecretBytes, SecretBytes?)? {
        for slot in header.slots where slot.kind == .passphrase {
            guard let derivation = PassphraseKeyDerivation(decoding: slot.parameters), derivation.meetsMinimum else {
                throw LockboxError(
                    .decode,
                    "The keychain header's key-derivation parameters are missing or below Lockbox's minimum: "
                        + "the file was modified outside Lockbox. Restore it from a backup.")
            }
            guard let slotKey = try derivation.deriveKey(from: passphrase) else {
                throw LockboxError(.io, "Not enough memory to derive the key from the passphrase (Argon2id).")
            }
            if let master = try? Crypto.open(slot.wrappedMasterKey, key: slotKey, associatedData: header.slotAssociatedData(slot)),
                master.count == Crypto.keyByteCount
            {
                let presence = slot.wrappedPresenceKey.flatMap {
                    try? Crypto.open($0, key: slotKey, associatedData: header.slotAssociatedData(slot, purpose: "presence"))
                }
                return (master, presence)
            }
        }
        return nil
    }

    static func deviceSlotKey(_ device: DeviceSecret) -> SecretBytes {
        Crypto.combine(device.secret, with: SecretBytes(utf8: "slot"), context: "lockbox.device-slot.v1")
    }

    /// Locks: `whenUnlocked*` items become unreadable (-25308) in every process until the
    /// next unlock. `afterFirstUnlock*` items stay readable until reboot, as on iOS.
    public func lock() {
        withState { state in state.keys.lock() }
    }

    /// Forgets every cached key, as a reboot does (`afterFirstUnlock*` items lock too).
    public func lockAll() {
        withState { state in state.keys.forgetAll() }
    }

    /// Replaces the passphrase. Rewraps the master key in its slot only: no item is touched.
    /// - Throws: `authFailed` when `old` is wrong.
    public func changePassphrase(from old: SecretBytes, to new: SecretBytes) throws(LockboxError) {
        guard !new.isEmpty else {
            throw LockboxError(.param, "The new passphrase is empty.")
        }
        try withState { state throws(LockboxError) in
            try state.database.writeTransaction { () throws(LockboxError) in
                var header = try VaultHeader.load(from: state.database)
                guard let (master, presence) = try Self.openPassphraseSlot(header, passphrase: old) else {
                    throw LockboxError(.authFailed, "The current passphrase is wrong; nothing was changed.")
                }
                guard header.verify(master: master) else { throw LockboxError.integrity("The keychain header") }
                guard let index = header.slots.firstIndex(where: { $0.kind == .passphrase }) else {
                    throw LockboxError(.notAvailable, "This keychain has no passphrase slot to change.")
                }
                guard let presence else { throw LockboxError.integrity("The keychain's presence key") }
                header.slots[index] = try Self.makePassphraseSlot(
                    id: header.slots[index].id, header: header, passphrase: new, master: master,
                    presenceKey: presence, strength: configuration.keyDerivation)
                header.seal(master: master)
                try header.save(to: state.database)
                state.header = header
                try cacheUnlockedKeys(master: master, state: state)
            }
        }
    }

    /// Removes the passphrase, as turning off an iPhone's passcode does: the vault then
    /// unlocks with this machine's device secret alone (``unlock()``), every
    /// `whenPasscodeSetThisDeviceOnly` item and every access-controlled item is deleted, and
    /// that class's key is destroyed.
    /// - Returns: the number of items deleted.
    @discardableResult
    public func removePassphrase(_ current: SecretBytes) throws(LockboxError) -> Int {
        try withState { state throws(LockboxError) -> Int in
            try state.database.writeTransaction { () throws(LockboxError) -> Int in
                var header = try VaultHeader.load(from: state.database)
                guard let (master, _) = try Self.openPassphraseSlot(header, passphrase: current) else {
                    throw LockboxError(.authFailed, "The passphrase is wrong; nothing was changed.")
                }
                guard header.verify(master: master) else { throw LockboxError.integrity("The keychain header") }
                let deleted = try state.database.statement(
                    "DELETE FROM items WHERE accessibility = 'whenPasscodeSetThisDeviceOnly' OR access_control != ''")
                try deleted.run()
                let count = state.database.changes
                header.slots.removeAll { $0.kind == .passphrase }
                let nextID = (header.slots.map(\.id).max() ?? 0) + 1
                var slot = VaultHeader.KeySlot(id: nextID, kind: .device, parameters: [], wrappedMasterKey: [])
                slot.wrappedMasterKey = Crypto.seal(
                    master, key: Self.deviceSlotKey(state.device), associatedData: header.slotAssociatedData(slot))
                header.slots.removeAll { $0.kind == .device }
                header.slots.append(slot)
                header.wrappedClassKeys = header.wrappedClassKeys.filter { $0.accessibility != .whenPasscodeSetThisDeviceOnly }
                header.presencePublicKey = nil
                header.seal(master: master)
                try header.save(to: state.database)
                state.header = header
                try cacheUnlockedKeys(master: master, state: state)
                return count
            }
        }
    }

    /// Sets a passphrase on a vault that has none (after ``removePassphrase(_:)``). The vault
    /// must be unlocked. `whenPasscodeSetThisDeviceOnly` becomes usable again.
    public func setPassphrase(_ new: SecretBytes) throws(LockboxError) {
        guard !new.isEmpty else { throw LockboxError(.param, "The new passphrase is empty.") }
        try withState { state throws(LockboxError) in
            guard let master = try state.keys.currentMaster() else { throw lockedError() }
            try state.database.writeTransaction { () throws(LockboxError) in
                var header = try VaultHeader.load(from: state.database)
                guard header.verify(master: master) else { throw LockboxError.integrity("The keychain header") }
                guard !header.hasPassphrase else {
                    throw LockboxError(.duplicateItem, "This keychain already has a passphrase; use change-passphrase.")
                }
                header.slots.removeAll { $0.kind == .device }
                let nextID = (header.slots.map(\.id).max() ?? 0) + 1
                let presence = Crypto.generateKeyPair()
                header.presencePublicKey = presence.publicKey
                header.slots.append(
                    try Self.makePassphraseSlot(
                        id: nextID, header: header, passphrase: new, master: master, presenceKey: presence.secretKey,
                        strength: configuration.keyDerivation))
                _ = KeyCache.addMissingClassKeys(to: &header, master: master, device: state.device)
                header.seal(master: master)
                try header.save(to: state.database)
                state.header = header
            }
        }
    }

    /// Whether the master key is available now (`whenUnlocked*` items are readable). One
    /// kernel-keyring check, no I/O on the file.
    public var isUnlocked: Bool {
        get throws(LockboxError) { try withState { state throws(LockboxError) in try state.keys.currentMaster() != nil } }
    }

    /// Whether a passphrase slot exists (false after ``removePassphrase(_:)``).
    public var hasPassphrase: Bool {
        withState { state in state.header.hasPassphrase }
    }

    /// Where the vault stands now.
    public func status() throws(LockboxError) -> VaultStatus {
        try withState { state throws(LockboxError) in
            let unlocked = try state.keys.currentMaster() != nil
            let afterFirstUnlock = try state.keys.currentAfterFirstUnlockKeys() != nil
            let count = try state.database.statement("SELECT count(*) FROM items")
            _ = try count.step()
            let failures = try state.database.statement("SELECT failures FROM unlock_attempts WHERE id = 1")
            let failed = try failures.step() ? failures.integer(0) ?? 0 : 0
            var readable: [Accessibility] = []
            for accessibility in Accessibility.allCases
            where (try? state.keys.classKey(for: accessibility, header: state.header)) != nil {
                readable.append(accessibility)
            }
            let foreign = try state.database.statement("SELECT count(*) FROM items WHERE device_id NOT IN ('', ?)")
            foreign.bind(1, state.device.identifier)
            _ = try foreign.step()
            return VaultStatus(
                path: path, isUnlocked: unlocked, wasUnlockedSinceBoot: afterFirstUnlock,
                readableClasses: readable, itemCount: count.integer(0) ?? 0,
                unlockMethods: state.header.slots.map { $0.kind == .external ? String(decoding: $0.parameters, as: UTF8.self) : $0.kind.rawValue },
                unlockCache: configuration.unlockCache,
                failedUnlockAttempts: failed, schemaVersion: VaultSchema.current,
                itemsBoundToOtherMachines: foreign.integer(0) ?? 0, hasPassphrase: state.header.hasPassphrase)
        }
    }

    /// Runs `body` with the vault's state locked, then resets every statement so no read
    /// snapshot outlives the operation (a stale snapshot would hide other processes' writes).
    func withState<T>(_ body: (State) throws(LockboxError) -> sending T) throws(LockboxError) -> sending T {
        try state.withLock { state throws(LockboxError) -> sending T in
            state.keys.beginOperation()
            defer { state.database.resetStatements() }
            return try body(state)
        }
    }

    func withState<T>(_ body: (State) -> sending T) -> sending T {
        state.withLock { state -> sending T in
            state.keys.beginOperation()
            defer { state.database.resetStatements() }
            return body(state)
        }
    }

    /// The vault's random identity (hex), which names its kernel-keyring entries.
    package var identifier: String {
        withState { state in state.header.vaultID.hexString }
    }

    /// Runs `body` on the vault's SQLite connection, for tests and maintenance tools.
    package func withDatabase<T: Sendable>(_ body: (Database) throws(LockboxError) -> T) throws(LockboxError) -> T {
        try withState { state throws(LockboxError) -> T in
            // The connection is used only inside the lock; the closure cannot keep it.
            nonisolated(unsafe) let database = state.database
            return try body(database)
        }
    }

    // MARK: Internals

    static func makePassphraseSlot(
        id: Int, header: VaultHeader, passphrase: SecretBytes, master: SecretBytes, presenceKey: SecretBytes,
        strength: KeyDerivationStrength
    ) throws(LockboxError) -> VaultHeader.KeySlot {
        let derivation = strength.parameters
        var slot = VaultHeader.KeySlot(id: id, kind: .passphrase, parameters: derivation.encoded(), wrappedMasterKey: [])
        guard let slotKey = try derivation.deriveKey(from: passphrase) else {
            throw LockboxError(.allocate, "Not enough memory to derive the key from the passphrase (Argon2id).")
        }
        slot.wrappedMasterKey = Crypto.seal(master, key: slotKey, associatedData: header.slotAssociatedData(slot))
        slot.wrappedPresenceKey = Crypto.seal(
            presenceKey, key: slotKey, associatedData: header.slotAssociatedData(slot, purpose: "presence"))
        return slot
    }

    private func cacheUnlockedKeys(master: SecretBytes, state: State) throws(LockboxError) {
        var classKeys = SmallMap<Accessibility, SecretBytes>()
        for accessibility in AfterFirstUnlockKeys.classes {
            guard let key = try KeyCache.unwrapClassKey(accessibility, header: state.header, master: master, device: state.device) else {
                throw LockboxError.integrity("The \(accessibility.rawValue) class key")
            }
            classKeys[accessibility] = key
        }
        let afterFirstUnlock = AfterFirstUnlockKeys(indexRoot: KeyCache.indexRoot(master: master), classKeys: classKeys)
        try state.keys.store(master: master, afterFirstUnlock: afterFirstUnlock, idleTimeout: configuration.idleTimeout)
    }

    package static func delay(afterFailures failures: Int) -> Int {
        guard failures >= 3 else { return 0 }
        return min(30, 1 << min(failures - 3, 5))
    }

    private func waitOutFailedAttempts(_ database: Database) throws(LockboxError) {
        let statement = try database.statement("SELECT failures, last_failure FROM unlock_attempts WHERE id = 1")
        guard try statement.step(), let failures = statement.integer(0), let last = statement.double(1) else { return }
        let wait = Double(Self.delay(afterFailures: failures)) - (Date().timeIntervalSince1970 - last)
        if wait > 0 {
            let seconds = min(wait, 30)
            var interval = timespec(tv_sec: Int(seconds), tv_nsec: Int((seconds - seconds.rounded(.down)) * 1e9))
            var remaining = timespec()
            while nanosleep(&interval, &remaining) != 0 && errno == EINTR { interval = remaining }
        }
    }

    private func recordFailedAttempt(_ database: Database) throws(LockboxError) -> Int {
        try database.writeTransaction { () throws(LockboxError) -> Int in
            let update = try database.statement(
                """
                INSERT INTO unlock_attempts (id, failures, last_failure) VALUES (1, 1, ?)
                ON CONFLICT(id) DO UPDATE SET failures = failures + 1, last_failure = excluded.last_failure
                """)
            update.bind(1, Date().timeIntervalSince1970)
            try update.run()
            let read = try database.statement("SELECT failures FROM unlock_attempts WHERE id = 1")
            _ = try read.step()
            return read.integer(0) ?? 1
        }
    }

    private func clearFailedAttempts(_ database: Database) throws(LockboxError) {
        let check = try database.statement("SELECT failures FROM unlock_attempts WHERE id = 1")
        guard try check.step() else { return }
        try database.writeTransaction { () throws(LockboxError) in
            try database.execute("DELETE FROM unlock_attempts")
        }
    }
}

/// What `lockbox status` shows.
public struct VaultStatus: Sendable, Codable {
    public var path: String
    /// The master key is available: `whenUnlocked*` items are readable.
    public var isUnlocked: Bool
    /// Unlocked at least once since boot: `afterFirstUnlock*` items are readable.
    public var wasUnlockedSinceBoot: Bool
    /// The accessibility classes whose items can be read now.
    public var readableClasses: [Accessibility]
    public var itemCount: Int
    public var unlockMethods: [String]
    public var unlockCache: UnlockCache
    public var failedUnlockAttempts: Int
    public var schemaVersion: Int
    /// `*ThisDeviceOnly` items made on another machine (the file was copied here): they
    /// cannot be opened here and do not appear in queries.
    public var itemsBoundToOtherMachines: Int
    /// False after ``Vault/removePassphrase(_:)``.
    public var hasPassphrase: Bool
}

extension UnlockCache: Codable {}
