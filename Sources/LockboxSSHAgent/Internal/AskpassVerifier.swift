import Foundation
import LockboxCore

#if canImport(Glibc)
import Glibc
#endif

/// Asks for the passphrase through an `SSH_ASKPASS` program, as OpenSSH's tools do: the
/// program gets the prompt as its argument and prints the answer on standard output. A
/// non-zero exit or an empty answer is a cancel. The answer is read straight into guarded
/// memory and never passes through argv, the environment or a file.
package struct AskpassVerifier: PresenceVerifier {
    package let program: String
    static let limit = 4096

    package init(program: String) {
        self.program = program
    }

    package func passphrase(for request: AuthenticationRequest) throws(LockboxError) -> SecretBytes {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: program)
        process.arguments = ["Lockbox SSH agent: passphrase to \(request.reason)"]
        let output = Pipe()
        process.standardOutput = output
        process.standardInput = FileHandle.nullDevice
        do {
            try process.run()
        } catch {
            throw LockboxError(.interactionNotAllowed, "The SSH_ASKPASS program \(program) could not be started; set SSH_ASKPASS to a program that asks for a passphrase.")
        }
        let descriptor = output.fileHandleForReading.fileDescriptor
        var failed = false
        let answer = SecretBytes(capacity: Self.limit + 1) { buffer in
            var filled = 0
            while filled < buffer.count {
                let count = read(descriptor, buffer.baseAddress! + filled, buffer.count - filled)
                if count < 0 && errno == EINTR { continue }
                if count < 0 { failed = true }
                if count <= 0 { break }
                filled += count
            }
            // One trailing newline is the end of the answer, not part of it.
            if filled > 0 && buffer[filled - 1] == 0x0A { filled -= 1 }
            return filled
        }
        try? output.fileHandleForReading.close()
        process.waitUntilExit()
        guard !failed, answer.count <= Self.limit else {
            throw LockboxError(.param, "The SSH_ASKPASS program's answer could not be read or is over \(Self.limit) bytes.")
        }
        guard process.terminationReason == .exit, process.terminationStatus == 0, !answer.isEmpty else {
            throw LockboxError(.userCanceled, "Cancelled: the passphrase was not given.")
        }
        return answer
    }
}
