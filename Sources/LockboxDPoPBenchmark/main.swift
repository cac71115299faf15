// What a DPoP proof costs a refresh: one bare P-256 signature of a proof's input, a whole proof
// (claims, JSON, base64url, the signature), and refreshes against the test OAuth server with and
// without DPoP, alternated, in one run. The reference for the target ("a DPoP proof adds at most
// one signature's cost to a refresh") is measured the same way as the DPoP cost: a third session,
// Bearer, makes one bare signature (the same call a proof makes: async, the key kept opened) at
// the point where a DPoP refresh makes its proof, so it runs under the same conditions (caches
// cold after the wait for the previous answer, the vault just written). The refresh's client-side time is its total minus the
// time spent waiting for the server (measured around the transport), so the server's own proof
// check does not count against the client; the end-to-end figures are printed beside it. The
// sessions are real (refresh tokens in the vault, the cross-process lock file): the figure that
// carries the DPoP cost is the time from the refresh's start to its request leaving (the store
// read, the lock, the proof), since the vault's commit of the rotated token afterwards is the
// same for both and its fsync would bury a signature in its variance.
//
// Run: swift run -c release lockbox-dpop-bench [--operations N] [--refreshes N] [--server URL]
// (the server: --server, LOCKBOX_TEST_OAUTH_URL, or $LOCKBOX_OAUTH_STATE/url as
// scripts/oauth-server start writes it; the server is not reset).
import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import LockboxAuth
import LockboxAuthKeys
import LockboxCore
import LockboxKeys
import LockboxVault
import Synchronization

func option(_ name: String) -> String? {
    guard let index = CommandLine.arguments.firstIndex(of: name), index + 1 < CommandLine.arguments.count else { return nil }
    return CommandLine.arguments[index + 1]
}

let operations = option("--operations").flatMap(Int.init) ?? 2000
let refreshes = option("--refreshes").flatMap(Int.init) ?? 300

/// Median microseconds per call of `body` over `count` calls.
func measure(_ count: Int = operations, _ body: () async throws -> Void) async rethrows -> Double {
    var samples: [Double] = []
    samples.reserveCapacity(count)
    for _ in 0..<count {
        let start = DispatchTime.now().uptimeNanoseconds
        try await body()
        samples.append(Double(DispatchTime.now().uptimeNanoseconds - start) / 1000)
    }
    return median(samples)
}

func median(_ samples: [Double]) -> Double { samples.sorted()[samples.count / 2] }

/// A key that returns a fixed signature at once: what a proof costs besides its signature.
struct InstantKey: ProofSigningKey {
    let publicJWK: [String: String]
    var jwsAlgorithm: String { "ES256" }
    func jwsSignature(for signingInput: Data) async throws(LockboxError) -> Data { Data(repeating: 7, count: 64) }
}

/// The session keys of a ``ManagedDPoPKeyStore``, timing each signature they make.
struct TimedKeyStore: DPoPKeyStore {
    let inner: ManagedDPoPKeyStore
    let clock: SignatureClock

    func makeKey(for session: CredentialKey) async throws(LockboxError) -> any ProofSigningKey {
        TimedKey(inner: try await inner.makeKey(for: session), clock: clock)
    }
    func boundKey(for session: CredentialKey) async throws(LockboxError) -> (any ProofSigningKey)? {
        try await inner.boundKey(for: session).map { TimedKey(inner: $0, clock: clock) }
    }
    func bind(_ key: any ProofSigningKey, to session: CredentialKey) async throws(LockboxError) {
        try await inner.bind(key, to: session)
    }
    func deleteKeys(for session: CredentialKey) async throws(LockboxError) {
        try await inner.deleteKeys(for: session)
    }
    func discard(_ key: any ProofSigningKey, of session: CredentialKey) async throws(LockboxError) {
        try await inner.discard(key, of: session)
    }
}

final class SignatureClock: Sendable {
    let nanoseconds = Mutex<UInt64>(0)
    func takeMicroseconds() -> Double {
        Double(nanoseconds.withLock { total in defer { total = 0 }; return total }) / 1000
    }
}

struct TimedKey: ProofSigningKey {
    let inner: any ProofSigningKey
    let clock: SignatureClock
    var publicJWK: [String: String] { inner.publicJWK }
    var jwsAlgorithm: String { inner.jwsAlgorithm }
    func jwsSignature(for signingInput: Data) async throws(LockboxError) -> Data {
        let start = DispatchTime.now().uptimeNanoseconds
        defer { clock.nanoseconds.withLock { $0 += DispatchTime.now().uptimeNanoseconds - start } }
        return try await inner.jwsSignature(for: signingInput)
    }
}

/// The real transport, adding up the time spent inside it (waiting for the server).
/// With `signing`, each token request first waits for one bare signature by that key (timed
/// into ``signatures``): a Bearer refresh plus exactly one signature where DPoP makes its proof.
final class TimedTransport: HTTPTransport {
    private let inner = URLSessionTransport()
    private let nanoseconds = Mutex<UInt64>(0)
    private let firstSend = Mutex<UInt64?>(nil)
    private let signing: (key: ManagedProofSigningKey, input: Data, signatures: SignatureClock)?

    init(signing: (key: ManagedProofSigningKey, input: Data, signatures: SignatureClock)? = nil) {
        self.signing = signing
    }

    func send(_ request: URLRequest) async throws -> (Data, HTTPURLResponse) {
        try await signIfAsked()
        return try await timed { try await inner.send(request) }
    }

    func send(_ request: URLRequest, options: HTTPRequestOptions) async throws -> (Data, HTTPURLResponse) {
        try await signIfAsked()
        return try await timed { try await inner.send(request, options: options) }
    }

    private func signIfAsked() async throws {
        guard let signing else { return }
        let start = DispatchTime.now().uptimeNanoseconds
        _ = try await signing.key.jwsSignature(for: signing.input)
        signing.signatures.nanoseconds.withLock { $0 += DispatchTime.now().uptimeNanoseconds - start }
    }

    private func timed(_ body: () async throws -> (Data, HTTPURLResponse)) async throws -> (Data, HTTPURLResponse) {
        let start = DispatchTime.now().uptimeNanoseconds
        firstSend.withLock { if $0 == nil { $0 = start } }
        defer { nanoseconds.withLock { $0 += DispatchTime.now().uptimeNanoseconds - start } }
        return try await body()
    }

    /// When the first request since the last call started (uptime nanoseconds).
    func takeFirstSend() -> UInt64? {
        firstSend.withLock { first in defer { first = nil }; return first }
    }

    /// Microseconds spent in the transport since the last call.
    func takeMicroseconds() -> Double {
        Double(nanoseconds.withLock { total in defer { total = 0 }; return total }) / 1000
    }
}

var template = Array("/tmp/lockbox-dpop-bench-XXXXXX".utf8CString)
guard let made = mkdtemp(&template) else { fatalError("mkdtemp failed (errno \(errno))") }
let directory = String(cString: made)
defer { try? FileManager.default.removeItem(atPath: directory) }
var vaultConfiguration = Vault.Configuration()
vaultConfiguration.keyDerivation = .interactive
vaultConfiguration.unlockCache = .processMemory
let vault = try Vault.create(at: directory + "/bench.lockbox", passphrase: SecretBytes(utf8: "benchmark"), configuration: vaultConfiguration)
defer { vault.lockAll() }
let keyStore = SoftwareKeyStore(vault: vault)
let key = try ManagedProofSigningKey.generate(in: keyStore, session: "bench")
let proofs = DPoPProofFactory(key: key, nonces: DPoPNonces())
let endpoint = URL(string: "https://issuer.example.org/oauth/token")!
let sample = try await proofs.proof(method: "POST", url: endpoint, nonce: "server-nonce-0123456789")
let signingInput = Data(sample.split(separator: ".").prefix(2).joined(separator: ".").utf8)

let signature = try await measure { _ = try key.key.sign(signingInput) }
let asyncSignature = try await measure { _ = try await key.jwsSignature(for: signingInput) }
let proof = try await measure { _ = try await proofs.proof(method: "POST", url: endpoint, nonce: "server-nonce-0123456789") }
// A signature right after a vault write, as in a refresh (the previous refresh stored its
// rotated token): only the signature is timed.
let scratch = Query.genericPassword(service: "lockbox.dpop-bench", account: "scratch")
try vault.add(Item.genericPassword(service: "lockbox.dpop-bench", account: "scratch", data: SecretBytes(utf8: "0")))
var afterWrite: [Double] = []
for index in 0..<min(operations, 300) {
    try vault.update(matching: scratch, to: ItemUpdate(data: SecretBytes(utf8: "\(index)")))
    let start = DispatchTime.now().uptimeNanoseconds
    _ = try await key.jwsSignature(for: signingInput)
    afterWrite.append(Double(DispatchTime.now().uptimeNanoseconds - start) / 1000)
}
let signatureAfterWrite = median(afterWrite)
let unsigned = DPoPProofFactory(key: InstantKey(publicJWK: key.publicJWK), nonces: DPoPNonces())
let claims = try await measure { _ = try await unsigned.proof(method: "POST", url: endpoint, nonce: "server-nonce-0123456789") }

func line(_ label: String, _ value: Double, _ unit: String = "") {
    print(label.padding(toLength: 58, withPad: " ", startingAt: 0) + String(format: "%10.1f", value) + unit)
}

print("operation (\(operations) runs, median)".padding(toLength: 66, withPad: " ", startingAt: 0) + "µs")
line("P-256 signature of a proof's input", signature)
line("the same, async (off the cooperative pool)", asyncSignature)
line("the same, async, right after a vault write (caches cold)", signatureAfterWrite)
line("whole DPoP proof (claims, JSON, sign)", proof)
line("the proof without its signature", claims)
print(String(format: "%@ %9.2fx", "proof / async signature".padding(toLength: 58, withPad: " ", startingAt: 0), proof / asyncSignature))

// Refreshes against the real server.
let serverText =
    option("--server") ?? ProcessInfo.processInfo.environment["LOCKBOX_TEST_OAUTH_URL"]
    ?? (try? String(
        contentsOfFile: (ProcessInfo.processInfo.environment["LOCKBOX_OAUTH_STATE"] ?? "/tmp/lockbox-oauth-server") + "/url",
        encoding: .utf8))
guard let serverText, let server = URL(string: serverText.trimmingCharacters(in: .whitespacesAndNewlines)) else {
    print("\nrefresh: no test OAuth server (start it with scripts/oauth-server start, or pass --server URL)")
    exit(1)
}

/// A signed-in manager for `lockbox-cli` at the test server, with or without DPoP.
func session(dpop: Bool, transport: TimedTransport, account: String) async throws -> CredentialsManager {
    var configuration = try await ClientConfiguration.discover(issuer: server, clientID: "lockbox-cli", scope: ["api"])
    configuration.usesDPoP = dpop
    let manager = CredentialsManager(
        configuration: configuration, account: account,
        tokenStore: ItemStoreTokenStore(store: vault, key: CredentialKey(configuration: configuration, account: account)),
        transport: transport, lockDirectory: directory, dpopKeys: TimedKeyStore(inner: ManagedDPoPKeyStore(keys: keyStore), clock: signatures),
        nonces: DPoPNonces())
    let flow = try AuthorizationCodeFlow(configuration: configuration, transport: transport, dpop: try await manager.signInProofs()).start()
    async let browser = URLSession.shared.data(from: flow.authorizationURL)
    let tokens = try await flow.waitForTokens(timeout: .seconds(30))
    _ = try await browser
    try await manager.signIn(with: tokens)
    return manager
}

let signatures = SignatureClock()
let bareSignatures = SignatureClock()
let bearerTransport = TimedTransport()
let signedTransport = TimedTransport(signing: (key, signingInput, bareSignatures))
let dpopTransport = TimedTransport()
let bearer = try await session(dpop: false, transport: bearerTransport, account: "bearer")
let signed = try await session(dpop: false, transport: signedTransport, account: "bearer-and-signature")
let dpop = try await session(dpop: true, transport: dpopTransport, account: "dpop")
let forced = Duration.seconds(86_400 * 365)
enum Kind { case bearer, signed, dpop }
let sessions: [(CredentialsManager, TimedTransport, Kind)] = [(bearer, bearerTransport, .bearer), (signed, signedTransport, .signed), (dpop, dpopTransport, .dpop)]
// Warm all three (connections, first key use), then alternate so drift hits them alike.
for _ in 0..<5 {
    for (manager, _, _) in sessions { _ = try await manager.credentials(minTTL: forced) }
}
for (_, transport, _) in sessions {
    _ = transport.takeMicroseconds()
    _ = transport.takeFirstSend()
}
_ = signatures.takeMicroseconds()
_ = bareSignatures.takeMicroseconds()
var beforeSend: [Kind: [Double]] = [:], client: [Kind: [Double]] = [:], total: [Kind: [Double]] = [:]
var dpopSignatures: [Double] = [], bareInRefresh: [Double] = []
for _ in 0..<refreshes {
    for (manager, transport, kind) in sessions {
        let start = DispatchTime.now().uptimeNanoseconds
        _ = try await manager.credentials(minTTL: forced)
        let elapsed = Double(DispatchTime.now().uptimeNanoseconds - start) / 1000
        client[kind, default: []].append(elapsed - transport.takeMicroseconds())
        total[kind, default: []].append(elapsed)
        beforeSend[kind, default: []].append(Double((transport.takeFirstSend() ?? start) - start) / 1000)
        switch kind {
        case .dpop: dpopSignatures.append(signatures.takeMicroseconds())
        case .signed: bareInRefresh.append(bareSignatures.takeMicroseconds())
        case .bearer: break
        }
    }
}
let bearerBeforeSend = median(beforeSend[.bearer]!)
let dpopCost = median(beforeSend[.dpop]!) - bearerBeforeSend
let signatureCost = median(beforeSend[.signed]!) - bearerBeforeSend
print("\nrefresh against \(server.absoluteString) (\(refreshes) each, alternated, median)   µs")
line("refresh, Bearer: start to request sent", bearerBeforeSend)
line("refresh, Bearer + one bare signature: start to request sent", median(beforeSend[.signed]!))
line("refresh, DPoP:   start to request sent", median(beforeSend[.dpop]!))
line("  one signature's cost in a refresh (difference)", signatureCost)
line("  DPoP's cost in a refresh (difference)", dpopCost)
line("  the bare signature, timed inside its refresh", median(bareInRefresh))
line("  the DPoP proof's signature, timed inside its refresh", median(dpopSignatures))
line("  for comparison: bare signature in a loop (async)", asyncSignature)
print(String(format: "%@ %9.2f", "  DPoP's cost / one signature's cost".padding(toLength: 58, withPad: " ", startingAt: 0), dpopCost / signatureCost))
print(String(format: "%@ %9.2f", "  DPoP's cost / the signature timed in its refresh".padding(toLength: 58, withPad: " ", startingAt: 0),
    dpopCost / median(bareInRefresh)))
line("refresh, Bearer: client side (total minus server wait)", median(client[.bearer]!))
line("refresh, DPoP:   client side (total minus server wait)", median(client[.dpop]!))
line("refresh, Bearer: end to end", median(total[.bearer]!))
line("refresh, DPoP:   end to end (server checks the proof)", median(total[.dpop]!))
// The target: DPoP adds at most one signature. Paired by round (the three sessions refresh one
// after the other in each round), DPoP's excess over the Bearer-plus-one-signature session is
// what DPoP adds beyond one signature; its median with a 95% bootstrap interval says whether
// that is below zero (met), above (missed), or neither (level with one signature, within noise).
let excess = zip(beforeSend[.dpop]!, beforeSend[.signed]!).map { $0 - $1 }
var generator = SystemRandomNumberGenerator()
let resampled = (0..<2000).map { _ in median((0..<excess.count).map { _ in excess[Int.random(in: 0..<excess.count, using: &generator)] }) }.sorted()
let (low, high) = (resampled[50], resampled[1949])
line("  DPoP's cost beyond one signature (paired median)", median(excess))
print(String(format: "%@ [%+.0f, %+.0f]", "  its 95% bootstrap interval (µs)".padding(toLength: 58, withPad: " ", startingAt: 0), low, high))
let verdict = high < 0 ? "met" : low > 0 ? "missed" : "met within noise (DPoP's cost is level with one signature's)"
print("target: a DPoP proof adds at most one signature's cost to a refresh: " + verdict
    + String(format: " (%.0f µs against %.0f µs by difference of medians, %.0f µs timed)", dpopCost, signatureCost, median(bareInRefresh)))
try await bearer.logout()
try await signed.logout()
try await dpop.logout()
