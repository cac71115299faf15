internal import CKeyutils
import LockboxCore

#if canImport(Glibc)
import Glibc
#endif

/// The Linux kernel keyring as the cache of unlocked key material (keyutils). This target is
/// the only importer of CKeyutils.
///
/// Keys are `user` keys in the keyring `lockbox`, which is linked into the user keyring `@u`:
/// kernel memory, never swapped, shared by the user's processes, gone at reboot. One keyring of
/// our own lets Lockbox list and free its entries without touching other programs' keys (an
/// ordinary user's quota is 200 keys and 20,000 bytes for everything). The session keyring
/// `@s` is avoided on purpose: in a process without a PAM session, adding to `@s` creates a
/// fresh anonymous session keyring and the process loses sight of `@u`'s keys.
///
/// Every call goes through ``call(_:_:)``: EINTR is retried, errno is captured at once and
/// thrown as a ``Failure``.
package enum KernelKeyring {
    /// The kernel's serial number of a key.
    package typealias Serial = Int32

    /// A keyutils call that failed, with its errno.
    package struct Failure: Error, Sendable, Hashable {
        /// The call (`add_key`, `keyctl_set_timeout`, ...).
        package let operation: String
        package let errno: Int32

        /// The key is gone: it never existed, or was invalidated, revoked or timed out.
        package var isMissing: Bool { errno == ENOKEY || errno == EKEYREVOKED || errno == EKEYEXPIRED }
        /// The user's key quota (`/proc/sys/kernel/keys/maxkeys`, `maxbytes`) is used up.
        package var isQuotaExceeded: Bool { errno == EDQUOT }

        /// `add_key failed: Disk quota exceeded`.
        package var reason: String { "\(operation) failed: \(String(cString: strerror(errno)))" }

        /// The cause for a ``LockboxError``.
        package var cause: LockboxError.Cause { .systemCall(operation, errno: errno) }
    }

    /// Why a key could not be read.
    package enum Absence: Error, Sendable {
        /// No such key, or it was invalidated, revoked or timed out.
        case missing
        /// The kernel keyring cannot be used in this process (no keyutils support, a seccomp
        /// filter, a full quota, ...).
        case unavailable(Failure)
    }

    /// The keyring's name in `@u`.
    package static let keyringName = "lockbox"

    // The user (same uid) and possessor may view, read, write, search, link and set attributes;
    // nobody else may do anything.
    private static let permissions: UInt32 = 0x3f00_0000 | 0x003f_0000

    /// The one funnel for keyutils calls: retries EINTR, captures errno before anything else
    /// can change it, throws it. `body` returns the call's result (negative on failure).
    @inline(__always)
    static func call(_ operation: String, _ body: () -> Int) throws(Failure) -> Int {
        while true {
            let result = body()
            if result >= 0 { return result }
            let code = Glibc.errno
            if code == EINTR { continue }
            throw Failure(operation: operation, errno: code)
        }
    }

    /// The `lockbox` keyring in `@u`, created (private to this user) when missing.
    package static func lockboxKeyring() throws(Failure) -> Serial {
        do {
            return Serial(try call("keyctl_search") { keyctl_search(KEY_SPEC_USER_KEYRING, "keyring", keyringName, 0) })
        } catch where error.isMissing {
            let serial = Serial(try call("add_key") { Int(add_key("keyring", keyringName, nil, 0, KEY_SPEC_USER_KEYRING)) })
            try setPermissions(serial)
            return serial
        }
    }

    /// Adds (or replaces) a key in the `lockbox` keyring, readable only by this user's processes.
    /// - Parameter timeout: seconds until the kernel forgets it; nil keeps it until reboot.
    package static func store(_ payload: SecretBytes, description: String, timeout: UInt32?) throws(Failure) -> Serial {
        let keyring = try lockboxKeyring()
        let serial = Serial(
            try call("add_key") {
                payload.withUnsafeBytes { Int(add_key("user", description, $0.baseAddress, $0.count, keyring)) }
            })
        do {
            try setPermissions(serial)
            // Also clears the countdown of a key this one replaced (0: no timeout).
            try setTimeout(serial, seconds: timeout ?? 0)
        } catch {
            // A key whose permissions or timeout did not apply must not stay behind.
            try? remove(serial)
            throw error
        }
        return serial
    }

    /// The serial of the key with this description in `@u` (searched recursively, so also in
    /// the `lockbox` keyring).
    package static func find(_ description: String) throws(Absence) -> Serial {
        do {
            return Serial(try call("keyctl_search") { keyctl_search(KEY_SPEC_USER_KEYRING, "user", description, 0) })
        } catch {
            throw absence(error)
        }
    }

    /// The key's payload in guarded memory.
    package static func read(_ serial: Serial) throws(Absence) -> SecretBytes {
        do throws(Failure) {
            let size = try call("keyctl_read") { keyctl_read(serial, nil, 0) }
            var failure: Failure?
            let payload = SecretBytes(capacity: size) { buffer in
                guard let start = buffer.baseAddress else { return 0 }
                do throws(Failure) {
                    let read = try call("keyctl_read") {
                        keyctl_read(serial, start.assumingMemoryBound(to: CChar.self), buffer.count)
                    }
                    // A key updated between the two calls changed size: report it as gone.
                    guard read == size else {
                        failure = Failure(operation: "keyctl_read", errno: EKEYREVOKED)
                        return 0
                    }
                    return read
                } catch {
                    failure = error
                    return 0
                }
            }
            if let failure { throw failure }
            return payload
        } catch {
            throw absence(error)
        }
    }

    /// True while the key exists and is readable (one system call, nothing copied).
    package static func isValid(_ serial: Serial) throws(Absence) -> Bool {
        do {
            _ = try call("keyctl_read") { keyctl_read(serial, nil, 0) }
            return true
        } catch where error.isMissing {
            return false
        } catch {
            throw .unavailable(error)
        }
    }

    /// Restarts the key's countdown (the idle timeout).
    package static func setTimeout(_ serial: Serial, seconds: UInt32) throws(Failure) {
        _ = try call("keyctl_set_timeout") { keyctl_set_timeout(serial, seconds) }
    }

    /// Makes the key unusable at once, for every process: invalidated, or else revoked. A key
    /// that is already gone counts as removed.
    /// - Throws: when the kernel refuses both.
    package static func remove(_ serial: Serial) throws(Failure) {
        do {
            _ = try call("keyctl_invalidate") { keyctl_invalidate(serial) }
        } catch where error.isMissing {
            return
        } catch {
            do {
                _ = try call("keyctl_revoke") { keyctl_revoke(serial) }
            } catch where error.isMissing {
                return
            }
        }
    }

    /// Removes every key with this description.
    /// - Throws: when a key cannot be removed, or keeps reappearing (another process storing it
    ///   as fast as this one removes it): never loops forever.
    package static func remove(description: String) throws(Failure) {
        for _ in 0..<16 {
            let serial: Serial
            do {
                serial = try find(description)
            } catch {
                switch error {
                case .missing: return
                case .unavailable(let failure): throw failure
                }
            }
            try remove(serial)
        }
        throw Failure(operation: "keyctl_invalidate", errno: EAGAIN)
    }

    /// The serials and descriptions of the `user` keys in the `lockbox` keyring, and of those
    /// linked directly in `@u` (where earlier releases stored theirs).
    package static func entries() throws(Failure) -> [(serial: Serial, description: String)] {
        try entries(in: lockboxKeyring()) + entries(in: KEY_SPEC_USER_KEYRING)
    }

    private static func entries(in keyring: Serial) throws(Failure) -> [(serial: Serial, description: String)] {
        var serials: [Serial] = []
        // The list can grow between the size query and the read: read until it fits.
        while true {
            let size = try call("keyctl_read") { keyctl_read(keyring, nil, 0) }
            serials = [Serial](repeating: 0, count: size / MemoryLayout<Serial>.size + 8)
            let read = try call("keyctl_read") {
                serials.withUnsafeMutableBytes { buffer in
                    keyctl_read(keyring, buffer.baseAddress!.assumingMemoryBound(to: CChar.self), buffer.count)
                }
            }
            if read <= serials.count * MemoryLayout<Serial>.size {
                serials.removeLast(serials.count - read / MemoryLayout<Serial>.size)
                break
            }
        }
        var entries: [(serial: Serial, description: String)] = []
        for serial in serials {
            var buffer = [CChar](repeating: 0, count: 512)
            let length: Int
            do {
                length = try call("keyctl_describe") {
                    buffer.withUnsafeMutableBufferPointer { keyctl_describe(serial, $0.baseAddress, $0.count) }
                }
            } catch where error.isMissing {
                continue  // gone meanwhile (timed out, locked by another process)
            }
            guard length <= buffer.count else { continue }  // not one of ours: ours are short
            // "type;uid;gid;perm;description"
            let text = String(decoding: buffer.prefix(max(0, length - 1)).map { UInt8(bitPattern: $0) }, as: UTF8.self)
            let fields = text.split(separator: ";", maxSplits: 4, omittingEmptySubsequences: false)
            guard fields.count == 5, fields[0] == "user" else { continue }
            entries.append((serial, String(fields[4])))
        }
        return entries
    }

    /// Whether this process can use the kernel keyring at all.
    package static var isAvailable: Bool {
        // Searching for a key that cannot exist tells ENOKEY (usable) from ENOSYS/EPERM.
        do {
            _ = try call("keyctl_search") { keyctl_search(KEY_SPEC_USER_KEYRING, "user", "lockbox:probe:absent", 0) }
            return true
        } catch {
            return error.isMissing
        }
    }

    private static func setPermissions(_ serial: Serial) throws(Failure) {
        _ = try call("keyctl_setperm") { keyctl_setperm(serial, permissions) }
    }

    private static func absence(_ failure: Failure) -> Absence {
        failure.isMissing ? .missing : .unavailable(failure)
    }
}
