import Foundation
import Lockbox
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

// lockbox-broker-bench: a read through lockboxd against today's embedded read, in one run, beside
// gnome-keyring's Secret Service (a D-Bus round trip) and ssh-agent (a Unix-socket round trip)
// when they run (scripts/bench-broker starts both). Median (p50) and p99 in microseconds.
//
//   lockbox-broker-bench [--count N] [--reads N] [--clients N] [--process-runs N]

var count = 100_000
var reads = 20_000
var clients = 100
var processRuns = 30
var sshAgentSocket = ProcessInfo.processInfo.environment["SSH_AUTH_SOCK"]
var arguments = CommandLine.arguments.dropFirst().makeIterator()
while let argument = arguments.next() {
    switch argument {
    case "--count": count = arguments.next().flatMap { Int($0) } ?? count
    case "--reads": reads = arguments.next().flatMap { Int($0) } ?? reads
    case "--clients": clients = arguments.next().flatMap { Int($0) } ?? clients
    case "--process-runs": processRuns = arguments.next().flatMap { Int($0) } ?? processRuns
    case "--ssh-agent": sshAgentSocket = arguments.next()
    default:
        FileHandle.standardError.write(Data("usage: lockbox-broker-bench [--count N] [--reads N] [--clients N] [--process-runs N] [--ssh-agent SOCKET]\n".utf8))
        exit(64)
    }
}

func nanoseconds() -> UInt64 {
    var time = timespec()
    clock_gettime(CLOCK_MONOTONIC, &time)
    return UInt64(time.tv_sec) * 1_000_000_000 + UInt64(time.tv_nsec)
}

func percentile(_ samples: [UInt64], _ fraction: Double) -> Double {
    guard !samples.isEmpty else { return .nan }
    let sorted = samples.sorted()
    return Double(sorted[min(sorted.count - 1, Int(Double(sorted.count) * fraction))]) / 1000
}

func line(_ name: String, _ samples: [UInt64], note: String = "") {
    print(String(format: "%-58@ p50 %9.1f µs   p99 %9.1f µs  %@", name as NSString, percentile(samples, 0.5), percentile(samples, 0.99), note as NSString))
}

func timed(_ rounds: Int, _ body: (Int) throws -> Void) rethrows -> [UInt64] {
    var samples: [UInt64] = []
    samples.reserveCapacity(rounds)
    for round in 0..<rounds {
        let start = nanoseconds()
        try body(round)
        samples.append(nanoseconds() - start)
    }
    return samples
}

func sibling(_ name: String) -> String {
    URL(fileURLWithPath: (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0])
        .deletingLastPathComponent().appendingPathComponent(name).path
}

/// Runs a program to its end with `posix_spawn` and `waitpid`: Foundation's `Process` waits in
/// steps of about 50 ms on Linux, which would hide a process's real time.
func runProcess(_ path: String, _ arguments: [String], environment: [String: String]) throws -> Int32 {
    var actions = posix_spawn_file_actions_t()
    posix_spawn_file_actions_init(&actions)
    defer { posix_spawn_file_actions_destroy(&actions) }
    for descriptor in [STDOUT_FILENO, STDERR_FILENO] {
        posix_spawn_file_actions_addopen(&actions, descriptor, "/dev/null", O_WRONLY, 0)
    }
    let argv = ([path] + arguments).map { strdup($0) } + [nil]
    let envp = environment.map { strdup("\($0.key)=\($0.value)") } + [nil]
    defer { for pointer in argv + envp { free(pointer) } }
    var pid: pid_t = 0
    let result = posix_spawn(&pid, path, &actions, nil, argv, envp)
    guard result == 0 else { throw POSIXError(POSIXErrorCode(rawValue: result) ?? .EIO) }
    var status: Int32 = 0
    while waitpid(pid, &status, 0) < 0 {
        guard errno == EINTR else { throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO) }
    }
    // The exit code of a normal exit, or 128 plus the signal that ended it.
    return status & 0x7f == 0 ? (status >> 8) & 0xff : 128 + (status & 0x7f)
}

let service = "bench.example.com"
func value(_ index: Int) -> SecretBytes { SecretBytes(utf8: "secret-value-\(index)-0123456789abcdef") }
func query(_ index: Int) -> Query { .genericPassword(service: service, account: "user\(index)") }

do {
    let work = NSTemporaryDirectory() + "lockbox-broker-bench-\(getpid())"
    try FileManager.default.createDirectory(atPath: work + "/run", withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
    chmod(work, 0o700)
    defer { try? FileManager.default.removeItem(atPath: work) }
    let path = work + "/vault/bench.lockbox"
    let socketPath = work + "/run/lockboxd.sock"
    let passphrase = SecretBytes(utf8: "bench passphrase")
    var configuration = Vault.Configuration()
    configuration.keyDerivation = .interactive
    print("lockbox-broker-bench: \(count) items, \(reads) reads each, \(clients) concurrent clients, \(processRuns) process runs")
    let populateStart = nanoseconds()
    do {
        let vault = try Vault.create(at: path, passphrase: passphrase, configuration: configuration)
        var batch: [Item] = []
        for index in 0..<count {
            batch.append(.genericPassword(service: service, account: "user\(index)", data: value(index)))
            if batch.count == 5_000 {
                try vault.add(contentsOf: batch)
                batch.removeAll(keepingCapacity: true)
            }
        }
        try vault.add(contentsOf: batch)

        // Today's embedded read, in process (kernel-keyring unlock cache, the default).
        var generator = SystemRandomNumberGenerator()
        let embedded = try timed(reads) { _ in _ = try vault.data(matching: query(Int.random(in: 0..<count, using: &generator))) }
        print(String(format: "(populated in %.1f s)", Double(nanoseconds() - populateStart) / 1e9))
        line("embedded vault, read in process", embedded)

        // Today's embedded read as a new `lockbox` process.
        var environment = ProcessInfo.processInfo.environment
        environment["LOCKBOX_KEYCHAIN"] = path
        environment["LOCKBOX_BROKER"] = "0"
        let lockbox = sibling("lockbox")
        let embeddedProcess = try timed(processRuns) { round in
            let status = try runProcess(lockbox, ["find-generic-password", "-s", service, "-a", "user\(round)", "-w"], environment: environment)
            precondition(status == 0, "lockbox (embedded) failed with status \(status)")
        }
        line("embedded vault, read as a new `lockbox` process", embeddedProcess)
        vault.lockAll()
    }

    // The broker.
    let started = try runProcess(
        sibling("lockboxd"), ["--detach", "--socket", socketPath, "--keychain", path, "--access", "user"],
        environment: ProcessInfo.processInfo.environment)
    precondition(started == 0, "lockboxd did not start")
    let store = try BrokerStore.connect(socketPath: socketPath, vaultPath: path, startOnDemand: false)
    defer { kill(store.brokerProcessIdentifier, SIGTERM) }
    try store.unlock(passphrase: passphrase)
    var generator = SystemRandomNumberGenerator()
    let brokered = try timed(reads) { _ in _ = try store.data(matching: query(Int.random(in: 0..<count, using: &generator))) }
    line("broker, read in process (target p50 60 µs)", brokered)

    var environment = ProcessInfo.processInfo.environment
    environment["LOCKBOX_KEYCHAIN"] = path
    environment["LOCKBOX_BROKER"] = "1"
    environment["LOCKBOX_BROKER_SOCKET"] = socketPath
    let lockbox = sibling("lockbox")
    let brokerProcess = try timed(processRuns) { round in
        let status = try runProcess(lockbox, ["find-generic-password", "-s", service, "-a", "user\(round)", "-w"], environment: environment)
        precondition(status == 0, "lockbox (broker) failed with status \(status)")
    }
    line("broker, read as a new `lockbox` process", brokerProcess)

    // Concurrent clients: each its own connection, reading at once.
    let failures = Atomic<Int>(0)
    let samples = Mutex<[UInt64]>([])
    let readsPerClient = 100
    let group = DispatchGroup()
    let itemCount = count
    let wallStart = nanoseconds()
    for client in 0..<clients {
        group.enter()
        Thread {
            defer { group.leave() }
            guard let own = try? BrokerStore.connect(socketPath: socketPath, vaultPath: path, startOnDemand: false) else {
                failures.add(1, ordering: .relaxed)
                return
            }
            var local: [UInt64] = []
            for round in 0..<readsPerClient {
                let start = nanoseconds()
                if (try? own.data(matching: query((client * readsPerClient + round) % itemCount))) == nil { failures.add(1, ordering: .relaxed) }
                local.append(nanoseconds() - start)
            }
            samples.withLock { $0 += local }
        }.start()
    }
    group.wait()
    let wall = Double(nanoseconds() - wallStart) / 1e9
    line(
        "broker, \(clients) concurrent clients x \(readsPerClient) reads", samples.withLock { $0 },
        note: String(format: "%d errors, %.0f reads/s", failures.load(ordering: .relaxed), Double(clients * readsPerClient) / wall))

    // The peers, when they run here.
    if let agent = sshAgentSocket, !agent.isEmpty {
        let descriptor = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            let bytes = Array(agent.utf8)
            raw.copyBytes(from: bytes)
            raw[bytes.count] = 0
        }
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(descriptor, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        if connected == 0 {
            // SSH_AGENTC_REQUEST_IDENTITIES: one request, one answer.
            let request: [UInt8] = [0, 0, 0, 1, 11]
            var buffer = [UInt8](repeating: 0, count: 65536)
            let agentSamples = timed(reads) { _ in
                _ = request.withUnsafeBytes { send(descriptor, $0.baseAddress, $0.count, 0) }
                var header = [UInt8](repeating: 0, count: 4)
                _ = header.withUnsafeMutableBytes { recv(descriptor, $0.baseAddress, 4, Int32(MSG_WAITALL)) }
                let length = Int(header[0]) << 24 | Int(header[1]) << 16 | Int(header[2]) << 8 | Int(header[3])
                _ = buffer.withUnsafeMutableBytes { recv(descriptor, $0.baseAddress, min(length, 65536), Int32(MSG_WAITALL)) }
            }
            line("ssh-agent, list identities (socket round trip)", agentSamples)
        }
        close(descriptor)
    } else {
        print("ssh-agent: not measured (SSH_AUTH_SOCK is not set; scripts/bench-broker starts one)")
    }
    if ProcessInfo.processInfo.environment["DBUS_SESSION_BUS_ADDRESS"] != nil {
        let secretService = try Keychain.open(Keychain.Options(backend: .secretService)).store
        _ = try? secretService.delete(matching: .genericPassword(service: "lockbox-broker-bench"))
        try secretService.add(.genericPassword(service: "lockbox-broker-bench", account: "a", data: value(0)))
        let dbus = try timed(min(reads, 2_000)) { _ in
            _ = try secretService.data(matching: .genericPassword(service: "lockbox-broker-bench", account: "a"))
        }
        line("gnome-keyring Secret Service, read in process (D-Bus)", dbus)
        _ = try? secretService.delete(matching: .genericPassword(service: "lockbox-broker-bench"))
    } else {
        print("Secret Service: not measured (no D-Bus session; scripts/bench-broker runs one)")
    }
} catch {
    FileHandle.standardError.write(Data("lockbox-broker-bench: \(error)\n".utf8))
    exit(1)
}
