import FoundationEssentials

/// The fixed DER prefixes of `SubjectPublicKeyInfo` for the three public key types: each is
/// the same bytes for every key of its type, so encoding is concatenation and parsing is an
/// exact match (nothing else is accepted).
enum SubjectPublicKeyInfo {
    static func prefix(for algorithm: KeyAlgorithm) -> [UInt8] {
        switch algorithm {
        // SEQUENCE { SEQUENCE { id-ecPublicKey, prime256v1 }, BIT STRING (66 bytes) }
        case .p256:
            [0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00]
        // SEQUENCE { SEQUENCE { id-Ed25519 1.3.101.112 }, BIT STRING (33 bytes) }
        case .ed25519:
            [0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00]
        // SEQUENCE { SEQUENCE { id-X25519 1.3.101.110 }, BIT STRING (33 bytes) }
        case .x25519:
            [0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x6e, 0x03, 0x21, 0x00]
        case .aes256GCM:
            []
        }
    }
}

/// RFC 7468 text encoding.
enum PEM {
    static func encode(_ der: [UInt8], label: String) -> String {
        let base64 = Data(der).base64EncodedString()
        var lines: [Substring] = []
        var index = base64.startIndex
        while index < base64.endIndex {
            let end = base64.index(index, offsetBy: 64, limitedBy: base64.endIndex) ?? base64.endIndex
            lines.append(base64[index..<end])
            index = end
        }
        return "-----BEGIN \(label)-----\n" + lines.joined(separator: "\n") + "\n-----END \(label)-----\n"
    }

    /// The DER inside the first block labelled `label`; nil when there is none or it is not base64.
    static func decode(_ text: String, label: String) -> [UInt8]? {
        let begin = "-----BEGIN \(label)-----"
        let end = "-----END \(label)-----"
        guard let start = text.range(of: begin), let stop = text.range(of: end, range: start.upperBound..<text.endIndex) else {
            return nil
        }
        let body = text[start.upperBound..<stop.lowerBound].filter { !$0.isWhitespace }
        guard !body.isEmpty, let data = Data(base64Encoded: String(body)) else { return nil }
        return Array(data)
    }
}

/// The SSH wire format's `string` (RFC 4251): a 32-bit big-endian length, then the bytes.
enum SSHEncoding {
    static func appendString(_ bytes: [UInt8], to blob: inout [UInt8]) {
        let count = UInt32(bytes.count)
        blob += [UInt8(count >> 24), UInt8(count >> 16 & 0xff), UInt8(count >> 8 & 0xff), UInt8(count & 0xff)]
        blob += bytes
    }
}

/// ECDSA's `ECDSA-Sig-Value` (RFC 3279): SEQUENCE { INTEGER r, INTEGER s }, DER.
enum ECDSASignature {
    static func der(r: [UInt8], s: [UInt8]) -> [UInt8] {
        func integer(_ bytes: [UInt8]) -> [UInt8] {
            var value = Array(bytes.drop { $0 == 0 })
            if value.isEmpty { value = [0] }
            if value[0] & 0x80 != 0 { value.insert(0, at: 0) }
            return [0x02, UInt8(value.count)] + value
        }
        let body = integer(r) + integer(s)
        return [0x30, UInt8(body.count)] + body
    }
}
