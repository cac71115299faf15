import LockboxCore

/// The wire protocol between a client and `lockboxd`.
///
/// Every message is one frame: a 32-bit little-endian length, then that many bytes. A request's
/// bytes are fields in ``FieldEncoder``'s encoding: the operation, then its arguments. A reply's
/// are the status (0, or an `OSStatus`), a message, then the operation's results. The first
/// request of a connection is ``Operation/hello``, which carries the client's protocol version;
/// the reply carries the broker's. Frames are bounded (``maximumRequestBytes``,
/// ``maximumReplyBytes``): a longer length is refused before anything is read.
package enum BrokerProtocol {
    /// This release's protocol version. 2 added ``Operation/authenticate``,
    /// ``Operation/decrypt``, ``Operation/encrypt`` and ``Operation/stop``, and challenges in
    /// error replies.
    package static let version = 2
    /// The oldest client version this broker serves.
    package static let oldestServedVersion = 1
    /// What a hello opens with, so that a program that is not a Lockbox client is told apart.
    package static let greeting = "lockbox-broker"
    /// A request carries at most one item value (64 KiB by default) and its attributes.
    package static let maximumRequestBytes = 1 << 20
    /// A reply may carry many items; beyond this the query must be narrowed.
    package static let maximumReplyBytes = 64 << 20

    /// What a request asks.
    package enum Operation: Int, Sendable, CaseIterable {
        case hello = 1
        case add = 2
        case items = 3
        case update = 4
        case delete = 5
        case status = 6
        case unlock = 7
        case lock = 8
        case sign = 9
        case publicKey = 10
        case generateKey = 11
        /// The user's passphrase, asked by the client, then a request to run with it: the
        /// broker checks it (the failed-attempt back-off applies), then answers the request.
        case authenticate = 12
        /// Data decrypted inside the broker with a non-extractable key.
        case decrypt = 13
        /// Stops the broker once the requests being answered are done.
        case stop = 14
        /// Data encrypted inside the broker with a non-extractable AES-256-GCM key.
        case encrypt = 15
    }

    /// What an error reply asks of the client, after its message: the user's passphrase, to
    /// send with the request again in an ``Operation/authenticate``.
    package enum Challenge: Int, Sendable {
        /// An access-controlled item (or key) needs the user's presence.
        case userPresence = 1
        /// The `lockbox` command reaches a group beyond its own once the user re-enters the
        /// passphrase.
        case everyGroup = 2
    }
}

/// A request as the broker reads it.
package struct BrokerRequest {
    package var operation: BrokerProtocol.Operation
    package var arguments: FieldDecoder

    /// Whether a frame is a well-formed ``BrokerProtocol/Operation/stop`` (no arguments).
    package static func isStop(_ bytes: [UInt8]) -> Bool {
        var decoder = FieldDecoder(bytes)
        return (try? decoder.integer()) == BrokerProtocol.Operation.stop.rawValue && decoder.isAtEnd
    }

    /// Parses a request frame's bytes. Any malformed input is a thrown error.
    package init(decoding bytes: [UInt8]) throws(LockboxError) {
        var decoder = FieldDecoder(bytes)
        guard let raw = try? decoder.integer(), let operation = BrokerProtocol.Operation(rawValue: raw) else {
            throw BrokerCoding.malformed("an unknown operation")
        }
        self.operation = operation
        self.arguments = decoder
    }
}

/// Encoding and decoding of the values requests and replies carry.
package enum BrokerCoding {
    static func malformed(_ what: String) -> LockboxError {
        LockboxError(.param, "The broker request is malformed (\(what)); it was refused and changed nothing.")
    }

    // MARK: Items

    package static func encode(_ item: Item, into encoder: inout FieldEncoder) {
        encoder.string(item.itemClass.rawValue)
        encoder.bytes(item.attributes.encoded())
        if let data = item.data {
            data.withUnsafeBytes { encoder.bytes(Array($0)) }
        } else {
            encoder.bytes(nil as [UInt8]?)
        }
        encoder.bytes(item.persistentReference.map { Array($0) })
        encoder.integer(item.accessControl.map { $0.flags.rawValue })
    }

    package static func decodeItem(_ decoder: inout FieldDecoder) throws(LockboxError) -> Item {
        do throws(FieldDecoder.Malformed) {
            guard let className = try decoder.string(), let itemClass = ItemClass(rawValue: className) else {
                throw FieldDecoder.Malformed()
            }
            guard let attributeBytes = try decoder.bytes() else { throw FieldDecoder.Malformed() }
            let attributes = try ItemAttributes(decoding: attributeBytes)
            var item = Item(itemClass, attributes: attributes)
            if var data = try decoder.bytes() {
                item.data = SecretBytes(copying: data)
                data.wipe()
            }
            item.persistentReference = try decoder.data()
            if let flags = try decoder.integer() {
                item.accessControl = AccessControl(AccessControl.Flags(rawValue: flags))
            }
            return item
        } catch {
            throw malformed("an item")
        }
    }

    // MARK: Queries

    package static func encode(_ query: Query, into encoder: inout FieldEncoder) {
        encoder.string(query.itemClass.rawValue)
        encoder.bytes(query.attributes.encoded())
        let synchronizable =
            switch query.synchronizable {
            case .notSynchronizable: 0
            case .synchronizable: 1
            case .any: 2
            }
        encoder.integer(synchronizable)
        encoder.integer(query.limit == .one ? 0 : 1)
        encoder.integer(query.returning.rawValue)
        encoder.bytes(query.persistentReference.map { Array($0) })
    }

    package static func decodeQuery(_ decoder: inout FieldDecoder) throws(LockboxError) -> Query {
        do throws(FieldDecoder.Malformed) {
            guard let className = try decoder.string(), let itemClass = ItemClass(rawValue: className) else {
                throw FieldDecoder.Malformed()
            }
            guard let attributeBytes = try decoder.bytes() else { throw FieldDecoder.Malformed() }
            var query = Query(itemClass, attributes: try ItemAttributes(decoding: attributeBytes))
            switch try decoder.integer() {
            case 0: query.synchronizable = .notSynchronizable
            case 1: query.synchronizable = .synchronizable
            case 2: query.synchronizable = .any
            default: throw FieldDecoder.Malformed()
            }
            switch try decoder.integer() {
            case 0: query.limit = .one
            case 1: query.limit = .all
            default: throw FieldDecoder.Malformed()
            }
            guard let returning = try decoder.integer(), returning >= 0, returning <= 7 else {
                throw FieldDecoder.Malformed()
            }
            query.returning = Query.ReturnOptions(rawValue: returning)
            query.persistentReference = try decoder.data()
            return query
        } catch {
            throw malformed("a query")
        }
    }

    // MARK: Updates

    package static func encode(_ update: ItemUpdate, into encoder: inout FieldEncoder) {
        encoder.bytes(update.attributes.encoded())
        if let data = update.data {
            data.withUnsafeBytes { encoder.bytes(Array($0)) }
        } else {
            encoder.bytes(nil as [UInt8]?)
        }
    }

    package static func decodeUpdate(_ decoder: inout FieldDecoder) throws(LockboxError) -> ItemUpdate {
        do throws(FieldDecoder.Malformed) {
            guard let attributeBytes = try decoder.bytes() else { throw FieldDecoder.Malformed() }
            var update = ItemUpdate(attributes: try ItemAttributes(decoding: attributeBytes))
            if var data = try decoder.bytes() {
                update.data = SecretBytes(copying: data)
                data.wipe()
            }
            return update
        } catch {
            throw malformed("an update")
        }
    }

    // MARK: Replies

    /// A reply's bytes: status 0, an empty message, then `body`'s fields.
    package static func success(_ body: (inout FieldEncoder) -> Void = { _ in }) -> [UInt8] {
        var encoder = FieldEncoder()
        encoder.integer(0)
        encoder.string("")
        body(&encoder)
        return encoder.bytes
    }

    /// A reply's bytes for an error: its status and message (which never holds a secret), and
    /// when the user's passphrase would let the request through, that challenge: its kind, the
    /// reason to show the user, and the access control's flags.
    package static func failure(_ error: LockboxError, challenge: (BrokerProtocol.Challenge, AuthenticationRequest)? = nil) -> [UInt8] {
        var encoder = FieldEncoder()
        encoder.integer(Int(error.code.rawValue))
        encoder.string(error.message)
        if let (kind, request) = challenge {
            encoder.integer(kind.rawValue)
            encoder.string(request.reason)
            encoder.integer(request.accessControl.flags.rawValue)
        }
        return encoder.bytes
    }

    /// The challenge an error reply carries, if any.
    package static func challenge(in bytes: [UInt8]) -> (BrokerProtocol.Challenge, AuthenticationRequest)? {
        var decoder = FieldDecoder(bytes)
        guard let status = try? decoder.integer(), status != 0, (try? decoder.string()) != nil, !decoder.isAtEnd,
            let raw = try? decoder.integer(), let kind = BrokerProtocol.Challenge(rawValue: raw),
            let reason = try? decoder.string(), let flags = try? decoder.integer(), decoder.isAtEnd
        else { return nil }
        return (kind, AuthenticationRequest(reason: reason, accessControl: AccessControl(AccessControl.Flags(rawValue: flags))))
    }

    /// The results of a reply, or the error it carries.
    package static func decodeReply(_ bytes: [UInt8]) throws(LockboxError) -> FieldDecoder {
        var decoder = FieldDecoder(bytes)
        guard let status = try? decoder.integer(), let status32 = Int32(exactly: status), let message = try? decoder.string() else {
            throw LockboxError(.io, "lockboxd sent a malformed reply. Stop it (`lockbox status` shows its pid); it starts again on demand.")
        }
        guard status32 == 0 else { throw LockboxError(LockboxError.Code(rawValue: status32), message) }
        return decoder
    }
}
