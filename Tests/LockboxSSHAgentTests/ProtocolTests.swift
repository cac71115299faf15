import Foundation
import Lockbox
import LockboxKeys
import LockboxSSHAgent
import LockboxTestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

@Suite("SSH agent protocol: parsing and encodings")
struct ProtocolParsingTests {
    @Test("a sign request decodes into its blob, data and flags; trailing bytes are an error")
    func signRequest_decodes() throws {
        var body: [UInt8] = [AgentMessageType.signRequest]
        WireWriter.appendString([1, 2, 3], to: &body)
        WireWriter.appendString(Array("data".utf8), to: &body)
        WireWriter.appendUInt32(2, to: &body)
        #expect(try AgentRequest(body: body[...]) == .sign(keyBlob: [1, 2, 3], data: Array("data".utf8), flags: 2))
        #expect(throws: AgentProtocolError.self) { try AgentRequest(body: (body + [0])[...]) }
        #expect(throws: AgentProtocolError.self) { try AgentRequest(body: body.dropLast()) }
        #expect(throws: AgentProtocolError.self) { try AgentRequest(body: [][...]) }
    }

    @Test("a string length past the message end is an error, not a read out of bounds")
    func hugeStringLength_isAnError() {
        let body: [UInt8] = [AgentMessageType.signRequest, 0xFF, 0xFF, 0xFF, 0xFF, 1, 2]
        #expect(throws: AgentProtocolError.self) { try AgentRequest(body: body[...]) }
    }

    @Test("the frame decoder waits for whole frames and refuses empty and oversized ones before buffering them")
    func frameDecoder_boundsLengths() throws {
        var decoder = FrameDecoder()
        decoder.append([0, 0, 0, 2, 11])
        #expect(try decoder.nextBody() == nil)
        decoder.append([7, 0, 0, 0, 1, 11])
        #expect(try decoder.nextBody() == [11, 7])
        #expect(try decoder.nextBody() == [11])
        var huge = FrameDecoder()
        huge.append([0xFF, 0xFF, 0xFF, 0xFF])
        #expect(throws: AgentProtocolError.self) { try huge.nextBody() }
        var empty = FrameDecoder()
        empty.append([0, 0, 0, 0])
        #expect(throws: AgentProtocolError.self) { try empty.nextBody() }
    }

    @Test("a DER ECDSA signature becomes two mpints: leading zeros dropped, a zero added before a high bit")
    func derSignature_becomesMPInts() throws {
        let r: [UInt8] = [0x00, 0x80] + [UInt8](repeating: 1, count: 31)
        let s: [UInt8] = [0x7F] + [UInt8](repeating: 2, count: 30)
        let der: [UInt8] = [0x30, UInt8(4 + r.count + s.count), 0x02, UInt8(r.count)] + r + [0x02, UInt8(s.count)] + s
        let blob = try SSHKeyBlob.signature(Data(der), algorithm: .p256)
        var reader = WireReader(blob[...])
        #expect(Array(try reader.string()) == Array("ecdsa-sha2-nistp256".utf8))
        var inner = WireReader(try reader.string())
        #expect(Array(try inner.string()) == r)  // 0x00 0x80...: the zero stays, the top bit needs it
        #expect(Array(try inner.string()) == s)
        #expect(inner.isAtEnd && reader.isAtEnd)
        #expect(DERSignature.integers([0x30, 0x06, 0x02, 0x01, 0x80, 0x02, 0x01, 0x01]) == nil)  // negative r
        #expect(DERSignature.integers([0x30, 0x07, 0x02, 0x01, 0x01, 0x02, 0x01, 0x01]) == nil)  // wrong length
    }
}

/// Garbage on the socket: each gets `SSH_AGENT_FAILURE` or a closed connection, the agent keeps
/// serving, and the keychain's keys are unchanged.
@Suite("SSH agent protocol: garbage on the socket", .serialized)
struct ProtocolGarbageTests {
    static let failure: [UInt8] = [AgentMessageType.failure]

    @Test("unknown types, truncated bodies, add/remove/lock requests, a wrong-purpose key and foreign blobs get SSH_AGENT_FAILURE on a connection that stays usable")
    func malformedRequests_getFailure() throws {
        let fixture = try AgentFixture()
        let key = try fixture.generate(.ed25519, comment: "kept")
        let verifyOnly = try fixture.generate(.p256, comment: "verify-only", purposes: [.verify])
        try fixture.start()
        let client = try AgentClient(fixture.socket)

        var signWithVerifyOnly: [UInt8] = [AgentMessageType.signRequest]
        WireWriter.appendString(SSHKeyBlob.encode(verifyOnly.publicKey!)!, to: &signWithVerifyOnly)
        WireWriter.appendString([1, 2, 3], to: &signWithVerifyOnly)
        WireWriter.appendUInt32(0, to: &signWithVerifyOnly)
        var signWithUnknown: [UInt8] = [AgentMessageType.signRequest]
        WireWriter.appendString([0, 0, 0, 11] + Array("ssh-ed25519".utf8) + [0, 0, 0, 32] + [UInt8](repeating: 9, count: 32), to: &signWithUnknown)
        WireWriter.appendString([1], to: &signWithUnknown)
        WireWriter.appendUInt32(0, to: &signWithUnknown)

        let bodies: [[UInt8]] = [
            [200], [0], [AgentMessageType.signRequest, 0, 0], [AgentMessageType.signRequest, 0xFF, 0xFF, 0xFF, 0xF0],
            [AgentMessageType.addIdentity] + Array("ssh-ed25519".utf8), [AgentMessageType.addIdentityConstrained],
            [AgentMessageType.removeAllIdentities], [AgentMessageType.removeIdentity, 0, 0, 0, 0], [AgentMessageType.lock, 0, 0, 0, 1, 65],
            [AgentMessageType.unlock, 0, 0, 0, 0], [AgentMessageType.addSmartcardKey], [AgentMessageType.extension, 0, 0, 0, 4] + Array("quux".utf8),
            [AgentMessageType.requestIdentities, 1], signWithVerifyOnly, signWithUnknown,
        ]
        for body in bodies {
            #expect(client.request(body) == Self.failure, "body \(body.prefix(8))")
        }
        // Still serving on the same connection.
        let answer = try #require(client.request([AgentMessageType.requestIdentities]))
        try #require(answer.first == AgentMessageType.identitiesAnswer && answer.count >= 5, "agent: \(fixture.log())")
        #expect(Array(answer[1..<5]) == [0, 0, 0, 1])

        var sign: [UInt8] = [AgentMessageType.signRequest]
        WireWriter.appendString(SSHKeyBlob.encode(key.publicKey!)!, to: &sign)
        WireWriter.appendString(Array("message".utf8), to: &sign)
        WireWriter.appendUInt32(0, to: &sign)
        let signed = try #require(client.request(sign))
        #expect(signed.first == AgentMessageType.signResponse)
        #expect(fixture.log().contains("refused to sign: the key is not one this agent offers"))  // the verify-only key
        #expect(try fixture.keys.keys(applicationTag: ManagedKeySource.applicationTag).count == 2)
    }

    @Test("an oversized or empty frame is answered once and the connection closed; a client leaving mid-request leaves the agent serving")
    func brokenFrames_closeTheConnectionOnly() throws {
        let fixture = try AgentFixture()
        try fixture.generate(.ed25519, comment: "kept")
        try fixture.start()

        for header: [UInt8] in [[0xFF, 0xFF, 0xFF, 0xFF], [0x00, 0x04, 0x00, 0x01], [0, 0, 0, 0]] {
            let client = try AgentClient(fixture.socket)
            client.send(header + [11])
            #expect(client.receive() == Self.failure)
            #expect(client.receive() == nil)  // closed
        }
        // Half a frame, then gone; half a header, then gone.
        for partial: [[UInt8]] in [[[0, 0, 0, 100, 13, 0, 0]], [[0, 0]]] {
            let client = try AgentClient(fixture.socket)
            for piece in partial { client.send(piece) }
            client.close()
        }
        // Many clients at once that send nothing.
        let idle = try (0..<20).map { _ in try AgentClient(fixture.socket) }
        let client = try AgentClient(fixture.socket)
        #expect(client.request([AgentMessageType.requestIdentities])?.first == AgentMessageType.identitiesAnswer)
        _ = idle
        #expect(fixture.isAgentRunning)
        #expect(try fixture.keys.keys(applicationTag: ManagedKeySource.applicationTag).count == 1)
    }

    @Test("a running agent's listing follows keys made and deleted by other processes, and a lock")
    func listing_followsKeyChangesElsewhereAndTheLock() throws {
        let fixture = try AgentFixture()
        let first = try fixture.generate(.ed25519, comment: "first")
        try fixture.start()
        // The number of keys in an identities answer (a uint32 after the message type).
        func listed() throws -> Int? {
            let answer = try AgentClient(fixture.socket).request([AgentMessageType.requestIdentities])
            guard let answer, answer.first == AgentMessageType.identitiesAnswer, answer.count >= 5 else { return nil }
            return answer[1..<5].reduce(0) { $0 << 8 | Int($1) }
        }
        #expect(try listed() == 1)
        #expect(try listed() == 1)
        // This test process is another connection to the vault, as `lockbox ssh-agent generate` is.
        let second = try fixture.generate(.p256, comment: "second")
        #expect(try listed() == 2)
        try first.delete()
        #expect(try listed() == 1)
        try second.delete()
        #expect(try listed() == 0)
        try fixture.generate(.ed25519, comment: "third")
        #expect(try listed() == 1)
        // Locked (`lockbox lock --all` from another process): a failure, never the last listing.
        fixture.vault.vault.lockAll()
        #expect(try AgentClient(fixture.socket).request([AgentMessageType.requestIdentities]) == Self.failure)
    }

    @Test("the agent refuses a socket directory other users can enter, and a second agent on a live socket")
    func unsafeDirectoryAndLiveSocket_areRefused() throws {
        let fixture = try AgentFixture()
        let open = fixture.directory.file("open")
        try FileManager.default.createDirectory(atPath: open, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o777])
        chmod(open, 0o777)
        let binary = builtProduct("lockbox-ssh-agent")
        let unsafe = try run(binary, ["--keychain", fixture.vault.path, "-a", open + "/agent.sock"], timeout: 30)
        #expect(unsafe.status == 1)
        #expect(unsafe.standardError.contains("(OSStatus -50)"))

        try fixture.start()
        let second = try run(binary, ["--keychain", fixture.vault.path, "-a", fixture.socket], timeout: 30)
        #expect(second.status == 1)
        #expect(second.standardError.contains("(OSStatus -25299)"))
        #expect(fixture.isAgentRunning)
    }
}
