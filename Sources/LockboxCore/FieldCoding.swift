import struct Foundation.Data

/// A small, unambiguous binary encoding: every field is a one-byte tag (0 absent, 1 present)
/// followed, when present, by a little-endian 32-bit length and the bytes. Used for primary-key
/// digests and for sealed metadata, where it must be canonical and cheap to decode.
package struct FieldEncoder {
    package private(set) var bytes: [UInt8]

    package init() {
        self.init(capacity: 160)
    }

    /// An encoder with room for `capacity` bytes before it grows (for encodings known to be
    /// larger than most).
    package init(capacity: Int) {
        bytes = []
        bytes.reserveCapacity(capacity)
    }

    package mutating func bytes(_ value: [UInt8]?) {
        guard let value else {
            bytes.append(0)
            return
        }
        value.withUnsafeBufferPointer { field($0) }
    }

    package mutating func string(_ value: String?) {
        guard var value else {
            bytes.append(0)
            return
        }
        // The UTF-8 appended in place: no intermediate array (this runs on every lookup).
        value.withUTF8 { field($0) }
    }

    package mutating func bytes(_ value: Data) {
        value.withUnsafeBytes { field($0.assumingMemoryBound(to: UInt8.self)) }
    }

    package mutating func integer(_ value: Int?) {
        guard let value else { return bytes.append(0) }
        word(UInt64(bitPattern: Int64(value)))
    }

    package mutating func double(_ value: Double?) {
        guard let value else { return bytes.append(0) }
        word(value.bitPattern)
    }

    /// A present 8-byte field, little-endian: the same bytes `bytes(_:)` writes for it.
    private mutating func word(_ value: UInt64) {
        withUnsafeBytes(of: value.littleEndian) { field($0.assumingMemoryBound(to: UInt8.self)) }
    }

    /// A present field: the marker 1, the length as 4 bytes little-endian, the bytes. Copied
    /// as two buffers, not byte by byte.
    @inline(__always) private mutating func field(_ body: UnsafeBufferPointer<UInt8>) {
        let header = (UInt64(UInt32(body.count)) << 8 | 1).littleEndian
        withUnsafeBytes(of: header) { bytes.append(contentsOf: UnsafeRawBufferPointer(rebasing: $0[0..<5]).assumingMemoryBound(to: UInt8.self)) }
        bytes.append(contentsOf: body)
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
