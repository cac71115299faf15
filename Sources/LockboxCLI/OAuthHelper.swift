import FoundationEssentials
import LockboxCommandLine

#if canImport(Glibc)
import Glibc
#endif

/// The OAuth verbs (`login`, `token`, `logout`, `auth status`) run in `lockbox-oauth`, and the
/// key verbs (`generate-key`, `sign`, `public-key`, `delete-key`, `enroll tpm2`, `unlock --tpm2`)
/// in `lockbox-keys`, both installed beside `lockbox`. Keeping the HTTP stack (FoundationNetworking,
/// libcurl, its TLS library), libcrypto and the tss2 libraries out of this binary spares every
/// keychain command the time to load them, which is most of a process's start.
enum OAuthHelper {
    static let name = "lockbox-oauth"
    static let keysName = "lockbox-keys"

    /// Replaces this process with the helper `name` and the same arguments. Returns only when
    /// that fails, with the reason.
    static func exec(_ name: String, arguments: [String]) -> String {
        let executable = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0]
        let directory = executable.lastIndex(of: "/").map { String(executable[..<$0]) } ?? "."
        let helper = directory + "/" + name
        guard access(helper, X_OK) == 0 else {
            return "These commands run \(name), which is not installed beside this lockbox (\(helper)). "
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
