import Foundation
import Lockbox
import LockboxTestSupport
import Testing

@testable import KeychainCompatibility

/// The SecItem layer reads ItemAttributes.fields: every attribute Apple lists for a class goes
/// out in a result dictionary and comes back in through a request, under Apple's key.
@Suite("SecItem dictionaries and the attribute table")
struct SecItemAttributeTableTests {
    /// Apple's constants, written out here independently of the table.
    nonisolated(unsafe) static let appleKeys: [String: CFString] = [
        "label": kSecAttrLabel, "comment": kSecAttrComment, "itemDescription": kSecAttrDescription,
        "generic": kSecAttrGeneric, "creationDate": kSecAttrCreationDate, "modificationDate": kSecAttrModificationDate,
        "accessGroup": kSecAttrAccessGroup, "synchronizable": kSecAttrSynchronizable, "accessibility": kSecAttrAccessible,
        "service": kSecAttrService, "account": kSecAttrAccount, "server": kSecAttrServer, "protocol": kSecAttrProtocol,
        "port": kSecAttrPort, "path": kSecAttrPath, "securityDomain": kSecAttrSecurityDomain,
        "authenticationType": kSecAttrAuthenticationType, "keyClass": kSecAttrKeyClass, "keyType": kSecAttrKeyType,
        "keySizeInBits": kSecAttrKeySizeInBits, "effectiveKeySize": kSecAttrEffectiveKeySize,
        "applicationTag": kSecAttrApplicationTag, "applicationLabel": kSecAttrApplicationLabel,
        "certificateType": kSecAttrCertificateType, "subject": kSecAttrSubject, "issuer": kSecAttrIssuer,
        "serialNumber": kSecAttrSerialNumber,
    ]

    @Test(arguments: ItemAttributes.fields)
    func everyRow_usesApplesKey(field: AttributeField) {
        #expect(Self.appleKeys[field.name].map { $0 as String } == field.secItemKey)
    }

    @Test(arguments: ItemClass.allCases)
    func everyAttributeOfTheClass_roundTripsThroughResultAndRequestDictionaries(itemClass: ItemClass) throws {
        let fields = ItemAttributes.fields.filter { $0.secItemClasses.contains(itemClass) }
        for variant in 0...1 {
            let attributes = AttributeSamples.attributes(fields, variant: variant)
            let dictionary = ResultEncoding.attributes(of: Item(itemClass, attributes: attributes))
            for field in fields {
                #expect(dictionary[field.secItemKey] != nil, "\(field.name) as \(field.secItemKey)")
            }
            let request = try SecItemRequest(dictionary, role: .add)
            #expect(request.itemClass == itemClass)
            #expect(request.attributes == attributes, "variant \(variant)")
        }
    }

    @Test func accessibilityAndSynchronizable_areReturnedWithTheirDefaults() {
        let dictionary = ResultEncoding.attributes(of: Item(.genericPassword, attributes: ItemAttributes(service: "s")))
        #expect(dictionary[kSecAttrAccessible] as? String == kSecAttrAccessibleWhenUnlocked)
        #expect(dictionary[kSecAttrSynchronizable] as? Bool == false)
        #expect(dictionary[kSecAttrService] as? String == "s")
        #expect(dictionary.count == 4)
    }

    @Test func keyTypeKey_isTheKeyTypeOnlyForKeys() throws {
        var attributes = ItemAttributes()
        attributes.keyType = .rsa
        #expect(ResultEncoding.attributes(of: Item(.key, attributes: attributes))[kSecAttrKeyType] as? String == "42")
        #expect(ResultEncoding.attributes(of: Item(.genericPassword, attributes: attributes))[kSecAttrType] == nil)
        // For a password "type" is kSecAttrType, which Lockbox does not store.
        #expect(throws: LockboxError.self) {
            try SecItemRequest([kSecClass: kSecClassGenericPassword, kSecAttrType: "abcd"], role: .add)
        }
    }

    @Test func applicationTag_givenAsAString_isStoredAsItsBytes() throws {
        let request = try SecItemRequest([kSecClass: kSecClassKey, kSecAttrApplicationTag: "com.example.key"], role: .add)
        #expect(request.attributes.applicationTag == Data("com.example.key".utf8))
    }
}
