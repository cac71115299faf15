import Lockbox

#if canImport(Glibc)
import Glibc
#endif

/// Reads secrets from stdin or the terminal straight into guarded memory. Secrets never come
/// from argv or the environment.
package enum SecretInput {
    /// The longest passphrase accepted, in bytes.
    package static let passphraseLimit = 4096

    /// Reads all of `descriptor` (up to `limit` bytes). `what` names the input in errors ("the
    /// message to sign", say; a secret by default).
    package static func readAll(_ descriptor: Int32 = STDIN_FILENO, limit: Int, what: String = "The secret") throws(LockboxError) -> SecretBytes {
        var failure: LockboxError?
        let bytes = SecretBytes(capacity: limit + 1) { buffer in
            var filled = 0
            while filled < buffer.count {
                let count = read(descriptor, buffer.baseAddress! + filled, buffer.count - filled)
                if count == 0 { break }
                if count < 0 {
                    if errno == EINTR { continue }
                    failure = LockboxError(.io, "Reading \(what.prefix(1).lowercased() + what.dropFirst()) from standard input failed.")
                    return 0
                }
                filled += count
            }
            return filled
        }
        if let failure { throw failure }
        guard bytes.count <= limit else {
            throw LockboxError(.param, "\(what) on standard input is over the limit of \(limit) bytes.")
        }
        return bytes
    }

    /// The bytes before the first newline of `input`, and the rest. A trailing `\r` is dropped.
    package static func splitLine(_ input: SecretBytes) -> (line: SecretBytes, rest: SecretBytes) {
        input.withUnsafeBytes { bytes in
            let newline = bytes.firstIndex(of: 0x0A)
            var end = newline ?? bytes.count
            if end > 0 && bytes[end - 1] == 0x0D { end -= 1 }
            let line = SecretBytes(copying: UnsafeRawBufferPointer(rebasing: bytes[0..<end]))
            let restStart = newline.map { $0 + 1 } ?? bytes.count
            let rest = SecretBytes(copying: UnsafeRawBufferPointer(rebasing: bytes[restStart...]))
            return (line, rest)
        }
    }

    /// `input` without one trailing newline, `\n` or `\r\n` (what `echo secret |` adds),
    /// and nothing else: not a second newline, not a lone `\r`. The text rule for secrets on
    /// standard input, as `docker login --password-stdin` has it; `--raw` skips it.
    package static func trimmingTrailingNewline(_ input: SecretBytes) -> SecretBytes {
        input.withUnsafeBytes { bytes in
            var end = bytes.count
            guard end > 0 && bytes[end - 1] == 0x0A else { return input }
            end -= 1
            if end > 0 && bytes[end - 1] == 0x0D { end -= 1 }
            return SecretBytes(copying: UnsafeRawBufferPointer(rebasing: bytes[0..<end]))
        }
    }

    /// A secret from standard input, at most `limit` bytes once read: as text (one trailing
    /// `\n` or `\r\n` removed), or with `raw` every byte as it came.
    package static func readSecret(raw: Bool, limit: Int) throws(LockboxError) -> SecretBytes {
        // Text may carry the two newline bytes beyond the limit (which the error states as is).
        let input: SecretBytes
        do {
            input = try readAll(limit: raw ? limit : limit + 2)
        } catch where error.code == .param {
            throw LockboxError(.param, "The secret on standard input is over the limit of \(limit) bytes.")
        }
        let secret = raw ? input : trimmingTrailingNewline(input)
        guard secret.count <= limit else {
            throw LockboxError(.param, "The secret on standard input is over the limit of \(limit) bytes.")
        }
        return secret
    }

    package static var standardInputIsTerminal: Bool { isatty(STDIN_FILENO) == 1 }

    /// Asks for a new secret typed without echo a second time ("Repeat it: "), so that a typo
    /// is not kept: returns `first` when both match.
    /// - Throws: `errSecParam` with `mismatch` when they differ.
    package static func repeated(_ first: SecretBytes, limit: Int, mismatch: String) throws(LockboxError) -> SecretBytes {
        let second = try prompt("Repeat it: ", limit: limit)
        guard first == second else { throw LockboxError(.param, mismatch) }
        return first
    }

    /// Asks on the controlling terminal with echo off.
    package static func prompt(_ text: String, limit: Int = 64 * 1024) throws(LockboxError) -> SecretBytes {
        let terminal = open("/dev/tty", O_RDWR | O_CLOEXEC)
        guard terminal >= 0 else {
            throw LockboxError(
                .notAvailable,
                "There is no terminal to ask for the secret on. Pipe it on standard input instead.")
        }
        defer { close(terminal) }
        // Echo goes off before the prompt shows: TCSAFLUSH drops input typed before it, so
        // an answer typed after the prompt is never lost, nor echoed.
        var original = termios()
        let haveAttributes = tcgetattr(terminal, &original) == 0
        if haveAttributes {
            var silent = original
            silent.c_lflag &= ~tcflag_t(ECHO)
            tcsetattr(terminal, TCSAFLUSH, &silent)
        }
        _ = text.withCString { write(terminal, $0, strlen($0)) }
        defer {
            if haveAttributes { tcsetattr(terminal, TCSAFLUSH, &original) }
            _ = write(terminal, "\n", 1)
        }
        return SecretBytes(capacity: limit) { buffer in
            var filled = 0
            while filled < buffer.count {
                var byte: UInt8 = 0
                let count = read(terminal, &byte, 1)
                if count < 0 && errno == EINTR { continue }
                if count <= 0 || byte == 0x0A { break }
                buffer[filled] = byte
                filled += 1
            }
            return filled
        }
    }

    /// Writes a secret, and unless `newline` is false a newline, to stdout without making a
    /// `String` of it.
    package static func writeToStandardOutput(_ secret: SecretBytes, newline: Bool = true) {
        secret.withUnsafeBytes { writeAll($0, to: STDOUT_FILENO) }
        if newline { _ = write(STDOUT_FILENO, "\n", 1) }
    }

    /// Asks on the terminal whether to go on; true only for an answer of "yes".
    package static func confirm(_ question: String) throws(LockboxError) -> Bool {
        let terminal = open("/dev/tty", O_RDWR | O_CLOEXEC)
        guard terminal >= 0 else {
            throw LockboxError(.notAvailable, "There is no terminal to confirm on. Pass --yes to confirm.")
        }
        defer { close(terminal) }
        _ = question.withCString { write(terminal, $0, strlen($0)) }
        var answer: [UInt8] = []
        while answer.count < 16 {
            var byte: UInt8 = 0
            let count = read(terminal, &byte, 1)
            if count < 0 && errno == EINTR { continue }
            if count <= 0 || byte == 0x0A { break }
            answer.append(byte)
        }
        if answer.last == 0x0D { answer.removeLast() }
        return answer == Array("yes".utf8)
    }
}
