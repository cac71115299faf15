import Foundation
import Lockbox
import VaultStorage

#if canImport(Glibc)
import Glibc
#endif

/// The leak campaign: canary secrets go through the whole lifecycle, error paths included, and
/// every place a secret could surface is searched for them: error messages, `description`,
/// `debugDescription` and `dump` of the types that hold secrets, the vault and its -wal file
/// after update, delete and checkpoint, backup files, the argv and environment of a running
/// `lockbox`, and the core dump a crashing `lockbox` would write (it must refuse to dump).
package enum LeakCampaign {
    package struct Report: Sendable {
        /// Every place searched, in order.
        package var checks: [String] = []
        /// Places where a canary was found.
        package var hits: [String] = []
        /// Expectations other than "no canary" that failed (e.g. the CLI was dumpable).
        package var failures: [String] = []
        /// What the environment allowed to check, for the record.
        package var notes: [String] = []

        package var summary: String {
            var lines = ["leak campaign: \(checks.count) places searched, \(hits.count) canary hits, \(failures.count) failed expectations"]
            for check in checks { lines.append("  - \(check)") }
            for note in notes { lines.append("  note: \(note)") }
            for hit in hits { lines.append("  HIT: \(hit)") }
            for failure in failures { lines.append("  FAILED: \(failure)") }
            return lines.joined(separator: "\n")
        }

        mutating func search(_ place: String, _ text: String, for canaries: [String]) {
            search(place, Array(text.utf8), for: canaries)
        }

        mutating func search(_ place: String, _ bytes: [UInt8], for canaries: [String]) {
            checks.append(place)
            for canary in canaries where bytes.contains(canary) {
                hits.append("\(place) contains \(canary)")
            }
        }

        mutating func searchFiles(_ place: String, in directory: String, for canaries: [String]) {
            let files = FileManager.default.enumerator(atPath: directory)?.allObjects.compactMap { $0 as? String } ?? []
            var bytes: [UInt8] = []
            for file in files { bytes += FileManager.default.contents(atPath: directory + "/" + file).map(Array.init) ?? [] }
            search("\(place) (\(files.count) files, \(bytes.count) bytes)", bytes, for: canaries)
        }
    }

    static func canary(_ tag: String) -> String { "CANARY-\(tag)-\(UInt64.random(in: 1_000_000_000...9_999_999_999))" }

    package static func run(lockbox: String, directory: String) throws -> Report {
        var report = Report()
        try library(directory: directory + "/library", report: &report)
        try commandLine(lockbox: lockbox, directory: directory + "/cli", report: &report)
        try coreDumps(lockbox: lockbox, report: &report)
        return report
    }

    // MARK: The library: errors, descriptions, files

    static func library(directory: String, report: inout Report) throws {
        let passphrase = canary("passphrase")
        let secret = canary("secret")
        let updated = canary("updated")
        let backupPassphrase = canary("backup-passphrase")
        let canaries = [passphrase, secret, updated, backupPassphrase]
        var configuration = Vault.Configuration()
        configuration.keyDerivation = .interactive
        configuration.device = DeviceIdentity(keyPath: directory + "/state/device-key")
        let vaultDirectory = directory + "/vault"
        let path = vaultDirectory + "/leaks.lockbox"
        let vault = try Vault.create(at: path, passphrase: SecretBytes(utf8: passphrase), configuration: configuration)
        defer { vault.lockAll() }

        let item = Item.genericPassword(service: "leaks", account: "alice", data: SecretBytes(utf8: secret))
        let update = ItemUpdate(data: SecretBytes(utf8: updated))
        var query = Query.genericPassword(service: "leaks", account: "alice")
        query.returning = [.data, .attributes]
        for (name, value) in [("SecretBytes", SecretBytes(utf8: secret) as Any), ("Item", item), ("ItemUpdate", update), ("Query", query)] {
            var dumped = ""
            dump(value, to: &dumped)
            report.search("\(name): description, debugDescription, dump", String(describing: value) + String(reflecting: value) + dumped, for: canaries)
        }

        try vault.add(item)
        var errors: [(String, LockboxError)] = []
        func attempt(_ name: String, _ body: () throws(LockboxError) -> Void) {
            do { try body() } catch { errors.append((name, error)) }
        }
        attempt("duplicate add") { () throws(LockboxError) in try vault.add(item) }
        attempt("wrong passphrase") { () throws(LockboxError) in try vault.unlock(passphrase: SecretBytes(utf8: secret)) }
        attempt("passphrase change with a wrong passphrase") { () throws(LockboxError) in
            try vault.changePassphrase(from: SecretBytes(utf8: updated), to: SecretBytes(utf8: secret))
        }
        attempt("value too large") { () throws(LockboxError) in
            try vault.add(.genericPassword(service: "leaks", account: "big", data: SecretBytes(utf8: String(repeating: secret, count: 10_000))))
        }
        attempt("restore with a wrong passphrase") { () throws(LockboxError) in
            _ = try vault.backup(to: directory + "/probe.lbx", passphrase: SecretBytes(utf8: backupPassphrase), replacing: true)
            _ = try vault.restore(from: directory + "/probe.lbx", passphrase: SecretBytes(utf8: secret))
        }
        for kind in [StorageFaults.Kind.diskFull, .ioError, .busy] {
            vault.injectFaults(StorageFaults(kind: kind, failingOperation: 2, persistent: true))
            attempt("update under an injected \(kind)") { () throws(LockboxError) in try vault.update(matching: query, to: update) }
            vault.injectFaults(nil)
        }
        try vault.update(matching: query, to: update)
        vault.lock()
        attempt("read while locked") { () throws(LockboxError) in _ = try vault.data(matching: query) }
        try vault.unlock(passphrase: SecretBytes(utf8: passphrase))
        for (name, error) in errors {
            var dumped = ""
            dump(error, to: &dumped)
            report.search("error (\(name)): message, description, dump", error.message + "\(error)" + String(reflecting: error) + dumped, for: canaries)
        }

        report.searchFiles("vault, -wal and -shm after add and update", in: vaultDirectory, for: canaries)
        let backup = directory + "/backup/leaks.lbx"
        try FileManager.default.createDirectory(atPath: directory + "/backup", withIntermediateDirectories: true)
        _ = try vault.backup(to: backup, passphrase: SecretBytes(utf8: backupPassphrase), replacing: true)
        report.searchFiles("backup file", in: directory + "/backup", for: canaries)
        try vault.delete(matching: .genericPassword(service: "leaks", account: "alice"))
        report.searchFiles("vault, -wal and -shm after delete", in: vaultDirectory, for: canaries)
        try vault.withDatabase { database throws(LockboxError) in try database.execute("PRAGMA wal_checkpoint(TRUNCATE)") }
        report.searchFiles("vault, -wal and -shm after delete and checkpoint", in: vaultDirectory, for: canaries)
        report.searchFiles("everything under the campaign's HOME-like tree", in: directory, for: canaries)
    }

    // MARK: The command line: argv, environment, output

    static func commandLine(lockbox: String, directory: String, report: inout Report) throws {
        let passphrase = canary("cli-passphrase")
        let secret = canary("cli-secret")
        let canaries = [passphrase, secret]
        let keychain = directory + "/vault/cli.lockbox"
        var environment = ProcessInfo.processInfo.environment
        environment["XDG_STATE_HOME"] = directory + "/state"
        environment["XDG_DATA_HOME"] = directory + "/data"

        let created = try Child.run(
            lockbox, ["--keychain", keychain, "init", "--kdf", "interactive", "--passphrase-stdin"],
            environment: environment, input: Array((passphrase + "\n").utf8))
        if created.status != 0 { report.failures.append("lockbox init failed: \(created.errors)") }
        report.search("lockbox init: stdout and stderr", created.output + created.errors, for: canaries)

        // A lockbox that is reading its passphrase and secret from a slow stdin: half of the
        // input is in, the rest has not come. Its argv and environment must hold neither.
        let child = try Child(
            lockbox, ["--keychain", keychain, "add-generic-password", "-s", "leaks", "-a", "alice"], environment: environment)
        child.write(Array(secret.utf8))
        // Once it runs lockbox (not a loader), give it time to read the half secret.
        let executable = URL(fileURLWithPath: lockbox).resolvingSymlinksInPath().path
        child.waitUntil { (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(child.pid)/exe")) == executable }
        usleep(200_000)
        report.search("argv of a running lockbox (/proc/PID/cmdline)", child.procFile("cmdline"), for: canaries)
        report.search("environment of a running lockbox (/proc/PID/environ)", child.procFile("environ"), for: canaries)
        child.closeInput()
        let added = child.wait()
        if added.status != 0 { report.failures.append("lockbox add-generic-password failed: \(added.errors)") }
        report.search("lockbox add-generic-password: stdout and stderr", added.output + added.errors, for: canaries)

        let found = try Child.run(
            lockbox, ["--keychain", keychain, "find-generic-password", "-s", "leaks", "-a", "alice", "-w"], environment: environment, input: [])
        if found.output != secret + "\n" { report.failures.append("lockbox find-generic-password did not return the secret: \(found.errors)") }
        for (name, arguments, input) in [
            ("duplicate add", ["add-generic-password", "-s", "leaks", "-a", "alice"], secret),
            ("unlock with a wrong passphrase", ["unlock", "--passphrase-stdin"], secret),
            ("a secret given as an argument", ["add-generic-password", "-s", "leaks", "-a", "bob", "-w", secret], ""),
            ("dump --json", ["dump", "--json"], passphrase),
            ("status", ["status"], ""),
        ] {
            let result = try Child.run(lockbox, ["--keychain", keychain] + arguments, environment: environment, input: Array(input.utf8))
            report.search("lockbox \(name): stdout and stderr", result.output + result.errors, for: canaries)
        }
        report.searchFiles("the CLI's vault and state files", in: directory, for: canaries)
        _ = try Child.run(lockbox, ["--keychain", keychain, "lock", "--all"], environment: environment, input: [])
    }

    // MARK: Core dumps

    /// A `lockbox` waiting on stdin, run as `nobody` with a core limit raised to unlimited,
    /// gets SIGSEGV or SIGABRT. It must be non-dumpable (its /proc entries owned by root), its
    /// memory unreadable by a peer of the same user, and it must leave no core file. A control
    /// (`sleep`, same wrapper) shows that this machine does write cores.
    static func coreDumps(lockbox: String, report: inout Report) throws {
        guard getuid() == 0, FileManager.default.isExecutableFile(atPath: "/usr/bin/setpriv") else {
            report.notes.append("core-dump checks need root and setpriv(1); skipped")
            return
        }
        let pattern = (try? String(contentsOfFile: "/proc/sys/kernel/core_pattern", encoding: .utf8))?
            .trimmingCharacters(in: .whitespacesAndNewlines) ?? "?"
        // Its own directory, writable by nobody (the campaign's directory is private to root).
        var template = Array("/tmp/lockbox-dumps-XXXXXX".utf8CString)
        guard template.withUnsafeMutableBufferPointer({ mkdtemp($0.baseAddress!) }) != nil else {
            throw LockboxError(.io, "mkdtemp failed")
        }
        let directory = String(cString: template.withUnsafeBufferPointer { $0.baseAddress! })
        defer { try? FileManager.default.removeItem(atPath: directory) }
        chmod(directory, 0o777)
        let nobody: UInt32 = 65534
        let wrapper = ["/usr/bin/setpriv", "--reuid=\(nobody)", "--regid=\(nobody)", "--clear-groups", "/bin/sh", "-c",
            "ulimit -c unlimited; cd \"$0\"; exec \"$@\"", directory]
        // A copy nobody can run wherever the build lives (a checkout under /root is not).
        let executable = directory + "/lockbox"
        try FileManager.default.copyItem(atPath: lockbox, toPath: executable)
        chmod(executable, 0o755)
        let passphrase = canary("dump-passphrase")
        var environment = ["HOME": directory, "XDG_STATE_HOME": directory + "/state", "LOCKBOX_UNLOCK_CACHE": "process",
            "PATH": "/usr/bin:/bin"]
        environment["XDG_DATA_HOME"] = directory + "/data"

        func cores() -> [String] {
            ((try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? []).filter { $0.hasPrefix("core") }
        }
        for file in cores() { unlink(directory + "/" + file) }

        // The control: the same wrapper and signal on a program that does not harden itself.
        let control = try Child(wrapper[0], Array(wrapper.dropFirst()) + ["/bin/sleep", "30"], environment: environment)
        usleep(200_000)
        kill(control.pid, SIGSEGV)
        let controlResult = control.wait()
        let controlCores = cores()
        report.notes.append(
            "core_pattern \(pattern); control (sleep, same wrapper, SIGSEGV): core dumped \(controlResult.coreDumped), core files \(controlCores.count)")
        for file in controlCores { unlink(directory + "/" + file) }

        // Swift's runtime catches crash signals to print a backtrace; a signal sent from outside
        // then does not always end the process. With the backtracer off, the signal's default
        // action (terminate and dump core) applies, and only the hardening stops the dump.
        for (signal, backtracer) in [(SIGSEGV, true), (SIGABRT, true), (SIGSEGV, false), (SIGABRT, false)] {
            let name = (signal == SIGSEGV ? "SIGSEGV" : "SIGABRT") + (backtracer ? "" : " (Swift backtracer off)")
            var childEnvironment = environment
            if !backtracer { childEnvironment["SWIFT_BACKTRACE"] = "enable=no" }
            let child = try Child(
                wrapper[0], Array(wrapper.dropFirst()) + [executable, "--keychain", directory + "/data/dump-\(signal)-\(backtracer).lockbox",
                    "init", "--kdf", "interactive", "--passphrase-stdin"], environment: childEnvironment)
            child.write(Array(passphrase.utf8))  // no newline: it waits for the rest
            // It hardens itself first thing in main; under load that can take a moment.
            var info = stat()
            child.waitUntil { stat("/proc/\(child.pid)/mem", &info) == 0 && info.st_uid == 0 }
            usleep(200_000)
            let status = child.procFile("status")
            let uidLine = String(decoding: status, as: UTF8.self).split(separator: "\n").first { $0.hasPrefix("Uid:") } ?? ""
            report.checks.append("lockbox (as nobody, waiting on stdin, \(name)) is non-dumpable: /proc/PID/mem owned by root")
            if stat("/proc/\(child.pid)/mem", &info) != 0 || info.st_uid != 0 || !uidLine.contains("\(nobody)") {
                report.failures.append("lockbox is dumpable: /proc/\(child.pid) owned by \(info.st_uid), \(uidLine)")
            }
            let peer = try Child.run(
                "/usr/bin/setpriv", ["--reuid=\(nobody)", "--regid=\(nobody)", "--clear-groups", "/bin/dd",
                    "if=/proc/\(child.pid)/mem", "bs=1", "count=1", "skip=4194304"], environment: environment, input: [])
            report.checks.append("a peer process of the same user cannot read lockbox's /proc/PID/mem or environ (\(name) run)")
            let peerEnviron = try Child.run(
                "/usr/bin/setpriv", ["--reuid=\(nobody)", "--regid=\(nobody)", "--clear-groups", "/bin/cat", "/proc/\(child.pid)/environ"],
                environment: environment, input: [])
            if peer.status == 0 || peerEnviron.status == 0 {
                report.failures.append("a peer read lockbox's memory (dd \(peer.status)) or environment (cat \(peerEnviron.status))")
            }
            kill(child.pid, signal)
            let result = child.wait()
            report.checks.append(
                "lockbox sent \(name) writes no core (it ended with \(result.signaled ? "signal \(-result.status)" : "exit status \(result.status)"), core flag \(result.coreDumped))")
            if result.coreDumped || !cores().isEmpty {
                report.failures.append("lockbox killed by \(name) dumped core (\(cores()))")
            }
            report.searchFiles("vault and state files left after lockbox was sent \(name)", in: directory + "/data", for: [passphrase])
        }
    }
}

/// A child process with pipes, started with posix_spawn so that its wait status (and the
/// core-dump bit in it) is ours to read.
final class Child {
    let pid: pid_t
    private var input: Int32
    private let outputFile: String
    private let errorFile: String

    struct Result {
        var status: Int32
        var signaled: Bool
        var coreDumped: Bool
        var output: String
        var errors: String
    }

    init(_ executable: String, _ arguments: [String], environment: [String: String]) throws {
        var fds: [Int32] = [0, 0]
        guard pipe(&fds) == 0 else { throw LockboxError(.io, "pipe failed") }
        let base = NSTemporaryDirectory() + "/lockbox-child-\(UInt64.random(in: 0...UInt64.max))"
        outputFile = base + ".out"
        errorFile = base + ".err"
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_adddup2(&actions, fds[0], 0)
        posix_spawn_file_actions_addclose(&actions, fds[1])
        posix_spawn_file_actions_addopen(&actions, 1, outputFile, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
        posix_spawn_file_actions_addopen(&actions, 2, errorFile, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
        let argv = ([executable] + arguments).map { strdup($0) } + [nil]
        let envp = environment.map { strdup("\($0.key)=\($0.value)") } + [nil]
        defer { (argv + envp).forEach { free($0) } }
        var pid: pid_t = 0
        let result = posix_spawn(&pid, executable, &actions, nil, argv, envp)
        close(fds[0])
        guard result == 0 else {
            close(fds[1])
            throw LockboxError(.io, "cannot start \(executable): \(String(cString: strerror(result)))")
        }
        self.pid = pid
        input = fds[1]
    }

    func write(_ bytes: [UInt8]) {
        _ = bytes.withUnsafeBytes { Glibc.write(input, $0.baseAddress, $0.count) }
    }

    func closeInput() {
        if input >= 0 { close(input) }
        input = -1
    }

    /// Polls `condition` every 10 ms for up to 20 s.
    func waitUntil(_ condition: () -> Bool) {
        for _ in 0..<2_000 where !condition() && !hasExited { usleep(10_000) }
    }

    /// True once the process is a zombie (it ended; not yet waited for).
    var hasExited: Bool {
        let stat = String(decoding: procFile("stat"), as: UTF8.self)
        guard let close = stat.lastIndex(of: ")") else { return true }
        return stat[stat.index(after: close)...].trimmingCharacters(in: .whitespaces).hasPrefix("Z")
    }

    func procFile(_ name: String) -> [UInt8] {
        FileManager.default.contents(atPath: "/proc/\(pid)/\(name)").map(Array.init) ?? []
    }

    func wait() -> Result {
        closeInput()
        var status: Int32 = 0
        while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
        let signaled = (status & 0x7f) != 0 && (status & 0x7f) != 0x7f
        let output = (try? String(contentsOfFile: outputFile, encoding: .utf8)) ?? ""
        let errors = (try? String(contentsOfFile: errorFile, encoding: .utf8)) ?? ""
        unlink(outputFile)
        unlink(errorFile)
        return Result(
            status: signaled ? -(status & 0x7f) : (status >> 8) & 0xff, signaled: signaled, coreDumped: signaled && (status & 0x80) != 0,
            output: output, errors: errors)
    }

    static func run(_ executable: String, _ arguments: [String], environment: [String: String], input: [UInt8]) throws -> Result {
        let child = try Child(executable, arguments, environment: environment)
        child.write(input)
        return child.wait()
    }
}

extension Array where Element == UInt8 {
    func contains(_ text: String) -> Bool {
        let needle = Array(text.utf8)
        guard !needle.isEmpty, count >= needle.count else { return false }
        for start in 0...(count - needle.count) where self[start] == needle[0] && self[start..<start + needle.count].elementsEqual(needle) {
            return true
        }
        return false
    }
}
