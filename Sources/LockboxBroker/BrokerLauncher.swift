import LockboxCore

#if canImport(Glibc)
import Glibc
#endif

/// Starts `lockboxd` on demand, as gpg-agent is started by gpg: when no broker answers.
package enum BrokerLauncher {
    /// How long a started broker may take to listen (opening the vault checks its integrity).
    static let startTimeoutSeconds = 10

    /// `LOCKBOX_BROKERD`, else `lockboxd` beside this program, else on `PATH`.
    package static func executable() throws(LockboxError) -> String {
        if let explicit = ProcessEnvironment.nonEmpty("LOCKBOX_BROKERD") { return explicit }
        var buffer = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
        let count = readlink("/proc/self/exe", &buffer, buffer.count - 1)
        if count > 0 {
            let own = String(decoding: buffer[0..<count].map { UInt8(bitPattern: $0) }, as: UTF8.self)
            let beside = BrokerLocation.directory(of: own) + "/lockboxd"
            if access(beside, X_OK) == 0 { return beside }
        }
        for directory in (ProcessEnvironment.value("PATH") ?? "/usr/local/bin:/usr/bin").split(separator: ":") {
            let candidate = String(directory) + "/lockboxd"
            if access(candidate, X_OK) == 0 { return candidate }
        }
        throw LockboxError(
            .notAvailable,
            "lockboxd was not found (beside this program, or on PATH) to start on demand. Install it, or set LOCKBOX_BROKERD to its path.")
    }

    /// Runs `lockboxd --detach`, which returns once its broker listens (or failed to), and
    /// returns when a broker listens at `socketPath`, whether this one or another started at the
    /// same moment.
    /// - Throws: the started broker's own message when it could not start.
    package static func start(socketPath: String, vaultPath: String) throws(LockboxError) {
        let program = try executable()
        var idleExit = "600"
        if let configured = ProcessEnvironment.nonEmpty("LOCKBOX_BROKER_IDLE_EXIT"), Int(configured) != nil { idleExit = configured }
        let arguments = [program, "--detach", "--socket", socketPath, "--keychain", vaultPath, "--idle-exit", idleExit]
        var pipeEnds: [Int32] = [0, 0]
        _ = try SystemCall.check("pipe", "Creating a pipe for lockboxd") { pipe(&pipeEnds) }
        _ = fcntl(pipeEnds[0], F_SETFD, FD_CLOEXEC)
        _ = fcntl(pipeEnds[1], F_SETFD, FD_CLOEXEC)
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0)
        posix_spawn_file_actions_adddup2(&actions, pipeEnds[1], 2)
        var pid = pid_t()
        let argv: [UnsafeMutablePointer<CChar>?] = arguments.map { strdup($0) } + [nil]
        defer { for argument in argv { free(argument) } }
        let spawned = posix_spawn(&pid, program, &actions, nil, argv, environ)
        close(pipeEnds[1])
        defer { close(pipeEnds[0]) }
        guard spawned == 0 else {
            throw LockboxError(
                .notAvailable, "Cannot start \(program): \(String(cString: strerror(spawned))).", cause: .systemCall("posix_spawn", errno: spawned))
        }
        // The detaching parent exits once the broker listens or failed; its stderr says why.
        var message: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 1024)
        while message.count < 8192 {
            let count = chunk.withUnsafeMutableBytes { read(pipeEnds[0], $0.baseAddress, $0.count) }
            if count > 0 {
                message += chunk[0..<count]
            } else if count < 0 && errno == EINTR {
                continue
            } else {
                break
            }
        }
        var status: Int32 = 0
        while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
        // Another client may have started one meanwhile: then this start failed, and that is fine.
        for _ in 0..<(startTimeoutSeconds * 100) {
            if BrokerStore.isRunning(socketPath: socketPath) { return }
            if status != 0 { break }
            usleep(10_000)
        }
        let text = String(decoding: message, as: UTF8.self).trimmingCharacters(in: " \n")
        throw LockboxError(.notAvailable, "lockboxd could not be started on demand: " + (text.isEmpty ? "it did not listen in time." : text))
    }
}

extension String {
    fileprivate func trimmingCharacters(in set: String) -> String {
        var text = Substring(self)
        while let first = text.first, set.contains(first) { text = text.dropFirst() }
        while let last = text.last, set.contains(last) { text = text.dropLast() }
        return String(text)
    }
}
