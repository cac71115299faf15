import Foundation
import KeyCrypto
import LockboxCore
import LockboxKeys
import LockboxTestSupport
import LockboxVault
import Testing

/// Keys kept opened between operations: used only while the vault is unlocked and unchanged,
/// so a deletion, an edit or a lock anywhere is seen at the next use.
@Suite("managed keys, kept opened")
struct KeptOpenedKeyTests {
    let message = Data("sign me twice".utf8)

    @Test(arguments: [KeyAlgorithm.p256, .ed25519])
    func keyDeletedThroughAnotherConnection_isNotUsedAgain(_ algorithm: KeyAlgorithm) throws {
        let fixture = try KeyFixture()
        let key = try fixture.generate(algorithm, [.sign, .verify])
        #expect(try key.isValidSignature(key.sign(message), for: message))
        #expect(try key.isValidSignature(key.sign(message), for: message))
        // Another process's handle on the same file deletes it.
        let other = try fixture.vault.reopen()
        try other.unlock(passphrase: fixture.vault.passphrase)
        var query = Query(.key)
        query.persistentReference = key.persistentReference
        #expect(try other.delete(matching: query) == 1)
        #expect(status { _ = try key.sign(self.message) } == LockboxError.Code.itemNotFound.rawValue)
    }

    @Test(arguments: [KeyAlgorithm.p256, .ed25519])
    func writesToOtherItems_keepTheKeyOpened_itsOwnUpdateReadsItAgain(_ algorithm: KeyAlgorithm) throws {
        let fixture = try KeyFixture()
        let key = try fixture.generate(algorithm, [.sign, .verify])
        #expect(try key.isValidSignature(key.sign(message), for: message))
        let reads = fixture.keys.keyReads
        // Another item written through this handle and through another (another process),
        // as a refresh storing its rotated tokens does between two DPoP proofs.
        try fixture.vault.vault.add(.genericPassword(service: "tokens", account: "a", data: SecretBytes(utf8: "t1")))
        let other = try fixture.vault.reopen()
        try other.unlock(passphrase: fixture.vault.passphrase)
        try other.add(.genericPassword(service: "tokens", account: "b", data: SecretBytes(utf8: "t2")))
        #expect(try key.isValidSignature(key.sign(message), for: message))
        #expect(fixture.keys.keyReads == reads, "a write to another item made the key be read again")
        // The key's own row rewritten (its label, from the other handle): read again.
        var query = Query(.key)
        query.persistentReference = key.persistentReference
        var update = ItemUpdate()
        update.attributes.label = "renamed"
        try other.update(matching: query, to: update)
        #expect(try key.isValidSignature(key.sign(message), for: message))
        #expect(fixture.keys.keyReads == reads + 1)
    }

    @Test func thisHandlesWritesToOtherItems_needNoRowCheck_anyKeyWriteOrAnotherHandlesWriteDoes() throws {
        let fixture = try KeyFixture()
        let key = try fixture.generate(.p256, [.sign, .verify])
        #expect(try key.isValidSignature(key.sign(message), for: message))
        let (reads, checks) = (fixture.keys.keyReads, fixture.keys.keyRowChecks)
        // A refresh's writes: tokens added, rotated and removed through this handle.
        let vault = fixture.vault.vault
        let tokens = Query.genericPassword(service: "tokens", account: "a")
        try vault.add(.genericPassword(service: "tokens", account: "a", data: SecretBytes(utf8: "t1")))
        try vault.update(matching: tokens, to: ItemUpdate(data: SecretBytes(utf8: "t2")))
        #expect(try key.isValidSignature(key.sign(message), for: message))
        try vault.delete(matching: tokens)
        #expect(try key.isValidSignature(key.sign(message), for: message))
        #expect(fixture.keys.keyRowChecks == checks, "a write to another item through this handle made the key's row be checked")
        #expect(fixture.keys.keyReads == reads)
        // Another key's row written through this handle: the kept key's row is checked (and
        // found unchanged, so it is not read again).
        _ = try fixture.generate(.ed25519, [.sign])
        #expect(try key.isValidSignature(key.sign(message), for: message))
        #expect(fixture.keys.keyRowChecks == checks + 1)
        #expect(fixture.keys.keyReads == reads)
        // Another handle's write to another item: checked too (this handle cannot know what it wrote).
        let other = try fixture.vault.reopen()
        try other.unlock(passphrase: fixture.vault.passphrase)
        try other.add(.genericPassword(service: "tokens", account: "b", data: SecretBytes(utf8: "t3")))
        #expect(try key.isValidSignature(key.sign(message), for: message))
        #expect(fixture.keys.keyRowChecks == checks + 2)
        // The key deleted through this handle: never used again.
        try key.delete()
        #expect(status { _ = try key.sign(self.message) } == LockboxError.Code.itemNotFound.rawValue)
    }

    @Test func keyUpdatedThroughThisHandle_isReadAgain() throws {
        let fixture = try KeyFixture()
        let key = try fixture.generate(.ed25519, [.sign, .verify])
        _ = try key.sign(message)
        let reads = fixture.keys.keyReads
        var query = Query(.key)
        query.persistentReference = key.persistentReference
        var update = ItemUpdate()
        update.attributes.label = "renamed"
        try fixture.vault.vault.update(matching: query, to: update)
        #expect(try key.isValidSignature(key.sign(message), for: message))
        #expect(fixture.keys.keyReads == reads + 1)
    }

    @Test func keysListedAgain_takeTheirCheckedPublicPoints_anOffCurvePointIsRefusedEveryTime() throws {
        let fixture = try KeyFixture()
        let key = try fixture.generate(.p256, [.sign, .verify])
        let point = Array(try #require(key.publicKey).rawRepresentation)
        let listed = try fixture.keys.keys()
        #expect(listed.map(\.publicKey) == [key.publicKey])
        #expect(P256.isRemembered(point), "the next listing would check the point with OpenSSL again")
        // A point off the curve (Y changed) is refused, and refused again: never remembered.
        var offCurve = point
        offCurve[64] ^= 0x01
        for _ in 0..<2 {
            #expect(status { _ = try PublicKey(rawRepresentation: Data(offCurve), algorithm: .p256) } == LockboxError.Code.param.rawValue)
            #expect(!P256.isRemembered(offCurve))
        }
    }

    @Test func listingAgain_isReusedWhileNothingChanged_anyKeyChangeOrLockIsSeen() throws {
        let fixture = try KeyFixture()
        let tag = Data("com.example.listed".utf8)
        let first = try fixture.generate(.ed25519, [.sign], tag: "com.example.listed", label: "one")
        #expect(try fixture.keys.keys(applicationTag: tag).map(\.persistentReference) == [first.persistentReference])
        let reads = fixture.keys.listingReads
        // Nothing changed, or only another item through this handle: the listing is reused.
        try fixture.vault.vault.add(.genericPassword(service: "other", account: "a", data: SecretBytes(utf8: "x")))
        #expect(try fixture.keys.keys(applicationTag: tag).count == 1)
        #expect(fixture.keys.listingReads == reads, "the listing was read again though no key changed")
        // A key made here: seen.
        let second = try fixture.generate(.p256, [.sign], tag: "com.example.listed", label: "two")
        #expect(Set(try fixture.keys.keys(applicationTag: tag).map(\.persistentReference)) == [first.persistentReference, second.persistentReference])
        // A key deleted by another handle (another process): seen.
        let other = try fixture.vault.reopen()
        try other.unlock(passphrase: fixture.vault.passphrase)
        var query = Query(.key)
        query.persistentReference = first.persistentReference
        #expect(try other.delete(matching: query) == 1)
        #expect(try fixture.keys.keys(applicationTag: tag).map(\.persistentReference) == [second.persistentReference])
        // A key relabelled here: seen.
        query.persistentReference = second.persistentReference
        var update = ItemUpdate()
        update.attributes.label = "renamed"
        try fixture.vault.vault.update(matching: query, to: update)
        #expect(try fixture.keys.keys(applicationTag: tag).map(\.label) == ["renamed"])
        // Locked: an error, never the kept listing (nor an empty one).
        fixture.vault.vault.lock()
        #expect(status { _ = try fixture.keys.keys(applicationTag: tag) } == LockboxError.Code.interactionNotAllowed.rawValue)
        try fixture.vault.vault.unlock(passphrase: fixture.vault.passphrase)
        #expect(try fixture.keys.keys(applicationTag: tag).count == 1)
        // Locked by another handle (another process's `lockbox lock`): an error too.
        fixture.vault.vault.lockAll()
        #expect(status { _ = try fixture.keys.keys(applicationTag: tag) } == LockboxError.Code.interactionNotAllowed.rawValue)
    }

    @Test func descriptorEditedAfterUse_isRefusedAsTampered() throws {
        let fixture = try KeyFixture()
        let key = try fixture.generate(.p256, [.sign, .verify])
        _ = try key.sign(message)
        var query = Query(.key)
        query.persistentReference = key.persistentReference
        var generic = try #require(try fixture.vault.vault.items(matching: query).first?.attributes.generic)
        generic[6] ^= 0x02  // claims the key is bound to the passphrase
        var update = ItemUpdate()
        update.attributes.generic = generic
        try fixture.vault.vault.update(matching: query, to: update)
        let edited = try #require(try fixture.keys.keys().first)
        #expect(status { _ = try edited.sign(self.message) } == LockboxError.Code.decode.rawValue)
    }

    @Test func lock_dropsTheKeptKeys_andUnlockOpensThemAfresh() throws {
        let fixture = try KeyFixture()
        let key = try fixture.generate(.ed25519, [.sign, .verify])
        _ = try key.sign(message)
        fixture.vault.vault.lock()
        #expect(status { _ = try key.sign(self.message) } == LockboxError.Code.interactionNotAllowed.rawValue)
        try fixture.vault.vault.unlock(passphrase: fixture.vault.passphrase)
        #expect(try key.isValidSignature(key.sign(message), for: message))
        // A lock by another handle (another process's `lockbox lock`) is seen too.
        fixture.vault.vault.lockAll()
        #expect(status { _ = try key.sign(self.message) } == LockboxError.Code.interactionNotAllowed.rawValue)
    }

    @Test("a key whose class stays open after the first unlock signs while the vault is locked (before, the process aborted)")
    func afterFirstUnlockKey_signsWhileLocked() throws {
        let fixture = try KeyFixture()
        let open = try fixture.generate(.ed25519, [.sign, .verify], tag: "com.example.afu") { $0.accessibility = .afterFirstUnlock }
        let always = try fixture.generate(.p256, [.sign, .verify], tag: "com.example.always") { $0.accessibility = .always }
        let closed = try fixture.generate(.ed25519, [.sign, .verify], tag: "com.example.wu")
        _ = try open.sign(message)
        fixture.vault.vault.lock()
        for _ in 0..<2 {
            #expect(try open.isValidSignature(open.sign(message), for: message))
            #expect(try always.isValidSignature(always.sign(message), for: message))
            #expect(status { _ = try closed.sign(self.message) } == LockboxError.Code.interactionNotAllowed.rawValue)
        }
        // Locked by another handle, and unlocked again in between: still a signature or the locked error.
        fixture.vault.vault.lockAll()
        #expect(status { _ = try closed.sign(self.message) } == LockboxError.Code.interactionNotAllowed.rawValue)
        try fixture.vault.vault.unlock(passphrase: fixture.vault.passphrase)
        #expect(try closed.isValidSignature(closed.sign(message), for: message))
        #expect(try open.isValidSignature(open.sign(message), for: message))
    }

    @Test func accessControlledKey_asksAtEveryUseOutsideTheReuseWindow() throws {
        let verifier = PassphraseVerifier()
        let fixture = try KeyFixture()
        let key = try fixture.generate(.p256, [.sign]) { $0.accessControl = .userPresence }
        let context = AuthenticationContext(verifier: verifier)
        _ = try key.sign(message, context: context)
        _ = try key.sign(message, context: AuthenticationContext(verifier: verifier))
        #expect(verifier.count == 2, "a kept key would have skipped the second question")
    }
}
