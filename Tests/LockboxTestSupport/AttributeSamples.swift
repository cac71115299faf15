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
}
