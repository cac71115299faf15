import struct Foundation.Data

/// A small, unambiguous binary encoding: every field is a one-byte tag (0 absent, 1 present)
/// followed, when present, by a little-endian 32-bit length and the bytes. Used for primary-key
/// digests and for sealed metadata, where it must be canonical and cheap to decode.
package struct FieldEncoder {
    /// The encoding so far: the first `count` bytes of `storage`, written in place as fields
    /// arrive (this runs several times per read and write). Copies share the storage until
    /// one of them writes, as an array's would.
    private var storage: Storage
    private var count = 0

    private final class Storage {
        let start: UnsafeMutablePointer<UInt8>
        let capacity: Int

        init(capacity: Int) {
            start = .allocate(capacity: capacity)
            self.capacity = capacity
        }

        deinit { start.deallocate() }
    }

    /// The encoded bytes.
    package var bytes: [UInt8] {
        Array(UnsafeBufferPointer(start: storage.start, count: count))
    }

    package init() {
        self.init(capacity: 256)
    }

    /// An encoder with room for `capacity` bytes before it grows (for encodings known to be
    /// larger than most).
    package init(capacity: Int) {
        storage = Storage(capacity: max(capacity, 16))
    }

    /// The encoded bytes, lent in place (no copy): valid only inside `body`.
    package func withBytes<R>(_ body: (UnsafeRawBufferPointer) throws -> R) rethrows -> R {
        try body(UnsafeRawBufferPointer(start: storage.start, count: count))
    }

    /// Empties the encoding, keeping its storage for the next one.
    package mutating func removeAll() {
        count = 0
    }

    /// How many bytes are encoded so far.
    package var byteCount: Int { count }

    /// Drops what was encoded after the first `length` bytes (a ``byteCount`` read earlier), so
    /// that one prefix serves several encodings in turn.
    package mutating func truncate(to length: Int) {
        precondition(length >= 0 && length <= count, "an encoder is truncated to a length it had")
        count = length
    }

    package mutating func bytes(_ value: [UInt8]?) {
        guard let value else { return absent() }
        value.withUnsafeBufferPointer { field($0) }
    }

    package mutating func string(_ value: String?) {
        guard var value else { return absent() }
        // The UTF-8 appended in place: no intermediate array (this runs on every lookup).
        value.withUTF8 { field($0) }
    }

    /// A field of bytes read in place (nil: absent). Text given as its UTF-8 bytes encodes as
    /// ``string(_:)`` encodes it.
    package mutating func bytes(inPlace value: UnsafeRawBufferPointer?) {
        guard let value else { return absent() }
        field(value.assumingMemoryBound(to: UInt8.self))
    }

    package mutating func bytes(_ value: Data) {
        value.withUnsafeBytes { field($0.assumingMemoryBound(to: UInt8.self)) }
    }

    package mutating func integer(_ value: Int?) {
        guard let value else { return absent() }
        word(UInt64(bitPattern: Int64(value)))
    }

    package mutating func double(_ value: Double?) {
        guard let value else { return absent() }
        word(value.bitPattern)
    }

    /// A present 8-byte field, little-endian: the same bytes `bytes(_:)` writes for it.
    private mutating func word(_ value: UInt64) {
        reserve(13)
        let base = storage.start + count
        base[0] = 1
        base[1] = 8
        base[2] = 0
        base[3] = 0
        base[4] = 0
        for index in 0..<8 { base[5 + index] = UInt8(truncatingIfNeeded: value >> (8 * UInt64(index))) }
        count += 13
    }

    /// An absent field: the marker 0.
    private mutating func absent() {
        reserve(1)
        storage.start[count] = 0
        count += 1
    }

    /// A present field: the marker 1, the length as 4 bytes little-endian, the bytes.
    @inline(__always) private mutating func field(_ body: UnsafeBufferPointer<UInt8>) {
        reserve(5 + body.count)
        let base = storage.start + count
        let length = UInt32(body.count)
        base[0] = 1
        for index in 0..<4 { base[1 + index] = UInt8(truncatingIfNeeded: length >> (8 * UInt32(index))) }
        if let source = body.baseAddress, body.count > 0 { (base + 5).update(from: source, count: body.count) }
        count += 5 + body.count
    }

    /// Room for `extra` more bytes in storage this encoder alone holds.
    @inline(__always) private mutating func reserve(_ extra: Int) {
        let needed = count + extra
        if needed <= storage.capacity && isKnownUniquelyReferenced(&storage) { return }
        let grown = Storage(capacity: max(needed, needed <= storage.capacity ? storage.capacity : 2 * storage.capacity))
        grown.start.update(from: storage.start, count: count)
        storage = grown
    }
}

/// Reads what ``FieldEncoder`` wrote. Any malformed input is a thrown error, never a crash:
/// this parses data from disk.
package struct FieldDecoder {
    private let input: [UInt8]
    private var offset = 0

    package struct Malformed: Error {
        package init() {}
    }

    package init(_ input: [UInt8]) { self.input = input }

    package var isAtEnd: Bool { offset == input.count }

    /// The range of a present field's bytes; nil for an absent one.
    private mutating func field() throws(Malformed) -> Range<Int>? {
        guard offset < input.count else { throw Malformed() }
        let tag = input[offset]
        offset += 1
        switch tag {
        case 0: return nil
        case 1: break
        default: throw Malformed()
        }
        guard input.count - offset >= 4 else { throw Malformed() }
        var length: UInt32 = 0
        for index in 0..<4 { length |= UInt32(input[offset + index]) << (8 * UInt32(index)) }
        offset += 4
        guard Int(length) <= input.count - offset else { throw Malformed() }
        defer { offset += Int(length) }
        return offset..<offset + Int(length)
    }

    package mutating func bytes() throws(Malformed) -> [UInt8]? {
        guard let range = try field() else { return nil }
        return Array(input[range])
    }

    package mutating func data() throws(Malformed) -> Data? {
        guard let range = try field() else { return nil }
        return Data(input[range])
    }

    package mutating func string() throws(Malformed) -> String? {
        guard let range = try field() else { return nil }
        guard let string = String(validating: input[range], as: UTF8.self) else { throw Malformed() }
        return string
    }

    package mutating func integer() throws(Malformed) -> Int? {
        try word().map { Int(Int64(bitPattern: $0)) }
    }

    package mutating func double() throws(Malformed) -> Double? {
        try word().map { Double(bitPattern: $0) }
    }

    private mutating func word() throws(Malformed) -> UInt64? {
        guard let range = try field() else { return nil }
        guard range.count == 8 else { throw Malformed() }
        var value: UInt64 = 0
        for index in 0..<8 { value |= UInt64(input[range.lowerBound + index]) << (8 * UInt64(index)) }
        return value
    }
}
