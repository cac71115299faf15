import Foundation
import Lockbox
import LockboxTestSupport
import Testing

/// `LOCKBOX_BACKEND` and `LOCKBOX_UNLOCK_CACHE`: every malformed value is refused with
/// errSecParam and a message naming the variable and what it accepts; nothing falls back.
@Suite("Keychain.open: the environment's backend and unlock cache")
struct KeychainEnvironmentTests {
    @Test("LOCKBOX_BACKEND names a backend exactly; unset and empty choose nothing")
    func backend_validNames() throws {
        #expect(try Keychain.backend(environmentValue: nil) == nil)
        #expect(try Keychain.backend(environmentValue: "") == nil)
        #expect(try Keychain.backend(environmentValue: "vault") == .vault)
        #expect(try Keychain.backend(environmentValue: "secret-service") == .secretService)
    }

    @Test(
        "a LOCKBOX_BACKEND that is not a backend's exact name is errSecParam",
        arguments: ["Vault", "VAULT", " vault", "vault ", "vault\n", "secretService", "secret_service", "secretservice", "plaintext", "file", "keychain", "-"])
    func backend_malformed_throwsParam(value: String) {
        do {
            let backend = try Keychain.backend(environmentValue: value)
            Issue.record("\(value.debugDescription) chose \(String(describing: backend))")
        } catch {
            #expect(error.code == .param)
            #expect(error.message.contains("LOCKBOX_BACKEND"))
            #expect(error.message.contains("vault, secret-service"))
        }
    }

    @Test("LOCKBOX_UNLOCK_CACHE is keyring or process; unset and empty keep the configuration's")
    func unlockCache_validNames() throws {
        #expect(try Keychain.unlockCache(environmentValue: nil) == nil)
        #expect(try Keychain.unlockCache(environmentValue: "") == nil)
        #expect(try Keychain.unlockCache(environmentValue: "keyring") == .kernelKeyring)
        #expect(try Keychain.unlockCache(environmentValue: "process") == .processMemory)
    }

    @Test(
        "a LOCKBOX_UNLOCK_CACHE other than keyring or process is errSecParam",
        arguments: ["Process", "PROCESS", " process", "process\n", "processMemory", "kernelKeyring", "kernel", "memory", "none", "off", "0"])
    func unlockCache_malformed_throwsParam(value: String) {
        do {
            let cache = try Keychain.unlockCache(environmentValue: value)
            Issue.record("\(value.debugDescription) chose \(String(describing: cache))")
        } catch {
            #expect(error.code == .param)
            #expect(error.message.contains("LOCKBOX_UNLOCK_CACHE"))
            #expect(error.message.contains("`keyring` or `process`"))
        }
    }

    @Test("the programs refuse a malformed variable with status 1 and the message, and touch no keychain")
    func programs_refuseMalformedVariables() throws {
        let directory = TemporaryDirectory()
        let keychain = directory.file("never-created.lockbox")
        for (name, value, verb) in [
            ("LOCKBOX_BACKEND", "plaintext", ["find-generic-password", "-s", "s", "-a", "a"]),
            ("LOCKBOX_UNLOCK_CACHE", "memory", ["find-generic-password", "-s", "s", "-a", "a"]),
            ("LOCKBOX_UNLOCK_CACHE", "memory", ["init", "--passphrase-stdin"]),
        ] {
            var environment = ProcessInfo.processInfo.environment
            environment[name] = value
            let result = try run(
                builtProduct("lockbox"), ["--keychain", keychain] + verb, input: Array("a passphrase\n".utf8), environment: environment)
            #expect(result.status == 1, "\(name)=\(value) \(verb[0]): status \(result.status)")
            #expect(result.standardError.contains(name), "\(result.standardError)")
            #expect(result.standardError.contains("(OSStatus -50)"), "\(result.standardError)")
            #expect(!FileManager.default.fileExists(atPath: keychain))
        }
    }
}
