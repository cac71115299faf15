import KeyProviders
import LockboxCore
import VaultCrypto

#if canImport(Glibc)
import Glibc
#endif

/// Where a vault keeps its unlocked key material between operations.
public enum UnlockCache: String, Sendable, Hashable, CaseIterable {
    /// The Linux kernel keyring (`@u`): shared by all of the user's processes, never swapped,
    /// forgotten at `lock`, after the idle timeout, and at reboot. The default.
    case kernelKeyring
    /// This process only: every other process must unlock on its own. For services that
    /// cannot use the kernel keyring (some containers forbid `keyctl`).
    case processMemory
}

/// The keys that stay available from the first unlock until reboot: the lookup-index root
/// and the class keys of the `afterFirstUnlock*` classes.
struct AfterFirstUnlockKeys {
    static let classes: [Accessibility] = [.afterFirstUnlock, .afterFirstUnlockThisDeviceOnly]
    static let keysByteCount = Crypto.keyByteCount * (1 + classes.count)

    let indexRoot: SecretBytes
    let classKeys: SmallMap<Accessibility, SecretBytes>
    /// The entry was kept by a process with another device secret (another device key file:
    /// another `XDG_STATE_HOME`, say): its `*ThisDeviceOnly` class keys are that device's, so
    /// they were replaced by ``KeyCache/unavailableClassKey`` when it was read.
    private(set) var keptForAnotherDevice = false

    /// Layout for the kernel keyring: index root, then the class keys in ``classes`` order,
    /// 32 bytes each; then the entry's bookkeeping, which is not secret: the unlock time
    /// (seconds since 1970, 8 bytes little-endian), the vault file's path (UTF-8), by which
    /// stale entries are found and freed, a zero byte and the identifier of the device secret
    /// the `*ThisDeviceOnly` class keys belong to.
    func packed(unlockedAt time: Int64, path: String, device: String) -> SecretBytes {
        // A path too long to keep is not kept at all: a cut one would name another file, whose
        // absence would free these keys as a deleted vault's at the next unlock of any vault.
        let whole = Array(path.utf8)
        let pathBytes = whole.count <= KeyCache.maximumStoredPathByteCount && !whole.contains(0) ? whole : []
        let deviceBytes = [0] + Array(device.utf8)
        let size = Self.keysByteCount + 8 + pathBytes.count + deviceBytes.count
        return SecretBytes(capacity: size) { buffer in
            var offset = 0
            for key in [indexRoot] + Self.classes.map({ classKeys[$0]! }) {
                key.withUnsafeBytes { bytes in
                    UnsafeMutableRawBufferPointer(rebasing: buffer[offset..<offset + bytes.count]).copyMemory(from: bytes)
                }
                offset += Crypto.keyByteCount
            }
            withUnsafeBytes(of: time.littleEndian) { bytes in
                UnsafeMutableRawBufferPointer(rebasing: buffer[offset..<offset + 8]).copyMemory(from: bytes)
            }
            offset += 8
            for bytes in [pathBytes, deviceBytes] {
                bytes.withUnsafeBytes { bytes in
                    UnsafeMutableRawBufferPointer(rebasing: buffer[offset..<offset + bytes.count]).copyMemory(from: bytes)
                }
                offset += bytes.count
            }
            return size
        }
    }

    init(indexRoot: SecretBytes, classKeys: SmallMap<Accessibility, SecretBytes>) {
        self.indexRoot = indexRoot
        self.classKeys = classKeys
    }

    /// The keys of a payload made by ``packed(unlockedAt:path:device:)`` (or by earlier
    /// releases, which stored the keys alone, or no device). The `*ThisDeviceOnly` class keys
    /// of an entry another device secret kept are not taken: they would open nothing of this
    /// device's (and read as damage), so they read as not kept.
    init?(unpacking payload: SecretBytes, device: String) {
        let size = Crypto.keyByteCount
        guard payload.count == Self.keysByteCount || payload.count >= Self.keysByteCount + 8 else { return nil }
        func slice(_ index: Int) -> SecretBytes {
            payload.withUnsafeBytes { bytes in
                SecretBytes(copying: UnsafeRawBufferPointer(rebasing: bytes[index * size..<(index + 1) * size]))
            }
        }
        let writer = Self.bookkeeping(of: payload).device
        let foreign = writer != nil && writer != device
        indexRoot = slice(0)
        var keys = SmallMap<Accessibility, SecretBytes>()
        for (offset, accessibility) in Self.classes.enumerated() {
            keys[accessibility] = foreign && accessibility.isThisDeviceOnly ? KeyCache.unavailableClassKey : slice(offset + 1)
        }
        classKeys = keys
        keptForAnotherDevice = foreign
    }

    /// The unlock time, vault path and device of a packed payload; (0, nil, nil) for an entry
    /// of an earlier release, which makes it the first to go.
    static func bookkeeping(of payload: SecretBytes) -> (unlockedAt: Int64, path: String?, device: String?) {
        guard payload.count >= keysByteCount + 8 else { return (0, nil, nil) }
        return payload.withUnsafeBytes { bytes in
            let time = (0..<8).reduce(Int64(0)) { $0 | Int64(bytes[keysByteCount + $1]) << (8 * Int64($1)) }
            let rest = bytes[(keysByteCount + 8)...]
            let end = rest.firstIndex(of: 0) ?? rest.endIndex
            let path = String(decoding: rest[..<end], as: UTF8.self)
            let device = end < rest.endIndex ? String(decoding: rest[(end + 1)...], as: UTF8.self) : nil
            return (time, path.isEmpty ? nil : path, device)
        }
    }
}

/// The unlocked keys of one vault handle, and where they are shared with other processes.
///
/// In kernel-keyring mode every operation checks (one system call) that the cached key is
/// still in the keyring, so a `lock` from any process takes effect in all of them at once.
///
/// Each unlocked vault holds two entries in the `lockbox` keyring (see ``KernelKeyring``): the
/// master key, with the idle timeout as its kernel timeout, and the after-first-unlock keys,
/// kept until reboot or `lock --all`. An ordinary user may hold 200 keys and 20,000 bytes in
/// all, so every unlock first frees what is stale: the entries of vaults whose file is gone,
/// and the least recently unlocked vaults' entries beyond ``maximumCachedVaults`` (half the
/// quota). A vault whose entries were freed reads as locked (never as empty) until it is
/// unlocked again.
final class KeyCache {
    /// Vaults whose keys stay in the kernel keyring at once: Lockbox takes at most half of
    /// this user's quota, at 3 entries (two keys and the generation, ``RememberedGeneration``)
    /// and at most about 480 bytes per vault. For an ordinary user (200 keys, 20,000 bytes)
    /// that is 20 vaults; root's quota is far larger.
    static let maximumCachedVaults: Int = {
        let root = getuid() == 0
        let keys = kernelSetting(root ? "root_maxkeys" : "maxkeys") ?? 200
        let bytes = kernelSetting(root ? "root_maxbytes" : "maxbytes") ?? 20_000
        return min(1024, max(8, min(keys / 2 / 3, bytes / 2 / 480)))
    }()
    /// Longer paths are not stored: such an entry is freed by age only, never as stale.
    static let maximumStoredPathByteCount = 160

    let mode: UnlockCache
    let device: DeviceSecret
    let vaultID: [UInt8]
    /// The vault file, stored with the keys so that entries of deleted vaults can be freed.
    let path: String
    private let masterDescription: String
    private let afterFirstUnlockDescription: String

    private var masterSerial: KernelKeyring.Serial?
    private var afterFirstUnlockSerial: KernelKeyring.Serial?
    private var master: SecretBytes?
    private var idleTimeout: UInt32 = 0
    private var lastUse: Duration = .zero
    /// Measures the idle timeout.
    let clock: any LockboxClock
    private var afterFirstUnlock: AfterFirstUnlockKeys?
    private var whileUnlockedClassKeys = KeySlots<Accessibility>()
    private var indexKeys = KeySlots<ItemClass>()
    private var alwaysClassKeys = KeySlots<Accessibility>()
    /// Keys already checked against the kernel keyring during the current operation: one
    /// system call per key and operation is enough.
    private var masterCheckedThisOperation = false
    private var afterFirstUnlockCheckedThisOperation = false

    init(vaultID: [UInt8], mode: UnlockCache, device: DeviceSecret, path: String, clock: any LockboxClock) {
        self.clock = clock
        self.mode = mode
        self.device = device
        self.vaultID = vaultID
        self.path = path
        masterDescription = Self.description(vaultID: vaultID.hexString, kind: .master)
        afterFirstUnlockDescription = Self.description(vaultID: vaultID.hexString, kind: .afterFirstUnlock)
    }

    enum EntryKind: String, CaseIterable {
        case master = "unlocked"
        case afterFirstUnlock = "after-first-unlock"
        /// Not a key: the highest generation of the vault seen by any of the user's processes
        /// (``RememberedGeneration``).
        case generation
    }

    static let descriptionPrefix = "lockbox:v1:"

    /// Removes the vault's keys from the kernel keyring (best effort: none there, or no keyring,
    /// is nothing to remove); its generation record stays.
    static func removeSharedKeys(vaultID: String) {
        for kind in [EntryKind.master, .afterFirstUnlock] {
            try? KernelKeyring.remove(description: description(vaultID: vaultID, kind: kind))
        }
    }

    /// `lockbox:v1:<vault id>:unlocked` and `lockbox:v1:<vault id>:after-first-unlock`.
    static func description(vaultID: String, kind: EntryKind) -> String {
        "\(descriptionPrefix)\(vaultID):\(kind.rawValue)"
    }

    /// The message for a cache that cannot be used, naming the alternative (and for a full
    /// quota, the quota and how to make room).
    static func unavailableError(_ failure: KernelKeyring.Failure) -> LockboxError {
        if failure.isQuotaExceeded {
            let prefix = getuid() == 0 ? "root_" : ""
            let keys = Self.kernelSetting(prefix + "maxkeys").map { "\($0) keys" } ?? "a number of keys"
            let bytes = Self.kernelSetting(prefix + "maxbytes").map { "\($0) bytes" } ?? "a number of bytes"
            return LockboxError(
                .notAvailable,
                "The kernel keyring quota of user \(getuid()) is full (\(failure.reason)): each user may keep \(keys) "
                    + "and \(bytes) (/proc/sys/kernel/keys/maxkeys and /proc/sys/kernel/keys/maxbytes), shared with "
                    + "every other program, and Lockbox has already freed its own stale entries. Make room with "
                    + "`lockbox lock --all` on vaults you are not using, or free other programs' keys (`keyctl show @u`); "
                    + "or raise the quota as root (`sysctl kernel.keys.maxbytes=100000 kernel.keys.maxkeys=1000`); or "
                    + "keep unlocked keys in this process only (LOCKBOX_UNLOCK_CACHE=process).",
                cause: failure.cause)
        }
        return LockboxError(
            .notAvailable,
            "The kernel keyring is not available here (\(failure.reason)). Unlocked keys cannot be shared between "
                + "processes; open the vault with `unlockCache: .processMemory` (LOCKBOX_UNLOCK_CACHE=process) "
                + "to keep them in this process only.",
            cause: failure.cause)
    }

    private static func kernelSetting(_ name: String) -> Int? {
        let descriptor = open("/proc/sys/kernel/keys/\(name)", O_RDONLY | O_CLOEXEC)
        guard descriptor >= 0 else { return nil }
        defer { close(descriptor) }
        var buffer = [UInt8](repeating: 0, count: 32)
        let count = buffer.withUnsafeMutableBytes { read(descriptor, $0.baseAddress, $0.count) }
        guard count > 0 else { return nil }
        return Int(String(decoding: buffer[..<count].filter { $0 != UInt8(ascii: "\n") }, as: UTF8.self))
    }

    /// Throws the cache's own error when `mode` cannot be used in this process (the kernel
    /// keyring forbidden, as in some containers), so that a vault is not created that could
    /// never be unlocked here.
    static func checkUsable(_ mode: UnlockCache) throws(LockboxError) {
        guard mode == .kernelKeyring else { return }
        do throws(KernelKeyring.Absence) {
            _ = try KernelKeyring.find(descriptionPrefix + "probe:absent")
        } catch {
            if let failure = unavailableError(error) { throw failure }
        }
    }

    private static func unavailableError(_ absence: KernelKeyring.Absence) -> LockboxError? {
        guard case .unavailable(let failure) = absence else { return nil }
        return unavailableError(failure)
    }

    /// Starts an operation: the next use of each key checks the kernel keyring again.
    func beginOperation() {
        masterCheckedThisOperation = false
        afterFirstUnlockCheckedThisOperation = false
    }

    // MARK: Unlock and lock

    /// Keeps freshly unlocked keys: the master key (until `lock` or the idle timeout) and the
    /// after-first-unlock keys (until reboot).
    func store(master: SecretBytes, afterFirstUnlock keys: AfterFirstUnlockKeys, idleTimeout: UInt32) throws(LockboxError) {
        dropWhileUnlocked()
        self.idleTimeout = idleTimeout
        switch mode {
        case .kernelKeyring:
            let masterPayload = SecretBytes(capacity: Crypto.keyByteCount + 4) { buffer in
                master.withUnsafeBytes { buffer.copyMemory(from: $0) }
                withUnsafeBytes(of: idleTimeout.littleEndian) { timeout in
                    UnsafeMutableRawBufferPointer(rebasing: buffer[Crypto.keyByteCount...]).copyMemory(from: timeout)
                }
                return Crypto.keyByteCount + 4
            }
            let afterFirstUnlockPayload = keys.packed(
                unlockedAt: Int64(time(nil)), path: Self.fileSystemView + "\u{1}" + Self.absolute(path), device: device.identifier)
            do throws(KernelKeyring.Failure) {
                try Self.freeStaleEntries(keeping: vaultID.hexString, bound: Self.maximumCachedVaults)
                do throws(KernelKeyring.Failure) {
                    try storeEntries(master: masterPayload, afterFirstUnlock: afterFirstUnlockPayload)
                } catch where error.isQuotaExceeded {
                    // Other programs filled the quota: make room from our own entries only.
                    try Self.freeStaleEntries(keeping: vaultID.hexString, bound: 1)
                    try storeEntries(master: masterPayload, afterFirstUnlock: afterFirstUnlockPayload)
                }
            } catch {
                throw Self.unavailableError(error)
            }
        case .processMemory:
            break
        }
        self.master = master
        self.afterFirstUnlock = keys
        lastUse = clock.uptime()
    }

    private func storeEntries(master: SecretBytes, afterFirstUnlock: SecretBytes) throws(KernelKeyring.Failure) {
        afterFirstUnlockSerial = try KernelKeyring.store(afterFirstUnlock, description: afterFirstUnlockDescription, timeout: nil)
        masterSerial = try KernelKeyring.store(master, description: masterDescription, timeout: idleTimeout == 0 ? nil : idleTimeout)
    }

    /// Frees the `lockbox` keyring's entries of vaults whose file no longer exists, then those
    /// of the least recently unlocked vaults until fewer than `bound` other vaults remain.
    /// The vault `current` is never touched.
    static func freeStaleEntries(keeping current: String, bound: Int) throws(KernelKeyring.Failure) {
        struct CachedVault {
            var serials: [KernelKeyring.Serial] = []
            var unlockedAt: Int64 = 0
        }
        var vaults: [String: CachedVault] = [:]
        for entry in try KernelKeyring.entries() where entry.description.hasPrefix(descriptionPrefix) {
            let parts = entry.description.dropFirst(descriptionPrefix.count).split(separator: ":")
            guard parts.count == 2, let kind = EntryKind(rawValue: String(parts[1])) else { continue }
            let vaultID = String(parts[0])
            guard vaultID != current else { continue }
            vaults[vaultID, default: CachedVault()].serials.append(entry.serial)
            guard kind == .afterFirstUnlock, let payload = try? KernelKeyring.read(entry.serial) else { continue }
            let (unlockedAt, path, _) = AfterFirstUnlockKeys.bookkeeping(of: payload)
            if let path, !fileMayExist(path) {
                vaults[vaultID]!.unlockedAt = -1  // stale: freed below whatever the bound
            } else {
                vaults[vaultID]!.unlockedAt = unlockedAt
            }
        }
        let oldestFirst = vaults.values.sorted { $0.unlockedAt < $1.unlockedAt }
        var remaining = oldestFirst.count
        for vault in oldestFirst where vault.unlockedAt < 0 || remaining >= bound {
            for serial in vault.serials { try KernelKeyring.remove(serial) }
            remaining -= 1
        }
    }

    /// Which file system a path was recorded in: the mount namespace and the root directory. The
    /// kernel keyring is shared by every process of the user, also in a chroot or a container
    /// of the same user, where the same path may not exist: an entry recorded in another view
    /// is never judged stale by its path.
    static let fileSystemView: String = {
        var buffer = [CChar](repeating: 0, count: 128)
        let count = readlink("/proc/self/ns/mnt", &buffer, buffer.count - 1)
        let namespace = count > 0 ? String(decoding: buffer[0..<count].map { UInt8(bitPattern: $0) }, as: UTF8.self) : "?"
        var root = stat()
        let rootIdentity = stat("/", &root) == 0 ? "\(root.st_dev):\(root.st_ino)" : "?"
        return namespace + "@" + rootIdentity
    }()

    /// False only when the file certainly does not exist (a permission error keeps it), in this
    /// process's view of the file system.
    private static func fileMayExist(_ recorded: String) -> Bool {
        var path = recorded
        if let separator = recorded.firstIndex(of: "\u{1}") {
            guard recorded[..<separator] == fileSystemView else { return true }
            path = String(recorded[recorded.index(after: separator)...])
        }
        var info = stat()
        if stat(path, &info) == 0 { return true }
        return errno != ENOENT && errno != ENOTDIR
    }

    private static func absolute(_ path: String) -> String {
        guard !path.hasPrefix("/") else { return path }
        guard let directory = getcwd(nil, 0) else { return path }
        defer { free(directory) }
        return String(cString: directory) + "/" + path
    }

    /// Forgets the master key everywhere (this process and the kernel keyring). The
    /// after-first-unlock keys stay, as on iOS after the device locks.
    func lock() {
        if mode == .kernelKeyring {
            Self.removeOrCrash(masterSerial, description: masterDescription)
        }
        masterSerial = nil
        dropWhileUnlocked()
    }

    /// Forgets every key, as a reboot does.
    func forgetAll() {
        lock()
        if mode == .kernelKeyring {
            Self.removeOrCrash(afterFirstUnlockSerial, description: afterFirstUnlockDescription)
        }
        afterFirstUnlockSerial = nil
        afterFirstUnlock = nil
        indexKeys.removeAll()
    }

    /// Whether the kernel keyring's entries this handle read its keys from were replaced or
    /// removed since (another process changed the passphrase, or locked): then every key read
    /// from them, or derived, is dropped here, to be read again at the next use. A handle that
    /// read its keys just before another process's passphrase change committed would otherwise
    /// check the new file with the old keys, and take it for damaged.
    func dropIfReplaced() -> Bool {
        guard mode == .kernelKeyring else { return false }
        func replaced(_ serial: KernelKeyring.Serial?, _ description: String) -> Bool {
            guard let serial else { return false }
            guard (try? KernelKeyring.isValid(serial)) == true else { return true }
            return (try? KernelKeyring.find(description)) != serial
        }
        guard replaced(afterFirstUnlockSerial, afterFirstUnlockDescription) || replaced(masterSerial, masterDescription) else {
            return false
        }
        dropWhileUnlocked()
        masterSerial = nil
        afterFirstUnlock = nil
        afterFirstUnlockSerial = nil
        forgetDerivedKeys()
        return true
    }

    /// Forgets the class and index keys derived from the header, after the header's keys
    /// were replaced (a format upgrade, a passphrase change).
    func forgetDerivedKeys() {
        whileUnlockedClassKeys.removeAll()
        alwaysClassKeys.removeAll()
        indexKeys.removeAll()
    }

    /// Removes a key from the kernel keyring. `lock` promises the key is gone from every
    /// process; when the kernel refuses both invalidating and revoking a key this user owns,
    /// that promise cannot be kept, and going on as if locked would be a silent failure.
    private static func removeOrCrash(_ serial: KernelKeyring.Serial?, description: String) {
        do throws(KernelKeyring.Failure) {
            if let serial { try KernelKeyring.remove(serial) }
            try KernelKeyring.remove(description: description)
        } catch {
            fatalError("Lockbox could not remove an unlocked key from the kernel keyring (\(error.reason)); it stays readable until it times out.")
        }
    }

    private func dropWhileUnlocked() {
        master = nil
        whileUnlockedClassKeys.removeAll()
    }

    // MARK: Current keys

    /// The master key, if the vault is unlocked now.
    func currentMaster() throws(LockboxError) -> SecretBytes? {
        switch mode {
        case .processMemory:
            if master != nil, idleTimeout > 0 {
                let now = clock.uptime()
                if now - lastUse >= .seconds(idleTimeout) {
                    dropWhileUnlocked()
                } else {
                    lastUse = now
                }
            }
            return master
        case .kernelKeyring:
            do throws(KernelKeyring.Absence) {
                let stillStored: Bool
                if let serial = masterSerial, master != nil {
                    stillStored = masterCheckedThisOperation ? true : try KernelKeyring.isValid(serial)
                } else {
                    stillStored = false
                }
                if stillStored, let serial = masterSerial {
                    if !masterCheckedThisOperation { try refreshIdleTimeout(serial) }
                    masterCheckedThisOperation = true
                    return master
                }
                dropWhileUnlocked()
                masterSerial = nil
                let serial = try KernelKeyring.find(masterDescription)
                let payload = try KernelKeyring.read(serial)
                guard payload.count == Crypto.keyByteCount + 4 else { return nil }
                let key = payload.withUnsafeBytes { SecretBytes(copying: UnsafeRawBufferPointer(rebasing: $0[0..<Crypto.keyByteCount])) }
                idleTimeout = payload.withUnsafeBytes { bytes in
                    (0..<4).reduce(UInt32(0)) { $0 | UInt32(bytes[Crypto.keyByteCount + $1]) << (8 * UInt32($1)) }
                }
                masterSerial = serial
                master = key
                try refreshIdleTimeout(serial)
                return key
            } catch {
                dropWhileUnlocked()
                masterSerial = nil
                if let failure = Self.unavailableError(error) { throw failure }
                return nil
            }
        }
    }

    /// The after-first-unlock keys, if the vault was unlocked since boot.
    func currentAfterFirstUnlockKeys() throws(LockboxError) -> AfterFirstUnlockKeys? {
        switch mode {
        case .processMemory:
            return afterFirstUnlock
        case .kernelKeyring:
            do throws(KernelKeyring.Absence) {
                if let keys = afterFirstUnlock {
                    // While the master key is in the keyring, so are the after-first-unlock keys
                    // (unlock stores both; lock removes only the master key): one check covers both.
                    if afterFirstUnlockCheckedThisOperation || masterCheckedThisOperation {
                        afterFirstUnlockCheckedThisOperation = true
                        return keys
                    }
                    if master != nil, let serial = masterSerial, try KernelKeyring.isValid(serial) {
                        masterCheckedThisOperation = true
                        afterFirstUnlockCheckedThisOperation = true
                        try refreshIdleTimeout(serial)
                        return keys
                    }
                    if let serial = afterFirstUnlockSerial, try KernelKeyring.isValid(serial) {
                        afterFirstUnlockCheckedThisOperation = true
                        return keys
                    }
                }
                afterFirstUnlock = nil
                afterFirstUnlockSerial = nil
                indexKeys.removeAll()
                let serial = try KernelKeyring.find(afterFirstUnlockDescription)
                guard let keys = AfterFirstUnlockKeys(unpacking: try KernelKeyring.read(serial), device: device.identifier) else {
                    return nil
                }
                afterFirstUnlockSerial = serial
                afterFirstUnlock = keys
                return keys
            } catch {
                afterFirstUnlock = nil
                afterFirstUnlockSerial = nil
                indexKeys.removeAll()
                if let failure = Self.unavailableError(error) { throw failure }
                return nil
            }
        }
    }

    /// The lookup-index key of an item class, if the vault was unlocked since boot.
    func indexKey(for itemClass: ItemClass) throws(LockboxError) -> SecretBytes? {
        guard let keys = try currentAfterFirstUnlockKeys() else { return nil }
        if let key = indexKeys[itemClass] { return key }
        let identifier = UInt64(ItemClass.allCases.firstIndex(of: itemClass)! + 1)
        let key = Crypto.deriveKey(from: keys.indexRoot, context: "lbxindex", identifier: identifier)
        indexKeys[itemClass] = key
        return key
    }

    /// Where a process finds its device key file, for errors that tell two apart.
    static let deviceKeyHint = "another XDG_STATE_HOME or HOME, as a sandboxed or service environment may set"

    /// What the cached `afterFirstUnlock` keys hold for a `*ThisDeviceOnly` class when the
    /// vault was unlocked without this machine's device secret: zeros, which no random key is.
    static let unavailableClassKey = SecretBytes(copying: [UInt8](repeating: 0, count: Crypto.keyByteCount))

    /// The class key for `accessibility`, if available in the current lock state (and, for
    /// `*ThisDeviceOnly` classes, on this machine). `header` is read only when the key is not
    /// cached (a copy of it costs more than the lookup).
    func classKey(for accessibility: Accessibility, header: @autoclosure () -> VaultHeader) throws(LockboxError) -> SecretBytes? {
        // This machine's device secret is sealed by a TPM that does not unseal it here.
        if accessibility.isThisDeviceOnly, let unavailable = device.unavailability { throw unavailable }
        switch accessibility.availability {
        case .afterFirstUnlock:
            guard let keys = try currentAfterFirstUnlockKeys(), let key = keys.classKeys[accessibility] else { return nil }
            guard key == Self.unavailableClassKey else { return key }
            // Cached by a process that had no device secret, or another one: the class key comes
            // from the header while the vault is unlocked, and never is the mark itself.
            guard let master = try currentMaster() else {
                throw LockboxError.locked(
                    keys.keptForAnotherDevice
                        ? "Its ThisDeviceOnly keys in the kernel keyring are another device key's: it was last unlocked by a "
                            + "process using another device key file (\(Self.deviceKeyHint)). Unlock it again here with "
                            + "`lockbox unlock`, and run Lockbox with the same environment everywhere."
                        : "Its ThisDeviceOnly keys were not kept: this machine's device key was unavailable when it was last "
                            + "unlocked. Unlock it again with `lockbox unlock`.")
            }
            return try Self.unwrapClassKey(accessibility, header: header(), master: master, device: device)
        case .always:
            if let key = alwaysClassKeys[accessibility] { return key }
            // Without the device secret only the master-wrapped copy opens (the vault unlocked).
            let master = device.unavailability == nil ? nil : try currentMaster()
            var key = try Self.unwrapClassKey(accessibility, header: header(), master: master, device: device)
            // This device key has no copy of its own (the device key file was replaced, or
            // another XDG_STATE_HOME found another one): the portable class's master-wrapped
            // copy opens while the vault is unlocked. Before, every read then said "locked"
            // while the vault was unlocked.
            if key == nil, master == nil, !accessibility.isThisDeviceOnly, let unlocked = try currentMaster() {
                key = try Self.unwrapClassKey(accessibility, header: header(), master: unlocked, device: device)
            }
            guard let key else { return nil }
            alwaysClassKeys[accessibility] = key
            return key
        case .whileUnlocked:
            guard let master = try currentMaster() else { return nil }
            if let key = whileUnlockedClassKeys[accessibility] { return key }
            guard let key = try Self.unwrapClassKey(accessibility, header: header(), master: master, device: device) else { return nil }
            whileUnlockedClassKeys[accessibility] = key
            return key
        }
    }

    /// Restarts the master key's kernel countdown. A key that timed out meanwhile reads as
    /// missing (locked); any other failure is thrown, so an idle timeout never silently stops
    /// applying.
    private func refreshIdleTimeout(_ serial: KernelKeyring.Serial) throws(KernelKeyring.Absence) {
        guard idleTimeout > 0 else { return }
        let now = clock.uptime()
        // One system call per second at most: the timeout is measured in seconds anyway.
        if now - lastUse >= .seconds(1) {
            do {
                try KernelKeyring.setTimeout(serial, seconds: idleTimeout)
            } catch {
                throw error.isMissing ? .missing : .unavailable(error)
            }
            lastUse = now
        }
    }
}

/// Keys cached per case of a small enum, in a slot per case: a lookup is an index, not a
/// search (it runs on every read), and the type is this module's, so it is compiled for each
/// use rather than run generically.
struct KeySlots<Case: SlotIndexed> {
    private var slots = [SecretBytes?](repeating: nil, count: Case.slotCount)

    subscript(key: Case) -> SecretBytes? {
        get { slots[key.slot] }
        set { slots[key.slot] = newValue }
    }

    mutating func removeAll() {
        for index in slots.indices { slots[index] = nil }
    }
}

/// An enum whose cases number their slots in a ``KeySlots`` (0 up to the number of cases).
protocol SlotIndexed: CaseIterable {
    var slot: Int { get }
}

extension SlotIndexed {
    static var slotCount: Int { allCases.count }
}

extension ItemClass: SlotIndexed {
    var slot: Int {
        switch self {
        case .genericPassword: 0
        case .internetPassword: 1
        case .key: 2
        case .certificate: 3
        }
    }
}

extension Accessibility: SlotIndexed {
    var slot: Int {
        switch self {
        case .whenUnlocked: 0
        case .afterFirstUnlock: 1
        case .whenUnlockedThisDeviceOnly: 2
        case .afterFirstUnlockThisDeviceOnly: 3
        case .whenPasscodeSetThisDeviceOnly: 4
        case .always: 5
        case .alwaysThisDeviceOnly: 6
        }
    }
}
