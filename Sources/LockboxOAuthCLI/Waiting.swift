import Dispatch
import Foundation
import LockboxAuth
import LockboxCommandLine
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// Ctrl-C while the CLI waits for a person (the device approval, the browser's redirect).
enum Interrupt {
    /// Runs `operation`, cancelling it on SIGINT or SIGTERM (it then throws
    /// ``AuthError/Code/cancelled``, and the caller cleans up: a sign-in's new key is deleted),
    /// with `progress` drawn meanwhile. Waiting costs no CPU: the operation sleeps between
    /// polls and the signal arrives through a Dispatch source.
    /// `announcing` says that Ctrl-C cancels, once it does: a signal sent as soon as the words
    /// show (by a person or a script) is never met by the default action instead.
    static func cancelling<Success: Sendable>(
        progress: WaitingIndicator?, announcing: () -> Void = {}, _ operation: @escaping @Sendable () async throws(AuthError) -> Success
    ) async throws(AuthError) -> Success {
        let task = Task { () async throws -> Success in try await operation() }
        let caught = CaughtSignals([SIGINT, SIGTERM]) { _ in task.cancel() }
        announcing()
        let drawing = progress.map { progress in Task { await progress.draw() } }
        let result = await task.result
        drawing?.cancel()
        await drawing?.value
        caught.release()
        switch result {
        case .success(let value): return value
        case .failure(let error as AuthError): throw error
        case .failure: throw AuthError(.cancelled, "Cancelled.")
        }
    }

    /// Runs `operation` (a call that may refresh: `token`, `logout`) with SIGINT, SIGTERM and
    /// SIGHUP held off until it returns, then exits as that signal would have ended the process
    /// (status 128 + its number), printing nothing more. A refresh stopped after the server
    /// rotated the refresh token and before the new one was stored loses it: the stored one is
    /// already used, and presenting it again is a reuse the server answers by ending the session
    /// (Ctrl-C on a slow `lockbox token`, `timeout`, a job cancelled, a terminal closed all did).
    /// The wait is bounded by the request deadline.
    static func deferring<Success: Sendable>(
        output: StandardStreams, _ operation: () async throws(AuthError) -> Success
    ) async throws(AuthError) -> Success {
        let arrived = Mutex<Int32>(0)
        let caught = CaughtSignals([SIGINT, SIGTERM, SIGHUP]) { number in
            let first = arrived.withLock { received in
                defer { if received == 0 { received = number } }
                return received == 0
            }
            if first {
                output.error("lockbox: Stopping once the refresh in progress has stored its new token (stopping now would lose it, and sign you out).")
            }
        }
        let result: Result<Success, AuthError>
        do throws(AuthError) {
            result = .success(try await operation())
        } catch {
            result = .failure(error)
        }
        caught.release()
        let received = arrived.withLock { $0 }
        if received != 0 { exit(128 + received) }
        return try result.get()
    }

    /// Runs `operation` with SIGINT and SIGTERM ignored: a step that must not stop half-way.
    static func ignoring<Success: Sendable>(_ operation: () async throws(AuthError) -> Success) async throws(AuthError) -> Success {
        let previous = [SIGINT, SIGTERM].map { number in (number, signal(number, SIG_IGN)) }
        defer { for (number, handler) in previous { signal(number, handler) } }
        return try await operation()
    }
}

/// Signals caught through Dispatch sources while a call runs, each given back its disposition
/// afterwards. A signal the program was started with ignored (`nohup`, a background job of a
/// shell without job control) stays ignored and is not caught: before, it was caught anyway,
/// and left at its default action afterwards.
final class CaughtSignals: @unchecked Sendable {
    private let taken: [(number: Int32, previous: __sighandler_t?, source: any DispatchSourceSignal)]

    init(_ numbers: [Int32], _ handler: @escaping @Sendable (Int32) -> Void) {
        var taken: [(Int32, __sighandler_t?, any DispatchSourceSignal)] = []
        for number in numbers {
            let previous = signal(number, SIG_IGN)
            guard unsafeBitCast(previous, to: Int.self) != unsafeBitCast(SIG_IGN, to: Int.self) else { continue }
            let source = DispatchSource.makeSignalSource(signal: number, queue: .global())
            source.setEventHandler { handler(number) }
            source.resume()
            taken.append((number, previous, source))
        }
        self.taken = taken
    }

    /// Gives each signal back its disposition (a signal from now on acts as it did before),
    /// then stops the sources.
    func release() {
        for (number, previous, _) in taken { signal(number, previous) }
        for (_, _, source) in taken { source.cancel() }
    }
}

/// A spinner and the time left, on standard error when it is a terminal; nothing otherwise.
struct WaitingIndicator: Sendable {
    let deadline: Date

    init(until deadline: Date) {
        self.deadline = deadline
    }

    func draw() async {
        guard isatty(STDERR_FILENO) == 1 else { return }
        let frames = ["|", "/", "-", "\\"]
        var frame = 0
        while !Task.isCancelled {
            let left = max(0, Int(deadline.timeIntervalSinceNow))
            Self.write("\r\(frames[frame % frames.count]) waiting, \(left / 60):\(String(format: "%02d", left % 60)) left ")
            frame += 1
            do {
                try await Task.sleep(for: .milliseconds(500))
            } catch {
                break
            }
        }
        Self.write("\r" + String(repeating: " ", count: 30) + "\r")
    }

    private static func write(_ text: String) {
        var bytes = Array(text.utf8)
        bytes.withUnsafeMutableBytes { writeAll(UnsafeRawBufferPointer($0), to: STDERR_FILENO) }
    }
}

/// `lockbox login --browser`: the authorization code flow with PKCE, opened with `xdg-open`,
/// redirected to the library's listener on 127.0.0.1.
struct BrowserLogin {
    let output: StandardStreams

    /// Why the browser cannot be used here, or nil when it can.
    static func unavailableReason(_ configuration: ClientConfiguration) -> String? {
        if configuration.authorizationEndpoint == nil {
            return "The server offers no authorization endpoint for a browser sign-in"
        }
        let hasDisplay = ["DISPLAY", "WAYLAND_DISPLAY"].contains { (name: String) in getenv(name).map { $0.pointee != 0 } ?? false }
        if !hasDisplay {
            return "No display (DISPLAY and WAYLAND_DISPLAY are unset), so no browser can open"
        }
        if xdgOpen == nil {
            return "xdg-open is not installed (Debian package xdg-utils)"
        }
        return nil
    }

    static var xdgOpen: String? {
        let path = getenv("PATH").map { String(cString: $0) } ?? "/usr/bin:/bin"
        return path.split(separator: ":").map { "\($0)/xdg-open" }.first { access($0, X_OK) == 0 }
    }

    /// - Parameter dpop: the new session's proofs, for a configuration with DPoP turned on.
    func run(_ configuration: ClientConfiguration, dpop: DPoPProofFactory?) async throws(AuthError) -> TokenResponse {
        let session = try AuthorizationCodeFlow(configuration: configuration, dpop: dpop).start()
        let address = TerminalText.sanitized(session.authorizationURL.absoluteString)
        output.error("Opening the sign-in page in the browser. If it does not open, visit:\n  \(address)")
        if let failure = open(session.authorizationURL) {
            output.error("lockbox: \(failure); open the address above yourself.")
        }
        let timeout = Duration.seconds(300)
        let output = self.output
        let redirect = session.redirectURI
        return try await Interrupt.cancelling(
            progress: WaitingIndicator(until: Date().addingTimeInterval(300)),
            announcing: { output.error("Waiting for the browser to return to \(redirect) (5 min). Ctrl-C cancels.") }
        ) { () async throws(AuthError) in
            try await session.waitForTokens(timeout: timeout)
        }
    }

    /// Starts `xdg-open URL`; returns why it could not start, or nil. The URL holds the PKCE challenge
    /// and the state, never a token or a verifier.
    private func open(_ url: URL) -> String? {
        guard let xdgOpen = Self.xdgOpen else { return "xdg-open is not installed" }
        let process = Process()
        process.executableURL = URL(fileURLWithPath: xdgOpen)
        process.arguments = [url.absoluteString]
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        // Not awaited: xdg-open may only return once the browser is done with the page, and the
        // page's redirect needs this process's listener to answer.
        let output = self.output
        process.terminationHandler = { process in
            if process.terminationStatus != 0 {
                output.error("lockbox: xdg-open failed (exit \(process.terminationStatus)); open the address above yourself.")
            }
        }
        do {
            try process.run()
        } catch {
            return "xdg-open could not start"
        }
        return nil
    }
}
