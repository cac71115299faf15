import CProcessHardening
import Lockbox
import LockboxCommandLine

#if canImport(Glibc)
import Glibc
#endif

// No core dumps and no same-user ptrace: this process holds secrets.
_ = lockbox_harden_process()

let streams = StandardStreams()
let arguments = Array(CommandLine.arguments.dropFirst())
let status: ExitStatus
do {
    let invocation = try Parser.parse(arguments)
    if case .token(let issuer, let clientID) = invocation.command,
        SharedAccessToken.answer(issuer: issuer, clientID: clientID, options: Runner(invocation: invocation).keychainOptions())
    {
        status = .success
    } else if invocation.command.isAuthentication {
        streams.error("lockbox: \(OAuthHelper.exec(OAuthHelper.name, arguments: arguments))")
        status = .failure
    } else if invocation.command.usesKeys {
        streams.error("lockbox: \(OAuthHelper.exec(OAuthHelper.keysName, arguments: arguments))")
        status = .failure
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
exit(status.rawValue)
