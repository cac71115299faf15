import Testing

@testable import LockboxCore

/// The one SHA-256 of the package, against the FIPS 180-4 examples (NIST's "SHA256.pdf"
/// example values) and against itself fed in pieces that cross block boundaries.
@Suite("SHA-256 known answers")
struct SHA256Tests {
    @Test(
        "the FIPS 180-4 examples",
        arguments: [
            ("", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"),
            ("abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"),
            (
                "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
                "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"
            ),
        ])
    func examples(message: String, digest: String) {
        #expect(SHA256.hash(Array(message.utf8)).hexString == digest)
    }

    @Test("a million 'a' fed in pieces of 1 to 130 bytes gives the published digest")
    func millionA_inPieces() {
        var hasher = SHA256()
        var remaining = 1_000_000
        var size = 1
        while remaining > 0 {
            let piece = [UInt8](repeating: UInt8(ascii: "a"), count: min(size, remaining))
            hasher.update(piece)
            remaining -= piece.count
            size = size % 130 + 1
        }
        #expect(hasher.finalizeHex() == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0")
    }

    @Test("every length from 0 to 200 bytes: pieces and one call agree")
    func piecesAndOneCall_agree() {
        let bytes = (0..<200).map { UInt8(truncatingIfNeeded: $0 &* 37 &+ 11) }
        for length in 0...200 {
            let message = Array(bytes[0..<length])
            var hasher = SHA256()
            for split in stride(from: 0, to: length, by: 63) { hasher.update(Array(message[split..<min(length, split + 63)])) }
            #expect(hasher.finalize() == SHA256.hash(message), "length \(length)")
        }
    }
}
