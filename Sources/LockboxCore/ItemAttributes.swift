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

    /// Attributes of a generic password, the usual ones named.
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
    /// The four-character code Apple's Keychain uses.
    public let rawValue: String
    /// A protocol from its four-character code.
    public init(rawValue: String) { self.rawValue = rawValue }

    /// `kSecAttrProtocolHTTP`.
    public static let http = InternetProtocol(rawValue: "http")
    /// `kSecAttrProtocolHTTPS`.
    public static let https = InternetProtocol(rawValue: "htps")
    /// `kSecAttrProtocolFTP`.
    public static let ftp = InternetProtocol(rawValue: "ftp ")
    /// `kSecAttrProtocolFTPS`.
    public static let ftps = InternetProtocol(rawValue: "ftps")
    /// `kSecAttrProtocolSSH`.
    public static let ssh = InternetProtocol(rawValue: "ssh ")
    /// `kSecAttrProtocolIMAP`.
    public static let imap = InternetProtocol(rawValue: "imap")
    /// `kSecAttrProtocolIMAPS`.
    public static let imaps = InternetProtocol(rawValue: "imps")
    /// `kSecAttrProtocolSMTP`.
    public static let smtp = InternetProtocol(rawValue: "smtp")
    /// `kSecAttrProtocolLDAP`.
    public static let ldap = InternetProtocol(rawValue: "ldap")
    /// `kSecAttrProtocolLDAPS`.
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
    /// The four-character code Apple's Keychain uses.
    public let rawValue: String
    /// An authentication type from its four-character code.
    public init(rawValue: String) { self.rawValue = rawValue }

    /// `kSecAttrAuthenticationTypeDefault`.
    public static let `default` = AuthenticationType(rawValue: "dflt")
    /// `kSecAttrAuthenticationTypeHTTPBasic`.
    public static let httpBasic = AuthenticationType(rawValue: "http")
    /// `kSecAttrAuthenticationTypeHTTPDigest`.
    public static let httpDigest = AuthenticationType(rawValue: "httd")
    /// `kSecAttrAuthenticationTypeHTMLForm`.
    public static let htmlForm = AuthenticationType(rawValue: "form")
    /// `kSecAttrAuthenticationTypeNTLM`.
    public static let ntlm = AuthenticationType(rawValue: "ntlm")
}

/// `kSecAttrKeyClass` values.
public enum KeyClass: String, Sendable, Hashable, CaseIterable {
    /// `kSecAttrKeyClassPublic`, `kSecAttrKeyClassPrivate` and `kSecAttrKeyClassSymmetric`.
    case `public`, `private`, symmetric
}

/// `kSecAttrKeyType` values.
public struct KeyType: RawRepresentable, Sendable, Hashable {
    /// The value Apple's Keychain uses (`kSecAttrKeyType*`).
    public let rawValue: String
    /// A key type from its value.
    public init(rawValue: String) { self.rawValue = rawValue }

    /// `kSecAttrKeyTypeRSA`.
    public static let rsa = KeyType(rawValue: "42")
    /// `kSecAttrKeyTypeECSECPrimeRandom` (P-256 and the other NIST curves).
    public static let ecSECPrimeRandom = KeyType(rawValue: "73")
    /// `kSecAttrKeyTypeAES`.
    public static let aes = KeyType(rawValue: "2147483649")
    /// Ed25519 (no Keychain constant; Lockbox's own value).
    public static let ed25519 = KeyType(rawValue: "ed25519")
}
