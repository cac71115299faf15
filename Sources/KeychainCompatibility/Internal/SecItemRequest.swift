#if !canImport(Darwin)
import Foundation
import LockboxCore
import KeyCrypto

/// A query or attribute dictionary, read and checked the way the iOS data-protection keychain
/// reads it. Every rejection carries Apple's status for it.
struct SecItemRequest {
    /// Which SecItem call the dictionary was given to: each accepts different keys.
    enum Role {
        case add
        case search
        case updateQuery
        case updateAttributes
        case delete

        var isQuery: Bool { self == .search || self == .updateQuery || self == .delete }
    }

    enum Limit: Equatable {
        case one
        case all
        case count(Int)
    }

    var itemClass: ItemClass?
    var attributes = ItemAttributes()
    /// `kSecAttrSynchronizable` as a query reads it: absent means non-synchronizable only.
    var synchronizable: Query.SynchronizableMatch = .notSynchronizable
    var limit: Limit = .one
    var returning: Query.ReturnOptions = []
    var returnsReference = false
    var data: Data?
    var persistentReference: Data?
    var accessControl: SecAccessControl?
    /// `kSecUseAuthenticationContext`, kept for the vault's user verification.
    var authenticationContext: Any?
    /// The access control the vault enforces for an added item.
    var itemAccessControl: AccessControl?
    /// `kSecUseAuthenticationUI`.
    var authenticationUI: String?
    /// `kSecValueRef`: a key to add, or the key to find.
    var keyReference: SecKey?
    /// `kSecAttrIsExtractable` of a key added with `kSecValueRef`.
    var isExtractable: Bool?

    /// Reads `dictionary` for `role`. `queriedClass` is the class of the items SecItemUpdate's
    /// query matched, which decides the attributes `attributesToUpdate` may name.
    init(_ given: CFDictionary, role: Role, attributesOf queriedClass: ItemClass? = nil) throws(LockboxError) {
        guard let dictionary = given.stringKeyed else {
            throw Self.failure(errSecParam, "Every key of a SecItem dictionary must be a kSec* string.")
        }
        try self.init(dictionary, role: role, attributesOf: queriedClass)
    }

    init(_ dictionary: [String: Any], role: Role, attributesOf queriedClass: ItemClass? = nil) throws(LockboxError) {
        if role == .updateAttributes { itemClass = queriedClass }
        if let value = dictionary[kSecClass] {
            guard role != .updateAttributes else {
                throw Self.failure(errSecParam, "kSecClass cannot be changed by SecItemUpdate.")
            }
            guard let code = QueryValue.string(value) else {
                throw Self.failure(errSecParam, "The value of kSecClass must be a kSecClass* string.")
            }
            if code == kSecClassIdentity {
                throw Self.failure(errSecUnimplemented, "Identities (kSecClassIdentity) are not supported on Linux.")
            }
            guard let itemClass = ItemClassCode.itemClass(for: code) else {
                throw Self.failure(errSecNoSuchClass, "\(code) is not a keychain item class.")
            }
            self.itemClass = itemClass
        }
        if dictionary[kSecValuePersistentRef] != nil, role == .add || role == .updateAttributes {
            throw Self.failure(errSecParam, "kSecValuePersistentRef names an existing item; it cannot be set.")
        }
        if let value = dictionary[kSecValuePersistentRef] {
            guard let reference = QueryValue.data(value) else {
                throw Self.failure(errSecParam, "The value of kSecValuePersistentRef must be Data.")
            }
            persistentReference = reference
        }
        // A SecKey reference names its class, as on Apple platforms.
        if itemClass == nil, role != .updateAttributes, dictionary[kSecValueRef].flatMap(QueryValue.unwrapped) is SecKey {
            itemClass = .key
        }
        if itemClass == nil, role != .updateAttributes, persistentReference == nil {
            throw Self.failure(errSecParam, "The dictionary has no kSecClass; every SecItem call needs one.")
        }
        var sawSynchronizable = false
        for (key, value) in dictionary where key != kSecClass && key != kSecValuePersistentRef {
            if key == kSecAttrSynchronizable { sawSynchronizable = true }
            try read(key, value, role: role)
        }
        // A query by persistent reference finds its item whether or not it is synchronizable:
        // securityd adds the implicit `sync = 0` only to queries without one
        // (SecDbQuery.c, query_create_with_limit).
        if role.isQuery, persistentReference != nil, !sawSynchronizable {
            synchronizable = .any
        }
        if role == .add || role == .updateAttributes {
            try checkAccessControl(role: role)
            if sawSynchronizable, attributes.synchronizable == true, attributes.accessibility?.isThisDeviceOnly == true {
                throw Self.failure(
                    errSecParam, "A synchronizable item cannot use a ThisDeviceOnly kSecAttrAccessible value.")
            }
        }
    }

    // MARK: Keys

    private mutating func read(_ key: String, _ value: Any, role: Role) throws(LockboxError) {
        let isMeta = key.hasPrefix("m_") || key.hasPrefix("r_") || key.hasPrefix("u_") || key == kSecUseDataProtectionKeychain
        if isMeta, role == .updateAttributes {
            throw Self.failure(errSecParam, "\(key) is a search or return key; SecItemUpdate's attributes take item attributes only.")
        }
        switch key {
        case kSecValueData:
            // A query's data is ignored, as Apple does: `SecItemDelete(query)` with the dictionary
            // just used for `SecItemAdd` is the usual "replace" idiom.
            guard let data = QueryValue.data(value) else {
                throw Self.failure(errSecParam, "The value of kSecValueData must be Data.")
            }
            if !role.isQuery { self.data = data }
        case kSecValueRef:
            guard role != .updateAttributes else {
                throw Self.failure(errSecParam, "kSecValueRef names an item; SecItemUpdate's attributes cannot change it.")
            }
            guard let key = QueryValue.unwrapped(value) as? SecKey else {
                throw Self.failure(errSecUnimplemented, "kSecValueRef: only SecKey references exist on Linux.")
            }
            if itemClass == nil { itemClass = .key }
            guard itemClass == .key else {
                throw Self.failure(errSecParam, "A SecKey in kSecValueRef needs kSecClass kSecClassKey.")
            }
            keyReference = key
            if role.isQuery {
                switch key.material {
                case .stored(let managed): persistentReference = managed.persistentReference
                case .brokered(let brokered) where brokered.persistentReference != nil:
                    persistentReference = brokered.persistentReference
                case .memory, .publicKey, .brokered:
                    if let publicKey = key.publicKey {
                        attributes.applicationLabel = Data(MessageDigest.sha1(Array(publicKey.rawRepresentation)))
                    }
                }
            }
        case kSecMatchLimit:
            try readLimit(value)
        case kSecMatchCaseInsensitive:
            if QueryValue.bool(value) == true {
                throw Self.failure(errSecUnimplemented, "kSecMatchCaseInsensitive is not supported.")
            }
        case kSecMatchPolicy, kSecMatchItemList, kSecMatchSearchList, kSecMatchIssuers, kSecMatchEmailAddressIfPresent,
            kSecMatchSubjectContains, kSecMatchTrustedOnly, kSecMatchValidOnDate:
            throw Self.failure(errSecUnimplemented, "\(key) is not supported on Linux.")
        case kSecReturnData: try readReturn(value, .data, key)
        case kSecReturnAttributes: try readReturn(value, .attributes, key)
        case kSecReturnPersistentRef: try readReturn(value, .persistentReference, key)
        case kSecReturnRef:
            guard let flag = QueryValue.bool(value) else {
                throw Self.failure(errSecParam, "The value of kSecReturnRef must be a Boolean.")
            }
            returnsReference = flag
            if flag, itemClass == .certificate {
                throw Self.failure(errSecUnimplemented, "kSecReturnRef: Linux has no SecCertificate; use kSecReturnData.")
            }
        case kSecUseAuthenticationContext:
            guard let context = QueryValue.unwrapped(value), Self.authenticationContext(of: context) != nil else {
                throw Self.failure(errSecParam, "kSecUseAuthenticationContext must be an LAContext (or a Lockbox AuthenticationContext).")
            }
            authenticationContext = context
        case kSecUseAuthenticationUI:
            guard let mode = QueryValue.string(value),
                Set([kSecUseAuthenticationUIAllow, kSecUseAuthenticationUIFail, kSecUseAuthenticationUISkip]).contains(mode)
            else {
                throw Self.failure(errSecParam, "The value of kSecUseAuthenticationUI must be a kSecUseAuthenticationUI* value.")
            }
            authenticationUI = mode
        case kSecUseNoAuthenticationUI:
            if QueryValue.bool(value) == true { authenticationUI = kSecUseAuthenticationUIFail as String }
        case kSecUseOperationPrompt, kSecUseDataProtectionKeychain:
            break
        case kSecAttrAccessControl:
            guard let control = QueryValue.unwrapped(value) as? SecAccessControl else {
                throw Self.failure(errSecParam, "The value of kSecAttrAccessControl must come from SecAccessControlCreateWithFlags.")
            }
            // In a query it selects nothing: Apple does not match on access control.
            if !role.isQuery { accessControl = control }
        case kSecAttrSynchronizable:
            try readSynchronizable(value, role: role)
        default:
            try readAttribute(key, value)
        }
    }

    private mutating func readLimit(_ value: Any) throws(LockboxError) {
        if let code = QueryValue.string(value), code == kSecMatchLimitOne || code == kSecMatchLimitAll {
            limit = code == kSecMatchLimitOne ? .one : .all
        } else if let count = QueryValue.integer(value), count > 0 {
            limit = count == 1 ? .one : .count(count)
        } else {
            throw Self.failure(errSecParam, "kSecMatchLimit must be kSecMatchLimitOne, kSecMatchLimitAll or a positive number.")
        }
    }

    private mutating func readReturn(_ value: Any, _ option: Query.ReturnOptions, _ key: String) throws(LockboxError) {
        guard let flag = QueryValue.bool(value) else {
            throw Self.failure(errSecParam, "The value of \(key) must be a Boolean.")
        }
        if flag { returning.insert(option) } else { returning.remove(option) }
    }

    private mutating func readSynchronizable(_ value: Any, role: Role) throws(LockboxError) {
        if let code = QueryValue.string(value), code == kSecAttrSynchronizableAny {
            guard role.isQuery else {
                throw Self.failure(errSecParam, "kSecAttrSynchronizableAny is for queries; an item is synchronizable or not.")
            }
            synchronizable = .any
            return
        }
        guard let flag = QueryValue.bool(value) else {
            throw Self.failure(errSecParam, "kSecAttrSynchronizable must be a Boolean or kSecAttrSynchronizableAny.")
        }
        if role.isQuery {
            synchronizable = flag ? .synchronizable : .notSynchronizable
        } else {
            attributes.synchronizable = flag
        }
    }

    /// The access control of an added or updated item, checked against what Linux can honour.
    private mutating func checkAccessControl(role: Role) throws(LockboxError) {
        guard let accessControl else { return }
        if let accessibility = attributes.accessibility, accessibility != accessControl.protection {
            throw Self.failure(
                errSecParam, "kSecAttrAccessible and the protection of kSecAttrAccessControl disagree; give one of them.")
        }
        attributes.accessibility = accessControl.protection
        // securityd's rule (SecItem.c): "item with kSecAttrAccessControl is not synchronizable"
        // when the access control has constraints.
        if !accessControl.flags.isEmpty, attributes.synchronizable == true {
            throw Self.failure(
                errSecParam,
                "An item with kSecAttrAccessControl cannot be synchronizable: its value needs this machine's user. "
                    + "Drop kSecAttrSynchronizable or the access control.")
        }
        switch accessControl.linuxRequirement {
        case .none:
            break
        case .unavailableHardware:
            // Apple's status on a device without enrolled biometry: docs/SECITEM.md#biometry.
            throw Self.failure(
                errSecAuthFailed,
                "This access control needs biometry (or a paired watch), which Linux does not have. "
                    + "Use .userPresence or .devicePasscode, or add .or with one of them.")
        case .userVerification:
            guard !accessControl.flags.contains(.applicationPassword) else {
                throw Self.failure(
                    errSecUnimplemented,
                    "An application password (.applicationPassword) is not supported; the item was not added "
                        + "rather than added unprotected.")
            }
            // The vault seals the item key to the presence key: every read, update and delete
            // asks through the query's AuthenticationContext.
            var flags: AccessControl.Flags = []
            if accessControl.flags.contains(.userPresence) { flags.insert(.userPresence) }
            if accessControl.flags.contains(.devicePasscode) { flags.insert(.devicePasscode) }
            if accessControl.flags.contains(.biometryAny) { flags.insert(.biometryAny) }
            if accessControl.flags.contains(.biometryCurrentSet) { flags.insert(.biometryCurrentSet) }
            if accessControl.flags.contains(.or) { flags.insert(.or) }
            if accessControl.flags.contains(.and) { flags.insert(.and) }
            itemAccessControl = AccessControl(flags)
        }
    }

    // MARK: Attributes

    /// Keys Apple lists for each class ("Item attribute keys and values") that Lockbox does not
    /// store: accepted as known attributes, then refused as unimplemented. The stored ones, and
    /// their classes, are the rows of ``ItemAttributes/fields``.
    static let unstoredKeysByClass: [ItemClass: Set<String>] = [
        .genericPassword: Set([kSecAttrCreator, kSecAttrType, kSecAttrIsInvisible, kSecAttrIsNegative]),
        .internetPassword: Set([kSecAttrCreator, kSecAttrType, kSecAttrIsInvisible, kSecAttrIsNegative]),
        .certificate: Set([kSecAttrCertificateEncoding, kSecAttrSubjectKeyID, kSecAttrPublicKeyHash]),
        .key: Set(keyUsageKeys),
    ]
    /// Key attributes fixed when a key is made (``SecKeyCreateRandomKey(_:_:)``): in a key query
    /// they are accepted and select nothing more than the key's own item does.
    nonisolated(unsafe) static let keyUsageKeys: [CFString] = [
        kSecAttrIsPermanent, kSecAttrCanEncrypt, kSecAttrCanDecrypt, kSecAttrCanDerive, kSecAttrCanSign,
        kSecAttrCanVerify, kSecAttrCanWrap, kSecAttrCanUnwrap, kSecAttrTokenID, kSecAttrIsExtractable,
        kSecAttrIsSensitive,
    ]
    static let keyUsageNames = Set(keyUsageKeys)
    static let unstoredKeys = unstoredKeysByClass.values.reduce(into: Set<String>()) { $0.formUnion($1) }

    /// A key outside its class's list is `errSecNoSuchAttr`.
    private static let keysByClass: [ItemClass: Set<String>] = Dictionary(
        uniqueKeysWithValues: ItemClass.allCases.map { itemClass in
            let stored = ItemAttributes.fields.filter { $0.secItemClasses.contains(itemClass) }.map(\.secItemKey)
            return (itemClass, unstoredKeysByClass[itemClass, default: []].union(stored))
        })
    private static let allAttributeKeys = keysByClass.values.reduce(into: Set<String>()) { $0.formUnion($1) }

    private mutating func readAttribute(_ key: String, _ value: Any) throws(LockboxError) {
        if itemClass == .key, key == kSecAttrIsExtractable {
            isExtractable = QueryValue.bool(value)
            return
        }
        if itemClass == .key, Self.keyUsageNames.contains(key) {
            // Fixed when the key was made; every SecKey this layer makes can do what its
            // algorithm can, so they select nothing further.
            return
        }
        let known = itemClass.map { Self.keysByClass[$0]!.contains(key) } ?? Self.allAttributeKeys.contains(key)
        guard known else {
            let owner = itemClass.map(ItemClassCode.code(for:)) ?? "any class"
            throw Self.failure(errSecNoSuchAttr, "\(key) is not an attribute of \(owner).")
        }
        // "type" is both kSecAttrType (passwords, not stored) and kSecAttrKeyType: it names the
        // key type only in a dictionary of the key class.
        guard let field = ItemAttributes.field(secItemKey: key),
            itemClass.map(field.secItemClasses.contains) ?? !Self.unstoredKeys.contains(key)
        else {
            throw Self.failure(
                errSecUnimplemented, "\(key) is an Apple keychain attribute that Lockbox does not store.")
        }
        func string() throws(LockboxError) -> String {
            guard let text = QueryValue.string(value) else {
                throw Self.failure(errSecParam, "The value of \(key) must be a string.")
            }
            return text
        }
        func code() throws(LockboxError) -> String {
            // Apple's codes for key classes and types are numbers written as strings.
            if let number = QueryValue.integer(value) { return String(number) }
            return try string()
        }
        let read: AttributeValue
        switch field.kind {
        case .text where Self.blobTextKeys.contains(key):
            // iOS keeps account and service as blobs: Data is stored and returned as Data
            // (developer.apple.com/documentation/security/ksecattraccount: "a CFString";
            // securityd's schema: `acct` and `svce` are blob attributes).
            if let data = QueryValue.data(value) {
                read = .text(BlobText.encode(data))
            } else {
                read = .text(BlobText.encode(string: try string()))
            }
        case .text, .internetProtocol, .authenticationType:
            read = .text(try string())
        case .keyType:
            read = .text(try code())
        case .bytes:
            if let data = QueryValue.data(value) {
                read = .bytes(data)
            } else if field.secItemAcceptsText, let text = QueryValue.string(value) {
                read = .bytes(Data(text.utf8))
            } else {
                throw Self.failure(errSecParam, "The value of \(key) must be Data.")
            }
        case .integer:
            guard let number = QueryValue.integer(value) else {
                throw Self.failure(errSecParam, "The value of \(key) must be a number.")
            }
            read = .integer(number)
        case .date:
            guard let date = QueryValue.date(value) else {
                throw Self.failure(errSecParam, "The value of \(key) must be a Date.")
            }
            read = .date(date)
        case .flag:
            guard let flag = QueryValue.bool(value) else {
                throw Self.failure(errSecParam, "The value of \(key) must be a Boolean.")
            }
            read = .flag(flag)
        case .accessibility:
            guard let accessibility = AccessibilityCode.accessibility(for: try string()) else {
                throw Self.failure(errSecParam, "The value of kSecAttrAccessible must be a kSecAttrAccessible* value.")
            }
            read = accessibility.attributeValue
        case .keyClass:
            guard let keyClass = KeyClassCode.keyClass(for: try code()) else {
                throw Self.failure(errSecParam, "The value of kSecAttrKeyClass must be a kSecAttrKeyClass* value.")
            }
            read = keyClass.attributeValue
        }
        let stored = field.set(read, in: &attributes)
        precondition(stored, "a value read for \(field.name) has its kind")
    }

    /// Text attributes that iOS stores as blobs and that may be given as `Data`.
    static let blobTextKeys = Set([kSecAttrAccount, kSecAttrService])

    /// The vault's context for a `kSecUseAuthenticationContext` value.
    static func authenticationContext(of value: Any) -> AuthenticationContext? {
        if let provider = value as? any SecAuthenticationContextProviding { return provider.secItemAuthenticationContext }
        return value as? AuthenticationContext
    }

    static func failure(_ status: OSStatus, _ message: String) -> LockboxError {
        LockboxError(LockboxError.Code(rawValue: status), message)
    }
}
#endif
