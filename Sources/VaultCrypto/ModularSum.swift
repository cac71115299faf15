/// Sums modulo 2^256 of 32-byte little-endian values, a 64-bit word at a time with the carries:
/// the accumulators of the vault's integrity record and of a sync group's head. (The same sum
/// as adding byte by byte.)
package enum ModularSum {
    package static let byteCount = 32

    /// `accumulator += value`. `value` may be longer; its first 32 bytes count.
    package static func add(_ value: UnsafeRawBufferPointer, to accumulator: UnsafeMutableRawBufferPointer) {
        precondition(value.count >= byteCount && accumulator.count == byteCount, "accumulators and elements are 32 bytes")
        var carry: UInt64 = 0
        for offset in stride(from: 0, to: byteCount, by: 8) {
            let left = UInt64(littleEndian: accumulator.loadUnaligned(fromByteOffset: offset, as: UInt64.self))
            let right = UInt64(littleEndian: value.loadUnaligned(fromByteOffset: offset, as: UInt64.self))
            let (partial, first) = left.addingReportingOverflow(right)
            let (sum, second) = partial.addingReportingOverflow(carry)
            carry = first || second ? 1 : 0
            accumulator.storeBytes(of: sum.littleEndian, toByteOffset: offset, as: UInt64.self)
        }
    }

    /// `accumulator -= value`, with the borrows.
    package static func subtract(_ value: UnsafeRawBufferPointer, from accumulator: UnsafeMutableRawBufferPointer) {
        precondition(value.count >= byteCount && accumulator.count == byteCount, "accumulators and elements are 32 bytes")
        var borrow: UInt64 = 0
        for offset in stride(from: 0, to: byteCount, by: 8) {
            let left = UInt64(littleEndian: accumulator.loadUnaligned(fromByteOffset: offset, as: UInt64.self))
            let right = UInt64(littleEndian: value.loadUnaligned(fromByteOffset: offset, as: UInt64.self))
            let (partial, first) = left.subtractingReportingOverflow(right)
            let (difference, second) = partial.subtractingReportingOverflow(borrow)
            borrow = first || second ? 1 : 0
            accumulator.storeBytes(of: difference.littleEndian, toByteOffset: offset, as: UInt64.self)
        }
    }
}
