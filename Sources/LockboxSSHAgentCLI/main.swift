import CProcessHardening
import Foundation
import Lockbox
import LockboxCore
import LockboxCommandLine
import LockboxKeys
import LockboxSSHAgent

#if canImport(Glibc)
import Glibc
#endif

// Before anything opens a file or a socket: a standard descriptor left closed by the caller
// must not be taken by one (what the program prints or reads would go there).
_ = lockbox_reserve_standard_descriptors()

// `lockbox ssh-agent` runs here: `lockbox` hands the verb over, so that only the agent loads
// libcrypto and Foundation's process machinery (docs/PERFORMANCE.md, "Process start").

// No core dumps and no same-user ptrace: this process signs with the user's keys.
_ = lockbox_harden_process()

let streams = StandardStreams()
let usage = """
    usage: lockbox [--keychain PATH] ssh-agent [serve] [-a SOCKET] [--reuse-seconds N]
           lockbox [--keychain PATH] ssh-agent generate --type ed25519|ecdsa [--comment TEXT] [--user-presence]
           lockbox [--keychain PATH] ssh-agent list

    serve (the default) answers the SSH agent protocol on SOCKET (default
    $XDG_RUNTIME_DIR/lockbox/ssh-agent.sock, in a 0700 directory), in the foreground, after
    printing the SSH_AUTH_SOCK line for the shell. It offers the keychain's agent keys and signs
    with them; keys never leave the keychain, and keys handed to it (ssh-add FILE) are refused.
      --reuse-seconds N   a --user-presence key asks for the passphrase (SSH_ASKPASS, else the
                          agent's terminal) and reuses the answer for N seconds (default 300;
                          0 asks at every signature)
    generate makes a non-extractable key for the agent and prints its public key line (for
    authorized_keys, or git's allowed signers); --user-presence makes every use ask, within
    the reuse window.
    list prints the public key lines of the agent's keys.
    """

enum AgentCommand {
    case serve(socket: String?, reuseSeconds: Double)
    case generate(algorithm: KeyAlgorithm, comment: String?, userPresence: Bool)
    case list
    case help
}

struct UsageProblem: Error {
    var message: String
}

/// `text` as one word for `eval`: as it is when every character is plain, else in single quotes
/// (a space, a `;` or a `$(...)` in the socket's path stays part of the path).
func shellQuoted(_ text: String) -> String {
    let plain = text.unicodeScalars.allSatisfy { scalar in
        ("a"..."z").contains(scalar) || ("A"..."Z").contains(scalar) || ("0"..."9").contains(scalar) || "/._-+,:@%".unicodeScalars.contains(scalar)
    }
    return plain && !text.isEmpty ? text : "'" + text.replacingOccurrences(of: "'", with: "'\\''") + "'"
}

/// What is said of an argument that is no option here: its place, never its text, which may be
/// a secret typed in the wrong place.
func unknownArgument(at position: Int, of verb: String) -> String {
    "argument \(position) after ssh-agent is not an option of ssh-agent \(verb) (not shown, in case it is a secret)"
}

func parse(_ arguments: [String]) throws(UsageProblem) -> (keychain: String?, command: AgentCommand) {
    var remaining = arguments[...]
    var keychain: String?
    func value(_ option: String) throws(UsageProblem) -> String {
        guard let value = remaining.popFirst() else { throw UsageProblem(message: "\(option) needs a value") }
        return value
    }
    while let first = remaining.first, first == "--keychain" {
        remaining.removeFirst()
        keychain = try value("--keychain")
    }
    let verb = remaining.first.flatMap { ["serve", "generate", "list", "--help", "-h", "help"].contains($0) ? $0 : nil } ?? "serve"
    if remaining.first == verb { remaining.removeFirst() }
    switch verb {
    case "--help", "-h", "help":
        return (keychain, .help)
    case "list":
        guard remaining.isEmpty else { throw UsageProblem(message: "list takes no options") }
        return (keychain, .list)
    case "generate":
        var algorithm: KeyAlgorithm?
        var comment: String?
        var userPresence = false
        while let option = remaining.popFirst() {
            switch option {
            case "--type":
                switch try value(option) {
                case "ed25519": algorithm = .ed25519
                case "ecdsa", "ecdsa-p256", "p256": algorithm = .p256
                default: throw UsageProblem(message: "--type takes ed25519 or ecdsa (P-256): the agent's keys are of these two types")
                }
            case "--comment":
                let given = try value(option)
                // A comment ends a line of `authorized_keys`: a newline in it would add a line.
                guard !given.unicodeScalars.contains(where: PrintableText.isControl) else {
                    throw UsageProblem(
                        message: "--comment has a control character (a newline, or a bidirectional override, say); give it on one line")
                }
                comment = given
            case "--user-presence": userPresence = true
            default: throw UsageProblem(message: unknownArgument(at: arguments.count - remaining.count, of: "generate"))
            }
        }
        guard let algorithm else { throw UsageProblem(message: "generate needs --type ed25519|ecdsa") }
        return (keychain, .generate(algorithm: algorithm, comment: comment, userPresence: userPresence))
    default:
        var socket: String?
        var reuseSeconds = 300.0
        while let option = remaining.popFirst() {
            switch option {
            case "-a": socket = try value(option)
            case "--reuse-seconds":
                guard let seconds = Double(try value(option)), seconds >= 0, seconds <= 86_400 else {
                    throw UsageProblem(message: "--reuse-seconds takes a number of seconds from 0 to 86400")
                }
                reuseSeconds = seconds
            case "-D":
                continue  // OpenSSH's "foreground": this agent always runs in the foreground.
            default: throw UsageProblem(message: unknownArgument(at: arguments.count - remaining.count, of: "serve"))
            }
        }
        return (keychain, .serve(socket: socket, reuseSeconds: reuseSeconds))
    }
}

func presenceVerifier() -> any PresenceVerifier {
    if let askpass = ProcessEnvironment.value("SSH_ASKPASS"), !askpass.isEmpty, ProcessEnvironment.value("SSH_ASKPASS_REQUIRE") != "never" {
        return AskpassVerifier(program: askpass)
    }
    return TerminalVerifier()
}

func keyStore(keychain: String?, context: AuthenticationContext) throws(LockboxError) -> SoftwareKeyStore {
    var options = Keychain.Options(backend: .vault, path: keychain)
    options.vault.authenticationContext = context
    guard let vault = try Keychain.open(options).vault else {
        throw LockboxError(.unimplemented, "The SSH agent needs the vault backend.")
    }
    return SoftwareKeyStore(vault: vault)
}

func run(keychain: String?, command: AgentCommand) throws(LockboxError) -> ExitStatus {
    switch command {
    case .help:
        streams.print(usage)
        return .success
    case .list:
        let store = try keyStore(keychain: keychain, context: AuthenticationContext(interactionNotAllowed: true))
        for identity in try ManagedKeySource(store: store).identities() {
            streams.print(try identity.publicKey.openSSHRepresentation(comment: identity.comment))
        }
        // The keys whose class is locked are not listed: said, and the listing fails, so that a
        // part never passes for every key (an `authorized_keys` made from it, say).
        var query = Query(.key, limit: .all, returning: [.attributes], synchronizable: .any)
        query.attributes.applicationTag = ManagedKeySource.applicationTag
        let locked = try store.vault.listing(matching: query, showingLockedOnly: true).locked
        guard locked == 0 else {
            throw LockboxError.locked(
                "\(locked) of its agent keys \(locked == 1 ? "is" : "are") not listed above: \(locked == 1 ? "its class is" : "their classes are") locked. "
                    + "Unlock it with `lockbox unlock`, then list again.")
        }
        return .success
    case .generate(let algorithm, let comment, let userPresence):
        let store = try keyStore(keychain: keychain, context: AuthenticationContext(verifier: TerminalVerifier()))
        var specification = KeySpecification(algorithm: algorithm, purposes: [.sign, .verify])
        specification.applicationTag = ManagedKeySource.applicationTag
        specification.label = comment
        if userPresence { specification.accessControl = .userPresence }
        let key = try store.generate(specification)
        guard let publicKey = key.publicKey else { preconditionFailure("a signing key has a public key") }
        streams.print(try publicKey.openSSHRepresentation(comment: comment))
        return .success
    case .serve(let socket, let reuseSeconds):
        let context = AuthenticationContext(verifier: presenceVerifier(), reuseDuration: .seconds(reuseSeconds))
        let store = try keyStore(keychain: keychain, context: context)
        let path: String
        if let socket { path = socket } else { path = try AgentListener.defaultPath() }
        let listener = try AgentListener(path: path)
        let log: @Sendable (String) -> Void = { streams.error("lockbox-ssh-agent: \($0)") }
        let responder = AgentResponder(keys: ManagedKeySource(store: store), context: context, log: log)
        streams.print("SSH_AUTH_SOCK=\(shellQuoted(listener.path)); export SSH_AUTH_SOCK;")
        log("serving \(listener.path)")
        listener.serve(responder, log: log)
    }
}

guard let arguments = ProgramArguments.checked(program: "lockbox ssh-agent") else { exit(ExitStatus.usage.rawValue) }
let status: ExitStatus
do {
    let (keychain, command) = try parse(arguments)
    do {
        status = try run(keychain: keychain, command: command)
    } catch {
        streams.error("lockbox ssh-agent: \(error.description)")
        status = .failure
    }
} catch {
    streams.error("lockbox ssh-agent: \(error.message)")
    streams.error("")
    streams.error(usage)
    status = .usage
}
exit(StandardOutput.exitStatus(status))
