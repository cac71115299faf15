import LockboxCore
import LockboxVault
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// The access groups one connection's peer may use, as the `keychain-access-groups`
/// entitlement gives an iOS app.
package struct BrokerGrant: Sendable, Hashable {
    /// The peer as a person reads it (an executable path, an app id): for messages, never a secret.
    package var peerName: String
    /// The groups the peer may use; nil for every group.
    package var accessGroups: [String]?
    /// Where the peer's items go when it names no group.
    package var defaultAccessGroup: String
    /// The `lockbox` command, which a person uses: once the passphrase is entered again on its
    /// connection (an `unlock` with the passphrase), it reaches every group.
    package var reachesEveryGroupWithPassphrase = false
    /// How the policy gives this peer its grant again as it reads now (nil: a policy that never
    /// changes): the broker asks before each request, so that a grant removed from the policy
    /// is gone from connections already open too, not only from new ones.
    package var renewal: BrokerGrantRenewal?

    package init(
        peerName: String, accessGroups: [String]?, defaultAccessGroup: String, reachesEveryGroupWithPassphrase: Bool = false,
        renewal: BrokerGrantRenewal? = nil
    ) {
        self.peerName = peerName
        self.accessGroups = accessGroups
        self.defaultAccessGroup = defaultAccessGroup
        self.reachesEveryGroupWithPassphrase = reachesEveryGroupWithPassphrase
        self.renewal = renewal
    }

    /// Whether the peer may use `group`.
    package func allows(_ group: String) -> Bool {
        accessGroups.map { $0.contains(group) } ?? true
    }

    /// The error for a group the peer does not hold.
    package func missing(_ group: String) -> LockboxError {
        LockboxError(
            .missingEntitlement,
            "\(peerName) may not use the access group \(group). Grant it in the broker's policy "
                + "($XDG_CONFIG_HOME/lockbox/), as an application's keychain-access-groups entitlement does.")
    }
}

/// A policy's way to give one peer its grant again (its identity kept, the policy read anew):
/// the same grant while the policy is unchanged, the policy's new answer once it changed, an
/// error once the peer is refused.
package final class BrokerGrantRenewal: Sendable, Hashable {
    private let body: @Sendable () throws(LockboxError) -> BrokerGrant

    package init(_ body: @escaping @Sendable () throws(LockboxError) -> BrokerGrant) {
        self.body = body
    }

    package func grant() throws(LockboxError) -> BrokerGrant { try body() }

    package static func == (left: BrokerGrantRenewal, right: BrokerGrantRenewal) -> Bool { left === right }
    package func hash(into hasher: inout Hasher) { hasher.combine(ObjectIdentifier(self)) }
}

/// Decides, per connection, which access groups its peer may use. `lockboxd` asks it once per
/// connection, before the first request.
package protocol BrokerAccessPolicy: Sendable {
    /// The grant of the peer connected on `socket` (a connected Unix socket).
    /// - Throws: `errSecMissingEntitlement` or `errSecAuthFailed` for a peer that is refused
    ///   altogether (another user).
    func grant(forPeerOn socket: Int32) throws(LockboxError) -> BrokerGrant
}

/// Every process of this user reaches every group: the embedded mode's rule, kept behind the
/// broker for a policy that wants no walls.
package struct SameUserAccessPolicy: BrokerAccessPolicy {
    package init() {}

    package func grant(forPeerOn socket: Int32) throws(LockboxError) -> BrokerGrant {
        let credentials = try PeerProcess.credentials(of: socket)
        return BrokerGrant(peerName: "pid \(credentials.pid)", accessGroups: nil, defaultAccessGroup: "default")
    }
}

/// What the kernel says of a connected peer.
package enum PeerProcess {
    /// The peer's credentials from `SO_PEERCRED`.
    /// - Throws: `errSecAuthFailed` when the peer runs as another user.
    package static func credentials(of socket: Int32) throws(LockboxError) -> PeerCredentials {
        let credentials = try UnixSocket.peerCredentials(socket)
        guard credentials.uid == geteuid() else {
            throw LockboxError(
                .authFailed,
                "A process of uid \(credentials.uid) connected to this user's lockboxd; only the user's own processes are served.")
        }
        return credentials
    }
}

extension UnixSocket {
    static func peerCredentials(_ descriptor: Int32) throws(LockboxError) -> PeerCredentials {
        // struct ucred: pid, uid, gid (Glibc declares it only under _GNU_SOURCE).
        var fields: (Int32, UInt32, UInt32) = (0, 0, 0)
        var length = socklen_t(MemoryLayout<(Int32, UInt32, UInt32)>.size)
        _ = try SystemCall.check("getsockopt", "Reading the peer's credentials (SO_PEERCRED)") {
            getsockopt(descriptor, SOL_SOCKET, SO_PEERCRED, &fields, &length)
        }
        return PeerCredentials(pid: fields.0, uid: fields.1, gid: fields.2)
    }
}

/// A connected peer's credentials as the kernel recorded them at `connect` (`SO_PEERCRED`).
package struct PeerCredentials: Sendable, Hashable {
    package var pid: pid_t
    package var uid: uid_t
    package var gid: gid_t
}

/// What one connection holds: its peer's grant, and the verification its user gave (the
/// passphrase, asked by the client and checked here) for the reuse window the client's
/// ``AuthenticationContext`` asked, at most ``longestReuse``.
package struct BrokerSession: Sendable {
    /// `LATouchIDAuthenticationMaximumAllowableReuseDuration`: five minutes.
    package static let longestReuse: Duration = .seconds(300)

    /// The grant the policy gives the peer: as it connected, then as renewed before each request.
    package private(set) var grant: BrokerGrant
    private let clock: any LockboxClock
    /// The `lockbox` command's wider grant after the passphrase: until this reading of the
    /// clock, or for the connection's life (`.zero` window).
    private var everyGroup: Widening?
    /// The verification for access-controlled items: until a reading of the clock, or for the
    /// one request it came with.
    private var presence: (verified: Vault.VerifiedPresence, until: Duration?)?

    private enum Widening {
        case connection
        case until(Duration)
    }

    package init(grant: BrokerGrant, clock: any LockboxClock = SystemClock()) {
        self.grant = grant
        self.clock = clock
    }

    /// The grant in force now: every group for the `lockbox` command within its window.
    package var currentGrant: BrokerGrant {
        guard grant.reachesEveryGroupWithPassphrase, let everyGroup else { return grant }
        if case .until(let end) = everyGroup, clock.uptime() > end { return grant }
        var wider = grant
        wider.accessGroups = nil
        return wider
    }

    /// Asks the policy for the peer's grant as it reads now (when the policy can change).
    /// - Throws: `errSecMissingEntitlement` once the policy refuses the peer.
    package mutating func renewGrant() throws(LockboxError) {
        guard let renewal = grant.renewal else { return }
        grant = try renewal.grant()
    }

    /// Whether the `lockbox` command's passphrase has widened its grant, now.
    package var isWidened: Bool { currentGrant.accessGroups == nil && grant.accessGroups != nil }

    /// The `lockbox` command entered the passphrase: every group for `reuse` (zero: for the
    /// rest of this connection, which a command's run is).
    mutating func widen(for reuse: Duration) {
        everyGroup = reuse == .zero ? .connection : .until(clock.uptime() + reuse)
    }

    /// Keeps a verification for `reuse` (zero: the request it came with only).
    mutating func remember(_ verified: Vault.VerifiedPresence, for reuse: Duration) {
        presence = (verified, reuse == .zero ? nil : clock.uptime() + reuse)
    }

    /// A request was answered: a verification for one request is spent.
    mutating func requestAnswered() {
        if let current = presence, current.until == nil { presence = nil }
    }

    /// The context a request runs with: the kept verification while it holds, and otherwise a
    /// verifier that notes what the item asked for (the broker has no one to ask).
    func context(_ recorder: PresenceRecorder) -> AuthenticationContext {
        let context = AuthenticationContext(verifier: recorder, reuseDuration: Self.longestReuse, interactionNotAllowed: false, clock: clock)
        if let (verified, until) = presence, until.map({ clock.uptime() <= $0 }) ?? true {
            context.remember(verified.secretKey, realm: verified.realm)
        }
        return context
    }
}

/// The broker's stand-in for a user: it asks no one, and notes what an access-controlled item
/// asked for, so that the reply can ask the client to ask its user.
final class PresenceRecorder: PresenceVerifier {
    private let asked = Mutex<AuthenticationRequest?>(nil)

    var request: AuthenticationRequest? { asked.withLock { $0 } }

    func passphrase(for request: AuthenticationRequest) throws(LockboxError) -> SecretBytes {
        asked.withLock { $0 = request }
        throw LockboxError(
            .interactionNotAllowed,
            "This item needs the user's passphrase (access control \(request.accessControl)), and the program gave none: "
                + "the broker asks no one itself. Give the query an AuthenticationContext with a verifier.")
    }
}
