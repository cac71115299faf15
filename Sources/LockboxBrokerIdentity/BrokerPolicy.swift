import LockboxCore

#if canImport(Glibc)
import Glibc
#endif

/// Which access groups each application may use through the broker: the user's
/// `keychain-access-groups` entitlements, in `$XDG_CONFIG_HOME/lockbox/broker.conf`.
///
/// The file is a list of sections, one per application, named as the broker identifies it
/// (`PeerIdentity`), with the groups it may use beside the one of its own:
///
/// ```ini
/// # Mail and its helper share one group.
/// [app org.example.Mail]
/// access-groups = org.example.shared
///
/// [unit backup.service]
/// access-groups = backups, org.example.shared
///
/// [executable /usr/local/bin/sync-tool]
/// access-groups = sync
/// executable-sha256 = 6f1ed002ab5595859014ebf0951522d9...  (64 hex digits)
///
/// [lockbox]
/// executable = /usr/local/bin/lockbox
/// ```
///
/// - `[app ID]`, `[unit NAME.service]`, `[executable /ABSOLUTE/PATH]` name an identity;
///   `access-groups` lists groups separated by commas or spaces (the key may repeat). The first
///   is where the application's items go when it names no group; its own group (`name` of its
///   identity) is always added after the listed ones, as an iOS app always holds its
///   application identifier. An application without a section gets its own group only.
/// - `executable-sha256` pins the file the process runs: a process whose executable has
///   another digest gets no group at all (its `AccessGroupGrant.refusal` says how to update
///   the pin).
/// - `[lockbox]` lists with `executable = PATH` (one per line) the programs that are the
///   `lockbox` command a person uses; it reaches every group, after the passphrase is entered
///   again. Without the section, the `lockbox` beside the broker's own executable is the one.
/// - `#` or `;` starts a comment line. Anything else is an error that names the line.
///
/// The file and its directory must belong to the user and not be writable by group or others;
/// neither may be a symbolic link. `BrokerPolicyWatcher` re-reads it when it changes (an editor's
/// atomic replace included).
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

        /// An entry for `identity`.
        public init(identity: PeerIdentity.Kind, accessGroups: [String], executableSHA256: String? = nil) {
            self.identity = identity
            self.accessGroups = accessGroups
            self.executableSHA256 = executableSHA256
        }
    }

    /// The policy file's name inside its directory.
    public static let fileName = "broker.conf"
    /// A policy file longer than this is refused (a policy is a few kilobytes).
    public static let maximumFileSize = 1024 * 1024

    /// The entries, at most one per identity.
    public var entries: [Entry]
    /// The executables that are the `lockbox` command.
    public var lockboxExecutables: [String]
    /// Where the policy was read from (for messages).
    public var path: String

    /// A policy of `entries`.
    public init(entries: [Entry] = [], lockboxExecutables: [String] = BrokerPolicy.defaultLockboxExecutables, path: String = "") {
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

    /// The `lockbox` beside this process's executable (the broker is installed with it).
    public static var defaultLockboxExecutables: [String] {
        var buffer = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
        let count = readlink("/proc/self/exe", &buffer, buffer.count - 1)
        guard count > 0 else { return [] }
        let path = String(decoding: buffer[0..<count].map { UInt8(bitPattern: $0) }, as: UTF8.self)
        guard let slash = path.lastIndex(of: "/") else { return [] }
        return [String(path[...slash]) + "lockbox"]
    }

    /// Reads the policy in `directory`; a missing file or directory is the empty policy (every
    /// application gets its own group).
    /// - Throws: `io` when the directory or file is not the user's own, is writable by group or
    ///   others, is a symbolic link or not a regular file, or cannot be read (the message says
    ///   what to run); `param` when the file is malformed (the message names the line).
    public static func load(directory: String = defaultDirectory) throws(LockboxError) -> BrokerPolicy {
        try PolicyFile.read(directory: directory).policy
    }

    /// Parses a policy file's text. `path` is only for messages.
    /// - Throws: `param` for a malformed line.
    public init(parsing text: String, path: String) throws(LockboxError) {
        self = try PolicyParser.parse(text, path: path)
    }

    /// True when an entry pins an executable's SHA-256: identify peers with `hashExecutable`.
    public var pinsExecutableHashes: Bool { entries.contains { $0.executableSHA256 != nil } }

    /// The section header that names `identity` in the file: `[app ID]`, `[unit NAME]` or
    /// `[executable PATH]`.
    public static func sectionHeader(for identity: PeerIdentity.Kind) -> String {
        switch identity {
        case .flatpak(let appID): "[app \(appID)]"
        case .systemdUnit(let unit): "[unit \(unit)]"
        case .executable(let path): "[executable \(path)]"
        }
    }

    /// The groups `identity` may use: its entry's groups and its own, or its own alone.
    public func grant(for identity: PeerIdentity) -> AccessGroupGrant {
        let entry = entries.first { $0.identity == identity.kind }
        var isFlatpak = false
        if case .flatpak = identity.kind { isFlatpak = true }
        // Inside a sandbox the path is the sandbox's own: it never names the host's lockbox. Nor
        // does a path that is not the running file as the broker resolves it (a unit's process
        // in a mount namespace of its own, say).
        let isLockbox = !isFlatpak && identity.executableIsAtPath && lockboxExecutables.contains(identity.executablePath)
        var refusal: String?
        if let pin = entry?.executableSHA256, identity.executableSHA256 != pin {
            if identity.executableSHA256 == nil {
                refusal =
                    "\(identity.name) has an executable-sha256 pin in \(path), but the broker did not hash its executable; "
                    + "the broker must identify clients with hashExecutable when the policy pins one."
            } else {
                refusal =
                    "\(identity.name) runs \(identity.executablePath), whose SHA-256 is not the executable-sha256 pinned for it in \(path). "
                    + "If you updated the program yourself, put its new digest there (sha256sum '\(identity.executablePath)')."
            }
        }
        var seen = Set<String>()
        let groups = ((entry?.accessGroups ?? []) + [identity.name]).filter { seen.insert($0).inserted }
        return AccessGroupGrant(
            identityName: identity.name, policySection: Self.sectionHeader(for: identity.kind), accessGroups: groups,
            isLockboxCommand: isLockbox && refusal == nil, refusal: refusal, policyPath: path)
    }
}
