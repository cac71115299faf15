extension ItemAttributes {
    /// True when no attribute is set (a query that matches every item of its class).
    public var isEmpty: Bool {
        !Self.fields.contains { $0.isSet(in: self) }
    }

    /// True when every attribute set in `predicate` equals this item's. `synchronizable` is not
    /// compared here: queries match it through ``Query/SynchronizableMatch``. An item without an
    /// accessibility class has the default one.
    public func matches(_ predicate: ItemAttributes) -> Bool {
        Self.fields.allSatisfy { !$0.isMatchedByAttributes || $0.matches(predicate, item: self) }
    }

    /// Copies every attribute set in `changes` over this one's (not the dates, which the
    /// store sets).
    public mutating func apply(_ changes: ItemAttributes) {
        for field in Self.fields where !field.isSetByStore && field.isSet(in: changes) {
            field.copy(from: changes, to: &self)
        }
    }

    /// Takes every attribute of `item` in place of this one's, the ones `item` lacks removed
    /// (not the dates, which the store sets): another device's whole item, where ``apply(_:)``
    /// would keep an attribute that device's item no longer has.
    package mutating func replace(with item: ItemAttributes) {
        for field in Self.fields where !field.isSetByStore {
            field.copy(from: item, to: &self)
        }
    }
}

extension ItemAttributes {
    /// One bit per attribute that is set: bit `i` for `fields[i]` (declaration order). Written
    /// out property by property, since it runs on every read by a primary key and the rows'
    /// closures cost ten times as much; a test checks it against `fields`.
    package var presentFields: UInt64 {
        var mask: UInt64 = 0
        if label != nil { mask |= 1 << 0 }
        if comment != nil { mask |= 1 << 1 }
        if itemDescription != nil { mask |= 1 << 2 }
        if generic != nil { mask |= 1 << 3 }
        if creationDate != nil { mask |= 1 << 4 }
        if modificationDate != nil { mask |= 1 << 5 }
        if accessGroup != nil { mask |= 1 << 6 }
        if synchronizable != nil { mask |= 1 << 7 }
        if accessibility != nil { mask |= 1 << 8 }
        if service != nil { mask |= 1 << 9 }
        if account != nil { mask |= 1 << 10 }
        if server != nil { mask |= 1 << 11 }
        if `protocol` != nil { mask |= 1 << 12 }
        if port != nil { mask |= 1 << 13 }
        if path != nil { mask |= 1 << 14 }
        if securityDomain != nil { mask |= 1 << 15 }
        if authenticationType != nil { mask |= 1 << 16 }
        if keyClass != nil { mask |= 1 << 17 }
        if keyType != nil { mask |= 1 << 18 }
        if keySizeInBits != nil { mask |= 1 << 19 }
        if effectiveKeySize != nil { mask |= 1 << 20 }
        if applicationTag != nil { mask |= 1 << 21 }
        if applicationLabel != nil { mask |= 1 << 22 }
        if certificateType != nil { mask |= 1 << 23 }
        if subject != nil { mask |= 1 << 24 }
        if issuer != nil { mask |= 1 << 25 }
        if serialNumber != nil { mask |= 1 << 26 }
        return mask
    }
}

/// The attributes that make up an item class's primary key, in a fixed order.
///
/// Apple's data-protection keychain rejects a second item whose primary key equals an
/// existing one with `errSecDuplicateItem`. Access group and synchronizable are part of every
/// class's key (an item of the same name may exist once per group and once per sync state).
package enum PrimaryKey {
    /// A canonical, unambiguous encoding of `attributes`' primary key for `itemClass`.
    /// Absent attributes encode differently from empty ones.
    package static func encode(_ itemClass: ItemClass, _ attributes: ItemAttributes, includingGroup: Bool = true) -> [UInt8] {
        var encoder = FieldEncoder()
        encode(itemClass, attributes, includingGroup: includingGroup, into: &encoder)
        return encoder.bytes
    }

    /// ``encode(_:_:includingGroup:)``, appended to `encoder`.
    package static func encode(_ itemClass: ItemClass, _ attributes: ItemAttributes, includingGroup: Bool, into encoder: inout FieldEncoder) {
        encoder.string(itemClass.rawValue)
        for field in ItemAttributes.primaryKeyFields(of: itemClass) {
            field.encode(attributes, into: &encoder)
        }
        if includingGroup { encodeGroup(attributes, into: &encoder) }
    }

    /// What the encoding with the group has after the one without it: the access group and
    /// the sync flag. (A row's lookup and primary digests are thus made from one encoding.)
    package static func encodeGroup(_ attributes: ItemAttributes, into encoder: inout FieldEncoder) {
        encoder.string(attributes.accessGroup)
        encoder.integer((attributes.synchronizable ?? false) ? 1 : 0)
    }

    /// Encodes a class's "name" attribute, the one most queries give (service, server,
    /// application tag, issuer), or nil when it is not set.
    package static func encodeName(_ itemClass: ItemClass, _ attributes: ItemAttributes) -> [UInt8]? {
        var encoder = FieldEncoder()
        return encodeName(itemClass, attributes, into: &encoder) ? encoder.bytes : nil
    }

    /// ``encodeName(_:_:)`` appended to `encoder`; false, and nothing appended, when the name
    /// is not set.
    package static func encodeName(_ itemClass: ItemClass, _ attributes: ItemAttributes, into encoder: inout FieldEncoder) -> Bool {
        let field = ItemAttributes.nameField(of: itemClass)
        guard field.isSet(in: attributes) else { return false }
        encoder.string(itemClass.rawValue)
        field.encode(attributes, into: &encoder)
        return true
    }

    /// True when `attributes` names one item by its primary key alone: every primary-key
    /// attribute of the class is set, and nothing else but the access group, accessibility
    /// and sync flag.
    package static func namesExactly(_ itemClass: ItemClass, _ attributes: ItemAttributes) -> Bool {
        let present = attributes.presentFields
        let masks = ItemAttributes.presenceMasks(of: itemClass)
        return present & masks.key == masks.key && present & masks.besideKey == 0
    }

    /// True when every primary-key attribute of the class (group and sync excluded) is set in
    /// `attributes`, so a digest of them identifies candidates exactly.
    package static func isComplete(_ itemClass: ItemClass, _ attributes: ItemAttributes) -> Bool {
        ItemAttributes.primaryKeyFields(of: itemClass).allSatisfy { $0.isSet(in: attributes) }
    }
}

/// A predicate prepared for matching many items: the rows of ``ItemAttributes/fields`` it
/// sets are found once, so each item is compared on those alone (usually none, one or two)
/// rather than on every attribute.
package struct AttributePredicate {
    package let attributes: ItemAttributes
    /// The rows compared: those matched by attributes that `attributes` sets.
    package let fields: [AttributeField]

    /// `candidates`: the rows that may be set in `attributes` (every row unless the caller
    /// knows better, as for a primary key).
    package init(_ attributes: ItemAttributes, among candidates: [AttributeField] = ItemAttributes.fields) {
        self.attributes = attributes
        fields = candidates.filter { $0.isMatchedByAttributes && $0.isSet(in: attributes) }
    }

    /// True when no attribute is compared: every item matches.
    package var isEmpty: Bool { fields.isEmpty }

    /// The same answer as `item.matches(attributes)`.
    package func matches(_ item: ItemAttributes) -> Bool {
        for field in fields where !field.matches(attributes, item: item) { return false }
        return true
    }
}
