import FoundationEssentials
import LockboxCore
import VaultCrypto

#if canImport(Glibc)
import Glibc
#endif

/// Where this machine's device secret comes from: the key that `*ThisDeviceOnly` class keys
/// are bound to, kept outside the vault file and outside every backup.
///
/// The secret is a random key in `$XDG_STATE_HOME/lockbox/device-key` (mode 0600) mixed with
/// `/etc/machine-id`. A vault file copied to another machine, or restored there, cannot open
/// its `ThisDeviceOnly` items. It is no hardware boundary: a process of the same user can read
/// the key file (see the threat model); a TPM-sealed device key is a later unlock method.
public struct DeviceIdentity: Sendable, Hashable {
    /// The device key file; nil for `$XDG_STATE_HOME/lockbox/device-key`.
    public var keyPath: String?
    /// The machine identity mixed into the device secret.
    public var machineIDPath: String = "/etc/machine-id"

    public init(keyPath: String? = nil, machineIDPath: String = "/etc/machine-id") {
        self.keyPath = keyPath
        self.machineIDPath = machineIDPath
    }

    var resolvedKeyPath: String {
        if let keyPath { return keyPath }
        if let state = ProcessEnvironment.value("XDG_STATE_HOME"), state.hasPrefix("/") {
            return state + "/lockbox/device-key"
        }
        return ProcessEnvironment.home + "/.local/state/lockbox/device-key"
    }
}

/// The loaded device secret and its public identifier (which names this machine's rows).
final class DeviceSecret: Sendable {
    let secret: SecretBytes
    /// Hex, not secret: stored in the `device_id` column of this machine's items.
    let identifier: String

    init(secret: SecretBytes) {
        self.secret = secret
        let digest = Crypto.keyedDigest(Array("lockbox.device-id.v1".utf8), key: secret)
        identifier = Array(digest.prefix(8)).hexString
    }

    /// Reads the device key file, creating it (0600, in a 0700 directory) on first use.
    static func load(_ identity: DeviceIdentity) throws(LockboxError) -> DeviceSecret {
        let path = identity.resolvedKeyPath
        var key = try readKeyFile(path)
        if key == nil {
            try FilePermissions.createPrivateDirectory(FilePermissions.directory(of: path))
            let fresh = Crypto.generateKey()
            let descriptor = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0o600)
            if descriptor >= 0 {
                let written = fresh.withUnsafeBytes { write(descriptor, $0.baseAddress, $0.count) }
                fsync(descriptor)
                close(descriptor)
                guard written == Crypto.keyByteCount else {
                    unlink(path)
                    throw LockboxError(.io, "Cannot write the device key \(path).")
                }
            }
            // Another process may have won the race: read whatever is there now.
            key = try readKeyFile(path)
        }
        guard let key else { throw LockboxError(.io, "Cannot create the device key \(path).") }
        let machineID = machineIdentity(identity.machineIDPath)
        return DeviceSecret(secret: Crypto.combine(key, with: SecretBytes(utf8: machineID), context: "lockbox.device.v1"))
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

    private static func readKeyFile(_ path: String) throws(LockboxError) -> SecretBytes? {
        guard FilePermissions.exists(path) else { return nil }
        guard let identity = try FilePermissions.check(directory: FilePermissions.directory(of: path), files: [path])[path] else {
            return nil
        }
        let descriptor = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW)
        guard descriptor >= 0 else { throw LockboxError(.io, "Cannot read the device key \(path).") }
        defer { close(descriptor) }
        var info = stat()
        guard fstat(descriptor, &info) == 0, FilePermissions.Identity(info) == identity else {
            throw LockboxError(.io, "The device key \(path) was replaced while it was being read.")
        }
        let key = SecretBytes(capacity: Crypto.keyByteCount) { buffer in
            max(0, read(descriptor, buffer.baseAddress, buffer.count))
        }
        guard key.count == Crypto.keyByteCount else {
            throw LockboxError(.io, "The device key \(path) is damaged (wrong size). Move it away to create a new one; ThisDeviceOnly items will be lost.")
        }
        return key
    }
}
