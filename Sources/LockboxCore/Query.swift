import struct Foundation.Data

/// What to look for, as a SecItem query dictionary says it.
///
/// ```swift
/// var query = Query(.genericPassword)
/// query.attributes.service = "api.example.com"
/// query.attributes.account = "alice"
/// let token = try store.data(matching: query)
/// ```
public struct Query: Sendable {
    /// `kSecClass`. Required, as on Apple platforms.
    public var itemClass: ItemClass
    /// The attributes an item must have; `nil` ones match anything. `synchronizable` here is
    /// ignored: use ``synchronizable``.
    public var attributes: ItemAttributes
    /// `kSecAttrSynchronizable` in a query: absent matches only non-synchronizable items.
    public var synchronizable: SynchronizableMatch
    /// `kSecMatchLimit`.
    public var limit: MatchLimit
    /// `kSecReturnData` / `kSecReturnAttributes`.
    public var returning: ReturnOptions
    /// `kSecValuePersistentRef` as a match: the one item with this reference.
    public var persistentReference: Data?
    /// `kSecUseAuthenticationContext`: how access-controlled items authenticate. Nil uses the
    /// store's default (the vault's configured verifier, if any).
    public var authenticationContext: AuthenticationContext?

    /// A query for items of `itemClass` with `attributes`; by default one match, its attributes,
    /// and only items that are not synchronizable.
    public init(
        _ itemClass: ItemClass, attributes: ItemAttributes = ItemAttributes(),
        limit: MatchLimit = .one, returning: ReturnOptions = .attributes,
        synchronizable: SynchronizableMatch = .notSynchronizable
    ) {
        self.itemClass = itemClass
        self.attributes = attributes
        self.limit = limit
        self.returning = returning
        self.synchronizable = synchronizable
    }

    /// The common generic-password lookup.
    public static func genericPassword(
        service: String? = nil, account: String? = nil, accessGroup: String? = nil
    ) -> Query {
        Query(.genericPassword, attributes: ItemAttributes(service: service, account: account, accessGroup: accessGroup))
    }

    /// `kSecMatchLimit`.
    public enum MatchLimit: Sendable, Hashable {
        /// `kSecMatchLimitOne`: the first match.
        case one
        /// `kSecMatchLimitAll`: every match.
        case all
    }

    /// How a query treats `kSecAttrSynchronizable`.
    public enum SynchronizableMatch: Sendable, Hashable {
        /// Only items that are not synchronizable (`kSecAttrSynchronizable` absent from the
        /// query, or false). The default.
        case notSynchronizable
        /// Only synchronizable items (`kSecAttrSynchronizable` true).
        case synchronizable
        /// Both (`kSecAttrSynchronizableAny`).
        case any

        /// The earlier name of ``notSynchronizable``.
        @available(*, deprecated, renamed: "notSynchronizable")
        public static var no: Self { .notSynchronizable }
        /// The earlier name of ``synchronizable``.
        @available(*, deprecated, renamed: "synchronizable")
        public static var yes: Self { .synchronizable }

        /// Whether an item whose `synchronizable` attribute is `value` (nil: absent) matches.
        public func matches(_ value: Bool?) -> Bool {
            switch self {
            case .notSynchronizable: value != true
            case .synchronizable: value == true
            case .any: true
            }
        }
    }

    /// What to return for each match.
    public struct ReturnOptions: OptionSet, Sendable, Hashable {
        /// The options as a bit set.
        public let rawValue: Int
        /// Options from their bit set.
        public init(rawValue: Int) { self.rawValue = rawValue }

        /// `kSecReturnData`: the secret.
        public static let data = ReturnOptions(rawValue: 1)
        /// `kSecReturnAttributes`: the attributes.
        public static let attributes = ReturnOptions(rawValue: 2)
        /// `kSecReturnPersistentRef`: a reference that finds the item again.
        public static let persistentReference = ReturnOptions(rawValue: 4)
    }
}
