import FoundationEssentials
import LockboxCore
import TPMAccess
import VaultCrypto

#if canImport(Glibc)
import Glibc
#endif

/// How this machine's device key is kept.
public enum DeviceKeyStorage: Sendable, Hashable, CustomStringConvertible {
    /// No device key yet: the first vault opened makes one (a clear file).
    case none
    /// In clear, in the device key file (mode 0600): a copy of the file carries it.
    case file
    /// Sealed by the TPM, to the current values of `pcrs` when not empty: only this TPM (in
    /// that boot state) unseals it.
    case tpm(pcrs: [Int])

    public var description: String {
        switch self {
        case .none: "none yet"
        case .file: "file (not hardware-bound)"
        case .tpm(let pcrs): pcrs.isEmpty ? "sealed by the TPM" : "sealed by the TPM to PCRs " + pcrs.map(String.init).joined(separator: ",")
        }
    }
}

/// The device key file: 32 random bytes in clear, or a TPM-sealed blob after a short text
/// header:
///
///     lockbox-device-key tpm2 v1\n
///     <device identifier, 16 hex digits>\n
///     <the blob TPM.seal made: PCR count, PCR numbers, TPM2B_PUBLIC, TPM2B_PRIVATE>
///
/// The identifier is public (it names this machine's rows in every vault), so a machine whose
/// TPM cannot unseal the blob still finds those rows and reports them unavailable, never absent.
enum DeviceKeyFile {
    static let sealedHeader = Array("lockbox-device-key tpm2 v1\n".utf8)
    /// Far above a sealed blob (about 250 bytes), far below anything worth reading.
    static let maximumSize = 4096

    struct Sealed {
        let identifier: String
        let blob: [UInt8]

        var pcrs: [Int] {
            guard let count = blob.first, blob.count > Int(count) else { return [] }
            return blob[1..<1 + Int(count)].map(Int.init)
        }

        /// The file's key, from the TPM; `notAvailable` naming the TPM when none can be
        /// reached, `authFailed` when this TPM does not unseal it.
        func unseal(_ identity: DeviceIdentity) throws(LockboxError) -> SecretBytes {
            let tpm = TPM.at(identity.tpmDevice)
            defer { tpm.disconnect() }
            let path = identity.resolvedKeyPath
            do throws(LockboxError) {
                let key = try tpm.unseal(blob)
                guard key.count == Crypto.keyByteCount else { throw LockboxError(.decode, "The device key \(path) is damaged.") }
                return key
            } catch where error.code == .notAvailable {
                throw LockboxError(
                    .notAvailable,
                    "This machine's device key (\(path)) is sealed by a TPM, and no TPM can be used here: \(error.message) "
                        + "Items of the *ThisDeviceOnly classes cannot be read until it can; the other items can, and no key file "
                        + "stands in for the TPM.")
            } catch where error.code == .authFailed {
                throw LockboxError(
                    .authFailed,
                    "This machine's device key (\(path)) is sealed by a TPM that does not unseal it here: the file was copied "
                        + "from another machine, the TPM was cleared, or the PCRs it is bound to changed. Items of the "
                        + "*ThisDeviceOnly classes cannot be read on this machine; the other items can, after unlocking.")
            }
        }

        var bytes: [UInt8] {
            Self.header + Array((identifier + "\n").utf8) + blob
        }

        private static var header: [UInt8] { DeviceKeyFile.sealedHeader }
    }

    enum Contents {
        case clear(SecretBytes)
        case sealed(Sealed)
    }

    /// The file's contents; nil when there is no file.
    static func read(_ path: String) throws(LockboxError) -> Contents? {
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
        if info.st_size == Crypto.keyByteCount {
            let key = SecretBytes(capacity: Crypto.keyByteCount) { buffer in
                max(0, Glibc.read(descriptor, buffer.baseAddress, buffer.count))
            }
            guard key.count == Crypto.keyByteCount else { throw damaged(path) }
            return .clear(key)
        }
        guard info.st_size > sealedHeader.count + 17, info.st_size <= maximumSize else { throw damaged(path) }
        var bytes = [UInt8](repeating: 0, count: Int(info.st_size))
        let count = bytes.withUnsafeMutableBytes { Glibc.read(descriptor, $0.baseAddress, $0.count) }
        guard count == bytes.count, let sealed = decode(bytes) else { throw damaged(path) }
        return .sealed(sealed)
    }

    static func decode(_ bytes: [UInt8]) -> Sealed? {
        guard bytes.starts(with: sealedHeader) else { return nil }
        let rest = bytes.dropFirst(sealedHeader.count)
        guard rest.count > 17, rest[rest.startIndex + 16] == 0x0a else { return nil }
        let identifier = String(decoding: rest.prefix(16), as: UTF8.self)
        guard identifier.utf8.allSatisfy({ (0x30...0x39).contains($0) || (0x61...0x66).contains($0) }) else { return nil }
        return Sealed(identifier: identifier, blob: Array(rest.dropFirst(17)))
    }

    private static func damaged(_ path: String) -> LockboxError {
        LockboxError(
            .io,
            "The device key \(path) is damaged (neither a key nor a TPM-sealed key). Move it away to create a new one; "
                + "ThisDeviceOnly items will be lost.")
    }

    /// Writes `contents` to a new file beside `path` (0600, synced) and returns its path; the
    /// caller verifies it before renaming it over `path`.
    static func writeBeside(_ path: String, _ contents: [UInt8]) throws(LockboxError) -> String {
        let temporary = path + ".sealing-" + Crypto.randomBytes(6).hexString
        let descriptor = open(temporary, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0o600)
        guard descriptor >= 0 else { throw LockboxError(.io, "Cannot create \(temporary) (errno \(errno)).") }
        let written = contents.withUnsafeBytes { write(descriptor, $0.baseAddress, $0.count) }
        let synced = fsync(descriptor)
        close(descriptor)
        guard written == contents.count, synced == 0 else {
            unlink(temporary)
            throw LockboxError(.io, "Cannot write \(temporary).")
        }
        return temporary
    }

    /// Renames `temporary` over `path` and syncs the directory, so the rename survives a crash.
    static func replace(_ path: String, with temporary: String) throws(LockboxError) {
        guard rename(temporary, path) == 0 else {
            let error = errno
            unlink(temporary)
            throw LockboxError(.io, "Cannot replace the device key \(path) (errno \(error)); it was not changed.")
        }
        let directory = open(FilePermissions.directory(of: path), O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        if directory >= 0 {
            fsync(directory)
            close(directory)
        }
    }
}

/// What sealing the device key did.
public enum DeviceKeySealing: Sendable, Hashable {
    /// The clear key file was replaced by the sealed key (the same key: every vault's
    /// `ThisDeviceOnly` items stay readable).
    case migratedFromFile
    /// There was no device key: a new one was made, and only its sealed form was written.
    case created
    /// The key was sealed already: it was sealed again (other PCRs).
    case resealed
}

extension DeviceIdentity {
    /// How this machine's device key is kept now. Reads the file only; asks no TPM.
    public var storage: DeviceKeyStorage {
        get throws(LockboxError) {
            switch try DeviceKeyFile.read(resolvedKeyPath) {
            case nil: .none
            case .clear: .file
            case .sealed(let sealed): .tpm(pcrs: sealed.pcrs)
            }
        }
    }

    /// Seals the device key with the TPM (``tpmDevice``), optionally to the current values of
    /// `pcrs`: afterwards the device key file holds only the sealed key, and a copy of it opens
    /// no `ThisDeviceOnly` item on another machine.
    ///
    /// The key itself does not change, so every vault's `ThisDeviceOnly` items stay readable.
    /// The clear file is replaced only after its sealed form was written, synced, read back and
    /// unsealed to the same key; on any failure it stays as it was. Copies of the clear file
    /// made before (backups of the state directory) still carry the key.
    /// - Throws: `notAvailable` when no TPM can be used (nothing changes); `authFailed` when the
    ///   key is sealed already by a TPM that does not unseal it here.
    @discardableResult
    public func sealWithTPM(pcrs: [Int] = []) throws(LockboxError) -> DeviceKeySealing {
        let path = resolvedKeyPath
        let tpm = TPM.at(tpmDevice)
        defer { tpm.disconnect() }
        let (available, reason) = tpm.availability()
        guard available else {
            throw LockboxError(.notAvailable, "Sealing the device key needs a TPM: \(reason) Nothing was changed.")
        }
        let key: SecretBytes
        let outcome: DeviceKeySealing
        switch try DeviceKeyFile.read(path) {
        case .clear(let existing):
            key = existing
            outcome = .migratedFromFile
        case .sealed(let sealed):
            key = try sealed.unseal(self)
            outcome = .resealed
        case nil:
            try FilePermissions.createPrivateDirectory(FilePermissions.directory(of: path))
            key = Crypto.generateKey()
            outcome = .created
        }
        let identifier = DeviceSecret.identifier(of: DeviceSecret.combine(key, self))
        let sealed = DeviceKeyFile.Sealed(identifier: identifier, blob: try tpm.seal(key, pcrs: pcrs))
        let temporary = try DeviceKeyFile.writeBeside(path, sealed.bytes)
        // Verified from the disk, through a fresh connection, before the clear key goes.
        do throws(LockboxError) {
            tpm.disconnect()
            guard case .sealed(let written) = try DeviceKeyFile.read(temporary), written.identifier == identifier,
                try written.unseal(self) == key
            else {
                throw LockboxError(.io, "The sealed device key did not read back as written; nothing was changed.")
            }
        } catch {
            unlink(temporary)
            throw error
        }
        if outcome == .created {
            // link(2) fails when another process made a key meanwhile: that one is kept.
            let linked = link(temporary, path)
            let error = errno
            unlink(temporary)
            guard linked == 0 else {
                throw LockboxError(
                    error == EEXIST ? .duplicateItem : .io,
                    "Cannot write the device key \(path) (errno \(error)): another process may have made one; run the command again.")
            }
            return outcome
        }
        try DeviceKeyFile.replace(path, with: temporary)
        return outcome
    }
}

extension Vault {
    /// Why this machine's device key could not be had when the vault was opened (its TPM does
    /// not unseal it here, or no TPM can be used); nil when it is at hand. `*ThisDeviceOnly`
    /// items then throw this error, and the other items work as usual.
    public var deviceKeyUnavailability: LockboxError? {
        withState { $0.device.unavailability }
    }
}
