import Foundation
import LockboxTestSupport
import Testing

@testable import LockboxCore

/// Two different values of `kind` for the attribute `name` (`variant` 0 or 1), so that every
/// row of the table gets a test value without a hand-written list.
func sampleValue(_ kind: AttributeKind, for name: String, variant: Int = 0) -> AttributeValue {
    AttributeSamples.value(kind, for: name, variant: variant)
}

/// Attributes with only `field` set, to its sample value.
func attributes(with field: AttributeField, variant: Int = 0) -> ItemAttributes {
    var attributes = ItemAttributes()
    let stored = field.set(sampleValue(field.kind, for: field.name, variant: variant), in: &attributes)
    precondition(stored, "the sample of \(field.name) has its kind")
    return attributes
}

/// The names of the stored properties of `attributes` that are set.
func setProperties(_ attributes: ItemAttributes) -> [String] {
    Mirror(reflecting: attributes).children.compactMap { child in
        Mirror(reflecting: child.value).children.isEmpty ? nil : child.label
    }
}

@Suite("The attribute table (ItemAttributes.fields)")
struct AttributeTableTests {
    @Test func table_listsEveryStoredProperty_inDeclarationOrder() {
        // A stored property without a row would be dropped by the sealed encoding, matching and
        // every bridge: this fails until the row is added.
        let properties = Mirror(reflecting: ItemAttributes()).children.map { $0.label ?? "?" }
        #expect(properties.count == 27)
        #expect(ItemAttributes.fields.map(\.name) == properties)
        #expect(Set(ItemAttributes.fields.map(\.secItemKey)).count == ItemAttributes.fields.count)
    }

    @Test(arguments: ItemAttributes.fields)
    func row_getSetAndKeyPath_nameTheSameProperty(field: AttributeField) throws {
        let attributes = attributes(with: field)
        #expect(setProperties(attributes) == [field.name])
        #expect(field.isSet(in: attributes))
        #expect(field.value(in: attributes) == sampleValue(field.kind, for: field.name))
        // The key path reads the same property: its value is set, and clearing through the row empties it.
        let throughKeyPath = attributes[keyPath: field.keyPath]
        #expect(!Mirror(reflecting: throughKeyPath).children.isEmpty)
        var cleared = attributes
        field.set(nil, in: &cleared)
        #expect(cleared.isEmpty && cleared == ItemAttributes())
        #expect(ItemAttributes.field(field.keyPath).name == field.name)
        #expect(ItemAttributes.field(secItemKey: field.secItemKey)?.name == field.name)
    }

    @Test(arguments: ItemAttributes.fields)
    func row_refusesAValueOfAnotherKind(field: AttributeField) {
        var attributes = ItemAttributes()
        let other: AttributeValue = field.kind == .integer ? .text("not a number") : .integer(1)
        #expect(!field.set(other, in: &attributes))
        #expect(attributes.isEmpty)
    }

    // MARK: Sealed encoding

    /// The sealed encoding of this value, captured from the hand-written encoder the table
    /// replaced: existing vault files hold these bytes, so they must never change.
    static var fullyPopulated: ItemAttributes { AttributeSamples.fullyPopulated }

    static let fullyPopulatedEncoding = """
        01010000000101050000004c6162656c0107000000636f6d6d656e74010b0000006465736372697074696f6e01040000
        000001feff010800000000001040fc54d94101080000000000e05efc54d941010500000067726f757001080000000100
        000000000000011e00000061667465724669727374556e6c6f636b546869734465766963654f6e6c7901030000007376
        63010400000061636374010b0000006578616d706c652e6f72670104000000687470730108000000fb20000000000000
        01050000002f7061746801050000007265616c6d01040000006874746401070000007072697661746501020000003733
        010800000000010000000000000108000000ffffffffffffffff01030000007461670102000000aabb01080000000300
        0000000000000102000000300101020000003002010100000005
        """

    @Test func fullyPopulatedAttributes_encodeToTheBytesOfTheFirstFormat() throws {
        #expect(Self.fullyPopulated.encoded() == hexBytes(Self.fullyPopulatedEncoding))
        #expect(try ItemAttributes(decoding: hexBytes(Self.fullyPopulatedEncoding)) == Self.fullyPopulated)
        // No attribute: the version, then one "absent" tag per row.
        #expect(ItemAttributes().encoded() == [1, 1, 0, 0, 0, 1] + [UInt8](repeating: 0, count: 27))
    }

    /// Primary-key and name digests are stored in the vault's index: captured from the
    /// hand-written encoder too.
    @Test(arguments: [
        (ItemClass.genericPassword, """
            010f00000067656e6572696350617373776f72640103000000737663010400000061636374010500000067726f757001
            080000000100000000000000
            """, "010f00000067656e6572696350617373776f72640103000000737663"),
        (ItemClass.internetPassword, """
            0110000000696e7465726e657450617373776f7264010b0000006578616d706c652e6f72670104000000687470730108
            000000fb2000000000000001050000002f7061746801040000006163637401040000006874746401050000007265616c
            6d010500000067726f757001080000000100000000000000
            """, "0110000000696e7465726e657450617373776f7264010b0000006578616d706c652e6f7267"),
        (ItemClass.key, """
            01030000006b657901070000007072697661746501020000003733010800000000010000000000000108000000ffffff
            ffffffffff0102000000aabb0103000000746167010500000067726f757001080000000100000000000000
            """, "01030000006b65790103000000746167"),
        (ItemClass.certificate, """
            010b00000063657274696669636174650108000000030000000000000001020000003002010100000005010500000067
            726f757001080000000100000000000000
            """, "010b000000636572746966696361746501020000003002"),
    ])
    func primaryKeyAndName_encodeToTheBytesOfTheFirstFormat(itemClass: ItemClass, key: String, name: String) {
        #expect(PrimaryKey.encode(itemClass, Self.fullyPopulated) == hexBytes(key))
        #expect(PrimaryKey.encodeName(itemClass, Self.fullyPopulated) == hexBytes(name))
        #expect(PrimaryKey.isComplete(itemClass, Self.fullyPopulated))
        #expect(!PrimaryKey.isComplete(itemClass, ItemAttributes()))
        #expect(PrimaryKey.encodeName(itemClass, ItemAttributes()) == nil)
    }

    @Test(arguments: ItemAttributes.fields)
    func everyAttribute_alone_roundTripsThroughTheSealedEncoding(field: AttributeField) throws {
        for variant in 0...1 {
            let attributes = attributes(with: field, variant: variant)
            #expect(try ItemAttributes(decoding: attributes.encoded()) == attributes)
        }
    }

    @Test func everyAttributeAtOnce_roundTripsThroughTheSealedEncoding() throws {
        var attributes = ItemAttributes()
        for field in ItemAttributes.fields {
            field.set(sampleValue(field.kind, for: field.name), in: &attributes)
        }
        #expect(setProperties(attributes).count == ItemAttributes.fields.count)
        #expect(try ItemAttributes(decoding: attributes.encoded()) == attributes)
    }

    @Test func unknownAccessibilityOrKeyClass_isMalformed() {
        for name in ["accessibility", "keyClass"] {
            let field = ItemAttributes.fields.first { $0.name == name }!
            var encoder = FieldEncoder()
            encoder.bytes([1])
            for row in ItemAttributes.fields {
                if row.name == name { encoder.string("fromALaterVersion") } else { encoder.bytes(nil) }
            }
            #expect(throws: FieldDecoder.Malformed.self, "\(field.name)") { try ItemAttributes(decoding: encoder.bytes) }
        }
    }

    // MARK: isEmpty, matches, apply

    @Test(arguments: ItemAttributes.fields)
    func everyAttribute_makesAttributesNonEmpty(field: AttributeField) {
        #expect(!attributes(with: field).isEmpty)
    }

    @Test(arguments: ItemAttributes.fields)
    func everyAttribute_inAPredicate_selectsTheItemsWithItsValue(field: AttributeField) {
        let predicate = attributes(with: field)
        let same = attributes(with: field)
        let other = attributes(with: field, variant: 1)
        #expect(same.matches(predicate))
        #expect(same.matches(ItemAttributes()))
        if field.isMatchedByAttributes {
            #expect(!other.matches(predicate))
            // An item without the attribute matches only the value it stands for.
            let absentMatches = ItemAttributes().matches(predicate)
            #expect(absentMatches == (field.valueWhenAbsent == sampleValue(field.kind, for: field.name)))
        } else {
            // synchronizable: queries match it through Query.SynchronizableMatch instead.
            #expect(other.matches(predicate))
        }
    }

    @Test func itemWithoutAccessibility_matchesTheDefaultClass() {
        var predicate = ItemAttributes()
        predicate.accessibility = .default
        #expect(ItemAttributes(service: "s").matches(predicate))
        predicate.accessibility = .always
        #expect(!ItemAttributes(service: "s").matches(predicate))
    }

    @Test(arguments: ItemAttributes.fields)
    func everyAttribute_isAppliedByAnUpdate_butTheDatesTheStoreSets(field: AttributeField) {
        var item = attributes(with: field, variant: 1)
        item.apply(attributes(with: field, variant: 0))
        let expected = field.isSetByStore ? attributes(with: field, variant: 1) : attributes(with: field, variant: 0)
        #expect(item == expected)
        // An update that leaves the attribute out keeps it.
        var kept = attributes(with: field, variant: 1)
        kept.apply(ItemAttributes())
        #expect(kept == attributes(with: field, variant: 1))
    }
}

private func hexBytes(_ text: String) -> [UInt8] {
    let digits = Array(text.filter { !$0.isWhitespace }.utf8)
    func nibble(_ digit: UInt8) -> UInt8 { digit <= UInt8(ascii: "9") ? digit - UInt8(ascii: "0") : digit - UInt8(ascii: "a") + 10 }
    return stride(from: 0, to: digits.count, by: 2).map { nibble(digits[$0]) << 4 | nibble(digits[$0 + 1]) }
}
