import LockboxCore

/// Base64url without padding (RFC 4648 section 5), as PKCE, state values and DPoP proofs use.
///
/// Encoded here byte by byte: Foundation's `replacingOccurrences` on Linux costs more than a
/// P-256 signature for the three passes a DPoP proof's parts needed.
enum Base64URL {
    private static let alphabet: [UInt8] = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_".utf8)

    /// Appends the encoding of `bytes` to `output`.
    static func append(_ bytes: some Collection<UInt8>, to output: inout [UInt8]) {
        output.reserveCapacity(output.count + (bytes.count * 4 + 2) / 3)
        alphabet.withUnsafeBufferPointer { alphabet in
            var iterator = bytes.makeIterator()
            while let first = iterator.next() {
                let second = iterator.next()
                let third = second == nil ? nil : iterator.next()
                let bits = UInt32(first) << 16 | UInt32(second ?? 0) << 8 | UInt32(third ?? 0)
                output.append(alphabet[Int(bits >> 18 & 0x3F)])
                output.append(alphabet[Int(bits >> 12 & 0x3F)])
                if second != nil { output.append(alphabet[Int(bits >> 6 & 0x3F)]) }
                if third != nil { output.append(alphabet[Int(bits & 0x3F)]) }
                if third == nil { break }
            }
        }
    }
}

extension Array where Element == UInt8 {
    /// Base64url without padding (RFC 4648 section 5).
    var base64URLString: String {
        var characters = [UInt8]()
        Base64URL.append(self, to: &characters)
        return String(decoding: characters, as: UTF8.self)
    }
}
