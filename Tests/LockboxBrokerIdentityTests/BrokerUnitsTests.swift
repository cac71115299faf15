import Foundation
import LockboxBrokerIdentity
import LockboxCore
import LockboxTestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

@Suite struct BrokerUnitsTests {
    static let contrib = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().path + "/contrib/systemd/"

    /// A unit directory and a runtime directory where no user manager runs.
    final class Places {
        let home = TemporaryDirectory("lockbox-units")
        var units: String { home.file("config/systemd/user") }
        var runtime: String { home.file("runtime") }
        init() { mkdir(home.file("runtime"), 0o700) }
    }

    @Test func contribFiles_areTheUnitsTheLibraryInstalls() throws {
        #expect(try String(contentsOfFile: Self.contrib + "lockboxd.socket", encoding: .utf8) == BrokerUnits.socketUnit)
        #expect(try String(contentsOfFile: Self.contrib + "lockboxd.service", encoding: .utf8) == BrokerUnits.serviceTemplate)
    }

    @Test func install_withoutAUserManager_writesTheUnitsAndTheWantsLink_andSaysSo() throws {
        let places = Places()
        let outcome = try BrokerUnits.install(brokerCommand: ["/usr/bin/env"], directory: places.units, runtimeDirectory: places.runtime)
        #expect(!outcome.managerReloaded)
        #expect(outcome.message.contains("No systemd user manager runs"))
        #expect(try String(contentsOfFile: places.units + "/lockboxd.socket", encoding: .utf8) == BrokerUnits.socketUnit)
        let service = try String(contentsOfFile: places.units + "/lockboxd.service", encoding: .utf8)
        #expect(service.contains("\nExecStart=/usr/bin/env\n"))
        #expect(try FileManager.default.destinationOfSymbolicLink(atPath: places.units + "/sockets.target.wants/lockboxd.socket") == "../lockboxd.socket")
        #expect(outcome.files.count == 3)

        // Again: the files are Lockbox's, so they are replaced.
        _ = try BrokerUnits.install(brokerCommand: ["/bin/true", "--idle-exit", "600"], directory: places.units, runtimeDirectory: places.runtime)
        #expect(try String(contentsOfFile: places.units + "/lockboxd.service", encoding: .utf8).contains("ExecStart=/bin/true --idle-exit 600\n"))
    }

    @Test func installedUnits_passSystemdAnalyzeVerify() throws {
        let places = Places()
        _ = try BrokerUnits.install(brokerCommand: ["/bin/true", "a b", "100%"], directory: places.units, runtimeDirectory: places.runtime)
        let result = try run(
            "/usr/bin/systemd-analyze", ["--user", "verify", "--man=no", places.units + "/lockboxd.socket", places.units + "/lockboxd.service"],
            environment: ["XDG_RUNTIME_DIR": places.runtime, "PATH": "/usr/bin:/bin"], directory: places.home.path)
        #expect(result.status == 0, "\(result.standardError)")
        #expect(result.standardError.isEmpty, "\(result.standardError)")
        #expect(result.standardOutput.isEmpty, "\(result.standardOutput)")
    }

    @Test func unitFileNotWrittenByLockbox_isNeitherReplacedNorRemoved() throws {
        let places = Places()
        _ = try run("/bin/mkdir", ["-p", places.units])
        let own = "[Unit]\nDescription=my own broker\n"
        try own.write(toFile: places.units + "/lockboxd.service", atomically: false, encoding: .utf8)

        let installError = #expect(throws: LockboxError.self) {
            try BrokerUnits.install(brokerCommand: ["/bin/true"], directory: places.units, runtimeDirectory: places.runtime)
        }
        #expect(installError?.code == .duplicateItem)
        #expect(installError?.message.contains("was not written by lockbox") == true)
        #expect(!FileManager.default.fileExists(atPath: places.units + "/lockboxd.socket"))

        let uninstallError = #expect(throws: LockboxError.self) { try BrokerUnits.uninstall(directory: places.units, runtimeDirectory: places.runtime) }
        #expect(uninstallError?.code == .duplicateItem)
        #expect(try String(contentsOfFile: places.units + "/lockboxd.service", encoding: .utf8) == own)
    }

    @Test func uninstall_removesWhatInstallWrote() throws {
        let places = Places()
        _ = try BrokerUnits.install(brokerCommand: ["/bin/true"], directory: places.units, runtimeDirectory: places.runtime)
        let outcome = try BrokerUnits.uninstall(directory: places.units, runtimeDirectory: places.runtime)
        #expect(outcome.files.count == 3)
        #expect(outcome.message.contains("No systemd user manager runs"))
        #expect(try FileManager.default.contentsOfDirectory(atPath: places.units).sorted() == ["sockets.target.wants"])
        #expect(try FileManager.default.contentsOfDirectory(atPath: places.units + "/sockets.target.wants").isEmpty)
        #expect(try BrokerUnits.uninstall(directory: places.units, runtimeDirectory: places.runtime).message.contains("No lockboxd unit was installed"))
    }

    @Test func missingBroker_isRefusedBeforeAnythingIsWritten() throws {
        let places = Places()
        let error = #expect(throws: LockboxError.self) {
            try BrokerUnits.install(brokerCommand: [places.home.file("lockboxd")], directory: places.units, runtimeDirectory: places.runtime)
        }
        #expect(error?.code == .param)
        #expect(error?.message.contains("--lockboxd") == true)
        #expect(!FileManager.default.fileExists(atPath: places.units))
    }

    /// The `lockbox` command's verbs, run as built, in a temporary home.
    @Test func lockboxCommand_installsAndUninstallsTheUnits() throws {
        let places = Places()
        let environment = [
            "HOME": places.home.path, "XDG_CONFIG_HOME": places.home.file("config"), "XDG_RUNTIME_DIR": places.runtime,
            "PATH": "/usr/bin:/bin",
        ]
        let installed = try run(builtProduct("lockbox"), ["broker", "install-units", "--lockboxd", "/bin/true"], environment: environment)
        #expect(installed.status == 0, "\(installed.standardError)")
        #expect(installed.standardOutput.contains("No systemd user manager runs"))
        #expect(try String(contentsOfFile: places.units + "/lockboxd.service", encoding: .utf8).contains("ExecStart=/bin/true\n"))

        let removed = try run(builtProduct("lockbox"), ["broker", "uninstall-units"], environment: environment)
        #expect(removed.status == 0, "\(removed.standardError)")
        #expect(!FileManager.default.fileExists(atPath: places.units + "/lockboxd.service"))

        let usage = try run(builtProduct("lockbox"), ["broker", "start"], environment: environment)
        #expect(usage.status == 64)
        #expect(usage.standardError.contains("install-units"))
    }

    @Test func brokerCommand_isQuotedForSystemd() throws {
        #expect(BrokerUnits.execQuoted("/usr/bin/lockboxd") == "/usr/bin/lockboxd")
        #expect(BrokerUnits.execQuoted("/opt/my tools/lockboxd") == "\"/opt/my tools/lockboxd\"")
        #expect(BrokerUnits.execQuoted("100%") == "100%%")
        #expect(BrokerUnits.execQuoted("a\"b$c") == "\"a\\\"b$$c\"")
        #expect(throws: LockboxError.self) { try BrokerUnits.serviceUnit(brokerCommand: ["lockboxd"]) }
        #expect(throws: LockboxError.self) { try BrokerUnits.serviceUnit(brokerCommand: ["/usr/bin/lockboxd", "a\nExecStartPre=/bin/evil"]) }
    }

    @Test func socketPath_isUnderTheRuntimeDirectory() {
        let runtime = ProcessInfo.processInfo.environment["XDG_RUNTIME_DIR"]
        #expect(BrokerUnits.socketPath == runtime.flatMap { $0.hasPrefix("/") ? $0 + "/lockbox/lockboxd.sock" : nil })
        #expect(BrokerUnits.socketUnit.contains("ListenStream=%t/lockbox/lockboxd.sock\n"))
    }
}
