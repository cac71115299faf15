import struct Foundation.Data
import struct Foundation.Date
import LockboxCore

/// How Keychain items map onto Secret Service items: the attribute names, the `xdg:schema`
/// per class, and the searches that find an item Lockbox wrote as well as the same kind of
/// item written by `secret-tool`, Python `keyring` or git's libsecret helper.
///
/// docs/SECRET-SERVICE.md has this as a table; keep the two in step.
enum SecretServiceSchema {
    /// libsecret's generic schema: what `secret-tool store` writes.
    static let genericSchemaName = "org.freedesktop.Secret.Generic"
    /// The network-password schema that git-credential-libsecret reads and writes.
    static let networkSchemaName = "org.gnome.keyring.NetworkPassword"
    /// Keys and certificates, which no other tool shares.
    static let lockboxSchemaName = "io.lockbox.Item"

    enum Name {
        static let schema = "xdg:schema"
        static let itemClass = "lockbox:class"
        static let hasLabel = "lockbox:has-label"
        static let comment = "lockbox:comment"
        static let itemDescription = "lockbox:description"
        static let generic = "lockbox:generic"
        static let accessGroup = "lockbox:access-group"
        static let accessibility = "lockbox:accessibility"
        static let synchronizable = "lockbox:synchronizable"
        // Generic passwords: secret-tool's and keyring's names.
        static let service = "service"
        static let account = "account"
        static let username = "username"
        // Internet passwords: the org.gnome.keyring.NetworkPassword names.
        static let server = "server"
        static let `protocol` = "protocol"
        static let port = "port"
        static let object = "object"
        static let user = "user"
        static let authenticationType = "authtype"
        static let domain = "domain"
        // Keys and certificates.
        static let keyClass = "lockbox:key-class"
        static let keyType = "lockbox:key-type"
        static let keySize = "lockbox:key-size"
        static let effectiveKeySize = "lockbox:effective-key-size"
        static let applicationTag = "lockbox:application-tag"
        static let applicationLabel = "lockbox:application-label"
        static let certificateType = "lockbox:certificate-type"
        static let subject = "lockbox:subject"
        static let issuer = "lockbox:issuer"
        static let serialNumber = "lockbox:serial-number"
    }

    /// Apple's protocol codes and the URL scheme names other tools store (`https`, `ssh`).
    private static let protocolNames: [(InternetProtocol, String)] = [
        (.http, "http"), (.https, "https"), (.ftp, "ftp"), (.ftps, "ftps"), (.ssh, "ssh"),
        (.imap, "imap"), (.imaps, "imaps"), (.smtp, "smtp"), (.ldap, "ldap"), (.ldaps, "ldaps"),
    ]

    static func schemeName(_ value: InternetProtocol) -> String {
        protocolNames.first { $0.0 == value }?.1 ?? value.rawValue
    }

    static func schemaName(for itemClass: ItemClass) -> String {
        switch itemClass {
        case .genericPassword: genericSchemaName
        case .internetPassword: networkSchemaName
        case .key, .certificate: lockboxSchemaName
        }
    }

    /// The Secret Service attributes that describe `attributes` of an item of `itemClass`.
    static func encode(_ itemClass: ItemClass, _ attributes: ItemAttributes) -> [String: String] {
        var result: [String: String] = [
            Name.schema: schemaName(for: itemClass),
            Name.itemClass: itemClass.rawValue,
        ]
        func put(_ name: String, _ value: String?) {
            if let value { result[name] = value }
        }
        func put(_ name: String, _ value: Data?) {
            if let value { result[name] = value.base64EncodedString() }
        }
        func put(_ name: String, _ value: Int?) {
            if let value { result[name] = String(value) }
        }
        put(Name.hasLabel, attributes.label == nil ? nil : "1")
        put(Name.comment, attributes.comment)
        put(Name.itemDescription, attributes.itemDescription)
        put(Name.generic, attributes.generic)
        put(Name.accessGroup, attributes.accessGroup)
        put(Name.accessibility, attributes.accessibility?.rawValue)
        put(Name.synchronizable, attributes.synchronizable == true ? "1" : nil)
        switch itemClass {
        case .genericPassword:
            put(Name.service, attributes.service)
            // Both names, so `secret-tool lookup ... account A` and keyring's `username` search
            // find the item.
            put(Name.account, attributes.account)
            put(Name.username, attributes.account)
        case .internetPassword:
            put(Name.server, attributes.server)
            put(Name.protocol, attributes.protocol.map(schemeName))
            put(Name.port, attributes.port)
            put(Name.object, attributes.path)
            put(Name.user, attributes.account)
            put(Name.authenticationType, attributes.authenticationType?.rawValue)
            put(Name.domain, attributes.securityDomain)
        case .key:
            put(Name.keyClass, attributes.keyClass?.rawValue)
            put(Name.keyType, attributes.keyType?.rawValue)
            put(Name.keySize, attributes.keySizeInBits)
            put(Name.effectiveKeySize, attributes.effectiveKeySize)
            put(Name.applicationTag, attributes.applicationTag)
            put(Name.applicationLabel, attributes.applicationLabel)
        case .certificate:
            put(Name.certificateType, attributes.certificateType)
            put(Name.subject, attributes.subject)
            put(Name.issuer, attributes.issuer)
            put(Name.serialNumber, attributes.serialNumber)
        }
        return result
    }

    /// The class of a stored item: Lockbox's own tag, else what the foreign attributes say
    /// (a `server` or the network schema is an internet password, a `service` a generic one).
    /// Items that are neither (another application's private items) are not Keychain items.
    static func itemClass(of stored: [String: String]) -> ItemClass? {
        if let tag = stored[Name.itemClass] { return ItemClass(rawValue: tag) }
        if stored[Name.schema] == networkSchemaName || stored[Name.server] != nil { return .internetPassword }
        if stored[Name.service] != nil { return .genericPassword }
        return nil
    }

    /// Decodes a stored item's attributes. `label` is the item's Secret Service label.
    static func decode(
        _ stored: [String: String], label: String?, created: Date?, modified: Date?
    ) -> (ItemClass, ItemAttributes)? {
        guard let itemClass = itemClass(of: stored) else { return nil }
        let isLockboxItem = stored[Name.itemClass] != nil
        func string(_ name: String) -> String? { stored[name] }
        func data(_ name: String) -> Data? { stored[name].flatMap { Data(base64Encoded: $0) } }
        func integer(_ name: String) -> Int? { stored[name].flatMap { Int($0) } }

        var attributes = ItemAttributes()
        // Foreign items always have a label worth showing; Lockbox's only when one was given.
        attributes.label = (!isLockboxItem || stored[Name.hasLabel] == "1") ? label : nil
        attributes.comment = string(Name.comment)
        attributes.itemDescription = string(Name.itemDescription)
        attributes.generic = data(Name.generic)
        attributes.accessGroup = string(Name.accessGroup)
        attributes.accessibility = string(Name.accessibility).flatMap(Accessibility.init(rawValue:))
        attributes.synchronizable = stored[Name.synchronizable] == "1" ? true : nil
        attributes.creationDate = created
        attributes.modificationDate = modified
        switch itemClass {
        case .genericPassword:
            attributes.service = string(Name.service)
            attributes.account = string(Name.account) ?? string(Name.username)
        case .internetPassword:
            attributes.server = string(Name.server)
            attributes.protocol = string(Name.protocol).map(InternetProtocol.init(name:))
            attributes.port = integer(Name.port)
            attributes.path = string(Name.object)
            attributes.account = string(Name.user)
            attributes.authenticationType = string(Name.authenticationType).map(AuthenticationType.init(rawValue:))
            attributes.securityDomain = string(Name.domain)
        case .key:
            attributes.keyClass = string(Name.keyClass).flatMap(KeyClass.init(rawValue:))
            attributes.keyType = string(Name.keyType).map(KeyType.init(rawValue:))
            attributes.keySizeInBits = integer(Name.keySize)
            attributes.effectiveKeySize = integer(Name.effectiveKeySize)
            attributes.applicationTag = data(Name.applicationTag)
            attributes.applicationLabel = data(Name.applicationLabel)
        case .certificate:
            attributes.certificateType = integer(Name.certificateType)
            attributes.subject = data(Name.subject)
            attributes.issuer = data(Name.issuer)
            attributes.serialNumber = data(Name.serialNumber)
        }
        return (itemClass, attributes)
    }

    /// The Secret Service searches whose union holds every item that can match `query`
    /// (the caller filters the union exactly). Only attributes that foreign items share are
    /// searched on; a generic-password account is searched as `account` and as `username`.
    static func searches(for itemClass: ItemClass, _ attributes: ItemAttributes) -> [[String: String]] {
        var base: [String: String] = [:]
        switch itemClass {
        case .genericPassword:
            if let service = attributes.service { base[Name.service] = service }
            guard let account = attributes.account else { return [base] }
            var byAccount = base
            byAccount[Name.account] = account
            var byUsername = base
            byUsername[Name.username] = account
            return [byAccount, byUsername]
        case .internetPassword:
            if let server = attributes.server { base[Name.server] = server }
            if let value = attributes.protocol { base[Name.protocol] = schemeName(value) }
            if let port = attributes.port { base[Name.port] = String(port) }
            if let path = attributes.path { base[Name.object] = path }
            if let account = attributes.account { base[Name.user] = account }
            return [base]
        case .key, .certificate:
            base[Name.itemClass] = itemClass.rawValue
            return [base]
        }
    }

    /// The label shown in Seahorse and `secret-tool search` when the item has none of its own.
    static func displayLabel(_ itemClass: ItemClass, _ attributes: ItemAttributes) -> String {
        if let label = attributes.label { return label }
        switch itemClass {
        case .genericPassword:
            return "\(attributes.service ?? "password") (\(attributes.account ?? "no account"))"
        case .internetPassword:
            let account = attributes.account.map { "\($0)@" } ?? ""
            return "\(account)\(attributes.server ?? "server")"
        case .key:
            return "Lockbox key"
        case .certificate:
            return "Lockbox certificate"
        }
    }
}
