import Foundation
import Lockbox
import LockboxAuth
import LockboxTestSupport
import Synchronization
import Testing

extension LifecycleTests {
/// The built `lockbox` binary's OAuth verbs against the real server.
@Suite("lockbox login, token, logout and auth status, end to end")
struct CommandLineAuthTests {
    @Test func cliLoginTokenStatusLogout_endToEnd_printsTheTokenOnlyForTokenCommand() async throws {
        let server = try await TestServer.running()
        let vault = try TestVault()
        let binary = builtProduct("lockbox")
        #expect(FileManager.default.isExecutableFile(atPath: binary), "the lockbox binary is not built at \(binary)")
        let path = vault.vault.path

        // login: the device flow prints the code on stderr and polls until the test approves.
        let login = Process()
        login.executableURL = URL(fileURLWithPath: binary)
        login.arguments = ["--keychain", path, "login", "--issuer", server.url.absoluteString, "--client-id", TestServer.clientID, "--scope", "api"]
        let errors = Pipe()
        login.standardError = errors
        login.standardOutput = Pipe()
        try login.run()
        let collected = Mutex<String>("")
        var userCode: String?
        let deadline = Date().addingTimeInterval(20)
        while userCode == nil && Date() < deadline {
            let chunk = errors.fileHandleForReading.availableData
            if chunk.isEmpty { break }
            let text = collected.withLock { $0 += String(decoding: chunk, as: UTF8.self); return $0 }
            if let range = text.range(of: "enter the code ") {
                userCode = text[range.upperBound...].prefix { $0 != " " && $0 != "." && $0 != "\n" }.description
            }
        }
        let code = try #require(userCode, "lockbox login printed no user code: \(collected.withLock { $0 })")
        _ = try await server.admin("POST", "test/device/approve", ["user_code": code])
        login.waitUntilExit()
        let rest = errors.fileHandleForReading.readDataToEndOfFile()
        let loginOutput = collected.withLock { $0 } + String(decoding: rest, as: UTF8.self)
        #expect(login.terminationStatus == 0, "login: \(loginOutput)")
        #expect(loginOutput.contains("Signed in"))

        // token: the access token and a newline on stdout, nothing on stderr.
        let token = try run(binary, ["--keychain", path, "token"])
        #expect(token.status == 0, "token: \(token.standardError)")
        let accessToken = token.standardOutput.trimmingCharacters(in: .newlines)
        #expect(accessToken.count >= 16)
        #expect(token.standardOutput == accessToken + "\n")
        #expect(token.standardError.isEmpty)
        #expect(!loginOutput.contains(accessToken))

        // auth status lists the session and never the token.
        let status = try run(binary, ["--keychain", path, "auth", "status"])
        #expect(status.status == 0)
        #expect(status.standardOutput.contains(TestServer.clientID))
        #expect(!status.standardOutput.contains(accessToken))
        let dump = try run(binary, ["--keychain", path, "dump"])
        #expect(!dump.standardOutput.contains(accessToken))

        // logout revokes and forgets; token then fails with exit 1.
        let logout = try run(binary, ["--keychain", path, "logout"])
        #expect(logout.status == 0, "logout: \(logout.standardError)")
        #expect(!logout.standardError.contains(accessToken))
        let after = try run(binary, ["--keychain", path, "auth", "status"])
        #expect(after.standardOutput.contains("Not signed in"))
        let noToken = try run(binary, ["--keychain", path, "token"])
        #expect(noToken.status == 1)
        #expect(noToken.standardOutput.isEmpty)
        let counters = try await server.counters()
        #expect((counters["revocations"] ?? 0) >= 1, "server counters: \(counters)")
    }
}
}
