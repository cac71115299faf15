import Foundation
import Lockbox
import LockboxTestSupport
import Synchronization
import Testing

@testable import LockboxBroker

/// The broker under attack and failure: garbage on its socket, a kill in the middle of writes,
/// sockets and directories that are not to be trusted, an older protocol.
@Suite("lockboxd's failure modes")
struct BrokerFailureTests {
    /// A raw connection that has said hello.
    func greetedSocket(_ fixture: BrokerFixture) throws -> UnixSocket {
        let socket = try UnixSocket.connect(to: fixture.socketPath)
        try socket.setReceiveTimeout(seconds: 30)
        var hello = FieldEncoder()
        hello.integer(BrokerProtocol.Operation.hello.rawValue)
        hello.string(BrokerProtocol.greeting)
        hello.integer(BrokerProtocol.version)
        try socket.writeFrame(hello.bytes)
        _ = try BrokerCoding.decodeReply(try #require(try socket.readFrame(limit: 1 << 20)))
        return socket
    }

    func writeRaw(_ socket: UnixSocket, _ bytes: [UInt8]) {
        let sent = bytes.withUnsafeBytes { send(socket.descriptor, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        #expect(sent == bytes.count)
    }

    func replyStatus(_ socket: UnixSocket) throws -> Int32? {
        guard let frame = try socket.readFrame(limit: 1 << 20) else { return nil }
        do {
            _ = try BrokerCoding.decodeReply(frame)
            return 0
        } catch {
            return error.code.rawValue
        }
    }

    @Test("every connection slot taken: lockbox broker status says the broker runs but took no more, not that it is not running")
    func everySlotTaken_statusSaysItRuns() throws {
        let fixture = try BrokerFixture()
        var held: [UnixSocket] = []
        for _ in 0..<BrokerServer.Configuration(socketPath: "", vaultPath: "").maximumConnections {
            held.append(try UnixSocket.connect(to: fixture.socketPath))
        }
        defer { held.removeAll() }
        var environment = fixture.clientEnvironment
        environment["LOCKBOX_BROKER_SOCKET"] = fixture.socketPath
        let status = try run(builtProduct("lockbox"), ["broker", "status"], environment: environment)
        #expect(status.status != 0)
        #expect(status.standardError.contains("lockboxd runs") && status.standardError.contains("connections already"), "\(status.standardError)")
        #expect(!status.standardOutput.contains("not running"), "\(status.standardOutput)")
    }

    @Test("a connection that never says hello is closed after the hello timeout; the broker serves others meanwhile and after")
    func silentConnection_isClosedAfterTheHelloTimeout() throws {
        let fixture = try BrokerFixture()
        let silent = try UnixSocket.connect(to: fixture.socketPath)
        try silent.setReceiveTimeout(seconds: 60)
        let started = ContinuousClock.now
        // Others are served while it says nothing.
        #expect(try fixture.store().brokerProcessIdentifier == fixture.process)
        // The broker answers the silence with an error, then closes; never before the timeout.
        let answer = try? silent.readFrame(limit: 1 << 16)
        let waited = ContinuousClock.now - started
        #expect(answer != nil || (try? silent.readFrame(limit: 1 << 16)) == nil)
        #expect(waited >= .seconds(BrokerServer.helloTimeoutSeconds - 1) && waited < .seconds(50), "closed after \(waited)")
        #expect((try? silent.readFrame(limit: 1 << 16)) == nil, "the connection stayed open")
        #expect(try fixture.store().brokerProcessIdentifier == fixture.process)
    }

    @Test("garbage frames get an error reply and change nothing")
    func garbageFrames_getErrorReplies_changeNothing() throws {
        let fixture = try BrokerFixture()
        let store = try fixture.store()
        try store.unlock(passphrase: SecretBytes(utf8: BrokerFixture.passphraseText))
        try store.add(.genericPassword(service: "keep", account: "a", data: SecretBytes(utf8: "v")))
        let before = try store.status().itemCount

        // An unknown operation, and a known one with garbage arguments: error replies, and the
        // connection goes on.
        let socket = try greetedSocket(fixture)
        var unknown = FieldEncoder()
        unknown.integer(77)
        try socket.writeFrame(unknown.bytes)
        #expect(try replyStatus(socket) == -50)
        var garbage = FieldEncoder()
        garbage.integer(BrokerProtocol.Operation.add.rawValue)
        garbage.bytes([1, 2, 3])
        try socket.writeFrame(garbage.bytes)
        #expect(try replyStatus(socket) == -50)
        var statusRequest = FieldEncoder()
        statusRequest.integer(BrokerProtocol.Operation.status.rawValue)
        try socket.writeFrame(statusRequest.bytes)
        #expect(try replyStatus(socket) == 0)

        // A huge length: refused before it is read, then the connection closes.
        let huge = try greetedSocket(fixture)
        writeRaw(huge, [0xFF, 0xFF, 0xFF, 0x7F])
        #expect(try replyStatus(huge) == -50)
        #expect(try huge.readFrame(limit: 1 << 20) == nil)

        // A truncated frame: the length promises more than comes before the end.
        let truncated = try greetedSocket(fixture)
        writeRaw(truncated, [100, 0, 0, 0, 1, 2, 3])
        shutdown(truncated.descriptor, Int32(SHUT_WR))
        #expect(try replyStatus(truncated) == -36)

        // A request without hello first.
        let rude = try UnixSocket.connect(to: fixture.socketPath)
        try rude.setReceiveTimeout(seconds: 30)
        try rude.writeFrame(statusRequest.bytes)
        #expect(try replyStatus(rude) == -50)

        // A disconnect in the middle of a request.
        do {
            let gone = try greetedSocket(fixture)
            writeRaw(gone, [50, 0, 0, 0, 1])
        }

        // Nothing changed, and the broker still serves.
        #expect(try store.status().itemCount == before)
        #expect(try store.data(matching: .genericPassword(service: "keep", account: "a")) == SecretBytes(utf8: "v"))
    }

    @Test("SIGKILL of the broker during 1,000 writes from 4 clients loses no acknowledged write")
    func brokerKilledDuringWrites_losesNoAcknowledgedWrite() throws {
        let fixture = try BrokerFixture()
        try fixture.store().unlock(passphrase: SecretBytes(utf8: BrokerFixture.passphraseText))
        let acknowledged = Mutex<[String]>([])
        let unexpected = Mutex<[String]>([])
        let killed = Atomic<Bool>(false)
        let restarts = Mutex<Int>(0)
        let group = DispatchGroup()
        for client in 0..<4 {
            group.enter()
            // A thread each: the four clients write at the same time, whatever the pool's width.
            Thread {
                defer { group.leave() }
                let store: BrokerStore
                do {
                    store = try fixture.store()
                } catch {
                    unexpected.withLock { $0.append("client \(client) could not connect: \(error)") }
                    return
                }
                var index = 0
                var failures = 0
                while index < 250 && failures < 400 {
                    let account = "c\(client)-\(index)"
                    do {
                        try store.add(.genericPassword(service: "durable", account: account, data: SecretBytes(utf8: account)))
                        acknowledged.withLock { $0.append(account) }
                        index += 1
                    } catch LockboxError.duplicateItem {
                        // Applied before the kill, unacknowledged: applied is allowed.
                        index += 1
                    } catch LockboxError.notAvailable {
                        failures += 1
                        usleep(20_000)
                    } catch LockboxError.interactionNotAllowed {
                        // The restarted broker starts locked: the keys died with the old one.
                        failures += 1
                        try? store.unlock(passphrase: SecretBytes(utf8: BrokerFixture.passphraseText))
                    } catch {
                        unexpected.withLock { $0.append("\(error)") }
                        return
                    }
                }
            }.start()
        }
        // Kill the broker once some writes went through, then start a new one.
        while acknowledged.withLock({ $0.count }) < 300 { usleep(5_000) }
        fixture.stop(signal: SIGKILL)
        killed.store(true, ordering: .relaxed)
        try fixture.start()
        restarts.withLock { $0 += 1 }
        group.wait()
        #expect(unexpected.withLock { $0 }.isEmpty, "\(unexpected.withLock { $0 })")
        let store = try fixture.store()
        let stored = try store.items(matching: Query(.genericPassword, attributes: ItemAttributes(service: "durable"), limit: .all, returning: .attributes))
        let accounts = Set(stored.compactMap(\.attributes.account))
        let written = acknowledged.withLock { $0 }
        #expect(written.count > 300)
        #expect(accounts.count == 1000, "\(accounts.count) of 1,000 writes present")
        let lost = written.filter { !accounts.contains($0) }
        #expect(lost.isEmpty, "acknowledged but lost: \(lost.prefix(10))")
    }

    @Test("a stale socket, another user's socket, an open directory and an older broker are refused with what to do")
    func untrustedSockets_areRefusedWithAdvice() throws {
        let directory = TemporaryDirectory("lbx-sock")
        let vault = directory.file("v.lockbox")
        // Stale: a socket file nobody listens on.
        let run = directory.file("run")
        mkdir(run, 0o700)
        let stale = run + "/stale.sock"
        let descriptor = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        _ = try UnixSocket.withAddress(stale) { bind(descriptor, $0, $1) }
        close(descriptor)
        chmod(stale, 0o600)
        do {
            _ = try BrokerStore.connect(socketPath: stale, vaultPath: vault, startOnDemand: false)
            Issue.record("a stale socket was used")
        } catch {
            #expect(error.message.contains("is stale"), "\(error.message)")
            #expect(error.message.contains("rm '"), "\(error.message)")
        }
        // A directory others can write.
        chmod(run, 0o777)
        do {
            _ = try BrokerStore.connect(socketPath: stale, vaultPath: vault, startOnDemand: false)
            Issue.record("an open directory was trusted")
        } catch {
            #expect(error.message.contains("chmod 700"), "\(error.message)")
        }
        chmod(run, 0o700)
        // A socket of another user (root can make one here).
        if getuid() == 0 {
            chown(stale, 65534, 65534)
            do {
                _ = try BrokerStore.connect(socketPath: stale, vaultPath: vault, startOnDemand: false)
                Issue.record("another user's socket was trusted")
            } catch {
                #expect(error.message.contains("belongs to another user"), "\(error.message)")
            }
            chown(stale, 0, 0)
        }
        // An older broker: a listener that answers hello with protocol 0.
        let old = run + "/old.sock"
        let listener = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        _ = try UnixSocket.withAddress(old) { bind(listener, $0, $1) }
        chmod(old, 0o600)
        listen(listener, 4)
        // The thread owns the listener and closes it once it accepted: a close here could come
        // first, and the thread's accept would then take whatever socket got the number.
        let thread = Thread {
            let connection = UnixSocket(descriptor: accept(listener, nil, nil))
            close(listener)
            _ = try? connection.readFrame(limit: 1 << 20)
            try? connection.writeFrame(
                BrokerCoding.success {
                    $0.integer(0)
                    $0.string(vault)
                    $0.integer(1)
                })
        }
        thread.start()
        do {
            _ = try BrokerStore.connect(socketPath: old, vaultPath: vault, startOnDemand: false)
            Issue.record("an older broker was used")
        } catch {
            #expect(error.code == .param)
            #expect(error.message.contains("older than this program's"), "\(error.message)")
            #expect(error.message.contains("Stop it (kill 1)"), "\(error.message)")
        }
    }

    @Test("a peer of another uid is refused by the broker")
    func otherUid_isRefused() throws {
        guard getuid() == 0 else {
            // Only root can connect as another user here; the check is the same code.
            #expect(getuid() != 0)
            return
        }
        let fixture = try BrokerFixture()
        chmod(fixture.directory.path, 0o755)
        chmod(fixture.directory.file("run"), 0o755)
        chmod(fixture.socketPath, 0o666)
        let script = """
            import socket, struct, sys, os
            os.setgid(65534); os.setuid(65534)
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(sys.argv[1])
            data = s.recv(4096)
            sys.stdout.write(data[4:].decode('latin-1'))
            """
        let result = try run("/usr/bin/python3", ["-c", script, fixture.socketPath], timeout: 30)
        #expect(result.standardOutput.contains("only the user's own processes are served"), "\(result.standardOutput) \(result.standardError)")
    }
}
