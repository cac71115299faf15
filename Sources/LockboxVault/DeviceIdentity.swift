import FoundationEssentials
import LockboxCore
import VaultCrypto

#if canImport(Glibc)
import Glibc
#endif

/// Where this machine's device secret comes from: the key that `*ThisDeviceOnly` class keys
/// are bound to, kept outside the vault file and outside every backup.
///
/// The secret is a random key in `$XDG_STATE_HOME/lockbox/device-key` mixed with
/// `/etc/machine-id`. A vault file copied to another machine, or restored there, cannot open
/// its `ThisDeviceOnly` items. The key is kept one of two ways (``DeviceKeyStorage``):
///
/// - in clear in the file (mode 0600), the default: no hardware boundary, a process of the same
///   user can read it, and a copy of the file carries the items along (see the threat model);
/// - sealed by the machine's TPM 2.0 (``sealWithTPM(pcrs:)``, `lockbox-keys enroll tpm2
///   --device-key`): the file holds only a blob that this TPM alone unseals, so a copy of the file
///   (and of the vault) opens no `ThisDeviceOnly` item anywhere else.
public struct DeviceIdentity: Sendable, Hashable {
    /// The device key file; nil for `$XDG_STATE_HOME/lockbox/device-key`.
    public var keyPath: String?
    /// The machine identity mixed into the device secret.
    public var machineIDPath: String = "/etc/machine-id"
    /// The TPM that seals the device key, as a TCTI configuration (`device:/dev/tpmrm0`,
    /// `swtpm:path=...`); nil for `LOCKBOX_TPM_TCTI`, else `/dev/tpmrm0`.
    public var tpmDevice: String?

    public init(keyPath: String? = nil, machineIDPath: String = "/etc/machine-id", tpmDevice: String? = nil) {
        self.keyPath = keyPath
        self.machineIDPath = machineIDPath
        self.tpmDevice = tpmDevice
    }

    /// The device key file's path.
    public var resolvedKeyPath: String {
        if let keyPath { return keyPath }
        if let state = ProcessEnvironment.value("XDG_STATE_HOME"), state.hasPrefix("/") {
            return state + "/lockbox/device-key"
        }
        return ProcessEnvironment.home + "/.local/state/lockbox/device-key"
    }
}

/// The loaded device secret and its public identifier (which names this machine's rows).
///
/// The secret is missing when the device key is sealed by a TPM that does not unseal it here
/// (no TPM, another TPM, changed PCRs): the identifier is still known (the sealed file names
/// it), so this machine's `*ThisDeviceOnly` rows are found, and reading them throws
/// ``unavailability`` instead of reading as absent; the other classes work as usual.
final class DeviceSecret: Sendable {
    private let key: SecretBytes?
    /// Hex, not secret: stored in the `device_id` column of this machine's items.
    let identifier: String
    /// Why the secret is missing (nil when it is at hand).
    let unavailability: LockboxError?

    init(secret: SecretBytes) {
        key = secret
        identifier = Self.identifier(of: secret)
        unavailability = nil
    }

    private init(identifier: String, unavailability: LockboxError) {
        key = nil
        self.identifier = identifier
        self.unavailability = unavailability
    }

    static func identifier(of secret: SecretBytes) -> String {
        let digest = Crypto.keyedDigest(Array("lockbox.device-id.v1".utf8), key: secret)
        return Array(digest.prefix(8)).hexString
    }

    /// The secret; throws ``unavailability`` when this machine cannot have it.
    var secret: SecretBytes {
        get throws(LockboxError) {
            guard let key else { throw unavailability! }
            return key
        }
    }

    /// The secret, or nil when it is unavailable here.
    var availableSecret: SecretBytes? { key }

    /// Reads the device key (unsealing it with the TPM when it is sealed), creating a key file
    /// (0600, in a 0700 directory) on first use.
    static func load(_ identity: DeviceIdentity) throws(LockboxError) -> DeviceSecret {
        let path = identity.resolvedKeyPath
        switch try DeviceKeyFile.read(path) {
        case .sealed(let sealed):
            do throws(LockboxError) {
                let key = try sealed.unseal(identity)
                let secret = DeviceSecret(secret: combine(key, identity))
                guard secret.identifier == sealed.identifier else {
                    throw LockboxError(
                        .decode, "The device key \(path) names another key than the one its TPM blob holds: the file was edited.")
                }
                return secret
            } catch where error.code == .decode {
                throw error
            } catch {
                return DeviceSecret(identifier: sealed.identifier, unavailability: error)
            }
        case .clear(let key):
            return DeviceSecret(secret: combine(key, identity))
        case nil:
            try createKeyFile(path)
            guard case .clear(let key) = try DeviceKeyFile.read(path) else { return try load(identity) }
            return DeviceSecret(secret: combine(key, identity))
        }
    }

    /// The device key file's key mixed with the machine identity.
    static func combine(_ key: SecretBytes, _ identity: DeviceIdentity) -> SecretBytes {
        let machineID = machineIdentity(identity.machineIDPath)
        return Crypto.combine(key, with: SecretBytes(utf8: machineID), context: "lockbox.device.v1")
    }

    /// Makes a clear device key file unless one exists (another process may win the race:
    /// its file is then read like any other).
    static func createKeyFile(_ path: String) throws(LockboxError) {
        try FilePermissions.createPrivateDirectory(FilePermissions.directory(of: path))
        if FilePermissions.exists(path) { return }
        let fresh = Crypto.generateKey()
        // Written whole under a name of its own, then given the key's name unless another
        // process made one first (that one is kept): a process reading the key never sees it
        // half written (two first commands at once took a good key for a damaged one, whose
        // advice, moving it away, loses every ThisDeviceOnly item).
        let temporary = path + ".creating-" + Crypto.randomBytes(8).hexString
        let descriptor = open(temporary, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0o600)
        guard descriptor >= 0 else {
            throw LockboxError(.io, "Cannot create the device key \(path).")
        }
        let written = fresh.withUnsafeBytes { write(descriptor, $0.baseAddress, $0.count) }
        let synced = fsync(descriptor)
        close(descriptor)
        guard written == Crypto.keyByteCount, synced == 0 else {
            unlink(temporary)
            throw LockboxError(.io, "Cannot write the device key \(path).")
        }
        do {
            if try !Vault.placeWithoutReplacing(temporary, path) { unlink(temporary) }
        } catch {
            unlink(temporary)
            throw error
        }
    }

    /// The machine identity file's first line without surrounding white space; empty when the
    /// file is missing (a container without /etc/machine-id still has its device key).
    static func machineIdentity(_ path: String) -> String {
        let descriptor = open(path, O_RDONLY | O_CLOEXEC)
        guard descriptor >= 0 else { return "" }
        defer { close(descriptor) }
        var bytes = [UInt8](repeating: 0, count: 256)
        let count = bytes.withUnsafeMutableBytes { read(descriptor, $0.baseAddress, $0.count) }
        guard count > 0 else { return "" }
        func isSpace(_ byte: UInt8) -> Bool { byte == 0x20 || (byte >= 0x09 && byte <= 0x0d) }
        var start = 0
        var end = 0
        while end < count && bytes[end] != 0x0a { end += 1 }
        while start < end && isSpace(bytes[start]) { start += 1 }
        while end > start && isSpace(bytes[end - 1]) { end -= 1 }
        return String(decoding: bytes[start..<end], as: UTF8.self)
    }
}
