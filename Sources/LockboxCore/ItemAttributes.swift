import struct Foundation.Data
import struct Foundation.Date

/// Every attribute of a Keychain item except its value (`kSecValueData`).
///
/// In an item, the attributes that are set describe it. In a ``Query``, the attributes that
/// are set must all be equal for an item to match; the ones left `nil` match anything.
/// One struct serves all four classes, as one dictionary does on Apple platforms; the
/// per-class groups below say which attributes belong to which class's primary key.
public struct ItemAttributes: Sendable, Hashable {
    // Common to every class.
    /// `kSecAttrLabel`: the user-visible name.
    public var label: String?
    /// `kSecAttrComment`.
    public var comment: String?
    /// `kSecAttrDescription`: what kind of item this is ("application password").
    public var itemDescription: String?
    /// `kSecAttrGeneric`: application-defined bytes (not secret: stored sealed, but returned
    /// with the attributes).
    public var generic: Data?
    /// `kSecAttrCreationDate`, set by the store.
    public var creationDate: Date?
    /// `kSecAttrModificationDate`, set by the store.
    public var modificationDate: Date?
    /// `kSecAttrAccessGroup`. Items added without one get the store's default group.
    public var accessGroup: String?
    /// `kSecAttrSynchronizable`. Lockbox syncs nothing, but keeps the flag: it is part of the
    /// primary key, and a query that leaves it out matches only non-synchronizable items.
    public var synchronizable: Bool?
    /// `kSecAttrAccessible`. Items added without one get ``Accessibility/default``.
    public var accessibility: Accessibility?

    // Generic and internet passwords.
    /// `kSecAttrService` (generic passwords).
    public var service: String?
    /// `kSecAttrAccount` (generic and internet passwords).
    public var account: String?

    // Internet passwords.
    /// `kSecAttrServer`.
    public var server: String?
    /// `kSecAttrProtocol`.
    public var `protocol`: InternetProtocol?
    /// `kSecAttrPort`.
    public var port: Int?
    /// `kSecAttrPath`.
    public var path: String?
    /// `kSecAttrSecurityDomain`.
    public var securityDomain: String?
    /// `kSecAttrAuthenticationType`.
    public var authenticationType: AuthenticationType?

    // Keys.
    /// `kSecAttrKeyClass`.
    public var keyClass: KeyClass?
    /// `kSecAttrKeyType`.
    public var keyType: KeyType?
    /// `kSecAttrKeySizeInBits`.
    public var keySizeInBits: Int?
    /// `kSecAttrEffectiveKeySize`.
    public var effectiveKeySize: Int?
    /// `kSecAttrApplicationTag`.
    public var applicationTag: Data?
    /// `kSecAttrApplicationLabel`.
    public var applicationLabel: Data?

    // Certificates.
    /// `kSecAttrCertificateType`.
    public var certificateType: Int?
    /// `kSecAttrSubject` (DER).
    public var subject: Data?
    /// `kSecAttrIssuer` (DER).
    public var issuer: Data?
    /// `kSecAttrSerialNumber` (DER).
    public var serialNumber: Data?

    public init(
        service: String? = nil, account: String? = nil, label: String? = nil,
        accessibility: Accessibility? = nil, accessGroup: String? = nil
    ) {
        self.service = service
        self.account = account
        self.label = label
        self.accessibility = accessibility
        self.accessGroup = accessGroup
    }

    /// Attributes of an internet password.
    public static func internet(
        server: String, account: String? = nil, protocol: InternetProtocol? = nil, port: Int? = nil,
        path: String? = nil, securityDomain: String? = nil, authenticationType: AuthenticationType? = nil
    ) -> ItemAttributes {
        var attributes = ItemAttributes(account: account)
        attributes.server = server
        attributes.protocol = `protocol`
        attributes.port = port
        attributes.path = path
        attributes.securityDomain = securityDomain
        attributes.authenticationType = authenticationType
        return attributes
    }
}

/// `kSecAttrProtocol` values: Apple's four-character codes.
public struct InternetProtocol: RawRepresentable, Sendable, Hashable {
    public let rawValue: String
    public init(rawValue: String) { self.rawValue = rawValue }

    public static let http = InternetProtocol(rawValue: "http")
    public static let https = InternetProtocol(rawValue: "htps")
    public static let ftp = InternetProtocol(rawValue: "ftp ")
    public static let ftps = InternetProtocol(rawValue: "ftps")
    public static let ssh = InternetProtocol(rawValue: "ssh ")
    public static let imap = InternetProtocol(rawValue: "imap")
    public static let imaps = InternetProtocol(rawValue: "imps")
    public static let smtp = InternetProtocol(rawValue: "smtp")
    public static let ldap = InternetProtocol(rawValue: "ldap")
    public static let ldaps = InternetProtocol(rawValue: "ldps")

    /// Names as scripts write them (`https`, `ssh`), mapped to Apple's codes.
    public init(name: String) {
        let known: [String: InternetProtocol] = [
            "http": .http, "https": .https, "ftp": .ftp, "ftps": .ftps, "ssh": .ssh,
            "imap": .imap, "imaps": .imaps, "smtp": .smtp, "ldap": .ldap, "ldaps": .ldaps,
        ]
        self = known[name.lowercased()] ?? InternetProtocol(rawValue: name)
    }
}

/// `kSecAttrAuthenticationType` values: Apple's four-character codes.
public struct AuthenticationType: RawRepresentable, Sendable, Hashable {
    public let rawValue: String
    public init(rawValue: String) { self.rawValue = rawValue }

    public static let `default` = AuthenticationType(rawValue: "dflt")
    public static let httpBasic = AuthenticationType(rawValue: "http")
    public static let httpDigest = AuthenticationType(rawValue: "httd")
    public static let htmlForm = AuthenticationType(rawValue: "form")
    public static let ntlm = AuthenticationType(rawValue: "ntlm")
}

/// `kSecAttrKeyClass` values.
public enum KeyClass: String, Sendable, Hashable, CaseIterable {
    case `public`, `private`, symmetric
}

/// `kSecAttrKeyType` values.
public struct KeyType: RawRepresentable, Sendable, Hashable {
    public let rawValue: String
    public init(rawValue: String) { self.rawValue = rawValue }

    public static let rsa = KeyType(rawValue: "42")
    public static let ecSECPrimeRandom = KeyType(rawValue: "73")
    public static let aes = KeyType(rawValue: "2147483649")
    public static let ed25519 = KeyType(rawValue: "ed25519")
}
