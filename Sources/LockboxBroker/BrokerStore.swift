import FoundationEssentials
import LockboxCore
import LockboxVault
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// The keychain served by `lockboxd`: an ``ItemStore`` whose every call is one request over
/// the broker's socket. The unlocked keys stay in the broker; this process holds only the items
/// it asked for.
///
/// ```swift
/// let store = try BrokerStore.connect(vaultPath: Keychain.vaultPath())
/// try store.add(.genericPassword(service: "api", account: "alice", data: token))
/// ```
///
/// A broker that stops is reported as `errSecNotAvailable`; the next call connects again (and
/// starts `lockboxd` again, when the store starts it on demand).
public final class BrokerStore: ItemStore, Sendable {
    /// The broker's socket.
    public let socketPath: String
    /// The vault the broker serves.
    public let vaultPath: String
    /// Whether a missing broker is started (`lockboxd`), as gpg-agent is.
    public let startsOnDemand: Bool
    private let connection = Mutex<UnixSocket?>(nil)
    private let defaultContext = Mutex<AuthenticationContext?>(nil)
    /// The broker's process id at the last hello (for `lockbox status`).
    private let brokerProcess = Atomic<Int32>(0)

    /// Whether the broker may serve any vault (a control connection: status, stop).
    private let acceptsAnyVault: Bool

    private init(socketPath: String, vaultPath: String, startsOnDemand: Bool, acceptsAnyVault: Bool = false) {
        self.socketPath = socketPath
        self.vaultPath = vaultPath
        self.startsOnDemand = startsOnDemand
        self.acceptsAnyVault = acceptsAnyVault
    }

    /// Connects to the broker that answers at `socketPath` (by default
    /// ``BrokerLocation/socketPath()``), whichever vault it serves, never starting one: for
    /// ``stop()`` and its ``status()``.
    /// - Throws: `errSecNotAvailable` when none runs there (the message says why: no socket, a
    ///   stale one); `errSecIO` for a socket or directory of another user, or a listener that
    ///   runs as another user.
    public static func control(socketPath: String? = nil) throws(LockboxError) -> BrokerStore {
        let resolved: String
        if let socketPath { resolved = socketPath } else { resolved = try BrokerLocation.socketPath() }
        let store = BrokerStore(socketPath: resolved, vaultPath: "", startsOnDemand: false, acceptsAnyVault: true)
        try store.connection.withLock { connection throws(LockboxError) in
            connection = try store.openConnection()
        }
        return store
    }

    /// Stops the broker: it refuses new requests, lets those it is answering finish (so every
    /// write it acknowledged is in the vault file), removes its socket and exits, forgetting
    /// the keys it held. Returns once the process is gone (or after 10 s).
    /// - Returns: the stopped broker's process id.
    /// - Throws: `errSecMissingEntitlement` for a program the broker does not let stop it (only
    ///   the `lockbox` command, or any program under `--access user`).
    @discardableResult
    public func stop() throws(LockboxError) -> Int32 {
        var reply = try request(.stop, retryable: false) { _ in }
        guard let pid = try? reply.integer(), let stopped = Int32(exactly: pid) else { throw Self.malformedReply }
        connection.withLock { $0 = nil }
        for _ in 0..<1000 where Self.isAlive(stopped) { usleep(10_000) }
        return stopped
    }

    /// Whether process `pid` exists and has not exited (a zombie waiting for its parent has).
    package static func isAlive(_ pid: Int32) -> Bool {
        guard kill(pid, 0) == 0 || errno == EPERM else { return false }
        let descriptor = open("/proc/\(pid)/stat", O_RDONLY | O_CLOEXEC)
        guard descriptor >= 0 else { return true }
        defer { close(descriptor) }
        var buffer = [UInt8](repeating: 0, count: 512)
        let count = buffer.withUnsafeMutableBytes { read(descriptor, $0.baseAddress, $0.count) }
        guard count > 0, let close = buffer[0..<count].lastIndex(of: UInt8(ascii: ")")), close + 2 < count else { return true }
        // "PID (comm) S ...": the state follows the last parenthesis.
        return buffer[close + 2] != UInt8(ascii: "Z") && buffer[close + 2] != UInt8(ascii: "X")
    }

    /// Connects to the broker at `socketPath` (by default ``BrokerLocation/socketPath()``) that
    /// serves `vaultPath`, starting `lockboxd` first when none runs and `startOnDemand` is set.
    /// - Throws: `errSecNotAvailable` when no broker runs (and none was to be started), or it
    ///   serves another vault; `errSecIO` for a socket or directory that is not trusted, naming
    ///   the fix; `errSecParam` for a broker of an older protocol.
    public static func connect(
        socketPath: String? = nil, vaultPath: String, startOnDemand: Bool = true
    ) throws(LockboxError) -> BrokerStore {
        let resolved: String
        if let socketPath { resolved = socketPath } else { resolved = try BrokerLocation.socketPath() }
        let store = BrokerStore(socketPath: resolved, vaultPath: vaultPath, startsOnDemand: startOnDemand)
        try store.connection.withLock { connection throws(LockboxError) in
            connection = try store.openConnection()
        }
        return store
    }

    /// Whether a broker answers at `socketPath` now (a connect succeeds), without a request.
    public static func isRunning(socketPath: String) -> Bool {
        (try? UnixSocket.connect(to: socketPath)) != nil
    }

    /// How the user is asked when the broker needs the passphrase: for an access-controlled
    /// item whose query brings no context of its own, and for the `lockbox` command reaching
    /// another application's group. The broker has no one to ask; the client asks its user and
    /// the broker checks the answer (`Keychain.open` sets the options' context here). Nil: such
    /// items read as locked (-25308), as in the vault.
    public var authenticationContext: AuthenticationContext? {
        get { defaultContext.withLock { $0 } }
        set { defaultContext.withLock { $0 = newValue } }
    }

    /// The process id of the broker this store last greeted.
    public var brokerProcessIdentifier: Int32 { brokerProcess.load(ordering: .relaxed) }

    // MARK: ItemStore

    /// Adds an item through the broker; without a group it goes to the caller's default group.
    /// - Throws: as ``ItemStore/add(_:)``; `errSecMissingEntitlement` for a group the caller
    ///   does not hold; `errSecNotAvailable` when the broker stopped.
    public func add(_ item: Item) throws(LockboxError) {
        _ = try request(.add, retryable: false) { BrokerCoding.encode(item, into: &$0) }
    }

    /// The matches in the caller's groups.
    /// - Throws: as ``ItemStore/items(matching:)``; `errSecMissingEntitlement` for a group the
    ///   caller does not hold.
    public func items(matching query: Query) throws(LockboxError) -> [Item] {
        var reply = try request(.items, retryable: true, context: query.authenticationContext) { BrokerCoding.encode(query, into: &$0) }
        guard let payload = try? reply.bytes() else { throw Self.malformedReply }
        var decoder = FieldDecoder(payload)
        guard let count = try? decoder.integer(), count >= 0 else { throw Self.malformedReply }
        var items: [Item] = []
        items.reserveCapacity(min(count, 1024))
        for _ in 0..<count {
            items.append(try BrokerCoding.decodeItem(&decoder))
        }
        return items
    }

    /// Updates the matches in the caller's groups.
    /// - Throws: as ``ItemStore/update(matching:to:)``; `errSecMissingEntitlement` for a group
    ///   the caller does not hold (the query's or the update's).
    public func update(matching query: Query, to update: ItemUpdate) throws(LockboxError) {
        _ = try request(.update, retryable: false, context: query.authenticationContext) {
            BrokerCoding.encode(query, into: &$0)
            BrokerCoding.encode(update, into: &$0)
        }
    }

    /// Deletes the matches in the caller's groups.
    /// - Returns: how many were deleted.
    /// - Throws: as ``ItemStore/delete(matching:)``; `errSecMissingEntitlement` for a group the
    ///   caller does not hold.
    @discardableResult
    public func delete(matching query: Query) throws(LockboxError) -> Int {
        var reply = try request(.delete, retryable: false, context: query.authenticationContext) { BrokerCoding.encode(query, into: &$0) }
        guard let count = try? reply.integer() else { throw Self.malformedReply }
        return count
    }

    // MARK: The vault's lock state, through the broker

    /// The served vault's status.
    public func status() throws(LockboxError) -> VaultStatus {
        var reply = try request(.status, retryable: true) { _ in }
        guard let json = try? reply.bytes(), let status = try? JSONDecoder().decode(VaultStatus.self, from: Data(json)) else {
            throw Self.malformedReply
        }
        return status
    }

    /// Unlocks the served vault with a passphrase; an empty one unlocks a vault that has none
    /// with this machine's device secret.
    public func unlock(passphrase: SecretBytes) throws(LockboxError) {
        _ = try request(.unlock, retryable: false) { encoder in
            passphrase.withUnsafeBytes { encoder.bytes(Array($0)) }
        }
    }

    /// Locks the served vault; `all` forgets the after-first-unlock keys too.
    public func lock(all: Bool = false) throws(LockboxError) {
        _ = try request(.lock, retryable: true) { $0.integer(all ? 1 : 0) }
    }

    // MARK: Requests

    static let malformedReply = LockboxError(
        .io, "lockboxd sent a malformed reply. Stop it (`lockbox status` shows its pid); it starts again on demand.")

    /// Sends one request and returns its reply's results. When the broker answers that the
    /// user's passphrase would let the request through (an access-controlled item, or the
    /// `lockbox` command reaching another group), asks the user through `context` (else the
    /// store's ``authenticationContext``) and sends the request again with the passphrase,
    /// which the broker checks (a wrong one counts in the failed-attempt back-off).
    package func request(
        _ operation: BrokerProtocol.Operation, retryable: Bool, context: AuthenticationContext? = nil,
        _ arguments: (inout FieldEncoder) -> Void
    ) throws(LockboxError) -> FieldDecoder {
        var encoder = FieldEncoder()
        encoder.integer(operation.rawValue)
        arguments(&encoder)
        var bytes = encoder.bytes
        defer { bytes.wipe() }
        var reply = try exchange(bytes, retryable: retryable)
        defer { reply.wipe() }
        if let (kind, asked) = BrokerCoding.challenge(in: reply) {
            let refusal: LockboxError
            do throws(LockboxError) {
                _ = try BrokerCoding.decodeReply(reply)
                throw Self.malformedReply
            } catch {
                refusal = error
            }
            guard let context = context ?? authenticationContext, !context.interactionNotAllowed, let verifier = context.verifier else {
                throw refusal
            }
            let passphrase: SecretBytes
            do throws(LockboxError) {
                passphrase = try verifier.passphrase(for: asked)
            } catch where kind == .everyGroup && (error.code == .interactionNotAllowed || error.code == .notAvailable) {
                // No one to ask: the refusal stands, with how to get past it.
                throw LockboxError(refusal.code, refusal.message + " (The passphrase, entered at a terminal, opens every group to lockbox.)")
            }
            guard !passphrase.isEmpty else { throw LockboxError(.userCanceled, "Cancelled: the passphrase was not given.") }
            var authenticate = FieldEncoder()
            authenticate.integer(BrokerProtocol.Operation.authenticate.rawValue)
            var copy = passphrase.withUnsafeBytes { Array($0) }
            authenticate.bytes(copy)
            copy.wipe()
            let reuse = max(.zero, min(context.reuseDuration, BrokerSession.longestReuse))
            authenticate.integer(Int(reuse / .milliseconds(1)))
            authenticate.bytes(bytes)
            var wrapped = authenticate.bytes
            defer { wrapped.wipe() }
            reply.wipe()
            reply = try exchange(wrapped, retryable: retryable)
        }
        return try BrokerCoding.decodeReply(reply)
    }

    /// One request frame out, its reply frame back. A broker that went away is connected to
    /// again once when the request cannot have reached it, or when repeating it is harmless.
    private func exchange(_ bytes: [UInt8], retryable: Bool) throws(LockboxError) -> [UInt8] {
        guard bytes.count <= BrokerProtocol.maximumRequestBytes else {
            throw LockboxError(.param, "The request is over the broker's limit of \(BrokerProtocol.maximumRequestBytes) bytes.")
        }
        return try connection.withLock { connection throws(LockboxError) -> [UInt8] in
            for attempt in 0..<2 {
                let socket: UnixSocket
                if let current = connection {
                    socket = current
                } else {
                    socket = try openConnection()
                    connection = socket
                }
                do throws(LockboxError) {
                    try socket.writeFrame(bytes)
                } catch {
                    // Not delivered: the broker had closed this connection. Try a new one.
                    connection = nil
                    if attempt == 0 { continue }
                    throw brokerStopped(error)
                }
                do throws(LockboxError) {
                    // Most answers take tens of microseconds: look for them before sleeping.
                    socket.awaitReadable(budget: Self.replySpinNanoseconds)
                    guard let frame = try socket.readFrame(limit: BrokerProtocol.maximumReplyBytes) else {
                        throw LockboxError(.io, "The broker closed the connection.")
                    }
                    return frame
                } catch {
                    connection = nil
                    if retryable && attempt == 0 { continue }
                    throw brokerStopped(error)
                }
            }
            preconditionFailure("the second attempt returns or throws")
        }
    }

    private func brokerStopped(_ error: LockboxError) -> LockboxError {
        LockboxError(
            .notAvailable,
            "lockboxd at \(socketPath) stopped while answering (\(error.message)); a write may or may not have been applied. "
                + "The next call connects to a new broker" + (startsOnDemand ? ", started on demand." : " once one is started."),
            cause: error.cause)
    }

    /// A greeted connection to the broker, started first when none runs and that is allowed.
    private func openConnection() throws(LockboxError) -> UnixSocket {
        let directory = BrokerLocation.directory(of: socketPath)
        do throws(LockboxError) {
            return try greet(try connectChecked(directory: directory))
        } catch where error.code == .notAvailable && startsOnDemand {
            try BrokerLauncher.start(socketPath: socketPath, vaultPath: vaultPath)
            return try greet(try connectChecked(directory: directory))
        }
    }

    private func connectChecked(directory: String) throws(LockboxError) -> UnixSocket {
        try BrokerLocation.checkDirectory(directory)
        try BrokerLocation.checkSocket(socketPath)
        let socket: UnixSocket
        do throws(LockboxError) {
            socket = try UnixSocket.connect(to: socketPath)
        } catch where error.errno == ECONNREFUSED {
            guard !BrokerLocation.isHeld(socket: socketPath) else { throw error }
            throw LockboxError(
                .notAvailable,
                "The broker socket \(socketPath) is stale: no lockboxd listens there. Start lockboxd (the library and `lockbox` "
                    + "start it on demand with LOCKBOX_BROKER=1), which replaces it, or remove it: rm '\(socketPath)'")
        }
        let server = try socket.peerCredentials()
        guard server.uid == geteuid() else {
            throw LockboxError(
                .io, "The process listening at \(socketPath) runs as uid \(server.uid), not as you; it is not used. Remove the socket.")
        }
        try socket.setReceiveTimeout(seconds: 120)
        return socket
    }

    /// How long a request looks for its answer before its thread sleeps: about two reads'
    /// time. An answer that takes longer (an unlock, a prompt) costs this much processor time
    /// once, spent yielding.
    static let replySpinNanoseconds: UInt64 = 100_000

    private func greet(_ socket: UnixSocket) throws(LockboxError) -> UnixSocket {
        var hello = FieldEncoder()
        hello.integer(BrokerProtocol.Operation.hello.rawValue)
        hello.string(BrokerProtocol.greeting)
        hello.integer(BrokerProtocol.version)
        try socket.writeFrame(hello.bytes)
        guard let frame = try socket.readFrame(limit: BrokerProtocol.maximumReplyBytes) else {
            throw LockboxError(.notAvailable, "lockboxd at \(socketPath) closed the connection at hello; see its log (journalctl --user).")
        }
        var reply = try BrokerCoding.decodeReply(frame)
        guard let version = try? reply.integer(), let servedVault = try? reply.string(), let pid = try? reply.integer() else {
            throw Self.malformedReply
        }
        guard version >= BrokerProtocol.version else {
            throw LockboxError(
                .param,
                "lockboxd at \(socketPath) (pid \(pid)) speaks broker protocol \(version), older than this program's "
                    + "\(BrokerProtocol.version). Stop it (kill \(pid)); the current one starts on demand.")
        }
        guard acceptsAnyVault || Self.samePath(servedVault, vaultPath) else {
            throw LockboxError(
                .notAvailable,
                "lockboxd at \(socketPath) serves the keychain \(servedVault), not \(vaultPath). Use that keychain, or give this one "
                    + "its own broker with LOCKBOX_BROKER_SOCKET.")
        }
        brokerProcess.store(Int32(truncatingIfNeeded: pid), ordering: .relaxed)
        return socket
    }

    static func samePath(_ left: String, _ right: String) -> Bool {
        if left == right { return true }
        guard let a = realpath(left, nil), let b = realpath(right, nil) else { return false }
        defer {
            free(a)
            free(b)
        }
        return strcmp(a, b) == 0
    }
}
