import Foundation
import LockboxTestSupport
import Testing

/// A suite that makes a keychain with the `lockbox` binary and edits its file with the sqlite3
/// command-line tool between two `lockbox` calls, as an attacker with the file would.
protocol EditedKeychainSuite {
    var binary: String { get }
    var keychain: String { get }
    /// The passphrase ``prepared()`` creates the keychain with.
    var passphrase: String { get }
}

extension EditedKeychainSuite {
    func lockbox(_ arguments: [String], input: String = "") throws -> ProcessResult {
        try run(binary, ["--keychain", keychain] + arguments, input: Array(input.utf8))
    }

    func sqlite(_ sql: String) throws {
        let result = try run("/usr/bin/sqlite3", [keychain, sql])
        #expect(result.status == 0, "sqlite3 (Debian's sqlite3 package) failed: \(result.standardError)")
    }

    /// A keychain holding alice's and bob's canaries in two services.
    func prepared() throws {
        #expect(try lockbox(["init", "--passphrase-stdin", "--kdf", "interactive"], input: passphrase + "\n").status == 0)
        #expect(try lockbox(["add-generic-password", "-s", "svcA", "-a", "alice"], input: "alice-canary-1\n").status == 0)
        #expect(try lockbox(["add-generic-password", "-s", "svcB", "-a", "bob"], input: "bob-canary-2\n").status == 0)
    }
}
