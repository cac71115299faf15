import Foundation
import Lockbox
import LockboxCommandLine
import LockboxAuth

/// The OAuth verbs: `login`, `token`, `logout`, `auth status`. They run asynchronously (the
/// network) and print nothing that holds a token except `token` itself, on stdout.
struct AuthCommands {
    let invocation: Invocation
    var output = StandardStreams()

    func run() async -> ExitStatus {
        let session: CommandLineSession
        do {
            var options = Keychain.Options(backend: invocation.backend, path: invocation.keychain)
            options.vault.authenticationContext = AuthenticationContext(verifier: TerminalVerifier())
            let opened = try Keychain.open(options)
            let lockDirectory = (opened.vault?.path ?? Keychain.vaultPath(explicit: invocation.keychain)) + ".oauth-locks"
            session = CommandLineSession(store: opened.store, lockDirectory: lockDirectory)
        } catch {
            output.error("lockbox: \(error.description)")
            return error.code == .itemNotFound ? .itemNotFound : .failure
        }
        do {
            switch invocation.command {
            case .login(let issuer, let clientID, let scopes):
                guard let url = URL(string: issuer), url.scheme == "https" else {
                    output.error("lockbox: --issuer must be an https:// URL")
                    return .usage
                }
                let pending = try await session.beginLogin(issuer: url, clientID: clientID, scope: scopes)
                output.error(pending.instructions)
                output.error(TerminalText.sanitized(try await session.completeLogin(pending)))
            case .token(let issuer, let clientID):
                let token = try await session.accessToken(issuer: issuer, clientID: clientID)
                SecretInput.writeToStandardOutput(token)
            case .logout(let issuer, let clientID, let retry):
                if retry {
                    let message = try await session.retryPendingLogouts()
                    output.error(message)
                    if message.contains("still pending") { return .failure }
                } else {
                    output.error(try await session.logout(issuer: issuer, clientID: clientID))
                }
            case .authStatus(let json):
                let status = try await session.status()
                if json {
                    let sessions = status.sessions.map { ["issuer": $0.issuer, "clientID": $0.clientID, "account": $0.account, "scope": $0.scope.joined(separator: " ")] }
                    let object: [String: Any] = ["sessions": sessions, "pendingRevocations": status.pendingRevocations]
                    let data = (try? JSONSerialization.data(withJSONObject: object, options: [.prettyPrinted, .sortedKeys])) ?? Data()
                    output.print(String(decoding: data, as: UTF8.self))
                } else {
                    output.print(status.lines.joined(separator: "\n"))
                }
            default:
                return .usage
            }
            return .success
        } catch {
            // Messages are fixed text with sanitised codes; sanitised again, since part of them
            // (a TLS library's message) comes from outside.
            switch error.code {
            case .signedOut where error.signOutReason == .noCredentials || error.signOutReason == .loggedOut:
                output.error("lockbox: Not signed in: run `lockbox login --issuer URL --client-id ID`.")
            case .signedOut:
                output.error("lockbox: \(TerminalText.sanitized(error.message)) Run `lockbox login --issuer URL --client-id ID`.")
            case .storeLocked:
                output.error("lockbox: The keychain is locked; credentials are kept. Unlock it with `lockbox unlock`. (OSStatus -25308)")
            case .configuration:
                output.error("lockbox: \(TerminalText.sanitized(error.message))")
                return .usage
            default:
                output.error("lockbox: \(TerminalText.sanitized(error.message))")
            }
            return .failure
        }
    }
}
