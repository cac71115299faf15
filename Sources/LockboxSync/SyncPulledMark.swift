import FoundationEssentials
import LockboxCore
import LockboxVault
import VaultCrypto

#if canImport(Glibc)
import Glibc
#endif

/// How far this device's sync state had pulled, kept apart from the state: in the device
/// identity's directory (`$XDG_STATE_HOME/lockbox/sync/GROUP-DEVICE.pulled`, beside the vault's
/// remembered generations), not beside the keychain, and not in the database, whose
/// administrator could raise it (and so talk the device into a rebuild that gives up its
/// unsynced changes) or lower it (and so hide a state put back).
///
/// A state whose cursor is below the mark was removed, emptied or put back from a copy (the
/// keychain's directory restored from a backup, say) and is refused (``SyncGroup/stateBehind``).
/// The mark is raised after the state's commit, without a sync of the disk of its own: after a
/// crash it can only lag behind the state (a missed detection), never run ahead of it (a false
/// refusal). None (or an empty file, which a power loss can leave of a first write) checks
/// nothing; a file that fails its MAC was changed outside Lockbox, and refuses every sync
/// until a reset writes it anew.
struct SyncPulledMark {
    /// What the file holds.
    enum Reading: Equatable {
        /// No mark: none was written here yet (or a power loss emptied the first one).
        case none
        /// The cursor this device's state had reached.
        case cursor(Int64)
        /// A file that is not a mark Lockbox wrote under this device's key.
        case damaged

        /// The cursor, when the mark holds one.
        var cursor: Int64? {
            if case .cursor(let cursor) = self { return cursor }
            return nil
        }
    }

    let path: String
    let key: SecretBytes
    let group: String
    let device: String

    init(vault: Vault, group: String, device: DeviceSecret) {
        path = SyncFiles.deviceRecordPath(vault: vault, group: group, device: device, kind: "pulled")
        key = device.stateKey
        self.group = group
        self.device = device.id
    }

    private func mac(_ cursor: Int64) -> [UInt8] {
        var encoder = FieldEncoder()
        encoder.string("lockbox.sync.pulled.v1")
        encoder.string(group)
        encoder.string(device)
        encoder.integer(Int(cursor))
        return Crypto.keyedDigest(encoder.bytes, key: key)
    }

    /// The mark at ``path``. A file this process cannot open but for its absence (a link
    /// there, or one this user cannot read) is damaged, not none, which would turn the check off.
    func read() -> Reading {
        let bytes: [UInt8]
        switch SyncFiles.readDeviceRecord(path, limit: 40) {
        case .absent: return .none
        case .unreadable: return .damaged
        case .bytes(let read): bytes = read
        }
        if bytes.isEmpty { return .none }
        guard bytes.count == 40 else { return .damaged }
        let cursor = bytes[0..<8].reversed().reduce(Int64(0)) { $0 << 8 | Int64($1) }
        guard cursor >= 0, SyncHead.equal(Array(bytes[8..<40]), mac(cursor)) else { return .damaged }
        return .cursor(cursor)
    }

    /// Records `cursor`: with `exactly`, as it is (a recovery's pull from scratch, whose state
    /// may start lower); else only when it is higher than the mark. Returns whether the mark
    /// holds `cursor` now (a raise not kept only weakens the check; a lowering not kept must stop
    /// the state's commit, which would otherwise fall behind the mark).
    @discardableResult
    func record(_ cursor: Int64, exactly: Bool = false) -> Bool {
        if !exactly, let known = read().cursor, known >= cursor { return true }
        guard (try? SyncFiles.prepareDirectory(FilePermissions.directory(of: path))) != nil else { return false }
        let bytes: [UInt8] = (0..<8).map { UInt8(truncatingIfNeeded: cursor >> (8 * $0)) } + mac(cursor)
        // A lowering is synced before it is moved into place: the state's commit follows it.
        return (try? Vault.writeAtomically(bytes, to: path, what: "this device's record of its last pull", synced: exactly, removingLeftovers: true)) != nil
    }
}
