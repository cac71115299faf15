import Foundation
import LockboxTestSupport
import Testing

@testable import LockboxCore

@Suite("SecretBytes")
struct SecretBytesTests {
    @Test("description, debugDescription, interpolation and dump print <redacted>")
    func secretBytes_printRedacted() {
        let canary = "CANARY-\(UInt64.random(in: 1...UInt64.max))"
        let secret = SecretBytes(utf8: canary)
        var dumped = ""
        dump(secret, to: &dumped)
        for text in [secret.description, secret.debugDescription, "\(secret)", String(reflecting: secret), dumped] {
            #expect(!text.contains(canary))
        }
        #expect(secret.description == "<redacted>")
        let item = Item.genericPassword(service: "s", account: "a", data: secret)
        #expect(!"\(item)".contains(canary))
    }

    @Test("equality compares contents; lengths first")
    func secretBytes_equalityComparesContents() {
        #expect(SecretBytes(utf8: "abc") == SecretBytes(utf8: "abc"))
        #expect(SecretBytes(utf8: "abc") != SecretBytes(utf8: "abd"))
        #expect(SecretBytes(utf8: "abc") != SecretBytes(utf8: "abcd"))
        #expect(SecretBytes.empty == SecretBytes(copying: []))
    }

    @Test("bytes are reachable through withUnsafeBytes and keep their value")
    func secretBytes_roundTripBytes() {
        let bytes = (0..<5000).map { UInt8(truncatingIfNeeded: $0) }
        let secret = SecretBytes(copying: bytes)
        #expect(secret.count == 5000)
        #expect(secret.withUnsafeBytes { Array($0) } == bytes)
    }

    @Test("a partly filled buffer keeps only what the initializer wrote")
    func secretBytes_partialInitializer() {
        let secret = SecretBytes(capacity: 100) { buffer in
            buffer[0] = 1
            buffer[1] = 2
            return 2
        }
        #expect(secret.withUnsafeBytes { Array($0) } == [1, 2])
    }
}

@Suite("LockboxError")
struct LockboxErrorTests {
    @Test("description ends with (OSStatus N) so scripts can match it")
    func description_carriesStatus() {
        let error = LockboxError(.interactionNotAllowed, "The keychain is locked.")
        #expect(error.description == "The keychain is locked. (OSStatus -25308)")
        #expect(error.status == -25308)
    }

    @Test("codes carry Apple's OSStatus values")
    func codes_matchApple() {
        #expect(LockboxError.Code.itemNotFound.rawValue == -25300)
        #expect(LockboxError.Code.duplicateItem.rawValue == -25299)
        #expect(LockboxError.Code.authFailed.rawValue == -25293)
        #expect(LockboxError.Code.userCanceled.rawValue == -128)
        #expect(LockboxError.Code.interactionNotAllowed.rawValue == -25308)
        #expect(LockboxError.Code.notAvailable.rawValue == -25291)
        #expect(LockboxError.Code.param.rawValue == -50)
        #expect(LockboxError.Code.decode.rawValue == -26275)
        #expect(LockboxError.Code.missingEntitlement.rawValue == -34018)
        #expect(LockboxError.Code.io.rawValue == -36)
    }

    @Test("catch patterns match on the code")
    func catchPattern_matchesCode() {
        func fail() throws { throw LockboxError(.itemNotFound, "no") }
        var matched = false
        do { try fail() } catch LockboxError.itemNotFound { matched = true } catch {}
        #expect(matched)
    }
}

@Suite("Model")
struct ModelTests {
    @Test("accessibility parses Apple's names with and without the prefix")
    func accessibility_parsesAppleNames() {
        #expect(Accessibility(name: "afterFirstUnlockThisDeviceOnly") == .afterFirstUnlockThisDeviceOnly)
        #expect(Accessibility(name: "kSecAttrAccessibleWhenUnlocked") == .whenUnlocked)
        #expect(Accessibility(name: "sometimes") == nil)
        #expect(Accessibility.default == .whenUnlocked)
        #expect(Accessibility.allCases.count == 7)
        #expect(Accessibility.allCases.filter(\.isThisDeviceOnly).count == 4)
    }

    @Test("an absent attribute and an empty one give different primary keys")
    func primaryKey_absentDiffersFromEmpty() {
        let absent = PrimaryKey.encode(.genericPassword, ItemAttributes(service: "s"))
        let empty = PrimaryKey.encode(.genericPassword, ItemAttributes(service: "s", account: ""))
        #expect(absent != empty)
        // Concatenation cannot collide: ("ab", "c") differs from ("a", "bc").
        #expect(PrimaryKey.encode(.genericPassword, ItemAttributes(service: "ab", account: "c"))
            != PrimaryKey.encode(.genericPassword, ItemAttributes(service: "a", account: "bc")))
    }

    @Test("attributes survive encoding and decoding")
    func attributes_roundTrip() throws {
        var attributes = ItemAttributes.internet(server: "h", account: "a", protocol: .https, port: 443, path: "/p")
        attributes.label = "label"
        attributes.generic = Data([1, 2, 3])
        attributes.creationDate = Date(timeIntervalSince1970: 1_700_000_000.5)
        attributes.accessibility = .afterFirstUnlock
        attributes.synchronizable = false
        attributes.keyClass = .private
        attributes.serialNumber = Data([9])
        #expect(try ItemAttributes(decoding: attributes.encoded()) == attributes)
    }

    @Test("malformed encoded attributes are an error, never a crash")
    func malformedAttributes_throw() {
        let valid = ItemAttributes(service: "s", account: "a").encoded()
        var generator = SeededGenerator("malformedAttributes_throw")
        for length in 0..<valid.count {
            #expect(throws: FieldDecoder.Malformed.self) { try ItemAttributes(decoding: Array(valid[0..<length])) }
        }
        // Any bytes either decode to attributes that round-trip, or are refused as malformed.
        func check(_ bytes: [UInt8]) {
            do {
                let decoded = try ItemAttributes(decoding: bytes)
                #expect(try ItemAttributes(decoding: decoded.encoded()) == decoded, "seed \(generator.seed)")
            } catch {
                // Refused as FieldDecoder.Malformed (the only error the typed throw allows).
            }
        }
        for _ in 0..<2000 {
            var mutated = valid
            let index = Int.random(in: 0..<mutated.count, using: &generator)
            mutated[index] = UInt8.random(in: 0...255, using: &generator)
            check(mutated)
            check(generator.bytes(Int.random(in: 0..<64, using: &generator)))
        }
    }

    @Test("isEmpty is true only when no attribute is set")
    func isEmpty_onlyWithoutAttributes() {
        #expect(ItemAttributes().isEmpty)
        #expect(!ItemAttributes(service: "s").isEmpty)
        var attributes = ItemAttributes()
        attributes.serialNumber = Data()
        #expect(!attributes.isEmpty)
        attributes = ItemAttributes()
        attributes.synchronizable = false
        #expect(!attributes.isEmpty)
    }

    @Test("attribute matching: set fields must be equal, nil fields match anything")
    func matching_onSetFieldsOnly() {
        var item = ItemAttributes(service: "s", account: "a", label: "l")
        item.accessibility = .whenUnlocked
        #expect(item.matches(ItemAttributes()))
        #expect(item.matches(ItemAttributes(service: "s")))
        #expect(!item.matches(ItemAttributes(service: "s", account: "b")))
        var byAccessibility = ItemAttributes()
        byAccessibility.accessibility = .afterFirstUnlock
        #expect(!item.matches(byAccessibility))
    }
}
