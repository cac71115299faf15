import Foundation
import Lockbox
import LockboxTestSupport
import Testing

/// Programs started with a standard stream closed, through `lockboxd`: the connection to the
/// broker, opened before anything else, must not take the closed descriptor's number.
@Suite("Through the broker: standard streams left closed", .serialized)
struct BrokerClosedStreamsTests {
    @Test("lockbox find -w with standard output closed, through lockboxd: the secret goes nowhere, the command fails, and the broker keeps serving; an add with standard input closed stores nothing")
    func closedStreams_throughTheBroker() throws {
        let fixture = try BrokerFixture()
        defer { fixture.stop() }
        try fixture.store().unlock(passphrase: SecretBytes(utf8: BrokerFixture.passphraseText))
        let lockbox = builtProduct("lockbox")
        let canary = makeCanary("broker-closed-output")
        let added = try run(lockbox, ["add-generic-password", "-s", "s", "-a", "a"], input: Array((canary + "\n").utf8), environment: fixture.clientEnvironment)
        #expect(added.status == 0, "\(added.standardError)")
        let printed = try run(
            "/bin/sh", ["-c", "\"$0\" find-generic-password -s s -a a -w >&-; echo \"status=$?\" >&2", lockbox],
            environment: fixture.clientEnvironment)
        #expect(printed.standardError.contains("status=1"), "\(printed.standardError)")
        #expect(printed.standardError.contains("Standard output could not be written"), "\(printed.standardError)")
        #expect(!printed.standardError.contains(canary))
        let empty = try run("/bin/sh", ["-c", "\"$0\" add-generic-password -s c -a a <&-", lockbox], environment: fixture.clientEnvironment)
        #expect(empty.status != 0, "an add with standard input closed stored something: \(empty.standardError)")
        // The broker serves on, and holds the item as it was, and no other.
        let found = try run(lockbox, ["find-generic-password", "-s", "s", "-a", "a", "-w"], environment: fixture.clientEnvironment)
        #expect(found.status == 0 && found.standardOutput == canary + "\n", "\(found.standardError)")
        #expect(try run(lockbox, ["find-generic-password", "-s", "c", "-a", "a"], environment: fixture.clientEnvironment).status == 44)
        #expect(filesContaining(canary, in: fixture.directory.path).isEmpty)
    }
}
