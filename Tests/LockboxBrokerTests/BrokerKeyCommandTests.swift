import Foundation
import Lockbox
import LockboxKeys
import LockboxTestSupport
import Testing

@testable import LockboxBroker

/// The `lockbox` key verbs with the broker backend: the key is made and used inside `lockboxd`,
/// and the command prints only public halves and signatures.
@Suite("lockbox key commands through lockboxd")
struct BrokerKeyCommandTests {
    @Test("generate-key, public-key, sign and delete-key run inside the broker; a duplicate tag and a TPM key are refused")
    func keyCommands_runInsideTheBroker() throws {
        let fixture = try BrokerFixture()
        try fixture.store().unlock(passphrase: SecretBytes(utf8: BrokerFixture.passphraseText))
        let lockbox = builtProduct("lockbox")
        func run(_ arguments: [String], input: [UInt8] = []) throws -> ProcessResult {
            try LockboxTestSupport.run(lockbox, arguments, input: input, environment: fixture.clientEnvironment)
        }

        let made = try run(["generate-key", "--tag", "deploy", "--algorithm", "p256"])
        #expect(made.status == 0, "\(made.standardError)")
        #expect(made.standardOutput.contains("BEGIN PUBLIC KEY"))
        #expect(made.standardError.contains("inside the broker"))
        #expect(try run(["generate-key", "--tag", "deploy", "--algorithm", "p256"]).status != 0)
        #expect(try run(["generate-key", "--tag", "tpm", "--hardware"]).status != 0)

        let raw = try run(["public-key", "--tag", "deploy", "--format", "x963"])
        #expect(raw.status == 0, "\(raw.standardError)")
        let publicKey = try PublicKey(x963Representation: Data(raw.standardOutputBytes))

        let message = Array("release 1.2.3".utf8)
        let signed = try run(["sign", "--tag", "deploy"], input: message)
        #expect(signed.status == 0, "\(signed.standardError)")
        let signature = try #require(Data(base64Encoded: signed.standardOutput.trimmingCharacters(in: .whitespacesAndNewlines)))
        #expect(try publicKey.isValidSignature(signature, for: Data(message)))

        // The key's value never reaches a client, whatever it asks.
        var query = Query(.key, limit: .all, returning: [.data])
        query.attributes.applicationTag = Data("deploy".utf8)
        #expect(status { _ = try fixture.store().items(matching: query) } != nil)

        let deleted = try run(["delete-key", "--tag", "deploy"])
        #expect(deleted.status == 0, "\(deleted.standardError)")
        #expect(try run(["sign", "--tag", "deploy"], input: message).status != 0)
        #expect(try run(["delete-key", "--tag", "deploy"]).status != 0)
    }
}
