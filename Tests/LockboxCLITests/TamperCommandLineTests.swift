import Foundation
import Lockbox
import LockboxTestSupport
import Testing

/// The attacks of the vault's integrity tests, through the programs users run: the file is
/// edited with the sqlite3 command-line tool between two `lockbox` calls.
@Suite("lockbox against an edited keychain file", .serialized)
struct TamperCommandLineTests: EditedKeychainSuite {
    let binary = builtProduct("lockbox")
    let directory = TemporaryDirectory("lockbox-cli-tamper")
    var keychain: String { directory.file("keychains/t.lockbox") }
    let passphrase = "tamper passphrase"

    @Test("digests swapped with sqlite3: find -w exits 1 with -26275 and prints no one's secret; verify reports it")
    func swappedDigests_findFailsClosed() throws {
        try prepared()
        defer { _ = try? lockbox(["lock", "--all"]) }
        try sqlite(
            """
            CREATE TEMP TABLE s AS SELECT rowid r, lookup_digest l, primary_digest p FROM items;
            UPDATE items SET lookup_digest = randomblob(32), primary_digest = randomblob(32) WHERE rowid = 1;
            UPDATE items SET lookup_digest = (SELECT l FROM s WHERE r = 1), primary_digest = (SELECT p FROM s WHERE r = 1) WHERE rowid = 2;
            UPDATE items SET lookup_digest = (SELECT l FROM s WHERE r = 2), primary_digest = (SELECT p FROM s WHERE r = 2) WHERE rowid = 1;
            """)
        let find = try lockbox(["find-generic-password", "-s", "svcA", "-a", "alice", "-w"])
        #expect(find.status == 1)
        #expect(find.standardError.contains("(OSStatus -26275)"))
        #expect(!find.standardOutput.contains("canary") && !find.standardError.contains("canary"))
        let verify = try lockbox(["verify"])
        #expect(verify.status == 1)
        #expect(verify.standardOutput.contains("does NOT check out"))
    }

    @Test("an older copy of the file put back: every command refuses it until verify --accept-older")
    func olderFile_isRefusedUntilAccepted() throws {
        try prepared()
        defer { _ = try? lockbox(["lock", "--all"]) }
        try sqlite("PRAGMA wal_checkpoint(TRUNCATE)")
        let old = directory.file("old.lockbox")
        try FileManager.default.copyItem(atPath: keychain, toPath: old)
        #expect(try lockbox(["add-generic-password", "-U", "-s", "svcA", "-a", "alice"], input: "alice-rotated\n").status == 0)
        try putBack(old, at: keychain)
        let find = try lockbox(["find-generic-password", "-s", "svcA", "-a", "alice", "-w"])
        #expect(find.status == 1)
        #expect(find.standardError.contains("older") && find.standardError.contains("(OSStatus -26275)"))
        #expect(!find.standardOutput.contains("canary"))
        #expect(try lockbox(["verify"]).status == 1)
        let accepted = try lockbox(["verify", "--accept-older"])
        #expect(accepted.status == 0, "\(accepted.standardOutput)\(accepted.standardError)")
        let afterAccepting = try lockbox(["find-generic-password", "-s", "svcA", "-a", "alice", "-w"])
        #expect(afterAccepting.standardOutput == "alice-canary-1\n", "exit \(afterAccepting.status): \(afterAccepting.standardError)")
    }

    @Test("eight lockbox unlock processes at once all succeed, while another process writes")
    func concurrentUnlockProcesses_allSucceed() async throws {
        try prepared()
        defer { _ = try? lockbox(["lock", "--all"]) }
        #expect(try lockbox(["lock", "--all"]).status == 0)
        let binary = self.binary
        let keychain = self.keychain
        let statuses = await withTaskGroup(of: (Int32, String).self) { group in
            for index in 0..<9 {
                group.addTask {
                    let arguments = index == 8
                        ? ["--keychain", keychain, "add-generic-password", "-s", "svcC", "-a", "carol"]
                        : ["--keychain", keychain, "unlock", "--passphrase-stdin"]
                    let input = index == 8 ? "carol\n" : "tamper passphrase\n"
                    let result = try? run(binary, arguments, input: Array(input.utf8))
                    return (result?.status ?? -1, result?.standardError ?? "did not run")
                }
            }
            var statuses: [(Int32, String)] = []
            for await status in group { statuses.append(status) }
            return statuses
        }
        // The writer may find the vault still locked (-25308); every unlock must succeed.
        let unlocks = statuses.filter { !$0.1.contains("-25308") }
        #expect(unlocks.allSatisfy { $0.0 == 0 }, "\(unlocks.filter { $0.0 != 0 }.map(\.1))")
        #expect(try lockbox(["find-generic-password", "-s", "svcA", "-a", "alice", "-w"]).standardOutput == "alice-canary-1\n")
    }
}
