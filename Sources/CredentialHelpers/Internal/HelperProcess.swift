#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Process plumbing shared by the helper executables.
public enum HelperProcess {
    /// Reads stdin to the end, retrying interrupted reads.
    public static func readStandardInput() -> [UInt8] {
        var input: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65536)
        defer { chunk.wipe() }
        while true {
            let count = chunk.withUnsafeMutableBytes { read(STDIN_FILENO, $0.baseAddress, $0.count) }
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

    /// Keeps secrets out of core dumps.
    public static func hardenProcess() {
        var limit = rlimit(rlim_cur: 0, rlim_max: 0)
        #if canImport(Glibc)
        _ = setrlimit(__rlimit_resource_t(RLIMIT_CORE.rawValue), &limit)
        #else
        _ = setrlimit(RLIMIT_CORE, &limit)
        #endif
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
