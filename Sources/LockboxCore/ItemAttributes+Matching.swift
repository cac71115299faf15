extension ItemAttributes {
    /// True when no attribute is set (a query that matches every item of its class).
    public var isEmpty: Bool {
        label == nil && comment == nil && itemDescription == nil && generic == nil && creationDate == nil
            && modificationDate == nil && accessGroup == nil && synchronizable == nil && accessibility == nil
            && service == nil && account == nil && server == nil && `protocol` == nil && port == nil && path == nil
            && securityDomain == nil && authenticationType == nil && keyClass == nil && keyType == nil
            && keySizeInBits == nil && effectiveKeySize == nil && applicationTag == nil && applicationLabel == nil
            && certificateType == nil && subject == nil && issuer == nil && serialNumber == nil
    }

    /// True when every attribute set in `predicate` equals this item's. `synchronizable` is not
    /// compared here: queries match it through ``Query/SynchronizableMatch``.
    public func matches(_ predicate: ItemAttributes) -> Bool {
        func same<T: Equatable>(_ wanted: T?, _ actual: T?) -> Bool {
            guard let wanted else { return true }
            return wanted == actual
        }
        return same(predicate.label, label) && same(predicate.comment, comment)
            && same(predicate.itemDescription, itemDescription) && same(predicate.generic, generic)
            && same(predicate.creationDate, creationDate)
            && same(predicate.modificationDate, modificationDate)
            && same(predicate.accessGroup, accessGroup)
            && same(predicate.accessibility, accessibility ?? .default)
            && same(predicate.service, service) && same(predicate.account, account)
            && same(predicate.server, server) && same(predicate.protocol, `protocol`)
            && same(predicate.port, port) && same(predicate.path, path)
            && same(predicate.securityDomain, securityDomain)
            && same(predicate.authenticationType, authenticationType)
            && same(predicate.keyClass, keyClass) && same(predicate.keyType, keyType)
            && same(predicate.keySizeInBits, keySizeInBits)
            && same(predicate.effectiveKeySize, effectiveKeySize)
            && same(predicate.applicationTag, applicationTag)
            && same(predicate.applicationLabel, applicationLabel)
            && same(predicate.certificateType, certificateType) && same(predicate.subject, subject)
            && same(predicate.issuer, issuer) && same(predicate.serialNumber, serialNumber)
    }

    /// Copies every attribute set in `changes` over this one's.
    public mutating func apply(_ changes: ItemAttributes) {
        func take<T>(_ keyPath: WritableKeyPath<ItemAttributes, T?>) {
            if let value = changes[keyPath: keyPath] { self[keyPath: keyPath] = value }
        }
        take(\.label); take(\.comment); take(\.itemDescription); take(\.generic)
        take(\.accessGroup); take(\.synchronizable); take(\.accessibility)
        take(\.service); take(\.account); take(\.server); take(\.protocol); take(\.port)
        take(\.path); take(\.securityDomain); take(\.authenticationType)
        take(\.keyClass); take(\.keyType); take(\.keySizeInBits); take(\.effectiveKeySize)
        take(\.applicationTag); take(\.applicationLabel)
        take(\.certificateType); take(\.subject); take(\.issuer); take(\.serialNumber)
    }
}

/// The attributes that make up an item class's primary key, in a fixed order.
///
/// Apple's data-protection keychain rejects a second item whose primary key equals an
/// existing one with `errSecDuplicateItem`. Access group and synchronizable are part of every
/// class's key (an item of the same name may exist once per group and once per sync state).
public enum PrimaryKey {
    /// A canonical, unambiguous encoding of `attributes`' primary key for `itemClass`.
    /// Absent attributes encode differently from empty ones.
    public static func encode(_ itemClass: ItemClass, _ attributes: ItemAttributes, includingGroup: Bool = true) -> [UInt8] {
        var encoder = FieldEncoder()
        encoder.string(itemClass.rawValue)
        switch itemClass {
        case .genericPassword:
            encoder.string(attributes.service)
            encoder.string(attributes.account)
        case .internetPassword:
            encoder.string(attributes.server)
            encoder.string(attributes.protocol?.rawValue)
            encoder.integer(attributes.port)
            encoder.string(attributes.path)
            encoder.string(attributes.account)
            encoder.string(attributes.authenticationType?.rawValue)
            encoder.string(attributes.securityDomain)
        case .key:
            encoder.string(attributes.keyClass?.rawValue)
            encoder.string(attributes.keyType?.rawValue)
            encoder.integer(attributes.keySizeInBits)
            encoder.integer(attributes.effectiveKeySize)
            encoder.bytes(attributes.applicationLabel.map(Array.init))
            encoder.bytes(attributes.applicationTag.map(Array.init))
        case .certificate:
            encoder.integer(attributes.certificateType)
            encoder.bytes(attributes.issuer.map(Array.init))
            encoder.bytes(attributes.serialNumber.map(Array.init))
        }
        if includingGroup {
            encoder.string(attributes.accessGroup)
            encoder.integer((attributes.synchronizable ?? false) ? 1 : 0)
        }
        return encoder.bytes
    }

    /// Encodes a class's "name" attribute, the one most queries give (service, server,
    /// application tag, issuer), or nil when it is not set.
    public static func encodeName(_ itemClass: ItemClass, _ attributes: ItemAttributes) -> [UInt8]? {
        var encoder = FieldEncoder()
        encoder.string(itemClass.rawValue)
        switch itemClass {
        case .genericPassword:
            guard let service = attributes.service else { return nil }
            encoder.string(service)
        case .internetPassword:
            guard let server = attributes.server else { return nil }
            encoder.string(server)
        case .key:
            guard let tag = attributes.applicationTag else { return nil }
            encoder.bytes(Array(tag))
        case .certificate:
            guard let issuer = attributes.issuer else { return nil }
            encoder.bytes(Array(issuer))
        }
        return encoder.bytes
    }

    /// True when every primary-key attribute of the class (group and sync excluded) is set in
    /// `attributes`, so a digest of them identifies candidates exactly.
    public static func isComplete(_ itemClass: ItemClass, _ attributes: ItemAttributes) -> Bool {
        let a = attributes
        switch itemClass {
        case .genericPassword:
            return a.service != nil && a.account != nil
        case .internetPassword:
            return a.server != nil && a.protocol != nil && a.port != nil && a.path != nil
                && a.account != nil && a.authenticationType != nil && a.securityDomain != nil
        case .key:
            return a.keyClass != nil && a.keyType != nil && a.keySizeInBits != nil
                && a.effectiveKeySize != nil && a.applicationLabel != nil && a.applicationTag != nil
        case .certificate:
            return a.certificateType != nil && a.issuer != nil && a.serialNumber != nil
        }
    }
}
