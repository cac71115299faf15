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
        /// Inactivity after which `whenUnlocked` items lock again, in whole seconds (a fraction
        /// is rounded up); zero never. Default 15 minutes.
        public var idleTimeout: Duration = .seconds(900)
        /// Argon2id strength for new passphrase slots. Default `.moderate` (libsodium's
        /// MODERATE); `.interactive` is the floor.
        public var keyDerivation: KeyDerivationStrength = .moderate
        /// Where unlocked keys are kept between operations and processes.
        public var unlockCache: UnlockCache = .kernelKeyring
        /// The access groups this store may see; nil for all. Items added without a group go
        /// to the first one (or ``Vault/defaultAccessGroup``). Groups are namespaces, not
        /// walls: any process of the same user can open the file with other groups.
        public var accessGroups: [String]?
        /// How long to wait for another process's write before giving up. Default 10 s.
        public var busyTimeout: Duration = .seconds(10)
        /// ``busyTimeout`` in milliseconds.
        @available(*, deprecated, renamed: "busyTimeout")
        public var busyTimeoutMilliseconds: Int32 {
            get { busyTimeout.wholeMilliseconds }
            set { busyTimeout = .milliseconds(newValue) }
        }
        /// Where this machine's device secret comes from (`*ThisDeviceOnly` items).
        public var device = DeviceIdentity()
        /// The authentication used for access-controlled items when a query brings no
        /// ``AuthenticationContext`` of its own. Nil: such items read as locked (-25308).
        public var authenticationContext: AuthenticationContext?
        /// Measures the idle timeout and the failed-unlock delay, and waits that delay.
        package var clock: any LockboxClock = SystemClock()
        /// Set by `lockboxd`, which opens the vault holding this exclusive claim; nil for an
        /// embedded handle, which takes a shared one (see ``BrokerClaim``).
        package var brokerClaim: BrokerClaim?

        /// The defaults.
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
    /// This handle's claim on the file against a broker (see ``BrokerClaim``), held for its life.
    let claim: BrokerClaim?
    /// Called after `lock()` and `lockAll()`: the key API drops the keys it opened.
    package let lockObservers = LockObservers()

    /// Everything mutable, behind the mutex. SQLite connections are used by one thread at a time.
    final class State {
        /// How many times this handle was locked: part of the stamp opened managed keys are
        /// kept under (``KeyUseStamp``).
        var lockCount = 0
        /// Row changes this connection committed through writes that touched no managed key's
        /// row and not the header (``Vault/writeRows(_:_:)`` counts them): a key opened before
        /// such a write is still the key the file holds, so they leave ``KeyUseStamp`` as it was.
        var changesSparingKeys = 0
        let database: Database
        var header: VaultHeader {
            didSet {
                cachedHeaderBinding = nil
                vaultID = header.vaultID
            }
        }
        /// `header.vaultID`, kept apart: reading it through `header` copies the whole header.
        private(set) var vaultID: [UInt8]
        /// ``IntegrityState/headerBinding(_:key:)`` of ``header``, computed once per header
        /// (the key, derived from the `always` class key the header wraps, goes with it).
        private var cachedHeaderBinding: (key: SecretBytes, binding: [UInt8])?
        let keys: KeyCache
        var device: DeviceSecret { keys.device }
        /// SQL text per query shape (see `PlanShape`).
        var sqlByShape = SmallMap<PlanShape, String>()
        var statementByShape = SmallMap<PlanShape, Statement>()
        /// The statement of the value read by primary key (`Vault+ValueRead.swift`).
        var valueStatement: Statement?
        /// How many reads that statement answered (for tests: the path is taken).
        var directValueReads = 0
        /// An encoder whose storage the value read reuses for its associated data.
        var spareEncoder: FieldEncoder?
        /// What this connection verified of the integrity state (see ``IntegrityState``).
        var integrity: IntegrityCache? {
            didSet {
                if integrity == nil { integrityConfirmedIn = nil }
                valueReadCheck = integrity.flatMap(ValueReadCheck.init)
            }
        }
        /// What the value read (`Vault+ValueRead.swift`) needs of ``integrity``, kept apart so
        /// that a read does not copy the whole cache.
        private(set) var valueReadCheck: ValueReadCheck?
        /// The transaction (``Database/transactionSerial``) in which ``integrity`` was last
        /// confirmed against the file: within it, the snapshot cannot move.
        var integrityConfirmedIn: Int?
        /// The writer of the write transaction running now (``Vault/writeRows(_:_:)``): the
        /// rows it already changed are checked against its record, not the one before it.
        var activeWriter: RowWriter?
        let rememberedGeneration: RememberedGeneration
        /// User verification an operation needs, asked outside the lock (see
        /// `withStateVerifyingUser`), and the proof the next run of the operation is given.
        var presenceRequest: PresenceRequest?
        var presenceProof: PresenceProof?

        func headerBinding(key: SecretBytes) -> [UInt8] {
            if let cachedHeaderBinding, cachedHeaderBinding.key == key { return cachedHeaderBinding.binding }
            let binding = IntegrityState.headerBinding(header, key: key)
            cachedHeaderBinding = (key, binding)
            return binding
        }

        init(database: Database, header: VaultHeader, keys: KeyCache, rememberedGeneration: RememberedGeneration) {
            self.database = database
            self.header = header
            vaultID = header.vaultID
            self.keys = keys
            self.rememberedGeneration = rememberedGeneration
        }
    }

    private init(path: String, configuration: Configuration, state: sending State, claim: BrokerClaim?) {
        self.path = path
        self.configuration = configuration
        self.state = Mutex(state)
        self.claim = claim
    }

    /// The claim a new handle holds: the broker's own, or a shared one against a broker.
    private static func claim(_ path: String, _ configuration: Configuration) throws(LockboxError) -> BrokerClaim? {
        if let claim = configuration.brokerClaim { return claim }
        return try BrokerClaim.claimForEmbedded(vaultPath: path)
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
        let claim = try claim(path, configuration)
        // A vault whose keys could not be cached would be created, yet locked at once.
        try KeyCache.checkUsable(configuration.unlockCache)
        let oldMask = umask(0o077)
        defer { umask(oldMask) }
        // Before any file: a state directory that cannot be made fails here, leaving nothing.
        let device = try DeviceSecret.load(configuration.device)
        if let unavailable = device.unavailability { throw unavailable }
        let master = Crypto.generateKey()
        let presence = Crypto.generateKeyPair()
        var header = VaultHeader(
            vaultID: Crypto.randomBytes(16), slots: [], wrappedClassKeys: SmallMap(), presencePublicKey: presence.publicKey, mac: [])
        let indexRoot = Crypto.generateKey()
        header.wrappedIndexRoot = Crypto.seal(indexRoot, key: master, associatedData: header.indexRootAssociatedData())
        let strength = configuration.keyDerivation
        let slot = VaultHeader.KeySlot(id: 1, kind: .passphrase, parameters: strength.parameters.encoded(), wrappedMasterKey: [])
        let slotKey = try Self.deriveSlotKey(slot, passphrase: passphrase)
        header.slots.append(Self.wrap(slot, master: master, presenceKey: presence.secretKey, slotKey: slotKey, header: header))
        _ = try KeyCache.addMissingClassKeys(to: &header, master: master, device: device)
        header.seal(master: master)
        guard let always = try KeyCache.unwrapClassKey(.always, header: header, master: master, device: device) else {
            preconditionFailure("a new vault has an always class key")
        }
        var integrity = IntegrityState.empty()
        integrity.generation = 1
        integrity.seal(header: header, keys: IntegrityState.Keys(indexRoot: indexRoot, alwaysClassKey: always))
        // Written whole under another name, then given its own: a creation that stops part-way
        // (a full disk, a kill) leaves no file at `path` that every later command would take
        // for a damaged keychain, and that `lockbox init` would refuse to replace.
        try writeNewFile(at: path, directory: directory, configuration: configuration) { database throws(LockboxError) in
            try database.writeTransaction { () throws(LockboxError) in
                try header.save(to: database)
                try integrity.save(to: database)
            }
        }
        guard let identity = try FilePermissions.check(directory: directory, files: [path])[path] else {
            throw LockboxError(.io, "\(path) was removed while it was being created.")
        }
        let database = try Database(
            path: path, create: false, gatheringLogWrites: true, busyTimeoutMilliseconds: configuration.busyTimeout.wholeMilliseconds)
        try FilePermissions.confirmOpened(identity, path: path, opened: database.openedFileIdentity)
        guard try VaultHeader.load(from: database).vaultID == header.vaultID else {
            throw LockboxError(.io, "\(path) was replaced while it was being created. Check who else can write to its directory.")
        }

        let keys = KeyCache(vaultID: header.vaultID, mode: configuration.unlockCache, device: device, path: path, clock: configuration.clock)
        let remembered = RememberedGeneration(
            vaultID: header.vaultID, vaultPath: path, device: configuration.device, sharing: configuration.unlockCache == .kernelKeyring)
        let vault = Vault(
            path: path, configuration: configuration,
            state: State(database: database, header: header, keys: keys, rememberedGeneration: remembered), claim: claim)
        do throws(LockboxError) {
            try vault.withState { state throws(LockboxError) in
                // The record of failed attempts before the generation is remembered: a creation
                // stopped between the two leaves a file this machine does not know yet, never a
                // known one without its record (which counts as tampered with: 8 failures).
                try vault.writeAttempts(Attempts(failures: 0, lastFailure: 0), state: state)
                state.rememberedGeneration.write(1)
                try vault.cacheUnlockedKeys(master: master, state: state)
            }
        } catch {
            // The keychain is in place, but cannot be used as asked (its keys cannot be kept, say):
            // it is taken back while it holds no item, so that the same init, the cause fixed
            // (or another unlock cache chosen), makes it again.
            vault.lockAll()
            if removeIfEmpty(path, identity: identity) {
                throw LockboxError(error.code, "The keychain \(path) was not created, and nothing was left there. " + error.message, cause: error.cause)
            }
            throw error
        }
        return vault
    }

    /// Removes the keychain just made at `path` (the file `identity` names, and its log and
    /// shared memory) when it holds no item. Returns whether it did.
    private static func removeIfEmpty(_ path: String, identity: FilePermissions.Identity) -> Bool {
        guard let database = try? Database(path: path, create: false),
            (try? FilePermissions.confirmOpened(identity, path: path, opened: database.openedFileIdentity)) != nil,
            (try? database.firstRow("SELECT count(*) FROM items", read: { $0.integer(0) ?? 1 })) == 0
        else { return false }
        for suffix in ["", "-wal", "-shm"] { unlink(path + suffix) }
        return true
    }

    /// Makes a vault file at `path` that did not exist: a new SQLite file under a hidden name
    /// of its own in `directory` (mode 0600), its schema made and `fill` run on it, its log
    /// moved into it and closed; then given the name `path`, never over a file there
    /// (``placeWithoutReplacing(_:_:)``). A failure at any point removes the new file.
    /// - Throws: `duplicateKeychain` when a file appeared at `path` meanwhile.
    private static func writeNewFile(
        at path: String, directory: String, configuration: Configuration, _ fill: (Database) throws(LockboxError) -> Void
    ) throws(LockboxError) {
        try checkNoLeftLog(at: path)
        removeCreationLeftovers(in: directory)
        // Short and of its own: a keychain's name of up to 255 bytes still gets one.
        let temporary = directory + "/" + creationPrefix + Crypto.randomBytes(8).hexString
        func removeTemporary() {
            for suffix in ["", "-wal", "-shm", "-journal"] { unlink(temporary + suffix) }
        }
        do throws(LockboxError) {
            // The name is new and random: a file already there is refused rather than used.
            let descriptor = Glibc.open(temporary, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0o600)
            guard descriptor >= 0 else {
                let reason = errno
                throw LockboxError(
                    .io, "Cannot create a file in \(directory): \(String(cString: strerror(reason))).",
                    cause: .systemCall("open", errno: reason))
            }
            close(descriptor)
            do {
                let database = try Database(
                    path: temporary, create: true, pageSize: VaultSchema.pageSize, gatheringLogWrites: true,
                    busyTimeoutMilliseconds: configuration.busyTimeout.wholeMilliseconds)
                try VaultSchema.migrate(database)
                try fill(database)
                // Everything in the main file before it is closed and renamed: the log stays behind.
                try database.moveWriteAheadLogIntoFile()
            }
            for suffix in ["-wal", "-shm"] { unlink(temporary + suffix) }
            try checkNoLeftLog(at: path)
            guard try placeWithoutReplacing(temporary, path) else {
                throw LockboxError(.duplicateKeychain, "A keychain already exists at \(path).")
            }
        } catch {
            removeTemporary()
            guard error.code != .duplicateKeychain else { throw error }
            // Said of the keychain: the file it would have been is gone.
            let message = error.message.split(separator: temporary, omittingEmptySubsequences: false).joined(separator: path)
            throw LockboxError(error.code, "The keychain \(path) was not created, and nothing was left there. " + message, cause: error.cause)
        }
        // The new name made durable with the file it names.
        let directoryDescriptor = Glibc.open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        if directoryDescriptor >= 0 {
            fsync(directoryDescriptor)
            close(directoryDescriptor)
        }
    }

    /// Refuses to make a keychain at `path` while a log of an earlier file of that name is
    /// beside it (`-wal`, or a rollback `-journal`): SQLite would apply it to the new file, which
    /// then held the earlier keychain's rows under the new one's header, and failed every check
    /// from its first use. The log is left for the user: it may hold that keychain's last changes.
    static func checkNoLeftLog(at path: String) throws(LockboxError) {
        // A keychain still there is refused as such (its log is its own).
        var file = stat()
        guard lstat(path, &file) != 0 && errno == ENOENT else { return }
        for suffix in ["-wal", "-journal"] {
            var info = stat()
            guard lstat(path + suffix, &info) == 0 else { continue }
            throw LockboxError(
                .io,
                "\(path + suffix), the log of an earlier keychain at this path, is still there (that keychain's file is gone), "
                    + "and would be applied to a new one. It may hold that keychain's last changes: move it away, with "
                    + "\(path)-shm if there is one, then create the keychain again.")
        }
    }

    /// The hidden name a keychain is made under, followed by random hexadecimal digits.
    static let creationPrefix = ".lockbox-creating-"

    /// Gives the finished file `temporary` the name `path` unless something is there (then
    /// returns false, `temporary` left for the caller): one atomic rename that refuses to
    /// replace (`renameat2`'s `RENAME_NOREPLACE`); where the file system cannot, a hard link then
    /// the temporary name removed; where it has no hard links either, a rename after a last look
    /// (a file made at `path` in between would be replaced: exFAT through FUSE, say).
    static func placeWithoutReplacing(_ temporary: String, _ path: String) throws(LockboxError) -> Bool {
        let renamed = FileRename.withoutReplacing(temporary, path)
        if renamed == 0 { return true }
        if renamed == EEXIST { return false }
        if link(temporary, path) == 0 {
            unlink(temporary)
            return true
        }
        let reason = errno
        if reason == EEXIST { return false }
        guard reason == EPERM || reason == EOPNOTSUPP || reason == ENOSYS || reason == EMLINK else {
            throw LockboxError(.io, "Cannot create \(path): \(String(cString: strerror(reason))).", cause: .systemCall("link", errno: reason))
        }
        if FilePermissions.exists(path) { return false }
        guard rename(temporary, path) == 0 else {
            throw LockboxError(.io, "Cannot create \(path): \(String(cString: strerror(errno))).", cause: .systemCall("rename", errno: errno))
        }
        return true
    }

    /// Removes what a creation stopped before its file was in place left in `directory` (a
    /// kill, a power loss): files under ``creationPrefix`` last changed over an hour ago. Such a
    /// file never held an item. Best effort.
    private static func removeCreationLeftovers(in directory: String) {
        guard let stream = opendir(directory) else { return }
        defer { closedir(stream) }
        let hourAgo = time(nil) - 3600
        while let entry = readdir(stream) {
            let name = DirectoryEntry.name(entry)
            guard name.hasPrefix(creationPrefix) else { continue }
            var info = stat()
            let file = directory + "/" + name
            guard lstat(file, &info) == 0, info.st_mode & S_IFMT == S_IFREG, info.st_uid == geteuid(), info.st_mtim.tv_sec < hourAgo
            else { continue }
            unlink(file)
        }
    }

    /// Opens an existing vault. It is unlocked when another process (or an earlier one since
    /// boot) left its keys in the kernel keyring; otherwise call ``unlock(passphrase:)``.
    /// - Throws: `noSuchKeychain` when there is no vault at `path`; an I/O error naming the
    ///   `chmod` to run when the file or its directory is open to other users.
    public static func open(at path: String, configuration: Configuration = Configuration()) throws(LockboxError) -> Vault {
        try open(at: path, configuration: configuration, checked: true)
    }

    package static func open(at path: String, configuration: Configuration, checked: Bool) throws(LockboxError) -> Vault {
        guard try FilePermissions.keychainExists(path) else {
            throw LockboxError(.noSuchKeychain, "No keychain at \(path). Create one with `lockbox init`.")
        }
        let identities = try FilePermissions.check(
            directory: FilePermissions.directory(of: path), files: [path, path + "-wal", path + "-shm"], singleName: true)
        guard let identity = identities[path] else {
            throw LockboxError(.noSuchKeychain, "No keychain at \(path). Create one with `lockbox init`.")
        }
        let claim = try claim(path, configuration)
        let oldMask = umask(0o077)
        defer { umask(oldMask) }
        let database = try Database(
            path: path, create: false, gatheringLogWrites: true, busyTimeoutMilliseconds: configuration.busyTimeout.wholeMilliseconds)
        try FilePermissions.confirmOpened(identity, path: path, opened: database.openedFileIdentity)
        try VaultSchema.migrate(database)
        let header = try VaultHeader.load(from: database)
        let keys = KeyCache(
            vaultID: header.vaultID, mode: configuration.unlockCache, device: try DeviceSecret.load(configuration.device), path: path,
            clock: configuration.clock)
        let remembered = RememberedGeneration(
            vaultID: header.vaultID, vaultPath: path, device: configuration.device, sharing: configuration.unlockCache == .kernelKeyring)
        let vault = Vault(
            path: path, configuration: configuration,
            state: State(database: database, header: header, keys: keys, rememberedGeneration: remembered), claim: claim)
        // The header and the integrity state are checked on every open, with whatever keys
        // this machine holds now (none before its first unlock: then at the first read).
        if checked {
            try vault.withState { state throws(LockboxError) in
                try state.database.readTransaction { () throws(LockboxError) in _ = try vault.currentIntegrity(state) }
            }
        }
        return vault
    }

    // MARK: Lock state

    /// Unlocks with a passphrase.
    ///
    /// Repeated failures make the next attempt wait: nothing for the first three, then 1 s,
    /// 2 s, 4 s ... up to 30 s, counted in the vault file so every process shares the count.
    /// - Throws: `authFailed` for a wrong passphrase; `decode` when the header was modified.
    public func unlock(passphrase: SecretBytes) throws(LockboxError) {
        let verified = try checkPassphrase(passphrase, failure: "The passphrase is wrong")
        try withState { state throws(LockboxError) in
            try finishUnlock(master: verified.master, presenceSecretKey: verified.presence, state: state)
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
                slot.wrappedMasterKey, key: try Self.deviceSlotKey(state.device), associatedData: header.slotAssociatedData(slot))
            else {
                throw LockboxError(
                    .authFailed, "This keychain's passphrase-free unlock belongs to another machine; it cannot be unlocked here.")
            }
            try finishUnlock(master: master, presenceSecretKey: nil, state: state)
        }
    }

    /// After a slot opened: check the header, bring an older file up to date, give this
    /// machine its class keys, cache.
    func finishUnlock(master: SecretBytes, presenceSecretKey: SecretBytes?, state: State) throws(LockboxError) {
        state.header = try VaultHeader.load(from: state.database)
        guard state.header.verify(master: master) else {
            throw LockboxError.integrity("The keychain header")
        }
        try upgradeRows(state, master: master, presenceSecretKey: presenceSecretKey)
        let previous = try state.header.openPreviousMasters(master: master)
        var header = state.header
        let rewrapped = try Self.rewrapFromPreviousMasters(&header, master: master, previous: previous, device: state.device)
        let added = try KeyCache.addMissingClassKeys(to: &header, master: master, device: state.device)
        if added || rewrapped {
            // First unlock on this machine: its ThisDeviceOnly classes and its copy of the
            // `always` key; or its class keys were still wrapped by an earlier master key.
            try commitHeaderChange(state, master: master) { current throws(LockboxError) in
                _ = try Self.rewrapFromPreviousMasters(&current, master: master, previous: previous, device: state.device)
                _ = try KeyCache.addMissingClassKeys(to: &current, master: master, device: state.device)
            }
        }
        try cacheUnlockedKeys(master: master, state: state)
        // Checked without keys before (no device secret for the `always` key): check it again.
        if state.integrity?.keys == nil { state.integrity = nil }
        try clearFailedAttempts(state)
        markExplicitLock(state)
    }

    /// This machine's `*ThisDeviceOnly` class keys still wrapped by an earlier master key (the
    /// passphrase was changed on another machine sharing the file) are wrapped by the current one.
    static func rewrapFromPreviousMasters(
        _ header: inout VaultHeader, master: SecretBytes, previous: [SecretBytes], device: DeviceSecret
    ) throws(LockboxError) -> Bool {
        guard !previous.isEmpty else { return false }
        var changed = false
        for accessibility in Accessibility.allCases where accessibility.isThisDeviceOnly {
            guard let id = KeyCache.masterEntry(accessibility, device: device, header: header), header.wrappedClassKeys[id] != nil,
                let current = KeyCache.wrappingKey(for: id, master: master, device: device, header: header),
                KeyCache.openEntry(id, header: header, wrappingKey: current) == nil,
                let key = try KeyCache.unwrapClassKey(accessibility, header: header, master: master, device: device, previousMasters: previous)
            else { continue }
            KeyCache.seal(key, as: id, in: &header, master: master, device: device)
            changed = true
        }
        return changed
    }

    // MARK: Passphrase checks

    /// What a correct passphrase opens.
    struct VerifiedPassphrase: Sendable {
        let master: SecretBytes
        let presence: SecretBytes?
        let header: VaultHeader
    }

    /// Checks `passphrase` against the passphrase slots, throttled by the shared attempt
    /// counter. The wait and Argon2id run outside the vault's lock, so a `lock()` from another
    /// thread never waits behind them; the lock is taken only to read the header and to record
    /// the outcome.
    func checkPassphrase(_ passphrase: SecretBytes, failure: String) throws(LockboxError) -> VerifiedPassphrase {
        for _ in 0..<3 {
            let (header, wait): (VaultHeader, Duration) = try withState { state throws(LockboxError) in
                let header = try VaultHeader.load(from: state.database)
                state.header = header
                return (header, try delayBeforeNextCheck(state))
            }
            configuration.clock.sleep(for: wait)
            let derived = try Self.deriveSlotKeys(header, passphrase: passphrase)
            let outcome: VerifiedPassphrase? = try withState { state throws(LockboxError) -> VerifiedPassphrase? in
                let current = try VaultHeader.load(from: state.database)
                // Another process changed the slots meanwhile: derive again.
                guard current.authenticatedBytes() == header.authenticatedBytes() else { return nil }
                state.header = current
                if let (master, presence) = Self.openPassphraseSlot(current, slotKeys: derived) {
                    try clearFailedAttempts(state)
                    return VerifiedPassphrase(master: master, presence: presence, header: current)
                }
                throw wrongPassphrase(failures: try recordFailedAttempt(state), failure)
            }
            if let outcome { return outcome }
        }
        throw LockboxError(.io, "The keychain's passphrase changed while it was being checked. Try again.")
    }

    /// Argon2id for every passphrase slot (there is one). Refuses parameters below the floor:
    /// they can only come from an edited file.
    static func deriveSlotKeys(_ header: VaultHeader, passphrase: SecretBytes) throws(LockboxError) -> [(Int, SecretBytes)] {
        var keys: [(Int, SecretBytes)] = []
        for slot in header.slots where slot.kind == .passphrase {
            keys.append((slot.id, try deriveSlotKey(slot, passphrase: passphrase)))
        }
        return keys
    }

    static func deriveSlotKey(_ slot: VaultHeader.KeySlot, passphrase: SecretBytes) throws(LockboxError) -> SecretBytes {
        guard let derivation = PassphraseKeyDerivation(decoding: slot.parameters), derivation.meetsMinimum else {
            throw LockboxError(
                .decode,
                "The keychain header's key-derivation parameters are missing or below Lockbox's minimum: "
                    + "the file was modified outside Lockbox. Restore it from a backup.")
        }
        guard let slotKey = try derivation.deriveKey(from: passphrase) else {
            throw LockboxError(.allocate, "Not enough memory to derive the key from the passphrase (Argon2id).")
        }
        return slotKey
    }

    /// The master and presence keys from the first passphrase slot its derived key opens.
    static func openPassphraseSlot(_ header: VaultHeader, slotKeys: [(Int, SecretBytes)]) -> (SecretBytes, SecretBytes?)? {
        for slot in header.slots where slot.kind == .passphrase {
            guard let slotKey = slotKeys.first(where: { $0.0 == slot.id })?.1 else { continue }
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

    static func deviceSlotKey(_ device: DeviceSecret) throws(LockboxError) -> SecretBytes {
        Crypto.combine(try device.secret, with: SecretBytes(utf8: "slot"), context: "lockbox.device-slot.v1")
    }

    /// Locks: `whenUnlocked*` items become unreadable (-25308) in every process until the
    /// next unlock. `afterFirstUnlock*` items stay readable until reboot, as on iOS. An explicit
    /// lock holds: no unlock method opens the vault again by itself (see
    /// ``mayUnlockAutomatically``) until an explicit unlock.
    public func lock() {
        withState { state in
            state.lockCount += 1
            state.keys.lock()
            state.integrity = nil
            markExplicitLock(state)
        }
        lockObservers.notify()
    }

    /// Locks the vault at `path` without checking its contents first: a file that fails its
    /// integrity checks can still be locked (its keys leave the kernel keyring).
    /// - Parameter all: forget the after-first-unlock keys too, as ``lockAll()`` does.
    public static func lock(at path: String, configuration: Configuration = Configuration(), all: Bool) throws(LockboxError) {
        let vault = try open(at: path, configuration: configuration, checked: false)
        if all { vault.lockAll() } else { vault.lock() }
    }

    /// Takes this vault's keys out of the kernel keyring, whatever this handle caches in (its
    /// process memory, for `lockboxd`): what programs that opened the vault directly left there
    /// for the user's other processes. The generation record, which is no key, stays. What
    /// `lockboxd` does as it claims the vault, so that no key of it stays where a copy of the
    /// file could be opened with it while the broker alone holds the keys.
    package func removeKeysFromKernelKeyring() {
        KeyCache.removeSharedKeys(vaultID: withState { state in state.header.vaultID.hexString })
    }

    /// Forgets every cached key, as a reboot does (`afterFirstUnlock*` items lock too).
    public func lockAll() {
        withState { state in
            state.lockCount += 1
            state.keys.forgetAll()
            state.integrity = nil
            markExplicitLock(state)
        }
        lockObservers.notify()
    }

    /// What a passphrase change did.
    public struct PassphraseChange: Sendable, Equatable {
        /// Items resealed under the new keys.
        public var resealedItems: Int
        /// Unlock methods that wrapped the old master key and were removed (enroll them again).
        public var removedUnlockMethods: [String]
    }

    /// Replaces the passphrase and rotates the keys: a new master key and new class keys, and
    /// every item this machine can open is resealed, so an old copy of the header with the old
    /// passphrase opens nothing written afterwards. Other machines' `*ThisDeviceOnly` class
    /// keys cannot be rewrapped here: the old master key is kept, sealed with the new one, only
    /// for them. An outside unlock method (the desktop keyring) held the old master key's
    /// wrapping key and is removed: enroll it again.
    /// - Throws: `authFailed` when `old` is wrong.
    @discardableResult
    public func changePassphrase(from old: SecretBytes, to new: SecretBytes) throws(LockboxError) -> PassphraseChange {
        guard !new.isEmpty else {
            throw LockboxError(.param, "The new passphrase is empty.")
        }
        let verified = try checkPassphrase(old, failure: "The current passphrase is wrong; nothing was changed")
        guard let presence = verified.presence else { throw LockboxError.integrity("The keychain's presence key") }
        guard let slotIndex = verified.header.slots.firstIndex(where: { $0.kind == .passphrase }) else {
            throw LockboxError(.notAvailable, "This keychain has no passphrase slot to change.")
        }
        // Argon2id for the new slot, outside the lock.
        let newMaster = Crypto.generateKey()
        let slot = VaultHeader.KeySlot(
            id: verified.header.slots[slotIndex].id, kind: .passphrase,
            parameters: configuration.keyDerivation.parameters.encoded(), wrappedMasterKey: [])
        let slotKey = try Self.deriveSlotKey(slot, passphrase: new)
        return try withState { state throws(LockboxError) -> PassphraseChange in
            try upgradeRows(state, master: verified.master, presenceSecretKey: presence)
            // The kernel keyring's keys are dropped before the rotation commits and stored anew
            // after: a process killed in between leaves the keychain locked, to be unlocked with
            // the passphrase that was committed, never stale keys that no longer open the file
            // (which would read as damage). Meanwhile other processes find it locked.
            state.keys.forgetAll()
            state.integrity = nil
            let change: PassphraseChange
            do throws(LockboxError) {
                change = try rotateKeys(
                    state, oldMaster: verified.master, newMaster: newMaster, presence: presence, expected: verified.header
                ) { header throws(LockboxError) in
                    guard let index = header.slots.firstIndex(where: { $0.id == slot.id && $0.kind == .passphrase }) else {
                        throw LockboxError(.io, "The keychain's passphrase changed while it was being changed. Try again.")
                    }
                    header.slots[index] = Self.wrap(slot, master: newMaster, presenceKey: presence, slotKey: slotKey, header: header)
                }
            } catch {
                // Nothing was changed: the keychain stays unlocked with the keys it had. The
                // header is read again (another process may have changed it meanwhile); when the
                // file cannot be read now (the storage fault that failed the change), the handle's
                // header is the one the rotation found, which the rollback left in the file.
                state.header = (try? VaultHeader.load(from: state.database)) ?? state.header
                try? cacheUnlockedKeys(master: verified.master, state: state)
                throw error
            }
            try cacheUnlockedKeys(master: newMaster, state: state)
            markExplicitLock(state)
            return change
        }
    }

    /// Removes the passphrase, as turning off an iPhone's passcode does: the vault then
    /// unlocks with this machine's device secret alone (``unlock()``), every
    /// `whenPasscodeSetThisDeviceOnly` item and every access-controlled item is deleted, and
    /// that class's key is destroyed.
    /// - Returns: the number of items deleted.
    @discardableResult
    public func removePassphrase(_ current: SecretBytes) throws(LockboxError) -> Int {
        let verified = try checkPassphrase(current, failure: "The passphrase is wrong; nothing was changed")
        return try withState { state throws(LockboxError) -> Int in
            let master = verified.master
            try upgradeRows(state, master: master, presenceSecretKey: verified.presence)
            try cacheUnlockedKeys(master: master, state: state)
            let count = try writeRows(state) { writer throws(LockboxError) -> Int in
                var header = try VaultHeader.load(from: state.database)
                guard header.authenticatedBytes() == verified.header.authenticatedBytes() || header.verify(master: master) else {
                    throw LockboxError.integrity("The keychain header")
                }
                let doomed = try rows(
                    state, where: "accessibility = 'whenPasscodeSetThisDeviceOnly' OR access_control != ''")
                for row in doomed { try writer.delete(row) }
                header.slots.removeAll { $0.kind == .passphrase }
                let nextID = (header.slots.map(\.id).max() ?? 0) + 1
                var slot = VaultHeader.KeySlot(id: nextID, kind: .device, parameters: [], wrappedMasterKey: [])
                slot.wrappedMasterKey = Crypto.seal(
                    master, key: try Self.deviceSlotKey(state.device), associatedData: header.slotAssociatedData(slot))
                header.slots.removeAll { $0.kind == .device }
                header.slots.append(slot)
                header.wrappedClassKeys = header.wrappedClassKeys.filter { $0.accessibility != .whenPasscodeSetThisDeviceOnly }
                header.presencePublicKey = nil
                header.seal(master: master)
                try header.save(to: state.database)
                state.header = header
                return doomed.count
            }
            state.keys.forgetDerivedKeys()
            try cacheUnlockedKeys(master: master, state: state)
            state.database.truncateWriteAheadLog()
            return count
        }
    }

    /// How many items ``removePassphrase(_:)`` would delete (for a confirmation prompt).
    public func itemsDeletedByRemovingPassphrase() throws(LockboxError) -> Int {
        try withState { state throws(LockboxError) -> Int in
            try state.database.firstRow(
                "SELECT count(*) FROM items WHERE accessibility = 'whenPasscodeSetThisDeviceOnly' OR access_control != ''"
            ) { $0.integer(0) ?? 0 } ?? 0
        }
    }

    /// Sets a passphrase on a vault that has none (after ``removePassphrase(_:)``). The vault
    /// must be unlocked. `whenPasscodeSetThisDeviceOnly` becomes usable again.
    public func setPassphrase(_ new: SecretBytes) throws(LockboxError) {
        guard !new.isEmpty else { throw LockboxError(.param, "The new passphrase is empty.") }
        let (hasPassphrase, nextID): (Bool, Int) = withState { state in
            (state.header.hasPassphrase, (state.header.slots.map(\.id).max() ?? 0) + 1)
        }
        guard !hasPassphrase else {
            throw LockboxError(.param, "This keychain already has a passphrase; use change-passphrase.")
        }
        // Argon2id outside the lock.
        let slot = VaultHeader.KeySlot(
            id: nextID, kind: .passphrase, parameters: configuration.keyDerivation.parameters.encoded(), wrappedMasterKey: [])
        let slotKey = try Self.deriveSlotKey(slot, passphrase: new)
        try withState { state throws(LockboxError) in
            guard let master = try state.keys.currentMaster() else { throw lockedError() }
            try commitHeaderChange(state, master: master) { header throws(LockboxError) in
                guard !header.hasPassphrase else {
                    throw LockboxError(.param, "This keychain already has a passphrase; use change-passphrase.")
                }
                header.slots.removeAll { $0.kind == .device }
                let presence = Crypto.generateKeyPair()
                header.presencePublicKey = presence.publicKey
                header.slots.append(Self.wrap(slot, master: master, presenceKey: presence.secretKey, slotKey: slotKey, header: header))
                _ = try KeyCache.addMissingClassKeys(to: &header, master: master, device: state.device)
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
            let failed = try readAttempts(state).failures
            let generation = try IntegrityState.loadGeneration(from: state.database)
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
                unlockMethods: state.header.slots.map { $0.kind == .external ? $0.externalKind : $0.kind.rawValue },
                unlockCache: configuration.unlockCache,
                failedUnlockAttempts: failed, schemaVersion: VaultSchema.current,
                itemsBoundToOtherMachines: foreign.integer(0) ?? 0, hasPassphrase: state.header.hasPassphrase,
                generation: generation, explicitlyLocked: isExplicitlyLocked(state))
        }
    }

    /// Runs `body` with the vault's state locked, then resets every statement so no read
    /// snapshot outlives the operation (a stale snapshot would hide other processes' writes).
    func withState<T>(_ body: (State) throws(LockboxError) -> sending T) throws(LockboxError) -> sending T {
        try state.withLock { state throws(LockboxError) -> sending T in
            state.keys.beginOperation()
            defer { state.database.resetStatements() }
            do throws(LockboxError) {
                return try body(state)
            } catch where error.code == .decode && state.keys.mode == .kernelKeyring {
                throw Self.sayingKernelKeyring(error)
            }
        }
    }

    /// An integrity failure found with keys read from the kernel keyring, which this user's
    /// processes can change as they can change the file: a changed key fails the same checks a
    /// changed file does. The error then names both, and the way to tell them apart before a
    /// restore (before, it blamed the file alone and sent the user to a backup).
    static func sayingKernelKeyring(_ error: LockboxError) -> LockboxError {
        let fileAlone = "the keychain file was modified or is damaged. Restore it from a backup."
        guard error.message.hasSuffix(fileAlone) else { return error }
        return LockboxError(
            .decode,
            error.message.dropLast(fileAlone.count)
                + "the keychain file was modified or is damaged, or the unlocked keys this user's kernel keyring holds for it were "
                + "changed. Run `lockbox lock --all`, unlock it again and run `lockbox verify`; restore it from a backup only if "
                + "it still fails.",
            cause: error.cause)
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

    /// A passphrase slot wrapping `master` and the presence key with a derived slot key.
    static func wrap(
        _ slot: VaultHeader.KeySlot, master: SecretBytes, presenceKey: SecretBytes, slotKey: SecretBytes, header: VaultHeader
    ) -> VaultHeader.KeySlot {
        var slot = slot
        slot.wrappedMasterKey = Crypto.seal(master, key: slotKey, associatedData: header.slotAssociatedData(slot))
        slot.wrappedPresenceKey = Crypto.seal(
            presenceKey, key: slotKey, associatedData: header.slotAssociatedData(slot, purpose: "presence"))
        return slot
    }

    func cacheUnlockedKeys(master: SecretBytes, state: State) throws(LockboxError) {
        var classKeys = SmallMap<Accessibility, SecretBytes>()
        for accessibility in AfterFirstUnlockKeys.classes {
            if accessibility.isThisDeviceOnly && state.device.unavailability != nil {
                // Without the device secret: a mark, never a key (see `KeyCache.classKey(for:)`).
                classKeys[accessibility] = KeyCache.unavailableClassKey
                continue
            }
            guard let key = try KeyCache.unwrapClassKey(accessibility, header: state.header, master: master, device: state.device) else {
                throw LockboxError.integrity("The \(accessibility.rawValue) class key")
            }
            classKeys[accessibility] = key
        }
        let afterFirstUnlock = AfterFirstUnlockKeys(indexRoot: try state.header.indexRoot(master: master), classKeys: classKeys)
        try state.keys.store(master: master, afterFirstUnlock: afterFirstUnlock, idleTimeout: configuration.idleTimeout.wholeSecondsRoundedUp)
    }

    package static func delay(afterFailures failures: Int) -> Int {
        guard failures >= 3 else { return 0 }
        return min(30, 1 << min(failures - 3, 5))
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
    /// The vault's write generation (nil for a file from before schema 2 not yet upgraded).
    public var generation: Int?
    /// Locked on purpose (`lock`): no unlock method reopens it by itself.
    public var explicitlyLocked: Bool
}

extension UnlockCache: Codable {}
