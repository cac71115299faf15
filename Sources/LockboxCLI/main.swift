import CProcessHardening
import Lockbox
import LockboxCommandLine

#if canImport(Glibc)
import Glibc
#endif

// Before anything opens a file or a socket: a standard descriptor left closed by the caller
// must not be taken by one (what the program prints or reads would go there).
_ = lockbox_reserve_standard_descriptors()

guard let arguments = ProgramArguments.checked(program: "lockbox") else { exit(ExitStatus.usage.rawValue) }
// The broker, when one is used, identifies this process by its /proc files: connect before
// they are hidden below. (Parsing reads no secret; the run parses again.)
if let early = try? Parser.parse(arguments), !early.command.isAuthentication, !early.command.usesKeys {
    if case .brokerControl = early.command {
        BrokerControl.connectEarly()
    } else {
        early.prepareBroker()
    }
}

// No core dumps and no same-user ptrace: this process holds secrets.
_ = lockbox_harden_process()

let streams = StandardStreams()
let status: ExitStatus
do {
    let invocation = try Parser.parse(arguments)
    // A DPoP proof needs the session's key: only `lockbox-oauth` makes one.
    if case .token(let issuer, let clientID, nil) = invocation.command,
        SharedAccessToken.answer(issuer: issuer, clientID: clientID, options: Runner(invocation: invocation).keychainOptions())
    {
        status = .success
    } else if invocation.command.isAuthentication {
        streams.error("lockbox: \(OAuthHelper.exec(OAuthHelper.name, arguments: arguments))")
        status = .failure
    } else if invocation.command.usesKeys {
        streams.error("lockbox: \(OAuthHelper.exec(OAuthHelper.keysName, arguments: arguments))")
        status = .failure
    } else if case .sync = invocation.command,
        let backend = invocation.backend ?? (try? Keychain.backend(environmentValue: getenv("LOCKBOX_BACKEND").map { String(cString: $0) })) ?? nil,
        backend == .secretService
    {
        // Sync reads and writes the vault's own rows (the broker serves the same file); the
        // desktop keychain is another store.
        streams.error("lockbox: sync works on the vault, not on the secret-service backend; choose the vault or leave out --backend (and LOCKBOX_BACKEND)")
        status = .usage
    } else if case .sync(let syncArguments) = invocation.command {
        let keychain = invocation.keychain.map { ["--keychain", $0] } ?? []
        streams.error("lockbox: \(OAuthHelper.exec("lockbox-sync", arguments: keychain + syncArguments))")
        status = .failure
    } else if case .sshAgent(let agentArguments) = invocation.command {
        let keychain = invocation.keychain.map { ["--keychain", $0] } ?? []
        streams.error("lockbox: \(OAuthHelper.exec("lockbox-ssh-agent", arguments: keychain + agentArguments))")
        status = .failure
    } else {
        do {
            status = try Runner(invocation: invocation).run()
        } catch {
            streams.error("lockbox: \(error.description)")
            status = error.code == .itemNotFound ? .itemNotFound : .failure
        }
    }
} catch {
    error.report(to: streams)
    status = .usage
}
exit(StandardOutput.exitStatus(status))
