import LockboxCore

/// The access groups the policy grants one identity (`BrokerPolicy.grant(for:)`).
public struct AccessGroupGrant: Sendable, Hashable {
    /// The identity's name (`PeerIdentity.name`).
    public let identityName: String
    /// The section that names the identity in the policy file (`[executable /usr/bin/app]`).
    public let policySection: String
    /// The groups it may use, the default first; empty when refused.
    public let accessGroups: [String]
    /// Where its items go when a query names no group; nil when refused.
    public var defaultAccessGroup: String? { accessGroups.first }
    /// True for the `lockbox` command, which a person uses: it reaches every group, but only
    /// after the passphrase is entered again (the broker asks; the reuse window applies).
    public let isLockboxCommand: Bool
    /// Why the peer gets no group at all (an executable that does not match its pinned
    /// SHA-256), in words that say what to do; nil otherwise.
    public let refusal: String?
    /// The policy file the grant came from, for messages.
    public let policyPath: String

    /// A grant of `accessGroups` (none when `refusal` is set).
    public init(
        identityName: String, policySection: String, accessGroups: [String], isLockboxCommand: Bool, refusal: String?, policyPath: String
    ) {
        self.identityName = identityName
        self.policySection = policySection
        self.accessGroups = refusal == nil ? accessGroups : []
        self.isLockboxCommand = refusal == nil && isLockboxCommand
        self.refusal = refusal
        self.policyPath = policyPath
    }

    /// Whether `group` may be used. The `lockbox` command reaches every group once
    /// `passphraseReentered` is true (the broker verified it within the reuse window).
    public func allows(_ group: String, passphraseReentered: Bool = false) -> Bool {
        if refusal != nil { return false }
        if isLockboxCommand && passphraseReentered { return true }
        return accessGroups.contains(group)
    }

    /// Throws unless `group` may be used.
    ///
    /// ```swift
    /// let grant = policy.grant(for: try PeerIdentity.identify(socket: connection))
    /// try grant.check(group: query.accessGroup ?? grant.defaultAccessGroup ?? "")
    /// ```
    /// - Throws: `missingEntitlement` (-34018), with what to add to the policy file (or, for the
    ///   `lockbox` command, that the passphrase must be entered again).
    public func check(group: String, passphraseReentered: Bool = false) throws(LockboxError) {
        if allows(group, passphraseReentered: passphraseReentered) { return }
        if let refusal {
            throw LockboxError(.missingEntitlement, refusal)
        }
        if isLockboxCommand {
            throw LockboxError(
                .missingEntitlement,
                "lockbox reaches the access group \"\(group)\" only after the keychain's passphrase is entered again.")
        }
        let file = policyPath.isEmpty ? "$XDG_CONFIG_HOME/lockbox/\(BrokerPolicy.fileName)" : policyPath
        throw LockboxError(
            .missingEntitlement,
            "\(identityName) may not use the access group \"\(group)\" (it holds: \(accessGroups.joined(separator: ", "))). "
                + "To allow it, add the group to its section in \(file): \(policySection) then access-groups = \(group)")
    }
}
