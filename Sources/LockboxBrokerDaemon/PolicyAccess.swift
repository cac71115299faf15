import Lockbox
import LockboxBroker
import LockboxBrokerIdentity

/// The user's policy (`$XDG_CONFIG_HOME/lockbox/broker.conf`, re-read when it changes) as the
/// broker's access policy: the peer is identified (Flatpak app, systemd unit, executable) and
/// given the groups its entry grants, or a group of its own named after it.
struct PolicyAccess: BrokerAccessPolicy {
    let watcher: BrokerPolicyWatcher

    func grant(forPeerOn socket: Int32) throws(LockboxError) -> BrokerGrant {
        // Another user first, with the broker's own message, before anything of it is read.
        _ = try PeerProcess.credentials(of: socket)
        let policy = try watcher.current()
        let identity = try PeerIdentity.identify(socket: socket, hashExecutable: policy.pinsExecutableHashes)
        return try Self.grant(for: identity, policy: policy, watcher: watcher)
    }

    /// The grant `policy` gives `identity`, renewed from the policy as the watcher reads it
    /// then (the identity is the one the connection was made with; a pin added to the policy
    /// later applies to connections made afterwards).
    static func grant(for identity: PeerIdentity, policy: BrokerPolicy, watcher: BrokerPolicyWatcher) throws(LockboxError) -> BrokerGrant {
        let grant = policy.grant(for: identity)
        if let refusal = grant.refusal { throw LockboxError(.missingEntitlement, refusal) }
        return BrokerGrant(
            peerName: identity.name, accessGroups: grant.accessGroups,
            defaultAccessGroup: grant.defaultAccessGroup ?? identity.name,
            reachesEveryGroupWithPassphrase: grant.isLockboxCommand,
            renewal: BrokerGrantRenewal { () throws(LockboxError) -> BrokerGrant in
                try Self.grant(for: identity, policy: try watcher.current(), watcher: watcher)
            })
    }
}
