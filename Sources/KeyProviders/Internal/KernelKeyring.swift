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
///
/// Each link in a keyring costs its owner 4 bytes of quota. The kernel gives them back when a
/// link is unlinked, never when its garbage collector drops the link of an invalidated,
/// revoked or expired key: a keyring that lives for months would slowly fill the user's
/// 20,000 bytes with nothing. So a key is unlinked before it is invalidated, links to dead keys
/// are unlinked whenever Lockbox lists its entries, and when the quota is full anyway (charge
/// left by timed-out keys, or by earlier releases) the keyring is renewed: a new one takes the
/// live keys and the old one, with its charge, is dropped (``renewKeyring()``).
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
            return try searchLockboxKeyring()
        } catch where error.isMissing {
            let serial = Serial(try call("add_key") { Int(add_key("keyring", keyringName, nil, 0, KEY_SPEC_USER_KEYRING)) })
            try setPermissions(serial)
            return serial
        }
    }

    /// Adds (or replaces) a key in the `lockbox` keyring, readable only by this user's processes.
    /// - Parameter timeout: seconds until the kernel forgets it; nil keeps it until reboot.
    package static func store(_ payload: SecretBytes, description: String, timeout: UInt32?) throws(Failure) -> Serial {
        // A renewal by another process between this one's lookup of the keyring and its add
        // drops the key with the old keyring: added again into the one in @u.
        for _ in 0..<3 {
            let (serial, keyring) = try addRenewingWhenFull(payload, description: description)
            do {
                try setPermissions(serial)
                // Also clears the countdown of a key this one replaced (0: no timeout).
                try setTimeout(serial, seconds: timeout ?? 0)
            } catch where error.isMissing {
                continue  // its keyring cleared by a renewal meanwhile: added again
            } catch {
                // A key whose permissions or timeout did not apply must not stay behind.
                try? remove(serial)
                throw error
            }
            if (try? searchLockboxKeyring()) == keyring { return serial }
        }
        throw Failure(operation: "add_key", errno: EAGAIN)
    }

    /// Adds (or replaces) a small entry that is no secret (a vault's generation) in the `lockbox`
    /// keyring, without a timeout. Unlike ``store(_:description:timeout:)`` it never renews the
    /// keyring: a quota with no room for it is an error the caller may pass over.
    package static func storeSmall(_ payload: [UInt8], description: String) throws(Failure) -> Serial {
        let keyring = try lockboxKeyring()
        let serial = Serial(try call("add_key") { payload.withUnsafeBytes { Int(add_key("user", description, $0.baseAddress, $0.count, keyring)) } })
        do {
            try setPermissions(serial)
        } catch {
            try? remove(serial)
            throw error
        }
        return serial
    }

    /// The payload of a small entry that is no secret (at most `capacity` bytes), read in one
    /// system call into ordinary memory: nil when the key is gone or larger.
    package static func readSmall(_ serial: Serial, capacity: Int) -> [UInt8]? {
        var buffer = [UInt8](repeating: 0, count: capacity + 1)
        let read = buffer.withUnsafeMutableBytes { keyctl_read(serial, $0.baseAddress!.assumingMemoryBound(to: CChar.self), $0.count) }
        guard read >= 0, read <= capacity else { return nil }
        return Array(buffer[0..<Int(read)])
    }

    /// Replaces the payload of an existing key in one system call; false when it is gone.
    package static func update(_ serial: Serial, with payload: [UInt8]) -> Bool {
        payload.withUnsafeBytes { keyctl_update(serial, $0.baseAddress, $0.count) } == 0
    }

    /// Adds the key to the `lockbox` keyring; when the quota is full, renews the keyring (one
    /// process at a time) and adds again. Returns the key and the keyring it went into.
    private static func addRenewingWhenFull(_ payload: SecretBytes, description: String) throws(Failure) -> (Serial, keyring: Serial) {
        func add() throws(Failure) -> (Serial, keyring: Serial) {
            // The keyring just looked up may be dropped by a renewal before the add: looked up again.
            var attempt = 0
            while true {
                let keyring = try lockboxKeyring()
                do {
                    let serial = try call("add_key") {
                        payload.withUnsafeBytes { Int(add_key("user", description, $0.baseAddress, $0.count, keyring)) }
                    }
                    return (Serial(serial), keyring)
                } catch where error.isMissing && attempt < 3 {
                    attempt += 1
                }
            }
        }
        do {
            return try add()
        } catch where error.isQuotaExceeded {
            // Renewing gives back bytes, never keys: a quota full of keys is reported as it is.
            if let use = quotaUse(), use.keys >= use.maximumKeys { throw error }
            let full = error
            return try withRenewalLock(otherwise: full) { () throws(Failure) -> (Serial, keyring: Serial) in
                // Another process may have renewed the keyring while this one waited.
                if let added = try? add() { return added }
                try renewKeyring()
                return try retryingWhileCollected(add)
            }
        }
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
        // A key of the `lockbox` keyring is unlinked first, which gives the link's quota back
        // (the collector, which drops an invalidated key's link, does not); ours grant their
        // user every permission, so it is still invalidated afterwards, no longer possessed. A
        // key loose in @u (an earlier release's) may grant only its possessor: invalidated as is.
        if let keyring = try? searchLockboxKeyring() {
            _ = try? call("keyctl_unlink") { keyctl_unlink(serial, keyring) }
        }
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

    /// The serials and descriptions of the `user` keys in the `lockbox` keyring (and in a keyring
    /// a renewal left inside it), and of those linked directly in `@u` (where earlier releases
    /// stored theirs). Links in the `lockbox` keyring to keys that are gone (timed out, revoked)
    /// are unlinked on the way, giving their quota back.
    package static func entries() throws(Failure) -> [(serial: Serial, description: String)] {
        try entries(in: lockboxKeyring(), unlinkingDead: true) + entries(in: KEY_SPEC_USER_KEYRING, unlinkingDead: false)
    }

    /// Replaces the `lockbox` keyring by a new one that holds the same live keys, and drops the
    /// old one with the quota its dropped links still hold. Callers hold the renewal lock
    /// (``withRenewalLock(otherwise:_:)``): two renewals at once would each move the keys
    /// and the second displace the first's keyring, keys and all.
    ///
    /// Needs 16 bytes of room: 8 for the new keyring, 4 for its link, 4 for the key being moved
    /// (a move gives the old link's 4 back); dead links are unlinked first, 4 bytes each. With
    /// less it throws EDQUOT without starting, and the caller makes room from its own entries
    /// (``KeyCache`` frees other vaults' keys) or reports the full quota.
    ///
    /// The new keyring is made inside the old one, which holds it until it takes the old one's
    /// place in @u. A renewal that stops part-way (out of room because another process stored
    /// meanwhile, or killed) leaves it there, where searches from @u still find its keys; the
    /// next renewal carries on with it.
    package static func renewKeyring() throws(Failure) {
        let old = try lockboxKeyring()
        var live: [Serial] = []
        var leftover: Serial?
        for serial in try serials(in: old) {
            do {
                let key = try describe(serial)
                if key?.type == "keyring" && key?.description == keyringName && leftover == nil {
                    leftover = serial
                } else {
                    live.append(serial)
                }
            } catch where error.isMissing {
                _ = try? call("keyctl_unlink") { keyctl_unlink(serial, old) }
            } catch {
                live.append(serial)  // not for this process to judge: kept
            }
        }
        let needed = (leftover == nil ? 8 + 4 : 0) + 4
        if let use = quotaUse(), use.maximumBytes - use.bytes < needed {
            throw Failure(operation: "add_key", errno: EDQUOT)
        }
        let new: Serial
        if let leftover {
            new = leftover
        } else {
            new = Serial(try call("add_key") { Int(add_key("keyring", keyringName, nil, 0, old)) })
            do throws(Failure) {
                try setPermissions(new)
            } catch {
                _ = try? call("keyctl_unlink") { keyctl_unlink(new, old) }
                throw error
            }
        }
        // `exclusive`: a key of the same name already in the new keyring (stored again there
        // by its process) is the newer one: the old keyring's copy is left to go with it.
        func move(_ serials: [Serial], exclusive: Bool) throws(Failure) {
            for serial in serials where serial != new {
                do {
                    _ = try call("keyctl_move") { keyctl_move(serial, old, new, exclusive ? UInt32(KEYCTL_MOVE_EXCL) : 0) }
                } catch where error.isMissing || error.errno == ENOENT || (exclusive && error.errno == EEXIST) {
                    continue  // removed, or timed out, meanwhile; or newer in the new keyring
                } catch where error.errno == EOPNOTSUPP {
                    // A kernel before 5.1 has no move: linked, the old link's charge dropped with it.
                    _ = try call("keyctl_link") { keyctl_link(serial, new) }
                }
            }
        }
        try move(live, exclusive: false)
        // Keys other processes stored into the old keyring meanwhile (they hold no lock).
        try move(serials(in: old), exclusive: false)
        // Same type and name: replaces the old keyring's link in @u.
        _ = try call("keyctl_link") { keyctl_link(new, KEY_SPEC_USER_KEYRING) }
        // A store into the old keyring that checked it was still in @u just before the line
        // above returned: its key is moved too. Any later store sees the new keyring in @u and
        // stores again there.
        try? move(serials(in: old), exclusive: true)
        // Gives the old keyring's charge back now rather than when the collector frees it
        // (then it is gone already: nothing to do).
        _ = try? call("keyctl_clear") { keyctl_clear(old) }
    }

    /// The user's quota use, from /proc/key-users; nil when it cannot be read.
    static func quotaUse() -> (keys: Int, maximumKeys: Int, bytes: Int, maximumBytes: Int)? {
        let descriptor = open("/proc/key-users", O_RDONLY | O_CLOEXEC)
        guard descriptor >= 0 else { return nil }
        defer { close(descriptor) }
        var contents: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 16 * 1024)
        while true {
            let read = chunk.withUnsafeMutableBytes { Glibc.read(descriptor, $0.baseAddress, $0.count) }
            if read < 0 && Glibc.errno == EINTR { continue }
            guard read >= 0 else { return nil }
            if read == 0 { break }
            contents += chunk[..<read]
        }
        // Complete lines only. "  1000:     5 5/5 5/200 123/20000": uid, usage,
        // keys/instantiated, keys/maximum, bytes/maximum.
        guard let end = contents.lastIndex(of: UInt8(ascii: "\n")) else { return nil }
        let uid = "\(getuid()):"
        for line in String(decoding: contents[..<end], as: UTF8.self).split(separator: "\n") {
            let fields = line.split(separator: " ")
            guard fields.count >= 5, fields[0] == uid else { continue }
            let keys = fields[3].split(separator: "/").compactMap { Int($0) }
            let bytes = fields[4].split(separator: "/").compactMap { Int($0) }
            guard keys.count == 2, bytes.count == 2 else { return nil }
            return (keys[0], keys[1], bytes[0], bytes[1])
        }
        return nil
    }

    /// Runs `body` holding the user's renewal lock: an abstract Unix socket name bound while
    /// `body` runs (released by the kernel also when the process dies). The name holds the
    /// serial of the user keyring `@u`, the same for all of the user's processes and never
    /// visible to other users, so they cannot squat it. Processes of this user in another
    /// network namespace do not see the name: they can renew at the same time (a service with
    /// a private network beside the CLI, both meeting a full quota at once). When the lock
    /// cannot be had, within 2 s, `otherwise` is thrown: no renewal without it.
    private static func withRenewalLock<T>(otherwise failure: Failure, _ body: () throws(Failure) -> T) throws(Failure) -> T {
        let user = keyctl_get_keyring_ID(KEY_SPEC_USER_KEYRING, 0)
        guard user > 0 else { throw failure }
        let descriptor = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard descriptor >= 0 else { throw failure }
        defer { close(descriptor) }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        // A leading NUL: the abstract namespace, no file.
        let name = Array("\0lockbox.keyring-renewal.\(getuid()).\(user)".utf8)
        withUnsafeMutableBytes(of: &address.sun_path) { path in
            path.copyBytes(from: name.prefix(path.count))
        }
        let length = socklen_t(MemoryLayout.offset(of: \sockaddr_un.sun_path)! + name.count)
        for attempt in 0...400 {
            let bound = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(descriptor, $0, length) }
            }
            if bound == 0 { return try body() }
            guard Glibc.errno == EADDRINUSE, attempt < 400 else { throw failure }
            usleep(5_000)
        }
        throw failure
    }

    /// Runs `body` again while it fails for a full quota, for up to about a tenth of a second:
    /// keys that were just removed give their bytes back only when the kernel's collector, which
    /// runs right after, has freed them.
    private static func retryingWhileCollected<T>(_ body: () throws(Failure) -> T) throws(Failure) -> T {
        var attempt = 0
        while true {
            do {
                return try body()
            } catch where error.isQuotaExceeded && attempt < 10 {
                attempt += 1
                usleep(10_000)
            }
        }
    }

    /// The `lockbox` keyring in @u, without creating it.
    private static func searchLockboxKeyring() throws(Failure) -> Serial {
        Serial(try call("keyctl_search") { keyctl_search(KEY_SPEC_USER_KEYRING, "keyring", keyringName, 0) })
    }

    /// The serials a keyring links to.
    private static func serials(in keyring: Serial) throws(Failure) -> [Serial] {
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
                return serials
            }
        }
    }

    private static func entries(in keyring: Serial, unlinkingDead: Bool) throws(Failure) -> [(serial: Serial, description: String)] {
        var entries: [(serial: Serial, description: String)] = []
        for serial in try serials(in: keyring) {
            let key: (type: String, description: String)?
            do {
                key = try describe(serial)
            } catch where error.isMissing {
                // Timed out or revoked, its link not yet dropped by the collector (which would
                // keep the link's quota): unlinked now. Or gone meanwhile.
                if unlinkingDead { _ = try? call("keyctl_unlink") { keyctl_unlink(serial, keyring) } }
                continue
            }
            // The new keyring of a renewal that stopped part-way: its keys are Lockbox's too.
            if unlinkingDead, let key, key.type == "keyring", key.description == keyringName, keyring != serial {
                entries += (try? Self.entries(in: serial, unlinkingDead: false)) ?? []
                continue
            }
            guard let key, key.type == "user" else { continue }
            entries.append((serial, key.description))
        }
        return entries
    }

    /// A key's type and description; nil for one whose description is longer than Lockbox's
    /// or that the kernel describes in a form not known here.
    private static func describe(_ serial: Serial) throws(Failure) -> (type: String, description: String)? {
        var buffer = [CChar](repeating: 0, count: 512)
        let length = try call("keyctl_describe") {
            buffer.withUnsafeMutableBufferPointer { keyctl_describe(serial, $0.baseAddress, $0.count) }
        }
        guard length <= buffer.count else { return nil }  // not one of ours: ours are short
        // "type;uid;gid;perm;description"
        let text = String(decoding: buffer.prefix(max(0, length - 1)).map { UInt8(bitPattern: $0) }, as: UTF8.self)
        let fields = text.split(separator: ";", maxSplits: 4, omittingEmptySubsequences: false)
        guard fields.count == 5 else { return nil }
        return (String(fields[0]), String(fields[4]))
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
