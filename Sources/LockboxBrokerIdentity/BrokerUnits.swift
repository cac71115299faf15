import LockboxCore

/// The broker's systemd user units and their installation in `$XDG_CONFIG_HOME/systemd/user`.
public enum BrokerUnits {
    /// `lockboxd.socket`.
    public static let socketUnitName = "lockboxd.socket"
    /// `lockboxd.service`.
    public static let serviceUnitName = "lockboxd.service"

    /// The broker's socket: `$XDG_RUNTIME_DIR/lockbox/lockboxd.sock` (`%t/lockbox/lockboxd.sock`
    /// in the unit); nil when `XDG_RUNTIME_DIR` is not an absolute path.
    public static var socketPath: String? {
        guard let runtime = ProcessEnvironment.value("XDG_RUNTIME_DIR"), runtime.hasPrefix("/") else { return nil }
        return runtime + "/lockbox/lockboxd.sock"
    }

    /// What `install` or `uninstall` did.
    public struct Outcome: Sendable, Hashable {
        /// The unit files written or removed.
        public var files: [String]
        /// True when a running user manager was told to reload (and the socket enabled).
        public var managerReloaded: Bool
        /// What happened and what to do next, for the person who ran the command.
        public var message: String
    }

    /// Writes both units into `directory`, then reloads a running user manager.
    public static func install(brokerCommand: [String], directory: String? = nil) throws(LockboxError) -> Outcome {
        throw LockboxError(.unimplemented, "Installing the broker's units is not built yet.")
    }

    /// Removes the units `install` wrote, then reloads a running user manager.
    public static func uninstall(directory: String? = nil) throws(LockboxError) -> Outcome {
        throw LockboxError(.unimplemented, "Removing the broker's units is not built yet.")
    }
}
