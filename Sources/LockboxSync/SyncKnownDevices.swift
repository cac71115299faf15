import FoundationEssentials
import LockboxCore
import LockboxVault
import VaultCrypto

#if canImport(Glibc)
import Glibc
#endif

/// The devices of the group this device has seen listed, each with the public key its row was
/// attested for when first seen: `$XDG_STATE_HOME/lockbox/sync/GROUP-DEVICE.devices`, beside
/// the record of the last pull, under a MAC with this device's state key.
///
/// Every device of the group holds the key that attests the devices' rows, so a device can
/// attest a public key of its own making in another device's row. A device about to be removed
/// could so have the removal seal the next key to itself, under another device's name. A
/// removal therefore grants the new key to a listed device only with the key this device saw it
/// with (the database cannot change a key already seen here), and says which devices it sees
/// for the first time. Each sync records the devices it sees, so that a device seen once keeps
/// the key it was seen with.
///
/// None (or an empty file) knows nothing; a file that fails its MAC was changed outside
/// Lockbox: syncs go on without recording, and a removal refuses it, naming the way out.
struct SyncKnownDevices {
    /// What the file holds.
    enum Reading: Equatable {
        /// Nothing recorded yet.
        case none
        /// Each device's identifier and the public key it was first seen with.
        case known([String: [UInt8]])
        /// A file that is not one Lockbox wrote under this device's key.
        case damaged

        /// The devices, when the file could be read (none: empty).
        var devices: [String: [UInt8]]? {
            switch self {
            case .none: [:]
            case .known(let devices): devices
            case .damaged: nil
            }
        }
    }

    let path: String
    let key: SecretBytes
    let group: String
    let device: String

    /// A file larger than this is not read, nor written (a group has a few devices: 1 MiB is
    /// about 15,000 entries).
    static let sizeLimit = 1 << 20
    /// Devices recorded at most: a database listing more (rows a device of the group added)
    /// does not grow the record further.
    static let deviceLimit = 10_000

    init(vault: Vault, group: String, device: DeviceSecret) {
        path = SyncFiles.deviceRecordPath(vault: vault, group: group, device: device, kind: "devices")
        key = device.stateKey
        self.group = group
        self.device = device.id
    }

    private func encoded(_ devices: [String: [UInt8]]) -> [UInt8] {
        var encoder = FieldEncoder()
        encoder.string("lockbox.sync.devices.v1")
        encoder.string(group)
        encoder.string(device)
        Self.append(devices, to: &encoder)
        return encoder.bytes
    }

    /// The file at ``path``. One this process cannot open but for its absence (a link there,
    /// or one this user cannot read) is damaged, not none, which would turn the check off.
    func read() -> Reading {
        let bytes: [UInt8]
        switch SyncFiles.readDeviceRecord(path, limit: Self.sizeLimit) {
        case .absent: return .none
        case .unreadable: return .damaged
        case .bytes(let read): bytes = read
        }
        if bytes.isEmpty { return .none }
        guard bytes.count > Crypto.keyByteCount else { return .damaged }
        let body = Array(bytes.dropLast(Crypto.keyByteCount))
        guard SyncHead.equal(Array(bytes.suffix(Crypto.keyByteCount)), Crypto.keyedDigest(body, key: key)) else { return .damaged }
        var decoder = FieldDecoder(body)
        guard (try? decoder.string()) == "lockbox.sync.devices.v1", (try? decoder.string()) == group, (try? decoder.string()) == device,
            let count = try? decoder.integer(), count >= 0
        else { return .damaged }
        var devices: [String: [UInt8]] = [:]
        for _ in 0..<count {
            guard let id = try? decoder.string(), let publicKey = try? decoder.bytes() else { return .damaged }
            devices[id] = publicKey
        }
        guard decoder.isAtEnd, devices.count == count else { return .damaged }
        return .known(devices)
    }

    /// Writes `devices` (the whole list). Returns whether it was kept: never a file larger than
    /// ``read()`` takes back.
    @discardableResult
    func write(_ devices: [String: [UInt8]]) -> Bool {
        let body = encoded(devices)
        guard body.count + Crypto.keyByteCount <= Self.sizeLimit else { return false }
        guard (try? SyncFiles.prepareDirectory(FilePermissions.directory(of: path))) != nil else { return false }
        return (try? Vault.writeAtomically(
            body + Crypto.keyedDigest(body, key: key), to: path, what: "this device's record of the group's devices", removingLeftovers: true))
            != nil
    }

    /// The devices as a pairing code carries them (sealed beside the group keys): the inviting
    /// device's record, with its own key.
    static func encodeInvitation(_ devices: [String: [UInt8]]) -> [UInt8] {
        var encoder = FieldEncoder()
        encoder.string("lockbox.sync.invitation-devices.v1")
        Self.append(devices, to: &encoder)
        return encoder.bytes
    }

    /// The devices' count, then each identifier and key, in identifier order.
    private static func append(_ devices: [String: [UInt8]], to encoder: inout FieldEncoder) {
        encoder.integer(devices.count)
        for id in devices.keys.sorted() {
            encoder.string(id)
            encoder.bytes(devices[id]!)
        }
    }

    static func decodeInvitation(_ bytes: [UInt8]) -> [String: [UInt8]]? {
        var decoder = FieldDecoder(bytes)
        // The inviting device's record (at most ``deviceLimit``) and its own key.
        guard (try? decoder.string()) == "lockbox.sync.invitation-devices.v1", let count = try? decoder.integer(), (0...deviceLimit + 1).contains(count)
        else { return nil }
        var devices: [String: [UInt8]] = [:]
        for _ in 0..<count {
            guard let id = try? decoder.string(), SyncGroup.isDeviceIdentifier(id), let key = try? decoder.bytes(), key.count == 32 else { return nil }
            devices[id] = key
        }
        return decoder.isAtEnd ? devices : nil
    }

    /// Records `devices` (from the inviting device) that this record does not hold yet; one it
    /// holds keeps its key. Best effort, as ``record(_:)``.
    /// Returns false when they could not be written (a full disk, the directory's permissions).
    func seed(_ devices: [String: [UInt8]]) -> Bool {
        // A record changed outside Lockbox is left as it is (`lockbox sync status` names it).
        guard var known = read().devices else { return true }
        var changed = false
        for (id, key) in devices where id != device && known[id] == nil && known.count < Self.deviceLimit {
            known[id] = key
            changed = true
        }
        return changed ? write(known) : true
    }

    /// Records the attested devices of `listed` not seen before, with their keys; a device seen
    /// before keeps the key it was first seen with. Returns the identifiers whose attested key
    /// is not the one they were first seen with (nothing recorded for them). Best effort: a
    /// damaged file is left as it is (a removal reports it), and a write that fails only
    /// leaves the devices to be recorded at the next sync.
    /// `kept` is false when devices seen for the first time could not be written (a full disk,
    /// the directory's permissions).
    @discardableResult
    func record(_ listed: [SyncGroup.Device]) -> (replaced: Set<String>, kept: Bool) {
        guard var devices = read().devices else { return ([], true) }
        var replaced: Set<String> = []
        var changed = false
        for listedDevice in listed where listedDevice.id != device {
            guard let attested = listedDevice.attestedKey else { continue }
            if let seen = devices[listedDevice.id] {
                if !SyncHead.equal(seen, attested) { replaced.insert(listedDevice.id) }
            } else if devices.count < Self.deviceLimit {
                devices[listedDevice.id] = attested
                changed = true
            }
        }
        return (replaced, !changed || write(devices))
    }
}
