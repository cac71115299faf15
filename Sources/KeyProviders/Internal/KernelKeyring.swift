internal import CKeyutils
import LockboxCore

#if canImport(Glibc)
import Glibc
#endif

/// The Linux kernel keyring as the cache of unlocked key material (keyutils). This target is
/// the only importer of CKeyutils.
///
/// Keys are `user` keys in the user keyring `@u`: kernel memory, never swapped, shared by the
/// user's processes, gone at reboot. The session keyring `@s` is avoided on purpose: in a
/// process without a PAM session, adding to `@s` creates a fresh anonymous session keyring and
/// the process loses sight of `@u`'s keys.
package enum KernelKeyring {
    /// The kernel's serial number of a key.
    package typealias Serial = Int32

    /// Why a key could not be read.
    package enum Absence: Error, Sendable {
        /// No such key, or it was invalidated, revoked or timed out.
        case missing
        /// The kernel keyring cannot be used in this process (no keyutils support,
        /// a seccomp filter, ...). `reason` names what failed.
        case unavailable(reason: String)
    }

    // The user (same uid) may view, read, search and change the key; nobody else.
    private static let permissions: UInt32 = 0x3f00_0000 | 0x003f_0000

    /// Adds (or replaces) a key, readable only by this user's processes.
    /// - Parameter timeout: seconds until the kernel forgets it; nil keeps it until reboot.
    package static func store(_ payload: SecretBytes, description: String, timeout: UInt32?) throws(Absence) -> Serial {
        let serial = payload.withUnsafeBytes { bytes in
            add_key("user", description, bytes.baseAddress, bytes.count, KEY_SPEC_USER_KEYRING)
        }
        guard serial > 0 else { throw unavailable("add_key") }
        _ = keyctl_setperm(serial, permissions)
        if let timeout {
            _ = keyctl_set_timeout(serial, timeout)
        }
        return serial
    }

    /// The serial of the key with this description in `@u`.
    package static func find(_ description: String) throws(Absence) -> Serial {
        let serial = keyctl_search(KEY_SPEC_USER_KEYRING, "user", description, 0)
        if serial > 0 { return Serial(serial) }
        throw absence(for: errno, operation: "keyctl_search")
    }

    /// The key's payload in guarded memory.
    package static func read(_ serial: Serial) throws(Absence) -> SecretBytes {
        let size = keyctl_read(serial, nil, 0)
        guard size >= 0 else { throw absence(for: errno, operation: "keyctl_read") }
        var failure: Int32 = 0
        let payload = SecretBytes(capacity: Int(size)) { buffer in
            let read = buffer.baseAddress.map {
                keyctl_read(serial, $0.assumingMemoryBound(to: CChar.self), buffer.count)
            } ?? keyctl_read(serial, nil, 0)
            guard read == size else {
                failure = errno
                return 0
            }
            return Int(size)
        }
        if failure != 0 || payload.count != Int(size) {
            throw absence(for: failure, operation: "keyctl_read")
        }
        return payload
    }

    /// True while the key exists and is readable (one system call, nothing copied).
    package static func isValid(_ serial: Serial) -> Bool {
        keyctl_read(serial, nil, 0) >= 0
    }

    /// Restarts the key's countdown (the idle timeout).
    package static func setTimeout(_ serial: Serial, seconds: UInt32) {
        _ = keyctl_set_timeout(serial, seconds)
    }

    /// Makes the key unusable at once, for every process.
    package static func remove(_ serial: Serial) {
        if keyctl_invalidate(serial) != 0 {
            _ = keyctl_revoke(serial)
        }
    }

    /// Removes the key with this description, if there is one.
    package static func remove(description: String) {
        while let serial = try? find(description) {
            remove(serial)
        }
    }

    /// Whether this process can use the kernel keyring at all.
    package static var isAvailable: Bool {
        // Searching for a key that cannot exist tells ENOKEY (usable) from ENOSYS/EPERM.
        let result = keyctl_search(KEY_SPEC_USER_KEYRING, "user", "lockbox:probe:absent", 0)
        return result > 0 || errno == ENOKEY || errno == EKEYREVOKED || errno == EKEYEXPIRED
    }

    private static func absence(for code: Int32, operation: String) -> Absence {
        switch code {
        case ENOKEY, EKEYREVOKED, EKEYEXPIRED, 0: .missing
        default: .unavailable(reason: "\(operation) failed: \(String(cString: strerror(code)))")
        }
    }

    private static func unavailable(_ operation: String) -> Absence {
        .unavailable(reason: "\(operation) failed: \(String(cString: strerror(errno)))")
    }
}
