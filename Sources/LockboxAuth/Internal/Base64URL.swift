import LockboxCore

extension Array where Element == UInt8 {
    /// Base64url without padding (RFC 4648 section 5), as PKCE and state values use.
    ///
    /// Encoded here byte by byte: Foundation's `replacingOccurrences` on Linux costs more than a
    /// P-256 signature for the three passes a DPoP proof's parts needed.
    var base64URLString: String {
        let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_".utf8)
        var characters = [UInt8]()
        characters.reserveCapacity((count * 4 + 2) / 3)
        var iterator = makeIterator()
        while let first = iterator.next() {
            let second = iterator.next()
            let third = iterator.next()
            let bits = UInt32(first) << 16 | UInt32(second ?? 0) << 8 | UInt32(third ?? 0)
            characters.append(alphabet[Int(bits >> 18 & 0x3F)])
            characters.append(alphabet[Int(bits >> 12 & 0x3F)])
            if second != nil { characters.append(alphabet[Int(bits >> 6 & 0x3F)]) }
            if third != nil { characters.append(alphabet[Int(bits & 0x3F)]) }
            if third == nil { break }
        }
        return String(decoding: characters, as: UTF8.self)
    }
}

