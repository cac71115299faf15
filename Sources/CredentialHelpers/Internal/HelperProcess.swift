#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
import CProcessHardening

/// Process plumbing shared by the helper executables.
public enum HelperProcess {
    /// Opens a placeholder on each standard descriptor left closed, before anything opens a file
    /// or a socket that could take its number (and receive what the helper prints, a secret).
    public static func reserveStandardDescriptors() {
        _ = lockbox_reserve_standard_descriptors()
    }

    /// Reads stdin to the end, or to one byte past `limit` (so that the parser sees input
    /// over its bound and refuses it, while memory stays bounded); retries interrupted reads.
    public static func readStandardInput(limit: Int) -> [UInt8] {
        var input: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65536)
        defer { chunk.wipe() }
        while input.count <= limit {
            let wanted = Swift.min(chunk.count, limit + 1 - input.count)
            let count = chunk.withUnsafeMutableBytes { read(STDIN_FILENO, $0.baseAddress, wanted) }
            if count > 0 {
                input.append(contentsOf: chunk[0..<count])
            } else if count < 0 && errno == EINTR {
                continue
            } else {
                break
            }
        }
        return input
    }

    /// Writes the outcome, wipes its bytes and exits with its status.
    public static func finish(_ outcome: HelperOutcome) -> Never {
        var outcome = outcome
        writeAll(STDOUT_FILENO, outcome.standardOutput)
        outcome.wipe()
        if !outcome.standardError.isEmpty {
            writeAll(STDERR_FILENO, Array((outcome.standardError + "\n").utf8))
        }
        exit(outcome.exitStatus)
    }

    /// Keeps secrets out of core dumps and out of reach of same-user debuggers, as `lockbox`
    /// does: `PR_SET_DUMPABLE` 0 (no ptrace attach, no `/proc/<pid>/mem` for peers of the same
    /// user) and `RLIMIT_CORE` 0. Call it first, before any secret is read.
    /// - Returns: false when the kernel refused either step; the helper must then not go on.
    public static func hardenProcess() -> Bool {
        lockbox_harden_process() == 0 && lockbox_process_is_dumpable() == 0
    }

    private static func writeAll(_ descriptor: Int32, _ bytes: [UInt8]) {
        var offset = 0
        while offset < bytes.count {
            let written = bytes[offset...].withUnsafeBytes { write(descriptor, $0.baseAddress, $0.count) }
            if written > 0 {
                offset += written
            } else if written < 0 && errno == EINTR {
                continue
            } else {
                return
            }
        }
    }
}
