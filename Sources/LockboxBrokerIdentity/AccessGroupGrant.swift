import LockboxCore

/// The access groups the policy grants one identity.
public struct AccessGroupGrant: Sendable, Hashable {
    /// The identity's name (`PeerIdentity.name`).
    public let identityName: String
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

    /// A grant of `accessGroups`.
    public init(identityName: String, accessGroups: [String], isLockboxCommand: Bool, refusal: String?, policyPath: String) {
        self.identityName = identityName
        self.accessGroups = refusal == nil ? accessGroups : []
        self.isLockboxCommand = isLockboxCommand
        self.refusal = refusal
        self.policyPath = policyPath
    }

    /// Whether `group` may be used. The `lockbox` command passes for every group once
    /// `passphraseReentered` is true.
    public func allows(_ group: String, passphraseReentered: Bool = false) -> Bool {
        if refusal != nil { return false }
        if isLockboxCommand && passphraseReentered { return true }
        return accessGroups.contains(group)
    }

    /// Throws unless `group` may be used.
    /// - Throws: `missingEntitlement` (-34018), with the policy line that would grant it.
    public func check(group: String, passphraseReentered: Bool = false) throws(LockboxError) {
        throw LockboxError(.unimplemented, "Access group checks are not built yet.")
    }
}
