import CProcessHardening
import Lockbox
import LockboxBroker
import LockboxBrokerIdentity
import LockboxCore

#if canImport(Glibc)
import Glibc
#endif

// Before anything opens a file or a socket: a standard descriptor left closed by the caller
// must not be taken by one (what the program prints or reads would go there).
_ = lockbox_reserve_standard_descriptors()

// lockboxd: the per-user broker. It keeps the vault's unlocked keys in its own locked,
// non-dumpable memory and serves the item store over a socket in $XDG_RUNTIME_DIR/lockbox/.
//
//     lockboxd [--socket PATH] [--keychain PATH] [--idle-exit SECONDS] [--access executable|user] [--maximum-value-size BYTES] [--detach]

func fail(_ message: String, status: Int32 = 1) -> Never {
    let text = "lockboxd: \(message)\n"
    _ = text.withCString { write(STDERR_FILENO, $0, strlen($0)) }
    exit(status)
}

// Before anything is read: no core dumps, no ptrace attach, no /proc/PID/mem for the user's
// other processes.
guard lockbox_harden_process() == 0, lockbox_process_is_dumpable() == 0 else {
    fail("the kernel refused to make this process non-dumpable (PR_SET_DUMPABLE); it does not hold keys without that.")
}
// A starter's blocked signals are inherited: unblock them, so that SIGTERM stops the broker.
var noSignals = sigset_t()
sigemptyset(&noSignals)
sigprocmask(SIG_SETMASK, &noSignals, nil)
signal(SIGTERM, SIG_DFL)
signal(SIGPIPE, SIG_IGN)

var socketPath: String?
var vaultPath: String?
var idleExit: Duration?
var detach = false
var access = "executable"
var maximumValueSize: Int?
var arguments = CommandLine.arguments.dropFirst()
while let argument = arguments.popFirst() {
    switch argument {
    case "--socket":
        guard let value = arguments.popFirst() else { fail("--socket needs a path", status: 64) }
        socketPath = value
    case "--keychain":
        guard let value = arguments.popFirst() else { fail("--keychain needs a path", status: 64) }
        vaultPath = value
    case "--idle-exit":
        guard let value = arguments.popFirst().flatMap({ Int($0) }), value >= 0 else { fail("--idle-exit needs whole seconds", status: 64) }
        idleExit = value == 0 ? nil : .seconds(value)
    case "--access":
        guard let value = arguments.popFirst() else { fail("--access needs executable or user", status: 64) }
        access = value
        guard access == "executable" || access == "user" else { fail("--access is executable or user", status: 64) }
    case "--maximum-value-size":
        guard let value = arguments.popFirst().flatMap({ Int($0) }), value > 0 else { fail("--maximum-value-size needs bytes", status: 64) }
        maximumValueSize = value
    case "--detach": detach = true
    case "--help", "-h":
        print("usage: lockboxd [--socket PATH] [--keychain PATH] [--idle-exit SECONDS] [--access executable|user] [--maximum-value-size BYTES] [--detach]")
        exit(0)
    default: fail("unknown argument (not shown); see lockboxd --help", status: 64)
    }
}

let resolvedSocket: String
if let socketPath {
    resolvedSocket = socketPath
} else {
    do throws(LockboxError) {
        resolvedSocket = try BrokerLocation.socketPath()
    } catch {
        fail(error.description)
    }
}
var configuration = BrokerServer.Configuration(socketPath: resolvedSocket, vaultPath: vaultPath ?? Keychain.vaultPath())
configuration.idleExit = idleExit
if let maximumValueSize { configuration.vault.maximumValueSize = maximumValueSize }
configuration.keyOperations = BrokerKeys()
do throws(LockboxError) {
    try Keychain.applyEnvironment(to: &configuration.vault)
} catch {
    fail(error.description)
}
if access == "executable" {
    // Walls: the policy in $XDG_CONFIG_HOME/lockbox/, each identity its own group by default.
    configuration.policy = PolicyAccess(watcher: BrokerPolicyWatcher())
} else {
    configuration.policy = SameUserAccessPolicy()
}

/// Detached: the parent waits for the child to listen (or fail) and reports it, so that whoever
/// started the broker sees its error; the child leaves the session and keeps running.
var readiness: Int32 = -1
if detach {
    var ends: [Int32] = [0, 0]
    guard pipe(&ends) == 0 else { fail("cannot create a pipe: \(String(cString: strerror(errno)))") }
    let child = fork()
    if child < 0 { fail("cannot fork: \(String(cString: strerror(errno)))") }
    if child > 0 {
        close(ends[1])
        var message: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 1024)
        while true {
            let count = chunk.withUnsafeMutableBytes { read(ends[0], $0.baseAddress, $0.count) }
            if count > 0 { message += chunk[0..<count] } else if count < 0 && errno == EINTR { continue } else { break }
        }
        if message == Array("ready".utf8) { exit(0) }
        fail(message.isEmpty ? "the broker exited before it listened" : String(decoding: message, as: UTF8.self))
    }
    close(ends[0])
    readiness = ends[1]
    setsid()
    // Whatever else the starter left open (its pipes: a caller waiting for their end would wait
    // for this broker's whole life) is closed.
    let limit = min(Int32(sysconf(Int32(_SC_OPEN_MAX))), 65536)
    for descriptor in 3..<max(limit, 4) where descriptor != readiness {
        close(descriptor)
    }
}

let server: BrokerServer
do throws(LockboxError) {
    server = try BrokerServer(configuration)
} catch {
    if readiness >= 0 {
        _ = error.description.withCString { write(readiness, $0, strlen($0)) }
        exit(1)
    }
    fail(error.description)
}
if readiness >= 0 {
    _ = "ready".withCString { write(readiness, $0, 5) }
    close(readiness)
    let null = open("/dev/null", O_RDWR)
    if null >= 0 {
        dup2(null, STDIN_FILENO)
        dup2(null, STDOUT_FILENO)
        dup2(null, STDERR_FILENO)
        if null > STDERR_FILENO { close(null) }
    }
}
server.serve()
