import LockboxCore

/// Which access groups each identity may use through the broker: the user's
/// `keychain-access-groups` entitlements, in `$XDG_CONFIG_HOME/lockbox/broker.conf`.
public struct BrokerPolicy: Sendable, Hashable {
    /// One application's entry.
    public struct Entry: Sendable, Hashable {
        /// The identity the entry applies to.
        public var identity: PeerIdentity.Kind
        /// The groups it may use, in the file's order (the first is its default); its own
        /// name's group is always added after them.
        public var accessGroups: [String]
        /// The executed file's SHA-256 the process must have (lower-case hexadecimal), if pinned.
        public var executableSHA256: String?

        public init(identity: PeerIdentity.Kind, accessGroups: [String], executableSHA256: String? = nil) {
            self.identity = identity
            self.accessGroups = accessGroups
            self.executableSHA256 = executableSHA256
        }
    }

    /// The policy file's name inside its directory.
    public static let fileName = "broker.conf"

    /// The entries, at most one per identity.
    public var entries: [Entry]
    /// The executables that are the `lockbox` command.
    public var lockboxExecutables: [String]
    /// Where the policy was read from (for messages).
    public var path: String

    public init(entries: [Entry] = [], lockboxExecutables: [String] = [], path: String = "") {
        self.entries = entries
        self.lockboxExecutables = lockboxExecutables
        self.path = path
    }

    /// `$XDG_CONFIG_HOME/lockbox` (`~/.config/lockbox`).
    public static var defaultDirectory: String {
        let config = ProcessEnvironment.nonEmpty("XDG_CONFIG_HOME").flatMap { $0.hasPrefix("/") ? $0 : nil }
            ?? ProcessEnvironment.home + "/.config"
        return config + "/lockbox"
    }

    /// Reads the policy in `directory` (an absent file or directory is the empty policy).
    /// - Throws: `authFailed` when the directory or file is not the user's own, is writable by
    ///   others, or is a symbolic link; `param` when the file is malformed; `io` when it cannot
    ///   be read.
    public static func load(directory: String = defaultDirectory) throws(LockboxError) -> BrokerPolicy {
        throw LockboxError(.unimplemented, "The broker policy is not built yet.")
    }

    /// True when an entry pins an executable's SHA-256: identify peers with `hashExecutable`.
    public var pinsExecutableHashes: Bool { entries.contains { $0.executableSHA256 != nil } }

    /// The groups `identity` may use.
    public func grant(for identity: PeerIdentity) -> AccessGroupGrant {
        AccessGroupGrant(identityName: identity.name, accessGroups: [identity.name], isLockboxCommand: false, refusal: nil, policyPath: path)
    }
}
