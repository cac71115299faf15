import CProcessHardening
import Lockbox
import LockboxCommandLine

#if canImport(Glibc)
import Glibc
#endif

// No core dumps and no same-user ptrace: this process holds secrets.
_ = lockbox_harden_process()

let streams = StandardStreams()
let status: ExitStatus
do {
    let invocation = try Parser.parse(Array(CommandLine.arguments.dropFirst()))
    do {
        if invocation.command.isAuthentication {
            status = await AuthCommands(invocation: invocation).run()
        } else {
            status = try Runner(invocation: invocation).run()
        }
    } catch {
        streams.error("lockbox: \(error.description)")
        status = error.code == .itemNotFound ? .itemNotFound : .failure
    }
} catch {
    streams.error("lockbox: \(error.message)")
    streams.error("")
    streams.error(error.verb.flatMap(Help.text(for:)) ?? Help.overview)
    status = .usage
}
exit(status.rawValue)
