import Foundation
import Lockbox
import LockboxTestSupport
import Testing

/// Where the kernel keyring does not exist (a container whose seccomp profile forbids
/// `keyctl`): the default cache refuses with a message that names the alternative, and never
/// falls back to something else on its own; LOCKBOX_UNLOCK_CACHE=process works there.
@Suite("lockbox without a kernel keyring")
struct NoKernelKeyringTests {
    let binary = builtProduct("lockbox")
    let directory = TemporaryDirectory("lockbox-no-keyring")
    var keychain: String { directory.file("keychains/no-keyring.lockbox") }
    /// The wrapper, written into the test's directory: the checkout may not be readable by the
    /// ordinary user scripts/test-unprivileged runs these tests as.
    var wrapper: String {
        let path = directory.file("run-without-keyring.py")
        if !FileManager.default.fileExists(atPath: path) {
            #expect(FileManager.default.createFile(atPath: path, contents: Data(NoKernelKeyring.wrapperSource.utf8)))
        }
        return path
    }

    func withoutKeyring(_ arguments: [String], input: String = "", cache: String? = nil) throws -> ProcessResult {
        var environment = ProcessInfo.processInfo.environment
        environment["LOCKBOX_UNLOCK_CACHE"] = cache
        return try run("/usr/bin/python3", [wrapper, binary] + arguments, input: Array(input.utf8), environment: environment)
    }

    @Test("the wrapper really takes the kernel keyring away")
    func wrapper_removesKeyring() throws {
        let result = try run("/usr/bin/python3", [wrapper, "/usr/bin/keyctl", "show", "@u"])
        #expect(result.status != 0)
        #expect(result.standardError.contains("Function not implemented"), "\(result.standardError)")
    }

    @Test("with the default cache: errSecNotAvailable naming LOCKBOX_UNLOCK_CACHE=process, and nothing unlocked elsewhere")
    func defaultCache_refusesWithTheAlternative() throws {
        let created = try withoutKeyring(["--keychain", keychain, "init", "--passphrase-stdin", "--kdf", "interactive"], input: "pw\n")
        #expect(created.status == 1)
        #expect(created.standardError.contains("The kernel keyring is not available here"), "\(created.standardError)")
        #expect(created.standardError.contains("LOCKBOX_UNLOCK_CACHE=process"))
        #expect(created.standardError.contains("(OSStatus -25291)"))
        // Nothing was created that could not be unlocked here.
        #expect(!FileManager.default.fileExists(atPath: keychain))
        // A vault made elsewhere: reads here are refused the same way, never "not found".
        var environment = ProcessInfo.processInfo.environment
        environment["LOCKBOX_UNLOCK_CACHE"] = "process"
        let made = try run(
            binary, ["--keychain", keychain, "init", "--passphrase-stdin", "--kdf", "interactive"], input: Array("pw\n".utf8),
            environment: environment)
        #expect(made.status == 0, "\(made.standardError)")
        let read = try withoutKeyring(["--keychain", keychain, "find-generic-password", "-s", "s", "-a", "a", "-w"])
        #expect(read.status == 1)
        #expect(read.standardError.contains("(OSStatus -25291)"), "\(read.standardError)")
        let unlock = try withoutKeyring(["--keychain", keychain, "unlock", "--passphrase-stdin"], input: "pw\n")
        #expect(unlock.status == 1)
        #expect(unlock.standardError.contains("LOCKBOX_UNLOCK_CACHE=process"), "\(unlock.standardError)")
    }

    @Test("with LOCKBOX_UNLOCK_CACHE=process: the vault works in one process, and the next process finds it locked")
    func processCache_worksWithoutKeyring() throws {
        let created = try withoutKeyring(
            ["--keychain", keychain, "init", "--passphrase-stdin", "--kdf", "interactive"], input: "pw\n", cache: "process")
        #expect(created.status == 0, "\(created.standardError)")
        // The keys of `init` went with its process: locked, never not found, never a fallback.
        let add = try withoutKeyring(["--keychain", keychain, "add-generic-password", "-s", "s", "-a", "a"], input: "v\n", cache: "process")
        #expect(add.status == 1)
        #expect(add.standardError.contains("(OSStatus -25308)"), "\(add.standardError)")
        let status = try withoutKeyring(["--keychain", keychain, "status"], cache: "process")
        #expect(status.status == 0, "\(status.standardError)")
        #expect(status.standardOutput.contains("state: locked"), "\(status.standardOutput)")
    }
}
