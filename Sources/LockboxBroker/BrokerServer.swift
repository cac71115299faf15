import LockboxCore
import LockboxVault
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// `lockboxd`'s listener: owns the socket, the vault and the claim on it, and serves each
/// connection on a thread of its own.
package final class BrokerServer: Sendable {
    /// How the broker is set up.
    package struct Configuration: Sendable {
        package var socketPath: String
        package var vaultPath: String
        package var vault = Vault.Configuration()
        /// Exit after this long without a connection while no key is held; nil never.
        package var idleExit: Duration?
        package var policy: any BrokerAccessPolicy = SameUserAccessPolicy()
        package var keyOperations: (any BrokerKeyOperations)?
        /// At most this many connections at once; more are refused with a reply saying so.
        package var maximumConnections = 512

        package init(socketPath: String, vaultPath: String) {
            self.socketPath = socketPath
            self.vaultPath = vaultPath
        }
    }

    package let configuration: Configuration
    package let service: BrokerService
    private let listener: Int32
    private let socketLock: Int32
    /// The vault's claim (kept by the vault too): checked in place before each request.
    private let claim: BrokerClaim
    private let connections = Atomic<Int>(0)
    /// Requests being answered now, and whether a stop was asked (see ``stop(answering:grant:)``).
    private let inFlight = Atomic<Int>(0)
    private let isStopping = Atomic<Bool>(false)
    private let lastActivity = Atomic<Int64>(0)

    /// Claims the vault and the socket, opens the vault (its keys kept in this process's
    /// locked memory only), and listens.
    /// - Throws: `errSecNotAvailable` when another broker serves the socket or the vault, or an
    ///   embedded handle has the vault open.
    package init(_ configuration: Configuration) throws(LockboxError) {
        var configuration = configuration
        let socketPath = configuration.socketPath
        let directory = BrokerLocation.directory(of: socketPath)
        if mkdir(directory, 0o700) != 0 && errno != EEXIST {
            throw LockboxError(
                .io, "Cannot create the broker directory \(directory): \(String(cString: strerror(errno))).",
                cause: .systemCall("mkdir", errno: errno))
        }
        try BrokerLocation.checkDirectory(directory)
        let lockPath = BrokerLocation.lockPath(forSocket: socketPath)
        let lock = try SystemCall.check("open", "Opening \(lockPath)") { StandardDescriptors.movedAbove(open(lockPath, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0o600)) }
        var locked: Int32
        repeat { locked = flock(lock, LOCK_EX | LOCK_NB) } while locked != 0 && errno == EINTR
        guard locked == 0 else {
            close(lock)
            throw LockboxError(.notAvailable, "Another lockboxd already listens at \(socketPath); use it, or stop it first.")
        }
        // The vault: claimed for this broker alone, keys in this process only.
        let claim: BrokerClaim
        let vault: Vault
        do throws(LockboxError) {
            claim = try BrokerClaim.claimForBroker(vaultPath: configuration.vaultPath)
            configuration.vault.brokerClaim = claim
            configuration.vault.unlockCache = .processMemory
            vault = try Vault.open(at: configuration.vaultPath, configuration: configuration.vault)
            // Keys that programs opening the vault directly left in the kernel keyring are
            // taken out: a copy of the file (its log included) would open with them, every
            // access group's items with it, while the broker is meant to hold the only keys.
            vault.removeKeysFromKernelKeyring()
        } catch {
            close(lock)
            throw error
        }
        // A socket left by a broker that died: this process holds the lock, so nobody serves it.
        var info = stat()
        if lstat(socketPath, &info) == 0 {
            guard info.st_mode & S_IFMT == S_IFSOCK, info.st_uid == geteuid() else {
                close(lock)
                throw LockboxError(.io, "\(socketPath) exists and is not this user's socket; remove it, then start lockboxd again.")
            }
            unlink(socketPath)
        }
        var listener: Int32 = -1
        do throws(LockboxError) {
            listener = try SystemCall.check("socket", "Creating the broker socket") {
                socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
            }
            let oldMask = umask(0o177)
            let bound: Int32
            do throws(LockboxError) {
                bound = try UnixSocket.withAddress(socketPath) { address, length in bind(listener, address, length) == 0 ? 0 : errno }
                umask(oldMask)
            } catch {
                umask(oldMask)
                throw error
            }
            guard bound == 0 else {
                throw LockboxError(
                    .io, "Cannot listen at \(socketPath): \(String(cString: strerror(bound))).", cause: .systemCall("bind", errno: bound))
            }
            _ = try SystemCall.check("chmod", "Making the broker socket private") { chmod(socketPath, 0o600) }
            _ = try SystemCall.check("listen", "Listening on the broker socket") { Glibc.listen(listener, 128) }
        } catch {
            // Every descriptor this start opened is closed once, here: the value is never made.
            if listener >= 0 { close(listener) }
            close(lock)
            throw error
        }
        self.claim = claim
        self.configuration = configuration
        self.service = BrokerService(vault: vault, keyOperations: configuration.keyOperations)
        self.listener = listener
        self.socketLock = lock
        lastActivity.store(Self.now(), ordering: .relaxed)
    }

    deinit {
        close(listener)
        close(socketLock)
    }

    /// Accepts connections until the idle exit applies, then removes the socket and returns.
    package func serve() {
        if configuration.idleExit != nil {
            BrokerThread.start { [self] in watchIdleExit() }
        }
        while true {
            let descriptor = accept(listener, nil, nil)
            if descriptor < 0 {
                if errno == EINTR || errno == ECONNABORTED || errno == EMFILE || errno == ENFILE {
                    if errno == EMFILE || errno == ENFILE { usleep(10_000) }
                    continue
                }
                return
            }
            _ = fcntl(descriptor, F_SETFD, FD_CLOEXEC)
            let connection = UnixSocket(descriptor: descriptor)
            let count = connections.add(1, ordering: .relaxed).newValue
            lastActivity.store(Self.now(), ordering: .relaxed)
            guard count <= configuration.maximumConnections else {
                try? connection.writeFrame(
                    BrokerCoding.failure(
                        LockboxError(.notAvailable, "lockboxd serves \(configuration.maximumConnections) connections already; try again.")))
                connections.subtract(1, ordering: .relaxed)
                continue
            }
            BrokerThread.start { [self] in
                serve(connection)
                connections.subtract(1, ordering: .relaxed)
                lastActivity.store(Self.now(), ordering: .relaxed)
            }
        }
    }

    /// How long a connection may take to send each part of its hello.
    static let helloTimeoutSeconds = 10

    /// One connection: identify the peer, expect hello, then answer requests until it closes.
    func serve(_ connection: UnixSocket) {
        // Until its hello, a connection has a few seconds per read: one that connects and says
        // nothing would otherwise hold one of the broker's connections (and a thread) for ever.
        // A client that has said hello may then stay idle between requests as long as it lives.
        try? connection.setReceiveTimeout(seconds: Self.helloTimeoutSeconds)
        var session: BrokerSession
        do throws(LockboxError) {
            session = BrokerSession(grant: try configuration.policy.grant(forPeerOn: connection.descriptor))
        } catch {
            try? connection.writeFrame(BrokerCoding.failure(error))
            return
        }
        var greeted = false
        while true {
            var request: [UInt8]
            do throws(LockboxError) {
                guard let frame = try connection.readFrame(limit: BrokerProtocol.maximumRequestBytes) else { return }
                request = frame
            } catch {
                // A frame over the bound or cut short: answered, then closed (the stream cannot
                // be read in step any more).
                try? connection.writeFrame(BrokerCoding.failure(error))
                return
            }
            defer { request.wipe() }
            lastActivity.store(Self.now(), ordering: .relaxed)
            let reply: [UInt8]
            if !greeted {
                switch Self.answerHello(request, vaultPath: configuration.vaultPath) {
                case .success(let bytes):
                    reply = bytes
                    greeted = true
                    try? connection.setReceiveTimeout(seconds: 0)
                case .failure(let error):
                    try? connection.writeFrame(BrokerCoding.failure(error))
                    return
                }
            } else if BrokerRequest.isStop(request) {
                do throws(LockboxError) {
                    try session.renewGrant()
                } catch {
                    try? connection.writeFrame(BrokerCoding.failure(error))
                    continue
                }
                stop(answering: connection, grant: session.grant)
                continue
            } else {
                guard claim.isInPlace(vaultPath: configuration.vaultPath) else {
                    try? connection.writeFrame(BrokerCoding.failure(Self.claimRemoved(configuration.vaultPath)))
                    shutDown()
                }
                guard beginRequest() else {
                    try? connection.writeFrame(BrokerCoding.failure(Self.stopping))
                    return
                }
                do throws(LockboxError) {
                    try session.renewGrant()
                    reply = service.reply(to: request, session: &session)
                } catch {
                    reply = BrokerCoding.failure(error)
                }
                defer { endRequest() }
                do throws(LockboxError) {
                    try connection.writeFrame(reply)
                } catch {
                    return
                }
                continue
            }
            do throws(LockboxError) {
                try connection.writeFrame(reply)
            } catch {
                return
            }
        }
    }

    // MARK: Stopping

    static let stopping = LockboxError(
        .notAvailable, "lockboxd is stopping; nothing of this request was done. The next call starts a broker again when it may.")

    /// Counts a request as being answered; false once the broker is stopping.
    private func beginRequest() -> Bool {
        inFlight.add(1, ordering: .sequentiallyConsistent)
        guard !isStopping.load(ordering: .sequentiallyConsistent) else {
            inFlight.subtract(1, ordering: .sequentiallyConsistent)
            return false
        }
        return true
    }

    private func endRequest() {
        inFlight.subtract(1, ordering: .sequentiallyConsistent)
    }

    /// `lockbox broker stop`: refuses new requests, waits for those being answered (each
    /// write is committed before its reply, so every acknowledged write is in the file), removes
    /// the socket, answers, and exits. Only a peer that reaches every group (the `lockbox`
    /// command, or any program under `--access user`) may stop the broker: a sandboxed app,
    /// which cannot signal it, cannot stop it either.
    private func stop(answering connection: UnixSocket, grant: BrokerGrant) {
        guard grant.accessGroups == nil || grant.reachesEveryGroupWithPassphrase else {
            try? connection.writeFrame(
                BrokerCoding.failure(
                    LockboxError(
                        .missingEntitlement,
                        "\(grant.peerName) may not stop lockboxd: only the lockbox command does (`lockbox broker stop`).")))
            return
        }
        guard !isStopping.exchange(true, ordering: .sequentiallyConsistent) else {
            try? connection.writeFrame(BrokerCoding.failure(Self.stopping))
            return
        }
        let unfinished = finishRequests()
        let pid = Int(getpid())
        try? connection.writeFrame(BrokerCoding.success { $0.integer(pid); $0.integer(unfinished) })
        exit(0)
    }

    /// Requests already being answered finish (up to a minute: an unlock's key derivation, a
    /// write waiting for another process's transaction); no new one starts. Then the socket
    /// goes, so that no new client finds this broker. Returns how many did not finish.
    private func finishRequests() -> Int {
        for _ in 0..<6000 where inFlight.load(ordering: .sequentiallyConsistent) > 0 { usleep(10_000) }
        let unfinished = inFlight.load(ordering: .sequentiallyConsistent)
        unlink(configuration.socketPath)
        return unfinished
    }

    /// Stops the broker as `stop` does, without a client asking: its claim is gone.
    private func shutDown() -> Never {
        if !isStopping.exchange(true, ordering: .sequentiallyConsistent) { _ = finishRequests() }
        exit(0)
    }

    static func claimRemoved(_ vaultPath: String) -> LockboxError {
        LockboxError(
            .notAvailable,
            "The file \(BrokerClaim.lockPath(forVault: vaultPath)), which keeps programs from opening the keychain beside lockboxd, "
                + "was removed or replaced: lockboxd stops, nothing of this request was done. Do not remove that file while lockboxd runs; "
                + "the next call starts a broker again when it may.")
    }

    /// The reply to a connection's first frame.
    package static func answerHello(_ bytes: [UInt8], vaultPath: String) -> Result<[UInt8], LockboxError> {
        var decoder = FieldDecoder(bytes)
        guard (try? decoder.integer()) == BrokerProtocol.Operation.hello.rawValue,
            (try? decoder.string()) == BrokerProtocol.greeting,
            let version = try? decoder.integer(), decoder.isAtEnd
        else {
            return .failure(LockboxError(.param, "This socket speaks Lockbox's broker protocol; the first message was not its hello."))
        }
        guard version >= BrokerProtocol.oldestServedVersion else {
            return .failure(
                LockboxError(
                    .param,
                    "This program speaks broker protocol \(version), older than lockboxd's oldest (\(BrokerProtocol.oldestServedVersion)): "
                        + "update the program (rebuild it against the current Lockbox)."))
        }
        return .success(
            BrokerCoding.success {
                $0.integer(BrokerProtocol.version)
                $0.string(vaultPath)
                $0.integer(Int(getpid()))
            })
    }

    private func watchIdleExit() {
        guard let idleExit = configuration.idleExit else { return }
        let limit = idleExit.components.seconds
        while true {
            sleep(1)
            guard connections.load(ordering: .relaxed) == 0, Self.now() - lastActivity.load(ordering: .relaxed) >= limit else { continue }
            // Keys held (the vault was unlocked since this broker started) keep it running:
            // exiting would forget them, which only lock or a reboot may do.
            if let status = try? service.vault.status(), status.wasUnlockedSinceBoot { continue }
            unlink(configuration.socketPath)
            exit(0)
        }
    }

    private static func now() -> Int64 {
        var time = timespec()
        clock_gettime(CLOCK_MONOTONIC, &time)
        return Int64(time.tv_sec)
    }
}

/// A detached thread running a closure: connections block in `recv`, which must not happen on
/// Swift's cooperative pool.
enum BrokerThread {
    private final class Box {
        let body: @Sendable () -> Void
        init(_ body: @escaping @Sendable () -> Void) { self.body = body }
    }

    static func start(_ body: @escaping @Sendable () -> Void) {
        let box = Unmanaged.passRetained(Box(body)).toOpaque()
        var thread = pthread_t()
        var attributes = pthread_attr_t()
        pthread_attr_init(&attributes)
        pthread_attr_setdetachstate(&attributes, Int32(PTHREAD_CREATE_DETACHED))
        pthread_attr_setstacksize(&attributes, 512 * 1024)
        let result = pthread_create(&thread, &attributes, { raw in
            let box = Unmanaged<Box>.fromOpaque(raw!).takeRetainedValue()
            box.body()
            return nil
        }, box)
        pthread_attr_destroy(&attributes)
        precondition(result == 0, "lockboxd could not start a thread (error \(result))")
    }
}
