import struct Foundation.Data
import struct Foundation.Date
import LockboxCore

/// How Keychain items map onto Secret Service items: the attribute names, the `xdg:schema`
/// per class, and the searches that find an item Lockbox wrote as well as the same kind of
/// item written by `secret-tool`, Python `keyring` or git's libsecret helper.
///
/// The attributes' names are rows of ``ItemAttributes/fields``; docs/SECRET-SERVICE.md lists them
/// for other tools' users, and a test checks that it names every one.
enum SecretServiceSchema {
    /// libsecret's generic schema: what `secret-tool store` writes.
    static let genericSchemaName = "org.freedesktop.Secret.Generic"
    /// The network-password schema that git-credential-libsecret reads and writes.
    static let networkSchemaName = "org.gnome.keyring.NetworkPassword"
    /// Keys and certificates, which no other tool shares.
    static let lockboxSchemaName = "io.lockbox.Item"

    /// Names that are not item attributes: the schema, Lockbox's class tag and label marker,
    /// and the foreign names classification looks at. The attributes' own names are in
    /// ``ItemAttributes/fields``.
    enum Name {
        static let schema = "xdg:schema"
        static let itemClass = "lockbox:class"
        static let hasLabel = "lockbox:has-label"
        static let service = ItemAttributes.field(\.service).secretService.names(for: .genericPassword)[0]
        static let server = ItemAttributes.field(\.server).secretService.names(for: .internetPassword)[0]
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

    /// The Secret Service attributes that describe `attributes` of an item of `itemClass`:
    /// every row of ``ItemAttributes/fields`` that the class stores as attributes.
    static func encode(_ itemClass: ItemClass, _ attributes: ItemAttributes) -> [String: String] {
        var result: [String: String] = [
            Name.schema: schemaName(for: itemClass),
            Name.itemClass: itemClass.rawValue,
        ]
        for field in ItemAttributes.fields {
            switch field.secretService {
            case .itemLabel:
                // The label is the item's own; the marker says that Lockbox was given one.
                if field.isSet(in: attributes) { result[Name.hasLabel] = "1" }
            case .itemCreated, .itemModified:
                break
            case .perClass:
                let names = field.secretService.names(for: itemClass)
                guard !names.isEmpty, let value = field.value(in: attributes), let text = text(value, kind: field.kind) else { continue }
                for name in names { result[name] = text }
            }
        }
        return result
    }

    /// An attribute value as Secret Service text: raw values and strings as they are (protocols
    /// by their URL scheme names, as other tools store them), bytes in base64, integers in
    /// decimal, a flag only when it is set.
    static func text(_ value: AttributeValue, kind: AttributeKind) -> String? {
        switch value {
        case .text(let text): kind == .internetProtocol ? schemeName(InternetProtocol(rawValue: text)) : text
        case .bytes(let bytes): bytes.base64EncodedString()
        case .integer(let integer): String(integer)
        case .flag(let flag): flag ? "1" : nil
        case .date: nil
        }
    }

    /// Reads what ``text(_:kind:)`` wrote, and other tools' protocol names.
    static func value(_ text: String, kind: AttributeKind) -> AttributeValue? {
        switch kind {
        case .text, .accessibility, .authenticationType, .keyClass, .keyType: .text(text)
        case .internetProtocol: .text(InternetProtocol(name: text).rawValue)
        case .bytes: Data(base64Encoded: text).map(AttributeValue.bytes)
        case .integer: Int(text).map(AttributeValue.integer)
        case .flag: text == "1" ? .flag(true) : nil
        case .date: nil
        }
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
        var attributes = ItemAttributes()
        for field in ItemAttributes.fields {
            let value: AttributeValue?
            switch field.secretService {
            // Foreign items always have a label worth showing; Lockbox's only when one was given.
            case .itemLabel: value = (!isLockboxItem || stored[Name.hasLabel] == "1") ? label.map(AttributeValue.text) : nil
            case .itemCreated: value = created.map(AttributeValue.date)
            case .itemModified: value = modified.map(AttributeValue.date)
            case .perClass:
                // The first name that is present: a generic password's `account`, else keyring's `username`.
                value = field.secretService.names(for: itemClass).lazy.compactMap { stored[$0] }.first
                    .flatMap { Self.value($0, kind: field.kind) }
            }
            // A value of no known case (an accessibility class from a later version) is left out.
            field.set(value, in: &attributes)
        }
        return (itemClass, attributes)
    }

    /// The Secret Service searches whose union holds every item that can match `query`
    /// (the caller filters the union exactly). Only attributes that foreign items share are
    /// searched on; a generic-password account is searched as `account` and as `username`.
    static func searches(for itemClass: ItemClass, _ attributes: ItemAttributes) -> [[String: String]] {
        // Keys and certificates are Lockbox's own: its class tag finds them.
        guard schemaName(for: itemClass) != lockboxSchemaName else { return [[Name.itemClass: itemClass.rawValue]] }
        var searches: [[String: String]] = [[:]]
        for field in ItemAttributes.fields {
            guard case .perClass(_, searched: true) = field.secretService, let value = field.value(in: attributes),
                let text = text(value, kind: field.kind)
            else { continue }
            // An attribute written under several names is searched under each, one search apiece.
            let names = field.secretService.names(for: itemClass)
            guard !names.isEmpty else { continue }
            searches = searches.flatMap { search in
                names.map { name in search.merging([name: text]) { _, new in new } }
            }
        }
        return searches
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
