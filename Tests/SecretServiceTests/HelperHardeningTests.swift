import Foundation
import LockboxTestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// The credential helpers hold secrets while they wait on git or docker: like `lockbox`, they
/// must be out of reach of a same-user debugger and never leave a core file.
@Suite("credential helpers: process hardening")
struct HelperHardeningTests {
    /// The unprivileged user both the helper and its peer run as (root's CAP_SYS_PTRACE would
    /// read any process's memory).
    static let peer = ["--reuid=65534", "--regid=65534", "--clear-groups", "--"]

    @Test(
        "a helper waiting on stdin -> a same-user peer cannot read its memory, and no core is written",
        arguments: [("git-credential-lockbox", "get"), ("docker-credential-lockbox", "get")])
    func helperWaitingOnStandardInput_isNotReadableBySameUserPeer_andWritesNoCore(product: String, operation: String) throws {
        let built = try Paths.product(product)
        // A copy nobody can reach: the build directory may sit under a home only root enters.
        let directory = TemporaryDirectory("lockbox-hardening")
        chmod(directory.path, 0o755)
        let executable = directory.file(product)
        try FileManager.default.copyItem(atPath: built, toPath: executable)
        chmod(executable, 0o755)
        let setpriv = try Paths.tool("setpriv", package: "util-linux")
        let dd = try Paths.tool("dd", package: "coreutils")
        try #require(getuid() == 0, "this test switches to the user nobody with setpriv, which needs root")
        let process = Process()
        process.executableURL = URL(fileURLWithPath: setpriv)
        process.arguments = Self.peer + [executable, operation]
        let input = Pipe()
        process.standardInput = input
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        try process.run()
        let pid = process.processIdentifier
        defer {
            kill(pid, SIGKILL)
            try? input.fileHandleForWriting.close()
            process.waitUntilExit()
        }

        // Wait until the helper (setpriv execs it in place) sits in read(0, ...): it has
        // started and waits for the credential, the moment a peer would read its memory.
        let deadline = Date().addingTimeInterval(10)
        var waiting = false
        while Date() < deadline {
            let syscall = (try? String(contentsOfFile: "/proc/\(pid)/syscall", encoding: .utf8)) ?? ""
            let executable = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(pid)/exe")) ?? ""
            // x86_64 and aarch64 number read 0 and 63; the first argument is the descriptor.
            let fields = syscall.split(separator: " ")
            if executable.hasSuffix(product), fields.count > 1, ["0", "63"].contains(String(fields[0])), fields[1] == "0x0" {
                waiting = true
                break
            }
            usleep(10_000)
        }
        try #require(waiting, "\(product) did not start waiting on stdin within 10 s")

        // proc(5): a process that is not dumpable has its /proc files owned by root.
        let owner = try FileManager.default.attributesOfItem(atPath: "/proc/\(pid)/mem")[.ownerAccountID] as? Int
        #expect(owner == 0, "\(product)'s /proc files belong to uid \(owner.map(String.init) ?? "?"): it is dumpable")

        // The attack: the same user reads the helper's writable memory through /proc/<pid>/mem.
        let maps = try String(contentsOfFile: "/proc/\(pid)/maps", encoding: .utf8)
        let writable = try #require(
            maps.split(separator: "\n").first { $0.split(separator: " ").dropFirst().first?.hasPrefix("rw") == true })
        let start = try #require(UInt64(writable.prefix { $0 != "-" }, radix: 16))
        let read = try runProcess(
            setpriv, Self.peer + [dd, "if=/proc/\(pid)/mem", "bs=16", "count=1", "skip=\(start)", "iflag=skip_bytes"])
        #expect(read.status != 0, "a same-user peer read \(read.standardOutput.count) bytes of \(product)'s memory")
        #expect(read.standardOutput.isEmpty)

        let limits = try String(contentsOfFile: "/proc/\(pid)/limits", encoding: .utf8)
        let core = limits.split(separator: "\n").first { $0.hasPrefix("Max core file size") }
        let values = core?.split(separator: " ").dropFirst(4).prefix(2).map(String.init)
        #expect(values == ["0", "0"], "\(product): \(core ?? "no core limit line")")
    }
}
