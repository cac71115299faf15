import LockboxCore

#if canImport(Glibc)
import Glibc
#endif

/// The broker's systemd user units (`lockboxd.socket`, `lockboxd.service`) and their
/// installation in `$XDG_CONFIG_HOME/systemd/user`, for `lockbox broker install-units` and
/// `uninstall-units`.
///
/// The socket unit listens on `%t/lockbox/lockboxd.sock` (`$XDG_RUNTIME_DIR/lockbox/lockboxd.sock`,
/// directory 0700, socket 0600) and starts the service on the first connection; the service runs
/// the broker with the listening socket as descriptor 3 (`LISTEN_FDS`). The same files are in
/// `contrib/systemd/` for packagers (with `@LOCKBOXD@` for the broker's command).
public enum BrokerUnits {
    /// `lockboxd.socket`.
    public static let socketUnitName = "lockboxd.socket"
    /// `lockboxd.service`.
    public static let serviceUnitName = "lockboxd.service"
    /// The first line of each installed unit: `uninstall-units` removes only files that have it,
    /// and `install-units` replaces only those.
    public static let marker = "# Written by lockbox broker install-units; lockbox broker uninstall-units removes it."
    /// Where `@LOCKBOXD@` stands in the service template.
    public static let commandPlaceholder = "@LOCKBOXD@"

    /// The broker's socket: `$XDG_RUNTIME_DIR/lockbox/lockboxd.sock` (`%t/lockbox/lockboxd.sock`
    /// in the unit); nil when `XDG_RUNTIME_DIR` is not an absolute path.
    public static var socketPath: String? {
        guard let runtime = ProcessEnvironment.value("XDG_RUNTIME_DIR"), runtime.hasPrefix("/") else { return nil }
        return runtime + "/lockbox/lockboxd.sock"
    }

    /// `lockboxd.socket`, as installed (and as in contrib/systemd/).
    public static let socketUnit = """
        \(marker)
        [Unit]
        Description=Lockbox keychain broker socket

        [Socket]
        ListenStream=%t/lockbox/lockboxd.sock
        SocketMode=0600
        DirectoryMode=0700
        RemoveOnStop=yes

        [Install]
        WantedBy=sockets.target

        """

    /// `lockboxd.service` with `@LOCKBOXD@` where the broker's command goes.
    public static let serviceTemplate = """
        \(marker)
        [Unit]
        Description=Lockbox keychain broker
        Requires=lockboxd.socket
        After=lockboxd.socket

        [Service]
        Type=simple
        ExecStart=\(commandPlaceholder)
        # The broker exits when idle; the socket starts it again on the next connection.
        Restart=on-failure
        UMask=0077
        LimitCORE=0
        NoNewPrivileges=yes
        LockPersonality=yes
        RestrictRealtime=yes
        MemoryDenyWriteExecute=yes
        SystemCallArchitectures=native

        """

    /// `lockboxd.service` running `brokerCommand` (an absolute path, then its arguments).
    /// - Throws: `param` when the command is empty, not an absolute path, or holds a control character.
    public static func serviceUnit(brokerCommand: [String]) throws(LockboxError) -> String {
        guard let program = brokerCommand.first, program.hasPrefix("/") else {
            throw LockboxError(.param, "The broker's command must start with the absolute path of lockboxd.")
        }
        guard brokerCommand.allSatisfy({ $0.utf8.allSatisfy { $0 >= 0x20 && $0 != 0x7f } }) else {
            throw LockboxError(.param, "The broker's command may not contain control characters or line breaks.")
        }
        let line = brokerCommand.map(execQuoted).joined(separator: " ")
        return serviceTemplate.replacing(commandPlaceholder, with: line)
    }

    /// One `ExecStart=` word: as is when plain, else in double quotes; `%` and `$` doubled so
    /// that systemd expands neither.
    package static func execQuoted(_ word: String) -> String {
        let escaped = word.replacing("%", with: "%%").replacing("$", with: "$$")
        let plain = !word.isEmpty && word.utf8.allSatisfy { !" \t\"'\\;".utf8.contains($0) }
        if plain { return escaped }
        return "\"" + escaped.replacing("\\", with: "\\\\").replacing("\"", with: "\\\"") + "\""
    }

    /// `lockboxd` beside this process's executable (installed with `lockbox`).
    public static var defaultBrokerExecutable: String {
        var buffer = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
        let count = readlink("/proc/self/exe", &buffer, buffer.count - 1)
        let own = count > 0 ? String(decoding: buffer[0..<count].map { UInt8(bitPattern: $0) }, as: UTF8.self) : ""
        return (own.lastIndex(of: "/").map { String(own[...$0]) } ?? "/usr/bin/") + "lockboxd"
    }

    /// `$XDG_RUNTIME_DIR`, where a running user manager has its private socket.
    public static var environmentRuntimeDirectory: String? { ProcessEnvironment.value("XDG_RUNTIME_DIR") }

    /// `$XDG_CONFIG_HOME/systemd/user` (`~/.config/systemd/user`).
    public static var defaultDirectory: String {
        let config = ProcessEnvironment.nonEmpty("XDG_CONFIG_HOME").flatMap { $0.hasPrefix("/") ? $0 : nil }
            ?? ProcessEnvironment.home + "/.config"
        return config + "/systemd/user"
    }

    /// What `install` or `uninstall` did.
    public struct Outcome: Sendable, Hashable {
        /// The unit files (and the `sockets.target.wants` link) written or removed.
        public var files: [String]
        /// True when a running user manager was reloaded (and the socket started or stopped).
        public var managerReloaded: Bool
        /// What happened and what to do next, for the person who ran the command.
        public var message: String
    }

    /// Writes both units and enables the socket (the `sockets.target.wants` link), then, when a
    /// user manager runs, `systemctl --user daemon-reload` and `start lockboxd.socket`.
    ///
    /// A unit file of the same name that `install` did not write (it lacks `marker`) is left
    /// alone and reported: nothing the user wrote is replaced.
    /// - Parameters:
    ///   - brokerCommand: the broker's absolute path and arguments (`["/usr/bin/lockboxd"]`).
    ///   - directory: the unit directory; `defaultDirectory` when nil.
    ///   - runtimeDirectory: where to look for a running user manager (`$XDG_RUNTIME_DIR`).
    /// - Throws: `duplicateItem` for a unit file that is not Lockbox's; `param` for a bad
    ///   command or a program that is not there; `io` when a file cannot be written or `systemctl` fails.
    public static func install(
        brokerCommand: [String], directory: String? = nil, runtimeDirectory: String? = BrokerUnits.environmentRuntimeDirectory
    ) throws(LockboxError) -> Outcome {
        let directory = directory ?? defaultDirectory
        if let program = brokerCommand.first, program.hasPrefix("/"), access(program, X_OK) != 0 {
            throw LockboxError(
                .param, "\(program) is not an executable program, so systemd could not start the broker. "
                    + "Build lockboxd (swift build -c release --product lockboxd), install it there, or give its path with --lockboxd.")
        }
        let units = [(socketUnitName, socketUnit), (serviceUnitName, try serviceUnit(brokerCommand: brokerCommand))]
        try UnitFiles.makeDirectories(directory + "/sockets.target.wants")
        for (name, _) in units { try UnitFiles.checkReplaceable(directory + "/" + name) }
        var files: [String] = []
        for (name, text) in units {
            try UnitFiles.writeAtomically(directory + "/" + name, text)
            files.append(directory + "/" + name)
        }
        let link = directory + "/sockets.target.wants/" + socketUnitName
        try UnitFiles.link(link, to: "../" + socketUnitName)
        files.append(link)

        guard let manager = UserManager(runtimeDirectory: runtimeDirectory) else {
            return Outcome(
                files: files, managerReloaded: false,
                message: "Installed \(socketUnitName) and \(serviceUnitName) in \(directory). No systemd user manager runs for this "
                    + "session, so nothing was started: the socket starts with your next login that has one; until then the library "
                    + "and the lockbox command start lockboxd on demand.")
        }
        try manager.systemctl(["daemon-reload"])
        try manager.systemctl(["start", socketUnitName])
        return Outcome(
            files: files, managerReloaded: true,
            message: "Installed \(socketUnitName) and \(serviceUnitName) in \(directory) and started the socket: "
                + "lockboxd now starts on the first connection to \(runtimeDirectory ?? "$XDG_RUNTIME_DIR")/lockbox/lockboxd.sock.")
    }

    /// Stops the units when a user manager runs, removes the files `install` wrote (only
    /// those with `marker`, and the `sockets.target.wants` link to them), then reloads.
    /// - Throws: `duplicateItem` for a unit file that is not Lockbox's (it is left in place);
    ///   `io` when a file cannot be removed or `systemctl` fails.
    public static func uninstall(
        directory: String? = nil, runtimeDirectory: String? = BrokerUnits.environmentRuntimeDirectory
    ) throws(LockboxError) -> Outcome {
        let directory = directory ?? defaultDirectory
        let names = [socketUnitName, serviceUnitName]
        for name in names { try UnitFiles.checkReplaceable(directory + "/" + name) }
        let manager = UserManager(runtimeDirectory: runtimeDirectory)
        try manager?.systemctl(["stop", socketUnitName, serviceUnitName])
        var files: [String] = []
        let link = directory + "/sockets.target.wants/" + socketUnitName
        if try UnitFiles.removeLink(link, ifItPointsTo: "../" + socketUnitName) { files.append(link) }
        for name in names where try UnitFiles.remove(directory + "/" + name) { files.append(directory + "/" + name) }
        try manager?.systemctl(["daemon-reload"])
        let what = files.isEmpty ? "No lockboxd unit was installed in \(directory)." : "Removed \(files.joined(separator: ", "))."
        return Outcome(
            files: files, managerReloaded: manager != nil,
            message: what + (manager == nil ? " No systemd user manager runs for this session, so none was reloaded." : ""))
    }
}
