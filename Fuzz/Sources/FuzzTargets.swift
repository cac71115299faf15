// libFuzzer entry point for every parser of outside input. One binary, many targets: the
// target is chosen with LOCKBOX_FUZZ_TARGET (scripts/fuzz sets it). Built only by scripts/fuzz
// (LOCKBOX_FUZZ=1, -sanitize=fuzzer); see docs/FUZZING.md.
//
// A target may only crash on a real bug: a trap, a precondition, an out-of-bounds access or a
// broken round trip (something the parser accepted and then could not read back).

import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
@testable import CredentialHelpers
@testable import LockboxAuth
import LockboxCommandLine
@testable import LockboxCore
@testable import LockboxKeys
import TPMAccess
@testable import LockboxSSHAgent
@testable import LockboxBroker
@testable import LockboxVault
@testable import VaultCrypto

enum FuzzTarget: String, CaseIterable {
    /// A vault file made of the input: SQLite, schema migration, header, key slots, class keys.
    case vaultFile = "vault-file"
    /// A vault record: the field encoding of sealed attributes (`ItemAttributes(decoding:)`).
    case vaultRecord = "vault-record"
    /// A backup file: envelope and Argon2id parameters, and the item list of an opened payload.
    case backup
    /// git's credential-helper protocol (gitcredentials(7)) on stdin.
    case gitCredential = "git-credential"
    /// docker's credential-helper protocol: flat JSON and the server URL on stdin.
    case dockerCredential = "docker-credential"
    /// `lockbox` command-line arguments, NUL-separated.
    case cliArguments = "cli-arguments"
    /// Token endpoint and discovery responses: status selector, header lines, blank line, body.
    case tokenResponse = "token-response"
    /// The request head a browser sends to the loopback redirect listener.
    case loopbackRedirect = "loopback-redirect"
    /// Public keys (DER, PEM, X9.63, raw), signatures to verify, a stored key's envelope and
    /// public descriptor.
    case keyEncoding = "key-encoding"
    /// A byte stream sent to the SSH agent: frames, requests, the answers to them.
    case sshAgent = "ssh-agent"
    /// A request frame sent to `lockboxd`: hello, operations and their arguments, answered by a
    /// broker service over an unlocked vault inside a one-group grant.
    case brokerRequest = "broker-request"
}

nonisolated(unsafe) var selectedTarget: FuzzTarget = .vaultRecord
nonisolated(unsafe) var scratchDirectory = ""

@_cdecl("LLVMFuzzerInitialize")
func fuzzInitialize(_ argc: UnsafeMutablePointer<Int32>, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?>) -> Int32 {
    let name = ProcessInfo.processInfo.environment["LOCKBOX_FUZZ_TARGET"] ?? ""
    guard let target = FuzzTarget(rawValue: name) else {
        let names = FuzzTarget.allCases.map(\.rawValue).joined(separator: ", ")
        FileHandle.standardError.write(Data("lockbox-fuzz: set LOCKBOX_FUZZ_TARGET to one of: \(names)\n".utf8))
        exit(64)
    }
    selectedTarget = target
    // A private HOME/XDG tree so the vault target never touches a real keychain or device key.
    var template = Array("/tmp/lockbox-fuzz-XXXXXX".utf8CString)
    guard let directory = mkdtemp(&template) else { exit(70) }
    scratchDirectory = String(cString: directory)
    for name in ["HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_RUNTIME_DIR"] {
        setenv(name, scratchDirectory, 1)
    }
    atexit { _ = try? FileManager.default.removeItem(atPath: scratchDirectory) }
    return 0
}

@_cdecl("LLVMFuzzerTestOneInput")
func fuzzOneInput(_ data: UnsafePointer<UInt8>?, _ size: Int) -> Int32 {
    let input = size == 0 ? [] : Array(UnsafeBufferPointer(start: data, count: size))
    switch selectedTarget {
    case .vaultFile: fuzzVaultFile(input)
    case .vaultRecord: fuzzVaultRecord(input)
    case .backup: fuzzBackup(input)
    case .gitCredential: fuzzGitCredential(input)
    case .dockerCredential: fuzzDockerCredential(input)
    case .cliArguments: fuzzCommandLine(input)
    case .tokenResponse: fuzzTokenResponse(input)
    case .loopbackRedirect: fuzzLoopbackRedirect(input)
    case .keyEncoding: fuzzKeyEncoding(input)
    case .sshAgent: fuzzSSHAgent(input)
    case .brokerRequest: fuzzBrokerRequest(input)
    }
    return 0
}

func roundTripFailed(_ what: String) -> Never {
    fatalError("round trip failed: \(what)")
}

// MARK: Vault

func fuzzVaultFile(_ input: [UInt8]) {
    let path = scratchDirectory + "/fuzz.lockbox"
    for suffix in ["", "-wal", "-shm", "-journal"] { unlink(path + suffix) }
    let descriptor = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
    guard descriptor >= 0 else { fatalError("cannot write \(path)") }
    _ = input.withUnsafeBytes { write(descriptor, $0.baseAddress, $0.count) }
    close(descriptor)
    var configuration = Vault.Configuration()
    configuration.unlockCache = .processMemory
    configuration.busyTimeout = .zero
    guard let vault = try? Vault.open(at: path, configuration: configuration) else { return }
    // A vault that opens may still be anything: a device-slot unlock reads the whole header.
    _ = try? vault.unlock()
    _ = try? vault.items(matching: Query(.genericPassword, limit: .all))
}

func fuzzVaultRecord(_ input: [UInt8]) {
    var decoder = FieldDecoder(input)
    while !decoder.isAtEnd {
        guard (try? decoder.bytes()) != nil else { break }
    }
    // Padded values and attributes (row format 2): a length that does not fit, or padding that
    // is not zeros, is refused; what is accepted pads back to the same bytes.
    if let unpadded = Padding.unpadded(input), Padding.padded(unpadded) != input { roundTripFailed("Padding") }
    guard let attributes = try? ItemAttributes(decoding: input) else { return }
    let again = attributes.encoded()
    // Dates go through Double and Date, so re-encoding may differ in the last bit: only
    // require that what was accepted reads back.
    guard (try? ItemAttributes(decoding: again)) != nil else { roundTripFailed("ItemAttributes") }
}

func fuzzBackup(_ input: [UInt8]) {
    // The envelope as Vault.openBackup reads it. Inputs whose Argon2id parameters pass the
    // floor would spend most of a second in libsodium per run (not a parser): those stop there.
    let magic = Vault.backupMagic.count
    if input.count > magic + 5 {
        let length = input[(magic + 1)..<(magic + 5)].enumerated().reduce(0) { $0 | Int($1.element) << (8 * $1.offset) }
        if length > 0, magic + 5 + length < input.count,
            let derivation = PassphraseKeyDerivation(decoding: Array(input[(magic + 5)..<(magic + 5 + length)])),
            derivation.meetsMinimum
        {
            return
        }
    }
    _ = try? Vault.openBackup(input, passphrase: SecretBytes(utf8: "fuzz"))
    // The payload of an authenticated backup (what a backup made with a known passphrase holds).
    _ = input.withUnsafeBytes { try? Vault.decodeBackupItems($0) }
}

// MARK: Credential helpers

func fuzzGitCredential(_ input: [UInt8]) {
    guard let credential = try? GitCredential.parse(input) else { return }
    let serialized = credential.serialized()
    guard let reread = try? GitCredential.parse(serialized) else { roundTripFailed("GitCredential") }
    guard reread.serialized() == serialized else { roundTripFailed("GitCredential is not stable") }
}

func fuzzDockerCredential(_ input: [UInt8]) {
    if let object = try? FlatJSON.parseObject(input) {
        let encoded = FlatJSON.encodeObject(object.sorted { $0.key < $1.key }.map { ($0.key, $0.value) })
        guard let reread = try? FlatJSON.parseObject(encoded), reread == object else { roundTripFailed("FlatJSON") }
    }
    // What `store` reads: Go's decoder's view of the first object, then the three fields.
    let members = try? FlatJSON.parseFirstObject(input)
    if let object = try? FlatJSON.parseObject(input) {
        // A flat object is also what the lenient reader sees, member for member (last one wins).
        var seen: [String: [UInt8]] = [:]
        for member in members ?? [] {
            if case .string(let value) = member.value { seen[member.key] = value }
        }
        guard members != nil, seen == object else { roundTripFailed("FlatJSON readers disagree") }
    }
    _ = try? DockerCredentialHelper.credentials(input)
    guard let serverURL = try? DockerCredentialHelper.serverURL(input) else { return }
    _ = DockerCredentialHelper.attributes(serverURL).encoded()
    _ = DockerCredentialHelper.query(serverURL)
}

// MARK: Command line

func fuzzCommandLine(_ input: [UInt8]) {
    let arguments = input.split(separator: 0, omittingEmptySubsequences: false).map { String(decoding: $0, as: UTF8.self) }
    _ = try? Parser.parse(input.isEmpty ? [] : arguments)
}

// MARK: OAuth

/// A transport that answers every request with the fuzz input.
struct CannedTransport: HTTPTransport {
    let body: Data
    let response: HTTPURLResponse

    func send(_ request: URLRequest) async throws -> (Data, HTTPURLResponse) { (body, response) }
}

let statusCodes = [200, 200, 200, 400, 401, 429, 500, 503]

func fuzzTokenResponse(_ input: [UInt8]) {
    guard let selector = input.first else { return }
    let rest = input.dropFirst()
    // Header lines (`Name: value`), a blank line, then the body.
    var headers: [String: String] = [:]
    var body = Data(rest)
    if let blank = rest.firstRange(of: [10, 10]) {
        for line in String(decoding: rest[..<blank.lowerBound], as: UTF8.self).split(separator: "\n") {
            guard let colon = line.firstIndex(of: ":") else { continue }
            headers[String(line[..<colon])] = String(line[line.index(after: colon)...])
        }
        body = Data(rest[blank.upperBound...])
    }
    let issuer = URL(string: "https://auth.example.com")!
    guard
        let response = HTTPURLResponse(
            url: issuer, statusCode: statusCodes[Int(selector) % statusCodes.count], httpVersion: "HTTP/1.1", headerFields: headers)
    else { return }
    let transport = CannedTransport(body: body, response: response)
    var request = URLRequest(url: issuer.appendingPathComponent("token"))
    request.httpMethod = "POST"
    let done = DispatchSemaphore(value: 0)
    let discovery = selector & 0x80 != 0
    Task { [request] in
        if discovery {
            _ = try? await AuthorizationServerMetadata.discover(issuer: issuer, transport: transport)
        } else if case .success(let tokens)? = try? await TokenEndpoint.call(request, transport: transport, now: { Date() }) {
            _ = tokens.description
            _ = tokens.expiresAt
        }
        done.signal()
    }
    done.wait()
}

func fuzzLoopbackRedirect(_ input: [UInt8]) {
    guard let target = LoopbackListener.requestTarget(of: input) else { return }
    _ = LoopbackListener.redirectQuery(target: target, path: "/callback")
}

// MARK: Keys

func fuzzKeyEncoding(_ input: [UInt8]) {
    let data = Data(input)
    var accepted: [PublicKey] = []
    if let key = try? PublicKey(derRepresentation: data) {
        if key.derRepresentation != data { roundTripFailed("PublicKey DER") }
        accepted.append(key)
    }
    if let key = try? PublicKey(pemRepresentation: String(decoding: input, as: UTF8.self)) {
        if (try? PublicKey(pemRepresentation: key.pemRepresentation)) != key { roundTripFailed("PublicKey PEM") }
        accepted.append(key)
    }
    for algorithm in [KeyAlgorithm.p256, .ed25519, .x25519] {
        if let key = try? PublicKey(rawRepresentation: data, algorithm: algorithm) {
            if key.rawRepresentation != data { roundTripFailed("PublicKey raw") }
            accepted.append(key)
        }
    }
    // A fixed valid key of each signing algorithm, then the input as a signature (and the
    // message after it): any length, any bytes, only ever true, false or a thrown error.
    for key in accepted { _ = try? key.openSSHRepresentation(comment: "fuzz") }
    for key in fuzzVerifyingKeys {
        let split = min(input.count, key.algorithm == .ed25519 ? 64 : Int(input.first ?? 0) % 80)
        _ = try? key.isValidSignature(Data(input[..<split]), for: Data(input[split...]))
    }
    // A stored key's envelope and public descriptor.
    _ = try? KeyEnvelope.decode(SecretBytes(copying: input))
    _ = KeyDescriptor(data)
    // A hardware key's TPM blob and a TPM-sealed unlock slot, as stored: decoded without a TPM.
    _ = TPM.decodesKeyBlob(input)
    _ = TPM.decodesSealed(input)
    // A TPM-sealed device key file: the one it decodes is written back to the same bytes.
    if let sealed = DeviceKeyFile.decode(input) {
        if sealed.bytes != input { roundTripFailed("sealed device key file") }
        _ = sealed.pcrs
    }
    // A TPM signature's r and s (any bytes, up to the 32 of a P-256 scalar each) as DER: always
    // one that the verifier parses (true or false, never a thrown "not DER").
    if input.count >= 2 {
        let half = min(input.count / 2, 32)
        let der = ECDSASignature.der(r: Array(input[..<half]), s: Array(input[half..<min(input.count, 2 * half)]))
        if (try? fuzzVerifyingKeys[0].isValidSignature(Data(der), for: data)) == nil { roundTripFailed("ECDSA DER from r and s") }
    }
}

let fuzzVerifyingKeys: [PublicKey] = [
    // RFC 6979 A.2.5's P-256 key and RFC 8032's first Ed25519 key.
    try! PublicKey(
        x963Representation: Data(
            [0x04] + hexBytes("60fed4ba255a9d31c961eb74c6356d68c049b8923b61fa6ce669622e60f29fb6")
                + hexBytes("7903fe1008b8bc99a41ae9e95628bc64f2f1b20c2d7e9f5177a3c294d4462299"))),
    try! PublicKey(rawRepresentation: Data(hexBytes("d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a")), algorithm: .ed25519),
]

func hexBytes(_ hex: String) -> [UInt8] {
    var bytes: [UInt8] = []
    var index = hex.startIndex
    while index < hex.endIndex {
        let next = hex.index(index, offsetBy: 2)
        bytes.append(UInt8(hex[index..<next], radix: 16)!)
        index = next
    }
    return bytes
}

// MARK: SSH agent

/// Two keys the agent offers, signing without a vault (the fuzzer exercises the protocol, not
/// the key store): the answers to every accepted request must be well-formed frames.
struct FuzzKeySource: AgentKeySource {
    static let keys: [(PublicKey, [UInt8])] = {
        let ed25519 = try! PublicKey(rawRepresentation: Data(repeating: 7, count: 32), algorithm: .ed25519)
        let der: [UInt8] = [0x30, 0x06, 0x02, 0x01, 0x01, 0x02, 0x01, 0x7F]
        let p256Point = Data([4] + [0x6B, 0x17, 0xD1, 0xF2, 0xE1, 0x2C, 0x42, 0x47, 0xF8, 0xBC, 0xE6, 0xE5, 0x63, 0xA4, 0x40, 0xF2,
            0x77, 0x03, 0x7D, 0x81, 0x2D, 0xEB, 0x33, 0xA0, 0xF4, 0xA1, 0x39, 0x45, 0xD8, 0x98, 0xC2, 0x96,
            0x4F, 0xE3, 0x42, 0xE2, 0xFE, 0x1A, 0x7F, 0x9B, 0x8E, 0xE7, 0xEB, 0x4A, 0x7C, 0x0F, 0x9E, 0x16,
            0x2B, 0xCE, 0x33, 0x57, 0x6B, 0x31, 0x5E, 0xCE, 0xCB, 0xB6, 0x40, 0x68, 0x37, 0xBF, 0x51, 0xF5])
        return [(ed25519, [UInt8](repeating: 1, count: 64)), (try! PublicKey(x963Representation: p256Point), der)]
    }()

    func identities() throws(LockboxError) -> [AgentIdentity] {
        Self.keys.map { key, signature in
            AgentIdentity(publicKey: key, comment: "fuzz") { (_, _) throws(LockboxError) in Data(signature) }
        }
    }
}

let fuzzResponder = AgentResponder(keys: FuzzKeySource(), context: AuthenticationContext(interactionNotAllowed: true))

func fuzzSSHAgent(_ input: [UInt8]) {
    var decoder = FrameDecoder()
    decoder.append(input)
    while true {
        guard let body = try? decoder.nextBody() else { return }
        let reply = fuzzResponder.reply(toBody: body)
        // Every answer is one whole frame with a known type.
        guard reply.count >= 5 else { roundTripFailed("agent reply frame") }
        var frames = FrameDecoder()
        frames.append(reply)
        guard let replyBody = try? frames.nextBody(), frames.pendingByteCount == 0,
            [AgentMessageType.failure, AgentMessageType.identitiesAnswer, AgentMessageType.signResponse].contains(replyBody[0])
        else { roundTripFailed("agent reply frame") }
        // A request that parses encodes nothing the parser cannot read back.
        if case .sign(let blob, let data, let flags)? = try? AgentRequest(body: body[...]) {
            var again: [UInt8] = [AgentMessageType.signRequest]
            WireWriter.appendString(blob, to: &again)
            WireWriter.appendString(data, to: &again)
            WireWriter.appendUInt32(flags, to: &again)
            guard again == body else { roundTripFailed("sign request") }
        }
    }
}

// MARK: Broker

/// One vault for every input: made once, unlocked, its keys in this process only.
nonisolated(unsafe) var brokerService: BrokerService?

func fuzzBrokerRequest(_ input: [UInt8]) {
    if brokerService == nil {
        var configuration = Vault.Configuration()
        configuration.unlockCache = .processMemory
        configuration.keyDerivation = .interactive
        guard let vault = try? Vault.create(
            at: scratchDirectory + "/broker.lockbox", passphrase: SecretBytes(utf8: "fuzz"), configuration: configuration)
        else { fatalError("cannot create the broker's vault") }
        try? vault.add(.genericPassword(service: "s", account: "a", data: SecretBytes(utf8: "v"), accessGroup: "mine"))
        try? vault.add(.genericPassword(service: "s", account: "a", data: SecretBytes(utf8: "w"), accessGroup: "theirs"))
        // An access-controlled item: a query reaching it is answered with a challenge.
        var guarded = Item.genericPassword(service: "p", account: "a", data: SecretBytes(utf8: "x"), accessGroup: "mine")
        guarded.accessControl = .userPresence
        try? vault.add(guarded)
        brokerService = BrokerService(vault: vault)
    }
    let service = brokerService!
    // Unlock and lock are left out: a wrong passphrase waits by design (the failed-attempt
    // delay) and each unlock costs an Argon2id derivation; their argument parsing is the same
    // field decoder as every other operation's.
    // An authentication is parsed, and left out once it parses: checking its passphrase is an
    // unlock's derivation and delay.
    if case var request? = try? BrokerRequest(decoding: input) {
        if request.operation == .unlock || request.operation == .lock { return }
        if request.operation == .authenticate, (try? BrokerService.authenticated(&request.arguments)) != nil { return }
    }
    // The hello and stop parsers, on the same bytes.
    _ = BrokerServer.answerHello(input, vaultPath: "/fuzz")
    _ = BrokerRequest.isStop(input)
    var session = BrokerSession(grant: BrokerGrant(peerName: "fuzz", accessGroups: ["mine"], defaultAccessGroup: "mine"))
    let reply = service.reply(to: input, session: &session)
    // Every reply is a well-formed reply: a status and a message, then results (or, for an
    // error, a challenge, which parses).
    var decoder = FieldDecoder(reply)
    guard let status = try? decoder.integer(), (try? decoder.string()) != nil else { fatalError("malformed broker reply") }
    if status != 0, !decoder.isAtEnd, BrokerCoding.challenge(in: reply) == nil { fatalError("an error reply with a malformed challenge") }
    if session.isWidened { fatalError("a grant widened without a passphrase") }
    if status == 0, case let request? = try? BrokerRequest(decoding: input), request.operation == .items {
        // What the broker returned is only ever from the peer's group.
        guard let payload = try? decoder.bytes() else { fatalError("an items reply without items") }
        var items = FieldDecoder(payload)
        guard let count = try? items.integer() else { fatalError("an items reply without a count") }
        for _ in 0..<count {
            guard let item = try? BrokerCoding.decodeItem(&items) else { fatalError("an undecodable item in a reply") }
            if item.attributes.accessGroup != nil && item.attributes.accessGroup != "mine" { fatalError("an item of another group was served") }
        }
    }
    // An accepted query re-encodes to the same bytes.
    if case var request? = try? BrokerRequest(decoding: input), request.operation == .items || request.operation == .delete,
        let query = try? BrokerCoding.decodeQuery(&request.arguments), request.arguments.isAtEnd
    {
        var encoder = FieldEncoder()
        encoder.integer(request.operation.rawValue)
        BrokerCoding.encode(query, into: &encoder)
        if encoder.bytes != input { roundTripFailed("broker query") }
    }
}
