// A helper process for LockboxAuth's multi-process tests: several of these share one vault,
// and tests kill them at chosen moments. It prints one JSON line with its outcome and never
// prints a token.
//
//   lockbox-auth-worker --vault PATH --issuer URL --client-id ID <mode> [count]
//   modes: calls N            N forced refreshes, each followed by a GET to the protected API
//          refresh            one forced refresh (tests kill the process while it waits)
//          die-after-persist  one forced refresh; SIGKILL itself from the post-rotation hook
//          check              one credentials() call: ok, or signed out with its reason

import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import Glibc
import Lockbox
import LockboxAuth

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
guard let vaultPath = options["vault"], let issuerText = options["issuer"], let issuer = URL(string: issuerText),
    let clientID = options["client-id"], let mode = positional.first
else {
    fail("usage: lockbox-auth-worker --vault PATH --issuer URL --client-id ID calls N|refresh|die-after-persist|check")
}

let vault: Vault
do {
    vault = try Vault.open(at: vaultPath)
} catch {
    fail("cannot open the vault: \(error)")
}
let configuration: ClientConfiguration
do {
    configuration = try await ClientConfiguration.discover(issuer: issuer, clientID: clientID)
} catch {
    report(["outcome": "error", "error": "\(error)"])
    exit(1)
}
let manager = CredentialsManager(
    configuration: configuration,
    tokenStore: ItemStoreTokenStore(store: vault, key: CredentialKey(configuration: configuration), configuration: configuration),
    lockDirectory: vault.path + ".oauth-locks",
    events: { event in FileHandle.standardError.write(Data("\(getpid()) \(event)\n".utf8)) })
// Longer than any access token the tests use: every call refreshes (and rotates).
let forceRefresh = Duration.seconds(86_400 * 365)

switch mode {
case "calls":
    let count = Int(positional.dropFirst().first ?? "1") ?? 1
    var successes = 0
    var errors: [String] = []
    let transport = URLSessionTransport()
    for _ in 0..<count {
        do {
            _ = try await manager.credentials(minTTL: forceRefresh)
            var request = URLRequest(url: issuer.appendingPathComponent("api/resource"))
            request.httpMethod = "GET"
            request = try await manager.authorizedRequest(request)
            let (_, response) = try await transport.send(request)
            if response.statusCode == 200 { successes += 1 } else { errors.append("http_\(response.statusCode)") }
        } catch {
            errors.append("\(error)")
        }
    }
    report(["outcome": errors.isEmpty ? "ok" : "errors", "successes": successes, "errors": errors])
case "refresh":
    do {
        _ = try await manager.credentials(minTTL: forceRefresh)
        report(["outcome": "ok"])
    } catch {
        report(["outcome": "error", "error": "\(error)"])
    }
case "die-after-persist":
    await manager.setRotationHook { rotation in
        if rotation.persisted { kill(getpid(), SIGKILL) }
    }
    _ = try? await manager.credentials(minTTL: forceRefresh)
    report(["outcome": "survived"])
case "check":
    do {
        _ = try await manager.credentials()
        report(["outcome": "ok", "state": "\(await manager.state)"])
    } catch where error.code == .signedOut {
        report(["outcome": "signed_out", "reason": error.signOutReason?.rawValue ?? "-", "state": "\(await manager.state)"])
    } catch {
        report(["outcome": "error", "error": "\(error)"])
    }
default:
    fail("unknown mode \(mode)")
}
