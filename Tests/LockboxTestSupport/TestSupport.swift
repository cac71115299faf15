import CTestIsolation
import Foundation
import Lockbox
import Synchronization
import TPMAccess

#if canImport(Glibc)
import Glibc
#endif

/// A fresh private directory (mode 0700) per test, removed when the value goes away.
public final class TemporaryDirectory: @unchecked Sendable {
    public let path: String

    public init(_ label: String = "lockbox-test") {
        var template = Array("/tmp/\(label)-XXXXXX".utf8CString)
        let created = template.withUnsafeMutableBufferPointer { mkdtemp($0.baseAddress!) }
        precondition(created != nil, "mkdtemp failed")
        path = String(cString: template.withUnsafeBufferPointer { $0.baseAddress! })
        chmod(path, 0o700)
    }

    public func file(_ name: String) -> String { path + "/" + name }

    deinit {
        try? FileManager.default.removeItem(atPath: path)
    }
}

/// The temporary home every test process runs in (Tests/CTestIsolation): HOME and the XDG base
/// directories point into it from before `main`, and the programs tests start inherit them.
public enum TestHome {
    /// The temporary home.
    public static var path: String { String(cString: lockbox_test_home()) }
    /// HOME as the test process was started with it.
    public static var originalHome: String { String(cString: lockbox_test_original_home()) }
}

/// A reproducible source of random test data (SplitMix64). The seed comes from
/// `LOCKBOX_TEST_SEED` when set, else from the system; it is printed at creation, so a failure
/// seen once can be repeated with `LOCKBOX_TEST_SEED=N swift test --filter ...`. Put ``seed``
/// into assertion comments too.
public struct SeededGenerator: RandomNumberGenerator, Sendable {
    public let seed: UInt64
    private var state: UInt64

    /// - Parameter label: names the test in the printed line.
    public init(_ label: String, seed: UInt64? = nil) {
        let chosen = seed ?? ProcessInfo.processInfo.environment["LOCKBOX_TEST_SEED"].flatMap { UInt64($0) } ?? UInt64.random(in: 0...UInt64.max)
        self.seed = chosen
        state = chosen
        print("\(label): random seed \(chosen) (LOCKBOX_TEST_SEED=\(chosen) repeats it)")
    }

    public mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var mixed = state
        mixed = (mixed ^ (mixed >> 30)) &* 0xBF58_476D_1CE4_E5B9
        mixed = (mixed ^ (mixed >> 27)) &* 0x94D0_49BB_1331_11EB
        return mixed ^ (mixed >> 31)
    }

    /// `count` random bytes.
    public mutating func bytes(_ count: Int) -> [UInt8] {
        (0..<count).map { _ in UInt8.random(in: 0...255, using: &self) }
    }
}

/// A recognisable secret that tests then search for in files and output.
public func makeCanary(_ tag: String = "secret") -> String {
    "CANARY-\(tag)-\(UInt64.random(in: 1_000_000_000...9_999_999_999))"
}

/// A vault in its own temporary directory, created unlocked with fast Argon2id parameters.
/// The vault's keys are forgotten (as at reboot) when the value goes away.
public final class VaultFixture: @unchecked Sendable {
    public let directory: TemporaryDirectory
    public let path: String
    public let vault: Vault
    public let passphrase: SecretBytes
    public static let passphraseText = "correct horse battery staple"

    public init(configure: (inout Vault.Configuration) -> Void = { _ in }) throws {
        directory = TemporaryDirectory("lockbox-vault")
        path = directory.file("keychains/test.lockbox")
        passphrase = SecretBytes(utf8: Self.passphraseText)
        var configuration = Vault.Configuration()
        configuration.keyDerivation = .interactive
        // The device key stays the user's default, as for every other process of this user
        // (worker processes open the same vault); "another machine" tests set their own.
        configure(&configuration)
        vault = try Vault.create(at: path, passphrase: passphrase, configuration: configuration)
    }

    /// Another handle on the same file, as another process would open it.
    public func reopen(configure: (inout Vault.Configuration) -> Void = { _ in }) throws -> Vault {
        var configuration = vault.configuration
        configure(&configuration)
        return try Vault.open(at: path, configuration: configuration)
    }

    deinit {
        vault.lockAll()
    }
}

/// The OSStatus `body` throws (nil when it succeeds; 1 for an error that is not a LockboxError).
public func status(_ body: () throws -> Void) -> Int32? {
    do {
        try body()
        return nil
    } catch let error as LockboxError {
        return error.status
    } catch {
        return 1
    }
}

/// The result of running a program.
public struct ProcessResult: Sendable {
    public var status: Int32
    public var standardOutputBytes: [UInt8]
    public var standardErrorBytes: [UInt8]

    public var standardOutput: String { String(decoding: standardOutputBytes, as: UTF8.self) }
    public var standardError: String { String(decoding: standardErrorBytes, as: UTF8.self) }
}

/// Makes a write to a pipe whose reader has exited fail with EPIPE instead of killing the test
/// process with SIGPIPE: a child may exit before reading the input it was given.
public func ignoreBrokenPipes() {
    _ = brokenPipesIgnored
}

private let brokenPipesIgnored: Bool = {
    signal(SIGPIPE, SIG_IGN)
    return true
}()

/// Runs `executable` with `arguments`, feeding `input` on stdin, and waits for it; with a
/// `timeout`, kills it with SIGKILL when it outlives that many seconds.
public func run(
    _ executable: String, _ arguments: [String], input: [UInt8] = [], environment: [String: String]? = nil,
    directory: String? = nil, timeout: Double? = nil
) throws -> ProcessResult {
    ignoreBrokenPipes()
    var attempts = 0
    var launched: (process: Process, stdin: Pipe, stdout: Pipe, stderr: Pipe)
    while true {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = arguments
        if let environment { process.environment = environment }
        if let directory { process.currentDirectoryURL = URL(fileURLWithPath: directory) }
        let pipes = (stdin: Pipe(), stdout: Pipe(), stderr: Pipe())
        process.standardInput = pipes.stdin
        process.standardOutput = pipes.stdout
        process.standardError = pipes.stderr
        do {
            try process.run()
            launched = (process, pipes.stdin, pipes.stdout, pipes.stderr)
            break
        } catch where attempts < 50 && isTextFileBusy(error) {
            // An executable just copied (a test's application) whose copy's descriptor a child
            // another test forked at that moment still holds, until that child execs: tried
            // again shortly.
            attempts += 1
            usleep(20_000)
        }
    }
    let (process, stdin, stdout, stderr) = launched
    let pid = process.processIdentifier
    // A thread of its own: Dispatch's global pool, busy with the pipes below and other tests'
    // work on a small machine, can start a timer's work long after it is due.
    let finished = Mutex(false)
    if let timeout {
        Thread.detachNewThread {
            usleep(UInt32(timeout * 1_000_000))
            finished.withLock { done in if !done { kill(pid, SIGKILL) } }
        }
    }
    let writer = stdin.fileHandleForWriting
    DispatchQueue.global().async {
        // The child may exit without reading all of it (EPIPE): that is its business.
        try? writer.write(contentsOf: Data(input))
        try? writer.close()
    }
    // Read both pipes concurrently so neither fills up and blocks the child.
    let errorData = Mutex<Data>(Data())
    let group = DispatchGroup()
    group.enter()
    DispatchQueue.global().async {
        let data = stderr.fileHandleForReading.readDataToEndOfFile()
        errorData.withLock { $0 = data }
        group.leave()
    }
    let outputData = stdout.fileHandleForReading.readDataToEndOfFile()
    group.wait()
    process.waitUntilExit()
    finished.withLock { $0 = true }
    return ProcessResult(
        status: process.terminationStatus, standardOutputBytes: Array(outputData),
        standardErrorBytes: Array(errorData.withLock { $0 }))
}

/// Whether a launch failed because the executable is open for writing (`ETXTBSY`).
private func isTextFileBusy(_ error: any Error) -> Bool {
    let error = error as NSError
    if error.domain == NSPOSIXErrorDomain && error.code == Int(ETXTBSY) { return true }
    guard let underlying = error.userInfo[NSUnderlyingErrorKey] as? NSError else { return false }
    return underlying.domain == NSPOSIXErrorDomain && underlying.code == Int(ETXTBSY)
}

/// The path of a product built beside the test bundle (`.build/debug/NAME`).
public func builtProduct(_ name: String) -> String {
    let executable = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0]
    var directory = URL(fileURLWithPath: executable).deletingLastPathComponent()
    // The test runner may be inside a .xctest bundle directory.
    if directory.lastPathComponent.hasSuffix(".xctest") { directory.deleteLastPathComponent() }
    return directory.appendingPathComponent(name).path
}

/// Puts the SQLite file `copy` back at `path` as a restore does: the write-ahead log and shared
/// memory of the file it replaces removed, then `copy` renamed over `path` in one step. The path
/// never stops existing, so an unlock in another test running at the same time does not take the
/// vault for a deleted one and free its keys from the kernel keyring.
public func putBack(_ copy: String, at path: String) throws {
    for suffix in ["-wal", "-shm"] { try? FileManager.default.removeItem(atPath: path + suffix) }
    guard rename(copy, path) == 0 else {
        throw NSError(domain: NSPOSIXErrorDomain, code: Int(errno), userInfo: [NSFilePathErrorKey: path])
    }
}

/// Every file in `directory` (recursively) whose bytes contain `needle`.
public func filesContaining(_ needle: String, in directory: String) -> [String] {
    let bytes = Array(needle.utf8)
    var hits: [String] = []
    guard let enumerator = FileManager.default.enumerator(atPath: directory) else { return [] }
    while let relative = enumerator.nextObject() as? String {
        let path = directory + "/" + relative
        guard let data = FileManager.default.contents(atPath: path) else { continue }
        if contains(Array(data), bytes) { hits.append(path) }
    }
    return hits
}

public func contains(_ haystack: [UInt8], _ needle: [UInt8]) -> Bool {
    guard !needle.isEmpty, haystack.count >= needle.count else { return false }
    for start in 0...(haystack.count - needle.count) where haystack[start] == needle[0] {
        if Array(haystack[start..<start + needle.count]) == needle { return true }
    }
    return false
}

/// The software TPMs (swtpm) the hardware-key tests use, started by scripts/swtpm.
public enum TestTPM {
    /// The repository's root, from this file's place in it.
    public static let repositoryRoot: String = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        .deletingLastPathComponent().deletingLastPathComponent().path

    /// The TCTI of the swtpm that scripts/test starts (`LOCKBOX_TPM_TCTI`, else this checkout's
    /// scripts/swtpm instance). Throws, naming swtpm, when none is running.
    public static func shared() throws -> String {
        if let configured = ProcessInfo.processInfo.environment["LOCKBOX_TPM_TCTI"], !configured.isEmpty { return configured }
        let socket = repositoryRoot + "/.build/swtpm/socket"
        guard FileManager.default.fileExists(atPath: socket) else {
            throw TestPeerMissing(
                message: "no software TPM is running: the peer swtpm is started by `scripts/swtpm start` (scripts/test does it)")
        }
        return "swtpm:path=" + socket
    }
}

public struct TestPeerMissing: Error, CustomStringConvertible {
    public let message: String
    public var description: String { message }
}

/// A swtpm of the test's own (another machine's TPM, or one to kill), a child of the test
/// process, killed when the value goes away.
public final class PrivateTPM: @unchecked Sendable {
    public let directory = TemporaryDirectory("lockbox-tpm")
    public let device: String
    private let process = Process()

    public init() throws {
        let swtpm = "/usr/bin/swtpm"
        guard FileManager.default.isExecutableFile(atPath: swtpm) else {
            throw TestPeerMissing(message: "the test peer swtpm is not installed (scripts/swtpm start installs it)")
        }
        let state = directory.file("state")
        try FileManager.default.createDirectory(atPath: state, withIntermediateDirectories: true)
        let socket = directory.file("socket")
        process.executableURL = URL(fileURLWithPath: swtpm)
        process.arguments = [
            "socket", "--tpm2", "--tpmstate", "dir=" + state, "--server", "type=unixio,path=" + socket,
            "--ctrl", "type=unixio,path=" + socket + ".ctrl", "--flags", "not-need-init,startup-clear",
        ]
        process.standardInput = FileHandle.nullDevice
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        try process.run()
        for _ in 0..<100 where !FileManager.default.fileExists(atPath: socket) {
            usleep(50_000)
        }
        guard FileManager.default.fileExists(atPath: socket) else {
            throw TestPeerMissing(message: "swtpm did not start (no socket \(socket) after 5 s)")
        }
        device = "swtpm:path=" + socket
        // Its socket made, a swtpm on a loaded machine may not answer yet: a test that finds it
        // "not available" would test nothing it means to. Used once it answers.
        var ready = TPM.at(device).availability()
        for _ in 0..<150 where !ready.isAvailable {
            usleep(100_000)
            ready = TPM.at(device).availability()
        }
        guard ready.isAvailable else { throw TestPeerMissing(message: "swtpm started but does not answer after 15 s: \(ready.reason)") }
    }

    /// Kills the TPM at once, as a device that disappears.
    public func kill() {
        guard process.isRunning else { return }
        Glibc.kill(process.processIdentifier, SIGKILL)
        process.waitUntilExit()
    }

    deinit {
        kill()
    }
}

/// The test PostgreSQL's use by tests of several suites, which run in parallel: a test that
/// stops the server holds it exclusively, one whose processes must not see it stop holds it
/// shared. A `flock` of one file beside the server's state (a lock per open file, so two holders
/// in one process exclude each other as two processes would).
public enum TestDatabaseUse {
    /// Runs `body` with the server's use held shared (`exclusive`: alone).
    public static func holding<T>(exclusive: Bool = false, _ body: () throws -> T) throws -> T {
        let directory = ProcessInfo.processInfo.environment["LOCKBOX_POSTGRES_STATE"] ?? NSTemporaryDirectory()
        let descriptor = open(directory + "/lockbox-tests.lock", O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        guard descriptor >= 0 else { throw TestPeerMissing(message: "a lock file in \(directory) (errno \(errno))") }
        defer { close(descriptor) }
        while flock(descriptor, exclusive ? LOCK_EX : LOCK_SH) != 0 {
            guard errno == EINTR else { throw TestPeerMissing(message: "the lock of \(directory)/lockbox-tests.lock (errno \(errno))") }
        }
        return try body()
    }
}
