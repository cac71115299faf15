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

    let indexRoot: SecretBytes
    let classKeys: SmallMap<Accessibility, SecretBytes>

    /// Fixed-size layout for the kernel keyring: index root, then the class keys in
    /// ``classes`` order, 32 bytes each.
    func packed() -> SecretBytes {
        let size = Crypto.keyByteCount * (1 + Self.classes.count)
        return SecretBytes(capacity: size) { buffer in
            var offset = 0
            for key in [indexRoot] + Self.classes.map({ classKeys[$0]! }) {
                key.withUnsafeBytes { bytes in
                    UnsafeMutableRawBufferPointer(rebasing: buffer[offset..<offset + bytes.count]).copyMemory(from: bytes)
                }
                offset += Crypto.keyByteCount
            }
            return size
        }
    }

    init(indexRoot: SecretBytes, classKeys: SmallMap<Accessibility, SecretBytes>) {
        self.indexRoot = indexRoot
        self.classKeys = classKeys
    }

    init?(unpacking payload: SecretBytes) {
        let size = Crypto.keyByteCount
        guard payload.count == size * (1 + Self.classes.count) else { return nil }
        func slice(_ index: Int) -> SecretBytes {
            payload.withUnsafeBytes { bytes in
                SecretBytes(copying: UnsafeRawBufferPointer(rebasing: bytes[index * size..<(index + 1) * size]))
            }
        }
        indexRoot = slice(0)
        var keys = SmallMap<Accessibility, SecretBytes>()
        for (offset, accessibility) in Self.classes.enumerated() {
            keys[accessibility] = slice(offset + 1)
        }
        classKeys = keys
    }
}

/// The unlocked keys of one vault handle, and where they are shared with other processes.
///
/// In kernel-keyring mode every operation checks (one system call) that the cached key is
/// still in the keyring, so a `lock` from any process takes effect in all of them at once.
final class KeyCache {
    let mode: UnlockCache
    let device: DeviceSecret
    let vaultID: [UInt8]
    private let masterDescription: String
    private let afterFirstUnlockDescription: String

    private var masterSerial: KernelKeyring.Serial?
    private var afterFirstUnlockSerial: KernelKeyring.Serial?
    private var master: SecretBytes?
    private var idleTimeout: UInt32 = 0
    private var lastUse: timespec = timespec()
    private var afterFirstUnlock: AfterFirstUnlockKeys?
    private var whileUnlockedClassKeys = SmallMap<Accessibility, SecretBytes>()
    private var indexKeys = SmallMap<ItemClass, SecretBytes>()
    private var alwaysClassKeys = SmallMap<Accessibility, SecretBytes>()
    /// Keys already checked against the kernel keyring during the current operation: one
    /// system call per key and operation is enough.
    private var masterCheckedThisOperation = false
    private var afterFirstUnlockCheckedThisOperation = false

    init(vaultID: [UInt8], mode: UnlockCache, device: DeviceSecret) {
        self.mode = mode
        self.device = device
        self.vaultID = vaultID
        let identity = vaultID.hexString
        masterDescription = "lockbox:v1:\(identity):unlocked"
        afterFirstUnlockDescription = "lockbox:v1:\(identity):after-first-unlock"
    }

    /// The message for a cache that cannot be used, naming the alternative.
    static func unavailableError(_ reason: String) -> LockboxError {
        LockboxError(
            .notAvailable,
            "The kernel keyring is not available here (\(reason)). Unlocked keys cannot be shared between "
                + "processes; open the vault with `unlockCache: .processMemory` (LOCKBOX_UNLOCK_CACHE=process) "
                + "to keep them in this process only.")
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
            do throws(KernelKeyring.Absence) {
                let payload = SecretBytes(capacity: Crypto.keyByteCount + 4) { buffer in
                    master.withUnsafeBytes { buffer.copyMemory(from: $0) }
                    withUnsafeBytes(of: idleTimeout.littleEndian) { timeout in
                        UnsafeMutableRawBufferPointer(rebasing: buffer[Crypto.keyByteCount...]).copyMemory(from: timeout)
                    }
                    return Crypto.keyByteCount + 4
                }
                afterFirstUnlockSerial = try KernelKeyring.store(
                    keys.packed(), description: afterFirstUnlockDescription, timeout: nil)
                masterSerial = try KernelKeyring.store(
                    payload, description: masterDescription, timeout: idleTimeout == 0 ? nil : idleTimeout)
            } catch {
                throw Self.unavailableError(Self.reason(error))
            }
        case .processMemory:
            break
        }
        self.master = master
        self.afterFirstUnlock = keys
        clock_gettime(CLOCK_MONOTONIC, &lastUse)
    }

    /// Forgets the master key everywhere (this process and the kernel keyring). The
    /// after-first-unlock keys stay, as on iOS after the device locks.
    func lock() {
        if mode == .kernelKeyring {
            if let masterSerial { KernelKeyring.remove(masterSerial) }
            KernelKeyring.remove(description: masterDescription)
        }
        masterSerial = nil
        dropWhileUnlocked()
    }

    /// Forgets every key, as a reboot does.
    func forgetAll() {
        lock()
        if mode == .kernelKeyring {
            if let afterFirstUnlockSerial { KernelKeyring.remove(afterFirstUnlockSerial) }
            KernelKeyring.remove(description: afterFirstUnlockDescription)
        }
        afterFirstUnlockSerial = nil
        afterFirstUnlock = nil
        indexKeys.removeAll()
    }

    /// Forgets the class and index keys derived from the header, after the header's keys
    /// were replaced (a format upgrade, a passphrase change).
    func forgetDerivedKeys() {
        whileUnlockedClassKeys.removeAll()
        alwaysClassKeys.removeAll()
        indexKeys.removeAll()
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
                var now = timespec()
                clock_gettime(CLOCK_MONOTONIC, &now)
                if now.tv_sec - lastUse.tv_sec >= Int(idleTimeout) {
                    dropWhileUnlocked()
                } else {
                    lastUse = now
                }
            }
            return master
        case .kernelKeyring:
            if let serial = masterSerial, master != nil,
                masterCheckedThisOperation || KernelKeyring.isValid(serial)
            {
                if !masterCheckedThisOperation { refreshIdleTimeout(serial) }
                masterCheckedThisOperation = true
                return master
            }
            dropWhileUnlocked()
            masterSerial = nil
            do throws(KernelKeyring.Absence) {
                let serial = try KernelKeyring.find(masterDescription)
                let payload = try KernelKeyring.read(serial)
                guard payload.count == Crypto.keyByteCount + 4 else { return nil }
                let key = payload.withUnsafeBytes { SecretBytes(copying: UnsafeRawBufferPointer(rebasing: $0[0..<Crypto.keyByteCount])) }
                idleTimeout = payload.withUnsafeBytes { bytes in
                    (0..<4).reduce(UInt32(0)) { $0 | UInt32(bytes[Crypto.keyByteCount + $1]) << (8 * UInt32($1)) }
                }
                masterSerial = serial
                master = key
                refreshIdleTimeout(serial)
                return key
            } catch {
                guard case .unavailable(let reason) = error else { return nil }
                throw Self.unavailableError(reason)
            }
        }
    }

    /// The after-first-unlock keys, if the vault was unlocked since boot.
    func currentAfterFirstUnlockKeys() throws(LockboxError) -> AfterFirstUnlockKeys? {
        switch mode {
        case .processMemory:
            return afterFirstUnlock
        case .kernelKeyring:
            if let keys = afterFirstUnlock {
                // While the master key is in the keyring, so are the after-first-unlock keys
                // (unlock stores both; lock removes only the master key): one check covers both.
                if afterFirstUnlockCheckedThisOperation || masterCheckedThisOperation {
                    afterFirstUnlockCheckedThisOperation = true
                    return keys
                }
                if master != nil, let serial = masterSerial, KernelKeyring.isValid(serial) {
                    masterCheckedThisOperation = true
                    afterFirstUnlockCheckedThisOperation = true
                    refreshIdleTimeout(serial)
                    return keys
                }
                if let serial = afterFirstUnlockSerial, KernelKeyring.isValid(serial) {
                    afterFirstUnlockCheckedThisOperation = true
                    return keys
                }
            }
            afterFirstUnlock = nil
            afterFirstUnlockSerial = nil
            indexKeys.removeAll()
            do throws(KernelKeyring.Absence) {
                let serial = try KernelKeyring.find(afterFirstUnlockDescription)
                guard let keys = AfterFirstUnlockKeys(unpacking: try KernelKeyring.read(serial)) else { return nil }
                afterFirstUnlockSerial = serial
                afterFirstUnlock = keys
                return keys
            } catch {
                guard case .unavailable(let reason) = error else { return nil }
                throw Self.unavailableError(reason)
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

    /// The class key for `accessibility`, if available in the current lock state (and, for
    /// `*ThisDeviceOnly` classes, on this machine).
    func classKey(for accessibility: Accessibility, header: VaultHeader) throws(LockboxError) -> SecretBytes? {
        switch accessibility.availability {
        case .afterFirstUnlock:
            return try currentAfterFirstUnlockKeys()?.classKeys[accessibility]
        case .always:
            if let key = alwaysClassKeys[accessibility] { return key }
            guard let key = try Self.unwrapClassKey(accessibility, header: header, master: nil, device: device) else { return nil }
            alwaysClassKeys[accessibility] = key
            return key
        case .whileUnlocked:
            guard let master = try currentMaster() else { return nil }
            if let key = whileUnlockedClassKeys[accessibility] { return key }
            guard let key = try Self.unwrapClassKey(accessibility, header: header, master: master, device: device) else { return nil }
            whileUnlockedClassKeys[accessibility] = key
            return key
        }
    }

    private func refreshIdleTimeout(_ serial: KernelKeyring.Serial) {
        guard idleTimeout > 0 else { return }
        var now = timespec()
        clock_gettime(CLOCK_MONOTONIC, &now)
        // One system call per second at most: the timeout is measured in seconds anyway.
        if now.tv_sec != lastUse.tv_sec {
            KernelKeyring.setTimeout(serial, seconds: idleTimeout)
            lastUse = now
        }
    }

    private static func reason(_ absence: KernelKeyring.Absence) -> String {
        switch absence {
        case .missing: "the key vanished while being stored"
        case .unavailable(let reason): reason
        }
    }
}
