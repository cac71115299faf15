import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// `SecAccessControl` flags: what the user must do before an item's key is released.
///
/// On Linux, `userPresence` and `devicePasscode` both mean "re-enter the keychain passphrase";
/// `.or` and `.and` of them therefore ask once. There is no biometric hardware the keychain can
/// trust, so the biometry flags are accepted and never satisfied: reading such an item fails
/// with `errSecAuthFailed`, as on a device without biometry.
public struct AccessControl: Sendable, Hashable, CustomStringConvertible {
    /// The constraints of an access-control object (`SecAccessControlCreateFlags`).
    public struct Flags: OptionSet, Sendable, Hashable {
        /// The flags as a bit set.
        public let rawValue: Int
        /// Flags from their bit set.
        public init(rawValue: Int) { self.rawValue = rawValue }

        /// `kSecAccessControlUserPresence`: any authentication the user can give.
        public static let userPresence = Flags(rawValue: 1 << 0)
        /// `kSecAccessControlDevicePasscode`: the passphrase.
        public static let devicePasscode = Flags(rawValue: 1 << 1)
        /// `kSecAccessControlBiometryAny`.
        public static let biometryAny = Flags(rawValue: 1 << 2)
        /// `kSecAccessControlBiometryCurrentSet`.
        public static let biometryCurrentSet = Flags(rawValue: 1 << 3)
        /// `kSecAccessControlOr`: any one of the constraints.
        public static let or = Flags(rawValue: 1 << 14)
        /// `kSecAccessControlAnd`: all of the constraints.
        public static let and = Flags(rawValue: 1 << 15)
    }

    /// What the user must do to use the item.
    public var flags: Flags

    /// Access control with `flags`.
    public init(_ flags: Flags) {
        self.flags = flags
    }

    /// Any authentication the user can give (here: the vault passphrase), as
    /// `kSecAccessControlUserPresence`.
    public static let userPresence = AccessControl(.userPresence)
    /// The device passcode (here: the vault passphrase), as `kSecAccessControlDevicePasscode`.
    public static let devicePasscode = AccessControl(.devicePasscode)

    /// True when the constraints can be met here: a passphrase satisfies them, biometry cannot.
    public var isSatisfiableByPassphrase: Bool {
        let passphrase = !flags.isDisjoint(with: [.userPresence, .devicePasscode])
        let biometry = !flags.isDisjoint(with: [.biometryAny, .biometryCurrentSet])
        if flags.contains(.and) { return !biometry && passphrase }
        return passphrase
    }

    /// A stable text form for storage: `userPresence`, `devicePasscode|biometryAny|or`.
    public var description: String {
        var names: [String] = []
        if flags.contains(.userPresence) { names.append("userPresence") }
        if flags.contains(.devicePasscode) { names.append("devicePasscode") }
        if flags.contains(.biometryAny) { names.append("biometryAny") }
        if flags.contains(.biometryCurrentSet) { names.append("biometryCurrentSet") }
        if flags.contains(.or) { names.append("or") }
        if flags.contains(.and) { names.append("and") }
        return names.joined(separator: "|")
    }

    /// Parses ``description``'s form (and the CLI's `--access-control` values).
    public init?(parsing text: String) {
        var flags: Flags = []
        for name in text.split(separator: "|") {
            switch name {
            case "userPresence": flags.insert(.userPresence)
            case "devicePasscode": flags.insert(.devicePasscode)
            case "biometryAny": flags.insert(.biometryAny)
            case "biometryCurrentSet": flags.insert(.biometryCurrentSet)
            case "or": flags.insert(.or)
            case "and": flags.insert(.and)
            default: return nil
            }
        }
        guard !flags.isEmpty else { return nil }
        self.flags = flags
    }
}

/// What a verifier is asked to confirm.
public struct AuthenticationRequest: Sendable {
    /// Why the keychain asks ("read api.example.com for alice").
    public var reason: String
    /// The access control of the item being read.
    public var accessControl: AccessControl

    /// A request shown to the user: why, and for which access control.
    public init(reason: String, accessControl: AccessControl) {
        self.reason = reason
        self.accessControl = accessControl
    }
}

/// Obtains the user's proof of presence: on Linux, the keychain passphrase re-entered.
///
/// The proof is not a yes/no answer: the keychain derives the key that unwraps the item from
/// it, so a verifier cannot be skipped or faked. Throw `LockboxError(.userCanceled, ...)` when
/// the user cancels.
public protocol PresenceVerifier: Sendable {
    /// Asks the user for the vault passphrase.
    ///
    /// - Parameter request: Why the passphrase is needed, to show the user.
    /// - Returns: The passphrase the user entered.
    /// - Throws: `errSecUserCanceled` when the user cancels; `errSecInteractionNotAllowed` when no
    ///   one can be asked.
    func passphrase(for request: AuthenticationRequest) throws(LockboxError) -> SecretBytes
}

/// `LAContext` for Lockbox: how reads of access-controlled items authenticate.
///
/// ```swift
/// let context = AuthenticationContext(verifier: MyPassphraseDialog(), reuseDuration: .seconds(30))
/// var query = Query.genericPassword(service: "bank", account: "alice")
/// query.authenticationContext = context
/// ```
public final class AuthenticationContext: Sendable {
    /// Asks the user; nil means no interaction is possible.
    public let verifier: (any PresenceVerifier)?
    /// How long a successful verification is reused (`touchIDAuthenticationAllowableReuseDuration`).
    /// Default zero: every access asks.
    public let reuseDuration: Duration
    /// `interactionNotAllowed`: fail with `errSecInteractionNotAllowed` instead of asking.
    public let interactionNotAllowed: Bool
    /// Measures the reuse window.
    package let clock: any LockboxClock

    private let remembered = Mutex<[String: (proof: SecretBytes, at: Duration)]>([:])
    /// The context whose verifications this one reuses (see ``withoutInteraction()``).
    private let base: AuthenticationContext?
    /// What the user is told they approve (`LAContext.localizedReason`); nil: the item's
    /// class and name, as the vault words it.
    package let reason: String?

    /// A context that asks `verifier` and reuses a verification for `reuseDuration`.
    ///
    /// - Parameters:
    ///   - verifier: Asks the user; nil when no interaction is possible.
    ///   - reuseDuration: How long a successful verification spares the next prompt; zero
    ///     (the default) asks on every access.
    ///   - interactionNotAllowed: Fail with `errSecInteractionNotAllowed` instead of asking.
    public convenience init(
        verifier: (any PresenceVerifier)? = nil, reuseDuration: Duration = .zero, interactionNotAllowed: Bool = false
    ) {
        self.init(verifier: verifier, reuseDuration: reuseDuration, interactionNotAllowed: interactionNotAllowed, clock: SystemClock())
    }

    /// The same, with the reuse window measured in seconds as a `Double`.
    @available(*, deprecated, message: "Pass the reuse window as a Duration, e.g. .seconds(30).")
    public convenience init(verifier: (any PresenceVerifier)? = nil, reuseDuration seconds: Double, interactionNotAllowed: Bool = false) {
        self.init(verifier: verifier, reuseDuration: .milliseconds(Int64((seconds * 1000).rounded())), interactionNotAllowed: interactionNotAllowed)
    }

    /// A context whose reuse window is measured with `clock`.
    package init(verifier: (any PresenceVerifier)?, reuseDuration: Duration, interactionNotAllowed: Bool, clock: any LockboxClock) {
        self.verifier = verifier
        self.reuseDuration = reuseDuration
        self.interactionNotAllowed = interactionNotAllowed
        self.clock = clock
        base = nil
        reason = nil
    }

    private init(sharing base: AuthenticationContext, asking verifier: (any PresenceVerifier)?, reason: String?) {
        self.verifier = verifier
        reuseDuration = base.reuseDuration
        interactionNotAllowed = verifier == nil || base.interactionNotAllowed
        clock = base.clock
        self.base = base
        self.reason = reason
    }

    /// This context, saying `reason` when it asks the user (what is to be done with which
    /// item: "sign with the SSH key laptop (SHA256:...)"); its verifications are this
    /// context's, reused within the same window.
    package func asking(because reason: String) -> AuthenticationContext {
        AuthenticationContext(sharing: base ?? self, asking: verifier, reason: reason)
    }

    /// This context's verifications, still reused within their window, with no new question
    /// asked (`kSecUseAuthenticationUIFail` with an evaluated `LAContext`).
    package func withoutInteraction() -> AuthenticationContext {
        AuthenticationContext(sharing: base ?? self, asking: nil, reason: nil)
    }

    /// Forgets every remembered verification (`LAContext.invalidate()`).
    public func invalidate() {
        remembered.withLock { $0.removeAll() }
    }

    /// A proof remembered for `realm` within the reuse window.
    package func rememberedProof(realm: String) -> SecretBytes? {
        if let base { return base.rememberedProof(realm: realm) }
        guard reuseDuration > .zero else { return nil }
        let now = clock.uptime()
        return remembered.withLock { entries in
            guard let entry = entries[realm] else { return nil }
            guard now - entry.at <= reuseDuration else {
                entries[realm] = nil
                return nil
            }
            return entry.proof
        }
    }

    package func remember(_ proof: SecretBytes, realm: String) {
        if let base { return base.remember(proof, realm: realm) }
        guard reuseDuration > .zero else { return }
        let now = clock.uptime()
        remembered.withLock { $0[realm] = (proof, now) }
    }
}
