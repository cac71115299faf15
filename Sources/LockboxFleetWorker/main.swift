// A helper process for the fleet test (Tests/LockboxSyncTests): one process of one machine of
// a fleet, sharing one OAuth session through the sync group's database. It prints one JSON
// line with its outcome and never prints a token.
//
//   lockbox-fleet-worker --keychain PATH --database CONNINFO --group ID --issuer URL --client-id ID <mode>
//   modes: sign-in          the authorization code flow (the test server approves at once)
//          calls SECONDS    ask for a fresh access token about every 100 ms for SECONDS, using
//                           each at the protected API through `CredentialsManager.send`

import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import Glibc
import Lockbox
import LockboxAuth
import LockboxCurlTransport
import LockboxFleet
import LockboxSync

func fail(_ message: String) -> Never {
    FileHandle.standardError.write(Data((message + "\n").utf8))
    exit(64)
}

func report(_ fields: [String: Any]) {
    let data = (try? JSONSerialization.data(withJSONObject: fields, options: [.sortedKeys])) ?? Data("{}".utf8)
    FileHandle.standardOutput.write(data + Data("\n".utf8))
}

var options: [String: String] = [:]
var positional: [String] = []
var arguments = CommandLine.arguments.dropFirst().makeIterator()
while let argument = arguments.next() {
    if argument.hasPrefix("--") {
        guard let value = arguments.next() else { fail("\(argument) needs a value") }
        options[String(argument.dropFirst(2))] = value
    } else {
        positional.append(argument)
    }
}
guard let keychain = options["keychain"], let database = options["database"], let groupID = options["group"],
    let issuerText = options["issuer"], let issuer = URL(string: issuerText), let clientID = options["client-id"],
    let mode = positional.first
else {
    fail("usage: lockbox-fleet-worker --keychain PATH --database CONNINFO --group ID --issuer URL --client-id ID sign-in|calls SECONDS")
}

// libcurl, as the CLI talks HTTP: URLSession's socket sources on Linux have crashed a worker
// once in libdispatch while a transfer was torn down, which would fail the fleet test for
// nothing the fleet did.
let transport = CurlTransport()
let manager: CredentialsManager
do {
    let vault = try Vault.open(at: keychain)
    let group = try SyncGroup(groupID, vault: vault, database: database)
    let configuration = try await ClientConfiguration.discover(issuer: issuer, clientID: clientID, scope: ["api"], transport: transport)
    let fleet = FleetSession(group: group, key: CredentialKey(configuration: configuration))
    manager = CredentialsManager(
        configuration: configuration, tokenStore: fleet.tokenStore, transport: transport, accessTokenCache: fleet.accessTokenCache,
        refreshLock: fleet.refreshLock)
} catch {
    report(["outcome": "error", "error": "\(error)"])
    exit(1)
}

switch mode {
case "sign-in":
    do {
        let session = try AuthorizationCodeFlow(configuration: manager.configuration).start()
        // The browser: the test server approves at once and redirects to the flow's loopback
        // listener, another origin, which the transport does not follow by itself.
        async let browser: Void = {
            let options = HTTPRequestOptions(redirects: .refuse, maximumResponseSize: 1 << 20)
            guard let (_, answer) = try? await transport.send(URLRequest(url: session.authorizationURL), options: options),
                let location = answer.value(forHTTPHeaderField: "Location"), let callback = URL(string: location)
            else { return }
            _ = try? await transport.send(URLRequest(url: callback), options: options)
        }()
        let tokens = try await session.waitForTokens(timeout: .seconds(20))
        await browser
        try await manager.signIn(with: tokens)
        report(["outcome": "ok"])
    } catch {
        report(["outcome": "error", "error": "\(error)"])
        exit(1)
    }
case "calls":
    let seconds = Double(positional.dropFirst().first ?? "1") ?? 1
    let start = Date()
    let end = start.addingTimeInterval(seconds)
    var successes = 0
    var signedOut = 0
    var errors: [String] = []
    var fingerprints = Set<String>()
    while Date() < end {
        do {
            let credentials = try await manager.credentials()
            fingerprints.insert(credentials.fingerprint)
            var request = URLRequest(url: issuer.appendingPathComponent("api/resource"))
            request.httpMethod = "GET"
            // As an application should: a token that expires while the request is in flight
            // (a loaded machine, a slow network) is answered 401, and `send` takes the token
            // another machine refreshed meanwhile, or refreshes once, and repeats the request.
            let (_, response) = try await manager.send(request)
            if response.statusCode == 200 { successes += 1 } else { errors.append("http_\(response.statusCode)") }
        } catch where error.code == .signedOut {
            signedOut += 1
            break
        } catch {
            errors.append("\(error.code)")
        }
        try? await Task.sleep(for: .milliseconds(100))
    }
    report(["outcome": errors.isEmpty && signedOut == 0 ? "ok" : "errors", "successes": successes, "signed_out": signedOut,
            "errors": errors, "tokens": fingerprints.count, "started": start.timeIntervalSince1970, "ended": Date().timeIntervalSince1970])
default:
    fail("unknown mode \(mode)")
}
