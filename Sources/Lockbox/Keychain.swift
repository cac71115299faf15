import FoundationEssentials
import SecretService
import Synchronization

/// The entry point: opens the keychain an application should use.
///
/// ```swift
/// let keychain = try Keychain.open()
/// try keychain.store.add(.genericPassword(service: "api", account: "alice", data: token))
/// print(keychain.reason)   // why this backend was chosen
/// ```
///
/// An explicit choice wins (the `backend` option, then `LOCKBOX_BACKEND`, then
/// `LOCKBOX_BROKER=1`, which asks for the broker); then the broker when `lockboxd` serves the
/// vault now; otherwise the embedded vault, which needs no daemon and no desktop session. There is no plain-text backend
/// and no silent fallback: when the chosen backend cannot be used, `open` throws an error that
/// says how to enable it, and never opens a different one instead.
public enum Keychain {
    /// The backends Lockbox can use.
    public enum Backend: String, Sendable, CaseIterable {
        /// The embedded encrypted vault (the default).
        case vault
        /// The desktop keychain behind the freedesktop Secret Service (GNOME Keyring,
        /// KWallet, KeePassXC), over D-Bus.
        case secretService = "secret-service"
        /// The vault, served by the per-user broker `lockboxd` (started on demand): its unlocked
        /// keys stay in the broker's memory, and access groups are walls between programs.
        case broker
    }

    /// How to open the keychain.
    public struct Options: Sendable {
        /// The backend; nil to choose by environment and defaults.
        public var backend: Backend?
        /// The vault file; nil for `LOCKBOX_KEYCHAIN`, then `Vault.defaultPath`.
        public var path: String?
        /// The vault's configuration.
        public var vault = Vault.Configuration()
        /// The Secret Service backend's configuration.
        public var secretService = SecretServiceStore.Configuration()
        /// The broker's socket; nil for `LOCKBOX_BROKER_SOCKET`, then
        /// `$XDG_RUNTIME_DIR/lockbox/lockboxd.sock`.
        public var brokerSocket: String?

        /// Options that name a backend and a vault path; nil leaves each to the environment and the defaults.
        public init(backend: Backend? = nil, path: String? = nil) {
            self.backend = backend
            self.path = path
        }
    }

    /// An opened keychain and why it was chosen.
    public struct Opened: Sendable {
        /// The store to read and write items through.
        public let store: any ItemStore
        /// The backend that was opened.
        public let backend: Backend
        /// One sentence on why this backend was chosen (for `lockbox status`).
        public let reason: String
        /// The vault, when the backend is the vault.
        public let vault: Vault?
        /// The broker's store, when the backend is the broker.
        public private(set) var broker: BrokerStore? = nil
    }

    /// The vault path from an explicit option, `LOCKBOX_KEYCHAIN`, or the XDG default.
    public static func vaultPath(explicit: String? = nil) -> String {
        if let explicit { return explicit }
        if let fromEnvironment = ProcessEnvironment.nonEmpty("LOCKBOX_KEYCHAIN") {
            return fromEnvironment
        }
        return Vault.defaultPath
    }

    /// The desktop keyring (Secret Service) as the vault's key keeper, for
    /// `Vault.enroll(_:)`, `Vault.unenroll(_:)` and `Vault.unlock(with:)`: the vault then
    /// opens with the login session.
    /// - Parameter options: Its ``Options/secretService`` configuration is used.
    public static func desktopKeyring(_ options: Options = Options()) -> SecretServiceStore {
        SecretServiceStore(configuration: options.secretService)
    }

    /// The unlock cache `LOCKBOX_UNLOCK_CACHE` asks for: `keyring` or `process`; nil when the
    /// variable is unset or empty.
    /// - Throws: `errSecParam` for any other value (names are exact and lower-case).
    package static func unlockCache(environmentValue value: String?) throws(LockboxError) -> UnlockCache? {
        guard let value, !value.isEmpty else { return nil }
        switch value {
        case "process": return .processMemory
        case "keyring": return .kernelKeyring
        default:
            throw LockboxError(.param, "LOCKBOX_UNLOCK_CACHE must be `keyring` or `process`, not `\(value)`.")
        }
    }

    /// Whether `LOCKBOX_BROKER` asks for the broker (`1`) or forbids it (`0`); nil when unset.
    /// - Throws: `errSecParam` for any other value.
    package static func brokerWanted(environmentValue value: String?) throws(LockboxError) -> Bool? {
        guard let value, !value.isEmpty else { return nil }
        switch value {
        case "1": return true
        case "0": return false
        default: throw LockboxError(.param, "LOCKBOX_BROKER must be 1 (use lockboxd) or 0 (never), not `\(value)`.")
        }
    }

    /// The backend `LOCKBOX_BACKEND` names; nil when the variable is unset or empty.
    /// - Throws: `errSecParam` for a name that is not a backend's (names are exact and lower-case).
    package static func backend(environmentValue value: String?) throws(LockboxError) -> Backend? {
        guard let value, !value.isEmpty else { return nil }
        guard let backend = Backend(rawValue: value) else {
            throw LockboxError(
                .param,
                "LOCKBOX_BACKEND=\(value) is not a backend; use one of: " + Backend.allCases.map(\.rawValue).joined(separator: ", ") + ".")
        }
        return backend
    }

    /// Applies `LOCKBOX_UNLOCK_CACHE` to a vault configuration.
    /// - Throws: `errSecParam` when the variable holds something else than `keyring` or `process`.
    package static func applyEnvironment(to configuration: inout Vault.Configuration) throws(LockboxError) {
        if let cache = try unlockCache(environmentValue: ProcessEnvironment.value("LOCKBOX_UNLOCK_CACHE")) {
            configuration.unlockCache = cache
        }
    }

    /// The backend `open` uses, and why.
    private static func chooseBackend(_ options: Options) throws(LockboxError) -> (Backend, String) {
        let backend: Backend
        let reason: String
        if let chosen = options.backend {
            backend = chosen
            reason = "chosen by the application"
        } else if let chosen = try Self.backend(environmentValue: ProcessEnvironment.value("LOCKBOX_BACKEND")) {
            backend = chosen
            reason = "chosen by LOCKBOX_BACKEND"
        } else if try brokerWanted(environmentValue: ProcessEnvironment.value("LOCKBOX_BROKER")) == true {
            backend = .broker
            reason = "chosen by LOCKBOX_BROKER"
        } else if try brokerWanted(environmentValue: ProcessEnvironment.value("LOCKBOX_BROKER")) == nil,
            BrokerClaim.isServedByBroker(vaultPath: vaultPath(explicit: options.path))
        {
            backend = .broker
            reason = "lockboxd serves this keychain"
        } else {
            backend = .vault
            reason = "the default: the embedded vault needs no daemon or desktop session"
        }
        return (backend, reason)
    }

    /// A broker connection made before the process hardens itself (see ``prepareBroker(_:)``).
    private static let preparedBroker = Mutex<BrokerStore?>(nil)

    /// Connects to the broker now when ``open(_:)`` would use it, and keeps the connection for
    /// `open`: `lockboxd` identifies a client by its `/proc` files, which a process that has made
    /// itself non-dumpable (as `lockbox` and the credential helpers do before reading a secret)
    /// hides from it. Call it first in `main`; a failure here is reported by `open`.
    public static func prepareBroker(_ options: Options = Options()) {
        guard let (backend, _) = try? chooseBackend(options), backend == .broker else { return }
        guard let store = try? BrokerStore.connect(socketPath: options.brokerSocket, vaultPath: vaultPath(explicit: options.path)) else {
            return
        }
        preparedBroker.withLock { $0 = store }
    }

    /// Opens the keychain. See the type's documentation for how the backend is chosen.
    ///
    /// - Parameter options: The backend, vault path and configurations; the defaults read
    ///   `LOCKBOX_BACKEND`, `LOCKBOX_KEYCHAIN` and `LOCKBOX_UNLOCK_CACHE`.
    /// - Returns: The store, the backend and why it was chosen.
    /// - Throws: `errSecParam` for a malformed `LOCKBOX_BACKEND` or `LOCKBOX_UNLOCK_CACHE`;
    ///   `errSecNoSuchKeychain` when there is no vault at the path; the backend's own error when
    ///   it cannot be used (never a fallback to another backend).
    public static func open(_ options: Options = Options()) throws(LockboxError) -> Opened {
        var configuration = options.vault
        try applyEnvironment(to: &configuration)
        let (backend, reason) = try chooseBackend(options)
        switch backend {
        case .vault:
            let path = vaultPath(explicit: options.path)
            let vault = try Vault.open(at: path, configuration: configuration)
            var note = ""
            // The first available unlock method: a key in the desktop keyring opens a locked
            // vault once per login session. After an explicit lock, or the idle timeout, in this
            // session the vault stays locked until an explicit unlock.
            if vault.enrolledKeepers.contains("secret-service"), (try? vault.isUnlocked) == false {
                guard vault.mayUnlockAutomatically else {
                    return Opened(
                        store: vault, backend: .vault,
                        reason: reason + "; locked in this session (the desktop keyring unlocks it again with `lockbox unlock`)",
                        vault: vault)
                }
                do {
                    try vault.unlock(with: desktopKeyring(options))
                    note = "; unlocked with its key in the desktop keyring (Secret Service)"
                } catch {
                    note = "; the desktop keyring could not unlock it (\(error.message))"
                }
            }
            return Opened(store: vault, backend: .vault, reason: reason + note, vault: vault)
        case .broker:
            let path = vaultPath(explicit: options.path)
            let prepared = preparedBroker.withLock { $0 }
            let store: BrokerStore
            if let prepared, prepared.vaultPath == path, options.brokerSocket == nil || options.brokerSocket == prepared.socketPath {
                store = prepared
            } else {
                store = try BrokerStore.connect(socketPath: options.brokerSocket, vaultPath: path)
            }
            // The broker asks no one: this process asks its user, the broker checks the answer.
            store.authenticationContext = options.vault.authenticationContext
            return Opened(
                store: store, backend: .broker,
                reason: reason + "; the keys stay in lockboxd (pid \(store.brokerProcessIdentifier)) at \(store.socketPath)", vault: nil,
                broker: store)
        case .secretService:
            let store = SecretServiceStore(configuration: options.secretService)
            // Fail now, with the backend's own message, rather than at the first item.
            try store.checkAvailable()
            return Opened(store: store, backend: .secretService, reason: reason, vault: nil)
        }
    }
}
