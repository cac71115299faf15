import struct Foundation.Data

/// A Keychain item: its class, its attributes and (when asked for) its value.
public struct Item: Sendable, CustomStringConvertible {
    /// `kSecClass`: the item's class.
    public var itemClass: ItemClass
    /// The item's attributes; `accessibility`, `accessGroup` and the dates are filled in by the store.
    public var attributes: ItemAttributes
    /// `kSecValueData`. In results, present only when the query asked for data.
    public var data: SecretBytes?
    /// `kSecValuePersistentRef`: a stable reference to this item, set in results.
    public var persistentReference: Data?
    /// `kSecAttrAccessControl`: set at add time; every later read, update and delete must
    /// authenticate through the query's ``AuthenticationContext``.
    public var accessControl: AccessControl?

    /// An item of `itemClass` with `attributes` and, for writes, its secret `data`.
    public init(_ itemClass: ItemClass, attributes: ItemAttributes, data: SecretBytes? = nil) {
        self.itemClass = itemClass
        self.attributes = attributes
        self.data = data
    }

    /// A generic password: the most common item.
    public static func genericPassword(
        service: String, account: String, data: SecretBytes,
        accessibility: Accessibility? = nil, accessGroup: String? = nil, label: String? = nil
    ) -> Item {
        Item(
            .genericPassword,
            attributes: ItemAttributes(
                service: service, account: account, label: label,
                accessibility: accessibility, accessGroup: accessGroup),
            data: data)
    }

    /// The class and the attributes that are not secret; the data prints as `<redacted>`.
    public var description: String {
        "Item(\(itemClass.rawValue), service: \(attributes.service ?? attributes.server ?? "-"), "
            + "account: \(attributes.account ?? "-"), data: \(data == nil ? "none" : "<redacted>"))"
    }
}

/// Changes for ``ItemStore/update(matching:to:)``: the attributes that are set replace the
/// item's, and `data`, when set, replaces its value.
public struct ItemUpdate: Sendable {
    /// The attributes to change; `nil` ones are left as they are.
    public var attributes: ItemAttributes
    /// The new secret (`kSecValueData`); `nil` keeps the current one.
    public var data: SecretBytes?

    /// Changes to `attributes` and, optionally, new `data`.
    public init(attributes: ItemAttributes = ItemAttributes(), data: SecretBytes? = nil) {
        self.attributes = attributes
        self.data = data
    }
}
