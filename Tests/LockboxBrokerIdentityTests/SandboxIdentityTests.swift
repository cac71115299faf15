import Foundation
import LockboxBrokerIdentity
import LockboxCore
import LockboxTestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// A Flatpak-like sandbox: the client runs chrooted into a root that holds a `/.flatpak-info`
/// (as `flatpak run` sets one up with bubblewrap), as root directly, as an ordinary user in a
/// user namespace of its own. The client is a statically linked C program and the socket is
/// hard-linked into the root, so no mount is needed: that also runs where mount and user
/// namespaces cannot be made, such as inside a chroot (a machine built with debootstrap).
@Suite struct FlatpakIdentityTests {
    static let clientSource = """
        #include <sys/socket.h>
        #include <sys/un.h>
        #include <unistd.h>
        int main(void) {
            struct sockaddr_un address = { .sun_family = AF_UNIX, .sun_path = "/broker.sock" };
            int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
            if (s < 0 || connect(s, (struct sockaddr *)&address, sizeof address) != 0) return 1;
            char buffer[64];
            while (read(0, buffer, sizeof buffer) > 0) {}
            return 0;
        }
        """

    /// Starts the client chrooted into a root that holds it, the listener's socket at
    /// `/broker.sock`, and whatever `prepare` puts there.
    func sandboxedClient(_ listener: Listener, prepare: (String) throws -> Void) throws -> ClientProcess {
        let root = listener.directory.file("root")
        #expect(mkdir(root, 0o755) == 0)
        let source = listener.directory.file("client.c")
        try Self.clientSource.write(toFile: source, atomically: false, encoding: .utf8)
        let compiled = try run("/usr/bin/cc", ["-static", "-O1", "-o", root + "/client", source])
        guard compiled.status == 0 else {
            throw TestFailure("cc -static failed (the test needs gcc and libc6-dev): \(compiled.standardError)")
        }
        guard link(listener.path, root + "/broker.sock") == 0 else { throw TestFailure("link of the socket: errno \(errno)") }
        try prepare(root)
        if geteuid() == 0 {
            return try ClientProcess(["/usr/sbin/chroot", root, "/client"])
        }
        return try ClientProcess(["/usr/bin/unshare", "--user", "--map-root-user", "/usr/sbin/chroot", root, "/client"])
    }

    @Test func clientWithFlatpakInfo_isIdentifiedByItsAppID() throws {
        let listener = try Listener(mode: 0o755)
        let client = try sandboxedClient(listener) { root in
            try "[Application]\nname=org.example.Fake\nruntime=runtime/org.freedesktop.Platform/x86_64/23.08\n\n[Instance]\ninstance-id=1\n"
                .write(toFile: root + "/.flatpak-info", atomically: false, encoding: .utf8)
        }
        defer { client.finish() }
        let connection = try listener.accept()
        defer { close(connection) }

        let identity = try PeerIdentity.identify(socket: connection)
        #expect(identity.kind == .flatpak(appID: "org.example.Fake"))
        #expect(identity.name == "org.example.Fake")
        #expect(identity.uid == geteuid())
    }

    @Test func flatpakInfoThatIsASymbolicLink_isRefused() throws {
        let listener = try Listener(mode: 0o755)
        let client = try sandboxedClient(listener) { root in
            try "[Application]\nname=org.example.Other\n".write(toFile: root + "/other-info", atomically: false, encoding: .utf8)
            #expect(symlink("other-info", root + "/.flatpak-info") == 0)
        }
        defer { client.finish() }
        let connection = try listener.accept()
        defer { close(connection) }

        let error = #expect(throws: LockboxError.self) { try PeerIdentity.identify(socket: connection) }
        #expect(error?.code == .authFailed)
        #expect(error?.message.contains(".flatpak-info") == true)
    }

    @Test("a program whose file is no longer the one at its path (replaced, or another file under that path in a namespace of its own) is refused")
    func programNotAtItsPath_isRefused() throws {
        let listener = try Listener(mode: 0o755)
        var program = ""
        let client = try sandboxedClient(listener) { root in program = root + "/client" }
        defer { client.finish() }
        let connection = try listener.accept()
        defer { close(connection) }
        // Identified while its file is the one at its path.
        let before = try PeerIdentity.identify(socket: connection)
        #expect(before.executablePath == program)
        // Another file given its path: what /proc/PID/exe names ("PATH (deleted)") is no longer it.
        let other = program + ".new"
        #expect(FileManager.default.createFile(atPath: other, contents: try Data(contentsOf: URL(fileURLWithPath: program))))
        #expect(rename(other, program) == 0)
        let error = #expect(throws: LockboxError.self) { try PeerIdentity.identify(socket: connection) }
        #expect(error?.code == .authFailed)
        #expect(error?.message.contains("does not run the file at \(program)") == true, "\(error?.message ?? "")")
    }

    @Test func flatpakInfoNamingNoApplication_isRefused() throws {
        let listener = try Listener(mode: 0o755)
        let client = try sandboxedClient(listener) { root in
            try "[Runtime]\nname=org.freedesktop.Platform\n".write(toFile: root + "/.flatpak-info", atomically: false, encoding: .utf8)
        }
        defer { client.finish() }
        let connection = try listener.accept()
        defer { close(connection) }

        let error = #expect(throws: LockboxError.self) { try PeerIdentity.identify(socket: connection) }
        #expect(error?.code == .authFailed)
        #expect(error?.message.contains("names no valid application") == true)
    }

    @Test func flatpakInfoParser_readsTheApplicationGroupOnly() {
        #expect(FlatpakInfo.appID(keyFile: "[Application]\nname=org.gnome.Maps\n") == "org.gnome.Maps")
        #expect(FlatpakInfo.appID(keyFile: "# comment\n[Instance]\nname=org.other.App\n[Application]\n name = com.example.My_App-2 \n") == "com.example.My_App-2")
        #expect(FlatpakInfo.appID(keyFile: "[Runtime]\nname=org.freedesktop.Platform\n") == nil)
        #expect(FlatpakInfo.appID(keyFile: "[Application]\nname=noDots\n") == nil)
        #expect(FlatpakInfo.appID(keyFile: "[Application]\nname=org.9digit.App\n") == nil)
        #expect(FlatpakInfo.appID(keyFile: "[Application]\nname=org.exa-mple.App\n") == nil)
        #expect(FlatpakInfo.appID(keyFile: "[Application]\nname=unit:x.y\n") == nil)
    }
}

/// The systemd unit of a process, from `/proc/PID/cgroup`.
@Suite struct SystemdUnitIdentityTests {
    @Test func thisMachinesOwnCgroupFile_parsesAsItsLayoutSays() throws {
        let text = try String(contentsOfFile: "/proc/self/cgroup", encoding: .utf8)
        let unified = text.split(separator: "\n").first { $0.hasPrefix("0::") }.map { String($0.dropFirst(3)) }
        let expected = unified.flatMap { path -> String? in
            let parts = path.split(separator: "/")
            guard let manager = parts.firstIndex(of: "user@\(geteuid()).service"),
                let unit = parts[(manager + 1)...].first(where: { !$0.hasSuffix(".slice") }), unit.hasSuffix(".service")
            else { return nil }
            return String(unit)
        }
        #expect(SystemdCgroup.userService(cgroupFile: text, uid: geteuid()) == expected)
    }

    @Test func userManagerService_isTheUnit() {
        let uid: UInt32 = 1000
        let base = "0::/user.slice/user-1000.slice/user@1000.service"
        #expect(SystemdCgroup.userService(cgroupFile: base + "/app.slice/backup.service\n", uid: uid) == "backup.service")
        #expect(SystemdCgroup.userService(cgroupFile: base + "/app.slice/sync@work.service/worker\n", uid: uid) == "sync@work.service")
        #expect(SystemdCgroup.userService(cgroupFile: base + "/app.slice/app-gnome-org.gnome.Terminal-4242.scope\n", uid: uid) == nil)
        #expect(SystemdCgroup.userService(cgroupFile: base + "/init.scope\n", uid: uid) == nil)
        #expect(SystemdCgroup.userService(cgroupFile: base + "/app.slice/backup.service\n", uid: 1001) == nil)
        #expect(SystemdCgroup.userService(cgroupFile: "0::/system.slice/cron.service\n", uid: uid) == nil)
        #expect(SystemdCgroup.userService(cgroupFile: "0::/user.slice/user-1000.slice/session-3.scope\n", uid: uid) == nil)
        // A hybrid layout: the unified line is empty, systemd's named hierarchy has the path.
        let hybrid = "12:memory:/user.slice\n1:name=systemd:/user.slice/user-1000.slice/user@1000.service/backup.service\n0::/\n"
        #expect(SystemdCgroup.userService(cgroupFile: hybrid, uid: uid) == "backup.service")
    }

    /// Two transient services of a running user manager are two identities. Runs only where a
    /// systemd user manager runs (none in this project's CI container).
    @Test(.enabled(if: FileManager.default.fileExists(atPath: "/run/user/\(geteuid())/systemd/private"), "needs a systemd user manager"))
    func servicesStartedBySystemdRun_areIdentifiedByUnit() throws {
        let listener = try Listener()
        let unit = "lockbox-identity-\(getpid()).service"
        let script = "import socket, sys, time; s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); time.sleep(30)"
        let client = try ClientProcess(
            ["/usr/bin/systemd-run", "--user", "--quiet", "--unit=\(unit)", systemPython, "-c", script, listener.path])
        defer {
            _ = try? run("/usr/bin/systemctl", ["--user", "stop", unit])
            client.finish()
        }
        let connection = try listener.accept()
        defer { close(connection) }
        #expect(try PeerIdentity.identify(socket: connection).kind == .systemdUnit(unit))
    }
}

/// The parsers of text another process controls (its `/.flatpak-info`, its cgroup path) answer
/// every input with a valid name or nil.
@Suite struct PeerTextParserRobustnessTests {
    @Test func mutatedFlatpakInfoAndCgroupFiles_giveAValidNameOrNil() {
        var random = SeededGenerator("peerTextParsers")
        let flatpakInfo = Array("[Application]\nname=org.example.App\nruntime=runtime/x/y/z\n[Instance]\nid=1\n".utf8)
        let cgroup = Array("0::/user.slice/user-1000.slice/user@1000.service/app.slice/backup.service\n".utf8)
        let alphabet = Array("[]=#:/\n\r .-_@\\aZ9é\u{0}".utf8)
        for _ in 0..<3000 {
            for (sample, isFlatpak) in [(flatpakInfo, true), (cgroup, false)] {
                var bytes = sample
                for _ in 0..<Int.random(in: 1...6, using: &random) {
                    let position = Int.random(in: 0..<bytes.count, using: &random)
                    if Bool.random(using: &random) {
                        bytes[position] = alphabet.randomElement(using: &random)!
                    } else {
                        bytes.insert(alphabet.randomElement(using: &random)!, at: position)
                    }
                }
                let text = String(decoding: bytes, as: UTF8.self)
                if isFlatpak {
                    if let appID = FlatpakInfo.appID(keyFile: text) {
                        #expect(!appID.contains(":") && !appID.contains("/") && appID.contains("."), "seed \(random.seed): \(appID)")
                    }
                } else if let unit = SystemdCgroup.userService(cgroupFile: text, uid: 1000) {
                    #expect(unit.hasSuffix(".service") && !unit.contains("/"), "seed \(random.seed): \(unit)")
                }
            }
        }
    }
}
