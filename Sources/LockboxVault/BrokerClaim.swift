import LockboxCore

#if canImport(Glibc)
import Glibc
#endif

/// Who may open a vault file: `lockboxd`, alone, or any number of embedded handles.
///
/// A broker keeps the vault's unlocked keys in its own memory; an embedded handle keeps them in
/// the kernel keyring. Both on one file would give two lock states for one vault and two
/// writers, so they never share it: the broker holds an exclusive `flock(2)` on `VAULT.broker`
/// for as long as it serves the vault, and every embedded handle holds a shared one for its
/// life (creating the file when no broker ever served the vault). Whichever comes second is
/// refused with a message naming the other's process. The lock is on a file of its own, never
/// on the vault file: closing any descriptor of the vault file would drop SQLite's POSIX locks
/// on it. A lock held by a process dies with it, so a killed broker or program leaves nothing
/// to clean up.
package final class BrokerClaim: Sendable {
    private let descriptor: Int32
    /// Whether this is the broker's exclusive claim.
    package let isExclusive: Bool

    private init(descriptor: Int32, isExclusive: Bool) {
        self.descriptor = descriptor
        self.isExclusive = isExclusive
    }

    deinit { close(descriptor) }

    /// The lock file beside the vault.
    package static func lockPath(forVault path: String) -> String { path + ".broker" }

    /// Whether the lock file at `vaultPath`'s lock path is still the file this claim locks: a
    /// file removed (a clean-up, a restore) or replaced there lets a program take a claim of
    /// its own on a new file, unaware of this one.
    package func isInPlace(vaultPath: String) -> Bool {
        var held = stat()
        var named = stat()
        guard fstat(descriptor, &held) == 0, lstat(Self.lockPath(forVault: vaultPath), &named) == 0 else { return false }
        return held.st_dev == named.st_dev && held.st_ino == named.st_ino
    }

    /// The broker's claim: creates the lock file (0600) and takes it exclusively.
    /// - Throws: `errSecNotAvailable` when another broker serves the vault or an embedded handle
    ///   has it open, naming the processes that hold it and what to do.
    package static func claimForBroker(vaultPath path: String) throws(LockboxError) -> BrokerClaim {
        let lockPath = lockPath(forVault: path)
        let descriptor = StandardDescriptors.movedAbove(open(lockPath, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0o600))
        guard descriptor >= 0 else {
            throw LockboxError(
                .io, "Cannot open \(lockPath): \(String(cString: strerror(errno))).", cause: .systemCall("open", errno: errno))
        }
        guard try lockOrClose(descriptor, LOCK_EX | LOCK_NB) else {
            let holders = Holders(of: descriptor)
            close(descriptor)
            if holders.exclusive.isEmpty, !holders.shared.isEmpty {
                throw LockboxError(
                    .notAvailable,
                    "The keychain \(path) is in use by a program that opened it directly (embedded mode): "
                        + "\(holders.describe(holders.shared)). Only one of lockboxd and such programs may write a keychain. "
                        + "Let that program finish (or stop it), or run it through the broker (LOCKBOX_BROKER=1), then start lockboxd again.")
            }
            throw LockboxError(
                .notAvailable,
                "The keychain \(path) is in use by another lockboxd"
                    + (holders.exclusive.isEmpty ? "" : " (\(holders.describe(holders.exclusive)))")
                    + " or by a program that opened it directly (embedded mode). "
                    + "Use the running broker (LOCKBOX_BROKER=1), or stop it (`lockbox broker stop`), then start lockboxd again.")
        }
        return BrokerClaim(descriptor: descriptor, isExclusive: true)
    }

    /// An embedded handle's claim: a shared lock on the lock file, created when missing, so that
    /// a broker started later finds it held. Nil only when the file can be neither opened nor
    /// created (a read-only directory): then no broker can create it to claim the vault either.
    /// - Throws: `errSecNotAvailable` while `lockboxd` serves the vault, naming its process.
    static func claimForEmbedded(vaultPath path: String) throws(LockboxError) -> BrokerClaim? {
        let lockPath = lockPath(forVault: path)
        var descriptor = StandardDescriptors.movedAbove(open(lockPath, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0o600))
        if descriptor < 0 && (errno == EACCES || errno == EROFS || errno == EPERM) {
            descriptor = StandardDescriptors.movedAbove(open(lockPath, O_RDONLY | O_CLOEXEC | O_NOFOLLOW))
            if descriptor < 0 && errno == ENOENT { return nil }
        }
        guard descriptor >= 0 else {
            throw LockboxError(
                .io, "Cannot open \(lockPath), which keeps lockboxd and this program from both writing the keychain: "
                    + "\(String(cString: strerror(errno))). Check the file and its directory (they are yours, mode 0600/0700).",
                cause: .systemCall("open", errno: errno))
        }
        guard try lockOrClose(descriptor, LOCK_SH | LOCK_NB) else {
            let holders = Holders(of: descriptor)
            close(descriptor)
            let broker = holders.exclusive.isEmpty ? "" : " (held by \(holders.describe(holders.exclusive)))"
            throw LockboxError(
                .notAvailable,
                "lockboxd serves the keychain \(path)\(broker): its keys are in the broker's memory, so it is not opened directly here. "
                    + "Use it through the broker (set LOCKBOX_BROKER=1, or Keychain.Options.backend = .broker), "
                    + "or stop lockboxd (`lockbox broker stop`).")
        }
        return BrokerClaim(descriptor: descriptor, isExclusive: false)
    }

    /// The processes holding `flock`s on an open file, from `/proc/locks`: for messages only
    /// (a process that forked after locking is named by its parent).
    struct Holders {
        var exclusive: [pid_t] = []
        var shared: [pid_t] = []

        init(of descriptor: Int32) {
            var info = stat()
            guard fstat(descriptor, &info) == 0 else { return }
            // "1: FLOCK  ADVISORY  WRITE 1234 fe:00:5678 0 EOF": the device's major and minor
            // in hex, the inode in decimal.
            let device = String(Self.major(info.st_dev), radix: 16) + ":" + String(Self.minor(info.st_dev), radix: 16)
            let file = device + ":" + String(info.st_ino)
            guard let text = Self.read("/proc/locks") else { return }
            for line in text.split(separator: "\n") {
                let fields = line.split(separator: " ", omittingEmptySubsequences: true)
                guard fields.count >= 6, fields[1] == "FLOCK", let pid = pid_t(fields[4]) else { continue }
                // A waiting lock's line begins "1: -> FLOCK": it holds nothing.
                guard Self.sameFile(String(fields[5]), file) else { continue }
                if fields[3] == "WRITE" { exclusive.append(pid) } else { shared.append(pid) }
            }
        }

        /// "pid 1234 (lockboxd), pid 99 (myapp)".
        func describe(_ pids: [pid_t]) -> String {
            pids.prefix(8).map { pid in
                let name = Self.read("/proc/\(pid)/comm").map { $0.filter { $0 != "\n" } } ?? ""
                return name.isEmpty ? "pid \(pid)" : "pid \(pid) (\(name))"
            }.joined(separator: ", ") + (pids.count > 8 ? ", and \(pids.count - 8) more" : "")
        }

        /// Device numbers are printed with at least two hex digits.
        private static func sameFile(_ listed: String, _ file: String) -> Bool {
            let left = listed.split(separator: ":"), right = file.split(separator: ":")
            guard left.count == 3, right.count == 3 else { return false }
            return zip(left.prefix(2), right.prefix(2)).allSatisfy { Int($0, radix: 16) == Int($1, radix: 16) } && left[2] == right[2]
        }

        private static func major(_ device: dev_t) -> UInt64 { (UInt64(device) >> 8) & 0xfff | (UInt64(device) >> 32) & ~0xfff }
        private static func minor(_ device: dev_t) -> UInt64 { UInt64(device) & 0xff | (UInt64(device) >> 12) & ~0xff }

        private static func read(_ path: String) -> String? {
            let descriptor = open(path, O_RDONLY | O_CLOEXEC)
            guard descriptor >= 0 else { return nil }
            defer { close(descriptor) }
            var bytes: [UInt8] = []
            var chunk = [UInt8](repeating: 0, count: 4096)
            while bytes.count < 1 << 20 {
                let count = chunk.withUnsafeMutableBytes { Glibc.read(descriptor, $0.baseAddress, $0.count) }
                if count < 0 && errno == EINTR { continue }
                guard count > 0 else { break }
                bytes += chunk[0..<count]
            }
            return String(decoding: bytes, as: UTF8.self)
        }
    }

    /// Whether a `lockboxd` holds the vault's exclusive claim now.
    package static func isServedByBroker(vaultPath path: String) -> Bool {
        let descriptor = open(lockPath(forVault: path), O_RDONLY | O_CLOEXEC | O_NOFOLLOW)
        guard descriptor >= 0 else { return false }
        defer { close(descriptor) }
        return (try? lock(descriptor, LOCK_SH | LOCK_NB)) == false
    }

    /// ``lock(_:_:)``, closing `descriptor` when it throws: the claim being made has no other owner.
    private static func lockOrClose(_ descriptor: Int32, _ operation: Int32) throws(LockboxError) -> Bool {
        do throws(LockboxError) {
            return try lock(descriptor, operation)
        } catch {
            close(descriptor)
            throw error
        }
    }

    /// Takes `operation`; false when another process holds a conflicting lock.
    private static func lock(_ descriptor: Int32, _ operation: Int32) throws(LockboxError) -> Bool {
        while flock(descriptor, operation) != 0 {
            switch errno {
            case EINTR: continue
            case EWOULDBLOCK: return false
            default:
                throw LockboxError(
                    .io, "Cannot lock the keychain's broker file: \(String(cString: strerror(errno))).",
                    cause: .systemCall("flock", errno: errno))
            }
        }
        return true
    }
}
