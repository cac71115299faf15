/// The SSH agent protocol (draft-miller-ssh-agent): each message is a `uint32` length, then
/// that many bytes, the first of which is the message type. Parsing does no I/O and never
/// traps: every malformed input is an ``AgentProtocolError``, answered with `SSH_AGENT_FAILURE`.
package enum AgentMessageType {
    package static let failure: UInt8 = 5
    package static let success: UInt8 = 6
    package static let requestIdentities: UInt8 = 11
    package static let identitiesAnswer: UInt8 = 12
    package static let signRequest: UInt8 = 13
    package static let signResponse: UInt8 = 14
    package static let addIdentity: UInt8 = 17
    package static let removeIdentity: UInt8 = 18
    package static let removeAllIdentities: UInt8 = 19
    package static let addSmartcardKey: UInt8 = 20
    package static let removeSmartcardKey: UInt8 = 21
    package static let lock: UInt8 = 22
    package static let unlock: UInt8 = 23
    package static let addIdentityConstrained: UInt8 = 25
    package static let addSmartcardKeyConstrained: UInt8 = 26
    package static let `extension`: UInt8 = 27
}

/// Why a message could not be read. Never carries the message's bytes.
package struct AgentProtocolError: Error, Equatable, CustomStringConvertible {
    package var reason: String
    package init(_ reason: String) { self.reason = reason }
    package var description: String { "SSH agent protocol: \(reason)" }
}

/// What a client asked, decoded from one message body (the bytes after the length).
package enum AgentRequest: Equatable {
    case requestIdentities
    /// Sign `data` with the key whose public blob is `keyBlob`. `flags` selects RSA hashes,
    /// which Ed25519 and ECDSA keys ignore.
    case sign(keyBlob: [UInt8], data: [UInt8], flags: UInt32)
    /// A private key handed to the agent (`ssh-add FILE`): refused, keys are made in the vault.
    case addIdentity
    case removeIdentity(keyBlob: [UInt8])
    case removeAllIdentities
    case smartcard
    case lock
    case unlock
    case `extension`(name: String)
    case unknown(type: UInt8)

    /// Decodes one message body. Trailing bytes after a complete request are an error.
    package init(body: ArraySlice<UInt8>) throws(AgentProtocolError) {
        var reader = WireReader(body)
        let type = try reader.byte()
        switch type {
        case AgentMessageType.requestIdentities:
            self = .requestIdentities
        case AgentMessageType.signRequest:
            let blob = try reader.string()
            let data = try reader.string()
            let flags = try reader.uint32()
            self = .sign(keyBlob: Array(blob), data: Array(data), flags: flags)
        case AgentMessageType.addIdentity, AgentMessageType.addIdentityConstrained:
            // The private key's bytes are not looked at, kept or echoed.
            self = .addIdentity
            return
        case AgentMessageType.removeIdentity:
            self = .removeIdentity(keyBlob: Array(try reader.string()))
        case AgentMessageType.removeAllIdentities:
            self = .removeAllIdentities
        case AgentMessageType.addSmartcardKey, AgentMessageType.removeSmartcardKey, AgentMessageType.addSmartcardKeyConstrained:
            self = .smartcard
            return
        case AgentMessageType.lock, AgentMessageType.unlock:
            // The lock passphrase is not looked at.
            self = type == AgentMessageType.lock ? .lock : .unlock
            return
        case AgentMessageType.extension:
            let name = try reader.string()
            guard let text = String(validating: name, as: UTF8.self) else {
                throw AgentProtocolError("an extension name is not UTF-8")
            }
            // The extension's own contents follow; their format is the extension's.
            self = .extension(name: text)
            return
        default:
            self = .unknown(type: type)
            return
        }
        guard reader.isAtEnd else { throw AgentProtocolError("\(reader.remaining) bytes after the request") }
    }
}

/// The agent's answers, encoded as whole frames (length included).
package enum AgentReply {
    package static var failure: [UInt8] { frame([AgentMessageType.failure]) }
    package static var success: [UInt8] { frame([AgentMessageType.success]) }

    package static func identities(_ identities: [(blob: [UInt8], comment: String)]) -> [UInt8] {
        var body: [UInt8] = [AgentMessageType.identitiesAnswer]
        WireWriter.appendUInt32(UInt32(identities.count), to: &body)
        for identity in identities {
            WireWriter.appendString(identity.blob, to: &body)
            WireWriter.appendString(Array(identity.comment.utf8), to: &body)
        }
        return frame(body)
    }

    package static func signature(_ signature: [UInt8]) -> [UInt8] {
        var body: [UInt8] = [AgentMessageType.signResponse]
        WireWriter.appendString(signature, to: &body)
        return frame(body)
    }

    package static func frame(_ body: [UInt8]) -> [UInt8] {
        var framed: [UInt8] = []
        framed.reserveCapacity(body.count + 4)
        WireWriter.appendUInt32(UInt32(body.count), to: &framed)
        framed += body
        return framed
    }
}

/// Splits a byte stream into message bodies. A length of zero or over ``maximumLength`` is a
/// protocol error (OpenSSH's agent uses the same 256 KiB bound), raised before anything of
/// that size is buffered.
package struct FrameDecoder {
    package static let maximumLength = 256 * 1024
    private var buffer: [UInt8] = []

    package init() {}

    /// Appends received bytes.
    package mutating func append(_ bytes: some Collection<UInt8>) {
        buffer.append(contentsOf: bytes)
    }

    /// The next complete body, nil when more bytes are needed.
    package mutating func nextBody() throws(AgentProtocolError) -> [UInt8]? {
        guard buffer.count >= 4 else { return nil }
        let length = Int(buffer[0]) << 24 | Int(buffer[1]) << 16 | Int(buffer[2]) << 8 | Int(buffer[3])
        guard length > 0 else { throw AgentProtocolError("an empty message") }
        guard length <= Self.maximumLength else { throw AgentProtocolError("a message of \(length) bytes, over the limit") }
        guard buffer.count >= 4 + length else { return nil }
        let body = Array(buffer[4..<4 + length])
        buffer.removeFirst(4 + length)
        return body
    }

    /// Bytes received that are not yet a whole message.
    package var pendingByteCount: Int { buffer.count }
}

/// SSH wire types (RFC 4251 section 5) over a byte slice, with bounds checks on every read.
package struct WireReader {
    private var bytes: ArraySlice<UInt8>

    package init(_ bytes: ArraySlice<UInt8>) { self.bytes = bytes }

    package var isAtEnd: Bool { bytes.isEmpty }
    package var remaining: Int { bytes.count }

    package mutating func byte() throws(AgentProtocolError) -> UInt8 {
        guard let first = bytes.first else { throw AgentProtocolError("the message ends early") }
        bytes = bytes.dropFirst()
        return first
    }

    package mutating func uint32() throws(AgentProtocolError) -> UInt32 {
        guard bytes.count >= 4 else { throw AgentProtocolError("the message ends inside a number") }
        let start = bytes.startIndex
        let value = UInt32(bytes[start]) << 24 | UInt32(bytes[start + 1]) << 16 | UInt32(bytes[start + 2]) << 8 | UInt32(bytes[start + 3])
        bytes = bytes.dropFirst(4)
        return value
    }

    package mutating func string() throws(AgentProtocolError) -> ArraySlice<UInt8> {
        let length = Int(try uint32())
        guard length <= bytes.count else { throw AgentProtocolError("a string's length runs past the message") }
        let value = bytes.prefix(length)
        bytes = bytes.dropFirst(length)
        return value
    }
}

package enum WireWriter {
    package static func appendUInt32(_ value: UInt32, to bytes: inout [UInt8]) {
        bytes += [UInt8(value >> 24), UInt8(value >> 16 & 0xFF), UInt8(value >> 8 & 0xFF), UInt8(value & 0xFF)]
    }

    package static func appendString(_ value: some Collection<UInt8>, to bytes: inout [UInt8]) {
        appendUInt32(UInt32(value.count), to: &bytes)
        bytes.append(contentsOf: value)
    }

    /// An `mpint` (RFC 4251) of a non-negative big-endian magnitude: no leading zero bytes,
    /// one zero byte added when the top bit is set.
    package static func appendPositiveMPInt(_ magnitude: some Collection<UInt8>, to bytes: inout [UInt8]) {
        var trimmed = Array(magnitude.drop { $0 == 0 })
        if let first = trimmed.first, first & 0x80 != 0 { trimmed.insert(0, at: 0) }
        appendString(trimmed, to: &bytes)
    }
}
