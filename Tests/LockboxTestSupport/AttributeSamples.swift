import Foundation
import LockboxCore

/// Test values for the rows of ``ItemAttributes/fields``, by kind, so that tests generated from
/// the table cover a new attribute without a hand-written list.
package enum AttributeSamples {
    /// A value of `kind` for the attribute `name`; variants 0 and 1 differ.
    package static func value(_ kind: AttributeKind, for name: String, variant: Int = 0) -> AttributeValue {
        switch kind {
        case .text: .text("\(name) \(variant)")
        case .bytes: .bytes(Data(name.utf8) + [0, 0xFF, UInt8(variant)])
        case .integer: .integer(name.count * 100 + variant)
        case .date: .date(Date(timeIntervalSince1970: 1_700_000_000.5 + Double(name.count * 100 + variant)))
        case .flag: .flag(variant == 0)
        case .accessibility: .text((variant == 0 ? Accessibility.afterFirstUnlock : .always).rawValue)
        case .internetProtocol: .text((variant == 0 ? InternetProtocol.https : InternetProtocol(rawValue: "gphr")).rawValue)
        case .authenticationType: .text((variant == 0 ? AuthenticationType.htmlForm : .ntlm).rawValue)
        case .keyClass: .text((variant == 0 ? KeyClass.private : .symmetric).rawValue)
        case .keyType: .text((variant == 0 ? KeyType.ecSECPrimeRandom : .ed25519).rawValue)
        }
    }

    /// Attributes with every row in `fields` set to its sample.
    package static func attributes(_ fields: some Sequence<AttributeField>, variant: Int = 0) -> ItemAttributes {
        var attributes = ItemAttributes()
        for field in fields {
            let stored = field.set(value(field.kind, for: field.name, variant: variant), in: &attributes)
            precondition(stored, "the sample of \(field.name) has its kind")
        }
        return attributes
    }

    /// Every attribute set, with values whose encodings tests pin (the sealed encoding, the
    /// Secret Service names): existing files hold those bytes, so the values must never change.
    package static var fullyPopulated: ItemAttributes {
        var attributes = ItemAttributes(
            service: "svc", account: "acct", label: "Label", accessibility: .afterFirstUnlockThisDeviceOnly, accessGroup: "group")
        attributes.comment = "comment"
        attributes.itemDescription = "description"
        attributes.generic = Data([0x00, 0x01, 0xFE, 0xFF])
        attributes.creationDate = Date(timeIntervalSince1970: 1_700_000_000.25)
        attributes.modificationDate = Date(timeIntervalSince1970: 1_700_000_123.5)
        attributes.synchronizable = true
        attributes.server = "example.org"
        attributes.protocol = .https
        attributes.port = 8443
        attributes.path = "/path"
        attributes.securityDomain = "realm"
        attributes.authenticationType = .httpDigest
        attributes.keyClass = .private
        attributes.keyType = .ecSECPrimeRandom
        attributes.keySizeInBits = 256
        attributes.effectiveKeySize = -1
        attributes.applicationTag = Data("tag".utf8)
        attributes.applicationLabel = Data([0xAA, 0xBB])
        attributes.certificateType = 3
        attributes.subject = Data([0x30, 0x01])
        attributes.issuer = Data([0x30, 0x02])
        attributes.serialNumber = Data([0x05])
        return attributes
    }
}
