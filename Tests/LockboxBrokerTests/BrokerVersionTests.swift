import Foundation
import Lockbox
import LockboxTestSupport
import Testing

@testable import LockboxBroker

/// Protocol versions between a client and a real `lockboxd`: a client older than the broker's
/// oldest is refused with what to do; an older client the broker still serves is served.
@Suite("lockboxd's protocol versions")
struct BrokerVersionTests {
    func hello(version: Int, on socket: UnixSocket) throws -> [UInt8]? {
        var encoder = FieldEncoder()
        encoder.integer(BrokerProtocol.Operation.hello.rawValue)
        encoder.string(BrokerProtocol.greeting)
        encoder.integer(version)
        try socket.writeFrame(encoder.bytes)
        return try socket.readFrame(limit: BrokerProtocol.maximumReplyBytes)
    }

    @Test("a client older than the broker's oldest version is refused, saying to update it; a version-1 client is served")
    func versionMismatch_isRefusedWithAdvice() throws {
        let fixture = try BrokerFixture()
        #expect(BrokerProtocol.version == 2)

        // Version 0: refused, and the connection closed.
        let old = try UnixSocket.connect(to: fixture.socketPath)
        let refusal = try #require(try hello(version: 0, on: old))
        do {
            _ = try BrokerCoding.decodeReply(refusal)
            Issue.record("a client of protocol 0 was greeted")
        } catch {
            #expect(error.code == .param)
            #expect(error.message.contains("broker protocol 0, older than lockboxd's oldest (1)"), "\(error.message)")
            #expect(error.message.contains("update the program"), "\(error.message)")
        }
        #expect(try old.readFrame(limit: 1024) == nil, "the connection stayed open")

        // Version 1 (before authenticate, decrypt and stop): greeted with the broker's version,
        // and its requests answered.
        let first = try UnixSocket.connect(to: fixture.socketPath)
        var greeting = try BrokerCoding.decodeReply(try #require(try hello(version: 1, on: first)))
        #expect(try greeting.integer() == BrokerProtocol.version)
        #expect(try greeting.string() == fixture.vaultPath)
        var status = FieldEncoder()
        status.integer(BrokerProtocol.Operation.status.rawValue)
        try first.writeFrame(status.bytes)
        var reply = try BrokerCoding.decodeReply(try #require(try first.readFrame(limit: BrokerProtocol.maximumReplyBytes)))
        let json = try #require(try reply.bytes())
        #expect(String(decoding: json, as: UTF8.self).contains("\"isUnlocked\""))

        // A broker that speaks an older version than the client: the client refuses it, naming
        // the command that stops it (tested against a listener in the failure tests); the
        // version this client sends is the current one.
        let store = try fixture.store()
        #expect(store.brokerProcessIdentifier == fixture.process)
    }
}
