import Lockbox
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// Exit statuses, as macOS `security` uses them.
package enum ExitStatus: Int32 {
    case success = 0
    case failure = 1
    case itemNotFound = 44
    case usage = 64
}

/// Asks for the passphrase on the terminal when an access-controlled item is used.
package struct TerminalVerifier: PresenceVerifier {
    package init() {}

    package func passphrase(for request: AuthenticationRequest) throws(LockboxError) -> SecretBytes {
        let passphrase: SecretBytes
        do {
            passphrase = try SecretInput.prompt("Passphrase to \(request.reason) (empty to cancel): ", limit: SecretInput.passphraseLimit)
        } catch LockboxError.notAvailable {
            throw LockboxError(
                .interactionNotAllowed, "This item needs the passphrase re-entered, and there is no terminal to ask on.")
        }
        guard !passphrase.isEmpty else {
            throw LockboxError(.userCanceled, "Cancelled: the passphrase was not given.")
        }
        return passphrase
    }
}

extension UsageError {
    /// Prints the mistake and the help of the verb (or the overview) to stderr; the caller
    /// exits with ``ExitStatus/usage``.
    package func report(to streams: StandardStreams) {
        streams.error("lockbox: \(message)")
        streams.error("")
        streams.error(verb.flatMap(Help.text(for:)) ?? Help.overview)
    }
}

/// stdout and stderr, for text that is never secret.
package struct StandardStreams: Sendable {
    package init() {}

    package func print(_ text: String) {
        Self.write(text + "\n", to: STDOUT_FILENO)
    }

    package func error(_ text: String) {
        Self.write(text + "\n", to: STDERR_FILENO)
    }

    private static func write(_ text: String, to descriptor: Int32) {
        var text = text
        text.withUTF8 { writeAll(UnsafeRawBufferPointer($0), to: descriptor) }
    }
}

/// Writes all of `bytes` to `descriptor`, retrying after signals; stops when the write fails (a
/// full disk, a closed pipe or descriptor). A failure on standard output is remembered, so that
/// the program does not exit with success having printed a secret only in part, or not at all
/// (``StandardOutput/exitStatus(_:)``).
package func writeAll(_ bytes: UnsafeRawBufferPointer, to descriptor: Int32) {
    guard let base = bytes.baseAddress else { return }
    var offset = 0
    while offset < bytes.count {
        let written = write(descriptor, base + offset, bytes.count - offset)
        if written < 0 && errno == EINTR { continue }
        guard written > 0 else {
            if descriptor == STDOUT_FILENO { StandardOutput.recordFailure(written < 0 ? errno : EIO) }
            return
        }
        offset += written
    }
}

/// Whether everything written to standard output arrived.
package enum StandardOutput {
    /// The first write error standard output met (an errno), 0 when none.
    private static let failure = Atomic<Int32>(0)

    static func recordFailure(_ code: Int32) {
        _ = failure.compareExchange(expected: 0, desired: code, ordering: .relaxed)
    }

    /// The status to exit with: `status`, or a failure when a write to standard output failed
    /// (`lockbox find-generic-password -w > file` on a full disk, or with standard output
    /// closed, printed the secret in part or not at all). Says so on standard error, but for a
    /// reader that left (a closed pipe), which a shell reports by itself.
    package static func exitStatus(_ status: ExitStatus) -> Int32 {
        let code = failure.load(ordering: .relaxed)
        guard code != 0 else { return status.rawValue }
        if code != EPIPE {
            StandardStreams().error("lockbox: Standard output could not be written (\(String(cString: strerror(code)))): what was printed is incomplete.")
        }
        return status == .success ? ExitStatus.failure.rawValue : status.rawValue
    }
}

extension ProgramArguments {
    /// The open files a run may want at once: the keychain and its log and shared memory, a sync
    /// state's three, lock files, sockets, and what the system libraries open for threads. A
    /// lower soft limit is raised to it, within the hard limit.
    static let fileDescriptorsWanted: rlim_t = 256
    /// Below this many, a run is refused: under a handful of descriptors a run failed part-way
    /// with a wrong cause ("check the permissions"), or the system's thread library stopped the
    /// process.
    static let fileDescriptorsNeeded: rlim_t = 20

    /// Raises the limit of open files towards what a run wants, within the hard limit; false,
    /// with an error that names `ulimit -n`, when even the hard limit is below what it needs.
    static func ensureFileDescriptors(program: String) -> Bool {
        var limit = rlimit()
        guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0, limit.rlim_cur < fileDescriptorsWanted else { return true }
        let raised = min(limit.rlim_max, fileDescriptorsWanted)
        if raised > limit.rlim_cur {
            var wanted = limit
            wanted.rlim_cur = raised
            if setrlimit(Int32(RLIMIT_NOFILE.rawValue), &wanted) == 0 { limit = wanted }
        }
        guard limit.rlim_cur < fileDescriptorsNeeded else { return true }
        StandardStreams().error(
            "\(program): this process may open only \(limit.rlim_cur) files (`ulimit -n`); Lockbox needs \(fileDescriptorsNeeded). "
                + "Raise the limit (`ulimit -n \(fileDescriptorsWanted)`), then try again; nothing was read or changed.")
        return false
    }
}

/// The program's arguments, each checked to be UTF-8 text. Swift gives an argument that is not
/// (a name in Latin-1, say) with its invalid bytes replaced by U+FFFD, so two different names
/// would read as one, and a query would find, overwrite or delete another item than the one
/// named. Such an argument is refused instead (exit 64), without being shown: it may be a
/// secret typed in the wrong place.
package enum ProgramArguments {
    /// The arguments after the program's name, or nil with the error printed. The environment
    /// variables Lockbox reads are checked the same way (``ProcessEnvironment/firstVariableNotUTF8()``).
    package static func checked(program: String) -> [String]? {
        guard ensureFileDescriptors(program: program) else { return nil }
        if let variable = ProcessEnvironment.firstVariableNotUTF8() {
            StandardStreams().error(
                "\(program): the environment variable \(variable) is not UTF-8 text (not shown). Lockbox keeps paths and names as "
                    + "UTF-8, and would read it as another one; set it to UTF-8 text.")
            return nil
        }
        var arguments: [String] = []
        for index in 1..<Int(CommandLine.argc) {
            guard let pointer = CommandLine.unsafeArgv[index], let argument = String(validatingCString: pointer) else {
                StandardStreams().error(
                    "\(program): argument \(index) is not UTF-8 text (not shown). Lockbox keeps names as UTF-8, and would read it as "
                        + "another name; convert it first (for example with iconv -f latin1 -t utf-8).")
                return nil
            }
            arguments.append(argument)
        }
        return arguments
    }
}
