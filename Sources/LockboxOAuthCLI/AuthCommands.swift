import Dispatch
import Foundation
import Lockbox
import LockboxAuth
import LockboxAuthKeyring
import LockboxAuthKeys
import LockboxKeys
import LockboxCommandLine
import LockboxCurlTransport

#if canImport(Glibc)
import Glibc
#endif

/// The OAuth verbs: `login`, `token`, `logout`, `auth status`. They run asynchronously (the
/// network) and print nothing that holds a token except `token` itself, on stdout. The library
/// returns values; the sentences are worded here, and every error ends with its code.
struct AuthCommands {
    let invocation: Invocation
    var output = StandardStreams()

    func run() async -> ExitStatus {
        let session: CommandLineSession
        let backend: String
        do {
            var options = Keychain.Options(backend: invocation.backend, path: invocation.keychain)
            options.vault.authenticationContext = AuthenticationContext(verifier: TerminalVerifier())
            let opened = try Keychain.open(options)
            let lockDirectory = opened.oauthLockDirectory(explicitPath: invocation.keychain)
            let namespace = opened.accessTokenCacheNamespace(explicitPath: invocation.keychain)
            let cache: (any AccessTokenCache)? =
                AccessTokenCacheSetting.isEnabled ? try KernelKeyringTokenCache(namespace: namespace) : nil
            // DPoP sessions' keys are non-extractable keys deleted with the session: managed keys
            // in the vault, or keys inside the broker (which signs for this process); the Secret
            // Service holds no such keys, so its sessions cannot use DPoP.
            let dpopKeys: (any DPoPKeyStore)? =
                opened.vault.map { ManagedDPoPKeyStore(keys: SoftwareKeyStore(vault: $0)) }
                ?? opened.broker.map { BrokerDPoPKeyStore(broker: $0) }
            backend = opened.backend.rawValue
            // libcurl directly: URLSession on Linux spins while it waits for an answer.
            session = CommandLineSession(
                store: opened.store, lockDirectory: lockDirectory, transport: CurlTransport(), accessTokenCache: cache,
                dpopKeys: dpopKeys)
        } catch {
            output.error("lockbox: \(error.description)")
            return error.code == .itemNotFound ? .itemNotFound : .failure
        }
        do throws(AuthError) {
            switch invocation.command {
            case .login(let issuer, let clientID, let scopes, let browser, let dpop):
                guard let url = URL(string: issuer), url.scheme == "https", url.host != nil else {
                    output.error("lockbox: --issuer must be an https:// URL, such as https://auth.example.com. (usage)")
                    return .usage
                }
                if dpop && !session.supportsDPoP {
                    output.error(
                        "lockbox: --dpop keeps the session's key in the vault or the broker as a non-extractable key, and this "
                            + "keychain's backend is \(backend). Use the vault (--backend vault) or the broker for a DPoP session. (usage)")
                    return .usage
                }
                var configuration = try await session.discover(issuer: url, clientID: clientID, scope: scopes)
                configuration.usesDPoP = dpop
                let tokens: TokenResponse
                if browser, let reason = BrowserLogin.unavailableReason(configuration) {
                    output.error("lockbox: \(reason); using the device flow instead.")
                    tokens = try await deviceLogin(session, configuration)
                } else if browser {
                    let proofs = try await session.signInProofs(configuration)
                    do throws(AuthError) {
                        tokens = try await BrowserLogin(output: output).run(configuration, dpop: proofs)
                    } catch {
                        await discard(session) { () async throws(AuthError) in try await session.discard(proofs, configuration: configuration) }
                        throw error
                    }
                } else {
                    tokens = try await deviceLogin(session, configuration)
                }
                // From here the sign-in finishes even on Ctrl-C: the revocation of the replaced
                // session and the store are one step that must not stop half-way.
                let result = try await Interrupt.ignoring { () async throws(AuthError) in try await session.signIn(configuration, tokens: tokens) }
                output.error(Self.describe(result))
            case .token(let issuer, let clientID, nil):
                let token = try await Interrupt.deferring(output: output) { () async throws(AuthError) in
                    try await session.accessToken(issuer: issuer, clientID: clientID)
                }
                SecretInput.writeToStandardOutput(token)
            case .token(let issuer, let clientID, let target?):
                // As given, never re-encoded: a URL with a space would have its `%41` made `%2541`.
                guard let url = URL(string: target.url, encodingInvalidCharacters: false), ["https", "http"].contains(url.scheme?.lowercased()),
                    url.host != nil
                else {
                    output.error(
                        "lockbox: --url must be the absolute http(s) URL of the request, such as https://api.example.com/v1/items, "
                            + "with any space or other such character percent-encoded (%20). (usage)")
                    return .usage
                }
                let authorization = try await Interrupt.deferring(output: output) { () async throws(AuthError) in
                    try await session.requestAuthorization(method: target.method, url: url, nonce: target.nonce, issuer: issuer, clientID: clientID)
                }
                guard let proof = authorization.proof else {
                    output.error(
                        "lockbox: This session's tokens are bearer tokens, which need no proof: run `lockbox token` without --url, "
                            + "or sign in again with --dpop. (usage)")
                    return .usage
                }
                SecretInput.writeToStandardOutput(authorization.accessToken)
                output.print(proof)
            case .logout(let issuer, let clientID, let retry):
                if retry {
                    let result = try await session.retryPendingLogouts()
                    output.error(Self.describe(result))
                    if result.remaining > 0 { return .failure }
                } else {
                    let result = try await Interrupt.deferring(output: output) { () async throws(AuthError) in
                        try await session.logout(issuer: issuer, clientID: clientID)
                    }
                    output.error(Self.describe(result))
                }
            case .authStatus(let json):
                let status = try await session.status()
                output.print(json ? Self.json(status) : Self.lines(status).joined(separator: "\n"))
            default:
                return .usage
            }
            return .success
        } catch {
            return report(error)
        }
    }

    /// The device flow: the code and address, when the code expires, a spinner on a terminal;
    /// Ctrl-C cancels (nothing is stored before the approval).
    private func deviceLogin(_ session: CommandLineSession, _ configuration: ClientConfiguration) async throws(AuthError) -> TokenResponse {
        let pending = try await session.beginLogin(configuration)
        let authorization = pending.authorization
        output.error(
            TerminalText.sanitized(
                "Open \(authorization.verificationURI.absoluteString) and enter the code \(authorization.userCode)"
                    + (authorization.verificationURIComplete.map { " (or open \($0.absoluteString))" } ?? "") + "."))
        let remaining = max(0, Int(authorization.expiresAt.timeIntervalSinceNow))
        let waiting =
            "Waiting for the approval at \(TerminalText.sanitized(configuration.issuer.host ?? "the server")); the code expires at "
            + "\(Self.clockTime(authorization.expiresAt)) (in \(Self.minutes(remaining))). Ctrl-C cancels."
        do throws(AuthError) {
            return try await Interrupt.cancelling(
                progress: WaitingIndicator(until: authorization.expiresAt), announcing: { output.error(waiting) }
            ) { () async throws(AuthError) in
                try await session.waitForApproval(pending)
            }
        } catch {
            await discard(session) { () async throws(AuthError) in try await session.discard(pending) }
            throw error
        }
    }

    /// Deletes a stopped sign-in's new DPoP key (`discarding`), saying so when it cannot: the
    /// stored session is untouched either way, and the key goes at the next sign-in or sign-out.
    private func discard(_ session: CommandLineSession, _ discarding: () async throws(AuthError) -> Void) async {
        do {
            try await discarding()
        } catch {
            output.error(
                "lockbox: The sign-in's new DPoP key could not be deleted (\(TerminalText.sanitized(error.message))); "
                    + "the next sign-in or sign-out deletes it.")
        }
    }

    // MARK: Wording

    private func report(_ error: AuthError) -> ExitStatus {
        // Messages are fixed text with sanitised codes; sanitised again, since part of them
        // (a TLS library's message) comes from outside.
        let message = TerminalText.sanitized(error.message)
        switch error.code {
        case .signedOut where error.signOutReason == .noCredentials || error.signOutReason == .loggedOut:
            output.error("lockbox: Not signed in: run `lockbox login --issuer URL --client-id ID`. (signed_out)")
        case .signedOut:
            output.error("lockbox: \(message) Run `lockbox login --issuer URL --client-id ID`. (\(Self.code(error)))")
        case .storeLocked:
            output.error("lockbox: The keychain is locked; credentials are kept. Unlock it with `lockbox unlock`. (OSStatus -25308)")
        case .cancelled:
            output.error("lockbox: Cancelled; the stored session is as it was. (cancelled)")
        case .ambiguousSession:
            let sessions = error.matchingSessions.map { "  --issuer \($0.issuer) --client-id \($0.clientID)  (account \($0.account))" }
            output.error(
                TerminalText.sanitized("lockbox: Several sessions match; name one with --issuer and --client-id:")
                    + "\n" + sessions.map(TerminalText.sanitized).joined(separator: "\n") + "\n(ambiguous_session)")
            return .usage
        case .configuration where error.httpStatus == 404 || error.httpStatus == 410:
            output.error("lockbox: \(message) Check --issuer. (\(Self.code(error)))")
            return .usage
        case .configuration:
            output.error("lockbox: \(message) (\(Self.code(error)))")
            return .usage
        default:
            output.error("lockbox: \(message) (\(Self.code(error)))")
        }
        return .failure
    }

    /// The code an error ends with: the keychain's OSStatus for store errors, else the
    /// error's code with the OAuth error or HTTP status that caused it.
    private static func code(_ error: AuthError) -> String {
        if let store = error.storeError { return "OSStatus \(store.status)" }
        var parts = [error.code.rawValue]
        if let oauth = error.oauthError, oauth != error.code.rawValue { parts.append(oauth) }
        if let status = error.httpStatus { parts.append("HTTP \(status)") }
        if let url = error.urlErrorCode { parts.append("URLError \(url)") }
        return TerminalText.sanitized(parts.joined(separator: ", "))
    }

    private static func describe(_ result: CommandLineSession.LoginResult) -> String {
        let replaced: String
        switch result.replacedGrant {
        case .noPreviousSession: replaced = ""
        case .revoked: replaced = " The session it replaces was revoked."
        case .queued: replaced = " The session it replaces could not be revoked now; run `lockbox logout --retry` later."
        case .notRevoked: replaced = " The session it replaces was forgotten; the server did not confirm its revocation."
        }
        return TerminalText.sanitized("Signed in to \(result.issuer.absoluteString) as client \(result.clientID).") + replaced
    }

    private static func describe(_ result: CredentialsManager.LogoutResult) -> String {
        if result.revoked { return "Signed out; the server revoked the session." }
        if result.queued {
            return "Signed out locally. The server could not be reached to revoke the session; run `lockbox logout --retry` later."
        }
        return "Signed out."
    }

    private static func describe(_ result: RevocationOutbox.RetryResult) -> String {
        if result.remaining > 0 {
            return "\(result.revoked) revocation(s) delivered; \(result.remaining) still pending (the server is unreachable)."
        }
        return result.revoked + result.dropped == 0 ? "No pending revocations." : "All pending revocations delivered."
    }

    static func lines(_ status: CommandLineSession.Status) -> [String] {
        var lines: [String] = status.sessions.isEmpty ? ["Not signed in."] : []
        for session in status.sessions {
            lines.append(TerminalText.sanitized("\(session.issuer)  client \(session.clientID)  account \(session.account)  signed in"))
            var scopes = "  scopes asked: " + (session.requestedScope.isEmpty ? "(server default)" : session.requestedScope.joined(separator: " "))
            if let granted = session.grantedScope { scopes += "; granted: " + (granted.isEmpty ? "(not stated)" : granted.joined(separator: " ")) }
            lines.append(TerminalText.sanitized(scopes))
            lines.append(TerminalText.sanitized("  subject: " + (session.subject ?? "not known (the server sent no ID token)")))
            switch session.refreshTokenRotates {
            case true?: lines.append("  refresh token: rotated at each refresh")
            case false?: lines.append("  refresh token: not rotated")
            case nil: lines.append("  refresh token: no refresh seen yet, so rotation is not known")
            }
            if let expiry = session.accessTokenExpiresAt {
                let left = Int(expiry.timeIntervalSinceNow)
                lines.append(
                    "  access token: shared in the kernel keyring, expires at \(clockTime(expiry))"
                        + (left > 0 ? " (in \(minutes(left)))" : " (expired)"))
            } else {
                lines.append("  access token: none shared; the next `lockbox token` refreshes (the refresh token may rotate)")
            }
        }
        if status.pendingRevocations > 0 {
            lines.append("\(status.pendingRevocations) revocation(s) pending: run `lockbox logout --retry`.")
        }
        return lines
    }

    private static func json(_ status: CommandLineSession.Status) -> String {
        let sessions: [[String: Any]] = status.sessions.map { session in
            var object: [String: Any] = [
                "issuer": session.issuer, "clientID": session.clientID, "account": session.account,
                "scope": session.requestedScope.joined(separator: " "),
            ]
            if let granted = session.grantedScope { object["grantedScope"] = granted.joined(separator: " ") }
            if let expiry = session.accessTokenExpiresAt { object["accessTokenExpiresAt"] = Int(expiry.timeIntervalSince1970) }
            if let subject = session.subject { object["subject"] = subject }
            if let rotates = session.refreshTokenRotates { object["refreshTokenRotates"] = rotates }
            return object
        }
        let object: [String: Any] = ["sessions": sessions, "pendingRevocations": status.pendingRevocations]
        let data = (try? JSONSerialization.data(withJSONObject: object, options: [.prettyPrinted, .sortedKeys])) ?? Data()
        return String(decoding: data, as: UTF8.self)
    }

    static func clockTime(_ date: Date) -> String {
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.dateFormat = "HH:mm:ss"
        return formatter.string(from: date)
    }

    static func minutes(_ seconds: Int) -> String {
        seconds < 120 ? "\(seconds) s" : "\(seconds / 60) min"
    }
}

/// `LOCKBOX_ACCESS_TOKEN_CACHE=off` (or `0`, `no`, `false`) keeps access tokens in one
/// process's memory instead of the kernel keyring.
enum AccessTokenCacheSetting {
    static var isEnabled: Bool {
        guard let value = getenv("LOCKBOX_ACCESS_TOKEN_CACHE") else { return true }
        return !["off", "0", "no", "false"].contains(String(cString: value).lowercased())
    }
}
