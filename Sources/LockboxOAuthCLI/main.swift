import CProcessHardening
import LockboxCommandLine

#if canImport(Glibc)
import Glibc
#endif

// Before anything opens a file or a socket: a standard descriptor left closed by the caller
// must not be taken by one (what the program prints or reads would go there).
_ = lockbox_reserve_standard_descriptors()

// `lockbox login`, `token`, `logout` and `auth status` run here: `lockbox` hands them over with
// the same arguments, so that only these verbs load the HTTP stack. Calling it directly works too.

guard let arguments = ProgramArguments.checked(program: "lockbox") else { exit(ExitStatus.usage.rawValue) }
// The broker, when one is used, identifies this process by its /proc files: connect before
// they are hidden below.
Invocation.prepareBroker(arguments)

// No core dumps and no same-user ptrace: this process holds tokens.
_ = lockbox_harden_process()

let streams = StandardStreams()
let status: ExitStatus
do {
    let invocation = try Parser.parse(arguments)
    switch invocation.command {
    case .help(let verb):
        streams.print(verb.flatMap(Help.text(for:)) ?? Help.overview)
        status = .success
    case .version:
        streams.print("lockbox-oauth 0.1.0")
        status = .success
    case let command where command.isAuthentication:
        status = await AuthCommands(invocation: invocation).run()
    default:
        streams.error("lockbox-oauth: this program runs only the OAuth commands (login, token, logout, auth status); run the others with `lockbox`.")
        status = .usage
    }
} catch {
    error.report(to: streams)
    status = .usage
}
exit(StandardOutput.exitStatus(status))
