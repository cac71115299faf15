import Glibc
import LockboxCore
import LockboxTestSupport
import Testing
import VaultCrypto

/// Argon2id's memory fits the limits the process runs under: chosen at `init`, checked before
/// every derivation, with a clear error instead of a crash or the kernel's OOM killer.
@Suite("Key derivation memory under small limits", .serialized)
struct KeyDerivationMemoryTests {
    static let mebibyte: UInt64 = 1 << 20

    // MARK: Choosing parameters

    @Test("with no limit, or a large one, new parameters are libsodium's MODERATE")
    func noOrLargeLimit_choosesModerate() {
        for budget in [nil, MemoryBudget(bytes: 8 << 30, limitedBy: "test")] {
            let parameters = PassphraseKeyDerivation(strength: .moderate, budget: budget)
            #expect(parameters.memoryLimit == 256 * Self.mebibyte)
            #expect(parameters.operationsLimit == 3)
        }
    }

    @Test("under a 215 MiB budget the memory shrinks with a margin and the passes grow")
    func smallBudget_choosesLessMemoryWithMargin_andMorePasses() throws {
        let budget = MemoryBudget(bytes: 215 * Self.mebibyte, limitedBy: "test")
        let parameters = PassphraseKeyDerivation(strength: .moderate, budget: budget)
        #expect(parameters.memoryLimit < 256 * Self.mebibyte)
        #expect(parameters.memoryLimit <= budget.bytes * 3 / 4)
        #expect(parameters.memoryLimit >= PassphraseKeyDerivation.minimumMemory)
        // About the same work as MODERATE: passes x memory >= 3 x 256 MiB.
        #expect(parameters.operationsLimit * parameters.memoryLimit >= 3 * 256 * Self.mebibyte)
        #expect(parameters.meetsMinimum)
        try parameters.checkMemory(budget: budget)
    }

    @Test("under a budget below the margin the floor (64 MiB) is used, never less")
    func tinyBudget_usesTheFloor() {
        let parameters = PassphraseKeyDerivation(strength: .moderate, budget: MemoryBudget(bytes: 90 * Self.mebibyte, limitedBy: "test"))
        #expect(parameters.memoryLimit == PassphraseKeyDerivation.minimumMemory)
        #expect(parameters.operationsLimit == 12)
        #expect(parameters.meetsMinimum)
    }

    @Test("parameters that cannot fit throw errSecAllocate naming the memory needed, the limit and what to do")
    func parametersThatDoNotFit_throwAllocate_withNeedAndRemedy() {
        let parameters = PassphraseKeyDerivation(strength: .sensitive, budget: nil)
        let error = #expect(throws: LockboxError.self) {
            try parameters.checkMemory(budget: MemoryBudget(bytes: 500 * Self.mebibyte, limitedBy: "the cgroup limit X/memory.max"))
        }
        #expect(error?.code == .allocate)
        #expect(error?.message.contains("needs 1032 MiB") == true, "\(error?.message ?? "")")
        #expect(error?.message.contains("only 500 MiB") == true)
        #expect(error?.message.contains("X/memory.max") == true)
        #expect(error?.message.contains("Raise that limit by at least 532 MiB") == true)
    }

    // MARK: The built CLI under real limits

    /// A temporary HOME and the built `lockbox`.
    final class Sandbox {
        let directory = TemporaryDirectory("lockbox-kdf")
        let binary = builtProduct("lockbox")
        var vault: String { directory.file("vault.lockbox") }

        func lockbox(_ arguments: [String], passphrase: String? = nil, limit: [String] = []) throws -> ProcessResult {
            let command = limit.isEmpty ? binary : "/usr/bin/prlimit"
            let prefix = limit.isEmpty ? [] : limit + ["--", binary]
            return try run(
                command, prefix + ["--keychain", vault] + arguments, input: Array((passphrase ?? "").utf8),
                environment: ["HOME": directory.path, "PATH": "/usr/bin:/bin"], timeout: 120)
        }
    }

    @Test("under a 250 MB address-space limit, init chooses parameters that fit, and unlock works")
    func addressSpaceLimit_initFits_andUnlockWorks() throws {
        let sandbox = Sandbox()
        let limit = ["--as=250000000"]
        let created = try sandbox.lockbox(["init", "--passphrase-stdin"], passphrase: "pw", limit: limit)
        #expect(created.status == 0, "init under 250 MB: status \(created.status): \(created.standardError)")
        #expect(try sandbox.lockbox(["lock", "--all"]).status == 0)
        let unlocked = try sandbox.lockbox(["unlock", "--passphrase-stdin"], passphrase: "pw", limit: limit)
        #expect(unlocked.status == 0, "unlock under 250 MB: status \(unlocked.status): \(unlocked.standardError)")
        #expect(try sandbox.lockbox(["status"]).standardOutput.contains("state: unlocked"))
    }

    @Test("a MODERATE vault unlocked under a 200 MB address-space limit fails with what to do, not a crash")
    func moderateVault_underSmallAddressSpace_failsWithClearError() throws {
        let sandbox = Sandbox()
        #expect(try sandbox.lockbox(["init", "--passphrase-stdin"], passphrase: "pw").status == 0)
        #expect(try sandbox.lockbox(["lock", "--all"]).status == 0)
        let unlocked = try sandbox.lockbox(["unlock", "--passphrase-stdin"], passphrase: "pw", limit: ["--as=200000000"])
        #expect(unlocked.status == 1, "status \(unlocked.status): \(unlocked.standardError)")
        #expect(unlocked.standardError.contains("needs 264 MiB"), "\(unlocked.standardError)")
        #expect(unlocked.standardError.contains("RLIMIT_AS"), "\(unlocked.standardError)")
        #expect(unlocked.standardError.contains("OSStatus -108"), "\(unlocked.standardError)")
        // The failure is not counted as a wrong passphrase: unlocking without the limit works at once.
        let retried = try sandbox.lockbox(["unlock", "--passphrase-stdin"], passphrase: "pw")
        #expect(retried.status == 0, "\(retried.standardError)")
    }

    /// A fresh memory cgroup (v2 or v1) limited to `bytes`, removed when the value goes away.
    final class MemoryCgroup {
        let directory: String
        let procs: String

        init(limit bytes: UInt64) throws {
            let name = "lockbox-test-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
            let v2 = "/sys/fs/cgroup"
            let v1 = "/sys/fs/cgroup/memory"
            if let controllers = try? run("/bin/cat", [v2 + "/cgroup.controllers"]), controllers.status == 0,
                controllers.standardOutput.contains("memory"), mkdir(v2 + "/" + name, 0o755) == 0
            {
                directory = v2 + "/" + name
                try Self.write("\(bytes)", to: directory + "/memory.max")
                try Self.write("0", to: directory + "/memory.swap.max")
            } else if mkdir(v1 + "/" + name, 0o755) == 0 {
                directory = v1 + "/" + name
                try Self.write("\(bytes)", to: directory + "/memory.limit_in_bytes")
            } else {
                Issue.record("no memory cgroup can be created here (tried \(v2) and \(v1)): this test needs one")
                throw CgroupError.unavailable
            }
            procs = directory + "/cgroup.procs"
        }

        deinit { rmdir(directory) }

        enum CgroupError: Error { case unavailable, write(String) }

        static func write(_ text: String, to path: String) throws {
            let written = try run("/bin/sh", ["-c", "printf '%s' \"$1\" > \"$2\"", "sh", text, path])
            // memory.swap.max is missing without swap accounting: that is fine.
            if written.status != 0 && !path.hasSuffix("swap.max") { throw CgroupError.write("\(path): \(written.standardError)") }
        }
    }

    @Test("inside a 200 MB memory cgroup, unlock of a MODERATE vault says what to do instead of being killed, and init fits")
    func memoryCgroup_unlockFailsClearly_andInitFits() throws {
        let sandbox = Sandbox()
        #expect(try sandbox.lockbox(["init", "--passphrase-stdin"], passphrase: "pw").status == 0)
        #expect(try sandbox.lockbox(["lock", "--all"]).status == 0)
        let cgroup = try MemoryCgroup(limit: 200_000_000)
        func inCgroup(_ arguments: [String], vault: String) throws -> ProcessResult {
            try run(
                "/bin/sh", ["-c", "echo $$ > \"$0\" && exec \"$@\"", cgroup.procs, sandbox.binary, "--keychain", vault] + arguments,
                input: Array("pw".utf8), environment: ["HOME": sandbox.directory.path, "PATH": "/usr/bin:/bin"], timeout: 120)
        }
        let unlocked = try inCgroup(["unlock", "--passphrase-stdin"], vault: sandbox.vault)
        #expect(unlocked.status == 1, "status \(unlocked.status) (137 is the OOM killer): \(unlocked.standardError)")
        #expect(unlocked.standardError.contains("the cgroup limit \(cgroup.directory)"), "\(unlocked.standardError)")
        #expect(unlocked.standardError.contains("needs 264 MiB"), "\(unlocked.standardError)")

        let small = sandbox.directory.file("small.lockbox")
        let created = try inCgroup(["init", "--passphrase-stdin"], vault: small)
        #expect(created.status == 0, "init in the cgroup: status \(created.status): \(created.standardError)")
        #expect(try run(sandbox.binary, ["--keychain", small, "lock", "--all"], environment: ["HOME": sandbox.directory.path]).status == 0)
        let reopened = try inCgroup(["unlock", "--passphrase-stdin"], vault: small)
        #expect(reopened.status == 0, "unlock in the cgroup: status \(reopened.status): \(reopened.standardError)")
    }
}
