import Foundation
import Lockbox
import LockboxTestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// A careless user's and a same-user attacker's ways with the programs: standard streams left
/// closed, a backup written over the keychain, names that look alike, output that cannot be
/// written, a log left by an earlier keychain, a keychain that is not this user's to open.
extension SafeDefaultsTests {
    /// Runs `lockbox --keychain KEYCHAIN ARGUMENTS` through `sh -c` with `redirections` (closed
    /// standard streams, a full device) applied to it.
    func lockboxRedirected(_ arguments: String, _ redirections: String, input: String = "") throws -> ProcessResult {
        try run("/bin/sh", ["-c", "\"$0\" --keychain \"$1\" \(arguments) \(redirections)", binary, keychain], input: Array(input.utf8))
    }

    @Test("standard streams closed: a printed secret lands in no file the program opens (it fails instead), and a closed standard input is no secret")
    func closedStandardStreams_leakNothing() throws {
        try initialize()
        defer { lockAll() }
        let canary = "canary-closed-stdout-" + UUID().uuidString
        #expect(try lockbox(["add-generic-password", "-s", "s", "-a", "a"], text: canary + "\n").status == 0)
        let printed = try run(
            "/bin/sh", ["-c", "\"$0\" --keychain \"$1\" find-generic-password -s s -a a -w >&-; echo \"status=$?\" >&2", binary, keychain])
        #expect(printed.standardError.contains("status=1"), "\(printed.standardError)")
        #expect(printed.standardError.contains("Standard output could not be written"), "\(printed.standardError)")
        // No file beside the keychain took the closed descriptor and the secret with it.
        for name in try FileManager.default.contentsOfDirectory(atPath: directory.file("keychains")) {
            let bytes = try Data(contentsOf: URL(fileURLWithPath: directory.file("keychains/" + name)))
            #expect(bytes.range(of: Data(canary.utf8)) == nil, "the secret is in \(name) in clear")
        }
        // Standard input closed: refused as no secret, nothing stored.
        let added = try lockboxRedirected("add-generic-password -s c -a a", "<&-")
        #expect(added.status != 0, "an add with standard input closed stored something: \(added.standardError)")
        #expect(try secret("c", "a").status == 44)
    }

    @Test("backup never writes over an existing file: the keychain itself is refused even with --replace, an earlier backup is replaced only with it")
    func backup_neverReplacesAnotherFile() throws {
        try initialize()
        defer { lockAll() }
        #expect(try lockbox(["add-generic-password", "-s", "portable", "-a", "a"], text: "canary-portable\n").status == 0)
        #expect(
            try lockbox(["add-generic-password", "-s", "here", "-a", "a", "--accessibility", "whenUnlockedThisDeviceOnly"], text: "canary-here\n")
                .status == 0)
        let before = try Data(contentsOf: URL(fileURLWithPath: keychain))
        for arguments in [["backup", keychain, "--passphrase-stdin"], ["backup", keychain, "--passphrase-stdin", "--replace"]] {
            let refused = try lockbox(arguments, text: "backup passphrase\n")
            #expect(refused.status == 1, "\(arguments): \(refused.standardError)")
            #expect(refused.standardError.contains("nothing was written"), "\(refused.standardError)")
        }
        #expect(try Data(contentsOf: URL(fileURLWithPath: keychain)) == before)
        #expect(try secret("here", "a").standardOutput == "canary-here")
        // Any other file is refused the same way, named in the error.
        let other = directory.file("notes.txt")
        try Data("my notes".utf8).write(to: URL(fileURLWithPath: other))
        let notes = try lockbox(["backup", other, "--passphrase-stdin", "--replace"], text: "backup passphrase\n")
        #expect(notes.status == 1 && notes.standardError.contains("is not a Lockbox backup"), "\(notes.standardError)")
        #expect(try String(contentsOfFile: other, encoding: .utf8) == "my notes")
        // A new file, then that backup replaced only with --replace.
        let file = directory.file("items.backup")
        #expect(try lockbox(["backup", file, "--passphrase-stdin"], text: "backup passphrase\n").status == 0)
        let again = try lockbox(["backup", file, "--passphrase-stdin"], text: "backup passphrase\n")
        #expect(again.status == 1 && again.standardError.contains("--replace"), "\(again.standardError)")
        #expect(try lockbox(["backup", file, "--passphrase-stdin", "--replace"], text: "backup passphrase\n").status == 0)
        let restored = try lockbox(["restore", file, "--passphrase-stdin"], text: "backup passphrase\n")
        #expect(restored.status == 0, "\(restored.standardError)")
    }

    @Test("names compared as bytes: an account written with a combining accent is not the precomposed one, for find and for delete")
    func lookalikeNames_areDifferentItems() throws {
        try initialize()
        defer { lockAll() }
        let composed = "caf\u{E9}"
        let decomposed = "cafe\u{301}"
        #expect(composed == decomposed, "Swift takes them for equal: the test would prove nothing")
        #expect(try lockbox(["add-generic-password", "-s", "svcA", "-a", composed], text: "canary-composed\n").status == 0)
        #expect(try lockbox(["add-generic-password", "-s", "svcB", "-a", decomposed], text: "canary-decomposed\n").status == 0)
        // By account alone (no service: a scan that compares the opened attributes).
        let found = try lockbox(["find-generic-password", "-a", decomposed, "-w"])
        #expect(found.status == 0 && found.standardOutput == "canary-decomposed\n", "\(found.standardOutput)")
        let deleted = try lockbox(["delete-generic-password", "-a", composed])
        #expect(deleted.status == 0 && deleted.standardError.contains("Deleted 1 item."), "\(deleted.standardError)")
        #expect(try secret("svcB", decomposed).standardOutput == "canary-decomposed")
        #expect(try secret("svcA", composed).status == 44)
    }

    @Test("a secret that cannot be written (a full device) ends in failure, never in success")
    func unwrittenOutput_isAFailure() throws {
        try initialize()
        defer { lockAll() }
        #expect(try lockbox(["add-generic-password", "-s", "k", "-a", "a", "--raw"], input: [UInt8](repeating: 0x41, count: 5000)).status == 0)
        let full = try lockboxRedirected("find-generic-password -s k -a a -w --raw", "> /dev/full")
        #expect(full.status == 1, "\(full.status): \(full.standardError)")
        #expect(full.standardError.contains("Standard output could not be written (No space left on device)"), "\(full.standardError)")
        let dump = try lockboxRedirected("dump", "> /dev/full")
        #expect(dump.status == 1, "dump: \(dump.status)")
        let written = try lockboxRedirected("find-generic-password -s k -a a -w --raw", "> /dev/null")
        #expect(written.status == 0)
    }

    @Test("docker-credential-lockbox store that fails (a secret over the keychain's limit) keeps the server's credential; a new user name replaces it only once stored")
    func dockerStoreThatFails_keepsTheCredential() throws {
        try initialize()
        defer { lockAll() }
        var environment = ProcessInfo.processInfo.environment
        environment["LOCKBOX_KEYCHAIN"] = keychain
        let helper = builtProduct("docker-credential-lockbox")
        func docker(_ operation: String, _ input: String) throws -> ProcessResult {
            try run(helper, [operation], input: Array(input.utf8), environment: environment)
        }
        let server = "https://big.example"
        #expect(try docker("store", #"{"ServerURL":"\#(server)","Username":"u","Secret":"good-secret"}"#).status == 0)
        let big = try docker("store", #"{"ServerURL":"\#(server)","Username":"u","Secret":"\#(String(repeating: "x", count: 70_000))"}"#)
        #expect(big.status != 0, "a 70,000-byte secret was stored")
        let kept = try docker("get", server + "\n")
        #expect(kept.status == 0 && kept.standardOutput.contains(#""Secret":"good-secret""#), "\(kept.standardOutput) \(kept.standardError)")
        // Another user name: stored, and then the earlier one removed (one credential per server).
        #expect(try docker("store", #"{"ServerURL":"\#(server)","Username":"v","Secret":"second-secret"}"#).status == 0)
        let replaced = try docker("get", server + "\n")
        #expect(replaced.standardOutput.contains(#""Username":"v""#) && replaced.standardOutput.contains("second-secret"), "\(replaced.standardOutput)")
        let listed = try docker("list", "")
        #expect(listed.standardOutput == #"{"\#(server)":"v"}"# + "\n" || listed.standardOutput == #"{"\#(server)":"v"}"#, "\(listed.standardOutput)")
        // The same user name again: updated in place.
        #expect(try docker("store", #"{"ServerURL":"\#(server)","Username":"v","Secret":"third-secret"}"#).status == 0)
        #expect(try docker("get", server + "\n").standardOutput.contains("third-secret"))
    }

    @Test("init next to the log of an earlier keychain (its file removed): refused, the log kept, and no half-made keychain")
    func initBesideAnEarlierLog_isRefused() throws {
        try FileManager.default.createDirectory(atPath: directory.file("keychains"), withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        try Data("an earlier keychain's last changes".utf8).write(to: URL(fileURLWithPath: keychain + "-wal"))
        chmod(keychain + "-wal", 0o600)
        let refused = try lockbox(["init", "--passphrase-stdin", "--kdf", "interactive"], text: Self.passphrase + "\n")
        #expect(refused.status == 1, "\(refused.standardError)")
        #expect(refused.standardError.contains("\(keychain)-wal, the log of an earlier keychain"), "\(refused.standardError)")
        #expect(!FileManager.default.fileExists(atPath: keychain))
        #expect(try String(contentsOfFile: keychain + "-wal", encoding: .utf8) == "an earlier keychain's last changes")
        try FileManager.default.removeItem(atPath: keychain + "-wal")
        try initialize()
        lockAll()
    }

    @Test("a keychain file this user may not open is said to be out of reach, never missing; a directory named as the keychain is said to be one")
    func unreadableKeychain_isNotMissing() throws {
        try initialize()
        defer {
            chmod(keychain, 0o600)
            lockAll()
        }
        chmod(keychain, 0)
        let status = try lockbox(["find-generic-password", "-s", "s", "-a", "a"])
        if geteuid() == 0 {
            // Root opens any file: the mode does not keep it out.
            #expect(status.status == 44, "\(status.standardError)")
        } else {
            #expect(status.status == 1, "\(status.standardError)")
            #expect(status.standardError.contains("It is there, but this user may not read and write it"), "\(status.standardError)")
            #expect(!status.standardError.contains("No keychain at"), "\(status.standardError)")
        }
        let folder = try run(binary, ["--keychain", directory.file("keychains"), "status"])
        #expect(folder.status != 0 && folder.standardError.contains("is a directory, not a keychain"), "\(folder.standardError)")
    }
}
