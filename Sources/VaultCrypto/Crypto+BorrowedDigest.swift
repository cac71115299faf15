internal import CSodium
import LockboxCore

extension Crypto {
    /// Keyed BLAKE2b-256 of bytes read in place (the same digest as ``keyedDigest(_:key:)-([UInt8],_)``),
    /// written into `output` (32 bytes): for loops that digest many short inputs without an
    /// array per input.
    package static func keyedDigest(_ input: UnsafeRawBufferPointer, key: SecretBytes, into output: UnsafeMutableRawBufferPointer) {
        precondition(output.count == 32, "a keyed digest is 32 bytes")
        ensureInitialized()
        key.withUnsafeBytes { keyBytes in
            _ = crypto_generichash(
                output.baseAddress!.assumingMemoryBound(to: UInt8.self), 32,
                input.baseAddress?.assumingMemoryBound(to: UInt8.self), UInt64(input.count),
                keyBytes.baseAddress!.assumingMemoryBound(to: UInt8.self), keyBytes.count)
        }
    }

    /// BLAKE2b-256 of public bytes read in place (the same digest as ``digest(_:)-([UInt8])``),
    /// written into `output` (32 bytes).
    package static func digest(_ input: UnsafeRawBufferPointer, into output: UnsafeMutableRawBufferPointer) {
        precondition(output.count == 32, "a digest is 32 bytes")
        ensureInitialized()
        _ = crypto_generichash(
            output.baseAddress!.assumingMemoryBound(to: UInt8.self), 32, input.baseAddress?.assumingMemoryBound(to: UInt8.self),
            UInt64(input.count), nil, 0)
    }
}
