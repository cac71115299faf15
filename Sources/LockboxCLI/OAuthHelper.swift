import FoundationEssentials
import LockboxCommandLine

#if canImport(Glibc)
import Glibc
#endif

/// The OAuth verbs (`login`, `token`, `logout`, `auth status`) run in `lockbox-oauth`, installed
/// beside `lockbox`. Keeping the HTTP stack (FoundationNetworking, libcurl, its TLS library) out
/// of this binary spares every keychain command the time to load it, which is most of a
/// process's start.
enum OAuthHelper {
    static let name = "lockbox-oauth"

    /// Replaces this process with `helper` (`lockbox-oauth`, or `lockbox-ssh-agent` for
    /// `lockbox ssh-agent`) and the arguments. Returns only when that fails, with the reason.
    static func exec(arguments: [String], helper name: String = name) -> String {
        let executable = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0]
        let directory = executable.lastIndex(of: "/").map { String(executable[..<$0]) } ?? "."
        let helper = directory + "/" + name
        guard access(helper, X_OK) == 0 else {
            return "This command runs \(name), which is not installed beside this lockbox (\(helper)). "
                + "Build it with `swift build -c release --product \(name)` and copy it next to lockbox."
        }
        var argv: [UnsafeMutablePointer<CChar>?] = ([helper] + arguments).map { strdup($0) }
        argv.append(nil)
        execv(helper, argv)
        let reason = String(cString: strerror(errno))
        for pointer in argv { free(pointer) }
        return "Starting \(helper) failed: \(reason)."
    }
}
