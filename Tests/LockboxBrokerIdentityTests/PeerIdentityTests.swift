import CPeerIdentity
import Foundation
import LockboxBrokerIdentity
import LockboxCore
import LockboxTestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Real client processes connect to a real socket; the broker side identifies them.
@Suite struct PeerIdentityTests {
    /// Both ways of pinning: the kernel's SO_PEERPIDFD, and pidfd_open as older kernels do.
    static let pinnings = [true, false]

    @Test(arguments: pinnings)
    func connectedChild_isIdentifiedByExecutableUidPidAndStartTime(socketPidfd: Bool) throws {
        let listener = try Listener()
        let client = try ClientProcess(connectingTo: listener.path)
        defer { client.finish() }
        let connection = try listener.accept()
        defer { close(connection) }

        let identity = try PeerIdentity.identify(socket: connection, socketPidfd: socketPidfd)

        #expect(identity.pid == client.pid)
        #expect(identity.uid == geteuid())
        #expect(identity.executablePath == realPath(systemPython))
        #expect(identity.startTime == (try startTime(of: client.pid)))
        #expect(identity.executableSHA256 == nil)
        let cgroup = try String(contentsOfFile: "/proc/\(client.pid)/cgroup", encoding: .utf8)
        if let unit = SystemdCgroup.userService(cgroupFile: cgroup, uid: geteuid()) {
            #expect(identity.kind == .systemdUnit(unit))
        } else {
            #expect(identity.kind == .executable(path: realPath(systemPython)))
            #expect(identity.name == "exe:" + realPath(systemPython))
        }
    }

    @Test("a program whose file was replaced at its path since it started is refused, pinned or not: its path no longer names it")
    func replacedExecutable_isRefused() throws {
        let listener = try Listener()
        let copy = listener.directory.file("client-a")
        _ = try run("/bin/cp", [realPath(systemPython), copy])
        let expected = try sha256sum(copy)
        let client = try ClientProcess(connectingTo: listener.path, program: [copy], environment: ["PYTHONHOME": "/usr"])
        defer { client.finish() }
        let connection = try listener.accept()
        defer { close(connection) }
        #expect(try PeerIdentity.identify(socket: connection, hashExecutable: true).executableSHA256 == expected)

        // Another program is put at the path: the process runs a file the path no longer names.
        let replacement = listener.directory.file("replacement")
        _ = try run("/bin/cp", ["/bin/true", replacement])
        #expect(rename(replacement, copy) == 0)
        let error = #expect(throws: LockboxError.self) { try PeerIdentity.identify(socket: connection, hashExecutable: true) }
        #expect(error?.message.contains("start it again") == true, "\(error?.message ?? "")")
    }

    @Test func twoExecutables_haveTwoIdentities() throws {
        let listener = try Listener()
        var names: [String] = []
        for name in ["client-a", "client-b"] {
            let copy = listener.directory.file(name)
            _ = try run("/bin/cp", [realPath(systemPython), copy])
            let client = try ClientProcess(connectingTo: listener.path, program: [copy], environment: ["PYTHONHOME": "/usr"])
            let connection = try listener.accept()
            defer { close(connection) }
            names.append(try PeerIdentity.identify(socket: connection).name)
            client.finish()
        }
        #expect(names == ["exe:" + listener.directory.file("client-a"), "exe:" + listener.directory.file("client-b")])
    }

    @Test(arguments: pinnings)
    func processThatExitedAndWasReaped_isRefused(socketPidfd: Bool) throws {
        let listener = try Listener()
        let client = try ClientProcess(connectingTo: listener.path, exitAtOnce: true)
        let connection = try listener.accept()
        defer { close(connection) }
        #expect(client.reap() == 0)

        let error = #expect(throws: LockboxError.self) { try PeerIdentity.identify(socket: connection, socketPidfd: socketPidfd) }
        #expect(error?.code == .authFailed)
        #expect(error?.message.contains("exited") == true)
    }

    @Test(arguments: pinnings)
    func zombieProcess_isRefused(socketPidfd: Bool) throws {
        let listener = try Listener()
        let client = try ClientProcess(connectingTo: listener.path, exitAtOnce: true)
        defer { client.reap() }
        let connection = try listener.accept()
        defer { close(connection) }
        try client.waitUntilZombie()

        let error = #expect(throws: LockboxError.self) { try PeerIdentity.identify(socket: connection, socketPidfd: socketPidfd) }
        #expect(error?.code == .authFailed)
    }

    @Test(arguments: [true, false], pinnings)
    func processKilledMidIdentification_isRefused(reaped: Bool, socketPidfd: Bool) throws {
        let listener = try Listener()
        let client = try ClientProcess(connectingTo: listener.path)
        defer { client.reap() }
        let connection = try listener.accept()
        defer { close(connection) }

        let error = #expect(throws: LockboxError.self) {
            try PeerIdentity.identify(socket: connection, hashExecutable: true, socketPidfd: socketPidfd) {
                client.kill()
                if reaped { client.reap() } else { try? client.waitUntilZombie() }
            }
        }
        #expect(error?.code == .authFailed)
        #expect(error?.message.contains("exited") == true)
    }

    /// The process that connected hands the connection to a child and closes its own end. The
    /// kernel's SO_PEERPIDFD still names the process that connected (it is alive); a pidfd
    /// opened by number is only trusted for a process that holds the connection, so that path
    /// refuses it.
    @Test func connectionGivenAwayByItsProcess_isRefusedWhenPinnedByNumber() throws {
        let listener = try Listener()
        let client = try ClientProcess(
            [
                systemPython, "-c",
                """
                import ctypes, os, socket, sys
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.connect(sys.argv[1])
                if os.fork() == 0:
                    ctypes.CDLL(None).prctl(1, 9)
                    sys.stdin.buffer.read()
                    os._exit(0)
                s.close()
                sys.stdin.buffer.read()
                """,
                listener.path,
            ])
        defer { client.finish() }
        let connection = try listener.accept()
        defer { close(connection) }
        // The child has the connection once the parent no longer holds its end.
        let connected = client.pid
        var peerInode: UInt32 = 0
        #expect(lockbox_unix_peer_inode(connection, &peerInode) == 0)
        func holdsASocket() -> Bool {
            let descriptors = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(connected)/fd")) ?? []
            return descriptors.contains {
                (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(connected)/fd/\($0)")) == "socket:[\(peerInode)]"
            }
        }
        var waited = 0
        while holdsASocket() && waited < 400 {
            usleep(25_000)
            waited += 1
        }
        try #require(!holdsASocket(), "process \(connected) kept its socket")

        // Refused on both paths: a process that no longer holds the connection may have run
        // another program since it connected (see below).
        for socketPidfd in [false, true] {
            let error = #expect(throws: LockboxError.self) { try PeerIdentity.identify(socket: connection, socketPidfd: socketPidfd) }
            #expect(error?.code == .authFailed)
            #expect(error?.message.contains("does not hold the connection") == true, "\(error?.message ?? "")")
        }
    }

    /// A process connects, forks a child that keeps the connection, then runs another program
    /// (exec keeps the pid, the pidfd and the start time): the broker would read that program as
    /// the client. It holds the connection only through a descriptor without close-on-exec,
    /// or (with close-on-exec) not at all: refused either way, on both paths.
    /// A client holding thousands of descriptors: its `/proc/PID/fd` fills `readdir`'s buffer,
    /// whose last entry's name must be read up to its end only (reading the whole 256-byte field
    /// ran past the buffer and crashed the broker).
    @Test func clientWithThousandsOfDescriptors_isIdentified() throws {
        let listener = try Listener()
        let client = try ClientProcess(
            connectingTo: listener.path,
            beforeConnect: """
                import os, resource
                soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
                resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
                kept = [os.open("/dev/null", os.O_RDONLY) for _ in range(min(hard, 4096) - 64)]
                """)
        defer { client.finish() }
        let connection = try listener.accept()
        defer { close(connection) }
        let identity = try PeerIdentity.identify(socket: connection)
        #expect(identity.pid == client.pid)
    }

    /// A process whose exec takes long (it closes tens of thousands of close-on-exec
    /// descriptors, while the kernel already shows the new program), identified as soon as the
    /// new program shows: never identified as that program.
    @Test func identifiedInTheMiddleOfAnExec_isNeverTheNewProgram() throws {
        let listener = try Listener()
        let client = try ClientProcess(
            [
                systemPython, "-c",
                """
                import os, resource, socket, sys
                soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
                limit = hard if hard != resource.RLIM_INFINITY else 1 << 20
                limit = min(limit, 200000)
                resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
                kept = [os.open("/dev/null", os.O_RDONLY) for _ in range(limit - 64)]
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.connect(sys.argv[1])
                if os.fork() == 0:
                    sys.stdin.buffer.read()
                    os._exit(0)
                os.execv("/bin/cat", ["cat"])
                """,
                listener.path,
            ])
        defer { client.finish() }
        let connection = try listener.accept()
        defer { close(connection) }
        let cat = realPath("/bin/cat")
        var waited = 0
        while (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(client.pid)/exe")) != cat && waited < 4000 {
            waited += 1
        }
        let error = #expect(throws: LockboxError.self) { try PeerIdentity.identify(socket: connection) }
        #expect(error?.code == .authFailed, "\(error?.message ?? "")")
    }

    @Test(arguments: [false, true])
    func connectThenExecAnotherProgram_isRefused(closeOnExec: Bool) throws {
        let listener = try Listener()
        let client = try ClientProcess(
            [
                systemPython, "-c",
                """
                import os, socket, sys
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.set_inheritable(sys.argv[2] == "keep")
                s.connect(sys.argv[1])
                if os.fork() == 0:
                    sys.stdin.buffer.read()
                    os._exit(0)
                os.execv("/bin/cat", ["cat"])
                """,
                listener.path, closeOnExec ? "close" : "keep",
            ])
        defer { client.finish() }
        let connection = try listener.accept()
        defer { close(connection) }
        var waited = 0
        while (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(client.pid)/exe")) != realPath("/bin/cat") && waited < 400 {
            usleep(25_000)
            waited += 1
        }
        try #require(waited < 400, "the client did not run cat")
        for socketPidfd in [false, true] {
            let error = #expect(throws: LockboxError.self) { try PeerIdentity.identify(socket: connection, socketPidfd: socketPidfd) }
            #expect(error?.code == .authFailed)
            let expected = closeOnExec ? "does not hold the connection" : "without close-on-exec"
            #expect(error?.message.contains(expected) == true, "\(error?.message ?? "")")
        }
    }

    /// The attack pinning exists for: the process that connected exits, leaving the connection
    /// to a child, and another program is started under its process number (clone3 with
    /// set_tid, which needs root). Neither path identifies the newcomer.
    @Test(.enabled(if: geteuid() == 0, "needs root to choose a new process's number (clone3 set_tid)"))
    func processNumberReusedAfterTheClientExited_isRefused() throws {
        let listener = try Listener()
        let client = try ClientProcess(
            [
                systemPython, "-c",
                """
                import os, socket, sys
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.connect(sys.argv[1])
                if os.fork() == 0:
                    sys.stdin.buffer.read()
                os._exit(0)
                """,
                listener.path,
            ])
        defer { client.finish() }
        let connection = try listener.accept()
        defer { close(connection) }
        #expect(client.reap() == 0)
        let number = client.pid

        // A program started under the same number, by clone3(set_tid).
        let impostor = try ClientProcess([
            systemPython, "-c",
            """
            import ctypes, os, struct, sys
            libc = ctypes.CDLL(None, use_errno=True)
            tid = (ctypes.c_int * 1)(int(sys.argv[1]))
            arguments = ctypes.create_string_buffer(struct.pack("11Q", 0, 0, 0, 0, 17, 0, 0, 0, ctypes.addressof(tid), 1, 0))
            child = libc.syscall(435, arguments, 88)
            if child == 0:
                os.execv("/usr/bin/python3", ["python3", "-c", "import sys; sys.stdin.buffer.read()"])
            if child < 0:
                print("clone3:", os.strerror(ctypes.get_errno()), file=sys.stderr)
                sys.exit(1)
            os.waitpid(child, 0)
            """,
            String(number),
        ])
        defer { impostor.finish() }
        var started = false
        for _ in 0..<400 {
            if let link = try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(number)/exe"), link.contains("python") {
                started = true
                break
            }
            usleep(25_000)
        }
        try #require(started, "no process took number \(number) (clone3 with set_tid failed, or the number was taken)")

        for socketPidfd in [false, true] {
            let error = #expect(throws: LockboxError.self) { try PeerIdentity.identify(socket: connection, socketPidfd: socketPidfd) }
            #expect(error?.code == .authFailed)
        }
        let byNumber = #expect(throws: LockboxError.self) { try PeerIdentity.identify(socket: connection, socketPidfd: false) }
        #expect(byNumber?.message.contains("does not hold the connection") == true, "\(byNumber?.message ?? "")")
    }

    @Test(.enabled(if: geteuid() == 0, "needs root to run a client as another user"))
    func clientOfAnotherUser_isRefused() throws {
        let listener = try Listener(mode: 0o755)
        let client = try ClientProcess(
            connectingTo: listener.path, program: ["/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", systemPython])
        defer { client.finish() }
        let connection = try listener.accept()
        defer { close(connection) }

        let error = #expect(throws: LockboxError.self) { try PeerIdentity.identify(socket: connection) }
        #expect(error?.code == .authFailed)
        #expect(error?.message.contains("runs as user 65534") == true)
    }

    /// A non-dumpable client hides /proc/PID/exe from processes without CAP_SYS_PTRACE: an
    /// ordinary user's broker refuses it with the reason, root's identifies it.
    @Test func nonDumpableClient_isRefusedByAnOrdinaryUsersBroker() throws {
        let listener = try Listener()
        let client = try ClientProcess(
            connectingTo: listener.path, beforeConnect: "import ctypes; assert ctypes.CDLL(None).prctl(4, 0, 0, 0, 0) == 0")
        defer { client.finish() }
        let connection = try listener.accept()
        defer { close(connection) }

        if geteuid() == 0 {
            #expect(try PeerIdentity.identify(socket: connection).executablePath == realPath(systemPython))
        } else {
            let error = #expect(throws: LockboxError.self) { try PeerIdentity.identify(socket: connection) }
            #expect(error?.code == .authFailed)
            #expect(error?.message.contains("PR_SET_DUMPABLE") == true)
        }
    }

    @Test func programRunFromAMemfd_isRefused() throws {
        let listener = try Listener()
        let inner = "import socket, sys; s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); sys.stdin.buffer.read()"
        let outer = """
            import os, sys
            fd = os.memfd_create("client", 0)
            with open("\(realPath(systemPython))", "rb") as f:
                os.write(fd, f.read())
            os.execve(f"/proc/self/fd/{fd}", ["python3", "-c", sys.argv[1], sys.argv[2]], dict(os.environ, PYTHONHOME="/usr"))
            """
        let client = try ClientProcess([systemPython, "-c", outer, inner, listener.path])
        defer { client.finish() }
        let connection = try listener.accept()
        defer { close(connection) }

        let error = #expect(throws: LockboxError.self) { try PeerIdentity.identify(socket: connection) }
        #expect(error?.code == .authFailed)
        #expect(error?.message.contains("/memfd:client") == true)
    }

    @Test func notAUnixSocket_isAnIOError() throws {
        var ends: [Int32] = [0, 0]
        #expect(pipe(&ends) == 0)
        defer { ends.forEach { close($0) } }
        let error = #expect(throws: LockboxError.self) { try PeerIdentity.identify(socket: ends[0]) }
        #expect(error?.code == .io)
    }
}

func sha256sum(_ path: String) throws -> String {
    let result = try run("/usr/bin/sha256sum", [path])
    return String(String(decoding: result.standardOutputBytes, as: UTF8.self).prefix(64))
}
