import LockboxCore

/// Who is at the other end of a connection to the broker: a process of the broker's own user,
/// pinned against pid reuse, and the identity it is known by.
///
/// The identity is the first that applies (docs/BROKER.md, "Who is asking"):
///
/// 1. `.flatpak(appID:)`: the process runs in a Flatpak sandbox (its root holds
///    `/.flatpak-info`); `name` is the app id, `org.example.Mail`.
/// 2. `.systemdUnit(_:)`: the process belongs to a service of the user's systemd manager
///    (`/proc/PID/cgroup` ends in `user@UID.service/.../NAME.service`); `name` is
///    `unit:NAME.service`. Scopes (`.scope`) are not identities: a terminal or any program can
///    put what it runs in one.
/// 3. `.executable(path:)`: anything else, by the file it executes (`/proc/PID/exe`); `name` is
///    `exe:` and the absolute path, `exe:/usr/bin/myapp`.
///
/// The prefixes keep the three apart: a Flatpak app id holds no `:`, so no unit or path can
/// take an app's name.
public struct PeerIdentity: Sendable, Hashable, CustomStringConvertible {
    /// How the process was identified.
    public enum Kind: Sendable, Hashable {
        /// A Flatpak app, by the app id its sandbox declares.
        case flatpak(appID: String)
        /// A service of the user's systemd manager, by unit name (`backup.service`).
        case systemdUnit(String)
        /// Any other process, by the absolute path of the file it executes.
        case executable(path: String)
    }

    /// The process's user id (always the broker's own: another user is refused).
    public let uid: UInt32
    /// The process id at identification (pinned: see `startTime`).
    public let pid: Int32
    /// The identity, the first of Flatpak app, systemd unit, executable that applies.
    public let kind: Kind
    /// The file the process executes, as `/proc/PID/exe` names it (inside a Flatpak sandbox,
    /// the path inside the sandbox). A replaced file keeps its path, without " (deleted)".
    public let executablePath: String
    /// The SHA-256 of the executed file (the inode the process runs, not the file now at the
    /// path), lower-case hexadecimal; nil unless identification was asked to hash it.
    public let executableSHA256: String?
    /// The process start time in clock ticks since boot (field 22 of `/proc/PID/stat`): with
    /// `pid`, it names one process, never a later one that reuses the number.
    public let startTime: UInt64
    /// Whether the file at ``executablePath``, as the broker's mount namespace resolves it, is
    /// the file the process runs: always so for an `.executable` identity (else it is refused),
    /// never said of a Flatpak app (its path is the sandbox's). Only such a path may name the
    /// `lockbox` command: a unit's process could show any path in a namespace of its own.
    public let executableIsAtPath: Bool

    /// The identity's name, which is also the access group of an application without a
    /// policy entry: the app id, `unit:NAME`, or `exe:PATH` (see the type's summary).
    public var name: String {
        switch kind {
        case .flatpak(let appID): appID
        case .systemdUnit(let unit): "unit:" + unit
        case .executable(let path): "exe:" + path
        }
    }

    /// `name (pid N)`.
    public var description: String { "\(name) (pid \(pid))" }

    /// A peer as identification found it.
    public init(
        uid: UInt32, pid: Int32, kind: Kind, executablePath: String, executableSHA256: String?, startTime: UInt64,
        executableIsAtPath: Bool = true
    ) {
        self.uid = uid
        self.pid = pid
        self.kind = kind
        self.executablePath = executablePath
        self.executableSHA256 = executableSHA256
        self.startTime = startTime
        self.executableIsAtPath = executableIsAtPath
    }

    /// Identifies the process at the other end of a connected Unix socket.
    ///
    /// The peer comes from `SO_PEERCRED`; a uid other than the broker's effective uid is refused.
    /// The process is pinned by a pidfd (`SO_PEERPIDFD`, else `pidfd_open`) and its start time,
    /// read before and after everything else in `/proc`; a process that started after the
    /// identification began, or that exits during it, is refused, never misidentified.
    /// - Parameters:
    ///   - socket: a connected `AF_UNIX` socket.
    ///   - hashExecutable: also compute the SHA-256 of the executed file (for a policy that pins
    ///     one: `BrokerPolicy.pinsExecutableHashes`).
    /// - Returns: the pinned identity.
    /// - Throws: `authFailed` when the peer is another user, has exited, or cannot be identified;
    ///   `io` when the socket cannot be queried.
    public static func identify(socket: Int32, hashExecutable: Bool = false) throws(LockboxError) -> PeerIdentity {
        try PeerIdentification(socket: socket, hashExecutable: hashExecutable, between: nil).run()
    }
}

extension PeerIdentity {
    /// `identify`, calling `between` after the process is pinned and before anything else is
    /// read, so that a test can make it exit in the middle; with `socketPidfd` false, the pidfd
    /// comes from `pidfd_open` as on kernels without `SO_PEERPIDFD`.
    package static func identify(
        socket: Int32, hashExecutable: Bool = false, socketPidfd: Bool, between: (() -> Void)? = nil
    ) throws(LockboxError) -> PeerIdentity {
        var identification = PeerIdentification(socket: socket, hashExecutable: hashExecutable, between: between)
        identification.socketPidfd = socketPidfd
        return try identification.run()
    }
}
