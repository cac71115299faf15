import Foundation
import KeychainCompatibility
import Lockbox
import LockboxCore
import LockboxKeys
import LockboxTestSupport
import LockboxVault
import Testing

/// What a key refuses: other purposes, leaving as bytes, use after a passphrase change, use
/// while locked, malformed input.
@Suite("managed keys, policy")
struct KeyPolicyTests {
    let message = Data("message".utf8)

    // MARK: Purposes

    @Test func operationOutsidePurposes_failsWithKeyUsageIncorrect() throws {
        let fixture = try KeyFixture()
        let usage = LockboxError.Code.keyUsageIncorrect.rawValue
        let signOnly = try fixture.generate(.p256, [.sign], tag: "sign")
        let signature = try signOnly.sign(message)
        #expect(status { _ = try signOnly.isValidSignature(signature, for: self.message) } == usage)
        #expect(status { _ = try signOnly.sharedSecret(with: signOnly.publicKey!) } == usage)
        let agreeOnly = try fixture.generate(.p256, [.keyAgreement], tag: "agree")
        #expect(status { _ = try agreeOnly.sign(self.message) } == usage)
        let encryptOnly = try fixture.generate(.aes256GCM, [.encrypt], tag: "aes")
        let box = try encryptOnly.encrypt(message)
        #expect(status { _ = try encryptOnly.decrypt(box) } == usage)
        let ed = try fixture.generate(.ed25519, [.verify], tag: "ed")
        #expect(status { _ = try ed.sign(self.message) } == usage)
    }

    @Test func purposeTheAlgorithmCannotHave_isRefusedAtGeneration() throws {
        let fixture = try KeyFixture()
        let param = LockboxError.Code.param.rawValue
        #expect(status { _ = try fixture.generate(.x25519, [.sign]) } == param)
        #expect(status { _ = try fixture.generate(.ed25519, [.keyAgreement]) } == param)
        #expect(status { _ = try fixture.generate(.aes256GCM, [.sign]) } == param)
        #expect(status { _ = try fixture.generate(.p256, [.encrypt]) } == param)
        #expect(status { _ = try fixture.generate(.p256, []) } == param)
        #expect(try fixture.keys.keys().isEmpty, "a refused generation stores nothing")
    }

    @Test func editedDescriptorGrantingAPurpose_isRefusedAsTampered() throws {
        let fixture = try KeyFixture()
        let key = try fixture.generate(.p256, [.verify])
        // Someone with write access to the item rewrites its public descriptor to add `sign`.
        var query = Query(.key)
        query.persistentReference = key.persistentReference
        var update = ItemUpdate()
        var generic = try #require(try fixture.vault.vault.items(matching: query).first?.attributes.generic)
        generic[5] |= KeyPurposes.sign.rawValue
        update.attributes.generic = generic
        try fixture.vault.vault.update(matching: query, to: update)
        let edited = try #require(try fixture.keys.keys().first)
        #expect(edited.purposes.contains(.sign))
        #expect(status { _ = try edited.sign(self.message) } == LockboxError.Code.decode.rawValue)
    }

    // MARK: Non-extractable

    @Test func nonExtractableKey_neverLeavesThroughItemsSecItemBackupOrDump() throws {
        let fixture = try KeyFixture()
        let key = try fixture.generate(.p256, [.sign, .verify], label: "signing key")
        #expect(!key.isExtractable)
        let value = try fixture.storedValue(of: key)
        let scalar = Array(value.suffix(32))
        let canaries = [hex(scalar), Data(scalar).base64EncodedString(), hex(value)]
        let unavailable = LockboxError.Code.dataNotAvailable.rawValue
        let vault = fixture.vault.vault

        // The item API, with data, one or all.
        var query = Query(.key, limit: .all, returning: [.data, .attributes])
        #expect(status { _ = try vault.items(matching: query) } == unavailable)
        query.limit = .one
        #expect(status { _ = try vault.items(matching: query) } == unavailable)
        query.persistentReference = key.persistentReference
        #expect(status { _ = try vault.data(matching: query) } == unavailable)
        #expect(status { _ = try vault.item(matching: query) } == unavailable)
        // Attributes alone are fine, and carry no private byte.
        let attributes = try vault.items(matching: Query(.key, limit: .all, returning: [.attributes]))
        for canary in canaries {
            #expect(!"\(attributes.map { "\($0.attributes)" })".contains(canary))
        }

        // The SecItem layer.
        SecItemStore.withStore(vault) {
            var result: CFTypeRef?
            let query: [String: Any] = [kSecClass as String: kSecClassKey, kSecReturnData as String: true]
            #expect(SecItemCopyMatching(query as CFDictionary, &result) == errSecDataNotAvailable)
            #expect(result == nil)
        }

        // Backups leave it out, so a restore elsewhere has no key.
        let backupPath = fixture.vault.directory.file("backup")
        let backupPassphrase = SecretBytes(utf8: "backup passphrase")
        let summary = try vault.backup(to: backupPath, passphrase: backupPassphrase)
        #expect(summary.skippedNonExtractableKeys == 1)
        #expect(summary.exported == 0)
        let elsewhere = try VaultFixture()
        let restored = try elsewhere.vault.restore(from: backupPath, passphrase: backupPassphrase)
        #expect(restored.added == 0)
        #expect(try SoftwareKeyStore(vault: elsewhere.vault).keys().isEmpty)

        // `lockbox dump` (the built binary, on the same vault), unlocked by `lockbox unlock` into
        // the kernel keyring. That keyring is shared by every process of this user, and other
        // test runs on the machine may free its entries between the two commands: a dump that
        // finds the vault locked is retried, twice at most.
        let lockbox = builtProduct("lockbox")
        var result: ProcessResult?
        for _ in 0..<3 {
            let unlock = try run(
                lockbox, ["--keychain", fixture.vault.path, "unlock", "--passphrase-stdin"],
                input: Array((VaultFixture.passphraseText + "\n").utf8))
            #expect(unlock.status == 0, "lockbox unlock failed: \(unlock.standardError)")
            let attempt = try run(lockbox, ["--keychain", fixture.vault.path, "dump", "--json"])
            result = attempt
            if !attempt.standardError.contains("OSStatus -25308") { break }
        }
        let dump = try #require(result)
        _ = try? run(lockbox, ["--keychain", fixture.vault.path, "lock", "--all"])
        #expect(dump.status == 0, "lockbox dump failed: \(dump.standardError)")
        #expect(dump.standardOutput.contains("signing key"), "the dump lists the key by its label")
        for canary in canaries {
            #expect(!dump.standardOutput.contains(canary))
            #expect(!dump.standardError.contains(canary))
        }
        // The vault file holds it sealed, never in clear.
        for canary in canaries {
            #expect(filesContaining(canary, in: fixture.vault.directory.path).isEmpty)
        }
        #expect(!contains(Array((try? Data(contentsOf: URL(fileURLWithPath: fixture.vault.path))) ?? Data()), scalar))
        // And the key still works.
        #expect(try key.isValidSignature(key.sign(message), for: message))
    }

    @Test func extractableKey_isReadableAsAnItem() throws {
        let fixture = try KeyFixture()
        let key = try fixture.generate(.ed25519, [.sign]) { $0.isExtractable = true }
        var query = Query(.key)
        query.persistentReference = key.persistentReference
        let value = try fixture.vault.vault.data(matching: query)
        #expect(value.withUnsafeBytes { Array($0) } == (try fixture.storedValue(of: key)))
        let summary = try fixture.vault.vault.backup(to: fixture.vault.directory.file("backup"), passphrase: SecretBytes(utf8: "b"))
        #expect(summary.exported == 1 && summary.skippedNonExtractableKeys == 0)
    }

    // MARK: Invalidation by a passphrase change

    @Test func keyBoundToPassphrase_afterChangePassphrase_failsWithInvalidKeyRef() throws {
        let fixture = try KeyFixture()
        let bound = try fixture.generate(.p256, [.sign, .verify], tag: "bound") { $0.isInvalidatedByPassphraseChange = true }
        let plain = try fixture.generate(.p256, [.sign, .verify], tag: "plain")
        #expect(bound.isInvalidatedByPassphraseChange)
        #expect(try bound.isValidSignature(bound.sign(message), for: message))
        try fixture.vault.vault.changePassphrase(from: fixture.vault.passphrase, to: SecretBytes(utf8: "another passphrase"))
        #expect(status { _ = try bound.sign(self.message) } == LockboxError.Code.invalidKeyRef.rawValue)
        // Its public half still verifies; the other key is unaffected.
        #expect(try plain.isValidSignature(plain.sign(message), for: message))
        // Found again by tag, it is still invalid: the state is stored, not in the handle.
        let found = try fixture.keys.key(applicationTag: Data("bound".utf8))
        #expect(status { _ = try found.sign(self.message) } == LockboxError.Code.invalidKeyRef.rawValue)
        try found.delete()
        #expect(try fixture.keys.keys(applicationTag: Data("bound".utf8)).isEmpty)
    }

    @Test func keyBoundToPassphrase_afterRemoveAndSetPassphrase_failsWithInvalidKeyRef() throws {
        let fixture = try KeyFixture()
        let bound = try fixture.generate(.aes256GCM, [.encrypt, .decrypt]) { $0.isInvalidatedByPassphraseChange = true }
        let box = try bound.encrypt(message)
        try fixture.vault.vault.removePassphrase(fixture.vault.passphrase)
        #expect(status { _ = try bound.decrypt(box) } == LockboxError.Code.invalidKeyRef.rawValue)
        #expect(status { _ = try fixture.generate(.p256, [.sign], tag: "new") { $0.isInvalidatedByPassphraseChange = true } }
            == LockboxError.Code.notAvailable.rawValue)
        try fixture.vault.vault.setPassphrase(SecretBytes(utf8: "a new passphrase"))
        #expect(status { _ = try bound.decrypt(box) } == LockboxError.Code.invalidKeyRef.rawValue)
    }

    @Test func keyBoundToPassphrase_keptOpened_isInvalidOnceAnotherHandleRemovesThePassphrase() throws {
        let fixture = try KeyFixture()
        let bound = try fixture.generate(.p256, [.sign, .verify], tag: "bound") { $0.isInvalidatedByPassphraseChange = true }
        #expect(try bound.isValidSignature(bound.sign(message), for: message))
        // Another process removes the passphrase: the key's row is not rewritten, the header is.
        let other = try fixture.vault.reopen()
        try other.unlock(passphrase: fixture.vault.passphrase)
        try other.removePassphrase(fixture.vault.passphrase)
        #expect(status { _ = try bound.sign(self.message) } == LockboxError.Code.invalidKeyRef.rawValue)
    }

    // MARK: Locked, access control

    @Test func lockedVault_operationsAndLookupsFailWithInteractionNotAllowed() throws {
        let fixture = try KeyFixture()
        let key = try fixture.generate(.ed25519, [.sign, .verify])
        let signature = try key.sign(message)
        fixture.vault.vault.lockAll()
        let locked = LockboxError.Code.interactionNotAllowed.rawValue
        #expect(status { _ = try key.sign(self.message) } == locked)
        #expect(status { _ = try fixture.keys.keys() } == locked)
        #expect(status { _ = try fixture.keys.key(applicationTag: Data("com.example.key".utf8)) } == locked)
        #expect(status { _ = try fixture.generate(.p256, [.sign], tag: "new") } == locked)
        // Verifying needs no private key.
        #expect(try key.isValidSignature(signature, for: message))
        try fixture.vault.vault.unlock(passphrase: fixture.vault.passphrase)
        #expect(try key.isValidSignature(key.sign(message), for: message))
    }

    @Test func userPresenceKey_asksThroughTheContextAndHonoursCancel() throws {
        let fixture = try KeyFixture()
        let key = try fixture.generate(.p256, [.sign]) { $0.accessControl = .userPresence }
        #expect(key.accessControl == .userPresence)
        let verifier = PassphraseVerifier()
        let context = AuthenticationContext(verifier: verifier, reuseDuration: .seconds(60))
        _ = try key.sign(message, context: context)
        _ = try key.sign(message, context: context)
        #expect(verifier.count == 1, "the reuse window spares the second prompt")
        let cancelling = AuthenticationContext(verifier: PassphraseVerifier(cancel: true))
        #expect(status { _ = try key.sign(self.message, context: cancelling) } == LockboxError.Code.userCanceled.rawValue)
        let silent = AuthenticationContext(interactionNotAllowed: true)
        #expect(status { _ = try key.sign(self.message, context: silent) } == LockboxError.Code.interactionNotAllowed.rawValue)
        // Listing and the public half need no prompt.
        #expect(try fixture.keys.keys().count == 1)
    }

    // MARK: Finding and deleting

    @Test func keysByTagAndLabel_findOnlyTheirKeys_andDeleteRemovesThem() throws {
        let fixture = try KeyFixture()
        let one = try fixture.generate(.p256, [.sign], tag: "one", label: "first")
        _ = try fixture.generate(.p256, [.sign], tag: "one", label: "second")
        _ = try fixture.generate(.ed25519, [.sign], tag: "two", label: "first")
        #expect(try fixture.keys.keys().count == 3)
        #expect(try fixture.keys.keys(applicationTag: Data("one".utf8)).count == 2)
        #expect(try fixture.keys.keys(label: "first").count == 2)
        let found = try fixture.keys.keys(applicationTag: Data("one".utf8), label: "first")
        #expect(found.map(\.persistentReference) == [one.persistentReference])
        #expect(found.first?.publicKey == one.publicKey)
        #expect(try fixture.keys.keys(applicationTag: Data("none".utf8)).isEmpty)
        #expect(status { _ = try fixture.keys.key(applicationTag: Data("none".utf8)) } == LockboxError.Code.itemNotFound.rawValue)
        try one.delete()
        #expect(status { _ = try one.sign(self.message) } == LockboxError.Code.itemNotFound.rawValue)
        #expect(status { try one.delete() } == LockboxError.Code.itemNotFound.rawValue)
        #expect(try fixture.keys.keys().count == 2)
    }

    // MARK: Malformed input

    @Test func malformedPublicKeysAndSignatures_failWithParam() throws {
        let param = LockboxError.Code.param.rawValue
        var offCurve = [UInt8](repeating: 0, count: 65)
        offCurve[0] = 4
        offCurve[64] = 1
        #expect(status { _ = try PublicKey(x963Representation: Data(offCurve)) } == param)
        #expect(status { _ = try PublicKey(x963Representation: Data([4] + [UInt8](repeating: 7, count: 63))) } == param)
        #expect(status { _ = try PublicKey(rawRepresentation: Data([1, 2, 3]), algorithm: .ed25519) } == param)
        #expect(status { _ = try PublicKey(derRepresentation: Data([0x30, 0x03, 0x02, 0x01, 0x00])) } == param)
        #expect(status { _ = try PublicKey(pemRepresentation: "-----BEGIN PUBLIC KEY-----\n%%%\n-----END PUBLIC KEY-----\n") } == param)
        #expect(status { _ = try PublicKey(pemRepresentation: "not a key") } == param)

        let fixture = try KeyFixture()
        let p256 = try fixture.generate(.p256, [.sign, .verify], tag: "p")
        let ed = try fixture.generate(.ed25519, [.sign, .verify], tag: "e")
        let x = try fixture.generate(.x25519, [.keyAgreement], tag: "x")
        #expect(status { _ = try ed.isValidSignature(Data(repeating: 0, count: 63), for: self.message) } == param)
        #expect(status { _ = try p256.isValidSignature(Data(repeating: 0x30, count: 73), for: self.message) } == param)
        #expect(status { _ = try p256.isValidSignature(Data([1, 2, 3]), for: self.message) } == param)
        // Well-formed length, garbage content: simply not valid.
        #expect(try !p256.isValidSignature(Data([0x30] + [UInt8](repeating: 0xff, count: 70)), for: message))
        #expect(try !ed.isValidSignature(Data(repeating: 0, count: 64), for: message))
        // Key agreement with another algorithm's key or a low-order X25519 point.
        #expect(status { _ = try x.sharedSecret(with: p256.publicKey!) } == param)
        let zero = try PublicKey(rawRepresentation: Data(repeating: 0, count: 32), algorithm: .x25519)
        #expect(status { _ = try x.sharedSecret(with: zero) } == param)
        // Nothing was stored or changed by any of it.
        #expect(try fixture.keys.keys().count == 3)
        #expect(try p256.isValidSignature(p256.sign(message), for: message))
    }

    @Test func descriptions_nameNoKeyBytes() throws {
        let fixture = try KeyFixture()
        let key = try fixture.generate(.x25519, [.keyAgreement])
        let secret = try key.sharedSecret(with: key.publicKey!)
        let scalar = hex(try fixture.storedValue(of: key).suffix(32))
        for text in ["\(key)", "\(secret)", String(reflecting: key), String(reflecting: secret)] {
            #expect(!text.contains(scalar))
            #expect(!text.contains(hex(secret.withUnsafeBytes { Array($0) })))
        }
    }
}

@Suite("managed keys, async")
struct AsyncKeyTests {
    @Test func asyncOperations_giveTheSameResultsAsTheBlockingOnes() async throws {
        let fixture = try KeyFixture()
        var specification = KeySpecification(algorithm: .ed25519, purposes: [.sign, .verify])
        specification.applicationTag = Data("async".utf8)
        let key = try await fixture.keys.generate(specification)
        let message = Data("message".utf8)
        let signature: Data = try await key.sign(message)
        #expect(try key.isValidSignature(signature, for: message))
        let aes = try fixture.generate(.aes256GCM, [.encrypt, .decrypt], tag: "aes")
        let box: Data = try await aes.encrypt(SecretBytes(utf8: "plain"))
        let opened: SecretBytes = try await aes.decrypt(box)
        #expect(opened == SecretBytes(utf8: "plain"))
        let found: [ManagedKey] = try await fixture.keys.keys(applicationTag: Data("async".utf8))
        #expect(found.count == 1)
        try await key.delete()
        let none: [ManagedKey] = try await fixture.keys.keys(applicationTag: Data("async".utf8))
        #expect(none.isEmpty)
        // Errors are the same codes.
        do {
            let _: Data = try await key.sign(message)
            Issue.record("a deleted key signed")
        } catch {
            #expect(error.code == .itemNotFound)
        }
    }
}
