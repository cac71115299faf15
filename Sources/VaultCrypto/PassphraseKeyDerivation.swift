internal import CSodium
import LockboxCore

#if canImport(Glibc)
import Glibc
#endif

/// Argon2id parameters for turning a passphrase into a key.
///
/// The default is libsodium's MODERATE (3 passes, 256 MiB) where the machine allows it: as
/// cryptsetup does, new parameters fit the memory this process may use (its cgroup's limit,
/// its address-space and data limits, the memory available), down to libsodium's INTERACTIVE
/// memory (64 MiB), with more passes to keep the work about the same. ``interactive``
/// (2 passes, 64 MiB) is the lowest Lockbox accepts: a header asking for less is treated as
/// tampered. Deriving checks the limits first and throws a clear error rather than being
/// killed by the kernel.
package struct PassphraseKeyDerivation: Sendable, Hashable {
    package var operationsLimit: UInt64
    package var memoryLimit: UInt64
    package var salt: [UInt8]

    package static let saltByteCount = 16

    package static let minimumOperations: UInt64 = UInt64(crypto_pwhash_argon2id_OPSLIMIT_INTERACTIVE)
    package static let minimumMemory: UInt64 = UInt64(crypto_pwhash_argon2id_MEMLIMIT_INTERACTIVE)

    package enum Strength: String, Sendable, CaseIterable {
        /// 2 passes, 64 MiB: libsodium's INTERACTIVE, the floor.
        case interactive
        /// 3 passes, 256 MiB: libsodium's MODERATE, the default.
        case moderate
        /// 4 passes, 1 GiB: libsodium's SENSITIVE.
        case sensitive
    }

    /// Fresh parameters of the given strength with a random salt.
    ///
    /// `.moderate` fits `budget` (by default what this process may allocate now): 256 MiB
    /// where that leaves a margin of a quarter of the budget (at least 32 MiB), otherwise less,
    /// never below 64 MiB, with the passes raised so that passes x memory stays about that of
    /// MODERATE. `.interactive` and `.sensitive` are used as they are (deriving with
    /// `.sensitive` where 1 GiB cannot fit fails with a clear error).
    package init(strength: Strength, budget: MemoryBudget? = MemoryBudget.current(forNewParameters: true)) {
        switch strength {
        case .interactive:
            operationsLimit = UInt64(crypto_pwhash_argon2id_OPSLIMIT_INTERACTIVE)
            memoryLimit = UInt64(crypto_pwhash_argon2id_MEMLIMIT_INTERACTIVE)
        case .moderate:
            let moderate = UInt64(crypto_pwhash_argon2id_MEMLIMIT_MODERATE)
            let operations = UInt64(crypto_pwhash_argon2id_OPSLIMIT_MODERATE)
            memoryLimit = Self.fittedMemory(preferred: moderate, budget: budget)
            // Same work: passes x memory of MODERATE, rounded up.
            operationsLimit = max(operations, (operations * moderate + memoryLimit - 1) / memoryLimit)
        case .sensitive:
            operationsLimit = UInt64(crypto_pwhash_argon2id_OPSLIMIT_SENSITIVE)
            memoryLimit = UInt64(crypto_pwhash_argon2id_MEMLIMIT_SENSITIVE)
        }
        salt = Crypto.randomBytes(Self.saltByteCount)
    }

    package init(operationsLimit: UInt64, memoryLimit: UInt64, salt: [UInt8]) {
        self.operationsLimit = operationsLimit
        self.memoryLimit = memoryLimit
        self.salt = salt
    }

    /// True when these parameters are at least the floor Lockbox accepts.
    package var meetsMinimum: Bool {
        operationsLimit >= Self.minimumOperations && memoryLimit >= Self.minimumMemory
            && salt.count == Self.saltByteCount
            // An upper bound keeps an edited header from making unlock allocate without limit.
            && memoryLimit <= 4 << 30 && operationsLimit <= 64
    }

    /// The memory a new MODERATE derivation uses under `budget`: `preferred` when it leaves a
    /// margin, else what does (in whole MiB), never below the floor.
    static func fittedMemory(preferred: UInt64, budget: MemoryBudget?) -> UInt64 {
        guard let budget else { return preferred }
        let margin = max(budget.bytes / 4, 32 << 20)
        let fitting = budget.bytes > margin ? (budget.bytes - margin) & ~((1 << 20) - 1) : 0
        return max(minimumMemory, min(preferred, fitting))
    }

    /// Memory Argon2id needs beyond its blocks (its bookkeeping, the C library's mappings).
    package static let overheadBytes: UInt64 = 8 << 20

    /// Throws when these parameters cannot be derived within the memory this process may use
    /// (cgroup limit, `RLIMIT_AS`, `RLIMIT_DATA`), saying how much is needed and what to do.
    package func checkMemory(budget: MemoryBudget? = MemoryBudget.current(forNewParameters: false)) throws(LockboxError) {
        guard let budget, memoryLimit + Self.overheadBytes > budget.bytes else { return }
        let needed = (memoryLimit + Self.overheadBytes + (1 << 20) - 1) >> 20
        throw LockboxError(
            .allocate,
            "Deriving the key from the passphrase needs \(needed) MiB of memory (Argon2id, \(memoryLimit >> 20) MiB), "
                + "but this process may use only \(budget.bytes >> 20) MiB more (limited by \(budget.limitedBy)). "
                + "Raise that limit by at least \(needed - min(needed, budget.bytes >> 20)) MiB (a container's memory limit, "
                + "`docker run --memory`, `systemd-run -p MemoryMax=`, or `ulimit -v`). Keychains created under such "
                + "a limit fit it by themselves (`lockbox init`), and `lockbox init --kdf interactive` needs 72 MiB.")
    }

    /// Derives a 256-bit key from `passphrase`. Slow on purpose.
    /// - Returns: nil when the memory could not be allocated although the limits allowed it.
    /// - Throws: `allocate` when the limits this process runs under cannot fit the derivation
    ///   (see ``checkMemory(budget:)``).
    package func deriveKey(from passphrase: SecretBytes) throws(LockboxError) -> SecretBytes? {
        precondition(meetsMinimum, "Argon2id parameters below the floor must be rejected before deriving")
        try checkMemory()
        _ = Crypto.generateKey()  // makes sure libsodium is initialized
        var succeeded = false
        let key = SecretBytes(capacity: Crypto.keyByteCount) { output in
            passphrase.withUnsafeBytes { password in
                var empty: CChar = 0
                let passwordStart = password.baseAddress?.assumingMemoryBound(to: CChar.self)
                    ?? withUnsafeMutablePointer(to: &empty) { UnsafePointer($0) }
                let result = crypto_pwhash_argon2id(
                    output.baseAddress!.assumingMemoryBound(to: UInt8.self), UInt64(Crypto.keyByteCount),
                    passwordStart, UInt64(password.count),
                    salt, operationsLimit, Int(memoryLimit), crypto_pwhash_argon2id_ALG_ARGON2ID13)
                succeeded = result == 0
            }
            return Crypto.keyByteCount
        }
        // Argon2id fails only when it cannot allocate its memory.
        return succeeded ? key : nil
    }

    /// The parameters as bytes for the header (authenticated as associated data).
    package func encoded() -> [UInt8] {
        var encoder = FieldEncoder()
        encoder.string("argon2id13")
        encoder.integer(Int(operationsLimit))
        encoder.integer(Int(memoryLimit))
        encoder.bytes(salt)
        return encoder.bytes
    }

    package init?(decoding bytes: [UInt8]) {
        var decoder = FieldDecoder(bytes)
        guard let algorithm = try? decoder.string(), algorithm == "argon2id13",
            let operations = try? decoder.integer(), operations > 0,
            let memory = try? decoder.integer(), memory > 0,
            let salt = try? decoder.bytes(), decoder.isAtEnd
        else { return nil }
        self.init(operationsLimit: UInt64(operations), memoryLimit: UInt64(memory), salt: salt)
    }
}

/// How much more memory this process may allocate, and what limits it.
package struct MemoryBudget: Sendable, Hashable {
    package var bytes: UInt64
    /// The limit, for messages: "the cgroup limit /sys/fs/cgroup/.../memory.max", "RLIMIT_AS (ulimit -v)".
    package var limitedBy: String

    package init(bytes: UInt64, limitedBy: String) {
        self.bytes = bytes
        self.limitedBy = limitedBy
    }

    /// The tightest limit on this process now; nil when nothing limits it.
    ///
    /// Hard limits always count: the process's cgroup and its ancestors (v2 `memory.max`,
    /// v1 `memory.limit_in_bytes`, less what the cgroup uses apart from reclaimable page
    /// cache), `RLIMIT_AS` and `RLIMIT_DATA` (less what the process maps already). For new
    /// parameters (`forNewParameters`) the soft limits count too: cgroup v2 `memory.high` and
    /// the machine's `MemAvailable`; an existing vault is not refused for them, since they
    /// slow a derivation down but do not kill it.
    package static func current(forNewParameters: Bool) -> MemoryBudget? {
        var tightest: MemoryBudget?
        func consider(_ limit: UInt64, used: UInt64, _ name: String) {
            let left = limit > used ? limit - used : 0
            if tightest == nil || left < tightest!.bytes { tightest = MemoryBudget(bytes: left, limitedBy: name) }
        }
        let status = SystemFiles.fields("/proc/self/status")
        for (resource, name, usage) in [(RLIMIT_AS, "RLIMIT_AS (ulimit -v)", "VmSize"), (RLIMIT_DATA, "RLIMIT_DATA (ulimit -d)", "VmData")] {
            var limit = rlimit()
            guard getrlimit(__rlimit_resource_t(resource.rawValue), &limit) == 0, limit.rlim_cur != rlim_t.max else { continue }
            consider(UInt64(limit.rlim_cur), used: (status[usage] ?? 0) * 1024, name)
        }
        for cgroup in CgroupMemory.limits(includingSoft: forNewParameters) {
            consider(cgroup.limit, used: cgroup.used, cgroup.name)
        }
        if forNewParameters, let available = SystemFiles.fields("/proc/meminfo")["MemAvailable"] {
            consider(available * 1024, used: 0, "the memory available on this machine (MemAvailable)")
        }
        return tightest
    }
}

/// The memory limits of this process's cgroup and its ancestors (v2 and v1).
enum CgroupMemory {
    struct Limit {
        var limit: UInt64
        var used: UInt64
        var name: String
    }

    /// Limits below this are real; v1 writes "no limit" as a number near 2^63.
    private static let unlimited: UInt64 = 1 << 60

    static func limits(includingSoft: Bool) -> [Limit] {
        guard let membership = SystemFiles.read("/proc/self/cgroup") else { return [] }
        var limits: [Limit] = []
        for line in membership.split(separator: "\n") {
            let parts = line.split(separator: ":", maxSplits: 2, omittingEmptySubsequences: false)
            guard parts.count == 3 else { continue }
            let path = String(parts[2])
            if parts[1].isEmpty {
                // cgroup v2 (unified), mounted at /sys/fs/cgroup or, on hybrid systems, below it.
                let root = SystemFiles.read("/sys/fs/cgroup/cgroup.controllers") != nil ? "/sys/fs/cgroup" : "/sys/fs/cgroup/unified"
                let files = includingSoft ? ["memory.max", "memory.high"] : ["memory.max"]
                for directory in ancestors(root: root, path: path) {
                    let used = SystemFiles.number(directory + "/memory.current") ?? 0
                    let cache = SystemFiles.fields(directory + "/memory.stat", unit: 1)["file"] ?? 0
                    for file in files {
                        guard let limit = SystemFiles.number(directory + "/" + file), limit < unlimited else { continue }
                        limits.append(Limit(limit: limit, used: used - min(used, cache), name: "the cgroup limit \(directory)/\(file)"))
                    }
                }
            } else if parts[1].split(separator: ",").contains("memory") {
                for directory in ancestors(root: "/sys/fs/cgroup/memory", path: path) {
                    guard let limit = SystemFiles.number(directory + "/memory.limit_in_bytes"), limit < unlimited else { continue }
                    let used = SystemFiles.number(directory + "/memory.usage_in_bytes") ?? 0
                    let stat = SystemFiles.fields(directory + "/memory.stat", unit: 1)
                    let cache = stat["total_cache"] ?? stat["cache"] ?? 0
                    limits.append(
                        Limit(limit: limit, used: used - min(used, cache), name: "the cgroup limit \(directory)/memory.limit_in_bytes"))
                }
            }
        }
        return limits
    }

    /// The cgroup's directory and its ancestors' that exist (inside a container, the mount's
    /// root is the container's own cgroup, whatever the path says).
    private static func ancestors(root: String, path: String) -> [String] {
        var directories: [String] = []
        var components = path.split(separator: "/").map(String.init)
        while true {
            let directory = components.isEmpty ? root : root + "/" + components.joined(separator: "/")
            if access(directory, F_OK) == 0 { directories.append(directory) }
            if components.isEmpty { break }
            components.removeLast()
        }
        return directories
    }
}

/// Small files of /proc and /sys, read without Foundation.
enum SystemFiles {
    static func read(_ path: String) -> String? {
        let descriptor = open(path, O_RDONLY | O_CLOEXEC)
        guard descriptor >= 0 else { return nil }
        defer { close(descriptor) }
        var bytes: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            let count = buffer.withUnsafeMutableBytes { Glibc.read(descriptor, $0.baseAddress, $0.count) }
            if count < 0 && errno == EINTR { continue }
            guard count > 0 else { break }
            bytes += buffer[..<count]
            if bytes.count > 1 << 20 { break }
        }
        return String(decoding: bytes, as: UTF8.self)
    }

    /// A file holding one number ("max" and the like read as nil).
    static func number(_ path: String) -> UInt64? {
        read(path).flatMap { UInt64($0.filter { !$0.isWhitespace }) }
    }

    /// "Name: value [kB]" or "name value" lines, as numbers (times `unit`, default KiB).
    static func fields(_ path: String, unit: UInt64 = 1) -> [String: UInt64] {
        var fields: [String: UInt64] = [:]
        for line in (read(path) ?? "").split(separator: "\n") {
            let parts = line.split(whereSeparator: { $0 == " " || $0 == "\t" || $0 == ":" })
            guard parts.count >= 2, let value = UInt64(parts[1]) else { continue }
            fields[String(parts[0])] = value * unit
        }
        return fields
    }
}
