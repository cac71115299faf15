import Foundation
import KeychainCompatibility
import Lockbox
import LockboxKeys
import LockboxTestSupport
import Synchronization
import Testing

@testable import LockboxBroker

/// A verifier that answers with a fixed passphrase and counts how often it was asked: the
/// client side of a program that asks its user.
final class CountingVerifier: PresenceVerifier {
    let answer: String
    private let asked = Mutex<[String]>([])

    init(_ answer: String) { self.answer = answer }

    var reasons: [String] { asked.withLock { $0 } }

    func passphrase(for request: AuthenticationRequest) throws(LockboxError) -> SecretBytes {
        asked.withLock { $0.append(request.reason) }
        return SecretBytes(utf8: answer)
    }
}

/// The user's passphrase through the broker, which has no terminal: the client asks, the broker
/// checks (with the failed-attempt back-off) and applies the reuse window.
@Suite("lockboxd and the user's passphrase")
struct BrokerAuthenticationTests {
    func guardedItem(_ fixture: BrokerFixture, canary: String) throws -> BrokerStore {
        let store = try fixture.store()
        try store.unlock(passphrase: SecretBytes(utf8: BrokerFixture.passphraseText))
        var item = Item.genericPassword(service: "bank", account: "alice", data: SecretBytes(utf8: canary))
        item.accessControl = .userPresence
        try store.add(item)
        return store
    }

    @Test("a .userPresence item through the broker: locked without a verifier, -25293 for a wrong passphrase, its value for the right one")
    func userPresenceItem_rightAndWrongPassphrase() throws {
        let fixture = try BrokerFixture()
        let canary = makeCanary("presence")
        let store = try guardedItem(fixture, canary: canary)
        let query = Query.genericPassword(service: "bank", account: "alice")

        // No one to ask: locked, never "not found", and the value does not cross.
        do {
            _ = try store.data(matching: query)
            Issue.record("an access-controlled item was read without the user")
        } catch {
            #expect(error.code == .interactionNotAllowed, "\(error)")
            #expect(error.message.contains("needs the user's passphrase"), "\(error.message)")
        }
        // Its attributes, which need no key, are still listed.
        var attributesOnly = query
        attributesOnly.returning = [.attributes]
        #expect(try store.items(matching: attributesOnly).first?.data == nil)

        // A wrong passphrase: errSecAuthFailed, counted by the back-off, never not found.
        let wrongPassphrase = makeCanary("wrong-passphrase")
        let wrong = CountingVerifier(wrongPassphrase)
        var asking = query
        asking.authenticationContext = AuthenticationContext(verifier: wrong)
        do {
            _ = try store.data(matching: asking)
            Issue.record("a wrong passphrase opened the item")
        } catch {
            #expect(error.code == .authFailed, "\(error)")
            #expect(!error.description.contains(wrongPassphrase))
            #expect(!error.description.contains(canary))
        }
        #expect(wrong.reasons.count == 1)
        #expect(wrong.reasons.first?.contains("bank") == true, "\(wrong.reasons)")
        #expect(try store.status().failedUnlockAttempts == 1)

        // The right one: the value, and the failed-attempt count cleared. Without a reuse
        // window each read asks again.
        let right = CountingVerifier(BrokerFixture.passphraseText)
        asking.authenticationContext = AuthenticationContext(verifier: right)
        #expect(try store.data(matching: asking) == SecretBytes(utf8: canary))
        #expect(try store.data(matching: asking) == SecretBytes(utf8: canary))
        #expect(right.reasons.count == 2)
        #expect(try store.status().failedUnlockAttempts == 0)
        // The verification was for those requests only: a read without a context is refused again.
        #expect(status { _ = try store.data(matching: query) } == -25308)

        // With a reuse window, the broker keeps the verification for this connection.
        let reused = CountingVerifier(BrokerFixture.passphraseText)
        store.authenticationContext = AuthenticationContext(verifier: reused, reuseDuration: .seconds(60))
        #expect(try store.data(matching: query) == SecretBytes(utf8: canary))
        #expect(try store.data(matching: query) == SecretBytes(utf8: canary))
        #expect(reused.reasons.count == 1)
        // Another connection (another process) does not inherit it.
        #expect(status { _ = try fixture.store().data(matching: query) } == -25308)
        // The passphrase is never in the vault's directory.
        #expect(filesContaining(BrokerFixture.passphraseText, in: fixture.directory.path).isEmpty)
    }

    @Test("lockbox reaches another application's group after the passphrase at its terminal; a wrong one is -25293, never not found")
    func lockboxCommand_otherGroup_afterPassphrase() throws {
        let fixture = try BrokerFixture()
        try fixture.store().unlock(passphrase: SecretBytes(utf8: BrokerFixture.passphraseText))
        let app = try fixture.application("mail-app")
        let canary = makeCanary("other-group")
        let added = try run(
            app, ["add-generic-password", "-s", "mail", "-a", "alice"], input: Array((canary + "\n").utf8),
            environment: fixture.clientEnvironment)
        #expect(added.status == 0, "\(added.standardError)")
        // An access-controlled item in the same group: one passphrase opens the group and it.
        let guardedCanary = makeCanary("other-group-guarded")
        let guarded = try run(
            app, ["add-generic-password", "-s", "mail-guarded", "-a", "alice", "--access-control", "userPresence"],
            input: Array((guardedCanary + "\n").utf8), environment: fixture.clientEnvironment)
        #expect(guarded.status == 0, "\(guarded.standardError)")
        let lockbox = builtProduct("lockbox")
        // The group the broker gave the application: named after its identity.
        let group = "exe:" + app
        let find = ["find-generic-password", "-s", "mail", "-a", "alice", "--access-group", group, "-w"]

        // The right passphrase: the group opens for this command.
        let opened = try TerminalSession.run(
            lockbox, find, steps: [.expect("use every access group (empty to cancel): "), .type(BrokerFixture.passphraseText + "\n")],
            environment: fixture.clientEnvironment)
        #expect(opened.failure.isEmpty, "\(opened.failure): \(opened.transcript)")
        #expect(opened.status == 0, "\(opened.transcript)")
        #expect(opened.transcript.contains(canary), "\(opened.transcript)")

        // A wrong one: errSecAuthFailed, not the item, not "not found".
        let wrongPassphrase = makeCanary("wrong")
        let refused = try TerminalSession.run(
            lockbox, find, steps: [.expect("use every access group (empty to cancel): "), .type(wrongPassphrase + "\n")],
            environment: fixture.clientEnvironment)
        #expect(refused.failure.isEmpty, "\(refused.failure): \(refused.transcript)")
        #expect(refused.status == 1, "\(refused.transcript)")
        #expect(refused.transcript.contains("(OSStatus -25293)"), "\(refused.transcript)")
        #expect(!refused.transcript.contains(canary))
        #expect(!refused.transcript.contains("-25300"))
        #expect(try fixture.store().status().failedUnlockAttempts == 1)

        // The access-controlled item of that group: asked once, opened with that one answer.
        let both = try TerminalSession.run(
            lockbox, ["find-generic-password", "-s", "mail-guarded", "-a", "alice", "--access-group", group, "-w"],
            steps: [.expect("(empty to cancel): "), .type(BrokerFixture.passphraseText + "\n")], environment: fixture.clientEnvironment)
        #expect(both.status == 0, "\(both.transcript)")
        #expect(both.transcript.contains(guardedCanary), "\(both.transcript)")
        #expect(both.transcript.components(separatedBy: "(empty to cancel)").count == 2, "asked more than once: \(both.transcript)")

        // Without a terminal there is no one to ask: the refusal stands, saying how to pass it.
        let noTerminal = try run(lockbox, find, environment: fixture.clientEnvironment)
        #expect(noTerminal.status == 1)
        #expect(noTerminal.standardError.contains("(OSStatus -34018)"), "\(noTerminal.standardError)")
        #expect(noTerminal.standardError.contains("entered at a terminal"), "\(noTerminal.standardError)")
        #expect(!noTerminal.standardOutput.contains(canary))

        // Another application is not the lockbox command: no passphrase opens the group to it.
        let other = try fixture.application("other-app")
        let otherRun = try TerminalSession.run(other, find, steps: [], environment: fixture.clientEnvironment)
        #expect(otherRun.status == 1, "\(otherRun.transcript)")
        #expect(otherRun.transcript.contains("(OSStatus -34018)"), "\(otherRun.transcript)")
        #expect(!otherRun.transcript.contains("empty to cancel"), "\(otherRun.transcript)")
    }

    @Test("a key made inside the broker decrypts there (SecKey's ECIES, LockboxKeys' AES-GCM); the private key never crosses")
    func brokerKey_decryptsInside() throws {
        let fixture = try BrokerFixture()
        let store = try fixture.store()
        try store.unlock(passphrase: SecretBytes(utf8: BrokerFixture.passphraseText))

        // ECIES, as SecKeyCreateEncryptedData makes it for the key's public half.
        let tag = Data("ecies-key".utf8)
        let der = try store.generateKey(
            algorithm: KeyAlgorithm.p256.rawValue, purposes: KeyPurposes([.keyAgreement]).rawValue, applicationTag: tag)
        let point = try PublicKey(derRepresentation: der).rawRepresentation
        var error: Unmanaged<CFError>?
        let attributes: [String: Any] = [
            kSecAttrKeyType as String: kSecAttrKeyTypeECSECPrimeRandom, kSecAttrKeyClass as String: kSecAttrKeyClassPublic,
        ]
        let publicKey = try #require(SecKeyCreateWithData(point as CFData, attributes as CFDictionary, &error))
        let canary = makeCanary("ecies")
        for algorithm in [SecKeyAlgorithm.eciesEncryptionCofactorVariableIVX963SHA256AESGCM, .eciesEncryptionStandardX963SHA256AESGCM] {
            let message = try #require(SecKeyCreateEncryptedData(publicKey, algorithm, Data(canary.utf8) as CFData, &error)) as Data
            let plaintext = try store.decrypt(message, scheme: algorithm.rawValue, applicationTag: tag)
            #expect(plaintext == SecretBytes(utf8: canary))
            // One changed byte: errSecDecode, nothing else said.
            var tampered = message
            tampered[tampered.count - 1] ^= 1
            #expect(status { _ = try store.decrypt(tampered, scheme: algorithm.rawValue, applicationTag: tag) } == -26275)
        }
        // A scheme it does not know, and a key of another group (or none): refused.
        #expect(status { _ = try store.decrypt(Data(count: 90), scheme: "rot13", applicationTag: tag) } == -50)
        #expect(status { _ = try store.decrypt(Data(count: 90), applicationTag: Data("absent".utf8)) } == -25300)

        // AES-256-GCM: a box made inside the broker opens inside it, with its associated data only.
        let symmetric = Data("aes-key".utf8)
        _ = try store.generateKey(
            algorithm: KeyAlgorithm.aes256GCM.rawValue, purposes: KeyPurposes([.encrypt, .decrypt]).rawValue, applicationTag: symmetric)
        let box = try store.encrypt(SecretBytes(utf8: canary), authenticating: Data("header".utf8), applicationTag: symmetric)
        #expect(!contains(Array(box), Array(canary.utf8)))
        #expect(try store.decrypt(box, authenticating: Data("header".utf8), applicationTag: symmetric) == SecretBytes(utf8: canary))
        #expect(status { _ = try store.decrypt(box, authenticating: Data("other".utf8), applicationTag: symmetric) } == -26275)

        // Neither private key is readable through the broker.
        for key in [tag, symmetric] {
            var query = Query(.key, limit: .all, returning: [.data])
            query.attributes.applicationTag = key
            #expect(status { _ = try store.items(matching: query) } == -25316)
        }
    }
}

/// The `lockbox` command's wider reach comes from a passphrase, never from an unlock without one.
@Suite("lockboxd: what widens the lockbox command's groups")
struct BrokerWideningTests {
    @Test("an unlock without a passphrase does not open other groups to the lockbox command; one with the passphrase does")
    func unlockWithoutPassphrase_widensNothing() throws {
        let directory = TemporaryDirectory("lbx-widen")
        var configuration = Vault.Configuration()
        configuration.keyDerivation = .interactive
        configuration.unlockCache = .processMemory
        let vault = try Vault.create(
            at: directory.file("keychains/w.lockbox"), passphrase: SecretBytes(utf8: BrokerFixture.passphraseText),
            configuration: configuration)
        try vault.unlock(passphrase: SecretBytes(utf8: BrokerFixture.passphraseText))
        let service = BrokerService(vault: vault)
        var session = BrokerSession(
            grant: BrokerGrant(peerName: "lockbox", accessGroups: ["own"], defaultAccessGroup: "own", reachesEveryGroupWithPassphrase: true))
        func unlock(_ passphrase: String) -> [UInt8] {
            var request = FieldEncoder()
            request.integer(BrokerProtocol.Operation.unlock.rawValue)
            request.bytes(Array(passphrase.utf8))
            return service.reply(to: request.bytes, session: &session)
        }
        // An unlock without a passphrase (whatever its outcome) is not the passphrase entered.
        _ = unlock("")
        #expect(!session.currentGrant.allows("another-app"))
        for (passphrase, carries) in [("", false), ("x", true)] {
            var request = FieldEncoder()
            request.integer(BrokerProtocol.Operation.unlock.rawValue)
            request.bytes(Array(passphrase.utf8))
            // A request of 18 bytes or more with an empty passphrase once counted as one.
            #expect(request.bytes.count > 16)
            #expect(BrokerService.carriesPassphrase(try BrokerRequest(decoding: request.bytes).arguments) == carries)
        }
        #expect((try? BrokerCoding.decodeReply(unlock(BrokerFixture.passphraseText))) != nil)
        #expect(session.currentGrant.allows("another-app"))
    }
}
