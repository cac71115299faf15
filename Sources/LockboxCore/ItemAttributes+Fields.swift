import struct Foundation.Data
import struct Foundation.Date

// The one table of item attributes. Every coder, matcher and bridge reads it: the sealed
// encoding (`encoded()` / `init(decoding:)`), `isEmpty`, `matches`, `apply`, `PrimaryKey`, the
// Secret Service schema and the SecItem dictionaries. A new attribute is a stored property of
// `ItemAttributes` plus one row below (appended: the row order is the sealed encoding's field
// order, and a new row needs a new `encodingVersion`); the tests derive their cases from here
// and check that every stored property has a row.

extension ItemAttributes {
    /// Every attribute, in the order of the sealed encoding (which is also declaration order).
    package static let fields: [AttributeField] = [
        // Common to every class.
        AttributeField(
            "label", \.label,
            get: { $0.label }, set: { $0.label = $1 },
            secItemKey: "labl", secItemClasses: .all, secretService: .itemLabel),
        AttributeField(
            "comment", \.comment,
            get: { $0.comment }, set: { $0.comment = $1 },
            secItemKey: "icmt", secItemClasses: .passwords,
            secretService: .everyClass("lockbox:comment")),
        AttributeField(
            "itemDescription", \.itemDescription,
            get: { $0.itemDescription }, set: { $0.itemDescription = $1 },
            secItemKey: "desc", secItemClasses: .passwords,
            secretService: .everyClass("lockbox:description")),
        AttributeField(
            "generic", \.generic,
            get: { $0.generic }, set: { $0.generic = $1 },
            secItemKey: "gena", secItemClasses: [.genericPassword],
            secretService: .everyClass("lockbox:generic")),
        AttributeField(
            "creationDate", \.creationDate,
            get: { $0.creationDate }, set: { $0.creationDate = $1 },
            secItemKey: "cdat", secItemClasses: .all, secretService: .itemCreated,
            isSetByStore: true),
        AttributeField(
            "modificationDate", \.modificationDate,
            get: { $0.modificationDate }, set: { $0.modificationDate = $1 },
            secItemKey: "mdat", secItemClasses: .all,
            secretService: .itemModified, isSetByStore: true),
        AttributeField(
            "accessGroup", \.accessGroup,
            get: { $0.accessGroup }, set: { $0.accessGroup = $1 },
            secItemKey: "agrp", secItemClasses: .all,
            secretService: .everyClass("lockbox:access-group")),
        // Absent means not synchronizable; queries match it through `Query.SynchronizableMatch`.
        AttributeField(
            "synchronizable", \.synchronizable,
            get: { $0.synchronizable }, set: { $0.synchronizable = $1 },
            secItemKey: "sync", secItemClasses: .all,
            secretService: .everyClass("lockbox:synchronizable"), whenAbsent: false, isMatchedByAttributes: false),
        // Absent means Lockbox's (and Apple's) default class.
        AttributeField(
            "accessibility", \.accessibility,
            get: { $0.accessibility }, set: { $0.accessibility = $1 },
            secItemKey: "pdmn", secItemClasses: .all,
            secretService: .everyClass("lockbox:accessibility"), whenAbsent: .default),

        // Generic and internet passwords: secret-tool's, Python keyring's and
        // git-credential-libsecret's (org.gnome.keyring.NetworkPassword) attribute names.
        AttributeField(
            "service", \.service,
            get: { $0.service }, set: { $0.service = $1 },
            secItemKey: "svce", secItemClasses: [.genericPassword],
            secretService: .perClass([.genericPassword: ["service"]], searched: true)),
        // Written as both `account` and `username` so that secret-tool and keyring find it.
        AttributeField(
            "account", \.account,
            get: { $0.account }, set: { $0.account = $1 },
            secItemKey: "acct", secItemClasses: .passwords,
            secretService: .perClass([.genericPassword: ["account", "username"], .internetPassword: ["user"]], searched: true)),

        // Internet passwords.
        AttributeField(
            "server", \.server,
            get: { $0.server }, set: { $0.server = $1 },
            secItemKey: "srvr", secItemClasses: [.internetPassword],
            secretService: .perClass([.internetPassword: ["server"]], searched: true)),
        AttributeField(
            "protocol", \.protocol,
            get: { $0.`protocol` }, set: { $0.`protocol` = $1 },
            secItemKey: "ptcl", secItemClasses: [.internetPassword],
            secretService: .perClass([.internetPassword: ["protocol"]], searched: true)),
        AttributeField(
            "port", \.port,
            get: { $0.port }, set: { $0.port = $1 },
            secItemKey: "port", secItemClasses: [.internetPassword],
            secretService: .perClass([.internetPassword: ["port"]], searched: true)),
        AttributeField(
            "path", \.path,
            get: { $0.path }, set: { $0.path = $1 },
            secItemKey: "path", secItemClasses: [.internetPassword],
            secretService: .perClass([.internetPassword: ["object"]], searched: true)),
        AttributeField(
            "securityDomain", \.securityDomain,
            get: { $0.securityDomain }, set: { $0.securityDomain = $1 },
            secItemKey: "sdmn", secItemClasses: [.internetPassword],
            secretService: .perClass([.internetPassword: ["domain"]], searched: false)),
        AttributeField(
            "authenticationType", \.authenticationType,
            get: { $0.authenticationType }, set: { $0.authenticationType = $1 },
            secItemKey: "atyp", secItemClasses: [.internetPassword],
            secretService: .perClass([.internetPassword: ["authtype"]], searched: false)),

        // Keys.
        AttributeField(
            "keyClass", \.keyClass,
            get: { $0.keyClass }, set: { $0.keyClass = $1 },
            secItemKey: "kcls", secItemClasses: [.key],
            secretService: .perClass([.key: ["lockbox:key-class"]], searched: false)),
        AttributeField(
            "keyType", \.keyType,
            get: { $0.keyType }, set: { $0.keyType = $1 },
            secItemKey: "type", secItemClasses: [.key],
            secretService: .perClass([.key: ["lockbox:key-type"]], searched: false)),
        AttributeField(
            "keySizeInBits", \.keySizeInBits,
            get: { $0.keySizeInBits }, set: { $0.keySizeInBits = $1 },
            secItemKey: "bsiz", secItemClasses: [.key],
            secretService: .perClass([.key: ["lockbox:key-size"]], searched: false)),
        AttributeField(
            "effectiveKeySize", \.effectiveKeySize,
            get: { $0.effectiveKeySize }, set: { $0.effectiveKeySize = $1 },
            secItemKey: "esiz", secItemClasses: [.key],
            secretService: .perClass([.key: ["lockbox:effective-key-size"]], searched: false)),
        // Apple takes a string tag too and stores its UTF-8 bytes.
        AttributeField(
            "applicationTag", \.applicationTag,
            get: { $0.applicationTag }, set: { $0.applicationTag = $1 },
            secItemKey: "atag", secItemClasses: [.key],
            secretService: .perClass([.key: ["lockbox:application-tag"]], searched: false), secItemAcceptsText: true),
        AttributeField(
            "applicationLabel", \.applicationLabel,
            get: { $0.applicationLabel }, set: { $0.applicationLabel = $1 },
            secItemKey: "klbl", secItemClasses: [.key],
            secretService: .perClass([.key: ["lockbox:application-label"]], searched: false)),

        // Certificates.
        AttributeField(
            "certificateType", \.certificateType,
            get: { $0.certificateType }, set: { $0.certificateType = $1 },
            secItemKey: "ctyp", secItemClasses: [.certificate],
            secretService: .perClass([.certificate: ["lockbox:certificate-type"]], searched: false)),
        AttributeField(
            "subject", \.subject,
            get: { $0.subject }, set: { $0.subject = $1 },
            secItemKey: "subj", secItemClasses: [.certificate],
            secretService: .perClass([.certificate: ["lockbox:subject"]], searched: false)),
        AttributeField(
            "issuer", \.issuer,
            get: { $0.issuer }, set: { $0.issuer = $1 },
            secItemKey: "issr", secItemClasses: [.certificate],
            secretService: .perClass([.certificate: ["lockbox:issuer"]], searched: false)),
        AttributeField(
            "serialNumber", \.serialNumber,
            get: { $0.serialNumber }, set: { $0.serialNumber = $1 },
            secItemKey: "slnr", secItemClasses: [.certificate],
            secretService: .perClass([.certificate: ["lockbox:serial-number"]], searched: false)),
    ]

    /// Each class's primary key, in the order its digest encodes it (`PrimaryKey.encode`), and
    /// the "name" attribute most queries give. Access group and synchronizable complete every key.
    package static func primaryKeyFields(of itemClass: ItemClass) -> [AttributeField] {
        switch itemClass {
        case .genericPassword: fieldTable.genericPasswordKey
        case .internetPassword: fieldTable.internetPasswordKey
        case .key: fieldTable.keyKey
        case .certificate: fieldTable.certificateKey
        }
    }

    /// The bits of ``presentFields`` a class's primary key sets, and those of
    /// ``fieldsBesideKey(of:)``.
    package static func presenceMasks(of itemClass: ItemClass) -> (key: UInt64, besideKey: UInt64) {
        switch itemClass {
        case .genericPassword: fieldTable.genericPasswordMasks
        case .internetPassword: fieldTable.internetPasswordMasks
        case .key: fieldTable.keyMasks
        case .certificate: fieldTable.certificateMasks
        }
    }

    /// The attributes of the class outside its primary key, the access group, the
    /// accessibility and the sync flag.
    package static func fieldsBesideKey(of itemClass: ItemClass) -> [AttributeField] {
        switch itemClass {
        case .genericPassword: fieldTable.genericPasswordRest
        case .internetPassword: fieldTable.internetPasswordRest
        case .key: fieldTable.keyRest
        case .certificate: fieldTable.certificateRest
        }
    }

    /// The attribute a class's name digest stands for (service, server, application tag, issuer).
    package static func nameField(of itemClass: ItemClass) -> AttributeField {
        switch itemClass {
        case .genericPassword: fieldTable.genericPasswordName
        case .internetPassword: fieldTable.internetPasswordName
        case .key: fieldTable.keyName
        case .certificate: fieldTable.certificateName
        }
    }

    /// The row of the attribute at `keyPath`.
    package static func field(_ keyPath: PartialKeyPath<ItemAttributes>) -> AttributeField {
        guard let field = fields.first(where: { $0.keyPath == keyPath }) else {
            preconditionFailure("every stored attribute has a row in ItemAttributes.fields")
        }
        return field
    }

    /// The row whose SecItem key is `key`, if Lockbox stores that attribute.
    package static func field(secItemKey key: String) -> AttributeField? {
        fieldTable.indexBySecItemKey[key].map { fields[$0] }
    }

    /// Lookups built once from `fields`.
    private static let fieldTable = FieldTable()

    private struct FieldTable: Sendable {
        let indexBySecItemKey: [String: Int]
        let genericPasswordKey, internetPasswordKey, keyKey, certificateKey: [AttributeField]
        let genericPasswordName, internetPasswordName, keyName, certificateName: AttributeField
        /// Per class, the attributes that are neither in its primary key nor the access group,
        /// accessibility and sync flag every key is completed with.
        let genericPasswordRest, internetPasswordRest, keyRest, certificateRest: [AttributeField]
        let genericPasswordMasks, internetPasswordMasks, keyMasks, certificateMasks: (key: UInt64, besideKey: UInt64)

        init() {
            var bySecItemKey: [String: Int] = [:]
            for (index, field) in ItemAttributes.fields.enumerated() {
                precondition(bySecItemKey.updateValue(index, forKey: field.secItemKey) == nil, "\(field.secItemKey) names two rows")
            }
            indexBySecItemKey = bySecItemKey
            let field: (PartialKeyPath<ItemAttributes>) -> AttributeField = ItemAttributes.field(_:)
            genericPasswordKey = [field(\.service), field(\.account)]
            internetPasswordKey = [
                field(\.server), field(\.protocol), field(\.port), field(\.path), field(\.account),
                field(\.authenticationType), field(\.securityDomain),
            ]
            keyKey = [
                field(\.keyClass), field(\.keyType), field(\.keySizeInBits), field(\.effectiveKeySize),
                field(\.applicationLabel), field(\.applicationTag),
            ]
            certificateKey = [field(\.certificateType), field(\.issuer), field(\.serialNumber)]
            genericPasswordName = field(\.service)
            internetPasswordName = field(\.server)
            keyName = field(\.applicationTag)
            certificateName = field(\.issuer)
            let completing: [PartialKeyPath<ItemAttributes>] = [\.accessGroup, \.accessibility, \.synchronizable]
            func rest(_ key: [AttributeField]) -> [AttributeField] {
                ItemAttributes.fields.filter { field in
                    !key.contains { $0 === field } && !completing.contains(field.keyPath)
                }
            }
            genericPasswordRest = rest(genericPasswordKey)
            internetPasswordRest = rest(internetPasswordKey)
            keyRest = rest(keyKey)
            certificateRest = rest(certificateKey)
            func mask(_ rows: [AttributeField]) -> UInt64 {
                rows.reduce(0) { mask, row in mask | 1 << UInt64(ItemAttributes.fields.firstIndex { $0 === row }!) }
            }
            genericPasswordMasks = (mask(genericPasswordKey), mask(genericPasswordRest))
            internetPasswordMasks = (mask(internetPasswordKey), mask(internetPasswordRest))
            keyMasks = (mask(keyKey), mask(keyRest))
            certificateMasks = (mask(certificateKey), mask(certificateRest))
        }
    }
}

/// The type of an attribute's value, which decides how each consumer writes it.
package enum AttributeKind: Sendable, Hashable, CaseIterable {
    case text, bytes, integer, date, flag
    /// Values with a raw string: travel as `.text` of it.
    case accessibility, internetProtocol, authenticationType, keyClass, keyType
}

/// An attribute value with its Swift type erased, as the dictionary bridges exchange it.
/// Values of the coded kinds travel as `.text` of their raw value.
package enum AttributeValue: Sendable, Hashable {
    case text(String)
    case bytes(Data)
    case integer(Int)
    case date(Date)
    case flag(Bool)
}

/// Where the Secret Service keeps an attribute.
package enum SecretServiceStorage: Sendable, Hashable {
    /// As item attributes, under these names for the classes listed (other classes do not
    /// store it). The first name is read back; all are written. `searched`: other tools' items
    /// carry it too, so searches for candidates use it.
    case perClass([ItemClass: [String]], searched: Bool)
    /// The Secret Service item's own label.
    case itemLabel
    /// The Secret Service item's own creation time.
    case itemCreated
    /// The Secret Service item's own modification time.
    case itemModified

    /// Stored under `name` for every class, and not searched.
    static func everyClass(_ name: String) -> SecretServiceStorage {
        .perClass(Dictionary(uniqueKeysWithValues: ItemClass.allCases.map { ($0, [name]) }), searched: false)
    }

    /// The attribute names for `itemClass`; empty when the class does not store it as attributes.
    package func names(for itemClass: ItemClass) -> [String] {
        guard case .perClass(let names, _) = self else { return [] }
        return names[itemClass] ?? []
    }
}

extension Set where Element == ItemClass {
    static let all = Set(ItemClass.allCases)
    static let passwords: Set<ItemClass> = [.genericPassword, .internetPassword]
}

/// One row of ``ItemAttributes/fields``: an attribute's names in each consumer and its coding.
package final class AttributeField: Sendable, CustomStringConvertible {
    /// The Swift property name.
    package let name: String
    package let keyPath: PartialKeyPath<ItemAttributes> & Sendable
    package let kind: AttributeKind
    /// Apple's attribute key (the value of the `kSecAttr*` constant, as "labl").
    package let secItemKey: String
    /// The classes Apple lists this key for.
    package let secItemClasses: Set<ItemClass>
    /// A SecItem dictionary may give this `Data` attribute as a string (stored as its UTF-8).
    package let secItemAcceptsText: Bool
    package let secretService: SecretServiceStorage
    /// What an item without the attribute has (`accessibility`: the default class;
    /// `synchronizable`: false): used by matching and in returned attribute dictionaries.
    package let valueWhenAbsent: AttributeValue?
    /// False for `synchronizable`, which queries match through `Query.SynchronizableMatch`.
    package let isMatchedByAttributes: Bool
    /// The store sets it (creation and modification dates): `apply` does not copy it.
    package let isSetByStore: Bool
    // The typed side of the row, as closures over the row's `get` and `set`. Those are written
    // out rather than derived from `keyPath`: projecting through a key path at run time made
    // matching and coding several times slower (measured in an optimized build), and these run
    // for every item a query reads. The tests check that `get`/`set` and `keyPath` agree.
    private let isSetIn: @Sendable (ItemAttributes) -> Bool
    private let valueIn: @Sendable (ItemAttributes) -> AttributeValue?
    private let setIn: @Sendable (AttributeValue?, inout ItemAttributes) -> Bool
    private let copyBetween: @Sendable (ItemAttributes, inout ItemAttributes) -> Void
    private let matchesPredicate: @Sendable (ItemAttributes, ItemAttributes) -> Bool
    private let encodeInto: @Sendable (ItemAttributes, inout FieldEncoder) -> Void
    private let decodeFrom: @Sendable (inout FieldDecoder, inout ItemAttributes) throws(FieldDecoder.Malformed) -> Void

    /// A row. `keyPath` identifies the attribute; `get` and `set` must access the same one.
    @inline(__always) init<Value: AttributeValueCoding>(
        _ name: String, _ keyPath: WritableKeyPath<ItemAttributes, Value?> & Sendable,
        get: @escaping @Sendable (ItemAttributes) -> Value?, set: @escaping @Sendable (inout ItemAttributes, Value?) -> Void,
        secItemKey: String, secItemClasses: Set<ItemClass>, secretService: SecretServiceStorage,
        whenAbsent: Value? = nil, isMatchedByAttributes: Bool = true, isSetByStore: Bool = false,
        secItemAcceptsText: Bool = false
    ) {
        self.name = name
        self.keyPath = keyPath
        kind = Value.attributeKind
        self.secItemKey = secItemKey
        self.secItemClasses = secItemClasses
        self.secItemAcceptsText = secItemAcceptsText
        self.secretService = secretService
        valueWhenAbsent = whenAbsent?.attributeValue
        self.isMatchedByAttributes = isMatchedByAttributes
        self.isSetByStore = isSetByStore
        isSetIn = { get($0) != nil }
        valueIn = { get($0)?.attributeValue }
        let setIn: @Sendable (AttributeValue?, inout ItemAttributes) -> Bool = { value, attributes in
            guard let value else {
                set(&attributes, nil)
                return true
            }
            guard let typed = Value(attributeValue: value) else { return false }
            set(&attributes, typed)
            return true
        }
        self.setIn = setIn
        copyBetween = { source, target in set(&target, get(source)) }
        matchesPredicate = { predicate, item in
            guard let wanted = get(predicate) else { return true }
            guard let found = get(item) ?? whenAbsent else { return false }
            return Value.isSame(wanted, found)
        }
        encodeInto = { attributes, encoder in
            guard let value = get(attributes) else { return encoder.bytes(nil as [UInt8]?) }
            value.encodeField(into: &encoder)
        }
        decodeFrom = { (decoder: inout FieldDecoder, attributes: inout ItemAttributes) throws(FieldDecoder.Malformed) in
            set(&attributes, try Value.decodeField(from: &decoder))
        }
    }

    package var description: String { name }

    /// True when `attributes` has this attribute.
    package func isSet(in attributes: ItemAttributes) -> Bool { isSetIn(attributes) }

    /// The attribute's value in `attributes`, type-erased.
    package func value(in attributes: ItemAttributes) -> AttributeValue? { valueIn(attributes) }

    /// Sets (or with nil, clears) the attribute.
    /// - Returns: false, changing nothing, when `value` is not of this attribute's kind or not
    ///   one of its values (an unknown accessibility class).
    @discardableResult
    package func set(_ value: AttributeValue?, in attributes: inout ItemAttributes) -> Bool {
        setIn(value, &attributes)
    }

    /// Copies the attribute from `source` (set or not).
    package func copy(from source: ItemAttributes, to target: inout ItemAttributes) { copyBetween(source, &target) }

    /// True when `predicate` leaves the attribute out, or it equals the item's (or, for an item
    /// without it, ``valueWhenAbsent``).
    package func matches(_ predicate: ItemAttributes, item: ItemAttributes) -> Bool {
        matchesPredicate(predicate, item)
    }

    /// Appends the attribute's field of the sealed encoding.
    package func encode(_ attributes: ItemAttributes, into encoder: inout FieldEncoder) {
        encodeInto(attributes, &encoder)
    }

    /// Reads the attribute's field of the sealed encoding.
    package func decode(from decoder: inout FieldDecoder, into attributes: inout ItemAttributes) throws(FieldDecoder.Malformed) {
        try decodeFrom(&decoder, &attributes)
    }
}

/// A type an attribute can have: its kind and its type-erased form.
package protocol AttributeValueCoding: Hashable, Sendable {
    static var attributeKind: AttributeKind { get }
    var attributeValue: AttributeValue { get }
    init?(attributeValue: AttributeValue)
    /// Appends the value's field of the sealed encoding (typed: no ``AttributeValue`` between).
    func encodeField(into encoder: inout FieldEncoder)
    /// Reads a field ``encodeField(into:)`` wrote; nil for an absent one.
    static func decodeField(from decoder: inout FieldDecoder) throws(FieldDecoder.Malformed) -> Self?
    /// True when a query's `wanted` value matches an item's `found` one: equal as stored (text
    /// compared byte for byte, as the keychain's digests compare it; not by Unicode canonical
    /// equivalence, under which "café" written two ways would match).
    static func isSame(_ wanted: Self, _ found: Self) -> Bool
}

extension AttributeValueCoding {
    package static func isSame(_ wanted: Self, _ found: Self) -> Bool { wanted == found }
}

extension AttributeValueCoding where Self: RawRepresentable, RawValue == String {
    package var attributeValue: AttributeValue { .text(rawValue) }
    package init?(attributeValue: AttributeValue) {
        guard case .text(let raw) = attributeValue else { return nil }
        self.init(rawValue: raw)
    }
    package func encodeField(into encoder: inout FieldEncoder) { encoder.string(rawValue) }
    /// A raw value that names no case (an unknown accessibility class) is malformed.
    package static func decodeField(from decoder: inout FieldDecoder) throws(FieldDecoder.Malformed) -> Self? {
        guard let raw = try decoder.string() else { return nil }
        guard let value = Self(rawValue: raw) else { throw FieldDecoder.Malformed() }
        return value
    }
}

// The sealed encoding: strings and raw values as UTF-8, bytes as they are, integers as 64-bit
// little-endian, dates as the bit pattern of their seconds since 1970, flags as 0 or 1.

extension String: AttributeValueCoding {
    package static var attributeKind: AttributeKind { .text }
    package var attributeValue: AttributeValue { .text(self) }
    package init?(attributeValue: AttributeValue) {
        guard case .text(let text) = attributeValue else { return nil }
        self = text
    }
    package func encodeField(into encoder: inout FieldEncoder) { encoder.string(self) }
    package static func decodeField(from decoder: inout FieldDecoder) throws(FieldDecoder.Malformed) -> String? {
        try decoder.string()
    }
    package static func isSame(_ wanted: String, _ found: String) -> Bool { wanted.utf8.elementsEqual(found.utf8) }
}

extension Data: AttributeValueCoding {
    package static var attributeKind: AttributeKind { .bytes }
    package var attributeValue: AttributeValue { .bytes(self) }
    package init?(attributeValue: AttributeValue) {
        guard case .bytes(let bytes) = attributeValue else { return nil }
        self = bytes
    }
    package func encodeField(into encoder: inout FieldEncoder) { encoder.bytes(self) }
    package static func decodeField(from decoder: inout FieldDecoder) throws(FieldDecoder.Malformed) -> Data? {
        try decoder.data()
    }
}

extension Int: AttributeValueCoding {
    package static var attributeKind: AttributeKind { .integer }
    package var attributeValue: AttributeValue { .integer(self) }
    package init?(attributeValue: AttributeValue) {
        guard case .integer(let integer) = attributeValue else { return nil }
        self = integer
    }
    package func encodeField(into encoder: inout FieldEncoder) { encoder.integer(self) }
    package static func decodeField(from decoder: inout FieldDecoder) throws(FieldDecoder.Malformed) -> Int? {
        try decoder.integer()
    }
}

extension Date: AttributeValueCoding {
    package static var attributeKind: AttributeKind { .date }
    package var attributeValue: AttributeValue { .date(self) }
    package init?(attributeValue: AttributeValue) {
        guard case .date(let date) = attributeValue else { return nil }
        self = date
    }
    package func encodeField(into encoder: inout FieldEncoder) { encoder.double(timeIntervalSince1970) }
    package static func decodeField(from decoder: inout FieldDecoder) throws(FieldDecoder.Malformed) -> Date? {
        try decoder.double().map { Date(timeIntervalSince1970: $0) }
    }
}

extension Bool: AttributeValueCoding {
    package static var attributeKind: AttributeKind { .flag }
    package var attributeValue: AttributeValue { .flag(self) }
    package init?(attributeValue: AttributeValue) {
        guard case .flag(let flag) = attributeValue else { return nil }
        self = flag
    }
    package func encodeField(into encoder: inout FieldEncoder) { encoder.integer(self ? 1 : 0) }
    package static func decodeField(from decoder: inout FieldDecoder) throws(FieldDecoder.Malformed) -> Bool? {
        try decoder.integer().map { $0 != 0 }
    }
}

extension Accessibility: AttributeValueCoding {
    package static var attributeKind: AttributeKind { .accessibility }
}

extension InternetProtocol: AttributeValueCoding {
    package static var attributeKind: AttributeKind { .internetProtocol }
}

extension AuthenticationType: AttributeValueCoding {
    package static var attributeKind: AttributeKind { .authenticationType }
}

extension KeyClass: AttributeValueCoding {
    package static var attributeKind: AttributeKind { .keyClass }
}

extension KeyType: AttributeValueCoding {
    package static var attributeKind: AttributeKind { .keyType }
}
