import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import Lockbox
import LockboxAuth
import LockboxAuthKeys
import LockboxKeys
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
        let (loginStatus, loginOutput) = try await deviceLogin(binary, path: path, server: server)
        #expect(loginStatus == 0, "login: \(loginOutput)")
        #expect(loginOutput.contains("Signed in"))

        // token: the access token and a newline on stdout, nothing on stderr.
        let token = try run(binary, ["--keychain", path, "token"])
        #expect(token.status == 0, "token: \(token.standardError)")
        let accessToken = token.standardOutput.trimmingCharacters(in: .newlines)
        #expect(accessToken.count >= 16)
        #expect(token.standardOutput == accessToken + "\n")
        #expect(token.standardError.isEmpty)
        #expect(!loginOutput.contains(accessToken))
        // A bearer session needs no proof: asking for one is a usage error, and prints no token.
        let proofAsked = try run(binary, ["--keychain", path, "token", "--url", server.url.appendingPathComponent("api/resource").absoluteString])
        #expect(proofAsked.status == 64, "token --url: \(proofAsked.standardError)")
        #expect(proofAsked.standardOutput.isEmpty)
        #expect(proofAsked.standardError.contains("bearer"))

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

    @Test("lockbox login --dpop: the session's tokens are bound to a non-extractable key in the vault; token --url prints a proof the resource accepts, refreshes carry proofs, and logout deletes the key")
    func cliDPoPLogin_bindsTokensAndPrintsProofs() async throws {
        let server = try await TestServer.running()
        let vault = try TestVault()
        let binary = builtProduct("lockbox")
        let path = vault.vault.path
        // Canaries: the first tokens the server issues, searched for wherever they must not be.
        let accessCanary = "canary-access-" + UUID().uuidString
        let refreshCanary = "canary-refresh-" + UUID().uuidString
        try await server.faults(["canary_access_token": accessCanary, "canary_refresh_token": refreshCanary])

        let (loginStatus, loginOutput) = try await deviceLogin(binary, path: path, server: server, extra: ["--dpop"])
        #expect(loginStatus == 0, "login --dpop: \(loginOutput)")
        #expect(loginOutput.contains("Signed in"))

        // One session key, non-extractable, in the vault; the tokens are bound to it.
        let keys = try await SoftwareKeyStore(vault: vault.vault).keys(applicationTag: ManagedProofSigningKey.applicationTag)
        #expect(keys.count == 1)
        let key = try ManagedProofSigningKey(try #require(keys.first))
        #expect(!key.key.isExtractable)
        #expect(try await server.boundThumbprints() == [key.jwkThumbprint])

        // The bare token is refused (it is useless without a proof), with a message naming --url.
        let bare = try run(binary, ["--keychain", path, "token"])
        #expect(bare.status == 64, "token: \(bare.standardError)")
        #expect(bare.standardOutput.isEmpty)
        #expect(bare.standardError.contains("--url"))

        // token --url: the token (the one login shared in the kernel keyring) and a proof for
        // this request; the resource accepts the pair once, and refuses the token without it.
        let resource = server.url.appendingPathComponent("api/dpop/resource")
        let printed = try run(binary, ["--keychain", path, "token", "--url", resource.absoluteString])
        #expect(printed.status == 0, "token --url: \(printed.standardError)")
        #expect(printed.standardError.isEmpty)
        let lines = printed.standardOutput.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
        #expect(lines.count == 3 && lines[2].isEmpty, "token --url printed \(lines.count) lines")
        let (token, proof) = (lines[0], lines.count > 1 ? lines[1] : "")
        #expect(token == accessCanary, "the shared access token (no refresh) is printed")
        var call = URLRequest(url: resource)
        call.setValue("DPoP " + token, forHTTPHeaderField: "Authorization")
        call.setValue(proof, forHTTPHeaderField: "DPoP")
        let (body, answer) = try await httpData(for: call)
        #expect(answer.statusCode == 200)
        #expect((try JSONSerialization.jsonObject(with: body) as? [String: Any])?["jkt"] as? String == key.jwkThumbprint)
        #expect(try await httpData(for: call).1.statusCode == 401, "a proof is good once")
        var bearer = URLRequest(url: server.url.appendingPathComponent("api/resource"))
        bearer.setValue("Bearer " + token, forHTTPHeaderField: "Authorization")
        #expect(try await httpData(for: bearer).1.statusCode == 401, "a bound token is no bearer token")
        var unproven = URLRequest(url: resource)
        unproven.setValue("DPoP " + token, forHTTPHeaderField: "Authorization")
        #expect(try await httpData(for: unproven).1.statusCode == 401, "a bound token without a proof is refused")

        // Without the shared cache each `lockbox token` refreshes: the refresh carries a proof
        // (the server refuses a bound refresh token without one), and the new token is bound too.
        let before = try await server.counters()
        var environment = ProcessInfo.processInfo.environment
        environment["LOCKBOX_ACCESS_TOKEN_CACHE"] = "off"
        let refreshed = try run(
            binary, ["--keychain", path, "token", "--method", "POST", "--url", resource.absoluteString], environment: environment)
        #expect(refreshed.status == 0, "token after a refresh: \(refreshed.standardError)")
        let refreshedLines = refreshed.standardOutput.split(separator: "\n").map(String.init)
        #expect(refreshedLines.count == 2)
        let newToken = refreshedLines.first ?? ""
        #expect(newToken != token)
        var post = URLRequest(url: resource)
        post.httpMethod = "POST"
        post.setValue("DPoP " + newToken, forHTTPHeaderField: "Authorization")
        post.setValue(refreshedLines.last ?? "", forHTTPHeaderField: "DPoP")
        #expect(try await httpData(for: post).1.statusCode == 200)
        let after = try await server.counters()
        #expect((after["refresh_successes"] ?? 0) == (before["refresh_successes"] ?? 0) + 1)
        #expect((after["dpop_proofs_accepted"] ?? 0) == (before["dpop_proofs_accepted"] ?? 0) + 2)  // the refresh and the POST
        #expect(after["dpop_binding_refusals"] ?? 0 == before["dpop_binding_refusals"] ?? 0)
        #expect(try await server.boundThumbprints() == [key.jwkThumbprint])

        // A nonce that is not one is refused before anything is signed or sent.
        let badNonce = try run(binary, ["--keychain", path, "token", "--url", resource.absoluteString, "--nonce", "a b"])
        #expect(badNonce.status == 64)
        #expect(badNonce.standardOutput.isEmpty)

        // The canaries: in no message, no status, no dump, no file in clear.
        let status = try run(binary, ["--keychain", path, "auth", "status"])
        let dump = try run(binary, ["--keychain", path, "dump"])
        for canary in [accessCanary, refreshCanary, newToken] {
            for text in [loginOutput, bare.standardError, printed.standardError, refreshed.standardError, badNonce.standardError,
                status.standardOutput, status.standardError, dump.standardOutput, dump.standardError] {
                #expect(!text.contains(canary))
            }
            #expect(filesContaining(canary, in: vault.directory.path).isEmpty)
        }
        #expect(!printed.standardOutput.contains(refreshCanary))

        // logout revokes and deletes the session's key with the session.
        let logout = try run(binary, ["--keychain", path, "logout"])
        #expect(logout.status == 0, "logout: \(logout.standardError)")
        #expect(try await SoftwareKeyStore(vault: vault.vault).keys(applicationTag: ManagedProofSigningKey.applicationTag).isEmpty)
    }

    /// `lockbox login` through the device flow: reads the user code from stderr, approves it at
    /// the server, and returns the exit status and everything printed on stderr.
    @Test("lockbox login --dpop stopped while it waits (Ctrl-C, SIGTERM): its new key is deleted, the session and its key stay")
    func cliDPoPLogin_stopped_leavesNoSpareKey() async throws {
        let server = try await TestServer.running()
        let vault = try TestVault()
        let binary = builtProduct("lockbox")
        let path = vault.vault.path
        let (status, output) = try await deviceLogin(binary, path: path, server: server, extra: ["--dpop"])
        #expect(status == 0, "login --dpop: \(output)")
        let keys = SoftwareKeyStore(vault: vault.vault)
        let bound = try #require(try await keys.keys(applicationTag: ManagedProofSigningKey.applicationTag).first?.publicKey?.derRepresentation)

        for stop in [SIGINT, SIGTERM] {
            var login = try WaitingLogin(
                ["--keychain", path, "login", "--dpop", "--issuer", server.url.absoluteString, "--client-id", TestServer.clientID])
            #expect(login.said.contains("Ctrl-C cancels"), "\(login.said)")
            // The new session's key exists while the login waits.
            #expect(try await keys.keys(applicationTag: ManagedProofSigningKey.applicationTag).count == 2)
            let collected = login.stop(with: stop)
            #expect(login.process.terminationReason == .exit && login.process.terminationStatus == 1, "signal \(stop): \(collected)")
            #expect(collected.contains("Cancelled; the stored session is as it was. (cancelled)"), "\(collected)")
            let left = try await keys.keys(applicationTag: ManagedProofSigningKey.applicationTag)
            #expect(left.map { $0.publicKey?.derRepresentation } == [bound], "signal \(stop): \(left.count) keys left")
        }
        // The session still signs with its key.
        let resource = server.url.appendingPathComponent("api/dpop/resource")
        let printed = try run(binary, ["--keychain", path, "token", "--url", resource.absoluteString])
        #expect(printed.status == 0, "token --url: \(printed.standardError)")
    }

    func deviceLogin(_ binary: String, path: String, server: TestServer, extra: [String] = []) async throws -> (Int32, String) {
        let login = Process()
        login.executableURL = URL(fileURLWithPath: binary)
        login.arguments =
            ["--keychain", path, "login", "--issuer", server.url.absoluteString, "--client-id", TestServer.clientID, "--scope", "api"] + extra
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
        return (login.terminationStatus, collected.withLock { $0 } + String(decoding: rest, as: UTF8.self))
    }
}
}
