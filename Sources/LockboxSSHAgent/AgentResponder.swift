import FoundationEssentials
import LockboxCore
import LockboxKeys
import Synchronization

/// Answers one request at a time. The agent offers keys and signs with them; it never hands a
/// key out, never takes one in (`ssh-add FILE`), and removes nothing: keys are managed in the
/// keychain, so every request that would change them is answered `SSH_AGENT_FAILURE`.
package final class AgentResponder: Sendable {
    package let keys: any AgentKeySource
    /// Shared by every connection, so that a `.userPresence` key's verification is reused
    /// for the context's reuse window (one prompt for a `git pull` and the next ones).
    package let context: AuthenticationContext
    private let log: @Sendable (String) -> Void
    /// The identities of the last listing, by key blob: a client lists, then signs, and the
    /// signature need not list again. Only the lookup is cached: every signature still goes
    /// through the key store, which refuses a locked keychain or a deleted key.
    private let listed = Mutex<[[UInt8]: AgentIdentity]>([:])

    package init(
        keys: any AgentKeySource, context: AuthenticationContext, log: @escaping @Sendable (String) -> Void = { _ in },
        clock: any LockboxClock = SystemClock()
    ) {
        self.keys = keys
        self.context = context
        let repeats = RepeatedLines(clock: clock)
        self.log = { line in repeats.pass(line, to: log) }
    }

    /// The reply frame to one message body.
    package func reply(toBody body: [UInt8]) -> [UInt8] {
        let request: AgentRequest
        do {
            request = try AgentRequest(body: body[...])
        } catch {
            log("refused a malformed request: \(error.reason)")
            return AgentReply.failure
        }
        return reply(to: request)
    }

    package func reply(to request: AgentRequest) -> [UInt8] {
        switch request {
        case .requestIdentities:
            do {
                let identities = try keys.identities()
                listed.withLock { cache in
                    cache = Dictionary(identities.map { ($0.keyBlob, $0) }, uniquingKeysWith: { first, _ in first })
                }
                return AgentReply.identities(identities.map { ($0.keyBlob, $0.comment) })
            } catch {
                log("could not list the keys: \(error.description)")
                return AgentReply.failure
            }
        case .sign(let keyBlob, let data, _):
            do {
                var identity = listed.withLock { $0[keyBlob] }
                if identity == nil { identity = try keys.identities().first(where: { $0.keyBlob == keyBlob }) }
                guard let identity else {
                    log("refused to sign: the key is not one this agent offers")
                    return AgentReply.failure
                }
                // A key that asks the user names itself: which key is to sign, for whom.
                let fingerprint = identity.publicKey.openSSHFingerprint.map { " (\($0))" } ?? ""
                let comment = identity.comment.isEmpty ? "" : " " + identity.comment
                // The answer is the context's, reused for every key within its window: said.
                let reuse = context.reuseDuration > .zero ? "; the answer lets every key sign for \(context.reuseDuration.components.seconds) s" : ""
                let asking = context.asking(because: "sign with the SSH key\(comment)\(fingerprint)\(reuse)")
                let native = try identity.sign(Data(data), asking)
                return AgentReply.signature(try SSHKeyBlob.signature(native, algorithm: identity.publicKey.algorithm))
            } catch {
                log("could not sign: \(error.description)")
                return AgentReply.failure
            }
        case .addIdentity:
            log("refused to add a key: make keys with `lockbox ssh-agent generate`, which keeps them in the keychain")
            return AgentReply.failure
        case .removeIdentity, .removeAllIdentities:
            log("refused to remove a key: delete it from the keychain instead")
            return AgentReply.failure
        case .smartcard, .lock, .unlock:
            log("refused an unsupported request (smart cards, agent lock): lock the keychain with `lockbox lock` instead")
            return AgentReply.failure
        case .extension(let name):
            log("refused the extension \(Self.printable(name)): not supported")
            return AgentReply.failure
        case .unknown(let type):
            log("refused the unknown message type \(type)")
            return AgentReply.failure
        }
    }

    /// A client's text, cut short and reduced to printable ASCII, for a log line.
    static func printable(_ text: String) -> String {
        var scalars = String.UnicodeScalarView()
        scalars.append(contentsOf: text.unicodeScalars.prefix(64).filter { $0.value >= 0x20 && $0.value < 0x7F })
        return String(scalars)
    }
}

/// Lets each distinct log line through at most once per ``window``, then says how many like it
/// were left out: a client that asks a thousand times a second for what is refused (a locked
/// keychain) fills no journal, and the first refusal is still seen at once.
final class RepeatedLines: Sendable {
    static let window: Duration = .seconds(10)
    /// Lines remembered at most: past it, the oldest are forgotten (and may be written again).
    static let remembered = 64
    private let clock: any LockboxClock
    private let seen = Mutex<[String: (since: Duration, leftOut: Int)]>([:])

    init(clock: any LockboxClock) {
        self.clock = clock
    }

    func pass(_ line: String, to log: (String) -> Void) {
        let now = clock.uptime()
        let written: [String] = seen.withLock { seen in
            if let entry = seen[line], now - entry.since < Self.window {
                seen[line] = (entry.since, entry.leftOut + 1)
                return []
            }
            let leftOut = seen[line]?.leftOut ?? 0
            var lines: [String] = []
            if seen.count >= Self.remembered {
                // Forgotten, but counted: what was left out is said before it is forgotten.
                let forgotten = seen.values.reduce(0) { $0 + $1.leftOut } - leftOut
                if forgotten > 0 { lines.append("(\(forgotten) repeated lines were left out since they were last written)") }
                seen.removeAll()
            }
            seen[line] = (now, 0)
            lines.append(leftOut == 0 ? line : line + " (\(leftOut) more like it left out since it was last written)")
            return lines
        }
        for line in written { log(line) }
    }
}
