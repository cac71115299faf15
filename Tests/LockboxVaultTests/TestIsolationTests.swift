import Foundation
import Lockbox
import LockboxTestSupport
import Testing

/// Tests never write into the real home: the test process runs in a temporary one, and
/// everything a vault keeps outside its file with the default settings lands there.
@Suite("test isolation")
struct TestIsolationTests {
    @Test("HOME and the XDG base directories point into a temporary home, not the real one")
    func environment_pointsIntoTemporaryHome() throws {
        let home = TestHome.path
        #expect(home.hasPrefix("/tmp/lockbox-test-home-"))
        #expect(home != TestHome.originalHome)
        #expect(ProcessInfo.processInfo.environment["HOME"] == home)
        for name in ["XDG_STATE_HOME", "XDG_DATA_HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME"] {
            let value = try #require(ProcessInfo.processInfo.environment[name], "\(name) is unset")
            #expect(value.hasPrefix(home + "/"), "\(name) is \(value)")
        }
    }

    @Test("the default device key, remembered generation and session marker land in the temporary home")
    func defaultStateFiles_landInTemporaryHome() throws {
        let fixture = try VaultFixture()
        try fixture.vault.add(.genericPassword(service: "isolation", account: "a", data: SecretBytes(utf8: "v")))
        fixture.vault.lock()
        let state = TestHome.path + "/.local/state/lockbox"
        #expect(FileManager.default.fileExists(atPath: state + "/device-key"))
        let generations = try FileManager.default.contentsOfDirectory(atPath: state + "/generations")
        #expect(!generations.isEmpty)
        let sessions = try FileManager.default.contentsOfDirectory(atPath: state + "/sessions")
        #expect(!sessions.isEmpty)
    }
}
