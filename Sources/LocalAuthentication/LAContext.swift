#if !canImport(Darwin)
import Foundation
import KeychainCompatibility
import Lockbox
import Synchronization

/// What ``LAContext/evaluatePolicy(_:localizedReason:reply:)`` asks of the user.
public enum LAPolicy: Int, Sendable {
    /// Biometry. Linux has none: always ``LAError/Code/biometryNotAvailable``.
    case deviceOwnerAuthenticationWithBiometrics = 1
    /// Biometry or the device passcode; on Linux, the keychain passphrase.
    case deviceOwnerAuthentication = 2
    /// A paired watch. Linux has none.
    case deviceOwnerAuthenticationWithWatch = 3
    /// Biometry or a watch. Linux has neither.
    case deviceOwnerAuthenticationWithBiometricsOrWatch = 4
}

/// The biometry a device has: none on Linux.
public enum LABiometryType: Int, Sendable {
    case none = 0
    case touchID = 1
    case faceID = 2
    case opticID = 4
}

/// The domain of ``LAError``.
public let LAErrorDomain = "com.apple.LocalAuthentication"

/// The longest ``LAContext/touchIDAuthenticationAllowableReuseDuration`` Apple allows (5 minutes).
public let LATouchIDAuthenticationMaximumAllowableReuseDuration: TimeInterval = 300

/// An error from ``LAContext``, with Apple's codes.
///
/// ```swift
/// } catch let error as LAError where error.code == .biometryNotAvailable { ... }
/// ```
public struct LAError: Error, Hashable, Sendable, CustomNSError, LocalizedError {
    public enum Code: Int, Sendable {
        case authenticationFailed = -1
        case userCancel = -2
        case userFallback = -3
        case systemCancel = -4
        case passcodeNotSet = -5
        case biometryNotAvailable = -6
        case biometryNotEnrolled = -7
        case biometryLockout = -8
        case appCancel = -9
        case invalidContext = -10
        case notInteractive = -1004
        @available(*, deprecated, renamed: "biometryNotAvailable")
        public static let touchIDNotAvailable = Code.biometryNotAvailable
    }

    public let code: Code
    /// What happened, for people.
    public let message: String

    public init(_ code: Code, message: String = "") {
        self.code = code
        self.message = message
    }

    public static let authenticationFailed = Code.authenticationFailed
    public static let userCancel = Code.userCancel
    public static let userFallback = Code.userFallback
    public static let systemCancel = Code.systemCancel
    public static let passcodeNotSet = Code.passcodeNotSet
    public static let biometryNotAvailable = Code.biometryNotAvailable
    public static let biometryNotEnrolled = Code.biometryNotEnrolled
    public static let biometryLockout = Code.biometryLockout
    public static let appCancel = Code.appCancel
    public static let invalidContext = Code.invalidContext
    public static let notInteractive = Code.notInteractive

    public static var errorDomain: String { LAErrorDomain }
    public var errorCode: Int { code.rawValue }
    public var errorUserInfo: [String: Any] { [NSLocalizedDescriptionKey: message] }
    public var errorDescription: String? { message }

    public static func == (lhs: LAError, rhs: LAError) -> Bool { lhs.code == rhs.code }
    public func hash(into hasher: inout Hasher) { hasher.combine(code) }
}

/// Apple's `LAContext` on Linux: asks the user to prove presence with the keychain passphrase
/// (Lockbox's presence check), and, passed as `kSecUseAuthenticationContext`, lets the items
/// protected by `.userPresence` or `.devicePasscode` open without asking again for
/// ``touchIDAuthenticationAllowableReuseDuration`` seconds after a successful evaluation.
///
/// ```swift
/// let context = LAContext()
/// context.touchIDAuthenticationAllowableReuseDuration = 30
/// let ok = try await context.evaluatePolicy(.deviceOwnerAuthentication, localizedReason: "open the vault")
/// query[kSecUseAuthenticationContext as String] = context
/// ```
///
/// The passphrase is asked through ``LAContext/presenceVerifier`` (set it once per process; by
/// default none, and evaluation fails with ``LAError/Code/notInteractive``). Linux has no
/// biometry: the biometric policies fail with ``LAError/Code/biometryNotAvailable``, as on a
/// device without it.
public final class LAContext: NSObject, @unchecked Sendable {
    private struct State {
        var reuseDuration: TimeInterval = 0
        var interactionNotAllowed = false
        var context: AuthenticationContext?
        var invalidated = false
    }

    /// How every context asks for the passphrase (a dialog, the terminal, a test's fixed answer).
    public static var presenceVerifier: (any PresenceVerifier)? {
        get { verifier.withLock { $0 } }
        set { verifier.withLock { $0 = newValue } }
    }
    private static let verifier = Mutex<(any PresenceVerifier)?>(nil)

    private let state = Mutex(State())

    public override init() {}

    /// Seconds after a successful evaluation during which access-controlled items open without
    /// asking again (at most ``LATouchIDAuthenticationMaximumAllowableReuseDuration``). Default 0.
    public var touchIDAuthenticationAllowableReuseDuration: TimeInterval {
        get { state.withLock { $0.reuseDuration } }
        set {
            state.withLock {
                $0.reuseDuration = min(max(newValue, 0), LATouchIDAuthenticationMaximumAllowableReuseDuration)
                $0.context = nil
            }
        }
    }

    /// When true, an item that would need the user fails with `errSecInteractionNotAllowed`.
    public var interactionNotAllowed: Bool {
        get { state.withLock { $0.interactionNotAllowed } }
        set {
            state.withLock {
                $0.interactionNotAllowed = newValue
                $0.context = nil
            }
        }
    }

    /// Text for the fallback button. Kept; Linux shows no such button.
    public var localizedFallbackTitle: String?
    /// Text for the cancel button. Kept; Linux shows no such button.
    public var localizedCancelTitle: String?
    /// Text shown with the request.
    public var localizedReason: String = ""

    /// No biometry on Linux.
    public var biometryType: LABiometryType { .none }

    /// Whether `policy` can be evaluated: the passcode policy when the keychain has a passphrase
    /// and a verifier is set; never the biometric ones.
    public func canEvaluatePolicy(_ policy: LAPolicy, error: UnsafeMutablePointer<NSError?>?) -> Bool {
        do {
            try check(policy)
            return true
        } catch let failure {
            error?.pointee = failure as NSError
            return false
        }
    }

    /// Asks the user to prove presence for `policy`, then calls `reply` (on another thread, as
    /// Apple does). A success is remembered for the reuse window.
    public func evaluatePolicy(
        _ policy: LAPolicy, localizedReason: String, reply: @escaping @Sendable (Bool, (any Error)?) -> Void
    ) {
        // The store is the caller's (``SecItemStore/withStore(_:operation:)`` is task-local).
        let store = try? SecItemStore.current()
        Thread.detachNewThread { [self] in
            do {
                try evaluate(policy, reason: localizedReason, store: store)
                reply(true, nil)
            } catch {
                reply(false, error)
            }
        }
    }

    /// The `async` form of ``evaluatePolicy(_:localizedReason:reply:)``.
    public func evaluatePolicy(_ policy: LAPolicy, localizedReason: String) async throws -> Bool {
        try await withCheckedThrowingContinuation { continuation in
            evaluatePolicy(policy, localizedReason: localizedReason) { success, error in
                if let error { continuation.resume(throwing: error) } else { continuation.resume(returning: success) }
            }
        }
    }

    /// Forgets every verification; afterwards the context fails with ``LAError/Code/invalidContext``.
    public func invalidate() {
        state.withLock {
            $0.context?.invalidate()
            $0.context = nil
            $0.invalidated = true
        }
    }

    // MARK: Internals

    /// The authentication context items read with this LAContext use.
    var authenticationContext: AuthenticationContext {
        state.withLock { state in
            if let context = state.context { return context }
            let context = AuthenticationContext(
                verifier: state.invalidated ? nil : Self.presenceVerifier,
                reuseDuration: .milliseconds(Int64((state.reuseDuration * 1000).rounded())),
                interactionNotAllowed: state.interactionNotAllowed || state.invalidated)
            state.context = context
            return context
        }
    }

    private func check(_ policy: LAPolicy, store: (any ItemStore)? = try? SecItemStore.current()) throws(LAError) {
        guard !state.withLock({ $0.invalidated }) else {
            throw LAError(.invalidContext, message: "The context was invalidated.")
        }
        switch policy {
        case .deviceOwnerAuthenticationWithBiometrics, .deviceOwnerAuthenticationWithBiometricsOrWatch,
            .deviceOwnerAuthenticationWithWatch:
            throw LAError(.biometryNotAvailable, message: "Linux has no biometry (or paired watch) the keychain can trust.")
        case .deviceOwnerAuthentication:
            guard Self.presenceVerifier != nil else {
                throw LAError(.notInteractive, message: "No way to ask for the passphrase: set LAContext.presenceVerifier.")
            }
            guard let vault = store as? Vault, vault.hasPassphrase else {
                throw LAError(.passcodeNotSet, message: "The keychain has no passphrase to verify the user with.")
            }
        }
    }

    private func evaluate(_ policy: LAPolicy, reason: String, store: (any ItemStore)?) throws(LAError) {
        try check(policy, store: store)
        guard let vault = store as? Vault else {
            throw LAError(.passcodeNotSet, message: "The keychain has no passphrase to verify the user with.")
        }
        do {
            try vault.verifyUser(through: authenticationContext, reason: reason)
        } catch {
            switch error.code {
            case .userCanceled: throw LAError(.userCancel, message: error.message)
            case .interactionNotAllowed: throw LAError(.notInteractive, message: error.message)
            default: throw LAError(.authenticationFailed, message: error.message)
            }
        }
    }
}

extension LAContext: SecAuthenticationContextProviding {
    package var secItemAuthenticationContext: AuthenticationContext { authenticationContext }
}
#endif
